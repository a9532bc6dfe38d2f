"""Fixed points, critical lines and critical points solved in mpmath (mp.findroot), from the
definitions of the partial-Jacobian paper (eqs. 4-5):

F(K) = sigma_w^2 E[phi(h)^2] + sigma_b^2 + mu^2 K,  chi_J(K) = sigma_w^2 E[phi'(h)^2] + mu^2,
h ~ N(0, K). Nothing is taken from meanfield.
"""
import mpmath as mp

from .closed_forms import d2gelu, d3gelu, d4gelu, dgelu, erf_dphi2, erf_phi2, gelu
from .gaussian import expect

# split points in z for smooth activations at K up to ~10 (the integrands change scale at |z| ~ 2-6)
WIDE_CUTS = (-6, -2, 0, 2, 6)


def mlp_fixed_point(phi2, sw, sb, K0, mu=0, **findroot):
    """K* with sigma_b^2 + sigma_w^2 phi2(K) + mu^2 K = K, phi2(K) = E[phi(h)^2] (mp.findroot from K0).

    ``findroot`` goes to mp.findroot (solver=..., tol=...); a bracket (a, b) for K0 needs a
    bracketing solver (solver="anderson").
    """
    return mp.findroot(lambda K: sb ** 2 + sw ** 2 * phi2(K) + mu ** 2 * K - K, K0, **findroot)


def erf_critical_line(sw, mu=0.0):
    """(sigma_b, K*) on the erf critical line at sigma_w: F(K) = K and chi_J(K) = 1 solved for
    (K, sigma_b^2) with the closed moments of erf (Williams 1997); start from chi_J = 1 solved for K."""
    sw = mp.mpf(sw)

    def eqs(K, T):
        return [T + sw ** 2 * erf_phi2(K) + mu ** 2 * K - K, sw ** 2 * erf_dphi2(K) + mu ** 2 - 1]

    K0 = ((4 * sw ** 2 / (mp.pi * (1 - mu ** 2))) ** 2 - 1) / 4
    K, T = mp.findroot(eqs, (K0, mp.mpf("0.1")))
    return mp.sqrt(T), K


def gelu_critical_point(mu=0.0, dps=25):
    """(K*, sigma_w^2, sigma_b^2) of GELU's critical point with K* > 0.

    chi_J = chi_K = 1 means E[phi'^2](K) = d/dK E[phi^2](K) = E[phi'^2 + phi phi''] (Price), so
    E[phi phi''](K) = 0: a 1-D root in K (near (3 + sqrt 17)/2), then
    sigma_w^2 = (1 - mu^2) / E[phi'^2] and sigma_b^2 = (1 - mu^2) K - sigma_w^2 E[phi^2] from F(K) = K.
    """
    def E(f, K):
        return expect(f, K, cuts=WIDE_CUTS)

    with mp.workdps(dps):
        K = mp.findroot(lambda k: E(lambda x: gelu(x) * d2gelu(x), k), mp.mpf("3.5"))
        Wv = (1 - mu ** 2) / E(lambda x: dgelu(x) ** 2, K)
        Tv = (1 - mu ** 2) * K - Wv * E(lambda x: gelu(x) ** 2, K)
    return K, Wv, Tv


def gelu_expansion(K, dps=25):
    """(sigma_w^2, c2, d1) of GELU at a critical point K* (mu = 0): dK' = dK - c2 dK^2 and
    chi_J = 1 - d1 dK (appendix G), K-derivatives by Price's theorem, d/dK E[f] = E[f'']/2:

    sigma_w^2 = 1 / E[phi'^2], c2 = -(sigma_w^2 / 4) E[3 phi2^2 + 4 phi1 phi3 + phi0 phi4],
    d1 = -sigma_w^2 E[phi2^2 + phi1 phi3] (phiN: the N-th derivative); zeta = d1 / c2.
    """
    def E(f):
        return expect(f, K, cuts=WIDE_CUTS)

    with mp.workdps(dps):
        W = 1 / E(lambda x: dgelu(x) ** 2)
        # d2/dK2 E[phi^2] = E[(phi^2)^(4)]/4 = E[3 p2^2 + 4 p1 p3 + p0 p4]/2
        q2 = E(lambda x: 3 * d2gelu(x) ** 2 + 4 * dgelu(x) * d3gelu(x) + gelu(x) * d4gelu(x)) / 2
        # d/dK E[phi'^2] = E[p2^2 + p1 p3]
        g1 = E(lambda x: d2gelu(x) ** 2 + dgelu(x) * d3gelu(x))
        return W, -W * q2 / 2, -W * g1


def gelu_maps(cuts=(0,)):
    """(F(K, W, T), chi_J(K, W), chi_K(K, W, T)) of the GELU MLP, W = sigma_w^2, T = sigma_b^2:
    F = W E[phi^2] + T, chi_J = W E[phi'^2], chi_K = dF/dK = W E[phi'^2 + phi phi''] (Price)."""
    def E(f, K):
        return expect(f, K, cuts=cuts)

    def F(K, W, T):
        return W * E(lambda h: gelu(h) ** 2, K) + T

    def chi_J(K, W):
        return W * E(lambda h: dgelu(h) ** 2, K)

    def chi_K(K, W, T):
        return W * E(lambda h: dgelu(h) ** 2 + gelu(h) * d2gelu(h), K)

    return F, chi_J, chi_K
