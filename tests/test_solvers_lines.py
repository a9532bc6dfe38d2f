"""solvers/lines.py: critical lines, critical points, correlation lengths, phase diagrams.

References: tests/references (mpmath quadrature of the activations coded by hand, the papers'
closed forms re-derived where noted, mp.findroot), never the package's code. GELU's unreached
line points: F(K) = K and chi_J(K) = 1 solved with mp.findroot from the definitions.
"""
import math

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R

pytestmark = pytest.mark.filterwarnings("error")
mp.mp.dps = 30
REL = 1e-10



# ---------------------------------------------------------------------------
# Critical lines.
# ---------------------------------------------------------------------------
def test_erf_critical_line_and_eq126():
    sws = np.array([0.9, 1.0, 1.3, 2.0, 5.0])
    line = mf.critical_line(activation="erf", sigma_w=sws)
    for sw, sb, K in zip(sws, line.sigma_b, line.K_star):
        ref, Kref = R.erf_critical_line(sw)
        assert R.close(sb, ref) and R.close(K, Kref)
        # paper eq. 126, checked: it is this line
        assert R.close(sb, R.erf_critical_sigma_b(sw))
    assert np.all(line.chi_K < 1) and np.all(line.reached)
    # below the critical point there is no line
    assert np.isnan(mf.critical_line(activation="erf", sigma_w=[0.5, 0.8]).sigma_b).all()
    assert np.allclose(np.asarray(line), line.sigma_b)


@pytest.mark.slow
@pytest.mark.parametrize("mu", [0.5, 0.9])
def test_erf_residual_line_eq142(mu):
    sws = np.array([1.0, 1.5, 3.0])
    line = mf.critical_line(activation="erf", mu=mu, sigma_w=sws)
    for sw, sb in zip(sws, line.sigma_b):
        assert R.close(sb, R.erf_critical_line(sw, mu)[0])
        assert R.close(sb, R.erf_critical_sigma_b(sw, mu))


def test_line_solved_for_sigma_w():
    sbs = np.array([0.0, 0.2, 1.0])
    line = mf.critical_line(activation="erf", sigma_b=sbs)
    for sw, sb in zip(line.sigma_w, sbs):
        assert R.close(mf.critical_line(activation="erf", sigma_w=[sw]).sigma_b[0], sb, abs_=1e-9)
    assert line.solved_for == "sigma_w" and np.allclose(np.asarray(line), line.sigma_w)


@pytest.mark.slow
@pytest.mark.parametrize("slope", [0.0, 0.01, 0.2])
@pytest.mark.parametrize("mu", [None, 0.5])
def test_scale_invariant_lines_and_points(slope, mu):
    """sigma_w = sqrt(2 (1 - mu^2) / (1 + s^2)) for every sigma_b (eqs. 100, 116); point at sigma_b = 0."""
    kw = dict(activation="leaky_relu", negative_slope=slope, mu=mu)
    ref = math.sqrt(2 * (1 - (mu or 0) ** 2) / (1 + slope ** 2))
    line = mf.critical_line(sigma_b=[0.0, 0.3, 2.0], **kw)
    assert np.allclose(line.sigma_w, ref, rtol=REL, atol=0)
    pts = mf.critical_point(**kw)
    assert len(pts) == 1
    assert R.close(pts[0].sigma_w, ref) and pts[0].sigma_b == 0 and pts[0].stability == "marginal"
    # a line vertical in the plane is not a function of sigma_w
    assert np.isnan(mf.critical_line(sigma_w=[1.0, 1.3], **kw).sigma_b).all()


def _ln_pre_slope(phi, dphi):
    """ln_pre line: K* = sw^2 E[phi^2](1) + sb^2 and sw^2 E[phi'^2](1)/K* = 1 -> sb/sw = sqrt(g1 - q1)."""
    return mp.sqrt(R.expect(lambda x: dphi(x) ** 2, 1, cuts=R.WIDE_CUTS)
                   - R.expect(lambda x: phi(x) ** 2, 1, cuts=R.WIDE_CUTS))


@pytest.mark.slow
@pytest.mark.parametrize("mu", [None, 0.5])
def test_ln_pre_lines(mu):
    sws = np.array([0.5, 1.0, 4.0])
    erf_slope = _ln_pre_slope(mp.erf, R.derf)
    gelu_slope = _ln_pre_slope(R.gelu, R.dgelu)
    assert abs(erf_slope - mp.mpf("0.3238")) < 1e-4 and abs(gelu_slope - mp.mpf("0.1750")) < 1e-4
    assert R.close(gelu_slope, (6 * mp.sqrt(3) * mp.pi) ** -0.5)   # eq. 171
    for act, slope in (("erf", erf_slope), ("gelu", gelu_slope)):
        line = mf.critical_line(activation=act, norm="ln_pre", mu=mu, sigma_w=sws)
        for sw, sb in zip(sws, line.sigma_b):
            assert R.close(sb, slope * sw)


@pytest.mark.slow
def test_ln_post_relu_line():
    sws = np.array([0.3, 1.0, 3.0])
    line = mf.critical_line(activation="relu", norm="ln_post", sigma_w=sws)
    assert np.allclose(line.sigma_b, sws / math.sqrt(math.pi - 1), rtol=REL, atol=0)


@pytest.mark.slow
def test_everywhere_critical_and_subcritical():
    for kw in (dict(activation="gelu", norm="ln_pre", mu=1.0), dict(activation="relu", norm="bn", mu=1.0)):
        line = mf.critical_line(sigma_w=[0.5, 1.0], **kw)
        assert line.everywhere_critical and np.isnan(line.sigma_b).all() and "every" in line.note
        assert mf.critical_point(**kw).everywhere_critical
        assert mf.asymptotic_regime(**kw) == "everywhere_critical"
    line = mf.critical_line(activation="erf", mu=1.0, sigma_w=[0.5, 1.0])
    assert not line.everywhere_critical and "stretched exponential" in line.note
    assert mf.asymptotic_regime(activation="erf", mu=1.0) == "subcritical"
    assert mf.asymptotic_regime(activation="erf") == "none"


@pytest.mark.slow
def test_gelu_parametric_line_eqs_157_158():
    Ks = np.array([0.5, 2.0, 10.0])
    line = mf.critical_line(activation="gelu", K_star=Ks)
    for K, sw, sb in zip(Ks, line.sigma_w, line.sigma_b):
        g = R.expect(lambda x: R.dgelu(x) ** 2, K, cuts=R.WIDE_CUTS)
        q = R.expect(lambda x: R.gelu(x) ** 2, K, cuts=R.WIDE_CUTS)
        assert R.close(sw, 1 / mp.sqrt(g)) and R.close(sb, mp.sqrt(K - q / g))
        eq157, eq158 = R.gelu_critical_line(K)
        assert R.close(sw, eq157) and R.close(sb, eq158)
    # below K* = (3 + sqrt 17)/2 the line's fixed point is unstable: inputs never reach it
    assert list(line.chi_K > 1) == [True, True, False]
    assert list(line.reached) == [False, False, True]


@pytest.mark.slow
def test_unreached_line_point_gelu():
    sw = 1.63
    F, chi_J, chi_K = R.gelu_maps()
    with mp.workdps(20):
        W = mp.mpf(sw) ** 2
        K, T = mp.findroot(lambda K, T: (F(K, W, T) - K, chi_J(K, W) - 1),
                           (mp.mpf("0.333"), mp.mpf("0.0218")), tol=mp.mpf(10) ** -18)
        chiK = chi_K(K, W, T)
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


# ln_post at sigma_b = 0: K* = sigma_w^2 + sigma_b^2 and chi_J = sigma_w^2 E[phi'(h)^2] / Var[phi(h)],
# h ~ N(0, K*). For odd phi, chi_J - 1 > 0 for every sigma_w > 0 and tends to 0 only as
# sigma_w -> 0 (erf: ~ 4/3 sigma_w^4): no critical point, so NaN. The scan used to take the exact
# zero that chi_J - 1 rounds to at sigma_w = 1e-5 for a root and returned it as a critical point.
_ACTS = {
    "erf": (mp.erf, R.derf),
    "tanh": (mp.tanh, lambda x: 1 / mp.cosh(x) ** 2),
}


def _chi_J_minus_1(act, sw, sb):
    f, df = _ACTS[act]
    K = sw ** 2 + sb ** 2

    def E(g):
        return R.expect(g, K, cuts=(-4, 0, 4))

    m = E(f)
    return sw ** 2 * E(lambda x: df(x) ** 2) / (E(lambda x: f(x) ** 2) - m * m) - 1


@pytest.mark.slow
@pytest.mark.parametrize("act", sorted(_ACTS))
def test_no_critical_point_at_zero_bias(act):
    with mp.workdps(20):
        assert all(_chi_J_minus_1(act, mp.mpf(sw), 0) > 0 for sw in ("1e-3", "0.3", "1.5", "4"))
    line = mf.critical_line(act, norm="ln_post", sigma_b=[0.0, 0.0])
    assert np.all(np.isnan(line.sigma_w)) and not np.any(line.reached), line
    assert "NaN" in line.note


@pytest.mark.slow
@pytest.mark.parametrize("act", sorted(_ACTS))
@pytest.mark.parametrize("sb", [1e-3, 0.3])
def test_critical_point_at_small_bias_is_a_root(act, sb):
    sw = float(mf.critical_line(act, norm="ln_post", sigma_b=sb).sigma_w)
    with mp.workdps(20):
        resid = _chi_J_minus_1(act, mp.mpf(sw), mp.mpf(sb))
        d = mp.mpf(sw) * mp.mpf("1e-6")
        slope = (_chi_J_minus_1(act, sw + d, mp.mpf(sb)) - _chi_J_minus_1(act, sw - d, mp.mpf(sb))) / (2 * d)
    # the distance to the true root, |resid / slope|, within 1e-12 of sigma_w
    assert abs(resid / slope) <= 1e-12 * sw, (sw, resid)


# ---------------------------------------------------------------------------
# Critical points.
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mu", [None, 0.5])
def test_gelu_critical_points(mu):
    m = mu or 0.0
    pts = mf.critical_point(activation="gelu", mu=mu)
    assert len(pts) == 2
    p0, p1 = sorted(pts, key=lambda p: p.K_star)
    # (2 sqrt(1-mu^2), 0) with K* = 0 (eqs. 161, 183)
    assert p0.K_star == 0 and R.close(p0.sigma_w, 2 * math.sqrt(1 - m * m)) and p0.sigma_b == 0
    K, Wv, Tv = R.gelu_critical_point(m)
    assert R.close(K, (3 + mp.sqrt(17)) / 2, rel=1e-18)       # eqs. 160, 182
    assert R.close(p1.K_star, K, rel=1e-12)
    assert R.close(p1.sigma_w, mp.sqrt(Wv)) and R.close(p1.sigma_b, mp.sqrt(Tv))
    s = math.sqrt(1 - m * m)                                 # eq. 184: both scale by sqrt(1 - mu^2)
    assert R.close(p1.sigma_w, 1.4082110131076049 * s, rel=1e-12) and R.close(p1.sigma_b, 0.41583938095864292 * s,
                                                                          rel=1e-12)
    # K* attracts only from above; the unit input converges to a second, stable fixed point below it
    assert p1.stability == "half-stable from above" and p1.c2 > 0
    assert p1.unit_input_reaches < p1.K_star
    kinds = {fp.stability: fp for fp in p1.fixed_points}
    assert kinds["stable"].basin[1] == pytest.approx(p1.K_star)
    assert kinds["half-stable from above"].basin == (pytest.approx(p1.K_star), math.inf)
    assert R.close(mf.fixed_point(activation="gelu", mu=mu, sigma_w=p1.sigma_w, sigma_b=p1.sigma_b, K0=10.0),
                 p1.K_star, rel=1e-6)
    # (2, 0): K* = 0 repels every input K > 0 (which then diverges)
    assert p0.unit_input_reaches == math.inf


@pytest.mark.slow
@pytest.mark.parametrize("mu", [None, 0.5])
def test_erf_critical_point(mu):
    m = mu or 0.0
    pts = mf.critical_point(activation="erf", mu=mu)
    assert len(pts) == 1
    assert R.close(pts[0].sigma_w, math.sqrt(math.pi * (1 - m * m) / 4)) and pts[0].sigma_b == 0   # eqs. 127, 143
    assert pts[0].K_star == 0 and pts[0].unit_input_reaches == 0


@pytest.mark.slow
def test_no_critical_points():
    assert len(mf.critical_point(activation="erf", norm="ln_pre")) == 0
    assert len(mf.critical_point(activation="relu", norm="ln_post")) == 0
    assert len(mf.critical_point(activation="relu", norm="bn", mu=0.5)) == 0


# ---------------------------------------------------------------------------
# Correlation length, phase diagram, edges.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_correlation_length_and_phase_diagram():
    sw = np.array([0.5, 1.0, 2.0])
    sb = np.array([0.0, 0.5, 1.0, 2.0])
    pd = mf.phase_diagram(activation="erf", sigma_w=sw, sigma_b=sb)
    assert pd.chi_J.shape == (3, 4) and pd.phase.shape == (3, 4)
    xi = mf.correlation_length(activation="erf", sigma_w=sw[:, None], sigma_b=sb[None, :])
    assert np.allclose(pd.xi, xi)
    assert np.all((pd.phase == -1) == (pd.chi_J < 1 - pd.tol))
    assert np.all((pd.phase == 1) == (pd.chi_J > 1 + pd.tol))
    assert set(pd.phase_names().ravel()) <= {"ordered", "critical", "chaotic"}
    K = mf.fixed_point(activation="erf", sigma_w=2.0, sigma_b=1.0)
    assert R.close(pd.xi[2, 2], 1 / abs(mp.log(4 * 4 / (mp.pi * mp.sqrt(1 + 4 * K)))))
    everywhere = mf.phase_diagram(activation="erf", norm="ln_pre", mu=1.0, sigma_w=sw, sigma_b=sb)
    assert everywhere.everywhere_critical and np.all(everywhere.phase == 0)


def test_edges_large_sigma_w():
    sb, K = R.erf_critical_line(1e3)
    line = mf.critical_line(activation="erf", sigma_w=[1e3])
    assert R.close(line.sigma_b[0], sb, rel=1e-9) and R.close(line.K_star[0], K, rel=1e-9)
    # chaotic unbounded activations diverge: K* = inf, chi_J* its limit
    assert mf.fixed_point(activation="gelu", sigma_w=1e3, sigma_b=0.1) == math.inf
    assert mf.chi_J(activation="gelu", sigma_w=1e3, sigma_b=0.1) == pytest.approx(1e6 / 2, rel=1e-9)
    assert mf.fixed_point(activation="relu", sigma_w=1e3, sigma_b=0.0) == math.inf
