"""The verification suite: run_suite on a tiny case subset, checkpoints, report files, CLI."""
import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from meanfield.verification import run_suite  # noqa: E402
from meanfield.verification.suite import KINDS, load_cases  # noqa: E402

pytestmark = pytest.mark.torch

TINY = [
    {"id": "relu-profile", "kind": "profile", "title": "ReLU critical", "arch": {"activation": "relu"},
     "sigma_w": 1.4142135623730951, "sigma_b": 0.0, "depth": 5, "width": 64, "n_init": 8},
    {"id": "erf-grid", "kind": "phase_diagram", "title": "erf grid", "arch": {"activation": "erf"},
     "sigma_w": [0.6, 2.0, 3], "sigma_b": [0.0, 0.6, 3], "depth": 5, "width": 64, "n_init": 6},
    {"id": "bn-batch", "kind": "bn_batch", "title": "BN vs batch", "arch": {"activation": "relu", "norm": "bn"},
     "sigma_w": 1.0, "sigma_b": 0.0, "batches": [8, 64], "depth": 4, "width": 64, "n_init": 6, "average_from": 2},
    {"id": "hvse", "kind": "hutchinson_vs_exact", "title": "estimators", "arch": {"activation": "tanh"},
     "sigma_w": 1.2, "sigma_b": 0.1, "depth": 4, "width": 8, "n_init": 32, "n_probes": 2},
    {"id": "broken", "kind": "profile", "title": "expected to fail", "arch": {"activation": "relu"},
     "sigma_w": 1.0, "sigma_b": 0.0, "depth": 3, "width": 16, "n_init": 4, "tolerance": {"z": 0.0, "c": 0.0},
     "expected": "fail", "reason": "zero tolerance"},
]


@pytest.mark.slow
def test_run_suite_writes_report_and_resumes(tmp_path):
    out = run_suite(TINY, tmp_path, device="cpu", quick=True, progress=False)
    s = out["summary"]
    statuses = {r["id"]: r["status"] for r in out["results"]}
    assert statuses["broken"] == "xfail", statuses
    assert all(v == "pass" for k, v in statuses.items() if k != "broken"), out["results"]
    assert s["ok"]
    for name in ("results.json", "report.md"):
        assert (tmp_path / name).exists()
    for case in TINY:
        assert (tmp_path / "cases" / f"{case['id']}.json").exists()
        assert (tmp_path / "plots" / f"{case['id']}.png").exists()
    report = (tmp_path / "report.md").read_text()
    assert "Hardware" in report and "torch" in report and "erf-grid" in report
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["summary"]["n_cases"] == len(TINY)
    # second run: everything comes from the checkpoints
    again = run_suite(TINY, tmp_path, device="cpu", quick=True, progress=False)
    assert all(r.get("resumed") for r in again["results"])
    # a changed case is rerun, the others are not
    changed = [dict(c) for c in TINY]
    changed[0]["n_init"] = 6
    third = run_suite(changed, tmp_path, device="cpu", quick=True, progress=False, only=["relu-profile", "hvse"])
    assert [r.get("resumed", False) for r in third["results"]] == [False, True]


def test_errors_are_reported_not_raised(tmp_path):
    bad = [{"id": "nope", "kind": "no-such-kind", "arch": {"activation": "relu"}}]
    out = run_suite(bad, tmp_path, device="cpu", progress=False, plots=False)
    assert out["results"][0]["status"] == "error" and not out["summary"]["ok"]


def test_case_files_are_valid():
    for quick in (True, False):
        cases = load_cases(quick=quick)
        assert cases and all(c.get("kind", "profile") in KINDS for c in cases)
        # a torch_module case names a model instead of a spec (from_torch reads its tree)
        assert all(("arch" in c or c["kind"] == "torch_module") and "id" in c for c in cases)
        from meanfield.verification._cases import _arch

        for c in cases:
            if "arch" in c:
                _arch(c["arch"])  # every spec, menu keywords or a JSON tree, builds


def test_cli_rejects_bad_device(capsys):
    from meanfield.verification.__main__ import main

    assert main(["--quick", "--device", "nonsense", "--only", "relu-critical"]) == 2
    assert "device" in capsys.readouterr().err


def _text_outside_math(text):
    """What a label shows as plain text: the parts outside $...$ (an escaped \\$ is plain)."""
    parts = text.replace(r"\$", "").split("$")
    return "".join(parts[::2])


_PROFILE_RESULT = {
    "id": "p", "title": "a $5 profile", "kind": "profile", "status": "pass",
    "data": {"quantities": {q: {"layers": [1, 2, 3], "mc": [1.0, 1.1, 0.9], "se": [0.1, 0.1, 0.1],
                                "theory": [1.0, 1.0, 1.0]} for q in ("K", "chi_J", "J", "K12")}},
}
_GRID_RESULT = {
    "id": "g", "title": "grid", "kind": "phase_diagram", "status": "pass",
    "data": {"sigma_w_axis": [0.5, 1.0, 2.0], "sigma_b_axis": [0.0, 0.5], "layer": 3,
             "mc": [[0.5, 0.6], [1.0, 1.1], [4.0, 3.0]], "theory": [[0.4, 0.5], [1.0, 1.0], [2.0, 2.0]],
             "critical_line": {"sigma_w": [1.0, 1.1], "sigma_b": [0.0, 0.5]}},
}
_SCAN_RESULTS = [
    {"id": "w", "title": "widths", "kind": "width_scan", "status": "pass",
     "data": {"rows": [{"width": 64, "mc": 1.1, "se": 0.02}, {"width": 128, "mc": 1.05, "se": 0.02}],
              "intercept": 1.0, "slope": 6.4, "intercept_se": 0.01, "theory": 1.0}},
    {"id": "b", "title": "batches", "kind": "bn_batch", "status": "pass",
     "data": {"rows": [{"batch": 8, "mc": 1.6, "se": 0.05, "theory": 1.47},
                       {"batch": 64, "mc": 1.5, "se": 0.02, "theory": 1.47}]}},
    {"id": "n", "title": "gram", "kind": "gram", "status": "pass",
     "data": {"quantities": {q: {"theory": [1.0, 0.5], "mc": [1.01, 0.49], "se": [0.02, 0.02]}
                             for q in ("nngp", "ntk")}}},
]


@pytest.mark.parametrize("res", [_PROFILE_RESULT, _GRID_RESULT] + _SCAN_RESULTS, ids=lambda r: r["kind"])
def test_case_plots_have_rendered_labels_and_titles(res):
    import matplotlib.pyplot as plt

    from meanfield.verification.suite import _case_figure

    fig = _case_figure(res)
    try:
        fig.canvas.draw()                   # mathtext that does not parse raises here
        panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        for ax in panels:
            assert ax.get_xlabel() and ax.get_ylabel(), (res["kind"], ax.get_title())
            for text in (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()):
                # symbols are typeset: no raw sigma_w, J^{...}, K^l, Theta, 'N = infinity' in plain text
                plain = _text_outside_math(text)
                assert not any(s in plain for s in ("_", "^", "Theta", "infinity")), text
        if res["kind"] == "profile":
            assert [ax.get_xlabel() for ax in panels] == ["layer $l$"] * 4
            assert [ax.get_title() for ax in panels] == [r"$K^l$", r"$\chi_J^l = \mathcal{J}^{l,l+1}$",
                                                         r"$\mathcal{J}^{1,l}$", r"$K^l(x, x')$"]
            assert r"\$5" in fig._suptitle.get_text()    # a '$' in a case's title is shown, not mathtext
        if res["kind"] == "phase_diagram":
            mc, theory = (ax.collections[0] for ax in panels)
            # one colour scale for both panels, symmetric about J = 1 (log10 J = 0), the largest |log10 J|
            lim = math.log10(4.0)
            for mesh in (mc, theory):
                assert (mesh.norm.vmin, mesh.norm.vmax) == pytest.approx((-lim, lim), rel=1e-12)
            assert [ax.get_xlabel() for ax in panels] == [r"$\sigma_b$"] * 2
            assert all(r"\log_{10} \mathcal{J}^{3,4}" in ax.get_title() for ax in panels)
    finally:
        plt.close(fig)
