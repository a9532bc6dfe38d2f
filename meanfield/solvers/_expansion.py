r"""The recursion's derivatives in K as mpmath functions: Taylor series at a fixed point, and
critical points refined in 40 digits.

Shared by :mod:`.lines` (stability of fixed points, critical points) and :mod:`.exponents`
(the scaling exponents at a critical point read off the series' coefficients): the
expansion dK' = dK - c2 dK^2 - c3 dK^3, chi_J = chi_J* - d1 dK of the partial-Jacobian
paper (appendix D, the coefficients of Recursion.series).
"""
from __future__ import annotations

import json
import os
from functools import lru_cache

import numpy as np

from ..calculus import Architecture
from ._common import uses_quadrature


@lru_cache(maxsize=64)
def _derivatives(arch: Architecture, order: int, float64_expectations: bool = False):
    """mpmath functions of (K, sigma_w, sigma_b, mu, eps) for d^n F/dK^n (n <= order) and d^n chi_J/dK^n
    (n <= min(order, 1)).

    Their one-point Gaussian expectations are mpmath quadratures at 30 digits, or, with
    ``float64_expectations``, the package's float64 engine (:func:`meanfield.gaussian.quad1`, an
    error below 1e-10 of E|f|; mpmath where it does not converge): the high derivatives of an
    activation without a closed form are large expressions, ~20 ms per mpmath node (a GELU-tanh
    series took ~90 s that way).

    Deriving them takes sympy ~0.5-1.5 s, so their mpmath source is kept on disk next to the
    architecture's generated module (same key: everything the recursion depends on) and a
    later process only re-executes it (:func:`_derivatives_source`, :func:`_derivatives_load`).
    """
    path = _derivatives_path(arch, order)
    if path is not None:
        try:
            return _derivatives_load(json.loads(path.read_text()), float64_expectations)
        except (OSError, ValueError, KeyError, TypeError, SyntaxError):
            pass  # absent or unreadable: derive (and rewrite) it
    spec = _derivatives_source(arch, order)
    if path is not None:
        try:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(spec))
            os.replace(tmp, path)  # atomic: a concurrent process never reads half a file
        except OSError:
            pass  # a read-only cache only costs the next process the derivation
    return _derivatives_load(spec, float64_expectations)


#: the layout of _derivatives_source's output: bump it when that function changes (the key covers
#: the recursion's sources, not this module)
_SERIES_FORMAT = 2


def _derivatives_path(arch, order):
    """The on-disk cache of :func:`_derivatives` (None where the architecture has no module key)."""
    from ..numeric import cache_dir, cache_key

    try:
        return cache_dir() / f"meanfield_expr_{cache_key(arch)}.series{int(order)}-v{_SERIES_FORMAT}.json"
    except Exception:  # a cache is an optimisation: derive without it
        return None


def _derivatives_source(arch: Architecture, order: int) -> dict:
    """The sympy derivatives printed as mpmath source (what sympy's lambdify runs):
    {"F": [...], "X": [...]}, each entry {"src": the function's source, "ge": [one-point
    expectations (name, integrand source, its breakpoints as srepr)], "ge2": [two-point ones]}."""
    import inspect

    import sympy as sp

    from .. import symbols as S
    from ..gaussian import GaussianExpectation, GaussianExpectation2, pieces
    from ..symbolic import recursion

    rec = recursion(arch)
    args = (S.K, S.sigma_w, S.sigma_b, S.mu, S.eps)

    def entry(e):
        # unevaluated expectations -> named functions computed by mpmath quadrature (see _derivatives_load)
        repl, ge, ge2 = {}, [], []
        for i, g in enumerate(e.atoms(GaussianExpectation)):
            f = sp.lambdify(g.args[0].variables, g.args[0].expr, modules="mpmath")
            cuts = pieces(g.args[0]).cuts  # kinks of user activations: split mpmath's quadrature there
            ge.append({"name": f"_mf_ge{i}", "src": inspect.getsource(f), "cuts": [sp.srepr(c) for c in cuts],
                       "integrand": sp.srepr(g.args[0])})
            repl[g] = sp.Function(f"_mf_ge{i}")(g.args[1])
        for i, g in enumerate(e.atoms(GaussianExpectation2)):
            f = sp.lambdify(g.args[0].variables, g.args[0].expr, modules="mpmath")
            ge2.append({"name": f"_mf_ge2_{i}", "src": inspect.getsource(f)})
            repl[g] = sp.Function(f"_mf_ge2_{i}")(*g.args[1:])
        fn = sp.lambdify(args, e.xreplace(repl), modules="mpmath")
        return {"src": inspect.getsource(fn), "ge": ge, "ge2": ge2}

    # chi_J: at most its first derivative (d1 of the series; more was never used)
    return {name: [entry(sp.diff(e, S.K, n) if n else e) for n in range(top + 1)]
            for name, e, top in (("F", rec.kernel, order), ("X", rec.chi_J, min(order, 1)))}


@lru_cache(maxsize=1)
def _mpmath_namespace() -> dict:
    """The globals sympy's lambdify gives an mpmath function (mpmath plus its translations)."""
    import sympy as sp

    ns = dict(sp.lambdify((), 0, modules="mpmath").__globals__)
    ns.pop("_lambdifygenerated", None)
    return ns


def _float64_expect(integrand, f, cuts):
    """E[f(h)], h ~ N(0, K), as a function of an mpmath K: the float64 engine on the sympy ``integrand``
    (compiled by :func:`~meanfield.gaussian.numpy_function` at the first call), mpmath quadrature of the
    mpmath function ``f`` where the engine does not converge."""
    import mpmath as mp

    from ..gaussian import mp_expect, numpy_function, quad1

    compiled = []
    float_cuts = tuple(float(c) for c in cuts)

    def expect(K):
        k = float(K)
        if k > 0:
            if not compiled:
                compiled.append(numpy_function(integrand))
            value, _, _, converged = quad1(compiled[0], np.sqrt(k), float_cuts)
            if converged and np.isfinite(value):
                return mp.mpf(value)
        return mp_expect(f, K, dps=30, cuts=cuts)

    return expect


def _derivatives_load(spec: dict, float64_expectations: bool = False) -> dict:
    """{"F": [functions], "X": [functions]} from :func:`_derivatives_source`'s output."""
    from ..gaussian import mp_expect, mp_expect2

    def run(src, extra):
        ns = dict(_mpmath_namespace())
        ns.update(extra)
        exec(compile(src, "<meanfield derivative>", "exec"), ns)
        return ns["_lambdifygenerated"]

    def function(d):
        extra = {}
        for g in d["ge"]:
            import sympy as sp

            f = run(g["src"], {})
            cuts = tuple(sp.sympify(c) for c in g["cuts"])
            if float64_expectations:
                extra[g["name"]] = _float64_expect(sp.sympify(g["integrand"]), f, cuts)
            else:
                extra[g["name"]] = lambda K, f=f, cuts=cuts: mp_expect(f, K, dps=30, cuts=cuts)
        for g in d["ge2"]:
            f = run(g["src"], {})
            extra[g["name"]] = lambda a, b, c, f=f: mp_expect2(f, a, b, c, dps=25)
        return run(d["src"], extra)

    return {name: [function(d) for d in spec[name]] for name in ("F", "X")}


def _series(arch, K, sw, sb, order=3):
    """Taylor coefficients at K* (the expansion of Recursion.series), evaluated with mpmath (its
    Gaussian expectations by the float64 engine, to ~1e-13: :func:`_derivatives`).

    Returns (c2, c3, d1) of dK' = dK - c2 dK^2 - c3 dK^3 and chi_J = chi_J* - d1 dK.
    """
    import mpmath as mp

    try:
        fs = _derivatives(arch, order, float64_expectations=True)
        with mp.workdps(30):
            vals = (mp.mpf(K), mp.mpf(sw), mp.mpf(sb), mp.mpf(arch.mu or 0), mp.mpf(arch.eps or 0))
            a = [fs["F"][n](*vals) / mp.factorial(n) for n in range(order + 1)]
            b = [fs["X"][n](*vals) / mp.factorial(n) for n in range(2)]
        return float(-a[2]), float(-a[3]), float(-b[1])
    except (TypeError, ValueError, ZeroDivisionError, AttributeError, NameError):
        return (np.nan, np.nan, np.nan)


def _polish_critical(arch, K, W, T):
    """(K*, W*, T*) of a critical point, refined in 40-digit mpmath and rounded once to float64.

    The float64 Newton of ``newton_point`` stops within a few ulp of the
    critical point, and where it lands depends on how the compiled
    expressions round: the critical point is the tangency of F(K) = K with
    chi_K = 1, so a rounding of F' by one ulp moves (sigma_w, sigma_b) by
    |zeta| ulp (GELU: zeta = -65, a shift of 3e-14 when one arcsin was
    rewritten as an arctangent). Newton on (K, sigma_w, sigma_b) for
    F - K = chi_K - 1 = chi_J - 1 = 0 with the mpmath forms of
    :func:`_derivatives` (d/dK analytic, d/dsigma by central differences of
    step 1e-15, exact to 1e-30) makes the answer independent of that.
    Closed-form recursions only (one mpmath quadrature per evaluation makes
    the others ~1 s per point); where the refinement does not converge, or
    moves the point by more than 1e-10, the float64 point is kept.
    """
    import mpmath as mp

    if not (np.isfinite(K) and K > 0 and W > 0 and T >= 0) or uses_quadrature(arch):
        return K, W, T
    try:
        fs = _derivatives(arch, 3)   # the order _series uses: one derivation, one cache file
        with mp.workdps(40):
            mu, eps = mp.mpf(arch.mu or 0), mp.mpf(arch.eps or 0)

            def resid(k, sw, sb):
                v = (k, sw, sb, mu, eps)
                return mp.matrix([fs["F"][0](*v) - k, fs["F"][1](*v) - 1, fs["X"][0](*v) - 1])

            x = mp.matrix([mp.mpf(K), mp.sqrt(mp.mpf(W)), mp.sqrt(mp.mpf(T))])
            h = mp.mpf(10) ** -15
            for _ in range(4):
                k, sw, sb = x
                v = (k, sw, sb, mu, eps)
                r = resid(k, sw, sb)
                J = mp.matrix(3, 3)
                J[0, 0], J[1, 0], J[2, 0] = fs["F"][1](*v) - 1, fs["F"][2](*v), fs["X"][1](*v)
                for j, e in ((1, mp.matrix([0, h, 0])), (2, mp.matrix([0, 0, h]))):
                    d = (resid(*(x + e)) - resid(*(x - e))) / (2 * h)
                    for i in range(3):
                        J[i, j] = d[i]
                step = mp.lu_solve(J, -r)
                x = x + step
                if mp.norm(step) <= mp.mpf(10) ** -32 * mp.norm(x):
                    break
            else:
                return K, W, T
            k, sw, sb = (float(t) for t in x)
            W1, T1 = float(x[1] ** 2), float(x[2] ** 2)
    except (TypeError, ValueError, ZeroDivisionError, ArithmeticError, AttributeError, NameError):
        return K, W, T
    if (np.isfinite([k, W1, T1]).all() and abs(k - K) <= 1e-10 * K and abs(W1 - W) <= 1e-10 * W
            and abs(T1 - T) <= 1e-10 * max(T, W)):
        return k, W1, T1
    return K, W, T
