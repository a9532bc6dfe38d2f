r"""Finite-width corrections: chi_Delta and the l0 = 0 APJN (Lemma D.1, D.4).

With a finite input dimension N_0 the APJN from the input picks up an
O(1/N_0) term in its first factor (partial-Jacobian paper, eqs. 33 and 36):

    J^{0,l} = sigma_w^2 (chi_J^1 + (2 sigma_w^2 / N_0) chi_Delta^1 q_0) prod_{l'=2}^{l-1} chi_J^{l'},

with q_0 = |x|^2 / N_0 the input's mean square and chi_Delta^1 =
sigma_w^2 E[phi''(h)^2 + phi'(h) phi'''(h)] at the first layer's kernel K^1
(Definition D.2; in the weak sense, = sigma_w^2 d/dK E[phi'(h)^2] by Price's
theorem, which is how the symbolic layer writes it; for ReLU-like
activations it is 0). For blocks other than the plain MLP the symbolic
layer's ``chi_Delta`` is the same first-order variation of chi_J, one
activation at a time. Hidden layers contribute O(1/N_l) terms that vanish
at infinite width (Remark D.3), so APJNs with l0 > 0 have no such term.
"""
from __future__ import annotations

import numpy as np

from .. import _fnindex as KN
from .._validate import check_nonnegative
from ._common import _expr, as_output, prepare, require_point, variances
from .fixed import kernel_profile

__all__ = ["chi_Delta", "l0_correction", "apjn_from_input"]


def chi_Delta(arch=None, sigma_w=None, sigma_b=None, K=None, **arch_kwargs):
    """chi_Delta (Definition D.2) at kernel K (default: the unit input's K^1 = sigma_w^2 + sigma_b^2)."""

    arch, comp = prepare(arch, arch_kwargs)
    sw, sb, W, T = variances(sigma_w, sigma_b)
    K = W + T if K is None else check_nonnegative("K", K)
    shape = np.broadcast(K, W, T).shape
    return as_output(_expr(comp, KN.CHI_DELTA, K, W, T), shape)


def l0_correction(arch=None, sigma_w=None, sigma_b=None, N0=None, q0=1.0, **arch_kwargs):
    """J^{0,l}(N_0) / J^{0,l}(N_0 = inf) = 1 + (2 sigma_w^2 / N_0) chi_Delta^1 q_0 / chi_J^1 (eq. 33).

    ``q0`` is |x|^2 / N_0 of the input (1 for the unit-norm input, whose K^1 is
    sigma_w^2 q0 + sigma_b^2).
    """

    arch, comp = prepare(arch, arch_kwargs)
    if N0 is None:
        raise ValueError("l0_correction needs the input dimension N0 (a positive integer)")
    N0 = check_nonnegative("N0", N0)
    if np.any(N0 < 1):
        raise ValueError(f"N0 must be >= 1, got {N0!r}")
    q0 = check_nonnegative("q0", q0)
    sw, sb, W, T = variances(sigma_w, sigma_b)
    K1 = W * q0 + T
    shape = np.broadcast(K1, N0).shape
    d = _expr(comp, KN.CHI_DELTA, K1, W, T).reshape(np.broadcast(K1, W, T).shape)
    x = _expr(comp, KN.CHI_J, K1, W, T).reshape(np.broadcast(K1, W, T).shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 1.0 + 2.0 * W * d * q0 / (N0 * x)
    # sigma_w = 0: both J^{0,l} are 0 and the correction term carries 2 sigma_w^2 / N_0,
    # so the ratio is its limit 1 (not 0/0)
    out = np.where(W == 0.0, 1.0, out)
    return as_output(np.broadcast_to(out, shape), shape)


def apjn_from_input(arch=None, sigma_w=None, sigma_b=None, depth=None, N0=None, q0=1.0, **arch_kwargs):
    """J^{0,l} for l = 1..depth (Lemma D.4): sigma_w^2 times the layer factors, with the
    finite-N_0 correction of the first factor when ``N0`` is given (None: N_0 = inf).

    At sigma_w = 0 the network ignores its input: J^{0,l} = 0 exactly."""
    arch, _ = prepare(arch, arch_kwargs)
    q0 = check_nonnegative("q0", q0)
    for name, v in (("sigma_w", sigma_w), ("sigma_b", sigma_b), ("q0", q0)):
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar for apjn_from_input, got an array of shape {np.shape(v)}")
    sw, sb, W, T = (float(v) for v in variances(sigma_w, sigma_b))
    prof = kernel_profile(arch, sw, sb, depth, K0=W * float(q0) + T)
    J = W * prof.J
    if N0 is not None:
        J = J.copy()
        J[1:] *= l0_correction(arch, sigma_w, sigma_b, N0=N0, q0=q0)
    return J
