"""The suite's checkpoint files: one JSON result per case (``out_dir/cases/<id>.json``), written
atomically, valid for a rerun while the case, device and dtype hash the same; shared by the
single-machine suite (:mod:`.suite`) and the cluster run (:func:`.distributed.run_cases`)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np

#: part of every case's hash: bump it when a kind's result changes meaning, and older checkpoints are rerun
SUITE_VERSION = 2


def _case_hash(case, device, dtype) -> str:
    blob = json.dumps({"case": case, "device": str(device), "dtype": str(dtype), "v": SUITE_VERSION},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _write_json_atomic(path: Path, obj):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False, default=_json_default))
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, (np.floating,)):
        return None if not np.isfinite(o) else float(o)
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return _jl(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _jl(a):
    a = np.asarray(a, dtype=float)
    if a.ndim == 0:
        return None if not np.isfinite(a) else float(a)
    return [_jl(v) for v in a]


def _sanitize(obj):
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitize(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.floating, np.integer, np.bool_, np.ndarray)):
        return _json_default(obj)
    return obj


_STATUSES = ("pass", "fail", "xfail", "xpass", "error")


def _read_checkpoint(ckpt: Path, case_id: str, h: str):
    """A finished result from ``ckpt`` if it is usable for this case (same hash), else None.

    A checkpoint of an older case definition is silently rerun; one that is
    unreadable or not a result (truncated JSON, ``null``, a list, a dict
    without a known ``status``, a folder) is rerun with a warning.
    """
    if not ckpt.exists() and not ckpt.is_symlink():
        return None
    if ckpt.is_dir():
        warnings.warn(f"checkpoint {ckpt} is a folder, not a file; recomputing case {case_id!r}",
                      RuntimeWarning, stacklevel=3)
        return None
    try:
        old = json.loads(ckpt.read_text())
    except (OSError, ValueError) as err:
        warnings.warn(f"checkpoint {ckpt} is unreadable ({type(err).__name__}); recomputing case {case_id!r}",
                      RuntimeWarning, stacklevel=3)
        return None
    if not (isinstance(old, dict) and old.get("status") in _STATUSES and old.get("id") == case_id
            and isinstance(old.get("details", []), list) and isinstance(old.get("data", {}), dict)):
        warnings.warn(f"checkpoint {ckpt} does not hold a result of case {case_id!r}; recomputing it",
                      RuntimeWarning, stacklevel=3)
        return None
    if old.get("hash") != h or old["status"] == "error":
        return None
    old["resumed"] = True
    return old


def _move_aside(ckpt: Path) -> Path:
    """Rename whatever blocks the checkpoint path (a folder) to ``<name>.broken[-n]``; nothing is deleted."""
    n = 0
    while True:
        dest = ckpt.with_name(ckpt.name + (".broken" if n == 0 else f".broken-{n}"))
        if not dest.exists() and not dest.is_symlink():
            break
        n += 1
    os.replace(ckpt, dest)
    return ckpt
