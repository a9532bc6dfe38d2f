"""Infinite-width predictions for the Monte-Carlo comparisons.

Uses :func:`meanfield.solvers.kernel_profile` (numba) when it is available
and falls back to iterating :func:`meanfield.recursion` through
:func:`meanfield.symbolic.lambdify`; either way the formulas are the
symbolic layer's, never re-derived here. Conventions as in
``kernel_profile``: K[l-1] = K^l, chi_J[l-1] = J^{l,l+1}, J[l-1] = J^{1,l}.
"""
from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

from .. import symbols as S
from ..calculus import as_architecture
from ..symbolic import lambdify, recursion

__all__ = ["theory_profile"]


@lru_cache(maxsize=64)
def _compiled_fallback(arch):
    rec = recursion(arch)
    rec = rec.subs(arch.parameters())
    args = ["K", "K12", "sigma_w", "sigma_b"]
    return tuple(_numeric(args, e) for e in (rec.kernel, rec.kernel12, rec.chi_J))


def _numeric(args, expr):
    """lambdify, or sympy evalf (mpmath quadrature) where the printer cannot handle an expression."""
    f = lambdify(args, expr)
    syms = [getattr(S, a) for a in args]

    def g(*vals):
        try:
            return f(*vals)
        except NameError:
            return float(expr.subs(dict(zip(syms, vals))).evalf())

    return g


def _fallback(arch, sw, sb, depth, K0, K12_0):
    fK, fQ, fX = _compiled_fallback(arch)
    K = np.empty(depth)
    Q = np.empty(depth)
    X = np.empty(depth)
    k, q = float(K0), float(K12_0)
    with np.errstate(all="ignore"):
        for l in range(depth):
            K[l], Q[l] = k, q
            X[l] = float(fX(k, q, sw, sb))
            k, q = float(fK(k, q, sw, sb)), float(fQ(k, q, sw, sb))
    return K, Q, X


def theory_profile(arch, sigma_w, sigma_b, depth, K0=None, K12_0=None):
    """dict(K, K12, chi_J, J, source) for l = 1..depth (float64 arrays)."""
    arch = as_architecture(arch)
    sw, sb, depth = float(sigma_w), float(sigma_b), int(depth)
    K0 = sw**2 + sb**2 if K0 is None else float(K0)
    K12_0 = float(arch.initial_pair_covariance(sw, sb)) if K12_0 is None else float(K12_0)
    source = "meanfield.solvers.kernel_profile"
    try:
        from ..solvers import kernel_profile

        prof = kernel_profile(arch, sw, sb, depth, K0=K0, K12_0=K12_0, pair=True)
        K, Q, X = np.asarray(prof.K, float), np.asarray(prof.K12, float), np.asarray(prof.chi_J, float)
    except Exception as err:  # solvers missing or failing: iterate the sympy recursion
        if not isinstance(err, ImportError):
            warnings.warn(f"kernel_profile failed ({err!r}); using the sympy recursion", RuntimeWarning)
        source = "meanfield.recursion + lambdify"
        K, Q, X = _fallback(arch, sw, sb, depth, K0, K12_0)
    J = np.ones(depth)
    with np.errstate(all="ignore"):
        J[1:] = np.cumprod(X[:-1])
    return {"K": K, "K12": Q, "chi_J": X, "J": J, "source": source}
