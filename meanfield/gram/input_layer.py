"""The input layer of :func:`meanfield.kernels` on rows of features: h^1 = W x + b, and its exact gap.

Shared by the pair walk (:mod:`meanfield.gram.pair_walk`) and the batch walk (:mod:`meanfield.gram.batch`):
K^1(x, x') = sigma_w^2 x.x'/d + sigma_b^2 in both parameterisations, Theta^1 = K^1 ('ntk') or
x.x' + 1 ('standard'), identical inputs pinned to the diagonal (module notes of :mod:`meanfield.gram`).
"""
from __future__ import annotations

import numpy as np

from .pair_maps import _NEAR, _cached, _compile_layers, _full, _input_gap, _naive_gap


def feature_rows(name, x):
    """``x`` as a float64 array (n, d) of inputs (n, d >= 1, finite), else ValueError naming ``name``."""
    a = np.asarray(x, dtype=np.float64) if x is not None else None
    if a is None or a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{name} must be a 2-d array of shape (n, d) with n, d >= 1, got "
                         f"{'None' if x is None else np.shape(x)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must contain finite numbers only")
    return a


class Pins:
    """Identical inputs held to the diagonal map, layer after layer.

    Identical inputs have correlation exactly 1 at every depth; in the chaotic phase that fixed point is
    unstable, so a rounding difference between C[a, b] and the diagonal map would grow to O(1).
    ``rows, cols``: the pairs (a, b) with x1[a] == x2[b]; ``lower``: the lower triangle when x2 is x1.
    """

    def __init__(self, a, b, same):
        _, ids = np.unique(np.vstack([a, b]), axis=0, return_inverse=True)
        ids = ids.ravel()
        self.rows, self.cols = np.nonzero(ids[:a.shape[0], None] == ids[None, a.shape[0]:])
        self.lower = np.tril_indices(a.shape[0], -1) if same else None

    def __call__(self, M, Ma):
        """M (n1, n2) with its identical pairs set from the diagonal Ma (n1,), in place; M returned."""
        M[self.rows, self.cols] = Ma[self.rows]
        if self.lower is not None:
            # a map symmetric in (K1, K2) can still round differently when they are swapped (a product
            # of three factors is not associative in float64): keep the upper triangle's value for both
            M[self.lower] = M.T[self.lower]
        return M


class InputLayer:
    """The Gram matrices after the input layer for rows a (n1, d), b (n2, d) (b is a when ``same``).

    ``C`` (n1, n2) the NNGP, ``T`` the NTK, ``Ka, Kb`` and ``Ta, Tb`` their diagonals K(a, a), K(b, b);
    ``pin`` the :class:`Pins` of the pair of input sets.
    """

    def __init__(self, a, b, same, sw, sb, parameterization):
        d = a.shape[1]
        self.a, self.b, self.d = a, b, d
        self.dot = dot = a @ b.T
        self.da, self.db = da, db = np.einsum("ij,ij->i", a, a), np.einsum("ij,ij->i", b, b)
        C = sw**2 * dot / d + sb**2
        Ka, Kb = sw**2 * da / d + sb**2, sw**2 * db / d + sb**2
        if parameterization == "ntk":
            T, Ta, Tb = C.copy(), Ka.copy(), Kb.copy()
        else:
            T, Ta, Tb = dot + 1.0, da + 1.0, db + 1.0
        self.pin = Pins(a, b, same)
        self.C, self.T = self.pin(C, Ka), self.pin(np.array(T), Ta)
        self.Ka, self.Kb, self.Ta, self.Tb = Ka, Kb, Ta, Tb

    def close_pairs(self):
        """The pairs, identical ones excluded, whose rounded gap 1 - rho^2 is below 2 _NEAR (bool, (n1, n2))."""
        with np.errstate(all="ignore"):
            close = _naive_gap(self.Ka[:, None], self.Kb[None, :], self.C) < 2 * _NEAR
        close[self.pin.rows, self.pin.cols] = False
        return close

    def gap(self, sw, sb, n_width, parameterization):
        """The pairs' gap 1 - rho^2 after the input layer, exact from the rows as given (n1, n2).

        The input Dense layer's own gap rule (``gap.sum_gap``) applied to (|x|^2, |x'|^2, x.x') / d
        and their exact gap (``pair_maps._input_gap``).
        """
        from ..layers import Dense

        da, db, dot, d = self.da, self.db, self.dot, self.d
        f_in = _cached(_compile_layers, (Dense(),), (), parameterization, False, False, True)
        with np.errstate(all="ignore"):
            gap = _full(f_in(da[:, None] / d, db[None, :] / d, dot / d, 0.0, _input_gap(self.a, self.b, dot, da, db),
                             sw, sb, n_width)[-1], self.C.shape)
            # a zero row (h = b) has no angle; its pair is not near-parallel either: the rounded gap is exact enough
            zero = (da[:, None] == 0) | (db[None, :] == 0)
            gap[zero] = _naive_gap(self.Ka[:, None], self.Kb[None, :], self.C)[zero]
        return gap
