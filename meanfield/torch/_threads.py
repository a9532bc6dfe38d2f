"""numba's threaded kernels kept inside torch's thread budget.

The Monte-Carlo networks call a few ``parallel=True`` numba kernels on the CPU
(the Philox normals, the fused Dense epilogue, float32 erf). Where numba finds
OpenMP it uses it as its threading layer, and that is the libgomp torch uses
too: when numba starts its pool it sets the process's OpenMP thread count to
its own (every core). A process that had asked torch for one thread
(``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``: a Dask worker, a
pytest-xdist worker, a user sharing a machine) then ran every later torch
operation on every core, with spinning OpenMP workers; with two such
processes on two cores the deep-and-wide Monte-Carlo tests ran ~25x slower
(test_gram_tokens' deep Mixer case: 23 s alone, 625 s in the suite).

:func:`run_threaded` gives the kernel torch's thread count and puts torch's
count back afterwards.
"""
from __future__ import annotations

import numba
import torch

__all__ = ["run_threaded"]


def run_threaded(kernel, *args):
    """``kernel(*args)`` on at most ``torch.get_num_threads()`` threads, torch's thread count unchanged after."""
    threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        return kernel(*args)
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
