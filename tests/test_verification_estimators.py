"""Generic APJN estimators on arbitrary torch functions (used by AutoInit)."""
import pytest

torch = pytest.importorskip("torch")

from meanfield.verification import batch_statistics, exact_apjn, hutchinson_apjn  # noqa: E402

pytestmark = pytest.mark.torch


def _model(bn=False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(10, 16)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.Tanh(), torch.nn.Linear(16, 7)]
    return torch.nn.Sequential(*layers).double()


@pytest.mark.slow
@pytest.mark.parametrize("bn", [False, True])
def test_hutchinson_is_unbiased_for_the_exact_apjn(bn):
    m = _model(bn)
    h = torch.randn(6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with batch_statistics(m):
        ex = exact_apjn(m, h)
        est = hutchinson_apjn(m, h, n_probes=300, generator=torch.Generator().manual_seed(2))
    assert est.samples.shape == (300,)
    assert abs(float(est.mean - ex.mean)) <= 4 * float(est.se)
    if bn:  # buffers untouched inside batch_statistics
        assert int(m[1].num_batches_tracked) == 0


@pytest.mark.slow
def test_forward_ad_jvp_matches_torch_func_jvp():
    from meanfield.torch.estimators import jvp

    m = _model(bn=True)
    h = torch.randn(6, 10, dtype=torch.float64)
    v = torch.randn(6, 10, dtype=torch.float64)
    with batch_statistics(m):
        out, t = jvp(m, h, v)
        out2, t2 = torch.func.jvp(m, (h,), (v,))
    torch.testing.assert_close(t, t2)
    torch.testing.assert_close(out, out2)


def test_exact_apjn_of_a_linear_map_is_its_frobenius_norm():
    W = torch.randn(5, 8, dtype=torch.float64)
    h = torch.randn(3, 8, dtype=torch.float64)
    ex = exact_apjn(lambda x: x @ W.T, h)
    # batch-aware normalisation: ||J||_F^2 / numel(out) = 3 ||W||^2 / (3 * 5)
    assert float(ex.mean) == pytest.approx(float(W.pow(2).sum() / 5), rel=1e-12)


def test_gradients_flow_to_parameters():
    m = _model()
    a = torch.nn.Parameter(torch.tensor(1.3, dtype=torch.float64))
    h = torch.randn(4, 10, dtype=torch.float64)
    est = hutchinson_apjn(lambda x: a * m(x), h, n_probes=3, generator=torch.Generator().manual_seed(0))
    (g,) = torch.autograd.grad(est.mean, a)
    # J scales as a^2, so d mean / d a = 2 mean / a
    assert float(g) == pytest.approx(2 * float(est.mean) / 1.3, rel=1e-10)


def test_seeded_and_validated():
    m = _model()
    h = torch.randn(4, 10, dtype=torch.float64)
    a = hutchinson_apjn(m, h, 5, torch.Generator().manual_seed(3))
    b = hutchinson_apjn(m, h, 5, torch.Generator().manual_seed(3))
    assert torch.equal(a.samples, b.samples)
    with pytest.raises(ValueError, match="n_probes"):
        hutchinson_apjn(m, h, 0)
    with pytest.raises(ValueError, match="h must be"):
        hutchinson_apjn(m, [1.0, 2.0])
