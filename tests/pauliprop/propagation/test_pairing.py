"""Pairing through a hash table (pauliprop/propagation/pairing.py).

Property: after `pair`, every turning word P knows the slot of P xor G when that word is in the
buffer (and UNPAIRED when it is not), whatever the tile size (pairs whose members sit in different
tiles meet all the same); words that do not turn say NOT_TURNING; each pair, and each word without a
partner, claimed one slot of the table; and `clear` (like the pass that consumes the pairing) leaves
the table empty.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pauliprop.algebra import words as W
from pauliprop.propagation import pairing, tiled
from pauliprop.propagation.truncation import Rules

CAPACITY = 256


def _turn(g):
    gx, gz = jnp.asarray(g[:, 0]), jnp.asarray(g[:, 1])
    gen = jnp.concatenate([gx, gz])

    def turn(words, valid):
        lanes = words.shape[1] // 2
        t = valid & W.anticommutes(words[:, :lanes], words[:, lanes:], gx, gz)
        return t, jnp.zeros(words.shape[0], jnp.int32), words ^ gen, t.astype(jnp.int32)

    return turn


@pytest.mark.parametrize("tile", [256, 64, 16])
@settings(max_examples=15, deadline=None)
@given(st.integers(1, 2), st.integers(1, CAPACITY), st.integers(0, 2**31 - 1))
def test_every_turning_word_finds_its_partner(tile, lanes, n, seed):
    rng = np.random.default_rng(seed)
    # few bits set, so that many words have their partner in the buffer
    pool = rng.integers(0, 4, size=(4 * CAPACITY, 2 * lanes)).astype(np.uint32)
    pool = np.unique(pool, axis=0)[:n]
    n = len(pool)
    g = np.zeros((lanes, 2), np.uint32)
    g[rng.integers(lanes), rng.integers(2)] = 1 + rng.integers(0, 3)
    words = np.zeros((CAPACITY, 2 * lanes), np.uint32)
    words[:n] = pool
    work = tiled.empty_work(CAPACITY, lanes, jnp.float64)._replace(words=jnp.asarray(words))
    cfg = tiled.Config(capacity=CAPACITY, tile=tile, rules=Rules(), units=(), clifford=(False,) * 3)
    work, turning, most = jax.jit(lambda w, k: pairing.pair(w, k, _turn(g), cfg))(work, jnp.int32(n))
    partner = np.asarray(work.partner)[:n]
    gen = np.concatenate([g[:, 0], g[:, 1]])
    where = {row.tobytes(): i for i, row in enumerate(pool)}
    x, z = pool[:, :lanes], pool[:, lanes:]
    turns = (np.unpackbits(((x & g[:, 1]) ^ (z & g[:, 0])).view(np.uint8), axis=1).sum(1) % 2) == 1
    assert int(turning) == int(turns.sum()) and int(most) == int(turns.any())
    for i in range(n):
        if not turns[i]:
            assert partner[i] == pairing.NOT_TURNING
        else:
            assert partner[i] == where.get((pool[i] ^ gen).tobytes(), pairing.UNPAIRED)
    # each pair claimed one slot, each lone word one
    slots = np.asarray(work.slot)[:n]
    claimed = slots[slots >= 0]
    assert len(set(claimed.tolist())) == len(claimed) == int(np.sum(turns & ((partner == pairing.UNPAIRED)
                                                                           | (np.arange(n) < partner))))
    cleared = pairing.clear(work, jnp.int32(n), tile)
    assert bool(jnp.all(cleared.table == pairing.EMPTY))


def test_table_mask_is_a_power_of_two_of_at_least_four_times_the_words():
    for n in (0, 1, 2, 3, 5, 1000, 4096):
        mask = int(pairing.table_mask(jnp.int32(n), 1 << 20)) + 1
        assert mask & (mask - 1) == 0 and mask >= 4 * n
    assert int(pairing.table_mask(jnp.int32(1 << 20), 1 << 12)) + 1 == 1 << 12


def test_a_full_table_still_pairs(monkeypatch):
    """Words walk as many rounds as they need: with the table only as large as the words (no room to
    spare: long walks), every word still pairs or claims."""
    monkeypatch.setattr(pairing, "table_mask", lambda n, size: (jnp.minimum(
        jnp.left_shift(jnp.int32(1), 32 - jax.lax.clz(jnp.maximum(n - 1, 1).astype(jnp.uint32)).astype(jnp.int32)),
        size) - 1).astype(jnp.uint32))
    test_every_turning_word_finds_its_partner.hypothesis.inner_test(16, 1, CAPACITY, 3)
