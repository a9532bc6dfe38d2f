"""Composition: layers in order (:func:`serial`) and the skip connection (:func:`residual`).

A serial's chi_J is the product of its layers' factors (the fresh weights of
a Dense layer decorrelate what follows from what precedes, partial-Jacobian
Theorem 2.5); a residual block h -> branch(h) + mu h adds mu^2 to the branch's
(eqs. 56-60, appendix E), its cross terms vanishing because the branch ends
in zero-mean weights.
"""
from __future__ import annotations

import math
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
    """h -> branch(h) + mu shortcut(h) (eqs. 56-60); the branch must end in a Dense layer.

    ``shortcut`` None is the identity skip. A shortcut tree is the projection
    of a ResNet's first block in a stage (He et al. 2016, "Identity mappings in
    deep residual networks", option (B): a strided 1 x 1 convolution, after
    the pre-activation the branch also starts with): it changes the positions
    (and, in torch, the channels) as the branch does. Its output must be a
    Gaussian preactivation; the cross terms with the branch still vanish,
    because the branch ends in its own fresh zero-mean weights, so every
    second moment (K, K12, the NTK, the Jacobian between positions) and the
    APJN factor add: branch + mu^2 shortcut.
    """

    branch: Chain
    mu: sp.Expr = S.mu
    shortcut: Chain | None = None

    def __post_init__(self):
        branch = self.branch if isinstance(self.branch, Chain) else Chain((self.branch,))
        object.__setattr__(self, "branch", branch)
        if self.shortcut is not None and not isinstance(self.shortcut, Chain):
            object.__setattr__(self, "shortcut", Chain((self.shortcut,)))
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
        down_b, down_s = _downsampling(branch), _downsampling(self.shortcut)
        if down_b != down_s:
            hint = (f"; give the skip a shortcut with that stride (shortcut=conv((1, 1), stride={down_b}) on an "
                    f"image, conv(1, stride={down_b}) on a sequence)" if self.shortcut is None else "")
            raise ValueError(f"Residual(mu={self.mu}): the branch strides the positions by {down_b} and the "
                             f"{'skip' if self.shortcut is None else 'shortcut'} by {down_s}; the two summands "
                             f"must have the same positions{hint}")

    def _skip(self, s, rule: str, *args):
        """The skip's state: the input itself, or the shortcut's map of it (by ``rule``: forward, gram, ...)."""
        if self.shortcut is None:
            return s
        out = getattr(self.shortcut, rule)(s, *args)
        if not out.gaussian:
            raise ValueError(f"the shortcut {short(self.shortcut)} does not end in a Gaussian preactivation; end "
                             "it with fresh weights (a dense layer or a convolution), optionally normalised")
        return out

    def forward(self, s):
        out, skip = self.branch.forward(s), self._skip(s, "forward")
        return s.to(out.K + self.mu**2 * skip.K, out.K12 + self.mu**2 * skip.K12)

    def chi(self, s):
        return self.branch.chi(s) + self.mu**2 * (1 if self.shortcut is None else self.shortcut.chi(s))

    def chi_delta(self, s):
        # first-order variations add like the factors (the shortcut's is 0 unless it holds an activation)
        sc = 0 if self.shortcut is None else self.mu**2 * self.shortcut.chi_delta(s)
        return self.branch.chi_delta(s) + sc

    def gram(self, g):
        return self.combine(self.branch.gram(g), self._skip(g, "gram"))

    def combine(self, out: "GramSignal", g: "GramSignal") -> "GramSignal":
        """The block's output from the branch's output ``out`` and the skip's ``g`` (the input, or the
        shortcut's output).

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
        """Over (image, token) pairs: branch + mu^2 skip in A, B, TA, TB and the Jacobian J (no cross terms, as
        in :meth:`combine`); the skip is the shortcut's map of ``s`` when there is one."""
        out, skip = self.branch.gram_tokens(s, walk), self._skip(s, "gram_tokens", walk)
        if out.A.shape != skip.A.shape:
            raise ValueError(f"{self.short()}: the branch maps the positions {s.grid or s.A.shape[1]} to "
                             f"{out.grid or out.A.shape[1]}, the skip to {skip.grid or skip.A.shape[1]}; the two "
                             "summands must have the same positions")
        m2 = walk.number(self.mu) ** 2
        G = None
        if out.G is not None and skip.G is not None:
            G = out.G if m2 == 0 else walk.sum_gap(out.A, out.G, m2 * skip.A, skip.G)

        def add(a, b):
            return None if b is None else a + m2 * b

        return replace(skip, A=add(out.A, skip.A), B=add(out.B, skip.B), TA=add(out.TA, skip.TA),
                       J=add(out.J, skip.J), TB=add(out.TB, skip.TB), gaussian=True, G=G)

    def children(self):
        return (self.branch,) if self.shortcut is None else (self.branch, self.shortcut)

    def short(self, num=format_number):
        mu = "" if self.mu == S.mu else f", mu={num(self.mu)}"
        sc = "" if self.shortcut is None else f", shortcut={self.shortcut.short(num)}"
        return "residual(" + ", ".join(p.short(num) for p in self.branch.layers) + sc + mu + ")"

    def to_json(self):
        out = {"type": "Residual", "mu": json_value(self.mu), "branch": self.branch.to_json()}
        if self.shortcut is not None:
            out["shortcut"] = self.shortcut.to_json()
        return out

    @classmethod
    def from_json(cls, fields, path, read_tree):
        unknown = set(fields) - {"mu", "branch", "shortcut"}
        if unknown:
            raise ValueError(f"{path}: Residual has no field(s) {sorted(unknown)}; allowed: ['branch', 'mu', "
                             "'shortcut']")
        sc = fields.get("shortcut")
        return cls(read_tree(fields.get("branch", []), f"{path}.branch"),
                   value_from_json(f"{path}.mu", fields.get("mu", "mu")),
                   None if sc is None else read_tree(sc, f"{path}.shortcut"))

    def torch_forward(self, z, ctx, branch, shortcut=None):
        """branch(z) + mu z, or + mu shortcut(z) (the same linear map on the tangents). The shortcut starts
        from the positions' shape the branch started from (``ctx.grid``, which the branch's strides update)."""
        from ..torch import context as C

        grid = getattr(ctx, "grid", None)
        out = branch(z, ctx)
        if shortcut is not None:
            after = getattr(ctx, "grid", None)
            if hasattr(ctx, "grid"):
                ctx.grid = grid
            z = shortcut(z, ctx)
            if getattr(ctx, "grid", None) != after:
                raise ValueError(f"{self.short()}: the branch maps the positions {grid} to {after}, the shortcut "
                                 f"to {getattr(ctx, 'grid', None)}")
        if out.shape != z.shape:
            raise ValueError(f"{self.short()}: the branch's output has shape {tuple(out.shape)}, the skip's "
                             f"{tuple(z.shape)} (layout (I, P, S, B, T, N)); the summands must match")
        return out + C.param_view(ctx.value(self.mu)) * z


def _downsampling(node) -> int:
    """The factor by which a tree strides its positions (its layers' strides multiplied; 1 for None)."""
    if node is None:
        return 1
    if isinstance(node, Chain):
        return math.prod(_downsampling(p) for p in node.layers)
    if isinstance(node, Residual):
        return _downsampling(node.branch)
    return int(getattr(node, "step", None) or getattr(node, "stride", None) or 1)


def serial(*layers) -> Chain:
    """Layers applied in order (nested serials are flattened); chi is the product of the factors."""
    flat = []
    for p in layers:
        if isinstance(p, (list, tuple)):
            p = serial(*p)
        flat.extend(p.layers if isinstance(p, Chain) else [p])
    return Chain(tuple(flat))


def residual(*branch, mu=None, shortcut=None) -> Residual:
    """h -> branch(h) + mu h, or + mu shortcut(h); the branch must end in a dense layer (or a scale after one).

    ``mu`` defaults to the symbol mu (its value then comes from
    ``Network(..., mu=...)``); a number fixes it in the tree. ``shortcut``: a
    primitive or a sequence of them (a serial), the projection of a ResNet
    stage's first block, e.g. ``shortcut=conv((1, 1), stride=2)``; None, the
    identity.
    """
    if isinstance(shortcut, (list, tuple)):
        shortcut = serial(*shortcut)
    return Residual(serial(*branch), parameter("mu", mu, S.mu), shortcut)
