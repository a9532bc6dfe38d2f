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

``--workload fig1`` instead times one point of the paper's Fig. 1 scan: a ReLU
MLP with 10 hidden layers of width 500, CIFAR-sized inputs (3072), |B| = 256,
JLL, 980 steps (appendix A: "each point takes around 1.5 minutes" on an
RTX 3090).

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
    p.add_argument("--workload", default="resmlp-s12", choices=["resmlp-s12", "fig1"])
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--layerscale", type=float, default=1.0,
                   help="initial LayerScale (1.0: the paper's far-from-critical 'Kaiming' start; 0.1: original)")
    p.add_argument("--batch", type=int, default=None, help="default 32 (resmlp-s12), 256 (fig1)")
    p.add_argument("--steps", type=int, default=None, help="default 500 (resmlp-s12), 980 (fig1)")
    p.add_argument("--n-probes", type=int, default=2)
    p.add_argument("--loss", default=None, help="default jkl (resmlp-s12), jll (fig1)")
    p.add_argument("--lam", type=float, default=None, help="default 0.5 (resmlp-s12), 0 (fig1)")
    p.add_argument("--lr", type=float, default=None, help="default 0.03 (resmlp-s12), 0.01 (fig1)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args(argv)
    fig1 = args.workload == "fig1"
    defaults = dict(batch=256, steps=980, loss="jll", lam=0.0, lr=0.01) if fig1 else \
        dict(batch=32, steps=500, loss="jkl", lam=0.5, lr=0.03)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    import torch

    from meanfield.torch.autoinit import autoinit
    from meanfield.torch.models import resmlp_s12

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(1)
    if fig1:
        layers = []
        for i in range(11):
            lin = torch.nn.Linear(3072 if i == 0 else 500, 500, bias=False)
            torch.nn.init.normal_(lin.weight, std=2.0 / lin.in_features ** 0.5)  # sigma_w = 2
            layers += [lin, torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1]).to(device=device, dtype=dtype)
        x = torch.randn(args.batch, 3072, generator=gen).to(device, dtype)
        title = "ReLU MLP (paper Fig. 1: 10 hidden layers, width 500, 3072 inputs, sigma_w = 2)"
    else:
        model = resmlp_s12(img_size=args.img_size, patch_size=args.patch_size, dim=args.dim, depth=args.depth,
                           layerscale=args.layerscale, seed=0).to(device=device, dtype=dtype)
        x = torch.randn(max(args.batch, 64), 3, args.img_size, args.img_size, generator=gen).to(device, dtype)
        title = (f"ResMLP (img {args.img_size}, patch {args.patch_size}, d {args.dim}, depth {args.depth}, "
                 f"LayerScale {args.layerscale})")

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
    # the unit of cost: one plain forward pass of the batch (no grad), best of 5, timed after the loop
    xb = x[: args.batch]
    fwd = float("inf")
    with torch.no_grad():
        for _ in range(5):
            sync()
            t1 = time.perf_counter()
            model(xb)
            sync()
            fwd = min(fwd, time.perf_counter() - t1)
    hw = (torch.cuda.get_device_name(device) if device.type == "cuda"
          else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"{torch.get_num_threads()} torch threads")
    res = {
        "workload": args.workload, "device": str(device), "hardware": hw, "torch": torch.__version__, "python": sys.version.split()[0],
        "layerscale": args.layerscale, "img_size": args.img_size, "patch_size": args.patch_size, "dim": args.dim, "depth": args.depth,
        "batch": args.batch, "n_probes": args.n_probes, "loss": args.loss, "lam": args.lam, "lr": args.lr,
        "dtype": args.dtype, "steps": rep.steps, "loop_seconds": rep.steps / sps, "wall_seconds_total": wall,
        "process_cpu_seconds": cpu, "steps_per_second": sps,
        "extrapolated_full_steps": defaults["steps"], "extrapolated_full_seconds": defaults["steps"] / sps,
        "images_per_second": sps * args.batch * args.n_probes,
        "forward_seconds": fwd, "forward_equivalents_per_step": 1.0 / sps / fwd,
        "J_before_range": [float(rep.J_before.min()), float(rep.J_before.max())],
        "J_after_range": [float(rep.J_after.min()), float(rep.J_after.max())],
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    print(f"\n{title}, "
          f"batch {args.batch} x {args.n_probes} probes, {args.loss} lam={args.lam}, lr={args.lr}, "
          f"{args.dtype}, on {hw}")
    print(f"  {rep.steps} steps in {res['loop_seconds']:.1f} s: {sps:.3g} steps/s "
          f"({res['images_per_second']:.3g} probe-images/s); total with before/after measurement {wall:.1f} s")
    print(f"  one forward pass of the batch {1e3 * fwd:.1f} ms: a step costs "
          f"{res['forward_equivalents_per_step']:.1f} forward-pass equivalents")
    if rep.steps != defaults["steps"]:
        full = defaults["steps"] / sps
        print(f"  {defaults['steps']} steps (extrapolated): {full:.0f} s ({full / 3600:.2f} h)")
    print(f"  J^(l,l+1) before: [{res['J_before_range'][0]:.3g}, {res['J_before_range'][1]:.3g}], "
          f"after: [{res['J_after_range'][0]:.3g}, {res['J_after_range'][1]:.3g}]")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return res


if __name__ == "__main__":
    main()
