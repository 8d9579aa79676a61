"""Bit operations on packed Pauli words (the Pauli algebra, vectorised in JAX).

A word on n qubits is two arrays of W = ceil(n/32) uint32 lanes, x and z; qubit q is bit q % 32 of
lane q // 32. The word (x, z) denotes the Hermitian Pauli prod_q i^(x_q z_q) X^x_q Z^z_q, so
(1, 1) is Y and real coefficients stay real. uint32 lanes work with and without jax_enable_x64 and
are the GPU's native integer width.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..runtime.prefix import on_cpu

LANE_BITS = 32
LABEL_TO_BITS = {"I": (0, 0), "X": (1, 0), "Y": (1, 1), "Z": (0, 1)}
BITS_TO_LABEL = {(0, 0): "I", (1, 0): "X", (1, 1): "Y", (0, 1): "Z"}


def num_lanes(num_qubits: int) -> int:
    return (num_qubits + LANE_BITS - 1) // LANE_BITS


# ---- host-side packing -------------------------------------------------------------------------

def pack(paulis: list[dict[int, str]], num_qubits: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack words given as {qubit: 'X'|'Y'|'Z'} maps into (x, z) uint32 arrays of shape (T, W)."""
    w = num_lanes(num_qubits)
    x = np.zeros((len(paulis), w), dtype=np.uint32)
    z = np.zeros((len(paulis), w), dtype=np.uint32)
    # the sites in lists, the bits set at once (a numpy item update a site cost 100,000 rotations 0.5 s)
    rows, qubits, has_x, has_z = [], [], [], []
    for t, word in enumerate(paulis):
        for q, ch in word.items():
            bx, bz = LABEL_TO_BITS[ch]
            rows.append(t)
            qubits.append(q)
            has_x.append(bx)
            has_z.append(bz)
    if rows:
        rows, qubits = np.asarray(rows, np.int64), np.asarray(qubits, np.int64)
        lane, bit = qubits // LANE_BITS, np.left_shift(np.uint32(1), (qubits % LANE_BITS).astype(np.uint32))
        for out, has in ((x, np.asarray(has_x, bool)), (z, np.asarray(has_z, bool))):
            np.bitwise_or.at(out, (rows[has], lane[has]), bit[has])  # unbuffered: sites of one lane add up
    return x, z


def unpack_bits(words: np.ndarray, num_qubits: int) -> np.ndarray:
    """(T, W) uint32 lanes -> (T, n) 0/1 array, qubit q in column q."""
    words = np.asarray(words, dtype=np.uint32)
    bits = (words[:, :, None] >> np.arange(LANE_BITS, dtype=np.uint32)) & 1
    return bits.reshape(words.shape[0], words.shape[1] * LANE_BITS)[:, :num_qubits].astype(np.uint8)


def moved(words: np.ndarray, source, target, num_lanes_out: int, rows: int = 1 << 12) -> np.ndarray:
    """(T, num_lanes_out) lanes holding each word's qubit source[k] as qubit target[k], nothing else (target
    increasing): a word renumbered onto a subset of the qubits or back. `rows` words at a time (T x K bits)."""
    words = np.asarray(words, np.uint32)
    source, target = np.asarray(source, np.int64), np.asarray(target, np.int64)
    out = np.zeros((len(words), num_lanes_out), np.uint32)
    if not len(source) or not len(words):
        return out
    lane = target // LANE_BITS
    starts = np.flatnonzero(np.r_[True, lane[1:] != lane[:-1]])
    src_lane, src_bit = source // LANE_BITS, (source % LANE_BITS).astype(np.uint64)
    dst_bit = (target % LANE_BITS).astype(np.uint64)
    for r in range(0, len(words), rows):
        bits = (words[r:r + rows, src_lane].astype(np.uint64) >> src_bit) & 1  # (rows, K)
        out[r:r + rows, lane[starts]] = np.add.reduceat(bits << dst_bit, starts, axis=1).astype(np.uint32)
    return out


def labels_of(x: np.ndarray, z: np.ndarray, num_qubits: int) -> list[str]:
    """Stim-order labels (character q acts on qubit q) of packed words."""
    xb, zb = unpack_bits(x, num_qubits), unpack_bits(z, num_qubits)
    table = np.array(["I", "X", "Z", "Y"])
    return ["".join(row) for row in table[xb + 2 * zb]]


# ---- vectorised algebra (jax) --------------------------------------------------------------------

def popcount(a):
    return jax.lax.population_count(a).astype(jnp.int32)


def weight(x, z):
    """Number of non-identity sites of each word: (T, W) -> (T,) int32 (a plain sum widens to int64
    under x64: twice the bytes a word wherever XLA keeps it)."""
    return popcount(x | z).sum(axis=-1, dtype=jnp.int32)


def xor_lanes(a):
    """The XOR of the lanes of packed words (..., W) -> (...,). GPUs: elementwise code, which XLA fuses
    into what consumes it (a reduction over the lanes is a kernel of its own whose output XLA:GPU
    keeps: the layer's (C, 128) anticommutation test took 512 bytes a slot on an H100). CPUs: the
    reduction (XLA:CPU ran the elementwise XOR of 32 lanes 2x slower: 0.16 against 0.075 ms for
    2^14 words of 1,024 qubits, one core; as fast for 4 lanes)."""
    if on_cpu():
        return jax.lax.reduce(a, jnp.zeros((), a.dtype), jax.lax.bitwise_xor, (a.ndim - 1,))
    return functools.reduce(jnp.bitwise_xor, [a[..., lane] for lane in range(a.shape[-1])])


def anticommutes(x, z, gx, gz):
    """True where word (x, z) anticommutes with the word (gx, gz) (broadcast over leading axes)."""
    # the parity of all lanes' bits: fold the lanes first, one popcount
    return (popcount(xor_lanes((x & gz) ^ (z & gx))) & 1).astype(bool)


def product_sign(x, z, gx, gz):
    """Real sign s with i G P = s R for anticommuting G = (gx, gz), P = (x, z), R = G xor P.

    With P = i^(x.z) X^x Z^z (Hermitian convention), G P = i^e R where
    e = |g_x & g_z| + |x & z| - |r_x & r_z| + 2 |g_z & x|  (mod 4); e is odd when G and P anticommute,
    so i G P = i^(e+1) R = (-1)^((e+1)/2) R.
    """
    rx, rz = x ^ gx, z ^ gz
    # one int32 sum over the lanes of the four counts, not four sums that x64 widens to int64 (with the
    # weight's int32 sum: layers' program at 2^20 slots on an H100 from 209 to 180 bytes a slot)
    e = (popcount(gx & gz) + popcount(x & z) - popcount(rx & rz) + 2 * popcount(gz & x)).sum(-1, dtype=jnp.int32)
    return jnp.where(((e + 1) & 3) == 0, 1.0, -1.0)


def nth_set_bit(rows, j):
    """(index, found): the position of the j-th (from 0) set bit of each row of packed bits (R, W)
    uint32, and whether the row has that many."""
    counts = popcount(rows)
    lane, before, upto = (jnp.zeros(rows.shape[0], jnp.int32),) * 3
    for l in range(1, rows.shape[1]):  # the lane holding it: the last whose earlier lanes hold <= j
        upto = upto + counts[:, l - 1]
        past = upto <= j
        lane, before = jnp.where(past, l, lane), jnp.where(past, upto, before)
    rank = j - before
    word = jnp.take_along_axis(rows, lane[:, None], axis=1)[:, 0]
    pos = jnp.zeros_like(rank)
    for width in (16, 8, 4, 2, 1):  # the rank-th set bit of the lane's word
        low = popcount(word & jnp.uint32((1 << width) - 1))
        up = rank >= low
        rank, word, pos = jnp.where(up, rank - low, rank), jnp.where(up, word >> width, word), pos + up * width
    return lane * LANE_BITS + pos, jnp.sum(counts, axis=1, dtype=jnp.int32) > j


def get_site(words, q):
    """Bit of qubit q (a traced int) in every word: (T, W) -> (T,) uint32."""
    lane = jax.lax.dynamic_index_in_dim(words, q // LANE_BITS, axis=-1, keepdims=False)
    return (lane >> (q % LANE_BITS).astype(jnp.uint32)) & jnp.uint32(1)


def set_site(words, q, bit):
    """Words with qubit q's bit replaced by `bit` (T,) uint32."""
    li = q // LANE_BITS
    sh = (q % LANE_BITS).astype(jnp.uint32)
    lane = jax.lax.dynamic_index_in_dim(words, li, axis=-1, keepdims=False)
    lane = (lane & ~(jnp.uint32(1) << sh)) | (bit << sh)
    return jax.lax.dynamic_update_index_in_dim(words, lane, li, axis=-1)


# ---- fingerprints for merging --------------------------------------------------------------------

def mix32(h):
    """murmur3's 32-bit finaliser: a bijection with good avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def fingerprint(x, z):
    """Two independent 32-bit hashes (h1, h2) of each word, for sorting equal words together."""
    h1 = jnp.full(x.shape[:-1], 0x9E3779B9, dtype=jnp.uint32)
    h2 = jnp.full(x.shape[:-1], 0x7F4A7C15, dtype=jnp.uint32)
    for lane in range(x.shape[-1]):
        h1 = mix32(h1 ^ x[..., lane]) + jnp.uint32(0x632BE5AB)
        h1 = mix32(h1 ^ z[..., lane])
        h2 = mix32(h2 + x[..., lane] * jnp.uint32(0x27D4EB2F)) ^ jnp.uint32(0x165667B1)
        h2 = mix32(h2 + z[..., lane] * jnp.uint32(0x9E3779B1))
    return h1, h2
