"""The block menu: the MLP block (with its norms and stages), the ResMLP and the MLP-Mixer blocks,
built from the primitives like any user tree.
"""
from __future__ import annotations

import numpy as np

from .._validate import check_choice, check_int
from ..activations import Activation, activation as make_activation
from .attention import Attention
from .base import Primitive
from .combinators import Chain, Residual, residual
from .conv import conv
from .elementwise import ActivationLayer, Scale
from .linear import Dense
from .norms import BatchNorm, LayerNormPost, LayerNormPre, layer_norm

__all__ = ["mlp_block", "resmlp_block", "mixer_block", "mlp", "resmlp", "mixer", "resnet_v2", "RESNET_NORMS",
           "transformer", "TRANSFORMER_NORMS"]

#: where a transformer block puts its LayerNorms: before each sublayer, inside the residual branch ('pre',
#: the ViT's), or after each residual sum ('post', the original transformer's)
TRANSFORMER_NORMS = ("pre", "post")

#: the normalisations of :func:`resnet_v2`: over (channels, positions) as torch's nn.LayerNorm([C, H, W]) or
#: nn.GroupNorm(G, C) write it, or none
RESNET_NORMS = ("layer_norm", "none")

_STAGES = {
    "none": lambda act: [act, Dense()],
    "ln_pre": lambda act: [LayerNormPre(), act, Dense()],
    "ln_post": lambda act: [act, LayerNormPost(), Dense()],
    "bn": lambda act: [BatchNorm(), act, Dense()],
}


def _stage(phi: Activation, norm: str) -> list:
    """One norm -> phi -> Dense stage of an MLP block."""
    check_choice("norm", norm, tuple(_STAGES))
    return _STAGES[norm](ActivationLayer(make_activation(phi)))


def mlp_block(phi, norm: str = "none", residual: bool = False, stages: int = 1) -> Primitive:
    """h^{l+1} = W phi(norm(h^l)) + b (+ mu h^l): eq. 1 of the partial-Jacobian paper.

    ``stages`` > 1 repeats norm -> phi -> Dense inside one residual branch
    (``stages=2`` with ``norm='bn'`` is the pre-activation ResNet block of
    partial-Jacobian eq. 26).
    """
    layers = []
    for _ in range(stages):
        layers += _stage(phi, norm)
    chain = Chain(tuple(layers))
    return Residual(chain) if residual else chain


def resmlp_block(phi, residual: bool = True) -> Primitive:
    """ResMLP block at initialisation (AutoInit appendix D.1, eqs. 49-56).

    AffineNorms are the identity at initialisation; LayerScale is eps; both
    skips have strength mu:
        c = eps (W1 a + B1) + mu a            (token-mixing linear, eq. 51)
        h = eps (W3 phi(W2 c + B2) + B3) + mu c  (channel MLP, eq. 56)
    """
    first = Chain((Dense(axis="tokens"), Scale()))
    second = Chain((Dense(), ActivationLayer(phi), Dense(), Scale()))
    if residual:
        return Chain((Residual(first), Residual(second)))
    return Chain(first.layers + second.layers)


def mixer_block(phi, residual: bool = True) -> Primitive:
    """MLP-Mixer block (partial-Jacobian appendix H, eqs. 82-89).

    Token mixing then channel mixing, each LayerNorm -> Dense -> phi -> Dense
    with a skip of strength mu:
        h' = W2 phi(W1 LN(h) + b1) + b2 + mu h
    The LayerNorms run over the channels of each token, and the token-mixing
    weights and biases are shared by all channels, so the state is that of a
    pair of channels of one token (``pair_axis='channels'``): the token MLP
    gives the pair a common part (covariance sigma_w^2 E[phi(u)phi(v)] +
    sigma_b^2) that the next channel LayerNorm removes, chi = 1/(K - K12).

    Limits of validity (docs/theory.md, "MLP-Mixer"). The limit is tokens and
    channels -> infinity together. The recursion is that limit only when no
    channel carries a part common to all tokens, which holds exactly for
    sigma_b = 0 with an odd activation (E[phi] = 0: erf, tanh, linear) and
    uncorrelated input tokens; then K12 stays 0 and the LayerNorm is the
    plain 1/K. With sigma_b > 0 or
    E[phi] != 0, the embedding and channel-mixing biases and E[phi] through
    the channel-mixing weights (all shared by the tokens) give each channel
    such a part; it survives the channel LayerNorm and makes the token MLP's
    preactivation variance random per channel, which this state drops. The
    recursion is then an approximation: for GELU at (sigma_w, sigma_b, mu) =
    (1.3, 0.2, 0.5) it gives chi_J = 1.261 where 20-block Monte Carlo at
    512 channels x 512 tokens gives 1.337 +- 0.003, a gap that does not
    shrink with the width. :meth:`Architecture.mixer_limit_is_exact` says
    which case applies.
    """
    sub = Chain((LayerNormPre(axis="channels"), Dense(axis="tokens"), ActivationLayer(phi),
                 Dense(axis="tokens")))
    sub2 = Chain((LayerNormPre(axis="channels"), Dense(axis="channels"), ActivationLayer(phi),
                  Dense(axis="channels")))
    if residual:
        return Chain((Residual(sub), Residual(sub2)))
    return Chain(sub.layers + sub2.layers)


def mlp(phi="relu", norm: str = "none", residual: bool = False, stages: int = 1) -> Primitive:
    """The MLP block of the menu: ``stages`` x (norm -> phi -> dense), optionally with a skip."""
    return mlp_block(make_activation(phi), norm, residual, stages)


def resmlp(phi="gelu", residual: bool = True) -> Primitive:
    """The ResMLP block at initialisation (:func:`resmlp_block`)."""
    return resmlp_block(make_activation(phi), residual)


def mixer(phi="gelu", residual: bool = True) -> Primitive:
    """The MLP-Mixer block (:func:`mixer_block`)."""
    return mixer_block(make_activation(phi), residual)


def resnet_v2(blocks=(2, 2, 2), phi="relu", norm: str = "layer_norm", mu=None, kernel_size: int = 3,
              padding: str = "same", dims: int = 2) -> Chain:
    """The body of a pre-activation ResNet (ResNetV2; He et al. 2016, "Identity mappings in deep residual
    networks"), after its stem: ``len(blocks)`` stages of ``blocks[i]`` BasicBlocks,

        h -> mu h + conv(phi(norm(conv(phi(norm(h)))))),

    k x k convolutions (k = ``kernel_size``) with zero padding ('same', as torch's ``padding=k // 2``) or
    ``padding='circular'``. Every stage after the first halves the
    positions in its first block: the branch's first convolution has stride 2, and the skip is the projection
    shortcut of option (B), a strided 1 x 1 convolution of the same pre-activation phi(norm(h)).
    ``blocks=(18, 18, 18)`` is the partial-Jacobian paper's ResNet110 (section 6, Fig. 4), whose BatchNorm is
    replaced by a LayerNorm over (channels, positions); the channel counts (16, 32, 64 there) do not enter the
    infinite-channel theory. ``norm``: one of :data:`RESNET_NORMS`; ``dims``: 2 for images, 1 for sequences.

    Returns the tree (a serial of :func:`residual` nodes), for ``Network(resnet_v2(...))``;
    :class:`meanfield.torch.models.PreActResNet` is the same network in torch, which :func:`from_torch`
    reads back as this tree.
    """
    if isinstance(blocks, (int, np.integer)) or not len(blocks):
        raise ValueError(f"blocks must be a sequence of integers >= 1 (blocks per stage), got {blocks!r}")
    for i, b in enumerate(blocks):
        check_int(f"blocks[{i}]", b, 1)
    check_choice("norm", norm, RESNET_NORMS)
    check_int("kernel_size", kernel_size, 1)
    check_choice("dims", dims, (1, 2))
    check_choice("padding", padding, ("same", "circular"))
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size={kernel_size}: an even kernel pads its two edges unequally; use an odd one")
    phi = make_activation(phi)
    k, one = (kernel_size,) * dims, (1,) * dims

    def pre():
        return ([layer_norm(axis="positions")] if norm == "layer_norm" else []) + [ActivationLayer(phi)]

    out = []
    for stage, n in enumerate(blocks):
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            branch = pre() + [conv(k, stride=stride, padding=padding)] + pre() + [conv(k, padding=padding)]
            shortcut = pre() + [conv(one, stride=2)] if stride == 2 else None
            out.append(residual(*branch, mu=mu, shortcut=shortcut))
    return Chain(tuple(out))


def transformer(phi="gelu", norm: str = "pre", attention: Attention | None = None, mlp: bool = True,
                mu=None) -> Chain:
    """A transformer encoder block over the tokens (Vaswani et al. 2017; the ViT's, Dosovitskiy et al. 2021):

        'pre':   h -> mu h + A(LN(h)),     then  h -> mu h + W2 phi(W1 LN(h) + b1) + b2
        'post':  h -> LN(mu h + A(h)),     then  h -> LN(mu h + W2 phi(W1 h + b1) + b2)

    with A the self-attention sublayer ``attention`` (default ``attention()``: one head,
    independent query and key weights, 1/d_h logits; see its notes for the limits) and LN the LayerNorm over
    each token's channels. ``mlp=False`` drops the MLP sublayer (stacked attention, as in the partial-Jacobian
    paper's appendix C). ``mu``: the residual strength (None: the symbol mu, set by ``Network(mu=)``).
    Returns the tree, for ``Network(transformer(...))``; inputs are (n, T, d) arrays of tokens.
    """
    check_choice("norm", norm, TRANSFORMER_NORMS)
    if not isinstance(mlp, (bool, np.bool_)):
        raise ValueError(f"mlp must be True or False, got {mlp!r}")
    if attention is None:
        from .attention import attention as make_attention

        attention = make_attention()
    if not isinstance(attention, Attention):
        raise ValueError(f"attention must be an attention(...) node, got {attention!r}")
    sublayers = [[attention]] + ([[Dense(), ActivationLayer(make_activation(phi)), Dense()]] if mlp else [])
    out = []
    for layers in sublayers:
        if norm == "pre":
            out.append(residual(layer_norm(), *layers, mu=mu))
        else:
            out += [residual(*layers, mu=mu), layer_norm()]
    return Chain(tuple(out))
