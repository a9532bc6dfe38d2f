"""The result of :func:`meanfield.kernels`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._serialize import Result

__all__ = ["Kernels"]


@dataclass(frozen=True, repr=False)
class Kernels(Result):
    """Infinite-width NNGP and NTK Gram matrices of a network's output.

    ``nngp[a, b] = K^depth(x1[a], x2[b])``, ``ntk[a, b] = Theta^depth(x1[a], x2[b])``
    (float64, shape (n1, n2); None when not asked for). ``nngp_diag`` is the
    per-layer diagonal K^l(x1[a], x1[a]) for l = 1..depth, shape (depth, n1),
    when asked (``per_layer=True``). ``batch_n_eff`` (blocks with BatchNorm
    only, shape (depth - 1,)): the batch's effective size
    tr(PKP)^2 / tr((PKP)^2) at each block's BatchNorm (the smallest when
    there are several); the large-batch limit is exact as it grows, with
    O(1 / n_eff) corrections per block. ``readout``: for inputs with
    positions, 'mean' (over the positions) or 'flatten'. ``nngp_se`` (trees
    with 1/sqrt(d) attention only): the standard error of ``nngp``, whose
    expectation over the attention logits is sampled (8 independent walks).
    Conventions: :mod:`meanfield.gram`.
    """

    architecture: object
    sigma_w: float
    sigma_b: float
    depth: int
    parameterization: str
    width: float | None
    nngp: np.ndarray | None
    ntk: np.ndarray | None
    nngp_diag: np.ndarray | None = None
    batch_n_eff: np.ndarray | None = None
    readout: str = "mean"
    nngp_se: np.ndarray | None = None

