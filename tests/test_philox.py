"""Counter-based normals of the Monte-Carlo networks (torch/_philox.py).

References are independent of the kernel: Random123's published known-answer
vectors for Philox4x32-10, a pure-Python transcription of the documented
block definition (Marsaglia-Tsang's ziggurat tables recomputed here from the
paper's constants), distribution tests against N(0, 1), and whole
Monte-Carlo runs compared across chunkings.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import meanfield as mf  # noqa: E402
from meanfield.torch import _philox as ph  # noqa: E402

pytestmark = pytest.mark.torch

# Random123 kat_vectors (Salmon et al. 2011): philox4x32 10 <counter> <key> -> <output>
KAT = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
       ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
        (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_philox4x32_10_known_answers(ctr, key, expected):
    assert ph.philox4x32(ctr, key) == expected


def _philox_ref(ctr, key):
    """Philox4x32-10 in Python integers (Salmon et al. 2011, section 4)."""
    c, (k0, k1) = list(ctr), key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


def _tables():
    """Marsaglia & Tsang (2000), RNOR with 128 strips: k, w, f for a 25-bit signed abscissa."""
    m1, dn, vn = 2.0**24, 3.442619855899, 9.91256303526217e-3
    tn = dn
    k, w, f = [0.0] * 128, [0.0] * 128, [0.0] * 128
    q = vn / math.exp(-0.5 * dn * dn)
    k[0], w[0], w[127], f[0], f[127] = dn / q * m1, q / m1, dn / m1, 1.0, math.exp(-0.5 * dn * dn)
    for i in range(126, 0, -1):
        dn = math.sqrt(-2 * math.log(vn / dn + math.exp(-0.5 * dn * dn)))
        k[i + 1], tn, f[i], w[i] = dn / tn * m1, dn, math.exp(-0.5 * dn * dn), dn / m1
    return k, w, f


def _block_ref(seed, init, stream, block, n):
    """The first n outputs of block ``block`` of stream (init, stream), from the module's documented definition."""
    key = tuple(int(v) for v in np.random.SeedSequence(seed).generate_state(2, np.uint32))
    words = [_philox_ref((c, block, stream, init), key) for c in range(1024)]
    k, w, f = _tables()
    extra = []

    def more():
        if not extra:
            more.count += 1
            extra.extend(_philox_ref((2**31 + more.count - 1, block, stream, init), key))
        return extra.pop(0)
    more.count = 0

    out = []
    for pos in range(n):
        u = words[pos % 1024][pos // 1024]
        while True:
            iz, hz = u & 127, (u - (1 << 32) if u >= 1 << 31 else u) >> 7
            x = hz * w[iz]
            if abs(hz) < k[iz]:
                break
            if iz == 0:
                r = 3.442619855899
                while True:
                    xx = -math.log((more() + 0.5) / 2**32) / r
                    yy = -math.log((more() + 0.5) / 2**32)
                    if yy + yy >= xx * xx:
                        break
                x = r + xx if hz > 0 else -r - xx
                break
            if f[iz] + (more() + 0.5) / 2**32 * (f[iz - 1] - f[iz]) < math.exp(-0.5 * x * x):
                break
            u = more()
        out.append(x)
    return np.array(out)


@pytest.mark.slow
@pytest.mark.parametrize("seed,init,stream", [(0, 0, 0), (7, 3, 2**31 + 5), (2**40 + 1, 12345, 17)])
def test_blocks_follow_the_documented_definition(seed, init, stream):
    n = 2 * ph.BLOCK + 100  # two whole blocks and a partial one
    x = ph.standard_normal(seed, [init], stream, n)[0]
    for b in range(3):
        m = min(ph.BLOCK, n - b * ph.BLOCK)
        np.testing.assert_array_equal(x[b * ph.BLOCK:b * ph.BLOCK + m], _block_ref(seed, init, stream, b, m))


@pytest.mark.slow
def test_float32_is_the_float64_stream_rounded():
    a = ph.standard_normal(5, [0, 1], 3, (100, 77), np.float64)
    b = ph.standard_normal(5, [0, 1], 3, (100, 77), np.float32)
    np.testing.assert_array_equal(a.astype(np.float32), b)


@pytest.mark.slow
def test_streams_are_standard_normal():
    """4 M draws: first four moments within 5 standard errors, and a KS test."""
    from scipy import stats

    x = ph.standard_normal(11, np.arange(8), 4, 500_000).ravel()
    n = x.size
    for p, mom, var in ((1, 0.0, 1.0), (2, 1.0, 2.0), (3, 0.0, 15.0), (4, 3.0, 96.0)):
        assert abs(np.mean(x**p) - mom) < 5 * math.sqrt(var / n), p
    assert stats.kstest(x[:1_000_000], "norm").pvalue > 1e-4
    # the tail beyond r = 3.44 (the ziggurat's base strip) has the normal mass
    tail = np.mean(np.abs(x) > 3.442619855899)
    p_tail = math.erfc(3.442619855899 / math.sqrt(2))
    assert abs(tail - p_tail) < 5 * math.sqrt(p_tail / n)
    # different initialisations and streams are uncorrelated
    y = ph.standard_normal(11, np.arange(8), 5, 500_000).ravel()
    assert abs(np.mean(x * y)) < 5 / math.sqrt(n)
    assert abs(np.mean(x[:-500_000] * x[500_000:])) < 5 / math.sqrt(n - 500_000)


@pytest.mark.slow
def test_rows_depend_only_on_seed_and_init():
    whole = ph.standard_normal(3, np.arange(6), 9, (40, 130))
    for chunk in ([0, 1], [2], [3, 4, 5]):
        np.testing.assert_array_equal(ph.standard_normal(3, chunk, 9, (40, 130)), whole[chunk])
    assert not np.array_equal(ph.standard_normal(4, [0], 9, (40, 130))[0], whole[0])


@pytest.mark.slow
def test_monte_carlo_does_not_depend_on_the_chunking():
    from meanfield.verification import monte_carlo, phase_diagram

    arch = mf.Architecture("erf", norm="ln_pre", mu=0.5)
    runs = [monte_carlo(arch, 1.3, 0.2, depth=4, width=32, n_init=5, seed=3, init_chunk=c) for c in (None, 1, 2)]
    for r in runs[1:]:
        for k in ("K", "K12", "chi_J", "J"):
            np.testing.assert_array_equal(r.samples[k], runs[0].samples[k])
    pds = [phase_diagram(arch, [1.0, 1.5], [0.1, 0.3], depth=4, width=32, n_init=5, seed=3, init_chunk=c)
           for c in (None, 2)]
    np.testing.assert_array_equal(pds[0].chi_J, pds[1].chi_J)
    # the same networks in both: phase_diagram's K at its layer is monte_carlo's K there
    r = monte_carlo(arch, 1.5, 0.3, depth=4, width=32, n_init=5, seed=3)
    assert pds[0].K[1, 1] == pytest.approx(r.K[pds[0].layer - 1], rel=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="stream"):
        ph.standard_normal(0, [0], -1, 3)
    with pytest.raises(ValueError, match="inits"):
        ph.standard_normal(0, [-1], 0, 3)
    with pytest.raises(ValueError, match="float32 or float64"):
        ph.fill_normal(np.empty((1, 3), np.int32), 0, [0], 0)


@pytest.mark.slow
def test_threaded_and_serial_kernels_agree():
    """Small draws use the one-thread kernel, large ones the threaded one: the numbers are the same."""
    inits = np.arange(3, dtype=np.uint32)
    a, b = np.empty((3, 3 * ph.BLOCK + 7)), np.empty((3, 3 * ph.BLOCK + 7))
    ph._fill(a, 1, 2, inits, 5)
    ph._fill_serial(b, 1, 2, inits, 5)
    np.testing.assert_array_equal(a, b)
