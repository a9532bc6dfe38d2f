r"""Monte-Carlo measurement of K^l, J^{l,l+1} and J^{l0,l} on real finite-width networks.

:func:`monte_carlo` builds ``n_init`` networks of an
:class:`~meanfield.calculus.Architecture` (input layer + ``depth - 1``
blocks realised from ``Architecture.block_spec()`` by
:mod:`.networks`), runs them together in one batched pass and returns the
NNGP kernel and the APJNs, each with its standard error over
initialisations. :func:`phase_diagram` does the same over a
(sigma_w, sigma_b) grid with common random numbers and returns the
penultimate APJN J^{L-2,L-1} (partial-Jacobian paper, Prop. 2.6).

Conventions (those of :func:`meanfield.solvers.kernel_profile`):

* Layers l = 1..depth; h^1 = W^1 x + b^1 is the input layer's output,
  h^{l+1} = block(h^l). Every array is indexed by layer as in
  ``kernel_profile``, with length ``depth``: ``K[l-1]`` = K^l =
  E[(1/N) sum_i h_i^l(x)^2], ``chi_J[l-1]`` = J^{l,l+1} (the block after
  h^l; for l = depth one more block is run for it, whose output is not
  otherwise used, so ``mc.chi_J - kernel_profile(...).chi_J`` needs no
  slicing), ``J[l-1]`` = J^{l0,l} (J^{l0,l0} = 1, nan for l < l0).
* Inputs have |x|^2 / N0 = 1 exactly and, in a batch, pairwise overlaps
  x.x'/N0 = ``input_correlation`` exactly (orthonormal construction) when
  the input dimension allows it, so K^1 = sigma_w^2 + sigma_b^2 and
  K12^1 = sigma_w^2 rho + sigma_b^2; ``input_overlap`` in the result is the
  value realised.
* APJN normalised by the output width (partial-Jacobian eq. 3) and, for a
  batch, summed over input and output samples and divided by |B| (AutoInit
  eq. 3): cross-sample derivatives count, which only BatchNorm produces.
  J^{1,l} starts at h^1, so the O(1/N0) input-layer correction of
  Lemma D.1 does not enter.
* Standard errors are std(ddof=1)/sqrt(n_init) of the per-initialisation
  estimates (each already averaged over the batch, the neurons and the
  probes), so Hutchinson probe noise is included in them.

Estimators: ``"hutchinson"`` pushes ``n_probes`` Gaussian probes per
initialisation through forward-mode JVPs (a fresh probe at each h^l for
J^{l,l+1}, one carried from h^{l0} for J^{l0,l}); ``"exact"`` pushes the
whole identity basis, i.e. computes full Jacobians (small widths only).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .._serialize import Result
from .._validate import check_int, check_nonnegative, check_real
from ..calculus import Architecture, as_architecture
from ..torch.networks import PROBE_STREAMS, Context, input_layer, realise

__all__ = ["MonteCarloResult", "MonteCarloOverflowWarning", "PhaseDiagramResult", "monte_carlo", "phase_diagram",
           "resolve_device", "make_inputs"]

ESTIMATORS = ("hutchinson", "exact")
_EXACT_MAX_DIM = 8192


# ---------------------------------------------------------------------------
# Argument checks.
# ---------------------------------------------------------------------------
def resolve_device(device) -> torch.device:
    """``None`` -> 'cuda' when available, else 'cpu'; ValueError for unknown or unavailable devices."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device={device!r} is not a torch device; use None, 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available on this machine (torch "
                             f"{torch.__version__}); use device='cpu' or None")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return dev
    raise ValueError(f"device={device!r} is not supported; use None, 'cpu', 'cuda' or 'cuda:N'")


def _check_int(name, value, minimum):
    return check_int(name, value, minimum)


class MonteCarloOverflowWarning(RuntimeWarning):
    """K^l overflowed the floating-point type of a Monte-Carlo run (float32: 3.4e38)."""


def _check_degenerate(arch, sw, sb, width, input_correlation):
    """ValueError where a normalisation would divide 0 by 0 in the finite network.

    LayerNorm over one feature (x - mean = 0), LayerNorm of an all-zero first
    layer (sigma_w = sigma_b = 0), BatchNorm of identical inputs
    (input_correlation = 1 or sigma_w = 0: zero batch variance).
    """
    ln = arch.centres_features
    if ln and width < 2:
        raise ValueError(f"width must be >= 2 with {arch}: a LayerNorm over "
                         "one feature subtracts its own mean and divides 0 by 0")
    sw, sb = np.asarray(sw, dtype=np.float64), np.asarray(sb, dtype=np.float64)
    if arch.normalises and np.any((sw == 0) & (sb == 0)):
        raise ValueError(f"sigma_w = sigma_b = 0 with {arch}: the first layer's "
                         "output is exactly 0 and its normalisation divides 0 by 0; use sigma_w > 0 or sigma_b > 0")
    if arch.couples_batch:
        if np.any(sw == 0):
            raise ValueError("sigma_w=0 with norm='bn': every input gives the same preactivations (the biases), "
                             "so the batch variance is 0 and BatchNorm divides 0 by 0; use sigma_w > 0")
        if input_correlation >= 1.0:
            raise ValueError("input_correlation=1 with norm='bn': identical inputs have zero batch variance and "
                             "BatchNorm divides 0 by 0; use input_correlation < 1")


def _flag_overflow(K, dtype):
    """First layer (1-based) whose mean K^l is not finite, 0 if none; warns."""
    bad = ~np.isfinite(np.asarray(K))
    if not bad.any():
        return 0
    l = int(np.flatnonzero(bad.reshape(-1, bad.shape[-1]).any(0))[0]) + 1
    import warnings

    warnings.warn(f"K^l overflows {str(dtype).replace('torch.', '')} from layer {l} (max "
                  f"{torch.finfo(dtype).max:.3g}): K, chi_J and J are inf or NaN from there on "
                  "(overflow_layer in the result); use dtype=torch.float64, a smaller sigma_w or a smaller depth",
                  MonteCarloOverflowWarning, stacklevel=3)
    return l


def _check_dtype(dtype):
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def _seed_for(seed: int, *key: int) -> int:
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *key]).generate_state(1, np.uint64)[0]
               % (2**63 - 1))


# ---------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------
def make_inputs(batch: int, tokens: int, input_dim: int, correlation: float = 0.0, seed: int = 0,
                device="cpu", dtype=torch.float64, norm: float = 1.0):
    """Inputs x of shape (batch, tokens, input_dim) with |x_bt|^2 / N0 = ``norm`` (default 1).

    Overlaps x_bt . x_b't / N0 between different inputs (same token) are
    exactly ``correlation`` when batch * tokens + tokens <= input_dim
    (orthonormal directions, a shared one per token); otherwise the rows are
    independent normalised Gaussians. Returns (x, realised mean overlap).
    """
    if not -1.0 / max(batch - 1, 1) <= correlation <= 1.0 or correlation < 0:
        raise ValueError(f"input_correlation must be in [0, 1], got {correlation!r}")
    gen = torch.Generator().manual_seed(_seed_for(seed, 2**31 - 1))
    n_dirs = batch * tokens + tokens
    if n_dirs <= input_dim:
        A = torch.randn(input_dim, n_dirs, generator=gen, dtype=torch.float64)
        Q, _ = torch.linalg.qr(A)  # orthonormal columns
        U = Q.T.reshape(batch + 1, tokens, input_dim)
        shared, own = U[0], U[1:]
        x = math.sqrt(correlation) * shared.unsqueeze(0) + math.sqrt(1 - correlation) * own
        x = x * math.sqrt(input_dim)
    else:
        x = torch.randn(batch, tokens, input_dim, generator=gen, dtype=torch.float64)
        x = x * (math.sqrt(input_dim) / x.norm(dim=-1, keepdim=True))
    x = x * math.sqrt(norm)
    if batch >= 2:
        gram = torch.einsum("btn,ctn->tbc", x, x) / (input_dim * norm)
        off = ~torch.eye(batch, dtype=torch.bool)
        overlap = float(gram[:, off].mean())
    else:
        overlap = float("nan")
    return x.to(device=device, dtype=dtype), overlap


# ---------------------------------------------------------------------------
# Results.
# ---------------------------------------------------------------------------
@dataclass(repr=False)
class MonteCarloResult(Result):
    """Monte-Carlo estimates with standard errors over initialisations (numpy arrays).

    Every array has length ``depth`` and entry ``[l-1]`` belongs to layer
    l = 1..depth (``layers``), the indexing of
    :func:`meanfield.kernel_profile`: ``K``, ``K_se``: K^l. ``K12``,
    ``K12_se``: the mean off-diagonal kernel between different inputs (nan
    when batch = 1). ``chi_J``, ``chi_J_se``: J^{l,l+1}, the block after
    h^l (for l = depth measured across one extra block). ``J``, ``J_se``:
    J^{l0,l} = prod_{l0 <= l' < l} chi_J[l'-1] in expectation. ``samples``
    holds the per-initialisation estimates (first axis: initialisation,
    second: layer) for bootstrap fits. ``save``/``load`` as every result
    (:class:`meanfield._serialize.Result`).
    """

    architecture: Architecture
    sigma_w: float
    sigma_b: float
    depth: int
    width: int
    n_init: int
    batch: int
    tokens: int
    input_dim: int
    input_overlap: float
    input_norm: float
    l0: int
    estimator: str
    n_probes: int
    device: str
    dtype: str
    seed: int
    K: np.ndarray
    K_se: np.ndarray
    K12: np.ndarray
    K12_se: np.ndarray
    chi_J: np.ndarray
    chi_J_se: np.ndarray
    J: np.ndarray
    J_se: np.ndarray
    seconds: float = 0.0
    samples: dict = field(default_factory=dict, repr=False)
    #: first layer l whose K^l overflowed the dtype (inf/NaN from there on; a
    #: MonteCarloOverflowWarning was issued), 0 if none
    overflow_layer: int = 0

    @property
    def layers(self) -> np.ndarray:
        return np.arange(1, self.depth + 1)

    def to_dict(self, samples: bool = False) -> dict:
        out = {k: getattr(self, k) for k in ("sigma_w", "sigma_b", "depth", "width", "n_init", "batch",
                                              "tokens", "input_dim", "input_overlap", "input_norm", "l0",
                                              "estimator",
                                              "n_probes", "device", "dtype", "seed", "seconds",
                                              "overflow_layer")}
        out["architecture"] = str(self.architecture)
        for k in ("K", "K_se", "K12", "K12_se", "chi_J", "chi_J_se", "J", "J_se"):
            out[k] = _jsonable(getattr(self, k))
        if samples:
            out["samples"] = {k: _jsonable(v) for k, v in self.samples.items()}
        return out


@dataclass(repr=False)
class PhaseDiagramResult(Result):
    """Monte-Carlo J^{layer,layer+1} on a grid: ``chi_J[i, j]`` at (sigma_w[i], sigma_b[j])."""

    architecture: Architecture
    sigma_w: np.ndarray
    sigma_b: np.ndarray
    depth: int
    width: int
    n_init: int
    layer: int
    chi_J: np.ndarray
    chi_J_se: np.ndarray
    K: np.ndarray
    device: str
    dtype: str
    seed: int
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"architecture": str(self.architecture), "sigma_w": _jsonable(self.sigma_w),
                "sigma_b": _jsonable(self.sigma_b), "depth": self.depth, "width": self.width,
                "n_init": self.n_init, "layer": self.layer, "chi_J": _jsonable(self.chi_J),
                "chi_J_se": _jsonable(self.chi_J_se), "K": _jsonable(self.K), "device": self.device,
                "dtype": self.dtype, "seed": self.seed, "seconds": self.seconds}


def _jsonable(a):
    a = np.asarray(a, dtype=np.float64)
    return [None if not np.isfinite(v) else float(v) for v in a.ravel()] if a.ndim <= 1 else \
        [_jsonable(row) for row in a]


# ---------------------------------------------------------------------------
# The batched pass.
# ---------------------------------------------------------------------------
def _probes(ctx: Context, R: int, B: int, T: int, N: int, exact: bool, coupled: bool, P: int, key=None):
    """Tangent seeds (I, P, R, B, T, N): Gaussian probes or the identity basis.

    Gaussian probes of kind ``key = (kind, layer)`` are their own random
    stream, apart from the weights' (counter-based source: stream
    ``2^31 + kind * 2^24 + layer`` of :mod:`._philox`; per-initialisation
    generators: a generator seeded by (seed, i, kind, layer)), so the
    weights of a network do not depend on which probes are requested
    (monte_carlo and phase_diagram see the same networks for the same seed).
    """
    I = ctx.n_init
    if not exact:
        if ctx.generators is None:
            kind, layer = key
            v = ctx.stream(PROBE_STREAMS + (kind << 24) + layer, (R, B, T, N))
        else:
            v = torch.empty((I, R, B, T, N), device=ctx.device, dtype=ctx.dtype)
            for j, i in enumerate(ctx.init_ids):
                g = torch.Generator(device=ctx.device).manual_seed(_seed_for(ctx.seed, i, *key))
                torch.randn((R, B, T, N), generator=g, out=v[j])
        return v.unsqueeze(1).expand(I, P, R, B, T, N)
    if coupled:  # basis over (B, T, N): cross-sample derivatives
        eye = torch.eye(B * T * N, device=ctx.device, dtype=ctx.dtype).view(B * T * N, B, T, N)
    else:  # the same basis vector in every input: J is block diagonal over the batch
        eye = torch.eye(T * N, device=ctx.device, dtype=ctx.dtype).view(T * N, 1, T, N).expand(T * N, B, T, N)
    R = eye.shape[0]
    return eye.view(1, 1, R, B, T, N).expand(I, P, R, B, T, N)


def _apjn(t: torch.Tensor, exact: bool) -> torch.Tensor:
    """Per-(init, point) APJN from output tangents (I, P, R, B, T, N)."""
    per = t.pow(2).sum(dim=(3, 4, 5)) / (t.shape[3] * t.shape[4] * t.shape[5])
    return per.sum(2) if exact else per.mean(2)


def _kernels(h: torch.Tensor):
    """K (I, P) and mean off-diagonal K12 (I, P) of the primal (I, P, B, T, N)."""
    I, P, B, T, N = h.shape
    K = h.pow(2).mean(dim=(2, 3, 4))
    if B < 2:
        return K, torch.full_like(K, float("nan"))
    flat = h.permute(0, 1, 3, 2, 4).reshape(I * P * T, B, N)
    gram = torch.bmm(flat, flat.transpose(1, 2)) / N  # (IPT, B, B)
    total = gram.sum(dim=(1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    K12 = (total / (B * (B - 1))).view(I, P, T).mean(-1)
    return K, K12


def _context(params, device, dtype, seed, idx) -> Context:
    """Random numbers of initialisations ``idx``: counter-based on the CPU, per-init generators on CUDA.

    Both depend only on (seed, initialisation index), so a chunk or a shard
    of initialisations draws exactly the rows the whole run draws there. On
    the CPU one call fills a weight tensor for every initialisation of the
    chunk (:mod:`._philox`); on CUDA each initialisation has its own device
    generator (Philox on the device), seeded by (seed, i).
    """
    if torch.device(device).type == "cpu":
        return Context(None, params, device, dtype, seed=seed, init_ids=idx)
    gens = [torch.Generator(device=device).manual_seed(_seed_for(seed, i, 0)) for i in idx]
    ctx = Context(gens, params, device, dtype, seed=seed)
    ctx.init_ids = list(idx)  # the probes' generators are keyed by the global index
    return ctx


def _run(arch, sw, sb, depth, width, n_init, batch, device, seed, dtype, *, estimator="hutchinson",
         n_probes=1, l0=1, input_dim=None, tokens=None, input_correlation=0.0, input_norm=1.0, chi_layers=None,
         track_J=True, track_K=True, init_chunk=None, progress=None, init_offset=0):
    """Core pass. sw, sb: 1-d arrays of length P (paired). Returns per-init arrays.

    Runs initialisations ``init_offset .. init_offset + n_init - 1`` (a shard of a
    larger run: initialisation i draws from its own generators whatever the offset).
    """
    exact = estimator == "exact"
    block = realise(arch)
    # read from the tree: token axis (ResMLP, Mixer, any tree with token mixing),
    # cross-sample coupling (BatchNorm)
    T = (tokens or width) if arch.has_tokens else 1
    coupled = arch.couples_batch
    B = batch
    N0 = input_dim or max(width, B * T + T)
    x, overlap = make_inputs(B, T, N0, input_correlation, seed, device, dtype, input_norm)
    P = len(sw)
    params = {"sigma_w": sw, "sigma_b": sb, "mu": arch.mu if arch.mu is not None else 0.0,
              "eps": arch.eps if arch.eps is not None else 1.0}
    # J^{l,l+1} for every layer l = 1..depth: for l = depth one more block runs (its weights are drawn
    # after every other block's, so the networks' layers 1..depth are unchanged by it)
    chi_layers = set(range(1, depth + 1)) if chi_layers is None else set(chi_layers)
    if exact:
        dim = (B if coupled else 1) * T * width
        if dim > _EXACT_MAX_DIM:
            raise ValueError(f"estimator='exact' pushes {dim} basis tangents per layer; use width/tokens/batch "
                             f"with (batch if BN) * tokens * width <= {_EXACT_MAX_DIM}, or 'hutchinson'")
    if init_chunk is None:
        init_chunk = _auto_chunk(P, B, T, width, n_probes if not exact else (B if coupled else 1) * T * width,
                                 track_J, len(chi_layers) > 0, dtype, device)
    inp = input_layer(width, "features")
    K_all = np.full((n_init, P, depth), np.nan)
    K12_all = np.full((n_init, P, depth), np.nan)
    chi_all = np.full((n_init, P, depth), np.nan)
    J_all = np.full((n_init, P, depth), np.nan)
    for start in range(0, n_init, init_chunk):
        idx = range(init_offset + start, init_offset + min(n_init, start + init_chunk))
        ctx = _context(params, device, dtype, seed, idx)
        sl = slice(start, start + len(idx))
        with torch.no_grad():
            z = inp(x.view(1, 1, 1, B, T, N0).expand(len(idx), 1, 1, B, T, N0), ctx)
            R1 = 0
            for l in range(1, depth + 1):
                h = z[:, :, 0]
                if track_K is True or (track_K and l in track_K):
                    K, K12 = _kernels(h)
                    K_all[sl, :, l - 1] = K.double().cpu().numpy()
                    K12_all[sl, :, l - 1] = K12.double().cpu().numpy()
                if track_J and R1 and l > l0:
                    J_all[sl, :, l - 1] = _apjn(z[:, :, 1:1 + R1], exact).double().cpu().numpy()
                if l == depth and l not in chi_layers:
                    break
                if l == depth and R1:  # past the last layer only J^{depth,depth+1} is wanted
                    z, R1 = z[:, :, :1], 0
                parts = [z]
                if track_J and l == l0:
                    J_all[sl, :, l - 1] = 1.0
                if track_J and l == l0 and l < depth:
                    cum = _probes(ctx, n_probes, B, T, width, exact, coupled, P, key=(2, l))
                    R1 = cum.shape[2]
                    parts.append(cum)
                R2 = 0
                if l in chi_layers:
                    fresh = _probes(ctx, n_probes, B, T, width, exact, coupled, P, key=(1, l))
                    R2 = fresh.shape[2]
                    parts.append(fresh)
                if len(parts) > 1:
                    z = torch.cat(parts, dim=2)
                z = block(z, ctx)
                if R2:
                    chi_all[sl, :, l - 1] = _apjn(z[:, :, 1 + R1:], exact).double().cpu().numpy()
                    z = z[:, :, :1 + R1]
                if progress is not None:
                    progress(len(idx))
                if l == depth:
                    break
    return dict(K=K_all, K12=K12_all, chi=chi_all, J=J_all, overlap=overlap, tokens=T, input_dim=N0)


def _bytes_per_init(P, B, T, N, R, track_J, track_chi, dtype):
    """Peak bytes of one initialisation in a pass over P points: ~6 live copies of z, weights."""
    itemsize = 4 if dtype == torch.float32 else 8
    S = 1 + (R if track_J else 0) + (R if track_chi else 0)
    return itemsize * (P * S * B * T * N * 6 + 3 * (max(N, T) ** 2))


def _auto_chunk(P, B, T, N, R, track_J, track_chi, dtype, device):
    """Initialisations per pass so that the activations fit a memory budget."""
    per_init = _bytes_per_init(P, B, T, N, R, track_J, track_chi, dtype)
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        budget = 0.5 * free
    else:
        budget = 2.0e9
    return int(max(1, min(1024, budget // max(per_init, 1))))


def _mean_se(a: np.ndarray, axis: int = 0):
    n = a.shape[axis]
    with np.errstate(invalid="ignore"):
        return a.mean(axis), a.std(axis, ddof=1) / math.sqrt(n)


def _positive(name, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _validate_common(arch, depth, width, n_init, batch, device, dtype, seed, kwargs):
    arch = as_architecture(arch)
    depth = _check_int("depth", depth, 2)
    width = _check_int("width", width, 1)
    n_init = _check_int("n_init", n_init, 2)
    batch = _check_int("batch", batch, 1)
    arch.require_values("monte_carlo")
    if arch.couples_batch and batch < 2:
        raise ValueError(f"{arch} normalises over the batch (BatchNorm); batch must be >= 2 (large for the "
                         f"large-batch theory), got {batch}")
    seed = _check_int("seed", seed, 0)
    dev = resolve_device(device)
    dtype = _check_dtype(dtype)
    est = kwargs.get("estimator", "hutchinson")
    if est not in ESTIMATORS:
        raise ValueError(f"estimator={est!r} is not allowed; choose one of {', '.join(ESTIMATORS)}")
    _check_int("n_probes", kwargs.get("n_probes", 1), 1)
    if kwargs.get("tokens") is not None:
        _check_int("tokens", kwargs["tokens"], 1)
    if kwargs.get("input_dim") is not None:
        _check_int("input_dim", kwargs["input_dim"], 1)
    return arch, depth, width, n_init, batch, dev, dtype, seed


def monte_carlo(arch, sigma_w=None, sigma_b=None, depth=10, width=256, n_init=32, batch=1, device=None,
                seed=0, dtype=torch.float64, *, estimator="hutchinson", n_probes=1, l0=1, input_dim=None,
                tokens=None, input_correlation=0.0, input_norm=1.0, init_chunk=None) -> MonteCarloResult:
    """Measure K^l, J^{l,l+1} and J^{l0,l} on ``n_init`` random networks of ``arch``.

    Parameters
    ----------
    arch : Architecture or activation name
    sigma_w, sigma_b : float
        Weight and bias scales (W ~ N(0, sigma_w^2/fan_in), b ~ N(0, sigma_b^2));
        required (no default point).
    depth : int >= 2
        Layers h^1..h^depth (input layer + depth - 1 blocks).
    width : int >= 1
        Features per layer (channels for ResMLP/Mixer).
    n_init : int >= 2
        Independent initialisations (standard errors need at least two).
    batch : int
        Inputs per network (BatchNorm needs >= 2; its theory is the large-batch limit).
    device : None, 'cpu', 'cuda', 'cuda:N'
        None picks CUDA when available.
    seed : int
        Every random number of initialisation i is a function of (seed, i)
        only (on the CPU the counter-based streams of
        :mod:`meanfield.torch._philox`, keyed by (seed, i, draw);
        on CUDA per-initialisation device generators seeded by (seed, i)),
        with the probes on streams of their own, so results are
        reproducible, do not depend on chunking (``init_chunk``) or sharding,
        and the same seed gives the same networks (and probes) in
        :func:`phase_diagram`; the inputs depend on seed only.
    dtype : torch.float64 or torch.float32
    estimator : 'hutchinson' or 'exact'
    n_probes : int
        Gaussian probes per initialisation (Hutchinson).
    l0 : int
        Where the cumulative Jacobian starts: J = J^{l0,l}.
    input_dim : int, optional
        N0; default max(width, batch*tokens + tokens) so inputs can be orthogonal.
    tokens : int, optional
        Tokens (patches) for block='resmlp'/'mixer'; default = width.
    input_correlation : float
        Overlap rho of different inputs (K12^1 = sigma_w^2 q rho + sigma_b^2).
    input_norm : float
        q = |x|^2 / N0 of every input (K^1 = sigma_w^2 q + sigma_b^2); raise it
        to start above a fixed point (GELU's second critical point).
    init_chunk : int, optional
        Initialisations per pass (memory); results do not depend on it.

    Returns
    -------
    MonteCarloResult
    """
    arch, depth, width, n_init, batch, dev, dtype, seed = _validate_common(
        arch, depth, width, n_init, batch, device, dtype, seed,
        dict(estimator=estimator, n_probes=n_probes, tokens=tokens, input_dim=input_dim))
    from ..solvers._common import require_point

    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if v is not None and np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar for monte_carlo (phase_diagram takes grids), got an "
                             f"array of shape {np.shape(v)}")
    sw = None if sigma_w is None else float(check_nonnegative("sigma_w", sigma_w))
    require_point(sigma_w, sigma_b)
    sb = float(check_nonnegative("sigma_b", sigma_b))
    check_real("input_correlation", input_correlation, minimum=0.0, maximum=1.0)
    _check_degenerate(arch, sw, sb, width, float(input_correlation))
    l0 = _check_int("l0", l0, 1)
    if l0 > depth:
        raise ValueError(f"l0 must be <= depth ({depth}), got {l0}")
    t0 = time.perf_counter()
    raw = _run(arch, np.array([sw]), np.array([sb]), depth, width, n_init, batch, dev, seed, dtype,
               estimator=estimator, n_probes=n_probes, l0=l0, input_dim=input_dim, tokens=tokens,
               input_correlation=float(input_correlation), input_norm=_positive("input_norm", input_norm),
               init_chunk=init_chunk)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    K, K_se = _mean_se(raw["K"][:, 0])
    K12, K12_se = _mean_se(raw["K12"][:, 0])
    chi, chi_se = _mean_se(raw["chi"][:, 0])
    J, J_se = _mean_se(raw["J"][:, 0])
    J_se[l0 - 1] = 0.0
    overflow = _flag_overflow(K, dtype)
    return MonteCarloResult(arch, sw, sb, depth, width, n_init, batch, raw["tokens"], raw["input_dim"],
                            raw["overlap"], float(input_norm), l0, estimator, n_probes, str(dev), str(dtype).replace("torch.", ""),
                            seed, K, K_se, K12, K12_se, chi, chi_se, J, J_se, seconds,
                            samples={"K": raw["K"][:, 0], "K12": raw["K12"][:, 0], "chi_J": raw["chi"][:, 0],
                                     "J": raw["J"][:, 0]}, overflow_layer=overflow)


def phase_diagram(arch, sigma_w, sigma_b, depth=50, width=500, n_init=100, batch=1, device=None, seed=0,
                  dtype=torch.float64, *, layer=None, n_probes=1, input_dim=None, tokens=None,
                  input_correlation=0.0, init_chunk=None, point_chunk=None,
                  progress=False, client=None, checkpoint=None) -> PhaseDiagramResult:
    """Monte-Carlo J^{L-2,L-1} (the penultimate APJN, an estimate of chi_J*) on a (sigma_w, sigma_b) grid.

    Every grid point reuses the same standard-normal weights G per
    initialisation (W = sigma_w G / sqrt(fan_in), b = sigma_b g), so the
    grid costs one matrix product per layer and initialisation plus a
    rescaling per point, and differences between points are not blurred by
    independent sampling noise.

    Parameters
    ----------
    sigma_w, sigma_b : 1-d arrays
        The grid axes; the result has shape (len(sigma_w), len(sigma_b)).
    depth : int >= 2
        L; the APJN is measured across the block h^{L-2} -> h^{L-1}
        (``layer`` = L - 2 by default, 1 when depth = 2).
    client : dask.distributed.Client, optional
        Run the grid as shards on a Dask cluster (``distributed`` extra):
        bit-identical to this single-process run for the same seed, whatever
        the number of workers; see :mod:`meanfield.verification.distributed`.
    checkpoint : path, optional
        With ``client``: a folder where each finished shard is saved as it
        completes; a rerun computes only the missing shards.
    Other arguments as in :func:`monte_carlo`.

    Returns
    -------
    PhaseDiagramResult with ``chi_J``, ``chi_J_se`` and the kernel ``K`` at
    that layer, each of shape (len(sigma_w), len(sigma_b)).
    """
    arch, depth, width, n_init, batch, dev, dtype, seed = _validate_common(
        arch, depth, width, n_init, batch, device, dtype, seed,
        dict(n_probes=n_probes, tokens=tokens, input_dim=input_dim))
    sw_axis = np.atleast_1d(check_nonnegative("sigma_w", sigma_w)).ravel()
    sb_axis = np.atleast_1d(check_nonnegative("sigma_b", sigma_b)).ravel()
    for name, ax in (("sigma_w", sw_axis), ("sigma_b", sb_axis)):
        if ax.size == 0:
            raise ValueError(f"{name} must hold at least one value, got an empty array")
    check_real("input_correlation", input_correlation, minimum=0.0, maximum=1.0)
    SW0, SB0 = np.meshgrid(sw_axis, sb_axis, indexing="ij")
    _check_degenerate(arch, SW0, SB0, width, float(input_correlation))
    if layer is None:
        layer = max(depth - 2, 1)
    layer = _check_int("layer", layer, 1)
    if layer > depth - 1:
        raise ValueError(f"layer must be <= depth - 1 ({depth - 1}), got {layer}")
    if client is not None:  # the same per-initialisation passes, as shards on a Dask cluster
        from .distributed import phase_diagram_distributed

        return phase_diagram_distributed(client, arch, sw_axis, sb_axis, depth, width, n_init, batch, device, seed,
                                         dtype, layer=layer, n_probes=n_probes, input_dim=input_dim, tokens=tokens,
                                         input_correlation=input_correlation, point_chunk=point_chunk,
                                         init_chunk=init_chunk, checkpoint=checkpoint, progress=progress)
    if checkpoint is not None:
        raise ValueError("checkpoint= is only used with client= (a Dask cluster); got client=None")
    SW, SB = np.meshgrid(sw_axis, sb_axis, indexing="ij")
    sw_flat, sb_flat = SW.ravel(), SB.ravel()
    Ptot = sw_flat.size
    point_chunk = Ptot if point_chunk is None else _check_int("point_chunk", point_chunk, 1)
    chi = np.empty((n_init, Ptot))
    Kl = np.empty((n_init, Ptot))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_init * layer * math.ceil(Ptot / point_chunk), desc="phase diagram", unit="init-layer",
                   leave=False)
    t0 = time.perf_counter()
    for p0 in range(0, Ptot, point_chunk):
        sl = slice(p0, min(Ptot, p0 + point_chunk))
        raw = _run(arch, sw_flat[sl], sb_flat[sl], layer + 1, width, n_init, batch, dev, seed, dtype,
                   n_probes=n_probes, input_dim=input_dim, tokens=tokens, input_correlation=float(input_correlation),
                   chi_layers={layer}, track_J=False, track_K={layer}, init_chunk=init_chunk,
                   progress=(bar.update if bar is not None else None))
        chi[:, sl] = raw["chi"][:, :, layer - 1]
        Kl[:, sl] = raw["K"][:, :, layer - 1]
    if bar is not None:
        bar.close()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    m, se = _mean_se(chi)
    shape = SW.shape
    if not np.all(np.isfinite(Kl)):
        import warnings

        warnings.warn(f"K overflows {str(dtype).replace('torch.', '')} at layer {layer} for "
                      f"{int((~np.isfinite(Kl).all(0)).sum())} grid point(s): chi_J is inf or NaN there; use "
                      "dtype=torch.float64 or smaller sigma_w / depth", MonteCarloOverflowWarning, stacklevel=2)
    return PhaseDiagramResult(arch, sw_axis, sb_axis, depth, width, n_init, layer, m.reshape(shape),
                              se.reshape(shape), Kl.mean(0).reshape(shape), str(dev),
                              str(dtype).replace("torch.", ""), seed, seconds)
