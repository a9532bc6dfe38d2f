"""Monte-Carlo verification of the theory on real torch networks (needs the ``verify`` extra).

Importing this subpackage imports torch; ``import meanfield`` does not. The
torch realisations and the tools a user applies to a real model live in
:mod:`meanfield.torch`; this subpackage measures and compares:

- :func:`monte_carlo`, :func:`phase_diagram`: K^l, J^{l,l+1}, J^{l0,l} of
  networks realised from a spec (``meanfield.torch.networks``), batched over
  initialisations, on CUDA when available.
- :func:`monte_carlo_module`: K^l and J^{1,l} on a user's own module.
- :func:`run_suite`: the verification suite (``python -m meanfield.verification``),
  its case lists shipped as package data.
- :func:`autoinit_sweep`: AutoInit over a (sigma_w, lr) grid (the AutoInit paper's Fig. 1).
- ``client=`` (a ``dask.distributed.Client``) on :func:`phase_diagram`,
  :func:`run_suite` and :func:`autoinit_sweep` runs them on a Dask cluster
  with the same numbers (:mod:`.distributed`).

For convenience the user tools of :mod:`meanfield.torch` are importable from
here too, under the names they always had: :func:`from_torch`,
:func:`initialise_`, :func:`autoinit` (with :func:`measure_blocks`,
:func:`apjn_vs_batch_size` and the scale files), :func:`hutchinson_apjn`,
:func:`exact_apjn`, and the models :class:`ResMLP`, :class:`MLPMixer`,
:class:`VGG`.
"""
from .montecarlo import MonteCarloResult, PhaseDiagramResult, monte_carlo, phase_diagram
from .distributed import AutoInitSweep, autoinit_sweep

# the user tools of meanfield.torch, under the names they always had here
from ..torch.autoinit import (AutoInitError, AutoInitReport, BatchSizeScan, Measurement, apjn_vs_batch_size,
                              apply_scales, autoinit, find_blocks, load_scales, save_scales)
from ..torch.autoinit import measure as measure_blocks
from ..torch.estimators import APJNEstimate, batch_statistics, exact_apjn, hutchinson_apjn, jvp, mean_se
from ..torch.from_torch import ModuleMonteCarlo, from_torch, initialise_, monte_carlo_module
from ..torch.models import MLPMixer, ResMLP, VGG, mixer_s16, resmlp_s12, vgg19_bn

__all__ = [
    "APJNEstimate",
    "AutoInitError",
    "AutoInitSweep",
    "AutoInitReport",
    "BatchSizeScan",
    "MLPMixer",
    "Measurement",
    "ResMLP",
    "VGG",
    "apjn_vs_batch_size",
    "apply_scales",
    "autoinit",
    "autoinit_sweep",
    "find_blocks",
    "from_torch",
    "initialise_",
    "ModuleMonteCarlo",
    "monte_carlo_module",
    "load_scales",
    "measure_blocks",
    "mixer_s16",
    "resmlp_s12",
    "save_scales",
    "vgg19_bn",
    "MonteCarloResult",
    "PhaseDiagramResult",
    "batch_statistics",
    "exact_apjn",
    "hutchinson_apjn",
    "jvp",
    "mean_se",
    "monte_carlo",
    "phase_diagram",
    "run_suite",
]


def __getattr__(name):  # the suite pulls in matplotlib/tqdm: load it on first use
    if name == "run_suite":
        from .suite import run_suite

        return run_suite
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
