"""The composition API: the primitive tree as the spec (Network, serial, residual, ...).

References are independent of the code under test: the Architecture menu's
recursions (an older, separately written route) must equal the composed
trees' exactly (sympy), and the state maps of new nodes are checked against
the equations written out here.
"""
import json

import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield import symbols as S
from meanfield.calculus import Architecture, Network, Signal

K, K12, sw, sb, mu, eps = S.K, S.K12, S.sigma_w, S.sigma_b, S.mu, S.eps

MENU = [
    (dict(activation="relu"), lambda: mf.Network(mf.serial(mf.act("relu"), mf.dense()))),
    (dict(activation="erf", norm="ln_pre"),
     lambda: mf.Network(mf.serial(mf.layer_norm(), mf.act("erf"), mf.dense()))),
    (dict(activation="tanh", norm="ln_post", mu=0.5),
     lambda: mf.Network(mf.residual(mf.act("tanh"), mf.layer_norm(), mf.dense()), mu=0.5)),
    (dict(activation="relu", norm="bn", mu=0.9, stages=2),
     lambda: mf.Network(mf.residual(*[mf.batch_norm(), mf.act("relu"), mf.dense()] * 2), mu=0.9)),
    (dict(activation="gelu", block="resmlp", eps=0.1),
     lambda: mf.Network(mf.serial(mf.residual(mf.dense(axis="tokens"), mf.scale()),
                                  mf.residual(mf.dense(), mf.act("gelu"), mf.dense(), mf.scale())),
                        mu=1.0, eps=0.1)),
    (dict(activation="gelu", block="mixer"),
     lambda: mf.Network(mf.serial(
         mf.residual(mf.layer_norm(axis="channels"), mf.dense(axis="tokens"), mf.act("gelu"), mf.dense(axis="tokens")),
         mf.residual(mf.layer_norm(axis="channels"), mf.dense(axis="channels"), mf.act("gelu"),
                     mf.dense(axis="channels"))), mu=1.0)),
]


def _same(r1, r2):
    for name in ("kernel", "kernel12", "chi_J", "chi_K", "chi_Delta"):
        a, b = getattr(r1, name), getattr(r2, name)
        assert a == b or sp.simplify(a - b) == 0, name


@pytest.mark.parametrize("kw,build", MENU, ids=[str(Architecture(**k)) for k, _ in MENU])
def test_menu_equals_composed_tree(kw, build):
    arch = Architecture(**kw)
    net = build()
    _same(mf.recursion(arch), mf.recursion(net))
    _same(mf.recursion(arch), mf.recursion(arch.network()))
    assert net.parameters() == arch.parameters()
    assert net.pair_axis == arch.pair_axis
    assert net.couples_batch == (kw.get("norm") == "bn")
    assert net.has_tokens == (kw.get("block", "mlp") != "mlp")
    # K12 feeds back into K or chi_J exactly for BatchNorm and the Mixer's channel LayerNorm
    assert (len(mf.recursion(net).state) == 2) == (kw.get("norm") == "bn" or kw.get("block") == "mixer")


@pytest.mark.slow
@pytest.mark.parametrize("kw,build", MENU[:3], ids=["relu", "erf-ln", "tanh-lnpost"])
def test_solvers_agree(kw, build):
    # the two specs generate the same expressions (test above) but separate modules (the key is the
    # spec, computed without deriving), and a module is run interpreted or compiled depending on what
    # the cache holds: the two engines agree to ~1e-15 relative, not bit for bit (tests/test_engines.py)
    arch, net = Architecture(**kw), build()
    a = mf.kernel_profile(arch, 1.3, 0.2, 30)
    b = mf.kernel_profile(net, 1.3, 0.2, 30)
    np.testing.assert_allclose(a.K, b.K, rtol=1e-14, atol=0)
    np.testing.assert_allclose(a.chi_J, b.chi_J, rtol=1e-14, atol=0)
    la = mf.critical_line(arch, sigma_w=[1.0, 1.5])
    lb = mf.critical_line(net, sigma_w=[1.0, 1.5])
    np.testing.assert_allclose(la.sigma_b, lb.sigma_b, rtol=1e-14, atol=0)


@pytest.mark.parametrize("kw,build", MENU, ids=[str(Architecture(**k)) for k, _ in MENU])
def test_json_round_trip(kw, build):
    net = build()
    data = json.loads(json.dumps(mf.to_json(net)))
    assert mf.from_json(data) == net
    arch = Architecture(**kw)
    assert mf.from_json(json.loads(json.dumps(mf.to_json(arch)))) == arch


def test_json_user_activation_and_numbers():
    x = sp.Symbol("t")
    net = mf.Network(mf.residual(mf.act(sp.sin(x) + x / 2), mf.dense(1.5, 0.25), mu=0.7), name="mine")
    back = mf.from_json(json.dumps(mf.to_json(net)))
    assert back == net
    assert mf.recursion(back).kernel == mf.recursion(net).kernel
    lk = mf.Network(mf.serial(mf.act("leaky_relu", negative_slope=0.2), mf.dense()))
    assert mf.from_json(mf.to_json(lk)) == lk


def test_composition_outside_the_menu():
    # pre-LN *and* post-LN in one branch: layer_norm reads its position
    net = mf.Network(mf.residual(mf.layer_norm(), mf.act("erf"), mf.layer_norm(), mf.dense(), mf.scale(0.5)),
                     mu=0.8)
    rec = mf.recursion(net)
    # by hand: LN-pre gives 1; erf at K=1 has E[phi] = 0, E[phi^2] = (2/pi) asin(2/3);
    # LN-post gives 1; dense sigma_w^2 + sigma_b^2; scale 1/4; skip mu^2 K
    expect_K = (sw**2 + sb**2) / 4 + mu**2 * K
    assert sp.simplify(rec.kernel - expect_K) == 0
    expect_chi = (1 / K) * (4 / sp.pi / sp.sqrt(5)) / (2 / sp.pi * sp.asin(sp.Rational(2, 3))) * sw**2 / 4 + mu**2
    # the package evaluates arcsin(2/3) as arctan(2/sqrt 5) (exact at large K); sympy does not
    # simplify one into the other, so compare at a point (the tree carries scale(0.5) as a float: 1e-15)
    point = {K: sp.Rational(7, 3), sw: sp.Rational(3, 2), sb: sp.Rational(1, 5), mu: sp.Rational(4, 5)}
    assert abs(sp.N((rec.chi_J - expect_chi).subs(point), 50)) < 1e-15


def test_bare_tree_and_list_accepted():
    tree = mf.serial(mf.act("erf"), mf.dense())
    assert mf.recursion(tree).kernel == mf.recursion(activation="erf").kernel
    assert mf.recursion([mf.act("erf"), mf.dense()]).chi_J == mf.recursion(activation="erf").chi_J


@pytest.mark.parametrize("build,needle", [
    (lambda: mf.serial(mf.dense(), mf.act("relu")), "act('relu') at position 1"),
    (lambda: mf.residual(mf.act("relu"), mf.dense(), mf.act("tanh"), mf.dense(), mf.layer_norm()),
     "its branch ends in layer_norm()"),
    (lambda: mf.residual(mf.residual(mf.act("relu"), mf.dense())), "not in zero-mean weights"),
    (lambda: mf.residual(mf.scale()), "ends in scale()"),
    (lambda: mf.Network(mf.serial(mf.act("relu"), mf.batch_norm(), mf.dense())), "block[1] = batch_norm()"),
    (lambda: mf.Network(mf.serial(mf.act("relu"), mf.act("tanh"), mf.dense())), "block[1] = act('tanh')"),
    (lambda: mf.Network(mf.serial(mf.layer_norm(axis="channels"), mf.rms_norm(), mf.dense(axis="channels"))),
     "rms_norm()"),
    (lambda: mf.dense(axis="rows"), "axis='rows'"),
    (lambda: mf.Network(mf.serial(mf.act("relu"), mf.dense()), mu=2.0), "mu must be"),
    (lambda: mf.from_json({"tree": [{"type": "Pool"}]}), "unknown node type 'Pool'"),
])
def test_invalid_trees_name_the_node(build, needle):
    with pytest.raises(ValueError, match=None) as err:
        build()
    assert needle in str(err.value), str(err.value)


def test_missing_symbol_value_is_an_error():
    net = mf.Network(mf.residual(mf.act("relu"), mf.dense()))  # symbolic mu, no value
    mf.recursion(net)  # symbolic is fine
    with pytest.raises(ValueError, match="needs a value for mu"):
        mf.critical_line(net, sigma_w=1.0)


def test_rms_norm_state_map():
    s = Signal(K, K12, sp.Symbol("m"), gaussian=False)
    out = mf.rms_norm().forward(s)
    assert out.K == 1 and sp.simplify(out.K12 - K12 / K) == 0 and sp.simplify(out.mean - sp.Symbol("m") / sp.sqrt(K)) == 0
    assert mf.rms_norm().chi(s) == 1 / K
    # post-RMSNorm on relu: Dense sees K=1 whatever sigma_w: critical everywhere in sigma_w only via chi
    rec = mf.recursion([mf.act("relu"), mf.rms_norm(), mf.dense()])
    assert sp.simplify(rec.kernel - (sw**2 + sb**2)) == 0
    assert sp.simplify(rec.chi_J - sw**2 / K) == 0  # E[relu'^2] / E[relu^2] = (1/2)/(K/2)


@pytest.mark.slow
def test_every_solver_takes_a_network():
    net = mf.Network(mf.residual(mf.layer_norm(), mf.act("erf"), mf.dense()), mu=0.5)
    arch = mf.Architecture("erf", norm="ln_pre", mu=0.5)
    pa = mf.phase_diagram(arch, sigma_w=[0.8, 1.6], sigma_b=[0.1, 0.5])
    pn = mf.phase_diagram(net, sigma_w=[0.8, 1.6], sigma_b=[0.1, 0.5])
    np.testing.assert_array_equal(pa.chi_J, pn.chi_J)
    ea = mf.exponents(arch, sigma_w=1.0, sigma_b=0.2)
    en = mf.exponents(net, sigma_w=1.0, sigma_b=0.2)
    assert ea.regime == en.regime
    np.testing.assert_array_equal(mf.fixed_point(arch, 1.2, 0.3), mf.fixed_point(net, 1.2, 0.3))


@pytest.mark.slow
def test_cli_spec(tmp_path):
    import subprocess
    import sys

    net = mf.Network(mf.residual(mf.layer_norm(), mf.act("erf"), mf.dense()), mu=0.5)
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps(mf.to_json(net)))
    proc = subprocess.run([sys.executable, "-m", "meanfield", "critical-line", "--spec", str(spec),
                           "--sigma-w", "1.0,2.0", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "line.json").write_text(proc.stdout)
    got = mf.CriticalLine.load(tmp_path / "line.json")   # --json prints what CriticalLine.save writes
    ref = mf.critical_line(net, sigma_w=[1.0, 2.0])
    np.testing.assert_allclose(got.sigma_b, ref.sigma_b, rtol=0, atol=0)
    assert str(got.architecture) == str(net)
    bad = subprocess.run([sys.executable, "-m", "meanfield", "recursion", "--spec", str(spec), "--mu", "0.3"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--spec replaces" in bad.stderr
