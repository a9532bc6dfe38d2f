"""The menus the command line shows before anything heavy is imported.

``meanfield --help`` lists these without importing sympy or numpy (the parser
is built from them); the modules that implement them import them from here:
:data:`NORMS` and :data:`BLOCKS` (:mod:`meanfield.calculus`),
:data:`FIGURE_FORMATS` (:mod:`meanfield.plotting`). The activation registry
(:data:`meanfield.activations.ACTIVATIONS`) holds factories, so it cannot live
here; tests/test_cli.py checks that its names are :data:`ACTIVATION_NAMES`.
"""

#: the built-in activations, by name (meanfield.available_activations() before any is registered)
ACTIVATION_NAMES = ("relu", "leaky_relu", "linear", "abs", "scale_invariant", "erf", "gelu", "tanh", "silu",
                    "swish", "softplus", "gelu_tanh", "elu", "selu", "hardtanh")

#: normalisations of an MLP block (Architecture.norm)
NORMS = ("none", "ln_pre", "ln_post", "bn")

#: block types (Architecture.block)
BLOCKS = ("mlp", "resmlp", "mixer")

#: extensions plot_phase_diagram writes (vector: pdf, svg, eps; raster: png)
FIGURE_FORMATS = (".pdf", ".svg", ".eps", ".png")
