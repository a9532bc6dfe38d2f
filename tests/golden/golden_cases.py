"""The calls whose results tests/golden/public_api.json records (issue 24).

Shared by ``make_golden.py`` (writes the file) and ``tests/test_golden.py``
(recomputes every value and compares), so that the list of calls is written
once. Every call goes through the public API only (``import meanfield as mf``,
``mf.shaping``, ``mf.scaling``, ``meanfield.verification``).

A group is a function returning ``{key: (result, rtol)}``; ``key`` names the
call and its arguments, ``result`` is anything :func:`flatten` understands and
``rtol`` the relative tolerance of the comparison (:data:`RTOL` unless the value
is ill-conditioned: the reason is written where the looser tolerance is set).
An entry may carry a third element, its absolute tolerance (default :data:`ATOL`).
A call that raises records ``"raises <ExceptionClass>"``.
"""
import dataclasses
import math

import numpy as np

import meanfield as mf

#: default relative tolerance: a few ulps of libm / SIMD differences between machines and engines
RTOL = 1e-13
#: absolute floor of every comparison (values that are zero, or underflow)
ATOL = 1e-300

#: built-in activations (mf.available_activations() less the aliases 'swish' = silu and the
#: parametric 'scale_invariant', covered by leaky_relu/relu/abs/linear)
ACTIVATIONS = ("relu", "leaky_relu", "linear", "abs", "erf", "gelu", "elu", "selu", "hardtanh",
               "tanh", "silu", "softplus", "gelu_tanh")

#: Values that come out of a root solve or a fit sit at the solver's own tolerance, not at
#: a few ulps: critical lines and points (brentq, xtol 2e-12 on sigma_b), exponents
#: (log-log fits of the depth profile), correlation lengths 1/|log chi_J*| (amplify the
#: error of chi_J* by 1/|chi_J* - 1|). A refactor that keeps the algorithm keeps them bit
#: for bit; one that changes the order of the floating-point operations moves the root
#: within the solver's tolerance.
RTOL_ROOT = 1e-9
#: absolute tolerance where an exact zero comes out as rounding noise (C(0) of an odd
#: activation: +-2e-34, the sign and size of the noise are not a result)
ATOL_NOISE = 1e-15
RTOL_FIT = 1e-7
#: correlation lengths xi = 1/|log chi_J*|: a relative change of chi_J* moves xi by xi times as much, so the
#: engines' ~1 ulp differences in chi_J* (CPython or numba, which one answers depends on the calls before)
#: reach 1.5e-13 at xi = 437 (measured: tanh at (1.3, 0.2)); 1e-10 covers xi up to ~1e5
RTOL_XI = 1e-10


def _as_value(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def flatten(obj):
    """A result as nested dicts/lists of floats, ints, bools and strings (architecture
    specs and free-text notes left out: they are not numbers of the API)."""
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (bool, int, float, np.bool_, np.integer, np.floating)):
        return _as_value(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "US":
            return np.asarray(obj, dtype=str).tolist()
        return np.asarray(obj, dtype=np.float64 if obj.dtype.kind == "f" else obj.dtype).tolist()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: flatten(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.name not in ("architecture", "note") and not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {str(k): flatten(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [flatten(v) for v in obj]
    try:
        return float(obj)
    except (TypeError, ValueError):
        return str(obj)


#: a critical point's list of fixed points longer than this is kept as its length and ends
MAX_FIXED_POINTS = 8


def _fixed_points_summary(cp):
    """A flattened CriticalPoints with each long list (``points``, ``fixed_points``) cut to its
    length, first and last entries (hardtanh at (1, 0) lists its linear segment point by point)."""
    if isinstance(cp, dict):
        points = cp.get("points", [])
        if len(points) > MAX_FIXED_POINTS:   # hardtanh: 245 copies of (1, 0), one per fixed point
            half = MAX_FIXED_POINTS // 2
            points = cp["points"] = {"count": len(points), "first": points[:half], "last": points[-half:]}
            points = points["first"] + points["last"]
        for p in points:
            fps = p.get("fixed_points")
            if isinstance(fps, list) and len(fps) > MAX_FIXED_POINTS:
                half = MAX_FIXED_POINTS // 2
                p["fixed_points"] = {"count": len(fps), "first": fps[:half], "last": fps[-half:]}
    return cp


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # the exception's class is part of the API's behaviour
        return f"raises {type(e).__name__}"


def _solvers(out, name, arch, point, line_sw, grid_sw, grid_sb, depth=8, critical=True):
    """Every solver on one architecture: ``out[key] = (result, rtol)``."""
    sw, sb = point
    out[f"{name}.fixed_point(sw={sw},sb={sb})"] = (_call(mf.fixed_point, arch, sigma_w=sw, sigma_b=sb,
                                                           errors="nan"), RTOL)
    out[f"{name}.chi_J(sw={sw},sb={sb})"] = (_call(mf.chi_J, arch, sigma_w=sw, sigma_b=sb, errors="nan"), RTOL)
    out[f"{name}.chi_K(sw={sw},sb={sb})"] = (_call(mf.chi_K, arch, sigma_w=sw, sigma_b=sb, errors="nan"), RTOL)
    out[f"{name}.correlation_length(sw={sw},sb={sb})"] = (
        _call(mf.correlation_length, arch, sigma_w=sw, sigma_b=sb, errors="nan"), RTOL_XI)
    out[f"{name}.kernel_profile(sw={sw},sb={sb},depth={depth})"] = (
        _call(mf.kernel_profile, arch, sigma_w=sw, sigma_b=sb, depth=depth), RTOL)
    out[f"{name}.critical_line(sw={list(line_sw)})"] = (
        _call(mf.critical_line, arch, sigma_w=np.asarray(line_sw)), RTOL_ROOT)
    # chi_J* and xi of the grid points near the critical line inherit the root's conditioning
    out[f"{name}.phase_diagram(sw={list(grid_sw)},sb={list(grid_sb)})"] = (
        _call(mf.phase_diagram, arch, sigma_w=np.asarray(grid_sw), sigma_b=np.asarray(grid_sb)), RTOL_ROOT)
    if critical:
        cp = _call(mf.critical_point, arch)
        out[f"{name}.critical_point()"] = (_fixed_points_summary(flatten(cp)), RTOL_ROOT)
        if not isinstance(cp, str) and cp.points:
            p = cp.points[0]
            out[f"{name}.exponents(at critical_point()[0])"] = (
                _call(mf.exponents, arch, sigma_w=float(p.sigma_w), sigma_b=float(p.sigma_b)), RTOL_FIT)


def _activation_group(act):
    def group():
        out = {}
        _solvers(out, f"mlp[{act}]", mf.Architecture(activation=act), (1.3, 0.2), (0.8, 1.5, 2.5),
                 (0.7, 1.4, 2.6), (0.0, 0.3))
        return out
    group.__name__ = f"activation_{act}"
    return group


def _blocks():
    out = {}
    grid = dict(grid_sw=(0.8, 1.6, 2.4), grid_sb=(0.0, 0.4))
    for norm in ("ln_pre", "ln_post", "bn"):
        for act in ("erf", "relu", "gelu"):
            _solvers(out, f"mlp[{act},norm={norm}]", mf.Architecture(activation=act, norm=norm), (1.2, 0.3),
                     (0.8, 1.5, 2.5), **grid, critical=False)
    for act in ("tanh", "relu"):
        _solvers(out, f"mlp[{act},mu=0.7]", mf.Architecture(activation=act, mu=0.7), (1.2, 0.3), (0.8, 1.5),
                 **grid)
    _solvers(out, "mlp[gelu,ln_pre,mu=0.5]", mf.Architecture(activation="gelu", norm="ln_pre", mu=0.5),
             (1.0, 0.1), (0.5, 1.5, 3.0), **grid, critical=False)
    return out


def _token_blocks():
    out = {}
    grid = dict(grid_sw=(0.8, 1.6), grid_sb=(0.0, 0.4))
    _solvers(out, "resmlp[gelu,eps=0.1]", mf.Architecture(activation="gelu", block="resmlp"), (1.2, 0.2),
             (0.8, 1.5), **grid, critical=False)
    _solvers(out, "mixer[erf]", mf.Architecture(activation="erf", block="mixer"), (1.2, 0.0), (0.8, 1.5),
             **grid, critical=False)
    _solvers(out, "mixer[gelu]", mf.Architecture(activation="gelu", block="mixer"), (1.2, 0.2), (0.8, 1.5),
             **grid, critical=False)
    return out


def _network():
    out = {}
    block = mf.residual(mf.rms_norm(), mf.act("selu"), mf.dense(), mf.scale(0.5))
    net = mf.Network(block, mu=0.9)
    out["network.to_json"] = (mf.to_json(net), None)
    _solvers(out, "Network(residual(rms_norm,act(selu),dense,scale(0.5)),mu=0.9)", net, (1.1, 0.2),
             (0.5, 1.5, 3.0), grid_sw=(0.8, 1.6), grid_sb=(0.0, 0.4), critical=False)
    return out


def _inputs(n, d, seed, near_parallel=True):
    """n random inputs of dimension d, the last a near-parallel twin of the first
    (1 - cos = 1e-10 up to rounding): the Gram path's gap work."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    if near_parallel:
        e = rng.standard_normal(d)
        e -= (e @ x[0]) / (x[0] @ x[0]) * x[0]
        e *= np.sqrt(2e-10) * np.linalg.norm(x[0]) / np.linalg.norm(e)   # angle sqrt(2e-10): 1 - cos = 1e-10
        x[-1] = x[0] + e
    return x


def _kernels():
    out = {}
    x = _inputs(5, 6, 1)
    for act in ("relu", "erf", "gelu", "tanh"):
        out[f"kernels[mlp[{act}]](x5x6,depth=6,sw=1.4,sb=0.2)"] = (
            _call(mf.kernels, mf.Architecture(activation=act), x, depth=6, sigma_w=1.4, sigma_b=0.2), RTOL)
    out["kernels[mlp[relu]](x5x6,depth=4,sw=1.4,sb=0.2,standard,width=512)"] = (
        _call(mf.kernels, "relu", x, depth=4, sigma_w=1.4, sigma_b=0.2, parameterization="standard",
              width=512.0, per_layer=True), RTOL)
    out["kernels[mlp[gelu,ln_pre,mu=0.5]](x5x6,x2=x[:2],depth=5,sw=1.0,sb=0.1)"] = (
        _call(mf.kernels, mf.Architecture(activation="gelu", norm="ln_pre", mu=0.5), x, x[:2], depth=5,
              sigma_w=1.0, sigma_b=0.1), RTOL)
    for act in ("relu", "tanh"):
        out[f"kernels[mlp[{act},bn]](x5x6,depth=5,sw=1.2,sb=0.3)"] = (
            _call(mf.kernels, mf.Architecture(activation=act, norm="bn"), x, depth=5, sigma_w=1.2,
                  sigma_b=0.3), RTOL)
    imgs = np.stack([_inputs(4, 5, 10 + t, near_parallel=False) for t in range(3)], axis=1)  # (4, 3, 5)
    imgs[-1] = imgs[0] + 1e-5 * np.random.default_rng(7).standard_normal(imgs[0].shape)    # near-parallel image
    out["kernels[resmlp[gelu]](imgs4x3x5,depth=4,sw=1.2,sb=0.2)"] = (
        _call(mf.kernels, mf.Architecture(activation="gelu", block="resmlp"), imgs, depth=4, sigma_w=1.2,
              sigma_b=0.2), RTOL)
    out["kernels[mixer[erf]](imgs4x3x5,depth=4,sw=1.2,sb=0.0)"] = (
        _call(mf.kernels, mf.Architecture(activation="erf", block="mixer"), imgs, depth=4, sigma_w=1.2,
              sigma_b=0.0), RTOL)
    out["kernels[mixer[gelu]](imgs4x3x5,depth=4,sw=1.2,sb=0.2)"] = (
        _call(mf.kernels, mf.Architecture(activation="gelu", block="mixer"), imgs, depth=4, sigma_w=1.2,
              sigma_b=0.2), RTOL)
    return out


def _shaping():
    sh = mf.shaping
    out = {}
    for act in ("tanh", "softplus", "silu", "gelu"):
        # the transform's parameters come out of a root search at tol=1e-10
        t = _call(sh.tat_transform, act, tau=0.3, depth=10)
        out[f"shaping.tat_transform({act},tau=0.3,depth=10)"] = (t, 1e-8)
        if not isinstance(t, str):
            out[f"shaping.tat_transform({act},tau=0.3,depth=10).conditions()"] = (t.conditions(), 1e-8)
        d = _call(sh.dks_transform, act, zeta=1.5, depth=10)
        out[f"shaping.dks_transform({act},zeta=1.5,depth=10)"] = (d, 1e-8)
        if not isinstance(d, str):
            out[f"shaping.dks_transform({act},zeta=1.5,depth=10).conditions()"] = (d.conditions(), 1e-8)
    for depth, eta in ((20, 0.9), (50, 0.5)):
        out[f"shaping.trelu({depth},eta={eta})"] = (_call(sh.trelu, depth, eta=eta), RTOL_ROOT)
    out["shaping.trelu(20,eta=0.9,shortcut_weight=0.8)"] = (_call(sh.trelu, 20, eta=0.9, shortcut_weight=0.8), RTOL_ROOT)
    c = np.linspace(-1.0, 1.0, 9)
    out["shaping.trelu_c_map(c=linspace(-1,1,9),0.3)"] = (sh.trelu_c_map(c, 0.3), RTOL)
    out["shaping.trelu_c_map_derivative(c=linspace(-1,1,9),0.3)"] = (sh.trelu_c_map_derivative(c, 0.3), RTOL)
    for act in ("tanh", "relu", "gelu"):
        out[f"shaping.q_map({act},q=[0.5,1,2])"] = (sh.q_map(act, np.array([0.5, 1.0, 2.0])), RTOL)
        out[f"shaping.c_map({act},c=linspace(-1,1,9))"] = (sh.c_map(act, c), RTOL, ATOL_NOISE)
        out[f"shaping.c_map_derivative({act},c=0.5)"] = (sh.c_map_derivative(act, 0.5), RTOL)
    net = sh.rescaled_resnet(6, 0.8)
    out["shaping.global_c_map(rescaled_resnet(6,0.8),tanh,c=linspace(-1,1,9))"] = (
        sh.global_c_map(net, "tanh", c), RTOL, ATOL_NOISE)
    out["shaping.maximal_c_value(rescaled_resnet(6,0.8),0.2)"] = (sh.maximal_c_value(net, 0.2), RTOL)
    out["shaping.theorem1_bounds(0.3)"] = (sh.theorem1_bounds(0.3), RTOL)
    out["shaping.equivalent_shortcut_weight(0.4)"] = (sh.equivalent_shortcut_weight(0.4), RTOL)
    out["shaping.trelu_deep_limit(c=linspace(-1,1,9),eta=0.9)"] = (sh.trelu_deep_limit(c, eta=0.9), RTOL)
    return out


def _scaling():
    sc = mf.scaling
    out = {}
    for k in (1, 3, (3, 3)):
        out[f"scaling.kernel_area({k})"] = (sc.kernel_area(k), RTOL)
    out["scaling.geometric_variance(64,128,3)"] = (sc.geometric_variance(64, 128, 3), RTOL)
    out["scaling.fan_in_variance(64,3)"] = (sc.fan_in_variance(64, 3), RTOL)
    out["scaling.fan_out_variance(128,3)"] = (sc.fan_out_variance(128, 3), RTOL)
    out["scaling.xavier_variance(64,128,3)"] = (sc.xavier_variance(64, 128, 3), RTOL)
    out["scaling.recommended_c(3)"] = (sc.recommended_c(3), RTOL)
    out["scaling.kernel_multiplier(5,3)"] = (sc.kernel_multiplier(5, 3), RTOL)
    out["scaling.activation_scaling_factor(64,49,0.3,1.7)"] = (sc.activation_scaling_factor(64, 49, 0.3, 1.7), RTOL)
    out["scaling.layer_scaling_factor(1.1,64,128,3,0.02)"] = (sc.layer_scaling_factor(1.1, 64, 128, 3, 0.02), RTOL)
    out["scaling.layer_scaling_factor_extrinsic(64,3,49,1.2,0.8,0.4)"] = (
        sc.layer_scaling_factor_extrinsic(64, 3, 49, 1.2, 0.8, 0.4), RTOL)
    out["scaling.bias_scaling_factor(49,0.3,1.7)"] = (sc.bias_scaling_factor(49, 0.3, 1.7), RTOL)
    out["scaling.geometric_output_second_moment([3,64,128,10])"] = (
        sc.geometric_output_second_moment([3, 64, 128, 10]), RTOL)
    out["scaling.input_scale(3,3)"] = (sc.input_scale(3, 3), RTOL)
    return out


#: Monte Carlo by seed: torch CPU float64 matmuls may take other kernels (other summation
#: orders) on other CPUs, so its values are compared at a few 1e-12, not bit for bit.
RTOL_MC = 5e-12


def _monte_carlo():
    from meanfield import verification as mv

    mc = mv.monte_carlo(mf.Architecture(activation="tanh"), sigma_w=1.2, sigma_b=0.1, depth=4, width=32,
                        n_init=4, seed=3, device="cpu")
    return {"verification.monte_carlo(tanh,sw=1.2,sb=0.1,depth=4,width=32,n_init=4,seed=3)":
            ({"K": mc.K, "K_se": mc.K_se, "chi_J": mc.chi_J, "chi_J_se": mc.chi_J_se, "J": mc.J, "J_se": mc.J_se},
             RTOL_MC)}


#: name -> group function; one pytest case per group
GROUPS = {g.__name__: g for g in [_activation_group(a) for a in ACTIVATIONS]}
GROUPS.update({"blocks": _blocks, "token_blocks": _token_blocks, "network": _network, "kernels": _kernels,
               "shaping": _shaping, "scaling": _scaling, "monte_carlo": _monte_carlo})


def compute(name):
    """``{key: {"value": flattened, "rtol": rtol}}`` of one group."""
    out = {}
    for key, (value, rtol, *atol) in GROUPS[name]().items():
        out[key] = {"value": flatten(value), "rtol": rtol, "atol": atol[0] if atol else ATOL}
    return out


def count_values(v) -> int:
    """How many leaf values (numbers and strings) a flattened entry holds."""
    if isinstance(v, dict):
        return sum(count_values(x) for x in v.values())
    if isinstance(v, list):
        return sum(count_values(x) for x in v)
    return 1


def compare(expected, got, rtol, atol=ATOL, path=""):
    """The mismatches between two flattened values, as strings (empty: equal).

    Floats: |got - expected| <= rtol |expected| + atol, NaN equals NaN, inf equals
    the same inf; ``rtol=None`` (or any other type) asks for equality. A dict may
    have keys the stored one lacks only where their value is None (a result field
    added later, at its default).
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        # a result field added after the file was written passes at None (its default: nothing computed)
        added = set(got) - set(expected)
        if set(expected) - set(got) or any(got[k] is not None for k in added):
            return [f"{path}: keys {sorted(expected)} != {sorted(got)}"]
        return [m for k in expected for m in compare(expected[k], got[k], rtol, atol, f"{path}.{k}")]
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{path}: length {len(expected)} != {len(got)}"]
        return [m for i, (a, b) in enumerate(zip(expected, got)) for m in compare(a, b, rtol, atol, f"{path}[{i}]")]
    if (isinstance(expected, float) and isinstance(got, (float, int)) and not isinstance(got, bool)
            and rtol is not None):
        if math.isnan(expected) or math.isnan(got):
            ok = math.isnan(expected) and math.isnan(got)
        elif math.isinf(expected) or math.isinf(got):
            ok = expected == got
        else:
            ok = abs(got - expected) <= rtol * abs(expected) + atol
        return [] if ok else [f"{path}: {got!r} != {expected!r} (rel {abs(got - expected) / max(abs(expected), ATOL):.2e}, rtol {rtol:g})"]
    if type(expected) is not type(got) and not (isinstance(expected, float) and isinstance(got, float)):
        return [f"{path}: {got!r} ({type(got).__name__}) != {expected!r} ({type(expected).__name__})"]
    return [] if expected == got else [f"{path}: {got!r} != {expected!r}"]
