"""Gaussian expectations in mpmath: the one-point and conditional two-point integrals of the tests.

Nothing here comes from meanfield. Every integral is ``mp.quad`` (tanh-sinh) over the standardised
variable z, h = sqrt(K) z, with the real line split where the integrand is not smooth (a kink of
phi at h = k is a split at z = k / sqrt(K)) or where it changes scale; an unsplit kink costs
tanh-sinh most of its digits.
"""
import mpmath as mp


def npdf(z):
    """The standard normal density exp(-z^2/2) / sqrt(2 pi), at the working precision."""
    return mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi)


def ncdf(z):
    """The standard normal distribution function erfc(-z/sqrt 2) / 2, at the working precision."""
    return mp.erfc(-z / mp.sqrt(2)) / 2


def expect(f, K, cuts=(0,), kinks=(), dps=None):
    """E[f(h)], h ~ N(0, K): int f(sqrt(K) z) phi(z) dz over [-inf, *splits, inf] (mpmath).

    cuts: split points in z (the standardised variable); kinks: further split points in h (they
    become z = k / sqrt(K)). K = 0 gives f(0) (the point mass). dps: working precision in digits
    (None: the caller's). f takes and returns mpmath numbers.
    """
    with mp.workdps(dps or mp.mp.dps):
        K = mp.mpf(K)
        if K == 0:
            return f(mp.mpf(0))
        s = mp.sqrt(K)
        pts = sorted({mp.mpf(c) for c in cuts} | {mp.mpf(k) / s for k in kinks})
        return mp.quad(lambda z: f(s * z) * npdf(z), [-mp.inf] + pts + [mp.inf])


def expect_conditional(f, g_cond, K1, K2, K12, cuts=(-8, -3, -1, 0, 1, 3, 8)):
    """E[f(u) g(v)] for a zero-mean Gaussian pair, as E_u[f(u) E[g(v) | u]] (mpmath).

    Var u = K1, Var v = K2, Cov = K12; v | u ~ N(K12 u / K1, K2 - K12^2 / K1), and
    g_cond(m, s) = E[g(v)], v ~ N(m, s^2), is a one-dimensional closed form the caller supplies
    (s = 0 when the pair is degenerate). cuts: split points in z, u = sqrt(K1) z.
    """
    s1, r = mp.sqrt(K1), K12 / K1
    var = K2 - K12 * K12 / K1
    s = mp.sqrt(var) if var > 0 else mp.mpf(0)
    return mp.quad(lambda z: f(s1 * z) * g_cond(r * s1 * z, s) * npdf(z), [-mp.inf] + list(cuts) + [mp.inf])
