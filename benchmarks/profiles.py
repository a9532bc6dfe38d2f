"""Depth profiles K^l, chi_J^l (l = 1..50) at 10^4 (sigma_w, sigma_b) points: meanfield against
neural-tangents (jit + vmap) and ten lines of numpy with the closed forms, in one process.

    python benchmarks/profiles.py [--points 10000] [--depth 50] [--json FILE]

neural-tangents is optional (it skips with a message where it cannot be imported). Versions that
work together here (2026-11-23): jax 0.4.30, jaxlib 0.4.30, neural-tangents 0.6.5 installed with
``--no-deps`` plus ``frozendict`` (its declared dependencies pull tensorflow, which only its
``experimental`` subpackage needs; that subpackage is stubbed out below). chi_J^l is read from
neural-tangents' NTK: Theta^{l+1} = K^{l+1} + chi_J^l Theta^l for one (phi, Dense) block, so
chi_J^l = (Theta^{l+1} - K^{l+1}) / Theta^l, an independent route to the same number.
"""
import argparse
import json
import sys
import time
import types

import numpy as np

import meanfield as mf


def best_of(fn, n=3):
    best = np.inf
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def numpy_closed_forms(name, sw, sb, depth):
    """K^l and chi_J^l from the textbook closed forms (erf: Williams 1997; ReLU: Cho & Saul)."""
    W, T = sw * sw, sb * sb
    K = W + T
    Ks, Xs = np.empty(sw.shape + (depth,)), np.empty(sw.shape + (depth,))
    for l in range(depth):
        Ks[..., l] = K
        if name == "erf":
            Xs[..., l] = W * (4 / np.pi) / np.sqrt(1 + 4 * K)
            K = W * (2 / np.pi) * np.arcsin(2 * K / (1 + 2 * K)) + T
        else:
            Xs[..., l] = W / 2
            K = W * K / 2 + T
    return Ks, Xs


def neural_tangents_profile(name, depth):
    """A jitted, vmapped function (sw, sb) -> (K^l, chi_J^l) built on neural-tangents, or None."""
    try:
        sys.modules.setdefault("neural_tangents.experimental", types.ModuleType("neural_tangents.experimental"))
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        from neural_tangents import stax
    except Exception as err:  # not installed / incompatible: skip with the reason
        return None, f"{type(err).__name__}: {err}"

    x = jnp.ones((1, 4), dtype=jnp.float64)  # |x|^2 / N0 = 1: K^1 = sigma_w^2 + sigma_b^2

    def one(sw, sb):
        _, _, first = stax.Dense(1, W_std=sw, b_std=sb)
        phi = stax.Erf() if name == "erf" else stax.Relu()
        _, _, block = stax.serial(phi, stax.Dense(1, W_std=sw, b_std=sb))
        k = first(x, None, get=None)
        Ks, Xs = [], []
        for _ in range(depth):
            k2 = block(k, None, get=None)
            K, Th, K2, Th2 = k.nngp[0, 0], k.ntk[0, 0], k2.nngp[0, 0], k2.ntk[0, 0]
            Ks.append(K)
            Xs.append((Th2 - K2) / Th)
            k = k2
        return jnp.stack(Ks), jnp.stack(Xs)

    fn = jax.jit(jax.vmap(one))
    versions = f"jax {jax.__version__}, neural-tangents {__import__('neural_tangents').__version__}"
    return fn, versions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--depth", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    n = int(round(np.sqrt(args.points)))
    sw, sb = np.meshgrid(np.linspace(0.5, 3.0, n), np.linspace(0.0, 1.0, n), indexing="ij")
    sw, sb = sw.ravel(), sb.ravel()
    rows = []
    for name in ("erf", "relu"):
        arch = mf.Architecture(activation=name)
        t = time.perf_counter()
        mf.kernel_profile(arch, sigma_w=sw[:2], sigma_b=sb[:2], depth=args.depth)  # compile / load
        mf_first = time.perf_counter() - t
        t_mf, prof = best_of(lambda: mf.kernel_profile(arch, sigma_w=sw, sigma_b=sb, depth=args.depth))
        t_np, (Kn, Xn) = best_of(lambda: numpy_closed_forms(name, sw, sb, args.depth))
        t_loop, _ = best_of(lambda: [mf.kernel_profile(arch, sigma_w=a, sigma_b=b, depth=args.depth)
                                     for a, b in zip(sw[:1000].tolist(), sb[:1000].tolist())], n=1)
        row = dict(activation=name, points=sw.size, depth=args.depth, meanfield_s=t_mf,
                   meanfield_first_call_s=mf_first, loop_1000_scalar_calls_s=t_loop,
                   numpy_closed_forms_s=t_np,
                   max_rel_diff_numpy=float(max(np.max(np.abs(prof.K - Kn) / Kn), np.max(np.abs(prof.chi_J - Xn) / Xn))))
        fn, info = neural_tangents_profile(name, args.depth)
        if fn is None:
            row["neural_tangents"] = f"skipped ({info})"
        else:
            import jax

            t = time.perf_counter()
            out = fn(sw, sb)
            jax.block_until_ready(out)
            row["nt_compile_and_first_s"] = time.perf_counter() - t
            t_nt, (Kt, Xt) = best_of(lambda: jax.block_until_ready(fn(sw, sb)))
            Kt, Xt = np.asarray(Kt), np.asarray(Xt)
            row.update(neural_tangents=info, nt_s=t_nt,
                       max_rel_diff_nt=float(max(np.max(np.abs(prof.K - Kt) / Kt),
                                                 np.max(np.abs(prof.chi_J - Xt) / Xt))))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
