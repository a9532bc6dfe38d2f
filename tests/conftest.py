"""Shared test set-up: thread counts, and the ``mp_smooth2`` fixture.

``mp_smooth2`` is tests/references/gaussian.py's :func:`expect_smooth_pair`, a two-dimensional
mpmath reference for *smooth* integrands (the plain trapezoid rule; its accuracy is checked against
exact formulas in tests/test_gaussian.py). The other independent references are in tests/references.
"""
import os

# Small matrices: one BLAS/OpenMP thread is faster than two fighting over CI's
# two cores (and over numba). Set before anything imports torch; notebook
# kernels started by the tests inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402

from references import expect_smooth_pair  # noqa: E402


@pytest.fixture(scope="session")
def mp_smooth2():
    """The trapezoid mpmath reference for E[a(u) b(v)] (smooth a, b)."""
    return expect_smooth_pair
