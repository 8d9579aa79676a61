"""Several observables through one propagation (pauliprop/propagation/shared.py): exact untruncated, linear in the
observables under any truncation, batchable, and clear about what it cannot differentiate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.models import ansatz

from .._strategies import CAPACITY, UNITARY_KINDS, UNITARY_OPS, UNITARY_TERMS, anchored_ops, build, observable_terms, \
    params_vector, paulisum, states


@settings(max_examples=2)  # each example compiles afresh; linearity below covers the truncated case
@given(n=st.integers(1, 3), k=st.integers(1, 4), data=st.data())
def test_untruncated_estimates_equal_the_state_vector_for_every_observable(n, k, data):
    c = build(n, data.draw(anchored_ops(n, UNITARY_OPS, UNITARY_KINDS)))
    observables = [paulisum(data.draw(observable_terms(n, UNITARY_TERMS)), n) for _ in range(k)]
    p, state = data.draw(params_vector()), data.draw(states(n))
    got = pp.expectations(c, observables, p, state=state, capacity=CAPACITY)
    want = [float(pp.expectation(c, o, p, state=state, method="statevector")) for o in observables]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-10)


def _case(n=6):
    c = ansatz.hardware_efficient(n, 3, rotations=("rx", "rz"), entangler="rzz")
    p = np.random.default_rng(0).uniform(-1.2, 1.2, c.num_params)
    return c, p


def test_truncated_estimates_are_linear_in_the_observables():
    """The support is frozen by the union run, so <a H1 + b H2> = a <H1> + b <H2> exactly, truncated too."""
    c, p = _case()
    h1, h2 = pp.hamiltonians.tfim(6, 1.0, 0.7), pp.hamiltonians.heisenberg(6, h=-0.4)
    trunc = pp.Truncation(min_abs_coeff=1e-3, max_weight=4)
    v = np.asarray(pp.expectations(c, [h1, h2, h1 * 0.5 + h2 * -2.0], p, truncation=trunc))
    assert abs(v[2] - (0.5 * v[0] - 2.0 * v[1])) < 1e-12
    exact = [float(pp.expectation(c, h, p, method="statevector")) for h in (h1, h2)]
    assert np.abs(v[:2] - exact).max() > 1e-8  # the truncation does act


def test_one_observable_of_positive_coefficients_is_the_single_estimate():
    """Its weights are its coefficients, so the shared run is the single run, truncation and all."""
    c, p = _case()
    h = pp.hamiltonians.tfim(6, -1.0, -0.7)  # -J ZZ - h X with J, h < 0: every coefficient positive
    assert np.all(np.asarray(h.coeffs) > 0)
    trunc = pp.Truncation(min_abs_coeff=1e-3)
    v = pp.expectations(c, [h], p, truncation=trunc, capacity=4096)
    assert float(v[0]) == pytest.approx(float(pp.expectation(c, h, p, truncation=trunc, capacity=4096)), abs=1e-12)


def test_jit_and_vmap_over_parameter_sets_equal_the_loop():
    c, _ = _case(n=4)
    obs = [pp.hamiltonians.tfim(4), pp.PauliSum.from_list([("Z", [1], 1.0)], 4)]
    batch = np.random.default_rng(2).uniform(-1, 1, (5, c.num_params))
    got = jax.jit(jax.vmap(lambda q: pp.expectations(c, obs, q, capacity=256)))(jnp.asarray(batch))
    for row, q in zip(np.asarray(got), batch):
        np.testing.assert_allclose(row, [float(pp.expectation(c, o, q, method="statevector")) for o in obs],
                                   atol=1e-10)


def test_coefficients_are_differentiable_and_params_say_why_not():
    c, p = _case(n=3)
    h = pp.hamiltonians.tfim(3)
    g = jax.grad(lambda cf: pp.expectations(c, [pp.PauliSum(h.x, h.z, cf, 3)], p, capacity=64)[0])(
        jnp.asarray(h.coeffs))
    each = [float(pp.expectation(c, pp.PauliSum(h.x[t:t + 1], h.z[t:t + 1], np.ones(1), 3), p, method="statevector"))
            for t in range(len(h))]
    np.testing.assert_allclose(np.asarray(g), each, atol=1e-10)
    with pytest.raises(ValueError, match="not differentiable in params.*vmap"):
        jax.grad(lambda q: pp.expectations(c, [h], q, capacity=64)[0])(jnp.asarray(p))


def test_bad_observable_lists_name_the_cause():
    c, p = _case(n=3)
    with pytest.raises(ValueError, match="at least one observable"):
        pp.expectations(c, [], p)
    with pytest.raises(TypeError, match="observable 1 is a str"):
        pp.expectations(c, [pp.hamiltonians.tfim(3), "ZZI"], p)
    with pytest.raises(ValueError, match="observable 1 acts on 4 qubits, observable 0 on 3"):
        pp.expectations(c, [pp.hamiltonians.tfim(3), pp.hamiltonians.tfim(4)], p)
