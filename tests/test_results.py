"""Result objects: short reprs, JSON/NPZ round trips, CSV export, phase labels of divergent/failed points."""
import csv
import dataclasses
import json
import math

import numpy as np
import pytest

import meanfield as mf
from meanfield._serialize import Result, load
from meanfield.solvers._common import ST_INF, ST_MAXITER, ST_OK


def _same(a, b, path="result"):
    """Deep equality: same types, arrays equal (NaN == NaN) with the same dtype and shape."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, path
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), path
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b and type(a) is type(b), (path, a, b)


def _results():
    sw = np.linspace(0.5, 2.5, 7)
    return {
        "kernel_profile": mf.kernel_profile(activation="tanh", sigma_w=1.3, sigma_b=0.2, depth=30),
        "kernel_profile_pair": mf.kernel_profile(activation="relu", norm="bn", mu=0.5, sigma_w=1.0, sigma_b=0.1,
                                                 depth=5),
        "fixed_point_state": mf.fixed_point_state(activation="relu", sigma_w=sw, sigma_b=0.3, errors="nan"),
        "critical_line": mf.critical_line(activation="erf", sigma_w=sw),
        "critical_line_everywhere": mf.critical_line(activation="erf", norm="ln_pre", mu=1.0, sigma_w=sw),
        "critical_points": mf.critical_point(activation="tanh"),   # nested CriticalPoint -> FixedPoint tuples
        "exponents": mf.exponents(activation="erf", sigma_w=float(np.sqrt(np.pi) / 2), sigma_b=0.0),
        "phase_diagram": mf.phase_diagram(activation="relu", sigma_w=sw, sigma_b=np.linspace(0, 1, 5)),
    }


@pytest.fixture(scope="module")
def results():
    return _results()


@pytest.mark.slow
@pytest.mark.parametrize("ext", ["json", "npz", "csv"])
def test_every_result_round_trips(results, tmp_path, ext):
    for name, r in results.items():
        assert isinstance(r, Result), name
        if ext == "csv" and name in ("critical_points", "exponents"):   # no arrays: CSV refused
            with pytest.raises(ValueError, match="no arrays"):
                r.save(tmp_path / f"{name}.csv")
            continue
        path = r.save(tmp_path / f"{name}.{ext}")
        back = type(r).load(path)
        _same(r, back, name)
        _same(r, load(path), name)


@pytest.mark.slow
def test_json_files_are_strict_json(results, tmp_path):
    def no_constants(c):
        raise AssertionError(f"non-standard JSON constant {c}")

    for name, r in results.items():
        doc = json.loads(r.save(tmp_path / f"{name}.json").read_text(), parse_constant=no_constants)
        assert doc["meanfield_format"] == 1
        json.loads(json.dumps(r.to_dict(), allow_nan=False))   # the CLI's plain form too


@pytest.mark.slow
def test_load_checks_the_kind_and_the_format(results, tmp_path):
    p = results["kernel_profile"].save(tmp_path / "k.json")
    with pytest.raises(TypeError, match="KernelProfile, not a PhaseDiagram"):
        mf.PhaseDiagram.load(p)
    with pytest.raises(ValueError, match=r"\.json, \.npz, \.csv"):
        results["kernel_profile"].save(tmp_path / "k.txt")
    (tmp_path / "plain.csv").write_text("sigma_w,sigma_b\n1.0,0.0\n")
    with pytest.raises(ValueError, match="not a saved meanfield result"):
        load(tmp_path / "plain.csv")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a saved meanfield result"):
        load(tmp_path / "other.json")


@pytest.mark.slow
def test_reprs_are_short_and_say_what_was_computed(results):
    for name, r in results.items():
        text = repr(r)
        assert text.startswith(type(r).__name__ + "(") and len(text.splitlines()) <= 30, (name, text)
        assert str(r.architecture) in text if hasattr(r, "architecture") else True
    big = mf.phase_diagram(activation="relu", sigma_w=np.linspace(0.1, 3, 60), sigma_b=np.linspace(0, 2, 40))
    text = repr(big)
    assert len(text.splitlines()) <= 15 and "(60x40)" in text and "ordered 1080" in text, text
    # ReLU: chi_J* = sigma_w^2/2 (PJ eq. 99): the range printed is that of the grid
    assert f"chi_J = (60x40) in [{0.1 ** 2 / 2:.10g}, {3.0 ** 2 / 2:.10g}]" in text
    assert "K12 = None" in repr(results["kernel_profile"])
    e = repr(results["exponents"])
    assert "c_tilde" not in e and "zeta = " in e      # NaN exponents (absent in this regime) are left out


@pytest.mark.slow
def test_csv_export_of_a_phase_diagram(results, tmp_path):
    pd = results["phase_diagram"]
    lines = pd.save(tmp_path / "pd.csv").read_text().splitlines()
    assert lines[0].startswith("# meanfield {")   # what the columns do not hold, for load
    rows = list(csv.DictReader(lines[1:]))
    assert len(rows) == pd.phase.size
    # the names of the Python attributes (PhaseDiagram.K, .chi_J, ...)
    assert set(rows[0]) == {"sigma_w", "sigma_b", "K", "chi_J", "chi_K", "xi", "phase"}
    for r in rows:
        chi = float(r["sigma_w"]) ** 2 / 2                       # ReLU, PJ eq. 99
        assert float(r["chi_J"]) == pytest.approx(chi, rel=1e-12)
        assert r["phase"] == ("ordered" if chi < 1 else "chaotic")
    # the columns are the data load reads back: an edited cell is what the loaded result holds
    lines[2] = lines[2].replace(rows[0]["chi_J"], "0.123", 1)
    (tmp_path / "edited.csv").write_text("\n".join(lines) + "\n")
    assert mf.PhaseDiagram.load(tmp_path / "edited.csv").chi_J[0, 0] == 0.123


# ---------------------------------------------------------------------------
# Phase labels.
# ---------------------------------------------------------------------------
def test_phase_codes_are_a_documented_table():
    assert mf.PHASES == {-1: "ordered", 0: "critical", 1: "chaotic", 2: "divergent", 3: "undetermined"}
    assert (mf.PHASE_ORDERED, mf.PHASE_CRITICAL, mf.PHASE_CHAOTIC, mf.PHASE_DIVERGENT,
            mf.PHASE_UNDETERMINED) == (-1, 0, 1, 2, 3)


def _diagram_with(monkeypatch, chi, status, K):
    """phase_diagram over a 1 x n grid whose fixed-point solve returns the given values."""
    from meanfield.solvers import lines

    def fake(arch, SW, SB, errors="raise", **kw):
        shape = SW.shape
        return mf.FixedPointState(arch, SW, SB, np.reshape(K, shape), np.full(shape, np.nan),
                                  np.reshape(chi, shape), np.full(shape, 0.5), np.reshape(status, shape))

    # phase_diagram first decides the asymptotic regime (lru-cached, from scalar fixed-point
    # solves that ``fake`` does not serve): fix it to 'none' so the test does not depend on
    # another test having filled that cache, nor pay its deep-profile compile
    monkeypatch.setattr(lines, "_regime", lambda arch: "none")
    monkeypatch.setattr(lines, "fixed_point_state", fake)
    return mf.phase_diagram(activation="tanh", sigma_w=[1.0], sigma_b=np.arange(len(chi)) * 0.1)


def test_nan_is_never_chaotic(monkeypatch):
    """NaN compares False, which used to read as 'chaotic': divergent and failed points get their own codes."""
    chi = [0.5, 1.0, 2.0, np.nan, np.nan, 3.0]
    status = [ST_OK, ST_OK, ST_OK, ST_INF, ST_MAXITER, ST_INF]
    K = [1.0, 1.0, 1.0, np.inf, np.nan, np.inf]
    pd = _diagram_with(monkeypatch, chi, status, K)
    assert pd.phase.dtype == np.int8
    assert pd.phase_names().tolist() == [["ordered", "critical", "chaotic", "divergent", "undetermined", "chaotic"]]
    assert pd.counts() == {"ordered": 1, "critical": 1, "chaotic": 2, "divergent": 1, "undetermined": 1}
    assert np.isnan(pd.xi[0, 3]) and np.isnan(pd.xi[0, 4])
    data = pd.to_dict()
    assert data["phase_names"][0][3:5] == ["divergent", "undetermined"] and data["phase_codes"]["2"] == "divergent"


@pytest.mark.slow
def test_softplus_points_without_a_limit_are_not_chaotic():
    """The case of the report: softplus rows `inf,nan,nan` were labelled chaotic."""
    pd = mf.phase_diagram(activation="softplus", sigma_w=np.linspace(1.0, 3.0, 5), sigma_b=[0.0, 1.0])
    undefined = np.isnan(pd.chi_J)
    assert np.all(pd.phase[undefined] >= mf.PHASE_DIVERGENT)
    assert np.all(pd.phase[~undefined] <= mf.PHASE_CHAOTIC)
    assert np.all((pd.phase == mf.PHASE_DIVERGENT) == (undefined & np.isinf(pd.K)))
