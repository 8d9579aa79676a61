"""Prefix sums (stream compaction's core), fast on both backends."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def prefix_count(a):
    """Inclusive prefix sum of a boolean or int mask, as int32.

    XLA:CPU lowers cumsum to a reduce-window that takes 4 ms at 2.6e5 elements on 2 cores; a
    two-level blocked sum is 5x faster there. GPUs keep the native scan.
    """
    a = a.astype(jnp.int32)
    n = a.shape[0]
    block = 1024
    if not on_cpu() or n < 4 * block:
        return jnp.cumsum(a)
    pad = -n % block
    rows = jnp.cumsum(jnp.pad(a, (0, pad)).reshape(-1, block), axis=1)
    carry = jnp.cumsum(rows[:, -1]) - rows[:, -1]
    return (rows + carry[:, None]).reshape(-1)[:n]
