"""Scan: E[hardtanh(h)^2] at large K, where the closed form cancels.

E[phi^2] = K erf(u) - sqrt(2K/pi) e^{-u^2} + erfc(u), u = 1/sqrt(2K): the first two
terms grow like sqrt(K) and cancel to ~(2/3) u/sqrt(pi), which left a relative error
~1e-16 sqrt(K) in K^{l+1} (2e-12 at K = 1e8, 1.7e-8 at K = 1e16) and in the LayerNorm-post
chi_J. The reference is mpmath quadrature (20 digits) split at the kinks +-1; chi_K at a
fixed point by differentiating the Gaussian weight.
"""
import mpmath as mp
import pytest

import meanfield as mf


def _m2(K, weight=lambda h, K: 1):
    """E[phi(h)^2 weight(h)], h ~ N(0, K)."""
    with mp.workdps(20):
        K = mp.mpf(K)
        s = mp.sqrt(K)
        return mp.quad(lambda h: min(1, max(-1, h))**2 * weight(h, K) * mp.exp(-h * h / (2 * K))
                       / mp.sqrt(2 * mp.pi * K), [-40 * s, -1, 1, 40 * s])


@pytest.mark.slow
@pytest.mark.parametrize("K0", [50.0, 1e8, 1e16])
def test_second_moment_large_K(K0):
    kp = mf.kernel_profile(activation="hardtanh", sigma_w=1.0, sigma_b=0.0, depth=2, K0=K0)
    assert kp.K[1] == pytest.approx(float(_m2(K0)), rel=2e-15)
    ln = mf.kernel_profile(activation="hardtanh", norm="ln_post", sigma_w=1.0, sigma_b=0.0, depth=1, K0=K0)
    with mp.workdps(20):
        chi = mp.erf(1 / mp.sqrt(2 * mp.mpf(K0))) / _m2(K0)      # sigma_w^2 E[phi'^2] / Var[phi]
    assert ln.chi_J[0] == pytest.approx(float(chi), rel=2e-15)


@pytest.mark.slow
def test_chi_K_on_the_series_branch():
    # sigma_w = 30: K* ~ 884, past the switch at K = 64
    st = mf.fixed_point_state(activation="hardtanh", sigma_w=30.0, sigma_b=0.5)
    K = mp.mpf(float(st.K))
    assert abs(900 * _m2(K) + mp.mpf("0.25") - K) < 1e-12 * K
    # d/dK E[f(h)] = E[f(h) (h^2 - K)] / (2 K^2) (differentiating the Gaussian weight)
    dm2 = _m2(K, lambda h, K: (h * h - K) / (2 * K * K))
    assert float(st.chi_K) == pytest.approx(float(900 * dm2), rel=1e-12)
