r"""Critical exponents: how K^l and J^{l0,l} approach their limits with depth.

Conventions (partial-Jacobian paper, eq. 18 and appendix G):
dK^l = K^l - K* ~ l^(-zeta_K) and J^{l0,l} ~ l^(-zeta) at large l. Negative
exponents mean growth.

Every exponent is obtained two ways, and :class:`Exponents` keeps both:

* **analytic**, from the expansion of the recursions about the fixed point
  (appendix G): with dK^{l+1} = dK - c_n dK^n + ... (c_n the first non-zero
  coefficient) and chi_J = 1 - d_1 dK + ..., zeta_K = 1/(n - 1) and, for
  n = 2, zeta = d_1 / c_2; for K^l -> inf, from the asymptotics of the
  recursions at large K: K^{l+1} - K^l -> a and chi_J - 1 ~ b K^-p, so
  chi_J^l - 1 ~ b (a l)^-p; p = 1 gives J ~ l^(b/a) (zeta = -b/a) and p = 1/2
  the stretched exponential of Theorem 4.3, log J ~ 2 c~ sqrt(l) with
  c~ = b / sqrt(a), J = O(exp(sqrt(l / lambda))), lambda = 1 / (4 c~^2);
* **numeric**, by iterating the compiled recursion to 2^20 layers or more
  (2^23 at critical points, where corrections decay only like log(l)/l) and
  fitting the local exponent -l log chi_J^l (or log J for stretched
  exponentials) with its leading corrections.

At a half-stable fixed point the iteration starts on the side from which it
converges (e.g. above K* = (3 + sqrt 17)/2 at the GELU point (1.408, 0.416),
where c_2 > 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .._serialize import Result
from ..calculus import Architecture
from .. import _fnindex as KN
from .._validate import check_int, check_nonnegative, check_real
from ._common import (MAX_EXPONENT_DEPTH, ST_INF, ST_OK, _expr, prepare, require_computable, uses_quadrature,
                      variances, warn_if_approximate)
from ._expansion import _derivatives, _polish_critical, _series
from .fixed import fixed_point_state
from .lines import _xi, fixed_points

__all__ = ["Exponents", "exponents"]

_TOL = 1e-9


@dataclass(frozen=True, repr=False)
class Exponents(Result):
    """Depth exponents at (sigma_w, sigma_b), analytic and numeric.

    ``regime`` is one of 'critical point', 'critical line', 'ordered',
    'chaotic', 'marginal', 'power-law growth' (K^l -> inf, chi_J - 1 ~ 1/l),
    'stretched exponential' (K^l -> inf, chi_J - 1 ~ l^-p, p < 1),
    'exponential growth' (K^l -> inf, chi_J* != 1).
    Exponents that do not exist in a regime are NaN (``xi``, the correlation
    length 1/|log chi_J*|, describes exponential ones). ``agree`` compares
    the analytic and numeric values (1e-3 relative for zeta_K and zeta, 1%
    for c_tilde).
    """

    architecture: Architecture
    sigma_w: float
    sigma_b: float
    regime: str
    K_star: float
    chi_J: float
    chi_K: float
    zeta_K: float
    zeta: float
    zeta_K_numeric: float
    zeta_numeric: float
    c_tilde: float = np.nan
    c_tilde_numeric: float = np.nan
    lambda_: float = np.nan
    p: float = np.nan
    growth_rate: float = np.nan
    c2: float = np.nan
    d1: float = np.nan
    xi: float = np.nan
    depth: int = 0
    K0: float = np.nan
    note: str = ""

    _repr_skip_nan = True   # exponents that do not exist in this regime are NaN

    @property
    def agree(self) -> bool:
        pairs = [(self.zeta_K, self.zeta_K_numeric, 1e-3), (self.zeta, self.zeta_numeric, 1e-3),
                 (self.c_tilde, self.c_tilde_numeric, 1e-2)]
        for a, n, tol in pairs:
            if np.isfinite(a) or np.isfinite(n):
                if not (np.isfinite(a) and np.isfinite(n)):
                    return False
                if abs(a - n) > tol * max(abs(a), 1e-3 if a == 0 else 0.0):
                    return False
        return True


def _samples(comp, K0, Q0, W, T, L, n=800):
    layers = np.unique(np.round(np.logspace(0, np.log10(L), n)).astype(np.int64))
    oK, oL, oX = (np.empty(layers.size) for _ in range(3))
    comp.call("depth_samples", K0, Q0, W, T, comp.mu, comp.eps, layers, oK, oL, oX)
    return layers.astype(float), oK, oL, oX


def _fit_const(x, y, basis):
    A = np.column_stack([np.broadcast_to(b, x.shape) for b in basis])
    with np.errstate(all="ignore"):
        coef = np.linalg.lstsq(A, y, rcond=None)[0]
    return float(coef[0])


def _local_fit(l, s, lo_frac=1e-2):
    """Limit of s(l) = c + (a log l + b)/l + O(log^2 l / l^2) fitted over the last two decades."""
    sel = (l >= l[-1] * lo_frac) & np.isfinite(s)
    x, y = l[sel], s[sel]
    g = np.log(x)
    return _fit_const(x, y, [1.0, g / x, 1.0 / x, g * g / x ** 2, g / x ** 2, 1.0 / x ** 2])


def _asymptotic_analytic(arch, sw, sb):
    """(a, b, p) of K' - K -> a, chi_J - 1 ~ b K^-p, evaluated from the recursions at large K (mpmath)."""
    import mpmath as mp

    fs = _derivatives(arch, 0)
    F, X = fs["F"][0], fs["X"][0]
    with mp.workdps(60):
        args = (mp.mpf(sw), mp.mpf(sb), mp.mpf(arch.mu or 0), mp.mpf(arch.eps or 0))
        K1, K2 = mp.mpf(10) ** 36, mp.mpf(10) ** 40
        a = F(K2, *args) - K2
        x1, x2 = X(K1, *args) - 1, X(K2, *args) - 1
        if not (x1 > 0 and x2 > 0):
            return float(a), np.nan, np.nan
        p_raw = -mp.log(x2 / x1) / mp.log(K2 / K1)
        p = Fraction(float(p_raw)).limit_denominator(8)
        if abs(float(p) - float(p_raw)) > 1e-3:
            return float(a), np.nan, float(p_raw)
        b = x2 * K2 ** (mp.mpf(p.numerator) / p.denominator)
        return float(a), float(b), float(p)


def _asymptotic_analytic_pair(comp, W, T):
    """(a, b, p) for pair states, whose chi_J depends on D = K - K12.

    Along the growth D_{l+1} - D_l -> a, with chi_J - 1 ~ b D^-p: the same
    analysis as for one-input states, with the compiled expressions
    evaluated far along the growth (D ~ 1e3 and 1e5, K12 = 0; exact for the
    large-batch BatchNorm blocks, whose maps are affine in the state).
    """
    from .. import _fnindex as KN

    def at(which, D):
        return float(_expr(comp, which, D, W, T, Q=0.0)[0])

    D1, D2 = 1e3, 1e5
    a = (at(KN.KERNEL, D2) - D2) - (at(KN.KERNEL12, D2) - 0.0)
    x1, x2 = at(KN.CHI_J, D1) - 1.0, at(KN.CHI_J, D2) - 1.0
    if not (x1 > 0 and x2 > 0):
        return a, np.nan, np.nan
    p_raw = -np.log(x2 / x1) / np.log(D2 / D1)
    p = float(Fraction(p_raw).limit_denominator(8))
    if abs(p - p_raw) > 1e-6:
        return a, np.nan, p_raw
    return a, x2 * D2 ** p, p


#: relative distance in (sigma_w, sigma_b) within which a point counts as the
#: critical point it is next to (exponents(critical_tol=...)); at 1e-10 the
#: network passes the vanished (or split) tangent fixed point only after
#: ~1e5 layers or more, deeper than any network the exponents describe
CRITICAL_TOL = 1e-10


def exponents(arch=None, sigma_w=None, sigma_b=None, K0=None, depth=None, critical_tol=CRITICAL_TOL,
              **arch_kwargs) -> Exponents:
    """zeta_K and zeta (J^{l0,l} ~ l^-zeta) at (sigma_w, sigma_b), analytic and numeric.

    Parameters
    ----------
    sigma_w, sigma_b : float
        The point; for exponents that exist it should be critical (a critical
        point, a line, or an everywhere-critical / mu = 1 architecture).
    K0 : float, optional
        K^1 of the iteration (default: the unit-norm input, or, when that does
        not reach K*, a point on the side from which K* attracts).
    depth : int, optional
        Layers iterated for the numeric estimate, 1000 <= depth <= 2^27
        (default 2^20; 2^23 at critical points with a fixed point).
    critical_tol : float
        A point within this relative distance, |(dsigma_w, dsigma_b)| /
        |(sigma_w, sigma_b)|, of an exact critical point (chi_J* = chi_K* = 1)
        is treated as that point (default 1e-10; 0 turns it off): a critical
        point copied to 13 digits is ~1e-14 off it, where its tangent fixed
        point has split or vanished although the network lingers there for
        ~1e7 layers. The note gives the distance, the exact point and the
        tolerance; ``sigma_w``, ``sigma_b`` of the result are the exact ones.
    """
    arch, comp = prepare(arch, arch_kwargs)
    warn_if_approximate("exponents", arch, sigma_b)
    sw, sb, W, T, depth, K0 = _exponent_arguments(sigma_w, sigma_b, K0, depth, critical_tol)
    sw, sb, W, T, K, chiJ, chiK, status, pre_note = _locate_fixed_point(arch, comp, sw, sb, W, T, K0,
                                                                        float(critical_tol))
    base = dict(architecture=arch, sigma_w=sw, sigma_b=sb, K_star=K, chi_J=chiJ, chi_K=chiK)
    xi = float(_xi(chiJ))
    nan = np.nan
    if status == ST_INF:
        return _divergent(arch, comp, sw, sb, W, T, K0, depth, base, xi)
    if abs(chiK - 1.0) > 1e-7:
        return _off_critical_point(comp, sw, sb, W, T, K0, depth, base, xi)
    # chi_K* = 1: a critical point (or a marginal, scale-invariant map)
    if comp.pair:
        return Exponents(**base, regime="critical point", zeta_K=nan, zeta=nan, zeta_K_numeric=nan,
                         zeta_numeric=nan, xi=xi, note="series exponents need a one-input state")
    c2, c3, d1 = _series(arch, K, sw, sb)
    if abs(c2) <= 1e-12 and abs(c3) <= 1e-12:
        return _marginal(comp, sw, sb, W, T, K0, depth, base, xi, chiJ, c2, d1)
    return _at_critical_point(arch, comp, sw, sb, W, T, K0, depth, base, xi, K, chiJ, c2, c3, d1, pre_note)


def _exponent_arguments(sigma_w, sigma_b, K0, depth, critical_tol):
    """Validated (sw, sb, W, T, depth, K0) of :func:`exponents` (scalars only: the meaning is per point)."""
    if sigma_w is None or sigma_b is None:
        raise ValueError("exponents needs sigma_w= and sigma_b= (scalars)")
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar for exponents")
    if depth is not None:
        depth = check_int("depth", depth, 1000, MAX_EXPONENT_DEPTH)
    if K0 is not None:
        if np.ndim(K0) != 0:
            raise ValueError(f"K0 must be a scalar for exponents, got an array of shape {np.shape(K0)}")
        K0 = float(check_nonnegative("K0", K0))
    check_real("critical_tol", critical_tol, minimum=0.0, maximum=1e-3)
    sw, sb, W, T = (float(x) for x in variances(sigma_w, sigma_b))
    return sw, sb, W, T, depth, K0


def _locate_fixed_point(arch, comp, sw, sb, W, T, K0, critical_tol):
    """The fixed point whose exponents are reported, and the point it sits at.

    The one reached from K0; or, within ``critical_tol`` of an exact critical
    point, that point's; or a critical fixed point the unit input does not
    reach. Returns (sw, sb, W, T, K*, chi_J*, chi_K*, status, note prefix).
    """
    st = fixed_point_state(arch, sw, sb, K0=K0, errors="raise")
    K, chiJ, chiK, status = float(st.K), float(st.chi_J), float(st.chi_K), int(st.status)
    pre_note = ""
    critical_here = status == ST_OK and abs(chiK - 1.0) <= 1e-7 and abs(chiJ - 1.0) <= 1e-7
    if not critical_here and not comp.pair and critical_tol > 0:
        # a critical point typed in to 13 digits is off it by ~1e-14: its tangent fixed
        # point has split or vanished, yet the network lingers there for ~1e7 layers.
        # Within critical_tol of an exact critical point, report that point's exponents.
        near = _near_critical_point(arch, comp, sw, sb, W, T, critical_tol)
        if near is not None:
            Kc, Wc, Tc, dist = near
            swc, sbc = float(np.sqrt(Wc)), float(np.sqrt(Tc))
            pre_note = (f"(sigma_w, sigma_b) = ({sw:.17g}, {sb:.17g}) is {dist:.3g} (relative distance) from the "
                        f"exact critical point ({swc:.17g}, {sbc:.17g}), K* = {Kc:.17g}, within critical_tol = "
                        f"{critical_tol:g}: exponents are those of that point; ")
            sw, sb, W, T = swc, sbc, Wc, Tc
            st = fixed_point_state(arch, sw, sb, K0=K0, errors="raise")
            K, chiJ, chiK, status = float(st.K), float(st.chi_J), float(st.chi_K), int(st.status)
            critical_here = status == ST_OK and abs(chiK - 1.0) <= 1e-7 and abs(chiJ - 1.0) <= 1e-7
            # the side from which a half-stable K* attracts: dK' = dK - c2 dK^2, c2 = -g''/2
            attracts = -np.sign(float(_expr(comp, KN.DC_DK, Kc, Wc, Tc)[0]))
            if K0 is not None and (critical_here or np.sign(K0 - Kc) == attracts):
                # iteration locates a tangent K* only to ~sqrt(eps) (or, off the exact point,
                # passes it after a long bottleneck): take Newton's K* itself
                K, chiJ, chiK = Kc, *(float(_expr(comp, w, Kc, Wc, Tc)[0]) for w in (KN.CHI_J, KN.CHI_K))
                status = ST_OK
                critical_here = True
    if critical_here and not comp.pair and K > 0 and not pre_note:
        # iteration reaches a tangent K* only to ~sqrt(eps); chi_K - 1 has a simple root there
        K = _refine_tangent(comp, K, W, T)
        chiJ, chiK = (float(_expr(comp, w, K, W, T)[0]) for w in (KN.CHI_J, KN.CHI_K))
    if K0 is None and not comp.pair and not critical_here:
        # a critical fixed point the unit input does not reach (half-stable, GELU)?
        crit = _critical_fixed_point(arch, comp, sw, sb, W, T)
        if crit is not None:
            pre_note += (f"the unit-norm input converges to K = {K:.10g} instead; exponents are those of "
                         f"the critical fixed point K* = {crit[0]:.10g} ")
            K, chiJ, chiK, status = crit[0], crit[1], crit[2], ST_OK
    return sw, sb, W, T, K, chiJ, chiK, status, pre_note


def _off_critical_point(comp, sw, sb, W, T, K0, depth, base, xi):
    """chi_K* != 1: K^l relaxes exponentially; J too unless chi_J* = 1 (on the critical line:
    J -> const)."""
    nan = np.nan
    chiJ = base["chi_J"]
    if abs(chiJ - 1.0) <= 1e-7:
        L = depth or 2 ** 16
        k0 = sw * sw + sb * sb if K0 is None else float(K0)
        l, oK, oL, oX = _samples(comp, k0, T, W, T, L)
        s = -l * np.log(oX)
        zn = _local_fit(l, s)
        return Exponents(**base, regime="critical line", zeta_K=nan, zeta=0.0, zeta_K_numeric=nan,
                         zeta_numeric=zn, xi=xi, depth=L, K0=k0,
                         note="chi_K* < 1: K^l converges exponentially and J^{l0,l} to a constant")
    return Exponents(**base, regime="ordered" if chiJ < 1 else "chaotic", zeta_K=nan, zeta=nan,
                     zeta_K_numeric=nan, zeta_numeric=nan, xi=xi,
                     note="off criticality J^{l0,l} ~ exp(-l/xi): no power law")


def _marginal(comp, sw, sb, W, T, K0, depth, base, xi, chiJ, c2, d1):
    """Every nearby K is fixed (scale-invariant): nothing flows."""
    nan = np.nan
    L = depth or 2 ** 16
    l, oK, oL, oX = _samples(comp, (sw * sw + sb * sb) if K0 is None else K0, T, W, T, L)
    zn = _local_fit(l, -l * np.log(oX)) if np.all(oX > 0) else nan
    dk = np.abs(oK - oK[0])
    zkn = 0.0 if np.all(dk <= 1e-9 * max(1.0, abs(oK[0]))) else nan
    # every K is a fixed point here: the one that matters is where the input sits
    base = dict(base, K_star=float(oK[0]))
    return Exponents(**base, regime="marginal", zeta_K=0.0, zeta=0.0 if abs(chiJ - 1) <= 1e-7 else nan,
                     zeta_K_numeric=zkn, zeta_numeric=zn, c2=c2, d1=d1, xi=xi, depth=L, K0=float(oK[0]),
                     note="F(K) = K near K*: K^l stays at its input value, J^{l0,l} constant "
                          "(paper eq. 103)")


def _at_critical_point(arch, comp, sw, sb, W, T, K0, depth, base, xi, K, chiJ, c2, c3, d1, pre_note):
    """A critical point: the series exponents (paper appendix K) and their numeric check by
    iterating from the side K* attracts."""
    nan = np.nan
    if abs(c2) > 1e-12:
        n_lead = 2
        zK = 1.0
        z = d1 / c2 if abs(chiJ - 1.0) <= 1e-7 else nan
        side = 1.0 if c2 > 0 else -1.0      # dK ~ 1/(c2 l): approached from this side
    else:
        n_lead = 3
        zK = 0.5
        z = nan  # chi_J - 1 ~ l^-1/2: stretched exponential unless d1 = 0
        side = 1.0 if c3 > 0 else 0.0
    # numeric: iterate from the converging side
    if K0 is None:
        unit = sw * sw + sb * sb
        if side != 0 and np.sign(unit - K) == side and unit != K:
            k0 = unit
        elif side > 0:
            k0 = K + max(0.5 * K, 1.0)
        elif side < 0 and K > 0:
            k0 = 0.5 * K
        else:
            k0 = nan
    else:
        k0 = float(K0)
    # corrections to the local exponents decay like kappa log(l)/l with
    # kappa = 1 + c3/c2^2: iterate deep enough for the fit to resolve them
    kappa = abs(1.0 + c3 / c2 ** 2) if n_lead == 2 else 1.0
    L = depth or (2 ** 23 if kappa > 100 else (2 ** 14 if uses_quadrature(arch) else 2 ** 17))
    if not np.isfinite(k0):
        return Exponents(**base, regime="critical point", zeta_K=nan, zeta=nan, zeta_K_numeric=nan,
                         zeta_numeric=nan, c2=c2, d1=d1, xi=xi,
                         note=pre_note + "(K* attracts only from below but K >= 0: no input converges to it; "
                              "the scaling analysis does not apply, cf. paper appendix K.3)")
    l, oK, oL, oX = _samples(comp, k0, T, W, T, L)
    dK = np.abs(oK - K)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = -np.gradient(np.log(dK), np.log(l))
        s = -l * np.log(oX)
    zkn = _local_fit(l, t)
    zn = _local_fit(l, s) if np.isfinite(z) else nan
    note = pre_note + f"(leading order n = {n_lead}; iterated from K^1 = {k0:.6g})"
    return Exponents(**base, regime="critical point", zeta_K=zK, zeta=z, zeta_K_numeric=zkn, zeta_numeric=zn,
                     c2=c2, d1=d1, xi=xi, depth=L, K0=k0, note=note)


def _near_critical_point(arch, comp, sw, sb, W, T, tol):
    """(K*, W*, T*, distance) of an exact critical point within ``tol`` of (sw, sb), or None.

    Candidates K are the local minima of |F(K) - K| on a log grid (a tangent
    fixed point that has split or vanished leaves one); each is polished by
    Newton on (K, W, T) for F = K, chi_J = chi_K = 1 and kept if the point is
    within tol (relative) of (sw, sb).
    """
    require_computable("exponents", arch, comp, 1e-12, 1e10,
                       "critical_tol=0 skips this search for a nearby exact critical point.")
    grid = np.concatenate([[0.0], np.logspace(-12, 10, 1601)])
    g = np.empty(grid.size)
    comp.call("g_grid", grid, 0.0, W, T, comp.mu, comp.eps, g)
    a = np.abs(g)
    with np.errstate(invalid="ignore"):
        cand = np.flatnonzero((a[1:-1] <= a[:-2]) & (a[1:-1] <= a[2:]) & np.isfinite(a[1:-1])) + 1
    scale = max(np.hypot(sw, sb), 1e-300)
    best = None
    for i in cand[:50]:
        K1, W1, T1, conv = comp.call("newton_point", float(grid[i]), W, T, comp.mu, comp.eps)
        if not (conv and np.isfinite(K1) and W1 >= 0 and T1 >= -1e-14):
            continue
        T1 = max(T1, 0.0)
        K1, W1, T1 = _polish_critical(arch, K1, W1, T1)
        dist = float(np.hypot(np.sqrt(W1) - sw, np.sqrt(T1) - sb) / scale)
        if dist <= tol and (best is None or dist < best[3]):
            best = (float(K1), float(W1), float(T1), dist)
    return best


def _refine_tangent(comp, K, W, T):
    """K* refined as the root of chi_K - 1 within 1e-4 of K (K unchanged where none is bracketed)."""
    from ..roots import brentq

    def c(k):
        return float(_expr(comp, KN.CHI_K, k, W, T)[0]) - 1.0

    lo, hi = max(K * (1 - 1e-4), 0.0), K * (1 + 1e-4) + 1e-12
    try:
        if c(lo) * c(hi) < 0:
            return brentq(c, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    except ValueError:
        pass
    return K


def _critical_fixed_point(arch, comp, sw, sb, W, T):
    """(K*, chi_J, chi_K) of a fixed point with chi_J = chi_K = 1 at (sw, sb), or None.

    Tangent fixed points are located only to ~sqrt(eps) by minimising |g|;
    K* is refined as the root of chi_K - 1, which is simple there.
    """
    from ..roots import brentq

    from .. import _fnindex as KN

    for fp in fixed_points(arch, sw, sb):
        if np.isfinite(fp.K) and abs(fp.chi_K - 1.0) <= 1e-6 and abs(fp.chi_J - 1.0) <= 1e-6:
            K = fp.K

            def c(k):
                return float(_expr(comp, KN.CHI_K, k, W, T)[0]) - 1.0

            lo, hi = max(K * (1 - 1e-4), 0.0), K * (1 + 1e-4) + 1e-12
            if K > 0 and c(lo) * c(hi) < 0:
                K = brentq(c, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
            return K, float(_expr(comp, KN.CHI_J, K, W, T)[0]), float(_expr(comp, KN.CHI_K, K, W, T)[0])
    return None


def _divergent(arch, comp, sw, sb, W, T, K0, depth, base, xi):
    """K^l -> inf: power-law growth, stretched exponential, or exponential."""
    nan = np.nan
    chiJ = base["chi_J"]
    if abs(chiJ - 1.0) > 1e-7:
        note = ("K^l diverges and chi_J^l tends to chi_J* != 1: J^{l0,l} is exponential" if np.isfinite(chiJ) else
                "K^l diverges and chi_J^l grows without bound (chi_J* = inf, an activation growing faster than "
                "linearly): J^{l0,l} grows faster than any exponential")
        return Exponents(**base, regime="exponential growth" if chiJ > 1 else "ordered", zeta_K=nan, zeta=nan,
                         zeta_K_numeric=nan, zeta_numeric=nan, xi=xi, note=note)
    L = depth or 2 ** 20
    k0 = (W + T) if K0 is None else float(K0)
    l, oK, oL, oX = _samples(comp, k0, T, W, T, L)
    sel = l >= L / 100
    # growth of K: K ~ a l (zeta_K = -1 for linear growth)
    with np.errstate(divide="ignore", invalid="ignore"):
        slopeK = np.gradient(np.log(oK), np.log(l))
        x = oX - 1.0
        q = -np.gradient(np.log(x), np.log(l))
    zKn = -_local_fit(l, slopeK)
    p_num = _local_fit(l, q)
    a_num = float((oK[-1] - oK[-2]) / (l[-1] - l[-2]))
    if comp.pair:
        a, b, p = _asymptotic_analytic_pair(comp, W, T)
    else:
        a, b, p = _asymptotic_analytic(arch, sw, sb)
    p_use = p if np.isfinite(p) else round(p_num * 4) / 4
    common = dict(zeta_K=-1.0 if np.isfinite(a) and a > 0 else nan, zeta_K_numeric=zKn, xi=xi, depth=L, K0=k0,
                  p=p_use, growth_rate=a if np.isfinite(a) else a_num)
    if abs(p_use - 1.0) < 1e-6:
        z = -b / a if np.isfinite(a) and np.isfinite(b) else nan
        s = -l * np.log(oX)
        zn = _local_fit(l, s)
        return Exponents(**base, regime="power-law growth", zeta=z, zeta_numeric=zn, **common,
                         note="K^l grows linearly and chi_J^l - 1 ~ (b/a)/l: J^{l0,l} ~ l^(b/a) = l^-zeta")
    if 0 < p_use < 1:
        ct = b * a ** (-p_use) if np.isfinite(a) and np.isfinite(b) else nan
        # log J = c~ l^(1-p)/(1-p) + gamma log l + const + ... fitted over the last two decades
        xx = l[sel]
        e = 1.0 - p_use
        A = np.column_stack([xx ** e / e, np.log(xx), np.ones_like(xx), xx ** (e - p_use) if e != p_use else
                             np.log(xx) ** 2, xx ** -p_use])
        with np.errstate(all="ignore"):
            coef = np.linalg.lstsq(A, oL[sel], rcond=None)[0]
        ctn = float(coef[0])
        lam = 1.0 / (4 * ct * ct) if abs(p_use - 0.5) < 1e-9 and np.isfinite(ct) else nan
        return Exponents(**base, regime="stretched exponential", zeta=nan, zeta_numeric=nan, c_tilde=ct,
                         c_tilde_numeric=ctn, lambda_=lam, **common,
                         note=f"chi_J^l ~ 1 + c~ l^-{p_use:g}: log J^{{l0,l}} ~ c~ l^{1 - p_use:g}/{1 - p_use:g} "
                              "(Theorem 4.3 for erf, mu = 1: p = 1/2, J = O(exp(sqrt(l/lambda))))")
    return Exponents(**base, regime="convergent", zeta=0.0, zeta_numeric=_local_fit(l, -l * np.log(oX)),
                     **common, note="chi_J^l - 1 decays faster than 1/l: J^{l0,l} tends to a constant")
