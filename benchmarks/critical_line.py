"""Benchmark: meanfield.critical_line for 10^4 values of sigma_w against a plain scipy solve.

Run as ``python benchmarks/critical_line.py`` (not part of pytest). For each
architecture it times, in one process,

* meanfield (numba): ``critical_line(arch, sigma_w=...)`` over 10^4 sigma_w after a
  warm-up call (best of 3);
* the straightforward scipy approach a researcher would write: Gaussian
  expectations with ``scipy.integrate.quad`` (``dblquad`` for the two-point
  BatchNorm kernel), the fixed point with ``scipy.optimize.brentq`` on a
  bracket grown from the input's K^1, and sigma_b with ``brentq`` on
  chi_J* - 1 over [0, 10]. It is timed on an evenly spaced subsample and
  its per-point time extrapolated to 10^4 points;

and, in fresh subprocesses, the first-call time (code generation + numba
compilation) with an empty cache and again with the cache the first run left.
The table is printed and written to benchmarks/README.md (section
"critical_line").
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import integrate, optimize, special

HERE = Path(__file__).resolve().parent
N = 10_000
N_SCIPY = int(os.environ.get("MF_BENCH_SCIPY_POINTS", "20"))
SIGMA_W = np.linspace(0.5, 3.0, N)

CASES = [
    ("GELU", dict(activation="gelu")),
    ("erf", dict(activation="erf")),
    ("GELU + ln_pre, mu = 0.5", dict(activation="gelu", norm="ln_pre", mu=0.5)),
    ("ReLU + large-batch BN", dict(activation="relu", norm="bn")),
]


# ---------------------------------------------------------------------------
# The scipy approach.
# ---------------------------------------------------------------------------
def _npdf(z):
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def gauss(f, K):
    """E[f(h)], h ~ N(0, K), by scipy.integrate.quad."""
    if K <= 0:
        return f(0.0)
    s = math.sqrt(K)
    return integrate.quad(lambda z: f(s * z) * _npdf(z), -np.inf, np.inf, limit=200)[0]


def gauss2_independent(f):
    """E[f(u) f(v)] for independent standard normals, by dblquad (the two-point kernel at K12 = 0)."""
    return integrate.dblquad(lambda v, u: f(u) * f(v) * _npdf(u) * _npdf(v), -12, 12, -12, 12)[0]


ACT = {
    "gelu": (lambda x: x * special.ndtr(x), lambda x: special.ndtr(x) + x * _npdf(x)),
    "erf": (special.erf, lambda x: 2 / math.sqrt(math.pi) * math.exp(-x * x)),
    "relu": (lambda x: max(x, 0.0), lambda x: 1.0 if x > 0 else 0.0),
}


def fixed_point(F, K0):
    """Root of F(K) - K that iteration from K0 heads to (bracket grown from K0), inf if none below 1e8."""
    g0 = F(K0) - K0
    if g0 == 0:
        return K0
    if g0 < 0:
        return optimize.brentq(lambda K: F(K) - K, 0.0, K0, xtol=1e-14, rtol=1e-15)
    hi = 2 * max(K0, 1.0)
    while F(hi) - hi > 0:
        hi *= 2
        if hi > 1e8:
            return math.inf
    return optimize.brentq(lambda K: F(K) - K, K0, hi, xtol=1e-14, rtol=1e-15)


def scipy_solver(kw):
    phi, dphi = ACT[kw["activation"]]
    norm = kw.get("norm", "none")
    mu2 = (kw.get("mu") or 0.0) ** 2

    def chi_star(sw, sb):
        W, T = sw * sw, sb * sb
        if norm == "none":
            K = fixed_point(lambda K: W * gauss(lambda x: phi(x) ** 2, K) + T + mu2 * K, W + T)
            if math.isinf(K):
                return W * 0.5 + mu2 if kw["activation"] == "gelu" else 1e300
            return W * gauss(lambda x: dphi(x) ** 2, K) + mu2
        if norm == "ln_pre":
            K = fixed_point(lambda K: W * gauss(lambda x: phi(x) ** 2, 1.0) + T + mu2 * K, W + T)
            return W * gauss(lambda x: dphi(x) ** 2, 1.0) / K + mu2
        # large-batch BatchNorm: BN makes (K, K12) -> (1, 0); iterate the pair map to its fixed point
        K, Q = W + T, T
        for _ in range(2):
            K = W * gauss(lambda x: phi(x) ** 2, 1.0) + T + mu2 * K
            Q = W * gauss2_independent(phi) + T + mu2 * Q
        return W * gauss(lambda x: dphi(x) ** 2, 1.0) / (K - Q) + mu2

    def critical_sb(sw):
        h = lambda sb: chi_star(sw, sb) - 1.0  # noqa: E731
        a, b = h(0.0), h(10.0)
        if not (np.isfinite(a) and np.isfinite(b)) or a * b > 0:
            return math.nan
        return optimize.brentq(h, 0.0, 10.0, xtol=1e-14, rtol=1e-15)

    return critical_sb


# ---------------------------------------------------------------------------
# First-call (compile) time, in fresh processes.
# ---------------------------------------------------------------------------
_FIRST_CALL = r"""
import json, sys, time
t0 = time.perf_counter()
import meanfield as mf
t_import = time.perf_counter() - t0
out = {"import": t_import}
for label, kw in json.loads(sys.argv[1]):
    t = time.perf_counter()
    mf.critical_line(sigma_w=[1.0, 1.5], **kw)
    out[label] = time.perf_counter() - t
print(json.dumps(out))
"""


def first_call_times():
    cases = json.dumps([[label, kw] for label, kw in CASES])
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MEANFIELD_CACHE_DIR=os.path.join(tmp, "mf"), NUMBA_CACHE_DIR=os.path.join(tmp, "nb"))
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
        runs = []
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", _FIRST_CALL, cases], env=env, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return runs  # [cold, warm]


# ---------------------------------------------------------------------------
def main():
    sys.path.insert(0, str(HERE.parent))
    import meanfield as mf

    print(f"critical_line benchmark: {N} sigma_w in [{SIGMA_W[0]}, {SIGMA_W[-1]}], scipy on {N_SCIPY} of them")
    cold, warm = first_call_times()
    rows = []
    for label, kw in CASES:
        mf.critical_line(sigma_w=SIGMA_W[:16], **kw)            # warm-up (compiled, cached)
        best = math.inf
        for _ in range(3):
            t = time.perf_counter()
            line = mf.critical_line(sigma_w=SIGMA_W, **kw)
            best = min(best, time.perf_counter() - t)
        idx = np.linspace(0, N - 1, N_SCIPY).round().astype(int)
        solve = scipy_solver(kw)
        t = time.perf_counter()
        ref = np.array([solve(SIGMA_W[i]) for i in idx])
        t_scipy = (time.perf_counter() - t) / N_SCIPY
        # the line reached from a unit-norm input (the sigma_w form also returns unreached,
        # unstable points flagged reached=False, which the scipy side does not look for)
        ours = np.where(line.reached, line.sigma_b, np.nan)[idx]
        both = np.isfinite(ours) & np.isfinite(ref)
        diff = float(np.max(np.abs(ours[both] - ref[both]))) if both.any() else math.nan
        nan_agree = int(np.sum(np.isnan(ours) == np.isnan(ref)))
        rows.append(dict(case=label, per_point_us=best / N * 1e6, total_s=best, scipy_per_point_ms=t_scipy * 1e3,
                         scipy_total_s=t_scipy * N, ratio=t_scipy * N / best, points=int(np.sum(line.reached)),
                         unreached=int(np.sum(np.isfinite(line.sigma_b) & ~line.reached)),
                         max_diff=diff, nan_agree=nan_agree, cold=cold[label], warm=warm[label]))
        r = rows[-1]
        print(f"{label:26s} meanfield {r['per_point_us']:8.2f} us/pt  scipy {r['scipy_per_point_ms']:8.2f} ms/pt "
              f"ratio {r['ratio']:9.0f}x  line at {r['points']} pts  |diff| {diff:.1e}  "
              f"first call {r['cold']:.2f} s cold / {r['warm']:.2f} s cached")
    write_readme(rows, cold, warm)


def write_readme(rows, cold, warm):
    import numba
    import scipy

    lines = [
        "## critical_line",
        "",
        f"`python benchmarks/critical_line.py` ({time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, numba {numba.__version__}, "
        f"scipy {scipy.__version__}; one thread; load average {os.getloadavg()[0]:.1f} at the end, "
        "so absolute times are indicative, ratios are measured in the same process).",
        "",
        f"`critical_line(arch, sigma_w=...)` for {N} values of sigma_w in [0.5, 3], after a warm-up call (best of 3),",
        "against the straightforward scipy approach (quad expectations, brentq for the fixed point and for sigma_b),",
        f"timed on {N_SCIPY} evenly spaced sigma_w and extrapolated per point to {N}.",
        "",
        "| architecture | meanfield per point | meanfield, 10^4 points | scipy per point | scipy, 10^4 points (extrapolated) "
        "| speed ratio | points with a line | max abs diff (sigma_b) | nan pattern agrees |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['per_point_us']:.2f} us | {r['total_s'] * 1e3:.1f} ms | "
                     f"{r['scipy_per_point_ms']:.1f} ms | {r['scipy_total_s']:.0f} s | {r['ratio']:,.0f}x | "
                     f"{r['points']} | {r['max_diff']:.1e} | {r['nan_agree']}/{N_SCIPY} |")
    lines += [
        "",
        "First call in a fresh process (code generation from the sympy recursion + numba compilation), "
        "with an empty cache and then with the cache the first process left "
        "(`MEANFIELD_CACHE_DIR`, `NUMBA_CACHE_DIR`); the solver kernels are compiled once for all "
        "architectures, so the first architecture of the cold run also pays for them:",
        "",
        "| | " + " | ".join(r["case"] for r in rows) + " |",
        "|---|" + "---|" * len(rows),
        "| no cache | " + " | ".join(f"{cold[r['case']]:.2f} s" for r in rows) + " |",
        "| cached | " + " | ".join(f"{warm[r['case']]:.2f} s" for r in rows) + " |",
        "",
        f"`import meanfield`: {cold['import']:.2f} s (numba is imported on first use).",
        "",
        "Notes: ReLU with large-batch BatchNorm has chi_J* = pi/(pi - 1) > 1 for every (sigma_w, sigma_b), so "
        "there is no line; both sides prove that at every point. For plain GELU the line reached from a "
        "unit-norm input exists only for sigma_w in about [1.3985, 1.4142] (the branch K* < (3 + sqrt 17)/2 of "
        "the parametric line is unstable), so both sides mostly answer NaN. The scipy side uses the same "
        "definitions (fixed point reached from K^1 = sigma_w^2 + sigma_b^2), but brentq over sigma_b only sees "
        "an odd number of crossings in [0, 10]. 'Points with a line' counts reached points; the sigma_w form "
        "also returns the unstable branch flagged reached=False (" + ", ".join(
            f"{r['case']}: {r['unreached']}" for r in rows) + " such points), which is not compared.",
        "",
    ]
    section = "\n".join(lines)
    path = HERE / "README.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEach script is run by hand (not by pytest).\n\n"
    start = text.find("## critical_line")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
