"""Every notebook in notebooks/ runs top to bottom, once, and shows the right numbers.

Each notebook is executed at most once per session (the ``run_notebook``
fixture caches it) in a kernel of *this* interpreter: the fixture writes its
own ``python3`` kernelspec, pointing at ``sys.executable`` with this checkout
on PYTHONPATH, into a temporary directory and hands nbclient a kernel manager
that looks only there. A kernelspec installed by hand (or a user-level one
that points at another Python) can therefore neither be needed nor get in the
way, and the notebooks import the code under test rather than an installed
copy.

The assertions compare what the notebooks print or store against values
obtained another way: closed forms from the papers (sqrt(pi)/2,
0.32380701094355827, pi/(pi - 1), zeta = 1, c~ of Theorem 4.3 ...), Gaussian
moments of GELU integrated here with scipy.integrate.quad (not the package's
closed forms or quadrature), fits recomputed here from the stored Monte-Carlo
numbers, and the verification suite's pass rule applied here to the stored
measurements. The notebooks written with these tests in mind (phase_diagrams,
critical_exponents, monte_carlo_verification) collect their key numbers in a
dict ``summary``, which a cell appended by the test prints as JSON; the others
are checked through their printed output.
"""
import gc
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 300           # seconds per cell; the slowest cell takes ~15 s on a loaded 2-core machine
SUMMARY_TAG = "__NOTEBOOK_SUMMARY__"
# every notebook in notebooks/ must be listed here (and tested below)
TESTED = {"critical_lines", "phase_diagrams", "critical_exponents", "monte_carlo_verification",
          "kernel_shaping", "autoinit", "your_own_architecture", "gram_regression", "cnn_phase_diagram"}
WITH_SUMMARY = {"phase_diagrams", "critical_exponents", "monte_carlo_verification", "your_own_architecture",
                "gram_regression", "cnn_phase_diagram"}

try:
    import torch  # noqa: F401
except ImportError:          # pragma: no cover - CI installs torch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs the verify extra (torch)")


# ---------------------------------------------------------------------------
# Running notebooks.
# ---------------------------------------------------------------------------
def _kernel_spec_manager(directory):
    """A KernelSpecManager that knows one kernel, 'python3' = this interpreter + this checkout."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    kernels = Path(directory) / "kernels"
    spec_dir = Path(write_kernel_spec(kernels / "python3"))
    spec = json.loads((spec_dir / "kernel.json").read_text())
    spec["argv"][0] = sys.executable
    pythonpath = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    spec["env"] = {**spec.get("env", {}), "PYTHONPATH": pythonpath}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(kernels)])


def _execute(name, ksm):
    """Execute notebooks/<name>.ipynb; return (notebook, stream text, summary dict or None)."""
    from jupyter_client.manager import KernelManager

    path = NOTEBOOKS / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    if name in WITH_SUMMARY:
        nb.cells.append(nbformat.v4.new_code_cell(
            f"import json as _json\nprint({SUMMARY_TAG!r} + _json.dumps(summary))"))
    km = KernelManager(kernel_name="python3", kernel_spec_manager=ksm)
    try:
        nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        # nbclient does not shut down a kernel manager it was handed (it does not own it): stop the
        # kernel here, which also deletes its connection file (/tmp/tmp*.json otherwise stays behind)
        try:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
            km.cleanup_resources()
        except Exception:  # pragma: no cover - best effort; the test result stands
            pass
        # jupyter_client leaves zmq sockets for the garbage collector; collect
        # them here, where their ResourceWarning is harmless, rather than in
        # whichever later test happens to trigger a collection (tests that turn
        # warnings into errors would then fail for no reason of their own)
        del km
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
    text = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                text.append(out.text)
            elif out.output_type == "execute_result":
                text.append(out.data.get("text/plain", ""))
            elif out.output_type == "error":       # (nbclient raises first; kept for allow_errors runs)
                raise AssertionError(f"{name}: {out.ename}: {out.evalue}")
    text = "\n".join(text)
    summary = None
    if name in WITH_SUMMARY:
        line = [ln for ln in text.splitlines() if ln.startswith(SUMMARY_TAG)]
        assert line, f"{name}: the notebook defines no `summary`"
        summary = json.loads(line[-1][len(SUMMARY_TAG):])
    return nb, text, summary


@pytest.fixture(scope="session")
def run_notebook(tmp_path_factory):
    """run_notebook(name) executes notebooks/<name>.ipynb once per session and caches the result.

    The kernels' connection files go to a temporary runtime directory (not the
    user's ~/.local/share/jupyter/runtime), so a test run leaves none behind.
    """
    home = tmp_path_factory.mktemp("jupyter")
    ksm = _kernel_spec_manager(home)
    saved = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(home / "runtime")
    done = {}

    def run(name):
        if name not in done:
            done[name] = _execute(name, ksm)
        return done[name]

    try:
        yield run
    finally:
        if saved is None:
            os.environ.pop("JUPYTER_RUNTIME_DIR", None)
        else:
            os.environ["JUPYTER_RUNTIME_DIR"] = saved


def _number(pattern, text):
    m = re.search(pattern, text)
    assert m, f"output line matching {pattern!r} not found"
    return float(m.group(1))


# ---------------------------------------------------------------------------
# Independent references: Gaussian moments by adaptive quadrature (scipy),
# sharing nothing with meanfield's closed forms or its exp-sinh rule.
# ---------------------------------------------------------------------------
def _gauss(f, K=1.0):
    from scipy.integrate import quad

    s = math.sqrt(K)
    val, err = quad(lambda z: f(s * z) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi), -40, 40,
                    points=[0.0], epsabs=1e-14, epsrel=1e-13, limit=200)
    return val


def _Phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _gelu(x):
    return x * _Phi(x)


def _dgelu(x):
    return _Phi(x) + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _gelu_moments(K=1.0):
    """E[phi^2], E[phi'^2], E[phi] for GELU at variance K."""
    return (_gauss(lambda h: _gelu(h) ** 2, K), _gauss(lambda h: _dgelu(h) ** 2, K), _gauss(_gelu, K))


ERF_RAY = math.sqrt(2 / math.pi * (2 / math.sqrt(5) - math.asin(2 / 3)))     # PJ eqs. 135, 149


# ---------------------------------------------------------------------------
# Every notebook is tested.
# ---------------------------------------------------------------------------
def test_every_notebook_is_tested():
    """A notebook added to notebooks/ must get a test here; a listed one (autoinit too) must exist."""
    present = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert present == TESTED, (f"untested notebooks: {sorted(present - TESTED)}; "
                               f"missing notebooks: {sorted(TESTED - present)}")


# ---------------------------------------------------------------------------
# critical_lines.ipynb (moved from tests/test_solvers_notebook.py)
# ---------------------------------------------------------------------------
@pytest.mark.slow  # executes a whole notebook
def test_critical_lines_notebook(run_notebook):
    _, out, _ = run_notebook("critical_lines")
    err = _number(r"max relative difference from eq. 126: (\S+)", out)
    assert err < 1e-10
    assert "no line below sqrt(pi/4): True" in out
    assert "chi_K at K* = 0, sigma_w^2 = pi/4: 1" in out
    assert "'plain': [(0.8862269255, 0.0)]" in out                   # sqrt(pi)/2 = 0.88622692545
    assert "'residual, mu = 0.5': [(0.767495031, 0.0)]" in out      # sqrt(pi (1 - mu^2) / 4)
    assert "ln_pre slope sigma_b/sigma_w: 0.32380" in out
    assert "ln_pre, mu = 1: True" in out
    assert "(sigma_w, sigma_b) = (1.4082110131, 0.4158393810)  K* = 3.5615528128" in out
    assert "(sigma_w, sigma_b) = (2.0000000000, 0.0000000000)  K* = 0.0000000000" in out
    assert "phases on the grid" in out


# ---------------------------------------------------------------------------
# phase_diagrams.ipynb
# ---------------------------------------------------------------------------
@pytest.mark.slow  # executes a whole notebook
def test_phase_diagrams_notebook(run_notebook):
    _, out, s = run_notebook("phase_diagrams")
    e2, ed2, em = _gelu_moments(1.0)
    # critical rays: pre-LN sigma_b/sigma_w = sqrt(E[phi'^2] - E[phi^2]) at K = 1
    assert s["ln_pre_slope"]["erf"] == pytest.approx(0.32380701094355827, rel=1e-9)
    assert s["ln_pre_slope"]["erf"] == pytest.approx(ERF_RAY, rel=1e-9)
    assert s["ln_pre_slope"]["gelu"] == pytest.approx(math.sqrt(ed2 - e2), rel=1e-7)
    assert s["ln_pre_slope"]["relu"] == pytest.approx(0.0, abs=1e-12)
    # post-LN ReLU: chi_J* = pi/(pi-1) sigma_w^2/(sigma_w^2 + sigma_b^2) -> sigma_b = sigma_w / sqrt(pi - 1)
    assert s["ln_post_slope_relu"] == pytest.approx(1 / math.sqrt(math.pi - 1), rel=1e-8)
    # BatchNorm without skip: chi_J* = E[phi'^2]/Var[phi] everywhere
    for act, ref in (("relu", math.pi / (math.pi - 1)),
                     ("erf", 2 / (math.sqrt(5) * math.asin(2 / 3))),
                     ("gelu", ed2 / (e2 - em ** 2))):
        lo, hi = s["bn_chi_J"][act]
        assert lo == pytest.approx(ref, rel=1e-9) and hi == pytest.approx(ref, rel=1e-9), act
    mu = 0.5
    assert s["resnet_bn_eq26"] == pytest.approx(math.pi ** 2 * (1 - mu ** 2) / (math.pi - 1) ** 2 + mu ** 2, rel=1e-9)
    # ReLU: vertical lines sigma_w = sqrt(2 (1 - mu^2)) for every sigma_b (PJ eq. 99)
    for key, ref in (("plain", math.sqrt(2)), ("residual, mu = 0.5", math.sqrt(2 * (1 - mu ** 2)))):
        assert s["relu_vertical_line"][key] == pytest.approx([ref, ref], rel=1e-10), key
    # erf critical points (sqrt(pi (1 - mu^2)/4), 0), PJ eqs. 127, 143
    for key, m_ in (("plain", 0.0), ("residual, mu = 0.5", mu)):
        (point,) = s["erf_critical_point"][key]
        assert point == pytest.approx([math.sqrt(math.pi * (1 - m_ ** 2)) / 2, 0.0], abs=1e-9), key
    # everywhere critical exactly when mu = 1 (pre-LN and BatchNorm, every activation)
    ev = s["everywhere_critical"]
    assert len(ev) == 12
    for key, flags in ev.items():
        expected = key.endswith("mu=1.0")
        assert all(v is expected for v in flags.values()), (key, flags)
    # the cut through the pre-LN ray: PJ eq. 148 at every point, xi ~ 1/distance
    cut = s["cut"]
    assert cut["sigma_b_star"] == pytest.approx(ERF_RAY * cut["sigma_w"], rel=1e-9)
    sb = np.array(cut["sigma_b"])
    far = np.abs(sb - cut["sigma_b_star"]) > 1e-3
    w2 = cut["sigma_w"] ** 2
    for mu_s, xi in cut["xi"].items():
        m = float(mu_s)
        chi = 4 * w2 * (1 - m * m) / (math.sqrt(5) * (2 * w2 * math.asin(2 / 3) + math.pi * sb ** 2)) + m * m
        assert np.allclose(np.array(xi)[far], 1 / np.abs(np.log(chi[far])), rtol=1e-8), mu_s
    assert len(cut["slopes"]) == 8
    for key, v in cut["slopes"].items():
        assert v == pytest.approx(-1.0, abs=2e-3), key
    # the plain cut crosses the line of PJ eq. 126 at the solver's sigma_w*
    w = cut["plain_sigma_w_star"]
    sb126 = math.sqrt((16 * w ** 4 - math.pi ** 2) / (4 * math.pi ** 2)
                      - 2 * w ** 2 / math.pi * math.asin((16 * w ** 4 - math.pi ** 2) / (16 * w ** 4 + math.pi ** 2)))
    assert sb126 == pytest.approx(cut["plain_sigma_b"], rel=1e-8)
    assert "chaotic 9639" in out        # bn: the whole grid is chaotic


# ---------------------------------------------------------------------------
# critical_exponents.ipynb
# ---------------------------------------------------------------------------
@pytest.mark.slow  # executes a whole notebook
@pytest.mark.torch
@needs_torch
def test_critical_exponents_notebook(run_notebook):
    _, out, s = run_notebook("critical_exponents")
    # erf at (sqrt(pi)/2, 0): c_2 = d_1 = 2, zeta_K = zeta = 1 (PJ eqs. 128-133)
    e = s["erf"]
    assert (e["c2"], e["d1"], e["zeta_K"], e["zeta"]) == (2.0, 2.0, 1.0, 1.0)
    assert e["zeta_K_numeric"] == pytest.approx(1.0, abs=1e-6)
    assert e["zeta_numeric"] == pytest.approx(1.0, abs=1e-6)
    # ReLU at (sqrt 2, 0): the identity map, zeta_K = zeta = 0 (PJ eq. 103)
    r = s["relu"]
    assert r["a"] == [0.0, 1.0, 0.0, 0.0] and r["b"] == [1.0, 0.0, 0.0, 0.0]
    assert r["zeta"] == 0.0 and abs(r["zeta_numeric"]) < 1e-6
    # pre-LN, mu = 1 at (1, 0.5): zeta = -E[phi'^2]/(E[phi^2] + sigma_b^2/sigma_w^2)
    e2, ed2, _ = _gelu_moments(1.0)
    refs = {"relu": -0.5 / (0.5 + 0.25),
            "erf": -(4 / (math.pi * math.sqrt(5))) / (2 / math.pi * math.asin(2 / 3) + 0.25),
            "gelu": -ed2 / (e2 + 0.25)}
    for act, ref in refs.items():
        z = s["ln_pre_mu1"][act]
        assert z["regime"] == "power-law growth"
        assert z["zeta_series"] == pytest.approx(ref, rel=1e-9), act
        assert z["zeta"] == pytest.approx(ref, rel=1e-9), act
        assert z["zeta_numeric"] == pytest.approx(ref, rel=1e-6), act
        assert z["zeta_K"] == -1.0
    # erf, mu = 1: Theorem 4.3, c~ = 2 sigma_w^2 / (pi sqrt(sigma_w^2 + sigma_b^2)), lambda = 1/(4 c~^2)
    c_t = 2 / (math.pi * math.sqrt(1.25))
    st = s["erf_mu1"]
    assert st["regime"] == "stretched exponential"
    assert st["c_tilde_series"] == pytest.approx(c_t, rel=1e-12)
    assert st["c_tilde"] == pytest.approx(c_t, rel=1e-9)
    assert st["c_tilde_numeric"] == pytest.approx(c_t, rel=1e-4)
    assert st["lambda_"] == pytest.approx(1 / (4 * c_t ** 2), rel=1e-9)
    # GELU: K* = (3 + sqrt 17)/2, the point from chi_J(K*) = 1 and F(K*) = K* with moments at K* by quad
    g = s["gelu"]
    Ks = (3 + math.sqrt(17)) / 2
    m2, md2, _ = _gelu_moments(Ks)
    assert g["K_star"] == pytest.approx(Ks, rel=1e-9)
    assert g["sigma_w"] == pytest.approx(1 / math.sqrt(md2), rel=1e-8)
    assert g["sigma_b"] == pytest.approx(math.sqrt(Ks - m2 / md2), rel=1e-7)
    # errata: c_2 = +1.436264e-4 (dK^{l+1} = dK - c_2 dK^2), d_1 = -9.33354e-3, zeta = -64.985 (not +66.668)
    assert g["c2"] == pytest.approx(1.436264e-4, rel=1e-5)
    assert g["d1"] == pytest.approx(-9.33354e-3, rel=1e-5)
    assert g["zeta_series"] == pytest.approx(-64.985, abs=1e-3)
    assert g["zeta"] == pytest.approx(-64.985, abs=1e-3)
    assert g["zeta_numeric"] == pytest.approx(-64.985, abs=0.05)
    # which input reaches which fixed point: unit-norm K^1 = sigma_w^2 + sigma_b^2 < K* flows to the stable K = 3.035
    assert g["sigma_w"] ** 2 + g["sigma_b"] ** 2 < Ks
    assert g["unit_input_reaches"] == pytest.approx(3.0350, abs=1e-3)
    (k_lo, stab_lo, chi_lo), (k_hi, stab_hi, chi_hi) = g["fixed_points"]
    assert stab_lo == "stable" and k_lo == pytest.approx(3.0350, abs=1e-3) and chi_lo == pytest.approx(0.99398, abs=1e-5)
    assert stab_hi.startswith("half-stable from above") and k_hi == pytest.approx(Ks, rel=1e-9)
    # Monte Carlo: J^{1,l} slopes vs the theory profile (suite rule: 4 SE + 2 l_max/N), and the three
    # cases told apart: each measured slope is nearest its own -zeta of {-1, 0, 2/3}
    mc = s["mc"]
    assert len(mc) == 3
    targets = [1.0, 0.0, -2 / 3]
    for (name, c), zeta in zip(mc.items(), targets):
        assert c["zeta"] == pytest.approx(zeta, abs=1e-12), name
        assert abs(c["slope_mc"] - c["slope_theory"]) <= 4 * c["slope_se"] + c["allowance"], name
        assert c["allowance"] == pytest.approx(2 * 30 / 256)
        assert abs(c["slope_theory"] + zeta) < 0.05, name                # finite-depth correction only
        nearest = min(targets, key=lambda t: abs(c["slope_mc"] + t))
        assert nearest == zeta, (name, c["slope_mc"])
        J, Jse, Jth = (np.array(c[k]) for k in ("J", "J_se", "J_theory"))
        layers = np.arange(1, len(J) + 1)
        assert np.all(np.abs(J - Jth) <= 4 * Jse + 2 * layers / 256 * np.abs(Jth)), name


# ---------------------------------------------------------------------------
# monte_carlo_verification.ipynb
# ---------------------------------------------------------------------------
@pytest.mark.slow  # executes a whole notebook
@pytest.mark.torch
@needs_torch
def test_monte_carlo_verification_notebook(run_notebook):
    _, out, s = run_notebook("monte_carlo_verification")
    sw, sb, mu, width = 1.2, 0.3, 0.5, 256
    e2, ed2, _ = _gelu_moments(1.0)
    K_star = (sw ** 2 * e2 + sb ** 2) / (1 - mu ** 2)                   # PJ eq. 64
    chi_star = sw ** 2 * ed2 / K_star + mu ** 2                          # PJ eq. 69
    th = s["theory"]
    assert th["K_star"] == pytest.approx(K_star, rel=1e-10)
    assert th["chi_J_star"] == pytest.approx(chi_star, rel=1e-10)
    assert th["K"][0] == pytest.approx(sw ** 2 + sb ** 2, rel=1e-12)
    assert th["K"][-1] == pytest.approx(K_star, rel=1e-8)
    # the suite's pass rule, applied here to the stored measurements: |MC - th| <= 4 SE + 2 (l/N) |th|
    for q in ("K", "chi_J", "J"):
        m, se, t, ls = (np.array(s[q][k]) for k in ("mc", "se", "theory", "layers"))
        assert len(m) >= 19 and np.all(se > 0), q
        assert np.all(np.abs(m - t) <= 4 * se + 2 * ls / width * np.abs(t)), q
        assert np.mean(np.abs(m - t) <= 4 * se) >= 0.9, q    # at N = 256 the noise, not the bias, dominates
        assert s[q]["all_within_rule"], q
    # the stored theory is the recursion: chi_J^l = sigma_w^2 E[phi'^2]/K^l + mu^2
    assert np.allclose(s["chi_J"]["theory"], sw ** 2 * ed2 / np.array(th["K"]) + mu ** 2, rtol=1e-9)
    # width scan: refit a + b/N here; the intercept agrees with the theory within 4 of its SE, the
    # 1/N term is resolved (the deviation is a finite-width effect that shrinks with N)
    ws = s["width_scan"]
    N, y, se = (np.array(ws[k], float) for k in ("widths", "mc", "se"))
    assert list(N) == [16, 32, 64, 128, 256]
    A = np.stack([np.ones_like(N), 1 / N], 1)
    cov = np.linalg.inv(A.T @ (A / se[:, None] ** 2))
    a, b = cov @ (A.T @ (y / se ** 2))
    a_se, b_se = np.sqrt(np.diag(cov))
    assert (a, b) == pytest.approx((ws["intercept"], ws["slope"]), rel=1e-9)
    assert ws["theory"] == pytest.approx(chi_star, abs=1e-3)
    assert abs(a - ws["theory"]) <= 4 * a_se
    assert b > 3 * b_se
    assert y[0] - ws["theory"] > 3 * se[0]               # visible at N = 16 ...
    assert abs(y[-1] - ws["theory"]) <= 4 * se[-1]       # ... and within the noise at N = 256
    # Monte-Carlo phase diagram: every point within the rule; the critical ray
    pd = s["phase_diagram"]
    m, se, t = (np.array(pd[k]) for k in ("chi_J", "chi_J_se", "theory"))
    assert m.shape == (6, 6)
    assert np.all(np.abs(m - t) <= 4 * se + 2 * pd["layer"] / pd["width"] * np.abs(t))
    clear = np.abs(t - 1) > 3 * se
    assert clear.sum() >= 10 and np.all(np.sign(m[clear] - 1) == np.sign(t[clear] - 1))
    assert pd["ray"] == pytest.approx(math.sqrt(ed2 - e2), rel=1e-7)


# ---------------------------------------------------------------------------
# kernel_shaping.ipynb (moved from tests/test_shaping.py)
# ---------------------------------------------------------------------------
@pytest.mark.slow  # executes a whole notebook
@pytest.mark.torch
@needs_torch
def test_kernel_shaping_notebook(run_notebook):
    _, text, _ = run_notebook("kernel_shaping")
    assert "all Monte-Carlo points within error bars: True" in text
    # EOC ReLU: normalised ReLU C map at c = 0 is 1/pi (arc-cosine kernel of order 1)
    assert _number(r"EOC ReLU\s+1\.41421.*\n\s+Q\(1\) = 1, Q'\(1\) = 1, C\(0\) = (\S+),", text) == \
        pytest.approx(1 / math.pi, abs=1e-5)
    # TReLU is built so that C_f(0) = eta = 0.9; TAT-softplus so that C''(1) = tau / L = 0.3 / 50
    assert _number(r"TReLU \(eta=0\.9\)\s+C_f\(-1\) = \S+\s+C_f\(0\) = (\S+)", text) == pytest.approx(0.9, abs=1e-4)
    assert _number(r"Q\(1\) = 1, Q'\(1\) = 1, C\(0\) = \S+, C'\(1\) = 1, C''\(1\) = (0\.\d+)", text) == \
        pytest.approx(0.3 / 50, rel=1e-3)
    # TAT Proposition 3: the L = 500 TReLU map is close to its deep limit
    assert _number(r"max \|C_f - psi\| at L = 500: (\S+)", text) < 1e-3


# ---------------------------------------------------------------------------
# autoinit.ipynb (checked through its printed output)
# ---------------------------------------------------------------------------
@pytest.mark.slow  # executes a whole notebook
@pytest.mark.torch
@needs_torch
def test_autoinit_notebook(run_notebook):
    _, text, _ = run_notebook("autoinit")

    def j_range(label, after=0):
        m = re.compile(re.escape(label) + r"\s+J\^\(l,l\+1\) in \[(\S+), (\S+)\]").search(text, after)
        assert m, f"no J range printed for {label!r}"
        return float(m.group(1)), float(m.group(2)), m.end()

    # ReLU MLP at sigma_w = 2.5: chi_J = sigma_w^2 / 2 = 3.125 per layer before tuning, 1 after
    lo, hi, pos = j_range("start, sigma_w = 2.5")
    assert lo < 2.5 ** 2 / 2 < hi and lo > 2.5
    lo, hi, pos = j_range("AutoInit", pos)
    assert 0.9 < lo <= hi < 1.1
    lo, hi, pos = j_range("Kaiming", pos)
    assert lo < 1.0 < hi
    # the tuned weights land on Kaiming, a_W sigma_w = sqrt 2 (the ReLU critical point)
    assert _number(r"tuned a_W \* sigma_w / sqrt\(2\): mean (\S+)", text) == pytest.approx(1.0, abs=0.05)
    # eq. 18's bound at J = 1 is 1 / sigma_w^2 = 1/4 for sigma_w = 2
    assert _number(r"eta_t at J = 1 \(eq\. 18\): (\S+)", text) == pytest.approx(0.25, abs=1e-4)
    for rms in re.findall(r"rms relative difference (\S+)", text):
        assert float(rms) < 0.05
    # ResMLP: Kaiming far from critical, AutoInit close to 1, and the saved scales move a fresh instance there
    lo, hi, _ = j_range("Kaiming", text.index("ResMLP") if "ResMLP" in text else 0)
    assert lo > 2
    m = re.search(r"fresh instance \+ saved scales: J\^\(l,l\+1\) = \[([^\]]+)\]", text)
    assert m, "no J printed for the fresh instance"
    J = np.array(m.group(1).split(), dtype=float)
    assert J.size >= 4 and np.all(np.abs(J - 1) < 0.15)


# ---------------------------------------------------------------------------
# your_own_architecture.ipynb
# ---------------------------------------------------------------------------
def _tanh_moments(K=1.0):
    """E[tanh^2], E[tanh'^2] at variance K (scipy quadrature, not the package's)."""
    return (_gauss(lambda h: math.tanh(h) ** 2, K), _gauss(lambda h: (1 - math.tanh(h) ** 2) ** 2, K))


@pytest.mark.slow
def test_your_own_architecture_notebook(run_notebook):
    _, out, s = run_notebook("your_own_architecture")
    assert s["tree"] == "residual(layer_norm(position='pre'), act('tanh'), dense(), mu=0.7) [depth=8]"
    assert s["depth"] == 8 and s["same_recursion"] is True
    # critical line of pre-LN residual tanh, by hand: LN makes the branch see N(0, 1), so
    # K* = (sw^2 E[tanh^2] + sb^2) / (1 - mu^2) and chi_J* = mu^2 + sw^2 E[tanh'^2] / K* = 1
    # give sb^2 = sw^2 (E[tanh'^2] - E[tanh^2]), K* = sw^2 E[tanh'^2] / (1 - mu^2)
    q, d = _tanh_moments(1.0)
    sw, mu = s["sigma_w"], 0.7
    assert abs(s["sigma_b"] - sw * math.sqrt(d - q)) < 1e-9
    assert abs(s["K_star"] - sw**2 * d / (1 - mu**2)) < 1e-8
    # Monte Carlo on the user's own module: the suite's rule, applied here to the stored numbers
    width = s["width"]
    for m, se, t in ((s["K_mc"], s["K_se"], s["K_theory"]), (s["J_mc"], s["J_se"], s["J_theory"])):
        m, se, t = map(np.asarray, (m, se, t))
        layers = np.arange(1, len(m) + 1)
        assert np.all(np.abs(m - t) <= 4 * se + 2 * layers / width * np.abs(t))
    assert "within the suite's rule: True" in out


@pytest.mark.slow
def test_gram_regression_notebook(run_notebook):
    """NNGP/NTK regression through the phases: critical keeps learning at depth 50, the others predict the mean."""
    from scipy.optimize import brentq

    _, out, s = run_notebook("gram_regression")
    i50 = s["depths"].index(50)
    for kind in ("nngp", "ntk"):
        e = {p: s["errors"][p][kind][i50] for p in ("ordered", "critical", "chaotic")}
        assert e["critical"] < 0.5 and min(e["ordered"], e["chaotic"]) > 0.9, e
    assert s["spread"]["critical"] > 1e-5 > max(s["spread"]["ordered"], s["spread"]["chaotic"])
    assert s["min_eig_ratio"] > -1e-10
    # the chaotic correlation: fixed points of Williams' erf kernel, solved here (K* then c*)
    sw, sb = s["sw"]["chaotic"], s["sb"]

    def q(k12, k):
        return sw**2 * 2 / math.pi * math.asin(2 * k12 / (1 + 2 * k)) + sb**2

    K = brentq(lambda k: q(k, k) - k, 1e-6, 100)
    c = brentq(lambda c: q(c * K, K) / K - c, 1e-9, 0.999)
    assert abs(s["c_chaotic"] - c) < 1e-10


@pytest.mark.slow
@needs_torch
def test_cnn_phase_diagram_notebook(run_notebook):
    """The LayerNorm ResNet's chi_J* against the closed form derived by hand (exact rationals + mpmath, in
    tests/references), the control exactly 1, the suite's rule re-applied here to the stored Monte Carlo and
    the notebook's theory, and the staged ResNet read from torch as resnet_v2's tree, ordered at mu = 0.5."""
    import references as R

    _, out, s = run_notebook("cnn_phase_diagram")
    for mu, v, c in zip(s["mus"], s["chi_star"]["same"], s["chi_star"]["circular"]):
        if mu < 1:
            assert abs(v / float(R.ln_resnet_chi_star((8, 8), 2, mu)) - 1) < 1e-8, mu
            assert abs(c - 1) < 1e-10, mu
    data = json.loads((ROOT / "docs" / "figures" / "ln_resnet_phase.json").read_text())
    for name, th in s["theory"].items():
        mc, se, th = (np.asarray(v) for v in (data["planes"][name]["chi_J"], data["planes"][name]["chi_J_se"], th))
        assert np.all(np.abs(mc - th) <= 4 * se + 2 * data["layer"] / data["width"] * np.abs(th)), name
    assert s["within_rule"] is True and s["same_tree"] is True
    assert len(s["staged_chi"]) == 12 and max(s["staged_chi"]) < 1
