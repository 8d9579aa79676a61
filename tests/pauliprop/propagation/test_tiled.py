"""The tiled engine (pauliprop/propagation/tiled.py): a concrete call with no capacity of the caller's.

Properties: untruncated it equals the state vector; truncated it is the same estimator as the loop of
engine.py (value, dropped 1-norm per rule); tiles of any size give the same answer (pairs meet across
tiles); a run compiles one propagation program however far its terms grow, and leaves its buffers fit
for the next run; a run past the memory it may take stops with a MemoryError that names the slots.
"""

from __future__ import annotations

import logging
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.models import kicked_ising_127 as ki
from pauliprop.propagation import pairing, propagate as prop, tiled

from .._strategies import (UNITARY_KINDS, UNITARY_OPS, UNITARY_TERMS, anchored_ops, build, commuting_rotations,
                          disjoint_rotation_layer, observable_terms, params_vector, paulisum, states)


@pytest.fixture(autouse=True, scope="module")
def _small_circuits_on_the_tiled_engine_too():
    """CPUs' runs go to the native engine (native.py) where its C library is built, and otherwise small runs
    to the loop first (propagate.SMALL_RUN_BOUND); here the tiled engine takes them all."""
    saved, prop.SMALL_RUN_BOUND = prop.SMALL_RUN_BOUND, {}
    with pytest.MonkeyPatch.context() as m:
        m.setenv(prop.NATIVE, "0")
        yield
    prop.SMALL_RUN_BOUND = saved


@st.composite
def unitary_case(draw, max_n=7):
    n = draw(st.integers(1, max_n))
    ops = draw(anchored_ops(n, UNITARY_OPS, UNITARY_KINDS))
    return n, ops, draw(observable_terms(n, UNITARY_TERMS)), draw(params_vector()), draw(states(n))


@settings(max_examples=25)
@given(unitary_case())
def test_untruncated_equals_statevector(case):
    n, ops, terms, params, state = case
    c, h = build(n, ops), paulisum(terms, n)
    assert prop.tiled_supported(c, pp.Truncation(), params, None)
    exact = float(pp.expectation(c, h, params, state=state, method="statevector"))
    assert abs(float(pp.expectation(c, h, params, state=state)) - exact) < 1e-10


def _old_loop(c, h, params, truncation, state="0"):
    """The same estimator on the loop of engine.py (propagate._drive)."""
    table = prop.state_table(state, c.num_qubits, h.num_lanes)
    _, stats, val = prop._drive(c, h, params, truncation, None, 1 << 26, None, table)
    return float(val), stats


truncations = st.builds(lambda w, c, s, per: pp.Truncation(max_weight=w, min_abs_coeff=c, max_sins=s, per=per),
                        st.sampled_from([None, 1, 2, 3]), st.sampled_from([None, 1e-3, 0.05, 0.2]),
                        st.sampled_from([None, 1, 3]), st.sampled_from(["gate", "layer"]))


@settings(max_examples=25)
@given(unitary_case(), truncations)
def test_truncated_is_the_loops_estimator(case, truncation):
    n, ops, terms, params, state = case
    c, h = build(n, ops), paulisum(terms, n)
    val, stats = pp.expectation(c, h, params, state=state, truncation=truncation, return_stats=True)
    old, old_stats = _old_loop(c, h, params, truncation, state)
    assert abs(float(val) - old) < 1e-10
    np.testing.assert_allclose(stats.dropped_norm, old_stats.dropped_norm, atol=1e-10)
    assert not bool(stats.overflow)


@st.composite
def commuting_case(draw, max_n=7):
    """Rounds of commuting rotations that share qubits (commuting_rotations), a Clifford between some of them:
    the tiled engine's layers of several rotations on one qubit."""
    n = draw(st.integers(2, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c, k = pp.Circuit(n), 0
    for _ in range(3):
        k = commuting_rotations(c, rng, k, int(rng.integers(2, 9)))
        if rng.random() < 0.5:
            c.h(int(rng.integers(n))).cx(0, n - 1)
    terms = draw(observable_terms(n, UNITARY_TERMS))
    return n, c, terms, rng.uniform(-1.5, 1.5, size=k), draw(states(n))


@settings(max_examples=20)
@given(commuting_case())
def test_commuting_layers_untruncated_equal_statevector(case):
    n, c, terms, params, state = case
    h = paulisum(terms, n)
    exact = float(pp.expectation(c, h, params, state=state, method="statevector"))
    assert abs(float(pp.expectation(c, h, params, state=state)) - exact) < 1e-10


@settings(max_examples=20)
@given(commuting_case(), truncations)
def test_commuting_layers_truncated_are_the_loops_estimator(case, truncation):
    """A layer's passes drop what the rotations one by one (the loop's SPLIT units) drop, gate by gate."""
    n, c, terms, params, state = case
    h = paulisum(terms, n)
    val, stats = pp.expectation(c, h, params, state=state, truncation=truncation, return_stats=True)
    old, old_stats = _old_loop(c, h, params, truncation, state)
    assert abs(float(val) - old) < 1e-10
    np.testing.assert_allclose(stats.dropped_norm, old_stats.dropped_norm, atol=1e-10)


def _layered(n: int, layers: int, rng) -> tuple[pp.Circuit, int]:
    """Layers of rotations on disjoint qubits in shuffled orders (one- and several-qubit generators, the
    passes of a layer), with Cliffords between them."""
    c, k = pp.Circuit(n), 0
    for _ in range(layers):
        k = disjoint_rotation_layer(c, rng, k)
        c.pauli_rotation("XYZ", [1, 4, 6], pp.Param(k)).cx(0, 3).h(5)
        k += 1
    return c, k


@pytest.mark.parametrize("tile", [64, 1 << 12])
def test_tiles_of_any_size_agree(monkeypatch, tile):
    """Pairs meet across tiles: the answer does not depend on where the tiles fall."""
    monkeypatch.setitem(prop.TILE, "cpu", tile)
    rng = np.random.default_rng(7)
    c, k = _layered(8, 3, rng)
    h = pp.PauliSum.from_labels({"ZZIIIIII": 1.0, "IIIXIIYI": 0.3, "IYIIZIIX": -0.2})
    params = rng.normal(size=k)
    exact = float(pp.expectation(c, h, params, method="statevector"))
    val, stats = pp.expectation(c, h, params, return_stats=True)
    assert abs(float(val) - exact) < 1e-10
    assert int(stats.max_terms_seen) > tile or tile > 64  # the small tiles really split the terms
    truncation = pp.Truncation(min_abs_coeff=0.01, max_weight=4)
    assert abs(float(pp.expectation(c, h, params, truncation=truncation)) - _old_loop(c, h, params, truncation)[0]) < 1e-10


def _compiled(fn):
    """(fn(), names of the programs XLA compiled while it ran)."""
    names = []

    class Count(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if "Finished XLA compilation of" in message:
                names.append(message.split(" of ")[1].split(" in ")[0])

    handler = Count()
    logging.getLogger("jax").addHandler(handler)
    jax.config.update("jax_log_compiles", True)
    try:
        return fn(), names
    finally:
        jax.config.update("jax_log_compiles", False)
        logging.getLogger("jax").removeHandler(handler)


def test_one_program_however_far_the_terms_grow():
    """The kicked Ising grows from one term to thousands: one propagation program, and a second call of
    another angle (the same shape) compiles nothing; the buffers a run leaves serve the next."""
    truncation = pp.Truncation(min_abs_coeff=1e-3, max_weight=8)
    h = ki.single_z(62)
    circuit = lambda theta: ki.kicked_ising(5, theta)
    (val, stats), names = _compiled(lambda: pp.expectation(circuit(math.pi / 4), h, truncation=truncation,
                                                           return_stats=True))
    assert int(stats.max_terms_seen) > 1000
    assert sum("_tiled_forward" in n for n in names) == 1, names
    again, names = _compiled(lambda: float(pp.expectation(circuit(math.pi / 8), h, truncation=truncation)))
    assert not any("_tiled_forward" in n for n in names), names
    assert abs(float(val) - _old_loop(circuit(math.pi / 4), h, None, truncation)[0]) < 1e-10
    assert abs(again - _old_loop(circuit(math.pi / 8), h, None, truncation)[0]) < 1e-10
    work = next(iter(prop._WORKSPACE.values()))
    assert bool(np.all(np.asarray(work.table) == pairing.EMPTY)) and not bool(np.any(np.asarray(work.gone)))


def test_growth_past_the_first_buffers_continues(monkeypatch):
    """A CPU run that outgrows its first buffers continues in larger ones, with the same answer."""
    monkeypatch.setattr(prop, "CPU_FIRST_BUDGET", 1 << 16)
    monkeypatch.setitem(prop.MIN_CAPACITY, "cpu", 64)
    prop._budget.cache_clear()
    try:
        rng = np.random.default_rng(3)
        c, k = _layered(8, 3, rng)
        h = pp.PauliSum.from_labels({"ZZIIIIII": 1.0})
        params = rng.normal(size=k)
        val, stats = pp.expectation(c, h, params, return_stats=True)
        assert stats.capacity > (1 << 16) // tiled.slot_bytes(1, 8)
        assert abs(float(val) - float(pp.expectation(c, h, params, method="statevector"))) < 1e-10
    finally:
        prop._budget.cache_clear()


def test_past_the_memory_a_memory_error_names_the_slots():
    """max_capacity (like the memory) bounds the buffers: a run that needs more stops, naming the slots."""
    rng = np.random.default_rng(5)
    c, k = _layered(10, 4, rng)
    h = pp.PauliSum.from_labels({"Z" * 10: 1.0})
    with pytest.raises(MemoryError, match=r"needs \d+ term slots at row \d+.*more than the 4096 slots"):
        pp.propagate(c, h, rng.normal(size=k), max_capacity=4096)


def test_propagate_returns_the_live_terms():
    """pp.propagate on the tiled engine: the live terms only, equal to the loop's (as an operator)."""
    rng = np.random.default_rng(11)
    c, k = _layered(8, 2, rng)
    h = pp.PauliSum.from_labels({"ZZIIIIII": 1.0, "IXIIYIII": 0.5})
    params = rng.normal(size=k)
    out, stats = pp.propagate(c, h, params)
    ref, _ = pp.propagate(c, h, params, capacity=4096)
    assert len(out) == int(stats.terms[0]) and np.all(np.asarray(out.coeffs) != 0)
    mine, theirs = out.to_dict(), ref.to_dict()  # (merged duplicates and zeros would shorten them)
    assert len(mine) == len(out)
    assert mine.keys() == theirs.keys() and all(abs(mine[k] - theirs[k]) < 1e-12 for k in mine)


def test_host_merge_sums_duplicates_and_applies_the_rules():
    """Duplicates are summed before the rules; a term both too heavy and too small is charged to the
    weight rule (its first), as the loop charges it."""
    x = np.array([[1], [1], [2], [0], [3]], np.uint32)
    z = np.array([[0], [0], [2], [0], [0]], np.uint32)
    limits = pp.Truncation(min_abs_coeff=1e-3, max_weight=1).limits(np.float64)
    words, coeffs, dropped = tiled.host_merge(x, z, np.array([0.5, 0.25, 1e-4, 2.0, 1e-5]), limits)
    got = {tuple(w): c for w, c in zip(words.tolist(), coeffs.tolist())}
    assert got == {(1, 0): 0.75, (0, 0): 2.0}
    assert dropped[0] == pytest.approx(1e-5) and dropped[1] == pytest.approx(1e-4)


def test_layer_passes_follow_the_layers_order():
    """turning_at's (j + 1)-th rotation is the layer's (j + 1)-th, for rotations given in decreasing
    qubit order (a backward walk over RX on 0..n-1) as for increasing."""
    import jax.numpy as jnp

    n = 8
    for down in (False, True):
        qubits = list(range(n))[::-1] if down else list(range(n))
        gx = np.zeros((32, 1), np.uint32)
        gz = np.zeros((32, 1), np.uint32)
        for i, q in enumerate(qubits):
            gz[i, 0] = 1 << q  # RZ: a word anticommutes where it has X or Y
        T = {"u_start": np.array([0]), "u_count": np.array([n]),
             "rot_gx": gx, "rot_gz": gz, "rot_index": np.full(32, -1), "rot_scale": np.zeros(32),
             "rot_offset": np.full(32, 0.3)}
        layer = tiled.layer_of(T, 0, jnp.zeros(0), 1, jnp.float64)
        word = jnp.array([[0b10100110, 0]], jnp.uint32)  # X on qubits 1, 2, 5, 7
        order = [int(tiled.turning_at(word, jnp.array([True]), j, layer)[1][0]) for j in range(4)]
        assert [qubits[i] for i in order] == [q for q in qubits if q in (1, 2, 5, 7)]
