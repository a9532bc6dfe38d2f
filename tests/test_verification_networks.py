"""Torch realisations of the calculus: forward-mode rules against torch.func.jvp and autograd."""
import math

import numpy as np
import pytest
import sympy as sp

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield.torch.networks import Context, realise, torch_activation  # noqa: E402

pytestmark = pytest.mark.torch

ARCHS = [
    mf.Architecture("relu"),
    mf.Architecture("erf", mu=0.5),
    mf.Architecture("gelu", norm="ln_pre", mu=0.7),
    mf.Architecture("tanh", norm="ln_post"),
    mf.Architecture("relu", norm="bn", mu=0.5),
    mf.Architecture("relu", norm="bn", mu=1.0, stages=2),
    mf.Architecture(sp.sin(sp.Symbol("t")) + sp.Symbol("t") / 2, norm="ln_pre"),
    mf.Architecture(block="resmlp", activation="gelu"),
    mf.Architecture(block="mixer", activation="relu", mu=0.5),
    # projection shortcuts: a dense one after a LayerNorm, and strided convolutions along 4 positions
    mf.Network(mf.residual(mf.layer_norm(), mf.act("relu"), mf.dense(), shortcut=[mf.layer_norm(), mf.dense()]),
               mu=0.5),
    mf.Network(mf.residual(mf.act("gelu"), mf.conv(3, stride=2), shortcut=mf.conv(1, stride=2)), mu=0.7),
    # attention: the tangents of the softmax weights (tied 1/d logits, two heads; independent 1/sqrt(d), three)
    mf.Network(mf.residual(mf.layer_norm(), mf.attention(2, tied=True, sigma_q=1.7, sigma_k=0.6), mu=0.5)),
    mf.Network(mf.serial(mf.act("tanh"), mf.attention(3, scaling="1/sqrt(d)", sigma_v=1.3, sigma_b=0.2))),
]


def _ctx(arch, I=2, seed=0):
    gens = [torch.Generator().manual_seed(seed + i) for i in range(I)]
    params = {"sigma_w": [1.3, 0.8], "sigma_b": [0.2, 0.5], "mu": arch.mu or 0.0, "eps": arch.eps}
    return Context(gens, params, "cpu", torch.float64)


@pytest.mark.parametrize("arch", ARCHS, ids=str)
def test_tangent_rules_match_torch_func_jvp(arch):
    """The hand-written JVP of every primitive equals torch.func.jvp of the primal block."""
    I, P, B, N = 2, 2, 3, 6
    T = 4 if arch.block != "mlp" else 1
    block = realise(arch)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(I, P, 1, B, T, N, generator=g, dtype=torch.float64)
    v = torch.randn(I, P, 2, B, T, N, generator=g, dtype=torch.float64)

    out = block(torch.cat([h, v], 2), _ctx(arch))
    for r in range(2):
        _, jv = torch.func.jvp(lambda x: block(x, _ctx(arch)), (h,), (v[:, :, r:r + 1],))
        torch.testing.assert_close(out[:, :, 1 + r:2 + r], jv, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out[:, :, :1], block(h, _ctx(arch)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["relu", "leaky_relu", "linear", "abs", "erf", "gelu", "tanh", "silu",
                                  "softplus"])
def test_activation_derivatives_match_autograd(name):
    phi, dphi = torch_activation(mf.activation(name))
    x = torch.linspace(-4, 4, 101, dtype=torch.float64).requires_grad_()
    (grad,) = torch.autograd.grad(phi(x).sum(), x)
    torch.testing.assert_close(dphi(x.detach()), grad, rtol=1e-10, atol=1e-12)
    # phi agrees with the sympy definition
    f = mf.activation(name).numpy()
    np.testing.assert_allclose(phi(x.detach()).numpy(), f(x.detach().numpy()), rtol=1e-12, atol=1e-12)


def test_user_sympy_activation_is_lambdified_to_torch():
    t = sp.Symbol("t")
    act = mf.activation(sp.sin(t) + t**2 / 3)
    phi, dphi = torch_activation(act)
    x = torch.linspace(-2, 2, 11, dtype=torch.float64)
    torch.testing.assert_close(phi(x), torch.sin(x) + x**2 / 3)
    torch.testing.assert_close(dphi(x), torch.cos(x) + 2 * x / 3)


def test_common_random_numbers_across_parameter_points():
    """Points of a grid see the same G: W(sigma_w) = sigma_w G / sqrt(fan_in) exactly."""
    arch = mf.Architecture("linear")
    block = realise(arch)
    I, B, N = 2, 1, 5
    h = torch.randn(I, 1, 1, B, 1, N, dtype=torch.float64).expand(I, 2, 1, B, 1, N).contiguous()
    gens = [torch.Generator().manual_seed(i) for i in range(I)]
    ctx = Context(gens, {"sigma_w": [1.0, 2.5], "sigma_b": [0.0, 0.0]}, "cpu", torch.float64)
    out = block(h, ctx)
    torch.testing.assert_close(out[:, 1], 2.5 * out[:, 0])


def test_layer_norm_and_batch_norm_statistics():
    I, B, T, N = 1, 16, 3, 32
    h = 3.0 + 2.0 * torch.randn(I, 1, 1, B, T, N, dtype=torch.float64)
    ctx = _ctx(mf.Architecture("relu"), I=1)
    ln = realise(mf.calculus.LayerNormPre())(h, ctx)
    torch.testing.assert_close(ln.mean(-1), torch.zeros_like(ln.mean(-1)), atol=1e-12, rtol=0)
    torch.testing.assert_close(ln.pow(2).mean(-1), torch.ones_like(ln.mean(-1)))
    bn = realise(mf.calculus.BatchNorm())(h, ctx)
    torch.testing.assert_close(bn.mean(3), torch.zeros_like(bn.mean(3)), atol=1e-12, rtol=0)
    torch.testing.assert_close(bn.pow(2).mean(3), torch.ones_like(bn.mean(3)))
    tok = realise(mf.calculus.LayerNormPre(axis="tokens"))(h, ctx)
    torch.testing.assert_close(tok.pow(2).mean(-2), torch.ones_like(tok.mean(-2)))
    assert math.isfinite(float(ln.sum()))
