"""A 50-digit mpmath reference for the pair recursion of meanfield.kernels (near-parallel pairs).

Part of tests/references (not collected by pytest); imported by tests/test_gram_near_parallel.py
and benchmarks/gram_near_parallel.py.

The recursion starts from the float64 inputs as given, in exact arithmetic (x.x' of two float64
vectors is a sum of exact 106-bit products, exact at 50 digits), and applies the block's layers
with every two-point moment written out in mpmath (tests/references/closed_forms.py), not taken
from meanfield:

* scale-invariant phi = a x (x > 0) + b x (x < 0): the arc-cosine kernels (Cho & Saul 2009),
  E[phi(u)phi(v)] = ab K12 + (a-b)^2/(2 pi) sqrt(K1 K2) (sin t + (pi - t) cos t), t = arccos rho,
  E[phi'(u)phi'(v)] = ab + (a-b)^2 (pi - t)/(2 pi), E[phi] = (a-b) sqrt(K/(2 pi));
* erf: Williams (1997), (2/pi) arcsin(2 K12/sqrt((1+2K1)(1+2K2))), (4/pi)/sqrt((1+2K1)(1+2K2) - 4K12^2);
* GELU: the two-point form of Tsuchida et al. (2021) (meanfield.activations.Gelu's docstring),
  written out again; ``_gelu_pair_quad`` is the same by quadrature over u of conditional
  expectations (one-dimensional Gaussian identities), used to check it.

:func:`check_closed_forms` compares the first two with the same conditional-expectation
quadrature (tests/test_gram.py's route) at near-parallel points, so the reference does not rest
on the formulas alone.
"""
import mpmath as mp

from .closed_forms import (derf, erf_cond, erf_one, erf_pair, gelu_cond, gelu_one, gelu_pair, relu_cond,
                           scale_invariant_pair)
from .gaussian import expect_conditional, ncdf, npdf


def _gelu_pair_quad(K1, K2, K12):
    """GELU's two-point moments by quadrature over u of conditional expectations (checks gelu_pair)."""
    f = lambda u: u * ncdf(u)                        # noqa: E731
    df = lambda u: ncdf(u) + u * npdf(u)             # noqa: E731
    M = expect_conditional(f, lambda m, s: gelu_cond(m, s)[0], K1, K2, K12)
    D = expect_conditional(df, lambda m, s: gelu_cond(m, s)[1], K1, K2, K12)
    return M, D


def activation(name):
    """(pair(K1, K2, K12) -> (E phi phi, E phi' phi'), one(K) -> (E phi^2, E phi))."""
    if name == "relu":
        return scale_invariant_pair(1, 0)
    if name == "leaky_relu":
        return scale_invariant_pair(1, mp.mpf(1) / 10)   # meanfield: act('leaky_relu', negative_slope=0.1)
    if name == "abs":
        return scale_invariant_pair(1, -1)
    if name == "erf":
        return erf_pair, erf_one
    if name == "gelu":
        return gelu_pair, gelu_one
    raise ValueError(name)


# ---------------------------------------------------------------------------
# The recursion.
# ---------------------------------------------------------------------------
class _Pair:
    """(K1, K2, K12, Theta_ntk, Theta_standard, m1, m2) of a pair, in mpmath."""

    def __init__(self, K1, K2, K12, T, Ts, m1=0, m2=0):
        self.K1, self.K2, self.K12, self.T, self.Ts = K1, K2, K12, T, Ts
        self.m1, self.m2 = mp.mpf(m1), mp.mpf(m2)


def _dense(p, sw, sb, width):
    sw2, sb2 = sw * sw, sb * sb
    K12 = sw2 * p.K12 + sb2
    return _Pair(sw2 * p.K1 + sb2, sw2 * p.K2 + sb2, K12, K12 + sw2 * p.T, width * p.K12 + 1 + sw2 * p.Ts)


def _act(p, name):
    pair, one = activation(name)
    M, D = pair(p.K1, p.K2, p.K12)
    (M1, m1), (M2, m2) = one(p.K1), one(p.K2)
    return _Pair(M1, M2, M, D * p.T, D * p.Ts, m1, m2)


def _layer_norm(p):
    v1, v2 = p.K1 - p.m1 ** 2, p.K2 - p.m2 ** 2
    d = mp.sqrt(v1 * v2)
    return _Pair(mp.mpf(1), mp.mpf(1), (p.K12 - p.m1 * p.m2) / d, p.T / d, p.Ts / d)


def block(p, name, norm, mu, sw, sb, width, shortcut=False):
    """One block: [ln_pre: LN,] phi, [ln_post: LN,] dense; with mu: + mu^2 (skip), the skip a dense layer of
    its own weights when ``shortcut`` (a projection: its state is the dense map of the input's)."""
    q = p
    if norm == "ln_pre":
        q = _layer_norm(q)
    q = _act(q, name)
    if norm == "ln_post":
        q = _layer_norm(q)
    q = _dense(q, sw, sb, width)
    if mu is not None:
        m2 = mu * mu
        if shortcut:
            p = _dense(p, sw, sb, width)
        q = _Pair(q.K1 + m2 * p.K1, q.K2 + m2 * p.K2, q.K12 + m2 * p.K12, q.T + m2 * p.T, q.Ts + m2 * p.Ts)
    return q


def recursion(x, y, name, norm, mu, depth, sw, sb, width, dps=50, record=(), shortcut=False):
    """{l: (K^l, Theta^l_ntk, Theta^l_standard)} of the pair (x, y) for l in ``record`` (and ``depth``).

    x, y: float64 vectors, taken exactly. width: the standard parameterisation's hidden fan-in.
    """
    out = {}
    with mp.workdps(dps):
        xs = [mp.mpf(float(v)) for v in x]
        ys = [mp.mpf(float(v)) for v in y]
        d = len(xs)
        sw, sb = mp.mpf(sw), mp.mpf(sb)
        mu = None if mu is None else mp.mpf(mu)

        def dot(p, q):
            return mp.fsum(a * b for a, b in zip(p, q))

        raw = (dot(xs, xs), dot(ys, ys), dot(xs, ys))
        K = [sw * sw * r / d + sb * sb for r in raw]
        p = _Pair(K[0], K[1], K[2], K[2], raw[2] + 1)
        for layer in range(1, depth + 1):
            if layer > 1:
                p = block(p, name, norm, mu, sw, sb, mp.mpf(width), shortcut)
            if layer in record or layer == depth:
                out[layer] = (p.K12, p.T, p.Ts)
    return out


def check_closed_forms(points, dps=40):
    """max relative difference between the closed forms above and conditional-expectation quadrature."""
    worst = mp.mpf(0)
    with mp.workdps(dps):
        for K1, K2, K12 in points:
            K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
            M, D = scale_invariant_pair(1, 0)[0](K1, K2, K12)
            Mq = expect_conditional(lambda u: max(u, 0), lambda m, s: relu_cond(m, s)[0], K1, K2, K12)
            Dq = expect_conditional(lambda u: mp.mpf(u > 0), lambda m, s: relu_cond(m, s)[1], K1, K2, K12)
            M2, D2 = erf_pair(K1, K2, K12)
            M2q = expect_conditional(mp.erf, lambda m, s: erf_cond(m, s)[0], K1, K2, K12)
            D2q = expect_conditional(derf, lambda m, s: erf_cond(m, s)[1], K1, K2, K12)
            M3, D3 = gelu_pair(K1, K2, K12)
            M3q, D3q = _gelu_pair_quad(K1, K2, K12)
            for a, b in ((M, Mq), (D, Dq), (M2, M2q), (D2, D2q), (M3, M3q), (D3, D3q)):
                worst = max(worst, abs(a / b - 1))
    return worst
