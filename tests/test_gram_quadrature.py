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
import references as R
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
    return R.expect(h, 1, cuts=(-1, 0, 1))


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
@pytest.mark.slow
def test_against_mpmath_1d_references(name, K1, K2, rho):
    _check(name, K1, K2, rho, _ref_1d(name, K1, K2, rho), 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tanh", "dtanh", "silu", "dsilu"])
def test_large_K_near_parallel(name):
    # step-like or kink-like integrands, |rho| -> 1: the series does not settle these; the conditional rule
    # (SiLU: phi and phi' are analytic) or the nested engine (tanh at K = 1e3: sigma = 0, its own path) does
    _check(name, 1e3, 800.0, 1.0 - 1e-12, _ref_1d(name, 1e3, 800.0, 1.0 - 1e-12), 1e-12)


@pytest.mark.slow
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


@pytest.mark.parametrize("name, K1, K2, rho", [("tanh", 0.7, 2.3, 0.4), ("dsilu", 3.0, 0.4, -0.7)])
def test_against_mpmath_2d(name, K1, K2, rho, mp_smooth2):
    """Against the two-dimensional trapezoid rule in mpmath (tests/references, for smooth integrands).
    It agreed with nested adaptive mpmath quadrature at 20 digits (31-51 s per pair) to 5e-18 (tanh) and
    4e-18 (dsilu) of these values, in 0.5-0.8 s."""
    f = MP[name][0]
    _check(name, K1, K2, rho, mp_smooth2(f, f, K1, K2, rho * mp.sqrt(mp.mpf(K1) * mp.mpf(K2))), 1e-12)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_refused_when_no_rule_converges():
    # sin(h) at K = 1e4 oscillates faster than either method resolves: ValueError, not a number
    f = numpy_function(sp.Lambda(_x, sp.sin(_x)))
    with pytest.raises(ValueError, match="did not reach its tolerance"):
        ProductMoment(f, f, same=True)(np.array([1e4]), np.array([1e4]), np.array([5e3]))


@pytest.mark.slow
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
@pytest.mark.slow
def test_symmetric_psd_finite(act, sw, sb):
    x = _inputs()
    r = mf.kernels(act, x, depth=10, sigma_w=sw, sigma_b=sb)
    for M in (r.nngp, r.ntk):
        assert np.all(np.isfinite(M))
        np.testing.assert_array_equal(M, M.T)
        ev = np.linalg.eigvalsh(M)
        assert ev.min() >= -1e-12 * ev.max()
    assert r.nngp[5, 6] == r.nngp[5, 5] == r.nngp[6, 6]


@pytest.mark.slow
def test_diagonal_is_kernel_profile():
    x = np.random.default_rng(1).standard_normal((3, 7))
    x *= np.sqrt(7) / np.linalg.norm(x, axis=1, keepdims=True)          # |x|^2 / d = 1
    for act in ("tanh", "silu"):
        r = mf.kernels(act, x, depth=6, sigma_w=1.3, sigma_b=0.2, per_layer=True)
        prof = mf.kernel_profile(mf.Architecture(act), sigma_w=1.3, sigma_b=0.2, depth=6)
        np.testing.assert_allclose(r.nngp_diag, np.tile(prof.K[:, None], (1, 3)), rtol=1e-12)


@pytest.mark.slow
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


# ---------------------------------------------------------------------------
# The split f = base + r of step-like activations (SiLU, SiLU', softplus, gelu_tanh) at large K.
# ---------------------------------------------------------------------------
# The reference splits with the *kinked* base (no smoothing), written here independently of the package:
# E[f g] = E[b b] + E[b(u) r(v)] + E[r(u) b(v)] + E[r r], b = alpha . (relu(h), relu(-h), 1{h>0}, 1{h<0}).
# The first three are one-dimensional mpmath integrals at 30 digits (the conditional expectation of b
# under a Gaussian written out: E relu(X) = m Phi(m/t) + t phi(m/t)); the last, whose size is at most
# |r|_1^2 / (2 pi sqrt(K1 K2 (1 - rho^2))), is a tensor Gauss-Legendre sum in float64 over panels of
# width 2 on [-60, 60]^2 (r < 1e-24 beyond), checked against a second order (agreement to 1e-16 of the
# sum of |terms|). The split reference agrees with the plain nested two-dimensional mpmath integral
# (test_split_reference_against_nested, slow).
def _gelu_tanh_mp(u):
    return u / 2 * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (u + mp.mpf(44715) / 10**6 * u**3)))


MP_SPLIT = {   # name: (f in mpmath, alpha of its kinked asymptote), both derived by hand
    "silu": (MP["silu"][0], (1, 0, 0, 0)),
    "dsilu": (MP["dsilu"][0], (0, 0, 1, 0)),
    "softplus": (lambda u: mp.log(1 + mp.exp(u)), (1, 0, 0, 0)),
    "gelu_tanh": (_gelu_tanh_mp, (1, 0, 0, 0)),
}
SP_SPLIT = {"silu": SP["silu"], "dsilu": SP["dsilu"], "softplus": sp.log(1 + sp.exp(_x)),
            "gelu_tanh": _x / 2 * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (_x + sp.Rational(44715, 10**6) * _x**3)))}


def _kinked(al, u):
    return al[0] * max(u, 0) + al[1] * max(-u, 0) + (al[2] if u > 0 else al[3] if u < 0 else (al[2] + al[3]) / 2)


def _cond_kinked(al, m, t):
    """E[b(X)], X ~ N(m, t^2)."""
    P, Q, ph = mp.ncdf(m / t), mp.ncdf(-m / t), mp.npdf(m / t)
    return al[0] * (m * P + t * ph) + al[1] * (t * ph - m * Q) + al[2] * P + al[3] * Q


def _rr_float(rf, rg, K1, K2, K12, n=24, L=60.0):
    edges = np.arange(-L, L + 1e-9, 2.0)
    x, w = np.polynomial.legendre.leggauss(n)
    u = ((edges[:-1, None] + edges[1:, None]) / 2 + x[None, :]).ravel()   # panels of width 2: half-width 1
    wu = np.tile(w, edges.size - 1)
    ru = np.array([float(rf(mp.mpf(t))) for t in u]) * wu
    rv = np.array([float(rg(mp.mpf(t))) for t in u]) * wu
    D = K1 * K2 - K12 * K12
    Q = (K2 * u[:, None] ** 2 - 2 * K12 * u[:, None] * u[None, :] + K1 * u[None, :] ** 2) / (2 * D)
    T = ru[:, None] * rv[None, :] * np.exp(-Q) / (2 * np.pi * np.sqrt(D))
    return T.sum(), np.abs(T).sum()


def _ref_split(name_f, name_g, K1, K2, rho):
    (f, af), (g, ag) = MP_SPLIT[name_f], MP_SPLIT[name_g]
    rf = lambda u: f(u) - _kinked(af, u)   # noqa: E731
    rg = lambda v: g(v) - _kinked(ag, v)   # noqa: E731
    K1, K2, rho = mp.mpf(K1), mp.mpf(K2), mp.mpf(rho)
    s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
    K12 = rho * s1 * s2
    gap = (1 - rho) * (1 + rho)
    tv, tu = mp.sqrt(K2 * gap), mp.sqrt(K1 * gap)          # sd of v | u and of u | v
    L = 60
    wu = min(L / 2, abs(8 * tv * K1 / K12))                 # where E[b(v) | u] turns, in u
    wv = min(L / 2, abs(8 * tu * K2 / K12))
    bb = mp.quad(lambda u: _kinked(af, u) * mp.npdf(u, 0, s1) * _cond_kinked(ag, K12 / K1 * u, tv),
                 [-mp.inf, -wu, 0, wu, mp.inf])
    br = mp.quad(lambda v: rg(v) * mp.npdf(v, 0, s2) * _cond_kinked(af, K12 / K2 * v, tu), [-L, -wv, 0, wv, L])
    rb = mp.quad(lambda u: rf(u) * mp.npdf(u, 0, s1) * _cond_kinked(ag, K12 / K1 * u, tv), [-L, -wu, 0, wu, L])
    if min(tu, tv) >= 1:
        rr, rr_abs = _rr_float(rf, rg, float(K1), float(K2), float(K12))
        rr2, _ = _rr_float(rf, rg, float(K1), float(K2), float(K12), n=16)
        assert abs(rr - rr2) <= 5e-15 * rr_abs + 1e-18, (rr, rr2)   # far below the 2e-14 * scale checked
        return bb + br + rb + mp.mpf(rr)

    # a narrow conditional density (the panels above would not resolve it): nested adaptive quadrature
    def inner(u):
        m = K12 / K1 * u
        pts = [p for p in sorted({-L, 0, L, m - 10 * tv, m, m + 10 * tv}) if -L <= p <= L]
        return mp.quad(lambda v: rg(v) * mp.npdf(v, m, tv), pts)

    with mp.workdps(18):
        rr = mp.quad(lambda u: rf(u) * mp.npdf(u, 0, s1) * inner(u), [-L, -1, 0, 1, L])
    return bb + br + rb + rr


def _split_moment(name_f, name_g):
    f = numpy_function(sp.Lambda(_x, SP_SPLIT[name_f]))
    if name_f == name_g:
        return ProductMoment(f, f, (), (), same=True)
    return ProductMoment(f, numpy_function(sp.Lambda(_x, SP_SPLIT[name_g])), (), ())


def _scale_mp(name, K):
    f = MP_SPLIT[name][0]
    s = mp.sqrt(mp.mpf(K))
    return mp.quad(lambda z: f(s * z) ** 2 * mp.npdf(z), [-mp.inf, -40 / s, -1 / s, 0, 1 / s, 40 / s, mp.inf])


def _check_split(nf, ng, K1, K2, rho, via_split=True):
    K12 = rho * np.sqrt(K1 * K2)
    pm = _split_moment(nf, ng)
    ref = _ref_split(nf, ng, K1, K2, rho)
    scale = float(mp.sqrt(_scale_mp(nf, K1) * _scale_mp(ng, K2)))
    vals = [pm(np.array([K1]), np.array([K2]), np.array([K12]))[0]]
    if via_split:
        # the split route itself (the full path above may settle the entry by the series)
        out = np.full(1, np.nan)
        assert pm._split(np.array([0]), np.array([K1]), np.array([K2]), np.array([K12]), out).size == 0
        vals.append(out[0])
    for v in vals:
        assert abs(v - float(ref)) <= 2e-14 * scale, (nf, ng, K1, K2, rho, v, float(ref), (v - float(ref)) / scale)


# base-pair closed forms: E[psi_p(u) psi_q(v)] for the four pieces psi = relu(h), relu(-h), 1{h>0}, 1{h<0},
# against mpmath: the outer integral by quadrature, the inner E[psi_q(v) | u] from the conditional Gaussian
# (itself checked against quadrature below)
@pytest.mark.slow
@pytest.mark.parametrize("K1, K2, rho", [(2.0, 3.0, 0.6), (0.7, 5.0, -0.8), (50.0, 40.0, 0.95)])
def test_split_base_pair_closed_forms(K1, K2, rho):
    from meanfield._gram_quadrature import _base_pair

    s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
    K12 = rho * np.sqrt(K1 * K2)
    tv = s2 * mp.sqrt(1 - mp.mpf(rho) ** 2)
    for p in range(4):
        for q in range(4):
            e_p, e_q = np.eye(4)[p], np.eye(4)[q]
            ref = mp.quad(lambda u: _kinked(e_p, u) * mp.npdf(u, 0, s1) * _cond_kinked(e_q, K12 / K1 * u, tv),
                          [-mp.inf, 0, mp.inf])
            got = _base_pair(K1, K2, K12, K1 * K2 - K12 * K12, e_p, e_q, 0.0)
            assert abs(got - float(ref)) <= 1e-14 * max(1.0, abs(float(ref))), (p, q, got, float(ref))


def test_conditional_kinked_base_against_quadrature():
    for m, t in ((0.3, 0.7), (-2.0, 1.5), (40.0, 3.0)):
        for p in range(4):
            e = np.eye(4)[p]
            ref = mp.quad(lambda x: _kinked(e, x) * mp.npdf(x, m, t),
                          [-mp.inf] + sorted({0, m - 10 * t, m, m + 10 * t}) + [mp.inf])
            assert abs(_cond_kinked(e, mp.mpf(m), mp.mpf(t)) - ref) <= mp.mpf(10) ** -25 * (1 + abs(ref))


def test_split_asymptotes_and_cut():
    from meanfield._gram_quadrature import _Split

    expect = {"silu": (1, 0, 0, 0), "dsilu": (0, 0, 1, 0), "softplus": (1, 0, 0, 0), "gelu_tanh": (1, 0, 0, 0)}
    for name, al in expect.items():
        s = _Split.of(numpy_function(sp.Lambda(_x, SP_SPLIT[name])), ())
        assert s is not None and np.array_equal(s.alpha, al), (name, s and s.alpha)
        assert 8.0 <= s.L <= 45.0
    # not asymptotically linear (x^2, sqrt growth), or approaching it too slowly (x / sqrt(1 + x^2)): no split
    for e in (_x**2, sp.sqrt(1 + _x**2) + sp.log(1 + _x**2), _x / sp.sqrt(1 + _x**2)):
        assert _Split.of(numpy_function(sp.Lambda(_x, e)), ()) is None, e
    # kinks: the remainder would carry them
    assert _Split.of(numpy_function(sp.Lambda(_x, _x)), (0.0,)) is None


# a few fast cases; the full grid is slow (the mpmath references take ~5-30 s each)
_SPLIT_FAST = [("silu", "silu", 100.0, 300.0, 0.9), ("dsilu", "dsilu", 1e4, 5e3, 0.999),
               ("softplus", "softplus", 30.0, 20.0, -0.5), ("gelu_tanh", "gelu_tanh", 1e3, 800.0, 0.3),
               ("silu", "dsilu", 200.0, 150.0, 0.9)]


@pytest.mark.slow
@pytest.mark.parametrize("nf, ng, K1, K2, rho", _SPLIT_FAST)
def test_split_against_mpmath(nf, ng, K1, K2, rho):
    _check_split(nf, ng, K1, K2, rho)


# where both conditional standard deviations are >= 1 (the split route; the reference's float tensor sum)
_GRID = ([(2.0, 3.0, r) for r in (-0.5, 0.3)] + [(100.0, 300.0, r) for r in (-0.99, -0.5, 0.3, 0.9)]
         + [(1e4, 5e3, r) for r in (-0.99, -0.5, 0.3, 0.9, 0.999)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["silu", "dsilu", "softplus", "gelu_tanh"])
@pytest.mark.parametrize("K1, K2, rho", _GRID)
def test_split_against_mpmath_grid(name, K1, K2, rho):
    _check_split(name, name, K1, K2, rho)


# below it (the conditional rule; the reference's nested adaptive rule for the remainders' product, ~1 min each;
# SiLU' at the first two points, the step-like and harder of the pair, and SiLU at the near-parallel one)
@pytest.mark.slow
@pytest.mark.parametrize("name, K1, K2, rho", [("dsilu", 1.0, 2.0, -0.99), ("silu", 100.0, 300.0, 0.999)])
def test_split_activations_narrow_against_mpmath(name, K1, K2, rho):
    _check_split(name, name, K1, K2, rho, via_split=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["silu", "dsilu", "softplus", "gelu_tanh"])
@pytest.mark.parametrize("K", [1.0, 100.0, 1e4])
def test_split_activations_near_parallel(name, K):
    # rho = 1 - 1e-9: below the split's reach (sigma < 1 up to K = 5e8); the conditional rule, against the
    # Price expansion at rho = 1 to second order, sum_n (rho - 1)^n / n! (s1 s2)^n E[f^(n)(s1 z) f^(n)(s2 z)]
    # (the third term is below (1e-9 * 1.5e4)^3 / 6 E[f'''^2] ~ 1e-15 of the scale)
    f, _ = MP_SPLIT[name]
    s1, s2 = mp.sqrt(mp.mpf(K)), mp.sqrt(mp.mpf(1.5 * K))
    rho = 1 - 1e-9
    pts = [-mp.inf, -40 / s1, -1 / s1, 0, 1 / s1, 40 / s1, mp.inf]
    ref = mp.mpf(0)
    for n in range(3):
        dn = (lambda u, n=n: mp.diff(f, u, n)) if n else f
        ref += ((mp.mpf(rho) - 1) * s1 * s2) ** n / mp.factorial(n) * mp.quad(
            lambda z: dn(s1 * z) * dn(s2 * z) * mp.npdf(z), pts)
    pm = _split_moment(name, name)
    v = pm(np.array([K]), np.array([1.5 * K]), np.array([rho * np.sqrt(1.5) * K]))[0]
    scale = float(mp.sqrt(_scale_mp(name, K) * _scale_mp(name, 1.5 * K)))
    assert abs(v - float(ref)) <= 2e-14 * scale, (v, float(ref), (v - float(ref)) / scale)


@pytest.mark.slow
def test_split_reference_against_nested():
    """The split reference against the plain nested integral E_u[f(u) E[g(v) | u]] in mpmath (SiLU, K = 100),
    at 17 digits (the references serve tolerances of 2e-14; 20 digits cost 76 s of CI)."""
    mp.mp.dps = 17
    try:
        f = MP_SPLIT["silu"][0]
        K, rho = mp.mpf(100), mp.mpf("0.9")
        s = mp.sqrt(K)
        sig = s * mp.sqrt(1 - rho**2)

        def inner(u):
            m = rho * u
            pts = sorted({m - 12 * sig, -30, -8, -2, 0, 2, 8, 30, m + 12 * sig})
            return mp.quad(lambda v: f(v) * mp.npdf(v, m, sig), [p for p in pts if m - 12 * sig <= p <= m + 12 * sig])

        ref = mp.quad(lambda u: f(u) * mp.npdf(u, 0, s) * inner(u), [-12 * s, -30, -8, -2, 0, 2, 8, 30, 12 * s])
        assert abs(_ref_split("silu", "silu", 100.0, 100.0, 0.9) - ref) <= 1e-15 * abs(ref)
    finally:
        mp.mp.dps = 30


@pytest.mark.slow
def test_gram_silu_growing_phase_against_mpmath_recursion(monkeypatch):
    """SiLU at sigma_w = 1.5 (the growing phase: K ~ 10 -> ~100 over 20 layers, rho -> ~0.9), NNGP at depth 20,
    against the pair-by-pair recursion K' = sigma_w^2 E[phi(u) phi(v)] + sigma_b^2 in mpmath (diagonal: the
    one-dimensional integral; off-diagonal: the split reference above, kinked base), and the split route
    exercised on the way."""
    from meanfield import _gram_quadrature as gq

    settled = []
    orig = gq.ProductMoment._split

    def spy(self, pend, *a):
        left = orig(self, pend, *a)
        settled.append(pend.size - left.size)
        return left

    monkeypatch.setattr(gq.ProductMoment, "_split", spy)
    rng = np.random.default_rng(3)
    d = 8
    x = rng.standard_normal((3, d))
    x[1] = x[0] + 0.4 * rng.standard_normal(d)      # rho ~ 0.9 at the input: the split from layer ~9 on
    x *= np.array([[3.0], [2.6], [1.0]]) * np.sqrt(d) / np.linalg.norm(x, axis=1, keepdims=True)
    sw, sb, depth = 1.5, 0.1, 20
    r = mf.kernels("silu", x, depth=depth, sigma_w=sw, sigma_b=sb, get="nngp")
    assert sum(settled) >= 5
    mp.mp.dps = 20
    try:
        K = [[sw**2 * mp.fsum(mp.mpf(a) * mp.mpf(b) for a, b in zip(x[i], x[j])) / d + sb**2 for j in range(3)]
             for i in range(3)]
        for _ in range(depth - 1):
            diag = [sw**2 * _scale_mp("silu", K[i][i]) + sb**2 for i in range(3)]
            off = {}
            for i, j in ((0, 1),):
                rho = K[i][j] / mp.sqrt(K[i][i] * K[j][j])
                off[i, j] = sw**2 * _ref_split("silu", "silu", K[i][i], K[j][j], rho) + sb**2
            for i in range(3):
                K[i][i] = diag[i]
            for (i, j), v in off.items():
                K[i][j] = K[j][i] = v
    finally:
        mp.mp.dps = 30
    assert float(K[0][0]) > 50 and float(K[0][1] / mp.sqrt(K[0][0] * K[1][1])) > 0.8   # the regime meant
    for i, j in ((0, 0), (1, 1), (0, 1)):
        assert abs(r.nngp[i, j] - float(K[i][j])) <= 1e-12 * float(mp.sqrt(K[i][i] * K[j][j])), \
            (i, j, r.nngp[i, j], float(K[i][j]))


# far in the growing phase (SiLU at sigma_w = 2.5 reaches K ~ 1e14 by depth 30): the split's asymptote
# check runs to |h| = 1e16, so it serves K up to 1e30 (it stopped at 1e6, and such entries went one by one
# to the nested engine: n = 10 at depth 30 took minutes)
@pytest.mark.parametrize("nf, ng, K1, K2, rho", [("silu", "silu", 1e8, 3e8, 0.9),
                                                  ("dsilu", "dsilu", 1e12, 5e11, 0.97),
                                                  ("gelu_tanh", "gelu_tanh", 1e16, 2e16, 0.3)])
@pytest.mark.slow
def test_split_against_mpmath_huge_K(nf, ng, K1, K2, rho):
    _check_split(nf, ng, K1, K2, rho)
