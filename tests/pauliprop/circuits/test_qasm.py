"""OpenQASM 2/3 and Qiskit import (pauliprop.circuits.qasm): each test states the property it checks.

The reference is Qiskit itself: `qiskit.quantum_info.Statevector` of the circuit Qiskit's own parser
builds from the same text. Both are little-endian, so amplitudes compare index by index; the
import drops global phases, so states are compared by fidelity.
"""

import math

import numpy as np
import pytest

qiskit = pytest.importorskip("qiskit")
pytest.importorskip("qiskit_qasm3_import")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import qiskit.qasm2 as qasm2  # noqa: E402
import qiskit.qasm3 as qasm3  # noqa: E402
from qiskit import QuantumCircuit  # noqa: E402
from qiskit.circuit import Parameter  # noqa: E402
from qiskit.circuit.library import get_standard_gate_name_mapping  # noqa: E402
from qiskit.circuit.random import random_circuit  # noqa: E402
from qiskit.quantum_info import Statevector  # noqa: E402

import pauliprop as pp  # noqa: E402
from pauliprop.statevector import simulate  # noqa: E402

from .. import _reference as R  # noqa: E402

HEADER2 = 'OPENQASM 2.0;\ninclude "qelib1.inc";\n'
HEADER3 = 'OPENQASM 3.0;\ninclude "stdgates.inc";\n'
TOL = 1e-12


def qiskit_state(qc):
    return np.asarray(Statevector(qc).data)


def fidelity(circuit: pp.Circuit, reference) -> float:
    a = np.asarray(simulate(circuit))
    return float(abs(np.vdot(a, reference)) ** 2)


def qasm2_reference(text):
    return qiskit_state(qasm2.loads(text, custom_instructions=qasm2.LEGACY_CUSTOM_INSTRUCTIONS))


def generic_product_state(rng, n):
    """QASM lines preparing a random product state on q[0..n-1], so controlled gates act nontrivially."""
    return "".join(f"ry({rng.uniform(0.2, 3.0)!r}) q[{i}];\nrz({rng.uniform(-3, 3)!r}) q[{i}];\n"
                   for i in range(n))


# name: (number of qubits, number of angles) for every gate of Qiskit's qelib1.inc, plus U and CX.
QELIB1 = {
    "u3": (1, 3), "u2": (1, 2), "u1": (1, 1), "u0": (1, 1), "u": (1, 3), "p": (1, 1), "U": (1, 3),
    "id": (1, 0), "x": (1, 0), "y": (1, 0), "z": (1, 0), "h": (1, 0), "s": (1, 0), "sdg": (1, 0),
    "t": (1, 0), "tdg": (1, 0), "sx": (1, 0), "sxdg": (1, 0), "rx": (1, 1), "ry": (1, 1), "rz": (1, 1),
    "cx": (2, 0), "CX": (2, 0), "cy": (2, 0), "cz": (2, 0), "swap": (2, 0), "ch": (2, 0), "csx": (2, 0),
    "crx": (2, 1), "cry": (2, 1), "crz": (2, 1), "cu1": (2, 1), "cp": (2, 1), "cu3": (2, 3), "cu": (2, 4),
    "rxx": (2, 1), "rzz": (2, 1),
    "ccx": (3, 0), "cswap": (3, 0), "rccx": (3, 0),
    "rc3x": (4, 0), "c3x": (4, 0), "c3sqrtx": (4, 0), "c4x": (5, 0),
}


@pytest.mark.parametrize("name", sorted(QELIB1))
def test_every_qelib1_gate_matches_qiskit(name):
    """Property: for every qelib1.inc gate, random angles and random distinct qubits of a 3-5 qubit
    register (after a random product state), from_qasm's state equals Qiskit's up to a phase."""
    arity, nparams = QELIB1[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    n = max(3, arity) + int(rng.integers(0, 2)) if arity < 5 else 5
    for _ in range(2 if arity <= 3 else 1):  # big gates expand to long circuits: one draw
        qubits = rng.permutation(n)[:arity]
        angles = rng.uniform(-2 * math.pi, 2 * math.pi, nparams)
        if name == "u0":  # u0(n) is n identity periods: Qiskit wants an integer
            angles = np.round(angles)
        call = name + (f"({', '.join(repr(float(a)) for a in angles)})" if nparams else "")
        text = (HEADER2 + f"qreg q[{n}];\n" + generic_product_state(rng, n)
                + f"{call} {', '.join(f'q[{int(k)}]' for k in qubits)};\n")
        c = pp.Circuit.from_qasm(text)
        assert c.num_qubits == n
        assert fidelity(c, qasm2_reference(text)) > 1 - TOL, text


@pytest.mark.parametrize("name", sorted(set(get_standard_gate_name_mapping()) - {"measure", "reset", "delay",
                                                                                     "barrier"}))
def test_every_qiskit_standard_gate_matches_qiskit(name):
    """Property: every Qiskit standard gate (random angles, random qubits) converts exactly via
    from_qiskit, including gates outside qelib1.inc (iswap, ryy, rzx, ecr, xx_plus_yy, ...)."""
    rng = np.random.default_rng(sum(map(ord, name)) + 7)
    template = get_standard_gate_name_mapping()[name]
    arity = template.num_qubits
    n = max(3, arity)
    qc = QuantumCircuit(n)
    for q in range(n):
        qc.ry(rng.uniform(0.2, 3.0), q)
        qc.rz(rng.uniform(-3, 3), q)
    op = template.base_class(*rng.uniform(-2 * math.pi, 2 * math.pi, len(template.params)))
    qc.append(op, [int(k) for k in rng.permutation(n)[:arity]])
    assert fidelity(pp.Circuit.from_qiskit(qc), qiskit_state(qc)) > 1 - TOL


def test_table_gates_map_one_to_one():
    """Property: gates that exist in pauliprop's table import as exactly that table gate (no
    decomposition), on the same qubits with the same angles."""
    text = HEADER2 + """qreg q[3];
h q[0]; x q[1]; y q[2]; z q[0]; s q[1]; sdg q[2]; t q[0]; tdg q[1]; sx q[2]; sxdg q[0]; id q[1];
cx q[0], q[2]; cy q[2], q[1]; cz q[1], q[0]; swap q[0], q[2];
rx(0.25) q[0]; ry(-1.5) q[1]; rz(pi/4) q[2]; rxx(0.5) q[2], q[0]; rzz(-0.75) q[1], q[2];
"""
    c = pp.Circuit.from_qasm(text)
    b = (pp.Circuit(3).h(0).x(1).y(2).z(0).s(1).sdg(2).t(0).tdg(1).sx(2).sxdg(0).append("id", [1])
         .cx(0, 2).cy(2, 1).cz(1, 0).swap(0, 2)
         .rx(0, 0.25).ry(1, -1.5).rz(2, math.pi / 4).rxx(2, 0, 0.5).rzz(1, 2, -0.75))
    assert c.instructions == b.instructions


def test_qasm_equals_builder_state():
    """Property: a program written with the builder and the same program as QASM text (with gates
    that need decomposition, like u3 and cp) give the same state vector."""
    text = HEADER2 + """qreg a[2];
qreg b[2];
h a[0];
cx a[0], b[1];
u3(0.3, -0.2, 1.1) a[1];
cp(0.7) a[1], b[0];
rzz(0.4) b[0], b[1];
t b[1];
"""
    # registers are numbered in declaration order: a[0]=0, a[1]=1, b[0]=2, b[1]=3
    b = pp.Circuit(4).h(0).cx(0, 3)
    b.rz(1, 1.1).ry(1, 0.3).rz(1, -0.2)  # u3(t, p, l) = rz(p) ry(t) rz(l), up to a phase
    b.rz(1, 0.35).rz(2, 0.35).rzz(1, 2, -0.35)  # cp(l) = rz(l/2) x rz(l/2) . rzz(-l/2), up to a phase
    b.rzz(2, 3, 0.4).t(3)
    c = pp.Circuit.from_qasm(text)
    assert c.num_qubits == 4
    assert abs(np.vdot(np.asarray(simulate(c)), np.asarray(simulate(b)))) ** 2 > 1 - TOL
    assert fidelity(c, qasm2_reference(text)) > 1 - TOL


@pytest.mark.parametrize("seed", range(8))
def test_qiskit_exporter_round_trip(seed):
    """Property: random Qiskit circuits (1-5 qubits, depth 5), exported by qiskit.qasm2.dumps and
    imported with from_qasm, or converted directly with from_qiskit, give Qiskit's state."""
    n = 1 + seed % 5
    qc = random_circuit(n, 5, measure=False, seed=1000 + seed)
    ref = qiskit_state(qc)
    assert fidelity(pp.Circuit.from_qasm(qasm2.dumps(qc)), ref) > 1 - TOL
    assert fidelity(pp.Circuit.from_qiskit(qc), ref) > 1 - TOL


@pytest.mark.parametrize("seed", range(3))
def test_qiskit_qasm3_exporter_round_trip(seed):
    """Property: the same holds through Qiskit's OpenQASM 3 exporter (qiskit.qasm3.dumps)."""
    qc = random_circuit(3, 4, measure=False, seed=2000 + seed)
    assert fidelity(pp.Circuit.from_qasm(qasm3.dumps(qc)), qiskit_state(qc)) > 1 - TOL


def test_user_gate_definition():
    """Property: a user `gate` with parameters expands into its body with the angle substituted."""
    text = HEADER2 + """gate mygate(a) q0, q1 { h q0; cx q0, q1; rz(a) q1; }
qreg q[3];
mygate(0.7) q[1], q[2];
mygate(-pi/3) q[2], q[0];
"""
    c = pp.Circuit.from_qasm(text)
    b = pp.Circuit(3).h(1).cx(1, 2).rz(2, 0.7).h(2).cx(2, 0).rz(0, -math.pi / 3)
    assert c.instructions == b.instructions
    assert fidelity(c, qasm2_reference(text)) > 1 - TOL


def test_user_gate_is_expanded_not_matched_by_name():
    """Property: a user gate that reuses a table name (ryy is not in qelib1.inc) follows its own
    body, not pauliprop's RYY."""
    text = HEADER2 + """gate ryy(a) x0, x1 { rx(a) x0; h x1; }
qreg q[2];
ryy(0.9) q[0], q[1];
"""
    c = pp.Circuit.from_qasm(text)
    assert c.instructions == pp.Circuit(2).rx(0, 0.9).h(1).instructions


def test_nested_user_gates_and_broadcast():
    """Property: gates defined from other user gates, applied to whole registers (broadcast),
    match Qiskit."""
    text = HEADER2 + """gate inner(a, b) x { rx(a) x; rz(b) x; }
gate outer(t) x, y { inner(t, 2*t) x; cu1(t/2) x, y; inner(-t, t) y; }
qreg q[3];
qreg r[3];
h q;
outer(0.37) q, r;
"""
    c = pp.Circuit.from_qasm(text)
    assert c.num_qubits == 6
    assert fidelity(c, qasm2_reference(text)) > 1 - TOL


def test_openqasm3_subset():
    """Property: an OpenQASM 3 program (detected by its header) imports to the builder's circuit and
    to Qiskit's state."""
    text = HEADER3 + "qubit[3] q;\nh q[0];\ncx q[0], q[1];\nrz(0.3) q[2];\n"
    c = pp.Circuit.from_qasm(text)
    assert c.instructions == pp.Circuit(3).h(0).cx(0, 1).rz(2, 0.3).instructions
    assert fidelity(c, qiskit_state(qasm3.loads(text))) > 1 - TOL


def test_openqasm3_gates_needing_decomposition():
    """Property: OpenQASM 3 stdgates outside the table (cp, crx, u3, ccx) and a user gate match Qiskit."""
    text = HEADER3 + """gate g(a) x, y { ry(a) x; cz x, y; }
qubit[3] q;
h q[0]; ry(0.4) q[1]; rx(1.2) q[2];
cp(0.5) q[0], q[2];
crx(-0.8) q[1], q[0];
u3(0.1, 0.2, 0.3) q[2];
ccx q[2], q[1], q[0];
g(0.6) q[2], q[1];
"""
    assert fidelity(pp.Circuit.from_qasm(text), qiskit_state(qasm3.loads(text))) > 1 - TOL


def test_barriers_and_classical_registers_are_ignored():
    """Property: barriers and unused classical registers do not change the imported circuit."""
    plain = HEADER2 + "qreg q[2];\nh q[0];\ncx q[0], q[1];\n"
    extra = HEADER2 + "qreg q[2];\ncreg c[2];\nh q[0];\nbarrier q;\ncx q[0], q[1];\nbarrier q[0];\n"
    assert pp.Circuit.from_qasm(extra).instructions == pp.Circuit.from_qasm(plain).instructions


def test_open_controls_are_respected():
    """Property: a Qiskit controlled gate with an open control (ctrl_state=0) is not mistaken for the
    ordinary table gate."""
    from qiskit.circuit.library import CRZGate, CXGate

    qc = QuantumCircuit(2)
    qc.ry(0.7, 0)
    qc.ry(1.3, 1)
    qc.append(CXGate(ctrl_state=0), [0, 1])
    qc.append(CRZGate(0.9, ctrl_state=0), [1, 0])
    assert fidelity(pp.Circuit.from_qiskit(qc), qiskit_state(qc)) > 1 - TOL


def test_from_qiskit_bound_parameters_and_errors():
    """Property: bound parameters become floats, unbound ones Params; measurements and resets are
    refused with errors naming them; barriers are skipped."""
    theta = Parameter("theta")
    qc = QuantumCircuit(2)
    qc.rx(theta, 0)
    qc.barrier()
    qc.crz(2 * theta, 0, 1)
    assert pp.Circuit.from_qiskit(qc).instructions[0].args == (pp.Param(0),)
    bound = qc.assign_parameters({theta: 0.4})
    assert fidelity(pp.Circuit.from_qiskit(bound), qiskit_state(bound)) > 1 - TOL
    assert all(not isinstance(a, pp.Param) for ins in pp.Circuit.from_qiskit(bound) for a in ins.args)

    m = QuantumCircuit(2, 1)
    m.h(0)
    m.measure(1, 0)
    with pytest.raises(ValueError, match=r"instruction 1 .*measure"):
        pp.Circuit.from_qiskit(m)
    r = QuantumCircuit(1)
    r.reset(0)
    with pytest.raises(ValueError, match="reset"):
        pp.Circuit.from_qiskit(r)


@pytest.mark.parametrize("body, pattern", [
    ("qreg q[3];\nh q[0];\nfoo q[0];\n", r"line 5\b.*foo"),  # unknown gate
    ("qreg q[3];\nh q[0]\nx q[1];\n", r"line 5\b.*(';'|x)"),  # missing semicolon: seen at the next token
    ("qreg q[3];\nh q[5];\n", r"line 4\b.*5"),  # qubit out of range
    ("qreg q[3];\ncreg c[3];\nh q[0];\n// a comment; with a semicolon\nmeasure q[0] -> c[0];\n",
     r"line 7\b.*measure"),
    ("qreg q[2];\nh q[0]; reset q[1];\n", r"line 4\b.*reset"),
    ("opaque bar a;\nqreg q[2];\nh q[0];\nbar q[1];\n", r"line 6\b.*bar"),  # no definition to expand
])
def test_qasm2_errors_name_the_line(body, pattern):
    """Property: every refused QASM 2 program raises ValueError naming the line and the culprit."""
    with pytest.raises(ValueError, match=pattern):
        pp.Circuit.from_qasm(HEADER2 + body)


@pytest.mark.parametrize("body, pattern", [
    ("qubit[3] q;\nfoo q[0];\n", r"line 4\b.*foo"),
    ("qubit[3] q;\nh q[0]\nx q[1];\n", r"line 5\b.*(';'|x)"),
    ("qubit[3] q;\nh q[0];\nh q[5];\n", r"line 5\b"),
    ("qubit[3] q;\nbit[3] c;\n/* a block; comment */ h q[0];\nc[0] = measure q[0];\n", r"line 6\b.*measure"),
])
def test_qasm3_errors_name_the_line(body, pattern):
    """Property: the same for OpenQASM 3 programs."""
    with pytest.raises(ValueError, match=pattern):
        pp.Circuit.from_qasm(HEADER3 + body)


def test_missing_qiskit_gives_install_hint(monkeypatch):
    """Property: without Qiskit, the import names the extra to install."""
    import sys

    monkeypatch.setitem(sys.modules, "qiskit", None)
    with pytest.raises(ImportError, match=r"pip install \"pauliprop\[qasm\]\""):
        pp.Circuit.from_qasm(HEADER2 + "qreg q[1];\nh q[0];\n")


def test_qasm3_input_parameters_are_bound_by_name_or_order():
    """OpenQASM 3 `input` parameters take values by name or in the order of their names; a missing,
    unknown or extra value is an error that names it."""
    from qiskit import QuantumCircuit, qasm3
    from qiskit.circuit import Parameter

    a, b = Parameter("alpha"), Parameter("beta")
    qc = QuantumCircuit(2)
    qc.rx(a, 0)
    qc.ry(b, 1)
    qc.cx(0, 1)
    text = qasm3.dumps(qc)
    want = pp.Circuit.from_qiskit(qc.assign_parameters({a: 0.3, b: -1.2}))
    obs = pp.PauliSum.from_text("Z0 Z1 + X1", 2)
    exact = float(pp.expectation(want, obs, method="statevector"))
    for params in ({"alpha": 0.3, "beta": -1.2}, [0.3, -1.2]):
        got = pp.Circuit.from_qasm(text, params)
        assert abs(float(pp.expectation(got, obs, method="statevector")) - exact) < 1e-12
    for params, cause in [(None, "free parameter"), ({"alpha": 0.3}, "no value for beta"),
                          ({"alpha": 0.3, "beta": 1.0, "gamma": 2.0}, "no input parameter named gamma"),
                          ([0.3], "2 input parameter"), ({"alpha": "x", "beta": 1.0}, "alpha: 'x' is not a number")]:
        with pytest.raises(ValueError, match=cause):
            pp.Circuit.from_qasm(text, params)
    with pytest.raises(ValueError, match="no input parameters"):
        pp.Circuit.from_qasm(qasm3.dumps(qc.assign_parameters({a: 0.3, b: 0.1})), [1.0])


# ---- unbound Parameters: kept as Params, differentiable in qc.parameters ---------------------------------

def _parametrized_circuit():
    """Every gate a Qiskit user writes that pauliprop decomposes (and one expanded through its Qiskit
    definition, XXPlusYY), with angles affine in one parameter: plain, scaled, shifted, reused."""
    from qiskit.circuit import ParameterVector
    from qiskit.circuit.library import XXPlusYYGate

    a, b, v = Parameter("a"), Parameter("b"), ParameterVector("v", 3)
    qc = QuantumCircuit(3)
    qc.h([0, 1, 2])
    qc.ry(0.4, 1)
    qc.p(a, 0)
    qc.cp(2 * b + 0.3, 0, 1)
    qc.crx(-a / 2, 1, 2)
    qc.cry(v[0], 2, 0)
    qc.crz(b - 1.1, 0, 2)
    qc.u(v[0], v[1], 3 * v[2], 2)
    qc.rzx(v[1] / 3, 0, 2)
    qc.ecr(1, 0)
    qc.ch(1, 2)
    qc.ccx(0, 1, 2)
    qc.rccx(2, 0, 1)
    qc.cu(a, b, v[2], 0.2, 2, 1)
    qc.append(XXPlusYYGate(a + 0.5, v[1]), [0, 2])
    qc.rzz(b, 1, 2)
    return qc


def _parameter_shift_gradient(qc, op, x):
    """d<op>/d(qc.parameters) at x by the parameter-shift rule on Qiskit's StatevectorEstimator: every
    parameter occurrence of the circuit transpiled to rz/sx/x/cx becomes its own angle t_k (rz(t_k),
    shifted by +-pi/2), and the chain rule sums them with the slopes of the occurrence's (linear) expression."""
    from qiskit import transpile
    from qiskit.circuit.library import RZGate
    from qiskit.primitives import StatevectorEstimator

    pos = {p: k for k, p in enumerate(qc.parameters)}
    t = transpile(qc, basis_gates=["rz", "sx", "x", "cx"], optimization_level=0)
    flat, angles, values, chain = QuantumCircuit(t.num_qubits), [], [], []
    for inst in t.data:
        qs = [t.find_bit(q).index for q in inst.qubits]
        expr = inst.operation.params[0] if inst.operation.params else None
        if getattr(expr, "parameters", None):  # Qiskit's own definitions may mix parameters: (b + v[2])/2
            angles.append(Parameter(f"t{len(angles)}"))
            flat.append(RZGate(angles[-1]), qs)
            values.append(float(expr.bind({p: x[pos[p]] for p in expr.parameters})))
            chain.append([(pos[p], float(expr.gradient(p))) for p in expr.parameters])
        else:
            flat.append(inst.operation, qs)
    k = len(angles)
    shifted = np.concatenate([np.array(values) + np.pi / 2 * np.eye(k), np.array(values) - np.pi / 2 * np.eye(k)])
    evs = StatevectorEstimator().run([(flat, op, {tuple(angles): shifted})]).result()[0].data.evs
    grad = np.zeros(len(pos))
    for slopes, d in zip(chain, (evs[:k] - evs[k:]) / 2):
        for i, slope in slopes:
            grad[i] += slope * d
    return grad


def test_from_qiskit_keeps_parameters_exactly_and_differentiably():
    """Property: a Qiskit circuit with unbound Parameters converts once; at random values (params[k] =
    the value of qc.parameters[k]) its unitary is Qiskit's Operator of the bound circuit, its state
    Qiskit's Statevector (up to a global phase), both methods' expectation values Qiskit's to 1e-10, and
    jax.grad of the Pauli estimate is the parameter-shift gradient from StatevectorEstimator to 1e-8."""
    import jax
    from qiskit.quantum_info import Operator, SparsePauliOp

    qc = _parametrized_circuit()
    c = pp.Circuit.from_qiskit(qc)
    assert c.num_params == len(qc.parameters) == 5
    op = SparsePauliOp(["ZZI", "XIY", "IZX", "YYZ"], [1.0, 0.5, -0.3, 0.7])
    obs = pp.PauliSum.from_qiskit(op)
    rng = np.random.default_rng(7)
    for x in rng.uniform(-np.pi, np.pi, (2, 5)):
        bound = qc.assign_parameters(x)
        u, want = R.dense_unitary(c, x), Operator(bound).data
        phase = np.vdot(u.ravel(), want.ravel()) / len(u)
        np.testing.assert_allclose(phase * u, want, atol=1e-10)
        assert abs(np.vdot(np.asarray(simulate(c, x)), qiskit_state(bound))) ** 2 > 1 - TOL
        exact = Statevector(bound).expectation_value(op).real
        for method in ("pauli", "statevector"):
            assert abs(float(pp.expectation(c, obs, x, method=method)) - exact) < 1e-10, method
    grad = jax.grad(lambda p: pp.expectation(c, obs, p, capacity=64))(jax.numpy.asarray(x))  # 4^3 words: exact
    np.testing.assert_allclose(np.asarray(grad), _parameter_shift_gradient(qc, op, x), atol=1e-8)


def test_from_qiskit_refuses_angles_not_affine_in_one_parameter():
    """Property: an angle in two parameters, or not affine in its one, is a ValueError naming the gate
    and the expression (directly and inside a definition)."""
    from qiskit.circuit.library import XXPlusYYGate

    a, b = Parameter("a"), Parameter("b")
    cases = [(lambda q: q.rx(a * b, 0), r"'rx'.*a\*b.*several parameters \(a, b\)"),
             (lambda q: q.crz(a + b, 0, 1), r"'crz'.*a \+ b.*several parameters"),
             (lambda q: q.ry(a ** 2, 1), r"'ry'.*a\*\*2 is not affine in a"),
             (lambda q: q.cp(a.sin(), 1, 0), r"'cp'.*sin\(a\) is not affine in a"),
             (lambda q: q.append(XXPlusYYGate(a.exp(), 0.1), [0, 1]), r"'xx_plus_yy'.*exp\(a\) is not affine")]
    for build, pattern in cases:
        qc = QuantumCircuit(2)
        qc.h(0)
        build(qc)
        with pytest.raises(ValueError, match=r"instruction 1 \(" + pattern):
            pp.Circuit.from_qiskit(qc)


def _equal_up_to_phase(u, want, atol=1e-10):
    phase = np.vdot(u.ravel(), want.ravel()) / len(u)
    np.testing.assert_allclose(phase * u, want, atol=atol)


PARAMETRIZED_STANDARD_GATES = sorted(name for name, g in get_standard_gate_name_mapping().items()
                                     if g.params and name not in {"delay", "global_phase"})


@pytest.mark.parametrize("name", PARAMETRIZED_STANDARD_GATES)
def test_every_parametrized_standard_gate_keeps_its_parameters_exactly(name):
    """Property: every Qiskit standard gate with angles, each angle an affine expression of its own
    Parameter (2 p - 0.3), converts with Params whose unitary at random values is Qiskit's Operator of
    the bound gate, up to a global phase."""
    from qiskit.quantum_info import Operator

    template = get_standard_gate_name_mapping()[name]
    ps = [Parameter(f"p{k}") for k in range(len(template.params))]
    qc = QuantumCircuit(template.num_qubits)
    qc.append(template.base_class(*[2 * p - 0.3 for p in ps]), range(template.num_qubits))
    c = pp.Circuit.from_qiskit(qc)
    assert c.num_params == len(ps)
    for x in np.random.default_rng(sum(map(ord, name))).uniform(-np.pi, np.pi, (2, len(ps))):
        _equal_up_to_phase(R.dense_unitary(c, x), Operator(qc.assign_parameters(x)).data)


def _evolution_circuit(operator, time):
    from qiskit.circuit.library import PauliEvolutionGate

    qc = QuantumCircuit(4)
    for q in range(4):
        qc.ry(0.3 + 0.4 * q, q)
    qc.append(PauliEvolutionGate(operator, time=time), [3, 0, 2])
    qc.rx(Parameter("b"), 1)
    return qc


def test_a_pauli_evolution_of_commuting_terms_is_exact_and_differentiable():
    """Property: exp(-i t H) with commuting terms (a SparsePauliOp, a list of them, a SparseObservable;
    t affine in a Parameter) becomes one Pauli rotation a term: its unitary is Qiskit's Operator (the exact
    exponential), and jax.grad of an expectation is the parameter-shift gradient of Qiskit's."""
    import jax
    from qiskit.quantum_info import Operator, SparseObservable, SparsePauliOp

    t = Parameter("t")
    h = SparsePauliOp(["ZZI", "IZZ", "XXX", "III", "ZZI"], [0.7, -0.4, 0.25, 2.0, 0.1])
    forms = [h, [h[:2], h[2:]], SparseObservable.from_sparse_list([("ZZ", [1, 2], 0.8), ("XXX", [0, 1, 2], 0.25)], 3)]
    op = SparsePauliOp(["ZIYX", "IXZI"], [1.0, -0.6])
    for operator in forms:
        qc = _evolution_circuit(operator, 2 * t + 0.1)
        c = pp.Circuit.from_qiskit(qc)
        assert [ins.name for ins in c].count("pauli_rotation") == 3 - (operator is forms[2])
        x = np.array([0.2, 0.9])  # (b, t): qc.parameters' order
        _equal_up_to_phase(R.dense_unitary(c, x), Operator(qc.assign_parameters(x)).data)
    grad = jax.grad(lambda p: pp.expectation(c, pp.PauliSum.from_qiskit(op), p, capacity=256))(jax.numpy.asarray(x))
    np.testing.assert_allclose(np.asarray(grad), _parameter_shift_gradient(qc, op, x), atol=1e-8)


def test_a_pauli_evolution_of_non_commuting_terms_is_refused_and_its_product_formula_runs_decomposed():
    """Property: exp(-i t H) with non-commuting terms is a ValueError naming two of them and the way out;
    decomposed (Qiskit's product formula, chosen by the user), it converts to Qiskit's state of that formula."""
    from qiskit.quantum_info import SparsePauliOp

    qc = _evolution_circuit(SparsePauliOp(["XYZ", "ZZI", "IIX"], [0.5, -1.0, 0.3]), 0.7).assign_parameters([0.4])
    with pytest.raises(ValueError, match=r"instruction 4 \('PauliEvolution'.*terms XYZ and IIX .* do not commute"
                                         r".*product formula.*qc\.decompose\(\)"):
        pp.Circuit.from_qiskit(qc)
    formula = qc.decompose(gates_to_decompose=["PauliEvolution"])
    assert fidelity(pp.Circuit.from_qiskit(formula), qiskit_state(formula)) > 1 - TOL


def test_a_gate_qiskit_cannot_expand_with_unbound_parameters_is_named():
    """Property: a gate whose definition Qiskit refuses to build unbound (rv) is a ValueError naming the
    instruction, the gate and the remedy, not Qiskit's bare CircuitError."""
    from qiskit.circuit.library import RVGate

    qc = QuantumCircuit(2)
    qc.h(1)
    qc.append(RVGate(Parameter("a"), 0.2, 0.3), [0])
    with pytest.raises(ValueError, match=r"instruction 1 \('rv' on qubit\(s\) \[0\]\): Qiskit cannot expand gate "
                                         r"'rv' with unbound parameters \(bind them first\)"):
        pp.Circuit.from_qiskit(qc)
    bound = qc.assign_parameters([0.5])
    assert fidelity(pp.Circuit.from_qiskit(bound), qiskit_state(bound)) > 1 - TOL
