"""The phase-diagram figure: artists, colour range, labels, file formats and their metadata."""
import dataclasses
import json
import math

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.plotting import MIN_COLOUR_LIMIT, colour_range, plot_phase_diagram  # noqa: E402

SW = np.linspace(0.5, 2.5, 9)
SB = np.linspace(0.0, 1.0, 5)


@pytest.fixture(scope="module")
def relu():
    return mf.phase_diagram(activation="relu", sigma_w=SW, sigma_b=SB)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def _legend(ax):
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


@pytest.mark.slow
def test_relu_figure_draws_the_critical_line_and_point(relu):
    ax = relu.plot()
    (line,) = _by_gid(ax, "critical line")
    x, y = line.get_data()
    ok = np.isfinite(x)
    # ReLU: the line is sigma_w = sqrt 2 for every sigma_b (chi_J* = sigma_w^2 / 2, PJ eq. 99)
    assert ok.sum() >= 50 and np.allclose(np.asarray(x)[ok], math.sqrt(2), rtol=1e-12)
    assert np.nanmin(y) == pytest.approx(SB[0]) and np.nanmax(y) == pytest.approx(SB[-1])
    (pts,) = _by_gid(ax, "critical points")
    px, py = pts.get_data()
    assert list(py) == [0.0] and px[0] == pytest.approx(math.sqrt(2), rel=1e-12)
    legend = _legend(ax)
    assert any("critical line" in t for t in legend) and any("critical point" in t for t in legend)
    labels = {t.get_text() for t in _by_gid(ax, "phase label")}
    assert labels == {"ordered", "chaotic"}
    assert "ReLU" in ax.get_title() and ax.get_xlabel() == r"$\sigma_w$"


@pytest.mark.slow
def test_one_symmetric_colour_scale_centred_on_critical(relu):
    ax = relu.plot()
    mesh = ax.collections[0]
    # ReLU closed form: chi_J* = sigma_w^2 / 2 (PJ eq. 99); the grid reaches further on the chaotic side
    lo, hi = math.log10(SW[0] ** 2 / 2), math.log10(SW[-1] ** 2 / 2)
    lim = max(-lo, hi)
    assert (mesh.norm.vmin, mesh.norm.vmax) == pytest.approx((-lim, lim), rel=1e-12)
    # chi_J* = 1 is the centre colour, c and 1/c are mirror images, whatever the grid's extent on each side
    assert mesh.norm(0.0) == pytest.approx(0.5, abs=1e-12)
    for c in (1.05, 1.5, 3.0):
        assert mesh.norm(math.log10(c)) - 0.5 == pytest.approx(0.5 - mesh.norm(-math.log10(c)), abs=1e-12)
    # each cell holds log10 chi_J* (a natural log, or another base, would not match)
    z = np.ma.getdata(mesh.get_array()).reshape(SB.size, SW.size)
    assert np.allclose(z, np.log10(SW ** 2 / 2)[None, :], atol=1e-12)
    # another grid, another range; a cap is one limit on both sides, and points past it extend the bar
    narrow = mf.phase_diagram(activation="relu", sigma_w=[1.2, 1.5], sigma_b=[0.0, 0.5])
    n2 = narrow.plot().collections[0].norm
    assert (n2.vmin, n2.vmax) == pytest.approx((math.log10(1.2 ** 2 / 2), -math.log10(1.2 ** 2 / 2)), rel=1e-12)
    capped = relu.plot(limit=0.25)
    assert (capped.collections[0].norm.vmin, capped.collections[0].norm.vmax) == (-0.25, 0.25)
    assert capped.collections[0].colorbar.extend == "both"
    assert relu.plot().collections[0].colorbar.extend == "neither"


def test_colour_range_and_its_floor():
    assert colour_range([0.5, 0.25]) == pytest.approx((math.log10(0.25), -math.log10(0.25)))
    assert colour_range([0.5, 4.0]) == pytest.approx((-math.log10(4.0), math.log10(4.0)))
    # chi_J* = 0 (sigma_w = 0) and NaN do not set the range; a grid at criticality gets the floor
    assert colour_range([0.0, 0.5, np.nan]) == pytest.approx((math.log10(0.5), -math.log10(0.5)))
    assert colour_range([np.nan]) == (-MIN_COLOUR_LIMIT, MIN_COLOUR_LIMIT)
    assert colour_range([1.0, 1.0 + 1e-9]) == (-MIN_COLOUR_LIMIT, MIN_COLOUR_LIMIT)
    for bad in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="limit"):
            colour_range([0.5], limit=bad)


def _tick_values(cbar):
    ticks = cbar.get_ticks()
    labels = [t.get_text() for t in cbar.ax.get_yticklabels()]
    return ticks, labels


def _label_value(text):
    """The chi_J* value a tick label names: '$10^{-2}$', '$0.67$', '$1$'."""
    body = text.strip("$")
    if body.startswith("10^{"):
        return 10.0 ** int(body[4:-1])
    return float(body)


@pytest.mark.slow
@pytest.mark.parametrize("sigma_w, n_side", [(SW, 2), (np.linspace(0.3, 3.0, 12), 1), (np.linspace(0.05, 6.0, 12), 2)])
def test_colour_bar_is_labelled_on_both_sides_in_chi_values(sigma_w, n_side):
    pd = mf.phase_diagram(activation="relu", sigma_w=sigma_w, sigma_b=[0.0, 0.5])
    ax = pd.plot()
    cbar = ax.collections[0].colorbar
    ticks, labels = _tick_values(cbar)
    lim = cbar.norm.vmax
    inside = (ticks >= -lim - 1e-12) & (ticks <= lim + 1e-12)
    assert inside.all() and all(labels)
    # as many labelled ticks on the chaotic side as on the ordered side, mirror images about 1
    assert np.sum(ticks < 0) == np.sum(ticks > 0) >= n_side and 0.0 in ticks
    assert np.allclose(np.sort(ticks), -np.sort(ticks)[::-1], atol=1e-12)
    for t, text in zip(ticks, labels):
        # each label is the chi_J* at its position (two significant digits for 1/c)
        assert _label_value(text) == pytest.approx(10.0 ** t, rel=0.03)
    assert "chi_J" in cbar.ax.get_ylabel() and "log" in cbar.ax.get_ylabel()


@pytest.mark.slow
def test_critical_point_on_the_grid_edge_is_not_clipped(relu, tmp_path):
    ax = relu.plot()
    (pts,) = _by_gid(ax, "critical points")
    assert pts.get_clip_on() is False
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    px, py = pts.get_data()
    assert x0 <= px[0] <= x1 and y0 <= py[0] <= y1
    assert ax.get_title().startswith("Phase diagram") and ax.get_ylabel() == r"$\sigma_b$"


@pytest.mark.slow
def test_no_legend_entry_without_a_line():
    everywhere = mf.phase_diagram(activation="erf", norm="ln_pre", mu=1.0, sigma_w=[0.5, 1.0, 1.5], sigma_b=[0.0, 0.5])
    ax = everywhere.plot()
    assert not _by_gid(ax, "critical line") and not any("critical line" in t for t in _legend(ax))
    assert [t.get_text() for t in _by_gid(ax, "phase label")] == [r"critical everywhere ($\chi_J^\star = 1$)"]
    # a window that the critical line does not cross: no line, no entry
    ordered = mf.phase_diagram(activation="relu", sigma_w=[0.5, 0.8, 1.1], sigma_b=[0.0, 0.5, 1.0])
    ax = ordered.plot()
    assert not _by_gid(ax, "critical line") and not _by_gid(ax, "critical points") and _legend(ax) == []


@pytest.mark.slow
def test_critical_line_and_points_are_those_inside_the_window(relu):
    # what the figure draws, from the PhaseDiagram itself; ReLU: sigma_w = sqrt 2 for every sigma_b and
    # one critical point at sigma_b = 0 (PJ eq. 99)
    (x, y), = relu.critical_line_curves()
    ok = np.isfinite(x)
    assert ok.sum() >= 50 and np.allclose(x[ok], math.sqrt(2), rtol=1e-12)
    assert np.nanmin(y) == pytest.approx(SB[0]) and np.nanmax(y) == pytest.approx(SB[-1])
    (p,) = relu.critical_points_inside()
    assert (p.sigma_w, p.sigma_b) == (pytest.approx(math.sqrt(2), rel=1e-12), 0.0)
    # a window the line does not cross, and a bias range that excludes the point
    ordered = mf.phase_diagram(activation="relu", sigma_w=[0.5, 0.8, 1.1], sigma_b=[0.0, 0.5])
    assert ordered.critical_line_curves() == [] and ordered.critical_points_inside() == []
    above = mf.phase_diagram(activation="relu", sigma_w=SW, sigma_b=[0.2, 0.6])
    assert len(above.critical_line_curves()) == 1 and above.critical_points_inside() == []


@pytest.mark.slow
def test_divergent_and_undetermined_points_are_grey_hatched_and_labelled(relu):
    phase = relu.phase.copy()
    chi = relu.chi_J.copy()
    phase[-2:, :2] = mf.PHASE_DIVERGENT
    phase[0, -1] = mf.PHASE_UNDETERMINED
    chi[phase >= mf.PHASE_DIVERGENT] = np.nan
    pd = dataclasses.replace(relu, phase=phase, chi_J=chi)
    ax = pd.plot()
    legend = _legend(ax)
    assert "divergent (4 points)" in legend and "undetermined (1 points)" in legend
    greys = {c.get_label(): c for c in ax.collections if c.get_label() in ("divergent", "undetermined")}
    assert set(greys) == {"divergent", "undetermined"}
    for c in greys.values():
        assert c.get_hatch()
        rgba = c.get_cmap()(0.5)
        assert rgba[0] == rgba[1] == rgba[2] and rgba[0] < 0.9      # grey, not the white of chi_J* = 1
    mesh = ax.collections[0]
    assert mesh.get_cmap()(mesh.norm(0.0))[:3] != pytest.approx(greys["divergent"].get_cmap()(0.5)[:3])


@pytest.mark.slow
@pytest.mark.parametrize("ext", ["pdf", "svg", "png"])
def test_saved_files_and_their_metadata(relu, tmp_path, ext):
    path = tmp_path / f"relu.{ext}"
    plot_phase_diagram(relu, path=path, dpi=300)
    data = path.read_bytes()
    if ext == "pdf":
        assert data[:5] == b"%PDF-" and b"/Subtype /Image" not in data   # vector: no raster image inside
        assert b"Phase diagram: ReLU" in data and b"meanfield" in data
    elif ext == "svg":
        text = data.decode()
        assert "<svg" in text and "<image" not in text and "Phase diagram: ReLU" in text
    else:
        from PIL import Image

        with Image.open(path) as im:  # closed here: an open file is a ResourceWarning in a later test
            assert im.info["dpi"] == pytest.approx((300, 300), abs=0.01)
            assert im.size == (1500, 1200)                   # 5 x 4 inches at 300 dpi
            assert im.info["Title"] == "Phase diagram: ReLU" and im.info["Software"].startswith("meanfield")
    with pytest.raises(ValueError, match="pdf"):
        plot_phase_diagram(relu, path=tmp_path / "relu.jpeg")


def _cli(*args, capsys):
    from meanfield.cli import main

    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_cli_uses_the_same_figure_and_labels(tmp_path, capsys):
    out = json.loads(_cli("phase-diagram", "--activation", "relu", "--sigma-w", "0.5:2.5:9", "--sigma-b", "0:1:5",
                          "--out", str(tmp_path / "sweep_mu0.5.pdf"), "--json", capsys=capsys))
    files = out["files"]
    assert files["figure"] == str(tmp_path / "sweep_mu0.5.pdf")
    assert files["csv"] == str(tmp_path / "sweep_mu0.5.csv") and files["json"] == str(tmp_path / "sweep_mu0.5.json")
    assert (tmp_path / "sweep_mu0.5.pdf").read_bytes()[:5] == b"%PDF-"
    n_ordered = int(np.sum(SW ** 2 / 2 < 1)) * SB.size              # ReLU: chi_J* = sigma_w^2 / 2
    assert out["points"] == {"ordered": n_ordered, "critical": 0, "chaotic": SW.size * SB.size - n_ordered,
                             "divergent": 0, "undetermined": 0}
    grid = mf.PhaseDiagram.load(tmp_path / "sweep_mu0.5.json")   # the JSON file loads
    assert grid.phase_names()[0].tolist() == ["ordered"] * 5 and out["phase"][0] == ["ordered"] * 5
    # a prefix with a dot keeps the dot; the default figure is a 300 dpi PNG
    out = json.loads(_cli("phase-diagram", "--activation", "relu", "--sigma-w", "0.5:2.5:3", "--sigma-b", "0:1:2",
                          "--out", str(tmp_path / "sweep_mu0.7"), "--json", capsys=capsys))
    assert out["files"]["figure"] == str(tmp_path / "sweep_mu0.7.png") and (tmp_path / "sweep_mu0.7.csv").exists()
