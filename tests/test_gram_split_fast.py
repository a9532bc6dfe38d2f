"""The fast smooth split's pieces (issue 12, n = 1000): the tabulated erfcx, the restarted recurrences for
the Gaussians and exponentials on the uniform grids, and the truncation of the grids (its bound must be
honest), each against an independent route (mpmath, numpy's exp, the untruncated 2-D sum in mpmath)."""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

gq = pytest.importorskip("meanfield._gram_quadrature")


@pytest.mark.slow
def test_erfcx_table_against_mpmath():
    T = gq._erfcx_table()
    rng = np.random.default_rng(3)
    xs = np.concatenate([rng.uniform(0.0, 32.0, 400), np.linspace(0.0, 32.0, 129), [1e-300, 31.999999, 32.0, 40.0, 1e3]])
    with mp.workdps(30):
        worst = 0.0
        for x in xs:
            ref = mp.exp(mp.mpf(x) ** 2) * mp.erfc(mp.mpf(x))
            got = gq._erfcx_fast(float(x), T)
            worst = max(worst, float(abs((mp.mpf(got) - ref) / ref)))
    assert worst <= 10 * np.finfo(float).eps, worst


@pytest.mark.slow
def test_recurrences_against_exp():
    x = 0.5 * np.arange(-77, 78, dtype=float)
    out = np.empty(x.size)
    for A in (-0.5, -1e-3, -1.0 / 120.0):
        gq._gaussian(x, 3, x.size - 6, A, out)
        ref = np.exp(A * x[3:-3] ** 2)
        assert np.all(np.abs(out[:x.size - 6] - ref) <= 40 * np.finfo(float).eps * ref)
    for c in (0.07, -0.3, 1e-4):
        gq._geometric(x, 5, x.size - 10, c, out)
        ref = np.exp(c * x[5:-5])
        assert np.all(np.abs(out[:x.size - 10] - ref) <= 12 * np.finfo(float).eps * ref)


def _silu_split():
    from meanfield.gaussian import numpy_function

    x = sp.Symbol("x")
    silu = x / (1 + sp.exp(-x))
    return (gq._Split.of(numpy_function(sp.Lambda(x, silu)), np.zeros(0)),
            gq._Split.of(numpy_function(sp.Lambda(x, sp.diff(silu, x))), np.zeros(0)))


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1])
def test_truncation_bound_is_honest(which):
    """The cross terms and E[r r] with nodes left out differ from the untruncated sums (computed here in
    mpmath from the same grids: an independent summation) by no more than the bounds they return, and the
    bounds stay within the budget."""
    s = _silu_split()[which]
    T = gq._erfcx_table()
    k1, k2, k12 = 180.0, 260.0, 0.95 * math.sqrt(180.0 * 260.0)
    D = k1 * k2 - k12 * k12
    budget = 1e-13
    # cross term E[r(u) b_s(v)] on grid a: u ~ N(0, k1), conditional N(k12 u / k1, D / k1 + 1)
    hx = s.halves(0.5)[0]
    val, bound = gq._split_cross_one(k1, k12, D, s.alpha, 1.0, hx, T, budget)
    assert 0.0 < bound <= budget   # some nodes are left out
    x, w = s.grids(0.5)[:2]
    t = mp.sqrt(mp.mpf(D) / k1 + 1)
    mu = mp.mpf(k12) / k1
    full = mp.mpf(0)
    with mp.workdps(30):
        for xi, wi in zip(x, w):
            if wi == 0.0:
                continue
            m = mu * xi
            z = m / t
            pp, ph = mp.ncdf(z), mp.npdf(z)
            pm = 1 - pp
            al = [mp.mpf(a) for a in s.alpha]
            cb = al[0] * (m * pp + t * ph) + al[1] * (t * ph - m * pm) + al[2] * pp + al[3] * pm
            full += wi * mp.npdf(xi, 0, mp.sqrt(k1)) * cb
    assert abs(float(full) - val) <= bound + 1e-15 * abs(float(full)) + 1e-300
    # E[r(u) r(v)] on grid a x grid a
    g = s.grids(0.5)
    c = s.cut(0.5)
    n = g[0].size
    G, E, P, P4, F = (np.empty(n) for _ in range(5))
    rr, rb = gq._split_rr(k1, k2, k12, D, g[0], g[1], g[0], g[1], c[0], c[0], budget, G, E, P, P4, F)
    assert 0.0 < rb <= budget
    with mp.workdps(25):
        tot = mp.mpf(0)
        nz = np.nonzero(g[1])[0]
        for i in nz:
            ui = mp.mpf(g[0][i])
            for j in nz:
                vj = mp.mpf(g[0][j])
                tot += g[1][i] * g[1][j] * mp.exp(-(k2 * ui * ui - 2 * k12 * ui * vj + k1 * vj * vj) / (2 * D))
        tot /= 2 * mp.pi * mp.sqrt(D)
    assert abs(float(tot) - rr) <= rb + 1e-13 * abs(float(tot))


@pytest.mark.slow
def test_split_entries_against_series_level():
    """Entries that both the split and the Hermite series at kmax = 256 settle agree to the tolerance
    (two independent routes: closed forms + trapezoid sums against one-point projections)."""
    s, ds = _silu_split()
    from meanfield.gaussian import numpy_function

    x = sp.Symbol("x")
    silu = x / (1 + sp.exp(-x))
    for f, cuts in ((numpy_function(sp.Lambda(x, silu)), ()), (numpy_function(sp.Lambda(x, sp.diff(silu, x))), ())):
        pm = gq.ProductMoment(f, f, cuts, cuts, same=True)
        K1 = np.array([2.0, 5.0, 8.0, 12.0])
        K2 = np.array([3.0, 4.0, 9.0, 10.0])
        rho = np.array([0.3, -0.5, 0.6, 0.4])
        K12 = rho * np.sqrt(K1 * K2)
        a, b, c = K1, K2, K12
        pend = np.arange(4)
        out_split = np.full(4, np.nan)
        left = pm._split(pend, a, b, c, out_split)
        assert left.size == 0
        out_ser = np.full(4, np.nan)
        from meanfield._gram_quadrature import _Coefficients, LEVELS

        kmax, h0 = LEVELS[-1]
        u = np.unique(np.concatenate([K1, K2]))
        co = _Coefficients(f, np.zeros(0), u, kmax, h0)
        i1, i2 = np.searchsorted(u, K1), np.searchsorted(u, K2)
        rest = gq.ProductMoment._series(pend, rho, i1, i2, co, co, kmax, out_ser)
        assert rest.size == 0
        scale = np.sqrt(np.interp(K1, u, co.energy) * np.interp(K2, u, co.energy))
        assert np.all(np.abs(out_split - out_ser) <= 2e-14 * scale), np.abs(out_split - out_ser) / scale
