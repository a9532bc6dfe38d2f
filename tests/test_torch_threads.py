"""The Monte-Carlo networks' numba kernels leave torch's thread count as the user set it.

numba's OpenMP threading layer shares torch's libgomp, and starting its pool set
the process's OpenMP thread count to every core: a process at one torch thread
(a Dask or pytest-xdist worker) then ran all later torch work oversubscribed
(meanfield/torch/_threads.py). The pool starts once per process, so each case
runs in a fresh interpreter.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

_PROGRAM = textwrap.dedent("""
    import numba, numpy as np, torch
    torch.set_num_threads(1)
    from meanfield.torch import _fused, _philox
    _philox.standard_normal(3, range(8), 0, (512, 512), dtype=np.float32)
    print("philox", torch.get_num_threads())
    _fused.affine_(np.ones((2, 2, 2, 1, 1 << 17)), np.ones(2), np.ones(2), np.ones((2, 1 << 17)))
    print("affine", torch.get_num_threads())
    _fused.erf32(np.linspace(-3, 3, 1 << 19, dtype=np.float32))
    print("erf32", torch.get_num_threads())
    print("layer", numba.threading_layer())
""")


@pytest.mark.slow
def test_threaded_kernels_keep_torch_at_one_thread():
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS=str(max(2, os.cpu_count() or 2)))
    out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = dict(line.split() for line in out.stdout.splitlines())
    assert all(report[k] == "1" for k in ("philox", "affine", "erf32")), f"torch threads after each kernel: {report}"
