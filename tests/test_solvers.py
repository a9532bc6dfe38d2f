"""Fixed points, critical lines and points against independent mpmath solves written here.

The references use mpmath quadrature of the activations themselves (or the
papers' closed forms, re-derived where noted), never the package's code.
"""
import math

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
from meanfield.solvers import ConvergenceError

pytestmark = pytest.mark.filterwarnings("error")
mp.mp.dps = 30
REL = 1e-10


# ---------------------------------------------------------------------------
# Independent references.
# ---------------------------------------------------------------------------
def E(f, K):
    """E[f(h)], h ~ N(0, K), by mpmath quadrature."""
    K = mp.mpf(K)
    if K == 0:
        return f(mp.mpf(0))
    s = mp.sqrt(K)
    return mp.quad(lambda z: f(s * z) * mp.npdf(z), [-mp.inf, -6, -2, 0, 2, 6, mp.inf])


def gelu(x):
    return x * mp.ncdf(x)


def dgelu(x):
    return mp.ncdf(x) + x * mp.npdf(x)


def erf2(K):  # E[erf^2] (paper eq. 121, Williams 1997)
    return 2 / mp.pi * mp.asin(2 * K / (1 + 2 * K))


def derf2(K):  # E[erf'^2] (eq. 123)
    return 4 / mp.pi / mp.sqrt(1 + 4 * K)


def close(a, b, rel=REL, abs_=1e-12):
    a, b = float(mp.re(a)), float(mp.re(b))
    return abs(a - b) <= rel * abs(b) + abs_


# ---------------------------------------------------------------------------
# Fixed points and profiles.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sw,sb", [(1.0, 0.1), (2.5, 0.7), (0.3, 1.2)])
def test_erf_fixed_point(sw, sb):
    ref = mp.findroot(lambda K: sb ** 2 + sw ** 2 * erf2(K) - K, sw ** 2)
    assert close(mf.fixed_point(activation="erf", sigma_w=sw, sigma_b=sb), ref)
    assert close(mf.chi_J(activation="erf", sigma_w=sw, sigma_b=sb), sw ** 2 * derf2(ref))


@pytest.mark.slow
@pytest.mark.parametrize("act,phi,sw,sb", [
    ("gelu", gelu, 1.2, 0.3),
    ("tanh", mp.tanh, 1.5, 0.2),
])
def test_quadrature_fixed_points(act, phi, sw, sb):
    """A bracketing root finder on [1e-6, 10] (these maps have one fixed point there)."""
    with mp.workdps(20):
        K = mp.findroot(lambda k: sb ** 2 + sw ** 2 * E(lambda x: phi(x) ** 2, k) - k, (mp.mpf("1e-6"), 10),
                        solver="anderson")
    assert close(mf.fixed_point(activation=act, sigma_w=sw, sigma_b=sb), K)


@pytest.mark.slow
def test_kernel_profile_erf_and_pair_state():
    p = mf.kernel_profile(activation="erf", sigma_w=1.7, sigma_b=0.4, depth=6)
    K = mp.mpf(1.7 ** 2 + 0.4 ** 2)
    for l in range(6):
        assert close(p.K[l], K)
        assert close(p.chi_J[l], 1.7 ** 2 * derf2(K))
        K = 0.4 ** 2 + 1.7 ** 2 * erf2(K)
    assert p.K12 is None and p.layers[0] == 1 and p.J[0] == 1.0
    # ReLU with large-batch BatchNorm: BN sends (K, K12) to (1, 0), then the
    # arc-cosine kernel: K' = sw^2/2 + sb^2 + mu^2 K, K12' = sw^2/(2 pi) + sb^2 + mu^2 K12
    sw, sb, mu = 1.3, 0.2, 0.5
    b = mf.kernel_profile(activation="relu", norm="bn", mu=mu, sigma_w=sw, sigma_b=sb, depth=5)
    K, Q = sw ** 2 + sb ** 2, sb ** 2
    for l in range(5):
        assert close(b.K[l], K) and close(b.K12[l], Q)
        assert close(b.chi_J[l], mu ** 2 + sw ** 2 / (2 * (K - Q)))
        K, Q = sw ** 2 / 2 + sb ** 2 + mu ** 2 * K, sw ** 2 / (2 * math.pi) + sb ** 2 + mu ** 2 * Q


@pytest.mark.slow
def test_bn_fixed_point_and_chi():
    """One BN per block: chi_J* = pi/(pi-1); with mu: mu^2 + (1 - mu^2) pi/(pi-1) (AutoInit eq. 23)."""
    assert close(mf.chi_J(activation="relu", norm="bn", sigma_w=1.1, sigma_b=0.3), math.pi / (math.pi - 1))
    mu = 0.5
    assert close(mf.chi_J(activation="relu", norm="bn", mu=mu, sigma_w=1.1, sigma_b=0.3),
                 mu ** 2 + (1 - mu ** 2) * math.pi / (math.pi - 1))
    K = mf.fixed_point(activation="relu", norm="bn", mu=0.999, sigma_w=1.0, sigma_b=0.1)
    assert close(K, (0.5 + 0.01) / (1 - 0.999 ** 2))


# ---------------------------------------------------------------------------
# Critical lines.
# ---------------------------------------------------------------------------
def _erf_line_ref(sw, mu=0.0):
    """Solve F(K) = K and chi_J(K) = 1 for (K, sb^2) with mpmath."""
    sw = mp.mpf(sw)

    def eqs(K, T):
        return [T + sw ** 2 * erf2(K) + mu ** 2 * K - K, sw ** 2 * derf2(K) + mu ** 2 - 1]

    K0 = ((4 * sw ** 2 / (mp.pi * (1 - mu ** 2))) ** 2 - 1) / 4
    K, T = mp.findroot(eqs, (K0, mp.mpf("0.1")))
    return mp.sqrt(T), K


def test_erf_critical_line_and_eq126():
    sws = np.array([0.9, 1.0, 1.3, 2.0, 5.0])
    line = mf.critical_line(activation="erf", sigma_w=sws)
    for sw, sb, K in zip(sws, line.sigma_b, line.K_star):
        ref, Kref = _erf_line_ref(sw)
        assert close(sb, ref) and close(K, Kref)
        # paper eq. 126, checked: it is this line
        sw = mp.mpf(sw)
        eq126 = mp.sqrt((16 * sw ** 4 - mp.pi ** 2) / (4 * mp.pi ** 2)
                        - 2 * sw ** 2 / mp.pi * mp.asin((16 * sw ** 4 - mp.pi ** 2) / (16 * sw ** 4 + mp.pi ** 2)))
        assert close(sb, eq126)
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
        assert close(sb, _erf_line_ref(sw, mu)[0])
        a = 16 * mp.mpf(sw) ** 4 - mp.pi ** 2 * (1 - mu ** 2) ** 2
        c = 16 * mp.mpf(sw) ** 4 + mp.pi ** 2 * (1 - mu ** 2) ** 2
        eq142 = mp.sqrt(a / (4 * mp.pi ** 2 * (1 - mu ** 2)) - 2 * sw ** 2 / mp.pi * mp.asin(a / c))
        assert close(sb, eq142)


def test_line_solved_for_sigma_w():
    sbs = np.array([0.0, 0.2, 1.0])
    line = mf.critical_line(activation="erf", sigma_b=sbs)
    for sw, sb in zip(line.sigma_w, sbs):
        assert close(mf.critical_line(activation="erf", sigma_w=[sw]).sigma_b[0], sb, abs_=1e-9)
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
    assert close(pts[0].sigma_w, ref) and pts[0].sigma_b == 0 and pts[0].stability == "marginal"
    # a line vertical in the plane is not a function of sigma_w
    assert np.isnan(mf.critical_line(sigma_w=[1.0, 1.3], **kw).sigma_b).all()


def _ln_pre_slope(phi, dphi):
    """ln_pre line: K* = sw^2 E[phi^2](1) + sb^2 and sw^2 E[phi'^2](1)/K* = 1 -> sb/sw = sqrt(g1 - q1)."""
    return mp.sqrt(E(lambda x: dphi(x) ** 2, 1) - E(lambda x: phi(x) ** 2, 1))


@pytest.mark.slow
@pytest.mark.parametrize("mu", [None, 0.5])
def test_ln_pre_lines(mu):
    sws = np.array([0.5, 1.0, 4.0])
    erf_slope = _ln_pre_slope(mp.erf, lambda x: 2 / mp.sqrt(mp.pi) * mp.exp(-x * x))
    gelu_slope = _ln_pre_slope(gelu, dgelu)
    assert abs(erf_slope - mp.mpf("0.3238")) < 1e-4 and abs(gelu_slope - mp.mpf("0.1750")) < 1e-4
    assert close(gelu_slope, (6 * mp.sqrt(3) * mp.pi) ** -0.5)   # eq. 171
    for act, slope in (("erf", erf_slope), ("gelu", gelu_slope)):
        line = mf.critical_line(activation=act, norm="ln_pre", mu=mu, sigma_w=sws)
        for sw, sb in zip(sws, line.sigma_b):
            assert close(sb, slope * sw)


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
        g = E(lambda x: dgelu(x) ** 2, K)
        q = E(lambda x: gelu(x) ** 2, K)
        assert close(sw, 1 / mp.sqrt(g)) and close(sb, mp.sqrt(K - q / g))
        K = mp.mpf(K)
        eq157 = 2 * (1 + 2 * K * (3 + 5 * K) / (mp.pi * (1 + K) * (1 + 2 * K) ** 1.5)
                     + 2 / mp.pi * mp.asin(K / (1 + K))) ** -0.5
        assert close(sw, eq157) and close(sb, K / (mp.sqrt(2 * mp.pi) * (1 + 2 * K) ** 0.75) * eq157)
    # below K* = (3 + sqrt 17)/2 the line's fixed point is unstable: inputs never reach it
    assert list(line.chi_K > 1) == [True, True, False]
    assert list(line.reached) == [False, False, True]


# ---------------------------------------------------------------------------
# Critical points.
# ---------------------------------------------------------------------------
def _gelu_point_ref(mu):
    """chi_J = chi_K = 1 means E[phi'^2](K) = d/dK E[phi^2](K) = E[phi'^2 + phi phi''] (Price):
    a 1-D root in K, then W = (1 - mu^2)/E[phi'^2] and T from F(K) = K."""
    def d2gelu(x):
        return mp.npdf(x) * (2 - x * x)

    with mp.workdps(25):
        K = mp.findroot(lambda k: E(lambda x: gelu(x) * d2gelu(x), k), mp.mpf("3.5"))
        Wv = (1 - mu ** 2) / E(lambda x: dgelu(x) ** 2, K)
        Tv = (1 - mu ** 2) * K - Wv * E(lambda x: gelu(x) ** 2, K)
    return K, Wv, Tv


@pytest.mark.slow
@pytest.mark.parametrize("mu", [None, 0.5])
def test_gelu_critical_points(mu):
    m = mu or 0.0
    pts = mf.critical_point(activation="gelu", mu=mu)
    assert len(pts) == 2
    p0, p1 = sorted(pts, key=lambda p: p.K_star)
    # (2 sqrt(1-mu^2), 0) with K* = 0 (eqs. 161, 183)
    assert p0.K_star == 0 and close(p0.sigma_w, 2 * math.sqrt(1 - m * m)) and p0.sigma_b == 0
    K, Wv, Tv = _gelu_point_ref(m)
    assert close(K, (3 + mp.sqrt(17)) / 2, rel=1e-18)       # eqs. 160, 182
    assert close(p1.K_star, K, rel=1e-12)
    assert close(p1.sigma_w, mp.sqrt(Wv)) and close(p1.sigma_b, mp.sqrt(Tv))
    s = math.sqrt(1 - m * m)                                 # eq. 184: both scale by sqrt(1 - mu^2)
    assert close(p1.sigma_w, 1.4082110131076049 * s, rel=1e-12) and close(p1.sigma_b, 0.41583938095864292 * s,
                                                                          rel=1e-12)
    # K* attracts only from above; the unit input converges to a second, stable fixed point below it
    assert p1.stability == "half-stable from above" and p1.c2 > 0
    assert p1.unit_input_reaches < p1.K_star
    kinds = {fp.stability: fp for fp in p1.fixed_points}
    assert kinds["stable"].basin[1] == pytest.approx(p1.K_star)
    assert kinds["half-stable from above"].basin == (pytest.approx(p1.K_star), math.inf)
    assert close(mf.fixed_point(activation="gelu", mu=mu, sigma_w=p1.sigma_w, sigma_b=p1.sigma_b, K0=10.0),
                 p1.K_star, rel=1e-6)
    # (2, 0): K* = 0 repels every input K > 0 (which then diverges)
    assert p0.unit_input_reaches == math.inf


@pytest.mark.slow
@pytest.mark.parametrize("mu", [None, 0.5])
def test_erf_critical_point(mu):
    m = mu or 0.0
    pts = mf.critical_point(activation="erf", mu=mu)
    assert len(pts) == 1
    assert close(pts[0].sigma_w, math.sqrt(math.pi * (1 - m * m) / 4)) and pts[0].sigma_b == 0   # eqs. 127, 143
    assert pts[0].K_star == 0 and pts[0].unit_input_reaches == 0


@pytest.mark.slow
def test_no_critical_points():
    assert len(mf.critical_point(activation="erf", norm="ln_pre")) == 0
    assert len(mf.critical_point(activation="relu", norm="ln_post")) == 0
    assert len(mf.critical_point(activation="relu", norm="bn", mu=0.5)) == 0


# ---------------------------------------------------------------------------
# Correlation length, phase diagram, other blocks.
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
    assert close(pd.xi[2, 2], 1 / abs(mp.log(4 * 4 / (mp.pi * mp.sqrt(1 + 4 * K)))))
    everywhere = mf.phase_diagram(activation="erf", norm="ln_pre", mu=1.0, sigma_w=sw, sigma_b=sb)
    assert everywhere.everywhere_critical and np.all(everywhere.phase == 0)


@pytest.mark.slow
@pytest.mark.parametrize("kw", [
    dict(activation="relu", block="resmlp"),
    dict(activation="gelu", block="mixer", mu=0.5),
    dict(activation="gelu", block="mixer"),
    dict(activation="erf", norm="bn", mu=0.5),
    dict(activation="tanh", norm="ln_post", mu=0.5),
    dict(activation="gelu", norm="bn", stages=2),
])
def test_every_block(kw):
    """Fixed point and chi_J* agree with the symbolic recursion evaluated at K* (mpmath)."""
    import sympy as sp

    rec = mf.recursion(**kw)
    st = mf.fixed_point_state(sigma_w=np.array([0.6, 1.3]), sigma_b=0.2, **kw)
    for i, sw in enumerate([0.6, 1.3]):
        if not np.isfinite(st.K[i]):
            continue
        subs = {"K": st.K[i], "K12": st.K12[i] if np.isfinite(st.K12[i]) else 0.0,
                "sigma_w": sw, "sigma_b": 0.2, "mu": 1.0 if rec.architecture.mu is None else rec.architecture.mu,
                "eps": rec.architecture.eps}
        subs = {sp.Symbol(k): v for k, v in subs.items()}
        assert close(sp.N(rec.kernel.evalf(25, subs=subs)), st.K[i], rel=1e-9)
        assert close(sp.N(rec.chi_J.evalf(25, subs=subs)), st.chi_J[i], rel=1e-9)
    line = mf.critical_line(sigma_w=np.linspace(0.2, 3, 5), **kw)
    assert line.sigma_b.shape == (5,)
    mf.phase_diagram(sigma_w=[0.5, 1.5], sigma_b=[0.1, 1.0], **kw)


# ---------------------------------------------------------------------------
# Edge cases: finite answers where they exist, documented inf/nan otherwise, no warnings.
# ---------------------------------------------------------------------------
def test_edges_sigma_zero():
    assert mf.fixed_point(activation="erf", sigma_w=0.0, sigma_b=0.3) == pytest.approx(0.09, rel=1e-15)
    assert mf.chi_J(activation="erf", sigma_w=0.0, sigma_b=0.3) == 0.0
    assert mf.correlation_length(activation="erf", sigma_w=0.0, sigma_b=0.3) == 0.0
    assert mf.fixed_point(activation="erf", sigma_w=0.5, sigma_b=0.0) == 0.0
    assert mf.fixed_point(activation="erf", sigma_w=0.0, sigma_b=0.0) == 0.0
    ref = mp.findroot(lambda K: 1.5 ** 2 * erf2(K) - K, 1.0)
    assert close(mf.fixed_point(activation="erf", sigma_w=1.5, sigma_b=0.0), ref)
    assert np.isnan(mf.critical_line(activation="erf", sigma_w=[0.0]).sigma_b[0])
    assert close(mf.fixed_point(activation="relu", sigma_w=1.0, sigma_b=0.0), 0.0)


def test_edges_large_sigma_w():
    sb, K = _erf_line_ref(1e3)
    line = mf.critical_line(activation="erf", sigma_w=[1e3])
    assert close(line.sigma_b[0], sb, rel=1e-9) and close(line.K_star[0], K, rel=1e-9)
    # chaotic unbounded activations diverge: K* = inf, chi_J* its limit
    assert mf.fixed_point(activation="gelu", sigma_w=1e3, sigma_b=0.1) == math.inf
    assert mf.chi_J(activation="gelu", sigma_w=1e3, sigma_b=0.1) == pytest.approx(1e6 / 2, rel=1e-9)
    assert mf.fixed_point(activation="relu", sigma_w=1e3, sigma_b=0.0) == math.inf


@pytest.mark.slow
def test_edges_mu():
    assert mf.fixed_point(activation="erf", mu=1.0, sigma_w=1.0, sigma_b=0.1) == math.inf
    assert mf.chi_J(activation="erf", mu=1.0, sigma_w=1.0, sigma_b=0.1) == 1.0
    assert mf.chi_J(activation="relu", mu=1.0, sigma_w=1.0, sigma_b=0.1) == pytest.approx(1.5, rel=1e-15)
    m = 0.999
    ref = mp.findroot(lambda K: 0.01 + 0.04 * erf2(K) + m * m * K - K, (20, 25), solver="anderson")
    assert close(mf.fixed_point(activation="erf", mu=m, sigma_w=0.2, sigma_b=0.1), ref)
    K = mf.fixed_point(activation="relu", mu=m, sigma_w=0.01, sigma_b=0.1)
    assert close(K, 0.01 / (1 - m * m - 0.5e-4))
    assert mf.fixed_point(activation="gelu", norm="ln_pre", mu=1.0, sigma_w=1.0, sigma_b=0.0) == math.inf


@pytest.mark.parametrize("K0", [1e-300, 1e-12, 1e12, 1e100])
def test_edges_K0(K0):
    ref = mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.1)
    assert close(mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.1, K0=K0), ref)
    ref = mf.fixed_point(activation="gelu", sigma_w=1.0, sigma_b=0.1)
    assert close(mf.fixed_point(activation="gelu", sigma_w=1.0, sigma_b=0.1, K0=K0), ref)
    assert mf.fixed_point(activation="relu", sigma_w=1.0, sigma_b=0.0, K0=K0) == 0.0


def test_iteration_cap_is_a_clear_error():
    with pytest.raises(ConvergenceError, match="sigma_w=1.*iteration cap.*errors='nan'"):
        mf.fixed_point_state(activation="erf", sigma_w=1.0, sigma_b=0.1, maxiter=1)
    st = mf.fixed_point_state(activation="erf", sigma_w=[1.0], sigma_b=0.1, maxiter=1, errors="nan")
    assert np.isnan(st.K[0])


@pytest.mark.slow
def test_bad_arguments():
    with pytest.raises(ValueError, match="sigma_w"):
        mf.fixed_point(activation="erf", sigma_w=-1.0, sigma_b=0.0)
    with pytest.raises(ValueError, match="sigma_b"):
        mf.chi_J(activation="erf", sigma_w=1.0, sigma_b=float("nan"))
    with pytest.raises(ValueError, match="exactly one"):
        mf.critical_line(activation="erf")
    with pytest.raises(ValueError, match="exactly one"):
        mf.critical_line(activation="erf", sigma_w=[1.0], sigma_b=[1.0])
    with pytest.raises(ValueError, match="K0"):
        mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.0, K0=-1.0)
    with pytest.raises(ValueError, match="depth"):
        mf.kernel_profile(activation="erf", sigma_w=1.0, sigma_b=0.0, depth=0)
    with pytest.raises(ValueError, match="activation"):
        mf.critical_point(activation="nope")
    with pytest.raises(ValueError, match="errors"):
        mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.0, errors="ignore")
    with pytest.raises(ValueError, match="pair state"):
        mf.critical_line(activation="relu", norm="bn", K_star=[1.0])



@pytest.mark.parametrize("fn", ["fixed_point", "fixed_point_state", "chi_J", "chi_K", "correlation_length",
                                "fixed_points", "chi_Delta", "l0_correction", "apjn_from_input", "exponents"])
def test_the_point_is_required(fn):
    """No silent sigma_w = 1, sigma_b = 0: a missing coordinate is a ValueError that names it."""
    f = getattr(mf, fn)
    extra = {"N0": 10} if fn == "l0_correction" else ({"depth": 3} if fn == "apjn_from_input" else {})
    with pytest.raises(ValueError, match="sigma_w"):
        f(activation="tanh", **extra)
    with pytest.raises(ValueError, match="sigma_b"):
        f(activation="tanh", sigma_w=1.0, **extra)


def test_broadcasting_shapes():
    sw = np.linspace(0.5, 2, 6).reshape(2, 3)
    assert mf.fixed_point(activation="erf", sigma_w=sw, sigma_b=0.1).shape == (2, 3)
    assert isinstance(mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.1), float)
    assert mf.critical_line(activation="erf", sigma_w=sw).sigma_b.shape == (2, 3)
