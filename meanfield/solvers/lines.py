r"""Critical lines and points, all fixed points with their stability, phase diagrams.

Definitions (partial-Jacobian paper, section 2 and appendix D): the network
is critical where chi_J* = 1 at the fixed point K* that the input reaches
(the unit-norm input, K^1 = sigma_w^2 + sigma_b^2); a critical point has in
addition chi_K* = 1. Where K^l diverges (K* = inf), chi_J* is the limit of
chi_J^l along the divergence.

Architectures whose chi_J^l tends to 1 for every (sigma_w, sigma_b) while
J^{l0,l} grows only as a power of l (pre-LayerNorm or large-batch BatchNorm
with mu = 1) are *everywhere critical*: they are reported as such, not as a
line. erf with mu = 1 and no LayerNorm also has chi_J^l -> 1, but J grows as
a stretched exponential (Theorem 4.3): *subcritical*, no line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .. import _fnindex as KN
from .._validate import check_nonnegative, check_real
from .._serialize import Result
from ..calculus import Architecture
from ._common import (ST_INF, ST_OK, ConvergenceError, _expr, prepare, require_computable, variances,
                      warn_if_approximate)
from ._expansion import _polish_critical, _series
from .fixed import fixed_point_state

__all__ = ["PHASES", "PHASE_ORDERED", "PHASE_CRITICAL", "PHASE_CHAOTIC", "PHASE_DIVERGENT",
           "PHASE_UNDETERMINED", "phase_names", "CriticalLine", "critical_line", "CriticalPoint", "CriticalPoints", "critical_point",
           "FixedPoint", "fixed_points", "correlation_length", "PhaseDiagram", "phase_diagram",
           "asymptotic_regime"]


# ---------------------------------------------------------------------------
# Regimes where K^l diverges for every (sigma_w, sigma_b).
# ---------------------------------------------------------------------------
_SAMPLES = ((0.7, 0.2), (1.5, 0.6), (3.0, 0.0), (0.3, 1.0))


@lru_cache(maxsize=128)
def _regime(arch: Architecture) -> str:
    comp = prepare(arch, {})[1]
    layers = np.array([2 ** 16, 2 ** 17, 2 ** 18], dtype=np.int64)
    qs = []
    for sw, sb in _SAMPLES:
        W, T = sw * sw, sb * sb
        st = fixed_point_state(arch, sw, sb, errors="nan")
        if int(st.status) != ST_INF or not abs(float(st.chi_J) - 1.0) <= 1e-9:
            return "none"
        outK, outL, outX = (np.empty(3) for _ in range(3))
        comp.call("depth_samples", W + T, T, W, T, comp.mu, comp.eps, layers, outK, outL, outX)
        x = outX - 1.0
        if not (np.all(np.isfinite(x)) and np.all(x > 0)):
            return "none"
        qs.append(np.log2(x[1] / x[2]))   # chi_J^l - 1 ~ l^-q
    qs = np.array(qs)
    if np.all(qs > 0.97):
        return "everywhere_critical"
    return "subcritical"


def asymptotic_regime(arch=None, **arch_kwargs) -> str:
    """'everywhere_critical', 'subcritical' or 'none' (see the module notes).

    Decided numerically at a few (sigma_w, sigma_b): K^l diverges, chi_J^l -> 1,
    and chi_J^l - 1 decays like 1/l (J a power law: everywhere critical) or
    more slowly (J a stretched exponential: subcritical).
    """
    arch, _ = prepare(arch, arch_kwargs)
    return _regime(arch)


# ---------------------------------------------------------------------------
# Critical lines.
# ---------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class CriticalLine(Result):
    """Points (sigma_w, sigma_b) with chi_J* = 1, solved for one coordinate.

    ``solved_for`` is 'sigma_b' (sigma_w given), 'sigma_w' (sigma_b given) or
    'parametric' (K_star given; both solved). NaN marks where no line exists
    and ``note`` says why (and why a point has ``reached`` False).
    ``K_star`` is the fixed point on the line (inf where K^l diverges, e.g.
    ReLU with sigma_b > 0), ``chi_K`` the kernel slope there (< 1 stable,
    = 1 a critical point, > 1 unstable: not reached by iterating), and
    ``reached`` whether the unit-norm input reaches that fixed point.
    ``np.asarray(line)`` gives the solved coordinate (sigma_b for the
    parametric form).
    """

    architecture: Architecture
    sigma_w: np.ndarray
    sigma_b: np.ndarray
    K_star: np.ndarray
    chi_K: np.ndarray
    reached: np.ndarray
    solved_for: str
    everywhere_critical: bool = False
    note: str = ""

    def __array__(self, dtype=None, copy=None):
        out = self.sigma_w if self.solved_for == "sigma_w" else self.sigma_b
        return np.asarray(out, dtype=dtype)

    @property
    def values(self) -> np.ndarray:
        """The solved coordinate (as ``np.asarray(line)``)."""
        return np.asarray(self)


_NOTE_EVERYWHERE = ("chi_J* = 1 for every (sigma_w, sigma_b): K^l grows linearly and chi_J^l - 1 "
                    "~ 1/l, so J^{l0,l} is a power law everywhere; there is no line")
_NOTE_SUB = ("chi_J^l -> 1 everywhere but more slowly than 1/l: J^{l0,l} grows as a stretched "
             "exponential (subcritical, Theorem 4.3); no critical line")


def critical_line(arch=None, sigma_w=None, sigma_b=None, K_star=None, **arch_kwargs) -> CriticalLine:
    """The critical line chi_J* = 1, solved for sigma_b, sigma_w or parametrically by K*.

    Pass exactly one of:

    ``sigma_w``
        array: the sigma_b >= 0 on the line at each sigma_w (NaN where there
        is none, see ``note``): the smallest sigma_b whose fixed point, reached
        by the unit-norm input, has chi_J* = 1. Where no such point exists but
        a fixed point K* with chi_J(K*) = 1 does (unstable or not reached,
        GELU at sigma_w = 1.63: sigma_b = 0.14759, K* = 0.333), that point is
        returned with ``reached`` False, as the ``K_star`` form gives it.
    ``sigma_b``
        array: the sigma_w on the line at each sigma_b; the form for lines
        vertical in the (sigma_w, sigma_b) plane (scale-invariant
        activations: sigma_w = sqrt(2 / (a_+^2 + a_-^2)) for every sigma_b).
        This form follows the fixed point the unit-norm input reaches and
        returns NaN where none is critical (unstable branches: ``K_star``).
    ``K_star``
        array of fixed points: the (sigma_w, sigma_b) with F(K*) = K* and
        chi_J(K*) = 1 (one-input architectures). The natural form for GELU
        (paper eqs. 157-158); points with chi_K > 1 are unstable (``reached``
        False).

    Architectures that are critical everywhere (pre-LN or BatchNorm with
    mu = 1) return NaN with ``everywhere_critical=True``.
    """
    arch, comp = prepare(arch, arch_kwargs)
    warn_if_approximate("critical_line", arch, sigma_b)
    given = [n for n, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b), ("K_star", K_star)) if v is not None]
    if len(given) != 1:
        raise ValueError("critical_line needs exactly one of sigma_w=, sigma_b= or K_star= "
                         f"(got {', '.join(given) or 'none'})")
    regime = _regime(arch)
    if given[0] == "K_star":
        return _parametric(arch, comp, K_star, regime)
    name = given[0]
    vals = check_nonnegative(name, sigma_w if name == "sigma_w" else sigma_b)
    shape = vals.shape
    flat = vals.ravel()
    if regime != "none":
        return _line_off_regime(arch, name, flat, shape, regime)
    mode = 0 if name == "sigma_w" else 1
    order = np.argsort(flat, kind="stable")
    fixed = np.ascontiguousarray(flat[order] ** 2)
    outv, outK, outS, outR, table = _line_solve_sorted(arch, comp, mode, fixed)
    solved = np.full(flat.size, np.nan)
    ok = outS == ST_OK
    solved[order[ok]] = np.sqrt(np.maximum(outv[ok], 0.0))
    reach = np.zeros(flat.size, bool)
    reach[order] = ok & (outR == 1)
    Kun = np.full(flat.size, np.nan)
    Kun[order] = outK
    if mode == 0:
        sw, sb = flat, solved
    else:
        sw, sb = solved, flat
    K, chiK, good, un = _line_fixed_points(arch, comp, sw, sb, reach, Kun)
    notes = _line_notes(name, table is not None, good, un)
    return CriticalLine(arch, sw.reshape(shape), sb.reshape(shape), K.reshape(shape), chiK.reshape(shape),
                        reach.reshape(shape), "sigma_b" if mode == 0 else "sigma_w", note="; ".join(notes))


def _line_off_regime(arch, name, flat, shape, regime):
    """The answer where K^l diverges everywhere (everywhere critical or subcritical): no line."""
    nan = np.full(flat.shape, np.nan)
    sw = flat if name == "sigma_w" else nan
    sb = flat if name == "sigma_b" else nan
    return CriticalLine(arch, sw.reshape(shape), sb.reshape(shape), np.full(shape, np.inf),
                        np.full(shape, np.nan), np.zeros(shape, bool), "sigma_b" if name == "sigma_w"
                        else "sigma_w", regime == "everywhere_critical",
                        _NOTE_EVERYWHERE if regime == "everywhere_critical" else _NOTE_SUB)


def _line_solve_sorted(arch, comp, mode, fixed):
    """The line at the sorted squared scales ``fixed`` (W for mode 0, T for mode 1).

    Returns (v, K*, status, reached, table): v the other variance, reached 1
    where the unit-norm input reaches the critical fixed point; ``table`` the
    parametric table used (mode 0, one-input states) or None (direct scan).
    """
    outv, outK = np.empty(fixed.size), np.empty(fixed.size)
    outS = np.empty(fixed.size, dtype=np.int64)
    outR = np.ones(fixed.size, dtype=np.int64)
    table = _line_table(arch) if (mode == 0 and not comp.pair) else None
    if table is not None:
        comp.call("line_from_table", fixed, *table, comp.mu, comp.eps, outv, outK, outS, outR)
        _line_beyond_table(comp, fixed, table, outv, outK, outS, outR)
    else:
        comp.call("critical_line_many", mode, fixed, comp.mu, comp.eps, outv, outK, outS)
    return outv, outK, outS, outR, table


def _line_beyond_table(comp, fixed, table, outv, outK, outS, outR):
    """Where the line may continue beyond the table's last K*: the direct scan over sigma_b
    (in place). W(K) either keeps moving there (erf: W ~ sqrt K) or has converged (GELU:
    W -> 2, ReLU: W = 2), when only W next to its limit can be left."""
    Wt = table[1][table[3] == ST_OK]
    w_end, w_dec = Wt[-1], Wt[-1] - Wt[-101]
    if abs(w_dec) <= 1e-3 * abs(w_end):
        beyond = np.abs(fixed - w_end) <= 1e-3 * abs(w_end)
    else:
        beyond = (fixed - w_end) * w_dec > 0
    out = ((outS != ST_OK) | (outR == 0)) & beyond
    if out.any():
        idx = np.flatnonzero(out)
        v, k, st = np.empty(idx.size), np.empty(idx.size), np.empty(idx.size, dtype=np.int64)
        comp.call("critical_line_many", 0, np.ascontiguousarray(fixed[idx]), comp.mu, comp.eps, v, k, st)
        hit = st == ST_OK     # a reached crossing beats an unreached table candidate
        outv[idx[hit]], outK[idx[hit]], outS[idx[hit]], outR[idx[hit]] = v[hit], k[hit], st[hit], 1


def _line_fixed_points(arch, comp, sw, sb, reach, Kun):
    """K* and chi_K* on the line: the reached fixed point, or (unreached) the critical one."""
    good = np.isfinite(sw) & np.isfinite(sb)
    K = np.full(sw.size, np.nan)
    chiK = np.full(sw.size, np.nan)
    if np.any(good & reach):
        g = good & reach
        st = fixed_point_state(arch, sw[g], sb[g], errors="nan")
        K[g] = st.K
        chiK[g] = st.chi_K
    un = good & ~reach
    if np.any(un):
        # an unreached point: K* is the fixed point on the line, not where the input goes
        K[un] = Kun[un]
        chiK[un] = _expr(comp, KN.CHI_K, K[un], sw[un] ** 2, sb[un] ** 2)
    return K, chiK, good, un


def _line_notes(name, from_table, good, un):
    notes = []
    if np.any(un):
        notes.append("reached=False: (sigma_w, sigma_b) has a fixed point K* with chi_J(K*) = 1 (F(K*) = K*), but "
                     "the unit-norm input converges elsewhere (K* unstable, chi_K > 1, or in another basin), so "
                     "no line is reached there")
    if np.any(~good):
        if from_table:
            notes.append("NaN: no sigma_b >= 0 has a fixed point with chi_J* = 1 at that sigma_w")
        else:
            notes.append(f"NaN: no critical point reached by the unit-norm input at that {name} (this form "
                         "follows the reached fixed point; K_star= gives unstable branches too)")
    return notes


@lru_cache(maxsize=64)
def _line_table(arch: Architecture):
    """The parametric line K* -> (W, T) on a log grid with the turning points of W(K) inserted.

    None when the parametric solve fails inside the grid (then lines are
    found by the direct scan over sigma_b instead).
    """
    comp = prepare(arch, {})[1]
    require_computable("critical_line", arch, comp, 1e-8, 1e12,
                       "critical_line(..., K_star=[...]) gives the line at fixed points K* you choose.")
    Ks = np.concatenate([[0.0], np.logspace(-8, 12, 2001)])

    def solve(K):
        W, T, S = np.empty(K.size), np.empty(K.size), np.empty(K.size, dtype=np.int64)
        comp.call("parametric_many", np.ascontiguousarray(K), comp.mu, comp.eps, W, T, S)
        return W, T, S

    W, T, S = solve(Ks)
    ok = S == ST_OK
    if not ok.any():
        return None
    first, last = np.flatnonzero(ok)[[0, -1]]
    if not ok[first:last + 1].all():
        return None
    # turning points of W(K): two roots of W(K) = W can share a grid cell there
    extra = []
    for j in range(first + 1, last):
        dl, dr = W[j] - W[j - 1], W[j + 1] - W[j]
        if dl * dr < 0:
            from scipy.optimize import minimize_scalar  # only here: importing it costs ~0.5 s

            sgn = 1.0 if dl < 0 else -1.0   # minimum: minimise W; maximum: minimise -W
            res = minimize_scalar(lambda k: sgn * solve(np.array([k]))[0][0], bounds=(Ks[j - 1], Ks[j + 1]),
                                  method="bounded", options={"xatol": 1e-12 * Ks[j + 1]})
            extra.append(float(res.x))
    if extra:
        Ks = np.unique(np.concatenate([Ks, extra]))
        W, T, S = solve(Ks)
    return np.ascontiguousarray(Ks), W, T, S


def _parametric(arch, comp, K_star, regime):
    if comp.pair:
        raise ValueError(f"the parametric form (K_star=) needs a one-input architecture; {arch} "
                         "carries a pair state (BatchNorm)")
    Ks = check_nonnegative("K_star", K_star)
    shape = Ks.shape
    flat = Ks.ravel()
    order = np.argsort(flat, kind="stable")
    positive = flat[order][flat[order] > 0]   # K* = 0 of a normalising block is 0/0 (NaN there, as before)
    if positive.size:
        require_computable("critical_line", arch, comp, 0.0, float(positive[-1]), "Pass K_star below that K.",
                           Ks=positive)
    outW, outT = np.empty(flat.size), np.empty(flat.size)
    outS = np.empty(flat.size, dtype=np.int64)
    comp.call("parametric_many", np.ascontiguousarray(flat[order]), comp.mu, comp.eps, outW, outT, outS)
    W, T = np.full(flat.size, np.nan), np.full(flat.size, np.nan)
    ok = (outS == ST_OK) & (outT >= 0.0) & (outW >= 0.0)
    W[order[ok]] = outW[ok]
    T[order[ok]] = outT[ok]
    sw, sb = np.sqrt(W), np.sqrt(T)
    chiK = _expr(comp, KN.CHI_K, flat, W, T)
    reached = np.zeros(flat.size, bool)
    good = np.isfinite(W)
    if np.any(good):
        st = fixed_point_state(arch, sw[good], sb[good], errors="nan")
        reached[good] = np.isclose(st.K, flat[good], rtol=1e-9, atol=1e-12)
    note = "" if regime == "none" else (_NOTE_EVERYWHERE if regime == "everywhere_critical" else _NOTE_SUB)
    return CriticalLine(arch, sw.reshape(shape), sb.reshape(shape), flat.reshape(shape).copy(),
                        chiK.reshape(shape), reached.reshape(shape), "parametric",
                        regime == "everywhere_critical", note)


# ---------------------------------------------------------------------------
# All fixed points of the kernel map at one (sigma_w, sigma_b).
# ---------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class FixedPoint(Result):
    """A fixed point K* of the kernel map with its stability and basin.

    ``stability``: 'stable' (chi_K < 1), 'unstable' (chi_K > 1),
    'half-stable from above' / 'half-stable from below' (chi_K = 1, attracting
    only from one side), 'marginal' (chi_K = 1 with every nearby K fixed) or
    'stable (algebraic)'. ``basin`` = (lo, hi): inputs with K^1 in that
    interval converge to K* (ends included where they are K* itself).
    """

    K: float
    chi_K: float
    chi_J: float
    stability: str
    basin: tuple


def _classify(comp, K, W, T, g_below, g_above):
    chiK = float(_expr(comp, KN.CHI_K, K, W, T)[0])
    if abs(chiK - 1.0) > 1e-9:
        return chiK, ("stable" if chiK < 1.0 else "unstable")
    if g_below > 0 and g_above < 0:
        return chiK, "stable (algebraic)"
    if g_below < 0 and g_above > 0:
        return chiK, "unstable"
    if g_below == 0 and g_above == 0:
        return chiK, "marginal"
    if g_above < 0:
        return chiK, "half-stable from above"
    return chiK, "half-stable from below"


def fixed_points(arch=None, sigma_w=None, sigma_b=None, K_max=1e10, _known=(), **arch_kwargs) -> list:
    """Every fixed point of the one-input kernel map in [0, K_max], with stability and basin.

    ``K_max`` is a real number in [1e-6, 1e50] (the grid starts at 1e-12).

    Roots of g = F(K) - K are found on a log grid (sign changes, then Brent)
    and by minimising |g| where it dips without changing sign (tangent,
    half-stable fixed points, as at the GELU critical point). If g > 0 above
    the largest root the kernel diverges from there: the last entry is then
    K = inf (its basin the inputs above that root).
    """
    arch, comp = prepare(arch, arch_kwargs)
    warn_if_approximate("fixed_points", arch, sigma_b)
    if comp.pair:
        raise ValueError(f"fixed_points enumerates one-input maps; {arch} carries a pair state (BatchNorm): "
                         "use fixed_point / fixed_point_state")
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar for fixed_points")
    K_max = _check_K_max(K_max, 1e-6, 1e50)
    sw, sb, W, T = variances(sigma_w, sigma_b)
    W, T = float(W), float(T)
    require_computable("fixed_points", arch, comp, 1e-12, K_max, "Pass a smaller K_max to scan below it.")
    grid = np.concatenate([[0.0], np.logspace(-12, np.log10(K_max), 1601)])
    g = np.empty(grid.size)
    comp.call("g_grid", grid, 0.0, W, T, comp.mu, comp.eps, g)
    out = np.full(64, np.nan)
    n = comp.call("roots_scan", grid, g, 0.0, W, T, comp.mu, comp.eps, out)
    roots = list(out[:n])
    # tangent roots: |g| dips towards zero without a sign change
    a = np.abs(g)
    for i in range(1, grid.size - 1):
        if a[i] < a[i - 1] and a[i] <= a[i + 1] and np.sign(g[i - 1]) == np.sign(g[i]) == np.sign(g[i + 1]) != 0:
            s = float(np.sign(g[i]))
            xm, fm = comp.call("_min_dg", float(grid[i - 1]), float(grid[i + 1]), s, 0.0, W, T, comp.mu, comp.eps)
            if fm <= 16 * np.finfo(float).eps * max(1.0, xm) and not any(abs(xm - r) <= 1e-9 * max(1, r) for r in roots):
                # a tangent root is only located to ~sqrt(eps): prefer a known exact one
                near = [k for k in _known if abs(k - xm) <= 1e-5 * max(1.0, abs(k))]
                roots.append(float(near[0]) if near else float(xm))
    roots = sorted(set(float(r) for r in roots if np.isfinite(r)))

    def gval(K):
        v = np.empty(1)
        comp.call("g_grid", np.array([K]), 0.0, W, T, comp.mu, comp.eps, v)
        return float(v[0])

    result = []
    sides = []
    for r in roots:
        # signs of g just below and above r from its local expansion (sampling
        # next to a tangent root only sees rounding): g ~ (chi_K - 1) dK, or
        # g ~ g''/2 dK^2 where chi_K = 1
        slope = float(_expr(comp, KN.CHI_K, r, W, T)[0]) - 1.0
        if abs(slope) > 1e-9:
            gb, ga = -slope, slope
        else:
            curv = float(_expr(comp, KN.DC_DK, r, W, T)[0])
            if abs(curv) > 1e-14:
                gb = ga = curv
            else:
                d = max(abs(r) * 1e-3, 1e-9)
                gb, ga = (gval(r - d) if r - d >= 0 else 0.0), gval(r + d)
        if r == 0.0:
            gb = 0.0
        sides.append((gb, ga))
    diverges_above = (gval(roots[-1] * (1 + 1e-6) + 1e-9) > 0) if roots else (g[-1] > 0)
    for i, r in enumerate(roots):
        gb, ga = sides[i]
        chiK, stab = _classify(comp, r, W, T, gb, ga)
        lo = roots[i - 1] if (i > 0 and gb > 0) else (0.0 if (i == 0 and gb > 0) else r)
        hi = (roots[i + 1] if i + 1 < len(roots) else np.inf) if ga < 0 else r
        chiJ = float(_expr(comp, KN.CHI_J, r, W, T)[0])
        result.append(FixedPoint(r, chiK, chiJ, stab, (lo, hi)))
    if diverges_above:
        lo = roots[-1] if roots else 0.0
        st = fixed_point_state(arch, float(sw), float(sb), K0=max(lo * 2, 1.0), errors="nan")
        result.append(FixedPoint(np.inf, float(st.chi_K), float(st.chi_J), "divergent", (lo, np.inf)))
    return result


# ---------------------------------------------------------------------------
# Critical points.
# ---------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class CriticalPoint(Result):
    """A point with chi_J* = chi_K* = 1.

    ``c2``, ``c3`` are the series coefficients of dK^{l+1} = dK - c_2 dK^2 -
    c_3 dK^3 (appendix G) and ``d1`` that of chi_J = 1 - d_1 dK; ``stability``
    of K* follows (see :class:`FixedPoint`). ``fixed_points`` lists every
    fixed point of the map at this (sigma_w, sigma_b) with its basin, and
    ``unit_input_reaches`` the one the unit-norm input (K^1 = sigma_w^2 +
    sigma_b^2) converges to.
    """

    sigma_w: float
    sigma_b: float
    K_star: float
    chi_J: float
    chi_K: float
    stability: str
    c2: float
    c3: float
    d1: float
    fixed_points: tuple
    unit_input_reaches: float
    note: str = ""


@dataclass(frozen=True, repr=False)
class CriticalPoints(Result):
    """All critical points of an architecture (a sequence of :class:`CriticalPoint`)."""

    architecture: Architecture
    points: tuple
    everywhere_critical: bool = False
    note: str = ""

    def __len__(self):
        return len(self.points)

    def _repr_extra(self):
        if not self.points:
            return {}
        return {"at": ", ".join(f"(sigma_w={p.sigma_w:.6g}, sigma_b={p.sigma_b:.6g}, K*={p.K_star:.6g}, "
                                f"{p.stability})" for p in self.points)}

    def __getitem__(self, i):
        return self.points[i]

    def __iter__(self):
        return iter(self.points)


def _check_K_max(K_max, lo, hi):
    """K_max as a float in [lo, hi] (the scan grids start at 1e-8 / 1e-12; above hi the
    compiled expressions or the parametric solve, whose scan ends near 6e19, lose their accuracy)."""
    from .._validate import numeric_value

    if numeric_value("K_max", K_max) is None:
        raise ValueError(f"K_max must be a real number, got {K_max!r}")
    check_real("K_max", K_max, minimum=lo, maximum=hi)
    return float(K_max)


def critical_point(arch=None, K_max=1e8, **arch_kwargs) -> CriticalPoints:
    """Every point (sigma_w, sigma_b) with chi_J* = chi_K* = 1, with K* and its stability.

    The parametric critical line (K* -> sigma_w, sigma_b) is scanned over K*
    in {0} and [1e-8, K_max] (1e-7 <= K_max <= 1e15) for sign changes of chi_K - 1, refined by Brent
    and polished by Newton on (K*, sigma_w^2, sigma_b^2) (for closed-form
    recursions finished in 40-digit mpmath and rounded once). Scale-invariant
    activations, whose line K* -> (sigma_w, sigma_b) is a single point with
    every K a fixed point, give that point with stability 'marginal'.

    Each point lists every fixed point of the map there in [0, 1e10] (in
    [0, K_max] where the recursion cannot be evaluated up to 1e10, as for
    sin(x)) with its basin (:func:`fixed_points`), so it says which inputs
    reach K* (at the GELU point (1.408, 0.416), K* = (3 + sqrt 17)/2
    attracts only from above; the unit input converges to a second, stable
    fixed point below it).
    """
    arch, comp = prepare(arch, arch_kwargs)
    warn_if_approximate("critical_point", arch)
    K_max = _check_K_max(K_max, 1e-7, 1e15)
    regime = _regime(arch)
    if regime == "everywhere_critical":
        return CriticalPoints(arch, (), True, _NOTE_EVERYWHERE)
    if comp.pair:
        return CriticalPoints(arch, (), False,
                              "pair-state (BatchNorm) blocks: the normalised state is fixed after one block "
                              "(mu < 1 contracts with rate mu^2), so chi_K* < 1: no critical point")
    points = []
    for K, Wc, Tc in _critical_candidates(arch, comp, K_max):
        if not (Tc >= -1e-14 and Wc >= 0):
            continue
        points.append(_critical_point_at(arch, comp, K, Wc, Tc, K_max))
    note = "" if points else "no point with chi_J* = chi_K* = 1"
    if regime == "subcritical":
        note = (note + "; " if note else "") + _NOTE_SUB
    return CriticalPoints(arch, tuple(points), False, note)


def _critical_candidates(arch, comp, K_max):
    """(K*, W, T) where chi_K - 1 changes sign along the parametric line (K* NaN: the whole
    line is one point of fixed points, scale-invariant maps)."""
    require_computable("critical_point", arch, comp, 1e-8, K_max, "Pass a smaller K_max to scan below it.")
    Ks = np.concatenate([[0.0], np.logspace(-8, np.log10(K_max), 641)])
    outW, outT = np.empty(Ks.size), np.empty(Ks.size)
    outS = np.empty(Ks.size, dtype=np.int64)
    comp.call("parametric_many", Ks, comp.mu, comp.eps, outW, outT, outS)
    valid = (outS == ST_OK) & (outW >= 0)
    W = np.where(valid, outW, np.nan)
    T = np.where(valid, outT, np.nan)
    c = _expr(comp, KN.CHI_K, Ks, W, T) - 1.0
    found = []
    ok = np.isfinite(c)
    if np.count_nonzero(ok) >= 2 and np.all(np.abs(c[ok]) <= 1e-10):
        # degenerate: chi_K = 1 all along the line. For scale-invariant maps
        # F = K + T there, so the line is the single point T = 0 at which every
        # K is a fixed point.
        Wm = float(np.median(W[ok]))
        if (np.allclose(W[ok], Wm, rtol=1e-9, atol=1e-12)
                and np.all(np.abs(T[ok]) <= 1e-9 * np.maximum(1.0, Ks[ok]))):
            found.append((np.nan, Wm, 0.0))
        return found
    if ok[0] and abs(c[0]) <= 1e-12:
        found.append((0.0, W[0], T[0]))
    from ..roots import brentq

    def cfun(K):
        outw, outt, outs = np.empty(1), np.empty(1), np.empty(1, dtype=np.int64)
        comp.call("parametric_many", np.array([K]), comp.mu, comp.eps, outw, outt, outs)
        if outs[0] != ST_OK:
            return np.nan
        return float(_expr(comp, KN.CHI_K, K, outw[0], outt[0])[0]) - 1.0

    for i in range(1, Ks.size):
        if ok[i] and ok[i - 1] and c[i] != 0 and c[i - 1] != 0 and np.sign(c[i]) != np.sign(c[i - 1]):
            try:
                Kc = brentq(cfun, Ks[i - 1], Ks[i], xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200)
            except ValueError:   # the parametric solve failed inside the bracket (NaN)
                continue
            K1, W1, T1, conv = comp.call("newton_point", Kc, W[i], T[i], comp.mu, comp.eps)
            if conv:
                found.append(_polish_critical(arch, K1, W1, T1))
        elif ok[i] and c[i] == 0 and i > 0:
            found.append((Ks[i], W[i], T[i]))
    return found


def _critical_point_at(arch, comp, K, Wc, Tc, K_max) -> "CriticalPoint":
    """The CriticalPoint record at (K*, W, T): factors, series coefficients, stability, and the
    fixed points with their basins (in [0, 1e10], or [0, K_max] where the recursion cannot be
    evaluated up to 1e10)."""
    sw, sb = float(np.sqrt(Wc)), float(np.sqrt(max(Tc, 0.0)))
    if np.isnan(K):  # marginal: a line of fixed points
        K = Wc + max(Tc, 0.0)
        c2 = c3 = d1 = 0.0
        stab = "marginal"
        note = ("every K is a fixed point here (F(K) = K): K* is the input's own K^1, "
                "sigma_w^2 + sigma_b^2 for the unit-norm input")
        fps = ()
        unit_K = K
    else:
        c2, c3, d1 = _series(arch, K, sw, sb)
        stab = _stability_from_series(c2, c3, K)
        note = ""
        try:
            fps = tuple(fixed_points(arch, sw, sb, _known=(K,)))
        except ConvergenceError:   # not computable up to 1e10 (an oscillating activation): up to K_max
            fps = tuple(fixed_points(arch, sw, sb, K_max=max(K_max, 1e-6), _known=(K,)))
        unit_K = float(fixed_point_state(arch, sw, sb, errors="nan").K)
    chiJ = float(_expr(comp, KN.CHI_J, K, Wc, max(Tc, 0.0))[0])
    chiK = float(_expr(comp, KN.CHI_K, K, Wc, max(Tc, 0.0))[0])
    return CriticalPoint(sw, sb, float(K), chiJ, chiK, stab, c2, c3, d1, fps, unit_K, note)


def _stability_from_series(c2, c3, K):
    if not np.isfinite(c2):
        return "unknown"
    if abs(c2) > 1e-12:
        if K == 0 and c2 < 0:
            return "half-stable from below (K >= 0: repelling for every input K > 0)"
        return "half-stable from above" if c2 > 0 else "half-stable from below"
    if np.isfinite(c3) and c3 > 0:
        return "stable (algebraic)"
    if np.isfinite(c3) and c3 < 0:
        return "unstable"
    return "marginal"


# ---------------------------------------------------------------------------
# Correlation length and phase diagrams.
# ---------------------------------------------------------------------------
def correlation_length(arch=None, sigma_w=None, sigma_b=None, K0=None, errors="raise", **arch_kwargs):
    """xi = 1 / |log chi_J*| (inf on the critical line; J^{l0,l} ~ exp(-l/xi) off it).

    xi is inf where chi_J* = 1 to within rounding, |chi_J* - 1| <= 8 machine
    epsilons (:data:`XI_CRITICAL_TOL`): a critical point typed in decimals,
    e.g. ReLU at sigma_w = sqrt(2), is 1e-16 off the line.

    Where K^l diverges chi_J* is the limit of chi_J^l (for the everywhere- or
    subcritical architectures that limit is 1 and xi = inf).
    """
    st = fixed_point_state(arch, sigma_w, sigma_b, K0, errors=errors, **arch_kwargs)
    xi = _xi(st.chi_J)
    return float(xi) if np.ndim(xi) == 0 else xi


# |chi_J* - 1| at or below this is chi_J* = 1 within rounding (sigma_w = sqrt(2)
# for ReLU is 2.0000000000000004 after squaring): xi = inf there, not 2^52
XI_CRITICAL_TOL = 8 * np.finfo(float).eps


def _xi(X):
    """1 / |log chi_J*|, inf where |chi_J* - 1| <= XI_CRITICAL_TOL (NaN stays NaN)."""
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        xi = 1.0 / np.abs(np.log(X))
    return np.where(np.abs(X - 1.0) <= XI_CRITICAL_TOL, np.inf, xi)


# Phase codes of :attr:`PhaseDiagram.phase` (int8); chi_J* is chi_J at the fixed point K*.
#: phase code -1, "ordered": chi_J* < 1 (perturbations and gradients shrink with depth)
PHASE_ORDERED = -1
#: phase code 0, "critical": |chi_J* - 1| <= tol (``phase_diagram``'s ``tol``)
PHASE_CRITICAL = 0
#: phase code 1, "chaotic": chi_J* > 1 (also where K* = inf and chi_J^l has that limit, e.g. ReLU
#: with sigma_w^2 > 2)
PHASE_CHAOTIC = 1
#: phase code 2, "divergent": K* = inf and chi_J^l has no finite limit there, so no phase follows
PHASE_DIVERGENT = 2
#: phase code 3, "undetermined": the fixed-point solve failed (no limit: an oscillating map, the
#: iteration cap, NaN in the recursion); chi_J* and K* are NaN
PHASE_UNDETERMINED = 3
#: phase code -> name (the labels in CSV and JSON, :func:`phase_names`):
#: {-1: 'ordered', 0: 'critical', 1: 'chaotic', 2: 'divergent', 3: 'undetermined'}
PHASES = {PHASE_ORDERED: "ordered", PHASE_CRITICAL: "critical", PHASE_CHAOTIC: "chaotic",
          PHASE_DIVERGENT: "divergent", PHASE_UNDETERMINED: "undetermined"}


def phase_names(codes) -> np.ndarray:
    """Names of phase codes (:data:`PHASES`) as a str array of the same shape."""
    codes = np.asarray(codes)
    out = np.full(codes.shape, "undetermined", dtype="<U12")
    for code, name in PHASES.items():
        out[codes == code] = name
    return out


@dataclass(frozen=True, repr=False)
class PhaseDiagram(Result):
    """chi_J*, K*, chi_K*, xi and the phase on a (sigma_w, sigma_b) grid.

    Arrays have shape (len(sigma_w), len(sigma_b)), ``[i, j]`` at
    (sigma_w[i], sigma_b[j]). ``phase`` (int8) holds the codes of
    :data:`PHASES`: -1 ordered (chi_J* < 1), 0 critical (|chi_J* - 1| <=
    ``tol``), 1 chaotic (chi_J* > 1), 2 divergent (K* = inf with no finite
    limit of chi_J^l), 3 undetermined (the solve failed; chi_J*, K* are NaN).
    :meth:`phase_names` gives the names, :meth:`plot` the figure, with the
    critical line and points inside the grid (:meth:`critical_line_curves`,
    :meth:`critical_points_inside`).
    """

    architecture: Architecture
    sigma_w: np.ndarray
    sigma_b: np.ndarray
    chi_J: np.ndarray
    K: np.ndarray
    chi_K: np.ndarray
    xi: np.ndarray
    phase: np.ndarray
    everywhere_critical: bool = False
    tol: float = field(default=1e-9)

    def phase_names(self) -> np.ndarray:
        """The phase of every grid point by name (str array, shape of ``phase``)."""
        return phase_names(self.phase)

    def counts(self) -> dict:
        """Number of grid points in each phase, by name (every name of :data:`PHASES`)."""
        return {name: int(np.count_nonzero(self.phase == code)) for code, name in PHASES.items()}

    def _repr_extra(self):
        return {"counts": ", ".join(f"{k} {v}" for k, v in self.counts().items() if v)}

    def _table(self):
        SW, SB = np.meshgrid(self.sigma_w, self.sigma_b, indexing="ij")
        return {"sigma_w": SW.ravel(), "sigma_b": SB.ravel(), "K": self.K.ravel(),
                "chi_J": self.chi_J.ravel(), "chi_K": self.chi_K.ravel(), "xi": self.xi.ravel(),
                "phase": self.phase_names().ravel()}

    def to_dict(self) -> dict:
        """Fields as strict JSON data, with ``phase_names`` (the labels) next to the codes."""
        out = super().to_dict()
        out["phase_names"] = self.phase_names().tolist()
        out["phase_codes"] = {str(k): v for k, v in PHASES.items()}
        return out

    def critical_line_curves(self, n=400) -> list:
        """The critical line inside the grid's window, as polylines [(sigma_w, sigma_b), ...].

        :func:`critical_line` solved on ``n`` values of sigma_w across the grid and
        on ``n`` of sigma_b: solving sigma_b(sigma_w) misses vertical pieces (ReLU:
        sigma_w = sqrt 2 for every sigma_b), solving sigma_w(sigma_b) misses
        horizontal ones, so each direction gives a curve where it has points.
        Points outside the window are NaN, and a curve is broken (a NaN) where
        its solved coordinate jumps by more than a tenth of the window (another
        branch). A direction whose solve raises gives no curve. Empty where the
        architecture is everywhere critical.
        """
        if self.everywhere_critical:
            return []
        sw0, sw1 = float(self.sigma_w.min()), float(self.sigma_w.max())
        sb0, sb1 = float(self.sigma_b.min()), float(self.sigma_b.max())
        curves = []
        for given in ("sigma_w", "sigma_b"):
            lo, hi = (sw0, sw1) if given == "sigma_w" else (sb0, sb1)
            if hi <= lo or hi < 0:
                continue
            grid = np.linspace(max(lo, 0.0), hi, n)
            try:
                cl = critical_line(self.architecture, **{given: grid})
            except (ValueError, RuntimeError):
                continue
            x, y = np.array(cl.sigma_w, dtype=float), np.array(cl.sigma_b, dtype=float)
            inside = np.isfinite(x) & np.isfinite(y) & (x >= sw0) & (x <= sw1) & (y >= sb0) & (y <= sb1)
            x[~inside], y[~inside] = np.nan, np.nan
            solved = y if given == "sigma_w" else x
            span = (sb1 - sb0) if given == "sigma_w" else (sw1 - sw0)
            jump = np.flatnonzero(np.abs(np.diff(solved)) > 0.1 * max(span, 1e-12))
            x, y = np.insert(x, jump + 1, np.nan), np.insert(y, jump + 1, np.nan)
            if np.count_nonzero(np.isfinite(x)) >= 2:
                curves.append((x, y))
        return curves

    def critical_points_inside(self) -> list:
        """The critical points (:func:`critical_point`) that lie inside the grid's window, edges
        included; empty where there is none, where the solve raises, or where the architecture
        is everywhere critical."""
        if self.everywhere_critical:
            return []
        try:
            points = critical_point(self.architecture).points
        except (ValueError, RuntimeError):
            return []
        sw, sb = self.sigma_w, self.sigma_b
        return [p for p in points if sw.min() <= p.sigma_w <= sw.max() and sb.min() <= p.sigma_b <= sb.max()]

    def plot(self, ax=None, line=True, cmap="RdBu_r", *, path=None, points=True, dpi=300, title=None,
             limit=None):
        """The figure of :func:`meanfield.plotting.plot_phase_diagram` (see there); returns the Axes.

        log10 chi_J* on one symmetric colour scale centred on chi_J* = 1
        (``limit``: a cap on |log10 chi_J*|, default the grid's largest), the critical line and critical points inside the grid, the phase
        names, divergent/undetermined points hatched grey; ``path`` saves it
        (.pdf/.svg/.eps vector, .png at ``dpi``).
        """
        from ..plotting import plot_phase_diagram

        return plot_phase_diagram(self, ax=ax, path=path, line=line, points=points, cmap=cmap, dpi=dpi,
                                  title=title, limit=limit)


def phase_diagram(arch=None, sigma_w=None, sigma_b=None, tol=1e-9, errors="nan", **arch_kwargs) -> PhaseDiagram:
    """chi_J*, xi and the phase on the grid sigma_w x sigma_b (1-D arrays).

    Points where the fixed-point solve fails are NaN with phase
    'undetermined' (``errors='raise'`` to raise instead); points where K*
    diverges and chi_J^l has no finite limit are 'divergent' (see
    :data:`PHASES`). ``tol`` (0 <= tol <= 1) is the half-width of the band
    |chi_J* - 1| <= tol marked critical. Everywhere-critical architectures are
    marked critical throughout (where the solve succeeds).
    """
    arch, _ = prepare(arch, arch_kwargs)
    if sigma_w is None or sigma_b is None:
        raise ValueError("phase_diagram needs 1-D arrays sigma_w= and sigma_b=")
    sw = check_nonnegative("sigma_w", sigma_w)
    sb = check_nonnegative("sigma_b", sigma_b)
    warn_if_approximate("phase_diagram", arch, sb)
    if sw.ndim != 1 or sb.ndim != 1 or sw.size == 0 or sb.size == 0:
        raise ValueError(f"phase_diagram takes non-empty 1-D sigma_w and sigma_b grids, got shapes "
                         f"{sw.shape} and {sb.shape}")
    check_real("tol", tol, minimum=0.0, maximum=1.0)
    tol = float(tol)
    SW, SB = np.meshgrid(sw, sb, indexing="ij")
    st = fixed_point_state(arch, SW, SB, errors=errors)
    regime = _regime(arch)
    X = st.chi_J
    xi = _xi(X)
    phase = np.where(np.abs(X - 1.0) <= tol, PHASE_CRITICAL,
                     np.where(X < 1.0, PHASE_ORDERED, PHASE_CHAOTIC)).astype(np.int8)
    if regime == "everywhere_critical":
        phase[:] = PHASE_CRITICAL
        xi = np.full(X.shape, np.inf)
    # NaN compares False: without these the NaN points would read as chaotic
    undefined = ~np.isfinite(X)
    phase[undefined & (st.status == ST_INF)] = PHASE_DIVERGENT
    phase[undefined & (st.status != ST_INF)] = PHASE_UNDETERMINED
    xi = np.where(undefined, np.nan, xi)
    return PhaseDiagram(arch, sw, sb, X, st.K, st.chi_K, xi, phase, regime == "everywhere_critical", tol)
