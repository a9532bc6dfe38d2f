"""Monte-Carlo estimators: exact vs Hutchinson, linear networks, theory, determinism, arguments."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield._serialize import load  # noqa: E402
from meanfield.verification import monte_carlo, phase_diagram  # noqa: E402
from meanfield.verification._theory import theory_profile  # noqa: E402

pytestmark = pytest.mark.torch

#: finite-width allowance used by the suite: |MC - theory| <= 4 SE + C * l / width * |theory|
C_ALLOW = 3.0


def _agrees(mc, se, th, layers, width, c=C_ALLOW):
    tol = 4 * se + c * layers / width * np.abs(th)
    return np.abs(mc - th) <= tol


@pytest.mark.slow
@pytest.mark.parametrize("arch", [mf.Architecture("erf"), mf.Architecture("relu", norm="bn", mu=0.5)], ids=str)
def test_exact_and_hutchinson_agree(arch):
    kw = dict(sigma_w=1.4, sigma_b=0.2, depth=4, width=12, n_init=24, batch=4, seed=3)
    ex = monte_carlo(arch, estimator="exact", **kw)
    hu = monte_carlo(arch, estimator="hutchinson", n_probes=4, **kw)
    # same networks (same seed): the per-initialisation difference is pure probe noise, mean zero
    for key in ("chi_J", "J"):
        d = hu.samples[key] - ex.samples[key]
        d = d[:, ~np.isnan(d).any(0)]
        se = d.std(0, ddof=1) / np.sqrt(d.shape[0])
        assert np.all(np.abs(d.mean(0)) <= 4 * se + 1e-12), (key, d.mean(0), se)
    np.testing.assert_allclose(hu.K, ex.K)  # the forward pass is identical


def test_exact_estimator_matches_autograd_jacobian():
    """J^{1,2} of one small network from torch.autograd.functional.jacobian of a hand-built copy."""
    arch = mf.Architecture("tanh")
    r = monte_carlo(arch, 1.1, 0.3, depth=2, width=5, n_init=2, batch=1, estimator="exact", seed=7)
    # rebuild network 0 from the documented streams (draw n of the pass is stream n of initialisation 0):
    # input G, g then block G
    from meanfield.torch._philox import standard_normal
    from meanfield.verification.montecarlo import make_inputs

    N0 = r.input_dim
    G1, b1, G2 = (torch.from_numpy(standard_normal(7, [0], n, shape)[0]) for n, shape in
                  enumerate([(5, N0), (5,), (5, 5)]))
    x, _ = make_inputs(1, 1, N0, 0.0, 7)
    h1 = 1.1 * x.view(-1) @ G1.T / np.sqrt(N0) + 0.3 * b1
    jac = torch.autograd.functional.jacobian(lambda h: 1.1 * torch.tanh(h) @ G2.T / np.sqrt(5), h1)
    assert r.samples["chi_J"][0, 0] == pytest.approx(float(jac.pow(2).sum() / 5), rel=1e-12)
    assert r.samples["K"][0, 0] == pytest.approx(float(h1.pow(2).mean()), rel=1e-12)


def test_linear_network_apjn_is_sigma_w_squared():
    sw = 1.7
    r = monte_carlo(mf.Architecture("linear"), sw, 0.4, depth=5, width=64, n_init=32, estimator="exact")
    assert np.all(np.abs(r.chi_J - sw**2) <= 4 * r.chi_J_se)
    assert np.all(np.abs(r.J - sw ** (2 * np.arange(5))) <= 4 * r.J_se + 1e-12)
    hu = monte_carlo(mf.Architecture("linear"), sw, 0.4, depth=5, width=64, n_init=32)
    assert np.all(np.abs(hu.chi_J - sw**2) <= 4 * hu.chi_J_se)


CASES = [
    (mf.Architecture("relu"), 2**0.5, 0.0, 1),
    (mf.Architecture("erf"), 1.5, 0.3, 1),
    (mf.Architecture("gelu", norm="ln_pre", mu=0.5), 1.2, 0.3, 1),
    (mf.Architecture("relu", norm="ln_post"), 1.0, 0.3, 1),
    (mf.Architecture("relu", norm="bn", mu=0.5), 1.0, 0.1, 64),
    (mf.Architecture(block="resmlp", activation="relu"), 1.0, 0.2, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch,sw,sb,batch", CASES, ids=[str(c[0]) for c in CASES])
def test_monte_carlo_agrees_with_theory(arch, sw, sb, batch):
    depth, width = 6, 128
    r = monte_carlo(arch, sw, sb, depth=depth, width=width, n_init=24, batch=batch, seed=11,
                    tokens=32 if arch.block != "mlp" else None)
    th = theory_profile(arch, sw, sb, depth, K12_0=sw**2 * r.input_overlap + sb**2 if batch > 1 else None)
    layers = np.arange(1, depth + 1)
    assert np.all(_agrees(r.K, r.K_se, th["K"], layers, width)), (r.K, r.K_se, th["K"])
    # both indexed by layer: chi_J[l-1] = J^{l,l+1} for l = 1..depth
    assert r.chi_J.shape == th["chi_J"].shape == (depth,)
    assert np.all(_agrees(r.chi_J, r.chi_J_se, th["chi_J"], layers, width)), (r.chi_J, r.chi_J_se, th["chi_J"])
    assert np.all(_agrees(r.J, r.J_se, th["J"], layers, width)), (r.J, r.J_se, th["J"])


def test_factorisation_of_the_apjn():
    """J^{1,l} = prod J^{l',l'+1}, per network, up to estimator noise (exact estimator, small width)."""
    r = monte_carlo(mf.Architecture("erf"), 1.3, 0.1, depth=5, width=24, n_init=16, estimator="exact", seed=2)
    prod = np.concatenate([[1.0], np.cumprod(r.chi_J[:-1])])   # J^{1,l} = prod_{l' < l} chi_J[l'-1]
    assert np.all(np.abs(r.J - prod) <= 4 * r.J_se + 3 * np.arange(5) / 24 * prod)


def test_reproducible_and_chunk_independent():
    kw = dict(sigma_w=1.2, sigma_b=0.3, depth=4, width=16, n_init=6, seed=5)
    a = monte_carlo("tanh", **kw)
    b = monte_carlo("tanh", **kw)
    c = monte_carlo("tanh", init_chunk=4, **kw)
    d = monte_carlo("tanh", **{**kw, "seed": 6})
    for key in ("K", "chi_J", "J"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
        np.testing.assert_allclose(getattr(a, key), getattr(c, key), rtol=1e-12)
    assert not np.allclose(a.chi_J, d.chi_J)


def test_phase_diagram_reuses_the_networks_of_monte_carlo():
    kw = dict(depth=5, width=16, n_init=4, seed=9)
    pd = phase_diagram("erf", sigma_w=[0.8, 1.4], sigma_b=[0.0, 0.3], **kw)
    assert pd.chi_J.shape == (2, 2) and pd.chi_J_se.shape == (2, 2) and pd.layer == 3
    r = monte_carlo("erf", 1.4, 0.3, **kw)
    assert pd.chi_J[1, 1] == pytest.approx(r.chi_J[2], rel=1e-12)
    assert pd.K[1, 1] == pytest.approx(r.K[2], rel=1e-12)


@pytest.mark.slow
def test_float32_runs():
    # float32 draws its own random stream, so compare with theory, not with float64
    a = monte_carlo("relu", 2**0.5, 0.0, depth=3, width=64, n_init=16, dtype=torch.float32)
    assert a.dtype == "float32" and np.all(np.isfinite(a.K)) and np.all(np.isfinite(a.J))
    assert np.all(np.abs(a.K - 2.0) <= 4 * a.K_se + 0.1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(depth=1), "depth"),
    (dict(depth=2.5), "depth"),
    (dict(width=0), "width"),
    (dict(n_init=1), "n_init"),
    (dict(device="tpu"), "device"),
    (dict(device="not a device"), "device"),
    (dict(sigma_w=-1.0), "sigma_w"),
    (dict(sigma_b=float("nan")), "sigma_b"),
    (dict(estimator="magic"), "estimator"),
    (dict(dtype=torch.int32), "dtype"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    base = dict(sigma_w=1.0, sigma_b=0.0, depth=3, width=8, n_init=2)
    with pytest.raises(ValueError, match=match):
        monte_carlo("relu", **{**base, **kwargs})


def test_unavailable_cuda_and_bn_batch_raise():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            monte_carlo("relu", 1.0, 0.0, depth=3, width=8, n_init=2, device="cuda")
    with pytest.raises(ValueError, match="batch"):
        monte_carlo(mf.Architecture("relu", norm="bn"), 1.0, 0.0, depth=3, width=8, n_init=2, batch=1)
    with pytest.raises(ValueError, match="depth"):
        phase_diagram("relu", [1.0], [0.0], depth=1, width=8, n_init=2)


@pytest.mark.slow
def test_import_meanfield_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, meanfield; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_arrays_are_indexed_by_layer_like_kernel_profile():
    """chi_J has one entry per layer; the extra block for J^{depth,depth+1} leaves layers 1..depth unchanged."""
    kw = dict(sigma_w=1.3, sigma_b=0.2, width=16, n_init=4, seed=9)
    r5 = monte_carlo("tanh", depth=5, **kw)
    r6 = monte_carlo("tanh", depth=6, **kw)
    th = mf.kernel_profile(activation="tanh", sigma_w=1.3, sigma_b=0.2, depth=5)
    assert r5.chi_J.shape == r5.K.shape == r5.J.shape == th.chi_J.shape == (5,)
    assert r5.samples["chi_J"].shape == (4, 5) and np.array_equal(r5.layers, th.layers)
    # the same networks and probes, layer by layer (bitwise): the longer run just has one more block
    for k in ("K", "chi_J", "J", "K12"):
        np.testing.assert_array_equal(getattr(r5, k), getattr(r6, k)[:5], err_msg=k)
    assert np.all(np.isfinite(r5.chi_J))


def test_monte_carlo_result_repr_and_round_trip(tmp_path):
    r = monte_carlo("erf", 1.2, 0.1, depth=6, width=8, n_init=3, seed=1)
    text = repr(r)
    assert "MonteCarloResult(" in text and "chi_J = (6) in [" in text and len(text.splitlines()) < 40
    for ext in ("json", "npz"):
        back = type(r).load(r.save(tmp_path / f"mc.{ext}"))
        assert back.architecture == r.architecture and back.depth == r.depth and back.dtype == r.dtype
        for k in ("K", "K_se", "K12", "chi_J", "chi_J_se", "J", "J_se"):
            np.testing.assert_array_equal(getattr(back, k), getattr(r, k), err_msg=k)
        for k, v in r.samples.items():
            np.testing.assert_array_equal(back.samples[k], v, err_msg=k)
    pd = phase_diagram("erf", [0.8, 1.4], [0.0, 0.3], depth=3, width=8, n_init=3, seed=1)
    back = type(pd).load(pd.save(tmp_path / "pd.npz"))
    np.testing.assert_array_equal(back.chi_J, pd.chi_J)
    assert back.layer == pd.layer and back.architecture == pd.architecture
    # a saved file names the class by the public module it is imported from, so that files load in
    # every version (the class is defined in a private module)
    for res, name in ((r, "MonteCarloResult"), (pd, "PhaseDiagramResult")):
        path = res.save(tmp_path / f"{name}.json")
        assert json.loads(path.read_text())["data"]["__result__"] == f"meanfield.verification.montecarlo.{name}"
        assert type(load(path)) is type(res)


@pytest.mark.slow
def test_last_layer_apjn_agrees_with_theory_deep_and_wide():
    """Depth 20, width 512: J^{l,l+1} at every layer, the last (l = depth, one extra block) included,
    within the suite's band of kernel_profile at the same index."""
    depth, width = 20, 512
    r = monte_carlo("tanh", 1.3, 0.2, depth=depth, width=width, n_init=16, seed=4)
    th = mf.kernel_profile(activation="tanh", sigma_w=1.3, sigma_b=0.2, depth=depth)
    assert r.chi_J.shape == th.chi_J.shape == (depth,)
    assert np.all(_agrees(r.chi_J, r.chi_J_se, th.chi_J, r.layers, width)), (r.chi_J, r.chi_J_se, th.chi_J)
    assert abs(r.chi_J[-1] - th.chi_J[-1]) <= 4 * r.chi_J_se[-1] + C_ALLOW * depth / width * th.chi_J[-1]
    assert np.all(_agrees(r.J, r.J_se, th.J, r.layers, width))
