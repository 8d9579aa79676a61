"""PauliSum (pauliprop/algebra/paulisum.py): construction and export round trips, label orders (Stim vs
Qiskit), dense matrices, large registers, and the pytree."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp

from .. import _reference as R

SIZES = [1, 31, 32, 33, 63, 64, 65, 127, 1000]
coeff = st.one_of(st.floats(-10, 10).filter(lambda v: v != 0), st.sampled_from([1.0, -0.5, 1e-300, 1e300]))


@st.composite
def sparse_terms(draw, n, max_terms=6):
    """Qiskit sparse-list terms with non-identity letters on distinct qubits (possibly repeated words)."""
    out = []
    for _ in range(draw(st.integers(0, max_terms))):
        qubits = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=min(n, 6)))
        label = draw(st.text("XYZ", min_size=len(qubits), max_size=len(qubits)))
        out.append((label, qubits, draw(coeff)))
    return out


def _full_label(label, qubits, n):
    chars = ["I"] * n
    for ch, q in zip(label, qubits):
        chars[q] = ch
    return "".join(chars)


def _dict_of(terms, n):
    d = {}
    for label, qubits, c in terms:
        lab = _full_label(label, qubits, n)
        d[lab] = d.get(lab, 0.0) + c
    return {k: v for k, v in d.items() if v != 0}


# ---- round trips -----------------------------------------------------------------------------------

@settings(max_examples=40)
@given(st.sampled_from(SIZES).flatmap(lambda n: st.tuples(st.just(n), sparse_terms(n))))
def test_from_list_to_list_round_trip(n_terms):
    n, terms = n_terms
    ps = pp.PauliSum.from_list(terms, n)
    assert len(ps) == len(terms) and ps.num_qubits == n and ps.num_lanes == math.ceil(n / 32)
    out = ps.to_list()
    assert len(out) == len(terms)
    for (label, qubits, c), (olabel, oqubits, oc) in zip(terms, out):
        order = np.argsort(qubits)
        assert olabel == "".join(label[i] for i in order) and oqubits == sorted(qubits) and oc == c
    again = pp.PauliSum.from_list(out, n)
    np.testing.assert_array_equal(np.asarray(again.x), np.asarray(ps.x))
    np.testing.assert_array_equal(np.asarray(again.z), np.asarray(ps.z))
    assert ps.to_dict() == _dict_of(terms, n)


@settings(max_examples=40)
@given(st.integers(1, 12).flatmap(
    lambda n: st.dictionaries(st.text("IXYZ", min_size=n, max_size=n), coeff, max_size=8).filter(bool)))
def test_from_labels_to_dict_round_trip(d):
    ps = pp.PauliSum.from_labels(d)
    assert ps.to_dict() == d
    assert pp.PauliSum.from_labels(ps.to_dict()).to_dict() == d
    assert ps.labels() == list(d)


@pytest.mark.parametrize("n", SIZES)
def test_words_on_any_register_size_round_trip(n):
    rng = np.random.default_rng(n)
    sites = sorted({0, n - 1, *(q for q in (31, 32, 33, 63, 64, 65, 126, 127, 999) if q < n)})
    terms = []
    for _ in range(5):
        qs = [int(q) for q in rng.permutation(sites)[: rng.integers(1, len(sites) + 1)]]
        terms.append(("".join(rng.choice(list("XYZ"), len(qs))), qs, float(rng.normal())))
    ps = pp.PauliSum.from_list(terms, n)
    assert ps.x.shape == (5, math.ceil(n / 32)) and ps.x.dtype == jnp.uint32
    labels = ps.labels()
    assert all(len(lab) == n for lab in labels)
    for lab, (label, qubits, _) in zip(labels, terms):
        assert lab == _full_label(label, qubits, n)
    assert pp.PauliSum.from_labels(ps.to_dict()).to_dict() == ps.to_dict()
    # the highest qubit is bit (n-1) % 32 of the last lane
    top = pp.PauliSum.from_list([("Y", [n - 1], 1.0)], n)
    assert int(top.x[0, -1]) == int(top.z[0, -1]) == 1 << ((n - 1) % 32)
    with pytest.raises(ValueError, match=f"qubit {n} out of range for {n} qubits"):
        pp.PauliSum.from_list([("X", [n], 1.0)], n)


# ---- label order -------------------------------------------------------------------------------------------

def test_stim_label_order():
    ps = pp.PauliSum.from_labels({"XIZ": 0.5})
    assert ps.to_list() == [("XZ", [0, 2], 0.5)]
    assert int(ps.x[0, 0]) == 0b001 and int(ps.z[0, 0]) == 0b100  # X on qubit 0, Z on qubit 2
    # X on qubit 0 flips bit 0 of the basis index
    m = pp.PauliSum.from_labels({"XII": 1.0}).to_matrix()
    assert np.allclose(m @ np.eye(8)[0], np.eye(8)[1])


def test_qiskit_labels_are_reversed():
    from qiskit.quantum_info import SparsePauliOp

    ps = pp.PauliSum.from_labels({"XIZ": 0.5, "YYI": -1.0})
    assert ps.to_qiskit() == SparsePauliOp(["ZIX", "IYY"], [0.5, -1.0])
    back = pp.PauliSum.from_qiskit(SparsePauliOp(["ZIX", "IYY"], [0.5, -1.0]))
    assert back.to_dict() == {"XIZ": 0.5, "YYI": -1.0}


@settings(max_examples=30)
@given(st.integers(1, 5).flatmap(
    lambda n: st.dictionaries(st.text("IXYZ", min_size=n, max_size=n), st.floats(-2, 2).filter(bool),
                              min_size=1, max_size=6)))
def test_qiskit_round_trip_and_matrices(d):
    ps = pp.PauliSum.from_labels(d)
    op = ps.to_qiskit()
    assert pp.PauliSum.from_qiskit(op).to_dict() == pytest.approx(d)
    # Qiskit's matrices are little-endian too: the dense operators agree
    np.testing.assert_allclose(op.to_matrix(), ps.to_matrix(), atol=1e-12)


def test_from_stim():
    stim = pytest.importorskip("stim")
    ps = pp.PauliSum.from_stim(stim.PauliString("-XYZ"))
    assert ps.to_dict() == {"XYZ": -1.0}
    assert pp.PauliSum.from_stim(stim.PauliString("+_X_Z"), coeff=0.5).to_dict() == {"IXIZ": 0.5}
    with pytest.raises(ValueError, match="not real"):
        pp.PauliSum.from_stim(stim.PauliString("iX"))


@settings(max_examples=30)
@given(st.text("IXYZ", min_size=1, max_size=5), st.booleans())
def test_matrices_agree_with_stim(label, negative):
    stim = pytest.importorskip("stim")
    s = stim.PauliString(("-" if negative else "+") + label.replace("I", "_"))
    ps = pp.PauliSum.from_stim(s)
    np.testing.assert_allclose(ps.to_matrix(), s.to_unitary_matrix(endian="little"), atol=1e-12)


@settings(max_examples=30)
@given(st.integers(1, 4).flatmap(
    lambda n: st.dictionaries(st.text("IXYZ", min_size=n, max_size=n), st.floats(-2, 2), min_size=1, max_size=5)))
def test_to_matrix_is_the_kronecker_product(d):
    expected = sum(c * R.pauli_dense(lab) for lab, c in d.items())  # qubit 0 = rightmost factor
    np.testing.assert_allclose(pp.PauliSum.from_labels(d).to_matrix(), expected, atol=1e-12)


# ---- errors ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, cause", [
    (lambda: pp.PauliSum.from_list([("X", [0], 1j)], 1), r"term 0: coefficient 1j is not real"),
    (lambda: pp.PauliSum.from_list([("X", [0], 1.0), ("Z", [0], 0.5 + 1e-3j)], 1), r"term 1: coefficient .* not real"),
    (lambda: pp.PauliSum.from_labels({"XZ": 1 + 2j}), "not real"),
    (lambda: pp.PauliSum.from_list([("XZ", [0], 1.0)], 2), "label 'XZ' has 2 letters but 1 qubits"),
    (lambda: pp.PauliSum.from_list([("XZ", [1, 1], 1.0)], 2), r"repeated qubit in \[1, 1\]"),
    (lambda: pp.PauliSum.from_list([("XA", [0, 1], 1.0)], 2), "'A' is not a Pauli letter"),
    (lambda: pp.PauliSum.from_list([("X", [2], 1.0)], 2), "qubit 2 out of range for 2 qubits"),
    (lambda: pp.PauliSum.from_list([("X", [-1], 1.0)], 2), "qubit -1 out of range"),
    (lambda: pp.PauliSum.from_list([("X", [0])], 2), r"term 0: expected \(label, qubits, coeff\)"),
    (lambda: pp.PauliSum.from_list([], 0), "num_qubits must be a positive int"),
    (lambda: pp.PauliSum.from_labels({"XZ": 1.0, "X": 1.0}), r"labels have different lengths \[1, 2\]"),
    (lambda: pp.PauliSum.from_labels({"XZ": 1.0}, 3), "label 'XZ' has 2 letters, expected 3"),
    (lambda: pp.PauliSum.from_labels({}), "no labels and no num_qubits"),
])
def test_bad_input_raises_naming_the_cause(make, cause):
    with pytest.raises(ValueError, match=cause):
        make()


def test_complex_qiskit_coefficients_raise():
    from qiskit.quantum_info import SparsePauliOp

    with pytest.raises(ValueError, match="not real"):
        pp.PauliSum.from_qiskit(SparsePauliOp(["XZ"], [1j]))


# ---- sums, products, simplify ----------------------------------------------------------------------------

def test_repeats_and_zeros_are_plain_sums():
    ps = pp.PauliSum.from_list([("X", [0], 1.0), ("X", [0], 0.5), ("Z", [1], 0.0), ("Z", [1], -2.0)], 2)
    assert len(ps) == 4
    assert ps.to_dict() == {"XI": 1.5, "IZ": -2.0}
    s = ps.simplify()
    assert len(s) == 2 and s.to_dict() == ps.to_dict()
    assert ps.simplify(atol=1.6).to_dict() == {"IZ": -2.0}
    assert len(ps.simplify(atol=10)) == 0
    np.testing.assert_allclose(ps.to_matrix(), s.to_matrix())


def test_addition_and_scaling():
    a = pp.PauliSum.from_labels({"XI": 1.0})
    b = pp.PauliSum.from_labels({"XI": 2.0, "ZZ": -1.0})
    assert (a + b).to_dict() == {"XI": 3.0, "ZZ": -1.0}
    assert (2 * b).to_dict() == {"XI": 4.0, "ZZ": -2.0} == (b * 2).to_dict()
    with pytest.raises(ValueError, match="cannot add sums on 2 and 3 qubits"):
        a + pp.PauliSum.from_labels({"XII": 1.0})
    assert "XI" in repr(a)


# ---- pytree --------------------------------------------------------------------------------------------------

def test_is_a_pytree():
    ps = pp.PauliSum.from_labels({"XIZ": 0.5, "YYI": -1.0})
    leaves, tree = jax.tree_util.tree_flatten(ps)
    assert len(leaves) == 3
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert isinstance(back, pp.PauliSum) and back.num_qubits == 3 and back.to_dict() == ps.to_dict()
    doubled = jax.tree_util.tree_map(lambda a: a * 2 if a.dtype.kind == "f" else a, ps)
    assert doubled.to_dict() == {"XIZ": 1.0, "YYI": -2.0}


def test_jit_through_a_paulisum():
    ps = pp.PauliSum.from_labels({"ZIZ": 0.5, "XII": 2.0, "IIZ": -1.0})

    @jax.jit
    def f(s):
        assert isinstance(s, pp.PauliSum) and s.num_qubits == 3  # static metadata survives the trace
        assert "traced" in repr(s)
        return 3.0 * s, pp.overlap(s, "0")

    out, val = f(ps)
    assert isinstance(out, pp.PauliSum) and out.num_qubits == 3
    assert out.to_dict() == {"ZIZ": 1.5, "XII": 6.0, "IIZ": -3.0}
    assert abs(float(val) - (0.5 - 1.0)) < 1e-12
    g = jax.grad(lambda c: pp.overlap(pp.PauliSum(ps.x, ps.z, c, 3), "1"))(ps.coeffs)
    np.testing.assert_allclose(np.asarray(g), [1.0, 0.0, -1.0])


def test_empty_sum():
    e = pp.PauliSum.from_list([], 3)
    assert len(e) == 0 and e.to_list() == [] and e.to_dict() == {} and e.labels() == []
    assert np.all(e.to_matrix() == 0)
    assert "0" in repr(e)
    assert len(e.to_qiskit()) == 1  # Qiskit's zero operator
    assert float(pp.overlap(e, "+")) == 0.0


@st.composite
def _written_sums(draw):
    """(text, the sparse list it means, num_qubits): terms written as a user would type them."""
    n = draw(st.integers(1, 40))
    terms, parts = [], []
    for i in range(draw(st.integers(1, 5))):
        qubits = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=4))
        letters = "".join(draw(st.sampled_from("XYZ")) for _ in qubits)
        coeff = draw(st.one_of(st.just(1.0), st.floats(0.001, 100.0), st.integers(1, 9).map(float)))
        sign = draw(st.sampled_from([1.0, -1.0]))
        times = draw(st.sampled_from([" ", "*", " * "]))
        factors = times.join(f"{ch}{q}" for ch, q in zip(letters, qubits))
        body = factors if coeff == 1.0 and factors else (f"{coeff!r}{times}{factors}" if factors else repr(coeff))
        parts.append(("- " if sign < 0 else ("+ " if i else "")) + body)
        terms.append((letters, qubits, sign * coeff))
    return " ".join(parts), terms, n


@given(_written_sums())
def test_a_written_sum_reads_as_its_terms(case):
    text, terms, n = case
    got = pp.PauliSum.from_text(text, n)
    want = pp.PauliSum.from_list(terms, n)
    assert got.to_list() == want.to_list()


@pytest.mark.parametrize("text, cause", [("Z0 +", "the text ends"), ("Z0 Q1", "unexpected 'Q' at character 4"),
                                         ("Z0 Z0", "qubit 0 appears twice"), ("X7", "qubit 7 is out of range"),
                                         ("", "expected a term"), ("2 3", "unexpected '3'")])
def test_a_malformed_written_sum_names_the_cause(text, cause):
    with pytest.raises(ValueError, match=cause):
        pp.PauliSum.from_text(text, 4)
