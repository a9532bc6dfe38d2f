"""Composition: layers in order (:func:`serial`) and the skip connection (:func:`residual`).

A serial's chi_J is the product of its layers' factors (the fresh weights of
a Dense layer decorrelate what follows from what precedes, partial-Jacobian
Theorem 2.5); a residual block h -> branch(h) + mu h adds mu^2 to the branch's
(eqs. 56-60, appendix E), its cross terms vanishing because the branch ends
in zero-mean weights.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

import sympy as sp

from .. import symbols as S
from .._validate import check_real
from ..gap import sum_gap
from .base import Primitive, format_number, json_value, parameter, short, value_from_json
from .elementwise import Scale
from .state import GramSignal

__all__ = ["Chain", "Residual", "serial", "residual"]


@dataclass(frozen=True, repr=False)
class Chain(Primitive):
    """Primitives applied in order; chi is the product of their factors."""

    layers: Tuple[Primitive, ...]

    def __post_init__(self):
        flat = tuple(self.layers)
        object.__setattr__(self, "layers", flat)
        if not flat:
            raise ValueError("a Chain needs at least one layer")
        for i, p in enumerate(flat):
            if not isinstance(p, Primitive):
                raise ValueError(f"layer {i} of a Chain is {p!r}, not a primitive (dense(), act(...), ...)")
            if p.elementwise and not any(q.fresh_weights for q in flat[i + 1:]):
                raise ValueError(
                    f"{short(p)} at position {i} of serial({', '.join(short(q) for q in flat)}) is not followed "
                    "by a dense layer in its block; the APJN only factorises when fresh weights follow "
                    "element-wise maps")

    def _states(self, s):
        states = [s]
        for p in self.layers:
            states.append(p.forward(states[-1]))
        return states

    def forward(self, s):
        return self._states(s)[-1]

    def chi(self, s):
        states = self._states(s)
        return sp.Mul(*[p.chi(st) for p, st in zip(self.layers, states)])

    def gram(self, g):
        for p in self.layers:
            g = p.gram(g)
        return g

    def gram_tokens(self, s, walk):
        for p in self.layers:
            s = p.gram_tokens(s, walk)
        return s

    def chi_delta(self, s):
        # chi_Delta replaces, one activation at a time, its E[phi'^2] factor by
        # E[phi''^2 + phi' phi''']: the first-order variation of chi (Lemma D.1).
        states = self._states(s)
        factors = [p.chi(st) for p, st in zip(self.layers, states)]
        total = sp.Integer(0)
        for i, (p, st) in enumerate(zip(self.layers, states)):
            d = p.chi_delta(st)
            if d != 0:
                total += sp.Mul(*factors[:i], d, *factors[i + 1:])
        return total

    def children(self):
        return self.layers

    def primitives(self):
        # a serial is not a node of its own: its layers are
        for p in self.layers:
            yield from p.primitives()

    def short(self, num=format_number):
        if len(self.layers) == 1:
            return self.layers[0].short(num)
        return "serial(" + ", ".join(p.short(num) for p in self.layers) + ")"

    def to_json(self):
        return [p.to_json() for p in self.layers]

    def torch_forward(self, z, ctx, *parts):
        """The realised layers in order."""
        for layer in parts:
            z = layer(z, ctx)
        return z


@dataclass(frozen=True, repr=False)
class Residual(Primitive):
    """h -> branch(h) + mu h (eqs. 56-60); the branch must end in a Dense layer."""

    branch: Chain
    mu: sp.Expr = S.mu

    def __post_init__(self):
        branch = self.branch if isinstance(self.branch, Chain) else Chain((self.branch,))
        object.__setattr__(self, "branch", branch)
        check_real("mu", self.mu, minimum=0, maximum=1)
        # the skip's cross terms E[branch(h) h] vanish only when the branch ends in
        # fresh zero-mean weights (a Scale after them keeps the mean zero)
        tail = [p for p in branch.layers if not isinstance(p, Scale)]
        if not tail or not (branch.layers[-1].fresh_weights or isinstance(branch.layers[-1], Scale)) \
                or not tail[-1].fresh_weights:
            last = branch.layers[-1] if branch.layers else None
            raise ValueError(f"Residual(mu={self.mu}): its branch ends in {short(last)}, not in zero-mean weights; "
                             "end the branch with a dense layer (optionally followed by a scale), so that "
                             "branch(h) is uncorrelated with the skip h")

    def forward(self, s):
        out = self.branch.forward(s)
        return s.to(out.K + self.mu**2 * s.K, out.K12 + self.mu**2 * s.K12)

    def chi(self, s):
        return self.branch.chi(s) + self.mu**2

    def chi_delta(self, s):
        return self.branch.chi_delta(s)

    def gram(self, g):
        return self.combine(self.branch.gram(g), g)

    def combine(self, out: "GramSignal", g: "GramSignal") -> "GramSignal":
        """The block's output from the branch's output ``out`` and the skip's input ``g``.

        The branch ends in fresh zero-mean weights: no cross terms with the
        skip, in K or in Theta. (Split from :meth:`gram` so that a branch
        mapped over a whole batch, with BatchNorm, reuses the rule.)
        """
        m2 = self.mu**2
        gap = None
        if out.gap is not None and g.gap is not None:
            gap = sum_gap(out.K1, out.K2, out.rho, out.gap, m2 * g.K1, m2 * g.K2, g.rho, g.gap)
        return g.to(out.K1 + m2 * g.K1, out.K2 + m2 * g.K2, out.K12 + m2 * g.K12, out.T12 + m2 * g.T12, gap=gap)

    def gram_tokens(self, s, walk):
        """Over (image, token) pairs: branch + mu^2 skip in A, B, TA, TB (no cross terms, as in :meth:`combine`)."""
        out = self.branch.gram_tokens(s, walk)
        m2 = walk.number(self.mu) ** 2
        G = None
        if out.G is not None and s.G is not None:
            G = out.G if m2 == 0 else walk.sum_gap(out.A, out.G, m2 * s.A, s.G)
        return replace(s, A=out.A + m2 * s.A, B=out.B + m2 * s.B, TA=None if s.TA is None else out.TA + m2 * s.TA,
                       J=None if s.J is None else out.J + m2 * s.J,
                       TB=None if s.TB is None else out.TB + m2 * s.TB, gaussian=True, G=G)

    def children(self):
        return (self.branch,)

    def short(self, num=format_number):
        mu = "" if self.mu == S.mu else f", mu={num(self.mu)}"
        return "residual(" + ", ".join(p.short(num) for p in self.branch.layers) + mu + ")"

    def to_json(self):
        return {"type": "Residual", "mu": json_value(self.mu), "branch": self.branch.to_json()}

    @classmethod
    def from_json(cls, fields, path, read_tree):
        return cls(read_tree(fields.get("branch", []), f"{path}.branch"), value_from_json(f"{path}.mu", fields.get("mu", "mu")))

    def torch_forward(self, z, ctx, branch):
        """branch(z) + mu z (the same linear map on the tangents)."""
        from ..torch import context as C

        return branch(z, ctx) + C.param_view(ctx.value(self.mu)) * z


def serial(*layers) -> Chain:
    """Layers applied in order (nested serials are flattened); chi is the product of the factors."""
    flat = []
    for p in layers:
        if isinstance(p, (list, tuple)):
            p = serial(*p)
        flat.extend(p.layers if isinstance(p, Chain) else [p])
    return Chain(tuple(flat))


def residual(*branch, mu=None) -> Residual:
    """h -> branch(h) + mu h; the branch must end in a dense layer (or a scale after one).

    ``mu`` defaults to the symbol mu (its value then comes from
    ``Network(..., mu=...)``); a number fixes it in the tree.
    """
    return Residual(serial(*branch), parameter("mu", mu, S.mu))
