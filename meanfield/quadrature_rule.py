"""The quadrature rule of meanfield's Gaussian expectations, shared by both engines.

E[f(h)], h ~ N(0, K), with z = h / sqrt(K) and the line split at z = 0 and
at the breakpoints of f: exp-sinh on the two tails from their outer
breakpoints, tanh-sinh on the finite pieces, trapezoid in t with step
``h0``, every level halving the step of all pieces (the method and its
tolerances: :mod:`meanfield.gaussian`). This module holds the rule once:

- the node generators (:func:`seg_range`, :func:`es_node`, :func:`ts_node`,
  :func:`base_tables`), the breakpoints (:func:`breaks`,
  :func:`scale_cuts`) and the convergence step (:func:`update`), plain
  numpy/math code that :mod:`meanfield._quadrature_numba` compiles as it is;
- :func:`quad_levels`, the engine with a vectorised integrand (the numpy
  engine: :func:`meanfield.gaussian.expect` and the interpreted twins of
  compiled modules). The compiled engine (:mod:`meanfield._quadrature_numba`)
  visits the same nodes one at a time, in loops that compile faster than
  array expressions; tests/test_user_activations.py checks that the two
  agree.

The integrand ``F_`` returns (value, scale, error): the scale is |f| for
one variable and E[|f| | u] for the outer level of the nested two-point
rule, so that the error is always relative to E|f|.
"""
import numpy as np

__all__ = ["seg_range", "es_node", "ts_node", "breaks", "scale_cuts", "update", "base_tables", "segment",
           "quad_levels"]


def seg_range(seg, h0, t_lo, t_hi):
    """Grid indices k (t = t_lo + k step) of segment ``seg`` of the nested
    trapezoid rule on [t_lo, t_hi]: seg 0 the even and seg 1 the odd nodes of
    step h0, seg L + 1 the nodes new at step h0 / 2^L. Returns (start, stop, stride, step)."""
    n0 = int(np.floor((t_hi - t_lo) / h0 + 1e-9))
    if seg == 0:
        return 0, n0 + 1, 2, h0
    if seg == 1:
        return 1, n0 + 1, 2, h0
    return 1, n0 * 2 ** (seg - 1), 2, h0 / 2.0 ** (seg - 1)


def es_node(t, step):
    """exp-sinh node u > 0 and weight (normal density included) at t (scalar or array)."""
    u = np.exp(0.5 * np.pi * np.sinh(t))
    return u, step * u * 0.5 * np.pi * np.cosh(t) * np.exp(-0.5 * u * u) * 0.3989422804014327


def ts_node(t, step):
    """tanh-sinh node on [0, 1] (s, and 1 - s without cancellation) and weight at t."""
    y = np.pi * np.sinh(t)
    s = 1.0 / (1.0 + np.exp(-y))
    c = 1.0 / (1.0 + np.exp(y))
    return s, c, step * np.pi * np.cosh(t) * s * c


def breaks(s, cuts, zmax):
    """Sorted breakpoints in z = h / s: 0 and cuts / s (those with |z| < zmax)."""
    zc = np.zeros(cuts.size + 1)
    m = 1
    for i in range(cuts.size):
        z = cuts[i] / s
        if z != 0.0 and abs(z) < zmax:
            zc[m] = z
            m += 1
    return np.sort(zc[:m])


def scale_cuts(cuts, s):
    """The one-point engine's breakpoints in h: ``cuts``, plus h = +-1, +-8, +-40 where s > 1e3.

    At s = sqrt(K) > 1e3 the exp-sinh rule from z = 0 spaces its nodes by a
    factor ~2 in h near |h| ~ 1, where an activation has its structure, and
    its error estimate fails there: SiLU'^2 at K = 1e15 passed the base test
    with an error of 2e-13, GELU-tanh'^2 at K = 1e20 the refined one (estimate
    8e-13, error 1.3e-13). Pieces [0, 1], [1, 8], [8, 40] in h (tanh-sinh),
    and the tails from 40 on, resolve it: <= 2.4e-16 at K = 1e6..1e26. (The
    nested two-point engine does not add them: there they cost 9x.)"""
    if not s > 1e3:
        return cuts
    out = np.empty(cuts.size + 6)
    out[:cuts.size] = cuts
    out[cuts.size:] = np.array([1.0, -1.0, 8.0, -8.0, 40.0, -40.0])
    return out


def update(seg, part, part_abs, part_err, total, total_abs, total_err, tol0, tol):
    """One step of the nested trapezoid rule and its convergence test (both engines).

    ``part``, ``part_abs``, ``part_err``: the weighted sums over the nodes of
    segment ``seg`` of F_'s value, its scale and its own error (nonzero
    only for the outer level of the two-point rule: an inner integral that
    did not converge). Segment 0 (the even nodes) gives I_(-1), the rule with
    twice the step; each later segment halves the step:
    I_L = I_(L-1) / 2 + part. The estimate delta = |I_L - I_(L-1)| / S_L
    (S: the same rule applied to the scale, ~E|f|) is accepted at tol0 for
    the base rule (L = 0) and at tol for a refined level; the integrand's
    own error E_L must then be below tol S_L too.
    Returns (I_L, S_L, E_L, delta, state): 1 converged, 0 go on, -1 failed.
    """
    if seg == 0:
        return 2.0 * part, 2.0 * part_abs, 2.0 * part_err, np.inf, 0
    new = 0.5 * total + part
    new_abs = 0.5 * total_abs + part_abs
    new_err = 0.5 * total_err + part_err
    if not np.isfinite(new):
        return new, new_abs, new_err, np.inf, -1
    diff = abs(new - total)
    delta = diff / new_abs if new_abs > 0.0 else diff
    if delta <= (tol0 if seg == 1 else tol):
        # refining this level further would not reduce the integrand's own error
        return new, new_abs, new_err, delta, (1 if new_err <= tol * new_abs else -1)
    return new, new_abs, new_err, delta, 0


def base_tables(h0, es_lo, es_hi, ts_t):
    """(es_tab, ts_tab): rows (u, w) of the exp-sinh and (s, 1 - s, w) of the tanh-sinh
    nodes at t = t_lo + k h0, k = 0..n0 (the base rule: segments 0 and 1), by the
    same node functions as the engine, vectorised."""
    k = np.arange(seg_range(1, h0, es_lo, es_hi)[1])
    es_tab = np.stack(es_node(es_lo + h0 * k, h0), axis=1)
    k = np.arange(seg_range(1, h0, -ts_t, ts_t)[1])
    ts_tab = np.stack(ts_node(-ts_t + h0 * k, h0), axis=1)
    return np.ascontiguousarray(es_tab), np.ascontiguousarray(ts_tab)


def segment(zc, seg, h0, es_lo, es_hi, ts_t):
    """Nodes z and weights of segment ``seg`` over all pieces (vectorised form of
    the loops of the compiled engine): exp-sinh on the two tails from the outer
    breakpoints, tanh-sinh on the finite pieces. Only nodes of positive weight.
    The base rule's segments (0 and 1) are remembered per breakpoint set (a
    small table: most integrands have none but 0, and every call uses them)."""
    key = None
    if seg <= 1:
        key = (zc.tobytes(), seg, h0, es_lo, es_hi, ts_t)
        hit = _SEGMENTS.get(key)
        if hit is not None:
            return hit
    m = zc.size
    k0, k1, dk, step = seg_range(seg, h0, es_lo, es_hi)
    u, wu = es_node(es_lo + step * np.arange(k0, k1, dk), step)
    lo, hi = zc[0], zc[m - 1]
    zs = [lo - u, hi + u]
    ws = [wu * np.exp(lo * u - 0.5 * lo * lo), wu * np.exp(-hi * u - 0.5 * hi * hi)]
    if m > 1:
        k0, k1, dk, step = seg_range(seg, h0, -ts_t, ts_t)
        sk, ck, wk = ts_node(-ts_t + step * np.arange(k0, k1, dk), step)
        for j in range(m - 1):
            a, b = zc[j], zc[j + 1]
            L = b - a
            zz = np.where(sk <= 0.5, a + L * sk, b - L * ck)
            zs.append(zz)
            ws.append(L * wk * np.exp(-0.5 * zz * zz) * 0.3989422804014327)
    z, w = np.concatenate(zs), np.concatenate(ws)
    keep = w > 0.0
    out = z[keep], w[keep]
    if key is not None:
        if len(_SEGMENTS) >= 512:
            _SEGMENTS.clear()
        out[0].setflags(write=False)
        out[1].setflags(write=False)
        _SEGMENTS[key] = out
    return out


_SEGMENTS = {}


def _sums(v, a, e, w):
    """The weighted sums of F_'s value, scale and error (e None: a plain integrand, no error)."""
    return np.sum(v * w), np.sum(a * w), (0.0 if e is None else np.sum(e * w))


def quad_levels(s, cuts, F_, h0, es_lo, es_hi, ts_t, zmax, max_level, tol0, tol):
    """E[F_(s z)], z ~ N(0, 1), split at z = 0 and at z = cuts / s.

    F_ maps an array of h to (f(h), scale(h), error(h)): the scale is |f(h)|
    and the error 0 (or None) for a plain integrand; for the outer level of a nested
    one they are E[|f| | h] and the inner level's error estimate where it
    did not converge, so that the error is always measured against E|f| (a
    conditional mean that cancels, as E[f(u) f(v) | u] at zero correlation,
    is still accepted, and an inner integral that does not converge where
    the Gaussian weight is 1e-30 does not matter).
    Returns (value, E[scale], relative error estimate, converged). Every
    level halves the step of all pieces; the estimate is
    |I_L - I_(L-1)| / E[scale] (I_(-1): the even nodes of level 0, i.e. twice
    the step); at most max_level halvings. The base rule (segments 0 and 1)
    is evaluated in one call of F_, so that the common case, accepted there,
    costs one vectorised evaluation.
    """
    if not s > 0.0:
        # the limit K -> 0+: the mean of f(0+) and f(0-) where f jumps at 0
        v, a, e = F_(np.array([1e-300, -1e-300]))
        e = 0.0 if e is None else np.sum(e)
        return 0.5 * np.sum(v), 0.5 * np.sum(a), 0.0, e <= tol * np.sum(a)
    zc = breaks(s, cuts, zmax)
    z0, w0 = segment(zc, 0, h0, es_lo, es_hi, ts_t)
    z1, w1 = segment(zc, 1, h0, es_lo, es_hi, ts_t)
    n0 = z0.size
    v, a, e = F_(s * np.concatenate((z0, z1)))
    p0 = _sums(v[:n0], a[:n0], None if e is None else e[:n0], w0)
    total, total_abs, total_err, delta, state = update(0, p0[0], p0[1], p0[2], 0.0, 0.0, 0.0, tol0, tol)
    p1 = _sums(v[n0:], a[n0:], None if e is None else e[n0:], w1)
    total, total_abs, total_err, delta, state = update(1, p1[0], p1[1], p1[2], total, total_abs, total_err,
                                                        tol0, tol)
    if state != 0:
        return total, total_abs, delta, state == 1
    for seg in range(2, max_level + 2):
        z, w = segment(zc, seg, h0, es_lo, es_hi, ts_t)
        v, a, e = F_(s * z)
        p = _sums(v, a, e, w)
        total, total_abs, total_err, delta, state = update(seg, p[0], p[1], p[2], total, total_abs, total_err,
                                                            tol0, tol)
        if state != 0:
            return total, total_abs, delta, state == 1
    return total, total_abs, delta, False
