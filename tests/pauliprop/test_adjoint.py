"""Reverse mode of the estimator (pauliprop/adjoint.py): gradients in the circuit parameters and in
the observable's coefficients, through every gate kind, with and without truncation.

Untruncated, the gradient is the exact one (state vector, density matrix, central differences).
Truncated, it is the derivative of the estimator with its support frozen: it must equal JAX's own
reverse mode through the engine (an independent derivation of the same thing) and central
differences wherever the support does not change between the two evaluation points.
"""

from __future__ import annotations

import importlib
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop import adjoint, ansatz

from . import _reference as R
from ._strategies import (ALL_KINDS, CAPACITY, SMALL_CAPACITY, SMALL_OPS, SMALL_TERMS, UNITARY_KINDS, UNITARY_OPS,
                          UNITARY_TERMS, anchored_ops, build, observable_terms, params_vector, paulisum, states)


def _with_coeffs(h: pp.PauliSum, coeffs) -> pp.PauliSum:
    return pp.PauliSum(h.x, h.z, coeffs, h.num_qubits)


def _central(f, p, h=1e-5):
    """Central differences of a scalar numpy-able function, one coordinate at a time."""
    p = np.asarray(p, float)
    out = np.zeros_like(p)
    for k in range(p.size):
        e = np.zeros_like(p)
        e[k] = h
        out[k] = (float(f(p + e)) - float(f(p - e))) / (2 * h)
    return out


# ---- the records ---------------------------------------------------------------------------------

def _replay_records(circuit, h, params, trunc, cap):
    """Apply each gate's record to its input coefficients (numpy) and compare with what the engine
    produced: (number of gates, largest mismatch)."""
    P = importlib.import_module("pauliprop.propagate")  # the module (pp.propagate is the function)

    prog, arrays = P._lowered(circuit)
    p = jnp.asarray(params, float)
    setup = P._setup(arrays, h, p, trunc, cap, P._kinds(prog), lambda n: n)
    buf, (terms, c_in, live_out, recs) = jax.lax.scan(setup.recording_step, setup.buf, setup.rows)
    c_out = np.concatenate([np.asarray(c_in[1:]), np.asarray(jnp.where(buf.live, buf.coeffs, 0))[None]])
    worst = 0.0
    for t in range(setup.length):
        row = {k: v[t] for k, v in setup.rows.items()}
        angle = float(P._angle(row, p))
        code = np.asarray(recs.code[t]).astype(int)
        ca, cb = code & 7, code >> 3
        gamma = float(row["offset"])
        table = [1 - gamma, math.sqrt(max(1 - gamma, 0)), 0, 0] if int(row["kind"]) == 4 else np.asarray(row["sign"][:4])
        a = np.choose(ca, [0, 1, -1, math.cos(angle), *table])
        b = np.choose(cb, [0, math.sin(angle), -math.sin(angle), gamma])
        o1 = np.arange(cap) if recs.o1 is None else np.asarray(recs.o1[t])
        o2, ci = np.asarray(recs.o2[t]), np.asarray(c_in[t])
        pred = np.zeros(cap + 1)
        np.add.at(pred, np.minimum(o1, cap), a * ci)
        np.add.at(pred, np.minimum(o2, cap), b * ci)
        pred = np.where(np.asarray(live_out[t]), pred[:cap], 0)
        worst = max(worst, float(np.abs(pred - c_out[t]).max()))
    return setup.length, worst


@pytest.mark.parametrize("case", ["overflow", "max_terms", "max_weight"])
def test_every_gate_record_reproduces_its_coefficient_map(case):
    """A record is the gate's linear map with its truncation frozen: applied to the gate's input
    coefficients it must give exactly the engine's output, also where a cut drops words and spawned
    words reuse their slots (capacity overflow, max_terms) or Cliffords drop heavy words."""
    c, h, p = _layered()
    c.h(1).cx(1, 2).s(3)  # Cliffords after the rotations: the first gates propagated
    trunc, cap = {"overflow": (pp.Truncation(min_abs_coeff=1e-3), 1024),
                  "max_terms": (pp.Truncation(max_terms=200, min_abs_coeff=1e-4), 1024),
                  "max_weight": (pp.Truncation(max_weight=3), 1024)}[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gates, worst = _replay_records(c, h, p, trunc, cap)
    assert gates == len(c.instructions) and worst < 1e-12


@settings(max_examples=3)
@given(st.data())
def test_noisy_gate_records_reproduce_their_coefficient_maps(data):
    n = data.draw(st.integers(1, 3))
    c = build(n, data.draw(anchored_ops(n, SMALL_OPS, ALL_KINDS, noise=True)))
    h = paulisum(data.draw(observable_terms(n, SMALL_TERMS, distinct=True)).items(), n)
    _, worst = _replay_records(c, h, data.draw(params_vector()), pp.Truncation(min_abs_coeff=1e-2), SMALL_CAPACITY)
    assert worst < 1e-12


# ---- untruncated: the exact gradient ------------------------------------------------------------

@settings(max_examples=3)  # each example traces value_and_grad afresh
@given(n=st.integers(1, 3), data=st.data())
def test_untruncated_gradients_in_params_and_coefficients_equal_the_state_vector(n, data):
    ops = data.draw(anchored_ops(n, UNITARY_OPS, UNITARY_KINDS))
    c, h = build(n, ops), paulisum(data.draw(observable_terms(n, UNITARY_TERMS)), n)
    p, state = jnp.asarray(data.draw(params_vector())), data.draw(states(n))
    coeffs = jnp.asarray(h.coeffs)

    def pauli(q, cf):
        return pp.expectation(c, _with_coeffs(h, cf), q, state=state, capacity=CAPACITY)

    def exact(q, cf):
        return pp.expectation(c, _with_coeffs(h, cf), q, state=state, method="statevector")

    v, (gp, gc) = jax.value_and_grad(pauli, argnums=(0, 1))(p, coeffs)
    v_ref, (gp_ref, gc_ref) = jax.value_and_grad(exact, argnums=(0, 1))(p, coeffs)
    assert abs(float(v) - float(v_ref)) < 1e-10
    np.testing.assert_allclose(np.asarray(gp), np.asarray(gp_ref), atol=1e-8)
    np.testing.assert_allclose(np.asarray(gc), np.asarray(gc_ref), atol=1e-8)


@settings(max_examples=4)
@given(st.data())
def test_noisy_circuit_gradients_equal_central_differences_of_the_density_matrix(data):
    """Every kind (Cliffords, rotations, quarter turns, Pauli channels, amplitude damping) at once."""
    n = data.draw(st.integers(1, 3))
    ops = data.draw(anchored_ops(n, SMALL_OPS, ALL_KINDS, noise=True))
    terms = data.draw(observable_terms(n, SMALL_TERMS, distinct=True))
    p = data.draw(params_vector())
    c, h = build(n, ops), paulisum(terms.items(), n)
    g = jax.grad(lambda q: pp.expectation(c, h, q, capacity=SMALL_CAPACITY))(jnp.asarray(p))
    g_ref = _central(lambda q: R.dense_expectation(c, terms, q), p)
    np.testing.assert_allclose(np.asarray(g), g_ref, atol=1e-8)
    # the coefficients enter linearly: d<H>/dc_t = <P_t>
    gc = jax.grad(lambda cf: pp.expectation(c, _with_coeffs(h, cf), p, capacity=SMALL_CAPACITY))(jnp.asarray(h.coeffs))
    each = [R.dense_expectation(c, {lab: 1.0}, p) for lab in terms]
    np.testing.assert_allclose(np.asarray(gc), each, atol=1e-10)


def test_repeated_observable_terms_each_get_their_derivative():
    """The initial merge sums repeated words: each copy's coefficient has the same derivative."""
    c = pp.Circuit(2).ry(0, pp.Param(0)).cx(0, 1).rx(1, pp.Param(1))
    h = pp.PauliSum.from_list([("ZZ", [0, 1], 0.5), ("X", [1], 0.2), ("ZZ", [0, 1], -0.25)], 2)
    p = jnp.array([0.4, -0.9])
    gc = jax.grad(lambda cf: pp.expectation(c, _with_coeffs(h, cf), p, capacity=64))(jnp.asarray(h.coeffs))
    zz = float(pp.expectation(c, pp.PauliSum.from_labels({"ZZ": 1.0}), p, method="statevector"))
    x1 = float(pp.expectation(c, pp.PauliSum.from_list([("X", [1], 1.0)], 2), p, method="statevector"))
    np.testing.assert_allclose(np.asarray(gc), [zz, x1, zz], atol=1e-12)


# ---- truncated: the frozen-support derivative -----------------------------------------------------

def _layered(n=6, layers=3, seed=0):
    c = ansatz.hardware_efficient(n, layers, rotations=("rx", "rz"), entangler="rzz")
    p = np.random.default_rng(seed).uniform(-1.2, 1.2, c.num_params)
    h = pp.hamiltonians.tfim(n, 1.0, 0.7) + pp.PauliSum.from_list([("XYZ", [0, n // 2, n - 1], 0.3)], n)
    return c, h, p


TRUNCATIONS = [pp.Truncation(min_abs_coeff=1e-3), pp.Truncation(max_weight=3),
               pp.Truncation(max_terms=300), pp.Truncation(max_terms=200, min_abs_coeff=1e-4, max_weight=4)]


@pytest.mark.parametrize("trunc", TRUNCATIONS, ids=["min_abs", "max_weight", "max_terms", "all"])
def test_truncated_gradients_equal_jax_reverse_mode_through_the_engine(trunc):
    """JAX differentiating the propagated sum (its own checkpointed reverse mode of every gather,
    sort and cut) and the adjoint sweep derive the same frozen-support gradient independently."""
    c, h, p = _layered()
    cap = 1024  # min_abs alone overflows it: the cut of the overflow path is covered too
    warnings.simplefilter("ignore", RuntimeWarning)
    v, g = jax.value_and_grad(lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=cap))(jnp.asarray(p))
    v_jax, g_jax = jax.value_and_grad(
        lambda q: pp.overlap(pp.propagate(c, h, q, truncation=trunc, capacity=cap)[0]))(jnp.asarray(p))
    exact = float(pp.expectation(c, h, p, method="statevector"))
    assert abs(float(v) - exact) > 1e-6  # the truncation does act
    assert abs(float(v) - float(v_jax)) < 1e-12
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_jax), atol=1e-10)


def test_truncated_gradient_equals_central_differences_where_the_support_is_stable():
    c, h, p = _layered()
    trunc, cap, step = TRUNCATIONS[-1], 1024, 1e-6

    def run(q):
        val, stats = pp.expectation(c, h, q, truncation=trunc, capacity=cap, return_stats=True)
        return float(val), np.asarray(stats.terms)

    g = np.asarray(jax.grad(lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=cap))(jnp.asarray(p)))
    _, terms = run(p)
    checked = 0
    for k in range(p.size):
        e = np.zeros_like(p)
        e[k] = step
        (up, t_up), (down, t_down) = run(p + e), run(p - e)
        if not (np.array_equal(t_up, terms) and np.array_equal(t_down, terms)):
            continue  # a truncation decision flips within the step: no derivative to compare there
        assert abs((up - down) / (2 * step) - g[k]) < 1e-6, k
        checked += 1
    assert checked >= 0.8 * p.size


# ---- batching and compilation ------------------------------------------------------------------

def test_vmap_of_value_and_grad_over_64_parameter_sets_equals_the_loop():
    c, h, _ = _layered(n=4, layers=2)
    batch = np.random.default_rng(3).uniform(-math.pi, math.pi, (64, c.num_params))
    f = lambda q: pp.expectation(c, h, q, truncation=pp.Truncation(min_abs_coeff=1e-3), capacity=512)
    vals, grads = jax.jit(jax.vmap(jax.value_and_grad(f)))(jnp.asarray(batch))
    one = jax.jit(jax.value_and_grad(f))
    for k in range(64):
        v, g = one(jnp.asarray(batch[k]))
        assert abs(float(vals[k]) - float(v)) < 1e-12
        np.testing.assert_allclose(np.asarray(grads[k]), np.asarray(g), atol=1e-12)


def test_jit_of_value_and_grad_compiles_once_per_circuit_shape():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    c, h, p = _layered(n=4, layers=2)
    step = jax.jit(jax.value_and_grad(lambda q: pp.expectation(c, h, q, capacity=512)))
    inputs = [jnp.asarray(p + 0.1 * k) for k in range(4)]  # made before counting: no compiled op of its own
    outs = [step(inputs[0])]
    first = len(compiles)
    assert first >= 1
    outs += [step(q) for q in inputs[1:]]
    assert len(compiles) == first and step._cache_size() == 1  # new parameters: no new compilation
    exact = jax.value_and_grad(lambda q: pp.expectation(c, h, q, method="statevector"))
    for q, (v, g) in zip(inputs, outs):
        v_ref, g_ref = exact(q)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-8)


# ---- memory -----------------------------------------------------------------------------------------

def test_stored_records_and_checkpointed_replay_give_the_same_gradient(monkeypatch):
    """Under the record budget every gate's record is kept (one forward pass); over it, sqrt(L)
    segments are replayed. The two reverse modes must agree exactly, batched too."""
    c, h, p = _layered()
    trunc, out = pp.Truncation(min_abs_coeff=1e-3, max_weight=4), []
    batch = jnp.stack([jnp.asarray(p), 0.5 * jnp.asarray(p)])
    for budget in (1 << 40, 0):
        monkeypatch.setattr(adjoint, "RECORD_BUDGET", budget)
        f = lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=1024)
        out.append((jax.value_and_grad(f)(jnp.asarray(p)), jax.vmap(jax.value_and_grad(f))(batch)))
    (one_a, many_a), (one_b, many_b) = out
    assert float(one_a[0]) == float(one_b[0])
    np.testing.assert_array_equal(np.asarray(one_a[1]), np.asarray(one_b[1]))
    np.testing.assert_array_equal(np.asarray(many_a[1]), np.asarray(many_b[1]))
    np.testing.assert_array_equal(np.asarray(many_a[1][0]), np.asarray(one_a[1]))


def test_reverse_mode_memory_grows_as_the_square_root_of_depth(monkeypatch):
    """Hardware-efficient circuits of 330 and 660 gates: the gradient equals the state vector's, and
    doubling the depth grows the compiled program's scratch memory far less than 2x (about sqrt(2):
    the saved segment starts and one segment's records). With no record budget, reverse mode always
    checkpoints."""
    monkeypatch.setattr(adjoint, "RECORD_BUDGET", 0)
    n, cap = 4, 256  # room for all 4^4 words: untruncated
    h = pp.PauliSum.from_list([("ZZ", [0, 1], 0.7), ("X", [3], -0.4), ("ZXZ", [1, 2, 3], 0.2)], n)
    scratch = []
    for layers in (30, 60):
        c = ansatz.hardware_efficient(n, layers, rotations=("ry", "rz"), entangler="cz", final_rotations=False)
        p = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, c.num_params))
        f = lambda q: pp.expectation(c, h, q, capacity=cap)
        compiled = jax.jit(jax.value_and_grad(f)).lower(p).compile()
        scratch.append(compiled.memory_analysis().temp_size_in_bytes)
        if layers == 30:
            assert len(c.instructions) == 330
            v, g = compiled(p)
            v_ref, g_ref = jax.value_and_grad(lambda q: pp.expectation(c, h, q, method="statevector"))(p)
            assert abs(float(v) - float(v_ref)) < 1e-10
            np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-8)
    assert scratch[1] < 1.6 * scratch[0], scratch
