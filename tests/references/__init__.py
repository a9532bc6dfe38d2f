"""Independent references for the tests: one place, one import path (``import references as R``).

Nothing here is taken from meanfield; every value comes from a route of its own (mpmath
quadrature of the activations coded by hand, closed forms written out from the papers, mpmath
recursions and mp.findroot solves). Tests import these instead of writing them again; a test
module keeps locally only what is particular to it.

* :mod:`.gaussian`: npdf, ncdf; ``expect`` (E[f(h)], h ~ N(0, K), split at kinks);
  ``expect_conditional`` (E[f(u) g(v)] through E[g(v) | u]); ``expect_smooth_pair`` (E[a(u) b(v)]
  by the 2-D trapezoid rule for smooth a, b; the conftest fixture ``mp_smooth2``).
* :mod:`.closed_forms`: hand-coded activations (gelu .. d4gelu, derf), erf's moments
  (Williams 1997), the arc-cosine kernels (Cho & Saul 2009), the two-point GELU form
  (Tsuchida et al. 2021), one-point conditional means, erf's and GELU's critical lines
  (paper eqs. 126/142, 157-158), chi_J* of the zero-padded LayerNorm ResNet (derived by hand,
  docs/gram.md), the tied-attention walk on tokens of equal norms and overlaps and one 1/sqrt(d) attention
  layer on two tokens (derived by hand).
* :mod:`.solves`: fixed points, critical lines and points by mp.findroot.
* :mod:`.gram_pair`: the 50-digit pair recursion (K, NTK) of the MLP/ResNet/LayerNorm blocks.
* :mod:`.gram_batch_tokens`: the BatchNorm walk over a batch and the ResMLP/Mixer token blocks.
* :mod:`.gram_small_K`: tensor Gauss-Hermite two-point moments and the Gram recursion at small K.

``close(a, b, rel, abs_)`` compares a result with a reference (real parts of mpmath numbers).

The gram_* modules are imported by name (``import references.gram_pair as G``); the rest is
re-exported here.
"""
from .closed_forms import (d2gelu, d3gelu, d4gelu, derf, dgelu, erf_cond, erf_critical_sigma_b, erf_dphi2,
                           erf_one, erf_pair, erf_phi2, gelu, gelu_cond, gelu_critical_line, gelu_one, gelu_pair,
                           ln_resnet_chi_star, relu_cond, scale_invariant_pair, sqrt_attention_two_tokens,
                           tied_attention_walk)
from .gaussian import expect, expect_conditional, expect_smooth_pair, ncdf, npdf
from .solves import (WIDE_CUTS, erf_critical_line, gelu_critical_point, gelu_expansion, gelu_maps,
                     mlp_fixed_point)



def close(a, b, rel=1e-10, abs_=1e-12) -> bool:
    """|a - b| <= rel |b| + abs_, on the real parts (a result against an mpmath reference)."""
    import mpmath as mp

    a, b = float(mp.re(a)), float(mp.re(b))
    return abs(a - b) <= rel * abs(b) + abs_


__all__ = [
    "close",
    "WIDE_CUTS", "d2gelu", "d3gelu", "d4gelu", "derf", "dgelu", "erf_cond", "erf_critical_line",
    "erf_critical_sigma_b", "erf_dphi2", "erf_one", "erf_pair", "erf_phi2", "expect", "expect_conditional",
    "expect_smooth_pair", "gelu", "gelu_cond", "gelu_critical_line", "gelu_critical_point", "gelu_expansion",
    "gelu_maps", "gelu_one", "gelu_pair", "ln_resnet_chi_star", "mlp_fixed_point", "ncdf", "npdf", "relu_cond",
    "scale_invariant_pair",
]
