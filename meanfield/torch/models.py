"""ResMLP, MLP-Mixer, VGG19_BN and the pre-activation ResNet in plain torch (no torchvision, no timm), sizes configurable.

ResMLP and VGG19_BN are the two architectures of the AutoInit paper's
experiments (section 4); MLP-Mixer is the partial-Jacobian paper's. All define
``autoinit_blocks()``: the names of the submodules whose outputs
are the block outputs ``h^l`` between which AutoInit measures
``J^{l,l+1}``; :func:`meanfield.torch.autoinit.autoinit` uses it when
``blocks`` is not given.

ResMLP (Touvron et al. 2021; AutoInit appendix D). Image -> non-overlapping
``patch_size`` patches -> ``Linear`` embedding to ``dim`` channels (a strided
convolution) -> ``depth`` blocks, each two residual sub-blocks::

    token mixing:    x = x + ls1 * Linear_patches(Affine1(x)^T)^T
    channel mixing:  x = x + ls2 * Linear(4d -> d)(phi(Linear(d -> 4d)(Affine2(x))))

-> Affine -> mean over patches -> Linear classifier. ``Affine(x) = alpha * x + beta``
(alpha = 1, beta = 0 at init); ``ls1, ls2`` are LayerScale vectors initialised
to ``layerscale`` (0.1 for 12 blocks in the original). As in the original code
the skip adds the un-normalised ``x`` (AutoInit eq. 51 writes the skip from the
Affine output; the two agree at initialisation, where Affine is the identity).

``autoinit_blocks()`` lists the embedding and every residual sub-block (the
paper's Fig. 3 counts depth by residual connections). The head is left out:
the mean over P patches has ``J = 1/P`` exactly, so asking ``J = 1`` across it
would blow the classifier weights up by ``sqrt(P)``; name ``"head"`` in
``blocks`` to include it anyway.

VGG19_BN (Simonyan & Zisserman; torchvision's layout): 16 units
``Conv3x3 -> BatchNorm2d -> ReLU`` in five stages separated by ``MaxPool2d(2)``,
adaptive average pooling to ``pool_size`` and a three-layer classifier with
dropout. ``autoinit_blocks()`` lists every unit and every max-pool, as the
paper measures VGG (section 4.2); a max-pool's own ``J`` is exactly 1.

Initialisations (``init=``):

* ``"fan_in"`` (ResMLP default): weights ``N(0, sigma_w^2/fan_in)``, biases
  ``N(0, sigma_b^2)``; with the defaults ``sigma_w = sqrt(2)``, ``sigma_b = 0``
  this is Kaiming (He) initialisation, the paper's "Kaiming" baseline.
* ``"original"``: ResMLP as in timm (xavier-uniform linears, lecun-normal
  embedding, ``N(0, 1e-6)`` biases in the channel MLP, zero head); VGG as in
  torchvision (Kaiming-normal fan-out convolutions, ``N(0, 0.01)`` linears,
  zero biases), which is VGG's default here.
* ``"torch"``: PyTorch's own layer defaults.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._validate import check_choice

__all__ = [
    "PreLNResMLP",
    "PreActBlock",
    "PreActResNet",
    "resnet110",
    "Affine",
    "MLPMixer",
    "ResMLP",
    "ResMLPBlock",
    "VGG",
    "VGG19_CFG",
    "mixer_s16",
    "resmlp_s12",
    "vgg19_bn",
]

_INITS = ("fan_in", "original", "torch")


def _check_int(name, value, minimum=1):
    from .._validate import check_int

    return check_int(name, value, minimum)


def _check_init(init):
    return check_choice("init", init, _INITS)


def _activation(name):
    from .activations import TORCH_ACTIVATIONS, torch_module

    names = tuple(n for n, row in TORCH_ACTIVATIONS.items() if row.module is not None)
    return torch_module(check_choice("activation", name, names))


def _fan_in_init_(module, sigma_w, sigma_b, generator=None):
    """Weights N(0, sigma_w^2/fan_in) and biases N(0, sigma_b^2) for Linear/Conv."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            with torch.no_grad():
                m.weight.normal_(0.0, sigma_w / math.sqrt(fan_in), generator=generator)
                if m.bias is not None:
                    if sigma_b > 0:
                        m.bias.normal_(0.0, sigma_b, generator=generator)
                    else:
                        m.bias.zero_()


class Affine(nn.Module):
    """ResMLP's Affine "normalisation": ``alpha * x + beta`` over the last axis."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.alpha * x + self.beta


class PatchEmbed(nn.Module):
    """Non-overlapping ``P x P`` patches -> ``dim`` channels; output (batch, patches, dim)."""

    def __init__(self, img_size, patch_size, in_chans, dim):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} must be a multiple of patch_size={patch_size}")
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class TokenMixing(nn.Module):
    """``x + ls * Linear_over_patches(Affine(x))`` (ResMLP's cross-patch sub-block)."""

    def __init__(self, num_patches, dim, layerscale):
        super().__init__()
        self.norm = Affine(dim)
        self.linear = nn.Linear(num_patches, num_patches)
        self.ls = nn.Parameter(torch.full((dim,), float(layerscale)))

    def forward(self, x):
        return x + self.ls * self.linear(self.norm(x).transpose(1, 2)).transpose(1, 2)


class ChannelMixing(nn.Module):
    """``x + ls * fc2(phi(fc1(Affine(x))))`` (ResMLP's cross-channel sub-block)."""

    def __init__(self, dim, hidden, layerscale, activation):
        super().__init__()
        self.norm = Affine(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = _activation(activation)
        self.fc2 = nn.Linear(hidden, dim)
        self.ls = nn.Parameter(torch.full((dim,), float(layerscale)))

    def forward(self, x):
        return x + self.ls * self.fc2(self.act(self.fc1(self.norm(x))))


class ResMLPBlock(nn.Module):
    def __init__(self, num_patches, dim, hidden, layerscale, activation):
        super().__init__()
        self.token = TokenMixing(num_patches, dim, layerscale)
        self.channel = ChannelMixing(dim, hidden, layerscale, activation)

    def forward(self, x):
        return self.channel(self.token(x))


class _PatchClassifier(nn.Module):
    """What ResMLP and MLP-Mixer share: patches -> blocks -> norm -> mean over patches -> head.

    Subclasses set ``stem``, ``blocks`` (each block with ``token`` and
    ``channel`` sub-blocks), ``norm``, ``head``, ``img_size``, ``in_chans``.
    """

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(self.norm(x).mean(dim=1))

    def autoinit_blocks(self):
        """The embedding and every residual sub-block (the head is left out)."""
        names = ["stem"]
        for i in range(len(self.blocks)):
            names += [f"blocks.{i}.token", f"blocks.{i}.channel"]
        return names

    def example_inputs(self, batch=2, generator=None):
        """Standard-normal images of the right shape (unit-variance pixels)."""
        return torch.randn(batch, self.in_chans, self.img_size, self.img_size, generator=generator)


class ResMLP(_PatchClassifier):
    """ResMLP image classifier; ``resmlp_s12()`` gives the paper's ResMLP-S12 sizes.

    Parameters: ``img_size`` (square images), ``patch_size``, ``in_chans``,
    ``dim`` (channels d), ``depth`` (blocks), ``mlp_ratio`` (hidden = ratio * d),
    ``num_classes``, ``layerscale`` (initial LayerScale value), ``activation``
    ("gelu", "relu", "tanh", "silu"), ``init`` ("fan_in", "original", "torch"),
    ``sigma_w``, ``sigma_b`` (for ``init="fan_in"``), ``seed`` (optional int:
    draw the initial weights from a generator seeded with it).
    """

    def __init__(self, img_size=224, patch_size=16, in_chans=3, dim=384, depth=12, mlp_ratio=4,
                 num_classes=1000, layerscale=0.1, activation="gelu", init="fan_in",
                 sigma_w=math.sqrt(2.0), sigma_b=0.0, seed=None):
        super().__init__()
        for name, v in [("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans),
                        ("dim", dim), ("depth", depth), ("mlp_ratio", mlp_ratio),
                        ("num_classes", num_classes)]:
            _check_int(name, v)
        _check_init(init)
        self.img_size, self.in_chans = img_size, in_chans
        self.stem = PatchEmbed(img_size, patch_size, in_chans, dim)
        P = self.stem.num_patches
        self.blocks = nn.Sequential(*[ResMLPBlock(P, dim, mlp_ratio * dim, layerscale, activation)
                                      for _ in range(depth)])
        self.norm = Affine(dim)
        self.head = nn.Linear(dim, num_classes)
        gen = None if seed is None else torch.Generator().manual_seed(int(seed))
        if init == "fan_in":
            _fan_in_init_(self, float(sigma_w), float(sigma_b), gen)
        elif init == "original":
            self._timm_init(gen)

    def _timm_init(self, gen):
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                with torch.no_grad():
                    if name == "head":
                        m.weight.zero_()
                        m.bias.zero_()
                        continue
                    bound = math.sqrt(6.0 / (m.in_features + m.out_features))
                    m.weight.uniform_(-bound, bound, generator=gen)
                    if name.endswith(("fc1", "fc2")):
                        m.bias.normal_(0.0, 1e-6, generator=gen)
                    else:
                        m.bias.zero_()
            elif isinstance(m, nn.Conv2d):  # lecun normal, truncated at 2 std as in timm
                fan_in = m.weight[0].numel()
                std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
                with torch.no_grad():
                    nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std, generator=gen)
                    m.bias.zero_()


def resmlp_s12(**kwargs):
    """ResMLP-S12: 224x224 images, 16x16 patches, d = 384, 12 blocks, GELU, LayerScale 0.1."""
    cfg = dict(img_size=224, patch_size=16, dim=384, depth=12, mlp_ratio=4, layerscale=0.1)
    cfg.update(kwargs)
    return ResMLP(**cfg)


class _MixerMLP(nn.Module):
    def __init__(self, dim, hidden, activation):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = _activation(activation)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MixerTokenMixing(nn.Module):
    """``x + MLP_over_patches(LayerNorm(x))`` (MLP-Mixer's token-mixing sub-block)."""

    def __init__(self, num_patches, dim, hidden, activation):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = _MixerMLP(num_patches, hidden, activation)

    def forward(self, x):
        return x + self.mlp(self.norm(x).transpose(1, 2)).transpose(1, 2)


class MixerChannelMixing(nn.Module):
    """``x + MLP_over_channels(LayerNorm(x))`` (MLP-Mixer's channel-mixing sub-block)."""

    def __init__(self, dim, hidden, activation):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = _MixerMLP(dim, hidden, activation)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class MixerBlock(nn.Module):
    def __init__(self, num_patches, dim, tokens_hidden, channels_hidden, activation):
        super().__init__()
        self.token = MixerTokenMixing(num_patches, dim, tokens_hidden, activation)
        self.channel = MixerChannelMixing(dim, channels_hidden, activation)

    def forward(self, x):
        return self.channel(self.token(x))


class MLPMixer(_PatchClassifier):
    """MLP-Mixer (Tolstikhin et al. 2021) image classifier; ``mixer_s16()`` gives Mixer-S/16.

    Patch embedding -> ``depth`` blocks of (token mixing, channel mixing), each
    ``x + MLP(LayerNorm(x))`` -> LayerNorm -> mean over patches -> Linear head.
    ``autoinit_blocks()``: the embedding and every residual sub-block (the head
    is left out, as for :class:`ResMLP`). Parameters as for :class:`ResMLP`,
    with ``tokens_hidden`` and ``channels_hidden`` the two MLP widths;
    ``init`` is "fan_in" (default) or "torch".
    """

    def __init__(self, img_size=224, patch_size=16, in_chans=3, dim=512, depth=8, tokens_hidden=256,
                 channels_hidden=2048, num_classes=1000, activation="gelu", init="fan_in",
                 sigma_w=math.sqrt(2.0), sigma_b=0.0, seed=None):
        super().__init__()
        for name, v in [("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans),
                        ("dim", dim), ("depth", depth), ("tokens_hidden", tokens_hidden),
                        ("channels_hidden", channels_hidden), ("num_classes", num_classes)]:
            _check_int(name, v)
        if _check_init(init) == "original":
            raise ValueError("init='original' is not defined for MLPMixer; choose 'fan_in' or 'torch'")
        self.img_size, self.in_chans = img_size, in_chans
        self.stem = PatchEmbed(img_size, patch_size, in_chans, dim)
        P = self.stem.num_patches
        self.blocks = nn.Sequential(*[MixerBlock(P, dim, tokens_hidden, channels_hidden, activation)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        if init == "fan_in":
            gen = None if seed is None else torch.Generator().manual_seed(int(seed))
            _fan_in_init_(self, float(sigma_w), float(sigma_b), gen)


def mixer_s16(**kwargs):
    """Mixer-S/16: 224x224 images, 16x16 patches, d = 512, 8 blocks, MLP widths 256 / 2048."""
    cfg = dict(img_size=224, patch_size=16, dim=512, depth=8, tokens_hidden=256, channels_hidden=2048)
    cfg.update(kwargs)
    return MLPMixer(**cfg)


VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
             512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin, cout, batch_norm=True):
        layers = [nn.Conv2d(cin, cout, kernel_size=3, padding=1)]
        if batch_norm:
            layers.append(nn.BatchNorm2d(cout))
        layers.append(nn.ReLU())
        super().__init__(*layers)


class VGG(nn.Module):
    """VGG with optional BatchNorm; ``vgg19_bn()`` gives VGG19_BN.

    Parameters: ``cfg`` (channel numbers and "M" for max-pool), ``width``
    (multiplier on every channel number, e.g. 0.125 for a small test model),
    ``in_chans``, ``num_classes``, ``hidden`` (classifier width, 4096 in the
    original), ``pool_size`` (adaptive average pool output, 7 for 224x224
    inputs, 1 for CIFAR-sized ones), ``dropout``, ``batch_norm``, ``img_size``
    (only used by :meth:`example_inputs`), ``init`` ("original" = torchvision,
    "fan_in", "torch"), ``sigma_w``, ``sigma_b``, ``seed``.
    """

    def __init__(self, cfg=VGG19_CFG, width=1.0, in_chans=3, num_classes=1000, hidden=4096, pool_size=7,
                 dropout=0.5, batch_norm=True, img_size=224, init="original",
                 sigma_w=math.sqrt(2.0), sigma_b=0.0, seed=None):
        super().__init__()
        for name, v in [("in_chans", in_chans), ("num_classes", num_classes), ("hidden", hidden),
                        ("pool_size", pool_size), ("img_size", img_size)]:
            _check_int(name, v)
        if not (isinstance(width, (int, float)) and width > 0):
            raise ValueError(f"width must be a number > 0, got {width!r}")
        _check_init(init)
        self.in_chans, self.img_size = in_chans, img_size
        layers, c = [], in_chans
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                cout = max(1, int(round(v * width)))
                layers.append(ConvBNReLU(c, cout, batch_norm))
                c = cout
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(pool_size)
        self.classifier = nn.Sequential(
            nn.Linear(c * pool_size * pool_size, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes))
        gen = None if seed is None else torch.Generator().manual_seed(int(seed))
        if init == "fan_in":
            _fan_in_init_(self, float(sigma_w), float(sigma_b), gen)
        elif init == "original":
            self._torchvision_init(gen)

    def _torchvision_init(self, gen):
        for m in self.modules():
            with torch.no_grad():
                if isinstance(m, nn.Conv2d):
                    fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
                    m.weight.normal_(0.0, math.sqrt(2.0 / fan_out), generator=gen)
                    m.bias.zero_()
                elif isinstance(m, nn.BatchNorm2d):
                    m.weight.fill_(1.0)
                    m.bias.zero_()
                elif isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, 0.01, generator=gen)
                    m.bias.zero_()

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))

    def autoinit_blocks(self):
        return [f"features.{i}" for i in range(len(self.features))]

    def example_inputs(self, batch=2, generator=None):
        return torch.randn(batch, self.in_chans, self.img_size, self.img_size, generator=generator)


def vgg19_bn(**kwargs):
    """VGG19 with BatchNorm (torchvision layout and initialisation by default)."""
    return VGG(cfg=VGG19_CFG, batch_norm=True, **kwargs)


class PreLNResMLP(nn.Module):
    """A user-style pre-LN residual MLP with its own ``forward`` (the ``from_torch`` example).

    x -> Linear_in; then ``depth`` times x <- mu x + W phi(LayerNorm(x)) + b;
    then an optional read-out. Written as a user would, for the verification
    suite's ``torch_module`` case and the notebook.
    """

    def __init__(self, d_in=32, width=256, depth=6, mu=0.5, activation="gelu", n_out=0):
        super().__init__()
        from .activations import torch_module

        self.inp = nn.Linear(d_in, width)
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(depth)])
        self.acts = nn.ModuleList([torch_module(activation) for _ in range(depth)])
        self.fcs = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.out = nn.Linear(width, n_out) if n_out else None
        self.mu = float(mu)

    def forward(self, x):
        x = self.inp(x)
        for ln, act, fc in zip(self.norms, self.acts, self.fcs):
            x = self.mu * x + fc(act(ln(x)))
        return x if self.out is None else self.out(x)


class PreActBlock(nn.Module):
    """A pre-activation BasicBlock, h -> mu s(h) + conv2(phi(norm2(conv1(phi(norm1(h)))))), written the way
    research code writes it: s is the identity, or (``stride`` > 1 or new channels) the projection
    shortcut, a 1 x 1 convolution of the pre-activation phi(norm1(h)) with that stride."""

    def __init__(self, cin, cout, stride=1, mu=1.0, norm="layer_norm", activation="relu", kernel_size=3):
        super().__init__()

        def make_norm(c):
            # GroupNorm(1, C) is nn.LayerNorm([C, H, W]) without needing the map's size (at initialisation)
            return nn.GroupNorm(1, c) if norm == "layer_norm" else nn.Identity()

        pad = kernel_size // 2
        self.norm1, self.act1 = make_norm(cin), _activation(activation)
        self.conv1 = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=pad)
        self.norm2, self.act2 = make_norm(cout), _activation(activation)
        self.conv2 = nn.Conv2d(cout, cout, kernel_size, padding=pad)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride) if stride != 1 or cin != cout else None
        self.mu = float(mu)

    def forward(self, x):
        a = self.act1(self.norm1(x))
        skip = x if self.shortcut is None else self.shortcut(a)
        return self.mu * skip + self.conv2(self.act2(self.norm2(self.conv1(a))))


class PreActResNet(nn.Module):
    """The pre-activation ResNet (ResNetV2; He et al. 2016) of the partial-Jacobian paper's section 6, sizes
    configurable: a 3 x 3 stem convolution to ``channels[0]``, stages of ``blocks[i]`` :class:`PreActBlock`
    with ``channels[i]`` channels (every stage after the first halves the map in its first block, with a
    projection shortcut), a last norm -> phi, global average pooling and a Linear classifier.
    ``blocks=(18, 18, 18)``, ``channels=(16, 32, 64)`` on 32 x 32 images is ResNet110 (:func:`resnet110`).

    ``norm``: 'layer_norm' (over channels and positions, ``nn.GroupNorm(1, C)``; the paper's LayerNorm
    variant) or 'none'; ``mu``: the skip's strength; ``stem_kernel``: 3 as in the paper (1 makes the stem
    the theory's per-position input layer exactly). The blocks are :func:`meanfield.resnet_v2`'s, which
    :func:`meanfield.from_torch` reads back (the final norm -> phi, the pooling and the classifier are the
    read-out, not blocks, and ``head=False`` leaves them out). Initialisation: torch's defaults, or
    ``init='fan_in'`` with ``sigma_w``, ``sigma_b`` (N(0, sigma_w^2 / fan_in) weights).
    """

    def __init__(self, blocks=(18, 18, 18), channels=(16, 32, 64), mu=1.0, norm="layer_norm", activation="relu",
                 in_chans=3, num_classes=10, stem_kernel=3, head=True, init="torch", sigma_w=math.sqrt(2.0),
                 sigma_b=0.0, seed=None, img_size=32):
        super().__init__()
        from ..layers import RESNET_NORMS

        if isinstance(blocks, int) or isinstance(channels, int) or len(blocks) != len(channels) or not blocks:
            raise ValueError(f"blocks and channels must be sequences of the same length >= 1, got {blocks!r} and "
                             f"{channels!r}")
        for name, seq in (("blocks", blocks), ("channels", channels)):
            for i, v in enumerate(seq):
                _check_int(f"{name}[{i}]", v)
        for name, v in (("in_chans", in_chans), ("num_classes", num_classes), ("stem_kernel", stem_kernel),
                        ("img_size", img_size)):
            _check_int(name, v)
        if stem_kernel % 2 == 0:
            raise ValueError(f"stem_kernel must be odd (zero padding on both edges), got {stem_kernel}")
        check_choice("norm", norm, RESNET_NORMS)
        _check_init(init)
        if not (0 <= float(mu) <= 1):
            raise ValueError(f"mu must be a number in [0, 1], got {mu!r}")
        self.in_chans, self.img_size = in_chans, img_size
        self.stem = nn.Conv2d(in_chans, channels[0], stem_kernel, padding=stem_kernel // 2)
        layers, c = [], channels[0]
        for stage, (n, cout) in enumerate(zip(blocks, channels)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(PreActBlock(c, cout, stride, mu, norm, activation))
                c = cout
        self.blocks = nn.Sequential(*layers)
        self.head = None
        if head:
            self.head = nn.Sequential(nn.GroupNorm(1, c) if norm == "layer_norm" else nn.Identity(),
                                      _activation(activation), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                      nn.Linear(c, num_classes))
        if init == "fan_in":
            _fan_in_init_(self, float(sigma_w), float(sigma_b),
                          None if seed is None else torch.Generator().manual_seed(int(seed)))

    def forward(self, x):
        h = self.blocks(self.stem(x))
        return h if self.head is None else self.head(h)

    def autoinit_blocks(self):
        return ["stem"] + [f"blocks.{i}" for i in range(len(self.blocks))]

    def example_inputs(self, batch=2, generator=None):
        return torch.randn(batch, self.in_chans, self.img_size, self.img_size, generator=generator)


def resnet110(**kwargs):
    """ResNet110 as the partial-Jacobian paper trains it (section 6): 3 stages of 18 pre-activation
    BasicBlocks, 16, 32, 64 channels, LayerNorm in place of BatchNorm, CIFAR-sized inputs."""
    return PreActResNet(blocks=(18, 18, 18), channels=(16, 32, 64), **kwargs)
