"""The tableau's Pallas kernels for the GPU hot loops, each beside the pure-JAX rule it replaces
(the frames' kernel is `stabilizer.frame_kernel`), and the kernel mode every runner reads.

* `prepend_rows`: a window of gates on disjoint qubits prepended to the inverse tableau. Each
  program owns one gate and one block of words: it loads the gate's rows (T(X_a), T(Z_a), ...),
  forms every generator's image as a product of them with the phase kept in two bit-lane counters
  (Stim's trick: popcounts once per block, not once per factor), and writes the rows back in place.
  The per-block phases are summed outside (a phase is additive over words).
* `collapse_rows`: the elimination step of a random measurement (a CX fan-out from the pivot appended
  to every row): each program streams a block of rows, carrying the prefix parity from word block
  to word block, and rewrites their x words in place.

The pure-JAX versions (`stabilizer.tableau`) run everywhere; these run on GPUs
(Triton) and, with `interpret=True`, on the CPU, where the tests check them against the pure rules.
Both read their rows before writing them and no two active gates share a row, so updating in place
is safe; inactive slots (padding) do nothing.

They are written for Pallas's Triton backend, which jax 0.11 marks deprecated in favour of Mosaic
GPU; with jax 0.10 and 0.11 they compile and pass the tests on an H100.
"""

from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

MAX_BLOCK_WORDS = 128


def block_words(words: int) -> int | None:
    """The block width the kernels use for rows of `words` words, or None if they cannot (the
    Triton backend needs power-of-two blocks that divide the row)."""
    b = min(words, MAX_BLOCK_WORDS)
    return b if b & (b - 1) == 0 and words % b == 0 else None


def padded_words(words: int) -> int:
    """Row length the kernels can block: a power of two up to MAX_BLOCK_WORDS, then multiples of it."""
    if words <= MAX_BLOCK_WORDS:
        return 1 << max(0, (words - 1).bit_length())
    return -(-words // MAX_BLOCK_WORDS) * MAX_BLOCK_WORDS


def kernel_mode(kernel: str, words: int, on_gpu: str = "pallas") -> str:
    """"jax", "pallas" or "interpret". "auto" means `on_gpu` on GPUs when rows can be blocked, else
    "jax", unless the environment variable STABILIZER_KERNEL names a mode (read when a program is
    traced)."""
    if kernel == "auto":
        kernel = os.environ.get("STABILIZER_KERNEL", "auto")
    if kernel == "auto":
        gpu = jax.default_backend() == "gpu" and block_words(words) is not None
        return on_gpu if gpu else "jax"
    if kernel not in ("jax", "pallas", "interpret"):
        raise ValueError(f"kernel must be 'auto', 'jax', 'pallas' or 'interpret', not {kernel!r}")
    return kernel


def _popcount(v):
    """Bit counts of uint32 lanes, as int32 (Triton lowers popcount of signed words only)."""
    return lax.population_count(lax.bitcast_convert_type(v, jnp.int32))


def lane_mask(bit):
    """0 or ~0 as uint32 from 0/1 int32 values (the frame kernel uses it too)."""
    return (jnp.int32(0) - bit).astype(jnp.uint32)


# ---- tableau: prepend a window of gates --------------------------------------------------------------

def _prepend_kernel(rows_ref, codes_ref, xs_in, zs_in, xs_ref, zs_ref, phase_ref, *, num_rows, bw):
    del xs_in, zs_in  # aliased with xs_ref, zs_ref
    i, j = pl.program_id(0), pl.program_id(1)
    active = rows_ref[i, 0] >= 0

    @pl.when(~active)
    def _():
        for g in range(num_rows):
            phase_ref[i, g, j] = jnp.int32(0)

    @pl.when(active)
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
                m = lane_mask((code >> f) & 1)
                x2, z2 = fx[f] & m, fz[f] & m
                x1z2 = x & z2
                anti = (x2 & z) ^ x1z2
                x, z = x ^ x2, z ^ z2
                minus = x ^ z ^ x1z2  # on anticommuting lanes: the product's phase is -i, else +i
                carry = c1 & anti
                c1 = c1 ^ anti
                c2 = c2 ^ (anti & minus) ^ carry
            phase = jnp.sum(_popcount(c1), dtype=jnp.int32) + 2 * jnp.sum(_popcount(c2), dtype=jnp.int32)
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
    of each product, mod 4 (signs of the factors not included), 0 for inactive slots.
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


# ---- tableau: the CX fan-out of a random measurement's collapse ---------------------------------------

ROW_BLOCK = 16


def _collapse_kernel(kmask_ref, xp_ref, zp_ref, xs_in, zs_ref, xs_ref, flips_ref, zpar_ref, *, bw, nb):
    del xs_in  # aliased with xs_ref
    rows = pl.ds(pl.program_id(0) * ROW_BLOCK, ROW_BLOCK)
    xp, zp = xp_ref[rows], zp_ref[rows]  # (RB,) 0/1: the pivot's x and z bit of each row

    def block(j, carry):
        parity, flips = carry  # per row: parity of the fan-out z bits in earlier words; flip count
        cols = pl.ds(j * bw, bw)
        km = kmask_ref[cols][None, :]
        x, zk = xs_ref[rows, cols], zs_ref[rows, cols] & km
        inclusive = zk
        for shift in (1, 2, 4, 8, 16):
            inclusive = inclusive ^ (inclusive << jnp.uint32(shift))
        word_parity = (_popcount(zk) & 1).astype(jnp.uint32)
        earlier = (jnp.cumsum(word_parity, axis=1, dtype=jnp.uint32) - word_parity + parity[:, None]) & 1
        before = (inclusive ^ zk) ^ (jnp.uint32(0) - earlier) ^ (jnp.uint32(0) - zp)[:, None]
        flips = flips + jnp.sum(_popcount(zk & ~(x ^ before)), axis=1, dtype=jnp.int32)
        xs_ref[rows, cols] = x ^ (km & (jnp.uint32(0) - xp)[:, None])
        return (parity + jnp.sum(word_parity, axis=1, dtype=jnp.uint32)) & 1, flips

    parity, flips = lax.fori_loop(0, nb, block, (jnp.zeros((ROW_BLOCK,), jnp.uint32),
                                                 jnp.zeros((ROW_BLOCK,), jnp.int32)))
    flips_ref[rows] = flips & 1
    zpar_ref[rows] = parity


@partial(jax.jit, static_argnames=("interpret",), donate_argnums=(0,))
def collapse_rows(xs, zs, kmask, xp, zp, interpret: bool = False):
    """The fan-out CX(pivot, k) for every k in kmask, appended to every row, xs updated in place
    (QuaSARQ section 3.2: one exclusive prefix-XOR along each row gives every row's sign change).

    xs, zs (R, W) uint32; kmask (W,) uint32; xp, zp (R,) uint32 in {0, 1}: each row's pivot bits.
    Returns (xs, flips (R,) int32 in {0, 1}: the row's sign flips if xp, zpar (R,) uint32: parity
    of the row's z bits under kmask, which the caller XORs into the pivot's z bit).
    """
    r, words = xs.shape
    bw = block_words(words)
    if bw is None or r % ROW_BLOCK:
        raise ValueError(f"a tableau of {r} rows of {words} words cannot be blocked (use kernels.padded_words)")
    return pl.pallas_call(
        partial(_collapse_kernel, bw=bw, nb=words // bw),
        grid=(r // ROW_BLOCK,),
        out_shape=(jax.ShapeDtypeStruct(xs.shape, xs.dtype), jax.ShapeDtypeStruct((r,), jnp.int32),
                   jax.ShapeDtypeStruct((r,), jnp.uint32)),
        input_output_aliases={3: 0},
        interpret=interpret,
    )(kmask, xp, zp, xs, zs)
