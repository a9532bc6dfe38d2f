"""Gram matrices with LayerNorm after an activation with phi(0) != 0, at small preactivation variance K.

LayerNorm centres with K_i - m_i^2 and K12 - m1 m2; for softplus or the logistic sigmoid these are
differences of numbers ~phi(0)^2 that are O(K) apart, so float64 lost ~1e-16/K relative: at
K ~ 1e-6 the old code was 1e-9 off (NNGP and NTK), at K ~ 1e-10 the sigmoid's Gram matrices were
5e-5 off and softplus's were refused (Cauchy-Schwarz broken). The activation now supplies the
covariances of psi = phi - phi(0) (``Activation.centred_kernel``), carried by ``GramSignal.centred``.
What remains is the rounding of psi(h) = phi(h) - phi(0) itself in float64, ~1e-16/sqrt(K)
relative (as in the single-input path, tests/test_ln_post_small_K.py).

Reference: tests/references/gram_small_K.py, the recursion in mpmath at 60 digits with tensor Gauss-Hermite
two-point moments (checked here against finer rules, and, marked slow, nested adaptive QUADPACK quadrature).
"""
import numpy as np
import pytest
import sympy as sp

import meanfield as mf

import references.gram_small_K as R

_X = sp.Symbol("x")
ACTS = {"softplus": "softplus", "sigmoid": 1 / (1 + sp.exp(-_X))}


def _inputs(scale=1.0):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8))
    x[1] *= 1.3                                         # another norm, generic angle
    x[2] = x[0] + 1e-4 * rng.standard_normal(8)         # near-parallel: 1 - rho ~ 1e-9
    return x * scale


@pytest.mark.slow
def test_reference_rule_converged():
    # Gauss-Hermite rules against finer ones at 40 digits: 48 nodes at small K, 128 at the largest K the
    # cases reach (~1)
    assert R.check_convergence("sigmoid", 1e-6, 1.7e-6, 1.1e-6) < 1e-30
    assert R.check_convergence("softplus", 0.04, 0.03, 0.02) < 1e-30
    assert R.check_convergence("sigmoid", 1.3, 0.9, 0.7, n=128, m=160) < 1e-20


def _nested_quadpack(f, K1, K2, K12):
    """E f(u) f(v) by nested adaptive QUADPACK in float64 (~1e-14 relative): u = s1 z1, v = r u + t z2."""
    from scipy import integrate

    s1, r, t = np.sqrt(K1), K12 / K1, np.sqrt(K2 - K12 * K12 / K1)
    Z = 38.0                                                  # the Gaussian beyond is below 1e-300
    pdf = lambda z: np.exp(-z * z / 2) / np.sqrt(2 * np.pi)   # noqa: E731

    def inner(u):
        return integrate.quad(lambda z: f(r * u + t * z) * pdf(z), -Z, Z, epsabs=0, epsrel=5e-14, limit=200)[0]

    return integrate.quad(lambda z: f(s1 * z) * inner(s1 * z) * pdf(z), -Z, Z, epsabs=0, epsrel=5e-14,
                          limit=200)[0]


@pytest.mark.slow
def test_reference_rule_is_exact():
    # the tensor Gauss-Hermite rule of the reference against nested adaptive quadrature (scipy's QUADPACK,
    # an independent route, to its float64 accuracy: the cases need the reference to <= 1e-13)
    softplus = lambda h: np.logaddexp(0.0, h)                  # noqa: E731
    dsoftplus = lambda h: 0.5 * (1 + np.tanh(h / 2))           # noqa: E731
    import mpmath as mp

    K1, K2, K12 = 0.3, 0.5, 0.2
    with mp.workdps(30):
        f, df = R.FUNCTIONS["softplus"]
        out = R.pair_moments(f, df, mp.mpf(K1), mp.mpf(K2), mp.mpf(K12), dps=30)
    assert abs(_nested_quadpack(softplus, K1, K2, K12) / float(out[2]) - 1) < 1e-13
    assert abs(_nested_quadpack(dsoftplus, K1, K2, K12) / float(out[5]) - 1) < 1e-13


# (sigma_w, sigma_b, mu, input scale, rtol): K ~ 1e-6 and ~1e-10 in every block, or ~1e-10 at the
# input only (small-norm inputs, sigma_b = 0); rtol ~500 eps / sqrt(K) (the rounding of psi)
CASES = [
    (1e-3, 1e-4, None, 1.0, 1e-12),
    (1e-5, 3e-6, None, 1.0, 5e-11),
    (1e-5, 3e-6, 0.5, 1.0, 5e-11),
    # K ~ 1 after the first block: the reference needs 128 nodes there (~10 s a case)
    pytest.param(1.2, 0.0, None, 1e-5, 5e-11, marks=pytest.mark.slow),
    pytest.param(0.8, 0.2, 0.5, 1.0, 1e-13, marks=pytest.mark.slow),   # the centred moments change nothing
]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("sw, sb, mu, scale, rtol", CASES)
def test_ln_post_small_K_against_mpmath(name, sw, sb, mu, scale, rtol):
    x = _inputs(scale)
    depth = 3
    kw = {} if mu is None else {"mu": mu}
    arch = mf.Architecture(ACTS[name], norm="ln_post", **kw)
    r = mf.kernels(arch, x, depth=depth, sigma_w=sw, sigma_b=sb, per_layer=True)
    for i, j in ((0, 1), (0, 2), (1, 2), (0, 0)):
        K, T = R.recursion(x[i], x[j], name, depth, sw, sb, mu)
        assert r.nngp[i, j] == pytest.approx(float(K), rel=rtol, abs=0), (i, j)
        assert r.ntk[i, j] == pytest.approx(float(T), rel=rtol, abs=0), (i, j)
    # the diagonal is the single-input recursion
    for i in range(3):
        K0 = sw**2 * np.dot(x[i], x[i]) / x.shape[1] + sb**2
        kp = mf.kernel_profile(arch, sigma_w=sw, sigma_b=sb, depth=depth, K0=K0)
        np.testing.assert_allclose(r.nngp_diag[:, i], kp.K, rtol=1e-13)
    w = np.linalg.eigvalsh(r.ntk)
    assert w.min() > -1e-12 * w.max()
