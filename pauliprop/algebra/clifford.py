"""Clifford runs as symplectic maps on packed words: composed on the host, applied in one pass.

A Clifford U maps every Pauli word to one signed word: U^dag P U = +-P'. On packed words it is a
symplectic map, fixed by the images of the 2N generators X_0 .. X_{N-1}, Z_0 .. Z_{N-1} (N = 32 W,
the lanes' qubit slots; slots past the circuit's qubits map to themselves). A run of Clifford gates
is composed on the host (numpy) by pushing the 2N generators through its gates, and then costs one
pass over the words whatever its length (`apply_map`).

The sign of an image. With P = i^{|x & z|} X^x Z^z (the Hermitian convention of `words`) and v the
bits of P in generator order,

    U^dag P U = i^{|x & z|} prod_k (s_k h_k)^{v_k} = (-1)^{e/2} H(r),   r = xor_k v_k w_k,
    e = |x & z| + sum_k v_k (|Y(w_k)| + 2 b_k) + 2 sum_{j<k} v_j v_k <w_j.z, w_k.x> - |Y(r)|  (mod 4),

where h_k = H(w_k) is the Hermitian word of generator k's image, s_k = (-1)^{b_k} its sign, and
the pairwise term comes from multiplying the images in order (h_a h_b = i^{beta} h_{a xor b},
beta = |Y(a)| + |Y(b)| - |Y(a xor b)| + 2 <a.z, b.x>, summed along the product it telescopes).
`phase[k]` stores |Y(w_k)| + 2 b_k; the pairwise term is accumulated while the image is built.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import words

LANE = words.LANE_BITS


class CliffordMap(NamedTuple):
    """Images of the 2N generators (X_0..X_{N-1}, then Z_0..Z_{N-1}) with their phases."""

    image_x: np.ndarray  # (2N, W) uint32
    image_z: np.ndarray  # (2N, W) uint32
    phase: np.ndarray  # (2N,) int32: |Y(image)| + 2 * (image sign is -1), mod 4


def generators(num_lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """The 2N generator words (X_0..X_{N-1}, Z_0..Z_{N-1}) as (2N, W) x and z arrays."""
    n = LANE * num_lanes
    eye = np.zeros((n, num_lanes), np.uint32)
    eye[np.arange(n), np.arange(n) // LANE] = np.uint32(1) << (np.arange(n) % LANE).astype(np.uint32)
    zero = np.zeros_like(eye)
    return np.concatenate([eye, zero]), np.concatenate([zero, eye])


def popcount(a: np.ndarray) -> np.ndarray:
    """Set bits of each uint32 (numpy)."""
    a = a.astype(np.uint32)
    a = a - ((a >> 1) & np.uint32(0x55555555))
    a = (a & np.uint32(0x33333333)) + ((a >> 2) & np.uint32(0x33333333))
    a = (a + (a >> 4)) & np.uint32(0x0F0F0F0F)
    return ((a * np.uint32(0x01010101)) >> 24).astype(np.int64)


def ys(x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Number of Y sites of each word (numpy)."""
    return popcount(x & z).sum(-1)


def identity_map(num_lanes: int) -> CliffordMap:
    x, z = generators(num_lanes)
    return CliffordMap(x, z, np.zeros(2 * LANE * num_lanes, np.int32))


def map_from_images(x: np.ndarray, z: np.ndarray, sign: np.ndarray) -> CliffordMap:
    """The map whose generator k goes to sign[k] * (x[k], z[k])."""
    return CliffordMap(x.astype(np.uint32), z.astype(np.uint32),
                       ((ys(x, z) + np.where(np.asarray(sign) < 0, 2, 0)) % 4).astype(np.int32))


def apply_map_numpy(x: np.ndarray, z: np.ndarray, m: CliffordMap):
    """Reference application (numpy): (x', z', sign) for words (T, W); see the module docstring."""
    x, z = np.asarray(x, np.uint32), np.asarray(z, np.uint32)
    t, w = x.shape
    rx, rz = np.zeros_like(x), np.zeros_like(z)
    e = ys(x, z)
    bits = np.concatenate([words.unpack_bits(x, LANE * w), words.unpack_bits(z, LANE * w)], axis=1).astype(bool)
    for k in range(2 * LANE * w):
        v = bits[:, k]
        cross = popcount(rz & m.image_x[k]).sum(-1) & 1
        e = e + np.where(v, m.phase[k] + 2 * cross, 0)
        rx = np.where(v[:, None], rx ^ m.image_x[k], rx)
        rz = np.where(v[:, None], rz ^ m.image_z[k], rz)
    e = (e - ys(rx, rz)) % 4
    if np.any(e % 2):
        raise AssertionError("a Clifford map produced a non-Hermitian word: the map is not symplectic")
    return rx, rz, np.where(e == 0, 1.0, -1.0)


CHUNK = 8  # generator bits a table lookup of apply_map covers (a byte of the packed word)


def chunk_tables(image_x, image_z, phase):
    """The map's lookup tables: for each byte c of a packed word (x lanes, then z lanes) and each of its
    256 values b, the image of the generators set in b (XOR of their images) and its phase term:
    sum of their phases plus twice the parity of the crossings among them, in generator order.
    Built on the device from the images at each application: schedules store only the images (8 KB a
    map on 4 lanes; the tables are 36 times that). Returns (tx, tz, te): (8 W, 256, W) uint32 twice
    and (8 W, 256) int32."""
    two_n, w = image_x.shape
    chunks = two_n // CHUNK
    ix = image_x.reshape(chunks, CHUNK, w)
    iz = image_z.reshape(chunks, CHUNK, w)
    ph = phase.reshape(chunks, CHUNK)
    b = jnp.arange(256, dtype=jnp.uint32)
    v = ((b[:, None] >> jnp.arange(CHUNK, dtype=jnp.uint32)) & 1).astype(bool)  # (256, 8): bits of b
    xor_of = lambda img: lax.reduce(jnp.where(v[None, :, :, None], img[:, None], jnp.uint32(0)), jnp.uint32(0),
                                    lax.bitwise_xor, (2,))
    tx, tz = xor_of(ix), xor_of(iz)
    # crossing of generators j < k of one chunk: parity(iz_j & ix_k)
    cross = words.popcount(iz[:, :, None, :] & ix[:, None, :, :]).sum(-1) & 1  # (chunks, 8, 8)
    upper = jnp.triu(jnp.ones((CHUNK, CHUNK), bool), 1)
    both = v[:, :, None] & v[:, None, :] & upper  # (256, 8, 8): j < k, both set in b
    pairs = jnp.sum(jnp.where(both[None], cross[:, None], 0), axis=(2, 3))
    te = (jnp.sum(jnp.where(v[None], ph[:, None], 0), axis=-1) + 2 * pairs) & 3
    return tx, tz, te.astype(jnp.int32)


def fixes_z(image_x, image_z, phase):
    """Whether the map sends every Z generator to itself with phase 0, as `identity_map` does (jax)."""
    two_n, w = image_x.shape
    n = two_n // 2
    own = identity_map(w)
    return (jnp.all(image_x[n:] == own.image_x[n:]) & jnp.all(image_z[n:] == own.image_z[n:])
            & jnp.all(phase[n:] == own.phase[n:]))


def apply_map(x, z, image_x, image_z, phase, unroll: int = 1):
    """(x', z', sign) for packed words (C, W): one pass over the words (jax).

    A lax.fori_loop visits the word's 8 W bytes: each byte looks its part of the image up in
    `chunk_tables` (one gather of a 256-row table) instead of visiting its 8 generator bits one by
    one. The crossings between bytes enter as the parity of the image's Z bits so far against the
    byte's X image (the module docstring's pairwise term, which is linear in each factor). The
    program's size does not grow with the map or the number of qubits.
    unroll: bytes an iteration (GPUs: 8 or 32, propagate.map_unroll: XLA:GPU keeps every unrolled
    byte's looked-up rows at once). 1 (CPUs): the loop
    takes a byte an iteration, and a map that fixes every Z generator (a layer of CZ, S, RZZ(pi/2):
    diagonal Cliffords) stops after the X bytes: a Z byte then adds its own bits to the Z image
    and nothing to the X image or the phase. The kicked Ising's RZZ(-pi/2) layer at 2^17 words:
    9.8 ms against 18.5 (one core; unrolling 2-4 bytes an iteration ran as fast, 8 or 16 slower)."""
    w = x.shape[-1]
    inputs = jnp.concatenate([x, z], axis=-1)  # (C, 2W): lane l < W holds X bits, l >= W Z bits
    tx, tz, te = chunk_tables(image_x, image_z, phase)
    per_lane = LANE // CHUNK
    half = w * per_lane  # the X bytes come first

    def chunk(c, carry):
        rx, rz, e, cross = carry
        word = lax.dynamic_index_in_dim(inputs, c // per_lane, axis=-1, keepdims=False)
        b = ((word >> ((c % per_lane) * CHUNK).astype(jnp.uint32)) & jnp.uint32(0xFF)).astype(jnp.int32)
        ix, iz = tx[c][b], tz[c][b]
        # the crossings enter e as 2 * their count, so only its parity counts: the XOR of their bits,
        # folded over the lanes; one popcount after the loop. (A count summed over the lanes each byte
        # was a reduction a byte, whose output XLA:GPU kept per word for every unrolled byte.)
        return rx ^ ix, rz ^ iz, e + te[c][b], cross ^ words.xor_lanes(rz & ix)

    zero = jnp.zeros_like(x)
    start = (zero, zero, words.popcount(x & z).sum(-1, dtype=jnp.int32), jnp.zeros(x.shape[:-1], jnp.uint32))
    if unroll > 1:  # `unroll` bytes an iteration (GPUs), every byte
        rx, rz, e, cross = lax.fori_loop(0, 2 * half, chunk, start, unroll=min(unroll, 2 * half))
    else:  # a byte an iteration (the loop body compiles once), the Z bytes only where they move
        fixed = fixes_z(image_x, image_z, phase)
        rx, rz, e, cross = lax.fori_loop(0, jnp.where(fixed, half, 2 * half), chunk, start)
        rz = jnp.where(fixed, rz ^ z, rz)
    # int32 counts (a plain sum widens to int64 under x64: 8 bytes a word where XLA keeps it)
    e = (e + 2 * words.popcount(cross) - words.popcount(rx & rz).sum(-1, dtype=jnp.int32)) & 3
    return rx, rz, jnp.where(e == 0, 1, -1).astype(jnp.int32)


# ---- gates on words (numpy), used to compose maps and as the reference ------------------------------

def _site(words, q):
    return (words[:, q // LANE] >> np.uint32(q % LANE)) & np.uint32(1)


def _set_site(words, q, bit):
    lane, sh = q // LANE, np.uint32(q % LANE)
    words[:, lane] = (words[:, lane] & ~(np.uint32(1) << sh)) | (bit.astype(np.uint32) << sh)


def apply_table_numpy(x, z, a: int, b: int, table: np.ndarray, sign: np.ndarray):
    """A 1- or 2-qubit Clifford as a 16-entry table (program.clifford_table) on words (numpy)."""
    code = (_site(x, a) | _site(z, a) << 1 | _site(x, b) << 2 | _site(z, b) << 3).astype(np.int64)
    img = table[code].astype(np.uint32)
    x, z = x.copy(), z.copy()
    _set_site(x, a, img & 1)
    _set_site(z, a, (img >> 1) & 1)
    _set_site(x, b, (img >> 2) & 1)
    _set_site(z, b, (img >> 3) & 1)
    return x, z, np.asarray(sign)[code]


def product_sign_numpy(x, z, gx, gz):
    """Real sign s with i G P = s (P xor G) for anticommuting P, G (numpy; see words.product_sign)."""
    rx, rz = x ^ gx, z ^ gz
    e = (popcount(gx & gz).sum(-1) + popcount(x & z).sum(-1) - popcount(rx & rz).sum(-1)
         + 2 * popcount(gz & x).sum(-1))
    return np.where(((e + 1) & 3) == 0, 1.0, -1.0)


def anticommutes_numpy(x, z, gx, gz):
    return (popcount((x & gz) ^ (z & gx)).sum(-1) & 1).astype(bool)


def apply_quarter_numpy(x, z, gx, gz, k: int):
    """exp(-i k pi/4 G) conjugation (a rotation by k pi/2) on words (numpy)."""
    k %= 4
    ac = anticommutes_numpy(x, z, gx, gz)
    if k == 0:
        return x, z, np.ones(len(x))
    if k == 2:
        return x, z, np.where(ac, -1.0, 1.0)
    sin = 1.0 if k == 1 else -1.0
    s = sin * product_sign_numpy(x, z, gx, gz)
    return (np.where(ac[:, None], x ^ gx, x), np.where(ac[:, None], z ^ gz, z), np.where(ac, s, 1.0))
