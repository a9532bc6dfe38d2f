"""An mpmath reference for the Gram recursion of smooth activations with phi(0) != 0 at small K.

Part of tests/references (not collected by pytest); imported by
tests/test_gram_ln_post_small_K.py. Nothing here comes from meanfield: the two-point moments
are tensor Gauss-Hermite sums in mpmath (nodes found by Newton's method on He_n in mpmath, from
numpy's starting values), u = s1 z1, v = s2 (rho z1 + sqrt(1 - rho^2) z2). For the activations
used here (softplus, the logistic sigmoid: analytic in the strip |Im h| < pi) and K <= ~1 the
integrand is analytic in z in a strip of half-width ~pi / sqrt(K): 48 nodes are exact to 1e-40
below K = 0.05, 128 nodes to ~1e-23 at K = 1.3 (:func:`check_convergence` compares rules;
:func:`check_rule` compares with nested adaptive ``mp.quad``: softplus at (K1, K2, K12) =
(0.3, 0.5, 0.2) and sigmoid at (0.02, 0.03, -0.01) agree to 2e-21 at 20 digits, the working
precision, in 2-3 minutes each).

The recursion runs at ``dps`` digits on the raw moments E[phi phi], E[phi], exactly as the maths
says (LayerNorm: (K12 - m1 m2) / sqrt((K1 - m1^2)(K2 - m2^2))); at K ~ 1e-12 the subtractions
cost ~12-24 digits, which a 60-digit working precision leaves to spare.
"""
import mpmath as mp
import numpy as np

_NODES = {}


def hermite_rule(n, dps):
    """Nodes and weights of the n-point Gauss rule for the N(0, 1) measure, at ``dps`` digits."""
    key = (n, dps)
    if key not in _NODES:
        with mp.workdps(dps + 10):
            z0, _ = np.polynomial.hermite_e.hermegauss(n)
            zs, ws = [], []
            for z in z0:
                z = mp.mpf(float(z))
                for _ in range(100):
                    # He_n(z), He_{n-1}(z) by the three-term recurrence; He_n' = n He_{n-1}
                    a, b = mp.mpf(1), z
                    for k in range(1, n):
                        a, b = b, z * b - k * a
                    step = b / (n * a)
                    z -= step
                    if abs(step) < mp.mpf(10) ** (-dps - 5):
                        break
                a, b = mp.mpf(1), z
                for k in range(1, n):
                    a, b = b, z * b - k * a
                zs.append(z)
                ws.append(mp.factorial(n - 1) / (n * a * a))   # n! / (n He_{n-1})^2 = (n-1)! / (n He_{n-1}^2)
            _NODES[key] = (zs, ws)
    return _NODES[key]


def softplus(h):
    return mp.log1p(mp.exp(h)) if h < 0 else h + mp.log1p(mp.exp(-h))


def dsoftplus(h):
    return 1 / (1 + mp.exp(-h))


def sigmoid(h):
    return 1 / (1 + mp.exp(-h))


def dsigmoid(h):
    e = mp.exp(-abs(h))
    return e / (1 + e) ** 2


FUNCTIONS = {"softplus": (softplus, dsoftplus), "sigmoid": (sigmoid, dsigmoid)}


def pair_moments(f, df, K1, K2, K12, n=None, dps=60):
    """(E f(u)^2, E f(v)^2, E f(u) f(v), E f(u), E f(v), E f'(u) f'(v)) under the Gaussian pair.

    n: nodes per dimension; by default 48 below K = 0.05 (converged to 1e-40 there) and 128 above
    (the strip of analyticity narrows like pi / sqrt(K): at K = 1.3, 48 nodes are 5e-15 off, 128 nodes
    2e-23 against 160)."""
    if n is None:
        n = 48 if max(K1, K2) < mp.mpf("0.05") else 128
    zs, ws = hermite_rule(n, dps)
    s1, s2 = mp.sqrt(K1), mp.sqrt(K2)
    rho = K12 / (s1 * s2)
    c = mp.sqrt(max(1 - rho * rho, mp.mpf(0)))
    fu = [f(s1 * z) for z in zs]
    dfu = [df(s1 * z) for z in zs]
    Euu = mp.fsum(w * a * a for w, a in zip(ws, fu))
    Eu = mp.fsum(w * a for w, a in zip(ws, fu))
    fv1 = [f(s2 * z) for z in zs]
    Evv = mp.fsum(w * a * a for w, a in zip(ws, fv1))
    Ev = mp.fsum(w * a for w, a in zip(ws, fv1))
    Euv, Ed = mp.mpf(0), mp.mpf(0)
    for w1, z1, a, da in zip(ws, zs, fu, dfu):
        inner, dinner = mp.mpf(0), mp.mpf(0)
        for w2, z2 in zip(ws, zs):
            v = s2 * (rho * z1 + c * z2)
            inner += w2 * f(v)
            dinner += w2 * df(v)
        Euv += w1 * a * inner
        Ed += w1 * da * dinner
    return Euu, Evv, Euv, Eu, Ev, Ed


def check_convergence(name, K1, K2, K12, n=48, m=72, dps=40):
    """max relative difference of the pair moments between the n- and m-point Hermite rules."""
    f, df = FUNCTIONS[name]
    with mp.workdps(dps):
        a = pair_moments(f, df, mp.mpf(K1), mp.mpf(K2), mp.mpf(K12), n=n, dps=dps)
        b = pair_moments(f, df, mp.mpf(K1), mp.mpf(K2), mp.mpf(K12), n=m, dps=dps)
        return max(abs(x / y - 1) for x, y in zip(a, b))


def check_rule(name, K1, K2, K12, dps=30):
    """max relative difference of E f(u) f(v) and E f'(u) f'(v) between the Hermite rule and nested mp.quad."""
    f, df = FUNCTIONS[name]
    with mp.workdps(dps):
        K1, K2, K12 = mp.mpf(K1), mp.mpf(K2), mp.mpf(K12)
        out = pair_moments(f, df, K1, K2, K12, dps=dps)
        s1, r = mp.sqrt(K1), K12 / K1
        t = mp.sqrt(K2 - K12 * K12 / K1)
        pdf = lambda z: mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi)   # noqa: E731

        def nested(g):
            return mp.quad(lambda z1: g(s1 * z1) * mp.quad(lambda z2: g(r * s1 * z1 + t * z2) * pdf(z2),
                                                          [-mp.inf, 0, mp.inf]) * pdf(z1), [-mp.inf, 0, mp.inf])
        return max(abs(nested(f) / out[2] - 1), abs(nested(df) / out[5] - 1))


def recursion(x, y, name, depth, sw, sb, mu=None, dps=60):
    """(K^depth(x, y), Theta^depth(x, y)) ('ntk' parameterisation) of the block act -> LayerNorm -> dense
    (plus mu^2 times the skip when mu is given), from the float64 rows x, y taken exactly."""
    f, df = FUNCTIONS[name]
    with mp.workdps(dps):
        xs = [mp.mpf(float(v)) for v in x]
        ys = [mp.mpf(float(v)) for v in y]
        d = len(xs)
        sw, sb = mp.mpf(sw), mp.mpf(sb)
        sw2, sb2 = sw * sw, sb * sb

        def dot(p, q):
            return mp.fsum(a * b for a, b in zip(p, q))

        K1, K2, K12 = (sw2 * dot(p, q) / d + sb2 for p, q in ((xs, xs), (ys, ys), (xs, ys)))
        T = K12
        for _ in range(depth - 1):
            M1, M2, M12, m1, m2, D = pair_moments(f, df, K1, K2, K12, dps=dps)
            v1, v2 = M1 - m1 * m1, M2 - m2 * m2
            r = mp.sqrt(v1 * v2)
            L12, LT = (M12 - m1 * m2) / r, D * T / r
            # LayerNorm's output: unit variances, zero means
            N1, N2, N12 = sw2 + sb2, sw2 + sb2, sw2 * L12 + sb2
            NT = N12 + sw2 * LT
            if mu is not None:
                m = mp.mpf(mu) ** 2
                N1, N2, N12, NT = N1 + m * K1, N2 + m * K2, N12 + m * K12, NT + m * T
            K1, K2, K12, T = N1, N2, N12, NT
        return K12, T
