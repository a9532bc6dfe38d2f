"""Dense layers: fresh Gaussian weights along the features, the tokens or the Mixer's channels.

State map, APJN factor and Gram rule: partial-Jacobian paper eqs. 9 and 11
(K -> sigma_w^2 K + sigma_b^2, chi = sigma_w^2); the NTK in neural-tangents'
two parameterisations; the torch realisation draws the weights of every
initialisation of a Monte-Carlo pass at once (:mod:`meanfield.torch.context`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

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


def dense(sigma_w=None, sigma_b=None, axis: str = "features") -> Dense:
    """A fresh Gaussian linear layer W x + b, W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2).

    sigma_w, sigma_b default to the symbols that the solvers scan; a number
    fixes this layer's scale. ``axis`` is what it mixes: 'features' (MLP),
    'tokens' (token mixing) or 'channels' (the Mixer's channel MLP).
    """
    check_choice("axis", axis, AXES)
    return Dense(parameter("sigma_w", sigma_w, S.sigma_w), parameter("sigma_b", sigma_b, S.sigma_b), axis)
