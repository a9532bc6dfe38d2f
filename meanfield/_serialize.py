"""Turn results (frozen dataclasses, numpy arrays, sympy numbers) into JSON-ready data.

JSON has no NaN or infinity: ``nan`` becomes ``null`` and ``inf`` becomes the
strings ``"inf"`` / ``"-inf"``, so the output is strict JSON that any parser
reads.
"""
from __future__ import annotations

import dataclasses
import math
from enum import Enum

import numpy as np

__all__ = ["to_jsonable"]


def _float(v: float):
    if math.isnan(v):
        return None
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def to_jsonable(obj):
    """Recursively convert ``obj`` into dicts, lists, strings, numbers and None."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _float(float(obj))
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()] if obj.ndim else to_jsonable(obj.item())
    if hasattr(obj, "to_dict") and not isinstance(obj, type):  # e.g. Architecture: its spec, not its internals
        return to_jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    try:  # sympy numbers and anything else float() understands
        return _float(float(obj))
    except (TypeError, ValueError):
        return str(obj)
