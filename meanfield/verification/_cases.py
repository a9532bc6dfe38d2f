"""The case kinds of the verification suite: each runs Monte Carlo and the theory for one case
and compares them point by point (the pass rule of :mod:`.suite`); :func:`run_case` runs one
case and never raises. Used by :func:`.suite.run_suite` and, on a cluster, by
:func:`.distributed.run_cases`."""
from __future__ import annotations

import math
import time
import traceback

import numpy as np
import torch

from ..calculus import Architecture
from ._checkpoints import _jl, _sanitize
from ._theory import theory_profile
from .montecarlo import monte_carlo, phase_diagram, resolve_device

DEFAULT_Z = 4.0
DEFAULT_C = 2.0


def _arch(spec: dict):
    """The case's spec: Architecture keywords, or a Network's JSON form ({"tree": [...], "mu": ...})."""
    if "tree" in spec:
        from ..calculus import from_json

        return from_json(spec)
    spec = dict(spec)
    params = tuple(sorted((k, spec.pop(k)) for k in ("negative_slope", "a_plus", "a_minus") if k in spec))
    return Architecture(activation_params=params, **spec)


# ---------------------------------------------------------------------------
# Comparison helpers.
# ---------------------------------------------------------------------------
def _tol(case):
    t = case.get("tolerance", {})
    return float(t.get("z", DEFAULT_Z)), float(t.get("c", DEFAULT_C))


def _compare(mc, se, th, layers, width, z, c, batch=None, bn=False):
    """Per-point check; returns dict with arrays and the worst offender."""
    mc, se, th, layers = (np.asarray(a, float) for a in (mc, se, th, layers))
    allow = c * layers / width * np.abs(th)
    if bn and batch:
        allow = allow + c / batch * np.abs(th)
    tol = z * se + allow
    dev = np.abs(mc - th)
    valid = np.isfinite(mc) & np.isfinite(th)
    ok = (dev <= tol) | ~valid
    with np.errstate(divide="ignore", invalid="ignore"):
        zscore = np.where(se > 0, (mc - th) / se, np.inf * np.sign(mc - th))
        rel = np.where(th != 0, (mc - th) / np.abs(th), np.nan)
    bad = np.where(~ok)[0]
    worst = int(bad[np.argmax((dev - tol)[bad])]) if bad.size else (int(np.nanargmax(np.abs(rel))) if np.any(np.isfinite(rel)) else 0)
    return {"ok": ok, "tol": tol, "zscore": zscore, "rel": rel, "worst": worst, "n_bad": int(bad.size),
            "n": int(valid.sum())}


def _fmt(x, digits=4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "nan"
    return f"{x:.{digits}g}"


def _common_mc_kwargs(case, device, dtype):
    kw = dict(depth=int(case["depth"]), width=int(case["width"]), n_init=int(case["n_init"]),
              batch=int(case.get("batch", 1)), device=device, seed=int(case.get("seed", 0)), dtype=dtype)
    for k in ("tokens", "input_dim", "n_probes", "input_correlation", "input_norm", "estimator"):
        if k in case:
            kw[k] = case[k]
    return kw


def _theory_for(arch, sw, sb, depth, r):
    q = r.input_norm
    K0 = sw**2 * q + sb**2
    overlap = r.input_overlap if r.batch > 1 and np.isfinite(r.input_overlap) else 0.0
    K12_0 = arch.initial_pair_covariance(sw * np.sqrt(q), sb, overlap)
    return theory_profile(arch, sw, sb, depth, K0=K0, K12_0=K12_0)


def _params(case):
    """(sigma_w, sigma_b), optionally from meanfield.critical_point (``"critical_point": index``)."""
    if "critical_point" in case:
        import meanfield as mf

        pts = mf.critical_point(_arch(case["arch"])).points
        p = pts[int(case["critical_point"])]
        return float(p.sigma_w), float(p.sigma_b), p
    return float(case["sigma_w"]), float(case["sigma_b"]), None


# ---------------------------------------------------------------------------
# Case kinds.
# ---------------------------------------------------------------------------
def _kind_profile(case, device, dtype):
    arch = _arch(case["arch"])
    sw, sb, cp = _params(case)
    r = monte_carlo(arch, sw, sb, **_common_mc_kwargs(case, device, dtype))
    th = _theory_for(arch, sw, sb, r.depth, r)
    z, c = _tol(case)
    layers = np.arange(1, r.depth + 1)
    bn = arch.couples_batch
    quantities = case.get("compare", ["K", "chi_J", "J"] + (["K12"] if bn else []))
    out = {"sigma_w": sw, "sigma_b": sb, "theory_source": th["source"], "seconds_mc": r.seconds,
           "input_overlap": r.input_overlap, "quantities": {}}
    lines, ok_all = [], True
    first = int(case.get("compare_from", 1))
    for q in quantities:
        mc, se = getattr(r, q), getattr(r, q + "_se")
        t = th[q][: len(mc)]
        ll = layers[: len(mc)]
        cmp_ = _compare(mc, se, t, ll, r.width, z, c, r.batch, bn)
        mask = ll >= first
        if q == "chi_J":  # the bands were set on the blocks inside the network, l < depth
            mask &= ll < r.depth
        cmp_["ok"] = cmp_["ok"] | ~mask
        n_bad = int((~cmp_["ok"]).sum())
        ok_all &= n_bad == 0
        w = cmp_["worst"]
        lines.append(f"{q}: {n_bad}/{int(mask.sum())} points outside the band; largest deviation at l={ll[w]}: "
                     f"MC {_fmt(mc[w])} +- {_fmt(se[w], 2)} vs theory {_fmt(t[w])} "
                     f"({_fmt(100 * cmp_['rel'][w], 3)}%, allowance {_fmt(cmp_['tol'][w], 2)})")
        out["quantities"][q] = {"layers": _jl(ll), "mc": _jl(mc), "se": _jl(se), "theory": _jl(t),
                                "ok": [bool(v) for v in cmp_["ok"]], "n_bad": n_bad}
    if cp is not None:
        reach = th["K"][-1]
        out["critical_point"] = {"sigma_w": sw, "sigma_b": sb, "K_star": float(cp.K_star),
                                 "unit_input_reaches": float(cp.unit_input_reaches),
                                 "K1": float(th["K"][0]), "K_last_theory": float(reach),
                                 "K_last_mc": float(r.K[-1])}
        lines.append(f"critical point ({_fmt(sw, 6)}, {_fmt(sb, 6)}) has K* = {_fmt(cp.K_star)}; inputs start at "
                     f"K^1 = {_fmt(th['K'][0])} and reach K^{r.depth} = {_fmt(reach)} (theory) / "
                     f"{_fmt(r.K[-1])} (MC)")
    return ok_all, lines, out


def _fit_slope(x, y):
    good = np.isfinite(y) & np.isfinite(x)
    return float(np.polyfit(x[good], y[good], 1)[0])


def _kind_exponent(case, device, dtype):
    """Slope of log J^{1,l} against log l (or sqrt l), MC (bootstrap SE) vs the theory profile."""
    arch = _arch(case["arch"])
    sw, sb, _ = _params(case)
    r = monte_carlo(arch, sw, sb, **_common_mc_kwargs(case, device, dtype))
    th = _theory_for(arch, sw, sb, r.depth, r)
    z, c = _tol(case)
    l = np.arange(1, r.depth + 1, dtype=float)
    lmin, lmax = case.get("fit_range", [max(3, r.depth // 5), r.depth])
    sel = (l >= lmin) & (l <= lmax)
    axis = case.get("fit", "log")
    xf = np.log(l[sel]) if axis == "log" else np.sqrt(l[sel])
    samples = r.samples["J"][:, sel]
    slope_mc = _fit_slope(xf, np.log(samples.mean(0)))
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(int(case.get("bootstrap", 400))):
        idx = rng.integers(0, r.n_init, r.n_init)
        m = samples[idx].mean(0)
        if np.all(m > 0):
            boots.append(_fit_slope(xf, np.log(m)))
    se = float(np.std(boots, ddof=1)) if len(boots) > 2 else float("nan")
    slope_th = _fit_slope(xf, np.log(th["J"][sel]))
    allow = c * lmax / r.width * (1.0 if axis == "log" else 1.0 / math.sqrt(lmax))
    ok = abs(slope_mc - slope_th) <= z * se + allow
    asym = None
    try:
        import meanfield as mf

        ex = mf.exponents(arch, sigma_w=sw, sigma_b=sb)
        asym = {"zeta": float(ex.zeta), "regime": ex.regime, "c_tilde": float(ex.c_tilde),
                "lambda": float(ex.lambda_)}
    except Exception as err:  # pragma: no cover - informational only
        asym = {"error": repr(err)}
    name = "d log J / d log l" if axis == "log" else "d log J / d sqrt(l)"
    lines = [f"{name} over l in [{lmin}, {lmax}]: MC {_fmt(slope_mc)} +- {_fmt(se, 2)} vs theory profile "
             f"{_fmt(slope_th)} (allowance {_fmt(allow, 2)})"]
    if axis == "log" and asym and "zeta" in asym:
        lines.append(f"asymptotic exponent from meanfield.exponents: zeta = {_fmt(asym['zeta'])} "
                     f"(slope -zeta = {_fmt(-asym['zeta'])}; {asym['regime']}); a finite-depth fit approaches it slowly")
    if axis == "sqrt" and asym and "c_tilde" in asym:
        lines.append(f"asymptotic: chi_J ~ 1 + c~/sqrt(l), c~ = {_fmt(asym['c_tilde'])}, so log J ~ 2 c~ sqrt(l) = "
                     f"{_fmt(2 * asym['c_tilde'])} sqrt(l) (Theorem 4.3: c~ = 2 sw^2/(pi sqrt(sw^2+sb^2)) = "
                     f"{_fmt(2 * sw**2 / (math.pi * math.sqrt(sw**2 + sb**2)))})")
    out = {"sigma_w": sw, "sigma_b": sb, "fit": axis, "fit_range": [lmin, lmax], "slope_mc": slope_mc,
           "slope_mc_se": se, "slope_theory": slope_th, "allowance": allow, "asymptotic": asym,
           "theory_source": th["source"],
           "quantities": {"J": {"layers": _jl(l), "mc": _jl(r.J), "se": _jl(r.J_se), "theory": _jl(th["J"])},
                          "K": {"layers": _jl(l), "mc": _jl(r.K), "se": _jl(r.K_se), "theory": _jl(th["K"])}}}
    return ok, lines, out


def _kind_phase_diagram(case, device, dtype):
    arch = _arch(case["arch"])
    sw = np.linspace(*case["sigma_w"]) if isinstance(case["sigma_w"], list) and len(case["sigma_w"]) == 3 \
        and isinstance(case["sigma_w"][2], int) else np.asarray(case["sigma_w"], float)
    sb = np.linspace(*case["sigma_b"]) if isinstance(case["sigma_b"], list) and len(case["sigma_b"]) == 3 \
        and isinstance(case["sigma_b"][2], int) else np.asarray(case["sigma_b"], float)
    kw = _common_mc_kwargs(case, device, dtype)
    kw.pop("estimator", None)
    kw.pop("input_norm", None)
    pd = phase_diagram(arch, sw, sb, **kw)
    z, c = _tol(case)
    L = pd.layer
    th = np.empty_like(pd.chi_J)
    src = None
    for i, a in enumerate(sw):
        for j, b in enumerate(sb):
            t = theory_profile(arch, a, b, L + 1)
            th[i, j] = t["chi_J"][L - 1]
            src = t["source"]
    cmp_ = _compare(pd.chi_J.ravel(), pd.chi_J_se.ravel(), th.ravel(), np.full(th.size, L), pd.width, z, c)
    ok = cmp_["n_bad"] == 0
    w = cmp_["worst"]
    i, j = np.unravel_index(w, th.shape)
    line = _critical_line(arch, sw)
    lines = [f"J^{{{L},{L + 1}}} on a {len(sw)} x {len(sb)} grid (depth {pd.depth}): {cmp_['n_bad']}/{th.size} "
             f"points outside the band; largest deviation at (sigma_w, sigma_b) = ({_fmt(sw[i], 3)}, "
             f"{_fmt(sb[j], 3)}): MC {_fmt(pd.chi_J[i, j])} +- {_fmt(pd.chi_J_se[i, j], 2)} vs theory "
             f"{_fmt(th[i, j])}", f"Monte-Carlo time {pd.seconds:.1f} s for {pd.n_init} x {th.size} networks"]
    if line.get("everywhere_critical"):
        lines.append("theory: critical everywhere (chi_J* = 1 on the whole plane)")
    out = {"sigma_w_axis": _jl(sw), "sigma_b_axis": _jl(sb), "layer": L, "mc": _jl(pd.chi_J), "se": _jl(pd.chi_J_se),
           "theory": _jl(th), "ok": [[bool(v) for v in row] for row in cmp_["ok"].reshape(th.shape)],
           "critical_line": line, "seconds_mc": pd.seconds, "theory_source": src}
    return ok, lines, out


def _critical_line(arch, sw):
    try:
        import meanfield as mf

        fine = np.linspace(float(np.min(sw)), float(np.max(sw)), 200)
        cl = mf.critical_line(arch, sigma_w=fine)
        return {"sigma_w": _jl(cl.sigma_w), "sigma_b": _jl(cl.sigma_b),
                "everywhere_critical": bool(getattr(cl, "everywhere_critical", False))}
    except Exception as err:
        return {"error": repr(err)}


def _kind_bn_batch(case, device, dtype):
    """J^{l,l+1} after the BatchNorm statistics settle, against the batch size."""
    arch = _arch(case["arch"])
    sw, sb = float(case["sigma_w"]), float(case["sigma_b"])
    z, c = _tol(case)
    first = int(case.get("average_from", 3))
    rows = []
    for B in case["batches"]:
        kw = _common_mc_kwargs({**case, "batch": B}, device, dtype)
        r = monte_carlo(arch, sw, sb, **kw)
        th = _theory_for(arch, sw, sb, r.depth, r)
        per = r.samples["chi_J"][:, first - 1:r.depth - 1]  # (n_init, layers first..depth-1)
        m = per.mean()
        se = per.mean(1).std(ddof=1) / math.sqrt(r.n_init)
        t = float(np.mean(th["chi_J"][first - 1:r.depth - 1]))
        rows.append({"batch": B, "mc": float(m), "se": float(se), "theory": t, "seconds": r.seconds})
    last = rows[-1]
    lmax = int(case["depth"]) - 1
    tol = z * last["se"] + c * (lmax / int(case["width"]) + 1.0 / last["batch"]) * abs(last["theory"])
    ok = abs(last["mc"] - last["theory"]) <= tol
    lines = [f"J^{{l,l+1}} averaged over l >= {first}: " + "; ".join(
        f"|B| = {r_['batch']}: {_fmt(r_['mc'])} +- {_fmt(r_['se'], 2)}" for r_ in rows)
        + f"; large-batch theory {_fmt(last['theory'])}",
        f"largest batch deviates by {_fmt(last['mc'] - last['theory'], 3)} (band {_fmt(tol, 3)})"]
    if "closed_form" in case:
        lines.append(f"closed form quoted by the paper ({case['closed_form']['source']}): "
                     f"{_fmt(eval_closed_form(case['closed_form']['expr'], arch))}")
    out = {"sigma_w": sw, "sigma_b": sb, "rows": rows, "average_from": first}
    return ok, lines, out


def eval_closed_form(expr: str, arch) -> float:
    """Evaluate a closed form written in python with pi and mu (e.g. 'pi/(pi-1)')."""
    return float(eval(expr, {"__builtins__": {}}, {"pi": math.pi, "mu": arch.mu or 0.0, "sqrt": math.sqrt}))


def _kind_hutchinson_vs_exact(case, device, dtype):
    arch = _arch(case["arch"])
    sw, sb = float(case["sigma_w"]), float(case["sigma_b"])
    kw = _common_mc_kwargs(case, device, dtype)
    kw.pop("estimator", None)
    ex = monte_carlo(arch, sw, sb, estimator="exact", **kw)
    hu = monte_carlo(arch, sw, sb, estimator="hutchinson", **kw)
    z, _ = _tol(case)
    lines, ok, data = [], True, {}
    for q in ("chi_J", "J"):
        d = hu.samples[q] - ex.samples[q]
        keep = ~np.isnan(d).any(0)
        if q == "chi_J":  # the blocks inside the network, l < depth, as the case was set up
            keep[hu.depth - 1:] = False
        d = d[:, keep]
        se = d.std(0, ddof=1) / math.sqrt(d.shape[0])
        zmax = float(np.max(np.abs(d.mean(0)) / np.where(se > 0, se, np.inf)))
        bad = int(np.sum(np.abs(d.mean(0)) > z * se + 1e-12))
        ok &= bad == 0
        var_ratio = float(np.mean(hu.samples[q][:, keep].var(0, ddof=1) / np.maximum(ex.samples[q][:, keep].var(0, ddof=1), 1e-300)))
        lines.append(f"{q}: paired Hutchinson - exact difference over the same networks: {bad} layers beyond "
                     f"{z:g} SE (largest |mean/SE| = {_fmt(zmax, 3)}); variance over inits, Hutchinson/exact = "
                     f"{_fmt(var_ratio, 3)}")
        data[q] = {"layers": _jl(np.arange(1, d.shape[1] + 1) + (0 if q == "chi_J" else 1)),
                   "exact": _jl(getattr(ex, q)[keep]), "exact_se": _jl(getattr(ex, q + "_se")[keep]),
                   "hutchinson": _jl(getattr(hu, q)[keep]), "hutchinson_se": _jl(getattr(hu, q + "_se")[keep])}
    return ok, lines, {"sigma_w": sw, "sigma_b": sb, "quantities": data, "n_probes": hu.n_probes}


def _kind_factorisation(case, device, dtype):
    arch = _arch(case["arch"])
    sw, sb = float(case["sigma_w"]), float(case["sigma_b"])
    r = monte_carlo(arch, sw, sb, **_common_mc_kwargs(case, device, dtype))
    z, c = _tol(case)
    # J^{1,l} = prod_{l' < l} J^{l',l'+1}: chi_J[l'-1] for l' = 1..depth-1
    prod = np.concatenate([[1.0], np.cumprod(r.chi_J[:-1])])
    rel_se = np.concatenate([[0.0], np.sqrt(np.cumsum((r.chi_J_se[:-1] / r.chi_J[:-1]) ** 2))])
    prod_se = prod * rel_se
    se = np.sqrt(r.J_se**2 + prod_se**2)
    layers = np.arange(1, r.depth + 1)
    cmp_ = _compare(r.J, se, prod, layers, r.width, z, c, r.batch, arch.couples_batch)
    w = cmp_["worst"]
    ok = cmp_["n_bad"] == 0
    lines = [f"J^{{1,l}} measured directly vs prod_l' J^{{l',l'+1}} measured block by block: {cmp_['n_bad']}/"
             f"{r.depth} layers outside the band; largest deviation at l={w + 1}: {_fmt(r.J[w])} vs {_fmt(prod[w])} "
             f"({_fmt(100 * cmp_['rel'][w], 3)}%)"]
    out = {"sigma_w": sw, "sigma_b": sb,
           "quantities": {"J": {"layers": _jl(layers), "mc": _jl(r.J), "se": _jl(r.J_se), "theory": _jl(prod),
                                "theory_se": _jl(prod_se)}}}
    return ok, lines, out


def _kind_width_scan(case, device, dtype):
    """J^{l,l+1} (averaged over l >= average_from) at several widths, extrapolated to 1/width -> 0.

    A weighted least-squares fit chi(N) = a + b / N; the intercept a +- SE is
    compared with the infinite-width theory (z SE, no allowance: the
    extrapolation removes the O(1/N) term). Shows whether a disagreement is a
    finite-width effect (it shrinks like 1/N) or a gap in the theory.
    """
    arch = _arch(case["arch"])
    sw, sb = float(case["sigma_w"]), float(case["sigma_b"])
    z, _ = _tol(case)
    first = int(case.get("average_from", 2))
    rows = []
    for N in case["widths"]:
        extra = {"tokens": N} if arch.has_tokens and "tokens" not in case else {}
        kw = _common_mc_kwargs({**case, "width": N, **extra}, device, dtype)
        r = monte_carlo(arch, sw, sb, **kw)
        th = _theory_for(arch, sw, sb, r.depth, r)
        per = r.samples["chi_J"][:, first - 1:r.depth - 1].mean(1)   # layers first..depth-1
        rows.append({"width": N, "mc": float(per.mean()), "se": float(per.std(ddof=1) / math.sqrt(r.n_init)),
                     "theory": float(np.mean(th["chi_J"][first - 1:r.depth - 1])), "seconds": r.seconds})
    x = np.array([1.0 / r_["width"] for r_ in rows])
    y = np.array([r_["mc"] for r_ in rows])
    w = 1.0 / np.array([r_["se"] for r_ in rows]) ** 2
    A = np.stack([np.ones_like(x), x], 1)
    cov = np.linalg.inv(A.T @ (A * w[:, None]))
    a, b = cov @ (A.T @ (w * y))
    a_se = math.sqrt(cov[0, 0])
    t = rows[-1]["theory"]
    ok = abs(a - t) <= z * a_se
    lines = [f"J^{{l,l+1}} averaged over l >= {first}: " + "; ".join(
        f"N = {r_['width']}: {_fmt(r_['mc'])} +- {_fmt(r_['se'], 2)}" for r_ in rows)
        + f"; theory {_fmt(t)}",
        f"extrapolated to infinite width (fit a + b/N): {_fmt(a)} +- {_fmt(a_se, 2)} vs theory {_fmt(t)} "
        f"({_fmt((a - t) / a_se if a_se > 0 else float('inf'), 3)} SE); slope b = {_fmt(b)}"]
    out = {"sigma_w": sw, "sigma_b": sb, "rows": rows, "intercept": a, "intercept_se": a_se, "slope": b,
           "theory": t, "average_from": first}
    return ok, lines, out


def _kind_torch_module(case, device, dtype):
    """Monte Carlo on a torch model read by from_torch (the model itself, not a rebuilt twin).

    ``"module": "package.module:factory"`` with ``"kwargs"``; the model is
    read with :func:`~meanfield.from_torch`, drawn ``n_init`` times with
    :func:`~meanfield.verification.initialise_`, and K^l, J^{1,l} at its
    block boundaries are compared with the theory of the tree it was read as.
    """
    import importlib

    from ..torch.from_torch import from_torch, monte_carlo_module

    mod_name, _, attr = case["module"].partition(":")
    factory = getattr(importlib.import_module(mod_name), attr)
    model = factory(**case.get("kwargs", {})).to(dtype)
    N0, B = int(case["input_dim"]), int(case.get("batch", 4))
    x = torch.randn(B, N0, generator=torch.Generator().manual_seed(int(case.get("seed", 0))), dtype=dtype)
    x = x * (N0 ** 0.5 / x.norm(dim=-1, keepdim=True))
    sw, sb = float(case["sigma_w"]), float(case["sigma_b"])
    net = from_torch(model, x)
    t0 = time.time()
    r = monte_carlo_module(model, x, sw, sb, n_init=int(case["n_init"]), seed=int(case.get("seed", 0)))
    L = len(r.K)
    th = theory_profile(net, sw, sb, L, K0=sw**2 * r.input_norm + sb**2)
    z, c = _tol(case)
    layers = np.arange(1, L + 1)
    out = {"sigma_w": sw, "sigma_b": sb, "tree": str(net), "theory_source": th["source"],
           "seconds_mc": time.time() - t0, "quantities": {}}
    lines, ok_all = [f"read by from_torch as {net} (depth {net.depth})"], True
    for q, mc, se in (("K", r.K, r.K_se), ("J", r.J, r.J_se)):
        t = th[q][:L]
        cmp_ = _compare(mc, se, t, layers, r.width, z, c)
        ok_all &= cmp_["n_bad"] == 0
        w = cmp_["worst"]
        lines.append(f"{q}: {cmp_['n_bad']}/{L} points outside the band; largest deviation at l={layers[w]}: "
                     f"MC {_fmt(mc[w])} +- {_fmt(se[w], 2)} vs theory {_fmt(t[w])}")
        out["quantities"][q] = {"layers": _jl(layers), "mc": _jl(mc), "se": _jl(se), "theory": _jl(t),
                                "ok": [bool(v) for v in cmp_["ok"]], "n_bad": cmp_["n_bad"]}
    return ok_all, lines, out


def _kind_gram(case, device, dtype):
    """NNGP / NTK Gram matrices (meanfield.kernels) against the empirical ones on the same inputs.

    Inputs: ``n_inputs`` rows of N(0, 1) in ``input_dim`` features, each row
    scaled by U(0.5, 2) (seeded), so the norms differ (or to |x|^2 = d with
    ``"equal_norms": true``). Token blocks (ResMLP, Mixer): ``n_inputs``
    images of ``tokens`` tokens, token t on its own input_dim // tokens
    coordinates, readout the mean over the tokens (:mod:`meanfield.gram.tokens`). Compared: every entry
    of the first ``rows`` rows' block (default all), NNGP over initialisations
    and NTK by torch.func (:func:`~meanfield.verification.gram.empirical_kernels`),
    each with the suite's rule at l = depth (and the 1/batch term with
    BatchNorm, whose batch is all ``n_inputs`` rows).
    """
    from ..gram import kernels
    from .gram import empirical_kernels

    arch = _arch(case["arch"])
    sw, sb = float(case["sigma_w"]), float(case["sigma_b"])
    depth, width, n = int(case["depth"]), int(case["width"]), int(case["n_inputs"])
    param = case.get("parameterization", "ntk")
    get = tuple(case.get("get", ("nngp", "ntk")))
    rng = np.random.default_rng(int(case.get("seed", 0)))
    d = int(case["input_dim"])
    if arch.has_tokens:
        # token blocks: images (n, T, d), token t in its own d // T coordinates (tokens orthogonal across
        # positions, the exact regime of meanfield.gram.tokens), each image scaled by U(0.5, 2)
        T = int(case["tokens"])
        k = d // T
        x = np.zeros((n, T, d))
        for t in range(T):
            x[:, t, t * k:(t + 1) * k] = rng.standard_normal((n, k)) * np.sqrt(d / k)
        x *= rng.uniform(0.5, 2.0, size=(n, 1, 1))
    else:
        x = rng.standard_normal((n, d))
        # equal_norms: |x|^2 = d (BatchNorm with ReLU needs it for the large-batch limit at depth, docs/gram.md)
        x *= np.sqrt(d) / np.linalg.norm(x, axis=1, keepdims=True) if case.get("equal_norms") else \
            rng.uniform(0.5, 2.0, size=(n, 1))
    rows = np.arange(int(case.get("rows", n)))
    th = kernels(arch, x, depth=depth, sigma_w=sw, sigma_b=sb, parameterization=param, get=get, width=width)
    t0 = time.time()
    e = empirical_kernels(arch, x, depth=depth, sigma_w=sw, sigma_b=sb, width=width, n_init=int(case["n_init"]),
                          parameterization=param, get=get, n_outputs=int(case.get("n_outputs", 2)),
                          seed=int(case.get("seed", 0)), device=device, dtype=dtype,
                          ntk_rows=rows if len(rows) < n else None)
    z, c = _tol(case)
    bn = arch.couples_batch
    iu = np.triu_indices(len(rows))
    out = {"sigma_w": sw, "sigma_b": sb, "seconds_mc": time.time() - t0, "rows": len(rows), "quantities": {}}
    lines, ok_all = [], True
    for q in get:
        mc, se = getattr(e, q), getattr(e, q + "_se")
        if q == "nngp":
            mc, se = mc[np.ix_(rows, rows)], se[np.ix_(rows, rows)]
        t = getattr(th, q)[np.ix_(rows, rows)]
        mc, se, t = mc[iu], se[iu], t[iu]
        cmp_ = _compare(mc, se, t, np.full(t.shape, depth), width, z, c, n, bn)
        ok_all &= cmp_["n_bad"] == 0
        w = cmp_["worst"]
        lines.append(f"{q}: {cmp_['n_bad']}/{t.size} entries outside the band; largest deviation at "
                     f"({iu[0][w]}, {iu[1][w]}): MC {_fmt(mc[w])} +- {_fmt(se[w], 2)} vs theory {_fmt(t[w])} "
                     f"({_fmt(100 * cmp_['rel'][w], 3)}%, allowance {_fmt(cmp_['tol'][w], 2)}); "
                     f"max |z| {_fmt(float(np.max(np.abs(cmp_['zscore']))), 3)}")
        out["quantities"][q] = {"i": _jl(iu[0]), "j": _jl(iu[1]), "mc": _jl(mc), "se": _jl(se), "theory": _jl(t),
                                "ok": [bool(v) for v in cmp_["ok"]], "n_bad": cmp_["n_bad"]}
    return ok_all, lines, out


KINDS = {
    "torch_module": _kind_torch_module,
    "width_scan": _kind_width_scan,
    "profile": _kind_profile,
    "exponent": _kind_exponent,
    "phase_diagram": _kind_phase_diagram,
    "bn_batch": _kind_bn_batch,
    "hutchinson_vs_exact": _kind_hutchinson_vs_exact,
    "factorisation": _kind_factorisation,
    "gram": _kind_gram,
}


def run_case(case: dict, device=None, dtype=torch.float64) -> dict:
    """Run one case; never raises (errors become status 'error')."""
    dev = resolve_device(device)
    t0 = time.perf_counter()
    kind = case.get("kind", "profile")
    res = {"id": case["id"], "title": case.get("title", case["id"]), "kind": kind, "case": case,
           "paper": case.get("paper", ""), "expected": case.get("expected", "pass")}
    try:
        if kind not in KINDS:
            raise ValueError(f"unknown case kind {kind!r}; known: {', '.join(KINDS)}")
        ok, lines, data = KINDS[kind](case, dev, dtype)
        lines = list(lines) + [f"Note: {n}" for n in case.get("notes", [])]
        expected_fail = res["expected"] == "fail"
        if ok:
            status = "xpass" if expected_fail else "pass"
        else:
            status = "xfail" if expected_fail else "fail"
        res.update(status=status, details=lines, data=data)
        if expected_fail:
            res["reason"] = case.get("reason", "")
    except Exception as err:
        res.update(status="error", details=[f"{type(err).__name__}: {err}"], data={},
                   traceback=traceback.format_exc())
    res["seconds"] = time.perf_counter() - t0
    return _sanitize(res)
