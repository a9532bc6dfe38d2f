r"""Figures of the package (matplotlib, imported on first use).

:func:`plot_phase_diagram` draws a :class:`~meanfield.PhaseDiagram`: log10 chi_J*
on one symmetric diverging colour scale centred on chi_J* = 1 (white), its
ends at +-max |log10 chi_J*| of the grid (or a given cap), so chi_J* = c and
1/c get colours of the same strength; the colour bar is labelled in chi_J*
(1, 10^+-k or c and 1/c) on both sides. On top: the
critical line chi_J* = 1 and the critical points chi_J* = chi_K* = 1 that fall
inside the grid, the phases named where they lie, and the points where no
phase follows (K* diverges without a limit of chi_J^l, or the solve failed)
in hatched grey. Both ``PhaseDiagram.plot`` and ``meanfield phase-diagram``
call it. The critical line and points come from the PhaseDiagram's own methods
(:meth:`~meanfield.PhaseDiagram.critical_line_curves`,
:meth:`~meanfield.PhaseDiagram.critical_points_inside`), so this module imports
nothing from :mod:`meanfield.solvers`, which imports it for ``PhaseDiagram.plot``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_phase_diagram", "architecture_latex", "colour_range", "colour_ticks", "FIGURE_FORMATS",
           "MIN_COLOUR_LIMIT"]

from ._names import FIGURE_FORMATS  # noqa: E402  (the CLI checks --out without importing matplotlib)

_NORM_LATEX = {"none": None, "ln_pre": "pre-LayerNorm", "ln_post": "post-LayerNorm", "bn": "BatchNorm"}
_ACT_NAMES = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "selu": "SELU", "elu": "ELU",
              "leaky_relu": "leaky ReLU", "hard_tanh": "hard tanh"}
_NO_PHASE_STYLE = {  # phase code -> (face colour, hatch)
    2: ("0.55", "//"),
    3: ("0.80", "xx"),
}


def architecture_latex(arch) -> str:
    r"""A readable description of an Architecture for titles (``GELU, pre-LayerNorm, $\mu = 0.5$``);
    a composed Network is described by its name or tree (``str``)."""
    from .calculus import Architecture

    if not isinstance(arch, Architecture):
        return str(arch).replace("$", r"\$")
    name = arch.activation.name
    parts = [_ACT_NAMES.get(name, name)]
    if arch.block == "resmlp":
        parts.insert(0, "ResMLP")
    elif arch.block == "mixer":
        parts.insert(0, "MLP-Mixer")
    norm = _NORM_LATEX.get(arch.norm)
    if norm:
        parts.append(norm)
    if arch.stages > 1:
        parts.append(f"{arch.stages} stages per block")
    if arch.residual:
        parts.append(rf"$\mu = {arch.mu:g}$")
    if arch.block == "resmlp":
        parts.append(rf"$\epsilon = {arch.eps:g}$")
    return ", ".join(parts)


def _pyplot():
    # matplotlib picks a non-interactive backend by itself where there is no display
    import matplotlib.pyplot as plt

    return plt


def _edges(x: np.ndarray) -> np.ndarray:
    """Cell edges around grid points (pcolormesh 'flat' shading, each point at its cell's centre)."""
    x = np.asarray(x, dtype=float)
    if x.size == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    mid = 0.5 * (x[1:] + x[:-1])
    return np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]])


#: the smallest |log10 chi_J*| at the colour bar's ends: a grid within a factor 10^0.1 ~ 1.26 of
#: critical (or critical everywhere) is drawn pale rather than rounding noise blown up to full colour
MIN_COLOUR_LIMIT = 0.1


def colour_range(chi_J, limit=None) -> tuple:
    """(vmin, vmax) = (-L, L) of log10 chi_J* for the colour map: one scale, centred on chi_J* = 1.

    L = ``limit`` when given (a cap: points beyond it take the end colours),
    otherwise max |log10 chi_J*| over the finite positive values of ``chi_J``,
    at least :data:`MIN_COLOUR_LIMIT`. The same L on both sides means
    chi_J* = c and 1/c are equally strong colours, whatever part of the grid
    lies on each side.
    """
    if limit is not None:
        limit = float(limit)
        if not (np.isfinite(limit) and limit > 0):
            raise ValueError(f"limit must be a finite number > 0 (|log10 chi_J*| at the colour bar's ends), "
                             f"got {limit!r}")
        return -limit, limit
    chi = np.asarray(chi_J, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log10(chi)
    fin = np.abs(z[np.isfinite(z)])
    lim = max(float(fin.max()) if fin.size else 0.0, MIN_COLOUR_LIMIT)
    return -lim, lim


_NICE_FACTORS = (1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0)


def colour_ticks(limit) -> tuple:
    """Colour-bar ticks for the log10 chi_J* scale [-limit, limit]: (positions, labels as chi_J* values).

    Mirror images on both sides of 1 (chi_J* = c and 1/c, or 10^k and 10^-k):
    powers of ten (every 1, 2, 5, ... decades, at most 4 a side) when the
    scale spans a decade or more a side, otherwise up to two factors c of
    1.02 ... 5 a side, labelled c and 1/c to two digits.
    """
    if limit >= 1.0:
        step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500) if limit // s <= 4)
        n = int(limit // step)
        pos = [k * step for k in range(-n, n + 1)]
        labels = ["$1$" if k == 0 else f"$10^{{{k}}}$" for k in pos]
        return [float(v) for v in pos], labels
    inside = [c for c in _NICE_FACTORS if np.log10(c) <= limit * (1 + 1e-9)]
    chosen = []
    if inside:
        chosen.append(inside[-1])
        inner = [c for c in inside if np.log10(c) <= 0.5 * np.log10(inside[-1])]
        if inner:
            chosen.insert(0, inner[-1])
    pos = [-np.log10(c) for c in reversed(chosen)] + [0.0] + [np.log10(c) for c in chosen]
    labels = [f"${1 / c:.2g}$" for c in reversed(chosen)] + ["$1$"] + [f"${c:g}$" for c in chosen]
    return [float(v) for v in pos], labels


def plot_phase_diagram(pd, ax=None, path=None, *, line=True, points=True, cmap="RdBu_r", dpi=300,
                       title=None, figsize=(5.0, 4.0), limit=None):
    r"""Draw a :class:`~meanfield.PhaseDiagram`; optionally save it. Returns the Axes.

    Parameters
    ----------
    pd : PhaseDiagram
    ax : matplotlib Axes, optional
        Draw into it (default: a new figure of ``figsize`` inches).
    path : str or Path, optional
        Save the figure there; the format follows the extension, one of
        :data:`FIGURE_FORMATS` (pdf, svg, eps: vector; png: raster at ``dpi``).
        The file's metadata carry the title and the architecture.
    line : bool
        Draw the critical line chi_J* = 1 (solved with
        :func:`~meanfield.critical_line`, not read off the grid:
        :meth:`~meanfield.PhaseDiagram.critical_line_curves`).
    points : bool
        Mark the critical points chi_J* = chi_K* = 1 inside the grid
        (:func:`~meanfield.critical_point`:
        :meth:`~meanfield.PhaseDiagram.critical_points_inside`).
    cmap : str
        Diverging colour map of log10 chi_J* on one symmetric scale [-L, L]:
        its centre (white for RdBu_r) is chi_J* = 1, its ends chi_J* = 10^-L
        (ordered, blue) and 10^L (chaotic, red); the colour bar is labelled
        in chi_J* values on both sides (:func:`colour_ticks`).
    limit : float, optional
        L, a cap on |log10 chi_J*| (points beyond it take the end colours and
        the colour bar gets an arrow); default max |log10 chi_J*| of the grid,
        at least :data:`MIN_COLOUR_LIMIT` (:func:`colour_range`).
    dpi : int
        Resolution of raster output (default 300, print quality).
    title : str, optional
        Default: the architecture in words with LaTeX symbols.

    The legend lists the critical line and points only when they are drawn,
    and the grey hatched kinds of point (divergent, undetermined) only when
    the grid has some. Phase names are written at the centre of their region.
    """
    plt = _pyplot()
    if path is not None:
        path = Path(path)
        if path.suffix.lower() not in FIGURE_FORMATS:
            raise ValueError(f"path must end in one of {', '.join(FIGURE_FORMATS)} (the figure format), "
                             f"got {str(path)!r}")
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    else:
        fig = ax.figure
    sw, sb = np.asarray(pd.sigma_w, float), np.asarray(pd.sigma_b, float)
    xe, ye = _edges(sw), _edges(sb)
    _draw_chi_J(fig, ax, pd, xe, ye, cmap, limit)
    handles = _draw_points_without_phase(ax, pd, xe, ye)
    if line:
        _draw_critical_line(ax, pd, handles)
    if points:
        _draw_critical_points(ax, pd, handles)
    _label_phases(ax, pd, sw, sb)
    if handles:
        ax.legend(handles=handles, loc="best", fontsize=7, framealpha=0.85)
    ax.set_xlabel(r"$\sigma_w$")
    ax.set_ylabel(r"$\sigma_b$")
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    if title is None:
        title = "Phase diagram: " + architecture_latex(pd.architecture)
    ax.set_title(title, fontsize=10)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = _metadata(path.suffix.lower(), title, pd)
        fig.savefig(path, dpi=dpi, metadata=meta)
    return ax


def _draw_chi_J(fig, ax, pd, xe, ye, cmap, limit):
    """The mesh of log10 chi_J* on the symmetric scale of :func:`colour_range`, and its colour bar."""
    from matplotlib.colors import Normalize

    lo, hi = colour_range(pd.chi_J, limit)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log10(np.asarray(pd.chi_J, dtype=float))
    below, above = bool(np.any(z < lo)), bool(np.any(z > hi))
    # chi_J* = 0 (sigma_w = 0) is the deepest ordered colour, not a hole in the mesh that shows the
    # white of chi_J* = 1; NaN (divergent, undetermined) stays masked and is drawn grey below
    z = np.where(np.isinf(z), np.sign(z) * 2.0 * hi, z)
    mesh = ax.pcolormesh(xe, ye, np.ma.masked_invalid(z).T, cmap=cmap, norm=Normalize(lo, hi), shading="flat")
    mesh.set_label("log10 chi_J")
    extend = {(False, False): "neither", (True, False): "min", (False, True): "max", (True, True): "both"}
    cbar = fig.colorbar(mesh, ax=ax, extend=extend[below, above],
                        label=r"$\chi_J^\star$ (log scale; $<1$ ordered, $>1$ chaotic)")
    ticks, tick_labels = colour_ticks(hi)
    cbar.set_ticks(ticks, labels=tick_labels)
    cbar.minorticks_off()
    cbar.solids.set_rasterized(False)   # matplotlib rasterizes long colour bars; keep vector files all vector


def _draw_points_without_phase(ax, pd, xe, ye) -> list:
    """Divergent and undetermined points in hatched grey; returns their legend handles."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    handles = []
    phase, names = np.asarray(pd.phase), pd.phase_names()
    for code, (colour, hatch) in _NO_PHASE_STYLE.items():
        sel = phase == code
        if not sel.any():
            continue
        name = str(names[sel][0])
        # pcolor (polygons) rather than pcolormesh: a QuadMesh does not draw hatching
        grey = ax.pcolor(xe, ye, np.ma.masked_where(~sel, np.ones(sel.shape)).T,
                         cmap=ListedColormap([colour]), hatch=hatch, edgecolor="0.3", linewidth=0.0)
        grey.set_label(name)
        handles.append(Patch(facecolor=colour, hatch=hatch, edgecolor="0.3",
                             label=f"{name} ({int(sel.sum())} points)"))
    return handles


def _draw_critical_line(ax, pd, handles):
    """The critical line chi_J* = 1 (:meth:`~meanfield.PhaseDiagram.critical_line_curves`, solved,
    not read off the grid); its legend handle goes first in ``handles``."""
    for k, (x, y) in enumerate(pd.critical_line_curves()):
        (ln,) = ax.plot(x, y, "k-", lw=1.6, label=r"critical line $\chi_J^\star = 1$" if k == 0 else None)
        ln.set_gid("critical line")
        if k == 0:
            handles.insert(0, ln)


def _draw_critical_points(ax, pd, handles):
    """The critical points chi_J* = chi_K* = 1 inside the grid as gold stars, not clipped at the
    axes' edge; their legend handle goes after the critical line's."""
    inside = pd.critical_points_inside()
    if not inside:
        return
    (mk,) = ax.plot([p.sigma_w for p in inside], [p.sigma_b for p in inside], ls="none", marker="*",
                    ms=13, mfc="gold", mec="k", mew=0.8, zorder=5, clip_on=False,
                    label=r"critical point $\chi_J^\star = \chi_K^\star = 1$")
    mk.set_gid("critical points")
    handles.insert(1 if handles and handles[0].get_gid() == "critical line" else 0, mk)


def _label_phases(ax, pd, sw, sb):
    """The names of the ordered and chaotic regions at their centres (critical is a line: named in
    the legend), or "critical everywhere" across the axes."""
    if pd.everywhere_critical:
        ax.text(0.5, 0.5, r"critical everywhere ($\chi_J^\star = 1$)", transform=ax.transAxes, ha="center",
                va="center", fontsize=10, bbox=dict(boxstyle="round", fc="white", alpha=0.8), gid="phase label")
        return
    phase, names = np.asarray(pd.phase), pd.phase_names()
    SW, SB = np.meshgrid(sw, sb, indexing="ij")
    for code in (-1, 1):
        sel = phase == code
        if sel.sum() < max(2, 0.03 * sel.size):
            continue
        # the region's point nearest its centroid, so the label sits inside it
        cx, cy = SW[sel].mean(), SB[sel].mean()
        sx = (sw.max() - sw.min()) or 1.0
        sy = (sb.max() - sb.min()) or 1.0
        d = ((SW[sel] - cx) / sx) ** 2 + ((SB[sel] - cy) / sy) ** 2
        i = int(np.argmin(d))
        ax.text(SW[sel][i], SB[sel][i], str(names[sel][i]), ha="center", va="center", fontsize=10,
                bbox=dict(boxstyle="round", fc="white", alpha=0.75, lw=0.5), gid="phase label")


def _metadata(suffix, title, pd) -> dict:
    from . import __version__

    plain = title.replace("$", "").replace("\\", "")
    desc = (f"log chi_J* of {pd.architecture} on sigma_w {pd.sigma_w.min():g}..{pd.sigma_w.max():g} "
            f"({pd.sigma_w.size}) x sigma_b {pd.sigma_b.min():g}..{pd.sigma_b.max():g} ({pd.sigma_b.size})")
    creator = f"meanfield {__version__}"
    if suffix == ".pdf":
        return {"Title": plain, "Subject": desc, "Creator": creator}
    if suffix == ".svg":
        return {"Title": plain, "Description": desc, "Creator": creator}
    if suffix == ".png":
        return {"Title": plain, "Description": desc, "Software": creator}
    return {"Title": plain, "Creator": creator}
