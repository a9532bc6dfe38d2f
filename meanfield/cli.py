"""The ``meanfield`` command line (also ``python -m meanfield``).

Every subcommand takes the same architecture options
(``--activation gelu --norm ln_pre --mu 0.5``) and ``--json`` for
machine-readable output. Usage errors print one line and exit with status 2.

Subcommands: recursion, critical-point, critical-line, exponents,
phase-diagram, verify, autoinit.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["main", "build_parser"]

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with what the user typed: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{self.prog}: {message}")


# ---------------------------------------------------------------------------
# Shared options.
# ---------------------------------------------------------------------------
def _add_arch_options(p):
    from .activations import available_activations
    from .calculus import BLOCKS, NORMS

    g = p.add_argument_group("architecture")
    g.add_argument("--activation", default="relu", metavar="NAME",
                   help=f"activation: one of {', '.join(available_activations())} (default relu)")
    g.add_argument("--negative-slope", type=float, default=None,
                   help="negative slope for --activation leaky_relu (default 0.01)")
    g.add_argument("--norm", default="none", choices=NORMS, help="normalisation in an MLP block (default none)")
    g.add_argument("--mu", type=float, default=None,
                   help="residual strength in [0, 1]; omit for no skip connection")
    g.add_argument("--block", default="mlp", choices=BLOCKS, help="block type (default mlp)")
    g.add_argument("--eps", type=float, default=0.1, help="LayerScale of resmlp blocks (default 0.1)")
    g.add_argument("--stages", type=int, default=1, help="norm->phi->Dense stages per MLP block (default 1)")
    g.add_argument("--spec", default=None, metavar="FILE.json",
                   help="any architecture as a JSON file (meanfield.to_json of a Network or Architecture); "
                        "replaces the options above")


def _add_json(p):
    p.add_argument("--json", action="store_true", help="print the result as JSON")


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

    kw = dict(activation=args.activation, norm=args.norm, mu=args.mu, block=args.block,
              eps=args.eps, stages=args.stages)
    if args.negative_slope is not None:
        kw["negative_slope"] = args.negative_slope
    return as_architecture(**kw)


def parse_grid(text: str, name: str) -> np.ndarray:
    """'a:b:n' (n points from a to b) or 'v1,v2,...' -> float64 array."""
    try:
        if ":" in text:
            a, b, n = text.split(":")
            n = int(n)
            if n < 1:
                raise ValueError
            return np.linspace(float(a), float(b), n)
        return np.array([float(v) for v in text.split(",")], dtype=np.float64)
    except ValueError:
        raise UsageError(f"--{name} takes 'start:stop:count' or a comma-separated list of numbers, got {text!r}") \
            from None


def _emit(args, result, text: str | None = None):
    from ._serialize import to_jsonable

    if getattr(args, "json", False):
        print(json.dumps(to_jsonable(result), indent=2, allow_nan=False))
    else:
        print(text if text is not None else result)


# ---------------------------------------------------------------------------
# Commands.
# ---------------------------------------------------------------------------
def cmd_recursion(args):
    import sympy as sp

    from .symbolic import recursion

    rec = recursion(_architecture(args))
    if args.json:
        data = {"architecture": str(rec.architecture), "state": [str(s) for s in rec.state]}
        for name in ("kernel", "kernel12", "chi_J", "chi_K", "chi_Delta"):
            data[name] = str(getattr(rec, name))
            data[name + "_latex"] = sp.latex(getattr(rec, name))
        print(json.dumps(data, indent=2))
    elif args.latex:
        print(rec.latex())
    else:
        print(rec)


def _g(v) -> str:
    return f"{float(v):.10g}"


def _text_critical_points(res) -> str:
    lines = [f"{res.architecture}: " + (
        "critical everywhere in the (sigma_w, sigma_b) plane" if res.everywhere_critical else
        f"{len(res.points)} critical point{'s' if len(res.points) != 1 else ''} (chi_J* = chi_K* = 1)")]
    for p in res.points:
        lines.append(f"  sigma_w = {_g(p.sigma_w)}  sigma_b = {_g(p.sigma_b)}  K* = {_g(p.K_star)}  "
                     f"({p.stability}); a unit-norm input reaches K = {_g(p.unit_input_reaches)}")
    if res.note:
        lines.append(f"  note: {res.note}")
    return "\n".join(lines)


def cmd_critical_point(args):
    import meanfield as mf

    res = mf.critical_point(_architecture(args))
    _emit(args, res, text=_text_critical_points(res))


def cmd_critical_line(args):
    import meanfield as mf

    sw = parse_grid(args.sigma_w, "sigma-w")
    line = mf.critical_line(_architecture(args), sigma_w=sw)
    if args.json:
        _emit(args, line)
        return
    sb = np.asarray(getattr(line, "sigma_b", line), dtype=float)
    sw_out = np.asarray(getattr(line, "sigma_w", sw), dtype=float)
    if args.csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["sigma_w", "sigma_b"])
        for a, b in zip(np.broadcast_to(sw_out, sb.shape), sb):
            w.writerow([repr(float(a)), repr(float(b))])
        print(buf.getvalue(), end="")
        return
    if line.everywhere_critical:
        print(f"{line.architecture}: critical everywhere; {line.note}")
        return
    rows = [f"{line.architecture}: critical line (chi_J* = 1)", f"{'sigma_w':>14} {'sigma_b':>14} {'K*':>14}"]
    for a, b, k in zip(np.broadcast_to(sw_out, sb.shape), sb, np.broadcast_to(line.K_star, sb.shape)):
        rows.append(f"{_g(a):>14} {_g(b):>14} {_g(k):>14}")
    if line.note:
        rows.append(f"note: {line.note}")
    print("\n".join(rows))


def cmd_exponents(args):
    import meanfield as mf

    e = mf.exponents(_architecture(args), sigma_w=args.sigma_w, sigma_b=args.sigma_b)
    text = (f"{e.architecture} at sigma_w = {_g(e.sigma_w)}, sigma_b = {_g(e.sigma_b)}: {e.regime}\n"
            f"  K* = {_g(e.K_star)}  chi_J* = {_g(e.chi_J)}  chi_K* = {_g(e.chi_K)}\n"
            f"  zeta_K = {_g(e.zeta_K)} (numeric {_g(e.zeta_K_numeric)})   "
            f"zeta = {_g(e.zeta)} (numeric {_g(e.zeta_numeric)}), J^(l0,l) ~ l^-zeta")
    if e.c_tilde is not None:
        text += f"\n  stretched exponential: c~ = {_g(e.c_tilde)}, lambda = {_g(e.lambda_)}"
    if e.note:
        text += f"\n  note: {e.note}"
    _emit(args, e, text=text)


def cmd_phase_diagram(args):
    import meanfield as mf
    from ._serialize import to_jsonable

    arch = _architecture(args)
    sw = parse_grid(args.sigma_w, "sigma-w")
    sb = parse_grid(args.sigma_b, "sigma-b")
    pd = mf.phase_diagram(arch, sigma_w=sw, sigma_b=sb)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = _phase_names(pd.phase)
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sigma_w", "sigma_b", "K_star", "chi_J", "xi", "phase"])
        for i, j in np.ndindex(pd.chi_J.shape):
            w.writerow([sw[i], sb[j], pd.K[i, j], pd.chi_J[i, j], pd.xi[i, j], names[i, j]])
    out.with_suffix(".json").write_text(json.dumps(to_jsonable(pd), allow_nan=False))
    png = out.with_suffix(".png")
    _plot_phase_diagram(arch, sw, sb, pd, png)
    counts = {name: int(np.sum(names == name)) for name in ("ordered", "critical", "chaotic")}
    summary = {"architecture": str(arch), "png": str(png), "csv": str(out.with_suffix(".csv")),
               "json": str(out.with_suffix(".json")), "points": counts}
    _emit(args, summary, text="\n".join(f"{k}: {v}" for k, v in summary.items()))


def _phase_names(codes) -> np.ndarray:
    """Phase codes of meanfield.PHASES (-1, 0, 1; NaN where undetermined) -> names."""
    from .solvers import PHASES

    names = np.full(np.shape(codes), "undetermined", dtype=object)
    for code, name in PHASES.items():
        names[np.asarray(codes) == code] = name
    return names


def _plot_phase_diagram(arch, sw, sb, pd, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import meanfield as mf

    fig, ax = plt.subplots(figsize=(5, 4), dpi=100)
    with np.errstate(divide="ignore", invalid="ignore"):
        logchi = np.log(np.asarray(pd.chi_J, dtype=float))
    m = ax.pcolormesh(sw, sb, logchi.T, cmap="RdBu_r", vmin=-1, vmax=1, shading="auto")
    fig.colorbar(m, ax=ax, label=r"$\log \chi_J^\star$")
    line = mf.critical_line(arch, sigma_w=np.linspace(sw.min(), sw.max(), 200))
    if not line.everywhere_critical:
        ax.plot(line.sigma_w, line.sigma_b, "k-", lw=1.5, label="critical line")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel(r"$\sigma_w$")
    ax.set_ylabel(r"$\sigma_b$")
    ax.set_xlim(sw.min(), sw.max())
    ax.set_ylim(sb.min(), sb.max())
    ax.set_title(str(arch))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cmd_verify(args):
    from .verification.__main__ import main as suite_main

    argv = [] if args.full else ["--quick"]
    if args.device:
        argv += ["--device", args.device]
    if args.out:
        argv += ["--out", args.out]
    if args.only:
        argv += ["--only", *args.only]
    return suite_main(argv)


def _autoinit_model(args):
    """One of the package's model definitions, initialised at sigma_w (fan-in)."""
    import torch

    from .verification import models

    if args.model == "mlp":
        from .verification.torch_activations import TORCH_ACTIVATIONS, torch_module

        acts = tuple(n for n, row in TORCH_ACTIVATIONS.items() if row.module is not None)
        if args.activation not in acts:
            raise UsageError(f"meanfield autoinit: --activation for --model mlp must be one of {', '.join(acts)}")
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


def cmd_autoinit(args):
    from .verification.autoinit import autoinit, save_scales

    for name, v, lo in (("--depth", args.depth, 1), ("--width", args.width, 1), ("--steps", args.steps, 1),
                        ("--batch", args.batch, 2)):
        if v < lo:
            raise UsageError(f"meanfield autoinit: {name} must be >= {lo}, got {v}")
    model, x = _autoinit_model(args)
    _, report = autoinit(model, x, steps=args.steps, seed=args.seed, progress=not args.json)
    save_scales(report, args.out, model=args.model, depth=args.depth, width=args.width,
                activation=args.activation, sigma_w=args.sigma_w, seed=args.seed)
    summary = {"model": args.model, "out": args.out, "steps": report.steps, "converged": report.converged,
               "J_before": report.J_before, "J_after": report.J_after}
    text = (f"AutoInit ({args.model}): {report.steps} steps, converged={report.converged}\n"
            f"J^(l,l+1) before: {np.array2string(np.asarray(report.J_before), precision=3)}\n"
            f"J^(l,l+1) after:  {np.array2string(np.asarray(report.J_after), precision=3)}\n"
            f"tuned initialisation written to {args.out}")
    _emit(args, summary, text=text)


# ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="meanfield", description="Mean-field theory of deep-network initialisation.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    s = sub.add_parser("recursion", help="print the derived infinite-width recursions",
                       description="Print K^{l+1}(K^l), chi_J, chi_K for an architecture.")
    _add_arch_options(s)
    s.add_argument("--latex", action="store_true", help="print LaTeX instead of text")
    _add_json(s)
    s.set_defaults(func=cmd_recursion)

    s = sub.add_parser("critical-point", help="points with chi_J* = chi_K* = 1",
                       description="All critical points (chi_J* = chi_K* = 1) with K* and stability.")
    _add_arch_options(s)
    _add_json(s)
    s.set_defaults(func=cmd_critical_point)

    s = sub.add_parser("critical-line", help="sigma_b on the critical line for given sigma_w",
                       description="sigma_b(sigma_w) with chi_J* = 1 (nan where no line exists).")
    _add_arch_options(s)
    s.add_argument("--sigma-w", default="0.5:3:11", help="'start:stop:count' or a list (default 0.5:3:11)")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_critical_line)

    s = sub.add_parser("exponents", help="critical exponents zeta_K and zeta",
                       description="Critical exponents, analytic (series) and numeric (deep iteration).")
    _add_arch_options(s)
    s.add_argument("--sigma-w", type=float, required=True)
    s.add_argument("--sigma-b", type=float, required=True)
    _add_json(s)
    s.set_defaults(func=cmd_exponents)

    s = sub.add_parser("phase-diagram", help="chi_J*, xi and phase on a grid; writes PNG, CSV and JSON",
                       description="Phase diagram on a (sigma_w, sigma_b) grid.")
    _add_arch_options(s)
    s.add_argument("--sigma-w", default="0.1:3:60")
    s.add_argument("--sigma-b", default="0:2:40")
    s.add_argument("--out", default="phase_diagram", help="output path prefix (default ./phase_diagram)")
    _add_json(s)
    s.set_defaults(func=cmd_phase_diagram)

    s = sub.add_parser("verify", help="run the Monte-Carlo verification suite (needs torch)",
                       description="Compare theory with Monte-Carlo torch networks.")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the CPU-sized quick suite (default)")
    mode.add_argument("--full", action="store_true", help="the full suite (meant for a GPU)")
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    s.add_argument("--out", default=None, help="output directory for the report")
    s.add_argument("--only", nargs="*", default=None, metavar="CASE", help="run only these case ids")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("autoinit", help="tune a model to criticality with AutoInit (needs torch)",
                       description="Tune one of the package's models and write the tuned initialisation (JSON).")
    s.add_argument("--model", default="mlp", choices=("mlp", "resmlp", "vgg"),
                   help="a ReLU/GELU MLP, a small ResMLP (32x32 inputs) or a slim VGG19_BN (default mlp)")
    s.add_argument("--depth", type=int, default=10, help="layers (mlp) or blocks (resmlp) (default 10)")
    s.add_argument("--width", type=int, default=256, help="width / channels (default 256)")
    s.add_argument("--activation", default="relu", help="relu, gelu, tanh or silu (default relu)")
    s.add_argument("--sigma-w", type=float, default=2.0, help="initial weight scale, fan-in (default 2)")
    s.add_argument("--steps", type=int, default=200, help="at most this many AutoInit steps (default 200)")
    s.add_argument("--batch", type=int, default=16, help="inputs per step (default 16)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="autoinit.json", help="where the tuned scales go (JSON)")
    _add_json(s)
    s.set_defaults(func=cmd_autoinit)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        rc = args.func(args)
        return int(rc or 0)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # bad values reach the library's validation
        print(f"meanfield: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:
        print(f"meanfield: error: {exc} (install the verification extra: pip install 'meanfield[verify]')",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
