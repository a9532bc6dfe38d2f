"""Quadrature activations at small variance K (ordered phase): the Gram matrices of ELU/SELU and the
one-point moments of user activations with exp(a) - 1 or log(1 + a) against mpmath.

Two errors this file pins down (both found by a scan of ``kernels``' diagonal against ``kernel_profile``):

* a breakpoint at h = 0 (ELU's, SELU's) has the same breakpoint set in z as a function without any, so
  the Hermite coefficients were computed on the trapezoid rule in z, which converges only
  algebraically across a kink: ELU's Gram diagonal was 2.6e-10 off at K = 1e-7 after one layer and
  4e-9 after 30;
* exp(a) - 1 and log(1 + a) were evaluated as written, losing every digit of a at |a| ~ 1e-16
  (ELU: 6e-15 at K = 1e-7, growing as K shrinks; log(1 + x^2): all digits at K = 1e-16).

References: 40-digit mpmath, one-dimensional quadratures of closed-form conditional expectations
(v | u is Gaussian), written here and sharing nothing with the package.
"""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
import references as R
from meanfield.symbols import x as X

SELU_LAMBDA = mp.mpf("1.0507009873554804934193349852946")
SELU_ALPHA = mp.mpf("1.6732632423543772848170429916717")
CASES = {"elu": (mp.mpf(1), mp.mpf(1)), "selu": (SELU_LAMBDA, SELU_ALPHA)}


def _elu_moments(lam, alpha, K1, K2, K12):
    """(E[phi(u) phi(v)], E[phi'(u) phi'(v)]) for phi = lam (x (x > 0) + alpha (e^x - 1) (x <= 0)), by
    quadrature over u of E[phi(v) | u] and E[phi'(v) | u] in closed form (v | u ~ N(m, s^2))."""
    def phi(u):
        return lam * (u if u > 0 else alpha * mp.expm1(u))

    def dphi(u):
        return lam * (1 if u > 0 else alpha * mp.exp(u))

    r, s2 = K12 / K1, K2 - K12 * K12 / K1
    s = mp.sqrt(s2)

    def cond(u):
        m = r * u
        # E[v; v > 0] + alpha E[e^v - 1; v <= 0], and P(v > 0) + alpha E[e^v; v <= 0]
        ev = mp.exp(m + s2 / 2) * R.ncdf(-(m + s2) / s)
        return (lam * (m * R.ncdf(m / s) + s * R.npdf(m / s) + alpha * (ev - R.ncdf(-m / s))),
                lam * (R.ncdf(m / s) + alpha * ev))

    s1 = mp.sqrt(K1)
    pts = [-mp.inf, -8 * s1, -s1, 0, s1, 8 * s1, mp.inf]
    M = mp.quad(lambda u: phi(u) * cond(u)[0] * R.npdf(u / s1) / s1, pts)
    D = mp.quad(lambda u: dphi(u) * cond(u)[1] * R.npdf(u / s1) / s1, pts)
    return M, D


def _elu_second_moment(lam, alpha, K):
    s = mp.sqrt(K)
    return mp.quad(lambda z: (lam * (s * z if z > 0 else alpha * mp.expm1(s * z))) ** 2 * R.npdf(z),
                   [-mp.inf, -8, 0, 8, mp.inf])


def _inputs(scales):
    """Rows of dimension 4 with the given norms^2 / d and generic angles (rho ~ 0.3-0.8)."""
    rng = np.random.default_rng(11)
    base = rng.standard_normal(4)
    rows = [base + 0.9 * rng.standard_normal(4) for _ in scales]
    return np.array([r / np.sqrt(r @ r / 4) * np.sqrt(k) for r, k in zip(rows, scales)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["elu", "selu"])
def test_gram_at_small_K_against_mpmath(name):
    """Depth 2 (one activation): every entry of both kernels at K^1 from 1e-12 to 1e-3, within 1e-14 of the
    entry's scale sqrt(K(x, x) K(x', x')) (the series' error control; the diagonal relative to itself)."""
    lam, alpha = CASES[name]
    x = _inputs([1e-12, 1e-8, 1e-5, 1e-3])
    n = len(x)
    k = mf.kernels(mf.Architecture(name), x, depth=2, sigma_w=1.0, sigma_b=0.0)
    with mp.workdps(30):
        xs = [[mp.mpf(float(v)) for v in row] for row in x]
        K1 = [[mp.fsum(a * b for a, b in zip(p, q)) / 4 for q in xs] for p in xs]
        diag = [_elu_second_moment(lam, alpha, K1[i][i]) for i in range(n)]
        for i in range(n):
            assert abs(k.nngp[i, i] - diag[i]) <= 1e-14 * diag[i], (i, float(k.nngp[i, i]), float(diag[i]))
        for i in range(n):
            for j in range(i + 1, n):
                M, D = _elu_moments(lam, alpha, K1[i][i], K1[j][j], K1[i][j])
                scale = mp.sqrt(diag[i] * diag[j])
                assert abs(k.nngp[i, j] - M) <= 1e-14 * scale, (i, j, float(k.nngp[i, j]), float(M))
                # 'ntk': Theta^2 = K^2 + E[phi' phi'] K^1, against the same scale plus that of the second term
                T = M + D * K1[i][j]
                scale_t = scale + mp.sqrt(k.ntk[i, i] * k.ntk[j, j])
                assert abs(k.ntk[i, j] - T) <= 1e-14 * scale_t, (i, j, float(k.ntk[i, j]), float(T))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["elu", "selu"])
def test_gram_diagonal_deep_in_the_ordered_phase(name):
    """Depth 30 at sigma_w = 0.8 (ELU) and 0.6 (SELU), K^l -> 1e-8 and below: the diagonal equals the
    one-point recursion iterated in mpmath (ELU before the fix: 4e-9 off)."""
    lam, alpha = CASES[name]
    sw = {"elu": 0.8, "selu": 0.6}[name]
    x = _inputs([0.1, 1.0])
    k = mf.kernels(mf.Architecture(name), x, depth=30, sigma_w=sw, sigma_b=0.0, get="nngp")
    with mp.workdps(30):
        for i in range(2):
            K = mp.mpf(sw) ** 2 * mp.fsum(mp.mpf(float(v)) ** 2 for v in x[i]) / 4
            for _ in range(29):
                K = mp.mpf(sw) ** 2 * _elu_second_moment(lam, alpha, K)
            assert K < 1e-3
            assert abs(k.nngp[i, i] - K) <= 1e-14 * K, (i, float(k.nngp[i, i]), float(K))


@pytest.mark.slow
@pytest.mark.parametrize("K0", [1e-16, 1e-10, 1e-4])
def test_user_activation_with_log1p_at_small_K(K0):
    """phi = log(1 + x^2): E[phi^2] ~ 3 K^2 at small K, which log(1 + x^2) as written loses entirely at
    K = 1e-16 (1 + 1e-16 rounds to 1). kernel_profile (compiled one-point engine) against mpmath."""
    p = mf.kernel_profile(activation=sp.log(1 + X**2), sigma_w=1.0, sigma_b=0.0, depth=2, K0=K0)
    with mp.workdps(40):
        s = mp.sqrt(mp.mpf(K0))
        ref = mp.quad(lambda z: mp.log1p((s * z) ** 2) ** 2 * R.npdf(z), [-mp.inf, -8, 0, 8, mp.inf])
    assert abs(p.K[-1] - ref) <= 1e-14 * ref, (float(p.K[-1]), float(ref))


@pytest.mark.parametrize("name", ["silu", "softplus", "gelu_tanh", "elu", "selu"])
def test_stable_forms_stay_finite_at_large_h(name):
    """The printed forms of phi and phi' (stable_forms.stable_form) are finite at |h| = 800 .. 1e9 in float64, so the
    quadratures never need the mpmath fallback there (the expm1 rewrite must not undo the merged
    exponentials: a whole-tree codegen optimize() split the SiLU derivative's exp(-x - 2 softplus(-x)) into
    exp(-x) exp(-softplus(-x)), inf * 0 at x = -800). Values against mpmath at 30 digits."""
    from meanfield.activations import activation
    from meanfield.stable_forms import softplus_numpy
    from meanfield.stable_forms import stable_form

    e = activation(name).expr
    h = np.array([-1e9, -1e3, -800.0, -30.0, 30.0, 800.0, 1e3, 1e9])
    for expr in (e, sp.diff(e, X)):
        fast = sp.lambdify(X, stable_form(expr), modules=[{"_softplus": softplus_numpy}, "numpy", "scipy"])
        with np.errstate(all="ignore"):
            got = np.asarray(fast(h), dtype=float)
        assert np.all(np.isfinite(got)), (name, expr, got)
        slow = sp.lambdify(X, expr, modules="mpmath")
        with mp.workdps(30):
            for v, g in zip(h, got):
                ref = slow(mp.mpf(v))
                assert abs(g - ref) <= 1e-15 * (1 + abs(ref)), (name, v, g, ref)
