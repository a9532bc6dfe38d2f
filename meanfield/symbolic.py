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
from ._validate import check_finite_array, check_nonnegative, check_positive, check_real
from .calculus import Architecture, Signal, as_architecture
from .gaussian import numeric_expectations

__all__ = ["Recursion", "RecursionValues", "KernelSeries", "recursion", "lambdify"]


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
class RecursionValues:
    """Numeric values of a :class:`Recursion` (float64 arrays of one broadcast shape).

    ``kernel12`` is None unless K12 was given to :meth:`Recursion.evaluate`.
    """

    kernel: np.ndarray
    kernel12: np.ndarray | None
    chi_J: np.ndarray
    chi_K: np.ndarray
    chi_Delta: np.ndarray


_SUBS_NAMES = ("K", "K12", "sigma_w", "sigma_b", "mu", "eps")


def _check_symbol_value(name: str, value):
    if name in ("sigma_w", "sigma_b", "eps", "K"):
        check_real(name, value, minimum=0)
    elif name == "mu":
        check_real(name, value, minimum=0, maximum=1)
    elif name == "K12":
        check_real(name, value)


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

    #: the expressions a saved recursion holds (as text and LaTeX)
    _SAVED = ("kernel", "kernel12", "chi_J", "chi_K", "chi_Delta")

    def to_dict(self) -> dict:
        """The recursion as strict JSON data: each expression as text (``str``) and LaTeX
        (``NAME_latex``), the architecture as text and as its lossless spec (``spec``), so that
        :meth:`load` can rebuild it. ``meanfield recursion --json`` prints this."""
        from ._serialize import FORMAT_VERSION, encode

        data = {"meanfield_format": FORMAT_VERSION, "result": "Recursion", "architecture": str(self.architecture),
                "spec": encode(self.architecture), "state": [str(s) for s in self.state]}
        for name in self._SAVED:
            data[name] = str(getattr(self, name))
            data[name + "_latex"] = sp.latex(getattr(self, name))
        return data

    def save(self, path):
        """Write :meth:`to_dict` to ``path`` (JSON); returns the path."""
        import json
        from pathlib import Path

        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def load(cls, path) -> "Recursion":
        """The recursion of a file written by :meth:`save` (or ``meanfield recursion --json``).

        The expressions are derived again from the saved architecture (text is
        never evaluated) and compared with the saved text: ValueError if they
        differ (a file written by a meanfield or sympy that derives them
        otherwise) or if the file is not a saved recursion.
        """
        import json
        from pathlib import Path

        from ._serialize import FORMAT_VERSION, decode

        doc = json.loads(Path(path).read_text())
        if not isinstance(doc, dict) or doc.get("result") != "Recursion" or "spec" not in doc:
            raise ValueError(f"{path} is not a saved meanfield Recursion")
        if doc.get("meanfield_format", FORMAT_VERSION + 1) > FORMAT_VERSION:
            raise ValueError(f"{path} was written by a newer meanfield (format {doc.get('meanfield_format')})")
        rec = recursion(decode(doc["spec"]))
        differ = [n for n in cls._SAVED if doc.get(n) != str(getattr(rec, n))]
        if differ:
            raise ValueError(f"{path}: the saved {', '.join(differ)} differ from what this meanfield derives for "
                             f"{rec.architecture}")
        return rec

    @property
    def parameters(self) -> tuple:
        """Free parameter symbols (sigma_w, sigma_b, mu, eps) that appear."""
        exprs = (self.kernel, self.chi_J)
        return tuple(s for s in (S.sigma_w, S.sigma_b, S.mu, S.eps) if any(e.has(s) for e in exprs))

    def subs(self, values=None, **kw) -> "Recursion":
        """Substitute parameters, by symbol or by name: ``rec.subs(mu=1)``.

        Numeric values are checked: sigma_w, sigma_b, eps >= 0, mu in [0, 1],
        K >= 0, all finite (ValueError naming the argument otherwise).
        """
        values = dict(values or {})
        for k, v in kw.items():
            if k not in _SUBS_NAMES:
                raise ValueError(f"unknown recursion symbol {k!r}; allowed: {', '.join(_SUBS_NAMES)}")
            values[getattr(S, k)] = v
        for sym, v in values.items():
            _check_symbol_value(str(sym), v)
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
        if not isinstance(order, (int, np.integer)) or isinstance(order, bool) or order < 1:
            raise ValueError(f"order must be an integer >= 1, got {order!r}")
        check_real("K_star", K_star, minimum=0)
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

    # -- numbers --------------------------------------------------------------
    def evaluate(self, K, sigma_w, sigma_b, K12=None, *, mu=None, eps=None) -> "RecursionValues":
        """The recursions at numeric points, as float64 arrays (broadcasting).

        Parameters
        ----------
        K : array_like
            Kernel of the block input, finite and > 0.
        sigma_w, sigma_b : array_like
            Weight and bias scales, finite and >= 0.
        K12 : array_like, optional
            Cross-covariance of a second input of the same norm, |K12| <= K.
            Required when the block needs it (BatchNorm, see :attr:`state`);
            when given, :attr:`RecursionValues.kernel12` is computed too.
        mu, eps : float, optional
            Residual strength in [0, 1] and LayerScale >= 0; default: the
            architecture's values.

        Unevaluated Gaussian expectations (activations without closed forms)
        are computed by the exp-sinh quadrature (:func:`lambdify`). The
        compiled functions are cached on the Recursion.
        """
        Kv = check_positive("K", K)
        sw = check_nonnegative("sigma_w", sigma_w)
        sb = check_nonnegative("sigma_b", sigma_b)
        if K12 is None:
            if S.K12 in self.state:
                raise ValueError(f"K12 is required: the recursion of {self.architecture} depends on the "
                                 "cross-covariance K12 of two inputs (pass |K12| <= K)")
            K12v = np.zeros(())
        else:
            K12v = check_finite_array("K12", K12)
            with np.errstate(invalid="ignore"):
                if np.any(np.abs(K12v) > Kv * (1 + 1e-12)):
                    raise ValueError(f"K12 must satisfy |K12| <= K (two inputs of the same norm), got {K12!r}")
        params = self.architecture.parameters()
        muv = params.get(S.mu, np.nan) if mu is None else mu
        epsv = params.get(S.eps, np.nan) if eps is None else eps
        exprs = (self.kernel, self.kernel12, self.chi_J, self.chi_K, self.chi_Delta)
        if mu is not None or any(e.has(S.mu) for e in exprs):
            if np.isnan(muv):
                raise ValueError(f"mu is required: {self.architecture} has no residual strength set")
            muv = check_nonnegative("mu", muv)
            if np.any(muv > 1):
                raise ValueError(f"mu must be a number in [0, 1], got {mu!r}")
        if eps is not None or any(e.has(S.eps) for e in exprs):
            if np.isnan(epsv):
                raise ValueError(f"eps is required: {self.architecture} has no LayerScale set")
            epsv = check_nonnegative("eps", epsv)
        f = self.__dict__.get("_compiled")
        if f is None:
            f = lambdify(("K", "K12", "sigma_w", "sigma_b", "mu", "eps"), list(exprs))
            object.__setattr__(self, "_compiled", f)
        with np.errstate(divide="ignore"):
            vals = f(Kv, K12v, sw, sb, muv, epsv)
        shape = np.broadcast_shapes(*(np.shape(a) for a in (Kv, K12v, sw, sb, muv, epsv)))
        kernel, kernel12, chi_J, chi_K, chi_Delta = (
            np.array(np.broadcast_to(np.asarray(v, dtype=np.float64), shape)) for v in vals)
        return RecursionValues(kernel, None if K12 is None else kernel12, chi_J, chi_K, chi_Delta)

    # -- display --------------------------------------------------------------
    def latex(self) -> str:
        """The recursions as a LaTeX ``aligned`` block (K^l as \\mathcal{K}^{l}, eps as \\epsilon)."""
        names = {S.K: r"\mathcal{K}^{l}", S.K12: r"\mathcal{K}_{12}^{l}", S.eps: r"\epsilon"}

        def tex(e):
            return sp.latex(e, symbol_names=names)

        lines = [r"\mathcal{K}^{l+1} &= " + tex(self.kernel), r"\chi_{\mathcal{J}}^{l} &= " + tex(self.chi_J)]
        if S.K12 in self.state:
            lines.insert(1, r"\mathcal{K}_{12}^{l+1} &= " + tex(self.kernel12))
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
    s_in = Signal.input(arch.pair_axis)
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
def lambdify(args, expr):
    """A numpy function of ``args`` computing ``expr`` (float64, broadcasting).

    Unevaluated Gaussian expectations become calls to the exp-sinh quadrature
    of :mod:`meanfield.gaussian`. ``args`` are symbols or their names;
    ``expr`` may be one expression or a list/tuple of them (the function then
    returns a list).
    """
    args = [getattr(S, a) if isinstance(a, str) else a for a in args]
    several = isinstance(expr, (list, tuple))
    exprs, namespace = numeric_expectations(list(expr) if several else [expr])
    raw = sp.lambdify(args, exprs, modules=[namespace, "numpy", "scipy"])

    def evaluate(*values):
        # an expression that does not depend on every argument (a constant,
        # say) still returns an array of the broadcast shape
        shape = np.broadcast_shapes(*(np.shape(v) for v in values))
        outs = [np.broadcast_to(np.asarray(o, dtype=np.float64), shape).copy() for o in raw(*values)]
        outs = [o[()] if o.ndim == 0 else o for o in outs]
        return outs if several else outs[0]

    evaluate.__doc__ = f"numpy function of ({', '.join(map(str, args))})"
    return evaluate
