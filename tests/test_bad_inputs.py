"""Bad-input matrix for the library, ``verification.monte_carlo`` / ``phase_diagram`` and ``autoinit``.

Every row is a call a user might make (plausible mistakes and adversarial
values) and the outcome the package promises:

* ``err(names)``: a ``ValueError`` or ``TypeError`` with a one-line message
  that names the argument(s) and is raised by meanfield's own code (a
  message from numpy, scipy, sympy or torch internals fails the row);
* ``val(check)``: a documented value (inf, 0, a limit, a flagged result):
  ``check`` is an expression in ``r`` (the result) and ``w`` (the warnings
  raised) that must be true;
* ``FIN``: a valid result whose every number is finite.

Anything else fails: another exception, a vague message, a silent NaN or
inf, a crash of the interpreter or a hang. Rows run in three subprocesses
(core library without torch, Monte Carlo, AutoInit), one per group, started
when a row of the group first runs (once per pytest-xdist run: the workers
share the reports through a locked file);
inside one, each row is isolated by try/except, its own warnings record and
a SIGALRM time limit; a row that does not report (a crash, or a hang inside
compiled code that SIGALRM cannot interrupt) fails by name when its
subprocess dies or runs out of time. The command-line rows live in
tests/test_bad_inputs_cli.py.

Run ``python tests/test_bad_inputs.py GROUP`` to see one group's raw report.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROW_SECONDS = 120        # per-row limit (a cold numba cache compiles a new architecture in ~30 s)
GROUP_SECONDS = 900      # per-subprocess limit

FIN = ("finite", None)


def err(*names):
    return ("error", names)


def val(check):
    return ("value", check)


GELU13 = "sigma_w=1.4082110131076, sigma_b=0.4158393809586"

# (id, group, code, expectation). ``mf``, ``np``, ``math``, ``sp`` (sympy), ``x`` (its Symbol), ``torch``,
# ``nn``, ``V`` (meanfield.verification) are in scope.
ROWS = [
    # -- sigma_w / sigma_b / K0 / K12_0 in the fixed-point solvers ---------------------------------
    ("fp-sw-negative", "core", "mf.fixed_point(activation='erf', sigma_w=-1.0)", err("sigma_w")),
    ("fp-sw-nan", "core", "mf.fixed_point(activation='erf', sigma_w=float('nan'))", err("sigma_w")),
    ("fp-sw-inf", "core", "mf.fixed_point(activation='erf', sigma_w=float('inf'))", err("sigma_w")),
    ("fp-sw-bool", "core", "mf.fixed_point(activation='erf', sigma_w=True)", err("sigma_w")),
    ("fp-sw-string", "core", "mf.fixed_point(activation='erf', sigma_w='1.5')", err("sigma_w")),
    ("fp-sw-complex", "core", "mf.fixed_point(activation='erf', sigma_w=1j)", err("sigma_w")),
    ("fp-sw-none", "core", "mf.fixed_point(activation='erf', sigma_w=None)", err("sigma_w")),
    ("fp-sw-huge", "core", "mf.fixed_point(activation='erf', sigma_w=1e200)", err("sigma_w")),
    ("fp-sw-array-nan", "core", "mf.fixed_point(activation='erf', sigma_w=np.array([1.0, np.nan]))", err("sigma_w")),
    ("fp-sb-negative", "core", "mf.fixed_point(activation='erf', sigma_b=-0.1, sigma_w=1.0)", err("sigma_b")),
    ("fp-shape-mismatch", "core", "mf.fixed_point(activation='erf', sigma_w=[1, 2, 3], sigma_b=[0.1, 0.2])",
     err("sigma_w", "sigma_b")),
    ("fp-point-missing", "core", "mf.chi_J(activation='tanh')", err("sigma_w")),
    ("fp-sb-missing", "core", "mf.fixed_point(activation='erf', sigma_w=1.0)", err("sigma_b")),
    ("mc-point-missing", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2)", err("sigma_w")),
    ("fp-K0-negative", "core", "mf.fixed_point(activation='erf', K0=-1.0, sigma_w=1.0, sigma_b=0.0)", err("K0")),
    ("fp-K0-nan", "core", "mf.fixed_point(activation='erf', K0=float('nan'), sigma_w=1.0, sigma_b=0.0)", err("K0")),
    ("fp-K0-shape", "core", "mf.fixed_point(activation='erf', sigma_w=[1, 2, 3], K0=[1, 2], sigma_b=0.0)", err("K0", "sigma_w")),
    ("fp-K12-too-big", "core", "mf.fixed_point_state(activation='relu', norm='bn', K0=1.0, K12_0=2.0, sigma_w=1.0, sigma_b=0.0)", err("K12_0")),
    ("fp-K12-nan", "core", "mf.fixed_point_state(activation='relu', norm='bn', K12_0=float('nan'), sigma_w=1.0, sigma_b=0.0)", err("K12_0")),
    ("fp-errors-bad", "core", "mf.fixed_point(activation='erf', errors='ignore', sigma_w=1.0, sigma_b=0.0)", err("errors")),
    ("fp-maxiter-zero", "core", "mf.fixed_point_state(activation='erf', maxiter=0, sigma_w=1.0, sigma_b=0.0)", err("maxiter")),
    ("fp-maxiter-float", "core", "mf.fixed_point_state(activation='erf', maxiter=2.5, sigma_w=1.0, sigma_b=0.0)", err("maxiter")),
    ("fp-maxiter-bool", "core", "mf.fixed_point_state(activation='erf', maxiter=True, sigma_w=1.0, sigma_b=0.0)", err("maxiter")),
    ("arch-activation-unknown", "core", "mf.fixed_point(activation='nope')", err("activation")),
    ("arch-norm-unknown", "core", "mf.fixed_point(activation='erf', norm='layer')", err("norm")),
    ("arch-mu-out-of-range", "core", "mf.Architecture('erf', mu=2)", err("mu")),
    ("arch-mu-negative", "core", "mf.Architecture('erf', mu=-1)", err("mu")),
    ("arch-eps-nan", "core", "mf.Architecture('erf', eps=float('nan'))", err("eps")),
    ("arch-stages-zero", "core", "mf.Architecture('erf', stages=0)", err("stages")),
    ("arch-block-unknown", "core", "mf.Architecture('erf', block='transformer')", err("block")),
    ("recursion-norm-unknown", "core", "mf.recursion(activation='erf', norm='foo')", err("norm")),
    ("activation-unknown", "core", "mf.activation('nope')", err("activation")),
    # valid and documented values
    ("fp-relu-divergent", "core", "mf.fixed_point(activation='relu', sigma_w=2.0, sigma_b=0.0)", val("r == math.inf")),
    ("fp-erf-zero-weights", "core", "mf.fixed_point(activation='erf', sigma_w=0.0, sigma_b=0.0)", val("r == 0.0")),
    ("chiJ-erf-zero-weights", "core", "mf.chi_J(activation='erf', sigma_w=0.0, sigma_b=0.3)", val("r == 0.0")),
    ("chiJ-gelu-huge", "core", "mf.chi_J(activation='gelu', sigma_w=1e6, sigma_b=0.0)", FIN),
    # GELU diverges with F(K) ~ sigma_w^2 K / 2 (phi(h)^2 ~ h^2 for h > 0, 0 below): chi_K* -> sigma_w^2 / 2
    ("chiK-gelu-divergent", "core", "mf.chi_K(activation='gelu', sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 2.0) < 1e-12")),
    ("chiJ-tanh-grid", "core", "mf.chi_J(activation='tanh', sigma_w=np.linspace(0.5, 2, 7), sigma_b=0.1)", FIN),
    ("fp-erf-lnpre-residual-huge", "core", "mf.fixed_point(activation='erf', mu=1.0, norm='ln_pre', sigma_w=1e3, sigma_b=0.0)",
     val("r == math.inf")),
    ("fp-sw-float32", "core", "mf.fixed_point(activation='erf', sigma_w=np.float32(1.2), sigma_b=0.1)", FIN),
    ("fp-K0-int", "core", "mf.fixed_point(activation='tanh', sigma_w=1.5, K0=2, sigma_b=0.0)", FIN),
    ("chiJ-broadcast-2d", "core", "mf.chi_J(activation='erf', sigma_w=[[1.0], [2.0]], sigma_b=[0.0, 0.5])",
     val("np.shape(r) == (2, 2) and np.all(np.isfinite(r))")),
    # -- user activations that oscillate or decay (issue 27 item 2): the one-point calls answer, checked
    # against K* and chi_J = sw^2 E[phi'^2] of the closed forms E[sin^2] = (1 - e^{-2K})/2,
    # E[cos^2] = (1 + e^{-2K})/2, E[exp(-2h^2)] = (1 + 4K)^(-1/2) (mpmath findroot at 30 digits)
    ("fp-sin", "core", "mf.fixed_point(activation=sp.sin(x), sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 1.9711965416141166) < 1e-10")),
    ("chiJ-sin", "core", "mf.chi_J(activation=sp.sin(x), sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 2.0388034583858834) < 1e-10")),
    ("fp-cos", "core", "mf.fixed_point(activation=sp.cos(x), sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 2.0435740787053118) < 1e-10")),
    ("chiJ-cos", "core", "mf.chi_J(activation=sp.cos(x), sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 1.9664259212946882) < 1e-10")),
    ("fp-gauss-bump", "core", "mf.fixed_point(activation=sp.exp(-x**2), sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 1.5152943463884991) < 1e-10")),
    ("chiJ-gauss-bump", "core", "mf.chi_J(activation=sp.exp(-x**2), sigma_w=2.0, sigma_b=0.1)",
     val("abs(r - 1.2921154012641233) < 1e-10")),
    # sin(x)/x is 0/0 at x = 0 as written: refused, naming the activation
    ("fp-sinc-undefined-at-0", "core", "mf.fixed_point(activation=sp.sin(x) / x, sigma_w=2.0, sigma_b=0.1)",
     err("activation")),
    ("critical-line-sinc", "core", "mf.critical_line(activation=sp.sin(x) / x, sigma_w=[1.0, 2.0])",
     err("activation")),
    # -- degenerate normalisations ------------------------------------------------------------------
    ("ln-zero-weights", "core", "mf.fixed_point(activation='erf', norm='ln_pre', sigma_w=0, sigma_b=0)",
     err("sigma_w", "sigma_b")),
    ("lnpost-zero-weights", "core", "mf.chi_J(activation='tanh', norm='ln_post', sigma_w=0, sigma_b=0)",
     err("sigma_w", "sigma_b")),
    ("ln-zero-weights-K0", "core",
     "mf.kernel_profile(activation='erf', norm='ln_pre', sigma_w=0, sigma_b=0, depth=4, K0=1.0)",
     err("sigma_w", "sigma_b")),
    ("ln-K0-zero", "core", "mf.fixed_point(activation='erf', norm='ln_pre', sigma_w=1, K0=0.0, sigma_b=0.0)", err("K0")),
    ("ln-K0-zero-profile", "core", "mf.kernel_profile(activation='erf', norm='ln_pre', sigma_w=1, sigma_b=0.1, "
     "depth=3, K0=0.0)", err("K0")),
    ("bn-identical-inputs", "core", "mf.fixed_point_state(activation='relu', norm='bn', K0=1.0, K12_0=1.0, sigma_w=1.0, sigma_b=0.0)",
     err("K12_0")),
    ("bn-identical-inputs-profile", "core",
     "mf.kernel_profile(activation='relu', norm='bn', sigma_w=1, sigma_b=0, depth=3, K0=1.0, K12_0=1.0)",
     err("K12_0")),
    ("bn-zero-weights", "core", "mf.fixed_point_state(activation='relu', norm='bn', sigma_w=0, sigma_b=0.5)",
     err("sigma_w")),
    ("ln-phase-diagram-corner", "core",
     "mf.phase_diagram(activation='erf', norm='ln_pre', sigma_w=[0.0, 1.0], sigma_b=[0.0, 0.5])",
     val("np.isnan(r.chi_J[0, 0]) and np.all(np.isfinite(r.chi_J.ravel()[1:]))")),
    # -- kernel_profile ----------------------------------------------------------------------------
    ("profile-overflow", "core", "mf.kernel_profile(activation='relu', sigma_w=1e6, sigma_b=0, depth=60)",
     val("any('overflows' in x for x in w) and np.isinf(r.K[-1]) and np.all(np.isfinite(r.chi_J))")),
    ("profile-overflow-gelu", "core", "mf.kernel_profile(activation='gelu', sigma_w=1e100, sigma_b=0, depth=5)",
     val("any('overflows' in x for x in w) and np.isinf(r.K[-1]) and not np.isnan(r.chi_J).any()")),
    ("profile-depth-huge", "core", "mf.kernel_profile(activation='erf', sigma_w=1, sigma_b=0, depth=10**10)",
     err("depth")),
    ("profile-depth-zero", "core", "mf.kernel_profile(activation='erf', sigma_w=1, sigma_b=0, depth=0)", err("depth")),
    ("profile-depth-float", "core", "mf.kernel_profile(activation='erf', sigma_w=1, sigma_b=0, depth=5.0)",
     err("depth")),
    ("profile-depth-bool", "core", "mf.kernel_profile(activation='erf', sigma_w=1, sigma_b=0, depth=True)",
     err("depth")),
    ("profile-depth-missing", "core", "mf.kernel_profile(activation='erf', sigma_w=1, sigma_b=0)", err("depth")),
    ("profile-shapes", "core", "mf.kernel_profile(activation='erf', sigma_w=[1, 2, 3], sigma_b=[0, 1], depth=3)",
     err("sigma_w", "sigma_b")),
    ("profile-tanh", "core", "mf.kernel_profile(activation='tanh', sigma_w=1.5, sigma_b=0.1, depth=50)",
     val("np.all(np.isfinite(r.K)) and np.all(np.isfinite(r.chi_J)) and r.K12 is None")),
    ("profile-bn", "core", "mf.kernel_profile(activation='relu', norm='bn', sigma_w=1.2, sigma_b=0.1, depth=20)",
     FIN),
    # -- exponents ---------------------------------------------------------------------------------
    ("exp-depth-huge", "core", "mf.exponents(activation='erf', sigma_w=1, sigma_b=0, depth=10**10)", err("depth")),
    ("exp-depth-small", "core", "mf.exponents(activation='erf', sigma_w=1, sigma_b=0, depth=10)", err("depth")),
    ("exp-sw-array", "core", "mf.exponents(activation='erf', sigma_w=[1, 2], sigma_b=0)", err("sigma_w")),
    ("exp-sw-missing", "core", "mf.exponents(activation='erf', sigma_b=0)", err("sigma_w")),
    ("exp-K0-negative", "core", "mf.exponents(activation='erf', sigma_w=1, sigma_b=0, K0=-1.0)", err("K0")),
    ("exp-critical-tol-negative", "core",
     "mf.exponents(activation='erf', sigma_w=1, sigma_b=0, critical_tol=-1.0)", err("critical_tol")),
    ("exp-relu-marginal", "core", "mf.exponents(activation='relu', sigma_w=2 ** 0.5, sigma_b=0)",
     val("r.regime == 'marginal' and r.zeta_K == 0.0")),
    ("exp-erf-ordered", "core", "mf.exponents(activation='erf', sigma_w=0.5, sigma_b=0.5)",
     val("r.regime == 'ordered' and math.isfinite(r.xi) and 'no power law' in r.note")),
    ("exp-gelu-13-digits", "core", f"mf.exponents(activation='gelu', {GELU13})",
     val("abs(r.zeta + 64.985) < 1e-3 and 'distance' in r.note and abs(r.zeta_numeric / r.zeta - 1) < 1e-3")),
    ("exp-gelu-13-digits-K0", "core", f"mf.exponents(activation='gelu', {GELU13}, K0=5.0)",
     val("abs(r.zeta + 64.985) < 1e-3 and 'distance' in r.note and abs(r.zeta_numeric / r.zeta - 1) < 1e-3")),
    ("exp-erf-critical", "core", "mf.exponents(activation='erf', sigma_w=math.sqrt(math.pi) / 2, sigma_b=0.0)",
     val("r.regime == 'critical point' and abs(r.zeta - 1) < 1e-9 and r.agree")),
    ("exp-relu-lnpre-mu1", "core", "mf.exponents(activation='relu', norm='ln_pre', mu=1.0, sigma_w=1.0, sigma_b=0.0)",
     val("r.regime == 'power-law growth' and r.agree")),
    # -- critical lines, points, fixed points -----------------------------------------------------
    ("line-gelu-unreached", "core", "mf.critical_line(activation='gelu', sigma_w=1.63)",
     val("not bool(r.reached) and abs(float(r.sigma_b) - 0.14759) < 5e-5 and abs(float(r.K_star) - 0.333) < 1e-3 "
         "and float(r.chi_K) > 1 and 'reached=False' in r.note")),
    ("line-gelu-none", "core", "mf.critical_line(activation='gelu', sigma_w=[0.5])",
     val("np.isnan(r.sigma_b[0]) and 'NaN' in r.note")),
    ("line-erf", "core", "mf.critical_line(activation='erf', sigma_w=[1.0, 1.5, 2.0])",
     val("np.all(np.isfinite(r.sigma_b)) and np.all(r.reached)")),
    ("line-Kstar-gelu", "core", "mf.critical_line(activation='gelu', K_star=[0.333, 3.0, 10.0])",
     val("np.all(np.isfinite(r.sigma_w)) and np.all(np.isfinite(r.sigma_b)) and list(r.reached) == "
         "[False, False, True]")),
    ("line-no-args", "core", "mf.critical_line(activation='erf')", err("sigma_w", "sigma_b", "K_star")),
    ("line-two-args", "core", "mf.critical_line(activation='erf', sigma_w=1.0, sigma_b=1.0)", err("sigma_w")),
    ("line-sw-negative", "core", "mf.critical_line(activation='erf', sigma_w=-1.0)", err("sigma_w")),
    ("line-sw-nan", "core", "mf.critical_line(activation='erf', sigma_w=[1.0, float('nan')])", err("sigma_w")),
    ("line-Kstar-negative", "core", "mf.critical_line(activation='erf', K_star=-1.0)", err("K_star")),
    ("line-Kstar-bn", "core", "mf.critical_line(activation='relu', norm='bn', K_star=1.0)", err("K_star")),
    ("cp-Kmax-negative", "core", "mf.critical_point(activation='erf', K_max=-1)", err("K_max")),
    ("cp-Kmax-nan", "core", "mf.critical_point(activation='erf', K_max=float('nan'))", err("K_max")),
    ("cp-Kmax-inf", "core", "mf.critical_point(activation='erf', K_max=float('inf'))", err("K_max")),
    ("cp-Kmax-1e300", "core", "mf.critical_point(activation='erf', K_max=1e300)", err("K_max")),
    ("cp-Kmax-string", "core", "mf.critical_point(activation='erf', K_max='big')", err("K_max")),
    ("cp-erf", "core", "mf.critical_point(activation='erf')",
     val("len(r) == 1 and abs(r[0].sigma_w - math.sqrt(math.pi) / 2) < 1e-12")),
    ("fps-Kmax-negative", "core", "mf.fixed_points(activation='erf', K_max=-1)", err("K_max")),
    ("fps-Kmax-1e300", "core", "mf.fixed_points(activation='erf', K_max=1e300)", err("K_max")),
    ("fps-Kmax-nan", "core", "mf.fixed_points(activation='erf', K_max=float('nan'))", err("K_max")),
    ("fps-Kmax-inf", "core", "mf.fixed_points(activation='erf', K_max=float('inf'))", err("K_max")),
    ("fps-sw-array", "core", "mf.fixed_points(activation='erf', sigma_w=[1, 2])", err("sigma_w")),
    ("fps-bn", "core", "mf.fixed_points(activation='relu', norm='bn')", err("BatchNorm")),
    ("fps-tanh", "core", "mf.fixed_points(activation='tanh', sigma_w=1.5, sigma_b=0.3)",
     val("len(r) == 1 and r[0].stability == 'stable' and math.isfinite(r[0].K)")),
    # -- phase diagrams and correlation lengths ----------------------------------------------------
    ("pd-tol-negative", "core", "mf.phase_diagram(activation='erf', sigma_w=[1.0], sigma_b=[0.0], tol=-1)",
     err("tol")),
    ("pd-tol-nan", "core", "mf.phase_diagram(activation='erf', sigma_w=[1.0], sigma_b=[0.0], tol=float('nan'))",
     err("tol")),
    ("pd-empty", "core", "mf.phase_diagram(activation='erf', sigma_w=[], sigma_b=[0.0])", err("sigma_w")),
    ("pd-2d", "core", "mf.phase_diagram(activation='erf', sigma_w=[[1, 2]], sigma_b=[0.0])", err("sigma_w")),
    ("pd-negative", "core", "mf.phase_diagram(activation='erf', sigma_w=[-1, 1], sigma_b=[0.0])", err("sigma_w")),
    ("pd-missing", "core", "mf.phase_diagram(activation='erf', sigma_w=[1.0])", err("sigma_b")),
    ("pd-erf", "core", "mf.phase_diagram(activation='erf', sigma_w=[0.5, 1.0, 2.0], sigma_b=[0.0, 0.5])",
     val("np.all(np.isfinite(r.chi_J)) and np.all(np.isfinite(r.K)) and np.all(r.xi > 0)")),
    ("xi-relu-critical", "core", "mf.correlation_length(activation='relu', sigma_w=2 ** 0.5, sigma_b=0)",
     val("r == math.inf")),
    ("xi-tanh-critical", "core", "mf.correlation_length(activation='tanh', sigma_w=1.0, sigma_b=0)",
     val("r == math.inf")),
    ("xi-erf", "core", "mf.correlation_length(activation='erf', sigma_w=1.0, sigma_b=0.1)", val("0 < r < 1e6")),
    ("xi-sw-negative", "core", "mf.correlation_length(activation='erf', sigma_w=-1.0)", err("sigma_w")),
    # -- finite-width corrections ------------------------------------------------------------------
    ("apjn-zero-weights", "core", "mf.apjn_from_input(activation='erf', sigma_w=0, sigma_b=0.5, depth=3)",
     val("np.all(r == 0.0)")),
    ("apjn-zero-weights-N0", "core",
     "mf.apjn_from_input(activation='erf', sigma_w=0, sigma_b=0.5, depth=3, N0=10)", val("np.all(r == 0.0)")),
    ("apjn-N0-zero", "core", "mf.apjn_from_input(activation='erf', sigma_w=1, depth=3, N0=0, sigma_b=0.0)", err("N0")),
    ("apjn-q0-negative", "core", "mf.apjn_from_input(activation='erf', sigma_w=1, depth=3, q0=-1)", err("q0")),
    ("apjn-sw-string", "core", "mf.apjn_from_input(activation='erf', sigma_w='a', depth=3)", err("sigma_w")),
    ("apjn-depth-missing", "core", "mf.apjn_from_input(activation='erf', sigma_w=1, sigma_b=0.0)", err("depth")),
    ("l0-N0-missing", "core", "mf.l0_correction(activation='erf', sigma_w=1)", err("N0")),
    ("l0-zero-weights", "core", "mf.l0_correction(activation='erf', sigma_w=0, sigma_b=0.5, N0=10)",
     val("r == 1.0")),
    ("chiDelta-K-negative", "core", "mf.chi_Delta(activation='erf', sigma_w=1, K=-1, sigma_b=0.0)", err("K")),
    ("chiDelta-erf", "core", "mf.chi_Delta(activation='erf', sigma_w=1.0, sigma_b=0.2)", FIN),
    # -- shaping and scaling -----------------------------------------------------------------------
    ("qmap-negative", "core", "mf.shaping.q_map('tanh', -1)", err("q")),
    ("qmap-nan", "core", "mf.shaping.q_map('tanh', float('nan'))", err("q")),
    ("qmap-bool", "core", "mf.shaping.q_map('tanh', True)", err("q")),
    ("qmap-derivative-negative", "core", "mf.shaping.q_map_derivative('tanh', -2)", err("q")),
    ("cmap-nan", "core", "mf.shaping.c_map('tanh', float('nan'))", err("c")),
    ("cmap-q1-zero", "core", "mf.shaping.c_map('tanh', 0.5, q1=0)", err("q1")),
    ("cmap-q2-negative", "core", "mf.shaping.c_map('tanh', 0.5, q1=1.0, q2=-1.0)", err("q2")),
    ("cmap-shape", "core", "mf.shaping.c_map('tanh', [0.1, 0.2], q1=[1, 2, 3])", err("c", "q1")),
    ("cmap-order", "core", "mf.shaping.c_map_derivative('tanh', 0.3, order=3)", err("order")),
    ("qmap-tanh", "core", "mf.shaping.q_map('tanh', 1.0)", FIN),
    ("cmap-relu-one", "core", "mf.shaping.c_map('relu', 1.0)", val("abs(r - 1.0) < 1e-15")),
    ("shaping-vanilla-zero", "core", "mf.shaping.vanilla(0)", err("depth")),
    ("shaping-shortcut", "core", "mf.shaping.rescaled_resnet(5, shortcut_weight=2)", err("shortcut_weight")),
    ("scaling-fan-in-zero", "core", "mf.scaling.fan_in_variance(0)", err("fan_in")),
    ("scaling-fan-in-negative", "core", "mf.scaling.fan_in_variance(-3)", err("fan_in")),
    ("scaling-kernel-size-zero", "core", "mf.scaling.geometric_variance(10, 10, kernel_size=0)",
     err("kernel_size")),
    ("scaling-input-scale-zero", "core", "mf.scaling.input_scale(0)", err("in_channels")),
    ("scaling-fan-in", "core", "mf.scaling.fan_in_variance(256)", val("abs(r - 2 / 256) < 1e-15")),
    # -- monte_carlo ------------------------------------------------------------------------------
    ("mc-ln-width-one", "mc", "V.monte_carlo(mf.Architecture('erf', norm='ln_pre'), width=1, depth=3, n_init=2, sigma_w=1.0, sigma_b=0.0)",
     err("width")),
    ("mc-bn-identical", "mc", "V.monte_carlo(mf.Architecture('relu', norm='bn'), width=8, depth=3, n_init=2, "
     "batch=4, input_correlation=1.0, sigma_w=1.0, sigma_b=0.0)", err("input_correlation")),
    ("mc-bn-zero-weights", "mc", "V.monte_carlo(mf.Architecture('relu', norm='bn'), sigma_w=0.0, sigma_b=0.5, "
     "width=8, depth=3, n_init=2, batch=4)", err("sigma_w")),
    ("mc-ln-zero-weights", "mc", "V.monte_carlo(mf.Architecture('erf', norm='ln_pre'), sigma_w=0.0, sigma_b=0.0, "
     "width=8, depth=3, n_init=2)", err("sigma_w", "sigma_b")),
    ("mc-float32-overflow", "mc", "V.monte_carlo('relu', sigma_w=1e4, width=8, depth=20, n_init=2, "
     "dtype=torch.float32, sigma_b=0.0)", val("r.overflow_layer > 1 and any('overflows' in x for x in w)")),
    ("mc-depth-one", "mc", "V.monte_carlo('relu', depth=1, width=8, n_init=2)", err("depth")),
    ("mc-width-zero", "mc", "V.monte_carlo('relu', depth=3, width=0, n_init=2)", err("width")),
    ("mc-2d-positions-without-grid", "mc", "V.monte_carlo(mf.Network(mf.residual(mf.act('relu'), "
     "mf.conv((3, 3)), mu=0.5)), sigma_w=1.0, sigma_b=0.0, depth=3, width=8, n_init=2, tokens=16)", err("tokens")),
    ("mc-2d-grid-zero", "mc", "V.monte_carlo(mf.Network(mf.residual(mf.act('relu'), mf.conv((3, 3)), mu=0.5)), "
     "sigma_w=1.0, sigma_b=0.0, depth=3, width=8, n_init=2, tokens=(4, 0))", err("tokens")),
    ("mc-width-float", "mc", "V.monte_carlo('relu', depth=3, width=8.0, n_init=2)", err("width")),
    ("mc-n-init-one", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=1)", err("n_init")),
    ("mc-batch-zero", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, batch=0)", err("batch")),
    ("mc-bn-batch-one", "mc", "V.monte_carlo(mf.Architecture('relu', norm='bn'), depth=3, width=8, n_init=2)",
     err("batch")),
    ("mc-dtype", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, dtype=torch.float16)", err("dtype")),
    ("mc-device", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, device='tpu')", err("device")),
    ("mc-estimator", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, estimator='foo')", err("estimator")),
    ("mc-sw-negative", "mc", "V.monte_carlo('relu', sigma_w=-1, depth=3, width=8, n_init=2)", err("sigma_w")),
    ("mc-sw-bool", "mc", "V.monte_carlo('relu', sigma_w=True, depth=3, width=8, n_init=2)", err("sigma_w")),
    ("mc-sw-array", "mc", "V.monte_carlo('relu', sigma_w=[1, 2], depth=3, width=8, n_init=2)", err("sigma_w")),
    ("mc-correlation-big", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, input_correlation=2, sigma_w=1.0, sigma_b=0.0)",
     err("input_correlation")),
    ("mc-correlation-nan", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, "
     "input_correlation=float('nan'), sigma_w=1.0, sigma_b=0.0)", err("input_correlation")),
    ("mc-input-norm-zero", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, input_norm=0, sigma_w=1.0, sigma_b=0.0)",
     err("input_norm")),
    ("mc-l0-zero", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, l0=0, sigma_w=1.0, sigma_b=0.0)", err("l0")),
    ("mc-l0-deep", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, l0=10, sigma_w=1.0, sigma_b=0.0)", err("l0")),
    ("mc-seed-negative", "mc", "V.monte_carlo('relu', depth=3, width=8, n_init=2, seed=-1)", err("seed")),
    ("mc-activation-unknown", "mc", "V.monte_carlo('nope', depth=3, width=8, n_init=2)", err("activation")),
    ("mc-erf", "mc", "V.monte_carlo('erf', sigma_w=1.2, sigma_b=0.1, depth=4, width=16, n_init=3)",
     val("np.all(np.isfinite(r.K)) and np.all(np.isfinite(r.chi_J)) and np.all(np.isfinite(r.J)) "
         "and r.overflow_layer == 0")),
    ("mcpd-sw-empty", "mc", "V.phase_diagram('relu', sigma_w=[], sigma_b=[0.1], depth=3, width=4, n_init=2)",
     err("sigma_w")),
    ("mcpd-sb-empty", "mc", "V.phase_diagram('relu', sigma_w=[1.0], sigma_b=[], depth=3, width=4, n_init=2)",
     err("sigma_b")),
    ("mcpd-layer-zero", "mc", "V.phase_diagram('relu', sigma_w=[1.0], sigma_b=[0.1], depth=3, width=4, n_init=2, "
     "layer=0)", err("layer")),
    ("mcpd-layer-deep", "mc", "V.phase_diagram('relu', sigma_w=[1.0], sigma_b=[0.1], depth=3, width=4, n_init=2, "
     "layer=5)", err("layer")),
    ("mcpd-bn-zero-weights", "mc", "V.phase_diagram(mf.Architecture('relu', norm='bn'), sigma_w=[0.0, 1.0], "
     "sigma_b=[0.1], depth=3, width=4, n_init=2, batch=4)", err("sigma_w")),
    ("mcpd-erf", "mc", "V.phase_diagram('erf', sigma_w=[0.8, 1.6], sigma_b=[0.0, 0.3], depth=4, width=16, n_init=3)",
     val("r.chi_J.shape == (2, 2) and np.all(np.isfinite(r.chi_J)) and np.all(np.isfinite(r.chi_J_se))")),
    # -- autoinit ---------------------------------------------------------------------------------
    ("ai-model-not-module", "autoinit", "V.autoinit('mlp', X, steps=1, progress=False)", err("model")),
    ("ai-inputs-list", "autoinit", "V.autoinit(MODEL(), [[1.0] * 8], steps=1, progress=False)", err("inputs")),
    ("ai-inputs-nan", "autoinit", "V.autoinit(MODEL(), X * float('nan'), steps=1, progress=False)", err("inputs")),
    ("ai-inputs-int", "autoinit", "V.autoinit(MODEL(), torch.ones(4, 8, dtype=torch.int64), steps=1, "
     "progress=False)", err("inputs")),
    ("ai-steps-zero", "autoinit", "V.autoinit(MODEL(), X, steps=0, progress=False)", err("steps")),
    ("ai-steps-bool", "autoinit", "V.autoinit(MODEL(), X, steps=True, progress=False)", err("steps")),
    ("ai-lr-negative", "autoinit", "V.autoinit(MODEL(), X, steps=1, lr=-1.0, progress=False)", err("lr")),
    ("ai-lr-nan", "autoinit", "V.autoinit(MODEL(), X, steps=1, lr=float('nan'), progress=False)", err("lr")),
    ("ai-lr-bool", "autoinit", "V.autoinit(MODEL(), X, steps=1, lr=True, progress=False)", err("lr")),
    ("ai-tol-negative", "autoinit", "V.autoinit(MODEL(), X, steps=1, tol=-1.0, progress=False)", err("tol")),
    ("ai-loss", "autoinit", "V.autoinit(MODEL(), X, steps=1, loss='foo', progress=False)", err("loss")),
    ("ai-mode", "autoinit", "V.autoinit(MODEL(), X, steps=1, mode='foo', progress=False)", err("mode")),
    ("ai-batch-size-big", "autoinit", "V.autoinit(MODEL(), X, steps=1, batch_size=100, progress=False)",
     err("batch_size")),
    ("ai-n-probes-zero", "autoinit", "V.autoinit(MODEL(), X, steps=1, n_probes=0, progress=False)", err("n_probes")),
    ("ai-params-unknown", "autoinit", "V.autoinit(MODEL(), X, steps=1, params=['nope'], progress=False)",
     err("params")),
    ("ai-average-negative", "autoinit", "V.autoinit(MODEL(), X, steps=1, average=-1, progress=False)",
     err("average")),
    ("ai-valid", "autoinit", "V.autoinit(MODEL(), X, steps=3, progress=False)",
     val("isinstance(r[0], nn.Module) and all(math.isfinite(v) for v in "
         "[float(t.detach().abs().sum()) for t in r[0].parameters()])")),
]

GROUPS = ("core", "mc", "autoinit")


# ---------------------------------------------------------------------------
# The runner (executed in the subprocesses).
# ---------------------------------------------------------------------------
def _numbers(obj, depth=0):
    """Every float leaf of a result (dataclass fields, arrays, sequences); strings and specs skipped."""
    import dataclasses

    import numpy as np

    if depth > 6 or obj is None or isinstance(obj, (str, bool, np.bool_)):
        return []
    if isinstance(obj, (int, float, np.integer, np.floating)):
        return [float(obj)]
    if isinstance(obj, np.ndarray):
        return [float(v) for v in obj.ravel()] if obj.dtype.kind in "iuf" else []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if type(obj).__name__ == "Architecture":
            return []
        out = []
        for f in dataclasses.fields(obj):
            out += _numbers(getattr(obj, f.name), depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        out = []
        for v in obj:
            out += _numbers(v, depth + 1)
        return out
    return []


def _from_package(tb) -> bool:
    """Whether the innermost frame of a traceback is meanfield's own code."""
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and f"{os.sep}meanfield{os.sep}" in last


def _judge(expect, result, exc, tb, warns):
    kind, arg = expect
    if exc is not None:
        msg = str(exc)
        if kind != "error":
            return False, f"unexpected {type(exc).__name__}: {msg[:300]}"
        if not isinstance(exc, (ValueError, TypeError)) or type(exc).__name__ == "ConvergenceError":
            return False, f"{type(exc).__name__} (want ValueError/TypeError): {msg[:300]}"
        if "\n" in msg.strip():
            return False, f"message is not one line: {msg[:300]!r}"
        missing = [n for n in arg if n not in msg]
        if missing:
            return False, f"message does not name {missing}: {msg[:300]!r}"
        if not _from_package(tb):
            return False, f"raised outside meanfield (library internals): {msg[:300]!r}"
        return True, f"{type(exc).__name__}: {msg[:200]}"
    if kind == "error":
        return False, f"no error; returned {repr(result)[:200]}"
    if kind == "finite":
        import math

        nums = _numbers(result)
        if not nums:
            return False, f"no numbers in the result {repr(result)[:200]}"
        bad = [v for v in nums if not math.isfinite(v)]
        return (not bad), ("finite" if not bad else f"non-finite values {bad[:5]} in {repr(result)[:200]}")
    ok, note = _eval_check(arg, result, warns)
    return ok, ("check holds" if ok else f"check {arg!r} fails{note} for {repr(result)[:300]}; "
                                         f"warnings {warns[:3]}")


def _namespace():
    import math

    import numpy as np

    import sympy as sp

    import meanfield as mf

    return {"mf": mf, "np": np, "math": math, "sp": sp, "x": sp.Symbol("x")}


def _eval_check(check, r, w):
    ns = _namespace()
    if "torch" in sys.modules:
        import torch
        from torch import nn

        ns.update(torch=torch, nn=nn)
    ns.update(r=r, w=w)
    try:
        return bool(eval(check, ns)), ""
    except Exception as e:  # a check that cannot be evaluated fails the row
        return False, f" ({type(e).__name__}: {e})"


def _run_group(group):
    import signal
    import traceback
    import warnings

    ns = _namespace()
    if group in ("mc", "autoinit"):
        import torch
        from torch import nn

        import meanfield.verification as V

        ns.update(torch=torch, nn=nn, V=V)
    if group == "autoinit":
        def MODEL():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

        ns.update(MODEL=MODEL, X=torch.randn(16, 8, generator=torch.Generator().manual_seed(1)))

    class RowTimeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise RowTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    for rid, g, code, expect in ROWS:
        if g != group:
            continue
        result = exc = tb = None
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            signal.alarm(ROW_SECONDS)
            try:
                result = eval(code, dict(ns))
            except RowTimeout:
                print(json.dumps({"id": rid, "ok": False, "why": f"hang: no result within {ROW_SECONDS} s"}),
                      flush=True)
                continue
            except Exception as e:  # the row's outcome, judged below
                exc, tb = e, e.__traceback__
            finally:
                signal.alarm(0)
        warns = [str(x.message) for x in rec]
        try:
            ok, why = _judge(expect, result, exc, tb, warns)
        except Exception:
            ok, why = False, "judging failed: " + traceback.format_exc(limit=2)
        print(json.dumps({"id": rid, "ok": ok, "why": why}), flush=True)


def _spawn(group):
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), group], capture_output=True, text=True,
                           timeout=GROUP_SECONDS, env=env, cwd=root)
        out, tail, rc = p.stdout, p.stderr[-2000:], p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail, rc = f"group timed out after {GROUP_SECONDS} s", None
    reports = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            reports[d["id"]] = d
    return reports, tail, rc


_CACHE = {}


def _shared_path(group):
    """Where one pytest-xdist run keeps a group's reports, so that its workers run each group once.

    Every worker of one ``pytest -n N`` run sees the same PYTEST_XDIST_TESTRUNUID; without xdist
    (or off POSIX, where ``fcntl`` is missing) nothing is shared and each process runs the group.
    """
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return None
    import tempfile
    return Path(tempfile.gettempdir()) / f"meanfield-bad-inputs-{run}-{group}.json"


def _reports(group):
    """The group's (reports, stderr tail, exit code), run once per process or per xdist run."""
    if group in _CACHE:
        return _CACHE[group]
    path = _shared_path(group)
    if path is None:
        _CACHE[group] = _spawn(group)
        return _CACHE[group]
    import fcntl
    with open(path.with_suffix(".lock"), "w") as lock:
        # the first worker to ask runs the group; the others wait on the lock and read its result
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            reports, tail, rc = json.loads(path.read_text())
        else:
            reports, tail, rc = _spawn(group)
            path.write_text(json.dumps([reports, tail, rc]))
    _CACHE[group] = reports, tail, rc
    return _CACHE[group]


def test_matrix_size_and_ids():
    ids = [r[0] for r in ROWS]
    assert len(ids) == len(set(ids)), "duplicate row ids"
    assert len(ROWS) >= 90
    assert {r[1] for r in ROWS} == set(GROUPS)


def pytest_generate_tests(metafunc):
    if "row" in metafunc.fixturenames:
        metafunc.parametrize("row", [r for r in ROWS], ids=[r[0] for r in ROWS])


@pytest.mark.slow
def test_row(row):
    rid, group = row[0], row[1]
    reports, tail, rc = _reports(group)
    if rid not in reports:
        raise AssertionError(f"row {rid} did not report: the '{group}' subprocess crashed or hung "
                             f"(exit code {rc}); its stderr ends with:\n{tail}")
    d = reports[rid]
    assert d["ok"], f"{rid}: {d['why']}"


if __name__ == "__main__":
    _run_group(sys.argv[1])
