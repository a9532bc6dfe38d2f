r"""Monte-Carlo sweeps and the verification suite on a Dask cluster (needs the ``distributed`` extra).

One way to hand work to a cluster everywhere it fits: a
``dask.distributed.Client`` passed as ``client=`` to
:func:`~meanfield.verification.phase_diagram`,
:func:`~meanfield.verification.run_suite` and :func:`autoinit_sweep`, or
``meanfield verify --scheduler ADDRESS`` / ``--scheduler local:N`` on the
command line (:func:`connect`). Dask does the scheduling, the retries after a
lost worker and the data movement; this module only decides what a task is,
how its result is saved, and how the pieces are put back together.

Sharding that keeps the numbers
-------------------------------
A phase diagram is a set of *shards*: a block of grid points times a block of
initialisations (:func:`plan_shards`). The numbers do not depend on how the
shards are laid out or where they run, because

* every random number of initialisation i comes from generators seeded by
  (seed, i, ...) alone (weights: (seed, i, 0); Hutchinson probes:
  (seed, i, 1, layer)), and the inputs from seed alone, so a shard holding
  initialisations [i0, i1) draws exactly what the single-process run draws
  for them (common random numbers over the grid are kept: every point of a
  shard uses the same weights of initialisation i);
* a shard returns the *per-initialisation* estimates (n_init_block,
  n_points_block); the client puts them into the full (n_init, n_points)
  array and reduces it (mean, standard error over initialisations) exactly
  as :func:`~meanfield.verification.phase_diagram` does, in one place, in the
  same order;
* the shard layout is a function of the problem and of the memory budget at
  the *first* submission only (it is recorded in the checkpoint's
  ``manifest.json`` and reused on resume), never of the number of workers.

What is and is not invariant, measured (``tests/test_verification_distributed.py``):
splitting the *initialisations* into passes does not change a single bit on
the CPU (a pass is a batched matrix product whose batch entries are
independent products of the same shape); splitting the *grid points* does
change the last bits (the row count of each product changes and BLAS picks a
different blocking; differences ~1e-15). So a shard holds the whole panel of
grid points whenever one initialisation of it fits the smallest worker's
memory budget (always true for MLP panels: the partial-Jacobian Fig. 2 panel
needs ~13 MB per initialisation in float32), and then the distributed
result is bit-identical to the default single-process
``phase_diagram(...)``. When a panel must be split over points the split is
at multiples of ``point_chunk`` (reported in a warning), and the result is
bit-identical to ``phase_diagram(..., point_chunk=point_chunk)``. On CUDA,
cuBLAS may pick a different kernel for a different batch count; a shard is
therefore computed in exactly one pass of its own size, so two runs with the
same layout (the manifest) agree bit for bit on the same GPU type, whatever
the number of workers.

Resume
------
With ``checkpoint=DIR`` every finished shard is written atomically
(``DIR/shards/<name>.npz``, a temporary file then ``os.replace``) on the
client as soon as it completes. A rerun with the same arguments and the same
DIR loads the finished shards and submits only the missing ones; a shard is
either complete on disk or absent, and task keys are deterministic, so no
result is lost or counted twice. A worker lost mid-run is handled by Dask:
the scheduler reruns its unfinished tasks elsewhere (up to
``distributed.scheduler.allowed-failures`` times); a task that still fails
leaves its shard missing, the run raises after saving everything else, and
the rerun computes the rest. The suite does the same per case
(``out_dir/cases/<id>.json``, as the single-machine suite always has).

Memory
------
:func:`memory_budget` is what one pass may use on a worker: half the free
device memory on CUDA (``torch.cuda.mem_get_info``); on a CPU half of
``MemAvailable`` from ``/proc/meminfo``, capped by the Dask worker's memory
limit and shared among its threads; ``DEFAULT_CPU_BUDGET`` (2 GB) where
neither can be read. The smallest budget over the workers sizes the shards
(the same per-initialisation footprint estimate as the single-process run,
``_batched._bytes_per_init``), so no shard needs more memory than any
worker has.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._validate import check_nonnegative
from ._batched import _check_dtype, _check_int, _seed_for, resolve_device
from ._cases import run_case
from ._checkpoints import _case_hash, _read_checkpoint, _write_json_atomic
# the sharded phase diagram lives below montecarlo (phase_diagram(client=) calls it); its public names
# are this module's, as they always were
from ._sharded import (DEFAULT_CPU_BUDGET, MEMORY_FRACTION, Shard, _bar, _digest, _distributed,  # noqa: F401
                       _write_json, meminfo_available, memory_budget, phase_diagram_distributed, plan_shards)

__all__ = ["DEFAULT_CPU_BUDGET", "AutoInitSweep", "Shard", "autoinit_sweep", "connect", "local_cluster",
           "memory_budget", "phase_diagram_distributed", "plan_shards", "run_cases"]


# ---------------------------------------------------------------------------
# Clusters.
# ---------------------------------------------------------------------------
def local_cluster(n_workers=None, *, threads_per_worker: int = 1, gpus=None, **kwargs):
    """A cluster of worker processes on this machine.

    With CUDA (``gpus`` defaults to ``torch.cuda.device_count()``), one
    worker per GPU: dask-cuda's ``LocalCUDACluster`` when installed, else
    Dask workers whose ``CUDA_VISIBLE_DEVICES`` pins each to one GPU (round
    robin when ``n_workers`` exceeds the GPUs). Without CUDA, a
    ``LocalCluster`` of ``n_workers`` processes (default: the CPU count) with
    ``threads_per_worker`` threads each. Extra keywords go to the cluster.
    """
    distributed = _distributed()
    import dask

    n_gpu = torch.cuda.device_count() if gpus is None else int(gpus)
    if n_workers is None:
        n_workers = n_gpu or os.cpu_count() or 1
    n_workers = _check_int("n_workers", n_workers, 1)
    kwargs.setdefault("dashboard_address", None)
    # Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also switches off glibc's
    # dynamic mmap threshold: every large tensor is then mmap'ed and zeroed afresh, ~1.5x the CPU
    # time of a Monte-Carlo pass (measured, benchmarks/README.md). The nannies read this at start.
    env = {k: v for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}).items()
           if k != "MALLOC_TRIM_THRESHOLD_"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
        return _start_cluster(distributed, n_workers, n_gpu, threads_per_worker, kwargs)


def _start_cluster(distributed, n_workers, n_gpu, threads_per_worker, kwargs):
    if n_gpu:
        try:
            from dask_cuda import LocalCUDACluster

            if n_workers <= n_gpu:
                return LocalCUDACluster(n_workers=n_workers, threads_per_worker=threads_per_worker, **kwargs)
        except ImportError:
            pass
        workers = {i: {"cls": distributed.Nanny,
                       "options": {"nthreads": threads_per_worker, "env": {"CUDA_VISIBLE_DEVICES": str(i % n_gpu)}}}
                   for i in range(n_workers)}
        scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": kwargs.pop("dashboard_address")}}
        return distributed.SpecCluster(workers=workers, scheduler=scheduler, **kwargs)
    return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                                    **kwargs)


@contextlib.contextmanager
def connect(scheduler):
    """A ``Client`` for ``scheduler``; closes what it started.

    ``scheduler``: ``"local"`` or ``"local:N"`` (:func:`local_cluster` with N
    workers), a scheduler address (``"tcp://host:8786"``), or the path of a
    scheduler file (``dask scheduler --scheduler-file``; dask-jobqueue and
    dask-mpi write one).
    """
    distributed = _distributed()
    if not isinstance(scheduler, str) or not scheduler:
        raise ValueError(f"scheduler must be 'local', 'local:N' or a scheduler address, got {scheduler!r}")
    cluster = None
    if scheduler == "local" or scheduler.startswith("local:"):
        n = scheduler.partition(":")[2]
        if n and not (n.isdigit() and int(n) >= 1):
            raise ValueError(f"scheduler={scheduler!r}: use 'local' or 'local:N' with an integer N >= 1")
        cluster = local_cluster(int(n) if n else None)
        client = distributed.Client(cluster)
    elif os.path.isfile(scheduler):
        client = distributed.Client(scheduler_file=scheduler)
    else:
        client = distributed.Client(scheduler)
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# ---------------------------------------------------------------------------
# The verification suite.
# ---------------------------------------------------------------------------
def run_cases(client, cases, device, dtype, folder, *, resume=True, progress=True, _on_case=None) -> dict:
    """Run the cases that have no valid checkpoint on the cluster; save each as it completes.

    Called by ``run_suite(..., client=client)``. ``folder`` is the suite's
    ``cases/`` folder; a case's checkpoint is valid when its hash (case,
    device, dtype) matches and it did not error, exactly as in the
    single-machine suite. Returns {case id: result} for the cases run here
    (a case whose task failed for good is returned with status 'error', not
    saved, and rerun next time).
    """
    distributed = _distributed()

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    todo = {}
    for case in cases:
        h = _case_hash(case, device, dtype)
        ckpt = folder / f"{case['id']}.json"
        if resume and _read_checkpoint(ckpt, case["id"], h) is not None:
            continue
        todo[case["id"]] = (case, h)
    futures = {client.submit(run_case, case, device, dtype, key=f"meanfield-case-{cid}-{h}", pure=False): cid
               for cid, (case, h) in todo.items()}
    bar = _bar(len(cases), len(cases) - len(todo), "verification (cluster, cases)", progress)
    out = {}
    for f in distributed.as_completed(list(futures)):
        cid = futures[f]
        case, h = todo[cid]
        try:
            res = f.result()
            res["hash"] = h
            _write_json_atomic(folder / f"{cid}.json", res)
        except Exception as err:
            res = {"id": cid, "title": case.get("title", cid), "kind": case.get("kind", "profile"), "case": case,
                   "paper": case.get("paper", ""), "expected": case.get("expected", "pass"), "status": "error",
                   "details": [f"the cluster lost this case ({type(err).__name__}: {err}); rerun to compute it"],
                   "data": {}, "seconds": 0.0}
        finally:
            f.release()
        out[cid] = res
        if _on_case is not None:
            _on_case(cid)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


# ---------------------------------------------------------------------------
# AutoInit sweeps (the AutoInit paper's Fig. 1 scan).
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AutoInitSweep:
    """AutoInit on a (sigma_w, lr) grid of ReLU MLPs: arrays indexed [i_sigma_w, i_lr, ...].

    ``J_before``/``J_after``: J^{l,l+1} of every block pair before and after
    tuning, shape (n_sigma_w, n_lr, n_pairs), nan where AutoInit diverged;
    ``loss``: the last loss; ``steps``: updates done; ``converged``: the
    loss reached ``tol``; ``status``: 'ok' or 'diverged' (AutoInitError).
    """

    sigma_w: np.ndarray
    lr: np.ndarray
    depth: int
    width: int
    steps_max: int
    loss_name: str
    seed: int
    J_before: np.ndarray = field(repr=False)
    J_after: np.ndarray = field(repr=False)
    loss: np.ndarray = field(repr=False)
    steps: np.ndarray = field(repr=False)
    converged: np.ndarray = field(repr=False)
    status: np.ndarray = field(repr=False)
    seconds: float = 0.0

    def in_band(self, low: float = 0.8, high: float = 1.25) -> np.ndarray:
        """(n_sigma_w, n_lr) mask: every J^{l,l+1} after tuning in (low, high) (the points Fig. 1 plots)."""
        with np.errstate(invalid="ignore"):
            return np.all((self.J_after > low) & (self.J_after < high), axis=-1)


def _fig1_inputs(n, input_dim, seed):
    """Seeded Gaussian stand-ins for normalised data: |x|^2 / input_dim = 1 for every row (float64, CPU)."""
    g = torch.Generator().manual_seed(_seed_for(seed, 3))
    x = torch.randn(n, input_dim, generator=g, dtype=torch.float64)
    return x * (math.sqrt(input_dim) / x.norm(dim=1, keepdim=True))


def _autoinit_point(i, j, sigma_w, lr, cfg, inputs):
    """One (sigma_w, lr) point: a fresh ReLU MLP at sigma_w (seeded by (seed, 1, i): the same network for every
    lr), tuned by AutoInit; returns a JSON-able dict."""
    from torch import nn

    from ..torch.autoinit import AutoInitError, autoinit

    dev = resolve_device(cfg["device"])
    dtype = getattr(torch, cfg["dtype"])
    g = torch.Generator().manual_seed(_seed_for(cfg["seed"], 1, i))
    layers, fan = [], cfg["input_dim"]
    for _ in range(cfg["depth"]):
        lin = nn.Linear(fan, cfg["width"], bias=False, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.normal_(0.0, sigma_w / math.sqrt(fan), generator=g)
        layers += [lin, nn.ReLU()]
        fan = cfg["width"]
    model = nn.Sequential(*layers[:-1]).to(device=dev, dtype=dtype)
    x = (inputs if inputs is not None else _fig1_inputs(cfg["n_data"], cfg["input_dim"], cfg["seed"]))
    x = x.to(device=dev, dtype=dtype)
    t0 = time.perf_counter()
    out = {"i": i, "j": j, "sigma_w": float(sigma_w), "lr": float(lr), "device": str(dev)}
    try:
        _, rep = autoinit(model, x, loss=cfg["loss"], lr=float(lr), steps=cfg["steps"], tol=cfg["tol"],
                          n_probes=cfg["n_probes"], batch_size=cfg["batch"], seed=cfg["seed"], progress=False)
        fin = [None if not np.isfinite(v) else float(v) for v in np.ravel(rep.J_after)]
        out.update(status="ok", J_before=[float(v) for v in np.ravel(rep.J_before)], J_after=fin,
                   loss=float(rep.loss_history[-1]), steps=int(rep.steps), converged=bool(rep.converged))
    except AutoInitError as err:
        out.update(status="diverged", message=str(err), J_before=None, J_after=None, loss=None, steps=err.step,
                   converged=False)
    out["seconds"] = time.perf_counter() - t0
    return out


def autoinit_sweep(sigma_w, lr, *, depth: int = 10, width: int = 500, input_dim: int = 3072, batch: int = 256,
                   steps: int = 980, loss: str = "jll", tol: float = 0.0, n_probes: int = 2, inputs=None,
                   n_data=None, seed: int = 0, device=None, dtype=torch.float32, client=None, checkpoint=None,
                   progress: bool = True) -> AutoInitSweep:
    """AutoInit (Algorithm 2) at every (sigma_w, lr) of a grid: the AutoInit paper's Fig. 1 scan.

    Fig. 1 (second panel; appendix A): ReLU MLPs with L = 10 layers of width
    500, sigma_b = 0, JLL loss, |B| = 256, 980 steps, normalised CIFAR-10,
    1200 points of about 1.5 GPU-minutes each. Here every point builds a
    bias-free ReLU MLP of ``depth`` Linear layers (the first maps
    ``input_dim`` to ``width``) with W ~ N(0, sigma_w^2 / fan_in), drawn
    from a generator seeded by (seed, 1, i_sigma_w) (the same network for
    every learning rate), and runs :func:`~meanfield.torch.autoinit`
    with ``lr``, ``loss``, ``steps``, ``tol``, ``n_probes``, ``batch`` and
    ``seed``. ``inputs`` are the data (CPU tensor, (n, input_dim));
    default: ``n_data`` (default 4 * batch) seeded Gaussian rows with
    |x|^2 = input_dim, a stand-in for normalised images.

    ``client``: a ``dask.distributed.Client``; every point is one task, so
    the result does not depend on the number of workers (a point's random
    numbers depend only on seed and its sigma_w index). ``checkpoint``: a
    folder; each finished point is written atomically as it completes and a
    rerun computes only the missing ones (with or without a client).

    Returns
    -------
    AutoInitSweep
    """
    sw, lrs, cfg, inputs = _sweep_config(sigma_w, lr, depth, width, input_dim, batch, steps, loss, tol, n_probes,
                                         inputs, n_data, seed, device, dtype)
    key = _digest({"cfg": cfg, "sigma_w": sw.tolist(), "lr": lrs.tolist(),
                   "inputs": None if inputs is None else hashlib.sha256(inputs.numpy().tobytes()).hexdigest()})
    folder = None if checkpoint is None else Path(checkpoint)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        manifest = folder / "manifest.json"
        if manifest.exists() and json.loads(manifest.read_text()).get("hash") != key:
            raise ValueError(f"checkpoint={str(folder)!r} holds a different sweep; use another folder")
        _write_json(manifest, {"hash": key, "config": cfg, "sigma_w": sw.tolist(), "lr": lrs.tolist()})
    points = [(i, j) for i in range(sw.size) for j in range(lrs.size)]
    results = _finished_sweep_points(folder, points)
    todo = [p for p in points if p not in results]
    bar = _bar(len(points), len(points) - len(todo), "AutoInit sweep", progress)
    t0 = time.perf_counter()

    def done(res):
        i, j = res["i"], res["j"]
        if folder is not None:
            _write_json(folder / f"point_{i:04d}_{j:04d}.json", res)
        results[i, j] = res
        if bar is not None:
            bar.update(1)

    if client is None:
        for i, j in todo:
            done(_autoinit_point(i, j, sw[i], lrs[j], cfg, inputs))
    else:
        _sweep_on_cluster(client, todo, len(points), sw, lrs, cfg, inputs, key, done, folder)
    if bar is not None:
        bar.close()
    return _sweep_arrays(results, sw, lrs, cfg["depth"], cfg["width"], cfg["steps"], loss, cfg["seed"],
                         time.perf_counter() - t0)


def _sweep_config(sigma_w, lr, depth, width, input_dim, batch, steps, loss, tol, n_probes, inputs, n_data, seed,
                  device, dtype):
    """autoinit_sweep's arguments checked: (sigma_w grid, lr grid, the points' configuration as JSON
    data, the inputs as a CPU tensor or None)."""
    sw = np.atleast_1d(check_nonnegative("sigma_w", sigma_w)).astype(np.float64).ravel()
    lrs = np.atleast_1d(check_nonnegative("lr", lr)).astype(np.float64).ravel()
    if np.any(sw <= 0) or np.any(lrs <= 0):
        raise ValueError("sigma_w and lr must be > 0 at every grid point")
    depth = _check_int("depth", depth, 2)
    width = _check_int("width", width, 1)
    input_dim = _check_int("input_dim", input_dim, 1)
    batch = _check_int("batch", batch, 1)
    steps = _check_int("steps", steps, 1)
    seed = _check_int("seed", seed, 0)
    n_probes = _check_int("n_probes", n_probes, 1)
    n_data = 4 * batch if n_data is None else _check_int("n_data", n_data, 1)
    dtype = _check_dtype(dtype)
    if loss not in ("jll", "jsl"):
        raise ValueError(f"loss must be 'jll' or 'jsl' (the losses of Fig. 1 and Fig. 5), got {loss!r}")
    if inputs is not None:
        inputs = torch.as_tensor(inputs).detach().cpu()
        if inputs.ndim != 2 or inputs.shape[1] != input_dim:
            raise ValueError(f"inputs must have shape (n, input_dim={input_dim}), got {tuple(inputs.shape)}")
    cfg = {"depth": depth, "width": width, "input_dim": input_dim, "batch": batch, "steps": steps, "loss": loss,
           "tol": float(tol), "n_probes": n_probes, "n_data": n_data, "seed": seed,
           "device": None if device is None else str(device), "dtype": str(dtype).replace("torch.", "")}
    return sw, lrs, cfg, inputs


def _finished_sweep_points(folder, points) -> dict:
    """{(i, j): result} of the points already saved in the checkpoint ``folder`` (unreadable ones are
    left out, so they are computed again)."""
    results = {}
    for i, j in points:
        path = None if folder is None else folder / f"point_{i:04d}_{j:04d}.json"
        if path is not None and path.exists():
            try:
                results[i, j] = json.loads(path.read_text())
            except (OSError, ValueError):
                pass
    return results


def _sweep_on_cluster(client, todo, n_points, sw, lrs, cfg, inputs, key, done, folder):
    """The ``todo`` points as tasks on the cluster, each handed to ``done`` as it completes; raises
    after the others finish when some failed for good."""
    distributed = _distributed()
    data = client.scatter(inputs, broadcast=True) if inputs is not None else None
    futures = [client.submit(_autoinit_point, i, j, sw[i], lrs[j], cfg, data,
                             key=f"meanfield-autoinit-{key}-{i}-{j}", pure=False) for i, j in todo]
    errors = []
    for f in distributed.as_completed(futures):
        try:
            done(f.result())
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
        finally:
            f.release()
    if errors:
        raise RuntimeError(f"{len(errors)} of {n_points} sweep points failed (first: {errors[0]}); "
                           + ("finished points are saved: run again to compute the rest" if folder else
                              "pass checkpoint=FOLDER to keep finished points across reruns"))


def _sweep_arrays(results, sw, lrs, depth, width, steps, loss, seed, seconds) -> AutoInitSweep:
    """The AutoInitSweep of the points' results (NaN where AutoInit diverged)."""
    n_pairs = max((len(r["J_before"]) for r in results.values() if r.get("J_before")), default=depth - 1)
    Jb = np.full((sw.size, lrs.size, n_pairs), np.nan)
    Ja = np.full_like(Jb, np.nan)
    L = np.full((sw.size, lrs.size), np.nan)
    St = np.zeros((sw.size, lrs.size), dtype=int)
    C = np.zeros((sw.size, lrs.size), dtype=bool)
    status = np.empty((sw.size, lrs.size), dtype=object)
    for (i, j), r in results.items():
        if r.get("J_before") is not None:
            Jb[i, j] = r["J_before"]
            Ja[i, j] = [np.nan if v is None else v for v in r["J_after"]]
            L[i, j] = r["loss"]
        St[i, j] = r.get("steps") or 0
        C[i, j] = bool(r.get("converged"))
        status[i, j] = r["status"]
    return AutoInitSweep(sw, lrs, depth, width, steps, loss, seed, Jb, Ja, L, St, C, status, seconds)
