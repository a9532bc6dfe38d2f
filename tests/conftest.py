"""Shared test helpers: independent mpmath references that are not package code.

``mp_smooth2`` is a two-dimensional mpmath reference for *smooth* integrands
(tanh, SiLU, softplus, sin): the plain trapezoid rule in (z1, z2) on a
uniform grid, which for a Gaussian weight times a function analytic in a
strip |Im z| < d converges like exp(-2 pi d / step) (Trefethen & Weideman,
SIAM Rev. 2014). It shares nothing with the package's exp-sinh rule; its
accuracy is checked against exact formulas in tests/test_gaussian.py.
"""
import os

# Small matrices: one BLAS/OpenMP thread is faster than two fighting over CI's
# two cores (and over numba). Set before anything imports torch; notebook
# kernels started by the tests inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import mpmath as mp  # noqa: E402
import pytest  # noqa: E402


def _mp_smooth2(a, b, K1, K2, K12, step=0.125, half_width=9.5, dps=20):
    """E[a(u) b(v)] for a zero-mean Gaussian pair (Var u = K1, Var v = K2, Cov = K12).

    u = sqrt(K1) z1, v = sqrt(K2) (rho z1 + sqrt(1 - rho^2) z2), trapezoid rule
    with ``step`` on [-half_width, half_width]^2 (tails below e^-45).
    ``a`` and ``b`` take and return mpmath numbers. Only for smooth a, b.
    """
    with mp.workdps(dps):
        K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
        rho = K12 / mp.sqrt(K1 * K2)
        c = mp.sqrt(max(1 - rho * rho, mp.mpf(0)))
        s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
        h = mp.mpf(step)
        n = int(half_width / step)
        z = [k * h for k in range(-n, n + 1)]
        w = [h * mp.exp(-zk * zk / 2) / mp.sqrt(2 * mp.pi) for zk in z]
        total = mp.mpf(0)
        for zi, wi in zip(z, w):
            inner = mp.fsum(wj * b(s2 * (rho * zi + c * zj)) for zj, wj in zip(z, w))
            total += wi * a(s1 * zi) * inner
        return total


@pytest.fixture(scope="session")
def mp_smooth2():
    """The trapezoid mpmath reference for E[a(u) b(v)] (smooth a, b)."""
    return _mp_smooth2
