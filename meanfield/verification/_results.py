"""The results of the Monte-Carlo runs: :class:`MonteCarloResult` (one point, every layer) and
:class:`PhaseDiagramResult` (one layer on a grid), made by :mod:`.montecarlo` and, for a grid
in shards on a Dask cluster, by :mod:`.distributed`."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._serialize import Result
from ..calculus import Architecture

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
    tokens: int | tuple
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


# A saved result names its class as module.class (Result.save), and a Dask task's result is pickled
# the same way: name the public module these classes have always been imported from, so files
# load in versions before and after this module was cut out (montecarlo re-exports both).
MonteCarloResult.__module__ = PhaseDiagramResult.__module__ = "meanfield.verification.montecarlo"


def _jsonable(a):
    a = np.asarray(a, dtype=np.float64)
    return [None if not np.isfinite(v) else float(v) for v in a.ravel()] if a.ndim <= 1 else \
        [_jsonable(row) for row in a]
