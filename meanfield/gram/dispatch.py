"""kernels: the arguments checked, the walk that fits the tree (pairs, the batch, the tokens), the result checked."""
from __future__ import annotations

import numpy as np

from .._validate import check_choice, check_int, check_real
from .batch import batch_layers
from .input_layer import InputLayer, feature_rows
from .pair_maps import PARAMETERIZATIONS, _checked_spec
from .pair_walk import PairWalk
from .result import Kernels
from .tokens import token_kernels

__all__ = ["kernels"]

_GETS = ("nngp", "ntk")


def kernels(arch=None, x1=None, x2=None, depth=None, sigma_w=None, sigma_b=None, parameterization: str = "ntk",
            get=("nngp", "ntk"), width=None, per_layer: bool = False, readout: str = "mean") -> Kernels:
    r"""NNGP and NTK Gram matrices of the network's output on inputs of any norms.

    Parameters
    ----------
    arch : Architecture, Network, tree or activation name
        The repeated block (MLPs: any activation, LayerNorm pre/post,
        RMSNorm, residual mu, LayerScale, BatchNorm in its large-batch
        limit; token blocks: ResMLP, MLP-Mixer, trees with token mixing).
    x1 : array (n1, d), or images (n1, T, d) for a token block
        With BatchNorm: the batch (n1 >= 2). Token blocks: T tokens of d
        features each; the kernels are those of the mean of h^depth over
        the tokens, in the limit of infinitely many channels and tokens
        (:mod:`meanfield.gram.tokens`: the rules, where the limit is exact,
        its finite-T error).
    x2 : array (n2, d) (images (n2, T, d) for a token block), optional
        Default: ``x1`` (the symmetric Gram matrix). Not with BatchNorm (the
        kernels depend on the batch; pass every input in ``x1``).
    depth : int >= 1
        Dense layers, as in ``monte_carlo``: the input layer
        h^1 = W x + b, then depth - 1 blocks. The kernels are those of h^depth.
    sigma_w, sigma_b : float
        Scales of every Dense layer whose scale is the symbol (the input layer
        included): K^1(x, x') = sigma_w^2 x.x'/d + sigma_b^2.
    parameterization : {'ntk', 'standard'}
        Which variables are trained (the table in :mod:`meanfield.gram`);
        the NNGP is the same.
    get : 'nngp', 'ntk' or a tuple of them
    width : float, optional
        Fan-in of the hidden layers; needed (only) for the standard
        parameterisation's NTK, which grows with it.
    per_layer : bool
        Also return the diagonal K^l(x1, x1) of every layer.
    readout : {'mean', 'flatten'}
        Inputs with positions (token blocks, convolutions) only: the output
        is the mean of h^depth over the positions ('mean', global average
        pooling: K = mean_{p,q} A_pq, as ``stax.GlobalAvgPool``) or all of
        h^depth, flattened, as a read-out layer of fan-in T C sees it
        ('flatten': K = mean_p A_pp, as ``stax.Flatten``); the NTK alike.

    Returns
    -------
    :class:`Kernels` with ``.nngp``, ``.ntk`` of shape (n1, n2).

    The recursion, per pair: K^{l+1} = block(K^l), Theta^{l+1} = (the
    Dense layers' own terms) + (derivative kernel) Theta^l, built from the
    primitives' ``gram`` rules (Jacot et al. 2018, Thm. 1; Arora et al.
    2019, eqs. 9-10; the layer rules of neural-tangents' ``stax``).
    """
    spec, get, depth, sw, sb, n_width = _checked_arguments(arch, depth, sigma_w, sigma_b, parameterization, get,
                                                           width, readout)
    want_ntk = "ntk" in get
    width = float(width) if width is not None else None
    if spec.has_tokens:
        # token blocks and convolutions: images (n, T, d), the (nT) x (nT) state of meanfield.gram.tokens
        K, Th, diag, K_se = token_kernels(spec, x1, x2, depth, sw, sb, parameterization, get, n_width, per_layer,
                                          readout)
        return Kernels(spec, sw, sb, depth, parameterization, width, K, Th, diag, None, readout, K_se)
    a = feature_rows("x1", x1)
    same = x2 is None
    b = a if same else feature_rows("x2", x2)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"x1 and x2 must have the same number of features, got {a.shape[1]} and {b.shape[1]}")
    if spec.couples_batch:
        _check_batch(a, same)
    inp = InputLayer(a, b, same, sw, sb, parameterization)
    n_eff = None
    if spec.couples_batch:
        C, T, Ka, Ta, diag, n_eff = batch_layers(spec, parameterization, want_ntk, sw, sb, n_width, inp, depth,
                                                 per_layer)
        Kb, Tb = Ka, Ta
    else:
        walk = PairWalk(spec, parameterization, want_ntk, sw, sb, n_width, inp, same)
        diag = walk.run(depth, per_layer)
        C, T, Ka, Kb, Ta, Tb = walk.C, walk.T, walk.Ka, walk.Kb, walk.Ta, walk.Tb
    _check_result(C, T if want_ntk else None, Ka, Kb, Ta, Tb, depth, sw, sb)
    return Kernels(spec, sw, sb, depth, parameterization, width, C if "nngp" in get else None,
                   T if want_ntk else None, np.array(diag) if per_layer else None,
                   np.array(n_eff) if n_eff is not None else None)


def _checked_arguments(arch, depth, sigma_w, sigma_b, parameterization, get, width, readout="mean"):
    """kernels' arguments checked: (spec, get as a tuple, depth, sigma_w, sigma_b, the hidden fan-in)."""
    spec = _checked_spec(arch, tokens_ok=True)
    check_choice("parameterization", parameterization, PARAMETERIZATIONS)
    check_choice("readout", readout, ("mean", "flatten"))
    if readout != "mean" and not spec.has_tokens:
        raise ValueError(f"readout={readout!r} is for inputs with positions (token blocks, convolutions); "
                         "this network's output has none, so leave readout='mean'")
    if isinstance(get, str):
        get = (get,)
    get = tuple(get)
    if not get or any(g not in _GETS for g in get):
        raise ValueError(f"get must be 'nngp', 'ntk' or a tuple of them, got {get!r}")
    if depth is None or sigma_w is None or sigma_b is None:
        raise ValueError("kernels needs depth, sigma_w and sigma_b")
    depth = check_int("depth", depth, 1)
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b)):
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar, got an array of shape {np.shape(v)}")
        check_real(name, v, minimum=0)
    if "ntk" in get and parameterization == "standard":
        if width is None:
            raise ValueError("width is needed for the standard parameterisation's NTK (it grows with the "
                             "hidden layers' fan-in); pass width=n or use parameterization='ntk'")
        check_real("width", width, minimum=1)
    n_width = float(width) if width is not None else 1.0
    return spec, get, depth, float(sigma_w), float(sigma_b), n_width


def _check_batch(a, same):
    """BatchNorm normalises over the batch, the rows of x1: x2 must be None and x1 have two rows or more."""
    if not same:
        raise ValueError("arch has a batch_norm(): the kernels depend on the whole batch, which is the rows of "
                         "x1; pass every input as x1 (x2 must be None) and take the block you need")
    if a.shape[0] < 2:
        raise ValueError("arch has a batch_norm(): it normalises over the batch (the rows of x1), which needs "
                         f"at least 2 rows, got {a.shape[0]}")


def _check_result(C, T, Ka, Kb, Ta, Tb, depth, sw, sb):
    """ValueError for a Gram matrix (T: None when not asked for) that is not finite or breaks Cauchy-Schwarz."""
    bad = [name for name, v in (("nngp", C), ("ntk", C if T is None else T)) if not np.all(np.isfinite(v))]
    if bad:
        raise ValueError(f"the {bad[0]} kernel is not finite at depth {depth} for sigma_w={sw:g}, "
                         f"sigma_b={sb:g} (beyond float64, or a normalisation of a zero signal)")
    # a last guard: whatever lost float64 precision (a user activation's two-point form, say) and broke
    # Cauchy-Schwarz is refused rather than returned
    with np.errstate(all="ignore"):
        for name, M, da_, db_ in (("nngp", C, Ka, Kb),) + ((("ntk", T, Ta, Tb),) if T is not None else ()):
            if np.any(np.abs(M) > np.sqrt(da_)[:, None] * np.sqrt(db_)[None, :] * (1 + 1e-8)):
                raise ValueError(f"the {name} Gram matrix lost float64 precision at depth {depth} for "
                                 f"sigma_w={sw:g}, sigma_b={sb:g} (kernels ~{np.max(np.abs(da_)):.1e} with "
                                 "near-parallel inputs); see meanfield.gram, Numerics")
