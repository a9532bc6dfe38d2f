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

import numpy as np
import torch

from .._validate import check_nonnegative, check_real
from ..calculus import as_architecture
# make_inputs and resolve_device stay public names of this module (__all__), as before the pass moved
from ._batched import ESTIMATORS, _check_dtype, _check_int, _mean_se, _run, make_inputs, resolve_device  # noqa: F401
from ._results import MonteCarloResult, PhaseDiagramResult

__all__ = ["MonteCarloResult", "MonteCarloOverflowWarning", "PhaseDiagramResult", "monte_carlo", "phase_diagram",
           "resolve_device", "make_inputs"]


# ---------------------------------------------------------------------------
# Argument checks.
# ---------------------------------------------------------------------------
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


def _positive(name, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _check_positions(arch, tokens):
    """``tokens``: None, an int >= 1, or for a tree with 2-D positions (``conv((kh, kw))``) the (H, W) grid,
    which it requires (ValueError naming the argument otherwise)."""
    dims = arch.position_dims if arch.has_tokens else 1
    if dims == 2:
        if not (isinstance(tokens, (tuple, list)) and len(tokens) == 2):
            raise ValueError(f"{arch} has 2-D positions; tokens must be their (H, W) grid, got {tokens!r}")
        for t in tokens:
            _check_int("tokens", t, 1)
    elif tokens is not None:
        _check_int("tokens", tokens, 1)


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
    _check_positions(arch, kwargs.get("tokens"))
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
    tokens : int or (int, int), optional
        Tokens (patches) for block='resmlp'/'mixer', positions for a
        convolution; default = width. A tree with 2-D positions
        (``conv((kh, kw))``) takes its (H, W) grid here, and needs it.
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
    sw, sb = _scalar_point(sigma_w, sigma_b)
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
    K, K_se, K12, K12_se, chi, chi_se, J, J_se = _layer_means(raw, l0)
    overflow = _flag_overflow(K, dtype)
    return MonteCarloResult(arch, sw, sb, depth, width, n_init, batch, raw["tokens"], raw["input_dim"],
                            raw["overlap"], float(input_norm), l0, estimator, n_probes, str(dev), str(dtype).replace("torch.", ""),
                            seed, K, K_se, K12, K12_se, chi, chi_se, J, J_se, seconds,
                            samples={"K": raw["K"][:, 0], "K12": raw["K12"][:, 0], "chi_J": raw["chi"][:, 0],
                                     "J": raw["J"][:, 0]}, overflow_layer=overflow)


def _scalar_point(sigma_w, sigma_b):
    """(sigma_w, sigma_b) of monte_carlo as floats: scalars >= 0, both given (ValueError naming the
    argument otherwise; grids belong to phase_diagram)."""
    from ..solvers._common import require_point

    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if v is not None and np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar for monte_carlo (phase_diagram takes grids), got an "
                             f"array of shape {np.shape(v)}")
    sw = None if sigma_w is None else float(check_nonnegative("sigma_w", sigma_w))
    require_point(sigma_w, sigma_b)
    return sw, float(check_nonnegative("sigma_b", sigma_b))


def _layer_means(raw, l0):
    """(K, K_se, K12, K12_se, chi_J, chi_J_se, J, J_se) over the initialisations of a one-point pass;
    J^{l0,l0} = 1 exactly, so its standard error is 0."""
    K, K_se = _mean_se(raw["K"][:, 0])
    K12, K12_se = _mean_se(raw["K12"][:, 0])
    chi, chi_se = _mean_se(raw["chi"][:, 0])
    J, J_se = _mean_se(raw["J"][:, 0])
    J_se[l0 - 1] = 0.0
    return K, K_se, K12, K12_se, chi, chi_se, J, J_se


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
        from ._sharded import phase_diagram_distributed

        return phase_diagram_distributed(client, arch, sw_axis, sb_axis, depth, width, n_init, batch, device, seed,
                                         dtype, layer=layer, n_probes=n_probes, input_dim=input_dim, tokens=tokens,
                                         input_correlation=input_correlation, point_chunk=point_chunk,
                                         init_chunk=init_chunk, checkpoint=checkpoint, progress=progress)
    if checkpoint is not None:
        raise ValueError("checkpoint= is only used with client= (a Dask cluster); got client=None")
    return _phase_diagram_here(arch, sw_axis, sb_axis, depth, width, n_init, batch, dev, seed, dtype, layer,
                               n_probes, input_dim, tokens, input_correlation, init_chunk, point_chunk, progress)


def _phase_diagram_here(arch, sw_axis, sb_axis, depth, width, n_init, batch, dev, seed, dtype, layer, n_probes,
                        input_dim, tokens, input_correlation, init_chunk, point_chunk, progress):
    """phase_diagram in this process (arguments checked): the grid in passes of ``point_chunk`` points."""
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
                      "dtype=torch.float64 or smaller sigma_w / depth", MonteCarloOverflowWarning, stacklevel=3)
    return PhaseDiagramResult(arch, sw_axis, sb_axis, depth, width, n_init, layer, m.reshape(shape),
                              se.reshape(shape), Kl.mean(0).reshape(shape), str(dev),
                              str(dtype).replace("torch.", ""), seed, seconds)
