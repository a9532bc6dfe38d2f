"""meanfield: mean-field theory of deep-network initialisation.

Symbolic recursions for the NNGP kernel and the partial-Jacobian factor,
numeric critical lines, points and exponents, and (in the optional
``meanfield.verification`` subpackage, which needs torch) Monte-Carlo checks
on real networks and AutoInit. ``import meanfield`` never imports torch, and
imports sympy, numpy and the rest only when a name that needs them is first used.
"""
# Everything below is imported on first use (PEP 562 ``__getattr__``): sympy, numpy and the
# solvers load when a name that needs them is first touched, so ``import meanfield`` and the
# command line's ``--help``/``--version`` start without them.

#: public name -> the submodule that defines it (the solvers' names come from meanfield.solvers.__all__)
_EXPORTS = {
    **dict.fromkeys(("Activation", "activation", "available_activations"), "activations"),
    **dict.fromkeys(("Architecture", "as_architecture", "Network", "from_json", "to_json"), "calculus"),
    # the composition API: one module per primitive family (meanfield/layers/)
    **dict.fromkeys(("act", "attention", "avg_pool", "batch_norm", "conv", "dense", "group_norm", "layer_norm", "mixer", "mlp", "resmlp", "residual",
                     "resnet_v2", "rms_norm", "scale", "serial", "transformer"), "layers"),
    **dict.fromkeys(("Recursion", "recursion"), "symbolic"),
    # NNGP / NTK Gram matrices on real inputs (numpy; the recursion is compiled on first use)
    **dict.fromkeys(("Kernels", "kernels"), "gram"),
}

__version__ = "0.1.0"

_OWN_NAMES = [
    "Activation",
    "Architecture",
    "Network",
    "Kernels",
    "Recursion",
    "act",
    "attention",
    "avg_pool",
    "batch_norm",
    "conv",
    "dense",
    "from_json",
    "from_torch",
    "kernels",
    "layer_norm",
    "mixer",
    "mlp",
    "resmlp",
    "residual",
    "resnet_v2",
    "rms_norm",
    "group_norm",
    "scale",
    "serial",
    "transformer",
    "to_json",
    "activation",
    "as_architecture",
    "available_activations",
    "recursion",
    "symbols",
]

#: submodules loaded on first attribute access (``mf.shaping.tat_transform``):
#: shaping, scaling and autoinit are pure maths; torch and verification import torch.
_LAZY_SUBMODULES = ("shaping", "scaling", "autoinit", "torch", "verification")


def from_torch(module, example_input, **kwargs):
    """The primitive tree of a torch model (imports torch): see
    :func:`meanfield.torch.from_torch.from_torch`."""
    from .torch.from_torch import from_torch as _from_torch

    return _from_torch(module, example_input, **kwargs)


def __getattr__(name):
    import importlib
    import importlib.util

    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name == "__all__":
        value = _OWN_NAMES + list(importlib.import_module(".solvers", __name__).__all__)
    elif name.startswith("__"):
        raise AttributeError(f"module 'meanfield' has no attribute {name!r}")
    elif importlib.util.find_spec(f".{name}", __name__) is not None:   # a submodule: mf.shaping, mf.symbols
        return importlib.import_module(f".{name}", __name__)
    else:
        if name.startswith("_"):   # tools probing for private hooks must not load the solvers
            raise AttributeError(f"module 'meanfield' has no attribute {name!r}")
        solvers = importlib.import_module(".solvers", __name__)   # numba itself loads on first solve
        if name not in solvers.__all__:
            raise AttributeError(f"module 'meanfield' has no attribute {name!r}")
        value = getattr(solvers, name)
    globals()[name] = value   # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__getattr__("__all__")) | set(_LAZY_SUBMODULES))
