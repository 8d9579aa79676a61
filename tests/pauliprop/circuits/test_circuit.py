"""The circuit builder (pauliprop/circuits/circuit.py): validation names the cause, chaining, Params."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.circuits.circuit import Param

from .. import _reference as R


# ---- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("build, err, cause", [
    (lambda c: c.h(3), ValueError, r"gate 'h': qubit 3 out of range for a 3-qubit circuit"),
    (lambda c: c.cx(0, 7), ValueError, r"gate 'cx': qubit 7 out of range"),
    (lambda c: c.rzz(-1, 0, 0.1), ValueError, r"gate 'rzz': qubit -1 out of range"),
    (lambda c: c.pauli_rotation("XZ", [0, 5], 0.1), ValueError, r"gate 'pauli_rotation': qubit 5 out of range"),
    (lambda c: c.h(1.0), TypeError, r"gate 'h': qubit must be an int"),
    (lambda c: c.h(True), TypeError, r"qubit must be an int"),
    (lambda c: c.cx(1, 1), ValueError, r"gate 'cx': qubits must be distinct"),
    (lambda c: c.append("cx", [0]), ValueError, r"gate 'cx' acts on 2 qubit\(s\), got 1"),
    (lambda c: c.append("rx", [0]), ValueError, r"gate 'rx' takes 1 parameter\(s\), got 0"),
    (lambda c: c.append("rx", [0], 0.1, 0.2), ValueError, r"gate 'rx' takes 1 parameter\(s\), got 2"),
    (lambda c: c.append("h", [0], 0.1), ValueError, r"gate 'h' takes 0 parameter\(s\), got 1"),
    (lambda c: c.append("pauli_channel", [0], 0.1), ValueError, r"gate 'pauli_channel' takes 3 parameter"),
    (lambda c: c.rx(0, float("nan")), ValueError, r"gate 'rx': angle nan is not finite"),
    (lambda c: c.ryy(0, 1, float("inf")), ValueError, r"gate 'ryy': angle inf is not finite"),
    (lambda c: c.rz(0, "0.1"), TypeError, r"gate 'rz': angle must be a float or pp.Param"),
    (lambda c: c.rz(0, None), TypeError, r"angle must be a float or pp.Param"),
    (lambda c: c.pauli_rotation("XA", [0, 1], 0.1), ValueError, r"pauli_rotation: generator must be a string over I, X, Y, Z"),
    (lambda c: c.pauli_rotation("", [], 0.1), ValueError, r"generator must be a string"),
    (lambda c: c.append("pauli_rotation", [0], 0.1), ValueError, r"generator must be a string"),
    (lambda c: c.pauli_rotation("XYZ", [0, 1], 0.1), ValueError, r"generator 'XYZ' has 3 letters but 2 qubits"),
    (lambda c: c.pauli_rotation("XX", [1, 1], 0.1), ValueError, r"qubits must be distinct"),
    (lambda c: c.depolarize(0, 1.5), ValueError, r"gate 'depolarize': probability 1.5 is not in \[0, 1\]"),
    (lambda c: c.dephase(0, -0.1), ValueError, r"gate 'dephase': probability -0.1 is not in \[0, 1\]"),
    (lambda c: c.amplitude_damp(0, float("nan")), ValueError, r"probability nan is not in \[0, 1\]"),
    (lambda c: c.pauli_channel(0, 0.5, 0.4, 0.3), ValueError, r"px \+ py \+ pz = 1.2 exceeds 1"),
    (lambda c: c.pauli_channel(0, 0.5, -0.4, 0.3), ValueError, r"probability -0.4 is not in \[0, 1\]"),
    (lambda c: c.depolarize(0, Param(0)), TypeError, r"noise strengths are fixed floats"),
    (lambda c: c.append("cccx", [0, 1, 2]), ValueError, r"unknown gate 'cccx'"),
])
def test_builder_validation_names_the_cause(build, err, cause):
    c = pp.Circuit(3)
    with pytest.raises(err, match=cause):
        build(c)
    assert len(c) == 0  # nothing half-appended


@pytest.mark.parametrize("n", [0, -1, 2.0, True, "3", None])
def test_num_qubits_must_be_a_positive_int(n):
    with pytest.raises(ValueError, match="num_qubits must be a positive int"):
        pp.Circuit(n)


@pytest.mark.parametrize("index", [-1, 1.5, True, "0", None])
def test_param_index_must_be_a_non_negative_int(index):
    with pytest.raises(ValueError, match="Param index must be a non-negative int"):
        Param(index)


def test_numpy_integer_qubits_are_accepted():
    c = pp.Circuit(3).cx(np.int64(0), np.int32(2))
    assert c.instructions[0].qubits == (0, 2) and all(type(q) is int for q in c.instructions[0].qubits)


# ---- chaining and queries ---------------------------------------------------------------------------------

BUILDERS = [("h", (0,)), ("x", (0,)), ("y", (0,)), ("z", (0,)), ("s", (0,)), ("sdg", (0,)), ("t", (0,)),
            ("tdg", (0,)), ("sx", (0,)), ("sxdg", (0,)), ("cx", (0, 1)), ("cy", (0, 1)), ("cz", (0, 1)),
            ("swap", (0, 1)), ("iswap", (0, 1)), ("rx", (0, 0.1)), ("ry", (0, 0.1)), ("rz", (0, Param(2))),
            ("rxx", (0, 1, 0.1)), ("ryy", (0, 1, 0.1)), ("rzz", (0, 1, Param(0))),
            ("pauli_rotation", ("XZ", [0, 1], 0.1)), ("depolarize", (0, 0.1)), ("dephase", (0, 0.1)),
            ("pauli_channel", (0, 0.1, 0.1, 0.1)), ("amplitude_damp", (0, 0.1)), ("append", ("cnot", [1, 0]))]


def test_every_builder_returns_self_and_records_one_instruction():
    c = pp.Circuit(2)
    for k, (method, args) in enumerate(BUILDERS):
        assert getattr(c, method)(*args) is c
        assert len(c) == k + 1
    assert [ins.name for ins in c][-1] == "cx" and c.instructions[-1].qubits == (1, 0)
    assert c.has_noise and not pp.Circuit(2).h(0).has_noise


def test_instructions_record_gate_qubits_args():
    c = pp.Circuit(3).rzz(2, 0, Param(1)).pauli_rotation("xiz", [0, 1, 2], 0.5).pauli_channel(1, 0.1, 0.2, 0.3)
    a, b, ch = c.instructions
    assert (a.name, a.qubits, a.args) == ("rzz", (2, 0), (Param(1),))
    assert (b.name, b.qubits, b.args, b.pauli) == ("pauli_rotation", (0, 1, 2), (0.5,), "XIZ")
    assert (ch.name, ch.args) == ("pauli_channel", (0.1, 0.2, 0.3))
    assert a.gate is pp.GATES["rzz"]


@given(st.lists(st.integers(0, 50), max_size=8), st.integers(0, 3))
def test_num_params_is_one_more_than_the_largest_index(indices, fixed):
    c = pp.Circuit(2)
    for k in indices:
        c.rx(0, 2 * Param(k) + 1)
    for _ in range(fixed):
        c.ry(1, 0.3)
    assert c.num_params == (max(indices) + 1 if indices else 0)


def test_copy_and_concatenation():
    a = pp.Circuit(2).h(0)
    b = pp.Circuit(2).cx(0, 1)
    ab = a + b
    assert [i.name for i in ab] == ["h", "cx"] and len(a) == 1 and len(b) == 1
    cp = a.copy()
    cp.x(1)
    assert len(a) == 1 and len(cp) == 2
    with pytest.raises(ValueError, match="cannot concatenate circuits on 2 and 3 qubits"):
        a + pp.Circuit(3)
    assert "gates=2" in repr(ab)


# ---- Param arithmetic --------------------------------------------------------------------------------------

def test_param_affine_forms():
    p = Param(3)
    assert 2 * p + 1 == Param(3, 2.0, 1.0)
    assert p * 2 + 1 == Param(3, 2.0, 1.0)
    assert (2 * p + 1) * 3 == Param(3, 6.0, 3.0)
    assert -p / 2 + 0.3 == Param(3, -0.5, 0.3)
    assert 1 - p == Param(3, -1.0, 1.0)
    assert p - 1 == Param(3, 1.0, -1.0)
    assert 0.5 + p == Param(3, 1.0, 0.5)
    with pytest.raises(TypeError, match="sums of two Params"):
        p + Param(1)


FORMS = [lambda p: p, lambda p: 2 * p + 1, lambda p: -p / 2 + 0.3, lambda p: 1 - p, lambda p: (p - 0.25) * 3]


@settings(max_examples=20)
@given(st.floats(-3, 3), st.floats(-3, 3), st.sampled_from(range(len(FORMS))))
def test_affine_params_evaluate_through_the_statevector(v0, v1, form):
    """rx(0, f(Param(1))) on the statevector equals rx(0, f(v1)) with the angle evaluated by hand."""
    f = FORMS[form]
    params = np.array([v0, v1])
    c_param = pp.Circuit(2).ry(1, Param(0)).rx(0, f(Param(1))).rzz(0, 1, f(Param(0)))
    c_fixed = pp.Circuit(2).ry(1, v0).rx(0, f(v1)).rzz(0, 1, f(v0))
    psi = np.asarray(pp.statevector.simulate(c_param, params))
    np.testing.assert_allclose(psi, np.asarray(pp.statevector.simulate(c_fixed)), atol=1e-12)
    np.testing.assert_allclose(psi, R.dense_unitary(c_fixed)[:, 0], atol=1e-12)
