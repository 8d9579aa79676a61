"""Many Z measurements at once (stabilizer/tableau/tableau.py, `measure_many_z` and MEASURE ops in
blocks): the same outcomes and tableau as one collapse at a time, Stim's deterministic outcomes and
state, fair random outcomes that respect every Z-type stabilizer, and a state that then stays put."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stabilizer.circuits.circuit import Circuit
from stabilizer.tableau import tableau as T
from stabilizer.tableau.simulator import TableauSimulator

from .test_simulator import _Forced, _raw_outcomes

stim = pytest.importorskip("stim")


def _state_text(n: int, rng, depth: int, deterministic: int = 0) -> str:
    """A random Clifford state on n qubits; its first `deterministic` qubits are left out of the
    entangling layers and some of them flipped (their measurements are determined)."""
    live = np.arange(deterministic, n)
    lines = [f"X {' '.join(map(str, range(0, deterministic, 2)))}"] if deterministic > 1 else []
    for _ in range(depth):
        perm = rng.permutation(live)
        third = len(perm) // 3
        for gate, qs in (("H", perm[:third]), ("S", perm[third:2 * third]), ("SQRT_X", perm[2 * third:])):
            if len(qs):
                lines.append(f"{gate} " + " ".join(map(str, qs)))
        pairs = rng.permutation(live)[: 2 * (len(live) // 4)]
        if len(pairs):
            lines.append(("CX " if rng.random() < 0.5 else "CZ ") + " ".join(map(str, pairs)))
    return "\n".join(lines)


def _tableau(text: str, n: int) -> T.Tableau:
    sim = TableauSimulator(num_qubits=n)
    sim.do(Circuit(text))
    return sim._tableau


def _copy(t):
    return jax.tree_util.tree_map(jnp.copy, t)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([5, 31, 33, 64, 70, 97, 130]), st.integers(0, 2**31 - 1), st.integers(0, 3))
def test_blocks_equal_one_collapse_at_a_time(n, seed, depth):
    """Bit for bit: the same outcomes and the same tableau as `measure_z` per qubit, for any subset of
    qubits in any order (inactive slots anywhere), with the same random choices. Shallow states
    mix deterministic and random outcomes; a pivot column can recur within a block."""
    rng = np.random.default_rng(seed)
    t = _tableau(_state_text(n, rng, depth, deterministic=int(rng.integers(0, n // 2 + 1))), n)
    slots = t.capacity  # one slot count per capacity: one compile
    qs = np.zeros(slots, np.int32)
    order = rng.permutation(n)
    qs[: n] = order
    active = np.zeros(slots, bool)
    active[: n] = rng.random(n) < 0.8
    guesses = rng.random(slots) < 0.5
    seq, outs = _copy(t), []
    for q, a, g in zip(qs, active, guesses):
        if a:
            seq, r, _ = T.measure_z(seq, jnp.int32(q), jnp.bool_(g), kernel="jax")
        outs.append(bool(r) if a else None)
    got, outcomes = T.measure_many_z(_copy(t), jnp.asarray(qs), jnp.asarray(active), jnp.asarray(guesses))
    assert [bool(o) if a else None for o, a in zip(np.asarray(outcomes), active)] == outs
    for a, b in zip(got, seq):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture
def program(monkeypatch):
    """Circuits run as one compiled program (where MEASURE ops go in blocks)."""
    import stabilizer.tableau.simulator as S

    monkeypatch.setattr(S, "PROGRAM_MIN_INSTRUCTIONS", 0)


@pytest.mark.parametrize("n,seed", [(40, 0), (70, 1), (100, 2), (129, 3), (64, 4)])
def test_measure_all_follows_stim(n, seed, program):
    """A random state, then M / MR / M with '!' on many qubits (some determined, some random): forced
    to Stim's random outcomes, the record is Stim's (so every determined outcome is Stim's) and the
    state is Stim's."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    half = n // 2
    text = (_state_text(n, rng, 3, deterministic=n // 4) + "\nM " + " ".join(map(str, order[:half]))
            + "\nMR " + " ".join(f"!{q}" if rng.random() < 0.3 else str(q) for q in order[half:])
            + "\nH 0 1 2\nCX 0 3 1 4\nM " + " ".join(map(str, rng.permutation(n))))
    ref = stim.TableauSimulator(seed=seed)
    ref.set_num_qubits(n)
    ref.do(stim.Circuit(text))
    theirs = ref.current_measurement_record()
    circuit = Circuit(text)
    sim = TableauSimulator(num_qubits=n)
    sim._rng = _Forced(_raw_outcomes(circuit, theirs, resets=False))
    sim.do(circuit)
    assert sim.current_measurement_record() == theirs
    check = stim.TableauSimulator()
    check.set_inverse_tableau(sim.current_inverse_tableau())
    assert check.canonical_stabilizers() == ref.canonical_stabilizers()


def test_outcomes_are_fair_and_keep_every_z_stabilizer(program):
    """Over many seeds: every Z-type stabilizer of the state (from Stim) has its sign as the parity of
    the outcomes in every shot (the correlations), and outcomes Stim calls random are fair coins."""
    n, shots = 70, 200
    text = _state_text(n, np.random.default_rng(7), 2, deterministic=10)
    ref = stim.TableauSimulator()
    ref.set_num_qubits(n)
    ref.do(stim.Circuit(text))
    zs = [s for s in ref.canonical_stabilizers() if not any(p in (1, 2) for p in s)]
    random = [q for q in range(n) if ref.peek_z(q) == 0]
    assert zs and random
    circuit = Circuit(text + "\nM " + " ".join(map(str, range(n))))
    records = []
    for seed in range(shots):
        sim = TableauSimulator(seed=seed, num_qubits=n)
        sim.do(circuit)
        records.append(sim.current_measurement_record())
    records = np.array(records)
    for s in zs:
        support = [q for q in range(n) if s[q] == 3]
        np.testing.assert_array_equal(records[:, support].sum(axis=1) % 2, np.full(shots, s.sign == -1))
    rates = records[:, random].mean(axis=0)
    assert abs(rates.mean() - 0.5) < 4 * 0.5 / np.sqrt(shots * len(random))
    assert np.all(np.abs(rates - 0.5) < 5 * 0.5 / np.sqrt(shots))


def test_measuring_again_repeats_the_outcomes():
    """After measuring many qubits in blocks, every one of them is determined, with its outcome."""
    n = 97
    t = _tableau(_state_text(n, np.random.default_rng(11), 4), n)
    qs = jnp.asarray(np.random.default_rng(1).permutation(n).astype(np.int32))
    guesses = jnp.asarray(np.random.default_rng(2).random(n) < 0.5)
    t, first = T.measure_many_z(t, qs, jnp.ones(n, bool), guesses)
    t, again = T.measure_many_z(t, qs, jnp.ones(n, bool), ~guesses)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    assert all(int(T.peek_z(t, q)) != 0 for q in np.asarray(qs))


def test_settled_rows_are_the_qubits_the_state_leaves_alone():
    """Rows the apply kernel may skip from the start: those of qubits where the state's unitary is a
    Pauli (untouched, X, or H twice), not those of entangled, rotated or swapped qubits."""
    t = _tableau("H 0\nCX 0 1\nS 5\nX 7\nSWAP 8 9\nH 10\nH 10\nCZ 11 12", 40)
    n = t.capacity
    settled = np.asarray(T._settled(t))
    assert np.array_equal(settled[:n], settled[n:])
    assert np.flatnonzero(~settled[:n]).tolist() == [0, 1, 5, 8, 9, 11, 12]
