"""GELU: unreached points of the critical line, and points typed in next to the critical point.

References are solved here with mpmath (30 digits) from the definitions
phi(x) = x Phi(x), F(K) = sigma_w^2 E[phi(h)^2] + sigma_b^2 and
chi_J(K) = sigma_w^2 E[phi'(h)^2], h ~ N(0, K) (partial-Jacobian paper,
eqs. 4-5): Gaussian expectations by mpmath.quad, derivatives in K by
mpmath.diff, roots by mpmath.findroot. Nothing is taken from the package.
"""
import re

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf

DPS = 20


def _phi(x):
    return x * mp.ncdf(x)


def _dphi(x):
    return mp.ncdf(x) + x * mp.npdf(x)


def _ddphi(x):
    return (2 - x * x) * mp.npdf(x)


def _E(f, K):
    s = mp.sqrt(K)
    return mp.quad(lambda z: f(s * z) * mp.npdf(z), [-mp.inf, 0, mp.inf])


def _F(K, W, T):
    return W * _E(lambda h: _phi(h) ** 2, K) + T


def _chiJ(K, W):
    return W * _E(lambda h: _dphi(h) ** 2, K)


def _chiK(K, W, T):
    # Price's theorem: dF/dK = (W/2) E[(phi^2)''] = W E[phi'^2 + phi phi'']
    return W * _E(lambda h: _dphi(h) ** 2 + _phi(h) * _ddphi(h), K)


@pytest.fixture(scope="module")
def gelu_critical_point():
    """(K*, sigma_w^2, sigma_b^2) with F = K, chi_J = chi_K = 1, solved by mpmath."""
    with mp.workdps(DPS):
        sol = mp.findroot(lambda K, W, T: (_F(K, W, T) - K, _chiJ(K, W) - 1, _chiK(K, W, T) - 1),
                          (mp.mpf("3.56"), mp.mpf("1.983"), mp.mpf("0.173")), tol=mp.mpf(10) ** -18)
        K, W, T = sol
        # zeta = d1 / c2 with dK' = dK - c2 dK^2, chi_J = 1 - d1 dK (appendix G)
        c2 = -mp.diff(lambda k: _chiK(k, W, T), K) / 2
        d1 = -mp.diff(lambda k: _chiJ(k, W), K)
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


@pytest.mark.slow
def test_unreached_line_point_gelu():
    sw = 1.63
    with mp.workdps(DPS):
        W = mp.mpf(sw) ** 2
        K, T = mp.findroot(lambda K, T: (_F(K, W, T) - K, _chiJ(K, W) - 1),
                           (mp.mpf("0.333"), mp.mpf("0.0218")), tol=mp.mpf(10) ** -18)
        chiK = _chiK(K, W, T)
    assert chiK > 1   # unstable: no input with K^1 != K* converges to it
    line = mf.critical_line(activation="gelu", sigma_w=sw)
    assert not bool(line.reached)
    assert abs(float(line.sigma_b) - float(mp.sqrt(T))) < 1e-11
    assert abs(float(line.K_star) - float(K)) < 1e-10
    assert abs(float(line.chi_K) - float(chiK)) < 1e-9
    assert "reached=False" in line.note
    # the same point as the parametric form
    par = mf.critical_line(activation="gelu", K_star=float(line.K_star))
    assert abs(float(par.sigma_w) - sw) < 1e-10 and abs(float(par.sigma_b) - float(line.sigma_b)) < 1e-10
    assert not bool(par.reached)


def test_line_reached_points_unchanged_and_nan_explained():
    sw = np.array([0.5, 1.4, 1.63])
    line = mf.critical_line(activation="gelu", sigma_w=sw)
    assert np.isnan(line.sigma_b[0]) and "NaN" in line.note
    assert bool(line.reached[1]) and not bool(line.reached[2])
    # the reached point solves chi_J* = 1 at the fixed point the unit input reaches
    st = mf.fixed_point_state(activation="gelu", sigma_w=1.4, sigma_b=float(line.sigma_b[1]))
    assert abs(float(st.chi_J) - 1) < 1e-10 and abs(float(st.K) - float(line.K_star[1])) < 1e-8
