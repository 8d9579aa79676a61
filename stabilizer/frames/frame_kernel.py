"""The frame program on GPUs: one Pallas kernel runs a whole op table for a block of shots.

`stabilizer.frames.frames` runs an op table as a `lax.scan` whose step is about 33 small XLA kernels
and a read of the op kind by the host (126 us an op on an H100, where NVIDIA's cuStabilizer takes a
few): launch and control cost, not arithmetic. Here each program of the kernel owns BLOCK_WORDS words
of shots and walks the table's ops in order, all in one launch; a REPEAT block is a loop of launches.

Each op kind, for the program's block of words:
  GATE        tiles of TILE slots: gather the slots' frame rows, XOR the generators' images, scatter back
  MEASURE     tiles: the record rows take the x bits, reset slots clear x and every slot's z takes a
              random word (the frame's random copy of the new stabilizer); then the flip noise
  NOISE       sparse: the words (slot, word) with a hit are drawn by geometric skipping (Stim skips
              bits; a word is hit with 1 - (1 - p)^32), then the hit bits inside each such word and an
              event for each hit; each hit word is read, XORed and written back once
  CORRELATED  the firing shots drawn sparsely into a scratch row, the E / ELSE chain updated, the
              Pauli XORed into its slots' rows
  FEEDBACK    tiles: the Pauli, where the looked-back record row is set
  MPAD        the flip noise on the record rows

Ops are ordered by a barrier between them: different threads of a program touch the same words from
op to op. Within an op no two lanes touch one word (slots are on distinct qubits, hit words distinct),
so no atomics are needed (Triton's are acquire-release, a fence each).

Randomness is counter-based: JAX's Threefry-2x32 (`threefry2x32`, the same function as
`jax.extend.random.threefry_2x32`) keyed per op and program by the op counter and the program index,
then counted by round and lane. Draws are exact to float64 rounding, as in `frames`, but the stream
is not `frames`' (a seed gives other shots on a GPU than on a CPU); the tests check this kernel, run
by Pallas's interpreter, against the same properties as the scan (Stim's rates, deterministic flips).

Pallas's Triton backend (deprecated in jax 0.11 in favour of Mosaic GPU) compiles it on GPUs; with
`interpret=True` it runs anywhere (the tests), the same code.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ..circuits.program import CORRELATED, FEEDBACK, GATE, MEASURE, MPAD, NOISE, gate_catalogue, pair_codes
from ..tableau.kernels import lane_mask

BLOCK_WORDS = 32  # words of shots a program owns (a 128-byte row segment)
TILE = 32  # slots a tile
HITS = 128  # hit words drawn a round
NUM_WARPS = 4
PAIR_CODES = tuple(int(c) for c in pair_codes()[:15])  # x_a | z_a << 1 | x_b << 2 | z_b << 3 of the 15 events
_WORD, _BIT, _EVENT, _RESET = range(4)  # counter streams: word gaps, bit gaps, events, reset words


def block_words(words: int) -> int | None:
    """Words a program owns for frames of `words` words (a power of two dividing it), or None."""
    b = min(words, BLOCK_WORDS)
    return b if b & (b - 1) == 0 and words % b == 0 else None


def threefry2x32(k0, k1, c0, c1):
    """JAX's Threefry-2x32 (20 rounds) of the counter (c0, c1) under the key (k0, k1), uint32 scalars or
    arrays: elementwise ops only, so that it runs inside a kernel."""
    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = c0 + k0, c1 + k1
    for r in range(5):
        for s in ((13, 15, 26, 6), (17, 29, 16, 24))[r % 2]:
            x0 = x0 + x1
            x1 = (x1 << jnp.uint32(s)) | (x1 >> jnp.uint32(32 - s))
            x1 = x1 ^ x0
        x0 = x0 + ks[(r + 1) % 3]
        x1 = x1 + ks[(r + 2) % 3] + jnp.uint32(r + 1)
    return x0, x1


def _uniform(h0, h1):
    """float64 uniform in [0, 1) from 64 random bits (as `frames.uniform64`)."""
    u = h0.astype(jnp.float64) * 2.0**-32 + h1.astype(jnp.float64) * 2.0**-64
    return jnp.minimum(u, 1.0 - 2.0**-53)


def tables_for_kernel(table) -> dict:
    """A lowered op table (`stabilizer.circuits.program`) as the kernel reads it: int32 and float64
    arrays, one row an op (active slots come first in every op, as the lowering writes them)."""
    kind = table["kind"].astype(jnp.int32)
    probs = table["probs"].astype(jnp.float64)
    total = jnp.where(kind == NOISE, jnp.sum(probs, axis=1), probs[:, 0])
    nonzero = probs > 0
    last = probs.shape[1] - 1 - jnp.argmax(nonzero[:, ::-1], axis=1)  # rounding must not pick a zero event past it
    i32 = lambda a: a.astype(jnp.int32)
    return {
        "kind": kind, "nslots": i32(jnp.sum(table["active"], axis=1)), "q": i32(table["q"]),
        "fwd": i32(jnp.asarray(gate_catalogue()[1])[i32(table["gate"][:, 0])][:, jnp.array([1, 2, 4, 8])]), "rec": i32(table["rec"]),
        "flags": i32(table["reset"]) | i32(table["px"]) << 1 | i32(table["pz"]) << 2 | i32(table["active"]) << 3,
        "advance": i32(table["advance"]), "is_else": i32(table["is_else"]), "last": i32(last),
        "total": total, "log1mp": jnp.log1p(-jnp.minimum(total, 1.0)), "cum": jnp.cumsum(probs, axis=1),
    }


def _concatenated(structure, tables):
    """All op tables of a program as one table (`tables_for_kernel`), and the structure with each
    table replaced by its (first op, ops): every launch of a program runs the same kernel, compiled once."""
    flat = []

    def walk(structure, tables):
        out = []
        for shape, table in zip(structure, tables):
            if shape == "table":
                first = sum(len(t["kind"]) for t in flat)
                flat.append(table)
                out.append((first, len(table["kind"])))
            else:
                out.append(("repeat", shape[1], walk(shape[2], table)))
        return tuple(out)

    spans = walk(structure, tables)
    table = {k: jnp.concatenate([jnp.asarray(t[k]) for t in flat]) for k in flat[0]}
    return tables_for_kernel(table), spans


_TABLE_NAMES = ("kind", "nslots", "q", "fwd", "rec", "flags", "advance", "is_else", "last", "total", "log1mp", "cum")


def _kernel(*refs, width, spare, zero_row, bw, interpret):
    t = dict(zip(_TABLE_NAMES, refs))
    state_ref = refs[len(_TABLE_NAMES)]
    x_ref, z_ref, record_ref, chain_ref = refs[-4:]
    j = pl.program_id(0)
    lanes = jnp.arange(HITS, dtype=jnp.uint32)
    key0, key1, counter0 = state_ref[0], state_ref[1], state_ref[2]
    first, ops = state_ref[4].astype(jnp.int32), state_ref[5].astype(jnp.int32)

    def barrier():
        if not interpret:
            plgpu.debug_barrier()

    words = j * bw + jnp.arange(bw, dtype=jnp.int32)  # the block's words, as indices (gathers need arrays)

    def load(ref, rows):
        """ref[rows, block] as (len(rows), bw)."""
        return ref[rows[:, None], words[None, :]]

    def store(ref, rows, value, ok, sink):
        """ref[rows, block] = value where ok; rows not ok point at `sink` (never read back), so that the
        interpreter's whole-array writes cannot land on a row another lane writes."""
        rows = jnp.where(ok, rows, sink)
        plgpu.store(ref.at[rows[:, None], words[None, :]], value, mask=jnp.broadcast_to(ok[:, None], value.shape))

    def xor_words(ref, rows, cols, values, ok, sink):
        """ref[rows[h], cols[h]] ^= values[h] where ok[h] (the (row, word) pairs of a round are distinct)."""
        rows = jnp.where(ok, rows, sink)
        plgpu.store(ref.at[rows, cols], ref[rows, cols] ^ values, mask=ok)

    def slot_tiles(i, body):
        """body(s (TILE,) slot indices clipped to the table, ok (TILE,)) over the op's active slots."""
        k = t["nslots"][i]

        def tile(tt, _):
            s = tt * TILE + jnp.arange(TILE, dtype=jnp.int32)
            body(jnp.minimum(s, width - 1), s < k)

        lax.fori_loop(0, (k + TILE - 1) // TILE, tile, None)

    def uniform(key, stream, r, k):
        """HITS float64 uniforms of counter stream (4 bits), round r, iteration k (< 64)."""
        c0 = jnp.uint32(stream << 28) | r.astype(jnp.uint32) << 6 | jnp.asarray(k).astype(jnp.uint32)
        return _uniform(*threefry2x32(key[0], key[1], c0, lanes))

    def hit_words(i, kind, key, base):
        """The op's noise, one code for every kind that draws any: each position (slot, word, bit) of the
        block's rows of the op's slots (CORRELATED: of the block's shots) is hit independently with
        probability p = total[i], and a hit takes an event (NOISE: one of the 15 pair Paulis by cum[i];
        else a lone flip). Words are skipped geometrically (a word is hit with q = 1 - (1 - p)^32; Stim
        skips bits, the same distribution), HITS words a round; in a hit word the first hit bit is drawn
        given that there is one, the rest by skipping bits. Each round's hit words are distinct, and
        each is read, XORed with its event planes' bits and written back once: NOISE into the frames,
        MEASURE and MPAD into their record rows, CORRELATED into the chain's scratch row."""
        log1mp = t["log1mp"][i]  # log(1 - p)
        q = -jnp.expm1(32 * log1mp)
        end = jnp.where(kind == CORRELATED, 1, t["nslots"][i]).astype(jnp.int64) * bw

        def event_codes(r, k):
            u = uniform(key, _EVENT, r, k) * t["total"][i]
            event = jnp.minimum(sum((u >= t["cum"][i, e]).astype(jnp.int32) for e in range(14)), t["last"][i])
            code = jnp.zeros_like(event)
            for e, c in enumerate(PAIR_CODES):
                code = jnp.where(event == e, c, code)
            return code

        def add(masks, pos, hit, r, k):
            code = lax.cond(kind == NOISE, event_codes, lambda r, k: jnp.ones((HITS,), jnp.int32), r, k)
            bit = jnp.uint32(1) << jnp.minimum(pos, 31).astype(jnp.uint32)
            return tuple(m | jnp.where(hit & ((code >> b) & 1 == 1), bit, jnp.uint32(0)) for b, m in enumerate(masks))

        def apply(slot, cols, masks, ok):
            @pl.when(kind == NOISE)
            def _():
                qa, qb = t["q"][i, slot, 0], t["q"][i, slot, 1]
                for m, ref, rows in zip(masks, (x_ref, z_ref, x_ref, z_ref), (qa, qa, qb, qb)):
                    xor_words(ref, rows, cols, m, ok & (rows != spare), spare)

            @pl.when((kind == MEASURE) | (kind == MPAD))
            def _():
                rows, has = record_rows(i, slot, base)
                xor_words(record_ref, rows, cols, masks[0], ok & has, zero_row)

            @pl.when(kind == CORRELATED)
            def _():
                xor_words(chain_ref, jnp.ones_like(cols), cols, masks[0], ok, 0)

        def draw(c):
            start, r = c
            gap = jnp.floor(jnp.log1p(-uniform(key, _WORD, r, 0)) / (32 * log1mp))
            gap = jnp.minimum(gap, end.astype(jnp.float64)).astype(jnp.int64)
            where = start + jnp.cumsum(gap + 1) - 1
            ok = where < end
            first = jnp.floor(jnp.log1p(-uniform(key, _BIT, r, 0) * q) / log1mp)
            pos = jnp.minimum(first, 31.0).astype(jnp.int32)
            masks = add((jnp.zeros((HITS,), jnp.uint32),) * 4, pos, ok, r, 0)

            def more(c):
                pos, masks, k = c
                gap = jnp.floor(jnp.log1p(-uniform(key, _BIT, r, k)) / log1mp)
                pos = pos + 1 + jnp.minimum(gap, 32.0).astype(jnp.int32)
                return pos, add(masks, pos, ok & (pos < 32), r, k), k + 1

            busy = lambda c: jnp.max((ok & (c[0] < 31)).astype(jnp.int32)) > 0  # Triton lowers no reduce_or
            _, masks, _ = lax.while_loop(busy, more, (pos, masks, jnp.int32(1)))
            apply(jnp.minimum(where // bw, width - 1).astype(jnp.int32), j * bw + (where % bw).astype(jnp.int32),
                  masks, ok)
            return jnp.max(where) + 1, r + 1

        @pl.when(t["total"][i] > 0)
        def _():
            lax.while_loop(lambda c: c[0] < end, draw, (jnp.int64(0), jnp.int32(0)))

    def record_rows(i, s, base):
        rec = t["rec"][i, s]
        return jnp.where(rec >= 0, base + rec, zero_row), rec >= 0

    # ---- what each op kind does before its noise: (op index, measurements so far, key) -> None --------

    def gate(i, base, key):
        images = [t["fwd"][i, g] for g in range(4)]

        def body(s, ok):
            qa, qb = t["q"][i, s, 0], t["q"][i, s, 1]
            bits = [load(x_ref, qa), load(z_ref, qa), load(x_ref, qb), load(z_ref, qb)]
            outs = [jnp.zeros_like(bits[0]) for _ in range(4)]
            for g in range(4):  # up to sign a Clifford is linear on the frame's bits
                for b in range(4):
                    outs[b] = outs[b] ^ (bits[g] & lane_mask((images[g] >> b) & 1))
            two = ok & (qb != spare)
            store(x_ref, qa, outs[0], ok, spare)
            store(z_ref, qa, outs[1], ok, spare)
            store(x_ref, qb, outs[2], two, spare)
            store(z_ref, qb, outs[3], two, spare)

        slot_tiles(i, body)

    def measure(i, base, key):
        def body(s, ok):
            qa = t["q"][i, s, 0]
            xa, za = load(x_ref, qa), load(z_ref, qa)
            rows, has = record_rows(i, s, base)
            store(record_ref, rows, xa, ok & has, zero_row)
            element = (s[:, None] * bw + jnp.arange(bw, dtype=jnp.int32)[None, :]).astype(jnp.uint32)
            rand, _ = threefry2x32(key[0], key[1], jnp.uint32(_RESET << 28), element)
            reset = lane_mask((t["flags"][i, s] & 1)[:, None])
            store(x_ref, qa, xa & ~reset, ok, spare)
            store(z_ref, qa, (za & ~reset) ^ rand, ok, spare)

        slot_tiles(i, body)

    def pauli(i, masks):
        """XOR each active slot's Pauli (flags px, pz), where masks(s) is set, into its q0 rows."""
        def body(s, ok):
            flags = t["flags"][i, s]
            ok = ok & ((flags >> 3) & 1 == 1)
            qa, m = t["q"][i, s, 0], masks(s)
            store(x_ref, qa, load(x_ref, qa) ^ (m & lane_mask(((flags >> 1) & 1)[:, None])), ok, spare)
            store(z_ref, qa, load(z_ref, qa) ^ (m & lane_mask(((flags >> 2) & 1)[:, None])), ok, spare)

        slot_tiles(i, body)

    def feedback(i, base, key):
        def masks(s):
            active = (t["flags"][i, s] >> 3) & 1 == 1
            return load(record_ref, jnp.where(active, base - t["rec"][i, s], zero_row))

        pauli(i, masks)

    scratch, chain_row, everywhere = jnp.ones((1,), jnp.int32), jnp.zeros((1,), jnp.int32), jnp.ones((1,), bool)

    def correlated(i, base, key):  # the firing shots are drawn into the scratch row
        store(chain_ref, scratch, jnp.zeros((1, bw), jnp.uint32), everywhere, 1)

    def fire_correlated(i):
        fire, chain = load(chain_ref, scratch), load(chain_ref, chain_row)
        is_else = t["is_else"][i] == 1
        fire = jnp.where(is_else, fire & ~chain, fire)
        store(chain_ref, chain_row, jnp.where(is_else, chain | fire, fire), everywhere, 0)
        pauli(i, lambda s: jnp.broadcast_to(fire, (TILE, bw)))

    nothing = lambda i, base, key: None
    branches = [nothing] * 6
    branches[GATE], branches[MEASURE], branches[CORRELATED], branches[FEEDBACK] = gate, measure, correlated, feedback

    def op(i, base):
        kind = t["kind"][i]
        key = threefry2x32(key0, key1, counter0 + (i - first).astype(jnp.uint32), j.astype(jnp.uint32))
        lax.switch(kind, [lambda i, base, k0, k1, f=f: f(i, base, (k0, k1)) for f in branches], i, base, *key)
        barrier()
        hit_words(i, kind, key, base)

        @pl.when(kind == CORRELATED)
        def _():
            barrier()
            fire_correlated(i)

        barrier()
        return base + t["advance"][i]

    lax.fori_loop(first, first + ops, op, state_ref[3].astype(jnp.int32))


def run_table(table: dict, span, x, z, record, chain, key_data, counter, base, interpret: bool = False):
    """Run ops span = (first, count) of a table (`tables_for_kernel`) on frames x, z (Q + 1, W), the
    record (M + 1, W) and the chain rows (2, W): row 0 the E / ELSE chain, row 1 scratch. counter: ops
    run so far (uint32), base: measurements so far (int32). Returns the four arrays, updated in place."""
    words = x.shape[1]
    bw = block_words(words)
    if bw is None:
        raise ValueError(f"frames of {words} words cannot be blocked")
    state = jnp.stack([key_data[0], key_data[1], counter, base.astype(jnp.uint32), *map(jnp.uint32, span)])
    kernel = partial(_kernel, width=table["q"].shape[1], spare=x.shape[0] - 1, zero_row=record.shape[0] - 1,
                     bw=bw, interpret=interpret)
    arrays = [table[name] for name in _TABLE_NAMES] + [state, x, z, record, chain]
    first = len(_TABLE_NAMES) + 1
    return pl.pallas_call(
        lambda *refs: kernel(*refs[:first], *refs[-4:]),
        grid=(words // bw,),
        out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, z, record, chain)),
        input_output_aliases={first + k: k for k in range(4)},
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
    )(*arrays)


def run_segments(structure, tables, x, z, record, key_data, interpret: bool = False):
    """A lowered program's segments (`stabilizer.circuits.program`) on the frames and record: a kernel
    launch per op table, a `lax.fori_loop` of launches per REPEAT. Returns the record."""
    if not structure:
        return record
    table, spans = _concatenated(structure, tables)
    carry = (x, z, record, jnp.zeros((2, x.shape[1]), jnp.uint32), jnp.uint32(0), jnp.int32(0))
    advance = jnp.cumsum(table["advance"], dtype=jnp.int32)

    def walk(spans, carry):
        for span in spans:
            if span[0] != "repeat":
                x, z, record, chain, counter, base = carry
                x, z, record, chain = run_table(table, span, x, z, record, chain, key_data, counter, base, interpret)
                first, count = span
                advanced = advance[first + count - 1] - (advance[first - 1] if first else 0)
                carry = (x, z, record, chain, counter + jnp.uint32(count), base + advanced)
            else:
                _, count, inner = span
                carry = lax.fori_loop(0, count, lambda _, c, inner=inner: walk(inner, c), carry)
        return carry

    return walk(spans, carry)[2]
