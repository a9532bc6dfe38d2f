"""The options of the verification suite's command line (``meanfield verify`` and
``python -m meanfield.verification``), in a module that does not import torch, so that the
``meanfield`` parser (every theory subcommand) is built without it."""


def add_options(p, *, full_flag: bool = False):
    """The suite's options on an argparse parser (shared with ``meanfield verify``)."""
    if full_flag:
        mode = p.add_mutually_exclusive_group()
        mode.add_argument("--quick", action="store_true",
                          help="the quick case list, sized for a CPU (the default)")
        mode.add_argument("--full", action="store_true", help="the full case list (meant for a CUDA GPU)")
    else:
        p.add_argument("--quick", action="store_true",
                       help="the quick case list, sized for a CPU (default: the full list)")
    p.add_argument("--device", default=None, metavar="DEV",
                   help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="report folder, created if missing (default ./meanfield-verify/{quick,full}-{cpu,cuda}; "
                        "never inside the installed package)")
    p.add_argument("--cases", default=None, metavar="FILE",
                   help="a JSON case file ({\"cases\": [...]} or a list) instead of the packaged list")
    p.add_argument("--only", nargs="+", default=None, metavar="CASE",
                   help="run only these case ids (an unknown id is an error)")
    p.add_argument("--float32", action="store_true", help="compute in float32 (default float64)")
    p.add_argument("--no-resume", action="store_true",
                   help="rerun cases that already have a checkpoint in the report folder")
    p.add_argument("--no-plots", action="store_true", help="skip the per-case PNG plots")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the cases on a Dask cluster: a scheduler address or file, or local:N (N local "
                        "workers; one per GPU with CUDA); needs the distributed extra")
    p.add_argument("--json", action="store_true",
                   help="print the summary and the per-case results as JSON (no progress bar)")
