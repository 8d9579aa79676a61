"""The tiled engine: a propagation whose compiled program does not depend on how far its terms grow.

The live terms sit in a prefix [0, n) of buffers of a fixed capacity, sized once from the
machine's memory and the circuit (propagate.py), and every pass over them is a loop over tiles of
`Config.tile` slots whose trip count follows n. So one program serves a run however its terms
grow, and a pass costs what the live terms cost, not the capacity.

The units are the schedule's (schedule.units with layers): Clifford runs (one dense map, or gate
by gate where the weight rule applies per gate), rotations, alone or as a layer of consecutive
commuting rotations, channels, and the truncation of a step (per="layer"). The observable's own
merge runs on the host before the loop (`host_merge`).

A rotation by G turns the words P that anticommute with it: P -> cos(a) P + sin(a) i G P, and
i G P = s (P xor G). P meets only its partner P xor G, which anticommutes too, so a pass pairs its
turning words through a hash table of their canonical members (pairing.py, no sort), mixes each
pair in place, appends the partners that were missing behind the prefix, and removes what the
truncation drops by a compaction that fills holes. A layer of commuting rotations (the same letter
on every qubit two of them share) runs in passes: pass j turns each word by the j-th rotation of
the layer it anticommutes with. Since they commute, the rotations a word anticommutes with are the
same for every word its rotations reach (its fiber), so each fiber sees the layer's rotations in
order and the per-term rules drop what they drop gate by gate. A word anticommutes with a rotation
only where it has a qubit of its support, so a layer of 127 RX under max_weight 8 is at most 8
passes, and the 2D Ising's ZZ couplings with the Z fields after them are one layer.

On GPUs (Config.fused) the pairing, the mix and the compaction of a pass are Pallas kernels
(fused.py), a few launches a pass; the answer is the same.

A unit whose appended words would not fit stops the loop before it writes anything (`need` > 0,
with the unit and pass to resume at): the caller raises a MemoryError or grows the buffers.
Every pass leaves the scratch buffers (the hash table, the dropped flags) as it found them, so a
run's buffers serve the next run as they are (propagate.py keeps them between calls).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..algebra import words as pauli_words
from ..algebra.clifford import apply_map, popcount as popcount_numpy
from ..runtime.prefix import count as _count, prefix_count
from . import fused, pairing, schedule
from ..algebra.overlap import table_overlaps
from .engine import element_image, layer_rotations, rotation_angle
from .merge import halves
from .truncation import Limits, Rules, violations


class Work(NamedTuple):
    """A run's buffers, capacity C: the terms in the prefix [0, n), and the passes' scratch."""

    words: jax.Array  # (C, 2W) uint32: x lanes, then z lanes
    coeffs: jax.Array  # (C,)
    sins: jax.Array  # (C,) int32: the sine branches of each path (max_sins)
    gone: jax.Array  # (C,) uint8: 1 where dropped by the current unit, compacted at its end; all 0 between units
    #                  (bytes, not bools: the GPU's kernels (fused.py) store them)
    partner: jax.Array  # (C,) int32: a pass's pairing (pairing.py)
    rot: jax.Array  # (C,) int32: the rotation each word turns by in the pass
    slot: jax.Array  # (C,) int32: a pass's table slot of each word that claimed one (fused: its pair's home, or ~ the
    #                  slot its exchanges filled: fused._insert_kernel)
    table: jax.Array  # (2C,) int32: the pairing's hash table, all pairing.EMPTY between passes


class Config(NamedTuple):
    """The static part of a run: what its compiled program depends on."""

    capacity: int
    tile: int
    rules: Rules  # Truncation.rules: which rules exist and where they act (their values are data: Limits)
    units: tuple  # the unit kinds present (others compile to no-ops)
    clifford: tuple  # Clifford runs as (dense maps, gate tables, quarter turns of generators)
    unroll: int = 1  # clifford.apply_map's bytes an iteration
    sweep: int = 1  # Clifford gates applied an iteration when a run goes gate by gate (GPUs: SWEEP in propagate.py)
    clifford_tile: int = 0  # the tiles of the XLA loops that treat each word alone (a Clifford run's map, the rules
    #                       at a unit's end, channels, the value); 0: `tile`. GPUs: smaller than `tile`, where the
    #                       fused kernels' blocks past the live words return at once but XLA's ops do not
    fused: str = ""  # "gpu": a pass's mix by the kernels of fused.py; "interpret": the same by Pallas's interpreter

    @property
    def word_tile(self) -> int:
        return self.clifford_tile or self.tile


def empty_work(capacity: int, lanes: int, dtype) -> Work:
    """Buffers for a run (zeros; the table EMPTY)."""
    return Work(jnp.zeros((capacity, 2 * lanes), jnp.uint32), jnp.zeros(capacity, dtype),
                jnp.zeros(capacity, jnp.int32), jnp.zeros(capacity, jnp.uint8), jnp.zeros(capacity, jnp.int32),
                jnp.zeros(capacity, jnp.int32), jnp.zeros(capacity, jnp.int32),
                jnp.full(2 * capacity, pairing.EMPTY, jnp.int32))


def slot_bytes(lanes: int, coeff_bytes: int) -> int:
    """Bytes of Work a slot of capacity takes."""
    return 8 * lanes + coeff_bytes + 4 + 1 + 4 + 4 + 4 + 2 * 4


# ---- tiles --------------------------------------------------------------------------------------------

def over_tiles(n, tile: int, body, carry):
    """body(start, carry) for start = 0, tile, 2 tile, ... below n: a loop whose trip count follows n."""
    return lax.fori_loop(0, (n + tile - 1) // tile, lambda i, c: body(i * tile, c), carry)


def take(a, start, tile: int):
    return lax.dynamic_slice_in_dim(a, start, tile, axis=0)


def put(a, start, value):
    return lax.dynamic_update_slice_in_dim(a, value, start, axis=0)


def gone_at(gone, start, tile: int):
    """The tile's gone flags as bools."""
    return take(gone, start, tile) != 0


def _charges(limits: Limits, coeffs, weights, sins, candidate):
    """(keep mask, the 1-norm dropped per rule (weight, coefficient, sines)) of the candidates."""
    drop_w, drop_c, drop_s = violations(limits, coeffs, weights, sins)
    mag = jnp.abs(coeffs)
    charge = jnp.stack([jnp.sum(jnp.where(candidate & d, mag, 0)) for d in (drop_w, drop_c, drop_s)])
    return candidate & ~drop_w & ~drop_c & ~drop_s, charge


def _with_charge(dropped, charge):
    return dropped.at[:3].add(charge.astype(dropped.dtype))


def compact(work: Work, n, cfg: Config, gone_count=None):
    """Remove the gone words of the prefix [0, n) (gone_count of them: counted here when None); clears
    `gone`. Returns (work, the new n m = n - gone_count). The staying words from m on fill the holes below
    m, the r-th of them the r-th hole, so only those words move (the live words' order is not kept): a
    loop over the tiles below m lists the holes (into `partner`, free between a pass's mix and the next
    pairing), one over the tiles from m on moves the fillers. Where nothing is gone both loops run no
    tile. (No lax.cond around a loop that scatters into the buffers: XLA:CPU then copies every buffer at
    every iteration; a loop of zero trips costs nothing.) The GPU's kernels do the same (fused.compact)."""
    tile = cfg.tile
    if gone_count is None:
        wt = cfg.word_tile
        gone_count = over_tiles(n, wt, lambda s, c: c + _count(gone_at(work.gone, s, wt) & (s + jnp.arange(wt) < n)),
                                jnp.int32(0))
    if cfg.fused:
        return fused.compact(work, n, cfg, gone_count)
    m = n - gone_count
    some = gone_count > 0

    def holes(start, carry):
        partner, gone, found = carry
        i = start + jnp.arange(tile)
        g = gone_at(gone, start, tile)
        hole = (i < m) & g
        rank = jnp.where(hole, found + prefix_count(hole) - 1, cfg.capacity)
        return (partner.at[rank].set(i.astype(jnp.int32), mode="drop"),
                put(gone, start, (g & (i >= m)).astype(jnp.uint8)), found + _count(hole))

    partner, gone, _ = over_tiles(jnp.where(some, m, 0), tile, holes, (work.partner, work.gone, jnp.int32(0)))
    work = work._replace(partner=partner, gone=gone)

    def fill(k, carry):
        work, used = carry
        start = k * tile
        i = start + jnp.arange(tile)
        tail = (i >= m) & (i < n)
        g = gone_at(work.gone, start, tile)
        filler = tail & ~g
        rank = used + prefix_count(filler) - 1
        dest = jnp.where(filler, work.partner[jnp.where(filler, rank, 0)], cfg.capacity)
        w, c, s = lax.optimization_barrier((take(work.words, start, tile), take(work.coeffs, start, tile),
                                            take(work.sins, start, tile)))
        work = work._replace(gone=put(work.gone, start, (g & ~tail).astype(jnp.uint8)),
                             words=work.words.at[dest].set(w, mode="drop"),
                             coeffs=work.coeffs.at[dest].set(c, mode="drop"),
                             sins=work.sins.at[dest].set(s, mode="drop"))
        return work, used + _count(filler)

    work, _ = lax.fori_loop(m // tile, jnp.where(some, (n + tile - 1) // tile, 0), fill, (work, jnp.int32(0)))
    return work, m


def _tile_rules(work: Work, n, limits: Limits, cfg: Config, dropped):
    """The per-term rules on every live word of [0, n): marks what they drop gone."""
    tile = cfg.word_tile
    lim = limits

    def body(start, carry):
        gone, dropped = carry
        valid = start + jnp.arange(tile) < n
        w = take(work.words, start, tile)
        keep, charge = _charges(lim, take(work.coeffs, start, tile), _weight(w), take(work.sins, start, tile),
                                valid & ~gone_at(gone, start, tile))
        return put(gone, start, (gone_at(gone, start, tile) | (valid & ~keep)).astype(jnp.uint8)), _with_charge(dropped, charge)

    gone, dropped = over_tiles(n, tile, body, (work.gone, dropped))
    return work._replace(gone=gone), dropped


def _weight(words):
    x, z = halves(words)
    return pauli_words.weight(x, z)


# ---- the units ----------------------------------------------------------------------------------------

class State(NamedTuple):
    """The loop's state between units."""

    work: Work
    n: jax.Array  # live terms: the prefix [0, n)
    unit: jax.Array  # the next unit
    step: jax.Array  # the pass of that unit to start at (a layer stopped midway)
    need: jax.Array  # > 0: the slots the stopped pass needed (it wrote nothing)
    dropped: jax.Array  # (5,) 1-norm dropped per rule (truncation.RULES)
    terms: jax.Array  # (U,) int32 live terms after each unit
    peak: jax.Array  # int32: the most live terms after any pass


def clifford_unit(st: State, u, T, params, limits: Limits, cfg: Config, active) -> State:
    """A run of Clifford operations on every live word, tile by tile: one dense map, or gate by gate
    (each tile through all of the run's gates) where the weight rule drops a word after the gate that
    made it too heavy (per="gate" with max_weight). The other rules do not change under a Clifford.
    Its tiles are Config.clifford_tile long (each word alone: small tiles waste nothing where the terms are
    few, and many tiles cost launches only where they are many). Inactive (another kind of unit):
    every loop runs no tile."""
    tile = cfg.word_tile
    live = jnp.where(active, st.n, 0)
    weight_each = cfg.rules.weight_each_gate
    gate_limits = Limits(max_weight=limits.max_weight) if weight_each else Limits()

    def dense(work, dropped):
        m = T["u_start"][u]

        def body(start, work):
            x, z = halves(take(work.words, start, tile))
            x, z, sign = apply_map(x, z, T["map_x"][m], T["map_z"][m], T["map_phase"][m], cfg.unroll)
            return work._replace(words=put(work.words, start, jnp.concatenate([x, z], -1)),
                                 coeffs=put(work.coeffs, start, take(work.coeffs, start, tile) * sign.astype(
                                     work.coeffs.dtype)))

        return over_tiles(jnp.where(T["u_dense"][u], live, 0), tile, body, work), dropped

    def by_gates(work, dropped):
        if cfg.fused:
            work, charge = fused.clifford_run(work, jnp.where(T["u_dense"][u], 0, live), T, u, limits, cfg)
            return work, dropped.at[0].add(charge.astype(dropped.dtype))
        first, count = T["u_start"][u], T["u_count"][u]
        last = T["cl_kind"].shape[0] - 1

        def body(start, carry):
            work, dropped = carry
            valid = start + jnp.arange(tile) < live

            def gate(j, ok, c):
                w, coeffs, gone, dropped = c
                nw, sign, touched = element_image(T, jnp.minimum(j, last), w, cfg.clifford)
                touched = touched & valid & ~gone & ok
                w = jnp.where(touched[:, None], nw, w)
                coeffs = jnp.where(touched, coeffs * sign.astype(coeffs.dtype), coeffs)
                if gate_limits.max_weight is not None:
                    keep, charge = _charges(gate_limits, coeffs, _weight(w), jnp.zeros_like(valid, jnp.int32), touched)
                    gone, dropped = gone | (touched & ~keep), _with_charge(dropped, charge)
                return w, coeffs, gone, dropped

            def sweep(i, c):  # cfg.sweep gates an iteration (one fused pass over the tile on a GPU)
                for k in range(cfg.sweep):
                    j = first + i * cfg.sweep + k
                    c = gate(j, j < first + count, c)
                return c

            c = (take(work.words, start, tile), take(work.coeffs, start, tile), gone_at(work.gone, start, tile), dropped)
            w, coeffs, gone, dropped = lax.fori_loop(0, (count + cfg.sweep - 1) // cfg.sweep, sweep, c)
            return work._replace(words=put(work.words, start, w), coeffs=put(work.coeffs, start, coeffs),
                                 gone=put(work.gone, start, gone.astype(jnp.uint8))), dropped

        return over_tiles(jnp.where(T["u_dense"][u], 0, live), tile, body, (work, dropped))

    work, dropped = st.work, st.dropped
    if cfg.clifford[0]:
        work, dropped = dense(work, dropped)
    if cfg.clifford[1] or cfg.clifford[2]:
        work, dropped = by_gates(work, dropped)
    return st._replace(work=work, dropped=dropped)  # run() applies the rules at the end of the run and compacts


def channel_unit(st: State, u, T, params, limits: Limits, cfg: Config, active) -> State:
    """Pauli channels on every live word, each tile through all of the unit's channels (they commute and
    scale coefficients by factors of at most 1 in size, so the coefficient rule after the last one drops
    what it would drop after each)."""
    tile = cfg.word_tile
    first, count = T["u_start"][u], T["u_count"][u]
    last = T["ch_qubit"].shape[0] - 1

    def body(start, work):
        x, z = halves(take(work.words, start, tile))

        def one(j, coeffs):
            j = jnp.minimum(j, last)
            q = T["ch_qubit"][j]
            code = (pauli_words.get_site(x, q) | pauli_words.get_site(z, q) << 1).astype(jnp.int32)
            return coeffs * T["ch_factor"][j][code].astype(coeffs.dtype)

        return work._replace(coeffs=put(work.coeffs, start, lax.fori_loop(first, first + count, one,
                                                                           take(work.coeffs, start, tile))))

    return st._replace(work=over_tiles(jnp.where(active, st.n, 0), tile, body, st.work))  # rules: run()


class Layer(NamedTuple):
    """The rotations of a unit (schedule.units: rotations with the same letter on every qubit two of them
    share, so they commute; or one rotation), at most 32 W of them, in order. Each has a bit of a packed
    word: its lowest qubit where their supports are disjoint and their lowest qubits only rise or only
    fall (one-qubit rotations then read their bits off the word), else its place in the unit."""

    gens: jax.Array  # (R, 2W) uint32 generators
    cos: jax.Array  # (R,)
    sin: jax.Array  # (R,)
    gx: jax.Array  # (W,) the x bits of all the generators (the unit's letter on each qubit)
    gz: jax.Array  # (W,)
    single: jax.Array  # bool: every generator acts on one qubit and each one's bit is its qubit
    fold: tuple  # byte tables of the map from per-qubit anticommutation bits to the bits of the generators
    rotation_at: jax.Array  # (32 W,) int32: the rotation whose bit is b
    down: jax.Array  # bool: the bits are lowest qubits that come in decreasing order
    low: jax.Array  # (R,) int32: each rotation's bit (32 W past the unit's rotations)
    few: jax.Array  # bool: at most fused.FEW rotations (the GPU's kernels take each one's parity, not the fold)


def _lowest(words):
    """(R,) int32 the lowest qubit of each word (R, W) (32 W where it has none)."""
    lanes = words.shape[1]
    lane = jnp.argmax(words != 0, axis=1).astype(jnp.int32)
    bits = jnp.take_along_axis(words, lane[:, None], axis=1)[:, 0]
    low = pauli_words.popcount((bits & (~bits + jnp.uint32(1))) - jnp.uint32(1))
    return jnp.where(bits != 0, lane * pauli_words.LANE_BITS + low, pauli_words.LANE_BITS * lanes)


def layer_of(T, u, params, lanes: int, dtype) -> Layer:
    rows = layer_rotations(u, T)  # the 32 W rows a layer may hold (the tables' W: the words', lanes)
    most, count = rows.shape[0], T["u_count"][u]
    on = jnp.arange(most) < count
    angle = rotation_angle(T, rows, params).astype(dtype)
    gx = jnp.where(on[:, None], T["rot_gx"][rows], 0)
    gz = jnp.where(on[:, None], T["rot_gz"][rows], 0)
    support = gx | gz
    slot = jnp.arange(most, dtype=jnp.int32)
    weights = jnp.sum(pauli_words.popcount(support), axis=1)
    # each rotation's bit (see Layer); either way the bits' order is the order in which a word meets its rotations
    lowest = jnp.where(on, _lowest(support), most)
    disjoint = jnp.sum(weights) == jnp.sum(pauli_words.popcount(lax.reduce(support, jnp.uint32(0), lax.bitwise_or, (0,))))
    pair_on = on[1:] & on[:-1]
    rise, fall = jnp.all(~pair_on | (lowest[1:] > lowest[:-1])), jnp.all(~pair_on | (lowest[1:] < lowest[:-1]))
    by_qubit = disjoint & (rise | fall)
    low = jnp.where(by_qubit, lowest, jnp.where(on, slot, most))
    down = by_qubit & fall & ~rise
    rotation_at = jnp.zeros(most, jnp.int32).at[low].set(slot, mode="drop")
    # the fold: qubit p -> the OR of the bits of every rotation whose support holds it (the same letter there in
    # each); an OR-reduce, not a matrix product (XLA's GPU integer dot: 1.5 ms a run of the kicked Ising, H100)
    bit_on = (((support[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1).reshape(most, most) != 0) & on[:, None]
    own = jnp.where(jnp.arange(lanes) == (low // 32)[:, None], jnp.uint32(1) << (low % 32).astype(jnp.uint32)[:, None],
                    jnp.uint32(0))  # (R, W) each rotation's bit (none past the layer's rotations: low = 32 W)
    image = lax.reduce(jnp.where(bit_on[:, :, None], own[:, None, :], jnp.uint32(0)), jnp.uint32(0), lax.bitwise_or,
                       (0,))  # (qubit bits, W)
    return Layer(jnp.concatenate([gx, gz], -1), jnp.cos(angle), jnp.sin(angle),
                 lax.reduce(gx, jnp.uint32(0), lax.bitwise_or, (0,)), lax.reduce(gz, jnp.uint32(0), lax.bitwise_or, (0,)),
                 by_qubit & jnp.all(jnp.where(on, weights <= 1, True)), _byte_tables(image), rotation_at, down, low,
                 count <= fused.FEW)


LAYER_TABLES_BYTES = 1 << 28  # every unit's layer tables are made once a run when they take at most this


def layers_of(T, params, lanes: int, dtype) -> Layer | None:
    """Every unit's layer tables (a leading unit axis), made once before the loop, so a unit only reads
    its row (one H200, 8x8 Ising, 2026-11-28: making a unit's tables in the loop took about twenty
    small kernels, 31 ms of the 0.35 s run); None where they would take more than LAYER_TABLES_BYTES
    (then each unit makes its own)."""
    units = T["u_kind"].shape[0]
    one = jax.eval_shape(lambda: layer_of(T, 0, params, lanes, dtype))  # the fold's byte tables dominate: 4096 W^2
    unit_bytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(one))
    if units * unit_bytes > LAYER_TABLES_BYTES:
        return None
    return jax.vmap(lambda u: layer_of(T, u, params, lanes, dtype))(jnp.arange(units))


def _byte_tables(image):
    """(B, 256, W) uint32: for byte b of a packed word and each of its values, the XOR of the images
    (rows of `image`, one a bit) of the bits it sets: a GF(2) linear map applied by B lookups."""
    bits, lanes = image.shape
    chunks = bits // 8
    img = image.reshape(chunks, 8, lanes)
    v = ((jnp.arange(256, dtype=jnp.uint32)[:, None] >> jnp.arange(8, dtype=jnp.uint32)) & 1) != 0
    return (lax.reduce(jnp.where(v[None, :, :, None], img[:, None], jnp.uint32(0)), jnp.uint32(0), lax.bitwise_xor,
                       (2,)),)


def _apply_fold(bits, tables):
    """The linear map of `_byte_tables` on words of bits (T, W)."""
    (tab,) = tables
    out = jnp.zeros_like(bits)
    for c in range(tab.shape[0]):
        byte = ((bits[:, c // 4] >> jnp.uint32(8 * (c % 4))) & jnp.uint32(0xFF)).astype(jnp.int32)
        out = out ^ tab[c][byte]
    return out


def anticommuting_bits(words, layer: Layer):
    """(T, W) uint32: the bit of each rotation's lowest qubit is set where the word anticommutes with it.
    A rotation's generator meets a word at each qubit of its support where their letters differ and
    neither is I; they anticommute when it meets an odd number of them."""
    x, z = halves(words)
    meets = (x & layer.gz) ^ (z & layer.gx)
    return lax.cond(layer.single, lambda m: m, lambda m: _apply_fold(m, layer.fold), meets)


def turning_at(words, valid, j, layer: Layer):
    """(turning, rotation index, passes) of each word in pass j: whether it anticommutes with at least
    j + 1 of the layer's rotations, the (j + 1)-th of them in the layer's order, and how many it
    anticommutes with."""
    bits = anticommuting_bits(words, layer)
    passes = jnp.sum(pauli_words.popcount(bits), axis=1, dtype=jnp.int32)
    nth = jnp.where(layer.down, passes - 1 - j, j)
    at, has = pauli_words.nth_set_bit(bits, jnp.maximum(nth, 0))
    rot = layer.rotation_at[jnp.minimum(at, layer.rotation_at.shape[0] - 1)]
    return valid & has & (nth >= 0), rot, passes


def rotation_unit(st: State, u, T, params, limits: Limits, cfg: Config, active, layers: Layer | None = None) -> State:
    """A rotation or a layer of commuting rotations, in passes (the module docstring); stops
    before a pass whose appended words would not fit, to resume at that pass. Inactive: no pass.
    layers: every unit's layer tables (`layers_of`, for the kernels), or None: this unit's are made here."""
    lanes = st.work.words.shape[1] // 2
    if layers is None:  # this unit's own tables (the kernels read them as row 0 of one unit's)
        layer = layer_of(T, u, params, lanes, st.work.coeffs.dtype)
        layers, row = jax.tree_util.tree_map(lambda t: t[None], layer), 0
    else:
        layer, row = jax.tree_util.tree_map(lambda t: t[u], layers), u
    rules = limits.off_unless(~T["u_defer"][u])

    def cond(c):
        s, passes = c[:2]
        return (s.step < passes) & (s.need == 0)

    def one_pass(c):
        s, _ = c
        def turn(w, valid):
            t, rot, passes = turning_at(w, valid, s.step, layer)
            return t, rot, w ^ layer.gens[rot], passes

        work, turning, most = pairing.pair(s.work, s.n, turn, cfg)
        work, need, added, dropped, gone = _mix(work, s.n, layer, rules, s.dropped, turning, cfg)
        work, n = compact(work, s.n + added, cfg, gone)
        peak = jnp.maximum(s.peak, n)
        stepped = jnp.where(need > 0, s.step, s.step + 1)
        return s._replace(work=work, n=n, step=stepped, need=need, dropped=dropped, peak=peak), most

    def kernel_pass(c):  # the kernels carry the pass's scalars and leave the State's as they are read
        s, _, scal = c
        work, scal, n, step, need, most, dropped, peak = fused.rotation_pass(s.work, scal, layers, lims, s.dropped,
                                                                             s.peak, cfg)
        return s._replace(work=work, n=n, step=step, need=need, dropped=dropped, peak=peak), most, scal

    passes = jnp.where(active, st.step + 1, 0)
    if cfg.fused:
        lims = fused.limit_arrays(rules, st.work.coeffs.dtype)  # made once a unit
        scal = fused.pass_scalars(st.n, st.step, layers, row, st.work.coeffs.shape[0])
        st, _, _ = lax.while_loop(cond, kernel_pass, (st, passes, scal))
    else:
        st, _ = lax.while_loop(cond, one_pass, (st, passes))
    return st._replace(step=jnp.where(st.need > 0, st.step, 0))


def _mix(work: Work, n, layer: Layer, limits: Limits, dropped, turning, cfg: Config):
    """The pass's arithmetic once its words are paired: each pair mixes in place (its lower slot
    writes both), a word without a partner keeps cos(a) of its coefficient and appends the partner
    with sin(a) s of it, the rules mark what they drop, and the table is cleared. Nothing is written
    when the appended words would not fit: returns (work, slots needed (0: it fitted), words
    appended, dropped, words marked gone)."""
    tile = cfg.tile
    sins_on = cfg.rules.max_sins

    def spawning(start, work):
        """The tile's words as the pairing left them, and the partners of those without one that the
        rules keep. Values read before anything is written (an optimization barrier: XLA would
        otherwise fuse these reads into the writes and copy the whole buffer to keep them apart)."""
        idx = start + jnp.arange(tile)
        w = take(work.words, start, tile)
        p, rot = take(work.partner, start, tile), take(work.rot, start, tile)
        t = (idx < n) & (p != pairing.NOT_TURNING)
        lone = t & (p == pairing.UNPAIRED)
        g = layer.gens[rot]
        sign = _sign(w, g)
        c, s = take(work.coeffs, start, tile), take(work.sins, start, tile)
        spawn = layer.sin[rot] * sign.astype(c.dtype) * c
        keep, _ = _charges(limits, spawn, _weight(w ^ g), s + 1, lone)
        return idx, w, t, p, rot, g, sign, c, s, lone, spawn, keep

    # the appended words fit when the live words and every turning one do (a bound: a loop that counted
    # the appended words exactly would cost every pass a wait for the host on GPUs)
    need = n + turning
    fits = need <= cfg.capacity

    def body(start, carry):
        work, added, dropped, gone_count = carry
        idx, w, t, p, rot, g, sign, c, s, lone, spawn, keep_spawn = spawning(start, work)
        slot = take(work.slot, start, tile)
        lead = t & (p >= 0) & (idx < p)  # the lower slot of a pair writes both
        q = jnp.where(lead, p, 0)
        cq, sq = work.coeffs[q], work.sins[q] if sins_on else s
        was_gone = gone_at(work.gone, start, tile)
        c, s, cq, sq, slot, was_gone = lax.optimization_barrier((c, s, cq, sq, slot, was_gone))
        table = work.table.at[jnp.where(slot >= 0, slot, work.table.shape[0])].set(pairing.EMPTY, mode="drop")
        cos, sin = layer.cos[rot], layer.sin[rot]
        sgn = sign.astype(c.dtype)
        mine = jnp.where(lead, cos * c - sin * sgn * cq, cos * c)  # i G Q = -s P for the partner Q of P
        theirs = cos * cq + sin * sgn * c
        my_sins = jnp.where(lead, jnp.minimum(s, sq + 1), s)
        their_sins = jnp.minimum(sq, s + 1)
        keep_mine, charge_mine = _charges(limits, mine, _weight(w), my_sins, lead | lone)
        keep_theirs, charge_theirs = _charges(limits, theirs, _weight(w ^ g), their_sins, lead)
        _, charge_spawn = _charges(limits, spawn, _weight(w ^ g), s + 1, lone)
        dropped = _with_charge(dropped, charge_mine + charge_theirs + charge_spawn)
        mine_at = (lead | lone) & fits
        lead = lead & fits
        keep_spawn = keep_spawn & fits
        # the tile first (a partner written by an earlier tile's lead is read back unchanged), then the
        # partners and the appended words
        at_q = jnp.where(lead, q, cfg.capacity)
        dest = jnp.where(keep_spawn, n + added + prefix_count(keep_spawn) - 1, cfg.capacity)
        coeffs = put(work.coeffs, start, jnp.where(mine_at, mine, c))
        coeffs = coeffs.at[at_q].set(theirs, mode="drop").at[dest].set(spawn, mode="drop")
        gone = put(work.gone, start, (was_gone | (mine_at & ~keep_mine)).astype(jnp.uint8)).at[at_q].set(
            (~keep_theirs).astype(jnp.uint8), mode="drop")
        work = work._replace(coeffs=coeffs, gone=gone, table=table,
                             words=work.words.at[dest].set(w ^ g, mode="drop"))
        if sins_on:
            sins = put(work.sins, start, jnp.where(mine_at, my_sins, s))
            work = work._replace(sins=sins.at[at_q].set(their_sins, mode="drop").at[dest].set(s + 1, mode="drop"))
        gone_count = gone_count + _count(mine_at & ~keep_mine) + _count(lead & ~keep_theirs)
        return work, added + _count(keep_spawn), jnp.where(fits, dropped, carry[2]), gone_count

    # every tile clears its claims; only a pass that fits writes anything else
    work, added, dropped, gone = over_tiles(n, tile, body, (work, jnp.int32(0), dropped, jnp.int32(0)))
    return work, jnp.where(fits, 0, need), added, dropped, gone


def _sign(words, gens):
    """s of i G P = s (P xor G) for each word P and its generator G (for anticommuting pairs)."""
    x, z = halves(words)
    gx, gz = halves(gens)
    return pauli_words.product_sign(x, z, gx, gz)


def end_rules(kind, limits: Limits, cfg: Config) -> Limits:
    """The rules a unit of this kind applies to every live word at its end (the rotations apply theirs
    inside): a Clifford run the weight rule, unless it ran gate by gate (the other rules do not change
    under a Clifford); channels the coefficient rule (per gate: after the last of a unit's channels,
    which scale by at most 1, it drops what it would after each), or all of them per layer; the end of
    a step whose rotations deferred their rules (TRUNCATE) all of them; other units none."""
    clifford, channel, truncate = (kind == schedule.U_CLIFFORD), (kind == schedule.U_CHANNEL), (kind == schedule.U_TRUNCATE)
    weight_each = cfg.rules.weight_each_gate
    everything = truncate | (channel & (cfg.rules.per == "layer"))
    on = dict(max_weight=everything | (clifford & (not weight_each)), min_abs_coeff=everything | channel,
              max_terms=everything, max_sins=everything)
    return limits.off_unless_each(on)


ENDING = (schedule.U_CLIFFORD, schedule.U_CHANNEL, schedule.U_TRUNCATE)  # the unit kinds whose rules act at their end


def run(T: dict, work: Work, n, unit, step, params, limits: Limits, cfg: Config):
    """Apply units `unit` .. num_units - 1 (starting at pass `step` of the first) to the prefix [0, n).
    Stops at a pass whose appended words would not fit (State.need > 0). Returns the State."""
    num_units = T["num_units"]
    rotations = (schedule.U_SPLIT, schedule.U_LAYER)
    # the kernels read every unit's tables made once (a unit's own cost about twenty small launches); the XLA
    # passes make each unit's own (2-core CPU, 3x3 Ising: the shared tables ran 10% slower, made for every
    # padded unit)
    layers = (layers_of(T, params, work.words.shape[1] // 2, work.coeffs.dtype)
              if cfg.fused and any(k in cfg.units for k in rotations) else None)
    unit_functions = ((clifford_unit, (schedule.U_CLIFFORD,)), (functools.partial(rotation_unit, layers=layers), rotations),
                      (channel_unit, (schedule.U_CHANNEL,)))

    def body(st):
        # every kind of unit the program holds, each active only for its own: a loop of zero trips costs
        # nothing, where a lax.switch around loops that scatter made XLA:CPU copy the buffers each trip
        u = st.unit
        kind = T["u_kind"][u]
        for f, kinds in unit_functions:
            if any(k in cfg.units for k in kinds):
                st = f(st, u, T, params, limits, cfg, functools.reduce(jnp.logical_or, [kind == k for k in kinds]))
        # the other units' rules at their ends, and their compaction: one loop for every kind (none in a program
        # of rotations alone: each loop of zero trips costs a GPU's unit its test)
        if any(k in cfg.units for k in ENDING):
            whole = functools.reduce(jnp.logical_or, [kind == k for k in ENDING])
            live = jnp.where(whole, st.n, 0)
            work, dropped = _tile_rules(st.work, live, end_rules(kind, limits, cfg), cfg, st.dropped)
            work, n = compact(work, live, cfg)
            st = st._replace(work=work, dropped=dropped, n=jnp.where(whole, n, st.n))
        done = st.need == 0
        return st._replace(unit=jnp.where(done, u + 1, u), terms=st.terms.at[u].set(st.n),
                           peak=jnp.maximum(st.peak, st.n))

    init = State(work, jnp.asarray(n, jnp.int32), jnp.asarray(unit, jnp.int32), jnp.asarray(step, jnp.int32),
                 jnp.int32(0), jnp.zeros(5, work.coeffs.dtype), jnp.zeros(T["u_kind"].shape[0], jnp.int32),
                 jnp.asarray(n, jnp.int32))
    return lax.while_loop(lambda s: (s.unit < num_units) & (s.need == 0), body, init)


def value(work: Work, n, table, tile: int):
    """sum over the live words of coefficient * <state| P |state> (overlap_table's product state)."""
    def body(start, total):
        w, c = take(work.words, start, tile), take(work.coeffs, start, tile)
        x, z = halves(w)
        ov = table_overlaps(x, z, table).astype(c.dtype)
        return total + jnp.sum(jnp.where(start + jnp.arange(tile) < n, c * ov, 0))

    return over_tiles(n, tile, body, jnp.zeros((), work.coeffs.dtype))


def load(work: Work, words, coeffs, n) -> Work:
    """The observable (host-merged: distinct words, padded) into the prefix of the buffers."""
    return work._replace(words=put(work.words, 0, words), coeffs=put(work.coeffs, 0, coeffs),
                         sins=put(work.sins, 0, jnp.zeros(coeffs.shape[0], jnp.int32)))


# ---- the observable's merge, on the host ----------------------------------------------------------------

def distinct_words(x, z) -> tuple:
    """An observable's words (x and z lanes, (t, W) each) without duplicates, on the host: (the distinct
    words (u, 2W) in np.unique's order, each term's index among them (t,), their Pauli weights (u,))."""
    t = len(x)
    words = np.concatenate([np.asarray(x, np.uint32).reshape(t, -1), np.asarray(z, np.uint32).reshape(t, -1)], 1)
    uniq, inverse = np.unique(words, axis=0, return_inverse=True)
    w = uniq.shape[1] // 2
    return uniq, inverse.reshape(-1), popcount_numpy(uniq[:, :w] | uniq[:, w:]).sum(-1)


def host_merge(x: np.ndarray, z: np.ndarray, coeffs: np.ndarray, limits: Limits) -> tuple:
    """Distinct words of the observable with their summed coefficients, the per-term rules applied
    (numpy: an observable is small; `limits` in the coefficients' dtype, as the loop compares). Returns
    (words (t, 2W), coeffs (t,), dropped (5,))."""
    coeffs = np.asarray(coeffs)
    dropped = np.zeros(5)
    if len(coeffs) == 0:
        return np.concatenate([np.asarray(x, np.uint32), np.asarray(z, np.uint32)], axis=1), coeffs, dropped
    uniq, inverse, weight = distinct_words(x, z)
    summed = np.zeros(len(uniq), coeffs.dtype)
    np.add.at(summed, inverse, coeffs)
    heavy, small, _ = violations(limits, summed, weight)
    dropped[0], dropped[1] = np.abs(summed[heavy]).sum(), np.abs(summed[small]).sum()
    keep = ~heavy & ~small
    return uniq[keep], summed[keep], dropped
