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

The even nodes of the rule form the rule with step 1/16, which gives an
error estimate for free. :func:`expect` halves the step where that estimate
is large (integrands oscillating faster than the rule resolves, such as
sin(h) at K >~ 30, or kinked away from 0), up to step 1/32768, and warns if
even that does not converge; :func:`expect2` does the same up to step 1/256.
With it, E[(sin h + h/2)^2] is accurate to ~1e-15 over K in [1e-6, 1e6].

Accuracy limits worth knowing: the error is relative to E|f(h)|, so a
result much smaller than E|f(h)| (a cancelling integrand) is only accurate
in that absolute sense. The one case the package meets is chi_Delta of
tanh-, SiLU- and softplus-like activations at large K, where the pointwise
integrand phi''^2 + phi' phi''' integrates to ~0 at leading order: relative
error up to 6e-10 for tanh and 2e-8 for softplus at K = 1e6 (1e-12 up to
K = 1e4), absolute error below 3e-14 of E|phi''^2| + E|phi' phi'''|
(tests/test_activations.py).
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
    "numpy_function",
]


# ---------------------------------------------------------------------------
# The quadrature rule (shared by numpy and numba code).
# ---------------------------------------------------------------------------
def _exp_sinh_grid(step: float, t_min: float = -6.0, t_max: float = 1.6):
    """Nodes, weights and grid indices k (t = t_min + k step) of the exp-sinh rule."""
    t = np.arange(t_min, t_max + step / 2, step)
    u = np.exp(0.5 * np.pi * np.sinh(t))
    du_dt = u * 0.5 * np.pi * np.cosh(t)
    w = step * du_dt * np.exp(-0.5 * u * u) / np.sqrt(2.0 * np.pi)
    keep = w > 1e-300
    return u[keep].copy(), w[keep].copy(), np.nonzero(keep)[0]


def _exp_sinh_rule(step: float = 1.0 / 32, t_min: float = -6.0, t_max: float = 1.6):
    """Nodes u > 0 and weights w with sum w [f(u) + f(-u)] ~ E[f(z)], z ~ N(0, 1).

    t_max = 1.6 puts the last node at u ~ 19.6 (phi(u) ~ 1e-84); t_min = -6
    puts the first at u ~ 1e-137, so both tails are below double precision.
    """
    u, w, _ = _exp_sinh_grid(step, t_min, t_max)
    return u, w


#: exp-sinh nodes u_i > 0 and weights w_i (float64, read-only): see module docs.
RULE_U, RULE_W = _exp_sinh_rule()
RULE_U.setflags(write=False)
RULE_W.setflags(write=False)

#: Convergence test. The estimate delta = |I_h - I_2h| / E|f| (I_2h: the even
#: nodes, i.e. the rule with twice the step) is about the error of I_2h. The
#: trapezoid rule in t converges exponentially for smooth f, so the base rule
#: is accepted when delta <= 1e-8 (its own error is then below ~1e-15 of E|f|
#: in the cases measured in tests/test_gaussian.py). A refined
#: level is accepted only when delta <= 1e-10, which bounds the error of the
#: accepted value by ~1e-10 of E|f| even where convergence is slow.
_TOL_BASE = 1e-8
_TOL_REFINED = 1e-10
_MAX_LEVEL_1D = 10   # step 1/32768: ~250k nodes per variance
_MAX_LEVEL_2D = 3    # step 1/256: ~2k nodes per axis, 4M per point
_MAX_CENTRE = 8.0    # expect2: largest shift of the inner rule (in standard deviations)
_RULES = {}


def _rule(level: int):
    """(u, w, even) of the rule with step 2^-level / 32; ``even`` marks the
    nodes of the level - 1 rule (every other node), whose weights are 2 w."""
    if level not in _RULES:
        if level == 0:
            u, w = RULE_U, RULE_W
            k = _exp_sinh_grid(1.0 / 32)[2]
        else:
            u, w, k = _exp_sinh_grid(1.0 / 32 / 2**level)
        _RULES[level] = (u, w, k % 2 == 0)
    return _RULES[level]


def _accept(delta, level):
    return delta <= (_TOL_BASE if level == 0 else _TOL_REFINED)


def _not_converged(what, n):
    import warnings

    warnings.warn(f"{what}: the exp-sinh quadrature did not converge for {n} value(s) "
                  "(oscillatory or kinked integrand?); the result may be inaccurate",
                  RuntimeWarning, stacklevel=3)


def numpy_function(f):
    """A vectorised float64 numpy function of a sympy ``Lambda`` (or of an expression in x).

    Values that overflow in float64 arithmetic (``log(1 + exp(x))`` at x = 800,
    the SiLU derivative's ``inf / inf`` at x = -800, ...) come back as inf or
    NaN from numpy; those entries, and only those, are recomputed with mpmath
    from the same expression, so the quadrature sees the true values over the
    whole range the rule samples (|h| up to ~20 sqrt(K)). An entry that is
    not real even in mpmath (a log of a negative number, say) stays NaN.
    """
    f = _as_lambda(f, 1)
    variables = f.variables
    fast = sp.lambdify(variables, f.expr, modules=["numpy", "scipy"])
    slow = None

    def g(*arrays):
        nonlocal slow
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in arrays))
        with np.errstate(all="ignore"):
            out = np.array(np.broadcast_to(np.asarray(fast(*arrays), dtype=np.float64), arrays[0].shape))
        bad = ~np.isfinite(out)
        if bad.any():
            if slow is None:
                slow = sp.lambdify(variables, f.expr, modules="mpmath")
            with mp.workdps(30):
                for idx in zip(*np.nonzero(bad)):
                    try:
                        val = slow(*(mp.mpf(float(a[idx])) for a in arrays))
                        val = mp.mpmathify(val)
                        out[idx] = float(val.real) if mp.im(val) == 0 else np.nan
                    except (ValueError, ZeroDivisionError, TypeError, OverflowError):
                        out[idx] = np.nan
        return out

    return g


def _check_variances(K1, K2=None, K12=None, names=("K", "K2", "K12")):
    if np.any(K1 < 0):
        raise ValueError(f"{names[0]} must be a variance >= 0, got {K1!r}")
    if K2 is None:
        return
    if np.any(K2 < 0):
        raise ValueError(f"{names[1]} must be a variance >= 0, got {K2!r}")
    with np.errstate(invalid="ignore"):
        if np.any(np.abs(K12) > np.sqrt(K1 * K2) * (1 + 1e-12) + 1e-300):
            raise ValueError(f"{names[2]} must satisfy |K12| <= sqrt(K1 K2) (a covariance), got {K12!r}")


def _relative(diff, scale):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, np.abs(diff) / scale, np.abs(diff))


def expect(f, K):
    """E[f(h)] for h ~ N(0, K), by the exp-sinh rule, refined where needed.

    The base rule (:data:`RULE_U`, :data:`RULE_W`) carries an embedded error
    estimate (its even nodes form the rule with twice the step). Where that
    estimate exceeds 1e-8 of E|f(h)| (an integrand oscillating on a scale the
    rule does not resolve, e.g. sin(h) at K = 1e4, or one with a kink away
    from 0), the step is halved until two successive levels agree to 1e-10
    of E|f(h)|, at most 10 times (~250k nodes); a RuntimeWarning says when
    even that did not converge.

    Parameters
    ----------
    f : callable
        Vectorised numpy function of one array argument.
    K : array_like
        Variance(s) >= 0; broadcasts. K = 0 gives f(0).

    Returns
    -------
    numpy.ndarray (float64) with the shape of K.

    Raises
    ------
    ValueError
        If any K < 0 (NaN passes through as NaN).
    """
    K = np.asarray(K, dtype=np.float64)
    _check_variances(K)
    s = np.sqrt(K).ravel()
    out = np.empty(s.size)
    todo = np.arange(s.size)
    level = 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        while todo.size:
            u, w, even = _rule(level)
            delta = np.empty(todo.size)
            rows = max(1, 2_000_000 // u.size)
            for start in range(0, todo.size, rows):
                idx = todo[start:start + rows]
                sc = s[idx, None]
                plus, minus = f(sc * u), f(-sc * u)
                vals = np.broadcast_to(plus + minus, (idx.size, u.size))
                total = vals @ w
                out[idx] = total
                scale = np.broadcast_to(np.abs(plus) + np.abs(minus), vals.shape) @ w  # E|f(h)|
                delta[start:start + rows] = _relative(total - 2.0 * (vals[:, even] @ w[even]), scale)
            done = _accept(delta, level) | ~np.isfinite(out[todo])
            todo = todo[~done]
            level += 1
            if todo.size and level > _MAX_LEVEL_1D:
                _not_converged("expect", todo.size)
                break
    return out.reshape(K.shape)


def expect2(f, K1, K2, K12):
    """E[f(u, v)] for (u, v) zero-mean Gaussian, Var u = K1, Var v = K2, Cov = K12.

    Nested exp-sinh rules: u = sqrt(K1) z1 and, given z1,
    v ~ N(rho sqrt(K2) z1, K2 (1 - rho^2)) with rho = K12 / sqrt(K1 K2)
    (clipped to [-1, 1]); the inner rule is centred where v = 0, so kinks at
    u = 0 or v = 0 are harmless. ``f`` is a vectorised numpy function of two arrays.
    Broadcasts over K1, K2, K12 (one nested rule per point). Refined like
    :func:`expect`, but at most 3 times (step 1/256, 4M evaluations of f per
    point), so strongly oscillating integrands (sin at K >~ 30) warn.
    ValueError if K1 or K2 < 0 or |K12| > sqrt(K1 K2).
    """
    K1, K2, K12 = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (K1, K2, K12)))
    _check_variances(K1, K2, K12, names=("K1", "K2", "K12"))
    out = np.empty(K1.shape)
    failed = 0
    for idx in np.ndindex(K1.shape):
        k1, k2, k12 = K1[idx], K2[idx], K12[idx]
        denom = np.sqrt(k1 * k2)
        rho = 0.0 if denom == 0 else float(np.clip(k12 / denom, -1.0, 1.0))
        sd_v = np.sqrt(max(k2 * (1.0 - rho * rho), 0.0))
        for level in range(_MAX_LEVEL_2D + 1):
            u, w, even = _rule(level)
            z = np.concatenate([u, -u])
            wz = np.concatenate([w, w])
            ev = np.concatenate([even, even])
            # The inner rule (over z2) is centred where v = 0, the place where
            # activations have their kink or transition, as the one-point rule
            # is centred at h = 0; reweighting phi(c + z)/phi(z) keeps it exact
            # for the Gaussian. Centres beyond |c| = 8 stay at 0: a feature there
            # has weight < e^-32, and a farther centre would sample the
            # Gaussian itself too sparsely.
            mean_v = rho * np.sqrt(k2) * z
            with np.errstate(divide="ignore", invalid="ignore"):
                c = np.where(sd_v > 0, -mean_v / sd_v, 0.0)
            c = np.where(np.abs(c) <= _MAX_CENTRE, c, 0.0)[:, None]
            v = mean_v[:, None] + sd_v * (c + z[None, :])
            w2 = wz[None, :] * np.exp(-0.5 * c * c - c * z[None, :])
            with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
                vals = np.broadcast_to(f(np.sqrt(k1) * z[:, None], v), v.shape)
                inner = np.sum(vals * w2, axis=1)
                total = wz @ inner
                inner_half = 2.0 * np.sum(vals[:, ev] * w2[:, ev], axis=1)
                half = 2.0 * (wz[ev] @ inner_half[ev])
                delta = _relative(total - half, wz @ np.sum(np.abs(vals) * w2, axis=1))
            out[idx] = total
            if _accept(delta, level) or not np.isfinite(total):
                break
        else:
            failed += 1
    if failed:
        _not_converged("expect2", failed)
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
        if sp.expand(body.subs(var, -var) + body) == 0:  # odd integrand, symmetric Gaussian
            return sp.Integer(0)
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
        if not isinstance(f, sp.Lambda):
            return None
        if not f.expr.has(*f.variables):
            return f.expr
        if K12 == 0:
            # uncorrelated Gaussians are independent: a product integrand factorises
            a, b = f.variables
            parts = sp.Mul.make_args(f.expr)
            fa = sp.Mul(*[p for p in parts if not p.has(b)])
            fb = sp.Mul(*[p for p in parts if p.has(b)])
            if not fb.has(a):
                return GaussianExpectation(sp.Lambda(a, fa), K1) * GaussianExpectation(sp.Lambda(b, fb), K2)
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
