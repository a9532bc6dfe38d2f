"""Activations: closed forms and quadrature fallbacks against mpmath.

References are written here, independently of the package: each activation
and its derivatives are coded by hand in mpmath, and every expectation is an
mpmath integral in the standardised variable z (h = sqrt(K) z), split at the
kink z = 0. Two-point references integrate, over u, the conditional
expectation of the second factor given u, which for these activations is a
textbook one-dimensional Gaussian integral (written out below and itself
checked against quadrature). Fallback two-point references use the
trapezoid-rule mpmath integral of conftest.py (smooth integrands).

The closed forms are sympy expressions; they are evaluated at exact sympy
inputs with evalf(30), so the tests check the formulas, not float rounding.

Error measure: relative, |got - ref| <= rtol |ref|. Where the exact value is
0 or crosses 0 (E[phi] of odd activations; kernels at rho = 0 or, for ReLU,
rho = -1; chi_Delta of ReLU-like activations, which is 0 in the weak sense)
we bound |got - ref| by a tiny multiple of the quantity's natural size
(Cauchy-Schwarz scale sqrt(E[a(u)^2] E[b(v)^2]), or E|integrand|), i.e. an
absolute tolerance; each such place says so.
"""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
import references as R
from meanfield.gaussian import expect, expect2
from meanfield.symbolic import lambdify
from meanfield.symbols import x

DPS = 25
RTOL_CLOSED = 1e-12
RTOL_QUAD = 1e-10

# K log-spaced in [1e-6, 1e6], as exact rationals
KS = [sp.Rational(10) ** k for k in range(-6, 7)]


def mpf(v):
    """An exact sympy number (or a float) as an mpmath number at the working precision."""
    if isinstance(v, sp.Basic):
        return mp.mpf(str(sp.N(v, 40)))
    if isinstance(v, (np.ndarray, np.generic)):
        return mp.mpf(float(v))
    return mp.mpf(v)


def gauss(f, K, dps=DPS, kinks=()):
    """E[f(h)], h ~ N(0, K), at ``dps`` digits (tests/references: split at z = 0 and at ``kinks``,
    further h where f is not smooth); K may be an exact sympy number."""
    with mp.workdps(dps):
        return R.expect(f, mpf(K), kinks=kinks)


def by_parts(d1, K, dps=40):
    """chi_Delta by Gaussian integration by parts, E[phi'^2 (h^2 - K)] / (2 K^2),
    and its scale E|phi'^2 (h^2 - K)| / (2 K^2) (mpmath, extra digits: the
    integrand cancels to O(K^2) of its size at small K)."""
    with mp.workdps(dps):
        Km = mpf(K)
        val = gauss(lambda h: d1(h) ** 2 * (h * h - Km), K, dps=dps) / (2 * Km * Km)
        scale = gauss(lambda h: abs(d1(h) ** 2 * (h * h - Km)), K, dps=dps) / (2 * Km * Km)
        return val, scale


def close(got, ref, rtol, atol=0):
    return abs(mpf(got) - ref) <= rtol * abs(ref) + atol


# ---------------------------------------------------------------------------
# Hand-written activations: phi, phi', phi'', phi''' (mpmath), and the
# conditional means G(a, b) = E_z[psi(a + b z)], z ~ N(0, 1), b > 0, for psi = phi, phi'.
# ---------------------------------------------------------------------------
def scale_invariant(ap, am):
    """a_+ h Theta(h) + a_- h Theta(-h); slopes as strings, read at the working precision."""
    A = lambda: mp.mpf(ap)  # noqa: E731
    B = lambda: mp.mpf(am)  # noqa: E731

    def cond(a, b):  # E[am (a+bz) + d relu(a+bz)] = am a + d (a Phi(a/b) + b phi(a/b)), d = ap - am
        return B() * a + (A() - B()) * (a * R.ncdf(a / b) + b * R.npdf(a / b))

    def dcond(a, b):  # E[am + d Theta(a+bz)] = am + d Phi(a/b)
        return B() + (A() - B()) * R.ncdf(a / b)

    return dict(
        phi=lambda h: A() * h if h >= 0 else B() * h,
        d1=lambda h: A() if h >= 0 else B(),
        d2=lambda h: mp.mpf(0),
        d3=lambda h: mp.mpf(0),
        cond=cond, dcond=dcond, smooth=False)


def erf_activation():
    c = lambda: 2 / mp.sqrt(mp.pi)  # noqa: E731  (at the working precision)
    return dict(
        phi=mp.erf,
        d1=lambda h: c() * mp.exp(-h * h),
        d2=lambda h: -2 * h * c() * mp.exp(-h * h),
        d3=lambda h: (4 * h * h - 2) * c() * mp.exp(-h * h),
        # E[erf(a + bz)] = erf(a / sqrt(1 + 2b^2)), E[c exp(-(a+bz)^2)] = c exp(-a^2/(1+2b^2)) / sqrt(1+2b^2)
        cond=lambda a, b: R.erf_cond(a, b)[0],
        dcond=lambda a, b: R.erf_cond(a, b)[1],
        smooth=True)


def gelu_activation():
    return dict(
        phi=R.gelu, d1=R.dgelu, d2=R.d2gelu, d3=R.d3gelu,
        # E[(a+bz) Phi(a+bz)] and E[Phi(a+bz) + (a+bz) phi(a+bz)], z ~ N(0, 1)
        cond=lambda a, b: R.gelu_cond(a, b)[0], dcond=lambda a, b: R.gelu_cond(a, b)[1],
        smooth=True)


CLOSED = {
    "relu": (mf.activation("relu"), scale_invariant("1", "0")),
    "leaky_relu(0.2)": (mf.activation("leaky_relu", negative_slope=0.2), scale_invariant("1", "0.2")),
    "linear": (mf.activation("linear"), scale_invariant("1", "1")),
    "abs": (mf.activation("abs"), scale_invariant("1", "-1")),
    "erf": (mf.activation("erf"), erf_activation()),
    "gelu": (mf.activation("gelu"), gelu_activation()),
}


@pytest.mark.parametrize("name", list(CLOSED))
def test_registry_definitions_match_hand_written(name):
    act, ref = CLOSED[name]
    assert act.has_closed_form
    d1, d2, d3 = (sp.diff(act.expr, x, n) for n in (1, 2, 3))
    for h in ("-1.7", "-0.3", "0.4", "2.5"):
        with mp.workdps(30):
            hv = sp.Float(h, 30)
            assert abs(mpf(act.expr.subs(x, hv)) - ref["phi"](mp.mpf(h))) < 1e-25
            assert abs(mpf(d1.subs(x, hv)) - ref["d1"](mp.mpf(h))) < 1e-25
            if ref["smooth"]:
                assert abs(mpf(d2.subs(x, hv)) - ref["d2"](mp.mpf(h))) < 1e-25
                assert abs(mpf(d3.subs(x, hv)) - ref["d3"](mp.mpf(h))) < 1e-25


@pytest.mark.slow
def test_conditional_means_against_quadrature():
    # the textbook one-dimensional formulas the two-point references rest on
    for name, (_, ref) in CLOSED.items():
        for a, b in (("0.3", "0.01"), ("-1.2", "0.7"), ("2.0", "3.0"), ("-0.5", "40")):
            a, b = mp.mpf(a), mp.mpf(b)
            with mp.workdps(DPS):
                kink = [-a / b]  # phi(a + b z) has its kink (ReLU-like) at z = -a/b
                got = ref["cond"](a, b)
                want = gauss(lambda z: ref["phi"](a + b * z), 1, kinks=kink)
                assert abs(got - want) <= 1e-20 * (abs(want) + abs(a) + b), (name, a, b)
                got = ref["dcond"](a, b)
                want = gauss(lambda z: ref["d1"](a + b * z), 1, kinks=kink)
                assert abs(got - want) <= 1e-20 * (abs(want) + 1), (name, a, b)


def test_reference_integrator_is_accurate():
    for k in ("1e-6", "1", "1e6"):
        with mp.workdps(DPS):
            K = mp.mpf(k)
            assert abs(gauss(lambda h: h * h, K) / K - 1) < 1e-22
            assert abs(gauss(abs, K) / mp.sqrt(2 * K / mp.pi) - 1) < 1e-22
            assert abs(gauss(lambda h: mp.exp(-h * h), K) * mp.sqrt(1 + 2 * K) - 1) < 1e-22


# ---------------------------------------------------------------------------
# One-point closed forms over K in [1e-6, 1e6].
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLOSED))
def test_closed_one_point_moments(name):
    act, ref = CLOSED[name]
    for K in KS:
        e2 = gauss(lambda h: ref["phi"](h) ** 2, K)
        assert close(act.second_moment(K).evalf(30), e2, RTOL_CLOSED), (name, K)
        ed2 = gauss(lambda h: ref["d1"](h) ** 2, K)
        assert close(act.derivative_second_moment(K).evalf(30), ed2, RTOL_CLOSED), (name, K)
        e1 = gauss(ref["phi"], K)
        # E[phi] = 0 for linear and erf: absolute, against the scale sqrt(E[phi^2])
        assert close(act.mean(K).evalf(30), e1, RTOL_CLOSED, atol=1e-20 * mp.sqrt(e2)), (name, K)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["erf", "gelu"])
def test_closed_chi_delta_smooth(name):
    # weak form d/dK E[phi'^2] (the closed form) = pointwise E[phi''^2 + phi' phi''']
    # = integration by parts E[phi'^2 (h^2 - K)] / (2 K^2)
    act, ref = CLOSED[name]
    for K in KS:
        pointwise = gauss(lambda h: ref["d2"](h) ** 2 + ref["d1"](h) * ref["d3"](h), K)
        weak, _ = by_parts(ref["d1"], K)
        got = act.chi_delta_moment(K).evalf(30)
        # (chi_Delta of GELU changes sign between K = 1 and 10, not at these K)
        assert close(got, pointwise, RTOL_CLOSED), (name, K)
        assert close(weak, pointwise, 1e-16), (name, K)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu", "leaky_relu(0.2)", "linear", "abs"])
def test_closed_chi_delta_scale_invariant_is_zero_weakly(name):
    # pointwise phi''^2 + phi' phi''' contains delta(h)^2; in the weak sense
    # (Price: 1/2 E[(phi'^2)'']) it is E[phi'^2 (h^2 - K)] / (2 K^2) = 0.
    # The value is 0: absolute, against E[|phi'^2 (h^2 - K)|] / (2 K^2).
    act, ref = CLOSED[name]
    assert act.chi_delta_moment(sp.Symbol("K")) == 0
    for K in KS:
        weak, scale = by_parts(ref["d1"], K)
        assert abs(weak) < 1e-30 * scale, (name, K)
        assert act.chi_delta_moment(K) == 0


# ---------------------------------------------------------------------------
# Two-point closed forms, correlations across [-1, 1] including the ends.
# ---------------------------------------------------------------------------
PAIRS = [(sp.Rational(1, 10**6),) * 2, (sp.Integer(1),) * 2, (sp.Integer(10**6),) * 2,
         (sp.Rational(1, 2), sp.Integer(2)), (sp.Rational(1, 1000), sp.Integer(1000))]
RHOS = [sp.Integer(-1), sp.Rational(-7, 10), sp.Integer(0), sp.Rational(2, 5), sp.Rational(19, 20), sp.Integer(1)]


def two_point_reference(a, b, cond, K1, K2, rho):
    """E[a(u) b(v)] for Var u = K1, Var v = K2, corr rho, via E_u[a(u) E[b(v) | u]]."""
    with mp.workdps(DPS):
        k1, k2, r = mpf(K1), mpf(K2), mpf(rho)
        s1, s2 = mp.sqrt(k1), mp.sqrt(k2)
        if abs(r) == 1:
            return gauss(lambda h: a(h) * b(r * s2 / s1 * h), K1)
        c = mp.sqrt(1 - r * r)
        return gauss(lambda h: a(h) * cond(r * s2 / s1 * h, s2 * c), K1)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLOSED))
def test_closed_two_point_kernels(name):
    act, ref = CLOSED[name]
    for K1, K2 in PAIRS:
        scale_k = mp.sqrt(gauss(lambda h: ref["phi"](h) ** 2, K1) * gauss(lambda h: ref["phi"](h) ** 2, K2))
        scale_d = mp.sqrt(gauss(lambda h: ref["d1"](h) ** 2, K1) * gauss(lambda h: ref["d1"](h) ** 2, K2))
        for rho in RHOS:
            K12 = rho * sp.sqrt(K1 * K2)
            # values at rho = 0 (odd phi) or rho = -1 (ReLU) are 0: absolute, 1e-20 of the
            # Cauchy-Schwarz scale
            want = two_point_reference(ref["phi"], ref["phi"], ref["cond"], K1, K2, rho)
            got = act.kernel(K1, K2, K12).evalf(30)
            assert close(got, want, RTOL_CLOSED, atol=1e-20 * scale_k), (name, K1, K2, rho)
            want = two_point_reference(ref["d1"], ref["d1"], ref["dcond"], K1, K2, rho)
            got = act.derivative_kernel(K1, K2, K12).evalf(30)
            assert close(got, want, RTOL_CLOSED, atol=1e-20 * scale_d), (name, K1, K2, rho)


@pytest.mark.parametrize("name", list(CLOSED))
def test_closed_two_point_reduces_to_one_point(name):
    # the two-point forms take arcsin as an arctangent of the exact gap (exact at large K), which sympy
    # does not simplify into the one-point arcsin: compare at K from 1e-6 to 1e6, to 40 digits
    act, _ = CLOSED[name]
    K = sp.Symbol("K", positive=True)
    for two, one in ((act.kernel(K, K, K), act.second_moment(K)),
                     (act.derivative_kernel(K, K, K), act.derivative_second_moment(K))):
        for k in (sp.Rational(1, 10**6), sp.Rational(3, 7), sp.Integer(5), sp.Integer(10**6)):
            a, b = sp.N(two.subs(K, k), 50), sp.N(one.subs(K, k), 50)
            assert abs(a - b) <= 1e-40 * abs(b), (k, a, b)


# ---------------------------------------------------------------------------
# Quadrature fallbacks: tanh, SiLU, softplus and a user expression.
# ---------------------------------------------------------------------------
t = sp.Symbol("t")
FALLBACK = {
    "tanh": (mf.activation("tanh"), dict(
        phi=mp.tanh, d1=lambda h: mp.sech(h) ** 2,
        d2=lambda h: -2 * mp.tanh(h) * mp.sech(h) ** 2,
        d3=lambda h: (4 * mp.tanh(h) ** 2 - 2 * mp.sech(h) ** 2) * mp.sech(h) ** 2)),
    "silu": (mf.activation("silu"), dict(
        phi=lambda h: h / (1 + mp.exp(-h)),
        d1=lambda h: (lambda s: s + h * s * (1 - s))(1 / (1 + mp.exp(-h))),
        d2=lambda h: (lambda s: 2 * s * (1 - s) + h * s * (1 - s) * (1 - 2 * s))(1 / (1 + mp.exp(-h))),
        d3=lambda h: (lambda s: 3 * s * (1 - s) * (1 - 2 * s)
                      + h * s * (1 - s) * (1 - 6 * s + 6 * s * s))(1 / (1 + mp.exp(-h))))),
    "softplus": (mf.activation("softplus"), dict(
        phi=lambda h: mp.log1p(mp.exp(h)) if h < 0 else h + mp.log1p(mp.exp(-h)),
        d1=lambda h: 1 / (1 + mp.exp(-h)),
        d2=lambda h: (lambda s: s * (1 - s))(1 / (1 + mp.exp(-h))),
        d3=lambda h: (lambda s: s * (1 - s) * (1 - 2 * s))(1 / (1 + mp.exp(-h))))),
    "sin(t)+t/2": (mf.activation(sp.sin(t) + t / 2), dict(
        phi=lambda h: mp.sin(h) + h / 2, d1=lambda h: mp.cos(h) + mp.mpf(1) / 2,
        d2=lambda h: -mp.sin(h), d3=lambda h: -mp.cos(h))),
}
KS_FALLBACK = np.logspace(-6, 6, 9)
k_ = sp.Symbol("k")


def sin_exact(K):
    """Exact one-point moments of phi = sin(h) + h/2 (mpmath): E phi^2, E phi'^2, E phi, chi_Delta."""
    K = mp.mpf(K)
    return (-mp.expm1(-2 * K) / 2 + K * mp.exp(-K / 2) + K / 4,
            (1 + mp.exp(-2 * K)) / 2 + mp.exp(-K / 2) + mp.mpf(1) / 4,
            mp.mpf(0),
            -mp.exp(-2 * K) - mp.exp(-K / 2) / 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FALLBACK))
def test_fallback_one_point(name):
    act, ref = FALLBACK[name]
    assert not act.has_closed_form
    f = lambdify([k_], [act.second_moment(k_), act.derivative_second_moment(k_), act.mean(k_),
                        act.chi_delta_moment(k_)])
    got = f(KS_FALLBACK)
    for i, K in enumerate(KS_FALLBACK):
        if name.startswith("sin"):
            e2, ed2, e1, cd = sin_exact(K)
            cd_scale = gauss(lambda h: abs(ref["d2"](h) ** 2) + abs(ref["d1"](h) * ref["d3"](h)), K) if K < 1e3 else 2
        else:
            e2 = gauss(lambda h: ref["phi"](h) ** 2, K)
            ed2 = gauss(lambda h: ref["d1"](h) ** 2, K)
            e1 = gauss(ref["phi"], K)
            cd = gauss(lambda h: ref["d2"](h) ** 2 + ref["d1"](h) * ref["d3"](h), K)
            cd_scale = gauss(lambda h: abs(ref["d2"](h) ** 2) + abs(ref["d1"](h) * ref["d3"](h)), K)
        assert close(got[0][i], e2, RTOL_QUAD), (name, K)
        assert close(got[1][i], ed2, RTOL_QUAD), (name, K)
        # E[phi] = 0 for tanh and sin: absolute, 1e-15 of sqrt(E[phi^2])
        assert close(got[2][i], e1, RTOL_QUAD, atol=1e-15 * mp.sqrt(e2)), (name, K)
        # chi_Delta: relative up to K = 1e4; beyond, the pointwise integrand
        # integrates to ~0 at leading order (|value| ~ K^-3/2 E|integrand| ~ K^-1/2),
        # and for sin the value itself is ~exp(-K/2): the error is measured against
        # E|phi''^2| + E|phi' phi'''| (absolute), where float64 quadrature lives.
        if K <= 1e4 and not (name.startswith("sin") and K > 10):
            assert close(got[3][i], cd, RTOL_QUAD), (name, K)
        assert close(got[3][i], cd, 0, atol=1e-13 * cd_scale), (name, K)
    # the activation's own numpy function through meanfield.gaussian.expect
    direct = expect(lambda h: act.numpy()(h) ** 2, KS_FALLBACK)
    np.testing.assert_allclose(direct, got[0], rtol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["silu", "softplus"])
@pytest.mark.parametrize("K0", [1e3, 1e5])
def test_compiled_recursion_at_large_K(name, K0):
    # the generated numba module rewrites exp/log forms so float64 does not overflow where
    # the value is finite (stable_forms.stable_form); SiLU's phi'^2 once left exp(800) * exp(-1600)
    # = inf * 0 inside a square and returned NaN from K ~ 1e3 on. Reference: mpmath, 30 digits.
    act, ref = FALLBACK[name]
    sw, sb = 1.3, 0.2
    p = mf.kernel_profile(name, depth=2, sigma_w=sw, sigma_b=sb, K0=K0)
    K2 = sw**2 * gauss(lambda h: ref["phi"](h) ** 2, K0) + sb**2
    chi1 = sw**2 * gauss(lambda h: ref["d1"](h) ** 2, K0)
    assert close(p.K[1], K2, 1e-12), (p.K[1], K2)
    assert close(p.chi_J[0], chi1, 1e-12), (p.chi_J[0], chi1)


def sin_exact_two_point(K1, K2, K12):
    K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
    e = mp.exp(-(K1 + K2) / 2)
    kernel = e * mp.sinh(K12) + K12 * (mp.exp(-K1 / 2) + mp.exp(-K2 / 2)) / 2 + K12 / 4
    dkernel = e * mp.cosh(K12) + (mp.exp(-K1 / 2) + mp.exp(-K2 / 2)) / 2 + mp.mpf(1) / 4
    return kernel, dkernel


FALLBACK_2PT = [(0.5, 2.0, -1.0), (0.5, 2.0, -0.6), (0.5, 2.0, 0.0), (0.5, 2.0, 0.8), (0.5, 2.0, 1.0),
                (1.0, 1.0, 0.3), (4.0, 4.0, 0.95)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FALLBACK))
def test_fallback_two_point(name, mp_smooth2):
    act, ref = FALLBACK[name]
    K1s, K2s, K12s = sp.symbols("K1s K2s K12s")
    f = lambdify([K1s, K2s, K12s], [act.kernel(K1s, K2s, K12s), act.derivative_kernel(K1s, K2s, K12s)])
    for K1, K2, rho in FALLBACK_2PT:
        K12 = rho * np.sqrt(K1 * K2)
        kernel, dkernel = f(K1, K2, K12)
        if name.startswith("sin"):
            want_k, want_d = sin_exact_two_point(K1, K2, K12)
        elif abs(rho) == 1:
            want_k = gauss(lambda h: ref["phi"](h) * ref["phi"](rho * mp.sqrt(K2 / K1) * h), K1)
            want_d = gauss(lambda h: ref["d1"](h) * ref["d1"](rho * mp.sqrt(K2 / K1) * h), K1)
        elif rho == 0:
            want_k = gauss(ref["phi"], K1) * gauss(ref["phi"], K2)
            want_d = gauss(ref["d1"], K1) * gauss(ref["d1"], K2)
        else:
            want_k = mp_smooth2(ref["phi"], ref["phi"], K1, K2, K12)
            want_d = mp_smooth2(ref["d1"], ref["d1"], K1, K2, K12)
        # the kernel of an odd phi is 0 at rho = 0: absolute, 1e-14 of sqrt(E phi(u)^2 E phi(v)^2)
        scale = mp.sqrt(gauss(lambda h: ref["phi"](h) ** 2, K1) * gauss(lambda h: ref["phi"](h) ** 2, K2))
        assert close(kernel, want_k, RTOL_QUAD, atol=1e-14 * scale), (name, K1, K2, rho)
        assert close(dkernel, want_d, RTOL_QUAD), (name, K1, K2, rho)
    # expect2 directly, with the activation's numpy function
    phi = act.numpy()
    direct = expect2(lambda u, v: phi(u) * phi(v), 0.5, 2.0, 0.8)
    assert abs(direct - f(0.5, 2.0, 0.8)[0]) < 1e-14 * abs(direct)


_C, _A = mp.sqrt(2 / mp.pi), mp.mpf("0.044715")


@pytest.mark.parametrize("name, d1", [
    ("silu", lambda h: mp.mpf(1) / (1 + mp.exp(-h)) * (1 + h / (1 + mp.exp(h)))),
    ("softplus", lambda h: mp.mpf(1) / (1 + mp.exp(-h))),
    ("gelu_tanh", lambda h: (1 + mp.tanh(_C * (h + _A * h**3))) / 2
     + h / 2 * mp.sech(_C * (h + _A * h**3)) ** 2 * _C * (1 + 3 * _A * h**2)),
])
@pytest.mark.slow
def test_step_like_derivative_moment_at_huge_K(name, d1):
    # E[phi'(h)^2] -> 1/2 + O(K^-1/2) for ReLU-like phi: at K = 1e12..1e22 the structure at |h| ~ 1 is
    # 1e-6..1e-11 of the value and the exp-sinh rule from h = 0 spaces its nodes by ~2x there: the
    # quadrature passed its error test with errors of 8e-14 (SiLU, K = 1e12), 2e-13 (SiLU, 1e15) and
    # 1.3e-13 (GELU-tanh, 1e20). Reference: 1/2 plus the localised integral of phi'^2 - 1{h > 0}
    # against the N(0, K) density, in h (30-digit mpmath).
    with mp.workdps(30):
        for K0 in (1e6, 1e12, 3.16e14, 1e15, 1e18, 1e20, 1e22):
            K = mp.mpf(K0)
            g = lambda h: (d1(h) ** 2 - (1 if h > 0 else 0)) * mp.exp(-h * h / (2 * K))  # noqa: E731
            ref = mp.mpf(1) / 2 + mp.quad(g, [-mp.inf, -20, -5, -1, 0, 1, 5, 20, mp.inf]) / mp.sqrt(2 * mp.pi * K)
            p = mf.kernel_profile(name, depth=2, sigma_w=1.0, sigma_b=0.0, K0=K0)
            assert abs(p.chi_J[0] - ref) <= 2e-15 * ref, (K0, p.chi_J[0], ref)
