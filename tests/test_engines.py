"""The two engines of meanfield.numeric (issue 13: a first answer without compiling): the
generated expressions and the solver kernels run by numba, and the same sources run by CPython.
Both must give the same numbers (1e-13 relative), and the switch between them must be
invisible to the user."""
import subprocess
import sys
import os

import numpy as np
import pytest

import meanfield as mf
from meanfield import numeric


def _both(monkeypatch, fn):
    """fn() evaluated with each engine forced (same process, same compiled objects)."""
    out = {}
    for engine in ("python", "numba"):
        monkeypatch.setattr(numeric, "_ENGINE_FORCED", engine)
        out[engine] = fn()
    monkeypatch.setattr(numeric, "_ENGINE_FORCED", "")
    return out["python"], out["numba"]


def _close(a, b, rtol=1e-13):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert a.shape == b.shape
    assert np.array_equal(np.isnan(a), np.isnan(b))
    fin = np.isfinite(a) & np.isfinite(b)
    assert np.array_equal(np.isinf(a), np.isinf(b))
    np.testing.assert_allclose(a[fin], b[fin], rtol=rtol, atol=1e-300)


ARCHS = [dict(activation="erf"), dict(activation="gelu"), dict(activation="relu", norm="bn"),
         dict(activation="tanh", norm="ln_pre", mu=0.7), dict(activation="softplus")]


@pytest.mark.slow
@pytest.mark.parametrize("kw", ARCHS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_profile_and_fixed_point_agree(monkeypatch, kw):
    sw = np.array([0.7, 1.2, 1.9])[:, None]
    sb = np.array([0.05, 0.3])
    p, n = _both(monkeypatch, lambda: mf.kernel_profile(sigma_w=sw, sigma_b=sb, depth=30, **kw))
    _close(p.K, n.K)
    _close(p.chi_J, n.chi_J)
    if n.K12 is not None:
        _close(p.K12, n.K12)
    p, n = _both(monkeypatch, lambda: mf.fixed_point_state(sigma_w=sw, sigma_b=sb, errors="nan", **kw))
    for f in ("K", "chi_J", "chi_K"):
        _close(getattr(p, f), getattr(n, f))
    assert np.array_equal(p.status, n.status)


@pytest.mark.slow
# (SiLU takes the quadrature engines' path of tanh: left out for CI time)
@pytest.mark.parametrize("kw", [dict(activation="erf"), dict(activation="gelu"), dict(activation="tanh")],
                         ids=["erf", "gelu", "tanh"])
def test_critical_point_and_line_agree(monkeypatch, kw):
    p, n = _both(monkeypatch, lambda: mf.critical_point(**kw))
    assert len(p) == len(n) >= 1
    for a, b in zip(p, n):
        _close([a.sigma_w, a.sigma_b, a.K_star, a.chi_J, a.chi_K], [b.sigma_w, b.sigma_b, b.K_star, b.chi_J, b.chi_K])
        assert a.stability == b.stability
    sw = np.linspace(1.0, 2.5, 4)
    p, n = _both(monkeypatch, lambda: mf.critical_line(sigma_w=sw, **kw))
    _close(p.sigma_b, n.sigma_b)
    _close(p.K_star, n.K_star)


def _kinked():
    # a user activation with a jump and a kink (Piecewise: numpy.select in the numpy twin)
    import sympy as sp
    from meanfield.activations import activation
    from meanfield.symbols import x

    return activation(sp.Piecewise((sp.tanh(x), x < sp.Rational(1, 2)),
                                   (sp.tanh(sp.Rational(1, 2)) + 3 * (x - sp.Rational(1, 2)), True)))


@pytest.mark.slow
# (SiLU's integrands are tanh's and softplus's kind, smooth with exp: left out for CI time, ~50 s of compiles)
@pytest.mark.parametrize("act, tol", [("tanh", 1e-13), ("softplus", 1e-13), ("gelu_tanh", 1e-11),
                                      ("kinked", 1e-13)])
def test_quadrature_expectations_agree(act, tol):
    """The interpreted engine's one-point expectations (numpy twins of the integrands, all nodes
    at once) against numba's scalar engine, for every expectation the compiled module has, K
    from 1e-6 to 1e6. Both engines are accurate to ~1e-15 of E|f| (the error measure of the
    rule); they differ in summation order, and numpy's SIMD tanh differs from libm's by an ulp
    (more after pointwise cancellation in high derivatives of gelu_tanh), so a cancelling
    integrand (E[f] << E|f|) agrees to ``tol`` of E|f|, the others to 1e-13 relative. (gelu_tanh's
    third-derivative integrands subtract terms ~1e20 apart from the result pointwise, 1 - tanh^2
    among them: each engine evaluates them to ~1e-12 of E|f| only at K ~ 1e4, whatever the summation.)"""
    from meanfield import gaussian

    comp = numeric.compiled(activation=_kinked() if act == "kinked" else act)
    interp, mod = comp.interpreted, comp.module
    names = sorted(n for n in vars(interp) if n.startswith("_E1_") and n[4:].isdigit())
    assert len(names) >= 4
    finite = 0
    for name in names:
        f, cuts = getattr(interp, name + "_NUMPY")
        for K in np.logspace(-6, 6, 13):
            a, b = float(getattr(interp, name)(np.float64(K))), float(getattr(mod, name)(K))
            # (NaN in both where the compiled integrand overflows, SiLU' at h ~ -800: the solvers report it)
            assert np.isnan(a) == np.isnan(b), (name, K, a, b)
            if np.isnan(b):
                continue
            finite += 1
            scale = gaussian.quad1(lambda h: np.abs(f(h)), np.sqrt(K), cuts)[0]  # E|f|
            assert abs(a - b) <= tol * (scale + abs(b)), (name, K, a, b, scale)
    # the functions the solvers use, where no cancellation happens: 1e-13 relative
    for K in np.logspace(-6, 6, 13):
        for n in ("kernel", "chi_J", "dkernel_dW"):
            args = tuple(np.float64(v) for v in (K, 0.5 * K, 1.7, 0.1, 0.0, 0.0))
            _close(getattr(interp, n)(*args), getattr(mod, n)(*args))
    assert finite >= 0.75 * len(names) * 13


@pytest.mark.slow
def test_an_integrand_numpy_cannot_print_is_mapped_over_the_nodes(tmp_path, monkeypatch):
    """Where numpy has no printing of an integrand, the interpreted engine maps the integrand's
    scalar body over the quadrature nodes: the same expectations as with the numpy twins."""
    # both generated here: the numbering of the expectations follows sympy's set order, per process
    path = tmp_path / "meanfield_expr_numpy_twins.py"
    path.write_text(numeric.generate_source(mf.Architecture(activation="tanh")))
    twins = numeric._expressions_interpreted(path)
    monkeypatch.setattr(numeric._Gen, "_numpy_body", lambda self, *args: False)
    path = tmp_path / "meanfield_expr_scalar_bodies.py"
    path.write_text(numeric.generate_source(mf.Architecture(activation="tanh")))
    scalar = numeric._expressions_interpreted(path)
    assert "_E1_0_SCALAR" in vars(scalar) and "_E1_0_NUMPY" not in vars(scalar)
    one = sorted(n for n in vars(scalar) if n.startswith("_E1_") and n[4:].isdigit())
    two = sorted(n for n in vars(scalar) if n.startswith("_E2_") and n[4:].isdigit())
    assert one and two
    from meanfield import gaussian

    # libm's tanh (the scalar bodies) and numpy's differ by an ulp: agreement to 1e-14 of E|f|
    for name in one:
        f, cuts = getattr(twins, name + "_NUMPY")
        for K in (1e-3, 0.7, 40.0):
            a, b = getattr(scalar, name)(np.float64(K)), getattr(twins, name)(np.float64(K))
            scale = gaussian.quad1(lambda h: np.abs(f(h)), np.sqrt(K), cuts)[0]
            assert abs(a - b) <= 1e-14 * scale, (name, K, a, b, scale)
    for name in two:
        f, cu, cv = getattr(twins, name + "_NUMPY")
        a, b = (getattr(m, name)(np.float64(1.3), np.float64(0.4), np.float64(0.5)) for m in (scalar, twins))
        scale = float(gaussian.expect2(lambda u, v: np.abs(f(u, v)), 1.3, 0.4, 0.5, (cu, cv[1:])))
        assert abs(a - b) <= 1e-14 * scale, (name, a, b, scale)


@pytest.mark.slow
@pytest.mark.parametrize("act", ["tanh", "kinked"])
def test_two_point_expectations_agree(act):
    """The interpreted two-point expectations (numpy: all inner integrals of an outer level at once)
    against numba's nested scalar engine, to 1e-13 of E|f(u, v)|, over correlations -1..1 and
    variances 1e-3..1e3."""
    from meanfield import gaussian

    comp = numeric.compiled(activation=_kinked() if act == "kinked" else act)
    interp, mod = comp.interpreted, comp.module
    names = sorted(n for n in vars(interp) if n.startswith("_E2_") and n[4:].isdigit())
    assert names
    for name in names:
        f, cu, cv = getattr(interp, name + "_NUMPY")
        for K1, K2 in [(1.0, 1.0), (1e-3, 2.0), (30.0, 0.5), (1e3, 1e3)]:
            for r in (-1.0, -0.6, 0.0, 0.3, 0.999, 1.0):
                K12 = r * np.sqrt(K1 * K2)
                a = float(getattr(interp, name)(np.float64(K1), np.float64(K2), np.float64(K12)))
                b = float(getattr(mod, name)(K1, K2, K12))
                assert np.isnan(a) == np.isnan(b), (name, K1, K2, r, a, b)
                if np.isnan(b):
                    continue
                scale = float(gaussian.expect2(lambda u, v: np.abs(f(u, v)), K1, K2, K12, (cu, cv[1:])))
                assert abs(a - b) <= 1e-13 * (scale + abs(b)), (name, K1, K2, r, a, b, scale)


def test_interpreting_budget_follows_numbas_cache(tmp_path, monkeypatch):
    """0.5 s of interpreting where numba would load its caches (the module's, the kernels', the
    quadrature engine's); 8 s where switching would compile."""
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    numeric._kernels_cache_warm.cache_clear()
    path = numeric._source_path(numeric._canonical(mf.Architecture(activation="erf")))
    comp = numeric.CompiledRecursion(mf.Architecture(activation="erf"), path, 0.0, 0.0, False, False, False)
    assert comp._budget() == numeric.INTERPRETED_BUDGET_COLD_S > numeric.INTERPRETED_BUDGET_S
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / f"{path.stem}.FNS-1.py311.nbi").write_text("")
    (tmp_path / "numba" / "x").mkdir(parents=True)
    (tmp_path / "numba" / "x" / "_kernels.profile-1.py311.nbi").write_text("")
    numeric._kernels_cache_warm.cache_clear()
    comp = numeric.CompiledRecursion(mf.Architecture(activation="erf"), path, 0.0, 0.0, False, False, False)
    # the quadrature engine (meanfield._quadrature_numba) would still compile
    assert comp._budget() == numeric.INTERPRETED_BUDGET_COLD_S
    (tmp_path / "numba" / "x" / "_quadrature_numba._expect1-1.py311.nbi").write_text("")
    numeric._kernels_cache_warm.cache_clear()
    comp = numeric.CompiledRecursion(mf.Architecture(activation="erf"), path, 0.0, 0.0, False, False, False)
    assert comp._budget() == numeric.INTERPRETED_BUDGET_S
    numeric._kernels_cache_warm.cache_clear()


def test_ieee_math_matches_numbas_error_model():
    m = numeric._IEEE_MATH
    assert m.exp(1e4) == np.inf and m.log(0.0) == -np.inf and np.isnan(m.log(-1.0))
    assert np.isnan(m.sqrt(-1.0)) and m.log1p(-1.0) == -np.inf and m.sinh(-1e4) == -np.inf
    assert m.exp(0.5) == np.exp(0.5) or abs(m.exp(0.5) - np.exp(0.5)) <= 2e-16


def test_ieee_math_arithmetic_after_a_call_follows_numbas_error_model():
    """Float results are numpy scalars, so x / 0 after them is inf, not ZeroDivisionError (as hardtanh's
    recursion did at K = 0 in the CPython engine: 1 / sqrt(K))."""
    m = numeric._IEEE_MATH
    with np.errstate(divide="ignore"):
        assert 0.5 / m.sqrt(0.0) == np.inf and m.sqrt(0.0) ** -1.5 == np.inf
        assert m.erf(0.5 * m.sqrt(2.0) / m.sqrt(0.0)) == 1.0
    assert type(m.floor(2.5)) is int and m.pi == np.pi


@pytest.mark.slow
@pytest.mark.parametrize("act", ["elu", "selu", "hardtanh"])
def test_kinked_closed_forms_agree_on_both_engines(monkeypatch, act):
    """Their closed forms divide by sqrt(K): at K = 0 numba gives inf (and erf(inf) = 1), CPython used to
    raise ZeroDivisionError in critical_point, critical_line, phase_diagram (and hardtanh's fixed_point)."""
    sw, sb = np.array([0.7, 1.4, 2.6]), np.array([0.0, 0.3])
    p, n = _both(monkeypatch, lambda: mf.phase_diagram(activation=act, sigma_w=sw, sigma_b=sb))
    _close(p.chi_J, n.chi_J, rtol=1e-12)
    p, n = _both(monkeypatch, lambda: mf.critical_line(activation=act, sigma_w=[1.2, 1.6]))
    _close(p.sigma_b, n.sigma_b, rtol=1e-12)
    p, n = _both(monkeypatch, lambda: mf.fixed_point(activation=act, sigma_w=1.3, sigma_b=0.2))
    _close(p, n)
    p, n = _both(monkeypatch, lambda: mf.critical_point(activation=act))
    assert len(p) == len(n) >= 1
    _close([q.K_star for q in p], [q.K_star for q in n], rtol=1e-9)


def test_brentq_is_scipys():
    from scipy.optimize import brentq as scipy_brentq

    from meanfield.roots import brentq

    for f, a, b in [(lambda x: x ** 3 - 2 * x - 5, 2, 3), (lambda x: np.cos(x) - x, 0, 1),
                    (lambda x: np.tanh(50 * (x - 0.3)), 0, 1), (lambda x: (x - 1e-9) * (1 + x * x), 0, 1)]:
        kw = dict(xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200)
        assert brentq(f, a, b, **kw) == scipy_brentq(f, a, b, **kw)
    with pytest.raises(ValueError):
        brentq(lambda x: x * x + 1, -1, 1)
    # out of iterations: an error, as scipy's (disp=True), not the last iterate passed off as a root
    with pytest.raises(RuntimeError):
        scipy_brentq(lambda x: np.cos(x) - x, 0, 1, maxiter=2)
    with pytest.raises(RuntimeError):
        brentq(lambda x: np.cos(x) - x, 0, 1, maxiter=2)


def _fresh_process(code, cache):
    """Run ``code`` in a new Python process with an empty cache and the default engine choice."""
    env = dict(os.environ, MEANFIELD_CACHE_DIR=str(cache))
    env.pop("MEANFIELD_ENGINE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.slow
def test_small_first_call_does_not_import_numba(tmp_path):
    """A fresh process answers a small request without numba (and without scipy.optimize)."""
    code = ("import sys, meanfield as mf\n"
            "r = mf.kernel_profile(activation='erf', sigma_w=1.2, sigma_b=0.1, depth=50)\n"
            "c = mf.critical_point(activation='erf')\n"
            "print('numba' in sys.modules, 'scipy.optimize' in sys.modules, repr(float(r.K[-1])), "
            "repr(c[0].sigma_w))\n")
    out = _fresh_process(code, tmp_path)
    numba_loaded, scipy_loaded, K50, sw = out.stdout.split()
    assert numba_loaded == "False" and scipy_loaded == "False"
    ref = mf.kernel_profile(activation="erf", sigma_w=1.2, sigma_b=0.1, depth=50).K[-1]
    assert float(K50) == pytest.approx(ref, rel=1e-13)
    # erf's critical point at K* = 0: sigma_w^2 E[phi'(0)^2] = 1 gives sigma_w = sqrt(pi)/2 (independent)
    assert float(sw) == pytest.approx(np.sqrt(np.pi) / 2, rel=1e-12)


@pytest.mark.slow
def test_first_quadrature_critical_point_does_not_compile(tmp_path):
    """tanh has no closed-form moments: its critical point needs ~10^4 Gaussian quadratures,
    which a fresh process answers with the numpy engine, without importing numba."""
    code = ("import sys, meanfield as mf\n"
            "c = mf.critical_point(activation='tanh')\n"
            "print('numba' in sys.modules, repr(c[0].sigma_w), repr(c[0].K_star))\n")
    out = _fresh_process(code, tmp_path)
    numba_loaded, sw, K = out.stdout.split()
    assert numba_loaded == "False"
    # tanh'(0) = 1: chi_J = sigma_w^2 at K* = 0, so sigma_w = 1 (independent of the code)
    assert float(sw) == pytest.approx(1.0, rel=1e-12) and float(K) == 0.0


@pytest.mark.slow
def test_cli_theory_command_imports_neither_torch_nor_numba(tmp_path):
    """`meanfield critical-point` builds its parser without torch and answers erf without numba."""
    code = ("import sys\nsys.argv = ['meanfield', 'critical-point', '--activation', 'erf']\n"
            "from meanfield import cli\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'numba' in sys.modules)\n")
    out = _fresh_process(code, tmp_path)
    assert "sigma_w = 0.8862269255" in out.stdout  # sqrt(pi)/2
    assert out.stdout.split()[-2:] == ["False", "False"]


@pytest.mark.slow
def test_user_activation_with_a_special_function_on_both_engines():
    """phi = erf(x) + x/2 as a user expression (no closed form is looked up, so both engines
    integrate it): the interpreted engine's numpy twin once printed erf as math.erf, which raised
    TypeError on arrays at the first call. Reference: the closed two-point form
    E[phi(u) phi(v)] = (2/pi) arcsin(2 K12 / sqrt((1+2K1)(1+2K2)))
    + K12 (1/sqrt(1+2K1) + 1/sqrt(1+2K2)) / sqrt(pi) + K12/4 (Stein's lemma for the cross terms),
    in 40-digit mpmath, at K = 1 to 1e12 (the step-like erf at large K)."""
    import mpmath as mp
    import sympy as sp

    from meanfield.symbols import x

    comp = numeric.compiled(activation=sp.erf(x) + x / 2)
    interp, mod = comp.interpreted, comp.module
    with mp.workdps(40):
        for K in (1.0, 1e3, 1e6, 1e12):
            for r in (-0.3, 0.5, 0.99):
                Km, K12 = mp.mpf(K), mp.mpf(r) * mp.mpf(K)
                ref = (2 / mp.pi * mp.asin(2 * K12 / (1 + 2 * Km)) + 2 * K12 / mp.sqrt(mp.pi * (1 + 2 * Km))
                       + K12 / 4)
                args = tuple(np.float64(v) for v in (K, r * K, 1.0, 0.0, 0.0, 0.0))
                for engine in (interp, mod):
                    got = float(engine.kernel12(*args))
                    assert abs(got - ref) <= 1e-14 * abs(ref), (engine, K, r, got, ref)
