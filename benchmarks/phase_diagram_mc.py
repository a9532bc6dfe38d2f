"""Monte-Carlo phase diagram: batched, common-random-number pass vs one network at a time with hooks.

Workload: the partial-Jacobian paper's Fig. 2 panel (appendix A): a
(sigma_w, sigma_b) grid of 20 x 20 points, MLPs of depth L = 50 and width 500,
inputs of dimension 784, 100 initialisations per point, and the penultimate
APJN J^{L-2,L-1} at every point. The paper reports about two days on a P100
for its figure, computed "using hooks to obtain the gradients".

* batched: :func:`meanfield.verification.phase_diagram`: all initialisations
  in one pass (stacked weights, torch.bmm), one standard-normal weight set per
  initialisation shared by all grid points (common random numbers), and a
  forward-mode Hutchinson probe at layer L-2.
* baseline: what the paper's code does, one network at a time: build an
  ``nn.Sequential`` of ``nn.Linear`` layers, initialise it with
  ``nn.init.normal_``, run the input forward with forward hooks that keep the
  preactivations, and backpropagate a Gaussian probe from h^{L-1} to h^{L-2}
  (J^T v, the VJP form of AutoInit eq. 7). The baseline is timed on a subset
  of networks and extrapolated linearly to the full workload (every network
  costs the same).

Throughput is networks x layers per second. Usage::

    python benchmarks/phase_diagram_mc.py                       # full workload, CPU
    python benchmarks/phase_diagram_mc.py --device cuda         # on a GPU
    python benchmarks/phase_diagram_mc.py --n-init 10           # reduced (scaled honestly)
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

try:
    import meanfield as mf
except ImportError:  # run from a source checkout without installing
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import meanfield as mf
from meanfield.verification import phase_diagram
from meanfield.verification.montecarlo import resolve_device
from meanfield.torch.networks import torch_activation


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class _Phi(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def baseline_network_chi(arch, sw, sb, depth, width, input_dim, x, dev, dtype, gen):
    """One network, the hook-based way: J^{L-2,L-1} by backpropagating one Gaussian probe."""
    phi, _ = torch_activation(arch.activation)
    layers = [nn.Linear(input_dim, width)]
    for _ in range(depth - 2):  # h^1 .. h^{L-1}
        layers += [_Phi(phi), nn.Linear(width, width)]
    net = nn.Sequential(*layers).to(device=dev, dtype=dtype)
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, sw / math.sqrt(m.in_features), generator=gen)
                nn.init.normal_(m.bias, 0.0, sb, generator=gen) if sb > 0 else nn.init.zeros_(m.bias)
    acts = []

    def keep(module, inp, out):
        out.retain_grad()
        acts.append(out)

    hooks = [m.register_forward_hook(keep) for m in net if isinstance(m, nn.Linear)]
    net(x)
    for h in hooks:
        h.remove()
    h_prev, h_last = acts[-2], acts[-1]  # h^{L-2}, h^{L-1}
    v = torch.randn(h_last.shape, generator=gen, device=dev, dtype=dtype)
    (h_last * v).sum().backward()
    return float(h_prev.grad.pow(2).sum() / h_last.shape[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--activation", default="erf")
    p.add_argument("--grid", type=int, default=20)
    p.add_argument("--depth", type=int, default=50)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--input-dim", type=int, default=784)
    p.add_argument("--n-init", type=int, default=100)
    p.add_argument("--baseline-networks", type=int, default=20, help="networks timed for the baseline")
    p.add_argument("--float64", action="store_true", help="float64 (default float32, as a GPU run would use)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    dev = resolve_device(args.device)
    dtype = torch.float64 if args.float64 else torch.float32
    arch = mf.Architecture(args.activation)
    sw = np.linspace(0.5, 3.0, args.grid)
    sb = np.linspace(0.0, 2.0, args.grid)
    n_points = sw.size * sb.size
    n_networks = n_points * args.n_init
    full_networks = 20 * 20 * 100

    # warm-up (allocator, threads), not timed
    phase_diagram(arch, sw[:2], sb[:2], depth=4, width=args.width, n_init=2, device=dev, dtype=dtype,
                  input_dim=args.input_dim)
    _sync(dev)
    t0, c0 = time.perf_counter(), time.process_time()
    pd = phase_diagram(arch, sw, sb, depth=args.depth, width=args.width, n_init=args.n_init, device=dev,
                       dtype=dtype, input_dim=args.input_dim)
    _sync(dev)
    t_batched, cpu_batched = time.perf_counter() - t0, time.process_time() - c0

    # baseline: a subset of networks, spread over the grid
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, args.input_dim, generator=gen, device=dev, dtype=dtype)
    x = x * math.sqrt(args.input_dim) / x.norm()
    rng = np.random.default_rng(0)
    picks = [(int(rng.integers(sw.size)), int(rng.integers(sb.size))) for _ in range(args.baseline_networks)]
    baseline_net_chi(arch, 1.0, 0.0, 4, args.width, args.input_dim, x, dev, dtype, gen)  # warm-up
    _sync(dev)
    t0, c0 = time.perf_counter(), time.process_time()
    chis = [baseline_net_chi(arch, sw[i], sb[j], args.depth, args.width, args.input_dim, x, dev, dtype, gen)
            for i, j in picks]
    _sync(dev)
    t_base_subset, cpu_base_subset = time.perf_counter() - t0, time.process_time() - c0
    per_net = t_base_subset / len(picks)
    t_base = per_net * n_networks

    layers = args.depth
    res = {
        "workload": {"grid": [sw.size, sb.size], "depth": args.depth, "width": args.width,
                     "input_dim": args.input_dim, "n_init": args.n_init, "networks": n_networks,
                     "activation": args.activation, "dtype": str(dtype).replace("torch.", ""),
                     "fraction_of_fig2": n_networks / full_networks},
        "hardware": {"device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                     "cpu": _cpu_name(), "cpu_count": __import__("os").cpu_count(),
                     "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                     "python": platform.python_version()},
        "load_average_1min": _loadavg(),
        "batched": {"seconds": t_batched, "process_cpu_seconds": cpu_batched, "networks_x_layers_per_s": n_networks * layers / t_batched,
                    "projected_full_fig2_seconds": t_batched / (n_networks / full_networks)},
        "baseline": {"networks_timed": len(picks), "seconds_per_network": per_net,
                     "process_cpu_seconds_per_network": cpu_base_subset / len(picks),
                     "projected_seconds": t_base, "networks_x_layers_per_s": layers / per_net,
                     "projected_full_fig2_seconds": per_net * full_networks},
        "speedup": t_base / t_batched,
        "sanity": {"batched_mean_chi_at_picks": float(np.mean([pd.chi_J[i, j] for i, j in picks])),
                   "baseline_mean_chi_at_picks": float(np.mean(chis))},
    }
    print(f"workload: {sw.size}x{sb.size} grid, depth {args.depth}, width {args.width}, {args.n_init} inits "
          f"= {n_networks} networks ({100 * res['workload']['fraction_of_fig2']:.0f}% of Fig. 2), {res['workload']['dtype']}, {dev}")
    print(f"batched:  {t_batched:8.1f} s   {res['batched']['networks_x_layers_per_s']:10.0f} networks*layers/s "
          f"(process CPU time {cpu_batched:.1f} s)")
    print(f"baseline: {t_base:8.1f} s   {res['baseline']['networks_x_layers_per_s']:10.0f} networks*layers/s "
          f"(extrapolated from {len(picks)} networks, {per_net:.3f} s each, CPU {cpu_base_subset / len(picks):.3f} s)")
    print(f"load average during the run: {res['load_average_1min']}")
    print(f"speed-up: {res['speedup']:.0f}x; full Fig. 2 panel projected: batched "
          f"{res['batched']['projected_full_fig2_seconds']:.0f} s, baseline {res['baseline']['projected_full_fig2_seconds']:.0f} s")
    print(f"sanity (mean chi at the baseline's grid points): batched {res['sanity']['batched_mean_chi_at_picks']:.4f}, "
          f"baseline {res['sanity']['baseline_mean_chi_at_picks']:.4f} (single networks, noisy)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


baseline_net_chi = baseline_network_chi


def _loadavg():
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
