r"""Any torch model in: read a user's ``nn.Module`` into the primitive tree, and draw its weights.

:func:`from_torch` traces the module with ``torch.fx`` (symbolic tracing,
no parsing of source code) and maps every graph node to a primitive of
:mod:`meanfield.calculus`:

==========================================  =======================================
torch                                       primitive
==========================================  =======================================
``nn.Linear`` / ``F.linear``                ``dense()`` (``dense(sigma_b=0)`` without bias);
                                            between two ``transpose(-1, -2)``: ``dense(axis='tokens')``
``x @ W``, ``x @ W.T`` (+ ``b``) for        ``dense()`` (``dense(sigma_b=0)`` without ``+ b``): custom
parameters ``W``, ``b``                     linear modules, any parameter names
``x.size()``, ``x.shape``, ``len(x)``       nothing (numbers for the shapes of views)
``view``/``reshape``/``flatten`` of the     nothing (only before the input layer)
input, ``nn.Flatten``
activation modules and functional forms     ``act(...)`` (the table of :mod:`.torch_activations`)
``nn.LayerNorm``                            ``layer_norm`` (pre or post by position)
``nn.RMSNorm``                              ``rms_norm()``
``nn.BatchNorm1d``                          ``batch_norm()``
``a * x`` for a number or a parameter       ``scale(a)`` (a uniform per-channel scale: LayerScale)
                                            in a branch; ``mu`` on a skip
``x + f(x)``, ``mu * x + f(x)``             ``residual(f, mu=...)``
``nn.Identity``, ``nn.Dropout(p=0)``        nothing
``alpha * x + beta`` (ResMLP's Affine)       nothing, with alpha uniformly 1 and beta 0 (at initialisation)
``nn.Conv1d``, ``nn.Conv2d`` (groups=1)      ``conv(k, padding=..., dilation=..., stride=...)`` (padding
                                            d(k-1)/2 or 'same': 'same'; with ``padding_mode='circular'``:
                                            'circular'; 0: 'valid')
``nn.AvgPool1d``, ``nn.AvgPool2d``          ``avg_pool(k, stride=..., padding=...)``
``nn.LayerNorm([C, H, W])``, ``nn.GroupNorm``  ``layer_norm(axis='positions')`` (after a convolution; the
                                            groups of a GroupNorm hold the population's statistics at
                                            infinite channels)
``nn.MultiheadAttention`` (``batch_first``)  ``attention(heads, scaling='1/sqrt(d)')``, every projection at
as self-attention, ``att(a, a, a)[0]``      sigma_w (masks, cross-attention, extra keys refused)
``nn.AdaptiveAvgPool2d(1)``, ``x.mean((2,   the read-out's input (global average pooling, as
3))``, then ``flatten`` and ``nn.Linear``   ``kernels(readout='mean')``); a flatten of the positions
                                            alone: ``readout='flatten'``; not part of the block
==========================================  =======================================

A network repeating one block after an input layer (and before an optional
read-out layer) comes back as that block with ``depth`` = the number of
repeats; otherwise the whole stack after the input layer is the block
(depth 1). The input layer is an ``nn.Linear`` or, for a convolutional
network, its first convolution (the stem); the theory's input layer acts
on each position alone (a 1 x 1 convolution), so a wider stem changes K^1
on images whose positions differ, not the blocks' recursion. Maps with
positions are channels-first, as torch's convolutions write them.
Anything else is a ValueError naming the node, its target and its
position in the graph: among them grouped convolutions, BatchNorm over
images and InstanceNorm, which have no primitive yet.

:func:`initialise_` draws a model's weights in the convention of the theory
(W ~ N(0, sigma_w^2 / fan_in), b ~ N(0, sigma_b^2), normalisation affine
parameters at (1, 0)), in place; :func:`monte_carlo_module` measures K^l and
J^{1,l} at the block boundaries of the user's own module.
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .. import calculus as C
from ..layers import Attention, primitive_classes, short
from ..layers.conv import Conv
from ._sdpa import composite_attention
from .activations import read_function

__all__ = ["from_torch", "initialise_", "monte_carlo_module", "ModuleMonteCarlo"]


@dataclass
class _Val:
    """A graph value: ``layers`` applied to the value of fx node ``root``.

    ``gaussian``: the value is a preactivation; ``pending``: a number it was
    multiplied by (applied as a Scale in a branch, read as mu on a skip);
    ``ends``: fx nodes where the top-level items of ``layers`` end.
    """

    root: object
    layers: list
    gaussian: bool = True
    transposed: bool = False
    ends: list = field(default_factory=list)

    @property
    def primitives(self) -> list:
        """Every primitive applied so far, depth first (pending scales and read-out marks left out)."""
        return [q for p in self.layers if isinstance(p, C.Primitive) for q in p.primitives()]

    @property
    def positions(self) -> bool:
        """Whether the value is a channels-first map over positions (a convolution or pooling made it)."""
        return any(getattr(q, "axis", None) == "positions" for q in self.primitives)

    @property
    def tokens(self) -> bool:
        """Whether the value is (batch, tokens, channels) with tokens already mixed (ResMLP, the Mixer)."""
        return any(getattr(q, "axis", None) == "tokens" for q in self.primitives)

    @property
    def read_out(self) -> bool:
        """Whether the positions were already averaged or flattened into the read-out's input."""
        return any(isinstance(p, _ReadOut) for p in self.layers)


def _where(node, position) -> str:
    tgt = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"graph node {position} ({node.op} {tgt!r}, fx name {node.name!r})"


def _uniform(t: torch.Tensor, what: str, where: str) -> float:
    t = t.detach().double().reshape(-1)
    if t.numel() == 0 or not torch.allclose(t, t[0].expand_as(t), rtol=0, atol=0):
        raise ValueError(f"{where}: {what} is not uniform over channels; the infinite-width theory needs one "
                         "value per layer (set it to a constant, e.g. LayerScale initialised to eps)")
    return float(t[0])


@functools.lru_cache(maxsize=1)
def _module_readers() -> tuple:
    """The primitive classes that read a torch module (each its own ``from_torch_module``), in a fixed order."""
    classes = primitive_classes().values()
    return tuple(sorted((c for c in classes if "from_torch_module" in vars(c)), key=lambda c: c.__name__))


def _bind(fn, args, kwargs) -> dict:
    """The keyword arguments of a functional call, positional ones named (for F.leaky_relu(x, 0.2))."""
    try:
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*args, **kwargs)
        out = dict(bound.arguments)
        out.pop(next(iter(sig.parameters)), None)  # the input tensor
        return out
    except (TypeError, ValueError):
        return dict(kwargs)


class _Reader:
    def __init__(self, module, gm):
        self.module = module
        self.gm = gm
        self.vals = {}
        self.consts = {}
        self.shapes = set()      # fx nodes holding shape numbers (x.size(0), x.shape, len(x), ...)
        self.matmul_ends = set()  # fx nodes of x @ W: a Dense whose bias may follow as '+ b'
        self.params = {}  # get_attr node (or its transpose) -> (parameter name, transposed)
        self.custom_weights = []  # (parameter name, fan-in axis or None) of linear layers that are not nn.Linear
        self.custom_biases = []   # parameter names of their biases

    # -- helpers -------------------------------------------------------------
    def val(self, a, node, pos) -> _Val:
        if isinstance(a, torch.fx.Node) and a in self.vals:
            return self.vals[a]
        raise ValueError(f"{_where(node, pos)}: an operand is not a tensor computed from the input "
                         f"({a!r}); only the operations listed in meanfield.torch.from_torch are read")

    def number(self, a, node, pos):
        """A python number, a 0-d/uniform parameter or buffer; None if ``a`` is a traced tensor value."""
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a)
        if isinstance(a, torch.fx.Node) and a in self.consts:
            t, where = self.consts[a]
            if isinstance(t, torch.Tensor):
                return _uniform(t, f"the scale {a.target!r}", where)
            return float(t)
        return None

    def extend(self, v: _Val, prim, node, gaussian=None, where=None) -> _Val:
        layers = list(v.layers)
        where = where or f"fx node {node.name!r}"
        if not layers and not getattr(prim, "fresh_weights", False):
            raise ValueError(f"{where}: {short(prim)} acts on the raw input; the first layer must "
                             "be the input layer (nn.Linear, or a convolution), as in the theory")
        if v.read_out and not (isinstance(prim, C.Dense) and isinstance(layers[-1], _ReadOut)):
            raise ValueError(f"{where}: {short(prim) if isinstance(prim, C.Primitive) else 'a layer'} after "
                             "the positions were pooled or flattened; "
                             "only one read-out nn.Linear is read there")
        layers.append(prim)
        g = v.gaussian if gaussian is None else gaussian
        return _Val(v.root, layers, g, v.transposed, v.ends + [node])

    # -- the walk --------------------------------------------------------------
    def read(self):
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != 1:
            raise ValueError(f"from_torch reads modules with one tensor input; this one takes "
                             f"{len(placeholders)} ({', '.join(p.name for p in placeholders)})")
        out = None
        for pos, node in enumerate(self.gm.graph.nodes):
            if node.op == "placeholder":
                self.vals[node] = _Val(node, [], gaussian=False, ends=[])
                self.input_node = node
            elif node.op == "get_attr":
                # a parameter or buffer: read as a number only where it is used as a scale
                self.consts[node] = (_fetch_attr(self.gm, node.target), _where(node, pos))
                self.params[node] = (node.target, False)
            elif node.op == "call_module":
                self.call_module(node, pos)
            elif node.op in ("call_function", "call_method"):
                self.call_function(node, pos)
            elif node.op == "output":
                a = node.args[0]
                if isinstance(a, (tuple, list)):
                    if len(a) != 1:
                        raise ValueError(f"{_where(node, pos)}: the module returns {len(a)} values; one expected")
                    a = a[0]
                out = self.val(a, node, pos)
        return out

    def call_module(self, node, pos):
        m = self.gm.get_submodule(node.target)
        where = _where(node, pos) + f" [{type(m).__name__}]"
        x = self.val(node.args[0], node, pos) if node.args else None
        self.single_input_call(node, where)
        if isinstance(m, nn.Flatten):
            self.vals[node] = self.flatten_input(x, where)
            return
        if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
            self.vals[node] = self.read_out(x, "mean", m.output_size, where)
            return
        if isinstance(m, (nn.Identity,)) or (isinstance(m, nn.Dropout) and (m.p == 0 or not m.training)):
            self.vals[node] = x
            return
        for cls in _module_readers():
            prim = cls.from_torch_module(m, x, where)
            if prim is not None:
                self.vals[node] = self.extend(x, prim, node, gaussian=prim.output_gaussian, where=where)
                return
        reads = ", ".join(cls.torch_modules_read for cls in _module_readers())
        raise ValueError(f"{where}: unsupported module {type(m).__name__}; from_torch reads {reads}, "
                         "residual additions and scales")

    @staticmethod
    def single_input_call(node, where):
        """ValueError unless a module is called on its input alone: every other tensor argument the same
        value (self-attention's query, key and value), other arguments None or False except the harmless
        ``need_weights`` / ``average_attn_weights`` (masks, cross-attention and causality are not read)."""
        others = list(node.args[1:]) + [v for k, v in node.kwargs.items()
                                        if k not in ("need_weights", "average_attn_weights")]
        for a in others:
            if a is node.args[0] or a is None or a is False:
                continue
            raise ValueError(f"{where}: called with {a!r} besides its input; from_torch reads a module applied "
                             "to one value (self-attention with query = key = value, no mask, not causal)")

    def _act(self, node, x, phi, where):
        self.vals[node] = self.extend(x, C.ActivationLayer.on_torch_value(phi, x, where), node, gaussian=False)

    def linear(self, x, has_bias, node, where):
        axis = "tokens" if x.transposed else "features"
        return self.extend(x, C.dense(sigma_b=None if has_bias else 0, axis=axis), node, gaussian=True)

    def call_function(self, node, pos):
        tgt = node.target
        where = _where(node, pos)
        args = list(node.args)
        name = tgt if isinstance(tgt, str) else getattr(tgt, "__name__", "")
        if self.shape_query(node, tgt, name, args):
            self.shapes.add(node)
            return
        if self.const_view(node, tgt, name, args, pos):
            return
        if tgt in _FLATTENS or name in ("view", "reshape", "flatten"):
            x = self.val(args[0], node, pos)
            start = args[1] if len(args) > 1 else node.kwargs.get("start_dim", 0)
            if x.positions and "flatten" in str(name or tgt) and start == 2:
                self.vals[node] = self.patch_tokens(x, where)
            else:
                self.vals[node] = self.flatten_input(x, where)
            return
        if (tgt is torch.mean or name == "mean") and args and args[0] in self.vals:
            dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
            self.vals[node] = self.position_mean(self.vals[args[0]], dim, node.kwargs.get("keepdim", False), where)
            return
        if tgt is _op("getitem") and args and args[0] in self.vals and isinstance(args[1], int):
            # nn.MultiheadAttention returns (output, weights): [0] is the layer's output, the weights are
            # not a value of the network (an error if anything uses them)
            if not isinstance(self.vals[args[0]].layers[-1], Attention):
                raise ValueError(f"{where}: indexing a tensor is not read (only the output of attention, [0])")
            if args[1] == 0:
                self.vals[node] = self.vals[args[0]]
            return
        if tgt in (torch.matmul, _op("matmul")) or name == "matmul":
            self.vals[node] = self.matmul(node, pos, where)
            return
        # element-wise activations (functional, torch.* or tensor methods)
        if args and isinstance(args[0], torch.fx.Node) and args[0] in self.vals:
            phi = read_function(tgt, _bind(tgt, args, node.kwargs) if callable(tgt) else dict(node.kwargs))
            if phi is not None:
                self._act(node, self.vals[args[0]], phi, where)
                return
        if tgt is F.linear:
            x = self.val(args[0], node, pos)
            w = args[1] if len(args) > 1 else node.kwargs.get("weight")
            bias = args[2] if len(args) > 2 else node.kwargs.get("bias")
            self.custom_linear(w, bias, 1)  # F.linear's weight is (fan_out, fan_in)
            self.vals[node] = self.linear(x, bias is not None, node, where)
            return
        if name in ("transpose",) or tgt is torch.transpose:
            x = self.val(args[0], node, pos)
            dims = sorted(int(d) % 3 if isinstance(d, int) else d for d in args[1:3]) if len(args) >= 3 else None
            if dims not in ([1, 2],):
                raise ValueError(f"{where}: only transpose(1, 2) of (batch, tokens, channels) tensors is read")
            self.vals[node] = _Val(x.root, list(x.layers), x.gaussian, not x.transposed, list(x.ends))
            return
        if name in ("contiguous",):
            self.vals[node] = self.val(args[0], node, pos)
            return
        if tgt in (torch.mul, getattr(torch.Tensor, "mul", None)) or name in ("mul", "mul_") or tgt is _op("mul"):
            a, b = args[0], args[1]
            na, nb = self.number(a, node, pos), self.number(b, node, pos)
            if (na is None) == (nb is None):
                raise ValueError(f"{where}: a product of two computed tensors (or of two numbers) is not a "
                                 "primitive; scales must be numbers or uniform parameters")
            x = self.val(b if na is not None else a, node, pos)
            c = na if na is not None else nb
            self.vals[node] = self.extend(x, _PendingScale(c), node)
            return
        if tgt in (torch.add,) or name in ("add", "iadd") or tgt is _op("add") or tgt is _op("iadd"):
            self.vals[node] = self.add(node, pos, where)
            return
        raise ValueError(f"{where}: unsupported operation {name or tgt!r}; from_torch reads nn.Linear/F.linear, "
                         "activations, LayerNorm, RMSNorm, BatchNorm1d, x + f(x), mu * x + f(x) and scales")

    # -- what research code writes around its layers ----------------------------
    def shape_query(self, node, tgt, name, args) -> bool:
        """x.size(...), x.shape, x.dim(), len(x), and indexing/arithmetic on them: numbers, not layers."""
        if not args or not isinstance(args[0], torch.fx.Node):
            return False
        if args[0] in self.vals:
            return (name in ("size", "dim") or tgt is len
                    or (tgt is getattr and len(args) > 1 and args[1] in ("shape", "ndim")))
        return any(isinstance(a, torch.fx.Node) and a in self.shapes for a in args) and not any(
            isinstance(a, torch.fx.Node) and a in self.vals for a in args)

    def const_view(self, node, tgt, name, args, pos) -> bool:
        """W.T, W.t(), W.transpose(0, 1) of a parameter: the transposed parameter (x @ W.T)."""
        if not (args and isinstance(args[0], torch.fx.Node) and args[0] in self.consts):
            return False
        t, where = self.consts[args[0]]
        if isinstance(t, torch.Tensor) and t.ndim == 2 and (
                (tgt is getattr and args[1:] == ["T"]) or name == "t"
                or (name == "transpose" and sorted(int(d) % 2 for d in args[1:3]) == [0, 1])):
            self.consts[node] = (t.T, where)
            if args[0] in self.params:
                target, transposed = self.params[args[0]]
                self.params[node] = (target, not transposed)
            return True
        return False

    def flatten_input(self, x, where):
        """view/reshape/flatten of the raw input to (batch, features): the identity for the theory; of a map
        with positions: the flattened read-out (``kernels(readout='flatten')``), or nothing after a pooled one."""
        if x.read_out:
            return x
        if x.positions:
            return self.read_out(x, "flatten", 1, where)
        if x.layers:
            raise ValueError(f"{where}: a view/reshape/flatten after the input layer is not read (only a flatten "
                             "of the input, before the first Linear)")
        return x

    def patch_tokens(self, x, where):
        """``conv(x).flatten(2)`` for a stem convolution with stride = kernel, no padding (a patch embedding,
        as ResMLP and the MLP-Mixer write it): the theory's input layer on the patches, (batch, channels,
        tokens), whose ``transpose(1, 2)`` gives the tokens-by-channels layout of the token blocks."""
        stem = x.layers[0] if len(x.layers) == 1 else None
        if not (isinstance(stem, Conv) and stem.padding == "valid" and stem.dilation == 1
                and all(k == stem.stride for k in stem.kernel_size)):
            raise ValueError(f"{where}: flatten(2) of a map with positions is read only as a patch embedding: "
                             "the input layer a convolution with stride = kernel_size and no padding")
        return _Val(x.root, [C.dense(sigma_b=stem.sigma_b)], True, True, list(x.ends))

    def read_out(self, x, kind, output_size, where):
        """The positions averaged (``kind`` 'mean': global average pooling) or flattened: the input of a
        read-out Linear, after which nothing but that Linear is read."""
        if not (x.positions or x.tokens) or x.read_out:
            raise ValueError(f"{where}: a read-out over positions needs a map with positions or tokens (after a "
                             "convolution or a token-mixing layer), once")
        if kind == "mean" and any(o != 1 for o in (output_size if isinstance(output_size, tuple) else
                                                   (output_size,))):
            raise ValueError(f"{where}: adaptive pooling to {output_size}; only output_size 1 (global average "
                             "pooling, the read-out) is read")
        return _Val(x.root, list(x.layers) + [_ReadOut(kind)], x.gaussian, x.transposed, list(x.ends) + [None])

    def position_mean(self, x, dim, keepdim, where):
        """``x.mean(dims)`` over every position axis of a channels-first map (global average pooling), or over
        the tokens of a (batch, tokens, channels) one (ResMLP's read-out): ``kernels(readout='mean')``."""
        D = max((getattr(q, "position_dims", 0) for q in x.primitives), default=0)
        axes = list(range(2, 2 + D)) if x.positions else [1] if x.tokens and not x.transposed else None
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        ndim = 2 + D if x.positions else 3
        if axes is None or keepdim or sorted(int(d) % ndim for d in dims if isinstance(d, int)) != axes:
            raise ValueError(f"{where}: a mean is read only over every position axis of a channels-first map, "
                             "or over the tokens of a (batch, tokens, channels) one (the read-out, keepdim=False)")
        return self.read_out(x, "mean", 1, where)

    def matmul(self, node, pos, where):
        """x @ W for a parameter W of shape (fan_in, fan_out) (x @ W.T for a (fan_out, fan_in) W): a Dense."""
        a, b = node.args[0], node.args[1]
        w = self.consts.get(b)
        if a not in self.vals or w is None or not isinstance(w[0], torch.Tensor) or w[0].ndim != 2:
            raise ValueError(f"{where}: a matrix product is read only as x @ W with a 2-d parameter W "
                             "(a custom linear layer)")
        self.matmul_ends.add(node)
        self.custom_linear(b, None, 0)  # x @ W: W is (fan_in, fan_out)
        return self.linear(self.vals[a], False, node, where)

    def custom_linear(self, w, b, fan_in_axis):
        """Note the parameters of a linear layer that is not an nn.Linear, for drawing them.

        ``fan_in_axis``: the fan-in axis of ``w`` as the layer uses it; a
        parameter used transposed (``W.T``) has it on the other axis. A weight
        that is not a parameter is noted with axis None (it cannot be drawn).
        """
        if isinstance(w, torch.fx.Node):
            if w in self.params:
                target, transposed = self.params[w]
                self.custom_weights.append((target, 1 - fan_in_axis if transposed else fan_in_axis))
            else:
                self.custom_weights.append((w.name, None))
        if isinstance(b, torch.fx.Node):
            self.custom_biases.append(self.params[b][0] if b in self.params else b.name)

    def matmul_bias(self, a, b):
        """``(x @ W) + b`` with a parameter vector b: that Dense gets its bias; else None."""
        for x_, c_ in ((a, b), (b, a)):
            if x_ in self.vals and c_ in self.consts and isinstance(self.consts[c_][0], torch.Tensor):
                v = self.vals[x_]
                if v.ends and v.ends[-1] in self.matmul_ends and self.consts[c_][0].ndim == 1:
                    d = v.layers[-1]
                    self.custom_linear(None, c_, None)
                    return _Val(v.root, v.layers[:-1] + [C.dense(axis=d.axis)], v.gaussian, v.transposed, v.ends)
        return None

    def add(self, node, pos, where):
        a, b = node.args[0], node.args[1]
        if node.kwargs.get("alpha", 1) != 1:
            raise ValueError(f"{where}: add with alpha is not read")
        with_bias = self.matmul_bias(a, b)
        if with_bias is not None:
            return with_bias
        for x_, c_ in ((a, b), (b, a)):  # x + c with a constant c: a shift, read only when it is 0
            shift = self.number(c_, node, pos)
            if shift is not None and x_ in self.vals:
                if shift != 0.0:
                    raise ValueError(f"{where}: adding the constant {shift:g} (e.g. a nonzero Affine/norm bias) "
                                     "is not a primitive of the theory; at initialisation it must be 0")
                return self.vals[x_]  # ResMLP's Affine beta = 0 at initialisation: the identity
        va, vb = self.val(a, node, pos), self.val(b, node, pos)
        if va.root is not vb.root:
            raise ValueError(f"{where}: the two summands do not come from the same input")
        # the skip is the operand whose layers are a prefix of the other's (up to a final scale)
        for skip, br in ((va, vb), (vb, va)):
            sl = list(skip.layers)
            mu = 1.0
            if sl and isinstance(sl[-1], _PendingScale):
                mu = sl[-1].value
                sl = sl[:-1]
            n = len(sl)
            if br.layers[:n] == sl and len(br.layers) > n and skip.ends[:n] == br.ends[:n]:
                branch = [_finalise(p) for p in br.layers[n:] if not _is_unit(p)]
                try:
                    res = C.residual(*branch, mu=mu)
                except ValueError as err:
                    raise ValueError(f"{where}: residual addition: {err}") from None
                return _Val(skip.root, sl + [res], True, skip.transposed, skip.ends[:n] + [node])
        return self.projection(va, vb, node, where)

    def projection(self, va, vb, node, where):
        """g(x) + f(x) where neither summand is the other's input: a residual block with a projection shortcut.

        The layers after the block input that both summands share (ResNetV2's pre-activation, which the strided
        branch and the 1 x 1 shortcut both read) are written at the head of both: they have no weights at
        initialisation, so applying them twice is the same function. The shortcut is the summand with the
        pending scale mu, else the shorter one.
        """
        n = 0
        while (n < min(len(va.layers), len(vb.layers)) and va.layers[n] == vb.layers[n]
               and va.ends[n] == vb.ends[n]):
            n += 1
        start = n
        while start > 0 and not (isinstance(va.layers[start - 1], C.Residual)
                                 or getattr(va.layers[start - 1], "fresh_weights", False)):
            start -= 1
        if start == 0:
            raise ValueError(f"{where}: an addition that is not x + f(x), mu * x + f(x) or a projection "
                             "shortcut g(x) + f(x) after the input layer")
        shared = va.layers[start:n]
        sides = sorted(((va, vb), (vb, va)), key=lambda s: (not isinstance(s[0].layers[-1], _PendingScale),
                                                            len(s[0].layers)))
        err = None
        for skip, br in sides:
            sl = list(skip.layers[n:])
            mu = 1.0
            if sl and isinstance(sl[-1], _PendingScale):
                mu = sl.pop().value
            if any(isinstance(q, _PendingScale) for q in sl):
                continue
            branch = [_finalise(p) for p in shared + br.layers[n:] if not _is_unit(p)]
            try:
                res = C.residual(*branch, mu=mu, shortcut=C.serial(*shared, *sl))
            except ValueError as e:
                err = err or e
                continue
            return _Val(skip.root, va.layers[:start] + [res], True, skip.transposed, va.ends[:start] + [node])
        raise ValueError(f"{where}: an addition that is not x + f(x) or mu * x + f(x) (neither summand is "
                         f"the other's input), nor a projection shortcut of the theory: {err}")


@dataclass(frozen=True)
class _ReadOut:
    """Global average pooling ('mean') or a flatten ('flatten') of the positions: the read-out's input."""

    kind: str


@dataclass(frozen=True)
class _PendingScale:
    """A multiplication by a number, resolved to Scale (in a branch) or mu (on a skip)."""

    value: float


def _has_token_mlp(layers) -> bool:
    """Whether an activation follows a token-mixing Dense layer (the MLP-Mixer's token MLP)."""
    prev = None
    for q in C.serial(*layers).primitives():
        if isinstance(q, C.ActivationLayer) and isinstance(prev, C.Dense) and prev.axis == "tokens":
            return True
        if not isinstance(q, (C.Residual, C.Chain)):
            prev = q
    return False


def _to_channels(p):
    """The tree with every per-token ('features') Dense and LayerNorm on axis 'channels'.

    In an MLP-Mixer the token MLP's weights are shared by all channels, so
    the state of the theory is a pair of channels of one token
    (``Signal.pair_axis='channels'``, :func:`meanfield.calculus.mixer_block`):
    the channel MLP mixes and the LayerNorm normalises along that pair's own
    axis, which the tree says with axis='channels'. The torch modules are
    the same; only the tree's label differs from a ResMLP's.
    """
    import dataclasses

    if isinstance(p, C.Chain):
        return dataclasses.replace(p, layers=tuple(_to_channels(q) for q in p.layers))
    if isinstance(p, C.Residual):
        return dataclasses.replace(p, branch=_to_channels(p.branch))
    if getattr(p, "axis", None) == "features" and isinstance(p, (C.Dense, C.LayerNormPre, C.LayerNormPost,
                                                                   C.LayerNorm, C.RMSNorm)):
        return dataclasses.replace(p, axis="channels")
    return p


def _is_unit(p) -> bool:
    """A multiplication by exactly 1 (ResMLP's Affine alpha at initialisation): no layer at all."""
    return isinstance(p, _PendingScale) and p.value == 1.0


def _finalise(p):
    if isinstance(p, _PendingScale):
        return C.scale(p.value)
    return p


_FLATTENS = (torch.flatten, torch.reshape)


def _trace(module) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace`` with ``len(x)`` recorded as a graph node (as ``torch.fx.wrap('len')`` would).

    fx refuses ``len`` of a traced tensor unless the user's own module file
    calls ``torch.fx.wrap('len')``; research code writes ``x.reshape(len(x), -1)``,
    so ``len`` is registered, for the duration of this trace only, in the
    globals of every sub-module's ``forward``. The registry is fx's private
    table; where a torch version lacks it, ``len`` stays refused by fx.
    """
    import torch.fx._symbolic_trace as fx_trace

    table = getattr(fx_trace, "_wrapped_fns_to_patch", None)
    added = []
    if isinstance(table, dict):
        for m in module.modules():
            g = getattr(type(m).forward, "__globals__", None)
            if isinstance(g, dict) and "len" not in g and (id(g), "len") not in table:
                table[(id(g), "len")] = g
                added.append((id(g), "len"))
    try:
        return torch.fx.symbolic_trace(module)
    finally:
        for key in added:
            table.pop(key, None)


def _op(name):
    import operator

    return getattr(operator, name)


def _fetch_attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _period(seq):
    """Smallest p with seq == seq[:p] * (len(seq) // p)."""
    n = len(seq)
    for p in range(1, n + 1):
        if n % p == 0 and seq == seq[:p] * (n // p):
            return p
    return n


def _valid(layers) -> bool:
    try:
        C.Network(C.serial(*layers))
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class _Reading:
    network: "C.Network"
    gm: torch.fx.GraphModule
    input_node: object  # fx node whose output is h^1 (None: no input layer read)
    block_ends: tuple   # fx nodes whose outputs are h^2, h^3, ...
    custom_weights: tuple = ()  # (name, fan-in axis) of linear layers' weights that are not nn.Linear
    custom_biases: tuple = ()   # and of their biases


def _read(module, example_input):
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    try:
        gm = _trace(module)
    except Exception as err:
        raise ValueError(f"torch.fx could not trace {type(module).__name__}: {err}") from None
    if example_input is not None:
        if not isinstance(example_input, torch.Tensor):
            raise ValueError("example_input must be a torch.Tensor (one input batch)")
        with torch.no_grad():
            gm(example_input)  # fails here, not later, if the module cannot run on it
    r = _Reader(module, gm)
    out = r.read()
    keep = [i for i, p in enumerate(out.layers) if not _is_unit(p)]
    layers = [_finalise(out.layers[i]) for i in keep]
    ends = [out.ends[i] for i in keep]
    if not layers:
        raise ValueError(f"{type(module).__name__} has no layers from_torch can read")
    if isinstance(layers[0], (C.Residual, _ReadOut)) or not getattr(layers[0], "fresh_weights", False):
        raise ValueError(f"{type(module).__name__}: the first layer must be the input layer (nn.Linear, or a "
                         f"convolution), found {short(layers[0]) if isinstance(layers[0], C.Primitive) else 'a read-out'}")
    in_node = ends[0]
    readout = next((i for i, p in enumerate(layers) if isinstance(p, _ReadOut)), None)
    if readout is not None:   # the read-out (pooled or flattened positions, then a Linear) is not a block
        layers, ends = layers[:readout], ends[:readout]
        # nor is a head's norm -> phi before the pooling (ResNetV2's last pre-activation, the Mixer's LayerNorm)
        while len(layers) > 1 and not (isinstance(layers[-1], C.Residual) or layers[-1].fresh_weights):
            layers, ends = layers[:-1], ends[:-1]
    body, body_ends = layers[1:], ends[1:]
    if _has_token_mlp(body):  # an MLP-Mixer: its per-token layers act on the pair of channels
        body = [_to_channels(p) for p in body]
    # candidates (repeats, period, read-out cut), most repeats first; only the chosen block is
    # validated (a symbolic pass over a deep whole stack grows fast, so never do it needlessly)
    cands = []
    for cut in (0, 1):  # without and with a trailing read-out Linear
        if cut and (readout is not None or not (body and isinstance(body[-1], C.Dense))):
            continue
        seq = body[: len(body) - cut]
        if seq:
            p = _period(seq)
            cands.append((len(seq) // p, -cut, p, cut))
    if not body:
        raise ValueError(f"{type(module).__name__} has no block after its input layer")
    best = None
    for reps, _, p, cut in sorted(cands, reverse=True):
        if _valid(body[:p]):
            best = (reps, p, cut)
            break
    if best is None:
        C.Network(C.serial(*body))   # raises the tree's own ValueError
        raise ValueError(f"{type(module).__name__}: no repeated block of the theory found in its layers")
    n, p, cut = best
    net = C.Network(C.serial(*body[:p]), depth=n)
    block_ends = tuple(body_ends[(i + 1) * p - 1] for i in range(n))
    if n == 1 and len(body) > 1 and all(isinstance(q, C.Residual) for q in body[:p]):
        # a body of stages (no block repeats): its residual blocks are the boundaries Monte Carlo measures at,
        # as token_jacobians(..., per_layer=True) walks them
        block_ends = tuple(body_ends[:p])
    return _Reading(net, gm, in_node, block_ends, tuple(r.custom_weights), tuple(r.custom_biases))


def from_torch(module, example_input=None):
    """The :class:`~meanfield.Network` of a torch model, read with ``torch.fx``.

    Parameters
    ----------
    module : torch.nn.Module
        The user's model: an input ``nn.Linear``, then blocks, then optionally
        a read-out ``nn.Linear``. Its own ``forward`` may use torch functions,
        tensor methods and sub-modules (see the module docstring for what is read).
    example_input : torch.Tensor, optional
        One input batch; the traced module is run on it once to check it.

    Returns
    -------
    Network
        The repeated block with ``depth`` = its number of repeats (the whole
        stack after the input layer with depth 1 when blocks differ).
        Residual strengths and scales are numbers in the tree; weights and
        biases keep the symbols sigma_w, sigma_b (a Linear without bias has
        sigma_b = 0), so critical lines and points apply directly.

    Raises
    ------
    ValueError
        An operation the theory has no primitive for, named with its fx node
        and position.
    """
    return _read(module, example_input).network


def initialise_(module, sigma_w=1.0, sigma_b=0.0, generator=None, example_input=None):
    """Draw ``module``'s weights in place: W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2).

    Every ``nn.Linear``, ``nn.Conv1d`` and ``nn.Conv2d`` is drawn (the input layer and a read-out too;
    a convolution's fan-in counts its input channels times its taps), and the query, key and value
    projections of ``nn.MultiheadAttention`` (their biases set to 0; its output projection is a Linear);
    LayerNorm / RMSNorm / BatchNorm / GroupNorm affine parameters are set to (1, 0).
    With ``example_input`` (one input batch) the module is also read as by
    :func:`from_torch`, and its custom linear layers (``F.linear(x, W, b)``,
    ``x @ W + b``, ``x @ W.T + b`` on its own parameters) are drawn too, the
    fan-in read from how each weight is used. Other parameters (LayerScale)
    are left as they are. Returns ``module``.
    """
    from .._validate import check_real

    check_real("sigma_w", sigma_w, minimum=0)
    check_real("sigma_b", sigma_b, minimum=0)
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    norms = tuple(c for c in (nn.LayerNorm, getattr(nn, "RMSNorm", None), nn.BatchNorm1d, nn.GroupNorm)
                  if c is not None)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.MultiheadAttention) and m._qkv_same_embed_dim:
                # queries, keys, values: three (d, d) blocks of fan-in d, without bias (the theory's)
                m.in_proj_weight.normal_(0.0, float(sigma_w) / math.sqrt(m.embed_dim), generator=generator)
                if m.in_proj_bias is not None:
                    m.in_proj_bias.zero_()
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                fan_in = m.weight[0].numel()   # in_features, or in_channels / groups x the kernel's taps
                m.weight.normal_(0.0, float(sigma_w) / math.sqrt(fan_in), generator=generator)
                if m.bias is not None:
                    m.bias.normal_(0.0, float(sigma_b), generator=generator)
            elif isinstance(m, norms):
                if getattr(m, "weight", None) is not None:
                    m.weight.fill_(1.0)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
        if example_input is not None:
            reading = _read(module, example_input)
            for name, axis in reading.custom_weights:
                if axis is None:
                    raise ValueError(f"the weight {name!r} of a linear layer is not a parameter of "
                                     f"{type(module).__name__}; initialise_ cannot draw it")
                w = module.get_parameter(name)
                w.normal_(0.0, float(sigma_w) / math.sqrt(w.shape[axis]), generator=generator)
            for name in reading.custom_biases:
                module.get_parameter(name).normal_(0.0, float(sigma_b), generator=generator)
    return module


@dataclass(frozen=True)
class ModuleMonteCarlo:
    """K^l and J^{1,l} measured on a user's module at h^1 (input layer) and each block output.

    Arrays of length depth + 1 (l = 1 .. depth + 1), mean and standard error
    over ``n_init`` initialisations.
    """

    K: np.ndarray
    K_se: np.ndarray
    J: np.ndarray
    J_se: np.ndarray
    width: int
    n_init: int
    input_norm: float


class _Capture(torch.fx.Interpreter):
    def __init__(self, gm, replace_node, value, watch):
        super().__init__(gm)
        self.replace_node, self.value, self.watch = replace_node, value, watch
        self.seen = {}

    def run_node(self, n):
        out = self.value if n is self.replace_node else super().run_node(n)
        if n in self.watch:
            self.seen[n] = out
        return out


def monte_carlo_module(module, x, sigma_w, sigma_b, n_init=16, seed=0, n_probes=1):
    """Monte Carlo on the user's own module: K^l and J^{1,l} at the block boundaries (in a body of stages,
    which repeats no block, after every residual block).

    For each of ``n_init`` draws of :func:`initialise_` the module runs on
    the inputs ``x`` (batch, features); K^l is the mean of h^2 over
    features and inputs at h^1 and at every block output, J^{1,l} the APJN
    ||J v||^2 / N_l for a Gaussian probe v of h^1 (forward mode,
    ``torch.func.jvp``). Compare with ``theory_profile(from_torch(module),
    sigma_w, sigma_b, depth + 1, K0=sigma_w^2 |x|^2/N0 + sigma_b^2)``.
    """
    reading = _read(module, x)
    watch = (reading.input_node,) + reading.block_ends
    gen = torch.Generator().manual_seed(int(seed))
    Ks, Js = [], []
    for i in range(int(n_init)):
        initialise_(module, sigma_w, sigma_b, generator=gen, example_input=x)
        gm = _trace(module)
        nodes = {n.name: n for n in gm.graph.nodes}
        w = tuple(nodes[n.name] for n in watch)
        with torch.no_grad():
            cap = _Capture(gm, None, None, set(w))
            cap.run(x)
        hs = [cap.seen[n] for n in w]
        Ks.append([float(h.detach().pow(2).mean()) for h in hs])
        h1 = hs[0].detach()

        def rest(h, gm=gm, w=w):
            c = _Capture(gm, w[0], h, set(w[1:]))
            c.run(x)
            return tuple(c.seen[n] for n in w[1:])

        acc = np.zeros(len(w))
        for _ in range(int(n_probes)):
            v = torch.randn(h1.shape, generator=gen, dtype=h1.dtype)
            with composite_attention():
                _, tangents = torch.func.jvp(rest, (h1,), (v,))
            # J^{1,1} = 1 by definition; E||J v||^2 / N_l = tr(J J^T) / N_l for v ~ N(0, I)
            acc += np.array([1.0] + [float(t.detach().pow(2).sum() / t.numel()) for t in tangents])
        Js.append(acc / int(n_probes))
    Ks, Js = np.array(Ks), np.array(Js)
    n = Ks.shape[0]
    q = float(x.pow(2).sum(-1).mean() / x.shape[-1])
    return ModuleMonteCarlo(Ks.mean(0), Ks.std(0, ddof=1) / math.sqrt(n), Js.mean(0),
                            Js.std(0, ddof=1) / math.sqrt(n), int(hs[0].shape[-1]), n, q)
