"""Duplicate merging and compaction (pauliprop/propagation/merge.py).

* full_merge sums the coefficients of equal words (smallest sine count), drops exact zeros, compacts the
  survivors to the front, and accounts for anything that does not fit.
* pair_split then cap_terms (every rotation: it merges only inside the splitting set, then cuts to
  max_terms) gives the same terms, sine counts and dropped norms as splitting every word and running
  full_merge, on buffers with dead slots.
* Neither depends on hash luck: with a deliberately weak fingerprint every result stays exact.

The merges work on packed slots (words, coeffs, meta = live | sines << 1); the adapters below unpack
them into (x, z, coeffs, sins, live) for the comparisons. Sine counts are tracked exactly where the
max_sins rule exists (elsewhere a merged word keeps the count of one of its paths).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.propagation import engine
from pauliprop.propagation import merge as M
from pauliprop.propagation import truncation as truncation_rules
from pauliprop.algebra import words as W

SLOTS = 64  # candidate slots in the unit tests (one compile per shape)


NO_TRUNCATION = pp.Truncation(max_sins=1 << 20)  # no sine count is dropped, but every count is exact


def _unpacked(out):
    words, coeffs, meta, dropped = out[:4]
    x, z = M.halves(words)
    return x, z, coeffs, M.sins_of(meta), M.live_of(meta), dropped


def _jitted():
    """Fresh jits (a fresh trace picks up a monkeypatched fingerprint), on unpacked slots."""

    @partial(jax.jit, static_argnames=("truncation", "capacity"))
    def full(x, z, c, s, live, truncation, capacity):
        return _unpacked(M.full_merge(jnp.concatenate([x, z], -1), c, M.pack_meta(live, s), truncation, capacity))

    @partial(jax.jit, static_argnames=("truncation", "capacity", "room"))
    def pair(x, z, c, s, live, ac, gx, gz, cos, sin, truncation, capacity, room):
        words, c, meta, dropped = M.pair_split(jnp.concatenate([x, z], -1), c, M.pack_meta(live, s), ac,
                                               jnp.concatenate([gx, gz]), cos, sin, truncation, capacity, room)
        # the engine's rotation: the split, then the largest-terms cut over the whole buffer
        return _unpacked((words, *M.cap_terms(words, c, meta, dropped, truncation, capacity)))

    return full, pair


_full, _pair = _jitted()


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


def _terms(out, n, compacted=True):
    x, z, c, s, live = (np.asarray(a) for a in out[:5])
    if compacted:
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


def _split_then_full(x, z, c, s, live, gx, gz, cos, sin, capacity, truncation=NO_TRUNCATION):
    """The reference path for a rotation: split every anticommuting word, then merge everything."""
    ac = live & np.asarray(W.anticommutes(jnp.asarray(x), jnp.asarray(z), jnp.asarray(gx), jnp.asarray(gz)))
    sign = np.asarray(W.product_sign(jnp.asarray(x), jnp.asarray(z), jnp.asarray(gx), jnp.asarray(gz)))
    old = np.where(ac, cos * c, c)
    new = np.where(ac, sin * sign * c, 0)
    cat = np.concatenate
    return _full(jnp.asarray(cat([x, x ^ gx])), jnp.asarray(cat([z, z ^ gz])), jnp.asarray(cat([old, new])),
                 jnp.asarray(cat([s, s + 1])), jnp.asarray(cat([live, ac])), truncation, capacity)


def _buffer(cands, capacity, drop_some, truncation=NO_TRUNCATION):
    """A buffer as the engine holds it: distinct live words that pass the truncation rules, dead slots
    scattered among them."""
    x, z, c, s, live, n = cands
    bx, bz, bc, bs, blive, _ = _full(jnp.asarray(x), jnp.asarray(z), jnp.asarray(c), jnp.asarray(s),
                                     jnp.asarray(live), truncation, capacity)
    perm = np.random.default_rng(len(x)).permutation(capacity)  # slots in no particular order
    bx, bz, bc, bs, blive = (np.asarray(a)[perm] for a in (bx, bz, bc, bs, blive))
    if drop_some:  # slots a truncation rule emptied in place
        gone = blive & (np.arange(capacity) % 3 == 0)
        bc, blive = np.where(gone, 0, bc), blive & ~gone
    return bx, bz, bc, bs, blive


def _rotate(buf, generator, angle, n, room, truncation=NO_TRUNCATION, capacity=SLOTS, pair=None):
    bx, bz, bc, bs, blive = buf
    gx, gz = (a[0] for a in W.pack([generator], n))
    ac = blive & np.asarray(W.anticommutes(jnp.asarray(bx), jnp.asarray(bz), jnp.asarray(gx), jnp.asarray(gz)))
    assert ac.sum() <= room
    got = (pair or _pair)(*(jnp.asarray(a) for a in (bx, bz, bc, bs, blive, ac, gx, gz)), np.cos(angle),
                          np.sin(angle), truncation, capacity, room)
    ref = _split_then_full(bx, bz, bc, bs, blive, gx, gz, np.cos(angle), np.sin(angle), capacity, truncation)
    return got, ref


generators = st.dictionaries(st.integers(0, 4), st.sampled_from("XYZ"), min_size=1)


@settings(max_examples=30)
@given(candidates(num_qubits=5, pool=20), generators, st.floats(-3, 3), st.booleans())
def test_pair_split_equals_split_and_full_merge(cands, generator, angle, drop_some):
    n = cands[-1]
    got, ref = _rotate(_buffer(cands, SLOTS, drop_some), generator, angle, n, room=SLOTS)
    _assert_same_terms(_terms(got, n, compacted=False), _terms(ref, n))
    assert not np.asarray(got[-1]).any()


@settings(max_examples=30)
@given(candidates(num_qubits=5, pool=24), generators, st.floats(0.2, 1.3), st.sampled_from([
    pp.Truncation(max_terms=10, max_sins=99), pp.Truncation(min_abs_coeff=0.3, max_sins=99),
    pp.Truncation(max_weight=2, max_sins=99), pp.Truncation(max_sins=3),
    pp.Truncation(max_terms=14, min_abs_coeff=0.05, max_weight=3, max_sins=99)]))
def test_pair_split_truncates_like_the_full_merge(cands, generator, angle, truncation):
    """Each rule drops the same terms with the same dropped 1-norm (magnitudes made tie-free)."""
    x, z, c, s, live, n = cands
    c = np.round(c, 3) + np.arange(SLOTS) * 1e-6
    buf = _buffer((x, z, c, s, live, n), SLOTS, False, truncation)
    got, ref = _rotate(buf, generator, angle, n, room=SLOTS, truncation=truncation)
    _assert_same_terms(_terms(got, n, compacted=False), _terms(ref, n), atol=1e-9)
    np.testing.assert_allclose(np.asarray(got[-1]), np.asarray(ref[-1]), atol=1e-9)


def test_pair_split_in_a_small_room():
    """A room just large enough gives the same terms."""
    rng = np.random.default_rng(5)
    n = 5
    words = [{q: "XYZ"[rng.integers(3)] for q in rng.choice(n, rng.integers(1, 4), replace=False)} for _ in range(40)]
    x, z = W.pack(words, n)
    cands = (x, z, rng.normal(size=40), np.zeros(40, np.int32), np.ones(40, bool), n)
    cands = tuple(np.resize(a, (SLOTS,) + a.shape[1:]) if isinstance(a, np.ndarray) else a for a in cands)
    buf = _buffer(cands, SLOTS, True)
    got, ref = _rotate(buf, {0: "X"}, 0.7, n, room=32)
    _assert_same_terms(_terms(got, n, compacted=False), _terms(ref, n))


def test_pair_split_charges_words_without_a_free_slot_to_overflow():
    """Handed a full buffer, the spawned words that do not fit are cut with the buffer, to max_terms:
    kept 1-norm plus dropped 1-norm equals the exact split's 1-norm."""
    n = 13
    words = [{a: "Z", b: "XYZ"[(a + b) % 3]} for a in range(2, n) for b in range(1, a)][:SLOTS - 4]
    words += [{0: "Z", q: "X"} for q in range(1, 5)]  # the 4 words that anticommute with X0, unpaired
    x, z = W.pack(words, n)
    buf = (x, z, np.linspace(1.0, 2.0, SLOTS), np.zeros(SLOTS, np.int32), np.ones(SLOTS, bool))
    room = 8
    trunc = pp.Truncation(max_terms=SLOTS - room, max_sins=99)
    got, ref = _rotate(buf, {0: "X"}, 0.9, n, room, trunc)
    exact = sum(abs(v[0]) for v in _terms(_split_then_full(*buf, *(a[0] for a in W.pack([{0: "X"}], n)),
                                                           np.cos(0.9), np.sin(0.9), 2 * SLOTS), n).values())
    kept = sum(abs(v[0]) for v in _terms(got, n, compacted=False).values())
    dropped = np.asarray(got[-1])
    assert dropped[3] > 0  # the joint cut of the buffer and the spawned words
    assert abs(kept + dropped[3] + dropped[4] - exact) < 1e-9
    assert int(np.asarray(got[4]).sum()) == SLOTS - room


def test_pair_split_reports_a_collision_and_writes_nothing():
    """With report_collisions (and stop), a room that meets equal fingerprints of different words
    leaves the buffer as it was and returns COLLIDED as the slots needed."""
    rng = np.random.default_rng(3)
    n, count = 20, 12
    x = rng.integers(0, 2**n, (SLOTS, 1), dtype=np.uint32)
    z = rng.integers(0, 2**n, (SLOTS, 1), dtype=np.uint32)
    words = jnp.asarray(np.concatenate([x, z], axis=1))
    live = np.arange(SLOTS) < count
    meta = jnp.asarray(live.astype(np.int32))
    coeffs = jnp.asarray(np.where(live, rng.normal(size=SLOTS), 0))
    g = jnp.asarray(np.array([1, 0], np.uint32))  # X on qubit 0: anticommutes with Z-or-Y there
    ac = jnp.asarray(live & (z[:, 0] & 1 == 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(W, "fingerprint", lambda x, z: (jnp.zeros(x.shape[0], jnp.uint32),) * 2)
        out = jax.jit(lambda *a: M.pair_split(*a, NO_TRUNCATION, SLOTS, 16, stop=True, fits=True,
                                              report_collisions=True))(words, coeffs, meta, ac, g, 0.6, 0.8)
    assert int(ac.sum()) >= 2 and int(out[4]) == M.COLLIDED
    for got, was in zip(out[:3], (words, coeffs, meta)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(was))


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


@settings(max_examples=15)
@given(candidates(num_qubits=5, pool=20), generators, st.floats(-3, 3))
def test_pair_split_is_exact_under_fingerprint_collisions(cands, generator, angle):
    n = cands[-1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(W, "fingerprint", _weak_fingerprint)
        full, pair = _jitted()
        buf = _buffer(cands, SLOTS, False)
        got, ref = _rotate(buf, generator, angle, n, room=SLOTS, pair=pair)
        _assert_same_terms(_terms(got, n, compacted=False), _terms(ref, n))


@pytest.mark.usefixtures("several_rooms")
@pytest.mark.parametrize("layers", [False, True], ids=["rotations", "layers"])
@pytest.mark.parametrize("sizes", [dict(capacity=256), dict(initial_capacity=1024)])
def test_propagation_is_exact_under_fingerprint_collisions(monkeypatch, sizes, layers):
    """End to end: a circuit propagated with the weak fingerprint equals the state vector. (Words of up
    to 16 qubits are their own sort keys, so the circuit sits on 20 qubits.) At a fixed capacity and a
    growing one (rooms of 512 and 1,024 slots) the program holds no exact sort: the rotation (or
    layer) that meets a collision writes nothing, and the loop resumes there in a program whose rooms
    order exactly."""
    monkeypatch.setattr(W, "fingerprint", _weak_fingerprint)
    monkeypatch.setattr(engine, "layers_for", lambda backend, t: layers)
    from pauliprop.propagation import propagate as PR
    monkeypatch.setattr(PR, "tiled_supported", lambda *a: False)  # the loop of engine.py (tiled.py pairs exactly)
    PR._forward_jit.cache_clear()  # a fresh trace sees the weak fingerprint
    configs = []
    forward_jit = PR._forward_jit
    monkeypatch.setattr(PR, "_forward_jit", lambda cfg, *a: configs.append(cfg) or forward_jit(cfg, *a))
    sites = [0, 9, 19]

    def circuit(n, at):
        c = pp.Circuit(n)
        for k in range(4):
            c.rx(at[k % 3], 0.3 + k).rx(at[(k + 1) % 3], 0.2 - k).cx(at[k % 3], at[(k + 1) % 3])
            c.rzz(at[0], at[2], pp.Param(0)).ry(at[(k + 2) % 3], 0.7 * k + 0.1)
        return c

    terms = [("ZZZ", 1.0), ("XIY", -0.5), ("IZX", 0.25)]
    small = pp.PauliSum.from_labels(dict(terms))
    big = pp.PauliSum.from_list([(lab, sites, c) for lab, c in terms], 20)
    p = np.array([0.4])
    try:
        val = float(pp.expectation(circuit(20, sites), big, p, **sizes))
    finally:
        forward_jit.cache_clear()
    assert abs(val - float(pp.expectation(circuit(3, [0, 1, 2]), small, p, method="statevector"))) < 1e-10
    # it met a collision, and only then took the exact program
    assert configs[0].report_collisions and not configs[-1].report_collisions


@pytest.mark.skipif(not M.x64(), reason="uint64 keys need jax_enable_x64")
@settings(max_examples=20)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=100), st.integers(0, 12))
def test_argsort_keys_sorts(keys, nbits):
    keys = np.array(keys, dtype=np.uint64) & ~np.uint64((1 << nbits) - 1)
    perm = np.asarray(M.argsort_keys(jnp.asarray(keys), nbits if len(keys) <= 2**nbits else 0))
    assert sorted(perm.tolist()) == list(range(len(keys)))
    assert np.all(np.diff(keys[perm].astype(np.float64)) >= 0) and np.all(keys[perm][1:] >= keys[perm][:-1])


_cut_keeps = jax.jit(lambda words, mags, live, k, method: truncation_rules.keep_largest(
    mags, live, k, method=method, tiebreak=lambda i: M.tie_keys(words[i])), static_argnames=("method",))


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(1, SLOTS - 1), st.sampled_from(["bucket", "sort", "bisect"]))
def test_a_cut_keeps_the_same_words_whatever_slots_they_sit_in(seed, k, method):
    """Which of equally large terms a max_terms cut keeps depends on the words (tie_keys: the weight,
    then the fingerprint), not on their slots: the buffer in another order keeps the same words. With
    the weight alone the slots decided between tied words of equal weight (a vmapped batch, another
    capacity or room then kept other terms)."""
    rng = np.random.default_rng(seed)
    n = 20
    sites = {}
    while len(sites) < SLOTS:  # distinct words of weight 1-3: many equal weights
        qs = rng.choice(n, int(rng.integers(1, 4)), replace=False)
        sites[tuple(sorted(qs))] = tuple(rng.choice(list("XYZ"), len(qs)))
    words = np.concatenate(W.pack([dict(zip(q, p)) for q, p in sites.items()], n), -1)
    mags = rng.choice([0.5, 0.25, 0.125], SLOTS)  # ties everywhere
    live = rng.random(SLOTS) < 0.8
    perm = rng.permutation(SLOTS)
    kept = np.asarray(_cut_keeps(jnp.asarray(words), jnp.asarray(mags), jnp.asarray(live), k, method))
    kept_perm = np.asarray(_cut_keeps(jnp.asarray(words[perm]), jnp.asarray(mags[perm]), jnp.asarray(live[perm]), k,
                                      method))
    assert kept.sum() == min(k, live.sum())
    assert {tuple(w) for w in words[kept]} == {tuple(w) for w in words[perm][kept_perm]}


@pytest.mark.parametrize("live_count", [0, 1, 4096, 4097, 8193, 16384])
def test_a_sort_of_the_live_prefix_orders_as_the_whole_room(live_count):
    """order_words with `count` (the live words fill the first count entries, as a room's do) sorts
    only the smallest of a quarter, half or all of a large room that holds them (CPUs): the live
    words come out in the same order as when the whole room is sorted (and under x64, where dead
    entries sort by position, the whole permutation is the same)."""
    n = M.PREFIX_SORT_MIN
    rng = np.random.default_rng(live_count)
    words = jnp.asarray(rng.integers(0, 2**32, size=(n, 8), dtype=np.uint32))
    words = words.at[1::7].set(words[::7][: words[1::7].shape[0]])  # some equal neighbours to pair up
    live = jnp.arange(n) < live_count
    whole, same_whole = jax.jit(M.order_words)(words, live)
    part, same_part = jax.jit(lambda w, l: M.order_words(w, l, count=M.count(l)))(words, live)
    whole, part = np.asarray(whole), np.asarray(part)
    np.testing.assert_array_equal(part[:live_count], whole[:live_count])
    np.testing.assert_array_equal(np.asarray(same_part)[:live_count], np.asarray(same_whole)[:live_count])
    assert sorted(part.tolist()) == list(range(n))
    if M.x64():
        np.testing.assert_array_equal(part, whole)
