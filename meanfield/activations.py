r"""Activations as data: a sympy definition and the Gaussian moments mean-field theory needs.

Every :class:`Activation` answers, as sympy expressions in the variances it is
given (h ~ N(0, K); (u, v) a zero-mean Gaussian pair with Var u = K1,
Var v = K2, Cov(u, v) = K12):

=============================  =====================================
method                         quantity
=============================  =====================================
``second_moment(K)``           E[phi(h)^2]
``derivative_second_moment``   E[phi'(h)^2]
``mean(K)``                    E[phi(h)]
``kernel(K1, K2, K12)``        E[phi(u) phi(v)]   (NNGP two-point kernel)
``derivative_kernel(...)``     E[phi'(u) phi'(v)]
``chi_delta_moment(K)``        E[phi''(h)^2 + phi'(h) phi'''(h)]
=============================  =====================================

Closed forms exist for the scale-invariant family a_+ x Theta(x) + a_- x Theta(-x)
(ReLU, leaky ReLU, linear, |x|), erf and exact GELU; every other activation
(tanh, SiLU, softplus, a user's sympy expression) returns unevaluated
:class:`~meanfield.gaussian.GaussianExpectation` objects, computed by
quadrature when numbers are needed.

``chi_delta_moment`` is taken in the weak sense through Price's theorem,
E[phi''^2 + phi' phi'''] = 1/2 E[(phi'^2)''] = d/dK E[phi'(h)^2], which is the
form in which it enters Lemma D.1 of the partial-Jacobian paper (it comes from
integrating by parts over a first-layer weight). For ReLU-like activations the
pointwise expression contains delta(x)^2, but the weak form is finite: 0.

Sources: partial-Jacobian paper (Doshi, He, Gromov), appendices I (scale
invariant, eqs. 95, 99, 108), J (erf, eqs. 120-123), K (GELU, eqs. 151-154,
172). The two-point forms are the arc-cosine kernel (Cho & Saul 2009), the
arcsine kernel (Williams 1997) and, for GELU, a derivation by Gaussian
integration by parts written out in :meth:`Gelu.kernel` (cf. Tsuchida et al.
2021). All are checked against mpmath quadrature in tests/test_activations.py.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable

import sympy as sp

from . import _names
from ._validate import check_real, numeric_value
from .gap import positive, sum_gap
from .gaussian import GaussianExpectation, GaussianExpectation2, numpy_function
from .symbols import x

__all__ = [
    "Activation",
    "ScaleInvariant",
    "Erf",
    "Gelu",
    "UserActivation",
    "user_activation",
    "parse_activation",
    "Elu",
    "HardTanh",
    "ACTIVATIONS",
    "activation",
    "available_activations",
]

_y = sp.Symbol("y")
_pi = sp.pi


class pair_det(sp.Function):
    r"""Gram determinants of a pair, kept as one node: pair_det(K1, K2, K12) = K1 K2 - K12^2 and
    pair_det(K1, K2, K12, c) = D = (1 + c K1)(1 + c K2) - c^2 K12^2.

    The two-point closed forms of erf (c = 2) and GELU (c = 1) divide by D.
    Expanded by sympy and summed in float64 in the printer's order, identical
    inputs (K12^2 = K1 K2) leave a rounding of ~1e-16 c^2 K^2 in a number of
    size 1 + 2 c K: the erf NTK's diagonal was 0.5 % off at K ~ 5e13 (2.5e-9
    at K ~ 5e7). As one node D is printed as
    ``(1 + c*(K1 + K2)) + c*c*(K1*K2 - K12*K12)``: the determinant part is
    exactly 0 for identical inputs and accurate to ~1e-16 c^2 K^2 otherwise
    (the conditioning of the inputs themselves), and the value is symmetric
    in (K1, K2) to the last bit, as Gram matrices must be.
    """

    nargs = (3, 4)

    @staticmethod
    def _value(K1, K2, K12, c=None):
        det = K1 * K2 - K12**2
        return det if c is None else 1 + c * (K1 + K2) + c**2 * det

    @classmethod
    def eval(cls, *args):
        if all(a.is_Number for a in args):
            return cls._value(*args)
        K1, K2, K12 = args[:3]
        if K12**2 == K1 * K2:
            return cls._value(K1, K2, K12, *args[3:]).subs(K12**2, K1 * K2)
        return None

    def fdiff(self, argindex=1):
        # the partial derivative in one slot: differentiate the polynomial in placeholders, then
        # put the arguments back (they may be expressions, not symbols)
        slots = sp.symbols(f"_pd0:{len(self.args)}", cls=sp.Dummy)
        d = sp.diff(self._value(*slots), slots[argindex - 1])
        return d.xreplace(dict(zip(slots, self.args)))

    def _eval_evalf(self, prec):
        return self._value(*self.args).evalf(prec)

    def _code(self, printer):
        K1, K2, K12, *c = (printer._print(a) for a in self.args)
        det = f"(({K1})*({K2}) - ({K12})*({K12}))"
        return det if not c else f"((1 + ({c[0]})*(({K1}) + ({K2}))) + ({c[0]})*({c[0]})*{det})"

    # every code printer sympy has (the instance printmethod of NumPyPrinter/SciPyPrinter is _numpycode)
    _pythoncode = _numpycode = _scipycode = _mpmathcode = _lambdacode = _code




def _pair_gap_det(K1, K2, K12, gap, c=None):
    """:class:`pair_det` with the exact gap: K1 K2 gap (and 1 + c (K1 + K2) + c^2 K1 K2 gap)."""
    if gap is None:
        return pair_det(K1, K2, K12) if c is None else pair_det(K1, K2, K12, c)
    det = K1 * K2 * gap
    return det if c is None else (1 + c * (K1 + K2)) + c**2 * det


@dataclass(frozen=True)
class Activation:
    """An activation phi(x) given by a sympy expression in :data:`meanfield.symbols.x`.

    The base class computes every moment as an unevaluated Gaussian
    expectation (quadrature); subclasses override with closed forms.
    """

    name: str
    expr: sp.Expr = field(compare=True)

    # -- the function itself ------------------------------------------------
    @property
    def derivative(self) -> sp.Expr:
        """phi'(x) as a sympy expression."""
        return sp.diff(self.expr, x)

    @property
    def has_closed_form(self) -> bool:
        return type(self).second_moment is not Activation.second_moment

    def __call__(self, value):
        """phi evaluated symbolically at ``value``."""
        return self.expr.subs(x, value)

    def numpy(self) -> Callable:
        """A vectorised float64 numpy function computing phi.

        Overflowing intermediate values (softplus at x = 800) are recomputed
        with mpmath: see :func:`meanfield.gaussian.numpy_function`.
        """
        return numpy_function(sp.Lambda(x, self.expr))

    def __init_subclass__(cls, **kwargs):
        # subclasses override the moment methods with closed forms: check their
        # variance arguments too
        super().__init_subclass__(**kwargs)
        for name, wrap in _CHECKED_METHODS.items():
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_checks_variances", False):
                setattr(cls, name, wrap(method))

    # -- one-point moments --------------------------------------------------
    def second_moment(self, K):
        """E[phi(h)^2], h ~ N(0, K)."""
        return GaussianExpectation(sp.Lambda(x, self.expr**2), K)

    def derivative_second_moment(self, K):
        """E[phi'(h)^2], h ~ N(0, K)."""
        return GaussianExpectation(sp.Lambda(x, self.derivative**2), K)

    def mean(self, K):
        """E[phi(h)], h ~ N(0, K)."""
        return GaussianExpectation(sp.Lambda(x, self.expr), K)

    def variance(self, K):
        """Var[phi(h)], h ~ N(0, K): what LayerNorm on activations divides by.

        E[phi^2] - E[phi]^2 cancels where phi(0) != 0 and K is small (softplus at
        K = 1e-12: 4e-4 of chi_J lost); the variance is shift-invariant, so for
        those it is E[(phi - phi(0))^2] - (E[phi] - phi(0))^2, whose first term
        is O(K) and second O(K^2). The built-in closed forms have phi(0) = 0.
        """
        m2, m = self.second_moment(K), self.mean(K)
        c = self.offset()
        if c is None:
            return m2 - m**2
        return GaussianExpectation(sp.Lambda(x, (self.expr - c) ** 2), K) - (m - c) ** 2

    def offset(self):
        """phi(0) where subtracting it is needed against cancellation, else None.

        For phi(0) != 0 (softplus, a user's sigmoid) at small K the raw moments are
        ~phi(0)^2 and their centred combinations E[phi^2] - E[phi]^2,
        E[phi(u) phi(v)] - E[phi(u)] E[phi(v)] are O(K): float64 loses ~1e-16/K of
        them. The built-in closed forms have phi(0) = 0.
        """
        c = self.expr.subs(x, 0)
        if self.has_closed_form or c == 0 or not c.is_finite:
            return None
        return c

    def centred_kernel(self, K1, K2, K12):
        """(Var phi(u), Var phi(v), Cov(phi(u), phi(v))) without cancellation, or None where the raw
        moments minus the means lose nothing (phi(0) = 0 or a closed form: :meth:`offset`).

        Covariances are shift-invariant, so they are taken of psi = phi - phi(0), whose moments are
        O(K) at small K: Var = E[psi^2] - (E psi)^2 (as :meth:`variance`) and
        Cov = E[psi(u) psi(v)] - E[psi(u)] E[psi(v)], the subtracted products O(K^2). LayerNorm after
        phi centres and divides by these in the Gram matrices (:meth:`calculus.GramSignal.normalised`);
        the raw forms lost ~1e-16/K relative (softplus at K = 1e-10: 4e-7 of the NTK).
        """
        c = self.offset()
        if c is None:
            return None
        psi = self.expr - c
        lam, mean = sp.Lambda((x, _y), psi * psi.subs(x, _y)), sp.Lambda(x, psi)
        m1, m2 = GaussianExpectation(mean, K1), GaussianExpectation(mean, K2)
        # the variances as the same two-point moment at identical arguments (the Gram engine's one-point
        # rule there): the diagonal, K1 = K2 = K12, is then exactly Cov = Var and LayerNorm's output 1
        return (GaussianExpectation2(lam, K1, K1, K1) - m1**2, GaussianExpectation2(lam, K2, K2, K2) - m2**2,
                GaussianExpectation2(lam, K1, K2, K12) - m1 * m2)

    def chi_delta_moment(self, K):
        """E[phi''^2 + phi' phi'''] in the weak sense = d/dK E[phi'(h)^2] (Price's theorem)."""
        k = sp.Dummy("k")
        return sp.diff(self.derivative_second_moment(k), k).subs(k, K)

    # -- two-point moments --------------------------------------------------
    def kernel(self, K1, K2, K12):
        """E[phi(u) phi(v)] for Var u = K1, Var v = K2, Cov(u, v) = K12.

        Closed forms also take ``gap`` = 1 - rho^2 = (K1 K2 - K12^2) / (K1 K2),
        rho = K12 / sqrt(K1 K2), when the caller knows it exactly (the Gram
        matrices carry it: :mod:`meanfield.gram`, Numerics); near rho = +-1 the
        rounded K's know it only to ~1e-16 absolute.
        """
        return GaussianExpectation2(sp.Lambda((x, _y), self.expr * self.expr.subs(x, _y)), K1, K2, K12)

    def derivative_kernel(self, K1, K2, K12):
        """E[phi'(u) phi'(v)] for Var u = K1, Var v = K2, Cov(u, v) = K12."""
        d = self.derivative
        return GaussianExpectation2(sp.Lambda((x, _y), d * d.subs(x, _y)), K1, K2, K12)

    def kernel_gap(self, K1, K2, K12, gap):
        """1 - rho'^2 of the outputs, rho' = E[phi(u) phi(v)] / sqrt(E phi(u)^2 E phi(v)^2), from the input's
        exact ``gap`` = 1 - rho^2, without cancellation near rho' = +-1; None where no such form is known
        (the Gram matrices then recompute the gap from the rounded kernels, :mod:`meanfield.gram`)."""
        return None

    def __repr__(self):
        return f"Activation({self.name!r}, {self.expr})"


def _one_point(method):
    """Check a numeric variance K (>= 0, finite) before computing a moment.

    Numbers are sympified, so integers and rationals give exact results."""
    @functools.wraps(method)
    def checked(self, K):
        check_real("K", K, minimum=0)
        return method(self, sp.sympify(K))

    checked._checks_variances = True
    return checked


def _two_point(method):
    """Check numeric K1, K2 (>= 0) and K12 (|K12| <= sqrt(K1 K2)) before a two-point moment.

    ``gap`` (1 - rho^2, optional) is passed on to closed forms that take it."""
    takes_gap = "gap" in inspect.signature(method).parameters

    @functools.wraps(method)
    def checked(self, K1, K2, K12, gap=None):
        check_real("K1", K1, minimum=0)
        check_real("K2", K2, minimum=0)
        check_real("K12", K12)
        vals = [numeric_value(n, v) for n, v in (("K1", K1), ("K2", K2), ("K12", K12))]
        if None not in vals and abs(vals[2]) > (vals[0] * vals[1]) ** 0.5 * (1 + 1e-12):
            raise ValueError(f"K12 must satisfy |K12| <= sqrt(K1 K2) (a covariance), got K12={K12!r} "
                             f"with K1={K1!r}, K2={K2!r}")
        args = tuple(map(sp.sympify, (K1, K2, K12)))
        if gap is not None and takes_gap:
            return method(self, *args, gap=sp.sympify(gap))
        return method(self, *args)

    checked._checks_variances = True
    return checked


_CHECKED_METHODS = {
    "second_moment": _one_point,
    "derivative_second_moment": _one_point,
    "mean": _one_point,
    "chi_delta_moment": _one_point,
    "kernel": _two_point,
    "derivative_kernel": _two_point,
}
for _name, _wrap in _CHECKED_METHODS.items():
    setattr(Activation, _name, _wrap(Activation.__dict__[_name]))
del _name, _wrap


# ---------------------------------------------------------------------------
# Closed forms.
# ---------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class ScaleInvariant(Activation):
    r"""phi(x) = a_+ x Theta(x) + a_- x Theta(-x) (partial-Jacobian paper, eq. 94).

    ReLU (1, 0), leaky ReLU (1, s), linear (1, 1), |x| (1, -1).

    E[phi^2] = (a_+^2 + a_-^2) K / 2                          (eq. 95)
    E[phi'^2] = (a_+^2 + a_-^2) / 2                           (eq. 99)
    E[phi] = (a_+ - a_-) sqrt(K / 2 pi)                       (eq. 108)
    E[phi(u)phi(v)] = a_+ a_- K12 + (a_+ - a_-)^2 / (2 pi)
                      [sqrt(K1 K2 - K12^2) + (pi - arccos rho) K12]
    E[phi'(u)phi'(v)] = a_+ a_- + (a_+ - a_-)^2 (pi - arccos rho) / (2 pi)

    with rho = K12 / sqrt(K1 K2). The two-point forms follow from
    phi = a_- x + (a_+ - a_-) relu(x) and the arc-cosine kernels of
    Cho & Saul (2009).
    """

    a_plus: sp.Expr = sp.Integer(1)
    a_minus: sp.Expr = sp.Integer(0)

    def second_moment(self, K):
        return (self.a_plus**2 + self.a_minus**2) * K / 2

    def derivative_second_moment(self, K):
        return (self.a_plus**2 + self.a_minus**2) / 2

    def mean(self, K):
        return (self.a_plus - self.a_minus) * sp.sqrt(K / (2 * _pi))

    def chi_delta_moment(self, K):
        return sp.Integer(0)

    def _angle(self, K1, K2, K12, gap):
        """(theta, sin theta) of the pair: arccos(rho) from rho, or atan2(sqrt(gap), rho) from the exact gap."""
        rho = K12 / sp.sqrt(K1 * K2)
        if gap is not None:
            return sp.atan2(sp.sqrt(gap), rho), sp.sqrt(gap)
        # unevaluated (the product's two factors printed as they are) only for symbols: an
        # unevaluated 0 * 2 at rho = 1 sends sympy's assumption system into InconsistentAssumptions
        return sp.acos(rho), sp.sqrt(sp.Mul(1 - rho, 1 + rho, evaluate=rho.is_number))

    def kernel(self, K1, K2, K12, gap=None):
        # sqrt(K1 K2 - K12^2) is written sqrt(K1 K2) sqrt((1 - rho)(1 + rho)) with the same rho as
        # the arccos: for (anti)parallel inputs of different norms K1 K2 - K12^2 is a difference of
        # two rounded numbers ~1e-16 K^2 (a square root ~1e-8 K, inconsistent with arccos(rho)),
        # which left an error of 4.5e-9 relative in the Gram matrix; (1 -+ rho) are exact there.
        a, b = self.a_plus, self.a_minus
        rho = K12 / sp.sqrt(K1 * K2)
        theta, sin_theta = self._angle(K1, K2, K12, gap)
        return a * b * K12 + (a - b) ** 2 / (2 * _pi) * sp.sqrt(K1 * K2) * (sin_theta + (_pi - theta) * rho)

    def derivative_kernel(self, K1, K2, K12, gap=None):
        a, b = self.a_plus, self.a_minus
        theta = self._angle(K1, K2, K12, gap)[0]
        return a * b + (a - b) ** 2 * (_pi - theta) / (2 * _pi)

    def kernel_gap(self, K1, K2, K12, gap):
        r"""1 - rho'^2 of (phi(u), phi(v)) from the input's exact gap s = 1 - rho^2 = sin^2 theta.

        phi = p x + q |x| with p = (a_+ + a_-)/2, q = (a_+ - a_-)/2, and E[u |v|] = 0, so
        E[phi(u) phi(v)] = sqrt(K1 K2) (p^2 rho + q^2 rho_abs), E[phi^2] = c K, c = p^2 + q^2, with
        rho_abs = (2/pi)(sin theta + (pi/2 - theta) cos theta), the correlation of |u|, |v|. Hence

            1 - rho' = (p^2 (1 - rho) + q^2 A) / c,   1 + rho' = (p^2 (1 + rho) + q^2 (2 - A)) / c,
            A = 1 - rho_abs = (1 - cos f) - (2/pi)(sin f - f cos f),   f = min(theta, pi - theta),

        every term >= 0 (A is even about theta = pi/2: |u||v| does not see the sign of v), 1 -+ rho
        from the gap (:data:`one_minus`), cos f = |rho|, sin f = sqrt(s). Near theta = 0 (and near
        pi for |x|-like phi, whose outputs are then parallel) 1 - rho' ~ theta^2 keeps its relative
        accuracy, and sin f - f cos f ~ f^3/3 is taken from its series for f < 1/20.
        """
        a, b = self.a_plus, self.a_minus
        p2, q2 = ((a + b) / 2) ** 2, ((a - b) / 2) ** 2
        c = p2 + q2
        rho = K12 / sp.sqrt(K1 * K2)
        ar = sp.Abs(rho)
        f = sp.atan2(sp.sqrt(gap), ar)  # min(theta, pi - theta), not from theta (pi - theta rounds to 4e-16)
        small = gap / (1 + ar)          # 1 - |rho|
        # sin f - f cos f = sum_k (-1)^(k+1) 2k f^(2k+1) / (2k+1)!, by its series below f = 1/20 (4 terms: 3e-17
        # relative there), where sin f - f cos f ~ f^3/3 is a difference of numbers ~f (above, ~1e-16 / f^2
        # relative: 4e-14 in a term ~f/10 of A)
        f2, series = f * f, sp.Integer(0)
        for k in range(4, 0, -1):       # Horner in f^2
            series = sp.Rational((-1) ** (k + 1) * 2 * k, sp.factorial(2 * k + 1)) + f2 * series
        series = sp.UnevaluatedExpr(f) * (f2 * series)   # f * f^2, not f**3 (numpy's power is slow but for squares)
        A = small - 2 / _pi * positive(sp.Rational(1, 20) - f, series, sp.sqrt(gap) - f * ar)
        # 1 - rho and 1 + rho: one is 1 - |rho|, the other 1 + |rho|, as rho > 0 or not
        one_m, one_p = positive(rho, small, 1 + ar), positive(rho, 1 + ar, small)
        return (p2 * one_m + q2 * A) * (p2 * one_p + q2 * (2 - A)) / c**2

    def __repr__(self):
        return f"ScaleInvariant({self.name!r}, a_plus={self.a_plus}, a_minus={self.a_minus})"


@dataclass(frozen=True, repr=False)
class Erf(Activation):
    r"""phi(x) = erf(x) (partial-Jacobian paper, appendix J).

    E[phi^2] = (2/pi) arcsin(2K / (1 + 2K))                   (eq. 121)
             = (2/pi) arctan(2K / sqrt(1 + 4K))               (evaluated so)
    E[phi'^2] = (4/pi) / sqrt(1 + 4K)                         (eq. 123)
    E[phi] = 0
    E[phi(u)phi(v)] = (2/pi) arcsin(2 K12 / sqrt((1 + 2K1)(1 + 2K2)))   (Williams 1997)
                    = (2/pi) arctan(2 K12 / sqrt(D)),
    E[phi'(u)phi'(v)] = (4/pi) / sqrt(D),
    D = (1 + 2K1)(1 + 2K2) - 4 K12^2 = 1 + 2 (K1 + K2) + 4 (K1 K2 - K12^2)

    (the last forms are the ones evaluated, D a :class:`pair_det` node: they
    stay exact at correlation 1 and large K).
    """

    def second_moment(self, K):
        # arcsin(a) at a = 1 - 1/(1 + 2K) has slope sqrt(K): the rounding of a cost ~1e-16 sqrt(K)
        # relative (1e-11 at K = 1e12); the arctan form takes the exact gap sqrt(1 - a^2) instead
        return 2 / _pi * sp.atan(2 * K / sp.sqrt(1 + 4 * K))

    def derivative_second_moment(self, K):
        return 4 / _pi / sp.sqrt(1 + 4 * K)

    def mean(self, K):
        return sp.Integer(0)

    def kernel(self, K1, K2, K12, gap=None):
        return 2 / _pi * sp.atan(2 * K12 / sp.sqrt(_pair_gap_det(K1, K2, K12, gap, 2)))

    def derivative_kernel(self, K1, K2, K12, gap=None):
        return 4 / _pi / sp.sqrt(_pair_gap_det(K1, K2, K12, gap, 2))

    def kernel_gap(self, K1, K2, K12, gap):
        r"""1 - rho'^2 of (erf(u), erf(v)) from the input's exact gap s = 1 - rho^2.

        With alpha_i = arcsin(a_i), a_i = 2 K_i / (1 + 2 K_i), and alpha = arcsin(b),
        b = 2 |K12| / sqrt(P), P = (1 + 2 K1)(1 + 2 K2): rho' = +-alpha / sqrt(alpha_1 alpha_2), so
        1 - rho'^2 = x (2 - x), x = 1 - alpha / sqrt(alpha_1 alpha_2) = Delta / sqrt(alpha_1 alpha_2),

            Delta = sqrt(alpha_1 alpha_2) - alpha = (alpha (d_1 + d_2) + d_1 d_2) / (sqrt(alpha_1 alpha_2) + alpha),
            d_i = alpha_i - alpha = atan2(a_i sqrt(1 - b^2) - b sqrt(1 - a_i^2), sqrt(1 - a_i^2) sqrt(1 - b^2) + a_i b),

        with a_i sqrt(1 - b^2) - b sqrt(1 - a_i^2) = (a_i^2 - b^2) / (a_i sqrt(1 - b^2) + b sqrt(1 - a_i^2)),
        a_i^2 - b^2 = 4 [K_i (K_i - K_j) + K1 K2 s (1 + 2 K_i)] / ((1 + 2 K_i) P), 1 - b^2 = D / P
        (D = 1 + 2 (K1 + K2) + 4 K1 K2 s) and 1 - a_i^2 = (1 + 4 K_i) / (1 + 2 K_i)^2: no difference of
        nearly equal numbers near rho = +-1 (erf is odd: antiparallel inputs give antiparallel outputs).
        """
        P = (1 + 2 * K1) * (1 + 2 * K2)
        D = _pair_gap_det(K1, K2, K12, gap, 2)
        b = 2 * sp.Abs(K12) / sp.sqrt(P)
        cb = sp.sqrt(D / P)                                   # sqrt(1 - b^2)
        alpha = sp.atan(2 * sp.Abs(K12) / sp.sqrt(D))         # arcsin(b)
        d, al = [], []
        for Ki, Kj in ((K1, K2), (K2, K1)):
            ai = 2 * Ki / (1 + 2 * Ki)
            ci = sp.sqrt(1 + 4 * Ki) / (1 + 2 * Ki)           # sqrt(1 - a_i^2)
            diff = 4 * (Ki * (Ki - Kj) + K1 * K2 * gap * (1 + 2 * Ki)) / ((1 + 2 * Ki) * P)
            d.append(sp.atan2(diff / (ai * cb + b * ci), ci * cb + ai * b))
            al.append(sp.atan(2 * Ki / sp.sqrt(1 + 4 * Ki)))  # arcsin(a_i), as in second_moment
        root = sp.sqrt(al[0] * al[1])
        x = (alpha * (d[0] + d[1]) + d[0] * d[1]) / (root + alpha) / root
        return x * (2 - x)

    def __repr__(self):
        return "Erf()"


@dataclass(frozen=True, repr=False)
class Gelu(Activation):
    r"""Exact GELU, phi(x) = x Phi(x) = x/2 (1 + erf(x / sqrt 2)) (paper, appendix K).

    E[phi^2] = K/4 + K/(2 pi) arcsin(K/(1+K)) + K^2 / (pi (1+K) sqrt(1+2K))   (eq. 152)
    E[phi'^2] = 1/4 + 1/(2 pi) [arcsin(K/(1+K)) + K(3+5K)/((1+K)(1+2K)^{3/2})]  (eq. 154)

    (evaluated with arcsin(K/(1+K)) = arctan(K/sqrt(1+2K)), exact near K/(1+K) = 1)
    E[phi] = K / sqrt(2 pi (1 + K))                                           (eq. 172)

    Two-point forms, with D = (1+K1)(1+K2) - K12^2 and
    rho_ab = K12 / sqrt((1+K1)(1+K2)):

    E[phi(u)phi(v)] = K12 (1/4 + arcsin(rho_ab)/(2 pi))
                      + [K1 K2 - K12^2 (1 - 1/(1+K1) - 1/(1+K2))] / (2 pi sqrt D)
    E[phi'(u)phi'(v)] = 1/4 + arcsin(rho_ab)/(2 pi)
                        + K12 (1/(1+K1) + 1/(1+K2)) / (2 pi sqrt D) + K12 / (2 pi D^{3/2})

    Evaluated as arcsin(rho_ab) = arctan(K12 / sqrt(D)) and
    K1 K2 - K12^2 (1 - 1/(1+K1) - 1/(1+K2)) = det + K12^2 (1/(1+K1) + 1/(1+K2)),
    det = K1 K2 - K12^2 and D as :class:`pair_det` nodes, so that
    correlation 1 at large K loses nothing to rounding.

    Derivation: write Phi(u) = P(xi_1 <= u) with independent xi_1, xi_2 ~ N(0, 1),
    so E[u Phi(u) v Phi(v)] = E[u v 1{a > 0} 1{b > 0}] with a = u - xi_1,
    b = v - xi_2; one Gaussian integration by parts in u gives the three terms.
    The phi' kernel follows the same way, with Gaussian tilting for the
    x phi(x) parts. Both reduce to eqs. 152 and 154 at K1 = K2 = K12 = K.
    """

    @staticmethod
    def _angle(K):
        # arcsin(K/(1+K)) without rounding K/(1+K) near 1, where arcsin's slope is ~sqrt(K)
        return sp.atan(K / sp.sqrt(1 + 2 * K))

    def second_moment(self, K):
        return K / 4 + K / (2 * _pi) * self._angle(K) + K**2 / (_pi * (1 + K) * sp.sqrt(1 + 2 * K))

    def derivative_second_moment(self, K):
        # K (3 + 5K) / ((1 + K)(1 + 2K)^{3/2}) written as K (5 + 1/(1 + 2K)) / (2 (1 + K) sqrt(1 + 2K)):
        # no factor overflows before K ~ 1e205 (the expanded form was inf / inf = NaN at K = 1e200)
        return sp.Rational(1, 4) + (self._angle(K)
                                    + K * (5 + 1 / (1 + 2 * K)) / (2 * (1 + K) * sp.sqrt(1 + 2 * K))) / (2 * _pi)

    def mean(self, K):
        return K / sp.sqrt(2 * _pi * (1 + K))

    def kernel(self, K1, K2, K12, gap=None):
        D = _pair_gap_det(K1, K2, K12, gap, 1)
        angle = sp.atan(K12 / sp.sqrt(D))  # arcsin(rho_ab), without rounding rho_ab near 1
        return (K12 * (sp.Rational(1, 4) + angle / (2 * _pi))
                + (_pair_gap_det(K1, K2, K12, gap) + K12**2 * (1 / (1 + K1) + 1 / (1 + K2))) / (2 * _pi * sp.sqrt(D)))

    def derivative_kernel(self, K1, K2, K12, gap=None):
        D = _pair_gap_det(K1, K2, K12, gap, 1)
        return (sp.Rational(1, 4) + sp.atan(K12 / sp.sqrt(D)) / (2 * _pi)
                + K12 * (1 / (1 + K1) + 1 / (1 + K2)) / (2 * _pi * sp.sqrt(D))
                + K12 / (2 * _pi * D ** sp.Rational(3, 2)))

    def kernel_gap(self, K1, K2, K12, gap):
        r"""1 - rho'^2 of (phi(u), phi(v)) from the input's exact gap s = 1 - rho^2, without cancellation.

        phi = x/2 + psi(x), psi(x) = x (Phi(x) - 1/2) >= 0 even, so E[u psi(v)] = 0 and the outputs are
        a sum of two uncorrelated parts: L = (K1, K2, K12)/4 (correlation rho, gap s) and
        M = E[psi psi] (correlation rho_M > 0, even in K12); their gap is :func:`sum_gap`'s
        (every term >= 0; near rho = -1, where x/2 and psi point opposite ways, the cross term is O(1)).
        rho_M comes from logarithms, 1 - rho_M^2 = -expm1(-L_M),

            L_M = ln M1 + ln M2 - 2 ln M12 = [ln mu1 + ln mu2 - 2 ln mu12_0] - 2 log1p(-dM / M12_0),

        with M = K mu(K) on the diagonal, M12_0 = Kg mu12_0 the parallel pair (K12 = Kg = sqrt(K1 K2)) and
        dM = M12_0 - M12 >= 0. With the pair's angle A = arcsin(K12 / sqrt(P)), P = (1 + K1)(1 + K2),
        D = P - K12^2 = 1 + K1 + K2 + K1 K2 s (Gelu.kernel, rewritten):

            2 pi M12 = sqrt(P) H(A) - q sqrt(D) + 1/sqrt(D),   H(A) = A sin A + cos A,  q = 1/(1+K1) + 1/(1+K2),
            2 pi dM = sqrt(P) [H(A0) - H(A)] + (sqrt(D) - sqrt(D0)) (q + 1/sqrt(D0 D)),
            H(A0) - H(A) = 2 sin(x) [m cos m - (1 - x cot x) sin m],   x = (A0 - A)/2, m = A0 - x,

        both terms >= 0 (m cos m >= 2 (1 - x cot x) sin m), A0 - A an arctangent of K1 K2 s P / (...),
        cos m, sin m from cos A0 = sqrt(D0/P), sin A0 = Kg/sqrt(P) (A0 -> pi/2 at large K).
        The bracket, O(t^2) for K1 = Kg e^t, K2 = Kg e^-t, is 0 for equal norms and is summed from
        first-order differences mu(K_i) - mu(Kg) and mu12_0 - mu(Kg) (the latter at fixed K1 K2, in
        D0 - Dg = 4 Kg sinh^2(t/2)), each written as a sum of same-signed terms:
        2 pi mu(K) = arctan(K/sqrt(1+2K)) + 2K/((1+K) sqrt(1+2K)) below K = 2, and above it
        2 pi mu - pi/2 = h(z) - z (1+3K)/((1+K)(1+2K)), z = sqrt(1+2K)/K, h(z) = z - arctan z
        (GELU tends to a scale-invariant function: mu -> 1/4 + O(K^-3/2), which the first form would
        leave to cancellation); the parallel pair the same with (1+2K, K^2) -> (D0, Kg^2).
        Checked against 50-digit mpmath (tests/test_gram_near_parallel.py): relative 1e-13, or within
        the change a relative 1e-15 perturbation of K1 makes (inputs of norms 1 and 1 + 1e-7).
        """
        return _gelu_gap(K1, K2, K12, gap)

    def __repr__(self):
        return "Gelu()"


def _horner(coefs, y):
    out = sp.Integer(0)
    for c in reversed(coefs):
        out = c + y * out
    return out


#: 1 - x cot x = sum_n 4^n |B_2n| x^2n / (2n)!, 14 terms: below 1e-17 relative for 0 <= x < pi/4
_XCOT = [sp.Abs(sp.bernoulli(2 * n)) * 4**n / sp.factorial(2 * n) for n in range(1, 15)]
#: w - arctan w = w^3 sum_k (-1)^k w^2k / (2k + 3), 8 terms: 2e-15 relative for w^2 < 1/100 (direct above:
#: 3e-14 relative, in a term that is ~w^2 of its neighbour)
_WATAN = [sp.Rational((-1) ** k, 2 * k + 3) for k in range(8)]


def _w_minus_atan(w):
    w2 = w * w
    return positive(sp.Rational(1, 100) - w2, w * w2 * _horner(_WATAN, w2), w - sp.atan(w, evaluate=False))


def _dh(dz, z1, z0):
    """h(z1) - h(z0), h(z) = z - arctan z, from dz = z1 - z0: dz z1 z0/(1 + z1 z0) + (w - arctan w)."""
    c = 1 + z1 * z0
    return dz * z1 * z0 / c + _w_minus_atan(dz / c)


def _gelu_gap(K1, K2, K12, gap):
    from sympy.codegen import cfunctions


    # unevaluated: sympy's eval of atan2, exp, ... queries the signs of these large arguments (seconds)
    atan, atan2, cos, sin, sinh, exp, expm1, log1p = (
        functools.partial(f, evaluate=False)
        for f in (sp.atan, sp.atan2, sp.cos, sp.sin, sp.sinh, sp.exp, cfunctions.expm1, cfunctions.log1p))

    two_pi = 2 * _pi
    s = gap
    r, rho = sp.Abs(K12), K12 / sp.sqrt(K1 * K2)
    Kg = sp.sqrt(K1) * sp.sqrt(K2)
    det = K1 * K2 * s
    P = (1 + K1) * (1 + K2)
    sP = sp.sqrt(P)
    D0 = 1 + K1 + K2
    sD0, sD = sp.sqrt(D0), sp.sqrt(D0 + det)
    q = 1 / (1 + K1) + 1 / (1 + K2)
    # the gap direction: dM = M12_0 - M12 (M even in K12: |K12|)
    A0 = atan(Kg / sD0)
    x = atan2(det * P / (Kg * sD + r * sD0), sD0 * sD + Kg * r) / 2
    cx, sx = cos(x), sin(x)
    cm, sm = (sD0 * cx + Kg * sx) / sP, (Kg * cx - sD0 * sx) / sP
    dH = 2 * sx * ((A0 - x) * cm - x * x * _horner(_XCOT, x * x) * sm)
    dM = (sP * dH + det / (sD + sD0) * (q + 1 / (sD0 * sD))) / two_pi
    # the norm direction: K1 = Kg e^t, K2 = Kg e^-t
    t = log1p((K1 - K2) / K2) / 2
    rg, Dg, Kg2 = sp.sqrt(1 + 2 * Kg), 1 + 2 * Kg, Kg * Kg
    zg = rg / Kg
    large = Kg - 2      # > 0: the forms of mu - 1/(2 pi) (h(z) and a positive remainder)

    def dmu(lt):
        # 2 pi (mu(Ki) - mu(Kg)), Ki = Kg e^lt, e = Ki - Kg
        e = Kg * expm1(lt)
        Ki = Kg + e
        ri = sp.sqrt(1 + 2 * Ki)
        l1, l2 = log1p(e / (1 + Kg)), log1p(2 * e / Dg)
        dx = e * (Ki + Kg + 2 * Ki * Kg) / (ri * rg * (Ki * rg + Kg * ri))
        below = atan(dx / (1 + Ki * Kg / (ri * rg))) + 2 * Kg / ((1 + Kg) * rg) * expm1(lt - l1 - l2 / 2)
        lz = l2 / 2 - lt
        dz = zg * expm1(lz)
        y = zg * (1 + 3 * Kg) / ((1 + Kg) * Dg)
        above = _dh(dz, zg + dz, zg) - y * expm1(lz + log1p(3 * e / (1 + 3 * Kg)) - l1 - l2)
        return positive(large, above, below)

    d1, d2 = dmu(t), dmu(-t)
    ds = 4 * Kg * sinh(t / 2) ** 2        # D0 - Dg
    sD0g = sp.sqrt(Dg + ds)
    below = (atan(-Kg * ds / (sD0g * rg * (sD0g + rg)) / (1 + Kg2 / (sD0g * rg)))
             + 2 * Kg / (rg * (1 + Kg)) * expm1(log1p(ds / (1 + Dg)) - log1p(ds / Dg) / 2 - log1p(ds / (Dg + Kg2))))
    lz = log1p(ds / Dg) / 2
    dz = zg * expm1(lz)
    y = zg * (1 + 3 * Kg) / ((1 + Kg) * Dg)       # z (Dg^2 - Kg^2) / (Dg (Dg + Kg^2))
    above = _dh(dz, zg + dz, zg) - y * expm1(lz + log1p(ds * (2 * Dg + ds) / ((1 + Kg) * (1 + 3 * Kg)))
                                            - log1p(ds / Dg) - log1p(ds / (Dg + Kg2)))
    d12 = positive(large, above, below)
    mug = atan(Kg / rg) + 2 * Kg / ((1 + Kg) * rg)          # 2 pi mu(Kg)
    mu12 = mug + d12
    LM = (log1p(d1 / mug) + log1p(d2 / mug) - 2 * log1p(d12 / mug)
          - 2 * log1p(-two_pi * dM / (Kg * mu12)))
    gM, rM = -expm1(-LM), exp(-LM / 2)
    # the outputs: L_i = K_i / 4, M_i = K_i mu_i; L1 M2 - L2 M1 = K1 K2 (mu2 - mu1) / 4
    mu1 = (atan(K1 / sp.sqrt(1 + 2 * K1)) + 2 * K1 / ((1 + K1) * sp.sqrt(1 + 2 * K1))) / two_pi
    mu2 = (atan(K2 / sp.sqrt(1 + 2 * K2)) + 2 * K2 / ((1 + K2) * sp.sqrt(1 + 2 * K2))) / two_pi
    return sum_gap(K1 / 4, K2 / 4, rho, s, K1 * mu1, K2 * mu2, rM, gM, skew=K1 * K2 * (d2 - d1) / (4 * two_pi))


def _tilt(a, K):
    r"""E[e^{a h} 1{h<0}] = e^{a^2 K/2} Phi(-a sqrt K) for h ~ N(0, K), a > 0, in float64-safe form.

    With u = a^2 K / 2 this is e^u erfc(sqrt u) / 2. Past u = 300 the factors
    overflow and underflow (e^u, erfc), so there the asymptotic (Mills ratio)
    series e^u erfc(sqrt u) = (pi u)^{-1/2} sum_n (-1)^n (2n-1)!! / (2u)^n
    is used, 9 terms: its truncation error is below 1e-19 relative for u >= 300
    (DLMF 7.12.1).
    """
    u = a**2 * K / 2
    exact = sp.exp(u) * sp.erfc(sp.sqrt(u)) / 2
    # Max(u, 300) equals u on this branch; it keeps the compiled code (which hoists common
    # subexpressions out of both branches) from evaluating 1/u^n at u = 0
    v = sp.Max(u, 300)
    asym = sum((-1) ** n * sp.factorial2(2 * n - 1) / (2 * v) ** n for n in range(9)) / (2 * sp.sqrt(_pi * v))
    return sp.Piecewise((exact, u < 300), (asym, True))


def _neg_part_moments(K):
    r"""(E[(e^h - 1)^2 1{h<0}], E[(e^h - 1) 1{h<0}]) for h ~ N(0, K), without cancellation at small K.

    Closed forms: e^{2K}Phi(-2s) - 2 e^{K/2}Phi(-s) + 1/2 and e^{K/2}Phi(-s) - 1/2
    (s = sqrt K) lose ~1e-16/K relative accuracy to cancellation as K -> 0
    (the first one, in float64: 1.7e-14 at K = 3e-3, 4.9e-15 at 0.02);
    below K = 1/5 the power series sum_m c_m E[h^m 1{h<0}] is used, with
    E[h^m 1{h<0}] = (-1)^m (2K)^{m/2} Gamma((m+1)/2) / (2 sqrt pi) and
    (e^h - 1)^2 = sum_{m>=2} (2^m - 2) h^m / m!, e^h - 1 = sum_{m>=1} h^m / m!;
    32 and 25 terms leave truncation errors of 4e-21 and 5e-23 relative
    there (at K = 1/5, against 40-digit mpmath), and the closed forms lose
    < 5e-16 above it.
    """
    def neg_moment(m):
        return (-1) ** m * (2 * K) ** sp.Rational(m, 2) * sp.gamma(sp.Rational(m + 1, 2)) / (2 * sp.sqrt(_pi))

    sq = sum((2**m - 2) / sp.factorial(m) * neg_moment(m) for m in range(2, 34))
    lin = sum(neg_moment(m) / sp.factorial(m) for m in range(1, 26))
    small = K < sp.Rational(1, 5)
    return (sp.Piecewise((sq, small), (_tilt(2, K) - 2 * _tilt(1, K) + sp.Rational(1, 2), True)),
            sp.Piecewise((lin, small), (_tilt(1, K) - sp.Rational(1, 2), True)))


@dataclass(frozen=True, repr=False)
class Elu(Activation):
    r"""ELU, phi(x) = x (x > 0), alpha (e^x - 1) (x <= 0) (Clevert et al. 2016); SELU = lambda ELU.

    ``gain`` is SELU's lambda (1 for ELU). With h ~ N(0, K), s = sqrt K, the
    one-point moments follow from E[e^{a h} 1{h<0}] = e^{a^2 K/2} Phi(-a s)
    (complete the square: h e^{ah} tilts N(0, K) to N(aK, K)) and
    E[h^2 1{h>0}] = K/2, E[h 1{h>0}] = s/sqrt(2 pi):

    E[phi^2]/gain^2  = K/2 + alpha^2 [e^{2K} Phi(-2s) - 2 e^{K/2} Phi(-s) + 1/2]
    E[phi'^2]/gain^2 = 1/2 + alpha^2 e^{2K} Phi(-2s)
    E[phi]/gain      = s/sqrt(2 pi) + alpha [e^{K/2} Phi(-s) - 1/2]

    (for SELU, E[phi] = 0 and E[phi^2] = 1 at K = 1 with Klambauer et al.'s
    constants: the self-normalising fixed point, their eqs. 4-5). In float64
    these forms cancel at small K and overflow at large K, so the
    expressions are Piecewise: a power series below K = 1/5 and the Mills
    ratio series past a^2 K / 2 = 300 (:func:`_tilt`, :func:`_neg_part_moments`). The
    two-point kernels involve the bivariate normal CDF and are left to
    quadrature. Checked against mpmath in tests/test_activations_piecewise.py.
    """

    alpha: sp.Expr = sp.Integer(1)
    gain: sp.Expr = sp.Integer(1)

    def second_moment(self, K):
        sq, _ = _neg_part_moments(K)
        return self.gain**2 * (K / 2 + self.alpha**2 * sq)

    def derivative_second_moment(self, K):
        return self.gain**2 * (sp.Rational(1, 2) + self.alpha**2 * _tilt(2, K))

    def mean(self, K):
        _, lin = _neg_part_moments(K)
        return self.gain * (sp.sqrt(K) / sp.sqrt(2 * _pi) + self.alpha * lin)

    def __repr__(self):
        return f"Elu({self.name!r}, alpha={self.alpha}, gain={self.gain})"


@dataclass(frozen=True, repr=False)
class HardTanh(Activation):
    r"""Hard tanh, phi(x) = max(-1, min(1, x)) (torch.nn.Hardtanh with its default range).

    With h ~ N(0, K) and t = 1/sqrt(K), from
    int_{-t}^{t} z^2 dPhi(z) = erf(t/sqrt 2) - 2 t phi_N(t) (integration by parts):

    E[phi^2]  = K erf(1/sqrt(2K)) - sqrt(2K/pi) e^{-1/(2K)} + erfc(1/sqrt(2K))
    E[phi'^2] = P(|h| < 1) = erf(1/sqrt(2K))
    E[phi]    = 0 (odd)

    (past K = 64 the first two terms of E[phi^2], which cancel, are summed as
    one series in 1/sqrt(2K): see :meth:`second_moment`).

    Two-point kernels are left to quadrature. Checked against mpmath in
    tests/test_activations_piecewise.py.
    """

    def second_moment(self, K):
        u = 1 / sp.sqrt(2 * K)
        exact = K * sp.erf(u) - sp.sqrt(2 * K / _pi) * sp.exp(-1 / (2 * K)) + sp.erfc(u)
        # K erf(u) and sqrt(2K/pi) e^{-u^2} both grow like sqrt(2K/pi) and cancel to (2/3) u/sqrt(pi):
        # in float64 a relative error ~1e-16 sqrt(K) (2e-8 at K = 1e16). Past K = 64 their
        # difference is summed as K P(3/2, u^2) = sum_{n>=1} (-1)^{n+1} 2n u^{2n-1} / (n! (2n+1)) / sqrt(pi)
        # (from the series of erf and u e^{-u^2}; 9 terms: truncation < 1e-22 relative for u^2 <= 1/128).
        # Max(K, 64) equals K on this branch and keeps the hoisted 1/sqrt from K = 0.
        w = 1 / sp.sqrt(2 * sp.Max(K, 64))
        series = sum((-1) ** (n + 1) * 2 * n * w ** (2 * n - 1) / (sp.factorial(n) * (2 * n + 1))
                     for n in range(1, 10)) / sp.sqrt(_pi)
        return sp.Piecewise((exact, K < 64), (series + sp.erfc(u), True))

    def derivative_second_moment(self, K):
        return sp.erf(1 / sp.sqrt(2 * K))

    def mean(self, K):
        return sp.Integer(0)

    def __repr__(self):
        return "HardTanh()"


#: SELU's constants (Klambauer et al. 2017, eq. 14; the values torch.nn.SELU uses)
SELU_ALPHA = sp.Float("1.6732632423543772848170429916717", 30)
SELU_LAMBDA = sp.Float("1.0507009873554804934193349852946", 30)


def _elu(alpha=1.0):
    from ._validate import is_number

    if not is_number(alpha) or float(alpha) < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    a = sp.nsimplify(alpha)
    return Elu("elu", sp.Piecewise((x, x > 0), (a * (sp.exp(x) - 1), True)), a, sp.Integer(1))


def _selu():
    a, g = SELU_ALPHA, SELU_LAMBDA
    return Elu("selu", g * sp.Piecewise((x, x > 0), (a * (sp.exp(x) - 1), True)), a, g)


# ---------------------------------------------------------------------------
# User expressions.
# ---------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class UserActivation(Activation):
    """A user's sympy activation with its kinks and jumps located.

    ``expr`` is the expression as written; for the moments, Max, Min, Abs,
    sign and Heaviside are rewritten as Piecewise
    (:func:`meanfield.gaussian.piecewise_form`), so derivatives are taken
    piece by piece and the quadrature splits at the breakpoints; the delta
    terms that the pieces' derivatives lack enter through the K-derivatives
    of :class:`~meanfield.gaussian.GaussianExpectation`. Where phi itself
    jumps, phi' contains a delta function and E[phi'^2] (chi_J) is infinite:
    the derivative moments raise ValueError.
    """

    cuts: tuple = ()
    jumps: tuple = ()   # jumps of phi at the cuts

    @property
    def derivative(self) -> sp.Expr:
        """phi'(x), piece by piece (no delta terms: see the class docs)."""
        from .gaussian import piecewise_form

        return sp.diff(piecewise_form(self.expr, x), x)

    def _no_jumps(self):
        bad = [(c, j) for c, j in zip(self.cuts, self.jumps) if j != 0]
        if bad:
            c, j = bad[0]
            raise ValueError(f"activation {self.name} jumps by {j} at x = {c}: its derivative is a delta "
                             "function, so E[phi'(h)^2] (chi_J) is infinite; use a continuous activation")

    def derivative_second_moment(self, K):
        self._no_jumps()
        return Activation.derivative_second_moment.__wrapped__(self, K)

    def derivative_kernel(self, K1, K2, K12):
        self._no_jumps()
        return Activation.derivative_kernel.__wrapped__(self, K1, K2, K12)

    def chi_delta_moment(self, K):
        self._no_jumps()
        return Activation.chi_delta_moment.__wrapped__(self, K)

    def __repr__(self):
        return f"UserActivation({self.name!r}, {self.expr})"


def _check_user_expression(expr, info, name):
    """ValueError naming ``activation`` unless phi is real and finite on the whole line
    (apart from jumps at its breakpoints)."""
    import mpmath as mp
    from sympy.calculus.util import continuous_domain

    pw = info.expr
    undefined = expr.atoms(sp.core.function.AppliedUndef)
    if undefined:
        raise ValueError(f"activation {name} uses undefined functions ({', '.join(sorted(map(str, undefined)))}), "
                         "which cannot compile; write phi with elementary functions")
    if pw.has(sp.I, sp.zoo, sp.nan, sp.oo):
        raise ValueError(f"activation {name} is not a real function of a real variable")
    pieces_ = pw.args if isinstance(pw, sp.Piecewise) else ((pw, sp.true),)
    taken = sp.S.EmptySet
    cut_set = sp.FiniteSet(*info.cuts)
    for e, cond in pieces_:
        where = (cond.as_set() if cond is not sp.true else sp.S.Reals) - taken
        taken = taken | where
        try:
            dom = continuous_domain(e, x, sp.S.Reals)
        except Exception:  # sympy cannot decide: the sampling below still checks
            continue
        missing = where - dom - cut_set
        if missing is not sp.S.EmptySet:
            raise ValueError(f"activation {name} is not defined, or not finite, on all of the real line "
                             f"(trouble on {missing}); activations must be real and finite for every real x")
    # real-valuedness (x**(1/3), sqrt(x) hidden in a condition, I*x, ...), by sampling
    fm = sp.lambdify(x, pw, modules="mpmath")
    pts = [0, 0.5, 1, 2, 3, 5, 10, 30, 100, 1e3] + [float(c) + d for c in info.cuts for d in (-1e-3, 1e-3)]
    with mp.workdps(30):
        for p in pts + [-p for p in pts]:
            try:
                v = mp.mpmathify(fm(mp.mpf(p)))
            except (ZeroDivisionError, ValueError, TypeError, OverflowError):
                raise ValueError(f"activation {name} cannot be evaluated at x = {p}; activations must be "
                                 "real and finite for every real x") from None
            if mp.im(v) != 0 or not mp.isfinite(v):
                raise ValueError(f"activation {name} is not real and finite at x = {p} (value {v}); "
                                 "activations must be real and finite for every real x")


def _recognise(expr, info):
    """The registered activation equal to ``expr``, or None."""
    from .gaussian import piece_at

    if info.cuts in ((), (0,)) and not expr.has(sp.exp, sp.log, sp.erf, sp.tanh):
        right, left = piece_at(info.expr, x, 1), piece_at(info.expr, x, -1)
        slopes = [sp.diff(e, x) for e in (right, left)]
        if all(sl.is_number for sl in slopes) and all(sp.simplify(e - sl * x) == 0
                                                      for e, sl in zip((right, left), slopes)):
            a_plus, a_minus = slopes
            names = {(1, 0): "relu", (1, 1): "linear", (1, -1): "abs"}
            name = names.get((a_plus, a_minus), "scale_invariant")
            return _scale_invariant(name, a_plus, a_minus)
    for name in ("erf", "gelu"):
        reg = ACTIVATIONS[name]()
        if expr == reg.expr or (expr.has(sp.erf, sp.erfc) and sp.simplify(expr - reg.expr) == 0):
            return reg
    return None


def user_activation(expr, name=None) -> Activation:
    """An :class:`Activation` from a sympy expression in :data:`meanfield.symbols.x`.

    Built-ins are recognised (``Max(x, 0)`` is relu, ``Abs(x)`` is abs,
    ``x/2 (1 + erf(x/sqrt 2))`` is GELU) and get their closed forms. Anything
    else becomes a :class:`UserActivation`, after checks: ValueError naming
    ``activation`` for expressions that are not real and finite on the whole
    line (sqrt(x), I*x, 1/x, log(x)) or whose breakpoints cannot be located
    (floor, DiracDelta, conditions with infinitely many solutions).
    """
    from .gaussian import Pieces, pieces

    expr = sp.sympify(expr)
    name = str(expr) if name is None else name
    try:
        info = pieces(sp.Lambda(x, expr))
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if msg.startswith("activation") else f"activation {name}: {msg}") from None
    except Exception as err:  # sympy internals (NotImplementedError, TypeError, ...)
        raise ValueError(f"activation {name} cannot be analysed ({type(err).__name__}); use elementary "
                         "functions, Piecewise, Max, Min, Abs, sign or Heaviside") from None
    # (a Lambda may rename its variable; bring the pieces back to x)
    info = Pieces(x, info.expr.subs(info.var, x), info.cuts, info.jump0, info.jump1)
    _check_user_expression(expr, info, name)
    known = _recognise(expr, info)
    if known is not None:
        return known
    # expr stays as written (torch and printing use it); the moments rewrite it
    return UserActivation(name, expr, info.cuts, info.jump0)


# ---------------------------------------------------------------------------
# Registry.
# ---------------------------------------------------------------------------
def _scale_invariant(name, a_plus, a_minus):
    a_plus, a_minus = sp.nsimplify(a_plus), sp.nsimplify(a_minus)
    expr = sp.Piecewise((a_plus * x, x >= 0), (a_minus * x, True))
    return ScaleInvariant(name, expr, a_plus, a_minus)


def _leaky_relu(negative_slope=0.01):
    from ._validate import is_number

    if not is_number(negative_slope):
        raise ValueError(f"negative_slope must be a finite real number, got {negative_slope!r}")
    return _scale_invariant("leaky_relu", 1, negative_slope)


def _scale_invariant_factory(a_plus=1, a_minus=0):
    from ._validate import is_number

    for n, v in (("a_plus", a_plus), ("a_minus", a_minus)):
        if not is_number(v):
            raise ValueError(f"{n} must be a finite real number, got {v!r}")
    return _scale_invariant("scale_invariant", a_plus, a_minus)


#: name -> factory(**params) -> Activation
ACTIVATIONS: dict[str, Callable[..., Activation]] = {
    "relu": lambda: _scale_invariant("relu", 1, 0),
    "leaky_relu": _leaky_relu,
    "linear": lambda: _scale_invariant("linear", 1, 1),
    "abs": lambda: _scale_invariant("abs", 1, -1),
    "scale_invariant": _scale_invariant_factory,
    "erf": lambda: Erf("erf", sp.erf(x)),
    "gelu": lambda: Gelu("gelu", x / 2 * (1 + sp.erf(x / sp.sqrt(2)))),
    "tanh": lambda: Activation("tanh", sp.tanh(x)),
    "silu": lambda: Activation("silu", x / (1 + sp.exp(-x))),
    "swish": lambda: Activation("swish", x / (1 + sp.exp(-x))),
    "softplus": lambda: Activation("softplus", sp.log(1 + sp.exp(x))),
    # torch's GELU(approximate='tanh') (Hendrycks & Gimpel 2016, eq. in sec. 2); moments by quadrature
    "gelu_tanh": lambda: Activation("gelu_tanh", x / 2 * (1 + sp.tanh(sp.sqrt(2 / _pi)
                                                                     * (x + sp.Rational(44715, 10**6) * x**3)))),
    "elu": _elu,
    "selu": _selu,
    "hardtanh": lambda: HardTanh("hardtanh", sp.Piecewise((-1, x < -1), (x, x <= 1), (1, True))),
}


#: what an activation written as text (``activation("x*erf(x)")``, ``meanfield --activation``) may call,
#: by the names in meanfield._names (sympy's, with abs/max/min as Python spells them)
EXPRESSION_FUNCTIONS = {name: getattr(sp, {"abs": "Abs", "max": "Max", "min": "Min"}.get(name, name))
                        for name in _names.EXPRESSION_FUNCTIONS}
#: the constants it may name (besides numbers)
EXPRESSION_CONSTANTS = {name: getattr(sp, name) for name in _names.EXPRESSION_CONSTANTS}
#: the longest activation text accepted
EXPRESSION_MAX_CHARS = 200
expression_help = _names.expression_help


def _check_expression_tree(tree) -> None:
    """ValueError unless the Python syntax tree of an activation text uses only numbers, x, the
    constants, the arithmetic operators and calls of :data:`EXPRESSION_FUNCTIONS` by name.

    This check, not sympy, is what keeps the text from running code: ``parse_expr`` ends in
    ``eval``, so anything that could reach Python objects (attributes, subscripts, lambdas,
    strings, keywords, other names) is refused here before it is called.
    """
    import ast

    ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}

    def has_x(node):
        return any(isinstance(n, ast.Name) and n.id == "x" for n in ast.walk(node))

    def number(node):   # the value of a literal, its negation, or a ratio of these; else None
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            v = number(node.operand)
            return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            a, b = number(node.left), number(node.right)
            return None if a is None or not b else a / b
        return None

    def small_number(node):
        v = number(node)
        return v is not None and abs(v) <= 100

    def visit(node):
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ValueError(f"{node.value!r} is not a number")
            return
        if isinstance(node, ast.Name):
            if node.id != "x" and node.id not in EXPRESSION_CONSTANTS:
                what = "a function, call it: " + node.id + "(x)" if node.id in EXPRESSION_FUNCTIONS else \
                    "unknown name " + repr(node.id) + " (the variable is x)"
                raise ValueError(what)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            return visit(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            if isinstance(node.op, ast.Pow) and not has_x(node.left) and not has_x(node.right):
                # a power of constants is evaluated exactly: keep its size bounded (no 9**9**9)
                if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.left)) \
                        or not small_number(node.right):
                    raise ValueError(f"a power of constants needs a number up to 100 as its exponent "
                                     f"and no power in its base, got {ast.unparse(node)!r}")
            visit(node.left)
            return visit(node.right)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                visit(node.func)   # says what is wrong with it (attribute access, a call of a call, ...)
                raise ValueError(f"{ast.unparse(node.func)!r} is not a function name")
            if node.func.id not in EXPRESSION_FUNCTIONS:
                raise ValueError(f"unknown function {node.func.id!r}")
            if node.keywords or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
                raise ValueError(f"{node.func.id}(...) takes plain arguments")
            for a in node.args:
                visit(a)
            return
        kind = {ast.Attribute: "attribute access ('.')", ast.Lambda: "lambda", ast.Subscript: "indexing ('[]')",
                ast.Compare: "a comparison", ast.BoolOp: "and/or", ast.IfExp: "if/else"}.get(type(node))
        raise ValueError(f"{kind or type(node).__name__ + ' ' + repr(ast.unparse(node))} is not allowed")

    visit(tree)


def parse_activation(text: str) -> sp.Expr:
    """The sympy expression in :data:`meanfield.symbols.x` that ``text`` spells, e.g. ``"x*erf(x)"``.

    Parsed with :func:`sympy.parsing.sympy_parser.parse_expr` after a check of
    its Python syntax tree (:func:`_check_expression_tree`): only numbers, x,
    pi, E, ``+ - * / **`` (``^`` means ``**``) and calls of
    :data:`EXPRESSION_FUNCTIONS` pass, so no other Python runs. The text is at
    most :data:`EXPRESSION_MAX_CHARS` characters.

    Raises
    ------
    ValueError
        Saying what is wrong (an unknown name, attribute access, no x, ...),
        without the argument's name (the caller adds it).
    """
    import ast

    from sympy.parsing.sympy_parser import convert_xor, parse_expr, standard_transformations

    if not isinstance(text, str) or not text.strip():
        raise ValueError("the expression is empty")
    if len(text) > EXPRESSION_MAX_CHARS:
        raise ValueError(f"the expression is longer than {EXPRESSION_MAX_CHARS} characters")
    try:
        tree = ast.parse(text.strip().replace("^", "**"), mode="eval")
    except SyntaxError:
        raise ValueError("it does not parse as an expression") from None
    _check_expression_tree(tree)
    local = {"x": x, **EXPRESSION_FUNCTIONS, **EXPRESSION_CONSTANTS}
    # the names auto_number and auto_symbol write, and no builtins
    glob = {"__builtins__": {}, "Integer": sp.Integer, "Float": sp.Float, "Rational": sp.Rational,
            "Symbol": sp.Symbol}
    try:
        expr = parse_expr(text.strip(), local_dict=local, global_dict=glob,
                          transformations=standard_transformations + (convert_xor,))
    except Exception as err:  # sympy's evaluation (e.g. a function given the wrong number of arguments)
        raise ValueError(f"sympy cannot build it ({type(err).__name__}: {err})") from None
    if not isinstance(expr, sp.Expr) or x not in expr.free_symbols:
        raise ValueError("the expression does not contain x")
    return expr


def available_activations() -> tuple[str, ...]:
    """Names accepted by :func:`activation`."""
    return tuple(ACTIVATIONS)


def activation(spec, **params) -> Activation:
    """An :class:`Activation` from a name, a sympy expression, or an Activation.

    Parameters
    ----------
    spec : str | sympy.Expr | Activation
        A registered name (see :func:`available_activations`; ``leaky_relu``
        takes ``negative_slope``, ``scale_invariant`` takes ``a_plus`` and
        ``a_minus``), or a sympy expression in exactly one free symbol, e.g.
        ``sympy.sin(t) + t / 2``, whose Gaussian moments are then computed by
        quadrature, or such an expression in x written as text,
        ``"x*erf(x)"`` (:func:`parse_activation`: numbers, pi, E, arithmetic
        and :data:`EXPRESSION_FUNCTIONS`; no other Python is run).

    Raises
    ------
    ValueError
        Unknown name, text that is not such an expression, unexpected
        parameters, or an expression without exactly one free symbol.
    """
    if isinstance(spec, Activation):
        if params:
            raise ValueError(f"activation parameters {sorted(params)} cannot be applied to an Activation instance")
        return spec
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key not in ACTIVATIONS:
            try:
                expr = parse_activation(spec)
            except ValueError as err:
                raise ValueError(f"activation={spec!r} is not known: {err}; give one of {', '.join(ACTIVATIONS)}, "
                                 f"{expression_help()}, or a sympy expression in one variable") from None
            if params:
                raise ValueError(f"activation parameters {sorted(params)} cannot be applied to an expression")
            return user_activation(expr)
        try:
            return ACTIVATIONS[key](**params)
        except TypeError:
            raise ValueError(f"activation {key!r} does not take parameters {sorted(params)}") from None
    if isinstance(spec, sp.Basic):
        if params:
            raise ValueError(f"activation parameters {sorted(params)} cannot be applied to a sympy expression")
        expr = sp.sympify(spec)
        free = expr.free_symbols
        if len(free) != 1:
            raise ValueError(
                f"activation expression {expr} must have exactly one free symbol, "
                f"found {len(free)}: {sorted(map(str, free))}")
        (var,) = free
        return user_activation(expr.subs(var, x), name=str(expr))
    raise ValueError(f"activation must be a name, a sympy expression or an Activation, got {spec!r}")
