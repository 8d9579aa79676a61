"""The exact state-vector backend (pauliprop/statevector/simulator.py) against Qiskit, and the numpy reference that the
other test files use against both."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.circuits import gates
from pauliprop.statevector import simulator as SV

from .. import _reference as R
from .._strategies import build, gate, params_vector, states

qiskit = pytest.importorskip("qiskit")
# Qiskit's PauliEvolutionGate builds its matrix through scipy.sparse, which warns about formats
pytestmark = pytest.mark.filterwarnings("ignore::scipy.sparse.SparseEfficiencyWarning")


def to_qiskit(circuit, params=None, state="0"):
    """The same circuit in Qiskit (little-endian as ours), with the product state prepared first."""
    from qiskit import QuantumCircuit
    from qiskit.circuit.library import PauliEvolutionGate
    from qiskit.quantum_info import Pauli

    qc = QuantumCircuit(circuit.num_qubits)
    prep = {"0": [], "1": ["x"], "+": ["h"], "-": ["x", "h"], "r": ["h", "s"], "l": ["h", "sdg"]}
    for q, ch in enumerate(R.state_string(state, circuit.num_qubits)):
        for g in prep[ch]:
            getattr(qc, g)(q)
    for ins in circuit.instructions:
        args = [R.angle_value(a, params) for a in ins.args]
        if ins.name == "pauli_rotation":
            # exp(-i t P) with t = a/2; Qiskit's Pauli labels are reversed (rightmost = first qubit argument)
            qc.append(PauliEvolutionGate(Pauli(ins.pauli[::-1]), time=args[0] / 2), list(ins.qubits))
        elif hasattr(qc, ins.name):
            getattr(qc, ins.name)(*args, *ins.qubits)
        else:  # Stim-only Cliffords: their matrices are checked against Stim's in test_gates.py
            from qiskit.circuit.library import UnitaryGate

            qc.append(UnitaryGate(ins.gate.matrix()), list(ins.qubits))
    return qc


def assert_equal_up_to_phase(a, b, atol=1e-10):
    a, b = np.asarray(a), np.asarray(b)
    k = int(np.argmax(np.abs(b)))
    phase = a[k] / b[k]
    assert abs(abs(phase) - 1) < atol
    np.testing.assert_allclose(a, phase * b, atol=atol)


@st.composite
def unitary_circuit(draw, max_n=6, length=12):
    n = draw(st.integers(1, max_n))
    ops = [draw(gate(n)) for _ in range(length)]
    return n, ops, draw(params_vector()), draw(states(n))


@settings(max_examples=15)
@given(unitary_circuit())
def test_simulate_equals_qiskit(case):
    from qiskit.quantum_info import Statevector

    n, ops, params, state = case
    c = build(n, ops)
    psi = SV.simulate(c, params, state)
    assert psi.shape == (2**n,) and psi.dtype == jnp.complex128
    assert_equal_up_to_phase(psi, Statevector(to_qiskit(c, params, state)).data)


@settings(max_examples=3)
@given(st.sampled_from([10, 12, 14]).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(gate(n), min_size=40, max_size=40), params_vector(), states(n))))
def test_fused_simulation_of_up_to_14_qubits_equals_qiskit(case):
    from qiskit.quantum_info import Statevector

    n, ops, params, state = case
    c = build(n, ops)
    psi = np.asarray(jax.jit(lambda p: SV.simulate(c, p, state, fuse=4))(params))
    ref = Statevector(to_qiskit(c, params, state)).data
    assert abs(np.vdot(ref, psi)) ** 2 > 1 - 1e-12


@settings(max_examples=25)
@given(unitary_circuit(max_n=5, length=16))
def test_the_numpy_reference_equals_qiskit(case):
    """tests/pauliprop/_reference.py (used by the other test files) against an independent simulator."""
    from qiskit.quantum_info import Operator

    n, ops, params, state = case
    c = build(n, ops)
    assert_equal_up_to_phase(R.dense_unitary(c, params).ravel(), Operator(to_qiskit(c, params)).data.ravel())


@settings(max_examples=20)
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.text("IXYZ", min_size=n, max_size=n), min_size=1, max_size=6), states(n))))
def test_pauli_expectations_are_dense_expectations(labels_state):
    labels, state = labels_state
    n = len(labels[0])
    rng = np.random.default_rng(len(labels))
    psi = rng.normal(size=2**n) + 1j * rng.normal(size=2**n)
    psi /= np.linalg.norm(psi)
    ps = pp.PauliSum.from_list([(lab, list(range(n)), 1.0) for lab in labels], n)
    got = np.asarray(SV.pauli_expectations(jnp.asarray(psi), ps))
    np.testing.assert_allclose(got, [np.real(psi.conj() @ R.pauli_dense(lab) @ psi) for lab in labels], atol=1e-12)


def test_pauli_expectations_of_a_10_qubit_state_build_nothing_of_its_size_on_the_host():
    n = 10
    rng = np.random.default_rng(7)
    psi = rng.normal(size=2**n) + 1j * rng.normal(size=2**n)
    psi /= np.linalg.norm(psi)
    labels = ["".join(rng.choice(list("IXYZ"), n)) for _ in range(12)] + ["I" * n, "Z" * n, "X" * n, "Y" * n]
    ps = pp.PauliSum.from_list([(lab, list(range(n)), 1.0) for lab in labels], n)

    def applied(label):  # P|psi>, one single-qubit Pauli per axis (axis n-1-q holds qubit q)
        out = psi.reshape((2,) * n)
        for q, ch in enumerate(label):
            out = np.moveaxis(np.tensordot(gates.PAULI_MATRICES[ch], out, axes=([1], [n - 1 - q])), 0, n - 1 - q)
        return out.reshape(-1)

    got = np.asarray(SV.pauli_expectations(jnp.asarray(psi), ps))
    np.testing.assert_allclose(got, [np.real(np.vdot(psi, applied(lab))) for lab in labels], atol=1e-12)
    closed = jax.make_jaxpr(lambda v: SV.pauli_expectations(v, ps))(jnp.asarray(psi))
    assert max((np.size(c) for c in closed.consts), default=0) <= len(labels) < 2**n  # per-term masks only


def test_the_reference_is_one_scan_step_whatever_the_depth():
    def layered(depth):
        c = pp.Circuit(5)
        for layer in range(depth):
            for q in range(5):
                c.ry(q, pp.Param(q)).t(q)
            for q in range(layer % 2, 4, 2):
                c.cx(q, q + 1).pauli_rotation("XZY", [q, q + 1, (q + 2) % 5], 0.1 * layer)
        return c

    def trace_size(c):
        return len(jax.make_jaxpr(lambda p: SV.simulate(c, p))(jnp.zeros(5)).eqns)

    assert trace_size(layered(2)) == trace_size(layered(200))
    p = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, 5))
    deep = layered(30)
    np.testing.assert_allclose(np.asarray(SV.simulate(deep, p)), np.asarray(SV.simulate(deep, p, fuse=3)), atol=1e-12)


def test_initial_states_are_the_documented_product_states():
    for state in ["0", "1", "+", "-", "r", "l", "01+-rl"]:
        n = len(state) if len(state) > 1 else 2
        np.testing.assert_allclose(np.asarray(SV.initial_state(state, n)), R.initial_ket(state, n), atol=1e-15)
    # a Bloch-vector array of norm 1 is a pure state too: (1, 0, 0) is |+>
    np.testing.assert_allclose(np.asarray(SV.initial_state(np.array([[1.0, 0, 0]]), 1)), R.initial_ket("+", 1),
                               atol=1e-15)
    with pytest.raises(ValueError, match="pure product states"):
        SV.initial_state(np.array([[0.5, 0, 0]]), 1)


def test_precision():
    c = pp.Circuit(2).h(0).cx(0, 1).rz(1, 0.3)
    assert SV.simulate(c).dtype == jnp.complex128
    psi64 = SV.simulate(c, dtype=jnp.complex64)
    assert psi64.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(psi64), np.asarray(SV.simulate(c)), atol=1e-6)


@pytest.mark.parametrize("n", [40, 60, 127])
def test_too_many_qubits_raise_before_allocating(n, monkeypatch):
    def no_allocation(*a, **k):
        raise AssertionError("allocated a state before checking the size")

    monkeypatch.setattr(SV, "product_state", no_allocation)
    c = pp.Circuit(n).h(0)
    with pytest.raises(ValueError, match=f"{n} qubits need 2\\^{n} amplitudes"):
        SV.simulate(c)
    with pytest.raises(ValueError, match="qubits need"):
        pp.expectation(c, pp.PauliSum.from_list([("Z", [0], 1.0)], n), method="statevector")


def test_bad_input_raises_naming_the_cause():
    with pytest.raises(ValueError, match="'depolarize' is a noise channel"):
        SV.simulate(pp.Circuit(1).depolarize(0, 0.1))
    with pytest.raises(ValueError, match="uses 1 parameter\\(s\\) but params is None"):
        SV.simulate(pp.Circuit(1).rx(0, pp.Param(0)))
    with pytest.raises(ValueError, match="the observable acts on 2 qubits \\(2\\^2 amplitudes\\) but the state has 8"):
        SV.expectation(pp.Circuit(3).h(0), pp.PauliSum.from_labels({"ZZ": 1.0}))


def test_gradient_matches_finite_differences():
    c = pp.Circuit(2).ry(0, pp.Param(0)).cx(0, 1).rzz(0, 1, 2 * pp.Param(1) - 0.3).rx(1, pp.Param(0))
    h = pp.PauliSum.from_labels({"ZZ": 1.0, "XI": 0.5, "IY": -0.7})
    f = lambda p: pp.expectation(c, h, p, method="statevector")
    p0 = jnp.array([0.4, -0.9])
    g = np.asarray(jax.grad(f)(p0))
    eps = 1e-6
    fd = [(float(f(p0.at[i].add(eps))) - float(f(p0.at[i].add(-eps)))) / (2 * eps) for i in range(2)]
    np.testing.assert_allclose(g, fd, atol=1e-7)


def test_samples_of_a_basis_state_are_that_bitstring_little_endian():
    bits = SV.sample(pp.Circuit(4).x(0).x(2), 50, seed=3)
    assert bits.shape == (50, 4) and bits.dtype == bool
    assert np.all(bits == [True, False, True, False])  # column q = qubit q


def test_samples_follow_the_born_rule():
    """A random 5-qubit circuit: 2e5 shots, the empirical distribution within a few standard errors
    of |amplitude|^2 in every outcome; a Bell pair's two bits always agree."""
    rng = np.random.default_rng(4)
    c = pp.Circuit(5)
    for layer in range(3):
        for q in range(5):
            c.ry(q, float(rng.uniform(-2, 2))).rz(q, float(rng.uniform(-2, 2)))
        for q in range(layer % 2, 4, 2):
            c.cx(q, q + 1)
    probs = np.abs(np.asarray(SV.simulate(c))) ** 2
    shots = 200_000
    bits = SV.sample(c, shots, seed=11)
    counts = np.bincount(bits @ (1 << np.arange(5)), minlength=32)
    stderr = np.sqrt(probs * (1 - probs) / shots)
    assert np.all(np.abs(counts / shots - probs) <= 5 * stderr + 3 / shots)  # + 3 counts: near-zero outcomes
    bell = SV.sample(pp.Circuit(2).h(0).cx(0, 1), 1000, seed=0)
    assert np.all(bell[:, 0] == bell[:, 1]) and 400 < bell[:, 0].sum() < 600


def test_sampling_is_reproducible_by_seed_and_checks_its_arguments():
    c = pp.Circuit(3).h(0).h(1).h(2)
    a, b, other = SV.sample(c, 64, seed=7), SV.sample(c, 64, seed=7), SV.sample(c, 64, seed=8)
    assert np.array_equal(a, b) and not np.array_equal(a, other)
    assert SV.sample(c, 0).shape == (0, 3)
    with pytest.raises(ValueError, match="shots must be a non-negative int, got -1"):
        SV.sample(c, -1)
    with pytest.raises(ValueError, match="seed must be an int"):
        SV.sample(c, 10, seed=0.5)
