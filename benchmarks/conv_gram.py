"""Benchmark (issue 25): Gram matrices of a convolutional network, meanfield against neural-tangents.

    /tmp/nt-venv/bin/python benchmarks/conv_gram.py [--n 100] [--depth 10]

(the neural-tangents set-up of benchmarks/crosscheck/nt_conv.py). The issue's workload: NNGP + NTK of a
depth-10 network of 3 x 3 convolutions with zero padding ('SAME') and ReLU on n = 100 images of 8 x 8 x 3,
global average pooling read-out, float64 both, 'ntk' parameterisation: ``mf.kernels`` against
neural-tangents' ``stax`` ``kernel_fn`` under ``jax.jit``. One thread per side (XLA's intra-op pool and
numpy's BLAS pinned), process CPU time and wall time, best of 2 after a warm-up call (which for jax
includes the compile), peak resident memory of each side in its own child process. Prints a markdown row
for benchmarks/README.md and the largest relative difference between the two Gram matrices.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

SW, SB, WIDTH = 1.4, 0.1, 64


def images(n):
    rng = np.random.default_rng(5)
    return rng.standard_normal((n, 8, 8, 3)) * rng.uniform(0.5, 2.0, (n, 1, 1, 1))


def run_meanfield(n, depth):
    import meanfield as mf

    net = mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 3))))
    x = images(n)
    call = lambda: mf.kernels(net, x, depth=depth, sigma_w=SW, sigma_b=SB)  # noqa: E731
    return _time(call, lambda r: (r.nngp, r.ntk))


def run_nt(n, depth):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "crosscheck"))
    import jax
    from nt_conv import stax  # noqa: F401  (the stubs of nt_conv, then stax)

    conv = dict(W_std=SW, b_std=SB, parameterization="ntk")
    layers = [stax.Conv(WIDTH, (1, 1), **conv)]
    for _ in range(depth - 1):
        layers += [stax.Relu(), stax.Conv(WIDTH, (3, 3), padding="SAME", **conv)]
    _, _, kernel_fn = stax.serial(*layers, stax.GlobalAvgPool())
    fn = jax.jit(kernel_fn, static_argnames="get")
    x = images(n)
    call = lambda: jax.block_until_ready(fn(x, x, get=("nngp", "ntk")))  # noqa: E731
    return _time(call, lambda k: (np.asarray(k[0]), np.asarray(k[1])))


def _time(call, arrays):
    t0 = time.perf_counter()
    out = call()                                     # warm-up: jit compile, meanfield's block build
    first = time.perf_counter() - t0
    cpu, wall = [], []
    for _ in range(2):
        c, w = time.process_time(), time.perf_counter()
        out = call()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    nngp, ntk = arrays(out)
    return dict(first=first, cpu=min(cpu), wall=min(wall), nngp=nngp.tolist(), ntk=ntk.tolist(),
                peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--side", choices=("meanfield", "nt"))
    a = ap.parse_args()
    if a.side:   # a child: one side, its numbers as JSON on stdout
        print(json.dumps((run_meanfield if a.side == "meanfield" else run_nt)(a.n, a.depth)))
        return
    res = {}
    for side in ("meanfield", "nt"):
        out = subprocess.run([sys.executable, __file__, "--side", side, "--n", str(a.n), "--depth", str(a.depth)],
                             capture_output=True, text=True, check=True)
        res[side] = json.loads(out.stdout.strip().splitlines()[-1])
    m, t = res["meanfield"], res["nt"]
    diff = max(float(np.max(np.abs(np.array(m[k]) - np.array(t[k])) / np.abs(np.array(t[k]))))
               for k in ("nngp", "ntk"))
    print(f"load average {os.getloadavg()[0]:.1f}; largest relative difference {diff:.1e}")
    print("| workload | meanfield CPU / wall | neural-tangents CPU / wall (jit) | speed ratio (CPU) | first call "
          "mf / nt | peak memory mf / nt |")
    print("|---|---|---|---|---|---|")
    print(f"| n = {a.n}, 8 x 8 x 3, depth {a.depth}, ReLU, SAME, GAP | {m['cpu']:.2f} / {m['wall']:.2f} s | "
          f"{t['cpu']:.2f} / {t['wall']:.2f} s | {t['cpu'] / m['cpu']:.2f} | {m['first']:.1f} / {t['first']:.1f} s | "
          f"{m['peak_mb']:.0f} / {t['peak_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
