r"""NNGP and NTK Gram matrices over images for token blocks (ResMLP, MLP-Mixer): issue 12.

:func:`meanfield.kernels` dispatches here when the tree acts along tokens.
Inputs are images ``x`` of shape (n, T, d): T tokens (patches) of d features.
The network is the one :func:`meanfield.verification.gram.empirical_kernels`
realises: a per-token input layer h^1[x, t] = W x_t + b (weights shared by the
tokens), depth - 1 blocks, and the readout **mean pooling over the tokens**,
f_c(x) = mean_t h^depth_c(x, t). The Gram matrices are over images:
K(x, x') = E[f_c(x) f_c(x')], Theta(x, x') the NTK of f_c.

State (infinite channel width C; channels are exchangeable)
-----------------------------------------------------------
Over the n images and T tokens, four (nT) x (nT) matrices, index (x, t):

* A[(x,t),(x',t')] = E[z_c(x,t) z_c(x',t')]   (one channel),
* B[(x,t),(x',t')] = E[z_c(x,t) z_c'(x',t')]  (two channels c != c': the part
  common to all channels, which token-mixing weights and biases, shared by
  the channels, create and a channel LayerNorm removes),
* TA, TB: the NTK analogues (sum over parameters of the products of the
  gradients of z_c(x,t) and z_c(x',t'), resp. z_c'(x',t')).

Per primitive, each row the primitive's own ``gram_tokens(s, walk)`` (in
:mod:`meanfield.layers`, on :class:`~meanfield.layers.state.TokenSignal`; this
module walks the tree and supplies the compiled numerics, :class:`TokenWalk`)
(sw, sb the layer's scales; k, dk the activation's two-point
maps ``Activation.kernel``, ``Activation.derivative_kernel`` evaluated at the
variances diag(A) of the two entries, through the compiled pair map of
:mod:`meanfield.gram.pair_maps`; "own" is the Dense layer's own NTK term as for MLPs):

=======================  =====================================  =====================================
primitive                A, B                                   TA, TB
=======================  =====================================  =====================================
channel Dense            A -> sw^2 A + sb^2, B -> 0             TA -> own(A) + sw^2 TA, TB -> 0
(features / channels)    (independent rows and biases)          own = A' ('ntk'), width A + 1 ('standard')
token Dense              A -> I_T (x) (sw^2 mean_t A_tt + sb^2)  TA -> I_T (x) (own + sw^2 mean_t TA_tt)
                         B -> I_T (x) (sw^2 mean_t B_tt + sb^2)  own = sw^2 mean_t A_tt + sb^2 ('ntk'),
                                                                T mean_t A_tt + 1 ('standard'); TB alike
act(phi)                 A -> k(A), B -> k(B)                   TA -> dk(A) TA, TB -> dk(B) TB
LayerNorm over channels  A -> (A - B)/sqrt(v v'), B -> 0,       TA -> (TA - TB)/sqrt(v v'), TB -> 0
                         v = diag(A - B)
scale(eps)               x eps^2                                x eps^2
residual(branch, mu)     branch + mu^2 (skip)                   branch + mu^2 (skip)
=======================  =====================================  =====================================

where ``M_tt`` is the (n, n) block of token t and I_T (x) M puts M on every
token's diagonal block (zero between different tokens). Input layer:
A = sw^2 x_t.x'_t'/d + sb^2, B = 0, TA = A ('ntk') or x_t.x'_t' + 1
('standard'), TB = 0. Readout: K = mean_{t,t'} A_{tt'},
Theta = mean_{t,t'} TA_{tt'}.

Why: a token Dense's weights are fresh and zero-mean, so its output's second
moments are exactly token-diagonal with the token mean of its input's (any T);
its bias b_s is shared by the channels (B gets sb^2). A channel Dense has
independent rows (B' = 0) and at C -> infinity its output is Gaussian given
the previous layers; a channel LayerNorm subtracts the channel mean (the
common part, covariance B) and divides by the channel standard deviation
(sqrt(A - B) on the diagonal), as in the package's pair-of-channels calculus
(``LayerNormPre(axis='channels')``: (K, K12) -> (1, 0)).

The limit, and where it is exact
--------------------------------
The two-point maps of the activations need the preactivation of a channel to
be jointly Gaussian over (x, t). After a token Dense with finitely many
tokens it is Gaussian only given the token weights, which all channels
share, with a covariance sw^2/T sum_{t,t'} W_st W_s't' A_tt' that is random.
It self-averages to the token-diagonal mean above when T -> infinity and the
per-channel cross-token covariance (A - B)_{tt'}, t != t', has a vanishing
mean square (its part common to all tokens of a channel g_c enters as
g_c^2 w_s^2, w_s ~ N(0, 1), and never averages out). This is the limit of the
package's single-input Mixer theory (tokens and channels -> infinity
together, docs/theory.md "MLP-Mixer"), and the recursion is that limit under
the same conditions: **sigma_b = 0, an odd activation (E[phi] = 0) and input
tokens orthogonal across positions**, x_t . x'_t' = 0 for t != t' for every
pair of images (overlaps of the same token in two images are free). Then
B = TB = 0 and A, TA stay token-diagonal at every layer, so
K = mean_t A_tt / T. With a bias or E[phi] != 0 (or correlated patches) each
channel acquires a part common to its tokens and the result is an
approximation, as the single-input Mixer recursion is there
(``Architecture.mixer_limit_is_exact``); the same holds for ResMLP (its token
bias is shared by the channels and no channel LayerNorm removes it).

In the exact regime the expectations are token-diagonal at every finite T
and C, not only in the limit: negating the input layer's columns on token
t's coordinates, column t of each first token weight and row t of each second
one preserves the weights' distribution and negates h(x, t) alone, so the
cross-token parts of both kernels have mean 0 and K = (1/T^2) sum_t
E[h(x,t) h(x',t)] exactly. What needs T, C -> infinity is each token's own
entry. The NNGP's is close already at small sizes; the NTK's carries a
finite-size excess of the backward Jacobian (present in every layer's
contribution, the input layer's included) that depends on T and C and
compounds over the blocks: at depth 20, 512 channels, 32 tokens it is +50%
with mu = 0.8 and within the Monte-Carlo errors (-4% to +1%) with the
standard residual mu = 1; the leading correction is not computed. Numbers
and the measurements behind them: docs/gram.md, "ResMLP and MLP-Mixer".

Near-parallel pairs: when two tokens of the input are near (anti)parallel, the
walk also carries the gap 1 - rho^2 of A's entries (``TokenSignal.G``), exactly, as
the MLP Gram matrices do: every ResMLP rule is a sum or a rescaling
(``gap.sum_gap``; the token dense layer's mean folds its T pair states
two at a time) or an activation's gap map. A channel LayerNorm keeps it only
where B = 0 (it subtracts B: a cancellation), so the Mixer with a bias or
E[phi] != 0 loses it and its NTK of an equal-norm ReLU pair is right to
~1e-13 / sqrt(1 - rho) (docs/gram.md, Numerics).

Cost: the state is four (nT)^2 float64 arrays (n = 20 images of 64 tokens:
1.3 MB each), the activation's pair map on two of them per activation.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._validate import check_choice
from ..layers.combinators import Chain
from ..layers.state import TokenSignal
from .pair_maps import _NEAR, _cached, _compile_layers, _full, _input_gap, _lambdify, _naive_gap, _values

__all__ = ["token_kernels", "token_inputs", "token_state", "token_jacobians", "token_correlations", "TokenWalk",
           "replicated"]


def token_inputs(name, x, position_dims=1):
    """``x`` as a float64 array (n, T, d) of images (n, T, d >= 1, finite), or, with ``position_dims=2``
    (a tree with a 2-D convolution), (n, H, W, d)."""
    a = np.asarray(x, dtype=np.float64) if x is not None else None
    if position_dims == 2:
        if a is None or a.ndim != 4 or min(a.shape) < 1:
            raise ValueError(f"{name} must be a 4-d array of images of shape (n, H, W, d) (n images of H x W "
                             f"positions, d channels) for a tree with a 2-D convolution, got "
                             f"{'None' if x is None else np.shape(x)}")
    elif a is None or a.ndim != 3 or min(a.shape) < 1:
        raise ValueError(f"{name} must be a 3-d array of images of shape (n, T, d) (n images, T tokens, "
                         f"d features) for a token block (ResMLP / MLP-Mixer), got "
                         f"{'None' if x is None else np.shape(x)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must contain finite numbers only")
    return a


def _sum_gap_fn():
    """``gap.sum_gap`` compiled: (A1, A2, A12, gap_A, B1, B2, B12, gap_B) -> the gap of A + B."""
    global _SUM_GAP
    if _SUM_GAP is None:
        import sympy as sp

        from ..gap import sum_gap

        A1, A2, A12, gA, B1, B2, B12, gB = syms = sp.symbols("A1 A2 A12 gA B1 B2 B12 gB")
        e = sum_gap(A1, A2, A12 / sp.sqrt(A1 * A2), gA, B1, B2, B12 / sp.sqrt(B1 * B2), gB)
        f = _lambdify(syms, [e])
        _SUM_GAP = lambda *a: f(*a)[0]   # noqa: E731
    return _SUM_GAP


_SUM_GAP = None


def _pair_sum_gap(A, GA, B, GB):
    """The gap of the entries of A + B from those of A and B (both (n, T, n, T), variances on the diagonal)."""
    dA, dB = TokenSignal.diagonal(A), TokenSignal.diagonal(B)
    with np.errstate(all="ignore"):
        g = _sum_gap_fn()(dA[:, :, None, None], dA[None, None], A, GA, dB[:, :, None, None], dB[None, None], B, GB)
    return _settle(g, A + B)


def _bias_gap(M, G, sb2):
    """The gap of M + sb2 (a bias shared by both inputs: correlation 1, gap 0) from M's."""
    if G is None or sb2 == 0:
        return G
    return _pair_sum_gap(M, G, np.full_like(M, sb2), np.zeros_like(M))


def _settle(g, M):
    """Gaps where the exact rule gave nothing finite (a zero part: 0/0) from the rounded entries of M."""
    g = np.broadcast_to(g, M.shape).copy()
    bad = ~np.isfinite(g)
    if bad.any():
        d = TokenSignal.diagonal(M)
        with np.errstate(all="ignore"):
            r = np.clip(M / np.sqrt(d[:, :, None, None] * d[None, None]), -1.0, 1.0)
        g[bad] = ((1 - r) * (1 + r))[bad]
    return np.clip(g, 0.0, 1.0)


class TokenWalk:
    """What a primitive's ``gram_tokens(s, walk)`` rule uses besides its state: the tree's parameter
    values, the NTK's conventions and the compiled numerics (gap sums, activation pair maps).

    The rules themselves live with the primitives (``Dense.gram_tokens``, ``ActivationLayer.gram_tokens``,
    ...); a primitive without one is refused by name.
    """

    #: entries whose gap 1 - rho^2 is below this take their values from the activations' gap maps
    near = _NEAR
    #: the seed of the draws of sampled nodes (1/sqrt(d) attention): the same draws at every layer of a walk
    seed = 0

    def __init__(self, vals, parameterization, want_ntk, sw, sb, width):
        self.vals, self.parameterization, self.ntk = vals, parameterization, want_ntk
        self.sw, self.sb, self.width = sw, sb, width

    @classmethod
    def of(cls, spec, sigma_w: float, sigma_b: float) -> "TokenWalk":
        """The walk of a network's kernels alone (no NTK) at (sigma_w, sigma_b), its mu and eps as the
        network sets them."""
        return cls(_values(spec), "ntk", False, float(sigma_w), float(sigma_b), 1.0)

    def number(self, e) -> float:
        """A node parameter's value (sigma_w, sigma_b of the call; mu, eps of the network)."""
        import sympy as sp
        from .. import symbols as S

        v = sp.sympify(e).subs(dict(self.vals)).subs({S.sigma_w: self.sw, S.sigma_b: self.sb})
        return float(v)

    @staticmethod
    def sum_gap(A, GA, B, GB):
        """The gap of the entries of A + B from those of A and B (:func:`meanfield.gap.sum_gap`)."""
        return _pair_sum_gap(A, GA, B, GB)

    @staticmethod
    def bias_gap(M, G, sb2):
        """The gap of M + sb2 (a bias shared by both entries) from M's; None if G is."""
        return _bias_gap(M, G, sb2)

    @staticmethod
    def settle(g, M):
        """Gaps ``g`` with the entries the exact rule left unfinite taken from the rounded M, clipped to [0, 1]."""
        return _settle(g, M)

    @staticmethod
    def gap_of_sum(*args):
        """:func:`meanfield.gap.sum_gap` compiled, elementwise: (A1, A2, A12, gap_A, B1, B2, B12, gap_B)."""
        return _sum_gap_fn()(*args)

    def activation_maps(self, node):
        """The activation's pair map (K1, K2, K12, Theta12) -> (E[phi phi'], E[phi' phi'] Theta12) and, where it
        carries one, its gap map (K1, K2, K12, Theta12, gap) -> (the same, gap'), both compiled from its
        ``gram`` rule and returning full arrays (the Theta part None when Theta12 is None)."""
        f = _cached(_compile_layers, (node,), (), self.parameterization, True)
        fg = _cached(_compile_layers, (node,), (), self.parameterization, True, False, True)
        one = np.ones(())

        def pair(K1, K2, C, Tm):
            shape = C.shape
            out = f(K1, K2, C, one if Tm is None else Tm, 0.0, 0.0, 1.0)
            return _full(out[0], shape), (None if Tm is None else _full(out[1], shape))

        def with_gap(K1, K2, C, Tm, G):
            shape = C.shape
            out = fg(K1, K2, C, one if Tm is None else Tm, G, 0.0, 0.0, 1.0)
            return _full(out[0], shape), (None if Tm is None else _full(out[1], shape)), _full(out[-1], shape)

        return pair, (with_gap if fg.carries_gap else None)


def replicated(run, spec, walks: int = 8):
    """``run(seed)`` -> a dict of arrays, once for a tree without sampled nodes ({}, no errors); else ``walks``
    independent walks (seeds 0..walks-1), returning (the mean of each array, its standard error), and
    ValueError where a result's relative error exceeds the tree's ``rtol`` (the smallest of its nodes')."""
    sampled = [p for p in spec.nodes() if getattr(p, "sampled", False)]
    if not sampled:
        return run(0), {}
    outs = [run(seed) for seed in range(walks)]
    mean = {k: np.mean([o[k] for o in outs], axis=0) for k in outs[0] if outs[0][k] is not None}
    se = {k: np.std([o[k] for o in outs], axis=0, ddof=1) / np.sqrt(walks) for k in mean}
    rtol = min(p.rtol for p in sampled)
    for k in mean:
        if not mean[k].size:
            continue
        # relative to each entry, floored at 1e-3 of the array's largest (entries that cancel to ~0)
        floor = 1e-3 * np.max(np.abs(mean[k]))
        with np.errstate(all="ignore"):
            rel = float(np.nanmax(se[k] / np.maximum(np.abs(mean[k]), floor)))
        if rel > rtol:
            samples = max(p.samples for p in sampled)
            raise ValueError(f"{k}: the expectation over the 1/sqrt(d) attention logits has a relative standard "
                             f"error of {rel:.2g} with samples={samples} per walk ({walks} walks), above rtol="
                             f"{rtol:g}; give the attention node more samples (about "
                             f"{int(samples * (rel / rtol) ** 2) + 1}) or a larger rtol")
    return mean, se


def _states(spec, x, depth, sw, sb, parameterization="ntk", want_ntk=False, width=1.0, seed=0):
    """The states h^1 .. h^depth for images x (n, T, d) or (n, H, W, d): the input layer's, then one per block
    (``seed``: the draws of sampled nodes)."""
    grid = x.shape[1:-1]
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    n, T, d = x.shape
    dots = np.einsum("atk,bsk->atbs", x, x)
    A = sw**2 * dots / d + sb**2
    Z = np.zeros_like(A)
    TA = (A.copy() if parameterization == "ntk" else dots + 1.0) if want_ntk else None
    s = TokenSignal(A, Z, TA, Z.copy() if want_ntk else None, G=_initial_gap(x, dots, sw, sb), grid=grid)
    walk = TokenWalk(_values(spec), parameterization, want_ntk, sw, sb, width)
    walk.seed = seed
    block = spec.block_spec()
    yield s
    with np.errstate(all="ignore"):
        for _ in range(depth - 1):
            s = block.gram_tokens(s, walk)
            yield s


def _run(spec, x, depth, sw, sb, parameterization, want_ntk, width, per_layer=False, readout="mean", seed=0):
    """The state after depth - 1 blocks, and the pooled diagonal per layer (:func:`_states`)."""
    diag = [] if per_layer else None
    for s in _states(spec, x, depth, sw, sb, parameterization, want_ntk, width, seed):
        if per_layer:
            diag.append(np.diag(_readout(s.A, readout)).copy())
    return s, diag


def _initial_gap(x, dots, sw, sb):
    """The exact gap 1 - rho^2 of every pair of tokens after the input layer (the MLP Gram matrices' rule: the rows'
    projected gap, then the input Dense layer's), or None when no pair of tokens is near (anti)parallel
    (nothing to carry; the walk is then the plain one)."""
    n, T, d = x.shape
    rows = x.reshape(n * T, d)
    dd = dots.reshape(n * T, n * T)
    sq = np.diagonal(dd).copy()
    with np.errstate(all="ignore"):
        K = sw**2 * sq / d + sb**2
        close = _naive_gap(K[:, None], K[None, :], sw**2 * dd / d + sb**2) < 2 * _NEAR
    np.fill_diagonal(close, False)
    if not close.any() or np.any(sq == 0):
        return None
    with np.errstate(all="ignore"):
        g = _input_gap(rows, rows, dd, sq, sq)
        np.fill_diagonal(g, 0.0)
        G = g.reshape(n, T, n, T)
        return _bias_gap((sw**2 / d) * dots, G, sb**2)


def _readout(M, readout="mean"):
    """The read-out's Gram matrix, shape (n, n): of the mean over the positions, mean_{t,t'} M[(x,t),(x',t')]
    ('mean'), or of the flattened output, mean_t M[(x,t),(x',t)] ('flatten')."""
    if readout == "flatten":
        return np.einsum("atbt->ab", M) / M.shape[1]
    return M.mean(axis=(1, 3))


def token_state(arch, x, depth, sigma_w, sigma_b, parameterization="ntk", ntk=True, width=None):
    """The per-token state of a token block at h^depth, before the readout (for inspection and tests).

    ``x``: images (n, T, d) (or (n, H, W, d) with a 2-D convolution: T = H W
    positions in row-major order). Returns ``dict(A=, B=, TA=, TB=)``, arrays of
    shape (n, T, n, T) (T of the last layer: 'valid' convolutions shorten it): A[a, t, b, s] = E[z_c(x_a, t) z_c(x_b, s)] (one
    channel), B the same for two different channels, TA, TB the NTK
    analogues (None when ``ntk=False``); see the module notes. ``width`` is
    the channel fan-in of the standard parameterisation's NTK.
    """
    from ..calculus import as_architecture

    spec = as_architecture(arch)
    check_choice("parameterization", parameterization, ("ntk", "standard"))
    if not spec.has_tokens:
        raise ValueError("arch has no token axis; use meanfield.kernels")
    s, _ = _run(spec, token_inputs("x", x, spec.position_dims), int(depth), float(sigma_w), float(sigma_b),
                parameterization, bool(ntk), 1.0 if width is None else float(width))
    return {"A": s.A, "B": s.B, "TA": s.TA, "TB": s.TB}


def _walk_arguments(arch, x, depth, instead: str):
    """(the spec, the inputs as an array, depth) for a walk over positions; ValueError naming the argument
    (``instead``: what to do for a tree without positions)."""
    from ..calculus import as_architecture

    spec = as_architecture(arch)
    if not spec.has_tokens:
        raise ValueError(f"arch has no positions or tokens; {instead}")
    depth = int(depth)
    if depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    return spec, token_inputs("x", x, spec.position_dims), depth


def token_jacobians(arch, x, depth, sigma_w, sigma_b, per_layer=False):
    r"""Partial Jacobians of a tree over positions (convolutions, pooling, token blocks) on given inputs.

    The APJN (partial-Jacobian paper eq. 3) of one input x, J^{l0,l} = 1/N_l sum_{i,j} E[(dh^l_i / dh^{l0}_j)^2],
    units i, j over (channel, position). At infinite channels the Jacobian between positions of one input,
    V[p, q] = 1/C sum_c sum_j (dh_{c,p} / dh^{l0}_j)(dh_{c,q} / dh^{l0}_j) (V = I at l0), maps linearly from
    layer to layer, as the NTK's backward part does, by rules the primitives apply beside their kernel rules
    (``TokenSignal.J``): a dense layer multiplies it by sigma_w^2; a convolution sums V[p + t, q + t] over its
    taps t with weight sigma_w^2 / k (the same tap on both sides: a channel's weights are shared by the
    positions; zeros beyond zero-padded edges); pooling sums V[p + j, q + j'] over every pair of taps, / k^2;
    a token-mixing layer gives sigma_w^2 times the token mean of diag V on the diagonal; phi multiplies V[p, q]
    by E[phi'(h_p) phi'(h_q)] (the two positions' joint Gaussian); a LayerNorm divides by its divisors; a
    residual adds mu^2 times its input's (eq. 14 per pair of positions; the cross terms vanish with the
    fresh weights ending a branch). J^{l0,l} is the mean of diag V.

    The per-block factor J^{l,l+1} starts from V = I; over several blocks the off-diagonal V that pooling (or
    any map mixing positions with shared weights) builds makes J^{l0,l} differ from the product of the
    per-block factors (tests/test_gram_jacobians.py shows a chain whose J^{1,20} ~ 3 while every factor is
    below 0.6). The Mixer's limits are those of its kernels (module notes).

    ``x``: inputs (n, T, d) or (n, H, W, d) as for :func:`meanfield.kernels`. Returns a dict of float64
    arrays: ``chi_J`` (depth, n), J^{l,l+1} for l = 1..depth; ``J`` (depth, n), J^{1,l} for l = 1..depth
    (1 at l = 1); ``K`` (depth, n), K^l = the mean over positions of E[h_p^2] for l = 1..depth (K^1 the
    input layer's); ``profile`` (n, T_last), diag V of the last block from V = I: the per-position factor,
    whose spread shows where the edges differ from the middle.

    ``per_layer=True``: the units between which J is taken are the top-level layers of the block (a body
    of stages, ``resnet_v2``'s: every residual block), so ``depth`` blocks give depth x (layers per block)
    rows, J^{1,l} through every one of them (a block that is not a serial is one layer).
    """
    spec, x, depth = _walk_arguments(arch, x, depth, "use meanfield.chi_J for an MLP")
    grid = x.shape[1:-1]
    rows = x.reshape(x.shape[0], -1, x.shape[-1])
    n, T, d = rows.shape
    sw, sb = float(sigma_w), float(sigma_b)
    dots = np.einsum("atk,bsk->atbs", rows, rows)
    A = sw**2 * dots / d + sb**2
    block = spec.block_spec()
    units = list(block.layers) if per_layer and isinstance(block, Chain) else [block]

    def walk_once(seed):
        s = TokenSignal(A, np.zeros_like(A), None, None, grid=grid, J=np.eye(T)[None, :, :, None].repeat(n, 0))
        walk = TokenWalk(_values(spec), "ntk", False, sw, sb, 1.0)
        walk.seed = seed
        chi, J, K = [], [np.ones(n)], [s.variances.mean(axis=1)]
        with np.errstate(all="ignore"):
            for unit in units * depth:
                eye = np.eye(s.J.shape[1])[None, :, :, None].repeat(n, 0)
                s = unit.gram_tokens(replace(s, J=np.concatenate([eye, s.J], axis=3)), walk)
                diag = np.einsum("appw->apw", s.J)
                chi.append(diag[..., 0].mean(axis=1))
                J.append(diag[..., 1].mean(axis=1))
                profile = diag[..., 0]
                s = replace(s, J=s.J[..., 1:])
                K.append(s.variances.mean(axis=1))
        rows = len(chi)
        return {"chi_J": np.array(chi), "J": np.array(J[:rows]), "K": np.array(K[:rows]), "profile": profile}

    out, se = replicated(walk_once, spec)
    return out | {f"{k}_se": v for k, v in se.items()}


def token_correlations(arch, x, depth, sigma_w, sigma_b, threshold=0.9):
    r"""Rank collapse: the correlation between the tokens (positions) of each input, layer by layer.

    rho^l(x) = mean over pairs t != t' of A_tt' / sqrt(A_tt A_t't'), A the token kernel of h^l(x): at
    infinite width the mean cosine similarity h_t . h_t' / (|h_t| |h_t'|) between the token vectors, which
    attention drives to 1 when the tokens collapse onto one (Dong et al. 2021, "Attention is not all you
    need"; Noci et al. 2022, "Signal propagation in transformers", who measure this cosine similarity).

    ``x``: inputs (n, T, d) (T >= 2) or (n, H, W, d) as for :func:`meanfield.kernels`; ``threshold`` in
    (-1, 1]. Returns a dict: ``rho`` (depth, n) for l = 1..depth (h^1 the input layer's); ``collapse_depth``
    (n,), the first l with rho^l >= threshold (0 where it is never reached within ``depth``); with sampled
    nodes (1/sqrt(d) attention) ``rho_se``, the standard error of ``rho`` (:func:`replicated`).
    """
    from .._validate import check_real

    spec, x, depth = _walk_arguments(arch, x, depth, "token correlations need a tree over them")
    threshold = float(check_real("threshold", threshold, minimum=-1.0, maximum=1.0, strict=True))
    if np.prod(x.shape[1:-1]) < 2:
        raise ValueError(f"x must hold at least two tokens (positions) per input, got shape {x.shape}")
    sw, sb = float(sigma_w), float(sigma_b)

    def walk_once(seed):
        rho = []
        for s in _states(spec, x, depth, sw, sb, seed=seed):
            A = s.same_input
            d = np.sqrt(np.einsum("att->at", A))
            r = A / (d[:, :, None] * d[:, None, :])
            T = r.shape[1]
            rho.append((r.sum(axis=(1, 2)) - np.einsum("att->a", r)) / (T * (T - 1)))
        return {"rho": np.array(rho)}

    out, se = replicated(walk_once, spec)
    rho = out["rho"]
    reached = rho >= threshold
    first = np.where(reached.any(axis=0), reached.argmax(axis=0) + 1, 0)
    return {"rho": rho, "collapse_depth": first} | ({"rho_se": se["rho"]} if se else {})


def token_kernels(spec, x1, x2, depth, sw, sb, parameterization, get, width, per_layer, readout="mean"):
    """The Gram matrices over images of a token block; the body of :func:`meanfield.kernels` for them.

    Returns the tuple (nngp, ntk, nngp_diag, nngp_se) with nngp, ntk of shape (n1, n2)
    (None when not asked for), nngp_diag (depth, n1) or None, and nngp_se the standard error of nngp where a
    node samples its expectation (1/sqrt(d) attention; :func:`replicated`), else None.
    """
    check_choice("parameterization", parameterization, ("ntk", "standard"))
    want_ntk = "ntk" in get
    a = token_inputs("x1", x1, spec.position_dims)
    same = x2 is None
    b = a if same else token_inputs("x2", x2, spec.position_dims)
    if b.shape[1:] != a.shape[1:]:
        raise ValueError(f"x1 and x2 must have the same tokens and features (T, d), got {a.shape[1:]} and "
                         f"{b.shape[1:]}")
    n1 = a.shape[0]
    x = a if same else np.concatenate([a, b])

    def walk_once(seed):
        s, diag = _run(spec, x, depth, sw, sb, parameterization, want_ntk, width, per_layer, readout, seed)
        return {"nngp": _readout(s.A, readout), "ntk": _readout(s.TA, readout) if want_ntk else None,
                "diag": np.array(diag) if per_layer else None}

    out, se = replicated(walk_once, spec)
    K, Th, diag = out["nngp"], out.get("ntk"), out.get("diag")
    for name, M in (("nngp", K), ("ntk", Th)):
        if M is not None and not np.all(np.isfinite(M)):
            raise ValueError(f"the {name} kernel is not finite at depth {depth} for sigma_w={sw:g}, sigma_b={sb:g} "
                             "(beyond float64, or a normalisation of a zero signal)")
    cut = (slice(None), slice(None)) if same else (slice(0, n1), slice(n1, None))
    return (K[cut] if "nngp" in get else None, None if Th is None else Th[cut],
            np.array(diag)[:, :n1] if per_layer else None, se["nngp"][cut] if se else None)
