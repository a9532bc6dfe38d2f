"""solvers/finite_width.py: chi_Delta, the 1/N0 correction and the input APJN (Lemma D.1 / D.4)."""
import math

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R

pytestmark = pytest.mark.filterwarnings("error")


def test_chi_delta_against_quadrature():
    """chi_Delta = sw^2 E[phi''^2 + phi' phi'''] (Definition D.2), pointwise, for smooth phi."""
    def d2(x):
        return -2 * x * R.derf(x)

    def d3(x):
        return (4 * x * x - 2) * R.derf(x)

    for sw, sb in ((1.0, 0.1), (2.0, 0.7)):
        K = sw ** 2 + sb ** 2
        with mp.workdps(30):
            ref = sw ** 2 * R.expect(lambda x: d2(x) ** 2 + R.derf(x) * d3(x), K, cuts=R.WIDE_CUTS)
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
