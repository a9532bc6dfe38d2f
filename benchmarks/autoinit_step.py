"""Cost of one AutoInit step in forward-pass equivalents, on the AutoInit paper's Fig. 1 point.

The ReLU MLP of Fig. 1 (10 hidden layers of width 500, 3072 inputs, sigma_w = 2), |B| = 256, JLL:
``repeat`` interleaved (plain no-grad forward pass, step) pairs in one process (default 12), where a
step is the estimator pass (``_Twin.jvp_pass``), the loss and ``autograd.grad`` to the scales. Prints
step / forward on the wall clock and per process CPU-second (best and median of the pairs), and the
1-minute load average. ``OMP_WAIT_POLICY=PASSIVE`` is set before torch is imported unless the
environment sets it (spinning OpenMP workers inflate CPU time on a shared machine; see
benchmarks/mc_throughput.py).

Floor, counted in matrix products (each a fraction of the forward pass's 2.07 GFLOP; the input layer
is 38 % of it): the primal forward 1; the tangents (the probes as one batch through the 10 hidden
layers) 1.24 for 2 probes; reverse mode through the tangents, weight and input gradients, 2 x 1.24;
reverse mode through the primal (the tangents of a smooth activation depend on h), 1 + 0.62. About 6.3
forward passes of matrix products for 2 probes, before probes and element-wise work.

    python benchmarks/autoinit_step.py [n_probes] [repeat]      # defaults 2, 12
"""
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from pathlib import Path

try:
    import meanfield  # noqa: F401
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import time
import torch
from meanfield.torch.autoinit import _Twin, _generator, _loss, _measuring
torch.manual_seed(1)
layers = []
for i in range(11):
    lin = torch.nn.Linear(3072 if i == 0 else 500, 500, bias=False)
    torch.nn.init.normal_(lin.weight, std=2.0 / lin.in_features ** 0.5)
    layers += [lin, torch.nn.ReLU()]
model = torch.nn.Sequential(*layers[:-1])
blocks = [str(i) for i in range(0, 21, 2)]
x = torch.randn(256, 3072)
R = int(sys.argv[1]) if len(sys.argv) > 1 else 2
scales = {n: torch.ones((), requires_grad=True) for n, _ in model.named_parameters()}
gen = _generator(0, 1)
def step():
    Js, Ks = twin.jvp_pass(x, scales, R, gen)
    J = torch.stack([s.mean() for s in Js]); K = torch.stack(Ks)
    L = _loss(J, K, "jll", 0.0)
    torch.autograd.grad(L, list(scales.values()), allow_unused=True)
def fwd():
    with torch.no_grad():
        model(x)
with _measuring(model):
    twin = _Twin(model, blocks)
    step(); fwd()
    tf, ts, cf, cs = [], [], [], []
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 12):
        t0, c0 = time.perf_counter(), time.process_time(); fwd(); tf.append(time.perf_counter() - t0); cf.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time(); step(); ts.append(time.perf_counter() - t0); cs.append(time.process_time() - c0)
med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
print(f"probes {R}: forward {min(tf)*1e3:.1f} ms (cpu {min(cf)*1e3:.1f}), step {min(ts)*1e3:.1f} ms (cpu {min(cs)*1e3:.1f}) -> "
      f"{min(ts)/min(tf):.1f} forward equivalents (wall), {min(cs)/min(cf):.1f} (cpu); medians "
      f"{med(ts)/med(tf):.1f} (wall), {med(cs)/med(cf):.1f} (cpu); {len(tf)} pairs; load average "
      f"{os.getloadavg()[0]:.2f}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
