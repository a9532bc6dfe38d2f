r"""Self-attention over the tokens at infinite width: softmax(q k^T / d_h) v (closed forms) and the standard
softmax(q k^T / sqrt(d_h)) v (Gaussian logits, sampled expectations with their error).

The layer, on the tokens h_u (u = 1..T, d channels each), with H heads of d_h = d / H channels:

    q_u = sigma_q W_Q h_u / sqrt(d),   k_u = sigma_k W_K h_u / sqrt(d),   v_u = sigma_v W_V h_u / sqrt(d),
    s^h_{tu} = q^h_t . k^h_u / d_h,    P^h = softmax_u(s^h),    y^h_t = sum_u P^h_{tu} v^h_u,
    z_t = sigma_o W_O [y^1_t, ..., y^H_t] / sqrt(d) + sigma_b b,

W and b standard normal. ``tied=True`` uses one matrix for queries and keys (W_K = W_Q).

The limit (d_h -> infinity, any number of heads; Hron et al. 2020, "Infinite attention", section 3 and
their d^-1 scaling; Yang 2019, "Tensor Programs I"): with h's channels independent given the previous
layers, each logit is a mean over d_h channels of q_{t,i} k_{u,i}, so it converges to its expectation:

* tied weights:  s_{tu} -> sigma_q sigma_k A_{tu},  A_{tu} = E[h_{c,t} h_{c,u}] (raw second moments, means
  included), the token kernel of the input; P = softmax_u(sigma_q sigma_k A_{t.}) is deterministic and the
  same in every head;
* independent W_Q, W_K:  E[q_{t,i} k_{u,i}] = 0, so s -> 0 and P = 1 1^T / T: the layer averages the tokens
  (Hron et al. 2020 make the same observation; its fluctuation is O(1 / sqrt(d_h)) and does not enter the
  limit).

Given P the layer is linear in fresh weights, so its output is Gaussian with, for two inputs x, x' (token
kernel A over (input, token) pairs, :class:`~.state.TokenSignal`),

    A'[(x, t), (x', t')] = sigma_o^2 sigma_v^2 (P_x A_{x x'} P_{x'}^T)_{t t'} + sigma_b^2,    B' = 0

(independent rows of W_O and independent output biases make different channels uncorrelated).

**Partial Jacobian (1/d_h logits).** The path through the softmax weights changes each logit by
O(1 / sqrt(d)) per unit change of a token (its gradient is q / d_h or k / d_h), and carries rank at most T
per head, so its share of J = 1/N sum_ij (dz_i / dh_j)^2 is O(1 / d_h) and vanishes in the limit: the
Jacobian between positions maps as the kernel does, V' = sigma_o^2 sigma_v^2 P V P^T (``TokenSignal.J``).

**NTK.** W_O and W_V each add sigma_o^2 sigma_v^2 P A P^T ('ntk' parameterisation), or width sigma_v^2 P A
P^T + 1 and width sigma_o^2 P A P^T ('standard', W trained directly, fan-in = width); the earlier layers'
kernel maps as A does, TA' = own + sigma_o^2 sigma_v^2 P TA P^T; W_Q and W_K add O(1 / d_h) and vanish.

Where the limit is exact: d_h -> infinity at fixed T, with the input's channels independent (every
transformer: attention, dense layers and per-token norms keep them so; a token-mixing dense layer shared by
the channels, as in the Mixer, does not).

**1/sqrt(d_h) logits** (``scaling='1/sqrt(d)'``, the standard transformer's; independent W_Q, W_K). The
logits stay random at infinite width: by the central limit theorem over a head's channels they are Gaussian,
jointly over inputs, with

    Cov(s_x[t, u], s_x'[t', u']) = sigma_q^2 sigma_k^2 A[(x, t), (x', t')] A[(x, u), (x', u')]

(Hron et al. 2020, section 3), independent between heads and of the values. The output is Gaussian only
when W_O averages infinitely many heads (d_h -> infinity first, then H), and then

    A' = sigma_o^2 sigma_v^2 E_s[P_x A_xx' P_x'^T] + sigma_b^2.

The path through the softmax weights no longer vanishes: a probe changes the logits by
ds_tu = (dq_t . k_u + q_t . dk_u) / sqrt(d_h), Gaussian and independent of s with
Cov(ds_tu, ds_t'u') = sigma_q^2 sigma_k^2 (V_tt' A_uu' + A_tt' V_uu') (V the Jacobian between positions),
and dP_t = D^t ds_t with D^t = diag(P_t) - P_t P_t^T, so (derived here)

    V' = sigma_o^2 sigma_v^2 E_s[P V P^T + sigma_q^2 sigma_k^2 (V o F_A + A o F_V)],
    F_X[t, t'] = <D^t A D^t', X>   (entrywise product o, Frobenius product <.,.>).

No closed form: the expectations are sampled, ``samples`` draws of the logits per layer (exactly Gaussian,
:meth:`Attention._sampled_gram_tokens`), the same draws at every layer of a walk; :func:`meanfield.kernels`
and ``token_jacobians`` run 8 independent walks and report the standard error beside the mean
(``Kernels.nngp_se``, ``chi_J_se``, ...), refusing a result whose relative error exceeds ``rtol``. Not derived
here: the NTK (the query and key weights contribute at this scaling) and tied weights (their logits' mean
grows like sqrt(d_h): hard attention); both are refused by name, as is ``position_fixed_point``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from .. import symbols as S
from .._validate import check_choice, check_int, check_real
from .base import NoScalarRecursion, Primitive, format_number, json_value, parameter, value_from_json

__all__ = ["Attention", "attention", "SCALINGS"]

#: how the logits are scaled: by 1/d_h (a deterministic limit) or by 1/sqrt(d_h) (the standard transformer)
SCALINGS = ("1/d", "1/sqrt(d)")

_SIGMAS = ("sigma_q", "sigma_k", "sigma_v", "sigma_o", "sigma_b")


@dataclass(frozen=True, repr=False)
class Attention(Primitive):
    """Multi-head self-attention over the tokens with its output projection (module notes)."""

    heads: int = 1
    tied: bool = False
    scaling: str = "1/d"
    sigma_q: sp.Expr = sp.Integer(1)
    sigma_k: sp.Expr = sp.Integer(1)
    sigma_v: sp.Expr = sp.Integer(1)
    sigma_o: sp.Expr = S.sigma_w
    sigma_b: sp.Expr = S.sigma_b
    #: scaling='1/sqrt(d)': the logit draws per layer of one walk (its Gaussian expectation by Monte Carlo)
    samples: int = 2048
    #: scaling='1/sqrt(d)': the largest relative standard error of a result; above it the call refuses
    rtol: float = 0.01
    #: it mixes the tokens of an input: kernels() takes (n, T, d) inputs
    axis = "tokens"
    output_gaussian = True
    #: its last operation is the fresh output projection W_O (so it may end a residual branch), and its
    #: first ones are fresh projections of its input (so it may follow an activation)
    fresh_weights = True

    def __post_init__(self):
        object.__setattr__(self, "heads", check_int("heads", self.heads, 1))
        if not isinstance(self.tied, (bool, np.bool_)):
            raise ValueError(f"tied must be True or False, got {self.tied!r}")
        object.__setattr__(self, "tied", bool(self.tied))
        check_choice("scaling", self.scaling, SCALINGS)
        object.__setattr__(self, "samples", check_int("samples", self.samples, 16))
        object.__setattr__(self, "rtol", float(check_real("rtol", self.rtol, minimum=0, strict=True)))
        for name in _SIGMAS:
            check_real(name, getattr(self, name), minimum=0)

    def forward(self, s):
        raise NoScalarRecursion(f"{self.short()}: the attention weights depend on the covariance between the "
                                "tokens, which the single-input recursion does not carry; use meanfield.kernels, "
                                "token_jacobians or position_fixed_point, which map every token")

    def chi(self, s):
        self.forward(s)

    @property
    def sampled(self) -> bool:
        """Whether its expectation is taken by sampling the logits (1/sqrt(d_h) scaling)."""
        return self.scaling != "1/d"

    def weights(self, s, walk) -> np.ndarray:
        """The attention matrix P of each input, shape (n, T, T) (rows sum to 1), at the state ``s`` (1/d_h
        logits: deterministic)."""
        n, T = s.A.shape[:2]
        if not self.tied:
            return np.full((n, T, T), 1.0 / T)
        c = walk.number(self.sigma_q) * walk.number(self.sigma_k)
        logits = c * s.same_input
        e = np.exp(logits - logits.max(axis=2, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    def gram_tokens(self, s, walk):
        """Over (input, token) pairs (``s`` a :class:`~.state.TokenSignal`): A -> sigma_o^2 sigma_v^2 P A P^T
        + sigma_b^2, B -> 0, the NTK and the Jacobian between positions as in the module notes; the gap of
        near-parallel entries is not carried (G -> None). With 1/sqrt(d_h) logits, the expectations over
        them (:meth:`_sampled_gram_tokens`)."""
        if self.sampled:
            return self._sampled_gram_tokens(s, walk)
        P = self.weights(s, walk)
        sv2, so2 = walk.number(self.sigma_v) ** 2, walk.number(self.sigma_o) ** 2
        sb2 = walk.number(self.sigma_b) ** 2

        def mixed(M):   # P_x M_{x x'} P_{x'}^T for every pair of inputs
            return np.einsum("atu,aubv,bsv->atbs", P, M, P, optimize=True)

        M = mixed(s.A)
        A = so2 * sv2 * M + sb2
        TA = TB = None
        if walk.ntk:
            if walk.parameterization == "ntk":
                own = 2.0 * so2 * sv2 * M + sb2
            else:
                own = walk.width * (sv2 + so2) * M + 1.0
            TA, TB = own + so2 * sv2 * mixed(s.TA), np.zeros_like(A)
        J = None if s.J is None else so2 * sv2 * np.einsum("apu,auvw,aqv->apqw", P, s.J, P, optimize=True)
        return replace(s, A=A, B=np.zeros_like(A), TA=TA, TB=TB, gaussian=True, G=None, J=J)

    def _sampled_gram_tokens(self, s, walk):
        r"""The 1/sqrt(d_h) layer (module notes, "1/sqrt(d_h) logits"): the expectations over the Gaussian
        logits by ``samples`` draws, the same draws at every layer of a walk (``walk.seed``), so that a walk
        is a deterministic map and independent walks (other seeds) give the error
        (``meanfield.gram.tokens.replicated``).

        Logits of all inputs at once: with A = L L^T over the (input, token) pairs and G a standard normal
        (nT, nT) matrix, Z = L G L^T has Cov(Z_ab, Z_a'b') = A_aa' A_bb', so s_x = sigma_q sigma_k Z_{xx}
        (the diagonal blocks) has the logits' covariance exactly.
        """
        if self.tied:
            raise ValueError(f"{self.short()}: with tied query and key weights the 1/sqrt(d_h) logits have a mean "
                             "that grows like sqrt(d_h) (hard attention at infinite width): no limit to compute; "
                             "use tied=False, or scaling='1/d'")
        if walk.ntk:
            raise ValueError(f"{self.short()}: the NTK of 1/sqrt(d_h) attention (its query and key weights "
                             "contribute at infinite width) is not derived here; ask for the NNGP alone "
                             "(get='nngp')")
        n, T = s.A.shape[:2]
        c = walk.number(self.sigma_q) * walk.number(self.sigma_k)
        sv2, so2 = walk.number(self.sigma_v) ** 2, walk.number(self.sigma_o) ** 2
        sb2 = walk.number(self.sigma_b) ** 2
        M = s.A.reshape(n * T, n * T)
        lam, U = np.linalg.eigh(0.5 * (M + M.T))
        L = U * np.sqrt(np.clip(lam, 0.0, None))
        same = s.same_input                                          # (n, T, T)
        rng = np.random.default_rng([int(walk.seed), 0x5A77])
        A = np.zeros_like(s.A)
        J = None if s.J is None else np.zeros_like(s.J)
        chunk = max(1, min(self.samples, 2**22 // (n * T) ** 2))
        for start in range(0, self.samples, chunk):
            k = min(chunk, self.samples - start)
            Z = L @ rng.standard_normal((k, n * T, n * T)) @ L.T
            logits = c * np.einsum("kxtxu->kxtu", Z.reshape(k, n, T, n, T))
            e = np.exp(logits - logits.max(axis=3, keepdims=True))
            P = e / e.sum(axis=3, keepdims=True)                     # (k, n, T, T)
            A += np.einsum("kxtu,xuyv,kysv->xtys", P, s.A, P, optimize=True)
            if J is not None:
                J += _sampled_jacobian(P, same, s.J, c)
        A = so2 * sv2 * A / self.samples + sb2
        J = None if J is None else so2 * sv2 * J / self.samples
        return replace(s, A=A, B=np.zeros_like(A), TA=None, TB=None, gaussian=True, G=None, J=J)

    torch_modules_read = "nn.MultiheadAttention"

    @classmethod
    def from_torch_module(cls, module, value, where):
        """``nn.MultiheadAttention`` used as self-attention on (batch, tokens, channels): the standard
        1/sqrt(d_h) layer with every projection at the scanned sigma_w (as :func:`meanfield.torch.initialise_`
        draws them) and the output bias at sigma_b; ValueError naming ``where`` for what the theory has
        not (tokens first, other key or value sizes, learned extra keys, zero attention, dropout in training,
        query/key/value biases away from their initial 0)."""
        import torch
        from torch import nn

        if not isinstance(module, nn.MultiheadAttention):
            return None
        if not module.batch_first:
            raise ValueError(f"{where}: batch_first=False takes (tokens, batch, channels); from_torch reads "
                             "(batch, tokens, channels): build it with batch_first=True")
        if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
            raise ValueError(f"{where}: kdim/vdim other than embed_dim, add_bias_kv or add_zero_attn are not "
                             "in the theory's attention")
        if module.dropout and module.training:
            raise ValueError(f"{where}: attention dropout {module.dropout} in training mode; call .eval()")
        if module.in_proj_bias is not None and torch.any(module.in_proj_bias.detach() != 0):
            raise ValueError(f"{where}: in_proj_bias is not 0 (its value at initialisation); the theory's "
                             "queries, keys and values have no bias (meanfield.torch.initialise_ sets it to 0)")
        return attention(module.num_heads, scaling="1/sqrt(d)", sigma_q="sigma_w", sigma_k="sigma_w",
                         sigma_v="sigma_w", sigma_b=None if module.out_proj.bias is not None else 0)

    def short(self, num=format_number):
        args = [] if self.heads == 1 else [f"heads={self.heads}"]
        args += ["tied=True"] if self.tied else []
        args += [] if self.scaling == "1/d" else [f"scaling={self.scaling!r}"]
        defaults = dict(zip(_SIGMAS, (1, 1, 1, S.sigma_w, S.sigma_b)))
        args += [f"{k}={num(getattr(self, k))}" for k in _SIGMAS if getattr(self, k) != defaults[k]]
        args += [] if self.samples == 2048 else [f"samples={self.samples}"]
        args += [] if self.rtol == 0.01 else [f"rtol={self.rtol:g}"]
        return f"attention({', '.join(args)})"

    def to_json(self):
        return {"type": "Attention", "heads": self.heads, "tied": self.tied, "scaling": self.scaling,
                **{k: json_value(getattr(self, k)) for k in _SIGMAS}, "samples": self.samples, "rtol": self.rtol}

    @classmethod
    def from_json(cls, fields, path, read_tree):
        allowed = {"heads", "tied", "scaling", "samples", "rtol", *_SIGMAS}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"{path}: Attention has no field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        sigmas = {k: value_from_json(f"{path}.{k}", fields[k]) for k in _SIGMAS if k in fields}
        rest = {k: fields[k] for k in ("heads", "tied", "scaling", "samples", "rtol") if k in fields}
        return cls(**rest, **sigmas)

    def torch_forward(self, z, ctx):
        """The layer on the (I, P, S, B, T, N) layout, heads over the channels (N = heads d_h), with exact
        tangents: the value path P dv and the softmax path dP v, dP = P (ds - sum_u P ds), ds from the tangents
        of q and k. Draws, in order: W_Q, W_K (unless tied), W_V, W_O (I, N, N) and the output bias (I, N)."""
        import torch

        from ..torch import context as C

        I, P, Sl, B, T, N = z.shape
        if N % self.heads:
            raise ValueError(f"{self.short()}: the width {N} is not a multiple of heads={self.heads}")
        H, dh = self.heads, N // self.heads
        flat = z.reshape(I, P * Sl * B * T, N)

        def projection():
            G = ctx.normal((N, N))
            return torch.bmm(flat, G.transpose(1, 2)).view(I, P, Sl, B, T, H, dh) / math.sqrt(N)

        def scaled(x, sigma):
            return x * ctx.value(sigma).view(1, -1, 1, 1, 1, 1, 1)

        base = projection()
        q, k = scaled(base, self.sigma_q), scaled(base if self.tied else projection(), self.sigma_k)
        v = scaled(projection(), self.sigma_v)
        scale = dh if self.scaling == "1/d" else math.sqrt(dh)
        logits = torch.einsum("ipsbthd,ipsbuhd->ipsbhtu", q[:, :, :1], k[:, :, :1]) / scale
        w = torch.softmax(logits, dim=-1)                                  # (I, P, 1, B, H, T, T)
        y = torch.einsum("ipsbhtu,ipsbuhd->ipsbthd", w, v)
        if Sl > 1:
            ds = (torch.einsum("ipsbthd,ipsbuhd->ipsbhtu", q[:, :, 1:], k[:, :, :1])
                  + torch.einsum("ipsbthd,ipsbuhd->ipsbhtu", q[:, :, :1], k[:, :, 1:])) / scale
            dw = w * (ds - (w * ds).sum(dim=-1, keepdim=True))
            y = torch.cat([y[:, :, :1], y[:, :, 1:] + torch.einsum("ipsbhtu,ipsbuhd->ipsbthd", dw, v[:, :, :1])],
                          dim=2)
        G = ctx.normal((N, N))
        out = torch.bmm(y.reshape(I, P * Sl * B * T, N), G.transpose(1, 2)).view(I, P, Sl, B, T, N)
        out = out * C.param_view(ctx.value(self.sigma_o) / math.sqrt(N))
        g = ctx.normal((N,)).view(I, 1, 1, 1, N)
        out[:, :, 0] += ctx.value(self.sigma_b).view(1, -1, 1, 1, 1) * g
        return out


def _sampled_jacobian(P, A, V, c):
    r"""sum over the draws of the Jacobian map of 1/sqrt(d_h) attention, before sigma_o^2 sigma_v^2 (module notes):

        P V P^T + c^2 (V o F_A + A o F_V),   F_X[t, t'] = <D^t A D^t', X>,   D^t = diag(P_t) - P_t P_t^T,

    per input; ``P`` (k, n, T, T) draws, ``A`` (n, T, T) the token kernel, ``V`` (n, T, T, m) the Jacobians
    between positions of m walks. Returns (n, T, T, m)."""
    D = np.einsum("kxtu,uw->kxtuw", P, np.eye(P.shape[-1])) - np.einsum("kxtu,kxtw->kxtuw", P, P)
    E = np.einsum("kxtuw,xwv->kxtuv", D, A, optimize=True)          # D^t A

    def F(X):   # <D^t A D^s, X> for every (t, s); X (n, T, T, m)
        H = np.einsum("kxtuv,xuzm->kxtvzm", E, X, optimize=True)
        return np.einsum("kxtvzm,kxsvz->xtsm", H, D, optimize=True)

    value = np.einsum("kxtu,xuvm,kxsv->xtsm", P, V, P, optimize=True)
    return value + c**2 * (V * F(A[..., None]) + A[..., None] * F(V))


def attention(heads: int = 1, *, tied: bool = False, scaling: str = "1/d", sigma_q=1.0, sigma_k=1.0, sigma_v=1.0,
              sigma_o=None, sigma_b=None, samples: int = 2048, rtol: float = 0.01) -> Attention:
    """Multi-head self-attention over the tokens with its output projection, at infinite width (module notes).

    ``heads``: the number of heads (the channels split into heads of d / heads); ``tied``: one matrix for
    queries and keys; ``scaling``: '1/d' (logits q.k / d_h, the limit of the module notes) or '1/sqrt(d)'
    (the standard transformer's; realised in torch, refused by the theory); ``sigma_q``, ``sigma_k``,
    ``sigma_v``: the scales of the query, key and value projections (numbers, default 1); ``sigma_o``,
    ``sigma_b``: of the output projection and its bias (default: the symbols sigma_w, sigma_b that the
    solvers scan, as for :func:`~.linear.dense`).
    """
    sig = {name: parameter(name, v, default) for name, v, default in (
        ("sigma_q", sigma_q, sp.Integer(1)), ("sigma_k", sigma_k, sp.Integer(1)), ("sigma_v", sigma_v, sp.Integer(1)),
        ("sigma_o", sigma_o, S.sigma_w), ("sigma_b", sigma_b, S.sigma_b))}
    return Attention(heads, tied, scaling, **sig, samples=samples, rtol=rtol)
