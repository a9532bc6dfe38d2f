"""ResMLP, MLP-Mixer and VGG19_BN of meanfield.torch.models."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from meanfield.torch.autoinit import autoinit, find_blocks, measure  # noqa: E402
from meanfield.torch.models import MLPMixer, ResMLP, VGG, mixer_s16, resmlp_s12, vgg19_bn  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_full_size_parameter_counts():
    # timm's resmlp_12 (15.35M), torchvision's vgg19_bn (143,678,248), timm's mixer_s16_224 (18.53M)
    with torch.device("meta"):
        counts = [sum(p.numel() for p in f().parameters()) for f in (resmlp_s12, vgg19_bn, mixer_s16)]
    assert counts == [15_350_872, 143_678_248, 18_528_264]


def test_small_models_forward_and_blocks():
    r = ResMLP(img_size=16, patch_size=4, dim=8, depth=3, num_classes=5, seed=0)
    assert r(r.example_inputs(2)).shape == (2, 5)
    assert find_blocks(r) == ["stem"] + [f"blocks.{i}.{s}" for i in range(3) for s in ("token", "channel")]
    mx = MLPMixer(img_size=16, patch_size=4, dim=8, depth=2, tokens_hidden=4, channels_hidden=16, num_classes=5)
    assert mx(mx.example_inputs(2)).shape == (2, 5)
    assert len(find_blocks(mx)) == 5
    v = vgg19_bn(width=1 / 16, hidden=16, pool_size=1, num_classes=5, img_size=32)
    assert v(v.example_inputs(2)).shape == (2, 5)
    assert sum(isinstance(m, nn.Conv2d) for m in v.modules()) == 16
    assert len(find_blocks(v)) == 21  # 16 Conv-BN-ReLU units and 5 max-pools


def test_fan_in_initialisation():
    r = ResMLP(img_size=32, patch_size=4, dim=64, depth=1, sigma_w=1.5, sigma_b=0.3, seed=1)
    fc1 = r.blocks[0].channel.fc1
    assert fc1.weight.std().item() == pytest.approx(1.5 / math.sqrt(64), rel=0.02)
    assert fc1.bias.std().item() == pytest.approx(0.3, rel=0.15)
    assert torch.equal(r.blocks[0].token.ls, torch.full((64,), 0.1))
    o = ResMLP(img_size=32, patch_size=4, dim=64, depth=1, init="original", seed=1)
    assert torch.count_nonzero(o.head.weight) == 0  # timm: zero head
    v = vgg19_bn(width=0.25, hidden=64, pool_size=1, num_classes=10, seed=2)
    conv = v.features[0][0]
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (16 * 9)), rel=0.1)  # Kaiming fan-out


@pytest.mark.slow
def test_relu_resmlp_apjn_matches_paper_eq72():
    """AI eq. 72 per residual branch (mu = 1, Affine = identity at init):
    token mixing J = 1 + eps^2 sigma_w^2, channel mixing J = 1 + eps^2 sigma_w^4 / 2
    (their product is eq. 72's block APJN)."""
    eps, sw = 0.5, 1.2
    r = ResMLP(img_size=32, patch_size=4, dim=256, depth=2, mlp_ratio=4, activation="relu",
               layerscale=eps, sigma_w=sw, seed=3)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    m = measure(r, x, n_probes=8, method="fused")
    token, channel = 1 + eps**2 * sw**2, 1 + eps**2 * sw**4 / 2
    assert m.J[1::2] == pytest.approx([channel, channel], rel=0.05)
    assert m.J[2::2] == pytest.approx([token], rel=0.05)


@pytest.mark.slow
def test_mixer_autoinit_moves_towards_criticality():
    mx = MLPMixer(img_size=16, patch_size=4, dim=16, depth=2, tokens_hidden=16, channels_hidden=32,
                  num_classes=10, seed=0)
    x = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    tuned, rep = autoinit(mx, x, batch_size=8, lr=0.1, steps=40, progress=False)
    assert rep.loss_history[-1] < 0.2 * rep.loss_history[0]
    assert np.all(np.abs(np.log(rep.J_after)) < np.abs(np.log(rep.J_before)) + 0.02)


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ResMLP(img_size=30, patch_size=4)
    with pytest.raises(ValueError, match="init='xavier'"):
        ResMLP(init="xavier")
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        ResMLP(depth=0)
    with pytest.raises(ValueError, match="activation"):
        ResMLP(activation="swish2")
    with pytest.raises(ValueError, match="width"):
        VGG(width=0)
