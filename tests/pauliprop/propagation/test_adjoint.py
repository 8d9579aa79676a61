"""Reverse mode of the estimator (pauliprop/propagation/adjoint.py): gradients in the circuit parameters and in
the observable's coefficients, through every gate kind, with and without truncation.

Untruncated, the gradient is the exact one (state vector, density matrix, central differences).
Truncated, it is the derivative of the estimator with its support frozen: it must equal JAX's own
reverse mode through the engine (an independent derivation of the same thing) and central
differences wherever the support does not change between the two evaluation points.
"""

from __future__ import annotations

import math
import re
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
from pauliprop.propagation.propagate import gradient_records, traced_lowering

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

def _unit_adjoint_mismatch(circuit, h, params, trunc, cap, seed=0, explicit=False, layers=False):
    """Run the engine's units one by one, each recorded (adjoint._record_units: a row, or a LAYER unit's
    row a pass), and check for each: its output is the plain unit's; the transpose of its
    rows (adjoint._sweep: cotangents of the input coefficients and of the parameters) equals that of
    the unit's coefficient map (in the coefficients and the parameters, its truncation decisions
    frozen where the forward took them) for a random cotangent: JAX's VJP of the map, or for a LAYER
    unit (a while loop of passes, which JAX's reverse mode cannot take) the map's Jacobian by forward
    mode. With `explicit`, also the whole matrix: the rows' transpose of every unit vector against
    the Jacobian. Returns (units run, LAYER units among them, largest mismatch)."""
    from pauliprop.propagation import propagate as P
    from pauliprop.propagation import engine, schedule

    low = P.lowered(circuit, trunc, layers=layers)
    dtype = jnp.result_type(float)
    p = jnp.asarray(P.params_array(params, circuit.num_params, dtype))
    buf = jax.tree_util.tree_map(jnp.asarray, P._initial_buffer(h, cap, dtype))
    cfg, limits = P.config(low, trunc, cap, False, jax.default_backend()), trunc.limits(dtype)
    T = {k: jnp.asarray(v) for k, v in low.tables.items()}
    lanes = buf.words.shape[1] // 2
    most = int(max(low.units.count.max(initial=1), 1))
    # loops JAX can reverse (a LAYER unit's is not: those units take forward mode)
    static = cfg._replace(static_loops=most, units=tuple(k for k in cfg.units if k != schedule.U_LAYER))

    def coeff_map(coeffs, q, b, u, config=static):
        out = engine.apply_unit(b._replace(coeffs=coeffs), u, T, q, limits, config)[0]
        return jnp.where(out.live, out.coeffs, 0)

    step = jax.jit(lambda b, u: engine.apply_unit(b, u, T, p, limits, cfg)[0])

    @jax.jit
    def recorded(b, u):
        state = adjoint._start(b, jnp.int32(0), cfg)
        state, stack, k, _ = adjoint._record_units(T, p, limits, cfg, u, 1, 1, state,
                                                   adjoint._empty_stack(most + 1, cap, dtype, cfg, lanes),
                                                   jnp.int32(0), True)
        return state[0], (stack, k)

    def transpose(rows, lam):
        stack, k = rows
        lam_in, d_rot = adjoint._sweep(T, p, stack, 0, k, lam, jnp.zeros(T["rot_index"].shape[0], dtype))
        return lam_in, adjoint._param_grads(T, d_rot, p)

    back = jax.jit(transpose)
    vjp = jax.jit(lambda b, u, lam: jax.vjp(lambda c, q: coeff_map(c, q, b, u), b.coeffs, p)[1](lam))
    forward = partial(coeff_map, config=cfg._replace(static_loops=most))
    matrix = jax.jit(lambda b, u: jax.jacfwd(forward)(b.coeffs, p, b, u))
    param_matrix = jax.jit(lambda b, u: jax.jacfwd(forward, argnums=1)(b.coeffs, p, b, u))
    columns = jax.jit(jax.vmap(lambda rows, lam: transpose(rows, lam)[0], in_axes=(None, 0)))
    rng, worst = np.random.default_rng(seed), 0.0
    for u in range(low.units.length):
        out = step(buf, u)
        out_r, rows = recorded(buf, u)
        # the same words and slots; the coefficients to the last bits (the unit compiles in another loop)
        np.testing.assert_array_equal(np.asarray(out.words), np.asarray(out_r.words))
        np.testing.assert_array_equal(np.asarray(out.meta), np.asarray(out_r.meta))
        np.testing.assert_allclose(np.asarray(out.coeffs), np.asarray(out_r.coeffs), rtol=1e-14, atol=1e-16)
        np.testing.assert_allclose(np.asarray(out.dropped), np.asarray(out_r.dropped), rtol=1e-12, atol=1e-14)
        # a cotangent on the output's words (a unit that changes nothing records no row: the sweep's
        # identity, which keeps the dead slots' cotangent at 0)
        lam = jnp.where(out.live, jnp.asarray(rng.normal(size=cap)), 0)
        lam_in, dp = back(rows, lam)
        if low.units.kind[u] == schedule.U_LAYER:
            lam_ref, dp_ref = lam @ matrix(buf, u), lam @ param_matrix(buf, u)
        else:
            lam_ref, dp_ref = vjp(buf, u, lam)
        scale = max(1.0, float(jnp.abs(lam_ref).max()), float(jnp.abs(dp_ref).max(initial=0)))
        worst = max(worst, float(jnp.abs(lam_in - lam_ref).max()) / scale,
                    float(jnp.abs(dp - dp_ref).max(initial=0)) / scale)
        if explicit:  # row k of the map's matrix is the transpose of the k-th unit vector
            m, live = matrix(buf, u), np.asarray(out.live)
            worst = max(worst, float(jnp.abs(columns(rows, jnp.eye(cap, dtype=dtype)) - m)[live].max(initial=0)))
        buf = out
    return low.units.length, int(np.sum(low.units.kind == schedule.U_LAYER)), worst


@pytest.mark.usefixtures("several_rooms")
@pytest.mark.parametrize("case", ["overflow", "max_terms", "max_weight", "layers overflow", "layers max_weight",
                                  "layers per layer"])
def test_every_unit_record_is_the_transpose_of_its_coefficient_map(case):
    """Also where a cut drops words and spawned words reuse their slots (capacity overflow,
    max_terms) or Clifford runs drop heavy words; and a layer's passes (LAYER units: each word turned
    by its own rotation of the layer), per gate and with the rules deferred to the layer's end."""
    c, h, p = _layered()
    c.h(1).cx(1, 2).s(3)  # Cliffords after the rotations: the first gates propagated
    trunc, cap = {"overflow": (pp.Truncation(min_abs_coeff=1e-3), 1024),
                  "max_terms": (pp.Truncation(max_terms=200, min_abs_coeff=1e-4), 1024),
                  "max_weight": (pp.Truncation(max_weight=3), 1024),
                  "per layer": (pp.Truncation(max_terms=200, min_abs_coeff=1e-4, per="layer"), 512)}[
        case.removeprefix("layers ")]
    if case.startswith("layers"):
        cap //= 4  # each LAYER unit's reference is its whole Jacobian, by forward mode
    units, layer_units, worst = _unit_adjoint_mismatch(c, h, p, trunc, cap, layers=case.startswith("layers"))
    assert units >= 10 and worst < 1e-12
    assert (layer_units >= 3) == case.startswith("layers")


@pytest.mark.parametrize("branches", ["switch", "select"])
def test_unit_records_are_the_transposes_of_the_explicit_matrices(monkeypatch, branches):
    """Small buffers: every unit's whole transpose against the Jacobian of its map (forward mode),
    through Clifford runs, rotations (paired and spawning; alone and a layer's passes), channels, a
    per-layer truncation, the merges (the observable's, amplitude damping's); by the CPUs' switch over
    the unit kinds and by the GPUs' select."""
    monkeypatch.setattr(adjoint, "on_cpu", lambda: branches == "switch")
    c = pp.Circuit(3).rx(0, pp.Param(0)).h(1).rzz(0, 1, pp.Param(1)).cx(1, 2).ry(2, pp.Param(2))
    c.amplitude_damp(0, 0.3).depolarize(2, 0.1)
    c.pauli_rotation("XYZ", [0, 1, 2], 2 * pp.Param(0) + 0.3).s(0).rx(1, pp.Param(1))
    h = pp.PauliSum.from_list([("ZZ", [0, 1], 0.7), ("X", [2], -0.4), ("ZZ", [0, 1], 0.1)], 3)
    c.rx(0, pp.Param(2)).rx(1, 0.4).rx(2, pp.Param(0))  # a layer of three: a LAYER unit, beside SPLIT ones
    for trunc in (pp.Truncation(), pp.Truncation(min_abs_coeff=0.05, per="layer")):
        units, layer_units, worst = _unit_adjoint_mismatch(c, h, [0.3, -1.1, 0.8], trunc, 64, explicit=True,
                                                           layers=True)
        assert units > 5 and worst < 1e-12 and layer_units > 0


@settings(max_examples=3)
@given(st.data())
def test_noisy_unit_records_are_the_transposes_of_their_maps(data):
    """Channels and amplitude damping (a merge of each word with its damped copy) too."""
    n = data.draw(st.integers(1, 3))
    c = build(n, data.draw(anchored_ops(n, SMALL_OPS, ALL_KINDS, noise=True)))
    h = paulisum(data.draw(observable_terms(n, SMALL_TERMS, distinct=True)).items(), n)
    _, _, worst = _unit_adjoint_mismatch(c, h, data.draw(params_vector()), pp.Truncation(min_abs_coeff=1e-2),
                                         SMALL_CAPACITY, explicit=True, layers=data.draw(st.booleans()))
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
def test_truncated_gradients_equal_jax_reverse_mode_through_the_engine(trunc, monkeypatch):
    """JAX differentiating the propagated sum (its own checkpointed reverse mode of every gather,
    sort and cut) and the adjoint sweep derive the same frozen-support gradient independently (both
    with a unit a rotation: JAX's reverse mode takes no layer's loop of passes)."""
    from pauliprop.propagation import engine

    monkeypatch.setattr(engine, "layers_for", lambda *a, **k: False)
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


@pytest.mark.parametrize("trunc", [pp.Truncation(min_abs_coeff=1e-3), pp.Truncation(max_weight=3),
                                   pp.Truncation(min_abs_coeff=1e-4, max_weight=4, max_sins=6),
                                   pp.Truncation(max_terms=300, min_abs_coeff=1e-4, per="layer")],
                         ids=["min_abs", "max_weight", "rules", "per layer"])
def test_layers_of_rotations_give_the_gradient_of_the_rotations_one_by_one(trunc, monkeypatch):
    """A layer's passes (LAYER units, each word turned by its own rotation of the layer) are the
    rotations one by one, truncated per gate (or at the step's end): the same value and gradient,
    batched too, where the buffer does not overflow (an overflow's cut is a layer's own)."""
    from pauliprop.propagation import engine, schedule

    c, h, p = _layered()
    batch = jnp.asarray(np.stack([p, 0.7 * p, -p]))
    f = lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=4096)
    got = []
    for layers in (True, False):
        monkeypatch.setattr(engine, "layers_for", lambda *a, on=layers, **k: on)
        units = traced_lowering(c, h, trunc, 4096).units
        assert np.any(units.kind == schedule.U_LAYER) == layers
        got.append((jax.value_and_grad(f)(jnp.asarray(p)), jax.vmap(jax.value_and_grad(f))(batch)))
    (one, many), (one_ref, many_ref) = got
    exact = float(pp.expectation(c, h, p, method="statevector"))
    assert abs(float(one_ref[0]) - exact) > 1e-6  # the truncation does act
    for a, b in ((one, one_ref), (many, many_ref)):
        np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(a[1]), np.asarray(b[1]), rtol=1e-10, atol=1e-12)


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


# ---- memory: records, or checkpoints and one replay -----------------------------------------------

def test_recorded_and_checkpointed_reverse_modes_give_the_same_gradient(record_budget, monkeypatch):
    """All records kept, or segment starts kept and each segment replayed once (segments of one unit,
    the default of about sqrt(units), one for all): the same gradient, batched too."""
    c, h, p = _layered()
    trunc, out = pp.Truncation(min_abs_coeff=1e-3, max_weight=4), []
    batch = jnp.stack([jnp.asarray(p), 0.5 * jnp.asarray(p)])
    f = lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=1024)
    out.append((jax.value_and_grad(f)(jnp.asarray(p)), jax.vmap(jax.value_and_grad(f))(batch)))
    default = adjoint.segment_length
    for choose in (lambda n: 1, default, lambda n: n):
        monkeypatch.setattr(adjoint, "segment_length", choose)
        record_budget(0)
        out.append((jax.value_and_grad(f)(jnp.asarray(p)), jax.vmap(jax.value_and_grad(f))(batch)))
    # to the last bits: each program's reductions may round them differently (a batch's on CPUs too)
    same = partial(np.testing.assert_allclose, rtol=1e-13, atol=1e-15)
    (one_a, many_a) = out[0]
    for one_b, many_b in out[1:]:
        same(np.asarray(one_a[0]), np.asarray(one_b[0]))
        same(np.asarray(one_a[1]), np.asarray(one_b[1]))
        same(np.asarray(many_a[1]), np.asarray(many_b[1]))
    same(np.asarray(many_a[1][0]), np.asarray(one_a[1]))


@pytest.fixture
def record_budget(monkeypatch):
    """set(bytes): adjoint.RECORD_BUDGET for this test. The budget is read when a gradient is traced, and
    JAX keeps traces: they are cleared on each change and after the test."""

    def set_budget(nbytes):
        monkeypatch.setattr(adjoint, "RECORD_BUDGET", nbytes)
        jax.clear_caches()

    yield set_budget
    monkeypatch.setattr(adjoint, "RECORD_BUDGET", None)
    jax.clear_caches()


def _sorts(fn, *args) -> int:
    """Sort instructions of fn's compiled program: each copy of the engine's loop body holds the same."""
    return len(re.findall(r"= \S+ sort\(", jax.jit(fn).lower(*args).compile().as_text()))


@pytest.mark.parametrize("budget", ["fits", "short"])
def test_reverse_mode_runs_each_unit_once_and_replays_only_what_the_stack_cannot_hold(record_budget, monkeypatch,
                                                                                      budget):
    """The gradient program holds one copy of the engine's loop body, as the value's does (no unit run
    inside a VJP, no separate replay loop): the forward pass records and the sweep only transposes.
    The stack holds the rows stack_rows allows: all a forward pass can write (a third on CPUs) where
    they fit the budget, times the batch; else one segment's, and the segments it could not record
    replay once, in the same loop body. The gradient is the state vector's either way."""
    c, h, p = _layered(n=4, layers=2)
    cap, batch = 256, 4
    rows, nbytes = gradient_records(c, h, pp.Truncation(), cap)
    per_row = nbytes // rows.full
    record_budget((rows.full + rows.segment + 1) * per_row * batch if budget == "fits" else 0)
    chosen, stack_rows = [], adjoint.stack_rows
    monkeypatch.setattr(adjoint, "stack_rows", lambda *a: chosen.append(stack_rows(*a)) or chosen[-1])
    f = lambda q: pp.expectation(c, h, q, capacity=cap)
    ps = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (batch, c.num_params)))
    vals, grads = jax.jit(jax.vmap(jax.value_and_grad(f)))(ps)
    cpu = jax.default_backend() == "cpu"
    full = max(rows.full // 3, 2 * rows.segment) if cpu else rows.full
    assert set(chosen) == {min(full, rows.full) if budget == "fits" else rows.segment}  # traced twice: vmap
    v_ref, g_ref = jax.vmap(jax.value_and_grad(lambda q: pp.expectation(c, h, q, method="statevector")))(ps)
    np.testing.assert_allclose(np.asarray(vals), np.asarray(v_ref), atol=1e-10)
    np.testing.assert_allclose(np.asarray(grads), np.asarray(g_ref), atol=1e-8)
    assert _sorts(jax.vmap(jax.value_and_grad(f)), ps) == _sorts(jax.vmap(f), ps) > 0


def test_reverse_mode_memory_holds_its_stack_or_grows_as_the_square_root_of_depth(record_budget):
    """Hardware-efficient circuits of 330 and 660 gates: the gradient equals the state vector's; with
    the budget's default the program's scratch memory holds the stack stack_rows allows; with none,
    doubling the depth grows it far less than 2x (about sqrt(2): the saved segment starts and one
    segment's rows)."""
    n, cap = 4, 256  # room for all 4^4 words: untruncated
    h = pp.PauliSum.from_list([("ZZ", [0, 1], 0.7), ("X", [3], -0.4), ("ZXZ", [1, 2, 3], 0.2)], n)
    scratch = []
    for budget, layers in ((None, 30), (0, 30), (0, 60)):
        record_budget(budget)
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
        if budget is None:
            rows, nbytes = gradient_records(c, h, pp.Truncation(), cap)
            held = adjoint.stack_rows(rows, nbytes // rows.full, jax.default_backend() == "cpu")
            assert held > rows.segment and scratch[-1] >= held * (nbytes // rows.full)
    assert scratch[1] < scratch[0] and scratch[2] < 1.6 * scratch[1], scratch
