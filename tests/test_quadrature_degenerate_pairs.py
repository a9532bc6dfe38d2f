"""Kinked quadrature activations on (nearly) degenerate pairs: exactly parallel or antiparallel inputs of
different norms, and pairs within 1e-12 of them.

For such a pair v = c u (or nearly), E[f(u) g(v) | u] follows g's kinks at u = (kink) / c, which the
nested engine's outer rule was not split at: hardtanh on (x, -0.6 x) was refused with "two-point
Gaussian quadrature did not reach its tolerance" at depth 2. The reference is a 30-digit mpmath
recursion whose inner expectation E[hardtanh(v) | u] is in closed form (v | u is Gaussian), so every
two-point moment is a one-dimensional quadrature split at the kinks of both factors; it shares no
code with the package.
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R


def _ht(u):
    return max(mp.mpf(-1), min(mp.mpf(1), u))


def _dht(u):
    return mp.mpf(1) if -1 < u < 1 else mp.mpf(0)


def _cond(m, s):
    """(E[ht(v)], E[ht'(v)]) for v ~ N(m, s^2), s >= 0."""
    if s == 0:
        return _ht(m), _dht(m)
    a, b = (-1 - m) / s, (1 - m) / s
    inside = m * (R.ncdf(b) - R.ncdf(a)) + s * (R.npdf(a) - R.npdf(b))
    return inside + (1 - R.ncdf(b)) - R.ncdf(a), R.ncdf(b) - R.ncdf(a)


def _pair(K1, K2, K12):
    """(E[ht(u) ht(v)], E[ht'(u) ht'(v)]) by quadrature over u, split at u = +-1 and at u = +-1 / c."""
    s1 = mp.sqrt(K1)
    c = K12 / K1
    s = mp.sqrt(max(K2 - K12 * K12 / K1, mp.mpf(0)))
    pts = {mp.mpf(-1), mp.mpf(1), mp.mpf(0)}
    if c != 0:
        pts |= {1 / c, -1 / c}
    pts = [-mp.inf] + sorted(pts) + [mp.inf]
    w = lambda u: R.npdf(u / s1) / s1   # noqa: E731
    M = mp.quad(lambda u: _ht(u) * _cond(c * u, s)[0] * w(u), pts)
    D = mp.quad(lambda u: _dht(u) * _cond(c * u, s)[1] * w(u), pts)
    return M, D


def _recursion(x, y, depth, sw, mu):
    """(K^depth(x, y), Theta^depth(x, y)) ('ntk' parameterisation, sigma_b = 0), K(x, x), K(y, y)."""
    d = len(x)
    xs, ys = [mp.mpf(float(v)) for v in x], [mp.mpf(float(v)) for v in y]
    dot = lambda p, q: mp.fsum(a * b for a, b in zip(p, q)) / d   # noqa: E731
    sw2 = mp.mpf(sw) ** 2
    K1, K2, K12 = sw2 * dot(xs, xs), sw2 * dot(ys, ys), sw2 * dot(xs, ys)
    T = K12
    for _ in range(depth - 1):
        M, D = _pair(K1, K2, K12)
        M1, M2 = _pair(K1, K1, K1)[0], _pair(K2, K2, K2)[0]
        m2 = 0 if mu is None else mp.mpf(mu) ** 2
        K1, K2, K12, T = (sw2 * M1 + m2 * K1, sw2 * M2 + m2 * K2, sw2 * M + m2 * K12,
                          sw2 * M + sw2 * D * T + m2 * T)
    return K12, T, K1, K2


@pytest.mark.slow
@pytest.mark.parametrize("depth, mu", [(2, None), (4, 0.7)])
def test_hardtanh_parallel_and_antiparallel_pairs(depth, mu):
    """x, -0.6 x, 2 x and x + 1e-13 e: every entry against mpmath within 1e-13 of its scale (the NTK of
    the near-identical pair: 2e-8)."""
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal(8)
    x0 *= 2.5 / np.linalg.norm(x0)
    e = rng.standard_normal(8)
    X = np.stack([x0, -0.6 * x0, 2.0 * x0, x0 + 1e-13 * e])
    k = mf.kernels(mf.Architecture("hardtanh", mu=mu), X, depth=depth, sigma_w=0.8, sigma_b=0.0)
    with mp.workdps(30):
        for i, j in [(0, 1), (0, 2), (1, 2), (0, 3), (2, 3)]:
            K, T, Ki, Kj = _recursion(X[i], X[j], depth, 0.8, mu)
            assert abs(k.nngp[i, i] - Ki) <= 1e-14 * Ki
            assert abs(k.nngp[i, j] - K) <= 1e-13 * mp.sqrt(Ki * Kj), (i, j, float(k.nngp[i, j]), float(K))
            scale = mp.sqrt(k.ntk[i, i] * k.ntk[j, j])
            # x0 + 1e-13 e: 1 - rho ~ 1e-27, which the rounded state (K1, K2, K12) cannot carry, and
            # E[ht'(u) ht'(v)] moves like sqrt(1 - rho) (ht' jumps): the documented ~1e-8 (docs/gram.md)
            tol = 2e-8 if j == 3 else 1e-13
            assert abs(k.ntk[i, j] - T) <= tol * scale, (i, j, float(k.ntk[i, j]), float(T))


@pytest.mark.slow
def test_compiled_pair_engine_on_an_antiparallel_pair():
    """kernel_profile's pair state (the compiled nested engine) at K12 = -K for hardtanh with a residual:
    K12^l = -K^l exactly by symmetry (hardtanh is odd), layer after layer."""
    p = mf.kernel_profile(activation="hardtanh", mu=0.7, sigma_w=1.3, sigma_b=0.0, depth=6, K0=2.0,
                          K12_0=-2.0, pair=True)
    assert np.all(np.isfinite(p.K12))
    np.testing.assert_allclose(p.K12, -p.K, rtol=1e-14, atol=0)
