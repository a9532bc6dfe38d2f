"""Cost of one AutoInit step in forward-pass equivalents, on the AutoInit paper's Fig. 1 point.

The ReLU MLP of Fig. 1 (10 hidden layers of width 500, 3072 inputs, sigma_w = 2), |B| = 256, JLL:
``repeat`` interleaved (plain no-grad forward pass, step) pairs in one process (default 12), where a
step is the estimator pass (``_Twin.jvp_pass``), the loss and ``autograd.grad`` to the scales. Prints
step / forward on the wall clock and per process CPU-second (best and median of the pairs), and the
1-minute load average. ``OMP_WAIT_POLICY=PASSIVE`` is set before torch is imported unless the
environment sets it (spinning OpenMP workers inflate CPU time on a shared machine; see
benchmarks/mc_throughput.py).

``--compare`` interleaves a third call per round, the same step with torch's own forward-mode rules
for Linear and ReLU (``_tangent_rules`` switched off: the estimator before issue 15's change), checks
that loss and gradients agree, and prints both. ``--act NAME`` replaces ReLU by ``torch.nn.NAME``
(e.g. GELU, Tanh: activations whose tangent depends on h, so the primal reverse pass is needed).

Floor, counted in matrix products (each a fraction of the forward pass's 2.07 GFLOP; the input layer
is 38 % of it): the primal forward 1; the tangents (the probes as one batch through the 10 hidden
layers) 0.62 per probe; reverse mode through the tangents, weight and input gradients, 2 x 0.62 per
probe. For ReLU under JLL nothing else (the mask has zero derivative, so no reverse pass through the
primal): 1 + 3 x 0.62 R, i.e. 2.9 with 1 probe and 4.7 with 2. For an activation whose tangent depends
on h, add the primal reverse pass, 1 + 0.62 (the input layer's input gradient is skipped).

    python benchmarks/autoinit_step.py [n_probes] [repeat] [--compare] [--act NAME]   # defaults 2, 12
"""
import contextlib
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
import meanfield.torch.autoinit  # noqa: F401
ai = sys.modules["meanfield.torch.autoinit"]  # the module (the package re-exports the function of this name)

args = [a for a in sys.argv[1:] if not a.startswith("--")]
compare = "--compare" in sys.argv
act = sys.argv[sys.argv.index("--act") + 1] if "--act" in sys.argv else "ReLU"
if act in args:
    args.remove(act)
torch.manual_seed(1)
layers = []
for i in range(11):
    lin = torch.nn.Linear(3072 if i == 0 else 500, 500, bias=False)
    torch.nn.init.normal_(lin.weight, std=2.0 / lin.in_features ** 0.5)
    layers += [lin, getattr(torch.nn, act)()]
model = torch.nn.Sequential(*layers[:-1])
blocks = [str(i) for i in range(0, 21, 2)]
x = torch.randn(256, 3072)
R = int(args[0]) if args else 2
scales = {n: torch.ones((), requires_grad=True) for n, _ in model.named_parameters()}
twin_rules = ai._tangent_rules


def step(own_rules=True):
    ai._tangent_rules = twin_rules if own_rules else (lambda m: contextlib.nullcontext())
    try:
        Js, Ks = twin.jvp_pass(x, scales, R, ai._generator(0, 1))
    finally:
        ai._tangent_rules = twin_rules
    J = torch.stack([s.mean() for s in Js]); K = torch.stack(Ks)
    L = ai._loss(J, K, "jll", 0.0)
    return L, torch.autograd.grad(L, list(scales.values()), allow_unused=True)


def fwd():
    with torch.no_grad():
        model(x)


def timed(f, *a):
    t0, c0 = time.perf_counter(), time.process_time()
    f(*a)
    return time.perf_counter() - t0, time.process_time() - c0


with ai._measuring(model):
    twin = ai._Twin(model, blocks)
    L1, g1 = step(); fwd()
    if compare:
        L0, g0 = step(False)
        zero = torch.zeros(())
        dg = max(float(((a if a is not None else zero) - (b if b is not None else zero)).abs()) for a, b in zip(g0, g1))
        print(f"loss {L1.item():.9g} (torch's rules {L0.item():.9g}); max |gradient difference| {dg:.3g}")
    F, S, S0 = [], [], []
    for _ in range(int(args[1]) if len(args) > 1 else 12):
        F.append(timed(fwd)); S.append(timed(step))
        if compare:
            S0.append(timed(step, False))
med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731


def line(name, S):
    ts, cs = [s[0] for s in S], [s[1] for s in S]
    tf, cf = [f[0] for f in F], [f[1] for f in F]
    return (f"{name}: forward {min(tf)*1e3:.1f} ms (cpu {min(cf)*1e3:.1f}), "
            f"step {min(ts)*1e3:.1f} ms (cpu {min(cs)*1e3:.1f})"
            f" -> {min(ts)/min(tf):.1f} forward equivalents (wall), {min(cs)/min(cf):.1f} (cpu); medians "
            f"{med(ts)/med(tf):.1f} (wall), {med(cs)/med(cf):.1f} (cpu)")


print(f"{act}, probes {R}, {len(F)} rounds; load average {os.getloadavg()[0]:.2f}; "
      f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
print(line("twin's rules", S))
if compare:
    print(line("torch's rules", S0))
