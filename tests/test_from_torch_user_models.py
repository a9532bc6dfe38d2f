"""from_torch on models written the way research code is written (issue 27, item 9).

Each model below is in one author's plain style (shape queries and flattens
at the start of ``forward``, ``self.fc1..fcN``, ModuleList loops, a custom
``MyLinear`` keeping its own parameters, a custom ``Erf(nn.Module)``,
functional and method activations, residuals with a mu factor). Each must
read to the same recursion as its hand-built spec: exact sympy equality of
the recursion's maps, and chi_J at a point against the hand-built spec's.
"""
import math

import pytest
import sympy as sp

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield import symbols as S  # noqa: E402


class Erf(nn.Module):
    def forward(self, x):
        return torch.erf(x)


class MyLinear(nn.Module):
    """A linear layer keeping its own (out, in) weight like nn.Linear; the names are the author's."""

    def __init__(self, n_in, n_out, bias=True, std=1.0):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(n_out, n_in) * std / math.sqrt(n_in))
        self.offset = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x):
        return F.linear(x, self.kernel, self.offset)


class MatmulLinear(nn.Module):
    """A linear layer stored (in, out), applied as x @ W (+ b)."""

    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_in, n_out) / math.sqrt(n_in))
        self.b = nn.Parameter(torch.randn(n_out)) if bias else None

    def forward(self, x):
        out = x @ self.W
        if self.b is not None:
            out = out + self.b
        return out


class MatmulTLinear(nn.Module):
    """A linear layer stored (out, in), applied as x @ W.T + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.b = nn.Parameter(torch.randn(n_out))

    def forward(self, x):
        return x @ self.W.T + self.b


class Net(nn.Module):
    """fc1..fc4 with a view of the input first (MNIST style)."""

    def __init__(self, d_in=12, hidden=16):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, hidden)
        self.fc4 = nn.Linear(hidden, hidden)

    def forward(self, x):
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        return self.fc4(x)


class ErfMLP(nn.Module):
    """A ModuleList of Linear layers and a custom Erf module; flatten with x.shape[0]."""

    def __init__(self, d_in, width, depth, sigma_in=2.0):
        super().__init__()
        self.input_layer = nn.Linear(d_in, width)
        nn.init.normal_(self.input_layer.weight, std=sigma_in / math.sqrt(d_in))  # its own std
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.act = Erf()

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        x = self.input_layer(x)
        for layer in self.layers:
            x = layer(self.act(x))
        return x


class CustomLinearTanh(nn.Module):
    """MyLinear layers (F.linear with self.kernel/self.offset), torch.tanh, torch.flatten(x, 1)."""

    def __init__(self, d_in=12, width=16, depth=3):
        super().__init__()
        self.first = MyLinear(d_in, width, std=3.0)
        self.hidden = nn.ModuleList([MyLinear(width, width) for _ in range(depth)])

    def forward(self, x):
        x = torch.flatten(x, 1)
        h = self.first(x)
        for lin in self.hidden:
            h = lin(torch.tanh(h))
        return h


class MatmulNoBias(nn.Module):
    """x @ W layers without bias, x.relu() methods, len(x) in the reshape."""

    def __init__(self, d_in=12, width=16, depth=3):
        super().__init__()
        self.inp = MatmulLinear(d_in, width, bias=False)
        self.blocks = nn.ModuleList([MatmulLinear(width, width, bias=False) for _ in range(depth)])

    def forward(self, x):
        x = x.reshape(len(x), -1)
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x.relu())
        return x


class MatmulTBias(nn.Module):
    """x @ W.T + b layers and x.tanh(), nn.Flatten at the start, in an nn.Sequential."""

    def __init__(self, d_in=12, width=16, depth=3):
        super().__init__()
        layers = [nn.Flatten(), MatmulTLinear(d_in, width)]
        for _ in range(depth):
            layers += [TanhMethod(), MatmulTLinear(width, width)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class TanhMethod(nn.Module):
    def forward(self, x):
        return x.tanh()


class GeluModule(nn.Module):
    def forward(self, x):
        return F.gelu(x)


class ResBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = GeluModule()

    def forward(self, x):
        return self.fc(self.act(x))


class ResNetMLP(nn.Module):
    """x = x + self.block(x) over a ModuleList, x.view(-1, d) at the start."""

    def __init__(self, d_in=12, width=16, depth=3):
        super().__init__()
        self.d_in = d_in
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList([ResBlock(width) for _ in range(depth)])

    def forward(self, x):
        x = x.view(-1, self.d_in)
        x = self.embed(x)
        for block in self.blocks:
            x = x + self.block_out(block, x)
        return x

    @staticmethod
    def block_out(block, x):
        return block(x)


class MuResNet(nn.Module):
    """x = mu * x + block(x) with a Sequential block, shapes read through x.size()."""

    def __init__(self, d_in=12, width=16, depth=3, mu=0.7):
        super().__init__()
        self.mu = mu
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.SiLU(), nn.Linear(width, width)) for _ in range(depth)])

    def forward(self, x):
        x = x.view(x.size()[0], -1)
        x = self.embed(x)
        for block in self.blocks:
            x = self.mu * x + block(x)
        return x


class SelfWeightsMLP(nn.Module):
    """Weights kept directly on the network as a ParameterList, F.linear with them, F.hardtanh."""

    def __init__(self, d_in=12, width=16, depth=3):
        super().__init__()
        sizes = [d_in] + [width] * (depth + 1)
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(o, i) / math.sqrt(i))
                                         for i, o in zip(sizes[:-1], sizes[1:])])
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(o)) for o in sizes[1:]])

    def forward(self, x):
        x = x.flatten(1)
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            if k > 0:
                x = F.hardtanh(x)
            x = F.linear(x, w, b)
        return x


class Fc12Readout(nn.Module):
    """fc1, act, fc2, act, fc3 read-out with torch.relu; the input is already flat."""

    def __init__(self, d_in=12, h1=16, n_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, h1)
        self.fc2 = nn.Linear(h1, h1)
        self.fc3 = nn.Linear(h1, n_out)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class ReluResidualNoBias(nn.Module):
    """x = x * mu + fc(relu(x)) with bias-free MyLinear layers (offset None), written x * mu."""

    def __init__(self, d_in=12, width=16, depth=2, mu=0.6):
        super().__init__()
        self.mu = mu
        self.embedding = MyLinear(d_in, width, bias=False)
        self.fcs = nn.ModuleList([MyLinear(width, width, bias=False) for _ in range(depth)])

    def forward(self, x):
        x = self.embedding(x)
        for fc in self.fcs:
            x = x * self.mu + fc(nn.functional.relu(x))
        return x


class SequentialErf(nn.Module):
    """An nn.Sequential of nn.Linear and a custom Erf module built in a loop, flatten(x, start_dim=1)."""

    def __init__(self, d_in=12, width=16, depth=3):
        super().__init__()
        mods = [nn.Linear(d_in, width)]
        for _ in range(depth):
            mods.append(Erf())
            mods.append(nn.Linear(width, width))
        self.model = nn.Sequential(*mods)

    def forward(self, x):
        return self.model(torch.flatten(x, start_dim=1))


def _spec(*layers, mu=None, depth=1):
    block = mf.residual(*layers, mu=mu) if mu is not None else mf.serial(*layers)
    return mf.Network(block, depth=depth)


USER_MODELS = {
    "net-fc1-fc4-view": (lambda: Net(), (5, 3, 4), _spec(mf.act("relu"), mf.dense(), depth=3)),
    "erf-modulelist": (lambda: ErfMLP(12, 16, 4), (5, 12), _spec(mf.act("erf"), mf.dense(), depth=4)),
    "mylinear-tanh": (lambda: CustomLinearTanh(), (5, 2, 6), _spec(mf.act("tanh"), mf.dense(), depth=3)),
    "matmul-no-bias": (lambda: MatmulNoBias(), (5, 12),
                       _spec(mf.act("relu"), mf.dense(sigma_b=0), depth=3)),
    "matmul-T-bias": (lambda: MatmulTBias(), (5, 3, 4), _spec(mf.act("tanh"), mf.dense(), depth=3)),
    "residual-block": (lambda: ResNetMLP(), (5, 12),
                       _spec(mf.act("gelu"), mf.dense(), mu=1, depth=3)),
    "mu-residual": (lambda: MuResNet(mu=0.7), (5, 3, 4),
                    _spec(mf.act("silu"), mf.dense(), mu=0.7, depth=3)),
    "parameterlist": (lambda: SelfWeightsMLP(), (5, 3, 4), _spec(mf.act("hardtanh"), mf.dense(), depth=3)),
    "fc-readout": (lambda: Fc12Readout(), (5, 12), _spec(mf.act("relu"), mf.dense(), depth=2)),
    "relu-residual-no-bias": (lambda: ReluResidualNoBias(mu=0.6), (5, 12),
                              _spec(mf.act("relu"), mf.dense(sigma_b=0), mu=0.6, depth=2)),
    "sequential-erf": (lambda: SequentialErf(), (5, 3, 4), _spec(mf.act("erf"), mf.dense(), depth=3)),
}


def _same_recursion(a, b):
    ra, rb = mf.recursion(a), mf.recursion(b)
    for name in ("kernel", "chi_J"):
        x, y = getattr(ra, name), getattr(rb, name)
        assert x == y or sp.simplify(x - y) == 0, name


@pytest.mark.parametrize("name", list(USER_MODELS))
def test_user_model_reads_to_its_spec(name):
    make, shape, ref = USER_MODELS[name]
    torch.manual_seed(0)
    net = mf.from_torch(make(), torch.randn(*shape))
    assert net.depth == ref.depth
    _same_recursion(net, ref)


def _chi_J(net, sigma_w, K):
    expr = mf.recursion(net).chi_J
    return float(expr.subs({S.sigma_w: sigma_w, S.K: K}))


def test_erf_module_chi_J_at_a_point():
    # phi = erf: phi'(h) = 2/sqrt(pi) exp(-h^2), E[exp(-2h^2)] = 1/sqrt(1 + 4K) for h ~ N(0, K),
    # so chi_J = sigma_w^2 * 4 / (pi sqrt(1 + 4K))
    net = mf.from_torch(ErfMLP(12, 16, 4), torch.randn(5, 12))
    assert _chi_J(net, 1.7, 0.8) == pytest.approx(1.7 ** 2 * 4 / (math.pi * math.sqrt(1 + 4 * 0.8)), rel=1e-12)


def test_relu_residual_chi_J_at_a_point():
    # x <- mu x + W relu(x): chi_J = mu^2 + sigma_w^2 E[relu'(h)^2] = mu^2 + sigma_w^2 / 2
    net = mf.from_torch(ReluResidualNoBias(mu=0.6), torch.randn(5, 12))
    assert _chi_J(net, 1.3, 0.5) == pytest.approx(0.6 ** 2 + 1.3 ** 2 / 2, rel=1e-12)


class FlattenLate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)).view(x.size(0), -1))


class TensorProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc1(x)
        return h @ self.fc2(h)  # (batch = 16) x (16, 16): a product of two computed tensors


@pytest.mark.parametrize("model,needle", [
    (FlattenLate(), "view/reshape/flatten after the input layer"),
    (TensorProduct(), "matrix product"),
])
def test_unread_user_operations_are_value_errors(model, needle):
    with pytest.raises(ValueError, match=needle):
        mf.from_torch(model, torch.randn(16, 12))


class WideCustomLayers(nn.Module):
    """Non-square custom layers in the three orientations: F.linear (out, in), x @ W (in, out), x @ W.T."""

    def __init__(self):
        super().__init__()
        self.first = MyLinear(64, 256)           # kernel (256, 64): fan-in 64
        self.up = MatmulLinear(256, 64)          # W (256, 64): fan-in 256
        self.down = MatmulTLinear(64, 512)       # W (512, 64): fan-in 64

    def forward(self, x):
        return self.down(torch.tanh(self.up(torch.tanh(self.first(x)))))


def test_initialise_draws_custom_linear_layers_by_their_fan_in():
    from meanfield.torch.from_torch import initialise_

    model = WideCustomLayers()
    initialise_(model, 2.0, 0.5, generator=torch.Generator().manual_seed(1), example_input=torch.randn(3, 64))
    # std of n >= 16384 draws of N(0, s^2): relative standard error 1/sqrt(2n) < 0.6 %; 4 % is > 6 se,
    # and the wrong orientation is off by a factor 2 or more
    for w, fan_in in ((model.first.kernel, 64), (model.up.W, 256), (model.down.W, 64)):
        assert float(w.detach().std()) == pytest.approx(2.0 / math.sqrt(fan_in), rel=0.04)
    biases = torch.cat([model.first.offset.detach(), model.up.b.detach(), model.down.b.detach()])
    # 832 draws of N(0, 0.25): relative se of the std 2.5 %; 12 % is ~5 se
    assert float(biases.std()) == pytest.approx(0.5, rel=0.12)


@pytest.mark.slow
def test_monte_carlo_on_a_model_with_custom_linear_layers():
    """K^l and J^{1,l} of the user's own MyLinear/tanh model (drawn by initialise_) against the theory."""
    from test_from_torch import _mc_vs_theory, _unit_rows

    torch.manual_seed(0)
    model = CustomLinearTanh(d_in=32, width=256, depth=4).double()
    _mc_vs_theory(model, _unit_rows(4, 32), 1.3, 0.2, n_init=12)
