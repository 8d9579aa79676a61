"""Packed Pauli words (pauliprop/algebra/words.py): the bit algebra agrees with dense matrix products."""

from __future__ import annotations

from itertools import product

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pauliprop.algebra import words as W

from .. import _reference as R


def _pack_labels(labels, n, sites=None):
    sites = list(range(n)) if sites is None else sites
    return W.pack([{sites[q]: ch for q, ch in enumerate(lab) if ch != "I"} for lab in labels],
                  max(sites) + 1 if sites else n)


def _dense_relation(g: str, p: str):
    """(anticommute?, R label, s) with i G P = s R when they anticommute, from dense matrices."""
    gm, pm = R.pauli_dense(g), R.pauli_dense(p)
    anti = np.allclose(gm @ pm, -pm @ gm)
    if not anti:
        assert np.allclose(gm @ pm, pm @ gm)
        return False, None, None
    lab, s = R._single_pauli(1j * gm @ pm, len(g))
    return True, lab, s


_anticommutes = jax.jit(W.anticommutes)
_product_sign = jax.jit(W.product_sign)


def _check_pairs(gs, ps, n, sites=None):
    """Vectorised check of anticommutes/product_sign for pairs of labels, packed at `sites`."""
    total = (max(sites) + 1) if sites else n
    gx, gz = _pack_labels(gs, n, sites)
    px, pz = _pack_labels(ps, n, sites)
    anti = np.asarray(_anticommutes(jnp.asarray(px), jnp.asarray(pz), jnp.asarray(gx), jnp.asarray(gz)))
    sign = np.asarray(_product_sign(jnp.asarray(px), jnp.asarray(pz), jnp.asarray(gx), jnp.asarray(gz)))
    rlabels = W.labels_of(px ^ gx, pz ^ gz, total)
    for i, (g, p) in enumerate(zip(gs, ps)):
        want_anti, r, s = _dense_relation(g, p)
        assert bool(anti[i]) == want_anti, (g, p)
        if want_anti:
            got_r = "".join(rlabels[i][q] for q in (sites or range(n)))
            assert got_r == r, (g, p)  # R = G xor P
            assert sign[i] == s, (g, p, sign[i], s)


def test_all_pairs_on_two_qubits():
    labels = ["".join(t) for t in product("IXYZ", repeat=2)]
    pairs = list(product(labels, labels))
    _check_pairs([g for g, _ in pairs], [p for _, p in pairs], 2)


@settings(max_examples=30)
@given(st.integers(1, 4).flatmap(lambda n: st.lists(
    st.tuples(st.text("IXYZ", min_size=n, max_size=n), st.text("IXYZ", min_size=n, max_size=n)),
    min_size=16, max_size=16)))
def test_anticommutation_and_product_sign_match_dense_products(pairs):
    n = len(pairs[0][0])
    _check_pairs([g for g, _ in pairs], [p for _, p in pairs], n)


@settings(max_examples=20)
@given(st.lists(st.tuples(st.text("IXYZ", min_size=4, max_size=4), st.text("IXYZ", min_size=4, max_size=4)),
                min_size=16, max_size=16), st.permutations([0, 31, 32, 63, 64, 95, 96, 126]))
def test_algebra_across_lanes(pairs, sites):
    """The same 4-qubit relations with the qubits spread over four 32-bit lanes of a 127-qubit word."""
    _check_pairs([g for g, _ in pairs], [p for _, p in pairs], 4, list(sites[:4]))


@settings(max_examples=30)
@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.lists(
    st.dictionaries(st.integers(0, n - 1), st.sampled_from("XYZ"), max_size=10), min_size=1, max_size=5))))
def test_pack_unpack_labels_weight(n_words):
    n, words = n_words
    x, z = W.pack(words, n)
    assert x.shape == (len(words), W.num_lanes(n)) and x.dtype == np.uint32
    labels = W.labels_of(x, z, n)
    for lab, word in zip(labels, words):
        assert lab == "".join(word.get(q, "I") for q in range(n))
    np.testing.assert_array_equal(np.asarray(W.weight(jnp.asarray(x), jnp.asarray(z))), [len(w) for w in words])
    xb = W.unpack_bits(x, n)
    assert xb.shape == (len(words), n)
    for row, word in zip(xb, words):
        assert [q for q in range(n) if row[q]] == sorted(q for q, ch in word.items() if ch in "XY")


@settings(max_examples=20)
@given(st.integers(1, 130).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))),
       st.lists(st.integers(0, 2**32 - 1), min_size=15, max_size=15), st.lists(st.integers(0, 1), min_size=3, max_size=3))
def test_get_and_set_site(nq, lane_values, bits):
    n, q = nq
    w = W.num_lanes(n)
    words = jnp.asarray(np.array(lane_values[: 3 * w], dtype=np.uint32).reshape(3, w))
    got = np.asarray(W.get_site(words, jnp.int32(q)))
    want = (np.asarray(words)[:, q // 32] >> (q % 32)) & 1
    np.testing.assert_array_equal(got, want)
    new = np.asarray(W.set_site(words, jnp.int32(q), jnp.asarray(bits, dtype=jnp.uint32)))
    np.testing.assert_array_equal(np.asarray(W.get_site(jnp.asarray(new), jnp.int32(q))), bits)
    mask = np.ones_like(new)
    mask[:, q // 32] = ~np.uint32(1 << (q % 32))
    np.testing.assert_array_equal(new & mask, np.asarray(words) & mask)  # no other bit changes


def test_fingerprints_are_functions_of_the_word():
    labels = ["".join(t) for t in product("IXYZ", repeat=3)]
    x, z = _pack_labels(labels + labels[::-1], 3)
    h1, h2 = (np.asarray(h) for h in W.fingerprint(jnp.asarray(x), jnp.asarray(z)))
    assert h1.dtype == np.uint32 and h2.dtype == np.uint32
    np.testing.assert_array_equal(h1[:64], h1[64:][::-1])
    np.testing.assert_array_equal(h2[:64], h2[64:][::-1])


def test_unpack_bits_of_no_words():
    assert W.unpack_bits(np.zeros((0, 2), np.uint32), 40).shape == (0, 40)
    assert W.labels_of(np.zeros((0, 2), np.uint32), np.zeros((0, 2), np.uint32), 40) == []


@pytest.mark.parametrize("cpu", [True, False])
@pytest.mark.parametrize("lanes", [1, 4, 33])
def test_xor_lanes_folds_the_lanes(monkeypatch, cpu, lanes):
    """The XOR of a word's lanes, as the CPUs' reduction and as the GPUs' elementwise fold."""
    monkeypatch.setattr(W, "on_cpu", lambda: cpu)
    a = np.random.default_rng(lanes).integers(0, 2**32, (3, 5, lanes), dtype=np.uint32)
    np.testing.assert_array_equal(np.asarray(W.xor_lanes(jnp.asarray(a))), np.bitwise_xor.reduce(a, axis=-1))


@settings(max_examples=40)
@given(st.integers(1, 4).flatmap(lambda w: st.tuples(
    st.lists(st.lists(st.integers(0, 2**32 - 1), min_size=w, max_size=w), min_size=1, max_size=20),
    st.integers(0, 32 * w))))
def test_nth_set_bit_is_the_jth_set_bit(case):
    rows, j = case
    rows = np.array(rows, np.uint32)
    index, found = (np.asarray(a) for a in W.nth_set_bit(jnp.asarray(rows), jnp.int32(j)))
    for r, row in enumerate(rows):
        bits = [32 * lane + b for lane, word in enumerate(row.tolist()) for b in range(32) if (word >> b) & 1]
        assert bool(found[r]) == (j < len(bits))
        if j < len(bits):
            assert int(index[r]) == bits[j]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200), st.integers(0, 2**32 - 1))
def test_moved_renumbers_a_subset_of_qubits_and_back(n, seed):
    """moved(words, qubits, 0..m-1) holds qubit qubits[k] as qubit k and nothing else; moving back restores
    the words on those qubits and clears the rest (across lane boundaries)."""
    rng = np.random.default_rng(seed)
    lanes = W.num_lanes(n)
    words = rng.integers(0, 2**32, size=(7, lanes), dtype=np.uint64).astype(np.uint32)
    qubits = np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False))
    m = len(qubits)
    small = W.moved(words, qubits, np.arange(m), W.num_lanes(m))
    assert small.shape == (7, W.num_lanes(m))
    np.testing.assert_array_equal(W.unpack_bits(small, 32 * W.num_lanes(m)),
                                  np.pad(W.unpack_bits(words, n)[:, qubits], ((0, 0), (0, 32 * W.num_lanes(m) - m))))
    back = W.unpack_bits(W.moved(small, np.arange(m), qubits, lanes), n)
    want = np.zeros_like(back)
    want[:, qubits] = W.unpack_bits(words, n)[:, qubits]
    np.testing.assert_array_equal(back, want)
