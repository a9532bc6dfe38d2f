"""Monte-Carlo throughput in GFLOP/s against the float32 matrix-multiply peak measured in the same run.

Workload (default): the partial-Jacobian paper's Fig. 2 panel at 10 % of its
initialisations: ``meanfield.verification.phase_diagram`` on a 20 x 20
(sigma_w, sigma_b) grid, erf MLPs of depth 50, width 500, 784-dimensional
inputs, 10 initialisations, float32, the penultimate APJN. ``--small``
instead runs a small grid (3 x 3 points, depth 20, width 128, 8
initialisations), where per-call overhead matters.

Flops counted: the matrix products only (input layer 2 N0 N per input, every
block 2 P S N^2 per initialisation, S = 1 + probes on the measured block);
element-wise work and random numbers are overhead against that count, so
``GFLOP/s / peak`` is the fraction of the machine the pass turns into useful
products. The peak is the best of repeated float32 products measured before
and after the workload, in this process: a large square ``mm`` (2048^3) and
the workload's own batched shape (``bmm``), the higher of the two is "peak".
The 1-minute load average (the machine may be shared) is printed with them.

Roofline-style bound. Per layer and initialisation the pass does one
(P S B, N) x (N, N) product (2 P S B N^2 flops), draws N^2 + N normals and
runs a few element-wise passes over P S B N numbers (scale, bias, the
activation). The components are timed here on their own (process CPU time,
best of repeats, the workload's shapes) and the bound printed is

    fraction <= (flops / peak) / (t_bmm + t_normals + t_elementwise),

the best a pass can do when nothing else costs anything: with B = 1 the
flops per normal number are only 2 P S, so the generator's speed caps the
fraction whatever the matrix product does.

OpenMP threads. torch's OpenMP workers spin-wait after every parallel region
(libgomp's default). On a machine whose cores are shared, the spinning
workers take CPU from the serial parts of the pass (the numba normals, the
Python between operations) and from other processes; with 2 torch threads
this doubled the pass's CPU time here. The script therefore sets
``OMP_WAIT_POLICY=PASSIVE`` before importing torch unless ``--omp-active``
(or an ``OMP_WAIT_POLICY`` already in the environment) says otherwise, and
reports the policy it ran with. Set it the same way for long Monte-Carlo
runs on shared CPUs.

    python benchmarks/mc_throughput.py [--small] [--repeat 3] [--omp-active] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if "--omp-active" not in sys.argv:  # before torch (and its libgomp) is loaded; see the docstring
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

try:
    import meanfield as mf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import meanfield as mf
from meanfield.verification import phase_diagram


def _best(f, n):
    """Best wall time and best process CPU time of n calls."""
    best, cpu = float("inf"), float("inf")
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return best, cpu


def peak(I, rows, N, n=5):
    """Best float32 GFLOP/s (wall, per CPU-second) of a 2048^3 mm and of the (I, rows, N) x (I, N, N) bmm."""
    A, B = torch.randn(2048, 2048), torch.randn(2048, 2048)
    w, c = _best(lambda: A @ B, n)
    mm = (2 * 2048**3 / w / 1e9, 2 * 2048**3 / c / 1e9)
    Z, G = torch.randn(I, rows, N), torch.randn(I, N, N)
    w, c = _best(lambda: torch.bmm(Z, G.transpose(1, 2)), n)
    bmm = (2 * I * rows * N * N / w / 1e9, 2 * I * rows * N * N / c / 1e9)
    return mm, bmm


def components(I, P, N, n=5):
    """Process CPU seconds per (layer, initialisation) of the pass's parts, at the workload's shapes."""
    from meanfield.torch._philox import fill_normal

    z, G = torch.randn(I, P, N), torch.randn(I, N, N)
    _, bmm = _best(lambda: torch.bmm(z, G.transpose(1, 2)), n)
    buf = np.empty((I, N * N + N), dtype=np.float32)
    ids = np.arange(I)
    _, normals = _best(lambda: fill_normal(buf, 0, ids, 7), n)
    y = torch.randn(I, P, 1, 1, 1, N)
    scale, sb, g = torch.rand(1, P, 1, 1, 1, 1) + 0.5, torch.rand(1, P, 1, 1, 1), torch.randn(I, 1, 1, 1, N)

    def epilogue():  # what Dense and ActivationLayer.torch_forward did after the product (layers/)
        y.mul_(scale)
        y[:, :, 0] += sb * g
        return torch.erf(y)

    _, elem = _best(epilogue, n)
    from meanfield.torch._fused import affine_, erf32

    yn, scn, sbn, gn = (y.numpy().reshape(I, P, 1, 1, N), scale.numpy().reshape(P), sb.numpy().reshape(P),
                        g.numpy().reshape(I, N))

    def fused():  # what they do now (torch/_fused.py): one affine pass, then erf32
        affine_(yn, scn, sbn, gn)
        return erf32(yn)

    _, elem_fused = _best(fused, n)
    _, erf = _best(lambda: torch.erf(y), n)
    _, erf_rational = _best(lambda: erf32(yn), n)
    return dict(bmm=bmm / I, normals=normals / I, elementwise=elem / I, elementwise_fused=elem_fused / I,
                erf=erf / I, erf32=erf_rational / I)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--omp-active", action="store_true", help="leave torch's OpenMP workers spin-waiting")
    a = p.parse_args(argv)
    if a.small:
        grid, depth, width, n_init, N0 = 3, 20, 128, 8, 128
    else:
        grid, depth, width, n_init, N0 = 20, 50, 500, 10, 784
    sw, sb = np.linspace(0.5, 3.0, grid), np.linspace(0.0, 2.0, grid)
    P = grid * grid
    layer = depth - 2
    # input layer on the P-independent input; blocks 1..layer on P points; the block at `layer` carries a probe
    flops = n_init * (2 * N0 * width + sum(2 * P * (2 if l == layer else 1) * width * width
                                           for l in range(1, layer + 1)))
    arch = mf.Architecture("erf")
    run = lambda: phase_diagram(arch, sw, sb, depth=depth, width=width, n_init=n_init, device="cpu",  # noqa: E731
                                dtype=torch.float32, input_dim=N0)
    phase_diagram(arch, sw[:2], sb[:2], depth=4, width=width, n_init=2, device="cpu", dtype=torch.float32,
                  input_dim=N0)  # warm-up (allocator, threads, compiled kernels)
    load0 = os.getloadavg()[0]
    mm0, bmm0 = peak(n_init, P, width)
    from meanfield.torch import context

    # interleaved: the pass with the fused Dense epilogue (the default) and with torch's three operations
    times, cpus, times_t, cpus_t = [], [], [], []
    for _ in range(a.repeat):
        for fused, tl, cl in ((True, times, cpus), (False, times_t, cpus_t)):
            context.FUSED_EPILOGUE = context.FAST_ERF = fused
            t0, c0 = time.perf_counter(), time.process_time()
            run()
            tl.append(time.perf_counter() - t0)
            cl.append(time.process_time() - c0)
    context.FUSED_EPILOGUE = context.FAST_ERF = True
    mm1, bmm1 = peak(n_init, P, width)
    comp = components(n_init, P, width)
    load1 = os.getloadavg()[0]
    # wall: best wall time against the best wall-clock peak; cpu: per process CPU-second on both sides
    # (fairer on a shared machine, where the wall clock also counts other processes' time slices)
    pk = max(mm0[0], mm1[0], bmm0[0], bmm1[0])
    pk_cpu = max(mm0[1], mm1[1], bmm0[1], bmm1[1])
    t, c = min(times), min(cpus)
    # the bound on the most-common layer (S = 1): useful flops at the CPU peak over the parts' CPU time
    per_layer = 2 * P * width * width
    parts = (comp["bmm"], comp["normals"], comp["elementwise_fused"])
    bound = per_layer / pk_cpu / 1e9 / sum(parts)
    bound_torch = per_layer / pk_cpu / 1e9 / (comp["bmm"] + comp["normals"] + comp["elementwise"])
    res = dict(workload=dict(grid=grid, depth=depth, width=width, n_init=n_init, input_dim=N0, dtype="float32"),
               gflop=flops / 1e9, seconds=times, cpu_seconds=cpus, gflops=flops / t / 1e9,
               gflops_per_cpu_s=flops / c / 1e9,
               peak_mm_gflops=[mm0, mm1], peak_bmm_gflops=[bmm0, bmm1], peak_gflops=pk, peak_gflops_per_cpu_s=pk_cpu,
               fraction_of_peak=flops / t / 1e9 / pk, fraction_of_peak_cpu=flops / c / 1e9 / pk_cpu,
               load_average_1min=[load0, load1], torch_threads=torch.get_num_threads(),
               omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "(unset: libgomp spins)"),
               components_cpu_s_per_layer_init=comp, bound_fraction_of_peak_cpu=bound,
               torch_epilogue=dict(seconds=times_t, cpu_seconds=cpus_t,
                                   fraction_of_peak_cpu=flops / min(cpus_t) / 1e9 / pk_cpu,
                                   bound_fraction_of_peak_cpu=bound_torch))
    print(f"{'small' if a.small else 'Fig. 2 at 10%'}: {flops / 1e9:.3g} GFLOP in {t:.2f} s (best of {a.repeat}; "
          f"all {', '.join(f'{x:.2f}' for x in times)} s; CPU {c:.2f} s) = {flops / t / 1e9:.3g} GFLOP/s "
          f"({flops / c / 1e9:.1f} per CPU-s)")
    print(f"peak (wall / per CPU-s): mm 2048^3 {mm0[0]:.1f}/{mm0[1]:.1f} then {mm1[0]:.1f}/{mm1[1]:.1f}, bmm "
          f"{bmm0[0]:.1f}/{bmm0[1]:.1f} then {bmm1[0]:.1f}/{bmm1[1]:.1f} GFLOP/s -> {100 * flops / t / 1e9 / pk:.0f} % "
          f"of {pk:.1f} (wall), {100 * flops / c / 1e9 / pk_cpu:.0f} % of {pk_cpu:.1f} (CPU); "
          f"load average {load0:.2f} -> {load1:.2f}")
    ct = min(cpus_t)
    print(f"  the same pass with torch's epilogue (mul_, add, torch.erf; interleaved): {min(times_t):.2f} s "
          f"(CPU {ct:.2f} s) = {100 * flops / ct / 1e9 / pk_cpu:.0f} % of the CPU peak")
    print(f"per layer and initialisation (CPU): " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in comp.items())
          + f" -> bound {100 * bound:.0f} % of the CPU peak (bmm + normals + fused epilogue; "
          f"{100 * bound_torch:.0f} % with torch's); torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={res['omp_wait_policy']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
