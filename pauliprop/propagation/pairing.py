"""Pairing without sorting: each turning word finds its partner P xor G through a hash table.

A pass of a rotation (tiled.py) turns the words P that anticommute with its generator G; P meets
only Q = P xor G, which turns too. So every turning word walks the probe sequence of its pair's
canonical member (the one whose bit at G's lowest site is 0), one slot a round, and stops at the
first slot that is empty (it claims it: a scatter-min of slot indices decides between claims of one
round) or that holds Q (paired). The two members of a pair walk the same sequence, and a slot once
claimed stays claimed until the pass ends, so whichever walks second finds the first. Tiles are
walked one after the other, each through rounds until every one of its words has claimed a slot or
found its partner. Words are compared whole: the result never depends on hash luck.

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
from ..runtime.prefix import count as _count
from .merge import pivot

EMPTY = 2**31 - 1  # a free table slot (above every index: claims are a scatter-min)
UNPAIRED = -2
PENDING = -3
NOT_TURNING = -4
LOOKUP = -5  # fused.py: a turning word whose partner is the canonical member, to look up
LOAD = 4  # the table part a pass uses holds LOAD slots a live word (2 ran slower on the CPU: 1.98 s against 1.55)


def _tiles(n, tile, body, carry):
    return lax.fori_loop(0, (n + tile - 1) // tile, lambda i, c: body(i * tile, c), carry)


def _take(a, start, tile):
    return lax.dynamic_slice_in_dim(a, start, tile, axis=0)


def _put(a, start, v):
    return lax.dynamic_update_slice_in_dim(a, v, start, axis=0)


def hash_lanes(lanes):
    """A 32-bit hash of packed words given as their lanes (each (T,) uint32; fused.py's kernels hold words
    so): a multiply-xorshift a lane, murmur's finaliser at the end."""
    h = jnp.full(lanes[0].shape, 0x9E3779B9, jnp.uint32)
    for lane in lanes:
        h = (h ^ lane) * jnp.uint32(0x85EBCA6B)
        h = h ^ (h >> 15)
    return pauli_words.mix32(h)


def _probe(words, partners):
    """(first slot hash, step) of each pair {P, Q}: a hash of its canonical member (an odd step)."""
    lane, mask = pivot(words ^ partners)
    up = (jnp.take_along_axis(words, lane[:, None], axis=1)[:, 0] & mask) != 0
    canon = jnp.where(up[:, None], partners, words)
    h1 = hash_lanes([canon[:, k] for k in range(canon.shape[1])])
    return h1, pauli_words.mix32(h1 ^ jnp.uint32(0x68E31DA4)) | jnp.uint32(1)


def table_mask(n, table_size: int):
    """The part of the table a pass over n words uses, less one: a power of two >= LOAD n (at most the table).
    The bits below LOAD n - 1 smeared, in uint32 (LOAD n passes int32 at 2^29 words), by ops the GPU's kernels
    lower too (fused.py calls it in its kernels)."""
    v = jnp.maximum(jnp.asarray(n).astype(jnp.uint32) * jnp.uint32(LOAD), jnp.uint32(2)) - jnp.uint32(1)
    for shift in (1, 2, 4, 8, 16):
        v = v | (v >> shift)
    return jnp.minimum(v, jnp.uint32(table_size - 1))


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


def pair(work, n, turn, cfg):
    """Pair the turning words of the prefix [0, n). turn(words, valid) -> (turning, rotation, partner
    words, the number of passes each word takes). Returns (work with `partner`, `rot`, `slot` and
    `table` filled, the number of turning words, the most passes any word takes)."""
    tile = cfg.tile
    mask = table_mask(n, work.table.shape[0])
    c = work.partner.shape[0]

    def one_tile(start, carry):
        work, turning_count, most = carry
        idx = start + jnp.arange(tile, dtype=jnp.int32)
        valid = idx < n
        w = _take(work.words, start, tile)
        turning, rot, partners, passes = turn(w, valid)
        h1, step = _probe(w, partners)

        def walking(cc):
            return jnp.any(cc[1] == PENDING)

        def one_round(cc):
            table, state, slot, r = cc
            table, state, slot = _round(table, work.words, r, state, slot, idx, h1, step, partners, mask)
            return table, state, slot, r + 1

        # rounds until every word of the tile has claimed a slot or found its partner (the tile's words
        # walk on before the next tile's start: a claimed slot stays claimed, so the order does not matter)
        state = jnp.where(turning, PENDING, NOT_TURNING).astype(jnp.int32)
        table, state, slot, _ = lax.while_loop(walking, one_round, (work.table, state, jnp.full(tile, -1, jnp.int32),
                                                                    jnp.int32(0)))
        partner = _put(work.partner, start, jnp.where(turning & (state < 0), UNPAIRED,
                                                      jnp.where(turning, state, NOT_TURNING)))
        partner = partner.at[jnp.where(state >= 0, state, c)].set(idx, mode="drop")
        work = work._replace(table=table, partner=partner, slot=_put(work.slot, start, slot),
                             rot=_put(work.rot, start, rot))
        return work, turning_count + _count(turning), jnp.maximum(most, jnp.max(jnp.where(valid, passes, 0)))

    return _tiles(n, tile, one_tile, (work, jnp.int32(0), jnp.int32(0)))


def clear(work, n, tile: int):
    """Empty the table slots the words of [0, n) claimed (a pass that is not applied)."""
    def body(start, table):
        s = _take(work.slot, start, tile)
        return table.at[jnp.where(s >= 0, s, table.shape[0])].set(EMPTY, mode="drop")

    return work._replace(table=_tiles(n, tile, body, work.table))
