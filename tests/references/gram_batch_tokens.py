"""50-digit mpmath references for the BatchNorm walk and the token blocks of meanfield.kernels.

Part of tests/references (not collected by pytest); imported by
tests/test_gram_near_parallel_bn_tokens.py. The two-point maps of ReLU and erf are those of
tests/references/gram_pair.py (closed forms checked there against conditional-expectation
quadrature); the batch and token rules are written again here from the tables of docs/gram.md, in
mpmath on whole matrices, from the float64 inputs taken exactly.

* BatchNorm block (norm='bn': BatchNorm -> phi -> dense) over a batch of n inputs:
  K -> n P K P / tr(P K P), T -> n P T P / tr(P K P), P = I - 1 1^T / n, then phi entry by entry
  (variances from the diagonal), then the dense layer ('ntk' parameterisation).
* Token blocks (ResMLP, MLP-Mixer) on images (n, T, d): the one-channel and two-channel
  (nT) x (nT) matrices A, B and their NTK analogues TA, TB, readout the mean over tokens.
"""
import mpmath as mp

from .gram_pair import activation


def _mat(n, m=None):
    return [[mp.mpf(0)] * (n if m is None else m) for _ in range(n)]


def _entrywise_act(name, K, T, B=None, TB=None):
    """phi on every entry: (k(K), dk(K) T) with variances diag(K); for the two-channel matrix B the
    variances are still diag(K) (one channel's), the covariance B."""
    pair, one = activation(name)
    n = len(K)
    Kn, Tn = _mat(n), _mat(n)
    for i in range(n):
        for j in range(i, n):
            src = K if B is None else B
            if B is None and i == j:
                M, D = one(K[i][i])[0], pair(K[i][i], K[i][i], K[i][i])[1]
            else:
                M, D = pair(K[i][i], K[j][j], src[i][j])
            tt = T if TB is None else TB
            Kn[i][j] = Kn[j][i] = M
            Tn[i][j] = Tn[j][i] = D * tt[i][j]
    return Kn, Tn


def batch_recursion(X, name, depth, sw, sb, mu=None, dps=50, shortcut=False):
    """(K, Theta) ('ntk') of h^depth over the batch X (list of float64 rows), norm='bn' (with mu: the block
    plus mu^2 times the skip; with ``shortcut`` the skip is a dense layer of its own weights)."""
    with mp.workdps(dps):
        xs = [[mp.mpf(float(v)) for v in row] for row in X]
        n, d = len(xs), len(xs[0])
        sw, sb = mp.mpf(sw), mp.mpf(sb)
        sw2, sb2 = sw * sw, sb * sb
        K = [[sw2 * mp.fsum(a * b for a, b in zip(p, q)) / d + sb2 for q in xs] for p in xs]
        T = [row[:] for row in K]
        for _ in range(depth - 1):
            K0, T0 = K, T
            r = [mp.fsum(row) / n for row in K]
            rb = mp.fsum(r) / n
            PKP = [[K[i][j] - r[i] - r[j] + rb for j in range(n)] for i in range(n)]
            rt = [mp.fsum(row) / n for row in T]
            rtb = mp.fsum(rt) / n
            PTP = [[T[i][j] - rt[i] - rt[j] + rtb for j in range(n)] for i in range(n)]
            s = n / mp.fsum(PKP[i][i] for i in range(n))
            K = [[v * s for v in row] for row in PKP]
            T = [[v * s for v in row] for row in PTP]
            M, D = _entrywise_act(name, K, T)
            K = [[sw2 * v + sb2 for v in row] for row in M]
            T = [[K[i][j] + sw2 * D[i][j] for j in range(n)] for i in range(n)]
            if mu is not None:
                m2 = mp.mpf(mu) ** 2
                if shortcut:
                    K0, T0 = ([[sw2 * v + sb2 for v in row] for row in K0],
                              [[sw2 * (K0[i][j] + T0[i][j]) + sb2 for j in range(n)] for i in range(n)])
                K = [[K[i][j] + m2 * K0[i][j] for j in range(n)] for i in range(n)]
                T = [[T[i][j] + m2 * T0[i][j] for j in range(n)] for i in range(n)]
        return K, T


def token_recursion(images, name, block, depth, sw, sb, mu, eps=None, dps=50):
    """(K, Theta) ('ntk') over images (list of (T, d) float64 arrays) for block 'mixer' or 'resmlp'."""
    with mp.workdps(dps):
        n, Tk, d = len(images), len(images[0]), len(images[0][0])
        N = n * Tk
        rows = [[mp.mpf(float(v)) for v in images[a][t]] for a in range(n) for t in range(Tk)]
        sw, sb, mu = mp.mpf(sw), mp.mpf(sb), mp.mpf(mu)
        sw2, sb2, mu2 = sw * sw, sb * sb, mu * mu
        tok = [i % Tk for i in range(N)]
        img = [i // Tk for i in range(N)]
        A = [[sw2 * mp.fsum(a * b for a, b in zip(p, q)) / d + sb2 for q in rows] for p in rows]
        TA = [r[:] for r in A]
        B, TB = _mat(N), _mat(N)

        def ch_dense(S):
            A, B, TA, TB = S
            An = [[sw2 * v + sb2 for v in r] for r in A]
            return An, _mat(N), [[An[i][j] + sw2 * TA[i][j] for j in range(N)] for i in range(N)], _mat(N)

        def tok_dense(S):
            out = []
            for M, TM in ((S[0], S[2]), (S[1], S[3])):
                # token mean of the (image a, image b) blocks' diagonal, on every token's diagonal block
                mean = {(a, b): mp.fsum(M[a * Tk + t][b * Tk + t] for t in range(Tk)) / Tk
                        for a in range(n) for b in range(n)}
                tmean = {(a, b): mp.fsum(TM[a * Tk + t][b * Tk + t] for t in range(Tk)) / Tk
                         for a in range(n) for b in range(n)}
                Mn, Tn = _mat(N), _mat(N)
                for i in range(N):
                    for j in range(N):
                        if tok[i] == tok[j]:
                            v = sw2 * mean[img[i], img[j]] + sb2
                            Mn[i][j], Tn[i][j] = v, v + sw2 * tmean[img[i], img[j]]
                out.append((Mn, Tn))
            (An, TAn), (Bn, TBn) = out
            return An, Bn, TAn, TBn

        def act(S):
            A, B, TA, TB = S
            An, TAn = _entrywise_act(name, A, TA)
            Bn, TBn = _entrywise_act(name, A, TA, B, TB)
            return An, Bn, TAn, TBn

        def ln(S):
            A, B, TA, TB = S
            v = [A[i][i] - B[i][i] for i in range(N)]
            An = [[(A[i][j] - B[i][j]) / mp.sqrt(v[i] * v[j]) for j in range(N)] for i in range(N)]
            TAn = [[(TA[i][j] - TB[i][j]) / mp.sqrt(v[i] * v[j]) for j in range(N)] for i in range(N)]
            return An, _mat(N), TAn, _mat(N)

        def scale(S, e):
            return tuple([[e * e * v for v in r] for r in M] for M in S)

        def residual(S, branch):
            out = S
            for f in branch:
                out = f(out)
            return tuple([[o + mu2 * s for o, s in zip(ro, rs)] for ro, rs in zip(Mo, Ms)]
                         for Mo, Ms in zip(out, S))

        S = (A, B, TA, TB)
        for _ in range(depth - 1):
            if block == "mixer":
                S = residual(S, [ln, tok_dense, act, tok_dense])
                S = residual(S, [ln, ch_dense, act, ch_dense])
            else:
                e = mp.mpf(eps)
                S = residual(S, [tok_dense, lambda s: scale(s, e)])
                S = residual(S, [ch_dense, act, ch_dense, lambda s: scale(s, e)])
        A, TA = S[0], S[2]
        K = [[mp.fsum(A[a * Tk + t][b * Tk + s] for t in range(Tk) for s in range(Tk)) / Tk**2 for b in range(n)]
             for a in range(n)]
        Th = [[mp.fsum(TA[a * Tk + t][b * Tk + s] for t in range(Tk) for s in range(Tk)) / Tk**2 for b in range(n)]
              for a in range(n)]
        return K, Th
