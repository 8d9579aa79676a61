"""Pallas kernels for the GPU hot loops, each beside the pure-JAX rule it replaces.

* `prepend_rows`: a window of gates on disjoint qubits prepended to the inverse tableau. Each
  program owns one gate and one block of words: it loads the gate's rows (T(X_a), T(Z_a), ...),
  forms every generator's image as a product of them with the phase kept in two bit-lane counters
  (Stim's trick: popcounts once per block, not once per factor), and writes the rows back in place.
  The per-block phases are summed outside (a phase is additive over words).
* `frame_gate`: a window of gates on Pauli frames (shots along words), in place. Up to sign a
  Clifford is linear on a frame's bits, so each output bit is an XOR of the input bits that the
  gate's forward table sends to it.

The pure-JAX versions (`stabilizer.tableau`, `stabilizer.frames`) run everywhere; these run on GPUs
(Triton) and, with `interpret=True`, on the CPU, where the tests check them against the pure rules.
Both read their rows before writing them and no two active gates share a row, so updating in place
is safe; inactive slots (padding) do nothing.
"""

from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

MAX_BLOCK_WORDS = 128


MIN_BLOCK_WORDS = 16  # Triton miscompiled the phase sums of one-word blocks (H100, jax 0.11.2, 2026-11-22)


def block_words(words: int) -> int | None:
    """The block width the kernels use for rows of `words` words, or None if they cannot: the
    Triton backend needs power-of-two blocks that divide the row, and narrow rows (under 512
    qubits or shots) stay on the pure-JAX rules, where a kernel would gain nothing."""
    b = min(words, MAX_BLOCK_WORDS)
    return b if b >= MIN_BLOCK_WORDS and b & (b - 1) == 0 and words % b == 0 else None


def padded_words(words: int) -> int:
    """Row length the kernels can block: a power of two up to MAX_BLOCK_WORDS, then multiples of it."""
    if words <= MAX_BLOCK_WORDS:
        return 1 << max(0, (words - 1).bit_length())
    return -(-words // MAX_BLOCK_WORDS) * MAX_BLOCK_WORDS


def kernel_mode(kernel: str, words: int) -> str:
    """"jax", "pallas" or "interpret": "auto" picks the Pallas kernels on GPUs when rows can be blocked,
    unless the environment variable STABILIZER_KERNEL names a mode (read when a program is traced)."""
    if kernel == "auto":
        kernel = os.environ.get("STABILIZER_KERNEL", "auto")
    if kernel == "auto":
        gpu = jax.default_backend() == "gpu" and block_words(words) is not None
        return "pallas" if gpu else "jax"
    if kernel not in ("jax", "pallas", "interpret"):
        raise ValueError(f"kernel must be 'auto', 'jax', 'pallas' or 'interpret', not {kernel!r}")
    return kernel


def _popcount(v):
    """Bit counts of uint32 lanes, as int32 (Triton lowers popcount of signed words only)."""
    return lax.population_count(lax.bitcast_convert_type(v, jnp.int32))


def _mask(bit):
    """0 or ~0 as uint32 from a 0/1 int32 scalar."""
    return (jnp.int32(0) - bit).astype(jnp.uint32)


# ---- tableau: prepend a window of gates --------------------------------------------------------------

def _prepend_kernel(rows_ref, codes_ref, xs_in, zs_in, xs_ref, zs_ref, phase_ref, *, num_rows, bw):
    del xs_in, zs_in  # aliased with xs_ref, zs_ref
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(rows_ref[i, 0] >= 0)
    def _():
        cols = pl.ds(j * bw, bw)
        rows = [rows_ref[i, f] for f in range(num_rows)]
        fx = [xs_ref[r, cols] for r in rows]
        fz = [zs_ref[r, cols] for r in rows]
        outs = []
        for g in range(num_rows):
            code = codes_ref[i, g]
            x = z = c1 = c2 = jnp.zeros((bw,), jnp.uint32)
            for f in range(num_rows):
                m = _mask((code >> f) & 1)
                x2, z2 = fx[f] & m, fz[f] & m
                x1z2 = x & z2
                anti = (x2 & z) ^ x1z2
                x, z = x ^ x2, z ^ z2
                minus = x ^ z ^ x1z2  # on anticommuting lanes: the product's phase is -i, else +i
                carry = c1 & anti
                c1 = c1 ^ anti
                c2 = c2 ^ (anti & minus) ^ carry
            phase = jnp.sum(_popcount(c1)) + 2 * jnp.sum(_popcount(c2))
            outs.append((x, z, phase))
        def store(row, x, z):
            xs_ref[row, cols] = x
            zs_ref[row, cols] = z

        for g, (x, z, phase) in enumerate(outs):
            phase_ref[i, g, j] = phase
            # a row the gate maps to itself is not rewritten
            pl.when(codes_ref[i, g] != (1 << g))(partial(store, rows[g], x, z))


@partial(jax.jit, static_argnames=("interpret",), donate_argnums=(0, 1))
def prepend_rows(xs, zs, rows, codes, interpret: bool = False):
    """In place: for each slot i with rows[i, 0] >= 0, row rows[i, g] becomes the product of the rows
    rows[i, f] for the bits f of codes[i, g] (the old rows, in order f = 0, 1, ...).

    xs, zs (R, W) uint32; rows, codes (K, G) int32. Returns (xs, zs, phase (K, G)): the exponent of i
    of each product, mod 4 (signs of the factors not included).
    """
    k, g = rows.shape
    words = xs.shape[1]
    bw = block_words(words)
    if bw is None:
        raise ValueError(f"rows of {words} words cannot be blocked (use kernels.padded_words)")
    nb = words // bw
    kernel = partial(_prepend_kernel, num_rows=g, bw=bw)
    xs, zs, phase = pl.pallas_call(
        kernel,
        grid=(k, nb),
        out_shape=(jax.ShapeDtypeStruct(xs.shape, xs.dtype), jax.ShapeDtypeStruct(zs.shape, zs.dtype),
                   jax.ShapeDtypeStruct((k, g, nb), jnp.int32)),
        input_output_aliases={2: 0, 3: 1},
        interpret=interpret,
    )(rows, codes, xs, zs)
    return xs, zs, jnp.sum(phase, axis=-1) % 4


# ---- frames: a window of gates on every shot ------------------------------------------------------

def _frame_kernel(q_ref, fwd_ref, x_in, z_in, x_ref, z_ref, *, bw):
    del x_in, z_in
    i, j = pl.program_id(0), pl.program_id(1)
    q0, q1 = q_ref[i, 0], q_ref[i, 1]

    @pl.when(q0 >= 0)
    def _():
        cols = pl.ds(j * bw, bw)
        two = _mask((q1 >= 0).astype(jnp.int32))
        qb = jnp.maximum(q1, 0)
        bits = [x_ref[q0, cols], z_ref[q0, cols], x_ref[qb, cols] & two, z_ref[qb, cols] & two]
        outs = [jnp.zeros((bw,), jnp.uint32) for _ in range(4)]
        for gen in range(4):  # up to sign a Clifford is linear on the bits: XOR the generators' images
            image = fwd_ref[1 << gen]
            for b in range(4):
                outs[b] = outs[b] ^ (bits[gen] & _mask((image >> b) & 1))
        x_ref[q0, cols] = outs[0]
        z_ref[q0, cols] = outs[1]

        @pl.when(q1 >= 0)
        def _():
            x_ref[q1, cols] = outs[2]
            z_ref[q1, cols] = outs[3]


@partial(jax.jit, static_argnames=("interpret",), donate_argnums=(0, 1))
def frame_gate(x, z, qubits, fwd, interpret: bool = False):
    """In place: the two-qubit gate with forward table `fwd` (16,) int32 (code x_a | z_a << 1 |
    x_b << 2 | z_b << 3 -> image code) on the pairs qubits (K, 2) int32 of frames x, z (Q, W)
    uint32. Slots with qubits[i, 0] < 0 are skipped; qubits[i, 1] < 0 marks a one-qubit gate (its
    table must leave the b bits at zero)."""
    k = qubits.shape[0]
    words = x.shape[1]
    bw = block_words(words)
    if bw is None:
        raise ValueError(f"rows of {words} words cannot be blocked (use kernels.padded_words)")
    return pl.pallas_call(
        partial(_frame_kernel, bw=bw),
        grid=(k, words // bw),
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(z.shape, z.dtype)),
        input_output_aliases={2: 0, 3: 1},
        interpret=interpret,
    )(qubits, fwd, x, z)
