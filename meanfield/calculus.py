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

__all__ = [
    "Signal",
    "Primitive",
    "Dense",
    "ActivationLayer",
    "LayerNormPre",
    "LayerNormPost",
    "BatchNorm",
    "Scale",
    "Chain",
    "Residual",
    "Architecture",
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

    @classmethod
    def input(cls, pair_axis: str = "batch") -> "Signal":
        """The symbolic block input: a Gaussian with kernel (K, K12)."""
        return cls(S.K, S.K12, pair_axis=pair_axis)

    def to(self, K, K12, mean=sp.Integer(0), gaussian=True) -> "Signal":
        """A new state along the same pair axis."""
        return Signal(K, K12, mean, gaussian, self.pair_axis)


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


@dataclass(frozen=True)
class ActivationLayer(Primitive):
    """phi applied element-wise to a Gaussian preactivation (eqs. 9 and 11)."""

    phi: Activation
    elementwise = True

    def forward(self, s):
        _require_gaussian(self, s)
        return s.to(self.phi.second_moment(s.K), self.phi.kernel(s.K, s.K, s.K12),
                    self.phi.mean(s.K), gaussian=False)

    def chi(self, s):
        _require_gaussian(self, s)
        return self.phi.derivative_second_moment(s.K)

    def chi_delta(self, s):
        return self.phi.chi_delta_moment(s.K)


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


@dataclass(frozen=True)
class LayerNormPost(Primitive):
    """LayerNorm on activations, phi -> (phi - E phi) / sqrt(Var phi) (eq. 50)."""

    axis: str = "features"
    elementwise = True

    def forward(self, s):
        if _centres_pair(self, s):
            return s.to(sp.Integer(1), sp.Integer(0))
        var = s.K - s.mean**2
        return s.to(sp.Integer(1), (s.K12 - s.mean**2) / var)

    def chi(self, s):
        # along the pair axis the shared part (second moment K12, which
        # includes E[phi]^2) is what the mean removes
        return 1 / (s.K - s.K12) if _centres_pair(self, s) else 1 / (s.K - s.mean**2)


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


def _require_gaussian(prim, s: Signal):
    if not s.gaussian:
        raise ValueError(f"{type(prim).__name__} needs a Gaussian preactivation as input; "
                         "put a Dense layer before it")


# ---------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Chain(Primitive):
    """Primitives applied in order; chi is the product of their factors."""

    layers: Tuple[Primitive, ...]

    def __post_init__(self):
        flat = [p for p in self.layers]
        for i, p in enumerate(flat):
            if p.elementwise and not any(isinstance(q, Dense) for q in flat[i + 1:]):
                raise ValueError(
                    f"{type(p).__name__} at position {i} is not followed by a Dense layer in its block; "
                    "the APJN only factorises when fresh weights follow element-wise maps")

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
        if not isinstance(self.branch.layers[-1], (Dense, Scale)):
            raise ValueError("a Residual branch must end in a Dense (or Scale after Dense) layer")

    def forward(self, s):
        out = self.branch.forward(s)
        return s.to(out.K + self.mu**2 * s.K, out.K12 + self.mu**2 * s.K12)

    def chi(self, s):
        return self.branch.chi(s) + self.mu**2

    def chi_delta(self, s):
        return self.branch.chi_delta(s)

    def primitives(self):
        yield self
        yield from self.branch.primitives()


# ---------------------------------------------------------------------------
# Blocks.
# ---------------------------------------------------------------------------
NORMS = ("none", "ln_pre", "ln_post", "bn")
BLOCKS = ("mlp", "resmlp", "mixer")


def _stage(phi: Activation, norm: str) -> list:
    """One norm -> phi -> Dense stage of an MLP block."""
    act = ActivationLayer(phi)
    if norm == "none":
        return [act, Dense()]
    if norm == "ln_pre":
        return [LayerNormPre(), act, Dense()]
    if norm == "ln_post":
        return [act, LayerNormPost(), Dense()]
    return [BatchNorm(), act, Dense()]


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
@dataclass(frozen=True)
class Architecture:
    """A deep network made of identical blocks: the single source of truth.

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

    @property
    def needs_pair(self) -> bool:
        """True when the pair covariance K12 feeds back into K or chi_J.

        BatchNorm (a pair of inputs) and the MLP-Mixer (a pair of channels).
        """
        return self.norm == "bn" or self.block == "mixer"

    @property
    def pair_axis(self) -> str:
        """What the two members of the pair state differ in: 'batch' or 'channels' (Mixer)."""
        return "channels" if self.block == "mixer" else "batch"

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

        Always True for 'mlp' and 'resmlp' blocks. For 'mixer' (tokens and
        channels -> infinity) True only when sigma_b = 0, phi is odd
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
        if self.block != "mixer":
            exact = np.ones(sb.shape, dtype=bool)
        else:
            exact = (sb == 0) & (rho == 0) & self._odd_activation()
        return bool(exact) if exact.ndim == 0 else exact

    def _odd_activation(self) -> bool:
        """phi(-x) = -phi(x), checked on a grid (symbolic simplification can fail to decide)."""
        f = self.activation.numpy()
        xs = np.linspace(-6.0, 6.0, 49)
        with np.errstate(all="ignore"):
            a, b = np.asarray(f(xs), float), np.asarray(f(-xs), float)
        return bool(np.all(np.isfinite(a)) and np.all(np.abs(a + b) <= 1e-12 * (1 + np.abs(a))))

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


def as_architecture(arch=None, **kwargs) -> Architecture:
    """An Architecture from an Architecture or the same keywords.

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
    if isinstance(arch, Architecture):
        if kwargs or act_params:
            raise ValueError("pass either an Architecture or architecture keywords, not both")
        return arch
    if isinstance(arch, (str, sp.Basic)):
        return Architecture(activation=arch, activation_params=tuple(sorted(act_params.items())), **kwargs)
    raise ValueError(f"arch must be an Architecture, an activation name or None, got {arch!r}")
