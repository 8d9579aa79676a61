"""Prefix sums and first_set (pauliprop/runtime/prefix.py): the prefix count equals numpy's cumulative sum on both
code paths (the native scan and the blocked CPU sum, padded when the size is not a multiple of the
block); first_set lists the first k set indices on both of its paths (bit-packed search, prefix count)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pauliprop.runtime.prefix import first_set, prefix_count


@pytest.mark.parametrize("size", [1, 10, 4095, 4096, 5000, 8192, 10001])
@pytest.mark.parametrize("kind", ["bool", "int"])
def test_prefix_count_is_the_cumulative_sum(size, kind):
    rng = np.random.default_rng(size)
    a = rng.random(size) < 0.3 if kind == "bool" else rng.integers(0, 3, size)
    got = prefix_count(jnp.asarray(a))
    assert got.dtype == jnp.int32 and got.shape == (size,)
    np.testing.assert_array_equal(np.asarray(got), np.cumsum(a))


@pytest.mark.parametrize("size", [8, 31, 33, 1000, 4096, 10001])
@pytest.mark.parametrize("k", [1, 3, 100, 1300])
def test_first_set_lists_the_first_k_set_indices(size, k):
    rng = np.random.default_rng(size + k)
    mask = rng.random(size) < 0.2
    want = np.flatnonzero(mask)[:k]
    want = np.concatenate([want, np.full(k - len(want), size)])
    np.testing.assert_array_equal(np.asarray(first_set(jnp.asarray(mask), k)), want)
