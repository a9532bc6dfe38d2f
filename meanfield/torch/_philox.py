r"""Counter-based standard normals for the Monte-Carlo networks: Philox4x32-10 + ziggurat, batched over initialisations.

Why counter-based. Every random number of a Monte-Carlo run is a pure
function of ``(seed, init, stream, j)``: the seed of the run, the index of the
initialisation, which tensor is drawn (``stream``: the n-th weight draw of a
pass, or a probe) and the position ``j`` in that tensor. So one call fills the
weights of all the initialisations of a chunk at once (in parallel over
initialisations and blocks), and the numbers do not depend on how the
initialisations are chunked or sharded (``init_chunk``, Dask shards): shard
``i0 .. i1`` asks for inits ``i0 .. i1`` and gets exactly the rows the
single-process run has there.

Definition (this is the contract the tests check):

* key ``(k0, k1)``: the two 32-bit words of
  ``numpy.random.SeedSequence(seed).generate_state(2, numpy.uint32)``.
* The stream ``(init, stream)`` is cut into blocks of ``BLOCK = 4096``
  outputs; element ``j`` of a draw of shape ``shape`` is element ``j`` of the
  C-ordered stream, in block ``b = j // BLOCK`` at position ``k = j % BLOCK``.
* Block ``b`` draws its words from Philox4x32-10 (Salmon et al., "Parallel
  random numbers: as easy as 1, 2, 3", SC'11) with key ``(k0, k1)`` and
  counter ``(c0, b, stream, init)``: position ``k`` takes word ``k // 1024`` of
  counter ``c0 = k % 1024``; extra words needed by rejections (below) are the
  words of counters ``c0 = 2^31, 2^31 + 1, ...`` of the same block, in order.
* Position ``k`` is one ziggurat draw (Marsaglia and Tsang, "The ziggurat
  method for generating random variables", J. Stat. Softw. 5(8), 2000; 128
  strips, r = 3.442619855899) from its 32-bit word u: strip ``iz = u & 127``
  and a signed 25-bit ``hz = int32(u) >> 7`` (independent bits for the strip
  and the abscissa, the fix of Doornik 2005 for the original's correlation),
  ``x = hz * w[iz]`` accepted when ``|hz| < k[iz]``. Otherwise the wedge or
  tail test runs with the block's extra words, and a failed trial restarts
  from a fresh extra word; trials are independent, so every position is an
  exact N(0, 1) draw, independent of every other position.

Resolution: the abscissa has 24 bits per strip (x is a multiple of
``w[iz] ~ 2e-7 |x_iz| / 3.4``), computed in float64 and stored in the output
dtype; a float32 run sees the float64 run's numbers rounded to float32.

Speed (this CPU, one core, per 250,000 numbers, float32; ``benchmarks/normals_parts.py``):
the Philox words 0.15 ms, the ziggurat's fast path 0.10 ms, a scan that only
counts the 2.75 % rejected positions 0.09 ms, and the kernel as a whole
0.80-0.85 ms (~300 M normals per CPU-second; torch's own ``randn`` is about
250 M/s): the branch to the slow path and the slow path itself (an extra
Philox counter, an ``exp`` per wedge test) cost ~0.5 ms. The table lookups
(``w[iz]``, ``k[iz]``) keep the loops scalar: LLVM does not use AVX2 gathers
on this CPU (znver3), and forcing them (a Skylake target) was slower. Tried
with the same numbers and no gain (0.82-1.15 ms): listing the rejected
positions branch-free, byte flags scanned 8 at a time, the block's first 32
extra counters computed in one vectorised loop, an int32 ``k`` table,
counting the rejections per 8 positions before branching. A vectorised
float32 Box-Muller (polynomial log, sin, cos; a prototype in the benchmark,
not this module's stream) takes ~0.5 ms for the same words. With a
(sigma_w, sigma_b) grid of P points and one input, a layer does 2 P N^2
flops per N^2 normals, so for P = 400 the generator is ~25 % of a pass's CPU
time (benchmarks/mc_throughput.py prints the split). torch's OpenMP workers
spin-wait between parallel regions: on a machine whose cores are shared, set
``OMP_WAIT_POLICY=PASSIVE`` before torch is imported (it halved the CPU time
of the Fig. 2 workload with 2 torch threads here).

Checked in ``tests/test_philox.py``: Random123's known-answer vectors for
Philox4x32-10, a pure-Python reference of the block definition above, the
first four moments and a Kolmogorov-Smirnov test against N(0, 1), and
invariance under chunking of the initialisations.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .._cache import install_locator
from ._threads import run_threaded

install_locator()  # numba's cache of these kernels goes to meanfield's cache folder, never the package

__all__ = ["BLOCK", "key_for", "philox4x32", "fill_normal", "standard_normal"]

BLOCK = 4096                 # outputs per block (part of the definition of the streams)
_WORDS = BLOCK // 4          # Philox counters per block
_SPARE = 1 << 31             # counters of the extra words of a block start here
_U = np.uint64
_M0, _M1 = _U(0xD2511F53), _U(0xCD9E8D57)        # Philox4x32 multipliers
_W0, _W1 = _U(0x9E3779B9), _U(0xBB67AE85)        # Weyl key increments
_MASK, _S32 = _U(0xFFFFFFFF), _U(32)
_INV32 = 2.3283064365386963e-10                   # 2^-32


def _ziggurat_tables():
    """Marsaglia-Tsang 128-strip tables, abscissas scaled to a 25-bit signed hz (2^24 = strip edge)."""
    m1 = 2.0**24
    dn = tn = 3.442619855899
    vn = 9.91256303526217e-3
    kn, wn, fn = np.zeros(128), np.zeros(128), np.zeros(128)
    q = vn / math.exp(-0.5 * dn * dn)
    kn[0], kn[1] = (dn / q) * m1, 0.0
    wn[0], wn[127] = q / m1, dn / m1
    fn[0], fn[127] = 1.0, math.exp(-0.5 * dn * dn)
    for i in range(126, 0, -1):
        dn = math.sqrt(-2.0 * math.log(vn / dn + math.exp(-0.5 * dn * dn)))
        kn[i + 1] = (dn / tn) * m1
        tn = dn
        fn[i] = math.exp(-0.5 * dn * dn)
        wn[i] = dn / m1
    # |hz| < kn  <=>  |hz| < ceil(kn) for integer hz (kn is never an integer but kn[1] = 0)
    return np.ceil(kn).astype(np.int64), wn, fn


_KN, _WN, _FN = _ziggurat_tables()
_R = 3.442619855899


@njit(inline="always", cache=True)
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1); uint64 carriers of 32-bit words."""
    for _ in range(10):
        p0 = c0 * _M0
        p1 = c2 * _M1
        n0 = (p1 >> _S32) ^ c1 ^ k0
        n2 = (p0 >> _S32) ^ c3 ^ k1
        c1 = p1 & _MASK
        c3 = p0 & _MASK
        c0 = n0
        c2 = n2
        k0 = (k0 + _W0) & _MASK
        k1 = (k1 + _W1) & _MASK
    return c0, c1, c2, c3


@njit(cache=True)
def _philox_one(c0, c1, c2, c3, k0, k1):
    return _philox(_U(c0), _U(c1), _U(c2), _U(c3), _U(k0), _U(k1))


def philox4x32(counter, key) -> tuple:
    """Philox4x32-10 of one counter (4 words) under a key (2 words): the 4 output words as ints."""
    return tuple(int(w) for w in _philox_one(*[int(c) & 0xFFFFFFFF for c in counter],
                                             *[int(k) & 0xFFFFFFFF for k in key]))


@njit(inline="always", cache=True)
def _block_words(buf, c1, c2, c3, k0, k1):
    """The block's main words: buf[r * _WORDS + c] = word r of counter (c, c1, c2, c3)."""
    for c in range(_WORDS):
        w0, w1, w2, w3 = _philox(_U(c), c1, c2, c3, k0, k1)
        buf[c] = np.uint32(w0)
        buf[_WORDS + c] = np.uint32(w1)
        buf[2 * _WORDS + c] = np.uint32(w2)
        buf[3 * _WORDS + c] = np.uint32(w3)


@njit(inline="always", cache=True)
def _extra_word(s, c1, c2, c3, k0, k1):
    """Extra word number s of the block: word s % 4 of counter (2^31 + s // 4, c1, c2, c3)."""
    w = _philox(_U(_SPARE + s // 4), c1, c2, c3, k0, k1)
    r = s % 4
    return np.uint32(w[0] if r == 0 else (w[1] if r == 1 else (w[2] if r == 2 else w[3])))


@njit(cache=True)
def _rejected(u, s, c1, c2, c3, k0, k1, kn, wn, fn):
    """The ziggurat's slow path for a first word u outside its strip's rectangle: (x, extra words used)."""
    iz = np.int64(u & np.uint32(127))
    hz = np.int64(np.int32(u) >> 7)
    while True:
        x = hz * wn[iz]
        if iz == 0:  # the tail beyond r (Marsaglia 1964)
            while True:
                xx = -math.log((_extra_word(s, c1, c2, c3, k0, k1) + 0.5) * _INV32) / _R
                yy = -math.log((_extra_word(s + 1, c1, c2, c3, k0, k1) + 0.5) * _INV32)
                s += 2
                if yy + yy >= xx * xx:
                    break
            return (_R + xx if hz > 0 else -_R - xx), s
        ua = _extra_word(s, c1, c2, c3, k0, k1)
        s += 1
        if fn[iz] + (ua + 0.5) * _INV32 * (fn[iz - 1] - fn[iz]) < math.exp(-0.5 * x * x):
            return x, s
        u = _extra_word(s, c1, c2, c3, k0, k1)  # a fresh trial
        s += 1
        iz = np.int64(u & np.uint32(127))
        hz = np.int64(np.int32(u) >> 7)
        if abs(hz) < kn[iz]:
            return hz * wn[iz], s


def _fill_py(out, k0, k1, inits, stream):
    """out[i, :] = stream (inits[i], stream) under key (k0, k1); parallel over (initialisation, block)."""
    n_init, n = out.shape
    nb = (n + BLOCK - 1) // BLOCK
    kn, wn, fn = _KN, _WN, _FN
    K0, K1, c2 = _U(k0), _U(k1), _U(stream)
    for t in prange(n_init * nb):
        i = t // nb
        b = t % nb
        c3, c1 = _U(inits[i]), _U(b)
        buf = np.empty(BLOCK, np.uint32)
        _block_words(buf, c1, c2, c3, K0, K1)
        j0 = b * BLOCK
        m = min(n, j0 + BLOCK) - j0
        o = out[i, j0:j0 + m]
        for k in range(m):  # every position as if accepted (vectorisable) ...
            u = buf[k]
            o[k] = (np.int32(u) >> 7) * wn[u & np.uint32(127)]
        s = 0
        for k in range(m):  # ... then the ~1.2 % rejected ones redone, in order
            u = buf[k]
            if abs(np.int64(np.int32(u) >> 7)) >= kn[u & np.uint32(127)]:
                x, s = _rejected(u, s, c1, c2, c3, K0, K1, kn, wn, fn)
                o[k] = x


# the same kernel twice: threads for large draws; one thread for small ones, where waking numba's
# threads next to torch's spinning OpenMP threads costs more than the draw (identical numbers either way:
# every block is computed on its own)
_fill = njit(parallel=True, cache=True, nogil=True)(_fill_py)
_fill_serial = njit(cache=True, nogil=True)(_fill_py)
_PARALLEL_MIN = 1 << 21      # numbers per call from which the threaded kernel is used


def key_for(seed: int) -> tuple[int, int]:
    """The Philox key (k0, k1) of a run's seed."""
    k = np.random.SeedSequence(int(seed)).generate_state(2, np.uint32)
    return int(k[0]), int(k[1])


def fill_normal(out: np.ndarray, seed: int, inits, stream: int) -> np.ndarray:
    """Fill ``out`` (shape (I, n), float32 or float64, C-contiguous) with streams (inits[i], stream) of ``seed``."""
    inits = np.ascontiguousarray(inits, dtype=np.uint32)
    if out.ndim != 2 or out.shape[0] != inits.size or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous (len(inits), n) array, got shape {out.shape}")
    if out.dtype not in (np.float32, np.float64):
        raise ValueError(f"out must be float32 or float64, got {out.dtype}")
    if not 0 <= int(stream) < 2**32:
        raise ValueError(f"stream must be in [0, 2^32), got {stream}")
    k0, k1 = key_for(seed)
    if out.size:
        args = (out, np.uint32(k0), np.uint32(k1), inits, np.uint32(stream))
        if out.size >= _PARALLEL_MIN:
            run_threaded(_fill, *args)
        else:
            _fill_serial(*args)
    return out


def standard_normal(seed: int, inits, stream: int, shape, dtype=np.float64) -> np.ndarray:
    """Array (len(inits), *shape) of N(0, 1): row i is stream (inits[i], stream) of ``seed`` in C order."""
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    inits = np.atleast_1d(np.asarray(inits, dtype=np.int64))
    if inits.size and (inits.min() < 0 or inits.max() >= 2**32):
        raise ValueError("inits must be in [0, 2^32)")
    out = np.empty((inits.size, int(np.prod(shape, dtype=np.int64))), dtype=dtype)
    fill_normal(out, seed, inits, stream)
    return out.reshape((inits.size,) + shape)
