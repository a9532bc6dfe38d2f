"""Shared plumbing of the numeric solvers: arguments, errors, status codes."""
from __future__ import annotations

import numpy as np

from .._validate import check_nonnegative
from ..calculus import as_architecture

__all__ = ["ConvergenceError", "prepare", "require_point", "variances", "raise_for_status", "ST_OK", "ST_INF",
           "ST_MAXITER", "ST_NAN", "ST_CYCLE", "DEFAULT_MAXITER"]

# status codes of meanfield/_kernels.py
ST_OK, ST_INF, ST_MAXITER, ST_NAN, ST_CYCLE = 0, 1, 2, 3, 4
DEFAULT_MAXITER = 100_000


class ConvergenceError(RuntimeError):
    """A numeric solve did not converge; the message says which and where."""


def prepare(arch, kwargs):
    """(Architecture, CompiledRecursion) from an Architecture or architecture keywords."""
    from ..numeric import compiled

    arch = as_architecture(arch, **kwargs)
    return arch, compiled(arch)


def require_point(sigma_w, sigma_b):
    """ValueError naming the missing coordinate: the public API has no default (sigma_w, sigma_b)."""
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if v is None:
            raise ValueError(f"{name} is required: pass sigma_w= and sigma_b= (the weight and bias scales, "
                             "numbers or arrays >= 0); there is no default point")


def variances(sigma_w, sigma_b):
    """Broadcast sigma_w, sigma_b (validated: given, finite, >= 0) to float64 arrays of W, T."""
    if sigma_w is not None:
        check_nonnegative("sigma_w", sigma_w)
    require_point(sigma_w, sigma_b)
    sw = check_nonnegative("sigma_w", sigma_w)
    sb = check_nonnegative("sigma_b", sigma_b)
    sw, sb = np.broadcast_arrays(sw, sb)
    return sw, sb, sw * sw, sb * sb


_WHY = {
    ST_MAXITER: "the iteration cap was reached without convergence",
    ST_NAN: "the recursion produced NaN (a kernel outside the domain of the compiled expressions)",
    ST_CYCLE: "the kernel map overshoots with chi_K < -1 at its fixed point, so the iteration "
              "oscillates and has no limit",
}


def raise_for_status(what, arch, status, sw, sb, errors="raise"):
    """Raise ConvergenceError for the first failed point unless errors == 'nan'."""
    if errors not in ("raise", "nan"):
        raise ValueError(f"errors={errors!r} is not allowed; choose 'raise' or 'nan'")
    bad = np.isin(status, (ST_MAXITER, ST_NAN, ST_CYCLE))
    if errors == "raise" and np.any(bad):
        i = np.flatnonzero(bad.ravel())[0]
        st = int(status.ravel()[i])
        raise ConvergenceError(
            f"{what} for {arch} failed at sigma_w={sw.ravel()[i]:.17g}, sigma_b={sb.ravel()[i]:.17g} "
            f"({int(bad.sum())} of {bad.size} points): {_WHY[st]}. Pass errors='nan' to get NaN there.")
    return bad


def as_output(arr, shape):
    """A float for a 0-d result, else an array of ``shape``."""
    arr = np.asarray(arr, dtype=np.float64).reshape(shape)
    return float(arr) if arr.ndim == 0 else arr
