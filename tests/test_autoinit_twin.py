"""AutoInit's one-pass estimator (``_Twin.jvp_pass``): values and scale gradients against independent routes.

* J samples: each block's Jacobian applied to the same probes by ``torch.func.jvp``
  of that block alone (no hooks, no probe-replacing autograd functions);
* gradients of the loss with respect to the scales: central finite differences of
  the same loss (float64, the probes fixed by re-seeding the generator).
"""
import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from meanfield.torch.autoinit import _Twin, _generator, _loss, _measuring  # noqa: E402

pytestmark = pytest.mark.torch


def _model(norm, seed=3, act=nn.Tanh):
    g = torch.Generator().manual_seed(seed)
    layers, d = [], 6
    for i in range(4):
        lin = nn.Linear(d, 10, bias=True).double()
        with torch.no_grad():
            lin.weight.normal_(0.0, 1.3 / math.sqrt(d), generator=g)
            lin.bias.normal_(0.0, 0.2, generator=g)
        layers.append(lin)
        if i < 3:
            if norm == "bn":
                layers.append(nn.BatchNorm1d(10).double())
            elif norm == "ln":
                ln = nn.LayerNorm(10).double()
                with torch.no_grad():  # not the identity, so its affine scales matter
                    ln.weight.uniform_(0.7, 1.3, generator=g)
                    ln.bias.uniform_(-0.2, 0.2, generator=g)
                layers.append(ln)
            layers.append(act())
        d = 10
    model = nn.Sequential(*layers)
    blocks = [str(i) for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
    return model, blocks


def _conv_model(norm, seed=4):
    """Conv2d (zero padding, stride 2, a rectangular padding, no bias) + [BatchNorm2d] + ReLU/Tanh, then Linear."""
    torch.manual_seed(seed)
    layers = [nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4) if norm == "bn" else nn.Identity(), nn.ReLU(),
              nn.Conv2d(4, 5, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(5, 6, 3, padding=(1, 0), bias=False),
              nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 2, 7)]
    return nn.Sequential(*layers).double(), ["0", "3", "5", "8"]


def _x():
    return torch.randn(7, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


@pytest.mark.parametrize("norm,act", [(None, nn.Tanh), ("bn", nn.Tanh), ("ln", nn.Tanh), (None, nn.ReLU),
                                      ("bn", nn.ReLU)])
@pytest.mark.slow
def test_samples_are_the_blocks_jacobians_on_the_probes(norm, act):
    """(nn.Linear and nn.ReLU run the twin's own tangent rules; the reference, torch's.)"""
    bn = norm == "bn"
    model, blocks = _model(norm, act=act)
    x, R = _x(), 3
    with _measuring(model):
        twin = _Twin(model, blocks)
        us = twin.probes(x, R, _generator(0, 1))
        Js, _ = twin.jvp_pass(x, None, R, _generator(0, 1))
        # block outputs h^l of the plain model, then each segment h^l -> h^{l+1} on its own
        hs = []
        hooks = [model.get_submodule(b).register_forward_hook(lambda m, i, o: hs.append(o)) for b in blocks]
        with torch.no_grad():
            model(x)
        for h in hooks:
            h.remove()
        mods = list(model)
        idx = [int(b) for b in blocks]
        for l in range(len(blocks) - 1):
            seg = nn.Sequential(*mods[idx[l] + 1: idx[l + 1] + 1])
            ref = []
            for r in range(R):
                _, jv = torch.func.jvp(seg, (hs[l],), (us[l][r],))
                per = jv.reshape(jv.shape[0], -1).pow(2).mean(1)  # ||J u||^2 / N per sample
                ref.append(per.mean().reshape(1) if bn else per)
            ref = torch.cat(ref)
            torch.testing.assert_close(Js[l].detach(), ref, rtol=1e-12, atol=0)


def _grad_and_fd(norm, loss, lam, fix=True, act=nn.Tanh, conv=False):
    """Autograd gradient of the loss to the scales, and its central finite difference (probes fixed)."""
    model, blocks = _conv_model(norm) if conv else _model(norm, act=act)
    x, R = _x(), 2
    if conv:
        x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    names = [n for n, _ in model.named_parameters()]
    a0 = torch.linspace(0.8, 1.2, len(names), dtype=torch.float64)
    with _measuring(model):
        twin = _Twin(model, blocks)
        if not fix:
            twin.norms = []  # torch's own forward-mode rules for the norms

        def L(a):
            scales = {n: a[i] for i, n in enumerate(names)}
            Js, Ks = twin.jvp_pass(x, scales, R, _generator(0, 1))
            return _loss(torch.stack([s.mean() for s in Js]), torch.stack(Ks), loss, lam)

        a = a0.clone().requires_grad_(True)
        grad = torch.autograd.grad(L(a), a)[0]
        eps = 1e-6
        fd = torch.empty_like(a0)
        with torch.no_grad():
            for i in range(len(names)):
                e = torch.zeros_like(a0)
                e[i] = eps
                fd[i] = (L(a0 + e) - L(a0 - e)) / (2 * eps)
    return grad, fd


@pytest.mark.parametrize("norm,loss,lam,act", [
    (None, "jll", 0.0, nn.Tanh), (None, "jkl", 0.5, nn.Tanh), ("bn", "jsl", 0.0, nn.Tanh), ("bn", "jkl", 0.5, nn.Tanh),
    ("ln", "jll", 0.0, nn.Tanh), ("ln", "jkl", 0.5, nn.Tanh),
    # the twin's own ReLU and Linear tangent rules (_ReLU, _Linear), where J depends on the scales through the
    # weights only and the kernel term through the primal pass; LayerNorm after the Linear, BatchNorm before ReLU
    (None, "jll", 0.0, nn.ReLU), (None, "jkl", 0.5, nn.ReLU), ("bn", "jkl", 0.5, nn.ReLU), ("ln", "jkl", 0.5, nn.ReLU)])
@pytest.mark.slow
def test_scale_gradients_match_finite_differences(norm, loss, lam, act):
    grad, fd = _grad_and_fd(norm, loss, lam, act=act)
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("norm", [None, "bn"])
def test_conv_scale_gradients_match_finite_differences(norm):
    """The twin's own convolution rule (_Conv), with ReLU and Tanh after it, BatchNorm2d, and the kernel term."""
    grad, fd = _grad_and_fd(norm, "jkl", 0.5, conv=True)
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["bn", "ln"])
def test_torch_norm_rules_alone_miss_the_statistics_paths(norm):
    """The failure the formula hooks fix: with torch's own rules the gradients are off (a check that can fail)."""
    grad, fd = _grad_and_fd(norm, "jll", 0.0, fix=False)
    assert (grad - fd).abs().max() > 1e-2 * fd.abs().max()
