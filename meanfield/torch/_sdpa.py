"""Attention by composite operations, for forward-mode derivatives.

torch's fused attention kernels (``nn.MultiheadAttention``'s native fast path, the flash and memory-efficient
kernels of ``scaled_dot_product_attention`` on the CPU) have no forward-mode derivative, which the APJN probes
of :func:`~meanfield.torch.from_torch.monte_carlo_module` and :func:`~meanfield.torch.autoinit.autoinit`
(``torch.func.jvp``) need; inside :func:`composite_attention` torch takes its composite ("math") path, the
same function written in differentiable operations.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["composite_attention"]


@contextmanager
def composite_attention():
    """Within it, attention runs by composite operations (no fused kernel); torch's settings are restored."""
    mha = getattr(torch.backends, "mha", None)
    fast = mha.get_fastpath_enabled() if mha is not None else None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = sdpa_kernel([SDPBackend.MATH])
    except ImportError:   # an older torch: one attention kernel, with its derivative
        from contextlib import nullcontext
        backend = nullcontext()
    if mha is not None:
        mha.set_fastpath_enabled(False)
    try:
        with backend:
            yield
    finally:
        if mha is not None:
            mha.set_fastpath_enabled(fast)
