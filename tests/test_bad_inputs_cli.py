"""Bad input on the command line and in the verification suite: a clear one-line error or a valid result.

Each row runs ``python -m meanfield ...`` (or the suite's module) in a
subprocess with a time limit, from an empty temporary folder, and is
classified:

- ``usage``: exit status 2, stderr one line (compile notices aside) that
  names the offending option or value, stdout empty;
- ``runtime``: exit status 1, one line on stderr (a file that cannot be
  written, a broken pipe);
- ``ok``: exit status 0 and output that parses (JSON where asked for).

A traceback anywhere, a hang (the time limit), or exit 0 on bad input fails
the row.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# ~90 subprocesses (each imports numpy and sympy): part of the full run (CI), not of `-m "not slow"`;
# tests/test_cli.py keeps a few usage-error rows in the fast subset
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 300  # seconds per row; every row answers in seconds once the cache is warm


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("MEANFIELD_DEBUG", None)
    return env


def _run(argv, cwd, module="meanfield", stdin=None, shell_pipe=None):
    if shell_pipe:
        cmd = f"{sys.executable} -m {module} {' '.join(argv)} | {shell_pipe}"
        return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=LIMIT,
                              cwd=cwd, env=_env())
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=LIMIT,
                          cwd=cwd, env=_env(), stdin=subprocess.DEVNULL)


def _error_lines(stderr):
    return [ln for ln in stderr.strip().splitlines()
            if ln.strip() and not ln.startswith("meanfield: compiling") and "warning" not in ln.lower()]


def _check(proc, kind, needle):
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-2000:]
    if kind in ("usage", "runtime"):
        want = 2 if kind == "usage" else 1
        assert proc.returncode == want, (proc.returncode, proc.stdout[-500:], proc.stderr[-1000:])
        lines = _error_lines(proc.stderr)
        assert len(lines) == 1, proc.stderr
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        if needle == "json":
            json.loads(proc.stdout)
        else:
            assert needle in proc.stdout, proc.stdout[-2000:]


ARCH_ROWS = [
    # (argv, kind, needle)
    (["critical-point", "--activation", "nope"], "usage", "activation"),
    (["critical-point", "--activation", ""], "usage", "activation"),
    (["critical-point", "--activation", "x.__class__"], "usage", "--activation 'x.__class__': attribute access"),
    (["critical-point", "--activation", "lambda: 1"], "usage", "--activation 'lambda: 1': lambda"),
    (["critical-point", "--activation", "y + x"], "usage", "unknown name 'y'"),
    (["critical-point", "--activation", "9**9**9*x"], "usage", "power of constants"),
    (["critical-point", "--norm", "layer"], "usage", "--norm"),
    (["critical-point", "--mu", "nan"], "usage", "mu"),
    (["critical-point", "--mu", "-0.5"], "usage", "mu"),
    (["critical-point", "--mu", "2"], "usage", "mu"),
    (["critical-point", "--mu", "abc"], "usage", "--mu"),
    (["critical-point", "--stages", "0"], "usage", "stages"),
    (["critical-point", "--stages", "1.5"], "usage", "--stages"),
    (["critical-point", "--block", "cnn"], "usage", "--block"),
    (["critical-point", "--activation", "leaky_relu", "--negative-slope", "nan"], "usage", "--negative-slope"),
    (["critical-point", "--eps", "inf", "--block", "resmlp"], "usage", "eps"),
    (["critical-point", "--activation", "erf"], "ok", "critical point"),
    (["critical-point", "--activation", "erf", "--json"], "ok", "json"),
    (["recursion", "--activation", "tanh", "--json"], "ok", "json"),
    (["recursion", "--latex", "--json", "--activation", "erf"], "ok", "json"),
    (["critical-line", "--sigma-w", "3:1"], "usage", "--sigma-w"),
    (["critical-line", "--sigma-w", "1:3:0"], "usage", "--sigma-w"),
    (["critical-line", "--sigma-w", "1:3:-4"], "usage", "--sigma-w"),
    (["critical-line", "--sigma-w", "1:3:1e12"], "usage", "--sigma-w"),
    (["critical-line", "--sigma-w", "nan,1"], "usage", "--sigma-w"),
    (["critical-line", "--sigma-w", ""], "usage", "--sigma-w"),
    (["critical-line", "--sigma-w", "1,,2"], "usage", "--sigma-w"),
    (["critical-line", "--activation", "erf", "--sigma-w=-1,2"], "usage", "--sigma-w must be >= 0"),
    (["critical-line", "--activation", "erf", "--sigma-w", "-1,2"], "usage", "--sigma-w"),
    (["critical-line", "--activation", "erf", "--sigma-w", "0.5:3:4"], "ok", "sigma_b"),
    (["critical-line", "--activation", "erf", "--csv", "--json"], "usage", "not allowed"),
    (["exponents", "--activation", "erf"], "usage", "--sigma-w"),
    (["exponents", "--activation", "erf", "--sigma-w", "nan", "--sigma-b", "0"], "usage", "--sigma-w"),
    (["exponents", "--activation", "erf", "--sigma-w", "inf", "--sigma-b", "0"], "usage", "--sigma-w"),
    (["exponents", "--activation", "erf", "--sigma-w", "-1", "--sigma-b", "0"], "usage", "--sigma-w must be >= 0"),
    (["exponents", "--activation", "erf", "--sigma-w", "1", "--sigma-b", "-1"], "usage", "--sigma-b must be >= 0"),
    (["exponents", "--activation", "gelu", "--sigma-w", "1.4", "--sigma-b", "0.4"], "ok", "ordered"),
    (["exponents", "--activation", "erf", "--sigma-w", "0.886226925452758", "--sigma-b", "0", "--json"], "ok",
     "json"),
    (["phase-diagram", "--sigma-w", "0:1:1e9"], "usage", "--sigma-w"),
    (["phase-diagram", "--sigma-b", "x"], "usage", "--sigma-b"),
    (["phase-diagram", "--tol", "-1", "--sigma-w", "1,2", "--sigma-b", "0,1"], "usage", "--tol"),
    (["phase-diagram", "--tol", "nan", "--sigma-w", "1,2", "--sigma-b", "0,1"], "usage", "--tol"),
    (["phase-diagram", "--out", "", "--sigma-w", "1,2", "--sigma-b", "0,1"], "usage", "--out"),
    (["phase-diagram", "--out", "/proc/no/such/dir/x", "--sigma-w", "1,2", "--sigma-b", "0,1"], "usage", "--out"),
    (["phase-diagram", "--activation", "erf", "--sigma-w", "0.5,1,2", "--sigma-b", "0,0.5", "--out",
      "sweep_mu0.5", "--json"], "ok", "json"),
    (["no-such-command"], "usage", "invalid choice"),
    ([], "usage", "required"),
    (["--version"], "ok", "meanfield "),
    (["cache", "info"], "ok", "meanfield cache"),
    (["cache", "info", "--json"], "ok", "json"),
    (["cache", "wipe"], "usage", "invalid choice"),
]


@pytest.mark.parametrize("argv, kind, needle", ARCH_ROWS, ids=[" ".join(r[0]) or "(none)" for r in ARCH_ROWS])
def test_cli_row(argv, kind, needle, tmp_path):
    _check(_run(argv, tmp_path), kind, needle)


def test_phase_diagram_out_suffix_keeps_dots(tmp_path):
    proc = _run(["phase-diagram", "--activation", "erf", "--sigma-w", "0.5,1,2", "--sigma-b", "0,0.5",
                 "--out", "sweep_mu0.5"], tmp_path)
    _check(proc, "ok", "sweep_mu0.5.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep_mu0.5.csv", "sweep_mu0.5.json", "sweep_mu0.5.png"]
    proc = _run(["phase-diagram", "--activation", "erf", "--sigma-w", "0.5,1,2", "--sigma-b", "0,0.5",
                 "--out", "fig.svg"], tmp_path)
    _check(proc, "ok", "fig.svg")
    assert (tmp_path / "fig.svg").read_text().lstrip().startswith("<?xml")


def test_phase_diagram_json_prints_the_data(tmp_path):
    proc = _run(["phase-diagram", "--activation", "relu", "--sigma-w", "1,2", "--sigma-b", "0,0.5", "--out", "pd",
                 "--json"], tmp_path)
    _check(proc, "ok", "json")
    data = json.loads(proc.stdout)
    # ReLU: chi_J* = sigma_w^2 / 2 (PJ eq. 99), independent of sigma_b
    assert data["chi_J"] == [[0.5, 0.5], [2.0, 2.0]]
    assert data["phase"] == [["ordered", "ordered"], ["chaotic", "chaotic"]]
    assert data["files"]["csv"].endswith("pd.csv")


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True,
                    reason="root ignores file permissions")
def test_phase_diagram_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _check(_run(["phase-diagram", "--sigma-w", "1,2", "--sigma-b", "0,1", "--out", str(ro / "x")], tmp_path),
               "usage", "--out")
    finally:
        ro.chmod(0o700)


def test_out_is_a_folder(tmp_path):
    (tmp_path / "x.png").mkdir()
    _check(_run(["phase-diagram", "--sigma-w", "1,2", "--sigma-b", "0,1", "--out", "x"], tmp_path), "usage",
           "folder")
    (tmp_path / "scales.json").mkdir()
    _check(_run(["autoinit", "--out", "scales.json", "--depth", "2", "--width", "8", "--steps", "1"], tmp_path),
           "usage", "--out")


def test_out_under_a_file(tmp_path):
    (tmp_path / "afile").write_text("")
    _check(_run(["phase-diagram", "--sigma-w", "1,2", "--sigma-b", "0,1", "--out", "afile/x"], tmp_path), "usage",
           "--out")


def test_broken_pipe_is_one_line(tmp_path):
    # enough output to fill the pipe after `head` has gone
    proc = _run(["critical-line", "--activation", "erf", "--sigma-w", "1:3:20000", "--json"], tmp_path,
                shell_pipe="head -c 10 > /dev/null")
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    lines = _error_lines(proc.stderr)
    assert len(lines) == 1 and "broken pipe" in lines[0], proc.stderr
    assert proc.returncode == 1


# ---------------------------------------------------------------------------
# autoinit (needs torch)
# ---------------------------------------------------------------------------
AUTOINIT_ROWS = [
    (["autoinit", "--sigma-w", "nan"], "usage", "--sigma-w"),
    (["autoinit", "--sigma-w", "-1"], "usage", "--sigma-w"),
    (["autoinit", "--sigma-w", "0"], "usage", "--sigma-w"),
    (["autoinit", "--sigma-w", "inf"], "usage", "--sigma-w"),
    (["autoinit", "--depth", "0"], "usage", "--depth"),
    (["autoinit", "--depth", "1000000000"], "usage", "--depth"),
    (["autoinit", "--width", "-3"], "usage", "--width"),
    (["autoinit", "--batch", "1"], "usage", "--batch"),
    (["autoinit", "--steps", "0"], "usage", "--steps"),
    (["autoinit", "--seed", "-1"], "usage", "--seed"),
    (["autoinit", "--activation", "erf"], "usage", "--activation"),
    (["autoinit", "--model", "transformer"], "usage", "--model"),
    (["autoinit", "--out", "/proc/nope/scales.json", "--depth", "2", "--width", "8"], "usage", "--out"),
]


@pytest.mark.torch
@pytest.mark.parametrize("argv, kind, needle", AUTOINIT_ROWS, ids=[" ".join(r[0]) for r in AUTOINIT_ROWS])
def test_autoinit_row(argv, kind, needle, tmp_path):
    pytest.importorskip("torch")
    _check(_run(argv, tmp_path), kind, needle)


# ---------------------------------------------------------------------------
# the verification suite (needs torch)
# ---------------------------------------------------------------------------
TINY = {"cases": [{"id": "tiny", "kind": "profile", "title": "ReLU critical", "arch": {"activation": "relu"},
                   "sigma_w": 1.4142135623730951, "sigma_b": 0.0, "depth": 3, "width": 16, "n_init": 4}]}

SUITE_ROWS = [
    (["verify", "--only", "no-such-case", "--device", "cpu"], "usage", "no-such-case"),
    (["verify", "--only", "--device", "cpu"], "usage", "--only"),
    (["verify", "--device", "gpu"], "usage", "device"),
    (["verify", "--device", "cuda:99"], "usage", "device"),
    (["verify", "--cases", "missing.json"], "usage", "missing.json"),
    (["verify", "--cases", "."], "usage", "directory"),
    (["verify", "--cases", "bad.json"], "usage", "not valid JSON"),
    (["verify", "--cases", "null.json"], "usage", "list of cases"),
    (["verify", "--cases", "noid.json"], "usage", "'id'"),
    (["verify", "--cases", "dup.json"], "usage", "duplicate"),
    (["verify", "--quick", "--full"], "usage", "not allowed"),
    (["verify", "--cases", "tiny.json", "--device", "cpu", "--out", "afile"], "usage", "afile"),
    (["verify", "--cases", "tiny.json", "--device", "cpu", "--out", "r", "--no-plots", "--json"], "ok", "json"),
]


def _suite_files(folder: Path):
    (folder / "bad.json").write_text("{not json")
    (folder / "null.json").write_text("null")
    (folder / "noid.json").write_text(json.dumps({"cases": [{"kind": "profile"}]}))
    (folder / "dup.json").write_text(json.dumps({"cases": TINY["cases"] * 2}))
    (folder / "tiny.json").write_text(json.dumps(TINY))
    (folder / "afile").write_text("")


@pytest.mark.torch
@pytest.mark.parametrize("argv, kind, needle", SUITE_ROWS, ids=[" ".join(r[0]) for r in SUITE_ROWS])
def test_suite_row(argv, kind, needle, tmp_path):
    pytest.importorskip("torch")
    _suite_files(tmp_path)
    _check(_run(argv, tmp_path), kind, needle)


@pytest.mark.torch
def test_broken_checkpoints_are_recomputed(tmp_path):
    """Each kind of broken checkpoint (JSON of the wrong shape, a wrong status, truncated, a folder) is
    recomputed, not trusted; a sound one is resumed (one first run, then one run per kind of damage)."""
    pytest.importorskip("torch")
    _suite_files(tmp_path)
    argv = ["verify", "--cases", "tiny.json", "--device", "cpu", "--out", "r", "--no-plots", "--json"]
    first = _run(argv, tmp_path)
    _check(first, "ok", "json")
    ckpt = tmp_path / "r" / "cases" / "tiny.json"
    for content in ["null", "[]", '{"id": "tiny"}', '{"status": 3}', "{trunc", "DIR"]:
        ckpt.unlink()
        if content == "DIR":
            ckpt.mkdir()
        else:
            ckpt.write_text(content)
        again = _run(argv, tmp_path)
        _check(again, "ok", "json")
        assert "recomputing" in again.stderr, content
        data = json.loads(again.stdout)
        assert data["summary"]["counts"] == {"pass": 1} and data["summary"]["resumed"] == 0, content
        assert json.loads(ckpt.read_text())["status"] == "pass", content
    # a further run resumes: no compute time is counted for the resumed case
    third = json.loads(_run(argv, tmp_path).stdout)
    assert third["summary"]["resumed"] == 1 and third["summary"]["case_seconds"] == 0


@pytest.mark.torch
def test_suite_module_rows(tmp_path):
    pytest.importorskip("torch")
    _suite_files(tmp_path)
    for argv, needle in ((["--only", "nope", "--cases", "tiny.json", "--device", "cpu"], "nope"),
                         (["--cases", "null.json"], "list of cases")):
        _check(_run(argv, tmp_path, module="meanfield.verification"), "usage", needle)
