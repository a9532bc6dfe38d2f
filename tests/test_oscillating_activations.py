"""User activations that oscillate (sin, cos, x sin x): every call answers or refuses, never hangs.

E[phi(sqrt(K) z)^2] of such an activation is not resolved by the quadrature beyond K ~ 1.3e7
(10 halvings of the step); the scans over K* (critical_line's table to 1e12, critical_point,
fixed_points, exponents) refuse up front with a ConvergenceError naming the activation and the K
(issue 27 item 2), and the calls that stay below that K answer, in bounded time (docs/theory.md,
"Limits"), checked against the closed forms E[sin^2 h] = (1 - e^{-2K})/2 and
E[cos^2 h] = (1 + e^{-2K})/2 solved with mpmath.
"""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield import numeric
from meanfield.solvers import ConvergenceError

x = sp.Symbol("x")
OSCILLATING = {"sin": sp.sin(x), "cos": sp.cos(x), "x_sin": x * sp.sin(x)}

SCANS = {
    "critical_line": lambda a: mf.critical_line(activation=a, sigma_w=[1.0, 2.0]),
    "critical_point": lambda a: mf.critical_point(activation=a),
    "fixed_points": lambda a: mf.fixed_points(activation=a, sigma_w=1.5, sigma_b=0.5),
    "exponents": lambda a: mf.exponents(activation=a, sigma_w=1.5, sigma_b=0.5),
}


@pytest.fixture
def interpreted(monkeypatch):
    """The CPython engine (no numba compile): the same kernels and the numpy twin of the quadrature."""
    monkeypatch.setattr(numeric, "_ENGINE_FORCED", "python")


def _refused(call, activation):
    with pytest.raises(ConvergenceError) as info:
        call(activation)
    msg = str(info.value)
    assert str(activation) in msg and "cannot be evaluated at K = " in msg
    # the K named is where the quadrature fails: above 1e6 (sin resolved) and at most the scans' K range
    K = float(msg.split("cannot be evaluated at K = ")[1].split(":")[0])
    assert 1e6 < K <= 1e10


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OSCILLATING))
def test_scans_over_K_refuse_oscillating_activations(interpreted, name):
    for scan in SCANS:
        if name == "x_sin" and scan == "exponents":
            continue   # sigma_w = 1.5 > sqrt 2: K^l grows (F ~ sigma_w^2 K / 2) into the unresolved range first
        _refused(SCANS[scan], OSCILLATING[name])


@pytest.mark.slow
def test_x_sin_x_growth_is_refused_not_passed_off(interpreted):
    """x sin x at sigma_w = 2: F(K) = W (K/2 - (K - 4K^2) e^{-2K}/2) + T ~ 2K, K^l diverges; the march
    reaches K ~ 1e7, where the quadrature fails, and the call says so (no finite K* is returned)."""
    with pytest.raises(ConvergenceError, match="NaN"):
        mf.fixed_point(activation=x * sp.sin(x), sigma_w=2.0, sigma_b=0.5)


def _sin_fixed_point(sw, sb):
    """K* = sw^2 (1 - e^{-2K})/2 + sb^2 of sin (mpmath, 30 digits)."""
    with mp.workdps(30):
        W, T = mp.mpf(sw) ** 2, mp.mpf(sb) ** 2
        return float(mp.findroot(lambda k: W * (1 - mp.exp(-2 * k)) / 2 + T - k, W / 2 + T))


def test_fixed_points_below_the_refusal_answer(interpreted):
    """The hint of the refusal works: with K_max below the unresolved range, sin's fixed points."""
    fps = mf.fixed_points(activation=sp.sin(x), sigma_w=1.5, sigma_b=0.5, K_max=1e6)
    finite = [fp for fp in fps if np.isfinite(fp.K)]
    assert len(finite) == 1
    ref = _sin_fixed_point(1.5, 0.5)
    assert abs(finite[0].K - ref) <= 1e-10 * ref
    # chi_K = W e^{-2K*} < 1: stable
    assert finite[0].stability == "stable"
    assert abs(finite[0].chi_K - 2.25 * math.exp(-2 * ref)) <= 1e-10


def test_sin_critical_line_at_chosen_fixed_points(interpreted):
    """critical_line(K_star=) at K* the quadrature resolves: chi_J = W (1 + e^{-2K})/2 = 1 gives
    W = 2/(1 + e^{-2K}), T = K - W (1 - e^{-2K})/2 (mpmath)."""
    Ks = np.array([0.05, 0.17, 0.3])
    line = mf.critical_line(activation=sp.sin(x), K_star=Ks)
    with mp.workdps(30):
        for K, sw, sb in zip(Ks, line.sigma_w, line.sigma_b):
            e = mp.exp(-2 * mp.mpf(K))
            W = 2 / (1 + e)
            T = K - W * (1 - e) / 2
            assert abs(sw - float(mp.sqrt(W))) <= 1e-10
            assert abs(sb - float(mp.sqrt(T))) <= 1e-10


@pytest.mark.slow
def test_sin_critical_line_refused_by_numba(monkeypatch):
    """The compiled path (numba: each failed expectation ~0.3 s) refuses as the interpreted one."""
    monkeypatch.setattr(numeric, "_ENGINE_FORCED", "numba")
    _refused(SCANS["critical_line"], sp.sin(x))
    _refused(SCANS["critical_point"], sp.sin(x))


def test_sin_critical_line_at_an_unresolved_fixed_point_is_refused(interpreted):
    """A K* the quadrature does not resolve is refused by name, not returned as 'no line' (NaN)."""
    with pytest.raises(ConvergenceError, match=r"cannot be evaluated at K = 1e\+10"):
        mf.critical_line(activation=sp.sin(x), K_star=[0.17, 1e10])


def test_critical_point_lists_fixed_points_below_its_own_K_max(interpreted):
    """Where the recursion cannot be evaluated up to 1e10, critical_point lists the fixed points in
    [0, K_max] at the point (it used to ask fixed_points for K up to 1e10 and was refused there).

    sin: chi_J = W (1 + e^{-2K})/2 and chi_K = W e^{-2K} are both 1 only at K = 0, W = 1, T = 0, where
    F(K) - K = -K^2 + O(K^3) (c2 = 1 > 0): half-stable from above, the only fixed point."""
    points = mf.critical_point(activation=sp.sin(x), K_max=1e4).points
    assert len(points) == 1
    p = points[0]
    assert abs(p.sigma_w - 1.0) <= 1e-10 and abs(p.sigma_b) <= 1e-10 and abs(p.K_star) <= 1e-12
    assert p.stability == "half-stable from above"
    assert [fp.K for fp in p.fixed_points] == [0.0]
    assert p.fixed_points[0].basin == (0.0, math.inf)


@pytest.mark.slow
def test_a_scan_whose_integrals_converge_only_at_their_finest_levels_answers(monkeypatch):
    """The worst case of the bound stated in docs/theory.md ("Limits"): sin's fixed points scanned up to
    K_max = 1e7, just below the first K refused (the quadrature converges there only at its finest
    levels; ~13 s in numba). The answer is the closed form's, not an approximation."""
    monkeypatch.setattr(numeric, "_ENGINE_FORCED", "numba")
    fps = mf.fixed_points(activation=sp.sin(x), sigma_w=1.5, sigma_b=0.3, K_max=1e7)
    ref = _sin_fixed_point(1.5, 0.3)
    assert [fp.stability for fp in fps] == ["stable"]
    assert abs(fps[0].K - ref) <= 1e-10 * ref
    assert fps[0].basin == (0.0, math.inf)
    with pytest.raises(ConvergenceError, match=r"cannot be evaluated at K = 1\.25e\+07"):
        mf.fixed_points(activation=sp.sin(x), sigma_w=1.5, sigma_b=0.3, K_max=1.25e7)
