"""ELU, SELU, hard-tanh: closed-form Gaussian moments against mpmath quadrature of the definitions."""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
import references as R


def _gauss(f, K):
    """E[f(h)], h ~ N(0, K), split at the kinks h = 0, +-1 (hard-tanh's corners)."""
    return R.expect(f, K, kinks=(-1, 1))


# the definitions, written out independently of the registry (torch's formulas)
mp.mp.dps = 30
ALPHA, LAM = mp.mpf("1.6732632423543772848170429916717"), mp.mpf("1.0507009873554804934193349852946")
DEFS = {
    "elu": (lambda v: v if v > 0 else mp.expm1(v), lambda v: 1 if v > 0 else mp.exp(v)),
    "selu": (lambda v: LAM * (v if v > 0 else ALPHA * mp.expm1(v)), lambda v: LAM * (1 if v > 0 else ALPHA * mp.exp(v))),
    "hardtanh": (lambda v: max(-1, min(1, v)), lambda v: 1 if abs(v) < 1 else 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEFS))
@pytest.mark.parametrize("K", [1e-6, 1e-4, 0.05, 0.7, 1.0, 3.0, 20.0, 200.0, 5000.0])
def test_closed_forms_match_mpmath(name, K):
    mp.mp.dps = 30
    f, df = DEFS[name]
    phi = mf.activation(name)
    Kr = sp.nsimplify(K)
    for got, ref in ((phi.second_moment(Kr), _gauss(lambda v: f(v) ** 2, Kr)),
                     (phi.derivative_second_moment(Kr), _gauss(lambda v: df(v) ** 2, Kr)),
                     (phi.mean(Kr), _gauss(f, Kr))):
        # relative where the moment is small (the series branch below K = 1e-3), else absolute
        assert abs(sp.N(got, 25) - ref) <= mp.mpf("1e-18") * abs(ref) + mp.mpf("1e-30")


@pytest.mark.slow
def test_no_overflow_or_cancellation_in_float64():
    # the compiled recursion at tiny and huge K: finite, and K -> inf (not NaN) past the overflow of e^{2K}
    for name in ("elu", "selu"):
        assert mf.fixed_point(name, 3.0, 0.5) == np.inf
        cp = mf.critical_point("elu").points
        assert len(cp) == 1 and cp[0].K_star == 0.0 and len(cp[0].fixed_points) == 1


@pytest.mark.slow
def test_elu_alpha_and_selu_fixed_point():
    mp.mp.dps = 30
    phi = mf.activation("elu", alpha=0.5)
    ref = _gauss(lambda v: v ** 2 if v > 0 else (0.5 * mp.expm1(v)) ** 2, 2)
    assert abs(sp.N(phi.second_moment(2), 25) - ref) < 1e-20
    # SELU's self-normalising fixed point (Klambauer et al. 2017): mean 0, variance 1 at K = 1
    selu = mf.activation("selu")
    assert abs(sp.N(selu.mean(1), 25)) < 1e-20 and abs(sp.N(selu.second_moment(1), 25) - 1) < 1e-20


@pytest.mark.slow
@pytest.mark.parametrize("name", ["elu", "selu", "hardtanh"])
def test_two_point_kernel_by_quadrature(name):
    # no closed form: the kernel is the package's 2-d quadrature; reference: nested adaptive
    # quadrature (scipy, split at every kink) of the definition
    from scipy.integrate import quad

    f = {k: (lambda g: (lambda v: float(g(v))))(v[0]) for k, v in DEFS.items()}[name]
    K, K12 = 0.7, 0.35
    s, rho = np.sqrt(K), K12 / K
    c = np.sqrt(1 - rho**2)
    npdf = lambda z: np.exp(-z * z / 2) / np.sqrt(2 * np.pi)  # noqa: E731

    def inner(z1):
        kinks = sorted({-rho * z1 / c, (1 / s - rho * z1) / c, (-1 / s - rho * z1) / c})
        pieces = [-np.inf, *kinks, np.inf]
        tot = sum(quad(lambda z2: f(s * (rho * z1 + c * z2)) * npdf(z2), a, b, epsabs=1e-15, epsrel=1e-13)[0]
                  for a, b in zip(pieces[:-1], pieces[1:]))
        return f(s * z1) * tot

    pieces = [-np.inf, -1 / s, 0, 1 / s, np.inf]
    ref = sum(quad(lambda z1: inner(z1) * npdf(z1), a, b, epsabs=1e-14, epsrel=1e-12)[0]
              for a, b in zip(pieces[:-1], pieces[1:]))
    vals = mf.recursion(name).evaluate(K=K, K12=K12, sigma_w=1.0, sigma_b=0.0)
    assert abs(float(vals.kernel12) - ref) < 1e-9 * abs(ref), (float(vals.kernel12), ref)
    # the compiled nested engine (split at the kinks in u and in v) gives the same kernel
    prof = mf.kernel_profile(activation=name, sigma_w=1.0, sigma_b=0.0, depth=2, K0=K, K12_0=K12, pair=True)
    assert abs(prof.K12[1] - ref) < 1e-9 * abs(ref), (prof.K12[1], ref)


def test_gelu_tanh_is_torch_form():
    phi = mf.activation("gelu_tanh")
    x = sp.Symbol("x")
    v = float(phi.expr.subs(phi.expr.free_symbols.pop(), 0.8))
    ref = 0.5 * 0.8 * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (0.8 + 0.044715 * 0.8**3)))
    assert abs(v - float(ref)) < 1e-15


@pytest.mark.slow
@pytest.mark.parametrize("name", ["elu", "selu"])
def test_compiled_moments_at_small_K_in_float64(name):
    # e^{2K} Phi(-2s) - 2 e^{K/2} Phi(-s) + 1/2 cancels to O(K): evaluated in float64 it was
    # 1.7e-14 off at K = 3e-3 and 4.9e-15 at 0.02 (the series then started only below 1e-3)
    mp.mp.dps = 30
    f, df = DEFS[name]
    for K in (1e-3, 3e-3, 0.02, 0.1, 0.19, 0.21, 0.5):
        p = mf.kernel_profile(name, depth=2, sigma_w=1.0, sigma_b=0.0, K0=K)
        ref_K = _gauss(lambda v: f(v) ** 2, K)
        ref_chi = _gauss(lambda v: df(v) ** 2, K)
        assert abs(p.K[1] - ref_K) <= 1e-15 * ref_K, (K, p.K[1], ref_K)
        assert abs(p.chi_J[0] - ref_chi) <= 1e-15 * ref_chi, K
