"""Model Hamiltonians (pauliprop/models/hamiltonians.py): each equals its textbook matrix."""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np
import pytest

import pauliprop as pp
from pauliprop.models import hamiltonians as H

I2 = np.eye(2)
PAULI = {"X": np.array([[0, 1], [1, 0]]), "Y": np.array([[0, -1j], [1j, 0]]), "Z": np.diag([1.0, -1.0])}


def op(n, sites):
    """The n-qubit operator with PAULI[p] on qubit q for (q, p) in sites (qubit q = bit q: little-endian)."""
    mats = [I2] * n
    for q, p in sites:
        mats[q] = PAULI[p]
    return reduce(np.kron, mats[::-1])


@pytest.mark.parametrize("periodic", [False, True])
def test_tfim_is_minus_j_zz_minus_h_x(periodic):
    n, j, h = 5, 0.7, 1.3
    edges = H.chain(n, periodic)
    want = sum(-j * op(n, [(a, "Z"), (b, "Z")]) for a, b in edges) + sum(-h * op(n, [(q, "X")]) for q in range(n))
    np.testing.assert_allclose(H.tfim(n, j, h, periodic=periodic).to_matrix(), want, atol=1e-12)
    assert len(edges) == (n if periodic else n - 1)


def test_heisenberg_and_xxz_are_their_sums_and_conserve_magnetisation():
    n, edges = 4, [(0, 2), (1, 3), (2, 3)]
    jx, jy, jz, h = 0.3, -0.4, 1.1, 0.25
    want = sum(c * op(n, [(a, p), (b, p)]) for a, b in edges for p, c in (("X", jx), ("Y", jy), ("Z", jz)))
    want = want + sum(h * op(n, [(q, "Z")]) for q in range(n))
    np.testing.assert_allclose(H.heisenberg(n, jx, jy, jz, h, edges=edges).to_matrix(), want, atol=1e-12)
    m = H.xxz(n, delta=0.6, j=0.9, h=0.2, periodic=True).to_matrix()
    np.testing.assert_allclose(m, H.heisenberg(n, 0.9, 0.9, 0.54, 0.2, periodic=True).to_matrix(), atol=1e-12)
    total_z = sum(op(n, [(q, "Z")]) for q in range(n))
    np.testing.assert_allclose(m @ total_z, total_z @ m, atol=1e-12)  # XXZ conserves sum Z


def test_maxcut_is_diagonal_and_counts_the_cut_weight_of_every_bitstring():
    rng = np.random.default_rng(0)
    n = 6
    edges = [e for e in itertools.combinations(range(n), 2) if rng.random() < 0.5]
    w = rng.uniform(0.5, 2.0, len(edges))
    m = H.maxcut(edges, n, w).to_matrix()
    assert np.allclose(m, np.diag(np.diag(m)))
    for z in range(2**n):
        bit = [(z >> q) & 1 for q in range(n)]
        assert abs(m[z, z].real - sum(wi for (a, b), wi in zip(edges, w) if bit[a] != bit[b])) < 1e-12
    assert H.maxcut([(0, 3), (1, 2)]).num_qubits == 4  # default: 1 + the largest qubit


def test_from_openfermion_terms_equal_the_sparse_list():
    terms = {((0, "X"), (3, "Z")): 0.5, ((1, "Y"),): -0.25, (): 1.5}
    got = H.from_openfermion(terms)
    want = pp.PauliSum.from_list([("XZ", [0, 3], 0.5), ("Y", [1], -0.25), ("", [], 1.5)], 4)
    assert got.num_qubits == 4 and got.to_dict() == want.to_dict()

    class QubitOperator:  # OpenFermion's type is duck-typed: anything with .terms
        def __init__(self, t):
            self.terms = t

    assert H.from_openfermion(QubitOperator(terms), num_qubits=6).to_dict() == \
        pp.PauliSum.from_list(want.to_list(), 6).to_dict()


@pytest.mark.parametrize("call, message", [
    (lambda: H.tfim(3, edges=[(0, 3)]), "edge 0: qubit 3 out of range for 3 qubits"),
    (lambda: H.heisenberg(3, edges=[(1, 1)]), "edge 0: \\(1, 1\\) joins a qubit to itself"),
    (lambda: H.tfim(3, edges=[(0,)]), "edge 0: expected a pair of qubits"),
    (lambda: H.maxcut([(0, 1)], weights=[1.0, 2.0]), "2 weights for 1 edges"),
    (lambda: H.maxcut([]), "no edges and no num_qubits"),
    (lambda: H.from_openfermion({((0, "X"),): 1j}), "term 0: coefficient 1j is not real"),
    (lambda: H.from_openfermion({((0, "Q"),): 1.0}), "'Q' is not a Pauli letter"),
    (lambda: H.from_openfermion([1, 2]), "expected a QubitOperator or a dict"),
    (lambda: H.chain(0), "num_qubits must be a positive int"),
])
def test_bad_input_names_the_cause(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
