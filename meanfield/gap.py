"""The gap 1 - rho^2 of a pair of inputs, carried without cancellation.

Near rho = +-1 the rounded second moments know rho only to ~1e-16 absolute,
while the arc-cosine kernels depend on theta = arccos(rho) ~ sqrt(2 (1 - rho)).
The Gram-matrix rules therefore carry the gap s = 1 - rho^2 itself and map it
with the forms below (docs/gram.md, "Numerics"). The placeholders are sympy
functions that the code generators print by name (``_mf_one_minus``, ...);
their numpy forms live with the Gram-matrix code (:mod:`meanfield.gram`).
"""
from __future__ import annotations

import sympy as sp

__all__ = ["one_minus", "one_minus_product", "positive", "sum_gap"]

#: 1 - r for a correlation r whose exact gap s = 1 - r^2 is known: s / (1 + r) for r > 0 (no cancellation
#: near r = 1), 1 - r otherwise (numpy: meanfield.gram). Used by the Gram-matrix rules that carry the gap.
one_minus = sp.Function("_mf_one_minus")
#: one_minus_product(ra, sa, rb, sb) = 1 - ra rb from the two gaps: (1 - |ra|) + |ra| (1 - |rb|) when ra rb > 0
#: (1 - |r| = s / (1 + |r|)), 1 - ra rb otherwise (numpy: meanfield.gram).
one_minus_product = sp.Function("_mf_one_minus2")
#: positive(r, a, b) = a where r > 0, else b (numpy.where; meanfield.gram)
positive = sp.Function("_mf_positive")


def sum_gap(A1, A2, rho_a, gap_a, B1, B2, rho_b, gap_b, skew=None):
    r"""The gap 1 - rho^2 of the sum of two independent pair states A + B, without cancellation.

    det(A + B) = det A + det B + (A1 B2 + A2 B1 - 2 A12 B12) for 2 x 2 second-moment matrices; per
    O1 O2 (O_i = A_i + B_i), with a_i = A_i / O_i, b_i = B_i / O_i,

        gap = a1 a2 gap_a + b1 b2 gap_b + (sqrt(a1 b2) - sqrt(b1 a2))^2 + 2 sqrt(a1 a2 b1 b2) (1 - rho_a rho_b),

    every term >= 0, and 1 - rho_a rho_b = (1 - |rho_a|) + |rho_a| (1 - |rho_b|) from the gaps when
    rho_a rho_b > 0. A Dense layer is sigma_w^2 K plus the bias sigma_b^2 (rho_b = 1, gap_b = 0), a
    residual the branch plus mu^2 times the skip.

    ``skew``: A1 B2 - A2 B1 where the caller has it without cancellation (GELU's two parts, whose ratio
    B/A barely changes with the norm at large K); (sqrt(a1 b2) - sqrt(b1 a2))^2 is then taken as
    (a1 b2 - a2 b1)^2 / (sqrt(a1 b2) + sqrt(b1 a2))^2.
    """
    O1, O2 = A1 + B1, A2 + B2
    a1, a2, b1, b2 = A1 / O1, A2 / O2, B1 / O1, B2 / O2
    cross = one_minus(rho_a, gap_a) if (rho_b, gap_b) == (1, 0) else one_minus_product(rho_a, gap_a, rho_b, gap_b)
    # square roots per input (sqrt(a1) sqrt(b2), not sqrt(a1 b2)): vectors, not (n1, n2) arrays, over a Gram matrix
    r1, r2, t1, t2 = sp.sqrt(a1), sp.sqrt(a2), sp.sqrt(b1), sp.sqrt(b2)
    spread = (r1 * t2 - t1 * r2) ** 2 if skew is None else (skew / (O1 * O2)) ** 2 / (r1 * t2 + t1 * r2) ** 2
    return a1 * a2 * gap_a + b1 * b2 * gap_b + spread + 2 * r1 * r2 * t1 * t2 * cross
