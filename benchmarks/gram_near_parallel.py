"""Near-parallel pairs: meanfield.kernels against the 50-digit mpmath recursion (tests/references/gram_pair.py).

Run as ``python benchmarks/gram_near_parallel.py [--json=FILE]`` (not part of pytest; ~1 min). For every
activation (ReLU, leaky ReLU 0.1, erf, GELU) and block (plain, ln_pre, ln_post, residual mu = 0.8,
pre-LN residual mu = 0.8), input gaps 1 - rho = 1e-6, 1e-9, 1e-12, 1e-15 (and antiparallel pairs,
1 + rho = 1e-9, 1e-15), depths 1, 11, 32, both parameterisations and two pairs of norms (|x'| = |x|, and
x' = 1.3 x + a small perpendicular part), it prints the largest relative error of the NNGP and of the NTK
(over the norms and the parameterisations) as a markdown table (docs/gram.md, Numerics).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import meanfield as mf  # noqa: E402
import references.gram_pair as R  # noqa: E402

SW, SB, WIDTH, MU = 1.4, 0.3, 1000.0, 0.8
DEPTHS = (1, 11, 32)
GAPS = (1e-6, 1e-9, 1e-12, 1e-15, -1e-9, -1e-15)   # < 0: antiparallel, 1 + rho = |gap|
ACTS = {"relu": "relu", "leaky_relu": mf.act("leaky_relu", negative_slope=0.1).phi, "erf": "erf", "gelu": "gelu"}
BLOCKS = {"plain": ("none", None), "ln_pre": ("ln_pre", None), "ln_post": ("ln_post", None),
          "residual": ("none", MU), "pre-LN residual": ("ln_pre", MU)}


def pair(gap, scale, seed=0):
    """Two float64 inputs (d = 8) with 1 - rho = gap (gap < 0: 1 + rho = -gap), |x'| = scale |x|."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(8)
    e = rng.standard_normal(8)
    e -= (e @ x) / (x @ x) * x
    e *= np.linalg.norm(x) / np.linalg.norm(e)
    t = np.arccos(1 - gap) if gap > 0 else np.pi - np.arccos(1 + gap)
    # cos t and sin t from the gap itself (1 - cos t = gap exactly in real arithmetic)
    c = 1 - gap if gap > 0 else -(1 + gap)
    s = np.sin(t)
    return x, scale * (c * x + s * e)


def errors(act, block, gap, scale):
    norm, mu = BLOCKS[block]
    arch = mf.Architecture(ACTS[act], norm=norm, mu=mu)
    x, y = pair(gap, scale)
    ref = R.recursion(x, y, act, None if norm == "none" else norm, mu, max(DEPTHS), SW, SB, WIDTH, record=DEPTHS)
    out = {}
    for L in DEPTHS:
        K, T, Ts = (float(v) for v in ref[L])
        a = mf.kernels(arch, x[None], y[None], depth=L, sigma_w=SW, sigma_b=SB)
        b = mf.kernels(arch, x[None], y[None], depth=L, sigma_w=SW, sigma_b=SB, parameterization="standard",
                       width=WIDTH, get="ntk")
        out[L] = (abs(a.nngp[0, 0] / K - 1), max(abs(a.ntk[0, 0] / T - 1), abs(b.ntk[0, 0] / Ts - 1)))
    return out


def main():
    rows = {}
    for act in ACTS:
        for block in BLOCKS:
            for gap in GAPS:
                res = [errors(act, block, gap, s) for s in (1.0, 1.3)]
                rows[act, block, gap] = {L: (max(r[L][0] for r in res), max(r[L][1] for r in res)) for L in DEPTHS}
    print("| activation | block | " + " | ".join(
        f"{'1-rho' if g > 0 else '1+rho'}={abs(g):.0e}" for g in GAPS) + " |")
    print("|---|---|" + "---|" * len(GAPS))
    for act in ACTS:
        for block in BLOCKS:
            cells = []
            for gap in GAPS:
                r = rows[act, block, gap]
                nngp = max(r[L][0] for L in DEPTHS)
                ntk = max(r[L][1] for L in DEPTHS)
                cells.append(f"{nngp:.0e} / {ntk:.0e}")
            print(f"| {act} | {block} | " + " | ".join(cells) + " |")
    print("\nby depth (max over activations and blocks, NNGP / NTK):")
    for L in DEPTHS:
        print(f"depth {L}: " + ", ".join(
            f"{abs(g):.0e}{'' if g > 0 else ' anti'}: "
            f"{max(rows[a, b, g][L][0] for a in ACTS for b in BLOCKS):.1e} / "
            f"{max(rows[a, b, g][L][1] for a in ACTS for b in BLOCKS):.1e}" for g in GAPS))
    for arg in sys.argv[1:]:
        if arg.startswith("--json="):
            with open(arg.split("=", 1)[1], "w") as fh:
                json.dump({f"{a}|{b}|{g}": {str(L): v for L, v in r.items()} for (a, b, g), r in rows.items()}, fh,
                          indent=1)


if __name__ == "__main__":
    main()
