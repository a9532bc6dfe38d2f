"""Overflow-free forms of sympy expressions for float64 evaluation.

The one rewrite every code generator of the package applies before printing an
expression (the numba and numpy modules of :mod:`meanfield.numeric`, the numpy
functions of :func:`meanfield.gaussian.numpy_function`): softplus for
log(1 + exp(a)), merged exponentials, expm1 and log1p where the plain forms lose
every digit.
"""
from __future__ import annotations

import numpy as np
import sympy as sp
from sympy.codegen.cfunctions import expm1 as _expm1, log1p as _log1p

__all__ = ["softplus", "softplus_numpy", "stable_form", "to_expm1_log1p"]


def softplus_numpy(a):
    """log(1 + exp(a)) on float64 arrays without overflow: max(a, 0) + log1p(exp(-|a|))."""
    return np.maximum(a, 0.0) + np.log1p(np.exp(-np.abs(a)))


#: log(1 + exp(a)) without overflow: printed as ``_softplus`` (numba) or ``_softplus_np`` (numpy) by the
#: code generators, :func:`softplus_numpy` here
softplus = sp.Function("_softplus")


def stable_form(expr):
    """Rewrite ``expr`` so that float64 evaluation does not overflow where the value is finite.

    log(1 + exp(a)) becomes the softplus helper, (1 + exp(a))^n becomes
    exp(n softplus(a)), and products of exponentials are merged into one,
    so softplus, SiLU and their derivatives stay finite at |h| ~ 1e3 - 1e4,
    where large K puts the quadrature nodes (the numpy path recomputes such
    values with mpmath instead; see meanfield.gaussian.numpy_function).
    Then c exp(a) - c becomes c expm1(a) and log(1 + a) log1p(a), so that
    ELU-like activations keep their digits at |h| ~ 1e-8, where small K puts
    the nodes.
    """
    def one_plus_exp(e):
        if isinstance(e, sp.Add) and len(e.args) == 2 and sp.S.One in e.args:
            other = e.args[0] if e.args[1] == 1 else e.args[1]
            if isinstance(other, sp.exp):
                return other.args[0]
        return None

    def rule(e):
        if isinstance(e, sp.log):
            a = one_plus_exp(e.args[0])
            if a is not None:
                return softplus(a)
        if isinstance(e, sp.Pow):
            a = one_plus_exp(e.base)
            if a is not None:
                return sp.exp(e.exp * softplus(a))
        return e

    if not expr.has(sp.exp, sp.log):
        return expr
    out = expr.replace(lambda e: isinstance(e, (sp.log, sp.Pow)), rule)
    # deep: the exponentials to merge may sit inside a power, e.g. (x exp(-x) exp(-2 softplus(-x)) + ...)^2
    # in SiLU's phi'^2, where inf * 0 = NaN at x = -800 otherwise
    out = sp.powsimp(out, combine="exp", deep=True)
    # exp(a) - 1 (ELU, SELU) as expm1(a) and log(1 + a) as log1p(a): the plain forms lose every digit
    # of a at |a| ~ 1e-16, where small K puts the nodes (ELU's Gram diagonal was 2.6e-10 off at K = 1e-7).
    # Node by node: sympy's codegen optimize() refactors the whole tree, and it split the merged
    # exponentials of SiLU's derivative again (exp(800) * exp(-800) = inf * 0).
    return out.replace(lambda e: isinstance(e, (sp.Add, sp.log)), to_expm1_log1p)


def to_expm1_log1p(e):
    """c exp(a) - c + rest -> c expm1(a) + rest; log(1 + a) -> log1p(a); anything else unchanged."""
    if isinstance(e, sp.log):
        const, rest = e.args[0].as_coeff_Add()
        return _log1p(rest) if const == 1 and rest != 0 else e
    const, rest = e.as_coeff_Add()
    if const == 0:
        return e
    for term in sp.Add.make_args(rest):
        c, m = term.as_coeff_Mul()
        if isinstance(m, sp.exp) and c == -const:
            return c * _expm1(m.args[0]) + (rest - term)
    return e
