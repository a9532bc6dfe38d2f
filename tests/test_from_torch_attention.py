"""from_torch on transformers: nn.MultiheadAttention read as the standard 1/sqrt(d_h) attention, and Monte Carlo of
the user's own model against the walk over tokens."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield.torch import from_torch, initialise_  # noqa: E402
from meanfield.torch.from_torch import monte_carlo_module  # noqa: E402
from torch import nn  # noqa: E402

pytestmark = pytest.mark.torch


class Block(nn.Module):
    """A pre-LN transformer block as research code writes it."""

    def __init__(self, d, heads, mu, **attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True, **attention)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.mu = mu

    def forward(self, x):
        a = self.ln1(x)
        x = self.mu * x + self.att(a, a, a, need_weights=False)[0]
        return self.mu * x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    """Token embedding, then ``depth`` blocks (no head)."""

    def __init__(self, d=32, heads=4, depth=3, mu=0.8, d_in=12, **attention):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(*[Block(d, heads, mu, **attention) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(self.embed(x))


def _tokens(n=1, T=8, d=12, seed=0):
    return torch.randn(n, T, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_multihead_attention_reads_as_the_standard_layer():
    net = from_torch(ViT(heads=4).double().eval(), _tokens())
    s = "sigma_w"
    att = mf.attention(4, scaling="1/sqrt(d)", sigma_q=s, sigma_k=s, sigma_v=s)
    # torch's LayerNorm before a sublayer sees a preactivation: layer_norm('pre'), the map of transformer()'s
    block = mf.serial(mf.residual(mf.layer_norm("pre"), att, mu=0.8),
                      mf.residual(mf.layer_norm("pre"), mf.dense(), mf.act("gelu"), mf.dense(), mu=0.8))
    assert net == mf.Network(block, depth=3)


def test_what_the_theory_has_not_is_refused_by_name():
    x = _tokens()
    for kwargs, match in ((dict(add_bias_kv=True), "add_bias_kv"),
                          (dict(dropout=0.1), "dropout")):
        model = ViT(**kwargs).double().train()
        with pytest.raises(ValueError, match=match):
            from_torch(model, x)
    model = ViT().double()
    with torch.no_grad():
        model.blocks[0].att.in_proj_bias.fill_(0.1)
    with pytest.raises(ValueError, match="in_proj_bias is not 0"):
        from_torch(model, x)

    class TokensFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.att = nn.Linear(12, 8), nn.MultiheadAttention(8, 2)

        def forward(self, x):
            h = self.embed(x)
            return self.att(h, h, h)[0]

    with pytest.raises(ValueError, match="batch_first=False"):
        from_torch(TokensFirst().double(), x)

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(12, 8), nn.Linear(12, 8)
            self.att = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.att(self.a(x), self.b(x), self.b(x))[0]

    with pytest.raises(ValueError, match="besides its input"):
        from_torch(Cross().double(), x)

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.att = nn.Linear(12, 8), nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            h = self.embed(x)
            return self.att(h, h, h, is_causal=True, attn_mask=torch.ones(8, 8).triu(1).bool())[0]

    with pytest.raises(ValueError, match="besides its input"):
        from_torch(Masked().double(), x)


def test_initialise_draws_the_projections_without_their_biases():
    model = ViT(d=64, heads=4).double()
    initialise_(model, sigma_w=1.3, sigma_b=0.2, generator=torch.Generator().manual_seed(0))
    att = model.blocks[0].att
    assert torch.all(att.in_proj_bias == 0)
    w = att.in_proj_weight.detach()
    # 3 x 64 x 64 entries of variance 1.3^2 / 64: the sample variance within 5 %
    assert abs(float(w.var()) * 64 / 1.3**2 - 1) < 0.05
    assert abs(float(att.out_proj.bias.detach().std()) / 0.2 - 1) < 0.3


@pytest.mark.slow
def test_monte_carlo_of_the_users_vit_follows_the_walk_over_tokens():
    """A user's pre-LN ViT (20 blocks, 512 channels, 8 heads of 64, nn.MultiheadAttention) on one input of 8
    tokens, 16 draws of initialise_: K^l and J^{1,l} at every block against token_jacobians of from_torch's
    network (sampled 1/sqrt(d) theory), within 4 combined standard errors + 2 l / width relative. The APJN
    probes run attention by its composite kernel (the fused one has no forward-mode derivative). Measured
    max |z|: K 1.8; J 2.7 (the J excess is common to all blocks: it is set in the first ones and carried)."""
    from meanfield.gram.tokens import token_jacobians

    sw, sb, width, depth = 1.1, 0.1, 512, 20
    model = ViT(d=width, heads=8, depth=depth, mu=0.8).double().eval()
    x = _tokens()
    net = from_torch(model, x)
    r = monte_carlo_module(model, x, sw, sb, n_init=16, seed=4)
    th = token_jacobians(net, x.numpy(), depth + 1, sw, sb)
    layers = np.arange(1, depth + 2)
    for q, mc, se in (("K", r.K, r.K_se), ("J", r.J, r.J_se)):
        t, st = th[q][:, 0], th[q + "_se"][:, 0]
        bad = np.abs(mc - t) > 4.0 * np.hypot(se, st) + 2.0 * layers / width * np.abs(t)
        assert not bad.any(), (q, layers[bad], mc[bad], t[bad], se[bad])


@pytest.mark.slow
def test_autoinit_tunes_a_model_with_multihead_attention():
    """AutoInit's APJN probes (forward mode) run through nn.MultiheadAttention, whose fused kernels have no
    forward-mode derivative (they used to raise NotImplementedError): 60 steps at mu = 0.7 bring every
    J^{l,l+1} closer to 1."""
    from meanfield.torch import autoinit

    model = ViT(d=32, heads=4, depth=3, mu=0.7).double()
    _, report = autoinit(model, _tokens(n=8), steps=60, progress=False)
    before, after = np.abs(np.log(report.J_before)), np.abs(np.log(report.J_after))
    assert np.all(np.isfinite(after)) and after.max() < before.max(), (report.J_before, report.J_after)
