"""A rotation pass as GPU kernels (Pallas on Triton): a few launches where XLA ran about sixty a tile.

XLA runs a pass of the tiled engine (pairing.pair, tiled._mix, tiled.compact) as some sixty kernels a
tile: the pairing's rounds of scatter-min and gathers, the mix's gathers, scatters and sums, the
compaction's prefix count and scatters, each reading its operands from memory and writing them back.
On one H200 (2026-11-28, 2D Ising 4x4, tiles of 2^18 words) that was 380 ms of kernels, about 2.5 us
each, where a tile's bytes move in a few microseconds. Here a pass is a few launches of programs of
BLOCK words each; the pairing's and the mix's programs each take their block of every tile in one launch
(a loop of launches over the tiles cost a pass the loop's test and its small kernels: one H200, 8x8
Ising, 2026-11-28, about half the pass's time went to such glue):

  insert   each word finds whether it turns in this pass and by which rotation (tiled.turning_at), and
           its pair's home slot (the canonical member's hash, pairing.hash_lanes); the canonical members go
           into the table by linear probing with atomic exchanges: a word swaps itself into a slot and
           carries on with what it displaced until it displaces nothing. Slots never empty again, so
           every member stays reachable from its home along taken slots.
  lookup   (once every insert is done) each other turning word walks its partner's probe
           sequence to an empty slot; found, the two hold each other's slot, else it is UNPAIRED.
  count, offsets, mix
           the appended words each block keeps; their prefix sum, tile after tile, by one program
           (`offsets`), so the appended words come in tiled._mix's order whatever order the programs run
           in; then each pair mixed in place by its lower member, each lone word scaled and its partner
           appended at the block's offset, the rules' drops marked gone and charged, the table cleared.
  clifford (a unit of its own) each word through a Clifford run's gates one after the other in
           registers, the weight rule after every gate (where XLA ran a few kernels a gate).
  holes, offsets, fill
           the compaction: the staying words past the new end fill the holes below it, the r-th the
           r-th (only those words move; the order of the live words is not kept).

The answer is the XLA passes', word for word (tests/pauliprop/propagation/test_fused.py, by Pallas's
interpreter; on a GPU to rounding, Triton contracting products into FMAs). No two lanes of a launch
write one slot: a pair is written by its lower member alone, appended and placed words go to distinct
slots. Lanes that write nothing point past the buffer (its capacity), where a GPU's masked store never
goes and the interpreter's scatter drops the write. Blocks past the live words return at once, so a
tile may be large (propagate.FUSED_TILE).
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
from .truncation import Limits, violations

mlir_dialects.register()  # the kernels' lowering without a failed import an op

BLOCK = 1024  # words a program handles
# 8 warps: 4 of a block's words a thread, where 4 warps held 8, so LLVM and ptxas see each op half as often. With
# the loops in the mix's table clear and in `offsets` (one H100, 2026-12-06, experiments/README): the kicked
# Ising's program compiled in 1.2-2.1 s against 1.9-2.7 s, and every workload ran 2.7-6% faster warm (on 4 warps
# those loops alone ran the 8x8 0.9% slower)
NUM_WARPS = 8


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


def _rules(rules: tuple, lim_i, lim_f) -> Limits:
    """The limits inside a kernel from their refs: max_weight, max_sins in lim_i, min_abs_coeff in lim_f
    (None where the rule is off)."""
    max_weight, min_abs, _, max_sins = rules
    return Limits(max_weight=lim_i[0] if max_weight else None, min_abs_coeff=lim_f[0] if min_abs else None,
                  max_sins=lim_i[1] if max_sins else None)


def _dropped(limits: Limits, coeffs, weights, sins, candidate):
    """(keep mask, the magnitude each rule (weight, coefficient, sines) drops of each candidate, None where the
    rule is off): the caller sums a rule's drops of all its candidates at once, a reduction a rule (each
    reduction was the mix kernel's largest code: nine a tile where three do)."""
    drops = violations(limits, coeffs, weights, sins)
    mag = jnp.abs(coeffs)
    on = (limits.max_weight, limits.min_abs_coeff, limits.max_sins)
    return (candidate & ~drops[0] & ~drops[1] & ~drops[2],
            tuple(None if rule is None else jnp.where(candidate & d, mag, 0) for rule, d in zip(on, drops)))


def _over_tiles(n, tile: int, bw: int, block_body, every=None):
    """block_body(k, first slot) for the program's block of each tile k that holds live words (every(k)
    first, for each tile k up to the last live word): one launch for every tile (a loop of launches costs
    a pass several small kernels and the loop's test)."""
    pid = pl.program_id(0)

    def one(k, carry):
        first = k * tile + pid * bw
        if every is not None:
            every(k)
        pl.when(first < n)(lambda: block_body(k, first))
        return carry

    lax.fori_loop(0, (n + tile - 1) // tile, one, ())  # no carry: Triton's loop yields no constants


def _kernel(scal, lim_i, lim_f, gens, cos, sin, base, partner, rot, words_in, coeffs_in, sins_in, gone_in,
            table_in, *outs, lanes: int, bw: int, tile: int, rules: tuple, sins_on: bool, count_only: bool):
    """One program: the words [k tile + pid bw, + bw) of every tile k. scal = (n, fits, capacity, the
    pass's table mask, the unit's row of the layer tables).
    count_only: the appended words the block keeps, into counts[k, pid]; else the mix, with the block's
    appended words from base[k, pid] on, and stats[pid] = (the 1-norm each rule dropped, words marked gone)."""
    if count_only:
        (counts,) = outs
    else:
        words, coeffs, sins, gone, table, stats = outs
        words_in, coeffs_in, sins_in = words, coeffs, sins  # the same buffers (aliased)
    pid = pl.program_id(0)
    n, fits, cap, table_mask, row = scal[0], scal[1] != 0, scal[2], scal[3], scal[4]
    most = 32 * lanes  # rows of a unit's layer tables
    if not count_only:
        for k in range(4):
            stats[pid, k] = jnp.zeros((), stats.dtype)

    def run(tile_k, first):
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
            counts[tile_k, pid] = jnp.sum(keep_spawn.astype(jnp.int32))
            return
        # the table cleared whether the pass fits or not: the part a pass over n words uses is at most 2 LOAD n
        # slots, so each program clears 2 LOAD of them a word of its own
        empty = jnp.full(i.shape, pairing.EMPTY, jnp.int32)

        def clear(k, _):  # a loop, not unrolled: each store's index arithmetic made the kernel larger
            at = 2 * pairing.LOAD * first + k * bw + jnp.arange(bw, dtype=jnp.int32)
            plgpu.store(table.at[jnp.where(at <= table_mask, at, table_in.shape[0])], empty, mask=at <= table_mask)
            return _

        lax.fori_loop(jnp.int32(0), jnp.int32(2 * pairing.LOAD), clear, ())
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
        dest = jnp.where(keep_spawn, base[tile_k, pid] + jnp.cumsum(keep_spawn.astype(jnp.int32)) - 1, cap)
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

    def zero(k):  # blocks past the live words count nothing (`offsets` reads only the tiles up to them)
        counts[k, pid] = jnp.int32(0)

    _over_tiles(n, tile, bw, run, zero if count_only else None)


def _launch(work, n, fits, mask, base, layers, row, limits: Limits, cfg, count_only: bool):
    tile, lanes = cfg.tile, work.words.shape[1] // 2
    bw = block(tile)
    grid = (tile // bw,)
    cap = work.coeffs.shape[0]
    scal = _scalars(n, fits, cap, mask, row)
    lim_i = jnp.stack([jnp.asarray(limits.max_weight if limits.max_weight is not None else 0, jnp.int32),
                       jnp.asarray(limits.max_sins if limits.max_sins is not None else 0, jnp.int32)])
    lim_f = jnp.asarray(limits.min_abs_coeff if limits.min_abs_coeff is not None else 0, work.coeffs.dtype)[None]
    kernel = partial(_kernel, lanes=lanes, bw=bw, tile=tile, rules=cfg.rules, sins_on=cfg.rules[3],
                     count_only=count_only)
    gens, cos, sin = _flat(layers.gens), _flat(layers.cos), _flat(layers.sin)
    args = (scal, lim_i, lim_f, gens, cos, sin, base, work.partner, work.rot, work.words, work.coeffs, work.sins, work.gone, work.table)
    interpret, params = _mode(cfg)
    if count_only:
        return pl.pallas_call(kernel, grid=grid, out_shape=jax.ShapeDtypeStruct((cap // tile,) + grid, jnp.int32),
                              compiler_params=params, interpret=interpret)(*args)
    first = len(args) - 5
    outs = (work.words, work.coeffs, work.sins, work.gone, work.table)
    out_shape = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs) + (
        jax.ShapeDtypeStruct(grid + (4,), work.coeffs.dtype),)
    words, coeffs, sins, gone, table, stats = pl.pallas_call(
        kernel, grid=grid, out_shape=out_shape, input_output_aliases={first + k: k for k in range(5)},
        compiler_params=params, interpret=interpret)(*args)
    return work._replace(words=words, coeffs=coeffs, sins=sins, gone=gone, table=table), stats


def mix(work, n, layers, row, limits: Limits, dropped, turning, cfg):
    """tiled._mix by kernels, after `pair`: the same results (work, slots needed (0: it fitted), words
    appended, dropped, words marked gone); the table is left empty. layers, row: as in `pair`."""
    need = n + turning
    fits = need <= cfg.capacity
    mask = pairing.table_mask(n, work.table.shape[0])
    unread = jnp.zeros((1, 1), jnp.int32)  # the count reads no offsets (a buffer of every block's cost a memset a pass)
    counts = _launch(work, n, fits, mask, unread, layers, row, limits, cfg, count_only=True)
    base, added = offsets(counts, (n + cfg.tile - 1) // cfg.tile, n, cfg)
    work, stats = _launch(work, n, fits, mask, base, layers, row, limits, cfg, count_only=False)
    total = jnp.sum(stats, axis=0)
    dropped = dropped.at[:3].add(jnp.where(fits, total[:3], 0).astype(dropped.dtype))
    return work, jnp.where(fits, 0, need), jnp.where(fits, added, 0), dropped, total[3].astype(jnp.int32)


def _offsets_kernel(scal, counts, base, total):
    """One program: base[k, b] = scal[1] + the counts before block b of tile k, tile after tile, for the
    first scal[0] tiles (the counts of later ones are never written), and their total; for each channel
    c of counts (tiles, blocks, channels) on its own."""
    blocks = counts.shape[1]
    chunk = min(blocks, BLOCK)  # scans of BLOCK counts, carried: one scan of a tile's 4,096 made 150 kB of PTX

    for c in range(counts.shape[2]):
        def row(k, running, c=c):
            def part(j, running):
                at = pl.ds(j * chunk, chunk)
                v = counts[k, at, c]
                base[k, at, c] = running + jnp.cumsum(v, dtype=jnp.int32) - v
                return running + jnp.sum(v, dtype=jnp.int32)

            return lax.fori_loop(jnp.int32(0), jnp.int32(blocks // chunk), part, running)

        total[c] = lax.fori_loop(0, scal[0], row, scal[1]) - scal[1]


def offsets(counts, rows, start, cfg):
    """(start + the counts of the blocks before each block, tile after tile; their total) of the first
    `rows` tiles of counts (tiles, blocks[, channels]: each channel on its own), in one small kernel
    (XLA's prefix sum over every tile's blocks, 65,536 counts at 2^26 slots, took 10 us of a pass on an
    H200)."""
    interpret, params = _mode(cfg)
    flat = counts.ndim == 2
    counts = counts[..., None] if flat else counts
    base, total = pl.pallas_call(
        _offsets_kernel, grid=(1,), interpret=interpret, compiler_params=params,
        out_shape=(jax.ShapeDtypeStruct(counts.shape, jnp.int32), jax.ShapeDtypeStruct(counts.shape[2:], jnp.int32)))(
        _scalars(rows, start), counts)
    return (base[..., 0], total[0]) if flat else (base, total)


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


def _turning(w, valid, step, single, down, row, gx, gz, fold, rotation_at, gens, lanes: int):
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

    bits = lax.cond(single, lambda m: list(m), folded, meets)
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


def _insert_kernel(scal, gx, gz, fold, rotation_at, gens, words, partner_in, rot_in, slot_in, table_in, partner, rot,
                   slot, table, stats, *, lanes: int, bw: int, tile: int, interpret: bool):
    """A tile's pairing, first half: each word of the program's block finds whether it turns in this pass
    and by which rotation (tiled.turning_at), its pair's home (its canonical member's hash), and is marked UNPAIRED
    (canonical), LOOKUP or NOT_TURNING; the canonical members go into the table from their homes on by
    linear probing: a word swaps itself into a slot and carries on with what it displaced, until it
    displaces nothing (slots never empty again, so every member stays reachable from its home).
    scal = (n, table mask, pass, single, down, the unit's row of the layer tables); stats[pid] = (turning words,
    most passes), over the tiles."""
    del partner_in, rot_in, slot_in, table_in
    pid = pl.program_id(0)
    n, mask, step, single, down, row = scal[0], scal[1], scal[2], scal[3] != 0, scal[4] != 0, scal[5]
    stats[pid, 0] = jnp.int32(0)
    stats[pid, 1] = jnp.int32(0)

    def run(_, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        valid = i < n
        w = [words[i, k] for k in range(2 * lanes)]
        turning, r, passes, is_canonical, canon = _turning(w, valid, step, single, down, row, gx, gz, fold, rotation_at,
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

                lax.while_loop(lambda c: c[2], swap, (k, slot[k], partner[k] == pairing.UNPAIRED))
                return 0

            lax.fori_loop(0, bw, lane, 0)
            return

        def swap(c):
            active, carry, s = c
            old = plgpu.atomic_xchg(table, (s,), carry, mask=active)
            active = active & (old != pairing.EMPTY)
            return active, jnp.where(active, old, carry), (s + 1) & mask

        lax.while_loop(lambda c: _any(c[0]), swap, (inserting, i, home))

    _over_tiles(n, tile, bw, run)


def _lookup_kernel(scal, gens, rot, slot, words, table, partner_in, partner, *, lanes: int, bw: int, tile: int):
    """Each LOOKUP word of the program finds its partner (P xor G, a canonical member) along the partner's
    probe sequence, up to an empty slot; both then hold each other's slot, else it is UNPAIRED.
    scal = (table mask, capacity, n, the unit's row of the layer tables)."""
    del partner_in
    mask, cap, n, row = scal[0], scal[1], scal[2], scal[3]

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

    _over_tiles(n, tile, bw, run)


def pair(work, n, step, layers, row, cfg):
    """pairing.pair by kernels, for pass `step` of a layer: the same results (work with
    partner, rot filled, the turning words, the most passes any word takes); `slot` holds each word's
    home instead of its claim, and the table its pairs' canonical members until `mix` clears it. Two
    launches: the turning words and the inserts, then (every insert done) the lookups. layers: tiled.Layer
    tables with a leading unit axis (every unit's, tiled.layers_of, or one unit's), of which the layer's
    are row `row`."""
    tile, bw = cfg.tile, block(cfg.tile)
    grid = (tile // bw,)
    mask = pairing.table_mask(n, work.table.shape[0])
    interpret, params = _mode(cfg)
    lanes = work.words.shape[1] // 2
    (fold,) = layers.fold
    outs = (work.partner, work.rot, work.slot, work.table)
    partner, rot, slot, table, stats = pl.pallas_call(
        partial(_insert_kernel, lanes=lanes, bw=bw, tile=tile, interpret=interpret), grid=grid,
        out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs) + (
            jax.ShapeDtypeStruct(grid + (2,), jnp.int32),),
        input_output_aliases={7 + k: k for k in range(4)}, compiler_params=params, interpret=interpret)(
        _scalars(n, mask, step, layers.single[row], layers.down[row], row), _flat(layers.gx), _flat(layers.gz), _flat(fold),
        _flat(layers.rotation_at), _flat(layers.gens), work.words, *outs)
    partner = pl.pallas_call(partial(_lookup_kernel, lanes=lanes, bw=bw, tile=tile), grid=grid,
                             out_shape=jax.ShapeDtypeStruct(partner.shape, partner.dtype),
                             input_output_aliases={6: 0}, compiler_params=params, interpret=interpret)(
        _scalars(mask, partner.shape[0], n, row), _flat(layers.gens), rot, slot, work.words, table, partner)
    work = work._replace(partner=partner, rot=rot, slot=slot, table=table)
    return work, jnp.sum(stats[:, 0], dtype=jnp.int32), jnp.max(stats[:, 1])


# ---- the compaction -----------------------------------------------------------------------------------

def _hole_count_kernel(scal, gone, counts, *, bw: int, tile: int):
    """counts[k, pid] = (the gone words of the block of tile k below m: holes; the staying words from m on:
    fillers). scal = (n, m)."""
    pid = pl.program_id(0)
    n, m = scal[0], scal[1]

    def run(k, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        g = gone[i] != 0
        counts[k, pid, 0] = jnp.sum(((i < m) & g).astype(jnp.int32))
        counts[k, pid, 1] = jnp.sum(((i >= m) & (i < n) & ~g).astype(jnp.int32))

    def zero(k):  # blocks past the live words count nothing (`offsets` reads only the tiles up to them)
        counts[k, pid, 0] = jnp.int32(0)
        counts[k, pid, 1] = jnp.int32(0)

    _over_tiles(n, tile, bw, run, zero)


def _holes_kernel(scal, base, gone_in, holes_in, gone, holes, *, bw: int, tile: int):
    """The slots of the holes (gone words below m), in order: holes[r] is the slot of the r-th; their gone
    flags cleared. scal = (m,)."""
    del gone_in, holes_in
    pid = pl.program_id(0)
    m = scal[0]

    def run(k, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        hole = (i < m) & (gone[i] != 0)
        rank = jnp.where(hole, base[k, pid, 0] + jnp.cumsum(hole.astype(jnp.int32)) - 1, holes.shape[0])
        plgpu.store(holes.at[rank], i, mask=hole)
        plgpu.store(gone.at[jnp.where(hole, i, gone.shape[0])], jnp.zeros(i.shape, jnp.uint8), mask=hole)

    _over_tiles(m, tile, bw, run)


def _fill_kernel(scal, base, holes, gone_in, words_in, coeffs_in, sins_in, gone, words, coeffs, sins, *, lanes: int,
                 bw: int, tile: int, sins_on: bool):
    """The r-th filler (staying word from m on) to the r-th hole; the gone flags from m on cleared.
    scal = (n, m, capacity)."""
    del gone_in, words_in, coeffs_in, sins_in
    pid = pl.program_id(0)
    n, m, cap = scal[0], scal[1], scal[2]

    def run(k, first):
        i = first + jnp.arange(bw, dtype=jnp.int32)
        tail = (i >= m) & (i < n)
        fill = tail & (gone[i] == 0)
        rank = base[k, pid, 1] + jnp.cumsum(fill.astype(jnp.int32)) - 1
        d = jnp.where(fill, plgpu.load(holes.at[jnp.where(fill, rank, 0)], mask=fill, other=0), cap)
        for j in range(2 * lanes):
            plgpu.store(words.at[d, j], words[i, j], mask=fill)
        plgpu.store(coeffs.at[d], coeffs[i], mask=fill)
        if sins_on:
            plgpu.store(sins.at[d], sins[i], mask=fill)
        plgpu.store(gone.at[jnp.where(tail, i, cap)], jnp.zeros(i.shape, jnp.uint8), mask=tail)

    _over_tiles(n, tile, bw, lambda k, first: pl.when(first + bw > m)(lambda: run(k, first)))


@partial(jax.jit, static_argnames="cfg")  # its two callers (a pass, a unit's end) trace and lower it once
def compact(work, n, cfg, gone_count):
    """tiled.compact by kernels: remove the gone words of [0, n) and clear `gone`; (work, the new n).
    Not in order: the staying words past the new end m = n - gone_count fill the holes below it, the r-th
    of them the r-th hole, so only those words move (where the ordered compaction moved every word
    past the first hole twice, through staging buffers: one H200, 8x8 Ising, 2026-11-28, 70 us of a
    pass). Four launches: the holes and fillers of each block, their offsets, the holes' slots in order
    (into `partner`, free after the mix), the fillers moved."""
    tile, bw = cfg.tile, block(cfg.tile)
    grid = (tile // bw,)
    lanes = work.words.shape[1] // 2
    cap = work.coeffs.shape[0]
    interpret, params = _mode(cfg)
    call = partial(pl.pallas_call, grid=grid, compiler_params=params, interpret=interpret)
    m = n - gone_count
    rows = (n + tile - 1) // tile

    def move(_, work):
        counts = call(partial(_hole_count_kernel, bw=bw, tile=tile),
                      out_shape=jax.ShapeDtypeStruct((cap // tile,) + grid + (2,), jnp.int32))(_scalars(n, m), work.gone)
        base, _ = offsets(counts, rows, 0, cfg)
        gone, holes = call(partial(_holes_kernel, bw=bw, tile=tile),
                           out_shape=(jax.ShapeDtypeStruct(work.gone.shape, work.gone.dtype),
                                      jax.ShapeDtypeStruct(work.partner.shape, work.partner.dtype)),
                           input_output_aliases={2: 0, 3: 1})(_scalars(m), base, work.gone, work.partner)
        outs = (gone, work.words, work.coeffs, work.sins)
        gone, words, coeffs, sins = call(
            partial(_fill_kernel, lanes=lanes, bw=bw, tile=tile, sins_on=cfg.rules[3]),
            out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs),
            input_output_aliases={3 + k: k for k in range(4)})(_scalars(n, m, cap), base, holes, *outs)
        return work._replace(gone=gone, words=words, coeffs=coeffs, sins=sins, partner=holes)

    work = lax.fori_loop(0, jnp.where(gone_count > 0, 1, 0), move, work)  # no launch where nothing is gone
    return work, m


# ---- a Clifford run, gate by gate -----------------------------------------------------------------------

def _clifford_kernel(scal, lim_i, kinds, qubits, images, signs, gens_x, gens_z, turns, words_in, coeffs_in, gone_in,
                     words, coeffs, gone, stats, *, lanes: int, bw: int, forms: tuple, weight_rule: bool):
    """The program's words through gates [first, first + count) of the run, one after the other in
    registers (engine.element_image), the weight rule after each gate that moves a word when
    `weight_rule`; stats[pid] the 1-norm it dropped. scal = (start, live, first, count, last gate)."""
    del words_in, coeffs_in, gone_in
    pid = pl.program_id(0)
    start, live, first, count, last = scal[0], scal[1], scal[2], scal[3], scal[4]
    i = start + pid * bw + jnp.arange(bw, dtype=jnp.int32)

    def run():
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
            plgpu.store(words.at[jnp.where(valid, i, scal[5]), k], w[k], mask=valid)
        plgpu.store(coeffs.at[jnp.where(valid, i, scal[5])], c, mask=valid)
        plgpu.store(gone.at[jnp.where(valid, i, scal[5])], out.astype(jnp.uint8), mask=valid)
        stats[pid] = charge.astype(stats.dtype)

    pl.when(start + pid * bw < live)(run)

    def idle():
        stats[pid] = jnp.zeros((), stats.dtype)

    pl.when(start + pid * bw >= live)(idle)


def _or_all(xs):
    """The OR of a list of masks."""
    out = xs[0]
    for x in xs[1:]:
        out = out | x
    return out


def clifford_run(work, live, T, u, limits: Limits, cfg):
    """tiled.clifford_unit's gate-by-gate map by one kernel a tile: (work, the 1-norm the weight rule
    dropped after the run's gates)."""
    tile, bw = cfg.tile, block(cfg.tile)
    grid = (tile // bw,)
    lanes = work.words.shape[1] // 2
    interpret, params = _mode(cfg)
    weight_rule = cfg.per == "gate" and cfg.rules[0]
    lim_i = jnp.asarray(limits.max_weight if weight_rule else 0, jnp.int32)[None]
    first, count = T["u_start"][u], T["u_count"][u]
    last = T["cl_kind"].shape[0] - 1
    kernel = partial(_clifford_kernel, lanes=lanes, bw=bw, forms=cfg.clifford, weight_rule=weight_rule)
    outs = (work.words, work.coeffs, work.gone)

    def body(k, carry):
        work, dropped = carry
        words, coeffs, gone, stats = pl.pallas_call(
            kernel, grid=grid, compiler_params=params, interpret=interpret,
            out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs) + (
                jax.ShapeDtypeStruct(grid, work.coeffs.dtype),),
            input_output_aliases={9: 0, 10: 1, 11: 2})(
            _scalars(k * tile, live, first, count, last, work.coeffs.shape[0]), lim_i, T["cl_kind"], T["cl_qubits"],
            T["cl_table"], T["cl_sign"], T["cl_gx"], T["cl_gz"], T["cl_turns"], work.words, work.coeffs, work.gone)
        return work._replace(words=words, coeffs=coeffs, gone=gone), dropped + jnp.sum(stats)

    return lax.fori_loop(0, (live + tile - 1) // tile, body, (work, jnp.zeros((), work.coeffs.dtype)))
