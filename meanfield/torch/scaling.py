r"""The scaling calculus on torch models: measurement with hooks, geometric initialisation, table 1 by MC.

- :func:`measure_scaling` runs forward and backward passes with hooks on
  every ``nn.Linear`` / ``nn.Conv{1,2,3}d`` and returns, per layer, the
  second moments E[x^2], E[y^2], E[Delta x^2], E[Delta y^2], E[W^2],
  E[Delta W^2] and from them the activation scaling factor varsigma and the
  layer scaling factor gamma three ways: intrinsic (eq. 2, from varsigma and
  E[W^2]), extrinsic (appendix C, from activations only) and as the
  weight-to-gradient ratio nu = E[Delta W^2] / E[W^2] (Prop. 3).
  The loss is a random linear functional sum(out * g), g ~ N(0, 1), so the
  output gradient is i.i.d. as SC section 3 assumes; per-sample quantities
  are reported (the paper's batch size 1).
- :func:`geometric_init_` sets E[W^2] = c / (k sqrt(n_in n_out)) (SC eq. 3)
  with c = 2 / k_typical by default and, optionally, the fixed input
  multipliers sqrt(k_typical / k) of SC section 6.2 as forward pre-hooks.
  :func:`fan_in_init_` and :func:`fan_out_init_` are the Kaiming baselines.
- :func:`check_table1` measures varsigma_out / varsigma_in for each
  operation of SC table 1 and compares with the printed claim.

Conventions: a layer's fan_in/fan_out are channels per group; the paper's k
is sqrt(prod(kernel_size)); spatial sizes rho^2 = prod(spatial dims).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

import numpy as np
import torch
from torch import nn

from .. import scaling as _sc

__all__ = [
    "LayerScaling",
    "measure_scaling",
    "scaled_layers",
    "GeometricInit",
    "geometric_init_",
    "fan_in_init_",
    "fan_out_init_",
    "Scale",
    "Table1Check",
    "check_table1",
    "scaling_ratio",
]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_LAYERS = (nn.Linear,) + _CONV


def scaled_layers(model: nn.Module):
    """(name, module) of every Linear / Conv layer, in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _LAYERS)]


def _layer_geometry(m: nn.Module):
    """fan_in, fan_out (per group), in_channels, kernel area k^2."""
    if isinstance(m, nn.Linear):
        return m.in_features, m.out_features, m.in_features, 1.0
    g = m.groups
    return m.in_channels // g, m.out_channels // g, m.in_channels, float(np.prod(m.kernel_size))


def _spatial(shape, m: nn.Module) -> float:
    """rho^2 of an activation of this shape at a Linear (features last) or Conv (channels at dim 1) layer."""
    inner = shape[1:-1] if isinstance(m, nn.Linear) else shape[2:]
    return float(np.prod(inner)) if len(inner) else 1.0


@dataclass
class LayerScaling:
    """Scaling-calculus quantities of one layer (per-sample second moments, averaged)."""

    name: str
    fan_in: int
    fan_out: int
    kernel_area: float
    rho2_in: float
    rho2_out: float
    x2: float = 0.0     # E[x^2], layer input
    y2: float = 0.0     # E[y^2], layer output
    dx2: float = 0.0    # E[Delta x^2]
    dy2: float = 0.0    # E[Delta y^2]
    w2: float = 0.0     # E[W^2]
    dw2: float = 0.0    # E[Delta W^2] per sample
    in_channels: int = 0
    out_channels: int = 0

    @property
    def varsigma_in(self) -> float:
        """varsigma of the layer input (eq. 1)."""
        return self.in_channels * self.rho2_in * self.dx2 * self.x2

    @property
    def varsigma_out(self) -> float:
        """varsigma of the layer output."""
        return self.out_channels * self.rho2_out * self.dy2 * self.y2

    @property
    def gamma(self) -> float:
        """Intrinsic gamma = varsigma_in / (C_in fan_out k^2 E[W^2]^2) (eq. 2; = eq. 2 for groups=1)."""
        return self.varsigma_in / (self.in_channels * self.fan_out * self.kernel_area * self.w2 ** 2)

    @property
    def gamma_extrinsic(self) -> float:
        """n_in k^2 rho_out^2 E[x^2]^2 E[Delta y^2] / E[y^2] (appendix C)."""
        return _sc.layer_scaling_factor_extrinsic(self.fan_in, (self.kernel_area,), (self.rho2_out,),
                                                  self.x2, self.y2, self.dy2).item()

    @property
    def nu(self) -> float:
        """Weight-to-gradient ratio E[Delta W^2] / E[W^2] (Prop. 3)."""
        return self.dw2 / self.w2


def measure_scaling(model: nn.Module, inputs: torch.Tensor | Callable[[torch.Generator], torch.Tensor], *,
                    n_repeats: int = 1, generator: torch.Generator | None = None,
                    layers: Iterable[nn.Module] | None = None, weight_gradients: bool = True) -> list[LayerScaling]:
    """Measure the scaling quantities of every Linear/Conv layer of ``model`` with hooks.

    Parameters
    ----------
    model : the network (its current weights are used; nothing is changed)
    inputs : a batch, or a function generator -> batch (fresh inputs per repeat)
    n_repeats : forward/backward passes to average over (fresh loss directions g)
    layers : restrict to these modules (default: all Linear/Conv layers)
    weight_gradients : also compute per-sample E[Delta W^2] (for ``nu``) with
        ``torch.func.vmap``; False skips it (``nu`` is then NaN)

    Returns
    -------
    list of :class:`LayerScaling`, in the order of ``model.named_modules()``.
    """
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    chosen = [(n, m) for n, m in scaled_layers(model) if layers is None or m in set(layers)]
    if not chosen:
        raise ValueError("model has no nn.Linear / nn.Conv layer to measure")
    stats, batches = _hooked_passes(model, chosen, inputs, int(n_repeats), gen)
    dw2 = _per_sample_weight_gradients(model, chosen, batches if weight_gradients else [])
    return [_layer_scaling(name, m, stats[id(m)], dw2[id(m)]) for name, m in chosen]


def _hooked_passes(model, chosen, inputs, n_repeats, gen):
    """Forward/backward passes of ``model`` with a Gaussian loss direction g, loss = sum(out * g).

    Returns ``({id(layer): [per-pass dict of x2, y2, dy2, dx2, x_shape, y_shape]}, [(x, g) per pass])``:
    the mean squares of each chosen layer's input, output and their gradients, read by hooks.
    """
    stats = {id(m): [] for _, m in chosen}
    cache: dict = {}
    handles = []

    def fwd_hook(mod, inp, out):
        cache[id(mod)] = (inp[0].detach(), out.detach())

    def bwd_hook(mod, grad_in, grad_out):
        x, y = cache.pop(id(mod))
        gx = grad_in[0]
        stats[id(mod)].append({
            "x2": x.pow(2).mean().item(), "y2": y.pow(2).mean().item(),
            "dy2": grad_out[0].detach().pow(2).mean().item(),
            "dx2": float("nan") if gx is None else gx.detach().pow(2).mean().item(),
            "x_shape": tuple(x.shape), "y_shape": tuple(y.shape)})

    for _, m in chosen:
        handles.append(m.register_forward_hook(fwd_hook))
        handles.append(m.register_full_backward_hook(bwd_hook))
    batches = []
    try:
        for _ in range(n_repeats):
            x = inputs(gen) if callable(inputs) else inputs
            x = x.detach().clone().requires_grad_(True)
            out = model(x)
            g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
            (out * g).sum().backward()
            model.zero_grad(set_to_none=True)
            batches.append((x.detach(), g))
    finally:
        for h in handles:
            h.remove()
    return stats, batches


def _per_sample_weight_gradients(model, chosen, batches):
    """{id(layer): [E[Delta W^2] per pass]} ([nan] without passes), from per-sample weight gradients.

    The paper's batch size 1, for the same inputs and loss directions: E[Delta W^2] then
    has no cross-sample terms, which vanish only on average and are noisy at small widths
    (full backward hooks cannot run under vmap).
    """
    params = {n: p.detach() for n, p in model.named_parameters()}
    weight_keys = {id(m): f"{n}.weight" if n else "weight" for n, m in chosen}

    def sample_loss(p, xb, gb):
        out = torch.func.functional_call(model, p, (xb[None],))
        return (out * gb[None]).sum()

    per_sample_grad = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))
    dw2 = {id(m): [float("nan")] for _, m in chosen}
    for x, g in batches:
        grads = per_sample_grad(params, x, g)
        for _, m in chosen:
            dw2[id(m)] = [v for v in dw2[id(m)] if v == v] + [grads[weight_keys[id(m)]].pow(2).mean().item()]
    return dw2


def _layer_scaling(name, m, rows, dw2) -> LayerScaling:
    """One layer's :class:`LayerScaling` from its per-pass hook rows and E[Delta W^2] values (averaged)."""
    fan_in, fan_out, c_in, k2 = _layer_geometry(m)
    c_out = m.out_features if isinstance(m, nn.Linear) else m.out_channels
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("x2", "y2", "dx2", "dy2")}
    return LayerScaling(name, fan_in, fan_out, k2, _spatial(rows[0]["x_shape"], m), _spatial(rows[0]["y_shape"], m),
                        w2=m.weight.detach().pow(2).mean().item(), dw2=float(np.mean(dw2)), in_channels=c_in,
                        out_channels=c_out, **mean)


# ---------------------------------------------------------------------------
# Initialisations.
# ---------------------------------------------------------------------------
class Scale(nn.Module):
    """A fixed scalar multiplier x -> alpha x (SC section 6.2, appendix B.6)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        return self.alpha * x

    def extra_repr(self):
        return f"alpha={self.alpha:.6g}"


@dataclass
class GeometricInit:
    """What :func:`geometric_init_` did: c, the typical k, per-layer E[W^2] and multipliers."""

    c: float
    typical_kernel_size: float
    variances: dict = field(default_factory=dict)     # layer name -> E[W^2]
    multipliers: dict = field(default_factory=dict)   # layer name -> input multiplier (k != typical)
    handles: list = field(default_factory=list)       # forward pre-hooks applying the multipliers

    def remove_multipliers(self):
        """Remove the multiplier hooks from the model."""
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _paper_k(m) -> float:
    return math.sqrt(_layer_geometry(m)[3])


def _fill_(m: nn.Module, var: float, generator, distribution: str):
    with torch.no_grad():
        shape = m.weight.shape
        if distribution == "normal":
            w = torch.randn(shape, generator=generator, dtype=torch.float64) * math.sqrt(var)
        elif distribution == "uniform":
            a = math.sqrt(3 * var)
            w = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * a
        else:
            raise ValueError(f"distribution={distribution!r} is not allowed; choose one of 'normal', 'uniform'")
        m.weight.copy_(w.to(m.weight))
        if m.bias is not None:
            m.bias.zero_()


def geometric_init_(model: nn.Module, c: float | Callable[[str, nn.Module], float] | None = None, *,
                    typical_kernel_size: float | None = None, multipliers: bool = True,
                    distribution: str = "normal", generator: torch.Generator | None = None) -> GeometricInit:
    """Geometric-mean initialisation E[W^2] = c / (k sqrt(n_in n_out)) (SC eq. 3), in place.

    Parameters
    ----------
    c : float, a function (name, module) -> float (e.g. the branch factor of SC
        section 11 inside residual blocks), or None for the paper's advice
        c = 2 / k_typical (section 6.2).
    typical_kernel_size : k_typical; default the most common k among the
        layers (ties: the smallest).
    multipliers : register a forward pre-hook multiplying the input of every
        layer with k != k_typical by sqrt(k_typical / k) (section 6.2), so
        the forward second moment follows eq. 6. The hooks are returned in
        ``GeometricInit.handles``.
    distribution : 'normal' or 'uniform' (any symmetric law with that second moment).

    Biases are set to zero (SC section 3, assumption 4).
    """
    layers = scaled_layers(model)
    if not layers:
        raise ValueError("model has no nn.Linear / nn.Conv layer to initialise")
    ks = [round(_paper_k(m), 12) for _, m in layers]
    if typical_kernel_size is None:
        counts = Counter(ks)
        top = max(counts.values())
        typical_kernel_size = min(k for k, n in counts.items() if n == top)
    k_typ = float(_sc._k(typical_kernel_size))
    if c is None:
        c = _sc.recommended_c(k_typ)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    out = GeometricInit(c if not callable(c) else float("nan"), k_typ)
    for (name, m), k in zip(layers, ks):
        fan_in, fan_out, _, k2 = _layer_geometry(m)
        cl = float(c(name, m)) if callable(c) else float(c)
        var = float(_sc.geometric_variance(fan_in, fan_out, (k2,), cl))
        _fill_(m, var, gen, distribution)
        out.variances[name] = var
        if abs(k - k_typ) > 1e-12:
            alpha = _sc.kernel_multiplier((k2,), k_typ)
            out.multipliers[name] = alpha
            if multipliers:
                out.handles.append(m.register_forward_pre_hook(
                    (lambda a: (lambda mod, args: (a * args[0],) + tuple(args[1:])))(alpha)))
    return out


def _kaiming_init_(model, variance_of, generator, distribution) -> dict:
    """Fill every scaled layer with E[W^2] = variance_of(fan_in, fan_out, k2); biases zero."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    out = {}
    for name, m in scaled_layers(model):
        fan_in, fan_out, _, k2 = _layer_geometry(m)
        out[name] = float(variance_of(fan_in, fan_out, k2))
        _fill_(m, out[name], gen, distribution)
    return out


def fan_in_init_(model: nn.Module, gain: float = 2.0, *, generator=None, distribution="normal") -> dict:
    """Kaiming fan-in E[W^2] = gain / (n_in k^2) (SC eq. 4); biases zero. Returns name -> variance."""
    return _kaiming_init_(model, lambda n_in, n_out, k2: _sc.fan_in_variance(n_in, (k2,), gain),
                          generator, distribution)


def fan_out_init_(model: nn.Module, gain: float = 2.0, *, generator=None, distribution="normal") -> dict:
    """Kaiming fan-out E[W^2] = gain / (n_out k^2) (SC eq. 4); biases zero. Returns name -> variance."""
    return _kaiming_init_(model, lambda n_in, n_out, k2: _sc.fan_out_variance(n_out, (k2,), gain),
                          generator, distribution)


# ---------------------------------------------------------------------------
# Table 1 by Monte Carlo.
# ---------------------------------------------------------------------------
def _varsigma(t: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Per-sample n rho^2 E[Delta x^2] E[x^2] for a batch (first dim = batch)."""
    return t[0].numel() * grad.pow(2).mean() * t.pow(2).mean()


def scaling_ratio(op: Callable[[torch.Tensor], torch.Tensor], make_input: Callable[[torch.Generator], torch.Tensor],
                  *, n_samples: int = 20, generator: torch.Generator | None = None):
    """varsigma_out / varsigma_in for ``op``: mean and standard error over ``n_samples`` batches.

    The output gradient is i.i.d. N(0, 1) (a random linear loss); ``op`` is
    called once per sample batch (an operation with random weights should
    draw them inside ``op``).
    """
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    vals = []
    for _ in range(int(n_samples)):
        x = make_input(gen).detach().requires_grad_(True)
        y = op(x)
        g = torch.randn(y.shape, generator=gen, dtype=y.dtype)
        (y * g).sum().backward()
        vals.append((_varsigma(y.detach(), g) / _varsigma(x.detach(), x.grad)).item())
    vals = np.asarray(vals)
    return float(vals.mean()), float(vals.std(ddof=1) / math.sqrt(len(vals)))


class Table1Check(NamedTuple):
    operation: str
    claimed: bool | None   # the paper's check mark (None: a case the table does not list)
    ratio: float           # measured varsigma_out / varsigma_in
    se: float
    maintains: bool        # |ratio - 1| < tolerance
    note: str


def _table1_cases(width, spatial, batch, dtype, wgen):
    def gauss(shape, scale=1.0):
        return lambda g: scale * torch.randn(shape, generator=g, dtype=dtype)

    img = (batch, width, spatial, spatial)
    vec = (8 * batch, width)  # as many entries per batch as the images

    def linear(x, n_out=2 * width):  # fresh fan-in weights at every call
        w = torch.randn(n_out, x.shape[-1], generator=wgen, dtype=x.dtype) / math.sqrt(x.shape[-1])
        return x @ w.T

    def conv(x, k, stride, n_out=width):
        w = torch.randn(n_out, x.shape[1], k, k, generator=wgen, dtype=x.dtype) / math.sqrt(x.shape[1] * k * k)
        return torch.nn.functional.conv2d(x, w, stride=stride)

    def skip(x):
        return x + linear(x, x.shape[-1])

    relu = torch.relu
    return [
        ("Linear layer", True, lambda x: linear(x), gauss(vec), "n_out = 2 n_in"),
        ("(Strided) convolution", True, lambda x: conv(x, 2, 2, 2 * width), gauss(img), "k = stride = 2"),
        ("Convolution, stride 1 (k = 3, no padding)", None, lambda x: conv(x, 3, 1), gauss(img),
         "not in the table: holds on average for any stride"),
        ("Skip connections", True, skip, gauss(vec), "x + W x, W fan-in"),
        ("Average pooling", True, lambda x: torch.nn.functional.avg_pool2d(x, 2), gauss(img),
         "centred input, k = stride = 2"),
        ("Average pooling after ReLU", None, lambda x: torch.nn.functional.avg_pool2d(relu(x), 2),
         lambda g: torch.randn(img, generator=g, dtype=dtype),
         "not in the table: non-centred input breaks it (ratio vs. the ReLU input)"),
        ("Max pooling", False, lambda x: torch.nn.functional.max_pool2d(x, 2), gauss(img), "k = stride = 2"),
        ("Dropout", True, lambda x: torch.nn.functional.dropout(x, 0.3, training=True), gauss(vec), "p = 0.3"),
        ("ReLU/LeakyReLU", True, relu, gauss(vec), "ReLU"),
        ("LeakyReLU", True, lambda x: torch.nn.functional.leaky_relu(x, 0.2), gauss(vec), "slope 0.2"),
        ("Sigmoid", False, torch.sigmoid, gauss(vec), "unit-variance input"),
        ("Tanh", False, torch.tanh, gauss(vec), "unit-variance input"),
        ("Tanh, linear regime", True, torch.tanh, gauss(vec, 1e-2), "input std 0.01"),
    ]


def check_table1(*, width: int = 64, spatial: int = 8, batch: int = 32, n_samples: int = 16, tol: float = 0.03,
                 seed: int = 0, dtype=torch.float64) -> list[Table1Check]:
    """Measure varsigma_out / varsigma_in by Monte Carlo for the operations of SC table 1.

    An operation "maintains scaling" when the measured ratio is within
    ``tol`` of 1 (the Monte-Carlo standard errors at the defaults are a few
    per mille). Dropout is measured in training mode (PyTorch's 1/(1-p)
    rescaling included, which does not change the conclusion, SC B.5).
    """
    gen = torch.Generator().manual_seed(int(seed))
    wgen = torch.Generator().manual_seed(int(seed) + 1)
    out = []
    for name, claimed, op, make_input, note in _table1_cases(width, spatial, batch, dtype, wgen):
        if name == "Dropout":
            torch.manual_seed(int(seed))  # dropout masks use the global generator
        ratio, se = scaling_ratio(op, make_input, n_samples=n_samples, generator=gen)
        out.append(Table1Check(name, claimed, ratio, se, abs(ratio - 1.0) < tol, note))
    return out
