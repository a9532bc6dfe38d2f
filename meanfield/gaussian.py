"""Gaussian expectations: symbolic placeholders, fast quadrature, mpmath references.

Everything in mean-field theory is an expectation over a Gaussian
preactivation. Activations with closed forms (see :mod:`meanfield.activations`)
return them directly; for every other activation the symbolic layer keeps an
unevaluated :class:`GaussianExpectation` (one input) or
:class:`GaussianExpectation2` (two correlated inputs). These are real sympy
functions:

- they differentiate by Price's theorem (Price 1958; also Roberts, Yaida &
  Hanin 2022, eq. 4.39),
  ``d/dK E[f(h)] = 1/2 E[f''(h)]``, ``d/dK12 E[f(u, v)] = E[d_u d_v f]``,
  so chi_K, the series coefficients and chi_Delta exist for any activation;
- ``.evalf()`` evaluates them with mpmath at the requested precision;
- :func:`meanfield.symbolic.lambdify` turns them into fast numpy calls.

Quadrature rule
---------------
E[f(h)], h ~ N(0, K), is written as
``int_0^inf [f(sqrt(K) u) + f(-sqrt(K) u)] phi(u) du`` with phi the standard
normal density, and integrated with the exp-sinh (double exponential) rule
``u = exp(pi/2 sinh t)``, trapezoid in t with step 1/32. The rule is
log-uniform in u, so it resolves structure in f at |h| ~ 1 whatever sqrt(K)
is: against mpmath it is accurate to ~1e-15 relative for tanh^2, sech^4,
softplus^2 and swish^2 over K in [1e-6, 1e6] (tests/test_gaussian.py),
where Gauss-Hermite needs thousands of nodes at K = 1e6.
Splitting at h = 0 also makes kinks at the origin (ReLU-like) harmless.
"""
from __future__ import annotations

import numpy as np
import sympy as sp
import mpmath as mp

from .symbols import x as _x

__all__ = [
    "GaussianExpectation",
    "GaussianExpectation2",
    "RULE_U",
    "RULE_W",
    "expect",
    "expect2",
    "mp_expect",
    "mp_expect2",
]


# ---------------------------------------------------------------------------
# The quadrature rule (shared by numpy and numba code).
# ---------------------------------------------------------------------------
def _exp_sinh_rule(step: float = 1.0 / 32, t_min: float = -6.0, t_max: float = 1.6):
    """Nodes u > 0 and weights w with sum w [f(u) + f(-u)] ~ E[f(z)], z ~ N(0, 1).

    t_max = 1.6 puts the last node at u ~ 19.6 (phi(u) ~ 1e-84); t_min = -6
    puts the first at u ~ 1e-137, so both tails are below double precision.
    """
    t = np.arange(t_min, t_max + step / 2, step)
    u = np.exp(0.5 * np.pi * np.sinh(t))
    du_dt = u * 0.5 * np.pi * np.cosh(t)
    w = step * du_dt * np.exp(-0.5 * u * u) / np.sqrt(2.0 * np.pi)
    keep = w > 1e-300
    return u[keep].copy(), w[keep].copy()


#: exp-sinh nodes u_i > 0 and weights w_i (float64, read-only): see module docs.
RULE_U, RULE_W = _exp_sinh_rule()
RULE_U.setflags(write=False)
RULE_W.setflags(write=False)


def expect(f, K):
    """E[f(h)] for h ~ N(0, K), by the exp-sinh rule.

    Parameters
    ----------
    f : callable
        Vectorised numpy function of one array argument.
    K : array_like
        Variance(s) >= 0; broadcasts. K = 0 gives f(0).

    Returns
    -------
    numpy.ndarray (float64) with the shape of K.
    """
    K = np.asarray(K, dtype=np.float64)
    s = np.sqrt(K)[..., None]
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        vals = f(s * RULE_U) + f(-s * RULE_U)
    return np.asarray(vals @ RULE_W, dtype=np.float64)


def expect2(f, K1, K2, K12):
    """E[f(u, v)] for (u, v) zero-mean Gaussian, Var u = K1, Var v = K2, Cov = K12.

    Nested exp-sinh rules: u = sqrt(K1) z1 and, given z1,
    v ~ N(rho sqrt(K2) z1, K2 (1 - rho^2)) with rho = K12 / sqrt(K1 K2)
    (clipped to [-1, 1]). ``f`` is a vectorised numpy function of two arrays.
    Broadcasts over K1, K2, K12 (one nested rule per point).
    """
    K1, K2, K12 = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (K1, K2, K12)))
    out = np.empty(K1.shape)
    z1 = np.concatenate([RULE_U, -RULE_U])
    w1 = np.concatenate([RULE_W, RULE_W])
    for idx in np.ndindex(K1.shape):
        k1, k2, k12 = K1[idx], K2[idx], K12[idx]
        denom = np.sqrt(k1 * k2)
        rho = 0.0 if denom == 0 else float(np.clip(k12 / denom, -1.0, 1.0))
        u = np.sqrt(k1) * z1
        mean_v = rho * np.sqrt(k2) * z1
        sd_v = np.sqrt(max(k2 * (1.0 - rho * rho), 0.0))
        v = mean_v[:, None] + sd_v * z1[None, :]
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            vals = f(u[:, None], v)
        out[idx] = w1 @ (vals @ w1)
    return out


# ---------------------------------------------------------------------------
# mpmath references (the tests' independent route).
# ---------------------------------------------------------------------------
def mp_expect(f, K, dps: int = 40):
    """E[f(h)], h ~ N(0, K), by mpmath tanh-sinh quadrature at ``dps`` digits.

    ``f`` takes and returns mpmath numbers. The integration range is split at
    0 and at the scales 1 and sqrt(K) where activations and the Gaussian
    change, which keeps mpmath's adaptive rule honest at extreme K.
    """
    with mp.workdps(dps):
        K = mp.mpf(K)
        if K == 0:
            return f(mp.mpf(0))
        s = mp.sqrt(K)
        norm = 1 / mp.sqrt(2 * mp.pi * K)
        cuts = {mp.mpf(0)}
        for c in (1, 3, 10, 30):
            cuts.update({mp.mpf(c), -mp.mpf(c)})
        for c in (1, 4, 8, 12):
            cuts.update({c * s, -c * s})
        pts = [-mp.inf] + sorted(c for c in cuts if abs(c) <= 40 * s) + [mp.inf]

        def g(h):
            return f(h) * mp.exp(-h * h / (2 * K)) * norm

        return mp.quad(g, pts)


def mp_expect2(f, K1, K2, K12, dps: int = 25):
    """E[f(u, v)] for a zero-mean Gaussian pair, by nested mpmath quadrature.

    Uses u = sqrt(K1) z1, v = sqrt(K2)(rho z1 + sqrt(1 - rho^2) z2). Slow
    (seconds per point): for tests only.
    """
    with mp.workdps(dps):
        K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
        rho = K12 / mp.sqrt(K1 * K2)
        rho = max(min(rho, mp.mpf(1)), mp.mpf(-1))
        c = mp.sqrt(max(1 - rho * rho, mp.mpf(0)))
        s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
        dens = lambda z: mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi)  # noqa: E731
        pts = [-mp.inf, -8, -3, -1, 0, 1, 3, 8, mp.inf]

        def outer(z1):
            u = s1 * z1
            if c == 0:
                return f(u, s2 * rho * z1) * dens(z1)
            # the inner integrand may be kinked where v = 0, i.e. at z2 = -rho z1 / c
            kink = -rho * z1 / c
            inner_pts = sorted(set(pts[1:-1] + [kink]))
            inner = mp.quad(lambda z2: f(u, s2 * (rho * z1 + c * z2)) * dens(z2),
                            [-mp.inf] + inner_pts + [mp.inf])
            return inner * dens(z1)

        return mp.quad(outer, pts)


# ---------------------------------------------------------------------------
# Symbolic placeholders.
# ---------------------------------------------------------------------------
def _as_lambda(f, nvars: int) -> sp.Lambda:
    if isinstance(f, sp.Lambda):
        return f
    if nvars == 1:
        return sp.Lambda(_x, sp.sympify(f))
    raise TypeError("two-point expectations take a sympy Lambda((x, y), expr)")


def _gaussian_moment(n: int, K):
    """E[h^n] for h ~ N(0, K): 0 for odd n, (n-1)!! K^(n/2) for even n."""
    if n % 2:
        return sp.Integer(0)
    return sp.factorial2(n - 1) * K ** sp.Rational(n, 2)


class GaussianExpectation(sp.Function):
    r"""E[f(h)] with h ~ N(0, K), as an unevaluated sympy function of K.

    ``GaussianExpectation(Lambda(x, f(x)), K)``. Polynomials in x are
    evaluated exactly; anything else stays unevaluated and is computed by
    quadrature when a number is needed. ``diff(., K)`` follows Price's theorem
    :math:`\partial_K E[f] = \tfrac12 E[f'']`.
    """

    nargs = 2

    @classmethod
    def eval(cls, f, K):
        if not isinstance(f, sp.Lambda):
            return None
        (var,) = f.variables
        body = sp.expand(f.expr)
        if not body.has(var):
            return body
        if body.is_polynomial(var):
            poly = sp.Poly(body, var)
            return sp.Add(*[c * _gaussian_moment(m[0], K) for m, c in zip(poly.monoms(), poly.coeffs())])
        return None

    def fdiff(self, argindex=2):
        f, K = self.args
        if argindex != 2:
            raise sp.ArgumentIndexError(self, argindex)
        (var,) = f.variables
        return GaussianExpectation(sp.Lambda(var, sp.diff(f.expr, var, 2) / 2), K)

    def _eval_evalf(self, prec):
        f, K = self.args
        Kval = K.evalf(prec)
        if not Kval.is_number:
            return None
        (var,) = f.variables
        fm = sp.lambdify(var, f.expr, modules="mpmath")
        dps = max(15, mp.libmp.prec_to_dps(prec))
        return sp.Float(mp_expect(fm, Kval, dps=dps + 5), dps)

    def _latex(self, printer):
        f, K = self.args
        (var,) = f.variables
        body = printer._print(f.expr.subs(var, sp.Symbol("h")))
        return r"\mathbb{E}_{h\sim\mathcal{N}(0,%s)}\left[%s\right]" % (printer._print(K), body)


class GaussianExpectation2(sp.Function):
    r"""E[f(u, v)] for a zero-mean Gaussian pair with Var u = K1, Var v = K2, Cov = K12.

    ``GaussianExpectation2(Lambda((x, y), f), K1, K2, K12)``; derivatives by
    Price's theorem: d/dK1 = 1/2 E[f_xx], d/dK2 = 1/2 E[f_yy], d/dK12 = E[f_xy].
    """

    nargs = 4

    @classmethod
    def eval(cls, f, K1, K2, K12):
        if isinstance(f, sp.Lambda) and not f.expr.has(*f.variables):
            return f.expr
        return None

    def fdiff(self, argindex=4):
        f, K1, K2, K12 = self.args
        a, b = f.variables
        if argindex == 2:
            g = sp.diff(f.expr, a, 2) / 2
        elif argindex == 3:
            g = sp.diff(f.expr, b, 2) / 2
        elif argindex == 4:
            g = sp.diff(f.expr, a, b)
        else:
            raise sp.ArgumentIndexError(self, argindex)
        return GaussianExpectation2(sp.Lambda((a, b), g), K1, K2, K12)

    def _eval_evalf(self, prec):
        f, *ks = self.args
        vals = [k.evalf(prec) for k in ks]
        if not all(v.is_number for v in vals):
            return None
        fm = sp.lambdify(f.variables, f.expr, modules="mpmath")
        dps = max(15, mp.libmp.prec_to_dps(prec))
        return sp.Float(mp_expect2(fm, *vals, dps=dps + 5), dps)

    def _latex(self, printer):
        f, K1, K2, K12 = self.args
        a, b = f.variables
        body = printer._print(f.expr.subs({a: sp.Symbol("u"), b: sp.Symbol("v")}))
        return r"\mathbb{E}_{(u,v)\sim\mathcal{N}(0,[%s,%s;%s])}\left[%s\right]" % (
            printer._print(K1), printer._print(K12), printer._print(K2), body)
