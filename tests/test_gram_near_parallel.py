"""Near-parallel and near-antiparallel pairs: meanfield.kernels against a 50-digit mpmath recursion.

The reference (tests/references/gram_pair.py) starts from the float64 inputs as given (x.x' exact) and
writes every two-point moment out in mpmath; its closed forms are checked here against
conditional-expectation quadrature. The package carries the pair's gap 1 - rho^2 exactly through
the ReLU family, Dense, residual and LayerNorm (meanfield.gram, Numerics); before, a pair with
1 - rho = 1e-15 at the input had a ReLU NTK error of 8e-8 at depth 32 (1e-6 after ln_post).
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf

import references.gram_pair as R

SW, SB, WIDTH = 1.4, 0.3, 1000.0


def _pair(gap, scale, seed=0, d=8):
    """float64 x, x' with 1 - rho = gap (gap < 0: 1 + rho = -gap) and |x'| = scale |x| (up to rounding)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(d)
    e = rng.standard_normal(d)
    e -= (e @ x) / (x @ x) * x
    e *= np.linalg.norm(x) / np.linalg.norm(e)
    c = 1 - gap if gap > 0 else -(1 + gap)
    s = np.sqrt(abs(gap) * (2 - abs(gap)))
    return x, scale * (c * x + s * e)


@pytest.mark.slow
def test_reference_closed_forms_against_quadrature():
    # the mpmath reference's arc-cosine, Williams erf and GELU kernels against quadrature of conditional
    # expectations, at 1 - rho = 1e-12 and 1 + rho = 1e-12, equal and different variances
    with mp.workdps(40):
        t = mp.mpf(10) ** -12
        pts = [(1, 1, 1 - t), (2, mp.mpf("0.7"), mp.sqrt(mp.mpf("1.4")) * (1 - t)), (1, 2, -mp.sqrt(2) * (1 - t))]
        assert R.check_closed_forms(pts) < 1e-20


def _err(arch, act, norm, mu, gap, scale, depth, seed=0):
    x, y = _pair(gap, scale, seed)
    ref = R.recursion(x, y, act, norm, mu, depth, SW, SB, WIDTH)[depth]
    K, T, Ts = (float(v) for v in ref)
    a = mf.kernels(arch, x[None], y[None], depth=depth, sigma_w=SW, sigma_b=SB)
    b = mf.kernels(arch, x[None], y[None], depth=depth, sigma_w=SW, sigma_b=SB, parameterization="standard",
                   width=WIDTH, get="ntk")
    return abs(a.nngp[0, 0] / K - 1), abs(a.ntk[0, 0] / T - 1), abs(b.ntk[0, 0] / Ts - 1)


LEAKY = mf.act("leaky_relu", negative_slope=0.1).phi
CASES = {
    "relu": (mf.Architecture("relu"), "relu", None, None),
    "leaky_relu": (mf.Architecture(LEAKY), "leaky_relu", None, None),
    "relu ln_pre": (mf.Architecture("relu", norm="ln_pre"), "relu", "ln_pre", None),
    "relu ln_post": (mf.Architecture("relu", norm="ln_post"), "relu", "ln_post", None),
    "leaky_relu ln_post": (mf.Architecture(LEAKY, norm="ln_post"), "leaky_relu", "ln_post", None),
    "relu residual": (mf.Architecture("relu", mu=0.8), "relu", None, 0.8),
    "relu pre-LN residual": (mf.Architecture("relu", norm="ln_pre", mu=0.8), "relu", "ln_pre", 0.8),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("gap", [1e-6, 1e-9, 1e-12, 1e-15, -1e-12])
@pytest.mark.parametrize("scale", [1.0, 1.3])
def test_relu_family_near_parallel_deep(case, gap, scale):
    # depth 24; both parameterisations; equal norms and x' = 1.3 x + a small perpendicular part.
    # Before the gap was carried: NTK errors 1e-10 (1 - rho = 1e-9) to 1e-6 (1e-15, ln_post)
    arch, act, norm, mu = CASES[case]
    errs = _err(arch, act, norm, mu, gap, scale, 24)
    assert max(errs) < 2e-12, errs


@pytest.mark.parametrize("act", ["erf", "gelu"])
@pytest.mark.parametrize("gap", [1e-9, 1e-15])
def test_smooth_activations_near_parallel(act, gap):
    # erf and GELU, plain blocks (ordered for these parameters): no worse than 1e-13 at depth 20
    errs = _err(mf.Architecture(act), act, None, None, gap, 1.3, 20)
    assert max(errs) < 1e-13, errs


GELU_CASES = {
    "ln_post": (mf.Architecture("gelu", norm="ln_post"), "ln_post", None),
    "residual": (mf.Architecture("gelu", mu=0.8), None, 0.8),
    "ln_pre": (mf.Architecture("gelu", norm="ln_pre"), "ln_pre", None),
    "pre-LN residual": (mf.Architecture("gelu", norm="ln_pre", mu=0.8), "ln_pre", 0.8),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GELU_CASES))
@pytest.mark.parametrize("gap", [1e-6, 1e-9, 1e-12, 1e-15, -1e-12])
def test_gelu_near_parallel_deep(case, gap):
    # GELU carries the gap (Gelu.kernel_gap): depth 24, equal norms, both parameterisations. ln_post and the
    # residual are chaotic for sigma_w = 1.4, where correlation 1 is unstable: before, the gap recomputed from
    # the rounded kernels (1e-16 absolute) grew to 2e-13 (residual) and 7e-13 (ln_post) at depth 24, 7e-12 at 32
    arch, norm, mu = GELU_CASES[case]
    errs = _err(arch, "gelu", norm, mu, gap, 1.0, 24)
    assert max(errs) < 2e-14, errs


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ln_post", "residual"])
@pytest.mark.parametrize("sw", [0.9, 2.0])
def test_gelu_near_parallel_other_phases(case, sw):
    # the ordered (sigma_w = 0.9) and a more chaotic (2.0) side, 1 - rho = 1e-13, norms 1 and 1 + 1e-9
    arch, norm, mu = GELU_CASES[case]
    x, y = _pair(1e-13, 1.0 + 1e-9, seed=2)
    K, T, _ = (float(v) for v in R.recursion(x, y, "gelu", norm, mu, 22, sw, SB, WIDTH)[22])
    r = mf.kernels(arch, x[None], y[None], depth=22, sigma_w=sw, sigma_b=SB)
    assert abs(r.nngp[0, 0] / K - 1) < 2e-14 and abs(r.ntk[0, 0] / T - 1) < 2e-14


def test_near_parallel_inside_a_gram_matrix():
    # the same pairs inside a larger Gram matrix (the tracked subset, symmetry, the pinned diagonal)
    x, y = _pair(1e-13, 1.0, seed=3)
    x2, y2 = _pair(-1e-14, 1.7, seed=4)
    rng = np.random.default_rng(5)
    X = np.vstack([x, y, x2, y2, rng.standard_normal((4, 8))])
    r = mf.kernels("relu", X, depth=21, sigma_w=SW, sigma_b=SB)
    assert np.array_equal(r.ntk, r.ntk.T)
    for i, j, (p, q) in ((0, 1, (x, y)), (2, 3, (x2, y2))):
        K, T, _ = (float(v) for v in R.recursion(p, q, "relu", None, None, 21, SW, SB, WIDTH)[21])
        assert abs(r.nngp[i, j] / K - 1) < 1e-13 and abs(r.ntk[i, j] / T - 1) < 1e-13


def test_parallel_rows_of_different_norms_exact():
    # x and 2.5 x (rounded): 1 - rho ~ 1e-33 as given; sigma_b = 0 keeps them parallel, so at depth L the
    # ReLU NTK is the one-input closed form scaled: Theta^L(x, s x) = s Theta^L(x, x)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(6)
    X = np.stack([x, 2.5 * x])
    r = mf.kernels("relu", X, depth=30, sigma_w=1.3, sigma_b=0.0)
    assert r.ntk[0, 1] == pytest.approx(2.5 * r.ntk[0, 0], rel=1e-14)
    assert r.nngp[0, 1] == pytest.approx(2.5 * r.nngp[0, 0], rel=1e-14)


# ---------------------------------------------------------------------------
# The activations' gap maps: 1 - rho'^2 of (phi(u), phi(v)) from the exact input gap.
# ---------------------------------------------------------------------------
_GAP_POINTS = [(1.0, 1.0, 1e-12, 1), (1.0, 1.0, 1e-30, 1), (2.0, 0.7, 1e-9, 1), (5e3, 5e3, 1e-14, 1),
               (1.3, 1.3, 0.5, 1), (0.3, 2.0, 1e-3, 1), (1.0, 1.0, 2e-12, -1), (1.0, 1.69, 2e-14, -1),
               (1.0, 1.69, 1e-13, 1), (1.0, 1.0000001, 1e-16, 1), (0.8, 0.8, 0.02, -1), (3.0, 3.0, 1.0, 1),
               # either side of f = 1/20, where ScaleInvariant.kernel_gap switches to the series of sin f - f cos f
               (1.0, 1.0, float(np.sin(0.049) ** 2), 1), (1.0, 1.0, float(np.sin(0.0501) ** 2), -1)]


def _mp_gap(name, K1, K2, gap, sign, dps=50):
    """1 - M12^2 / (M1 M2) at 50 digits for the pair with exactly this gap (rho = sign sqrt(1 - gap))."""
    with mp.workdps(dps):
        K1, K2 = mp.mpf(K1), mp.mpf(K2)
        K12 = sign * mp.sqrt(1 - mp.mpf(gap)) * mp.sqrt(K1 * K2)
        pair, one = R.activation(name)
        M = pair(K1, K2, K12)[0]
        return 1 - M * M / (one(K1)[0] * one(K2)[0]), K12


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu", "leaky_relu", "abs", "erf", "gelu"])
def test_kernel_gap_against_mpmath(name):
    import sympy as sp

    from meanfield.gram.pair_maps import _lambdify

    phi = mf.act(name, negative_slope=0.1).phi if name == "leaky_relu" else mf.act(name).phi
    K1, K2, K12, G = sp.symbols("K1 K2 K12 G", positive=True)
    f = _lambdify((K1, K2, sp.Symbol("K12"), G), [phi.kernel_gap(K1, K2, sp.Symbol("K12"), G)])
    worst = 0.0
    for k1, k2, gap, sign in _GAP_POINTS:
        ref, k12 = _mp_gap(name, k1, k2, gap, sign)
        got = float(np.ravel(f(k1, k2, float(k12), gap)[0])[0])
        rel = abs(got / float(ref) - 1)
        # erf's gap for inputs of norms 1 and 1 + 1e-7 is (its two arcsine differences ~1e-7 nearly cancel) right
        # to 2e-9 relative: the output angle sqrt(gap) ~ 4e-8 to 1e-17 absolute, what the kernels need
        if name in ("erf", "gelu") and k2 == 1.0000001:
            assert abs(np.sqrt(got) - float(mp.sqrt(ref))) < 1e-16
            continue
        worst = max(worst, rel)
    # the rounded rho (1e-16 absolute) enters only where the gap is not small: relative accuracy throughout
    assert worst < 1e-13, worst


@pytest.mark.slow
def test_gelu_kernel_gap_small_and_huge_K():
    # Gelu.kernel_gap at K = 1e-6 ... 1e12 (two forms, switching at sqrt(K1 K2) = 2), inputs of equal norms,
    # norms 1 : 1 + 1e-10 ... 1 : 5, 1 -+ rho = 1e-30 ... 1: relative 1e-13, or within the change that a
    # relative 6e-15 perturbation of K1 makes (where the output gap comes from the norms: for K1 / K2 - 1 = 1e-10
    # its part is O(1e-20) and known to ~1e-16 / 1e-10 relative from the rounded K's alone)
    import sympy as sp

    from meanfield.gram.pair_maps import _lambdify

    phi = mf.act("gelu").phi
    K1, K2, G = sp.symbols("K1 K2 G", positive=True)
    f = _lambdify((K1, K2, sp.Symbol("K12"), G), [phi.kernel_gap(K1, K2, sp.Symbol("K12"), G)])
    worst = 0.0
    for k in (1e-6, 0.1, 1.9, 2.1, 30.0, 1e4, 1e8, 1e12):
        for ratio in (1.0, 1 + 1e-10, 1 + 1e-6, 1.69, 0.2):
            for gap in (1e-30, 1e-15, 1e-9, 1e-3, 0.5, 1.0):
                for sign in (1, -1):
                    k1, k2 = k, k * ratio
                    ref, k12 = _mp_gap("gelu", k1, k2, gap, sign)
                    with mp.workdps(90):
                        h = mp.mpf(10) ** -30
                        slope = abs(_mp_gap("gelu", mp.mpf(k1) * (1 + h), k2, gap, sign, 90)[0]
                                    - _mp_gap("gelu", k1, k2, gap, sign, 90)[0]) / h
                    with np.errstate(all="ignore"):
                        got = float(np.ravel(f(k1, k2, float(k12), gap)[0])[0])
                    worst = max(worst, abs(got - float(ref)) / (1e-13 * float(ref) + 6e-15 * float(slope)))
    assert worst < 1, worst
