"""Duplicate merging and compaction (pauliprop/merge.py).

* full_merge sums the coefficients of equal words (smallest sine count), drops exact zeros, compacts the
  survivors to the front, and accounts for anything that does not fit.
* insert_merge (the incremental path for rotations on a key-sorted buffer) gives the same terms as
  splitting every word and running full_merge.
* Neither depends on hash luck: with a deliberately weak fingerprint every result stays exact.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop import merge as M
from pauliprop import words as W

NO_TRUNCATION = pp.Truncation()
SLOTS = 64  # candidate slots in the unit tests (one compile per shape)
# The engine always merges 2 * capacity candidates (the buffer and one new word per slot); on CPUs the sort
# key reserves index_bits(capacity) low bits for the slot, so the tests keep capacity >= SLOTS / 2.


def _jitted():
    """Fresh jits (a fresh trace picks up a monkeypatched fingerprint)."""
    full = jax.jit(M.full_merge, static_argnames=("truncation", "capacity"))
    insert = jax.jit(M.insert_merge, static_argnames=("truncation", "capacity", "room"))
    return full, insert


_full, _insert = _jitted()


@st.composite
def candidates(draw, num_qubits=40, pool=12):
    """SLOTS candidate terms drawn from a small pool of words (so duplicates are common), some dead."""
    words = draw(st.lists(st.dictionaries(st.integers(0, num_qubits - 1), st.sampled_from("XYZ"), max_size=4),
                          min_size=pool, max_size=pool))
    picks = draw(st.lists(st.integers(0, pool - 1), min_size=SLOTS, max_size=SLOTS))
    # nothing near the subnormal range: XLA:CPU treats subnormals as 0, so they would vanish at a merge
    coeffs = draw(st.lists(st.sampled_from([0.5, -0.5, 1.0, -0.25]) | st.floats(-1, 1).filter(
        lambda v: v == 0 or abs(v) > 1e-100), min_size=SLOTS, max_size=SLOTS))
    sins = draw(st.lists(st.integers(0, 5), min_size=SLOTS, max_size=SLOTS))
    live = draw(st.lists(st.booleans(), min_size=SLOTS, max_size=SLOTS))
    x, z = W.pack([words[p] for p in picks], num_qubits)
    return x, z, np.array(coeffs), np.array(sins, np.int32), np.array(live), num_qubits


def _reference_merge(x, z, coeffs, sins, live, n):
    d = {}
    for lab, c, s, l in zip(W.labels_of(x, z, n), coeffs, sins, live):
        if l:
            c0, s0 = d.get(lab, (0.0, np.iinfo(np.int32).max))
            d[lab] = (c0 + c, min(s0, int(s)))
    return d


def _terms(out, n):
    x, z, c, s, live = (np.asarray(a) for a in out[:5])
    assert np.array_equal(live, np.arange(len(live)) < live.sum())  # compacted to the front
    assert not np.any(c[~live])  # dead slots carry no coefficient
    labels = W.labels_of(x[live], z[live], n) if live.any() else []
    assert len(set(labels)) == len(labels)  # every word once
    return {lab: (float(cc), int(ss)) for lab, cc, ss in zip(labels, c[live], s[live])}


def _assert_same_terms(got, want, atol=1e-12):
    # a sum that cancels may leave a rounding residue in one summation order and exactly 0 in another
    got = {k: v for k, v in got.items() if abs(v[0]) > atol}
    want = {k: v for k, v in want.items() if abs(v[0]) > atol}
    assert got.keys() == want.keys()
    for k, (c, s) in want.items():
        assert abs(got[k][0] - c) <= atol and got[k][1] == s, (k, got[k], (c, s))


@settings(max_examples=30)
@given(candidates())
def test_full_merge_sums_equal_words(cands):
    x, z, c, s, live, n = cands
    out = _full(jnp.asarray(x), jnp.asarray(z), jnp.asarray(c), jnp.asarray(s), jnp.asarray(live),
                NO_TRUNCATION, SLOTS)
    _assert_same_terms(_terms(out, n), _reference_merge(x, z, c, s, live, n))
    assert not np.asarray(out[-1]).any()  # nothing dropped
    keys, ordered = out[5], out[6]
    if keys is not None:  # x64: the live words come out in increasing key order
        k = np.asarray(keys)[np.asarray(out[4])]
        assert bool(ordered) and np.all(k[1:] > k[:-1])


@settings(max_examples=20)
@given(candidates(pool=60))
def test_full_merge_overflow_keeps_the_largest_and_accounts_the_rest(cands):
    x, z, c, s, live, n = cands
    capacity = SLOTS // 2  # the engine's ratio (buffer + new words)
    live = np.ones_like(live)  # ~40 distinct words out of 60: usually more than fit
    c = np.round(c, 3) + np.arange(SLOTS) * 1e-6  # no ties between distinct merged words
    out = _full(jnp.asarray(x), jnp.asarray(z), jnp.asarray(c), jnp.asarray(s), jnp.asarray(live),
                NO_TRUNCATION, capacity)
    ref = {k: v for k, v in _reference_merge(x, z, c, s, live, n).items() if v[0] != 0}
    ranked = sorted(ref.items(), key=lambda kv: -abs(kv[1][0]))
    kept, lost = dict(ranked[:capacity]), ranked[capacity:]
    _assert_same_terms(_terms(out, n), kept, atol=1e-9)
    dropped = np.asarray(out[-1])
    assert dropped[:4].sum() == 0
    assert abs(dropped[4] - sum(abs(v[0]) for _, v in lost)) < 1e-9


def _split_then_full(x, z, c, s, live, gx, gz, cos, sin, capacity):
    """The reference path for a rotation: split every anticommuting word, then merge everything."""
    ac = live & np.asarray(W.anticommutes(jnp.asarray(x), jnp.asarray(z), jnp.asarray(gx), jnp.asarray(gz)))
    sign = np.asarray(W.product_sign(jnp.asarray(x), jnp.asarray(z), jnp.asarray(gx), jnp.asarray(gz)))
    old = np.where(ac, cos * c, c)
    new = np.where(ac, sin * sign * c, 0)
    cat = np.concatenate
    return _full(jnp.asarray(cat([x, x ^ gx])), jnp.asarray(cat([z, z ^ gz])), jnp.asarray(cat([old, new])),
                 jnp.asarray(cat([s, s + 1])), jnp.asarray(cat([live, ac])), NO_TRUNCATION, capacity)


needs_x64 = pytest.mark.skipif(not M.x64(), reason="the incremental merge runs with jax_enable_x64 only")


@needs_x64
@settings(max_examples=30)
@given(candidates(num_qubits=5, pool=20), st.dictionaries(st.integers(0, 4), st.sampled_from("XYZ"), min_size=1),
       st.floats(-3, 3), st.booleans())
def test_insert_merge_equals_split_and_full_merge(cands, generator, angle, drop_some):
    x, z, c, s, live, n = cands
    capacity = SLOTS
    # a key-sorted buffer, as full_merge leaves it
    bx, bz, bc, bs, blive, bkeys, ordered, _ = _full(jnp.asarray(x), jnp.asarray(z), jnp.asarray(c),
                                                      jnp.asarray(s), jnp.asarray(live), NO_TRUNCATION, capacity)
    assert bool(ordered)
    if drop_some:  # slots dropped in place by a truncation rule stay in order with live = False
        gone = np.asarray(blive) & (np.arange(capacity) % 3 == 0)
        bc = jnp.where(gone, 0, bc)
        blive = blive & ~jnp.asarray(gone)
        bs = jnp.where(gone, np.iinfo(np.int32).max, bs)
    gx, gz = (a[0] for a in W.pack([generator], n))
    cos, sin = np.cos(angle), np.sin(angle)
    ok, res = _insert(bx, bz, bc, bs, blive, bkeys, jnp.asarray(gx), jnp.asarray(gz), cos, sin, NO_TRUNCATION,
                      capacity, 16)
    ref = _split_then_full(*(np.asarray(a) for a in (bx, bz, bc, bs, blive)), gx, gz, cos, sin, capacity)
    n_split = int((np.asarray(blive) & np.asarray(W.anticommutes(bx, bz, jnp.asarray(gx), jnp.asarray(gz)))).sum())
    assert bool(ok) == (n_split <= 16)  # ok unless more words split than there is room (or a hash collides)
    if bool(ok):
        _assert_same_terms(_terms(res, n), {k: v for k, v in _terms(ref, n).items()})
        k = np.asarray(res[5])[np.asarray(res[4])]
        assert np.all(k[1:] > k[:-1])  # still key-sorted for the next rotation
        assert not np.asarray(res[-1]).any()


def _weak_fingerprint(x, z):
    """A fingerprint with almost no entropy: nearly every pair of words collides."""
    h = (W.popcount(x).sum(-1) & 1).astype(jnp.uint32)
    return h, jnp.zeros_like(h)


@settings(max_examples=15)
@given(candidates())
def test_full_merge_is_exact_under_fingerprint_collisions(cands):
    x, z, c, s, live, n = cands
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(W, "fingerprint", _weak_fingerprint)
        full, _ = _jitted()
        out = full(jnp.asarray(x), jnp.asarray(z), jnp.asarray(c), jnp.asarray(s), jnp.asarray(live),
                   NO_TRUNCATION, SLOTS)
        _assert_same_terms(_terms(out, n), _reference_merge(x, z, c, s, live, n))


@needs_x64
@settings(max_examples=15)
@given(candidates(num_qubits=5, pool=20), st.dictionaries(st.integers(0, 4), st.sampled_from("XYZ"), min_size=1),
       st.floats(-3, 3))
def test_insert_merge_reports_collisions(cands, generator, angle):
    """With a weak fingerprint the incremental merge either declines (ok = False) or is still exact."""
    x, z, c, s, live, n = cands
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(W, "fingerprint", _weak_fingerprint)
        full, insert = _jitted()
        bx, bz, bc, bs, blive, bkeys, _, _ = full(jnp.asarray(x), jnp.asarray(z), jnp.asarray(c), jnp.asarray(s),
                                                  jnp.asarray(live), NO_TRUNCATION, SLOTS)
        gx, gz = (a[0] for a in W.pack([generator], n))
        ok, res = insert(bx, bz, bc, bs, blive, bkeys, jnp.asarray(gx), jnp.asarray(gz), np.cos(angle),
                         np.sin(angle), NO_TRUNCATION, SLOTS, 32)
        if bool(ok):
            ref = _split_then_full(*(np.asarray(a) for a in (bx, bz, bc, bs, blive)), gx, gz, np.cos(angle),
                                   np.sin(angle), SLOTS)
            _assert_same_terms(_terms(res, n), _terms(ref, n))


def test_propagation_is_exact_under_fingerprint_collisions(monkeypatch):
    """End to end: a circuit propagated with the weak fingerprint equals the state vector."""
    monkeypatch.setattr(W, "fingerprint", _weak_fingerprint)
    n = 3
    c = pp.Circuit(n)
    for k in range(4):
        c.rx(k % n, 0.3 + k).cx(k % n, (k + 1) % n).rzz(0, 2, pp.Param(0)).ry((k + 2) % n, 0.7 * k + 0.1)
    h = pp.PauliSum.from_labels({"ZZZ": 1.0, "XIY": -0.5, "IZX": 0.25})
    PR = sys.modules["pauliprop.propagate"]  # `pauliprop.propagate` the attribute is the function

    fresh = jax.jit(PR.propagate_buffers, static_argnames=("truncation", "capacity", "kinds_present"))
    monkeypatch.setattr(PR, "_jitted", fresh)  # a fresh trace sees the weak fingerprint
    p = np.array([0.4])
    val = float(pp.expectation(c, h, p, capacity=64))
    assert abs(val - float(pp.expectation(c, h, p, method="statevector"))) < 1e-10


@needs_x64
@settings(max_examples=20)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=100), st.integers(0, 12))
def test_argsort_keys_sorts(keys, nbits):
    keys = np.array(keys, dtype=np.uint64) & ~np.uint64((1 << nbits) - 1)
    perm = np.asarray(M.argsort_keys(jnp.asarray(keys), nbits if len(keys) <= 2**nbits else 0))
    assert sorted(perm.tolist()) == list(range(len(keys)))
    assert np.all(np.diff(keys[perm].astype(np.float64)) >= 0) and np.all(keys[perm][1:] >= keys[perm][:-1])
