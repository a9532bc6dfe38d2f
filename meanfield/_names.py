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

#: the functions an activation written as text may call (``--activation "x*erf(x)"``): sympy's
#: names, and abs/max/min as Python spells them (meanfield.activations.parse_activation)
EXPRESSION_FUNCTIONS = ("exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asinh", "atan", "erf",
                        "erfc", "Abs", "abs", "sign", "Heaviside", "Max", "Min", "max", "min")
#: the constants it may name
EXPRESSION_CONSTANTS = ("pi", "E")


def expression_help() -> str:
    """One line saying what an activation text may contain (error messages and ``--help``)."""
    return (f"an expression in x using numbers, + - * / ** (or ^), {', '.join(EXPRESSION_CONSTANTS)} and "
            f"{', '.join(EXPRESSION_FUNCTIONS)}")


#: extensions plot_phase_diagram writes (vector: pdf, svg, eps; raster: png)
FIGURE_FORMATS = (".pdf", ".svg", ".eps", ".png")
