r"""The spec of a network: :class:`Network` (a tree of primitives), the :class:`Architecture` menu, JSON.

The primitives themselves, with their state maps, APJN factors, Gram rules
and torch realisations, are in :mod:`meanfield.layers` (one module per
family); their names are re-exported here. In the infinite-width limit a
block maps the statistics of its input to those of its output, and the APJN
between block outputs factorises into one factor per primitive
(partial-Jacobian paper, Theorem 2.5 and eq. 14):

=====================  ===================================  ==========================
primitive              state map                            chi factor
=====================  ===================================  ==========================
Dense(sw, sb)          K -> sw^2 K + sb^2 (K12 likewise)    sw^2
Activation(phi)        K -> E[phi^2], K12 -> E[phi phi]     E[phi'(h)^2]
LayerNormPre           (K, K12) -> (1, K12/K)               1/K
LayerNormPost          q -> 1, q12 -> (q12-m^2)/(q-m^2)     1/(q - m^2) = 1/Var[phi]
BatchNorm (|B|->inf)   (K, K12) -> (1, 0)                   1/(K - K12)
Scale(eps)             K -> eps^2 K                         eps^2
Residual(mu, branch)   K -> K_branch + mu^2 K               chi_branch + mu^2
=====================  ===================================  ==========================

Sources: Dense/Activation eqs. 9, 11; LayerNormPre eq. 20 (D.4); LayerNormPost
eqs. 52-55 (D.5); Residual eqs. 57-60 (E) and 62, 67 (F) of the
partial-Jacobian paper; BatchNorm AutoInit Conjecture 3.1 (eq. 23) and
partial-Jacobian eqs. 24-25; Scale/LayerScale AutoInit appendix D.

Why the factors multiply: a Dense layer's fresh weights decorrelate the
Jacobian of what follows from what precedes, element-wise derivatives
(phi'(h)) enter only through their second moment, and normalisations have
deterministic derivatives at infinite width (the rank-one projection terms
of LayerNorm and the O(1/|B|) cross-sample terms of BatchNorm drop out of
the APJN). A Residual's cross terms vanish because its branch ends in
zero-mean weights. So every element-wise primitive must be followed, within
its block, by a Dense layer; :class:`Chain` checks this.

Conventions (also in docs/theory.md): standard parameterisation W ~ N(0,
sigma_w^2 / fan_in), b ~ N(0, sigma_b^2); APJN normalised by the output
width (partial-Jacobian eq. 3); ``ln_pre`` normalises preactivations before
phi and the skip adds the un-normalised h; ``ln_post`` normalises phi(h)
(appendix D.5); BatchNorm is per neuron over the batch, large-batch limit,
and the two-point state describes a pair of inputs of equal norm.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import sympy as sp

from . import symbols as S
from ._names import BLOCKS, NORMS
from ._validate import check_choice, is_number
from .activations import Activation, activation as _make_activation
from .layers import (ActivationLayer, BatchNorm, Chain, Dense, GramSignal, LayerNorm, LayerNormPost, LayerNormPre,
                     Primitive, Residual, RMSNorm, Scale, Signal, act, batch_norm, dense, layer_norm, mixer,
                     mixer_block, mlp, mlp_block, resmlp, resmlp_block, residual, rms_norm, scale, serial, short,
                     tree_from_json, tree_to_json)
from .layers.base import NoScalarRecursion, format_exact

__all__ = [
    "Signal",
    "GramSignal",
    "Primitive",
    "Dense",
    "ActivationLayer",
    "LayerNormPre",
    "LayerNormPost",
    "BatchNorm",
    "Scale",
    "LayerNorm",
    "RMSNorm",
    "Chain",
    "Residual",
    "TreeSpec",
    "Architecture",
    "Network",
    "serial",
    "residual",
    "dense",
    "act",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "scale",
    "mlp",
    "resmlp",
    "mixer",
    "tree_to_json",
    "tree_from_json",
    "to_json",
    "from_json",
    "NORMS",
    "BLOCKS",
    "mlp_block",
    "resmlp_block",
    "mixer_block",
    "as_architecture",
]


# ---------------------------------------------------------------------------
# The spec.
# ---------------------------------------------------------------------------
class TreeSpec:
    """What every spec (an :class:`Architecture` or a :class:`Network`) reads off its tree.

    Subclasses define :meth:`block_spec` (the repeated block as a primitive
    tree), ``mu`` and ``eps`` (the values of the symbols S.mu and S.eps in
    that tree, None where unset) and :meth:`parameters`. Nothing downstream
    asks for names of menu items: whether a block couples the inputs of a
    batch, has tokens or needs the pair state is read here, from the nodes.
    """

    def block_spec(self) -> Primitive:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def tree(self) -> Primitive:
        """The repeated block (same as :meth:`block_spec`)."""
        return self.block_spec()

    def nodes(self) -> tuple:
        """Every primitive of the block, depth first (Residual nodes included, Chains flattened)."""
        return tuple(self.block_spec().primitives())

    @property
    def pair_axis(self) -> str:
        """What the two members of the pair state differ in.

        'channels' when some layer mixes or normalises along channels of one
        token (the MLP-Mixer's channel MLP), else 'batch' (two inputs).
        """
        return "channels" if any(getattr(p, "axis", None) == "channels" for p in self.nodes()) else "batch"

    @property
    def couples_batch(self) -> bool:
        """True when a layer mixes the inputs of a batch (BatchNorm): Monte Carlo needs batch >= 2."""
        return any(isinstance(p, BatchNorm) for p in self.nodes())

    @property
    def has_tokens(self) -> bool:
        """True when a layer acts along tokens or positions (ResMLP, Mixer, a convolution): inputs carry a
        token axis, (n, T, d)."""
        return any(getattr(p, "axis", None) in ("tokens", "channels", "positions") for p in self.nodes())

    @property
    def position_dims(self) -> int:
        """The rank of the inputs' positions: 2 with a 2-D convolution (inputs (n, H, W, d)), else 1."""
        return max([getattr(p, "position_dims", 1) for p in self.nodes()] + [1])

    @property
    def normalises(self) -> bool:
        """True when a layer divides by a variance of its input (LayerNorm, RMSNorm, BatchNorm)."""
        return any(isinstance(p, (LayerNormPre, LayerNormPost, LayerNorm, RMSNorm, BatchNorm)) for p in self.nodes())

    @property
    def centres_features(self) -> bool:
        """True when a layer subtracts the mean over features (LayerNorm; the Mixer's channel LayerNorm)."""
        return any(isinstance(p, (LayerNormPre, LayerNormPost, LayerNorm)) for p in self.nodes())

    def activations(self) -> tuple:
        """The distinct activations of the block, in order."""
        out = []
        for p in self.nodes():
            if isinstance(p, ActivationLayer) and p.phi not in out:
                out.append(p.phi)
        return tuple(out)

    def initial_pair_covariance(self, sigma_w, sigma_b, input_overlap=0.0):
        """K12 at the first layer's output h^1 (default for the solvers' ``K12_0``).

        Two unit-norm inputs with overlap x.x'/N0 = ``input_overlap`` share the
        first layer's W and b: K12^1 = sigma_w^2 overlap + sigma_b^2. Two
        channels of the Mixer's per-token input layer have independent rows
        and biases: K12^1 = 0.
        """
        if self.pair_axis == "channels":
            return 0.0 * (sigma_w + sigma_b)
        return sigma_w**2 * input_overlap + sigma_b**2

    def mixer_limit_is_exact(self, sigma_b, token_overlap=0.0):
        """Whether the recursion of this block is its infinite-width limit at bias scale ``sigma_b``.

        Always True for blocks without a channel-pair state ('mlp', 'resmlp').
        For the Mixer (pair axis 'channels'; tokens and channels -> infinity)
        True only when sigma_b = 0, phi is odd
        (E[phi] = 0 at every variance) and the input's tokens are
        uncorrelated (``token_overlap`` = x_t . x_s / N0 for t != s is 0, as
        in :func:`meanfield.verification.monte_carlo`; patches of real images
        are correlated): otherwise each channel carries a part common to all
        tokens that the pair-of-channels state drops, and the recursion is an
        approximation (see :func:`mixer_block`).

        ``sigma_b``, ``token_overlap``: numbers or arrays (sigma_b >= 0,
        overlap in [-1, 1]); returns a bool or a bool array of their
        broadcast shape.
        """
        def arr(name, v, lo, hi):
            a = np.asarray(v, dtype=float) if is_number(v) or np.ndim(v) else None
            if a is None or not np.all(np.isfinite(a)) or np.any(a < lo) or np.any(a > hi):
                rng = f">= {lo:g}" if hi == np.inf else f"in [{lo:g}, {hi:g}]"
                raise ValueError(f"{name} must be a finite number {rng} (or an array of them), got {v!r}")
            return a

        sb = arr("sigma_b", sigma_b, 0.0, np.inf)
        rho = arr("token_overlap", token_overlap, -1.0, 1.0)
        sb, rho = np.broadcast_arrays(sb, rho)
        if self.pair_axis != "channels":   # no channel-pair state: the recursion is the limit
            exact = np.ones(sb.shape, dtype=bool)
        else:
            exact = (sb == 0) & (rho == 0) & self._odd_activations()
        return bool(exact) if exact.ndim == 0 else exact

    def _odd_activations(self) -> bool:
        """phi(-x) = -phi(x) for every activation of the block, checked on a grid
        (symbolic simplification can fail to decide)."""
        xs = np.linspace(-6.0, 6.0, 49)
        for phi in self.activations():
            f = phi.numpy()
            with np.errstate(all="ignore"):
                a, b = np.asarray(f(xs), float), np.asarray(f(-xs), float)
            if not (np.all(np.isfinite(a)) and np.all(np.abs(a + b) <= 1e-12 * (1 + np.abs(a)))):
                return False
        return True

    def require_values(self, what: str = "this computation"):
        """ValueError if the tree uses S.mu or S.eps and no value is set for it."""
        used = set()
        for p in self.nodes():
            for v in (getattr(p, "mu", None), getattr(p, "eps", None)):
                if isinstance(v, sp.Basic):
                    used |= v.free_symbols & {S.mu, S.eps}
        for sym, val in ((S.mu, self.mu), (S.eps, self.eps)):
            if sym in used and val is None:
                raise ValueError(f"{what} needs a value for {sym}: the tree of {self} uses the symbol {sym}; "
                                 f"pass Network(..., {sym}=value) or a number in the node")

    def to_json(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


def _check_tree(node, s: Signal, path: str) -> Signal:
    """Push the symbolic state through the tree, naming the node where a rule fails."""
    if isinstance(node, Chain):
        for i, p in enumerate(node.layers):
            s = _check_tree(p, s, f"{path}[{i}]")
        return s
    if isinstance(node, Residual):
        _check_tree(node.branch, s, f"{path}.branch")
        if node.shortcut is not None:
            _check_tree(node.shortcut, s, f"{path}.shortcut")
    try:
        out = node.forward(s)
        if isinstance(node, Residual):
            # a residual's output is a zero-mean Gaussian: what follows is checked on fresh symbols, so that the
            # check of a deep body of stages does not carry expressions nested through every block
            return s.to(S.K, S.K12)
        return out
    except NoScalarRecursion:
        # valid, with no single-input recursion (the solvers refuse it): what follows sees a Gaussian
        return s.to(S.K, S.K12)
    except ValueError as err:
        raise ValueError(f"invalid tree at {path} = {short(node)}: {err}") from None


@dataclass(frozen=True)
class Network(TreeSpec):
    """A network given by its repeated block, a tree of primitives: the general spec.

    Parameters
    ----------
    block : Primitive or sequence of primitives
        One block, h^{l+1} = block(h^l), built with :func:`serial`,
        :func:`residual`, :func:`dense`, :func:`act`, :func:`layer_norm`,
        :func:`rms_norm`, :func:`batch_norm`, :func:`scale` or the factories
        :func:`mlp`, :func:`resmlp`, :func:`mixer`. A sequence is a serial.
    mu, eps : float or None
        Values of the symbols mu and eps where the tree uses them (a node
        built with ``residual(..., mu=None)`` or ``scale(None)``); numbers
        in the tree need none. They are runtime arguments of the compiled
        code, so scanning them does not recompile.
    depth : int or None
        How many times the block repeats (what :func:`from_torch` read off a
        model); informative, the solvers take their own ``depth``.
    name : str or None
        Shown in reports; default, the composition call of the block.

    Every public function that takes an Architecture takes a Network:
    ``recursion``, the solvers, ``kernel_profile``, ``phase_diagram``,
    ``exponents``, ``verification.monte_carlo``. An invalid tree (an
    element-wise node not followed by a dense layer in its block, a residual
    branch not ending in zero-mean weights, a node that needs a Gaussian
    input after an activation) is a ValueError naming the node.
    """

    block: Primitive
    mu: float | None = None
    eps: float | None = None
    depth: int | None = None
    name: str | None = None

    def __post_init__(self):
        block = self.block
        if isinstance(block, (list, tuple)):
            block = serial(*block)
        if not isinstance(block, Primitive):
            raise ValueError(f"block must be a primitive tree (serial(...), mlp(...), ...), got {block!r}")
        object.__setattr__(self, "block", block)
        for name, lo, hi in (("mu", 0, 1), ("eps", 0, None)):
            v = getattr(self, name)
            if v is not None:
                if not is_number(v) or float(v) < lo or (hi is not None and float(v) > hi):
                    rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
                    raise ValueError(f"{name} must be a number {rng} or None, got {v!r}")
                object.__setattr__(self, name, float(v))
        if self.depth is not None:
            if not isinstance(self.depth, (int, np.integer)) or isinstance(self.depth, bool) or self.depth < 1:
                raise ValueError(f"depth must be an integer >= 1 or None, got {self.depth!r}")
            object.__setattr__(self, "depth", int(self.depth))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"name must be a string or None, got {self.name!r}")
        _check_tree(block, Signal.input(self.pair_axis), "block")

    def block_spec(self) -> Primitive:
        return self.block

    @property
    def residual(self) -> bool:
        return any(isinstance(p, Residual) for p in self.nodes())

    def parameters(self) -> dict:
        """Numeric values of the structural symbols (mu, eps) that are set."""
        vals = {}
        if self.mu is not None:
            vals[S.mu] = self.mu
        if self.eps is not None:
            vals[S.eps] = self.eps
        return vals

    def with_(self, **changes) -> "Network":
        """A copy with some fields changed (``net.with_(mu=0.5)``)."""
        return replace(self, **changes)

    def to_json(self) -> dict:
        """The network as JSON-able data; :func:`from_json` reads it back."""
        out = {"tree": tree_to_json(self.block)}
        for k in ("mu", "eps", "depth", "name"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    def to_dict(self) -> dict:
        return {"description": str(self), **self.to_json()}

    def __repr__(self):
        """``Network(residual(act('relu'), dense(), mu=0.9), depth=8)``: with the composition functions
        in scope (``from meanfield import *``) a Python expression that rebuilds the network."""
        args = [short(self.block, format_exact)]
        args += [f"{k}={format_exact(getattr(self, k))}" for k in ("mu", "eps") if getattr(self, k) is not None]
        args += [f"{k}={getattr(self, k)!r}" for k in ("depth", "name") if getattr(self, k) is not None]
        return f"Network({', '.join(args)})"

    def __str__(self):
        text = self.name or short(self.block)
        vals = [f"{k}={getattr(self, k):g}" for k in ("mu", "eps") if getattr(self, k) is not None]
        if self.depth is not None:
            vals.append(f"depth={self.depth}")
        return text + (" [" + ", ".join(vals) + "]" if vals and not self.name else "")


def from_json(data) -> TreeSpec:
    """A spec from its JSON form: a Network ({"tree": ...}) or Architecture keywords.

    ``data`` may be a dict, a JSON string or a path to a .json file.
    """
    import json
    from pathlib import Path

    if isinstance(data, Path) or (isinstance(data, str) and data.strip().endswith(".json")
                                   and not data.strip().startswith("{")):
        path = Path(data)
        if not path.exists():
            raise ValueError(f"spec file {str(path)!r} does not exist")
        data = json.loads(path.read_text())
    elif isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, dict):
        raise ValueError(f"a spec is a JSON object, got {type(data).__name__}")
    data = dict(data)
    if "tree" in data:
        data.pop("description", None)
        tree = tree_from_json(data.pop("tree"))
        unknown = set(data) - {"mu", "eps", "depth", "name"}
        if unknown:
            raise ValueError(f"unknown network key(s) {sorted(unknown)}; allowed: tree, mu, eps, depth, name")
        return Network(tree, **data)
    data.pop("description", None)
    return as_architecture(None, **data)


def to_json(spec) -> dict:
    """The JSON form of an Architecture, a Network or a bare tree (see :func:`from_json`)."""
    spec = as_architecture(spec)
    return spec.to_json()


@dataclass(frozen=True)
class Architecture(TreeSpec):
    """The menu of built-in blocks: a shortcut that builds a primitive tree.

    ``Architecture(activation, norm, mu, block)`` is equivalent to
    ``Network(mlp(activation, norm, residual=mu is not None), mu=mu)`` (and the
    ResMLP / Mixer factories): the same tree, so the same recursions to the
    last digit. Use :class:`Network` and the composition functions
    (:func:`serial`, :func:`residual`, :func:`dense`, ...) for anything else.

    The symbolic layer (:func:`meanfield.recursion`), the numeric solvers and
    the torch realisation (:mod:`meanfield.verification`) are all built from
    it.

    Parameters
    ----------
    activation : str | sympy.Expr | Activation
        See :func:`meanfield.activations.activation`.
    norm : {'none', 'ln_pre', 'ln_post', 'bn'}
        Normalisation inside an MLP block (ignored by 'resmlp'; 'mixer' uses
        its own LayerNorms).
    mu : float or None
        Residual strength. None: no skip connection (plain MLP); a number in
        [0, 1]: h^{l+1} = branch(h^l) + mu h^l. ResMLP and Mixer blocks
        default to mu = 1.
    block : {'mlp', 'resmlp', 'mixer'}
        'mixer' is the infinite-width limit only for sigma_b = 0 with an odd
        activation and uncorrelated input tokens (:meth:`mixer_limit_is_exact`);
        elsewhere an approximation.
    eps : float
        LayerScale of ResMLP blocks (AutoInit appendix D; 0.1 for ResMLP-S12).
    stages : int
        norm -> phi -> Dense stages per MLP block (2 for a ResNet-style block).
    """

    activation: Activation = "relu"
    norm: str = "none"
    mu: float | None = None
    block: str = "mlp"
    eps: float = 0.1
    stages: int = 1
    activation_params: tuple = field(default=(), repr=False)

    def __post_init__(self):
        act = self.activation
        params = dict(self.activation_params)
        object.__setattr__(self, "activation", _make_activation(act, **params))
        norm = "none" if self.norm is None else self.norm
        check_choice("norm", norm, NORMS)
        object.__setattr__(self, "norm", norm)
        check_choice("block", self.block, BLOCKS)
        mu = self.mu
        if mu is None and self.block in ("resmlp", "mixer"):
            mu = 1.0
        if mu is not None:
            if not is_number(mu) or not 0 <= float(mu) <= 1:
                raise ValueError(f"mu must be a number in [0, 1] or None (no skip connection), got {self.mu!r}")
            mu = float(mu)
        object.__setattr__(self, "mu", mu)
        if not is_number(self.eps) or float(self.eps) < 0:
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))
        if not isinstance(self.stages, (int, np.integer)) or isinstance(self.stages, bool) or self.stages < 1:
            raise ValueError(f"stages must be an integer >= 1, got {self.stages!r}")
        object.__setattr__(self, "stages", int(self.stages))
        if self.block != "mlp" and self.norm != "none":
            raise ValueError(f"norm={self.norm!r} applies to block='mlp' only; "
                             f"block={self.block!r} fixes its own normalisation")

    # -- structure ------------------------------------------------------------
    @property
    def residual(self) -> bool:
        return self.mu is not None

    def block_spec(self) -> Primitive:
        """The block as a tree of primitives (symbolic parameters)."""
        if self.block == "mlp":
            return mlp_block(self.activation, self.norm, self.residual, self.stages)
        if self.block == "resmlp":
            return resmlp_block(self.activation, self.residual)
        return mixer_block(self.activation, self.residual)

    def parameters(self) -> dict:
        """Numeric values of the structural symbols (mu, eps) this block uses."""
        vals = {}
        if self.residual:
            vals[S.mu] = self.mu
        if self.block == "resmlp":
            vals[S.eps] = self.eps
        return vals

    def to_dict(self) -> dict:
        """The spec as plain data (JSON output, reports)."""
        return {"description": str(self), "activation": self.activation.name, "norm": self.norm, "mu": self.mu,
                "block": self.block, "eps": self.eps, "stages": self.stages}

    def to_json(self) -> dict:
        """The menu keywords (``from_json`` gives the Architecture back)."""
        out = {k: v for k, v in self.to_dict().items() if k != "description"}
        out.update({k: float(v) if isinstance(v, (int, float)) else v for k, v in self.activation_params})
        return out

    def network(self) -> "Network":
        """The same spec as a :class:`Network` (tree and values; same recursions)."""
        vals = self.parameters()
        return Network(self.block_spec(), mu=vals.get(S.mu), eps=vals.get(S.eps), name=str(self))

    def with_(self, **changes) -> "Architecture":
        """A copy with some fields changed (``arch.with_(mu=1.0)``)."""
        return replace(self, **changes)

    def __str__(self):
        parts = [self.activation.name]
        if self.block != "mlp":
            parts.insert(0, self.block)
        if self.norm != "none":
            parts.append(self.norm)
        if self.stages > 1:
            parts.append(f"stages={self.stages}")
        if self.residual:
            parts.append(f"mu={self.mu:g}")
        if self.block == "resmlp":
            parts.append(f"eps={self.eps:g}")
        return " + ".join(parts)


_ARCH_KEYS = ("activation", "norm", "mu", "block", "eps", "stages")


def as_architecture(arch=None, **kwargs) -> TreeSpec:
    """A spec from an Architecture, a Network, a primitive tree, a JSON dict or Architecture keywords.

    ``as_architecture(activation="erf")`` and ``as_architecture(Architecture(...))``
    both work; keywords that are not Architecture fields raise ValueError.
    ``negative_slope``, ``a_plus`` and ``a_minus`` are passed to the activation.
    """
    act_params = {k: kwargs.pop(k) for k in ("negative_slope", "a_plus", "a_minus") if k in kwargs}
    unknown = set(kwargs) - set(_ARCH_KEYS)
    if unknown:
        raise ValueError(f"unknown architecture option(s) {sorted(unknown)}; allowed: {', '.join(_ARCH_KEYS)}")
    if arch is None:
        return Architecture(activation_params=tuple(sorted(act_params.items())), **kwargs)
    if isinstance(arch, TreeSpec):
        if kwargs or act_params:
            raise ValueError("pass either an Architecture (or Network) or architecture keywords, not both")
        return arch
    if isinstance(arch, (Primitive, list, tuple)):
        if kwargs or act_params:
            raise ValueError("pass either a tree or architecture keywords, not both")
        return Network(arch)
    if isinstance(arch, dict):
        if kwargs or act_params:
            raise ValueError("pass either a JSON spec or architecture keywords, not both")
        return from_json(arch)
    if isinstance(arch, (str, sp.Basic)):
        return Architecture(activation=arch, activation_params=tuple(sorted(act_params.items())), **kwargs)
    raise ValueError(f"arch must be an Architecture, a Network, a primitive tree, an activation name or None, "
                     f"got {arch!r}")
