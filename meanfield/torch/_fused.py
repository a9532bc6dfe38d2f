r"""Fused element-wise epilogue of a batched Dense layer on the CPU (scale and bias in one pass).

After the shared product ``y = z G^T`` a Dense layer (:class:`~.networks.RDense`)
applies, per parameter point p,

    y[i, p, 0] = y[i, p, 0] * scale[p] + sigma_b[p] * g[i]     (primal slot: W h + b)
    y[i, p, s] = y[i, p, s] * scale[p]                           (tangent slots s >= 1: W t)

with ``scale = sigma_w / sqrt(fan_in)``. In torch that is ``y.mul_(scale)``, a
full-size temporary ``sigma_b * g`` and an in-place add: three passes over
memory and a fresh allocation per layer. The kernel below does one pass, with
the same float operations in the same order (a product, a product, a sum, each
rounded; numba contracts nothing into an FMA without ``fastmath``), so its
result is bit for bit torch's (``tests/test_philox.py`` checks this).

Measured (``benchmarks/mc_throughput.py``): see benchmarks/README.md, section
mc_throughput.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._cache import install_locator

install_locator()

__all__ = ["affine_"]


def _affine_py(y, scale, sb, g):
    """y: (I, P, S, R, N) in place; scale, sb: (P,); g: (I, N). Slot 0 gets the bias."""
    I, P, S, R, N = y.shape
    for t in prange(I * P):
        i = t // P
        p = t % P
        a = scale[p]
        c = sb[p]
        gi = g[i]
        for r in range(R):
            row = y[i, p, 0, r]
            for n in range(N):
                row[n] = row[n] * a + c * gi[n]
        for s in range(1, S):
            for r in range(R):
                row = y[i, p, s, r]
                for n in range(N):
                    row[n] = row[n] * a


_affine = njit(parallel=True, cache=True, nogil=True)(_affine_py)
_affine_serial = njit(cache=True, nogil=True)(_affine_py)
_PARALLEL_MIN = 1 << 18      # elements from which the threaded kernel is used


def affine_(y: np.ndarray, scale: np.ndarray, sb: np.ndarray, g: np.ndarray) -> np.ndarray:
    """In place: ``y[:, :, 0] = y[:, :, 0] * scale + sb * g``, ``y[:, :, 1:] *= scale`` (see the module)."""
    (_affine if y.size >= _PARALLEL_MIN else _affine_serial)(y, scale, sb, g)
    return y
