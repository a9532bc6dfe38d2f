"""Monte-Carlo verification on real torch networks (needs the ``verify`` extra).

Importing this subpackage imports torch; ``import meanfield`` does not.

- :func:`monte_carlo`, :func:`phase_diagram`: K^l, J^{l,l+1}, J^{l0,l} of
  networks built from an :class:`~meanfield.Architecture`, batched over
  initialisations, on CUDA when available.
- :func:`hutchinson_apjn`, :func:`exact_apjn`: APJN of any torch function.
- :func:`run_suite`: the verification suite (``python -m meanfield.verification``).
"""
from .estimators import APJNEstimate, batch_statistics, exact_apjn, hutchinson_apjn, jvp, mean_se
from .montecarlo import MonteCarloResult, PhaseDiagramResult, monte_carlo, phase_diagram

__all__ = [
    "APJNEstimate",
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
