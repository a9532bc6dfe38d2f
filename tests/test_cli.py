"""The command line, driven as a user drives it (subprocess), checked against the library."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

import meanfield as mf

SUBCOMMANDS = ["recursion", "critical-point", "critical-line", "exponents", "phase-diagram", "verify", "autoinit",
               "kernels", "cache"]


def run(*argv, check=True):
    proc = subprocess.run([sys.executable, "-m", "meanfield", *argv], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"meanfield {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.mark.slow  # 16 subprocesses; tests/test_install.py checks the help text in-process
def test_help_for_every_subcommand():
    top = run("--help")
    for name in SUBCOMMANDS:
        assert name in top.stdout
        sub = run(name, "--help")
        assert sub.stdout.startswith("usage: meanfield " + name)
        if name not in ("verify", "autoinit", "cache"):
            assert "--activation" in sub.stdout and "--norm" in sub.stdout and "--mu" in sub.stdout


@pytest.mark.parametrize("argv, needle", [
    (["recursion", "--activation", "nope"], "activation='nope'"),
    (["recursion", "--norm", "batch"], "--norm"),
    (["recursion", "--mu", "1.5"], "mu"),
    (["critical-line", "--sigma-w", "a:b"], "--sigma-w"),
    (["exponents", "--activation", "erf"], "--sigma-w"),
    (["no-such-command"], "invalid choice"),
])
def test_usage_errors_are_one_line_with_status_2(argv, needle):
    proc = run(*argv, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert proc.stdout == ""


def test_recursion_json_matches_library():
    proc = run("recursion", "--activation", "gelu", "--norm", "ln_pre", "--mu", "0.5", "--json")
    data = json.loads(proc.stdout)
    rec = mf.recursion(activation="gelu", norm="ln_pre", mu=0.5)
    assert data["kernel"] == str(rec.kernel)
    assert data["chi_J"] == str(rec.chi_J)
    assert data["state"] == ["K"]
    latex = run("recursion", "--activation", "erf", "--latex").stdout
    assert "\\operatorname{atan}" in latex and "\\chi_{\\mathcal{J}}" in latex


def test_critical_point_json_matches_library():
    data = json.loads(run("critical-point", "--activation", "gelu", "--json").stdout)
    lib = mf.critical_point(activation="gelu")
    assert len(data["points"]) == len(lib.points) == 2
    for got, want in zip(data["points"], lib.points):
        assert got["sigma_w"] == pytest.approx(want.sigma_w, rel=1e-14)
        assert got["sigma_b"] == pytest.approx(want.sigma_b, rel=1e-14, abs=1e-15)
    # and against the closed form of the erf critical point, (sqrt(pi)/2, 0)
    erf = json.loads(run("critical-point", "--activation", "erf", "--json").stdout)
    assert erf["points"][0]["sigma_w"] == pytest.approx(np.sqrt(np.pi) / 2, rel=1e-12)


def test_critical_line_csv_and_json_match_library():
    sw = np.linspace(1.0, 2.5, 4)
    rows = list(csv.DictReader(run("critical-line", "--activation", "erf", "--sigma-w", "1:2.5:4", "--csv")
                               .stdout.splitlines()))
    data = json.loads(run("critical-line", "--activation", "erf", "--sigma-w", "1:2.5:4", "--json").stdout)
    lib = mf.critical_line(activation="erf", sigma_w=sw)
    np.testing.assert_allclose([float(r["sigma_w"]) for r in rows], sw, rtol=1e-15)
    np.testing.assert_allclose([float(r["sigma_b"]) for r in rows], lib.sigma_b, rtol=1e-14)
    np.testing.assert_allclose(data["sigma_b"], lib.sigma_b, rtol=1e-14)


def test_exponents_json_matches_library():
    sw = float(np.sqrt(np.pi) / 2)
    data = json.loads(run("exponents", "--activation", "erf", "--sigma-w", repr(sw), "--sigma-b", "0",
                          "--json").stdout)
    lib = mf.exponents(activation="erf", sigma_w=sw, sigma_b=0.0)
    assert data["zeta"] == pytest.approx(lib.zeta, rel=1e-12)
    assert data["zeta"] == pytest.approx(1.0, rel=1e-3)  # PJ eq. 133, derived in docs/theory.md


@pytest.mark.slow
def test_phase_diagram_writes_png_csv_json(tmp_path):
    out = tmp_path / "pd" / "relu"
    summary = json.loads(run("phase-diagram", "--activation", "relu", "--sigma-w", "0.5:2.5:9",
                             "--sigma-b", "0:1:5", "--out", str(out), "--json").stdout)
    png = tmp_path / "pd" / "relu.png"
    assert summary["files"]["figure"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --json prints the data too, the same numbers as the JSON file
    assert summary["chi_J"] == json.loads(out.with_suffix(".json").read_text())["chi_J"]
    rows = list(csv.DictReader(out.with_suffix(".csv").read_text().splitlines()))
    assert len(rows) == 9 * 5
    # ReLU: chi_J* = sigma_w^2 / 2 everywhere a fixed point exists (PJ eq. 99)
    for r in rows:
        if r["chi_J"] not in ("", "nan"):
            assert float(r["chi_J"]) == pytest.approx(float(r["sigma_w"]) ** 2 / 2, rel=1e-12)
    counts = summary["points"]
    assert counts["ordered"] > 0 and counts["chaotic"] > 0
    grid = json.loads(out.with_suffix(".json").read_text())
    assert len(grid["chi_J"]) == 9 and len(grid["chi_J"][0]) == 5


@pytest.mark.slow
def test_verify_runs_a_case_and_writes_the_report(tmp_path):
    out = tmp_path / "report"
    proc = run("verify", "--device", "cpu", "--out", str(out), "--only", "relu-critical")
    assert "1 cases: pass 1" in proc.stdout
    report = (out / "report.md").read_text()
    assert "relu-critical" in report and "PASS" in report
    results = json.loads((out / "results.json").read_text())
    assert [r["id"] for r in results["results"]] == ["relu-critical"]


@pytest.mark.slow
def test_autoinit_tunes_a_relu_mlp_and_writes_scales(tmp_path):
    out = tmp_path / "scales.json"
    data = json.loads(run("autoinit", "--model", "mlp", "--depth", "5", "--width", "64", "--sigma-w", "3",
                          "--steps", "60", "--out", str(out), "--json").stdout)
    # before: ReLU chi_J = sigma_w^2 / 2 = 4.5 (PJ eq. 99), up to Monte-Carlo and width-64 noise
    assert np.all(np.abs(np.asarray(data["J_before"]) - 4.5) < 0.25 * 4.5)
    assert np.all(np.abs(np.asarray(data["J_after"]) - 1.0) < 0.3)
    saved = json.loads(out.read_text())
    assert saved["mode"] == "rescale" and saved["model"] == "mlp"
    # the ReLU weight scales that make sigma_w^2 a^2 / 2 = 1: a = sqrt(2)/3 = 0.471
    w = [v for k, v in saved["scales"].items() if k.endswith("weight") and k != "0.weight"]
    assert np.allclose(w, np.sqrt(2) / 3, rtol=0.15)


def test_autoinit_bad_option_is_a_usage_error():
    proc = run("autoinit", "--steps", "0", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--steps" in proc.stderr
