"""pauliprop.Estimator (pauliprop/estimator.py): Qiskit's Estimator primitive. The reference is Qiskit's own
StatevectorEstimator on the same pubs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

qiskit = pytest.importorskip("qiskit")

from qiskit import QuantumCircuit  # noqa: E402
from qiskit.circuit import Parameter, ParameterVector  # noqa: E402
from qiskit.primitives import BaseEstimatorV2, StatevectorEstimator  # noqa: E402
from qiskit.quantum_info import Pauli, SparseObservable, SparsePauliOp, Statevector  # noqa: E402

import pauliprop as pp  # noqa: E402


def random_circuit(seed: int, n: int = 3, layers: int = 3) -> QuantumCircuit:
    """A random circuit over rotations, controlled rotations and Cliffords whose angles are affine in
    the entries of a ParameterVector (plain, scaled, shifted; some reused), with a few fixed angles."""
    rng = np.random.default_rng(seed)
    v = ParameterVector("v", 4)
    qc = QuantumCircuit(n)
    qc.h(range(n))

    def angle():
        if rng.random() < 0.2:
            return float(rng.uniform(-3, 3))
        return float(rng.choice([1.0, -0.5, 2.0])) * v[int(rng.integers(4))] + float(rng.choice([0.0, 0.3]))

    for _ in range(layers):
        for q in range(n):
            getattr(qc, str(rng.choice(["rx", "ry", "rz", "p"])))(angle(), q)
        a, b = (int(i) for i in rng.permutation(n)[:2])
        kind = str(rng.choice(["crx", "cry", "crz", "cp", "rzz", "rzx"]))
        getattr(qc, kind)(angle(), a, b)
        getattr(qc, str(rng.choice(["cx", "ecr", "ch", "cz"])))(b, a)
    qc.u(angle(), angle(), angle(), 0)
    return qc


OBSERVABLES = ["ZZI", "XIY", SparsePauliOp(["IZX", "YYZ", "III"], [0.5, -0.7, 0.2]), Pauli("-XXZ"),
               SparsePauliOp(["ZIZ", "XYI"], [1.0, 0.4])]


def pubs_of_every_shape(qc):
    """Scalar, 1-D, 2-D and 3-D parameter arrays, observable arrays broadcast against them, a circuit
    without parameters; shapes (), (3,), (3, 4), (2, 2), (3, 2, 2), () (batches of 3 and 4 share a program)."""
    rng = np.random.default_rng(1)
    p = qc.num_parameters
    values = lambda *shape: rng.uniform(-np.pi, np.pi, (*shape, p))
    bound = qc.assign_parameters(values())
    return [(qc, OBSERVABLES[2], values()),
            (qc, OBSERVABLES[0], values(3)),
            (qc, [[o] for o in OBSERVABLES[1:4]], values(4)),
            (qc, OBSERVABLES[3:5], values(2, 2)),
            (qc, [[[OBSERVABLES[0]]], [[OBSERVABLES[4]]], [[OBSERVABLES[1]]]], values(1, 2, 2)),
            (bound, OBSERVABLES[4])]


@pytest.mark.parametrize("method", ["pauli", "statevector"])
def test_untruncated_equals_statevector_estimator_on_pubs_of_every_shape(method):
    """Property: on random parametrized circuits and pubs of every shape, evs equal StatevectorEstimator's
    to 1e-10 with its broadcast shape, stds are 0, and the metadata names the precision and method."""
    qcs = [random_circuit(seed) for seed in (3, 4)]
    pubs = [pub for qc in qcs for pub in pubs_of_every_shape(qc)]
    ours = pp.Estimator(method=method).run(pubs).result()
    theirs = StatevectorEstimator().run(pubs).result()
    assert len(ours) == len(pubs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.data.evs.shape == b.data.evs.shape == a.data.stds.shape, i
        np.testing.assert_allclose(a.data.evs, b.data.evs, atol=1e-10, rtol=0, err_msg=f"pub {i}")
        assert np.all(a.data.stds == 0)
        assert a.metadata["target_precision"] == 0.0 and a.metadata["method"] == method
    assert [r.data.evs.shape for r in ours[:6]] == [(), (3,), (3, 4), (2, 2), (3, 2, 2), ()]


def test_truncated_stds_bound_the_error():
    """Property: truncated, |evs - exact| <= stds (the dropped 1-norm, a bound); the metadata carries the
    truncation and the term counts, of the pub's shape."""
    qc = random_circuit(5)
    pub = pubs_of_every_shape(qc)[2]
    cut = pp.Truncation(min_abs_coeff=0.05)
    res = pp.Estimator(truncation=cut).run([pub], precision=0.01).result()[0]
    exact = StatevectorEstimator().run([pub]).result()[0].data.evs
    assert np.all(np.abs(res.data.evs - exact) <= res.data.stds + 1e-12)
    assert np.any(res.data.stds > 0)
    md = res.metadata
    assert md["truncation"]["min_abs_coeff"] == 0.05 and md["target_precision"] == 0.01
    assert md["peak_terms"].shape == md["final_terms"].shape == res.data.evs.shape
    assert np.all(md["peak_terms"] >= md["final_terms"]) and np.all(md["final_terms"] >= 1)


def test_observables_in_other_forms_convert_exactly_and_non_hermitian_ones_are_named():
    """Property: SparseObservable projectors (0 1 + - r l), signed Paulis and {label: coeff} dicts give
    Qiskit's Statevector expectation; a SparsePauliOp with imaginary coefficients is refused naming them."""
    a = Parameter("a")
    qc = QuantumCircuit(3)
    qc.h(0)
    qc.ry(a, 1)
    qc.crx(0.7, 0, 2)
    qc.cx(1, 2)
    x = [0.4]
    state = Statevector(qc.assign_parameters(x))
    forms = [SparseObservable("0+r"), SparseObservable.from_sparse_list([("1-", (0, 2), 2.0), ("lZ", (1, 2), -0.5)], 3),
             Pauli("-YIX"), {"XZZ": 0.3, "IIZ": -1.2}]
    res = pp.Estimator().run([(qc, forms, x)]).result()[0].data.evs
    for got, obs in zip(res, forms):
        op = SparsePauliOp.from_list(list(obs.items())) if isinstance(obs, dict) else obs
        op = SparsePauliOp.from_sparse_observable(op.as_paulis()) if isinstance(op, SparseObservable) else op
        assert abs(got - state.expectation_value(op).real) < 1e-12, obs
    with pytest.raises(ValueError, match=r"pub 0: .*not Hermitian.*XZI \(0\+0\.5j\)"):
        pp.Estimator().run([(qc, SparsePauliOp(["XZI", "ZZZ"], [0.5j, 1.0]), x)])


def vqe(estimator: BaseEstimatorV2, ansatz, hamiltonian, x, steps=4, rate=0.3):
    """A short VQE written against the primitive only: parameter-shift gradients (one pub of 2P
    parameter sets) and gradient steps; returns the energies along the way."""
    p = ansatz.num_parameters
    energies = []
    for _ in range(steps):
        shifted = x + np.pi / 2 * np.vstack([np.eye(p), -np.eye(p)])
        pubs = [(ansatz, hamiltonian, shifted), (ansatz, hamiltonian, x)]
        grad_pub, energy_pub = estimator.run(pubs).result()
        energies.append(float(energy_pub.data.evs))
        x = x - rate * (grad_pub.data.evs[:p] - grad_pub.data.evs[p:]) / 2
    return np.array(energies)


def test_a_vqe_written_for_base_estimator_v2_runs_unchanged():
    """Property: the same VQE code gives StatevectorEstimator's energies to 1e-10, and they descend."""
    theta = ParameterVector("t", 6)
    ansatz = QuantumCircuit(3)
    for q in range(3):
        ansatz.ry(theta[q], q)
    ansatz.cx(0, 1)
    ansatz.cx(1, 2)
    for q in range(3):
        ansatz.rz(theta[3 + q], q)
    hamiltonian = SparsePauliOp(["ZZI", "IZZ", "XII", "IXI", "IIX"], [1.0, 1.0, 0.6, 0.6, 0.6])
    x0 = np.linspace(0.3, 1.2, 6)
    ours = vqe(pp.Estimator(), ansatz, hamiltonian, x0)
    theirs = vqe(StatevectorEstimator(), ansatz, hamiltonian, x0)
    assert isinstance(pp.Estimator(), BaseEstimatorV2)
    np.testing.assert_allclose(ours, theirs, atol=1e-10, rtol=0)
    assert ours[-1] < ours[0]


@pytest.mark.parametrize("kwargs, cause", [
    ({"method": "mps"}, "unknown method 'mps'"),
    ({"method": "statevector", "truncation": pp.Truncation(max_weight=2)}, "statevector.*takes no truncation"),
    ({"options": {"capcity": 8}}, "unknown option.*capcity"),
    ({"truncation": 0.1}, "pauliprop.Truncation"),
    ({"default_precision": -1.0}, "default_precision"),
    ({"device": "nosuch"}, "device 'nosuch'"),
    ({"device": 3}, "jax.Device or a platform's name"),
])
def test_bad_settings_name_the_cause(kwargs, cause):
    with pytest.raises((ValueError, TypeError), match=cause):
        pp.Estimator(**kwargs)


DEVICE_JOB = r"""
import json, os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from qiskit import QuantumCircuit
from qiskit.circuit import Parameter
import pauliprop as pp
a = Parameter("a")
qc = QuantumCircuit(3)
qc.h(0); qc.cx(0, 1); qc.ry(a, 2); qc.rzz(0.3, 1, 2); qc.rx(2 * a, 0)
pub = (qc, ["ZZI", "XIZ"], [[0.1], [0.7]])
second = jax.devices()[1]
on_second = pp.Estimator(device=second).run([pub]).result()[0]
on_first = pp.Estimator().run([pub]).result()[0]
print(json.dumps({"device": on_second.metadata["device"], "second": str(second), "default": on_first.metadata["device"],
                  "first": str(jax.devices()[0]), "equal": bool(np.array_equal(on_second.data.evs, on_first.data.evs))}))
"""


def test_a_device_runs_the_pubs_there():
    """Property: Estimator(device=d) computes under jax.default_device(d) (here the second of two CPU devices,
    in a subprocess: JAX fixes its devices when it starts), with the default device's values."""
    env = dict(__import__("os").environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", DEVICE_JOB], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got["device"] == got["second"] != got["default"] == got["first"]
    assert got["equal"]


def test_importing_pauliprop_needs_no_qiskit():
    """Property: without Qiskit, `import pauliprop` works and pp.Estimator names the extra to install."""
    code = ("import sys; sys.modules['qiskit'] = None\nimport pauliprop as pp\n"
            "try:\n    pp.Estimator\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'pip install "pauliprop[qasm]"' in out.stdout


# ---- Qiskit's own conformance patterns (test/python/primitives/test_statevector_estimator.py) ------------

def real_amplitudes_2q(reps: int) -> QuantumCircuit:
    from qiskit.circuit.library import real_amplitudes

    qc = QuantumCircuit(2)
    qc.append(real_amplitudes(num_qubits=2, reps=reps), [0, 1])
    return qc


def test_qiskits_estimator_run_patterns_give_qiskits_published_values():
    """Property: the pubs of Qiskit's test_estimator_run and test_estimator_with_pub (real_amplitudes, values
    as lists, bare sequences, explicit EstimatorPubs over BindingsArray/ObservablesArray) give the values
    Qiskit's test asserts for StatevectorEstimator."""
    from qiskit.primitives.containers.bindings_array import BindingsArray
    from qiskit.primitives.containers.estimator_pub import EstimatorPub
    from qiskit.primitives.containers.observables_array import ObservablesArray

    psi1, psi2 = real_amplitudes_2q(2), real_amplitudes_2q(3)
    h1, h2, h3 = (SparsePauliOp.from_list([("II", 1), ("IZ", 2), ("XI", 3)]), SparsePauliOp.from_list([("IZ", 1)]),
                  SparsePauliOp.from_list([("ZI", 1), ("ZZ", 1)]))
    theta1, theta2, theta3 = [0, 1, 1, 2, 3, 5], [0, 1, 1, 2, 3, 5, 8, 13], [1, 2, 3, 4, 5, 6]
    est = pp.Estimator()
    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-7)
    close(est.run([(psi1, h1, [theta1])]).result()[0].data.evs, [1.5555572817900956])
    close(est.run([(psi2, h1, theta2)]).result()[0].data.evs, [2.97797666])
    close(est.run([(psi1, [h2, h3], theta1)]).result()[0].data.evs, [-0.551653, 0.07535239])
    r = est.run([(psi1, [h1, h3], [theta1, theta3]), (psi2, h2, theta2)]).result()
    close(r[0].data.evs, [1.55555728, -1.08766318])
    close(r[1].data.evs, [0.17849238])
    pub1 = EstimatorPub(psi1, ObservablesArray.coerce([h1, h3]),
                        BindingsArray.coerce({tuple(psi1.parameters): [theta1, theta3]}))
    pub2 = EstimatorPub(psi2, ObservablesArray.coerce(h2), BindingsArray.coerce({tuple(psi2.parameters): theta2}))
    r = est.run(iter([pub1, pub2])).result()
    close(r[0].data.evs, [1.55555728, -1.08766318])
    close(r[1].data.evs, [0.17849238])


def test_qiskits_value_forms_endianness_and_metadata():
    """Property: every form of "no values" and of one or k parameter sets Qiskit's tests pass (None, [],
    [[]], arrays, lists of arrays), named groups of parameters {("a", "b"): ..., "c": ...}, 1- and 2-qubit
    endianness, and the result's and pubs' metadata, as StatevectorEstimator gives them."""
    est = pp.Estimator()
    x = QuantumCircuit(1)
    x.x(0)
    for none in [None, [], [[]], np.array([]), np.array([[]]), [np.array([])]]:
        res = est.run([(x, SparsePauliOp("Z"), none)]).result()[0]
        np.testing.assert_allclose(res.data.evs, StatevectorEstimator().run([(x, "Z", none)]).result()[0].data.evs)
        assert res.metadata["target_precision"] == 0
    ansatz, op = real_amplitudes_2q(2), SparsePauliOp.from_list([("IZ", 1), ("XI", 2), ("ZY", -1)])
    values = np.random.default_rng(12).random((5, ansatz.num_parameters))
    want = StatevectorEstimator().run([(ansatz, op, values)]).result()[0].data.evs
    for form in [values, values.tolist(), list(values)]:
        np.testing.assert_allclose(est.run([(ansatz, op, form)]).result()[0].data.evs, want, atol=1e-10, rtol=0)

    a, b, c = Parameter("a"), Parameter("b"), Parameter("c")
    qc = QuantumCircuit(2)
    qc.ry(a, 0)
    qc.rx(b, 1)
    qc.cx(0, 1)
    qc.rz(2 * c - 0.5, 1)
    qc.h(1)
    groups = {("a", "b"): np.random.default_rng(3).uniform(-3, 3, (2, 3, 2)), "c": np.linspace(-1, 1, 6).reshape(2, 3)}
    pubs = [(qc, ["ZZ", "XI", "IY"], groups)]
    np.testing.assert_allclose(est.run(pubs).result()[0].data.evs,
                               StatevectorEstimator().run(pubs).result()[0].data.evs, atol=1e-10, rtol=0)

    empty, flipped = QuantumCircuit(2), QuantumCircuit(2)
    flipped.x(0)
    for circuit in (empty, flipped):
        for label in ("II", "ZI", "IZ"):
            got = float(est.run([(circuit, SparsePauliOp(label))]).result()[0].data.evs)
            assert got == (-1.0 if circuit is flipped and label == "IZ" else 1.0), (label, got)

    tagged = QuantumCircuit(2)
    tagged.metadata = {"a": 1}
    result = est.run([(empty, "ZZ"), (tagged, "ZZ")], precision=0.1).result()
    assert len(result) == 2 and result.metadata == {"version": 2}
    for pub_result, circuit in zip(result, (empty, tagged)):
        assert pub_result.metadata["target_precision"] == 0.1
        assert pub_result.metadata["circuit_metadata"] == circuit.metadata


@pytest.mark.parametrize("pubs, precision, cause", [
    (lambda qc1, qc2, op1, op2: [(qc1, op2)], None, "number of qubits of the circuit"),
    (lambda qc1, qc2, op1, op2: [(qc1, op1, [[1e4]])], None, "inconsistent with last dimension"),
    (lambda qc1, qc2, op1, op2: [(qc2, op2, [[1, 2]])], None, "inconsistent with last dimension"),
    (lambda qc1, qc2, op1, op2: [(qc1, [op1, op2], [[1]])], None, "number of qubits must be the same"),
    (lambda qc1, qc2, op1, op2: [(qc1, op1)], -1, "precision must be non-negative"),
    (lambda qc1, qc2, op1, op2: [(qc1, 1j * op1)], 0.1, "not Hermitian"),
    (lambda qc1, qc2, op1, op2: (qc1, op1), None, "invalid Estimator pub-like"),
])
def test_qiskits_bad_pubs_raise_value_errors_naming_the_cause(pubs, precision, cause):
    """Property: the bad pubs of Qiskit's test_run_errors raise ValueErrors, each naming its cause."""
    qc1, qc2 = QuantumCircuit(1), QuantumCircuit(2)
    op1, op2 = SparsePauliOp("I"), SparsePauliOp("II")
    with pytest.raises(ValueError, match=cause):
        pp.Estimator().run(pubs(qc1, qc2, op1, op2), precision=precision).result()
