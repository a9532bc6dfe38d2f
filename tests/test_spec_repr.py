"""How specs and critical points print (issue 27, item 7).

A Network and its primitives print as the composition call that builds them,
numbers as repr(float) (never 30-digit sympy Floats); with the composition
functions in scope that text rebuilds the spec. The expected strings are
written by hand.
"""
import pytest

import meanfield as mf

NAMESPACE = {name: getattr(mf, name) for name in
             ("Network", "serial", "residual", "dense", "act", "layer_norm", "rms_norm", "batch_norm", "scale")}

SPECS = [
    (mf.Network(mf.residual(mf.rms_norm(), mf.act("selu"), mf.dense(), mf.scale(0.5)), mu=0.9),
     "Network(residual(rms_norm(), act('selu'), dense(), scale(0.5)), mu=0.9)"),
    (mf.Network(mf.serial(mf.layer_norm("pre"), mf.act("leaky_relu", negative_slope=0.2), mf.dense(sigma_b=0)),
                depth=3, eps=0.1),
     "Network(serial(layer_norm(position='pre'), act('leaky_relu', negative_slope=0.2), dense(sigma_b=0)), "
     "eps=0.1, depth=3)"),
    (mf.Network(mf.serial(mf.residual(mf.dense(axis="tokens"), mf.scale(0.25), mu=1),
                          mf.residual(mf.dense(), mf.act("gelu"), mf.dense(1.5, 0.1), mf.scale(), mu=1))),
     "Network(serial(residual(dense(axis='tokens'), scale(0.25), mu=1), "
     "residual(dense(), act('gelu'), dense(sigma_w=1.5, sigma_b=0.1), scale(), mu=1)))"),
    (mf.Network(mf.serial(mf.batch_norm(), mf.act("relu"), mf.dense(sigma_w=1 / 3)), name="bn-relu"),
     "Network(serial(batch_norm(), act('relu'), dense(sigma_w=0.3333333333333333)), name='bn-relu')"),
]


@pytest.mark.parametrize("net,text", SPECS)
def test_network_repr_is_the_composition_call(net, text):
    assert repr(net) == text


@pytest.mark.parametrize("net,text", SPECS)
def test_network_repr_rebuilds_the_network(net, text):
    assert eval(repr(net), NAMESPACE) == net  # noqa: S307 - the text under test


def test_primitive_reprs():
    assert repr(mf.dense()) == "dense()"
    assert repr(mf.dense(sigma_b=0, axis="tokens")) == "dense(sigma_b=0, axis='tokens')"
    assert repr(mf.scale(0.1)) == "scale(0.1)"
    assert repr(mf.residual(mf.act("erf"), mf.dense(), mu=0.5)) == "residual(act('erf'), dense(), mu=0.5)"


def test_network_str_stays_compact():
    net = mf.Network(mf.residual(mf.rms_norm(), mf.act("selu"), mf.dense(), mf.scale(0.5)), mu=0.9)
    assert str(net) == "residual(rms_norm(), act('selu'), dense(), scale(0.5)) [mu=0.9]"


def test_critical_points_print_their_stability():
    # erf at (sqrt(pi)/2, 0): K* = 0 and dK^{l+1} = dK - c2 dK^2 with c2 = 2 > 0, so a small K > 0
    # flows back to 0 while K < 0 does not exist: stable from above only
    cps = mf.critical_point(activation="erf")
    assert len(cps) == 1
    assert "half-stable from above" in repr(cps)
