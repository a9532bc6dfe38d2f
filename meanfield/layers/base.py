"""What every primitive is: the :class:`Primitive` interface, and the helpers its modules share.

A primitive is a frozen dataclass whose fields are its parameters (sympy
symbols the solvers scan, or numbers fixed in the tree). It holds, in its own
module of :mod:`meanfield.layers`, every rule about it:

=====================  =====================================================
``forward(s)``         the state map of one input and a pair (:class:`~.state.Signal`)
``chi(s)``             its factor of the APJN chi_J (partial-Jacobian eq. 14)
``chi_delta(s)``       its part of chi_Delta (activations only)
``gram(g)``            the map of two inputs of any norms with the NTK
                       (:class:`~.state.GramSignal`; :mod:`meanfield.gram`)
``gram_tokens(s, w)``  the map of a batch of images over their tokens
                       (:class:`~.state.TokenSignal`; :mod:`meanfield.gram.tokens`)
``short(num)``         the composition call that builds it (its repr and the
                       node names in error messages)
``to_json()``,         its JSON form (generic from the dataclass fields unless
``from_json(...)``     it overrides them)
``torch_forward``      its torch realisation on the Monte-Carlo layout
                       (:mod:`meanfield.torch.networks`; torch imported there,
                       on use)
``from_torch_module``  the torch module that means it, read by :func:`meanfield.torch.from_torch`
                       (a classmethod; ``torch_modules_read`` names the modules)
``children()``         the primitives it contains (combinators)
=====================  =====================================================
"""
from __future__ import annotations

import dataclasses

import sympy as sp

from .. import symbols as S
from .._validate import is_number

__all__ = ["Primitive", "NoScalarRecursion", "AXES", "short", "format_number", "format_exact", "parameter", "json_value",
           "value_from_json", "require_gaussian"]

#: what a layer mixes or normalises along: the features of an MLP, the tokens (token mixing) or the
#: Mixer's channels of one token
AXES = ("features", "tokens", "channels")


def format_number(v) -> str:
    """A node parameter for display: numbers as %g, symbols by name."""
    v = sp.sympify(v)
    return f"{float(v):g}" if not v.free_symbols else str(v)


def format_exact(v) -> str:
    """A node parameter as Python source: integers as ints, other numbers as repr(float)
    (17 significant digits at most, the float's exact round trip), symbols by name."""
    v = sp.sympify(v)
    if v.free_symbols:
        return str(v)
    return str(int(v)) if v.is_Integer else repr(float(v))


def short(node, num=format_number) -> str:
    """A node as the composition call that builds it: ``residual(rms_norm(), act('selu'), dense(), scale(0.5))``.

    ``num`` formats the numbers: :func:`format_number` (%g, for messages and
    names) or :func:`format_exact` (for ``repr``: with the composition
    functions in scope, ``eval`` of that text rebuilds the node, activations
    given by an expression excepted).
    """
    return "nothing" if node is None else node.short(num)


def require_gaussian(node, s):
    """ValueError unless the state ``s`` is a Gaussian preactivation (what ``node`` needs)."""
    if not s.gaussian:
        raise ValueError(f"{short(node)} needs a Gaussian preactivation as input; put a dense layer before it")


def parameter(name, value, default_symbol):
    """A node parameter: None -> the symbol; a string -> that symbol; a number -> sympy number."""
    if value is None:
        return default_symbol
    if isinstance(value, str):
        names = {"sigma_w": S.sigma_w, "sigma_b": S.sigma_b, "mu": S.mu, "eps": S.eps}
        if value not in names:
            raise ValueError(f"{name}={value!r}: a string must name a symbol ({', '.join(names)})")
        return names[value]
    if isinstance(value, sp.Basic):
        return value
    if not is_number(value):
        raise ValueError(f"{name} must be a finite real number, a symbol or None, got {value!r}")
    return sp.nsimplify(value) if float(value) == int(float(value)) else sp.Float(float(value))


def json_value(v):
    """A parameter in JSON: a number, or the expression's text (``"sigma_w"``)."""
    v = sp.sympify(v)
    if not v.free_symbols:
        return float(v) if not v.is_Integer else int(v)
    return str(v)


def value_from_json(name, v):
    """Inverse of :func:`json_value` (ValueError naming ``name`` for unknown symbols)."""
    if isinstance(v, str):
        loc = {n: getattr(S, n) for n in ("sigma_w", "sigma_b", "mu", "eps")}
        try:
            e = sp.sympify(v, locals=loc)
        except (sp.SympifyError, SyntaxError, TypeError):
            raise ValueError(f"{name}={v!r} is not an expression in sigma_w, sigma_b, mu, eps") from None
        extra = e.free_symbols - set(loc.values())
        if extra:
            raise ValueError(f"{name}={v!r} uses unknown symbols {sorted(map(str, extra))}")
        return e
    return parameter(name, v, None)


class NoScalarRecursion(ValueError):
    """A node that is valid in a tree but has no single-input recursion (its statistics differ across the
    positions of an input): the solvers refuse it with this error; :func:`meanfield.kernels` maps it."""


class Primitive:
    """A layer of the calculus: a state map and an APJN factor (see the module docstring).

    Subclasses are frozen dataclasses declared with ``repr=False``, so that
    they print as the call that builds them (the dataclass repr would nest
    whole activation objects and 30-digit sympy Floats).
    """

    elementwise = False  # needs a Dense layer after it for chi to factorise
    #: fresh zero-mean weights (Dense, Conv): what must follow an element-wise node and end a residual branch
    fresh_weights = False
    #: whether its output is a Gaussian preactivation (None: as its input), for readers of torch graphs
    output_gaussian = None
    #: the torch modules :meth:`from_torch_module` reads, for messages ("" if none)
    torch_modules_read = ""

    def forward(self, s):  # pragma: no cover - interface
        raise NotImplementedError

    def chi(self, s) -> sp.Expr:  # pragma: no cover - interface
        raise NotImplementedError

    def chi_delta(self, s) -> sp.Expr:
        """This primitive's part of chi_Delta (only activations have one)."""
        return sp.Integer(0)

    def gram(self, g):
        """The map of the two-input state with the NTK (:class:`~.state.GramSignal`); see :mod:`meanfield.gram`."""
        raise ValueError(f"{short(self)} has no Gram-matrix rule (two inputs of any norms)")

    def gram_tokens(self, s, walk):
        """The map of the token state over images (:class:`~.state.TokenSignal`; :mod:`meanfield.gram.tokens`),
        with ``walk`` the :class:`meanfield.gram.tokens.TokenWalk` that supplies parameter values and
        compiled numerics."""
        raise ValueError(f"{short(self)} has no Gram rule for token blocks (ResMLP / MLP-Mixer); rules exist for "
                         "dense (any axis), act, layer_norm over the channels, scale and residual")

    def children(self) -> tuple:
        """The primitives this one contains, in order (none for a leaf)."""
        return ()

    def primitives(self):
        """This node and every node below it, depth first."""
        yield self
        for child in self.children():
            yield from child.primitives()

    def short(self, num=format_number) -> str:
        """The composition call that builds this node (numbers formatted by ``num``)."""
        return type(self).__name__

    def __repr__(self) -> str:
        return self.short(format_exact)

    def to_json(self):
        """JSON-able data: ``{"type": class name, field: value, ...}`` from the dataclass fields."""
        out = {"type": type(self).__name__}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v if isinstance(v, str) else json_value(v)
        return out

    @classmethod
    def from_json(cls, fields: dict, path: str, read_tree):
        """Inverse of :meth:`to_json` (``fields`` without 'type'; ``read_tree`` reads a nested tree)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fields) - names
        if unknown:
            raise ValueError(f"{path}: {cls.__name__} has no field(s) {sorted(unknown)}; allowed: {sorted(names)}")
        return cls(**{k: (v if k == "axis" else value_from_json(f"{path}.{k}", v)) for k, v in fields.items()})

    def torch_forward(self, z, ctx, *parts):
        """The realisation on the (I, P, S, B, T, N) layout of :mod:`meanfield.torch.networks`:
        the primal in slot 0 of axis S, its exact tangents (JVPs) in the others; ``parts``: the
        realised :meth:`children`."""
        raise ValueError(f"no torch realisation for {short(self)}")

    @classmethod
    def from_torch_module(cls, module, value, where: str):
        """This primitive for a torch ``module`` met in a user's model, or None if it does not mean one.

        ``value``: what the module is applied to (``value.gaussian``: a
        preactivation; ``value.transposed``: tokens on the last axis);
        ValueError naming ``where`` when the module means this primitive but
        is not one of the theory (affine parameters away from initialisation,
        eval-mode statistics, ...).
        """
        return None
