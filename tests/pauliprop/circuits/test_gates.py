"""The gate table (pauliprop/circuits/gates.py): every record agrees with its matrix, with Qiskit, and with the
actions the other modules derive from it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.circuits import gates as G
from pauliprop.propagation import program as P

from .. import _reference as R

CLIFFORDS = sorted(n for n, g in G.GATES.items() if g.kind == "clifford")
ROTATIONS = sorted(n for n, g in G.GATES.items() if g.kind == "rotation" and g.generator is not None
                   and g.fixed_angle is None)
FIXED = sorted(n for n, g in G.GATES.items() if g.fixed_angle is not None)
CHANNELS = sorted(n for n, g in G.GATES.items() if g.kind == "channel")
COMPOSITES = sorted(n for n, g in G.GATES.items() if g.kind == "composite")
angle = st.floats(-4 * math.pi, 4 * math.pi, allow_nan=False)


def expm_pauli(generator: str, a: float) -> np.ndarray:
    """exp(-i a/2 G) by eigendecomposition (independent of the closed form the module uses)."""
    w, v = np.linalg.eigh(R.pauli_dense(generator))
    return v @ np.diag(np.exp(-0.5j * a * w)) @ v.conj().T


def test_the_table_covers_the_documented_gates():
    documented = {"h", "x", "y", "z", "s", "sdg", "t", "tdg", "sx", "sxdg", "cx", "cy", "cz", "swap", "iswap",
                  "rx", "ry", "rz", "rxx", "ryy", "rzz", "pauli_rotation", "depolarize", "dephase", "pauli_channel",
                  "amplitude_damp"}
    assert documented <= set(G.GATES)
    for name, g in G.GATES.items():
        assert g.name == name
        assert g.kind in ("clifford", "rotation", "channel", "composite")
        assert (g.decompose is not None) == (g.kind == "composite")


# ---- Cliffords --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CLIFFORDS)
def test_clifford_action_is_conjugation_by_the_matrix(name):
    u = G.GATES[name].matrix()
    k = G.GATES[name].num_qubits
    image, sign = G.clifford_action(u)
    assert sorted(image.tolist()) == list(range(4**k))  # a bijection on Paulis
    assert image[0] == 0 and sign[0] == 1
    for code in range(4**k):
        p = R.pauli_dense(G.local_label(code, k))
        q = R.pauli_dense(G.local_label(int(image[code]), k))
        np.testing.assert_allclose(u.conj().T @ p @ u, sign[code] * q, atol=1e-12)


STIM_NAMED = sorted(n for n, g in G.GATES.items() if g.stim_names)
_STIM_LETTER = {"_": 0, "X": 1, "Y": 3, "Z": 2}  # stim.PauliString codes -> local symplectic codes


@pytest.mark.parametrize("name", STIM_NAMED)
def test_stim_named_cliffords_act_as_stims_tableau(name):
    """The action derived from our matrix equals Stim's tableau of the gate (Heisenberg: inverse)."""
    stim = pytest.importorskip("stim")
    g = G.GATES[name]
    image, sign = G.clifford_action(g.matrix())
    for stim_name in g.stim_names:
        inv = stim.Tableau.from_named_gate(stim_name).inverse()
        for q in range(g.num_qubits):
            for code, out in ((1 << 2 * q, inv.x_output(q)), (2 << 2 * q, inv.z_output(q))):
                want = sum(_STIM_LETTER[ch] << 2 * j for j, ch in enumerate(str(out)[1:]))
                assert image[code] == want and sign[code] == out.sign.real, (stim_name, q)
        theirs = stim.Tableau.from_named_gate(stim_name).to_unitary_matrix(endian="little")
        ours = g.matrix()
        phase = np.vdot(theirs.ravel(), ours.ravel()) / len(ours)  # equal up to a global phase
        np.testing.assert_allclose(ours, phase * theirs, atol=1e-6, err_msg=stim_name)


def test_every_stim_unitary_gate_is_in_the_table():
    stim = pytest.importorskip("stim")
    ours = {s for g in G.GATES.values() for s in g.stim_names}
    theirs = {n for n, d in stim.gate_data().items() if d.is_unitary and n not in ("SPP", "SPP_DAG")}
    theirs |= {a for n in theirs for a in stim.gate_data(n).aliases}
    assert theirs <= ours, sorted(theirs - ours)


def test_clifford_action_refuses_non_cliffords():
    with pytest.raises(ValueError, match="not a Clifford"):
        G.clifford_action(G.GATES["t"].matrix())
    with pytest.raises(ValueError, match="not a Clifford"):
        G.clifford_action(G.rotation_matrix("XY", 0.3))


def test_local_codes_are_symplectic():
    # bit 2j is x_j, bit 2j+1 is z_j: I=00, X=01, Z=10, Y=11 per qubit
    assert [G.local_label(c, 1) for c in range(4)] == ["I", "X", "Z", "Y"]
    assert G.local_label(0b1001, 2) == "XZ" and G.local_label(0b0111, 2) == "YX"


@pytest.mark.parametrize("name", CLIFFORDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_program_tables_through_propagate_are_conjugation(name, reverse):
    """The lowered 16-entry table, applied by pp.propagate on 2 qubits, gives U^dag P U for every P."""
    g = G.GATES[name]
    qubits = [1, 0][:g.num_qubits] if reverse else [0, 1][:g.num_qubits]
    c = pp.Circuit(2).append(name, qubits)
    u = R.dense_unitary(c)
    for lab in R.LOCAL[2]:
        out, _ = pp.propagate(c, pp.PauliSum.from_labels({lab: 1.0}), capacity=64)
        np.testing.assert_allclose(out.to_matrix(), u.conj().T @ R.pauli_dense(lab) @ u, atol=1e-12,
                                   err_msg=f"{name} on {qubits}, P = {lab}")


# ---- matrices against Qiskit and closed forms ------------------------------------------------------------

def _qiskit_gate(name, *args):
    from qiskit.circuit import library as L

    cls = {"id": L.IGate, "h": L.HGate, "x": L.XGate, "y": L.YGate, "z": L.ZGate, "s": L.SGate, "sdg": L.SdgGate,
           "t": L.TGate, "tdg": L.TdgGate, "sx": L.SXGate, "sxdg": L.SXdgGate, "cx": L.CXGate, "cy": L.CYGate,
           "cz": L.CZGate, "swap": L.SwapGate, "iswap": L.iSwapGate, "rx": L.RXGate, "ry": L.RYGate,
           "rz": L.RZGate, "rxx": L.RXXGate, "ryy": L.RYYGate, "rzz": L.RZZGate, "ecr": L.ECRGate,
           "p": L.PhaseGate, "u": L.UGate, "u2": L.U2Gate, "r": L.RGate, "rzx": L.RZXGate, "cp": L.CPhaseGate,
           "crx": L.CRXGate, "cry": L.CRYGate, "crz": L.CRZGate, "cu": L.CUGate, "cu3": L.CU3Gate, "ch": L.CHGate,
           "ccx": L.CCXGate, "ccz": L.CCZGate, "rccx": L.RCCXGate}[name]
    return cls(*args).to_matrix()


@pytest.mark.parametrize("name", [n for n in CLIFFORDS + FIXED if G.GATES[n].qasm_names])
def test_fixed_matrices_equal_qiskit(name):
    """Qiskit's matrices are little-endian in the gate's qubit arguments, as ours (control = first argument)."""
    pytest.importorskip("qiskit")
    np.testing.assert_allclose(G.GATES[name].matrix(), _qiskit_gate(name), atol=1e-12)


@pytest.mark.parametrize("name", ROTATIONS)
@settings(max_examples=20)
@given(a=angle)
def test_rotation_matrices(name, a):
    g = G.GATES[name]
    m = g.matrix(a)
    np.testing.assert_allclose(m, expm_pauli(g.generator, a), atol=1e-12)
    np.testing.assert_allclose(m, _qiskit_gate(name, a), atol=1e-12)


@settings(max_examples=30)
@given(st.integers(1, 4).flatmap(lambda k: st.text("IXYZ", min_size=k, max_size=k)), angle)
def test_pauli_rotation_matrix_is_the_exponential(generator, a):
    np.testing.assert_allclose(G.rotation_matrix(generator, a), expm_pauli(generator, a), atol=1e-12)


def test_t_is_a_phase_times_rz():
    rz = G.GATES["rz"].matrix
    np.testing.assert_allclose(G.GATES["t"].matrix(), np.exp(1j * math.pi / 8) * rz(math.pi / 4), atol=1e-15)
    np.testing.assert_allclose(G.GATES["tdg"].matrix(), np.exp(-1j * math.pi / 8) * rz(-math.pi / 4), atol=1e-15)
    for name in FIXED:  # the rotation record (generator, fixed angle) matches the matrix up to that phase
        g = G.GATES[name]
        r = G.rotation_matrix(g.generator, g.fixed_angle)
        phase = g.matrix()[0, 0] / r[0, 0]
        assert abs(abs(phase) - 1) < 1e-15
        np.testing.assert_allclose(g.matrix(), phase * r, atol=1e-15)


@pytest.mark.parametrize("name", [n for n in G.GATES if G.GATES[n].kind != "channel" and n != "pauli_rotation"])
def test_every_gate_is_unitary(name):
    g = G.GATES[name]
    for a in ([0.0, 0.37, -2.1, math.pi] if g.num_params else [None]):
        m = g.matrix() if a is None else g.matrix(*[a] * g.num_params)
        assert m.shape == (2**g.num_qubits,) * 2
        np.testing.assert_allclose(m.conj().T @ m, np.eye(len(m)), atol=1e-12)


@pytest.mark.parametrize("name", CHANNELS)
@settings(max_examples=20)
@given(p=st.floats(0, 1))
def test_channels_are_trace_preserving(name, p):
    args = (p / 3, p / 3, p / 3) if name == "pauli_channel" else (p,)
    ks = G.GATES[name].kraus(*args)
    np.testing.assert_allclose(sum(k.conj().T @ k for k in ks), np.eye(2), atol=1e-12)
    with pytest.raises(ValueError, match="noise channel"):
        G.GATES[name].matrix()


def test_pauli_matrix_is_little_endian():
    # character q acts on qubit q = bit q of the basis index: X on qubit 0 maps |00> (index 0) to index 1
    assert np.allclose(G.pauli_matrix("XI") @ np.eye(4)[0], np.eye(4)[1])
    assert np.allclose(G.pauli_matrix("IX") @ np.eye(4)[0], np.eye(4)[2])
    np.testing.assert_allclose(G.pauli_matrix("XZY"), np.kron(np.kron(G.PAULI_MATRICES["Y"], G.PAULI_MATRICES["Z"]),
                                                              G.PAULI_MATRICES["X"]))


def test_controlled_gates_use_the_first_argument_as_control():
    # cx(0, 1) on |q1 q0> = |01> (index 1: qubit 0 set) gives |11> (index 3)
    assert np.allclose(G.GATES["cx"].matrix() @ np.eye(4)[1], np.eye(4)[3])
    assert np.allclose(G.GATES["cx"].matrix() @ np.eye(4)[2], np.eye(4)[2])


# ---- composites: exact decompositions into the engines' gates -------------------------------------------

@pytest.mark.parametrize("name", COMPOSITES)
def test_composites_decompose_exactly_to_their_matrix_and_qiskits(name):
    """Property: at random angles, the product of a composite's decomposition, as the builder appends it
    (on permuted qubits), is its matrix up to a global phase, and its matrix is Qiskit's; with Params the
    builder appends the same gates with angles that evaluate to the same floats."""
    pytest.importorskip("qiskit")
    g = G.GATES[name]
    rng = np.random.default_rng(len(name))
    n = g.num_qubits
    order = list(rng.permutation(n))
    for _ in range(3):
        angles = list(rng.uniform(-2 * math.pi, 2 * math.pi, g.num_params))
        m = g.matrix(*angles)
        np.testing.assert_allclose(m, _qiskit_gate(name, *angles), atol=1e-12)
        c = pp.Circuit(n).append(name, order, *angles)
        assert all(ins.gate.kind != "composite" for ins in c)
        u = R.dense_unitary(c)
        perm = np.array([sum(((b >> j) & 1) << int(order[j]) for j in range(n)) for b in range(2**n)])
        want = np.zeros_like(m)
        want[np.ix_(perm, perm)] = m  # the gate's local bit j on circuit qubit order[j]
        phase = np.vdot(u.ravel(), want.ravel()) / len(u)
        assert abs(abs(phase) - 1) < 1e-12
        np.testing.assert_allclose(phase * u, want, atol=1e-12)
        if g.num_params:
            forms = [2 * pp.Param(k) - 0.5 for k in range(g.num_params)]
            values = [(a + 0.5) / 2 for a in angles]
            cp = pp.Circuit(n).append(name, order, *forms)
            np.testing.assert_allclose(R.dense_unitary(cp, values), u, atol=1e-12)


def test_composite_builders_go_through_the_table():
    """Property: each named builder of a composite appends exactly what append(name) does."""
    a = pp.Param(0) / 2 + 0.1
    calls = [("p", [0], (a,)), ("u", [1], (a, 0.2, -a)), ("r", [0], (a, 0.4)), ("rzx", [0, 2], (a,)), ("ecr", [2, 0], ()),
             ("cp", [1, 0], (a,)), ("crx", [0, 1], (a,)), ("cry", [2, 1], (a,)), ("crz", [1, 2], (a,)),
             ("cu", [0, 2], (a, 0.1, 0.2, 0.3)), ("ch", [2, 0], ()), ("ccx", [0, 1, 2], ()), ("ccz", [2, 0, 1], ()),
             ("rccx", [1, 2, 0], ())]
    for name, qubits, args in calls:
        built = getattr(pp.Circuit(3), name)(*qubits, *args)
        assert built.instructions == pp.Circuit(3).append(name, qubits, *args).instructions, name
    assert {name for name, _, _ in calls} >= set(COMPOSITES) - {"u2", "cu3"}


# ---- names --------------------------------------------------------------------------------------------

def test_aliases_resolve_case_insensitively():
    for name, g in G.GATES.items():
        for alias in (name, *g.aliases):
            assert G.lookup(alias) is g
            assert G.lookup(alias.upper()) is g
    assert G.lookup("CNOT") is G.GATES["cx"]
    c = pp.Circuit(2).append("cnot", [0, 1]).append("S_DAG", [1]).append("t_dag", [0])
    assert [ins.name for ins in c] == ["cx", "sdg", "tdg"]


def test_unknown_names_raise_naming_the_gate():
    with pytest.raises(ValueError, match="unknown gate 'foo'"):
        G.lookup("foo")
    with pytest.raises(ValueError, match="unknown gate 'cccx'"):
        pp.Circuit(4).append("cccx", [0, 1, 2, 3])


def test_quarter_turns():
    for k in range(-5, 6):
        assert G.quarter_turns(k * math.pi / 2) == k
    for a in (0.1, math.pi / 4, math.pi / 2 + 1e-9):
        assert G.quarter_turns(a) is None


def test_clifford_tables_cover_one_and_two_qubit_codes():
    # 1-qubit gates act on the diagonal codes c | c << 2 of the 16-entry table (qubits (a, a))
    table, sign = P.clifford_table(G.GATES["h"])
    assert [int(table[c | c << 2]) for c in range(4)] == [0, 2 | 2 << 2, 1 | 1 << 2, 3 | 3 << 2]
    assert [float(sign[c | c << 2]) for c in range(4)] == [1, 1, 1, -1]
