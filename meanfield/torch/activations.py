r"""The one torch table of activations: phi, phi', and how torch spells them.

Every activation of :data:`meanfield.activations.ACTIVATIONS` has one row
here, and nothing else in the package maps activations to torch:

- :func:`torch_activation` gives (phi, phi') as element-wise torch functions
  for an :class:`~meanfield.activations.Activation` (the Monte-Carlo networks
  of :mod:`.networks`, the shaped activations of :mod:`.shaping`);
- :func:`torch_module` gives an ``nn.Module`` (the model zoo, the CLI);
- :func:`read_module` / :func:`read_function` turn a torch module or a
  ``torch.nn.functional`` call met by :func:`meanfield.from_torch` back into
  the Activation.

An activation the table does not name (a user's sympy expression) is
lambdified with sympy's torch printer, its derivative taken by sympy.
Adding a built-in activation is one registry entry in
``meanfield/activations.py`` and one row here
(``tests/test_torch_activations.py`` checks that every registered name has
a row and that phi and phi' agree with the sympy definition).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

from .. import symbols as S
from ..activations import ACTIVATIONS, Activation, activation

__all__ = ["TorchActivation", "TORCH_ACTIVATIONS", "torch_activation", "torch_module", "read_module",
           "read_function", "sympy_to_torch"]

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


@dataclass(frozen=True)
class TorchActivation:
    """One row: ``realise(phi) -> (f, f')`` and the torch spellings that mean this activation.

    ``read(kwargs)`` builds the meanfield Activation from the hyperparameters
    of a module or a functional call (e.g. ``{'negative_slope': 0.2}``), or
    raises ValueError for values the registry cannot represent.
    """

    name: str
    realise: Callable[[Activation], tuple]
    modules: tuple = ()
    functions: tuple = ()
    methods: tuple = ()
    read: Callable[[dict], Activation] | None = None
    module: Callable[[Activation], nn.Module] | None = None
    hyper: tuple = field(default=())  # names of the module attributes / call kwargs that ``read`` takes


def _fixed(f, df):
    return lambda phi: (f, df)


def _leaky(phi):
    ap, am = float(phi.a_plus), float(phi.a_minus)
    if (ap, am) == (1.0, 0.0):
        return torch.relu, lambda v: (v > 0).to(v.dtype)
    if (ap, am) == (1.0, 1.0):
        return (lambda v: v), torch.ones_like
    return (lambda v: torch.where(v >= 0, ap * v, am * v),
            lambda v: torch.where(v >= 0, torch.full_like(v, ap), torch.full_like(v, am)))


def _gelu_prime(v):
    return 0.5 * (1.0 + torch.special.erf(v / _SQRT2)) + v * torch.exp(-0.5 * v * v) * _INV_SQRT_2PI


def _silu_prime(v):
    s = torch.sigmoid(v)
    return s * (1.0 + v * (1.0 - s))


def _elu(phi):
    a, g = float(phi.alpha), float(phi.gain)
    if phi.name == "selu":
        f = F.selu
    else:
        def f(v):
            return F.elu(v, alpha=a)
    return f, lambda v: g * torch.where(v > 0, torch.ones_like(v), a * torch.exp(torch.clamp(v, max=0.0)))


def _softplus(v):
    return torch.logaddexp(v, torch.zeros((), dtype=v.dtype, device=v.device))


def _read_plain(name):
    return lambda kw: activation(name)


def _read_gelu(kw):
    approx = kw.get("approximate", "none")
    if approx == "none":
        return activation("gelu")
    if approx == "tanh":
        return activation("gelu_tanh")
    raise ValueError(f"GELU(approximate={approx!r}) is not a torch form; 'none' or 'tanh'")


def _read_softplus(kw):
    beta = float(kw.get("beta", 1.0))
    if beta != 1.0:
        return activation(sp.log(1 + sp.exp(beta * S.x)) / beta)
    # torch switches to x above `threshold` (20 by default): a change below 1e-8
    return activation("softplus")


def _read_hardtanh(kw):
    lo, hi = float(kw.get("min_val", -1.0)), float(kw.get("max_val", 1.0))
    if (lo, hi) != (-1.0, 1.0):
        return activation(sp.Piecewise((lo, S.x < lo), (S.x, S.x <= hi), (hi, True)))
    return activation("hardtanh")


def _rows():
    gelu_tanh = (lambda v: F.gelu(v, approximate="tanh"))
    rows = [
        TorchActivation("relu", _leaky, (nn.ReLU,), (torch.relu, F.relu), ("relu",), _read_plain("relu"),
                        lambda phi: nn.ReLU()),
        TorchActivation("leaky_relu", _leaky, (nn.LeakyReLU,), (F.leaky_relu,), (),
                        lambda kw: activation("leaky_relu", negative_slope=float(kw.get("negative_slope", 0.01))),
                        lambda phi: nn.LeakyReLU(float(phi.a_minus)), ("negative_slope",)),
        TorchActivation("linear", _leaky),
        TorchActivation("abs", _leaky, (), (torch.abs,), ("abs",), _read_plain("abs")),
        TorchActivation("scale_invariant", _leaky),
        TorchActivation("erf", _fixed(torch.special.erf, lambda v: _TWO_OVER_SQRT_PI * torch.exp(-v * v)), (),
                        (torch.erf, torch.special.erf), ("erf",), _read_plain("erf")),
        TorchActivation("gelu", _fixed(lambda v: F.gelu(v, approximate="none"), _gelu_prime), (nn.GELU,),
                        (F.gelu,), (), _read_gelu, lambda phi: nn.GELU(), ("approximate",)),
        TorchActivation("gelu_tanh", lambda phi: (gelu_tanh, sympy_to_torch(phi.derivative)), (), (), (), None,
                        lambda phi: nn.GELU(approximate="tanh")),
        TorchActivation("tanh", _fixed(torch.tanh, lambda v: 1.0 - torch.tanh(v) ** 2), (nn.Tanh,),
                        (torch.tanh, F.tanh), ("tanh",), _read_plain("tanh"), lambda phi: nn.Tanh()),
        TorchActivation("silu", _fixed(F.silu, _silu_prime), (nn.SiLU,), (F.silu,), (), _read_plain("silu"),
                        lambda phi: nn.SiLU()),
        TorchActivation("swish", _fixed(F.silu, _silu_prime), (), (), (), None, lambda phi: nn.SiLU()),
        TorchActivation("softplus", _fixed(_softplus, torch.sigmoid), (nn.Softplus,), (F.softplus,), (),
                        _read_softplus, lambda phi: nn.Softplus(), ("beta",)),
        TorchActivation("elu", _elu, (nn.ELU,), (F.elu,), (),
                        lambda kw: activation("elu", alpha=float(kw.get("alpha", 1.0))),
                        lambda phi: nn.ELU(float(phi.alpha)), ("alpha",)),
        TorchActivation("selu", _elu, (nn.SELU,), (F.selu, torch.selu), ("selu",), _read_plain("selu"),
                        lambda phi: nn.SELU()),
        TorchActivation("hardtanh", _fixed(F.hardtanh, lambda v: ((v > -1) & (v < 1)).to(v.dtype)),
                        (nn.Hardtanh,), (F.hardtanh,), (), _read_hardtanh, lambda phi: nn.Hardtanh(),
                        ("min_val", "max_val")),
    ]
    return {r.name: r for r in rows}


#: registry name -> :class:`TorchActivation`
TORCH_ACTIVATIONS: dict = _rows()

def _either(tfn, mfn):
    """A torch function that also takes the plain numbers sympy's printer leaves (sqrt(2), pi)."""
    return lambda v: tfn(v) if isinstance(v, torch.Tensor) else mfn(v)


_SYMPY_TORCH = {
    "exp": _either(torch.exp, math.exp), "log": _either(torch.log, math.log),
    "tanh": _either(torch.tanh, math.tanh), "erf": _either(torch.special.erf, math.erf),
    "erfc": _either(torch.special.erfc, math.erfc), "sqrt": _either(torch.sqrt, math.sqrt),
    "sin": _either(torch.sin, math.sin), "cos": _either(torch.cos, math.cos), "Abs": _either(torch.abs, abs),
    "atan": _either(torch.atan, math.atan), "asinh": _either(torch.asinh, math.asinh),
    "sinh": _either(torch.sinh, math.sinh), "cosh": _either(torch.cosh, math.cosh),
}


def sympy_to_torch(expr) -> Callable[[torch.Tensor], torch.Tensor]:
    """An element-wise torch function of x for a sympy expression in :data:`meanfield.symbols.x`."""
    f = sp.lambdify(S.x, expr, modules=[_SYMPY_TORCH, "torch"])

    def g(t):
        out = f(t)
        if not isinstance(out, torch.Tensor):  # a constant expression
            out = torch.full_like(t, float(out))
        return out

    return g


def _row_for(phi: Activation):
    """The table row of ``phi`` if phi *is* that built-in (not a user expression under its name)."""
    row = TORCH_ACTIVATIONS.get(phi.name)
    if row is None or phi.name not in ACTIVATIONS:
        return None
    try:
        registered = ACTIVATIONS[phi.name]()
    except TypeError:  # pragma: no cover
        registered = None
    params = {"leaky_relu", "scale_invariant", "elu"}
    if phi.name not in params and (registered is None or registered.expr != phi.expr):
        return None
    return row


def torch_activation(phi) -> tuple:
    """(phi, phi') as element-wise torch functions for an Activation (or a name / sympy expression).

    Built-ins use torch's own functions (exact GELU, torch.erf, F.selu...);
    any other expression is lambdified with sympy's torch printer, its
    derivative taken by sympy.
    """
    phi = activation(phi)
    row = _row_for(phi)
    if row is not None:
        return row.realise(phi)
    try:
        return sympy_to_torch(phi.expr), sympy_to_torch(phi.derivative)
    except Exception as err:  # pragma: no cover - sympy printer gaps
        raise ValueError(f"activation {phi.name!r} ({phi.expr}) cannot be translated to torch: {err}") from None


class _Elementwise(nn.Module):
    def __init__(self, phi: Activation):
        super().__init__()
        self.phi_spec = phi
        self.f = torch_activation(phi)[0]

    def forward(self, x):
        return self.f(x)

    def extra_repr(self):
        return f"{self.phi_spec.name}"


def torch_module(phi) -> nn.Module:
    """An ``nn.Module`` applying phi: torch's own module where there is one (nn.GELU, nn.SELU, ...)."""
    phi = activation(phi)
    row = _row_for(phi)
    if row is not None and row.module is not None:
        return row.module(phi)
    return _Elementwise(phi)


def read_module(m: nn.Module):
    """The meanfield Activation of a torch activation module, or None if it is not one."""
    if isinstance(m, _Elementwise):
        return m.phi_spec
    for row in TORCH_ACTIVATIONS.values():
        if row.modules and isinstance(m, row.modules) and row.read is not None:
            return row.read({k: getattr(m, k) for k in row.hyper if hasattr(m, k)})
    return None


def read_function(fn, kwargs: dict):
    """The meanfield Activation of a functional call ``fn(x, **kwargs)`` (or a method name), else None."""
    for row in TORCH_ACTIVATIONS.values():
        if row.read is None:
            continue
        if (callable(fn) and any(fn is f for f in row.functions)) or (isinstance(fn, str) and fn in row.methods):
            return row.read(kwargs)
    return None
