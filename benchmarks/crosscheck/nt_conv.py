"""neural-tangents against ``meanfield.kernels`` on convolutional trees over images.

    /tmp/nt-venv/bin/python benchmarks/crosscheck/nt_conv.py [--out FILE.json]

Set-up (jax from the package index; neural-tangents from its source, without its declared
dependencies, which pull tensorflow): ``python -m venv /tmp/nt-venv``;
``/tmp/nt-venv/bin/pip install "jax[cpu]" absl-py frozendict``;
``/tmp/nt-venv/bin/pip install --no-deps git+https://github.com/google/neural-tangents``;
``/tmp/nt-venv/bin/pip install --no-deps -e . && /tmp/nt-venv/bin/pip install sympy numba mpmath scipy``.

Independent route: neural-tangents' ``stax`` kernel functions for ``Conv``, ``AvgPool``,
``GlobalAvgPool``, ``LayerNorm`` and its activations' closed forms, float64
(``jax_enable_x64``), on images (n, H, W, C) in NHWC. Its ``experimental`` subpackage (tensorflow)
and its empirical and Monte-Carlo modules (jax internals that jax 0.10 no longer exports; the stax
kernel functions do not use them) are stubbed out below; the versions are printed.

How each tree is written in stax (``depth`` as in ``mf.kernels``: the input layer, then depth - 1
blocks, then the mean over positions):

* input layer: ``Conv(C, (1, 1), W_std=sigma_w, b_std=sigma_b)`` (meanfield's per-position dense layer);
* ``conv((kh, kw), padding=...)``: ``Conv(C, (kh, kw), padding='SAME' | 'CIRCULAR' | 'VALID')``;
* ``avg_pool(k, stride, padding)``: ``AvgPool(..., normalize_edges=False)`` (zeros counted, as torch);
* ``layer_norm(axis='positions')`` before phi: ``LayerNorm(axis=(1, 2, 3), eps=0)`` (neural-tangents'
  LayerNorm needs a Gaussian input: pre-activation only);
* residual ``h <- mu h + branch(h)``: ``FanOut(2), parallel(DotGeneral(lhs=mu), branch), FanInSum``;
* a projection shortcut ``residual(..., shortcut=s, mu=mu)``: ``FanOut(2), parallel(serial(s, DotGeneral(lhs=mu)),
  branch), FanInSum``; ``resnet_v2`` as that, stage by stage (:func:`resnet_v2` below);
* read-out: ``GlobalAvgPool()`` (``readout='mean'``) or ``Flatten()`` (``readout='flatten'``).

Strides are compared where torch's symmetric padding and TensorFlow's 'SAME' (extra pad at the end)
place the windows alike (odd sizes). Reported: the largest relative difference over all entries,
max |mf - nt| / max(|nt|, 1e-300), NNGP and NTK, both parameterisations.
"""
import json
import sys
import types

import numpy as np

sys.modules.setdefault("neural_tangents.experimental", types.ModuleType("neural_tangents.experimental"))
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)


def _stub(name):
    """A module whose every attribute is a placeholder: neural-tangents' empirical and Monte-Carlo modules,
    imported by its package, use jax internals that newer jax no longer exports; the stax kernel functions
    checked here need neither."""
    m = types.ModuleType(name)
    m.__getattr__ = lambda attr: None
    sys.modules[name] = m


for _name in ("neural_tangents._src.empirical", "neural_tangents._src.monte_carlo"):
    _stub(_name)
import neural_tangents  # noqa: E402
from neural_tangents import stax  # noqa: E402

import meanfield as mf  # noqa: E402

WIDTH = 64


def images():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 5, 5, 3)) * rng.uniform(0.4, 2.0, (4, 1, 1, 1))
    x[3] = -0.5 * x[0]                       # an antiparallel pair of images
    return x


PHI = {"relu": (stax.Relu, lambda: mf.act("relu")), "erf": (stax.Erf, lambda: mf.act("erf")),
       "gelu": (lambda: stax.Gelu(approximate=False), lambda: mf.act("gelu"))}


def block(kind, phi, mu, sw, sb, param):
    """(stax block, meanfield tree) of one residual or plain block."""
    nt_phi, mf_phi = PHI[phi]
    conv = dict(W_std=sw, b_std=sb, parameterization=param)
    if kind == "conv-same":
        nt = [nt_phi(), stax.Conv(WIDTH, (3, 3), padding="SAME", **conv)]
        ours = [mf_phi(), mf.conv((3, 3))]
    elif kind == "conv-circular":
        nt = [nt_phi(), stax.Conv(WIDTH, (3, 1), padding="CIRCULAR", **conv)]
        ours = [mf_phi(), mf.conv((3, 1), padding="circular")]
    elif kind == "pool-conv":
        nt = [nt_phi(), stax.AvgPool((3, 3), (1, 1), "SAME", normalize_edges=False),
              stax.Conv(WIDTH, (3, 3), padding="SAME", **conv)]
        ours = [mf_phi(), mf.avg_pool((3, 3), stride=1, padding="same"), mf.conv((3, 3))]
    elif kind == "ln-conv":
        nt = [stax.LayerNorm(axis=(1, 2, 3), eps=0.0), nt_phi(), stax.Conv(WIDTH, (3, 3), padding="SAME", **conv)]
        ours = [mf.layer_norm(axis="positions"), mf_phi(), mf.conv((3, 3))]
    elif kind == "same-strided":
        nt = [nt_phi(), stax.Conv(WIDTH, (3, 3), strides=(2, 2), padding="SAME", **conv)]
        ours = [mf_phi(), mf.conv((3, 3), stride=2)]
    elif kind == "valid-strided":
        nt = [nt_phi(), stax.Conv(WIDTH, (3, 3), strides=(2, 2), padding="VALID", **conv)]
        ours = [mf_phi(), mf.conv((3, 3), padding="valid", stride=2)]
    elif kind == "resnet-v2":
        return resnet_v2(phi, mu, sw, sb, param)
    else:
        raise ValueError(kind)
    if mu is None:
        return stax.serial(*nt), mf.Network(mf.serial(*ours))
    return (stax.serial(stax.FanOut(2), stax.parallel(stax.DotGeneral(lhs=mu), stax.serial(*nt)), stax.FanInSum()),
            mf.Network(mf.residual(*ours, mu=mu)))


def resnet_v2(phi, mu, sw, sb, param, blocks=(1, 1, 1)):
    """(stax body, meanfield network) of ``mf.resnet_v2(blocks)``: pre-activation BasicBlocks, every stage after
    the first strided by 2 in its first block with the projection shortcut of the pre-activation, scaled by mu
    (``DotGeneral(lhs=mu)`` after the shortcut's 1 x 1 convolution)."""
    nt_phi, _ = PHI[phi]
    conv = dict(W_std=sw, b_std=sb, parameterization=param)

    def pre():
        return [stax.LayerNorm(axis=(1, 2, 3), eps=0.0), nt_phi()]

    body = []
    for stage, n in enumerate(blocks):
        for i in range(n):
            s = 2 if stage > 0 and i == 0 else 1
            branch = stax.serial(*pre(), stax.Conv(WIDTH, (3, 3), strides=(s, s), padding="SAME", **conv), *pre(),
                                 stax.Conv(WIDTH, (3, 3), padding="SAME", **conv))
            skip = (stax.DotGeneral(lhs=mu) if s == 1 else
                    stax.serial(*pre(), stax.Conv(WIDTH, (1, 1), strides=(2, 2), padding="SAME", **conv),
                                stax.DotGeneral(lhs=mu)))
            body.append(stax.serial(stax.FanOut(2), stax.parallel(skip, branch), stax.FanInSum()))
    return stax.serial(*body), mf.Network(mf.resnet_v2(blocks, phi=phi, mu=mu))


CASES = [  # (block, activation, mu, sigma_w, sigma_b, depth[, read-out])
    ("conv-same", "relu", 0.8, 1.3, 0.2, 6),
    ("conv-same", "erf", None, 1.6, 0.1, 4),
    ("conv-same", "gelu", 0.9, 1.2, 0.3, 10),
    ("conv-circular", "erf", 0.7, 1.4, 0.2, 6),
    ("pool-conv", "relu", 0.8, 1.3, 0.2, 5),
    ("ln-conv", "gelu", 0.9, 1.5, 0.1, 6),
    ("valid-strided", "relu", None, 1.4, 0.1, 2),
    ("same-strided", "erf", None, 1.4, 0.1, 3),
    ("conv-same", "relu", 0.8, 1.3, 0.2, 6, "flatten"),
    ("pool-conv", "gelu", 0.7, 1.2, 0.3, 5, "flatten"),
    ("conv-circular", "erf", None, 1.5, 0.2, 4, "flatten"),
    # a body of three stages (5 x 5 -> 3 x 3 -> 2 x 2, two projection shortcuts) as one block
    ("resnet-v2", "relu", 0.8, 1.3, 0.2, 2),
    ("resnet-v2", "gelu", 0.6, 1.2, 0.3, 3, "flatten"),
]


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def table():
    x = images()
    rows, worst = [], 0.0
    for kind, phi, mu, sw, sb, depth, *rest in CASES:
        readout = rest[0] if rest else "mean"
        for param in ("ntk", "standard"):
            nt_block, ours = block(kind, phi, mu, sw, sb, param)
            inp = stax.Conv(WIDTH, (1, 1), W_std=sw, b_std=sb, parameterization=param)
            head = stax.Flatten() if readout == "flatten" else stax.GlobalAvgPool()
            _, _, kernel_fn = stax.serial(inp, *[nt_block] * (depth - 1), head)
            k = kernel_fn(x, x, ("nngp", "ntk"))
            r = mf.kernels(ours, x, depth=depth, sigma_w=sw, sigma_b=sb, parameterization=param,
                           width=float(WIDTH) if param == "standard" else None, readout=readout)
            e = (rel(r.nngp, k.nngp), rel(r.ntk, k.ntk))
            worst = max(worst, *e)
            rows.append(dict(block=kind, activation=phi, mu=mu, sigma_w=sw, sigma_b=sb, depth=depth,
                             parameterization=param, readout=readout, nngp_rel=e[0], ntk_rel=e[1]))
            print(f"{kind:14s} {phi:5s} mu={mu!s:5s} sw={sw} sb={sb} depth={depth:2d} {param:8s} {readout:7s} "
                  f"nngp {e[0]:.1e}  ntk {e[1]:.1e}", flush=True)
    print(f"worst relative difference: {worst:.2e}")
    return rows, worst


if __name__ == "__main__":
    print("jax", jax.__version__, "neural-tangents", neural_tangents.__version__)
    rows, worst = table()
    if "--out" in sys.argv:
        with open(sys.argv[sys.argv.index("--out") + 1], "w") as f:
            json.dump(dict(jax=jax.__version__, neural_tangents=neural_tangents.__version__, rows=rows,
                           worst=worst), f, indent=1)
