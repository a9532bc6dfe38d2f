r"""Monte-Carlo estimators of the APJN and the NNGP kernel (torch).

Two layers of API:

Generic (any torch function; used by AutoInit on arbitrary models)
    :func:`hutchinson_apjn` and :func:`exact_apjn` estimate the averaged
    partial-Jacobian norm of a function ``fn`` mapping a block input ``h`` to
    the block output, in the batch-aware normalisation of the AutoInit paper
    (eq. 3):

    .. math::

        \mathcal J = \frac{1}{|B| N_{out}} \sum_{x, x' \in B} \sum_{i, j}
        \Big(\frac{\partial \bar h^{out}_j(x')}{\partial \bar h^{in}_i(x)}\Big)^2
        = \frac{\|J\|_F^2}{\mathrm{numel}(\mathrm{out})},

    where J is the Jacobian of the whole output tensor with respect to the
    whole input tensor. Without cross-sample coupling (no BatchNorm) J is block
    diagonal over the batch and this is the per-sample APJN of the
    partial-Jacobian paper (eq. 3, normalised by the output width) averaged
    over the batch; with BatchNorm the derivatives across samples of the batch
    are included, as in AutoInit eqs. 3 and 7.

    The Hutchinson estimator uses E_v ||J v||^2 = ||J||_F^2 for v ~ N(0, I)
    on the input side, computed with forward-mode JVPs (the
    ``torch.autograd.forward_ad`` API, see :func:`jvp`):
    one JVP per probe, no Jacobian is ever formed. (AutoInit eq. 7 puts the
    probe on the output side, a VJP; both are unbiased for ||J||_F^2.)

Network-specific (the stacked networks of :mod:`.networks`)
    :func:`mean_se` and the helpers below reduce per-initialisation estimates
    to a mean and its standard error over initialisations.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

__all__ = [
    "APJNEstimate",
    "hutchinson_apjn",
    "exact_apjn",
    "mean_se",
    "jvp",
    "batch_statistics",
]


class APJNEstimate(NamedTuple):
    """An APJN estimate: ``mean`` (0-d tensor) and the per-probe ``samples``.

    Unpacks as ``mean, samples = hutchinson_apjn(...)``. ``se`` is the
    standard error of the mean over probes (0 for the exact estimator).
    Tensors keep their autograd graph when the function's parameters require
    grad, so ``mean`` can be used in a loss (AutoInit).
    """

    mean: torch.Tensor
    samples: torch.Tensor

    @property
    def se(self) -> torch.Tensor:
        n = self.samples.numel()
        if n < 2:
            return torch.zeros_like(self.mean)
        return self.samples.detach().std(unbiased=True) / n**0.5


def _check_fn_input(fn, h):
    if not callable(fn):
        raise ValueError(f"fn must be a callable mapping a tensor to a tensor, got {fn!r}")
    if not isinstance(h, torch.Tensor):
        raise ValueError(f"h must be a torch.Tensor, got {type(h).__name__}")
    if not (h.is_floating_point() or h.is_complex()):
        raise ValueError(f"h must be a floating-point tensor, got dtype {h.dtype}")


def hutchinson_apjn(fn: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, n_probes: int = 8,
                    generator: torch.Generator | None = None) -> APJNEstimate:
    r"""Hutchinson estimate of ||dfn/dh||_F^2 / numel(fn(h)) with Gaussian probes.

    Parameters
    ----------
    fn : callable
        Any torch function of one tensor (a block, a slice of a model, a
        closure over an ``nn.Module``). It is called once per probe with a
        dual tensor (forward-mode AD); modules with BatchNorm should be in the mode whose
        Jacobian you want (``train()`` for batch statistics).
    h : Tensor
        The block input, batch included (e.g. shape (B, N) or (B, C, H, W)).
    n_probes : int
        Number of Gaussian probes v ~ N(0, I) of the shape of ``h``.
    generator : torch.Generator, optional
        Source of the probes (on ``h.device``) for reproducible estimates.

    Returns
    -------
    APJNEstimate
        ``mean`` and per-probe ``samples`` ||J v_k||^2 / numel(out); the
        estimator is unbiased, with variance 2 ||J^T J||_F^2 / numel(out)^2
        per probe for Gaussian probes.
    """
    _check_fn_input(fn, h)
    if not isinstance(n_probes, int) or n_probes < 1:
        raise ValueError(f"n_probes must be an integer >= 1, got {n_probes!r}")
    samples = []
    for _ in range(n_probes):
        v = torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)
        out, jv = jvp(fn, h, v)
        samples.append(jv.pow(2).sum() / out.numel())
    samples = torch.stack(samples)
    return APJNEstimate(samples.mean(), samples)


def jvp(fn: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, v: torch.Tensor):
    """(fn(h), J v) by forward-mode AD (``torch.autograd.forward_ad`` dual numbers).

    The dual-number API runs ``fn`` as ordinary eager code, so modules that
    update buffers (BatchNorm in training mode) work, and the result keeps
    its autograd graph to the function's parameters (AutoInit differentiates
    the estimate). It is also cheaper than ``torch.func.jvp`` for BatchNorm,
    whose functorch decomposition is re-scripted on every call; the two give
    the same numbers (tests/test_verification_estimators.py).
    """
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        out = fn(fwAD.make_dual(h, v))
        primal, tangent = fwAD.unpack_dual(out)
        if tangent is None:  # output does not depend on h
            tangent = torch.zeros_like(primal)
    return primal, tangent


class batch_statistics:
    """Context manager: BatchNorm layers of ``module`` use batch statistics, buffers untouched.

    Inside the block every ``torch.nn.modules.batchnorm._BatchNorm`` of
    ``module`` normalises with the statistics of the current batch (as in
    training) and does not update its running mean/variance, so APJN
    estimates (AutoInit eq. 3, batch-aware) leave the model unchanged.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self._saved = []

    def __enter__(self):
        from torch.nn.modules.batchnorm import _BatchNorm

        for m in self.module.modules():
            if isinstance(m, _BatchNorm):
                self._saved.append((m, m.training, m.track_running_stats))
                m.train()
                m.track_running_stats = False
        return self.module

    def __exit__(self, *exc):
        for m, training, track in self._saved:
            m.train(training)
            m.track_running_stats = track
        self._saved.clear()
        return False


def exact_apjn(fn: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor) -> APJNEstimate:
    """Exact ||dfn/dh||_F^2 / numel(fn(h)) from the full Jacobian (small tensors only).

    The Jacobian has numel(out) x numel(h) entries; it is built with
    ``torch.func.jacfwd`` (reverse mode, ``torch.autograd.functional.jacobian``,
    for functions that mutate captured state). Returns an :class:`APJNEstimate` whose single
    sample is the exact value.
    """
    _check_fn_input(fn, h)
    try:
        out, jac = fn(h), torch.func.jacfwd(fn)(h)
    except RuntimeError as err:
        if "mutate a captured Tensor" not in str(err) and "in-place" not in str(err):
            raise
        out = fn(h)
        jac = torch.autograd.functional.jacobian(fn, h, create_graph=torch.is_grad_enabled())
    val = jac.pow(2).sum() / out.numel()
    return APJNEstimate(val, val.reshape(1))


def mean_se(values: torch.Tensor, dim: int = 0):
    """Mean over ``dim`` and its standard error std(ddof=1)/sqrt(n)."""
    n = values.shape[dim]
    mean = values.mean(dim)
    if n < 2:
        return mean, torch.full_like(mean, float("nan"))
    return mean, values.std(dim, unbiased=True) / n**0.5
