r"""Symbolic layer: derive a block's infinite-width recursions with sympy.

:func:`recursion` pushes the symbolic input state (K, K12) through the block
of an :class:`~meanfield.calculus.Architecture` and returns a
:class:`Recursion` holding

- ``kernel``   K^{l+1} as a function of K^l (eq. 9 and its variants),
- ``kernel12`` the cross-covariance map K12^{l+1}(K, K12) of two equal-norm
  inputs (for BatchNorm it feeds back into ``kernel`` and ``chi_J``),
- ``chi_J``    the APJN factor J^{l,l+1} (eq. 11 and variants),
- ``chi_K``    dK^{l+1}/dK^l (eq. 12),
- ``chi_Delta`` the finite-width coefficient (Definition D.2),

all in the symbols of :mod:`meanfield.symbols`. :meth:`Recursion.series`
expands them at a fixed point (appendix G): dK^{l+1} = dK - c_n dK^n,
chi_J = 1 - d_1 dK, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import sympy as sp

from . import symbols as S
from .calculus import Architecture, Signal, as_architecture
from .gaussian import GaussianExpectation, GaussianExpectation2, expect, expect2

__all__ = ["Recursion", "KernelSeries", "recursion", "lambdify"]


@dataclass(frozen=True)
class KernelSeries:
    r"""Expansion of the recursions about a fixed point K* (appendix G).

    dK^{l+1} = sum_n a_n dK^n and chi_J = sum_n b_n dK^n with dK = K - K*.
    In the paper's convention (critical point: a_1 = 1, b_0 = 1)
    dK^{l+1} = dK - c_n dK^n and chi_J = 1 - d_1 dK, so c_n = -a_n (n >= 2)
    and d_1 = -b_1.
    """

    K_star: sp.Expr
    kernel_coefficients: tuple  # a_0 = F(K*) - K*, a_1 = chi_K*, a_2, ...
    chi_J_coefficients: tuple   # b_0 = chi_J*, b_1, ...

    @property
    def chi_K(self):
        return self.kernel_coefficients[1]

    @property
    def chi_J(self):
        return self.chi_J_coefficients[0]

    def c(self, n: int):
        """c_n = -a_n of dK' = dK - c_n dK^n (n >= 2)."""
        return -self.kernel_coefficients[n]

    @property
    def d1(self):
        return -self.chi_J_coefficients[1]

    @property
    def leading_order(self) -> int | None:
        """Smallest n >= 2 with c_n != 0 (None if all computed c_n vanish)."""
        for n in range(2, len(self.kernel_coefficients)):
            if sp.simplify(self.kernel_coefficients[n]) != 0:
                return n
        return None


@dataclass(frozen=True)
class Recursion:
    """Infinite-width recursions of one block, as sympy expressions.

    Attributes are expressions in ``K`` (and ``K12`` where the block needs a
    second input), ``sigma_w``, ``sigma_b``, ``mu`` and ``eps``; see
    :mod:`meanfield.symbols`. Prints as LaTeX in notebooks.
    """

    architecture: Architecture
    kernel: sp.Expr
    kernel12: sp.Expr
    chi_J: sp.Expr
    chi_K: sp.Expr
    chi_Delta: sp.Expr

    @property
    def state(self) -> tuple:
        """The state symbols: ('K',) or ('K', 'K12') when K12 feeds back (BatchNorm)."""
        pair = self.kernel.has(S.K12) or self.chi_J.has(S.K12)
        return (S.K, S.K12) if pair else (S.K,)

    @property
    def parameters(self) -> tuple:
        """Free parameter symbols (sigma_w, sigma_b, mu, eps) that appear."""
        exprs = (self.kernel, self.chi_J)
        return tuple(s for s in (S.sigma_w, S.sigma_b, S.mu, S.eps) if any(e.has(s) for e in exprs))

    def subs(self, values=None, **kw) -> "Recursion":
        """Substitute parameters, by symbol or by name: ``rec.subs(mu=1)``."""
        values = dict(values or {})
        values.update({getattr(S, k): v for k, v in kw.items()})
        return Recursion(self.architecture, *(sp.sympify(e).subs(values) for e in
                                              (self.kernel, self.kernel12, self.chi_J, self.chi_K,
                                               self.chi_Delta)))

    def series(self, K_star, order: int = 3, **params) -> KernelSeries:
        """Taylor coefficients of the kernel map and chi_J at K = K_star.

        ``params`` fixes sigma_w, sigma_b, mu, eps (by name); pass exact
        sympy numbers (``sympy.sqrt(sympy.pi)/2``) for exact coefficients.
        Only for single-input states (not BatchNorm).
        """
        if S.K12 in self.state:
            raise ValueError("series expansion is defined for one-input recursions; this block needs K12")
        rec = self.subs(**params)
        K_star = sp.sympify(K_star)
        d = sp.Symbol("dK")
        F = rec.kernel.subs(S.K, K_star + d)
        X = rec.chi_J.subs(S.K, K_star + d)
        a = [sp.simplify(F.subs(d, 0) - K_star)]
        b = [sp.simplify(X.subs(d, 0))]
        for n in range(1, order + 1):
            a.append(sp.simplify(sp.diff(F, d, n).subs(d, 0) / sp.factorial(n)))
            b.append(sp.simplify(sp.diff(X, d, n).subs(d, 0) / sp.factorial(n)))
        return KernelSeries(K_star, tuple(a), tuple(b))

    # -- display --------------------------------------------------------------
    def latex(self) -> str:
        """The recursions as a LaTeX ``aligned`` block."""
        lines = [
            r"\mathcal{K}^{l+1} &= " + sp.latex(self.kernel.subs(S.K, sp.Symbol(r"\mathcal{K}^{l}"))),
            r"\chi_{\mathcal{J}}^{l} &= " + sp.latex(self.chi_J.subs(S.K, sp.Symbol(r"\mathcal{K}^{l}"))),
        ]
        if S.K12 in self.state:
            lines.insert(1, r"\mathcal{K}_{12}^{l+1} &= " + sp.latex(self.kernel12))
        return r"\begin{aligned}" + r" \\ ".join(lines) + r"\end{aligned}"

    def _repr_latex_(self):
        return "$" + self.latex() + "$"

    def __str__(self):
        out = [f"Recursion for {self.architecture}:",
               f"  K^(l+1)   = {self.kernel}"]
        if S.K12 in self.state:
            out.append(f"  K12^(l+1) = {self.kernel12}")
        out += [f"  chi_J     = {self.chi_J}", f"  chi_K     = {self.chi_K}"]
        return "\n".join(out)

    def __repr__(self):
        return f"<Recursion {self.architecture}: state={tuple(map(str, self.state))}>"


@lru_cache(maxsize=256)
def _recursion(arch: Architecture) -> Recursion:
    block = arch.block_spec()
    s_in = Signal.input()
    out = block.forward(s_in)
    chi_J = block.chi(s_in)
    return Recursion(arch, out.K, out.K12, chi_J, sp.diff(out.K, S.K), block.chi_delta(s_in))


def recursion(arch=None, **kwargs) -> Recursion:
    """The infinite-width recursions of ``arch`` (or of the architecture keywords).

    >>> import meanfield as mf
    >>> rec = mf.recursion(activation="erf")
    >>> rec.chi_J
    4*sigma_w**2/(pi*sqrt(4*K + 1))
    """
    return _recursion(as_architecture(arch, **kwargs))


# ---------------------------------------------------------------------------
# Numeric evaluation.
# ---------------------------------------------------------------------------
def _numeric_expect(f, K):
    return expect(f, K)


def _numeric_expect2(f, K1, K2, K12):
    return expect2(f, K1, K2, K12)


_NUMPY_MODULES = [
    {"GaussianExpectation": _numeric_expect, "GaussianExpectation2": _numeric_expect2},
    "numpy",
    "scipy",
]


def lambdify(args, expr):
    """A numpy function of ``args`` computing ``expr`` (float64, broadcasting).

    Unevaluated Gaussian expectations become calls to the exp-sinh quadrature
    of :mod:`meanfield.gaussian`. ``args`` are symbols or their names.
    """
    args = [getattr(S, a) if isinstance(a, str) else a for a in args]
    return sp.lambdify(args, expr, modules=_NUMPY_MODULES)
