"""The primitives of the calculus, one module per family, and the blocks built from them.

=====================  ==========================================================
module                 primitives
=====================  ==========================================================
``state``              the states they map: :class:`Signal` (one input and a
                       pair), :class:`GramSignal` (two inputs of any norms, NTK),
                       :class:`TokenSignal` (a batch over its tokens/positions)
``base``               the :class:`Primitive` interface and shared helpers
``linear``             :class:`Dense` (``dense``)
``conv``               :class:`Conv` (``conv``), :class:`AvgPool` (``avg_pool``): along
                       the positions of an input
``attention``          :class:`Attention` (``attention``): self-attention over the
                       tokens
``elementwise``        :class:`ActivationLayer` (``act``), :class:`Scale` (``scale``)
``norms``              LayerNorm pre/post (``layer_norm``), :class:`GroupNorm`,
                       :class:`RMSNorm`, :class:`BatchNorm`
``combinators``        :class:`Chain` (``serial``), :class:`Residual` (``residual``)
``blocks``             the menu's blocks: ``mlp``, ``resmlp``, ``mixer``, ``resnet_v2``,
                       ``transformer``
``trees``              the JSON form of a tree
=====================  ==========================================================

Each primitive holds every rule about it (state map, APJN factor, Gram rule,
its short form and JSON, its torch realisation): see :mod:`.base` and
docs/architecture.md, "Adding a primitive".
"""
from .attention import Attention, attention
from .base import AXES, Primitive, short
from .blocks import (RESNET_NORMS, TRANSFORMER_NORMS, mixer, mixer_block, mlp, mlp_block, resmlp, resmlp_block,
                     resnet_v2, transformer)
from .combinators import Chain, Residual, residual, serial
from .conv import AvgPool, Conv, avg_pool, conv
from .elementwise import ActivationLayer, Scale, act, scale
from .linear import Dense, dense
from .norms import (BatchNorm, GroupNorm, LayerNorm, LayerNormImage, LayerNormPost, LayerNormPre, RMSNorm, batch_norm,
                    group_norm,
                    layer_norm, rms_norm)
from .state import GramSignal, Signal, TokenSignal
from .trees import primitive_classes, tree_from_json, tree_to_json

__all__ = [
    "AXES", "Primitive", "short", "Signal", "GramSignal", "TokenSignal",
    "Dense", "dense", "Conv", "conv", "Attention", "attention", "AvgPool", "avg_pool", "ActivationLayer", "act", "Scale", "scale",
    "LayerNormPre", "LayerNorm", "LayerNormPost", "LayerNormImage", "GroupNorm", "RMSNorm", "BatchNorm", "layer_norm", "group_norm",
    "rms_norm", "batch_norm",
    "Chain", "Residual", "serial", "residual",
    "mlp_block", "resmlp_block", "mixer_block", "mlp", "resmlp", "mixer", "resnet_v2", "RESNET_NORMS", "transformer", "TRANSFORMER_NORMS",
    "tree_to_json", "tree_from_json", "primitive_classes",
]
