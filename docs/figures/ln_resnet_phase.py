"""The LayerNorm ResNet's phase diagrams (partial-Jacobian paper, Fig. 4): theory next to Monte Carlo.

One stage of pre-activation BasicBlocks, h -> mu h + conv(relu(LN(conv(relu(LN(h)))))), 3 x 3 convolutions
with zero padding, LayerNorm over channels and positions (torch's ``nn.LayerNorm([C, H, W])``), on 8 x 8
maps (ResNet110's last stage), and the control with a LayerNorm per position. The APJN J^{L-2,L-1} of a
depth-L network, L = 20, as the paper measures it:

* theory: :func:`meanfield.gram.tokens.token_jacobians` at that layer, on the input Monte Carlo draws;
* Monte Carlo: :func:`meanfield.verification.phase_diagram` (``tokens=(8, 8)``), 256 channels, 32
  initialisations, common random numbers over each grid.

Planes: (sigma_w^2, mu) at sigma_b = 0, and (sigma_w^2, sigma_b^2) at mu = 1. Writes ln_resnet_phase.json
(every number) and ln_resnet_phase.png next to this file; ``python docs/figures/ln_resnet_phase.py``
(about 10 minutes on 2 cores). tests/test_gram_jacobians.py recomputes the theory and checks the stored
measurements against it with the suite's rule.
"""
import json
import time
from pathlib import Path

import numpy as np

import meanfield as mf
from meanfield.gram.tokens import token_jacobians

HERE = Path(__file__).resolve().parent
GRID, DEPTH, WIDTH, N_INIT, SEED = (8, 8), 20, 256, 32, 0
SW2 = [0.5, 1.0, 2.0, 3.0, 4.0]
MU = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0]
SB2 = [0.0, 0.1, 0.5, 1.0]


def basic_block(mu, norm_axis="positions"):
    """The pre-activation BasicBlock with the LayerNorm over (channels, positions) or per position."""
    norm = mf.layer_norm(axis="positions") if norm_axis == "positions" else mf.layer_norm()
    return mf.Network(mf.residual(norm, mf.act("relu"), mf.conv((3, 3)), norm, mf.act("relu"), mf.conv((3, 3)),
                                  mu=mu))


def theory(net, sw, sb, image, layer):
    """J^{layer,layer+1} of the walk over positions on ``image`` (1, H, W, d)."""
    return float(token_jacobians(net, image, layer, sw, sb)["chi_J"][layer - 1, 0])


def the_input(width):
    """The input Monte Carlo draws (make_inputs with the seed), channels-last."""
    from meanfield.verification._batched import make_inputs

    x, _ = make_inputs(1, GRID[0] * GRID[1], width, 0.0, SEED)
    return x.numpy().reshape((1,) + GRID + (-1,))


def measure():
    from meanfield.verification import phase_diagram

    layer = DEPTH - 2
    out = {"grid": GRID, "depth": DEPTH, "width": WIDTH, "n_init": N_INIT, "seed": SEED, "layer": layer,
           "sigma_w2": SW2, "mu": MU, "sigma_b2": SB2, "planes": {}}
    sw = np.sqrt(SW2)
    t0 = time.perf_counter()
    for name, norm_axis in (("mu_positions", "positions"), ("mu_per_position", "features")):
        rows = {"chi_J": [], "chi_J_se": []}
        for mu in MU:
            r = phase_diagram(basic_block(mu, norm_axis), sw, [0.0], depth=DEPTH, width=WIDTH, n_init=N_INIT,
                              tokens=GRID, seed=SEED, device="cpu")
            rows["chi_J"].append(r.chi_J[:, 0].tolist())
            rows["chi_J_se"].append(r.chi_J_se[:, 0].tolist())
        out["planes"][name] = rows
    r = phase_diagram(basic_block(1.0), sw, np.sqrt(SB2), depth=DEPTH, width=WIDTH, n_init=N_INIT, tokens=GRID,
                      seed=SEED, device="cpu")
    out["planes"]["sb_mu1"] = {"chi_J": r.chi_J.tolist(), "chi_J_se": r.chi_J_se.tolist()}
    out["input_dim"] = max(WIDTH, 2 * GRID[0] * GRID[1])   # monte_carlo's default N0 for one input
    out["seconds"] = time.perf_counter() - t0
    return out


def theory_planes(data):
    """The theory at every measured point, the same shapes as the stored planes."""
    image = the_input(data.get("input_dim", WIDTH))
    layer = data["layer"]
    sw = np.sqrt(data["sigma_w2"])
    th = {}
    for name, norm_axis in (("mu_positions", "positions"), ("mu_per_position", "features")):
        th[name] = [[theory(basic_block(mu, norm_axis), w, 0.0, image, layer) for w in sw] for mu in data["mu"]]
    th["sb_mu1"] = [[theory(basic_block(1.0), w, b, image, layer) for b in np.sqrt(data["sigma_b2"])] for w in sw]
    return th


def plot(data, th):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, name, title in ((axes[0], "mu_positions", "LayerNorm over (C, H, W)"),
                            (axes[1], "mu_per_position", "LayerNorm per position (control)")):
        mc, se = np.array(data["planes"][name]["chi_J"]), np.array(data["planes"][name]["chi_J_se"])
        for j, w2 in enumerate(data["sigma_w2"]):
            ax.errorbar(data["mu"], mc[:, j], yerr=se[:, j], fmt="o", ms=3, label=f"MC $\\sigma_w^2$={w2:g}")
        ax.plot(data["mu"], np.array(th[name])[:, 0], "k-", label="theory")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set(xlabel="$\\mu$", ylabel="$J^{L-2,L-1}$", title=f"{title}, $\\sigma_b$ = 0")
    axes[0].legend(fontsize=7)
    mc = np.array(data["planes"]["sb_mu1"]["chi_J"])
    for i, b2 in enumerate(data["sigma_b2"]):
        axes[2].errorbar(data["sigma_w2"], mc[:, i], yerr=np.array(data["planes"]["sb_mu1"]["chi_J_se"])[:, i],
                         fmt="o", ms=3, label=f"MC $\\sigma_b^2$={b2:g}")
        axes[2].plot(data["sigma_w2"], np.array(th["sb_mu1"])[:, i], "k-", lw=0.8)
    axes[2].axhline(1.0, color="grey", lw=0.5)
    axes[2].set(xlabel="$\\sigma_w^2$", ylabel="$J^{L-2,L-1}$", title="$\\mu$ = 1 (lines: theory)")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"Pre-activation BasicBlocks on {GRID[0]}x{GRID[1]} maps, zero padding, L = {DEPTH}, "
                 f"{WIDTH} channels, {N_INIT} initialisations", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "ln_resnet_phase.png", dpi=110)


if __name__ == "__main__":
    data = measure()
    th = theory_planes(data)
    data["theory"] = th
    (HERE / "ln_resnet_phase.json").write_text(json.dumps(data, indent=1))
    plot(data, th)
    print(f"done in {data['seconds']:.0f} s")
