"""critical_line(sigma_b=0) with LayerNorm after an odd activation: no critical point, so NaN.

With ln_post, K* = sigma_w^2 + sigma_b^2 and chi_J = sigma_w^2 E[phi'(h)^2] / Var[phi(h)],
h ~ N(0, K*). At sigma_b = 0, chi_J - 1 > 0 for every sigma_w > 0 and tends to 0 only as
sigma_w -> 0 (erf: ~ 4/3 sigma_w^4). The scan used to take the exact zero that chi_J - 1
rounds to at sigma_w = 1e-5 for a root and returned sigma_w = 1e-5 as a critical point.
The reference here is mpmath quadrature, independent of the package's closed forms.
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf

_ACTS = {
    "erf": (mp.erf, lambda x: 2 / mp.sqrt(mp.pi) * mp.exp(-x * x)),
    "tanh": (mp.tanh, lambda x: 1 / mp.cosh(x) ** 2),
}


def _chi_J_minus_1(act, sw, sb):
    f, df = _ACTS[act]
    s = mp.sqrt(sw ** 2 + sb ** 2)

    def E(g):
        return mp.quad(lambda z: g(s * z) * mp.npdf(z), [-mp.inf, -4, 0, 4, mp.inf])

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
