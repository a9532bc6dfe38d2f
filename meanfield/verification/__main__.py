"""``python -m meanfield.verification [--quick] [--device DEV] [--out DIR] ...``: run the verification suite.

The same options serve ``meanfield verify`` (:mod:`meanfield.cli`), which
runs the quick list by default; ``python -m meanfield.verification`` runs the
full list unless ``--quick`` is given. Exit status: 0 when every case passes
(or fails as declared), 1 when a case fails or errors, 2 for bad arguments
(an unknown case id, a case file that is not a case list, an unwritable
report folder, an unavailable device).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings

EXIT_USAGE = 2


# the options live in a torch-free module: ``meanfield --help`` and every theory subcommand
# build the parser without importing torch (~3 s)
from .._verify_options import add_options  # noqa: E402,F401


def _one_line_warnings(prog):
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {message}", file=sys.stderr)
    return show


def run(args, prog: str = "python -m meanfield.verification") -> int:
    """Run the suite for parsed options; print the outcome; return the exit status."""
    quick = bool(args.quick)
    try:
        import torch

        from .suite import run_suite
    except ImportError as err:
        print(f"{prog}: error: {err} (install the verification extra: pip install 'meanfield[verify]')",
              file=sys.stderr)
        return 1
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.showwarning = _one_line_warnings(prog)
        try:
            client = None
            if args.scheduler:
                from .distributed import connect

                client = stack.enter_context(connect(args.scheduler))
            out = run_suite(args.cases, args.out, args.device, quick=quick, resume=not args.no_resume,
                            only=args.only, plots=not args.no_plots, progress=not args.json and sys.stderr.isatty(),
                            dtype=torch.float32 if args.float32 else torch.float64, client=client)
        except (ValueError, FileNotFoundError) as err:
            print(f"{prog}: error: {err}", file=sys.stderr)
            return EXIT_USAGE
    s = out["summary"]
    if args.json:
        slim = [{k: v for k, v in r.items() if k not in ("data", "traceback", "case")} for r in out["results"]]
        print(json.dumps({"summary": s, "results": slim, "out_dir": out["out_dir"]}, indent=2, allow_nan=False))
    else:
        print(f"{s['n_cases']} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
              + f" in {s['wall_seconds']:.0f} s; report: {out['out_dir']}/report.md")
        for r in out["results"]:
            if r["status"] in ("fail", "error"):
                print(f"  {r['status'].upper()} {r['id']}: {(r.get('details') or [''])[0]}")
    return 0 if s["ok"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m meanfield.verification",
                                description="Monte Carlo on real torch networks against the mean-field theory.",
                                epilog="Exit status: 0 all cases pass (or fail as declared), 1 a case fails or "
                                       "errors, 2 bad arguments.")
    add_options(p)
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
