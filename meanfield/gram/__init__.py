r"""NNGP and NTK Gram matrices on a set of inputs of any norms (issue 12).

:func:`kernels` returns the infinite-width NNGP kernel K(x, x') and neural
tangent kernel Theta(x, x') of the network's output, for every pair of rows
of ``x1`` (and ``x2``), at any depth.

Where the maths comes from
--------------------------
The primitive tree is the one source of truth. Every primitive has a
:meth:`~meanfield.calculus.Primitive.gram` method mapping the state of a
pair of inputs x, x' of any norms (:class:`~meanfield.calculus.GramSignal`:
K1 = E[z(x)^2], K2 = E[z(x')^2], K12 = E[z(x) z(x')], the means m1, m2 of a
post-activation signal and the NTK T12 = Theta(x, x')). Pushing symbols
(K1, K2, K12, T12) through the block gives one sympy expression per output
(activations contribute their closed-form two-point moments
``Activation.kernel`` / ``Activation.derivative_kernel``: the arc-cosine
kernels for ReLU-like phi, Williams' erf kernel, the GELU kernel; any other
activation the Hermite series of :mod:`meanfield._gram_quadrature`, with its
truncation bound, over the whole array); it is compiled once to numpy and applied
to whole (n1, n2) arrays, layer after layer. The diagonal K(x, x) is the same
map at K1 = K2 = K12.

Per primitive (i = 1, 2 the two inputs; sqrt(v1 v2) the normalising divisors):

=====================  ===========================================  ==================================
primitive              (K1, K2, K12)                                 Theta12
=====================  ===========================================  ==================================
Dense(sw, sb)          sw^2 K + sb^2                                'ntk': K12' + sw^2 Theta;
                                                                    'standard': n K12 + 1 + sw^2 Theta
act(phi)               E[phi(u)^2], E[phi(v)^2], E[phi(u) phi(v)]   E[phi'(u) phi'(v)] Theta
layer_norm (pre/post)  1, 1, (K12 - m1 m2) / sqrt(v1 v2),           Theta / sqrt(v1 v2)
                       v_i = K_i - m_i^2
rms_norm               1, 1, K12 / sqrt(K1 K2)                      Theta / sqrt(K1 K2)
batch_norm (batch)     K -> n P K P / tr(P K P) over the batch       Theta -> n P Theta P / tr(P K P)
scale(eps)             eps^2 K                                      eps^2 Theta
residual(branch, mu)   branch(K) + mu^2 K                           branch(Theta) + mu^2 Theta
=====================  ===========================================  ==================================

with (u, v) zero-mean Gaussian, Var u = K1, Var v = K2, Cov = K12;
P = I - 1 1^T / n centres over the n inputs of the batch (BatchNorm's row
is a map of the batch's whole (n, n) matrices: ``BatchNorm.gram_batch``,
see below). The NTK
rules are Theta^{l+1} = (the layer's own parameters) + J Theta^l J^T per
unit: a Dense layer's fresh weights make Theta diagonal over units at
infinite width (Jacot et al. 2018, Thm. 1; Arora et al. 2019, eq. 9-10), an
element-wise phi multiplies by phi'(u) phi'(v), a normalisation's Jacobian
is I/sqrt(v) up to rank-one terms that are O(1/N) per unit (the same
argument as for its APJN factor, partial-Jacobian D.4), a residual's cross
terms vanish because the branch ends in zero-mean weights.

Conventions: the two parameterisations side by side
----------------------------------------------------
Both give the same network function at initialisation, hence the same NNGP;
they differ in which variables gradient descent trains, hence in the NTK.

===============  ==================================  ===================================
                 ``parameterization="ntk"``           ``parameterization="standard"``
===============  ==================================  ===================================
layer            h' = sigma_w w z / sqrt(n) +         h' = W z + b,
                 sigma_b beta                         W ~ N(0, sigma_w^2 / n), b ~ N(0, sigma_b^2)
trained          w, beta ~ N(0, 1)                    W, b
Dense's own      sigma_w^2 E[z z'] + sigma_b^2        n E[z z'] + 1
NTK term
first layer      Theta^1 = K^1                        Theta^1 = x.x' + 1
===============  ==================================  ===================================

with n the fan-in (the input dimension d for the first layer, ``width``
for hidden layers; E[z z'] = x.x'/d at the input) and
K^1(x, x') = sigma_w^2 x.x'/d + sigma_b^2 in both. These are
neural-tangents' conventions (``stax.Dense(parameterization=...)`` with
``s=(1, 1)``): in the standard parameterisation the NTK grows linearly with
the width, so ``width`` must be given; the bias is trained (its term, 1, is
there even when sigma_b = 0).

What is exact, and what is refused
----------------------------------
* MLPs with any activation, LayerNorm before or after the activation,
  RMSNorm, residual strength mu, LayerScale (``scale``): exact
  infinite-width limits (sequential limit, width -> infinity layer by
  layer), any input norms.
* BatchNorm (per unit over the batch, biased variance, no epsilon, no
  affine: the torch realisation's convention) couples the inputs of a
  batch, so the kernel of two inputs depends on the whole batch. The batch
  is the rows of ``x1`` (``x2`` is refused); between BatchNorms the tree's
  pair maps act entry by entry on the batch's (n, n) matrices, and at each
  BatchNorm ``BatchNorm.gram_batch`` applies the large-batch limit
  K -> n PKP / tr(PKP), Theta -> n P Theta P / tr(PKP). It is exact as the
  batch's effective size n_eff = tr(PKP)^2 / tr((PKP)^2) -> infinity (the
  divisor self-averages; the Jacobian's cross-sample terms y y^T / n and the
  divisor's fluctuations are O(1 / n_eff)), which needs many inputs with
  small correlations after centring. ``Kernels.batch_n_eff`` reports it per
  block. With ReLU-like phi (E[phi] != 0) and inputs of different norms,
  the per-input scales sqrt(K(x, x)) enter the next kernel as a rank-one
  term that centring does not remove, and n_eff falls with depth (79 -> 14
  over 20 blocks for a batch of 128): the limit is not reached there.
* ResMLP and MLP-Mixer (any tree with token mixing): inputs are images
  (n, T, d), the readout is the mean over the tokens, and the state is the
  (nT) x (nT) one-channel and two-channel matrices of
  :mod:`meanfield.gram_tokens`. It is the limit of infinitely many channels
  and tokens together (the single-input Mixer theory's limit), exact for
  sigma_b = 0, odd phi and tokens orthogonal across positions, an
  approximation elsewhere. At depth the same-image entries converge slowly:
  the NTK needs many tokens, the NNGP many more channels than tokens
  (docs/gram.md has the Monte-Carlo numbers).

Numerics
--------
Correlations are clipped to [-1, 1] before arccos/arcsin and the square roots
of variances that vanish at correlation 1 (sqrt(K1 K2 - K12^2)) to >= 0, so
nothing is NaN at or near correlation 1. Near rho = +-1 the rounded K's know
rho only to ~1e-16 absolute, while the arc-cosine kernels depend on
theta ~ sqrt(2 (1 - rho)); so the pairs with 1 - rho^2 < 1e-3 go through the
block map that also carries their gap 1 - rho^2 exactly
(:class:`~meanfield.calculus.GramSignal` ``gap``: from the input rows by
projection, then every rule's cancellation-free update, ``calculus._sum_gap``
for Dense and residual, ``Activation.kernel_gap`` for the ReLU family, erf and
GELU, the centred gap for LayerNorm), with K12 taken from the gap. Blocks with an
activation that has no gap map (the quadrature activations) use (K1, K2,
K12) alone; there and in the Mixer, a correlation within 1e-15 of
+-1 is taken as +-1 where an arccos sees it (exactly parallel pairs, the
diagonal after a LayerNorm). Against a 50-digit recursion from the float64
inputs, pairs with 1 - rho (or 1 + rho) from 1e-6 to 1e-15 keep ~1e-14 at
depth 32 for the ReLU family, erf and GELU, up to 4e-13 where correlation 1 is
unstable (docs/gram.md, Numerics, has the table). ResMLP's token walk
(:mod:`meanfield.gram_tokens`) and the BatchNorm walk carry the gap too (BatchNorm
through the squared distance E(h_a - h_b)^2, which its centring only rescales:
``_BatchWalk._batch_norm_gap``); the Mixer does not, and its NTK of an equal-norm
ReLU pair is right to ~1e-13 / sqrt(1 - rho) (measured at depth 20). LayerNorm after an activation
with phi(0) != 0 centres with the activation's covariances of phi - phi(0)
(``Activation.centred_kernel``), not K - m^2: at small K those differences of
numbers ~phi(0)^2 lost ~1e-16/K. Two-point forms that divide
by a Gram determinant (erf, GELU: (1 + c K1)(1 + c K2) - c^2 K12^2) evaluate
it as one node (``activations.pair_det``, or with the carried gap) that is
exact for identical inputs, and arcsin as an arctangent of the exact gap, so
large K loses nothing at correlation 1. A result that breaks Cauchy-Schwarz is
refused (ValueError) rather than returned. A non-finite result (a kernel beyond
float64, a zero signal normalised) is a ValueError too. Identical inputs
(the diagonal, repeated rows) are pinned to the diagonal map at every layer
(with BatchNorm, to the diagonal entry of the batch's matrix):
in the chaotic phase correlation 1 is an unstable fixed point, and a
rounding difference of 1e-16 would otherwise grow by chi_c per layer to an
O(1) error.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import sympy as sp

from .. import symbols as S
from .._serialize import Result
from .._validate import check_choice, check_int, check_real

__all__ = ["Kernels", "kernels", "gram_map"]

PARAMETERIZATIONS = ("ntk", "standard")
_GETS = ("nngp", "ntk")

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
                         "(meanfield.gram_tokens)")
    spec.require_values("kernels")
    return spec


def _values(spec) -> tuple:
    """The numeric structural parameters (mu, eps) as a hashable tuple."""
    return tuple(sorted(spec.parameters().items(), key=lambda kv: str(kv[0])))


def _lambdify(args, exprs):
    from ..gaussian import GaussianExpectation2
    from ..symbolic import _numeric_expectations

    exprs = [_safe(e) for e in exprs]
    vectorised = {}
    if any(sp.sympify(e).has(GaussianExpectation2) for e in exprs):
        # two-point moments of products f(u) g(v) over whole arrays (the Hermite series with error
        # control, meanfield/_gram_quadrature.py) instead of one nested rule per entry
        from .._gram_quadrature import vectorise_expectations

        exprs, vectorised = vectorise_expectations(exprs)
    exprs, namespace = _numeric_expectations(exprs)
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
    from ..calculus import GramSignal, _short

    out = GramSignal(_K1, _K2, _K12, _T12, parameterization=parameterization, width=_WIDTH,
                     gap=_GAP if gap else None)
    for p in layers:
        out = p.gram(out)
    if boundary and not (out.gaussian and out.m1 == 0 and out.m2 == 0):
        raise ValueError(f"{', '.join(_short(p) for p in layers)} ends in a non-Gaussian signal next to a "
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
    from ..calculus import GramSignal

    out = node.combine(GramSignal(_B1, _B2, _B12, _BT12), GramSignal(_K1, _K2, _K12, _T12))
    vals = dict(vals)
    exprs = [sp.sympify(out.K12).subs(vals)] + ([sp.sympify(out.T12).subs(vals)] if with_ntk else [])
    return _lambdify((_K1, _K2, _K12, _T12, _B1, _B2, _B12, _BT12), exprs)


_GB, _GK = sp.symbols("gapB gapK")


@functools.lru_cache(maxsize=32)
def _compile_combine_gap(node, vals: tuple):
    """The gap of a Residual's combination (``Residual.combine``) of branch and skip states, compiled."""
    from ..calculus import GramSignal

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


def _couples(node) -> bool:
    from ..calculus import BatchNorm

    return any(isinstance(p, BatchNorm) for p in node.primitives())


class _BatchWalk:
    """One block applied to the (n, n) Gram matrices of a whole batch (trees with BatchNorm).

    The tree drives it: runs of per-pair primitives go through their compiled
    pair map entry by entry (the diagonal of the matrix is K1, K2), a
    BatchNorm through ``BatchNorm.gram_batch`` on the whole matrix, a
    Residual around a BatchNorm through ``Residual.combine``.
    """

    def __init__(self, vals, parameterization, with_ntk, sw, sb, n_width):
        self.vals, self.param, self.ntk = vals, parameterization, with_ntk
        self.args = (sw, sb, n_width)
        self.n_eff = []     # the batch's effective size at every BatchNorm passed, in order
        # the gap 1 - rho^2 of every pair, carried exactly (None: not carried, the pairs use (K1, K2, K12) alone);
        # set by kernels() when the batch holds near-(anti)parallel pairs
        self.S = None

    def _zero(self, T):
        return T if self.ntk else np.zeros(())

    def pair(self, layers, K, T):
        f = _cached(_compile_layers, tuple(layers), self.vals, self.param, self.ntk, True)
        d = np.diag(K).copy()
        outs = f(d[:, None], d[None, :], K, self._zero(T), *self.args)
        Kn, Tn = _full(outs[0], K.shape), (_full(outs[1], K.shape) if self.ntk else None)
        if self.S is not None:
            g = _cached(_compile_layers, tuple(layers), self.vals, self.param, self.ntk, True, True)
            if not g.carries_gap:
                self.S = None
            else:
                # the near pairs through the map that carries the gap, K12 from the gap (as in kernels())
                # (on those entries only: the gap map is the larger expression)
                i, j = np.nonzero(self.S < _NEAR)
                gaps = self.S[i, j]
                Cs = np.copysign(np.sqrt(d[i]) * np.sqrt(d[j]) * np.sqrt(1 - gaps), K[i, j])
                o = g(d[i], d[j], Cs, T[i, j] if self.ntk else np.zeros(()), gaps, *self.args)
                Kn[i, j] = o[0]
                if self.ntk:
                    Tn[i, j] = o[1]
                dn = np.diag(Kn).copy()
                self.S = _naive_gap(dn[:, None], dn[None, :], Kn)
                self.S[i, j] = np.maximum(_full(o[-1], i.shape), 0.0)
        return Kn, Tn

    def _batch_norm_gap(self, K, Kn):
        """The gap after BatchNorm (K -> Kn = s P K P), without cancellation for the near pairs.

        Centring leaves y_a - y_b = h_a - h_b, so the squared distance D = E(h_a - h_b)^2 is only rescaled,
        D' = s D, and 1 - rho' = (D' - (sqrt K'_a - sqrt K'_b)^2) / (2 sqrt(K'_a K'_b)), where
        D = (sqrt K_a - sqrt K_b)^2 + 2 sqrt(K_a K_b) (1 - rho) comes from the carried gap; the norms'
        differences enter squared, so their rounding moves 1 - rho' by ~1e-16 / sqrt(gap) relative and
        theta' by ~1e-16 absolute.
        """
        d, dn = np.diag(K).copy(), np.diag(Kn).copy()
        r, rn = np.sqrt(d), np.sqrt(dn)
        # s = n / tr(PKP) from the diagonals (tr Kn = n)
        s = np.sum(dn) / (np.sum(d) - K.sum() / K.shape[0])
        S = _naive_gap(dn[:, None], dn[None, :], Kn)
        # the pairs near parallel after the centring (the others keep the gap of their rounded kernels)
        i, j = np.nonzero(S < 2 * _NEAR)
        with np.errstate(all="ignore"):
            rho = K[i, j] / (r[i] * r[j])
            om = _one_minus(rho, self.S[i, j])
            D = ((d[i] - d[j]) / (r[i] + r[j])) ** 2 + 2 * (r[i] * r[j]) * om
            omn = (s * D - ((dn[i] - dn[j]) / (rn[i] + rn[j])) ** 2) / (2 * rn[i] * rn[j])
            exact = np.clip(omn * (2 - omn), 0.0, 1.0)
        ok = np.isfinite(exact) & (omn < 0.5)
        S[i[ok], j[ok]] = exact[ok]
        np.fill_diagonal(S, 0.0)
        return S

    def walk(self, node, K, T):
        from ..calculus import BatchNorm, Chain, Residual, _short

        if not _couples(node):
            return self.pair((node,), K, T)
        if isinstance(node, BatchNorm):
            K0 = K
            K, T = node.gram_batch(K, T if self.ntk else None)
            # n_eff = tr(PKP)^2 / tr((PKP)^2): the large-batch limit's error is O(1 / n_eff) per BatchNorm
            self.n_eff.append(np.trace(K) ** 2 / np.sum(K * K))
            if self.S is not None:
                self.S = self._batch_norm_gap(K0, K)
                # K12 of the near pairs from the gap, so that K and S describe one pair
                near = self.S < _NEAR
                if near.any():
                    dn = np.diag(K).copy()
                    root = np.multiply.outer(np.sqrt(dn), np.sqrt(dn))
                    K = np.where(near, np.copysign(root * np.sqrt(1 - self.S), K), K)
            return K, T
        if isinstance(node, Chain):
            run = []
            for p in node.layers:
                if _couples(p):
                    if run:
                        K, T = self.pair(run, K, T)
                        run = []
                    K, T = self.walk(p, K, T)
                else:
                    run.append(p)
            return self.pair(run, K, T) if run else (K, T)
        if isinstance(node, Residual):
            S0 = self.S
            Kb, Tb = self.walk(node.branch, K, T)
            if self.S is not None and S0 is not None:
                g = _cached(_compile_combine_gap, node, self.vals)
                d, db = np.diag(K).copy(), np.diag(Kb).copy()
                with np.errstate(all="ignore"):
                    self.S = np.clip(_full(g(d[:, None], d[None, :], K, S0, db[:, None], db[None, :], Kb, self.S)[0],
                                           K.shape), 0.0, 1.0)
                np.fill_diagonal(self.S, 0.0)
            else:
                self.S = None
            f = _cached(_compile_combine, node, self.vals, self.ntk)
            d, db = np.diag(K).copy(), np.diag(Kb).copy()
            outs = f(d[:, None], d[None, :], K, self._zero(T), db[:, None], db[None, :], Kb, self._zero(Tb))
            return _full(outs[0], K.shape), (_full(outs[1], K.shape) if self.ntk else None)
        raise ValueError(f"{_short(node)} holds a batch_norm() and has no batch-level Gram rule")


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


# ---------------------------------------------------------------------------
# The result.
# ---------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class Kernels(Result):
    """Infinite-width NNGP and NTK Gram matrices of a network's output.

    ``nngp[a, b] = K^depth(x1[a], x2[b])``, ``ntk[a, b] = Theta^depth(x1[a], x2[b])``
    (float64, shape (n1, n2); None when not asked for). ``nngp_diag`` is the
    per-layer diagonal K^l(x1[a], x1[a]) for l = 1..depth, shape (depth, n1),
    when asked (``per_layer=True``). ``batch_n_eff`` (blocks with BatchNorm
    only, shape (depth - 1,)): the batch's effective size
    tr(PKP)^2 / tr((PKP)^2) at each block's BatchNorm (the smallest when
    there are several); the large-batch limit is exact as it grows, with
    O(1 / n_eff) corrections per block. Conventions: :mod:`meanfield.gram`.
    """

    architecture: object
    sigma_w: float
    sigma_b: float
    depth: int
    parameterization: str
    width: float | None
    nngp: np.ndarray | None
    ntk: np.ndarray | None
    nngp_diag: np.ndarray | None = None
    batch_n_eff: np.ndarray | None = None


def _full(v, shape):
    """A writable float64 array of ``shape`` (a constant expression comes back as a scalar)."""
    v = np.asarray(v, dtype=np.float64)
    if v.shape == shape and v.flags.writeable and v.flags.owndata:
        return v
    return np.array(np.broadcast_to(v, shape), dtype=np.float64)


def _inputs(name, x):
    a = np.asarray(x, dtype=np.float64) if x is not None else None
    if a is None or a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{name} must be a 2-d array of shape (n, d) with n, d >= 1, got "
                         f"{'None' if x is None else np.shape(x)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must contain finite numbers only")
    return a


def kernels(arch=None, x1=None, x2=None, depth=None, sigma_w=None, sigma_b=None, parameterization: str = "ntk",
            get=("nngp", "ntk"), width=None, per_layer: bool = False) -> Kernels:
    r"""NNGP and NTK Gram matrices of the network's output on inputs of any norms.

    Parameters
    ----------
    arch : Architecture, Network, tree or activation name
        The repeated block (MLPs: any activation, LayerNorm pre/post,
        RMSNorm, residual mu, LayerScale, BatchNorm in its large-batch
        limit; token blocks: ResMLP, MLP-Mixer, trees with token mixing).
    x1 : array (n1, d), or images (n1, T, d) for a token block
        With BatchNorm: the batch (n1 >= 2). Token blocks: T tokens of d
        features each; the kernels are those of the mean of h^depth over
        the tokens, in the limit of infinitely many channels and tokens
        (:mod:`meanfield.gram_tokens`: the rules, where the limit is exact,
        its finite-T error).
    x2 : array (n2, d) (images (n2, T, d) for a token block), optional
        Default: ``x1`` (the symmetric Gram matrix). Not with BatchNorm (the
        kernels depend on the batch; pass every input in ``x1``).
    depth : int >= 1
        Dense layers, as in ``monte_carlo``: the input layer
        h^1 = W x + b, then depth - 1 blocks. The kernels are those of h^depth.
    sigma_w, sigma_b : float
        Scales of every Dense layer whose scale is the symbol (the input layer
        included): K^1(x, x') = sigma_w^2 x.x'/d + sigma_b^2.
    parameterization : {'ntk', 'standard'}
        Which variables are trained (the table in :mod:`meanfield.gram`);
        the NNGP is the same.
    get : 'nngp', 'ntk' or a tuple of them
    width : float, optional
        Fan-in of the hidden layers; needed (only) for the standard
        parameterisation's NTK, which grows with it.
    per_layer : bool
        Also return the diagonal K^l(x1, x1) of every layer.

    Returns
    -------
    :class:`Kernels` with ``.nngp``, ``.ntk`` of shape (n1, n2).

    The recursion, per pair: K^{l+1} = block(K^l), Theta^{l+1} = (the
    Dense layers' own terms) + (derivative kernel) Theta^l, built from the
    primitives' ``gram`` rules (Jacot et al. 2018, Thm. 1; Arora et al.
    2019, eqs. 9-10; the layer rules of neural-tangents' ``stax``).
    """
    spec = _checked_spec(arch, tokens_ok=True)
    check_choice("parameterization", parameterization, PARAMETERIZATIONS)
    if isinstance(get, str):
        get = (get,)
    get = tuple(get)
    if not get or any(g not in _GETS for g in get):
        raise ValueError(f"get must be 'nngp', 'ntk' or a tuple of them, got {get!r}")
    if depth is None or sigma_w is None or sigma_b is None:
        raise ValueError("kernels needs depth, sigma_w and sigma_b")
    depth = check_int("depth", depth, 1)
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar, got an array of shape {np.shape(v)}")
        check_real(name, v, minimum=0)
    sw, sb = float(sigma_w), float(sigma_b)
    want_ntk = "ntk" in get
    if want_ntk and parameterization == "standard":
        if width is None:
            raise ValueError("width is needed for the standard parameterisation's NTK (it grows with the "
                             "hidden layers' fan-in); pass width=n or use parameterization='ntk'")
        check_real("width", width, minimum=1)
    n_width = float(width) if width is not None else 1.0
    if spec.has_tokens:
        # token blocks (ResMLP, MLP-Mixer): images (n, T, d), the (nT) x (nT) state of meanfield.gram_tokens
        from .tokens import token_kernels

        K, Th, diag = token_kernels(spec, x1, x2, depth, sw, sb, parameterization, get, n_width, per_layer)
        return Kernels(spec, sw, sb, depth, parameterization, float(width) if width is not None else None,
                       K, Th, diag, None)
    a = _inputs("x1", x1)
    same = x2 is None
    b = a if same else _inputs("x2", x2)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"x1 and x2 must have the same number of features, got {a.shape[1]} and {b.shape[1]}")
    d = a.shape[1]
    batch = spec.couples_batch
    if batch:
        if not same:
            raise ValueError("arch has a batch_norm(): the kernels depend on the whole batch, which is the rows of "
                             "x1; pass every input as x1 (x2 must be None) and take the block you need")
        if a.shape[0] < 2:
            raise ValueError("arch has a batch_norm(): it normalises over the batch (the rows of x1), which needs "
                             f"at least 2 rows, got {a.shape[0]}")
        walk = _BatchWalk(_values(spec), parameterization, want_ntk, sw, sb, n_width)
        n_eff = []
        block = spec.block_spec()
    else:
        f = _compiled(spec, parameterization, want_ntk)
        # the map that carries the pair's exact gap, for the near-(anti)parallel pairs only (below); None when a
        # rule of the block has no exact gap map (quadrature activations)
        # (compiled on the first near pair only: seconds for GELU's, and most Gram matrices have none)
    fg = None
    pending = not batch     # the gap map not compiled yet

    def gap_map():
        g = _compiled(spec, parameterization, want_ntk, gap=True)
        return g if g.carries_gap else None

    # the input layer (both parameterisations share the NNGP)
    dot = a @ b.T
    da, db = np.einsum("ij,ij->i", a, a), np.einsum("ij,ij->i", b, b)
    C = sw**2 * dot / d + sb**2
    Ka, Kb = sw**2 * da / d + sb**2, sw**2 * db / d + sb**2
    if parameterization == "ntk":
        T, Ta, Tb = C.copy(), Ka.copy(), Kb.copy()
    else:
        T, Ta, Tb = dot + 1.0, da + 1.0, db + 1.0
    # identical inputs have correlation exactly 1 at every depth; in the chaotic phase that fixed point is
    # unstable, so a rounding difference between C[a, b] and the diagonal map would grow to O(1): pin them
    _, ids = np.unique(np.vstack([a, b]), axis=0, return_inverse=True)
    ids = ids.ravel()
    rows, cols = np.nonzero(ids[:a.shape[0], None] == ids[None, a.shape[0]:])

    lower = np.tril_indices(a.shape[0], -1) if same else None

    def pin(M, Ma):
        M[rows, cols] = Ma[rows]
        if same:
            # a map symmetric in (K1, K2) can still round differently when they are swapped (a product
            # of three factors is not associative in float64): keep the upper triangle's value for both
            M[lower] = M.T[lower]
        return M

    C, T = pin(C, Ka), pin(np.array(T), Ta)
    def input_layer_gap():
        # the pairs' gap 1 - rho^2 after the input layer, exact from the rows as given: the input Dense
        # layer's own gap rule (calculus._sum_gap) applied to (|x|^2, |x'|^2, x.x') / d and their exact gap
        from ..calculus import Dense

        f_in = _cached(_compile_layers, (Dense(),), (), parameterization, False, False, True)
        with np.errstate(all="ignore"):
            gap = _full(f_in(da[:, None] / d, db[None, :] / d, dot / d, 0.0, _input_gap(a, b, dot, da, db),
                             sw, sb, n_width)[-1], C.shape)
            # a zero row (h = b) has no angle; its pair is not near-parallel either: the rounded gap is exact enough
            zero = (da[:, None] == 0) | (db[None, :] == 0)
            gap[zero] = _naive_gap(Ka[:, None], Kb[None, :], C)[zero]
        return gap

    # the pairs that go through the gap-carrying map (``near``, 1 - rho^2 < _NEAR) and their gap ``S`` (meaningful
    # on ``near`` only)
    near = S = None
    if pending:
        with np.errstate(all="ignore"):
            close = _naive_gap(Ka[:, None], Kb[None, :], C) < 2 * _NEAR
        close[rows, cols] = False
        if close.any():
            fg, pending = gap_map(), False
    if batch:
        # the batch walk carries the gap of every pair when some are near (anti)parallel (_BatchWalk.S)
        with np.errstate(all="ignore"):
            close = _naive_gap(Ka[:, None], Kb[None, :], C) < 2 * _NEAR
        close[rows, cols] = False
        np.fill_diagonal(close, False)
        if close.any():
            S0 = input_layer_gap()
            S0[rows, cols] = 0.0       # identical rows: parallel
            walk.S = np.clip(S0, 0.0, 1.0)
    if not batch and fg is not None:
        S = input_layer_gap()
        S[rows, cols] = 1.0
        S = np.maximum(S, 0.0)
        near = S < _NEAR
    diag = [Ka.copy()] if per_layer else None
    zero_T = np.zeros(())
    buf = None
    with np.errstate(all="ignore"):
        for _ in range(depth - 1):
            if batch:
                # the batch is x1 (x2 is None): full (n, n) matrices, the diagonal carries K1, K2
                walk.n_eff.clear()
                C, T = walk.walk(block, C, T if want_ntk else None)
                n_eff.append(min(walk.n_eff))
                Ka = Kb = np.diag(C).copy()
                C = pin(C, Ka)
                if want_ntk:
                    Ta = Tb = np.diag(T).copy()
                    T = pin(T, Ta)
                if per_layer:
                    diag.append(Ka.copy())
                continue
            n_near = np.count_nonzero(near) if near is not None else 0
            full = n_near > C.size // 5
            if not full:
                outs = f(Ka[:, None], Kb[None, :], C, T if want_ntk else zero_T, sw, sb, n_width)
                Cn, Tn = _full(outs[0], C.shape), (_full(outs[1], C.shape) if want_ntk else None)
            da_out = f(Ka, Ka, Ka, Ta if want_ntk else zero_T, sw, sb, n_width)
            db_out = da_out if same else f(Kb, Kb, Kb, Tb if want_ntk else zero_T, sw, sb, n_width)
            if n_near:
                # near-(anti)parallel pairs: the map that carries the gap. K12 is taken from the gap,
                # K12 = +-sqrt(K1 K2 (1 - gap)): the rules use both (rho and sqrt(gap) in atan2), and a rounding
                # of rho that disagrees with the exact gap is amplified by the map's slope in rho alone (1.4 per
                # block for ReLU + ln_post: 3e-12 at depth 32)
                if full:
                    # most pairs are near (deep ordered nets, near-duplicate inputs): the gap map on the whole
                    # matrix, the others entering with the gap of their rounded kernels
                    root = np.multiply.outer(np.sqrt(Ka), np.sqrt(Kb))
                    S = np.where(near, S, _naive_gap(Ka[:, None], Kb[None, :], C))
                    Cs = np.where(near, np.copysign(root * np.sqrt(1 - S), C), C)
                    o = fg(Ka[:, None], Kb[None, :], Cs, T if want_ntk else zero_T, S, sw, sb, n_width)
                    Cn, Tn = _full(o[0], C.shape), (_full(o[1], C.shape) if want_ntk else None)
                    S = _full(o[-1], C.shape)
                    kept = S < _NEAR
                else:
                    idx = np.flatnonzero(near)
                    i, j = np.divmod(idx, C.shape[1])
                    gaps = S.ravel()[idx]
                    Cs = np.copysign(np.sqrt(Ka[i]) * np.sqrt(Kb[j]) * np.sqrt(1 - gaps),
                                     C.ravel()[idx])
                    o = fg(Ka[i], Kb[j], Cs, T.ravel()[idx] if want_ntk else zero_T, gaps, sw, sb, n_width)
                    Cn.ravel()[idx] = o[0]
                    if want_ntk:
                        Tn.ravel()[idx] = o[1]
                    gaps = _full(o[-1], idx.shape)
                    S.ravel()[idx] = gaps
                    kept = np.zeros(C.shape, dtype=bool)
                    kept.ravel()[idx[gaps < _NEAR]] = True
            Ka, Kb = _full(da_out[0], Ka.shape), _full(db_out[0], Kb.shape)
            C = pin(Cn, Ka)
            if want_ntk:
                Ta, Tb = _full(da_out[1], Ka.shape), _full(db_out[1], Kb.shape)
                T = pin(Tn, Ta)
            if fg is not None or pending:
                # pairs that came within the gap (not identical ones): they enter with the gap of the rounded
                # kernels (theta right to ~1e-16 / theta absolute: ~3e-15 there); tracked ones keep theirs
                # |C| / (sqrt(Ka) sqrt(Kb) sqrt(1 - _NEAR)) > 1, in one reused buffer (a few ms per layer at n = 1000)
                if buf is None:
                    buf = np.empty(C.shape)
                np.abs(C, out=buf)
                buf *= (1 / (np.sqrt(Ka) * np.sqrt(1 - _NEAR)))[:, None]
                buf *= (1 / np.sqrt(Kb))[None, :]
                cand = buf > 1.0
                cand[rows, cols] = False
                if pending and cand.any():
                    fg, pending = gap_map(), False
            if fg is not None:
                if S is None:
                    S = np.ones(C.shape)
                if n_near:
                    new = cand & ~kept
                    near = cand | kept
                    near[rows, cols] = False
                else:
                    new = near = cand
                if new.any():
                    i, j = np.nonzero(new)
                    S[i, j] = _naive_gap(Ka[i], Kb[j], C[i, j])
            if per_layer:
                diag.append(Ka.copy())
    bad = [name for name, v in (("nngp", C), ("ntk", T if want_ntk else C)) if not np.all(np.isfinite(v))]
    if bad:
        raise ValueError(f"the {bad[0]} kernel is not finite at depth {depth} for sigma_w={sw:g}, "
                         f"sigma_b={sb:g} (beyond float64, or a normalisation of a zero signal)")
    # a last guard: whatever lost float64 precision (a user activation's two-point form, say) and broke
    # Cauchy-Schwarz is refused rather than returned
    with np.errstate(all="ignore"):
        for name, M, da_, db_ in (("nngp", C, Ka, Kb), ("ntk", T, Ta, Tb)) if want_ntk else (("nngp", C, Ka, Kb),):
            if np.any(np.abs(M) > np.sqrt(da_)[:, None] * np.sqrt(db_)[None, :] * (1 + 1e-8)):
                raise ValueError(f"the {name} Gram matrix lost float64 precision at depth {depth} for "
                                 f"sigma_w={sw:g}, sigma_b={sb:g} (kernels ~{np.max(np.abs(da_)):.1e} with "
                                 "near-parallel inputs); see meanfield.gram, Numerics")
    return Kernels(spec, sw, sb, depth, parameterization, float(width) if width is not None else None,
                   C if "nngp" in get else None, T if want_ntk else None,
                   np.array(diag) if per_layer else None, np.array(n_eff) if batch else None)
