"""Overlaps with product states (pauliprop/algebra/overlap.py) equal dense <psi|P|psi> = tr(rho P)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.algebra.overlap import bloch_vectors as bloch_of_state, word_overlaps

from .. import _reference as R
from .._strategies import bloch_vectors

eigen_states = lambda n: st.one_of(st.sampled_from(list("01+-rl")), st.text("01+-rl", min_size=n, max_size=n))


def _sum(labels, coeffs, n):
    return pp.PauliSum.from_list([(lab, list(range(n)), c) for lab, c in zip(labels, coeffs)], n)


@settings(max_examples=40)
@given(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(st.text("IXYZ", min_size=n, max_size=n), min_size=12, max_size=12), eigen_states(n))))
def test_eigenstate_masks_equal_dense_expectations(labels_state):
    labels, state = labels_state
    n = len(labels[0])
    ps = _sum(labels, [1.0] * len(labels), n)
    got = np.asarray(word_overlaps(jnp.asarray(ps.x), jnp.asarray(ps.z), state, n))
    psi = R.initial_ket(state, n)
    want = [np.real(psi.conj() @ R.pauli_dense(lab) @ psi) for lab in labels]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert set(np.round(got, 12)) <= {-1.0, 0.0, 1.0}


@settings(max_examples=40)
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.text("IXYZ", min_size=n, max_size=n), min_size=8, max_size=8), bloch_vectors(n, mixed=True))))
def test_bloch_vector_states_equal_dense_traces(labels_bloch):
    labels, bloch = labels_bloch
    n = len(labels[0])
    coeffs = np.linspace(-1, 1.5, len(labels))
    ps = _sum(labels, coeffs, n)
    rho = R.initial_density(bloch, n)
    want = sum(c * np.real(np.trace(rho @ R.pauli_dense(lab))) for lab, c in zip(labels, coeffs))
    assert abs(float(pp.overlap(ps, bloch)) - want) < 1e-12


@settings(max_examples=20)
@given(st.lists(st.text("IXYZ", min_size=6, max_size=6), min_size=6, max_size=6), st.text("01+-rl", min_size=6, max_size=6),
       bloch_vectors(6, mixed=True))
def test_overlaps_across_lanes(labels, chars, bloch):
    """Words on sites 0, 31, 32, 63, 64, 99 of a 100-qubit register: the product of single-site factors."""
    n, sites = 100, [0, 31, 32, 63, 64, 99]
    ps = pp.PauliSum.from_list([(lab, sites, 1.0) for lab in labels], n)
    state = ["0"] * n
    full_bloch = np.tile([0.0, 0.0, 1.0], (n, 1))
    for q, s in enumerate(sites):
        state[s] = chars[q]
        full_bloch[s] = bloch[q]
    bloch_of = {"0": (0, 0, 1), "1": (0, 0, -1), "+": (1, 0, 0), "-": (-1, 0, 0), "r": (0, 1, 0), "l": (0, -1, 0)}
    index = {"X": 0, "Y": 1, "Z": 2}
    for st_arg, vec in (("".join(state), [bloch_of[ch] for ch in chars]), (full_bloch, bloch)):
        got = np.asarray(word_overlaps(jnp.asarray(ps.x), jnp.asarray(ps.z), st_arg, n))
        want = [np.prod([vec[q][index[ch]] for q, ch in enumerate(lab) if ch != "I"]) for lab in labels]
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_documented_rules():
    ps = pp.PauliSum.from_labels({"ZZ": 1.0, "XI": 10.0, "IY": 100.0, "II": 1000.0})
    assert float(pp.overlap(ps, "0")) == 1001.0  # <0|P|0> = 1 iff no X/Y
    assert float(pp.overlap(ps, "+")) == 1010.0  # <+|P|+> = 1 iff no Y/Z
    assert float(pp.overlap(ps, "10")) == 999.0  # bitstrings add a sign per Z on a 1
    assert float(pp.overlap(ps, "rl")) == 900.0
    assert float(pp.overlap(ps, "-r")) == 1090.0


def test_single_character_applies_to_every_qubit_and_whitespace_is_ignored():
    ps = pp.PauliSum.from_labels({"XXX": 1.0})
    assert float(pp.overlap(ps, "+")) == float(pp.overlap(ps, "+++")) == float(pp.overlap(ps, " +++ ")) == 1.0
    assert float(pp.overlap(ps, "-")) == -1.0


def test_repeated_terms_add():
    ps = pp.PauliSum.from_list([("Z", [0], 0.5), ("Z", [0], 0.25), ("X", [1], 3.0)], 2)
    assert float(pp.overlap(ps, "1+")) == -0.75 + 3.0


@pytest.mark.parametrize("state, cause", [
    ("0x", r"unsupported state character\(s\) \['x'\]"), ("012", "3 characters but the circuit has 2 qubits"),
    (np.zeros((3, 3)), r"expected a string or an \(2, 3\) array"), (np.array([[0, 0, 1.5], [0, 0, 1]]), "norm <= 1"),
    (np.array([[0, 0, np.nan], [0, 0, 1]]), "finite"), (["0", "1"], "expected a string"),
])
def test_bad_states_raise_naming_the_cause(state, cause):
    with pytest.raises(ValueError, match=cause):
        pp.overlap(pp.PauliSum.from_labels({"ZZ": 1.0}), state)


def test_bloch_vectors_of_strings():
    np.testing.assert_array_equal(bloch_of_state("0+r", 3), [[0, 0, 1], [1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(bloch_of_state("1", 2), [[0, 0, -1], [0, 0, -1]])
    np.testing.assert_array_equal(bloch_of_state(" -l ", 2), [[-1, 0, 0], [0, -1, 0]])


def test_overlap_is_differentiable_in_the_coefficients_under_jit():
    ps = pp.PauliSum.from_labels({"ZX": 0.3, "XX": -2.0, "YZ": 1.0})
    bloch = np.array([[0.1, 0.2, 0.3], [0.5, -0.5, 0.0]])
    f = jax.jit(lambda c: pp.overlap(pp.PauliSum(ps.x, ps.z, c, 2), bloch))
    g = np.asarray(jax.grad(f)(ps.coeffs))
    np.testing.assert_allclose(g, [0.3 * 0.5, 0.1 * 0.5, 0.2 * 0.0], atol=1e-15)
