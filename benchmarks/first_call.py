"""First answers in fresh processes (cold: empty cache; warm: the cache the cold run left) and the
per-call overhead of a warm one-point kernel_profile.

    python benchmarks/first_call.py [--activations erf gelu tanh] [--json FILE]

Each row is one fresh process running ``python -m meanfield critical-point --activation A`` (wall
and CPU time of the child, from os.wait4), then one process timing ``import meanfield`` and a first
``kernel_profile`` (depth 50). The machine is shared: CPU times are the fairer comparison.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SNIPPET = """
import time
t0 = time.perf_counter(); c0 = time.process_time()
import meanfield as mf
t1 = time.perf_counter(); c1 = time.process_time()
mf.kernel_profile(activation={act!r}, sigma_w=1.2, sigma_b=0.1, depth=50)
t2 = time.perf_counter(); c2 = time.process_time()
print(t1 - t0, c1 - c0, t2 - t1, c2 - c1)
"""

OVERHEAD = """
import time, meanfield as mf
arch = mf.Architecture(activation="erf")
mf.kernel_profile(arch, sigma_w=1.2, sigma_b=0.1, depth=1)  # numba (MEANFIELD_ENGINE=numba): load
def best(f, n=20000):
    b = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        b = min(b, (time.perf_counter() - t) / n)
    return b * 1e6
import numpy as np
from meanfield.numeric import compiled, _ENTRIES
c = compiled(arch)
o = [np.empty(1) for _ in range(3)]
ep = _ENTRIES["profile"]
k = best(lambda: ep(c.fast_fns, False, 1.45, 0.0, 1.44, 0.01, 0.0, 0.0, *o))
a = best(lambda: mf.kernel_profile(arch, sigma_w=1.2, sigma_b=0.1, depth=1))
w = best(lambda: mf.kernel_profile(activation="erf", sigma_w=1.2, sigma_b=0.1, depth=1))
print(k, a, w)
"""


def run(cmd, env):
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    _, status, ru = os.wait4(p.pid, 0)
    out = p.stdout.read()
    return time.perf_counter() - t, ru.ru_utime + ru.ru_stime, out, status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--activations", nargs="+", default=["erf", "gelu", "tanh"])
    ap.add_argument("--json")
    ap.add_argument("--overhead-only", action="store_true")
    args = ap.parse_args()
    rows = []
    for act in ([] if args.overhead_only else args.activations):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, MEANFIELD_CACHE_DIR=d, MEANFIELD_QUIET="1")
            for kind in ("cold", "warm"):
                wall, cpu, _, st = run([sys.executable, "-m", "meanfield", "critical-point", "--activation", act], env)
                rows.append(dict(activation=act, what=f"critical-point CLI, {kind}", wall_s=wall, cpu_s=cpu, ok=st == 0))
                print(json.dumps(rows[-1]), flush=True)
            _, _, out, _ = run([sys.executable, "-c", SNIPPET.format(act=act)], env)
            ti, ci, tp, cp = map(float, out.split())
            rows.append(dict(activation=act, what="warm: import / first kernel_profile", import_wall_s=ti,
                             import_cpu_s=ci, first_profile_wall_s=tp, first_profile_cpu_s=cp))
            print(json.dumps(rows[-1]), flush=True)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, MEANFIELD_CACHE_DIR=os.environ.get("MEANFIELD_CACHE_DIR", d), MEANFIELD_ENGINE="numba")
        _, _, out, _ = run([sys.executable, "-c", OVERHEAD], env)
        k, a, w = map(float, out.split())
        rows.append(dict(what="warm one-point kernel_profile (depth 1), us", kernel_alone_us=k,
                         with_architecture_us=a, with_keywords_us=w, overhead_us=a - k))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
