"""The compiled recursions (meanfield.numeric) against the symbolic layer, and the on-disk cache."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield import symbols as S
from meanfield import _kernels as KN
from meanfield.numeric import FUNCTIONS, W, T, _expressions, compiled, generate_source

pytestmark = pytest.mark.filterwarnings("error")

ARCHS = [
    dict(activation="erf"),
    dict(activation="gelu", mu=0.5),
    dict(activation="tanh"),
    dict(activation="relu", norm="bn", mu=0.5),
    dict(activation="gelu", norm="ln_pre"),
    dict(activation="erf", norm="ln_post"),
    dict(activation="relu", block="resmlp"),
    dict(activation="gelu", block="mixer"),
]


def _evaluate(comp, which, K, Q, Wv, Tv):
    out = np.empty(1)
    comp.call("expr_grid", which, np.array([K]), np.array([Q]), np.array([Wv]), np.array([Tv]),
              comp.mu, comp.eps, out)
    return out[0]


@pytest.mark.slow
@pytest.mark.parametrize("kw", ARCHS, ids=lambda kw: "-".join(map(str, kw.values())))
def test_compiled_expressions_match_sympy(kw):
    """Every compiled function equals the sympy expression it was printed from (mpmath evalf)."""
    arch = mf.as_architecture(**kw)
    comp = compiled(arch)
    exprs = _expressions(mf.recursion(arch))
    rng = np.random.default_rng(0)
    for _ in range(1):
        K = float(rng.uniform(0.2, 3.0))
        Q = float(rng.uniform(-0.5, 0.9)) * K
        Wv, Tv = float(rng.uniform(0.3, 4.0)), float(rng.uniform(0.0, 1.0))
        subs = {S.K: K, S.K12: Q, W: Wv, T: Tv, S.mu: comp.mu, S.eps: comp.eps}
        for i, name in enumerate(FUNCTIONS):
            if name in ("kernel12", "dkernel_dK12", "dkernel12_dK", "dkernel12_dK12") and not comp.pair:
                continue  # two-point expectations by nested mpmath quadrature: slow, covered for bn
            if kw.get("block") == "mixer" or kw["activation"] == "tanh":
                if name not in ("kernel", "chi_J", "chi_K", "dchiJ_dT"):
                    continue  # (huge expressions / mpmath quadratures: a representative subset)
            ref = complex(sp.sympify(exprs[name]).evalf(20, subs=subs))
            got = _evaluate(comp, i, K, Q, Wv, Tv)
            assert abs(ref.imag) < 1e-12
            assert got == pytest.approx(ref.real, rel=1e-10, abs=1e-12), (name, kw)


def test_quadrature_edge_kernels():
    """K = 0 gives f(0); huge and tiny K stay finite for a bounded activation."""
    comp = compiled(activation="tanh")
    for K in (0.0, 1e-300, 1e-12, 1e6, 1e12):
        v = _evaluate(comp, KN.KERNEL, K, 0.0, 1.0, 0.0)
        assert np.isfinite(v) and 0 <= v <= 1


def test_unsupported_expression_is_a_clear_error():
    f = sp.Function("myfn")
    with pytest.raises(ValueError, match="cannot compile|one free symbol"):
        generate_source(mf.Architecture(activation=f(sp.Symbol("t"))))


@pytest.mark.slow  # compiles from scratch in a second process
def test_second_process_does_not_recompile(tmp_path):
    """A fresh process finds the generated module and numba's caches: no compilation."""
    # numba answers every call (else this small call would run interpreted, without the kernels)
    env = dict(os.environ, MEANFIELD_CACHE_DIR=str(tmp_path), MEANFIELD_ENGINE="numba")
    code = textwrap.dedent("""
        import json, time
        import meanfield as mf
        from meanfield import _kernels as KN
        from meanfield.numeric import compiled
        t = time.perf_counter()
        mf.kernel_profile(activation="softplus", sigma_w=1.1, sigma_b=0.2, depth=3)
        dt = time.perf_counter() - t
        c = compiled(activation="softplus")
        from meanfield import _quadrature_numba as Q
        print(json.dumps(dict(
            expr_hits=c.fns.cache_hits,
            engine_hits=Q._expect1.cache_hits + Q._expect2.cache_hits,
            kernel_misses=sum(KN.profile.stats.cache_misses.values()),
            seconds=dt)))
    """)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        import json

        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["expr_hits"] == 0          # first process compiles the expressions
    assert runs[1]["expr_hits"] == 1     # the second loads them from disk
    # the quadrature engine too (its code holds no address of the first process: cacheable; the first
    # process compiled it or, where NUMBA_CACHE_DIR is shared with other tests, loaded it)
    assert runs[1]["engine_hits"] == 2
    assert runs[1]["kernel_misses"] == 0
    assert any(p.name.startswith("meanfield_expr_") for p in tmp_path.iterdir())
