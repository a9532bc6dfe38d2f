"""The fused Dense epilogue (torch/_fused.py) against torch's own operations, bit for bit."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield.torch import _fused, context  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 5, 1, 1, 37), (2, 4, 3, 6, 9), (1, 1, 2, 1, 1)])
@pytest.mark.parametrize("kernel", ["_affine", "_affine_serial"])
def test_affine_is_torchs_three_operations(dtype, shape, kernel):
    g_ = torch.Generator().manual_seed(sum(shape))
    I, P, S, R, N = shape
    y = torch.randn(shape, generator=g_, dtype=dtype) * 3
    scale = torch.rand(P, generator=g_, dtype=dtype) + 0.3
    sb = torch.randn(P, generator=g_, dtype=dtype)
    g = torch.randn(I, N, generator=g_, dtype=dtype)
    ref = y.clone()
    ref.mul_(scale.view(1, P, 1, 1, 1))      # what Dense.torch_forward did before the fusion, in torch
    ref[:, :, 0] += sb.view(1, P, 1, 1) * g.view(I, 1, 1, N)
    got = y.clone()
    getattr(_fused, kernel)(got.numpy(), scale.numpy(), sb.numpy(), g.numpy())
    assert torch.equal(got, ref)


@pytest.mark.parametrize("name,kw", [("erf", dict(batch=1)), ("relu", dict(batch=3)),
                                     ("tanh", dict(batch=2, norm="ln_pre", mu=0.5))])
@pytest.mark.slow
def test_monte_carlo_is_unchanged_by_the_fusion(name, kw, monkeypatch):
    """Whole passes (primal and probe slots, several inputs) give the same numbers with and without it."""
    from meanfield.verification import monte_carlo

    calls = []
    real = _fused.affine_
    monkeypatch.setattr(_fused, "affine_", lambda *a: calls.append(1) or real(*a))
    batch = kw.pop("batch")
    arch = mf.Architecture(name, **kw)
    runs = {}
    monkeypatch.setattr(context, "FAST_ERF", False)  # torch.erf in both (erf32 has its own test below)
    for fused in (False, True):
        monkeypatch.setattr(context, "FUSED_EPILOGUE", fused)
        runs[fused] = monte_carlo(arch, 1.4, 0.3, depth=5, width=24, n_init=3, batch=batch, seed=2,
                                  dtype=torch.float32)
    assert calls, "the fused kernel never ran"
    for k in ("K", "K12", "chi_J", "J"):
        np.testing.assert_array_equal(runs[True].samples[k], runs[False].samples[k])


@pytest.mark.slow
def test_erf32_is_within_0p54_ulp_of_erf():
    """Against scipy's float64 erf (an independent implementation) on 2.4 M float32 points, +-inf and NaN."""
    from scipy.special import erf

    x = np.concatenate([np.linspace(-6, 6, 2_000_001), np.logspace(-38, 1, 200_000),
                        -np.logspace(-38, 1, 200_000)]).astype(np.float32)
    ref = erf(x.astype(np.float64))
    got = _fused.erf32(x)
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - ref) / ulp) < 0.54
    for kernel in (_fused._erf, _fused._erf_serial):  # threaded and one-thread kernels: the same numbers
        out = np.empty_like(x[:5000])
        kernel(x[:5000], out)
        np.testing.assert_array_equal(out, got[:5000])
    special = _fused.erf32(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32))
    assert np.isnan(special[0]) and list(special[1:]) == [1.0, -1.0, 0.0, 0.0]
    assert np.signbit(special[4])


@pytest.mark.slow
def test_float32_erf_network_uses_it_and_agrees_with_torch_erf(monkeypatch):
    """A float32 erf pass with erf32 against the same pass with torch.erf: the same up to float32 rounding.

    (phase_diagram: its layers without a probe carry the primal slot alone, where erf32 is used.)
    """
    from meanfield.verification import phase_diagram

    calls = []
    real = _fused.erf32
    monkeypatch.setattr(_fused, "erf32", lambda x: calls.append(1) or real(x))
    runs = {}
    for fast in (False, True):
        monkeypatch.setattr(context, "FAST_ERF", fast)
        runs[fast] = phase_diagram("erf", [1.0, 2.5], [0.0, 0.5], depth=8, width=64, n_init=4, seed=1,
                                   dtype=torch.float32)
    assert calls
    for k in ("K", "chi_J"):
        a, b = getattr(runs[True], k), getattr(runs[False], k)
        assert not np.array_equal(a, b)  # the two erfs differ in the last bit somewhere
        np.testing.assert_allclose(a, b, rtol=2e-5)


@pytest.mark.slow
def test_deep_wide_passes_with_and_without_the_fused_kernels(monkeypatch):
    """Depth 20, width 512 (ordered and near-critical points): float64 bit for bit; float32 erf (erf32 against
    torch.erf) to float32 rounding."""
    from meanfield.verification import phase_diagram

    kw = dict(depth=20, width=512, n_init=2, seed=4, input_dim=784)
    runs = {}
    for dtype in (torch.float64, torch.float32):
        for fused in (False, True):
            monkeypatch.setattr(context, "FUSED_EPILOGUE", fused)
            monkeypatch.setattr(context, "FAST_ERF", fused)
            runs[dtype, fused] = phase_diagram("erf", [1.0, 1.5], [0.05, 0.3], dtype=dtype, **kw)
    for k in ("K", "chi_J"):
        np.testing.assert_array_equal(getattr(runs[torch.float64, True], k), getattr(runs[torch.float64, False], k))
        np.testing.assert_allclose(getattr(runs[torch.float32, True], k), getattr(runs[torch.float32, False], k),
                                   rtol=2e-6)  # measured 2.1e-7 (K), 2.8e-7 (chi_J)
        # and float32 is the float64 network to float32 accuracy (a check that both runs are the same networks)
        np.testing.assert_allclose(getattr(runs[torch.float32, True], k), getattr(runs[torch.float64, True], k),
                                   rtol=4e-6)  # measured 2.0e-7 (K), 3.8e-7 (chi_J)
