"""Gaussian expectations: symbolic placeholders, fast quadrature, mpmath references.

Everything in mean-field theory is an expectation over a Gaussian
preactivation. Activations with closed forms (see :mod:`meanfield.activations`)
return them directly; for every other activation the symbolic layer keeps an
unevaluated :class:`GaussianExpectation` (one input) or
:class:`GaussianExpectation2` (two correlated inputs). These are real sympy
functions:

- they differentiate by Price's theorem (Price 1958; also Roberts, Yaida &
  Hanin 2022, eq. 4.39),
  ``d/dK E[f(h)] = 1/2 E[f''(h)]`` (f'' in the weak sense: delta terms at
  kinks and jumps included, see below), ``d/dK12 E[f(u, v)] = E[d_u d_v f]``,
  so chi_K, the series coefficients and chi_Delta exist for any activation;
- ``.evalf()`` evaluates them with mpmath at the requested precision;
- :func:`meanfield.symbolic.lambdify` turns them into fast numpy calls.

Quadrature engine
-----------------
E[f(h)], h ~ N(0, K), is written with z = h / sqrt(K) and the line split at
z = 0 and at the breakpoints of f (kinks and jumps, located by
:func:`pieces` for sympy integrands): the two tails are integrated by the
exp-sinh rule ``u = exp(pi/2 sinh t)`` from their breakpoint, the finite
pieces by the tanh-sinh rule, trapezoid in t with step 1/32. The rules are
log-uniform near their end points, so they resolve structure at |h| ~ 1
(and at the breakpoints) up to sqrt(K) ~ 1e3; beyond, the one-point engine
also splits at h = +-1, +-8, +-40 (:func:`meanfield.quadrature_rule.scale_cuts`: the exp-sinh nodes
are a factor ~2 apart in h there, which had left errors up to 2e-13 in
E[phi'^2] of SiLU and GELU-tanh at K = 1e12..1e22).

The even nodes form the rule with twice the step, which gives an error
estimate for free: the base rule is accepted when it is below 1e-11 of
E|f(h)| (its own error is then ~1e-16; 1e-8 had let a 2e-13 error through
for SiLU' at K = 1e15, see QUAD_TOL_BASE_1D), else the step of every piece is
halved, up to 10 times (~250k nodes per piece), until two levels agree to
1e-10 of E|f(h)|. The rule is one module, :mod:`meanfield.quadrature_rule`:
:func:`expect` runs its numpy engine, and :mod:`meanfield._quadrature_numba`
compiles its node loops once for every integrand of the generated numba
modules, where a non-converged value is NaN (which the solvers report).
Against mpmath at 30 digits it is accurate to 1e-10 relative, and mostly ~1e-15, for tanh, SiLU, softplus, SELU/ELU written as
Piecewise, Max(x - 1, 0) and sin(x) over K in [1e-6, 1e6]
(tests/test_user_activations.py; the table is in docs/theory.md).

Derivatives in K follow Price's theorem in the weak sense: the pieces'
second derivative plus the delta terms at the breakpoints (jumps J0 of f
and J1 of f' at c contribute (J1 + J0 c / K) p_K(c) / 2), which equals the
derivative on the Gaussian weight, E[f(h)(h^2 - K)] / (2 K^2)
(:func:`expect_dK`), without its cancellation at small K.

The two-point rule of :func:`expect2` is the engine nested in itself: the
outer level over u split at u = 0 and the kinks of f in u, the inner one
(v given u) at v = 0 and the kinks in v, each refined at most
QUAD_MAX_LEVEL_2D = 3 times. The outer level's error is measured against
E|f(u, v)| (its integrand carries E[|f| | u] as its scale), not against
E|E[f | u]|, which vanishes where f cancels given u (C(0) = 0 of a DKS
activation); an inner integral that did not converge passes its error on,
and counts only with its Gaussian weight. The compiled modules run the
same nested engine (:func:`meanfield._quadrature_numba.two_point`, the
integrand a C function named to it by symbol). Two-point K-derivatives that would need delta terms on
a line (a kinked factor differentiated twice) are NaN, not silently wrong.

Accuracy limits worth knowing: the error is relative to E|f(h)|, so a
result much smaller than E|f(h)| (a cancelling integrand) is only accurate
in that absolute sense. The one case the package meets is chi_Delta of
tanh-, SiLU- and softplus-like activations at large K, where the pointwise
integrand phi''^2 + phi' phi''' integrates to ~0 at leading order: relative
error up to 6e-10 for tanh and 2e-8 for softplus at K = 1e6 (1e-12 up to
K = 1e4), absolute error below 3e-14 of E|phi''^2| + E|phi' phi'''|
(tests/test_activations.py).
"""
from __future__ import annotations

import functools

import numpy as np
import sympy as sp
import mpmath as mp

from . import quadrature_rule
from .stable_forms import softplus_numpy, stable_form
from .symbols import x as _x

__all__ = [
    "GaussianExpectation",
    "GaussianExpectation2",
    "RULE_U",
    "RULE_W",
    "expect",
    "expect2",
    "expect_dK",
    "quad1",
    "pieces",
    "piecewise_form",
    "breakpoints",
    "mp_expect",
    "mp_expect2",
    "numpy_function",
    "numeric_expectations",
    "piece_at",
    "QUAD_TOL_BASE",
    "QUAD_TOL_BASE_1D",
    "QUAD_TOL_REFINED",
]


# ---------------------------------------------------------------------------
# The quadrature rule (shared by numpy and numba code).
# ---------------------------------------------------------------------------
def _exp_sinh_grid(step: float, t_min: float = -6.0, t_max: float = 1.6):
    """Nodes, weights and grid indices k (t = t_min + k step) of the exp-sinh rule."""
    t = np.arange(t_min, t_max + step / 2, step)
    u = np.exp(0.5 * np.pi * np.sinh(t))
    du_dt = u * 0.5 * np.pi * np.cosh(t)
    w = step * du_dt * np.exp(-0.5 * u * u) / np.sqrt(2.0 * np.pi)
    keep = w > 1e-300
    return u[keep].copy(), w[keep].copy(), np.nonzero(keep)[0]


def _exp_sinh_rule(step: float = 1.0 / 32, t_min: float = -6.0, t_max: float = 1.6):
    """Nodes u > 0 and weights w with sum w [f(u) + f(-u)] ~ E[f(z)], z ~ N(0, 1).

    t_max = 1.6 puts the last node at u ~ 19.6 (phi(u) ~ 1e-84); t_min = -6
    puts the first at u ~ 1e-137, so both tails are below double precision.
    """
    u, w, _ = _exp_sinh_grid(step, t_min, t_max)
    return u, w


#: exp-sinh nodes u_i > 0 and weights w_i (float64, read-only): see module docs.
RULE_U, RULE_W = _exp_sinh_rule()
RULE_U.setflags(write=False)
RULE_W.setflags(write=False)

#: Convergence test. The estimate delta = |I_h - I_2h| / E|f| (I_2h: the even
#: nodes, i.e. the rule with twice the step) is about the error of I_2h. The
#: trapezoid rule in t converges exponentially for smooth f, so the base rule
#: is accepted when delta <= 1e-8 (its own error is then below ~1e-15 of E|f|
#: in the cases measured in tests/test_gaussian.py). A refined
#: level is accepted only when delta <= 1e-10, which bounds the error of the
#: accepted value by ~1e-10 of E|f| even where convergence is slow.
QUAD_TOL_BASE = 1e-8
QUAD_TOL_REFINED = 1e-10
#: The one-point engine accepts its base rule only at delta <= 1e-11: for
#: step-like integrands at large K (SiLU'^2, sigmoid^2, tanh^2 at K >= 1e8,
#: whose structure at |h| ~ 1 is a tiny part of E|f|) the rule is not yet in
#: its exponential regime there, and delta = 5e-10 came with an error of
#: 2e-13 (SiLU' at K = 1e15), not the ~1e-19 that delta^2 would suggest; one
#: halving brings it to <= 3e-16. Smooth integrands at moderate K have
#: delta ~1e-12..1e-16 at the base rule and are unaffected. (The nested
#: two-point engine keeps 1e-8 at both levels: there a halving costs 4x.)
QUAD_TOL_BASE_1D = 1e-11
#: Two-point (nested) engine: the most halvings of the step at either level.
#: Bounds the work per point to (2^3 x ~490 nodes)^2 ~ 1.5e7 evaluations per
#: pair of pieces (the one-point bound, 10, nested in itself would be ~2.5e11:
#: a hang, not a bound).
QUAD_MAX_LEVEL_2D = 3


# ---------------------------------------------------------------------------
# The one-point engine: piecewise exp-sinh / tanh-sinh with nested refinement.
# ---------------------------------------------------------------------------
#: Step of the level-0 rule in t, the t ranges of the exp-sinh (tails) and
#: tanh-sinh (finite pieces) maps, the largest |z| = |h| / sqrt(K) kept as a
#: breakpoint (phi(40) ~ 1e-348 underflows), the tolerances and the deepest
#: level (step 1/32768: ~250k nodes per piece).
QUAD_STEP = 1.0 / 32
QUAD_ES_T = (-6.0, 1.6)
QUAD_TS_T = 4.5
QUAD_ZMAX = 40.0
QUAD_MAX_LEVEL = 10



@functools.lru_cache(maxsize=1)
def quad_tables():
    """The base rule's node tables (es_tab, ts_tab) for the package's rule constants
    (read-only; the compiled engines take them as arguments)."""
    es_tab, ts_tab = quadrature_rule.base_tables(QUAD_STEP, QUAD_ES_T[0], QUAD_ES_T[1], QUAD_TS_T)
    es_tab.setflags(write=False)
    ts_tab.setflags(write=False)
    return es_tab, ts_tab


def quad1(f, s, cuts=(), max_level=None):
    """E[f(s z)], z ~ N(0, 1), by the piecewise engine (numpy).

    Returns (value, E|f|, relative error estimate, converged). ``cuts`` are
    the breakpoints of f in h (kinks and jumps); see :func:`expect`.
    ``max_level``: the most halvings of the step (default QUAD_MAX_LEVEL).
    """
    cuts = np.asarray(cuts, dtype=np.float64).ravel()

    def F_(h):
        v = f(h)
        return v, np.abs(v), None
    level = QUAD_MAX_LEVEL if max_level is None else max_level
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        return quadrature_rule.quad_levels(float(s), quadrature_rule.scale_cuts(cuts, float(s)), F_, QUAD_STEP, QUAD_ES_T[0],
                             QUAD_ES_T[1], QUAD_TS_T, QUAD_ZMAX, level, QUAD_TOL_BASE_1D, QUAD_TOL_REFINED)


def _inner_batch(f, u, m, sd, cv):
    """The inner level of :func:`expect2` for many outer nodes at once.

    For each u[i]: E[f(u, v) | u] with v = m[i] + sd z, split at v in ``cv``, by the engine of
    :func:`quad1` at most QUAD_MAX_LEVEL_2D halvings. Rows whose breakpoint sets have the same
    size share one evaluation of ``f`` on a (rows x nodes) array for the base rule; a row the
    base rule does not settle (refinement, non-finite values) is computed by :func:`quad1` itself.
    Returns (value, scale, error) arrays: the outer level's integrand (error = the inner
    estimate times the scale where the inner level did not converge, else 0).
    """
    n = u.size
    val, scale, err = np.empty(n), np.empty(n), np.zeros(n)
    redo = []

    def one(i):
        r = quad1(lambda h: f(np.full(h.shape, u[i]), m[i] + h), sd, cv - m[i], QUAD_MAX_LEVEL_2D)
        val[i], scale[i] = r[0], r[1]
        err[i] = 0.0 if r[3] else r[2] * r[1]

    if not sd > 0.0 or n == 0:
        for i in range(n):
            one(i)
        return val, scale, err
    zcs = [quadrature_rule.breaks(sd, cv - m[i], QUAD_ZMAX) for i in range(n)]
    groups = {}
    for i, zc in enumerate(zcs):
        groups.setdefault(zc.size, []).append(i)
    es_tab, ts_tab = quad_tables()
    eu, ew = es_tab[:, 0], es_tab[:, 1]
    sk, ck, wk = ts_tab[:, 0], ts_tab[:, 1], ts_tab[:, 2]
    for size, rows in groups.items():
        rows = np.array(rows)
        Z = np.array([zcs[i] for i in rows])          # (g, size) sorted breakpoints in z
        lo, hi = Z[:, :1], Z[:, -1:]
        zs = [lo - eu, hi + eu]
        ws = [ew * np.exp(lo * eu - 0.5 * lo * lo), ew * np.exp(-hi * eu - 0.5 * hi * hi)]
        seg = [np.arange(eu.size) % 2, np.arange(eu.size) % 2]  # table row k: segment k % 2
        for j in range(size - 1):
            a, b = Z[:, j:j + 1], Z[:, j + 1:j + 2]
            L = b - a
            zz = np.where(sk <= 0.5, a + L * sk, b - L * ck)
            zs.append(zz)
            ws.append(L * wk * np.exp(-0.5 * zz * zz) * 0.3989422804014327)
            seg.append(np.arange(sk.size) % 2)
        z, w = np.concatenate(zs, axis=1), np.concatenate(ws, axis=1)
        odd = np.concatenate(seg).astype(np.float64)
        even = 1.0 - odd
        v = f(np.broadcast_to(u[rows, None], z.shape), m[rows, None] + sd * z)
        keep = w > 0.0  # as the engine: nodes of zero weight are not evaluated (inf * 0)
        vw = np.where(keep, v * w, 0.0)
        aw = np.abs(vw)  # w >= 0: |v w| = |v| w exactly
        # I_(-1) from the even nodes (twice the step), I_0 = I_(-1) / 2 + the odd nodes' sum
        t0, a0 = 2.0 * (vw @ even), 2.0 * (aw @ even)
        t1, a1 = 0.5 * t0 + vw @ odd, 0.5 * a0 + aw @ odd
        diff = np.abs(t1 - t0)
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = np.where(a1 > 0.0, diff / np.where(a1 > 0.0, a1, 1.0), diff)
        done = np.isfinite(t1) & (delta <= QUAD_TOL_BASE)
        val[rows[done]], scale[rows[done]] = t1[done], a1[done]
        redo += list(rows[~done])
    for i in redo:
        one(i)
    return val, scale, err


def interpreted_expect(f, cuts):
    """K -> E[f(h)], h ~ N(0, K), for the interpreted twin of a compiled module.

    ``f`` is the numpy twin of a compiled integrand (the same sympy expression,
    printed for numpy arrays), ``cuts`` its breakpoints (float64 array). The
    engine is :func:`meanfield.quadrature_rule.quad_levels`, the numpy form of the
    compiled :func:`meanfield._quadrature_numba.scalar_engine` (same nodes, weights and convergence test; the
    sums in another order, so the two agree to rounding): one vectorised
    evaluation of f for the base rule instead of ~500 scalar calls. NaN where
    K is not >= 0 or the rule did not converge, as the compiled function.
    """
    q, scale_cuts = quadrature_rule.quad_levels, quadrature_rule.scale_cuts
    rule = (QUAD_STEP, QUAD_ES_T[0], QUAD_ES_T[1], QUAD_TS_T, QUAD_ZMAX, QUAD_MAX_LEVEL, QUAD_TOL_BASE_1D, QUAD_TOL_REFINED)
    sqrt, nan = np.sqrt, np.nan

    def F_(h):
        v = f(h)
        if np.shape(v) != h.shape:  # a constant integrand
            v = np.broadcast_to(np.asarray(v, dtype=np.float64), h.shape)
        return v, np.abs(v), None

    @functools.lru_cache(maxsize=4096)  # the solvers ask for one K several times (F, chi_J, derivatives)
    def E(K):
        if not K >= 0.0:
            return nan
        val, _, _, ok = q(sqrt(K), scale_cuts(cuts, sqrt(K)), F_, *rule)
        return val if ok else nan

    return E


def _outer_cuts(cu, cv, a, sd, s1):
    """The outer level's breakpoints in u: ``cu``, and, for a nearly degenerate pair (conditional width sd
    below a tenth of the spread |a| s1 of the conditional mean a u), also u = c / a for the breakpoints
    c != 0 of ``cv``: there E[f(u, v) | u] follows g(a u)'s kinks, sharpened to a width sd / |a| in u,
    and the outer rule does not converge across a kink it was not told of (hardtanh at rho = -1,
    parallel inputs of different norms, was refused). The compiled engine
    (:func:`meanfield._quadrature_numba.two_point`) splits the same way."""
    if not (a != 0.0 and sd < 0.1 * abs(a) * s1):
        return cu
    extra = cv[cv != 0.0] / a
    extra = extra[~np.isin(extra, cu)]   # equal norms: g's kinks are f's own
    return np.concatenate((cu, extra)) if extra.size else cu


def interpreted_expect2(f, cu, cv):
    """(K1, K2, K12) -> E[f(u, v)] for the interpreted twin of a compiled module: the compiled
    :func:`meanfield._quadrature_numba.two_point` with the numpy engine of
    :func:`expect2` (all inner integrals of an outer level at once, :func:`_inner_batch`).
    ``f``: the numpy twin of the integrand; ``cu``, ``cv``: its breakpoints in u and in v
    (``cv`` with 0, as the compiled module's). NaN where the compiled function gives NaN."""
    q = quadrature_rule.quad_levels
    rule = (QUAD_STEP, QUAD_ES_T[0], QUAD_ES_T[1], QUAD_TS_T, QUAD_ZMAX, QUAD_MAX_LEVEL_2D, QUAD_TOL_BASE, QUAD_TOL_REFINED)
    sqrt, nan = np.sqrt, np.nan

    @functools.lru_cache(maxsize=1024)
    def E(K1, K2, K12):
        if not (K1 >= 0.0 and K2 >= 0.0 and K12 == K12):
            return nan
        d = sqrt(K1 * K2)
        rho = 0.0
        if d > 0.0:
            rho = min(1.0, max(-1.0, K12 / d))
        s1 = sqrt(K1)
        a = rho * sqrt(K2) / s1 if s1 > 0.0 else 0.0
        sd = sqrt(max(K2 * (1.0 - rho * rho), 0.0))

        def outer(h1):
            uu = np.ravel(h1)
            return _inner_batch(f, uu, a * uu, sd, cv)

        val, _, _, ok = q(s1, _outer_cuts(cu, cv, a, sd, s1), outer, *rule)
        return val if ok else nan

    return E


def _not_converged(what, n):
    import warnings

    warnings.warn(f"{what}: the exp-sinh quadrature did not converge for {n} value(s) "
                  "(oscillatory or kinked integrand?); the result may be inaccurate",
                  RuntimeWarning, stacklevel=3)


def numpy_function(f):
    """A vectorised float64 numpy function of a sympy ``Lambda`` (or of an expression in x).

    Values that overflow in float64 arithmetic (``log(1 + exp(x))`` at x = 800,
    the SiLU derivative's ``inf / inf`` at x = -800, ...) come back as inf or
    NaN from numpy; those entries, and only those, are recomputed with mpmath
    from the same expression, so the quadrature sees the true values over the
    whole range the rule samples (|h| up to ~20 sqrt(K)). An entry that is
    not real even in mpmath (a log of a negative number, say) stays NaN.
    """
    f = _as_lambda(f, 1)
    variables = f.variables
    # overflow-free where a rewrite exists, so mpmath (~1e4 times slower) is only the last resort
    fast = sp.lambdify(variables, stable_form(f.expr), modules=[{"_softplus": softplus_numpy}, "numpy", "scipy"])
    slow = None

    def g(*arrays):
        nonlocal slow
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in arrays))
        with np.errstate(all="ignore"):
            out = np.array(np.broadcast_to(np.asarray(fast(*arrays), dtype=np.float64), arrays[0].shape))
        bad = ~np.isfinite(out)
        if bad.any():
            if slow is None:
                slow = sp.lambdify(variables, f.expr, modules="mpmath")
            with mp.workdps(30):
                for idx in zip(*np.nonzero(bad)):
                    try:
                        val = slow(*(mp.mpf(float(a[idx])) for a in arrays))
                        val = mp.mpmathify(val)
                        out[idx] = float(val.real) if mp.im(val) == 0 else np.nan
                    except (ValueError, ZeroDivisionError, TypeError, OverflowError):
                        out[idx] = np.nan
        return out

    return g


def _check_variances(K1, K2=None, K12=None, names=("K", "K2", "K12")):
    if np.any(K1 < 0):
        raise ValueError(f"{names[0]} must be a variance >= 0, got {K1!r}")
    if K2 is None:
        return
    if np.any(K2 < 0):
        raise ValueError(f"{names[1]} must be a variance >= 0, got {K2!r}")
    with np.errstate(invalid="ignore"):
        if np.any(np.abs(K12) > np.sqrt(K1 * K2) * (1 + 1e-12) + 1e-300):
            raise ValueError(f"{names[2]} must satisfy |K12| <= sqrt(K1 K2) (a covariance), got {K12!r}")


def _relative(diff, scale):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, np.abs(diff) / scale, np.abs(diff))


def expect(f, K, cuts=()):
    """E[f(h)] for h ~ N(0, K), by the piecewise exp-sinh / tanh-sinh engine.

    The real line is split at h = 0 and at the breakpoints ``cuts`` (kinks
    and jumps of f; :func:`breakpoints` finds them for a sympy expression):
    the two tails are integrated with the exp-sinh rule from their
    breakpoint, the finite pieces with the tanh-sinh rule, all with step
    1/32 in t. The even nodes form the rule with twice the step, which gives
    an error estimate; where it exceeds 1e-11 of E|f(h)| (an integrand
    oscillating faster than the rule resolves, e.g. sin(h) at K = 1e4) the
    step of every piece is halved until two successive levels agree to 1e-10
    of E|f(h)|, at most 10 times (~250k nodes per piece); a RuntimeWarning
    says when even that did not converge. The compiled solvers run the same
    engine (:mod:`meanfield._quadrature_numba`).

    Parameters
    ----------
    f : callable
        Vectorised numpy function of one array argument.
    K : array_like
        Variance(s) >= 0; broadcasts. K = 0 gives f(0).
    cuts : sequence of float, optional
        Breakpoints of f in h (0 is always one).

    Returns
    -------
    numpy.ndarray (float64) with the shape of K.

    Raises
    ------
    ValueError
        If any K < 0 (NaN passes through as NaN).
    """
    K = np.asarray(K, dtype=np.float64)
    _check_variances(K)
    out = np.empty(K.size)
    failed = 0
    for i, k in enumerate(K.ravel()):
        if np.isnan(k):
            out[i] = np.nan
            continue
        val, _, _, ok = quad1(f, np.sqrt(k), cuts)
        out[i] = val
        failed += not ok and np.isfinite(val)
    if failed:
        _not_converged("expect", failed)
    return out.reshape(K.shape)


def expect2(f, K1, K2, K12, cuts=((), ())):
    """E[f(u, v)] for (u, v) zero-mean Gaussian, Var u = K1, Var v = K2, Cov = K12.

    Nested engines (:func:`quad1`): u = sqrt(K1) z1 and, given u,
    v ~ N(m, K2 (1 - rho^2)) with m = rho sqrt(K2) z1 and
    rho = K12 / sqrt(K1 K2) (clipped to [-1, 1]). The outer integral is split
    at u = 0 and at ``cuts[0]``, the inner one at v = 0 and at ``cuts[1]``
    (breakpoints of f in u and in v), so kinks anywhere are integrated
    piecewise; both levels refine (at most QUAD_MAX_LEVEL_2D halvings) until
    their error estimates pass, relative to E|f(u, v)| (see the module
    docs), and a RuntimeWarning says where they did not. ``f`` is a vectorised
    numpy function of two arrays. Broadcasts over K1, K2, K12 (one nested
    rule per point). ValueError if K1 or K2 < 0 or |K12| > sqrt(K1 K2).
    """
    K1, K2, K12 = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (K1, K2, K12)))
    _check_variances(K1, K2, K12, names=("K1", "K2", "K12"))
    cu = np.asarray(cuts[0], dtype=np.float64).ravel()
    cv = np.concatenate([[0.0], np.asarray(cuts[1], dtype=np.float64).ravel()])
    out = np.empty(K1.shape)
    failed = 0
    for idx in np.ndindex(K1.shape):
        k1, k2, k12 = K1[idx], K2[idx], K12[idx]
        if np.isnan(k1 + k2 + k12):
            out[idx] = np.nan
            continue
        denom = np.sqrt(k1 * k2)
        rho = 0.0 if denom == 0 else float(np.clip(k12 / denom, -1.0, 1.0))
        s1 = np.sqrt(k1)
        a = rho * np.sqrt(k2) / s1 if s1 > 0 else 0.0
        sd_v = np.sqrt(max(k2 * (1.0 - rho * rho), 0.0))

        def inner(u, m):
            # E[f(u, v) | u] and E[|f(u, v)| | u], v = m + sd_v z, split at v = 0 and the cuts in v
            return quad1(lambda h: f(np.full(h.shape, u), m + h), sd_v, cv - m, QUAD_MAX_LEVEL_2D)

        def outer(h1):
            # all inner integrals of this outer level at once (an inner level that did not
            # converge passes on its error estimate)
            uu = np.ravel(h1)
            v_, s_, e_ = _inner_batch(f, uu, a * uu, sd_v, cv)
            return v_.reshape(h1.shape), s_.reshape(h1.shape), e_.reshape(h1.shape)

        # the outer level's error is measured against E|f| (the inner scales), not
        # against E|E[f | u]|, which vanishes where f cancels given u (E[phi(u) phi(v)]
        # at zero correlation with E[phi] = 0): refining against that never converged
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            val, _, _, ok = quadrature_rule.quad_levels(s1, cu, outer, QUAD_STEP, QUAD_ES_T[0], QUAD_ES_T[1], QUAD_TS_T,
                                                QUAD_ZMAX, QUAD_MAX_LEVEL_2D, QUAD_TOL_BASE, QUAD_TOL_REFINED)
        out[idx] = val
        failed += not ok and np.isfinite(val)
    if failed:
        _not_converged("expect2", failed)
    return out


# ---------------------------------------------------------------------------
# Kinks and jumps of sympy integrands.
# ---------------------------------------------------------------------------
#: functions rewritten as Piecewise so that their breakpoints can be located
KINKED_FUNCTIONS = (sp.Max, sp.Min, sp.Abs, sp.sign, sp.Heaviside)
#: functions whose breakpoints are not located (infinitely many, or a delta)
_UNSUPPORTED = (sp.floor, sp.ceiling, sp.frac, sp.Mod, sp.DiracDelta, sp.re, sp.im, sp.arg)


class Pieces:
    """A one-variable integrand in piecewise form with its breakpoints.

    ``expr``: the integrand with Max, Min, Abs, sign and Heaviside rewritten
    as Piecewise (folded to the top); ``cuts``: the sorted real breakpoints
    (sympy numbers) where a condition changes; ``jump0``/``jump1``: the jumps
    f(c+) - f(c-) and f'(c+) - f'(c-) there (sympy numbers).
    """

    __slots__ = ("var", "expr", "cuts", "jump0", "jump1")

    def __init__(self, var, expr, cuts, jump0, jump1):
        self.var, self.expr, self.cuts, self.jump0, self.jump1 = var, expr, cuts, jump0, jump1

    @property
    def float_cuts(self) -> tuple:
        return tuple(float(c) for c in self.cuts)

    def __repr__(self):
        return f"Pieces({self.expr}, cuts={self.cuts}, jump0={self.jump0}, jump1={self.jump1})"


def piecewise_form(expr, var):
    """``expr`` with Max, Min, Abs, sign, Heaviside rewritten as a (folded) Piecewise in ``var``."""
    expr = sp.sympify(expr)
    if not expr.has(*KINKED_FUNCTIONS, sp.Piecewise):
        return expr
    xr = sp.Dummy("xr", real=True)   # Abs and sign rewrite only for a real argument
    e = expr.subs(var, xr).rewrite(list(KINKED_FUNCTIONS), sp.Piecewise)
    return sp.piecewise_fold(e).subs(xr, var)


def _roots(d, var, expr):
    """Real roots of the condition d(var) = 0 (ValueError naming activation if unknown)."""
    d = sp.expand(d)
    if d.is_polynomial(var) and sp.degree(d, var) == 1:
        a, b = sp.Poly(d, var).all_coeffs()
        return [-b / a]
    sol = sp.solveset(d, var, sp.S.Reals)
    if isinstance(sol, sp.FiniteSet):
        return [r for r in sol if r.is_real]
    raise ValueError(f"activation: cannot locate the breakpoints of {expr} (condition {d} = 0 has "
                     f"solutions {sol}); use finitely many kinks given by polynomial conditions")


def piece_at(pw, var, t):
    """The expression of the piece of ``pw`` active at the number ``t``."""
    if not isinstance(pw, sp.Piecewise):
        return pw
    for e, cond in pw.args:
        if bool(cond.subs(var, t)):
            return piece_at(e, var, t)
    return sp.nan


def _one_sided(expr, var, c, t):
    """lim expr(x) as x -> c from the side of t (expr: one smooth piece)."""
    val = expr.subs(var, c)
    if not val.is_finite:
        val = sp.limit(expr, var, c, "+" if t > c else "-")
    return val


@functools.lru_cache(maxsize=1024)
def pieces(f: sp.Lambda) -> Pieces:
    """Breakpoints and jumps of the one-variable integrand ``Lambda(x, f(x))``.

    Raises ValueError (naming ``activation``) for functions whose
    breakpoints cannot be located (floor, Mod, DiracDelta, a condition whose
    solution set is infinite, ...).
    """
    (var,) = f.variables
    expr = piecewise_form(f.expr, var)
    bad = [a for a in expr.atoms(sp.Function) if isinstance(a, _UNSUPPORTED)]
    if bad:
        raise ValueError(f"activation: {bad[0].func.__name__} in {f.expr} is not supported (its kinks or "
                         "jumps cannot be located, or it is a delta function)")
    cuts = set()
    for rel in expr.atoms(sp.core.relational.Relational):
        cuts.update(_roots(rel.lhs - rel.rhs, var, f.expr))
    cuts = sorted(cuts, key=float)
    d1 = sp.diff(expr, var)
    j0, j1 = [], []
    for i, c in enumerate(cuts):
        lo = (cuts[i - 1] + c) / 2 if i else c - 1
        hi = (cuts[i + 1] + c) / 2 if i + 1 < len(cuts) else c + 1
        jumps = []
        for g in (expr, d1):
            right = _one_sided(piece_at(g, var, hi), var, c, hi)
            left = _one_sided(piece_at(g, var, lo), var, c, lo)
            jumps.append(sp.simplify(right - left))
        j0.append(jumps[0])
        j1.append(jumps[1])
    return Pieces(var, expr, tuple(cuts), tuple(j0), tuple(j1))


def two_point_cuts(f: sp.Lambda) -> tuple:
    """Breakpoints (floats) of a two-variable integrand in each variable: (cuts_u, cuts_v).

    Conditions that mix both variables are not located (refinement handles them)."""
    a, b = f.variables
    expr = piecewise_form(piecewise_form(f.expr, a), b)
    out = ([], [])
    for rel in expr.atoms(sp.core.relational.Relational):
        d = rel.lhs - rel.rhs
        for i, (v, w) in enumerate(((a, b), (b, a))):
            if d.has(v) and not d.has(w):
                out[i].extend(float(r) for r in _roots(d, v, f.expr))
    return tuple(sorted(set(out[0]))), tuple(sorted(set(out[1])))


def breakpoints(f) -> tuple:
    """Sorted real breakpoints (floats) of a sympy integrand (Lambda or expression in x)."""
    return pieces(_as_lambda(f, 1)).float_cuts


def expect_dK(f, K, cuts=()):
    """d/dK E[f(h)], h ~ N(0, K), on the Gaussian weight: E[f(h) (h^2 - K)] / (2 K^2).

    Needs no derivative of f, so it is exact for kinked or jumping f; it is
    the independent check of the Price-theorem derivative with jump terms
    that :class:`GaussianExpectation` uses. The integrand cancels at small K
    (E[f(0)(h^2 - K)] = 0): the absolute error is ~1e-16 E|f| / K.
    """
    K = np.asarray(K, dtype=np.float64)
    out = np.empty(K.size)
    for i, k in enumerate(K.ravel()):
        out[i] = quad1(lambda h, k=k: f(h) * (h * h - k), np.sqrt(k), cuts)[0] / (2 * k * k)
    return out.reshape(K.shape)


# ---------------------------------------------------------------------------
# mpmath references (the tests' independent route).
# ---------------------------------------------------------------------------
def mp_expect(f, K, dps: int = 40, cuts=()):
    """E[f(h)], h ~ N(0, K), by mpmath tanh-sinh quadrature at ``dps`` digits.

    ``f`` takes and returns mpmath numbers. The integration range is split at
    0 and at the scales 1 and sqrt(K) where activations and the Gaussian
    change, and at the breakpoints ``cuts`` of f (kinks, jumps), which keeps
    mpmath's adaptive rule honest at extreme K.
    """
    with mp.workdps(dps):
        K = mp.mpf(K)
        if K == 0:
            return f(mp.mpf(0))
        s = mp.sqrt(K)
        norm = 1 / mp.sqrt(2 * mp.pi * K)
        user_cuts = [sp.Float(c, dps + 5) if isinstance(c, sp.Basic) else c for c in cuts]
        cuts = {mp.mpf(0)}
        for c in (1, 3, 10, 30):
            cuts.update({mp.mpf(c), -mp.mpf(c)})
        for c in (1, 4, 8, 12):
            cuts.update({c * s, -c * s})
        cuts.update(mp.mpf(c) for c in user_cuts)
        pts = [-mp.inf] + sorted(c for c in cuts if abs(c) <= 40 * s) + [mp.inf]

        def g(h):
            return f(h) * mp.exp(-h * h / (2 * K)) * norm

        return mp.quad(g, pts)


def mp_expect2(f, K1, K2, K12, dps: int = 25):
    """E[f(u, v)] for a zero-mean Gaussian pair, by nested mpmath quadrature.

    Uses u = sqrt(K1) z1, v = sqrt(K2)(rho z1 + sqrt(1 - rho^2) z2). Slow
    (seconds per point): for tests only.
    """
    with mp.workdps(dps):
        K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
        rho = K12 / mp.sqrt(K1 * K2)
        rho = max(min(rho, mp.mpf(1)), mp.mpf(-1))
        c = mp.sqrt(max(1 - rho * rho, mp.mpf(0)))
        s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
        dens = lambda z: mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi)  # noqa: E731
        pts = [-mp.inf, -8, -3, -1, 0, 1, 3, 8, mp.inf]

        def outer(z1):
            u = s1 * z1
            if c == 0:
                return f(u, s2 * rho * z1) * dens(z1)
            # the inner integrand may be kinked where v = 0, i.e. at z2 = -rho z1 / c
            kink = -rho * z1 / c
            inner_pts = sorted(set(pts[1:-1] + [kink]))
            inner = mp.quad(lambda z2: f(u, s2 * (rho * z1 + c * z2)) * dens(z2),
                            [-mp.inf] + inner_pts + [mp.inf])
            return inner * dens(z1)

        return mp.quad(outer, pts)


# ---------------------------------------------------------------------------
# Symbolic placeholders.
# ---------------------------------------------------------------------------
def _as_lambda(f, nvars: int) -> sp.Lambda:
    if isinstance(f, sp.Lambda):
        return f
    if nvars == 1:
        return sp.Lambda(_x, sp.sympify(f))
    raise TypeError("two-point expectations take a sympy Lambda((x, y), expr)")


def _gaussian_moment(n: int, K):
    """E[h^n] for h ~ N(0, K): 0 for odd n, (n-1)!! K^(n/2) for even n."""
    if n % 2:
        return sp.Integer(0)
    return sp.factorial2(n - 1) * K ** sp.Rational(n, 2)


class GaussianExpectation(sp.Function):
    r"""E[f(h)] with h ~ N(0, K), as an unevaluated sympy function of K.

    ``GaussianExpectation(Lambda(x, f(x)), K)``. Polynomials in x are
    evaluated exactly; anything else stays unevaluated and is computed by
    quadrature when a number is needed. ``diff(., K)`` follows Price's theorem
    :math:`\partial_K E[f] = \tfrac12 E[f'']` in the weak sense: the pieces'
    second derivative plus (J1 + J0 c / K) p_K(c) / 2 at each breakpoint c
    where f jumps by J0 and f' by J1 (p_K the N(0, K) density).
    """

    nargs = 2

    @classmethod
    def eval(cls, f, K):
        if not isinstance(f, sp.Lambda):
            return None
        (var,) = f.variables
        body = sp.expand(f.expr)
        if not body.has(var):
            return body
        if body.is_polynomial(var):
            poly = sp.Poly(body, var)
            return sp.Add(*[c * _gaussian_moment(m[0], K) for m, c in zip(poly.monoms(), poly.coeffs())])
        if sp.expand(body.subs(var, -var) + body) == 0:  # odd integrand, symmetric Gaussian
            return sp.Integer(0)
        return None

    def fdiff(self, argindex=2):
        f, K = self.args
        if argindex != 2:
            raise sp.ArgumentIndexError(self, argindex)
        # Price's theorem in the weak sense: f'' is the piecewise second
        # derivative plus delta terms at the breakpoints c, where f' jumps by
        # J1 and f by J0; E[delta(h - c)] = p(c) and E[delta'(h - c)] = c p(c) / K
        # with p the N(0, K) density. Exact for kinked and jumping f.
        info = pieces(f)
        var = info.var
        out = GaussianExpectation(sp.Lambda(var, sp.diff(info.expr, var, 2) / 2), K)
        for c, j0, j1 in zip(info.cuts, info.jump0, info.jump1):
            if j0 != 0 or j1 != 0:
                out += (j1 + j0 * c / K) * sp.exp(-c**2 / (2 * K)) / (2 * sp.sqrt(2 * sp.pi * K))
        return out

    def _eval_evalf(self, prec):
        f, K = self.args
        Kval = K.evalf(prec)
        if not Kval.is_number:
            return None
        (var,) = f.variables
        fm = sp.lambdify(var, f.expr, modules="mpmath")
        dps = max(15, mp.libmp.prec_to_dps(prec))
        return sp.Float(mp_expect(fm, Kval, dps=dps + 5, cuts=pieces(f).cuts), dps)

    def _latex(self, printer):
        f, K = self.args
        (var,) = f.variables
        body = printer._print(f.expr.subs(var, sp.Symbol("h")))
        return r"\mathbb{E}_{h\sim\mathcal{N}(0,%s)}\left[%s\right]" % (printer._print(K), body)


class GaussianExpectation2(sp.Function):
    r"""E[f(u, v)] for a zero-mean Gaussian pair with Var u = K1, Var v = K2, Cov = K12.

    ``GaussianExpectation2(Lambda((x, y), f), K1, K2, K12)``; derivatives by
    Price's theorem: d/dK1 = 1/2 E[f_xx], d/dK2 = 1/2 E[f_yy], d/dK12 = E[f_xy].
    """

    nargs = 4

    @classmethod
    def eval(cls, f, K1, K2, K12):
        if not isinstance(f, sp.Lambda):
            return None
        if not f.expr.has(*f.variables):
            return f.expr
        if K12 == 0:
            # uncorrelated Gaussians are independent: a product integrand factorises
            a, b = f.variables
            parts = sp.Mul.make_args(f.expr)
            fa = sp.Mul(*[p for p in parts if not p.has(b)])
            fb = sp.Mul(*[p for p in parts if p.has(b)])
            if not fb.has(a):
                return GaussianExpectation(sp.Lambda(a, fa), K1) * GaussianExpectation(sp.Lambda(b, fb), K2)
        return None

    def fdiff(self, argindex=4):
        f, K1, K2, K12 = self.args
        a, b = f.variables
        if argindex not in (2, 3, 4):
            raise sp.ArgumentIndexError(self, argindex)
        # The package's two-point integrands are products fa(u) fb(v); their
        # factors are differentiated piece by piece, which equals the weak
        # derivative only where the factor (and, for a second derivative, its
        # first derivative) does not jump.
        parts = sp.Mul.make_args(f.expr)
        fa = sp.Mul(*[p for p in parts if not p.has(b)])
        fb = sp.Mul(*[p for p in parts if p.has(b)])

        def smooth(e, var, order):
            if not e.has(sp.Piecewise, *KINKED_FUNCTIONS):
                return True
            info = pieces(sp.Lambda(var, e))
            js = info.jump0 + (info.jump1 if order == 2 else ())
            return all(sp.simplify(j) == 0 for j in js)

        if fb.has(a):
            ok = not f.expr.has(sp.Piecewise, *KINKED_FUNCTIONS)
            g = {2: sp.diff(f.expr, a, 2) / 2, 3: sp.diff(f.expr, b, 2) / 2, 4: sp.diff(f.expr, a, b)}[argindex]
        else:
            fa, fb = piecewise_form(fa, a), piecewise_form(fb, b)
            if argindex == 2:
                ok, g = smooth(fa, a, 2), sp.diff(fa, a, 2) / 2 * fb
            elif argindex == 3:
                ok, g = smooth(fb, b, 2), fa * sp.diff(fb, b, 2) / 2
            else:
                ok, g = smooth(fa, a, 1) and smooth(fb, b, 1), sp.diff(fa, a) * sp.diff(fb, b)
        if not ok:
            # the weak derivative has delta terms on a line (u = c or v = c),
            # i.e. a conditional expectation the two-point rule does not carry:
            # refuse with NaN, which the solvers report, rather than drop them
            return sp.nan
        return GaussianExpectation2(sp.Lambda((a, b), g), K1, K2, K12)

    def _eval_evalf(self, prec):
        f, *ks = self.args
        vals = [k.evalf(prec) for k in ks]
        if not all(v.is_number for v in vals):
            return None
        fm = sp.lambdify(f.variables, f.expr, modules="mpmath")
        dps = max(15, mp.libmp.prec_to_dps(prec))
        return sp.Float(mp_expect2(fm, *vals, dps=dps + 5), dps)

    def _latex(self, printer):
        f, K1, K2, K12 = self.args
        a, b = f.variables
        body = printer._print(f.expr.subs({a: sp.Symbol("u"), b: sp.Symbol("v")}))
        return r"\mathbb{E}_{(u,v)\sim\mathcal{N}(0,[%s,%s;%s])}\left[%s\right]" % (
            printer._print(K1), printer._print(K12), printer._print(K2), body)


def numeric_expectations(exprs):
    """Replace every Gaussian expectation in ``exprs`` by a call to a numeric function.

    Returns (exprs', namespace): each distinct ``GaussianExpectation(Lambda, K)``
    becomes ``_mf_E<i>(K)`` (and two-point ones ``_mf_E<i>(K1, K2, K12)``),
    and ``namespace`` maps those names to the exp-sinh quadrature of
    :func:`meanfield.gaussian.expect` / :func:`~meanfield.gaussian.expect2`
    of the integrand, compiled once by :func:`~meanfield.gaussian.numpy_function`.
    Nested expectations (an expectation whose variance contains another) are
    replaced inside out.
    """
    namespace = {}
    names = {}

    def numeric(node):
        lam, *kargs = node.args
        key = (type(node), lam)
        if key not in names:
            extra = lam.expr.free_symbols - set(lam.variables)
            if extra:
                raise ValueError(f"cannot evaluate {node}: its integrand depends on {sorted(map(str, extra))}")
            name = f"_mf_E{len(names)}"
            g = numpy_function(lam)
            if isinstance(node, GaussianExpectation2):
                cuts = two_point_cuts(lam)
                namespace[name] = lambda K1, K2, K12, g=g, cuts=cuts: expect2(g, K1, K2, K12, cuts)
            else:
                cuts = pieces(lam).float_cuts
                namespace[name] = lambda K, g=g, cuts=cuts: expect(g, K, cuts)
            names[key] = sp.Function(name)
        return names[key](*kargs)

    def is_expectation(e):
        return isinstance(e, (GaussianExpectation, GaussianExpectation2))

    out = [sp.sympify(e).replace(is_expectation, numeric) for e in exprs]
    return out, namespace
