"""from_torch: a user's torch module read into the primitive tree, and Monte Carlo on that module.

References: the hand-built specs (composition API / Architecture menu) for the
recursions (exact sympy equality), and Monte Carlo on the user's own module
(not a rebuilt twin) for the theory, within the suite's rule.
"""
import numpy as np
import pytest
import sympy as sp

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield import symbols as S  # noqa: E402
from meanfield.verification import initialise_  # noqa: E402
from meanfield.verification._theory import theory_profile  # noqa: E402
from meanfield.torch.from_torch import monte_carlo_module  # noqa: E402


class PreLNResMLP(nn.Module):
    """A user's pre-LN residual MLP with its own forward: x <- mu x + W phi(LN x) + b."""

    def __init__(self, d_in=16, d=64, depth=4, mu=0.5, n_out=10):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.norms = nn.ModuleList([nn.LayerNorm(d) for _ in range(depth)])
        self.fcs = nn.ModuleList([nn.Linear(d, d) for _ in range(depth)])
        self.out = nn.Linear(d, n_out)
        self.mu = mu

    def forward(self, x):
        x = self.inp(x)
        for ln, fc in zip(self.norms, self.fcs):
            x = self.mu * x + fc(F.gelu(ln(x)))
        return self.out(x)


class ResMLPBlock(nn.Module):
    def __init__(self, tokens, d, eps):
        super().__init__()
        self.token_mix = nn.Linear(tokens, tokens)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.ls1 = nn.Parameter(eps * torch.ones(d))
        self.ls2 = nn.Parameter(eps * torch.ones(d))

    def forward(self, x):
        x = x + self.ls1 * self.token_mix(x.transpose(1, 2)).transpose(1, 2)
        return x + self.ls2 * self.fc2(nn.functional.gelu(self.fc1(x)))


class ResMLP(nn.Module):
    def __init__(self, tokens=8, d_in=12, d=32, depth=3, eps=0.1):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(*[ResMLPBlock(tokens, d, eps) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(self.inp(x))


def post_ln_mlp(d=64, depth=4, act=nn.Tanh):
    layers = [nn.Linear(16, d)]
    for _ in range(depth):
        layers += [act(), nn.LayerNorm(d), nn.Linear(d, d)]
    return nn.Sequential(*layers)


def _same(a, b):
    for name in ("kernel", "kernel12", "chi_J", "chi_K", "chi_Delta"):
        x, y = getattr(mf.recursion(a), name), getattr(mf.recursion(b), name)
        assert x == y or sp.simplify(x - y) == 0, name


def test_pre_ln_residual_mlp():
    net = mf.from_torch(PreLNResMLP(), torch.randn(3, 16))
    assert net.depth == 4
    _same(net, mf.Network(mf.residual(mf.layer_norm("pre"), mf.act("gelu"), mf.dense(), mu=0.5)))
    # and the menu item, with mu substituted
    menu = mf.recursion(mf.Architecture("gelu", norm="ln_pre", mu=0.5)).subs(mu=sp.Float(0.5))
    assert sp.simplify(mf.recursion(net).chi_J - menu.chi_J) == 0


def test_post_ln_mlp_is_the_menu_item():
    net = mf.from_torch(post_ln_mlp(), torch.randn(3, 16))
    assert net.depth == 4
    _same(net, mf.Architecture("tanh", norm="ln_post"))


@pytest.mark.slow
def test_resmlp_block_tokens_and_layerscale():
    net = mf.from_torch(ResMLP(eps=0.25), torch.randn(2, 8, 12))
    assert net.depth == 3 and net.has_tokens
    ref = mf.Network(mf.serial(mf.residual(mf.dense(axis="tokens"), mf.scale(0.25), mu=1),
                               mf.residual(mf.dense(), mf.act("gelu"), mf.dense(), mf.scale(0.25), mu=1)))
    _same(net, ref)
    menu = mf.recursion(mf.Architecture("gelu", block="resmlp")).subs(mu=1, eps=sp.Float(0.25))
    assert sp.simplify(mf.recursion(net).kernel - menu.kernel) == 0


MENU_MODULES = {
    "relu": (lambda d: [nn.ReLU(), nn.Linear(d, d)], mf.Architecture("relu")),
    "erf-ln-pre": (lambda d: [nn.LayerNorm(d), nn.SiLU(), nn.Linear(d, d)], mf.Architecture("silu", norm="ln_pre")),
    "tanh-ln-post": (lambda d: [nn.Tanh(), nn.LayerNorm(d), nn.Linear(d, d)], mf.Architecture("tanh", norm="ln_post")),
    "bn": (lambda d: [nn.BatchNorm1d(d), nn.ReLU(), nn.Linear(d, d)], mf.Architecture("relu", norm="bn")),
    "leaky": (lambda d: [nn.LeakyReLU(0.2), nn.Linear(d, d)], mf.Architecture(mf.activation("leaky_relu", negative_slope=0.2))),
    "selu": (lambda d: [nn.SELU(), nn.Linear(d, d)], mf.Architecture("selu")),
    "elu": (lambda d: [nn.ELU(0.5), nn.Linear(d, d)], mf.Architecture(mf.activation("elu", alpha=0.5))),
    "hardtanh": (lambda d: [nn.Hardtanh(), nn.Linear(d, d)], mf.Architecture("hardtanh")),
    "softplus": (lambda d: [nn.Softplus(), nn.Linear(d, d)], mf.Architecture("softplus")),
    "gelu-tanh": (lambda d: [nn.GELU(approximate="tanh"), nn.Linear(d, d)], mf.Architecture("gelu_tanh")),
    "rms-pre": (lambda d: [nn.RMSNorm(d), nn.ReLU(), nn.Linear(d, d)],
                mf.Network(mf.serial(mf.rms_norm(), mf.act("relu"), mf.dense()))),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MENU_MODULES))
def test_built_in_blocks_round_trip(name):
    make, ref = MENU_MODULES[name]
    d = 16
    model = nn.Sequential(nn.Linear(8, d), *make(d), *make(d), *make(d))
    net = mf.from_torch(model, torch.randn(4, 8))
    assert net.depth == 3
    _same(net, ref)


def test_residual_menu_item_round_trip():
    class Res(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.a, self.b = nn.Linear(8, d), nn.Linear(d, d)
            self.c = nn.Linear(d, d)

        def forward(self, x):
            x = self.a(x)
            x = x + self.b(torch.relu(x))
            return x + self.c(torch.relu(x))

    net = mf.from_torch(Res(), torch.randn(2, 8))
    assert net.depth == 2
    _same(net, mf.Network(mf.residual(mf.act("relu"), mf.dense(), mu=1)))
    menu = mf.recursion(mf.Architecture("relu", mu=1.0)).subs(mu=1)
    assert sp.simplify(mf.recursion(net).chi_J - menu.chi_J) == 0


@pytest.mark.slow
def test_differing_blocks_come_back_whole():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
    net = mf.from_torch(model, torch.randn(2, 8))
    assert net.depth == 1 and len(net.block.layers) == 4
    prof = mf.kernel_profile(net, 1.2, 0.1, 2)
    assert np.isfinite(prof.K).all()


@pytest.mark.parametrize("model,needle", [
    (nn.Sequential(nn.Linear(8, 8), nn.Softmax(-1), nn.Linear(8, 8)), "Softmax"),
    (nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Tanh(), nn.Linear(8, 8)), "not a preactivation"),
    (nn.Sequential(nn.ReLU(), nn.Linear(8, 8)), "input layer"),
])
def test_unsupported_is_a_value_error_naming_the_node(model, needle):
    with pytest.raises(ValueError, match="graph node|input layer") as err:
        mf.from_torch(model, torch.randn(2, 8))
    assert needle in str(err.value)


def test_unsupported_function_named():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(torch.sin(self.a(x)))

    with pytest.raises(ValueError, match=r"graph node 2 .*sin"):
        mf.from_torch(M(), torch.randn(2, 8))


def test_initialise_draws_the_variances():
    lin = nn.Linear(400, 300)
    initialise_(lin, sigma_w=1.7, sigma_b=0.3, generator=torch.Generator().manual_seed(0))
    w = lin.weight.detach().double()
    assert abs(float(w.var()) * 400 / 1.7**2 - 1) < 0.02  # 120k samples: SE of a variance ~ 0.4%
    assert abs(float(lin.bias.detach().double().std()) / 0.3 - 1) < 0.15


def _mc_vs_theory(model, x, sw, sb, n_init, z=4.0, c=2.0):
    net = mf.from_torch(model, x)
    r = monte_carlo_module(model, x, sw, sb, n_init=n_init, seed=1)
    L = len(r.K)
    th = theory_profile(net, sw, sb, L, K0=sw**2 * r.input_norm + sb**2)
    layers = np.arange(1, L + 1)
    for mc, se, t in ((r.K, r.K_se, th["K"]), (r.J, r.J_se, th["J"])):
        tol = z * se + c * layers / r.width * np.abs(t)
        assert np.all(np.abs(mc - t) <= tol), (mc, t, se)


def _unit_rows(B, N, seed=0):
    x = torch.randn(B, N, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x * (N ** 0.5 / x.norm(dim=-1, keepdim=True))


@pytest.mark.slow
def test_monte_carlo_on_the_users_own_module():
    torch.manual_seed(0)
    model = PreLNResMLP(d_in=32, d=256, depth=5, mu=0.5).double()
    _mc_vs_theory(model, _unit_rows(4, 32), 1.3, 0.2, n_init=12)


@pytest.mark.slow
def test_monte_carlo_on_the_users_own_module_deep_wide():
    model = PreLNResMLP(d_in=64, d=512, depth=20, mu=0.7).double()
    _mc_vs_theory(model, _unit_rows(4, 64), 1.4, 0.1, n_init=12)


# --- the package's own zoo modules (torch/models.py) ------------------------------------
def _zoo_net(*blocks):
    return torch.nn.Sequential(torch.nn.Linear(5, 4), *blocks)


def test_zoo_resmlp_blocks_read_as_the_resmlp_menu_item():
    """ResMLP's Affine (alpha = 1, beta = 0 at initialisation) is the identity; LayerScale is scale(eps)."""
    from meanfield.torch import models as M

    net = mf.from_torch(_zoo_net(*[M.ResMLPBlock(8, 4, 16, 0.25, "relu") for _ in range(3)]), torch.randn(2, 8, 5))
    assert net.depth == 3
    menu = mf.recursion(mf.Architecture("relu", block="resmlp")).subs(mu=1, eps=sp.Float(0.25))
    R = mf.recursion(net)
    assert sp.simplify(R.kernel - menu.kernel) == 0 and sp.simplify(R.chi_J - menu.chi_J) == 0


def test_zoo_mixer_blocks_read_as_the_mixer_menu_item():
    """The token MLP makes it a Mixer: per-token layers on the channel pair (axis 'channels'), as mixer_block."""
    from meanfield.torch import models as M

    net = mf.from_torch(_zoo_net(*[M.MixerBlock(8, 4, 6, 10, "relu") for _ in range(2)]), torch.randn(2, 8, 5))
    assert net.depth == 2 and net.pair_axis == "channels"
    menu = mf.recursion(mf.Architecture("relu", block="mixer")).subs(mu=1)
    R = mf.recursion(net)
    for f in ("kernel", "kernel12", "chi_J"):
        assert sp.simplify(getattr(R, f) - getattr(menu, f)) == 0, f


def test_zoo_refusals_name_the_module():
    from meanfield.torch import models as M

    m = _zoo_net(M.ChannelMixing(4, 16, 0.1, "relu"))
    with torch.no_grad():
        m[1].norm.beta.fill_(0.3)
    with pytest.raises(ValueError, match="constant 0.3"):
        mf.from_torch(m, torch.randn(2, 8, 5))
    with pytest.raises(ValueError, match=r"features\.0\.1.*BatchNorm2d"):  # VGG19_BN: BatchNorm over images
        mf.from_torch(M.VGG(M.VGG19_CFG), torch.randn(2, 3, 32, 32))


def test_zoo_resmlp_reads_from_images():
    """The zoo's ResMLP on images: its patch embedding (a Conv2d with stride = kernel, then flatten(2) and
    transpose) is the input layer on the patches, the token mean before the head the read-out; the blocks
    are the menu's ResMLP block with eps = 0.1 (sympy)."""
    from meanfield.torch import models as M

    net = mf.from_torch(M.ResMLP(img_size=16, patch_size=8, dim=8, depth=2, num_classes=3), torch.randn(2, 3, 16, 16))
    assert net.depth == 2 and net.has_tokens
    eps = float(torch.tensor(0.1, dtype=torch.float32))    # the LayerScale parameter is float32's 0.1
    menu = mf.recursion(mf.Architecture("gelu", block="resmlp")).subs(mu=1, eps=sp.Float(eps))
    assert sp.simplify(mf.recursion(net).kernel - menu.kernel) == 0


def test_zoo_mixer_reads_from_images():
    """The zoo's MLP-Mixer on images: the head's LayerNorm before the token mean belongs to the read-out, not to
    a block; the blocks are the menu's Mixer block (sympy)."""
    from meanfield.torch import models as M

    net = mf.from_torch(M.MLPMixer(img_size=16, patch_size=8, dim=8, depth=2, num_classes=3),
                        torch.randn(2, 3, 16, 16))
    assert net.depth == 2 and net.pair_axis == "channels"
    menu = mf.recursion(mf.Architecture("gelu", block="mixer")).subs(mu=1)
    R = mf.recursion(net)
    for f in ("kernel", "kernel12", "chi_J"):
        assert sp.simplify(getattr(R, f) - getattr(menu, f)) == 0, f


@pytest.mark.parametrize("norm, head", [("layer_norm", True), ("none", False)])
def test_zoo_preact_resnet_reads_as_resnet_v2(norm, head):
    """The zoo's pre-activation ResNet (stages, strided first blocks with projection shortcuts of the
    pre-activation, doubling channels) is resnet_v2's tree; its head (norm, phi, pooling, Linear) is the
    read-out. ResNet110 too."""
    from meanfield.torch import models as M

    m = M.PreActResNet(blocks=(2, 1, 2), channels=(4, 8, 16), mu=0.9, norm=norm, head=head)
    assert mf.from_torch(m, m.example_inputs()) == mf.Network(mf.resnet_v2((2, 1, 2), norm=norm, mu=0.9), depth=1)
    r = M.resnet110(mu=0.5)
    assert mf.from_torch(r, r.example_inputs()) == mf.Network(mf.resnet_v2((18, 18, 18), mu=0.5), depth=1)
