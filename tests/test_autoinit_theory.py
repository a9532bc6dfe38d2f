"""ReLU theory of AutoInit (paper section 2.1, appendix C.1): meanfield.autoinit.

The references are derived here with sympy from the loss and the ReLU APJN
J = (a sigma_w)^2 / 2, not taken from the module under test.
"""
import numpy as np
import pytest
import sympy as sp

from meanfield import autoinit as th

a, sw, lr, lam = sp.symbols("a sigma_w eta lambda", positive=True)
J_of_a = (a * sw) ** 2 / 2


def _sgd_sqrtJ_step(loss_expr):
    """sqrt(J) after one SGD step on a, as a function of (a, sigma_w, eta)."""
    a1 = a - lr * sp.diff(loss_expr, a)
    return a1 * sw / sp.sqrt(2)


LOSS = {
    "jll": sp.log(J_of_a) ** 2 / 2,
    "jsl": (J_of_a - 1) ** 2 / 2,
    "jkl": (1 + lam) * sp.log(J_of_a) ** 2 / 2,  # sigma_b = 0: JKL = (1 + lam) JLL (app. C.2)
}


@pytest.mark.parametrize("loss", ["jll", "jsl", "jkl"])
def test_step_matches_sympy_derivation(loss):
    s1 = _sgd_sqrtJ_step(LOSS[loss])
    f = sp.lambdify((a, sw, lr, lam), s1**2)
    rng = np.random.default_rng(0)
    for _ in range(20):
        av, swv, lrv, lamv = rng.uniform(0.3, 3), rng.uniform(0.3, 4), rng.uniform(0, 0.05), rng.uniform(0, 1)
        lamv = lamv if loss == "jkl" else 0.0
        J0 = (av * swv) ** 2 / 2
        got = th.relu_step(J0, swv, lrv, loss=loss, lam=lamv)
        assert got == pytest.approx(f(av, swv, lrv, lamv), rel=1e-12)


def test_printed_eq17_and_eq41():
    s = a * sw / sp.sqrt(2)
    # eq. 17: sqrt(J(t+1)) - sqrt(J(t)) = -eta sigma_w^2 log J / sqrt(J)
    eq17 = s - lr * sw**2 * sp.log(s**2) / s
    assert sp.simplify(_sgd_sqrtJ_step(LOSS["jll"]) - eq17) == 0
    # eq. 41: ... = -eta sigma_w^2 sqrt(J) (J - 1)
    eq41 = s - lr * sw**2 * s * (s**2 - 1)
    assert sp.simplify(_sgd_sqrtJ_step(LOSS["jsl"]) - eq41) == 0


@pytest.mark.parametrize("loss", ["jll", "jsl"])
def test_one_step_lr_solves_J1_equal_1(loss):
    s1 = _sgd_sqrtJ_step(LOSS[loss])
    for av, swv in [(1.0, 3.0), (1.0, 0.5), (0.7, 2.0), (1.0, np.sqrt(2) * 1.001)]:
        J0 = (av * swv) ** 2 / 2
        eta1 = th.one_step_lr(J0, swv, loss=loss)
        assert float(s1.subs({a: av, sw: swv, lr: eta1})) == pytest.approx(1.0, abs=1e-12)
        assert th.relu_step(J0, swv, eta1, loss=loss) == pytest.approx(1.0, abs=1e-12)


def test_printed_eq19_eq43_eq20_eq44():
    for J0, swv, av in [(4.5, 3.0, 1.0), (0.125, 0.5, 1.0), (2.0, 2.0, 1.0), (0.3, 1.5, 0.8)]:
        s = np.sqrt(J0)
        assert th.one_step_lr(J0, swv) == pytest.approx((s - 1) * s / (swv**2 * np.log(J0)), rel=1e-12)
        assert th.one_step_lr(J0, swv, loss="jsl") == pytest.approx(1 / (swv**2 * s * (1 + s)), rel=1e-12)
        # eq. 18 / 42 brackets
        assert th.lr_bound(J0, swv) == pytest.approx(2 * (s - 1) * s / (swv**2 * np.log(J0)), rel=1e-12)
        assert th.lr_bound(J0, swv, loss="jsl") == pytest.approx(2 / (swv**2 * s * (1 + s)), rel=1e-12)
        # eq. 20 / 44
        x = av * swv
        eq20 = (x - np.sqrt(2)) * av / (swv * (np.log(x**2) - np.log(2)))
        eq44 = 4 / (swv**3 * av * (np.sqrt(2) + x))
        assert th.eta_0(swv, av) == pytest.approx(eq20, rel=1e-12)
        assert th.eta_0(swv, av, loss="jsl") == pytest.approx(eq44, rel=1e-12)


def test_limits_at_criticality():
    assert th.one_step_lr(1.0, 2.0) == pytest.approx(1 / 8)
    assert th.one_step_lr(1.0 + 1e-14, 2.0) == pytest.approx(1 / 8)
    assert th.one_step_lr(1.0, 2.0, loss="jkl", lam=1.0) == pytest.approx(1 / 16)
    assert th.eta_0(np.sqrt(2)) == pytest.approx(th.lr_bound(1.0, np.sqrt(2)))


@pytest.mark.parametrize("loss", ["jll", "jsl"])
def test_bound_separates_convergence(loss):
    """eta_t is where |sqrt(J) - 1| (signed sqrt(J) = a sigma_w/sqrt 2) stops decreasing."""
    step = sp.lambdify((a, sw, lr), _sgd_sqrtJ_step(LOSS[loss]))
    J = np.array([0.05, 0.5, 2.0, 8.0])
    swv = 1.7
    av = np.sqrt(2 * J) / swv
    bound = th.lr_bound(J, swv, loss=loss)
    for f, decreases in [(0.9, True), (1.1, False)]:
        s1 = step(av, swv, f * bound)
        assert np.all((np.abs(s1 - 1) < np.abs(np.sqrt(J) - 1)) == decreases)
    assert th.eta_t(J, swv, loss=loss) == pytest.approx(bound.min())


def test_dynamics_iterates_step_and_converges():
    J0 = np.array([4.5, 0.125, 1.0])
    traj = th.relu_dynamics(J0, 3.0, 0.01, 200)
    assert traj.shape == (201, 3)
    assert traj[1] == pytest.approx(th.relu_step(J0, 3.0, 0.01))
    assert np.allclose(traj[-1], 1.0, atol=1e-6)
    # overshoot past a = 0 is followed (sign carried), not an error
    wild = th.relu_dynamics(4.5, 3.0, 10.0, 5)
    assert wild.shape == (6,)


def test_bad_input():
    with pytest.raises(ValueError, match="loss"):
        th.one_step_lr(2.0, 1.0, loss="mse")
    with pytest.raises(ValueError, match="J0"):
        th.one_step_lr(-1.0, 1.0)
    with pytest.raises(ValueError, match="sigma_w"):
        th.relu_step(2.0, 0.0, 0.1)
    with pytest.raises(ValueError, match="lam"):
        th.one_step_lr(2.0, 1.0, loss="jll", lam=0.5)
    with pytest.raises(ValueError, match="steps"):
        th.relu_dynamics(2.0, 1.0, 0.1, -1)


# --------------------------------------------------------------------------- errata evidence (AI sec. 2, app. B.2)
# Gauss-Hermite quadrature for an erf network; the paper's expressions are written out here.

def _erf_moments():
    from scipy.special import erf

    z, w = np.polynomial.hermite_e.hermegauss(120)
    w = w / np.sqrt(2 * np.pi)
    d1 = lambda h: 2 / np.sqrt(np.pi) * np.exp(-h * h)  # noqa: E731
    d2 = lambda h: -2 * h * d1(h)  # noqa: E731
    d3 = lambda h: (4 * h * h - 2) * d1(h)  # noqa: E731
    E = lambda f, K: float(np.sum(w * f(np.sqrt(K) * z)))  # noqa: E731
    return erf, d1, d2, d3, E


def test_erratum_chi_definitions_in_section_2():
    """chi_K = sigma^2 d E[phi^2]/dK = sigma^2 E[phi'^2 + phi phi''] (printed: E[phi' phi'' + phi phi''']);
    chi_Delta = sigma^2 d E[phi'^2]/dK = sigma^2 E[phi''^2 + phi' phi'''] as in eq. 26
    (printed after eq. 15: E[phi'' phi''' + phi' phi'''])."""
    phi, d1, d2, d3, E = _erf_moments()
    K, e = 0.7, 1e-6
    dK_phi2 = (E(lambda h: phi(h) ** 2, K + e) - E(lambda h: phi(h) ** 2, K - e)) / (2 * e)
    dK_d1sq = (E(lambda h: d1(h) ** 2, K + e) - E(lambda h: d1(h) ** 2, K - e)) / (2 * e)
    assert E(lambda h: d1(h) ** 2 + phi(h) * d2(h), K) == pytest.approx(dK_phi2, rel=1e-7)
    assert E(lambda h: d1(h) * d2(h) + phi(h) * d3(h), K) != pytest.approx(dK_phi2, rel=0.1)  # printed chi_K
    assert E(lambda h: d2(h) ** 2 + d1(h) * d3(h), K) == pytest.approx(dK_d1sq, rel=1e-7)  # eq. 26
    assert E(lambda h: d2(h) * d3(h) + d1(h) * d3(h), K) != pytest.approx(dK_d1sq, rel=0.1)  # printed after eq. 15


def test_erratum_eq27_factor_two():
    """d log J^{l+1,l+2} / d a_W^{l+1} = 2 chi_Delta K^{l+1} / (a J) (sigma_b = 0); eq. 27 (and 15) print 4."""
    phi, d1, d2, d3, E = _erf_moments()
    sw, K0 = 1.3, 0.8

    def logJ(a):
        K1 = (a * sw) ** 2 * E(lambda h: phi(h) ** 2, K0)
        return np.log(sw**2 * E(lambda h: d1(h) ** 2, K1)), K1

    e = 1e-6
    num = (logJ(1 + e)[0] - logJ(1 - e)[0]) / (2 * e)
    lj, K1 = logJ(1.0)
    chi_delta = sw**2 * E(lambda h: d2(h) ** 2 + d1(h) * d3(h), K1)
    assert num == pytest.approx(2 * chi_delta * K1 / np.exp(lj), rel=1e-6)
