r"""Two-point Gaussian moments E[f(u) g(v)] over whole Gram matrices (issue 12).

``meanfield.kernels`` needs, at every layer and for every pair of inputs,
E[phi(u) phi(v)] and E[phi'(u) phi'(v)] with (u, v) zero-mean Gaussian,
Var u = K1, Var v = K2, Cov = K12. For activations without a closed two-point
form (tanh, SiLU, softplus, ELU/SELU, user activations) the general engine of
:func:`meanfield.gaussian.expect2` nests a ~500-node rule in itself for every
entry (~0.1 s per entry and layer). The integrands here are products
f(u) g(v), and that structure gives a method whose cost per entry is a few
dozen multiply-adds.

Method: Mehler's expansion
--------------------------
With u = sqrt(K1) z1, v = sqrt(K2) z2, (z1, z2) standard normals with
correlation rho = K12 / sqrt(K1 K2), Mehler's formula (the bivariate normal
density expanded in Hermite polynomials; e.g. Kibble 1945, or
O'Donnell, *Analysis of Boolean Functions*, 11.2) gives

    E[f(u) g(v)] = sum_k rho^k a_k(K1) b_k(K2),
    a_k(K) = E[f(sqrt(K) z) h_k(z)],  b_k(K) = E[g(sqrt(K) z) h_k(z)],

h_k = He_k / sqrt(k!) the orthonormal (probabilists') Hermite polynomials.
The coefficients are one-point integrals of each input alone (n of them per
layer for n inputs: the diagonal values are shared by rows and columns), and
the Gram matrix is a Horner sum of rank-one terms, compiled with numba.

Error control
-------------
* Truncation, rigorous: by Cauchy-Schwarz and Parseval,
  |sum_{k>N} rho^k a_k b_k| <= |rho|^(N+1) sqrt(T_f(N) T_g(N)),
  T_f(N) = E[f(u)^2] - sum_{k<=N} a_k^2 (the tail of f's Hermite energy,
  computed from the same one-point rule). Each entry takes the smallest N of
  the ladder 2, 4, ..., 16, 20, ..., 32, 40, ..., kmax whose bound is below
  ``TOL`` = 1e-14 of sqrt(E[f(u)^2] E[g(v)^2]) (the Cauchy-Schwarz bound of
  the value itself), and sums its own terms (its value depends on the pair
  alone). The series is a polynomial in rho: no sqrt(1 - rho^2), no loss of
  precision for near-parallel or antiparallel inputs. An even or odd f or g
  (proved by sympy) has every other coefficient exactly 0; the sum then runs
  in rho^2.
* Coefficients: for f without breakpoints and sqrt(K) h <= 1/4, the
  trapezoid rule in z (|z| <= 13, h = 1/4, 1/8 or 1/16; exponentially
  convergent for analytic integrands); otherwise, or where it fails its test,
  the one-point engine's rule (:mod:`meanfield.quadrature_rule`:
  exp-sinh from z = 0 and the breakpoints of f, tanh-sinh between them,
  log-uniform near them, so that tanh(sqrt(K) z) is resolved at any K),
  with step 1/64 in t for k <= 128 and 1/128 for k <= 256 (first level:
  k <= 32). The even nodes form the rule of twice the step; a coefficient is
  used only where the two agree to 1e-8 of sqrt(E f^2) (the rules converge
  exponentially, so the finer rule is then at rounding level, as in the
  one-point engine; tested against mpmath at 30 digits).
* Gram matrices (K1 a column, K2 a row, K12 a matrix: what ``kernels``
  passes): the first level is summed by the compiled :func:`_gram_rows`
  (vectorised over each row; the upper triangle when symmetric).
* Entries the series does not settle, first: where f and g are asymptotically
  linear on each side (SiLU, SiLU', softplus, gelu_tanh, tanh; :class:`_Split`)
  and both conditional standard deviations are >= 1, the split
  f = b_f + r_f (b_f the piecewise-linear asymptote smoothed by N(0, 1), r_f
  analytic and exponentially localised): E[b_f b_g] in closed form (arc-cosine
  kernels of order 1 and 0 and their cross terms), E[b_f r_g] and E[r_f b_g]
  one-dimensional over r with the conditional expectation of b in closed form,
  E[r_f r_g] two-dimensional over the box where both r are nonzero, each on
  two trapezoid grids offset by half a step whose difference must be below
  ``TOL`` of sqrt(E f^2 E g^2) (:meth:`ProductMoment._split`, ~10-15 us an
  entry: node pairs +-x share their transcendental functions, erfcx from a
  table, Gaussians stepped by multiplications, nodes whose bounded
  contribution is below a quarter of the tolerance left out). Where f and g have one breakpoint, at 0, and are linear plus an
  exponential on each side (ELU, SELU, their derivatives; :class:`_ExpSplit`),
  the split is taken at the breakpoint with the kinked asymptote and
  r = A e^{-lam |h|} on each side: E[b_f b_g] closed, E[r_f(u) g(v)] and
  E[b_f(u) r_g(v)] one-dimensional with closed conditional expectations (no
  two-dimensional term), on Gauss-Kronrod panels whose edges include the
  breakpoint, the first one graded towards it where a conditional standard
  deviation or a variance is below 1 (:meth:`ProductMoment._exp_split`, ~9 us
  an entry; tried right after the first series level, whose higher levels
  rarely settle these).
  Then, for f and g without breakpoints and a
  conditional width sigma = sqrt(K2 (1 - rho^2)) <= 16, the conditional
  form E_z[f(s1 z) E_w[g(s2 rho z + sigma w)]] on an exp-sinh x trapezoid
  product rule, vectorised over the entries, each level checked against the
  rule of twice its step (:meth:`ProductMoment._conditional`); the others
  one by one with the nested engine of :func:`meanfield.gaussian.expect2`
  (its own error control); one that does not converge there is a
  ValueError, never a number.
* Identical arguments (K1 = K2 = K12, the diagonal and repeated inputs) get
  the one-point E[f(u) g(u)] on the same rule, which is also the series'
  limit at rho = 1 (sum a_k b_k + the tail), so the diagonal is pinned to the
  one-point map as ``kernels`` requires.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import sympy as sp

__all__ = ["separable_factors", "ProductMoment", "vectorise_expectations"]

#: truncation tolerance, relative to sqrt(E[f(u)^2] E[g(v)^2])
TOL = 1e-14
#: a coefficient is used where the rule and the rule of twice its step agree to this (of sqrt(E f^2))
TOL_COEFF = 1e-8
#: (largest k, step in t of the coefficients' rule): the levels tried in turn
LEVELS = ((32, 1.0 / 64), (64, 1.0 / 64), (128, 1.0 / 64), (256, 1.0 / 128))
#: the truncation orders tried (even, ascending, starting at 2: the compiled loops step |rho|^(N+1) by rho^2)
_LADDER = (2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
_EPS = np.finfo(np.float64).eps


# ---------------------------------------------------------------------------
# The one-point rule and the Hermite tables.
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _rule(zc_bytes: bytes, h0: float):
    """Nodes z, weights w (standard normal), and the weights of the rule of twice the step, for
    breakpoints zc (z = 0 and cuts / sqrt(K)): the one-point engine's base rule at step h0."""
    from .gaussian import QUAD_ES_T, QUAD_TS_T
    from .quadrature_rule import segment as seg

    zc = np.frombuffer(zc_bytes, dtype=np.float64)
    z0, w0 = seg(zc, 0, h0, QUAD_ES_T[0], QUAD_ES_T[1], QUAD_TS_T)
    z1, w1 = seg(zc, 1, h0, QUAD_ES_T[0], QUAD_ES_T[1], QUAD_TS_T)
    z = np.concatenate([z0, z1])
    w = np.concatenate([w0, w1])
    wc = np.concatenate([2.0 * w0, np.zeros_like(w1)])
    # nodes where w exp(z^2 / 4) < 1e-22 are left out: u < ~1e-21 next to a breakpoint, and |z| > ~14.5 in
    # the tails. The Hermite factor matters: |h_k(z)| reaches ~exp(z^2 / 4) (Cramer's bound), so a tail
    # node of weight 1e-22 at z = 10 can carry h_15(z) ~ 1e9 (cutting at w > 1e-22 alone cost 4e-14 in
    # a_15 of tanh at K = 15); activations grow at most linearly
    keep = w * np.exp(0.25 * np.minimum(z * z, 2800.0)) > 1e-22
    return z[keep], w[keep], wc[keep]


@functools.lru_cache(maxsize=64)
def _hermite(zc_bytes: bytes, h0: float, kmax: int):
    """h_k(z_i) = He_k(z_i) / sqrt(k!) on the nodes of :func:`_rule`, shape (kmax + 1, nodes), by the
    three-term recurrence h_{k+1} = (z h_k - sqrt(k) h_{k-1}) / sqrt(k + 1) (no overflow: |h_k(z)|
    <= ~exp(z^2 / 4), and the nodes stop at |z| ~ 20)."""
    return _hermite_table(_rule(zc_bytes, h0)[0], kmax)


def _breaks(s: float, cuts: np.ndarray) -> np.ndarray:
    from .gaussian import QUAD_ZMAX
    from .quadrature_rule import breaks

    return breaks(s, cuts, QUAD_ZMAX)


def _groups(s: np.ndarray, cuts: np.ndarray) -> dict:
    """Rows grouped by their breakpoint set in z (None: s = 0). Without cuts every s > 0 has the
    set {0}, so no per-row work is done."""
    pos = s > 0
    if cuts.size == 0:
        out = {np.zeros(1).tobytes(): np.nonzero(pos)[0]}
    else:
        out = {}
        for i in np.nonzero(pos)[0]:
            out.setdefault(_breaks(float(s[i]), cuts).tobytes(), []).append(i)
        out = {k: np.array(v) for k, v in out.items()}
    if (~pos).any():
        out[None] = np.nonzero(~pos)[0]
    return {k: v for k, v in out.items() if len(v)}


def _used(idx, m):
    """The sorted distinct values of an index array into range(m) (np.unique without sorting 1e6 entries)."""
    mask = np.zeros(m, dtype=bool)
    mask[idx] = True
    return np.nonzero(mask)[0]


def _at_zero(f):
    # K = 0: f(0), the mean of f(0+) and f(0-) where f jumps there
    return 0.5 * (f(np.array([1e-300]))[0] + f(np.array([-1e-300]))[0])


_NO_CUTS = np.zeros(1).tobytes()
#: the trapezoid rule in z: steps h tried for f(s z) (a row takes the first with s h <= _TRAP_SH), and
#: the half-width of the grid (|z| <= 13: phi(13) h_k(13) < 1e-18 for k <= 256, against activations
#: that grow at most linearly)
_TRAP_STEPS = (1.0 / 4, 1.0 / 8, 1.0 / 16)
_TRAP_SH = 0.25
_TRAP_Z = 13.0
#: the conditional rule for the entries the series leaves: outer exp-sinh step, inner trapezoid steps
#: in w (an entry takes the first with sigma h <= _COND_SH), and the inner grid's half-width (phi(9) = 1e-18)
_COND_H = 1.0 / 32
_COND_W_STEPS = (1.0 / 2, 1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32)
_COND_SH = 0.5
_COND_W = 9.0


@functools.lru_cache(maxsize=8)
def _trap_rule(h: float, half_width: float = _TRAP_Z):
    """Nodes z = j h (|z| <= half_width, 13 unless given; j from -J to J, J even), weights h phi(z), and those of the rule of
    twice the step (2 h phi(z) on the even j, 0 on the odd). The trapezoid rule for an integrand
    analytic in a strip |Im z| < d converges like exp(-2 pi d / h) (Trefethen & Weideman 2014,
    SIAM Review 56, Thm. 5.1), so where the two rules agree to 1e-8 the finer one is at rounding."""
    J = 2 * int(np.ceil(half_width / h / 2))
    j = np.arange(-J, J + 1)
    z = j * h
    w = h * np.exp(-0.5 * z * z) * 0.3989422804014327
    wc = np.where(j % 2 == 0, 2.0 * w, 0.0)
    for v in (z, w, wc):
        v.setflags(write=False)
    return z, w, wc


@functools.lru_cache(maxsize=16)
def _hermite_trap(h: float, kmax: int):
    return _hermite_table(_trap_rule(h)[0], kmax)


def _hermite_at(z, kmax):
    for h in _TRAP_STEPS:
        if z.size == _trap_rule(h)[0].size:
            return _hermite_trap(h, kmax)
    return _hermite_table(z, kmax)


def _hermite_table(z, kmax):
    """h_k(z) = He_k(z) / sqrt(k!) for k <= kmax at the points z (the recurrence of :func:`_hermite`)."""
    H = np.empty((kmax + 1, z.size))
    H[0] = 1.0
    if kmax >= 1:
        H[1] = z
    for k in range(1, kmax):
        H[k + 1] = (z * H[k] - np.sqrt(k) * H[k - 1]) / np.sqrt(k + 1.0)
    return H


def _project(f, s, z, w, wc, H):
    """(a, E f^2, usable order) of f(s_i z) for the rows s_i on the rule (z, w) and the rule of twice its
    step (wc): a coefficient is usable where the two agree to TOL_COEFF of sqrt(E f^2), and so are
    all below it; -1 where not even E f^2 agrees."""
    kmax = H.shape[0] - 1
    F = f(s[:, None] * z[None, :])
    F = np.where(w[None, :] > 0.0, F, 0.0)
    even = wc > 0.0
    a = (F * w) @ H.T
    Fe = F[:, even]
    ac = (Fe * wc[even]) @ H[:, even].T
    e, ec = (F * F) @ w, (Fe * Fe) @ wc[even]
    scale = np.sqrt(np.maximum(e, 1e-300))
    bad = ~(np.abs(a - ac) <= TOL_COEFF * scale[:, None])
    # the first k that failed bounds what is usable (higher ones oscillate faster)
    first = np.where(bad.any(axis=1), np.argmax(bad, axis=1) - 1, kmax)
    first = np.where(np.abs(e - ec) <= TOL_COEFF * scale**2, first, -1)
    return a, e, first


class _Coefficients:
    """Hermite coefficients a_k(K) of one function f for a set of variances K (rows).

    ``a``: (m, kmax + 1); ``energy``: E[f(sqrt(K) z)^2]; ``tail``: (m, kmax + 1),
    E f^2 - sum_{j<=k} a_j^2 (>= 0); ``usable``: (m,) the largest k whose coefficients
    (and all below) passed the step-doubling test (-1: not even E f^2 did)."""

    def __init__(self, f, cuts, K, kmax, h0, parity=None):
        m = K.size
        self.a = np.zeros((m, kmax + 1))
        self.energy = np.zeros(m)
        self.usable = np.full(m, kmax)
        s = np.sqrt(K)
        for key, rows in _groups(s, cuts).items():
            if key is None:
                f0 = _at_zero(f)
                self.a[rows, 0] = f0
                self.energy[rows] = f0 * f0
                continue
            if key == _NO_CUTS and cuts.size == 0:
                # (a breakpoint at h = 0, ELU's, has the same key: z = 0 alone; its rows take the rule
                # split at 0, since the trapezoid rule converges only algebraically across a kink)
                # smooth f at moderate K: the trapezoid rule in z first (a fifth of the nodes); the rows
                # where it does not give every order up to kmax take the exp-sinh rule below
                a, e, first = np.zeros((rows.size, kmax + 1)), np.zeros(rows.size), np.full(rows.size, -1)
                for h in _TRAP_STEPS:
                    sel = np.nonzero((s[rows] * h <= _TRAP_SH) & (first < kmax))[0]
                    if sel.size:
                        z, w, wc = _trap_rule(h)
                        a[sel], e[sel], first[sel] = _project(f, s[rows[sel]], z, w, wc, _hermite_at(z, kmax))
                redo = np.nonzero(first < kmax)[0]
                if redo.size:
                    z, w, wc = _rule(key, h0)
                    a2, e2, f2 = _project(f, s[rows[redo]], z, w, wc, _hermite(key, h0, kmax))
                    better = f2 >= first[redo]
                    a[redo[better]], e[redo[better]], first[redo[better]] = a2[better], e2[better], f2[better]
            else:
                z, w, wc = _rule(key, h0)
                a, e, first = _project(f, s[rows], z, w, wc, _hermite(key, h0, kmax))
            if parity is not None:
                # f even (parity 0) or odd (1): the other orders vanish exactly (the rule gives rounding)
                a[:, 1 - parity::2] = 0.0
            self.a[rows], self.energy[rows], self.usable[rows] = a, e, first
        # the tail is a difference of two sums of size E f^2: below a few eps E f^2 it is rounding, and a
        # tail rounded to 0 would make the Cauchy-Schwarz bound 0 whatever the other factor's tail
        floor = 8.0 * _EPS * self.energy[:, None]
        self.at = np.ascontiguousarray(self.a.T)
        with np.errstate(invalid="ignore"):
            self.tail = np.maximum(self.energy[:, None] - np.cumsum(self.a * self.a, axis=1), floor)


def _one_point(f, g, cuts, K, h0):
    """E[f(u) g(u)], u ~ N(0, K), for an array of K (the rule of the coefficients; where it and the
    rule of twice its step disagree by more than TOL_COEFF, the package's adaptive one-point engine)."""
    out = np.empty(K.size)
    s = np.sqrt(K)
    for key, rows in _groups(s, cuts).items():
        if key is None:
            out[rows] = _at_zero(f) * _at_zero(g)
            continue
        z, w, wc = _rule(key, h0)
        h = s[rows, None] * z[None, :]
        F = np.where(w[None, :] > 0.0, f(h) * g(h), 0.0)
        v, vc, a = F @ w, F @ wc, np.abs(F) @ w
        out[rows] = v
        for i in np.nonzero(~(np.abs(v - vc) <= TOL_COEFF * a))[0]:
            from .gaussian import quad1

            val, _, _, conv = quad1(lambda x: f(x) * g(x), np.sqrt(K[rows[i]]), cuts)
            if not conv:
                raise ValueError(f"one-point Gaussian quadrature did not reach its tolerance at K={K[rows[i]]:.6g}; "
                                 "see meanfield.gram, Numerics")
            out[rows[i]] = val
    return out


from ._cache import install_locator  # noqa: E402

install_locator()  # numba's cache of the kernel goes to meanfield's cache folder, never the package

from numba import njit  # noqa: E402  (this module is imported only when kernels needs a quadrature)


@njit(cache=True, error_model="numpy", nogil=True)
def _series_sum(i1, i2, rho, AT, BT, EA, EB, TA, TB, UA, UB, ladder, tol, out):
    """The truncated series for every pair p (AT, BT: coefficients, transposed (kmax + 1, m); EA, EB:
    E f^2; TA, TB: tails (m, kmax + 1); UA, UB: usable orders). Each pair needs the smallest N of
    ``ladder`` with |rho|^(N+1) sqrt(TA[N] TB[N]) <= tol sqrt(EA EB) and N <= both usable orders
    (-1 in the returned orders: none): out[p] = sum_{k<=N} rho^k A[k] B[k]."""
    n = rho.size
    order = np.full(n, -1, np.int64)
    blk = 128
    acc = np.empty(blk)
    for start in range(0, n, blk):
        stop = min(start + blk, n)
        kmax = 0
        for p in range(start, stop):
            a = i1[p]
            b = i2[p]
            r = abs(rho[p])
            scale = tol * np.sqrt(EA[a] * EB[b])
            use = min(UA[a], UB[b])
            rk = r ** ladder[0]
            prev = ladder[0]
            for j in range(ladder.size):
                N = ladder[j]
                if N > use:
                    break
                rk *= r ** (N - prev)
                prev = N
                if scale == 0.0 or rk * r * np.sqrt(TA[a, N] * TB[b, N]) <= scale:
                    order[p] = N
                    break
            if order[p] > kmax:
                kmax = order[p]
        for p in range(start, stop):
            acc[p - start] = 0.0
        # Horner over the block, k outermost: the inner loop runs over independent accumulators
        for k in range(kmax, -1, -1):
            ak = AT[k]
            bk = BT[k]
            for p in range(start, stop):
                # terms above a pair's own order are left out (a select, not a branch: vectorised), so
                # the result depends on the pair alone (K(a, b) = K(b, a) exactly)
                t = ak[i1[p]] * bk[i2[p]] if k <= order[p] else 0.0
                acc[p - start] = acc[p - start] * rho[p] + t
        for p in range(start, stop):
            if order[p] >= 0:
                out[p] = acc[p - start]
    return order


@njit(cache=True, nogil=True)
def _is_symmetric(C):
    """C == C.T exactly (square C), by blocks (a transposed read of a 1000 x 1000 matrix, no copy)."""
    n = C.shape[0]
    if C.shape[1] != n:
        return False
    blk = 64
    for i0 in range(0, n, blk):
        for j0 in range(i0, n, blk):
            for i in range(i0, min(i0 + blk, n)):
                for j in range(max(j0, i + 1), min(j0 + blk, n)):
                    if not C[i, j] == C[j, i]:
                        return False
    return True


# The row steps of _gram_rows. inline="always": numba inlines them into its IR (LLVM leaves
# plain @njit callees as calls: 2-3% slower); _gram_rows keeps the row's views as locals (views
# sliced in the call arguments: 3-4% slower). benchmarks/gram_rows_split.py compares with the
# single function they replaced.
@njit(cache=True, error_model="numpy", nogil=True, inline="always")
def _row_setup(crow, kk, ibr, eb, ki, ea, rho, r2, pw, sc, order, flag):
    """One row of :func:`_gram_rows`, branch-free (vectorised): rho, rho^2, |rho|^3 (the bound's
    factor at N = 2), the tolerance tol sqrt(E f^2 E g^2), the order -1 (unsettled) and the flag
    of the special entries (a non-finite variance or K12, identical arguments); returns their
    number."""
    m = rho.size
    for j in range(m):
        c = crow[j]
        d = np.sqrt(ki * kk[j])
        r = c / d if d > 0.0 else 0.0
        r = min(1.0, max(-1.0, r))
        rho[j] = r
        r2[j] = r * r
        pw[j] = abs(r) * r * r          # |rho|^(N + 1) for N = ladder[0] = 2
        sc[j] = ea * eb[j]
        order[j] = -1.0
        sp_ = (ibr[j] < 0) | (c - c != 0.0) | ((kk[j] == ki) & (c == ki))
        flag[j] = 1.0 if sp_ else 0.0
    special = 0
    for j in range(m):
        special += flag[j] != 0.0
    return special


@njit(cache=True, error_model="numpy", nogil=True, inline="always")
def _row_special(crow, ibr, flag, ea1, same_ok, orow, srow, order, sc):
    """The flagged entries of one row: NaN and state 3 (a non-finite variance or K12), the one-point
    E f^2 (``ea1`` = sqrt(E f^2); ``same_ok``: f = g with E f^2 usable) and state 0 (identical
    arguments), else state 2; all taken out of the series (order -2, tolerance -1)."""
    for j in range(flag.size):
        if flag[j] == 0.0:
            continue
        c = crow[j]
        if ibr[j] < 0 or not np.isfinite(c):
            orow[j] = np.nan
            srow[j] = 3
        elif same_ok:
            # identical arguments: the one-point E[f^2] on the same rule, the series' value at
            # rho = 1
            orow[j] = ea1 * ea1
            srow[j] = 0
        else:
            srow[j] = 2
        order[j] = -2.0
        sc[j] = -1.0


@njit(cache=True, error_model="numpy", nogil=True, inline="always")
def _row_orders(sA, a, ua, sBc, j0, ladder, left, pw, r2, sc, order):
    """The smallest N of ``ladder`` per entry of one row (into ``order``; -1 where none), level by
    level (vectorised over the row; stops when all are settled or N passes the row's usable order
    ``ua``); ``pw`` is stepped from |rho|^3 by rho^2. Returns (the last level tried (-1: none), the
    entries left unsettled)."""
    m = pw.size
    prev = ladder[0]
    kmax = -1
    for L in range(ladder.size):
        if left == 0:
            break
        N = ladder[L]
        if N > ua:
            break
        for _ in range((N - prev) // 2):
            for j in range(m):
                pw[j] *= r2[j]
        prev = N
        st = sA[a, N]
        fN = float(N)
        sB = sBc[N, j0:]
        for j in range(m):
            o = order[j]
            ok = pw[j] * st * sB[j] <= sc[j]
            order[j] = fN if (o == -1.0) & ok else o
        kmax = N
        left = 0
        for j in range(m):
            left += order[j] == -1.0
    return kmax, left


@njit(cache=True, error_model="numpy", nogil=True, inline="always")
def _row_horner(A, a, Bc, j0, kmax, step, par, rho, r2, order, x, acc):
    """The series of one row into ``acc``: Horner from order ``kmax`` down in rho^step (every
    entry keeps only its terms up to its own order: a select, so the value depends on the pair
    alone), times rho for odd terms in rho^2."""
    m = rho.size
    for j in range(m):
        acc[j] = 0.0
        x[j] = r2[j] if step == 2 else rho[j]
    top = kmax - ((kmax - par) % step) if kmax >= 0 else -1
    for k in range(top, -1, -step):
        ak = A[a, k]
        bk = Bc[k, j0:]
        fk = float(k)
        for j in range(m):
            t = ak * bk[j] if fk <= order[j] else 0.0
            acc[j] = acc[j] * x[j] + t
    if step == 2 and par == 1:
        for j in range(m):
            acc[j] *= rho[j]


@njit(cache=True, error_model="numpy", nogil=True, inline="always")
def _row_store(acc, order, left, special, upper, i, j0, orow, srow, out, state):
    """One row's results: the series' value where settled (the special entries keep theirs), the
    state (0 settled, 1 not; the special entries keep theirs) and, for a symmetric matrix, the
    mirror of the row into column ``i`` below the diagonal."""
    m = acc.size
    for j in range(m):
        o = order[j]
        orow[j] = acc[j] if o >= 0.0 else orow[j]
    if left or special:
        for j in range(m):
            o = order[j]
            if o >= 0.0:
                srow[j] = 0
            elif o == -1.0:
                srow[j] = 1
    else:
        for j in range(m):
            srow[j] = 0
    if upper:
        for j in range(1, m):
            out[j0 + j, i] = orow[j]
            state[j0 + j, i] = srow[j]


@njit(cache=True, error_model="numpy", nogil=True)
def _gram_rows(k1, k2, C, ia, ib, A, Bc, sA, sBc, eA, eBc, uA, ladder, tol, step, par, upper, same, out, state):
    """The series over a Gram matrix (the layout ``kernels`` uses: K1 a column, K2 a row, K12 (n1, n2)).

    ``ia``/``ib``: each row's / column's coefficient row (-1: a non-finite variance); ``A`` (m, kmax + 1)
    the row function's coefficients, ``sA`` the square roots of its tails T_f(N), ``uA`` its usable
    orders; ``Bc``, ``sBc`` (kmax + 1, n2) the column function's coefficients and sqrt tails gathered
    per column (so that the inner loops read contiguous memory; sBc is 1e300 above a column's usable
    order), ``eA``, ``eBc`` sqrt(E f^2), sqrt(E g^2). ``step``/``par``: only orders k = par (mod step)
    are nonzero (step 2: f and g odd, or both even; the Horner sum then runs in rho^2). ``upper``:
    the upper triangle only, mirrored (a symmetric matrix). Each entry takes the smallest N of
    ``ladder`` with |rho|^(N+1) sqrt(T_f(N) T_g(N)) <= tol sqrt(E f^2 E g^2) and N <= both usable
    orders, and sums its own terms up to N (a select, so that the value depends on the pair alone).
    ``state``: 0 done, 1 not settled (no N of the ladder), 2 identical arguments without a
    one-point value here (f != g, or E f^2 not usable), 3 a non-finite variance (NaN).

    Per row: :func:`_row_setup` (rho and the flags), :func:`_row_special` (the flagged entries),
    :func:`_row_orders` (each entry's N), :func:`_row_horner` (the sum), :func:`_row_store`
    (results, states, mirror)."""
    # per row, views that start at j0 and loops from 0 (a loop from a variable start is not
    # vectorised by numba: negative indices wrap around)
    n1 = k1.size
    n2 = k2.size
    rho_ = np.empty(n2)
    x_ = np.empty(n2)
    pw_ = np.empty(n2)
    r2_ = np.empty(n2)
    sc_ = np.empty(n2)
    order_ = np.empty(n2)
    acc_ = np.empty(n2)
    flag_ = np.empty(n2)
    for i in range(n1):
        a = ia[i]
        j0 = i if upper else 0
        m = n2 - j0
        orow = out[i, j0:]
        srow = state[i, j0:]
        if a < 0:
            for j in range(m):
                orow[j] = np.nan
                srow[j] = 3
            continue
        crow = C[i, j0:]
        kk = k2[j0:]
        ibr = ib[j0:]
        eb = eBc[j0:]
        rho = rho_[:m]
        x = x_[:m]
        pw = pw_[:m]
        r2 = r2_[:m]
        sc = sc_[:m]
        order = order_[:m]
        acc = acc_[:m]
        flag = flag_[:m]
        ki = k1[i]
        ea = tol * eA[a]
        # branch-free over the row (vectorised); the special entries are fixed next
        special = _row_setup(crow, kk, ibr, eb, ki, ea, rho, r2, pw, sc, order, flag)
        if special:
            _row_special(crow, ibr, flag, eA[a], same and uA[a] >= 0, orow, srow, order, sc)
        # the smallest N per entry, level by level (vectorised over the row; stop when all are settled)
        kmax, left = _row_orders(sA, a, uA[a], sBc, j0, ladder, m - special, pw, r2, sc, order)
        # Horner from the row's largest order down, in rho^step
        _row_horner(A, a, Bc, j0, kmax, step, par, rho, r2, order, x, acc)
        _row_store(acc, order, left, special, upper, i, j0, orow, srow, out, state)
    return 0


# ---------------------------------------------------------------------------
# The split f = base + r for activations that are asymptotically linear on each side.
# ---------------------------------------------------------------------------
#: width of the Gaussian smoothing of the base's kinks and jumps (base_s(h) = E_w[base(h + S0 w)])
_SPLIT_S0 = 1.0
#: trapezoid steps tried (the cross terms', the remainders' product's; two grids offset by half a step each;
#: a step of 1 for the product alone met the tolerance on none of 2000 SiLU entries at K = 20-1000, rho = 0.8-0.95)
_SPLIT_STEPS = ((0.5, 0.5), (0.25, 0.25))
#: the split is used where both conditional standard deviations are at least this ...
_SPLIT_TAU = 1.0
#: ... and where |K12| L_f L_g / D (the exponent of the factorised density) stays below this
_SPLIT_EXP = 600.0
#: the asymptotes are checked out to |h| = this (K <= _SPLIT_KMAX: 10 standard deviations)
_SPLIT_HMAX = 1.0e16
_SPLIT_KMAX = 1.0e30
_ISQ2PI = 0.3989422804014327
_SQ2 = 1.4142135623730951


def _base(alpha, h):
    """alpha . (relu(h), relu(-h), 1{h>0}, 1{h<0}), the piecewise-linear asymptote (numpy)."""
    return alpha[0] * np.maximum(h, 0.0) + alpha[1] * np.maximum(-h, 0.0) + alpha[2] * (h > 0) + alpha[3] * (h < 0)


def _base_smooth(alpha, h, s0=_SPLIT_S0):
    """E_w[base(h + s0 w)], w ~ N(0, 1): relu -> h Phi(h/s0) + s0 phi(h/s0), 1{h>0} -> Phi(h/s0) (numpy)."""
    from scipy.special import ndtr

    x = h / s0
    pp, pm, ph = ndtr(x), ndtr(-x), _ISQ2PI * np.exp(-0.5 * x * x)
    return (alpha[0] * (h * pp + s0 * ph) + alpha[1] * (-h * pm + s0 * ph) + alpha[2] * pp + alpha[3] * pm)


class _Split:
    """f = base_s + r: base_s the Gaussian-smoothed (width S0) piecewise-linear asymptote of f,
    alpha . (relu, relu(-.), step, step(-.)) convolved with N(0, S0^2); r = f - base_s is analytic
    where f is and decays exponentially (as f approaches its asymptotes), and is set to 0 beyond
    ``L`` (where |r| is at the rounding level of f itself).

    ``alpha``: (a+, -a-, c+, c-) for f(h) -> a+ h + c+ (h -> +inf), a- h + c- (h -> -inf).
    ``grids(h)``: for the trapezoid step h, the two grids j h and (j + 1/2) h (|node| <= L + h) with
    the weights h r(node)."""

    def __init__(self, f, alpha, L):
        self.f, self.alpha, self.L = f, np.asarray(alpha, dtype=np.float64), float(L)
        self._grids = {}

    @classmethod
    def of(cls, f, cuts):
        """The split of f, or None where f is not (to rounding) linear plus an exponentially small part on
        each side. The slopes and constants are read off f at h = +-100, +-200 and then checked: |f - base|
        must be at the rounding level of f (8 eps (|a h| + |c| + 1)) on every sampled |h| in [L, 1e16],
        with L <= 60 the first such point; f must have no breakpoints (its kinks would be r's)."""
        if np.asarray(cuts).size:
            return None
        with np.errstate(all="ignore"):
            H = np.array([100.0, 200.0])
            fp, fm = f(H), f(-H)
            if not (np.all(np.isfinite(fp)) and np.all(np.isfinite(fm))):
                return None
            ap = (fp[1] - fp[0]) / 100.0
            am = (fm[0] - fm[1]) / 100.0
            cp, cm = fp[0] - 100.0 * ap, fm[0] + 100.0 * am
            # the estimates carry rounding (~1e-16 relative); snap to exact small integers where within it
            ap, am, cp, cm = (float(np.round(v)) if abs(v - np.round(v)) <= 1e-12 * (1 + abs(v)) else float(v)
                              for v in (ap, am, cp, cm))
            alpha = np.array([ap, -am, cp, cm])
            h = np.concatenate([np.arange(0.0, 60.0, 1.0 / 64), np.geomspace(60.0, _SPLIT_HMAX, 4000)])
            for sgn, a, c in ((1.0, ap, cp), (-1.0, am, cm)):
                r = f(sgn * h) - _base_smooth(alpha, sgn * h)
                floor = 8.0 * _EPS * (np.abs(a * h) + abs(c) + 1.0)
                above = ~(np.abs(r) <= floor)
                if above[h >= 60.0].any():
                    return None
                L0 = h[np.nonzero(above)[0][-1] + 1] if above.any() else 0.0
                if sgn > 0:
                    Lp = L0
                else:
                    Lm = L0
        return cls(f, alpha, max(Lp, Lm, 8.0 * _SPLIT_S0))

    def r(self, h):
        with np.errstate(all="ignore"):
            out = self.f(h) - _base_smooth(self.alpha, h)
        return np.where(np.abs(h) <= self.L, out, 0.0)

    def grids(self, step):
        if step not in self._grids:
            n = int(np.ceil(self.L / step)) + 1
            a = step * np.arange(-n, n + 1, dtype=np.float64)
            b = step * (np.arange(-n, n, dtype=np.float64) + 0.5)
            self._grids[step] = (a, step * self.r(a), b, step * self.r(b))
        return self._grids[step]

    def cut(self, step):
        """For the remainders' product on the grids of :meth:`grids`: per grid (R, B), R[k] = sum of |h r| over
        the k outermost nodes at each end (k = 0 .. n // 2) and B = sum of |h r| (:func:`_split_rr`'s
        truncation bound)."""
        key = ("cut", step)
        if key not in self._grids:
            out = []
            for w in (self.grids(step)[1], self.grids(step)[3]):
                aw = np.abs(w)
                n = w.size
                R = np.zeros(n // 2 + 1)
                for k in range(1, n // 2 + 1):
                    R[k] = R[k - 1] + aw[k - 1] + aw[n - k]
                out.append((R, float(aw.sum())))
            self._grids[key] = tuple(out)
        return self._grids[key]

    def halves(self, step):
        """The grids of :meth:`grids` as halves, for the cross terms: per grid (xp, wp, wm, w0), its positive
        nodes xp with the weights at +xp and -xp, the weight at 0 (grid a; 0 for grid b), and the tails TA, TX
        of :func:`_split_cross_one`'s truncation bound."""
        key = ("halves", step)
        if key not in self._grids:
            out = []
            for x, w in (self.grids(step)[:2], self.grids(step)[2:]):
                pos = np.nonzero(x > 0)[0]
                neg = np.searchsorted(x, -x[pos])
                if not np.array_equal(x[neg], -x[pos]):
                    raise AssertionError("the split's grids must be symmetric about 0")
                zero = np.nonzero(x == 0)[0]
                w0 = float(w[zero[0]]) if zero.size else 0.0
                xp, wp, wm = (np.ascontiguousarray(v) for v in (x[pos], w[pos], w[neg]))
                # from the outside in: TA[k] = sum over the pairs i >= k of |w(+x)| + |w(-x)|, TX[k] the same
                # sum weighted by x (what leaving out the pairs from k on can change, :func:`_split_cross_one`)
                aw = np.abs(wp) + np.abs(wm)
                TA = np.concatenate([np.cumsum(aw[::-1])[::-1], [0.0]])
                TX = np.concatenate([np.cumsum((aw * xp)[::-1])[::-1], [0.0]])
                out.append((xp, wp, wm, w0, TA, TX))
            self._grids[key] = tuple(out)
        return self._grids[key]


@njit(cache=True, error_model="numpy", nogil=True)
def _cond_base(al, m, t):
    """E[base(X)], X ~ N(m, t^2) (t > 0), base = al . (relu(x), relu(-x), 1{x>0}, 1{x<0})."""
    x = m / t
    q = 0.5 * math.erfc(abs(x) / _SQ2)   # the smaller of Phi(x), Phi(-x), to full relative precision
    pp = 1.0 - q if x >= 0.0 else q
    pm = q if x >= 0.0 else 1.0 - q
    ph = _ISQ2PI * math.exp(-0.5 * x * x)
    return al[0] * (m * pp + t * ph) + al[1] * (t * ph - m * pm) + al[2] * pp + al[3] * pm


@njit(cache=True, error_model="numpy", nogil=True)
def _base_pair(k1, k2, k12, D, af, ag, s0sq):
    """E[bf(u') bg(v')] for (u', v') with variances k1 + s0^2, k2 + s0^2, covariance k12 (D = k1 k2 - k12^2):
    the arc-cosine kernels of order 1 and 0 (Cho & Saul 2009) and their cross terms,
    E[relu(u) 1{v > 0}] = sqrt(K1) (1 + rho) / (2 sqrt(2 pi))."""
    K1 = k1 + s0sq
    K2 = k2 + s0sq
    s1 = math.sqrt(K1)
    s2 = math.sqrt(K2)
    Dp = D + s0sq * (k1 + k2) + s0sq * s0sq
    sq = math.sqrt(Dp)
    th = math.atan2(sq, k12)
    cs = k12 / (s1 * s2)
    J1 = (sq + (math.pi - th) * k12) / (2.0 * math.pi)
    J1m = J1 - 0.5 * k12
    m1 = _ISQ2PI * s1
    m2 = _ISQ2PI * s2
    S0 = (math.pi - th) / (2.0 * math.pi)
    S1 = th / (2.0 * math.pi)
    M = ((J1, J1m, 0.5 * m1 * (1.0 + cs), 0.5 * m1 * (1.0 - cs)),
         (J1m, J1, 0.5 * m1 * (1.0 - cs), 0.5 * m1 * (1.0 + cs)),
         (0.5 * m2 * (1.0 + cs), 0.5 * m2 * (1.0 - cs), S0, S1),
         (0.5 * m2 * (1.0 - cs), 0.5 * m2 * (1.0 + cs), S1, S0))
    out = 0.0
    for p in range(4):
        for q in range(4):
            out += af[p] * M[p][q] * ag[q]
    return out


#: exp(x^2) erfc(x) on [0, 32) for the split's cross terms: 64 panels of width 1/2, on each the degree-12
#: polynomial (in t = 4 (x - x_k) - 1, highest power first) through the Chebyshev points; above 32 the continued
#: fraction of :func:`_erfcx`. Filled from scipy's erfcx (Johnson's Faddeeva package) on first use;
#: tests/test_gram_split_fast.py checks it against mpmath (<= 8 eps relative)
_ERFCX_W = 0.5
_ERFCX_N = 64
_ERFCX_DEG = 12


@functools.lru_cache(maxsize=1)
def _erfcx_table():
    from numpy.polynomial import chebyshev as C
    from scipy.special import erfcx

    t = np.cos(np.pi * (np.arange(_ERFCX_DEG + 1) + 0.5) / (_ERFCX_DEG + 1))
    tab = np.empty((_ERFCX_N, _ERFCX_DEG + 1))
    for k in range(_ERFCX_N):
        c = C.chebfit(t, erfcx(_ERFCX_W * (k + 0.5 * (t + 1.0))), _ERFCX_DEG)
        p = C.cheb2poly(c)
        tab[k] = np.concatenate([p, np.zeros(_ERFCX_DEG + 1 - p.size)])[::-1]
    tab.setflags(write=False)
    return tab


@njit(cache=True, error_model="numpy", nogil=True)
def _erfcx_fast(x, T):
    """exp(x^2) erfc(x) for x >= 0 from the table T of :func:`_erfcx_table` (a Horner sum of 13 terms, no
    exp, no loop: ~10x cheaper than math.erfc, whose numba implementation iterates a series or continued
    fraction per call)."""
    if x < _ERFCX_W * _ERFCX_N:
        k = int(x * (1.0 / _ERFCX_W))
        t = (2.0 / _ERFCX_W) * (x - _ERFCX_W * k) - 1.0
        p = T[k, 0]
        for j in range(1, T.shape[1]):
            p = p * t + T[k, j]
        return p
    return _erfcx(x)


@njit(cache=True, error_model="numpy", nogil=True)
def _split_cross_one(ka, k12, D, al, s0sq, hx, T, budget):
    """(E[r(x) b_s(y)] on one symmetric trapezoid grid, a bound on what the nodes left out contribute):
    x ~ N(0, ka), y + s0 z | x ~ N(k12 x / ka, D / ka + s0^2) (kb enters through D = ka kb - k12^2).
    The grid hx = (xp, wp, wm, w0, TA, TX) is given by halves (:meth:`_Split.halves`): its nodes +-xp
    (xp > 0, ascending) with the weights wp = h r(xp), wm = h r(-xp), and w0 = h r(0) (0 where 0 is not
    a node). A node pair +-x shares its transcendental functions: the Gaussian weight exp(-x^2 / (2 ka)),
    phi(z) and Phi(-|z|) = erfcx(|z| / sqrt 2) phi(z) sqrt(pi / 2) at z = k12 x / (ka t)
    (Phi(|z|) = 1 - Phi(-|z|)). The outermost pairs are left out while what they can contribute,
    c sum |w| (|a0| + |a1|) (|mu| x + t phi(0)) + (|a2| + |a3|)) (the Gaussian weight <= 1, E[b] bounded
    by the base's slopes and steps), stays within ``budget``; that bound is returned."""
    xp, wp, wm, w0, TA, TX = hx
    t = math.sqrt(D / ka + s0sq)
    mu = k12 / ka
    s = mu / t
    c = _ISQ2PI / math.sqrt(ka)
    a0, a1, a2, a3 = al[0], al[1], al[2], al[3]
    tph0 = t * _ISQ2PI
    sl = abs(a0) + abs(a1)
    st = abs(a2) + abs(a3)
    n = xp.size
    while n > 0 and c * (sl * (abs(mu) * TX[n - 1] + tph0 * TA[n - 1]) + st * TA[n - 1]) <= budget:
        n -= 1
    bound = c * (sl * (abs(mu) * TX[n] + tph0 * TA[n]) + st * TA[n])
    out = w0 * ((a0 + a1) * tph0 + 0.5 * (a2 + a3))
    # the two Gaussians on the uniform half grid by the recurrence exp(A (x + h)^2) = exp(A x^2) r,
    # r = exp(A (2 x h + h^2)), r -> r exp(2 A h^2), restarted from exp every _REC nodes (relative error
    # <= ~_REC^2 eps / 2 = 32 eps; an exp costs as much as the rest of a node)
    h = xp[1] - xp[0] if xp.size > 1 else 1.0
    Ag = -0.5 / ka
    Ae = -0.5 * s * s
    cg = math.exp(2.0 * Ag * h * h)
    ce = math.exp(2.0 * Ae * h * h)
    g = rg = e = re = 0.0
    for i in range(n):
        x = xp[i]
        if i % _REC == 0:
            g = math.exp(Ag * x * x)
            rg = math.exp(Ag * (2.0 * x * h + h * h))
            e = math.exp(Ae * x * x)
            re = math.exp(Ae * (2.0 * x * h + h * h))
        p = wp[i]
        q_ = wm[i]
        if p != 0.0 or q_ != 0.0:
            w = abs(s * x)
            q = (0.5 * _erfcx_fast(w / _SQ2, T)) * e     # Phi(-|z|)
            big = 1.0 - q
            tph = tph0 * e
            m = mu * x
            if s >= 0.0:
                pp, pm = big, q
            else:
                pp, pm = q, big
            # node +x: E[b(Y)], Y ~ N(m, t^2); node -x: m -> -m, Phi(z) <-> Phi(-z)
            vp = a0 * (m * pp + tph) + a1 * (tph - m * pm) + a2 * pp + a3 * pm
            vm = a0 * (tph - m * pm) + a1 * (m * pp + tph) + a2 * pm + a3 * pp
            out += g * (p * vp + q_ * vm)
        g *= rg
        rg *= cg
        e *= re
        re *= ce
    return c * out, bound


@njit(cache=True, error_model="numpy", nogil=True)
def _split_cross(k1, k2, k12, D, af, ag, s0sq, hf, hg, T, budget):
    """E[bf_s(u) rg(v)] + E[rf(u) bg_s(v)] on one pair of symmetric trapezoid grids given by halves
    (hf of rf, hg of rg: :meth:`_Split.halves`), and the bound on the nodes left out (budget / 2 each)."""
    x1, e1 = _split_cross_one(k2, k12, D, af, s0sq, hg, T, 0.5 * budget)
    x2, e2 = _split_cross_one(k1, k12, D, ag, s0sq, hf, T, 0.5 * budget)
    return x1 + x2, e1 + e2


#: the split's Gaussians and exponentials on its uniform grids are stepped by multiplications and restarted
#: from exp every _REC nodes
_REC = 8


@njit(cache=True, error_model="numpy", nogil=True)
def _geometric(x, lo, n, c, out):
    """out[k] = exp(c x[lo + k]) for k < n on a uniform grid x: exp at every _REC-th node, times exp(c h) in
    between (relative error <= ~_REC eps)."""
    if n <= 0:
        return
    h = x[lo + 1] - x[lo] if n > 1 else 0.0
    q = math.exp(c * h)
    e = 0.0
    for k in range(n):
        if k % _REC == 0:
            e = math.exp(c * x[lo + k])
        out[k] = e
        e *= q


@njit(cache=True, error_model="numpy", nogil=True)
def _gaussian(x, lo, n, A, out):
    """out[k] = exp(A x[lo + k]^2) for k < n on a uniform grid x (A <= 0): exp(A (x + h)^2) = exp(A x^2) r,
    r = exp(A (2 x h + h^2)), r -> r exp(2 A h^2), restarted from exp every _REC nodes (relative error
    <= ~_REC^2 eps / 2)."""
    if n <= 0:
        return
    h = x[lo + 1] - x[lo] if n > 1 else 0.0
    c = math.exp(2.0 * A * h * h)
    g = r = 0.0
    for k in range(n):
        xk = x[lo + k]
        if k % _REC == 0:
            g = math.exp(A * xk * xk)
            r = math.exp(A * (2.0 * xk * h + h * h))
        out[k] = g
        g *= r
        r *= c


@njit(cache=True, error_model="numpy", nogil=True)
def _rr_rows(G, E, P, P4, f0, f1, f2, f3, m):
    """G_j += E_j (f0 + P_j (f1 + P_j (f2 + P_j f3))), E_j *= P4_j for j < m (a function of its own: inside
    :func:`_split_rr`'s loop LLVM left it scalar; here it is vectorised, AVX2 on this machine)."""
    for j in range(m):
        p = P[j]
        G[j] += E[j] * (f0 + p * (f1 + p * (f2 + p * f3)))
        E[j] *= P4[j]


@njit(cache=True, error_model="numpy", nogil=True)
def _rr_step(E, P4, m):
    for j in range(m):
        E[j] *= P4[j]


@njit(cache=True, error_model="numpy", nogil=True)
def _split_rr(k1, k2, k12, D, u, wf, v, wg, cf, cg, budget, G, E, P, P4, F):
    """(E[rf(u) rg(v)] on one pair of uniform symmetric trapezoid grids, a bound on the nodes left out):
    u, wf = h rf; v, wg = h rg (step u[1] - u[0]); cf = (R, B) of u's grid, cg of v's (:meth:`_Split.cut`);
    G, E, P, P4, F: work arrays of the grids' size. The k outermost nodes at each end of u's grid are left out while
    p_max R_f[k] B_g <= budget / 2 (p_max = 1 / (2 pi sqrt D), the density's largest value), likewise for v."""
    # E[rf(u) rg(v)]: the density exp(-(k2 u^2 - 2 k12 u v + k1 v^2) / (2 D)) / (2 pi sqrt(D)), with
    # exp(beta u_i v_j) stepped along the uniform u grid, four rows at a time: the rows i .. i + 3 add
    # E_j (f_i + P_j (f_i+1 + P_j (f_i+2 + P_j f_i+3))) to G_j, then E_j *= P_j^4 (one pass over G, E for
    # four rows: the loop is bound by memory traffic, not by the multiplications)
    Rf, Bf = cf
    Rg, Bg = cg
    pmax = 1.0 / (2.0 * math.pi * math.sqrt(D))
    kf = 0
    while kf + 1 < Rf.size and pmax * Rf[kf + 1] * Bg <= 0.5 * budget:
        kf += 1
    kg = 0
    while kg + 1 < Rg.size and pmax * Rg[kg + 1] * Bf <= 0.5 * budget:
        kg += 1
    bound = pmax * (Rf[kf] * Bg + Rg[kg] * Bf)
    beta = k12 / D
    h = u[1] - u[0]
    j0 = kg
    m = v.size - 2 * kg
    u0 = u[kf]
    n = u.size - kf
    # exp(beta u0 v_j), exp(beta h v_j) (geometric in j), the Gaussians in u and v: recurrences restarted
    # from exp every _REC nodes (:func:`_geometric`, :func:`_gaussian`)
    _geometric(v, j0, m, beta * u0, E)
    _geometric(v, j0, m, beta * h, P)
    for j in range(m):
        p2 = P[j] * P[j]
        P4[j] = p2 * p2
        G[j] = 0.0
    _gaussian(u, kf, n - kf, -0.5 * k2 / D, F)
    i = kf
    while i + 4 <= n:
        f0 = wf[i] * F[i - kf]
        f1 = wf[i + 1] * F[i + 1 - kf]
        f2 = wf[i + 2] * F[i + 2 - kf]
        f3 = wf[i + 3] * F[i + 3 - kf]
        if f0 == 0.0 and f1 == 0.0 and f2 == 0.0 and f3 == 0.0:
            _rr_step(E, P4, m)
        else:
            _rr_rows(G, E, P, P4, f0, f1, f2, f3, m)
        i += 4
    while i < n:
        fi = wf[i] * F[i - kf]
        _rr_rows(G, E, P, P, fi, 0.0, 0.0, 0.0, m)
        i += 1
    _gaussian(v, j0, m, -0.5 * k1 / D, F)
    t4 = 0.0
    for j in range(m):
        t4 += wg[j0 + j] * F[j] * G[j]
    return t4 * pmax, bound


@njit(cache=True, error_model="numpy", nogil=True)
def _split_sum(k1, k2, k12, af, ag, s0sq, h1, g2, c2, T, tol, out, err):
    """E[f(u) g(v)] = E[bf bg] + (the cross terms on the grids h1, the remainders' product on the grids g2; each
    on the two offset grids a and b, averaged) per entry; err: |a - b| of the two parts plus the bounds on the
    nodes left out (at most tol / 4 in all).
    h1: (halves of rf on grid a, of rf on grid b, of rg on a, of rg on b) as in :meth:`_Split.halves`;
    g2: (ua, wfa, ub, wfb, va, wga, vb, wgb) as in :meth:`_Split.grids`, c2 their cuts (:meth:`_Split.cut`:
    rf's on a and b, rg's on a and b); T: :func:`_erfcx_table`; tol: the tolerance per entry."""
    hfa, hfb, hga, hgb = h1
    Ua, Wfa, Ub, Wfb, Va, Wga, Vb, Wgb = g2
    cfa, cfb, cga, cgb = c2
    n = max(Va.size, Vb.size, Ua.size, Ub.size)
    F = np.empty(n)
    G = np.empty(n)
    E = np.empty(n)
    P = np.empty(n)
    P4 = np.empty(n)
    for p in range(k1.size):
        a = k1[p]
        b = k2[p]
        c = k12[p]
        D = a * b - c * c
        # a quarter of the tolerance for the truncations, shared by the four sums
        bud = 0.0625 * tol[p]
        t1 = _base_pair(a, b, c, D, af, ag, s0sq)
        xa, ea = _split_cross(a, b, c, D, af, ag, s0sq, hfa, hga, T, bud)
        xb, eb = _split_cross(a, b, c, D, af, ag, s0sq, hfb, hgb, T, bud)
        ya, fa = _split_rr(a, b, c, D, Ua, Wfa, Va, Wga, cfa, cga, bud, G, E, P, P4, F)
        yb, fb = _split_rr(a, b, c, D, Ub, Wfb, Vb, Wgb, cfb, cgb, bud, G, E, P, P4, F)
        out[p] = t1 + 0.5 * (xa + xb) + 0.5 * (ya + yb)
        err[p] = abs(xa - xb) + abs(ya - yb) + ea + eb + fa + fb
    return 0


# ---------------------------------------------------------------------------
# The split at a breakpoint: f = kinked base + exponential remainder (ELU, SELU, their derivatives).
# ---------------------------------------------------------------------------
#: Gauss-Kronrod 7-15 on [-1, 1] (the nodes and weights of QUADPACK's qk15; recomputed here in 50-digit
#: mpmath from the Stieltjes polynomial, and tests/test_gram_elu_split.py checks the degrees of exactness)
_K15_X = np.array([
    -0.9914553711208126392068546975263285, -0.9491079123427585245261896840478513,
    -0.8648644233597690727897127886409262, -0.7415311855993944398638647732807884,
    -0.5860872354676911302941448382587296, -0.4058451513773971669066064120769615,
    -0.2077849550078984676006894037732449, 0.0,
    0.2077849550078984676006894037732449, 0.4058451513773971669066064120769615,
    0.5860872354676911302941448382587296, 0.7415311855993944398638647732807884,
    0.8648644233597690727897127886409262, 0.9491079123427585245261896840478513,
    0.9914553711208126392068546975263285])
_K15_W = np.array([
    0.02293532201052922496373200805896959, 0.06309209262997855329070066318920429,
    0.104790010322250183839876322541518, 0.1406532597155259187451895905102379,
    0.1690047266392679028265834265985503, 0.1903505780647854099132564024210137,
    0.2044329400752988924141619992346491, 0.2094821410847278280129991748917143,
    0.2044329400752988924141619992346491, 0.1903505780647854099132564024210137,
    0.1690047266392679028265834265985503, 0.1406532597155259187451895905102379,
    0.104790010322250183839876322541518, 0.06309209262997855329070066318920429,
    0.02293532201052922496373200805896959])
#: the Gauss 7 weights on the same nodes (0 on the Kronrod ones)
_G7_W = np.zeros(15)
_G7_W[[1, 3, 5, 7, 9, 11, 13]] = (0.129484966168869693270611432679082, 0.2797053914892766679014677714237796,
                                  0.3818300505051189449503697754889751, 0.4179591836734693877551020408163265,
                                  0.3818300505051189449503697754889751, 0.2797053914892766679014677714237796,
                                  0.129484966168869693270611432679082)
#: panel widths (in units of 1 / max(1, lambda_f, lambda_g)): 8 with its Gauss 7 estimate, then 8 against 4,
#: 4 against 2, 2 against 1
_EXP_WIDTHS = np.array([8.0, 4.0, 2.0, 1.0])
#: the exponential split is tried where both conditional standard deviations are above this (below 1 the first
#: panel is graded towards the breakpoint; an entry whose rules do not agree goes on to the nested engine)
_EXP_TAU = 0.0
_SQPI = 1.7724538509055160
_EPS64 = np.finfo(np.float64).eps


@njit(cache=True, error_model="numpy", nogil=True)
def _erfcx(x):
    """exp(x^2) erfc(x) for x >= 0: the product below 2.5 (exp(x^2) then has relative error <= 6.25 eps),
    Laplace's continued fraction 1 / (x + (1/2) / (x + (2/2) / (x + ...))) / sqrt(pi) above, summed from
    the back with 40 terms at x < 4 down to 4 terms from x = 100 (each range checked against mpmath: <= 3 eps)."""
    if x < 2.5:
        return math.exp(x * x) * math.erfc(x)
    n = 40 if x < 4.0 else 24 if x < 6.0 else 14 if x < 10.0 else 10 if x < 30.0 else 6 if x < 100.0 else 4
    f = x
    for k in range(n, 0, -1):
        f = x + 0.5 * k / f
    return 1.0 / (_SQPI * f)


@njit(cache=True, error_model="numpy", nogil=True)
def _cond_exp(re, m, t, ph):
    """E[r(X)], X ~ N(m, t^2) (t > 0), r(x) = A- exp(lam- x) 1{x<0} + A+ exp(-lam+ x) 1{x>0},
    re = (A-, lam-, A+, lam+); ph = exp(-(m/t)^2 / 2) (shared with :func:`_cond_base`):

        E[A exp(lam X) 1{X<0}] = A exp(lam m + lam^2 t^2 / 2) Phi(-z),  z = (m + lam t^2) / t,

    as A exp(lam t z - lam^2 t^2 / 2) Phi(-z) for z <= 0 and A ph erfcx(z / sqrt 2) / 2 for z > 0 (the
    exponents add up to -m^2 / (2 t^2): no overflow at any K); the x > 0 part is the same with m -> -m."""
    out = 0.0
    for s in range(2):
        A = re[2 * s]
        lam = re[2 * s + 1]
        if A == 0.0:
            continue
        mm = m if s == 0 else -m
        z = (mm + lam * t * t) / t
        if z <= 0.0:
            out += A * math.exp(lam * t * z - 0.5 * lam * lam * t * t) * 0.5 * math.erfc(z / _SQ2)
        else:
            out += A * ph * 0.5 * _erfcx(z / _SQ2)
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def _exp_side(A, lam, sgn, W0, npan, ng, split, ka, c, D, al, re, with_r, X, W, WG):
    """Gauss-Kronrod 15 and the embedded Gauss 7 sums along sgn * [0, npan W0] of

        A exp(-lam |x|) phi(x; 0, ka) (E[b(Y) | x] + with_r E[r(Y) | x]),  Y | x ~ N(c x / ka, D / ka),

    E[b(Y) | x] = al . (E relu(Y), E relu(-Y), P(Y > 0), P(Y < 0)) written out as in :func:`_cond_base`.
    The coarse panels are [j W0, (j + 1) W0], the first of them graded towards the breakpoint when ng > 0
    (edges 0, W0 / 2^ng, W0 / 2^(ng - 1), ..., W0 / 2, W0: the turn of E[. | x] at x = 0 over sqrt(D ka) / |c|
    and the Gaussian's width sqrt(ka) when these are below 1); each coarse panel is cut into ``split``
    equal ones. Returns (Kronrod sum, Gauss sum, the Kronrod sum of the sizes of the terms of the integrand)."""
    if npan == 0:
        return 0.0, 0.0, 0.0
    t = math.sqrt(D / ka)
    mu = c / ka
    cn = _ISQ2PI / math.sqrt(ka)
    outk = 0.0
    outg = 0.0
    outa = 0.0
    for q in range(npan + ng):
        if ng > 0 and q <= ng:
            lo = 0.0 if q == 0 else W0 / 2.0 ** (ng - q + 1)
            hi = W0 / 2.0 ** (ng - q)
        else:
            j = q - ng
            lo = j * W0
            hi = (j + 1) * W0
        sub = (hi - lo) / split
        half = 0.5 * sub
        for ps in range(split):
            mid = lo + (ps + 0.5) * sub
            acck = 0.0
            accg = 0.0
            acca = 0.0
            for i in range(X.size):
                y = mid + half * X[i]
                x = sgn * y
                m = mu * x
                qq = m / t
                e = 0.5 * math.erfc(abs(qq) / _SQ2)
                pp = 1.0 - e if qq >= 0.0 else e
                pm = e if qq >= 0.0 else 1.0 - e
                ph = math.exp(-0.5 * qq * qq)
                tp = _ISQ2PI * t * ph
                v = al[0] * (m * pp + tp) + al[1] * (tp - m * pm) + al[2] * pp + al[3] * pm
                # the sizes of the terms (their rounding is what cancels in v)
                va = abs(al[0]) * (abs(m) * pp + tp) + abs(al[1]) * (tp + abs(m) * pm) + abs(al[2]) * pp \
                    + abs(al[3]) * pm
                if with_r:
                    ve = _cond_exp(re, m, t, ph)
                    v += ve
                    va += abs(ve)
                wgt = math.exp(-lam * y - 0.5 * x * x / ka)
                fv = wgt * v
                acck += W[i] * fv
                accg += WG[i] * fv
                acca += W[i] * wgt * va
            outk += half * acck
            outg += half * accg
            outa += half * acca
    return A * cn * outk, A * cn * outg, abs(A) * cn * outa


@njit(cache=True, error_model="numpy", nogil=True)
def _grading(ka, c, D, unit, W0):
    """Levels of grading of the first panel (:func:`_exp_side`): 0 where the integrand's scales at the
    breakpoint, sqrt(ka) and sqrt(D ka) / |c|, are at least ``unit``; else enough halvings of W0 to reach
    below the smaller of them."""
    s = math.sqrt(ka)
    if c != 0.0:
        s = min(s, math.sqrt(D * ka) / abs(c))
    if s >= unit:
        return 0
    return min(60, int(math.ceil(math.log2(W0 / s))))


@njit(cache=True, error_model="numpy", nogil=True)
def _exp_tail_panels(A, lam, ka, c, D, al, re, with_r, H, tol):
    """The number of panels of width H (the coarsest) after which the rest of the half-line integral of
    :func:`_exp_side` is below tol: |integrand| <= A exp(-lam y) (P + Q y) / sqrt(2 pi ka), with
    |E relu(+-Y)| <= |m| + t / sqrt(2 pi) (m = c x / ka), |E r(Y)| <= A-_g + A+_g; so the tail from Y0 is at
    most A exp(-lam Y0) (P / lam + Q (Y0 / lam + 1 / lam^2)) / sqrt(2 pi ka). Returns (panels, bound)."""
    t = math.sqrt(D / ka)
    P = (abs(al[0]) + abs(al[1])) * _ISQ2PI * t + abs(al[2]) + abs(al[3])
    if with_r:
        P += abs(re[0]) + abs(re[2])
    Q = (abs(al[0]) + abs(al[1])) * abs(c) / ka
    cn = abs(A) * _ISQ2PI / math.sqrt(ka)
    n = 0
    while True:
        Y0 = n * H
        bound = cn * math.exp(-lam * Y0) * (P / lam + Q * (Y0 / lam + 1.0 / (lam * lam)))
        if bound <= tol or n >= 200:
            return n, bound
        n += 1


@njit(cache=True, error_model="numpy", nogil=True)
def _two_prod(a, b):
    """(p, e) with p = fl(a b) and p + e = a b exactly (Dekker 1971: Veltkamp's split into 26-bit halves)."""
    p = a * b
    s = 134217729.0 * a
    ah = s - (s - a)
    al = a - ah
    s = 134217729.0 * b
    bh = s - (s - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@njit(cache=True, error_model="numpy", nogil=True)
def _det(a, b, c):
    """a b - c^2 to a few ulp of itself (the products' rounding errors restored; fl(a b) - fl(c c) is exact
    where they are within a factor 2, i.e. where the determinant is small). A plain a b - c c loses
    eps a b / D relative: at rho = 1 - 1e-12 that is 5e-5 of D, and the orthant probability of the
    base pair, (pi - theta) / (2 pi) with theta ~ sqrt(D), moved by 1e-12 (phi' of SELU)."""
    p1, e1 = _two_prod(a, b)
    p2, e2 = _two_prod(c, c)
    return (p1 - p2) + (e1 - e2)


@njit(cache=True, error_model="numpy", nogil=True)
def _exp_split_sum(k1, k2, k12, af, ag, rf, rg, unit, widths, tol, X, W, WG, out, err):
    """E[f(u) g(v)] per entry, f = bf + rf and g = bg + rg with b the kinked asymptote
    al . (relu(h), relu(-h), 1{h>0}, 1{h<0}) and r = (A-, lam-, A+, lam+) the exponential remainder:

        E[f g] = E[bf bg] + E[rf(u) (bg + rg)(v)] + E[bf(u) rg(v)]      (ka >= kb; else f <-> g)

    E[bf bg] in closed form (:func:`_base_pair`, no smoothing), the other two one-dimensional over the
    half-lines where r is nonzero, with the conditional expectations in closed form (:func:`_cond_base`,
    :func:`_cond_exp`): the larger variance is integrated over, so the exponential conditional's rate in it,
    lam |K12| / ka, is at most lam. Gauss-Kronrod 15 on panels from the breakpoint 0 outwards (the jump
    of r sits on a panel edge), ``widths`` * unit wide: first the widest, its error taken as the difference
    from the embedded Gauss 7 rule (the lower order's error: an overestimate of the Kronrod rule's); then
    each width against the one before (the coarser rule's error, again an overestimate); an entry takes
    the first value whose estimate, both integrals and the bounds of the tails cut added, is at most
    tol[p]. err[p]: that estimate (inf where none passed)."""
    for p in range(k1.size):
        a = k1[p]
        b = k2[p]
        c = k12[p]
        D = _det(a, b, c)
        base = _base_pair(a, b, c, D, af, ag, 0.0)
        # the sum of the sizes of its terms (every entry of the kernel matrix M of _base_pair is >= 0)
        babs = _base_pair(a, b, c, D, np.abs(af), np.abs(ag), 0.0)
        rf_out = a >= b       # the exponential conditional goes with the integral over the larger variance
        tl = 1e-3 * tol[p]
        # tails: each side of each integral, cut where its bound is below tol / 1000
        np_ = np.zeros(4, dtype=np.int64)
        tail = 0.0
        H0 = widths[0] * unit
        for s in range(2):
            if rf[2 * s] != 0.0:
                n, bd = _exp_tail_panels(rf[2 * s], rf[2 * s + 1], a, c, D, ag, rg, rf_out, H0, tl)
                np_[s] = n
                tail += bd
            if rg[2 * s] != 0.0:
                n, bd = _exp_tail_panels(rg[2 * s], rg[2 * s + 1], b, c, D, af, rf, not rf_out, H0, tl)
                np_[2 + s] = n
                tail += bd
        ngf = _grading(a, c, D, unit, H0)
        ngg = _grading(b, c, D, unit, H0)
        prev = 0.0
        out[p] = np.nan
        err[p] = np.inf
        for lv in range(widths.size):
            k = int(round(widths[0] / widths[lv]))
            val = 0.0
            valg = 0.0
            vabs = 0.0
            for s in range(2):
                sgn = -1.0 if s == 0 else 1.0
                if rf[2 * s] != 0.0 and np_[s] > 0:
                    vk, vg, va = _exp_side(rf[2 * s], rf[2 * s + 1], sgn, H0, np_[s], ngf, k, a, c, D, ag, rg,
                                           rf_out, X, W, WG)
                    val += vk
                    valg += vg
                    vabs += va
                if rg[2 * s] != 0.0 and np_[2 + s] > 0:
                    vk, vg, va = _exp_side(rg[2 * s], rg[2 * s + 1], sgn, H0, np_[2 + s], ngg, k, b, c, D, af, rf,
                                           not rf_out, X, W, WG)
                    val += vk
                    valg += vg
                    vabs += va
            # + rounding: the pieces can be far larger than their sum (at small K, b's constant -alpha 1{h<0}
            # and r = alpha e^h are O(1) while f is O(sqrt K)): 8 eps of the sum of their sizes
            e = abs(val - (valg if lv == 0 else prev)) + tail + 8.0 * _EPS64 * (babs + vabs)
            if e <= tol[p]:
                out[p] = base + val
                err[p] = e
                break
            prev = val
    return 0


class _ExpSplit:
    """f = b + r at a single breakpoint h = 0: b the kinked asymptote alpha . (relu(h), relu(-h), 1{h>0},
    1{h<0}) and r(h) = A- exp(lam- h) 1{h<0} + A+ exp(-lam+ h) 1{h>0} (lam > 0; A = 0 on a side where f is
    exactly linear). ELU: alpha = (1, 0, 0, -a), r = a e^h 1{h<0}; its derivative: alpha = (0, 0, 1, 0),
    r = a e^h 1{h<0}; SELU the same times lambda. ``rexp`` = (A-, lam-, A+, lam+)."""

    def __init__(self, alpha, rexp):
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.rexp = np.asarray(rexp, dtype=np.float64)

    @classmethod
    def of(cls, f, cuts):
        """The split of f, or None. f must have exactly one breakpoint, at 0; the slopes and constants of
        its asymptotes are read off at h = +-100, +-200, each side's remainder r = f - b is fitted as
        A exp(-lam |h|) from h = +-1/4, +-1/2 (or is 0), and the whole form is then checked: |f - b - r|
        must be at the rounding level of f, 8 eps (|a h| + |c| + |A| + 1), on every sampled |h| in
        (0, 1e16]."""
        cuts = np.asarray(cuts, dtype=np.float64).ravel()
        if not (cuts.size == 1 and cuts[0] == 0.0):
            return None

        def snap(v):
            return float(np.round(v)) if abs(v - np.round(v)) <= 1e-12 * (1 + abs(v)) else float(v)

        with np.errstate(all="ignore"):
            H = np.array([100.0, 200.0])
            fp, fm = f(H), f(-H)
            if not (np.all(np.isfinite(fp)) and np.all(np.isfinite(fm))):
                return None
            ap, am = snap((fp[1] - fp[0]) / 100.0), snap((fm[0] - fm[1]) / 100.0)
            cp, cm = snap(fp[0] - 100.0 * ap), snap(fm[0] + 100.0 * am)
            alpha = np.array([ap, -am, cp, cm])
            h = np.concatenate([np.arange(1.0 / 64, 60.0, 1.0 / 64), np.geomspace(60.0, _SPLIT_HMAX, 4000)])
            rexp = np.zeros(4)
            for s, (sgn, a, c) in enumerate(((-1.0, am, cm), (1.0, ap, cp))):
                q = f(sgn * np.array([0.25, 0.5])) - _base(alpha, sgn * np.array([0.25, 0.5]))
                floor = 8.0 * _EPS * (abs(a) + abs(c) + 1.0)
                if np.all(np.abs(q) <= floor):
                    A, lam = 0.0, 1.0
                else:
                    lam = snap(4.0 * np.log(q[0] / q[1]))
                    A = snap(q[0] * np.exp(0.25 * lam))
                    if not (np.isfinite(lam) and lam > 0 and np.isfinite(A)):
                        return None
                dev = f(sgn * h) - _base(alpha, sgn * h) - A * np.exp(-lam * h)
                if not np.all(np.abs(dev) <= 8.0 * _EPS * (np.abs(a * h) + abs(c) + abs(A) + 1.0)):
                    return None
                rexp[2 * s], rexp[2 * s + 1] = A, lam
        if rexp[0] == 0.0 and rexp[2] == 0.0:
            return None     # piecewise linear: the closed forms of the ReLU family
        return cls(alpha, rexp)


# ---------------------------------------------------------------------------
# E[f(u) g(v)] over arrays.
# ---------------------------------------------------------------------------
class ProductMoment:
    """(K1, K2, K12) -> E[f(u) g(v)], broadcasting over arrays (see the module notes).

    ``f``, ``g``: vectorised float64 numpy functions of one array; ``cuts_f``,
    ``cuts_g``: their breakpoints (kinks, jumps) in u and v; ``same``: g is f.
    ValueError where no method reaches the tolerance.
    """

    def __init__(self, f, g, cuts_f=(), cuts_g=(), same=False, parity=(None, None)):
        self.f, self.g = f, g
        # (parity of f, of g): 0 even, 1 odd, None neither (or not known)
        self.parity = (parity[0], parity[0] if same else parity[1])
        self.cuts_f = np.asarray(cuts_f, dtype=np.float64).ravel()
        self.cuts_g = np.asarray(cuts_g, dtype=np.float64).ravel()
        self.same = same
        self._energy = None   # (sorted K, E f(sqrt(K) z)^2) of the last coefficients (f = g only)

    def _nested(self):
        from .gaussian import interpreted_expect2

        f, g = self.f, self.g
        cv = np.concatenate([[0.0], self.cuts_g])
        return interpreted_expect2(lambda u, v: f(u) * g(v), self.cuts_f, cv)

    def __call__(self, K1, K2, K12):
        K1, K2, K12 = (np.asarray(a, dtype=np.float64) for a in (K1, K2, K12))
        shape = np.broadcast_shapes(K1.shape, K2.shape, K12.shape)
        if len(shape) == 2 and K1.shape == (shape[0], 1) and K2.shape == (1, shape[1]) and K12.shape == shape:
            return self._matrix(K1[:, 0], K2[0], K12)
        return self._generic(K1, K2, K12)

    def _generic(self, K1, K2, K12, start=0):
        """Any broadcastable arrays; ``start``: the first level of coefficients to try."""
        K1, K2, K12 = (np.asarray(a, dtype=np.float64) for a in (K1, K2, K12))
        shape = np.broadcast_shapes(K1.shape, K2.shape, K12.shape)
        # distinct variances from the arrays as given (K1 is usually a column, K2 a row)
        u1, inv1 = np.unique(K1, return_inverse=True)
        u2, inv2 = np.unique(K2, return_inverse=True)
        i1 = np.broadcast_to(inv1.reshape(K1.shape), shape).ravel()
        i2 = np.broadcast_to(inv2.reshape(K2.shape), shape).ravel()
        k1 = u1[i1]
        k2 = u2[i2]
        k12 = np.broadcast_to(K12, shape).ravel()
        out = np.full(k12.size, np.nan)
        ok = np.isfinite(k1) & np.isfinite(k2) & np.isfinite(k12) & (k1 >= 0) & (k2 >= 0)
        if not ok.all():
            # a non-finite state upstream stays NaN (kernels refuses it); a negative variance is a bug
            if np.any((k1 < 0) | (k2 < 0)):
                raise ValueError("K1 and K2 must be variances >= 0")
        with np.errstate(all="ignore"):
            d = np.sqrt(k1 * k2)
            rho = np.where(d > 0, np.clip(k12 / np.where(d > 0, d, 1.0), -1.0, 1.0), 0.0)
        identical = ok & (k1 == k2) & (k12 == k1)
        todo = ok & ~identical
        sym = (self.same and len(shape) == 2 and shape[0] == shape[1] and K12.shape == shape
               and K1.shape == (shape[0], 1) and K2.shape == (1, shape[0])
               and np.array_equal(K1.ravel(), K2.ravel()) and np.array_equal(K12, K12.T))
        if sym:
            # a symmetric Gram matrix (x2 = None): the upper triangle, mirrored at the end
            todo &= np.triu(np.ones(shape, dtype=bool)).ravel()
        pend = np.nonzero(todo)[0]
        if self._zero():
            out[pend] = 0.0
            pend = pend[:0]
        pend = self._levels(pend, start, rho, i1, i2, u1, u2, k1, k2, k12, out)
        if identical.any():
            self._identical(np.nonzero(identical)[0], i1, u1, out)
        self._beyond_series(pend, k1, k2, k12, out)
        out = out.reshape(shape)
        if sym:
            low = np.tril_indices(shape[0], -1)
            out[low] = out.T[low]
        return out

    def _levels(self, pend, start, rho, i1, i2, u1, u2, k1, k2, k12, out):
        """The Hermite series, level by level of :data:`LEVELS` from ``start``, on the flat entries ``pend``
        (rho their correlations, i1/i2 indices into the distinct variances u1/u2); writes ``out`` and returns
        the entries still pending."""
        for kmax, h0 in LEVELS[start:]:
            if pend.size and (kmax, h0) != LEVELS[0] and self._exp_splits() is not None:
                # an ELU-like f and g: what the first level leaves goes to the exponential split before the
                # higher levels, whose coefficients (~1000 nodes x kmax per variance) cost more than it and
                # rarely settle these entries (phi' jumps or kinks at 0: coefficients decay like powers of k)
                pend = self._exp_split(pend, k1, k2, k12, out)
            if pend.size == 0:
                break
            # coefficients only for the variances the pending entries use
            n1, n2 = _used(i1[pend], u1.size), _used(i2[pend], u2.size)
            ca = _Coefficients(self.f, self.cuts_f, u1[n1], kmax, h0, self.parity[0])
            if self.same and (kmax, h0) == LEVELS[0]:
                ok_e = ca.usable >= 0
                self._energy = (u1[n1][ok_e], ca.energy[ok_e])
            cb = ca if (self.same and np.array_equal(u1[n1], u2[n2])) else \
                _Coefficients(self.g, self.cuts_g, u2[n2], kmax, h0, self.parity[1])
            pos1 = np.zeros(u1.size, dtype=np.int64)
            pos1[n1] = np.arange(n1.size)
            pos2 = np.zeros(u2.size, dtype=np.int64)
            pos2[n2] = np.arange(n2.size)
            pend = self._series(pend, rho, pos1[i1], pos2[i2], ca, cb, kmax, out)
        return pend

    def _identical(self, idx, i1, u1, out):
        """The one-point E[f(u) g(u)] (the series' limit at rho = 1) at the flat entries ``idx`` with
        identical arguments (K1 = K2 = K12): the diagonal stays the one-point map."""
        need = _used(i1[idx], u1.size)
        vals = np.zeros(u1.size)
        # kernels asks for the off-diagonal entries first, then the diagonal at the same variances:
        # E[f^2] is then the energy of the coefficients just computed (the same rule and sum)
        known = np.zeros(need.size, dtype=bool)
        if self.same and self._energy is not None and self._energy[0].size:
            ku, ke = self._energy
            j = np.minimum(np.searchsorted(ku, u1[need]), ku.size - 1)
            known = ku[j] == u1[need]
            vals[need[known]] = ke[j[known]]
        rest = need[~known]
        if rest.size:
            vals[rest] = _one_point(self.f, self.g, np.union1d(self.cuts_f, self.cuts_g), u1[rest],
                                    LEVELS[0][1])
        out[idx] = vals[i1[idx]]

    def _beyond_series(self, pend, k1, k2, k12, out):
        """The entries no series level settled: the splits, the conditional rule, then the nested
        exp-sinh engine; ValueError where none reaches the tolerance."""
        if pend.size:
            pend = self._split(pend, k1, k2, k12, out)
        if pend.size:
            pend = self._conditional(pend, k1, k2, k12, out)
        if pend.size:
            E = self._nested()
            for p in pend:
                a, b = float(k1[p]), float(k2[p])
                # f = g: the arguments in one order, so that the matrix is exactly symmetric
                out[p] = E(b, a, float(k12[p])) if self.same and b < a else E(a, b, float(k12[p]))
            if np.any(np.isnan(out[pend])):
                bad = pend[np.isnan(out[pend])][0]
                raise ValueError(f"two-point Gaussian quadrature did not reach its tolerance at K1={k1[bad]:.6g}, "
                                 f"K2={k2[bad]:.6g}, K12={k12[bad]:.17g} (neither the Hermite series nor the "
                                 "nested exp-sinh rule); see meanfield.gram, Numerics")

    def _zero(self):
        """f odd and g even (or the reverse): E[f(u) g(v)] = 0 exactly ((u, v) -> (-u, -v))."""
        pf, pg = self.parity
        return pf is not None and pg is not None and pf != pg

    def _matrix(self, k1, k2, C):
        """A Gram matrix: K1 = k1 (n1,) down the rows, K2 = k2 (n2,) along the columns, K12 = C (n1, n2).

        The first level of coefficients is computed once for the distinct variances of the rows and
        columns together and summed by the compiled :func:`_gram_rows`; the entries it leaves go to
        the higher levels (the flat :func:`_series_sum`) and then to the nested engine, as in
        the general path."""
        if np.any(k1 < 0) or np.any(k2 < 0):
            raise ValueError("K1 and K2 must be variances >= 0")
        n1, n2 = k1.size, k2.size
        C = np.ascontiguousarray(C)
        sym = self.same and n1 == n2 and np.array_equal(k1, k2) and _is_symmetric(C)
        fin1, fin2 = np.isfinite(k1), np.isfinite(k2)
        out = np.empty((n1, n2))
        if self._zero():
            out[...] = 0.0
            out[~(fin1[:, None] & fin2[None, :] & np.isfinite(C))] = np.nan
            return out
        kmax, h0 = LEVELS[0]
        step = 2 if self.parity[0] is not None or self.parity[1] is not None else 1
        par = self.parity[0] if self.parity[0] is not None else (self.parity[1] or 0)
        if self.same:
            u, inv = np.unique(np.concatenate([k1[fin1], k2[fin2]]), return_inverse=True)
            ua, ub = u, u
            ia, ib = np.full(n1, -1), np.full(n2, -1)
            ia[fin1], ib[fin2] = inv[:fin1.sum()], inv[fin1.sum():]
            ca = cb = _Coefficients(self.f, self.cuts_f, u, kmax, h0, self.parity[0])
            ok_e = ca.usable >= 0
            self._energy = (u[ok_e], ca.energy[ok_e])
        else:
            ua, inva = np.unique(k1[fin1], return_inverse=True)
            ub, invb = np.unique(k2[fin2], return_inverse=True)
            ia, ib = np.full(n1, -1), np.full(n2, -1)
            ia[fin1], ib[fin2] = inva, invb
            ca = _Coefficients(self.f, self.cuts_f, ua, kmax, h0, self.parity[0])
            cb = _Coefficients(self.g, self.cuts_g, ub, kmax, h0, self.parity[1])
        ladder = np.array([N for N in _LADDER if N <= kmax], dtype=np.int64)
        sA = np.sqrt(ca.tail)
        gb = np.maximum(ib, 0)
        Bc = np.ascontiguousarray(cb.a[gb].T)
        sB = np.sqrt(cb.tail)
        # above a column's usable order no truncation passes (the row's is checked in the loop)
        sB[np.arange(kmax + 1)[None, :] > cb.usable[:, None]] = 1e300
        sBc = np.ascontiguousarray(sB[gb].T)
        eA, eBc = np.sqrt(ca.energy), np.sqrt(cb.energy)[gb]
        state = np.empty((n1, n2), dtype=np.int8)
        _gram_rows(k1, k2, C, ia.astype(np.int64), ib.astype(np.int64), np.ascontiguousarray(ca.a), Bc, sA, sBc,
                   eA, eBc, ca.usable.astype(np.int64), ladder, TOL, step, par, sym, self.same, out, state)
        if sym:
            state = np.triu(state)
        two = np.nonzero(state.ravel() == 2)[0]
        if two.size:
            # identical arguments without a one-point value from the series' rule
            r, c = np.unravel_index(two, (n1, n2))
            out[r, c] = self._generic(k1[r], k2[c], C[r, c])
        left = np.nonzero(state.ravel() == 1)[0]
        if left.size:
            r, c = np.unravel_index(left, (n1, n2))
            out[r, c] = self._generic(k1[r], k2[c], C[r, c], start=1)
        if sym and (two.size or left.size):
            low = np.tril_indices(n1, -1)
            out[low] = out.T[low]
        return out

    def _splits(self):
        if not hasattr(self, "_split_fg"):
            sf = _Split.of(self.f, self.cuts_f)
            sg = sf if self.same else _Split.of(self.g, self.cuts_g)
            self._split_fg = (sf, sg) if sf is not None and sg is not None else None
        return self._split_fg

    def _split(self, pend, k1, k2, k12, out):
        """The entries the series leaves, where f and g are asymptotically linear on each side (SiLU,
        softplus, GELU-like, tanh; :class:`_Split`) and both conditional standard deviations are >= 1:

            E[f(u) g(v)] = E[bf bg] + E[bf(u) rg(v)] + E[rf(u) bg(v)] + E[rf(u) rg(v)],

        f = bf + rf with bf the piecewise-linear asymptote smoothed by N(0, S0^2). The first term is
        closed (:func:`_base_pair`: (u, v) + S0 (w1, w2) in the arc-cosine kernels), the next two are
        one-dimensional over the localised r with E[bf(u) | v] in closed form (:func:`_cond_base`), the
        last is two-dimensional over the box where both r are nonzero (:func:`_split_rr`). Each is
        summed by the trapezoid rule on two grids offset by half a step in both variables (r is
        analytic, the Gaussian factors have widths >= 1, so the rule converges exponentially), the
        outermost nodes left out where a bound on their contribution allows (at most a quarter of the
        tolerance, :func:`_split_cross_one`, :func:`_split_rr`); an entry is accepted where the two
        differences (cross terms, product) and those bounds add up to at most TOL of sqrt(E f^2 E g^2),
        and takes the means. Step 1/2, then 1/4 for the entries left; the others are
        returned."""
        sp_ = self._splits()
        if sp_ is None:
            return self._exp_split(pend, k1, k2, k12, out)
        sf, sg = sp_
        a, b, c = self._ordered(pend, k1, k2, k12)
        with np.errstate(all="ignore"):
            D = a * b - c * c
            tau = np.sqrt(D / np.maximum(a, b))
            ok = ((a > 0) & (b > 0) & (a <= _SPLIT_KMAX) & (b <= _SPLIT_KMAX) & (tau >= _SPLIT_TAU)
                  & (np.abs(c) * sf.L * sg.L <= _SPLIT_EXP * D))
        sel = np.nonzero(ok)[0]
        if sel.size == 0:
            return pend
        scale = self._tolerances(a[sel], b[sel])
        done = np.zeros(pend.size, dtype=bool)
        s0sq = _SPLIT_S0 * _SPLIT_S0
        for step1, step2 in _SPLIT_STEPS:
            if sel.size == 0:
                break
            h1 = sf.halves(step1) + sg.halves(step1)
            g2 = sf.grids(step2) + sg.grids(step2)
            c2 = sf.cut(step2) + sg.cut(step2)
            val, err = np.empty(sel.size), np.empty(sel.size)
            _split_sum(np.ascontiguousarray(a[sel]), np.ascontiguousarray(b[sel]), np.ascontiguousarray(c[sel]),
                       sf.alpha, sg.alpha, s0sq, h1, g2, c2, _erfcx_table(), np.ascontiguousarray(scale), val, err)
            good = (err <= scale) & np.isfinite(val)
            out[pend[sel[good]]] = val[good]
            done[sel[good]] = True
            sel, scale = sel[~good], scale[~good]
        return pend[~done]

    def _ordered(self, pend, k1, k2, k12):
        """(K1, K2, K12) of the pending entries; with f = g the smaller variance first (the splits' order)."""
        a, b, c = k1[pend], k2[pend], k12[pend]
        if self.same:
            swap = b < a
            a, b = np.where(swap, b, a), np.where(swap, a, b)
        return a, b, c

    def _tolerances(self, a, b):
        """TOL * sqrt(E f(u)^2 E g(v)^2) per entry (Var u = a, Var v = b), from the one-point rule per
        distinct variance: the splits' acceptance threshold."""
        ua, ia = np.unique(a, return_inverse=True)
        ub, ib = np.unique(b, return_inverse=True)
        h0 = LEVELS[0][1]
        ef = _one_point(self.f, self.f, self.cuts_f, ua, h0)
        eg = ef if (self.same and np.array_equal(ua, ub)) else _one_point(self.g, self.g, self.cuts_g, ub, h0)
        return TOL * np.sqrt(np.abs(ef[ia] * eg[ib]))

    def _exp_splits(self):
        if not hasattr(self, "_exp_split_fg"):
            sf = _ExpSplit.of(self.f, self.cuts_f)
            sg = sf if self.same else _ExpSplit.of(self.g, self.cuts_g)
            self._exp_split_fg = (sf, sg) if sf is not None and sg is not None else None
        return self._exp_split_fg

    def _exp_split(self, pend, k1, k2, k12, out):
        """The entries the series leaves, where f and g have one breakpoint, at 0, and are linear plus an
        exponential on each side (ELU, SELU and their derivatives; :class:`_ExpSplit`), and both conditional
        standard deviations are > 0 (the rules' first panel is graded towards 0 where they or the
        variances are below 1): E[bf bg] in closed form and two one-dimensional integrals over the
        remainders' half-lines with closed-form conditional expectations (:func:`_exp_split_sum`), each on
        Gauss-Kronrod panels with edges at the breakpoint, two panel widths compared per entry; accepted
        where they agree to TOL of sqrt(E f^2 E g^2). The others are returned."""
        sp_ = self._exp_splits()
        if sp_ is None:
            return pend
        sf, sg = sp_
        a, b, c = self._ordered(pend, k1, k2, k12)
        with np.errstate(all="ignore"):
            tau = np.sqrt((a * b - c * c) / np.maximum(a, b))
            ok = (a > 0) & (b > 0) & (a <= _SPLIT_KMAX) & (b <= _SPLIT_KMAX) & (tau > _EXP_TAU)
        sel = np.nonzero(ok)[0]
        if sel.size == 0:
            return pend
        tol = self._tolerances(a[sel], b[sel])
        lam = max(1.0, sf.rexp[1], sf.rexp[3], sg.rexp[1], sg.rexp[3])
        val, err = np.empty(sel.size), np.empty(sel.size)
        _exp_split_sum(np.ascontiguousarray(a[sel]), np.ascontiguousarray(b[sel]), np.ascontiguousarray(c[sel]),
                       sf.alpha, sg.alpha, sf.rexp, sg.rexp, 1.0 / lam, _EXP_WIDTHS, tol, _K15_X, _K15_W, _G7_W,
                       val, err)
        good = (err <= tol) & np.isfinite(val)
        out[pend[sel[good]]] = val[good]
        done = np.zeros(pend.size, dtype=bool)
        done[sel[good]] = True
        return pend[~done]

    def _conditional(self, pend, k1, k2, k12, out):
        """The entries the series leaves (near-parallel pairs at large K of a ReLU-like phi: SiLU,
        softplus, GELU-like user activations), by the conditional form

            E[f(u) g(v)] = E_z[ f(s1 z) E_w[ g(s2 rho z + sigma w) ] ],   sigma = s2 sqrt(1 - rho^2),

        (z, w) independent standard normals, vectorised over the entries: the outer integral on the
        exp-sinh rule from z = 0 at step 1/32 (the one-point engine's base rule), the inner one on the
        trapezoid rule in w (|w| <= 9, step 1/2 down to 1/32 as sigma grows: g(m + sigma w) is analytic in a
        strip of half-width d / sigma when g is in one of half-width d). Each level is checked against
        the rule of twice its step, both to TOL_COEFF of sqrt(E f^2 E g^2) (the two expectations on the same
        nodes): the finer rules are then at rounding level, as in the one-point engine. Only for f and g
        without breakpoints (a kink is not analytic: the nested engine takes those); entries that fail
        either check, or whose sigma is above 16, are returned for the nested engine."""
        if self.cuts_f.size or self.cuts_g.size:
            return pend
        a, b, c = k1[pend], k2[pend], k12[pend]
        if self.same:
            # one order of the arguments, so that E(a, b) = E(b, a) to the last bit
            swap = b < a
            a, b = np.where(swap, b, a), np.where(swap, a, b)
        with np.errstate(all="ignore"):
            s1, s2 = np.sqrt(a), np.sqrt(b)
            d = s1 * s2
            rho = np.where(d > 0, np.clip(c / np.where(d > 0, d, 1.0), -1.0, 1.0), 0.0)
            sig = s2 * np.sqrt((1.0 - rho) * (1.0 + rho))
        m = s2 * rho
        z, w, wc = _rule(_NO_CUTS, _COND_H)
        done = np.zeros(pend.size, dtype=bool)
        for hw in _COND_W_STEPS:
            sel = np.nonzero(~done & (sig * hw <= _COND_SH) & (s1 > 0) & (s2 > 0))[0]
            if sel.size == 0:
                continue
            t, tw, twc = _trap_rule(hw, _COND_W)
            chunk = max(1, 2_000_000 // (z.size * t.size))
            for lo in range(0, sel.size, chunk):
                e = sel[lo:lo + chunk]
                with np.errstate(all="ignore"):
                    F = self.f(s1[e, None] * z[None, :])
                    G = self.g(m[e, None, None] * z[None, :, None] + sig[e, None, None] * t[None, None, :])
                    Gi, Gic, G2 = G @ tw, G @ twc, (G * G) @ tw
                    FG = F * Gi
                    val = FG @ w
                    scale = np.sqrt(((F * F) @ w) * (G2 @ w))
                    good = (np.abs(val - FG @ wc) <= TOL_COEFF * scale) \
                        & (np.abs(val - (F * Gic) @ w) <= TOL_COEFF * scale) & np.isfinite(val)
                out[pend[e[good]]] = val[good]
                done[e[good]] = True
        return pend[~done]

    @staticmethod
    def _series(pend, rho, i1, i2, ca, cb, kmax, out):
        """Sum the series where its bound passes; return the entries it did not settle."""
        ladder = np.array([N for N in _LADDER if N <= kmax], dtype=np.int64)
        vals = np.empty(pend.size)
        order = _series_sum(np.ascontiguousarray(i1[pend]), np.ascontiguousarray(i2[pend]),
                            np.ascontiguousarray(rho[pend]), ca.at, cb.at, ca.energy, cb.energy, ca.tail, cb.tail,
                            ca.usable.astype(np.int64), cb.usable.astype(np.int64), ladder, TOL, vals)
        done = order >= 0
        out[pend[done]] = vals[done]
        return pend[~done]


# ---------------------------------------------------------------------------
# The hook: two-point expectations of products in an expression.
# ---------------------------------------------------------------------------
def separable_factors(lam: sp.Lambda):
    """(c, P(x), Q(x)) with lam(x, y) = c P(x) Q(y), c a number, or None when the integrand does not
    factor. The constant is kept apart so that phi(x) phi(y) with phi = lambda * psi (SELU) is seen as
    a product of one function with itself."""
    a, b = lam.variables
    expr = sp.sympify(lam.expr)
    c, P, Q = sp.Integer(1), sp.Integer(1), sp.Integer(1)
    for fac in sp.Mul.make_args(expr):
        fs = fac.free_symbols
        if not fs:
            c = c * fac
        elif b not in fs:
            P = P * fac
        elif a not in fs:
            Q = Q * fac
        else:
            return None
    if (P.free_symbols | Q.free_symbols) - {a, b} or not c.is_number:
        return None
    return c, P, Q.subs(b, a)


def _parity(expr, x):
    """0 if expr(-x) = expr(x), 1 if expr(-x) = -expr(x) (proved by sympy), else None. Half of the Hermite
    coefficients of an even or odd function vanish, and the series is then summed in rho^2."""
    e = sp.sympify(expr)
    m = e.subs(x, -x)
    for p, d in ((0, m - e), (1, m + e)):
        try:
            if d == 0 or sp.simplify(d) == 0:
                return p
        except Exception:  # noqa: BLE001  (a form sympy cannot simplify: no parity, only slower)
            return None
    return None


def _polynomially_bounded(f) -> bool:
    """Whether |f(h)| <= (1 + max |f(+-1)|) (1 + |h|)^8 at h = +-1e2, +-1e4: the rules here (the trapezoid
    grid |z| <= 13, tail nodes dropped where w exp(z^2 / 4) < 1e-22) assume that f grows at most like a
    polynomial; an exponential one (exp(x), sinh(x)) put the integrand's mass beyond them, so its Gram
    matrices were silently wrong (5e-10 at K = 15) or crashed. A numerical probe, not a proof: sympy's
    limits take seconds on gelu_tanh' and fail on Piecewise."""
    h = np.array([-1e4, -1e2, 1e2, 1e4])
    with np.errstate(all="ignore"):
        v = np.abs(f(h))
        ref = 1.0 + np.max(np.abs(f(np.array([-1.0, 1.0]))))
    return bool(np.all(np.isfinite(v)) and np.all(v <= ref * (1.0 + np.abs(h)) ** 8))


def vectorise_expectations(exprs):
    """Replace the two-point expectations of products f(u) g(v) in ``exprs`` by :class:`ProductMoment`
    calls. Returns (exprs', namespace); other expectations are left for
    :func:`meanfield.gaussian.numeric_expectations`."""
    from .gaussian import GaussianExpectation2, numpy_function, pieces

    namespace, names = {}, {}

    def replace(node):
        lam = node.args[0]
        fac = separable_factors(lam)
        if fac is None:
            return node
        if lam not in names:
            x = lam.variables[0]
            c, P, Q = fac
            same = sp.simplify(P - Q) == 0
            f = numpy_function(sp.Lambda(x, P))
            g = f if same else numpy_function(sp.Lambda(x, Q))
            if not (_polynomially_bounded(f) and (same or _polynomially_bounded(g))):
                return node   # exp(x), sinh(x): the general engine, whose rules reach any |z|
            cf = pieces(sp.Lambda(x, P)).float_cuts
            cg = cf if same else pieces(sp.Lambda(x, Q)).float_cuts
            name = f"_mf_G{len(names)}"
            pm = ProductMoment(f, g, cf, cg, same, (_parity(P, x), _parity(Q, x)))
            c = float(c)
            namespace[name] = pm if c == 1.0 else (lambda K1, K2, K12, pm=pm, c=c: c * pm(K1, K2, K12))
            names[lam] = sp.Function(name)
        return names[lam](*node.args[1:])

    out = [sp.sympify(e).replace(lambda e: isinstance(e, GaussianExpectation2), replace) for e in exprs]
    return out, namespace
