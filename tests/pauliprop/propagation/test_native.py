"""The native CPU engine (pauliprop/propagation/native.py and its C loops, _native.c).

Properties: untruncated it equals the state vector; truncated it is the tiled engine's estimator to the
last term (value, live terms after every row, dropped 1-norm per rule), with noise channels and
per-layer rules too; every live word sits in the bucket its (Clifford-updated) functionals give; tiny
buckets relaid out again and again give the same answer; a run past the memory
it may take stops with a MemoryError that names the slots; its dense-map tables equal the tiled
engine's (clifford.chunk_tables); runs of different shapes one after another in one process (the
buffers a run leaves are the next run's) agree with fresh ones.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pauliprop.propagation._native", reason="the native engine's C library was not built (no C "
                    "compiler when the package was installed)")

import pauliprop as pp  # noqa: E402
from pauliprop.algebra import clifford  # noqa: E402
from pauliprop.propagation import native, program as P, propagate as prop, schedule  # noqa: E402

from .._strategies import (UNITARY_KINDS, UNITARY_OPS, UNITARY_TERMS, anchored_ops, build,  # noqa: E402
                           disjoint_rotation_layer, observable_terms, params_vector, paulisum, states)


@pytest.fixture(autouse=True)
def _native_on(monkeypatch):
    """The native engine, small circuits too (their first try is on the loop: propagate.SMALL_RUN_BOUND)."""
    monkeypatch.setenv(prop.NATIVE, "1")
    monkeypatch.setattr(prop, "SMALL_RUN_BOUND", {})


def _tiled(fn):
    """fn() on the tiled engine (small runs too: no first try on the loop)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv(prop.NATIVE, "0")
        m.setattr(prop, "SMALL_RUN_BOUND", {})
        return fn()


@st.composite
def case(draw, max_n=7, noise=False):
    n = draw(st.integers(1, max_n))
    kinds = UNITARY_KINDS + ((P.CHANNEL,) if noise else ())
    ops = draw(anchored_ops(n, UNITARY_OPS, kinds, noise=noise))
    ops = [op for op in ops if op[0] != "amplitude_damp"]  # the loop engine's (tiled_supported)
    return n, ops, draw(observable_terms(n, UNITARY_TERMS)), draw(params_vector()), draw(states(n))


truncations = st.builds(lambda w, c, s, per: pp.Truncation(max_weight=w, min_abs_coeff=c, max_sins=s, per=per),
                        st.sampled_from([None, 1, 2, 3]), st.sampled_from([None, 1e-3, 0.05, 0.2]),
                        st.sampled_from([None, 1, 3]), st.sampled_from(["gate", "layer"]))


@settings(max_examples=40)
@given(case())
def test_untruncated_equals_statevector(c):
    n, ops, terms, params, state = c
    circuit, h = build(n, ops), paulisum(terms, n)
    assert prop.native_engine() is not None and prop.tiled_supported(circuit, pp.Truncation(), params, None)
    exact = float(pp.expectation(circuit, h, params, state=state, method="statevector"))
    assert abs(float(pp.expectation(circuit, h, params, state=state)) - exact) < 1e-10


def _assert_same_run(mine, theirs):
    (val, stats), (ref, ref_stats) = mine, theirs
    assert abs(float(val) - float(ref)) < 1e-10
    np.testing.assert_array_equal(np.asarray(stats.terms), np.asarray(ref_stats.terms))
    np.testing.assert_allclose(np.asarray(stats.dropped_norm), np.asarray(ref_stats.dropped_norm), atol=1e-10)
    # the peak is counted after every pass: the tiled engine turns a layer's words in passes (pass j by each
    # word's j-th rotation), this engine rotation by rotation, so only the counts between rows must agree
    assert int(stats.max_terms_seen) >= int(np.max(np.asarray(stats.terms), initial=0))
    assert not bool(stats.overflow)


@settings(max_examples=60)
@given(case(noise=True), truncations)
def test_truncated_is_the_tiled_engines_estimator(c, truncation):
    """The same truncation decisions as the tiled engine: equal values, live terms after every row,
    dropped 1-norm per rule and peak (noise channels and per-layer rules included)."""
    n, ops, terms, params, state = c
    circuit, h = build(n, ops), paulisum(terms, n)
    run = lambda: pp.expectation(circuit, h, params, state=state, truncation=truncation, return_stats=True)
    _assert_same_run(run(), _tiled(run))


def _layered(n: int, layers: int, rng) -> tuple[pp.Circuit, int]:
    """Layers of rotations on disjoint qubits in shuffled orders, a quarter turn of a three-qubit generator
    and Cliffords between them (dense maps, and gate by gate under a per-gate weight rule)."""
    c, k = pp.Circuit(n), 0
    for _ in range(layers):
        k = disjoint_rotation_layer(c, rng, k, singles=("rx", "rz"))
        c.pauli_rotation("XYZ", [1, 4, 6], pp.Param(k)).cx(0, 3).h(5).pauli_rotation("YZX", [0, 2, 7], np.pi / 2)
        k += 1
    return c, k


@pytest.mark.parametrize("truncation", [pp.Truncation(min_abs_coeff=1e-3, max_weight=6),
                                        pp.Truncation(min_abs_coeff=0.003, max_weight=5, per="layer"),
                                        pp.Truncation(max_weight=3, max_sins=4)])
def test_layered_circuits_on_many_lanes_match_the_tiled_engine(truncation):
    """Words of several lanes (40 qubits: the layers' generators straddle lanes), hundreds to thousands of
    terms."""
    rng = np.random.default_rng(17)
    n = 40
    c, k = _layered(n, 5, rng)
    h = pp.PauliSum.from_list([("ZZ", [0, 33], 1.0), ("XY", [5, 38], 0.5), ("Z", [20], -0.7)], n)
    params = rng.normal(size=k)
    run = lambda: pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    mine = run()
    assert int(mine[1].max_terms_seen) > 200
    _assert_same_run(mine, _tiled(run))


def test_buckets_that_start_small_grow_with_the_same_answer(monkeypatch):
    """Tiny buckets (many of them, relaid out again and again as the words grow): a run resumes at the
    rotation that did not fit, in the new layout, with the same answer."""
    rng = np.random.default_rng(3)
    c, k = _layered(8, 3, rng)
    h = pp.PauliSum.from_labels({"ZZIIIIII": 1.0, "IXIIYIII": 0.5})
    params = rng.normal(size=k)
    truncation = pp.Truncation(min_abs_coeff=1e-4)
    big = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    monkeypatch.setattr(native, "TARGET_BUCKET", 4)
    monkeypatch.setattr(native, "MIN_BUCKET_CAP", 2)
    small = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    assert int(small[1].max_terms_seen) > 1000
    _assert_same_run(small, big)
    assert abs(float(small[0]) - float(pp.expectation(c, h, params, method="statevector"))) < 2e-3


@pytest.mark.parametrize("threads, small", [(2, False), (3, False), (2, True)])
def test_rotations_on_threads_give_the_one_thread_run(monkeypatch, threads, small):
    """A unit's rotations on several threads (OpenMP: ranges of buckets, then of bucket pairs, each thread with
    its own table and dropped norms; a rotation's pairs make the next one's turning lists): the one-thread run's
    value, live terms after every row and dropped norms (to rounding: sums in another order); with small buckets,
    also where a run stops inside a unit and resumes there in buckets relaid out."""
    if not native.OPENMP:
        pytest.skip("the native engine's C library was built without OpenMP: its rotations run on one thread")
    rng = np.random.default_rng(41)
    c, k = _layered(10, 3, rng)
    h = pp.PauliSum.from_labels({"ZZIIIIIIII": 1.0, "IXIIYIIIIZ": 0.5})
    params = rng.normal(size=k)
    truncation = pp.Truncation(min_abs_coeff=1e-4, max_weight=7)
    monkeypatch.setattr(native, "TARGET_BUCKET", 16)
    monkeypatch.setenv(native.THREADS, "1")
    one = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    monkeypatch.setattr(native, "THREAD_MIN", 0)
    monkeypatch.setenv(native.THREADS, str(threads))
    if small:  # and a circuit of its own: a circuit keeps the layout its last run ended in
        monkeypatch.setattr(native, "TARGET_BUCKET", 4)
        monkeypatch.setattr(native, "MIN_BUCKET_CAP", 2)
        c, _ = _layered(10, 3, np.random.default_rng(41))
    called = []
    run = native.run
    monkeypatch.setattr(native, "run", lambda *a, **k: called.append(run(*a, **k)) or called[-1])
    many = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    assert int(many[1].max_terms_seen) > 1000 and max(at.threads for at in called) == threads
    assert not small or any(at.need > 0 and at.step > 0 for at in called)  # stopped inside a unit
    _assert_same_run(many, one)


def test_a_batch_runs_its_sets_on_the_native_engine(monkeypatch):
    """A concrete batch (B, P): each set's own run (its value, dropped norms and overflow), terms after each
    row the most of any set, as the batched loop reports them; its values and dropped norms equal the
    batched loop's."""
    rng = np.random.default_rng(23)
    c, k = _layered(8, 3, rng)
    h = pp.PauliSum.from_labels({"ZZIIIIII": 1.0, "IXIIYIIZ": 0.5})
    params = rng.normal(size=(3, k))
    truncation = pp.Truncation(min_abs_coeff=1e-3, max_weight=5)
    batch, drive = [], prop._drive_native_batch
    monkeypatch.setattr(prop, "_drive_native_batch", lambda *a: batch.append(1) or drive(*a))
    val, stats = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    assert batch and np.shape(val) == (3,) and np.shape(stats.dropped_norm) == (3, 5)
    sets = [pp.expectation(c, h, p, truncation=truncation, return_stats=True) for p in params]
    np.testing.assert_array_equal(np.asarray(val), [float(v) for v, _ in sets])
    np.testing.assert_array_equal(np.asarray(stats.dropped_norm), [np.asarray(s.dropped_norm) for _, s in sets])
    np.testing.assert_array_equal(np.asarray(stats.terms), np.max([np.asarray(s.terms) for _, s in sets], 0))
    assert int(stats.max_terms_seen) == max(int(s.max_terms_seen) for _, s in sets) and not np.any(stats.overflow)
    loop_val, loop_stats = _tiled(lambda: pp.expectation(c, h, params, truncation=truncation, return_stats=True))
    np.testing.assert_allclose(np.asarray(val), np.asarray(loop_val), atol=1e-12)
    np.testing.assert_allclose(np.asarray(stats.dropped_norm), np.asarray(loop_stats.dropped_norm), atol=1e-12)


@pytest.mark.parametrize("given", ["two", "0", "-1", "1.5"])
def test_a_bad_thread_count_is_refused_by_name(monkeypatch, given):
    monkeypatch.setenv(native.THREADS, given)
    with pytest.raises(ValueError, match=f"PAULIPROP_NATIVE_THREADS='{re.escape(given)}'.*positive integer"):
        native.threads()


def test_every_word_stays_in_the_bucket_its_functionals_give():
    """The bucket functionals follow the words through Clifford runs (dense maps, gate tables, quarter turns
    of generators) and rotations: after a run, each live word's bucket is its parities against them."""
    rng = np.random.default_rng(29)
    n = 40
    c, k = _layered(n, 4, rng)
    for q in range(0, n - 1, 3):
        c.h(q).cx(q, q + 1).s(q + 1)
    h = pp.PauliSum.from_list([("ZZ", [0, 33], 1.0), ("XY", [5, 38], 0.5), ("Z", [20], -0.7)], n)
    params = rng.normal(size=k)
    for truncation in (pp.Truncation(min_abs_coeff=1e-3), pp.Truncation(min_abs_coeff=1e-3, max_weight=6)):
        low = prop.lowered(c, truncation, "cpu", layers=True, support=prop.observable_support(h))
        tables = native.Tables(low.schedule, low.units)
        angles = tables.angles(prop.params_array(params, c.num_params, np.float64))
        hashes = native.hash_rows(2)
        ws, _ = native.laid_out(native.loaded(*_observable_words(h), np.float64), hashes, 3, 64, 1 << 24)
        at, layouts = native.Progress(1, 0, 0, 3), 0
        while True:
            at = native.run(tables, ws, hashes, at.unit, at.step, np.cos(angles), np.sin(angles),
                            truncation.limits(np.float64), truncation.rules,
                            np.zeros(low.units.length, np.int32), np.zeros(5), at.peak)
            if at.need == 0:
                break
            ws, _ = native.laid_out(ws, hashes, 3, 2 * ws.cap, 1 << 24)  # the same functionals, larger buckets
            layouts += 1
        assert ws.n > 500 and layouts > 0
        for b, live in enumerate(ws.count.tolist()):
            w = ws.words[b * ws.cap:b * ws.cap + live]
            bits = [(clifford.popcount(w & hashes[r]).sum(-1) & 1) << r for r in range(3)]
            np.testing.assert_array_equal(sum(bits), b)


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("k_from,k_to", [(0, 4), (3, 3), (4, 6), (5, 2)])
def test_a_layout_on_threads_puts_every_word_where_one_thread_does(monkeypatch, threads, k_from, k_to):
    """laid_out on several threads (the source buckets in ranges, each range's words of a new bucket after the
    earlier ranges'): the same words, coefficients, sines and counts in the same slots as on one thread."""
    if not native.OPENMP:
        pytest.skip("the native engine's C library was built without OpenMP: layouts run on one thread")
    rng = np.random.default_rng(100 * threads + 10 * k_from + k_to)
    lanes, n = 3, 3000
    words = np.unique(rng.integers(0, 1 << 32, (n, 2 * lanes), dtype=np.uint32), axis=0)
    rng.shuffle(words)
    coeffs = rng.normal(size=len(words))
    hashes = native.hash_rows(lanes)
    source, _ = native.laid_out(native.loaded(words, coeffs, np.float64), hashes, k_from, 0, 1 << 24)
    source.sins[:] = rng.integers(0, 9, len(source.sins), dtype=np.int32)
    monkeypatch.setattr(native, "THREAD_MIN", 0)
    layouts = {}
    for t in (1, threads):
        monkeypatch.setenv(native.THREADS, str(t))
        layouts[t], _ = native.laid_out(source, hashes, k_to, 2 * source.cap, 1 << 24)
    one, many = layouts[1], layouts[threads]
    np.testing.assert_array_equal(one.count, many.count)
    assert one.cap == many.cap and one.n == len(words)
    for b, live in enumerate(one.count.tolist()):
        rows = slice(b * one.cap, b * one.cap + live)
        np.testing.assert_array_equal(one.words[rows], many.words[rows])
        np.testing.assert_array_equal(one.coeffs[rows], many.coeffs[rows])
        np.testing.assert_array_equal(one.sins[rows], many.sins[rows])
        bits = [(clifford.popcount(one.words[rows] & hashes[r]).sum(-1) & 1) << r for r in range(k_to)]
        np.testing.assert_array_equal(sum(bits, np.zeros(live, np.int64)), b)


def _observable_words(h: pp.PauliSum):
    words, coeffs, _ = prop.tiled.host_merge(h.x, h.z, h.coeffs, pp.Truncation().limits(np.float64))
    return words, coeffs


def test_past_the_memory_a_memory_error_names_the_slots():
    """max_capacity (like the memory) bounds the buffers: a run that needs more stops, naming the slots."""
    rng = np.random.default_rng(5)
    c, k = _layered(10, 4, rng)
    h = pp.PauliSum.from_labels({"Z" * 10: 1.0})
    with pytest.raises(MemoryError, match=r"needs \d+ term slots at row \d+.*more than the 4096 slots"):
        pp.propagate(c, h, rng.normal(size=k), max_capacity=4096)


def test_propagate_returns_the_live_terms():
    """pp.propagate on the native engine: the tiled engine's live terms, as an operator."""
    rng = np.random.default_rng(11)
    c, k = _layered(8, 2, rng)
    h = pp.PauliSum.from_labels({"ZZIIIIII": 1.0, "IXIIYIII": 0.5})
    params = rng.normal(size=k)
    truncation = pp.Truncation(min_abs_coeff=1e-3)
    out, stats = pp.propagate(c, h, params, truncation=truncation)
    ref, _ = _tiled(lambda: pp.propagate(c, h, params, truncation=truncation))
    assert len(out) == int(stats.terms[0])
    mine, theirs = out.to_dict(), ref.to_dict()  # (merged duplicates and zeros would shorten them)
    assert len(mine) == len(out)
    assert mine.keys() == theirs.keys() and all(abs(mine[t] - theirs[t]) < 1e-12 for t in mine)


def test_runs_of_many_shapes_in_one_process_agree_with_fresh_buffers():
    """One process, many circuits of different sizes and lanes one after another (each run takes the
    buffers the last one left when their shape fits): every value equals the state vector's."""
    rng = np.random.default_rng(23)
    for n in (3, 9, 5, 8, 33, 4, 8):
        c, k = pp.Circuit(n), 0
        for _ in range(3):
            k = disjoint_rotation_layer(c, rng, k)
            c.cx(0, n - 1)
        h = pp.PauliSum.from_list([("Z", [n - 1], 1.0), ("XZ", [0, n // 2], 0.5)] if n > 1 else [("Z", [0], 1.0)], n)
        params = rng.normal(size=k)
        val = float(pp.expectation(c, h, params))
        if n <= 10:
            assert abs(val - float(pp.expectation(c, h, params, method="statevector"))) < 1e-10
        assert abs(val - float(pp.expectation(c, h, params))) < 1e-12  # the same buffers, left by this run


def test_chunk_tables_equal_the_tiled_engines():
    """The dense map's lookup tables, built in numpy, equal clifford.chunk_tables (jax), for a random
    composed Clifford on two lanes."""
    rng = np.random.default_rng(2)
    c = pp.Circuit(40)
    for _ in range(60):
        a, b = rng.choice(40, 2, replace=False)
        getattr(c, rng.choice(["h", "s", "sdg", "sx"]))(int(a))
        c.cx(int(a), int(b))
    sched = schedule.schedule(P.lower(c), backend="cpu")
    assert len(sched.map_x) == 1
    mine = native.chunk_tables(sched.map_x[0], sched.map_z[0], sched.map_phase[0])
    theirs = clifford.chunk_tables(sched.map_x[0], sched.map_z[0], sched.map_phase[0])
    for a, b in zip(mine, theirs):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_off_by_environment(monkeypatch):
    """PAULIPROP_NATIVE=0 runs a CPU's concrete calls on the tiled engine."""
    monkeypatch.setenv(prop.NATIVE, "0")
    assert prop.native_engine() is None
    monkeypatch.setenv(prop.NATIVE, "1")
    assert prop.native_engine() is native
    assert os.environ[prop.NATIVE] == "1"


FLOAT32_JOB = r"""
import json
import numpy as np
import pauliprop as pp
from pauliprop.propagation import propagate
propagate.SMALL_RUN_BOUND = {}  # this small circuit on the engine asked for, not first on the loop
rng = np.random.default_rng(5)
c = pp.Circuit(6)
for layer in range(4):
    for q in range(6):
        c.rx(q, pp.Param(6 * layer + q)).rz(q, 0.3 * q)
    for q in range(layer % 2, 5, 2):
        c.cx(q, q + 1)
    c.depolarize(layer, 0.05)
h = pp.PauliSum.from_labels({"ZZIIIZ": 1.0, "IXIYII": 0.5})
v, s = pp.expectation(c, h, params=rng.normal(size=24), truncation=pp.Truncation(min_abs_coeff=1e-3, max_weight=4),
                      return_stats=True)
print(json.dumps({"dtype": str(np.asarray(v).dtype), "value": float(v), "terms": np.asarray(s.terms).tolist(),
                  "dropped": np.asarray(s.dropped_norm).tolist(), "engine": propagate.native_engine() is not None}))
"""


def _job(code: str, **env_extra) -> dict:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env.update(JAX_PLATFORMS="cpu", **env_extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_float32_coefficients_are_the_tiled_engines_estimator():
    """Without jax_enable_x64 the coefficients are float32 (the C loops' second type): the tiled engine's
    float32 run, term for term, its value and dropped norms to float32 rounding."""
    mine, tiled = _job(FLOAT32_JOB, PAULIPROP_NATIVE="1"), _job(FLOAT32_JOB, PAULIPROP_NATIVE="0")
    assert mine["engine"] and not tiled["engine"] and mine["dtype"] == tiled["dtype"] == "float32"
    assert mine["terms"] == tiled["terms"]
    np.testing.assert_allclose(mine["value"], tiled["value"], atol=1e-5)
    np.testing.assert_allclose(mine["dropped"], tiled["dropped"], atol=1e-5)


def test_without_the_c_library_cpus_run_the_tiled_engine():
    """Where the C library was not built (no compiler at install), importing native fails and a CPU's
    concrete calls run on XLA's engines, with the same answer."""
    job = "import sys; sys.modules['pauliprop.propagation._native'] = None\n" + FLOAT32_JOB
    without = _job(job, PAULIPROP_NATIVE="1")
    assert not without["engine"]
    assert without["terms"] == _job(FLOAT32_JOB, PAULIPROP_NATIVE="0")["terms"]


def test_arrays_of_another_type_are_refused():
    """The C loops read each array as its documented type: anything else is a TypeError, never read as
    something it is not."""
    words, coeffs, count = np.zeros((4, 2), np.uint32), np.zeros(4), np.array([1], np.int64)
    assert native.value(words, coeffs, count, np.ones((32, 4))) == 0.0
    with pytest.raises(TypeError, match="uint32"):
        native.value(words.astype(np.int64), coeffs, count, np.ones((32, 4)))
    with pytest.raises(TypeError, match="float64 or float32"):
        native.value(words, coeffs.astype(np.float16), count, np.ones((32, 4)))
    with pytest.raises(TypeError, match="strided"):
        native.value(words, np.zeros(8)[::2], count, np.ones((32, 4)))
