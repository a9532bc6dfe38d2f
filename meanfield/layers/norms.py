"""Normalisations without affine parameters (their identity at initialisation).

LayerNorm before phi (h -> h / sqrt(K), chi = 1/K, partial-Jacobian eq. 20,
D.4) and after it (centred by E phi, chi = 1/Var phi, eqs. 50-55, D.5);
RMSNorm (no centring: Zhang & Sennrich 2019); BatchNorm over the batch in
the large-batch limit (AutoInit Conjecture 3.1, eq. 23; partial-Jacobian
eqs. 24-25). At infinite width each divisor is deterministic, so the
rank-one terms of the Jacobians drop out of the APJN.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from .._validate import check_choice
from .base import AXES, Primitive, format_number, require_gaussian, short
from .state import Signal

__all__ = ["LayerNormPre", "LayerNorm", "LayerNormPost", "LayerNormImage", "GroupNorm", "RMSNorm", "BatchNorm", "layer_norm",
           "group_norm", "rms_norm", "batch_norm"]


def _layer_norm_call(position, axis) -> str:
    args = ([] if position is None else [f"position={position!r}"]) + ([] if axis == "features" else [f"axis={axis!r}"])
    return f"layer_norm({', '.join(args)})"


def _is_torch_norm(module, kind: str, where: str) -> bool:
    """True if ``module`` is ``torch.nn.<kind>`` with its affine parameters at their initial values
    (weight 1, bias 0: ValueError naming ``where`` otherwise); torch imported here, on use."""
    from torch import nn

    from ..torch.context import check_affine_identity

    cls = getattr(nn, kind, None)  # nn.RMSNorm: torch >= 2.4
    if cls is None or not isinstance(module, cls):
        return False
    check_affine_identity(module, where)
    return True


def _centres_pair(norm, s: Signal) -> bool:
    """True when a normalisation runs along the pair's own axis.

    Its mean then removes the part the two members share (covariance K12),
    and its variance is K - K12: the pair comes out uncorrelated. This is
    BatchNorm for a pair of inputs, and the Mixer's channel LayerNorm for a
    pair of channels.
    """
    return norm.axis == s.pair_axis


def _features_only(norm):
    if norm.axis != "features":
        raise ValueError(f"{short(norm)}: Gram matrices over inputs are for normalisations over the features only")


def _guarded(norm) -> bool:
    """Whether a LayerNorm must be followed by fresh weights in its serial (``Primitive.elementwise``).

    Over the features its divisor is deterministic at infinite width, so its Jacobian is a number per token
    (up to rank-two projections of O(1/N)) and chi factorises with or without fresh weights after it: the
    post-LN transformer ends its blocks with one. Along the Mixer's channels, the tokens or the positions it
    stays guarded.
    """
    return norm.axis != "features"


def _channel_norm_tokens(norm, s):
    """A LayerNorm over the channels of each (image, token) on a :class:`~.state.TokenSignal`
    (:mod:`meanfield.gram.tokens`): the channel mean removes the part B common to the channels and the
    channel variance is diag(A - B) (C -> infinity), so A -> (A - B) / sqrt(v v'), B -> 0, and the
    NTK alike."""
    if norm.axis == "tokens":
        raise ValueError(f"{short(norm)}: a LayerNorm over the tokens has no Gram rule over images "
                         "(its divisor does not self-average at finite T)")
    r = np.sqrt(s.variances - s.diagonal(s.B))
    d = r[:, :, None, None] * r[None, None, :, :]
    Z = np.zeros_like(s.A)
    # dividing keeps the gap; subtracting a nonzero B would cancel in it (not carried)
    G = s.G if (s.G is not None and not np.any(s.B)) else None
    return replace(s, A=(s.A - s.B) / d, B=Z, TA=None if s.TA is None else (s.TA - s.TB) / d,
                   TB=None if s.TA is None else Z.copy(), G=G, J=s.jacobian_times(1 / (r[:, :, None] * r[:, None, :])))


@dataclass(frozen=True, repr=False)
class LayerNormPre(Primitive):
    """LayerNorm on preactivations, h -> h / sqrt(K) at infinite width (eq. 19).

    Along the pair axis (the Mixer's channel LayerNorm, axis='channels') it
    centres like BatchNorm: (K, K12) -> (1, 0), chi = 1/(K - K12).
    """

    axis: str = "features"

    @property
    def elementwise(self) -> bool:
        return _guarded(self)

    def forward(self, s):
        require_gaussian(self, s)
        if _centres_pair(self, s):
            return s.to(sp.Integer(1), sp.Integer(0))
        return s.to(sp.Integer(1), s.K12 / s.K)

    def chi(self, s):
        return 1 / (s.K - s.K12) if _centres_pair(self, s) else 1 / s.K

    def gram(self, g):
        _features_only(self)
        if not g.gaussian:
            raise ValueError(f"{short(self)} needs a Gaussian preactivation as input; put a dense layer before it")
        return g.normalised(g.K1, g.K2, centre=True)

    def gram_tokens(self, s, walk):
        """Over (image, token) pairs: the channel LayerNorm of :func:`_channel_norm_tokens`."""
        if self.axis != "tokens" and not s.gaussian:
            raise ValueError(f"{short(self)} needs a Gaussian preactivation as input")
        return _channel_norm_tokens(self, s)

    def short(self, num=format_number):
        return _layer_norm_call('pre', self.axis)

    def torch_forward(self, z, ctx):
        """(h - mean) / std over the features of each token (or over the tokens), with its exact JVP."""
        from ..torch import context as C

        return C.normalise(z, -2 if self.axis == "tokens" else -1)


@dataclass(frozen=True, repr=False)
class BatchNorm(Primitive):
    """BatchNorm of preactivations per neuron over the batch, |B| -> infinity.

    With all inputs of equal norm, h_i(x) = sqrt(K12) g_i + sqrt(K - K12) e_i(x):
    the batch mean removes the shared part g_i and the batch variance is
    K - K12, so normalised outputs are N(0, 1) and uncorrelated across inputs
    (AutoInit Conjecture 3.1, eq. 23; partial-Jacobian eqs. 24-25).
    """

    axis = "batch"
    elementwise = True
    torch_modules_read = "nn.BatchNorm1d"

    def forward(self, s):
        require_gaussian(self, s)
        if not _centres_pair(self, s):
            raise ValueError("BatchNorm needs the pair state of two inputs (pair_axis='batch')")
        return s.to(sp.Integer(1), sp.Integer(0))

    def chi(self, s):
        return 1 / (s.K - s.K12)

    def gram(self, g):
        raise ValueError("batch_norm() couples the inputs of a batch: its kernel is not a map of one pair "
                         "(K1, K2, K12); meanfield.kernels applies BatchNorm.gram_batch to the whole batch")

    def gram_tokens(self, s, walk):
        raise ValueError("batch_norm() in a token block: Gram matrices over images are not implemented for it")

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

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.BatchNorm1d`` in training mode (batch statistics), on a preactivation."""
        from torch import nn

        if isinstance(module, (nn.BatchNorm2d, nn.BatchNorm1d)) and value.positions:
            raise ValueError(f"{where}: {type(module).__name__} on a map with positions normalises each channel "
                             "over the batch and the positions, which has no primitive yet; "
                             "nn.LayerNorm([C, H, W]) or nn.GroupNorm are read")
        if not _is_torch_norm(module, "BatchNorm1d", where):
            return None
        if not module.training:
            raise ValueError(f"{where}: BatchNorm1d in eval mode uses running statistics; the theory is "
                             "BatchNorm with batch statistics (call module.train())")
        if not value.gaussian:
            raise ValueError(f"{where}: BatchNorm after an activation is not a primitive of the theory")
        return batch_norm()

    def short(self, num=format_number):
        return "batch_norm()"

    def torch_forward(self, z, ctx):
        """Each neuron over the inputs of the batch (axis B), biased variance, with its exact JVP."""
        from ..torch import context as C

        if z.shape[3] < 2:
            raise ValueError("BatchNorm needs a batch of at least 2 inputs (batch >= 2)")
        return C.normalise(z, 3)


@dataclass(frozen=True, repr=False)
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
    torch_modules_read = "nn.LayerNorm"

    @property
    def elementwise(self) -> bool:
        return _guarded(self)

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

    def gram_tokens(self, s, walk):
        """Over (image, token) pairs: the channel LayerNorm of :func:`_channel_norm_tokens` (pre or post:
        the channel mean is subtracted either way)."""
        return _channel_norm_tokens(self, s)

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.LayerNorm`` over the last axis: before phi on a preactivation, after it otherwise (on a
        channels-first map with positions, :class:`LayerNormImage` reads it)."""
        if value.positions or not _is_torch_norm(module, "LayerNorm", where):
            return None
        if len(module.normalized_shape) != 1:
            raise ValueError(f"{where}: LayerNorm over {tuple(module.normalized_shape)}; only the last axis is read")
        return layer_norm("pre" if value.gaussian else "post")

    def short(self, num=format_number):
        return _layer_norm_call(None, self.axis)

    def torch_forward(self, z, ctx):
        """(h - mean) / std over the features of each token (or over the tokens), with its exact JVP."""
        from ..torch import context as C

        return C.normalise(z, -2 if self.axis == "tokens" else -1)


@dataclass(frozen=True, repr=False)
class GroupNorm(LayerNorm):
    r"""GroupNorm without affine parameters (Wu & He 2018, eq. 1 with the groups of their eq. 4): the
    features split into ``groups`` equal groups, each normalised by its own mean and variance.

    At infinite width with the number of groups fixed, every group holds
    infinitely many features, so its mean and variance are the population's
    (law of large numbers, as for LayerNorm, partial-Jacobian D.4-D.5): the
    state map, the APJN factor and the Gram rule are :class:`LayerNorm`'s,
    pre or post by position,

        (K, K12, m) -> (1, (K12 - m^2) / (K - m^2)),    chi = 1 / (K - m^2).

    What differs is the finite width: a group of N / groups features has
    O(groups / N) corrections where LayerNorm has O(1 / N). Over the
    features only (an MLP's, or each token's channels).
    """

    groups: int = 1

    def __post_init__(self):
        groups = self.groups
        if isinstance(groups, sp.Basic) and groups.is_Integer:
            groups = int(groups)
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
            raise ValueError(f"groups must be an integer >= 1, got {self.groups!r}")
        object.__setattr__(self, "groups", int(groups))
        if self.axis != "features":
            raise ValueError(f"group_norm() runs over the features only, got axis={self.axis!r}")

    def short(self, num=format_number):
        return f"group_norm({self.groups})"

    def to_json(self):
        return {"type": "GroupNorm", "groups": self.groups}

    @classmethod
    def from_json(cls, fields, path, read_tree):
        unknown = set(fields) - {"groups"}
        if unknown:
            raise ValueError(f"{path}: GroupNorm has no field(s) {sorted(unknown)}; allowed: ['groups']")
        return cls(groups=fields.get("groups", 1))

    def torch_forward(self, z, ctx):
        """(h - mean) / std within each group of the last axis (biased variance, no epsilon), exact JVP."""
        from ..torch import context as C

        N = z.shape[-1]
        if N % self.groups:
            raise ValueError(f"group_norm({self.groups}): the width {N} is not a multiple of the groups")
        return C.normalise(z.unflatten(-1, (self.groups, N // self.groups)), -1).flatten(-2)


@dataclass(frozen=True, repr=False)
class LayerNormPost(LayerNorm):
    """LayerNorm on activations, phi -> (phi - E phi) / sqrt(Var phi) (eq. 50).

    The maths is :class:`LayerNorm`'s (the state's mean selects it); this
    node only records the position 'post' the user asked for, which the torch
    realisation and the architecture's repr keep.
    """

    def short(self, num=format_number):
        return _layer_norm_call("post", self.axis)


@dataclass(frozen=True, repr=False)
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
    torch_modules_read = "nn.RMSNorm"

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

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.RMSNorm`` (torch >= 2.4), over the features."""
        if not _is_torch_norm(module, "RMSNorm", where):
            return None
        if value.positions:
            raise ValueError(f"{where}: RMSNorm on a channels-first map with positions normalises its last axis "
                             "(a row of positions), not the channels; it has no primitive there")
        return rms_norm()

    def short(self, num=format_number):
        return "rms_norm()"

    def torch_forward(self, z, ctx):
        """h / sqrt(mean h^2) over the features of each token (pre or post: the same map), exact JVP."""
        from ..torch import context as C

        return C.rms_normalise(z, -1)


def layer_norm(position: str = "auto", axis: str = "features") -> Primitive:
    """LayerNorm without affine parameters (identity at initialisation), wherever it sits.

    ``position='auto'`` reads pre/post from the signal it receives (a
    preactivation or phi(h)); 'pre' and 'post' insist on one (a 'pre'
    LayerNorm after an activation is an error). ``axis``: what it normalises
    over, 'features' (each token's channels), 'tokens', 'channels' (the
    Mixer's), or 'positions': the channels and positions of each input
    together, torch's ``nn.LayerNorm([C, H, W])`` (:class:`LayerNormImage`;
    position 'auto' only).
    """
    check_choice("position", position, ("auto", "pre", "post"))
    check_choice("axis", axis, AXES + ("positions",))
    if axis == "positions":
        if position != "auto":
            raise ValueError(f"layer_norm(position={position!r}, axis='positions'): a LayerNorm over channels and "
                             "positions reads pre or post from its input; leave position='auto'")
        return LayerNormImage()
    return {"auto": LayerNorm, "pre": LayerNormPre, "post": LayerNormPost}[position](axis=axis)


@dataclass(frozen=True, repr=False)
class LayerNormImage(LayerNorm):
    r"""LayerNorm over the channels and positions of each input together (torch's ``nn.LayerNorm([C, H, W])``,
    or ``nn.GroupNorm(1, C)``): y_{c,p} = (z_{c,p} - mu_x) / s_x with mu_x, s_x^2 the mean and variance of
    z(x) over all channels and positions.

    At infinite channels mu_x is the position mean of the part common to all channels (covariance B of the
    :class:`~.state.TokenSignal`), and s_x deterministic, so for the one-channel and the two-channel
    covariances alike (M = A or B; the NTK's TA, TB with TB in place of B)

        M' = (M - <B>_left - <B>_right + <B>_both) / (s_x s_x'),   s_x^2 = <A_pp(x)>_p - <B(x, x)>_both,

    <.>_left the mean over the first position index, <.>_right over the second. The NTK drops the rank-one
    terms of the divisor's Jacobian, O(1/N) per unit, as the feature LayerNorm does. On inputs whose
    statistics are the same at every position (circular or valid convolutions) B = m^2 everywhere and the map
    is :class:`LayerNorm`'s, (K, K12, m) -> (1, (K12 - m^2) / (K - m^2)), chi = 1 / (K - m^2): the solvers use
    that (inherited), and zero padding makes its tree refuse them anyway.
    """

    axis: str = "positions"

    def gram_tokens(self, s, walk):
        """Over (input, position) pairs: the map of the class notes; the gap is not carried (G -> None)."""
        n, T = s.A.shape[:2]

        def centred(M, common):
            left = common.mean(axis=1, keepdims=True)
            right = common.mean(axis=3, keepdims=True)
            both = common.mean(axis=(1, 3), keepdims=True)
            return M - left - right + both

        var = s.variances.mean(axis=1) - np.einsum("aqar->a", s.B) / T**2
        r = np.sqrt(var)[:, None, None, None] * np.sqrt(var)[None, None, :, None]
        return replace(s, A=centred(s.A, s.B) / r, B=centred(s.B, s.B) / r, J=s.jacobian_times(1 / var),
                       TA=None if s.TA is None else centred(s.TA, s.TB) / r,
                       TB=None if s.TB is None else centred(s.TB, s.TB) / r, G=None)

    torch_modules_read = "nn.LayerNorm([C, H, W]) and nn.GroupNorm on maps with positions"

    @classmethod
    def from_torch_module(cls, module, value, where):
        """On a channels-first map with positions (after a convolution): ``nn.LayerNorm`` over the channels and
        positions (a ``normalized_shape`` of two or three axes), and ``nn.GroupNorm`` with more than one
        channel per group, whose groups at infinite channels hold the population's statistics (the channels
        are exchangeable); ValueError naming ``where`` for a LayerNorm over the last axis alone (a row of
        positions) and for one channel per group (InstanceNorm: a channel's own positions, no limit)."""
        if not value.positions:
            return None
        if _is_torch_norm(module, "LayerNorm", where):
            if len(module.normalized_shape) < 2:
                raise ValueError(f"{where}: LayerNorm{tuple(module.normalized_shape)} on a channels-first map "
                                 "normalises its last axis (a row of positions); nn.LayerNorm([C, H, W]) (or "
                                 "nn.GroupNorm(1, C)) normalises each input over channels and positions")
            return cls()
        if _is_torch_norm(module, "GroupNorm", where):
            if module.num_groups == module.num_channels:
                raise ValueError(f"{where}: GroupNorm with one channel per group (InstanceNorm) normalises each "
                                 "channel over its own positions, which has no infinite-channel limit of the "
                                 "theory; use fewer groups")
            return cls()
        return None

    def short(self, num=format_number):
        return "layer_norm(axis='positions')"

    def torch_forward(self, z, ctx):
        """(h - mean) / std over the positions and channels of each input, with its exact JVP."""
        from ..torch import context as C

        return C.normalise(z, (-2, -1))


def rms_norm() -> RMSNorm:
    """RMSNorm without gain over the features, pre or post by position (:class:`RMSNorm`)."""
    return RMSNorm()


def batch_norm() -> BatchNorm:
    """BatchNorm of preactivations per neuron over the batch (large-batch limit), no affine part."""
    return BatchNorm()


def group_norm(groups: int) -> GroupNorm:
    """GroupNorm over ``groups`` equal groups of the features, no affine part (:class:`GroupNorm`)."""
    return GroupNorm(groups=groups)
