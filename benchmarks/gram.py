"""Benchmark: meanfield.kernels (NNGP + NTK Gram matrices) for n x n inputs at depth 10 and 50.

Run as ``python benchmarks/gram.py [--quadrature] [--only=tanh,SiLU] [--no-nngp-only]`` or
``python benchmarks/gram.py --growing [--only=ELU]`` (not part of pytest): one thread, best of
3 (``--quadrature``: tanh and SiLU, whose two-point moments are computed by the Hermite series of
meanfield/_gram_quadrature.py; best of 1) after a warm-up call (which builds and compiles the block map from the tree),
CPU time of this process (time.process_time), so the shared machine's load does not count. Inputs: n Gaussian rows of dimension 64 with norms spread over
[0.1, 3]. Prints a markdown table for benchmarks/README.md (section "gram").
``--growing``: ELU, SELU and SiLU deep in the growing phase (sigma_w = 2.5, sigma_b = 0.3: K grows ~3x per
layer, to ~1e16 at depth 30 and ~1e26 at depth 50), n inputs of dimension 16 with norms in [0.1, 3]
(n = 10 at depth 30, n = 100 at depth 50), both kernels, one call each.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402

CASES = [("ReLU", mf.Architecture("relu"), 1.5, 0.1), ("erf", mf.Architecture("erf"), 1.5, 0.1),
         ("GELU + ln_post", mf.Architecture("gelu", norm="ln_post"), 1.5, 0.1)]
QUADRATURE = [("tanh", mf.Architecture("tanh"), 1.5, 0.1), ("SiLU", mf.Architecture("silu"), 1.5, 0.1)]
GROWING = [("ELU", "elu"), ("SELU", "selu"), ("SiLU", "silu")]


def growing(only):
    """The --growing table: CPU time of one kernels call (after a warm-up at depth 2) per case."""
    rng = np.random.default_rng(0)
    print("| activation | n = 10, depth 30 | n = 100, depth 50 | largest K |")
    print("|---|---|---|---|")
    for name, act in GROWING:
        if only and name not in only:
            continue
        cells, kmax = [], 0.0
        for n, depth in ((10, 30), (100, 50)):
            x = rng.standard_normal((n, 16)) * rng.uniform(0.1, 3.0, size=(n, 1))
            mf.kernels(act, x[:2], depth=2, sigma_w=2.5, sigma_b=0.3)
            t = time.process_time()
            r = mf.kernels(act, x, depth=depth, sigma_w=2.5, sigma_b=0.3)
            cells.append(f"{time.process_time() - t:.2f} s")
            kmax = max(kmax, float(np.max(np.diag(r.nngp))))
        print(f"| {name} | " + " | ".join(cells) + f" | {kmax:.1e} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


def best(f, repeat=3):
    """Best CPU time (time.process_time: what this process used, whatever the load) of ``repeat`` runs."""
    out = []
    for _ in range(repeat):
        t = time.process_time()
        f()
        out.append(time.process_time() - t)
    return min(out)


def main():
    if "--growing" in sys.argv[1:]:
        only = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")]
        growing(only[0].split(",") if only else [])
        return
    quad = "--quadrature" in sys.argv[1:]
    repeat = 1 if quad else 3
    rng = np.random.default_rng(0)
    rows = []
    only = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")]
    for name, arch, sw, sb in (QUADRATURE if quad else CASES):
        if only and name not in only[0].split(","):
            continue
        t = time.perf_counter()
        mf.kernels(arch, rng.standard_normal((2, 4)), depth=2, sigma_w=sw, sigma_b=sb)
        build = time.perf_counter() - t
        times = {}
        for n in (100, 1000):
            x = rng.standard_normal((n, 64)) * rng.uniform(0.1, 3.0, size=(n, 1))
            for depth in (10, 50):
                times[n, depth] = best(lambda: mf.kernels(arch, x, depth=depth, sigma_w=sw, sigma_b=sb), repeat)
                if "--no-nngp-only" in sys.argv[1:] and (n, depth) == (1000, 50):
                    times[n, depth, "nngp"] = float("nan")   # skipped (the column is printed as "-")
                else:
                    times[n, depth, "nngp"] = best(lambda: mf.kernels(arch, x, depth=depth, sigma_w=sw,
                                                                      sigma_b=sb, get="nngp"), repeat)
        rows.append((name, build, times))
    print(f"`python benchmarks/gram.py` ({time.strftime('%Y-%m-%d')}; {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}; one thread, "
          f"CPU time (process_time), best of {repeat}; "
          f"load average {os.getloadavg()[0]:.1f} at the end).\n")
    print("| architecture | first call (build + compile) | n=100, depth 10 | n=100, depth 50 | n=1000, depth 10 "
          "| n=1000, depth 50 | n=1000, depth 50, NNGP only |")
    print("|---|---|---|---|---|---|---|")
    for name, build, t in rows:
        cells = [f"{t[n, d] * 1e3:.1f} ms" if t[n, d] < 1 else f"{t[n, d]:.2f} s"
                 for n, d in ((100, 10), (100, 50), (1000, 10), (1000, 50))]
        nn = t[1000, 50, "nngp"]
        print(f"| {name} | {build:.2f} s | " + " | ".join(cells) + (" | - |" if nn != nn else f" | {nn:.2f} s |"))


if __name__ == "__main__":
    main()
