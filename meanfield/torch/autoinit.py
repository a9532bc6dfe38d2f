r"""AutoInit: tune any torch model to criticality (He, Doshi, Gromov, arXiv:2206.13568).

Every parameter tensor ``theta`` of the model gets an auxiliary scalar
``a_theta`` (weights, biases, norm affine parameters, LayerScale, ...). A twin
of the model, evaluated with ``torch.func.functional_call`` on the parameters
``a_theta * theta``, measures the block-to-block APJN ``J^{l,l+1}`` and the
kernel ``K^l``; plain SGD on the ``a`` minimises a loss that is zero when every
``J^{l,l+1} = 1`` (Algorithm 1/2 of the paper). The user's module is never
edited during the run: :func:`autoinit` returns a tuned **copy** (or, with
``inplace=True``, applies the scales to the given module once, at the end).

Blocks and the index range of the losses
    ``blocks = [b_0, ..., b_n]`` names the submodules whose outputs are
    ``h^0, ..., h^n``. ``J^{l,l+1}`` is measured between the outputs of
    consecutive listed blocks, so every loss sums over **l = 0 .. n-1, every
    consecutive pair of listed blocks** (and the kernel term of JKL over the
    same pairs):

    * JLL (eq. 12): ``1/2 sum_l log(J^{l,l+1})^2``
    * JSL (sec. 2):  ``1/2 sum_l (J^{l,l+1} - 1)^2``
    * JKL (eqs. 24/45): ``JLL + lam/2 sum_l log(K^{l+1}/K^l)^2``

    The paper writes JKL twice with different ranges: eq. 24 sums
    ``l = 0 .. L+1`` ("we also included input and output layers") and eq. 45
    sums ``l = 1 .. L``. In a network of L + 2 layers indexed 0 .. L+1
    (Definition 1.2) eq. 24's upper limit needs ``J^{L+1,L+2}`` and
    ``K^{L+2}``, which do not exist; its evident meaning is ``l = 0 .. L``
    (all consecutive pairs from the input layer to the output layer), while
    eq. 45 drops the pair (0, 1). Here the range is whatever ``blocks`` lists:
    list the input layer to get eq. 24's (corrected) range, leave it out to
    get eq. 45's.

    A block output must be a tensor with the batch as its first axis, and
    ``h^{l+1}`` must depend on earlier activations only through ``h^l``
    (feed-forward blocks, paper eq. 1). Automatic ``blocks``: a model's own
    ``autoinit_blocks()`` (the package's ResMLP, MLP-Mixer and VGG define it); an
    ``nn.Sequential`` model's children that carry parameters (Linear, Conv,
    composite blocks; normalisation layers and parameter-free layers are part
    of the block they follow); otherwise the largest ``nn.Sequential`` /
    ``nn.ModuleList`` inside the model, by the same rule.

Estimator
    One forward pass gives every ``J^{l,l+1}`` at once for all probes: a
    forward hook on block ``l`` replaces the forward-mode tangent of ``h^l``
    by a Gaussian probe ``u_l`` and the hook on block ``l+1`` reads ``J u_l``;
    ``||J u||^2 / numel(h^{l+1})`` is the Hutchinson estimate (batch-aware,
    eq. 3; the probe on the input side, where eq. 7 puts it on the output
    side: both are unbiased). The ``n_probes`` probes are a batch of tangents
    (``torch.func.vmap`` over ``torch.func.jvp``), so the primal forward pass
    is computed once per step whatever the number of probes, with BatchNorm
    too (the probes share the batch, whose statistics they do not change).
    The loss is differentiated through the tangents by reverse mode. In that
    pass ``nn.Linear`` and ``nn.ReLU`` layers use the twin's own tangent rules
    (the parameters carry no tangent, and ReLU's mask has zero derivative), so
    no product with a zero weight tangent is computed and, in a ReLU network
    under JLL or JSL, no reverse pass runs through the primal: a step of the
    AutoInit paper's Fig. 1 network costs about 6 forward passes with 2
    probes (benchmarks/README.md). During
    the run (and every measurement) BatchNorm layers normalise with batch
    statistics and leave their running statistics alone, and dropout is off.

Modes
    ``mode="rescale"`` (Algorithm 2): the returned model has parameters
    ``a_theta * theta`` and no multipliers. ``mode="freeze"`` (the paper's VGG
    variant): the parameters stay, each tuned tensor gets a fixed multiplier
    through ``torch.nn.utils.parametrize`` (state-dict keys become
    ``...parametrizations.<name>.original``). The forward functions agree; the
    training dynamics differ.

Learning rate
    ``lr=None``: for a ReLU MLP (Linear + ReLU only, blocks = the Linear
    layers) the one-step learning rate of the ReLU theory (eq. 19 / 43, see
    :mod:`meanfield.autoinit`) per layer and per step, with
    ``sigma_w^2 = 2 J/a^2`` measured, which is exact per network at any width:
    each step sends every ``J^{l,l+1}`` to 1 up to the estimator's noise.
    Other models: ``DEFAULT_LR`` (0.03, the paper's ResMLP value).

Noise
    The loss is built from a Monte-Carlo estimate, so it has a floor set by
    ``n_probes`` and ``batch_size``; ``tol`` below that floor runs all
    ``steps``. ``average=k`` returns the mean of the last k iterates of the
    ``a`` instead of the last one (not in the paper; useful where the
    per-step estimate is noisy, e.g. BatchNorm at small spatial size).

Not differentiable things (ReLU patterns, max-pool choices) give zero
gradients, as in the paper; ``a`` of parameters that cannot change any
``J`` or ``K`` stay at 1.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

from .. import autoinit as _theory
from .._serialize import ShortRepr
from .._validate import check_choice as _check_choice
from ._sdpa import composite_attention
from .estimators import batch_statistics, exact_apjn, hutchinson_apjn

__all__ = [
    "AutoInitError",
    "AutoInitReport",
    "Measurement",
    "BatchSizeScan",
    "DEFAULT_LR",
    "autoinit",
    "measure",
    "apjn_vs_batch_size",
    "find_blocks",
    "save_scales",
    "load_scales",
    "apply_scales",
]

#: SGD learning rate of :func:`autoinit` when ``lr=None`` and the model is not a ReLU MLP (which gets its one-step rate)
DEFAULT_LR = 0.03
LOSSES = _theory.LOSSES
MODES = ("rescale", "freeze")
SCALES_FORMAT = "meanfield.autoinit.scales"

_NORMS = (_BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.instancenorm._InstanceNorm)
_ACTIVATION_WITH_PARAMS = (nn.PReLU,)


class AutoInitError(FloatingPointError):
    """The run produced a NaN/inf (or zero) APJN, kernel or loss; ``step`` and ``block`` say where."""

    def __init__(self, message, step=None, block=None):
        super().__init__(message)
        self.step, self.block = step, block


# --------------------------------------------------------------------------- blocks


def _is_block_candidate(module: nn.Module) -> bool:
    if isinstance(module, _NORMS + _ACTIVATION_WITH_PARAMS):
        return False
    return any(True for _ in module.parameters())


def find_blocks(model: nn.Module) -> list[str]:
    """The block names AutoInit uses when ``blocks=None`` (see the module docstring)."""
    own = getattr(model, "autoinit_blocks", None)
    if callable(own):
        return list(own())
    containers = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            prefix = f"{name}." if name else ""
            cands = [f"{prefix}{c}" for c, child in m.named_children() if _is_block_candidate(child)]
            if len(cands) >= 2:
                containers.append(cands)
            if m is model:  # an nn.Sequential model: its own children, nothing else
                break
    if not containers:
        raise ValueError(
            "blocks=None but no block structure was found in the model (no nn.Sequential/nn.ModuleList "
            "with two or more parametrised children, and no autoinit_blocks() method); pass "
            "blocks=[names of the submodules whose outputs are h^l, in execution order]")
    return max(containers, key=len)


def _validate_blocks(model, blocks):
    if blocks is None:
        blocks = find_blocks(model)
    if isinstance(blocks, str) or not isinstance(blocks, Iterable):
        raise ValueError(f"blocks must be a list of submodule names, got {blocks!r}")
    blocks = list(blocks)
    if len(blocks) < 2:
        raise ValueError(f"blocks must name at least two submodules (J^{{l,l+1}} needs pairs), got {blocks!r}")
    modules = dict(model.named_modules())
    for b in blocks:
        if not isinstance(b, str):
            raise ValueError(f"blocks must be submodule names (str), got {b!r}")
        if b not in modules or b == "":
            near = [n for n in modules if n][:12]
            raise ValueError(f"blocks: the model has no submodule named {b!r}; names look like {near}")
    if len(set(blocks)) != len(blocks):
        raise ValueError(f"blocks: each name may appear once, got {blocks!r}")
    for b in blocks:
        for c in blocks:
            if b != c and c.startswith(b + "."):
                raise ValueError(f"blocks: {c!r} lies inside {b!r}; blocks must not be nested")
    return blocks


# --------------------------------------------------------------------------- running the twin


@contextmanager
def _measuring(model: nn.Module):
    """Dropout off, BatchNorm on batch statistics without touching running stats; modes restored."""
    saved = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with batch_statistics(model):
            yield model
    finally:
        for m, t in saved:
            m.training = t


def _batch_coupled(model):
    return any(isinstance(m, _BatchNorm) for m in model.modules())


class _Twin:
    """The model evaluated at parameters a * theta, with hooks on the block outputs."""

    def __init__(self, model, blocks):
        self.model, self.blocks = model, blocks
        self.modules = [model.get_submodule(b) for b in blocks]
        self.base = {n: p.detach() for n, p in model.named_parameters()}
        self.coupled = _batch_coupled(model)
        self.norms = [m for m in model.modules() if isinstance(m, (_BatchNorm, nn.LayerNorm))]
        self._shapes: dict = {}

    def params(self, scales):
        out = dict(self.base)
        if scales is not None:
            for n, a in scales.items():
                out[n] = self.base[n] * a
        return out

    def call(self, x, scales):
        return functional_call(self.model, self.params(scales), (x,))

    def execution_order(self, x):
        seen = []
        hooks = [m.register_forward_hook(lambda mod, i, o, b=b: seen.append(b))
                 for b, m in zip(self.blocks, self.modules)]
        try:
            with torch.no_grad():
                self.call(x, None)
        finally:
            for h in hooks:
                h.remove()
        return seen

    def output_shapes(self, x):
        """Shapes of the block outputs h^0..h^n for this input shape (one no-grad pass, cached)."""
        key = tuple(x.shape)
        if key not in self._shapes:
            shapes = {}

            def keep(b):
                def f(mod, inp, out):
                    if not isinstance(out, torch.Tensor):
                        raise ValueError(f"block {b!r} returns {type(out).__name__}; a block output must be a tensor")
                    shapes[b] = tuple(out.shape)
                return f

            hooks = [m.register_forward_hook(keep(b)) for b, m in zip(self.blocks, self.modules)]
            try:
                with torch.no_grad():
                    self.call(x, None)
            finally:
                for h in hooks:
                    h.remove()
            self._shapes[key] = [shapes[b] for b in self.blocks]
        return self._shapes[key]

    def probes(self, x, n_probes, generator):
        """Gaussian probes u_l, l = 0..n-2, each of shape (n_probes, *h^l.shape).

        Drawn in the order of the earlier one-pass-per-probe estimator (probe
        by probe, block by block, for models with BatchNorm; block by block,
        all probes at once, for the others), so the numbers are the same.
        """
        shapes = self.output_shapes(x)[:-1]
        kw = dict(generator=generator, device=x.device, dtype=x.dtype)
        if self.coupled:
            per = [[torch.randn(s, **kw) for s in shapes] for _ in range(n_probes)]
            return [torch.stack([p[i] for p in per]) for i in range(len(shapes))]
        return [torch.randn((n_probes * s[0],) + s[1:], **kw).view((n_probes,) + s) for s in shapes]

    def jvp_pass(self, x, scales, n_probes, generator):
        """J^{l,l+1} samples (differentiable w.r.t. the scales) and K^l, the primal computed once.

        The probes are a batch of tangents: ``torch.func.vmap`` over the
        probe index of ``torch.func.jvp`` of the model, where the hook on
        block l replaces the tangent of h^l by the probe u_l (:class:`_Reprobe`)
        and the hook on block l+1 reads J u_l. Unbatched primal operations
        run once whatever the number of probes; only the tangents are
        batched. Returns per-sample values (n_probes * batch,) for models
        without BatchNorm and per-probe batch means (n_probes,) with it.
        """
        n = len(self.blocks)
        us = self.probes(x, n_probes, generator)
        params = self.params(scales)

        # the jvp's input is a dummy scalar that only the probes depend on: no tangent flows from the data,
        # so the layers before h^0 (the input layer) run on the primal alone
        seed_t = torch.zeros((), device=x.device, dtype=x.dtype)

        def one(u):
            def run(x0):
                outs = [None] * n

                def keep(i):
                    def f(mod, inp, out):
                        if not isinstance(out, torch.Tensor):
                            raise ValueError(f"block {self.blocks[i]!r} returns {type(out).__name__}; "
                                             "a block output must be a tensor")
                        outs[i] = out
                    return f

                def reprobe(i):
                    def f(mod, inp, out):  # primal unchanged, tangent replaced by the probe u_i
                        return _Reprobe.apply(out, _Tangent.apply(x0, u[i], tuple(out.shape)))
                    return f

                # first: norms recomputed from differentiable operations (their tangents' reverse mode)
                hooks = [m.register_forward_hook(_norm_by_formula) for m in self.norms]
                hooks += [m.register_forward_hook(keep(i)) for i, m in enumerate(self.modules)]
                hooks += [m.register_forward_hook(reprobe(i)) for i, m in enumerate(self.modules[:-1])]
                try:
                    with _tangent_rules(self.model):
                        functional_call(self.model, params, (x,))
                finally:
                    for h in hooks:
                        h.remove()
                return tuple(outs)

            with composite_attention():   # fused attention kernels have no forward-mode derivative
                prim, tang = torch.func.jvp(run, (seed_t,), (torch.ones_like(seed_t),))
            J = tuple(t.reshape(t.shape[0], -1).pow(2).mean(1) for t in tang[1:])  # ||J u||^2 / N per sample
            K = tuple(p.reshape(p.shape[0], -1).pow(2).mean() for p in prim)
            return J, K

        J, K = torch.func.vmap(one, in_dims=(0,), out_dims=(0, None))(us)
        J = [j.mean(1) if self.coupled else j.reshape(-1) for j in J]  # (probes, batch) -> samples
        return J, list(K)


class _Reprobe(torch.autograd.Function):
    """h unchanged (value and reverse mode); its forward-mode tangent replaced by the tangent of ``t``.

    ``t`` is :class:`_Tangent`'s carrier of the probe. The output is a view of
    ``h``: no copy and no zero tangent materialised and added (the earlier
    pair of functions cloned h, filled two zero tensors per block and step
    and added them).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(h, t):
        return h.view_as(h)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def jvp(ctx, dh, dt):
        return dt

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Tangent(torch.autograd.Function):
    """Zeros of ``shape`` whose forward-mode tangent is the probe ``u``.

    ``src`` (the jvp's dummy input) only carries the transform's level, so the
    rule runs even where the block output has no tangent (the input layer's).
    (An expanded zero, one stored number, is refused: torch writes into it.)
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(src, u, shape):
        return src.new_zeros(shape)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(inputs[1])

    @staticmethod
    def jvp(ctx, dsrc, du, dshape):
        (u,) = ctx.saved_tensors
        return u

    @staticmethod
    def backward(ctx, g):
        return None, None, None


class _Linear(torch.autograd.Function):
    """``F.linear(x, w, b)`` whose forward-mode tangent is ``F.linear(dx, w)``: the parameters' tangents are ignored.

    In :meth:`_Twin.jvp_pass` the parameters are closed over, never inputs of
    the jvp, so their tangents are zero. torch's own rule for the matrix
    product, ``mm(dx, w) + mm(x, dw)``, gets ``dw`` materialised as zeros under
    ``torch.func.jvp`` + ``vmap`` and multiplies by them (one product per layer
    and probe batch), reverse mode multiplies by them again, and that second
    term ties the tangents' reverse pass to the whole primal reverse pass.
    Here the tangent depends on ``dx`` and ``w`` only (both modes exact: the
    derivative of ``dx w^T`` in ``w`` is the weight-gradient term of the
    scales). Only for use where parameters carry no tangent.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b):
        return nn.functional.linear(x, w, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b = inputs
        # the same tensors for both modes: torch's generated vmap rule keeps one record of the saved
        # tensors' batch dimensions, which the second call overwrites (different lists fail in backward
        # with "flat_bdims must not be None")
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        ctx.has_bias = b is not None

    @staticmethod
    def jvp(ctx, dx, dw, db):
        _, w = ctx.saved_tensors
        return nn.functional.linear(dx, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g @ w if ctx.needs_input_grad[0] else None
        g2 = g.reshape(-1, g.shape[-1])
        gw = g2.T @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


class _Conv(torch.autograd.Function):
    """``torch.convolution`` (not transposed) whose tangent is the convolution of ``dx`` with ``w``.

    As :class:`_Linear`. ``conf`` = (stride, padding, dilation, groups), numeric padding only.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b, conf):
        stride, padding, dilation, groups = conf
        return torch.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, conf = inputs
        ctx.save_for_backward(x, w)  # the same tensors for both modes (see _Linear)
        ctx.save_for_forward(x, w)
        ctx.bias_sizes = None if b is None else list(b.shape)
        ctx.conf = conf

    @staticmethod
    def jvp(ctx, dx, dw, db, dconf):
        _, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        return torch.convolution(dx, w, None, stride, padding, dilation, False, [0] * len(stride), groups)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        need = [ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                ctx.bias_sizes is not None and ctx.needs_input_grad[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(g, x, w, ctx.bias_sizes, stride, padding, dilation, False,
                                                         [0] * len(stride), groups, need)
        return (gx if need[0] else None), (gw if need[1] else None), (gb if need[2] else None), None


class _ReLU(torch.autograd.Function):
    """``relu(x)`` whose tangent is ``dx`` masked by ``relu(x) > 0``, with the mask outside the reverse graph.

    torch's rule, ``threshold_backward(dx, out, 0)``, has a derivative in
    ``out`` that is identically zero, but reverse mode still sends a (probe-
    batched) zero gradient through it into the primal pass and the whole
    primal reverse pass runs on zeros. The mask is piecewise constant, so the
    gradient through it is zero almost everywhere (as in torch: relu'(0) = 0).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.relu(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def jvp(ctx, dx):
        (out,) = ctx.saved_tensors
        return torch.where(out > 0, dx, 0.0)

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return torch.where(out > 0, g, 0.0)


@contextmanager
def _tangent_rules(model):
    """Within the twin's jvp pass: ``nn.Linear``, ``nn.Conv{1,2,3}d`` and ``nn.ReLU`` run the functions above.

    :class:`_Linear`, :class:`_Conv` (zero padding given as numbers) and
    :class:`_ReLU`; only modules of exactly these types (a subclass may override ``forward``)
    and without a ``forward`` of their own already set on the instance; the
    instance attribute is removed on exit. Every other layer keeps torch's
    rules.
    """
    patched = []
    try:
        for m in model.modules():
            if "forward" in vars(m):
                continue
            if type(m) is nn.Linear:
                m.forward = lambda inp, m=m: _Linear.apply(inp, m.weight, m.bias)
            elif type(m) in (nn.Conv1d, nn.Conv2d, nn.Conv3d) and m.padding_mode == "zeros" \
                    and not isinstance(m.padding, str):
                conf = (list(m.stride), list(m.padding), list(m.dilation), m.groups)
                m.forward = lambda inp, m=m, conf=conf: _Conv.apply(inp, m.weight, m.bias, conf)
            elif type(m) is nn.ReLU:
                m.forward = _ReLU.apply
            else:
                continue
            patched.append(m)
        yield
    finally:
        for m in patched:
            del m.forward


def _norm_by_formula(mod, inp, out):
    """Forward hook: a BatchNorm (batch statistics) or LayerNorm output recomputed from plain operations.

    torch's forward-mode rules for ``native_batch_norm`` and
    ``native_layer_norm`` use the saved mean and inverse standard deviation,
    which are non-differentiable outputs, so reverse mode through a tangent
    (AutoInit differentiates J, a function of tangents, with respect to the
    scales) misses every path through the statistics: the scale gradients of
    layers before a norm came out wrong (tests/test_autoinit_twin.py checks
    them against finite differences). Written with mean and var, both modes
    of both derivatives follow from the chain rule:
    y = (h - mean) / sqrt(var + eps) * weight + bias, with the biased variance
    over the batch and spatial axes (BatchNorm) or the normalised trailing
    axes (LayerNorm).
    """
    h = inp[0]
    if isinstance(mod, _BatchNorm):
        if not (mod.training or mod.running_mean is None):
            return None  # running statistics: an affine map, torch's rules are exact
        dims = (0,) + tuple(range(2, h.dim()))
        view = (1, -1) + (1,) * (h.dim() - 2)
    else:
        dims = tuple(range(h.dim() - len(mod.normalized_shape), h.dim()))
        view = tuple(mod.normalized_shape)
    mean = h.mean(dims, keepdim=True)
    c = h - mean
    y = c / torch.sqrt(c.pow(2).mean(dims, keepdim=True) + mod.eps)
    if getattr(mod, "weight", None) is not None:
        y = y * mod.weight.view(view)
    if getattr(mod, "bias", None) is not None:
        y = y + mod.bias.view(view)
    return y


def _reduce(J_samples):
    """mean and standard error of each block's samples."""
    mean = torch.stack([s.mean() for s in J_samples])
    se = torch.stack([s.detach().std() / math.sqrt(s.numel()) if s.numel() > 1
                      else torch.tensor(float("nan")) for s in J_samples])
    return mean, se


# --------------------------------------------------------------------------- checks


def _generator(seed, stream, device="cpu"):
    """A torch.Generator for (seed, stream), decorrelated from ``torch.manual_seed(seed)``.

    Probes drawn from the global stream of the same small seed the user built
    the model with would reproduce the weights themselves (a biased estimate),
    so the seed is hashed first.
    """
    state = np.random.SeedSequence([int(seed), int(stream), 0xA17015]).generate_state(1, np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)


def _check_model(model):
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not any(True for _ in model.parameters()):
        raise ValueError("model has no parameters: AutoInit tunes one scale factor per parameter tensor, "
                         "so there is nothing to tune")


def _check_inputs(model, inputs):
    if not isinstance(inputs, torch.Tensor):
        raise ValueError(f"inputs must be a torch.Tensor with the batch as first axis, got {type(inputs).__name__}")
    if not inputs.is_floating_point():
        raise ValueError(f"inputs must be a floating-point tensor, got dtype {inputs.dtype}")
    if inputs.dim() < 2:
        raise ValueError(f"inputs must have a leading batch axis (shape (batch, ...)), got shape {tuple(inputs.shape)}")
    if inputs.shape[0] < 1:
        raise ValueError("inputs is empty")
    if not torch.isfinite(inputs).all():
        raise ValueError("inputs contain NaN or inf")
    p = next(model.parameters())
    return inputs.to(device=p.device, dtype=p.dtype)


def _check_int(name, v, minimum):
    from .._validate import check_int

    return check_int(name, v, minimum)


def _check_number(name, v, minimum=0.0, strict=False):
    try:
        if isinstance(v, (bool, np.bool_, str)):
            raise TypeError
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {v!r}") from None
    if not math.isfinite(f) or f < minimum or (strict and f == minimum):
        rel = ">" if strict else ">="
        raise ValueError(f"{name} must be finite and {rel} {minimum}, got {v!r}")
    return f


def _select_params(model, params):
    names = [n for n, _ in model.named_parameters()]
    if params is None:
        return names
    if callable(params):
        chosen = [n for n, p in model.named_parameters() if params(n, p)]
    else:
        chosen = list(params)
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise ValueError(f"params: the model has no parameters named {unknown}; names look like {names[:8]}")
    if not chosen:
        raise ValueError("params selects no parameter tensor: nothing to tune")
    return chosen


def _first_bad(J, K, blocks, kernel_in_loss=False):
    """Describe the first non-finite (or zero) quantity in forward order, or None."""
    for i, b in enumerate(blocks):
        k = float(K[i])
        if not math.isfinite(k):
            return b, f"the kernel K at block {b!r} is {k} (the forward pass overflowed)"
        if kernel_in_loss and k <= 0:
            return b, f"the kernel K at block {b!r} is {k}, and JKL takes log(K^(l+1)/K^l)"
        if i > 0:
            j = float(J[i - 1])
            if not math.isfinite(j) or j <= 0:
                return b, (f"J^{{l,l+1}} between blocks {blocks[i - 1]!r} and {b!r} is {j}"
                           + (" (the block output does not depend on the previous one)" if j == 0 else ""))
    return None


# --------------------------------------------------------------------------- losses


def _loss(J, K, loss, lam):
    if loss == "jsl":
        return 0.5 * ((J - 1.0) ** 2).sum()
    out = 0.5 * (torch.log(J) ** 2).sum()
    if loss == "jkl" and lam:
        out = out + 0.5 * lam * (torch.log(K[1:] / K[:-1]) ** 2).sum()
    return out


def _relu_mlp_weights(model, blocks):
    """For a plain ReLU MLP: {block index: weight name}; else None."""
    allowed = (nn.Linear, nn.ReLU, nn.Identity, nn.Flatten, nn.Dropout, nn.Sequential, nn.ModuleList)
    mods = list(model.modules())
    if any(not isinstance(m, allowed) for m in mods[1:]) or not any(isinstance(m, nn.ReLU) for m in mods):
        return None
    if type(model) not in allowed:
        return None
    if not all(isinstance(model.get_submodule(b), nn.Linear) for b in blocks):
        return None
    return {i: f"{b}.weight" for i, b in enumerate(blocks)}


# --------------------------------------------------------------------------- report


@dataclass(repr=False)
class Measurement(ShortRepr):  # short repr: shapes and headline numbers
    """APJN and kernel of one model: ``J[l]`` = J^{l,l+1} between ``blocks[l]`` and ``blocks[l+1]``."""

    blocks: list
    J: np.ndarray
    J_se: np.ndarray
    K: np.ndarray
    method: str
    n_probes: int
    batch: int

    def as_dict(self):
        return {"blocks": list(self.blocks), "J": self.J.tolist(), "J_se": self.J_se.tolist(),
                "K": self.K.tolist(), "method": self.method, "n_probes": self.n_probes, "batch": self.batch}


@dataclass(repr=False)
class AutoInitReport(ShortRepr):  # short repr: shapes and headline numbers
    """What :func:`autoinit` did. ``J_*[l]`` is J^{l,l+1} between ``blocks[l]`` and ``blocks[l+1]``."""

    blocks: list
    loss: str
    lam: float
    mode: str
    lr: object
    steps: int
    converged: bool
    tol: float
    batch_size: int
    n_probes: int
    before: Measurement
    after: Measurement
    loss_history: np.ndarray
    J_history: np.ndarray
    scales: dict
    shapes: dict
    model_class: str
    wall_time: float
    steps_per_second: float
    average: int = 0
    notes: list = field(default_factory=list)

    @property
    def J_before(self):
        return self.before.J

    @property
    def J_after(self):
        return self.after.J

    @property
    def K_before(self):
        return self.before.K

    @property
    def K_after(self):
        return self.after.K

    def summary(self) -> str:
        jb, ja = self.J_before, self.J_after
        lines = [
            f"AutoInit ({self.loss}{', lam=%g' % self.lam if self.loss == 'jkl' else ''}, mode={self.mode}, "
            f"lr={self.lr}) on {self.model_class}: {self.steps} steps, "
            f"{'converged' if self.converged else 'not converged'} (loss {self.loss_history[-1]:.3g}, tol {self.tol:g}), "
            f"{self.steps_per_second:.3g} steps/s",
            f"  J^{{l,l+1}} before: min {jb.min():.4g}  max {jb.max():.4g}",
            f"  J^{{l,l+1}} after:  min {ja.min():.4g}  max {ja.max():.4g}  "
            f"({self.after.n_probes} probes x batch {self.after.batch})",
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    __str__ = summary

    def as_dict(self) -> dict:
        return {
            "blocks": list(self.blocks), "loss": self.loss, "lam": self.lam, "mode": self.mode, "lr": str(self.lr),
            "steps": self.steps, "converged": self.converged, "tol": self.tol, "batch_size": self.batch_size,
            "n_probes": self.n_probes, "before": self.before.as_dict(), "after": self.after.as_dict(),
            "loss_history": self.loss_history.tolist(), "scales": dict(self.scales),
            "model_class": self.model_class, "wall_time": self.wall_time,
            "steps_per_second": self.steps_per_second, "notes": list(self.notes),
        }

    def save(self, path) -> None:
        """Write the tuned initialisation (scale factors) as JSON; see :func:`save_scales`."""
        save_scales(self, path)

    def plot(self, axes=None, label_after="AutoInit"):
        """J^{l,l+1} and K^l before/after, the loss curve and the scale factors (matplotlib)."""
        import matplotlib.pyplot as plt

        if axes is None:
            fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
        else:
            fig = np.ravel(axes)[0].figure
        ax = np.ravel(axes)
        l = np.arange(len(self.J_before))
        ax[0].errorbar(l, self.J_before, self.before.J_se, fmt="o-", ms=3, label="before")
        ax[0].errorbar(l, self.J_after, self.after.J_se, fmt="s-", ms=3, label=label_after)
        ax[0].axhline(1.0, color="k", lw=0.8, ls=":")
        ax[0].set(yscale="log", xlabel="l", ylabel=r"$\mathcal{J}^{l,l+1}$", title="APJN")
        ax[0].legend()
        k = np.arange(len(self.K_before))
        ax[1].plot(k, self.K_before, "o-", ms=3, label="before")
        ax[1].plot(k, self.K_after, "s-", ms=3, label=label_after)
        ax[1].set(yscale="log", xlabel="l", ylabel=r"$\mathcal{K}^l$", title="kernel")
        ax[1].legend()
        ax[2].plot(np.arange(len(self.loss_history)), self.loss_history)
        ax[2].set(yscale="log", xlabel="step", ylabel="loss", title=f"{self.loss.upper()} loss")
        vals = np.array(list(self.scales.values()))
        ax[3].plot(np.arange(len(vals)), np.abs(vals), ".")
        ax[3].axhline(1.0, color="k", lw=0.8, ls=":")
        ax[3].set(yscale="log", xlabel="parameter tensor", ylabel=r"$|a_\theta|$", title="scale factors")
        fig.tight_layout()
        return fig


# --------------------------------------------------------------------------- measurement


def _estimate(twin, x, scales, n_probes, generator):
    with torch.no_grad():
        Js, Ks = twin.jvp_pass(x, scales, n_probes, generator)
    J, se = _reduce(Js)
    K = torch.stack(Ks)
    return J.cpu().numpy().astype(float), se.cpu().numpy().astype(float), K.cpu().numpy().astype(float)


def _segment_fn(model, blocks, i, x):
    """h^i -> h^{i+1} as a function (the model is run on x with block i's output replaced)."""

    class _Stop(Exception):
        pass

    mods = [model.get_submodule(b) for b in blocks]

    def fn(h):
        box = {}

        def put(mod, inp, out):
            return h

        def take(mod, inp, out):
            box["out"] = out
            raise _Stop

        hs = [mods[i].register_forward_hook(put), mods[i + 1].register_forward_hook(take)]
        try:
            model(x)
        except _Stop:
            pass
        finally:
            for hk in hs:
                hk.remove()
        return box["out"]

    return fn


def measure(model: nn.Module, inputs: torch.Tensor, blocks=None, n_probes: int = 16, method: str = "hutchinson",
            seed: int = 0) -> Measurement:
    """J^{l,l+1} (with standard errors) and K^l of ``model`` on the batch ``inputs``.

    Batch-aware (the whole ``inputs`` is one batch; BatchNorm uses its
    statistics); the model and its buffers are left as they were.

    method:
      * ``"hutchinson"``: ``meanfield.torch.estimators.hutchinson_apjn``
        on each block-to-block map separately (``n_probes`` probes each);
        independent of the fused estimator AutoInit uses in its loop;
      * ``"exact"``: the full Jacobian of each block-to-block map
        (``estimators.exact_apjn``; small widths and batches only);
      * ``"fused"``: AutoInit's own one-pass estimator (fast).
    """
    _check_model(model)
    x = _check_inputs(model, inputs)
    blocks = _validate_blocks(model, blocks)
    _check_choice("method", method, ("hutchinson", "exact", "fused"))
    n_probes = _check_int("n_probes", n_probes, 1)
    gen = _generator(seed, 10, x.device)
    with _measuring(model):
        twin = _Twin(model, blocks)
        _check_order(twin, x)
        if method == "fused":
            J, se, K = _estimate(twin, x, None, n_probes, gen)
            return Measurement(blocks, J, se, K, method, n_probes, x.shape[0])
        outs = {}
        hooks = [m.register_forward_hook(lambda mod, i, o, b=b: outs.__setitem__(b, o.detach()))
                 for b, m in zip(blocks, twin.modules)]
        try:
            with torch.no_grad():
                model(x)
        finally:
            for h in hooks:
                h.remove()
        K = np.array([float(outs[b].reshape(x.shape[0], -1).pow(2).mean()) for b in blocks])
        J, se = [], []
        for i in range(len(blocks) - 1):
            fn = _segment_fn(model, blocks, i, x)
            with torch.no_grad():
                if method == "exact":
                    n_in, n_out = outs[blocks[i]].numel(), outs[blocks[i + 1]].numel()
                    if n_in * n_out > 5e7:
                        raise ValueError(f"method='exact' would build a {n_out} x {n_in} Jacobian between "
                                         f"{blocks[i]!r} and {blocks[i + 1]!r}; use method='hutchinson'")
                    est = exact_apjn(fn, outs[blocks[i]])
                else:
                    est = hutchinson_apjn(fn, outs[blocks[i]], n_probes=n_probes, generator=gen)
            J.append(float(est.mean))
            se.append(float(est.se))
    return Measurement(blocks, np.array(J), np.array(se), K, method, n_probes if method != "exact" else 0,
                       x.shape[0])


def _check_order(twin, x):
    try:
        seen = twin.execution_order(x)
    except ValueError:
        raise
    except Exception as err:  # shape errors and the like from the user's forward
        raise ValueError(f"inputs of shape {tuple(x.shape)} do not fit the model: "
                         f"{type(err).__name__}: {err}") from None
    if seen != twin.blocks:
        counts = {b: seen.count(b) for b in twin.blocks}
        never = [b for b, c in counts.items() if c == 0]
        many = [b for b, c in counts.items() if c > 1]
        if never:
            raise ValueError(f"blocks {never} are never executed by the model's forward pass")
        if many:
            raise ValueError(f"blocks {many} are executed more than once per forward pass "
                             "(shared modules cannot be blocks)")
        raise ValueError(f"blocks are not in execution order: given {twin.blocks}, executed {seen}")


@dataclass(repr=False)
class BatchSizeScan(ShortRepr):  # short repr: shapes and headline numbers
    """J^{l,l+1} against batch size (paper section 3): ``J[i, l]`` at ``batch_sizes[i]``."""

    blocks: list
    batch_sizes: np.ndarray
    J: np.ndarray
    J_se: np.ndarray

    def plot(self, ax=None):
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.6))
        for l in range(self.J.shape[1]):
            ax.errorbar(self.batch_sizes, self.J[:, l], self.J_se[:, l], fmt="o-", ms=3,
                        label=f"l={l}" if self.J.shape[1] <= 10 else None)
        ax.set(xscale="log", xlabel="|B|", ylabel=r"$\mathcal{J}^{l,l+1}$", title="APJN vs batch size")
        if self.J.shape[1] <= 10:
            ax.legend(fontsize=7)
        return ax


def apjn_vs_batch_size(model, inputs, batch_sizes, blocks=None, n_probes=4, n_batches=4, seed=0) -> BatchSizeScan:
    """Measure J^{l,l+1} at several batch sizes, to choose the AutoInit batch for a BatchNorm model.

    For each size, ``n_batches`` random batches are drawn from ``inputs``
    (without replacement within a batch), J is estimated on each with the fused
    estimator (``n_probes`` probes), and the mean over batches and its standard
    error are returned. With BatchNorm J depends on |B|; without it, it does not
    (paper Remark 1.1).
    """
    _check_model(model)
    x = _check_inputs(model, inputs)
    blocks = _validate_blocks(model, blocks)
    sizes = [_check_int("batch_sizes entry", b, 1) for b in np.atleast_1d(batch_sizes).tolist()]
    if max(sizes) > x.shape[0]:
        raise ValueError(f"batch size {max(sizes)} exceeds the {x.shape[0]} inputs given")
    n_batches = _check_int("n_batches", n_batches, 1)
    gen = _generator(seed, 20)
    pgen = _generator(seed, 21, x.device)
    Js, ses = [], []
    with _measuring(model):
        twin = _Twin(model, blocks)
        _check_order(twin, x[: max(sizes)])
        for b in sizes:
            vals = []
            for _ in range(n_batches):
                idx = torch.randperm(x.shape[0], generator=gen)[:b].to(x.device)
                vals.append(_estimate(twin, x[idx], None, n_probes, pgen)[0])
            vals = np.array(vals)
            Js.append(vals.mean(0))
            ses.append(vals.std(0, ddof=1) / np.sqrt(n_batches) if n_batches > 1 else np.full(vals.shape[1], np.nan))
    return BatchSizeScan(blocks, np.array(sizes), np.array(Js), np.array(ses))


# --------------------------------------------------------------------------- save / apply


class _Scale(nn.Module):
    """Parametrization ``theta -> a * theta`` with a fixed (buffer) ``a``."""

    def __init__(self, a):
        super().__init__()
        self.register_buffer("a", torch.tensor(float(a)))

    def forward(self, x):
        return self.a.to(x.dtype) * x


def apply_scales(model: nn.Module, scales, mode: str | None = None) -> nn.Module:
    """Apply tuned scale factors to ``model`` in place and return it.

    ``scales``: a dict ``{parameter name: a}``, an :class:`AutoInitReport`, a
    dict loaded by :func:`load_scales`, or a path to a JSON file written by
    :func:`save_scales`. ``mode`` ("rescale" or "freeze") defaults to the one
    stored with the scales. Every name must be a parameter of ``model`` with
    the recorded shape (ValueError otherwise), so the factors of one instance
    can be applied to a fresh instance of the same architecture.
    """
    shapes = None
    if isinstance(scales, (str, os.PathLike)):
        scales = load_scales(scales)
    if isinstance(scales, AutoInitReport):
        mode = mode or scales.mode
        shapes = scales.shapes
        scales = scales.scales
    elif isinstance(scales, Mapping) and scales.get("format") == SCALES_FORMAT:
        mode = mode or scales.get("mode")
        shapes = scales.get("shapes")
        scales = scales["scales"]
    if not isinstance(scales, Mapping):
        raise ValueError(f"scales must be a dict of parameter name -> factor, a report or a path, got {scales!r}")
    mode = _check_choice("mode", mode or "rescale", MODES)
    params = dict(model.named_parameters())
    unknown = [n for n in scales if n not in params]
    if unknown:
        raise ValueError(f"scales name parameters that {type(model).__name__} does not have: {unknown[:6]}")
    if shapes:
        wrong = [n for n in scales if n in shapes and list(params[n].shape) != list(shapes[n])]
        if wrong:
            n = wrong[0]
            raise ValueError(f"parameter {n!r} has shape {list(params[n].shape)} but the scales were tuned "
                             f"for shape {list(shapes[n])}: not the same architecture")
    for n, a in scales.items():
        a = float(a)
        if not math.isfinite(a):
            raise ValueError(f"scale factor for {n!r} is {a}")
        if mode == "rescale":
            with torch.no_grad():
                params[n].mul_(a)
        else:
            owner, _, pname = n.rpartition(".")
            torch.nn.utils.parametrize.register_parametrization(model.get_submodule(owner), pname, _Scale(a))
    return model


def save_scales(scales, path, mode: str | None = None, **metadata) -> None:
    """Write scale factors (from a report or a dict) to ``path`` as JSON."""
    if isinstance(scales, AutoInitReport):
        rep = scales
        doc = {"mode": rep.mode, "model_class": rep.model_class, "scales": dict(rep.scales),
               "shapes": dict(rep.shapes), "blocks": list(rep.blocks), "loss": rep.loss, "lam": rep.lam,
               "J_before": rep.J_before.tolist(), "J_after": rep.J_after.tolist(), "steps": rep.steps}
    else:
        doc = {"mode": mode or "rescale", "scales": {k: float(v) for k, v in dict(scales).items()}}
    if mode is not None:
        doc["mode"] = _check_choice("mode", mode, MODES)
    doc.update(metadata)
    doc = {"format": SCALES_FORMAT, "version": 1, **doc}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)


def load_scales(path) -> dict:
    """Read a file written by :func:`save_scales` (a dict with "scales", "mode", "shapes", ...)."""
    with open(path) as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or doc.get("format") != SCALES_FORMAT or "scales" not in doc:
        raise ValueError(f"{path} is not an AutoInit scales file (format {SCALES_FORMAT!r})")
    return doc


# --------------------------------------------------------------------------- the algorithm


def _progress(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is in the verify extra; run without a bar if it is missing
        return None
    return tqdm(total=total, desc="AutoInit", leave=False)


def autoinit(model: nn.Module, inputs: torch.Tensor, blocks=None, loss: str = "jll", lam: float = 0.0,
             lr=None, steps: int = 500, tol: float = 1e-3, n_probes: int = 2, batch_size: int | None = None,
             mode: str = "rescale", *, params=None, seed: int = 0, progress: bool = True,
             inplace: bool = False, report_probes: int = 8, average: int = 0):
    """Tune the scale of every parameter tensor so that every J^{l,l+1} = 1; return ``(model, report)``.

    Parameters
    ----------
    model : nn.Module
        Any feed-forward torch model. Not modified (unless ``inplace=True``).
    inputs : Tensor
        Data, batch first (normalised inputs, as in the paper). Each step uses
        ``batch_size`` of them drawn at random (all when ``batch_size=None``).
    blocks : list of str, optional
        Submodules whose outputs are h^0..h^n; J^{l,l+1} is measured between
        consecutive ones and the losses sum over all those pairs (module
        docstring). Found automatically when omitted.
    loss : "jll" | "jsl" | "jkl"
        JLL (eq. 12), JSL, or JKL (eq. 24/45) with kernel weight ``lam``.
    lam : float
        Weight of the kernel term; only with ``loss="jkl"``.
    lr : float, dict or None
        SGD learning rate; a dict gives one per parameter name (names left out
        are not tuned); None: the ReLU one-step rate for a ReLU MLP, else
        ``DEFAULT_LR``.
    steps : int
        At most this many updates (Algorithm 1's T).
    tol : float
        Stop as soon as the loss is <= tol (Algorithm 1's epsilon).
    n_probes : int
        Gaussian probes per step of the Hutchinson estimator (eq. 7's N_v).
    batch_size : int, optional
        |B|. Matters with BatchNorm (see :func:`apjn_vs_batch_size`).
    mode : "rescale" | "freeze"
        See the module docstring.
    params : list of names or callable(name, param) -> bool, optional
        Which parameter tensors get a scale factor (default: all), e.g. only
        the BatchNorm ones for the paper's VGG variant.
    seed : int
        Seeds the batches and the probes.
    progress : bool
        Show a tqdm progress bar.
    inplace : bool
        Apply the tuned scales to ``model`` itself at the end instead of a copy.
    report_probes : int
        Probes for the before/after measurement in the report.
    average : int
        0 (default, Algorithm 2): keep the last iterate of the ``a``. k > 0:
        return the mean of the last k iterates (Polyak averaging), which
        suppresses the step-to-step Hutchinson/batch noise where it is large
        (BatchNorm at small spatial size, few probes).

    Returns
    -------
    (nn.Module, AutoInitReport)

    Raises
    ------
    ValueError
        Bad arguments (no parameters, unknown or misordered blocks, inputs that
        do not fit the model, steps < 1, ...).
    AutoInitError
        A NaN/inf/zero APJN, kernel or loss; the message names the step and the block.
    """
    plan = _plan(model, inputs, blocks, params, loss, lam, lr, mode, steps, tol, n_probes, batch_size, seed,
                 report_probes, average)
    t0 = time.perf_counter()
    first, before, run, after = _measure_and_tune(model, plan, progress)
    scales = {n: float(a) for n, a in run.final.items()}
    shapes = {n: list(p.shape) for n, p in model.named_parameters() if n in scales}  # before a freeze renames
    target = model if inplace else copy.deepcopy(model)
    apply_scales(target, scales, mode=plan.mode)
    wall = time.perf_counter() - t0
    return target, _report(model, plan, first, before, run, after, scales, shapes, wall)


class _Plan(NamedTuple):
    """The checked arguments of :func:`autoinit` and what follows from them."""

    x_all: torch.Tensor
    blocks: list
    tuned: list
    loss: str
    lam: float
    mode: str
    steps: int
    tol: float
    n_probes: int
    report_probes: int
    average: int
    batch_size: int
    relu: object   # the ReLU MLP's weights (one-step rates) or None
    lr_map: object  # {name: rate}, or None with relu
    lr_desc: object
    seed: int


def _plan(model, inputs, blocks, params, loss, lam, lr, mode, steps, tol, n_probes, batch_size, seed,
          report_probes, average) -> _Plan:
    """Check every argument of :func:`autoinit` (ValueError naming it) and settle the learning rates."""
    _check_model(model)
    x_all = _check_inputs(model, inputs)
    loss, lam, mode, steps, tol, n_probes, report_probes, average, batch_size = _check_autoinit_args(
        x_all, loss, lam, mode, steps, tol, n_probes, report_probes, average, batch_size)
    blocks = _validate_blocks(model, blocks)
    tuned = _select_params(model, params)
    if _batch_coupled(model) and batch_size < 2:
        raise ValueError("the model has BatchNorm, which needs batch_size >= 2 (batch statistics)")
    relu, lr_map, lr_desc = _learning_rates(model, blocks, tuned, lr)
    return _Plan(x_all, blocks, tuned, loss, lam, mode, steps, tol, n_probes, report_probes, average, batch_size,
                 relu, lr_map, lr_desc, seed)


def _measure_and_tune(model, plan: _Plan, progress):
    """(first batch, J/K before, the tuning run, J/K after): the measurements on the first ``batch_size`` inputs
    with ``report_probes`` probes, around :func:`_tune` (Algorithm 1/2)."""
    x_all, seed = plan.x_all, plan.seed
    device, dtype = x_all.device, x_all.dtype
    batch = _batches(x_all, plan.batch_size, _generator(seed, 0))
    scales = {n: torch.ones((), device=device, dtype=dtype, requires_grad=True) for n in plan.tuned}
    first = x_all[:plan.batch_size]
    with _measuring(model):
        twin = _Twin(model, plan.blocks)
        _check_order(twin, first)
        before = _estimate(twin, first, None, plan.report_probes, _generator(seed, 2, device))
        run = _tune(twin, batch, scales, plan.tuned, plan.blocks, plan.loss, plan.lam, plan.steps, plan.tol,
                    plan.n_probes, plan.relu, plan.lr_map, plan.average, _generator(seed, 1, device), progress)
        after = _estimate(twin, first, run.final, plan.report_probes, _generator(seed, 2, device))
    return first, before, run, after


def _report(model, plan: _Plan, first, before, run, after, scales, shapes, wall) -> AutoInitReport:
    """The :class:`AutoInitReport` of a finished :func:`autoinit` run."""
    notes = []
    if not run.converged:
        notes.append(f"loss {run.loss_hist[-1]:.3g} > tol {plan.tol:g} after {run.steps} steps: see loss_history; "
                     f"the noise of the estimate ({plan.n_probes} probes x batch {plan.batch_size}) may keep the "
                     "loss above tol")
    t = run.steps
    return AutoInitReport(
        blocks=plan.blocks, loss=plan.loss, lam=plan.lam, mode=plan.mode, lr=plan.lr_desc, steps=t,
        converged=run.converged, tol=plan.tol, batch_size=plan.batch_size, n_probes=plan.n_probes,
        before=Measurement(plan.blocks, *before, "fused", plan.report_probes, first.shape[0]),
        after=Measurement(plan.blocks, *after, "fused", plan.report_probes, first.shape[0]),
        loss_history=np.array(run.loss_hist), J_history=np.array(run.J_hist), scales=scales, shapes=shapes,
        average=plan.average,
        model_class=type(model).__name__, wall_time=wall,
        steps_per_second=(t / run.loop_time if run.loop_time > 0 and t else float("nan")), notes=notes)


def _check_autoinit_args(x_all, loss, lam, mode, steps, tol, n_probes, report_probes, average, batch_size):
    """The scalar arguments of :func:`autoinit`, checked (ValueError naming the argument)."""
    loss = _check_choice("loss", loss, LOSSES)
    lam = _check_number("lam", lam)
    if loss != "jkl" and lam != 0.0:
        raise ValueError(f"lam={lam!r} is only used by loss='jkl'; got loss={loss!r}")
    mode = _check_choice("mode", mode, MODES)
    steps = _check_int("steps", steps, 1)
    tol = _check_number("tol", tol)
    n_probes = _check_int("n_probes", n_probes, 1)
    report_probes = _check_int("report_probes", report_probes, 1)
    average = _check_int("average", average, 0)
    n_data = x_all.shape[0]
    if batch_size is None:
        batch_size = n_data
    batch_size = _check_int("batch_size", batch_size, 1)
    if batch_size > n_data:
        raise ValueError(f"batch_size={batch_size} exceeds the {n_data} inputs given")
    return loss, lam, mode, steps, tol, n_probes, report_probes, average, batch_size


def _learning_rates(model, blocks, tuned, lr):
    """(relu weights or None, {name: rate} or None, description) from the ``lr`` argument.

    None: the ReLU one-step rate (recomputed every step) for a ReLU MLP, else
    ``DEFAULT_LR``; a number: that rate for every tuned tensor; a dict: its rates.
    """
    relu = _relu_mlp_weights(model, blocks) if lr is None else None
    if isinstance(lr, Mapping):
        unknown = [n for n in lr if n not in tuned]
        if unknown:
            raise ValueError(f"lr names parameters that are not tuned: {unknown[:6]}")
        return relu, {n: _check_number(f"lr[{n!r}]", v) for n, v in lr.items()}, "per-parameter"
    if lr is None:
        return relu, (None if relu else {n: DEFAULT_LR for n in tuned}), \
            ("relu-one-step (eq. 19/43)" if relu else DEFAULT_LR)
    lr_f = _check_number("lr", lr, strict=True)
    return relu, {n: lr_f for n in tuned}, lr_f


def _batches(x_all, batch_size, data_gen):
    """A function returning the next batch: all inputs, or ``batch_size`` of them drawn at random."""
    n_data = x_all.shape[0]

    def batch():
        if batch_size == n_data:
            return x_all
        idx = torch.randperm(n_data, generator=data_gen)[:batch_size].to(x_all.device)
        return x_all[idx]
    return batch


@dataclass
class _Run:
    """What the tuning loop leaves: histories, the final scales, the number of updates, time."""

    loss_hist: list
    J_hist: list
    final: dict
    steps: int
    converged: bool
    loop_time: float


def _step_loss(twin, x, scales, n_probes, probe_gen, blocks, loss, lam, t):
    """(J, loss) of one step, differentiable w.r.t. the scales; AutoInitError on a NaN/inf/zero J, K or loss."""
    Js, Ks = twin.jvp_pass(x, scales, n_probes, probe_gen)
    J = torch.stack([s.mean() for s in Js])
    K = torch.stack(Ks)
    L = _loss(J, K, loss, lam)
    L_val = L.item()
    bad = _first_bad(J.detach(), K.detach(), blocks, kernel_in_loss=(loss == "jkl" and lam > 0))
    if bad is None and not math.isfinite(L_val):
        bad = (blocks[-1], f"the loss is {L_val}")
    if bad is not None:
        raise AutoInitError(f"AutoInit stopped at step {t}: {bad[1]}. Lower lr, or check the "
                            "model's initial scale.", step=t, block=bad[0])
    return J, L


def _sgd_update(L, J, scales, tuned, relu, lr_map, loss, lam, t):
    """a <- a - lr dL/da for every tuned scale (ReLU MLP: the one-step rates of this step's J)."""
    grads = torch.autograd.grad(L, [scales[n] for n in tuned], allow_unused=True)
    if relu is not None:
        lr_map = _relu_one_step_rates(J.detach(), scales, relu, tuned, loss, lam)
    with torch.no_grad():
        for n, g in zip(tuned, grads):
            if g is None or n not in lr_map:
                continue
            if not torch.isfinite(g):
                raise AutoInitError(f"AutoInit stopped at step {t}: the gradient for {n!r} is "
                                    f"{float(g)}", step=t, block=None)
            scales[n] -= lr_map[n] * g


def _tune(twin, batch, scales, tuned, blocks, loss, lam, steps, tol, n_probes, relu, lr_map, average, probe_gen,
          progress) -> _Run:
    """Algorithm 1/2: SGD on the scales until the loss is <= tol or ``steps`` updates are done."""
    loss_hist, J_hist, recent = [], [], []  # recent: the last `average` iterates of the scales
    converged = False
    bar = _progress(steps, progress)
    t_loop = time.perf_counter()
    t = 0
    try:
        while True:
            J, L = _step_loss(twin, batch(), scales, n_probes, probe_gen, blocks, loss, lam, t)
            L_val = L.item()
            loss_hist.append(L_val)
            J_hist.append(J.detach().cpu().numpy())
            if average:
                recent = (recent + [{n: a.detach().clone() for n, a in scales.items()}])[-average:]
            if bar is not None:
                bar.set_postfix(loss=f"{L_val:.3g}")
            if L_val <= tol:
                converged = True
                break
            if t >= steps:
                break
            _sgd_update(L, J, scales, tuned, relu, lr_map, loss, lam, t)
            t += 1
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    loop_time = time.perf_counter() - t_loop
    if average:
        final = {n: torch.stack([r[n] for r in recent]).mean() for n in tuned}
    else:
        final = {n: a.detach() for n, a in scales.items()}
    return _Run(loss_hist, J_hist, final, t, converged, loop_time)


def _relu_one_step_rates(J, scales, weights, tuned, loss, lam):
    """Per-parameter rates for a ReLU MLP: eq. 19 (JLL/JKL) or 43 (JSL) with sigma_w^2 = 2 J / a^2."""
    rates = {n: 0.0 for n in tuned}
    for i, wname in weights.items():
        if i == 0 or wname not in scales:
            continue
        Jl = float(J[i - 1])
        a = float(scales[wname].detach())
        sigma_w = math.sqrt(2.0 * Jl) / max(abs(a), 1e-30)
        rate = float(_theory.one_step_lr(Jl, sigma_w, loss=loss, lam=lam if loss == "jkl" else 0.0))
        rates[wname] = rate
        bname = wname[: -len("weight")] + "bias"
        if bname in rates:
            rates[bname] = rate
    return rates
