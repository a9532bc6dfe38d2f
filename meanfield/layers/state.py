"""The infinite-width state a primitive maps: one input and a pair (:class:`Signal`), two
inputs of any norms with the neural tangent kernel (:class:`GramSignal`), or the images of a
batch over their tokens (:class:`TokenSignal`).

Shapes: the fields of :class:`Signal` and :class:`GramSignal` are sympy
expressions (the symbolic walk derives the recursions from them; the
Gram-matrix code substitutes whole (n1, n2) float64 arrays for the symbols K1,
K2, K12, T12 and the gap); those of :class:`TokenSignal` are float64 arrays of
shape (n, T, n, T).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from .. import symbols as S
from ..gap import one_minus

__all__ = ["Signal", "GramSignal", "TokenSignal"]


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


@dataclass(frozen=True)
class TokenSignal:
    """Infinite-channel state of a token block over the images of a batch (:mod:`meanfield.gram.tokens`).

    Index (x, t): image x, token t; every array has shape (n, T, n, T), float64.
    A[x, t, x', t'] = E[z_c(x, t) z_c(x', t')] for one channel c; B the same
    for two channels c != c' (the part common to all channels, which
    token-mixing weights and biases, shared by the channels, create and a
    channel LayerNorm removes); TA, TB the NTK analogues (None when the NTK is
    not asked for); G the gap 1 - rho^2 of A's entries, carried exactly where
    tokens are near (anti)parallel (None elsewhere); gaussian : True for
    preactivations. Each primitive maps it with ``gram_tokens(s, walk)``.

    The tokens are the positions of an input: a ResMLP's or Mixer's patches,
    or the positions of a sequence or the pixels of an image under a
    convolution (flattened in row-major order; ``grid`` keeps their shape).
    """

    A: np.ndarray
    B: np.ndarray
    TA: np.ndarray | None = None
    TB: np.ndarray | None = None
    gaussian: bool = True
    G: np.ndarray | None = None
    #: the shape of the positions, T = prod(grid): (T,) for a sequence, (H, W) for an image (None: (T,))
    grid: tuple | None = None
    #: the partial Jacobian between positions, per input, shape (n, T, T, m) for m walks (None: not carried):
    #: J[x, p, q] = (1/C) sum_c sum_j (d z_{c,p}(x) / d h_j) (d z_{c,q}(x) / d h_j) over the units j of the layer
    #: where it started as the identity (J = I); the APJN is the mean of its diagonal
    J: np.ndarray | None = None

    @staticmethod
    def diagonal(M) -> np.ndarray:
        """The entries M[x, t, x, t] of an (n, T, n, T) array, shape (n, T)."""
        n, T = M.shape[:2]
        return M.reshape(n * T, n * T).diagonal().reshape(n, T)

    @property
    def variances(self) -> np.ndarray:
        """E[z_c(x, t)^2], shape (n, T)."""
        return self.diagonal(self.A)

    def scaled(self, c: float) -> "TokenSignal":
        """Every second moment, and the Jacobian mass, times ``c`` (a rescaling: the gap stays)."""
        return replace(self, **{k: None if M is None else c * M for k, M in (
            ("A", self.A), ("B", self.B), ("TA", self.TA), ("TB", self.TB), ("J", self.J))})

    def jacobian_times(self, f):
        """The Jacobian between positions times a factor per input (n,) or per pair of positions (n, T, T);
        None if not carried."""
        if self.J is None:
            return None
        f = np.asarray(f)
        return self.J * (f[:, None, None, None] if f.ndim == 1 else f[..., None])

    @property
    def same_input(self) -> np.ndarray:
        """A[x, p, x, q], the covariance between the positions of each input, shape (n, T, T)."""
        return np.einsum("apaq->apq", self.A)
