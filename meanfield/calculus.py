r"""The signal-propagation calculus: primitives, blocks and the Architecture spec.

In the infinite-width limit a block maps the statistics of its input to those
of its output, and the APJN between block outputs factorises into one factor
per primitive (partial-Jacobian paper, Theorem 2.5 and eq. 14). The state is
a :class:`Signal`: the second moment K = E[h(x)^2] of one input, the
cross-moment K12 = E[h(x) h(x')] of a second input of the same norm, and, for
post-activation signals, the mean E[phi].

=====================  ===================================  ==========================
primitive              state map                            chi factor
=====================  ===================================  ==========================
Dense(sw, sb)          K -> sw^2 K + sb^2 (K12 likewise)    sw^2
Activation(phi)        K -> E[phi^2], K12 -> E[phi phi]     E[phi'(h)^2]
LayerNormPre           (K, K12) -> (1, K12/K)               1/K
LayerNormPost          q -> 1, q12 -> (q12-m^2)/(q-m^2)     1/(q - m^2) = 1/Var[phi]
BatchNorm (|B|->inf)   (K, K12) -> (1, 0)                   1/(K - K12)
Scale(eps)             K -> eps^2 K                         eps^2
Residual(mu, branch)   K -> K_branch + mu^2 K               chi_branch + mu^2
=====================  ===================================  ==========================

Sources: Dense/Activation eqs. 9, 11; LayerNormPre eq. 20 (D.4); LayerNormPost
eqs. 52-55 (D.5); Residual eqs. 57-60 (E) and 62, 67 (F) of the
partial-Jacobian paper; BatchNorm AutoInit Conjecture 3.1 (eq. 23) and
partial-Jacobian eqs. 24-25; Scale/LayerScale AutoInit appendix D.

Why the factors multiply: a Dense layer's fresh weights decorrelate the
Jacobian of what follows from what precedes, element-wise derivatives
(phi'(h)) enter only through their second moment, and normalisations have
deterministic derivatives at infinite width (the rank-one projection terms
of LayerNorm and the O(1/|B|) cross-sample terms of BatchNorm drop out of
the APJN). A Residual's cross terms vanish because its branch ends in
zero-mean weights. So every element-wise primitive must be followed, within
its block, by a Dense layer; :class:`Chain` checks this.

Conventions (also in docs/theory.md): standard parameterisation W ~ N(0,
sigma_w^2 / fan_in), b ~ N(0, sigma_b^2); APJN normalised by the output
width (partial-Jacobian eq. 3); ``ln_pre`` normalises preactivations before
phi and the skip adds the un-normalised h; ``ln_post`` normalises phi(h)
(appendix D.5); BatchNorm is per neuron over the batch, large-batch limit,
and the two-point state describes a pair of inputs of equal norm.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Tuple

import numpy as np
import sympy as sp

from . import symbols as S
from ._validate import check_choice, check_real, is_number
from .activations import Activation, activation as _make_activation
from .gap import one_minus, sum_gap

__all__ = [
    "Signal",
    "GramSignal",
    "Primitive",
    "Dense",
    "ActivationLayer",
    "LayerNormPre",
    "LayerNormPost",
    "BatchNorm",
    "Scale",
    "LayerNorm",
    "RMSNorm",
    "Chain",
    "Residual",
    "TreeSpec",
    "Architecture",
    "Network",
    "serial",
    "residual",
    "dense",
    "act",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "scale",
    "mlp",
    "resmlp",
    "mixer",
    "tree_to_json",
    "tree_from_json",
    "to_json",
    "from_json",
    "NORMS",
    "BLOCKS",
    "mlp_block",
    "resmlp_block",
    "mixer_block",
    "as_architecture",
]


# ---------------------------------------------------------------------------
# State.
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Signal:
    """Infinite-width statistics of one element of a layer's output, and of a pair.

    K : E[h^2];  K12 : covariance of the pair;  mean : E[h] (0 for
    preactivations);  gaussian : True for preactivations (Gaussian at
    infinite width);  pair_axis : what the two members of the pair differ in.

    ``pair_axis='batch'`` (MLP, ResMLP): the pair is two inputs x, x' of equal
    norm, K12 = E[h(x) h(x')], what BatchNorm needs. ``pair_axis='channels'``
    (MLP-Mixer): the pair is two channels of the same token, what the Mixer's
    channel LayerNorm subtracts, because token-mixing weights and biases are
    shared by all channels.
    """

    K: sp.Expr
    K12: sp.Expr
    mean: sp.Expr = sp.Integer(0)
    gaussian: bool = True
    pair_axis: str = "batch"
    var: sp.Expr | None = None   # Var[h] where K - mean^2 would cancel (set by ActivationLayer)

    @classmethod
    def input(cls, pair_axis: str = "batch") -> "Signal":
        """The symbolic block input: a Gaussian with kernel (K, K12)."""
        return cls(S.K, S.K12, pair_axis=pair_axis)

    def to(self, K, K12, mean=sp.Integer(0), gaussian=True, var=None) -> "Signal":
        """A new state along the same pair axis."""
        return Signal(K, K12, mean, gaussian, self.pair_axis, var)

    @property
    def variance(self) -> sp.Expr:
        """Var[h] = K - mean^2, or the cancellation-free form an activation supplied."""
        return self.K - self.mean**2 if self.var is None else self.var


@dataclass(frozen=True)
class GramSignal:
    """Infinite-width state of a pair of inputs x, x' of any norms, with the NTK (:mod:`meanfield.gram`).

    K1 = E[z(x)^2], K2 = E[z(x')^2], K12 = E[z(x) z(x')] (raw second moments,
    means included); m1, m2 = E[z(x)], E[z(x')] (0 for preactivations);
    T12 = Theta(x, x'), the per-unit neural tangent kernel of z with respect
    to every parameter before this point; gaussian : True for
    preactivations. ``parameterization`` ('ntk' or 'standard') and ``width``
    (the fan-in of hidden Dense layers, used by 'standard' only) say how a
    Dense layer adds its own parameters to T12. Each primitive maps it with
    :meth:`Primitive.gram`; the diagonal (x = x') is the same map at
    K1 = K2 = K12.

    gap : 1 - rho^2 = (K1 K2 - K12^2) / (K1 K2), rho = K12 / sqrt(K1 K2), carried
    exactly (None: unknown, each rule recomputes it from the K's as before).
    Near rho = +-1 the rounded K's know rho only to ~1e-16 absolute, while the
    arc-cosine kernels depend on theta = arccos(rho) ~ sqrt(2 (1 - rho)), so
    every rule that keeps the gap maps it without cancellation
    (:func:`sum_gap`, :meth:`normalised`, ``Activation.kernel_gap``).

    centred : (Var z(x), Var z(x'), Cov(z(x), z(x'))) where the activation supplied them
    (``Activation.centred_kernel``: phi(0) != 0), None elsewhere. K_i - m_i^2 and K12 - m1 m2
    are differences of numbers ~phi(0)^2 at small K (softplus: ~1e-16/K relative lost); a
    centring normalisation takes these instead. Rescalings (scale, RMSNorm) carry them.
    """

    K1: sp.Expr
    K2: sp.Expr
    K12: sp.Expr
    T12: sp.Expr = sp.Integer(0)
    m1: sp.Expr = sp.Integer(0)
    m2: sp.Expr = sp.Integer(0)
    gaussian: bool = True
    parameterization: str = "ntk"
    width: sp.Expr = sp.Integer(1)
    gap: sp.Expr = None
    centred: tuple = None

    def to(self, K1, K2, K12, T12, m1=sp.Integer(0), m2=sp.Integer(0), gaussian=True, gap=None,
           centred=None) -> "GramSignal":
        """A new state with the same conventions (``gap``, ``centred``: the new ones, None where not known)."""
        return replace(self, K1=K1, K2=K2, K12=K12, T12=T12, m1=m1, m2=m2, gaussian=gaussian, gap=gap,
                       centred=centred)

    def centred_moments(self):
        """(Var z(x), Var z(x'), Cov): the carried cancellation-free ones, else K_i - m_i^2, K12 - m1 m2."""
        if self.centred is not None:
            return self.centred
        return self.K1 - self.m1**2, self.K2 - self.m2**2, self.K12 - self.m1 * self.m2

    @property
    def rho(self):
        return self.K12 / sp.sqrt(self.K1 * self.K2)

    def normalised(self, v1, v2, centre: bool, m1=sp.Integer(0), m2=sp.Integer(0)) -> "GramSignal":
        """z -> (z - c E z) / sqrt(v) per input (deterministic divisor at infinite width).

        The rank-one terms of the normalisation's Jacobian (through the mean
        and the divisor) are O(1/N) per unit, so the NTK is divided by
        sqrt(v1 v2) like the cross moment.
        """
        d = sp.sqrt(v1 * v2)
        if centre and self.centred is not None:
            # the activation's cancellation-free moments (phi(0) != 0 at small K): v_i are its variances
            V1, V2, C12 = self.centred
            return self.to(V1 / v1, V2 / v2, C12 / d, self.T12 / d, m1, m2, self.gaussian)
        K12 = (self.K12 - self.m1 * self.m2) / d if centre else self.K12 / d
        c = 1 if centre else 0
        gap = self.gap
        if gap is not None and centre and not (self.m1 == 0 or self.m2 == 0):
            # the centred pair's gap: det(M - m m^T) = det M - Q, Q = K2 m1^2 + K1 m2^2 - 2 K12 m1 m2, per K1 K2:
            # Q / (K1 K2) = (n1 - n2)^2 + 2 n1 n2 (1 - sign(m1 m2) rho), n_i = |m_i| / sqrt(K_i), both terms >= 0
            # (for ReLU-like phi n^2 = 1/pi: Q is a third of det M, no cancellation); K_i / v_i = 1 / (1 - n_i^2)
            n1, n2 = sp.Abs(self.m1) / sp.sqrt(self.K1), sp.Abs(self.m2) / sp.sqrt(self.K2)
            q = (n1 - n2) ** 2 + 2 * n1 * n2 * one_minus(sp.sign(self.m1 * self.m2) * self.rho, gap)
            gap = (gap - q) * (self.K1 / v1) * (self.K2 / v2)
        # without centring (or with zero means) the map rescales each input: rho and its gap stay,
        # and so do the carried centred moments, rescaled
        cen = None
        if not centre and self.centred is not None:
            V1, V2, C12 = self.centred
            cen = (V1 / v1, V2 / v2, C12 / d)
        return self.to((self.K1 - c * self.m1**2) / v1, (self.K2 - c * self.m2**2) / v2, K12, self.T12 / d,
                       m1, m2, self.gaussian, gap, cen)


# ---------------------------------------------------------------------------
# Primitives.
# ---------------------------------------------------------------------------
class Primitive:
    """A layer of the calculus: a state map and an APJN factor."""

    elementwise = False  # needs a Dense layer after it for chi to factorise

    def forward(self, s: Signal) -> Signal:  # pragma: no cover - interface
        raise NotImplementedError

    def chi(self, s: Signal) -> sp.Expr:  # pragma: no cover - interface
        raise NotImplementedError

    def chi_delta(self, s: Signal) -> sp.Expr:
        """This primitive's part of chi_Delta (only activations have one)."""
        return sp.Integer(0)

    def gram(self, g: "GramSignal") -> "GramSignal":
        """The map of the two-input state with the NTK (:class:`GramSignal`); see :mod:`meanfield.gram`."""
        raise ValueError(f"{_short(self)} has no Gram-matrix rule (two inputs of any norms)")

    def primitives(self):
        yield self


@dataclass(frozen=True)
class Dense(Primitive):
    """Affine layer W phi + b with W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2).

    ``axis`` is what it mixes: 'features' (MLP), 'tokens' (the token-mixing
    layers of ResMLP and MLP-Mixer) or 'channels' (the Mixer's channel MLP).
    K -> sigma_w^2 K + sigma_b^2 in every case. The pair covariance depends on
    whether the two members share the layer's weights: if the layer mixes
    along the pair's own axis, the two are different output rows with
    independent weights and biases, so K12 -> 0; otherwise they share W and b
    and K12 -> sigma_w^2 K12 + sigma_b^2.
    """

    sigma_w: sp.Expr = S.sigma_w
    sigma_b: sp.Expr = S.sigma_b
    axis: str = "features"

    def __post_init__(self):
        check_real("sigma_w", self.sigma_w, minimum=0)
        check_real("sigma_b", self.sigma_b, minimum=0)

    def forward(self, s):
        K = self.sigma_w**2 * s.K + self.sigma_b**2
        if self.axis == s.pair_axis:
            return s.to(K, sp.Integer(0))
        return s.to(K, self.sigma_w**2 * s.K12 + self.sigma_b**2)

    def chi(self, s):
        return self.sigma_w**2

    def gram(self, g):
        # NTK: Theta' = (own parameters) + sigma_w^2 Theta. 'ntk': W = sigma_w w / sqrt(n), b = sigma_b beta
        # with (w, beta) trained, so the own part is sigma_w^2 E[z z'] + sigma_b^2 = K12'; 'standard': W, b
        # trained directly, n E[z z'] + 1 (neural-tangents' convention, n = fan-in)
        if self.axis != "features":
            raise ValueError(f"{_short(self)}: Gram matrices over inputs are for layers along the features only")
        sw2, sb2 = self.sigma_w**2, self.sigma_b**2
        K12 = sw2 * g.K12 + sb2
        own = K12 if g.parameterization == "ntk" else g.width * g.K12 + 1
        # the bias is one number for both inputs: correlation 1, gap 0
        gap = None if g.gap is None else sum_gap(sw2 * g.K1, sw2 * g.K2, g.rho, g.gap, sb2, sb2, 1, 0)
        return g.to(sw2 * g.K1 + sb2, sw2 * g.K2 + sb2, K12, own + sw2 * g.T12, gap=gap)


@dataclass(frozen=True)
class ActivationLayer(Primitive):
    """phi applied element-wise to a Gaussian preactivation (eqs. 9 and 11)."""

    phi: Activation
    elementwise = True

    def forward(self, s):
        _require_gaussian(self, s)
        return s.to(self.phi.second_moment(s.K), self.phi.kernel(s.K, s.K, s.K12),
                    self.phi.mean(s.K), gaussian=False, var=self.phi.variance(s.K))

    def chi(self, s):
        _require_gaussian(self, s)
        return self.phi.derivative_second_moment(s.K)

    def chi_delta(self, s):
        return self.phi.chi_delta_moment(s.K)

    def gram(self, g):
        if not g.gaussian:
            raise ValueError(f"{_short(self)} needs a Gaussian preactivation as input; put a dense layer before it")
        phi = self.phi
        gap = None if g.gap is None else phi.kernel_gap(g.K1, g.K2, g.K12, g.gap)
        return g.to(phi.second_moment(g.K1), phi.second_moment(g.K2), phi.kernel(g.K1, g.K2, g.K12, gap=g.gap),
                    phi.derivative_kernel(g.K1, g.K2, g.K12, gap=g.gap) * g.T12, phi.mean(g.K1), phi.mean(g.K2),
                    gaussian=False, gap=gap, centred=phi.centred_kernel(g.K1, g.K2, g.K12))


def _centres_pair(norm, s: Signal) -> bool:
    """True when a normalisation runs along the pair's own axis.

    Its mean then removes the part the two members share (covariance K12),
    and its variance is K - K12: the pair comes out uncorrelated. This is
    BatchNorm for a pair of inputs, and the Mixer's channel LayerNorm for a
    pair of channels.
    """
    return norm.axis == s.pair_axis


@dataclass(frozen=True)
class LayerNormPre(Primitive):
    """LayerNorm on preactivations, h -> h / sqrt(K) at infinite width (eq. 19).

    Along the pair axis (the Mixer's channel LayerNorm, axis='channels') it
    centres like BatchNorm: (K, K12) -> (1, 0), chi = 1/(K - K12).
    """

    axis: str = "features"
    elementwise = True

    def forward(self, s):
        _require_gaussian(self, s)
        if _centres_pair(self, s):
            return s.to(sp.Integer(1), sp.Integer(0))
        return s.to(sp.Integer(1), s.K12 / s.K)

    def chi(self, s):
        return 1 / (s.K - s.K12) if _centres_pair(self, s) else 1 / s.K

    def gram(self, g):
        _features_only(self)
        if not g.gaussian:
            raise ValueError(f"{_short(self)} needs a Gaussian preactivation as input; put a dense layer before it")
        return g.normalised(g.K1, g.K2, centre=True)


@dataclass(frozen=True)
class BatchNorm(Primitive):
    """BatchNorm of preactivations per neuron over the batch, |B| -> infinity.

    With all inputs of equal norm, h_i(x) = sqrt(K12) g_i + sqrt(K - K12) e_i(x):
    the batch mean removes the shared part g_i and the batch variance is
    K - K12, so normalised outputs are N(0, 1) and uncorrelated across inputs
    (AutoInit Conjecture 3.1, eq. 23; partial-Jacobian eqs. 24-25).
    """

    axis = "batch"
    elementwise = True

    def forward(self, s):
        _require_gaussian(self, s)
        if not _centres_pair(self, s):
            raise ValueError("BatchNorm needs the pair state of two inputs (pair_axis='batch')")
        return s.to(sp.Integer(1), sp.Integer(0))

    def chi(self, s):
        return 1 / (s.K - s.K12)

    def gram(self, g):
        raise ValueError("batch_norm() couples the inputs of a batch: its kernel is not a map of one pair "
                         "(K1, K2, K12); meanfield.kernels applies BatchNorm.gram_batch to the whole batch")

    @staticmethod
    def gram_batch(K, T=None):
        r"""The large-batch map of the batch's NNGP (and NTK) Gram matrices (:mod:`meanfield.gram`).

        ``K``, ``T``: (n, n) float arrays over the n inputs of the batch (the
        per-unit kernel and NTK of the Gaussian preactivation h entering the
        node). Per unit, y = P h / s with P = I - 1 1^T / n (the batch mean)
        and s^2 = h^T P h / n (the biased batch variance, no epsilon: the
        convention of the torch realisation). At infinite width h ~ N(0, K);
        when the batch is large (n_eff = tr(PKP)^2 / tr((PKP)^2) -> infinity)
        s^2 concentrates at tr(PKP) / n, so y is Gaussian with

            K' = n P K P / tr(P K P).

        The Jacobian dy/dh = (P - y y^T / n) / s annihilates the batch
        direction 1 exactly; on the rest the y y^T / n term contributes
        O(1/n_eff) to J T J^T when K, T carry no other O(n) eigenvalue (the
        same order as the neglected fluctuations of s), so

            T' = n P T P / tr(P K P).

        (Equal norms, K = (K - K12) I + K12 1 1^T, give K' -> I: the
        (K, K12) -> (1, 0) of :meth:`forward`; the NTK's growth factor for
        ReLU is pi / (pi - 1), Yang et al. 2019's gradient explosion rate.)
        """
        K = np.asarray(K, dtype=np.float64)
        n = K.shape[0]
        if n < 2:
            raise ValueError("BatchNorm normalises over the batch: it needs at least 2 inputs (x1 with n >= 2 rows)")

        def centre(M):
            # P M P for a symmetric M, written so that the result is symmetric to the last bit
            r = M.mean(axis=1)
            return M - (r[:, None] + r[None, :]) + r.mean()

        PKP = centre(K)
        scale = n / np.trace(PKP)
        return PKP * scale, (None if T is None else centre(np.asarray(T, dtype=np.float64)) * scale)


@dataclass(frozen=True)
class LayerNorm(Primitive):
    """LayerNorm wherever it sits: (x - E x) / sqrt(Var x) over the features (eqs. 19, 50).

    On a preactivation (mean 0) it is :class:`LayerNormPre`, on phi(h) it is
    :class:`LayerNormPost`; the state's mean (0 for a Gaussian) selects the
    formula, so one node serves both positions:
    (K, K12, m) -> (1, (K12 - m^2)/(K - m^2)), chi = 1/(K - m^2).
    Along the pair axis (the Mixer's channel LayerNorm) it centres the pair:
    (K, K12) -> (1, 0), chi = 1/(K - K12).
    """

    axis: str = "features"
    elementwise = True

    def forward(self, s):
        if _centres_pair(self, s):
            return s.to(sp.Integer(1), sp.Integer(0), gaussian=s.gaussian)
        return s.to(sp.Integer(1), (s.K12 - s.mean**2) / s.variance, gaussian=s.gaussian)

    def chi(self, s):
        return 1 / (s.K - s.K12) if _centres_pair(self, s) else 1 / s.variance

    def gram(self, g):
        _features_only(self)
        v1, v2, _ = g.centred_moments()
        return g.normalised(v1, v2, centre=True)


@dataclass(frozen=True)
class LayerNormPost(LayerNorm):
    """LayerNorm on activations, phi -> (phi - E phi) / sqrt(Var phi) (eq. 50).

    The maths is :class:`LayerNorm`'s (the state's mean selects it); this
    node only records the position 'post' the user asked for, which the torch
    realisation and the architecture's repr keep.
    """


@dataclass(frozen=True)
class RMSNorm(Primitive):
    r"""RMSNorm without gain, x -> x / sqrt(mean_i x_i^2) (Zhang & Sennrich 2019, eq. 4).

    At infinite width the mean of x_i^2 over the N features is its
    expectation K (law of large numbers), so x -> x / sqrt(K) with a
    deterministic divisor, before phi (pre: on a Gaussian preactivation) or
    after it (post: on phi(h), whose mean m is kept, not subtracted):

        (K, K12, m) -> (1, K12 / K, m / sqrt(K)),    chi = 1 / K.

    The Jacobian is I/r - x x^T/(N r^3) with r^2 = mean x^2; the rank-one
    term contributes O(1/N) to the APJN (as for LayerNorm, partial-Jacobian
    D.4), so the factor is 1/r^2 = 1/K. Unlike LayerNorm it does not centre,
    so on a Gaussian it coincides with LayerNormPre and after phi it differs
    from LayerNormPost by the mean. Only over the features: along the Mixer's
    pair of channels the divisor would depend on the channels' shared part,
    which does not self-average.
    """

    axis: str = "features"
    elementwise = True

    def forward(self, s):
        if _centres_pair(self, s) or s.pair_axis == "channels":
            raise ValueError("RMSNorm runs over the channels of each token, the pair's own axis here; its divisor "
                             "depends on the channels' shared part and does not self-average (no "
                             "deterministic infinite-width limit)")
        return s.to(sp.Integer(1), s.K12 / s.K, s.mean / sp.sqrt(s.K), gaussian=s.gaussian)

    def chi(self, s):
        return 1 / s.K

    def gram(self, g):
        return g.normalised(g.K1, g.K2, centre=False, m1=g.m1 / sp.sqrt(g.K1), m2=g.m2 / sp.sqrt(g.K2))


@dataclass(frozen=True)
class Scale(Primitive):
    """Multiplication by a scalar eps (LayerScale at initialisation, branch multipliers)."""

    eps: sp.Expr = S.eps

    def __post_init__(self):
        check_real("eps", self.eps)

    def forward(self, s):
        return s.to(self.eps**2 * s.K, self.eps**2 * s.K12, self.eps * s.mean, s.gaussian)

    def chi(self, s):
        return self.eps**2

    def gram(self, g):
        e2 = self.eps**2
        cen = None if g.centred is None else tuple(e2 * c for c in g.centred)
        return g.to(e2 * g.K1, e2 * g.K2, e2 * g.K12, e2 * g.T12, self.eps * g.m1, self.eps * g.m2, g.gaussian,
                    g.gap, cen)


def _features_only(norm):
    if norm.axis != "features":
        raise ValueError(f"{_short(norm)}: Gram matrices over inputs are for normalisations over the features only")


def _num(v) -> str:
    """A node parameter for display: numbers as %g, symbols by name."""
    v = sp.sympify(v)
    return f"{float(v):g}" if not v.free_symbols else str(v)


def _num_exact(v) -> str:
    """A node parameter as Python source: integers as ints, other numbers as repr(float)
    (17 significant digits at most, the float's exact round trip), symbols by name."""
    v = sp.sympify(v)
    if v.free_symbols:
        return str(v)
    return str(int(v)) if v.is_Integer else repr(float(v))


def _short(p, num=_num) -> str:
    """A node as the composition call that builds it: ``residual(rms_norm(), act('selu'), dense(), scale(0.5))``.

    ``num`` formats the numbers: :func:`_num` (%g, for messages and names) or
    :func:`_num_exact` (for ``repr``: with the composition functions in
    scope, ``eval`` of that text rebuilds the node, activations given by an
    expression excepted).
    """
    if p is None:
        return "nothing"
    if isinstance(p, Dense):
        args = [f"{k}={num(v)}" for k, v, default in (("sigma_w", p.sigma_w, S.sigma_w),
                                                      ("sigma_b", p.sigma_b, S.sigma_b)) if v != default]
        args += [] if p.axis == "features" else [f"axis={p.axis!r}"]
        return f"dense({', '.join(args)})"
    if isinstance(p, ActivationLayer):
        spec = _activation_json(p.phi)
        if "expr" in spec:
            return f"act({p.phi!r})"
        params = [f"{k}={num(v)}" for k, v in spec.items() if k != "name"]
        return f"act({', '.join([repr(spec['name'])] + params)})"
    if isinstance(p, (LayerNormPre, LayerNormPost, LayerNorm)):
        where = {LayerNormPre: ", position='pre'", LayerNormPost: ", position='post'"}.get(type(p), "")
        axis = "" if p.axis == "features" else f", axis={p.axis!r}"
        return f"layer_norm({where[2:]}{axis})" if where or axis else "layer_norm()"
    if isinstance(p, RMSNorm):
        return "rms_norm()"
    if isinstance(p, BatchNorm):
        return "batch_norm()"
    if isinstance(p, Scale):
        return "scale()" if p.eps == S.eps else f"scale({num(p.eps)})"
    if isinstance(p, Residual):
        mu = "" if p.mu == S.mu else f", mu={num(p.mu)}"
        return "residual(" + ", ".join(_short(q, num) for q in p.branch.layers) + mu + ")"
    if isinstance(p, Chain):
        if len(p.layers) == 1:
            return _short(p.layers[0], num)
        return "serial(" + ", ".join(_short(q, num) for q in p.layers) + ")"
    return type(p).__name__


def _primitive_repr(self) -> str:
    return _short(self, _num_exact)


def _require_gaussian(prim, s: Signal):
    if not s.gaussian:
        raise ValueError(f"{_short(prim)} needs a Gaussian preactivation as input; "
                         "put a dense layer before it")


# ---------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Chain(Primitive):
    """Primitives applied in order; chi is the product of their factors."""

    layers: Tuple[Primitive, ...]

    def __post_init__(self):
        flat = tuple(self.layers)
        object.__setattr__(self, "layers", flat)
        if not flat:
            raise ValueError("a Chain needs at least one layer")
        for i, p in enumerate(flat):
            if not isinstance(p, Primitive):
                raise ValueError(f"layer {i} of a Chain is {p!r}, not a primitive (dense(), act(...), ...)")
            if p.elementwise and not any(isinstance(q, Dense) for q in flat[i + 1:]):
                raise ValueError(
                    f"{_short(p)} at position {i} of serial({', '.join(_short(q) for q in flat)}) is not followed "
                    "by a dense layer in its block; the APJN only factorises when fresh weights follow "
                    "element-wise maps")

    def _states(self, s):
        states = [s]
        for p in self.layers:
            states.append(p.forward(states[-1]))
        return states

    def forward(self, s):
        return self._states(s)[-1]

    def chi(self, s):
        states = self._states(s)
        return sp.Mul(*[p.chi(st) for p, st in zip(self.layers, states)])

    def gram(self, g):
        for p in self.layers:
            g = p.gram(g)
        return g

    def chi_delta(self, s):
        # chi_Delta replaces, one activation at a time, its E[phi'^2] factor by
        # E[phi''^2 + phi' phi''']: the first-order variation of chi (Lemma D.1).
        states = self._states(s)
        factors = [p.chi(st) for p, st in zip(self.layers, states)]
        total = sp.Integer(0)
        for i, (p, st) in enumerate(zip(self.layers, states)):
            d = p.chi_delta(st)
            if d != 0:
                total += sp.Mul(*factors[:i], d, *factors[i + 1:])
        return total

    def primitives(self):
        for p in self.layers:
            yield from p.primitives()


@dataclass(frozen=True)
class Residual(Primitive):
    """h -> branch(h) + mu h (eqs. 56-60); the branch must end in a Dense layer."""

    branch: Chain
    mu: sp.Expr = S.mu

    def __post_init__(self):
        branch = self.branch if isinstance(self.branch, Chain) else Chain((self.branch,))
        object.__setattr__(self, "branch", branch)
        check_real("mu", self.mu, minimum=0, maximum=1)
        # the skip's cross terms E[branch(h) h] vanish only when the branch ends in
        # fresh zero-mean weights (a Scale after them keeps the mean zero)
        tail = [p for p in branch.layers if not isinstance(p, Scale)]
        if not tail or not isinstance(branch.layers[-1], (Dense, Scale)) or not isinstance(tail[-1], Dense):
            last = branch.layers[-1] if branch.layers else None
            raise ValueError(f"Residual(mu={self.mu}): its branch ends in {_short(last)}, not in zero-mean weights; "
                             "end the branch with a dense layer (optionally followed by a scale), so that "
                             "branch(h) is uncorrelated with the skip h")

    def forward(self, s):
        out = self.branch.forward(s)
        return s.to(out.K + self.mu**2 * s.K, out.K12 + self.mu**2 * s.K12)

    def chi(self, s):
        return self.branch.chi(s) + self.mu**2

    def chi_delta(self, s):
        return self.branch.chi_delta(s)

    def gram(self, g):
        return self.combine(self.branch.gram(g), g)

    def combine(self, out: "GramSignal", g: "GramSignal") -> "GramSignal":
        """The block's output from the branch's output ``out`` and the skip's input ``g``.

        The branch ends in fresh zero-mean weights: no cross terms with the
        skip, in K or in Theta. (Split from :meth:`gram` so that a branch
        mapped over a whole batch, with BatchNorm, reuses the rule.)
        """
        m2 = self.mu**2
        gap = None
        if out.gap is not None and g.gap is not None:
            gap = sum_gap(out.K1, out.K2, out.rho, out.gap, m2 * g.K1, m2 * g.K2, g.rho, g.gap)
        return g.to(out.K1 + m2 * g.K1, out.K2 + m2 * g.K2, out.K12 + m2 * g.K12, out.T12 + m2 * g.T12, gap=gap)

    def primitives(self):
        yield self
        yield from self.branch.primitives()


# ---------------------------------------------------------------------------
# Blocks.
# ---------------------------------------------------------------------------
from ._names import BLOCKS, NORMS  # noqa: E402  (the CLI lists them without importing this module)


#: norm name -> one norm -> phi -> Dense stage of an MLP block (an entry per menu item)
_STAGES = {
    "none": lambda act: [act, Dense()],
    "ln_pre": lambda act: [LayerNormPre(), act, Dense()],
    "ln_post": lambda act: [act, LayerNormPost(), Dense()],
    "bn": lambda act: [BatchNorm(), act, Dense()],
}


def _stage(phi: Activation, norm: str) -> list:
    """One norm -> phi -> Dense stage of an MLP block."""
    check_choice("norm", norm, tuple(_STAGES))
    return _STAGES[norm](ActivationLayer(_make_activation(phi)))


def mlp_block(phi, norm: str = "none", residual: bool = False, stages: int = 1) -> Primitive:
    """h^{l+1} = W phi(norm(h^l)) + b (+ mu h^l): eq. 1 of the partial-Jacobian paper.

    ``stages`` > 1 repeats norm -> phi -> Dense inside one residual branch
    (``stages=2`` with ``norm='bn'`` is the pre-activation ResNet block of
    partial-Jacobian eq. 26).
    """
    layers = []
    for _ in range(stages):
        layers += _stage(phi, norm)
    chain = Chain(tuple(layers))
    return Residual(chain) if residual else chain


def resmlp_block(phi, residual: bool = True) -> Primitive:
    """ResMLP block at initialisation (AutoInit appendix D.1, eqs. 49-56).

    AffineNorms are the identity at initialisation; LayerScale is eps; both
    skips have strength mu:
        c = eps (W1 a + B1) + mu a            (token-mixing linear, eq. 51)
        h = eps (W3 phi(W2 c + B2) + B3) + mu c  (channel MLP, eq. 56)
    """
    first = Chain((Dense(axis="tokens"), Scale()))
    second = Chain((Dense(), ActivationLayer(phi), Dense(), Scale()))
    if residual:
        return Chain((Residual(first), Residual(second)))
    return Chain(first.layers + second.layers)


def mixer_block(phi, residual: bool = True) -> Primitive:
    """MLP-Mixer block (partial-Jacobian appendix H, eqs. 82-89).

    Token mixing then channel mixing, each LayerNorm -> Dense -> phi -> Dense
    with a skip of strength mu:
        h' = W2 phi(W1 LN(h) + b1) + b2 + mu h
    The LayerNorms run over the channels of each token, and the token-mixing
    weights and biases are shared by all channels, so the state is that of a
    pair of channels of one token (``pair_axis='channels'``): the token MLP
    gives the pair a common part (covariance sigma_w^2 E[phi(u)phi(v)] +
    sigma_b^2) that the next channel LayerNorm removes, chi = 1/(K - K12).

    Limits of validity (docs/theory.md, "MLP-Mixer"). The limit is tokens and
    channels -> infinity together. The recursion is that limit only when no
    channel carries a part common to all tokens, which holds exactly for
    sigma_b = 0 with an odd activation (E[phi] = 0: erf, tanh, linear) and
    uncorrelated input tokens; then K12 stays 0 and the LayerNorm is the
    plain 1/K. With sigma_b > 0 or
    E[phi] != 0, the embedding and channel-mixing biases and E[phi] through
    the channel-mixing weights (all shared by the tokens) give each channel
    such a part; it survives the channel LayerNorm and makes the token MLP's
    preactivation variance random per channel, which this state drops. The
    recursion is then an approximation: for GELU at (sigma_w, sigma_b, mu) =
    (1.3, 0.2, 0.5) it gives chi_J = 1.261 where 20-block Monte Carlo at
    512 channels x 512 tokens gives 1.337 +- 0.003, a gap that does not
    shrink with the width. :meth:`Architecture.mixer_limit_is_exact` says
    which case applies.
    """
    sub = Chain((LayerNormPre(axis="channels"), Dense(axis="tokens"), ActivationLayer(phi),
                 Dense(axis="tokens")))
    sub2 = Chain((LayerNormPre(axis="channels"), Dense(axis="channels"), ActivationLayer(phi),
                  Dense(axis="channels")))
    if residual:
        return Chain((Residual(sub), Residual(sub2)))
    return Chain(sub.layers + sub2.layers)


# ---------------------------------------------------------------------------
# The spec.
# ---------------------------------------------------------------------------

class TreeSpec:
    """What every spec (an :class:`Architecture` or a :class:`Network`) reads off its tree.

    Subclasses define :meth:`block_spec` (the repeated block as a primitive
    tree), ``mu`` and ``eps`` (the values of the symbols S.mu and S.eps in
    that tree, None where unset) and :meth:`parameters`. Nothing downstream
    asks for names of menu items: whether a block couples the inputs of a
    batch, has tokens or needs the pair state is read here, from the nodes.
    """

    def block_spec(self) -> Primitive:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def tree(self) -> Primitive:
        """The repeated block (same as :meth:`block_spec`)."""
        return self.block_spec()

    def nodes(self) -> tuple:
        """Every primitive of the block, depth first (Residual nodes included, Chains flattened)."""
        return tuple(self.block_spec().primitives())

    @property
    def pair_axis(self) -> str:
        """What the two members of the pair state differ in.

        'channels' when some layer mixes or normalises along channels of one
        token (the MLP-Mixer's channel MLP), else 'batch' (two inputs).
        """
        return "channels" if any(getattr(p, "axis", None) == "channels" for p in self.nodes()) else "batch"

    @property
    def couples_batch(self) -> bool:
        """True when a layer mixes the inputs of a batch (BatchNorm): Monte Carlo needs batch >= 2."""
        return any(isinstance(p, BatchNorm) for p in self.nodes())

    @property
    def has_tokens(self) -> bool:
        """True when a layer acts along tokens (ResMLP, Mixer): inputs carry a token axis."""
        return any(getattr(p, "axis", None) in ("tokens", "channels") for p in self.nodes())

    @property
    def normalises(self) -> bool:
        """True when a layer divides by a variance of its input (LayerNorm, RMSNorm, BatchNorm)."""
        return any(isinstance(p, (LayerNormPre, LayerNormPost, LayerNorm, RMSNorm, BatchNorm)) for p in self.nodes())

    @property
    def centres_features(self) -> bool:
        """True when a layer subtracts the mean over features (LayerNorm; the Mixer's channel LayerNorm)."""
        return any(isinstance(p, (LayerNormPre, LayerNormPost, LayerNorm)) for p in self.nodes())

    def activations(self) -> tuple:
        """The distinct activations of the block, in order."""
        out = []
        for p in self.nodes():
            if isinstance(p, ActivationLayer) and p.phi not in out:
                out.append(p.phi)
        return tuple(out)

    def initial_pair_covariance(self, sigma_w, sigma_b, input_overlap=0.0):
        """K12 at the first layer's output h^1 (default for the solvers' ``K12_0``).

        Two unit-norm inputs with overlap x.x'/N0 = ``input_overlap`` share the
        first layer's W and b: K12^1 = sigma_w^2 overlap + sigma_b^2. Two
        channels of the Mixer's per-token input layer have independent rows
        and biases: K12^1 = 0.
        """
        if self.pair_axis == "channels":
            return 0.0 * (sigma_w + sigma_b)
        return sigma_w**2 * input_overlap + sigma_b**2

    def mixer_limit_is_exact(self, sigma_b, token_overlap=0.0):
        """Whether the recursion of this block is its infinite-width limit at bias scale ``sigma_b``.

        Always True for blocks without a channel-pair state ('mlp', 'resmlp').
        For the Mixer (pair axis 'channels'; tokens and channels -> infinity)
        True only when sigma_b = 0, phi is odd
        (E[phi] = 0 at every variance) and the input's tokens are
        uncorrelated (``token_overlap`` = x_t . x_s / N0 for t != s is 0, as
        in :func:`meanfield.verification.monte_carlo`; patches of real images
        are correlated): otherwise each channel carries a part common to all
        tokens that the pair-of-channels state drops, and the recursion is an
        approximation (see :func:`mixer_block`).

        ``sigma_b``, ``token_overlap``: numbers or arrays (sigma_b >= 0,
        overlap in [-1, 1]); returns a bool or a bool array of their
        broadcast shape.
        """
        def arr(name, v, lo, hi):
            a = np.asarray(v, dtype=float) if is_number(v) or np.ndim(v) else None
            if a is None or not np.all(np.isfinite(a)) or np.any(a < lo) or np.any(a > hi):
                rng = f">= {lo:g}" if hi == np.inf else f"in [{lo:g}, {hi:g}]"
                raise ValueError(f"{name} must be a finite number {rng} (or an array of them), got {v!r}")
            return a

        sb = arr("sigma_b", sigma_b, 0.0, np.inf)
        rho = arr("token_overlap", token_overlap, -1.0, 1.0)
        sb, rho = np.broadcast_arrays(sb, rho)
        if self.pair_axis != "channels":   # no channel-pair state: the recursion is the limit
            exact = np.ones(sb.shape, dtype=bool)
        else:
            exact = (sb == 0) & (rho == 0) & self._odd_activations()
        return bool(exact) if exact.ndim == 0 else exact

    def _odd_activations(self) -> bool:
        """phi(-x) = -phi(x) for every activation of the block, checked on a grid
        (symbolic simplification can fail to decide)."""
        xs = np.linspace(-6.0, 6.0, 49)
        for phi in self.activations():
            f = phi.numpy()
            with np.errstate(all="ignore"):
                a, b = np.asarray(f(xs), float), np.asarray(f(-xs), float)
            if not (np.all(np.isfinite(a)) and np.all(np.abs(a + b) <= 1e-12 * (1 + np.abs(a)))):
                return False
        return True

    def require_values(self, what: str = "this computation"):
        """ValueError if the tree uses S.mu or S.eps and no value is set for it."""
        used = set()
        for p in self.nodes():
            for v in (getattr(p, "mu", None), getattr(p, "eps", None)):
                if isinstance(v, sp.Basic):
                    used |= v.free_symbols & {S.mu, S.eps}
        for sym, val in ((S.mu, self.mu), (S.eps, self.eps)):
            if sym in used and val is None:
                raise ValueError(f"{what} needs a value for {sym}: the tree of {self} uses the symbol {sym}; "
                                 f"pass Network(..., {sym}=value) or a number in the node")

    def to_json(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


# ---------------------------------------------------------------------------
# Composition API.
# ---------------------------------------------------------------------------
def _param(name, value, default_symbol):
    """A node parameter: None -> the symbol; a string -> that symbol; a number -> sympy number."""
    if value is None:
        return default_symbol
    if isinstance(value, str):
        names = {"sigma_w": S.sigma_w, "sigma_b": S.sigma_b, "mu": S.mu, "eps": S.eps}
        if value not in names:
            raise ValueError(f"{name}={value!r}: a string must name a symbol ({', '.join(names)})")
        return names[value]
    if isinstance(value, sp.Basic):
        return value
    if not is_number(value):
        raise ValueError(f"{name} must be a finite real number, a symbol or None, got {value!r}")
    return sp.nsimplify(value) if float(value) == int(float(value)) else sp.Float(float(value))


_AXES = ("features", "tokens", "channels")


def dense(sigma_w=None, sigma_b=None, axis: str = "features") -> Dense:
    """A fresh Gaussian linear layer W x + b, W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2).

    sigma_w, sigma_b default to the symbols that the solvers scan; a number
    fixes this layer's scale. ``axis`` is what it mixes: 'features' (MLP),
    'tokens' (token mixing) or 'channels' (the Mixer's channel MLP).
    """
    check_choice("axis", axis, _AXES)
    return Dense(_param("sigma_w", sigma_w, S.sigma_w), _param("sigma_b", sigma_b, S.sigma_b), axis)


def act(phi, **params) -> ActivationLayer:
    """phi applied element-wise: a registered name, a sympy expression or an Activation."""
    return ActivationLayer(_make_activation(phi, **params))


def layer_norm(position: str = "auto", axis: str = "features") -> Primitive:
    """LayerNorm without affine parameters (identity at initialisation), wherever it sits.

    ``position='auto'`` reads pre/post from the signal it receives (a
    preactivation or phi(h)); 'pre' and 'post' insist on one (a 'pre'
    LayerNorm after an activation is an error).
    """
    check_choice("position", position, ("auto", "pre", "post"))
    check_choice("axis", axis, _AXES)
    return {"auto": LayerNorm, "pre": LayerNormPre, "post": LayerNormPost}[position](axis=axis)


def rms_norm() -> RMSNorm:
    """RMSNorm without gain over the features, pre or post by position (:class:`RMSNorm`)."""
    return RMSNorm()


def batch_norm() -> BatchNorm:
    """BatchNorm of preactivations per neuron over the batch (large-batch limit), no affine part."""
    return BatchNorm()


def scale(eps=None) -> Scale:
    """Multiplication by eps: LayerScale (per-channel, initialised to eps) or a branch multiplier."""
    return Scale(_param("eps", eps, S.eps))


def serial(*layers) -> Chain:
    """Layers applied in order (nested serials are flattened); chi is the product of the factors."""
    flat = []
    for p in layers:
        if isinstance(p, (list, tuple)):
            p = serial(*p)
        flat.extend(p.layers if isinstance(p, Chain) else [p])
    return Chain(tuple(flat))


def residual(*branch, mu=None) -> Residual:
    """h -> branch(h) + mu h; the branch must end in a dense layer (or a scale after one).

    ``mu`` defaults to the symbol mu (its value then comes from
    ``Network(..., mu=...)``); a number fixes it in the tree.
    """
    return Residual(serial(*branch), _param("mu", mu, S.mu))


def mlp(phi="relu", norm: str = "none", residual: bool = False, stages: int = 1) -> Primitive:
    """The MLP block of the menu: ``stages`` x (norm -> phi -> dense), optionally with a skip."""
    return mlp_block(_make_activation(phi), norm, residual, stages)


def resmlp(phi="gelu", residual: bool = True) -> Primitive:
    """The ResMLP block at initialisation (:func:`resmlp_block`)."""
    return resmlp_block(_make_activation(phi), residual)


def mixer(phi="gelu", residual: bool = True) -> Primitive:
    """The MLP-Mixer block (:func:`mixer_block`)."""
    return mixer_block(_make_activation(phi), residual)


def _check_tree(node, s: Signal, path: str) -> Signal:
    """Push the symbolic state through the tree, naming the node where a rule fails."""
    if isinstance(node, Chain):
        for i, p in enumerate(node.layers):
            s = _check_tree(p, s, f"{path}[{i}]")
        return s
    if isinstance(node, Residual):
        _check_tree(node.branch, s, f"{path}.branch")
    try:
        return node.forward(s)
    except ValueError as err:
        raise ValueError(f"invalid tree at {path} = {_short(node)}: {err}") from None


@dataclass(frozen=True)
class Network(TreeSpec):
    """A network given by its repeated block, a tree of primitives: the general spec.

    Parameters
    ----------
    block : Primitive or sequence of primitives
        One block, h^{l+1} = block(h^l), built with :func:`serial`,
        :func:`residual`, :func:`dense`, :func:`act`, :func:`layer_norm`,
        :func:`rms_norm`, :func:`batch_norm`, :func:`scale` or the factories
        :func:`mlp`, :func:`resmlp`, :func:`mixer`. A sequence is a serial.
    mu, eps : float or None
        Values of the symbols mu and eps where the tree uses them (a node
        built with ``residual(..., mu=None)`` or ``scale(None)``); numbers
        in the tree need none. They are runtime arguments of the compiled
        code, so scanning them does not recompile.
    depth : int or None
        How many times the block repeats (what :func:`from_torch` read off a
        model); informative, the solvers take their own ``depth``.
    name : str or None
        Shown in reports; default, the composition call of the block.

    Every public function that takes an Architecture takes a Network:
    ``recursion``, the solvers, ``kernel_profile``, ``phase_diagram``,
    ``exponents``, ``verification.monte_carlo``. An invalid tree (an
    element-wise node not followed by a dense layer in its block, a residual
    branch not ending in zero-mean weights, a node that needs a Gaussian
    input after an activation) is a ValueError naming the node.
    """

    block: Primitive
    mu: float | None = None
    eps: float | None = None
    depth: int | None = None
    name: str | None = None

    def __post_init__(self):
        block = self.block
        if isinstance(block, (list, tuple)):
            block = serial(*block)
        if not isinstance(block, Primitive):
            raise ValueError(f"block must be a primitive tree (serial(...), mlp(...), ...), got {block!r}")
        object.__setattr__(self, "block", block)
        for name, lo, hi in (("mu", 0, 1), ("eps", 0, None)):
            v = getattr(self, name)
            if v is not None:
                if not is_number(v) or float(v) < lo or (hi is not None and float(v) > hi):
                    rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
                    raise ValueError(f"{name} must be a number {rng} or None, got {v!r}")
                object.__setattr__(self, name, float(v))
        if self.depth is not None:
            if not isinstance(self.depth, (int, np.integer)) or isinstance(self.depth, bool) or self.depth < 1:
                raise ValueError(f"depth must be an integer >= 1 or None, got {self.depth!r}")
            object.__setattr__(self, "depth", int(self.depth))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"name must be a string or None, got {self.name!r}")
        _check_tree(block, Signal.input(self.pair_axis), "block")

    def block_spec(self) -> Primitive:
        return self.block

    @property
    def residual(self) -> bool:
        return any(isinstance(p, Residual) for p in self.nodes())

    def parameters(self) -> dict:
        """Numeric values of the structural symbols (mu, eps) that are set."""
        vals = {}
        if self.mu is not None:
            vals[S.mu] = self.mu
        if self.eps is not None:
            vals[S.eps] = self.eps
        return vals

    def with_(self, **changes) -> "Network":
        """A copy with some fields changed (``net.with_(mu=0.5)``)."""
        return replace(self, **changes)

    def to_json(self) -> dict:
        """The network as JSON-able data; :func:`from_json` reads it back."""
        out = {"tree": tree_to_json(self.block)}
        for k in ("mu", "eps", "depth", "name"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    def to_dict(self) -> dict:
        return {"description": str(self), **self.to_json()}

    def __repr__(self):
        """``Network(residual(act('relu'), dense(), mu=0.9), depth=8)``: with the composition functions
        in scope (``from meanfield import *``) a Python expression that rebuilds the network."""
        args = [_short(self.block, _num_exact)]
        args += [f"{k}={_num_exact(getattr(self, k))}" for k in ("mu", "eps") if getattr(self, k) is not None]
        args += [f"{k}={getattr(self, k)!r}" for k in ("depth", "name") if getattr(self, k) is not None]
        return f"Network({', '.join(args)})"

    def __str__(self):
        text = self.name or _short(self.block)
        vals = [f"{k}={getattr(self, k):g}" for k in ("mu", "eps") if getattr(self, k) is not None]
        if self.depth is not None:
            vals.append(f"depth={self.depth}")
        return text + (" [" + ", ".join(vals) + "]" if vals and not self.name else "")


# ---------------------------------------------------------------------------
# JSON form of trees.
# ---------------------------------------------------------------------------
def _json_value(v):
    v = sp.sympify(v)
    if not v.free_symbols:
        return float(v) if not v.is_Integer else int(v)
    return str(v)


def _from_json_value(name, v):
    if isinstance(v, str):
        loc = {n: getattr(S, n) for n in ("sigma_w", "sigma_b", "mu", "eps")}
        try:
            e = sp.sympify(v, locals=loc)
        except (sp.SympifyError, SyntaxError, TypeError):
            raise ValueError(f"{name}={v!r} is not an expression in sigma_w, sigma_b, mu, eps") from None
        extra = e.free_symbols - set(loc.values())
        if extra:
            raise ValueError(f"{name}={v!r} uses unknown symbols {sorted(map(str, extra))}")
        return e
    return _param(name, v, None)


def _activation_json(phi: Activation) -> dict:
    from .activations import ACTIVATIONS, ScaleInvariant

    if isinstance(phi, ScaleInvariant) and phi.name in ("leaky_relu", "scale_invariant"):
        if phi.name == "leaky_relu":
            return {"name": "leaky_relu", "negative_slope": float(phi.a_minus)}
        return {"name": "scale_invariant", "a_plus": float(phi.a_plus), "a_minus": float(phi.a_minus)}
    if phi.name in ACTIVATIONS:
        try:
            if ACTIVATIONS[phi.name]() == phi:
                return {"name": phi.name}
        except TypeError:  # pragma: no cover - a factory that needs parameters
            pass
    return {"expr": sp.srepr(phi.expr), "name": phi.name}


def _activation_from_json(d: dict) -> Activation:
    from .activations import user_activation

    d = dict(d)
    if "expr" in d:
        try:
            # srepr (exact) and plain expressions in x both read back with sympify
            expr = sp.sympify(d["expr"], locals={"x": S.x})
        except (sp.SympifyError, SyntaxError, TypeError) as err:
            raise ValueError(f"activation expr {d['expr']!r} cannot be read: {err}") from None
        # the same route as act(expr): built-ins recognised, user expressions checked
        return user_activation(expr, name=d.get("name"))
    name = d.pop("name", None)
    if name is None:
        raise ValueError(f"an activation node needs 'name' or 'expr', got {d!r}")
    return _make_activation(name, **d)


def tree_to_json(node: Primitive):
    """A primitive tree as JSON-able data: a serial is a list, every other node a dict with 'type'.

    Leaves are written from their dataclass fields, so a new primitive class
    needs no code here: {"type": "Dense", "sigma_w": "sigma_w", ...}.
    """
    import dataclasses

    if isinstance(node, Chain):
        return [tree_to_json(p) for p in node.layers]
    if isinstance(node, Residual):
        return {"type": "Residual", "mu": _json_value(node.mu), "branch": tree_to_json(node.branch)}
    if isinstance(node, ActivationLayer):
        return {"type": "ActivationLayer", **_activation_json(node.phi)}
    out = {"type": type(node).__name__}
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        out[f.name] = v if isinstance(v, str) else _json_value(v)
    return out


def _primitive_classes() -> dict:
    out, todo = {}, [Primitive]
    while todo:
        c = todo.pop()
        for sub in c.__subclasses__():
            out[sub.__name__] = sub
            todo.append(sub)
    return out


def tree_from_json(data, path: str = "tree") -> Primitive:
    """Inverse of :func:`tree_to_json` (ValueError naming the bad entry)."""
    import dataclasses

    if isinstance(data, list):
        return serial(*[tree_from_json(d, f"{path}[{i}]") for i, d in enumerate(data)])
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"{path}: a tree node is a list (serial) or a dict with 'type', got {data!r}")
    d = dict(data)
    kind = d.pop("type")
    classes = _primitive_classes()
    if kind == "Residual":
        return Residual(tree_from_json(d.get("branch", []), f"{path}.branch"),
                        _from_json_value(f"{path}.mu", d.get("mu", "mu")))
    if kind == "ActivationLayer":
        return ActivationLayer(_activation_from_json(d))
    if kind not in classes or kind == "Chain":
        raise ValueError(f"{path}: unknown node type {kind!r}; allowed: "
                         f"{', '.join(sorted(k for k in classes if k != 'Chain'))}")
    cls = classes[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{path}: {kind} has no field(s) {sorted(unknown)}; allowed: {sorted(names)}")
    kw = {k: (v if k == "axis" else _from_json_value(f"{path}.{k}", v)) for k, v in d.items()}
    return cls(**kw)


def from_json(data) -> TreeSpec:
    """A spec from its JSON form: a Network ({"tree": ...}) or Architecture keywords.

    ``data`` may be a dict, a JSON string or a path to a .json file.
    """
    import json
    from pathlib import Path

    if isinstance(data, Path) or (isinstance(data, str) and data.strip().endswith(".json")
                                   and not data.strip().startswith("{")):
        path = Path(data)
        if not path.exists():
            raise ValueError(f"spec file {str(path)!r} does not exist")
        data = json.loads(path.read_text())
    elif isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, dict):
        raise ValueError(f"a spec is a JSON object, got {type(data).__name__}")
    data = dict(data)
    if "tree" in data:
        data.pop("description", None)
        tree = tree_from_json(data.pop("tree"))
        unknown = set(data) - {"mu", "eps", "depth", "name"}
        if unknown:
            raise ValueError(f"unknown network key(s) {sorted(unknown)}; allowed: tree, mu, eps, depth, name")
        return Network(tree, **data)
    data.pop("description", None)
    return as_architecture(None, **data)


def to_json(spec) -> dict:
    """The JSON form of an Architecture, a Network or a bare tree (see :func:`from_json`)."""
    spec = as_architecture(spec)
    return spec.to_json()


@dataclass(frozen=True)
class Architecture(TreeSpec):
    """The menu of built-in blocks: a shortcut that builds a primitive tree.

    ``Architecture(activation, norm, mu, block)`` is equivalent to
    ``Network(mlp(activation, norm, residual=mu is not None), mu=mu)`` (and the
    ResMLP / Mixer factories): the same tree, so the same recursions to the
    last digit. Use :class:`Network` and the composition functions
    (:func:`serial`, :func:`residual`, :func:`dense`, ...) for anything else.

    The symbolic layer (:func:`meanfield.recursion`), the numeric solvers and
    the torch realisation (:mod:`meanfield.verification`) are all built from
    it.

    Parameters
    ----------
    activation : str | sympy.Expr | Activation
        See :func:`meanfield.activations.activation`.
    norm : {'none', 'ln_pre', 'ln_post', 'bn'}
        Normalisation inside an MLP block (ignored by 'resmlp'; 'mixer' uses
        its own LayerNorms).
    mu : float or None
        Residual strength. None: no skip connection (plain MLP); a number in
        [0, 1]: h^{l+1} = branch(h^l) + mu h^l. ResMLP and Mixer blocks
        default to mu = 1.
    block : {'mlp', 'resmlp', 'mixer'}
        'mixer' is the infinite-width limit only for sigma_b = 0 with an odd
        activation and uncorrelated input tokens (:meth:`mixer_limit_is_exact`);
        elsewhere an approximation.
    eps : float
        LayerScale of ResMLP blocks (AutoInit appendix D; 0.1 for ResMLP-S12).
    stages : int
        norm -> phi -> Dense stages per MLP block (2 for a ResNet-style block).
    """

    activation: Activation = "relu"
    norm: str = "none"
    mu: float | None = None
    block: str = "mlp"
    eps: float = 0.1
    stages: int = 1
    activation_params: tuple = field(default=(), repr=False)

    def __post_init__(self):
        act = self.activation
        params = dict(self.activation_params)
        object.__setattr__(self, "activation", _make_activation(act, **params))
        norm = "none" if self.norm is None else self.norm
        check_choice("norm", norm, NORMS)
        object.__setattr__(self, "norm", norm)
        check_choice("block", self.block, BLOCKS)
        mu = self.mu
        if mu is None and self.block in ("resmlp", "mixer"):
            mu = 1.0
        if mu is not None:
            if not is_number(mu) or not 0 <= float(mu) <= 1:
                raise ValueError(f"mu must be a number in [0, 1] or None (no skip connection), got {self.mu!r}")
            mu = float(mu)
        object.__setattr__(self, "mu", mu)
        if not is_number(self.eps) or float(self.eps) < 0:
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))
        if not isinstance(self.stages, (int, np.integer)) or isinstance(self.stages, bool) or self.stages < 1:
            raise ValueError(f"stages must be an integer >= 1, got {self.stages!r}")
        object.__setattr__(self, "stages", int(self.stages))
        if self.block != "mlp" and self.norm != "none":
            raise ValueError(f"norm={self.norm!r} applies to block='mlp' only; "
                             f"block={self.block!r} fixes its own normalisation")

    # -- structure ------------------------------------------------------------
    @property
    def residual(self) -> bool:
        return self.mu is not None

    def block_spec(self) -> Primitive:
        """The block as a tree of primitives (symbolic parameters)."""
        if self.block == "mlp":
            return mlp_block(self.activation, self.norm, self.residual, self.stages)
        if self.block == "resmlp":
            return resmlp_block(self.activation, self.residual)
        return mixer_block(self.activation, self.residual)

    def parameters(self) -> dict:
        """Numeric values of the structural symbols (mu, eps) this block uses."""
        vals = {}
        if self.residual:
            vals[S.mu] = self.mu
        if self.block == "resmlp":
            vals[S.eps] = self.eps
        return vals

    def to_dict(self) -> dict:
        """The spec as plain data (JSON output, reports)."""
        return {"description": str(self), "activation": self.activation.name, "norm": self.norm, "mu": self.mu,
                "block": self.block, "eps": self.eps, "stages": self.stages}

    def to_json(self) -> dict:
        """The menu keywords (``from_json`` gives the Architecture back)."""
        out = {k: v for k, v in self.to_dict().items() if k != "description"}
        out.update({k: float(v) if isinstance(v, (int, float)) else v for k, v in self.activation_params})
        return out

    def network(self) -> "Network":
        """The same spec as a :class:`Network` (tree and values; same recursions)."""
        vals = self.parameters()
        return Network(self.block_spec(), mu=vals.get(S.mu), eps=vals.get(S.eps), name=str(self))

    def with_(self, **changes) -> "Architecture":
        """A copy with some fields changed (``arch.with_(mu=1.0)``)."""
        return replace(self, **changes)

    def __str__(self):
        parts = [self.activation.name]
        if self.block != "mlp":
            parts.insert(0, self.block)
        if self.norm != "none":
            parts.append(self.norm)
        if self.stages > 1:
            parts.append(f"stages={self.stages}")
        if self.residual:
            parts.append(f"mu={self.mu:g}")
        if self.block == "resmlp":
            parts.append(f"eps={self.eps:g}")
        return " + ".join(parts)


_ARCH_KEYS = ("activation", "norm", "mu", "block", "eps", "stages")


def as_architecture(arch=None, **kwargs) -> TreeSpec:
    """A spec from an Architecture, a Network, a primitive tree, a JSON dict or Architecture keywords.

    ``as_architecture(activation="erf")`` and ``as_architecture(Architecture(...))``
    both work; keywords that are not Architecture fields raise ValueError.
    ``negative_slope``, ``a_plus`` and ``a_minus`` are passed to the activation.
    """
    act_params = {k: kwargs.pop(k) for k in ("negative_slope", "a_plus", "a_minus") if k in kwargs}
    unknown = set(kwargs) - set(_ARCH_KEYS)
    if unknown:
        raise ValueError(f"unknown architecture option(s) {sorted(unknown)}; allowed: {', '.join(_ARCH_KEYS)}")
    if arch is None:
        return Architecture(activation_params=tuple(sorted(act_params.items())), **kwargs)
    if isinstance(arch, TreeSpec):
        if kwargs or act_params:
            raise ValueError("pass either an Architecture (or Network) or architecture keywords, not both")
        return arch
    if isinstance(arch, (Primitive, list, tuple)):
        if kwargs or act_params:
            raise ValueError("pass either a tree or architecture keywords, not both")
        return Network(arch)
    if isinstance(arch, dict):
        if kwargs or act_params:
            raise ValueError("pass either a JSON spec or architecture keywords, not both")
        return from_json(arch)
    if isinstance(arch, (str, sp.Basic)):
        return Architecture(activation=arch, activation_params=tuple(sorted(act_params.items())), **kwargs)
    raise ValueError(f"arch must be an Architecture, a Network, a primitive tree, an activation name or None, "
                     f"got {arch!r}")


# The primitives the composition functions build print as the call that builds them
# (the dataclass repr nests whole activation objects and 30-digit sympy Floats).
for _cls in (Dense, ActivationLayer, LayerNormPre, LayerNorm, LayerNormPost, RMSNorm, BatchNorm, Scale, Chain,
             Residual):
    _cls.__repr__ = _primitive_repr
del _cls
