"""Shared plumbing of the numeric solvers: arguments, errors, status codes."""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .._validate import broadcast_named, check_nonnegative
from ..calculus import as_architecture

__all__ = ["ConvergenceError", "ApproximationWarning", "warn_if_approximate", "prepare", "require_point", "variances", "raise_for_status", "ST_OK", "ST_INF",
           "ST_MAXITER", "ST_NAN", "ST_CYCLE", "ST_UNDEFINED", "DEFAULT_MAXITER", "MAX_PROFILE_DEPTH",
           "MAX_EXPONENT_DEPTH", "require_computable", "uses_quadrature"]

# status codes of meanfield/_kernels.py
ST_OK, ST_INF, ST_MAXITER, ST_NAN, ST_CYCLE = 0, 1, 2, 3, 4
# python-level only: the recursion is 0/0 there (a normalisation of a zero signal,
# BatchNorm of identical inputs); the ValueError / FixedPointState.status says why
ST_UNDEFINED = 6
DEFAULT_MAXITER = 100_000
# Depth limits (documented at kernel_profile and exponents): a profile stores
# three float64 arrays of its depth (2^24 layers: 400 MB); an exponent fit
# stores ~800 samples but iterates every layer (2^27 layers: seconds for
# closed-form activations, many minutes for quadrature ones)
MAX_PROFILE_DEPTH = 2 ** 24
MAX_EXPONENT_DEPTH = 2 ** 27


class ConvergenceError(RuntimeError):
    """A numeric solve did not converge; the message says which and where."""


class ApproximationWarning(UserWarning):
    """The result is the package's recursion at a point where that recursion is not the exact
    infinite-width limit of the network (the MLP-Mixer with a bias or a non-odd activation)."""


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside the package (so a warning points at the user's line)."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("meanfield"):
        frame, level = frame.f_back, level + 1
    return level


def warn_if_approximate(what, arch, sigma_b=None):
    """ApproximationWarning where ``arch`` is a Mixer block whose recursion is approximate at ``sigma_b``.

    The pair-of-channels recursion of the Mixer is the tokens, channels -> infinity limit only for
    sigma_b = 0, an odd activation and uncorrelated input tokens
    (:meth:`~meanfield.Architecture.mixer_limit_is_exact`); elsewhere each channel keeps a part common to
    all tokens that its state drops. ``sigma_b``: the bias scales of the call (None for a scan over
    sigma_b >= 0, which is exact at most at its sigma_b = 0 points).
    """
    if getattr(arch, "pair_axis", None) != "channels":
        return
    import warnings

    if not arch.mixer_limit_is_exact(0.0):
        where = "at every sigma_b (its activation is not odd)"
    elif sigma_b is None:
        where = "wherever the scan has sigma_b > 0"
    else:
        exact = np.asarray(arch.mixer_limit_is_exact(sigma_b))
        if exact.all():
            return
        where = (f"at {int((~exact).sum())} of the {exact.size} sigma_b values asked for" if exact.size > 1
                 else f"at sigma_b = {float(np.ravel(sigma_b)[0]):g}")
    warnings.warn(
        f"{what}: {arch} is an MLP-Mixer block; its recursion is the exact infinite-width limit only at "
        f"sigma_b = 0 with an odd activation and uncorrelated input tokens (Architecture.mixer_limit_is_exact), "
        f"and it is an approximation here, {where}: each channel keeps a part common to all tokens that the "
        f"recursion drops (GELU, sigma_b = 0.2, mu = 0.5: chi_J 1.261 against 1.337 +- 0.003 from Monte Carlo "
        f"at 512 channels x 512 tokens; docs/theory.md, 'MLP-Mixer')",
        ApproximationWarning, stacklevel=_caller_stacklevel())


def prepare(arch, kwargs):
    """(Architecture, CompiledRecursion) from an Architecture or architecture keywords.

    Both are cached: keyword architectures by their (hashable) keywords, so a
    loop of ``kernel_profile(activation="erf", ...)`` builds the Architecture
    and looks up its compiled code once.
    """
    global _LAST
    if arch is None and kwargs:
        try:
            return _prepared(tuple(sorted(kwargs.items())))
        except TypeError:  # an unhashable keyword value (a list): no caching
            pass
    elif not kwargs and arch is not None and arch is _LAST[0]:
        return _LAST[1]  # the same object as last time (a loop over points): no hashing
    out = _prepare(as_architecture(arch, **kwargs))
    if not kwargs and arch is out[0]:
        _LAST = (arch, out)
    return out


_LAST = (None, None)


def _prepare(arch):
    from ..numeric import compiled

    return arch, compiled(arch)


@lru_cache(maxsize=256)
def _prepared(items):
    return _prepare(as_architecture(None, **dict(items)))


def require_point(sigma_w, sigma_b):
    """ValueError naming the missing coordinate: the public API has no default (sigma_w, sigma_b)."""
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if v is None:
            raise ValueError(f"{name} is required: pass sigma_w= and sigma_b= (the weight and bias scales, "
                             "numbers or arrays >= 0); there is no default point")


def variances(sigma_w, sigma_b):
    """Broadcast sigma_w, sigma_b (validated: given, finite, >= 0) to float64 arrays of W, T."""
    # sigma_w is checked before a missing sigma_b is reported, so a bad sigma_w is named first
    sw = None if sigma_w is None else check_nonnegative("sigma_w", sigma_w)
    require_point(sigma_w, sigma_b)
    sb = check_nonnegative("sigma_b", sigma_b)
    sw, sb = broadcast_named(sigma_w=sw, sigma_b=sb)
    with np.errstate(over="ignore"):
        W, T = sw * sw, sb * sb
    for name, v, sq in (("sigma_w", sw, W), ("sigma_b", sb, T)):
        if np.isinf(sq).any():
            raise ValueError(f"{name} must be below 1e154 (its square must be a float64), got {np.max(v):g}")
    return sw, sb, W, T


_WHY = {
    ST_MAXITER: "the iteration cap was reached without convergence",
    ST_NAN: "the recursion produced NaN (a kernel outside the domain of the compiled expressions, "
            "or a Gaussian quadrature that did not reach its accuracy there)",
    ST_UNDEFINED: "the recursion is 0/0 there (a normalisation of a zero signal)",
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


#: K per decade at which :func:`require_computable` probes the recursion before a scan over K*
PROBE_PER_DECADE = 4


def uses_quadrature(arch) -> bool:
    """Whether the recursion of ``arch`` holds a Gaussian expectation without a closed form
    (each mpmath evaluation of it is then a quadrature, ~1 s per point)."""
    from ..gaussian import GaussianExpectation, GaussianExpectation2
    from ..symbolic import recursion

    rec = recursion(arch)
    return any(e.has(GaussianExpectation, GaussianExpectation2) for e in (rec.kernel, rec.chi_J))


def require_computable(what, arch, comp, K_lo, K_hi, hint="", Ks=None):
    """ConvergenceError before a scan over K* in [K_lo, K_hi] where the recursion cannot be evaluated.

    Only recursions with a quadrature are probed (closed forms are finite where defined): F, chi_J
    and chi_K at (sigma_w, sigma_b) = (1, 0.5), at :data:`PROBE_PER_DECADE` K per decade from K_lo
    up (or at the sorted ``Ks`` given), stopping at the first that is not finite
    (``_kernels.first_uncomputable``). The expectations depend on K only, so a K where they fail
    fails at every (sigma_w, sigma_b) the scan visits.
    """
    if not uses_quadrature(arch):
        return
    if Ks is None:
        n = max(2, int(math.ceil(PROBE_PER_DECADE * math.log10(K_hi / K_lo))) + 1)
        Ks = np.logspace(math.log10(K_lo), math.log10(K_hi), n)
    Ks = np.ascontiguousarray(Ks, dtype=np.float64)
    i = comp.call("first_uncomputable", Ks, 1.0, 0.25, comp.mu, comp.eps)
    if i >= 0:
        raise ConvergenceError(
            f"{what} for {arch} needs the recursion at K* up to {K_hi:.3g}, but it cannot be evaluated at "
            f"K = {Ks[i]:.3g}: a Gaussian expectation of the activation did not converge there (the quadrature "
            f"halves its step at most 10 times; an integrand that oscillates in h, such as sin(sqrt(K) z), is "
            f"not resolved at large K).{(' ' + hint) if hint else ''}")


def as_output(arr, shape):
    """A float for a 0-d result, else an array of ``shape``."""
    arr = np.asarray(arr, dtype=np.float64).reshape(shape)
    return float(arr) if arr.ndim == 0 else arr


def _expr(comp, which, K, W, T, Q=None):
    """One compiled expression over flat arrays (NaN where W is NaN)."""
    K, W, T = (np.ascontiguousarray(np.broadcast_to(a, np.broadcast(K, W, T).shape), dtype=np.float64).ravel()
               for a in (K, W, T))
    Q = np.zeros_like(K) if Q is None else np.ascontiguousarray(np.broadcast_to(Q, K.shape), dtype=np.float64)
    out = np.empty(K.size)
    comp.call("expr_grid", which, K, Q, W, T, comp.mu, comp.eps, out)
    out[~np.isfinite(W)] = np.nan
    return out
