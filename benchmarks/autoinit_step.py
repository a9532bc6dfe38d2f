"""Cost of one AutoInit step in forward-pass equivalents, on the AutoInit paper's Fig. 1 point.

The ReLU MLP of Fig. 1 (10 hidden layers of width 500, 3072 inputs, sigma_w = 2), |B| = 256, JLL:
best of 6 interleaved (plain no-grad forward pass, step) pairs in one process, where a step is the
estimator pass (``_Twin.jvp_pass``), the loss and ``autograd.grad`` to the scales. Prints
step / forward on the wall clock and per process CPU-second.

    python benchmarks/autoinit_step.py [n_probes]      # default 2
"""
import sys
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
    for _ in range(6):
        t0, c0 = time.perf_counter(), time.process_time(); fwd(); tf.append(time.perf_counter() - t0); cf.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time(); step(); ts.append(time.perf_counter() - t0); cs.append(time.process_time() - c0)
print(f"probes {R}: forward {min(tf)*1e3:.1f} ms (cpu {min(cf)*1e3:.1f}), step {min(ts)*1e3:.1f} ms (cpu {min(cs)*1e3:.1f}) -> "
      f"{min(ts)/min(tf):.1f} forward equivalents (wall), {min(cs)/min(cf):.1f} (cpu)")
