"""AutoInit wall time on ResMLP-S12 (the AutoInit paper's ImageNet setting).

Paper (section 4.1): ResMLP-S12 tuned from Kaiming initialisation with
Algorithm 2, JKL loss (lam = 0.5), lr = 0.03, |B| = 32, 500 steps, 224 x 224
inputs, on an RTX 3090. This script runs exactly that workload by default
(random standard-normal images: the cost does not depend on the data) and
reports the wall time of the tuning loop and steps per second. ``tol = 0`` so
every requested step runs.

    python benchmarks/autoinit.py                      # full workload on the CPU
    python benchmarks/autoinit.py --device cuda        # on a GPU
    python benchmarks/autoinit.py --steps 3            # time 3 steps, extrapolate to 500
    python benchmarks/autoinit.py --img-size 64 --batch 8 --steps 50   # reduced size

``--steps`` below 500 times that many steps and also prints the 500-step
wall time extrapolated from the measured steps per second (every step costs
the same). ``--json FILE`` writes the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

try:
    import meanfield  # noqa: F401
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--layerscale", type=float, default=1.0,
                   help="initial LayerScale (1.0: the paper's far-from-critical 'Kaiming' start; 0.1: original)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--n-probes", type=int, default=2)
    p.add_argument("--loss", default="jkl")
    p.add_argument("--lam", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args(argv)

    import torch

    from meanfield.verification.autoinit import autoinit
    from meanfield.verification.models import resmlp_s12

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    model = resmlp_s12(img_size=args.img_size, patch_size=args.patch_size, dim=args.dim, depth=args.depth,
                       layerscale=args.layerscale, seed=0).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(max(args.batch, 64), 3, args.img_size, args.img_size, generator=gen).to(device, dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # warm-up: one step (allocator, kernels, forward-AD formulas)
    autoinit(model, x[: args.batch], loss=args.loss, lam=args.lam, lr=args.lr, steps=1, tol=0.0,
             n_probes=args.n_probes, batch_size=args.batch, progress=False, report_probes=1)
    sync()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    tuned, rep = autoinit(model, x, loss=args.loss, lam=args.lam, lr=args.lr, steps=args.steps, tol=0.0,
                          n_probes=args.n_probes, batch_size=args.batch, progress=True, report_probes=2)
    sync()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    sps = rep.steps_per_second
    hw = (torch.cuda.get_device_name(device) if device.type == "cuda"
          else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"{torch.get_num_threads()} torch threads")
    res = {
        "device": str(device), "hardware": hw, "torch": torch.__version__, "python": sys.version.split()[0],
        "layerscale": args.layerscale, "img_size": args.img_size, "patch_size": args.patch_size, "dim": args.dim, "depth": args.depth,
        "batch": args.batch, "n_probes": args.n_probes, "loss": args.loss, "lam": args.lam, "lr": args.lr,
        "dtype": args.dtype, "steps": rep.steps, "loop_seconds": rep.steps / sps, "wall_seconds_total": wall,
        "process_cpu_seconds": cpu, "steps_per_second": sps,
        "extrapolated_500_steps_seconds": 500 / sps,
        "images_per_second": sps * args.batch * args.n_probes,
        "J_before_range": [float(rep.J_before.min()), float(rep.J_before.max())],
        "J_after_range": [float(rep.J_after.min()), float(rep.J_after.max())],
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    print(f"\nResMLP (img {args.img_size}, patch {args.patch_size}, d {args.dim}, depth {args.depth}), "
          f"batch {args.batch} x {args.n_probes} probes, {args.loss} lam={args.lam}, lr={args.lr}, "
          f"{args.dtype}, on {hw}")
    print(f"  {rep.steps} steps in {res['loop_seconds']:.1f} s: {sps:.3g} steps/s "
          f"({res['images_per_second']:.3g} probe-images/s); total with before/after measurement {wall:.1f} s")
    if rep.steps != 500:
        print(f"  500 steps (extrapolated): {res['extrapolated_500_steps_seconds']:.0f} s "
              f"({res['extrapolated_500_steps_seconds'] / 3600:.2f} h)")
    print(f"  J^(l,l+1) before: [{res['J_before_range'][0]:.3g}, {res['J_before_range'][1]:.3g}], "
          f"after: [{res['J_after_range'][0]:.3g}, {res['J_after_range'][1]:.3g}]")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return res


if __name__ == "__main__":
    main()
