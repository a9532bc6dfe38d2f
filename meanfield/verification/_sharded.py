"""A Monte-Carlo phase diagram as shards on a Dask cluster, and what that needs: the workers'
memory budget, atomic checkpoint files, progress bars.

The design (shards that keep the numbers bit for bit, resume, memory) is described in
:mod:`meanfield.verification.distributed`, which re-exports the public names of this module;
it lives here, below :mod:`.montecarlo`, because ``phase_diagram(..., client=)`` calls it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ._batched import _bytes_per_init, _check_int, _mean_se, _run, resolve_device
from ._results import PhaseDiagramResult

#: bytes per pass on a CPU worker when /proc/meminfo cannot be read
DEFAULT_CPU_BUDGET = 2.0e9
MEMORY_FRACTION = 0.5  # of the free device memory (CUDA) or MemAvailable (CPU)
DEFAULT_SHARDS_PER_BLOCK = 16  # initialisation blocks per point block: load balance and resume granularity


def _distributed():
    try:
        import distributed
    except ImportError:
        raise ImportError("Dask distributed is not installed; pip install 'meanfield[distributed]' "
                          "(dask[distributed])") from None
    return distributed


# ---------------------------------------------------------------------------
# Memory.
# ---------------------------------------------------------------------------
def meminfo_available(path="/proc/meminfo"):
    """MemAvailable in bytes from /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_budget(device=None, fraction: float = MEMORY_FRACTION, worker=None) -> float:
    """Bytes one Monte-Carlo pass may use on this process's device (see the module docstring).

    CUDA: ``fraction`` of ``torch.cuda.mem_get_info`` free memory. CPU:
    ``fraction`` of min(MemAvailable, the Dask worker's memory limit) divided
    by the worker's threads; :data:`DEFAULT_CPU_BUDGET` where neither is known.
    ``worker``: the Dask worker (default: the one running the current task, if any).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    dev = resolve_device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return fraction * free
    limits = [meminfo_available()]
    nthreads = 1
    try:
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
        w = worker
        limits.append(getattr(getattr(w, "memory_manager", None), "memory_limit", None))
        nthreads = max(1, int(getattr(getattr(w, "state", w), "nthreads", 1) or 1))
    except (ImportError, ValueError):  # not inside a Dask worker
        pass
    limits = [x for x in limits if x]
    if not limits:
        return DEFAULT_CPU_BUDGET
    return fraction * min(limits) / nthreads


def _worker_budget(device, dask_worker=None):  # client.run passes the worker as dask_worker
    return memory_budget(device, worker=dask_worker)


def _cluster_budget(client, device) -> float:
    """The smallest :func:`memory_budget` over the client's workers."""
    budgets = client.run(_worker_budget, device)
    if not budgets:
        raise ValueError("the Dask cluster has no workers; start some (or use --scheduler local:N)")
    return float(min(budgets.values()))


# ---------------------------------------------------------------------------
# Checkpoint files.
# ---------------------------------------------------------------------------
def _write_atomic(path: Path, write):
    """Write via a temporary file in the same folder and os.replace: the file is complete or absent."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(path: Path, obj):
    _write_atomic(path, lambda f: f.write(json.dumps(obj, indent=1, allow_nan=False).encode()))


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _bar(total, initial, desc, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="shard" if "case" not in desc else "case")


# ---------------------------------------------------------------------------
# Phase diagrams.
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """Grid points [p0, p1) (row-major over (sigma_w, sigma_b)) times initialisations [i0, i1)."""

    p0: int
    p1: int
    i0: int
    i1: int

    @property
    def name(self) -> str:
        return f"p{self.p0:06d}-{self.p1:06d}_i{self.i0:06d}-{self.i1:06d}"


def plan_shards(n_points: int, n_init: int, point_chunk: int, init_block: int) -> list:
    """Blocks of ``point_chunk`` points times blocks of ``init_block`` initialisations, in order."""
    n_points = _check_int("n_points", n_points, 1)
    n_init = _check_int("n_init", n_init, 1)
    point_chunk = _check_int("point_chunk", point_chunk, 1)
    init_block = _check_int("init_block", init_block, 1)
    return [Shard(p0, min(n_points, p0 + point_chunk), i0, min(n_init, i0 + init_block))
            for p0 in range(0, n_points, point_chunk) for i0 in range(0, n_init, init_block)]


def _phase_shard(arch, sw, sb, shard, depth, width, batch, device, seed, dtype, layer, n_probes, input_dim, tokens,
                 input_correlation):
    """One shard on a worker: per-initialisation J^{layer,layer+1} and K^layer, shape (i1-i0, p1-p0)."""
    dev = resolve_device(device)
    n = shard.i1 - shard.i0
    raw = _run(arch, sw[shard.p0:shard.p1], sb[shard.p0:shard.p1], layer + 1, width, n, batch, dev, seed, dtype,
               n_probes=n_probes, input_dim=input_dim, tokens=tokens, input_correlation=float(input_correlation),
               chi_layers={layer}, track_J=False, track_K={layer}, init_chunk=n, init_offset=shard.i0)
    return {"chi": raw["chi"][:, :, layer - 1], "K": raw["K"][:, :, layer - 1], "device": str(dev)}


def _load_shard(path: Path, shard: Shard):
    try:
        with np.load(path) as z:
            chi, K, dev = z["chi"], z["K"], str(z["device"])
    except Exception:  # unreadable or foreign: recompute it
        return None
    if chi.shape != (shard.i1 - shard.i0, shard.p1 - shard.p0) or K.shape != chi.shape:
        return None
    return {"chi": chi, "K": K, "device": dev}


def phase_diagram_distributed(client, arch, sigma_w, sigma_b, depth, width, n_init, batch, device, seed, dtype, *,
                              layer, n_probes=1, input_dim=None, tokens=None, input_correlation=0.0,
                              point_chunk=None, init_chunk=None, checkpoint=None, progress=False, budget=None,
                              _on_shard=None) -> PhaseDiagramResult:
    """:func:`~meanfield.verification.phase_diagram` with its shards on a Dask cluster.

    Called by ``phase_diagram(..., client=client)`` after its argument checks
    (use that). ``init_chunk`` fixes the initialisations per shard (default:
    n_init / 16, fewer if memory requires); ``point_chunk`` the points per
    shard (default: the whole grid when it fits); ``checkpoint`` a folder
    for resumable runs; ``budget`` overrides the per-worker memory budget
    (bytes). Results are bit-identical to the single-process run (module
    docstring).
    """
    distributed = _distributed()
    sw_axis, sb_axis = np.asarray(sigma_w, dtype=np.float64), np.asarray(sigma_b, dtype=np.float64)
    SW, SB = np.meshgrid(sw_axis, sb_axis, indexing="ij")
    sw_flat, sb_flat = SW.ravel(), SB.ravel()
    Ptot = sw_flat.size
    dtype_name = str(dtype).replace("torch.", "")
    problem = {"kind": "phase_diagram", "architecture": str(arch), "sigma_w": sw_axis.tolist(),
               "sigma_b": sb_axis.tolist(), "depth": depth, "width": width, "n_init": n_init, "batch": batch,
               "device": None if device is None else str(device), "seed": seed, "dtype": dtype_name,
               "layer": layer, "n_probes": n_probes, "input_dim": input_dim, "tokens": tokens,
               "input_correlation": float(input_correlation)}
    key = _digest(problem)
    folder = None if checkpoint is None else Path(checkpoint)
    layout = _shard_layout(client, folder, key, problem, arch, Ptot, n_init, batch, width, tokens, n_probes, dtype,
                           device, point_chunk, init_chunk, budget)
    shards = plan_shards(Ptot, n_init, layout["point_chunk"], layout["init_chunk"])
    chi = np.full((n_init, Ptot), np.nan)
    Kl = np.full((n_init, Ptot), np.nan)
    devices = set()

    def place(shard, res):
        chi[shard.i0:shard.i1, shard.p0:shard.p1] = res["chi"]
        Kl[shard.i0:shard.i1, shard.p0:shard.p1] = res["K"]
        devices.add(res["device"])

    missing = []
    for s in shards:
        res = _load_shard(folder / "shards" / f"{s.name}.npz", s) if folder is not None else None
        if res is None:
            missing.append(s)
        else:
            place(s, res)
    t0 = time.perf_counter()
    errors = _compute_missing_shards(distributed, client, missing, len(shards), place, folder, key, arch, sw_flat,
                                     sb_flat, depth, width, batch, device, seed, dtype, layer, n_probes, input_dim,
                                     tokens, input_correlation, progress, _on_shard)
    if errors:
        where = f"; the finished ones are saved in {str(folder)!r}: run again to compute only the missing ones" \
            if folder is not None else "; pass checkpoint=FOLDER to keep finished shards across reruns"
        raise RuntimeError(f"{len(errors)} of {len(shards)} shards failed (first: {errors[0]})" + where)
    seconds = time.perf_counter() - t0
    m, se = _mean_se(chi)  # the same reduction, over the same (n_init, P) array, as the single-process run
    shape = SW.shape
    dev = ",".join(sorted(devices)) if devices else str(resolve_device(device))
    return PhaseDiagramResult(arch, sw_axis, sb_axis, depth, width, n_init, layer, m.reshape(shape),
                              se.reshape(shape), Kl.mean(0).reshape(shape), dev, dtype_name, seed, seconds)


def _shard_layout(client, folder, key, problem, arch, Ptot, n_init, batch, width, tokens, n_probes, dtype, device,
                  point_chunk, init_chunk, budget) -> dict:
    """{"point_chunk", "init_chunk"}: read from the checkpoint's manifest when it holds this problem
    (``key``), else sized by the smallest worker's memory budget and recorded there; never a function
    of the number of workers (see :mod:`.distributed`)."""
    layout = None
    if folder is not None:
        (folder / "shards").mkdir(parents=True, exist_ok=True)
        try:
            old = json.loads((folder / "manifest.json").read_text())
            if old.get("hash") == key:
                layout = old["layout"]
            else:
                raise ValueError(f"checkpoint={str(folder)!r} holds a different phase diagram; use another "
                                 "folder (or delete it)")
        except (OSError, KeyError, json.JSONDecodeError):
            layout = None
    if layout is None:
        T = (tokens or width) if arch.has_tokens else 1

        def need(P):  # bytes of one initialisation over P points (the single-process run's estimate)
            return _bytes_per_init(P, batch, T, width, n_probes, False, True, dtype)

        budget = _cluster_budget(client, device) if budget is None else float(budget)
        if point_chunk is None:
            point_chunk = Ptot
            if need(Ptot) > budget:
                per_point = need(1) - need(0)
                point_chunk = int(max(1, min(Ptot, (budget - need(0)) // per_point)))
                warnings.warn(f"one initialisation of the whole {Ptot}-point grid needs {need(Ptot) / 1e9:.3g} GB, "
                              f"more than a worker's budget ({budget / 1e9:.3g} GB): shards of {point_chunk} points; "
                              f"the result is bit-identical to phase_diagram(..., point_chunk={point_chunk})",
                              RuntimeWarning, stacklevel=4)
        point_chunk = min(_check_int("point_chunk", point_chunk, 1), Ptot)
        if init_chunk is None:
            fit = int(max(1, budget // need(point_chunk)))
            init_chunk = max(1, min(fit, math.ceil(n_init / DEFAULT_SHARDS_PER_BLOCK)))
        init_chunk = min(_check_int("init_chunk", init_chunk, 1), n_init)
        layout = {"point_chunk": point_chunk, "init_chunk": init_chunk}
        if folder is not None:
            _write_json(folder / "manifest.json", {"hash": key, "problem": problem, "layout": layout})
    return layout


def _compute_missing_shards(distributed, client, missing, n_shards, place, folder, key, arch, sw_flat, sb_flat,
                            depth, width, batch, device, seed, dtype, layer, n_probes, input_dim, tokens,
                            input_correlation, progress, on_shard) -> list:
    """Submit the ``missing`` shards, save each (in ``folder``, when given) and ``place`` it as it
    completes; returns the errors of the tasks that failed for good (one line each)."""
    futures = {}
    for s in missing:
        f = client.submit(_phase_shard, arch, sw_flat, sb_flat, s, depth, width, batch, device, seed, dtype, layer,
                          n_probes, input_dim, tokens, input_correlation, key=f"meanfield-pd-{key}-{s.name}",
                          pure=False)
        futures[f] = s
    bar = _bar(n_shards, n_shards - len(missing), "phase diagram", progress)
    errors = []
    for f in distributed.as_completed(list(futures)):
        s = futures[f]
        try:
            res = f.result()
        except Exception as err:  # a task that failed for good (e.g. its workers kept dying)
            errors.append(f"{s.name}: {type(err).__name__}: {err}")
            continue
        finally:
            f.release()
        if folder is not None:
            _write_atomic(folder / "shards" / f"{s.name}.npz",
                          lambda fh: np.savez(fh, chi=res["chi"], K=res["K"], device=res["device"]))
        place(s, res)
        if on_shard is not None:
            on_shard(s)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return errors
