"""The context of one Monte-Carlo pass, and the tensor operations primitives realise themselves with.

:class:`Context` gives a pass its random numbers and its parameter values; the
primitives of :mod:`meanfield.layers` map the (I, P, S, B, T, N) layout of
:mod:`meanfield.torch.networks` with the helpers here (their ``torch_forward``
imports this module on use, so ``import meanfield`` stays free of torch).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import sympy as sp
import torch

from .. import symbols as S

__all__ = ["Context", "PROBE_STREAMS", "FUSED_EPILOGUE", "FAST_ERF", "is_plain", "param_view", "normalise",
           "rms_normalise", "check_affine_identity"]

_PARAM_SYMBOLS = (S.sigma_w, S.sigma_b, S.mu, S.eps)
#: Dense layers on the CPU apply scale and bias in one numba pass (torch/_fused.py; the same numbers as
#: torch's three passes, bit for bit); False restores the torch operations (benchmarks compare both)
FUSED_EPILOGUE = True
#: float32 erf networks on the CPU use torch/_fused.erf32 (within 0.54 ulp of erf, against 0.74 for torch.erf,
#: and ~20 % less CPU time); False restores torch.erf (the numbers then differ in the last bit here and there)
FAST_ERF = True
#: counter-based streams from here on are probes (see montecarlo._probes); below, the weight draws of a pass
PROBE_STREAMS = 1 << 31


# ---------------------------------------------------------------------------
# Random numbers and parameter values.
# ---------------------------------------------------------------------------
class Context:
    """Random numbers for the initialisations of one pass, and per-point parameter values.

    Two sources of standard normals, both giving initialisation i numbers that
    depend only on (seed, i), so results do not depend on how the
    initialisations are split into chunks or shards:

    * counter-based (``seed=`` and ``init_ids=``; the CPU default of
      :func:`~meanfield.verification.monte_carlo`): draw number n of the pass
      is stream n of :mod:`._philox` (Philox4x32-10 + ziggurat) for every
      initialisation, generated for all of them in one parallel call;
    * per-initialisation generators (``generators=``, one torch.Generator per
      initialisation, called in turn; used on CUDA, where the generators are
      the device's own Philox).

    Parameters
    ----------
    generators : list of torch.Generator, optional
        One per initialisation (on ``device``).
    params : dict
        Maps 'sigma_w', 'sigma_b', 'mu', 'eps' to 1-d arrays of length P
        (the parameter points).
    seed : int, optional
        With ``init_ids``: the counter-based source.
    init_ids : sequence of int, optional
        The global indices of the initialisations of this pass.
    """

    #: the shape of the positions of the pass's inputs ((H, W) for images; None: one axis of T), which
    #: convolutions read and update to their output's
    grid = None

    def __init__(self, generators: Sequence[torch.Generator] | None, params: dict, device, dtype, *,
                 seed: int | None = None, init_ids: Sequence[int] | None = None):
        if (generators is None) == (init_ids is None):
            raise ValueError("Context needs either generators (one per initialisation) or seed and init_ids")
        self.generators = None if generators is None else list(generators)
        self.seed = seed
        self.init_ids = list(init_ids) if init_ids is not None else list(range(len(self.generators)))
        self._draws = 0  # weight draws so far in this pass: the stream number of the next one
        self.device = torch.device(device)
        self.dtype = dtype
        arrays = {k: np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in params.items()}
        P = max(a.size for a in arrays.values())
        self.P = P
        self._values = {S.sigma_w: np.broadcast_to(arrays.get("sigma_w", np.ones(1)), (P,)),
                        S.sigma_b: np.broadcast_to(arrays.get("sigma_b", np.zeros(1)), (P,)),
                        S.mu: np.broadcast_to(arrays.get("mu", np.zeros(1)), (P,)),
                        S.eps: np.broadcast_to(arrays.get("eps", np.ones(1)), (P,))}
        self._cache: dict = {}

    @property
    def n_init(self) -> int:
        return len(self.init_ids)

    def normal(self, shape) -> torch.Tensor:
        """Standard normal tensor of shape (I, *shape): the pass's next weight draw, row i for initialisation i."""
        stream = self._draws
        self._draws += 1
        if stream >= PROBE_STREAMS:
            raise ValueError(f"more than {PROBE_STREAMS} weight draws in one pass")
        return self.stream(stream, shape)

    def stream(self, stream: int, shape) -> torch.Tensor:
        """Stream ``stream`` of every initialisation, shape (I, *shape) (counter-based source only)."""
        shape = tuple(int(s) for s in shape)
        if self.generators is not None:
            out = torch.empty((self.n_init,) + shape, device=self.device, dtype=self.dtype)
            for i, g in enumerate(self.generators):
                torch.randn(shape, generator=g, out=out[i])
            return out
        from ._philox import fill_normal

        flat = np.empty((self.n_init, math.prod(shape)),
                        dtype=np.float32 if self.dtype == torch.float32 else np.float64)
        fill_normal(flat, self.seed, self.init_ids, stream)
        out = torch.from_numpy(flat).view((self.n_init,) + shape)
        return out if self.device.type == "cpu" else out.to(self.device)

    def value(self, expr) -> torch.Tensor:
        """The parameter expression (a symbol or number, e.g. sigma_w) at every point: shape (P,)."""
        key = expr
        if key not in self._cache:
            e = sp.sympify(expr)
            free = e.free_symbols - set(_PARAM_SYMBOLS)
            if free:
                raise ValueError(f"parameter expression {e} has symbols {sorted(map(str, free))}; "
                                 "only sigma_w, sigma_b, mu, eps can be set numerically")
            f = sp.lambdify(_PARAM_SYMBOLS, e, modules="numpy")
            vals = np.broadcast_to(np.asarray(f(*(self._values[s] for s in _PARAM_SYMBOLS)),
                                              dtype=np.float64), (self.P,))
            self._cache[key] = torch.tensor(np.array(vals), device=self.device, dtype=self.dtype)
        return self._cache[key]


def is_plain(t: torch.Tensor) -> bool:
    """A tensor numba may write through: no autograd history, not wrapped by torch.func (jvp, vmap)."""
    return not t.requires_grad and not torch._C._functorch.is_functorch_wrapped_tensor(t)


def param_view(v: torch.Tensor) -> torch.Tensor:
    """(P,) -> (1, P, 1, 1, 1, 1) for broadcasting against z."""
    return v.view(1, -1, 1, 1, 1, 1)


def normalise(z: torch.Tensor, dim: int) -> torch.Tensor:
    """(h - mean) / std over ``dim`` (biased variance, no epsilon), with its exact JVP.

    y = (h - m) / s;  dy = (dt - mean(dt) - y * mean(y * dt)) / s.
    """
    h = z[:, :, :1]
    c = h - h.mean(dim, keepdim=True)
    s = c.pow(2).mean(dim, keepdim=True).sqrt()
    y = c / s
    if z.shape[2] == 1:
        return y
    t = z[:, :, 1:]
    dt = (t - t.mean(dim, keepdim=True) - y * (y * t).mean(dim, keepdim=True)) / s
    return torch.cat([y, dt], dim=2)


def rms_normalise(z: torch.Tensor, dim: int) -> torch.Tensor:
    """h / r with r = sqrt(mean h^2) over ``dim`` (no epsilon, no gain), with its exact JVP.

    y = h / r;  dr = mean(h dt) / r, so dy = (dt - y * mean(y * dt)) / r.
    """
    h = z[:, :, :1]
    r = h.pow(2).mean(dim, keepdim=True).sqrt()
    y = h / r
    if z.shape[2] == 1:
        return y
    t = z[:, :, 1:]
    return torch.cat([y, (t - y * (y * t).mean(dim, keepdim=True)) / r], dim=2)


def check_affine_identity(m, where: str):
    """ValueError unless a torch norm module's affine parameters are at their initial values (weight 1, bias 0):
    the theory's normalisations have none (``meanfield.torch.initialise_`` resets them)."""
    w = getattr(m, "weight", None)
    b = getattr(m, "bias", None)
    if w is not None and not torch.all(w.detach() == 1):
        raise ValueError(f"{where}: {type(m).__name__}.weight is not 1 (its value at initialisation); "
                         "meanfield.torch.initialise_ resets it")
    if b is not None and not torch.all(b.detach() == 0):
        raise ValueError(f"{where}: {type(m).__name__}.bias is not 0 (its value at initialisation)")
