"""The on-disk cache of the series derivatives of critical points (issue 15: a warm first answer
without sympy differentiation). A cached round trip must give the same functions, bit for bit,
as a fresh derivation, and the derivatives themselves must match mpmath's numerical ones."""
import json

import mpmath as mp
import pytest

import meanfield as mf
from meanfield.solvers import _expansion


ARCHS = [mf.Architecture(activation="erf"), mf.Architecture(activation="gelu"),
         mf.Architecture(activation="tanh"), mf.Architecture(activation="tanh", norm="ln_pre", mu=0.7)]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=str)
def test_cached_derivatives_round_trip(arch):
    spec = _expansion._derivatives_source(arch, 3)
    fresh = _expansion._derivatives_load(spec)
    again = _expansion._derivatives_load(json.loads(json.dumps(spec)))  # what a later process reads
    args = (mp.mpf("0.7"), mp.mpf("1.3"), mp.mpf("0.2"), mp.mpf(arch.mu or 0), mp.mpf(0))
    with mp.workdps(30):
        for name in ("F", "X"):
            assert len(fresh[name]) == len(again[name]) == (4 if name == "F" else 2)
            for n, (a, b) in enumerate(zip(fresh[name], again[name])):
                assert a(*args) == b(*args), (name, n)


def _central(f, K, n, h):
    """n-th derivative by the central difference of order 2 (error ~ h^2)."""
    if n == 1:
        return (f(K + h) - f(K - h)) / (2 * h)
    if n == 2:
        return (f(K + h) - 2 * f(K) + f(K - h)) / h ** 2
    return (f(K + 2 * h) - 2 * f(K + h) + 2 * f(K - h) - f(K - 2 * h)) / (2 * h ** 3)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS[:3], ids=str)
def test_cached_derivatives_are_derivatives(arch):
    """d^n F / dK^n from the cache against central differences of F itself (30 digits, so the
    step's rounding is negligible; the h^2 truncation ~1e-8 sets the tolerance)."""
    fs = _expansion._derivatives_load(json.loads(json.dumps(_expansion._derivatives_source(arch, 3))))
    rest = (mp.mpf("1.3"), mp.mpf("0.2"), mp.mpf(0), mp.mpf(0))
    K, h = mp.mpf("0.7"), mp.mpf("1e-4")
    with mp.workdps(30):
        for n in (1, 2, 3):
            num = _central(lambda k: fs["F"][0](k, *rest), K, n, h)
            assert abs(fs["F"][n](K, *rest) - num) <= mp.mpf("1e-6") * (1 + abs(num)), n
        num = _central(lambda k: fs["X"][0](k, *rest), K, 1, h)
        assert abs(fs["X"][1](K, *rest) - num) <= mp.mpf("1e-6") * (1 + abs(num))


@pytest.mark.slow
def test_second_process_reads_the_cache(tmp_path, monkeypatch):
    """With the file on disk, _derivatives does not differentiate again, and the critical point's
    series coefficients are the same numbers."""
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(tmp_path))
    arch = mf.Architecture(activation="gelu")
    _expansion._derivatives.cache_clear()
    first = mf.critical_point(arch)
    files = list(tmp_path.glob("meanfield_expr_*.series3-v*.json"))
    assert len(files) == 1
    _expansion._derivatives.cache_clear()

    def refuse(*a, **k):
        raise AssertionError("re-derived although the cache holds the derivatives")

    monkeypatch.setattr(_expansion, "_derivatives_source", refuse)
    second = mf.critical_point(arch)
    assert [(p.c2, p.c3, p.d1) for p in first] == [(p.c2, p.c3, p.d1) for p in second]
    # a damaged file is derived again, not an error
    files[0].write_text("{not json")
    _expansion._derivatives.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(tmp_path))
    third = mf.critical_point(arch)
    assert [(p.c2, p.c3, p.d1) for p in first] == [(p.c2, p.c3, p.d1) for p in third]
    _expansion._derivatives.cache_clear()


@pytest.mark.parametrize("arch", [a for a in ARCHS if str(a).startswith("tanh")], ids=str)
def test_float64_expectations_match_the_mpmath_ones(arch):
    """The series of critical points take their Gaussian expectations from the float64 engine: every
    derivative agrees with the 30-digit mpmath quadrature of the same integrands to 1e-12."""
    exact = _expansion._derivatives(arch, 3)
    fast = _expansion._derivatives(arch, 3, float64_expectations=True)
    args = (mp.mpf("0.7"), mp.mpf("1.2"), mp.mpf("0.3"), mp.mpf(arch.mu or 0), mp.mpf(0))
    with mp.workdps(30):
        for name in ("F", "X"):
            for n, (a, b) in enumerate(zip(exact[name], fast[name])):
                ref = a(*args)
                assert abs(b(*args) - ref) <= 1e-12 * abs(ref), (name, n)
