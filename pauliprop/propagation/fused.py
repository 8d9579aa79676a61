"""A rotation pass as GPU kernels (Pallas on Triton): a few launches where XLA ran about sixty a tile.

XLA runs a pass of the tiled engine (pairing.pair, tiled._mix, tiled.compact) as some sixty kernels a
tile: the pairing's rounds of scatter-min and gathers, the mix's gathers, scatters and sums, the
compaction's prefix count and scatters, each reading its operands from memory and writing them back.
On one H200 (2026-11-28, 2D Ising 4x4, tiles of 2^18 words) that was 380 ms of kernels, about 2.5 us
each, where a tile's bytes move in a few microseconds. Here a pass (`rotation_pass`) is ten launches
of a fixed number of programs (`programs`: a few a streaming multiprocessor), program p taking the
blocks of BLOCK live words p, p + P, p + 2 P, ..., so that a pass over a few words launches no idle
programs by the thousand and one over millions takes every block in one launch:

  insert   each word finds whether it turns in this pass and by which rotation (tiled.turning_at), and
           its pair's home slot (the canonical member's hash, pairing.hash_lanes); the canonical members go
           into the table by linear probing with atomic exchanges: a word swaps itself into a slot and
           carries on with what it displaced until it displaces nothing. Slots never empty again, so
           every member stays reachable from its home along taken slots.
  lookup   (once every insert is done) each other turning word walks its partner's probe
           sequence to an empty slot; found, the two hold each other's slot, else it is UNPAIRED.
  count, offsets, mix
           the appended words each block keeps; their prefix sum in block order by one program
           (`offsets`), so the appended words come in tiled._mix's order whatever order the programs run
           in; then each pair mixed in place by its lower member, each lone word scaled and its partner
           appended at the block's offset, the rules' drops marked gone and charged, the table cleared.
  pass end one program sums what the others counted: the live words, whether the pass fitted, the rules'
           drops (XLA's reductions and scalar ops between the kernels were as many launches as the kernels:
           each a node of the CUDA graph, a few microseconds, and a pass over few words is mostly such nodes).
  holes, offsets, fill
           the compaction: the staying words past the new end fill the holes below it, the r-th the
           r-th (only those words move; the order of the live words is not kept).
  clifford (a unit of its own) each word through a Clifford run's gates one after the other in
           registers, the weight rule after every gate (where XLA ran a few kernels a gate).

The answer is the XLA passes', word for word (tests/pauliprop/propagation/test_fused.py, by Pallas's
interpreter; on a GPU to rounding, Triton contracting products into FMAs). No two lanes of a launch
write one slot: a pair is written by its lower member alone, appended and placed words go to distinct
slots. Lanes that write nothing point past the buffer (its capacity), where a GPU's masked store never
goes and the interpreter's scatter drops the write.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ..runtime import mlir_dialects
from . import pairing, schedule
from .truncation import Limits, Rules, violations

mlir_dialects.register()  # the kernels' lowering without a failed import an op

BLOCK = 1024  # words a program handles
# 8 warps: 4 of a block's words a thread, where 4 warps held 8, so LLVM and ptxas see each op half as often. With
# the loops in the mix's table clear and in `offsets` (one H100, 2026-12-06, experiments/HISTORY): the kicked
# Ising's program compiled in 1.2-2.1 s against 1.9-2.7 s, and every workload ran 2.7-6% faster warm (on 4 warps
# those loops alone ran the 8x8 0.9% slower)
NUM_WARPS = 8
PROGRAMS_PER_CORE = 4  # a pass's launches: this many programs a streaming multiprocessor, each taking every P-th block
FEW = 4  # a layer of at most this many rotations finds the ones a word anticommutes with rotation by rotation
FEW_LANES = 2  # ... on words of at most this many lanes: that code is unrolled over rotations and lanes (the kicked
#                Ising's insert kernel, 4 lanes, 122 kB of PTX with it against 90 kB; its layers are of one-qubit
#                rotations, which never take it)
INTERPRET_PROGRAMS = 2  # the interpreter's (tests: fewer than the blocks, so that programs take several)


def block(tile: int) -> int:
    return min(BLOCK, tile)


def _popcount(a):
    """int32 set bits of uint32 words (Triton's popcount takes int32)."""
    return lax.population_count(lax.bitcast_convert_type(a, jnp.int32))


def _product_sign(x, z, gx, gz):
    """words.product_sign on lanes (lists of (bw,) uint32): s with i G P = s (P xor G) for anticommuting
    G = (gx, gz) and P = (x, z)."""
    e = sum(_popcount(gx[k] & gz[k]) + _popcount(x[k] & z[k]) - _popcount((x[k] ^ gx[k]) & (z[k] ^ gz[k]))
            + 2 * _popcount(gz[k] & x[k]) for k in range(len(x)))
    return jnp.where(((e + 1) & 3) == 0, 1.0, -1.0)


def _rules(rules: Rules, lim_i, lim_f) -> Limits:
    """The limits inside a kernel from their refs: max_weight, max_sins in lim_i, min_abs_coeff in lim_f
    (None where the rule is off)."""
    return Limits(max_weight=lim_i[0] if rules.max_weight else None,
                  min_abs_coeff=lim_f[0] if rules.min_abs_coeff else None,
                  max_sins=lim_i[1] if rules.max_sins else None)


def _dropped(limits: Limits, coeffs, weights, sins, candidate):
    """(keep mask, the magnitude each rule (weight, coefficient, sines) drops of each candidate, None where the
    rule is off): the caller sums a rule's drops of all its candidates at once, a reduction a rule (each
    reduction was the mix kernel's largest code: nine a tile where three do)."""
    drops = violations(limits, coeffs, weights, sins)
    mag = jnp.abs(coeffs)
    on = (limits.max_weight, limits.min_abs_coeff, limits.max_sins)
    return (candidate & ~drops[0] & ~drops[1] & ~drops[2],
            tuple(None if rule is None else jnp.where(candidate & d, mag, 0) for rule, d in zip(on, drops)))


def programs(cfg) -> int:
    """The programs of a pass's launches: PROGRAMS_PER_CORE a streaming multiprocessor of the GPU (the
    interpreter: INTERPRET_PROGRAMS), at most one a block of the buffers."""
    count = INTERPRET_PROGRAMS if cfg.fused == "interpret" else PROGRAMS_PER_CORE * _cores()
    count = min(count, cfg.capacity // block(cfg.tile))
    return 1 << (max(1, count).bit_length() - 1)  # a power of two: a kernel reads every program's statistics as one vector


def _cores() -> int:
    return getattr(jax.devices()[0], "core_count", 0) or 132


def _over_blocks(n, bw: int, block_body, start=0):
    """block_body(b, first slot) for the blocks b of bw words from `start` on that hold live words (below n),
    program p taking blocks p, p + P, p + 2 P, ... (P programs): a launch's programs are as many whatever n, so
    a pass over a few words launches no idle programs by the thousand."""
    pid, count = pl.program_id(0), pl.num_programs(0)
    blocks = (n + bw - 1) // bw - start

    def one(j, carry):
        b = start + pid + j * count
        block_body(b, b * bw)
        return carry

    lax.fori_loop(0, (blocks - pid + count - 1) // count, one, ())  # no carry: Triton's loop yields no constants


def _kernel(scal, paired, lim_i, lim_f, gens, cos, sin, base, partner, rot, slot, words_in, coeffs_in, sins_in, gone_in,
            table_in, *outs, lanes: int, bw: int, rules: Rules, sins_on: bool, count_only: bool):
    """One program: its blocks of the live words (`_over_blocks`). scal: the pass's (`rotation_pass`);
    paired: the pairing's statistics (every program's turning words: whether the pass fits).
    count_only: the appended words the block keeps, into counts[b]; else the mix, with block b's appended
    words from base[b] on, and stats[pid] = (the 1-norm each rule dropped, words marked gone)."""
    if count_only:
        (counts,) = outs
    else:
        words, coeffs, sins, gone, table, stats = outs
        words_in, coeffs_in, sins_in = words, coeffs, sins  # the same buffers (aliased)
    pid = pl.program_id(0)
    cap = coeffs_in.shape[0]
    n, row = scal[0], scal[2]
    fits = _fits(n, paired, cap)
    most = 32 * lanes  # rows of a unit's layer tables
    if not count_only:
        for k in range(4):
            stats[pid, k] = jnp.zeros((), stats.dtype)

    def run(b, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        sink = jnp.full(i.shape, cap, jnp.int32)
        limits = _rules(rules, lim_i, lim_f)
        p, r = partner[i], rot[i]
        t = (i < n) & (p != pairing.NOT_TURNING)
        lone = t & (p == pairing.UNPAIRED)
        r = row * most + jnp.where(t, r, 0)
        # only the words that write read their words, coefficients and sines (the count: the lone ones), so a
        # block's lines where none does are not fetched
        reads = lone if count_only else t
        w = [plgpu.load(words_in.at[i, k], mask=reads, other=0) for k in range(2 * lanes)]
        g = [gens[r, k] for k in range(2 * lanes)]
        x, z, gx, gz = w[:lanes], w[lanes:], g[:lanes], g[lanes:]
        c = plgpu.load(coeffs_in.at[i], mask=reads, other=0)
        dtype = c.dtype
        sgn = _product_sign(x, z, gx, gz).astype(dtype)  # i G P = sgn (P xor G)
        s = plgpu.load(sins_in.at[i], mask=reads, other=0)
        weight_p = sum(_popcount(x[k] | z[k]) for k in range(lanes))
        weight_q = sum(_popcount((x[k] ^ gx[k]) | (z[k] ^ gz[k])) for k in range(lanes))
        cs, sn = cos[r].astype(dtype), sin[r].astype(dtype)
        spawn = sn * sgn * c
        keep_spawn, lost_spawn = _dropped(limits, spawn, weight_q, s + 1, lone)
        if count_only:
            counts[b] = jnp.sum(keep_spawn.astype(jnp.int32))
            return
        # the table cleared whether the pass fits or not: each slot the pass took (`_insert_kernel`'s ~slot), where
        # clearing its whole part wrote 2 LOAD slots a word
        taken = slot[i]
        took = (i < n) & (taken < 0)
        plgpu.store(table.at[jnp.where(took, ~taken, table_in.shape[0])], jnp.full(i.shape, pairing.EMPTY, jnp.int32),
                    mask=took)
        lead = t & (p >= 0) & (i < p)  # the lower slot of a pair writes both
        q = jnp.where(lead, p, cap)
        cq = plgpu.load(coeffs_in.at[q], mask=lead, other=0)
        sq = plgpu.load(sins_in.at[q], mask=lead, other=0) if sins_on else s
        mine = jnp.where(lead, cs * c - sn * sgn * cq, cs * c)  # i G Q = -sgn P for the partner Q of P
        theirs = cs * cq + sn * sgn * c
        my_sins = jnp.where(lead, jnp.minimum(s, sq + 1), s)
        their_sins = jnp.minimum(sq, s + 1)
        keep_mine, lost_mine = _dropped(limits, mine, weight_p, my_sins, lead | lone)
        keep_theirs, lost_theirs = _dropped(limits, theirs, weight_q, their_sins, lead)
        for k in range(3):
            if lost_mine[k] is not None:
                stats[pid, k] += jnp.sum(lost_mine[k] + lost_theirs[k] + lost_spawn[k]).astype(stats.dtype)
        mine_at = (lead | lone) & fits
        lead = lead & fits
        keep_spawn = keep_spawn & fits
        drop_mine = mine_at & ~keep_mine
        drop_theirs = lead & ~keep_theirs
        stats[pid, 3] += jnp.sum(drop_mine.astype(jnp.int32) + drop_theirs.astype(jnp.int32)).astype(stats.dtype)
        dest = jnp.where(keep_spawn, base[b] + jnp.cumsum(keep_spawn.astype(jnp.int32)) - 1, cap)
        mine_i = jnp.where(mine_at, i, sink)
        plgpu.store(coeffs.at[mine_i], mine, mask=mine_at)
        plgpu.store(coeffs.at[q], theirs, mask=lead)
        plgpu.store(coeffs.at[dest], spawn, mask=keep_spawn)
        one = jnp.ones(i.shape, jnp.uint8)
        plgpu.store(gone.at[jnp.where(drop_mine, i, sink)], one, mask=drop_mine)
        plgpu.store(gone.at[jnp.where(drop_theirs, q, sink)], one, mask=drop_theirs)
        for k in range(2 * lanes):
            plgpu.store(words.at[dest, k], w[k] ^ g[k], mask=keep_spawn)
        if sins_on:
            plgpu.store(sins.at[mine_i], my_sins, mask=mine_at)
            plgpu.store(sins.at[q], their_sins, mask=lead)
            plgpu.store(sins.at[dest], s + 1, mask=keep_spawn)

    _over_blocks(n, bw, run)


def _fits(n, paired, cap: int):
    """Whether a pass's appended words fit: the live words and every turning one (`_insert_kernel`'s
    statistics, a row a program) fit in the capacity (a bound: counting the appended words exactly would
    cost a pass a wait)."""
    return n + jnp.sum(paired[:, 0]) <= cap


def limit_arrays(limits: Limits, dtype):
    """The rules' values as the mix kernel reads them: (max_weight, max_sins) and (min_abs_coeff,)."""
    lim_i = jnp.stack([jnp.asarray(limits.max_weight if limits.max_weight is not None else 0, jnp.int32),
                       jnp.asarray(limits.max_sins if limits.max_sins is not None else 0, jnp.int32)])
    lim_f = jnp.asarray(limits.min_abs_coeff if limits.min_abs_coeff is not None else 0, dtype)[None]
    return lim_i, lim_f


def _launch(work, scal, paired, base, layers, lims, cfg, count_only: bool):
    lanes = work.words.shape[1] // 2
    bw = block(cfg.tile)
    grid = (programs(cfg),)
    cap = work.coeffs.shape[0]
    kernel = partial(_kernel, lanes=lanes, bw=bw, rules=cfg.rules, sins_on=cfg.rules.max_sins,
                     count_only=count_only)
    gens, cos, sin = _flat(layers.gens), _flat(layers.cos), _flat(layers.sin)
    args = (scal, paired, *lims, gens, cos, sin, base, work.partner, work.rot, work.slot, work.words, work.coeffs,
            work.sins, work.gone, work.table)
    interpret, params = _mode(cfg)
    if count_only:
        return pl.pallas_call(kernel, grid=grid, out_shape=jax.ShapeDtypeStruct((cap // bw,), jnp.int32),
                              compiler_params=params, interpret=interpret)(*args)
    first = len(args) - 5
    outs = (work.words, work.coeffs, work.sins, work.gone, work.table)
    out_shape = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs) + (
        jax.ShapeDtypeStruct(grid + (4,), work.coeffs.dtype),)
    words, coeffs, sins, gone, table, stats = pl.pallas_call(
        kernel, grid=grid, out_shape=out_shape, input_output_aliases={first + k: k for k in range(5)},
        compiler_params=params, interpret=interpret)(*args)
    return work._replace(words=words, coeffs=coeffs, sins=sins, gone=gone, table=table), stats


def _pass_end_kernel(scal, paired, added, mixed, dropped_in, peak_in, compaction, after, live, step, need, most, dropped,
                     peak):
    """One program: what a pass leaves, from its kernels' statistics: the compaction's scalars (its live words
    and what stays of them; both 0 where nothing is gone), the next pass's scalars (`pass_scalars`), the live
    words, the next pass, slots needed (0: it fitted), the most passes a word of the layer takes, the 1-norm
    each rule dropped (added to dropped_in; nothing where the pass did not fit: it wrote nothing) and the most
    live words. Separate outputs, read by the loop as they are: a scalar sliced out of one, or an XLA op
    between the kernels, is a node of the CUDA graph and a few microseconds a pass."""
    n = scal[0]
    fits = _fits(n, paired, scal[5])
    total = n + jnp.where(fits, added[0], 0)
    gone = jnp.where(fits, jnp.sum(mixed[:, 3]).astype(jnp.int32), 0)
    stays = total - gone
    short = jnp.where(fits, 0, n + jnp.sum(paired[:, 0]))
    stepped = jnp.where(short > 0, scal[1], scal[1] + 1)
    compaction[0] = jnp.where(gone > 0, total, 0)
    compaction[1] = jnp.where(gone > 0, stays, 0)
    after[0] = stays
    after[1] = stepped
    for k in range(2, after.shape[0]):
        after[k] = scal[k]
    live[0] = stays
    step[0] = stepped
    need[0] = short
    most[0] = jnp.max(paired[:, 1])
    for k in range(dropped.shape[0]):
        lost = jnp.where(fits, jnp.sum(mixed[:, k]), 0).astype(dropped.dtype) if k < 3 else 0
        dropped[k] = dropped_in[k] + lost
    peak[0] = jnp.maximum(peak_in[0], stays)


def pass_scalars(n, step, layers, row, capacity: int):
    """The scalars of a layer's pass `step` over n live words, as its kernels read them: (n, step, the unit's row
    of the layer tables, whether its generators each act on one qubit, whether its rotations come in decreasing
    order, the capacity, whether it has at most FEW rotations)."""
    return _scalars(n, step, row, layers.single[row], layers.down[row], capacity, layers.few[row])


def rotation_pass(work, scal, layers, lims, dropped, peak, cfg):
    """A layer's pass (tiled.rotation_unit's) by kernels: the pairing (`pair`), the mix (tiled._mix's results:
    the appended words, the rules' drops, the table left empty), what the pass leaves summed by one small
    kernel, and the compaction, so that XLA adds no launches of its own between them (each a graph node of a
    few microseconds: a pass over a few hundred words is mostly such nodes). scal: `pass_scalars`; lims:
    `limit_arrays` of the unit's rules. Returns (work, the next pass's scalars, live words, the next pass,
    slots needed (0: it fitted), the most passes a word of the layer takes, dropped (5,), peak)."""
    work, paired = pair(work, scal, layers, cfg)
    counts = _launch(work, scal, paired, scal, layers, lims, cfg, count_only=True)  # (reads no offsets)
    base, added = offsets(counts, scal, cfg, start_at=0)
    work, mixed = _launch(work, scal, paired, base, layers, lims, cfg, count_only=False)
    interpret, params = _mode(cfg)
    one = jax.ShapeDtypeStruct((1,), jnp.int32)
    compaction, after, live, step, need, most, dropped, peak = pl.pallas_call(
        _pass_end_kernel, grid=(1,), interpret=interpret, compiler_params=params,
        out_shape=(jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct(scal.shape, jnp.int32), one, one, one,
                   one, jax.ShapeDtypeStruct(dropped.shape, dropped.dtype), one))(
        scal, paired, added, mixed, dropped, peak.reshape(1))
    work = _compaction(work, compaction, cfg)
    return work, after, live[0], step[0], need[0], most[0], dropped, peak[0]


def _offsets_kernel(scal, counts, base, total, *, bw: int, start_at):
    """One program: base[b] = start + the counts before block b, for the blocks of the first scal[0] words (the
    counts of later ones are never written: read as 0), and their total; for each channel c of counts (blocks,
    channels) on its own. start: scal[start_at], or 0 where start_at is None."""
    chunk = min(counts.shape[0], BLOCK)  # scans of BLOCK counts, carried: one scan of 4,096 made 150 kB of PTX
    blocks = (scal[0] + bw - 1) // bw
    start = jnp.int32(0) if start_at is None else scal[start_at]

    for c in range(counts.shape[1]):
        def part(j, running, c=c):
            at = j * chunk + jnp.arange(chunk, dtype=jnp.int32)
            v = jnp.where(at < blocks, counts[pl.ds(j * chunk, chunk), c], 0)
            base[pl.ds(j * chunk, chunk), c] = running + jnp.cumsum(v, dtype=jnp.int32) - v
            return running + jnp.sum(v, dtype=jnp.int32)

        total[c] = lax.fori_loop(jnp.int32(0), (blocks + chunk - 1) // chunk, part, start) - start


def offsets(counts, scal, cfg, start_at=None):
    """(start + the counts of the blocks before each block; their total) of the blocks that hold the first
    scal[0] words, for counts (blocks[, channels]: each channel on its own); start = scal[start_at] (None: 0).
    One small kernel (XLA's prefix sum over every block, 65,536 counts at 2^26 slots, took 10 us of a pass on an
    H200)."""
    interpret, params = _mode(cfg)
    flat = counts.ndim == 1
    counts = counts[..., None] if flat else counts
    base, total = pl.pallas_call(
        partial(_offsets_kernel, bw=block(cfg.tile), start_at=start_at), grid=(1,), interpret=interpret,
        compiler_params=params,
        out_shape=(jax.ShapeDtypeStruct(counts.shape, jnp.int32), jax.ShapeDtypeStruct(counts.shape[1:], jnp.int32)))(
        scal, counts)
    return (base[..., 0] if flat else base), total


def _scalars(*xs):
    return jnp.stack([jnp.asarray(x).astype(jnp.int32) for x in xs])


def _flat(table):
    """A layer table with its leading unit axis merged into the next: a kernel reads row u's entry r at
    u * rows + r."""
    return table.reshape((-1,) + table.shape[2:])


def _mode(cfg):
    interpret = cfg.fused == "interpret"
    return interpret, None if interpret else plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1)


# ---- the pairing ----------------------------------------------------------------------------------------

def _any(mask):
    return jnp.max(mask.astype(jnp.int32)) > 0


def _nth_set_bit(rows, j):
    """words.nth_set_bit on the lanes (a list of (bw,) uint32): (position, found)."""
    counts = [_popcount(r) for r in rows]
    lane, before, upto = (jnp.zeros(j.shape, jnp.int32),) * 3
    for k in range(1, len(rows)):
        upto = upto + counts[k - 1]
        past = upto <= j
        lane, before = jnp.where(past, k, lane), jnp.where(past, upto, before)
    rank = j - before
    word = rows[0]
    for k in range(1, len(rows)):
        word = jnp.where(lane == k, rows[k], word)
    pos = jnp.zeros_like(rank)
    for width in (16, 8, 4, 2, 1):
        low = _popcount(word & jnp.uint32((1 << width) - 1))
        up = rank >= low
        rank, word, pos = jnp.where(up, rank - low, rank), jnp.where(up, word >> width, word), pos + up * width
    return lane * 32 + pos, sum(counts) > j


def _turning(w, valid, step, single, few, down, row, gx, gz, fold, rotation_at, low, gens, lanes: int):
    """tiled.turning_at and the canonical member of each pair on lanes: (turning, rotation, partner lanes, passes, canonical,
    canonical lanes). w: 2W lanes of (bw,) uint32; gx, gz, fold, rotation_at, gens: every unit's layer tables
    (flat: `_flat`), of which the unit's are row `row`; the rotation returned is the unit's own index."""
    x, z = w[:lanes], w[lanes:]
    most = 32 * lanes
    meets = [(x[k] & gz[row * lanes + k]) ^ (z[k] & gx[row * lanes + k]) for k in range(lanes)]

    def folded(m):  # the GF(2) map to each generator's lowest qubit, by byte tables
        # a loop over the 4 W bytes, not unrolled: unrolled, their 4 W^2 gathers made the insert kernel twice as
        # large (the kicked Ising's GPU program compiled 0.5 s slower on an H100, 2026-12-06; warm the same)
        def byte_c(c, out):
            lane = m[0]
            for k in range(1, lanes):
                lane = jnp.where(c // 4 == k, m[k], lane)
            byte = ((lane >> (8 * (c % 4)).astype(jnp.uint32)) & jnp.uint32(0xFF)).astype(jnp.int32)
            return tuple(out[k] ^ fold[row * 4 * lanes + c, byte, k] for k in range(lanes))

        zero = tuple(jnp.zeros_like(m[0]) for _ in range(lanes))
        return list(lax.fori_loop(jnp.int32(0), jnp.int32(4 * lanes), byte_c, zero))  # int32: Triton's loop index

    def each(m):  # a layer of at most FEW rotations: each one's parity over its support (a few ALU ops a
        # rotation, where the fold reads its byte tables 4 W times a lane; its A/B on one H100, 2026-12-07, 1.5%
        # faster warm, may have timed one stored program twice: experiments/HISTORY, "Parking")
        out = [jnp.zeros_like(m[0]) for _ in range(lanes)]
        for j in range(min(FEW, most)):
            r = row * most + j
            odd = sum(_popcount(m[k] & (gens[r, k] | gens[r, lanes + k])) for k in range(lanes)) & 1
            at = low[r]
            bit = jnp.where(odd == 1, jnp.uint32(1) << (at % 32).astype(jnp.uint32), jnp.uint32(0))
            out = [jnp.where(at // 32 == k, out[k] | bit, out[k]) for k in range(lanes)]
        return out

    several = (lambda m: lax.cond(few, each, folded, m)) if lanes <= FEW_LANES else folded
    bits = lax.cond(single, lambda m: list(m), several, meets)
    passes = sum(_popcount(b) for b in bits)
    nth = jnp.where(down, passes - 1 - step, step)
    at, has = _nth_set_bit(bits, jnp.maximum(nth, 0))
    rot = rotation_at[row * most + jnp.minimum(at, most - 1)]
    turning = valid & has & (nth >= 0)
    rot = jnp.where(turning, rot, 0)
    g = [gens[row * most + rot, k] for k in range(2 * lanes)]
    # the pivot: the lowest site of G; P is canonical where its bit there is 0
    site = [g[k] | g[lanes + k] for k in range(lanes)]
    up, found = jnp.zeros(rot.shape, bool), jnp.zeros(rot.shape, bool)
    for k in range(lanes):
        low = site[k] & (~site[k] + jnp.uint32(1))
        here = ~found & (site[k] != 0)
        in_x = (g[k] & low) != 0
        bit = jnp.where(in_x, x[k], z[k]) & low
        up = jnp.where(here, bit != 0, up)
        found = found | here
    partners = [w[k] ^ g[k] for k in range(2 * lanes)]
    canon = [jnp.where(up, partners[k], w[k]) for k in range(2 * lanes)]
    return turning, rot, passes, ~up, canon


def _insert_kernel(scal, gx, gz, fold, rotation_at, low, gens, words, partner_in, rot_in, slot_in, table_in, partner, rot,
                   slot, table, stats, *, lanes: int, bw: int, interpret: bool):
    """A pass's pairing, first half: each word of the program's block finds whether it turns in this pass
    and by which rotation (tiled.turning_at), its pair's home (its canonical member's hash), and is marked UNPAIRED
    (canonical), LOOKUP or NOT_TURNING; the canonical members go into the table from their homes on by
    linear probing: a word swaps itself into a slot and carries on with what it displaced, until it
    displaces nothing (slots never empty again, so every member stays reachable from its home). `slot`: each
    word's home, but ~s for a canonical member whose chain of exchanges filled the empty slot s (one slot each:
    together the slots the pass took, which the mix clears).
    scal: the pass's (`rotation_pass`); stats[pid] = (turning words, most passes), over the program's blocks."""
    del partner_in, rot_in, slot_in, table_in
    pid = pl.program_id(0)
    n, step, row, single, down, few = scal[0], scal[1], scal[2], scal[3] != 0, scal[4] != 0, scal[6] != 0
    mask = pairing.table_mask(n, table.shape[0]).astype(jnp.int32)
    stats[pid, 0] = jnp.int32(0)
    stats[pid, 1] = jnp.int32(0)

    def run(_, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        valid = i < n
        w = [words[i, k] for k in range(2 * lanes)]
        turning, r, passes, is_canonical, canon = _turning(w, valid, step, single, few, down, row, gx, gz, fold, rotation_at, low,
                                                             gens, lanes)
        home = (pairing.hash_lanes(canon) & mask.astype(jnp.uint32)).astype(jnp.int32)
        marker = jnp.where(turning, jnp.where(is_canonical, pairing.UNPAIRED, pairing.LOOKUP), pairing.NOT_TURNING)
        partner[i] = marker
        rot[i] = r
        slot[i] = home
        stats[pid, 0] += jnp.sum(turning.astype(jnp.int32))
        stats[pid, 1] = jnp.maximum(stats[pid, 1], jnp.max(jnp.where(valid, passes, 0)))
        inserting = turning & is_canonical
        if interpret:  # one lane after the other: the GPU's exchanges in one of their orders
            def lane(j, _):
                k = first + j

                def swap(c):
                    carry, s, _ = c
                    old = table[s]
                    table[s] = carry
                    return old, (s + 1) & mask, old != pairing.EMPTY

                inserts = partner[k] == pairing.UNPAIRED
                _, after, _ = lax.while_loop(lambda c: c[2], swap, (k, slot[k], inserts))
                slot[k] = jnp.where(inserts, ~((after - 1) & mask), slot[k])
                return 0

            lax.fori_loop(0, bw, lane, 0)
            return

        def swap(c):
            active, carry, s, end = c
            old = plgpu.atomic_xchg(table, (s,), carry, mask=active)
            took = active & (old == pairing.EMPTY)  # the exchange that filled an empty slot ends the lane's chain
            active = active & ~took
            return active, jnp.where(active, old, carry), (s + 1) & mask, jnp.where(took, s, end)

        _, _, _, end = lax.while_loop(lambda c: _any(c[0]), swap, (inserting, i, home, home))
        slot[i] = jnp.where(inserting, ~end, home)

    _over_blocks(n, bw, run)


def _lookup_kernel(scal, gens, rot, slot, words, table, partner_in, partner, *, lanes: int, bw: int):
    """Each LOOKUP word of the program finds its partner (P xor G, a canonical member) along the partner's
    probe sequence, up to an empty slot; both then hold each other's slot, else it is UNPAIRED.
    scal: the pass's (`rotation_pass`)."""
    del partner_in
    n, row, cap = scal[0], scal[2], partner.shape[0]
    mask = pairing.table_mask(n, table.shape[0]).astype(jnp.int32)

    def run(_, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        look = (i < n) & (partner[i] == pairing.LOOKUP)
        r = row * 32 * lanes + jnp.where(look, rot[i], 0)
        target = [plgpu.load(words.at[i, k], mask=look, other=0) ^ gens[r, k] for k in range(2 * lanes)]

        def step(c):
            active, s, found = c
            h = plgpu.load(table.at[s], mask=active, other=pairing.EMPTY)
            hit = active & (h != pairing.EMPTY)
            at = jnp.where(hit, h, 0)
            same = hit
            for k in range(2 * lanes):
                same = same & (plgpu.load(words.at[at, k], mask=hit, other=0) == target[k])
            return hit & ~same, (s + 1) & mask, jnp.where(same, h, found)

        _, _, found = lax.while_loop(lambda c: _any(c[0]), step,
                                     (look, slot[i], jnp.full(i.shape, pairing.UNPAIRED, jnp.int32)))
        plgpu.store(partner.at[jnp.where(look, i, cap)], found, mask=look)
        paired = found >= 0
        plgpu.store(partner.at[jnp.where(paired, found, cap)], i, mask=paired)

    _over_blocks(n, bw, run)


def pair(work, scal, layers, cfg):
    """pairing.pair by kernels, for the pass of `scal` (`rotation_pass`): work with partner, rot filled as
    pairing.pair fills them (`slot` holds each word's home instead of its claim, and the table its pairs'
    canonical members until the mix clears it), and each program's (turning words, most passes any word
    takes). Two launches: the turning words and the inserts, then (every insert done) the lookups. layers:
    tiled.Layer tables with a leading unit axis (every unit's, tiled.layers_of, or one unit's), of which the
    layer's are row scal[2]."""
    bw = block(cfg.tile)
    grid = (programs(cfg),)
    interpret, params = _mode(cfg)
    lanes = work.words.shape[1] // 2
    (fold,) = layers.fold
    outs = (work.partner, work.rot, work.slot, work.table)
    partner, rot, slot, table, stats = pl.pallas_call(
        partial(_insert_kernel, lanes=lanes, bw=bw, interpret=interpret), grid=grid,
        out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs) + (
            jax.ShapeDtypeStruct(grid + (2,), jnp.int32),),
        input_output_aliases={8 + k: k for k in range(4)}, compiler_params=params, interpret=interpret)(
        scal, _flat(layers.gx), _flat(layers.gz), _flat(fold),
        _flat(layers.rotation_at), _flat(layers.low), _flat(layers.gens), work.words, *outs)
    partner = pl.pallas_call(partial(_lookup_kernel, lanes=lanes, bw=bw), grid=grid,
                             out_shape=jax.ShapeDtypeStruct(partner.shape, partner.dtype),
                             input_output_aliases={6: 0}, compiler_params=params, interpret=interpret)(
        scal, _flat(layers.gens), rot, slot, work.words, table, partner)
    return work._replace(partner=partner, rot=rot, slot=slot, table=table), stats


# ---- the compaction -----------------------------------------------------------------------------------

def _hole_count_kernel(scal, gone, counts, *, bw: int):
    """counts[b] = (the gone words of block b below m: holes; the staying words from m on: fillers).
    scal = (n, m)."""
    n, m = scal[0], scal[1]

    def run(b, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        g = gone[i] != 0
        counts[b, 0] = jnp.sum(((i < m) & g).astype(jnp.int32))
        counts[b, 1] = jnp.sum(((i >= m) & (i < n) & ~g).astype(jnp.int32))

    _over_blocks(n, bw, run)


def _holes_kernel(scal, base, gone_in, holes_in, gone, holes, *, bw: int):
    """The slots of the holes (gone words below m), in order: holes[r] is the slot of the r-th; their gone
    flags cleared. scal = (n, m)."""
    del gone_in, holes_in
    m = scal[1]

    def run(b, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        hole = (i < m) & (gone[i] != 0)
        rank = jnp.where(hole, base[b, 0] + jnp.cumsum(hole.astype(jnp.int32)) - 1, holes.shape[0])
        plgpu.store(holes.at[rank], i, mask=hole)
        plgpu.store(gone.at[jnp.where(hole, i, gone.shape[0])], jnp.zeros(i.shape, jnp.uint8), mask=hole)

    _over_blocks(m, bw, run)


def _fill_kernel(scal, base, holes, gone_in, words_in, coeffs_in, sins_in, gone, words, coeffs, sins, *, lanes: int,
                 bw: int, sins_on: bool):
    """The r-th filler (staying word from m on) to the r-th hole; the gone flags from m on cleared.
    scal = (n, m)."""
    del gone_in, words_in, coeffs_in, sins_in
    n, m, cap = scal[0], scal[1], words.shape[0]

    def run(b, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        tail = (i >= m) & (i < n)
        fill = tail & (gone[i] == 0)
        rank = base[b, 1] + jnp.cumsum(fill.astype(jnp.int32)) - 1
        d = jnp.where(fill, plgpu.load(holes.at[jnp.where(fill, rank, 0)], mask=fill, other=0), cap)
        for j in range(2 * lanes):
            plgpu.store(words.at[d, j], words[i, j], mask=fill)
        plgpu.store(coeffs.at[d], coeffs[i], mask=fill)
        if sins_on:
            plgpu.store(sins.at[d], sins[i], mask=fill)
        plgpu.store(gone.at[jnp.where(tail, i, cap)], jnp.zeros(i.shape, jnp.uint8), mask=tail)

    _over_blocks(n, bw, run, start=m // bw)


@partial(jax.jit, static_argnames="cfg")  # its two callers (a pass, a unit's end) trace and lower it once: one copy
def _compaction(work, scal, cfg):                     # of its kernels for XLA to compile
    """Remove the gone words of [0, n) and clear `gone`, scal = (n, m = n less the gone words; both 0 where
    none is gone: no launch then has a block to do). Not in order: the staying words past the new end m fill the
    holes below it, the r-th of them the r-th hole, so only those words move (where the ordered compaction
    moved every word past the first hole twice, through staging buffers: one H200, 8x8 Ising, 2026-11-28, 70
    us of a pass). Four launches: the holes and fillers of each block, their offsets, the holes' slots in
    order (into `partner`, free after the mix), the fillers moved. Launched whether or not a word is gone:
    a loop around them costs a pass its test where they return at once."""
    bw = block(cfg.tile)
    lanes = work.words.shape[1] // 2
    cap = work.coeffs.shape[0]
    interpret, params = _mode(cfg)
    call = partial(pl.pallas_call, grid=(programs(cfg),), compiler_params=params, interpret=interpret)
    counts = call(partial(_hole_count_kernel, bw=bw),
                  out_shape=jax.ShapeDtypeStruct((cap // bw, 2), jnp.int32))(scal, work.gone)
    base, _ = offsets(counts, scal, cfg)
    gone, holes = call(partial(_holes_kernel, bw=bw),
                       out_shape=(jax.ShapeDtypeStruct(work.gone.shape, work.gone.dtype),
                                  jax.ShapeDtypeStruct(work.partner.shape, work.partner.dtype)),
                       input_output_aliases={2: 0, 3: 1})(scal, base, work.gone, work.partner)
    outs = (gone, work.words, work.coeffs, work.sins)
    gone, words, coeffs, sins = call(
        partial(_fill_kernel, lanes=lanes, bw=bw, sins_on=cfg.rules.max_sins),
        out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs),
        input_output_aliases={3 + k: k for k in range(4)})(scal, base, holes, *outs)
    return work._replace(gone=gone, words=words, coeffs=coeffs, sins=sins, partner=holes)


def compact(work, n, cfg, gone_count):
    """tiled.compact by kernels (`_compaction`): (work, the new n = n - gone_count)."""
    some = gone_count > 0
    return _compaction(work, _scalars(jnp.where(some, n, 0), jnp.where(some, n - gone_count, 0)), cfg), n - gone_count


# ---- a Clifford run, gate by gate -----------------------------------------------------------------------

def _clifford_kernel(scal, lim_i, kinds, qubits, images, signs, gens_x, gens_z, turns, words_in, coeffs_in, gone_in,
                     words, coeffs, gone, stats, *, lanes: int, bw: int, forms: tuple, weight_rule: bool):
    """The words of the program's blocks (`_over_blocks`) through gates [first, first + count) of the run, one
    after the other in registers (engine.element_image), the weight rule after each gate that moves a word
    when `weight_rule`; stats[pid] the 1-norm it dropped. scal = (live words, first, count, last gate)."""
    del words_in, coeffs_in, gone_in
    pid = pl.program_id(0)
    live, first, count, last = scal[0], scal[1], scal[2], scal[3]
    cap = words.shape[0]
    stats[pid] = jnp.zeros((), stats.dtype)

    def run(_, start):
        i = start + jnp.arange(bw, dtype=jnp.int32)
        valid = i < live
        w = [words[i, k] for k in range(2 * lanes)]
        c = coeffs[i]
        out = gone[i] != 0

        def site(q, k):  # qubit q's bit in lane k (0 elsewhere)
            return jnp.where(q // 32 == k, jnp.uint32(1) << (q % 32).astype(jnp.uint32), jnp.uint32(0))

        def gate(g, carry):
            w, c, out, charge = carry
            j = jnp.minimum(first + g, last)
            x, z = w[:lanes], w[lanes:]
            results = []
            if forms[1]:  # a table on qubits (a, b)
                a, b = qubits[j, 0], qubits[j, 1]
                ma, mb = [site(a, k) for k in range(lanes)], [site(b, k) for k in range(lanes)]
                has = lambda v, m: _or_all([(v[k] & m[k]) != 0 for k in range(lanes)]).astype(jnp.int32)
                code = has(x, ma) | has(z, ma) << 1 | has(x, mb) << 2 | has(z, mb) << 3
                img = images[j, code].astype(jnp.uint32)
                bit = lambda s, m: jnp.where(((img >> s) & 1) != 0, m, jnp.uint32(0))
                tx = [(x[k] & ~(ma[k] | mb[k])) | bit(0, ma[k]) | bit(2, mb[k]) for k in range(lanes)]
                tz = [(z[k] & ~(ma[k] | mb[k])) | bit(1, ma[k]) | bit(3, mb[k]) for k in range(lanes)]
                sign = jnp.where(signs[j, code] < 0, -1.0, 1.0)
                results.append((tx + tz, sign, code != 0))
            if forms[2]:  # a quarter turn of a generator
                gx, gz = [gens_x[j, k] for k in range(lanes)], [gens_z[j, k] for k in range(lanes)]
                ac = (sum(_popcount((x[k] & gz[k]) ^ (z[k] & gx[k])) for k in range(lanes)) & 1) == 1
                ps = _product_sign(x, z, gx, gz)
                t = turns[j] % 4
                odd = (t % 2) == 1
                sign = jnp.where(ac, jnp.where(odd, jnp.where(t == 1, 1.0, -1.0) * ps, -1.0), 1.0)
                flip = ac & odd
                g_all = gx + gz
                results.append(([jnp.where(flip, w[k] ^ g_all[k], w[k]) for k in range(2 * lanes)], sign, ac))
            if len(results) == 1:
                nw, sign, moved = results[0]
            else:
                table = kinds[j] == schedule.TABLE
                (tw, ts, tm), (gw, gs, gm) = results
                nw = [jnp.where(table, tw[k], gw[k]) for k in range(2 * lanes)]
                sign, moved = jnp.where(table, ts, gs), jnp.where(table, tm, gm)
            moved = moved & valid & ~out
            w = [jnp.where(moved, nw[k], w[k]) for k in range(2 * lanes)]
            c = jnp.where(moved, c * sign.astype(c.dtype), c)
            if weight_rule:
                heavy = moved & (sum(_popcount(w[k] | w[lanes + k]) for k in range(lanes)) > lim_i[0])
                charge = charge + jnp.sum(jnp.where(heavy, jnp.abs(c), 0))
                out = out | heavy
            return w, c, out, charge

        w, c, out, charge = lax.fori_loop(0, count, gate, (w, c, out, jnp.zeros((), c.dtype)))
        for k in range(2 * lanes):
            plgpu.store(words.at[jnp.where(valid, i, cap), k], w[k], mask=valid)
        plgpu.store(coeffs.at[jnp.where(valid, i, cap)], c, mask=valid)
        plgpu.store(gone.at[jnp.where(valid, i, cap)], out.astype(jnp.uint8), mask=valid)
        stats[pid] += charge.astype(stats.dtype)

    _over_blocks(live, bw, run)


def _or_all(xs):
    """The OR of a list of masks."""
    out = xs[0]
    for x in xs[1:]:
        out = out | x
    return out


def clifford_run(work, live, T, u, limits: Limits, cfg):
    """tiled.clifford_unit's gate-by-gate map by one launch: (work, the 1-norm the weight rule dropped after the
    run's gates)."""
    bw = block(cfg.tile)
    grid = (programs(cfg),)
    lanes = work.words.shape[1] // 2
    interpret, params = _mode(cfg)
    weight_rule = cfg.rules.weight_each_gate
    lim_i = jnp.asarray(limits.max_weight if weight_rule else 0, jnp.int32)[None]
    first, count = T["u_start"][u], T["u_count"][u]
    last = T["cl_kind"].shape[0] - 1
    kernel = partial(_clifford_kernel, lanes=lanes, bw=bw, forms=cfg.clifford, weight_rule=weight_rule)
    outs = (work.words, work.coeffs, work.gone)

    words, coeffs, gone, stats = pl.pallas_call(
        kernel, grid=grid, compiler_params=params, interpret=interpret,
        out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs) + (
            jax.ShapeDtypeStruct(grid, work.coeffs.dtype),),
        input_output_aliases={9: 0, 10: 1, 11: 2})(
        _scalars(live, first, count, last), lim_i, T["cl_kind"], T["cl_qubits"], T["cl_table"], T["cl_sign"],
        T["cl_gx"], T["cl_gz"], T["cl_turns"], work.words, work.coeffs, work.gone)
    return work._replace(words=words, coeffs=coeffs, gone=gone), jnp.sum(stats)
