"""solvers/exponents.py: critical exponents (analytic vs numeric) against mpmath, and points typed
in next to the GELU critical point (13 digits, as copied from a table).

References: tests/references (mpmath quadrature of the activations coded by hand, K-derivatives by
Price's theorem, mp.findroot), never the package's code.
"""
import math
import re

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R

pytestmark = pytest.mark.filterwarnings("error")
mp.mp.dps = 30


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
    # K-derivatives of the moments by Price's theorem (tests/references/solves.py)
    _, c2, d1 = R.gelu_expansion((3 + mp.sqrt(17)) / 2, dps=25)
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
    a = 1.3 ** 2 * R.expect(lambda x: R.gelu(x) ** 2, 1, cuts=R.WIDE_CUTS) + 0.04
    b = 1.3 ** 2 * R.expect(lambda x: R.dgelu(x) ** 2, 1, cuts=R.WIDE_CUTS)
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
# Points typed in next to GELU's critical point.
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gelu_critical_point():
    """GELU's critical point (K*, sigma_w^2, sigma_b^2) and zeta = d1 / c2 with dK' = dK - c2 dK^2,
    chi_J = 1 - d1 dK (appendix G), from tests/references (mp.findroot, Price's theorem)."""
    K, W, T = R.gelu_critical_point()
    _, c2, d1 = R.gelu_expansion(K)
    # the paper's closed form K* = (3 + sqrt 17)/2 checks the mpmath solve independently
    k_err = abs(K - (3 + mp.sqrt(17)) / 2)
    return {"K": K, "W": W, "T": T, "zeta": d1 / c2, "c2": c2, "k_err": k_err}


@pytest.mark.slow
def test_reference_point_is_the_known_one(gelu_critical_point):
    assert gelu_critical_point["k_err"] < 1e-15
    assert gelu_critical_point["c2"] > 0   # attracting from above only (half-stable)


@pytest.mark.slow
@pytest.mark.parametrize("K0", [None, 5.0])
def test_exponents_from_13_digits(gelu_critical_point, K0):
    ref = gelu_critical_point
    sw_exact, sb_exact = mp.sqrt(ref["W"]), mp.sqrt(ref["T"])
    sw, sb = 1.4082110131076, 0.4158393809586   # as copied from a table
    assert abs(sw - float(sw_exact)) < 1e-13 and abs(sb - float(sb_exact)) < 1e-13
    e = mf.exponents(activation="gelu", sigma_w=sw, sigma_b=sb, K0=K0)
    assert e.regime == "critical point"
    assert abs(e.zeta - float(ref["zeta"])) <= 1e-9 * abs(float(ref["zeta"]))
    assert abs(e.zeta - (-64.985)) < 5e-4
    assert abs(e.K_star - float(ref["K"])) <= 1e-10 * float(ref["K"])
    # the numeric depth estimate works there too (iterated at the exact point)
    assert abs(e.zeta_numeric / e.zeta - 1) < 1e-3 and abs(e.zeta_K_numeric - 1) < 1e-3
    assert e.agree
    # the note gives the distance to the exact point and the tolerance
    m = re.search(r"is ([0-9.e+-]+) \(relative distance\)", e.note)
    assert m, e.note
    dist = float(mp.sqrt((sw - sw_exact) ** 2 + (sb - sb_exact) ** 2) / mp.sqrt(sw ** 2 + sb ** 2))
    assert abs(float(m.group(1)) - dist) <= 0.01 * dist
    assert "critical_tol = 1e-10" in e.note
    assert abs(e.sigma_w - float(sw_exact)) < 1e-15 and abs(e.sigma_b - float(sb_exact)) < 1e-15


def test_critical_tol_zero_keeps_the_old_answer():
    # tolerance off: the 13-digit point is strictly not critical (its tangent fixed point has split
    # or vanished), so no power law is reported there
    e = mf.exponents(activation="gelu", sigma_w=1.4082110131076, sigma_b=0.4158393809586, critical_tol=0.0)
    assert e.regime in ("ordered", "chaotic") and np.isnan(e.zeta)


def test_far_point_is_not_snapped():
    e = mf.exponents(activation="gelu", sigma_w=1.4082, sigma_b=0.4158)
    assert e.regime != "critical point" and "distance" not in e.note
