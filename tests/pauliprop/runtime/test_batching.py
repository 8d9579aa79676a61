"""Batches that share the engine's control flow (pauliprop/runtime/batching.py): the shared branch index is
the batch's maximum, and every member still gets exactly its own result, also when members need
different rooms and cuts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pauliprop as pp
from pauliprop.models import ansatz
from pauliprop.runtime.batching import batch_size, batched, shared


def test_shared_reduces_over_the_batch_and_is_the_identity_outside_one():
    seen = []

    def f(x):
        seen.append(batch_size())
        return shared(x), shared(x > 2)

    g = batched(f)
    m, anyone = jax.vmap(g)(jnp.array([1, 5, 2]))
    assert m.tolist() == [5, 5, 5] and anyone.tolist() == [True, True, True]
    assert seen[-1] == 3
    one, flag = g(jnp.array(4))
    assert int(one) == 4 and bool(flag) and seen[-1] == 1


@pytest.mark.usefixtures("several_rooms")
def test_members_needing_different_rooms_and_cuts_each_get_their_own_estimate():
    """Zero angles split nothing, small angles a few words, large ones many (with max_terms cutting
    only there): the batch runs the largest room and the cut for all, and must equal the loop."""
    c = ansatz.hardware_efficient(6, 3, rotations=("rx", "rz"), entangler="rzz")
    h = pp.hamiltonians.tfim(6, 1.0, 0.7)
    rng = np.random.default_rng(5)
    batch = np.stack([np.zeros(c.num_params), 0.05 * rng.normal(size=c.num_params),
                      rng.uniform(-3, 3, c.num_params)])
    trunc = pp.Truncation(max_terms=300, min_abs_coeff=1e-6)
    f = lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=1024, return_stats=True)
    (vals, stats), grads = jax.vmap(jax.value_and_grad(f, has_aux=True))(jnp.asarray(batch))
    cut = np.asarray(stats.dropped_norm)[:, 3]  # the max_terms rule's dropped norm, per member
    assert cut[0] == 0 and cut[2] > 0  # only the last member needed the cut
    for k, q in enumerate(batch):
        (v, _), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(q))
        assert float(vals[k]) == float(v)
        if jax.default_backend() == "cpu":
            np.testing.assert_array_equal(np.asarray(grads[k]), np.asarray(g))
        else:  # a GPU's reductions may round the last bit differently in a batch (H100, 2026-11-25)
            np.testing.assert_allclose(np.asarray(grads[k]), np.asarray(g), rtol=1e-13, atol=1e-15)
