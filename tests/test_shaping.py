"""Kernel shaping (meanfield.shaping): Q/C maps, TReLU, smooth TAT, DKS, and their torch realisation.

References are computed independently of the code under test: 2-D
quadrature of the activation itself, mpmath integrals, a bisection written
here, sympy identities and Monte-Carlo cosine similarities of finite networks.
"""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield.shaping as S
from meanfield.gaussian import mp_expect


# ---------------------------------------------------------------------------
# Local maps.
# ---------------------------------------------------------------------------
def _lrelu(a):
    scale = math.sqrt(2.0 / (1.0 + a * a))
    return lambda z: scale * np.where(z >= 0, z, a * z)


def _quad2_polar(phi, c):
    """E[phi(z1) phi(c z1 + s z2)], z ~ N(0, I_2), as a 2-D integral in polar coordinates.

    z = r (cos t, sin t): for positively homogeneous phi the integrand is
    r^2 phi(cos t) phi(c cos t + s sin t) r e^{-r^2/2} / (2 pi). Both 1-D
    integrals are done numerically: the radial one with scipy's quad, the
    angular one with Gauss-Legendre on the arcs between the kinks (where
    cos t = 0 or c cos t + s sin t = 0), on which the integrand is smooth.
    """
    from scipy.integrate import quad

    s = math.sqrt(max(1 - c * c, 0.0))
    radial = quad(lambda r: r**3 * math.exp(-r * r / 2), 0, np.inf, epsrel=1e-13)[0]
    t0 = math.atan2(-c, s)  # c cos t + s sin t = sqrt(c^2 + s^2) sin(t - t0') vanishes at t0 + k pi
    cuts = sorted({(v % (2 * math.pi)) for v in (math.pi / 2, 3 * math.pi / 2, t0, t0 + math.pi)} | {0.0, 2 * math.pi})
    nodes, weights = np.polynomial.legendre.leggauss(40)
    ang = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        t = 0.5 * (hi - lo) * nodes + 0.5 * (hi + lo)
        ang += 0.5 * (hi - lo) * weights @ (phi(np.cos(t)) * phi(c * np.cos(t) + s * np.sin(t)))
    return radial * ang / (2 * math.pi)


@pytest.mark.parametrize("a", [0.0, 0.2, 0.57, 0.9])
def test_leaky_relu_c_map_closed_form_matches_2d_quadrature(a):
    c = np.array([-1.0, -0.7, -0.2, 0.0, 0.3, 0.8, 0.99, 1.0])
    phi = _lrelu(a)
    quad = np.array([_quad2_polar(phi, ci) for ci in c])  # Q(1) = 1 for the normalised LReLU
    assert np.allclose(S.trelu_c_map(c, a), quad, atol=1e-10, rtol=0)
    # the registry route (arc-cosine kernel, sympy, q-dependent) agrees, at any q
    assert np.allclose(S.c_map(S.normalized_leaky_relu(a), c, 2.5), quad, atol=1e-10, rtol=0)
    assert np.allclose(S.c_map(S.normalized_leaky_relu(a), c, 0.3, 4.0), quad, atol=1e-10, rtol=0)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8])
def test_normalized_leaky_relu_q_identity_and_unit_slope(a):
    maps = S.local_maps(S.normalized_leaky_relu(a))
    q = np.array([1e-3, 0.5, 1.0, 7.0])
    assert np.allclose(maps.Q(q), q, rtol=1e-14)
    assert maps.Q_prime(1.0) == pytest.approx(1.0, abs=1e-14)
    # C'(1) = 1: the c -> 1 limit of the Price form, and the closed-form derivative
    assert maps.at_one(1) == pytest.approx(1.0, abs=1e-14)
    assert S.trelu_c_map_derivative(1.0, a) == pytest.approx(1.0, abs=1e-15)
    # C(1) = 1 exactly and no NaN at the sqrt(1 - c^2) singularity
    assert maps.C(1.0) == pytest.approx(1.0, abs=1e-15)
    assert np.isfinite(maps.C_derivative(np.array([0.999999, 1.0]), 1)).all()
    # C''(1) = +inf for a non-linear leaky ReLU (TAT section 4.2), finite below 1
    assert maps.at_one(2) == math.inf
    c = 1 - 1e-6
    expected = (1 - a) ** 2 / (math.pi * (1 + a * a)) / math.sqrt(1 - c * c)
    assert maps.C_derivative(c, 2) == pytest.approx(expected, rel=1e-6)


def test_c_map_derivative_matches_finite_differences():
    a, h = 0.4, 1e-6
    maps = S.local_maps(S.normalized_leaky_relu(a))
    for c in (-0.5, 0.0, 0.6, 0.95):
        fd = (S.trelu_c_map(c + h, a) - S.trelu_c_map(c - h, a)) / (2 * h)
        assert maps.C_derivative(c, 1) == pytest.approx(fd, abs=1e-8)
        assert S.trelu_c_map_derivative(c, a) == pytest.approx(fd, abs=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("name, phi", [
    ("erf", lambda t: mp.erf(t)),
    ("tanh", lambda t: mp.tanh(t)),
    ("softplus", lambda t: mp.log(1 + mp.exp(t))),
    ("gelu", lambda t: t * mp.ncdf(t)),
])
def test_derivatives_at_one_match_one_point_price_identities(name, phi):
    """C'(1) = E[phi'^2]/Q(1), C''(1) = E[phi''^2]/Q(1), Q'(1) = E[phi'^2 + phi phi''] (mpmath)."""
    d1 = lambda t: mp.diff(phi, t, 1)  # noqa: E731
    d2 = lambda t: mp.diff(phi, t, 2)  # noqa: E731
    Q1 = mp_expect(lambda t: phi(t) ** 2, 1, dps=20)
    maps = S.local_maps(name)
    assert maps.Q(1.0) == pytest.approx(float(Q1), rel=1e-11)
    assert maps.Q_prime(1.0) == pytest.approx(float(mp_expect(lambda t: d1(t) ** 2 + phi(t) * d2(t), 1, dps=20)),
                                              rel=1e-9)
    assert maps.at_one(1) == pytest.approx(float(mp_expect(lambda t: d1(t) ** 2, 1, dps=20) / Q1), rel=1e-9)
    assert maps.at_one(2) == pytest.approx(float(mp_expect(lambda t: d2(t) ** 2, 1, dps=20) / Q1), rel=1e-8)
    # the two-point forms approach the limits continuously
    assert maps.C_derivative(1 - 1e-7, 1) == pytest.approx(maps.at_one(1), rel=1e-5)
    assert maps.C(1.0) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.slow
def test_quadrature_c_map_matches_mpmath_reference(mp_smooth2):
    """The 2-D route (no closed form): softplus C map at unequal q against the trapezoid mpmath reference."""
    sp_mp = lambda t: mp.log(1 + mp.exp(t))  # noqa: E731
    q1, q2, c = 0.7, 1.6, 0.35
    k = float(mp_smooth2(sp_mp, sp_mp, q1, q2, c * math.sqrt(q1 * q2)))
    Q1 = float(mp_expect(lambda t: sp_mp(t) ** 2, q1, dps=20))
    Q2 = float(mp_expect(lambda t: sp_mp(t) ** 2, q2, dps=20))
    assert S.c_map("softplus", c, q1, q2) == pytest.approx(k / math.sqrt(Q1 * Q2), rel=1e-10)


# ---------------------------------------------------------------------------
# TReLU.
# ---------------------------------------------------------------------------
def _eq9(c, a):
    """TAT eq. 9 written out here (not imported)."""
    return c + (1 - a) ** 2 / (math.pi * (1 + a * a)) * (math.sqrt(max(1 - c * c, 0.0)) - c * math.acos(c))


def _cf0(a, depth, w=0.0, subnetworks=True):
    c = 0.0
    for _ in range(depth):
        c = w * w * c + (1 - w * w) * _eq9(c, a)
    return max(c, _eq9(0.0, a)) if (subnetworks and w != 0.0) else c


def _bisect(fn, target, lo=0.0, hi=1.0):
    """alpha with fn(alpha) = target for a decreasing fn, by plain bisection."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if fn(mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("depth, eta", [(2, 0.4), (5, 0.6), (20, 0.9), (100, 0.9), (100, 0.95), (50, 0.1)])
def test_trelu_slope_matches_independent_bisection(depth, eta):
    ref = _bisect(lambda a: _cf0(a, depth), eta)
    got = S.trelu_negative_slope(depth, eta)
    assert got == pytest.approx(ref, abs=1e-11)
    assert _cf0(got, depth) == pytest.approx(eta, abs=1e-12)


@pytest.mark.parametrize("depth, w, eta", [(50, 0.8, 0.9), (30, 0.5, 0.85), (10, 0.9, 0.3)])
def test_trelu_slope_rescaled_resnet(depth, w, eta):
    ref = _bisect(lambda a: _cf0(a, depth, w), eta)
    assert S.trelu_negative_slope(depth, eta, shortcut_weight=w) == pytest.approx(ref, abs=1e-11)
    ref_plain = _bisect(lambda a: _cf0(a, depth, w, subnetworks=False), eta)
    got = S.trelu_negative_slope(depth, eta, shortcut_weight=w, subnetworks=False)
    assert got == pytest.approx(ref_plain, abs=1e-11)


def test_trelu_slope_limits():
    assert S.trelu_negative_slope(10, 0.0) == 1.0                     # linear network
    top = _cf0(0.0, 10)
    assert S.trelu_negative_slope(10, top) == pytest.approx(0.0, abs=1e-12)  # ReLU


def test_maximal_curvature_matches_appendix_b5():
    """mu_f^2 = max{3, L (1 - w^2)} C''(1) for a rescaled ResNet with 3-layer branches (TAT B.5)."""
    for L, w in [(30, 0.8), (6, 0.9), (300, 0.0)]:
        net = S.rescaled_resnet(L, w, branch_depth=3)
        assert S.maximal_curvature(net, 0.7) == pytest.approx(max(3, L * (1 - w * w)) * 0.7, rel=1e-13)
    # the ResNet-50/101 of B.5: pre-activation bottleneck blocks (3 combined layers per branch), one
    # transition block per group whose shortcut holds a combined layer, a final combined layer
    for groups, L in [((3, 4, 6, 3), 50), ((3, 4, 23, 3), 101)]:
        w, v = 0.8, 0.6
        branch = S.Chain((S.Layer(),) * 3 + (S.Affine(),))
        plain = S.NormalizedSum((w, v), (S.IDENTITY, branch))
        transition = S.NormalizedSum((w, v), (S.Chain((S.Layer(), S.Affine())), branch))
        blocks = [transition if j == 0 else plain for n in groups for j in range(n)]
        net = S.Chain([S.Affine(), *blocks, S.Layer(), S.Affine()])
        assert S.nonlinear_depth(net) == L - 1 and len(blocks) == (L - 2) // 3
        assert S.maximal_curvature(net, 1.0) == pytest.approx((L - 6) * (1 - w * w) + 5, rel=1e-13)
    # DKS maximal slope of a vanilla net: C'(1)^L
    assert S.maximal_slope(S.vanilla(7), 1.1) == pytest.approx(1.1 ** 7, rel=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("net", [S.vanilla(3), S.vanilla(40), S.rescaled_resnet(20, 0.6),
                                 S.rescaled_resnet(12, 0.3, branch_depth=2)])
@pytest.mark.parametrize("eta", [0.05, 0.3, 0.6])
def test_theorem1_bounds_hold(net, eta):
    try:
        a = S.solve_negative_slope(net, eta, subnetworks=False)
    except ValueError:
        pytest.skip("eta not reachable for this network")
    act = S.normalized_leaky_relu(a)
    c = np.linspace(-1, 1, 401)
    cf, dcf = S.global_c_map(net, act, c, derivative=True)
    c0 = float(S.global_c_map(net, act, 0.0))
    assert c0 == pytest.approx(eta, abs=1e-10)
    b_dev, b_slope = S.theorem1_bounds(c0)
    assert np.max(np.abs(cf - c)) <= b_dev + 1e-12
    assert np.max(np.abs(dcf - 1)) <= b_slope + 1e-12
    assert np.all(dcf >= -1e-12) and np.all(dcf <= 1 + 1e-12)   # 0 <= C_f' <= 1 (proof of Thm 1)
    # derivative of the global map against finite differences
    h = 1e-6
    fd = (S.global_c_map(net, act, 0.3 + h) - S.global_c_map(net, act, 0.3 - h)) / (2 * h)
    assert float(S.global_c_map(net, act, 0.3, derivative=True)[1]) == pytest.approx(float(fd), abs=1e-7)


@pytest.mark.slow
def test_proposition1_corrected_shortcut_weight_exact():
    """TAT Prop. 1: vanilla TReLU net == rescaled ReLU ResNet with w = sqrt(2a/(1+a^2)) (not sqrt(a/(1+a^2)))."""
    a_sym, c_sym = sp.symbols("alpha c", positive=True)
    relu_c = (sp.sqrt(1 - c_sym**2) + (sp.pi - sp.acos(c_sym)) * c_sym) / sp.pi  # Daniely et al., TAT eq. 22
    trelu_c = c_sym + (1 - a_sym)**2 / (sp.pi * (1 + a_sym**2)) * (sp.sqrt(1 - c_sym**2) - c_sym * sp.acos(c_sym))
    w2 = 2 * a_sym / (1 + a_sym**2)
    assert sp.simplify(w2 * c_sym + (1 - w2) * relu_c - trelu_c) == 0
    w2_printed = a_sym / (1 + a_sym**2)
    assert sp.simplify(w2_printed * c_sym + (1 - w2_printed) * relu_c - trelu_c) != 0

    c = np.linspace(-1, 1, 41)
    relu = S.normalized_leaky_relu(0.0)
    for a in (0.1, 0.5, 0.9):
        L = 12
        vanilla = S.global_c_map(L, S.normalized_leaky_relu(a), c)
        w = float(S.equivalent_shortcut_weight(a))
        assert w == pytest.approx(math.sqrt(2 * a / (1 + a * a)))
        resnet = S.global_c_map(S.rescaled_resnet(L, w), relu, c)
        assert np.max(np.abs(vanilla - resnet)) < 1e-12
        printed = S.global_c_map(S.rescaled_resnet(L, math.sqrt(a / (1 + a * a))), relu, c)
        assert np.max(np.abs(vanilla - printed)) > 1e-2


def test_deep_limit_ode_proposition3():
    eta = 0.9
    T = S.deep_limit_time(eta)
    assert float(S.deep_limit_flow(0.0, T)) == pytest.approx(eta, abs=1e-12)
    c = np.array([-0.9, -0.5, 0.0, 0.5, 0.95])
    limit = S.trelu_deep_limit(c, eta)
    errs = []
    for L in (100, 1000):
        a = S.trelu_negative_slope(L, eta)
        x = c.copy()
        for _ in range(L):
            x = S.trelu_c_map(x, a)
        errs.append(np.max(np.abs(x - limit)))
        # L * eps(alpha_L) -> T
        eps = (1 - a) ** 2 / (math.pi * (1 + a * a))
        assert L * eps == pytest.approx(T, rel=5.0 / L)
    assert errs[1] < 2e-3 and errs[1] < errs[0] / 5      # O(1/L) convergence
    # psi solves the ODE: d psi/dt = g(psi)
    t, h = 1.3, 1e-5
    dpsi = (S.deep_limit_flow(0.2, t + h) - S.deep_limit_flow(0.2, t - h)) / (2 * h)
    p = float(S.deep_limit_flow(0.2, t))
    assert float(dpsi) == pytest.approx(math.sqrt(1 - p * p) - p * math.acos(p), rel=1e-6)


def test_proposition3_comparison_ode_erratum():
    """x' = (2 sqrt 2/3)(1 - x)^{3/2}, x(0) = 0 is solved by 1 - (3/(3 + sqrt(2) t))^2 (printed: 1 - (3/sqrt(2t+3))^2)."""
    from scipy.integrate import solve_ivp

    sol = solve_ivp(lambda t, x: 2 * math.sqrt(2) / 3 * (1 - x) ** 1.5, (0, 10), [0.0], rtol=1e-12, atol=1e-14,
                    dense_output=True)
    t = np.array([0.0, 0.5, 2.0, 10.0])
    numeric = sol.sol(t)[0]
    assert np.allclose(numeric, 1 - (3 / (3 + math.sqrt(2) * t)) ** 2, atol=1e-9)
    assert not np.allclose(numeric, 1 - (3 / np.sqrt(2 * t + 3)) ** 2, atol=1e-2)


# ---------------------------------------------------------------------------
# Smooth TAT and DKS.
# ---------------------------------------------------------------------------
def _conditions_mpmath(t):
    """Q(1), Q'(1), C(0), C'(1), C''(1) of phi_hat from its sympy expression, by mpmath quadrature."""
    x = sp.Symbol("x")
    e = t.expr.subs(sp.Symbol("x"), x)
    f = [sp.lambdify(x, sp.diff(e, x, k), modules="mpmath") for k in range(3)]
    E = lambda g: mp_expect(g, 1, dps=25)  # noqa: E731
    Q1 = E(lambda z: f[0](z) ** 2)
    return {"Q(1)": Q1, "Q'(1)": E(lambda z: f[1](z) ** 2 + f[0](z) * f[2](z)),
            "C(0)": E(f[0]) ** 2 / Q1, "C'(1)": E(lambda z: f[1](z) ** 2) / Q1,
            "C''(1)": E(lambda z: f[2](z) ** 2) / Q1}


@pytest.mark.slow
@pytest.mark.parametrize("act, depth", [("softplus", 50), ("softplus", 1), ("tanh", 10), ("gelu", 20),
                                        ("silu", 5)])
def test_smooth_tat_satisfies_its_four_conditions(act, depth):
    tau = 0.3
    t = S.tat_transform(act, tau=tau, depth=depth)
    got = _conditions_mpmath(t)
    assert abs(got["Q(1)"] - 1) < 1e-8
    assert abs(got["Q'(1)"] - 1) < 1e-8
    assert abs(got["C'(1)"] - 1) < 1e-8
    assert abs(got["C''(1)"] - tau / depth) < 1e-8
    # the package's own local maps agree (2-D route for C, Price route for derivatives)
    maps = S.local_maps(t)
    assert maps.Q(1.0) == pytest.approx(1.0, abs=1e-9)
    assert maps.at_one(2) == pytest.approx(tau / depth, abs=1e-9)
    # global curvature of the vanilla net: C_f''(1) = L C''(1) = tau (finite differences)
    if depth <= 10:
        h = 1e-3
        cf = S.global_c_map(depth, t, np.array([1 - 2 * h, 1 - h, 1.0]))
        assert (cf[2] - 2 * cf[1] + cf[0]) / h**2 == pytest.approx(tau, rel=2e-2)


@pytest.mark.slow
def test_smooth_tat_rescaled_resnet_uses_maximal_curvature():
    net = S.rescaled_resnet(24, 0.8, branch_depth=2)
    t = S.tat_transform("softplus", tau=0.3, network=net)
    kappa = 0.3 / max(2, 24 * (1 - 0.64))
    assert _conditions_mpmath(t)["C''(1)"] == pytest.approx(kappa, abs=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("act, depth, zeta", [
    ("softplus", 50, 1.5),
    # tanh at depth 5 checks the global map at c = 0, where the two-point integrand
    # cancels given u (C(0) = 0): it once refined for minutes (issue 10)
    ("tanh", 5, 1.5),
    ("gelu", 20, 10.0)])
def test_dks_satisfies_its_conditions(act, depth, zeta):
    t = S.dks_transform(act, zeta=zeta, depth=depth)
    got = _conditions_mpmath(t)
    slope = zeta ** (1.0 / depth)
    assert abs(got["Q(1)"] - 1) < 1e-8 and abs(got["Q'(1)"] - 1) < 1e-8
    assert abs(got["C(0)"]) < 1e-8
    assert abs(got["C'(1)"] - slope) < 1e-8
    c = np.array([0.0, 1.0 - 1e-6, 1.0])
    if depth <= 5:
        cf = S.global_c_map(depth, t, c)
        assert abs(cf[0]) < 1e-8                          # C_f(0) = 0
        assert (cf[2] - cf[1]) / 1e-6 == pytest.approx(zeta, rel=1e-3)   # C_f'(1) = zeta


@pytest.mark.slow
def test_bad_input_raises_value_error_naming_the_problem():
    for depth in (0, -3, 2.5, True, "10"):
        with pytest.raises(ValueError, match="depth"):
            S.trelu_negative_slope(depth)
    for eta in (-0.1, 1.5, float("nan"), "x"):
        with pytest.raises(ValueError, match="eta"):
            S.trelu_negative_slope(10, eta)
    with pytest.raises(ValueError, match=r"eta=0.9 is not reachable.*depth=1"):
        S.trelu_negative_slope(1, 0.9)
    with pytest.raises(ValueError, match="not reachable"):
        S.trelu_negative_slope(5, 1.0)
    with pytest.raises(ValueError, match="not reachable.*shortcut_weight=0.95"):
        S.trelu_negative_slope(10, 0.9, shortcut_weight=0.95)
    with pytest.raises(ValueError, match="shortcut_weight"):
        S.trelu_negative_slope(10, 0.5, shortcut_weight=1.2)
    with pytest.raises(ValueError, match="branch_depth"):
        S.rescaled_resnet(10, 0.5, branch_depth=3)
    with pytest.raises(ValueError, match="sum w_i"):
        S.NormalizedSum((0.5, 0.5), (S.IDENTITY, S.Chain((S.Layer(), S.Affine()))))
    with pytest.raises(ValueError, match="uncorrelated"):
        S.NormalizedSum((0.6, 0.8), (S.IDENTITY, S.Layer()))
    with pytest.raises(ValueError, match="tau"):
        S.tat_transform("softplus", tau=0.0, depth=5)
    with pytest.raises(ValueError, match="positively homogeneous"):
        S.tat_transform("relu", depth=5)
    with pytest.raises(ValueError, match="zeta"):
        S.dks_transform("tanh", zeta=1.0, depth=5)
    with pytest.raises(ValueError, match="unreachable"):
        S.dks_transform("softplus", zeta=10.0, depth=1)
    with pytest.raises(ValueError, match="exactly one of depth"):
        S.tat_transform("tanh")
    with pytest.raises(ValueError, match="c_f0"):
        S.theorem1_bounds(1.5)


# ---------------------------------------------------------------------------
# Torch: global C maps against Monte-Carlo cosine similarities.
# ---------------------------------------------------------------------------
try:
    import torch
except ImportError:  # the torch tests below are skipped
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs the verify extra (torch)")



def _mc_agrees(model_fn, c, width, n_init=8, tol_abs=0.02, seed=0):
    from meanfield.torch import shaping as V

    model = model_fn(torch.Generator().manual_seed(123))
    theory = S.global_c_map(model.network, model.transform, c)
    r = V.mc_cosine_similarity(model_fn, c, in_features=model.in_features, n_init=n_init, n_pairs=4, seed=seed)
    # statistical error bar (4 standard errors) plus a finite-width allowance
    assert np.all(np.abs(r.mean - theory) <= 4 * r.se + tol_abs), (theory, r.mean, r.se)
    return theory, r


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
@pytest.mark.parametrize("kind", ["trelu", "eoc", "tat_softplus", "trelu_resnet", "dks_tanh"])
def test_global_c_map_matches_monte_carlo(kind):
    from meanfield.torch import shaping as V

    width, dt = 256, torch.float64
    c = np.array([-0.8, -0.3, 0.0, 0.5, 0.9])
    makers = {
        "trelu": lambda g: V.tat_mlp(width, 10, eta=0.8, generator=g, dtype=dt),
        "eoc": lambda g: V.eoc_relu_mlp(width, 10, generator=g, dtype=dt),
        "tat_softplus": lambda g: V.tat_mlp(width, 5, "softplus", tau=0.5, generator=g, dtype=dt),
        "trelu_resnet": lambda g: V.tat_mlp(width, 20, eta=0.7, shortcut_weight=0.8, generator=g, dtype=dt),
        "dks_tanh": lambda g: V.dks_mlp(width, 5, "tanh", zeta=2.0, generator=g, dtype=dt),
    }
    theory, r = _mc_agrees(makers[kind], c, width)
    assert np.all(r.se < 0.05)       # the error bars are informative


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_proposition1_monte_carlo():
    """A vanilla TReLU MLP and a rescaled ReLU ResNet with the corrected w have the same cosine map."""
    from meanfield.torch import shaping as V

    a, L, width, dt = 0.5, 8, 256, torch.float64
    w = float(S.equivalent_shortcut_weight(a))
    c = np.array([-0.5, 0.0, 0.6])
    relu = S.normalized_leaky_relu(0.0)
    van = V.mc_cosine_similarity(lambda g: V.shaped_mlp(S.normalized_leaky_relu(a), width, L, generator=g, dtype=dt),
                                 c, in_features=width, n_init=8)
    res = V.mc_cosine_similarity(lambda g: V.shaped_mlp(relu, width, L, shortcut_weight=w, generator=g, dtype=dt),
                                 c, in_features=width, n_init=8, seed=1)
    printed = V.mc_cosine_similarity(
        lambda g: V.shaped_mlp(relu, width, L, shortcut_weight=math.sqrt(a / (1 + a * a)), generator=g, dtype=dt),
        c, in_features=width, n_init=8, seed=2)
    se = np.sqrt(van.se**2 + res.se**2)
    assert np.all(np.abs(van.mean - res.mean) <= 4 * se + 0.02)
    assert np.all(printed.mean - van.mean > 4 * np.sqrt(van.se**2 + printed.se**2))


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_shaped_activation_module_matches_numpy():
    from meanfield.torch import shaping as V

    z = np.linspace(-4, 4, 101)
    for t in (S.tat_transform("softplus", tau=0.3, depth=10), S.normalized_leaky_relu(0.3),
              S.dks_transform("gelu", zeta=1.5, depth=10)):
        got = V.ShapedActivation(t)(torch.tensor(z)).numpy()
        assert np.allclose(got, t.numpy()(z), rtol=1e-12, atol=1e-12)
    trelu = V.TReLU.for_network(20, 0.9)
    assert trelu.transform.negative_slope == pytest.approx(S.trelu_negative_slope(20, 0.9))


@pytest.mark.torch
@needs_torch
def test_orthogonal_init_preserves_q():
    from meanfield.torch import shaping as V

    m = V.shaped_mlp(S.normalized_leaky_relu(0.5), 128, 6, in_features=64, init="orthogonal",
                     generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x1, _ = V.input_pairs([0.0], 64, 32, generator=torch.Generator().manual_seed(1))
    q = m.features(x1.reshape(-1, 64)).pow(2).mean().item()
    assert q == pytest.approx(1.0, rel=0.1)        # Q(q) = q and orthogonal weights keep q = 1
