"""``python -m meanfield.verification [--quick] [--device DEV] [--out DIR]``: run the verification suite."""
from __future__ import annotations

import argparse
import contextlib
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m meanfield.verification",
                                description="Monte Carlo on real torch networks against the mean-field theory.")
    p.add_argument("--quick", action="store_true", help="the CI case list (a few minutes on a CPU)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--out", default=None, help="report folder (default verification/reports/{quick,full}-{cpu,cuda})")
    p.add_argument("--cases", default=None, help="case file (default verification/cases_{quick,full}.json)")
    p.add_argument("--only", nargs="*", default=None, help="run only these case ids")
    p.add_argument("--float32", action="store_true", help="compute in float32 (default float64)")
    p.add_argument("--no-resume", action="store_true", help="rerun cases that have a checkpoint")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the cases on a Dask cluster: a scheduler address or file, or local:N (N local "
                        "workers; one per GPU with CUDA); needs the distributed extra")
    args = p.parse_args(argv)
    try:
        import torch

        from .suite import run_suite

        with contextlib.ExitStack() as stack:
            client = None
            if args.scheduler:
                from .distributed import connect

                client = stack.enter_context(connect(args.scheduler))
            out = run_suite(args.cases, args.out, args.device, quick=args.quick, resume=not args.no_resume,
                            only=args.only, plots=not args.no_plots,
                            dtype=torch.float32 if args.float32 else torch.float64, client=client)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    s = out["summary"]
    print(f"{s['n_cases']} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
          + f" in {s['wall_seconds']:.0f} s; report: {out['out_dir']}/report.md")
    for r in out["results"]:
        if r["status"] in ("fail", "error"):
            print(f"  {r['status'].upper()} {r['id']}: {(r.get('details') or [''])[0]}")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
