"""Fixed points and APJN operators of trees over positions (``position_fixed_point``,
``position_phase_diagram``): the one-block factor chi_J and the growth rate rho of J^{l0,l}.

Independent routes: closed forms derived by hand (a circular ReLU chain is the MLP: chi = rho =
sigma_w^2 / 2, K* = sigma_b^2 / (1 - sigma_w^2 / 2); the zero-padded LayerNorm ResNet's chi_J* in
tests/references); the growth rate of the cumulative walk ``token_jacobians`` over hundreds of blocks (another
algorithm than the power iteration); Monte Carlo of J^{1,l} at 30 blocks x 256 channels.
"""
import numpy as np
import pytest
import references as R

import meanfield as mf
from meanfield.gram.tokens import token_jacobians


def _resnet(mu, phi="relu", convs=2, padding="same"):
    norm = mf.layer_norm(axis="positions")
    layers = []
    for _ in range(convs):
        layers += [norm, mf.act(phi), mf.conv((3, 3), padding=padding)]
    return mf.Network(mf.residual(*layers, mu=mu))


def test_a_circular_relu_chain_is_the_mlp():
    sw, sb = 1.0, 0.5
    r = mf.position_fixed_point(mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 3), padding="circular"))),
                                (6, 6), sw, sb)
    assert r.converged and r.phase == "ordered"
    assert r.chi_J == pytest.approx(sw**2 / 2, rel=1e-12)
    assert r.spectral_radius == pytest.approx(sw**2 / 2, rel=1e-10)
    np.testing.assert_allclose(r.K, sb**2 / (1 - sw**2 / 2), rtol=1e-11)
    assert r.xi == pytest.approx(1 / np.log(2), rel=1e-9)


@pytest.mark.parametrize("mu", [0.0, 0.5, 0.9])
def test_the_layernorm_resnet_loses_per_block_but_not_across_blocks(mu):
    """ReLU, sigma_b = 0, zero padding, LayerNorm over (C, H, W): chi_J is the closed form
    mu^2 + (1 - mu^2) (1' P^2 1 / T) / lambda_max(P)^2 < 1, while the growth rate of J^{l0,l} is exactly 1:
    the Jacobian map's dominant eigenvector is the fixed point's variance profile (P's Perron vector)."""
    r = mf.position_fixed_point(_resnet(mu), (8, 8), np.sqrt(2.0), 0.0)
    assert r.chi_J == pytest.approx(float(R.ln_resnet_chi_star((8, 8), 2, mu)), rel=1e-10)
    assert abs(r.spectral_radius - 1) < 1e-9 and r.phase == "critical"
    np.testing.assert_allclose(r.mode, r.K / r.K.mean(), rtol=1e-6)


@pytest.mark.parametrize("net, sw, sb", [
    (mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 3)))), 1.3, 0.3),
    (_resnet(0.5, convs=1), 1.3, 0.3),
    (_resnet(0.5, "gelu", convs=1), 1.3, 0.0),
    (mf.Network(mf.residual(mf.act("erf"), mf.avg_pool((3, 3), stride=1, padding="same"), mf.conv((3, 3)),
                            mu=0.7)), 1.6, 0.2),
], ids=["relu-chain", "ln-resnet-bias", "gelu-ln-resnet", "erf-pool"])
def test_the_spectral_radius_is_the_growth_rate_of_the_walk(net, sw, sb):
    """rho from power iteration equals (J^{1,L} / J^{1,L-100})^(1/100) of the cumulative walk at L = 400."""
    r = mf.position_fixed_point(net, (6, 6), sw, sb)
    x = np.random.default_rng(0).standard_normal((1, 6, 6, 36))
    J = token_jacobians(net, x, 400, sw, sb)["J"][:, 0]
    assert r.spectral_radius == pytest.approx((J[-1] / J[-101]) ** (1 / 100), rel=1e-9)


def test_a_phase_diagram_over_positions():
    out = mf.position_phase_diagram(_resnet(0.5, "gelu", convs=1), (6, 6), [1.3], [0.0, 0.3])
    assert out["phase"].shape == (1, 2) and out["spectral_radius"].shape == (1, 2)
    for rho, phase in zip(out["spectral_radius"].ravel(), out["phase"].ravel()):
        assert phase == ("ordered" if rho < 1 - 1e-6 else "chaotic" if rho > 1 + 1e-6 else "critical")


def test_bad_arguments_are_value_errors_naming_them():
    with pytest.raises(ValueError, match="grid=\\(8,\\).*2 position axes"):
        mf.position_fixed_point(_resnet(0.5), 8, 1.0, 0.0)
    with pytest.raises(ValueError, match="changes the positions has no fixed point"):
        mf.position_fixed_point(mf.Network(mf.resnet_v2((1, 1), mu=0.5)), (8, 8), 1.0, 0.0)
    with pytest.raises(ValueError, match="mu"):
        mf.position_fixed_point(mf.Network(mf.resnet_v2((1,))), (8, 8), 1.0, 0.0)
    with pytest.raises(ValueError, match="no positions"):
        mf.position_fixed_point(mf.Architecture("relu"), (8,), 1.0, 0.0)
    with pytest.raises(ValueError, match="sigma_w"):
        mf.position_fixed_point(_resnet(0.5), (8, 8), -1.0, 0.0)
    with pytest.raises(ValueError, match="1-D sigma_w"):
        mf.position_phase_diagram(_resnet(0.5), (8, 8), [[1.0]], [0.0])


def test_a_walk_that_does_not_settle_is_undetermined():
    r = mf.position_fixed_point(_resnet(1.0), (8, 8), np.sqrt(2.0), 0.0, max_blocks=50)
    assert not r.converged and r.phase == "undetermined" and np.isnan(r.spectral_radius)


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_grows_where_the_one_block_factor_says_ordered():
    """GELU, LayerNorm over positions, zero padding, mu = 0.5, sigma_b = 0 on 8 x 8: chi_J = 0.933 < 1 but
    rho = 1.048. Monte Carlo (30 blocks, 256 channels, 16 initialisations): the per-block factor J^{l,l+1}
    with fresh probes stays below 1, while J^{1,l} grows with l, as the walk says (the suite's rule at every
    layer). Measured: J^{1,30} / J^{1,10} = 2.9 (walk 2.66; the product of the one-block factors would give
    0.25)."""
    from meanfield.verification import monte_carlo
    from meanfield.verification.montecarlo import make_inputs

    net, sw, depth, width = _resnet(0.5, "gelu", convs=1), 1.3, 30, 256
    fp = mf.position_fixed_point(net, (8, 8), sw, 0.0)
    assert fp.chi_J < 0.94 and fp.spectral_radius > 1.04
    r = monte_carlo(net, sw, 0.0, depth=depth, width=width, n_init=16, tokens=(8, 8), seed=2, device="cpu")
    x, _ = make_inputs(1, 64, r.input_dim, 0.0, 2)
    J = token_jacobians(net, x.numpy().reshape(1, 8, 8, -1), depth, sw, 0.0)["J"][:, 0]
    layers = np.arange(1, depth + 1)
    assert np.all(np.abs(r.J - J) <= 4 * r.J_se + 2 * layers / width * J)
    assert np.all(r.chi_J[10:] < 1)
    assert r.J[-1] / r.J[9] > 2.0
