"""User (sympy) activations and quadrature activations: right to a stated accuracy, or refused.

References are computed here with mpmath at 30 digits (mp.quad split at the
breakpoints this file names itself), with exact formulas (sin at large K),
or with finite differences; none is taken from the code under test.
The accuracy table in docs/howto.md ("Accuracy of quadrature activations")
is what these tests pin.
"""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield.activations import ScaleInvariant, UserActivation, activation
from meanfield.gaussian import expect, expect_dK, numpy_function, pieces
from meanfield.symbols import x

LAM, ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
SELU = sp.Piecewise((LAM * x, x > 0), (LAM * ALPHA * (sp.exp(x) - 1), True))
ELU = sp.Piecewise((x, x > 0), (sp.exp(x) - 1, True))
# continuous, with a jump in phi' at x = 1/2 (slope 1 -> 3)
KINK_JUMP = sp.Piecewise((sp.tanh(x), x < sp.Rational(1, 2)),
                         (sp.tanh(sp.Rational(1, 2)) + 3 * (x - sp.Rational(1, 2)), True))

# name, expression, breakpoints (written here, not taken from the code)
CASES = [
    ("Max(x,0)", sp.Max(x, 0), [0]),
    ("Max(x-1,0)", sp.Max(x - 1, 0), [1]),
    ("SELU", SELU, [0]),
    ("ELU", ELU, [0]),
    ("kink", KINK_JUMP, [0.5]),
    ("softplus", sp.log(1 + sp.exp(x)), []),
    ("silu", x / (1 + sp.exp(-x)), []),
    ("tanh", sp.tanh(x), []),
]
KS = [1e-6, 1e-3, 1.0, 1e3, 1e6]


def mp_gauss(f, K, cuts=(), dps=30):
    """E[f(h)], h ~ N(0, K), with mpmath, split at 0, the cuts and the scales 1, sqrt(K)."""
    with mp.workdps(dps):
        K = mp.mpf(K)
        s = mp.sqrt(K)
        pts = {mp.mpf(0)}
        for c in list(cuts) + [1, 5, 20]:
            pts.update({mp.mpf(c), -mp.mpf(c)} if c in (1, 5, 20) else {mp.mpf(c)})
        for c in (1, 3, 8, 16):
            pts.update({c * s, -c * s})
        for c in cuts:  # the Gaussian decays on the scale K / |c| beyond a cut far out
            if c != 0:
                pts.update(mp.mpf(c) + mp.sign(c) * j * K / abs(mp.mpf(c)) for j in (0.25, 1, 4, 16, 64))
        pts = [-mp.inf] + sorted(p for p in pts if abs(p) <= 40 * s) + [mp.inf]
        return mp.quad(lambda h: f(h) * mp.exp(-h * h / (2 * K)), pts) / mp.sqrt(2 * mp.pi * K)


def _mp(e):
    return sp.lambdify(x, e, modules="mpmath")


def _pw_diff(e):
    """phi' of a Piecewise/Max expression, piece by piece (what a mathematician writes)."""
    e = sp.piecewise_fold(e.rewrite(sp.Piecewise)) if e.has(sp.Max) else e
    return sp.diff(e, x)


def _check(got, ref, tol, what):
    ref = float(ref)
    if abs(ref) < 1e-290:  # underflows in float64
        assert abs(got) < 1e-290, what
        return
    assert abs(got - ref) <= tol * abs(ref), f"{what}: got {got!r}, mpmath {ref!r}, rel {abs(got - ref) / abs(ref):.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name,expr,cuts", CASES, ids=[c[0] for c in CASES])
def test_moments_match_mpmath_over_K_range(name, expr, cuts):
    """E[phi^2] and E[phi'^2] to 1e-10 relative for K in [1e-6, 1e6] (the numpy engine)."""
    d = _pw_diff(expr)
    for label, e in (("E[phi^2]", expr**2), ("E[phi'^2]", d**2)):
        g = numpy_function(sp.Lambda(x, e))
        fm = _mp(e)
        for K in KS:
            if any(abs(c) / math.sqrt(K) > 20 for c in cuts):
                continue  # the mass sits e^-200 deep in the tail: see the closed-form test below
            got = float(expect(g, K, cuts))
            _check(got, mp_gauss(fm, K, cuts), 1e-10, f"{name} {label} K={K}")


def test_shifted_kink_closed_form_small_K():
    """E[Max(h-1,0)^2] = K[(1 + a^2) Q(a) - a phi(a)], a = 1/sqrt(K): deep in the tail (1e-225 at K = 1e-3)."""
    g = numpy_function(sp.Lambda(x, sp.Max(x - 1, 0) ** 2))
    for K in (1e-3, 1e-2, 0.1, 1.0, 100.0):
        with mp.workdps(40):
            a = 1 / mp.sqrt(K)
            ref = K * ((1 + a * a) * mp.erfc(a / mp.sqrt(2)) / 2 - a * mp.npdf(a))
        _check(float(expect(g, K, [1.0])), ref, 1e-12, f"K={K}")


def test_sin_at_large_K_is_exact():
    """E[sin(h)^2] = (1 - exp(-2K)) / 2: oscillating integrand, refined up to K = 1e6."""
    g = numpy_function(sp.Lambda(x, sp.sin(x) ** 2))
    Ks = np.array([1.0, 100.0, 1e3, 1e4, 1e5, 1e6])
    got = expect(g, Ks)
    exact = -np.expm1(-2 * Ks) / 2
    assert np.max(np.abs(got - exact) / exact) < 1e-10


def test_breakpoints_and_jumps_found():
    assert pieces(sp.Lambda(x, sp.Max(x - 1, 0))).float_cuts == (1.0,)
    info = pieces(sp.Lambda(x, SELU))
    assert info.float_cuts == (0.0,) and info.jump0 == (0,)
    assert abs(float(info.jump1[0]) - LAM * (1 - ALPHA)) < 1e-12
    assert pieces(sp.Lambda(x, sp.sign(x - 2))).jump0 == (2,)
    assert pieces(sp.Lambda(x, sp.Min(sp.Max(x, -1), 1))).float_cuts == (-1.0, 1.0)


# ---------------------------------------------------------------------------
# K-derivatives: Price's theorem with jump terms vs the Gaussian-weight form vs FD.
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,expr,cuts", [c for c in CASES if c[0] in ("SELU", "ELU", "kink", "Max(x-1,0)")],
                         ids=["Max(x-1,0)", "SELU", "ELU", "kink"])
def test_dK_of_derivative_moment_three_ways(name, expr, cuts):
    """d/dK E[phi'^2]: symbolic (Price + jumps), weight form E[g (h^2-K)]/(2K^2), finite difference."""
    g = _pw_diff(expr) ** 2
    Ksym = sp.Symbol("K", positive=True)
    from meanfield.gaussian import GaussianExpectation
    dE = sp.diff(GaussianExpectation(sp.Lambda(x, g), Ksym), Ksym)
    import meanfield.symbolic as msym
    f = msym.lambdify([Ksym], dE)
    gn = numpy_function(sp.Lambda(x, g))
    gm = _mp(g)
    for K in (0.3, 1.0, 4.0):
        price = float(f(K))
        weight = float(expect_dK(gn, K, cuts))
        with mp.workdps(30):
            h = mp.mpf(K) * mp.mpf("1e-8")
            fd = (mp_gauss(gm, K + h, cuts) - mp_gauss(gm, K - h, cuts)) / (2 * h)
        assert abs(price - float(fd)) < 1e-9 * max(1.0, abs(float(fd))), (name, K, price, fd)
        assert abs(weight - price) < 1e-9 * max(1.0, abs(price)), (name, K, weight, price)


@pytest.mark.slow
def test_selu_like_chi_delta_matches_finite_difference_compiled():
    """The issue's case: (sigma_w, sigma_b, K) = (1, 0, 1), chi_Delta and d chi_J/dK = -0.1939, not +1.04."""
    import meanfield.numeric as num

    mod = num.compiled(activation=SELU).module
    chi = lambda k: mod.chi_J(k, 0.0, 1.0, 0.0, 0.0, 0.0)  # noqa: E731
    gm = _mp(_pw_diff(SELU) ** 2)
    with mp.workdps(30):
        fd = float((mp_gauss(gm, 1 + mp.mpf("1e-8"), [0]) - mp_gauss(gm, 1 - mp.mpf("1e-8"), [0])) / mp.mpf("2e-8"))
    assert abs(fd + 0.19391857726665) < 1e-9
    assert abs(mod.dchiJ_dK(1.0, 0.0, 1.0, 0.0, 0.0, 0.0) - fd) < 1e-9
    assert abs(mod.chi_Delta(1.0, 0.0, 1.0, 0.0, 0.0, 0.0) - fd) < 1e-9
    # and the compiled moments agree with mpmath (same engine as numpy)
    for K in (1e-4, 1.0, 1e4):
        _check(mod.chi_J(K, 0.0, 1.0, 0.0, 0.0, 0.0), mp_gauss(gm, K, [0]), 1e-10, f"compiled chi_J K={K}")
        _check(mod.kernel(K, 0.0, 1.0, 0.0, 0.0, 0.0), mp_gauss(_mp(SELU**2), K, [0]), 1e-10, f"kernel K={K}")
    assert abs((chi(1.0 + 1e-6) - chi(1.0 - 1e-6)) / 2e-6 - fd) < 1e-6


# ---------------------------------------------------------------------------
# Built-ins recognised; refusals.
# ---------------------------------------------------------------------------
def test_max_is_relu_and_abs_is_abs():
    t = sp.Symbol("t")
    a = activation(sp.Max(t, 0))
    assert isinstance(a, ScaleInvariant) and (a.a_plus, a.a_minus) == (1, 0)
    assert isinstance(activation(sp.Abs(t)), ScaleInvariant) and activation(sp.Abs(t)).a_minus == -1
    assert activation(t / 2 * (1 + sp.erf(t / sp.sqrt(2)))).name == "gelu"
    assert abs(mf.chi_J(activation=sp.Max(t, 0), sigma_w=1, sigma_b=0) - 0.5) < 1e-12
    assert abs(mf.chi_J(activation=sp.Max(t, 0), sigma_w=1.3, sigma_b=0.2)
               - mf.chi_J(activation="relu", sigma_w=1.3, sigma_b=0.2)) < 1e-12


@pytest.mark.parametrize("expr", [sp.sqrt(x), sp.I * x, 1 / x, sp.log(x), x ** sp.Rational(1, 3), sp.floor(x),
                                  sp.DiracDelta(x), 1 / (x - 2) ** 2])
def test_refused_expressions(expr):
    with pytest.raises(ValueError, match="activation"):
        activation(expr)


@pytest.mark.parametrize("expr", [sp.Heaviside(x), sp.sign(x), sp.Heaviside(x - 1)])
def test_jump_refused_where_chi_J_needs_phi_prime_squared(expr):
    a = activation(expr)
    assert isinstance(a, UserActivation)
    with pytest.raises(ValueError, match="activation.*delta"):
        a.derivative_second_moment(1.0)
    with pytest.raises(ValueError, match="activation"):
        mf.recursion(activation=expr)


# ---------------------------------------------------------------------------
# Large K through the compiled solvers.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_sin_fixed_point_large_sigma_w():
    """K* = sigma_w^2 E[sin^2] = sigma_w^2 (1 - e^{-2K*}) / 2 = 450 at sigma_w = 30 (was 453.5)."""
    t = sp.Symbol("t")
    got = mf.fixed_point(activation=sp.sin(t), sigma_w=30, sigma_b=0.0)
    assert abs(got - 450.0) < 1e-9 * 450


# Closed forms of the oscillating and decaying activations, h ~ N(0, K):
# E[sin^2] = (1 - e^{-2K}) / 2, E[cos^2] = (1 + e^{-2K}) / 2, E[exp(-2 h^2)] = (1 + 4K)^(-1/2),
# E[(-2 h exp(-h^2))^2] = 4K (1 + 4K)^(-3/2); the fixed point K* = sw^2 E[phi^2] + sb^2 is solved
# with mpmath and chi_J = sw^2 E[phi'^2] taken there.
OSCILLATING = [
    ("sin", lambda t: sp.sin(t),
     lambda K: (1 - mp.exp(-2 * K)) / 2, lambda K: (1 + mp.exp(-2 * K)) / 2),
    ("cos", lambda t: sp.cos(t),
     lambda K: (1 + mp.exp(-2 * K)) / 2, lambda K: (1 - mp.exp(-2 * K)) / 2),
    ("exp(-x^2)", lambda t: sp.exp(-t**2),
     lambda K: 1 / mp.sqrt(1 + 4 * K), lambda K: 4 * K / (1 + 4 * K) ** 1.5),
]


@pytest.mark.parametrize("name,phi,e_phi2,e_dphi2", OSCILLATING,
                         ids=[c[0] for c in OSCILLATING])
@pytest.mark.slow
@pytest.mark.parametrize("sw,sb", [(2.0, 0.1), (0.7, 0.3)])
def test_oscillating_and_decaying_one_point_closed_form(name, phi, e_phi2, e_dphi2, sw, sb):
    """fixed_point and chi_J of sin, cos, exp(-x^2) against the closed forms above (issue 27)."""
    t = sp.Symbol("t")
    with mp.workdps(30):
        K_ref = mp.findroot(lambda K: sw**2 * e_phi2(K) + sb**2 - K, 1.0)
        chi_ref = sw**2 * e_dphi2(K_ref)
    K = mf.fixed_point(activation=phi(t), sigma_w=sw, sigma_b=sb)
    chi = mf.chi_J(activation=phi(t), sigma_w=sw, sigma_b=sb)
    assert abs(K - float(K_ref)) <= 1e-10 * float(K_ref)
    assert abs(chi - float(chi_ref)) <= 1e-10 * float(chi_ref)


@pytest.mark.slow
def test_softplus_kernel_profile_large_K_finite_and_right():
    """softplus at (1.6, 0.5): K grows past 400 (was NaN at layer 13); check layers against mpmath."""
    prof = mf.kernel_profile(activation="softplus", sigma_w=1.6, sigma_b=0.5, depth=20)
    K = np.asarray(prof.K)
    assert np.all(np.isfinite(K)) and K[-1] > 400
    sp_mp = lambda h: mp.log1p(mp.exp(h)) ** 2  # noqa: E731
    for l in (12, len(K) - 2):
        ref = 1.6**2 * mp_gauss(sp_mp, K[l]) + 0.25
        assert abs(K[l + 1] - float(ref)) < 1e-10 * float(ref)
    # chi_J = 1.6^2 E[sigmoid(h)^2] -> 1.28 as K -> inf (the limit, finite)
    assert abs(mf.chi_J(activation="softplus", sigma_w=1.6, sigma_b=0.5) - 1.28) < 1e-9


@pytest.mark.slow
def test_numba_and_numpy_engines_agree():
    """The compiled engine (loops over the nodes, integrands called by C symbol) and the numpy one
    (arrays) are one rule: meanfield._quadrature_numba against quadrature_rule.quad_levels."""
    from numba import cfunc, njit

    from meanfield import _quadrature_numba as Q
    from meanfield import gaussian as G

    consts = (G.QUAD_STEP, G.QUAD_ES_T[0], G.QUAD_ES_T[1], G.QUAD_TS_T, G.QUAD_ZMAX, G.QUAD_MAX_LEVEL,
              G.QUAD_TOL_BASE_1D, G.QUAD_TOL_REFINED)
    cases = [
        ("tanh2", lambda h: math.tanh(h) ** 2, lambda h: np.tanh(h) ** 2, []),
        ("hinge2", lambda h: max(h - 1.0, 0.0) ** 2, lambda h: np.maximum(h - 1.0, 0.0) ** 2, [1.0]),
        ("sin2", lambda h: math.sin(h) ** 2, lambda h: np.sin(h) ** 2, []),
        ("elu", lambda h: h if h > 0 else math.expm1(h), lambda h: np.where(h > 0, h, np.expm1(h)), [0.0]),
    ]

    @njit
    def by_symbol(which, cuts, K):
        # the way a generated module calls the engine: the integrand named by its C symbol
        if which == 0:
            return Q.one_point(Q.symbol_address("meanfield_test_engine_tanh2"), cuts, K)
        if which == 1:
            return Q.one_point(Q.symbol_address("meanfield_test_engine_hinge2"), cuts, K)
        if which == 2:
            return Q.one_point(Q.symbol_address("meanfield_test_engine_sin2"), cuts, K)
        return Q.one_point(Q.symbol_address("meanfield_test_engine_elu"), cuts, K)

    def batch(f):  # the integrand as the engine calls it: one C call over a batch of nodes
        fj = njit(f)

        def over_nodes(h, out, n):
            for i in range(n):
                out[i] = fj(h[i])
        return cfunc(Q.ONE_POINT_SIGNATURE)(over_nodes)

    compiled = [batch(f) for _, f, _, _ in cases]
    for (name, *_), fc in zip(cases, compiled):  # before any code that names them is compiled
        Q.register(f"meanfield_test_engine_{name}", fc)
    for which, ((name, f, fv, cuts), fc) in enumerate(zip(cases, compiled)):
        c = np.asarray(cuts, dtype=np.float64)
        for K in (1e-4, 0.7, 1e3):
            s = math.sqrt(K)
            sc = G.quadrature_rule.scale_cuts(c, s)
            a = Q.one_point_levels((fc.address,), s, sc, *consts, *G.quad_tables())
            b = G.quad1(fv, s, cuts)
            # without tables the compiled engine computes every node itself
            none = Q.one_point_levels((fc.address,), s, sc, *consts, np.zeros((0, 2)), np.zeros((0, 3)))
            assert a[3] and b[3] and none[3]
            assert abs(a[0] - b[0]) <= 1e-14 * a[1], (K, a, b)
            assert abs(a[0] - none[0]) <= 1e-14 * a[1], (K, a, none)
            assert by_symbol(which, c, K) == a[0]


@pytest.mark.slow
def test_two_point_kinks_away_from_zero():
    """E[Max(u-1,0) Max(v-1,0)] at (K1, K2, K12) = (1, 1, 1/2): mpmath split at u = 1 and v = 1."""
    from meanfield.gaussian import expect2, two_point_cuts

    y = sp.Symbol("y")
    lam = sp.Lambda((x, y), sp.Max(x - 1, 0) * sp.Max(y - 1, 0))
    assert two_point_cuts(lam) == ((1.0,), (1.0,))
    with mp.workdps(25):
        rho = mp.mpf("0.5")
        c = mp.sqrt(1 - rho**2)

        def outer(z1):
            k = (1 - rho * z1) / c
            return (z1 - 1) * mp.npdf(z1) * mp.quad(lambda z2: (rho * z1 + c * z2 - 1) * mp.npdf(z2), [k, mp.inf])

        ref = mp.quad(outer, [1, 2, 4, 8, mp.inf])
    got = float(expect2(numpy_function(lam), 1.0, 1.0, 0.5, two_point_cuts(lam)))
    assert abs(got - float(ref)) < 1e-12 * float(ref)


def _scipy_pair(f, K1, K2, K12, cuts):
    """E[f(u) f(v)] by nested QUADPACK in standard variables (an independent route: adaptive
    Gauss-Kronrod, not the package's exp-sinh engine): u = sqrt(K1) z1, v = m + sd z2 given u,
    each level split at the kinks of f and at the scale-1 points -1, 0, 1 of the activation
    (the outer one also where the conditional mean of v crosses them), on [-12, 12] (the
    Gaussian mass beyond is ~1e-33). At (K, K12) = (1, 0.999999) for Max(x - 1, 0) it agrees
    with the closed-form inner integral under mpmath (0.07533962477952840) to 1e-15."""
    from scipy import integrate

    rho = K12 / math.sqrt(K1 * K2)
    s1, sd = math.sqrt(K1), math.sqrt(K2 * (1 - rho**2))
    marks = (-1.0, 0.0, 1.0, *cuts)
    npdf = lambda z: math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)  # noqa: E731

    def quad(g, points):
        edges = sorted({-12.0, 12.0, *(p for p in points if abs(p) < 12.0)})
        return sum(integrate.quad(g, a, b, limit=200, epsabs=1e-16, epsrel=1e-13)[0]
                   for a, b in zip(edges[:-1], edges[1:]))

    def inner(z1):
        m = rho * math.sqrt(K2) * z1
        return quad(lambda z2: float(f(m + sd * z2)) * npdf(z2), [(c - m) / sd for c in marks])

    # the outer integrand also has structure of width sd where the conditional mean m crosses a mark
    a = rho * math.sqrt(K2)
    crossings = [(c + k * sd) / a for c in marks for k in (-5, -1, 0, 1, 5)] if a != 0 else []
    return quad(lambda z1: float(f(s1 * z1)) * inner(z1) * npdf(z1), [c / s1 for c in marks] + crossings)


PAIR_CASES = [
    (sp.Max(x - 1, 0), lambda t: max(t - 1.0, 0.0), (1.0,)),
    (sp.Abs(x - sp.Rational(1, 2)), lambda t: abs(t - 0.5), (0.5,)),
    ("elu", lambda t: t if t > 0 else math.expm1(t), (0.0,)),
    ("selu", lambda t: LAM * (t if t > 0 else ALPHA * math.expm1(t)), (0.0,)),
    ("hardtanh", lambda t: min(max(t, -1.0), 1.0), (-1.0, 1.0)),
    ("tanh", math.tanh, ()),
]


@pytest.mark.slow
@pytest.mark.parametrize("act, f, cuts", PAIR_CASES, ids=["Max(x-1,0)", "Abs(x-1/2)", "elu", "selu", "hardtanh",
                                                           "tanh"])
def test_compiled_pair_kernel_matches_nested_quadpack(act, f, cuts):
    """K12 after one layer, sigma_w^2 E[phi(u) phi(v)] (sigma_b = 0), from the compiled two-point
    engine (split at the kinks in u and in v) against nested scipy quad, to 1e-10 relative (measured:
    ~1e-15). The earlier fixed compiled rule was off by 2.6e-4 for Max(x - 1, 0), 8.6e-6 for |x - 1/2|,
    1.5e-4 for hard-tanh, and 2.3e-4 for tanh at K = 1e4 (its inner rule was centred at the
    conditional mean, blind to the structure of phi at v = 0)."""
    for K, K12 in ((1.0, 0.5), (2.0, -0.7), (0.3, 0.29), (1.0, 0.999999), (1.0, -0.99), (1e4, 3e3)):
        prof = mf.kernel_profile(activation=act, sigma_w=1.0, sigma_b=0.0, depth=2, K0=K, K12_0=K12, pair=True)
        assert prof.K12[1] == pytest.approx(_scipy_pair(f, K, K, K12, cuts), rel=1e-10, abs=1e-14), (K, K12)
