"""Monte Carlo on real networks for RMSNorm, SELU/ELU/hard-tanh and a LayerNorm after a residual sum against the
theory (suite rule)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield.verification import monte_carlo  # noqa: E402
from meanfield.verification._theory import theory_profile  # noqa: E402

Z, C = 4.0, 2.0  # the suite's rule: |MC - theory| <= z SE + c (l / width) |theory|


def _agree(net, sw, sb, depth, width, n_init):
    r = monte_carlo(net, sw, sb, depth=depth, width=width, n_init=n_init, device="cpu", seed=3)
    th = theory_profile(net, sw, sb, depth)
    layers = np.arange(1, depth + 1)
    for q, mc, se, t, ll in (("K", r.K, r.K_se, th["K"], layers),
                             ("chi_J", r.chi_J, r.chi_J_se, th["chi_J"][:depth], layers)):
        tol = Z * se + C * ll / width * np.abs(t)
        bad = np.abs(mc - t) > tol
        assert not bad.any(), (q, ll[bad], mc[bad], t[bad], se[bad])


SMALL = [
    (lambda: mf.Network(mf.serial(mf.rms_norm(), mf.act("relu"), mf.dense())), 1.5, 0.3),
    (lambda: mf.Network(mf.residual(mf.act("gelu"), mf.rms_norm(), mf.dense()), mu=0.5), 1.3, 0.2),
    (lambda: mf.Architecture("selu"), 1.0, 0.0),
    (lambda: mf.Architecture("elu"), 1.3, 0.2),
    (lambda: mf.Architecture("hardtanh"), 1.2, 0.1),
]


@pytest.mark.slow
@pytest.mark.parametrize("build,sw,sb", SMALL, ids=["rms-pre", "rms-post-res", "selu", "elu", "hardtanh"])
def test_small(build, sw, sb):
    _agree(build(), sw, sb, depth=6, width=128, n_init=16)


@pytest.mark.slow
@pytest.mark.parametrize("build,sw,sb", [
    (lambda: mf.Network(mf.residual(mf.rms_norm(), mf.act("relu"), mf.dense()), mu=0.9), 1.4, 0.2),
    (lambda: mf.Network(mf.serial(mf.act("tanh"), mf.rms_norm(), mf.dense())), 1.2, 0.1),
    (lambda: mf.Architecture("selu"), 1.0, 0.0),
    # post-LN: the block ends in a LayerNorm with no fresh weights after it
    (lambda: mf.Network(mf.serial(mf.residual(mf.act("tanh"), mf.dense(), mu=0.7), mf.layer_norm())), 1.6, 0.3),
], ids=["rms-pre-res", "rms-post", "selu", "ln-after-residual"])
def test_deep_wide(build, sw, sb):
    _agree(build(), sw, sb, depth=20, width=512, n_init=16)
