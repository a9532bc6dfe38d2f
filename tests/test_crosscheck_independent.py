"""Independent references for the audit (benchmarks/crosscheck/): mpmath, closed forms, plain-torch MC.

Nothing here calls meanfield to make a reference: the activations are written out in mpmath,
expectations are mpmath quadratures, derivatives mpmath.diff, and the Monte Carlo is a
self-contained torch network (not meanfield.torch). The neural-tangents and dks comparisons
need packages that are not dependencies; they live in benchmarks/crosscheck/ with their outputs.
"""
import math

import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R

SELU_A = mp.mpf("1.6732632423543772848170429916717")
SELU_L = mp.mpf("1.0507009873554804934193349852946")
PHI = {
    "erf": (mp.erf, R.derf),
    "gelu": (R.gelu, R.dgelu),
    "tanh": (lambda x: mp.tanh(x), lambda x: mp.sech(x) ** 2),
    "selu": (lambda x: SELU_L * (x if x > 0 else SELU_A * mp.expm1(x)),
             lambda x: SELU_L * (1 if x > 0 else SELU_A * mp.exp(x))),
}


def _E(f, K):
    return R.expect(f, K)


def _m2(name, K):
    phi = PHI[name][0]
    return _E(lambda x: phi(x) ** 2, K)


def _d2(name, K):
    d = PHI[name][1]
    return _E(lambda x: d(x) ** 2, K)


# -- ReLU-family Gram matrices on parallel / antiparallel inputs of different norms ------------
@pytest.mark.parametrize("slope", [0.0, 0.23])
@pytest.mark.parametrize("s", [1.7, 0.37, 3.1])
def test_scale_invariant_gram_parallel_pairs_closed_form(slope, s):
    """(x, s x, -s x) with sigma_b = 0: the pair stays exactly (anti)parallel, so
    E[phi(u) phi(v)] = (1 + a^2)/2 sqrt(K1 K2) (rho = 1) and -a sqrt(K1 K2) (rho = -1)
    (phi(u) phi(v) = a u v when the signs differ). Before the fix the arccos and the
    sqrt(K1 K2 - K12^2) of the rounded K's disagreed: 4.5e-9 relative (found with neural-tangents)."""
    rng = np.random.default_rng(11)
    sw = 1.9
    arch = mf.Network(mf.serial(mf.act("leaky_relu", negative_slope=slope), mf.dense()))
    worst = 0.0
    for _ in range(20):
        x = rng.standard_normal(5)
        X = np.stack([x, s * x, -s * x])
        r = mf.kernels(arch, X, depth=2, sigma_w=sw, sigma_b=0.0)
        K1 = sw * sw * (x @ x) / 5
        root = K1 * abs(s)                       # sqrt(K1 K2)
        par = sw * sw * (1 + slope * slope) / 2 * root
        anti = -sw * sw * slope * root
        scale = sw * sw * root
        worst = max(worst, abs(r.nngp[0, 1] - par) / scale, abs(r.nngp[0, 2] - anti) / scale)
        # NTK ('ntk'): Theta^2 = K^2 + sigma_w^2 E[phi'(u) phi'(v)] Theta^1, Theta^1 = K^1 = +-root,
        # E[phi' phi'] = (1 + a^2)/2 at rho = 1 and a at rho = -1
        t_par = par + sw * sw * (1 + slope * slope) / 2 * root
        t_anti = anti - sw * sw * slope * root
        worst = max(worst, abs(r.ntk[0, 1] - t_par) / scale, abs(r.ntk[0, 2] - t_anti) / scale)
    assert worst < 1e-14, worst


def test_relu_pre_layernorm_diagonal_ntk_exact():
    """After a LayerNorm the diagonal correlation K / sqrt(K K) can round to 1 - 1e-16, where
    arccos has infinite slope: the ReLU NTK diagonal was 2.2e-9 off (found with neural-tangents).
    Depth 2, mu = 0.44: K^2 = mu^2 K^1 + sigma_w^2/2 + sigma_b^2, Theta^2 = (sigma_w^2/2 + sigma_b^2) + mu^2 Theta^1 + sigma_w^2 (1/2) Theta^1/K^1 = K^2 + sigma_w^2/2."""
    sw, sb, mu = 1.37, 0.23, 0.44
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 5)) * rng.uniform(0.2, 3.0, (40, 1))
    net = mf.Network(mf.residual(mf.layer_norm(), mf.act("relu"), mf.dense()), mu=mu)
    r = mf.kernels(net, x, depth=2, sigma_w=sw, sigma_b=sb)
    K1 = sw * sw * np.sum(x * x, 1) / 5 + sb * sb
    K2 = mu * mu * K1 + sw * sw / 2 + sb * sb
    np.testing.assert_allclose(np.diag(r.nngp), K2, rtol=1e-14)
    np.testing.assert_allclose(np.diag(r.ntk), K2 + sw * sw / 2, rtol=1e-14)


# -- mpmath at parameter points no paper uses -------------------------------------------------
def _fixed_point(name, sw, sb, mu, ln):
    sw, sb, mu = mp.mpf(sw), mp.mpf(sb), mp.mpf(mu)
    F = (lambda k: mu * mu * k + sw * sw * _m2(name, 1) + sb * sb) if ln else \
        (lambda k: mu * mu * k + sw * sw * _m2(name, k) + sb * sb)
    with mp.workdps(15):
        K = sw * sw + sb * sb
        for _ in range(500):
            K, old = F(K), K
            if abs(K - old) < 1e-12 * (1 + K):
                break
    K = mp.findroot(lambda k: F(k) - k, K)
    chi = mu * mu + sw * sw * (_d2(name, 1) / K if ln else _d2(name, K))
    return K, chi


@pytest.mark.slow
@pytest.mark.parametrize("name, sw, sb, mu, ln", [
    ("gelu", 1.21, 0.34, 0.37, False),
    ("tanh", 1.37, 0.23, 0.7, True),
    ("selu", 0.97, 0.13, 0.0, False),
    ("erf", 2.6, 0.71, 0.0, False),
])
def test_fixed_point_and_chi_J_against_mpmath(name, sw, sb, mu, ln):
    with mp.workdps(30):
        K, chi = _fixed_point(name, sw, sb, mu, ln)
    arch = mf.Architecture(name, norm="ln_pre" if ln else "none", mu=mu if (mu or ln) else None)
    assert mf.fixed_point(arch, sigma_w=sw, sigma_b=sb) == pytest.approx(float(K), rel=1e-13)
    assert mf.chi_J(arch, sigma_w=sw, sigma_b=sb) == pytest.approx(float(chi), rel=1e-13)


@pytest.mark.parametrize("name, sw, sb, mu", [("gelu", 1.37, 0.23, 0.7), ("tanh", 1.1, 0.4, 0.5),
                                              ("selu", 0.9, 0.3, 0.6)])
@pytest.mark.slow
def test_ln_post_fixed_point_and_chi_J_against_mpmath(name, sw, sb, mu):
    """LayerNorm after phi: h' = mu h + W LN(phi(h)) + b, E[LN(.)^2] = 1, so
    K* = (sigma_w^2 + sigma_b^2) / (1 - mu^2) and chi_J* = mu^2 + sigma_w^2 E[phi'(h)^2] / Var[phi(h)]
    (the LayerNorm divides by the standard deviation of phi, not its root mean square)."""
    with mp.workdps(30):
        sw_, sb_, mu_ = mp.mpf(sw), mp.mpf(sb), mp.mpf(mu)
        K = (sw_ ** 2 + sb_ ** 2) / (1 - mu_ ** 2)
        phi = PHI[name][0]
        var = _m2(name, K) - _E(phi, K) ** 2
        chi = mu_ ** 2 + sw_ ** 2 * _d2(name, K) / var
    arch = mf.Architecture(name, norm="ln_post", mu=mu)
    assert mf.fixed_point(arch, sigma_w=sw, sigma_b=sb) == pytest.approx(float(K), rel=1e-14)
    assert mf.chi_J(arch, sigma_w=sw, sigma_b=sb) == pytest.approx(float(chi), rel=1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("name, sw, mu", [("erf", 1.37, 0.0), ("tanh", 1.93, 0.0), ("gelu", 1.3, 0.37)])
def test_critical_line_against_mpmath(name, sw, mu):
    arch = mf.Architecture(name, mu=mu or None)
    line = mf.critical_line(arch, sigma_w=sw)
    with mp.workdps(30):
        K = mp.findroot(lambda k: mu * mu + sw * sw * _d2(name, k) - 1, mp.mpf(float(line.K_star)))
        sb = mp.sqrt((1 - mp.mpf(mu) ** 2) * K - mp.mpf(sw) ** 2 * _m2(name, K))
    assert float(line.sigma_b) == pytest.approx(float(sb), rel=1e-12)


@pytest.mark.slow
def test_gelu_residual_critical_point_against_mpmath():
    """mu = 0.37: K* solves d/dK E[phi^2] = E[phi'^2] (chi_K = chi_J; mpmath.diff, no Price);
    sigma_w^2 = (1 - mu^2) / E[phi'^2](K*), sigma_b^2 = (1 - mu^2) K* - sigma_w^2 E[phi^2](K*)."""
    mu = mp.mpf("0.37")
    pts = [p for p in mf.critical_point(mf.Architecture("gelu", mu=0.37)) if p.K_star > 0]
    assert len(pts) == 1
    with mp.workdps(45):
        K = mp.findroot(lambda k: mp.diff(lambda t: _m2("gelu", t), k) - _d2("gelu", k), mp.mpf(3.5))
    with mp.workdps(30):
        sw2 = (1 - mu * mu) / _d2("gelu", K)
        sb2 = (1 - mu * mu) * K - sw2 * _m2("gelu", K)
    p = pts[0]
    assert p.K_star == pytest.approx(float(K), rel=1e-12)
    assert p.sigma_w == pytest.approx(float(mp.sqrt(sw2)), rel=1e-13)
    assert p.sigma_b == pytest.approx(float(mp.sqrt(sb2)), rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("mu", [0.0, 0.37])
def test_selu_critical_point_at_zero_against_closed_form(mu):
    """K* = 0: sigma_w^2 = (1 - mu^2) / lim_{K->0} E[phi'^2] = 2 (1 - mu^2) / (lambda^2 (1 + alpha^2))."""
    arch = mf.Architecture("selu", mu=mu or None)
    (p,) = list(mf.critical_point(arch))
    want = math.sqrt(2 * (1 - mu * mu) / float(SELU_L ** 2 * (1 + SELU_A ** 2)))
    assert p.K_star == 0 and p.sigma_b == 0
    assert p.sigma_w == pytest.approx(want, rel=1e-14)


# -- Monte Carlo in plain torch (not meanfield.torch) ------------------------------------------
def _mc(width, depth, n_init, mu, sw, sb, seed=0):
    torch = pytest.importorskip("torch")

    def norm(a):
        c = a - a.mean(-1, keepdim=True)
        return c / torch.sqrt((c * c).mean(-1, keepdim=True))

    def gelu(a):
        return 0.5 * a * (1 + torch.erf(a / math.sqrt(2.0)))

    g = torch.Generator().manual_seed(seed)
    K, J = np.empty((n_init, depth)), np.empty((n_init, depth - 1))
    for i in range(n_init):
        x = torch.randn(width, generator=g, dtype=torch.float64)
        x = x / torch.sqrt((x * x).mean())
        h = torch.randn(width, width, generator=g, dtype=torch.float64) * (sw / math.sqrt(width)) @ x \
            + sb * torch.randn(width, generator=g, dtype=torch.float64)
        for l in range(depth):
            K[i, l] = float((h * h).mean())
            if l == depth - 1:
                break
            W = torch.randn(width, width, generator=g, dtype=torch.float64) * (sw / math.sqrt(width))
            b = sb * torch.randn(width, generator=g, dtype=torch.float64)
            v = torch.randn(width, generator=g, dtype=torch.float64)
            h, jv = torch.func.jvp(lambda a: mu * a + norm(gelu(a)) @ W.T + b, (h,), (v,))
            J[i, l] = float((jv * jv).sum() / width)
    return K, J


@pytest.mark.slow
def test_gelu_ln_post_profile_against_independent_monte_carlo():
    """GELU, LayerNorm after the activation, mu = 0.7, (1.37, 0.23): K^l and J^{l,l+1} at depth 24,
    width 512, 24 initialisations, within 4.5 standard errors plus a finite-width allowance of
    2 / width relative per layer of depth (the O(1/N) corrections accumulate along the depth)."""
    width, depth, n = 512, 24, 24
    K, J = _mc(width, depth, n, 0.7, 1.37, 0.23)
    prof = mf.kernel_profile(mf.Architecture("gelu", norm="ln_post", mu=0.7), sigma_w=1.37, sigma_b=0.23,
                             depth=depth)
    Kt, Jt = np.asarray(prof.K), np.asarray(prof.chi_J)[: depth - 1]
    for mc, th in ((K, Kt), (J, Jt)):
        m, se = mc.mean(0), mc.std(0, ddof=1) / math.sqrt(n)
        allow = 2.0 * np.arange(1, len(th) + 1) / width * np.abs(th)
        assert np.all(np.abs(m - th) <= 4.5 * se + allow), (m, th, se)
    # Deep layers (l >= 10), where chi_J^l has settled at chi_J*: per initialisation the mean over
    # layers is one sample, so the standard error across initialisations is honest. This pooled
    # check can fail: a 3% error in chi_J* (e.g. a LayerNorm factor 1/Var[phi] taken as 1/E[phi^2])
    # is outside it.
    deep = J[:, 9:].mean(1)
    m, se = deep.mean(), deep.std(ddof=1) / math.sqrt(n)
    th = Jt[9:].mean()
    allow = 2.0 / width * th
    assert abs(m - th) <= 4.5 * se + allow, (m, th, se)
    assert abs(m - 1.03 * th) > 4.5 * se + allow, (m, th, se)
