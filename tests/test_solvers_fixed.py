"""solvers/fixed.py: fixed points, chi_J, chi_K, kernel profiles against independent mpmath solves.

References: tests/references (mpmath quadrature of the activations coded by hand, erf's closed
moments, mp.findroot), never the package's code.
"""
import math

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R
from meanfield.solvers import ConvergenceError

pytestmark = pytest.mark.filterwarnings("error")
mp.mp.dps = 30
REL = 1e-10



@pytest.mark.parametrize("sw,sb", [(1.0, 0.1), (2.5, 0.7), (0.3, 1.2)])
def test_erf_fixed_point(sw, sb):
    ref = R.mlp_fixed_point(R.erf_phi2, sw, sb, sw ** 2)
    assert R.close(mf.fixed_point(activation="erf", sigma_w=sw, sigma_b=sb), ref)
    assert R.close(mf.chi_J(activation="erf", sigma_w=sw, sigma_b=sb), sw ** 2 * R.erf_dphi2(ref))


@pytest.mark.slow
@pytest.mark.parametrize("act,phi,sw,sb", [
    ("gelu", R.gelu, 1.2, 0.3),
    ("tanh", mp.tanh, 1.5, 0.2),
])
def test_quadrature_fixed_points(act, phi, sw, sb):
    """A bracketing root finder on [1e-6, 10] (these maps have one fixed point there)."""
    with mp.workdps(20):
        K = R.mlp_fixed_point(lambda k: R.expect(lambda x: phi(x) ** 2, k, cuts=R.WIDE_CUTS), sw, sb,
                              (mp.mpf("1e-6"), 10), solver="anderson")
    assert R.close(mf.fixed_point(activation=act, sigma_w=sw, sigma_b=sb), K)


@pytest.mark.slow
def test_kernel_profile_erf_and_pair_state():
    p = mf.kernel_profile(activation="erf", sigma_w=1.7, sigma_b=0.4, depth=6)
    K = mp.mpf(1.7 ** 2 + 0.4 ** 2)
    for l in range(6):
        assert R.close(p.K[l], K)
        assert R.close(p.chi_J[l], 1.7 ** 2 * R.erf_dphi2(K))
        K = 0.4 ** 2 + 1.7 ** 2 * R.erf_phi2(K)
    assert p.K12 is None and p.layers[0] == 1 and p.J[0] == 1.0
    # ReLU with large-batch BatchNorm: BN sends (K, K12) to (1, 0), then the
    # arc-cosine kernel: K' = sw^2/2 + sb^2 + mu^2 K, K12' = sw^2/(2 pi) + sb^2 + mu^2 K12
    sw, sb, mu = 1.3, 0.2, 0.5
    b = mf.kernel_profile(activation="relu", norm="bn", mu=mu, sigma_w=sw, sigma_b=sb, depth=5)
    K, Q = sw ** 2 + sb ** 2, sb ** 2
    for l in range(5):
        assert R.close(b.K[l], K) and R.close(b.K12[l], Q)
        assert R.close(b.chi_J[l], mu ** 2 + sw ** 2 / (2 * (K - Q)))
        K, Q = sw ** 2 / 2 + sb ** 2 + mu ** 2 * K, sw ** 2 / (2 * math.pi) + sb ** 2 + mu ** 2 * Q


@pytest.mark.slow
def test_bn_fixed_point_and_chi():
    """One BN per block: chi_J* = pi/(pi-1); with mu: mu^2 + (1 - mu^2) pi/(pi-1) (AutoInit eq. 23)."""
    assert R.close(mf.chi_J(activation="relu", norm="bn", sigma_w=1.1, sigma_b=0.3), math.pi / (math.pi - 1))
    mu = 0.5
    assert R.close(mf.chi_J(activation="relu", norm="bn", mu=mu, sigma_w=1.1, sigma_b=0.3),
                 mu ** 2 + (1 - mu ** 2) * math.pi / (math.pi - 1))
    K = mf.fixed_point(activation="relu", norm="bn", mu=0.999, sigma_w=1.0, sigma_b=0.1)
    assert R.close(K, (0.5 + 0.01) / (1 - 0.999 ** 2))


def test_edges_sigma_zero():
    assert mf.fixed_point(activation="erf", sigma_w=0.0, sigma_b=0.3) == pytest.approx(0.09, rel=1e-15)
    assert mf.chi_J(activation="erf", sigma_w=0.0, sigma_b=0.3) == 0.0
    assert mf.correlation_length(activation="erf", sigma_w=0.0, sigma_b=0.3) == 0.0
    assert mf.fixed_point(activation="erf", sigma_w=0.5, sigma_b=0.0) == 0.0
    assert mf.fixed_point(activation="erf", sigma_w=0.0, sigma_b=0.0) == 0.0
    ref = R.mlp_fixed_point(R.erf_phi2, 1.5, 0, 1.0)
    assert R.close(mf.fixed_point(activation="erf", sigma_w=1.5, sigma_b=0.0), ref)
    assert np.isnan(mf.critical_line(activation="erf", sigma_w=[0.0]).sigma_b[0])
    assert R.close(mf.fixed_point(activation="relu", sigma_w=1.0, sigma_b=0.0), 0.0)


@pytest.mark.slow
def test_edges_mu():
    assert mf.fixed_point(activation="erf", mu=1.0, sigma_w=1.0, sigma_b=0.1) == math.inf
    assert mf.chi_J(activation="erf", mu=1.0, sigma_w=1.0, sigma_b=0.1) == 1.0
    assert mf.chi_J(activation="relu", mu=1.0, sigma_w=1.0, sigma_b=0.1) == pytest.approx(1.5, rel=1e-15)
    m = 0.999
    ref = R.mlp_fixed_point(R.erf_phi2, 0.2, 0.1, (20, 25), mu=m, solver="anderson")
    assert R.close(mf.fixed_point(activation="erf", mu=m, sigma_w=0.2, sigma_b=0.1), ref)
    K = mf.fixed_point(activation="relu", mu=m, sigma_w=0.01, sigma_b=0.1)
    assert R.close(K, 0.01 / (1 - m * m - 0.5e-4))
    assert mf.fixed_point(activation="gelu", norm="ln_pre", mu=1.0, sigma_w=1.0, sigma_b=0.0) == math.inf


@pytest.mark.parametrize("K0", [1e-300, 1e-12, 1e12, 1e100])
def test_edges_K0(K0):
    ref = mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.1)
    assert R.close(mf.fixed_point(activation="erf", sigma_w=1.0, sigma_b=0.1, K0=K0), ref)
    ref = mf.fixed_point(activation="gelu", sigma_w=1.0, sigma_b=0.1)
    assert R.close(mf.fixed_point(activation="gelu", sigma_w=1.0, sigma_b=0.1, K0=K0), ref)
    assert mf.fixed_point(activation="relu", sigma_w=1.0, sigma_b=0.0, K0=K0) == 0.0


def test_iteration_cap_is_a_clear_error():
    with pytest.raises(ConvergenceError, match="sigma_w=1.*iteration cap.*errors='nan'"):
        mf.fixed_point_state(activation="erf", sigma_w=1.0, sigma_b=0.1, maxiter=1)
    st = mf.fixed_point_state(activation="erf", sigma_w=[1.0], sigma_b=0.1, maxiter=1, errors="nan")
    assert np.isnan(st.K[0])
