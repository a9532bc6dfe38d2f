"""Numeric solvers driven by the compiled symbolic recursions (numba).

Fixed points and depth profiles (:mod:`.fixed`), critical lines and points,
correlation lengths and phase diagrams, critical exponents and finite-width
corrections. Every function accepts an :class:`~meanfield.Architecture` or
the same keywords, broadcasts over numpy arrays of sigma_w and sigma_b and
works in float64. There is no default point: every function evaluated at a
point needs both ``sigma_w`` and ``sigma_b`` (ValueError naming the missing
one). Every result is a :class:`meanfield._serialize.Result`: a short repr,
``to_dict()``, ``save(path)`` (.json, .npz, .csv) and ``Class.load(path)``.
"""
from ._common import ApproximationWarning, ConvergenceError
from .fixed import (FixedPointState, KernelProfile, chi_J, chi_K, fixed_point, fixed_point_state,
                    kernel_profile)
from .exponents import Exponents, exponents
from .finite_width import apjn_from_input, chi_Delta, l0_correction
from .lines import (PHASE_CHAOTIC, PHASE_CRITICAL, PHASE_DIVERGENT, PHASE_ORDERED, PHASE_UNDETERMINED,
                    PHASES, CriticalLine, CriticalPoint, CriticalPoints, FixedPoint, PhaseDiagram,
                    asymptotic_regime, correlation_length, critical_line, critical_point, fixed_points,
                    phase_diagram)
from .positions import PositionFixedPoint, position_fixed_point, position_phase_diagram

__all__ = [
    "ApproximationWarning",
    "ConvergenceError",
    "CriticalLine",
    "CriticalPoint",
    "CriticalPoints",
    "Exponents",
    "FixedPoint",
    "PHASES",
    "PHASE_CHAOTIC",
    "PHASE_CRITICAL",
    "PHASE_DIVERGENT",
    "PHASE_ORDERED",
    "PHASE_UNDETERMINED",
    "PhaseDiagram",
    "PositionFixedPoint",
    "apjn_from_input",
    "asymptotic_regime",
    "chi_Delta",
    "correlation_length",
    "critical_line",
    "critical_point",
    "exponents",
    "fixed_points",
    "phase_diagram",
    "position_fixed_point",
    "position_phase_diagram",
    "FixedPointState",
    "KernelProfile",
    "chi_J",
    "chi_K",
    "fixed_point",
    "fixed_point_state",
    "kernel_profile",
    "l0_correction",
]
