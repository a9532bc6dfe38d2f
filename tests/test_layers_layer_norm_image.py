"""LayerNorm over the channels and positions of each input (LayerNormImage, layer_norm(axis='positions')).

Independent routes: on inputs equal in law at every position, the scalar LayerNorm recursion of the solvers
(numba ``kernel_profile``); the torch realisation against ``torch.nn.functional.layer_norm`` and its JVP;
Monte Carlo at depth 20 and 512 channels.
"""
import numpy as np
import pytest

import meanfield as mf
from meanfield import kernels
from meanfield.gram.tokens import token_state

DEEP, WIDE = 20, 512


def _pre(padding="same"):
    return mf.Network(mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv(3, padding=padding),
                                  mu=0.9))


def _post(padding="same"):
    return mf.Network(mf.residual(mf.act("gelu"), mf.layer_norm(axis="positions"), mf.conv(3, padding=padding),
                                  mu=0.7))


def test_the_solvers_see_the_feature_layer_norm():
    """On homogeneous positions the map is LayerNorm's (class notes): same recursion, same chi_J."""
    for ours, ref in ((_pre("circular"), mf.Network(mf.residual(mf.layer_norm(), mf.act("relu"), mf.dense(), mu=0.9))),
                      (_post("circular"), mf.Network(mf.residual(mf.act("gelu"), mf.layer_norm(), mf.dense(),
                                                                 mu=0.7)))):
        a, b = mf.recursion(ours), mf.recursion(ref)
        assert a.kernel == b.kernel and a.kernel12 == b.kernel12 and a.chi_J == b.chi_J


@pytest.mark.slow
@pytest.mark.parametrize("build", [_pre, _post], ids=["pre", "post"])
def test_homogeneous_images_follow_the_single_input_recursion(build):
    """Two images of 4 x 3 pixels with equal norms and one overlap at every pixel, circular 3 x 3 convolutions:
    every pixel's variance and same-pixel covariance are the scalar recursion's K^l, K12^l (1e-13)."""
    from meanfield.verification._theory import theory_profile

    rng = np.random.default_rng(5)
    H, W, d, rho = 4, 3, 5, 0.5
    x = np.zeros((2, H * W, d))
    for t in range(H * W):
        u, v = np.linalg.qr(rng.standard_normal((d, 2)))[0].T
        x[0, t], x[1, t] = u * np.sqrt(d), (rho * u + np.sqrt(1 - rho**2) * v) * np.sqrt(d)
    net = build("circular")
    block = net.block_spec()
    net2 = mf.Network(mf.residual(*block.branch.layers[:-1], mf.conv((3, 3), padding="circular"), mu=block.mu))
    sw, sb, depth = 1.2, 0.3, 7
    st = token_state(net2, x.reshape(2, H, W, d), depth, sw, sb)
    th = theory_profile(net, sw, sb, depth, K0=sw**2 + sb**2, K12_0=sw**2 * rho + sb**2)
    np.testing.assert_allclose(np.einsum("atat->at", st["A"]), th["K"][-1], rtol=1e-13)
    np.testing.assert_allclose(np.einsum("tt->t", st["A"][0, :, 1, :]), th["K12"][-1], rtol=1e-13)


def test_each_input_comes_out_with_unit_variance_over_its_pixels():
    """Zero padding, so the variances differ across positions: the normalised signal of each input has mean
    variance 1 over its positions (its mean over channels and positions is removed and it is divided by the
    standard deviation over both)."""
    x = np.random.default_rng(6).standard_normal((3, 7, 4))
    net = mf.Network(mf.serial(mf.act("relu"), mf.conv(3), mf.layer_norm(axis="positions"), mf.act("tanh"),
                               mf.conv(3)))
    st = token_state(net, x, 2, 1.3, 0.4)
    assert np.ptp(np.einsum("atat->at", st["A"]), axis=1).min() > 1e-3      # the positions do differ
    from meanfield.layers import LayerNormImage, TokenSignal
    out = LayerNormImage().gram_tokens(TokenSignal(st["A"], st["B"], st["TA"], st["TB"], False), None)
    np.testing.assert_allclose(np.einsum("atat->a", out.A) / 7, 1.0, rtol=1e-14)


def test_position_must_be_auto_and_the_json_round_trips():
    with pytest.raises(ValueError, match="leave position='auto'"):
        mf.layer_norm("pre", axis="positions")
    with pytest.raises(ValueError, match="axis"):
        mf.layer_norm(axis="pixels")
    net = _post()
    assert repr(net.block_spec().branch.layers[1]) == "layer_norm(axis='positions')"
    assert mf.from_json(mf.to_json(net)).block_spec() == net.block_spec()


@pytest.mark.torch
def test_torch_realisation_is_layer_norm_over_positions_and_channels():
    """torch_forward against F.layer_norm over the last two axes (primal) and its JVP (tangent slot)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(2)
    h = torch.randn(2, 1, 3, 5, 4, generator=g, dtype=torch.float64)
    t = torch.randn(2, 1, 3, 5, 4, generator=g, dtype=torch.float64)
    z = torch.stack([h, t], dim=2)                                            # (I, P, S=2, B, T, N)
    y = mf.layer_norm(axis="positions").torch_forward(z, None)

    def ln(v):
        return F.layer_norm(v, v.shape[-2:], eps=0.0)

    primal, tangent = torch.func.jvp(ln, (h,), (t,))
    torch.testing.assert_close(y[:, :, 0], primal, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y[:, :, 1], tangent, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("build", [_pre, _post], ids=["pre", "post"])
def test_monte_carlo_deep_wide(build):
    """Zero-padded convolutions, depth 20, 512 channels, 8 positions, 3 inputs, 8 initialisations: every entry
    of the NNGP within 4.5 SE and of the NTK within 4.5 SE + 4 depth/width.
    Measured max |z| (NNGP, NTK): pre 0.6, 0.5; post 2.7, 2.1 (SE 3-9 %); the post network's NTK with
    three other seeds of 16 initialisations: z of both signs, |z| <= 1.7 (no bias)."""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8, 4)) * rng.uniform(0.6, 1.6, (3, 1, 1))
    kw = dict(depth=DEEP, sigma_w=1.4, sigma_b=0.2)
    net = build()
    e = empirical_kernels(net, x, width=WIDE, n_init=8, n_outputs=2, seed=4, **kw)
    r = kernels(net, x, **kw)
    assert np.all(np.abs(e.nngp - r.nngp) <= 4.5 * e.nngp_se)
    assert np.all(np.abs(e.ntk - r.ntk) <= 4.5 * e.ntk_se + 4 * DEEP / WIDE * np.abs(r.ntk))
