"""The one torch table: every registered activation has a row, phi and phi' match sympy."""
import numpy as np
import pytest
import sympy as sp

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield import symbols as S  # noqa: E402
from meanfield.torch.activations import (TORCH_ACTIVATIONS, read_function, read_module,  # noqa: E402
                                                      torch_activation, torch_module)

POINTS = torch.tensor([-3.1, -1.2, -0.5, -0.01, 0.3, 0.9, 1.7, 4.0], dtype=torch.float64)


def test_every_registered_activation_has_a_row():
    assert set(mf.available_activations()) <= set(TORCH_ACTIVATIONS)


@pytest.mark.parametrize("name", mf.available_activations())
def test_phi_and_derivative_match_sympy(name):
    phi = mf.activation(name)
    f, df = torch_activation(phi)
    ref_f = sp.lambdify(S.x, phi.expr, "mpmath")
    ref_df = sp.lambdify(S.x, phi.derivative, "mpmath")
    got_f, got_df = f(POINTS).numpy(), df(POINTS).numpy()
    for v, a, b in zip(POINTS.tolist(), got_f, got_df):
        assert abs(a - float(ref_f(v))) <= 1e-13 * max(1, abs(a)), (name, v)
        assert abs(b - float(ref_df(v))) <= 1e-12 * max(1, abs(b)), (name, v)


@pytest.mark.parametrize("name", [n for n, r in TORCH_ACTIVATIONS.items() if r.module is not None])
def test_module_round_trip(name):
    phi = mf.activation(name)
    m = torch_module(phi)
    f, _ = torch_activation(phi)
    assert torch.allclose(m(POINTS), f(POINTS), rtol=1e-14, atol=1e-14)
    back = read_module(m)
    assert back is not None and torch.allclose(torch_activation(back)[0](POINTS), f(POINTS))


def test_read_function_kwargs():
    F = torch.nn.functional
    assert read_function(F.leaky_relu, {"negative_slope": 0.2}) == mf.activation("leaky_relu", negative_slope=0.2)
    assert read_function(F.gelu, {"approximate": "tanh"}).name == "gelu_tanh"
    assert read_function(F.elu, {"alpha": 0.5}) == mf.activation("elu", alpha=0.5)
    assert read_function("relu", {}).name == "relu"
    assert read_function(torch.sin, {}) is None


def test_user_expression_lambdified():
    t = sp.Symbol("t")
    f, df = torch_activation(sp.sin(t) + t / 2)
    assert torch.allclose(f(POINTS), torch.sin(POINTS) + POINTS / 2)
    assert torch.allclose(df(POINTS), torch.cos(POINTS) + 0.5)
