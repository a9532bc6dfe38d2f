"""Critical exponents (analytic vs numeric) and finite-width corrections, against mpmath."""
import math

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf

pytestmark = pytest.mark.filterwarnings("error")
mp.mp.dps = 30


def E(f, K):
    K = mp.mpf(K)
    s = mp.sqrt(K)
    return mp.quad(lambda z: f(s * z) * mp.npdf(z), [-mp.inf, -6, -2, 0, 2, 6, mp.inf])


def test_erf_critical_point_zeta_one():
    """Paper eqs. 128-133: dK' = dK - 2 dK^2, chi_J = 1 - 2 dK: zeta_K = zeta = 1."""
    e = mf.exponents(activation="erf", sigma_w=math.sqrt(math.pi / 4), sigma_b=0.0)
    assert e.regime == "critical point"
    assert e.c2 == pytest.approx(2.0, rel=1e-12) and e.d1 == pytest.approx(2.0, rel=1e-12)
    assert e.zeta_K == 1.0 and e.zeta == pytest.approx(1.0, rel=1e-12)
    assert e.zeta_numeric == pytest.approx(1.0, rel=1e-3) and e.zeta_K_numeric == pytest.approx(1.0, rel=1e-3)
    assert e.agree


@pytest.mark.slow
@pytest.mark.parametrize("kw", [dict(activation="relu"), dict(activation="leaky_relu", negative_slope=0.2, mu=0.5)])
def test_scale_invariant_zeta_zero(kw):
    """Paper eq. 103: zeta_K = zeta = 0 at the scale-invariant critical point."""
    p = mf.critical_point(**kw)[0]
    e = mf.exponents(sigma_w=p.sigma_w, sigma_b=p.sigma_b, **kw)
    assert e.regime == "marginal" and e.zeta == 0 and e.zeta_K == 0
    assert abs(e.zeta_numeric) < 1e-6 and e.agree
    # every K is fixed: K* is where a unit-norm input sits, K^1 = sigma_w^2 + sigma_b^2
    assert e.K_star == pytest.approx(p.sigma_w ** 2 + p.sigma_b ** 2, rel=1e-12)


@pytest.mark.slow
def test_gelu_point_exponent():
    """At (1.408, 0.416) with K* = (3 + sqrt 17)/2: zeta = d1/c2 from an independent mpmath expansion.

    d1 = -d chi_J/dK and c2 = -F''(K*)/2 from mpmath quadratures of the derivatives of
    phi = x Phi(x) (Price's theorem): c2 > 0, so K* attracts from above, and zeta ~ -64.98 (J grows
    like l^65 on that side); the paper's 66.668 (eq. 169) follows from rounding
    c2 to 0.00014 and taking the other side.
    """
    K = (3 + mp.sqrt(17)) / 2
    # phi = x Phi(x) and its derivatives; K-derivatives by Price's theorem, d/dK E[f] = E[f'']/2
    p0 = lambda x: x * mp.ncdf(x)                                    # noqa: E731
    p1 = lambda x: mp.ncdf(x) + x * mp.npdf(x)                       # noqa: E731
    p2 = lambda x: mp.npdf(x) * (2 - x * x)                          # noqa: E731
    p3 = lambda x: mp.npdf(x) * (x ** 3 - 4 * x)                     # noqa: E731
    p4 = lambda x: mp.npdf(x) * (-x ** 4 + 7 * x * x - 4)            # noqa: E731
    with mp.workdps(25):
        Wv = 1 / E(lambda x: p1(x) ** 2, K)
        # d2/dK2 E[phi^2] = E[(phi^2)^(4)]/4 = E[3 p2^2 + 4 p1 p3 + p0 p4]/2
        q2 = E(lambda x: 3 * p2(x) ** 2 + 4 * p1(x) * p3(x) + p0(x) * p4(x), K) / 2
        # d/dK E[phi'^2] = E[p2^2 + p1 p3]
        g1 = E(lambda x: p2(x) ** 2 + p1(x) * p3(x), K)
        c2 = -Wv * q2 / 2
        d1 = -Wv * g1
    p = [pt for pt in mf.critical_point(activation="gelu") if pt.K_star > 1][0]
    e = mf.exponents(activation="gelu", sigma_w=p.sigma_w, sigma_b=p.sigma_b)
    assert e.c2 == pytest.approx(float(c2), rel=1e-8) and e.d1 == pytest.approx(float(d1), rel=1e-8)
    assert e.zeta == pytest.approx(float(d1 / c2), rel=1e-8)
    assert -65.0 < e.zeta < -64.95
    assert e.zeta_numeric == pytest.approx(e.zeta, rel=1e-3)
    assert e.zeta_K_numeric == pytest.approx(1.0, rel=1e-3)
    assert e.K0 > e.K_star and "converges to" in e.note and e.agree


def test_gelu_point_zero_has_no_scaling():
    e = mf.exponents(activation="gelu", sigma_w=2.0, sigma_b=0.0)
    assert e.K_star == 0 and np.isnan(e.zeta) and "no input converges" in e.note


@pytest.mark.slow
@pytest.mark.parametrize("sw,sb", [(1.0, 0.3), (0.5, 0.0), (2.0, 1.0)])
def test_ln_pre_mu1_power_law(sw, sb):
    """ReLU + pre-LN, mu = 1: K' = K + sw^2/2 + sb^2 and chi_J = 1 + (sw^2/2)/K, so J ~ l^(sw^2/(sw^2 + 2 sb^2))."""
    e = mf.exponents(activation="relu", norm="ln_pre", mu=1.0, sigma_w=sw, sigma_b=sb)
    assert e.regime == "power-law growth"
    assert e.zeta == pytest.approx(-sw ** 2 / (sw ** 2 + 2 * sb ** 2), rel=1e-9)
    assert e.zeta_numeric == pytest.approx(e.zeta, rel=1e-3) and e.agree


@pytest.mark.slow
def test_gelu_ln_pre_mu1_power_law():
    e = mf.exponents(activation="gelu", norm="ln_pre", mu=1.0, sigma_w=1.3, sigma_b=0.2)

    def gelu(x):
        return x * mp.ncdf(x)

    def dgelu(x):
        return mp.ncdf(x) + x * mp.npdf(x)

    a = 1.3 ** 2 * E(lambda x: gelu(x) ** 2, 1) + 0.04
    b = 1.3 ** 2 * E(lambda x: dgelu(x) ** 2, 1)
    assert e.zeta == pytest.approx(float(-b / a), rel=1e-9)
    assert e.agree


@pytest.mark.slow
@pytest.mark.parametrize("sw,sb", [(1.0, 0.0), (1.0, 0.5), (0.5, 1.0)])
def test_erf_mu1_stretched_exponential(sw, sb):
    """Theorem 4.3: chi_J^l ~ 1 + c~/sqrt(l), c~ = 2 sw^2 / (pi sqrt(sw^2 + sb^2)), lambda = 1/(4 c~^2)."""
    e = mf.exponents(activation="erf", mu=1.0, sigma_w=sw, sigma_b=sb)
    ref = 2 * sw ** 2 / (math.pi * math.sqrt(sw ** 2 + sb ** 2))
    assert e.regime == "stretched exponential" and e.p == 0.5
    assert e.c_tilde == pytest.approx(ref, rel=1e-9)
    assert e.c_tilde_numeric == pytest.approx(ref, rel=1e-2)
    assert e.lambda_ == pytest.approx(1 / (4 * ref ** 2), rel=1e-9)
    assert e.growth_rate == pytest.approx(sw ** 2 + sb ** 2, rel=1e-9)


@pytest.mark.slow
def test_bn_mu1_power_law():
    """ReLU + large-batch BN, mu = 1: K - K12 grows by (sw^2/2)(1 - 1/pi) per block and
    chi_J = 1 + sw^2/(2 (K - K12)): J ~ l^(pi/(pi-1))."""
    e = mf.exponents(activation="relu", norm="bn", mu=1.0, sigma_w=1.0, sigma_b=0.3)
    assert e.zeta == pytest.approx(-math.pi / (math.pi - 1), rel=1e-9)
    assert e.zeta_numeric == pytest.approx(e.zeta, rel=1e-3)


@pytest.mark.slow
def test_exponents_off_criticality_and_on_a_line():
    e = mf.exponents(activation="erf", sigma_w=1.0, sigma_b=0.5)
    assert e.regime == "ordered" and np.isnan(e.zeta) and e.xi == pytest.approx(mf.correlation_length(
        activation="erf", sigma_w=1.0, sigma_b=0.5))
    sb = mf.critical_line(activation="erf", norm="ln_pre", sigma_w=[1.0]).sigma_b[0]
    e = mf.exponents(activation="erf", norm="ln_pre", sigma_w=1.0, sigma_b=sb)
    assert e.regime == "critical line" and e.zeta == 0 and abs(e.zeta_numeric) < 1e-3


def test_exponent_arguments():
    with pytest.raises(ValueError, match="scalar"):
        mf.exponents(activation="erf", sigma_w=[1.0, 2.0], sigma_b=0.0)
    with pytest.raises(ValueError, match="depth"):
        mf.exponents(activation="erf", sigma_w=1.0, sigma_b=0.0, depth=10)


# ---------------------------------------------------------------------------
# Finite width (Lemma D.1 / D.4).
# ---------------------------------------------------------------------------
def test_chi_delta_against_quadrature():
    """chi_Delta = sw^2 E[phi''^2 + phi' phi'''] (Definition D.2), pointwise, for smooth phi."""
    def d1(x):
        return 2 / mp.sqrt(mp.pi) * mp.exp(-x * x)

    def d2(x):
        return -2 * x * d1(x)

    def d3(x):
        return (4 * x * x - 2) * d1(x)

    for sw, sb in ((1.0, 0.1), (2.0, 0.7)):
        K = sw ** 2 + sb ** 2
        ref = sw ** 2 * E(lambda x: d2(x) ** 2 + d1(x) * d3(x), K)
        assert mf.chi_Delta(activation="erf", sigma_w=sw, sigma_b=sb) == pytest.approx(float(ref), rel=1e-10)
    assert mf.chi_Delta(activation="relu", sigma_w=1.3, sigma_b=0.2) == 0.0


def test_l0_correction_and_input_apjn():
    sw, sb, N0 = 1.2, 0.3, 20
    corr = mf.l0_correction(activation="erf", sigma_w=sw, sigma_b=sb, N0=N0)
    K1 = sw ** 2 + sb ** 2
    chiJ1 = 4 * sw ** 2 / (math.pi * math.sqrt(1 + 4 * K1))
    chiD1 = -8 * sw ** 2 / (math.pi * (1 + 4 * K1) ** 1.5)
    assert corr == pytest.approx(1 + 2 * sw ** 2 * chiD1 / (N0 * chiJ1), rel=1e-12)   # eq. 33
    J_inf = mf.apjn_from_input(activation="erf", sigma_w=sw, sigma_b=sb, depth=5)
    J_N0 = mf.apjn_from_input(activation="erf", sigma_w=sw, sigma_b=sb, depth=5, N0=N0)
    assert J_inf[0] == J_N0[0] == pytest.approx(sw ** 2)                              # J^{0,1}
    assert np.allclose(J_N0[1:] / J_inf[1:], corr, rtol=1e-12)                          # eq. 36
    assert mf.l0_correction(activation="relu", sigma_w=1.4, sigma_b=0.1, N0=3) == 1.0
    with pytest.raises(ValueError, match="N0"):
        mf.l0_correction(activation="erf", sigma_w=1.0, sigma_b=0.0, N0=0)
