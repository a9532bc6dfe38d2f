"""Element-wise primitives: an activation phi, and multiplication by a scalar (LayerScale).

phi: K -> E[phi(h)^2], K12 -> E[phi(u) phi(v)], chi = E[phi'(h)^2]
(partial-Jacobian eqs. 9 and 11; the moments are the activation's, closed
forms or quadrature: :mod:`meanfield.activations`). Scale(eps): every second
moment times eps^2, chi = eps^2 (LayerScale at initialisation, AutoInit
appendix D).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from .. import symbols as S
from .._validate import check_real
from ..activations import ACTIVATIONS, Activation, Erf, ScaleInvariant, activation as make_activation, user_activation
from .base import Primitive, format_number, parameter, require_gaussian

__all__ = ["ActivationLayer", "Scale", "act", "scale", "activation_json", "activation_from_json"]


@dataclass(frozen=True, repr=False)
class ActivationLayer(Primitive):
    """phi applied element-wise to a Gaussian preactivation (eqs. 9 and 11)."""

    phi: Activation
    elementwise = True
    output_gaussian = False
    torch_modules_read = "activation modules"

    def forward(self, s):
        require_gaussian(self, s)
        return s.to(self.phi.second_moment(s.K), self.phi.kernel(s.K, s.K, s.K12),
                    self.phi.mean(s.K), gaussian=False, var=self.phi.variance(s.K))

    def chi(self, s):
        require_gaussian(self, s)
        return self.phi.derivative_second_moment(s.K)

    def chi_delta(self, s):
        return self.phi.chi_delta_moment(s.K)

    def gram(self, g):
        require_gaussian(self, g)
        phi = self.phi
        gap = None if g.gap is None else phi.kernel_gap(g.K1, g.K2, g.K12, g.gap)
        return g.to(phi.second_moment(g.K1), phi.second_moment(g.K2), phi.kernel(g.K1, g.K2, g.K12, gap=g.gap),
                    phi.derivative_kernel(g.K1, g.K2, g.K12, gap=g.gap) * g.T12, phi.mean(g.K1), phi.mean(g.K2),
                    gaussian=False, gap=gap, centred=phi.centred_kernel(g.K1, g.K2, g.K12))

    def gram_tokens(self, s, walk):
        """Over (image, token) pairs (:mod:`meanfield.gram.tokens`; ``s`` a :class:`~.state.TokenSignal`):
        A -> k(A), B -> k(B), TA -> dk(A) TA, TB -> dk(B) TB, with k, dk the two-point maps of :meth:`gram`
        at the variances diag(A) of the two entries; near-(anti)parallel entries of A (gap below
        ``walk.near``) from the gap map, with K12 from the gap as in :mod:`meanfield.gram`."""
        require_gaussian(self, s)
        pair, with_gap = walk.activation_maps(self)
        d = s.variances
        K1, K2 = d[:, :, None, None], d[None, None, :, :]
        A, TA = pair(K1, K2, s.A, s.TA)
        B, TB = pair(K1, K2, s.B, s.TB)
        G = None
        if s.G is not None and with_gap is not None:
            near = s.G < walk.near
            with np.errstate(all="ignore"):
                C = np.where(near, np.copysign(np.sqrt(K1 * K2 * (1 - s.G)), s.A), s.A)
                A_gap, TA_gap, G_gap = with_gap(K1, K2, C, s.TA, s.G)
            A = np.where(near, A_gap, A)
            if TA is not None:
                TA = np.where(near, TA_gap, TA)
            G = walk.settle(G_gap, A)
        J = None
        if s.J is not None:
            # through phi: E[phi'(h_p) phi'(h_q)] for the two positions of one input (the derivative map)
            C = s.same_input
            J = s.jacobian_times(pair(d[:, :, None], d[:, None, :], C, np.ones_like(C))[1])
        return replace(s, A=A, B=B, TA=TA, TB=TB, gaussian=False, G=G, J=J)

    @classmethod
    def from_torch_module(cls, module, value, where):
        """A torch activation module (the one table, :mod:`meanfield.torch.activations`)."""
        from ..torch.activations import read_module

        phi = read_module(module)
        return None if phi is None else cls.on_torch_value(phi, value, where)

    @classmethod
    def on_torch_value(cls, phi, value, where):
        """phi applied to ``value`` in a torch graph (module or function): a preactivation is needed."""
        if value.gaussian is False and value.layers:
            raise ValueError(f"{where}: activation {phi.name!r} acts on a value that is not a preactivation "
                             "(two element-wise maps without a Linear layer between them)")
        return cls(phi)

    def short(self, num=format_number):
        spec = activation_json(self.phi)
        if "expr" in spec:
            return f"act({self.phi!r})"
        params = [f"{k}={num(v)}" for k, v in spec.items() if k != "name"]
        return f"act({', '.join([repr(spec['name'])] + params)})"

    def to_json(self):
        return {"type": "ActivationLayer", **activation_json(self.phi)}

    @classmethod
    def from_json(cls, fields, path, read_tree):
        return cls(activation_from_json(fields))

    def torch_forward(self, z, ctx):
        """phi on the primal, phi'(h) t on the tangents (torch's own functions for the built-ins)."""
        import torch

        from ..torch import context as C

        phi, dphi = _torch_functions(self.phi)
        h = z[:, :, :1]
        if z.shape[2] == 1:
            if (C.FAST_ERF and type(self.phi) is Erf and h.dtype == torch.float32 and h.device.type == "cpu"
                    and h.is_contiguous() and C.is_plain(h)):
                # float32 on the CPU: a vectorised rational erf (0.54 ulp; torch's is 0.74 ulp and ~20 % slower)
                from ..torch._fused import erf32

                return torch.from_numpy(erf32(h.numpy()))
            return phi(h)
        out = torch.empty_like(z)
        out[:, :, :1] = phi(h)
        torch.mul(dphi(h), z[:, :, 1:], out=out[:, :, 1:])
        return out


@dataclass(frozen=True, repr=False)
class Scale(Primitive):
    """Multiplication by a scalar eps (LayerScale at initialisation, branch multipliers)."""

    eps: sp.Expr = S.eps

    def __post_init__(self):
        check_real("eps", self.eps)

    def forward(self, s):
        return s.to(self.eps**2 * s.K, self.eps**2 * s.K12, self.eps * s.mean, s.gaussian)

    def chi(self, s):
        return self.eps**2

    def gram(self, g):
        e2 = self.eps**2
        cen = None if g.centred is None else tuple(e2 * c for c in g.centred)
        return g.to(e2 * g.K1, e2 * g.K2, e2 * g.K12, e2 * g.T12, self.eps * g.m1, self.eps * g.m2, g.gaussian,
                    g.gap, cen)

    def gram_tokens(self, s, walk):
        """Over (image, token) pairs (:mod:`meanfield.gram.tokens`): every second moment times eps^2."""
        return s.scaled(walk.number(self.eps) ** 2)

    def short(self, num=format_number):
        return "scale()" if self.eps == S.eps else f"scale({num(self.eps)})"

    def torch_forward(self, z, ctx):
        """eps z (primal and tangents alike)."""
        from ..torch import context as C

        return z * C.param_view(ctx.value(self.eps))


def act(phi, **params) -> ActivationLayer:
    """phi applied element-wise: a registered name, a sympy expression or an Activation."""
    return ActivationLayer(make_activation(phi, **params))


def scale(eps=None) -> Scale:
    """Multiplication by eps: LayerScale (per-channel, initialised to eps) or a branch multiplier."""
    return Scale(parameter("eps", eps, S.eps))


@functools.lru_cache(maxsize=None)
def _torch_functions(phi: Activation) -> tuple:
    """(phi, phi') in torch, built once per activation (the one torch table, :mod:`meanfield.torch.activations`)."""
    from ..torch.activations import torch_activation

    return torch_activation(phi)


def activation_json(phi: Activation) -> dict:
    if isinstance(phi, ScaleInvariant) and phi.name in ("leaky_relu", "scale_invariant"):
        if phi.name == "leaky_relu":
            return {"name": "leaky_relu", "negative_slope": float(phi.a_minus)}
        return {"name": "scale_invariant", "a_plus": float(phi.a_plus), "a_minus": float(phi.a_minus)}
    if phi.name in ACTIVATIONS:
        try:
            if ACTIVATIONS[phi.name]() == phi:
                return {"name": phi.name}
        except TypeError:  # pragma: no cover - a factory that needs parameters
            pass
    return {"expr": sp.srepr(phi.expr), "name": phi.name}


def activation_from_json(d: dict) -> Activation:
    d = dict(d)
    if "expr" in d:
        try:
            # srepr (exact) and plain expressions in x both read back with sympify
            expr = sp.sympify(d["expr"], locals={"x": S.x})
        except (sp.SympifyError, SyntaxError, TypeError) as err:
            raise ValueError(f"activation expr {d['expr']!r} cannot be read: {err}") from None
        # the same route as act(expr): built-ins recognised, user expressions checked
        return user_activation(expr, name=d.get("name"))
    name = d.pop("name", None)
    if name is None:
        raise ValueError(f"an activation node needs 'name' or 'expr', got {d!r}")
    return make_activation(name, **d)
