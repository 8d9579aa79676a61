"""Stim circuit text (stabilizer/circuits/circuit.py): what Stim accepts we read identically; what
Stim rejects, or we cannot simulate, is an error naming the line and the instruction."""

from __future__ import annotations

import pytest

from stabilizer.circuits.circuit import (
    INSTRUCTIONS,
    Circuit,
    CircuitError,
    CircuitRepeatBlock,
    canonical_name,
)

stim = pytest.importorskip("stim")


def _generated():
    kw = dict(after_clifford_depolarization=1e-3, before_measure_flip_probability=1e-3,
              after_reset_flip_probability=1e-3, before_round_data_depolarization=1e-3)
    for code in ("surface_code:rotated_memory_x", "surface_code:unrotated_memory_z", "repetition_code:memory",
                 "color_code:memory_xyz"):
        yield code, stim.Circuit.generated(code, distance=3, rounds=4, **kw)


@pytest.mark.parametrize("code,circuit", list(_generated()), ids=lambda v: v if isinstance(v, str) else "")
def test_generated_codes_round_trip_through_stim(code, circuit):
    ours = Circuit(circuit)
    assert stim.Circuit(str(ours)) == circuit
    assert (ours.num_qubits, ours.num_measurements, ours.num_detectors, ours.num_observables, ours.num_ticks) == (
        circuit.num_qubits, circuit.num_measurements, circuit.num_detectors, circuit.num_observables,
        circuit.num_ticks)
    assert any(isinstance(op, CircuitRepeatBlock) for op in ours)  # REPEAT stays a loop


def test_every_instruction_stim_simulates_is_known_or_refused_by_name():
    for name, data in stim.gate_data().items():
        for alias in set(data.aliases) - {"REPEAT"}:  # REPEAT is block syntax, tested below
            canon = canonical_name(alias)
            if canon is None:
                with pytest.raises(CircuitError, match=f"line 1: instruction '{alias}' is valid Stim but not supported"):
                    Circuit(f"{alias} 0")
            else:
                assert canon == name or canonical_name(name) == canon, alias
                assert INSTRUCTIONS[canon].name == canon


def test_syntax_stim_allows():
    text = """
    # comments, blank lines, lower case, tags, spacing
    h 0 1  # trailing comment
    CX[my tag] 0 1
    MPP !X0*Y1 Z2 X3*X4*Z5
    M(0.125) !4 5
    CX rec[-1] 3 sweep[0] 4
    CZ 2 rec[-2]
    E(0.1) X1 Y2
    ELSE_CORRELATED_ERROR(0.2) Z3
    PAULI_CHANNEL_1(0.1, 0.2, 0.3) 0
    MPAD 0 1
    MYY 0 1
    REPEAT 3 {
        H 0
        MR 0
        DETECTOR(1, 2) rec[-1] rec[-2]
    }
    OBSERVABLE_INCLUDE(2) rec[-1]
    QUBIT_COORDS(1, 2) 5
    SHIFT_COORDS(0, 0, 1)
    TICK
    """
    ours = Circuit(text)
    theirs = stim.Circuit(text)
    assert stim.Circuit(str(ours)) == theirs
    assert ours.num_measurements == theirs.num_measurements == 11
    assert ours.num_detectors == theirs.num_detectors
    assert ours.num_observables == theirs.num_observables == 3


def test_append_like_stim():
    c = Circuit()
    c.append("H", [0]).append("CNOT", [0, 1]).append("X_ERROR", [1], 0.25).append("M", [0, "!1"])
    c.append("DETECTOR", ["rec[-1]", "rec[-2]"], [0, 1])
    ref = stim.Circuit()
    ref.append("H", [0])
    ref.append("CX", [0, 1])
    ref.append("X_ERROR", [1], 0.25)
    ref.append("M", [0, stim.target_inv(1)])
    ref.append("DETECTOR", [stim.target_rec(-1), stim.target_rec(-2)], [0, 1])
    assert c.to_stim() == ref
    assert Circuit(c.to_stim()) == c
    assert (c * 3).num_measurements == 6


@pytest.mark.parametrize("text,message", [
    ("H 0\nFOO 1", "line 2: unknown instruction 'FOO'"),
    ("H 0\nSPP X0*Z1", "line 2: instruction 'SPP' is valid Stim but not supported"),
    ("CX 0 1 2", "line 1: CX: a two-qubit instruction needs an even number of targets, got 3"),
    ("CX 0 0", "line 1: CX: a pair acts twice on qubit 0"),
    ("M 0\nDETECTOR 0", "line 2: DETECTOR: target '0' must be a measurement record target"),
    ("M 0\nH rec[-1]", "line 2: H: target 'rec\\[-1\\]' must be a qubit"),
    ("M 0\nSWAP rec[-1] 1", "line 2: SWAP: 'rec\\[-1\\]' cannot be used there"),
    ("M 0\nCX 1 rec[-1]", "line 2: CX: 'rec\\[-1\\]' cannot be used there"),
    ("X_ERROR(1.5) 0", "line 1: X_ERROR: probability 1.5 is not in \\[0, 1\\]"),
    ("X_ERROR(abc) 0", "line 1: X_ERROR: argument 'abc' is not a number"),
    ("X_ERROR 0", "line 1: X_ERROR: takes 1 parenthesised argument"),
    ("H(0.1) 0", "line 1: H: takes 0 parenthesised argument"),
    ("DEPOLARIZE2(1.5) 0 1", "line 1: DEPOLARIZE2: probability 1.5 is not in"),
    ("PAULI_CHANNEL_1(0.5, 0.5, 0.5) 0", "line 1: PAULI_CHANNEL_1: probabilities sum to 1.5"),
    ("REPEAT 0 {\n H 0\n}", "line 1: REPEAT: count must be >= 1, got 0"),
    ("REPEAT 2 {\n H 0\n", "line 1: REPEAT block is never closed"),
    ("H 0\n}", "line 2: '}' without a matching REPEAT block"),
    ("REPEAT 2 {\n}", "line 1: REPEAT block is empty"),
    ("M 0\nCX rec[-2] 1", "line 2: CX: rec\\[-2\\] looks back further than the 1 measurement"),
    ("REPEAT 2 {\n  M 0\n  DETECTOR rec[-2]\n}", "line 3: DETECTOR: rec\\[-2\\] looks back further"),
    ("CX rec[0] 1", "line 1: CX: rec\\[0\\] is not a record target"),
    ("H 0 q1", "line 1: H: cannot parse target 'q1'"),
    ("MPP X0*", "line 1: MPP: a product ends with '\\*'"),
    ("MPP 0", "line 1: MPP: '0' must be a Pauli target"),
    ("MPP X0*Z0", "line 1: MPP: a qubit appears twice in the product X0\\*Z0"),
    ("E(0.1) 0", "line 1: E: targets must be Pauli targets"),
    ("R !0", "line 1: R: reset targets cannot be inverted"),
    ("OBSERVABLE_INCLUDE(-1) rec[-1]", "looks back|non-negative"),
    ("TICK 0", "line 1: TICK: takes no targets"),
    ("MPAD 0 2", "line 1: MPAD: targets are the padded values 0 or 1, got '2'"),
    ("DEPOLARIZE2(0.1) 3 3", "line 1: DEPOLARIZE2: a pair acts twice on qubit 3"),
    ("MZZ 0 1 2", "line 1: MZZ: a two-qubit instruction needs an even number of targets, got 3"),
])
def test_bad_input_names_the_line_and_the_instruction(text, message):
    with pytest.raises(CircuitError, match=message):
        Circuit(text)


def test_plain_qubit_targets_are_held_as_arrays_and_read_as_targets():
    """Plain qubit lists (the bulk of large circuits) are stored as one array, from text or from
    `append`; they print, compare and lower exactly like GateTargets."""
    np = pytest.importorskip("numpy")
    text = "H 0 5 7\nCX 1 2 3 4\nM 0 1\nMPAD 1 0"
    c = Circuit(text)
    assert all(op.qubit_array is not None for op in c)
    np.testing.assert_array_equal(c[1].qubit_array, [1, 2, 3, 4])
    assert [t.value for t in c[0].targets] == [0, 5, 7] and all(t.is_qubit_target for t in c[0].targets)
    built = Circuit()
    built.append("H", np.array([0, 5, 7])).append("CX", np.array([[1, 2], [3, 4]], np.int32))
    built.append("M", [0, 1]).append("MPAD", [1, 0])
    assert built == c and str(built) == text and stim.Circuit(str(c)) == stim.Circuit(text)
    assert c.num_qubits == 8 and c.num_measurements == 4
    assert Circuit("M !0 1")[0].qubit_array is None  # inverted targets keep their flags
    with pytest.raises(CircuitError, match="CX: a pair acts twice on qubit 3"):
        Circuit().append("CX", np.array([3, 3]))
    with pytest.raises(CircuitError, match="H: target -1 is not a qubit"):
        Circuit().append("H", np.array([0, -1]))


def test_measurement_count_follows_appends():
    c = Circuit()
    for k in range(1, 30):
        c.append("M", list(range(k % 4)))
        assert c.num_measurements == sum(j % 4 for j in range(1, k + 1))
    c.append("M", [0])
    with pytest.raises(CircuitError, match="rec\\[-80\\] looks back further than the 44"):
        c.append("DETECTOR", ["rec[-80]"])
    del c.operations[-5:]
    assert c.num_measurements == sum(j % 4 for j in range(1, 26))


def test_stim_rejects_what_we_reject():
    """Spot-check that the errors above are Stim's rules, not ours. (A lookback past the first
    measurement Stim only reports when simulating; we report it when parsing.)"""
    for text in ("CX 0 1 2", "CX 0 0", "X_ERROR(1.5) 0", "REPEAT 0 {\n H 0\n}", "FOO 0", "CX rec[0] 1"):
        with pytest.raises(ValueError):
            stim.Circuit(text)


def test_repeat_counts_multiply():
    c = Circuit("REPEAT 1000000 {\n M 0\n DETECTOR rec[-1]\n}")
    assert c.num_measurements == 1_000_000 and c.num_detectors == 1_000_000
    assert len(c) == 1  # stored once
