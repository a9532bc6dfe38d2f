"""The residual block with a projection shortcut, h -> branch(h) + mu shortcut(h) (``residual(...,
shortcut=)``), and the pre-activation ResNet built from it (``resnet_v2``: stages, strided blocks).

Independent routes: the recursion and APJN derived by hand (ReLU's E[phi^2] = K / 2); the 50-digit mpmath
pair recursion of references.gram_pair with the skip a dense layer of its own; Monte Carlo of the torch
realisation at 21 blocks and 256 channels on 8 x 8 images, against the walk over positions.
"""
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
import references.gram_pair as G
from meanfield import symbols as S
from meanfield.gram.tokens import token_jacobians


def test_recursion_and_apjn_add_the_shortcut_times_mu_squared():
    """ReLU branch, dense shortcut: K' = sigma_w^2 K / 2 + sigma_b^2 + mu^2 (sigma_w^2 K + sigma_b^2) and
    chi_J = sigma_w^2 / 2 + mu^2 sigma_w^2 (the cross terms vanish: the branch ends in its own weights)."""
    mu = sp.Rational(3, 5)
    rec = mf.recursion(mf.Network(mf.residual(mf.act("relu"), mf.dense(), shortcut=mf.dense(), mu=mu)))
    K, sw, sb = S.K, S.sigma_w, S.sigma_b
    assert sp.simplify(rec.kernel - (sw**2 * K / 2 + sb**2 + mu**2 * (sw**2 * K + sb**2))) == 0
    assert sp.simplify(rec.chi_J - (sw**2 / 2 + mu**2 * sw**2)) == 0
    # the critical line of that block: sigma_w^2 (1/2 + mu^2) = 1
    line = mf.critical_line(mf.Network(mf.residual(mf.act("relu"), mf.dense(), shortcut=mf.dense(), mu=0.6)),
                            sigma_b=0.3)
    assert line.sigma_w == pytest.approx(1 / np.sqrt(0.5 + 0.36), rel=1e-10)


@pytest.mark.parametrize("act, norm", [("relu", None), ("erf", "ln_pre"), ("gelu", None)])
def test_gram_matrices_with_a_dense_shortcut_equal_the_mpmath_recursion(act, norm):
    """NNGP and NTK (both parameterisations) at depth 6 against 50-digit mpmath, to 1e-12."""
    mu, sw, sb, depth, width = 0.7, 1.2, 0.3, 6, 64
    branch = ([mf.layer_norm()] if norm else []) + [mf.act(act), mf.dense()]
    net = mf.Network(mf.residual(*branch, shortcut=mf.dense(), mu=mu))
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal(5), 1.7 * rng.standard_normal(5)
    K, T, Ts = (float(v) for v in G.recursion(x, y, act, norm, mu, depth, sw, sb, width, shortcut=True)[depth])
    a = mf.kernels(net, x[None], y[None], depth=depth, sigma_w=sw, sigma_b=sb)
    b = mf.kernels(net, x[None], y[None], depth=depth, sigma_w=sw, sigma_b=sb, parameterization="standard",
                   width=width, get="ntk")
    assert a.nngp[0, 0] == pytest.approx(K, rel=1e-12)
    assert a.ntk[0, 0] == pytest.approx(T, rel=1e-12)
    assert b.ntk[0, 0] == pytest.approx(Ts, rel=1e-12)


def test_a_shortcut_around_batch_norm_walks_the_whole_batch():
    """BatchNorm in the branch: the batch walk maps the skip through the shortcut too; NNGP and NTK of a
    batch of 4 at depth 5 against the 50-digit mpmath batch recursion, to 1e-11."""
    import references.gram_batch_tokens as B

    net = mf.Network(mf.residual(mf.batch_norm(), mf.act("relu"), mf.dense(), shortcut=mf.dense(), mu=0.7))
    X = np.random.default_rng(3).standard_normal((4, 5))
    K, T = (np.array(M, dtype=float) for M in B.batch_recursion(X, "relu", 5, 1.4, 0.3, mu=0.7, shortcut=True))
    r = mf.kernels(net, X, depth=5, sigma_w=1.4, sigma_b=0.3)
    np.testing.assert_allclose(r.nngp, K, rtol=1e-11)
    np.testing.assert_allclose(r.ntk, T, rtol=1e-11)


def test_summands_on_different_positions_are_refused_by_name():
    with pytest.raises(ValueError, match=r"strides the positions by 2 and the skip by 1.*stride=2"):
        mf.residual(mf.act("relu"), mf.conv((3, 3), stride=2))
    with pytest.raises(ValueError, match=r"strides the positions by 2 and the shortcut by 4"):
        mf.residual(mf.act("relu"), mf.conv((3, 3), stride=2), shortcut=mf.conv((1, 1), stride=4))
    # 'valid' padding shrinks the map without a stride: found when the positions are known
    net = mf.Network(mf.residual(mf.act("relu"), mf.conv((3, 3), padding="valid"), mu=0.5))
    with pytest.raises(ValueError, match=r"maps the positions \(6, 6\) to \(4, 4\), the skip to \(6, 6\)"):
        mf.kernels(net, np.ones((1, 6, 6, 2)), depth=2, sigma_w=1.0, sigma_b=0.0)


def test_the_shortcut_must_end_in_a_gaussian_preactivation():
    with pytest.raises(ValueError, match=r"shortcut.*Gaussian|not followed by a dense layer"):
        mf.Network(mf.residual(mf.act("relu"), mf.dense(), shortcut=[mf.dense(), mf.act("relu")]))


def test_a_tree_with_shortcuts_round_trips_through_json_and_its_repr():
    tree = mf.resnet_v2((1, 2), phi="gelu", mu=0.9, padding="circular")
    net = mf.Network(tree)
    assert mf.from_json(mf.to_json(net)) == net
    names = {n: getattr(mf, n) for n in ("serial", "residual", "layer_norm", "act", "conv")}
    assert eval(repr(tree), names) == tree
    assert "shortcut=serial(layer_norm(axis='positions'), act('gelu'), conv((1, 1), stride=2))" in repr(tree)


def test_resnet_v2_refuses_bad_arguments_by_name():
    for kwargs, says in ((dict(blocks=()), "blocks must be a sequence"), (dict(blocks=(2, 0)), "blocks\\[1\\]"),
                         (dict(norm="bn"), "norm='bn'"), (dict(kernel_size=2), "kernel_size=2"),
                         (dict(padding="valid"), "padding='valid'"), (dict(dims=3), "dims=3")):
        with pytest.raises(ValueError, match=says):
            mf.resnet_v2(**kwargs)


def test_resnet_v2_has_stages_of_halved_maps():
    """Three stages on 8 x 8: the positions go 8 x 8 -> 4 x 4 -> 2 x 2, the per-position profile of the last
    block has 4 entries, and with circular padding every position of a stage is alike."""
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 3))
    st = mf.kernels(mf.Network(mf.resnet_v2((1, 1, 1), mu=0.9)), x, depth=2, sigma_w=1.2, sigma_b=0.1,
                    readout="flatten")
    assert st.nngp.shape == (1, 1)
    out = token_jacobians(mf.Network(mf.resnet_v2((1, 1, 1), mu=0.9, padding="circular")), x, 1, 1.2, 0.1)
    assert out["profile"].shape == (1, 4)


def _mc_against_theory(net, depth_blocks, sw, sb, width=256, n_init=16, seed=0):
    from meanfield.verification import monte_carlo
    from meanfield.verification._batched import make_inputs

    r = monte_carlo(net, sw, sb, depth=2, width=width, n_init=n_init, tokens=(8, 8), seed=seed, device="cpu")
    x, _ = make_inputs(1, 64, r.input_dim, 0.0, seed)
    image = x.numpy().reshape(1, 8, 8, -1)
    chi = token_jacobians(net, image, 1, sw, sb)["chi_J"][0, 0]
    K = mf.kernels(net, image, depth=2, sigma_w=sw, sigma_b=sb, get=("nngp",), readout="flatten").nngp[0, 0]
    # the suite's rule, with l the number of blocks between h^1 and the output
    tol = 2.0 * depth_blocks / width
    return [(name, mc, se, th, abs(mc - th) / se, abs(mc - th) <= 4 * se + tol * abs(th))
            for name, mc, se, th in (("J^{1,2}", r.chi_J[0], r.chi_J_se[0], chi), ("K", r.K[1], r.K_se[1], K))]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("phi, padding, mu", [("relu", "same", 0.8), ("erf", "circular", 1.0),
                                              ("gelu", "same", 0.5)])
def test_a_staged_resnet_of_21_blocks_follows_the_walk_over_positions(phi, padding, mu):
    """ResNetV2 with three stages of 7 blocks (8 x 8 -> 4 x 4 -> 2 x 2, two projection shortcuts), 256
    channels, 16 initialisations: K at the output and the APJN J^{1,2} of the whole body against the walk
    over positions, within 4 SE + 2 l / width relative (l = 21). Measured (MC +- SE vs theory): relu
    J 0.532 +- 0.044 vs 0.467, K 1.057 +- 0.016 vs 1.061; erf (mu = 1) J 32.8 +- 1.2 vs 34.8, K 6.40 +- 0.06 vs
    6.36; gelu J 1.21 +- 0.10 vs 1.208, K 0.443 +- 0.006 vs 0.439 (max |z| 1.6)."""
    pytest.importorskip("torch")
    net = mf.Network(mf.resnet_v2((7, 7, 7), phi=phi, padding=padding, mu=mu))
    rows = _mc_against_theory(net, 21, 1.3, 0.1)
    assert all(ok for *_, ok in rows), rows


@pytest.mark.parametrize("sw2", [2.0, 3.0])
def test_strided_stages_do_not_order_a_circular_resnet(sw2):
    """Which ingredient orders the LayerNorm ResNet: not the strided stages. On a homogeneous input (orthogonal
    positions of equal norm) with circular padding, ReLU, sigma_b = 0, every block inside a stage tends to
    chi_J = 1, as in the MLP; the projection block alone has the factor derived by hand: after LayerNorm and
    ReLU both of its summands give sigma_w^2 / (2 K), so chi = (1 + mu^2) sigma_w^2 / (2 K*) with the previous
    stage's K* = sigma_w^2 / (2 (1 - mu^2)): 1 - mu^4, once per stage."""
    mu, d = 0.5, 64
    q = np.linalg.qr(np.random.default_rng(0).standard_normal((d, d)))[0]
    x = (np.sqrt(d) * q).reshape(1, 8, 8, d)
    net = mf.Network(mf.resnet_v2((10, 10, 10), mu=mu, padding="circular"))
    chi = token_jacobians(net, x, 1, np.sqrt(sw2), 0.0, per_layer=True)["chi_J"][:, 0]
    assert np.allclose(chi[[9, 19, 29]], 1.0, atol=2e-5)
    assert np.allclose(chi[[10, 20]], 1 - mu**4, atol=2e-6)
