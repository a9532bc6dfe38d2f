"""Gram matrices of activations that grow faster than any polynomial (exp, sinh) and of a polynomial one.

The Hermite-series rules of ``meanfield._gram_quadrature`` assume polynomial growth (a trapezoid grid
|z| <= 13, tail nodes dropped where w exp(z^2 / 4) < 1e-22); for exp(x) they were 5e-10 off at K = 15
without a warning and raised IndexError from K = 20. Such activations now go to the general nested
engine. References: the closed forms E[e^u e^v] = exp((K1 + K2) / 2 + K12),
E[sinh u sinh v] = exp((K1 + K2) / 2) sinh K12, E[cosh u cosh v] = exp((K1 + K2) / 2) cosh K12 and
E[u^3 v^3] = 9 K1 K2 K12 + 6 K12^3 (Isserlis), each with its derivative kernel, at depth 2.
"""
import numpy as np
import pytest
import sympy as sp

import meanfield as mf
from meanfield.symbols import x

CLOSED = {
    "exp": (sp.exp(x), lambda a, b, c: np.exp((a + b) / 2 + c), lambda a, b, c: np.exp((a + b) / 2 + c)),
    "sinh": (sp.sinh(x), lambda a, b, c: np.exp((a + b) / 2) * np.sinh(c),
             lambda a, b, c: np.exp((a + b) / 2) * np.cosh(c)),
    "cube": (x**3, lambda a, b, c: 9 * a * b * c + 6 * c**3, lambda a, b, c: 9 * (a * b + 2 * c**2)),
}


@pytest.mark.slow
@pytest.mark.parametrize("K", [3.0, 15.0, 30.0])
@pytest.mark.parametrize("name", sorted(CLOSED))
def test_gram_against_closed_forms(name, K):
    expr, M, D = CLOSED[name]
    rng = np.random.default_rng(2)
    X = rng.standard_normal((3, 8))
    X *= np.sqrt(K) / np.linalg.norm(X, axis=1, keepdims=True) * np.sqrt(8) * np.array([[1.0], [0.7], [0.4]])
    k = mf.kernels(expr, X, depth=2, sigma_w=1.0, sigma_b=0.0)
    K1 = X @ X.T / 8
    a, b = np.diag(K1)[:, None], np.diag(K1)[None, :]
    nngp = M(a, b, K1)
    ntk = nngp + D(a, b, K1) * K1
    scale = np.sqrt(np.diag(nngp)[:, None] * np.diag(nngp)[None, :])
    np.testing.assert_array_less(np.abs(k.nngp - nngp), 1e-13 * scale)
    scale = np.sqrt(np.diag(ntk)[:, None] * np.diag(ntk)[None, :])
    np.testing.assert_array_less(np.abs(k.ntk - ntk), 1e-13 * scale)
