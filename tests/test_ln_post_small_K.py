"""Scan: LayerNorm on activations at small K, where E[phi^2] - E[phi]^2 cancels.

chi_J = sigma_w^2 E[phi'^2] / Var[phi] (+ mu^2). For phi(0) != 0 (softplus, a user's
sigmoid) Var[phi] = E[phi^2] - E[phi]^2 lost ~1e-16/K relative: chi_J at K^1 = 1e-12
was off by 3.6e-4 for softplus. The variance is now taken of phi - phi(0). Reference:
mpmath quadrature at 30 digits (the cancellation then costs 12 of them).
"""
import mpmath as mp
import pytest
import sympy as sp

import meanfield as mf

x = sp.Symbol("x")


def _E(f, K):
    K = mp.mpf(K)
    s = mp.sqrt(K)
    return mp.quad(lambda h: f(h) * mp.exp(-h * h / (2 * K)) / mp.sqrt(2 * mp.pi * K), [-40 * s, 0, 40 * s])


@pytest.mark.parametrize("activation, f, df", [
    ("softplus", lambda h: mp.log1p(mp.exp(h)), lambda h: 1 / (1 + mp.exp(-h))),
    (1 / (1 + sp.exp(-x)), lambda h: 1 / (1 + mp.exp(-h)), lambda h: mp.exp(-h) / (1 + mp.exp(-h))**2),
])
@pytest.mark.slow
def test_ln_post_chi_J_small_K(activation, f, df):
    args, kw = ((), {"activation": activation}) if isinstance(activation, str) else ((activation,), {})
    kp = mf.kernel_profile(*args, norm="ln_post", mu=0.5, sigma_w=1.1, sigma_b=0.2, depth=1, K0=1e-12, **kw)
    with mp.workdps(30):
        var = _E(lambda h: f(h)**2, 1e-12) - _E(f, 1e-12)**2
        ref = mp.mpf("1.21") * _E(lambda h: df(h)**2, 1e-12) / var + mp.mpf("0.25")
    # phi(h) - phi(0) itself is rounded in float64: ~1e-16 / sqrt(K) relative remains
    assert kp.chi_J[0] == pytest.approx(float(ref), rel=1e-9)
