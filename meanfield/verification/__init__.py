"""Monte-Carlo verification on real torch networks (needs the ``verify`` extra).

Importing this subpackage imports torch; ``import meanfield`` does not.

- :func:`monte_carlo`, :func:`phase_diagram`: K^l, J^{l,l+1}, J^{l0,l} of
  networks built from an :class:`~meanfield.Architecture`, batched over
  initialisations, on CUDA when available.
- :func:`from_torch` (also ``meanfield.from_torch``): a user's module read into
  the primitive tree; :func:`initialise_` draws its weights;
  :func:`monte_carlo_module` measures K^l and J^{1,l} on that module.
- :func:`hutchinson_apjn`, :func:`exact_apjn`: APJN of any torch function.
- :func:`run_suite`: the verification suite (``python -m meanfield.verification``).
- :func:`autoinit_sweep`: AutoInit over a (sigma_w, lr) grid (the AutoInit paper's Fig. 1).
- ``client=`` (a ``dask.distributed.Client``) on :func:`phase_diagram`,
  :func:`run_suite` and :func:`autoinit_sweep` runs them on a Dask cluster
  with the same numbers (:mod:`.distributed`).
- :func:`autoinit`: tune any torch model to criticality (AutoInit paper);
  :func:`measure_blocks`, :func:`apjn_vs_batch_size`, scale persistence.
- :class:`ResMLP`, :class:`MLPMixer`, :class:`VGG` (``resmlp_s12``,
  ``mixer_s16``, ``vgg19_bn``): the models of the examples, in plain torch.
"""
from .estimators import APJNEstimate, batch_statistics, exact_apjn, hutchinson_apjn, jvp, mean_se
from .montecarlo import MonteCarloResult, PhaseDiagramResult, monte_carlo, phase_diagram
from .autoinit import (AutoInitError, AutoInitReport, BatchSizeScan, Measurement, apjn_vs_batch_size,
                       apply_scales, autoinit, find_blocks, load_scales, save_scales)
from .autoinit import measure as measure_blocks
from .distributed import AutoInitSweep, autoinit_sweep
from .models import MLPMixer, ResMLP, VGG, mixer_s16, resmlp_s12, vgg19_bn
from .from_torch import ModuleMonteCarlo, from_torch, initialise_, monte_carlo_module

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
