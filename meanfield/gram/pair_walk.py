"""The Gram matrices of trees without BatchNorm or tokens: the block's pair map applied to (n1, n2) arrays.

Every pair goes through the compiled map of (K1, K2, K12, Theta12) layer after layer; the pairs with
1 - rho^2 < ``_NEAR`` go through the map that also carries their gap exactly, with K12 taken from the gap
(module notes of :mod:`meanfield.gram`, Numerics).
"""
from __future__ import annotations

import numpy as np

from .pair_maps import _NEAR, _compiled, _full, _naive_gap


class PairWalk:
    """The (n1, n2) Gram matrices of one block's pair map, from the input layer to h^depth.

    State, as :class:`~meanfield.gram.input_layer.InputLayer`: ``C, T`` (n1, n2), ``Ka, Kb, Ta, Tb`` the
    diagonals. The near-(anti)parallel pairs: ``near`` (bool, (n1, n2)), their gap ``S`` (meaningful on
    ``near`` only), ``fg`` the gap-carrying map (None: not compiled, or the block has none).
    """

    def __init__(self, spec, parameterization, want_ntk, sw, sb, n_width, inp, same):
        self.spec, self.param, self.ntk, self.same = spec, parameterization, want_ntk, same
        self.args = (sw, sb, n_width)
        self.f = _compiled(spec, parameterization, want_ntk)
        self.C, self.T, self.Ka, self.Kb, self.Ta, self.Tb = inp.C, inp.T, inp.Ka, inp.Kb, inp.Ta, inp.Tb
        self.pin = inp.pin
        self.zero_T = np.zeros(())
        self.buf = None
        # the gap map is compiled on the first near pair only: seconds for GELU's, and most Gram matrices have none
        self.fg, self.pending = None, True
        self.near = self.S = None
        if inp.close_pairs().any():
            self.fg, self.pending = self._gap_map(), False
        if self.fg is not None:
            S = inp.gap(sw, sb, n_width, parameterization)
            S[self.pin.rows, self.pin.cols] = 1.0
            self.S = np.maximum(S, 0.0)
            self.near = self.S < _NEAR

    def _gap_map(self):
        g = _compiled(self.spec, self.param, self.ntk, gap=True)
        return g if g.carries_gap else None

    def run(self, depth, per_layer):
        """depth - 1 blocks; the diagonal K^l(x1, x1) of every layer (a list) when ``per_layer``, else None."""
        diag = [self.Ka.copy()] if per_layer else None
        with np.errstate(all="ignore"):
            for _ in range(depth - 1):
                self.step()
                if per_layer:
                    diag.append(self.Ka.copy())
        return diag

    def step(self):
        """One block: every pair through the pair map, the near ones through the gap map."""
        n_near, Cn, Tn, da_out, db_out, kept = self._maps()
        shape_a, shape_b = self.Ka.shape, self.Kb.shape
        self.Ka, self.Kb = _full(da_out[0], shape_a), _full(db_out[0], shape_b)
        self.C = self.pin(Cn, self.Ka)
        if self.ntk:
            self.Ta, self.Tb = _full(da_out[1], shape_a), _full(db_out[1], shape_b)
            self.T = self.pin(Tn, self.Ta)
        self._track(n_near, kept)

    def _maps(self):
        """The block's maps on the current state: (n_near, Cn, Tn, the diagonals' outputs da_out, db_out, kept)."""
        f, args, ntk, zero_T = self.f, self.args, self.ntk, self.zero_T
        C, T, Ka, Kb, Ta, Tb = self.C, self.T, self.Ka, self.Kb, self.Ta, self.Tb
        n_near = np.count_nonzero(self.near) if self.near is not None else 0
        full = n_near > C.size // 5
        Cn = Tn = kept = None
        if not full:
            outs = f(Ka[:, None], Kb[None, :], C, T if ntk else zero_T, *args)
            Cn, Tn = _full(outs[0], C.shape), (_full(outs[1], C.shape) if ntk else None)
        da_out = f(Ka, Ka, Ka, Ta if ntk else zero_T, *args)
        db_out = da_out if self.same else f(Kb, Kb, Kb, Tb if ntk else zero_T, *args)
        if n_near:
            Cn, Tn, kept = self._near_step(full, Cn, Tn)
        return n_near, Cn, Tn, da_out, db_out, kept

    def _near_step(self, full, Cn, Tn):
        """The near-(anti)parallel pairs through the map that carries the gap; (Cn, Tn, kept), kept the pairs
        still near.

        K12 is taken from the gap, K12 = +-sqrt(K1 K2 (1 - gap)): the rules use both (rho and sqrt(gap) in
        atan2), and a rounding of rho that disagrees with the exact gap is amplified by the map's slope in rho
        alone (1.4 per block for ReLU + ln_post: 3e-12 at depth 32).
        """
        fg, args, ntk, zero_T = self.fg, self.args, self.ntk, self.zero_T
        C, T, Ka, Kb, near = self.C, self.T, self.Ka, self.Kb, self.near
        if full:
            # most pairs are near (deep ordered nets, near-duplicate inputs): the gap map on the whole
            # matrix, the others entering with the gap of their rounded kernels
            root = np.multiply.outer(np.sqrt(Ka), np.sqrt(Kb))
            S = np.where(near, self.S, _naive_gap(Ka[:, None], Kb[None, :], C))
            Cs = np.where(near, np.copysign(root * np.sqrt(1 - S), C), C)
            o = fg(Ka[:, None], Kb[None, :], Cs, T if ntk else zero_T, S, *args)
            Cn, Tn = _full(o[0], C.shape), (_full(o[1], C.shape) if ntk else None)
            self.S = _full(o[-1], C.shape)
            return Cn, Tn, self.S < _NEAR
        S = self.S
        idx = np.flatnonzero(near)
        i, j = np.divmod(idx, C.shape[1])
        gaps = S.ravel()[idx]
        Cs = np.copysign(np.sqrt(Ka[i]) * np.sqrt(Kb[j]) * np.sqrt(1 - gaps), C.ravel()[idx])
        o = fg(Ka[i], Kb[j], Cs, T.ravel()[idx] if ntk else zero_T, gaps, *args)
        Cn.ravel()[idx] = o[0]
        if ntk:
            Tn.ravel()[idx] = o[1]
        gaps = _full(o[-1], idx.shape)
        S.ravel()[idx] = gaps
        kept = np.zeros(C.shape, dtype=bool)
        kept.ravel()[idx[gaps < _NEAR]] = True
        return Cn, Tn, kept

    def _track(self, n_near, kept):
        """The pairs that came within the gap (not identical ones) join ``near``, entering with the gap of the
        rounded kernels (theta right to ~1e-16 / theta absolute: ~3e-15 there); tracked ones keep theirs."""
        if self.fg is None and not self.pending:
            return
        C, Ka, Kb, rows, cols = self.C, self.Ka, self.Kb, self.pin.rows, self.pin.cols
        # |C| / (sqrt(Ka) sqrt(Kb) sqrt(1 - _NEAR)) > 1, in one reused buffer (a few ms per layer at n = 1000)
        if self.buf is None:
            self.buf = np.empty(C.shape)
        buf = self.buf
        np.abs(C, out=buf)
        buf *= (1 / (np.sqrt(Ka) * np.sqrt(1 - _NEAR)))[:, None]
        buf *= (1 / np.sqrt(Kb))[None, :]
        cand = buf > 1.0
        cand[rows, cols] = False
        if self.pending and cand.any():
            self.fg, self.pending = self._gap_map(), False
        if self.fg is None:
            return
        if self.S is None:
            self.S = np.ones(C.shape)
        if n_near:
            new = cand & ~kept
            self.near = cand | kept
            self.near[rows, cols] = False
        else:
            new = self.near = cand
        if new.any():
            i, j = np.nonzero(new)
            self.S[i, j] = _naive_gap(Ka[i], Kb[j], C[i, j])
