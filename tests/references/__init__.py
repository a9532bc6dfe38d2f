"""Independent references for the tests: one place, one import path (``import references as R``).

Nothing here is taken from meanfield; every value comes from a route of its own (mpmath
quadrature of the activations coded by hand, closed forms written out from the papers, mpmath
recursions and mp.findroot solves). Tests import these instead of writing them again; a test
module keeps locally only what is particular to it.

* :mod:`.gaussian`: npdf, ncdf, ``expect`` (E[f(h)], h ~ N(0, K), split at kinks), and
  ``expect_conditional`` (E[f(u) g(v)] through E[g(v) | u]).
* :mod:`.closed_forms`: hand-coded activations (gelu, dgelu, d2gelu, derf), erf's moments
  (Williams 1997), the arc-cosine kernels (Cho & Saul 2009), the two-point GELU form
  (Tsuchida et al. 2021), erf's and GELU's critical lines (paper eqs. 126/142, 157-158).
* :mod:`.solves`: fixed points, critical lines and points by mp.findroot.
* :mod:`.gram_pair`: the 50-digit pair recursion (K, NTK) of the MLP/ResNet/LayerNorm blocks.
* :mod:`.gram_batch_tokens`: the BatchNorm walk over a batch and the ResMLP/Mixer token blocks.
* :mod:`.gram_small_K`: tensor Gauss-Hermite two-point moments and the Gram recursion at small K.
* ``mp_smooth2`` (tests/conftest.py fixture): the 2-D trapezoid reference for smooth integrands.
"""
from .closed_forms import (d2gelu, d3gelu, d4gelu, derf, dgelu, erf_cond, erf_critical_sigma_b, erf_dphi2, erf_one, erf_pair, erf_phi2,
                           gelu, gelu_cond, gelu_critical_line, gelu_one, gelu_pair, relu_cond, scale_invariant_pair)
from .gaussian import expect, expect_conditional, ncdf, npdf
from .solves import (WIDE_CUTS, erf_critical_line, gelu_critical_point, gelu_expansion, gelu_maps,
                     mlp_fixed_point)

__all__ = [
    "WIDE_CUTS", "d2gelu", "d3gelu", "d4gelu", "derf", "dgelu", "erf_cond", "erf_critical_line", "erf_critical_sigma_b", "erf_dphi2", "erf_one",
    "erf_pair", "erf_phi2", "expect", "expect_conditional", "gelu", "gelu_cond", "gelu_critical_line",
    "gelu_critical_point", "gelu_expansion", "gelu_maps", "gelu_one", "gelu_pair", "mlp_fixed_point", "ncdf", "npdf", "relu_cond", "scale_invariant_pair",
]
