"""The package as a user meets it: packaged case lists, report and cache folders, help text, metadata."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "meanfield"


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


# ---------------------------------------------------------------------------
# Command line: every option documented, version, grid syntax.
# ---------------------------------------------------------------------------
def test_every_option_of_every_subcommand_has_help():
    from meanfield.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subs.choices) >= {"recursion", "critical-point", "critical-line", "exponents", "phase-diagram",
                                 "verify", "autoinit", "cache"}
    for name, sub in subs.choices.items():
        for action in sub._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.option_strings or action.dest)
        text = sub.format_help()
        # the grid syntax is explained wherever a grid option is (and only there: tests/test_cli.py)
        has_grid = any(a.metavar == "GRID" for a in sub._actions)
        assert ("start:stop:count" in text) == has_grid, name
        assert "Exit status" in text, name


@pytest.mark.slow
def test_version_matches_metadata():
    import meanfield

    proc = subprocess.run([sys.executable, "-m", "meanfield", "--version"], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0 and proc.stdout.strip() == f"meanfield {meanfield.__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{meanfield.__version__}"' in pyproject


def test_out_prefix_only_strips_known_extensions():
    from meanfield.cli import _out_prefix

    assert _out_prefix("sweep_mu0.5") == (Path("sweep_mu0.5"), ".png")
    assert _out_prefix("a/b.c/run.v2.pdf") == (Path("a/b.c/run.v2"), ".pdf")
    assert _out_prefix("x.SVG") == (Path("x"), ".svg")
    assert _out_prefix("x.csv") == (Path("x"), ".png")
    assert _out_prefix("phase.diagram.json") == (Path("phase.diagram"), ".png")


def test_tiny_noise_is_shown_as_zero_to_solver_precision():
    from meanfield.cli import _g0

    assert _g0(2.83e-09, 0.886) == "0 (to solver precision; computed 2.8e-09)"
    assert _g0(0.0) == "0" and _g0(0.4158393809586) == "0.415839381"
    assert _g0(3e-3, 1.0) == "0.003"


# ---------------------------------------------------------------------------
# Packaging metadata.
# ---------------------------------------------------------------------------
def test_license_file_matches_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = {text = "MIT"}' in pyproject
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "authors" in pyproject and '"numba>=0.58,<1"' in pyproject and '"numpy>=1.24,<3"' in pyproject
    assert "notebooks = [" in pyproject and "jupyter" in pyproject
    assert '"meanfield.verification" = ["cases_*.json"]' in pyproject


def test_ci_runs_the_suite_outside_the_checkout_on_a_regular_install():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 && pip install ".[verify,test]"' in ci
    assert "pip install -e" not in ci and "--editable" not in ci
    assert '(cd "$scratch/verify-here" && meanfield verify --quick --device cpu --out' in ci


# ---------------------------------------------------------------------------
# The cache folder.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_cache_info_and_clear(tmp_path):
    cache = tmp_path / "cache"
    (cache / "numba" / "meanfield_x").mkdir(parents=True)
    (cache / "numba" / "meanfield_x" / "_kernels.f-1.py311.nbi").write_bytes(b"x" * 100)
    (cache / "meanfield_expr_abc.py").write_text("# generated\n")
    (cache / "__pycache__").mkdir()
    (cache / "__pycache__" / "meanfield_expr_abc.f-3.py311.nbc").write_bytes(b"y" * 50)
    (cache / "__pycache__" / "someone_else.pyc").write_bytes(b"z")
    (cache / "notes.txt").write_text("not ours")
    env = _env(MEANFIELD_CACHE_DIR=str(cache))
    info = json.loads(subprocess.run([sys.executable, "-m", "meanfield", "cache", "info", "--json"],
                                     capture_output=True, text=True, timeout=120, env=env).stdout)
    assert info["path"] == str(cache) and info["chosen_by"] == "MEANFIELD_CACHE_DIR"
    assert info["files"] == 3 and info["bytes"] == 100 + len("# generated\n") + 50 and info["architectures"] == 1
    text = subprocess.run([sys.executable, "-m", "meanfield", "cache"], capture_output=True, text=True,
                          timeout=120, env=env).stdout
    assert str(cache) in text and "MEANFIELD_CACHE_DIR" in text and "meanfield cache clear" in text
    proc = subprocess.run([sys.executable, "-m", "meanfield", "cache", "clear"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0 and "removed 3 files" in proc.stdout
    # only what meanfield wrote is removed
    assert sorted(p.name for p in cache.rglob("*")) == ["__pycache__", "notes.txt", "someone_else.pyc"]


@pytest.mark.slow
def test_compiled_code_never_lands_in_the_package_folder(tmp_path):
    """A fresh cache: the compile notice is one line on stderr and every numba cache file is in the cache folder.

    MEANFIELD_ENGINE=numba: a small first call is otherwise answered without numba (nothing compiled)."""
    before = {p for p in PKG.rglob("*") if p.suffix in (".nbi", ".nbc")}
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "meanfield", "critical-point", "--activation", "relu"],
                          capture_output=True, text=True, timeout=1800, cwd=tmp_path,
                          env=_env(MEANFIELD_CACHE_DIR=str(cache), NUMBA_CACHE_DIR="", MEANFIELD_ENGINE="numba"))
    assert proc.returncode == 0, proc.stderr
    notices = [ln for ln in proc.stderr.splitlines() if ln.startswith("meanfield: compiling")]
    assert 1 <= len(notices) <= 2 and all(str(cache) in ln for ln in notices), proc.stderr
    assert {p for p in PKG.rglob("*") if p.suffix in (".nbi", ".nbc")} == before
    assert any(cache.glob("numba/*/_kernels.*.nbi")) and any(cache.glob("__pycache__/meanfield_expr_*.nbi"))
    # a second process loads everything from the cache: no notice
    again = subprocess.run([sys.executable, "-m", "meanfield", "critical-point", "--activation", "relu"],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path,
                           env=_env(MEANFIELD_CACHE_DIR=str(cache), NUMBA_CACHE_DIR="", MEANFIELD_ENGINE="numba"))
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr


# ---------------------------------------------------------------------------
# The verification suite from anywhere.
# ---------------------------------------------------------------------------
@pytest.mark.torch
def test_packaged_case_lists_load_from_any_folder(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from meanfield.verification.suite import default_cases_path, load_cases

    monkeypatch.chdir(tmp_path)
    for quick in (True, False):
        cases = load_cases(None, quick)
        assert len(cases) >= 10 and len({c["id"] for c in cases}) == len(cases)
        assert default_cases_path(quick).parent == PKG / "verification"


@pytest.mark.slow
@pytest.mark.torch
def test_default_report_folder_is_in_the_working_directory(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from meanfield.verification.suite import default_out_dir, run_suite

    monkeypatch.chdir(tmp_path)
    assert default_out_dir(True, "cpu") == tmp_path / "meanfield-verify" / "quick-cpu"
    tiny = [{"id": "t", "kind": "profile", "arch": {"activation": "relu"}, "sigma_w": 1.4142135623730951,
             "sigma_b": 0.0, "depth": 3, "width": 16, "n_init": 4}]
    out = run_suite(tiny, device="cpu", progress=False, plots=False)
    assert Path(out["out_dir"]) == tmp_path / "meanfield-verify" / "quick-cpu"
    assert (tmp_path / "meanfield-verify" / "quick-cpu" / "report.md").exists()
    with pytest.raises(ValueError, match="inside the installed package"):
        run_suite(tiny, PKG / "verification" / "reports", device="cpu", progress=False, plots=False)
    assert not (PKG / "verification" / "reports").exists()
