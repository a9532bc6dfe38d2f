r"""Torch realisations of :class:`~meanfield.calculus.Architecture` blocks, batched over initialisations.

One spec, two realisations: :func:`realise` walks the primitive tree of
``Architecture.block_spec()`` (the same tree the symbolic layer derives the
recursions from) and returns a torch module for each node. Nothing here is
written per architecture; a new primitive in the calculus needs one class
here and nothing else.

Tensor layout
-------------
Every module maps a tensor ``z`` of shape ``(I, P, S, B, T, N)`` to one of
the same layout:

=====  =====================================================================
I      independent initialisations (networks), all computed in one pass
P      parameter points (sigma_w, sigma_b, mu, eps): a (sigma_w, sigma_b)
       grid shares the same random numbers (common random numbers)
S      slot 0 is the primal preactivation h; slots 1.. are tangents (JVPs)
B      inputs of the batch (BatchNorm mixes them)
T      tokens (patches) for ResMLP / MLP-Mixer blocks, 1 for MLPs
N      features (channels), the width
=====  =====================================================================

Tangents are propagated by the forward-mode (JVP) rule of each primitive:
Dense ``t -> W t`` (no bias), activation ``t -> phi'(h) t``, the
normalisations by their exact linearisation, ``Residual`` and ``Scale``
linearly. So one pass gives the preactivations and any number of
Jacobian-vector products, with the tangents riding along the primal in the
same batched matrix multiplications. ``tests/test_verification_networks.py``
checks these rules against ``torch.func.jvp`` of the primal computation.

Weights
-------
A Dense layer draws a standard normal matrix G of shape (I, out, in) and a
vector g of shape (I, out) from the :class:`Context` (on the CPU one call
fills G for all I initialisations: counter-based streams of
:mod:`._philox`, keyed by (seed, initialisation, draw number)), and uses

    W = sigma_w * G / sqrt(fan_in),    b = sigma_b * g,

for every parameter point at once: the matrix product with G is shared by
all P points (one ``torch.bmm`` per layer), the scale sigma_w / sqrt(fan_in)
and the bias are applied per point. Weights are drawn when a layer runs and
are not stored, so memory does not grow with depth; the same seed replays
the same network, whatever the chunking of the initialisations.

Normalisations have no affine parameters (identity at initialisation) and no
epsilon in the variance: LayerNorm normalises over the features (or, with
``axis='tokens'``, over the tokens) of each token of each input; BatchNorm
normalises each neuron over the inputs of the batch with the biased batch
variance (AutoInit eq. 22).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

from .. import symbols as S
from ..activations import Erf
# the one table of torch activations (also re-exported here for older imports)
from .activations import torch_activation
from ..calculus import (ActivationLayer, Architecture, BatchNorm, Chain, Dense, LayerNorm, LayerNormPost,
                        LayerNormPre, Primitive, Residual, RMSNorm, Scale, TreeSpec)

__all__ = [
    "Context",
    "torch_activation",
    "realise",
    "RDense",
    "RActivation",
    "RLayerNorm",
    "RBatchNorm",
    "RRMSNorm",
    "RScale",
    "RResidual",
    "RChain",
    "input_layer",
]

_PARAM_SYMBOLS = (S.sigma_w, S.sigma_b, S.mu, S.eps)
#: Dense layers on the CPU apply scale and bias in one numba pass (torch/_fused.py; the same numbers as
#: torch's three passes, bit for bit); False restores the torch operations (benchmarks compare both)
FUSED_EPILOGUE = True
#: float32 erf networks on the CPU use torch/_fused.erf32 (within 0.54 ulp of erf, against 0.74 for torch.erf,
#: and ~20 % less CPU time); False restores torch.erf (the numbers then differ in the last bit here and there)
FAST_ERF = True
#: counter-based streams from here on are probes (see montecarlo._probes); below, the weight draws of a pass
PROBE_STREAMS = 1 << 31


# ---------------------------------------------------------------------------
# Random numbers and parameter values.
# ---------------------------------------------------------------------------
class Context:
    """Random numbers for the initialisations of one pass, and per-point parameter values.

    Two sources of standard normals, both giving initialisation i numbers that
    depend only on (seed, i), so results do not depend on how the
    initialisations are split into chunks or shards:

    * counter-based (``seed=`` and ``init_ids=``; the CPU default of
      :func:`~meanfield.verification.monte_carlo`): draw number n of the pass
      is stream n of :mod:`._philox` (Philox4x32-10 + ziggurat) for every
      initialisation, generated for all of them in one parallel call;
    * per-initialisation generators (``generators=``, one torch.Generator per
      initialisation, called in turn; used on CUDA, where the generators are
      the device's own Philox).

    Parameters
    ----------
    generators : list of torch.Generator, optional
        One per initialisation (on ``device``).
    params : dict
        Maps 'sigma_w', 'sigma_b', 'mu', 'eps' to 1-d arrays of length P
        (the parameter points).
    seed : int, optional
        With ``init_ids``: the counter-based source.
    init_ids : sequence of int, optional
        The global indices of the initialisations of this pass.
    """

    def __init__(self, generators: Sequence[torch.Generator] | None, params: dict, device, dtype, *,
                 seed: int | None = None, init_ids: Sequence[int] | None = None):
        if (generators is None) == (init_ids is None):
            raise ValueError("Context needs either generators (one per initialisation) or seed and init_ids")
        self.generators = None if generators is None else list(generators)
        self.seed = seed
        self.init_ids = list(init_ids) if init_ids is not None else list(range(len(self.generators)))
        self._draws = 0  # weight draws so far in this pass: the stream number of the next one
        self.device = torch.device(device)
        self.dtype = dtype
        arrays = {k: np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in params.items()}
        P = max(a.size for a in arrays.values())
        self.P = P
        self._values = {S.sigma_w: np.broadcast_to(arrays.get("sigma_w", np.ones(1)), (P,)),
                        S.sigma_b: np.broadcast_to(arrays.get("sigma_b", np.zeros(1)), (P,)),
                        S.mu: np.broadcast_to(arrays.get("mu", np.zeros(1)), (P,)),
                        S.eps: np.broadcast_to(arrays.get("eps", np.ones(1)), (P,))}
        self._cache: dict = {}

    @property
    def n_init(self) -> int:
        return len(self.init_ids)

    def normal(self, shape) -> torch.Tensor:
        """Standard normal tensor of shape (I, *shape): the pass's next weight draw, row i for initialisation i."""
        stream = self._draws
        self._draws += 1
        if stream >= PROBE_STREAMS:
            raise ValueError(f"more than {PROBE_STREAMS} weight draws in one pass")
        return self.stream(stream, shape)

    def stream(self, stream: int, shape) -> torch.Tensor:
        """Stream ``stream`` of every initialisation, shape (I, *shape) (counter-based source only)."""
        shape = tuple(int(s) for s in shape)
        if self.generators is not None:
            out = torch.empty((self.n_init,) + shape, device=self.device, dtype=self.dtype)
            for i, g in enumerate(self.generators):
                torch.randn(shape, generator=g, out=out[i])
            return out
        from ._philox import fill_normal

        flat = np.empty((self.n_init, math.prod(shape)),
                        dtype=np.float32 if self.dtype == torch.float32 else np.float64)
        fill_normal(flat, self.seed, self.init_ids, stream)
        out = torch.from_numpy(flat).view((self.n_init,) + shape)
        return out if self.device.type == "cpu" else out.to(self.device)

    def value(self, expr) -> torch.Tensor:
        """The parameter expression (a symbol or number, e.g. sigma_w) at every point: shape (P,)."""
        key = expr
        if key not in self._cache:
            e = sp.sympify(expr)
            free = e.free_symbols - set(_PARAM_SYMBOLS)
            if free:
                raise ValueError(f"parameter expression {e} has symbols {sorted(map(str, free))}; "
                                 "only sigma_w, sigma_b, mu, eps can be set numerically")
            f = sp.lambdify(_PARAM_SYMBOLS, e, modules="numpy")
            vals = np.broadcast_to(np.asarray(f(*(self._values[s] for s in _PARAM_SYMBOLS)),
                                              dtype=np.float64), (self.P,))
            self._cache[key] = torch.tensor(np.array(vals), device=self.device, dtype=self.dtype)
        return self._cache[key]


def _plain(t: torch.Tensor) -> bool:
    """A tensor numba may write through: no autograd history, not wrapped by torch.func (jvp, vmap)."""
    return not t.requires_grad and not torch._C._functorch.is_functorch_wrapped_tensor(t)


def _pview(v: torch.Tensor) -> torch.Tensor:
    """(P,) -> (1, P, 1, 1, 1, 1) for broadcasting against z."""
    return v.view(1, -1, 1, 1, 1, 1)


# ---------------------------------------------------------------------------
# Realised primitives.
# ---------------------------------------------------------------------------
class RLayer(nn.Module):
    """Base class: ``forward(z, ctx)`` on the (I, P, S, B, T, N) layout."""

    def forward(self, z: torch.Tensor, ctx: Context) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class RDense(RLayer):
    """Dense layer on the features (last axis) or on the tokens (axis -2).

    The bias is added to the primal slot only; tangents see the linear part.
    ``out`` is the output size (the input size when None).
    """

    def __init__(self, spec: Dense, out: int | None = None):
        super().__init__()
        self.spec = spec
        self.axis = "tokens" if spec.axis == "tokens" else "features"
        self.out = out

    def forward(self, z, ctx):
        I, P, Sl, B, T, N = z.shape
        if self.axis == "features":
            out = self.out or N
            G = ctx.normal((out, N))
            y = torch.bmm(z.reshape(I, P * Sl * B * T, N), G.transpose(1, 2)).view(I, P, Sl, B, T, out)
            fan_in = N
            g = ctx.normal((out,)).view(I, 1, 1, 1, out)
        else:
            out = self.out or T
            G = ctx.normal((out, T))
            y = torch.matmul(G.unsqueeze(1), z.reshape(I, P * Sl * B, T, N)).view(I, P, Sl, B, out, N)
            fan_in = T
            g = ctx.normal((out,)).view(I, 1, 1, out, 1)
        scale = _pview(ctx.value(self.spec.sigma_w) / math.sqrt(fan_in))
        sb = ctx.value(self.spec.sigma_b)
        if (FUSED_EPILOGUE and self.axis == "features" and y.device.type == "cpu" and y.shape[1] == scale.shape[1]
                and y.is_contiguous() and g.is_contiguous() and y.dtype in (torch.float32, torch.float64)
                and y.dtype == g.dtype == scale.dtype == sb.dtype
                and _plain(y) and _plain(g) and _plain(scale) and _plain(sb)):
            # one pass instead of three, bit for bit the same numbers (torch/_fused.py)
            from ._fused import affine_
            affine_(y.numpy().reshape(I, y.shape[1], Sl, B * T, out), scale.reshape(-1).numpy(),
                    sb.numpy(), g.reshape(I, out).numpy())
            return y
        y = y.mul_(scale) if y.shape[1] == scale.shape[1] else y * scale
        y[:, :, 0] += sb.view(1, -1, 1, 1, 1) * g
        return y

    def extra_repr(self):
        return f"axis={self.axis!r}, sigma_w={self.spec.sigma_w}, sigma_b={self.spec.sigma_b}"


def input_layer(width: int, axis: str = "features") -> RDense:
    """The input layer h^1 = W x + b (sigma_w, sigma_b), mapping N0 features to ``width``."""
    return RDense(Dense(axis=axis), out=width)


class RActivation(RLayer):
    """phi on the primal, phi'(h) * t on the tangents."""

    def __init__(self, spec: ActivationLayer):
        super().__init__()
        self.spec = spec
        self.phi, self.dphi = torch_activation(spec.phi)

    def forward(self, z, ctx):
        h = z[:, :, :1]
        if z.shape[2] == 1:
            if (FAST_ERF and type(self.spec.phi) is Erf and h.dtype == torch.float32 and h.device.type == "cpu"
                    and h.is_contiguous() and _plain(h)):
                # float32 on the CPU: a vectorised rational erf (0.54 ulp; torch's is 0.74 ulp and ~20 % slower)
                from ._fused import erf32
                return torch.from_numpy(erf32(h.numpy()))
            return self.phi(h)
        out = torch.empty_like(z)
        out[:, :, :1] = self.phi(h)
        torch.mul(self.dphi(h), z[:, :, 1:], out=out[:, :, 1:])
        return out

    def extra_repr(self):
        return f"phi={self.spec.phi.name}"


def _normalise(z: torch.Tensor, dim: int) -> torch.Tensor:
    """(h - mean) / std over ``dim`` (biased variance, no epsilon), with its exact JVP.

    y = (h - m) / s;  dy = (dt - mean(dt) - y * mean(y * dt)) / s.
    """
    h = z[:, :, :1]
    c = h - h.mean(dim, keepdim=True)
    s = c.pow(2).mean(dim, keepdim=True).sqrt()
    y = c / s
    if z.shape[2] == 1:
        return y
    t = z[:, :, 1:]
    dt = (t - t.mean(dim, keepdim=True) - y * (y * t).mean(dim, keepdim=True)) / s
    return torch.cat([y, dt], dim=2)


class RLayerNorm(RLayer):
    """LayerNorm without affine parameters, over the features of each token (or over the tokens).

    Realises both :class:`~meanfield.calculus.LayerNormPre` (on a
    preactivation) and :class:`~meanfield.calculus.LayerNormPost` (on
    phi(h)); where it sits in the chain is what differs.
    """

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.dim = -2 if getattr(spec, "axis", "features") == "tokens" else -1

    def forward(self, z, ctx):
        return _normalise(z, self.dim)

    def extra_repr(self):
        return f"{type(self.spec).__name__}, dim={self.dim}"


def _rms_normalise(z: torch.Tensor, dim: int) -> torch.Tensor:
    """h / r with r = sqrt(mean h^2) over ``dim`` (no epsilon, no gain), with its exact JVP.

    y = h / r;  dr = mean(h dt) / r, so dy = (dt - y * mean(y * dt)) / r.
    """
    h = z[:, :, :1]
    r = h.pow(2).mean(dim, keepdim=True).sqrt()
    y = h / r
    if z.shape[2] == 1:
        return y
    t = z[:, :, 1:]
    return torch.cat([y, (t - y * (y * t).mean(dim, keepdim=True)) / r], dim=2)


class RRMSNorm(RLayer):
    """RMSNorm without gain over the features of each token (pre or post: the same map)."""

    def __init__(self, spec: RMSNorm):
        super().__init__()
        self.spec = spec

    def forward(self, z, ctx):
        return _rms_normalise(z, -1)


class RBatchNorm(RLayer):
    """BatchNorm without affine parameters: each neuron over the inputs of the batch (axis B)."""

    def __init__(self, spec: BatchNorm):
        super().__init__()
        self.spec = spec

    def forward(self, z, ctx):
        if z.shape[3] < 2:
            raise ValueError("BatchNorm needs a batch of at least 2 inputs (batch >= 2)")
        return _normalise(z, 3)


class RScale(RLayer):
    """Multiplication by eps (LayerScale at initialisation)."""

    def __init__(self, spec: Scale):
        super().__init__()
        self.spec = spec

    def forward(self, z, ctx):
        return z * _pview(ctx.value(self.spec.eps))


class RChain(RLayer):
    """Layers in order."""

    def __init__(self, spec: Chain):
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList([realise(p) for p in spec.layers])

    def forward(self, z, ctx):
        for layer in self.layers:
            z = layer(z, ctx)
        return z


class RResidual(RLayer):
    """branch(z) + mu z (the same linear map on the tangents)."""

    def __init__(self, spec: Residual):
        super().__init__()
        self.spec = spec
        self.branch = realise(spec.branch)

    def forward(self, z, ctx):
        return self.branch(z, ctx) + _pview(ctx.value(self.spec.mu)) * z


_REALISATIONS = [
    (Dense, RDense),
    (ActivationLayer, RActivation),
    (LayerNormPre, RLayerNorm),
    (LayerNormPost, RLayerNorm),
    (LayerNorm, RLayerNorm),
    (RMSNorm, RRMSNorm),
    (BatchNorm, RBatchNorm),
    (Scale, RScale),
    (Residual, RResidual),
    (Chain, RChain),
]


def realise(spec: Primitive | Architecture) -> RLayer:
    """The torch module of a primitive tree (or of an Architecture's block)."""
    if isinstance(spec, TreeSpec):
        spec = spec.block_spec()
    for cls, rcls in _REALISATIONS:
        if isinstance(spec, cls):
            return rcls(spec)
    raise ValueError(f"no torch realisation for primitive {type(spec).__name__}; "
                     f"known: {', '.join(c.__name__ for c, _ in _REALISATIONS)}")
