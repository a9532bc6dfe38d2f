"""Closed forms from the papers, written out in mpmath (nothing taken from meanfield).

Activations and their derivatives (``gelu``, ``dgelu``, ...), the Gaussian moments of erf
(Williams 1997), the arc-cosine kernels of the scale-invariant family (Cho & Saul 2009), the
two-point GELU form (Tsuchida et al. 2021), the critical lines of erf (partial-Jacobian paper,
eqs. 126, 142), and chi_J* of the zero-padded LayerNorm ResNet (derived by hand, docs/gram.md). Each is checked against quadrature somewhere in the tests (gram_pair's
:func:`check_closed_forms`, tests/test_solvers_lines.py); a formula is written once, here.
"""
import mpmath as mp

from .gaussian import ncdf, npdf


# ---------------------------------------------------------------------------
# Activations, by hand in mpmath.
# ---------------------------------------------------------------------------
def gelu(x):
    """GELU, x Phi(x)."""
    return x * mp.ncdf(x)


def dgelu(x):
    """GELU', Phi(x) + x phi(x)."""
    return mp.ncdf(x) + x * mp.npdf(x)


def d2gelu(x):
    """GELU'', phi(x) (2 - x^2)."""
    return mp.npdf(x) * (2 - x * x)


def d3gelu(x):
    """GELU''', phi(x) (x^3 - 4x)."""
    return mp.npdf(x) * (x ** 3 - 4 * x)


def d4gelu(x):
    """GELU'''', phi(x) (-x^4 + 7x^2 - 4)."""
    return mp.npdf(x) * (-x ** 4 + 7 * x * x - 4)


def derf(x):
    """erf'(x) = (2 / sqrt pi) exp(-x^2)."""
    return 2 / mp.sqrt(mp.pi) * mp.exp(-x * x)


# ---------------------------------------------------------------------------
# One-point moments.
# ---------------------------------------------------------------------------
def erf_phi2(K):
    """E[erf(h)^2] = (2/pi) arcsin(2K / (1 + 2K)), h ~ N(0, K) (Williams 1997; paper eq. 121)."""
    return 2 / mp.pi * mp.asin(2 * K / (1 + 2 * K))


def erf_dphi2(K):
    """E[erf'(h)^2] = (4/pi) / sqrt(1 + 4K), h ~ N(0, K) (paper eq. 123)."""
    return 4 / mp.pi / mp.sqrt(1 + 4 * K)


# ---------------------------------------------------------------------------
# Two-point moments: (E[phi(u)phi(v)], E[phi'(u)phi'(v)]) and one(K) = (E[phi^2], E[phi]).
# ---------------------------------------------------------------------------
def scale_invariant_pair(a, b):
    """phi = a x (x > 0) + b x (x < 0): (pair, one), the arc-cosine kernels (Cho & Saul 2009).

    E[phi(u)phi(v)] = ab K12 + (a-b)^2/(2 pi) sqrt(K1 K2) (sin t + (pi - t) cos t), t = arccos rho,
    E[phi'(u)phi'(v)] = ab + (a-b)^2 (pi - t)/(2 pi), E[phi^2] = (a^2 + b^2) K / 2,
    E[phi] = (a-b) sqrt(K/(2 pi)).
    """
    a, b = mp.mpf(a), mp.mpf(b)

    def pair(K1, K2, K12):
        r = mp.sqrt(K1 * K2)
        rho = K12 / r
        rho = min(max(rho, mp.mpf(-1)), mp.mpf(1))
        t = mp.acos(rho)
        M = a * b * K12 + (a - b) ** 2 / (2 * mp.pi) * r * (mp.sin(t) + (mp.pi - t) * mp.cos(t))
        D = a * b + (a - b) ** 2 * (mp.pi - t) / (2 * mp.pi)
        return M, D

    def one(K):
        return (a * a + b * b) * K / 2, (a - b) * mp.sqrt(K / (2 * mp.pi))

    return pair, one


def erf_pair(K1, K2, K12):
    """erf: ((2/pi) arcsin(2 K12 / sqrt(P)), (4/pi) / sqrt(P - 4 K12^2)), P = (1+2K1)(1+2K2) (Williams 1997)."""
    P = (1 + 2 * K1) * (1 + 2 * K2)
    return 2 / mp.pi * mp.asin(2 * K12 / mp.sqrt(P)), 4 / mp.pi / mp.sqrt(P - 4 * K12 * K12)


def erf_one(K):
    """erf: (E[erf^2], E[erf]) = ((2/pi) arcsin(2K/(1+2K)), 0)."""
    return erf_phi2(K), mp.mpf(0)


def relu_cond(m, s):
    """(E[relu(v)], E[relu'(v)]) for v ~ N(m, s^2): (m Phi(m/s) + s phi(m/s), Phi(m/s));
    s = 0: (max(m, 0), [m > 0])."""
    if s == 0:
        return max(m, mp.mpf(0)), mp.mpf(m > 0)
    return m * ncdf(m / s) + s * npdf(m / s), ncdf(m / s)


def erf_cond(m, s):
    """(E[erf(v)], E[erf'(v)]) for v ~ N(m, s^2), a = 1 + 2 s^2:
    (erf(m / sqrt a), (2 / sqrt pi) exp(-m^2 / a) / sqrt a)."""
    a = 1 + 2 * s * s
    return mp.erf(m / mp.sqrt(a)), 2 / mp.sqrt(mp.pi) * mp.exp(-m * m / a) / mp.sqrt(a)


def gelu_cond(m, s):
    """(E[v Phi(v)], E[Phi(v) + v phi(v)]) for v ~ N(m, s^2), q = sqrt(1 + s^2):
    m Phi(m/q) + s^2 phi(m/q) / q and Phi(m/q) + m phi(m/q) / q^3."""
    q = mp.sqrt(1 + s * s)
    e_phi = m * ncdf(m / q) + s * s / q * npdf(m / q)
    e_dphi = ncdf(m / q) + m / (q * q) * npdf(m / q) / q
    return e_phi, e_dphi


def gelu_pair(K1, K2, K12):
    """GELU: the two-point form of Tsuchida et al. (2021) (meanfield.activations.Gelu's docstring).

    With P = (1+K1)(1+K2), D = P - K12^2, a = arcsin(K12 / sqrt P):
    E[phi phi] = K12 (1/4 + a/(2 pi)) + (K1 K2 - K12^2 (1 - 1/(1+K1) - 1/(1+K2))) / (2 pi sqrt D),
    E[phi' phi'] = 1/4 + a/(2 pi) + K12 (1/(1+K1) + 1/(1+K2)) / (2 pi sqrt D) + K12 / (2 pi D^(3/2)).
    """
    P = (1 + K1) * (1 + K2)
    D = P - K12 * K12
    a = mp.asin(K12 / mp.sqrt(P))
    M = K12 * (mp.mpf(1) / 4 + a / (2 * mp.pi)) + (K1 * K2 - K12 ** 2 * (1 - 1 / (1 + K1) - 1 / (1 + K2))) / (
        2 * mp.pi * mp.sqrt(D))
    Dk = (mp.mpf(1) / 4 + a / (2 * mp.pi) + K12 * (1 / (1 + K1) + 1 / (1 + K2)) / (2 * mp.pi * mp.sqrt(D))
          + K12 / (2 * mp.pi * D ** mp.mpf(1.5)))
    return M, Dk


def gelu_one(K):
    """GELU: (E[phi^2], E[phi]); E[phi] = K / sqrt(2 pi (1 + K)) (E[h Phi(h)] = K E[phi(h)], Stein)."""
    return gelu_pair(K, K, K)[0], K / mp.sqrt(2 * mp.pi * (1 + K))


# ---------------------------------------------------------------------------
# Critical lines.
# ---------------------------------------------------------------------------
def erf_critical_sigma_b(sw, mu=0):
    """sigma_b on the erf critical line at sigma_w (paper eq. 142; eq. 126 is mu = 0):

    sigma_b^2 = a / (4 pi^2 (1 - mu^2)) - (2 sigma_w^2 / pi) arcsin(a / c),
    a, c = 16 sigma_w^4 -+ pi^2 (1 - mu^2)^2.
    """
    sw, m2 = mp.mpf(sw), mp.mpf(mu) ** 2
    a = 16 * sw ** 4 - mp.pi ** 2 * (1 - m2) ** 2
    c = 16 * sw ** 4 + mp.pi ** 2 * (1 - m2) ** 2
    return mp.sqrt(a / (4 * mp.pi ** 2 * (1 - m2)) - 2 * sw ** 2 / mp.pi * mp.asin(a / c))


def gelu_critical_line(K):
    """(sigma_w, sigma_b) of the GELU critical line at K* = K (paper eqs. 157-158):

    sigma_w = 2 (1 + 2K(3 + 5K) / (pi (1+K)(1+2K)^(3/2)) + (2/pi) arcsin(K/(1+K)))^(-1/2),
    sigma_b = K / (sqrt(2 pi) (1 + 2K)^(3/4)) sigma_w.
    """
    K = mp.mpf(K)
    sw = 2 * (1 + 2 * K * (3 + 5 * K) / (mp.pi * (1 + K) * (1 + 2 * K) ** 1.5)
              + 2 / mp.pi * mp.asin(K / (1 + K))) ** -0.5
    return sw, K / (mp.sqrt(2 * mp.pi) * (1 + 2 * K) ** 0.75) * sw


# ---------------------------------------------------------------------------
# The zero-padded LayerNorm ResNet (ReLU, sigma_b = 0).
# ---------------------------------------------------------------------------
def ln_resnet_chi_star(grid, convs, mu):
    r"""chi_J* of h -> mu h + branch(h), the branch ``convs`` times (LayerNorm over channels and positions,
    ReLU, a 3 x 3 (or 3-tap) convolution with zero padding, sigma_b = 0), on positions of shape ``grid``.

    Derived by hand (docs/gram.md, "The LayerNorm ResNet away from mu = 1"): with P the zero-padded tap mean
    (P = P_H x P_W, P_n tridiagonal with 1/3 on three diagonals), the position variances at the fixed point
    are P's Perron vector and

        chi_J* = mu^2 + (1 - mu^2) rho,   rho = prod over axes of (1' P_n^d 1 / n) / lambda_n^d,
        lambda_n = (1 + 2 cos(pi / (n + 1))) / 3,

    d = ``convs``. 1' P_n^d 1 in exact rationals; lambda_n (the tridiagonal Toeplitz spectrum) in mpmath.
    """
    from fractions import Fraction

    rho = mp.mpf(1)
    for n in grid:
        v = [Fraction(1)] * n
        for _ in range(convs):
            v = [sum(v[max(i - 1, 0):i + 2], Fraction(0)) / 3 for i in range(n)]
        lam = (1 + 2 * mp.cos(mp.pi / (n + 1))) / 3
        total = sum(v, Fraction(0))
        rho *= mp.mpf(total.numerator) / total.denominator / n / lam ** convs
    mu2 = mp.mpf(mu) ** 2
    return mu2 + (1 - mu2) * rho


# ---------------------------------------------------------------------------
# Tied self-attention with 1/d logits on tokens of equal norm and equal overlaps.
# ---------------------------------------------------------------------------
def tied_attention_walk(a, b, T, c, s2, sb2, depth):
    r"""The token kernel A = a I + b 1 1^T (T tokens) through ``depth`` tied-attention layers, with the
    Jacobian between positions V = v I + w 1 1^T from V = I beside it.

    Derived by hand. The logits c A_{tu} (c = sigma_q sigma_k) are c (a + b) on the diagonal and c b off it,
    so the softmax is P = alpha I + r 1 1^T with r = 1 / (e^{c a} + T - 1) and alpha = (e^{c a} - 1) r, whose
    rows sum to alpha + r T = 1. Then, with 1 1^T squared = T 1 1^T,

        P (a I + b 1 1^T) P^T = alpha^2 a I + (b + r a (1 + alpha)) 1 1^T,

    and the layer maps A -> s2 P A P^T + sb2 1 1^T (s2 = sigma_o^2 sigma_v^2) and V -> s2 P V P^T (the same
    rule without the bias). Returns mpmath lists, one entry per layer after the first (a, b, v, w).
    """
    a, b, c, s2, sb2 = (mp.mpf(z) for z in (a, b, c, s2, sb2))
    v, w = mp.mpf(1), mp.mpf(0)
    out = []
    for _ in range(depth):
        r = 1 / (mp.exp(c * a) + T - 1)
        alpha = (mp.exp(c * a) - 1) * r
        a, b = s2 * alpha**2 * a, s2 * (b + r * a * (1 + alpha)) + sb2
        v, w = s2 * alpha**2 * v, s2 * (w + r * v * (1 + alpha))
        out.append((a, b, v, w))
    return out


def _hermite_rule(n):
    """Nodes and weights of the n-point Gauss-Hermite rule for E[f(z)], z ~ N(0, 1) (Golub-Welsch in mpmath)."""
    J = mp.matrix(n, n)
    for i in range(1, n):
        J[i, i - 1] = J[i - 1, i] = mp.sqrt(i)
    E, Q = mp.eighe(J)
    return [E[i] for i in range(n)], [Q[0, i] ** 2 for i in range(n)]


def sqrt_attention_two_tokens(A, V, c, s2, sb2, nodes=40):
    r"""One 1/sqrt(d_h) attention layer on two tokens at infinite width (independent query and key weights,
    infinitely many heads): the token kernel A' and the Jacobian map V' from the token kernel ``A`` and the
    Jacobian ``V`` (2 x 2 nested lists), by 2-D Gaussian quadrature in mpmath.

    Derived by hand. With two tokens row t of the softmax is (p_t, 1 - p_t), p_t = logistic(d_t), where
    d_t = s_t1 - s_t2 and Cov(s_tu, s_t'u') = c^2 A_tt' A_uu' give Cov(d_t, d_t') = c^2 g A_tt',
    g = A_11 + A_22 - 2 A_12. Then

        A'_tt' = s2 E[sum_uu' P_tu P_t'u' A_uu'] + sb2,
        V'_tt' = s2 E[(P V P^T)_tt' + c^2 q_t q_t' g (V_tt' g + A_tt' (V_11 + V_22 - 2 V_12))],  q = p (1 - p),

    the second term the path through the softmax weights (its Jacobian p (1 - p) (1, -1)(1, -1)^T per row).
    """
    A = [[mp.mpf(a) for a in row] for row in A]
    V = [[mp.mpf(v) for v in row] for row in V]
    c, s2, sb2 = mp.mpf(c), mp.mpf(s2), mp.mpf(sb2)
    g = A[0][0] + A[1][1] - 2 * A[0][1]
    gV = V[0][0] + V[1][1] - 2 * V[0][1]
    C = [[c**2 * g * A[i][j] for j in range(2)] for i in range(2)]

    # d = (d_1, d_2) ~ N(0, C): d_1 = a z1, d_2 = b z1 + e z2, by the tensor Gauss-Hermite rule of ``nodes``
    # points per axis (the integrands are analytic in a strip, the logistic's poles at +-i pi: 40 nodes give
    # ~1e-5 relative, 60 ~1e-8, against 80)
    a = mp.sqrt(C[0][0])
    b = C[0][1] / a
    e = mp.sqrt(max(C[1][1] - b**2, mp.mpf(0)))
    z, w = _hermite_rule(nodes)

    def expect(f):
        return sum(wi * wj * f(a * zi, b * zi + e * zj) for zi, wi in zip(z, w) for zj, wj in zip(z, w))

    def rows(d1, d2):
        p = [1 / (1 + mp.exp(-d1)), 1 / (1 + mp.exp(-d2))]
        return [[p[0], 1 - p[0]], [p[1], 1 - p[1]]], [p[0] * (1 - p[0]), p[1] * (1 - p[1])]

    Anew, Vnew = [[0, 0], [0, 0]], [[0, 0], [0, 0]]
    for t in range(2):
        for s in range(2):
            def kernel(d1, d2, t=t, s=s):
                P, _ = rows(d1, d2)
                return sum(P[t][u] * P[s][w] * A[u][w] for u in range(2) for w in range(2))

            def jac(d1, d2, t=t, s=s):
                P, q = rows(d1, d2)
                value = sum(P[t][u] * P[s][w] * V[u][w] for u in range(2) for w in range(2))
                return value + c**2 * q[t] * q[s] * g * (V[t][s] * g + A[t][s] * gV)

            Anew[t][s] = s2 * expect(kernel) + sb2
            Vnew[t][s] = s2 * expect(jac)
    return Anew, Vnew
