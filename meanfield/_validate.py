"""Argument checks shared by the public API.

Every check raises ``ValueError`` whose message names the argument and says
what is allowed, so a user never gets a NaN passed off as a result.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = ["check_choice", "check_nonnegative", "check_positive", "check_finite_array"]


def check_choice(name: str, value, allowed: Iterable):
    """Return ``value`` if it is one of ``allowed``; else ValueError naming both."""
    allowed = tuple(allowed)
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {shown}")
    return value


def _as_float_array(name: str, value) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number or an array of real numbers, got {value!r}") from None
    return arr


def check_finite_array(name: str, value) -> np.ndarray:
    """float64 array of ``value``; ValueError if any entry is NaN or infinite."""
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return arr


def check_nonnegative(name: str, value) -> np.ndarray:
    """float64 array of ``value``; ValueError unless every entry is finite and >= 0."""
    arr = check_finite_array(name, value)
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0 (and finite), got {value!r}")
    return arr


def check_positive(name: str, value) -> np.ndarray:
    """float64 array of ``value``; ValueError unless every entry is finite and > 0."""
    arr = check_finite_array(name, value)
    if np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0 (and finite), got {value!r}")
    return arr


def is_number(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
