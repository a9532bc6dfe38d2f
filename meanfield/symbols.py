"""The sympy symbols every recursion is written in.

They carry no assumptions on purpose: ``expr.subs("K", 1.0)`` (a string key)
must find them, and sympify("K") is a plain Symbol.

- ``K``       : NNGP kernel K^l = E[h^l(x)^2] of the block input.
- ``K12``     : cross-covariance K^l(x, x') of two inputs (BatchNorm, C maps).
- ``sigma_w`` : weight scale, W ~ N(0, sigma_w^2 / fan_in).
- ``sigma_b`` : bias scale, b ~ N(0, sigma_b^2).
- ``mu``      : residual (skip) strength, h^{l+1} = branch(h^l) + mu h^l.
- ``eps``     : LayerScale / branch multiplier (ResMLP).
"""
import sympy as sp

K, K12, sigma_w, sigma_b, mu, eps = sp.symbols("K K12 sigma_w sigma_b mu eps")
#: the dummy variable of activation expressions, phi(x)
x = sp.Symbol("x")

__all__ = ["K", "K12", "sigma_w", "sigma_b", "mu", "eps", "x"]
