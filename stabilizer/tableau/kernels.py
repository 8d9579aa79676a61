"""The tableau's Pallas kernels for the GPU hot loops, each beside the pure-JAX rule it replaces
(the frames' kernel is `stabilizer.frames.frame_kernel`), and the kernel mode every runner reads.

* `prepend_rows`: a window of gates on disjoint qubits prepended to the inverse tableau. Each
  program owns one gate and one block of words: it loads the gate's rows (T(X_a), T(Z_a), ...),
  forms every generator's image as a product of them with the phase kept in two bit-lane counters
  (Stim's trick: popcounts once per block, not once per factor), and writes the rows back in place.
  The per-block phases are summed outside (a phase is additive over words).
* `collapse_rows`: the elimination step of a random measurement (a CX fan-out from the pivot appended
  to every row): each program streams a block of rows, carrying the prefix parity from word block
  to word block, and rewrites their x words in place.
* `plan_rows` and `apply_rows`: blocks of measurements (tableau.py's MEASURE_BLOCK section) instead
  of XLA loops of small kernels: the plan collapses the measured rows one after another in one
  program (its rows held transposed); `replay_inputs` makes the apply's inputs from a plan in one
  launch (and copies out the next block's measured rows); the apply replays the block's collapses on
  every row, a block of rows a program, and its program 0 can plan the next block meanwhile and write
  its outcomes (one launch a block: the plan, one long program on one SM, runs beside the apply).

The pure-JAX versions (`stabilizer.tableau.tableau`) run everywhere; these run on GPUs
(Triton) and, with `interpret=True`, on the CPU, where the tests check them against the pure rules.
Both read their rows before writing them and no two active gates share a row, so updating in place
is safe; inactive slots (padding) do nothing.

They are written for Pallas's Triton backend, which jax 0.11 marks deprecated in favour of Mosaic
GPU; with jax 0.10 and 0.11 they compile and pass the tests on an H100.
"""

from __future__ import annotations

import functools
import os
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pauliprop.runtime import mlir_dialects

mlir_dialects.register()  # the kernels' lowering without a failed import an op

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


def pack(bits) -> jax.Array:
    """(..., b) bool or 0/1, b <= 32 -> (...) uint32, entry j at bit j (the tableau's measurement blocks
    and the frames' noise planes use it)."""
    return jnp.sum(bits.astype(jnp.uint32) << jnp.arange(bits.shape[-1], dtype=jnp.uint32), axis=-1,
                   dtype=jnp.uint32)


# ---- tableau: prepend a window of gates --------------------------------------------------------------

def _prepend_kernel(rows_ref, codes_ref, xs_in, zs_in, xs_ref, zs_ref, phase_ref, *, num_rows, bw, live):
    del xs_in, zs_in  # aliased with xs_ref, zs_ref
    i, j = pl.program_id(0), pl.program_id(1)
    # words from `live` on are zero in every row a gate touches: neither loaded nor stored
    mask = None if live is None else (j * bw + jnp.arange(bw, dtype=jnp.int32)) < live
    load = lambda ref, row: ref[row, pl.ds(j * bw, bw)] if mask is None else plgpu.load(
        ref.at[row, pl.ds(j * bw, bw)], mask=mask, other=0)
    active = rows_ref[i, 0] >= 0

    @pl.when(~active)
    def _():
        for g in range(num_rows):
            phase_ref[i, g, j] = jnp.int32(0)

    @pl.when(active)
    def _():
        cols = pl.ds(j * bw, bw)
        rows = [rows_ref[i, f] for f in range(num_rows)]
        fx = [load(xs_ref, r) for r in rows]
        fz = [load(zs_ref, r) for r in rows]
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
            if mask is None:
                xs_ref[row, cols] = x
                zs_ref[row, cols] = z
            else:
                plgpu.store(xs_ref.at[row, cols], x, mask=mask)
                plgpu.store(zs_ref.at[row, cols], z, mask=mask)

        for g, (x, z, phase) in enumerate(outs):
            phase_ref[i, g, j] = phase
            # a row the gate maps to itself is not rewritten
            pl.when(codes_ref[i, g] != (1 << g))(partial(store, rows[g], x, z))


@partial(jax.jit, static_argnames=("live_words", "interpret"), donate_argnums=(0, 1))
def prepend_rows(xs, zs, rows, codes, live_words: int | None = None, interpret: bool = False):
    """In place: for each slot i with rows[i, 0] >= 0, row rows[i, g] becomes the product of the rows
    rows[i, f] for the bits f of codes[i, g] (the old rows, in order f = 0, 1, ...).

    xs, zs (R, W) uint32; rows, codes (K, G) int32; live_words: the rows' words from this one on are zero
    in every row the slots name (qubits past the state's), so the kernel neither reads nor writes them
    (None: every word). Returns (xs, zs, phase (K, G)): the exponent of i of each product, mod 4 (signs
    of the factors not included), 0 for inactive slots.
    """
    k, g = rows.shape
    words = xs.shape[1]
    bw = block_words(words)
    if bw is None:
        raise ValueError(f"rows of {words} words cannot be blocked (use kernels.padded_words)")
    live = words if live_words is None else max(1, min(live_words, words))
    nb = -(-live // bw)
    kernel = partial(_prepend_kernel, num_rows=g, bw=bw, live=None if live == nb * bw else live)
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


# ---- tableau: many Z measurements in blocks (the rules tableau._plan_block and tableau._apply_block) ----
#
# A block of MEASURE_BLOCK measurements has a plan (one program holding the measured rows, collapsing
# them one after another in registers) and an apply (a program a block of rows: each row's bits at the
# pivots and its fan-out parities, the collapses replayed on those words, then the fan-outs XORed into
# its x words). A MEASURE op runs the first plan alone, then one launch a block: the apply, whose
# program 0 applies the block to a copy of the next block's measured rows and plans that block.

PLAN_WARPS = 8  # on an H100 (the first block of a 10,000-qubit state, rows transposed): 8 117 us, 16 123 (before the
# last cut of its operations: 4 386, 8 130, 16 140, 32 164)
PACKED_COUNTS_BITS = 1 << 14  # rows of at most this many bits: the plan packs its per-row sums in one int32
# The apply's shape, from sweeps of measure-all at 10,000 qubits on an H100 (2026-11-26, before the plan
# was transposed; every block's apply launch also planning the next block, ms for the whole measurement;
# rows, words, warps): 32, 32,
# 16: 65.0; 32, 32, 8: 71.9; 32, 32, 32: 77.1; 16, 32, 8: 92.2; 8, 32, 8: 123; 32, 64, 16: 87.5;
# 16, 64, 16: 79.5; three pipeline stages as two. 64 rows a program (without the lookahead) gave wrong
# rows on the GPU, cause not found: a shape is trusted once the kernel tests pass on a GPU with it.
APPLY_WARPS = 4  # an apply launch alone (the last block of a MEASURE op)
APPLY_ROWS = 32  # rows an apply program owns
APPLY_WORDS = 32  # words an apply program's parity pass loads at a time (rows x words x 32 accumulators)
# its rewrite of the x words, a wider tile (measure-all at 10,000 qubits, 2026-11-26, the plan transposed,
# 8 warps: 32 words 60.1 ms, 64 56.7, 128 56.9; 1, 2 or 3 pipeline stages the same; 16 warps 59.3)
REWRITE_WORDS = 64
APPLY_STAGES = 2  # Triton's software pipelining of the passes' loads
APPLY_PREFETCH = 1  # tiles a pass loads ahead of the one it works on (0: none)
LOOKAHEAD_WARPS = 8  # an apply launch that also plans the next block (one num_warps for both parts)


def _pick(mask, values, axis=None):
    """The one entry of `values` where `mask` holds (summed over `axis`; 0 where none does), in the
    values' dtype (under x64 a plain sum of uint32 would widen)."""
    return jnp.sum(jnp.where(mask, values, jnp.zeros_like(values)), axis=axis, dtype=values.dtype)


def plan_chunks(words: int) -> list[tuple[int, int]]:
    """The (offset, width) pieces of a row of `words` words as the plan holds it: powers of two (Triton's
    blocks), widest first, covering the row exactly (384 = 256 + 128 at 10,000 qubits, where one block
    of 512 words held a quarter of zeros)."""
    pieces, offset = [], 0
    while offset < words:
        width = 1 << ((words - offset).bit_length() - 1)
        pieces.append((offset, width))
        offset += width
    return pieces


def _plan_program(load, w, signs, active_ref, guesses_ref, pivot_ref, kmask_ref, flags_ref, *, packed_counts,
                  at=0, record_ref=None):
    """The plan (see plan_rows) of the measured rows held transposed, (W, b): word w of row j at [w, j], so
    a row's words lie across the warps and the b rows across a warp's lanes. Picking row j's words, or
    row j's entry of a per-row vector, is then a shuffle within a warp; only the pivot search and one
    per-row sum cross warps. The words are held in the pieces of plan_chunks(W), each step working on
    every piece: load() gives the x and the z pieces ((width, b) each). signs (b,) int32; slot j's
    choices are active_ref[at + j] and guesses_ref[at + j]; record_ref, if given, takes the outcomes at
    [at, at + b) (int32 0/1)."""
    b = signs.shape[0]
    pieces = plan_chunks(w)
    row = jnp.arange(b, dtype=jnp.int32)
    cols = [off + jnp.arange(width, dtype=jnp.int32) for off, width in pieces]
    one = jnp.uint32(1)

    def collapse(j, carry):  # the program is bound by its issue rate: few operations on the (w, b) arrays
        x, z, signs, pivots, flags = carry
        at_j = row == j
        xj = [_pick(at_j[None, :], v, axis=1) for v in x]  # (w,) the measured row's x words, by piece
        # the pivot, its lowest x column, in one reduction a piece
        lowest = [v & (jnp.uint32(0) - v) for v in xj]
        first = functools.reduce(jnp.minimum, [jnp.min(jnp.where(v != 0, c * 32 + _popcount(lo - one), 32 * w))
                                               for v, lo, c in zip(xj, lowest, cols)])
        random = (active_ref[at + j] != 0) & (first < 32 * w)
        bit = jnp.where(random, first % 32, 0).astype(jnp.uint32)
        pcol = [jnp.where(random & (c == first // 32), one << bit, jnp.uint32(0)) for c in cols]  # the pivot's bit
        km = [jnp.where(random, v ^ p, jnp.uint32(0)) for v, p in zip(xj, pcol)]  # the fan-out's columns

        # CX(pivot, k) for k in km on every row (tableau._fan_out_jax). A CNOT circuit maps X^x Z^z to
        # X^x' Z^z' with no phase, so a row's sign flips when its Y count changes by 2 mod 4; a row with
        # an x at the pivot gains a Y where it has z and not x under km, loses one where it has both,
        # and its pivot's Y follows z: the counts of z under km (a + b) and of z and x under km (b),
        # and each row's x and z bits at the pivot, in one sum where the counts fit 14 bits (32 W <= 2^14)
        def sums(xv, zv, k, p):
            kz = zv & k[:, None]
            x_at = jnp.minimum(xv & p[:, None], one).astype(jnp.int32)  # 1 at the pivot where x has it
            z_at = jnp.minimum(zv & p[:, None], one).astype(jnp.int32)
            if packed_counts:
                return (jnp.sum(_popcount(kz) + _popcount(kz & xv) * (1 << 14) + x_at * (1 << 28) + z_at * (1 << 29),
                                axis=0, dtype=jnp.int32),)
            return tuple(jnp.sum(v, axis=0, dtype=jnp.int32) for v in (_popcount(kz), _popcount(kz & xv), x_at, z_at))

        parts = [sums(*args) for args in zip(x, z, km, pcol)]
        totals = [functools.reduce(jnp.add, terms) for terms in zip(*parts)]
        if packed_counts:
            s = totals[0]
            total, b_, xp, zp = s & 0x3FFF, (s >> 14) & 0x3FFF, (s >> 28) & 1, (s >> 29) & 1
        else:
            total, b_, xp, zp = totals
        zpar = total & 1
        gained = total - 2 * b_ + (zp ^ zpar) - zp
        signs = signs ^ (xp & ((gained & 3) == 2).astype(jnp.int32))
        bz = zp ^ zpar  # the pivot's z bit after the fan-out
        # the measured row's pivot z bit and sign, in one pick
        mine = _pick(at_j, bz | (signs << 1))
        use_yz = (mine & 1) == 1
        # H (X^a Z^c -> (-1)^ac X^c Z^a) or H_YZ (-> (-1)^(a & ~c) X^(a^c) Z^c) on the pivot, if random
        nx = jnp.where(use_yz, xp ^ bz, bz)
        nz = jnp.where(use_yz, bz, xp)
        gate_flip = jnp.where(use_yz, xp & (1 - bz), xp & bz)
        nx, nz = jnp.where(random, nx, xp), jnp.where(random, nz, bz)
        signs = signs ^ jnp.where(random, gate_flip, 0)
        # x takes the fan-out where it has x at the pivot, and the pivot's new bit; z the pivot's new bit
        mask = lambda v: (jnp.uint32(0) - v.astype(jnp.uint32))[None, :]
        x = tuple(xv ^ ((k[:, None] & mask(xp)) | (p[:, None] & mask(xp ^ nx))) for xv, k, p in zip(x, km, pcol))
        z = tuple(zv ^ (p[:, None] & mask(zp ^ nz)) for zv, p in zip(z, pcol))
        # X at the start of time sets the outcome: flips every row with a Z or Y at the pivot (the
        # measured row itself is then +-Z there, so its outcome is its sign, flipped by the fix). The
        # measured row has x at the pivot and takes H where bz is 0, H_YZ where 1: no gate flip
        sign = mine >> 1
        fix = random & (sign != guesses_ref[at + j])
        signs = signs ^ jnp.where(fix, nz, 0)
        for (off, width), k in zip(pieces, km):
            kmask_ref[pl.ds(j, 1), pl.ds(off, width)] = k[None, :]
        pivots = jnp.where(at_j, jnp.where(random, first, 0), pivots)
        code = random.astype(jnp.int32) | (use_yz.astype(jnp.int32) << 1) | (fix.astype(jnp.int32) << 2)
        flags = jnp.where(at_j, code | ((sign ^ fix.astype(jnp.int32)) << 3), flags)
        return x, z, signs, pivots, flags

    zeros = jnp.zeros(b, jnp.int32)
    busy = jnp.max(active_ref[pl.ds(at, b)]) != 0

    def finish(pivots, flags):
        pivot_ref[...] = pivots
        flags_ref[...] = flags
        if record_ref is not None:
            record_ref[pl.ds(at, b)] = (flags >> 3) & 1

    @pl.when(busy)
    def _():
        _, _, _, pivots, flags = lax.fori_loop(0, b, collapse, (*load(), signs, zeros, zeros))
        finish(pivots, flags)

    @pl.when(jnp.logical_not(busy))  # a block of padding slots: nothing collapses
    def _():
        finish(zeros, signs << 3)
        for off, width in pieces:
            kmask_ref[:, pl.ds(off, width)] = jnp.zeros((b, width), jnp.uint32)


def _window(pieces):
    """The block's window (lo, hi) int32 from pieces of a row [(support (size,) bool, offset)]: the first
    and one past the last of the words where support holds, the words where some measured row has x
    bits; (0, 0) if none. Every collapse of the block stays inside it (a pivot and its fan-out are x
    bits of a measured row, and the fan-outs and pivots are all that changes those), so the apply passes
    over only these words: 313 of the 384 a row holds at 10,000 qubits (the capacity rounds up to whole
    blocks of words)."""
    cols = [offset + jnp.arange(support.shape[0], dtype=jnp.int32) for support, offset in pieces]
    lo = functools.reduce(jnp.minimum, [jnp.min(jnp.where(sp, c, 1 << 30)) for (sp, _), c in zip(pieces, cols)])
    hi = functools.reduce(jnp.maximum, [jnp.max(jnp.where(sp, c + 1, 0)) for (sp, _), c in zip(pieces, cols)])
    return jnp.where(hi > 0, lo, 0), hi


def _plan_kernel(xs_ref, zs_ref, signs_ref, active_ref, guesses_ref, pivot_ref, kmask_ref, flags_ref, *, packed_counts):
    w = xs_ref.shape[0]
    load = lambda ref: tuple(ref[pl.ds(off, width), :] for off, width in plan_chunks(w))
    _plan_program(lambda: (load(xs_ref), load(zs_ref)), w, signs_ref[...], active_ref, guesses_ref, pivot_ref,
                  kmask_ref, flags_ref, packed_counts=packed_counts)


def _packed_counts(words: int) -> bool:
    return 32 * words <= PACKED_COUNTS_BITS


def _barrier(interpret: bool):
    """A barrier across the program's threads (none needed when interpreted)."""
    return (lambda: None) if interpret else plgpu.debug_barrier


@partial(jax.jit, static_argnames=("interpret",))
def plan_rows(xs, zs, signs, active, guesses, interpret: bool = False):
    """The rule of tableau._plan_block in one program: the measured rows xs, zs (b, W) collapsed in
    order (active (b,), the outcome each random one takes guesses (b,), signs (b,), all int32 0/1).
    Returns (pivot (b,) int32, kmask (b, W) uint32, flags (b,) int32: bit 0 random, 1 use_yz,
    2 fix, 3 outcome, window (2,) int32: the words [lo, hi) where the rows have x bits, outside which
    the block changes nothing: _window). The program holds the rows transposed (_plan_program)."""
    b, w = xs.shape
    pivot, kmask, flags = pl.pallas_call(
        partial(_plan_kernel, packed_counts=_packed_counts(w)),
        grid=(1,),
        out_shape=(jax.ShapeDtypeStruct((b,), jnp.int32), jax.ShapeDtypeStruct((b, w), jnp.uint32),
                   jax.ShapeDtypeStruct((b,), jnp.int32)),
        compiler_params=plgpu.CompilerParams(num_warps=PLAN_WARPS, num_stages=1),
        interpret=interpret,
    )(xs.T, zs.T, signs, active, guesses)
    return pivot, kmask, flags, jnp.stack(_window([(jnp.any(xs != 0, axis=0), 0)]))


def replay_collapse(x, z, controls, phase, j, zk_bit, s, on, use_yz, fix, kp):
    """Collapse j of a planned block on each row's pivot words (tableau._apply_block's step, here and
    in apply_rows): x, z (rows,) the rows' bits at the block's pivot columns as slot bits; zk_bit each
    row's z parity under fan-out j off the pivots; s the slot of its pivot, kp its pivot columns as
    slot bits; on (random), use_yz, fix its plan. Returns (x, z, controls, phase): controls gains bit
    j where the row held an x at the pivot, phase the i exponents of the pivot's H or H_YZ and X."""
    one = jnp.uint32(1)
    c = jnp.where(on, (x >> s) & one, jnp.uint32(0))  # x at the pivot: the fan-out's control
    controls = controls | (c << j)
    x = x ^ ((jnp.uint32(0) - c) & kp)
    zpar = zk_bit ^ (_popcount(z & kp).astype(jnp.uint32) & one)
    z = z ^ (jnp.where(on, zpar, jnp.uint32(0)) << s)
    bz = (z >> s) & one
    # H: X^a Z^b -> (-1)^ab X^b Z^a; H_YZ: -> (-1)^a i^b X^(a^b) Z^b; X after: (-1)^z
    nx = jnp.where(use_yz, c ^ bz, bz)
    nz = jnp.where(use_yz, bz, c)
    d = jnp.where(use_yz, 2 * c + bz, 2 * c * bz).astype(jnp.int32)
    d = d + 2 * (fix & (nz == 1)).astype(jnp.int32)
    keep = ~(one << s)
    x = jnp.where(on, (x & keep) | (nx << s), x)
    z = jnp.where(on, (z & keep) | (nz << s), z)
    return x, z, controls, phase + jnp.where(on, d, 0)


TABLE_FANOUTS = 8  # fan-outs one lookup table of the apply combines (2^8 entries; measure-all at 10,000 qubits on
# an H100, 2026-11-26: 8 48.9 ms, 4 49.8, 2 50.9)
REPLAY_WORDS = 32  # words a replay_inputs program builds (10,000 qubits on an H100: 32 54.0 ms, 128 56.2)


def _replay_kernel(*refs, cw, following):
    """Program (g, c): the pivot columns of the block (each program works them out: a few (b, b)
    comparisons), the fan-outs TABLE_FANOUTS g.. off the pivots in words c cw.., and their table; with
    `following`, also the next block's measured rows TABLE_FANOUTS g.. in those words (and their signs)."""
    if following:
        (pivot_ref, flags_ref, kmask_ref, xs_ref, zs_ref, signs_ref, qubits_ref, block_ref,
         steps_ref, kp_ref, kext_ref, tables_ref, pmask_ref, nx_ref, nz_ref, nsigns_ref) = refs
    else:
        pivot_ref, flags_ref, kmask_ref, steps_ref, kp_ref, kext_ref, tables_ref, pmask_ref = refs
    g, c = pl.program_id(0), pl.program_id(1)
    b = pivot_ref.shape[0]
    one = jnp.uint32(1)
    p, flags = pivot_ref[...], flags_ref[...]
    random = (flags & 1) == 1
    slots = jnp.arange(b, dtype=jnp.int32)
    # a pivot column may recur in a block: its bits live at the slot of its first collapse
    same = (p[:, None] == p[None, :]) & random[:, None] & random[None, :]
    slot = jnp.where(random, jnp.min(jnp.where(same, slots[None, :], b), axis=1), 0)
    first = random & (slot == slots)
    word, shift = p // 32, (p % 32).astype(jnp.uint32)
    pivot_bits = jnp.where(first, one << shift, jnp.uint32(0))
    col = c * cw + jnp.arange(cw, dtype=jnp.int32)
    pmask = _pick(word[None, :] == col[:, None], jnp.broadcast_to(pivot_bits[None, :], (cw, b)), axis=1)
    cols = pl.ds(c * cw, cw)
    entries = 1 << TABLE_FANOUTS
    entry = jnp.arange(entries, dtype=jnp.int32)
    table = jnp.zeros((entries, cw), jnp.uint32)
    for i in range(TABLE_FANOUTS):
        j = g * TABLE_FANOUTS + i
        kext = kmask_ref[j, cols] & ~pmask
        kext_ref[j, cols] = kext
        table = table ^ jnp.where(((entry >> i) & 1)[:, None] == 1, kext[None, :], jnp.uint32(0))
    tables_ref[pl.ds(g * entries, entries), cols] = table
    if following:  # rows N + q of the slots' qubits q (the tableau as it is before this block's apply)
        n = xs_ref.shape[0] // 2
        start = block_ref[0] * b
        rows = n + qubits_ref[pl.ds(start + g * TABLE_FANOUTS, TABLE_FANOUTS)]
        mine = pl.ds(g * TABLE_FANOUTS, TABLE_FANOUTS)
        nx_ref[mine, cols] = xs_ref[rows[:, None], col[None, :]]
        nz_ref[mine, cols] = zs_ref[rows[:, None], col[None, :]]

    @pl.when(g == 0)
    def _():
        pmask_ref[cols] = pmask

    @pl.when((g == 0) & (c == 0))
    def _():
        for k, v in enumerate((word, shift.astype(jnp.int32), first.astype(jnp.int32), slot, flags & 7)):
            steps_ref[k, :] = v
        # fan-out j's bits at the distinct pivot columns, as slot bits
        at = (kmask_ref[slots[:, None], word[None, :]] >> shift[None, :]) & one
        kp_ref[...] = jnp.sum(jnp.where(first[None, :], at << slots.astype(jnp.uint32)[None, :], jnp.uint32(0)),
                              axis=1, dtype=jnp.uint32)
        if following:
            nsigns_ref[...] = signs_ref[n + qubits_ref[pl.ds(start, b)]]


@partial(jax.jit, static_argnames=("interpret",))
def replay_inputs(pivot, kmask, flags, following=None, interpret: bool = False):
    """apply_rows's block arguments from a plan (pivot (b,), kmask (b, W), flags (b,) as plan_rows
    returns them), in one launch: (steps, kp, kext, tables, pmask), as tableau._replay makes them.

    following: (xs, zs, signs, qubits, block): the tableau (2N, W) and its signs (2N,) int32, the slots'
    qubits (K,) int32 and a block index (1,) int32; the launch then also returns that block's measured
    rows, xs, zs and signs at N + qubits[b block:b block + b], as apply_rows's lookahead takes them (read
    before the apply that follows changes them)."""
    b, w = kmask.shape
    if b % TABLE_FANOUTS or block_words(w) is None:
        raise ValueError(f"a block of {b} fan-outs of {w} words cannot be blocked")
    cw = min(block_words(w), REPLAY_WORDS)
    out_shape = (jax.ShapeDtypeStruct((5, b), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.uint32),
                 jax.ShapeDtypeStruct((b, w), jnp.uint32),
                 jax.ShapeDtypeStruct((b // TABLE_FANOUTS << TABLE_FANOUTS, w), jnp.uint32),
                 jax.ShapeDtypeStruct((w,), jnp.uint32))
    if following is not None:
        out_shape += (jax.ShapeDtypeStruct((b, w), jnp.uint32), jax.ShapeDtypeStruct((b, w), jnp.uint32),
                      jax.ShapeDtypeStruct((b,), jnp.int32))
    return pl.pallas_call(
        partial(_replay_kernel, cw=cw, following=following is not None),
        grid=(b // TABLE_FANOUTS, w // cw),
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
    )(pivot, flags, kmask, *(following or ()))


def _apply_kernel(*refs, b, nb, bw, lookahead, packed_counts, sync):
    """Programs of APPLY_ROWS rows apply the block (skipping those `skip` names), the signs in place. With
    `lookahead`, program 0 instead applies it to the next block's measured rows (a copy taken before this
    launch) and then plans that block on them (_plan_program), writing its outcomes to the record, while
    the others apply: the next plan costs no launch of its own and overlaps this one's apply."""
    if lookahead:
        (steps_ref, kp_ref, kext_ref, tables_ref, pmask_ref, skip_ref, window_ref, active_ref, guesses_ref, block_ref,
         measured_ref, *_, xs_ref, zs_ref, signs_ref, nx_ref, nz_ref, nsigns_ref, record_ref, pivot_ref, kmask_ref,
         flags_ref, nwindow_ref) = refs
    else:
        steps_ref, kp_ref, kext_ref, tables_ref, pmask_ref, skip_ref, window_ref, *_, xs_ref, zs_ref, signs_ref = refs
    apply = partial(_apply_program, steps_ref, kp_ref, kext_ref, tables_ref, pmask_ref, window_ref[0], window_ref[1],
                    b=b, nb=nb, bw=bw, sync=sync)

    def rows_block(program):
        # rows the block's collapses leave as they are: those `skip` names, and every row if none is random
        # (read here, not by a kernel of its own a block)
        idle = (skip_ref[program] != 0) | (jnp.max(steps_ref[4, :] & 1) == 0)
        if not lookahead:
            pl.when(jnp.logical_not(idle))(partial(apply, xs_ref, zs_ref, signs_ref, program * APPLY_ROWS))
            return
        # rows of qubits measured in an earlier block of the op only lose their z bits at the pivots
        measured = measured_ref[program] < block_ref[0] - 1  # this launch applies block block_ref[0] - 1
        pl.when(jnp.logical_not(idle) & measured)(partial(_clear_pivots, steps_ref, zs_ref, program * APPLY_ROWS))
        pl.when(jnp.logical_not(idle | measured))(partial(apply, xs_ref, zs_ref, signs_ref, program * APPLY_ROWS))

    program = pl.program_id(0)  # read here: the interpreter knows it only outside conditionals
    if not lookahead:
        rows_block(program)
        return

    @pl.when(program == 0)
    def _():
        def next_rows(k, carry):
            apply(nx_ref, nz_ref, nsigns_ref, k * APPLY_ROWS)
            return carry

        lax.fori_loop(0, nx_ref.shape[0] // APPLY_ROWS, next_rows, 0)
        sync()  # the rows other threads wrote, for the plan (transposed, piece by piece)
        w = nx_ref.shape[1]
        pieces = plan_chunks(w)
        support = [(jnp.max((nx_ref[:, pl.ds(off, width)] != 0).astype(jnp.int32), axis=0) != 0, off)
                   for off, width in pieces]
        lo, hi = _window(support)
        nwindow_ref[0] = lo
        nwindow_ref[1] = hi
        # transposed in registers (through a scratch array in global memory the measurement at 10,000 qubits
        # took 50.1-50.2 ms against 49.0-49.9 ms, H100, 2026-11-27)
        load = lambda: tuple(tuple(ref[:, pl.ds(off, width)].T for off, width in pieces) for ref in (nx_ref, nz_ref))
        _plan_program(load, w, nsigns_ref[...], active_ref, guesses_ref, pivot_ref, kmask_ref, flags_ref,
                      packed_counts=packed_counts, at=block_ref[0] * b, record_ref=record_ref)

    @pl.when(program > 0)
    def _():
        rows_block(program - 1)


def _pivot_words(steps_ref):
    """The block's pivot words from its steps: (word, shift, first) (b,) as in apply_rows's steps, same (b, b):
    s' a distinct pivot in s's word, at (b,) each distinct pivot's bit in its word, clear (b,) the bits of
    every distinct pivot in s's word (slots sharing a word, or pointing at word 0 unused, write one value)."""
    word, shift, first = steps_ref[0], steps_ref[1].astype(jnp.uint32), steps_ref[2].astype(jnp.uint32)
    same = (word[:, None] == word[None, :]) & (first[None, :] == 1)
    at = first << shift
    clear = jnp.sum(jnp.where(same, at[None, :], jnp.uint32(0)), axis=1, dtype=jnp.uint32)
    return word, shift, first, same, at, clear


def _clear_pivots(steps_ref, zs_ref, r0):
    """The block on APPLY_ROWS rows from r0 that are Z rows of qubits measured earlier (T(Z_q) after q's
    collapse): such a row has no x bit, and keeps none, since it commutes with every measured row, which
    is X at its pivot after its fan-out; so its z bit at that pivot is 0 after the fan-out, no H or H_YZ
    or X changes it, the row's sign does not change (no Y, no phase), and nothing else moves: the block
    clears its z bits at the block's pivots, and that is all."""
    word, _, _, _, _, clear = _pivot_words(steps_ref)
    rows = r0 + jnp.arange(APPLY_ROWS, dtype=jnp.int32)
    old = zs_ref[rows[:, None], word[None, :]]
    zs_ref[rows[:, None], word[None, :]] = old & ~clear[None, :]


def _next_tile(queue, load, k):
    """A pass's tile k and its queue of tiles loaded ahead, k + 1.. (loads issued before tile k's work
    waits on them): (tile k, the queue with tile k + len(queue) loaded); an empty queue loads tile k."""
    if not queue:
        return load(k), queue
    return queue[0], queue[1:] + (load(k + len(queue)),)


def _apply_program(steps_ref, kp_ref, kext_ref, tables_ref, pmask_ref, lo, hi, xs_ref, zs_ref, signs_ref, r0, *, b, nb,
                   bw, sync):
    block = pl.ds(r0, APPLY_ROWS)
    signs = signs_ref[block]  # read before the barriers below: every thread's read precedes the write at the end
    rows = r0 + jnp.arange(APPLY_ROWS, dtype=jnp.int32)
    one = jnp.uint32(1)
    slots = jnp.arange(b, dtype=jnp.uint32)

    # each row's bits at the (distinct) pivot columns, as slot bits: one (rows, b) gather
    word, shift, first, same, at, clear = _pivot_words(steps_ref)

    def pivot_bits(ref):
        bits = ((ref[rows[:, None], word[None, :]] >> shift[None, :]) & one) * first[None, :]
        return jnp.sum(bits << slots[None, :], axis=1, dtype=jnp.uint32)

    xo, zo = pivot_bits(xs_ref), pivot_bits(zs_ref)

    def words_at(k):
        return pl.ds(k * bw, bw)

    # the parity of each row's z under each fan-out's columns off the pivots (bit j of zk): XORs of
    # words first, one popcount a row and fan-out at the end; only the block's window of words [lo, hi)
    # (the fan-outs are zero elsewhere). One (fan-outs, rows, words) accumulator: 32 of (rows, words)
    # ran the apply alone in 161 us against 151 (H100, 2026-11-26)
    # Each pass keeps the loads of its next APPLY_PREFETCH tiles in flight while it works on the current
    # one (one program an SM: nothing else hides a load's latency); indices are clamped to the row (a
    # measure loop's first launch applies a plan of nothing, whose window is empty, to the next rows).
    start, stop = lo // bw, (hi + bw - 1) // bw

    def tile(k):
        cols = words_at(jnp.clip(k, 0, jnp.maximum(stop - 1, 0)))  # in the row even for an empty window
        return zs_ref[block, cols], kext_ref[:, cols]

    def parities(k, carry):
        acc, queue = carry
        (z, kext), queue = _next_tile(queue, tile, k)
        return acc ^ (z[None, :, :] & kext[:, None, :]), queue

    queue = tuple(tile(start + d) for d in range(APPLY_PREFETCH))
    acc, _ = lax.fori_loop(start, stop, parities, (jnp.zeros((b, APPLY_ROWS, bw), jnp.uint32), queue))
    parity = (jnp.sum(_popcount(acc), axis=2, dtype=jnp.int32) & 1).astype(jnp.uint32)  # (b, rows)
    zk = jnp.sum(parity << slots[:, None], axis=0, dtype=jnp.uint32)

    def step(j, carry):  # a loop, not unrolled: unrolled it ran 2x slower on an H100 and compiled in 8 s
        f = steps_ref[4, j]
        return replay_collapse(*carry, j.astype(jnp.uint32), (zk >> j.astype(jnp.uint32)) & one,
                               steps_ref[3, j].astype(jnp.uint32), (f & 1) == 1, (f & 2) == 2, (f & 4) == 4, kp_ref[j])

    zero_words = jnp.zeros(APPLY_ROWS, jnp.uint32)
    x, z, controls, phase = lax.fori_loop(0, b, step, (xo, zo, zero_words, jnp.zeros(APPLY_ROWS, jnp.int32)))

    # every warp has gathered its pivot words before any rewrites them (a warp computes its own copy of
    # the per-row vectors, and no cross-warp sum orders the warps when the tiles are narrow)
    sync()
    # off the pivots: x takes the XOR of the fan-outs its controls select, F = TABLE_FANOUTS controls a
    # table lookup (tables_ref row 2^F g + v: the XOR of fan-outs F g + i for the set bits i of v); count Ys
    entries = 1 << TABLE_FANOUTS
    groups = [(entries * g + ((controls >> jnp.uint32(TABLE_FANOUTS * g)) & (entries - 1)).astype(jnp.int32))[:, None]
              for g in range(b // TABLE_FANOUTS)]

    rw = min(REWRITE_WORDS, block_words(nb * bw))  # the rewrite's tile: no accumulators of fan-outs, so wider

    # a row none of whose collapses had an x at the pivot (controls 0, as a measured row has: Z at its pivot
    # times Zs) takes no fan-out and had no x at any pivot, so its x words and its Ys stay as they are: a
    # program whose rows all have none skips the pass (rows of qubits an earlier op measured; those this op
    # measured take _clear_pivots instead. Measure-all at 10,000 qubits on an H100, 2026-11-27, when the
    # measured rows took this path: 49.4 / 48.2 -> 46.5 / 46.6 ms in all)
    fans = jnp.max(controls) != 0
    tiles = (lo // rw, jnp.where(fans, (hi + rw - 1) // rw, lo // rw))

    def words(k):  # a tile's x and z words, its pivot mask and the XOR of the fan-outs each row's controls select
        k = jnp.clip(k, 0, jnp.maximum(tiles[1] - 1, 0))
        cols = pl.ds(k * rw, rw)
        at = k * rw + jnp.arange(rw, dtype=jnp.int32)[None, :]
        fanned = functools.reduce(jnp.bitwise_xor, [tables_ref[g, at] for g in groups])
        return xs_ref[block, cols], zs_ref[block, cols], pmask_ref[cols][None, :], fanned

    def rewrite(k, carry):  # ys: Ys before less Ys after off the pivots, summed over words at the end
        ys, queue = carry
        (xw, zw, pmask, fanned), queue = _next_tile(queue, words, k)
        new = xw ^ fanned
        xs_ref[block, pl.ds(k * rw, rw)] = new  # tiles loaded ahead are later ones (or this one, clamped at the
        # end, and then unused): no hazard
        return ys + _popcount(xw & zw) - _popcount(new & zw & ~pmask), queue

    queue = tuple(words(tiles[0] + d) for d in range(APPLY_PREFETCH))
    ys, _ = lax.fori_loop(*tiles, rewrite, (jnp.zeros((APPLY_ROWS, rw), jnp.int32), queue))
    ys = jnp.sum(ys, axis=1, dtype=jnp.int32)

    # the pivot columns take their new bits: slot s writes its pivot's whole word with the new bits of
    # every distinct pivot in that word, so slots sharing a word write the same value (one scatter)
    def set_pivots(ref, new):
        bits = ((new[:, None] >> slots[None, :]) & one) * at[None, :]  # (rows, b) each pivot's new bit, in place
        put = jnp.sum(jnp.where(same[None, :, :], bits[:, None, :], jnp.uint32(0)), axis=2, dtype=jnp.uint32)
        old = ref[rows[:, None], word[None, :]]
        ref[rows[:, None], word[None, :]] = (old & ~clear[None, :]) | put

    sync()  # every thread's loads of the rows and stores of their x words are done before the pivot words change
    set_pivots(xs_ref, x)
    set_pivots(zs_ref, z)
    # signs: i^(Ys before - Ys after + the pivots' phases) is -1
    signs_ref[block] = signs ^ (((ys - _popcount(x & z) + phase) & 3) == 2).astype(jnp.int32)


@partial(jax.jit, static_argnames=("interpret",), donate_argnums=(0, 1, 2))
def apply_rows(xs, zs, signs, steps, kp, kext, tables, pmask, skip, window=None, lookahead=None, interpret: bool = False):
    """tableau._apply_block's collapses on every row, xs, zs and signs (R,) int32 0/1 updated in place:
    each row's bits at the pivots, its fan-out parities, the b collapses replayed on those words, the
    fan-outs (kext (b, W), off the pivot columns pmask (W,)) XORed into its x words by its controls, the
    pivots' new bits, the sign flips. steps (5, b) int32: pivot word, shift, first (the distinct
    pivots), slot, flags (bit 0 random, 1 use_yz, 2 fix); kp (b,) uint32 each fan-out's pivot columns
    as slot bits; tables (b / F * 2^F, W), F = TABLE_FANOUTS: row 2^F g + v the XOR of the fan-outs
    F g + i for the set bits i of v (M4RI's lookup); skip (R / APPLY_ROWS,) int32: nonzero for blocks of
    rows the collapses leave unchanged, which are not read (nor is any row when no collapse of the block
    is random); window (2,) int32: the block's words [lo, hi) as plan_rows returns it (None: every
    word), the only words the passes over the rows read. Returns (xs, zs, signs).

    lookahead: the next block, (xs, zs, signs, active, guesses, block, record, measured_by): its measured
    rows as they are before this apply (b, W) and their signs (b,), every slot's choices active and
    guesses (K,) int32 0/1 of which the block's are [b block, b block + b) (block (1,) int32: this launch
    applies block - 1), the record (K,) int32, and measured_by (R / APPLY_ROWS,) int32: for each program
    of rows, the block after which they are all Z rows of measured qubits (2^30 if never), which a
    later block's collapses only clear at their pivots (_clear_pivots). The same launch also plans that
    block on its rows after this apply, writes its outcomes to those slots of the record, and returns
    (xs, zs, signs, record, (pivot, kmask, flags, window)) with the plan as plan_rows's."""
    r, w = xs.shape
    if r % APPLY_ROWS or block_words(w) is None:
        raise ValueError(f"a tableau of {r} rows of {w} words cannot be blocked (use kernels.padded_words)")
    b, bw = kext.shape[0], min(block_words(w), APPLY_WORDS)
    if window is None:
        window = jnp.array([0, w], jnp.int32)
    state = [xs, zs, signs]
    args = [steps, kp, kext, tables, pmask, skip, window]
    packed, warps, extra, out_shape = False, APPLY_WARPS, 0, []
    if lookahead is not None:
        nx, nz, nsigns, active, guesses, block, record, measured_by = lookahead
        nb_, wp = nx.shape
        if nb_ % APPLY_ROWS:
            raise ValueError(f"the next block's {nb_} rows are not a multiple of APPLY_ROWS = {APPLY_ROWS}")
        args += [active, guesses, block, measured_by]
        state += [nx, nz, nsigns, record]
        out_shape = [jax.ShapeDtypeStruct((nb_,), jnp.int32), jax.ShapeDtypeStruct((nb_, wp), jnp.uint32),
                     jax.ShapeDtypeStruct((nb_,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32)]
        packed, warps, extra = _packed_counts(w), LOOKAHEAD_WARPS, 1
    out = pl.pallas_call(
        partial(_apply_kernel, b=b, nb=w // bw, bw=bw, lookahead=lookahead is not None, packed_counts=packed,
                sync=_barrier(interpret)),
        grid=(extra + r // APPLY_ROWS,),
        out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in state) + tuple(out_shape),
        input_output_aliases={len(args) + i: i for i in range(len(state))},
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=APPLY_STAGES),
        interpret=interpret,
    )(*args, *state)
    if lookahead is None:
        return out
    xs, zs, signs, _, _, _, record, pivot, kmask, flags, window = out
    return xs, zs, signs, record, (pivot, kmask, flags, window)
