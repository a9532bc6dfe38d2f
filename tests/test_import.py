"""`import meanfield` is light: no torch, and well under a second.

Both are measured in fresh subprocesses (a module already imported by the
test session would hide the cost). ``import meanfield`` alone loads nothing
heavy (names load on first use), so the checks touch a solver name too,
which loads the symbolic layer (sympy) and the solvers.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

TIMED = """
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
import meanfield
meanfield.critical_line
print(time.perf_counter() - t0, time.process_time() - c0, 'torch' in sys.modules)
"""


def _run(args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=120, check=True)


@pytest.mark.slow
def test_importtime_shows_no_torch():
    out = _run(["-X", "importtime", "-c", "import meanfield; meanfield.critical_line"])
    modules = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
               if line.startswith("import time:")]
    assert "meanfield" in modules and "sympy" in modules  # the output is what we think it is
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]


@pytest.mark.slow
def test_import_is_fast():
    runs = []
    for _ in range(3):
        wall, cpu, has_torch = _run(["-c", TIMED]).stdout.split()
        assert has_torch == "False"
        runs.append((float(wall), float(cpu)))
    wall, cpu = min(runs)
    # Wall time is the requirement. On a machine busier than its core count the
    # wall clock measures the neighbours, so there the CPU time must meet it.
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] > (os.cpu_count() or 1)
    assert wall < 1.0 or (busy and min(c for _, c in runs) < 1.0), (
        f"import meanfield took {wall:.2f} s wall, {cpu:.2f} s CPU (best of 3)")


def test_import_alone_loads_nothing_heavy():
    code = ("import sys, meanfield; heavy = [m for m in ('numpy', 'sympy', 'numba', 'scipy', 'torch') "
            "if m in sys.modules]; meanfield.symbols.x; print(heavy, 'sympy' in sys.modules)")
    assert _run(["-c", code]).stdout.split() == ["[]", "True"]
