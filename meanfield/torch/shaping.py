r"""Kernel shaping in torch: transformed activations, TAT/DKS-initialised MLPs, Monte-Carlo C maps.

The maths lives in :mod:`meanfield.shaping`; this module realises it:

- :class:`ShapedActivation` computes phi_hat(x) = gamma (phi(alpha x + beta) + delta)
  for a :class:`meanfield.shaping.TransformedActivation`; :class:`TReLU` is
  the normalised leaky ReLU sqrt(2 / (1 + a^2)) LReLU_a.
- :class:`ShapedMLP` is a vanilla MLP of combined layers phi_hat(W x) or a
  rescaled ResNet x <- w x + sqrt(1 - w^2) R(x) (TAT eq. 6), with fan-in
  Gaussian (or scale-corrected orthogonal) weights and zero biases; its
  ``network`` attribute is the matching :mod:`meanfield.shaping` tree, so
  ``shaping.global_c_map(model.network, model.transform, c)`` is its
  infinite-width prediction. :func:`tat_mlp`, :func:`dks_mlp` and
  :func:`eoc_relu_mlp` build the three kinds used in the paper.
- :func:`mc_cosine_similarity` measures the cosine similarity of the
  features for input pairs of prescribed cosine c, with a standard error over
  independent initialisations: the Monte-Carlo C map.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numpy as np
import sympy as sp
import torch
from torch import nn
import torch.nn.functional as F

from .. import shaping as _shaping

__all__ = [
    "torch_activation",
    "ShapedActivation",
    "TReLU",
    "ShapedMLP",
    "shaped_mlp",
    "tat_mlp",
    "dks_mlp",
    "eoc_relu_mlp",
    "input_pairs",
    "MCResult",
    "mc_cosine_similarity",
]

def torch_activation(base, negative_slope=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A torch function for an activation of the registry (name) or a sympy expression in one symbol.

    A thin front to :func:`meanfield.torch.activations.torch_activation`
    (the package's one table); ``negative_slope`` goes with 'leaky_relu'.
    """
    from ..activations import activation
    from .activations import torch_activation as _table

    if isinstance(base, str) and base.strip().lower() == "leaky_relu":
        return _table(activation("leaky_relu", negative_slope=0.01 if negative_slope is None
                                 else float(negative_slope)))[0]
    if isinstance(base, str) and base.strip().lower() == "scale_invariant":
        raise ValueError("use 'leaky_relu' with negative_slope for scale-invariant activations in torch")
    if not isinstance(base, (str, sp.Basic)):
        raise ValueError(f"activation must be a registered name or a sympy expression, got {base!r}")
    return _table(activation(base))[0]


class ShapedActivation(nn.Module):
    """phi_hat(x) = gamma (phi(alpha x + beta) + delta) with fixed (non-trainable) parameters."""

    def __init__(self, transform: "_shaping.TransformedActivation"):
        super().__init__()
        if not isinstance(transform, _shaping.TransformedActivation):
            raise ValueError(f"transform must be a meanfield.shaping.TransformedActivation, got {transform!r}")
        self.transform = transform
        self._phi = torch_activation(transform.base, transform.negative_slope)
        self.alpha, self.beta = float(transform.alpha), float(transform.beta)
        self.gamma, self.delta = float(transform.gamma), float(transform.delta)

    def forward(self, x):
        if self.alpha != 1.0:
            x = self.alpha * x
        if self.beta != 0.0:
            x = x + self.beta
        y = self._phi(x)
        if self.delta != 0.0:
            y = y + self.delta
        return self.gamma * y

    def extra_repr(self):
        return str(self.transform)


class TReLU(ShapedActivation):
    """sqrt(2 / (1 + a^2)) LeakyReLU_a(x): Q(q) = q, C'(1) = 1 (TAT section 4.1)."""

    def __init__(self, negative_slope: float):
        super().__init__(_shaping.normalized_leaky_relu(negative_slope))

    @classmethod
    def for_network(cls, depth, eta=0.9, shortcut_weight=0.0, branch_depth=1) -> "TReLU":
        """The TReLU whose slope gives C_f(0) = eta (:func:`meanfield.shaping.trelu_negative_slope`)."""
        return cls(_shaping.trelu_negative_slope(depth, eta, shortcut_weight, branch_depth))


def _init_weight_(weight: torch.Tensor, init: str, generator=None):
    """Fan-in Gaussian N(0, 1/in) or scale-corrected orthogonal weights (drawn on the CPU)."""
    out_f, in_f = weight.shape
    with torch.no_grad():
        if init == "gaussian":
            w = torch.randn(out_f, in_f, generator=generator, dtype=torch.float64) / math.sqrt(in_f)
        elif init == "orthogonal":
            # scale-corrected uniform orthogonal (TAT appendix D): orthonormal columns
            # (out >= in) or rows (out < in), times max(sqrt(out/in), 1): E[W_ij^2] = 1/in
            g = torch.randn(max(out_f, in_f), min(out_f, in_f), generator=generator, dtype=torch.float64)
            q, r = torch.linalg.qr(g)
            q = q * torch.sign(torch.diagonal(r))
            w = (q if out_f >= in_f else q.T) * max(math.sqrt(out_f / in_f), 1.0)
        else:
            raise ValueError(f"init={init!r} is not allowed; choose one of 'gaussian', 'orthogonal'")
        weight.copy_(w.to(dtype=weight.dtype, device=weight.device))


class _Residual(nn.Module):
    def __init__(self, branch: nn.Module, shortcut_weight: float):
        super().__init__()
        self.branch = branch
        self.w = float(shortcut_weight)
        self.v = math.sqrt(max(1.0 - self.w * self.w, 0.0))

    def forward(self, x):
        return self.w * x + self.v * self.branch(x)

    def extra_repr(self):
        return f"shortcut_weight={self.w:.6g}"


class ShapedMLP(nn.Module):
    """A vanilla or rescaled-residual MLP with a shaped activation (TAT eqs. 1, 6).

    Parameters
    ----------
    transform : meanfield.shaping.TransformedActivation
        The activation phi_hat (from ``shaping.trelu``, ``tat_transform``, ...).
    width, depth : int
        Hidden width and number of combined layers (along the residual path).
    shortcut_weight : float or None
        None: vanilla network of ``depth`` combined layers phi_hat(W x).
        A number w: an input affine layer followed by depth / branch_depth
        blocks x <- w x + sqrt(1 - w^2) W' (phi_hat W)^branch_depth x.
    in_features, out_features : int
        Input dimension (default ``width``) and an optional affine readout.
    init : 'gaussian' (W ~ N(0, 1/fan_in)) or 'orthogonal' (scale-corrected orthogonal)
    generator : torch.Generator for the initialisation
    """

    def __init__(self, transform, width, depth, *, shortcut_weight=None, branch_depth=1, in_features=None,
                 out_features=None, init="gaussian", generator=None, dtype=torch.float32, device=None):
        super().__init__()
        depth = _shaping._check_depth(depth)
        width = _shaping._check_depth(width, "width")
        in_features = width if in_features is None else _shaping._check_depth(in_features, "in_features")
        self.transform = transform
        self.width, self.depth, self.in_features = width, depth, in_features
        kw = dict(bias=False, dtype=dtype, device=device)

        def linear(i, o):
            lin = nn.Linear(i, o, **kw)
            _init_weight_(lin.weight, init, generator)
            return lin

        layers: list[nn.Module] = []
        if shortcut_weight is None:
            self.shortcut_weight = None
            dims = [in_features] + [width] * depth
            for i, o in zip(dims[:-1], dims[1:]):
                layers += [linear(i, o), ShapedActivation(transform)]
            self.network = _shaping.vanilla(depth)
        else:
            w = _shaping._check_shortcut(shortcut_weight)
            self.shortcut_weight = w
            tree = _shaping.rescaled_resnet(depth, w, branch_depth)
            layers.append(linear(in_features, width))
            for _ in range(tree.times):
                branch = []
                for _ in range(branch_depth):
                    branch += [linear(width, width), ShapedActivation(transform)]
                branch.append(linear(width, width))
                layers.append(_Residual(nn.Sequential(*branch), w))
            self.network = _shaping.Chain((_shaping.Affine(), tree))
        self.body = nn.Sequential(*layers)
        self.readout = None if out_features is None else linear(width, int(out_features))

    def features(self, x):
        """Output of the last combined layer / block (what the global C map describes)."""
        return self.body(x)

    def forward(self, x):
        h = self.body(x)
        return h if self.readout is None else self.readout(h)


def shaped_mlp(transform, width, depth, **kw) -> ShapedMLP:
    """:class:`ShapedMLP` for a given transformed activation."""
    return ShapedMLP(transform, width, depth, **kw)


def tat_mlp(width, depth, activation="leaky_relu", *, eta=0.9, tau=0.3, shortcut_weight=None,
            branch_depth=1, **kw) -> ShapedMLP:
    """TAT-initialised MLP: TReLU (``activation='leaky_relu'``, target ``eta``) or smooth TAT (``tau``)."""
    w = 0.0 if shortcut_weight is None else shortcut_weight
    if isinstance(activation, str) and activation.strip().lower() in ("leaky_relu", "relu", "trelu"):
        transform = _shaping.trelu(depth, eta, w, branch_depth)
    else:
        net = _shaping.vanilla(depth) if shortcut_weight is None else \
            _shaping.rescaled_resnet(depth, w, branch_depth)
        transform = _shaping.tat_transform(activation, tau=tau, network=net)
    return ShapedMLP(transform, width, depth, shortcut_weight=shortcut_weight, branch_depth=branch_depth, **kw)


def dks_mlp(width, depth, activation, *, zeta=1.5, shortcut_weight=None, branch_depth=1, **kw) -> ShapedMLP:
    """DKS-initialised MLP for a smooth activation (C_f(0) = 0, maximal slope zeta)."""
    w = 0.0 if shortcut_weight is None else shortcut_weight
    net = _shaping.vanilla(depth) if shortcut_weight is None else _shaping.rescaled_resnet(depth, w, branch_depth)
    transform = _shaping.dks_transform(activation, zeta=zeta, network=net)
    return ShapedMLP(transform, width, depth, shortcut_weight=shortcut_weight, branch_depth=branch_depth, **kw)


def eoc_relu_mlp(width, depth, **kw) -> ShapedMLP:
    """Edge-of-chaos ReLU MLP: sqrt(2) ReLU with N(0, 1/fan_in) weights (= He init, sigma_w^2 = 2)."""
    return ShapedMLP(_shaping.normalized_leaky_relu(0.0), width, depth, **kw)


# ---------------------------------------------------------------------------
# Monte-Carlo C maps.
# ---------------------------------------------------------------------------
def input_pairs(c, dim, n_pairs=1, generator=None, dtype=torch.float64):
    """Input pairs with ||x||^2 = dim and cosine similarity exactly c.

    Returns ``(x1, x2)`` of shape (len(c), n_pairs, dim): x1 = sqrt(dim) u,
    x2 = sqrt(dim) (c u + sqrt(1 - c^2) v) with u, v random orthonormal.
    """
    c = torch.as_tensor(np.clip(np.asarray(c, dtype=np.float64).reshape(-1), -1, 1), dtype=dtype)
    if dim < 2:
        raise ValueError(f"dim must be >= 2 to realise a cosine similarity, got {dim}")
    g = torch.randn(c.numel(), n_pairs, dim, 2, generator=generator, dtype=dtype)
    u = g[..., 0] / g[..., 0].norm(dim=-1, keepdim=True)
    v = g[..., 1] - (g[..., 1] * u).sum(-1, keepdim=True) * u
    v = v / v.norm(dim=-1, keepdim=True)
    s = math.sqrt(dim)
    cc = c[:, None, None]
    return s * u, s * (cc * u + torch.sqrt(1 - cc * cc) * v)


class MCResult(NamedTuple):
    """Monte-Carlo estimate: ``mean`` and standard error ``se`` over initialisations (numpy)."""

    mean: np.ndarray
    se: np.ndarray
    samples: np.ndarray  # (n_init, len(c)): per-initialisation means over input pairs


def mc_cosine_similarity(make_model: Callable[[torch.Generator], nn.Module], c: Sequence[float], *,
                         in_features: int, n_init: int = 8, n_pairs: int = 4, seed: int = 0,
                         dtype=torch.float64, device=None) -> MCResult:
    """Empirical global C map: cosine similarity of ``model.features`` for inputs of cosine c.

    ``make_model(generator)`` builds one freshly initialised network (e.g.
    ``lambda g: tat_mlp(256, 20, generator=g, dtype=torch.float64)``). For each
    of ``n_init`` initialisations the cosine similarity is averaged over
    ``n_pairs`` random input pairs per c; the error bar is the standard error
    over initialisations (which are independent).
    """
    if n_init < 2:
        raise ValueError(f"n_init must be >= 2 for an error bar, got {n_init}")
    gen = torch.Generator().manual_seed(int(seed))
    per_init = []
    for _ in range(n_init):
        model = make_model(gen)
        feats = getattr(model, "features", model)
        x1, x2 = input_pairs(c, in_features, n_pairs, generator=gen, dtype=dtype)
        shape = x1.shape[:-1]
        p = next(model.parameters(), None)
        xs = torch.cat([x1.reshape(-1, in_features), x2.reshape(-1, in_features)])
        if p is not None:  # the model's dtype and device unless given
            xs = xs.to(dtype=p.dtype, device=p.device if device is None else device)
        with torch.no_grad():
            y = feats(xs)
        y1, y2 = y.double().cpu().chunk(2)
        cos = F.cosine_similarity(y1, y2, dim=-1).reshape(shape).mean(-1)
        per_init.append(cos.numpy())
    samples = np.stack(per_init)
    return MCResult(samples.mean(0), samples.std(0, ddof=1) / math.sqrt(n_init), samples)
