"""Scan: chi_J*, chi_K* along a divergence of K^l for activations growing faster than linearly.

Where K^l -> inf the solvers report the limits of chi_J^l and chi_K^l. For
phi(x) = x + x^3/10, E[phi'(h)^2] = 1 + 0.6 K + 0.27 K^2 grows without bound,
so both limits are inf (the phase is 'divergent', J^{l0,l} grows faster than
any exponential); the package used to return their values at K = 1e100
(chi_J* = 2.187e199, xi = 0.0022, phase 'chaotic'). References: the moments
by mpmath quadrature, the fixed point by mpmath.findroot.
"""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
import references as R

x = sp.Symbol("x")
CUBIC = x + sp.Rational(1, 10) * x**3


def _moment(f, K):
    """E[f(h)], h ~ N(0, K), by mpmath quadrature (15 digits)."""
    return R.expect(f, K, dps=20)


def _phi(h):
    return h + h**3 / 10


def _dphi(h):
    return 1 + 3 * h**2 / 10


@pytest.mark.slow
def test_unbounded_limits_are_inf():
    # sigma_w = 0.9, sigma_b = 0: the unit input K^1 = 0.81 lies above the unstable fixed point
    # K_u (F(K_u) = K_u > 0), so K^l diverges; chi_J(K) = sigma_w^2 E_K[phi'^2] grows like K^2.
    sw = mp.mpf("0.9")
    Ku = mp.findroot(lambda K: sw**2 * _moment(lambda h: _phi(h)**2, K) - K, 0.4)
    assert 0 < Ku < sw**2
    chi = [sw**2 * _moment(lambda h: _dphi(h)**2, K) for K in (mp.mpf(10)**6, mp.mpf(10)**12)]
    assert chi[1] > 1e11 * chi[0]          # no finite limit
    st = mf.fixed_point_state(CUBIC, sigma_w=[0.9, 0.5], sigma_b=[0.0, 0.3])
    assert st.K[0] == np.inf and st.chi_J[0] == np.inf and st.chi_K[0] == np.inf
    assert mf.correlation_length(CUBIC, sigma_w=0.9, sigma_b=0.0) == 0.0
    pd = mf.phase_diagram(CUBIC, sigma_w=[0.5, 0.9], sigma_b=[0.3])
    assert pd.phase_names().tolist() == [["ordered"], ["divergent"]]
    # the converged point is untouched: K* = F(K*), chi_J* = sigma_w^2 E[phi'^2] at K*
    sw, sb = mp.mpf("0.5"), mp.mpf("0.3")
    K = mp.findroot(lambda K: sw**2 * _moment(lambda h: _phi(h)**2, K) + sb**2 - K, 0.1)
    assert st.K[1] == pytest.approx(float(K), rel=1e-12)
    assert st.chi_J[1] == pytest.approx(float(sw**2 * _moment(lambda h: _dphi(h)**2, K)), rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["relu", "selu"])
def test_bounded_limits_unchanged(activation):
    # linear growth: chi_J^l -> sigma_w^2 (a_+^2 + a_-^2)/2 + mu^2 (a_- = 0; SELU lambda^2 (1 + 0)/2 for x > 0)
    gain2 = {"selu": float(mp.mpf("1.0507009873554804934193349852946")**2)}.get(activation, 1.0)
    st = mf.fixed_point_state(activation=activation, sigma_w=2.5, sigma_b=1.7, mu=0.5)
    assert st.K == np.inf
    assert float(st.chi_J) == pytest.approx(6.25 * gain2 / 2 + 0.25, rel=1e-12)


def test_profile_after_overflow_is_inf():
    with pytest.warns(mf.solvers.fixed.KernelOverflowWarning):
        kp = mf.kernel_profile(CUBIC, sigma_w=0.9, sigma_b=0.0, depth=12)
    # K^l by the exact polynomial map F(K) = 0.81 (K + 0.6 K^2 + 0.15 K^3) until it overflows
    K = mp.mpf("0.81")
    for l in range(12):
        if K > 1e308:
            assert kp.K[l] == np.inf and kp.chi_J[l] == np.inf
        else:
            assert kp.K[l] == pytest.approx(float(K), rel=1e-12)
        K = mp.mpf("0.81") * (K + 0.6 * K**2 + 0.15 * K**3)
