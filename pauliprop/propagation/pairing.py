"""Pairing without sorting: each turning word finds its partner P xor G through a hash table.

A pass of a rotation (tiled.py) turns the words P that anticommute with its generator G; P meets
only Q = P xor G, which turns too. So every turning word walks the probe sequence of its pair's
canonical member (the one whose bit at G's lowest site is 0), one slot a round, and stops at the
first slot that is empty (it claims it: a scatter-min of slot indices decides between claims of one
round) or that holds Q (paired). The two members of a pair walk the same sequence, and a slot once
claimed stays claimed until the pass ends, so whichever walks second finds the first. Tiles are
walked one after the other, each through `ROUNDS` rounds; the few words still walking then take more
rounds together, gathered in a list (or, past its size, tile by tile again). Words are compared
whole: the result never depends on hash luck.

The table has twice the buffer's slots; a pass uses a power-of-two part of it at least four times
the live words (a quarter full at most, so a round pairs or places most walkers), and the pass that
consumes the pairing clears the slots its words claimed (`Work.slot`), so the table is empty between
passes.

After `pair`, for each word of the prefix: `Work.partner` holds its partner's slot, UNPAIRED (turning,
no partner) or NOT_TURNING; `Work.rot` the rotation it turns by; `Work.slot` the table slot it
claimed (-1: none).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..algebra import words as pauli_words
from ..runtime.prefix import count as _count, prefix_count
from .merge import pivot

EMPTY = 2**31 - 1  # a free table slot (above every index: claims are a scatter-min)
UNPAIRED = -2
PENDING = -3
NOT_TURNING = -4
ROUNDS = 2  # rounds each tile walks before the words still walking continue together
LIST = 1 << 12  # words still walking that continue in a list (more: tile by tile)


def _tiles(n, tile, body, carry):
    return lax.fori_loop(0, (n + tile - 1) // tile, lambda i, c: body(i * tile, c), carry)


def _take(a, start, tile):
    return lax.dynamic_slice_in_dim(a, start, tile, axis=0)


def _put(a, start, v):
    return lax.dynamic_update_slice_in_dim(a, v, start, axis=0)


def _probe(words, partners):
    """(first slot hash, step) of each pair {P, Q}: a hash of its canonical member (an odd step)."""
    lane, mask = pivot(words ^ partners)
    up = (jnp.take_along_axis(words, lane[:, None], axis=1)[:, 0] & mask) != 0
    canon = jnp.where(up[:, None], partners, words)
    h = jnp.full(canon.shape[0], 0x9E3779B9, jnp.uint32)
    for lane in range(canon.shape[1]):  # a multiply-xorshift a lane, murmur's finaliser at the end
        h = (h ^ canon[:, lane]) * jnp.uint32(0x85EBCA6B)
        h = h ^ (h >> 15)
    h1 = pauli_words.mix32(h)
    return h1, pauli_words.mix32(h1 ^ jnp.uint32(0x68E31DA4)) | jnp.uint32(1)


def table_mask(n, table_size: int):
    """The part of the table a pass over n words uses: a power of two >= 4 n (at most the table)."""
    want = jnp.left_shift(jnp.int32(1), 32 - lax.clz(jnp.maximum(4 * n - 1, 1).astype(jnp.uint32)).astype(jnp.int32))
    return (jnp.minimum(want, table_size) - 1).astype(jnp.uint32)


def _round(table, words, r, state, slot, idx, h1, step, partners, mask):
    """One round of the walk for the words whose state is PENDING; state becomes the partner's slot,
    UNPAIRED (claimed a slot) or stays PENDING."""
    size = table.shape[0]
    walking = state == PENDING
    s = ((h1 + r.astype(jnp.uint32) * step) & mask).astype(jnp.int32)
    claim = walking & (table[s] == EMPTY)
    table = table.at[jnp.where(claim, s, size)].min(idx, mode="drop")
    holder = table[s]
    won = claim & (holder == idx)
    met = walking & ~won & (holder != EMPTY)
    there = words[jnp.where(met, holder, 0)]
    paired = met & jnp.all(there == partners, axis=1)
    return table, jnp.where(won, UNPAIRED, jnp.where(paired, holder, state)), jnp.where(won, s, slot)


def _words_at(words, idx):
    return words[jnp.clip(idx, 0, words.shape[0] - 1)]


def _record(work, at, state, slot, idx, found, rot=None):
    """Write the walk's outcome for the words at `at` (a tile start, or a tuple of an index list): their
    codes and slots, and to each partner that a word `found`, that word's slot."""
    c = work.partner.shape[0]
    if isinstance(at, tuple):  # an index list: scatter
        (where,) = at
        partner = work.partner.at[where].set(state, mode="drop")
        slots = work.slot.at[where].set(slot, mode="drop")
    else:
        partner, slots = _put(work.partner, at, state), _put(work.slot, at, slot)
    partner = partner.at[jnp.where(found, state, c)].set(idx, mode="drop")
    work = work._replace(partner=partner, slot=slots)
    if rot is not None:
        work = work._replace(rot=_put(work.rot, at, rot))
    return work


def pair(work, n, turn, cfg):
    """Pair the turning words of the prefix [0, n). turn(words, valid) -> (turning, rotation, partner
    words, the number of passes each word takes). Returns (work with `partner`, `rot`, `slot` and
    `table` filled, the number of turning words, the most passes any word takes)."""
    tile = cfg.tile
    mask = table_mask(n, work.table.shape[0])
    listed = min(LIST, tile)

    def first(start, carry):
        work, turning_count, most, pending, waiting = carry
        idx = start + jnp.arange(tile, dtype=jnp.int32)
        valid = idx < n
        w = _take(work.words, start, tile)
        turning, rot, partners, passes = turn(w, valid)
        h1, step = _probe(w, partners)
        state = jnp.where(turning, PENDING, NOT_TURNING).astype(jnp.int32)
        slot = jnp.full(tile, -1, jnp.int32)
        table = work.table
        for r in range(ROUNDS):
            table, state, slot = _round(table, work.words, jnp.int32(r), state, slot, idx, h1, step, partners, mask)
        work = _record(work._replace(table=table), start, state, slot, idx, state >= 0, rot)
        still = state == PENDING
        at = jnp.where(still, pending + prefix_count(still) - 1, listed)
        waiting = waiting.at[at].set(idx, mode="drop")
        return (work, turning_count + _count(turning), jnp.maximum(most, jnp.max(jnp.where(valid, passes, 0))),
                pending + _count(still), waiting)

    carry = (work, jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.full(listed, work.partner.shape[0], jnp.int32))
    work, turning_count, most, pending, waiting = _tiles(n, tile, first, carry)

    def list_round(c):
        """One more round for the words still walking, gathered in the list (none past its size)."""
        work, r, _ = c
        idx = waiting
        valid = (idx < n) & (pending <= listed)
        w = _words_at(work.words, idx)
        turning, _, partners, _ = turn(w, valid)
        walking = turning & (work.partner[jnp.where(valid, idx, 0)] == PENDING)
        h1, step = _probe(w, partners)
        state = jnp.where(walking, PENDING, NOT_TURNING).astype(jnp.int32)
        table, state, slot = _round(work.table, work.words, r, state, jnp.full(listed, -1, jnp.int32), idx, h1,
                                    step, partners, mask)
        at = jnp.where(walking, idx, work.partner.shape[0])
        work = _record(work._replace(table=table), (at,), state, slot, idx, state >= 0)
        return work, r + 1, _count(state == PENDING)

    def tile_round(c):
        """One more round for every word still walking, tile by tile (more than the list holds; else no tile)."""
        work, r, left = c

        def body(start, cc):
            work, pending = cc
            idx = start + jnp.arange(tile, dtype=jnp.int32)
            valid = idx < n
            w = _take(work.words, start, tile)
            was = valid & (_take(work.partner, start, tile) == PENDING)
            _, _, partners, _ = turn(w, valid)
            h1, step = _probe(w, partners)
            state = jnp.where(was, PENDING, NOT_TURNING).astype(jnp.int32)
            table, state, slot = _round(work.table, work.words, r, state, _take(work.slot, start, tile), idx, h1,
                                        step, partners, mask)
            found = was & (state >= 0)
            state = jnp.where(was, state, _take(work.partner, start, tile))
            work = _record(work._replace(table=table), start, state, slot, idx, found)
            return work, pending + _count(was & (state == PENDING))

        work, still = _tiles(jnp.where(left > 0, n, 0), tile, body, (work, jnp.int32(0)))
        return work, r + 1, still

    # more rounds while any word walks: in the list, or (more walkers than it holds) tile by tile; one loop,
    # whose test GPUs wait for once a pass when no word walks (the tiles' loop runs no tile for a list)
    def more(c):
        work, r, left = c
        work, r_next, left_list = list_round((work, r, left))
        work, _, left_tiles = tile_round((work, r, jnp.where(pending > listed, left, 0)))
        return work, r_next, jnp.where(pending > listed, left_tiles, left_list)

    work, _, _ = lax.while_loop(lambda c: c[2] > 0, more, (work, jnp.int32(ROUNDS), pending))
    return work, turning_count, most


def clear(work, n, tile: int):
    """Empty the table slots the words of [0, n) claimed (a pass that is not applied)."""
    def body(start, table):
        s = _take(work.slot, start, tile)
        return table.at[jnp.where(s >= 0, s, table.shape[0])].set(EMPTY, mode="drop")

    return work._replace(table=_tiles(n, tile, body, work.table))
