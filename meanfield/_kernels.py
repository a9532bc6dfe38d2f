# flake8: noqa: F821
"""Solver kernels, compiled per architecture (template, not imported directly).

:mod:`meanfield.numeric` appends this file to the generated module of an
architecture, after the compiled expressions ``kernel``, ``kernel12``,
``chi_J``, ``chi_K``, ... (all ``f(K, K12, W, T, mu, eps)``), so every
kernel here calls them directly and numba caches the whole module on disk.
W = sigma_w**2 and T = sigma_b**2 throughout.

Status codes returned with every fixed point:
  0 OK        converged (to double precision)
  1 INF       the kernel diverges (no fixed point in the direction the map moves)
  2 MAXITER   iteration cap reached without convergence
  3 NAN       the recursion produced NaN (outside its domain)
  4 CYCLE     the map overshoots with chi_K < -1: the iteration oscillates, no limit
"""

ST_OK = 0
ST_INF = 1
ST_MAXITER = 2
ST_NAN = 3
ST_CYCLE = 4

_EPS = 2.220446049250313e-16
_KMAX = 1e250          # beyond this the kernel is declared divergent
_KINF = 1e100          # chi at K = inf is evaluated here (and along the growth direction)


# ---------------------------------------------------------------------------
# Small helpers.
# ---------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", nogil=True)
def g1(K, K12, W, T, mu, eps):
    """F(K) - K for the one-input state."""
    return kernel(K, K12, W, T, mu, eps) - K


@njit(cache=True, error_model="numpy", nogil=True)
def _isfinite(x):
    return not (math.isnan(x) or math.isinf(x))


@njit(cache=True, error_model="numpy", nogil=True)
def _brent_g(a, b, fa, fb, K12, W, T, mu, eps):
    """Root of g1 in [a, b] (fa fb <= 0), Brent's method to double precision."""
    if fa == 0.0:
        return a
    if fb == 0.0:
        return b
    c, fc = a, fa
    d = b - a
    e = d
    for _ in range(200):
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
        fb = g1(b, K12, W, T, mu, eps)
    return b


@njit(cache=True, error_model="numpy", nogil=True)
def _min_dg(lo, hi, sgn, K12, W, T, mu, eps):
    """Golden-section minimum of sgn * g1 on [lo, hi]: (x, value)."""
    gr = 0.6180339887498949
    a, b = lo, hi
    x1 = b - gr * (b - a)
    x2 = a + gr * (b - a)
    f1 = sgn * g1(x1, K12, W, T, mu, eps)
    f2 = sgn * g1(x2, K12, W, T, mu, eps)
    for _ in range(120):
        if abs(b - a) <= 4.0 * _EPS * max(abs(a), abs(b), 1e-300):
            break
        if f1 < f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - gr * (b - a)
            f1 = sgn * g1(x1, K12, W, T, mu, eps)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + gr * (b - a)
            f2 = sgn * g1(x2, K12, W, T, mu, eps)
    if f1 < f2:
        return x1, f1
    return x2, f2


# ---------------------------------------------------------------------------
# Fixed points.
# ---------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", nogil=True)
def fixed_point1(K0, K12, W, T, mu, eps, maxiter):
    """The fixed point of K -> F(K) that iteration from K0 reaches: (K*, status, evaluations).

    For an increasing map F the iterates move monotonically towards the first
    root of g = F(K) - K in the direction sign g(K0) and never pass it; so
    K* is that root, and it is found by marching with growing steps until g
    changes sign (then Brent) or touches zero (a half-stable, tangent fixed
    point, located by minimising |g|), or until K passes 1e250 (divergent:
    K* = inf). A map that overshoots (decreasing F) is followed by plain
    iteration with the root bracketed as soon as it is crossed.
    """
    K = K0
    g = g1(K, K12, W, T, mu, eps)
    nev = 1
    if not _isfinite(g):
        if K > _KMAX:
            return math.inf, ST_INF, nev
        return math.nan, ST_NAN, nev
    if g == 0.0:
        return K, ST_OK, nev
    d = 1.0 if g > 0.0 else -1.0
    # march: probes a + d * step with the step growing geometrically
    a, ga = K, g
    step = abs(g)
    have_prev = False
    p_prev, s_prev = K, d * g
    tang_tol = 16.0 * _EPS
    for it in range(maxiter):
        p = a + d * step
        if p <= 0.0:
            p = 0.0
        if p > _KMAX:
            return math.inf, ST_INF, nev
        gp = g1(p, K12, W, T, mu, eps)
        nev += 1
        if not _isfinite(gp):
            if p > 1e150 or (math.isinf(gp) and d * gp > 0):
                return math.inf, ST_INF, nev
            return math.nan, ST_NAN, nev
        if d > 0.0 and p > 1e6 * max(1.0, K0) and abs(gp) <= 1024.0 * _EPS * p:
            # g is lost in rounding far above the start while still pushing
            # upwards: growth without a resolvable fixed point (e.g. linear
            # growth for mu = 1); report divergence rather than a noise root.
            return math.inf, ST_INF, nev
        sp_ = d * gp
        if sp_ <= 0.0:
            # the first sign change lies in (a, p]
            root = _brent_g(a, p, ga, gp, K12, W, T, mu, eps)
            return root, ST_OK, nev + 60
        sa = d * ga
        if have_prev and sa < s_prev and sa <= sp_:
            # sgn*g has a dip around a: does it reach zero there?
            lo = min(p_prev, p)
            hi = max(p_prev, p)
            xm, fm = _min_dg(lo, hi, d, K12, W, T, mu, eps)
            nev += 120
            scale = max(abs(xm), 1.0)
            if fm <= 0.0:
                gm = d * fm
                if d > 0:
                    root = _brent_g(p_prev, xm, d * s_prev, gm, K12, W, T, mu, eps)
                else:
                    root = _brent_g(xm, p_prev, gm, d * s_prev, K12, W, T, mu, eps)
                return root, ST_OK, nev + 60
            if fm <= tang_tol * scale:
                return xm, ST_OK, nev
        have_prev = True
        p_prev, s_prev = a, sa
        a, ga = p, gp
        if it < 30:
            step *= 2.0
        else:
            step *= 4.0
    return a, ST_MAXITER, nev


@njit(cache=True, error_model="numpy", nogil=True)
def fixed_point1_iterate(K0, K12, W, T, mu, eps, maxiter):
    """Plain iteration, for maps that are not monotone (chi_K < 0 somewhere).

    Stops when the step is below double precision or the bracketed root is
    found; returns CYCLE when the iteration keeps overshooting with
    |chi_K| > 1 at the bracketed root.
    """
    K = K0
    g = g1(K, K12, W, T, mu, eps)
    for n in range(maxiter):
        if not _isfinite(g):
            return math.nan, ST_NAN, n
        if g == 0.0:
            return K, ST_OK, n
        Kn = K + g
        if Kn < 0.0:
            Kn = 0.0
        if Kn > _KMAX:
            return math.inf, ST_INF, n
        gn = g1(Kn, K12, W, T, mu, eps)
        if _isfinite(gn) and (gn > 0.0) != (g > 0.0) and gn != 0.0:
            lo, hi, glo, ghi = K, Kn, g, gn
            if Kn < K:
                lo, hi, glo, ghi = Kn, K, gn, g
            root = _brent_g(lo, hi, glo, ghi, K12, W, T, mu, eps)
            ck = chi_K(root, K12, W, T, mu, eps)
            if ck < -1.0:
                return root, ST_CYCLE, n
            return root, ST_OK, n
        K, g = Kn, gn
    return K, ST_MAXITER, maxiter


@njit(cache=True, error_model="numpy", nogil=True)
def fixed_point2(K0, Q0, W, T, mu, eps, maxiter):
    """Fixed point of the pair map (K, K12) -> (F(K, K12), F12(K, K12)).

    Plain iteration; when both components contract geometrically with a
    steady ratio the geometric tail is summed (Aitken), and a steady ratio
    >= 1 (linear or faster growth) means divergence: (inf, inf) or (inf, K12*).
    Returns (K*, K12*, status, iterations, dK, dK12): the last steps give
    the direction of growth when the state diverges.
    """
    K, Q = K0, Q0
    dK_old, dQ_old = math.nan, math.nan
    rK_old, rQ_old = math.nan, math.nan
    steady = 0
    for n in range(maxiter):
        Kn = kernel(K, Q, W, T, mu, eps)
        Qn = kernel12(K, Q, W, T, mu, eps)
        if not (_isfinite(Kn) and _isfinite(Qn)):
            if K > 1e150:
                return math.inf, math.inf, ST_INF, n, math.nan, math.nan
            return math.nan, math.nan, ST_NAN, n, math.nan, math.nan
        if Kn > _KMAX:
            return math.inf, math.inf, ST_INF, n, Kn - K, Qn - Q
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
            return Kn, Qn, ST_OK, n, 0.0, 0.0
        if n >= 2 and abs(rK - rK_old) <= 1e-9 and abs(rQ - rQ_old) <= 1e-9:
            steady += 1
        else:
            steady = 0
        K, Q = Kn, Qn
        if steady >= 2:
            if rK >= 1.0 - 1e-12 and dK > 1e-8 * abs(K):
                if rQ >= 1.0 - 1e-12 and dQ != 0.0:
                    return math.inf, math.copysign(math.inf, dQ), ST_INF, n, dK, dQ
                Qs = Q + dQ * rQ / (1.0 - rQ) if abs(rQ) < 1.0 else Q
                return math.inf, Qs, ST_INF, n, dK, 0.0
            if abs(rK) < 1.0 and abs(rQ) < 1.0:
                K = K + dK * rK / (1.0 - rK)
                Q = Q + dQ * rQ / (1.0 - rQ)
                steady = 0
                dK_old, dQ_old = math.nan, math.nan
                rK_old, rQ_old = math.nan, math.nan
                continue
        dK_old, dQ_old = dK, dQ
        rK_old, rQ_old = rK, rQ
    return K, Q, ST_MAXITER, maxiter, math.nan, math.nan


@njit(cache=True, error_model="numpy", nogil=True)
def fixed_point(K0, Q0, W, T, mu, eps, pair, maxiter):
    """(K*, K12*, status, Kf, Qf) for one parameter point.

    K12* is nan for one-input states. (Kf, Qf) is where the factors at the
    fixed point are evaluated: the fixed point itself, or, where the kernel
    diverges, a far point along the direction of growth (K ~ 1e100), which
    gives the limits of chi_J and chi_K.
    """
    if pair:
        K, Q, st, _, dK, dQ = fixed_point2(K0, Q0, W, T, mu, eps, maxiter)
        if st == ST_INF:
            if _isfinite(dK) and dK > 0.0:
                L = _KINF / dK
                return K, Q, st, _KINF, (Q if _isfinite(Q) else 0.0) + dQ * L
            return K, Q, st, math.nan, math.nan
        return K, Q, st, K, Q
    K, st, _ = fixed_point1(K0, Q0, W, T, mu, eps, maxiter)
    if st == ST_MAXITER or st == ST_NAN:
        K2, st2, _ = fixed_point1_iterate(K0, Q0, W, T, mu, eps, maxiter)
        if st2 == ST_OK or st2 == ST_CYCLE or st2 == ST_INF:
            K, st = K2, st2
    if st == ST_INF:
        return K, math.nan, st, _KINF, Q0
    return K, math.nan, st, K, Q0


@njit(cache=True, error_model="numpy", nogil=True)
def fixed_point_many(K0, Q0, W, T, mu, eps, pair, maxiter, outK, outQ, outS, outX, outC):
    """Vectorised fixed_point over flattened arrays; also chi_J* and chi_K* there."""
    for i in range(W.shape[0]):
        K, Q, st, Kf, Qf = fixed_point(K0[i], Q0[i], W[i], T[i], mu, eps, pair, maxiter)
        outK[i] = K
        outQ[i] = Q
        outS[i] = st
        if st == ST_OK or st == ST_INF:
            outX[i] = chi_J(Kf, Qf, W[i], T[i], mu, eps)
            outC[i] = chi_K(Kf, Qf, W[i], T[i], mu, eps)
        else:
            outX[i] = math.nan
            outC[i] = math.nan


# ---------------------------------------------------------------------------
# Depth profiles.
# ---------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", nogil=True)
def profile(K0, Q0, W, T, mu, eps, pair, outK, outQ, outX):
    """K^l, K12^l and chi_J^l = J^{l,l+1} for l = 1..depth (arrays of length depth)."""
    K, Q = K0, Q0
    for l in range(outK.shape[0]):
        outK[l] = K
        outQ[l] = Q
        outX[l] = chi_J(K, Q, W, T, mu, eps)
        Kn = kernel(K, Q, W, T, mu, eps)
        if pair:
            Q = kernel12(K, Q, W, T, mu, eps)
        K = Kn
