"""CPU time to compile a network's recursion the first time, in two checkouts side by side in one run.

    python benchmarks/compile_time.py BEFORE_DIR AFTER_DIR [--json FILE]

For each checkout, one fresh cache folder (``MEANFIELD_CACHE_DIR`` and ``NUMBA_CACHE_DIR``) is
warmed by processes that compile what every network shares (the solver kernels and, where the
checkout has one, the compiled quadrature engine) on the erf MLP and the pre-LN softplus MLP. Then each network below is
compiled in its own fresh process, the two checkouts interleaved network by network: the CPU time
(``time.process_time``) of loading the network's compiled recursion with numba, which generates
its module with sympy and compiles it (the cost a user pays on the first large call of a network
composed for the first time), and of a first critical line on 200 sigma_w (``MEANFIELD_ENGINE=numba``).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

NETWORKS = {
    "tanh MLP": "mf.Architecture('tanh')",
    "silu MLP": "mf.Architecture('silu')",
    "gelu_tanh MLP, post-LN": "mf.Architecture('gelu_tanh', norm='ln_post')",
    "softplus MLP, residual": "mf.Architecture('softplus', mu=0.9)",
    "residual rms_norm/silu block": "mf.Network(mf.residual(mf.rms_norm(), mf.act('silu'), mf.dense()), mu=0.9)",
    "resmlp gelu (LayerScale)": "mf.Architecture('gelu', block='resmlp', mu=1.0, eps=0.1)",
    "erf MLP, pre-LN (closed form)": "mf.Architecture('erf', norm='ln_pre')",
}

CODE = """
import time, numpy as np, meanfield as mf
from meanfield import numeric
arch = {expr}
t = time.process_time()
numeric.compiled(arch).module
load = time.process_time() - t
t = time.process_time()
try:
    mf.critical_line(arch, sigma_w=np.linspace(1.1, 2.0, 200), errors='nan')
except Exception:
    pass
print(load, time.process_time() - t)
"""


def _run(checkout, cache, expr):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), MEANFIELD_QUIET="1", MEANFIELD_ENGINE="numba",
               MEANFIELD_CACHE_DIR=os.path.join(cache, "meanfield"), NUMBA_CACHE_DIR=os.path.join(cache, "numba"))
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", CODE.format(expr=expr)], env=env,
                         capture_output=True, text=True, cwd="/")
    if out.returncode:
        raise RuntimeError(f"{checkout}: {expr}\n{out.stderr[-2000:]}")
    load, line = (float(v) for v in out.stdout.strip().splitlines()[-1].split())
    return load, line


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--json")
    args = ap.parse_args()
    caches = {side: tempfile.mkdtemp(prefix=f"meanfield-compile-{side}-") for side in ("before", "after")}
    for side in ("before", "after"):
        for warm in ("mf.Architecture('erf')", "mf.Architecture('softplus', norm='ln_pre')"):
            _run(getattr(args, side), caches[side], warm)  # the shared kernels (and quadrature engine)
    rows = []
    print(f"{'network':<36} {'compile before':>14} {'after':>8} {'ratio':>7}   {'first line before':>17} {'after':>8}")
    for name, expr in NETWORKS.items():
        b = _run(args.before, caches["before"], expr)
        a = _run(args.after, caches["after"], expr)
        rows.append({"network": name, "compile_before_s": b[0], "compile_after_s": a[0],
                     "first_line_before_s": b[1], "first_line_after_s": a[1]})
        print(f"{name:<36} {b[0]:14.2f} {a[0]:8.2f} {a[0] / b[0]:7.3f}   {b[1]:17.2f} {a[1]:8.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": os.getloadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
