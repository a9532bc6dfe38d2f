r"""Torch realisations of :class:`~meanfield.calculus.Architecture` blocks, batched over initialisations.

One spec, two realisations: :func:`realise` walks the primitive tree of
``Architecture.block_spec()`` (the same tree the symbolic layer derives the
recursions from) and returns a torch module for each node, an :class:`RLayer`
that runs the primitive's own ``torch_forward`` (written beside its theory in
:mod:`meanfield.layers`). Nothing here is written per primitive.

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

from torch import nn

from ..calculus import Architecture, TreeSpec
from ..layers import Dense, Primitive
# the one table of torch activations (also re-exported here for older imports)
from .activations import torch_activation
from .context import PROBE_STREAMS, Context

__all__ = ["Context", "PROBE_STREAMS", "torch_activation", "realise", "RLayer", "input_layer"]


class RLayer(nn.Module):
    """A primitive realised as a torch module: ``forward(z, ctx)`` on the (I, P, S, B, T, N) layout.

    Runs ``spec.torch_forward(z, ctx, *parts)`` with the realised children of
    a combinator as ``parts``; ``options`` are passed on (the input layer's
    output size ``out``).
    """

    def __init__(self, spec: Primitive, **options):
        super().__init__()
        if type(spec).torch_forward is Primitive.torch_forward:
            raise ValueError(f"no torch realisation for {spec!r} ({type(spec).__name__} has no torch_forward)")
        self.spec = spec
        self.options = options
        self.parts = nn.ModuleList([realise(child) for child in spec.children()])

    def forward(self, z, ctx: Context):
        return self.spec.torch_forward(z, ctx, *self.parts, **self.options)

    def extra_repr(self):
        return "" if self.parts else repr(self.spec)


def input_layer(width: int, axis: str = "features") -> RLayer:
    """The input layer h^1 = W x + b (sigma_w, sigma_b), mapping N0 features to ``width``."""
    return RLayer(Dense(axis=axis), out=width)


def realise(spec: Primitive | Architecture) -> RLayer:
    """The torch module of a primitive tree (or of an Architecture's or Network's block)."""
    if isinstance(spec, TreeSpec):
        spec = spec.block_spec()
    if not isinstance(spec, Primitive):
        raise ValueError(f"realise needs a primitive tree, an Architecture or a Network, got {spec!r}")
    return RLayer(spec)
