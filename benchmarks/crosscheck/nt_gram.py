"""neural-tangents against ``meanfield.kernels`` and ``meanfield.kernel_profile``.

    /tmp/nt-venv/bin/python benchmarks/crosscheck/nt_gram.py

Independent route: neural-tangents' ``stax`` kernel functions (its own closed
forms for Relu, LeakyRelu, ABRelu, Erf, Gelu, LayerNorm, its own Dense
NTK rules), float64 (``jax_enable_x64``). Versions: jax 0.4.30, jaxlib 0.4.30,
neural-tangents 0.6.5 installed with ``--no-deps`` plus absl-py and frozendict
(its ``experimental`` subpackage needs tensorflow and is stubbed out below).

How each architecture is written in stax (``depth`` dense layers, as in ``mf.kernels``):

* MLP: ``Dense, [phi, Dense] * (depth - 1)``, every Dense with ``W_std=sigma_w,
  b_std=sigma_b`` and the given parameterisation (hidden width ``WIDTH``, which only the
  standard NTK sees).
* residual ``h <- mu h + Dense(phi(h))``: ``FanOut(2), parallel(DotGeneral(lhs=mu), serial(phi, Dense)),
  FanInSum`` (``DotGeneral(lhs=mu)`` is ``x -> mu x``, a linear layer that keeps the signal
  Gaussian, which ``FanInSum`` requires).
* pre-LN: ``LayerNorm(axis=-1, eps=0)`` before phi. neural-tangents' LayerNorm needs Gaussian
  inputs (``k.is_gaussian``), so LayerNorm after the activation (``ln_post``) cannot be
  checked this way (it raises NotImplementedError there).

Inputs: 7 rows in d = 5 with norms from 0.3 to 3 (so |x|^2/d from 0.018 to 1.8), one
repeated row, one antiparallel pair. Reported: the largest relative difference over all
entries, max |mf - nt| / max(|nt|, 1e-300), per (architecture, parameters, depth), NNGP and NTK.
"""
import sys
import types

import numpy as np

sys.modules.setdefault("neural_tangents.experimental", types.ModuleType("neural_tangents.experimental"))
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
from neural_tangents import stax  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.activations import ScaleInvariant  # noqa: E402

WIDTH = 512


def inputs():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((7, 5))
    norms = np.array([0.3, 0.7, 1.0, 1.5, 2.2, 3.0, 1.0])
    x = x / np.linalg.norm(x, axis=1, keepdims=True) * norms[:, None]
    x[6] = x[2]              # repeated row: correlation exactly 1
    x[5] = -1.7 * x[1]       # antiparallel pair
    return x


def nt_phi(name):
    return {"relu": stax.Relu(), "erf": stax.Erf(), "gelu": stax.Gelu(approximate=False),
            "leaky_relu": stax.LeakyRelu(0.23), "abrelu": stax.ABRelu(-0.6, 1.3)}[name]


def mf_phi(name):
    import sympy as sp

    from meanfield.symbols import x
    if name == "leaky_relu":
        return mf.act("leaky_relu", negative_slope=0.23)
    if name == "abrelu":  # stax.ABRelu(a, b) = a min(x, 0) + b max(x, 0)
        a, b = sp.Rational(-3, 5), sp.Rational(13, 10)
        expr = sp.Piecewise((b * x, x >= 0), (a * x, True))
        return mf.act(ScaleInvariant("abrelu", expr, b, a))
    return mf.act(name)


def nt_net(name, norm, mu, depth, sw, sb, param):
    dense = lambda: stax.Dense(WIDTH, W_std=sw, b_std=sb, parameterization=param)  # noqa: E731
    branch = [stax.LayerNorm(axis=-1, eps=0.0)] if norm == "ln_pre" else []
    branch = stax.serial(*branch, nt_phi(name), dense())
    layers = [dense()]
    for _ in range(depth - 1):
        if mu is None:
            layers.append(branch)
        else:
            layers.append(stax.serial(stax.FanOut(2), stax.parallel(stax.DotGeneral(lhs=mu), branch), stax.FanInSum()))
    return stax.serial(*layers)


def mf_net(name, norm, mu):
    parts = ([mf.layer_norm()] if norm == "ln_pre" else []) + [mf_phi(name), mf.dense()]
    if mu is None:
        return mf.Network(mf.serial(*parts))
    return mf.Network(mf.residual(*parts), mu=mu)


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


CASES = [  # (activation, norm, mu, sigma_w, sigma_b)
    ("relu", "none", None, 1.37, 0.23),
    ("relu", "none", None, 1.9, 0.0),
    ("erf", "none", None, 1.37, 0.23),
    ("erf", "none", None, 2.6, 0.71),
    ("gelu", "none", None, 1.37, 0.23),
    ("gelu", "none", None, 1.62, 0.05),
    ("leaky_relu", "none", None, 1.37, 0.23),
    ("abrelu", "none", None, 0.93, 0.41),
    ("relu", "none", 0.61, 1.37, 0.23),
    ("erf", "ln_pre", None, 1.37, 0.23),
    ("gelu", "ln_pre", 0.7, 1.37, 0.23),
    ("erf", "ln_pre", 0.83, 2.1, 0.37),
    ("relu", "ln_pre", 0.44, 1.37, 0.23),
]
DEPTHS = (1, 2, 5, 12, 20)


def gram_table():
    x = inputs()
    rows, worst = [], 0.0
    for name, norm, mu, sw, sb in CASES:
        for param in ("ntk", "standard"):
            for depth in DEPTHS:
                _, _, kfn = nt_net(name, norm, mu, depth, sw, sb, param)
                k = kfn(x, None, ("nngp", "ntk"))
                r = mf.kernels(mf_net(name, norm, mu), x, depth=depth, sigma_w=sw, sigma_b=sb,
                               parameterization=param, width=WIDTH if param == "standard" else None)
                e1, e2 = rel(r.nngp, k.nngp), rel(r.ntk, k.ntk)
                worst = max(worst, e1, e2)
                rows.append((name, norm, mu, sw, sb, param, depth, e1, e2))
    print("## Gram matrices: meanfield.kernels vs neural_tangents.stax kernel_fn (7 inputs, norms 0.3-3)\n")
    print("| activation | norm | mu | sigma_w | sigma_b | param | depth | NNGP max rel | NTK max rel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| {} | {} | {} | {} | {} | {} | {} | {:.1e} | {:.1e} |".format(*row))
    print(f"\nlargest over the table: {worst:.2e}\n")
    return worst


def profile_table():
    """kernel_profile (unit-norm input, K^1 = sw^2 + sb^2) against NT's diagonal, and chi_J^l
    read from NT's NTK: Theta^{l+1} = chi_J^l Theta^l + (K^{l+1} - mu^2 K^l)."""
    x = np.ones((1, 4))  # |x|^2/d = 1
    print("## kernel_profile / chi_J against neural-tangents' diagonal (depth 20)\n")
    print("| activation | norm | mu | sigma_w | sigma_b | K^l max rel | chi_J^l max rel |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, norm, mu, sw, sb in CASES:
        if name in ("leaky_relu", "abrelu"):
            continue
        arch = mf.Architecture(name, norm=norm, mu=mu)
        depth = 20
        prof = mf.kernel_profile(arch, sigma_w=sw, sigma_b=sb, depth=depth)
        Ks, Ts = [], []
        for l in range(1, depth + 2):
            _, _, kfn = nt_net(name, norm, mu, l, sw, sb, "ntk")
            k = kfn(x, None, ("nngp", "ntk"))
            Ks.append(float(k.nngp[0, 0]))
            Ts.append(float(k.ntk[0, 0]))
        Ks, Ts = np.array(Ks), np.array(Ts)
        m2 = 0.0 if mu is None else mu * mu
        chi = (Ts[1:] - (Ks[1:] - m2 * Ks[:-1])) / Ts[:-1]
        e1, e2 = rel(prof.K, Ks[:depth]), rel(prof.chi_J, chi[:depth])
        worst = max(worst, e1, e2)
        print(f"| {name} | {norm} | {mu} | {sw} | {sb} | {e1:.1e} | {e2:.1e} |")
    print(f"\nlargest over the table: {worst:.2e}\n")
    return worst


def sweep(n=40, seed=3):
    """Random architectures and parameters (sigma_w in [0.4, 3], sigma_b in [0, 1.2], depth 1-40),
    inputs with a near-parallel pair (1 - rho ~ 1e-12) added: the largest relative difference of
    each kernel, and of each entry relative to sqrt(Theta_aa Theta_bb)."""
    rng = np.random.default_rng(seed)
    x = inputs()
    x = np.concatenate([x, x[3:4] + 1e-6 * rng.standard_normal((1, 5))])
    acts = ["relu", "erf", "gelu", "leaky_relu", "abrelu"]
    print("## Random sweep (8 inputs incl. a pair with 1 - rho ~ 1e-12)\n")
    print("| activation | norm | mu | sigma_w | sigma_b | param | depth | NNGP max rel | NTK max rel | NTK max rel to scale |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for _ in range(n):
        name = acts[rng.integers(len(acts))]
        norm = "ln_pre" if rng.random() < 0.4 else "none"
        mu = None if rng.random() < 0.4 else float(np.round(rng.uniform(0.1, 0.95), 3))
        sw, sb = float(np.round(rng.uniform(0.4, 3.0), 3)), float(np.round(rng.uniform(0, 1.2), 3))
        depth = int(rng.integers(1, 41))
        param = "ntk" if rng.random() < 0.5 else "standard"
        _, _, kfn = nt_net(name, norm, mu, depth, sw, sb, param)
        k = kfn(x, None, ("nngp", "ntk"))
        try:
            r = mf.kernels(mf_net(name, norm, mu), x, depth=depth, sigma_w=sw, sigma_b=sb, parameterization=param,
                           width=WIDTH if param == "standard" else None)
        except ValueError as err:
            print(f"| {name} | {norm} | {mu} | {sw} | {sb} | {param} | {depth} | ValueError: {str(err)[:60]} | | |")
            continue
        kn, kt = np.asarray(k.nngp), np.asarray(k.ntk)
        if not (np.all(np.isfinite(kn)) and np.all(np.isfinite(kt))):
            print(f"| {name} | {norm} | {mu} | {sw} | {sb} | {param} | {depth} | (neural-tangents not finite) | | |")
            continue
        e1, e2 = rel(r.nngp, kn), rel(r.ntk, kt)
        sc = np.sqrt(np.outer(np.diag(kt), np.diag(kt)))
        e3 = float(np.max(np.abs(r.ntk - kt) / sc))
        worst = max(worst, e1, e3)
        print(f"| {name} | {norm} | {mu} | {sw} | {sb} | {param} | {depth} | {e1:.1e} | {e2:.1e} | {e3:.1e} |")
    print(f"\nlargest (NNGP, NTK relative to scale): {worst:.2e}\n")


if __name__ == "__main__":
    import jax as _j
    import neural_tangents as _nt
    print(f"neural-tangents {_nt.__version__}, jax {_j.__version__}, float64\n")
    if "--sweep" in sys.argv:
        sweep()
    else:
        gram_table()
        profile_table()

