"""Two-point moments E[f(u) g(v)] over whole arrays (meanfield/_gram_quadrature.py) and the Gram
matrices of activations without a closed two-point form.

References are computed here with mpmath at 30 digits and its own quadrature, never with package
code: one-dimensional integrals where the two-point moment reduces to one (rho = 0: E f E g;
rho = +-1: E[f(s1 z) g(+-s2 z)]; |rho| within 1e-9 of 1: that plus the first-order term
(rho -+ 1) s1 s2 E[f'(s1 z) g'(+-s2 z)] from Price's theorem, the second order being below 1e-17),
and, marked slow, the nested two-dimensional integral at a generic correlation.
"""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield._gram_quadrature import ProductMoment
from meanfield.gaussian import expect2, numpy_function, pieces
from meanfield.symbols import x as _X

mp.mp.dps = 30
_x = sp.Symbol("x")


# mpmath forms of the functions (f, f') and sympy forms for the package
def _sech2(u):
    return 1 / mp.cosh(u) ** 2


def _sig(u):
    return 1 / (1 + mp.exp(-u))


MP = {
    "tanh": (mp.tanh, _sech2),
    "dtanh": (_sech2, lambda u: -2 * _sech2(u) * mp.tanh(u)),
    "silu": (lambda u: u * _sig(u), lambda u: _sig(u) * (1 + u * (1 - _sig(u)))),
    "dsilu": (lambda u: _sig(u) * (1 + u * (1 - _sig(u))),
              lambda u: _sig(u) * (1 - _sig(u)) * (2 + u * (1 - 2 * _sig(u)))),
}
SP = {"tanh": sp.tanh(_x), "dtanh": 1 - sp.tanh(_x) ** 2, "silu": _x / (1 + sp.exp(-_x)),
      "dsilu": sp.diff(_x / (1 + sp.exp(-_x)), _x)}


PARITY = {"tanh": 1, "dtanh": 0, "silu": None, "dsilu": None}


def _moment(name):
    f = numpy_function(sp.Lambda(_x, SP[name]))
    return ProductMoment(f, f, (), (), same=True, parity=(PARITY[name], PARITY[name]))


def _gauss(h):
    """E[h(z)], z ~ N(0, 1), by mpmath quadrature split at 0 and +-1."""
    return mp.quad(lambda z: h(z) * mp.exp(-z * z / 2), [-mp.inf, -1, 0, 1, mp.inf]) / mp.sqrt(2 * mp.pi)


def _ref_1d(name, K1, K2, rho):
    """E[f(u) f(v)] for rho = 0, +-1, or |rho| -> 1 to first order (see the module docstring)."""
    f, df = MP[name]
    s1, s2 = mp.sqrt(mp.mpf(K1)), mp.sqrt(mp.mpf(K2))
    rho = mp.mpf(rho)
    if rho == 0:
        return _gauss(lambda z: f(s1 * z)) * _gauss(lambda z: f(s2 * z))
    sgn = 1 if rho > 0 else -1
    base = _gauss(lambda z: f(s1 * z) * f(sgn * s2 * z))
    slope = _gauss(lambda z: df(s1 * z) * df(sgn * s2 * z)) * s1 * s2    # d/d rho at rho = +-1
    return base + (rho - sgn) * slope


def _check(name, K1, K2, rho, ref, tol):
    K12 = rho * np.sqrt(K1 * K2)
    E = _moment(name)
    v = E(np.array([K1]), np.array([K2]), np.array([K12]))[0]
    # the Gram-matrix path (K1 a column, K2 a row: what kernels calls) on the same pair
    vm = E(np.array([[K1]]), np.array([[K2]]), np.array([[K12]]))[0, 0]
    _check_value(name, K1, K2, rho, ref, tol, vm)
    _check_value(name, K1, K2, rho, ref, tol, v)


def _check_value(name, K1, K2, rho, ref, tol, v):
    scale = float(mp.sqrt(_gauss(lambda z: MP[name][0](mp.sqrt(K1) * z) ** 2)
                          * _gauss(lambda z: MP[name][0](mp.sqrt(K2) * z) ** 2)))
    err = abs(v - float(ref))
    assert np.isfinite(v)
    assert err <= tol * max(abs(float(ref)), 1e-3 * scale), (name, K1, K2, rho, v, float(ref), err)


# rho = 1 - 1e-12 is as close to 1 as float64 keeps the correlation relative error small; the
# expansion's neglected term is (1e-12)^2 K1 K2 E[f'' g''] < 1e-17
@pytest.mark.parametrize("name", ["tanh", "dtanh", "silu", "dsilu"])
@pytest.mark.parametrize("K1, K2, rho", [
    (0.7, 2.3, 0.0),                 # independent
    (0.5, 4.0, 1.0),                 # exactly parallel, different norms
    (0.5, 4.0, -1.0),                # exactly antiparallel
    (1.3, 2.0, 1.0 - 1e-12),         # near-parallel
    (0.5, 4.0, -1.0 + 1e-9),         # near-antiparallel
    (1e-3, 50.0, 1.0 - 1e-12),       # very different norms
    (1e3, 800.0, 0.0),               # large K (deep in the chaotic phase)
])
def test_against_mpmath_1d_references(name, K1, K2, rho):
    _check(name, K1, K2, rho, _ref_1d(name, K1, K2, rho), 1e-12)


@pytest.mark.parametrize("name", ["tanh", "dtanh", "silu", "dsilu"])
def test_large_K_near_parallel(name):
    # step-like or kink-like integrands, |rho| -> 1: the series does not settle these; the conditional rule
    # (SiLU: phi and phi' are analytic) or the nested engine (tanh at K = 1e3: sigma = 0, its own path) does
    _check(name, 1e3, 800.0, 1.0 - 1e-12, _ref_1d(name, 1e3, 800.0, 1.0 - 1e-12), 1e-12)


@pytest.mark.parametrize("name", ["silu", "dsilu"])
def test_conditional_rule_against_nested_engine(name):
    """The entries the series leaves at large K (1 - rho = 1e-4 .. 1e-8, sigma = 0.01 .. 4, and rho ~ 0.92,
    sigma ~ 5.5), by the conditional rule, against the package's nested exp-sinh engine (an independent
    algorithm)."""
    # and the pairs of the benchmark's SiLU network at depth ~30: K ~ 100-250, rho ~ 0.92 (sigma ~ 5.5)
    K1, K2 = np.array([300.0, 1e3, 150.0, 2e3, 133.9, 213.5]), np.array([250.0, 1e3, 190.0, 1.5e3, 111.6, 130.4])
    rho = np.array([1 - 1e-5, 1 - 1e-8, 1 - 1e-4, 1 - 1e-6, 1 - 0.0896, 1 - 0.0723])
    K12 = rho * np.sqrt(K1 * K2)
    pm = _moment(name)
    out = np.full(6, np.nan)
    left = pm._conditional(np.arange(6), K1, K2, K12, out)
    assert left.size == 0
    f = numpy_function(sp.Lambda(_x, SP[name]))
    ref = expect2(lambda u, v: f(u) * f(v), K1, K2, K12)
    scale = np.sqrt(pm(K1, K1, K1) * pm(K2, K2, K2))
    assert np.all(np.abs(out - ref) <= 1e-12 * scale), (out, ref, (out - ref) / scale)
    # the full path (the series settles some of these at its higher levels) agrees
    np.testing.assert_allclose(pm(K1, K2, K12), out, rtol=1e-13)


def _ref_2d(name, K1, K2, rho):
    """E[f(u) f(v)] by nested mpmath quadrature: u = s1 z1, v | z1 ~ N(s2 rho z1, s2^2 (1 - rho^2))."""
    f = MP[name][0]
    mp.mp.dps = 20   # the nested integral at 30 digits takes minutes; 20 digits is ~1e-19
    try:
        s1, s2, rho = mp.sqrt(mp.mpf(K1)), mp.sqrt(mp.mpf(K2)), mp.mpf(rho)
        sd = s2 * mp.sqrt((1 - rho) * (1 + rho))

        def inner(z1):
            m = s2 * rho * z1
            return mp.quad(lambda z: mp.exp(-z * z / 2) * f(m + sd * z), [-mp.inf, -m / sd, mp.inf])

        val = mp.quad(lambda z: mp.exp(-z * z / 2) * f(s1 * z) * inner(z), [-mp.inf, 0, mp.inf])
        return val / (2 * mp.pi)
    finally:
        mp.mp.dps = 30


@pytest.mark.slow
@pytest.mark.parametrize("name, K1, K2, rho", [("tanh", 0.7, 2.3, 0.4), ("dsilu", 3.0, 0.4, -0.7)])
def test_against_mpmath_2d(name, K1, K2, rho):
    # about 2 minutes each (the nested mpmath integral)
    _check(name, K1, K2, rho, _ref_2d(name, K1, K2, rho), 1e-12)


@pytest.mark.parametrize("name", ["tanh", "dtanh", "silu", "dsilu"])
def test_hermite_coefficients_against_mpmath(name):
    """a_k(K) = E[f(sqrt(K) z) He_k(z)] / sqrt(k!) from both rules (the trapezoid in z for K <= 16, the
    exp-sinh rule above; the usable orders only) against mpmath at 30 digits, k <= 32."""
    from meanfield._gram_quadrature import _Coefficients

    f = numpy_function(sp.Lambda(_x, SP[name]))
    K = np.array([1e-3, 0.8, 15.0, 1e3])
    c = _Coefficients(f, np.zeros(0), K, 32, 1.0 / 64)
    assert np.all(c.usable[:3] == 32)          # the smooth functions pass the step-doubling test
    for i, k in enumerate(K):
        s = mp.sqrt(mp.mpf(k))
        for n in (0, 1, 6, 15, 22, 31):
            if n > c.usable[i]:
                continue
            ref = _gauss(lambda z: MP[name][0](s * z) * mp.hermite(n, z / mp.sqrt(2)) / mp.sqrt(2) ** n) \
                / mp.sqrt(mp.factorial(n))
            assert abs(c.a[i, n] - float(ref)) <= 1e-15 * np.sqrt(c.energy[i]), (name, k, n, c.a[i, n], ref)


def test_matrix_path_equals_pairs():
    """The Gram-matrix path (compiled rows, upper triangle mirrored) gives every entry the value of the
    same pair alone (the truncation of an entry depends on the entry only), to the last bit."""
    rng = np.random.default_rng(3)
    K = rng.uniform(0.05, 20.0, 30)
    A = rng.standard_normal((30, 4))
    C = A @ A.T
    C = C / np.sqrt(np.outer(np.diag(C), np.diag(C))) * np.sqrt(np.outer(K, K))
    C = (C + C.T) / 2
    np.fill_diagonal(C, K)
    for name in ("tanh", "dsilu"):
        E = _moment(name)
        M = E(K[:, None], K[None, :], C)
        np.testing.assert_array_equal(M, M.T)
        iu = np.triu_indices(30)
        flat = E(K[iu[0]], K[iu[1]], C[iu])
        np.testing.assert_allclose(M[iu], flat, rtol=1e-15, atol=1e-300)


def test_price_theorem_finite_difference():
    """d/dK12 E[tanh(u) tanh(v)] = E[tanh'(u) tanh'(v)] (Price 1958): the NTK's factor, by a central
    difference of the NNGP's moment (step 1e-3: truncation ~1e-7 relative)."""
    K1, K2 = np.array([0.8, 2.5, 1.0]), np.array([1.7, 0.3, 1.0])
    K12 = np.array([0.3, -0.5, 0.999])
    h = 1e-3
    E, dE = _moment("tanh"), _moment("dtanh")
    fd = (E(K1, K2, K12 + h) - E(K1, K2, K12 - h)) / (2 * h)
    np.testing.assert_allclose(fd, dE(K1, K2, K12), rtol=2e-6)


def test_identical_arguments_are_the_one_point_moment():
    # K1 = K2 = K12: E[f(u)^2] by the one-point rule, as the diagonal of kernels requires
    K = np.array([0.0, 1e-4, 0.3, 1.0, 7.0, 1e3])
    got = _moment("tanh")(K, K, K)
    ref = [float(_gauss(lambda z: mp.tanh(mp.sqrt(k) * z) ** 2)) for k in K]
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-300)


def test_broadcast_symmetric():
    K = np.array([0.4, 1.0, 2.5, 9.0])
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 4))
    C = A @ A.T
    C = C / np.sqrt(np.outer(np.diag(C), np.diag(C))) * np.sqrt(np.outer(K, K))
    E = _moment("silu")
    M = E(K[:, None], K[None, :], C)
    assert M.shape == (4, 4)
    np.testing.assert_array_equal(M, M.T)


def test_refused_when_no_rule_converges():
    # sin(h) at K = 1e4 oscillates faster than either method resolves: ValueError, not a number
    f = numpy_function(sp.Lambda(_x, sp.sin(_x)))
    with pytest.raises(ValueError, match="did not reach its tolerance"):
        ProductMoment(f, f, same=True)(np.array([1e4]), np.array([1e4]), np.array([5e3]))


def test_agrees_with_the_nested_engine_for_kinked_activations():
    # ELU (a kink in phi') and softplus: the series against the package's general nested engine
    for name in ("elu", "softplus"):
        phi = mf.activation(name)
        for expr in (phi.expr, phi.derivative):
            f = numpy_function(sp.Lambda(_X, expr))
            cuts = pieces(sp.Lambda(_X, expr)).float_cuts
            K1, K2 = np.array([0.6, 2.0]), np.array([1.5, 2.0])
            K12 = np.array([0.5, 0.95]) * np.sqrt(K1 * K2)
            got = ProductMoment(f, f, cuts, cuts, same=True)(K1, K2, K12)
            ref = expect2(lambda u, v: f(u) * f(v), K1, K2, K12, (cuts, cuts))
            np.testing.assert_allclose(got, ref, rtol=1e-9)


# ---------------------------------------------------------------------------
# Gram matrices.
# ---------------------------------------------------------------------------
def _inputs(n=40, d=10, seed=2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0, size=(n, 1))
    x[1] = 2.0 * x[0]                          # parallel, different norm
    x[2] = -x[0]                               # antiparallel
    x[3] = x[4] + 1e-6 * rng.standard_normal(d)  # near-parallel
    x[5] = x[6]                                # identical
    return x


@pytest.mark.parametrize("act, sw, sb", [("tanh", 1.5, 0.1), ("silu", 1.7, 0.2), ("tanh", 4.0, 0.0),
                                         ("selu", 1.2, 0.1)])
def test_symmetric_psd_finite(act, sw, sb):
    x = _inputs()
    r = mf.kernels(act, x, depth=10, sigma_w=sw, sigma_b=sb)
    for M in (r.nngp, r.ntk):
        assert np.all(np.isfinite(M))
        np.testing.assert_array_equal(M, M.T)
        ev = np.linalg.eigvalsh(M)
        assert ev.min() >= -1e-12 * ev.max()
    assert r.nngp[5, 6] == r.nngp[5, 5] == r.nngp[6, 6]


def test_diagonal_is_kernel_profile():
    x = np.random.default_rng(1).standard_normal((3, 7))
    x *= np.sqrt(7) / np.linalg.norm(x, axis=1, keepdims=True)          # |x|^2 / d = 1
    for act in ("tanh", "silu"):
        r = mf.kernels(act, x, depth=6, sigma_w=1.3, sigma_b=0.2, per_layer=True)
        prof = mf.kernel_profile(mf.Architecture(act), sigma_w=1.3, sigma_b=0.2, depth=6)
        np.testing.assert_allclose(r.nngp_diag, np.tile(prof.K[:, None], (1, 3)), rtol=1e-12)


def test_gram_agrees_with_layerwise_mpmath():
    """Two inputs of different norms through tanh at depth 2 (one activation): K^2 = sw^2 E[tanh tanh] + sb^2
    and Theta^2 = K^2 + sw^2 E[tanh' tanh'] Theta^1, with the moments from the 1D mpmath references
    (the inputs are exactly parallel, so rho = 1 at the activation)."""
    x = np.array([[0.3, 0.4], [0.9, 1.2]])
    sw, sb = 1.2, 0.0
    r = mf.kernels("tanh", x, depth=2, sigma_w=sw, sigma_b=sb)
    K1, K2 = sw**2 * 0.25 / 2, sw**2 * 2.25 / 2
    k12 = sw**2 * float(_ref_1d("tanh", K1, K2, 1.0)) + sb**2
    t12 = k12 + sw**2 * float(_ref_1d("dtanh", K1, K2, 1.0)) * (sw**2 * 0.75 / 2)
    np.testing.assert_allclose([r.nngp[0, 1], r.ntk[0, 1]], [k12, t12], rtol=1e-13)
