"""Reverse mode of the estimator (pauliprop/propagation/adjoint.py): gradients in the circuit parameters and in
the observable's coefficients, through every gate kind, with and without truncation.

Untruncated, the gradient is the exact one (state vector, density matrix, central differences).
Truncated, it is the derivative of the estimator with its support frozen: it must equal JAX's own
reverse mode through the engine (an independent derivation of the same thing) and central
differences wherever the support does not change between the two evaluation points.
"""

from __future__ import annotations

import math
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.models import ansatz
from pauliprop.propagation import adjoint

from .. import _reference as R
from .._strategies import (ALL_KINDS, CAPACITY, SMALL_CAPACITY, SMALL_OPS, SMALL_TERMS, UNITARY_KINDS, UNITARY_OPS,
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


# ---- each unit's transpose -------------------------------------------------------------------------

def _unit_adjoint_mismatch(circuit, h, params, trunc, cap, seed=0):
    """Run the engine's units one by one; for each, check that its backward map is the transpose of
    its coefficient map with the truncation frozen: <lam, f(c)> = <f^T(lam), c> for a random lam
    (f is linear in c once its decisions are fixed). Returns (units run, largest relative mismatch)."""
    from pauliprop.propagation import propagate as P
    from pauliprop.propagation import engine

    low = P.lowered(circuit, trunc)
    dtype = jnp.result_type(float)
    p = jnp.asarray(P.params_array(params, circuit.num_params, dtype))
    buf = jax.tree_util.tree_map(jnp.asarray, P._initial_buffer(h, cap, dtype))
    cfg, limits = P.config(low, trunc, cap, False, jax.default_backend()), trunc.limits(dtype)
    T = {k: jnp.asarray(v) for k, v in low.tables.items()}
    step = jax.jit(lambda b, u: engine.apply_unit(b, u, T, p, limits, cfg)[0])
    back = jax.jit(lambda b, u, lam: adjoint.unit_backward(b, u, lam, T, p, limits, cfg)[0])
    rng, worst = np.random.default_rng(seed), 0.0
    for u in range(low.units.length):
        out = step(buf, u)
        lam = jnp.asarray(rng.normal(size=cap))
        lhs = float(jnp.sum(lam * jnp.where(out.live, out.coeffs, 0)))
        rhs = float(jnp.sum(back(buf, u, lam) * jnp.where(buf.live, buf.coeffs, 0)))
        worst = max(worst, abs(lhs - rhs) / max(1.0, abs(lhs)))
        buf = out
    return low.units.length, worst


@pytest.mark.usefixtures("several_rooms")
@pytest.mark.parametrize("case", ["overflow", "max_terms", "max_weight"])
def test_every_unit_backward_is_the_transpose_of_its_coefficient_map(case):
    """Also where a cut drops words and spawned words reuse their slots (capacity overflow,
    max_terms) or Clifford runs drop heavy words."""
    c, h, p = _layered()
    c.h(1).cx(1, 2).s(3)  # Cliffords after the rotations: the first gates propagated
    trunc, cap = {"overflow": (pp.Truncation(min_abs_coeff=1e-3), 1024),
                  "max_terms": (pp.Truncation(max_terms=200, min_abs_coeff=1e-4), 1024),
                  "max_weight": (pp.Truncation(max_weight=3), 1024)}[case]
    units, worst = _unit_adjoint_mismatch(c, h, p, trunc, cap)
    assert units > 10 and worst < 1e-12


@settings(max_examples=3)
@given(st.data())
def test_noisy_unit_backwards_are_the_transposes_of_their_maps(data):
    n = data.draw(st.integers(1, 3))
    c = build(n, data.draw(anchored_ops(n, SMALL_OPS, ALL_KINDS, noise=True)))
    h = paulisum(data.draw(observable_terms(n, SMALL_TERMS, distinct=True)).items(), n)
    _, worst = _unit_adjoint_mismatch(c, h, data.draw(params_vector()), pp.Truncation(min_abs_coeff=1e-2),
                                      SMALL_CAPACITY)
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

def test_every_segment_length_gives_the_same_gradient(monkeypatch):
    """Reverse mode replays segments of `seg` units from saved starts: one unit per segment, the
    default (about sqrt of the units) and one segment for all must agree (exactly on CPUs), batched too."""
    c, h, p = _layered()
    trunc, out = pp.Truncation(min_abs_coeff=1e-3, max_weight=4), []
    batch = jnp.stack([jnp.asarray(p), 0.5 * jnp.asarray(p)])
    default = adjoint.segment_length
    for choose in (lambda n: 1, default, lambda n: n):
        monkeypatch.setattr(adjoint, "segment_length", choose)
        f = lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=1024)
        out.append((jax.value_and_grad(f)(jnp.asarray(p)), jax.vmap(jax.value_and_grad(f))(batch)))
    # bit for bit on CPUs; a GPU's reductions may round the last bit differently (H100, 2026-11-25)
    same = np.testing.assert_array_equal if jax.default_backend() == "cpu" else partial(
        np.testing.assert_allclose, rtol=1e-13, atol=1e-15)
    (one_a, many_a) = out[0]
    for one_b, many_b in out[1:]:
        same(np.asarray(one_a[0]), np.asarray(one_b[0]))
        same(np.asarray(one_a[1]), np.asarray(one_b[1]))
        same(np.asarray(many_a[1]), np.asarray(many_b[1]))
    same(np.asarray(many_a[1][0]), np.asarray(one_a[1]))


def test_reverse_mode_memory_grows_as_the_square_root_of_depth():
    """Hardware-efficient circuits of 330 and 660 gates: the gradient equals the state vector's, and
    doubling the depth grows the compiled program's scratch memory far less than 2x (about sqrt(2):
    the saved segment starts and one segment's unit inputs)."""
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
