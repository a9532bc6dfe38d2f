"""DeepMind's ``dks`` package against ``meanfield.shaping`` (DKS, TAT, TReLU, C maps).

    /tmp/dks-venv/bin/python benchmarks/crosscheck/dks_shaping.py

``dks`` 0.1.2 (``pip install --no-deps dks`` plus autograd and absl-py), its numpy/autograd
backend ``dks.base.activation_transform``: its own root finder (scipy ``root`` from fixed
starting points), its own quadrature (Gauss-Legendre of order 10^5 on [-10, 10] for one-point
means, ``dblquad`` for two-point ones) and autograd derivatives. Nothing of meanfield is used
on its side.

Conventions (they agree; stated because the names differ):

* transformation: dks ``output_scale * (phi(input_scale * x + input_shift) + output_shift)``
  = meanfield ``gamma * (phi(alpha * x + beta) + delta)``.
* DKS: dks ``c_slope_1_target`` is zeta (the network's maximal slope); the local C'(1) target
  solves ``max_slope_func(s) = zeta``, for an L-layer vanilla net ``s**L``; Q'(1) = 1, C(0) = 0,
  Q(1) = 1. dks finds that local slope by bisection to 1e-8 (``_solve_increasing``), meanfield
  by Brent to 1e-15: DKS parameters can only agree to about 1e-8.
* TAT (smooth): dks ``c_curve_target`` is tau; local C''(1) solves ``max_curv_func(k) = tau``,
  for an L-layer vanilla net ``L * k``; Q'(1) = C'(1) = 1, Q(1) = 1. dks rejects solutions with
  ``input_scale * output_scale >= 2``.
* TAT (leaky ReLU): dks ``c_val_0_target`` is eta, ``output_scale = sqrt(2 / (1 + alpha^2))``;
  the maximal c value over subnetworks is ``subnet_max_func(0, C_lrelu)``, here written out
  for a vanilla net (L compositions) and a rescaled ResNet (L blocks c -> w^2 c + (1 - w^2) C(c)).
* C maps: both at q = 1 on the input, normalised by Q(1) of the output.

When dks and meanfield land on different roots of the same equations (several exist), both
parameter sets are checked against both packages' conditions.
"""
import math
import warnings

import numpy as np

import dks.base.activation_transform as AT
from dks.base.activation_getter import get_activation_function

import meanfield.shaping as sh

warnings.filterwarnings("ignore")
NAMES = {"tanh": "tanh", "softplus": "softplus", "sigmoid": "sigmoid", "erf": "erf", "gelu": "gelu_exact"}


def mf_name(name):
    return "sigmoid" if name == "sigmoid" else name


def mf_sigmoid():
    import sympy as sp

    from meanfield.symbols import x
    return 1 / (1 + sp.exp(-x))


def mf_act(name):
    return mf_sigmoid() if name == "sigmoid" else name


def dks_conditions(name, p):
    """Q(1), Q'(1), C(0), C'(1), C''(1) of the transformed activation, by dks's own code."""
    phi = AT._transform_activation(get_activation_function(NAMES[name]), {
        "input_scale": p[0], "input_shift": p[1], "output_shift": p[3], "output_scale": p[2]})
    q1 = AT._estimate_gaussian_mean(lambda x: phi(x) ** 2)
    return {"Q(1)": q1, "Q'(1)": AT._calc_q_slope_1(phi), "C(0)": AT._calc_c_map(phi, 0, 0.0, q1),
            "C'(1)": AT._calc_c_slope(phi, 1.0, q1), "C''(1)": AT._calc_c_curv(phi, 1.0, q1)}, phi


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def params_from_dks(d):
    return (d["input_scale"], d["input_shift"], d["output_scale"], d.get("output_shift", 0.0))


def smooth_table():
    print("## Smooth activations: DKS and TAT parameters (alpha, beta, gamma, delta)\n")
    print("| method | activation | L | target | meanfield (alpha, beta, gamma, delta) | dks | max rel diff "
          "| same root | conditions of dks's params in meanfield (max abs miss) | of meanfield's params in dks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for method, targets in (("DKS", (1.5, 4.0)), ("TAT", (0.3, 0.9))):
        for name in ("tanh", "softplus", "sigmoid", "erf", "gelu"):
            for L in (5, 40):
                for tgt in targets:
                    try:
                        if method == "DKS":
                            t = sh.dks_transform(mf_act(name), zeta=tgt, depth=L)
                            d = AT._get_activations_params([NAMES[name]], "DKS", dks_params={"c_slope_1_target": tgt},
                                                           max_slope_func=lambda s, L=L: s ** L)[NAMES[name]]
                            want = {"Q(1)": 1.0, "Q'(1)": 1.0, "C(0)": 0.0,
                                    "C'(1)": float(__import__("scipy.optimize").optimize.brentq(
                                        lambda s: s ** L - tgt, 1.0, tgt, xtol=1e-15))}
                        else:
                            t = sh.tat_transform(mf_act(name), tau=tgt, depth=L)
                            d = AT._get_activations_params([NAMES[name]], "TAT", tat_params={"c_curve_target": tgt},
                                                           max_curv_func=lambda k, L=L: L * k)[NAMES[name]]
                            want = {"Q(1)": 1.0, "Q'(1)": 1.0, "C'(1)": 1.0, "C''(1)": tgt / L}
                    except Exception as err:  # report, do not hide
                        print(f"| {method} | {name} | {L} | {tgt} | {type(err).__name__}: {str(err)[:80]} | | | | | |")
                        continue
                    pm = (t.alpha, t.beta, t.gamma, t.delta)
                    pd = params_from_dks(d)
                    same = abs(pm[1] - pd[1]) < 1e-3 and abs(pm[0] - pd[0]) < 1e-3
                    diff = max(rel(a, b) if abs(b) > 1e-8 else abs(a - b) for a, b in zip(pm, pd))
                    # dks's parameters judged by meanfield, meanfield's by dks
                    td = sh.TransformedActivation(mf_act(name) if name != "sigmoid" else mf_sigmoid(),
                                                  pd[0], pd[1], pd[2], pd[3])
                    got_mf = td.conditions()
                    miss_mf = max(abs(got_mf[k] - v) for k, v in want.items())
                    got_dks, _ = dks_conditions(name, pm)
                    miss_dks = max(abs(got_dks[k] - v) for k, v in want.items())
                    rows.append((method, name, L, tgt, diff, same, miss_mf, miss_dks))
                    print(f"| {method} | {name} | {L} | {tgt} | ({pm[0]:.10g}, {pm[1]:.10g}, {pm[2]:.10g}, {pm[3]:.6g}) "
                          f"| ({pd[0]:.10g}, {pd[1]:.10g}, {pd[2]:.10g}, {pd[3]:.6g}) | {diff:.1e} | {same} "
                          f"| {miss_mf:.1e} | {miss_dks:.1e} |")
    print()
    return rows


def lrelu_subnet_vanilla(L):
    def f(x, r):
        for _ in range(L):
            x = r(x)
        return x
    return f


def lrelu_subnet_resnet(L, w):
    def f(x, r):
        for _ in range(L):
            x = w * w * x + (1 - w * w) * r(x)
        return x
    return f


def trelu_table():
    print("## TAT for leaky ReLU (TReLU): the negative slope alpha\n")
    print("| network | L | eta | meanfield alpha | dks alpha | rel diff |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for L in (25, 100):
        for eta in (0.9, 0.6):
            for w in (0.0, 0.5):
                sub = lrelu_subnet_vanilla(L) if w == 0.0 else lrelu_subnet_resnet(L, w)
                net = "vanilla" if w == 0.0 else f"ResNet w={w}"
                try:
                    am = sh.trelu_negative_slope(L, eta=eta, shortcut_weight=w)
                except ValueError as err:
                    print(f"| {net} | {L} | {eta} | ValueError: {str(err)[:90]} | (dks: C_f(0) of ReLU "
                          f"{sub(0.0, lambda c: float(AT._leaky_relu_cmap(c, 0.0))):.6f}) | |")
                    continue
                try:
                    d = AT._get_activations_params(["leaky_relu"], "TAT", tat_params={"c_val_0_target": eta},
                                                   subnet_max_func=sub)["leaky_relu"]
                except Exception as err:
                    print(f"| {net} | {L} | {eta} | {am:.12g} | {type(err).__name__}: {err} | |")
                    continue
                ad = float(d["negative_slope"])
                e = rel(am, ad)
                worst = max(worst, e)
                gam = math.sqrt(2 / (1 + am * am))
                print(f"| {net} | {L} | {eta} | {am:.12g} | {ad:.12g} | {e:.1e} (output scale {gam:.10g} vs "
                      f"{float(d['output_scale']):.10g}) |")
    print(f"\nlargest: {worst:.1e} (dks bisects to 1e-8)\n")


def c_map_table():
    print("## Local and global C maps (q = 1)\n")
    print("| activation | quantity | c | meanfield | dks | rel diff |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    # leaky ReLU closed forms
    for a in (0.0, 0.23, 0.61):
        for c in (-0.8, 0.0, 0.45, 0.97):
            m = float(sh.trelu_c_map(c, a))
            m2 = float(sh.c_map(sh.normalized_leaky_relu(a).activation(), c))
            d = float(AT._leaky_relu_cmap(c, a))
            e = max(rel(m, d), rel(m2, d))
            worst = max(worst, e)
            print(f"| leaky_relu({a}) | C(c) (trelu_c_map / c_map) | {c} | {m:.15g} / {m2:.15g} | {d:.15g} | {e:.1e} |")
    # DKS-transformed tanh, TAT-transformed softplus: local maps by dblquad in dks, global by composing them
    for name, t in (("tanh DKS L=4 zeta=1.5", sh.dks_transform("tanh", zeta=1.5, depth=4)),
                    ("softplus TAT L=4 tau=0.6", sh.tat_transform("softplus", tau=0.6, depth=4))):
        base = "tanh" if name.startswith("tanh") else "softplus"
        _, phi = dks_conditions(base, (t.alpha, t.beta, t.gamma, t.delta))
        q1 = AT._estimate_gaussian_mean(lambda x: phi(x) ** 2)
        act = t.activation()
        for c in (-0.6, 0.3, 0.85):
            for order in (0, 1):
                m = float(sh.c_map_derivative(act, c, order=order))
                d = AT._calc_c_map(phi, order, c, q1)
                e = rel(m, d)
                worst = max(worst, e)
                print(f"| {name} | local C{'′' * order}(c) | {c} | {m:.13g} | {d:.13g} | {e:.1e} |")
        for c in (-0.6, 0.3):
            m = float(sh.global_c_map(sh.vanilla(4), act, c))
            d = c
            for _ in range(4):
                d = AT._calc_c_map(phi, 0, d, q1)
            e = rel(m, d)
            worst = max(worst, e)
            print(f"| {name} | global C_f(c), vanilla L=4 | {c} | {m:.13g} | {d:.13g} | {e:.1e} |")
    print(f"\nlargest: {worst:.1e} (dks's dblquad has epsrel 1.5e-8)\n")


if __name__ == "__main__":
    import importlib.metadata as md
    print(f"dks {md.version('dks')}, autograd {md.version('autograd')}\n")
    trelu_table()
    c_map_table()
    smooth_table()
