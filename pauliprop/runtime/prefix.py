"""Prefix sums and first-k selection of a mask (stream compaction's core), fast on both backends."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from . import devices


def on_cpu() -> bool:
    return devices.backend() == "cpu"


def count(mask):
    """True entries of a mask as int32 (a plain sum widens to int64 under x64: twice the traffic)."""
    return jnp.sum(mask, dtype=jnp.int32)


def prefix_count(a):
    """Inclusive prefix sum of a boolean or int mask, as int32.

    XLA:CPU lowers cumsum to a reduce-window that takes 4 ms at 2.6e5 elements on 2 cores. There a
    boolean mask is counted through its bits (32 to a word: a prefix sum over the words, then one
    popcount per element; 0.2 ms at 1.3e5 inside the propagation loop, against 0.37 ms for the
    two-level blocked sum that int masks take). GPUs keep the native scan.
    """
    n = a.shape[0]
    block = 1024
    if not on_cpu() or n < 4 * block:
        return jnp.cumsum(a.astype(jnp.int32))
    if a.dtype == jnp.bool_:
        packed, count = _packed(a)
        before = jnp.cumsum(count) - count
        through = jnp.uint32(0xFFFFFFFF) >> (31 - jnp.arange(32, dtype=jnp.uint32))  # bits 0..lane
        below = lax.population_count(packed[:, None] & through).astype(jnp.int32)
        return (before[:, None] + below).reshape(-1)[:n]
    a = a.astype(jnp.int32)
    pad = -n % block
    rows = jnp.cumsum(jnp.pad(a, (0, pad)).reshape(-1, block), axis=1)
    carry = jnp.cumsum(rows[:, -1]) - rows[:, -1]
    return (rows + carry[:, None]).reshape(-1)[:n]


def _packed(mask):
    """The mask as uint32 words (bit b of word w is entry 32 w + b) and each word's popcount."""
    bits = jnp.pad(mask, (0, -mask.shape[0] % 32)).reshape(-1, 32).astype(jnp.uint32)
    packed = jnp.sum(bits << jnp.arange(32, dtype=jnp.uint32), axis=1, dtype=jnp.uint32)
    return packed, lax.population_count(packed).astype(jnp.int32)


def first_set(mask, k: int):
    """Indices of the first k True entries of mask, in order; len(mask) fills the unused tail.

    For k <= n/8 the CPU finds each output's word by a binary search over the words' counts and its
    bit by a 5-step popcount search: 0.2-0.3 ms at 1.3e5 slots on the 2-core CPU. Larger k (and
    GPUs) scatter each set entry to its prefix count, which then costs less than k searches.
    """
    n = mask.shape[0]
    if not on_cpu() or 8 * k > n:
        dest = jnp.where(mask, prefix_count(mask) - 1, k)
        return jnp.full(k, n, jnp.int32).at[dest].set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    packed, count = _packed(mask)
    upto = jnp.cumsum(count)
    j = jnp.arange(k, dtype=jnp.int32)
    word_at = jnp.searchsorted(upto, j, side="right", method="scan").astype(jnp.int32)
    w = jnp.minimum(word_at, packed.shape[0] - 1)
    rank, word, pos = j - (upto[w] - count[w]), packed[w], jnp.zeros(k, jnp.int32)
    for width in (16, 8, 4, 2, 1):  # the rank-th set bit of the word
        low = lax.population_count(word & jnp.uint32((1 << width) - 1)).astype(jnp.int32)
        up = rank >= low
        rank, word, pos = jnp.where(up, rank - low, rank), jnp.where(up, word >> width, word), pos + up * width
    return jnp.where(word_at < packed.shape[0], w * 32 + pos, n)
