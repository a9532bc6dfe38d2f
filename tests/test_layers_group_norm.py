"""GroupNorm (meanfield.layers.norms.GroupNorm): its rules against closed forms, its torch realisation
against torch's own F.group_norm, and Monte Carlo deep and wide.

References, none taken from the package:
* ReLU after a pre-activation GroupNorm: the normalised preactivation is N(0, 1), so
  K' = sigma_w^2 / 2 + sigma_b^2 and chi_J = sigma_w^2 E[relu'^2] / K = sigma_w^2 / (2 K);
* the pair: the arc-cosine kernel of degree 1 (Cho & Saul 2009) at the correlation
  rho = K12 / sqrt(K1 K2) of the group-normalised inputs,
  E[relu(u) relu(v)] = (sqrt(1 - rho^2) + (pi - arccos rho) rho) / (2 pi);
* torch.nn.functional.group_norm and torch.func.jvp for the realisation.
"""
import math

import numpy as np
import pytest

import meanfield as mf
from meanfield.layers import GroupNorm, group_norm


def _relu_gn_net(groups=4):
    return mf.Network(mf.serial(group_norm(groups), mf.act("relu"), mf.dense()))


def test_fixed_point_and_chi_match_the_closed_form():
    sw, sb = 1.7, 0.4
    net = _relu_gn_net()
    K_star = sw**2 / 2 + sb**2
    fp = mf.fixed_point(net, sigma_w=sw, sigma_b=sb)
    assert float(np.asarray(fp)) == pytest.approx(K_star, rel=1e-12)
    assert float(mf.chi_J(net, sigma_w=sw, sigma_b=sb)) == pytest.approx(sw**2 / (2 * K_star), rel=1e-12)
    rec = mf.recursion(net)
    for K in (0.3, 1.0, 4.2):
        v = rec.evaluate(K=K, sigma_w=sw, sigma_b=sb)
        assert float(v.kernel) == pytest.approx(K_star, rel=1e-13)
        assert float(v.chi_J) == pytest.approx(sw**2 / (2 * K), rel=1e-13)


def _arccos1(rho):
    rho = np.clip(rho, -1.0, 1.0)
    return (np.sqrt(1 - rho**2) + (np.pi - np.arccos(rho)) * rho) / (2 * np.pi)


def test_nngp_matches_the_arc_cosine_kernel():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(5, 16)) * rng.uniform(0.3, 2.0, size=(5, 1))
    sw, sb, depth = 1.3, 0.2, 4
    r = mf.kernels(_relu_gn_net(), x, depth=depth, sigma_w=sw, sigma_b=sb, get="nngp")
    K = sw**2 * (x @ x.T) / x.shape[1] + sb**2  # the input layer
    for _ in range(depth - 1):
        d = np.sqrt(np.diag(K))
        K = sw**2 * _arccos1(K / np.outer(d, d)) + sb**2
    np.testing.assert_allclose(r.nngp, K, rtol=1e-12)


def test_spec_round_trips_and_bad_input():
    net = _relu_gn_net(8)
    assert repr(net.block) == "serial(group_norm(8), act('relu'), dense())"
    assert eval(repr(net.block), {n: getattr(mf, n) for n in mf.__all__}) == net.block
    assert mf.from_json(mf.to_json(net)).block == net.block
    for bad in (0, -2, 1.5, "4", True):
        with pytest.raises(ValueError, match="groups"):
            group_norm(bad)
    with pytest.raises(ValueError, match="features"):
        GroupNorm(axis="tokens", groups=2)


torch = pytest.importorskip("torch")


def test_torch_realisation_is_group_norm_with_its_jvp():
    from meanfield.torch.context import Context
    from meanfield.torch.networks import realise

    g = torch.Generator().manual_seed(0)
    I, P, B, T, N, G = 2, 3, 4, 1, 24, 6
    h = torch.randn(I, P, 1, B, T, N, generator=g, dtype=torch.float64)
    t = torch.randn(I, P, 2, B, T, N, generator=g, dtype=torch.float64)
    layer = realise(mf.serial(group_norm(G), mf.act("relu"), mf.dense()).layers[0])
    ctx = Context(None, {"sigma_w": np.ones(P)}, "cpu", torch.float64, seed=0, init_ids=range(I))
    out = layer(torch.cat([h, t], dim=2), ctx)

    def ref(v):  # torch's GroupNorm on (rows, channels), no affine part, no epsilon
        return torch.nn.functional.group_norm(v.reshape(-1, N), G, eps=0.0).reshape(v.shape)

    torch.testing.assert_close(out[:, :, :1], ref(h), rtol=1e-12, atol=1e-12)
    for k in range(2):
        _, tangent = torch.func.jvp(ref, (h,), (t[:, :, k:k + 1],))
        torch.testing.assert_close(out[:, :, 1 + k:2 + k], tangent, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="multiple"):
        realise(group_norm(5))(h, ctx)


@pytest.mark.slow
def test_monte_carlo_deep_and_wide():
    """depth 20, width 512, 4 groups of 128: K^l and chi_J^l within the suite's rule, with the group size
    N / groups as the finite-width scale (|MC - theory| <= 4 SE + 2 l groups / N |theory|)."""
    from meanfield.verification import monte_carlo
    from meanfield.verification._theory import theory_profile

    groups, width, depth = 4, 512, 20
    net = mf.Network(mf.residual(group_norm(groups), mf.act("gelu"), mf.dense()), mu=0.8)
    sw, sb = 1.4, 0.2
    r = monte_carlo(net, sw, sb, depth=depth, width=width, n_init=16, device="cpu", seed=5)
    th = theory_profile(net, sw, sb, depth)
    layers = np.arange(1, depth + 1)
    for q, mc, se, t in (("K", r.K, r.K_se, th["K"]), ("chi_J", r.chi_J, r.chi_J_se, th["chi_J"][:depth])):
        tol = 4 * se + 2 * layers * groups / width * np.abs(t)
        bad = np.abs(mc - t) > tol
        assert not bad.any(), (q, layers[bad], mc[bad], t[bad], se[bad])
    assert math.isfinite(float(r.chi_J[-1]))
