"""Prefix sums (pauliprop/prefix.py): equal to numpy's cumulative sum on both code paths (the native scan
and the blocked CPU sum, padded when the size is not a multiple of the block)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pauliprop.prefix import prefix_count


@pytest.mark.parametrize("size", [1, 10, 4095, 4096, 5000, 8192, 10001])
@pytest.mark.parametrize("kind", ["bool", "int"])
def test_prefix_count_is_the_cumulative_sum(size, kind):
    rng = np.random.default_rng(size)
    a = rng.random(size) < 0.3 if kind == "bool" else rng.integers(0, 3, size)
    got = prefix_count(jnp.asarray(a))
    assert got.dtype == jnp.int32 and got.shape == (size,)
    np.testing.assert_array_equal(np.asarray(got), np.cumsum(a))
