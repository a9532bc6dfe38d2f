"""The solvers' shared surface: every block through fixed_point_state / critical_line / phase_diagram
(against the symbolic recursion in mpmath), bad arguments, required coordinates, broadcasting.
Each solver module has its own test module: tests/test_solvers_fixed.py, test_solvers_lines.py,
test_solvers_exponents.py, test_solvers_finite_width.py.
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R

pytestmark = pytest.mark.filterwarnings("error")
mp.mp.dps = 30
REL = 1e-10



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
    import warnings

    import sympy as sp

    # the Mixer's recursion with a bias is an approximation of the network (the solvers warn, tested in
    # test_mixer.py); here it is compared with itself, symbolic against compiled
    warnings.simplefilter("ignore", mf.ApproximationWarning)
    rec = mf.recursion(**kw)
    st = mf.fixed_point_state(sigma_w=np.array([0.6, 1.3]), sigma_b=0.2, **kw)
    for i, sw in enumerate([0.6, 1.3]):
        if not np.isfinite(st.K[i]):
            continue
        subs = {"K": st.K[i], "K12": st.K12[i] if np.isfinite(st.K12[i]) else 0.0,
                "sigma_w": sw, "sigma_b": 0.2, "mu": 1.0 if rec.architecture.mu is None else rec.architecture.mu,
                "eps": rec.architecture.eps}
        subs = {sp.Symbol(k): v for k, v in subs.items()}
        assert R.close(sp.N(rec.kernel.evalf(25, subs=subs)), st.K[i], rel=1e-9)
        assert R.close(sp.N(rec.chi_J.evalf(25, subs=subs)), st.chi_J[i], rel=1e-9)
    line = mf.critical_line(sigma_w=np.linspace(0.2, 3, 5), **kw)
    assert line.sigma_b.shape == (5,)
    mf.phase_diagram(sigma_w=[0.5, 1.5], sigma_b=[0.1, 1.0], **kw)


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
