"""Dense layers: fresh Gaussian weights along the features, the tokens or the Mixer's channels.

State map, APJN factor and Gram rule: partial-Jacobian paper eqs. 9 and 11
(K -> sigma_w^2 K + sigma_b^2, chi = sigma_w^2); the NTK in neural-tangents'
two parameterisations; the torch realisation draws the weights of every
initialisation of a Monte-Carlo pass at once (:mod:`meanfield.torch.context`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from .. import symbols as S
from .._validate import check_choice, check_real
from ..gap import sum_gap
from .base import AXES, Primitive, format_number, parameter, short

__all__ = ["Dense", "dense"]


@dataclass(frozen=True, repr=False)
class Dense(Primitive):
    """Affine layer W phi + b with W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2).

    ``axis`` is what it mixes: 'features' (MLP), 'tokens' (the token-mixing
    layers of ResMLP and MLP-Mixer) or 'channels' (the Mixer's channel MLP).
    K -> sigma_w^2 K + sigma_b^2 in every case. The pair covariance depends on
    whether the two members share the layer's weights: if the layer mixes
    along the pair's own axis, the two are different output rows with
    independent weights and biases, so K12 -> 0; otherwise they share W and b
    and K12 -> sigma_w^2 K12 + sigma_b^2.
    """

    sigma_w: sp.Expr = S.sigma_w
    sigma_b: sp.Expr = S.sigma_b
    axis: str = "features"
    output_gaussian = True
    fresh_weights = True
    torch_modules_read = "nn.Linear"

    def __post_init__(self):
        check_real("sigma_w", self.sigma_w, minimum=0)
        check_real("sigma_b", self.sigma_b, minimum=0)

    def forward(self, s):
        K = self.sigma_w**2 * s.K + self.sigma_b**2
        if self.axis == s.pair_axis:
            return s.to(K, sp.Integer(0))
        return s.to(K, self.sigma_w**2 * s.K12 + self.sigma_b**2)

    def chi(self, s):
        return self.sigma_w**2

    def gram(self, g):
        # NTK: Theta' = (own parameters) + sigma_w^2 Theta. 'ntk': W = sigma_w w / sqrt(n), b = sigma_b beta
        # with (w, beta) trained, so the own part is sigma_w^2 E[z z'] + sigma_b^2 = K12'; 'standard': W, b
        # trained directly, n E[z z'] + 1 (neural-tangents' convention, n = fan-in)
        if self.axis != "features":
            raise ValueError(f"{short(self)}: Gram matrices over inputs are for layers along the features only")
        sw2, sb2 = self.sigma_w**2, self.sigma_b**2
        K12 = sw2 * g.K12 + sb2
        own = K12 if g.parameterization == "ntk" else g.width * g.K12 + 1
        # the bias is one number for both inputs: correlation 1, gap 0
        gap = None if g.gap is None else sum_gap(sw2 * g.K1, sw2 * g.K2, g.rho, g.gap, sb2, sb2, 1, 0)
        return g.to(sw2 * g.K1 + sb2, sw2 * g.K2 + sb2, K12, own + sw2 * g.T12, gap=gap)

    def gram_tokens(self, s, walk):
        """Over (image, token) pairs (:mod:`meanfield.gram.tokens`; ``s`` a
        :class:`~.state.TokenSignal`). Along the channels (or features) of each
        token, independent rows and biases: A -> sw^2 A + sb^2, B -> 0,
        TA -> own + sw^2 TA, TB -> 0. Along the tokens, fresh weights shared by
        the channels: every token gets the token mean of its input,
        A -> I_T (x) (sw^2 mean_t A_tt + sb^2), and B, TA, TB alike (the bias is
        shared by the channels, so B gets sb^2). own: the layer's own NTK term,
        sw^2 E[z z'] + sb^2 ('ntk') or fan-in E[z z'] + 1 ('standard')."""
        sw2, sb2 = walk.number(self.sigma_w) ** 2, walk.number(self.sigma_b) ** 2
        if self.axis == "tokens":
            return _token_dense(s, walk, sw2, sb2)
        A = sw2 * s.A + sb2
        TA = TB = None
        if walk.ntk:
            own = A if walk.parameterization == "ntk" else walk.width * s.A + 1.0
            TA, TB = own + sw2 * s.TA, np.zeros_like(A)
        # each output unit sees the C channels of its position through weights of variance sw^2 / C
        return replace(s, A=A, B=np.zeros_like(A), TA=TA, TB=TB, gaussian=True,
                       G=walk.bias_gap(sw2 * s.A, s.G, sb2), J=None if s.J is None else sw2 * s.J)

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.Linear``: a dense layer along the features (along the tokens on a transposed value)."""
        from torch import nn

        if not isinstance(module, nn.Linear):
            return None
        return dense(sigma_b=None if module.bias is not None else 0, axis="tokens" if value.transposed else "features")

    def short(self, num=format_number):
        args = [f"{k}={num(v)}" for k, v, default in (("sigma_w", self.sigma_w, S.sigma_w),
                                                      ("sigma_b", self.sigma_b, S.sigma_b)) if v != default]
        args += [] if self.axis == "features" else [f"axis={self.axis!r}"]
        return f"dense({', '.join(args)})"

    def torch_forward(self, z, ctx, out: int | None = None):
        """W z + b along the features (last axis) or the tokens (axis -2); the bias on the primal only.

        Draws a standard normal G (I, out, in) and g (I, out) from ``ctx`` and
        uses W = sigma_w G / sqrt(fan_in), b = sigma_b g at every parameter
        point (one batched product shared by the points). ``out``: the output
        size (the input size when None; the input layer maps N0 to the width).
        """
        import torch

        from ..torch import context as C

        I, P, Sl, B, T, N = z.shape
        if self.axis != "tokens":
            out = out or N
            G = ctx.normal((out, N))
            y = torch.bmm(z.reshape(I, P * Sl * B * T, N), G.transpose(1, 2)).view(I, P, Sl, B, T, out)
            fan_in = N
            g = ctx.normal((out,)).view(I, 1, 1, 1, out)
        else:
            out = out or T
            G = ctx.normal((out, T))
            y = torch.matmul(G.unsqueeze(1), z.reshape(I, P * Sl * B, T, N)).view(I, P, Sl, B, out, N)
            fan_in = T
            g = ctx.normal((out,)).view(I, 1, 1, out, 1)
        scale = C.param_view(ctx.value(self.sigma_w) / math.sqrt(fan_in))
        sb = ctx.value(self.sigma_b)
        if (C.FUSED_EPILOGUE and self.axis != "tokens" and y.device.type == "cpu" and y.shape[1] == scale.shape[1]
                and y.is_contiguous() and g.is_contiguous() and y.dtype in (torch.float32, torch.float64)
                and y.dtype == g.dtype == scale.dtype == sb.dtype
                and C.is_plain(y) and C.is_plain(g) and C.is_plain(scale) and C.is_plain(sb)):
            # one pass instead of three, bit for bit the same numbers (torch/_fused.py)
            from ..torch._fused import affine_

            affine_(y.numpy().reshape(I, y.shape[1], Sl, B * T, out), scale.reshape(-1).numpy(),
                    sb.numpy(), g.reshape(I, out).numpy())
            return y
        y = y.mul_(scale) if y.shape[1] == scale.shape[1] else y * scale
        y[:, :, 0] += sb.view(1, -1, 1, 1, 1) * g
        return y


def _token_mean(M):
    """mean_t M[x, t, x', t], shape (n, n)."""
    return np.einsum("atbt->ab", M) / M.shape[1]


def _token_diagonal(m, T):
    """I_T (x) m: the (n, n) matrix m on every token's diagonal block, shape (n, T, n, T)."""
    n = m.shape[0]
    out = np.zeros((n, T, n, T))
    idx = np.arange(T)
    out[:, idx, :, idx] = m[None, :, :]
    return out


def _token_gap(s, walk, sw2, sb2):
    """The gap of sw2 mean_t A_tt + sb2, (n, n): the token sum folded pair state by pair state."""
    if s.G is None:
        return None
    T = s.A.shape[1]
    d = s.variances
    S, S1, g = s.A[:, 0, :, 0], d[:, 0], s.G[:, 0, :, 0]
    with np.errstate(all="ignore"):
        for t in range(1, T):
            M, M1 = s.A[:, t, :, t], d[:, t]
            g = walk.gap_of_sum(S1[:, None], S1[None, :], S, g, M1[:, None], M1[None, :], M, s.G[:, t, :, t])
            S, S1 = S + M, S1 + M1
    g = walk.settle(np.asarray(g)[:, None, :, None] + np.zeros((1, 1, 1, 1)), S[:, None, :, None])
    g = g[:, 0, :, 0]
    if sb2 == 0:
        return g
    M = (sw2 / T) * S
    return walk.bias_gap(M[:, None, :, None], g[:, None, :, None], sb2)[:, 0, :, 0]


def _token_dense(s, walk, sw2, sb2):
    """:meth:`Dense.gram_tokens` along the tokens."""
    T = s.A.shape[1]
    g = _token_gap(s, walk, sw2, sb2)
    G = None if g is None else _token_diagonal(g, T) + (1.0 - _token_diagonal(np.ones_like(g), T))
    mA, mB = _token_mean(s.A), _token_mean(s.B)
    A, B = _token_diagonal(sw2 * mA + sb2, T), _token_diagonal(sw2 * mB + sb2, T)
    TA = TB = None
    if walk.ntk:
        # own terms: d a_c(x,s) / d W_st = sw v_c(x,t)/sqrt(T) ('ntk'), / d b_s = sb (shared by the channels)
        if walk.parameterization == "ntk":
            oA, oB = sw2 * mA + sb2, sw2 * mB + sb2
        else:  # W, b trained directly: fan-in T
            oA, oB = T * mA + 1.0, T * mB + 1.0
        TA = _token_diagonal(oA + sw2 * _token_mean(s.TA), T)
        TB = _token_diagonal(oB + sw2 * _token_mean(s.TB), T)
    # each output token sees the T tokens of its channel through its own row of weights of variance sw^2 / T
    J = None
    if s.J is not None:
        mass = sw2 * np.einsum("attw->aw", s.J) / T
        J = np.eye(T)[None, :, :, None] * mass[:, None, None, :]
    return replace(s, A=A, B=B, TA=TA, TB=TB, gaussian=True, G=G, J=J)


def dense(sigma_w=None, sigma_b=None, axis: str = "features") -> Dense:
    """A fresh Gaussian linear layer W x + b, W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2).

    sigma_w, sigma_b default to the symbols that the solvers scan; a number
    fixes this layer's scale. ``axis`` is what it mixes: 'features' (MLP),
    'tokens' (token mixing) or 'channels' (the Mixer's channel MLP).
    """
    check_choice("axis", axis, AXES)
    return Dense(parameter("sigma_w", sigma_w, S.sigma_w), parameter("sigma_b", sigma_b, S.sigma_b), axis)
