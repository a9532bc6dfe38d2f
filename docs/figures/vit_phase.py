"""The partial-Jacobian paper's ViT phase diagrams (appendix C, Figs. 7 and 8), by Monte Carlo.

The paper's network: L = 24 blocks, 8 heads, 256 channels, standard softmax attention with 1/sqrt(d_h)
logits, pre-LN or post-LN blocks (:func:`meanfield.transformer`), with or without the MLP sublayers (GELU);
every weight (queries, keys, values, output, MLP) at sigma_w, biases (output and MLP) at sigma_b. The
input is 16 orthonormal tokens through a per-token embedding, as :func:`meanfield.verification.monte_carlo`
draws it. Measured: J^{L-2,L-1}, the APJN of the last block but one, with
:func:`meanfield.verification.phase_diagram` (32 initialisations, common random numbers over each grid).

These are measurements only (the package's 1/sqrt(d_h) theory is a sampled walk without a fixed-point
solver yet: docs/gram.md, "Attention and transformer blocks"); docs/errata.md compares them with the paper's
three claims.

Planes: (sigma_w^2, mu) at sigma_b = 0 for the four blocks (Fig. 7), and (sigma_w^2, sigma_b^2) for stacked
attention layers with no LayerNorm and no residual, with and without the MLP (Fig. 8). Writes
vit_phase.json and vit_phase.png next to this file: ``python docs/figures/vit_phase.py`` (about 5 minutes
on 2 cores).
"""
import json
import time
from pathlib import Path

import numpy as np

import meanfield as mf

HERE = Path(__file__).resolve().parent
TOKENS, DEPTH, WIDTH, HEADS, N_INIT, SEED = 16, 24, 256, 8, 32, 0
SW2 = [0.25, 0.5, 1.0, 2.0, 3.0, 4.0]
MU = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0]
SB2 = [0.0, 0.1, 0.5, 1.0]


def standard_attention():
    """The paper's attention: 8 heads, 1/sqrt(d_h) logits, every projection at the scanned sigma_w."""
    s = "sigma_w"
    return mf.attention(HEADS, scaling="1/sqrt(d)", sigma_q=s, sigma_k=s, sigma_v=s)


def vit_block(norm, mlp, mu):
    return mf.Network(mf.transformer("gelu", norm, standard_attention(), mlp=mlp), mu=mu)


def stacked(mlp):
    """Attention layers alone (no LayerNorm, no residual), or each followed by the MLP."""
    layers = [standard_attention()] + ([mf.dense(), mf.act("gelu"), mf.dense()] if mlp else [])
    return mf.Network(mf.serial(*layers))


VARIANTS = {"pre_mlp": ("pre", True), "pre": ("pre", False), "post_mlp": ("post", True), "post": ("post", False)}


def measure():
    from meanfield.verification import phase_diagram

    kw = dict(depth=DEPTH, width=WIDTH, n_init=N_INIT, tokens=TOKENS, seed=SEED, device="cpu")
    out = {"tokens": TOKENS, "depth": DEPTH, "width": WIDTH, "heads": HEADS, "n_init": N_INIT, "seed": SEED,
           "layer": DEPTH - 2, "sigma_w2": SW2, "mu": MU, "sigma_b2": SB2, "planes": {}}
    sw = np.sqrt(SW2)
    t0 = time.perf_counter()
    for name, (norm, mlp) in VARIANTS.items():
        rows = {"chi_J": [], "chi_J_se": []}
        for mu in MU:
            r = phase_diagram(vit_block(norm, mlp, mu), sw, [0.0], **kw)
            rows["chi_J"].append(r.chi_J[:, 0].tolist())
            rows["chi_J_se"].append(r.chi_J_se[:, 0].tolist())
        out["planes"][name] = rows
    for name, mlp in (("stacked_mlp", True), ("stacked", False)):
        r = phase_diagram(stacked(mlp), sw, np.sqrt(SB2), **kw)
        out["planes"][name] = {"chi_J": r.chi_J.tolist(), "chi_J_se": r.chi_J_se.tolist()}
    out["seconds"] = time.perf_counter() - t0
    return out


def plot(data):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    titles = {"pre_mlp": "pre-LN ViT", "pre": "pre-LN, no MLP", "post_mlp": "post-LN ViT", "post": "post-LN, no MLP"}
    for ax, name in zip(axes.ravel()[:4], VARIANTS):
        mc, se = np.array(data["planes"][name]["chi_J"]), np.array(data["planes"][name]["chi_J_se"])
        for j, w2 in enumerate(data["sigma_w2"]):
            ax.errorbar(data["mu"], mc[:, j], yerr=se[:, j], fmt="o-", ms=3, lw=0.8, label=f"$\\sigma_w^2$={w2:g}")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set(xlabel="$\\mu$", ylabel="$J^{L-2,L-1}$", title=f"{titles[name]}, $\\sigma_b$ = 0")
    axes[0, 0].legend(fontsize=7)
    for ax, name, title in ((axes[1, 1], "stacked_mlp", "stacked attention + MLP"),
                            (axes[1, 2], "stacked", "stacked attention")):
        mc = np.log10(np.array(data["planes"][name]["chi_J"]))
        for i, b2 in enumerate(data["sigma_b2"]):
            ax.plot(data["sigma_w2"], mc[:, i], "o-", ms=3, lw=0.8, label=f"$\\sigma_b^2$={b2:g}")
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set(xlabel="$\\sigma_w^2$", ylabel="$\\log_{10} J^{L-2,L-1}$", title=f"{title} (no LN, no skip)")
        ax.legend(fontsize=7)
    fig.suptitle(f"ViT blocks by Monte Carlo: 1/sqrt(d_h) softmax attention, {HEADS} heads, {TOKENS} tokens, "
                 f"L = {DEPTH}, {WIDTH} channels, {N_INIT} initialisations", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "vit_phase.png", dpi=110)


if __name__ == "__main__":
    data = measure()
    (HERE / "vit_phase.json").write_text(json.dumps(data, indent=1))
    plot(data)
    print(f"done in {data['seconds']:.0f} s")
