"""Broadcasting of the point solvers (issue 15): one compiled call over arrays of sigma_w,
sigma_b, mu, K0 gives exactly the numbers of the one-point calls, in the documented shapes."""
import numpy as np
import pytest

import meanfield as mf


SW = np.array([0.6, 1.0, 1.3, 2.2])[:, None]
SB = np.array([0.0, 0.05, 0.4])


@pytest.mark.parametrize("kw", [dict(activation="erf"), dict(activation="relu"),
                                dict(activation="gelu", norm="ln_pre", mu=0.5),
                                dict(activation="relu", norm="bn")])
def test_profile_broadcast_equals_loop(kw):
    depth = 12
    if kw.get("norm") in ("ln_pre", "bn"):
        sw = SW + 0.1
    else:
        sw = SW
    R = mf.kernel_profile(sigma_w=sw, sigma_b=SB, depth=depth, **kw)
    assert R.K.shape == R.chi_J.shape == R.J.shape == (4, 3, depth)
    assert R.sigma_w.shape == R.sigma_b.shape == (4, 3)
    assert (R.K12 is None) == (kw.get("norm") != "bn")
    for i in range(4):
        for j in range(3):
            p = mf.kernel_profile(sigma_w=float(sw[i, 0]), sigma_b=float(SB[j]), depth=depth, **kw)
            # exactly the same numbers (one kernel, row by row), not merely close
            np.testing.assert_array_equal(R.K[i, j], p.K)
            np.testing.assert_array_equal(R.chi_J[i, j], p.chi_J)
            np.testing.assert_array_equal(R.J[i, j], p.J)
            if p.K12 is not None:
                np.testing.assert_array_equal(R.K12[i, j], p.K12)
            assert R.sigma_w[i, j] == p.sigma_w and R.sigma_b[i, j] == p.sigma_b


def test_profile_broadcast_mu_and_K0():
    mus = np.array([0.0, 0.3, 0.9, 1.0])
    K0 = np.array([[0.5], [2.0]])
    R = mf.kernel_profile(activation="tanh", norm="ln_pre", mu=mus, sigma_w=1.1, sigma_b=0.2, K0=K0, depth=7)
    assert R.K.shape == (2, 4, 7) and R.mu.shape == (2, 4)
    for a in range(2):
        for b in range(4):
            p = mf.kernel_profile(activation="tanh", norm="ln_pre", mu=float(mus[b]), sigma_w=1.1, sigma_b=0.2,
                                  K0=float(K0[a, 0]), depth=7)
            np.testing.assert_array_equal(R.K[a, b], p.K)
            np.testing.assert_array_equal(R.chi_J[a, b], p.chi_J)
    # an Architecture with a skip connection takes mu= as the per-point strengths
    arch = mf.Architecture(activation="tanh", norm="ln_pre", mu=0.5)
    R2 = mf.kernel_profile(arch, mu=mus, sigma_w=1.1, sigma_b=0.2, K0=K0, depth=7)
    np.testing.assert_array_equal(R2.K, R.K)


def test_profile_mu_changes_the_answer():
    # guard against mu being ignored: mu = 0 and mu = 1 differ (residual adds mu^2 K)
    R = mf.kernel_profile(activation="erf", mu=[0.0, 1.0], sigma_w=1.0, sigma_b=0.1, depth=3)
    assert R.K[0, 1] != R.K[1, 1]
    # K^2 = F(K^1) with a skip: sigma_w^2 E[phi^2] + sigma_b^2 + mu^2 K^1; the difference is K^1 = 1.01
    assert R.K[1, 1] - R.K[0, 1] == pytest.approx(1.01, rel=1e-14)


def test_fixed_point_broadcasts_over_mu():
    mus = np.array([0.2, 0.5, 0.8])
    st = mf.fixed_point_state(activation="tanh", norm="ln_pre", mu=mus, sigma_w=[[1.0], [1.5]], sigma_b=0.1)
    assert st.K.shape == (2, 3)
    for a, sw in enumerate([1.0, 1.5]):
        for b, m in enumerate(mus):
            one = mf.fixed_point_state(activation="tanh", norm="ln_pre", mu=float(m), sigma_w=sw, sigma_b=0.1)
            assert st.K[a, b] == one.K and st.chi_J[a, b] == one.chi_J and st.chi_K[a, b] == one.chi_K
    assert mf.chi_J(activation="tanh", norm="ln_pre", mu=mus, sigma_w=1.0, sigma_b=0.1).shape == (3,)


@pytest.mark.parametrize("call, name", [
    ("mf.kernel_profile(activation='erf', sigma_w=[1, 2, 3], sigma_b=[0.1, 0.2], depth=3)", "sigma_w"),
    ("mf.kernel_profile(activation='erf', sigma_w=1.0, sigma_b=[0.1, 0.2], K0=[1, 2, 3], depth=3)", "K0"),
    ("mf.kernel_profile(activation='erf', mu=[0.1, 0.2, 0.3], sigma_w=[1, 2], sigma_b=0.1, depth=3)", "mu"),
    ("mf.kernel_profile(activation='erf', mu=[0.1, 1.5], sigma_w=1, sigma_b=0.1, depth=3)", "mu"),
    ("mf.kernel_profile(mf.Architecture(activation='erf'), mu=[0.1, 0.5], sigma_w=1, sigma_b=0.1, depth=3)",
     "mu"),
    ("mf.kernel_profile(activation='erf', sigma_w=[1, -2], sigma_b=0.1, depth=3)", "sigma_w"),
    ("mf.fixed_point(activation='erf', mu=[0.1, 0.2, 0.3], sigma_w=[1, 2], sigma_b=0.1)", "mu"),
])
def test_bad_shapes_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        eval(call)


def test_profile_overflow_per_row():
    # one row overflows (ReLU, sigma_w = 1e6), the other does not: only the first is inf, with its limit chi_J
    with pytest.warns(mf.solvers.fixed.KernelOverflowWarning):
        R = mf.kernel_profile(activation="relu", sigma_w=[1e6, 1.0], sigma_b=0.0, depth=60)
    one = mf.kernel_profile(activation="relu", sigma_w=1.0, sigma_b=0.0, depth=60)
    np.testing.assert_array_equal(R.K[1], one.K)
    assert np.isinf(R.K[0, -1]) and np.all(np.isfinite(R.chi_J[0]))
    # ReLU: chi_J = sigma_w^2 / 2 at every K
    assert R.chi_J[0, -1] == pytest.approx(0.5e12, rel=1e-12)


def test_keyword_architecture_built_once():
    from meanfield.solvers import _common

    _common._prepared.cache_clear()
    for sw in (1.0, 1.1, 1.2):
        mf.kernel_profile(activation="erf", sigma_w=sw, sigma_b=0.0, depth=2)
    info = _common._prepared.cache_info()
    assert info.misses == 1 and info.hits == 2
