"""Fixed points, critical lines and critical points solved in mpmath (mp.findroot), from the
definitions of the partial-Jacobian paper (eqs. 4-5):

F(K) = sigma_w^2 E[phi(h)^2] + sigma_b^2 + mu^2 K,  chi_J(K) = sigma_w^2 E[phi'(h)^2] + mu^2,
h ~ N(0, K). Nothing is taken from meanfield.
"""
import mpmath as mp

from .closed_forms import d2gelu, dgelu, erf_dphi2, erf_phi2, gelu
from .gaussian import expect

# the split points of the GELU expectations below (the integrands change scale at |z| ~ 2-6)
GELU_CUTS = (-6, -2, 0, 2, 6)


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
        return expect(f, K, cuts=GELU_CUTS)

    with mp.workdps(dps):
        K = mp.findroot(lambda k: E(lambda x: gelu(x) * d2gelu(x), k), mp.mpf("3.5"))
        Wv = (1 - mu ** 2) / E(lambda x: dgelu(x) ** 2, K)
        Tv = (1 - mu ** 2) * K - Wv * E(lambda x: gelu(x) ** 2, K)
    return K, Wv, Tv
