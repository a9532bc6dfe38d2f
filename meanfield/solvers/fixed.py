r"""Depth profiles, fixed points and the APJN factor at the fixed point.

Conventions: K^1 is the kernel of the first hidden layer's preactivations.
A unit-norm input x (|x|^2 / N_0 = 1) gives K^1 = sigma_w^2 + sigma_b^2, and
two orthogonal unit-norm inputs give K12^1 = sigma_b^2; these are the
defaults for ``K0`` and ``K12_0``. ``chi_J[l]`` is J^{l,l+1}, the factor the
block after layer l contributes, so J^{l0,l} = prod_{l'=l0}^{l-1} chi_J[l'].

A fixed point that does not exist in the direction the map moves (ReLU with
sigma_w^2 > 2, residual mu = 1 without LayerNorm, chaotic unbounded
activations) is reported as K* = inf; chi_J* is then the limit of chi_J^l
as K^l -> inf.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._serialize import Result
from ..calculus import Architecture
from ._common import (DEFAULT_MAXITER, MAX_PROFILE_DEPTH, ST_INF, ST_NAN, ST_OK, ST_UNDEFINED, _expr, as_output,
                      prepare, raise_for_status, variances, warn_if_approximate)
from .._validate import as_float_array, broadcast_named, check_finite_array, check_int, check_nonnegative

__all__ = ["KernelProfile", "KernelOverflowWarning", "kernel_profile", "fixed_point", "chi_J", "chi_K", "FixedPointState",
           "fixed_point_state"]


@dataclass(frozen=True, repr=False)
class KernelProfile(Result):
    """K^l, K12^l and chi_J^l = J^{l,l+1} for l = 1..depth (float64 arrays; layer last).

    One point: ``sigma_w``, ``sigma_b`` floats and arrays of shape (depth,).
    Broadcast over points of shape S: ``sigma_w``, ``sigma_b`` (and ``mu``)
    arrays of shape S, ``K``, ``K12``, ``chi_J`` of shape S + (depth,).
    """

    architecture: Architecture
    sigma_w: float
    sigma_b: float
    layers: np.ndarray      # 1..depth
    K: np.ndarray
    K12: np.ndarray | None  # None unless the architecture needs pairs (or pair=True)
    chi_J: np.ndarray
    #: the residual strengths, when ``mu=`` was an array (shape of sigma_w); else None (arch.mu)
    mu: np.ndarray | None = None

    @property
    def J(self) -> np.ndarray:
        """J^{1,l} = prod_{l' < l} chi_J[..., l'] for l = 1..depth (J^{1,1} = 1; layer last)."""
        out = np.ones_like(self.chi_J)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            np.cumprod(self.chi_J[..., :-1], axis=-1, out=out[..., 1:])
        return out


def _normalises(arch, comp) -> bool:
    """Whether a block divides by a variance of its input (LayerNorm, BatchNorm, the Mixer's LN)."""
    return arch.normalises or comp.pair


def _undefined(arch, comp, K0, Q0, W, T, K0_given, Q_given):
    """Mask of the points where the first block normalises a zero signal (0/0), and why.

    LayerNorm of h with K = 0, or BatchNorm / the Mixer's channel LayerNorm
    with K - K12 = 0 (identical inputs): the infinite-width map has no value
    there (torch's LayerNorm eps turns it into 0, a different network).
    """
    if not _normalises(arch, comp):
        return None, None
    zero = K0 == 0.0
    same = (K0 - Q0 == 0.0) if comp.pair else np.zeros_like(zero)
    bad = zero | same
    if not bad.any():
        return None, None

    def why(i):
        k0, q0, w, t = (float(np.ravel(a)[i]) for a in (K0, Q0, W, T))
        if zero.ravel()[i]:
            if K0_given:
                return (f"K0=0 with {arch}: the first block normalises a zero "
                        "signal, which is 0/0 at infinite width; pass K0 > 0")
            return (f"sigma_w = sigma_b = 0 with {arch}: the first layer's "
                    "output is exactly 0 and its normalisation is 0/0; pass sigma_w > 0 or sigma_b > 0")
        if Q_given:
            return (f"K12_0 = K0 = {k0:g}: the two inputs are identical, so the normalisation over the pair "
                    "(BatchNorm's batch variance K - K12) is 0/0; pass |K12_0| < K0")
        return (f"sigma_w=0 with {arch}: the two inputs give identical "
                "preactivations (K12 = K), so the normalisation over the pair (BatchNorm's batch variance "
                "K - K12) is 0/0; pass sigma_w > 0")
    return bad, why


def _initial(arch, K0, K12_0, W, T):
    if K0 is None:
        K0 = W + T
    else:
        K0, W, T = broadcast_named(K0=check_nonnegative("K0", K0), sigma_w=W, sigma_b=T)
    if K12_0 is None:
        # the first layer's pair covariance: sigma_b^2 for orthogonal inputs,
        # 0 for two channels of a Mixer token (at most K^1, for K0 below it)
        K12_0 = np.minimum(arch.initial_pair_covariance(np.sqrt(W), np.sqrt(T)), K0)
    else:
        K12_0 = check_finite_array("K12_0", K12_0)
    K0, K12_0, W, T = broadcast_named(K0=np.asarray(K0, float), K12_0=np.asarray(K12_0, float),
                                      sigma_w=W, sigma_b=T)
    if np.any(np.abs(K12_0) > K0 * (1 + 1e-12)):
        raise ValueError("K12_0 must satisfy |K12_0| <= K0 (a covariance of two equal-norm inputs)")
    return K0, K12_0, W, T


def _residual_strengths(arch, arch_kwargs):
    """Split an array ``mu=`` off the architecture keywords: (arch, arch_kwargs, mu array or None).

    mu is a runtime argument of the compiled code, so one architecture (built
    with mu = 1) serves every residual strength; the per-point values travel
    as an array. With an Architecture or Network, ``mu=`` overrides its
    residual strength (it must have a skip connection).
    """
    mu = arch_kwargs.get("mu")
    if mu is None or np.ndim(mu) == 0:
        return arch, arch_kwargs, None
    mu = as_float_array("mu", mu)
    if not np.all(np.isfinite(mu) & (mu >= 0) & (mu <= 1)):
        raise ValueError(f"mu must be in [0, 1] (the residual strength; finite), got {arch_kwargs['mu']!r}")
    kw = {k: v for k, v in arch_kwargs.items() if k != "mu"}
    if arch is None:
        return None, dict(kw, mu=1.0), mu
    from ..calculus import as_architecture

    spec = as_architecture(arch, **kw)
    if spec.mu is None:
        raise ValueError(f"mu={arch_kwargs['mu']!r} given, but {spec} has no skip connection (mu is None); "
                         "pass a residual architecture")
    return spec.with_(mu=1.0), {}, mu


def _nonneg_scalar(name, v):
    """float(v) for a finite python/numpy real >= 0, else None (the array validators then say why)."""
    if type(v) is float or type(v) is int or type(v) is np.float64:
        x = float(v)
        if 0.0 <= x < math.inf:
            return x
    return None


def kernel_profile(arch=None, sigma_w=None, sigma_b=None, depth=None, K0=None, K12_0=None,
                   pair=None, **arch_kwargs) -> KernelProfile:
    """Iterate the infinite-width recursions through ``depth`` layers, at one point or many.

    Parameters
    ----------
    arch : Architecture, optional
        Or the architecture keywords (``activation="erf", norm="ln_pre"``...).
    sigma_w, sigma_b : float or array
        Weight and bias scales (>= 0).
    depth : int
        Number of layers l = 1..depth reported, at most 2^24 (three float64
        arrays of that length per point: 400 MB).
    K0 : float or array, optional
        K^1; default sigma_w^2 + sigma_b^2 (a unit-norm input).
    K12_0 : float or array, optional
        K12^1 for the pair state; default ``arch.initial_pair_covariance``:
        sigma_b^2 for two orthogonal unit-norm inputs, 0 for two channels of a
        Mixer token.
    pair : bool, optional
        Also iterate K12 for architectures that do not need it (default: only
        when the architecture needs pairs: BatchNorm and the Mixer).
    mu : float or array (keyword)
        The residual strength; an array broadcasts like the scales (one
        compiled module serves every mu).

    ``sigma_w``, ``sigma_b``, ``K0``, ``K12_0`` and ``mu`` broadcast together
    (numpy rules) into one compiled call; with a broadcast shape S the arrays
    ``K``, ``K12``, ``chi_J`` have shape S + (depth,) (layer last), and
    ``sigma_w``, ``sigma_b`` (and ``mu``) are arrays of shape S. Row by row
    the numbers are exactly those of the one-point call.

    Returns
    -------
    KernelProfile with ``K[..., l-1] = K^l``, ``chi_J[..., l-1] = J^{l,l+1}``
    and ``K12`` (or None), all float64. Where K^l exceeds the float64 range
    (e.g. ReLU at sigma_w = 1e6 after ~25 layers) it is inf, chi_J its
    K -> inf limit, and a :class:`KernelOverflowWarning` says from which
    layer. A normalisation of a zero signal (K0 = 0, or sigma_w = sigma_b =
    0, with LayerNorm; identical inputs with BatchNorm) is a ValueError: the
    map is 0/0 there.
    """
    arch, arch_kwargs, mu_arr = _residual_strengths(arch, arch_kwargs)
    arch, comp = prepare(arch, arch_kwargs)
    if sigma_w is None or sigma_b is None or depth is None:
        raise ValueError("kernel_profile needs sigma_w, sigma_b and depth")
    warn_if_approximate("kernel_profile", arch, sigma_b)
    if not (type(depth) is int and 1 <= depth <= MAX_PROFILE_DEPTH):
        depth = check_int("depth", depth, 1, MAX_PROFILE_DEPTH)
    need_pair = comp.pair if pair is None else (bool(pair) or comp.pair)
    if mu_arr is None and K12_0 is None and not need_pair:
        profile = _profile_at_one_point(arch, comp, sigma_w, sigma_b, K0, depth)
        if profile is not None:
            return profile
    return _profile_on_grid(arch, comp, sigma_w, sigma_b, depth, K0, K12_0, need_pair, mu_arr)


def _profile_at_one_point(arch, comp, sigma_w, sigma_b, K0, depth):
    """kernel_profile at one point from plain floats, no numpy round trips (a few us), the common
    case; None where the arguments are not finite scalars >= 0 or K0 = 0 meets a normalisation
    (the general path, :func:`_profile_on_grid`, then validates them and says why)."""
    sw, sb = _nonneg_scalar("sigma_w", sigma_w), _nonneg_scalar("sigma_b", sigma_b)
    k0 = 0.0 if K0 is None else _nonneg_scalar("K0", K0)
    if sw is None or sb is None or k0 is None or not (sw < 1e154 and sb < 1e154):
        return None
    W, T = sw * sw, sb * sb
    if K0 is None:
        k0 = W + T
    if comp.normalises and k0 == 0.0:  # the 0/0 message of the general path
        return None
    outK, outQ, outX = np.empty(depth), np.empty(depth), np.empty(depth)
    if not comp.fast_call("profile", False, k0, 0.0, W, T, comp.mu, comp.eps, outK, outQ, outX):
        _check_profile(arch, comp, sw, sb, comp.mu, outK, outX)
    return KernelProfile(arch, sw, sb, np.arange(1, depth + 1), outK, None, outX)


def _profile_on_grid(arch, comp, sigma_w, sigma_b, depth, K0, K12_0, need_pair, mu_arr):
    """kernel_profile on the broadcast of (sigma_w, sigma_b, K0, K12_0, mu): one compiled call."""
    sw, sb, W, T = variances(sigma_w, sigma_b)
    K0_given, Q_given = K0 is not None, K12_0 is not None
    K0, Q0, W, T = _initial(arch, K0, K12_0, W, T)
    mu = np.asarray(comp.mu if mu_arr is None else mu_arr, dtype=np.float64)
    K0, Q0, W, T, mu = broadcast_named(K0=K0, K12_0=Q0, sigma_w=W, sigma_b=T, mu=mu)
    shape = W.shape
    bad, why = _undefined(arch, comp, K0, Q0, W, T, K0_given, Q_given)
    if bad is not None:
        raise ValueError(why(int(np.flatnonzero(bad.ravel())[0])))
    flat = [np.ascontiguousarray(a, dtype=np.float64).ravel() for a in (K0, Q0, W, T, mu)]
    if not need_pair:
        flat[1] = np.zeros_like(flat[1])
    n = flat[0].size
    outK, outQ, outX = np.empty((n, depth)), np.empty((n, depth)), np.empty((n, depth))
    if comp.fast_call("profile_many", need_pair, *flat, comp.eps, outK, outQ, outX):
        sw_f = np.broadcast_to(sw, shape).ravel()
        sb_f = np.broadcast_to(sb, shape).ravel()
        for i in np.flatnonzero(~(np.isfinite(outK).all(axis=1) & np.isfinite(outX).all(axis=1))):
            _check_profile(arch, comp, float(sw_f[i]), float(sb_f[i]), float(flat[4][i]), outK[i], outX[i])
    sw_out = np.broadcast_to(sw, shape).astype(np.float64)
    sb_out = np.broadcast_to(sb, shape).astype(np.float64)
    if shape == ():
        sw_out, sb_out = float(sw_out), float(sb_out)
    mu_out = None if mu_arr is None else np.broadcast_to(mu, shape).astype(np.float64)
    return KernelProfile(arch, sw_out, sb_out, np.arange(1, depth + 1), outK.reshape(shape + (depth,)),
                         outQ.reshape(shape + (depth,)) if need_pair else None, outX.reshape(shape + (depth,)),
                         mu_out)


class KernelOverflowWarning(RuntimeWarning):
    """K^l left the float64 range (> 1.8e308) in a depth profile: later layers are inf."""


def _check_profile(arch, comp, sw, sb, mu, K, X):
    """A profile never hides a NaN: overflow of K^l is inf by construction (warned);
    a NaN elsewhere is a ValueError that says where. ``K``, ``X``: one point's rows (edited in place)."""
    bad = ~np.isfinite(K)
    nan_at = np.flatnonzero(np.isnan(X) | np.isnan(K))
    if bad.any() and np.isinf(K[np.flatnonzero(bad)[0]]) and not (nan_at.size and
                                                                  nan_at[0] < np.flatnonzero(bad)[0]):
        f = int(np.flatnonzero(bad)[0])
        import warnings

        warnings.warn(f"kernel_profile: K^l overflows float64 (> 1.8e308) from layer {f + 1} at sigma_w={sw:g}, "
                      f"sigma_b={sb:g}; K is inf there and chi_J its K -> inf limit",
                      KernelOverflowWarning, stacklevel=3)
        # chi_J at K = inf: the limit along the growth, evaluated far along it
        from .. import _fnindex as KN
        from .._fnindex import KINF as _KINF

        out = np.empty(1)
        comp.call("expr_grid", KN.CHI_J, np.array([_KINF]), np.zeros(1), np.array([sw * sw]), np.array([sb * sb]),
                  mu, comp.eps, out)
        if not comp.pair:
            out = _far_limit(comp if mu == comp.mu else comp.with_mu(mu), KN.CHI_J, sw * sw, sb * sb, out)
        X[f:] = float(out[0])
        K[f:] = np.inf
    if np.isnan(X).any() or np.isnan(K).any():
        i = int(np.flatnonzero(np.isnan(X) | np.isnan(K))[0])
        if K[i] == 0.0 and arch.normalises:
            raise ValueError(f"kernel_profile: sigma_w={sw:g}, sigma_b={sb:g} with {arch}: "
                             f"K^{i + 1} = 0 enters a normalisation, which is 0/0; "
                             "pass sigma_b > 0")
        from ._common import ConvergenceError

        raise ConvergenceError(f"kernel_profile: the recursion of {arch} returned NaN at layer {i + 1} for "
                         f"sigma_w={sw:g}, sigma_b={sb:g} (a kernel outside the domain of its expressions)")


@dataclass(frozen=True, repr=False)
class FixedPointState(Result):
    """The fixed point reached from K0 and the factors there (arrays broadcast over the inputs).

    ``K`` is inf where the kernel diverges; ``K12`` is nan for one-input
    states; ``chi_J``, ``chi_K`` are the limits along the divergence there (inf where
    they grow without bound: an activation growing faster than linearly).
    ``status`` holds the kernel codes (0 converged, 1 divergent, 6 undefined:
    a normalisation of a zero signal, others failed; NaN marks every failure).
    """

    architecture: Architecture
    sigma_w: np.ndarray
    sigma_b: np.ndarray
    K: np.ndarray
    K12: np.ndarray
    chi_J: np.ndarray
    chi_K: np.ndarray
    status: np.ndarray

    @property
    def diverges(self) -> np.ndarray:
        return self.status == ST_INF


def _far_limit(comp, which, W, T, at_kinf):
    """The K -> inf limit of expression ``which`` along a divergence, given its value at K = KINF.

    The compiled solvers evaluate chi_J and chi_K "at K = inf" at K = KINF = 1e100,
    which is the limit where the factor settles (ReLU, GELU, tanh: corrections
    O(K^-1/2) = 1e-50). Where it still grows (an activation growing faster than
    linearly, x + x^3/10: E[phi'^2] ~ K^2) the limit is inf, not the value at
    1e100: growth by more than a factor 2 from K = 1e50 says so (a power K^p
    with p > 0.006). One-input states (the pair state's K12 moves with K).
    """
    from .._fnindex import KINF as _KINF

    near = _expr(comp, which, math.sqrt(_KINF), W, T)
    grows = np.isfinite(at_kinf) & (np.abs(at_kinf) > 2.0 * np.abs(near))
    return np.where(grows, np.copysign(np.inf, at_kinf), at_kinf)


def _unbounded_limits(comp, mu_arr, flat, outS, outX, outC):
    """chi_J*, chi_K* = inf (in place) where K^l diverges and they grow without bound (:func:`_far_limit`)."""
    from .. import _fnindex as KN

    div = np.flatnonzero(outS == ST_INF)
    if div.size == 0:
        return
    groups = [(comp, div)] if mu_arr is None else [
        (comp.with_mu(m), div[flat[4][div] == m]) for m in np.unique(flat[4][div])]
    for c, idx in groups:
        W, T = flat[2][idx], flat[3][idx]
        outX[idx] = _far_limit(c, KN.CHI_J, W, T, outX[idx])
        outC[idx] = _far_limit(c, KN.CHI_K, W, T, outC[idx])


def fixed_point_state(arch=None, sigma_w=None, sigma_b=None, K0=None, K12_0=None, maxiter=DEFAULT_MAXITER,
                      errors="raise", **arch_kwargs) -> FixedPointState:
    """Fixed point reached from K0 (default: the unit-norm input), with chi_J*, chi_K* there.

    ``sigma_w``, ``sigma_b``, ``K0``, ``K12_0`` and an array ``mu=`` (the
    residual strength) broadcast together into one compiled call.
    """
    arch, arch_kwargs, mu_arr = _residual_strengths(arch, arch_kwargs)
    arch, comp = prepare(arch, arch_kwargs)
    sw, sb, W, T = variances(sigma_w, sigma_b)
    warn_if_approximate("the fixed point (K*, chi_J*, chi_K*)", arch, sb)
    K0_given, Q_given = K0 is not None, K12_0 is not None
    K0, Q0, W, T = _initial(arch, K0, K12_0, W, T)
    mu = np.asarray(comp.mu if mu_arr is None else mu_arr, dtype=np.float64)
    K0, Q0, W, T, mu = broadcast_named(K0=K0, K12_0=Q0, sigma_w=W, sigma_b=T, mu=mu)
    sw, sb = np.broadcast_to(sw, W.shape), np.broadcast_to(sb, W.shape)
    maxiter = check_int("maxiter", maxiter, 1)
    if errors not in ("raise", "nan"):
        raise ValueError(f"errors={errors!r} is not allowed; choose 'raise' or 'nan'")
    undef, why = _undefined(arch, comp, K0, Q0, W, T, K0_given, Q_given)
    if undef is not None and errors == "raise":
        raise ValueError(why(int(np.flatnonzero(undef.ravel())[0])))
    flat = [np.ascontiguousarray(a, dtype=np.float64).ravel() for a in (K0, Q0, W, T, mu)]
    n = flat[0].size
    outK, outQ, outX, outC = (np.empty(n) for _ in range(4))
    outS = np.empty(n, dtype=np.int64)
    comp.fast_call("fixed_point_many", comp.pair, *flat, comp.eps, int(maxiter), outK, outQ, outS, outX, outC)
    # a fixed point reached whose factors are NaN: 0/0 where K* = 0 enters a normalisation
    # (a ValueError: the map is undefined there); otherwise a failure of the compiled
    # expressions (status NaN: ConvergenceError below, or NaN with errors='nan')
    nanfac = ((outS == ST_OK) | (outS == ST_INF)) & (np.isnan(outX) | np.isnan(outK))
    zero_norm = nanfac & (outK == 0.0) if _normalises(arch, comp) else np.zeros_like(nanfac)
    if undef is not None:
        zero_norm |= undef.ravel()
    if zero_norm.any() and errors == "raise":
        i = int(np.flatnonzero(zero_norm)[0])
        raise ValueError(f"sigma_w={float(sw.ravel()[i]):g}, sigma_b={float(sb.ravel()[i]):g} with "
                         f"{arch}: the kernel reaches K* = 0 and the "
                         "normalisation of that zero signal is 0/0; pass sigma_b > 0")
    outS[nanfac & ~zero_norm] = ST_NAN
    outS[zero_norm] = ST_UNDEFINED
    # chi_K along a divergence where its expression overflows (GELU: inf * 0 at K = 1e100):
    # the secant slope of F there, (F(2K) - F(K)) / K, which is the same limit
    lost = (outS == ST_INF) & np.isnan(outC)
    if lost.any():
        from .. import _fnindex as KN
        from .._fnindex import KINF as _KINF

        for i in np.flatnonzero(lost):  # per point: mu may differ
            c = comp if mu_arr is None else comp.with_mu(float(flat[4][i]))
            F1 = _expr(c, KN.KERNEL, _KINF, flat[2][i], flat[3][i])
            F2 = _expr(c, KN.KERNEL, 2 * _KINF, flat[2][i], flat[3][i])
            outC[i] = float((F2 - F1)[0] / _KINF)
    if not comp.pair:
        _unbounded_limits(comp, mu_arr, flat, outS, outX, outC)
    bad = raise_for_status("fixed_point", arch, outS, sw, sb, errors) | (outS == ST_UNDEFINED)
    for a in (outK, outQ, outX, outC):
        a[bad] = np.nan
    shape = W.shape
    return FixedPointState(arch, sw, sb, outK.reshape(shape), outQ.reshape(shape), outX.reshape(shape),
                           outC.reshape(shape), outS.reshape(shape))


def fixed_point(arch=None, sigma_w=None, sigma_b=None, K0=None, K12_0=None, errors="raise", **arch_kwargs):
    """The kernel fixed point K* reached by iterating from K0 (inf when K^l diverges).

    Broadcasts over ``sigma_w``, ``sigma_b`` and ``K0``; returns a float for
    scalar inputs. ``K0`` defaults to sigma_w^2 + sigma_b^2 (a unit-norm input).
    A fixed point that iteration approaches only algebraically (at a critical
    point, or a half-stable one) is still returned exactly: the solver brackets
    it instead of iterating. Raises :class:`ConvergenceError` where no limit
    exists (an oscillating map) unless ``errors='nan'``.
    """
    st = fixed_point_state(arch, sigma_w, sigma_b, K0, K12_0, errors=errors, **arch_kwargs)
    return as_output(st.K, st.K.shape)


def chi_J(arch=None, sigma_w=None, sigma_b=None, K0=None, K12_0=None, errors="raise", **arch_kwargs):
    """chi_J* = J^{l,l+1} at the fixed point reached from K0 (its limit where K* = inf)."""
    st = fixed_point_state(arch, sigma_w, sigma_b, K0, K12_0, errors=errors, **arch_kwargs)
    return as_output(st.chi_J, st.K.shape)


def chi_K(arch=None, sigma_w=None, sigma_b=None, K0=None, K12_0=None, errors="raise", **arch_kwargs):
    """chi_K* = dK^{l+1}/dK^l at the fixed point reached from K0."""
    st = fixed_point_state(arch, sigma_w, sigma_b, K0, K12_0, errors=errors, **arch_kwargs)
    return as_output(st.chi_K, st.K.shape)
