"""Solver kernels (numba), compiled once for every architecture.

Each kernel takes ``fns``, the compiled expressions of one architecture as a
single numba ``cfunc`` ``fns(which, K, K12, W, T, mu, eps) -> float`` that
evaluates expression number ``which`` (:data:`meanfield._fnindex.FUNCTIONS`),
as a first-class function argument. The kernels are therefore compiled (and
cached on disk by numba) once, and an architecture only costs the
compilation of its own expressions. (One function argument rather than a
tuple of sixteen keeps the kernels' compile time down.)

W = sigma_w**2 and T = sigma_b**2 throughout; K12 (``Q`` here) is the
cross-covariance of two equal-norm inputs, which feeds back only for
BatchNorm (``pair`` states).

Status codes:
  0 OK        converged (to double precision)
  1 INF       the kernel diverges (no fixed point in the direction the map moves)
  2 MAXITER   iteration cap reached without convergence
  3 NAN       the recursion produced NaN (outside its domain)
  4 CYCLE     the map overshoots with chi_K < -1 at its fixed point: no limit
  5 NOLINE    no critical line at this parameter value
"""
import math

import numpy as np
from numba import njit

from ._cache import install_locator

install_locator()  # numba's cache of these kernels goes to meanfield's cache folder, never the package

ST_OK = 0
ST_INF = 1
ST_MAXITER = 2
ST_NAN = 3
ST_CYCLE = 4
ST_NOLINE = 5

from ._fnindex import (CHI_DELTA, CHI_J, CHI_K, DC_DK, DC_DT, DC_DW, DK_DQ, DK_DT, DK_DW,  # noqa: F401
                       DQ_DK, DQ_DQ, DX_DK, DX_DT, DX_DW, KERNEL, KERNEL12)

_EPS = 2.220446049250313e-16
_KMAX = 1e250          # beyond this the kernel is declared divergent
from ._fnindex import KINF as _KINF  # noqa: E402  factors "at K = inf" are evaluated this far along the growth
_NSCAN = 34            # scan grid v = 0 and 1e-10 * 8^k, k = 0..33 (up to ~6e19)

_JIT = dict(cache=True, error_model="numpy", nogil=True)


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _isfinite(x):
    return not (math.isnan(x) or math.isinf(x))


@njit(**_JIT)
def g1(fns, K, Q, W, T, mu, eps):
    """F(K) - K for the one-input state."""
    return fns(KERNEL, K, Q, W, T, mu, eps) - K


@njit(**_JIT)
def _leaf(kind, x, fns, p0, p1, p2, p3, p4):
    """Objectives that need no root finding themselves.

    kind 0: g1 at K = x (p0..p4 = Q, W, T, mu, eps);
    kind 1: g1 at K = p0 as a function of T = x (p1 = W, p3 = mu, p4 = eps).
    """
    if kind == 0:
        return g1(fns, x, p0, p1, p2, p3, p4)
    return g1(fns, p0, 0.0, p1, x, p3, p4)


@njit(**_JIT)
def _brent(kind, a, b, fa, fb, fns, p0, p1, p2, p3, p4):
    """Root of _leaf(kind, .) in [a, b] (fa fb <= 0): Brent's method to double precision."""
    if fa == 0.0:
        return a
    if fb == 0.0:
        return b
    c, fc = a, fa
    d = b - a
    e = d
    for _ in range(300):
        if (fb > 0.0) == (fc > 0.0):
            c, fc = a, fa
            d = b - a
            e = d
        if abs(fc) < abs(fb):
            a, b, c = b, c, b
            fa, fb, fc = fb, fc, fb
        tol = 2.0 * _EPS * abs(b) + 1e-300
        m = 0.5 * (c - b)
        if abs(m) <= tol or fb == 0.0:
            return b
        if abs(e) >= tol and abs(fa) > abs(fb):
            s = fb / fa
            if a == c:
                p = 2.0 * m * s
                q = 1.0 - s
            else:
                q = fa / fc
                r = fb / fc
                p = s * (2.0 * m * q * (q - r) - (b - a) * (r - 1.0))
                q = (q - 1.0) * (r - 1.0) * (s - 1.0)
            if p > 0.0:
                q = -q
            else:
                p = -p
            if 2.0 * p < min(3.0 * m * q - abs(tol * q), abs(e * q)):
                e = d
                d = p / q
            else:
                d = m
                e = m
        else:
            d = m
            e = m
        a, fa = b, fb
        if abs(d) > tol:
            b = b + d
        else:
            b = b + (tol if m > 0 else -tol)
        fb = _leaf(kind, b, fns, p0, p1, p2, p3, p4)
        if not _isfinite(fb):
            return math.nan
    return b


@njit(**_JIT)
def _min_dg(fns, lo, hi, sgn, Q, W, T, mu, eps):
    """Golden-section minimum of sgn * g1 on [lo, hi]: (x, value)."""
    gr = 0.6180339887498949
    a, b = lo, hi
    x1 = b - gr * (b - a)
    x2 = a + gr * (b - a)
    f1 = sgn * g1(fns, x1, Q, W, T, mu, eps)
    f2 = sgn * g1(fns, x2, Q, W, T, mu, eps)
    for _ in range(160):
        if abs(b - a) <= 4.0 * _EPS * max(abs(a), abs(b), 1e-300):
            break
        if f1 < f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - gr * (b - a)
            f1 = sgn * g1(fns, x1, Q, W, T, mu, eps)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + gr * (b - a)
            f2 = sgn * g1(fns, x2, Q, W, T, mu, eps)
    if f1 < f2:
        return x1, f1
    return x2, f2


# ---------------------------------------------------------------------------
# Fixed points.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def fixed_point1(fns, K0, Q, W, T, mu, eps, maxiter):
    """The fixed point of K -> F(K) that iteration from K0 reaches: (K*, status).

    For an increasing map F the iterates move monotonically towards the first
    root of g = F(K) - K in the direction sign g(K0) and never pass it; so
    K* is that root. It is found by marching with geometrically growing steps
    until g changes sign (then Brent) or dips to zero (a half-stable, tangent
    fixed point, located by minimising |g|), or until K passes 1e250 or g is
    lost in rounding far above the start (divergent: K* = inf). Overshooting
    (a decreasing F) is left to :func:`fixed_point1_iterate`.
    """
    K = K0
    g = g1(fns, K, Q, W, T, mu, eps)
    if not _isfinite(g):
        if K > _KMAX:
            return math.inf, ST_INF
        return math.nan, ST_NAN
    if g == 0.0:
        return K, ST_OK
    d = 1.0 if g > 0.0 else -1.0
    a, ga = K, g
    step = abs(g)
    have_prev = False
    p_prev, s_prev = K, d * g
    for it in range(maxiter):
        p = a + d * step
        if p <= 0.0:
            p = 0.0
        if p > _KMAX:
            return math.inf, ST_INF
        gp = g1(fns, p, Q, W, T, mu, eps)
        if not _isfinite(gp):
            if p > 1e150 or (math.isinf(gp) and d * gp > 0):
                return math.inf, ST_INF
            return math.nan, ST_NAN
        if d > 0.0 and p > 1e6 * max(1.0, K0) and abs(gp) <= 1024.0 * _EPS * p:
            # still pushing upwards far above the start, with g lost in rounding:
            # growth (e.g. linear, mu = 1) without a resolvable fixed point
            return math.inf, ST_INF
        sp_ = d * gp
        if sp_ <= 0.0:
            # the first sign change lies in (a, p]
            if d > 0.0:
                r = _brent(0, a, p, ga, gp, fns, Q, W, T, mu, eps)
            else:
                r = _brent(0, p, a, gp, ga, fns, Q, W, T, mu, eps)
            return _earlier_root(fns, a, r, d, Q, W, T, mu, eps), ST_OK
        sa = d * ga
        if have_prev and sa < s_prev and sa <= sp_:
            # d*g dips around a: does it reach zero between p_prev and p?
            lo = min(p_prev, p)
            hi = max(p_prev, p)
            xm, fm = _min_dg(fns, lo, hi, d, Q, W, T, mu, eps)
            if fm <= 0.0:
                if d > 0.0:
                    return _brent(0, p_prev, xm, d * s_prev, d * fm, fns, Q, W, T, mu, eps), ST_OK
                return _brent(0, xm, p_prev, d * fm, d * s_prev, fns, Q, W, T, mu, eps), ST_OK
            if fm <= 16.0 * _EPS * max(abs(xm), 1.0):
                return xm, ST_OK
        have_prev = True
        p_prev, s_prev = a, sa
        a, ga = p, gp
        step *= 2.0 if it < 30 else 4.0
    return a, ST_MAXITER


@njit(**_JIT)
def _earlier_root(fns, a, r, d, Q, W, T, mu, eps):
    """Guard a bracketed root r against an earlier one between a and r.

    A long march step can pass a place where d*g dips to zero without
    changing sign (a tangent, half-stable fixed point, which iteration from
    a would converge to) or crosses zero twice. 16 samples between a and r
    (log-spaced when the interval spans a decade) look for a sign change or
    a dip, which is then resolved by Brent or golden section.
    """
    n = 16
    lo, hi = min(a, r), max(a, r)
    logs = lo > 0.0 and hi > 10.0 * lo
    x_prev, s_prev = a, d * g1(fns, a, Q, W, T, mu, eps)
    x_pp, s_pp = x_prev, math.inf
    for i in range(1, n):
        f = i / n
        if logs:
            x = a * math.exp(f * math.log(r / a))
        else:
            x = a + f * (r - a)
        s = d * g1(fns, x, Q, W, T, mu, eps)
        if not _isfinite(s):
            return r
        if s <= 0.0:
            if d > 0.0:
                return _brent(0, x_prev, x, d * s_prev, d * s, fns, Q, W, T, mu, eps)
            return _brent(0, x, x_prev, d * s, d * s_prev, fns, Q, W, T, mu, eps)
        if s_prev < s_pp and s_prev <= s:
            xm, fm = _min_dg(fns, min(x_pp, x), max(x_pp, x), d, Q, W, T, mu, eps)
            if fm <= 0.0:
                if d > 0.0:
                    return _brent(0, x_pp, xm, d * s_pp, d * fm, fns, Q, W, T, mu, eps)
                return _brent(0, xm, x_pp, d * fm, d * s_pp, fns, Q, W, T, mu, eps)
            if fm <= 16.0 * _EPS * max(abs(xm), 1.0):
                return xm
        x_pp, s_pp = x_prev, s_prev
        x_prev, s_prev = x, s
    return r


@njit(**_JIT)
def fixed_point1_iterate(fns, K0, Q, W, T, mu, eps, maxiter):
    """Plain iteration for maps that are not monotone (chi_K < 0 somewhere).

    As soon as an iterate crosses the fixed point, it is bracketed and found
    by Brent; |chi_K| > 1 there means the iteration oscillates (CYCLE).
    """
    K = K0
    g = g1(fns, K, Q, W, T, mu, eps)
    for _ in range(maxiter):
        if not _isfinite(g):
            return math.nan, ST_NAN
        if g == 0.0:
            return K, ST_OK
        Kn = max(K + g, 0.0)
        if Kn > _KMAX:
            return math.inf, ST_INF
        gn = g1(fns, Kn, Q, W, T, mu, eps)
        if _isfinite(gn) and (gn > 0.0) != (g > 0.0) and gn != 0.0:
            if Kn < K:
                root = _brent(0, Kn, K, gn, g, fns, Q, W, T, mu, eps)
            else:
                root = _brent(0, K, Kn, g, gn, fns, Q, W, T, mu, eps)
            if fns(CHI_K, root, Q, W, T, mu, eps) < -1.0:
                return root, ST_CYCLE
            return root, ST_OK
        K, g = Kn, gn
    return K, ST_MAXITER


@njit(**_JIT)
def fixed_point2(fns, K0, Q0, W, T, mu, eps, maxiter):
    """Fixed point of the pair map (K, K12) -> (F(K, K12), F12(K, K12)).

    Plain iteration; when both components contract geometrically with a
    steady ratio the geometric tail is summed (Aitken). A steady ratio >= 1
    with significant steps (linear or faster growth) means divergence.
    Returns (K*, K12*, status, dK, dK12); the last steps give the direction
    of growth when the state diverges.
    """
    K, Q = K0, Q0
    dK_old, dQ_old = math.nan, math.nan
    rK_old, rQ_old = math.nan, math.nan
    steady = 0
    for n in range(maxiter):
        Kn = fns(KERNEL, K, Q, W, T, mu, eps)
        Qn = fns(KERNEL12, K, Q, W, T, mu, eps)
        if not (_isfinite(Kn) and _isfinite(Qn)):
            if K > 1e150:
                return math.inf, math.inf, ST_INF, math.nan, math.nan
            return math.nan, math.nan, ST_NAN, math.nan, math.nan
        if Kn > _KMAX:
            return math.inf, math.inf, ST_INF, Kn - K, Qn - Q
        dK = Kn - K
        dQ = Qn - Q
        scale = max(abs(Kn), 1e-300)
        rK = dK / dK_old if dK_old != 0.0 else 0.0
        rQ = dQ / dQ_old if dQ_old != 0.0 else 0.0
        # distance to the limit ~ step / (1 - ratio); right after an Aitken
        # jump (ratio unknown) the step itself is the estimate
        gK = 1.0 - min(abs(rK), 0.999999) if _isfinite(rK) else 1.0
        gQ = 1.0 - min(abs(rQ), 0.999999) if _isfinite(rQ) else 1.0
        if abs(dK) <= 16.0 * _EPS * scale * gK and abs(dQ) <= 16.0 * _EPS * scale * gQ:
            return Kn, Qn, ST_OK, 0.0, 0.0
        if n >= 2 and abs(rK - rK_old) <= 1e-9 and abs(rQ - rQ_old) <= 1e-9:
            steady += 1
        else:
            steady = 0
        K, Q = Kn, Qn
        if steady >= 2:
            if rK >= 1.0 - 1e-12 and dK > 1e-8 * abs(K):
                if rQ >= 1.0 - 1e-12 and dQ != 0.0:
                    return math.inf, math.copysign(math.inf, dQ), ST_INF, dK, dQ
                Qs = Q + dQ * rQ / (1.0 - rQ) if abs(rQ) < 1.0 else Q
                return math.inf, Qs, ST_INF, dK, 0.0
            if abs(rK) < 1.0 and abs(rQ) < 1.0:
                K = K + dK * rK / (1.0 - rK)
                Q = Q + dQ * rQ / (1.0 - rQ)
                steady = 0
                dK_old, dQ_old = math.nan, math.nan
                rK_old, rQ_old = math.nan, math.nan
                continue
        dK_old, dQ_old = dK, dQ
        rK_old, rQ_old = rK, rQ
    return K, Q, ST_MAXITER, math.nan, math.nan


@njit(**_JIT)
def fixed_point(fns, pair, K0, Q0, W, T, mu, eps, maxiter):
    """(K*, K12*, status, Kf, Qf) for one parameter point.

    K12* is nan for one-input states. (Kf, Qf) is where the factors at the
    fixed point are evaluated: the fixed point itself or, where the kernel
    diverges, a far point along the growth (K ~ 1e100), which gives the
    limits of chi_J and chi_K.
    """
    if pair:
        K, Q, st, dK, dQ = fixed_point2(fns, K0, Q0, W, T, mu, eps, maxiter)
        if st == ST_INF:
            if _isfinite(dK) and dK > 0.0:
                return K, Q, st, _KINF, (Q if _isfinite(Q) else 0.0) + dQ * (_KINF / dK)
            return K, Q, st, math.nan, math.nan
        return K, Q, st, K, Q
    K, st = fixed_point1(fns, K0, Q0, W, T, mu, eps, maxiter)
    if st == ST_MAXITER or st == ST_NAN:
        K2, st2 = fixed_point1_iterate(fns, K0, Q0, W, T, mu, eps, maxiter)
        if st2 == ST_OK or st2 == ST_CYCLE or st2 == ST_INF:
            K, st = K2, st2
    if st == ST_INF:
        return K, math.nan, st, _KINF, Q0
    return K, math.nan, st, K, Q0


@njit(**_JIT)
def fixed_point_many(fns, pair, K0, Q0, W, T, mu, eps, maxiter, outK, outQ, outS, outX, outC):
    """Vectorised fixed_point over flat arrays (``mu`` one per point too), with chi_J* and chi_K* there."""
    for i in range(W.shape[0]):
        K, Q, st, Kf, Qf = fixed_point(fns, pair, K0[i], Q0[i], W[i], T[i], mu[i], eps, maxiter)
        outK[i] = K
        outQ[i] = Q
        outS[i] = st
        if st == ST_OK or st == ST_INF:
            outX[i] = fns(CHI_J, Kf, Qf, W[i], T[i], mu[i], eps)
            outC[i] = fns(CHI_K, Kf, Qf, W[i], T[i], mu[i], eps)
        else:
            outX[i] = math.nan
            outC[i] = math.nan


@njit(**_JIT)
def roots_scan(fns, Ks, g, Q, W, T, mu, eps, out):
    """All sign changes of g = F(K) - K between consecutive grid points Ks,
    given g on the grid (``g_grid``), refined by Brent (nan-padded output;
    returns how many were found)."""
    n = 0
    gp = g[0]
    if gp == 0.0:
        out[n] = Ks[0]
        n += 1
    for i in range(1, Ks.shape[0]):
        gi = g[i]
        if _isfinite(gp) and _isfinite(gi):
            if gi == 0.0:
                if n < out.shape[0]:
                    out[n] = Ks[i]
                    n += 1
            elif gp != 0.0 and (gi > 0.0) != (gp > 0.0):
                if n < out.shape[0]:
                    out[n] = _brent(0, Ks[i - 1], Ks[i], gp, gi, fns, Q, W, T, mu, eps)
                    n += 1
        gp = gi
    return n


@njit(**_JIT)
def first_uncomputable(fns, Ks, W, T, mu, eps):
    """Index of the first K in ``Ks`` (ascending) where F, chi_J or chi_K is not finite; -1 if none.

    The scans over K* (the critical line's table to K* = 1e12, the critical
    point's candidates, the fixed points' grid) evaluate the recursion at
    every K of their range thousands of times; where a Gaussian expectation
    of a user activation cannot be computed there (its quadrature does not
    converge: sin(sqrt(K) z) beyond K ~ 1e7), each of those evaluations runs
    the quadrature to its last level (~0.3 s for sin here) and the scan runs
    for hours. The solvers ask this first, at a few K per decade, and refuse.
    Stops at the first failure: at most 3 len(Ks) evaluations (one-input states).
    """
    for i in range(Ks.shape[0]):
        K = Ks[i]
        if not (_isfinite(fns(KERNEL, K, 0.0, W, T, mu, eps)) and _isfinite(fns(CHI_J, K, 0.0, W, T, mu, eps))
                and _isfinite(fns(CHI_K, K, 0.0, W, T, mu, eps))):
            return i
    return -1


# ---------------------------------------------------------------------------
# Depth profiles.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def profile(fns, pair, K0, Q0, W, T, mu, eps, outK, outQ, outX):
    """K^l, K12^l and chi_J^l = J^{l,l+1} for l = 1..depth (arrays of length depth).

    Returns True when every K^l and chi_J^l is finite (the caller's checks run only otherwise)."""
    K, Q = K0, Q0
    ok = True
    for l in range(outK.shape[0]):
        outK[l] = K
        outQ[l] = Q
        X = fns(CHI_J, K, Q, W, T, mu, eps)
        outX[l] = X
        ok = ok and _isfinite(K) and _isfinite(X)
        Kn = fns(KERNEL, K, Q, W, T, mu, eps)
        if pair:
            Q = fns(KERNEL12, K, Q, W, T, mu, eps)
        K = Kn
    return ok


@njit(**_JIT)
def profile_many(fns, pair, K0, Q0, W, T, mu, eps, outK, outQ, outX):
    """:func:`profile` at n points (flat arrays K0, Q0, W, T, mu; outputs of shape (n, depth)):
    row i is exactly what ``profile`` returns for point i. Returns the number of rows with a
    non-finite K^l or chi_J^l."""
    bad = 0
    for i in range(W.shape[0]):
        if not profile(fns, pair, K0[i], Q0[i], W[i], T[i], mu[i], eps, outK[i], outQ[i], outX[i]):
            bad += 1
    return bad


@njit(**_JIT)
def depth_samples(fns, pair, K0, Q0, W, T, mu, eps, layers, outK, outlogJ, outX):
    """Iterate to max(layers); at each l in ``layers`` (sorted, >= 1) record K^l,
    log J^{1,l} = sum_{l' < l} log chi_J^{l'} (Kahan-summed) and chi_J^l."""
    K, Q = K0, Q0
    s, c = 0.0, 0.0
    j = 0
    n = layers.shape[0]
    l = 1
    while j < n:
        X = fns(CHI_J, K, Q, W, T, mu, eps)
        while j < n and layers[j] == l:
            outK[j] = K
            outlogJ[j] = s
            outX[j] = X
            j += 1
        y = math.log(X) - c
        t = s + y
        c = (t - s) - y
        s = t
        Kn = fns(KERNEL, K, Q, W, T, mu, eps)
        if pair:
            Q = fns(KERNEL12, K, Q, W, T, mu, eps)
        K = Kn
        l += 1


# ---------------------------------------------------------------------------
# Critical lines: chi_J = 1 at the fixed point reached from the unit-norm input.
# mode 0: sigma_w fixed, solve for v = T;  mode 1: sigma_b fixed, solve for v = W.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _wt(mode, v, fixed):
    if mode == 0:
        return fixed, v
    return v, fixed


@njit(**_JIT)
def reached(fns, pair, W, T, mu, eps):
    """Fixed point reached from the unit-norm input: (K*, K12*, status, Kf, Qf)."""
    return fixed_point(fns, pair, W + T, T, W, T, mu, eps, 1000000)


@njit(**_JIT)
def h_line(fns, pair, mode, v, fixed, mu, eps):
    """chi_J* - 1 at the fixed point reached from the unit-norm input."""
    W, T = _wt(mode, v, fixed)
    K, Q, st, Kf, Qf = reached(fns, pair, W, T, mu, eps)
    if st != ST_OK and st != ST_INF:
        return math.nan
    return fns(CHI_J, Kf, Qf, W, T, mu, eps) - 1.0


@njit(**_JIT)
def _scan_v(k):
    if k == 0:
        return 0.0
    return 1e-10 * 8.0 ** (k - 1)


@njit(**_JIT)
def _T_for(fns, K, W, mu, eps):
    """T with F(K; W, T) = K (F increases with T); may be negative (then no line)."""
    lo = 0.0
    glo = g1(fns, K, 0.0, W, lo, mu, eps)
    if not _isfinite(glo):
        return math.nan
    if glo == 0.0:
        return 0.0
    if glo > 0.0:
        hi = -1e-10
        for _ in range(200):
            ghi = g1(fns, K, 0.0, W, hi, mu, eps)
            if not _isfinite(ghi):
                return math.nan
            if ghi <= 0.0:
                return _brent(1, hi, lo, ghi, glo, fns, K, W, 0.0, mu, eps)
            lo, glo = hi, ghi
            hi *= 4.0
        return math.nan
    hi = max(1e-10, K)
    for _ in range(400):
        ghi = g1(fns, K, 0.0, W, hi, mu, eps)
        if not _isfinite(ghi):
            return math.nan
        if ghi >= 0.0:
            return _brent(1, lo, hi, glo, ghi, fns, K, W, 0.0, mu, eps)
        lo, glo = hi, ghi
        hi *= 4.0
    return math.nan


@njit(**_JIT)
def _mid(kind, x, fns, pair, i0, p1, p2, p3):
    """Objectives whose evaluation solves a leaf problem.

    kind 0: h_line at v = x (i0 = mode, p1 = fixed, p2 = mu, p3 = eps);
    kind 1: chi_J - 1 at K = p1 with T = T(K, W = x) (p2 = mu, p3 = eps).
    """
    if kind == 0:
        return h_line(fns, pair, i0, x, p1, p2, p3)
    T = _T_for(fns, p1, x, p2, p3)
    if not _isfinite(T):
        return math.nan
    return fns(CHI_J, p1, 0.0, x, T, p2, p3) - 1.0


@njit(**_JIT)
def _illinois(kind, a, b, fa, fb, fns, pair, i0, p1, p2, p3):
    """Root of _mid(kind, .) in [a, b] (fa fb < 0): Illinois regula falsi."""
    side = 0
    c = a
    for _ in range(300):
        c = (a * fb - b * fa) / (fb - fa)
        if not (_isfinite(c) and min(a, b) <= c <= max(a, b)):
            c = 0.5 * (a + b)
        fc = _mid(kind, c, fns, pair, i0, p1, p2, p3)
        if not _isfinite(fc):
            c = 0.5 * (a + b)
            fc = _mid(kind, c, fns, pair, i0, p1, p2, p3)
            if not _isfinite(fc):
                return math.nan
        if fc == 0.0:
            return c
        if (fc > 0.0) == (fb > 0.0):
            b, fb = c, fc
            if side == -1:
                fa *= 0.5
            side = -1
        else:
            a, fa = c, fc
            if side == 1:
                fb *= 0.5
            side = 1
        if abs(b - a) <= 4.0 * _EPS * max(abs(a), abs(b)) + 1e-300:
            return c
    return c


@njit(**_JIT)
def line_robust(fns, pair, mode, fixed, mu, eps):
    """Smallest v >= 0 where h_line changes sign continuously: (v, status).

    Scans v = 0, 1e-10 * 8^k; a sign change is refined by regula falsi and
    kept only if h is ~0 there (a jump of the reached fixed point is not a
    crossing).
    """
    v_prev = math.nan
    h_prev = math.nan
    vmax = 1e10 * max(1.0, fixed)  # beyond, K and K12 ~ v swamp the O(fixed) structure
    for k in range(_NSCAN + 1):
        v = _scan_v(k)
        if v > vmax:
            break
        h = h_line(fns, pair, mode, v, fixed, mu, eps)
        if not _isfinite(h):
            v_prev, h_prev = math.nan, math.nan
            continue
        if v == 0.0 and abs(h) <= 64.0 * _EPS:
            return v, ST_OK   # zero within rounding at v = 0: the line ends on the axis
        if h == 0.0:
            # an exact zero is a root only where h changes sign through it: a curve that touches zero from
            # one side rounds to 0 near v = 0 (erf + ln_post at sigma_b = 0: chi_J - 1 ~ 4/3 sigma_w^4 > 0)
            if k < _NSCAN:
                hn = h_line(fns, pair, mode, _scan_v(k + 1), fixed, mu, eps)
                if _isfinite(h_prev) and _isfinite(hn) and h_prev != 0.0 and hn != 0.0 and \
                        (h_prev > 0.0) != (hn > 0.0):
                    return v, ST_OK
            continue
        if _isfinite(h_prev) and (h > 0.0) != (h_prev > 0.0):
            r = _illinois(0, v_prev, v, h_prev, h, fns, pair, mode, fixed, mu, eps)
            hr = h_line(fns, pair, mode, r, fixed, mu, eps)
            if _isfinite(hr) and abs(hr) <= 1e-8:
                # a resolved crossing: h small and of opposite signs just around r
                d = max(abs(r) * 1e-6, 1e-14)
                ha = h_line(fns, pair, mode, max(r - d, 0.0), fixed, mu, eps)
                hb = h_line(fns, pair, mode, r + d, fixed, mu, eps)
                if (abs(ha) <= 1e-4 and abs(hb) <= 1e-4 and (ha <= 0.0) != (hb <= 0.0)) or r == 0.0:
                    return r, ST_OK
        v_prev, h_prev = v, h
    return math.nan, ST_NOLINE


@njit(**_JIT)
def _solve2(a11, a12, a21, a22, b1, b2):
    det = a11 * a22 - a12 * a21
    if det == 0.0 or not _isfinite(det):
        return math.nan, math.nan
    return (b1 * a22 - a12 * b2) / det, (a11 * b2 - a21 * b1) / det


@njit(**_JIT)
def _resid2(fns, K, W, T, mu, eps):
    return g1(fns, K, 0.0, W, T, mu, eps), fns(CHI_J, K, 0.0, W, T, mu, eps) - 1.0


@njit(**_JIT)
def newton_line(fns, mode, K, W, T, mu, eps):
    """Newton for F(K) = K, chi_J(K) = 1 (one-input states): (K, W, T, ok).

    mode 0: unknowns (K, T); 1: (K, W); 2: (W, T) at fixed K. Damped by
    halving until the residual decreases; K and W stay >= 0.
    """
    r1, r2 = _resid2(fns, K, W, T, mu, eps)
    for it in range(60):
        if not (_isfinite(r1) and _isfinite(r2)):
            return K, W, T, False
        n0 = abs(r1) / max(1.0, K) + abs(r2)
        a11 = fns(CHI_K, K, 0.0, W, T, mu, eps) - 1.0
        a21 = fns(DX_DK, K, 0.0, W, T, mu, eps)
        aW1 = fns(DK_DW, K, 0.0, W, T, mu, eps)
        aW2 = fns(DX_DW, K, 0.0, W, T, mu, eps)
        aT1 = fns(DK_DT, K, 0.0, W, T, mu, eps)
        aT2 = fns(DX_DT, K, 0.0, W, T, mu, eps)
        if mode == 0:
            dx, dy = _solve2(a11, aT1, a21, aT2, -r1, -r2)
        elif mode == 1:
            dx, dy = _solve2(a11, aW1, a21, aW2, -r1, -r2)
        else:
            dx, dy = _solve2(aW1, aT1, aW2, aT2, -r1, -r2)
        if not (_isfinite(dx) and _isfinite(dy)):
            return K, W, T, False
        lam = 1.0
        ok = False
        K1, W1, T1, s1, s2, n1 = K, W, T, r1, r2, n0
        for _ in range(40):
            if mode == 0:
                K1, W1, T1 = K + lam * dx, W, T + lam * dy
            elif mode == 1:
                K1, W1, T1 = K + lam * dx, W + lam * dy, T
            else:
                K1, W1, T1 = K, W + lam * dx, T + lam * dy
            if K1 >= 0.0 and W1 >= 0.0:
                s1, s2 = _resid2(fns, K1, W1, T1, mu, eps)
                if _isfinite(s1) and _isfinite(s2):
                    n1 = abs(s1) / max(1.0, K1) + abs(s2)
                    if n1 < n0 or n1 <= 64.0 * _EPS:
                        ok = True
                        break
            lam *= 0.5
        if not ok:
            return K, W, T, n0 <= 1e-13
        small = (abs(K1 - K) <= 4.0 * _EPS * max(abs(K1), 1e-300)
                 and abs(W1 - W) <= 4.0 * _EPS * max(abs(W1), 1e-300)
                 and abs(T1 - T) <= 4.0 * _EPS * max(abs(T1), 1e-300))
        K, W, T, r1, r2 = K1, W1, T1, s1, s2
        if small or (n1 <= 4.0 * _EPS and it > 0):
            return K, W, T, True
    return K, W, T, abs(r1) / max(1.0, K) + abs(r2) <= 1e-13


@njit(**_JIT)
def _newton_on_line(fns, mode, K, fixed, v, mu, eps):
    """Newton on the critical line with one coordinate fixed: (K, the solved coordinate, ok).

    mode 0 fixes sigma_w^2 (= fixed) and solves for sigma_b^2; mode 1 the reverse.
    """
    if mode == 0:
        K2, W, T, ok = newton_line(fns, 0, K, fixed, v, mu, eps)
        return K2, T, ok
    K2, W, T, ok = newton_line(fns, 1, K, v, fixed, mu, eps)
    return K2, W, ok


@njit(**_JIT)
def _accept_line(fns, pair, mode, fixed, K, v, mu, eps):
    """A Newton solution is the line if the unit input reaches it (stably) and
    an odd number of crossings lies below it (so the first is not skipped)."""
    if not (v >= 0.0):
        return False
    W, T = _wt(mode, v, fixed)
    if fns(CHI_K, K, 0.0, W, T, mu, eps) > 1.0 + 1e-9:
        return False
    Kr, Q, st, Kf, Qf = reached(fns, pair, W, T, mu, eps)
    if st != ST_OK or abs(Kr - K) > 1e-9 * max(1.0, K):
        return False
    h0 = h_line(fns, pair, mode, 0.0, fixed, mu, eps)
    h1 = h_line(fns, pair, mode, v * (1.0 + 1e-6) + 1e-300, fixed, mu, eps)
    if not (_isfinite(h0) and _isfinite(h1)):
        return False
    return (h0 > 0.0) != (h1 > 0.0) or h0 == 0.0


@njit(**_JIT)
def critical_line_many(fns, pair, mode, fixed, mu, eps, outv, outK, outS):
    """The critical line at each fixed value, in the given order, warm-started.

    Newton from the previous point's solution when it is accepted by
    _accept_line; otherwise the scan of line_robust (then polished by Newton).
    """
    have = False
    Kp, vp = 0.0, 0.0
    for i in range(fixed.shape[0]):
        f = fixed[i]
        done = False
        if have and not pair:
            K, v, ok = _newton_on_line(fns, mode, Kp, f, vp, mu, eps)
            if ok and _accept_line(fns, pair, mode, f, K, v, mu, eps):
                outv[i], outK[i], outS[i] = v, K, ST_OK
                done = True
        if not done:
            v, st = line_robust(fns, pair, mode, f, mu, eps)
            outv[i], outS[i] = v, st
            outK[i] = math.nan
            if st == ST_OK:
                W, T = _wt(mode, v, f)
                K, Q, st2, Kf, Qf = reached(fns, pair, W, T, mu, eps)
                outK[i] = K
                if not pair and st2 == ST_OK:
                    K2, v2, ok = _newton_on_line(fns, mode, K, f, v, mu, eps)
                    if ok and v2 >= 0.0 and abs(v2 - v) <= 1e-6 * max(abs(v), 1e-12):
                        outv[i], outK[i] = v2, K2
        have = outS[i] == ST_OK and _isfinite(outK[i])
        if have:
            Kp, vp = outK[i], outv[i]


# ---------------------------------------------------------------------------
# Parametric form: given K*, the (W, T) with F(K*) = K* and chi_J(K*) = 1.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def parametric_robust(fns, K, mu, eps):
    """(W, T, ok) on the critical line with fixed point K: scan W, regula falsi."""
    v_prev, h_prev = math.nan, math.nan
    for k in range(_NSCAN + 1):
        v = _scan_v(k)
        h = _mid(1, v, fns, False, 0, K, mu, eps)
        if not _isfinite(h):
            v_prev, h_prev = math.nan, math.nan
            continue
        if h == 0.0:
            return v, _T_for(fns, K, v, mu, eps), True
        if _isfinite(h_prev) and (h > 0.0) != (h_prev > 0.0):
            W = _illinois(1, v_prev, v, h_prev, h, fns, False, 0, K, mu, eps)
            T = _T_for(fns, K, W, mu, eps)
            if _isfinite(T) and abs(fns(CHI_J, K, 0.0, W, T, mu, eps) - 1.0) <= 1e-8:
                return W, T, True
        v_prev, h_prev = v, h
    return math.nan, math.nan, False


@njit(**_JIT)
def parametric_many(fns, Ks, mu, eps, outW, outT, outS):
    """(W, T) on the critical line for each K* (one-input states), warm-started."""
    have = False
    Wp, Tp = 0.0, 0.0
    for i in range(Ks.shape[0]):
        K = Ks[i]
        ok = False
        W, T = math.nan, math.nan
        if have:
            K1, W, T, ok = newton_line(fns, 2, K, Wp, Tp, mu, eps)
            ok = ok and W >= 0.0
        if not ok:
            W, T, ok = parametric_robust(fns, K, mu, eps)
            if ok:
                K1, W2, T2, ok2 = newton_line(fns, 2, K, W, T, mu, eps)
                if ok2 and W2 >= 0.0:
                    W, T = W2, T2
        if ok:
            outW[i], outT[i], outS[i] = W, T, ST_OK
            Wp, Tp = W, T
        else:
            outW[i], outT[i], outS[i] = math.nan, math.nan, ST_NOLINE
        have = ok


@njit(**_JIT)
def newton_point(fns, K, W, T, mu, eps):
    """Newton on (K, W, T) for F(K) = K, chi_J = 1, chi_K = 1: (K, W, T, ok)."""
    a = np.empty((3, 3))
    b = np.empty(3)
    for _ in range(80):
        b[0] = -g1(fns, K, 0.0, W, T, mu, eps)
        b[1] = 1.0 - fns(CHI_J, K, 0.0, W, T, mu, eps)
        b[2] = 1.0 - fns(CHI_K, K, 0.0, W, T, mu, eps)
        a[0, 0] = -b[2]
        a[0, 1] = fns(DK_DW, K, 0.0, W, T, mu, eps)
        a[0, 2] = fns(DK_DT, K, 0.0, W, T, mu, eps)
        a[1, 0] = fns(DX_DK, K, 0.0, W, T, mu, eps)
        a[1, 1] = fns(DX_DW, K, 0.0, W, T, mu, eps)
        a[1, 2] = fns(DX_DT, K, 0.0, W, T, mu, eps)
        a[2, 0] = fns(DC_DK, K, 0.0, W, T, mu, eps)
        a[2, 1] = fns(DC_DW, K, 0.0, W, T, mu, eps)
        a[2, 2] = fns(DC_DT, K, 0.0, W, T, mu, eps)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            return K, W, T, False
        det = np.linalg.det(a)
        if not (abs(det) > 1e-300):
            return K, W, T, False
        dx = np.linalg.solve(a, b)
        K1 = max(K + dx[0], 0.0)
        W1 = max(W + dx[1], 0.0)
        T1 = T + dx[2]
        small = (abs(K1 - K) <= 4.0 * _EPS * max(abs(K1), 1e-300)
                 and abs(W1 - W) <= 4.0 * _EPS * max(abs(W1), 1e-300)
                 and abs(T1 - T) <= 4.0 * _EPS * max(abs(T1), 1e-300))
        K, W, T = K1, W1, T1
        if small:
            return K, W, T, True
    r = (abs(g1(fns, K, 0.0, W, T, mu, eps)) + abs(fns(CHI_J, K, 0.0, W, T, mu, eps) - 1.0)
         + abs(fns(CHI_K, K, 0.0, W, T, mu, eps) - 1.0))
    return K, W, T, r <= 1e-12


@njit(**_JIT)
def g_grid(fns, Ks, Q, W, T, mu, eps, out):
    """g = F(K) - K on a grid of K."""
    for i in range(Ks.shape[0]):
        out[i] = g1(fns, Ks[i], Q, W, T, mu, eps)


@njit(**_JIT)
def expr_grid(fns, which, K, Q, W, T, mu, eps, out):
    """Expression number ``which`` evaluated elementwise over flat arrays K, Q, W, T."""
    for i in range(K.shape[0]):
        out[i] = fns(which, K[i], Q[i], W[i], T[i], mu, eps)


@njit(**_JIT)
def line_from_table(fns, Wq, Ks, Wt, Tt, St, mu, eps, outv, outK, outS, outR):
    """Critical line at each sigma_w^2 in Wq from the parametric table (Ks, Wt, Tt).

    Every point of the line is (W(K*), T(K*)) for its fixed point K*, so the
    candidates at a given W are the roots of W(K) - W along the table
    (which must include the turning points of W(K)); each is polished by
    Newton and kept if sigma_b^2 >= 0. Among those whose fixed point is
    stable and reached by the unit-norm input the smallest sigma_b^2 wins
    (the first crossing of chi_J* = 1 from sigma_b = 0; outR = 1). Where no
    candidate is reached, the smallest sigma_b^2 with F(K*) = K*, chi_J(K*)
    = 1 is returned with outR = 0 (an unstable or unreached fixed point: GELU
    at sigma_w = 1.63). One-input states only.
    """
    n = Ks.shape[0]
    for i in range(Wq.shape[0]):
        W = Wq[i]
        best_T, best_K = math.inf, math.nan
        un_T, un_K = math.inf, math.nan
        for j in range(n - 1):
            if St[j] != ST_OK or St[j + 1] != ST_OK:
                continue
            a, b = Wt[j] - W, Wt[j + 1] - W
            if abs(a) <= 8.0 * _EPS * W:
                a = 0.0       # equal within rounding (the line's end on the sigma_b = 0 axis)
            if abs(b) <= 8.0 * _EPS * W:
                b = 0.0
            if a == 0.0 and j > 0:
                continue   # counted as the right end of the previous cell
            if (a > 0.0 and b > 0.0) or (a < 0.0 and b < 0.0):
                continue
            f = 0.0 if a == b else a / (a - b)
            K = Ks[j] + f * (Ks[j + 1] - Ks[j])
            T = Tt[j] + f * (Tt[j + 1] - Tt[j])
            K1, W1, T1, ok = newton_line(fns, 0, K, W, T, mu, eps)
            if not ok:
                continue
            if not (T1 >= -1e-14 * max(1.0, K1)):
                continue
            T1 = max(T1, 0.0)
            if T1 >= best_T:
                continue
            is_reached = fns(CHI_K, K1, 0.0, W, T1, mu, eps) <= 1.0 + 1e-9
            if is_reached:
                Kr, Q, st, Kf, Qf = reached(fns, False, W, T1, mu, eps)
                is_reached = st == ST_OK and abs(Kr - K1) <= 1e-9 * max(1.0, K1)
            if is_reached:
                best_T, best_K = T1, K1
            elif T1 < un_T:
                un_T, un_K = T1, K1
        if best_T < math.inf:
            outv[i], outK[i], outS[i], outR[i] = best_T, best_K, ST_OK, 1
        elif un_T < math.inf:
            outv[i], outK[i], outS[i], outR[i] = un_T, un_K, ST_OK, 0
        else:
            outv[i], outK[i], outS[i], outR[i] = math.nan, math.nan, ST_NOLINE, 0
