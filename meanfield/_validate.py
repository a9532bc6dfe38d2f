"""Argument checks shared by the public API.

Every check raises ``ValueError`` whose message names the argument and says
what is allowed, so a user never gets a NaN passed off as a result.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = ["check_choice", "check_nonnegative", "check_positive", "check_finite_array", "check_real",
           "check_int", "broadcast_named", "numeric_value", "as_float_array"]


def check_choice(name: str, value, allowed: Iterable):
    """Return ``value`` if it is one of ``allowed``; else ValueError naming both."""
    allowed = tuple(allowed)
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {shown}")
    return value


def as_float_array(name: str, value) -> np.ndarray:
    # the common case (a python float or a float64 array) costs one isinstance check
    if type(value) is float:
        return np.asarray(value)
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        return value
    try:
        raw = np.asarray(value)
        # bools, strings and complex numbers convert silently (True -> 1.0, '2' -> 2.0,
        # 1j -> 0.0 as an array): refuse them
        if raw.dtype.kind in "bcUSV" or isinstance(value, (bool, np.bool_)):
            raise TypeError
        arr = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number or an array of real numbers, got {value!r}") from None
    return arr


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``int(value)`` for a python or numpy integer (not a bool) in [minimum, maximum].

    The one integer check of the package: depths, widths, counts, seeds. The
    ValueError names the argument and the allowed range (TypeError-like
    inputs, e.g. 2.5 or '3', get the same one-line ValueError).
    """
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if ok:
        v = int(value)
        ok = (minimum is None or v >= minimum) and (maximum is None or v <= maximum)
    if not ok:
        if minimum is not None and maximum is not None:
            rng = f" in [{minimum}, {maximum}]"
        elif minimum is not None:
            rng = f" >= {minimum}"
        elif maximum is not None:
            rng = f" <= {maximum}"
        else:
            rng = ""
        raise ValueError(f"{name} must be an integer{rng}, got {value!r}")
    return v


def broadcast_named(**arrays):
    """``np.broadcast_arrays`` of the keyword arrays; the ValueError names them and their shapes
    (numpy's own message says only 'arg 0', 'arg 1'). The results are contiguous copies, not
    numpy's read-only stride-0 views, which numba would be handed (and warns about)."""
    try:
        return [a.copy() for a in np.broadcast_arrays(*arrays.values())]
    except ValueError:
        shown = ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items())
        raise ValueError(f"shapes do not broadcast together: {shown}") from None


def check_finite_array(name: str, value) -> np.ndarray:
    """float64 array of ``value``; ValueError if any entry is NaN or infinite."""
    arr = as_float_array(name, value)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return arr


def check_nonnegative(name: str, value) -> np.ndarray:
    """float64 array of ``value``; ValueError unless every entry is finite and >= 0."""
    arr = as_float_array(name, value)
    if not np.all(np.isfinite(arr) & (arr >= 0)):
        raise ValueError(f"{name} must be >= 0 (and finite), got {value!r}")
    return arr


def check_positive(name: str, value) -> np.ndarray:
    """float64 array of ``value``; ValueError unless every entry is finite and > 0."""
    arr = as_float_array(name, value)
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ValueError(f"{name} must be > 0 (and finite), got {value!r}")
    return arr


def is_number(value) -> bool:
    """True for a finite real number (not a bool)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def numeric_value(name: str, value):
    """``float(value)`` for a real number (python, numpy scalar or 0-d array, or a
    sympy expression without free symbols); ``None`` for a sympy expression with
    free symbols (symbolic: nothing to check). ValueError for anything else
    (complex numbers, strings, arrays of several values)."""
    import sympy as sp

    if isinstance(value, sp.Basic):
        if value.free_symbols:
            return None
        try:
            return float(value)  # nan, +-inf included (rejected by the range checks)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a real number or a sympy expression, got {value!r}") from None
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        arr = np.asarray(value)
        if arr.ndim != 0 or arr.dtype.kind not in "iuf":
            raise TypeError
        return float(arr)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number or a sympy expression, got {value!r}") from None


def check_real(name: str, value, *, minimum=None, maximum=None, strict: bool = False):
    """``value`` unchanged if it is symbolic, or a finite real number in range.

    The range is [minimum, maximum] ((minimum, maximum] with ``strict``); the
    ValueError names the argument and the allowed values.
    """
    v = numeric_value(name, value)
    if v is None:
        return value
    lo = "" if minimum is None else (f" > {minimum:g}" if strict else f" >= {minimum:g}")
    hi = "" if maximum is None else f" <= {maximum:g}"
    allowed = "a finite real number" + (lo + (" and" if lo and hi else "") + hi if (lo or hi) else "")
    bad = not math.isfinite(v)
    bad |= minimum is not None and (v <= minimum if strict else v < minimum)
    bad |= maximum is not None and v > maximum
    if bad:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value
