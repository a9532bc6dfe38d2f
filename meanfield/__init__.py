"""meanfield: mean-field theory of deep-network initialisation.

Symbolic recursions for the NNGP kernel and the partial-Jacobian factor,
numeric critical lines, points and exponents, and (in the optional
``meanfield.verification`` subpackage, which needs torch) Monte-Carlo checks
on real networks and AutoInit. ``import meanfield`` never imports torch.
"""
from .activations import Activation, activation, available_activations
from .calculus import Architecture, as_architecture
from .symbolic import Recursion, recursion
from . import symbols
# numeric solvers: numba is imported (and kernels compiled) on first use only
from .solvers import *  # noqa: F401,F403
from .solvers import __all__ as _solver_names

__version__ = "0.1.0"

__all__ = [
    "Activation",
    "Architecture",
    "Recursion",
    "activation",
    "as_architecture",
    "available_activations",
    "recursion",
    "symbols",
]
__all__ += list(_solver_names)

#: submodules loaded on first attribute access (``mf.shaping.tat_transform``):
#: shaping and scaling are pure maths; verification imports torch.
_LAZY_SUBMODULES = ("shaping", "scaling", "verification")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'meanfield' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
