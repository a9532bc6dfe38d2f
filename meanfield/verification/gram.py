r"""Monte-Carlo twin of :func:`meanfield.kernels`: empirical NNGP and NTK Gram matrices.

The network is the torch realisation of the same primitive tree
(:func:`meanfield.torch.networks.realise`, weights drawn per
initialisation from its own generator), on the given inputs:
h^1 = W x + b, then depth - 1 blocks; the output is h^depth, of ``width``
units. Token blocks (ResMLP, MLP-Mixer): the inputs are images (n, T, d), the
input layer acts on each token (weights shared by the tokens), and the
output is the mean of h^depth over the tokens (:mod:`meanfield.gram.tokens`).

* Empirical NNGP: for each initialisation i,
  K_i(a, b) = (1/N) sum_k h_k(x_a) h_k(x_b) over the N output units; the
  estimate is the mean over initialisations, with its standard error.
* Empirical NTK: the network's Gaussian draws (the trained variables w, beta
  of the NTK parameterisation, W = sigma_w w / sqrt(n), b = sigma_b beta)
  are made leaves of a function F(draws) -> outputs, and
  Theta_i(a, b) = (1/|k|) sum_k sum_theta dh_k(x_a)/dtheta dh_k(x_b)/dtheta
  over ``n_outputs`` output units k, by ``torch.func.vjp`` with the
  cotangents of the batch vmapped (one reverse pass per unit for all inputs).
  The standard parameterisation trains W and b themselves:
  dh/dW = dh/dw sqrt(n)/sigma_w, dh/db = dh/dbeta / sigma_b (so it needs
  sigma_w, sigma_b > 0 and the scales of every Dense node to be the symbols).

Both are unbiased for the finite-width kernels; the finite-width NTK differs
from its limit by O(depth/width) (Hanin & Nica 2019), which the tests allow for.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from .. import symbols as S
from .._serialize import Result
from .._validate import check_choice, check_int, check_real
from ..calculus import as_architecture
from ._batched import _seed_for, resolve_device
from ..torch.networks import Context, input_layer, realise

__all__ = ["EmpiricalKernels", "empirical_kernels"]


class _ReplayContext(Context):
    """A Context whose Gaussian draws are recorded (first pass) or replayed from given tensors."""

    def __init__(self, *args, replay=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay = replay
        self.record = []

    def normal(self, shape):
        if self.replay is not None:
            t = self.replay[len(self.record)]
            self.record.append(t)
            return t
        t = super().normal(shape)
        self.record.append(t)
        return t


@dataclass(frozen=True, repr=False)
class EmpiricalKernels(Result):
    """Monte-Carlo NNGP / NTK Gram matrices (mean over initialisations and their standard errors).

    ``nngp``, ``ntk`` and ``*_se``: shape (n1, n2), float64 (None when not asked for).
    """

    architecture: object
    sigma_w: float
    sigma_b: float
    depth: int
    width: int
    n_init: int
    parameterization: str
    nngp: np.ndarray | None
    nngp_se: np.ndarray | None
    ntk: np.ndarray | None
    ntk_se: np.ndarray | None


def empirical_kernels(arch, x1, x2=None, depth=3, sigma_w=1.0, sigma_b=0.0, width=256, n_init=8,
                      parameterization="ntk", get=("nngp", "ntk"), n_outputs=2, seed=0, device=None,
                      dtype=torch.float64, ntk_rows=None, readout="mean") -> EmpiricalKernels:
    """Empirical NNGP and NTK of the realised network on the rows of x1 (and x2): see the module docs.

    Parameters mirror :func:`meanfield.kernels`; ``width`` is the hidden and
    output width, ``n_init`` the number of initialisations, ``n_outputs``
    the output units per initialisation whose NTK is computed (each costs
    one vmapped reverse pass). ``ntk_rows`` (indices into the rows of x1, x2
    None): compute the NTK on those rows only (``ntk`` is then
    (len(ntk_rows),) * 2), one reverse pass per row and unit, while the
    forward pass runs the whole batch; what a large BatchNorm batch needs.
    With BatchNorm the batch is the rows of x1 (x2 must be None). ``readout``
    (inputs with positions): the output is the mean of h^depth over the
    positions ('mean') or h^depth flattened ('flatten', the NNGP
    h.h' / (T width), the NTK over the first ``n_outputs`` channels at every
    position), as in :func:`meanfield.kernels`.
    """
    spec = as_architecture(arch)
    tokens = spec.has_tokens
    get, depth, width, n_init, n_outputs, sw, sb = _check_empirical_args(
        spec, parameterization, get, depth, width, n_init, n_outputs, sigma_w, sigma_b)
    want_ntk = "ntk" in get
    check_choice("readout", readout, ("mean", "flatten"))
    if readout == "flatten" and not tokens:
        raise ValueError("readout='flatten' is for inputs with positions (token blocks, convolutions)")
    device = resolve_device(device)
    x, n1, rows = _empirical_batch(spec, x1, x2, ntk_rows)
    grid = tuple(x.shape[1:-1]) if tokens else (1,)
    B, T, d = x.shape[0], int(np.prod(grid)), x.shape[-1]
    x = x.to(device=device, dtype=dtype).view(1, 1, 1, B, T, d)
    params = {"sigma_w": [sw], "sigma_b": [sb], "mu": spec.mu if spec.mu is not None else 0.0,
              "eps": spec.eps if spec.eps is not None else 1.0}
    inp, block = input_layer(width), realise(spec)

    def net(ctx):
        ctx.grid = grid      # the positions' shape, which convolutions read and update
        z = inp(x, ctx)
        for _ in range(depth - 1):
            z = block(z, ctx)
        # (B, width); token blocks: the readout is the mean over the tokens (meanfield.gram.tokens), or, flattened,
        # every unit, channel-major, so that the first n_outputs * T units are n_outputs channels at every position
        if readout == "flatten":
            h = z[0, 0, 0]
            return h.transpose(1, 2).reshape(h.shape[0], -1)
        return z[0, 0, 0].mean(-2) if tokens else z[0, 0, 0, :, 0, :]

    K_i, T_i = [], []
    for i in range(n_init):
        gen = torch.Generator(device=device).manual_seed(_seed_for(seed, i, 7))
        ctx = _ReplayContext([gen], params, device, dtype)
        with torch.no_grad():
            h = net(ctx)
        if "nngp" in get:
            K_i.append((h @ h.T / h.shape[1]).double().cpu().numpy())
        if want_ntk:
            sel = torch.arange(B) if ntk_rows is None else torch.as_tensor(rows)
            units = n_outputs * (h.shape[1] // width)     # flattened: the first n_outputs channels, every position
            T_i.append(_empirical_ntk(net, ctx, gen, params, device, dtype, B, sel, units, parameterization,
                                      sw, sb))
    block_of = (slice(None, n1), slice(None, n1)) if x2 is None else (slice(None, n1), slice(n1, None))
    K, Kse = _mean_and_se(K_i, block_of)
    T, Tse = _mean_and_se(T_i, block_of if ntk_rows is None else (slice(None), slice(None)))
    return EmpiricalKernels(spec, sw, sb, depth, width, n_init, parameterization, K, Kse, T, Tse)


def _check_empirical_args(spec, parameterization, get, depth, width, n_init, n_outputs, sigma_w, sigma_b):
    """The scalar arguments of :func:`empirical_kernels`, checked (ValueError naming the argument):
    ``(get as a tuple, depth, width, n_init, n_outputs, sigma_w, sigma_b as floats)``."""
    check_choice("parameterization", parameterization, ("ntk", "standard"))
    get = (get,) if isinstance(get, str) else tuple(get)
    if not get or any(g not in ("nngp", "ntk") for g in get):
        raise ValueError(f"get must be 'nngp', 'ntk' or a tuple of them, got {get!r}")
    depth = check_int("depth", depth, 1)
    width = check_int("width", width, 1)
    n_init = check_int("n_init", n_init, 2)
    n_outputs = check_int("n_outputs", n_outputs, 1, width)
    sw = float(check_real("sigma_w", sigma_w, minimum=0))
    sb = float(check_real("sigma_b", sigma_b, minimum=0))
    if "ntk" in get and parameterization == "standard":
        if sw == 0 or sb == 0:
            raise ValueError("the standard parameterisation's empirical NTK is read off the NTK one by "
                             "rescaling gradients: it needs sigma_w > 0 and sigma_b > 0")
        if not all(_scales_are_the_symbols(p) for p in spec.nodes() if p.fresh_weights):
            raise ValueError("the standard parameterisation's empirical NTK needs every weight scale of the tree "
                             "at the symbol sigma_w and every bias scale at sigma_b (no numbers fixed in the tree; "
                             "attention(sigma_q='sigma_w', ...) for its projections)")
    return get, depth, width, n_init, n_outputs, sw, sb


def _empirical_batch(spec, x1, x2, ntk_rows):
    """``(x1 and x2 stacked as one float64 tensor, n1, ntk_rows as an int64 array or None)``, checked
    (ValueError naming the argument): (n, d) rows, or (n, T, d) for token blocks."""
    tokens = spec.has_tokens
    a = torch.as_tensor(np.asarray(x1, dtype=np.float64))
    b = a if x2 is None else torch.as_tensor(np.asarray(x2, dtype=np.float64))
    nd = 2 + spec.position_dims if tokens else 2
    form = {2: ("(n, d)", "d"), 3: ("(n, T, d)", "(T, d)"), 4: ("(n, H, W, d)", "(H, W, d)")}[nd]
    if a.ndim != nd or b.ndim != nd or a.shape[1:] != b.shape[1:]:
        raise ValueError(f"x1, x2 must be {nd}-d arrays {form[0]} with the same {form[1]}, got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}")
    n1 = a.shape[0]
    if spec.couples_batch and x2 is not None:
        raise ValueError("arch has a batch_norm(): the batch is the rows of x1; x2 must be None")
    rows = None
    if ntk_rows is not None:
        if x2 is not None:
            raise ValueError("ntk_rows selects rows of x1; x2 must be None")
        rows = np.asarray(ntk_rows, dtype=np.int64).ravel()
        if rows.size < 1 or rows.min() < 0 or rows.max() >= n1:
            raise ValueError(f"ntk_rows must be indices in [0, {n1}), got {ntk_rows!r}")
    return (torch.cat([a, b]) if x2 is not None else a), n1, rows


def _scales_are_the_symbols(node) -> bool:
    """Whether every weight scale of a node with fresh weights (its fields sigma_*) is the symbol sigma_w and
    its bias scale sigma_b: what reading the standard NTK off the draws' gradients assumes."""
    scales = [f.name for f in dataclasses.fields(node) if f.name.startswith("sigma_")]
    return all(getattr(node, n) == (S.sigma_b if n == "sigma_b" else S.sigma_w) for n in scales)


def _empirical_ntk(net, ctx, gen, params, device, dtype, B, sel, n_outputs, parameterization, sw, sb):
    """One initialisation's empirical NTK on the batch rows ``sel``, averaged over the first ``n_outputs``
    units: Theta = sum over draws of J J^T / n_outputs, J the gradients of the outputs w.r.t. the draws
    that ``ctx`` recorded (one vmapped reverse pass per unit). (len(sel), len(sel)) float64 array."""
    draws = [t.detach() for t in ctx.record]

    def F(*ws):
        return net(_ReplayContext([gen], params, device, dtype, replay=ws))[:, :n_outputs]

    _, vjp = torch.func.vjp(F, *draws)
    R = len(sel)
    theta = torch.zeros(R, R, device=device, dtype=torch.float64)
    for k in range(n_outputs):
        cot = torch.zeros(R, B, n_outputs, device=device, dtype=dtype)
        cot[torch.arange(R), sel, k] = 1.0
        grads = torch.func.vmap(vjp)(cot)       # tuple over draws of (R, 1, *shape)
        for g in grads:
            gf = g.reshape(R, -1)
            if parameterization == "standard":
                # a weight draw (1, out, fan_in): dW = dw sqrt(n)/sigma_w; a bias draw (1, out): db = dbeta/sigma_b
                gf = gf * (np.sqrt(g.shape[-1]) / sw if g.dim() == 4 else 1.0 / sb)
            theta += (gf @ gf.T).double()
    return (theta / n_outputs).cpu().numpy()


def _mean_and_se(per_init, block):
    """(mean, standard error) over the initialisations of the ``block`` (a pair of slices) of each matrix;
    (None, None) when there are none."""
    if not per_init:
        return None, None
    arr = np.array(per_init)
    m, se = arr.mean(0), arr.std(0, ddof=1) / np.sqrt(len(arr))
    return m[block], se[block]
