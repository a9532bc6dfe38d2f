"""The signal-propagation calculus: primitives, composition rules, blocks, Architecture.

Each primitive is checked against the table of shared/DESIGN.md (state map,
chi factor); the blocks against hand-composed chains.
"""
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield import symbols as S
from meanfield.calculus import (
    ActivationLayer,
    Architecture,
    BatchNorm,
    Chain,
    Dense,
    LayerNormPost,
    LayerNormPre,
    Residual,
    Scale,
    Signal,
    as_architecture,
    mixer_block,
    mlp_block,
    resmlp_block,
)

K, K12, sw, sb, mu, eps = S.K, S.K12, S.sigma_w, S.sigma_b, S.mu, S.eps
IN = Signal.input()


def zero(e):
    return sp.simplify(e) == 0


def test_dense():
    d = Dense()
    out = d.forward(IN)
    assert out.K == sw**2 * K + sb**2 and out.K12 == sw**2 * K12 + sb**2 and out.gaussian
    assert d.chi(IN) == sw**2
    assert Dense(sigma_w=2, sigma_b=0).forward(IN).K == 4 * K


def test_activation_layer():
    phi = mf.activation("erf")
    a = ActivationLayer(phi)
    out = a.forward(IN)
    assert not out.gaussian
    assert zero(out.K - phi.second_moment(K)) and zero(out.K12 - phi.kernel(K, K, K12))
    assert out.mean == 0
    assert zero(a.chi(IN) - phi.derivative_second_moment(K))
    assert zero(a.chi_delta(IN) - phi.chi_delta_moment(K))
    with pytest.raises(ValueError, match="needs a Gaussian preactivation"):
        a.forward(out)


def test_layernorm_pre_and_post():
    out = LayerNormPre().forward(IN)
    assert out.K == 1 and out.K12 == K12 / K
    assert LayerNormPre().chi(IN) == 1 / K
    relu = mf.activation("relu")
    post_in = ActivationLayer(relu).forward(IN)  # q = K/2, m = sqrt(K/(2 pi))
    ln = LayerNormPost()
    out = ln.forward(post_in)
    var = K / 2 - K / (2 * sp.pi)
    assert out.K == 1
    assert zero(ln.chi(post_in) - 1 / var)
    # correlation after centring: (q12 - m^2)/(q - m^2)
    assert zero(out.K12 - (relu.kernel(K, K, K12) - K / (2 * sp.pi)) / var)


def test_batchnorm():
    b = BatchNorm()
    out = b.forward(IN)
    assert (out.K, out.K12, out.gaussian) == (1, 0, True)
    assert b.chi(IN) == 1 / (K - K12)


def test_scale_and_residual():
    s = Scale()
    out = s.forward(IN)
    assert out.K == eps**2 * K and s.chi(IN) == eps**2
    branch = Chain((Dense(), ActivationLayer(mf.activation("relu")), Dense()))
    r = Residual(branch)
    out = r.forward(IN)
    assert zero(out.K - (branch.forward(IN).K + mu**2 * K))
    assert zero(out.K12 - (branch.forward(IN).K12 + mu**2 * K12))
    assert zero(r.chi(IN) - (branch.chi(IN) + mu**2))
    assert zero(r.chi_delta(IN) - branch.chi_delta(IN))


def test_chain_multiplies_factors_and_sums_chi_delta():
    erf = mf.activation("erf")
    c = Chain((Dense(), ActivationLayer(erf), Dense()))
    h = sw**2 * K + sb**2
    assert zero(c.chi(IN) - sw**4 * erf.derivative_second_moment(h))
    assert zero(c.forward(IN).K - (sw**2 * erf.second_moment(h) + sb**2))
    # two activations: chi_Delta replaces one E[phi'^2] at a time (Lemma D.1)
    c2 = Chain((ActivationLayer(erf), Dense(), ActivationLayer(erf), Dense()))
    h2 = sw**2 * erf.second_moment(K) + sb**2
    want = (erf.chi_delta_moment(K) * sw**2 * erf.derivative_second_moment(h2) * sw**2
            + erf.derivative_second_moment(K) * sw**2 * erf.chi_delta_moment(h2) * sw**2)
    assert zero(c2.chi_delta(IN) - want)


def test_composition_rules():
    with pytest.raises(ValueError, match="not followed by a dense layer"):
        Chain((Dense(), ActivationLayer(mf.activation("relu"))))
    with pytest.raises(ValueError, match="not followed by a dense layer"):
        Chain((LayerNormPre(), Dense(), BatchNorm()))
    with pytest.raises(ValueError, match="not in zero-mean weights"):
        Residual(Chain((Dense(), Residual(Chain((Dense(),))))))
    assert isinstance(Residual(Chain((Dense(), Scale()))), Residual)


def test_mlp_block_layouts():
    relu = mf.activation("relu")
    kinds = lambda blk: [type(p).__name__ for p in blk.layers]  # noqa: E731
    assert kinds(mlp_block(relu)) == ["ActivationLayer", "Dense"]
    assert kinds(mlp_block(relu, "ln_pre")) == ["LayerNormPre", "ActivationLayer", "Dense"]
    assert kinds(mlp_block(relu, "ln_post")) == ["ActivationLayer", "LayerNormPost", "Dense"]
    assert kinds(mlp_block(relu, "bn", stages=2)) == ["BatchNorm", "ActivationLayer", "Dense"] * 2
    res = mlp_block(relu, "ln_pre", residual=True)
    assert isinstance(res, Residual) and kinds(res.branch) == ["LayerNormPre", "ActivationLayer", "Dense"]


def test_resmlp_and_mixer_blocks():
    relu = mf.activation("relu")
    blk = resmlp_block(relu)
    assert [type(p).__name__ for p in blk.layers] == ["Residual", "Residual"]
    first, second = blk.layers
    assert [type(p).__name__ for p in first.branch.layers] == ["Dense", "Scale"]
    assert first.branch.layers[0].axis == "tokens"
    assert [type(p).__name__ for p in second.branch.layers] == ["Dense", "ActivationLayer", "Dense", "Scale"]
    plain = resmlp_block(relu, residual=False)
    assert zero(plain.chi(IN) - eps**2 * sw**2 * sw**4 / 2 * eps**2)
    mix = mixer_block(relu)
    assert [type(p).__name__ for p in mix.layers[0].branch.layers] == ["LayerNormPre", "Dense", "ActivationLayer", "Dense"]
    assert mix.layers[0].branch.layers[1].axis == "tokens"


def test_architecture_fields_and_structure():
    a = Architecture()
    assert a.activation.name == "relu" and a.norm == "none" and a.mu is None and not a.residual
    assert a.parameters() == {}
    b = Architecture(activation="gelu", norm="ln_pre", mu=0.5)
    assert b.residual and b.parameters() == {mu: 0.5} and str(b) == "gelu + ln_pre + mu=0.5"
    assert Architecture(norm=None).norm == "none"
    assert len(mf.recursion(Architecture(norm="bn")).state) == 2 and len(mf.recursion(b).state) == 1
    r = Architecture(activation="gelu", block="resmlp")
    assert r.mu == 1.0 and r.parameters() == {mu: 1.0, eps: 0.1} and str(r) == "resmlp + gelu + mu=1 + eps=0.1"
    assert Architecture(block="mixer").mu == 1.0
    assert Architecture(block="resmlp", mu=0.3).mu == 0.3
    assert b.with_(mu=1.0).mu == 1.0 and b.mu == 0.5
    assert Architecture(stages=np.int64(2)).stages == 2
    assert Architecture(activation="leaky_relu", activation_params=(("negative_slope", 0.2),)).activation.a_minus == sp.Rational(1, 5)


def test_architecture_is_hashable_and_recursions_are_cached():
    a1 = Architecture(activation="erf", mu=0.5)
    a2 = Architecture(activation="erf", mu=0.5)
    assert a1 == a2 and hash(a1) == hash(a2)
    assert mf.recursion(a1) is mf.recursion(a2)
    assert mf.recursion(activation="erf", mu=0.5) is mf.recursion(a1)


def test_as_architecture():
    a = Architecture(activation="erf")
    assert as_architecture(a) is a
    assert as_architecture(activation="erf") == a
    assert as_architecture("erf") == a
    assert as_architecture(activation="leaky_relu", negative_slope=0.1).activation.a_minus == sp.Rational(1, 10)
    assert as_architecture(sp.tanh(sp.Symbol("u"))).activation.expr == sp.tanh(S.x)
    with pytest.raises(ValueError, match="either an Architecture"):
        as_architecture(a, mu=0.5)


@pytest.mark.slow
def test_every_registered_activation_builds_every_block():
    for name in mf.available_activations():
        for kw in (dict(), dict(norm="ln_pre", mu=0.5), dict(norm="ln_post"), dict(norm="bn", mu=1.0),
                   dict(block="resmlp"), dict(block="mixer")):
            rec = mf.recursion(activation=name, **kw)
            assert rec.kernel.has(S.sigma_w) and rec.chi_J.has(S.sigma_w), (name, kw)
