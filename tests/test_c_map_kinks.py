"""Scan: C''(c) of the local C map where phi' jumps is refused, not NaN; where phi' is continuous it is right.

C''(c) = sqrt(q1 q2)^2 E[phi''(u) phi''(v)] / sqrt(Q(q1) Q(q2)) (TAT eqs. 17-18). Where phi'
jumps (SELU at 0, hard-tanh at +-1) phi'' carries delta functions, which the two-point rule
does not carry: ``c_map_derivative(order=2)`` returned NaN at every c (and at c = 1, where
the true value is +inf). It is now a ValueError naming ``order``. ELU (alpha = 1) has a
continuous phi' and keeps its value, checked against nested mpmath quadrature.
"""
import mpmath as mp
import pytest

from meanfield import shaping


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["selu", "hardtanh"])
@pytest.mark.parametrize("c", [0.5, 1.0])
def test_second_derivative_refused_where_phi_prime_jumps(activation, c):
    with pytest.raises(ValueError, match="order=2"):
        shaping.c_map_derivative(activation, c, order=2)
    # orders 0 and 1 stay available
    assert 0 < shaping.c_map_derivative(activation, c, order=1) < 2


@pytest.mark.slow
def test_elu_second_derivative_against_mpmath():
    # ELU: phi'' = e^x on x < 0 and 0 on x > 0 (no delta: phi'(0-) = phi'(0+) = 1); q1 = q2 = 1, c = 1/2
    c = mp.mpf(1) / 2
    r = mp.sqrt(1 - c * c)
    with mp.workdps(15):
        Q = mp.quad(lambda z: (z if z > 0 else mp.expm1(z))**2 * mp.npdf(z), [-mp.inf, 0, mp.inf])
        # E[phi''(u) phi''(v)] with u = z1, v = c z1 + r z2: the inner integral over v < 0 in closed form,
        # E[e^v 1{v < 0} | z1] = e^{m + r^2/2} Phi(-(m + r^2)/r), m = c z1
        inner = lambda z1: mp.exp(c * z1 + r * r / 2) * mp.ncdf(-(c * z1 + r * r) / r)
        E2 = mp.quad(lambda z1: mp.exp(z1) * inner(z1) * mp.npdf(z1), [-mp.inf, 0])
    assert shaping.c_map_derivative("elu", 0.5, order=2) == pytest.approx(float(E2 / Q), rel=1e-12)
