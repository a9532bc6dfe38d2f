"""Self-attention (meanfield/layers/attention.py): its rules over the tokens, its limits, its torch realisation.

Independent routes:
* tied weights on tokens of equal norms and overlaps: the closed form derived by hand
  (``references.tied_attention_walk``, 40-digit mpmath);
* independent query and key weights: the token average computed straight from the inputs;
* the NNGP and NTK of two inputs against the empirical kernels of realised networks (torch.func);
* Monte Carlo at depth 20 and 512 channels: K^l, J^{l,l+1} and J^{1,l}, the path through the softmax
  weights included in the networks' tangents (the theory drops it as O(1 / d_h)).
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R
from meanfield.gram.tokens import token_correlations, token_jacobians, token_state

DEEP, WIDE = 20, 512


def _orthonormal_tokens(T, d, seed=0):
    """One input of T orthogonal tokens of squared norm d (x_t . x_u / d = delta_tu)."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, T)))
    return (q.T * np.sqrt(d))[None]


@pytest.mark.parametrize("c, sv, so, sb, T", [(1.3 * 0.9, 1.1, 1.2, 0.3, 5), (4.0, 1.0, 0.9, 0.0, 3),
                                              (0.2, 1.4, 1.0, 0.5, 8)])
def test_tied_attention_on_orthonormal_tokens_is_the_closed_form(c, sv, so, sb, T):
    """A chain of tied attention layers on orthonormal tokens keeps A = a I + b 1 1^T; every entry, the
    per-layer factor J^{l,l+1} and the cumulative J^{1,l} equal the hand-derived walk to 1e-13."""
    mp.mp.dps = 40
    net = mf.Network(mf.attention(tied=True, sigma_q=c, sigma_k=1.0, sigma_v=sv, sigma_o=so))
    sw, depth = 1.25, 7
    x = _orthonormal_tokens(T, 16)
    ref = R.tied_attention_walk(sw**2, sb**2, T, c, (sv * so) ** 2, sb**2, depth - 1)
    a, b = (float(z) for z in ref[-1][:2])       # A^depth, after depth - 1 layers
    A = token_state(net, x, depth, sw, sb, ntk=False)["A"][0, :, 0, :]
    np.testing.assert_allclose(A, a * np.eye(T) + b, rtol=1e-13)
    J = token_jacobians(net, x, depth, sw, sb)      # rows l = 1..depth
    ref = R.tied_attention_walk(sw**2, sb**2, T, c, (sv * so) ** 2, sb**2, depth)
    want_J = [1.0] + [float(v + w) for _, _, v, w in ref[:-1]]
    np.testing.assert_allclose(J["J"][:, 0], want_J, rtol=1e-13)
    # J^{l,l+1} from V = I at the state A^l: s2 (alpha^2 + r (1 + alpha)), the first entry of each layer's walk
    states = [(sw**2, sb**2)] + [(float(p), float(q)) for p, q, _, _ in ref[:-1]]
    chi = [float(sum(R.tied_attention_walk(p, q, T, c, (sv * so) ** 2, sb**2, 1)[0][2:])) for p, q in states]
    np.testing.assert_allclose(J["chi_J"][:, 0], chi, rtol=1e-13)


def test_independent_queries_and_keys_average_the_tokens():
    """W_K independent of W_Q: the logits vanish at infinite width and every output token is the token mean,
    A'[(x, t), (x', t')] = sigma_o^2 sigma_v^2 mean_{u, u'} A[(x, u), (x', u')] + sigma_b^2 for all t, t'
    (computed here from the inputs), whatever the heads."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6, 5)) * rng.uniform(0.3, 2.0, size=(3, 6, 1))
    sw, sb, sv = 1.1, 0.4, 0.7
    A1 = sw**2 * np.einsum("atk,bsk->atbs", x, x) / 5 + sb**2
    want = (sw * sv) ** 2 * A1.mean(axis=(1, 3)) + sb**2
    for heads in (1, 3):
        st = token_state(mf.Network(mf.attention(heads, sigma_v=sv)), x, 2, sw, sb, ntk=False)
        np.testing.assert_allclose(st["A"], np.broadcast_to(want[:, None, :, None], st["A"].shape), rtol=1e-14)
        assert not st["B"].any()


def test_what_is_refused_is_refused_by_name():
    net = mf.Network(mf.residual(mf.layer_norm(), mf.attention(tied=True), mu=0.5))
    with pytest.raises(ValueError, match="attention weights depend on the covariance between the tokens"):
        mf.critical_line(net, sigma_w=1.0)
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    kw = dict(depth=3, sigma_w=1.0, sigma_b=0.1)
    standard = mf.Network(mf.residual(mf.layer_norm(), mf.attention(scaling="1/sqrt(d)"), mu=0.5))
    with pytest.raises(ValueError, match=r"NTK of 1/sqrt\(d_h\) attention.*get='nngp'"):
        mf.kernels(standard, x, **kw)
    tied = mf.Network(mf.residual(mf.layer_norm(), mf.attention(tied=True, scaling="1/sqrt(d)"), mu=0.5))
    with pytest.raises(ValueError, match="grows like sqrt"):
        mf.kernels(tied, x, get="nngp", **kw)
    with pytest.raises(ValueError, match="sampled"):
        mf.position_fixed_point(standard, 3, 1.0, 0.1)
    coarse = mf.Network(mf.residual(mf.layer_norm(), mf.attention(scaling="1/sqrt(d)", sigma_q=3.0, samples=16,
                                                                  rtol=1e-4), mu=0.5))
    with pytest.raises(ValueError, match="relative standard error .* above rtol=0.0001; give the attention node "
                                         "more samples"):
        mf.kernels(coarse, x, get="nngp", **kw)


def test_sqrt_d_attention_on_two_tokens_is_the_quadrature():
    """One 1/sqrt(d_h) layer on an input of two tokens: the mean and the diagonal of the token kernel and the
    APJN factor (the path through the softmax weights included) against the hand-derived 2-D Gaussian
    quadrature (``references.sqrt_attention_two_tokens``), within 4 of the reported standard errors, which
    are below 0.2 %."""
    x = np.random.default_rng(5).standard_normal((1, 2, 6))
    sw, sb = 1.2, 0.3
    net = mf.Network(mf.attention(scaling="1/sqrt(d)", sigma_q=1.3, sigma_k=0.9, sigma_v=1.1, sigma_o=1.2))
    A1 = sw**2 * x[0] @ x[0].T / 6 + sb**2
    A, V = R.sqrt_attention_two_tokens(A1.tolist(), np.eye(2).tolist(), 1.3 * 0.9, (1.1 * 1.2) ** 2, sb**2)
    A, V = np.array(A, dtype=float), np.array(V, dtype=float)
    mean = mf.kernels(net, x, depth=2, sigma_w=sw, sigma_b=sb, get="nngp")
    flat = mf.kernels(net, x, depth=2, sigma_w=sw, sigma_b=sb, get="nngp", readout="flatten")
    jac = token_jacobians(net, x, 2, sw, sb)
    for got, se, want in ((mean.nngp[0, 0], mean.nngp_se[0, 0], A.mean()),
                          (flat.nngp[0, 0], flat.nngp_se[0, 0], np.trace(A) / 2),
                          (jac["chi_J"][0, 0], jac["chi_J_se"][0, 0], np.trace(V) / 2)):
        assert abs(got - want) <= 4 * se and se < 2e-3 * want, (got, se, want)
    # the value path alone (P V P^T) would be far off: the softmax path is O(1) with 1/sqrt(d_h) logits
    assert np.trace(V) / 2 > 1.1 * (1.1 * 1.2) ** 2 * 0.5


def test_bad_arguments_name_themselves():
    for kw, match in ((dict(heads=0), "heads"), (dict(heads=2.5), "heads"), (dict(tied="yes"), "tied"),
                      (dict(scaling="1/d^2"), "scaling"), (dict(sigma_q=-1.0), "sigma_q"),
                      (dict(sigma_v=float("nan")), "sigma_v"), (dict(sigma_o="sigma_q"), "sigma_o"),
                      (dict(samples=8), "samples"), (dict(rtol=0.0), "rtol")):
        with pytest.raises(ValueError, match=match):
            mf.attention(**kw)


def test_repr_and_json_round_trip():
    node = mf.attention(4, tied=True, scaling="1/sqrt(d)", sigma_q=1.5, sigma_o=0.8, sigma_b=0.0)
    assert repr(node) == "attention(heads=4, tied=True, scaling='1/sqrt(d)', sigma_q=1.5, sigma_o=0.8, sigma_b=0)"
    assert repr(mf.attention()) == "attention()"
    net = mf.Network(mf.serial(mf.residual(mf.layer_norm(), node, mu=0.9),
                               mf.residual(mf.layer_norm(), mf.dense(), mf.act("gelu"), mf.dense(), mu=0.9)))
    assert mf.from_json(mf.to_json(net)).block_spec() == net.block_spec()
    assert eval(repr(node), vars(mf)) == node


def test_transformer_blocks_are_the_trees_they_say():
    att = mf.attention(2, tied=True)
    pre = mf.transformer("relu", "pre", att, mu=0.5)
    assert repr(pre) == ("serial(residual(layer_norm(), attention(heads=2, tied=True), mu=0.5), "
                         "residual(layer_norm(), dense(), act('relu'), dense(), mu=0.5))")
    post = mf.transformer("relu", "post", att, mlp=False)
    assert repr(post) == "serial(residual(attention(heads=2, tied=True)), layer_norm())"
    assert repr(mf.transformer()) == ("serial(residual(layer_norm(), attention()), "
                                      "residual(layer_norm(), dense(), act('gelu'), dense()))")
    net = mf.Network(mf.transformer("gelu", "post", att), mu=0.9)
    assert mf.from_json(mf.to_json(net)).block_spec() == net.block_spec()
    for kw, match in ((dict(norm="sandwich"), "norm"), (dict(mlp="yes"), "mlp"),
                      (dict(attention=mf.dense()), "attention must be an attention")):
        with pytest.raises(ValueError, match=match):
            mf.transformer(**kw)


def test_a_layer_norm_over_the_features_needs_no_weights_after_it():
    """Its divisor is deterministic at infinite width, so a block may end in it (post-LN); a LayerNorm over
    the tokens or the positions is still guarded, and a residual branch still may not end in one."""
    mf.serial(mf.residual(mf.dense(), mu=0.5), mf.layer_norm())
    with pytest.raises(ValueError, match="not followed by a dense layer"):
        mf.serial(mf.residual(mf.dense(), mu=0.5), mf.layer_norm(axis="positions"))
    with pytest.raises(ValueError, match="its branch ends in layer_norm"):
        mf.residual(mf.dense(), mf.layer_norm())


# ---------------------------------------------------------------------------
# Against realised networks.
# ---------------------------------------------------------------------------
def _transformer(attention, mu=0.8, phi="gelu"):
    """A pre-LN transformer block: x + attention(LN(x)), then x + W2 phi(W1 LN(x))."""
    return mf.Network(mf.serial(mf.residual(mf.layer_norm(), attention, mu=mu),
                                mf.residual(mf.layer_norm(), mf.dense(), mf.act(phi), mf.dense(), mu=mu)))


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("param", ["ntk", "standard"])
def test_kernels_of_two_inputs_are_the_empirical_kernels(param):
    """NNGP and NTK of three inputs of 4 tokens through two pre-LN blocks (two heads, 512 channels, 32
    initialisations) against torch.func's empirical kernels: within 4.5 standard errors + 3 % (the
    finite-width bias). The 'standard' case puts every projection at the scanned sigma_w, as reading its
    NTK off the draws' gradients needs. Measured max |z|: NNGP 1.9 / 2.1, NTK 1.9 / 2.0."""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    s = "sigma_w" if param == "standard" else 1.5
    net = _transformer(mf.attention(2, tied=True, sigma_q=s, sigma_k=s, sigma_v=s if param == "standard" else 1.0))
    x = np.random.default_rng(1).standard_normal((3, 4, 6))
    kw = dict(depth=3, sigma_w=1.2, sigma_b=0.1, parameterization=param)
    e = empirical_kernels(net, x, width=WIDE, n_init=32, n_outputs=2, seed=0, **kw)
    r = mf.kernels(net, x, width=WIDE, **kw)
    for q in ("nngp", "ntk"):
        got, se, want = getattr(e, q), getattr(e, q + "_se"), getattr(r, q)
        scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
        bad = np.abs(got - want) > 4.5 * se + 0.03 * scale
        assert not bad.any(), (q, got, want, se)


STANDARD = mf.attention(8, scaling="1/sqrt(d)", sigma_q=1.5, sigma_k=1.5)

CASES = {
    # sharp tied attention in pre-LN blocks with their MLPs
    "tied-pre-ln-gelu": (_transformer(mf.attention(tied=True, sigma_q=1.5, sigma_k=1.5)), 1.2, 0.1),
    # four heads, the token average, behind a LayerNorm
    "independent-heads-relu": (_transformer(mf.attention(4), mu=0.9, phi="relu"), 1.3, 0.2),
    # no residual: attention after tanh, the logits of a non-Gaussian input
    "tied-tanh-chain": (mf.Network(mf.serial(mf.act("tanh"), mf.attention(tied=True, sigma_q=2.0))), 1.5, 0.1),
    # post-LN blocks end in a LayerNorm with no fresh weights after it (chi still factorises)
    "post-ln-relu": (mf.Network(mf.transformer("relu", "post", mf.attention(2, tied=True, sigma_q=1.5, sigma_k=1.5)),
                                mu=0.8), 1.3, 0.2),
    # stacked post-LN attention without bias: the tokens collapse and J^{1,l} stays 1
    "post-ln-attention-only": (mf.Network(mf.transformer(norm="post", attention=mf.attention(tied=True, sigma_q=2.0),
                                                         mlp=False), mu=0.6), 1.0, 0.0),
    # standard 1/sqrt(d_h) logits, 8 heads: sampled expectations, the softmax path carried
    "sqrt-pre-ln": (mf.Network(mf.transformer("gelu", "pre", STANDARD), mu=0.8), 1.2, 0.1),
    "sqrt-post-ln-attention-only": (mf.Network(mf.transformer(norm="post", attention=STANDARD, mlp=False), mu=0.7),
                                    1.0, 0.0),
    "sqrt-tanh-chain": (mf.Network(mf.serial(mf.act("tanh"), STANDARD)), 1.5, 0.1),
}


@pytest.mark.torch
@pytest.mark.slow
def test_sqrt_d_kernels_of_two_inputs_are_the_empirical_kernels():
    """The NNGP of three inputs of 4 tokens through 20 pre-LN blocks with 1/sqrt(d_h) attention (8 heads, 512
    channels, 32 initialisations) against torch.func's empirical kernel, within 4.5 combined standard errors +
    2 l / width. Measured max |z|: 0.7 at depth 3, 0.7 at depth 20."""
    pytest.importorskip("torch")
    from meanfield.verification.gram import empirical_kernels

    net = mf.Network(mf.transformer("gelu", "pre", STANDARD), mu=0.8)
    x = np.random.default_rng(1).standard_normal((3, 4, 6))
    kw = dict(depth=DEEP, sigma_w=1.2, sigma_b=0.1, get="nngp")
    e = empirical_kernels(net, x, width=WIDE, n_init=32, seed=0, **kw)
    r = mf.kernels(net, x, **kw)
    scale = np.sqrt(np.outer(np.diag(r.nngp), np.diag(r.nngp)))
    bad = np.abs(e.nngp - r.nngp) > 4.5 * np.hypot(e.nngp_se, r.nngp_se) + 2 * DEEP / WIDE * scale
    assert not bad.any(), (e.nngp, r.nngp, e.nngp_se, r.nngp_se)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", list(CASES))
def test_monte_carlo_deep_wide(name):
    """K^l, J^{l,l+1} and J^{1,l} for l = 1..20 within the suite's rule |MC - theory| <= 4 SE + 2 (l / width)
    |theory| (16 initialisations, 8 orthonormal tokens, 512 channels). The networks' tangents carry the path
    through the softmax weights, which the 1/d_h theory drops and the 1/sqrt(d_h) theory carries; the standard
    error of a sampled theory adds to the Monte Carlo's in quadrature. Measured max |z| (K, chi_J, J) in the
    order of CASES: 2.6, 3.1, 2.4; 2.2, 2.0, 1.4; 3.0, 3.0, 1.9; -, 1.4, 2.4; -, 2.5, 2.9; 3.0, 2.2, 1.9;
    -, 2.1, 1.1; 2.1, 3.3, 1.3 (after a closing LayerNorm K = 1 to rounding and its standard error is ~0: the
    rule's width term decides). Without the softmax path the 1/sqrt(d_h) theory's J^{1,2} of 'sqrt-pre-ln'
    would be 1.38 against 3.12 +- 0.12 measured (2.89 with it)."""
    pytest.importorskip("torch")
    from meanfield.verification import monte_carlo
    from meanfield.verification._batched import make_inputs

    net, sw, sb = CASES[name]
    r = monte_carlo(net, sw, sb, depth=DEEP, width=WIDE, n_init=16, tokens=8, seed=3, device="cpu")
    x, _ = make_inputs(1, 8, r.input_dim, 0.0, 3)
    th = token_jacobians(net, x.numpy(), DEEP, sw, sb)
    layers = np.arange(1, DEEP + 1)
    for q, mc, se in (("K", r.K, r.K_se), ("chi_J", r.chi_J, r.chi_J_se), ("J", r.J, r.J_se)):
        t = th[q][:, 0]
        se = np.hypot(se, th[f"{q}_se"][:, 0]) if f"{q}_se" in th else se
        bad = np.abs(mc - t) > 4.0 * se + 2.0 * layers / WIDE * np.abs(t)
        assert not bad.any(), (q, layers[bad], mc[bad], t[bad], se[bad])


@pytest.mark.slow
@pytest.mark.torch
def test_the_softmax_path_is_a_finite_width_correction():
    """The theory drops the path through the softmax weights (module notes: O(1 / d_h)). On a tied attention
    layer written out by hand (sharp weights, sigma_q sigma_k = 6; 4 tokens; one head), the exact Jacobian
    (torch.func.jacrev) against the same layer with the weights P held fixed: the extra share of
    1/N sum_ij (dz_i / dh_j)^2 is positive and falls with the width d. Measured means over 6 draws: 0.10,
    0.0048, 0.0007 at d = 32, 128, 512."""
    torch = pytest.importorskip("torch")

    def share(d, seed, T=4, sq=3.0, sk=2.0):
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(T, d, generator=g, dtype=torch.float64)
        W, WV, WO = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))

        def layer(x, fixed):
            q, k = sq * x @ W.T / d**0.5, sk * x @ W.T / d**0.5
            P = torch.softmax(q @ k.T / d, -1)
            P = P.detach() if fixed else P
            return (P @ (x @ WV.T / d**0.5)) @ WO.T / d**0.5

        full, fixed = (float((torch.func.jacrev(lambda x: layer(x, f))(h) ** 2).sum()) for f in (False, True))
        return full / fixed - 1

    shares = {d: np.array([share(d, seed) for seed in range(6)]) for d in (32, 512)}
    assert (shares[32] > 0).all() and (shares[512] > 0).all(), shares
    assert shares[512].max() < 0.002 and shares[32].mean() > 20 * shares[512].mean(), shares


@pytest.mark.slow
@pytest.mark.torch
def test_monte_carlo_reproduces_the_papers_vit_claims():
    """The partial-Jacobian paper's appendix C (Figs. 7, 8) on realised ViT blocks with standard 1/sqrt(d_h)
    softmax attention (8 heads, every weight at sigma_w; 24 blocks, 512 channels, 16 tokens), J^{22,23}:
    the pre-LN ViT is critical at mu = 1 for every sigma_w (|chi_J - 1| <= 0.08; measured 1.02-1.05) and
    ordered below it; the post-LN ViT is ordered at mu = 1; stacked attention without LayerNorm or skips spans
    many orders of magnitude (measured > 20 between sigma_w^2 = 0.5 and 4). docs/figures/vit_phase.py maps
    the planes at 256 channels."""
    pytest.importorskip("torch")
    from meanfield.verification import phase_diagram

    s = "sigma_w"
    att = mf.attention(8, scaling="1/sqrt(d)", sigma_q=s, sigma_k=s, sigma_v=s)
    kw = dict(depth=24, width=WIDE, n_init=16, tokens=16, seed=1, device="cpu")
    sw = np.sqrt([0.5, 2.0, 4.0])

    def chi(tree, mu=None, sb=(0.0,)):
        r = phase_diagram(mf.Network(tree, mu=mu), sw, sb, **kw)
        return r.chi_J[:, 0], r.chi_J_se[:, 0]

    c, se = chi(mf.transformer("gelu", "pre", att), mu=1.0)
    assert np.all(np.abs(c - 1) <= 0.08), (c, se)
    c, se = chi(mf.transformer("gelu", "pre", att), mu=0.75)
    assert np.all(1 - c > 10 * se), (c, se)
    c, se = chi(mf.transformer("gelu", "post", att), mu=1.0)
    assert np.all(1 - c > 4 * se), (c, se)
    c, se = chi(mf.serial(att))
    assert c[-1] / c[0] > 1e20 and c[0] < 0.1, (c, se)


# ---------------------------------------------------------------------------
# Rank collapse: the correlation between tokens.
# ---------------------------------------------------------------------------
def test_token_correlations_on_orthonormal_tokens_are_the_closed_form():
    """A tied chain on orthonormal tokens keeps A = a I + b 1 1^T, so rho^l = b / (a + b) (the hand-derived
    walk, mpmath); the collapse depth is the first layer past the threshold. Independent weights average
    the tokens: every correlation is 1 after one layer."""
    mp.mp.dps = 40
    T, sw, sb, c, depth = 5, 1.25, 0.3, 2.0, 12
    net = mf.Network(mf.attention(tied=True, sigma_q=c, sigma_k=1.0))
    ref = [(sw**2, sb**2)] + [(p, q) for p, q, _, _ in R.tied_attention_walk(sw**2, sb**2, T, c, sw**2, sb**2,
                                                                           depth - 1)]
    want = np.array([float(q / (p + q)) for p, q in ref])
    got = token_correlations(net, _orthonormal_tokens(T, 16), depth, sw, sb, threshold=0.5)
    np.testing.assert_allclose(got["rho"][:, 0], want, rtol=1e-13)
    assert got["collapse_depth"][0] == np.argmax(want >= 0.5) + 1 and 1 < got["collapse_depth"][0] < depth
    avg = token_correlations(mf.Network(mf.attention()), np.random.default_rng(1).standard_normal((2, 4, 3)), 3,
                             1.0, 0.2)
    np.testing.assert_allclose(avg["rho"][1:], 1.0, rtol=1e-14)
    assert (avg["collapse_depth"] == 2).all()
    with pytest.raises(ValueError, match="two tokens"):
        token_correlations(net, np.ones((1, 1, 4)), 3, 1.0, 0.0)
    with pytest.raises(ValueError, match="threshold"):
        token_correlations(net, np.ones((1, 3, 4)), 3, 1.0, 0.0, threshold=1.5)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("attention", [mf.attention(tied=True, sigma_q=1.5, sigma_k=1.5), STANDARD],
                         ids=["tied-1/d", "standard-1/sqrt(d)"])
def test_token_correlations_are_the_realised_cosine_similarities(attention):
    """The mean cosine similarity between the token vectors of realised pre-LN networks (depth 20, 512
    channels, 16 initialisations, one input of 6 random tokens), layer by layer, against rho^l within
    4 standard errors + 2 l / width. Measured max |z|: 2.4 (tied), 0.9 (standard); both collapse past 0.9
    by block 7-8."""
    torch = pytest.importorskip("torch")
    from meanfield.torch.networks import Context, input_layer, realise

    net = mf.Network(mf.transformer("gelu", "pre", attention), mu=0.8)
    sw, sb, I = 1.2, 0.1, 16
    x = np.random.default_rng(0).standard_normal((1, 6, 16))
    th = token_correlations(net, x, DEEP, sw, sb)
    ctx = Context(None, {"sigma_w": [sw], "sigma_b": [sb], "mu": [0.8]}, "cpu", torch.float64, seed=3,
                  init_ids=range(I))
    z = input_layer(WIDE)(torch.tensor(x)[None, None, None].expand(I, 1, 1, 1, 6, 16).contiguous(), ctx)
    block = realise(net)
    off = ~torch.eye(6, dtype=torch.bool)
    for layer in range(1, DEEP + 1):
        if layer > 1:
            z = block(z, ctx)
        h = z[:, 0, 0, 0]
        h = h / h.norm(dim=-1, keepdim=True)
        per_init = (h @ h.transpose(1, 2))[:, off].mean(-1).numpy()
        mc, se = per_init.mean(), per_init.std(ddof=1) / np.sqrt(I)
        t = th["rho"][layer - 1, 0]
        se_t = th["rho_se"][layer - 1, 0] if "rho_se" in th else 0.0
        assert abs(mc - t) <= 4 * np.hypot(se, se_t) + 2 * layer / WIDE * abs(t), (layer, mc, se, t)
