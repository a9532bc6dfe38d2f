"""Where the time of the counter-based normals goes, and what a vectorised Box-Muller would save.

Times, per 250,000 float32 numbers (process CPU time, one thread, best of
repeats, 10 initialisations x 250,500 numbers as in the Fig. 2 workload):

* ``words``: the Philox4x32-10 words of the blocks alone (torch/_philox.py);
* ``+ fast path``: every position converted as if accepted by the ziggurat;
* ``+ scan``: the scan for the rejected positions (no slow-path draws);
* ``ziggurat``: the package's kernel (``_fill_serial``), slow path included;
* ``box-muller32``: a prototype (not used by the package): the same words,
  then a float32 Box-Muller transform with polynomial log and sin/cos
  (cephes' logf / sinf / cosf coefficients, exponent and mantissa by bit
  casts) that LLVM vectorises (8 lanes of AVX2), written to the same output;
* ``transform only``: that transform on one block held in the L1 cache.

The prototype's output is normal to sampling accuracy (moments and a KS test
are printed) but it is not the package's stream, and its accuracy was not
worked to float32 rounding. It bounds what a different exact transform could
gain on this CPU: see benchmarks/README.md, section mc_throughput.

    python benchmarks/normals_parts.py [--repeat 10]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

try:
    import meanfield  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from meanfield.torch._philox import _KN, _U, _WN, BLOCK, _block_words, _fill_serial, key_for


@njit(cache=True)
def _words(out, k0, k1, inits, stream, stage):
    """Stages of the ziggurat kernel: 0 words, 1 + fast path, 2 + scan (rejections counted, not redrawn)."""
    n_init, n = out.shape
    nb = (n + BLOCK - 1) // BLOCK
    wn, kn = _WN, _KN
    cnt = 0
    for t in range(n_init * nb):
        i, b = t // nb, t % nb
        buf = np.empty(BLOCK, np.uint32)
        _block_words(buf, _U(b), _U(stream), _U(inits[i]), _U(k0), _U(k1))
        j0 = b * BLOCK
        m = min(n, j0 + BLOCK) - j0
        o = out[i, j0:j0 + m]
        if stage == 0:
            o[0] = buf[m - 1]
            continue
        for k in range(m):
            u = buf[k]
            o[k] = (np.int32(u) >> 7) * wn[u & np.uint32(127)]
        if stage == 2:
            for k in range(m):
                u = buf[k]
                if abs(np.int64(np.int32(u) >> 7)) >= kn[u & np.uint32(127)]:
                    cnt += 1
    return cnt


@intrinsic
def _f2i(typingctx, x):
    if x != types.float32:
        return None
    return types.int32(types.float32), lambda ctx, b, sig, a: b.bitcast(a[0], ir.IntType(32))


@intrinsic
def _i2f(typingctx, x):
    if x != types.int32:
        return None
    return types.float32(types.int32), lambda ctx, b, sig, a: b.bitcast(a[0], ir.FloatType())


F = np.float32
_L = [F(c) for c in (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
                     -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)]  # cephes logf
L0, L1, L2, L3, L4, L5, L6, L7, L8 = _L
C1, C2, SQRTH = F(-2.12194440e-4), F(0.693359375), F(0.70710678118654752440)
S0, S1, S2 = F(-1.9515295891e-4), F(8.3321608736e-3), F(-1.6666654611e-1)      # cephes sinf
K0, K1, K2 = F(2.443315711809948e-5), F(-1.388731625493765e-3), F(4.166664568298827e-2)  # cephes cosf
TWOPI_32, INV32, HALF, ONE, TWO = F(2 * math.pi / 2**32), F(2.0**-32), F(0.5), F(1.0), F(2.0)
_FM = {"contract"}


@njit(inline="always", error_model="numpy", fastmath=_FM)
def _neg2log(u):
    """-2 ln(u), u in (0, 1], float32."""
    bits = _f2i(u)
    e = (bits >> np.int32(23)) - np.int32(126)
    m = _i2f(np.int32((bits & np.int32(0x7FFFFF)) | np.int32(0x3F000000)))  # in [0.5, 1)
    small = m < SQRTH
    e = e - np.int32(1) if small else e
    x = (m + m - ONE) if small else (m - ONE)
    z = x * x
    y = ((((((((L0 * x + L1) * x + L2) * x + L3) * x + L4) * x + L5) * x + L6) * x + L7) * x + L8) * x * z
    fe = F(e)
    r = x + (y + C1 * fe - HALF * z) + C2 * fe
    return -TWO * r


@njit(error_model="numpy", fastmath=_FM, cache=True)
def _transform(buf, out):
    """Box-Muller on pairs (buf[j], buf[H + j]) -> (out[j], out[H + j]): radius from the first word, angle from the
    second (quadrant from its top bits, the rest a centred angle in [-pi/4, pi/4])."""
    H = buf.size // 2
    for j in range(H):
        w0, w1 = buf[j], buf[H + j]
        r = math.sqrt(_neg2log((F(w0) + HALF) * INV32))
        k = ((w1 + np.uint32(1 << 29)) >> np.uint32(30)) & np.uint32(3)
        psi = F(np.int32(w1 - (k << np.uint32(30)))) * TWOPI_32
        z = psi * psi
        s = ((S0 * z + S1) * z + S2) * z * psi + psi
        c = ((K0 * z + K1) * z + K2) * z * z - HALF * z + ONE
        odd = k & np.uint32(1)
        a = s if odd else c
        bb = c if odd else s
        out[j] = r * a * (ONE - TWO * F(((k + np.uint32(1)) >> np.uint32(1)) & np.uint32(1)))
        out[H + j] = r * bb * (ONE - TWO * F((k >> np.uint32(1)) & np.uint32(1)))


@njit(cache=True)
def _box_muller(out, k0, k1, inits, stream):
    n_init, n = out.shape
    nb = (n + BLOCK - 1) // BLOCK
    for t in range(n_init * nb):
        i, b = t // nb, t % nb
        buf = np.empty(BLOCK, np.uint32)
        tmp = np.empty(BLOCK, np.float32)
        _block_words(buf, _U(b), _U(stream), _U(inits[i]), _U(k0), _U(k1))
        _transform(buf, tmp)
        j0 = b * BLOCK
        m = min(n, j0 + BLOCK) - j0
        out[i, j0:j0 + m] = tmp[:m]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args(argv)
    I, n = 10, 250_500
    out = np.empty((I, n), np.float32)
    ids = np.arange(I, dtype=np.uint32)
    k0, k1 = (np.uint32(k) for k in key_for(0))
    args = (out, k0, k1, ids, np.uint32(7))
    buf = np.random.default_rng(0).integers(0, 2**32, BLOCK, dtype=np.uint64).astype(np.uint32)
    tmp = np.empty(BLOCK, np.float32)
    blocks = n * I // BLOCK

    def transform_only():
        for _ in range(blocks):
            _transform(buf, tmp)

    cases = {"words": lambda: _words(*args, 0), "+ fast path": lambda: _words(*args, 1),
             "+ scan": lambda: _words(*args, 2), "ziggurat": lambda: _fill_serial(*args),
             "box-muller32": lambda: _box_muller(*args), "transform only": transform_only}
    for f in cases.values():
        f()
    _box_muller(*args)
    x = out.ravel().astype(np.float64)
    from scipy import stats

    print(f"box-muller32 sample of {x.size}: mean {x.mean():.2e}, var - 1 {x.var() - 1:.2e}, "
          f"skew {np.mean(x**3):.2e}, kurtosis - 3 {np.mean(x**4) - 3:.2e}, "
          f"KS p {stats.kstest(x[:10**6], 'norm').pvalue:.2f}, max |x| {np.abs(x).max():.2f}")
    print(f"rejected positions: {_words(*args, 2) / out.size:.4f} of all")
    load0 = os.getloadavg()[0]
    best = {}
    for k, f in cases.items():
        c = []
        for _ in range(a.repeat):
            c0 = time.process_time()
            f()
            c.append(time.process_time() - c0)
        best[k] = min(c) / I
    print("CPU ms per 250,500 float32 normals: " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in best.items())
          + f"; load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
