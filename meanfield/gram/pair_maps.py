"""The block's pair map: the primitives' ``gram`` rules pushed through sympy, compiled to numpy.

Shared by the walks of :mod:`meanfield.gram` (pairs, the batch, the tokens): the compiled maps and their
cache, the numpy namespace that keeps arccos / sqrt finite near correlation +-1, and the gap helpers
(module notes of :mod:`meanfield.gram`, Numerics).
"""
from __future__ import annotations

import functools

import numpy as np
import sympy as sp

from .. import symbols as S
from .._validate import check_choice

__all__ = ["PARAMETERIZATIONS", "gram_map"]

PARAMETERIZATIONS = ("ntk", "standard")

_K1, _K2, _K12, _T12, _GAP = sp.symbols("K1 K2 K12 Theta12 gap12")
_WIDTH = sp.Symbol("n_width")
_ARGS = (_K1, _K2, _K12, _T12, S.sigma_w, S.sigma_b, _WIDTH)
_ARGS_GAP = (_K1, _K2, _K12, _T12, _GAP, S.sigma_w, S.sigma_b, _WIDTH)


# ---------------------------------------------------------------------------
# The block map, from the tree.
# ---------------------------------------------------------------------------
def _clip1(a):
    return np.clip(a, -1.0, 1.0)


def _corr(a):
    # arccos has infinite slope at +-1: a correlation that should be exactly +-1 (the diagonal after
    # a LayerNorm, K / sqrt(K K); parallel inputs of different norms) but rounds to 1 - 1e-16 gives
    # arccos = 1.5e-8 and an NTK error of 2e-9 relative (found against neural-tangents). Within
    # 1e-15 of +-1 the correlation is taken as +-1, everywhere it appears in the expression (the
    # arccos and the sqrt((1 - rho)(1 + rho)) next to it must see the same number): an error of at
    # most sqrt(2e-15)/(2 pi) = 7e-9 for inputs that truly are that close, the size rounding alone
    # gives them anyway.
    a = _clip1(a)
    return np.where(np.abs(a) >= 1.0 - 1e-15, np.sign(a), a)


def _one_minus(r, s):
    # 1 - r from the exact gap s = 1 - r^2 (activations.one_minus); r = -1 divides by 0 in the branch not taken
    return np.where(r > 0, s / (1 + r), 1 - r)


def _one_minus2(ra, sa, rb, sb):
    # 1 - ra rb from the gaps (activations.one_minus_product)
    p = ra * rb
    aa = np.abs(ra)
    return np.where(p > 0, sa / (1 + aa) + aa * (sb / (1 + np.abs(rb))), 1 - p)


def _naive_gap(K1, K2, K12):
    """1 - rho^2 from rounded kernels (what a block whose rules do not all carry the gap leaves)."""
    r = _clip1(K12 / np.sqrt(K1 * K2))
    return np.maximum((1 - r) * (1 + r), 0.0)


def _input_gap(a, b, dot, da, db):
    r"""1 - rho^2 of every pair of rows of a, b (float64, as given), accurate near rho = +-1.

    1 - rho^2 = |x' - c x|^2 / |x'|^2 with c = x.x' / |x|^2: the perpendicular part, projected out
    twice (an error dc in c only adds dc^2 |x|^2, as the parts are orthogonal), so the angle is right
    to ~1e-16 absolute (from 1 - (x.x')^2 / (|x|^2 |x'|^2) it is ~1e-16 / theta). Done only for
    pairs whose rounded gap is below 1e-2; a zero row has no angle (its pair's gap is unused: 1).
    """
    with np.errstate(all="ignore"):
        r = _clip1(dot / np.sqrt(da[:, None] * db[None, :]))
        gap = (1 - r) * (1 + r)
    zero = (da[:, None] == 0) | (db[None, :] == 0)
    gap[zero] = 1.0
    i, j = np.nonzero(gap < 1e-2)
    if i.size:
        x, y = a[i], b[j]
        p = y - (np.einsum("ij,ij->i", x, y) / da[i])[:, None] * x
        p -= (np.einsum("ij,ij->i", x, p) / da[i])[:, None] * x
        gap[i, j] = np.minimum(np.einsum("ij,ij->i", p, p) / db[j], 1.0)
    return gap


#: pairs whose gap 1 - rho^2 is below this (|rho| > 0.9995) go through the map that carries it exactly; the others
#: (theta > 0.03: the rounded rho gives theta to ~3e-15 absolute) through the map of (K1, K2, K12) alone
_NEAR = 1e-3


def _sqrt0(a):
    # only variances that vanish at correlation 1 (K1 K2 - K12^2) can round below 0
    return np.sqrt(np.maximum(a, 0.0))


def _safe(expr):
    """acos/asin of clipped arguments, square roots of non-negative parts (see the module notes).

    Not inside the integrands (Lambdas) of Gaussian expectations: those are evaluated by their own
    engines, without this namespace (gelu_tanh's sqrt(2) became _mf_sqrt(2) there: NameError); their
    variance arguments are rewritten like the rest."""
    hidden = {lam: sp.Dummy() for lam in sp.sympify(expr).atoms(sp.Lambda)}
    if hidden:
        return _safe(expr.xreplace(hidden)).xreplace({d: lam for lam, d in hidden.items()})
    acos, asin, sqrt = sp.Function("_mf_acos"), sp.Function("_mf_asin"), sp.Function("_mf_sqrt")
    corr = sp.Function("_mf_corr")
    # (each replace rebuilds the whole tree: only where there is something to replace)
    rhos = {e.args[0] for e in expr.atoms(sp.acos)}
    if rhos:
        expr = expr.xreplace({**{r: corr(r) for r in rhos}, **{-r: -corr(r) for r in rhos}})
        expr = expr.replace(lambda e: isinstance(e, sp.acos), lambda e: acos(e.args[0]))
    if expr.has(sp.asin):
        expr = expr.replace(lambda e: isinstance(e, sp.asin), lambda e: asin(e.args[0]))

    return _half_powers(sp.sympify(expr), sqrt, {})


def _half_powers(e, sqrt, memo):
    """b**(k/2) -> sqrt(b)**k throughout e, bottom-up, each shared subtree once (memo): sympy's replace took
    seconds over GELU's gap map."""
    out = memo.get(e)
    if out is not None:
        return out
    if not e.args or isinstance(e, (sp.Number, sp.Symbol)):
        out = e
    else:
        args = tuple(_half_powers(a, sqrt, memo) for a in e.args)
        if isinstance(e, sp.Pow) and e.exp.is_Rational and e.exp.q == 2:
            out = sqrt(args[0]) ** (2 * e.exp)
        elif args == e.args:
            out = e
        else:
            out = e.func(*args)
    memo[e] = out
    return out


def _checked_spec(arch, tokens_ok=False):
    from ..calculus import as_architecture

    spec = as_architecture(arch)
    if spec.has_tokens and not tokens_ok:
        raise ValueError("arch acts along tokens (ResMLP / MLP-Mixer): its state over images is two (nT) x (nT) "
                         "matrices, not a pair map; use meanfield.kernels on images x of shape (n, T, d) "
                         "(meanfield.gram.tokens)")
    spec.require_values("kernels")
    return spec


def _values(spec) -> tuple:
    """The numeric structural parameters (mu, eps) as a hashable tuple."""
    return tuple(sorted(spec.parameters().items(), key=lambda kv: str(kv[0])))


def _lambdify(args, exprs):
    from ..gaussian import GaussianExpectation2
    from ..gaussian import numeric_expectations

    exprs = [_safe(e) for e in exprs]
    vectorised = {}
    if any(sp.sympify(e).has(GaussianExpectation2) for e in exprs):
        # two-point moments of products f(u) g(v) over whole arrays (the Hermite series with error
        # control, meanfield/_gram_quadrature.py) instead of one nested rule per entry
        from .._gram_quadrature import vectorise_expectations

        exprs, vectorised = vectorise_expectations(exprs)
    exprs, namespace = numeric_expectations(exprs)
    namespace.update(vectorised)
    namespace.update(_mf_corr=_corr, _mf_acos=lambda a: np.arccos(_clip1(a)), _mf_asin=lambda a: np.arcsin(_clip1(a)),
                     _mf_sqrt=_sqrt0, _mf_one_minus=_one_minus, _mf_one_minus2=_one_minus2,
                     _mf_positive=lambda r, a, b: np.where(r > 0, a, b))
    return sp.lambdify(args, exprs, modules=[namespace, "numpy", "scipy"], cse=True)


@functools.lru_cache(maxsize=128)
def _compile_layers(layers: tuple, vals: tuple, parameterization: str, with_ntk: bool, boundary: bool = False,
                    gap: bool = False):
    """The pair map of ``layers`` applied in order, compiled to numpy (signature of :func:`gram_map`).

    ``boundary``: the output is handed to a batch-level step (BatchNorm, a
    residual around one), which takes a Gaussian zero-mean state.
    ``gap``: the state carries 1 - rho^2 exactly (:class:`~meanfield.calculus.GramSignal`):
    ``f(K1, K2, K12, Theta12, gap12, sigma_w, sigma_b, width) -> [K12', (Theta12',) gap12']``, the last
    entry missing (``f.carries_gap`` False) where a rule of the block has no exact gap map.
    """
    from ..layers import GramSignal, short

    out = GramSignal(_K1, _K2, _K12, _T12, parameterization=parameterization, width=_WIDTH,
                     gap=_GAP if gap else None)
    for p in layers:
        out = p.gram(out)
    if boundary and not (out.gaussian and out.m1 == 0 and out.m2 == 0):
        raise ValueError(f"{', '.join(short(p) for p in layers)} ends in a non-Gaussian signal next to a "
                         "batch_norm() or a residual around one; Gram matrices need a dense layer there")
    vals = dict(vals)
    exprs = [sp.sympify(out.K12).subs(vals)] + ([sp.sympify(out.T12).subs(vals)] if with_ntk else [])
    carries = gap and out.gap is not None
    if carries:
        exprs.append(sp.sympify(out.gap).subs(vals))
    f = _lambdify(_ARGS_GAP if gap else _ARGS, exprs)
    f.carries_gap = carries
    return f


_B1, _B2, _B12, _BT12 = sp.symbols("B1 B2 B12 BTheta12")


@functools.lru_cache(maxsize=32)
def _compile_combine(node, vals: tuple, with_ntk: bool):
    """A Residual's combination rule (``Residual.combine``) of branch (B..) and skip (K..) states, compiled."""
    from ..layers import GramSignal

    out = node.combine(GramSignal(_B1, _B2, _B12, _BT12), GramSignal(_K1, _K2, _K12, _T12))
    vals = dict(vals)
    exprs = [sp.sympify(out.K12).subs(vals)] + ([sp.sympify(out.T12).subs(vals)] if with_ntk else [])
    return _lambdify((_K1, _K2, _K12, _T12, _B1, _B2, _B12, _BT12), exprs)


_GB, _GK = sp.symbols("gapB gapK")


@functools.lru_cache(maxsize=32)
def _compile_combine_gap(node, vals: tuple):
    """The gap of a Residual's combination (``Residual.combine``) of branch and skip states, compiled."""
    from ..layers import GramSignal

    out = node.combine(GramSignal(_B1, _B2, _B12, _BT12, gap=_GB), GramSignal(_K1, _K2, _K12, _T12, gap=_GK))
    return _lambdify((_K1, _K2, _K12, _GK, _B1, _B2, _B12, _GB), [sp.sympify(out.gap).subs(dict(vals))])


def _cached(fn, *args):
    try:
        return fn(*args)
    except TypeError:  # an unhashable spec (a user activation holding a list, say): no cache
        return fn.__wrapped__(*args)


def _compiled(spec, parameterization: str, with_ntk: bool, gap: bool = False):
    return _cached(_compile_layers, (spec.block_spec(),), _values(spec), parameterization, bool(with_ntk), False,
                   gap)


def gram_map(arch, parameterization: str = "ntk", ntk: bool = True):
    """The block's pair map as a numpy function, for inspection and tests.

    Returns ``f(K1, K2, K12, Theta12, sigma_w, sigma_b, width) -> [K12', Theta12']``
    (``[K12']`` when ``ntk=False``), broadcasting over arrays; the diagonal is
    ``f(K, K, K, Theta, ...)``. Built from the primitives' ``gram`` rules.
    Blocks with BatchNorm have no pair map (ValueError): see :func:`kernels`.
    """
    check_choice("parameterization", parameterization, PARAMETERIZATIONS)
    spec = _checked_spec(arch)
    if spec.couples_batch:
        raise ValueError("arch has a batch_norm(): its Gram map couples the whole batch and is not a pair map; "
                         "use meanfield.kernels on the batch")
    return _compiled(spec, parameterization, bool(ntk))


def _full(v, shape):
    """A writable float64 array of ``shape`` (a constant expression comes back as a scalar)."""
    v = np.asarray(v, dtype=np.float64)
    if v.shape == shape and v.flags.writeable and v.flags.owndata:
        return v
    return np.array(np.broadcast_to(v, shape), dtype=np.float64)
