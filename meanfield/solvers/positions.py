r"""Fixed points, partial Jacobians and phases of trees over positions (zero-padded convolutions, pooling,
LayerNorm over positions), where the statistics differ from position to position and no scalar recursion
exists (partial-Jacobian paper section 6 and appendix B; issue 25, item 2).

The state of one input is the covariance A[p, q] = E[h_{c,p} h_{c,q}] between its positions (and B, the part
common to all channels), which a block maps by its primitives' ``gram_tokens`` rules
(:mod:`meanfield.gram.tokens`). Its fixed point A* is found by walking the block from the input layer's
state of an input whose positions are orthonormal, A^1 = sigma_w^2 I + sigma_b^2 1 1^T (every position of
unit norm per feature, no two positions alike).

At A* the Jacobian between positions, V[p, q] = 1/C sum_c sum_j (dh_{c,p} / dh^{l0}_j)(dh_{c,q} / dh^{l0}_j),
maps linearly from block to block, V -> L(V) (the rules of :func:`meanfield.gram.tokens.token_jacobians`),
and the APJN is J^{l0,l} = mean_p V_l[p, p]. Two numbers describe it:

* ``chi_J`` = mean_p L(I)[p, p], the factor J^{l,l+1} of one block at the fixed point (what Monte Carlo
  measures between two deep blocks with fresh probes; the partial-Jacobian paper's chi_J*);
* ``spectral_radius`` rho = lim (J^{l0,l})^{1 / (l - l0)}: the growth rate of the APJN across many blocks,
  the dominant eigenvalue of L (a positive map: it takes positive semi-definite V to positive
  semi-definite V, so rho is an eigenvalue with a positive semi-definite eigenvector, Krein-Rutman), found by
  power iteration. Where L maps I to a multiple of I (a homogeneous network) rho = chi_J; in general they
  differ, and rho decides the phase: ordered (rho < 1), critical, chaotic (rho > 1); the correlation
  length is xi = 1 / |log rho|.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .._serialize import Result
from .._validate import check_int, check_real

__all__ = ["PositionFixedPoint", "position_fixed_point", "position_phase_diagram"]


@dataclass(frozen=True, repr=False)
class PositionFixedPoint(Result):
    """The fixed point of a tree over positions and its APJN operator (module notes).

    ``K`` (grid shape): E[h_p^2] at the fixed point, position by position; ``chi_J``: J^{l,l+1} of one block
    there; ``spectral_radius``: the growth rate of J^{l0,l} over many blocks; ``mode`` (grid shape): the
    diagonal of the dominant eigenvector of the Jacobian map, normalised to mean 1 (where the Jacobian
    mass settles); ``xi`` = 1 / |log spectral_radius|; ``phase``: 'ordered', 'critical' (|rho - 1| <= tol),
    'chaotic', or 'undetermined' where the walk did not settle within ``max_blocks`` (then the numbers are
    those of the last block, NaN). ``blocks``: blocks walked to the fixed point.
    """

    architecture: object
    sigma_w: float
    sigma_b: float
    grid: tuple
    K: np.ndarray
    chi_J: float
    spectral_radius: float
    mode: np.ndarray
    xi: float
    phase: str
    blocks: int
    converged: bool


def _walk(spec, grid):
    """The block, the walk and the checked grid of positions."""
    from ..calculus import as_architecture

    spec = as_architecture(spec)
    spec.require_values("position_fixed_point")
    if not spec.has_tokens:
        raise ValueError("arch has no positions; use meanfield.fixed_point for a tree with a scalar recursion")
    sampled = [p for p in spec.nodes() if getattr(p, "sampled", False)]
    if sampled:
        raise ValueError(f"{sampled[0].short()}: its expectation is sampled (1/sqrt(d) logits), and the fixed point "
                         "of a sampled map has no error estimate here yet; use token_jacobians over many blocks, "
                         "or scaling='1/d'")
    grid = tuple(check_int("grid", g, 1) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
    if len(grid) != spec.position_dims:
        raise ValueError(f"grid={grid}: the tree's convolutions run over {spec.position_dims} position axes; "
                         f"give {spec.position_dims} sizes")
    return spec, grid


def position_fixed_point(arch, grid, sigma_w, sigma_b, *, tol=1e-12, max_blocks=20000, phase_tol=1e-6):
    """The fixed point of ``arch``'s block on one input with positions ``grid`` ((T,) or (H, W)), its APJN
    factor ``chi_J`` and the spectral radius of its Jacobian map (:class:`PositionFixedPoint`, module notes).

    ``tol``: the walk stops when max |A^{l+1} - A^l| <= tol max |A^l| (and the power iteration when two
    estimates of rho differ by <= tol rho); ``max_blocks`` bounds both. ``phase_tol``: the half-width of the
    band |rho - 1| <= phase_tol called critical. A block that changes the positions (a stride, 'valid'
    padding) has no fixed point: ValueError.
    """
    from ..gram.tokens import TokenWalk
    from ..layers.state import TokenSignal

    spec, grid = _walk(arch, grid)
    sw = float(check_real("sigma_w", sigma_w, minimum=0))
    sb = float(check_real("sigma_b", sigma_b, minimum=0))
    tol = float(check_real("tol", tol, minimum=0))
    phase_tol = float(check_real("phase_tol", phase_tol, minimum=0))
    max_blocks = check_int("max_blocks", max_blocks, 1)
    T = int(np.prod(grid))
    A = (sw**2 * np.eye(T) + sb**2).reshape(1, T, 1, T)
    s = TokenSignal(A, np.zeros_like(A), grid=grid)
    walk = TokenWalk.of(spec, sw, sb)
    block = spec.block_spec()
    converged, blocks = False, 0
    with np.errstate(all="ignore"):
        for blocks in range(1, max_blocks + 1):
            nxt = block.gram_tokens(replace(s, J=None), walk)
            if nxt.A.shape != s.A.shape:
                raise ValueError(f"{spec}: its block maps the positions {grid} to {nxt.grid}; a block that "
                                 "changes the positions has no fixed point (no stride or 'valid' padding)")
            step = np.max(np.abs(nxt.A - s.A))
            s = nxt
            if not np.all(np.isfinite(s.A)):
                break
            if step <= tol * np.max(np.abs(s.A)):
                converged = True
                break
        chi, rho, mode = _jacobian_map(block, s, walk, T, tol, max_blocks) if converged else (np.nan, np.nan,
                                                                                            np.full(T, np.nan))
    K = np.diagonal(s.A.reshape(T, T)).reshape(grid) if converged else np.full(grid, np.nan)
    xi = np.inf if abs(rho - 1.0) <= 8 * np.finfo(float).eps else 1.0 / abs(np.log(rho)) if converged else np.nan
    phase = ("undetermined" if not converged else "critical" if abs(rho - 1.0) <= phase_tol
             else "ordered" if rho < 1.0 else "chaotic")
    return PositionFixedPoint(spec, sw, sb, grid, K, float(chi), float(rho), mode.reshape(grid), float(xi), phase,
                              blocks, converged)


def _jacobian_map(block, s, walk, T, tol, max_iter):
    """chi_J = mean diag L(I), and (rho, the eigenvector's diagonal) of L by power iteration at the state s."""

    def L(V):
        return block.gram_tokens(replace(s, J=V.reshape(1, T, T, 1)), walk).J.reshape(T, T)

    V = L(np.eye(T))
    chi = float(np.trace(V) / T)
    rho_old, rho = np.nan, chi
    for _ in range(max_iter):
        V = V / (np.trace(V) / T)
        W = L(V)
        rho_old, rho = rho, float(np.trace(W) / T)
        V = W
        if abs(rho - rho_old) <= tol * abs(rho):
            break
    d = np.diagonal(V) / (np.trace(V) / T)
    return chi, rho, d


def position_phase_diagram(arch, grid, sigma_w, sigma_b, **options):
    """:func:`position_fixed_point` on the grid sigma_w x sigma_b (1-D arrays): a dict of float arrays
    ``chi_J``, ``spectral_radius``, ``xi`` and a str array ``phase``, each of shape (len(sigma_w),
    len(sigma_b)); ``options`` as for :func:`position_fixed_point`."""
    sw = np.atleast_1d(np.asarray(sigma_w, dtype=np.float64))
    sb = np.atleast_1d(np.asarray(sigma_b, dtype=np.float64))
    if sw.ndim != 1 or sb.ndim != 1 or not sw.size or not sb.size:
        raise ValueError(f"position_phase_diagram takes non-empty 1-D sigma_w and sigma_b, got shapes {sw.shape} "
                         f"and {sb.shape}")
    out = {k: np.full((sw.size, sb.size), np.nan) for k in ("chi_J", "spectral_radius", "xi")}
    out["phase"] = np.full((sw.size, sb.size), "undetermined", dtype="<U12")
    for i, w in enumerate(sw):
        for j, b in enumerate(sb):
            r = position_fixed_point(arch, grid, w, b, **options)
            for k in ("chi_J", "spectral_radius", "xi", "phase"):
                out[k][i, j] = getattr(r, k)
    return out
