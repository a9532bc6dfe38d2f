r"""The batched Monte-Carlo pass: ``n_init`` random networks of one architecture at P points,
run together, with their per-initialisation K^l, K12^l, J^{l,l+1} and J^{l0,l}.

The engine under :func:`~meanfield.verification.monte_carlo`,
:func:`~meanfield.verification.phase_diagram` (in one process or in shards on a
Dask cluster) and :func:`~meanfield.verification.gram.empirical_kernels`; the
conventions (layers, inputs, APJN normalisation, seeds) are stated in
:mod:`meanfield.verification.montecarlo`. Every random number of
initialisation i is a function of (seed, i) only, so a chunk or a shard of
initialisations draws exactly what the whole run draws for them.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .._validate import check_int
from ..torch.networks import PROBE_STREAMS, Context, input_layer, realise

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
    grid = tuple(tokens) if isinstance(tokens, (tuple, list)) else None   # 2-D positions: their (H, W)
    T = (math.prod(grid) if grid else tokens or width) if arch.has_tokens else 1
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
        ctx.grid = grid     # the positions' shape, which convolutions read and update
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
                    cum = _probes(ctx, n_probes, B, z.shape[4], width, exact, coupled, P, key=(2, l))
                    R1 = cum.shape[2]
                    parts.append(cum)
                R2 = 0
                if l in chi_layers:
                    fresh = _probes(ctx, n_probes, B, z.shape[4], width, exact, coupled, P, key=(1, l))
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
    return dict(K=K_all, K12=K12_all, chi=chi_all, J=J_all, overlap=overlap, tokens=grid or T, input_dim=N0)


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
