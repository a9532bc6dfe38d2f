"""GELU's tanh approximation (a quadrature activation whose expression holds sqrt(2) and sqrt(pi)) in
``kernels``: it raised NameError ('_mf_sqrt'), because the Gram map's rewrite of square roots reached
inside the integrands, which are evaluated without that namespace.

References, sharing no code with the package: the diagonal E[g(u)^2] by 25-digit mpmath quadrature; the
entries between inputs by a tensor Gauss-Hermite rule in numpy on the Cholesky factor of the pair
(g is entire and the variances O(1), so the rule converges exponentially; 200 and 240 nodes per axis must
agree to 4e-15 of the sum of |terms|).
"""
import mpmath as mp
import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss

import meanfield as mf
import references as R

C = mp.sqrt(2 / mp.pi)


def _g(h):
    return h / 2 * (1 + mp.tanh(C * (h + mp.mpf("0.044715") * h**3)))


def _g_np(h):
    return h / 2 * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))


def _pair(K1, K2, K12, n):
    """E[g(u) g(v)]: u = sqrt(K1) z1, v = K12 / sqrt(K1) z1 + sqrt(K2 - K12^2 / K1) z2."""
    z, w = hermegauss(n)
    w = w / np.sqrt(2 * np.pi)
    s1, a, s = np.sqrt(K1), K12 / np.sqrt(K1), np.sqrt(K2 - K12 * K12 / K1)
    U = _g_np(s1 * z)[:, None]
    V = _g_np(a * z[:, None] + s * z[None, :])
    T = w[:, None] * w[None, :] * U * V
    return T.sum(), np.abs(T).sum()


@pytest.mark.slow
def test_gelu_tanh_gram_against_independent_quadrature():
    rng = np.random.default_rng(8)
    X = rng.standard_normal((3, 6)) * np.array([[0.5], [1.0], [2.0]])
    k = mf.kernels(mf.Architecture("gelu_tanh"), X, depth=2, sigma_w=1.2, sigma_b=0.3, get="nngp")
    with mp.workdps(25):
        xs = [[mp.mpf(float(v)) for v in row] for row in X]
        K1 = [[mp.mpf("1.44") * mp.fsum(a * b for a, b in zip(p, q)) / 6 + mp.mpf("0.09") for q in xs] for p in xs]
        diag = [mp.quad(lambda z: _g(mp.sqrt(K1[i][i]) * z) ** 2 * R.npdf(z), [-mp.inf, -3, 0, 3, mp.inf])
                for i in range(3)]
        for i in range(3):
            ref = mp.mpf("1.44") * diag[i] + mp.mpf("0.09")
            assert abs(k.nngp[i, i] - ref) <= 1e-14 * ref, (i, float(k.nngp[i, i]), float(ref))
    K1 = 1.44 * (X @ X.T) / 6 + 0.09
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        (v, a), (v2, _) = (_pair(K1[i, i], K1[j, j], K1[i, j], n) for n in (240, 200))
        assert abs(v - v2) <= 4e-15 * a, (v, v2)   # rounding of 160^2 terms; far below the 1e-14 tested
        ref = 1.44 * v + 0.09
        scale = np.sqrt(k.nngp[i, i] * k.nngp[j, j])
        assert abs(k.nngp[i, j] - ref) <= 1e-14 * scale, (i, j, k.nngp[i, j], ref)


@pytest.mark.slow
def test_gelu_tanh_gram_diagonal_matches_kernel_profile():
    """Depth 12, both kernels: the diagonal of the NNGP is the one-point recursion of kernel_profile."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((4, 5)) * np.array([[0.3], [1.0], [1.7], [2.5]])
    sw, sb = 1.4, 0.2
    k = mf.kernels(mf.Architecture("gelu_tanh", norm="ln_post"), X, depth=12, sigma_w=sw, sigma_b=sb)
    assert np.all(np.isfinite(k.ntk)) and np.all(np.linalg.eigvalsh(k.ntk) > 0)
    k = mf.kernels(mf.Architecture("gelu_tanh"), X, depth=12, sigma_w=sw, sigma_b=sb, get="nngp")
    K0 = sw**2 * np.einsum("ij,ij->i", X, X) / 5 + sb**2
    p = mf.kernel_profile(mf.Architecture("gelu_tanh"), sigma_w=sw, sigma_b=sb, depth=12, K0=K0)
    np.testing.assert_allclose(np.diag(k.nngp), p.K[:, -1], rtol=1e-14, atol=0)
