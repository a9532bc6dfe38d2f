"""Bad input gets a ValueError that names the argument and says what is allowed."""
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield.calculus import Architecture, Dense, as_architecture
from meanfield.gaussian import expect, expect2

t, u = sp.symbols("t u")


# ---------------------------------------------------------------------------
# Names.
# ---------------------------------------------------------------------------
def test_unknown_activation_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        mf.activation("sigmoidish")
    msg = str(err.value)
    assert "activation='sigmoidish'" in msg
    for name in ("relu", "erf", "gelu", "tanh", "softplus", "silu"):
        assert name in msg
    assert "sympy expression" in msg
    with pytest.raises(ValueError, match="activation='nope' is not known"):
        Architecture(activation="nope")
    with pytest.raises(ValueError, match="activation='nope' is not known"):
        mf.recursion(activation="nope")


def test_activation_text_is_an_expression_in_x_parsed_without_running_code(tmp_path, monkeypatch):
    import sympy as sp

    x = mf.symbols.x
    assert mf.activation("x*erf(x) + x/2").expr == x * sp.erf(x) + x / 2
    assert mf.activation("max(x, 0)").name == "relu"            # recognised as the built-in
    assert mf.activation("2^(1/2)*x").expr == sp.sqrt(2) * x     # ^ is a power, 1/2 exact
    monkeypatch.chdir(tmp_path)
    for text in ("__import__('os').system('touch PWNED')", "open('PWNED', 'w')", "x.__class__", "lambda: 1",
                 "y + x", "getattr(x, 'n')", "x; 1"):
        with pytest.raises(ValueError, match=r"activation=.* is not known: "):
            mf.activation(text)
    assert list(tmp_path.iterdir()) == []


def test_activation_names_are_case_and_space_insensitive():
    assert mf.activation(" ReLU ") == mf.activation("relu")


@pytest.mark.parametrize("norm", ["layernorm", "LN_PRE", "batchnorm", ""])
def test_unknown_norm(norm):
    with pytest.raises(ValueError) as err:
        Architecture(activation="relu", norm=norm)
    msg = str(err.value)
    assert f"norm={norm!r}" in msg and "'none', 'ln_pre', 'ln_post', 'bn'" in msg


def test_unknown_block():
    with pytest.raises(ValueError, match=r"block='transformer' is not allowed; choose one of 'mlp', 'resmlp', 'mixer'"):
        Architecture(block="transformer")
    with pytest.raises(ValueError, match=r"norm='ln_pre' applies to block='mlp' only"):
        Architecture(block="resmlp", norm="ln_pre")


def test_unknown_architecture_keyword():
    with pytest.raises(ValueError, match=r"unknown architecture option\(s\) \['sigma'\]; allowed: activation, norm"):
        as_architecture(activation="relu", sigma=1.0)
    with pytest.raises(ValueError, match="arch must be an Architecture, a Network, a primitive tree, an activation name or None, got 3.0"):
        as_architecture(3.0)


# ---------------------------------------------------------------------------
# Activation parameters and user expressions.
# ---------------------------------------------------------------------------
def test_activation_parameters():
    with pytest.raises(ValueError, match=r"negative_slope must be a finite real number, got inf"):
        mf.activation("leaky_relu", negative_slope=float("inf"))
    with pytest.raises(ValueError, match=r"a_minus must be a finite real number, got 'x'"):
        mf.activation("scale_invariant", a_plus=1, a_minus="x")
    with pytest.raises(ValueError, match=r"activation 'relu' does not take parameters \['negative_slope'\]"):
        mf.activation("relu", negative_slope=0.1)
    with pytest.raises(ValueError, match=r"cannot be applied to a sympy expression"):
        mf.activation(sp.sin(t), negative_slope=0.1)
    with pytest.raises(ValueError, match=r"cannot be applied to an Activation instance"):
        mf.activation(mf.activation("relu"), negative_slope=0.1)
    with pytest.raises(ValueError, match=r"activation must be a name, a sympy expression or an Activation"):
        mf.activation(1.5)


@pytest.mark.parametrize("expr,found", [
    (sp.sin(t) + u, "found 2: ['t', 'u']"),
    (t * u * sp.Symbol("w"), "found 3"),
    (sp.Integer(3), "found 0: []"),
    (sp.pi, "found 0: []"),
])
def test_expression_needs_exactly_one_free_symbol(expr, found):
    with pytest.raises(ValueError) as err:
        mf.activation(expr)
    msg = str(err.value)
    assert "must have exactly one free symbol" in msg and found in msg
    with pytest.raises(ValueError, match="exactly one free symbol"):
        Architecture(activation=expr)


def test_one_free_symbol_of_any_name_is_accepted():
    act = mf.activation(sp.sin(t) + t / 2)
    assert act.expr == sp.sin(mf.symbols.x) + mf.symbols.x / 2
    real = sp.Symbol("r", real=True)
    assert mf.activation(sp.tanh(real)).expr == sp.tanh(mf.symbols.x)


# ---------------------------------------------------------------------------
# Architecture numbers.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("mu", [-0.1, 1.5, float("nan"), float("inf"), "half", True])
def test_mu_outside_unit_interval(mu):
    with pytest.raises(ValueError, match=r"mu must be a number in \[0, 1\] or None \(no skip connection\)"):
        Architecture(activation="relu", mu=mu)


@pytest.mark.parametrize("stages", [0, -1, 1.5, 2.0, True, "2"])
def test_stages(stages):
    with pytest.raises(ValueError, match=r"stages must be an integer >= 1"):
        Architecture(activation="relu", stages=stages)


@pytest.mark.parametrize("eps", [-0.1, float("inf"), float("nan"), None])
def test_eps(eps):
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        Architecture(activation="relu", block="resmlp", eps=eps)


@pytest.mark.parametrize("field,value", [("sigma_w", -1.0), ("sigma_b", -0.5), ("sigma_w", float("nan")),
                                         ("sigma_b", float("inf")), ("sigma_w", sp.I)])
def test_dense_with_numbers(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be (a finite real number >= 0|a real number)"):
        Dense(**{field: value})


# ---------------------------------------------------------------------------
# sigma_w, sigma_b, K in the numeric entry points.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("sigma_w", -1.0), ("sigma_w", np.nan), ("sigma_w", np.inf),
                                         ("sigma_b", -1e-9), ("sigma_b", np.nan), ("sigma_b", -np.inf),
                                         ("sigma_w", [1.0, -1.0])])
def test_evaluate_sigma(field, value):
    args = dict(K=1.0, sigma_w=1.0, sigma_b=0.0)
    args[field] = value
    with pytest.raises(ValueError, match=rf"{field} must be >= 0 \(and finite\)"):
        mf.recursion(activation="gelu").evaluate(**args)


@pytest.mark.parametrize("value", [0.0, -1.0, np.nan, np.inf, [1.0, 0.0]])
def test_evaluate_K(value):
    with pytest.raises(ValueError, match=r"K must be > 0 \(and finite\)"):
        mf.recursion(activation="gelu").evaluate(K=value, sigma_w=1.0, sigma_b=0.0)


@pytest.mark.parametrize("field,value,match", [
    ("sigma_w", -2, r"sigma_w must be a finite real number >= 0"),
    ("sigma_b", sp.nan, r"sigma_b must be a finite real number >= 0"),
    ("eps", -1, r"eps must be a finite real number >= 0"),
    ("mu", 2, r"mu must be a finite real number >= 0 and <= 1"),
    ("K", -1, r"K must be a finite real number >= 0"),
])
def test_recursion_subs(field, value, match):
    with pytest.raises(ValueError, match=match):
        mf.recursion(activation="relu", block="resmlp").subs(**{field: value})


def test_symbolic_values_pass_through():
    rec = mf.recursion(activation="erf").subs(sigma_w=sp.Symbol("a") + 1)
    assert rec.kernel.has(sp.Symbol("a"))
    act = mf.activation("erf")
    assert act.second_moment(sp.Symbol("q")).has(sp.Symbol("q"))


@pytest.mark.parametrize("method", ["second_moment", "derivative_second_moment", "mean", "chi_delta_moment"])
@pytest.mark.parametrize("name", ["relu", "erf", "gelu", "tanh"])
def test_activation_moments_reject_negative_variance(method, name):
    act = mf.activation(name)
    with pytest.raises(ValueError, match=r"K must be a finite real number >= 0, got -0.5"):
        getattr(act, method)(-0.5)
    with pytest.raises(ValueError, match=r"K must be a finite real number >= 0"):
        getattr(act, method)(float("inf"))
    getattr(act, method)(0.5)  # fine
    getattr(act, method)(sp.Rational(1, 2))


@pytest.mark.parametrize("name", ["relu", "erf", "gelu", "tanh"])
def test_activation_two_point_checks(name):
    act = mf.activation(name)
    for method in (act.kernel, act.derivative_kernel):
        with pytest.raises(ValueError, match=r"K1 must be a finite real number >= 0"):
            method(-1, 1, 0)
        with pytest.raises(ValueError, match=r"K2 must be a finite real number >= 0"):
            method(1, -1, 0)
        with pytest.raises(ValueError, match=r"K12 must satisfy \|K12\| <= sqrt\(K1 K2\)"):
            method(1, 4, 2.5)
        method(1, 4, -2)  # rho = -1 is allowed
        method(1, 4, sp.Symbol("c"))


def test_quadrature_variances():
    with pytest.raises(ValueError, match=r"K must be a variance >= 0"):
        expect(np.tanh, -1.0)
    with pytest.raises(ValueError, match=r"K12 must satisfy"):
        expect2(lambda a, b: a * b, 1.0, 1.0, -1.1)


def test_series_and_evaluate_pair_arguments():
    bn = mf.recursion(activation="relu", norm="bn")
    with pytest.raises(ValueError, match="K12 is required"):
        bn.evaluate(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"K12 must satisfy \|K12\| <= K"):
        bn.evaluate(1.0, 1.0, 0.0, K12=-1.5)
    with pytest.raises(ValueError, match=r"K12 must be finite"):
        bn.evaluate(1.0, 1.0, 0.0, K12=np.nan)
    with pytest.raises(ValueError, match="series expansion is defined for one-input recursions"):
        bn.series(1.0)
