"""AutoInit tuning dynamics of ReLU (and linear) MLPs: closed forms, no torch.

AutoInit paper (He, Doshi, Gromov, arXiv:2206.13568), section 2.1 and
appendix C.1. A ReLU MLP ``h^{l+1} = a_W^{l+1} W^{l+1} relu(h^l) + a_b^{l+1} b^{l+1}``
with ``W ~ N(0, sigma_w^2/N_l)`` has, at infinite width,

    J^{l,l+1} = (a_W^{l+1} sigma_w)^2 / 2,

independent of the kernel ``K^l`` and of every other ``a``. The gradient of the
loss with respect to ``a_W^{l+1}`` therefore only involves ``J^{l,l+1}`` (for
ReLU chi_Delta = 0, paper eq. 28), and plain SGD on the auxiliary scalars
(Algorithm 2) moves each ``s_l = sqrt(J^{l,l+1}) = a_W^{l+1} sigma_w / sqrt(2)``
independently:

    JLL, L = 1/2 sum_l log(J_l)^2   (eq. 12):  s(t+1) = s(t) - lr sigma_w^2 log(J(t)) / s(t)   (eq. 17)
    JSL, L = 1/2 sum_l (J_l - 1)^2:            s(t+1) = s(t) - lr sigma_w^2 s(t) (J(t) - 1)       (eq. 41)

Derivation (JLL): dL/da = log J * dlog J/da = 2 log J / a, so
``a(t+1) = a - 2 lr log J / a``; multiply by ``sigma_w/sqrt(2)`` and use
``a = sqrt(2) s / sigma_w``. (JSL: dL/da = (J - 1) 2J/a = (J - 1) a sigma_w^2.)

``sigma_w`` is the *base* standard deviation (the network at a = 1); ``s`` is
signed: when a step overshoots past a = 0 the sign of ``a`` flips and
``J = s^2`` stays positive, which is what a real run does.

From these maps:

* one-step learning rate (eqs. 19, 43): the ``lr`` that sends ``J^{l,l+1}`` to 1
  in one step, per layer;
* convergence bound ``eta_t`` (eqs. 18, 42): ``|s - 1|`` decreases at step t iff
  ``lr`` is below it, i.e. ``eta_t = 2 * one_step_lr`` (both losses);
* ``eta_0`` (eqs. 20, 44): ``eta_t`` at t = 0 with ``J(0) = (a_W sigma_w)^2 / 2``.

All four printed formulas (17-20 and 41-44) agree with this derivation
(checked symbolically in tests/test_autoinit_theory.py). At finite width the
same maps hold per network instance with ``sigma_w^2`` replaced by the
measured ``2 J^{l,l+1} / a_W^2`` (the exact Jacobian of a ReLU layer is exactly
quadratic in ``a_W``); ``meanfield.torch.autoinit`` uses that to make the
default learning rate of a ReLU MLP an exact one-step (Newton) step.

JKL (eqs. 24/45) with ``sigma_b = 0`` equals ``(1 + lam)`` JLL for ReLU
(paper appendix C.2), so its rates are the JLL ones divided by ``1 + lam``;
with ``sigma_b > 0`` that is only the large-depth limit.
"""
from __future__ import annotations

import numpy as np

from ._validate import check_choice, check_nonnegative, check_positive

__all__ = [
    "LOSSES",
    "relu_apjn",
    "relu_step",
    "relu_dynamics",
    "one_step_lr",
    "lr_bound",
    "eta_t",
    "eta_0",
]

LOSSES = ("jll", "jsl", "jkl")


def _loss(loss, lam):
    check_choice("loss", loss, LOSSES)
    lam = float(check_nonnegative("lam", lam))
    if loss != "jkl" and lam != 0.0:
        raise ValueError(f"lam={lam!r} is only used by loss='jkl'; got loss={loss!r}")
    return loss, lam


def _log_ratio(s):
    """(s - 1) / log(s) for s > 0, continuous at s = 1 (value 1)."""
    d = s - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(np.abs(d) < 1e-12, 1.0, d / np.log1p(np.where(np.abs(d) < 1e-12, 1.0, d)))
    return r


def relu_apjn(sigma_w, a_w=1.0):
    """Infinite-width ``J^{l,l+1} = (a_W sigma_w)^2 / 2`` of a ReLU layer (any sigma_b)."""
    sigma_w = check_nonnegative("sigma_w", sigma_w)
    a_w = np.asarray(a_w, dtype=np.float64)
    return (a_w * sigma_w) ** 2 / 2.0


def _signed_step(s, sigma_w, lr, loss, lam):
    J = s * s
    if loss == "jsl":
        return s - lr * sigma_w**2 * s * (J - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return s - lr * (1.0 + lam) * sigma_w**2 * np.log(J) / s


def relu_step(J, sigma_w, lr, loss="jll", lam=0.0):
    """``J^{l,l+1}(t+1)`` from ``J^{l,l+1}(t)`` after one SGD step (eq. 17 JLL, eq. 41 JSL).

    Assumes ``a_W(t) > 0`` (``sqrt(J)`` positive); use :func:`relu_dynamics` to
    follow a run that may overshoot past ``a_W = 0``. Broadcasts.
    """
    loss, lam = _loss(loss, lam)
    J = check_positive("J", J)
    sigma_w = check_positive("sigma_w", sigma_w)
    lr = check_nonnegative("lr", lr)
    s1 = _signed_step(np.sqrt(J), sigma_w, lr, loss, lam)
    return s1 * s1


def relu_dynamics(J0, sigma_w, lr, steps, loss="jll", lam=0.0):
    """``J^{l,l+1}(t)`` for t = 0..steps by iterating eq. 17 (JLL/JKL) or eq. 41 (JSL).

    ``J0``, ``sigma_w`` and ``lr`` broadcast (``lr`` may be per layer); the
    result has shape ``(steps + 1,) + broadcast shape``. Starts at a_W > 0;
    the sign of ``s = a_W sigma_w / sqrt(2)`` is carried, so overshooting runs
    are followed faithfully. Diverging runs give inf/nan entries, never an error.
    """
    loss, lam = _loss(loss, lam)
    J0 = check_positive("J0", J0)
    sigma_w = check_positive("sigma_w", sigma_w)
    lr = check_nonnegative("lr", lr)
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    s = np.sqrt(np.broadcast_to(J0, np.broadcast(J0, sigma_w, lr).shape)).astype(np.float64)
    out = [s * s]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for _ in range(int(steps)):
            s = _signed_step(s, sigma_w, lr, loss, lam)
            out.append(s * s)
    return np.stack(out)


def one_step_lr(J0, sigma_w, loss="jll", lam=0.0):
    """Learning rate that brings ``J^{l,l+1}`` to exactly 1 in one step.

    JLL (eq. 19): ``(sqrt(J0) - 1) sqrt(J0) / (sigma_w^2 log J0)`` (value
    ``1/(2 sigma_w^2)`` at J0 = 1); JKL: the same divided by ``1 + lam``
    (sigma_b = 0); JSL (eq. 43): ``1 / (sigma_w^2 sqrt(J0) (1 + sqrt(J0)))``.
    Per layer; broadcasts.
    """
    loss, lam = _loss(loss, lam)
    J0 = check_positive("J0", J0)
    sigma_w = check_positive("sigma_w", sigma_w)
    s = np.sqrt(J0)
    if loss == "jsl":
        return 1.0 / (sigma_w**2 * s * (1.0 + s))
    # (s - 1) s / (sigma_w^2 log s^2) = s (s - 1)/log(s) / (2 sigma_w^2)
    return s * _log_ratio(s) / (2.0 * sigma_w**2 * (1.0 + lam))


def lr_bound(J, sigma_w, loss="jll", lam=0.0):
    """Per-layer bound: ``|sqrt(J) - 1|`` decreases in the next step iff ``lr`` is below it.

    JLL (the bracket of eq. 18): ``2 (sqrt(J) - 1) sqrt(J) / (sigma_w^2 log J)``;
    JSL (bracket of eq. 42): ``2 / (sigma_w^2 sqrt(J) (1 + sqrt(J)))``.
    Equal to ``2 * one_step_lr``. Broadcasts; see :func:`eta_t` for the min over layers.
    """
    return 2.0 * one_step_lr(J, sigma_w, loss=loss, lam=lam)


def eta_t(J, sigma_w, loss="jll", lam=0.0):
    """Eq. 18 / 42: ``min over layers`` (the last axis of ``J``) of :func:`lr_bound`."""
    b = lr_bound(J, sigma_w, loss=loss, lam=lam)
    return np.min(b, axis=-1) if b.ndim else b


def eta_0(sigma_w, a_w=1.0, loss="jll", lam=0.0):
    """Eq. 20 (JLL) / 44 (JSL): the bound at t = 0 with ``J(0) = (a_W sigma_w)^2 / 2``.

    JLL: ``(a sigma_w - sqrt 2) a / (sigma_w (log[(a sigma_w)^2] - log 2))``;
    JSL: ``4 / (sigma_w^3 a (sqrt 2 + a sigma_w))``.
    """
    sigma_w = check_positive("sigma_w", sigma_w)
    a_w = check_positive("a_w", a_w)
    return lr_bound(relu_apjn(sigma_w, a_w), sigma_w, loss=loss, lam=lam)
