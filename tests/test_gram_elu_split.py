"""The split of ELU-like activations at their breakpoint (meanfield/_gram_quadrature.py, _ExpSplit):
f = b + r, b the kinked asymptote alpha . (relu(h), relu(-h), 1{h>0}, 1{h<0}), r an exponential on each
side, used for the entries the Hermite series leaves (large K, the growing phase).

References are written here in mpmath (20 digits), independently of the split: E[f(u) g(v)] as the one-dimensional
integral over u of f(u) times the conditional expectation E[g(V)], V ~ N(K12 u / K1, K2 - K12^2 / K1),
which for ELU and its derivative is closed:

    E[relu(V)] = m Phi(m/t) + t phi(m/t),  E[e^V 1{V<0}] = e^{m + t^2/2} Phi(-(m + t^2)/t),

(mpmath has no overflow, so e^{t^2/2} at t^2 ~ 1e14 is computed as it stands).
"""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield._gram_quadrature import ProductMoment
from meanfield.gaussian import numpy_function, pieces
from meanfield.symbols import x as _X

mp.mp.dps = 30

SELU_A = mp.mpf("1.6732632423543772848170429916717")
SELU_L = mp.mpf("1.0507009873554804934193349852946")
# name: (scale lambda, alpha, derivative?)
CASES = {"elu": (1, 1, False), "delu": (1, 1, True), "selu": (SELU_L, SELU_A, False), "dselu": (SELU_L, SELU_A, True)}


def _f_mp(name, h):
    lam, al, der = CASES[name]
    if der:
        return lam * (1 if h > 0 else al * mp.exp(h))
    return lam * (h if h > 0 else al * mp.expm1(h))


def _cond_mp(name, m, t):
    """E[f(V)], V ~ N(m, t^2), in closed form (module docstring)."""
    lam, al, der = CASES[name]
    P, Q, ph = mp.ncdf(m / t), mp.ncdf(-m / t), mp.npdf(m / t)
    ex = mp.exp(m + t * t / 2) * mp.ncdf(-(m + t * t) / t)
    if der:
        return lam * (P + al * ex)
    return lam * (m * P + t * ph + al * (ex - Q))


def _ref(name, K1, K2, rho):
    """E[f(u) f(v)] by the one-dimensional mpmath integral over u (at the working precision)."""
    K1, K2, rho = mp.mpf(K1), mp.mpf(K2), mp.mpf(rho)
    s1 = mp.sqrt(K1)
    K12 = rho * s1 * mp.sqrt(K2)
    t = mp.sqrt(K2 * (1 - rho) * (1 + rho))
    sc = t * K1 / abs(K12) if K12 != 0 else s1           # the scale in u of the conditional's turn at u = 0
    pts = {0, 1, 10, 40, sc, 10 * sc, s1, 4 * s1}
    pts = sorted({p for p in pts if 0 < p <= 12 * s1} | {12 * s1})
    grid = [-mp.inf] + [-p for p in reversed(pts)] + [0] + pts + [mp.inf]
    return mp.quad(lambda u: _f_mp(name, u) * mp.npdf(u, 0, s1) * _cond_mp(name, K12 / K1 * u, t), grid)


def _one_mp(name, K):
    s = mp.sqrt(mp.mpf(K))
    pts = sorted({p for p in (1, 10, 40, s, 4 * s) if p <= 12 * s} | {12 * s})
    grid = [-mp.inf] + [-p for p in reversed(pts)] + [0] + pts + [mp.inf]
    return mp.quad(lambda u: _f_mp(name, u) ** 2 * mp.npdf(u, 0, s), grid)


def _expr(name):
    phi = mf.activation(name.lstrip("d") if name.startswith("d") else name)
    return phi.derivative if name.startswith("d") else phi.expr


def _moment(name):
    e = _expr(name)
    f = numpy_function(sp.Lambda(_X, e))
    cuts = pieces(sp.Lambda(_X, e)).float_cuts
    return ProductMoment(f, f, cuts, cuts, same=True)


def test_kronrod_rule_exactness():
    """K15 integrates x^k exactly for k <= 22, its Gauss 7 for k <= 13, and not beyond (30-digit references
    are the exact moments 2 / (k + 1) for even k)."""
    from meanfield._gram_quadrature import _G7_W, _K15_W, _K15_X

    x = np.array([mp.mpf(v) for v in _K15_X])
    for w, deg in ((_K15_W, 22), (_G7_W, 13)):
        for k in range(deg + 3):
            exact = mp.mpf(2) / (k + 1) if k % 2 == 0 else mp.mpf(0)
            got = mp.fsum(mp.mpf(wi) * xi ** k for wi, xi in zip(w, x))
            if k <= deg:
                assert abs(got - exact) <= 1e-15, (deg, k, got)
            elif k % 2 == 0:
                assert abs(got - exact) > 1e-12, (deg, k)


@pytest.mark.slow
def test_erfcx_and_exponential_conditional():
    from meanfield._gram_quadrature import _cond_exp, _erfcx

    for v in (0.0, 0.3, 2.49, 2.5, 3.9, 4.0, 7.0, 12.0, 50.0, 300.0, 1e6):
        ref = mp.exp(mp.mpf(v) ** 2) * mp.erfc(v)
        assert abs(_erfcx(v) / ref - 1) <= 4e-16, v
    # E[A e^{lam X} 1{X<0}] + E[B e^{-mu X} 1{X>0}], X ~ N(m, t^2), against mpmath quadrature
    re = np.array([1.7, 1.0, 0.6, 0.5])
    for m, t in ((0.3, 1.0), (-30.0, 2.0), (40.0, 1.5), (2.0, 50.0), (-1e6, 1e7), (3e7, 1e7)):
        M, T = mp.mpf(m), mp.mpf(t)
        ref = mp.quad(lambda v: (re[0] * mp.exp(re[1] * v) if v < 0 else re[2] * mp.exp(-re[3] * v)) * mp.npdf(v, M, T),
                      [-mp.inf, min(M - 10 * T, -1), -1, 0, 1, max(M + 10 * T, 1), mp.inf])
        got = _cond_exp(re, m, t, float(mp.exp(-(M / T) ** 2 / 2)))
        assert abs(got - ref) <= 1e-15 * max(abs(ref), 1e-300) + 1e-300, (m, t, got, ref)


def test_exp_split_detection():
    from meanfield._gram_quadrature import _ExpSplit

    a = float(SELU_A)
    for name, alpha, rexp in (("elu", (1, 0, 0, -1), (1, 1, 0, 1)), ("delu", (0, 0, 1, 0), (1, 1, 0, 1)),
                              ("dselu", (0, 0, float(SELU_L), 0), (float(SELU_L) * a, 1, 0, 1))):
        e = _expr(name)
        s = _ExpSplit.of(numpy_function(sp.Lambda(_X, e)), pieces(sp.Lambda(_X, e)).float_cuts)
        assert s is not None, name
        np.testing.assert_allclose(s.alpha, alpha, rtol=1e-15, atol=0)
        np.testing.assert_allclose(s.rexp, rexp, rtol=1e-14, atol=0)
    # CELU-like (rate 1/2) and the mirror image: detected; not exponential on a side, two breakpoints,
    # piecewise linear: not
    x = _X
    yes = [sp.Piecewise((x, x > 0), (2 * sp.exp(x / 2) - 2, True)),
           sp.Piecewise((1 - sp.exp(-x), x > 0), (3 * x, True))]
    no = [sp.Piecewise((x, x > 0), (sp.tanh(x), True)), sp.Piecewise((x, x > 0), (0.1 * x, True)),
          sp.Piecewise((-1, x < -1), (x, x < 1), (1, True))]
    for e in yes + no:
        s = _ExpSplit.of(numpy_function(sp.Lambda(_X, e)), pieces(sp.Lambda(_X, e)).float_cuts)
        assert (s is not None) == (e in yes), e


def _check(name, K1, K2, rho, tol=1e-13):
    K12 = rho * np.sqrt(K1 * K2)
    pm = _moment(name)
    out = np.full(1, np.nan)
    assert pm._exp_split(np.array([0]), np.array([K1]), np.array([K2]), np.array([K12]), out).size == 0
    full = pm(np.array([K1]), np.array([K2]), np.array([K12]))[0]
    # the moment of the pair as given: its correlation is K12 / sqrt(K1 K2) of the float K12 (near rho = 1 the
    # moments of a jumping phi' move like sqrt(1 - rho): 1e-16 in rho is 4e-12 of E[phi' phi'] at 1 - rho = 1e-12)
    with mp.workdps(20):   # 1e-20: far below the 1e-13 checked, and half the time of 30 digits
        ref = _ref(name, K1, K2, mp.mpf(K12) / mp.sqrt(mp.mpf(K1) * mp.mpf(K2)))
    with mp.workdps(15):   # the tolerance's scale needs a few digits only
        scale = float(mp.sqrt(_one_mp(name, K1) * _one_mp(name, K2)))
    for v in (out[0], full):
        assert abs(v - float(ref)) <= tol * scale, (name, K1, K2, rho, v, float(ref), (v - float(ref)) / scale)


# the growing phase's range: K from ~3 (conditional sd just above 1) to 1e14, rho from -0.99 to 1 - 1e-12,
# norms 1 : 1 to 1 : 30; each case checks the split route and the full path
_GRID = [(3.0, 5.0, 0.5), (400.0, 300.0, -0.99), (1e3, 2e3, 0.95), (1e6, 9e8, 0.3), (1e14, 3e14, 1 - 1e-12)]
# conditional standard deviations below 1 (the first panel graded towards the breakpoint): near-parallel pairs
# at moderate K, small K, different norms, near-antiparallel
_NARROW = [(50.0, 60.0, 1 - 1e-9), (0.5, 0.7, 0.3), (0.05, 20.0, 0.9), (2.0, 3.0, -0.999), (1e3, 1e3, 1 - 1e-12)]


@pytest.mark.parametrize("name, K1, K2, rho", [("elu", *_GRID[0]), ("dselu", *_GRID[1]), ("selu", *_GRID[2]),
                                               ("delu", *_GRID[3]), ("dselu", *_GRID[4]),
                                               ("dselu", *_NARROW[0]), ("selu", *_NARROW[1])])
@pytest.mark.slow
def test_exp_split_against_mpmath(name, K1, K2, rho):
    _check(name, K1, K2, rho)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["elu", "dselu"])
@pytest.mark.parametrize("K1, K2, rho", _GRID + _NARROW + [(2.0, 2.0, 0.2), (10.0, 1e4, 0.9), (1e8, 1e8, -0.5),
                                                           (1e10, 2e10, 0.999999), (1e20, 5e19, 0.97)])
def test_exp_split_against_mpmath_grid(name, K1, K2, rho):
    # 30 cases of 1-8 s (the largest K the slowest)
    _check(name, K1, K2, rho)


@pytest.mark.slow
def test_gram_elu_growing_phase_against_mpmath_recursion(monkeypatch):
    """ELU at sigma_w = 2.5 (K grows ~3x per layer, to ~2e4 here), NNGP and NTK of two inputs of different
    norms at depth 7 (~10 s), against the pair recursion K' = sw^2 E[phi phi] + sb^2,
    Theta' = K' + sw^2 E[phi' phi'] Theta iterated in mpmath with the one-dimensional references above;
    the split settles the pair from the second layer on."""
    from meanfield import _gram_quadrature as gq

    settled = []
    orig = gq.ProductMoment._exp_split

    def spy(self, pend, *a):
        left = orig(self, pend, *a)
        settled.append(pend.size - left.size)
        return left

    monkeypatch.setattr(gq.ProductMoment, "_exp_split", spy)
    rng = np.random.default_rng(5)
    d = 6
    x = rng.standard_normal((2, d))
    x[1] = x[0] + 0.8 * rng.standard_normal(d)
    x *= np.array([[2.0], [0.7]]) * np.sqrt(d) / np.linalg.norm(x, axis=1, keepdims=True)
    sw, sb, depth = 2.5, 0.3, 7
    r = mf.kernels("elu", x, depth=depth, sigma_w=sw, sigma_b=sb)
    assert sum(settled) >= 5
    mp.mp.dps = 18
    try:
        K = [[sw**2 * mp.fsum(mp.mpf(a) * mp.mpf(b) for a, b in zip(x[i], x[j])) / d + sb**2 for j in range(2)]
             for i in range(2)]
        T = [row[:] for row in K]
        for _ in range(depth - 1):
            rho = K[0][1] / mp.sqrt(K[0][0] * K[1][1])
            k01 = sw**2 * _ref("elu", K[0][0], K[1][1], rho) + sb**2
            t01 = k01 + sw**2 * _ref("delu", K[0][0], K[1][1], rho) * T[0][1]
            kd = [sw**2 * _one_mp("elu", K[i][i]) + sb**2 for i in range(2)]
            td = [kd[i] + sw**2 * _one_mp("delu", K[i][i]) * T[i][i] for i in range(2)]
            K = [[kd[0], k01], [k01, kd[1]]]
            T = [[td[0], t01], [t01, td[1]]]
    finally:
        mp.mp.dps = 30
    assert float(K[0][0]) > 1e4
    for M, R in ((r.nngp, K), (r.ntk, T)):
        for i, j in ((0, 0), (1, 1), (0, 1)):
            assert abs(M[i, j] - float(R[i][j])) <= 1e-13 * float(mp.sqrt(R[i][i] * R[j][j])), \
                (i, j, M[i, j], float(R[i][j]))


@pytest.mark.slow
def test_exp_split_leaves_what_cancels():
    """At small K the split's pieces (b's constant -alpha 1{h<0} and r = alpha e^h, both O(1)) cancel to an
    O(sqrt K) result: their rounding enters the error test, so such entries are left to the series (the
    bug this guards: K ~ 1e-6 was accepted 3e-11 off); at K ~ 0.5 they are taken."""
    pm = _moment("elu")
    K1, K2 = np.array([1e-6, 0.5]), np.array([2e-6, 0.7])
    K12 = 0.3 * np.sqrt(K1 * K2)
    out = np.full(2, np.nan)
    left = pm._exp_split(np.arange(2), K1, K2, K12, out)
    assert left.tolist() == [0]
