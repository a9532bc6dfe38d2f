r"""The verification suite: Monte Carlo on real networks against the infinite-width theory.

Case lists ship with the package (``meanfield/verification/cases_quick.json``
for CI on a CPU, ``cases_full.json`` for a GPU; found with
:mod:`importlib.resources`, so they work from any folder after ``pip
install``), or come from any JSON file (``--cases FILE``). Each
case names an architecture, hyperparameters and a *kind* of comparison;
:func:`run_suite` runs the cases, saves each finished case at once (an
interrupted run resumes without redoing or losing it), and writes
``results.json``, ``report.md`` and ``plots/*.png``.

Pass rule (every compared point of a case must satisfy it)::

    |MC - theory| <= z * SE + c * (l / width) * |theory|   (+ c_B / batch * |theory| with BatchNorm)

SE is the standard error over initialisations, z = 4 (a 4-sigma statistical
band) and c = 2 unless a case states otherwise. The second term is the
finite-width allowance: the theory is the N -> infinity limit, and a
quantity measured at layer l has passed through l layers of width N, each
contributing an O(1/N) relative correction (J^{1,l} is a product of l
factors with O(1/N) biases; K^l inherits them through the kernel map).
BatchNorm's theory is also the |B| -> infinity limit, hence the O(1/|B|)
term. Slopes of log-log fits get the allowance c * l_max / width (the
derivative of a relative error c l / N with respect to log l).

A case may declare ``"expected": "fail"`` with a ``reason`` when the theory
it tests is known to be incomplete; it then reports ``xfail`` (failed as
expected) or ``xpass``. Only ``fail`` (and ``error``) count against the
suite.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from ._cases import KINDS, run_case
from ._checkpoints import _case_hash, _move_aside, _read_checkpoint, _write_json_atomic
from .montecarlo import resolve_device

__all__ = ["run_suite", "load_cases", "default_cases_path", "default_out_dir", "hardware_description", "KINDS"]


# ---------------------------------------------------------------------------
# Case files.
# ---------------------------------------------------------------------------
def _packaged_cases(quick: bool = True):
    """The packaged case list (an importlib.resources Traversable)."""
    from importlib.resources import files

    return files("meanfield.verification") / ("cases_quick.json" if quick else "cases_full.json")


def default_cases_path(quick: bool = True) -> Path:
    """Path of the case list shipped with the package: ``cases_quick.json`` or ``cases_full.json``."""
    return Path(str(_packaged_cases(quick)))


def load_cases(path=None, quick: bool = True) -> list:
    """The list of case dicts from a JSON file ({"cases": [...]} or a bare list).

    ``path=None`` reads the case list shipped with the package (quick or full).
    Raises FileNotFoundError for a missing file and ValueError (naming the file)
    for one that is not a list of cases with unique string ``id`` fields.
    """
    if path is None:
        src, text = f"the packaged {'quick' if quick else 'full'} case list", _packaged_cases(quick).read_text()
    else:
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"cases: {path} is a directory, not a JSON case file")
        if not path.exists():
            raise FileNotFoundError(f"cases: no such file: {path}")
        src = str(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cases: cannot read {path}: {err}") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ValueError(f"cases: {src} is not valid JSON ({err})") from None
    cases = data.get("cases") if isinstance(data, dict) else data
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"cases: {src} must hold a non-empty list of cases ({{\"cases\": [...]}} or [...])")
    for i, c in enumerate(cases):
        if not isinstance(c, dict) or not isinstance(c.get("id"), str) or not c["id"]:
            raise ValueError(f"cases: case {i} of {src} is not a dict with a string 'id'")
    ids = [c["id"] for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate case ids in {src}: {sorted(dup)}")
    return cases


def default_out_dir(quick: bool = True, device=None) -> Path:
    """Default report folder: ``./meanfield-verify/{quick,full}-{cpu,cuda}`` under the working directory.

    Never the package folder, never the committed reports of a source tree
    (refresh those only by naming them with ``out_dir``/``--out``).
    """
    return Path.cwd() / "meanfield-verify" / f"{'quick' if quick else 'full'}-{resolve_device(device).type}"


def _check_out_dir(out_dir: Path) -> Path:
    """Refuse report folders inside the installed package; make sure the folder is writable."""
    out_dir = Path(out_dir)
    pkg = Path(__file__).resolve().parents[1]
    resolved = out_dir.resolve()
    if resolved == pkg or pkg in resolved.parents:
        raise ValueError(f"out_dir: {out_dir} is inside the installed package ({pkg}); choose another folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out_dir: {out_dir} exists and is not a folder")
    try:
        (out_dir / "cases").mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"out_dir: cannot write the report to {out_dir} ({err.strerror or err})") from None
    return out_dir


# ---------------------------------------------------------------------------
# Plots.
# ---------------------------------------------------------------------------
#: mathtext names of the per-layer quantities drawn against the layer index l (titles and y labels)
_LAYER_QUANTITY_TEX = {"K": r"$K^l$", "chi_J": r"$\chi_J^l = \mathcal{J}^{l,l+1}$", "J": r"$\mathcal{J}^{1,l}$",
                       "K12": r"$K^l(x, x')$"}
_GRAM_TEX = {"nngp": r"NNGP $K(x_a, x_b)$", "ntk": r"NTK $\Theta(x_a, x_b)$"}


def _plot_case(res: dict, path: Path, dpi: int = 80):
    """Save one case's figure (:func:`_case_figure`) as a PNG at ``dpi``."""
    import matplotlib

    matplotlib.use("Agg")     # the suite runs headless (clusters, CI)
    import matplotlib.pyplot as plt

    fig = _case_figure(res)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _case_figure(res: dict):
    """One case's matplotlib Figure: Monte Carlo with error bars against the theory, axes and titles
    in mathtext (K^l, chi_J^l = J^{l,l+1}, layer l, 1/N ...), the case's id, title and status above."""
    kind, data = res["kind"], res["data"]
    # a '$' in a case's free-text title would start mathtext there
    title = f"{res['id']}: {res['title']} [{res['status']}]".replace("$", r"\$")
    draw = _KIND_FIGURES.get(kind)
    fig = draw(data) if draw is not None else _per_layer_figure(kind, data)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def _phase_diagram_figure(data):
    """log10 J^{l,l+1} on the grid, Monte Carlo and theory side by side on one colour scale, with the
    analytic critical line."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    sw, sb = np.array(data["sigma_w_axis"]), np.array(data["sigma_b_axis"])
    logs = {key: np.log10(np.clip(np.array(data[key], dtype=float), 1e-12, None)) for key in ("mc", "theory")}
    # one colour scale for both panels, so that the same colour is the same J in each
    lim = max(np.nanmax(np.abs(logs["mc"])), np.nanmax(np.abs(logs["theory"])), 1e-3)
    for ax, key, lab in ((axes[0], "mc", "Monte Carlo"), (axes[1], "theory", "theory (same depth)")):
        lv = logs[key]
        im = ax.pcolormesh(sb, sw, lv, cmap="RdBu_r", vmin=-lim, vmax=lim, shading="nearest")
        try:
            ax.contour(sb, sw, lv, levels=[0.0], colors="k", linestyles="--", linewidths=1)
        except Exception:
            pass
        cl = data.get("critical_line", {})
        if "sigma_b" in cl and not cl.get("everywhere_critical"):
            ax.plot(np.array(cl["sigma_b"], dtype=float), np.array(cl["sigma_w"], dtype=float), "k-", lw=1.5,
                    label="critical line (analytic)")
        ax.set_xlabel(r"$\sigma_b$")
        ax.set_ylabel(r"$\sigma_w$")
        ax.set_xlim(sb.min(), sb.max())
        ax.set_ylim(sw.min(), sw.max())
        jac = rf"\mathcal{{J}}^{{{data['layer']},{data['layer'] + 1}}}"
        ax.set_title(rf"{lab}: $\log_{{10}} {jac}$", fontsize=9)
        fig.colorbar(im, ax=ax, label=rf"$\log_{{10}} {jac}$ (0: critical)")
    if axes[0].get_legend_handles_labels()[0]:  # no line where the grid is critical everywhere
        axes[0].legend(fontsize=7, loc="lower right")
    return fig


def _width_scan_figure(data):
    """J^{l,l+1} against 1/N with the fit a + b/N and the infinite-width theory."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    rows = data["rows"]
    x = np.array([1.0 / r["width"] for r in rows])
    ax.errorbar(x, [r["mc"] for r in rows], yerr=[r["se"] for r in rows], fmt="o", label="Monte Carlo")
    xx = np.linspace(0, x.max() * 1.05, 20)
    ax.plot(xx, data["intercept"] + data["slope"] * xx, "C0--", lw=1, label=r"fit $a + b/N$")
    ax.errorbar([0], [data["intercept"]], yerr=[data["intercept_se"]], fmt="s", color="C0")
    ax.axhline(data["theory"], color="k", label=r"theory ($N = \infty$)")
    ax.set_xlabel(r"$1/N$ (inverse width)")
    ax.set_ylabel(r"$\mathcal{J}^{l,l+1}$")
    ax.set_title(r"$\mathcal{J}^{l,l+1}$ against the width $N$", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def _bn_batch_figure(data):
    """J^{l,l+1} against 1/|B| with the large-batch theory."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    rows = data["rows"]
    b = np.array([r["batch"] for r in rows], float)
    ax.errorbar(1 / b, [r["mc"] for r in rows], yerr=[r["se"] for r in rows], fmt="o", label="Monte Carlo")
    ax.axhline(rows[-1]["theory"], color="k", label="large-batch theory")
    ax.set_xlabel(r"$1/|B|$ (inverse batch size)")
    ax.set_ylabel(r"$\mathcal{J}^{l,l+1}$")
    ax.set_title(r"$\mathcal{J}^{l,l+1}$ against the batch size $|B|$", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def _gram_figure(data):
    """Monte Carlo against theory, entry by entry, one panel per kernel (NNGP, NTK)."""
    import matplotlib.pyplot as plt

    qs = data.get("quantities", {})
    fig, axes = plt.subplots(1, max(len(qs), 1), figsize=(3.8 * max(len(qs), 1), 3.5), squeeze=False)
    for ax, (k, q) in zip(axes[0], qs.items()):
        th = np.array(q["theory"], float)
        ax.errorbar(th, np.array(q["mc"], float), yerr=np.array(q["se"], float), fmt="o", ms=3, capsize=2,
                    label="Monte Carlo")
        ax.plot([th.min(), th.max()], [th.min(), th.max()], "k-", lw=1, label="MC = theory")
        ax.set_xlabel("theory (infinite width)")
        ax.set_ylabel("Monte Carlo (finite width)")
        ax.set_title(_GRAM_TEX[k], fontsize=9)
        ax.legend(fontsize=7)
    return fig


def _per_layer_figure(kind, data):
    """The per-layer quantities (K^l, chi_J^l, J^{1,l}, K12^l) against the layer index, one panel each:
    theory and Monte Carlo, or exact and Hutchinson estimates."""
    import matplotlib.pyplot as plt

    qs = data.get("quantities", {})
    keys = [k for k in ("K", "chi_J", "J", "K12") if k in qs]
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(3.6 * max(len(keys), 1), 3.3), squeeze=False)
    for ax, k in zip(axes[0], keys):
        q = qs[k]
        l = np.array(q["layers"], float)
        if "exact" in q:
            ax.errorbar(l, np.array(q["exact"], float), yerr=np.array(q["exact_se"], float), fmt="s", ms=3,
                        label="exact")
            ax.errorbar(l + 0.15, np.array(q["hutchinson"], float), yerr=np.array(q["hutchinson_se"], float),
                        fmt="o", ms=3, label="Hutchinson")
        else:
            th = np.array(q["theory"], float)
            ax.plot(l, th, "k-", lw=1.2, label="theory" if kind != "factorisation" else r"$\prod_{k<l} \mathcal{J}^{k,k+1}$")
            ax.errorbar(l, np.array(q["mc"], float), yerr=np.array(q["se"], float), fmt="o", ms=3, capsize=2,
                        label="Monte Carlo")
            if kind == "exponent" and k == "J":
                ax.set_xscale("log" if data.get("fit") == "log" else "linear")
                ax.set_yscale("log")
                lo, hi = data["fit_range"]
                ax.axvspan(lo, hi, color="0.9", zorder=0)
            elif k == "J":
                if np.nanmax(np.abs(np.log(np.clip(th[th > 0], 1e-300, None)))) > 2:
                    ax.set_yscale("log")
        ax.set_xlabel(r"layer $l$")
        ax.set_ylabel(_LAYER_QUANTITY_TEX[k])
        ax.set_title(_LAYER_QUANTITY_TEX[k], fontsize=9)
        ax.legend(fontsize=7)
    return fig


#: the figure of each case kind that has its own; the others draw their per-layer quantities
_KIND_FIGURES = {"phase_diagram": _phase_diagram_figure, "width_scan": _width_scan_figure,
                 "bn_batch": _bn_batch_figure, "gram": _gram_figure}


# ---------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------


def hardware_description(device) -> dict:
    dev = resolve_device(device)
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"device": str(dev), "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform()}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    return info


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or None
    except Exception:
        return None


def run_suite(cases=None, out_dir=None, device=None, quick: bool = True, *, dtype=torch.float64, resume: bool = True,
              progress: bool = True, only=None, plots: bool = True, dpi: int = 80, client=None) -> dict:
    """Run verification cases, checkpointing each, and write JSON, Markdown and plots.

    Parameters
    ----------
    cases : list of dicts, path to a case file, or None
        None loads the packaged ``cases_quick.json`` (``quick``) or ``cases_full.json``.
    out_dir : path
        Where ``cases/<id>.json`` (the checkpoints), ``results.json``,
        ``report.md`` and ``plots/`` go. Default
        ``./meanfield-verify/{quick,full}-{cpu,cuda}`` in the working
        directory (never inside the package; the committed reports of the
        source tree are refreshed only when named here).
    device : None, 'cpu', 'cuda'
    quick : bool
        Selects the default case file and the report's title.
    resume : bool
        Reuse finished cases whose checkpoint matches the case, device and
        dtype (a changed case is rerun). A checkpoint that cannot be used
        (truncated, not a result dict, a folder in its place) is recomputed
        with a warning.
    only : iterable of case ids, optional
        Run only these (ValueError for an empty selection or an unknown id).
    client : dask.distributed.Client, optional
        Run the cases that have no valid checkpoint on a Dask cluster, each
        saved as it completes (:func:`meanfield.verification.distributed.run_cases`).

    Returns
    -------
    dict with ``results`` (one dict per case), ``summary`` and the paths written.
    """
    dev = resolve_device(device)
    cases = _select_cases(cases, quick, only)
    out_dir = _check_out_dir(default_out_dir(quick, dev) if out_dir is None else out_dir)
    if plots:
        (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    computed = {}
    if client is not None:  # missing cases on a Dask cluster, checkpointed as they complete
        from .distributed import run_cases

        computed = run_cases(client, cases, dev, dtype, out_dir / "cases", resume=resume, progress=progress)
    results = _run_cases(cases, dev, dtype, out_dir, computed, resume, progress, plots, dpi)
    summary = _summarise(results, quick, dev, dtype, time.perf_counter() - t0)
    _write_reports(out_dir, summary, results)
    return {"summary": summary, "results": results, "out_dir": str(out_dir)}


def _select_cases(cases, quick, only) -> list:
    """The case dicts to run: loaded from a file (or the packaged list) and restricted to ``only``."""
    if cases is None or isinstance(cases, (str, os.PathLike)):
        cases = load_cases(cases, quick)
    cases = [dict(c) for c in cases]
    if only is None:
        return cases
    only = [only] if isinstance(only, str) else list(only)
    if not only:
        raise ValueError("only: give at least one case id (omit it to run every case)")
    known = [c["id"] for c in cases]
    unknown = [i for i in only if i not in known]
    if unknown:
        raise ValueError(f"only: unknown case id(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(known)}")
    return [c for c in cases if c["id"] in set(only)]


def _case_result(case, dev, dtype, out_dir, computed, resume) -> dict:
    """One case's result: computed on a cluster, resumed from a valid checkpoint, or run now and checkpointed."""
    h = _case_hash(case, dev, dtype)
    ckpt = out_dir / "cases" / f"{case['id']}.json"
    res = computed.get(case["id"])
    if res is None and resume:
        res = _read_checkpoint(ckpt, case["id"], h)
    if res is None and (ckpt.is_dir() or ckpt.is_symlink() and not ckpt.exists()):
        ckpt = _move_aside(ckpt)
    if res is None:
        res = run_case(case, dev, dtype)
        res["hash"] = h
        _write_json_atomic(ckpt, res)
    return res


def _attach_plot(res, case_id, out_dir, dpi) -> None:
    """Draw the case's figure into ``plots/``; a failed plot is noted in the details, never fatal."""
    if not res.get("data"):
        return
    try:
        _plot_case(res, out_dir / "plots" / f"{case_id}.png", dpi=dpi)
        res["plot"] = f"plots/{case_id}.png"
    except Exception as err:  # a plot must not lose a result
        res.setdefault("details", []).append(f"(plot failed: {err!r})")


def _run_cases(cases, dev, dtype, out_dir, computed, resume, progress, plots, dpi) -> list:
    """Every case's result, in order, with a progress bar."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(cases), desc="verification", unit="case")
    results = []
    try:
        for case in cases:
            if bar is not None:
                bar.set_postfix_str(case["id"])
            res = _case_result(case, dev, dtype, out_dir, computed, resume)
            if plots:
                _attach_plot(res, case["id"], out_dir, dpi)
            results.append(res)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


def _summarise(results, quick, dev, dtype, wall_seconds) -> dict:
    """Counts by status, overall verdict, times, hardware and the pass rule."""
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {"mode": "quick" if quick else "full", "n_cases": len(results), "counts": counts,
            "ok": all(r["status"] in ("pass", "xfail", "xpass") for r in results),
            "wall_seconds": wall_seconds,
            # time spent in this run only: resumed cases cost nothing now
            "case_seconds": sum(r.get("seconds", 0.0) for r in results if not r.get("resumed")),
            "resumed": sum(bool(r.get("resumed")) for r in results),
            "hardware": hardware_description(dev), "dtype": str(dtype).replace("torch.", ""),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": _git_commit(),
            "allowance_rule": "|MC - theory| <= z SE + c (l / width) |theory| (+ c/|B| |theory| with "
                              "BatchNorm), z = 4, c = 2 unless the case says otherwise"}


def _write_reports(out_dir, summary, results) -> None:
    """results.json (without the bulky data and tracebacks) and report.md."""
    slim = [{k: v for k, v in r.items() if k not in ("data", "traceback")} for r in results]
    _write_json_atomic(out_dir / "results.json", {"summary": summary, "results": slim})
    (out_dir / "report.md").write_text(_report(summary, results))


# ---------------------------------------------------------------------------
# Markdown report.
# ---------------------------------------------------------------------------
def _headline(r) -> str:
    """The detail line that matters: the first failing quantity, else the APJN line, else the first."""
    det = r.get("details") or [""]
    for d in det:
        if " 0/" not in d and "points outside" in d or "layers outside" in d and " 0/" not in d:
            return d
    for d in det:
        if d.startswith("chi_J") or d.startswith("extrapolated"):
            return d
    return det[0]


_BADGE = {"pass": "PASS", "fail": "**FAIL**", "xfail": "xfail (known gap)", "xpass": "XPASS", "error": "**ERROR**"}


def _report(summary, results) -> str:
    hw = summary["hardware"]
    dev = hw.get("gpu") or hw["cpu"]
    lines = [f"# Verification report ({summary['mode']})", "",
             f"- Date: {summary['date']}" + (f", commit `{summary['commit']}`" if summary.get("commit") else ""),
             f"- Hardware: {'GPU ' + hw['gpu'] + ' (CUDA ' + str(hw.get('cuda')) + '), ' if hw.get('gpu') else ''}"
             f"CPU {hw['cpu']} ({hw['cpu_count']} cores, torch threads {hw['torch_threads']})",
             f"- Device used: `{hw['device']}`; dtype {summary['dtype']}; torch {hw['torch']}, Python {hw['python']}, "
             f"numpy {hw['numpy']}",
             f"- Cases: {summary['n_cases']}; " + ", ".join(f"{k}: {v}" for k, v in sorted(summary["counts"].items()))
             + f"; wall time {summary['wall_seconds']:.0f} s (case compute {summary['case_seconds']:.0f} s"
             + (f"; {summary['resumed']} cases resumed from checkpoints" if summary.get("resumed") else "") + ")",
             f"- Pass rule: {summary['allowance_rule']}. Every compared point of a case must satisfy it.",
             f"- Overall: {'OK' if summary['ok'] else 'FAILURES'} on {dev}", "",
             "| case | kind | status | time (s) | summary |", "|---|---|---|---:|---|"]
    for r in results:
        first = _headline(r).replace("|", "\\|")
        lines.append(f"| [{r['id']}](#{r['id'].lower()}) | {r['kind']} | {_BADGE.get(r['status'], r['status'])} | "
                     f"{r.get('seconds', 0):.1f} | {first} |")
    gaps = [r for r in results if r["status"] in ("xfail", "fail")]
    if gaps:
        lines += ["", "## Where theory and Monte Carlo disagree", ""]
        for r in gaps:
            lines.append(f"- **{r['id']}** ({r['title']}): {_headline(r)}" + (f". Known gap: {r['reason']}"
                                                                             if r.get("reason") else ""))
    lines += ["", "## Cases", ""]
    for r in results:
        c = r["case"]
        lines += [f"### {r['id']}", "", f"**{r['title']}** - {_BADGE.get(r['status'], r['status'])}", ""]
        if r.get("paper"):
            lines.append(f"Reference: {r['paper']}")
            lines.append("")
        arch = c.get("arch", {})
        setup = ", ".join(f"{k}={v}" for k, v in arch.items())
        params = ", ".join(f"{k}={c[k]}" for k in ("sigma_w", "sigma_b", "critical_point", "depth", "width", "n_init",
                                                   "batch", "batches", "tokens", "input_norm", "n_probes") if k in c)
        lines.append(f"Setup: {setup}; {params}" + (" (resumed from checkpoint)" if r.get("resumed") else ""))
        lines.append("")
        for d in r.get("details", []):
            lines.append(f"- {d}")
        if r.get("reason"):
            lines.append(f"- Known gap: {r['reason']}")
        if r.get("plot"):
            lines += ["", f"![{r['id']}]({r['plot']})"]
        lines.append("")
    return "\n".join(lines) + "\n"
