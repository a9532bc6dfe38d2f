"""Convolutional models in: ``from_torch`` of a user's CNN (nn.Conv1d/2d, nn.AvgPool, LayerNorm over images,
GroupNorm, the pooled or flattened read-out), ``initialise_`` on convolutions, and the user's own network
measured by ``monte_carlo_module`` against the walk over positions.

Independent routes: the built-in tree written by hand; torch's own weights (their variance); Monte Carlo on
the user's module at depth 20 and 256 channels.
"""
import re

import numpy as np
import pytest
import sympy as sp

import meanfield as mf

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional
from meanfield.torch import from_torch, initialise_  # noqa: E402
from meanfield.torch.from_torch import monte_carlo_module  # noqa: E402

pytestmark = pytest.mark.torch


class _Block(nn.Module):
    """x -> mu x + conv(relu(norm(x))), written the way research code writes a pre-activation block."""

    def __init__(self, conv, norm, mu):
        super().__init__()
        self.norm, self.conv, self.mu = norm, conv, mu

    def forward(self, x):
        return self.mu * x + self.conv(F.relu(self.norm(x)))


class _ResNet(nn.Module):
    """A 1 x 1 stem, ``depth`` blocks, then the read-out: 'pool' (nn.AdaptiveAvgPool2d(1), flatten, Linear),
    'mean' (x.mean((2, 3)), Linear) or 'flatten' (x.flatten(1), Linear)."""

    def __init__(self, channels, depth, conv, norm, mu=0.5, readout="pool", dims=2, in_channels=3):
        super().__init__()
        Conv = nn.Conv2d if dims == 2 else nn.Conv1d
        self.stem = Conv(in_channels, channels, 1)
        self.blocks = nn.Sequential(*[_Block(conv(channels), norm(channels), mu) for _ in range(depth)])
        self.pool = nn.AdaptiveAvgPool2d(1) if dims == 2 else nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(channels, 10)
        self.readout, self.dims = readout, dims

    def forward(self, x):
        h = self.blocks(self.stem(x))
        if self.readout == "pool":
            return self.fc(torch.flatten(self.pool(h), 1))
        if self.readout == "mean":
            return self.fc(h.mean(tuple(range(2, 2 + self.dims))))
        return self.fc(h.flatten(1))


def _image_norm(C):
    return nn.GroupNorm(1, C)


@pytest.mark.parametrize("conv, norm, dims, expected", [
    (lambda C: nn.Conv2d(C, C, 3, padding=1), _image_norm, 2,
     mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv((3, 3)), mu=0.5)),
    (lambda C: nn.Conv2d(C, C, 3, padding="same", bias=False), lambda C: nn.GroupNorm(4, C), 2,
     mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv((3, 3), sigma_b=0), mu=0.5)),
    (lambda C: nn.Conv2d(C, C, 3, padding=2, dilation=2, padding_mode="circular"),
     lambda C: nn.LayerNorm([C, 6, 6]), 2,
     mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv((3, 3), padding="circular", dilation=2),
                 mu=0.5)),
    (lambda C: nn.Conv1d(C, C, 5, padding=2), _image_norm, 1,
     mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv(5), mu=0.5)),
], ids=["zeros", "same-no-bias-groups", "circular-dilated-layernorm", "conv1d"])
@pytest.mark.parametrize("readout", ["pool", "mean", "flatten"])
def test_a_residual_cnn_reads_as_the_tree_written_by_hand(conv, norm, dims, expected, readout):
    """The stem is the input layer, the read-out is not a block: the blocks and their number come back; where
    the tree has a scalar recursion (circular padding), it is the hand-written tree's (sympy)."""
    net = from_torch(_ResNet(8, 3, conv, norm, readout=readout, dims=dims))
    assert net == mf.Network(mf.serial(expected), depth=3)
    if "circular" in repr(expected):
        ours, theirs = mf.recursion(net), mf.recursion(mf.Network(expected))
        for name in ("kernel", "kernel12", "chi_J"):
            assert sp.simplify(getattr(ours, name) - getattr(theirs, name)) == 0, name


def test_pooling_and_valid_padding_read_as_their_primitives():
    """A serial block of conv 'valid', ReLU, an overlapping 'same' pool and a strided conv, twice."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)
            self.layers = nn.Sequential(*[nn.Sequential(nn.ReLU(), nn.AvgPool2d(3, stride=1, padding=1),
                                                        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
                                                        nn.AvgPool2d(2), nn.Conv2d(8, 8, 1)) for _ in range(2)])

        def forward(self, x):
            return self.layers(self.stem(x))

    block = mf.serial(mf.act("relu"), mf.avg_pool((3, 3), stride=1, padding="same"), mf.conv((3, 3), stride=2),
                      mf.act("relu"), mf.avg_pool((2, 2)), mf.conv((1, 1)))
    assert from_torch(Net()) == mf.Network(mf.serial(block), depth=2)


class _Wrap(nn.Module):
    def __init__(self, *mods):
        super().__init__()
        self.stem, self.body = nn.Conv2d(3, 8, 3, padding=1), nn.Sequential(*mods)

    def forward(self, x):
        return self.body(self.stem(x))


@pytest.mark.parametrize("mods, named, says", [
    ((nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=2)), "Conv2d", "groups=2"),
    ((nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")), "Conv2d", "padding_mode"),
    ((nn.ReLU(), nn.Conv2d(8, 8, 3, padding=2)), "Conv2d", "padding=(2, 2)"),
    ((nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, stride=(2, 1))), "Conv2d", "stride"),
    ((nn.BatchNorm2d(8), nn.ReLU()), "BatchNorm2d", "batch and the positions"),
    ((nn.GroupNorm(8, 8), nn.ReLU()), "GroupNorm", "InstanceNorm"),
    ((nn.LayerNorm(8), nn.ReLU()), "LayerNorm", "last axis"),
    ((nn.ReLU(), nn.MaxPool2d(2)), "MaxPool2d", "unsupported module"),
    ((nn.ReLU(), nn.AvgPool2d(2, ceil_mode=True)), "AvgPool2d", "ceil_mode"),
    ((nn.ReLU(), nn.AdaptiveAvgPool2d(2)), "AdaptiveAvgPool2d", "output_size 1"),
    ((nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1)), "Conv2d", "read-out"),
])
def test_what_is_not_read_is_a_value_error_naming_the_module(mods, named, says):
    with pytest.raises(ValueError, match=rf"\[{named}\].*{re.escape(says)}") as err:
        from_torch(_Wrap(*mods))
    assert named in str(err.value)


def test_initialise_draws_convolutions_with_the_fan_in_of_their_taps():
    """W ~ N(0, sigma_w^2 / (C_in k)), b ~ N(0, sigma_b^2): 256 x 256 x 3 x 3 weights, variance within 1 %
    (its relative standard error is 0.18 %), and the GroupNorm's affine parameters reset to (1, 0)."""
    net = nn.Sequential(nn.Conv2d(256, 256, 3), nn.GroupNorm(2, 256))
    with torch.no_grad():
        net[1].weight.fill_(3.0)
    initialise_(net, 1.5, 0.3, generator=torch.Generator().manual_seed(0))
    w, b = net[0].weight.detach().double(), net[0].bias.detach().double()
    assert abs(w.var().item() / (1.5**2 / (256 * 9)) - 1) < 0.01
    assert abs(w.mean().item()) < 4 * 1.5 / np.sqrt(256 * 9) / np.sqrt(w.numel())
    assert abs(b.var().item() / 0.3**2 - 1) < 0.3       # 256 biases: relative SE 0.09
    assert torch.all(net[1].weight == 1) and torch.all(net[1].bias == 0)


@pytest.mark.slow
@pytest.mark.parametrize("norm, mu", [(_image_norm, 0.5), (lambda C: nn.LayerNorm([C, 6, 6]), 0.9)],
                         ids=["groupnorm", "layernorm"])
def test_monte_carlo_of_the_users_cnn_follows_the_walk_over_positions(norm, mu):
    """The user's own residual CNN (zero padding, ReLU, 6 x 6 images, 20 blocks of 256 channels) measured by
    monte_carlo_module: J^{1,l} and K^l at h^1 and every block output within the suite's rule (4 SE + 2 l / width), against
    token_jacobians and kernels(per_layer=True, readout='flatten') of from_torch's network on the same image.
    Measured max |z| (J, K): 1.2, 1.5 (GroupNorm, mu = 0.5); 1.3, 2.5 (LayerNorm, mu = 0.9)."""
    from meanfield.gram.tokens import token_jacobians

    depth, width, sw, sb = 20, 256, 1.3, 0.1
    net = _ResNet(width, depth, lambda C: nn.Conv2d(C, C, 3, padding=1), norm, mu=mu)
    x = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    net = net.double()
    arch = from_torch(net)
    r = monte_carlo_module(net, x, sw, sb, n_init=16, seed=2)
    image = x.permute(0, 2, 3, 1).numpy()
    J = token_jacobians(arch, image, depth, sw, sb)["J"][:, 0]
    K = mf.kernels(arch, image, depth=depth, sigma_w=sw, sigma_b=sb, get=("nngp",), per_layer=True,
                   readout="flatten").nngp_diag[:, 0]
    layers = np.arange(1, depth + 1)
    for name, mc, se, th in (("J", r.J[:depth], r.J_se[:depth], J), ("K", r.K[:depth], r.K_se[:depth], K)):
        bad = np.abs(mc - th) > 4.0 * se + 2.0 * layers / width * np.abs(th)
        assert not bad.any(), (name, layers[bad], mc[bad], th[bad], se[bad])


class _ProjectionBlock(nn.Module):
    """A strided block whose 1 x 1 shortcut reads the raw input x (some ResNetV2 code) or the pre-activation,
    scaled by mu on either side of the addition."""

    def __init__(self, cin, cout, on="pre", mu=0.5):
        super().__init__()
        self.norm, self.conv1 = nn.GroupNorm(1, cin), nn.Conv2d(cin, cout, 3, stride=2, padding=1)
        self.proj, self.on, self.mu = nn.Conv2d(cin, cout, 1, stride=2, bias=False), on, mu

    def forward(self, x):
        a = F.relu(self.norm(x))
        skip = self.proj(a if self.on == "pre" else x)
        return self.conv1(a) + self.mu * skip


@pytest.mark.parametrize("on, shortcut", [
    ("pre", [mf.layer_norm(axis="positions"), mf.act("relu"), mf.conv((1, 1), sigma_b=0, stride=2)]),
    ("x", [mf.conv((1, 1), sigma_b=0, stride=2)]),
])
def test_a_projection_shortcut_reads_as_the_residual_shortcut(on, shortcut):
    """g(x) + f(x) where neither summand is the other's input: the layers both share after the block input
    (the pre-activation) head both the branch and the shortcut; mu comes from the scaled summand."""
    m = nn.Sequential(nn.Conv2d(3, 8, 1), _ProjectionBlock(8, 16, on), _ProjectionBlock(16, 16, on))
    block = lambda: mf.residual(mf.layer_norm(axis="positions"), mf.act("relu"),  # noqa: E731
                                mf.conv((3, 3), stride=2), shortcut=shortcut, mu=0.5)
    assert from_torch(m, torch.randn(1, 3, 8, 8)) == mf.Network(mf.serial(block()), depth=2)


def test_a_sum_of_two_branches_without_a_shortcut_of_the_theory_is_refused():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            h = self.stem(x)
            return F.relu(self.a(h)) + F.relu(self.b(h))

    with pytest.raises(ValueError, match="nor a projection shortcut of the theory"):
        from_torch(Two(), torch.randn(1, 3, 6, 6))


@pytest.mark.slow
def test_monte_carlo_of_the_users_staged_resnet_follows_the_walk_over_positions():
    """The zoo's PreActResNet as a user's model (1 x 1 stem, no head), 3 stages of 7 blocks on 8 x 8 images
    with 256 channels, measured by monte_carlo_module (16 draws of initialise_) after every residual block:
    K^l and J^{1,l} against token_jacobians(per_layer=True) of from_torch's network, within the suite's rule
    4 SE + 2 l / width relative. Measured: K within 3 % (max |z| 3.3, at l = 4), J^{1,l} above the limit by a
    finite-width drift of ~0.5 % per block (12 % at l = 22, max |z| 2.9), which halves from 256 to 512
    channels (docs/gram.md, "Stages and projection shortcuts")."""
    from meanfield.gram.tokens import token_jacobians
    from meanfield.torch.models import PreActResNet

    sw, sb, width = 1.2, 0.1, 256
    net = PreActResNet(blocks=(7, 7, 7), channels=(width,) * 3, mu=0.7, stem_kernel=1, head=False).double()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    arch = from_torch(net, x)
    assert arch == mf.Network(mf.resnet_v2((7, 7, 7), mu=0.7), depth=1)
    r = monte_carlo_module(net, x, sw, sb, n_init=16, seed=4)
    th = token_jacobians(arch, x.permute(0, 2, 3, 1).numpy(), 1, sw, sb, per_layer=True)
    # the theory's rows are the inputs of the 21 blocks (h^1 .. h^21); the whole body's APJN is J^{1,22}
    J = np.append(th["J"][:, 0], token_jacobians(arch, x.permute(0, 2, 3, 1).numpy(), 1, sw, sb)["chi_J"][0, 0])
    K = mf.kernels(arch, x.permute(0, 2, 3, 1).numpy(), depth=2, sigma_w=sw, sigma_b=sb, get=("nngp",),
                   readout="flatten").nngp[0, 0]
    K = np.append(th["K"][:, 0], K)
    layers = np.arange(1, 23)
    assert r.J.shape == (22,) and r.K.shape == (22,)
    for name, mc, se, ref in (("J", r.J, r.J_se, J), ("K", r.K, r.K_se, K)):
        bad = np.abs(mc - ref) > 4.0 * se + 2.0 * layers / width * np.abs(ref)
        assert not bad.any(), (name, layers[bad], mc[bad], ref[bad], se[bad])
