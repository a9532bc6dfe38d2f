"""The convolution primitive (meanfield/layers/conv.py): its rules over positions, its scalar reduction, its
torch realisation.

Independent routes:
* kernel size 1 against the MLP Gram matrices of meanfield.gram on the flattened positions (the pair walk,
  which shares none of the token walk's code);
* circular padding on homogeneous inputs against the single-input recursion (numba ``kernel_profile``);
* the torch realisation against ``torch.nn.functional.conv1d`` with the same weights;
* Monte Carlo at depth 20 and 512 channels: the empirical NNGP and NTK of the realised network.
"""
import numpy as np
import pytest

import meanfield as mf
from meanfield import kernels
from meanfield.gram.tokens import token_state

DEEP, WIDE = 20, 512


def _diag(M):
    return np.einsum("atat->at", M)


def test_kernel_size_one_is_the_mlp_on_the_positions():
    """conv(1) mixes the channels of each position only: in both parameterisations the (nT) x (nT) state is
    the MLP Gram matrix of the flattened positions (NNGP and NTK), the readout its mean over positions."""
    rng = np.random.default_rng(2)
    n, T, d = 3, 4, 10
    x = rng.standard_normal((n, T, d)) * rng.uniform(0.5, 2, size=(n, T, 1))
    net = mf.Network(mf.residual(mf.layer_norm(), mf.conv(1), mf.act("gelu"), mf.conv(1), mu=0.6))
    mlp = mf.Network(mf.residual(mf.layer_norm(), mf.dense(), mf.act("gelu"), mf.dense(), mu=0.6))
    for param in ("ntk", "standard"):
        kw = dict(depth=5, sigma_w=1.2, sigma_b=0.3, parameterization=param, width=100.0)
        rows = kernels(mlp, x.reshape(n * T, d), **kw)
        st = token_state(net, x, 5, 1.2, 0.3, parameterization=param, width=100.0)
        for got, want in ((st["A"], rows.nngp), (st["TA"], rows.ntk)):
            np.testing.assert_allclose(got.reshape(n * T, n * T), want, rtol=1e-13)
        pooled = rows.nngp.reshape(n, T, n, T).mean(axis=(1, 3))
        np.testing.assert_allclose(kernels(net, x, **kw).nngp, pooled, rtol=1e-13)
        # the flattened read-out sees each position with itself only: the mean of the same-position entries
        flat = kernels(net, x, readout="flatten", **kw)
        for got, want in ((flat.nngp, rows.nngp), (flat.ntk, rows.ntk)):
            np.testing.assert_allclose(got, np.einsum("atbt->ab", want.reshape(n, T, n, T)) / T, rtol=1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("dilation", [1, 2])
def test_circular_padding_on_homogeneous_inputs_is_the_single_input_recursion(dilation):
    """Two images whose positions all have the same norm and the same overlap rho: with circular padding every
    position's variance is K^l and every same-position cross covariance K12^l of the scalar recursion the
    solvers compile (module notes: the dense layer's rule)."""
    from meanfield.verification._theory import theory_profile

    rng = np.random.default_rng(3)
    T, d, rho = 7, 5, 0.4
    x = np.zeros((2, T, d))
    for t in range(T):
        u, v = np.linalg.qr(rng.standard_normal((d, 2)))[0].T
        x[0, t], x[1, t] = u * np.sqrt(d), (rho * u + np.sqrt(1 - rho**2) * v) * np.sqrt(d)
    net = mf.Network(mf.residual(mf.act("gelu"), mf.conv(3, padding="circular", dilation=dilation), mu=0.7))
    sw, sb, depth = 1.2, 0.3, 8
    st = token_state(net, x, depth, sw, sb)
    th = theory_profile(net, sw, sb, depth, K0=sw**2 + sb**2, K12_0=sw**2 * rho + sb**2)
    assert th["source"] == "meanfield.solvers.kernel_profile"
    np.testing.assert_allclose(_diag(st["A"]), th["K"][-1], rtol=1e-13)
    np.testing.assert_allclose(np.einsum("tt->t", st["A"][0, :, 1, :]), th["K12"][-1], rtol=1e-13)


def test_the_solvers_see_a_dense_layer_through_circular_and_valid_padding():
    """The scalar recursion and chi_J of a circular or valid convolution are the dense layer's (module notes)."""
    ref = mf.recursion(mf.Network(mf.residual(mf.act("erf"), mf.dense(), mu=0.9)))
    for padding in ("circular", "valid"):
        rec = mf.recursion(mf.Network(mf.residual(mf.act("erf"), mf.conv(3, padding=padding), mu=0.9)))
        assert rec.kernel == ref.kernel and rec.kernel12 == ref.kernel12 and rec.chi_J == ref.chi_J


def test_zero_padding_is_refused_by_the_solvers_and_mapped_by_kernels():
    """Zero padding: the edge positions see fewer inputs, so their variance falls below the middle's (ReLU,
    no bias: by a factor 2/3 at the first convolution); the solvers refuse the tree by name."""
    net = mf.Network(mf.serial(mf.act("relu"), mf.conv(3)))
    with pytest.raises(ValueError, match="padding='circular' or 'valid'"):
        mf.critical_line(net, sigma_w=1.0)
    x = np.ones((1, 6, 4))
    st = token_state(net, x, 2, 1.0, 0.0)
    v = _diag(st["A"])[0]
    np.testing.assert_allclose(v[0] / v[2], 2 / 3, rtol=1e-14)
    np.testing.assert_allclose(v[0], v[-1], rtol=1e-14)
    np.testing.assert_allclose(v[1:-1], v[2], rtol=1e-14)


@pytest.mark.slow
def test_2d_circular_padding_on_homogeneous_images_is_the_single_input_recursion():
    """A 3 x 3 circular convolution over 4 x 5 images whose pixels all have the same norm and overlap: every
    pixel's variance is K^l and every same-pixel cross covariance K12^l of the scalar recursion."""
    from meanfield.verification._theory import theory_profile

    rng = np.random.default_rng(4)
    H, W, d, rho = 4, 5, 6, -0.3
    x = np.zeros((2, H, W, d))
    for i in range(H):
        for j in range(W):
            u, v = np.linalg.qr(rng.standard_normal((d, 2)))[0].T
            x[0, i, j], x[1, i, j] = u * np.sqrt(d), (rho * u + np.sqrt(1 - rho**2) * v) * np.sqrt(d)
    net = mf.Network(mf.residual(mf.layer_norm(), mf.act("tanh"), mf.conv((3, 3), padding="circular"), mu=0.8))
    sw, sb, depth = 1.1, 0.2, 6
    st = token_state(net, x, depth, sw, sb)
    th = theory_profile(net, sw, sb, depth, K0=sw**2 + sb**2, K12_0=sw**2 * rho + sb**2)
    np.testing.assert_allclose(_diag(st["A"]), th["K"][-1], rtol=1e-13)
    np.testing.assert_allclose(np.einsum("tt->t", st["A"][0, :, 1, :]), th["K12"][-1], rtol=1e-13)


def test_2d_zero_padding_edges_and_corners():
    """A 3 x 3 convolution with zero padding after ReLU without bias, on constant images: an edge pixel sees 6
    of the 9 taps and a corner 4, so their variances are 6/9 and 4/9 of the middle's."""
    net = mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 3))))
    st = token_state(net, np.ones((1, 4, 5, 2)), 2, 1.0, 0.0)
    v = _diag(st["A"])[0].reshape(4, 5)
    np.testing.assert_allclose(v[0, 0] / v[1, 1], 4 / 9, rtol=1e-14)
    np.testing.assert_allclose(v[0, 2] / v[1, 1], 6 / 9, rtol=1e-14)
    np.testing.assert_allclose(v[2, 0] / v[1, 1], 6 / 9, rtol=1e-14)
    np.testing.assert_allclose(v[1:-1, 1:-1], v[1, 1], rtol=1e-14)


def test_a_column_kernel_on_a_column_grid_is_the_1d_convolution():
    """conv((k, 1)) over (T, 1) images is conv(k) over T positions, NNGP and NTK."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 7, 4))
    kw = dict(depth=4, sigma_w=1.3, sigma_b=0.2)
    for padding, dilation in (("same", 1), ("circular", 2), ("valid", 1)):
        one = mf.Network(mf.serial(mf.act("gelu"), mf.conv(3, padding=padding, dilation=dilation)))
        two = mf.Network(mf.serial(mf.act("gelu"), mf.conv((3, 1), padding=padding, dilation=dilation)))
        a, b = kernels(one, x, **kw), kernels(two, x[:, :, None, :], **kw)
        np.testing.assert_allclose(b.nngp, a.nngp, rtol=1e-14)
        np.testing.assert_allclose(b.ntk, a.ntk, rtol=1e-14)


def test_valid_padding_and_strides_shorten_the_positions():
    net = mf.Network(mf.serial(mf.act("relu"), mf.conv(3, padding="valid", dilation=2)))
    st = token_state(net, np.ones((2, 11, 3)), 3, 1.0, 0.1)
    assert st["A"].shape == (2, 3, 2, 3)       # 11 -> 7 -> 3 positions
    with pytest.raises(ValueError, match="needs at least 5 positions, got 3"):
        token_state(net, np.ones((2, 11, 3)), 4, 1.0, 0.1)
    net = mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 3), stride=2)))
    st = token_state(net, np.ones((2, 9, 6, 3)), 3, 1.0, 0.1)
    assert st["A"].shape == (2, 6, 2, 6)       # (9, 6) -> (5, 3) -> (3, 2) pixels: ceil(n / 2) each time


def test_a_strided_convolution_reads_every_s_th_window():
    """stride s: the output at p is the stride-1 output at s p (the same windows), entry by entry."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 9, 3))
    for padding in ("same", "circular", "valid"):
        one = token_state(mf.Network(mf.serial(mf.act("tanh"), mf.conv(3, padding=padding))), x, 2, 1.2, 0.3)
        two = token_state(mf.Network(mf.serial(mf.act("tanh"), mf.conv(3, padding=padding, stride=2))), x, 2, 1.2,
                          0.3)
        np.testing.assert_array_equal(two["A"], one["A"][:, ::2][:, :, :, ::2])
        np.testing.assert_array_equal(two["TA"], one["TA"][:, ::2][:, :, :, ::2])


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="padding"):
        mf.conv(3, padding="reflect")
    with pytest.raises(ValueError, match="kernel_size"):
        mf.conv(0)
    with pytest.raises(ValueError, match="kernel_size must be an int"):
        mf.conv((3, 3, 3))
    with pytest.raises(ValueError, match="4-d array of images of shape \\(n, H, W, d\\)"):
        kernels(mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 3)))), np.ones((2, 5, 3)), depth=2, sigma_w=1.0,
                sigma_b=0.0)
    with pytest.raises(ValueError, match="odd kernel_size"):
        mf.conv(4)
    with pytest.raises(ValueError, match="dilation"):
        mf.conv(3, dilation=0)
    with pytest.raises(ValueError, match="stride"):
        mf.conv(3, stride=0)
    with pytest.raises(ValueError, match="readout"):
        kernels(mf.Network(mf.serial(mf.act("relu"), mf.conv(3))), np.ones((2, 5, 3)), depth=2, sigma_w=1.0,
                sigma_b=0.0, readout="max")
    with pytest.raises(ValueError, match="readout='flatten' is for inputs with positions"):
        kernels("relu", np.ones((2, 3)), depth=2, sigma_w=1.0, sigma_b=0.0, readout="flatten")
    with pytest.raises(ValueError, match="sigma_w"):
        mf.conv(3, sigma_w=-1.0)
    with pytest.raises(ValueError, match="act\\('relu'\\) at position 1"):
        mf.serial(mf.conv(3), mf.act("relu"))


def test_repr_and_json_round_trip():
    net = mf.Network(mf.residual(mf.act("erf"), mf.conv(5, sigma_b=0.1, padding="circular", dilation=3), mu=0.9))
    assert repr(net.block_spec().branch.layers[1]) == "conv(5, sigma_b=0.1, padding='circular', dilation=3)"
    back = mf.from_json(mf.to_json(net))
    assert back.block_spec() == net.block_spec()
    net2 = mf.Network(mf.serial(mf.act("relu"), mf.conv((3, 1), padding="valid", stride=2)))
    assert repr(net2.block_spec().layers[1]) == "conv((3, 1), padding='valid', stride=2)"
    assert mf.from_json(mf.to_json(net2)).block_spec() == net2.block_spec()


@pytest.mark.torch
@pytest.mark.parametrize("kernel_size, padding, dilation, stride, grid", [
    (3, "same", 1, 1, (6,)), (3, "circular", 2, 1, (6,)), (3, "valid", 1, 1, (6,)), (3, "circular", 5, 1, (6,)),
    (3, "same", 1, 2, (7,)), (5, "valid", 1, 3, (12,)),
    ((3, 3), "same", 1, 1, (5, 4)), ((3, 1), "circular", 2, 1, (5, 4)), ((2, 3), "valid", 1, 1, (5, 4)),
    ((3, 5), "circular", 3, 1, (2, 4)), ((3, 3), "same", 1, 2, (5, 4)), ((3, 3), "circular", 1, 2, (6, 5)),
])
def test_torch_realisation_is_torch_conv(kernel_size, padding, dilation, stride, grid):
    """Conv.torch_forward on the (I, P, S, B, T, N) layout (positions flattened row-major, ``ctx.grid`` their
    shape) against torch's conv1d / conv2d with the same draws: W[c, c', taps] = sigma_w G[c, tap N + c'] /
    sqrt(k N), the bias on the primal, tangents without it; padding done by index in the reference (a circular
    wrap may exceed the positions, which torch's own circular pad refuses)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    ks = (kernel_size,) if isinstance(kernel_size, int) else kernel_size
    k, N, out, sw, sb = int(np.prod(ks)), 4, 5, 1.3, 0.7
    g = torch.Generator().manual_seed(0)
    G = torch.randn(1, out, k * N, generator=g, dtype=torch.float64)
    b = torch.randn(1, out, generator=g, dtype=torch.float64)

    class Ctx:
        draws = [G, b]

        def normal(self, shape):
            return self.draws.pop(0)

        def value(self, e):
            return torch.tensor([{"sigma_w": sw, "sigma_b": sb}[str(e)]], dtype=torch.float64)

    ctx = Ctx()
    ctx.grid = grid
    T = int(np.prod(grid))
    z = torch.randn(1, 1, 2, 3, T, N, generator=g, dtype=torch.float64)     # slot 0 primal, slot 1 a tangent
    y = mf.conv(kernel_size, padding=padding, dilation=dilation, stride=stride).torch_forward(z, ctx, out=out)
    W = sw * G[0].view(out, *ks, N).movedim(-1, 1) / np.sqrt(k * N)        # (out, in, *ks)
    x = z[0, 0].reshape(2, 3, *grid, N).movedim(-1, 2)                     # (S, B, N, *grid)
    for axis, (n, kk) in enumerate(zip(grid, ks)):
        pad = 0 if padding == "valid" else dilation * (kk - 1) // 2
        idx = torch.arange(-pad, n + pad)
        if padding == "circular":
            x = x.index_select(3 + axis, idx % n)
        elif pad:
            x = torch.cat([torch.zeros_like(x.narrow(3 + axis, 0, pad)), x,
                           torch.zeros_like(x.narrow(3 + axis, 0, pad))], dim=3 + axis)
    conv = F.conv1d if len(ks) == 1 else F.conv2d
    for s, bias in ((0, sb * b[0]), (1, None)):
        ref = conv(x[s], W, bias, dilation=dilation, stride=stride)           # (B, out, *grid_out)
        torch.testing.assert_close(y[0, 0, s], ref.flatten(2).transpose(1, 2), rtol=1e-13, atol=1e-13)
    assert tuple(ctx.grid) == tuple(ref.shape[2:])


def _monte_carlo(net, T, sw, sb, seed):
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, T, 4)) * rng.uniform(0.6, 1.6, (3, 1, 1))
    kw = dict(depth=DEEP, sigma_w=sw, sigma_b=sb)
    e = empirical_kernels(net, x, width=WIDE, n_init=8, n_outputs=2, seed=1, **kw)
    r = kernels(net, x, **kw)
    return e, r


def _agree(emp, ana, se, rel_bias):
    """|empirical - analytic| <= 4.5 standard errors + an allowance for the finite-width bias."""
    return np.abs(emp - ana) <= 4.5 * se + rel_bias * np.abs(ana)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("case", ["same", "valid", "circular"])
def test_monte_carlo_deep_wide(case):
    """Depth 20, 512 channels, 3 images, 8 initialisations: every entry of the NNGP within 4.5 standard errors
    and of the NTK within 4.5 SE + 4 depth/width (as for MLPs). Measured max |z| (NNGP, NTK): same 2.2, 1.4;
    valid 0.3, 0.7; circular 0.5, 1.8 (SE of the NNGP diagonal 2-5 %, 15-19 % for the deep ReLU chain)."""
    net, T, sw, sb = {
        "same": (mf.Network(mf.residual(mf.act("erf"), mf.conv(3, sigma_b=0.3), mu=0.9)), 8, 1.2, 0.3),
        "valid": (mf.Network(mf.serial(mf.act("relu"), mf.conv(3, padding="valid"))), 44, 1.41, 0.1),
        "circular": (mf.Network(mf.residual(mf.layer_norm(), mf.act("gelu"),
                                            mf.conv(3, padding="circular", dilation=2), mu=0.8)), 7, 1.3, 0.2),
    }[case]
    e, r = _monte_carlo(net, T, sw, sb, seed=5)
    assert np.all(_agree(e.nngp, r.nngp, e.nngp_se, 0.0))
    assert np.all(_agree(e.ntk, r.ntk, e.ntk_se, 4 * DEEP / WIDE))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("build, sw, sb", [
    (lambda: mf.Network(mf.residual(mf.act("tanh"), mf.conv(3, padding="circular"), mu=0.9)), 1.3, 0.2),
    (lambda: mf.Network(mf.residual(mf.layer_norm(), mf.act("relu"), mf.conv(5, padding="circular", dilation=2)),
                        mu=1.0), 1.4, 0.1),
], ids=["tanh-res", "ln-relu-dilated"])
def test_monte_carlo_scalar_recursion_deep_wide(build, sw, sb):
    """The solvers' K^l and chi_J of circular convolutions (the dense layer's recursion) against K^l and
    J^{l,l+1} measured on realised networks of 8 positions, depth 20, 512 channels, 16 initialisations,
    by the suite's rule |MC - theory| <= 4 SE + 2 (l / width) |theory|."""
    pytest.importorskip("torch")
    from meanfield.verification import monte_carlo
    from meanfield.verification._theory import theory_profile

    net = build()
    r = monte_carlo(net, sw, sb, depth=DEEP, width=WIDE, n_init=16, tokens=8, device="cpu", seed=3)
    th = theory_profile(net, sw, sb, DEEP)
    layers = np.arange(1, DEEP + 1)
    for q, mc, se, t in (("K", r.K, r.K_se, th["K"]), ("chi_J", r.chi_J, r.chi_J_se, th["chi_J"][:DEEP])):
        bad = np.abs(mc - t) > 4.0 * se + 2.0 * layers / WIDE * np.abs(t)
        assert not bad.any(), (q, layers[bad], mc[bad], t[bad], se[bad])


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_2d_deep_wide_nngp():
    """A 3 x 3 convolution with zero padding in a residual network over 4 x 5 images, depth 20, 512 channels,
    8 initialisations: every entry of the NNGP within 4.5 standard errors (measured max |z| 1.1, SE 4-6 %).
    (The empirical NTK of this network materialises the weight gradients, 2.4 M per layer and row: its NTK
    is checked on a shallower, narrower one below; its rule is the 1-D one, checked deep and wide above.)"""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    x = np.random.default_rng(0).standard_normal((3, 4, 5, 3))
    net = mf.Network(mf.residual(mf.act("erf"), mf.conv((3, 3), sigma_b=0.2), mu=0.9))
    kw = dict(depth=DEEP, sigma_w=1.2, sigma_b=0.2)
    e = empirical_kernels(net, x, width=WIDE, n_init=8, seed=1, get="nngp", **kw)
    r = kernels(net, x, **kw)
    assert np.all(_agree(e.nngp, r.nngp, e.nngp_se, 0.0))


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_2d_ntk():
    """The NTK of a 3 x 3 circular convolutional network (depth 6, 128 channels, 12 initialisations) within
    4.5 SE + 4 depth/width, both parameterisations (measured max |z| 0.7 in each, SE 5-7 %)."""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    x = np.random.default_rng(1).standard_normal((3, 3, 4, 2))
    net = mf.Network(mf.residual(mf.act("relu"), mf.conv((3, 3), padding="circular"), mu=0.8))
    for param in ("ntk", "standard"):
        kw = dict(depth=6, sigma_w=1.3, sigma_b=0.3, parameterization=param)
        e = empirical_kernels(net, x, width=128, n_init=12, n_outputs=2, seed=2, **kw)
        r = kernels(net, x, width=128, **kw)
        assert np.all(_agree(e.ntk, r.ntk, e.ntk_se, 4 * 6 / 128)), param


# ---------------------------------------------------------------------------
# Average pooling.
# ---------------------------------------------------------------------------
def test_pooling_a_field_equal_at_every_position_changes_nothing():
    """Inputs equal at every position: every entry of the state is the same, so any window mean of it is that
    entry again (valid windows; 1-D and 2-D)."""
    kw = dict(depth=3, sigma_w=1.3, sigma_b=0.2)
    rng = np.random.default_rng(9)
    rows = rng.standard_normal((3, 1, 4))
    for pool, conv, x in ((mf.avg_pool(2), mf.conv(1), np.repeat(rows, 8, axis=1)),
                          (mf.avg_pool((2, 2)), mf.conv((1, 1)), np.repeat(np.repeat(rows[:, :, None], 4, 1), 6, 2))):
        a = kernels(mf.Network(mf.serial(mf.act("gelu"), pool, conv)), x, **kw)
        b = kernels(mf.Network(mf.serial(mf.act("gelu"), conv)), x, **kw)
        np.testing.assert_allclose(a.nngp, b.nngp, rtol=1e-14)
        np.testing.assert_allclose(a.ntk, b.ntk, rtol=1e-14)


def test_pooling_uncorrelated_positions_divides_the_variance_by_the_window():
    """erf without bias on tokens orthogonal across positions: the positions stay uncorrelated (zero cross
    covariance), so the mean of k of them has 1/k of their mean variance."""
    x = np.zeros((2, 6, 12))
    rng = np.random.default_rng(10)
    for t in range(6):
        x[:, t, 2 * t:2 * t + 2] = rng.standard_normal((2, 2)) * np.sqrt(6)
    base = token_state(mf.Network(mf.serial(mf.act("erf"), mf.conv(1))), x, 2, 1.1, 0.0)
    pooled = token_state(mf.Network(mf.serial(mf.act("erf"), mf.avg_pool(3), mf.conv(1))), x, 2, 1.1, 0.0)
    v, vp = _diag(base["A"]), _diag(pooled["A"])
    np.testing.assert_allclose(vp, v.reshape(2, 2, 3).mean(-1) / 3, rtol=1e-14)


def test_the_solvers_refuse_pooling():
    net = mf.Network(mf.residual(mf.act("erf"), mf.avg_pool(3, stride=1, padding="circular"), mf.conv(3), mu=0.9))
    with pytest.raises(ValueError, match="covariance between positions"):
        mf.critical_line(net, sigma_w=1.0)
    with pytest.raises(ValueError, match="give the stride"):
        mf.avg_pool((2, 3))
    assert repr(mf.avg_pool((2, 2), stride=1)) == "avg_pool((2, 2), stride=1)"
    assert mf.from_json(mf.to_json(net)).block_spec() == net.block_spec()


@pytest.mark.torch
@pytest.mark.parametrize("kernel_size, stride, padding, grid", [
    (2, None, "valid", (7,)), (3, 1, "same", (6,)), (3, 2, "circular", (7,)),
    ((2, 2), None, "valid", (4, 6)), ((3, 3), 1, "same", (4, 5)), ((3, 3), 2, "circular", (5, 5)),
])
def test_torch_pooling_is_torch_avg_pool(kernel_size, stride, padding, grid):
    """AvgPool.torch_forward against torch's avg_pool1d / avg_pool2d (count_include_pad=True), primal and
    tangent; circular padding by index in the reference."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    ks = (kernel_size,) if isinstance(kernel_size, int) else kernel_size
    N, T = 3, int(np.prod(grid))

    class Ctx:
        pass

    ctx = Ctx()
    ctx.grid = grid
    z = torch.randn(1, 1, 2, 2, T, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = mf.avg_pool(kernel_size, stride, padding).torch_forward(z, ctx)
    x = z[0, 0].reshape(2, 2, *grid, N).movedim(-1, 2)
    pad = [0 if padding == "valid" else (k - 1) // 2 for k in ks]
    if padding == "circular":
        for axis, (n, p) in enumerate(zip(grid, pad)):
            x = x.index_select(3 + axis, torch.arange(-p, n + p) % n)
        pad = [0] * len(ks)
    pool = F.avg_pool1d if len(ks) == 1 else F.avg_pool2d
    for s in (0, 1):
        ref = pool(x[s], ks, stride if stride is not None else ks, pad, count_include_pad=True)
        torch.testing.assert_close(y[0, 0, s], ref.flatten(2).transpose(1, 2), rtol=1e-14, atol=1e-14)
    assert tuple(ctx.grid) == tuple(ref.shape[2:])


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_pooling_deep_wide():
    """A residual block with a stride-1 average pool before its convolution, depth 20, 512 channels, 8
    initialisations, 8 positions: every entry of the NNGP within 4.5 SE and of the NTK within 4.5 SE +
    4 depth/width. Measured max |z| 3.3 (NNGP), 2.5 (NTK), SE 2-4 %; with three other seeds of 16
    initialisations the z of the entries have both signs and the diagonal is within 5 % (no bias)."""
    net = mf.Network(mf.residual(mf.act("erf"), mf.avg_pool(3, stride=1, padding="same"), mf.conv(3), mu=0.9))
    e, r = _monte_carlo(net, 8, 1.4, 0.2, seed=7)
    assert np.all(_agree(e.nngp, r.nngp, e.nngp_se, 0.0))
    assert np.all(_agree(e.ntk, r.ntk, e.ntk_se, 4 * DEEP / WIDE))


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_flatten_readout_deep_wide():
    """The flattened read-out of a zero-padded residual convolutional network, depth 20, 512 channels, 8
    initialisations: every entry of the NNGP within 4.5 SE (measured max |z| 2.1, SE 0.5-2 %; the NTK with
    two channels at every position, 64 s: max |z| 2.5, SE 2-3 %). The NTK's read-out is the same formula on
    the NTK state, which the mean read-out's Monte Carlo checks deep and wide, and neural-tangents' Flatten
    to 3e-15 (benchmarks/crosscheck)."""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    net = mf.Network(mf.residual(mf.act("erf"), mf.conv(3, sigma_b=0.3), mu=0.9))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 8, 4)) * rng.uniform(0.6, 1.6, (3, 1, 1))
    kw = dict(depth=DEEP, sigma_w=1.2, sigma_b=0.3)
    e = empirical_kernels(net, x, width=WIDE, n_init=8, seed=1, readout="flatten", get="nngp", **kw)
    r = kernels(net, x, readout="flatten", **kw)
    assert np.all(_agree(e.nngp, r.nngp, e.nngp_se, 0.0))
