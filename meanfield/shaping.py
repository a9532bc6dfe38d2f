r"""Kernel shaping: Q/C maps, TReLU, TAT for smooth activations, and DKS.

Everything here follows the tailored-rectifiers paper (Zhang, Botev, Martens,
**TAT**) and, for DKS, the conditions it restates from Martens et al. (2021).
Pure numpy/scipy/sympy; the torch realisation lives in
:mod:`meanfield.torch.shaping`.

Conventions (TAT section 2)
---------------------------
A *combined layer* is ``phi(W x)`` with ``W ~ N(0, 1/fan_in)`` and zero bias.
For inputs with ``q = ||x||^2 / d`` the **local Q map** is
``Q(q) = E[phi(sqrt(q) z)^2]`` (eq. 4) and the **local C map** is the
normalised two-point kernel (eq. 5)

    C(c, q1, q2) = E[phi(u) phi(v)] / sqrt(Q(q1) Q(q2)),
    Var u = q1, Var v = q2, Cov(u, v) = c sqrt(q1 q2).

Both come from :mod:`meanfield.activations` (closed forms where the registry
has them, the exp-sinh quadrature of :mod:`meanfield.gaussian` otherwise).
Derivatives in c follow from Price's theorem, d/dK12 E[f(u) g(v)] =
E[f'(u) g'(v)] (TAT eqs. 17-18):

    C^{(i)}(c, q1, q2) = (q1 q2)^{i/2} E[phi^{(i)}(u) phi^{(i)}(v)] / sqrt(Q(q1) Q(q2)).

At c = 1 closed forms such as the arc-cosine kernel contain sqrt(1 - c^2)
terms; there :func:`c_map_derivative` takes the one-sided limit c -> 1-
symbolically (it is +inf for C''(1) of any leaky ReLU that is not linear,
TAT section 4.2), and for quadrature activations it reduces the
two-point expectation at c = 1 to the one-point E[phi^{(i)}(h)^2].

Networks and global maps
------------------------
A network is described by a small tree (:class:`Layer`, :class:`Affine`,
:class:`Chain`, :class:`Repeat`, :class:`NormalizedSum`); :func:`vanilla` and
:func:`rescaled_resnet` build the two families of the paper (eqs. 1, 6).
:func:`global_c_map` / :func:`global_q_map` push (q1, q2, c) through the tree
(normalised sums: q = sum w_i^2 q_i, c = sum w_i^2 q_i c_i / q, TAT
section 2.3, which assumes the summed branches are uncorrelated: every branch
but one must end in an :class:`Affine` layer). :func:`network_map` is the
paper's U_{f,r} (appendix B.4: replace the local C map by r) and
:func:`subnetwork_max` its M_{f,r} (appendix B.2).

Errata (TAT, see docs/errata.md)
--------------------------------
* Proposition 1 prints the shortcut weight sqrt(alpha / (1 + alpha^2)); the
  correct weight is ``sqrt(2 alpha / (1 + alpha^2))`` (the proof uses it, and
  only it makes w^2 c + (1 - w^2) C_relu(c) equal eq. 9):
  :func:`equivalent_shortcut_weight`. Eq. 26 of the proof also drops the
  factor c of the first term and writes (1 - alpha^2) for (1 - alpha)^2.
* Proof of Proposition 3: the comparison ODE x' = (2 sqrt 2 / 3)(1 - x)^{3/2}
  with x(0) = 0 is solved by ``1 - (3 / (3 + sqrt(2) t))^2``, not by the printed
  ``1 - (3 / sqrt(2t + 3))^2`` (which is -2 at t = 0). The conclusion
  (psi(0, inf) = 1) is unaffected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import sympy as sp

from ._validate import check_finite_array, check_int, check_nonnegative, check_positive, is_number
from .activations import ACTIVATIONS, Activation, ScaleInvariant, activation as _activation
from .gaussian import RULE_U, RULE_W, GaussianExpectation, GaussianExpectation2, numpy_function, pieces, quad1
from .symbolic import lambdify as _numeric
from .symbols import x as _x

__all__ = [
    # local maps
    "LocalMaps", "local_maps", "q_map", "q_map_derivative", "c_map", "c_map_derivative",
    # networks and global maps
    "Layer", "Affine", "Chain", "Repeat", "NormalizedSum", "IDENTITY",
    "vanilla", "rescaled_resnet", "nonlinear_depth",
    "global_q_map", "global_c_map", "network_map", "subnetwork_max",
    "maximal_c_value", "maximal_slope", "maximal_curvature",
    # TReLU
    "trelu_c_map", "trelu_c_map_derivative", "solve_negative_slope", "trelu_negative_slope",
    "trelu", "normalized_leaky_relu", "theorem1_bounds", "equivalent_shortcut_weight",
    "deep_limit_time", "deep_limit_flow", "trelu_deep_limit",
    # smooth TAT and DKS
    "TransformedActivation", "tat_transform", "dks_transform",
]

_ONE = np.float64(1.0)


# ---------------------------------------------------------------------------
# Numeric evaluation.
# ---------------------------------------------------------------------------
def _collapse_at_diagonal(expr, q):
    """Replace E[f(u, v)] at Var u = Var v = Cov = q by the one-point E[f(h, h)]."""
    def rule(ge):
        lam, K1, K2, K12 = ge.args
        a, b = lam.variables
        return GaussianExpectation(sp.Lambda(_x, lam.expr.subs({a: _x, b: _x}, simultaneous=True)), q)

    return expr.replace(lambda e: isinstance(e, GaussianExpectation2), rule)


# ---------------------------------------------------------------------------
# Local maps.
# ---------------------------------------------------------------------------
_q, _q1, _q2 = sp.symbols("q q1 q2", positive=True)
_c = sp.Symbol("c", real=True)
_K1, _K2, _K12 = sp.symbols("K1 K2 K12")


def _factor_radicals(expr):
    """sqrt(q1 q2 - c^2 q1 q2) -> sqrt(q1) sqrt(q2) sqrt(1 - c^2), so c = 1 gives an exact 0."""
    return expr.replace(
        lambda e: e.is_Pow and e.exp.is_Rational and e.exp.q == 2 and e.base.has(_c),
        lambda e: sp.factor(e.base) ** e.exp)


class LocalMaps:
    """The local Q and C maps of one activation, and their derivatives.

    Built from the activation registry's Gaussian moments (closed forms where
    they exist, quadrature otherwise). All methods broadcast over numpy arrays;
    c is clipped to [-1, 1].

    Parameters
    ----------
    activation : str | sympy.Expr | Activation
        Anything :func:`meanfield.activation` accepts.
    """

    def __init__(self, activation):
        self.activation = _activation(activation)
        act = self.activation
        Q_expr = sp.sympify(act.second_moment(_q))
        self._Q_expr = Q_expr
        self._Q = _numeric([_q], Q_expr)
        self._dQ = _numeric([_q], sp.diff(Q_expr, _q))
        norm = sp.sqrt(act.second_moment(_q1) * act.second_moment(_q2))
        # the two-point moments as functions of (q1, q2, c), Price derivatives in K12
        k12 = _c * sp.sqrt(_q1 * _q2)
        kern = act.kernel(_K1, _K2, _K12)
        dkern = act.derivative_kernel(_K1, _K2, _K12)
        self._c_exprs = []
        for order, e in enumerate((kern, dkern, sp.diff(dkern, _K12))):
            e = sp.sympify(e).subs({_K1: _q1, _K2: _q2, _K12: k12}, simultaneous=True)
            e = _factor_radicals(e * (_q1 * _q2) ** sp.Rational(order, 2) / norm)
            self._c_exprs.append(e)
        self._C = [_numeric([_q1, _q2, _c], e) for e in self._c_exprs]
        # phi' jumps (SELU, hard-tanh, a kinked user expression): phi'' has delta terms, which the
        # two-point rule does not carry (GaussianExpectation2.fdiff gives NaN), and C''(1) = inf
        self._c2_kinked = bool(self._c_exprs[2].has(sp.nan))
        self._closed_form = not any(e.has(GaussianExpectation, GaussianExpectation2) for e in self._c_exprs)

    # -- Q map ---------------------------------------------------------------
    def Q(self, q):
        """Q(q) = E[phi(sqrt(q) z)^2] (TAT eq. 4); q >= 0."""
        return self._eval1(self._Q, check_nonnegative("q", q))

    def Q_prime(self, q=1.0):
        """Q'(q) = E[phi'(h)^2 + phi(h) phi''(h)], h ~ N(0, q) (Price); Q'(1) of DKS/TAT; q >= 0."""
        return self._eval1(self._dQ, check_nonnegative("q", q))

    # -- C map ---------------------------------------------------------------
    def C(self, c, q1=1.0, q2=None):
        """C(c, q1, q2) (TAT eq. 5); q2 defaults to q1."""
        return self.C_derivative(c, 0, q1, q2)

    def C_derivative(self, c, order=1, q1=1.0, q2=None):
        """d^order C / dc^order at (c, q1, q2), order 0, 1 or 2 (TAT eqs. 17-18).

        At c = 1 (and q1 = q2) the value is the one-sided limit c -> 1-,
        computed symbolically (+inf where it diverges, e.g. C''(1) of a leaky ReLU).
        order=2 is a ValueError where phi' jumps outside the ReLU family (SELU,
        hard-tanh, kinked user expressions): C'' has delta terms there.
        c must be finite (it is clipped to [-1, 1]) and q1, q2 > 0.
        """
        if isinstance(order, bool) or order not in (0, 1, 2):
            raise ValueError(f"order must be 0, 1 or 2, got {order!r}")
        if order == 2 and self._c2_kinked:
            raise ValueError(
                f"order=2 is not available for activation {self.activation.name!r}: its phi' jumps, so "
                "C''(c) has delta terms (from phi'') that are not implemented, and C''(1) = inf; "
                "choose order 0 or 1, or an activation with a continuous phi'")
        q2 = q1 if q2 is None else q2
        # a correlation needs nonzero variances (q = 0 is 0/0 for phi(0) = 0); c is clipped below
        c, q1, q2 = check_finite_array("c", c), check_positive("q1", q1), check_positive("q2", q2)
        from ._validate import broadcast_named

        c, q1, q2 = broadcast_named(c=c, q1=q1, q2=q2)
        shape = c.shape
        c, q1, q2 = (np.atleast_1d(v) for v in (np.clip(c, -1.0, 1.0), q1, q2))
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(self._C[order](q1, q2, c), dtype=np.float64) * np.ones(c.shape)
        at_one = (c == 1.0) & (q1 == q2)
        for idx in zip(*np.nonzero(at_one)):
            out[idx] = self.at_one(order, float(q1[idx]))
        return out.reshape(shape)[()] if not shape else out

    def C_many(self, c, order=0, q1=1.0, q2=None, interpolate=True):
        """:meth:`C_derivative` for many c at one common q1 = q2 (global maps).

        For quadrature activations each point is a 2-D integral, so a global
        map of depth L at n points costs L n of them. With ``interpolate`` the
        map c -> C^{(order)}(c) at that q is instead interpolated from 65
        Chebyshev-Lobatto values (computed once per q and order), and the
        interpolant is used only if it matches direct evaluations at the 64
        interleaved points to 1e-11; otherwise (and for closed forms or
        differing q) the points are evaluated directly.
        """
        q2 = q1 if q2 is None else q2
        q1a, q2a = np.asarray(q1, dtype=np.float64), np.asarray(q2, dtype=np.float64)
        if (not interpolate or self._closed_form or not np.all(q1a == q1a.flat[0])
                or not np.all(q2a == q1a.flat[0])):
            return self.C_derivative(c, order, q1, q2)
        cheb = self._interpolant(order, round(float(q1a.flat[0]), 12))
        if cheb is None:
            return self.C_derivative(c, order, q1, q2)
        return cheb(np.clip(np.asarray(c, dtype=np.float64), -1.0, 1.0))

    @lru_cache(maxsize=64)
    def _interpolant(self, order, q):
        n = 64
        nodes = np.cos(np.pi * np.arange(n + 1) / n)
        vals = self.C_derivative(nodes, order, q, q)
        if not np.all(np.isfinite(vals)):
            return None
        cheb = np.polynomial.Chebyshev.fit(nodes, vals, n, domain=[-1, 1])
        mid = np.cos(np.pi * (np.arange(n) + 0.5) / n)
        err = np.max(np.abs(cheb(mid) - self.C_derivative(mid, order, q, q)))
        return cheb if err <= 1e-11 * max(1.0, np.max(np.abs(vals))) else None

    def at_one(self, order: int, q: float = 1.0) -> float:
        """C^{(order)}(1, q, q): the limit c -> 1- (Price-theorem form, see module docs)."""
        return float(self._at_one_fn(order)(np.float64(q)))

    @lru_cache(maxsize=8)
    def _at_one_fn(self, order: int):
        """numpy function q -> C^{(order)}(1, q, q), derived once per order.

        Closed forms: substitute c = 1 (q1 = q2 = q symbolic) and, where that
        is 0/0 or inf - inf, take sympy's one-sided limit c -> 1-.
        Quadrature activations: E[f(u) g(v)] at c = 1 is the one-point E[f(h) g(h)].
        """
        e = self._c_exprs[order].subs({_q1: _q, _q2: _q}, simultaneous=True)
        at = _collapse_at_diagonal(e.subs(_c, 1), _q)
        if not at.has(GaussianExpectation):
            at = sp.simplify(at)
            if at.has(sp.nan, sp.zoo) or at.has(sp.oo, -sp.oo) and not at.is_infinite:
                at = sp.simplify(sp.limit(e, _c, 1, dir="-"))
            if at.is_infinite:
                return lambda q, v=float(at): np.full(np.shape(q), v)[()]
        return _numeric([_q], at)

    @staticmethod
    def _eval1(fn, q):
        q = np.asarray(q, dtype=np.float64)
        if q.size > 1 and np.all(q == q.flat[0]):  # a global map's common q: one quadrature
            return np.full(q.shape, float(fn(q.flat[0])))
        out = np.asarray(fn(q), dtype=np.float64) * np.ones(q.shape)
        return out[()] if out.ndim == 0 else out

    def __repr__(self):
        return f"LocalMaps({self.activation!r})"


@lru_cache(maxsize=128)
def _local_maps_cached(act: Activation) -> LocalMaps:
    return LocalMaps(act)


def local_maps(activation, **params) -> LocalMaps:
    """Cached :class:`LocalMaps` for ``activation`` (name, sympy expression or Activation)."""
    if isinstance(activation, TransformedActivation):
        activation = activation.activation()
    return _local_maps_cached(_activation(activation, **params))


def q_map(activation, q):
    """Local Q map Q(q) = E[phi(sqrt(q) z)^2] (TAT eq. 4)."""
    return local_maps(activation).Q(q)


def q_map_derivative(activation, q=1.0):
    """Q'(q) (Price: E[phi'^2 + phi phi''] at variance q)."""
    return local_maps(activation).Q_prime(q)


def c_map(activation, c, q1=1.0, q2=None):
    """Local C map C(c, q1, q2) (TAT eq. 5)."""
    return local_maps(activation).C(c, q1, q2)


def c_map_derivative(activation, c=1.0, order=1, q1=1.0, q2=None):
    """C'(c) (order=1) or C''(c) (order=2) of the local C map; limits at c = 1.

    order=2 is a ValueError where phi' jumps outside the ReLU family (SELU, hard-tanh).
    """
    return local_maps(activation).C_derivative(c, order, q1, q2)


# ---------------------------------------------------------------------------
# Networks (TAT sections 2.3-2.4 and appendix B.4).
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """A combined layer phi(W x): fan-in Gaussian weights (variance 1/fan_in), zero bias."""

    def __str__(self):
        return "Layer"


@dataclass(frozen=True)
class Affine:
    """An affine layer W x with fan-in weights and zero bias (leaves q and c unchanged)."""

    def __str__(self):
        return "Affine"


@dataclass(frozen=True)
class Chain:
    """Layers applied in order (an empty chain is the identity/shortcut)."""

    parts: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(self.parts))
        for p in self.parts:
            _check_node(p)


@dataclass(frozen=True)
class Repeat:
    """``part`` composed with itself ``times`` times."""

    part: object
    times: int

    def __post_init__(self):
        _check_node(self.part)
        check_int("times", self.times, 0)


@dataclass(frozen=True)
class NormalizedSum:
    """sum_i w_i branch_i(x) with sum_i w_i^2 = 1 (TAT section 2.3).

    The q/c rules assume uncorrelated branches, so at most one branch may end
    in something other than an :class:`Affine` layer (fresh zero-mean weights).
    """

    weights: tuple
    branches: tuple

    def __post_init__(self):
        w = tuple(float(v) for v in self.weights)
        b = tuple(self.branches)
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "branches", b)
        if len(w) != len(b) or not b:
            raise ValueError(f"NormalizedSum needs one weight per branch, got {len(w)} weights "
                             f"and {len(b)} branches")
        for node in b:
            _check_node(node)
        if not all(math.isfinite(v) for v in w) or abs(sum(v * v for v in w) - 1.0) > 1e-9:
            raise ValueError(f"NormalizedSum weights must satisfy sum w_i^2 = 1, got {w}")
        if sum(not _ends_affine(node) for node in b) > 1:
            raise ValueError("NormalizedSum branches must be uncorrelated: at most one branch may end "
                             "in something other than an Affine layer")


#: the empty chain: the identity map (Q and C maps are the identity)
IDENTITY = Chain(())
_NODES = (Layer, Affine, Chain, Repeat, NormalizedSum)


def _check_node(node):
    if not isinstance(node, _NODES):
        raise ValueError(f"network parts must be Layer, Affine, Chain, Repeat or NormalizedSum, got {node!r}")


def _ends_affine(node) -> bool:
    if isinstance(node, Affine):
        return True
    if isinstance(node, Chain):
        return bool(node.parts) and _ends_affine(node.parts[-1])
    if isinstance(node, Repeat):
        return node.times > 0 and _ends_affine(node.part)
    if isinstance(node, NormalizedSum):
        return all(_ends_affine(b) for b in node.branches)
    return False


def _check_depth(depth, name="depth"):
    return check_int(name, depth, 1)


def _check_shortcut(w):
    if not is_number(w) or not -1.0 <= float(w) <= 1.0:
        raise ValueError(f"shortcut_weight must be a number in [-1, 1], got {w!r}")
    return float(w)


def vanilla(depth: int) -> Repeat:
    """An MLP of ``depth`` combined layers (TAT eq. 1)."""
    return Repeat(Layer(), _check_depth(depth))


def rescaled_resnet(depth: int, shortcut_weight: float, branch_depth: int = 1) -> Repeat:
    """Rescaled ResNet x <- w x + sqrt(1 - w^2) R(x) (TAT eq. 6).

    The residual branch R is ``branch_depth`` combined layers followed by an
    affine layer; ``depth`` counts combined layers along the residual path
    (so there are depth / branch_depth blocks). ``shortcut_weight=0`` is a
    vanilla network (plus harmless affine layers).
    """
    depth = _check_depth(depth)
    k = _check_depth(branch_depth, "branch_depth")
    w = _check_shortcut(shortcut_weight)
    if depth % k:
        raise ValueError(f"depth={depth} must be a multiple of branch_depth={k}")
    branch = Chain((Layer(),) * k + (Affine(),))
    block = NormalizedSum((w, math.sqrt(max(1.0 - w * w, 0.0))), (IDENTITY, branch))
    return Repeat(block, depth // k)


def _as_network(network):
    if isinstance(network, _NODES):
        return network
    if isinstance(network, (list, tuple)):
        return Chain(tuple(network))
    raise ValueError(f"network must be a Layer/Affine/Chain/Repeat/NormalizedSum tree, got {network!r}")


def nonlinear_depth(network) -> int:
    """Number of combined layers on the longest input-output path."""
    network = _as_network(network)
    if isinstance(network, Layer):
        return 1
    if isinstance(network, Affine):
        return 0
    if isinstance(network, Chain):
        return sum(nonlinear_depth(p) for p in network.parts)
    if isinstance(network, Repeat):
        return network.times * nonlinear_depth(network.part)
    return max(nonlinear_depth(b) for b in network.branches)


# -- the paper's U_{f,r} and M_{f,r} -----------------------------------------
def network_map(network, r: Callable, x):
    """U_{f,r}(x) of TAT appendix B.4: the global-map graph with the local C map replaced by r.

    Layers map to r, affine layers to the identity, compositions compose and
    normalised sums take sum_i w_i^2 U_i(x). With r the local C map (q = 1)
    this is the global C map.
    """
    network = _as_network(network)
    if isinstance(network, Layer):
        return r(x)
    if isinstance(network, Affine):
        return x
    if isinstance(network, Chain):
        for p in network.parts:
            x = network_map(p, r, x)
        return x
    if isinstance(network, Repeat):
        for _ in range(network.times):
            x = network_map(network.part, r, x)
        return x
    return sum(w * w * network_map(b, r, x) for w, b in zip(network.weights, network.branches))


def _maximal_subnetworks(network, out):
    """Subnetworks not dominated by a larger one: f and (recursively) every summed branch."""
    network = _as_network(network)
    if isinstance(network, Chain):
        for p in network.parts:
            _maximal_subnetworks(p, out)
    elif isinstance(network, Repeat):
        if network.times:
            _maximal_subnetworks(network.part, out)
    elif isinstance(network, NormalizedSum):
        for b in network.branches:
            if b not in out:
                out.append(b)
                _maximal_subnetworks(b, out)
    return out


def subnetwork_max(network, r: Callable, x):
    """M_{f,r}(x) = max over subnetworks g of U_{g,r}(x) (TAT appendix B.2).

    Uses the appendix's reduction: for non-decreasing r with r(y) >= y
    (true for the three uses in the paper: the TReLU C map, y -> C'(1) y with
    C'(1) >= 1 at y = 1, and y -> C''(1) + y), extending a subnetwork never
    lowers U, so only f itself and the branches of normalised sums (which
    cannot be extended) need to be compared.
    """
    network = _as_network(network)
    candidates = [network] + _maximal_subnetworks(network, [])
    return max(network_map(g, r, x) for g in candidates)


def maximal_c_value(network, negative_slope):
    """mu_f^0(alpha) = max_g C_g(0) for TReLU networks (TAT appendix B.1)."""
    return subnetwork_max(network, lambda c: trelu_c_map(c, negative_slope), 0.0)


def maximal_slope(network, slope):
    """mu_f^1(C'(1)) = max_g C'_g(1): the DKS maximal slope function."""
    return subnetwork_max(network, lambda y: slope * y, 1.0)


def maximal_curvature(network, curvature):
    """mu_f^2(C''(1)) = max_g C''_g(1) when C'(1) = 1 (TAT appendix B.1, B.4)."""
    return subnetwork_max(network, lambda y: curvature + y, 0.0)


# -- global Q/C maps with q tracked ----------------------------------------------
def _propagate(network, maps: LocalMaps, q1, q2, c, dc, interpolate=False):
    if isinstance(network, Layer):
        if dc is not None:
            dc = maps.C_many(c, 1, q1, q2, interpolate) * dc
        return maps.Q(q1), maps.Q(q2), maps.C_many(c, 0, q1, q2, interpolate), dc
    if isinstance(network, Affine):
        return q1, q2, c, dc
    if isinstance(network, Chain):
        for p in network.parts:
            q1, q2, c, dc = _propagate(p, maps, q1, q2, c, dc, interpolate)
        return q1, q2, c, dc
    if isinstance(network, Repeat):
        for _ in range(network.times):
            q1, q2, c, dc = _propagate(network.part, maps, q1, q2, c, dc, interpolate)
        return q1, q2, c, dc
    outs = [_propagate(b, maps, q1, q2, c, dc, interpolate) for b in network.branches]
    w2 = [w * w for w in network.weights]
    Q1 = sum(a * o[0] for a, o in zip(w2, outs))
    Q2 = sum(a * o[1] for a, o in zip(w2, outs))
    k12 = sum(a * np.sqrt(o[0] * o[1]) * o[2] for a, o in zip(w2, outs))
    norm = np.sqrt(Q1 * Q2)
    dk = None if dc is None else sum(a * np.sqrt(o[0] * o[1]) * o[3] for a, o in zip(w2, outs)) / norm
    return Q1, Q2, k12 / norm, dk


def global_c_map(network, activation, c, q1=1.0, q2=None, derivative=False):
    """The global C map C_f(c) of ``network`` with activation ``activation``.

    Parameters
    ----------
    network : network tree, or an int depth (a vanilla network)
    activation : name, sympy expression, Activation or TransformedActivation
    c : array_like, input cosine similarities in [-1, 1]
    q1, q2 : input q values (default 1, the normalised setting of TAT)
    derivative : also return C_f'(c) (forward-mode chain rule)
    """
    network = vanilla(network) if isinstance(network, (int, np.integer)) else _as_network(network)
    maps = local_maps(activation)
    q2 = q1 if q2 is None else q2
    c = np.clip(np.asarray(c, dtype=np.float64), -1.0, 1.0)
    q1, q2, c = np.broadcast_arrays(np.asarray(q1, dtype=np.float64), np.asarray(q2, dtype=np.float64), c)
    dc = np.ones(c.shape) if derivative else None
    # interpolating the local map costs ~130 two-point quadratures per q: worth it
    # when the direct route would need more
    interpolate = nonlinear_depth(network) * c.size >= 130
    _, _, cf, dcf = _propagate(network, maps, q1, q2, c, dc, interpolate)
    return (cf, dcf) if derivative else cf


def global_q_map(network, activation, q):
    """The global Q map Q_f(q) of ``network`` (normalised sums: sum_i w_i^2 q_i)."""
    network = vanilla(network) if isinstance(network, (int, np.integer)) else _as_network(network)
    q = np.asarray(q, dtype=np.float64)
    return _propagate(network, local_maps(activation), q, q, np.ones(q.shape), None)[0]


# ---------------------------------------------------------------------------
# TReLU (TAT section 4.1, appendices B and C).
# ---------------------------------------------------------------------------
def _trelu_eps(negative_slope):
    a = np.asarray(negative_slope, dtype=np.float64)
    return (1.0 - a) ** 2 / (np.pi * (1.0 + a * a))


def trelu_c_map(c, negative_slope):
    """Local C map of the normalised leaky ReLU (TAT eq. 9 / Lemma 1).

    C(c) = c + (1 - a)^2 / (pi (1 + a^2)) (sqrt(1 - c^2) - c arccos c),
    independent of the input q values.
    """
    c = np.clip(np.asarray(c, dtype=np.float64), -1.0, 1.0)
    return c + _trelu_eps(negative_slope) * (np.sqrt(1.0 - c * c) - c * np.arccos(c))


def trelu_c_map_derivative(c, negative_slope):
    """C'(c) = 1 - (1 - a)^2 / (pi (1 + a^2)) arccos(c) (proof of Theorem 1)."""
    c = np.clip(np.asarray(c, dtype=np.float64), -1.0, 1.0)
    return 1.0 - _trelu_eps(negative_slope) * np.arccos(c)


def _check_eta(eta):
    if not is_number(eta) or not 0.0 <= float(eta) <= 1.0:
        raise ValueError(f"eta must be a number in [0, 1], got {eta!r}")
    return float(eta)


def solve_negative_slope(network, eta=0.9, subnetworks=True, xtol=1e-15):
    """Negative slope alpha in [0, 1] of the TReLU achieving mu_f^0(alpha) = eta.

    ``subnetworks=True`` uses the maximal c value function of TAT appendix B
    (max over subnetworks of C_g(0)); ``False`` the plain C_f(0) of eq. 12.
    Both are strictly decreasing in alpha on [0, 1], from the ReLU value at
    alpha = 0 down to 0 at alpha = 1 (a linear network), so the root is
    bracketed and found by Brent's method.

    Raises
    ------
    ValueError
        eta outside [0, 1], or eta above the ReLU value (unreachable with a
        non-negative slope for this network).
    """
    from .roots import brentq

    eta = _check_eta(eta)
    network = _as_network(network)
    if nonlinear_depth(network) == 0:
        raise ValueError("network has no nonlinear layer: C_f(0) does not depend on the negative slope")
    fn = (lambda a: maximal_c_value(network, a)) if subnetworks else \
        (lambda a: network_map(network, lambda c: trelu_c_map(c, a), 0.0))
    top = float(fn(0.0))
    if eta > top:
        raise ValueError(
            f"eta={eta} is not reachable with a non-negative negative_slope for this network: the largest "
            f"C_f(0), reached by ReLU (negative_slope=0), is {top:.6g}; lower eta or make the network deeper")
    if eta == 0.0:
        return 1.0
    if eta == top:
        return 0.0
    return float(brentq(lambda a: fn(a) - eta, 0.0, 1.0, xtol=xtol, rtol=4 * np.finfo(float).eps, maxiter=500))


def trelu_negative_slope(depth, eta=0.9, shortcut_weight=0.0, branch_depth=1, subnetworks=True):
    """TReLU negative slope for a vanilla net (``shortcut_weight=0``) or a rescaled ResNet.

    Solves C_f(0) = eta (TAT eq. 12; for rescaled ResNets the maximal c value
    over subnetworks, appendix B). ``depth`` counts combined layers along the
    residual path (see :func:`rescaled_resnet`).

    >>> 0.57 < trelu_negative_slope(100, eta=0.9) < 0.58
    True
    """
    depth = _check_depth(depth)
    eta = _check_eta(eta)
    w = _check_shortcut(shortcut_weight)
    net = vanilla(depth) if w == 0.0 and branch_depth == 1 else rescaled_resnet(depth, w, branch_depth)
    try:
        return solve_negative_slope(net, eta, subnetworks=subnetworks)
    except ValueError as err:
        if "not reachable" in str(err):
            raise ValueError(str(err).replace("for this network", f"at depth={depth}, shortcut_weight={w}")) \
                from None
        raise


def theorem1_bounds(c_f0):
    """TAT Theorem 1 bounds for TReLU networks (alpha >= 0) given C_f(0).

    Returns ``(max_c |C_f(c) - c| bound, max_c |C_f'(c) - 1| bound)`` =
    ``(min(4 C_f(0), 1 + C_f(0)), min(4 C_f(0), 1))``.
    """
    c0 = np.asarray(c_f0, dtype=np.float64)
    if np.any((c0 < 0) | (c0 > 1)) or not np.all(np.isfinite(c0)):
        raise ValueError(f"c_f0 must be in [0, 1], got {c_f0!r}")
    return np.minimum(4 * c0, 1 + c0), np.minimum(4 * c0, 1.0)


def equivalent_shortcut_weight(negative_slope):
    """Shortcut weight of the rescaled ReLU ResNet with the TReLU net's C map (TAT Prop. 1, corrected).

    w = sqrt(2 alpha / (1 + alpha^2)): then w^2 c + (1 - w^2) C_relu(c)
    equals the TReLU C map (eq. 9) for every c. The paper's statement prints
    sqrt(alpha / (1 + alpha^2)) (see the module docstring).
    """
    a = np.asarray(negative_slope, dtype=np.float64)
    if np.any(a < 0) or not np.all(np.isfinite(a)):
        raise ValueError(f"negative_slope must be >= 0, got {negative_slope!r}")
    return np.sqrt(2 * a / (1 + a * a))


def normalized_leaky_relu(negative_slope) -> "TransformedActivation":
    """phi~_alpha(x) = sqrt(2 / (1 + alpha^2)) LReLU_alpha(x), Q(q) = q (TAT section 4.1).

    ``negative_slope=0`` is the EOC ReLU sqrt(2) max(x, 0) (He initialisation).
    """
    if not is_number(negative_slope):
        raise ValueError(f"negative_slope must be a finite number, got {negative_slope!r}")
    a = float(negative_slope)
    return TransformedActivation("leaky_relu", gamma=math.sqrt(2.0 / (1.0 + a * a)), negative_slope=a)


def trelu(depth, eta=0.9, shortcut_weight=0.0, branch_depth=1) -> "TransformedActivation":
    """The Tailored Rectifier for the given network: :func:`normalized_leaky_relu` at the solved slope."""
    return normalized_leaky_relu(trelu_negative_slope(depth, eta, shortcut_weight, branch_depth))


# -- Proposition 3: the deep limit ----------------------------------------------
def _g(x):
    x = np.clip(x, -1.0, 1.0)
    return np.sqrt(1.0 - x * x) - x * np.arccos(x)


def _flow_time(a, b):
    """int_a^b dx / g(x): the ODE time to go from a to b (g > 0 on [-1, 1))."""
    from scipy.integrate import quad

    if b >= 1.0:
        return math.inf
    val, _ = quad(lambda t: 1.0 / _g(t), a, b, epsabs=0.0, epsrel=1e-13, limit=200)
    return val


def deep_limit_time(eta):
    """T with psi(0, T) = eta for the ODE dx/dt = sqrt(1 - x^2) - x arccos x (TAT Prop. 3)."""
    eta = _check_eta(eta)
    return _flow_time(0.0, eta)


def deep_limit_flow(c, t):
    """psi(c, t): the solution at time t >= 0 of TAT eq. 28 started at c.

    g(x) = sqrt(1 - x^2) - x arccos x > 0 on [-1, 1), so psi is the inverse of
    x -> int_c^x dy / g(y); the fixed point c = 1 is reached only as t -> inf.
    """
    from .roots import brentq

    if not is_number(t) or t < 0:
        raise ValueError(f"t must be a number >= 0, got {t!r}")
    c = np.clip(np.asarray(c, dtype=np.float64), -1.0, 1.0)
    out = np.empty(c.shape)
    for idx in np.ndindex(c.shape):
        c0 = float(c[idx])
        if c0 >= 1.0 or t == 0:
            out[idx] = c0
            continue
        # bracket: psi(c0, t) lies in (c0, 1); find b with flow time >= t
        lo, hi = c0, 1.0 - 1e-3
        while _flow_time(c0, hi) < t:
            hi = 1.0 - (1.0 - hi) * 1e-2
            if 1.0 - hi < 1e-15:
                break
        if _flow_time(c0, hi) < t:
            out[idx] = hi
            continue
        out[idx] = brentq(lambda b: _flow_time(c0, b) - t, lo, hi, xtol=1e-15, rtol=1e-14)
    return out[()] if out.ndim == 0 else out


def trelu_deep_limit(c, eta=0.9):
    """lim_{L -> inf} C_f(c) for vanilla TReLU networks with C_f(0) = eta (TAT eq. 27)."""
    return deep_limit_flow(c, deep_limit_time(eta))


# ---------------------------------------------------------------------------
# Transformed activations: phi_hat(x) = gamma (phi(alpha x + beta) + delta).
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TransformedActivation:
    """phi_hat(x) = gamma (phi(alpha x + beta) + delta) (DKS/TAT transformation).

    ``base`` is a registered activation name (or a sympy expression);
    ``negative_slope`` is the leaky-ReLU parameter when base is ``leaky_relu``.
    ``method`` records how the parameters were obtained.
    """

    base: object
    alpha: float = 1.0
    beta: float = 0.0
    gamma: float = 1.0
    delta: float = 0.0
    negative_slope: float | None = None
    method: str = ""

    def base_activation(self) -> Activation:
        if self.negative_slope is not None:
            return _activation(self.base, negative_slope=self.negative_slope)
        return _activation(self.base)

    @property
    def expr(self) -> sp.Expr:
        """phi_hat as a sympy expression in :data:`meanfield.symbols.x`."""
        phi = self.base_activation().expr
        return sp.Float(self.gamma) * (phi.subs(_x, sp.Float(self.alpha) * _x + sp.Float(self.beta))
                                       + sp.Float(self.delta))

    def activation(self) -> Activation:
        """phi_hat as a meanfield Activation (closed forms kept for scale-invariant bases)."""
        base = self.base_activation()
        if isinstance(base, ScaleInvariant) and self.beta == 0.0 and self.delta == 0.0 and self.alpha > 0:
            s = sp.Float(self.gamma * self.alpha)
            return ScaleInvariant(f"{base.name}_hat", self.expr, s * base.a_plus, s * base.a_minus)
        return Activation(f"{base.name}_hat", self.expr)

    def numpy(self) -> Callable:
        """Vectorised numpy phi_hat."""
        return _Funcs.of(self.base_activation()).transformed(self.alpha, self.beta, self.gamma, self.delta)

    def conditions(self) -> dict:
        """Q(1), Q'(1), C(0), C'(1), C''(1) of phi_hat at q = 1 (one-point quadratures).

        C(0) = E[phi_hat]^2 / Q(1), C^{(i)}(1) = E[phi_hat^{(i)}(z)^2] / Q(1).
        """
        f = _Funcs.of(self.base_activation())
        if f.homogeneous and self.beta == 0.0 and self.delta == 0.0:
            maps = local_maps(self.activation())
            return {"Q(1)": float(maps.Q(1.0)), "Q'(1)": float(maps.Q_prime(1.0)),
                    "C(0)": float(maps.C(0.0)), "C'(1)": float(maps.at_one(1)), "C''(1)": float(maps.at_one(2))}
        m = f.moments(self.alpha, self.beta, self.delta)
        g2, a = self.gamma ** 2, self.alpha
        Q1 = g2 * m["m2"]
        return {"Q(1)": Q1, "Q'(1)": g2 * a * a * (m["d1"] + m["p"]),
                "C(0)": g2 * m["m1"] ** 2 / Q1, "C'(1)": g2 * a * a * m["d1"] / Q1,
                "C''(1)": g2 * a ** 4 * m["d2"] / Q1}

    def __str__(self):
        base = self.base if isinstance(self.base, str) else str(self.base)
        if self.negative_slope is not None:
            base = f"leaky_relu[{self.negative_slope:.6g}]"
        return (f"{self.gamma:.6g} * ({base}({self.alpha:.6g} x + {self.beta:.6g}) + {self.delta:.6g})"
                + (f"  [{self.method}]" if self.method else ""))


class _Funcs:
    """phi, phi', phi'', phi''' of an activation as numpy functions, and the 1-D moments."""

    def __init__(self, act: Activation):
        self.act = act
        self.homogeneous = isinstance(act, ScaleInvariant)
        # kinks (ELU, SELU, hard-tanh, Max/Abs/Piecewise user expressions): derivatives piece by
        # piece (Max would give Heaviside, DiracDelta); the fixed rule split at z = 0 loses its
        # accuracy at a kink z = (c - beta)/alpha elsewhere, so those moments are taken by the
        # engine split there; jumps of phi' add delta terms to phi''
        info = pieces(sp.Lambda(_x, act.expr))
        d = [info.expr]
        for _ in range(3):
            d.append(sp.diff(d[-1], info.var))
        self.f = [numpy_function(sp.Lambda(info.var, e)) for e in d]
        self._z = np.concatenate([RULE_U, -RULE_U])
        self._w = np.concatenate([RULE_W, RULE_W])
        self.cuts = info.float_cuts
        self.jump1 = tuple(float(j) for j in info.jump1)
        self.jumps = any(j != 0 for j in info.jump0)

    @staticmethod
    @lru_cache(maxsize=64)
    def of(act: Activation) -> "_Funcs":
        return _Funcs(act)

    def transformed(self, alpha, beta, gamma, delta):
        f0 = self.f[0]
        return lambda x: gamma * (f0(alpha * np.asarray(x, dtype=np.float64) + beta) + delta)

    def E(self, values):
        return float(self._w @ values)

    def moments(self, alpha, beta, delta=0.0):
        """E over z ~ N(0,1) with y = alpha z + beta of the quantities the conditions need."""
        if self.cuts:
            return self._moments_split(alpha, beta, delta)
        y = alpha * self._z + beta
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            f0, f1, f2 = self.f[0](y), self.f[1](y), self.f[2](y)
        m1 = self.E(f0) + delta
        g0 = f0 + delta
        return {"m1": m1, "m2": self.E(g0 * g0), "d1": self.E(f1 * f1), "d2": self.E(f2 * f2),
                "p": self.E(g0 * f2), "mean": self.E(f0)}

    def _moments_split(self, alpha, beta, delta):
        """:meth:`moments` of a kinked activation: the quadrature engine split at its breakpoints.

        phi'' is taken in the weak sense: a jump J1 of phi' at c adds J1 delta(y - c), so
        E[(phi + delta) phi''] gains J1 (phi(c) + delta) p_y(c) and E[phi''^2] is inf.
        """
        if self.jumps:
            raise ValueError(f"activation {self.act.name!r} jumps: phi' has a delta term and E[phi'^2] is infinite")
        f0, f1, f2 = self.f[0], self.f[1], self.f[2]
        cuts = [c - beta for c in self.cuts]

        def E(g):
            value, _, _, converged = quad1(lambda h: g(h + beta), alpha, cuts)
            if not converged:
                raise FloatingPointError("moment quadrature did not converge")
            return float(value)

        mean = E(f0)
        p = E(lambda y: (f0(y) + delta) * f2(y))
        for c, j in zip(self.cuts, self.jump1):
            if j != 0.0:
                p += j * (self.at(0, c) + delta) * math.exp(-0.5 * ((c - beta) / alpha) ** 2) / (
                    alpha * math.sqrt(2 * math.pi))
        d2 = math.inf if any(j != 0.0 for j in self.jump1) else E(lambda y: f2(y) ** 2)
        return {"m1": mean + delta, "m2": E(lambda y: (f0(y) + delta) ** 2), "d1": E(lambda y: f1(y) ** 2),
                "d2": d2, "p": p, "mean": mean}

    def at(self, order, beta):
        return float(self.f[order](np.array([beta]))[0])


def _smooth_base(activation, method):
    if isinstance(activation, TransformedActivation):
        raise ValueError("pass the untransformed activation (a name or sympy expression), not a TransformedActivation")
    act = _activation(activation)
    if isinstance(act, ScaleInvariant):
        raise ValueError(
            f"activation {act.name!r} is positively homogeneous (ReLU family): its C''(1) is infinite and "
            f"gamma is redundant, so {method} for smooth activations does not apply; use "
            "meanfield.shaping.trelu (TAT for leaky ReLUs) instead")
    return act


def _resolve_network(depth, network):
    if (depth is None) == (network is None):
        raise ValueError("give exactly one of depth (a vanilla network) or network (a network tree)")
    net = vanilla(depth) if network is None else _as_network(network)
    if nonlinear_depth(net) == 0:
        raise ValueError("network has no nonlinear layer: there is nothing to shape")
    return net


# The DKS/TAT searches are nested one-dimensional *bracketed* root finds on fixed grids, so
# that whether a solution is found does not hinge on the last bits of the moments (an earlier
# hybr continuation with finite-difference Jacobians succeeded or failed by machine).
_BETA_GRID = np.linspace(-6.0, 6.0, 49)   # outer scan of the input shift beta, step 1/4
_ALPHA_START, _ALPHA_MIN, _ALPHA_MAX = 2.0 ** -6, 2.0 ** -30, 2.0 ** 7   # inner doubling scan


def _first_crossing(fn, target):
    """Smallest alpha found where fn(alpha) rises through ``target``, or None.

    fn(alpha) - target must be < 0 as alpha -> 0 (C'(1) -> 1 and alpha^2 E[phi''^2]/E[phi'^2]
    -> 0 do). The bracket comes from a doubling scan: down from 2^-6 (to 2^-30) while the
    value is not yet below target, then up (to 2^7) to the first grid point above it;
    brentq polishes inside that bracket to relative 1e-15. Non-finite values end the scan.
    """
    from .roots import brentq

    def v(a):
        out = fn(a) - target
        if not math.isfinite(out):
            raise FloatingPointError("non-finite moment")
        return out

    try:
        lo = _ALPHA_START
        f_lo = v(lo)
        while f_lo >= 0.0:
            lo /= 2.0
            if lo < _ALPHA_MIN:
                return None
            f_lo = v(lo)
        hi = lo
        while True:
            hi *= 2.0
            if hi > _ALPHA_MAX:
                return None
            f_hi = v(hi)
            if f_hi > 0.0:
                break
            lo = hi
        return brentq(v, lo, hi, xtol=1e-300, rtol=1e-15, maxiter=200)
    except (FloatingPointError, ZeroDivisionError, OverflowError, ValueError):
        return None


def _bracketed_roots(g, grid=_BETA_GRID):
    """Roots of g(beta): sign changes between finite values on ``grid``, polished by brentq.

    g returns NaN where its inner problem has no solution; a bracket whose polish meets one
    is dropped. Every root is returned (the caller verifies and chooses).
    """
    from .roots import brentq

    def strict(b):
        out = g(b)
        if not math.isfinite(out):
            raise FloatingPointError("inner search failed inside a bracket")
        return out

    with np.errstate(all="ignore"):
        vals = [g(float(b)) for b in grid]
    roots = []
    for b0, b1, v0, v1 in zip(grid[:-1], grid[1:], vals[:-1], vals[1:]):
        if not (math.isfinite(v0) and math.isfinite(v1)):
            continue
        if v0 == 0.0:
            roots.append(float(b0))
        elif v0 * v1 < 0.0:
            try:
                with np.errstate(all="ignore"):
                    roots.append(float(brentq(strict, b0, b1, xtol=1e-14, rtol=4 * np.finfo(float).eps)))
            except (FloatingPointError, ZeroDivisionError, OverflowError, ValueError):
                continue
    return roots


def _centred(f, alpha, beta):
    """Moments at delta = -phi(beta) with Var phi(y) = m2 - m1^2 (no cancellation: m1 = O(alpha^2))."""
    m = f.moments(alpha, beta, -f.at(0, beta))
    return m, m["m2"] - m["m1"] ** 2


def _finish(act, alpha, beta, delta, method, targets, tol):
    f = _Funcs.of(act)
    m = f.moments(alpha, beta, delta)
    gamma = 1.0 / math.sqrt(m["m2"])
    t = TransformedActivation(act.name if act.name in ACTIVATIONS else act.expr,
                              float(alpha), float(beta), float(gamma), float(delta), method=method)
    got = t.conditions()
    bad = {k: (got[k], v) for k, v in targets.items() if not abs(got[k] - v) <= tol * max(1.0, abs(v))}
    return t, bad


def tat_transform(activation, tau=0.3, depth=None, network=None, tol=1e-10) -> TransformedActivation:
    """TAT for a smooth activation: Q(1) = 1, Q'(1) = 1, C'(1) = 1, C''(1) = kappa (TAT eq. 14, Alg. 2).

    phi_hat(x) = gamma (phi(alpha x + beta) + delta) (Zhang et al. 2022, TAT). kappa is the
    local curvature that makes the maximal curvature function mu_f^2(kappa) equal ``tau``
    (appendix B; kappa = tau / L for an L-layer vanilla network). Writing y = alpha z + beta,
    z ~ N(0, 1), and m2 = E[(phi(y) + delta)^2],

        C'(1)  = alpha^2 E[phi'(y)^2] / m2                    = 1
        Q'(1)  = alpha^2 (E[phi'(y)^2] + E[(phi + delta) phi''(y)]) / m2 = 1
        C''(1) = alpha^4 E[phi''(y)^2] / m2                   = kappa

    and gamma = m2^{-1/2} gives Q(1) = 1 (eq. 15). Given C'(1) = 1 the other two reduce to

        alpha^2 E[phi''^2] / E[phi'^2] = kappa                (free of delta)
        E[(phi + delta) phi''] = 0                             (Q'(1) = C'(1))

    and C'(1) = 1 is quadratic in delta: delta = -E[phi] +- sqrt(alpha^2 E[phi'^2] - Var phi),
    real by the Gaussian Poincare inequality. The search is nested and bracketed: for each
    beta, alpha is the first root of the first line (doubling scan in alpha from 2^-6, then
    brentq); then E[(phi + delta) phi''] as a function of beta, for each sign of the root, is
    scanned on beta = -6, -5.75, ..., 6 and its sign changes polished by brentq. Every root is
    checked on all four conditions (to ``tol``); among several the one with the smallest
    |beta| is returned (the input distribution closest to the activation's centre, not in an
    asymptotic tail).

    Raises
    ------
    ValueError
        tau <= 0, a ReLU-family activation, no nonlinear layer, or no
        solution found (the message says which conditions failed).
    """
    if not is_number(tau) or float(tau) <= 0:
        raise ValueError(f"tau must be a number > 0, got {tau!r}")
    act = _smooth_base(activation, "TAT")
    net = _resolve_network(depth, network)
    kappa = float(tau) / float(maximal_curvature(net, 1.0))
    f = _Funcs.of(act)

    @lru_cache(maxsize=None)
    def alpha_of(beta):
        def curvature(a):
            m = f.moments(a, beta, 0.0)
            return a * a * m["d2"] / m["d1"]
        return _first_crossing(curvature, kappa)

    def params(beta, sign):
        a = alpha_of(beta)
        if a is None:
            return None
        m, var = _centred(f, a, beta)
        mean = m["mean"]
        return a, beta, -mean + sign * math.sqrt(max(a * a * m["d1"] - var, 0.0))

    def q_slope_gap(beta, sign):
        p = params(beta, sign)
        if p is None:
            return math.nan
        a, b, d = p
        m = f.moments(a, b, d)
        # alpha^2 E[(phi + delta) phi''] / m2 = Q'(1) - C'(1), O(1)-scaled by its own m2
        return a * a * m["p"] / m["m2"]

    candidates = []
    for sign in (1.0, -1.0):
        for b in _bracketed_roots(lambda b, s=sign: q_slope_gap(b, s)):
            candidates.append(params(b, sign))
    targets = {"Q(1)": 1.0, "Q'(1)": 1.0, "C'(1)": 1.0, "C''(1)": kappa}
    return _best_solution(act, candidates, targets, tol, "TAT")


def dks_transform(activation, zeta=1.5, depth=None, network=None, tol=1e-10) -> TransformedActivation:
    """DKS: Q(1) = 1, Q'(1) = 1, C(0) = 0 and maximal slope mu_f^1(C'(1)) = zeta (Martens et al. 2021).

    phi_hat(x) = gamma (phi(alpha x + beta) + delta). C(0) = 0 locally (delta = -E[phi(y)],
    y = alpha z + beta, z ~ N(0, 1)) gives C_f(0) = 0 for every network of the family; the
    local slope s = C'(1) solves mu_f^1(s) = zeta (s = zeta^{1/L} for an L-layer vanilla
    network); gamma = (Var phi(y))^{-1/2} gives Q(1) = 1. The remaining two conditions,

        C'(1) = alpha^2 E[phi'(y)^2] / Var phi(y)                         = s
        Q'(1) = alpha^2 (E[phi'^2] + E[(phi - E phi) phi'']) / Var phi(y) = 1,

    are solved nested and bracketed: for fixed beta, C'(1) -> 1 as alpha -> 0 and C'(1) >= 1
    (Gaussian Poincare inequality), so alpha(beta) is the first root of C'(1) = s on a
    doubling scan in alpha from 2^-6, polished by brentq; then Q'(1) - 1 at alpha(beta) is
    scanned on beta = -6, -5.75, ..., 6 and its sign changes polished by brentq. Every root is
    checked on all four conditions (to ``tol``); among several the one with the smallest
    |beta| is returned.

    Raises
    ------
    ValueError
        zeta <= 1, a ReLU-family activation, no nonlinear layer, or no solution.
    """
    from .roots import brentq

    if not is_number(zeta) or float(zeta) <= 1.0:
        raise ValueError(f"zeta must be a number > 1, got {zeta!r}")
    zeta = float(zeta)
    act = _smooth_base(activation, "DKS")
    net = _resolve_network(depth, network)
    slope = brentq(lambda s: maximal_slope(net, s) - zeta, 1.0, zeta, xtol=1e-15, rtol=1e-15)
    f = _Funcs.of(act)

    @lru_cache(maxsize=None)
    def alpha_of(beta):
        def c_slope(a):
            m, var = _centred(f, a, beta)
            return a * a * m["d1"] / var
        return _first_crossing(c_slope, slope)

    def params(beta):
        a = alpha_of(beta)
        return None if a is None else (a, beta, -f.moments(a, beta)["mean"])

    def q_slope_gap(beta):
        p = params(beta)
        if p is None:
            return math.nan
        a, b, d = p
        m = f.moments(a, b, d)
        return a * a * (m["d1"] + m["p"]) / m["m2"] - 1.0

    candidates = [params(b) for b in _bracketed_roots(q_slope_gap)]
    targets = {"Q(1)": 1.0, "Q'(1)": 1.0, "C(0)": 0.0, "C'(1)": slope}
    return _best_solution(act, candidates, targets, tol, "DKS")


def _best_solution(act, candidates, targets, tol, method):
    """Verify each candidate (alpha, beta, delta) on all conditions and pick the smallest |beta|."""
    found, failures = [], []
    for c in candidates:
        if c is None:
            continue
        with np.errstate(all="ignore"):
            try:
                t, bad = _finish(act, *c, method, targets, tol)
            except (ValueError, FloatingPointError, ZeroDivisionError, OverflowError):
                continue
        if bad:
            failures.append(bad)
        else:
            found.append(t)
    if not found:
        detail = f"; closest attempt missed (value, target) {failures[0]}" if failures else ""
        raise ValueError(
            f"{method}: found no transformation of {act.name!r} with {targets}{detail}. The target is "
            "probably unreachable for this activation: use a deeper network or a milder target "
            "(smaller tau / zeta)")
    # Prefer the solution whose input distribution sits closest to the activation's
    # centre (smallest |beta|): far-shifted solutions live in an asymptotic tail
    # (e.g. GELU or SiLU at beta ~ 3, where they are nearly linear), where phi's
    # curvature comes from rare inputs only.
    found.sort(key=lambda t: (round(abs(t.beta), 6), -t.beta))
    return found[0]
