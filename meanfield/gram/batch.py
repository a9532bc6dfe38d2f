"""BatchNorm's Gram matrices: one block applied to the (n, n) matrices of a whole batch.

Between BatchNorms the pair maps of :mod:`meanfield.gram.pair_maps` act entry by entry; at each
BatchNorm ``BatchNorm.gram_batch`` applies the large-batch limit (module notes of :mod:`meanfield.gram`).
"""
from __future__ import annotations

import numpy as np

from .pair_maps import (_NEAR, _cached, _compile_combine, _compile_combine_gap, _compile_layers, _full, _naive_gap,
                        _one_minus, _values)


def _couples(node) -> bool:
    from ..layers import BatchNorm

    return any(isinstance(p, BatchNorm) for p in node.primitives())


class _BatchWalk:
    """One block applied to the (n, n) Gram matrices of a whole batch (trees with BatchNorm).

    The tree drives it: runs of per-pair primitives go through their compiled
    pair map entry by entry (the diagonal of the matrix is K1, K2), a
    BatchNorm through ``BatchNorm.gram_batch`` on the whole matrix, a
    Residual around a BatchNorm through ``Residual.combine``.
    """

    def __init__(self, vals, parameterization, with_ntk, sw, sb, n_width):
        self.vals, self.param, self.ntk = vals, parameterization, with_ntk
        self.args = (sw, sb, n_width)
        self.n_eff = []     # the batch's effective size at every BatchNorm passed, in order
        # the gap 1 - rho^2 of every pair, carried exactly (None: not carried, the pairs use (K1, K2, K12) alone);
        # set by kernels() when the batch holds near-(anti)parallel pairs
        self.S = None

    def _zero(self, T):
        return T if self.ntk else np.zeros(())

    def pair(self, layers, K, T):
        f = _cached(_compile_layers, tuple(layers), self.vals, self.param, self.ntk, True)
        d = np.diag(K).copy()
        outs = f(d[:, None], d[None, :], K, self._zero(T), *self.args)
        Kn, Tn = _full(outs[0], K.shape), (_full(outs[1], K.shape) if self.ntk else None)
        if self.S is not None:
            g = _cached(_compile_layers, tuple(layers), self.vals, self.param, self.ntk, True, True)
            if not g.carries_gap:
                self.S = None
            else:
                # the near pairs through the map that carries the gap, K12 from the gap (as in kernels())
                # (on those entries only: the gap map is the larger expression)
                i, j = np.nonzero(self.S < _NEAR)
                gaps = self.S[i, j]
                Cs = np.copysign(np.sqrt(d[i]) * np.sqrt(d[j]) * np.sqrt(1 - gaps), K[i, j])
                o = g(d[i], d[j], Cs, T[i, j] if self.ntk else np.zeros(()), gaps, *self.args)
                Kn[i, j] = o[0]
                if self.ntk:
                    Tn[i, j] = o[1]
                dn = np.diag(Kn).copy()
                self.S = _naive_gap(dn[:, None], dn[None, :], Kn)
                self.S[i, j] = np.maximum(_full(o[-1], i.shape), 0.0)
        return Kn, Tn

    def _batch_norm_gap(self, K, Kn):
        """The gap after BatchNorm (K -> Kn = s P K P), without cancellation for the near pairs.

        Centring leaves y_a - y_b = h_a - h_b, so the squared distance D = E(h_a - h_b)^2 is only rescaled,
        D' = s D, and 1 - rho' = (D' - (sqrt K'_a - sqrt K'_b)^2) / (2 sqrt(K'_a K'_b)), where
        D = (sqrt K_a - sqrt K_b)^2 + 2 sqrt(K_a K_b) (1 - rho) comes from the carried gap; the norms'
        differences enter squared, so their rounding moves 1 - rho' by ~1e-16 / sqrt(gap) relative and
        theta' by ~1e-16 absolute.
        """
        d, dn = np.diag(K).copy(), np.diag(Kn).copy()
        r, rn = np.sqrt(d), np.sqrt(dn)
        # s = n / tr(PKP) from the diagonals (tr Kn = n)
        s = np.sum(dn) / (np.sum(d) - K.sum() / K.shape[0])
        S = _naive_gap(dn[:, None], dn[None, :], Kn)
        # the pairs near parallel after the centring (the others keep the gap of their rounded kernels)
        i, j = np.nonzero(S < 2 * _NEAR)
        with np.errstate(all="ignore"):
            rho = K[i, j] / (r[i] * r[j])
            om = _one_minus(rho, self.S[i, j])
            D = ((d[i] - d[j]) / (r[i] + r[j])) ** 2 + 2 * (r[i] * r[j]) * om
            omn = (s * D - ((dn[i] - dn[j]) / (rn[i] + rn[j])) ** 2) / (2 * rn[i] * rn[j])
            exact = np.clip(omn * (2 - omn), 0.0, 1.0)
        ok = np.isfinite(exact) & (omn < 0.5)
        S[i[ok], j[ok]] = exact[ok]
        np.fill_diagonal(S, 0.0)
        return S

    def walk(self, node, K, T):
        from ..layers import BatchNorm, Chain, Residual, short

        if not _couples(node):
            return self.pair((node,), K, T)
        if isinstance(node, BatchNorm):
            K0 = K
            K, T = node.gram_batch(K, T if self.ntk else None)
            # n_eff = tr(PKP)^2 / tr((PKP)^2): the large-batch limit's error is O(1 / n_eff) per BatchNorm
            self.n_eff.append(np.trace(K) ** 2 / np.sum(K * K))
            if self.S is not None:
                self.S = self._batch_norm_gap(K0, K)
                # K12 of the near pairs from the gap, so that K and S describe one pair
                near = self.S < _NEAR
                if near.any():
                    dn = np.diag(K).copy()
                    root = np.multiply.outer(np.sqrt(dn), np.sqrt(dn))
                    K = np.where(near, np.copysign(root * np.sqrt(1 - self.S), K), K)
            return K, T
        if isinstance(node, Chain):
            run = []
            for p in node.layers:
                if _couples(p):
                    if run:
                        K, T = self.pair(run, K, T)
                        run = []
                    K, T = self.walk(p, K, T)
                else:
                    run.append(p)
            return self.pair(run, K, T) if run else (K, T)
        if isinstance(node, Residual):
            if node.shortcut is not None:
                # the skip is the shortcut's map of the batch; the gap of the sum is not carried through two
                # walks (S -> None: near-parallel pairs then come from the K's, as without a gap)
                Kb, Tb = self.walk(node.branch, K, T)
                K, T = self.walk(node.shortcut, K, T)
                self.S = None
                S0 = None
            else:
                S0 = self.S
                Kb, Tb = self.walk(node.branch, K, T)
            if self.S is not None and S0 is not None:
                g = _cached(_compile_combine_gap, node, self.vals)
                d, db = np.diag(K).copy(), np.diag(Kb).copy()
                with np.errstate(all="ignore"):
                    self.S = np.clip(_full(g(d[:, None], d[None, :], K, S0, db[:, None], db[None, :], Kb, self.S)[0],
                                           K.shape), 0.0, 1.0)
                np.fill_diagonal(self.S, 0.0)
            else:
                self.S = None
            f = _cached(_compile_combine, node, self.vals, self.ntk)
            d, db = np.diag(K).copy(), np.diag(Kb).copy()
            outs = f(d[:, None], d[None, :], K, self._zero(T), db[:, None], db[None, :], Kb, self._zero(Tb))
            return _full(outs[0], K.shape), (_full(outs[1], K.shape) if self.ntk else None)
        raise ValueError(f"{short(node)} holds a batch_norm() and has no batch-level Gram rule")


def batch_layers(spec, parameterization, want_ntk, sw, sb, n_width, inp, depth, per_layer):
    """depth - 1 blocks of a tree with BatchNorm on the batch ``inp`` (the ``InputLayer`` of x1 with itself).

    Returns (C, T, K, Ta, diag, n_eff): the batch's (n, n) NNGP and NTK (T unused when not ``want_ntk``),
    their diagonals K, Ta (n,), the per-layer diagonals (a list, or None unless ``per_layer``) and the batch's
    effective size at every block (the smallest of its BatchNorms').
    """
    walk = _BatchWalk(_values(spec), parameterization, want_ntk, sw, sb, n_width)
    block = spec.block_spec()
    pin = inp.pin
    # the batch walk carries the gap of every pair when some are near (anti)parallel (_BatchWalk.S)
    close = inp.close_pairs()
    np.fill_diagonal(close, False)
    if close.any():
        S0 = inp.gap(sw, sb, n_width, parameterization)
        S0[pin.rows, pin.cols] = 0.0       # identical rows: parallel
        walk.S = np.clip(S0, 0.0, 1.0)
    C, T, K, Ta = inp.C, inp.T, inp.Ka, inp.Ta
    diag = [K.copy()] if per_layer else None
    n_eff = []
    with np.errstate(all="ignore"):
        for _ in range(depth - 1):
            # full (n, n) matrices, the diagonal carries K1, K2
            walk.n_eff.clear()
            C, T = walk.walk(block, C, T if want_ntk else None)
            n_eff.append(min(walk.n_eff))
            K = np.diag(C).copy()
            C = pin(C, K)
            if want_ntk:
                Ta = np.diag(T).copy()
                T = pin(T, Ta)
            if per_layer:
                diag.append(K.copy())
    return C, T, K, Ta, diag, n_eff
