"""Monte Carlo written from scratch in plain torch (no meanfield.torch) against kernel_profile.

    python benchmarks/crosscheck/mc_independent.py [--width 1024] [--depth 30] [--n-init 48]

Networks (float64, CPU), one unit-norm input x in R^width (|x|^2 / d = 1):
h^1 = W^0 x + b^0, h^{l+1} = mu h^l + W^l N(phi(h^l)) + b^l (ln_post) or
mu h^l + W^l phi(N(h^l)) + b^l (ln_pre), W ~ N(0, sigma_w^2 / width), b ~ N(0, sigma_b^2),
N(a) = (a - mean a) / sqrt(mean (a - mean a)^2) over the features (no eps, no affine).
K^l = mean_i (h^l_i)^2; J^{l,l+1} = ||J v||^2 / width with J = dh^{l+1}/dh^l by
``torch.func.jvp`` and v ~ N(0, I) (E ||J v||^2 = ||J||_F^2). Both averaged over independent
initialisations, with standard errors. Theory: ``meanfield.kernel_profile`` (K^l at [l-1],
chi_J^l = J^{l,l+1} at [l-1]).
"""
import argparse
import math

import numpy as np
import torch


def gelu(a):
    return 0.5 * a * (1 + torch.erf(a / math.sqrt(2.0)))


def norm(a):
    c = a - a.mean(-1, keepdim=True)
    return c / torch.sqrt((c * c).mean(-1, keepdim=True))


PHI = {"gelu": gelu, "tanh": torch.tanh, "erf": torch.erf}


def block(h, W, b, mu, phi, where):
    z = norm(phi(h)) if where == "ln_post" else phi(norm(h))
    return mu * h + z @ W.T + b


def run(name, where, mu, sw, sb, width, depth, n_init, seed=0):
    g = torch.Generator().manual_seed(seed)
    phi = PHI[name]
    K = np.empty((n_init, depth))
    J = np.empty((n_init, depth - 1))
    for i in range(n_init):
        x = torch.randn(width, generator=g, dtype=torch.float64)
        x = x / torch.sqrt((x * x).mean())
        W0 = torch.randn(width, width, generator=g, dtype=torch.float64) * (sw / math.sqrt(width))
        h = W0 @ x + sb * torch.randn(width, generator=g, dtype=torch.float64)
        for l in range(depth):
            K[i, l] = float((h * h).mean())
            if l == depth - 1:
                break
            W = torch.randn(width, width, generator=g, dtype=torch.float64) * (sw / math.sqrt(width))
            b = sb * torch.randn(width, generator=g, dtype=torch.float64)
            v = torch.randn(width, generator=g, dtype=torch.float64)
            h_next, jv = torch.func.jvp(lambda a: block(a, W, b, mu, phi, where), (h,), (v,))
            J[i, l] = float((jv * jv).sum() / width)
            h = h_next
    return K, J


def compare(name, where, mu, sw, sb, width, depth, n_init):
    import meanfield as mf

    K, J = run(name, where, mu, sw, sb, width, depth, n_init)
    prof = mf.kernel_profile(mf.Architecture(name, norm=where, mu=mu), sigma_w=sw, sigma_b=sb, depth=depth)
    Kt, Jt = np.asarray(prof.K), np.asarray(prof.chi_J)[: depth - 1]
    Km, Ks = K.mean(0), K.std(0, ddof=1) / math.sqrt(n_init)
    Jm, Js = J.mean(0), J.std(0, ddof=1) / math.sqrt(n_init)
    zK, zJ = (Km - Kt) / Ks, (Jm - Jt) / Js
    print(f"### {name}, {where}, mu={mu}, sigma_w={sw}, sigma_b={sb}: width {width}, depth {depth}, "
          f"{n_init} initialisations\n")
    print("| layer l | K^l MC | +- se | K^l theory | z | J^{l,l+1} MC | +- se | chi_J^l theory | z |")
    print("|---|---|---|---|---|---|---|---|---|")
    for l in sorted(l for l in {1, 2, 3, 5, 10, depth // 2, depth - 2, depth - 1} if 1 <= l <= depth - 1):
        i = l - 1
        print(f"| {l} | {Km[i]:.5f} | {Ks[i]:.5f} | {Kt[i]:.5f} | {zK[i]:+.2f} | {Jm[i]:.5f} | {Js[i]:.5f} | "
              f"{Jt[i]:.5f} | {zJ[i]:+.2f} |")
    print(f"\nall layers: max |z| K {np.max(np.abs(zK)):.2f}, J {np.max(np.abs(zJ)):.2f}; "
          f"max relative difference K {np.max(np.abs(Km / Kt - 1)):.2e}, J {np.max(np.abs(Jm / Jt - 1)):.2e}; "
          f"typical relative se K {np.median(Ks / Km):.1e}, J {np.median(Js / Jm):.1e}\n")
    return zK, zJ


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--n-init", type=int, default=48)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, float64, CPU\n")
    compare("gelu", "ln_post", 0.7, 1.37, 0.23, a.width, a.depth, a.n_init)
    compare("tanh", "ln_pre", 0.9, 1.5, 0.3, a.width, a.depth, a.n_init)
    compare("erf", "ln_post", 0.5, 2.2, 0.1, a.width, a.depth, a.n_init)
