"""The packed inverse tableau (stabilizer/tableau/tableau.py): its row algebra, its gate rule and
its measurement rule agree with Stim and with dense Pauli matrices."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pauliprop.circuits import gates as G
from stabilizer.circuits.program import gate_action
from stabilizer.tableau import tableau as T
from stabilizer.tableau.simulator import TableauSimulator

stim = pytest.importorskip("stim")

STIM_GATES = sorted({g.stim_names[0] for g in G.GATES.values() if g.stim_names})


def _pack(bits: np.ndarray) -> np.ndarray:
    """(R, n) bits -> (R, ceil(n/32)) uint32 words, qubit j at bit j % 32 of word j // 32."""
    n = bits.shape[1]
    padded = np.zeros((bits.shape[0], -(-n // 32) * 32), np.uint8)
    padded[:, :n] = bits
    return np.packbits(padded, axis=1, bitorder="little").view(np.uint32)


@settings(max_examples=40)
@given(st.integers(1, 70).flatmap(lambda n: st.tuples(st.text("IXYZ", min_size=n, max_size=n),
                                                       st.text("IXYZ", min_size=n, max_size=n))))
def test_product_phase_is_the_pauli_product(pair):
    """P1 P2 = i^g (P1 xor P2), checked with stim.PauliString's product (which tracks the phase)."""
    a, b = pair
    bits = lambda s, c: np.array([[ch in c for ch in s]], np.uint8)
    g = T.product_phase(*(jnp.asarray(_pack(bits(s, c))) for s in (a, b) for c in ("XY", "ZY")))
    prod = stim.PauliString(a.replace("I", "_")) * stim.PauliString(b.replace("I", "_"))
    assert 1j ** int(g[0]) == prod.sign


@settings(max_examples=40)
@given(st.integers(1, 4).flatmap(lambda w: st.lists(st.integers(0, 2**32 - 1), min_size=w, max_size=w)))
def test_exclusive_prefix_xor(words):
    v = np.array([words], np.uint32)
    bits = np.unpackbits(v.view(np.uint8), bitorder="little")
    want = np.concatenate([[0], np.cumsum(bits)[:-1] % 2]).astype(np.uint8)
    got = np.unpackbits(np.asarray(T._exclusive_prefix_xor(jnp.asarray(v))).view(np.uint8), bitorder="little")
    np.testing.assert_array_equal(got, want)


def _random_state_text(n: int, rng, depth: int = 40) -> str:
    lines = []
    for _ in range(depth):
        g = STIM_GATES[rng.integers(len(STIM_GATES))]
        k = gate_action(g)[2]
        lines.append(f"{g} " + " ".join(map(str, rng.choice(n, size=k, replace=False))))
    return "\n".join(lines)


@pytest.mark.parametrize("name", STIM_GATES)
def test_every_gate_equals_stims_tableau(name):
    """Each gate, on qubits straddling word boundaries of a random state, gives Stim's inverse tableau."""
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    n = 70
    k = gate_action(name)[2]
    prefix = _random_state_text(n, rng)
    for qubits in ([0, 31], [31, 32], [63, 64], [69, 0], [32, 5]):
        text = prefix + f"\n{name} " + " ".join(map(str, qubits[:k]))
        ours = TableauSimulator(num_qubits=n)
        ours.do(stim.Circuit(text))
        ref = stim.TableauSimulator()
        ref.set_num_qubits(n)
        ref.do(stim.Circuit(text))
        assert ours.current_inverse_tableau() == ref.current_inverse_tableau(), (name, qubits)


def test_batched_disjoint_gates_equal_sequential():
    rng = np.random.default_rng(3)
    n = 50
    qs = rng.permutation(n)
    text = _random_state_text(n, rng) + "\nCX " + " ".join(map(str, qs)) + "\nH_YZ " + " ".join(map(str, qs[:17]))
    ours = TableauSimulator(num_qubits=n)
    ours.do(stim.Circuit(text))
    ref = stim.TableauSimulator()
    ref.set_num_qubits(n)
    ref.do(stim.Circuit(text))
    assert ours.current_inverse_tableau() == ref.current_inverse_tableau()


def test_identity_and_grow_keep_the_state():
    sim = TableauSimulator(num_qubits=5)
    sim.do(stim.Circuit("H 0\nCX 0 4\nS 4"))
    before = sim.current_inverse_tableau()
    sim.set_num_qubits(100)  # reallocates: 32 -> 128 qubits of capacity
    after = sim.current_inverse_tableau()
    assert after == before + stim.Tableau(95)
    assert T.identity(33).capacity == 64


def test_deterministic_measurement_reads_the_sign():
    """DESIGN.md's trap: X0; CX 0 1; M 1 measures 1 (a forward-tableau gate rule with the inverse
    measurement rule gets 0)."""
    sim = TableauSimulator(seed=0)
    sim.do(stim.Circuit("X 0\nCX 0 1\nM 1 0"))
    assert sim.current_measurement_record() == [True, True]
    t = T.identity(3)
    t, result, random = T.measure_z(t, jnp.int32(2), jnp.bool_(True))
    assert not bool(result) and not bool(random)


@pytest.mark.parametrize("forced", [False, True])
def test_random_measurement_collapses_to_the_forced_outcome(forced):
    """A random outcome, forced, leaves the state Stim reaches by postselecting it (same stabilizers)."""
    rng = np.random.default_rng(int(forced))
    n = 40
    text = _random_state_text(n, rng, depth=80)
    sim = TableauSimulator(num_qubits=n)
    sim.do(stim.Circuit(text))
    ref = stim.TableauSimulator()
    ref.set_num_qubits(n)
    ref.do(stim.Circuit(text))
    for q in (0, 33, 17, 39, 32, 31):
        t, result, random = T.measure_z(sim._tableau, jnp.int32(q), jnp.bool_(forced))
        sim._tableau = t
        assert bool(random) == (ref.peek_z(q) == 0)
        if bool(random):
            assert bool(result) == forced
        ref.postselect_z(q, desired_value=bool(result))
        check = stim.TableauSimulator()
        check.set_inverse_tableau(sim.current_inverse_tableau())
        assert check.canonical_stabilizers() == ref.canonical_stabilizers()
