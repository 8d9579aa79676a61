"""The propagation loop's units (pauliprop/propagation/engine.py).

* A layer of rotations on disjoint supports as one LAYER unit (passes over the buffer, each word
  turned by its j-th anticommuting rotation) equals the rotations one by one: the same propagated
  sum, term for term, and the same dropped norms, under every per-term rule, through the buffer's
  growth (an overflowing pass leaves the layer unapplied and the loop resumes there) and in batches.
* The packed-bit selection that finds each word's j-th rotation is the j-th set bit.
* A rotation that meets none of the sites where the live words act skips its pass (CPUs) and changes
  nothing that a pass would have changed.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.propagation import engine
from pauliprop.propagation import schedule as S

N = 40  # two lanes, and words of over 16 qubits sort by fingerprint (merge.exact_words)

RULES = {"none": pp.Truncation(),
         "coeff and weight": pp.Truncation(min_abs_coeff=2e-3, max_weight=5),
         "sines": pp.Truncation(max_sins=2, min_abs_coeff=1e-4),
         "per layer, max_terms": pp.Truncation(max_terms=60, min_abs_coeff=1e-4, per="layer")}


@st.composite
def layered_circuits(draw, n=N, layers=3):
    """Layers of Pauli rotations on disjoint supports (1-3 qubits, Param or fixed angles), with a few
    Clifford gates between them; and an observable of up to 8 words."""
    c = pp.Circuit(n)
    for _ in range(layers):
        free = draw(st.permutations(range(n)))
        for _ in range(draw(st.integers(2, min(8, n // 3)))):
            k = draw(st.integers(1, 3))
            qubits, free = free[:k], free[k:]
            gen = draw(st.text("XYZ", min_size=k, max_size=k))
            angle = draw(st.one_of(st.floats(0.1, 3.0), st.builds(pp.Param, st.integers(0, 1))))
            c.append("pauli_rotation", list(qubits), angle, pauli=gen)
        for _ in range(draw(st.integers(0, 2))):
            a, b = draw(st.permutations(range(n)))[:2]
            c.cx(a, b).h(a)
    words = draw(st.lists(st.dictionaries(st.integers(0, n - 1), st.sampled_from("XYZ"), min_size=1, max_size=6),
                          min_size=1, max_size=8))
    coeffs = draw(st.lists(st.floats(0.2, 1.0), min_size=len(words), max_size=len(words)))
    obs = pp.PauliSum.from_list([("".join(w.values()), list(w), cf) for w, cf in zip(words, coeffs)], n)
    return c, obs


def _propagated(monkeypatch, layers: bool, circuit, obs, params, truncation, **kw):
    monkeypatch.setattr(engine, "layers_for", lambda backend, t: layers)
    out, stats = pp.propagate(circuit, obs, params, truncation=truncation, **kw)
    return out, stats


def _terms(ps: pp.PauliSum) -> dict:
    """{(x bytes, z bytes): coeff} of a propagated sum (batch member) with nonzero live words."""
    x, z, c = (np.asarray(a) for a in (ps.x, ps.z, ps.coeffs))
    return {(x[i].tobytes(), z[i].tobytes()): float(c[i]) for i in range(len(c)) if c[i] != 0}


def _assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= 1e-12 * max(1.0, abs(b[k]))


@settings(max_examples=12)
@given(layered_circuits(), st.sampled_from(sorted(RULES)), st.floats(-2.0, 2.0))
def test_a_layer_unit_equals_its_rotations_one_by_one(case, rules, angle):
    """From a small buffer that grows (an overflowing pass leaves its layer unapplied, and the loop
    resumes at the layer in a larger buffer): the same sum and dropped norms as SPLIT units."""
    circuit, obs = case
    params = np.array([angle, 0.7])
    with pytest.MonkeyPatch.context() as mp:
        got, got_stats = _propagated(mp, True, circuit, obs, params, RULES[rules], initial_capacity=64)
        ref, ref_stats = _propagated(mp, False, circuit, obs, params, RULES[rules], initial_capacity=64)
    _assert_same(_terms(got), _terms(ref))
    np.testing.assert_allclose(np.asarray(got_stats.dropped_norm), np.asarray(ref_stats.dropped_norm), atol=1e-12)
    assert not bool(got_stats.overflow)


def test_layers_in_a_batch_and_at_a_fixed_capacity_equal_the_state_vector(monkeypatch):
    """Untruncated, on 6 qubits: a batch of parameter sets through layers equals the state vector,
    growing from a small buffer and at a fixed capacity."""
    monkeypatch.setattr(engine, "layers_for", lambda backend, t: True)
    n = 6
    c = pp.Circuit(n)
    for step in range(3):
        for q in range(n):
            c.rx(q, pp.Param(0) if q % 2 else 0.3 + 0.1 * q)
        c.append("pauli_rotation", [0, 3], pp.Param(1), pauli="XY").append("pauli_rotation", [1, 4, 5], 0.4, pauli="ZZX")
        for q in range(0, n - 1, 2):
            c.cz(q, q + 1)
    from pauliprop.propagation import propagate as PR
    assert S.U_LAYER in PR.lowered(c, pp.Truncation(), "cpu", layers=True).units.kind
    # the two unit forms share one lowering of the circuit
    assert PR.lowered(c, pp.Truncation(), "cpu", layers=False).schedule is PR.lowered(c, pp.Truncation(), "cpu",
                                                                                         layers=True).schedule
    obs = pp.PauliSum.from_labels({"ZIIIIZ": 1.0, "XXIIII": -0.5, "IIYZII": 0.25})
    params = np.array([[0.4, -1.1], [math.pi / 2, 0.2], [2.5, 3.0]])
    exact = [float(pp.expectation(c, obs, p, method="statevector")) for p in params]
    for sizes in (dict(initial_capacity=64), dict(capacity=4096)):
        vals = np.asarray(pp.expectation(c, obs, params, **sizes))
        np.testing.assert_allclose(vals, exact, atol=1e-10)


def test_a_layer_whose_later_pass_reports_a_collision_is_left_unapplied(monkeypatch):
    """The loop resumes a layer that stopped (an overflow, a fingerprint collision) from its start,
    so a pass that stops must leave the buffer as the layer found it, earlier passes undone: here the
    second pass of RX(0) RX(1) on Z0 Z1 reports a collision."""
    from pauliprop.propagation import propagate as PR
    from pauliprop.propagation import merge as M
    c = pp.Circuit(N).rx(0, 0.3).rx(1, 0.4)
    obs = pp.PauliSum.from_list([("ZZ", [0, 1], 1.0)], N)
    trunc = pp.Truncation()
    low = PR.lowered(c, trunc, "cpu", layers=True)
    u = int(np.flatnonzero(low.units.kind == S.U_LAYER)[0])
    cfg = PR.config(low, trunc, 64, True, "cpu")
    buf = PR._initial_buffer(obs, 64, np.float64)
    params = jnp.zeros(1)
    apply = lambda b: engine.layer_unit(b, u, low.tables, params, trunc.limits(np.float64), cfg)
    out, need = apply(buf)  # both passes: Z0 Z1 -> 4 words
    assert int(need) == 0 and int(np.sum(np.asarray(out.meta) & 1)) == 4
    real = M.pair_split

    def collides_in_pass_two(words, coeffs, meta, ac, *args, **kw):  # pass 1 turns one word, pass 2 two
        out = real(words, coeffs, meta, ac, *args, **kw)
        hit = jnp.sum(ac) >= 2
        kept = tuple(jnp.where(hit, a, b) for a, b in zip((words, coeffs, meta), out[:3]))
        return (*kept, jnp.where(hit, 0, out[3]), jnp.where(hit, M.COLLIDED, out[4]))

    monkeypatch.setattr(M, "pair_split", collides_in_pass_two)
    out, need = apply(buf)
    assert int(need) == M.COLLIDED
    for got, was in zip(out, buf):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(was))


def _without_skips(mp):
    """Programs whose rotations never skip their pass (Config.skip_unmet off): the reference."""
    from pauliprop.propagation import propagate as PR
    config = PR.config
    mp.setattr(PR, "config", lambda *a, **k: config(*a, **k)._replace(skip_unmet=False))


@settings(max_examples=10)
@given(layered_circuits(), st.sampled_from(sorted(RULES)), st.floats(-2.0, 2.0))
def test_rotations_that_meet_no_live_word_skip_nothing_that_splits(case, rules, angle):
    """CPUs skip a rotation's pass when it meets none of the sites where the live words act (kept as a
    superset through the loop): the same sum and dropped norms as programs that never skip."""
    circuit, obs = case
    params = np.array([angle, 0.7])
    with pytest.MonkeyPatch.context() as mp:
        got, got_stats = _propagated(mp, False, circuit, obs, params, RULES[rules], initial_capacity=64)
        _without_skips(mp)
        ref, ref_stats = _propagated(mp, False, circuit, obs, params, RULES[rules], initial_capacity=64)
    _assert_same(_terms(got), _terms(ref))
    np.testing.assert_allclose(np.asarray(got_stats.dropped_norm), np.asarray(ref_stats.dropped_norm), atol=1e-12)


def test_a_word_spawned_onto_new_sites_is_split_there():
    """Z0 meets RXX(0, 1) first (the circuit runs backward) and spawns Y0 X1, which acts on qubit 1:
    the RZ on qubit 1 before it must split it, though no word acted there when the loop began."""
    c = pp.Circuit(N).rz(1, 0.9).append("pauli_rotation", [0, 1], 0.6, pauli="XX")
    obs = pp.PauliSum.from_list([("Z", [0], 1.0)], N)
    got, _ = pp.propagate(c, obs)
    labels = {label: coeff for label, coeff in zip(got.labels(), np.asarray(got.coeffs)) if coeff != 0}
    assert len(labels) == 3  # Z0, and Y0 X1 split by RZ(1) into Y0 X1 and Y0 Y1
    # on |+i>|+>, where <Y0 X1> = 1: the value follows the RZ's cosine
    small = pp.Circuit(2).rz(1, 0.9).append("pauli_rotation", [0, 1], 0.6, pauli="XX")
    exact = float(pp.expectation(small, pp.PauliSum.from_labels({"ZI": 1.0}), state="r+", method="statevector"))
    assert abs(float(pp.expectation(c, obs, state="r+" + "0" * (N - 2))) - exact) < 1e-12
    assert abs(exact - math.cos(0.6)) > 0.1  # the Y0 X1 term counts


@settings(max_examples=8)
@given(layered_circuits(n=10, layers=2), st.floats(-2.0, 2.0))
def test_clifford_runs_swept_over_all_words_equal_the_state_vector(case, angle):
    """GPUs sweep a Clifford run's gates over every word (Config.sweep, SWEEP gates an iteration),
    CPUs gather the touched words into rooms: untruncated, both equal the state vector."""
    circuit, obs = case
    for q in range(0, 9, 3):  # runs of one- and two-qubit Clifford gates of every kind of table
        circuit.h(q).s(q + 1).cz(q, q + 1).sdg(q).cx(q + 1, q).swap(q, q + 1).sx(q + 1)
    from pauliprop.propagation import propagate as PR
    config = PR.config
    params = np.array([angle, 0.7])
    exact = float(pp.expectation(circuit, obs, params, method="statevector"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "layers_for", lambda backend, t: False)
        mp.setattr(S, "prefer_dense", lambda *a: False)  # the runs gate by gate, not as dense maps
        in_rooms = float(pp.expectation(circuit, obs, params))
        mp.setattr(PR, "config", lambda *a, **k: config(*a, **k)._replace(sweep=True))
        swept = float(pp.expectation(circuit, obs, params))
    assert abs(in_rooms - exact) < 1e-10 and abs(swept - exact) < 1e-10
