"""Near-parallel pairs in the BatchNorm walk and the token blocks (ResMLP, MLP-Mixer), against 50 digits.

A pair's correlation rounded to ~1e-16 absolute moves ReLU's kernels like theta = arccos(rho) ~
sqrt(2 (1 - rho)), so a walk that does not carry the gap 1 - rho^2 (docs/gram.md, Numerics) has the
NTK of a near-parallel pair of equal norms right only to ~1e-13 / sqrt(1 - rho) relative. Measured at
depth 20 before the gap was carried: BatchNorm 1.8e-11 at 1 - rho = 1e-6 to 7.5e-8 at 1e-15 (which
the batch mean spread to every entry), ResMLP 1.7e-13 to 3.3e-8, Mixer 2e-12 to 3.1e-8. The BatchNorm
walk (the squared distance through the centring) and ResMLP (sums and rescalings) now carry it:
<= 1e-13 and <= 7.5e-15; the Mixer, whose channel LayerNorm subtracts the two-channel part B, does
not, and keeps the 1e-13 / sqrt(1 - rho) bound. Everything else (erf, pairs of norms 1 : 1.3, the
NNGP, the other entries) is within 1e-11 (BatchNorm: erf's other entries reach 2e-12 at norms
1 : 1.3, as before) or 5e-13 (Mixer), 5e-14 (ResMLP). The reference (tests/references/gram_batch_tokens.py)
writes the batch and token rules again in 50-digit mpmath from the float64 inputs, so at generic
pairs it is also a check of the rules themselves (token blocks: 1.6e-15).
"""
import numpy as np
import pytest

import meanfield as mf

import references.gram_batch_tokens as R


def _near(x, target, ratio, rng):
    """x' = ratio (x + sqrt(2 target) n), n perpendicular to x with |n| = |x|: 1 - rho ~ target."""
    f = x.ravel()
    n = rng.standard_normal(f.size)
    n -= f * (n @ f) / (f @ f)
    n *= np.linalg.norm(f) / np.linalg.norm(n)
    return ((f + np.sqrt(2 * target) * n) * ratio).reshape(x.shape)


def _case(block, name, target, ratio, depth):
    rng = np.random.default_rng(3)
    if block == "bn":
        X = rng.standard_normal((6, 8))
        X[1] = _near(X[0], target, ratio, rng)
        r = mf.kernels(mf.Architecture(name, norm="bn"), X, depth=depth, sigma_w=1.4, sigma_b=0.3)
        K, T = R.batch_recursion(X, name, depth, 1.4, 0.3)
    else:
        X = rng.standard_normal((3, 4, 4))
        X[1] = _near(X[0], target, ratio, rng)
        kw = dict(mu=0.8) if block == "mixer" else dict(mu=0.9, eps=0.5)
        r = mf.kernels(mf.Architecture(name, block=block, **kw), X, depth=depth, sigma_w=1.2, sigma_b=0.1)
        K, T = R.token_recursion(list(X), name, block, depth, 1.2, 0.1, **kw)
    return r, np.array(K, dtype=float), np.array(T, dtype=float)


def _check(block, name, target, ratio, depth=20):
    r, K, T = _case(block, name, target, ratio, depth)
    generic = {"bn": 1e-11, "mixer": 5e-13, "resmlp": 5e-14}[block]
    # the gap is not carried: ReLU's NTK of an equal-norm near-parallel pair (and with BatchNorm, through the
    # batch mean, every NTK entry) ~1e-13 / sqrt(1 - rho)
    lost = 1e-13 / np.sqrt(target) if (name == "relu" and ratio == 1.0 and block == "mixer") else generic
    ntk_tol = np.full(T.shape, generic)
    ntk_tol[0, 1] = ntk_tol[1, 0] = lost
    np.testing.assert_array_less(np.abs(r.nngp / K - 1), generic)
    np.testing.assert_array_less(np.abs(r.ntk / T - 1), ntk_tol)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["bn", "mixer", "resmlp"])
@pytest.mark.parametrize("name, target, ratio", [("relu", 1e-12, 1.0), ("erf", 1e-15, 1.0), ("relu", 1e-15, 1.3)])
def test_near_parallel_bn_tokens(block, name, target, ratio):
    _check(block, name, target, ratio)


@pytest.mark.parametrize("name, ratio", [("relu", 1.0), ("erf", 1.3)])
def test_near_parallel_bn_residual(name, ratio):
    # BatchNorm inside a residual branch (mu = 0.7): the gap through Residual.combine as well; a repeated row
    rng = np.random.default_rng(4)
    X = rng.standard_normal((6, 8))
    X[1] = _near(X[0], 1e-13, ratio, rng)
    X[5] = X[2]
    depth = 20
    r = mf.kernels(mf.Architecture(name, norm="bn", mu=0.7), X, depth=depth, sigma_w=1.4, sigma_b=0.3)
    K, T = (np.array(M, dtype=float) for M in R.batch_recursion(X, name, depth, 1.4, 0.3, mu=0.7))
    # relative to the scale sqrt(M_aa M_bb): some entries between inputs are ~1e-4 of it (measured: 3e-15)
    for got, ref in ((r.nngp, K), (r.ntk, T)):
        scale = np.sqrt(np.outer(np.diag(ref), np.diag(ref)))
        np.testing.assert_array_less(np.abs(got - ref) / scale, 1e-13)
    assert np.array_equal(r.nngp, r.nngp.T) and np.array_equal(r.ntk, r.ntk.T)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["bn", "mixer", "resmlp"])
@pytest.mark.parametrize("name", ["relu", "erf"])
@pytest.mark.parametrize("ratio", [1.0, 1.3])
@pytest.mark.parametrize("target", [1e-6, 1e-9, 1e-12, 1e-15])
def test_near_parallel_bn_tokens_grid(block, name, ratio, target):
    _check(block, name, target, ratio)
