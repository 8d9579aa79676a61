"""Adjoint differentiation of the state vector (pauliprop/statevector/adjoint.py): value and gradient
equal JAX's reverse mode through statevector.expectation on random circuits over the whole unitary
gate table, under jit and vmap too; its compiled scratch does not grow with depth; bad input names
the cause."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.statevector import simulator as SV
from pauliprop.statevector.adjoint import value_and_grad

from .._strategies import NUM_PARAMS, build, gate, observable_terms, params_vector, paulisum, states


@st.composite
def cases(draw, max_n=5, length=14, num_terms=4):
    n = draw(st.integers(1, max_n))
    ops = [draw(gate(n)) for _ in range(length)]
    return build(n, ops), paulisum(draw(observable_terms(n, num_terms)), n), draw(params_vector()), draw(states(n))


def padded(c):
    """The circuit with every parameter index used (its gradient then has NUM_PARAMS entries)."""
    for k in range(NUM_PARAMS):
        c.rz(0, 0 * pp.Param(k))
    return c


@settings(max_examples=6)
@given(cases())
def test_adjoint_value_and_gradient_equal_jax_reverse_mode(case):
    c, h, p, state = case
    c = padded(c)
    value, grad = jax.jit(lambda q: value_and_grad(c, h, q, state))(p)
    want_value, want_grad = jax.value_and_grad(lambda q: SV.expectation(c, h, q, state))(jnp.asarray(p))
    assert abs(float(value) - float(want_value)) < 1e-10
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), atol=1e-10)


def test_vmap_over_parameter_sets_equals_the_loop():
    c = pp.ansatz.hardware_efficient(4, 2, rotations=("ry", "rz"), entangler="cx")
    h = pp.hamiltonians.tfim(4)
    batch = jnp.asarray(np.random.default_rng(1).uniform(-2, 2, (4, c.num_params)))
    values, grads = jax.vmap(lambda q: value_and_grad(c, h, q, "+"))(batch)
    for k in range(4):
        v, g = value_and_grad(c, h, batch[k], "+")
        assert abs(float(values[k]) - float(v)) < 1e-12
        np.testing.assert_allclose(np.asarray(grads[k]), np.asarray(g), atol=1e-12)


def test_scratch_memory_does_not_grow_with_depth_where_reverse_mode_does():
    h = pp.hamiltonians.tfim(10)

    def scratch(f, layers):
        c = pp.ansatz.hardware_efficient(10, layers, rotations=("ry",), entangler="cz")
        p = jnp.zeros(c.num_params)
        return jax.jit(lambda q: f(c, q)).lower(p).compile().memory_analysis().temp_size_in_bytes

    adjoint = [scratch(lambda c, q: value_and_grad(c, h, q), layers) for layers in (4, 40)]
    reverse = [scratch(lambda c, q: jax.value_and_grad(lambda r: SV.expectation(c, h, r))(q), layers) for layers in (4, 40)]
    assert adjoint[1] < 1.5 * adjoint[0], adjoint  # ten times the gates, the same few states
    assert reverse[1] > 5 * reverse[0], reverse  # a state kept per gate


def test_bad_input_names_the_cause():
    c = pp.Circuit(3).rx(0, pp.Param(0)).cx(0, 1)
    with pytest.raises(ValueError, match="observable acts on 2 qubits but the circuit has 3"):
        value_and_grad(c, pp.PauliSum.from_labels({"ZZ": 1.0}), jnp.zeros(1))
    with pytest.raises(ValueError, match="uses 1 parameter\\(s\\) but params is None"):
        value_and_grad(c, pp.PauliSum.from_labels({"ZZI": 1.0}))
    with pytest.raises(ValueError, match="params has shape \\(2,\\); the circuit has 1 parameter"):
        value_and_grad(c, pp.PauliSum.from_labels({"ZZI": 1.0}), jnp.zeros(2))
    with pytest.raises(ValueError, match="'depolarize' is a noise channel"):
        value_and_grad(pp.Circuit(1).depolarize(0, 0.1), pp.PauliSum.from_labels({"Z": 1.0}))
