"""Partial Jacobians over positions (meanfield.gram.tokens.token_jacobians): the APJN of convolutional, pooled
and token networks from the Jacobian between positions that the primitives map.

Independent routes: on positions equal in law, the solvers' scalar chi_J and J (numba ``kernel_profile``);
Monte Carlo of J^{l,l+1} and J^{1,l} on realised networks (Hutchinson estimator) at depth 20, 512 channels,
on the same inputs; for the zero-padded LayerNorm ResNet, chi_J* derived by hand
(``references.ln_resnet_chi_star``).
"""
import numpy as np
import pytest
import references as R

import meanfield as mf
from meanfield.gram.tokens import token_jacobians

DEEP, WIDE = 20, 512


@pytest.mark.parametrize("net", [
    mf.Network(mf.residual(mf.act("tanh"), mf.conv(3, padding="circular"), mu=0.9)),
    mf.Network(mf.residual(mf.layer_norm(axis="positions"), mf.act("gelu"), mf.conv(5, padding="circular",
                                                                                    dilation=2), mu=0.8)),
], ids=["tanh", "ln-gelu"])
def test_homogeneous_positions_give_the_scalar_apjn(net):
    """Inputs equal at every position, circular padding: J^{l,l+1} and J^{1,l} are the scalar recursion's."""
    from meanfield.verification._theory import theory_profile

    r = token_jacobians(net, np.ones((1, 6, 4)), 8, 1.3, 0.2)
    th = theory_profile(net, 1.3, 0.2, 8)
    np.testing.assert_allclose(r["chi_J"][:, 0], th["chi_J"][:8], rtol=1e-13)
    np.testing.assert_allclose(r["J"][:, 0], th["J"][:8], rtol=1e-12)
    np.testing.assert_allclose(r["profile"][0], r["chi_J"][-1, 0], rtol=1e-13)


def test_zero_padding_lowers_the_edge_factor():
    """A convolution of kernel 3 with zero padding: an edge position sums 2 of the 3 taps, so one layer's factor
    at the edge is 2/3 of the middle's (tanh after the input layer, whose positions share one variance)."""
    net = mf.Network(mf.serial(mf.act("tanh"), mf.conv(3)))
    r = token_jacobians(net, np.ones((1, 7, 4)), 1, 1.3, 0.0)
    p = r["profile"][0]
    np.testing.assert_allclose(p[0] / p[3], 2 / 3, rtol=1e-13)
    np.testing.assert_allclose(p[1:-1], p[3], rtol=1e-13)


def _ln_resnet(grid, convs, mu, norm_axis="positions", padding="same"):
    """h -> mu h + branch(h), the branch ``convs`` times (LayerNorm, ReLU, 3-tap or 3 x 3 convolution)."""
    norm = mf.layer_norm(axis="positions") if norm_axis == "positions" else mf.layer_norm()
    k = 3 if len(grid) == 1 else (3, 3)
    return mf.Network(mf.residual(*[norm, mf.act("relu"), mf.conv(k, padding=padding)] * convs, mu=mu))


LN_RESNETS = [((6, 6), 1, 0.0), ((5, 7), 2, 0.5), ((7,), 1, 0.3), ((8, 8), 2, 0.9)]


@pytest.mark.parametrize("grid, convs, mu", LN_RESNETS)
def test_layer_norm_over_positions_with_zero_padding_is_ordered_away_from_mu_1(grid, convs, mu):
    """ReLU, sigma_b = 0, LayerNorm over (channels, positions), zero padding: chi_J* = mu^2 + (1 - mu^2) rho with
    rho < 1 from the padded tap mean's Perron vector (the hand derivation in references.ln_resnet_chi_star),
    at any sigma_w: the partial-Jacobian paper's ordered LayerNorm ResNet away from mu = 1."""
    x = np.random.default_rng(1).standard_normal((1,) + grid + (5,))
    chi = token_jacobians(_ln_resnet(grid, convs, mu), x, 200, 1.7, 0.0)["chi_J"][-1, 0]
    expected = float(R.ln_resnet_chi_star(grid, convs, mu))
    np.testing.assert_allclose(chi, expected, rtol=1e-10)   # 200 blocks: mu = 0.9 settles to ~2e-11
    assert chi < 1 - 0.02 * (1 - mu**2)


@pytest.mark.parametrize("norm_axis, padding", [("features", "same"), ("positions", "circular")])
@pytest.mark.parametrize("grid, convs, mu", LN_RESNETS)
def test_per_position_norm_or_circular_padding_keeps_it_critical(grid, convs, mu, norm_axis, padding):
    """The two controls: a LayerNorm per position (over the channels) or circular padding gives chi_J* = 1 at
    sigma_b = 0 for every mu, the pre-LN ReLU MLP's everywhere-critical line (each position's variance
    cancels its own Jacobian factor; with wrapped edges every position is the middle)."""
    x = np.random.default_rng(1).standard_normal((1,) + grid + (5,))
    chi = token_jacobians(_ln_resnet(grid, convs, mu, norm_axis, padding), x, 200, 1.7, 0.0)["chi_J"][-1, 0]
    np.testing.assert_allclose(chi, 1.0, rtol=1e-10)


CASES = {
    "conv-same-tanh": (mf.Network(mf.residual(mf.act("tanh"), mf.conv(3), mu=0.9)), 1.3, 0.2),
    "ln-image-relu": (mf.Network(mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv(3), mu=0.7)),
                      1.4, 0.1),
    "pool-chain": (mf.Network(mf.serial(mf.act("erf"), mf.avg_pool(3, stride=1, padding="same"), mf.conv(3))),
                   1.6, 0.2),
    "pool-residual": (mf.Network(mf.residual(mf.act("gelu"), mf.avg_pool(3, stride=1, padding="same"), mf.conv(3),
                                             mu=0.8)), 1.3, 0.1),
    "resmlp": (mf.Architecture("erf", block="resmlp", mu=1.0, eps=0.5), 1.2, 0.0),
}


def _measured(name):
    pytest.importorskip("torch")
    from meanfield.verification import monte_carlo
    from meanfield.verification._batched import make_inputs

    net, sw, sb = CASES[name]
    r = monte_carlo(net, sw, sb, depth=DEEP, width=WIDE, n_init=16, tokens=8, seed=3, device="cpu")
    x, _ = make_inputs(1, 8, r.input_dim, 0.0, 3)        # the inputs monte_carlo drew
    return r, token_jacobians(net, x.numpy(), DEEP, sw, sb)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", list(CASES))
def test_monte_carlo_deep_wide(name):
    """J^{l,l+1} and J^{1,l} for l = 1..20 within the suite's rule |MC - theory| <= 4 SE + 2 (l / width)
    |theory|. Measured max |z| (chi_J, J), in the order of CASES: 1.8, 1.7; 3.2, 1.0; 1.5, 1.5; 1.9, 2.1; 2.6, 1.9."""
    r, th = _measured(name)
    layers = np.arange(1, DEEP + 1)
    for q, mc, se, t in (("chi_J", r.chi_J, r.chi_J_se, th["chi_J"][:, 0]), ("J", r.J, r.J_se, th["J"][:, 0])):
        bad = np.abs(mc - t) > 4.0 * se + 2.0 * layers / WIDE * np.abs(t)
        assert not bad.any(), (q, layers[bad], mc[bad], t[bad], se[bad])


@pytest.mark.slow
@pytest.mark.torch
def test_pooling_makes_the_cumulative_jacobian_differ_from_the_product_of_layer_factors():
    """The pooled chain: every per-block factor is below 0.6, so their product over 19 blocks is below 1e-4,
    yet J^{1,20} is ~3, in the theory and on the networks alike: averaging neighbours that share a channel's
    weights adds their gradients coherently (V off the diagonal), which a per-position factor cannot see."""
    r, th = _measured("pool-chain")
    assert th["chi_J"][:, 0].max() < 0.6 and np.prod(th["chi_J"][:-1, 0]) < 1e-4
    assert 2.0 < th["J"][-1, 0] < 4.0
    assert abs(r.J[-1] - th["J"][-1, 0]) <= 4.0 * r.J_se[-1] + 2.0 * DEEP / WIDE * th["J"][-1, 0]


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_zero_padded_layer_norm_resnet_is_ordered():
    """On realised 8 x 8 networks (depth 20, 512 channels, mu = 0.5, ReLU, sigma_b = 0): with LayerNorm over
    (channels, positions) the measured J^{l,l+1} follows the theory layer by layer and its mean over blocks
    11-20 lies below 1 by many standard errors (theory 0.9341 at the fixed point); with a LayerNorm per
    position it is 1 within its error. Measured: 0.934 +- 0.005 and 0.997 +- 0.004."""
    pytest.importorskip("torch")
    from meanfield.verification import monte_carlo
    from meanfield.verification._batched import make_inputs

    sw, grid, tail = np.sqrt(2.0), (8, 8), slice(10, DEEP)
    layers = np.arange(1, DEEP + 1)
    for norm_axis, ordered in (("positions", True), ("features", False)):
        net = _ln_resnet(grid, 1, 0.5, norm_axis)
        r = monte_carlo(net, sw, 0.0, depth=DEEP, width=WIDE, n_init=16, tokens=grid, seed=3, device="cpu")
        x, _ = make_inputs(1, 64, r.input_dim, 0.0, 3)
        th = token_jacobians(net, x.numpy().reshape((1,) + grid + (-1,)), DEEP, sw, 0.0)["chi_J"][:, 0]
        bad = np.abs(r.chi_J - th) > 4.0 * r.chi_J_se + 2.0 * layers / WIDE * th
        assert not bad.any(), (norm_axis, layers[bad], r.chi_J[bad], th[bad])
        per_init = r.samples["chi_J"][:, tail].mean(axis=1)
        mean, se = per_init.mean(), per_init.std(ddof=1) / np.sqrt(len(per_init))
        assert abs(mean - th[tail].mean()) < 4 * se, (norm_axis, mean, se, th[tail].mean())
        assert (1 - mean > 6 * se) if ordered else abs(1 - mean) < 4 * se, (norm_axis, mean, se)


@pytest.mark.slow
def test_stored_ln_resnet_phase_diagrams_follow_the_theory():
    """docs/figures/ln_resnet_phase.json (Monte Carlo of pre-activation BasicBlocks on 8 x 8 maps, depth 20):
    every point of the three planes within the suite's rule of the theory recomputed here; with the LayerNorm
    over (channels, positions) the network is ordered for mu <= 0.5 by more than 4 SE, with the LayerNorm per
    position it is critical within 4 SE for every mu < 1."""
    import importlib.util
    import json
    from pathlib import Path

    here = Path(__file__).resolve().parents[1] / "docs" / "figures"
    spec = importlib.util.spec_from_file_location("ln_resnet_phase", here / "ln_resnet_phase.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = json.loads((here / "ln_resnet_phase.json").read_text())
    th = script.theory_planes(data)
    slack = 2.0 * data["layer"] / data["width"]
    for name in ("mu_positions", "mu_per_position", "sb_mu1"):
        mc, se, t = (np.array(a) for a in (data["planes"][name]["chi_J"], data["planes"][name]["chi_J_se"],
                                           th[name]))
        assert (np.abs(mc - t) <= 4 * se + slack * np.abs(t)).all(), (name, mc, t, se)
    mu = np.array(data["mu"])
    mc, se = (np.array(data["planes"]["mu_positions"][k]) for k in ("chi_J", "chi_J_se"))
    assert (1 - mc[mu <= 0.5] > 4 * se[mu <= 0.5]).all()
    mc, se = (np.array(data["planes"]["mu_per_position"][k]) for k in ("chi_J", "chi_J_se"))
    assert (np.abs(1 - mc[mu < 1]) <= 4 * se[mu < 1] + slack).all()


def test_per_layer_walks_the_top_level_layers_of_a_body():
    """A body of three equal blocks with per_layer=True is the block repeated three times; its K^l are the
    Gram walk's per-layer diagonals (kernels(per_layer=True, readout='flatten'), another driver)."""
    block = mf.residual(mf.layer_norm(axis="positions"), mf.act("gelu"), mf.conv((3, 3)), mu=0.6)
    x = np.random.default_rng(5).standard_normal((2, 5, 5, 3))
    body = token_jacobians(mf.Network(mf.serial(block, block, block)), x, 1, 1.3, 0.2, per_layer=True)
    rep = token_jacobians(mf.Network(block), x, 3, 1.3, 0.2)
    for key in ("chi_J", "J", "K"):
        np.testing.assert_allclose(body[key], rep[key], rtol=1e-13)
    diag = mf.kernels(mf.Network(block), x, depth=3, sigma_w=1.3, sigma_b=0.2, get=("nngp",), per_layer=True,
                      readout="flatten").nngp_diag
    np.testing.assert_allclose(rep["K"], diag, rtol=1e-12)
    assert body["chi_J"].shape == (3, 2)
