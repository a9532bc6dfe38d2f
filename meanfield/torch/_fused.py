r"""numba kernels for the Monte-Carlo networks on the CPU: a Dense layer's scale and bias in one pass, and erf.

After the shared product ``y = z G^T`` a Dense layer (``Dense.torch_forward``, :mod:`meanfield.layers.linear`)
applies, per parameter point p,

    y[i, p, 0] = y[i, p, 0] * scale[p] + sigma_b[p] * g[i]     (primal slot: W h + b)
    y[i, p, s] = y[i, p, s] * scale[p]                           (tangent slots s >= 1: W t)

with ``scale = sigma_w / sqrt(fan_in)``. In torch that is ``y.mul_(scale)``, a
full-size temporary ``sigma_b * g`` and an in-place add: three passes over
memory and a fresh allocation per layer. The kernel below does one pass, with
the same float operations in the same order (a product, a product, a sum, each
rounded; numba contracts nothing into an FMA without ``fastmath``), so its
result is bit for bit torch's (``tests/test_fused_epilogue.py`` checks this).

``erf32`` is erf for float32 arrays (used by float32 erf networks,
``ActivationLayer.torch_forward``): a rational fit evaluated in float64 and
rounded once, within 0.54 ulp of erf (torch's float32 erf: 0.74 ulp), ~20 %
cheaper than ``torch.erf`` here. ``context.FUSED_EPILOGUE`` and
``context.FAST_ERF`` switch the two off. CUDA tensors never come here.

Measured (``benchmarks/mc_throughput.py``): benchmarks/README.md, section
mc_throughput.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._cache import install_locator
from ._threads import run_threaded

install_locator()

__all__ = ["affine_", "erf32"]

# erf(x) = x P(x^2) / Q(x^2) on |x| <= 4 (and erf(+-4) = +-1 in float32): a rational fit of degrees 6 / 5 in
# x^2 (relative-error least squares, Loeb's iteration, against scipy.special.erf; Q > 0 on [0, 16]), evaluated
# in float64 and rounded once, so the float32 result is within 0.54 ulp of erf (tests/test_fused_epilogue.py
# checks it against scipy's float64 erf on 2.4 M points; torch's float32 erf here: 0.74 ulp)
_EP = (1.1283791684735252, 0.1852246297866323, 0.054336838584321534, 0.0038528585066118035,
       0.00038038169188122414, 4.7040780104742885e-06, -1.3300523571402323e-08)
_EQ = (1.0, 0.4974844589354158, 0.11398242102028804, 0.01547104994733144, 0.001309298121211471,
       6.32970313501199e-05)
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = _EP
_Q0, _Q1, _Q2, _Q3, _Q4, _Q5 = _EQ


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


def _erf_py(x, out):
    """out = erf(x) elementwise (1-d, float32 in and out; NaN stays NaN, +-inf gives +-1)."""
    for k in prange(x.size):
        v = np.float64(x[k])
        v = 4.0 if v > 4.0 else v       # comparisons (not min/max) so that NaN passes through
        v = -4.0 if v < -4.0 else v
        t = v * v
        p = ((((((_P6 * t + _P5) * t + _P4) * t + _P3) * t + _P2) * t + _P1) * t + _P0)
        q = (((((_Q5 * t + _Q4) * t + _Q3) * t + _Q2) * t + _Q1) * t + _Q0)
        out[k] = np.float32(v * p / q)


# error_model="numpy": numba's default checks every division for a zero divisor, which stops LLVM from
# vectorising the loop (4x slower here); Q >= 1 never vanishes
_erf = njit(parallel=True, cache=True, nogil=True, error_model="numpy", fastmath={"contract"})(_erf_py)
_erf_serial = njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})(_erf_py)


def erf32(x: np.ndarray) -> np.ndarray:
    """erf of a C-contiguous float32 array, to 0.54 ulp (a new array; see the constants above)."""
    out = np.empty_like(x)
    if x.size >= _PARALLEL_MIN:
        run_threaded(_erf, x.reshape(-1), out.reshape(-1))
    else:
        _erf_serial(x.reshape(-1), out.reshape(-1))
    return out


_affine = njit(parallel=True, cache=True, nogil=True)(_affine_py)
_affine_serial = njit(cache=True, nogil=True)(_affine_py)
_PARALLEL_MIN = 1 << 18      # elements from which the threaded kernel is used


def affine_(y: np.ndarray, scale: np.ndarray, sb: np.ndarray, g: np.ndarray) -> np.ndarray:
    """In place: ``y[:, :, 0] = y[:, :, 0] * scale + sb * g``, ``y[:, :, 1:] *= scale`` (see the module)."""
    if y.size >= _PARALLEL_MIN:
        run_threaded(_affine, y, scale, sb, g)
    else:
        _affine_serial(y, scale, sb, g)
    return y
