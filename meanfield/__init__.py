"""meanfield: mean-field theory of deep-network initialisation.

Symbolic recursions for the NNGP kernel and the partial-Jacobian factor,
numeric critical lines, points and exponents, and (in the optional
``meanfield.verification`` subpackage, which needs torch) Monte-Carlo checks
on real networks and AutoInit. ``import meanfield`` never imports torch.
"""
from .activations import Activation, activation, available_activations
from .calculus import Architecture, as_architecture
# the composition API: a network is a tree of primitives (docs/architecture.md)
from .calculus import (Network, act, batch_norm, dense, from_json, layer_norm, mixer, mlp, resmlp, residual,
                       rms_norm, scale, serial, to_json)
from .symbolic import Recursion, recursion
# NNGP / NTK Gram matrices on real inputs (numpy; the recursion is compiled on first use)
from .gram import Kernels, kernels
from . import symbols
# numeric solvers: numba is imported (and kernels compiled) on first use only
from .solvers import *  # noqa: F401,F403
from .solvers import __all__ as _solver_names

__version__ = "0.1.0"

__all__ = [
    "Activation",
    "Architecture",
    "Network",
    "Kernels",
    "Recursion",
    "act",
    "batch_norm",
    "dense",
    "from_json",
    "from_torch",
    "kernels",
    "layer_norm",
    "mixer",
    "mlp",
    "resmlp",
    "residual",
    "rms_norm",
    "scale",
    "serial",
    "to_json",
    "activation",
    "as_architecture",
    "available_activations",
    "recursion",
    "symbols",
]
__all__ += list(_solver_names)

#: submodules loaded on first attribute access (``mf.shaping.tat_transform``):
#: shaping, scaling and autoinit are pure maths; torch and verification import torch.
_LAZY_SUBMODULES = ("shaping", "scaling", "autoinit", "torch", "verification")


def from_torch(module, example_input, **kwargs):
    """The primitive tree of a torch model (imports torch): see
    :func:`meanfield.torch.from_torch.from_torch`."""
    from .torch.from_torch import from_torch as _from_torch

    return _from_torch(module, example_input, **kwargs)


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'meanfield' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
