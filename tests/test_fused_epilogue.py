"""The fused Dense epilogue (torch/_fused.py) against torch's own operations, bit for bit."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield.torch import _fused, networks  # noqa: E402

pytestmark = pytest.mark.torch


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
    ref.mul_(scale.view(1, P, 1, 1, 1))      # what RDense did before the fusion, in torch
    ref[:, :, 0] += sb.view(1, P, 1, 1) * g.view(I, 1, 1, N)
    got = y.clone()
    getattr(_fused, kernel)(got.numpy(), scale.numpy(), sb.numpy(), g.numpy())
    assert torch.equal(got, ref)


@pytest.mark.parametrize("name,kw", [("erf", dict(batch=1)), ("relu", dict(batch=3)),
                                     ("tanh", dict(batch=2, norm="ln_pre", mu=0.5))])
def test_monte_carlo_is_unchanged_by_the_fusion(name, kw, monkeypatch):
    """Whole passes (primal and probe slots, several inputs) give the same numbers with and without it."""
    from meanfield.verification import monte_carlo

    calls = []
    real = _fused.affine_
    monkeypatch.setattr(_fused, "affine_", lambda *a: calls.append(1) or real(*a))
    batch = kw.pop("batch")
    arch = mf.Architecture(name, **kw)
    runs = {}
    for fused in (False, True):
        monkeypatch.setattr(networks, "FUSED_EPILOGUE", fused)
        runs[fused] = monte_carlo(arch, 1.4, 0.3, depth=5, width=24, n_init=3, batch=batch, seed=2,
                                  dtype=torch.float32)
    assert calls, "the fused kernel never ran"
    for k in ("K", "K12", "chi_J", "J"):
        np.testing.assert_array_equal(runs[True].samples[k], runs[False].samples[k])
