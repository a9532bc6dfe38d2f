"""AutoInit (meanfield.torch.autoinit) on CPU.

Every "after" check re-measures J^{l,l+1} on fresh inputs with an estimator
independent of the one AutoInit optimises: per-block ``hutchinson_apjn`` of
meanfield.torch.estimators with its own seed and more probes, or the
exact Jacobian at small sizes.
"""
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from meanfield import autoinit as th  # noqa: E402
from meanfield.torch.autoinit import (  # noqa: E402
    AutoInitError, apjn_vs_batch_size, apply_scales, autoinit, find_blocks, load_scales, measure, save_scales)
from meanfield.torch.models import ResMLP, vgg19_bn  # noqa: E402

pytestmark = pytest.mark.torch


def mlp(depth, width, din, sigma_w, sigma_b=0.0, act=nn.ReLU, bn=False, bias=True, dout=None, seed=0):
    """Sequential(Linear, [BN], act, ..., Linear): depth hidden layers, W ~ N(0, sigma_w^2/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    layers, d = [], din
    for i in range(depth + 1):
        out = width if i < depth or dout is None else dout
        lin = nn.Linear(d, out, bias=bias)
        with torch.no_grad():
            lin.weight.normal_(0.0, sigma_w / math.sqrt(d), generator=g)
            if bias:
                lin.bias.normal_(0.0, sigma_b, generator=g) if sigma_b > 0 else lin.bias.zero_()
        layers.append(lin)
        if i < depth:
            if bn:
                layers.append(nn.BatchNorm1d(out))
            layers.append(act())
        d = out
    return nn.Sequential(*layers)


def data(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_critical(model, x, lo=0.9, hi=1.1, **kw):
    kw.setdefault("n_probes", 16)
    kw.setdefault("seed", 12345)
    m = measure(model, x, **kw)
    assert np.all((m.J > lo) & (m.J < hi)), f"J^(l,l+1) = {np.round(m.J, 3)} (se {np.round(m.J_se, 3)})"
    return m


# --------------------------------------------------------------------------- ReLU theory on a real network


@pytest.fixture(scope="module")
def relu_500():
    """The paper's Fig. 1 network: ReLU MLP, 10 hidden layers of width 500, sigma_b = 0."""
    return lambda sigma_w: mlp(10, 500, 500, sigma_w, bias=False, seed=3)


@pytest.mark.slow
def test_jll_dynamics_follow_eq17(relu_500):
    sw, lr, T = 2.0, 0.05, 8
    model = relu_500(sw)
    x = data(64, 500)
    tuned, rep = autoinit(model, x, lr=lr, steps=T, tol=0.0, n_probes=2, progress=False)
    Jh = rep.J_history  # in-loop estimates J(t), t = 0..T, for the 10 pairs of 11 Linear outputs
    assert Jh.shape == (T + 1, 10) and rep.steps == T
    # 1. SGD on a_W: a(t+1) = a(t) - 2 lr log J(t) / a(t) (the derivation behind eq. 17), exactly.
    a = np.ones(10)
    for t in range(T):
        a = a - 2 * lr * np.log(Jh[t]) / a
    got = np.array([rep.scales[f"{2 * i}.weight"] for i in range(1, 11)])  # J[l] is set by Linear l+1
    assert got == pytest.approx(a, rel=1e-4)
    # 2. eq. 17 step by step: J(t+1) predicted from the measured J(t) agrees with the
    #    measured J(t+1) within Monte-Carlo error (relative se of one in-loop estimate
    #    from the report's 8-probe measurement, two independent estimates per comparison).
    rel_se = np.sqrt(8 / 2) * rep.before.J_se / rep.before.J
    pred = th.relu_step(Jh[:-1], sw, lr)
    z = (Jh[1:] - pred) / (Jh[1:] * rel_se * np.sqrt(2))
    assert np.max(np.abs(z)) < 5, np.round(z, 2)
    assert np.sqrt(np.mean(z**2)) < 1.6
    assert abs(z.mean()) < 4 / np.sqrt(z.size)  # no bias
    # 3. eq. 17 iterated from J(0) for T steps (the paper's Fig. 1 check)
    it = th.relu_dynamics(Jh[0], sw, lr, T)
    assert np.all(np.abs(Jh[-1] - it[-1]) < 5 * Jh[-1] * rel_se), (Jh[-1], it[-1])
    # 4. rescale mode: the tuned network's J is a^2 times the original's, probe for probe
    m0 = measure(model, x[:8], method="fused", n_probes=4, seed=7)
    m1 = measure(tuned, x[:8], method="fused", n_probes=4, seed=7)
    assert m1.J == pytest.approx(m0.J * got**2, rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("sigma_w", [3.0, 0.8])
def test_one_step_learning_rate(relu_500, sigma_w):
    model = relu_500(sigma_w)
    x = data(32, 500)
    # Per-layer eq. 19 rates from the theory module at the measured J(0). At finite
    # width eq. 19 is exact per network with sigma_w^2 -> 2 J(0) (J is exactly
    # a^2 (2J(0)/2)); the infinite-width sigma_w^2 misses where a layer's J(0) is
    # a few percent off sigma_w^2/2, and the one-step map amplifies that.
    J0 = measure(model, x, method="fused", n_probes=8, seed=5).J
    rates = th.one_step_lr(J0, np.sqrt(2 * J0))
    lr = {f"{2 * i}.weight": float(r) for i, r in zip(range(1, 11), rates)}
    tuned, rep = autoinit(model, x, lr=lr, steps=1, tol=0.0, n_probes=8, progress=False)
    assert rep.steps == 1
    m = assert_critical(tuned, data(32, 500, seed=2), 0.95, 1.05)
    assert np.all(np.abs(m.J - 1) < 0.02 + 5 * m.J_se)
    # with the base sigma_w: right up to that finite-width amplification
    tuned, _ = autoinit(model, x, lr={k: float(r) for k, r in zip(lr, th.one_step_lr(J0, sigma_w))},
                        steps=1, tol=0.0, n_probes=8, progress=False)
    assert_critical(tuned, data(32, 500, seed=2), 0.8, 1.25)
    # the default lr of a ReLU MLP is the exact one-step rate, recomputed every step
    tuned, rep = autoinit(model, x, steps=1, tol=0.0, progress=False)
    assert "one-step" in str(rep.lr)
    assert_critical(tuned, data(32, 500, seed=2), 0.95, 1.05)


@pytest.mark.slow
def test_relu_mlp_from_sigma_w_3_exact_check():
    model = mlp(8, 64, 32, 3.0, sigma_b=0.1, seed=4)
    tuned, rep = autoinit(model, data(64, 32), steps=10, progress=False)
    assert rep.J_before.min() > 3
    m = assert_critical(tuned, data(4, 32, seed=9), method="exact")
    assert m.method == "exact"
    # the tuned weights approach Kaiming (a sigma_w = sqrt 2) up to finite width
    aw = np.array([rep.scales[f"{2 * i}.weight"] for i in range(1, 9)])
    assert np.all(np.abs(aw * 3.0 / math.sqrt(2) - 1) < 0.15)


# --------------------------------------------------------------------------- other architectures


@pytest.mark.slow
def test_gelu_mlp_with_biases():
    model = mlp(6, 128, 64, 2.0, sigma_b=0.5, act=nn.GELU, seed=5)
    x = data(256, 64)
    tuned, rep = autoinit(model, x, batch_size=32, steps=200, progress=False)
    assert rep.J_before.max() > 1.7
    assert_critical(tuned, data(32, 64, seed=3))


@pytest.mark.slow
def test_pre_bn_mlp_batch_128():
    model = mlp(5, 64, 32, 1.0, bn=True, seed=6)
    x = data(512, 32)
    tuned, rep = autoinit(model, x, batch_size=128, steps=200, progress=False)
    # large-batch theory (paper eq. 38): pi/(pi - 1) between hidden BN blocks before tuning
    assert np.all(np.abs(rep.J_before[1:-1] - math.pi / (math.pi - 1)) < 0.15)
    assert_critical(tuned, data(128, 32, seed=4))


@pytest.mark.slow
def test_small_resmlp_from_kaiming():
    model = ResMLP(img_size=16, patch_size=4, dim=16, depth=2, num_classes=10, layerscale=1.0, seed=0)
    x = data(64, 3, 16, 16)
    tuned, rep = autoinit(model, x, batch_size=8, lr=0.1, steps=80, loss="jkl", lam=0.5, progress=False)
    assert rep.blocks == model.autoinit_blocks()
    assert rep.J_before.min() > 2
    assert_critical(tuned, data(8, 3, 16, 16, seed=5))


@pytest.mark.slow
def test_small_vgg19_bn():
    model = vgg19_bn(width=1 / 16, hidden=32, pool_size=1, num_classes=10, img_size=32, seed=0)
    x = data(64, 3, 32, 32)
    # BatchNorm at 2x2 spatial size makes the per-step estimate noisy: average the last 15 iterates.
    # BatchNorm makes J nearly invariant to the scale of the layer before it, so the exact scale
    # gradients (statistics differentiated, tests/test_autoinit_twin.py) are small there and the
    # descent needs 120 steps (40 left J at 1.16; the gradient that froze the statistics reached
    # [0.9, 1.1] in 40, but it was not the gradient of J)
    tuned, rep = autoinit(model, x, batch_size=32, steps=120, lr=0.05, n_probes=1, average=15, progress=False)
    assert rep.J_before.max() > 1.2 and rep.J_before.min() < 0.8
    # a max-pool block has J = 1 exactly (one unit-weight path per output)
    pools = [i for i in range(len(rep.blocks) - 1) if isinstance(model.get_submodule(rep.blocks[i + 1]), nn.MaxPool2d)]
    assert len(pools) == 5
    assert np.all(np.abs(rep.J_before[pools] - 1) < 5 * rep.before.J_se[pools])
    assert_critical(tuned, x[:32], n_probes=8)
    # on a batch it was not tuned on, J moves with the batch statistics (BatchNorm at 2x2 spatial
    # size, 32 images): a few per cent more spread
    assert_critical(tuned, data(32, 3, 32, 32, seed=6), lo=0.85, hi=1.15, n_probes=8)


# --------------------------------------------------------------------------- modes, report, persistence


@pytest.mark.slow
def test_user_model_untouched_and_freeze_equals_rescale():
    model = mlp(3, 32, 16, 1.0, bn=True, seed=7)
    model.train()
    model[1].eval()  # a mixed state, to check it is restored
    state = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    x = data(64, 16)
    t1, r1 = autoinit(model, x, steps=5, tol=0.0, progress=False)
    t2, r2 = autoinit(model, x, steps=5, tol=0.0, mode="freeze", progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert [m.training for m in model.modules()] == flags
    assert r1.scales == pytest.approx(r2.scales)
    assert torch.nn.utils.parametrize.is_parametrized(t2[0], "weight")
    assert not torch.nn.utils.parametrize.is_parametrized(t1[0])
    t1.eval(), t2.eval()
    with torch.no_grad():
        assert torch.allclose(t1(x), t2(x), atol=1e-5)
    # inplace: the given module itself is tuned
    m3 = mlp(3, 32, 16, 1.0, bn=True, seed=7)
    out, _ = autoinit(m3, x, steps=5, tol=0.0, progress=False, inplace=True)
    assert out is m3


@pytest.mark.slow
def test_save_and_apply_to_fresh_instance(tmp_path):
    x = data(64, 3, 16, 16)
    kw = dict(img_size=16, patch_size=4, dim=16, depth=2, num_classes=10, layerscale=1.0)
    tuned, rep = autoinit(ResMLP(seed=0, **kw), x, batch_size=8, lr=0.1, steps=60, loss="jkl", lam=0.5,
                          progress=False)
    path = tmp_path / "scales.json"
    rep.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "meanfield.autoinit.scales" and doc["mode"] == "rescale"
    assert set(doc["scales"]) == {n for n, _ in tuned.named_parameters()}
    fresh = apply_scales(ResMLP(seed=1, **kw), path)  # another draw of the same architecture
    assert_critical(fresh, data(8, 3, 16, 16, seed=8), 0.85, 1.15)
    # round trip through a plain dict, freeze mode
    save_scales(rep.scales, tmp_path / "s2.json", mode="freeze")
    assert load_scales(tmp_path / "s2.json")["mode"] == "freeze"
    frozen = apply_scales(ResMLP(seed=1, **kw), tmp_path / "s2.json")
    assert torch.nn.utils.parametrize.is_parametrized(frozen.head)
    with pytest.raises(ValueError, match="shape"):
        apply_scales(ResMLP(seed=1, **{**kw, "dim": 8}), path)
    with pytest.raises(ValueError, match="does not have"):
        apply_scales(nn.Linear(3, 3), {"nope.weight": 2.0})
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not an AutoInit scales file"):
        load_scales(tmp_path / "bad.json")


@pytest.mark.slow
def test_report_contents_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    model = mlp(4, 32, 16, 2.0, act=nn.Tanh, seed=8)
    tuned, rep = autoinit(model, data(32, 16), steps=20, tol=0.0, loss="jsl", progress=False)
    n = len(rep.blocks)
    assert rep.J_before.shape == rep.J_after.shape == (n - 1,)
    assert rep.K_before.shape == rep.K_after.shape == (n,)
    assert len(rep.loss_history) == rep.steps + 1 == 21
    assert rep.loss_history[-1] < rep.loss_history[0]
    assert set(rep.scales) == {k for k, _ in model.named_parameters()}
    assert "AutoInit (jsl" in rep.summary()
    json.dumps(rep.as_dict())
    fig = rep.plot()
    assert len(fig.axes) == 4


@pytest.mark.slow
def test_batch_size_helper():
    bn = mlp(4, 64, 32, 1.0, bn=True, seed=9)
    x = data(256, 32)
    scan = apjn_vs_batch_size(bn, x, [4, 128], n_probes=2, n_batches=3)
    assert scan.J.shape == (2, 4)
    # with BatchNorm J depends on |B| (small batches: strongly), ...
    assert np.all(np.abs(scan.J[0, 1:-1] - scan.J[1, 1:-1]) > 0.1)
    plain = mlp(4, 64, 32, 1.5, seed=9)
    scan = apjn_vs_batch_size(plain, x, [2, 64], n_probes=4, n_batches=4)
    # ... without it, it does not (paper Remark 1.1)
    assert np.all(np.abs(scan.J[0] - scan.J[1]) < 5 * np.hypot(scan.J_se[0], scan.J_se[1]) + 0.02)


def test_block_detection():
    assert find_blocks(mlp(3, 8, 4, 1.0, bn=True)) == ["0", "3", "6", "9"]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

        def forward(self, x):
            x = self.embed(x)
            for lay in self.layers:
                x = torch.relu(lay(x))
            return x

    assert find_blocks(Net()) == ["layers.0", "layers.1", "layers.2"]
    r = ResMLP(img_size=16, patch_size=4, dim=8, depth=2)
    assert find_blocks(r) == ["stem", "blocks.0.token", "blocks.0.channel", "blocks.1.token", "blocks.1.channel"]
    with pytest.raises(ValueError, match="no block structure"):
        find_blocks(nn.Linear(3, 3))


@pytest.mark.slow
def test_measure_estimators_agree():
    model = mlp(3, 24, 12, 1.7, sigma_b=0.2, act=nn.GELU, seed=10)
    x = data(6, 12)
    ex = measure(model, x, method="exact")
    hu = measure(model, x, method="hutchinson", n_probes=400)
    fu = measure(model, x, method="fused", n_probes=400)
    for est in (hu, fu):
        assert np.all(np.abs(est.J - ex.J) < 4 * est.J_se + 1e-9), (est.method, est.J, ex.J, est.J_se)
    assert ex.K == pytest.approx(hu.K)


# --------------------------------------------------------------------------- bad input


def test_bad_input():
    model = mlp(2, 8, 4, 1.0)
    x = data(8, 4)
    with pytest.raises(ValueError, match="no parameters"):
        autoinit(nn.Sequential(nn.ReLU(), nn.ReLU()), x, blocks=["0", "1"])
    with pytest.raises(ValueError, match="no submodule named 'nope'"):
        autoinit(model, x, blocks=["0", "nope"])
    with pytest.raises(ValueError, match="not in execution order"):
        autoinit(model, x, blocks=["4", "2", "0"])
    with pytest.raises(ValueError, match="nested"):
        autoinit(nn.Sequential(model, nn.Linear(8, 8)), x, blocks=["0", "0.2"])
    with pytest.raises(ValueError, match="at least two"):
        autoinit(model, x, blocks=["0"])
    with pytest.raises(ValueError, match=r"inputs of shape \(8, 5\) do not fit"):
        autoinit(model, data(8, 5))
    with pytest.raises(ValueError, match="leading batch axis"):
        autoinit(model, data(4))
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        autoinit(model, x, steps=0)
    with pytest.raises(ValueError, match="loss='mse'"):
        autoinit(model, x, loss="mse")
    with pytest.raises(ValueError, match="lam"):
        autoinit(model, x, lam=0.5)
    with pytest.raises(ValueError, match="mode"):
        autoinit(model, x, mode="thaw")
    with pytest.raises(ValueError, match="batch_size"):
        autoinit(model, x, batch_size=100)
    with pytest.raises(ValueError, match="lr"):
        autoinit(model, x, lr=-1.0)
    with pytest.raises(ValueError, match="BatchNorm"):
        autoinit(mlp(2, 8, 4, 1.0, bn=True), x, batch_size=1)


def test_non_finite_loss_names_the_block():
    model = mlp(3, 16, 8, 1.0, seed=11)
    with torch.no_grad():
        model[4].weight.mul_(1e30)  # block "4" overflows float32 in the forward pass
    with pytest.raises(AutoInitError, match=r"step 0: .*block '4'") as err:
        autoinit(model, data(8, 8, seed=12), progress=False)
    assert err.value.block == "4" and err.value.step == 0
    # a learning rate far above the JSL bound (eq. 42) blows the run up later on
    model = mlp(3, 16, 8, 3.0, seed=11)
    with pytest.raises(AutoInitError, match=r"step [1-9]\d*: .*block") as err:
        autoinit(model, data(8, 8), loss="jsl", lr=50.0, steps=50, progress=False)
    assert err.value.step >= 1
