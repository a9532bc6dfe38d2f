"""A Monte-Carlo phase diagram serially and on a Dask LocalCluster of 1 and 2 workers.

Workload (default): a slice of the partial-Jacobian paper's Fig. 2 panel:
the 20 x 20 (sigma_w, sigma_b) grid, erf MLPs of depth 50 and width 500,
784-dimensional inputs, float32, the penultimate APJN at every point, with
``--n-init`` initialisations per point (default 8 of the paper's 100, so 8 %
of a panel). The cluster runs shard the initialisations one per task
(``--init-chunk 1``), each task the whole 400-point grid.

Timed, each after a warm-up (imports, code generation, allocator):

* serial, 1 torch thread: ``phase_diagram(...)`` in this process;
* serial, all torch threads (what a user gets by default);
* ``phase_diagram(..., client=...)`` on a ``LocalCluster`` of N worker
  processes with 1 thread each (``meanfield.verification.distributed.local_cluster``),
  for N in ``--workers`` (cluster start-up is timed separately and excluded).

Wall time and CPU time (this process for the serial runs; the sum over the
workers' processes for the cluster runs, measured inside the workers), since
a shared machine inflates wall times.

Every cluster result is compared bit for bit with the serial one. Scaling
efficiency = T(serial, 1 thread) / (N * T(N workers)). The 1-minute load
average is printed before and after (the benchmark machine may be shared).

    python benchmarks/distributed.py                       # default workload
    python benchmarks/distributed.py --n-init 4 --grid 10  # smaller
    python benchmarks/distributed.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

# this file is named distributed.py: keep its folder off sys.path so `import distributed` finds Dask
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np
import torch

try:
    import meanfield as mf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import meanfield as mf
from meanfield.verification import phase_diagram
from meanfield.verification.distributed import local_cluster


def _load():
    return os.getloadavg()[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--activation", default="erf")
    p.add_argument("--grid", type=int, default=20)
    p.add_argument("--depth", type=int, default=50)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--input-dim", type=int, default=784)
    p.add_argument("--n-init", type=int, default=8)
    p.add_argument("--init-chunk", type=int, default=1, help="initialisations per cluster task")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from distributed import Client

    arch = mf.Architecture(args.activation)
    sw = np.linspace(0.5, 3.0, args.grid)
    sb = np.linspace(0.0, 2.0, args.grid)
    kw = dict(depth=args.depth, width=args.width, n_init=args.n_init, device="cpu", dtype=torch.float32,
              input_dim=args.input_dim)
    warm = dict(kw, depth=4, n_init=2)
    out = {"workload": {"grid": [args.grid, args.grid], "depth": args.depth, "width": args.width,
                        "input_dim": args.input_dim, "n_init": args.n_init, "networks": args.grid ** 2 * args.n_init,
                        "fraction_of_fig2_panel": args.grid ** 2 * args.n_init / 40000, "dtype": "float32",
                        "init_chunk": args.init_chunk},
           "hardware": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
           "load_before": _load(), "runs": []}
    print(f"load average (1 min) before: {out['load_before']:.2f}")

    threads0 = torch.get_num_threads()
    ref = None
    for threads in sorted({1, threads0}):
        torch.set_num_threads(threads)
        phase_diagram(arch, sw[:2], sb[:2], **warm)
        t0, c0 = time.perf_counter(), time.process_time()
        res = phase_diagram(arch, sw, sb, **kw)
        t, cpu = time.perf_counter() - t0, time.process_time() - c0
        if threads == 1:
            ref = res
        same = bool(np.array_equal(res.chi_J, ref.chi_J) and np.array_equal(res.chi_J_se, ref.chi_J_se))
        out["runs"].append({"mode": f"serial, {threads} torch thread(s)", "seconds": t, "cpu_seconds": cpu,
                            "identical_to_serial_1": same, "load": _load()})
        print(f"serial, {threads} thread(s): {t:.2f} s wall, {cpu:.2f} s CPU (identical to 1-thread: {same})")
    torch.set_num_threads(threads0)

    for n in args.workers:
        t0 = time.perf_counter()
        cluster = local_cluster(n, threads_per_worker=1, gpus=0)
        client = Client(cluster)
        startup = time.perf_counter() - t0
        try:
            phase_diagram(arch, sw[:2], sb[:2], client=client, init_chunk=1, **dict(warm, n_init=2 * n))
            w0, t0, c0 = client.run(time.process_time), time.perf_counter(), time.process_time()
            res = phase_diagram(arch, sw, sb, client=client, init_chunk=args.init_chunk, **kw)
            t, c_client = time.perf_counter() - t0, time.process_time() - c0
            w1 = client.run(time.process_time)
            cpu = sum(w1[w] - w0[w] for w in w1)
        finally:
            client.close()
            cluster.close()
        same = bool(np.array_equal(res.chi_J, ref.chi_J) and np.array_equal(res.chi_J_se, ref.chi_J_se)
                    and np.array_equal(res.K, ref.K))
        t1 = out["runs"][0]["seconds"]
        eff = t1 / (n * t)
        out["runs"].append({"mode": f"LocalCluster, {n} worker(s) x 1 thread", "workers": n, "seconds": t,
                            "cpu_seconds": cpu, "client_and_scheduler_cpu_seconds": c_client,
                            "startup_seconds": startup, "speedup_vs_serial_1": t1 / t, "efficiency": eff,
                            "identical_to_serial_1": same, "load": _load()})
        print(f"LocalCluster {n} worker(s): {t:.2f} s wall, {cpu:.2f} s CPU in the workers, {c_client:.2f} s in "
              f"client+scheduler (start-up {startup:.1f} s), speed-up {t1 / t:.2f}, efficiency {eff:.0%}, "
              f"identical: {same}")
    per_panel = out["runs"][0]["seconds"] / out["workload"]["fraction_of_fig2_panel"]
    out["serial_1_thread_seconds_per_fig2_panel_extrapolated"] = per_panel
    out["load_after"] = _load()
    print(f"one Fig. 2 panel (40,000 networks) on one CPU core, extrapolated: {per_panel:.0f} s")
    print(f"load average (1 min) after: {out['load_after']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
