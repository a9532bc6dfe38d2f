"""The ``meanfield`` command line (also ``python -m meanfield``).

Every subcommand takes the same architecture options
(``--activation gelu --norm ln_pre --mu 0.5``) and ``--json`` for
machine-readable output. A user never sees a traceback: a problem with what
was typed prints one line on stderr and exits with status 2; a failure while
running (a file that cannot be written, an output pipe closed early, an
internal error) prints one line and exits with status 1
(``MEANFIELD_DEBUG=1`` shows the traceback).

Subcommands: recursion, critical-point, critical-line, exponents,
phase-diagram, verify, autoinit, kernels, cache.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path

# Only light modules here: --help and --version must not load numpy, sympy, numba, scipy or
# matplotlib (tests/test_cli.py checks). Each command imports what it needs.
from ._names import ACTIVATION_NAMES, BLOCKS, FIGURE_FORMATS, NORMS, expression_help

__all__ = ["main", "build_parser"]

EXIT_USAGE = 2
EXIT_FAILURE = 1

GRID_HELP = ("'start:stop:count' (count evenly spaced values from start to stop, both included) "
             "or a comma-separated list of values")

def _grid_epilog(options) -> str:
    return f"Grids ({', '.join(options)}) are {GRID_HELP}, e.g. 0.5:3:11 or 1,1.5,2. "

EPILOG = ("Exit status: 0 success; 1 a failure while running (a file that cannot be written, the output "
          "closed early, a verification case failing); 2 a usage error (a bad option or value). Errors are "
          "one line on stderr; MEANFIELD_DEBUG=1 shows tracebacks. The first use of an activation compiles "
          "its recursions (one line on stderr says so); see 'meanfield cache info'.")


class UsageError(Exception):
    """A problem with what the user typed: one line, exit status 2 (main() adds the 'meanfield CMD: error:' prefix)."""

    def __init__(self, message, prog=None):
        super().__init__(message)
        self.prog = prog


class RunError(Exception):
    """A failure while running (e.g. an output file that cannot be written): one line, exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        if message.endswith("expected one argument"):   # e.g. --sigma-w -1,2: argparse reads -1,2 as an option
            message += f" (a value that starts with '-' goes after '=', e.g. {message.split()[1].rstrip(':')}=-1,2)"
        raise UsageError(message, prog=self.prog)


# ---------------------------------------------------------------------------
# Shared options.
# ---------------------------------------------------------------------------
def _add_arch_options(p):
    g = p.add_argument_group("architecture")
    g.add_argument("--activation", default="relu", metavar="NAME|EXPR",
                   help=f"activation: one of {', '.join(ACTIVATION_NAMES)}, or {expression_help()}, quoted, "
                        "e.g. \"x*erf(x)\" (default relu)")
    g.add_argument("--negative-slope", type=float, default=None,
                   help="negative slope for --activation leaky_relu (default 0.01)")
    g.add_argument("--norm", default="none", choices=NORMS, help="normalisation in an MLP block (default none)")
    g.add_argument("--mu", type=float, default=None,
                   help="residual strength in [0, 1]; omit for no skip connection")
    g.add_argument("--block", default="mlp", choices=BLOCKS, help="block type (default mlp)")
    g.add_argument("--eps", type=float, default=0.1, help="LayerScale of resmlp blocks, >= 0 (default 0.1)")
    g.add_argument("--stages", type=int, default=1, help="norm->phi->Dense stages per MLP block, >= 1 (default 1)")
    g.add_argument("--spec", default=None, metavar="FILE.json",
                   help="any architecture as a JSON file (meanfield.to_json of a Network or Architecture); "
                        "replaces the options above")


def _finite(text):
    """argparse type: a finite float (nan and inf are refused with the option's name)."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError
    return v


_finite.__name__ = "finite number"



def _add_json(p, loads_with=None):
    p.add_argument("--json", action="store_true", help="print the result as JSON" + (
        f" (saved to a .json file it loads with {loads_with}.load)" if loads_with else ""))


def _architecture(args):
    from .calculus import as_architecture, from_json

    if getattr(args, "spec", None) is not None:
        menu = {"activation": "relu", "norm": "none", "mu": None, "block": "mlp", "eps": 0.1, "stages": 1,
                "negative_slope": None}
        clash = [k for k, d in menu.items() if getattr(args, k, d) != d]
        if clash:
            raise UsageError(f"--spec replaces the architecture options; drop --{clash[0].replace('_', '-')}")
        from pathlib import Path

        if not Path(args.spec).is_file():
            raise UsageError(f"--spec {args.spec!r}: no such file")
        try:
            return from_json(Path(args.spec))
        except (ValueError, json.JSONDecodeError) as err:
            raise UsageError(f"--spec {args.spec}: {err}") from None

    kw = dict(activation=_activation(args.activation), norm=args.norm, mu=args.mu, block=args.block,
              eps=args.eps, stages=args.stages)
    if args.negative_slope is not None:
        kw["negative_slope"] = args.negative_slope
    return as_architecture(**kw)


def _activation(text: str):
    """--activation: a built-in name as given, else the sympy expression the text spells (parsed safely)."""
    if text.strip().lower() in ACTIVATION_NAMES:
        return text
    from .activations import parse_activation

    try:
        return parse_activation(text)
    except ValueError as err:
        raise UsageError(f"--activation {text!r}: {err}; give one of {', '.join(ACTIVATION_NAMES)}, or "
                         f"{expression_help()}") from None


MAX_GRID = 1_000_000


def parse_grid(text: str, name: str) -> np.ndarray:
    """'a:b:n' (n points from a to b, both included) or 'v1,v2,...' -> float64 array of finite values."""
    import numpy as np

    try:
        if ":" in text:
            a, b, n = text.split(":")
            n = int(n)
            if not 1 <= n <= MAX_GRID:
                raise ValueError
            out = np.linspace(float(a), float(b), n)
        else:
            out = np.array([float(v) for v in text.split(",")], dtype=np.float64)
        if out.size == 0 or not np.all(np.isfinite(out)):
            raise ValueError
        return out
    except ValueError:
        raise UsageError(f"--{name} takes {GRID_HELP} (finite numbers, count 1..{MAX_GRID}), got {text!r}") \
            from None


def _emit(args, result, text: str | None = None):
    """Print ``text`` (default ``str(result)``), or with --json: a result as the file Result.save writes
    (so ``> file.json`` loads with ``Result.load``), anything else (a summary) as plain JSON."""
    from ._serialize import Result, dumps, to_jsonable

    if getattr(args, "json", False):
        print(dumps(result, indent=1) if isinstance(result, Result)
              else json.dumps(to_jsonable(result), indent=2, allow_nan=False))
    else:
        print(text if text is not None else result)


# ---------------------------------------------------------------------------
# Commands.
# ---------------------------------------------------------------------------
def cmd_recursion(args):
    from .symbolic import recursion

    rec = recursion(_architecture(args))
    if args.json:   # loads with meanfield.Recursion.load
        print(json.dumps(rec.to_dict(), indent=2))
    elif args.latex:
        print(rec.latex())
    else:
        print(rec)


def _g(v) -> str:
    return f"{float(v):.10g}"


def _g0(v, scale=1.0) -> str:
    """A value that should be zero but carries solver noise is shown as such (not as 2.83e-09)."""
    v = float(v)
    if v != 0 and math.isfinite(v) and abs(v) <= 1e-7 * max(abs(float(scale)), 1.0):
        return f"0 (to solver precision; computed {v:.2g})"
    return _g(v)


def _text_critical_points(res) -> str:
    lines = [f"{res.architecture}: " + (
        "critical everywhere in the (sigma_w, sigma_b) plane" if res.everywhere_critical else
        f"{len(res.points)} critical point{'s' if len(res.points) != 1 else ''} (chi_J* = chi_K* = 1)")]
    for p in res.points:
        lines.append(f"  sigma_w = {_g(p.sigma_w)}  sigma_b = {_g0(p.sigma_b, p.sigma_w)}  K* = {_g0(p.K_star)}  "
                     f"({p.stability}); a unit-norm input reaches K = {_g(p.unit_input_reaches)}")
    if res.note:
        lines.append(f"  note: {res.note}")
    return "\n".join(lines)


def cmd_critical_point(args):
    import meanfield as mf

    res = mf.critical_point(_architecture(args))
    _emit(args, res, text=_text_critical_points(res))


def cmd_critical_line(args):
    import numpy as np

    import meanfield as mf
    from ._serialize import write_csv

    sw = parse_grid(args.sigma_w, "sigma-w")
    line = mf.critical_line(_architecture(args), sigma_w=sw)
    if args.json:
        _emit(args, line)
        return
    if args.csv:   # what CriticalLine.save(...csv) writes: loads with CriticalLine.load
        write_csv(line, sys.stdout)
        return
    sb = np.asarray(line.sigma_b, dtype=float)
    sw_out = np.asarray(line.sigma_w, dtype=float)
    if line.everywhere_critical:
        print(f"{line.architecture}: critical everywhere; {line.note}")
        return
    rows = [f"{line.architecture}: critical line (chi_J* = 1)", f"{'sigma_w':>14} {'sigma_b':>14} {'K*':>14}"]
    for a, b, k in zip(np.broadcast_to(sw_out, sb.shape), sb, np.broadcast_to(line.K_star, sb.shape)):
        rows.append(f"{_g(a):>14} {_g0(b, a):>14} {_g0(k):>14}")
    if np.any(np.isnan(sb)):
        rows.append("nan: no critical line at that sigma_w")
    if line.note:
        rows.append(f"note: {line.note}")
    print("\n".join(rows))


def cmd_exponents(args):
    import meanfield as mf

    e = mf.exponents(_architecture(args), sigma_w=args.sigma_w, sigma_b=args.sigma_b)
    text = (f"{e.architecture} at sigma_w = {_g(e.sigma_w)}, sigma_b = {_g(e.sigma_b)}: {e.regime}\n"
            f"  K* = {_g0(e.K_star)}  chi_J* = {_g(e.chi_J)}  chi_K* = {_g(e.chi_K)}")
    if all(v is not None and math.isnan(v) for v in (e.zeta_K, e.zeta_K_numeric, e.zeta, e.zeta_numeric)):
        text += "\n  zeta_K, zeta: none (no power law here; see the note)"
    else:
        text += (f"\n  zeta_K = {_g(e.zeta_K)} (numeric {_g(e.zeta_K_numeric)})   "
                 f"zeta = {_g(e.zeta)} (numeric {_g(e.zeta_numeric)}), J^(l0,l) ~ l^-zeta"
                 "  (nan: that exponent is not defined here)" * any(
                     v is not None and math.isnan(v) for v in (e.zeta_K, e.zeta_K_numeric, e.zeta, e.zeta_numeric)))
    # only a stretched exponential has c~ and lambda; elsewhere they are nan and not shown
    if e.c_tilde is not None and math.isfinite(e.c_tilde):
        text += f"\n  stretched exponential: c~ = {_g(e.c_tilde)}, lambda = {_g(e.lambda_)}"
    if e.note:
        text += f"\n  note: {e.note}"
    _emit(args, e, text=text)


#: extensions of --out that name a file type; anything else after a dot is part of the name
_FIGURE_EXTS = FIGURE_FORMATS
_OUT_EXTS = _FIGURE_EXTS + (".csv", ".json")


def _out_prefix(text: str):
    """--out PREFIX[.png|.pdf|.svg|.csv|.json] -> (prefix path, figure extension).

    Only these known extensions are stripped: ``sweep_mu0.5`` is a prefix
    (files sweep_mu0.5.png, .csv, .json), ``fig.pdf`` writes a PDF figure.
    """
    out = Path(text)
    ext = out.suffix.lower()
    if ext in _OUT_EXTS:
        out = out.with_name(out.name[: -len(ext)])
    if not out.name or out.name in (".", ".."):
        raise UsageError(f"--out needs a file name prefix, got {text!r}")
    return out, (ext if ext in _FIGURE_EXTS else ".png")


def _check_writable(paths, option):
    """Make the folder of each path (creating it) and check each file can be written, before any work."""
    for path in paths:
        folder = path.parent
        try:
            if folder.exists() and not folder.is_dir():
                raise UsageError(f"{option}: {folder} is not a folder")
            folder.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                raise UsageError(f"{option}: {path} is a folder, not a file")
            existed = path.exists()
            with open(path, "a"):
                pass
            if not existed:
                path.unlink()
        except OSError as err:
            raise UsageError(f"{option}: cannot write {path} ({err.strerror or err})") from None


def cmd_phase_diagram(args):
    import meanfield as mf
    from .plotting import plot_phase_diagram

    arch = _architecture(args)
    sw = parse_grid(args.sigma_w, "sigma-w")
    sb = parse_grid(args.sigma_b, "sigma-b")
    if not (math.isfinite(args.tol) and args.tol >= 0):
        raise UsageError(f"--tol must be >= 0, got {args.tol}")
    if args.dpi < 1:
        raise UsageError(f"--dpi must be >= 1, got {args.dpi}")
    prefix, fig_ext = _out_prefix(args.out)
    paths = {"figure": prefix.parent / (prefix.name + fig_ext), "csv": prefix.parent / (prefix.name + ".csv"),
             "json": prefix.parent / (prefix.name + ".json")}
    _check_writable(paths.values(), "--out")   # before the work, so none is lost
    pd = mf.phase_diagram(arch, sigma_w=sw, sigma_b=sb, tol=args.tol)
    try:
        pd.save(paths["csv"])    # one row per grid point, the phase by name (meanfield.PHASES)
        pd.save(paths["json"])   # both load with mf.PhaseDiagram.load
        ax = plot_phase_diagram(pd, path=paths["figure"], dpi=args.dpi)
    except OSError as err:
        raise RunError(f"cannot write the phase diagram's files ({err.strerror or err})") from None
    import matplotlib.pyplot as plt

    plt.close(ax.figure)
    counts = pd.counts()
    crossings = _line_crossings(pd.chi_J)
    files = {k: str(v) for k, v in paths.items()}
    if args.json:
        print(json.dumps({"architecture": str(arch), "files": files, "points": counts, "tol": args.tol,
                          "critical_line_crossings": crossings, **_grid_data(pd)}, indent=2, allow_nan=False))
        return
    rows = [f"{arch}: phase diagram on {len(sw)} x {len(sb)} points (sigma_w x sigma_b)",
            f"  {'phase':<14} {'points':>7}"]
    rows += [f"  {name:<14} {n:>7}" for name, n in counts.items()]
    rows.append(f"  ('critical' counts grid points with |chi_J* - 1| <= {args.tol:g} (--tol); the critical line "
                f"passes between {crossings} pairs of neighbouring points)")
    rows += [f"{k}: {v}" for k, v in files.items()]
    print("\n".join(rows))


def _grid_data(pd) -> dict:
    """The phase diagram's arrays as JSON-ready lists (NaN/inf as null), indexed [i_sigma_w][j_sigma_b],
    named as PhaseDiagram's attributes."""
    import numpy as np

    def lst(a):
        a = np.asarray(a, dtype=float)
        return [[float(v) if math.isfinite(v) else None for v in row] for row in a]

    return {"sigma_w": [float(v) for v in pd.sigma_w], "sigma_b": [float(v) for v in pd.sigma_b],
            "K": lst(pd.K), "chi_J": lst(pd.chi_J), "xi": lst(pd.xi), "phase": pd.phase_names().tolist()}


def _line_crossings(chi) -> int:
    """Neighbouring grid points (along either axis) on opposite sides of chi_J* = 1."""
    import numpy as np

    with np.errstate(invalid="ignore"):
        side = np.sign(np.asarray(chi, dtype=float) - 1.0)
    n = 0
    for axis in (0, 1):
        a, b = np.moveaxis(side, axis, 0)[:-1], np.moveaxis(side, axis, 0)[1:]
        n += int(np.sum((a * b < 0) & np.isfinite(a) & np.isfinite(b)))
    return n


def cmd_verify(args):
    from .verification.__main__ import run

    args.quick = not args.full   # meanfield verify runs the quick list unless --full
    return run(args, prog="meanfield verify")


def cmd_cache(args):
    from . import _cache

    if args.action == "clear":
        res = _cache.clear()
        if args.json:
            print(json.dumps(res, indent=2))
        else:
            print(f"removed {res['files']} files ({res['bytes'] / 2**20:.1f} MiB) from {res['path']}")
        return
    res = _cache.info()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"meanfield cache: {res['path']} (chosen by {res['chosen_by']})\n"
          f"  {res['files']} files, {res['bytes'] / 2**20:.1f} MiB, compiled recursions of "
          f"{res['architectures']} architecture(s)\n"
          "  move it: set MEANFIELD_CACHE_DIR=/another/folder (or XDG_CACHE_HOME); "
          "empty it: meanfield cache clear (the next call recompiles)"
          + (f"\n  numba's cache of the solver kernels: NUMBA_CACHE_DIR={res['numba_cache_dir_env']}"
             if res["numba_cache_dir_env"] else ""))


def _autoinit_model(args):
    """One of the package's model definitions, initialised at sigma_w (fan-in)."""
    import torch

    from .torch import models

    if args.model == "mlp":
        from .torch.activations import TORCH_ACTIVATIONS, torch_module

        acts = tuple(n for n, row in TORCH_ACTIVATIONS.items() if row.module is not None)
        if args.activation not in acts:
            raise UsageError(f"--activation for --model mlp must be one of {', '.join(acts)}")
        gen = torch.Generator().manual_seed(args.seed)
        layers = []
        for _ in range(args.depth):
            lin = torch.nn.Linear(args.width, args.width)
            with torch.no_grad():
                lin.weight.normal_(0.0, args.sigma_w / args.width ** 0.5, generator=gen)
                lin.bias.zero_()
            layers += [lin, torch_module(args.activation)]
        model = torch.nn.Sequential(*layers)
        x = torch.randn(args.batch, args.width, generator=gen)
    elif args.model == "resmlp":
        model = models.ResMLP(img_size=32, patch_size=8, dim=args.width, depth=args.depth, num_classes=10,
                              activation=args.activation, init="fan_in", sigma_w=args.sigma_w, seed=args.seed)
        x = torch.randn(args.batch, 3, 32, 32, generator=torch.Generator().manual_seed(args.seed))
    else:
        model = models.vgg19_bn(width=args.width / 512, num_classes=10, hidden=args.width, pool_size=1,
                                img_size=32, init="fan_in", sigma_w=args.sigma_w, seed=args.seed)
        x = torch.randn(args.batch, 3, 32, 32, generator=torch.Generator().manual_seed(args.seed))
    return model, x


def _load_inputs(path, option):
    """An (n, d) float array from a .npy file (a 1-d array is one input); (n, T, d) images for token blocks."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{option}: {path} is not a file")
    try:
        a = np.load(p, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise UsageError(f"{option}: cannot read {path} as a .npy array ({err})") from None
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim not in (2, 3) or a.dtype.kind not in "biuf":
        raise UsageError(f"{option}: expected a numeric array of shape (n, d) (or images "
                         f"(n, T, d) for --block resmlp/mixer), got "
                         f"{a.dtype} {a.shape}")
    return a.astype(np.float64)


def cmd_kernels(args):
    from .gram import kernels

    x1 = _load_inputs(args.inputs, "--inputs")
    x2 = _load_inputs(args.inputs2, "--inputs2") if args.inputs2 else None
    out = Path(args.out)
    if out.suffix not in (".npz", ".json"):
        raise UsageError(f"--out must end in .npz or .json, got {args.out!r}")
    _check_writable([out], "--out")
    get = ("nngp", "ntk") if args.get == "both" else (args.get,)
    r = kernels(_architecture(args), x1, x2, depth=args.depth, sigma_w=args.sigma_w, sigma_b=args.sigma_b,
                parameterization=args.parameterization, get=get, width=args.width)
    try:
        r.save(out)
    except OSError as err:
        raise RunError(f"cannot write {out} ({err.strerror or err})") from None
    shape = (x1.shape[0], (x2 if x2 is not None else x1).shape[0])
    summary = {"out": str(out), "shape": list(shape), "depth": args.depth, "sigma_w": args.sigma_w,
               "sigma_b": args.sigma_b, "parameterization": args.parameterization, "get": list(get)}
    text = (f"{r.architecture}, depth {args.depth}, sigma_w = {_g(args.sigma_w)}, sigma_b = {_g(args.sigma_b)} "
            f"({args.parameterization} parameterisation): {' and '.join(get)} Gram matrices of shape "
            f"{shape[0]} x {shape[1]} written to {out} (meanfield.gram.Kernels.load reads it)")
    _emit(args, summary, text=text)


def _progress_bar(args) -> bool:
    """A progress bar only for a person watching: stderr a terminal, and no --json."""
    return not getattr(args, "json", False) and sys.stderr.isatty()


AUTOINIT_MAX = {"depth": 1000, "width": 8192, "steps": 100_000, "batch": 4096}


def cmd_autoinit(args):
    for name, v, lo, hi in (("--depth", args.depth, 1, AUTOINIT_MAX["depth"]),
                            ("--width", args.width, 1, AUTOINIT_MAX["width"]),
                            ("--steps", args.steps, 1, AUTOINIT_MAX["steps"]),
                            ("--batch", args.batch, 2, AUTOINIT_MAX["batch"])):
        if not lo <= v <= hi:
            raise UsageError(f"{name} must be between {lo} and {hi}, got {v}")
    if not args.sigma_w > 0:
        raise UsageError(f"--sigma-w must be > 0, got {args.sigma_w}")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    acts = ("relu", "gelu", "tanh", "silu")
    if args.activation not in acts:
        raise UsageError(f"--activation must be one of {', '.join(acts)}, got {args.activation!r}")
    out = Path(args.out)
    _check_writable([out], "--out")   # before tuning, so no work is lost
    import numpy as np

    from .torch.autoinit import autoinit, save_scales   # torch: after the checks, which need none

    model, x = _autoinit_model(args)
    _, report = autoinit(model, x, steps=args.steps, seed=args.seed, progress=_progress_bar(args))
    try:
        save_scales(report, out, model=args.model, depth=args.depth, width=args.width,
                    activation=args.activation, sigma_w=args.sigma_w, seed=args.seed)
    except OSError as err:
        raise RunError(f"cannot write {out} ({err.strerror or err})") from None
    summary = {"model": args.model, "out": args.out, "steps": report.steps, "converged": report.converged,
               "J_before": report.J_before, "J_after": report.J_after}
    text = (f"AutoInit ({args.model}): {report.steps} steps, converged={report.converged}\n"
            f"J^(l,l+1) before: {np.array2string(np.asarray(report.J_before), precision=3)}\n"
            f"J^(l,l+1) after:  {np.array2string(np.asarray(report.J_after), precision=3)}\n"
            f"tuned initialisation written to {args.out}")
    _emit(args, summary, text=text)


# ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = _Parser(prog="meanfield", description="Mean-field theory of deep-network initialisation.", epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"meanfield {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add_subcommand in _SUBCOMMANDS:   # in this order in --help
        add_subcommand(sub)
    return p


def _add_command(sub, name, grid=(), **kw):
    """A subcommand parser; the grid paragraph in its epilog only where there are grid options."""
    return sub.add_parser(name, epilog=(_grid_epilog(grid) if grid else "") + EPILOG, **kw)


def _add_recursion_parser(sub) -> None:
    """The `meanfield recursion` subcommand."""
    s = _add_command(
        sub, "recursion", help="print the derived infinite-width recursions",
        description="Print K^{l+1}(K^l), chi_J, chi_K for an architecture.")
    _add_arch_options(s)
    s.add_argument("--latex", action="store_true", help="print LaTeX instead of text")
    _add_json(s, "meanfield.Recursion")
    s.set_defaults(func=cmd_recursion)


def _add_critical_point_parser(sub) -> None:
    """The `meanfield critical-point` subcommand."""
    s = _add_command(
        sub, "critical-point", help="points with chi_J* = chi_K* = 1",
        description="All critical points (chi_J* = chi_K* = 1) with K* and stability.")
    _add_arch_options(s)
    _add_json(s, "meanfield.CriticalPoints")
    s.set_defaults(func=cmd_critical_point)


def _add_critical_line_parser(sub) -> None:
    """The `meanfield critical-line` subcommand."""
    s = _add_command(
        sub, "critical-line", grid=("--sigma-w",), help="sigma_b on the critical line for given sigma_w",
        description="sigma_b(sigma_w) with chi_J* = 1 (nan where no line exists), printed as a table.")
    _add_arch_options(s)
    s.add_argument("--sigma-w", default="0.5:3:11", metavar="GRID",
                   help=f"sigma_w values: {GRID_HELP} (default 0.5:3:11)")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true",
                     help="print CSV: a '# meanfield' line, then columns sigma_w, sigma_b, K_star, chi_K, reached "
                          "(saved to a .csv file it loads with meanfield.CriticalLine.load)")
    fmt.add_argument("--json", action="store_true",
                     help="print the result as JSON (saved to a .json file it loads with meanfield.CriticalLine.load)")
    s.set_defaults(func=cmd_critical_line)


def _add_exponents_parser(sub) -> None:
    """The `meanfield exponents` subcommand."""
    s = _add_command(
        sub, "exponents", help="critical exponents zeta_K and zeta",
        description="Critical exponents, analytic (series) and numeric (deep iteration).")
    _add_arch_options(s)
    s.add_argument("--sigma-w", type=_finite, required=True, metavar="X", help="weight scale sigma_w (>= 0)")
    s.add_argument("--sigma-b", type=_finite, required=True, metavar="X", help="bias scale sigma_b (>= 0)")
    _add_json(s, "meanfield.Exponents")
    s.set_defaults(func=cmd_exponents)


def _add_phase_diagram_parser(sub) -> None:
    """The `meanfield phase-diagram` subcommand."""
    s = _add_command(
        sub, "phase-diagram", grid=("--sigma-w", "--sigma-b"),
        help="chi_J*, xi and phase on a grid; writes a figure, CSV and JSON",
        description="Phase diagram on a (sigma_w, sigma_b) grid: writes PREFIX.png (or .pdf/.svg), "
                    "PREFIX.csv and PREFIX.json (both load with meanfield.PhaseDiagram.load), and prints the "
                    "phase counts (or, with --json, a summary with the data).")
    _add_arch_options(s)
    s.add_argument("--sigma-w", default="0.1:3:60", metavar="GRID", help=f"sigma_w values: {GRID_HELP} "
                   "(default 0.1:3:60)")
    s.add_argument("--sigma-b", default="0:2:40", metavar="GRID", help=f"sigma_b values: {GRID_HELP} "
                   "(default 0:2:40)")
    s.add_argument("--tol", type=_finite, default=1e-9, metavar="X",
                   help="points with |chi_J* - 1| <= X count as critical, X >= 0 (default 1e-9)")
    s.add_argument("--out", default="phase_diagram", metavar="PREFIX",
                   help="output path prefix; folders are created; a .png, .pdf, .svg or .eps ending picks the "
                        "figure format (vector, or PNG at --dpi), any other dot is part of the name (default ./phase_diagram)")
    s.add_argument("--dpi", type=int, default=300, metavar="N", help="resolution of a PNG figure, >= 1 (default 300)")
    _add_json(s)
    s.set_defaults(func=cmd_phase_diagram)


def _add_verify_parser(sub) -> None:
    """The `meanfield verify` subcommand."""
    s = _add_command(
        sub, "verify", help="run the Monte-Carlo verification suite (needs torch)",
        description="Compare theory with Monte-Carlo torch networks: the quick case list shipped with the "
                    "package by default. Exit status 0 when every case passes (or fails as declared), 1 when "
                    "one fails, 2 for bad arguments.")
    from ._verify_options import add_options  # torch-free: the parser must not import torch

    add_options(s, full_flag=True)
    s.set_defaults(func=cmd_verify)


def _add_autoinit_parser(sub) -> None:
    """The `meanfield autoinit` subcommand."""
    s = _add_command(
        sub, "autoinit", help="tune a model to criticality with AutoInit (needs torch)",
        description="Tune one of the package's models and write the tuned initialisation (JSON).")
    s.add_argument("--model", default="mlp", choices=("mlp", "resmlp", "vgg"),
                   help="a ReLU/GELU MLP, a small ResMLP (32x32 inputs) or a slim VGG19_BN (default mlp)")
    s.add_argument("--depth", type=int, default=10,
                   help=f"layers (mlp) or blocks (resmlp), 1..{AUTOINIT_MAX['depth']} (default 10)")
    s.add_argument("--width", type=int, default=256,
                   help=f"width / channels, 1..{AUTOINIT_MAX['width']} (default 256)")
    s.add_argument("--activation", default="relu", help="relu, gelu, tanh or silu (default relu)")
    s.add_argument("--sigma-w", type=_finite, default=2.0, metavar="X",
                   help="initial weight scale, fan-in, > 0 (default 2)")
    s.add_argument("--steps", type=int, default=200,
                   help=f"at most this many AutoInit steps, 1..{AUTOINIT_MAX['steps']} (default 200)")
    s.add_argument("--batch", type=int, default=16, help=f"inputs per step, 2..{AUTOINIT_MAX['batch']} (default 16)")
    s.add_argument("--seed", type=int, default=0, help="random seed for the weights and inputs, >= 0 (default 0)")
    s.add_argument("--out", default="autoinit.json", metavar="FILE",
                   help="where the tuned scales go (JSON; checked writable before tuning; default ./autoinit.json)")
    _add_json(s)
    s.set_defaults(func=cmd_autoinit)


def _add_kernels_parser(sub) -> None:
    """The `meanfield kernels` subcommand."""
    s = _add_command(
        sub, "kernels", help="NNGP and NTK Gram matrices on inputs from a .npy file",
        description="Infinite-width NNGP and NTK Gram matrices of the network's output on the rows of "
                    "--inputs (against the rows of --inputs2, or of --inputs), written to --out "
                    "(.npz or .json; meanfield.gram.Kernels.load reads it). See meanfield.kernels.")
    _add_arch_options(s)
    s.add_argument("--inputs", required=True, metavar="FILE.npy",
                   help="inputs, an array of shape (n1, d); images (n1, T, d) for --block resmlp/mixer "
                        "(readout: mean over the T tokens)")
    s.add_argument("--inputs2", default=None, metavar="FILE.npy",
                   help="second inputs (n2, d) or (n2, T, d) (default --inputs)")
    s.add_argument("--depth", type=int, required=True, metavar="L",
                   help="dense layers: the input layer plus L - 1 blocks (>= 1)")
    s.add_argument("--sigma-w", type=_finite, required=True, metavar="X", help="weight scale sigma_w (>= 0)")
    s.add_argument("--sigma-b", type=_finite, required=True, metavar="X", help="bias scale sigma_b (>= 0)")
    s.add_argument("--parameterization", default="ntk", choices=("ntk", "standard"),
                   help="which variables are trained (default ntk; standard needs --width)")
    s.add_argument("--width", type=_finite, default=None, metavar="N",
                   help="hidden fan-in (>= 1), for the standard parameterisation's NTK")
    s.add_argument("--get", default="both", choices=("nngp", "ntk", "both"), help="which kernels (default both)")
    s.add_argument("--out", default="kernels.npz", metavar="FILE", help="output .npz or .json (default kernels.npz)")
    _add_json(s)
    s.set_defaults(func=cmd_kernels)


def _add_cache_parser(sub) -> None:
    """The `meanfield cache` subcommand."""
    s = _add_command(
        sub, "cache", help="show or clear the cache of compiled recursions",
        description="Compiled recursions and solver kernels are cached on disk (MEANFIELD_CACHE_DIR, else "
                    "XDG_CACHE_HOME/meanfield or ~/.cache/meanfield). 'info' shows where and how big; "
                    "'clear' removes what meanfield put there.")
    s.add_argument("action", nargs="?", default="info", choices=("info", "clear"),
                   help="info (default) or clear")
    _add_json(s)
    s.set_defaults(func=cmd_cache)


_SUBCOMMANDS = (_add_recursion_parser, _add_critical_point_parser, _add_critical_line_parser,
                _add_exponents_parser, _add_phase_diagram_parser, _add_verify_parser, _add_autoinit_parser,
                _add_kernels_parser, _add_cache_parser)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"meanfield: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _stdout_gone():
    """After a broken pipe: point stdout at devnull so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _options_of(parser, command) -> dict:
    """Python argument name -> option of ``command`` (sigma_w -> --sigma-w), for rewording library errors."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    cmd = sub.choices.get(command) if sub is not None and command else None
    if cmd is None:
        return {}
    return {a.dest: a.option_strings[-1] for a in cmd._actions
            if a.option_strings and a.option_strings[-1].startswith("--") and a.dest not in ("help", "json")}


def cli_words(message: str, options: dict) -> str:
    """A library message in the command line's words: ``sigma_w must be >= 0`` -> ``--sigma-w must be >= 0``,
    ``parameterization='standard'`` -> ``--parameterization standard``; one line."""
    import re

    message = " ".join(str(message).split()).replace(" or None (no skip connection)",
                                                      " (omit --mu for no skip connection)")
    for dest, opt in sorted(options.items(), key=lambda kv: -len(kv[0])):
        message = re.sub(rf"(?<![\w.-]){re.escape(dest)}=(?:'([^']*)'|(\S+?))(?=[\s,;:)]|$)",
                         lambda m: f"{opt} {m.group(1) if m.group(1) is not None else m.group(2)}", message)
        # a bare name where it is the argument: always for sigma_w-like names, else as a sentence's subject
        bare = rf"(?<![\w.'-]){re.escape(dest)}(?![\w(=\[.'])"
        message = re.sub(bare if "_" in dest else bare + r"(?= (?:must|needs|is needed|is required)\b)", opt,
                         message)
    return message


def main(argv=None) -> int:
    """Run the command line; every error is one line ``meanfield COMMAND: error: ...`` on stderr."""
    parser = build_parser()
    debug = os.environ.get("MEANFIELD_DEBUG", "") not in ("", "0")
    prog = "meanfield"
    options = {}

    def fail(msg, code, where=None):
        print(f"{where or prog}: error: {msg}", file=sys.stderr)
        return code

    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            args = parser.parse_args(argv)
            prog = f"meanfield {args.command}"
            options = _options_of(parser, args.command)
            rc = args.func(args)
            sys.stdout.flush()
        return int(rc or 0)
    except BrokenPipeError:
        _stdout_gone()
        return fail("output closed before everything was printed (broken pipe)", EXIT_FAILURE)
    except UsageError as exc:
        return fail(" ".join(str(exc).split()), EXIT_USAGE, exc.prog)
    except RunError as exc:
        return fail(str(exc), EXIT_FAILURE)
    except ValueError as exc:  # bad values reach the library's validation
        if debug:
            raise
        return fail(cli_words(exc, options), EXIT_USAGE)
    except ImportError as exc:
        if debug:
            raise
        return fail(f"{exc} (install the verification extra: pip install 'meanfield[verify]')", EXIT_FAILURE)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except OSError as exc:
        if debug:
            raise
        return fail(f"{exc.strerror or exc}" + (f": {exc.filename}" if getattr(exc, "filename", None) else ""),
                    EXIT_FAILURE)
    except Exception as exc:  # never a traceback for a user
        if debug:
            raise
        return fail(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} "
                    "(please report it; MEANFIELD_DEBUG=1 shows the traceback)", EXIT_FAILURE)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
