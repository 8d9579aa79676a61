"""Objectives for variational loops (pauliprop/propagation/objective.py): a pure params -> <H> function whose
capacity is fixed once, its compiled value_and_grad, refitting after an overflow, and an optax VQE."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pauliprop as pp
from pauliprop.models import ansatz


def _case(n=4, layers=2, seed=0):
    c = ansatz.hardware_efficient(n, layers, rotations=("ry", "rz"), entangler="cz")
    h = pp.hamiltonians.heisenberg(n, h=0.3)
    return c, h, np.random.default_rng(seed).uniform(-1, 1, c.num_params)


def test_the_objective_is_the_estimator_with_a_probed_power_of_two_capacity():
    c, h, p = _case()
    trunc = pp.Truncation(min_abs_coeff=1e-3)
    f = pp.expectation_fn(c, h, p, truncation=trunc, headroom=2)
    _, stats = pp.propagate(c, h, p, trunc)
    peak = int(stats.max_terms_seen)
    assert f.capacity & (f.capacity - 1) == 0 and 2 * peak <= f.capacity < 4 * peak + 64
    assert float(f(jnp.asarray(p))) == pytest.approx(float(pp.expectation(c, h, p, truncation=trunc,
                                                                          capacity=f.capacity)), abs=1e-12)


def test_value_and_grad_is_the_exact_gradient_and_compiles_once():
    c, h, p = _case()
    f = pp.expectation_fn(c, h, p)
    exact = jax.value_and_grad(lambda q: pp.expectation(c, h, q, method="statevector"))
    for k in range(3):
        q = jnp.asarray(p + 0.2 * k)
        v, g = f.value_and_grad(q)
        v_ref, g_ref = exact(q)
        assert abs(float(v) - float(v_ref)) < 1e-10
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-9)
    assert f.value_and_grad._cache_size() == 1


def test_coefficients_are_an_argument_and_their_gradient_is_each_terms_expectation():
    c, h, p = _case(n=3)
    f = pp.expectation_fn(c, h, p)
    coeffs = jnp.asarray(np.random.default_rng(1).normal(size=len(h)))
    assert float(f(p, coeffs)) == pytest.approx(float(pp.expectation(c, pp.PauliSum(h.x, h.z, coeffs, 3), p,
                                                                     method="statevector")), abs=1e-10)
    g = jax.grad(f, argnums=1)(jnp.asarray(p), coeffs)
    each = [float(pp.expectation(c, pp.PauliSum(h.x[t:t + 1], h.z[t:t + 1], np.ones(1), 3), p, method="statevector"))
            for t in range(len(h))]
    np.testing.assert_allclose(np.asarray(g), each, atol=1e-10)
    with pytest.raises(ValueError, match=rf"coeffs must have shape \({len(h)},\)"):
        f(p, jnp.ones(len(h) + 1))


def test_stats_ride_along_as_auxiliary_output():
    c, h, p = _case(n=3)
    f = pp.expectation_fn(c, h, p, return_stats=True)
    (v, stats), g = f.value_and_grad(jnp.asarray(p))
    assert not bool(stats.overflow) and int(stats.capacity) == f.capacity
    assert g.shape == (c.num_params,) and abs(float(v) - float(f(jnp.asarray(p))[0])) < 1e-12


def test_an_overflow_elsewhere_is_reported_and_refit_makes_room():
    """At zero angles every rotation is the identity, so the probe needs only the observable's own
    words; at random angles the support grows past that capacity, which must be reported, and
    refit at those angles must give an objective that holds it."""
    c, h, p = _case(n=5, layers=3)
    trunc = pp.Truncation(min_abs_coeff=1e-4)
    f = pp.expectation_fn(c, h, np.zeros(c.num_params), truncation=trunc, headroom=1, return_stats=True)
    with pytest.warns(RuntimeWarning, match=f"capacity {f.capacity} overflowed"):
        _, stats = f(jnp.asarray(p))
        jax.effects_barrier()
    assert bool(stats.overflow)
    g = f.refit(p)
    assert g.capacity > f.capacity and f.refit(np.zeros(c.num_params)) is f
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _, stats = g(jnp.asarray(p))
        jax.effects_barrier()
    assert not bool(stats.overflow) and int(stats.capacity) == g.capacity


def test_bad_settings_name_the_cause():
    c, h, p = _case(n=3)
    with pytest.raises(ValueError, match="unknown method 'dense'"):
        pp.expectation_fn(c, h, p, method="dense")
    with pytest.raises(ValueError, match="headroom must be >= 1"):
        pp.expectation_fn(c, h, p, headroom=0.5)


def _hva(n, layers):
    """TFIM's Hamiltonian-variational ansatz from |+>^n: per layer RZZ on every edge, RX on every qubit."""
    c = pp.Circuit(n)
    k = 0
    for _ in range(layers):
        for a, b in pp.hamiltonians.chain(n):
            c.rzz(a, b, pp.Param(k))
            k += 1
        for q in range(n):
            c.rx(q, pp.Param(k))
            k += 1
    return c


def test_an_optax_vqe_reaches_the_tfim_ground_energy():
    """The dozen-line loop of the README: 6-qubit critical TFIM, adam, to 1e-3 of the exact energy."""
    n, layers = 6, 3
    h = pp.hamiltonians.tfim(n, 1.0, 1.0)
    e0 = float(np.linalg.eigvalsh(h.to_matrix())[0])
    c = _hva(n, layers)
    # a Trotterized ramp from -X to H as the start (random small angles stall in a local plateau)
    ramp = []
    for layer in range(layers):
        t = (layer + 1) / (layers + 1)
        ramp += [-2 * 0.8 * t] * (n - 1) + [-2 * 0.8 * (1 - t)] * n
    params = jnp.asarray(ramp)
    energy = pp.expectation_fn(c, h, params, state="+")
    opt = optax.adam(0.03)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        e, g = jax.value_and_grad(energy)(params)
        updates, state = opt.update(g, state)
        return optax.apply_updates(params, updates), state, e

    for _ in range(300):
        params, state, e = step(params, state)
    assert abs(float(energy(params)) - e0) <= 1e-3 * abs(e0)
