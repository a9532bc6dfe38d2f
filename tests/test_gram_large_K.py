"""erf and GELU kernels at large K: correlation 1 must lose nothing to rounding.

The closed forms divide by (1 + c K1)(1 + c K2) - c^2 K12^2 and take arcsin of a
correlation that is 1 - O(1/K) on the diagonal; written naively both round to
~1e-16 K relative (the erf NTK diagonal was 0.5 % off at K ~ 5e13). The
references are independent: one-dimensional mpmath quadratures at 40 digits of
the conditional expectations, using E[erf(m + s z)] = erf(m / sqrt(1 + 2 s^2))
and the Gaussian identities for GELU below, with no package code.
"""
import mpmath as mp
import numpy as np
import pytest

import meanfield as mf
import references as R

DPS = 40


def _conditional(K1, K2, K12):
    """v | u ~ N(a u, s^2) for (u, v) ~ N(0, [[K1, K12], [K12, K2]]) (s = 0 where s^2 rounds below 0)."""
    s2 = K2 - K12**2 / K1
    return K12 / K1, mp.sqrt(s2) if s2 > 0 else mp.mpf(0)


def _erf_pair(K1, K2, K12):
    # E[erf(w)] = erf(m / sqrt(1 + 2 s^2)), E[erf'(w)] = erf'(m / sqrt(1 + 2 s^2)) / sqrt(1 + 2 s^2)
    a, s = _conditional(K1, K2, K12)
    phi = lambda u: mp.erf(u) * R.erf_cond(a * u, s)[0]  # noqa: E731
    dphi = lambda u: R.derf(u) * R.erf_cond(a * u, s)[1]  # noqa: E731
    return phi, dphi


def _gelu_pair(K1, K2, K12):
    # w = m + s z, m = a u:  E[w Phi(w)] = m Phi(m/r) + s^2 pdf(m/r)/r,
    # E[Phi(w) + w pdf(w)] = Phi(m/r) + m pdf(m/r) / r^3, with r = sqrt(1 + s^2)
    a, s = _conditional(K1, K2, K12)

    def phi(u):
        return R.gelu(u) * R.gelu_cond(a * u, s)[0]

    def dphi(u):
        return R.dgelu(u) * R.gelu_cond(a * u, s)[1]

    return phi, dphi


def _expect(f, K):
    # the activations change on the scale h ~ 1, i.e. z ~ 1/sqrt(K): split there as well as at z ~ 1
    return R.expect(f, K, cuts=(-8, -1, 0, 1, 8), kinks=(-8, -1, 1, 8))


PAIRS = {"erf": _erf_pair, "gelu": _gelu_pair}
X = np.array([[1.0, 0.0], [0.6, 0.8000001], [2.0, 0.0], [-1.0, 0.0]])


@pytest.mark.slow
@pytest.mark.parametrize("act", ["erf", "gelu"])
@pytest.mark.parametrize("sw", [1e4, 1e6])
def test_gram_depth2_against_mpmath(act, sw):
    # identical, near-parallel, parallel of different norms and antiparallel inputs;
    # NTK parameterisation: Theta^2 = K^2 + sw^2 E[phi'(u) phi'(v)] Theta^1 with Theta^1 = K^1
    # Tolerance: 1e-13 relative, or 1e-15 of the entry's scale sqrt(K(x, x) K(x', x')): GELU's
    # antiparallel entry (~K^-1/2) is a cancellation of terms ~K^1/2 in the closed form, so only
    # its absolute error is at rounding level (documented in docs/gram.md, Numerics).
    k = mf.kernels(act, X, depth=2, sigma_w=sw, sigma_b=0.0)
    with mp.workdps(DPS):
        Xm = [[mp.mpf(v) for v in row] for row in X]
        ref = {}
        for i, j in [(0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (0, 2), (0, 3)]:
            K1, K2, K12 = (mp.mpf(sw)**2 * sum(p * q for p, q in zip(Xm[a], Xm[b])) / 2
                           for a, b in [(i, i), (j, j), (i, j)])
            phi, dphi = PAIRS[act](K1, K2, K12)
            nngp = mp.mpf(sw)**2 * _expect(phi, K1)
            ref[i, j] = nngp, nngp + mp.mpf(sw)**2 * _expect(dphi, K1) * K12
        for (i, j), (nngp, ntk) in ref.items():
            for got, want, m in ((k.nngp[i, j], nngp, 0), (k.ntk[i, j], ntk, 1)):
                scale = mp.sqrt(ref[i, i][m] * ref[j, j][m])
                assert abs(got - want) <= max(1e-13 * abs(want), 1e-15 * scale), (i, j, m, got, want)


@pytest.mark.slow
@pytest.mark.parametrize("act", ["erf", "gelu"])
@pytest.mark.parametrize("K0", [1e8, 1e12])
def test_profile_at_large_K_against_mpmath(act, K0):
    # the one-point forms arcsin(2K/(1+2K)) (erf) and arcsin(K/(1+K)) (GELU) are evaluated as
    # arctangents of the exact gap: rounded naively they lose ~1e-16 sqrt(K) relative
    f = {"erf": (mp.erf, lambda h: 2 / mp.sqrt(mp.pi) * mp.exp(-h * h)),
         "gelu": (lambda h: h * mp.ncdf(h), lambda h: mp.ncdf(h) + h * mp.npdf(h))}[act]
    p = mf.kernel_profile(act, depth=2, sigma_w=1.0, sigma_b=0.0, K0=K0)
    with mp.workdps(DPS):
        K2 = _expect(lambda h: f[0](h)**2, mp.mpf(K0))
        chi = _expect(lambda h: f[1](h)**2, mp.mpf(K0))
    assert abs(p.K[1] - K2) <= 1e-14 * K2
    assert abs(p.chi_J[0] - chi) <= 1e-14 * chi


def test_gelu_near_parallel_deep_chaos_against_mpmath():
    # K ~ 1e26 at depth 40 (chaotic GELU), inputs of norms 1 and 2 at correlation 0.996 at the end:
    # once refused (the expanded (1+K1)(1+K2) - K12^2 cancelled), now answered. Reference: the
    # closed forms (Gelu's docstring) iterated in 60-digit mpmath, rounding nothing.
    x = np.array([[1.0, 0.0], [2.0, 1e-15]])
    sw, sb, depth = 3.0, 0.5, 40
    k = mf.kernels("gelu", x, depth=depth, sigma_w=sw, sigma_b=sb)
    with mp.workdps(60):
        def kern(K1, K2, K12):
            D = (1 + K1) * (1 + K2) - K12**2
            a = mp.asin(K12 / mp.sqrt((1 + K1) * (1 + K2))) / (2 * mp.pi)
            return (K12 * (mp.mpf(1) / 4 + a) + (K1 * K2 - K12**2 * (1 - 1 / (1 + K1) - 1 / (1 + K2)))
                    / (2 * mp.pi * mp.sqrt(D)),
                    mp.mpf(1) / 4 + a + K12 * (1 / (1 + K1) + 1 / (1 + K2)) / (2 * mp.pi * mp.sqrt(D))
                    + K12 / (2 * mp.pi * D**mp.mpf(1.5)))

        X = [[mp.mpf(v) for v in row] for row in x]
        W, B = mp.mpf(sw)**2, mp.mpf(sb)**2
        K = {(i, j): W * sum(p * q for p, q in zip(X[i], X[j])) / 2 + B for i, j in [(0, 0), (1, 1), (0, 1)]}
        T = dict(K)
        for _ in range(depth - 1):
            new = {}
            for (i, j) in K:
                e, d = kern(K[i, i], K[j, j], K[i, j])
                new[i, j] = (W * e + B, W * e + B + W * d * T[i, j])
            K, T = {ij: v[0] for ij, v in new.items()}, {ij: v[1] for ij, v in new.items()}
        for (i, j) in K:
            assert abs(k.nngp[i, j] - K[i, j]) <= 1e-13 * K[i, j], (i, j)
            assert abs(k.ntk[i, j] - T[i, j]) <= 1e-13 * T[i, j], (i, j)


def test_gelu_profile_deep_chaos_against_mpmath():
    # chaotic GELU: K grows ~ sigma_w^2 / 2 per layer to 2.6e21 at depth 50. The one-point forms lost
    # ~1e-16 sqrt(K^l) per layer when arcsin(K/(1+K)) was rounded: 6e-11 at depth 30, 1.1e-8 at 50.
    # Reference: eqs. 152/154 as printed (arcsin form) iterated in 40-digit mpmath; the forms are
    # checked against quadrature at K = 1e8 and 1e12 by test_profile_at_large_K_against_mpmath.
    sw, sb, depth = 2.3, 0.1, 50
    p = mf.kernel_profile("gelu", depth=depth, sigma_w=sw, sigma_b=sb)
    with mp.workdps(DPS):
        W, B = mp.mpf(sw)**2, mp.mpf(sb)**2
        K = W + B
        for l in range(depth):
            a = mp.asin(K / (1 + K))
            chi = W * (mp.mpf(1) / 4 + (a + K * (3 + 5 * K) / ((1 + K) * (1 + 2 * K)**mp.mpf(1.5))) / (2 * mp.pi))
            assert abs(p.K[l] - K) <= 1e-14 * K, l
            assert abs(p.chi_J[l] - chi) <= 1e-14 * chi, l
            K = W * (K / 4 + K / (2 * mp.pi) * a + K**2 / (mp.pi * (1 + K) * mp.sqrt(1 + 2 * K))) + B
    assert p.K[-1] > 1e21
