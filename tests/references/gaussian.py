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


def expect_smooth_pair(a, b, K1, K2, K12, step=0.125, half_width=9.5, dps=20):
    """E[a(u) b(v)] for a zero-mean Gaussian pair (Var u = K1, Var v = K2, Cov = K12), for smooth a, b.

    The plain trapezoid rule in (z1, z2) on a uniform grid, which for a Gaussian weight times a
    function analytic in a strip |Im z| < d converges like exp(-2 pi d / step) (Trefethen &
    Weideman, SIAM Rev. 2014); it shares nothing with the package's exp-sinh rule.

    u = sqrt(K1) z1, v = sqrt(K2) (rho z1 + sqrt(1 - rho^2) z2), trapezoid rule
    with ``step`` on [-half_width, half_width]^2 (tails below e^-45).
    ``a`` and ``b`` take and return mpmath numbers. Only for smooth a, b.
    """
    with mp.workdps(dps):
        K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
        rho = K12 / mp.sqrt(K1 * K2)
        c = mp.sqrt(max(1 - rho * rho, mp.mpf(0)))
        s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
        h = mp.mpf(step)
        n = int(half_width / step)
        z = [k * h for k in range(-n, n + 1)]
        w = [h * mp.exp(-zk * zk / 2) / mp.sqrt(2 * mp.pi) for zk in z]
        total = mp.mpf(0)
        for zi, wi in zip(z, w):
            inner = mp.fsum(wj * b(s2 * (rho * zi + c * zj)) for zj, wj in zip(z, w))
            total += wi * a(s1 * zi) * inner
        return total
