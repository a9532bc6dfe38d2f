"""The compiled Gaussian-expectation engine: one numba compilation for every integrand.

E[f(h)], h ~ N(0, K) (:func:`one_point`), and E[f(u, v)] for a zero-mean
Gaussian pair (:func:`two_point`, the nested rule of
:func:`meanfield.gaussian.expect2`), both NaN where the rule does not
converge (which the solvers report). The rule is
:mod:`meanfield.quadrature_rule`'s, its nodes collected per level and the
integrand called once per level over all of them.

How a generated module (:mod:`meanfield.numeric`) uses it, and why so:

- its integrands are C functions over a batch of nodes (numba ``cfunc``,
  cached; :data:`ONE_POINT_SIGNATURE`, :data:`TWO_POINT_SIGNATURE`),
  registered under a name that holds the module's cache key (:func:`register`);
- its code passes an integrand to :func:`one_point` / :func:`two_point` by
  that name (:func:`symbol_address`, resolved when the code is loaded);
- those call the engine, compiled once in this module, through the C
  symbols ``meanfield_expect1`` and ``meanfield_expect2``.

Nothing of the engine is compiled into a generated module, and nothing in
one holds an address of this process, so numba caches it: a new activation
compiles its integrands and its expressions, not the engine (pasted into
every module, once per expectation, the engine had cost 30-55 s of
compilation per quadrature network; benchmarks/README.md, ``compile_time``). A jitted function passed as a value,
or a function pointer known at compile time, would be compiled in as an
address of this process, which numba refuses to cache.

Imports numba: the interpreted engine never imports this module (the
interpreted twins of generated modules use the numpy engine,
:func:`meanfield.gaussian.interpreted_expect`).
"""
import math

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import quadrature_rule as rule
from ._cache import install_locator
from .gaussian import (QUAD_ES_T, QUAD_MAX_LEVEL, QUAD_MAX_LEVEL_2D, QUAD_STEP, QUAD_TOL_BASE, QUAD_TOL_BASE_1D,
                       QUAD_TOL_REFINED, QUAD_TS_T, QUAD_ZMAX, quad_tables)

install_locator()  # numba's cache of the engine goes to meanfield's cache folder, never the package

__all__ = ["one_point", "two_point", "symbol_address", "register", "scalar_engine", "ONE_POINT_SIGNATURE",
           "TWO_POINT_SIGNATURE"]

_JIT = dict(cache=True, error_model="numpy", nogil=True)
_CFUNC = dict(cache=True, error_model="numpy", nopython=True)

#: the integrands' C signatures, over a batch of nodes (one call per level and piece set, not per
#: node: an indirect call per node cost ~25 % of a one-point expectation):
#: void f(double *h, double *out, int64 n), out[i] = f(h[i]); void f(double u, double *v, double *out,
#: int64 n), out[i] = f(u, v[i])
ONE_POINT_SIGNATURE = types.void(types.CPointer(types.float64), types.CPointer(types.float64), types.intp)
TWO_POINT_SIGNATURE = types.void(types.float64, types.CPointer(types.float64), types.CPointer(types.float64),
                                 types.intp)


# ---------------------------------------------------------------------------
# C-level glue: call a C function at an address, name a symbol's address.
# ---------------------------------------------------------------------------
@intrinsic
def _call1(typingctx, address, h, out, n):
    """out[i] = f(h[i]), i < n, by the C function ``void f(double *h, double *out, int64 n)`` at
    ``address`` (addresses as integers)."""
    def codegen(context, builder, signature, args):
        dp = ir.PointerType(ir.DoubleType())
        fnty = ir.FunctionType(ir.VoidType(), [dp, dp, ir.IntType(64)])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()),
                     [builder.inttoptr(args[1], dp), builder.inttoptr(args[2], dp), args[3]])
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.intp, types.intp), codegen


@intrinsic
def _call2(typingctx, address, u, v, out, n):
    """out[i] = f(u, v[i]), i < n, by the C function ``void f(double u, double *v, double *out,
    int64 n)`` at ``address``."""
    def codegen(context, builder, signature, args):
        dp = ir.PointerType(ir.DoubleType())
        fnty = ir.FunctionType(ir.VoidType(), [ir.DoubleType(), dp, dp, ir.IntType(64)])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()),
                     [args[1], builder.inttoptr(args[2], dp), builder.inttoptr(args[3], dp), args[4]])
        return context.get_dummy_value()
    return types.void(types.intp, types.float64, types.intp, types.intp, types.intp), codegen


@intrinsic
def _f64_pointer(typingctx, address):
    """The integer ``address`` as a float64 pointer (for :func:`numba.carray`)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.DoubleType()))
    return types.CPointer(types.float64)(types.intp), codegen


@intrinsic(prefer_literal=True)
def symbol_address(typingctx, name):
    """The address of the C symbol ``name`` (a string literal), resolved by the JIT linker when
    the code is loaded, so that compiled code that holds it can be cached (see :func:`register`)."""
    if not isinstance(name, types.StringLiteral):
        return None
    symbol = name.literal_value

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.DoubleType(), [ir.DoubleType()])  # the type is immaterial: only the address is used
        fn = cgutils.get_or_insert_function(builder.module, fnty, symbol)
        return builder.ptrtoint(fn, ir.IntType(64))
    return types.intp(name), codegen


def register(name: str, function) -> None:
    """Make the compiled C function ``function`` (a numba ``cfunc``) the symbol ``name`` for the
    JIT linker: code that calls :func:`symbol_address` with that name, compiled now or loaded
    from numba's cache, finds it. Register before such code is compiled or loaded."""
    llvm.add_symbol(name, function.address)


_ES_TAB, _TS_TAB = quad_tables()
_ES_LO, _ES_HI = QUAD_ES_T

# the rule's helpers, compiled as they are written
_seg_range = njit(**_JIT)(rule.seg_range)
_es_node = njit(**_JIT)(rule.es_node)
_ts_node = njit(**_JIT)(rule.ts_node)
_breaks = njit(**_JIT)(rule.breaks)
_scale_cuts = njit(**_JIT)(rule.scale_cuts)
_update = njit(**_JIT)(rule.update)


def _segment_sums(F_):
    """The weighted sums of ``F_(ctx, h)`` (value, scale, error) over the nodes of one segment
    of the rule: the exp-sinh tails from the outer breakpoints and the tanh-sinh pieces between
    them (the loops of :func:`meanfield.quadrature_rule.segment`). The segment's nodes are
    collected first and passed to ``F_`` at once; the sums then run in the rule's node order."""

    @njit(**_JIT)
    def sums(ctx, s, zc, seg, h0, es_lo, es_hi, ts_t, tab, es_tab, ts_tab):
        m = zc.size
        lo = zc[0]
        hi = zc[m - 1]
        e0, e1, edk, estep = _seg_range(seg, h0, es_lo, es_hi)
        t0, t1, tdk, tstep = _seg_range(seg, h0, -ts_t, ts_t)
        cap = 2 * len(range(e0, e1, edk)) + (m - 1) * len(range(t0, t1, tdk))
        hs = np.empty(cap)
        ws = np.empty(cap)
        n = 0
        for k in range(e0, e1, edk):
            if seg <= 1 and tab:
                u = es_tab[k, 0]
                w = es_tab[k, 1]
            else:
                u, w = _es_node(es_lo + estep * k, estep)
            if w > 0.0:
                wl = w * np.exp(lo * u - 0.5 * lo * lo) if lo != 0.0 else w
                if wl > 0.0:
                    hs[n] = s * (lo - u)
                    ws[n] = wl
                    n += 1
                wr = w * np.exp(-hi * u - 0.5 * hi * hi) if hi != 0.0 else w
                if wr > 0.0:
                    hs[n] = s * (hi + u)
                    ws[n] = wr
                    n += 1
        if m > 1:
            for k in range(t0, t1, tdk):
                if seg <= 1 and tab:
                    sk = ts_tab[k, 0]
                    ck = ts_tab[k, 1]
                    wk = ts_tab[k, 2]
                else:
                    sk, ck, wk = _ts_node(-ts_t + tstep * k, tstep)
                for j in range(m - 1):
                    a = zc[j]
                    b = zc[j + 1]
                    L = b - a
                    z = a + L * sk if sk <= 0.5 else b - L * ck
                    ww = L * wk * np.exp(-0.5 * z * z) * 0.3989422804014327
                    if ww > 0.0:
                        hs[n] = s * z
                        ws[n] = ww
                        n += 1
        v, va, ve = F_(ctx, hs[:n])
        part = 0.0
        part_abs = 0.0
        part_err = 0.0
        for i in range(n):
            part += v[i] * ws[i]
            part_abs += va[i] * ws[i]
            part_err += ve[i] * ws[i]
        return part, part_abs, part_err

    return sums


def scalar_engine(F_):
    """The engine's loops with the integrand form ``F_`` compiled in.

    The loops of :func:`meanfield.quadrature_rule.quad_levels` (same nodes,
    weights and convergence test, summed node by node). ``F_(ctx, h)``
    returns the arrays (f(h), its scale |f|(h), its error) for an array of nodes h. ``F_`` is
    a closure variable, not an argument: numba calls it directly, and the
    compiled loops stay cacheable (a jitted function passed as an argument
    value is compiled in as a process address). This module builds the
    three forms it needs, once each."""
    sums = _segment_sums(F_)

    @njit(**_JIT)
    def levels(ctx, s, cuts, h0, es_lo, es_hi, ts_t, zmax, max_level, tol0, tol, es_tab, ts_tab):
        """E[F_(ctx, s z)], z ~ N(0, 1), split at z = 0 and cuts / s: (value, E[scale],
        relative error estimate, converged).
        ``es_tab``, ``ts_tab``: the nodes and weights of the base rule (step h0:
        segments 0 and 1) from base_tables, so that the common case, accepted
        at the base level, computes no node; refined levels compute theirs."""
        if not s > 0.0:
            v, va, ve = F_(ctx, np.array([1e-300, -1e-300]))
            return 0.5 * (v[0] + v[1]), 0.5 * (va[0] + va[1]), 0.0, 0.5 * (ve[0] + ve[1]) <= tol * 0.5 * (va[0] + va[1])
        zc = _breaks(s, cuts, zmax)
        # the tables hold the base rule of exactly this h0 and t range (else they are not used)
        tab = (es_tab.shape[0] == _seg_range(1, h0, es_lo, es_hi)[1]
               and ts_tab.shape[0] == _seg_range(1, h0, -ts_t, ts_t)[1])
        total = 0.0
        total_abs = 0.0
        total_err = 0.0
        delta = np.inf
        for seg in range(max_level + 2):
            part, part_abs, part_err = sums(ctx, s, zc, seg, h0, es_lo, es_hi, ts_t, tab, es_tab, ts_tab)
            total, total_abs, total_err, delta, state = _update(seg, part, part_abs, part_err, total, total_abs,
                                                                total_err, tol0, tol)
            if state != 0:
                return total, total_abs, delta, state == 1
        return total, total_abs, delta, False

    return levels


# ---------------------------------------------------------------------------
# The three integrand forms F_(ctx, h) of scalar_engine.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _one_point(ctx, h):
    """F_ of E[f(h)]: ctx = (address of f,)."""
    v = np.empty(h.size)
    _call1(ctx[0], h.ctypes.data, v.ctypes.data, h.size)
    return v, np.abs(v), np.zeros(h.size)


@njit(**_JIT)
def _inner(ctx, h):
    """F_ of the inner level of E[f(u, v)]: f(u, m + h), h = v - m ~ N(0, sd^2); ctx = (address of f, u, m)."""
    f, u, m = ctx
    vs = m + h
    r = np.empty(h.size)
    _call2(f, u, vs.ctypes.data, r.ctypes.data, h.size)
    return r, np.abs(r), np.zeros(h.size)


one_point_levels = scalar_engine(_one_point)
_inner_levels = scalar_engine(_inner)


@njit(**_JIT)
def _outer(ctx, us):
    """F_ of the outer level: (E[f(u, v) | u], E[|f(u, v)| | u], error) at each node u, the error
    the inner level's estimate times its scale where it did not converge; ctx = (f, cv, a, sd)
    with v | u ~ N(a u, sd^2), split at v in cv."""
    f, cv, a, sd = ctx
    val = np.empty(us.size)
    scale = np.empty(us.size)
    err = np.empty(us.size)
    for i in range(us.size):
        m = a * us[i]
        val[i], scale[i], delta, ok = _inner_levels((f, us[i], m), sd, cv - m, QUAD_STEP, _ES_LO, _ES_HI,
                                                    QUAD_TS_T, QUAD_ZMAX, QUAD_MAX_LEVEL_2D, QUAD_TOL_BASE,
                                                    QUAD_TOL_REFINED, _ES_TAB, _TS_TAB)
        err[i] = 0.0 if ok else delta * scale[i]
    return val, scale, err


_outer_levels = scalar_engine(_outer)


# ---------------------------------------------------------------------------
# The engine's entry points: C functions, called by symbol (compiled once, here).
# ---------------------------------------------------------------------------
@cfunc(types.float64(types.intp, types.intp, types.intp, types.float64), **_CFUNC)
def _expect1(f, cuts_address, n_cuts, K):
    """E[f(h)], h ~ N(0, K): the one-point engine of :func:`meanfield.gaussian.expect`.

    ``f``: the address of the integrand's C function; ``cuts_address``, ``n_cuts``: the breakpoints of f in h (plus, at sqrt(K) > 1e3, h = +-1, +-8, +-40:
    :func:`meanfield.quadrature_rule.scale_cuts`). NaN where K is not >= 0 or the rule
    did not converge at its finest level."""
    if not K >= 0.0:
        return math.nan
    cuts = carray(_f64_pointer(cuts_address), n_cuts)
    s = math.sqrt(K)
    val, scale, delta, ok = one_point_levels((f,), s, _scale_cuts(cuts, s), QUAD_STEP, _ES_LO, _ES_HI,
                                        QUAD_TS_T, QUAD_ZMAX, QUAD_MAX_LEVEL, QUAD_TOL_BASE_1D, QUAD_TOL_REFINED,
                                        _ES_TAB, _TS_TAB)
    return val if ok else math.nan


@cfunc(types.float64(types.intp, types.intp, types.intp, types.intp, types.intp, types.float64, types.float64,
                     types.float64), **_CFUNC)
def _expect2(f, cu_address, n_cu, cv_address, n_cv, K1, K2, K12):
    """E[f(u, v)] for a zero-mean Gaussian pair, Var u = K1, Var v = K2, Cov = K12.

    The nested engine of :func:`meanfield.gaussian.expect2`: the outer level over
    u = sqrt(K1) z1, split at u = 0 and ``cu``; the inner over v given u,
    v = m + sd z with m = rho sqrt(K2) z1 and sd = sqrt(K2 (1 - rho^2)), split at v in
    ``cv`` (0 and the breakpoints in v). Each level refines at most QUAD_MAX_LEVEL_2D
    times; NaN unless the outer level converges and the inner errors sum to below
    QUAD_TOL_REFINED of E|f|."""
    if not (K1 >= 0.0 and K2 >= 0.0 and K12 == K12):
        return math.nan
    cu = carray(_f64_pointer(cu_address), n_cu)
    cv = carray(_f64_pointer(cv_address), n_cv)
    d = math.sqrt(K1 * K2)
    rho = 0.0
    if d > 0.0:
        rho = min(1.0, max(-1.0, K12 / d))
    s1 = math.sqrt(K1)
    a = rho * math.sqrt(K2) / s1 if s1 > 0.0 else 0.0
    sd = math.sqrt(max(K2 * (1.0 - rho * rho), 0.0))
    cuo = cu
    if a != 0.0 and sd < 0.1 * abs(a) * s1:
        # nearly degenerate: g's breakpoints c != 0 in v sit at u = c / a (gaussian._outer_cuts)
        extra = np.empty(cv.size)
        n = 0
        for c in cv:
            if c != 0.0 and not np.any(cu == c / a):
                extra[n] = c / a
                n += 1
        if n:
            cuo = np.concatenate((cu, extra[:n]))
    val, scale, delta, ok = _outer_levels((f, cv, a, sd), s1, cuo, QUAD_STEP, _ES_LO, _ES_HI, QUAD_TS_T,
                                        QUAD_ZMAX, QUAD_MAX_LEVEL_2D, QUAD_TOL_BASE, QUAD_TOL_REFINED, _ES_TAB,
                                        _TS_TAB)
    return val if ok else math.nan


register("meanfield_expect1", _expect1)
register("meanfield_expect2", _expect2)
_EXPECT1 = types.ExternalFunction("meanfield_expect1", _expect1._sig)
_EXPECT2 = types.ExternalFunction("meanfield_expect2", _expect2._sig)


@njit(**_JIT)
def one_point(f, cuts, K):
    """E[f(h)], h ~ N(0, K), for the registered integrand at address ``f``
    (:func:`symbol_address`) with breakpoints ``cuts`` (float64 array, in h); NaN where K is not
    >= 0 or the rule did not converge at its finest level."""
    return _EXPECT1(f, cuts.ctypes.data, cuts.size, K)


@njit(**_JIT)
def two_point(f, cu, cv, K1, K2, K12):
    """E[f(u, v)], Var u = K1, Var v = K2, Cov(u, v) = K12, for the registered integrand at
    address ``f``, with breakpoints ``cu`` in u and ``cv`` in v (0 included); NaN where the nested
    rule did not converge."""
    return _EXPECT2(f, cu.ctypes.data, cu.size, cv.ctypes.data, cv.size, K1, K2, K12)
