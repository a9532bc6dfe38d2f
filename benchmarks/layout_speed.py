"""Warm CPU time per call of the public API in two checkouts of the package, side by side in one run.

    python benchmarks/layout_speed.py BEFORE_DIR AFTER_DIR [--repeat 3] [--json FILE]

Each checkout runs the same workloads in its own fresh process (``PYTHONPATH`` = the checkout), the two
interleaved workload by workload; every workload is called once to warm up (compiles, caches), then
timed ``--repeat`` times (best CPU time of the process, ``time.process_time``). Prints the ratio
after / before per workload: issue 24 asks for the layout refactor to keep each within 1.2.
"""
import argparse
import json
import os
import subprocess
import sys

WORKLOADS = {
    "critical_line erf, 10^4 sigma_w": "mf.critical_line('erf', sigma_w=np.linspace(0.5, 3, 10_000))",
    "critical_line gelu, 10^4 sigma_w": "mf.critical_line('gelu', sigma_w=np.linspace(0.5, 3, 10_000))",
    "critical_line tanh (quadrature), 10^3 sigma_w": "mf.critical_line('tanh', sigma_w=np.linspace(1.05, 3, 1_000))",
    "kernel_profile silu (quadrature), 10^3 points, depth 50":
        "mf.kernel_profile('silu', sigma_w=SW[:1000], sigma_b=SB[:1000], depth=50)",
    "kernel_profile erf, 10^4 points, depth 50":
        "mf.kernel_profile('erf', sigma_w=SW, sigma_b=SB, depth=50)",
    "kernel_profile residual rms_norm/silu, 10^3 points, depth 20":
        "mf.kernel_profile(NET, sigma_w=SW[:1000], sigma_b=SB[:1000], depth=20)",
    "kernels relu, n = 500, depth 50": "mf.kernels('relu', X[:500], depth=50, sigma_w=1.4, sigma_b=0.2)",
    "kernels gelu, n = 300, depth 10": "mf.kernels('gelu', X[:300], depth=10, sigma_w=1.4, sigma_b=0.2)",
    "kernels ln_pre erf, n = 300, depth 20":
        "mf.kernels(mf.Architecture('erf', norm='ln_pre'), X[:300], depth=20, sigma_w=1.4, sigma_b=0.2)",
    "monte_carlo erf, depth 20, width 256, 8 inits":
        "monte_carlo('erf', 1.3, 0.1, depth=20, width=256, n_init=8, device='cpu', seed=0)",
}

SETUP = """
import time, numpy as np, meanfield as mf
from meanfield.verification import monte_carlo
rng = np.random.default_rng(0)
SW, SB = rng.uniform(0.5, 3, 10_000), rng.uniform(0, 1, 10_000)
X = rng.normal(size=(500, 64)) * rng.uniform(0.1, 3, size=(500, 1)) / 8
NET = mf.Network(mf.residual(mf.rms_norm(), mf.act('silu'), mf.dense()), mu=0.9)
"""


def _time_in(checkout, expr, repeat):
    code = SETUP + f"""
{expr}
best = float("inf")
for _ in range({repeat}):
    t = time.process_time(); {expr}; best = min(best, time.process_time() - t)
print(best)
"""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), MEANFIELD_QUIET="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    if out.returncode:
        raise RuntimeError(f"{checkout}: {expr}\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{'workload':<62} {'before':>9} {'after':>9} {'after/before':>12}")
    for name, expr in WORKLOADS.items():
        before = _time_in(args.before, expr, args.repeat)
        after = _time_in(args.after, expr, args.repeat)
        rows.append({"workload": name, "before_s": before, "after_s": after, "ratio": after / before})
        print(f"{name:<62} {before:9.4f} {after:9.4f} {after / before:12.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": os.getloadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
