"""NNGP / NTK Gram matrices (meanfield.kernels) against independent references.

* mpmath at 40 digits: the recursion of a plain ReLU / erf MLP evaluated
  layer by layer, each two-point Gaussian expectation E[f(u) g(v)] by mpmath
  quadrature over u of the conditional expectation E[g(v) | u], v | u ~
  N(K12 u / K1, K2 - K12^2 / K1), from one-dimensional Gaussian identities
  (E[relu(v)] = m Phi(m/s) + s phi(m/s), E[1{v>0}] = Phi(m/s),
  E[erf(v)] = erf(m / sqrt(1 + 2 s^2)), E[e^{-v^2}] = e^{-m^2/(1+2s^2)} / sqrt(1 + 2 s^2));
  none of the arc-cosine / arcsine closed forms the package uses.
* the single-input kernel_profile on the diagonal (unit-norm inputs);
* symmetry and positive semi-definiteness (eigenvalues);
* Monte Carlo (meanfield.verification.gram): the empirical NNGP over
  initialisations and the empirical NTK by torch.func, within error bars.
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R
from meanfield.gram import Kernels, kernels


# ---------------------------------------------------------------------------
# The mpmath reference (independent of the package's formulas).
# ---------------------------------------------------------------------------
_COND = {"relu": R.relu_cond, "erf": R.erf_cond}
_ACT = {"relu": (lambda u: max(u, 0), lambda u: mp.mpf(1) if u > 0 else mp.mpf(0)), "erf": (mp.erf, R.derf)}


def _expect2(name, K1, K2, K12):
    """E[phi(u) phi(v)], E[phi'(u) phi'(v)] for Var u = K1, Var v = K2, Cov = K12 (conditional quadrature)."""
    cond = _COND[name]
    return tuple(R.expect_conditional(_ACT[name][k], lambda m, s: cond(m, s)[k], K1, K2, K12, cuts=R.WIDE_CUTS)
                 for k in (0, 1))


def mp_gram(name, x, y, depth, sw, sb, param="ntk", width=None, dps=40):
    """(K^depth(x, y), Theta^depth(x, y)) of the MLP h^{l+1} = W phi(h^l) + b, at ``dps`` digits."""
    with mp.workdps(dps):
        x = [mp.mpf(float(v)) for v in x]
        y = [mp.mpf(float(v)) for v in y]
        d, sw, sb = len(x), mp.mpf(sw), mp.mpf(sb)

        def dot(p, q):
            return mp.fsum(a * b for a, b in zip(p, q))

        raw = {(0, 0): dot(x, x), (1, 1): dot(y, y), (0, 1): dot(x, y)}
        K = {k: sw**2 * v / d + sb**2 for k, v in raw.items()}
        T = dict(K) if param == "ntk" else {k: v + 1 for k, v in raw.items()}
        for _ in range(depth - 1):
            K2, T2 = {}, {}
            for (i, j), kij in K.items():
                e, ed = _expect2(name, K[(i, i)], K[(j, j)], kij)
                K2[(i, j)] = sw**2 * e + sb**2
                own = K2[(i, j)] if param == "ntk" else width * e + 1
                T2[(i, j)] = own + sw**2 * ed * T[(i, j)]
            K, T = K2, T2
        return K[(0, 1)], T[(0, 1)]


_X = np.array([1.0, 0.5, -0.3])
_TH = np.sqrt(2e-12)   # 1 - cos(_TH) = 1e-12
PAIRS = {
    "different norms": (_X, 1.7 * np.array([-0.4, 2.0, 1.1])),
    "near-parallel": (_X, 2.5 * (_X + 1e-4 * np.array([0.3, -0.2, 0.7]))),
    "antiparallel": (_X, -0.7 * _X),
    "correlation 1 - 1e-12": (np.array([1.0, 0.0, 0.0]), 3.0 * np.array([np.cos(_TH), np.sin(_TH), 0.0])),
    "identical": (_X, _X),
}


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("name, depth", [("relu", 4), ("erf", 3)])
def test_against_mpmath(name, depth, pair):
    x, y = PAIRS[pair]
    K, T = mp_gram(name, x, y, depth, 1.4, 0.3)
    r = kernels(name, x[None], y[None], depth=depth, sigma_w=1.4, sigma_b=0.3)
    assert r.nngp.shape == r.ntk.shape == (1, 1)
    assert abs(r.nngp[0, 0] / float(K) - 1) < 1e-13
    assert abs(r.ntk[0, 0] / float(T) - 1) < 1e-13


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu", "erf"])
def test_standard_parameterisation_against_mpmath(name):
    x, y = PAIRS["different norms"]
    K, T = mp_gram(name, x, y, 3, 1.2, 0.5, param="standard", width=300)
    r = kernels(name, x[None], y[None], depth=3, sigma_w=1.2, sigma_b=0.5, parameterization="standard", width=300)
    assert abs(r.nngp[0, 0] / float(K) - 1) < 1e-13
    assert abs(r.ntk[0, 0] / float(T) - 1) < 1e-13
    # the NNGP does not depend on the parameterisation
    r2 = kernels(name, x[None], y[None], depth=3, sigma_w=1.2, sigma_b=0.5, get="nngp")
    assert r2.nngp[0, 0] == pytest.approx(r.nngp[0, 0], rel=1e-15) and r2.ntk is None


# ---------------------------------------------------------------------------
# The diagonal is the single-input recursion.
# ---------------------------------------------------------------------------
ARCHS = {
    "relu": mf.Architecture("relu"),
    "erf": mf.Architecture("erf"),
    "gelu ln_pre": mf.Architecture("gelu", norm="ln_pre"),
    "gelu ln_post": mf.Architecture("gelu", norm="ln_post"),
    "relu mu": mf.Architecture("relu", mu=0.7),
    "tree": mf.Network(mf.residual(mf.rms_norm(), mf.act("gelu"), mf.dense(), mf.scale(0.5)), mu=0.9),
    "tanh (quadrature)": mf.Architecture("tanh"),
}


@pytest.mark.slow
@pytest.mark.parametrize("key", list(ARCHS))
def test_diagonal_is_kernel_profile(key):
    arch = ARCHS[key]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7))
    x *= np.sqrt(7) / np.linalg.norm(x, axis=1, keepdims=True)          # |x|^2 / d = 1
    depth = 6
    r = kernels(arch, x, depth=depth, sigma_w=1.3, sigma_b=0.2, per_layer=True)
    prof = mf.kernel_profile(arch, sigma_w=1.3, sigma_b=0.2, depth=depth)
    np.testing.assert_allclose(r.nngp_diag, np.tile(prof.K[:, None], (1, 3)), rtol=1e-12)
    np.testing.assert_allclose(np.diag(r.nngp), prof.K[-1], rtol=1e-12)


# ---------------------------------------------------------------------------
# Structure: symmetric, PSD, finite where neural-tangents is known to fail.
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("key", ["relu", "erf", "gelu ln_pre", "gelu ln_post", "tree"])
def test_symmetric_psd(key):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 10)) * rng.uniform(0.1, 3.0, size=(40, 1))
    x[1] = 2.0 * x[0]                      # parallel, different norm
    x[2] = -x[0]                           # antiparallel
    r = kernels(ARCHS[key], x, depth=8, sigma_w=1.5, sigma_b=0.1)
    for M in (r.nngp, r.ntk):
        assert np.array_equal(M, M.T)
        ev = np.linalg.eigvalsh(M)
        assert ev.min() >= -1e-12 * ev.max()


def test_x2_is_the_cross_block():
    rng = np.random.default_rng(3)
    x1, x2 = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)) * 2
    full = kernels("gelu", np.vstack([x1, x2]), depth=5, sigma_w=1.2, sigma_b=0.3)
    cross = kernels("gelu", x1, x2, depth=5, sigma_w=1.2, sigma_b=0.3)
    assert cross.nngp.shape == (5, 3)
    np.testing.assert_allclose(cross.nngp, full.nngp[:5, 5:], rtol=1e-14)
    np.testing.assert_allclose(cross.ntk, full.ntk[:5, 5:], rtol=1e-14)


@pytest.mark.parametrize("name, sw, sb, depth", [("relu", 2.0, 0.0, 60), ("erf", 4.0, 0.0, 500),
                                                 ("erf", 1.0, 0.0, 300), ("gelu", 3.0, 0.5, 10)])
@pytest.mark.slow
def test_finite_near_correlation_one_and_deep_chaos(name, sw, sb, depth):
    x = np.array([[1.0, 0.0], [1.0, 1e-9], [2.0, 1e-15], [3.0, 0.0], [-1.0, 0.0]])
    r = kernels(name, x, depth=depth, sigma_w=sw, sigma_b=sb)
    for M in (r.nngp, r.ntk):
        assert np.all(np.isfinite(M))
        D = np.outer(np.sqrt(np.diag(M)), np.sqrt(np.diag(M)))   # no overflow where the NTK is ~1e200
        assert np.all(np.abs(M) <= D * (1 + 1e-12))        # Cauchy-Schwarz


@pytest.mark.slow
def test_precision_loss_is_refused():
    # GELU's two-point form divides by (1+K1)(1+K2) - K12^2, whose determinant part K1 K2 - K12^2
    # overflows float64 once K ~ 1e154 (depth 250 here; depth 40, K ~ 1e26, is answered to 1e-15:
    # tests/test_gram_large_K.py): the result is a ValueError, never a NaN or a wrong matrix
    x = np.array([[1.0, 0.0], [2.0, 1e-15]])
    with pytest.raises(ValueError, match="precision|finite"):
        kernels("gelu", x, depth=250, sigma_w=3.0, sigma_b=0.5)


def test_identical_inputs_stay_correlated_in_chaos():
    # chaotic erf / GELU+ln_post: correlation 1 is unstable, yet identical inputs must keep K(x, x) = K^l(x)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((30, 8)) * rng.uniform(0.1, 3, size=(30, 1))
    x[5] = x[3]
    for arch, sw in ((mf.Architecture("erf"), 3.0), (mf.Architecture("gelu", norm="ln_post"), 1.5)):
        r = kernels(arch, x, x[:4], depth=80, sigma_w=sw, sigma_b=0.1, per_layer=True)
        np.testing.assert_array_equal(r.nngp[[0, 1, 2, 3, 5], [0, 1, 2, 3, 3]], r.nngp_diag[-1][[0, 1, 2, 3, 5]])
        full = kernels(arch, x, depth=80, sigma_w=sw, sigma_b=0.1)
        np.testing.assert_array_equal(np.diag(full.ntk)[:4], np.diag(r.ntk[:4]))
        assert full.ntk[3, 5] == full.ntk[3, 3]


def test_relu_parallel_inputs_exact():
    # parallel inputs, sigma_b = 0: ReLU is positively homogeneous, so K(x, 2x) = 2 K(x, x) at every depth
    x = np.array([[0.3, -1.2, 0.5], [0.6, -2.4, 1.0]])
    r = kernels("relu", x, depth=30, sigma_w=1.5, sigma_b=0.0)
    assert r.nngp[0, 1] == pytest.approx(2 * r.nngp[0, 0], rel=1e-14)
    assert r.ntk[0, 1] == pytest.approx(2 * r.ntk[0, 0], rel=1e-14)


# ---------------------------------------------------------------------------
# BatchNorm: the batch-level step.
# ---------------------------------------------------------------------------
def _bn_jacobian_terms(y, s, PTP):
    """J T J^T per sample for J = (P - y y^T / n) / s (checked against finite differences below)."""
    n = y.shape[1]
    a = y @ PTP
    q = np.einsum("mi,mi->m", a, y)
    w = 1 / s**2
    X = np.einsum("m,mi,mj->ij", w, a, y) / n
    return PTP * w.sum() - X - X.T + np.einsum("m,mi,mj->ij", w * q / n**2, y, y)


def test_batchnorm_jacobian_formula_by_finite_differences():
    rng = np.random.default_rng(10)
    n = 12
    h = rng.standard_normal(n) * rng.uniform(0.5, 2, n)

    def y(v):
        c = v - v.mean()
        return c / np.sqrt((c**2).mean())

    d = 1e-6
    J_fd = np.array([(y(h + d * e) - y(h - d * e)) / (2 * d) for e in np.eye(n)]).T
    c = h - h.mean()
    s = np.sqrt((c**2).mean())
    J = (np.eye(n) - 1 / n - np.outer(y(h), y(h)) / n) / s
    np.testing.assert_allclose(J, J_fd, atol=1e-8)
    T = rng.standard_normal((n, n))
    T = T @ T.T
    P = np.eye(n) - 1 / n
    np.testing.assert_allclose(_bn_jacobian_terms(y(h)[None], np.array([s]), P @ T @ P), J @ T @ J.T, rtol=1e-12)


def test_batchnorm_step_against_sampling():
    """One BatchNorm over a batch of 200: the large-batch map against the exact finite-batch expectation.

    Per unit h ~ N(0, K); y = P h / s, s^2 = h^T P h / n, sampled 4000 times;
    E[y y^T] and E[J T J^T] (J by the finite-difference-checked formula)
    against K' = n PKP / tr(PKP), T' = n PTP / tr(PKP), within 5 standard
    errors plus 3 / n_eff (the large-batch limit's own error). T carries a
    common part 0.7 and a part along K: dropping the centring of T, or
    O(1) cross-sample terms in J T J^T, would fail by far.
    """
    from meanfield.calculus import BatchNorm

    n, M = 200, 4000
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, 4 * n)) * rng.uniform(0.5, 2, (n, 1))
    K = x @ x.T / (4 * n) + 0.3
    z = rng.standard_normal((n, 4 * n)) * rng.uniform(0.5, 2, (n, 1))
    T = z @ z.T / (4 * n) + 0.7 + 0.5 * K
    Kp, Tp = BatchNorm.gram_batch(K, T)
    P = np.eye(n) - 1 / n
    C = P @ K @ P
    n_eff = np.trace(C) ** 2 / np.trace(C @ C)
    L = np.linalg.cholesky(K)
    chunks_K, chunks_T = [], []
    for _ in range(20):
        h = rng.standard_normal((M // 20, n)) @ L.T
        c = h - h.mean(1, keepdims=True)
        s = np.sqrt((c**2).mean(1))
        y = c / s[:, None]
        chunks_K.append(y.T @ y / len(y))
        chunks_T.append(_bn_jacobian_terms(y, s, P @ T @ P) / len(y))
    scale_K, scale_T = np.sqrt(np.outer(np.diag(Kp), np.diag(Kp))), np.sqrt(np.outer(np.diag(Tp), np.diag(Tp)))
    for chunks, ref, scale in ((chunks_K, Kp, scale_K), (chunks_T, Tp, scale_T)):
        arr = np.array(chunks)
        m, se = arr.mean(0), arr.std(0, ddof=1) / np.sqrt(len(arr))
        assert np.all(np.abs(m - ref) <= 5 * se + 3 / n_eff * scale)
    # the common part of T is annihilated exactly (J 1 = 0)
    _, T0 = BatchNorm.gram_batch(K, np.ones((n, n)))
    assert np.abs(T0).max() < 1e-13


@pytest.mark.slow
def test_batchnorm_symmetric_batch_is_the_pair_calculus():
    """Equal norms and equal overlaps: BN maps the diagonal to 1, so K^l(x, x) is kernel_profile's (K, K12) -> (1, 0)."""
    n = 6
    x = np.eye(n) * np.sqrt(n)                              # |x|^2 / d = 1, orthogonal
    for arch in (mf.Architecture("relu", norm="bn"), mf.Architecture("erf", norm="bn", mu=0.6),
                 mf.Architecture("gelu", norm="bn", mu=0.8, stages=2)):
        r = kernels(arch, x, depth=7, sigma_w=1.4, sigma_b=0.3, per_layer=True)
        assert r.batch_n_eff.shape == (6,)
        prof = mf.kernel_profile(arch, sigma_w=1.4, sigma_b=0.3, depth=7)
        np.testing.assert_allclose(r.nngp_diag, np.tile(prof.K[:, None], (1, n)), rtol=1e-12)
        for M in (r.nngp, r.ntk):
            assert np.array_equal(M, M.T)
            ev = np.linalg.eigvalsh(M)
            assert ev.min() >= -1e-12 * ev.max()


@pytest.mark.slow
def test_batchnorm_relu_ntk_growth_is_pi_over_pi_minus_one():
    # Yang et al. 2019 (a mean field theory of batch normalization): ReLU + BN explodes gradients at
    # pi / (pi - 1) per layer at large batch; here from orthogonal inputs, where K^l is constant
    n = 400
    x = np.eye(n) * np.sqrt(n)
    r = kernels(mf.Architecture("relu", norm="bn"), x[:, :], depth=40, sigma_w=1.0, sigma_b=0.0)
    r2 = kernels(mf.Architecture("relu", norm="bn"), x, depth=41, sigma_w=1.0, sigma_b=0.0)
    assert r2.ntk[0, 0] / r.ntk[0, 0] == pytest.approx(np.pi / (np.pi - 1), rel=3 / n)


# ---------------------------------------------------------------------------
# Refusals and results.
# ---------------------------------------------------------------------------
def test_bad_inputs():
    x = np.ones((2, 3))
    bn = mf.Architecture("relu", norm="bn")
    with pytest.raises(ValueError, match="batch_norm.*x2 must be None"):
        kernels(bn, x, x, depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="at least 2 rows"):
        kernels(bn, x[:1], depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="not finite"):          # identical rows: the batch variance is 0
        kernels(bn, x, depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="pair map"):
        mf.gram.gram_map(bn)
    with pytest.raises(ValueError, match="tokens"):
        kernels(mf.Architecture("gelu", block="mixer"), x, depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="width"):
        kernels("relu", x, depth=3, sigma_w=1, sigma_b=0, parameterization="standard")
    with pytest.raises(ValueError, match="parameterization"):
        kernels("relu", x, depth=3, sigma_w=1, sigma_b=0, parameterization="mup")
    with pytest.raises(ValueError, match="get"):
        kernels("relu", x, depth=3, sigma_w=1, sigma_b=0, get="cov")
    with pytest.raises(ValueError, match="x1"):
        kernels("relu", np.ones(3), depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="x1"):
        kernels("relu", np.array([[1.0, np.nan]]), depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="same number of features"):
        kernels("relu", x, np.ones((2, 4)), depth=3, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="depth"):
        kernels("relu", x, depth=0, sigma_w=1, sigma_b=0)
    with pytest.raises(ValueError, match="sigma_w"):
        kernels("relu", x, depth=3, sigma_w=-1, sigma_b=0)
    # a normalisation of a zero signal is 0/0: refused, not NaN
    with pytest.raises(ValueError, match="not finite"):
        kernels(mf.Architecture("relu", norm="ln_pre"), np.zeros((2, 3)), depth=3, sigma_w=1, sigma_b=0)


def test_save_load(tmp_path):
    x = np.random.default_rng(4).standard_normal((4, 3))
    r = kernels(mf.Architecture("erf", norm="ln_post"), x, depth=4, sigma_w=1.1, sigma_b=0.2)
    assert "Kernels(" in repr(r) and "nngp" in repr(r)
    for suf in ("json", "npz"):
        back = Kernels.load(r.save(tmp_path / f"k.{suf}"))
        np.testing.assert_array_equal(back.nngp, r.nngp)
        np.testing.assert_array_equal(back.ntk, r.ntk)
        assert str(back.architecture) == str(r.architecture)


# ---------------------------------------------------------------------------
# Monte Carlo.
# ---------------------------------------------------------------------------
def _agree(emp, ana, se, rel_bias):
    """|empirical - analytic| <= 4.5 standard errors + an allowance for the finite-width bias."""
    return np.abs(emp - ana) <= 4.5 * se + rel_bias * np.abs(ana)


MC_CASES = [("relu", "ntk"), ("erf", "standard"), ("gelu ln_post", "ntk")]


@pytest.mark.slow
@pytest.mark.parametrize("key, param", MC_CASES)
def test_monte_carlo_shallow(key, param):
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 16)) * np.array([[1.0], [2.0], [0.5], [1.5]])
    kw = dict(depth=4, sigma_w=1.3, sigma_b=0.4, parameterization=param)
    e = empirical_kernels(ARCHS[key], x, width=256, n_init=16, **kw)
    r = kernels(ARCHS[key], x, width=256, **kw)
    assert np.all(_agree(e.nngp, r.nngp, e.nngp_se, 0.0))
    assert np.all(_agree(e.ntk, r.ntk, e.ntk_se, 4 * 4 / 256))


@pytest.mark.slow
@pytest.mark.parametrize("key, sw, sb", [("relu", 2 ** 0.5, 0.0), ("erf", 1.3, 0.3), ("gelu ln_post", 1.0, 0.5)])
def test_monte_carlo_deep_wide(key, sw, sb):
    """depth 20, width 512: empirical NNGP and NTK against the analytic Gram matrices."""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 32)) * np.array([[1.0], [2.0], [0.5], [1.5]])
    kw = dict(depth=20, sigma_w=sw, sigma_b=sb)
    e = empirical_kernels(ARCHS[key], x, width=512, n_init=12, n_outputs=2, **kw)
    r = kernels(ARCHS[key], x, **kw)
    assert np.all(_agree(e.nngp, r.nngp, e.nngp_se, 0.0))
    assert np.all(_agree(e.ntk, r.ntk, e.ntk_se, 4 * 20 / 512))


def _bn_case(act, n, d, depth, width, n_init, n_outputs, equal_norms, seed, **arch_kw):
    from meanfield.verification.gram import empirical_kernels

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x *= np.sqrt(d) / np.linalg.norm(x, axis=1, keepdims=True) if equal_norms else rng.uniform(0.5, 2, (n, 1))
    arch = mf.Architecture(act, norm="bn", **arch_kw)
    kw = dict(depth=depth, sigma_w=1.2, sigma_b=0.3)
    r = kernels(arch, x, **kw)
    rows = [0, 1, 2]
    e = empirical_kernels(arch, x, width=width, n_init=n_init, n_outputs=n_outputs, ntk_rows=rows, **kw)
    # the large-batch limit's own error: O(1 / n_eff) per BatchNorm passed
    batch_bias = np.sum(1 / r.batch_n_eff)
    blk = np.ix_(rows, rows)
    assert np.all(_agree(e.nngp[blk], r.nngp[blk], e.nngp_se[blk], batch_bias))
    assert np.all(_agree(e.ntk, r.ntk[blk], e.ntk_se, batch_bias + 4 * depth / width))
    return r, e


@pytest.mark.slow
def test_monte_carlo_batchnorm():
    """BatchNorm over a batch of 64 inputs of different norms (the batch = all rows; NTK on 3 of them)."""
    pytest.importorskip("torch")
    r, _ = _bn_case("relu", 64, 256, 3, 256, 8, 1, False, 12)
    assert r.batch_n_eff.min() > 30


@pytest.mark.slow
def test_monte_carlo_batchnorm_resnet():
    """The pre-activation ResNet block (two BN -> relu -> dense stages inside a residual, mu = 0.7):
    Residual.combine around a batch-level branch, 64 inputs of different norms, depth 3."""
    pytest.importorskip("torch")
    _bn_case("relu", 64, 256, 3, 256, 8, 1, False, 13, mu=0.7, stages=2)


@pytest.mark.slow
@pytest.mark.parametrize("act, equal_norms, arch_kw", [("relu", True, {}), ("erf", False, {}),
                                                       ("relu", True, {"mu": 0.7, "stages": 2})])
def test_monte_carlo_batchnorm_deep_wide(act, equal_norms, arch_kw):
    """depth 20, width 512, batch 128: BatchNorm's large-batch NNGP / NTK against Monte Carlo.

    ReLU with equal-norm inputs, erf with norms 0.5-2 (erf's zero mean lets
    BatchNorm even the norms out). Not ReLU with different norms: there the
    per-input scales sqrt(K(x, x)) enter the next kernel through
    E[relu] != 0 as a rank-one term that centring does not remove; it grows
    with depth (n_eff 79 -> 14 at depth 20) and the large-batch limit is not
    reached (docs/gram.md).
    """
    pytest.importorskip("torch")
    r, _ = _bn_case(act, 128, 512, 20, 512, 12, 2, equal_norms, 6, **arch_kw)
    assert r.batch_n_eff.min() > 60


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------
def test_cli(tmp_path):
    from meanfield.cli import main

    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((5, 4)), rng.standard_normal((2, 4))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out = tmp_path / "k.npz"
    rc = main(["kernels", "--inputs", str(tmp_path / "x.npy"), "--inputs2", str(tmp_path / "y.npy"),
               "--depth", "6", "--activation", "erf", "--norm", "ln_pre", "--sigma-w", "1.5", "--sigma-b", "0.1",
               "--out", str(out)])
    assert rc == 0
    r = Kernels.load(out)
    ref = kernels(mf.Architecture("erf", norm="ln_pre"), x, y, depth=6, sigma_w=1.5, sigma_b=0.1)
    np.testing.assert_array_equal(r.nngp, ref.nngp)
    np.testing.assert_array_equal(r.ntk, ref.ntk)
    assert main(["kernels", "--inputs", str(tmp_path / "x.npy"), "--depth", "3", "--sigma-w", "1", "--sigma-b",
                 "0", "--parameterization", "standard", "--out", str(out)]) == 2
    assert main(["kernels", "--inputs", str(tmp_path / "nope.npy"), "--depth", "3", "--sigma-w", "1",
                 "--sigma-b", "0", "--out", str(out)]) == 2


def test_load_file_written_before_the_gram_subpackage(tmp_path):
    """A Kernels file names its class "meanfield.gram.Kernels" (the path before meanfield/gram/ became a
    subpackage, and the one saved now): written here by hand, it still loads, and a new save names the same."""
    import json

    nngp = [[2.0, 0.5], [0.5, 1.25]]
    doc = {"meanfield_format": 1, "data": {"__result__": "meanfield.gram.Kernels", "fields": {
        "architecture": "relu", "sigma_w": 1.5, "sigma_b": 0.25, "depth": 3, "parameterization": "ntk",
        "width": None, "nngp": {"__ndarray__": [2.0, 0.5, 0.5, 1.25], "dtype": "float64", "shape": [2, 2]},
        "ntk": None, "nngp_diag": None, "batch_n_eff": None}}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    back = Kernels.load(path)
    assert isinstance(back, Kernels)
    assert (back.depth, back.sigma_w, back.parameterization, back.ntk) == (3, 1.5, "ntk", None)
    np.testing.assert_array_equal(back.nngp, np.array(nngp))
    saved = json.loads(back.save(tmp_path / "new.json").read_text())
    assert saved["data"]["__result__"] == "meanfield.gram.Kernels"
