r"""Convolutions at infinite channels: along the positions of an input, a sequence or an (H, W) grid.

A convolution with C input channels, kernel size k, dilation d and stride s
maps the channels z_{c', q} at positions q to

    h_{c, p} = sum_{c', j} W_{c c' j} z_{c', s p + d (j - o)} + b_c,
    W ~ N(0, sigma_w^2 / (k C)),  b ~ N(0, sigma_b^2),

with o = (k - 1) / 2 for padding 'same' (zeros beyond the edges, torch's
``padding=k // 2``) and 'circular' (the positions wrap around), and o = 0
with only the positions that fit for 'valid'; torch's output size,
floor((n + 2 d o - d (k - 1) - 1) / s) + 1. In 2-D the same holds per axis,
j running over the kh x kw taps and k = kh kw. The fan-in k C counts every
tap, padded or not, as torch and neural-tangents' ``stax.Conv`` do.

At infinite channels (Novak et al. 2019, "Bayesian deep convolutional
networks with many channels are Gaussian processes", eqs. 5-7; Garriga-Alonso
et al. 2019) the preactivations are jointly Gaussian over inputs x and
positions p, and the covariance of one channel maps as a patch mean,

    A'[(x, p), (x', p')] = sigma_w^2 / k sum_j A[(x, s p + d(j - o)), (x', s p' + d(j - o))] + sigma_b^2,

with the zero-padded entries 0 and the circular ones wrapped; two different
output channels have independent weights and biases, so their covariance
B' is 0. The NTK maps alike (Arora et al. 2019, eq. 7 for CNTK):
Theta' = own + sigma_w^2 / k sum_j Theta[shifted], own = A' ('ntk') or
k C (1/k sum_j A[shifted]) + 1 ('standard', W and b trained directly).

**The scalar recursion.** On an input whose statistics are the same at every
position (homogeneous), padding 'circular' and 'valid' keep them so: every
output position sums k input positions of the same variance K, so
K -> sigma_w^2 K + sigma_b^2, and two inputs x, x' with the same cross
covariance K12 at every position map to sigma_w^2 K12 + sigma_b^2: the
dense layer's rule (partial-Jacobian eq. 9). Its APJN factor is the dense
layer's sigma_w^2 too: each output unit has k C inputs of weight variance
sigma_w^2 / (k C) (eq. 14). So the solvers treat such a convolution as a
dense layer, exactly. With zero padding the edge positions have fewer
inputs, the variances differ across positions and no scalar recursion
exists: the solvers refuse it by name, and :func:`meanfield.kernels` maps the
whole position-resolved state.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from .. import symbols as S
from .._validate import check_choice, check_int, check_real
from .base import NoScalarRecursion, Primitive, format_number, json_value, parameter

__all__ = ["Conv", "conv", "AvgPool", "avg_pool", "PADDINGS"]

#: what lies beyond the edges: zeros (torch's padding='same'), the other edge, or nothing (fewer outputs)
PADDINGS = ("same", "circular", "valid")


@dataclass(frozen=True, repr=False)
class Conv(Primitive):
    """A convolution along the positions of each input (1-D, or 2-D over an (H, W) grid), mixing all channels
    (module notes). ``kernel_size``: a tuple of one or two ints (:func:`conv` takes an int for 1-D)."""

    kernel_size: tuple = (3,)
    sigma_w: sp.Expr = S.sigma_w
    sigma_b: sp.Expr = S.sigma_b
    padding: str = "same"
    dilation: int = 1
    stride: int = 1
    #: it mixes along the positions of an input: kernels() takes (n, T, d) or (n, H, W, d) inputs
    axis = "positions"
    output_gaussian = True
    fresh_weights = True

    def __post_init__(self):
        object.__setattr__(self, "kernel_size", _kernel_size(self.kernel_size))
        check_int("dilation", self.dilation, 1)
        check_int("stride", self.stride, 1)
        check_choice("padding", self.padding, PADDINGS)
        if self.padding != "valid" and any(k % 2 == 0 for k in self.kernel_size):
            raise ValueError(f"kernel_size={self.kernel_size} with padding={self.padding!r}: an even kernel pads "
                             "its two edges unequally; use an odd kernel_size, or padding='valid'")
        check_real("sigma_w", self.sigma_w, minimum=0)
        check_real("sigma_b", self.sigma_b, minimum=0)
        object.__setattr__(self, "dilation", int(self.dilation))
        object.__setattr__(self, "stride", int(self.stride))

    @property
    def position_dims(self) -> int:
        """1 for a convolution along a sequence, 2 over an (H, W) grid."""
        return len(self.kernel_size)

    def _homogeneous(self):
        # a 1 x 1 kernel reads no padded position, whatever the padding
        if self.padding == "same" and any(k > 1 for k in self.kernel_size):
            raise NoScalarRecursion(f"{self.short()}: zero padding gives the edge positions other variances than "
                                    "the middle ones, so there is no single-input recursion for the solvers; use "
                                    "padding='circular' or 'valid' (homogeneous positions), or meanfield.kernels, "
                                    "which maps every position")

    def forward(self, s):
        # homogeneous positions: the dense layer's map (module notes)
        self._homogeneous()
        return s.to(self.sigma_w**2 * s.K + self.sigma_b**2, self.sigma_w**2 * s.K12 + self.sigma_b**2)

    def chi(self, s):
        self._homogeneous()
        return self.sigma_w**2

    def layout(self, grid: tuple) -> tuple:
        """For input positions of shape ``grid``: (the output grid, per axis the input index of each tap into
        the padded axis, per axis the padding on each side)."""
        return _layout(self, grid)

    def _patch_sum(self, M, grid):
        """sum over the taps of M[:, p + shift, :, p' + shift], padded as the layer pads; (n, T', n, T')."""
        n, D = M.shape[0], self.position_dims
        out, taps, pads = self.layout(grid)
        total = _sum_windows(_padded(M, grid, pads, self.padding), taps, 1, 2 + D, paired=True)
        T_out = math.prod(out)
        return total.reshape(n, T_out, n, T_out), out

    def gram_tokens(self, s, walk):
        """Over (input, position) pairs (``s`` a :class:`~.state.TokenSignal`): the patch mean of the
        module notes for A and TA; B, TB -> 0 (independent output channels). The gap of near-parallel
        entries is not carried through a convolution (G -> None)."""
        k = math.prod(self.kernel_size)
        sw2, sb2 = walk.number(self.sigma_w) ** 2, walk.number(self.sigma_b) ** 2
        grid = s.grid or (s.A.shape[1],)
        patch, out = self._patch_sum(s.A, grid)
        A = (sw2 / k) * patch + sb2
        TA = TB = None
        if walk.ntk:
            own = A if walk.parameterization == "ntk" else walk.width * patch + 1.0
            TA, TB = own + (sw2 / k) * self._patch_sum(s.TA, grid)[0], np.zeros_like(A)
        # each output unit sees the k taps of the C channels through weights of variance sw^2 / (k C)
        J = None if s.J is None else (sw2 / k) * _window_sum(s.J, grid, self, paired=True)
        return replace(s, A=A, B=np.zeros_like(A), TA=TA, TB=TB, gaussian=True, G=None, grid=out, J=J)

    torch_modules_read = "nn.Conv1d/nn.Conv2d"

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.Conv1d`` / ``nn.Conv2d`` with groups=1, the same stride and dilation on every axis, and
        torch's padding for 'same' (d (k - 1) / 2 zeros, or ``padding='same'``), 'circular'
        (``padding_mode='circular'``) or 'valid' (0); anything else is a ValueError naming ``where``."""
        from torch import nn

        if not isinstance(module, (nn.Conv1d, nn.Conv2d)):
            return None
        ks = tuple(module.kernel_size)
        if module.groups != 1:
            raise ValueError(f"{where}: groups={module.groups}; the theory's convolution mixes every channel "
                             "(groups=1): a grouped or depthwise convolution has no primitive yet")
        stride, dilation = _one_value(where, "stride", module.stride), _one_value(where, "dilation", module.dilation)
        if module.padding_mode not in ("zeros", "circular"):
            raise ValueError(f"{where}: padding_mode={module.padding_mode!r}; the theory pads with zeros or "
                             "circularly ('zeros', 'circular')")
        same = tuple(dilation * (k - 1) // 2 for k in ks)
        if all(k == 1 for k in ks):
            padding = "same"   # a 1 x 1 kernel reads no neighbour: every padding is the tree's default
        elif module.padding == "valid" or all(p == 0 for p in tuple(module.padding)):
            padding = "valid"
        elif (module.padding == "same" or tuple(module.padding) == same) and all(k % 2 for k in ks):
            padding = "same" if module.padding_mode == "zeros" else "circular"
        else:
            raise ValueError(f"{where}: padding={module.padding!r} with kernel_size={ks}; the theory pads "
                             f"d (k - 1) / 2 = {same} (an odd kernel: 'same', or 'circular' with "
                             "padding_mode='circular') or nothing ('valid')")
        return conv(ks[0] if len(ks) == 1 else ks, sigma_b=None if module.bias is not None else 0,
                    padding=padding, dilation=dilation, stride=stride)

    def short(self, num=format_number):
        args = [str(self.kernel_size[0]) if self.position_dims == 1 else str(self.kernel_size)]
        args += [f"{k}={num(v)}" for k, v, default in (("sigma_w", self.sigma_w, S.sigma_w),
                                                      ("sigma_b", self.sigma_b, S.sigma_b)) if v != default]
        args += [] if self.padding == "same" else [f"padding={self.padding!r}"]
        args += [] if self.dilation == 1 else [f"dilation={self.dilation}"]
        args += [] if self.stride == 1 else [f"stride={self.stride}"]
        return f"conv({', '.join(args)})"

    def to_json(self):
        ks = self.kernel_size
        return {"type": "Conv", "kernel_size": ks[0] if len(ks) == 1 else list(ks),
                "sigma_w": json_value(self.sigma_w), "sigma_b": json_value(self.sigma_b), "padding": self.padding,
                "dilation": self.dilation, "stride": self.stride}

    @classmethod
    def from_json(cls, fields, path, read_tree):
        fields = dict(fields)
        ints = {k: fields.pop(k) for k in ("kernel_size", "dilation", "stride") if k in fields}
        padding = fields.pop("padding", "same")
        node = super().from_json(fields, path, read_tree)
        return replace(node, padding=padding, **ints)

    def torch_forward(self, z, ctx, out: int | None = None):
        """The convolution along the positions (axis -2) of the (I, P, S, B, T, N) layout, all channels in.

        The positions are ``ctx.grid`` (a 2-D convolution needs it; None: one axis of T), which this layer
        updates to its output grid. Draws a standard normal G (I, out, k N) (taps in row-major order, then the
        channels) and g (I, out) from ``ctx`` and uses W = sigma_w G / sqrt(k N), b = sigma_b g (the bias on
        the primal only), as :class:`~.linear.Dense` does with fan-in k N; padding by index, so a circular
        pad wraps however many times it must.
        """
        import torch

        from ..torch import context as C

        I, P, Sl, B, T, N = z.shape
        out = out or N
        patches, out_grid = _windows(self, z, ctx)
        T_out = math.prod(out_grid)
        fan_in = math.prod(self.kernel_size) * N
        x = torch.stack(patches, dim=-2).reshape(I, P * Sl * B * T_out, fan_in)
        G = ctx.normal((out, fan_in))
        y = torch.bmm(x, G.transpose(1, 2)).view(I, P, Sl, B, T_out, out)
        g = ctx.normal((out,)).view(I, 1, 1, 1, out)
        y = y * C.param_view(ctx.value(self.sigma_w) / math.sqrt(fan_in))
        y[:, :, 0] += ctx.value(self.sigma_b).view(1, -1, 1, 1, 1) * g
        _set_grid(ctx, out_grid)
        return y


@dataclass(frozen=True, repr=False)
class AvgPool(Primitive):
    r"""Average pooling along the positions, per channel: y_{c, p} = 1/k sum_j z_{c, s p + j - o} (1-D, or
    over kh x kw windows in 2-D, k their size), with torch's ``AvgPool`` conventions: stride = the window by
    default, zero padding counted in the mean (``count_include_pad=True``).

    No weights: it is linear in its input, per channel, so at infinite channels every second moment maps by
    the double window sum (each side of the pair has its own window),

        A'[(x, p), (x', p')] = 1/k^2 sum_{j, j'} A[(x, s p + j - o), (x', s p' + j' - o)],

    and B, TA, TB alike (Novak et al. 2019, section 3.2; neural-tangents' ``stax.AvgPool``). The pooled
    variance depends on the covariance between positions, which the single-input recursion does not carry:
    the solvers refuse a tree with it (:class:`~.base.NoScalarRecursion`); :func:`meanfield.kernels` maps it.
    """

    kernel_size: tuple = (2,)
    stride: int | None = None
    padding: str = "valid"
    axis = "positions"
    dilation = 1

    def __post_init__(self):
        object.__setattr__(self, "kernel_size", _kernel_size(self.kernel_size))
        check_choice("padding", self.padding, PADDINGS)
        if self.padding != "valid" and any(k % 2 == 0 for k in self.kernel_size):
            raise ValueError(f"kernel_size={self.kernel_size} with padding={self.padding!r}: an even window pads "
                             "its two edges unequally; use an odd kernel_size, or padding='valid'")
        if self.stride is not None:
            object.__setattr__(self, "stride", int(check_int("stride", self.stride, 1)))
        elif len(set(self.kernel_size)) > 1:
            raise ValueError(f"avg_pool({self.kernel_size}): give the stride of a window that is not square")

    @property
    def position_dims(self) -> int:
        return len(self.kernel_size)

    @property
    def step(self) -> int:
        """The stride (the window's size when not given, as torch)."""
        return self.kernel_size[0] if self.stride is None else self.stride

    def forward(self, s):
        raise NoScalarRecursion(f"{self.short()}: a pooled variance depends on the covariance between positions, "
                                "which the single-input recursion does not carry; meanfield.kernels maps it")

    def chi(self, s):
        self.forward(s)

    def gram_tokens(self, s, walk):
        """Over (input, position) pairs (``s`` a :class:`~.state.TokenSignal`): the double window mean of the
        class notes for A, B, TA and TB; the gap is not carried (G -> None)."""
        grid = s.grid or (s.A.shape[1],)
        out, taps, pads = _layout(self, grid)
        k2 = math.prod(self.kernel_size) ** 2
        T_out = math.prod(out)
        D = self.position_dims

        def pooled(M):
            if M is None:
                return None
            M = _sum_windows(_padded(M, grid, pads, self.padding), taps, 1, 2 + D, paired=False)
            return M.reshape(M.shape[0], T_out, M.shape[0], T_out) / k2

        # each output unit is the mean of k units of its channel: (1/k^2) sum_{j, j'} J[p + j, q + j']
        J = None if s.J is None else _window_sum(s.J, grid, self, paired=False) / k2
        return replace(s, A=pooled(s.A), B=pooled(s.B), TA=pooled(s.TA), TB=pooled(s.TB), G=None, grid=out, J=J)

    torch_modules_read = "nn.AvgPool1d/nn.AvgPool2d"

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.AvgPool1d`` / ``nn.AvgPool2d`` with square windows and strides, no ceil_mode or divisor_override,
        padding 0 ('valid') or (k - 1) / 2 counted in the mean ('same'); ValueError naming ``where`` otherwise."""
        from torch import nn

        if not isinstance(module, (nn.AvgPool1d, nn.AvgPool2d)):
            return None
        dims = 1 if isinstance(module, nn.AvgPool1d) else 2
        ks = _per_axis(module.kernel_size, dims)
        stride = _one_value(where, "stride", _per_axis(module.stride or module.kernel_size, dims))
        pad = _per_axis(module.padding, dims)
        if module.ceil_mode or getattr(module, "divisor_override", None) is not None:
            raise ValueError(f"{where}: ceil_mode or divisor_override changes torch's windows or their mean; the "
                             "theory's pooling is the mean over whole windows (neither set)")
        if all(p == 0 for p in pad):
            padding = "valid"
        elif pad == tuple((k - 1) // 2 for k in ks) and all(k % 2 for k in ks) and module.count_include_pad:
            padding = "same"
        else:
            raise ValueError(f"{where}: padding={module.padding!r} with kernel_size={module.kernel_size!r}; the "
                             "theory's pooling pads 0 ('valid') or (k - 1) / 2 zeros counted in the mean ('same', "
                             "odd k, count_include_pad=True)")
        # torch stores the default stride as the window's size: the tree says default as avg_pool() does
        default = len(set(ks)) == 1 and stride == ks[0]
        return avg_pool(ks[0] if dims == 1 else ks, stride=None if default else stride, padding=padding)

    def short(self, num=format_number):
        args = [str(self.kernel_size[0]) if self.position_dims == 1 else str(self.kernel_size)]
        args += [] if self.stride is None else [f"stride={self.stride}"]
        args += [] if self.padding == "valid" else [f"padding={self.padding!r}"]
        return f"avg_pool({', '.join(args)})"

    def to_json(self):
        ks = self.kernel_size
        return {"type": "AvgPool", "kernel_size": ks[0] if len(ks) == 1 else list(ks), "stride": self.stride,
                "padding": self.padding}

    @classmethod
    def from_json(cls, fields, path, read_tree):
        unknown = set(fields) - {"kernel_size", "stride", "padding"}
        if unknown:
            raise ValueError(f"{path}: AvgPool has no field(s) {sorted(unknown)}; allowed: "
                             "['kernel_size', 'padding', 'stride']")
        return cls(**fields)

    def torch_forward(self, z, ctx):
        """The mean over each window (primal and tangents alike: the map is linear), zeros counted."""
        windows, out_grid = _windows(self, z, ctx)
        I, P, Sl, B, T, N = z.shape
        y = sum(windows) / len(windows)
        _set_grid(ctx, out_grid)
        return y.reshape(I, P, Sl, B, math.prod(out_grid), N)


def avg_pool(kernel_size=2, stride=None, padding: str = "valid") -> AvgPool:
    """Average pooling along the positions at infinite channels (:class:`AvgPool`).

    ``kernel_size``: an int (1-D) or a pair (2-D); ``stride``: the window's
    size by default, as torch; ``padding``: 'valid' (torch's default),
    'same' (zeros, counted in the mean as torch's ``count_include_pad``) or
    'circular'.
    """
    return AvgPool(_kernel_size(kernel_size), stride, padding)


def _layout(node, grid) -> tuple:
    """A window layer's (conv, pool) geometry on positions of shape ``grid``: (the output grid, per axis the
    input index of each tap into the padded axis, per axis the padding on each side). torch's output size:
    floor((n + 2 pad - d (k - 1) - 1) / s) + 1, pad = d (k - 1) / 2 ('same', 'circular') or 0 ('valid')."""
    grid = tuple(int(g) for g in grid)
    if len(grid) != node.position_dims:
        raise ValueError(f"{node.short()} is {node.position_dims}-D; the inputs have {len(grid)}-D positions {grid}")
    d, s, out, taps, pads = node.dilation, getattr(node, "step", node.stride), [], [], []
    for n, k in zip(grid, node.kernel_size):
        pad = 0 if node.padding == "valid" else d * (k - 1) // 2
        span = n + 2 * pad - d * (k - 1)          # start positions where the window fits in the padded axis
        if span < 1:
            raise ValueError(f"{node.short()} needs at least {d * (k - 1) + 1} positions, got {n}")
        n_out = (span - 1) // s + 1
        out.append(n_out)
        taps.append([s * np.arange(n_out) + d * j for j in range(k)])
        pads.append(pad)
    return tuple(out), taps, pads


def _padded(M, grid, pads, padding):
    """An (n, T, n, T) state as (n, *grid, n, *grid), each position axis padded on both sides (zeros, or
    wrapped for 'circular')."""
    n = M.shape[0]
    M = M.reshape((n,) + tuple(grid) + (n,) + tuple(grid))
    if any(pads):
        width = [(0, 0)] + [(p, p) for p in pads]
        M = np.pad(M, width * 2, mode="wrap" if padding == "circular" else "constant")
    return M


def _window_sum(J, grid, node, paired):
    """Window sums of a per-input array over pairs of positions J (n, T, T, m), padded as ``node`` pads:
    the same tap on both positions (``paired``: a convolution's shared weights) or every pair of taps
    (pooling); (n, T', T', m)."""
    n, m, D = J.shape[0], J.shape[-1], len(grid)
    out, taps, pads = _layout(node, grid)
    J = J.reshape((n,) + tuple(grid) * 2 + (m,))
    if any(pads):
        width = [(0, 0)] + [(p, p) for p in pads] * 2 + [(0, 0)]
        J = np.pad(J, width, mode="wrap" if node.padding == "circular" else "constant")
    T_out = math.prod(out)
    return _sum_windows(J, taps, 1, 1 + D, paired).reshape(n, T_out, T_out, m)


def _sum_windows(X, taps, left, right, paired):
    """Window sums over two groups of position axes of X (the first axis of each: ``left``, ``right``; ``taps``
    per position axis, from :func:`_layout`): the same tap on both groups (``paired``: a convolution's weights,
    shared by the positions) or every pair of taps (pooling)."""
    if not paired:
        for i, idx in enumerate(taps):
            X = sum(_strided(X, j, left + i) for j in idx)
            X = sum(_strided(X, j, right + i) for j in idx)
        return X
    total = None
    for tap in itertools.product(*taps):
        sub = X
        for i, idx in enumerate(tap):
            sub = _strided(_strided(sub, idx, left + i), idx, right + i)
        if total is None:
            total = sub.copy()
        else:
            total += sub
    return total


def _strided(X, idx, axis):
    """X at the indices ``idx`` of ``axis``: a view, since a window's taps step evenly (s p + d j)."""
    step = int(idx[1] - idx[0]) if len(idx) > 1 else 1
    return X[(slice(None),) * axis + (slice(int(idx[0]), int(idx[-1]) + 1, step),)]


def _windows(node, z, ctx):
    """The windows of a window layer over the (I, P, S, B, T, N) layout: a list, one tensor of shape
    (I, P, S, B, *out_grid, N) per tap (row-major), and the output grid. The positions' shape is ``ctx.grid``
    (None: one axis of T); padding by index, so a circular pad wraps however many times it must."""
    import torch

    I, P, Sl, B, T, N = z.shape
    grid = tuple(getattr(ctx, "grid", None) or (T,))
    if math.prod(grid) != T:
        raise ValueError(f"{node.short()}: the position grid {grid} does not hold the {T} positions")
    out_grid, taps, pads = _layout(node, grid)
    z = z.reshape((I, P, Sl, B) + grid + (N,))
    for i, (n, pad) in enumerate(zip(grid, pads)):
        if not pad:
            continue
        if node.padding == "circular":
            z = z.index_select(4 + i, torch.arange(-pad, n + pad, device=z.device) % n)
        else:
            shape = list(z.shape)
            shape[4 + i] = pad
            zero = z.new_zeros(shape)
            z = torch.cat([zero, z, zero], dim=4 + i)
    windows = []
    for tap in itertools.product(*taps):
        sub = z
        for i, idx in enumerate(tap):
            sub = sub.index_select(4 + i, torch.as_tensor(idx, device=z.device))
        windows.append(sub)
    return windows, out_grid


def _set_grid(ctx, grid):
    """Record the output positions' shape on the pass's context where the next layer needs it."""
    if len(grid) > 1 or getattr(ctx, "grid", None) is not None:
        ctx.grid = grid


def _per_axis(v, dims) -> tuple:
    """A torch module's int-or-tuple argument as a tuple of ``dims`` ints."""
    return tuple(int(a) for a in v) if isinstance(v, (tuple, list)) else (int(v),) * dims


def _one_value(where, name, values) -> int:
    """The one value of a per-axis torch argument (stride, dilation) that the theory's layers share between
    axes; ValueError naming ``where`` when the axes differ."""
    values = _per_axis(values, 1)
    if len(set(values)) != 1:
        raise ValueError(f"{where}: {name}={values} differs between the axes; the theory's layers take one {name}")
    return values[0]


def _kernel_size(k) -> tuple:
    """``kernel_size`` as a tuple of one or two ints >= 1 (ValueError naming it)."""
    ks = (k,) if not isinstance(k, (tuple, list)) else tuple(k)
    if not 1 <= len(ks) <= 2:
        raise ValueError(f"kernel_size must be an int (1-D) or a pair of ints (2-D), got {k!r}")
    return tuple(int(check_int("kernel_size", v, 1)) for v in ks)


def conv(kernel_size=3, sigma_w=None, sigma_b=None, padding: str = "same", dilation: int = 1,
         stride: int = 1) -> Conv:
    """A convolution along the positions of each input at infinite channels (:class:`Conv`).

    ``kernel_size``: an int (1-D: inputs (n, T, d), T positions of d
    channels) or a pair (kh, kw) (2-D: inputs (n, H, W, d)); odd unless
    ``padding='valid'``. ``dilation`` between taps, ``stride`` between
    outputs (on every axis); ``padding``: 'same' (zeros beyond the edges,
    (k - 1) d / 2 on each side, as torch's ``padding=k // 2`` for odd k: with
    stride s, ceil(n / s) outputs), 'circular' or 'valid'; ``sigma_w``,
    ``sigma_b``: numbers, or None for the symbols the solvers scan.
    """
    return Conv(_kernel_size(kernel_size), parameter("sigma_w", sigma_w, S.sigma_w),
                parameter("sigma_b", sigma_b, S.sigma_b), padding, int(check_int("dilation", dilation, 1)),
                int(check_int("stride", stride, 1)))
