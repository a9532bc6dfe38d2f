"""30-digit mpmath references against meanfield's fixed points, chi_J*, critical lines and points.

    python benchmarks/crosscheck/mpmath_points.py

Independent route: every activation is written out here in mpmath (erf, exact GELU, tanh,
softplus, SELU, ELU), Gaussian expectations are ``mpmath.quad`` over (-inf, 0, inf) (split at
the kink), chi_K = dF/dK by ``mpmath.diff`` of that quadrature (no Price theorem, no closed
forms, no meanfield code). Block: h <- mu h + W phi(norm(h)) + b (mu = 0: a plain MLP), K^1 =
sigma_w^2 + sigma_b^2 (unit-norm input).

* fixed point: iterate F from K^1 (at 15 digits) until it settles, then ``findroot`` at 30
  digits; chi_J* = mu^2 + sigma_w^2 E[phi'(h)^2] (no LN) or mu^2 + sigma_w^2 E[phi'(z)^2] / K*
  (pre-LN: the LayerNorm's Jacobian is 1/sqrt(K) per unit).
* critical line at sigma_w: K with chi_J(K) = 1 by ``findroot``; sigma_b^2 = (1 - mu^2) K -
  sigma_w^2 E[phi(h)^2].
* critical point: K* with chi_K(K*) = chi_J(K*) (so both are 1 at sigma_w^2 = (1 - mu^2) /
  E[phi'^2]); for K* = 0, sigma_w^2 = (1 - mu^2) / lim_{K->0} E[phi'^2].
"""
import math

import mpmath as mp

SELU_A = mp.mpf("1.6732632423543772848170429916717")
SELU_L = mp.mpf("1.0507009873554804934193349852946")

PHI = {
    "erf": (lambda x: mp.erf(x), lambda x: 2 / mp.sqrt(mp.pi) * mp.exp(-x * x)),
    "gelu": (lambda x: x * mp.ncdf(x), lambda x: mp.ncdf(x) + x * mp.npdf(x)),
    "tanh": (lambda x: mp.tanh(x), lambda x: mp.sech(x) ** 2),
    "softplus": (lambda x: mp.log1p(mp.exp(x)), lambda x: 1 / (1 + mp.exp(-x))),
    "selu": (lambda x: SELU_L * (x if x > 0 else SELU_A * mp.expm1(x)),
             lambda x: SELU_L * (1 if x > 0 else SELU_A * mp.exp(x))),
    "elu": (lambda x: x if x > 0 else mp.expm1(x), lambda x: 1 if x > 0 else mp.exp(x)),
}


def E(f, K):
    """E[f(sqrt(K) z)], z ~ N(0, 1)."""
    s = mp.sqrt(K)
    g = lambda z: f(s * z) * mp.npdf(z)  # noqa: E731
    return mp.quad(g, [-mp.inf, 0, mp.inf])


def F(name, K, sw, sb, mu, ln):
    phi = PHI[name][0]
    m2 = E(lambda x: phi(x) ** 2, 1 if ln else K)
    return mu * mu * K + sw * sw * m2 + sb * sb


def chiJ(name, K, sw, mu, ln):
    d = PHI[name][1]
    return mu * mu + sw * sw * E(lambda x: d(x) ** 2, 1 if ln else K) / (K if ln else 1)


def fixed_point(name, sw, sb, mu=0, ln=False, dps=30):
    sw, sb, mu = mp.mpf(sw), mp.mpf(sb), mp.mpf(mu)
    with mp.workdps(15):
        K = sw * sw + sb * sb
        for _ in range(400):
            K1 = F(name, K, sw, sb, mu, ln)
            if abs(K1 - K) < 1e-12 * (1 + K):
                K = K1
                break
            K = K1
    with mp.workdps(dps):
        K = mp.findroot(lambda k: F(name, k, sw, sb, mu, ln) - k, mp.mpf(K))
        return K, chiJ(name, K, sw, mu, ln)


def critical_line_sb(name, sw, K_guess, mu=0, dps=30):
    with mp.workdps(dps):
        sw, mu = mp.mpf(sw), mp.mpf(mu)
        K = mp.findroot(lambda k: chiJ(name, k, sw, mu, False) - 1, mp.mpf(K_guess))
        phi = PHI[name][0]
        sb2 = (1 - mu * mu) * K - sw * sw * E(lambda x: phi(x) ** 2, K)
        return K, mp.sqrt(sb2)


def critical_point_nontrivial(name, K_guess, mu=0, dps=30):
    """K* > 0 with chi_K = chi_J, and the (sigma_w, sigma_b) that put it on both lines."""
    with mp.workdps(dps):
        phi, d = PHI[name]
        mu = mp.mpf(mu)
        m2 = lambda k: E(lambda x: phi(x) ** 2, k)  # noqa: E731
        d2 = lambda k: E(lambda x: d(x) ** 2, k)  # noqa: E731
        with mp.workdps(dps + 15):
            K = mp.findroot(lambda k: mp.diff(m2, k) - d2(k), mp.mpf(K_guess))
        sw2 = (1 - mu * mu) / d2(K)
        sb2 = (1 - mu * mu) * K - sw2 * m2(K)
        return K, mp.sqrt(sw2), mp.sqrt(sb2)


def critical_point_zero(name, mu=0):
    """K* = 0: sigma_w^2 = (1 - mu^2) / E[phi'(0^+-)^2]."""
    d = PHI[name][1]
    lim = (d(mp.mpf("1e-40")) ** 2 + d(mp.mpf("-1e-40")) ** 2) / 2
    return mp.sqrt((1 - mp.mpf(mu) ** 2) / lim)


FIXED = [  # (activation, sigma_w, sigma_b, mu, pre-LN)
    ("erf", 1.37, 0.23, 0.0, False),
    ("erf", 2.6, 0.71, 0.0, False),
    ("gelu", 1.21, 0.34, 0.37, False),
    ("gelu", 1.3, 0.6, 0.0, False),
    ("tanh", 1.93, 0.17, 0.0, False),
    ("tanh", 1.37, 0.23, 0.7, True),
    ("softplus", 0.71, 0.29, 0.0, False),
    ("softplus", 1.37, 0.23, 0.7, True),
    ("selu", 0.97, 0.13, 0.0, False),
    ("elu", 1.13, 0.52, 0.5, False),
    ("gelu", 1.37, 0.23, 0.7, True),
]
LINES = [("erf", 1.37, 0.0), ("tanh", 1.93, 0.0), ("gelu", 1.3, 0.37), ("selu", 0.83, 0.0), ("elu", 1.21, 0.44)]


def arch(name, mu, ln):
    import meanfield as mf
    return mf.Architecture(name, norm="ln_pre" if ln else "none", mu=mu if (mu or ln) else None)


def rel(a, b):
    return abs(float(a) - float(b)) / max(abs(float(b)), 1e-300)


def main():
    import meanfield as mf

    mp.mp.dps = 30
    worst = 0.0
    print("## Fixed points K* (reached from a unit-norm input) and chi_J*\n")
    print("| activation | block | sigma_w | sigma_b | K* (mpmath, 30 digits) | rel diff K* | chi_J* (mpmath) | rel diff chi_J* |")
    print("|---|---|---|---|---|---|---|---|")
    for name, sw, sb, mu, ln in FIXED:
        a = arch(name, mu, ln)
        K, X = fixed_point(name, sw, sb, mu, ln)
        Km, Xm = mf.fixed_point(a, sigma_w=sw, sigma_b=sb), mf.chi_J(a, sigma_w=sw, sigma_b=sb)
        e1, e2 = rel(Km, K), rel(Xm, X)
        worst = max(worst, e1, e2)
        blk = ("pre-LN " if ln else "") + (f"mu={mu}" if (mu or ln) else "MLP")
        print(f"| {name} | {blk} | {sw} | {sb} | {mp.nstr(K, 20)} | {e1:.1e} | {mp.nstr(X, 20)} | {e2:.1e} |")
    print(f"\nlargest: {worst:.1e}\n")

    print("## Critical lines: sigma_b with chi_J* = 1 at a given sigma_w\n")
    print("| activation | mu | sigma_w | K* (mpmath) | sigma_b (mpmath) | meanfield sigma_b | rel diff |")
    print("|---|---|---|---|---|---|---|")
    w2 = 0.0
    for name, sw, mu in LINES:
        line = mf.critical_line(arch(name, mu, False), sigma_w=sw)
        K, sb = critical_line_sb(name, sw, float(line.K_star), mu)
        e = rel(line.sigma_b, sb)
        w2 = max(w2, e)
        print(f"| {name} | {mu} | {sw} | {mp.nstr(K, 20)} | {mp.nstr(sb, 20)} | {float(line.sigma_b):.17g} | {e:.1e} |")
    print(f"\nlargest: {w2:.1e}\n")

    print("## Critical points (chi_J* = chi_K* = 1)\n")
    print("| activation | mu | K* | sigma_w (mpmath) | sigma_b (mpmath) | rel diff sigma_w, sigma_b, K* |")
    print("|---|---|---|---|---|---|")
    w3 = 0.0
    for name in ("erf", "gelu", "tanh", "selu", "elu"):
        for mu in (0.0, 0.37):
            cps = mf.critical_point(arch(name, mu, False))
            for p in cps:
                if p.K_star == 0:
                    sw, sb, K = critical_point_zero(name, mu), mp.mpf(0), mp.mpf(0)
                else:
                    K, sw, sb = critical_point_nontrivial(name, p.K_star, mu)
                es = (rel(p.sigma_w, sw), abs(p.sigma_b - float(sb)) if sb == 0 else rel(p.sigma_b, sb),
                      abs(p.K_star - float(K)) if K == 0 else rel(p.K_star, K))
                w3 = max(w3, *es)
                print(f"| {name} | {mu} | {mp.nstr(K, 20)} | {mp.nstr(sw, 20)} | {mp.nstr(sb, 20)} | "
                      + ", ".join(f"{e:.1e}" for e in es) + " |")
    print(f"\nlargest: {w3:.1e}\n")


if __name__ == "__main__":
    main()
