"""Samplers (stabilizer/frames/sampler.py): outcome distributions and detector rates equal Stim's within
sampling noise, noiseless codes never fire, and outputs follow Stim's layouts: the bit-packed, bool
and on-device outputs are the same shots, whatever the shot count and chunking. Where a property holds
for every engine it is checked on both of a CPU's (the C engine, tests/stabilizer/frames/test_native.py,
and the JAX programs, STABILIZER_NATIVE=0); the JAX programs' own properties (chunks, compiled programs
shared between circuits) on the JAX programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stabilizer.frames.sampler as S
from stabilizer.circuits.circuit import Circuit
from stabilizer.frames.sampler import (
    compile_detector_sampler,
    compile_sampler,
    reference_sample,
)
from stabilizer.tableau import kernels

stim = pytest.importorskip("stim")

SHOTS = 4096


@pytest.fixture(params=["native", "jax"])
def engine(request, monkeypatch):
    """Each engine the samplers have here: the C engine (CPUs with the library built) and the JAX programs."""
    if request.param == "jax":
        monkeypatch.setenv(S.NATIVE, "0")
    elif S.native_engine() is None:
        pytest.skip("the C engine runs on CPUs with its library built")
    return request.param


@pytest.fixture
def jax_engine(monkeypatch):
    """The samplers on the JAX programs (on CPUs the C engine would run them)."""
    monkeypatch.setenv(S.NATIVE, "0")


def _noisy(code: str, d: int, p: float):
    return stim.Circuit.generated(code, distance=d, rounds=d, after_clifford_depolarization=p,
                                  before_measure_flip_probability=p, after_reset_flip_probability=p,
                                  before_round_data_depolarization=p)


@pytest.mark.parametrize("code", ["surface_code:rotated_memory_x", "surface_code:rotated_memory_z",
                                  "color_code:memory_xyz", "repetition_code:memory"])
def test_noiseless_codes_never_fire(code, engine):
    c = stim.Circuit.generated(code, distance=3, rounds=3)
    dets, obs = compile_detector_sampler(Circuit(c), seed=0).sample(256, separate_observables=True)
    assert dets.shape == (256, c.num_detectors) and obs.shape == (256, c.num_observables)
    assert not dets.any() and not obs.any()
    np.testing.assert_array_equal(reference_sample(Circuit(c)), c.reference_sample())


@pytest.mark.parametrize("d", [3, 5, 7])
def test_noisy_surface_code_rates_match_stim(d, engine):
    """Each detector's and the observable's firing rate within 5 sigma of Stim's (same shot count)."""
    check_surface_rates(d)


def check_surface_rates(d: int):
    c = _noisy("surface_code:rotated_memory_z", d, 0.01)
    ours_d, ours_o = S.compile_detector_sampler(Circuit(c), seed=1).sample(SHOTS, separate_observables=True)
    theirs_d, theirs_o = c.compile_detector_sampler(seed=1).sample(SHOTS, separate_observables=True)
    for a, b in ((ours_d, theirs_d), (ours_o, theirs_o)):
        pa, pb = a.mean(0), b.mean(0)
        pooled = (pa + pb) / 2
        sigma = np.sqrt(np.maximum(pooled * (1 - pooled), 1 / SHOTS) * 2 / SHOTS)
        assert np.all(np.abs(pa - pb) <= 5 * sigma), np.max(np.abs(pa - pb) / sigma)
    assert 0.02 < ours_d.mean() < 0.2  # noise is on


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    def dist(x):
        keys, counts = np.unique(np.packbits(x, axis=1, bitorder="little"), axis=0, return_counts=True)
        return {k.tobytes(): c / len(x) for k, c in zip(keys, counts)}

    da, db = dist(a), dist(b)
    return 0.5 * sum(abs(da.get(k, 0) - db.get(k, 0)) for k in set(da) | set(db))


CIRCUITS = [
    "H 0\nCX 0 1\nM 0 1",
    "H 0\nCX 0 1\nX_ERROR(0.2) 1\nM 0 1\nMX 0\nR 0\nM !0\nMPP X0*X1",
    "H 0 1 2\nCZ 0 1\nM 1\nCX rec[-1] 2\nMR 0\nH 0\nDEPOLARIZE1(0.3) 0 2\nM 0 2\nMY 1",
    "RX 0\nRY 1\nMXX 0 1\nMYY(0.1) 0 1\nMZZ 0 1\nPAULI_CHANNEL_2(0.05,0,0.1,0,0,0,0.05,0,0,0,0,0,0.1,0,0.05) 0 1\nM 0 1",
    "H 0\nS 0\nE(0.3) X0 Y1\nELSE_CORRELATED_ERROR(0.5) Z0\nMY 0\nM 1\nREPEAT 2 {\n  H 2\n  M(0.05) 2\n  CZ rec[-1] 0\n}\nMX 0",
]


@pytest.mark.parametrize("text", CIRCUITS)
def test_outcome_distributions_match_stim(text, engine):
    """Mid-circuit measurement, reset, feedback and noise: total variation to Stim's samples within the
    noise of two 4096-shot samples (and far below what a wrong sign or basis would give)."""
    ours = compile_sampler(Circuit(text), seed=2).sample(SHOTS)
    theirs = stim.Circuit(text).compile_sampler(seed=2).sample(SHOTS)
    k = len(np.unique(np.packbits(theirs, axis=1), axis=0))
    assert _tv(ours, theirs) < 3 * np.sqrt(k / SHOTS), (_tv(ours, theirs), k)


def test_layouts_and_reproducibility(engine):
    c = Circuit(_noisy("repetition_code:memory", 3, 0.05))
    s = compile_detector_sampler(c, seed=7)
    d, o = s.sample(100, separate_observables=True)
    both = compile_detector_sampler(c, seed=7).sample(100, append_observables=True)
    np.testing.assert_array_equal(both, np.concatenate([d, o], axis=1))
    first = compile_detector_sampler(c, seed=7).sample(100, prepend_observables=True)
    np.testing.assert_array_equal(first, np.concatenate([o, d], axis=1))
    packed = compile_detector_sampler(c, seed=7).sample(100, bit_packed=True)
    assert packed.dtype == np.uint8 and packed.shape == (100, (c.num_detectors + 7) // 8)
    np.testing.assert_array_equal(np.unpackbits(packed, axis=1, bitorder="little")[:, :c.num_detectors], d)
    assert not np.array_equal(s.sample(100), d)  # a second call draws new shots
    m = compile_sampler(c, seed=3).sample(37, bit_packed=True)
    assert m.shape == (37, (c.num_measurements + 7) // 8)
    assert compile_sampler(c, seed=3).sample(0).shape == (0, c.num_measurements)
    with pytest.raises(ValueError, match="shots must be a non-negative int"):
        s.sample(-1)
    with pytest.raises(ValueError, match="separate_observables"):
        s.sample(10, separate_observables=True, append_observables=True)


def _packbits(a):
    return np.packbits(a, axis=1, bitorder="little")


@pytest.mark.parametrize("chunked,split", [(False, False), (True, False), (False, True)],
                         ids=["one chunk", "32-shot chunks", "host copies split over threads"])
def test_packed_and_device_outputs_are_the_bool_shots(chunked, split, monkeypatch, jax_engine):
    """For a fixed seed, bit_packed=True is np.packbits(bools, bitorder="little") bit for bit and
    on_device=True gives the same arrays, for shot counts that are not multiples of 8 or 32, in one
    chunk or in 32-shot chunks (the last one partial), with the host copies in one piece or split by
    rows over threads, for the layouts of both samplers."""
    if chunked:
        monkeypatch.setattr(S, "_CHUNK_BYTES", 1 << 10)
    if split:  # pieces of a few rows, uneven, over three threads
        monkeypatch.setattr(S, "_COPY_PIECE_BYTES", 5)
        monkeypatch.setattr(S, "_COPY_THREADS", 3)
    c = Circuit(_noisy("repetition_code:memory", 3, 0.05))
    shots = 101 if chunked else 37
    layouts = [{}, {"separate_observables": True}]
    if not chunked:
        layouts += [{"append_observables": True}, {"prepend_observables": True}]
    for kw in layouts:
        bools = compile_detector_sampler(c, seed=5).sample(shots, **kw)
        packed = compile_detector_sampler(c, seed=5).sample(shots, bit_packed=True, **kw)
        on_device = compile_detector_sampler(c, seed=5).sample(shots, bit_packed=True, on_device=True, **kw)
        for b, p, d in zip(*(x if isinstance(x, tuple) else (x,) for x in (bools, packed, on_device))):
            assert b.shape[0] == shots and b.dtype == bool and p.dtype == np.uint8
            np.testing.assert_array_equal(p, _packbits(b))
            np.testing.assert_array_equal(np.asarray(d), p)
    bools = compile_sampler(c, seed=6).sample(shots)
    assert bools.shape == (shots, c.num_measurements) and bools.any()
    np.testing.assert_array_equal(compile_sampler(c, seed=6).sample(shots, bit_packed=True), _packbits(bools))
    np.testing.assert_array_equal(np.asarray(compile_sampler(c, seed=6).sample(shots, on_device=True)), bools)


def test_one_chunk_outputs_are_writable_arrays_of_their_own(engine):
    """A one-chunk sample is returned as a view of the chunk's host buffer, not a copy: it must be a
    writable, contiguous array that outlives the sampler and shares memory with nothing else (writing
    into one result changes neither another call's result nor a later sample)."""
    import gc

    c = Circuit(_noisy("repetition_code:memory", 5, 0.1))
    s = compile_detector_sampler(c, seed=9)
    first, second = s.sample(300, bit_packed=True), s.sample(300)
    want_first, want_second = first.copy(), second.copy()
    assert first.flags.writeable and first.flags.c_contiguous and first.shape == (300, -(-c.num_detectors // 8))
    del s
    gc.collect()
    first[...] = 0
    second[::2] = ~second[::2]
    assert not first.any() and not np.shares_memory(first, second)
    np.testing.assert_array_equal(second[1::2], want_second[1::2])
    again = compile_detector_sampler(c, seed=9)
    np.testing.assert_array_equal(again.sample(300, bit_packed=True), want_first)
    np.testing.assert_array_equal(again.sample(300), want_second)


def test_shot_counts_in_one_chunk_size_share_the_compiled_programs(jax_engine):
    """37 and 50 shots take the same 2-word chunk: the second call compiles neither the frame program
    nor the output layout (they are sized by the chunk, not the shot count)."""
    c = Circuit(_noisy("repetition_code:memory", 3, 0.05))
    s = compile_detector_sampler(c, seed=1)
    s.sample(37, bit_packed=True)
    sizes = S._chunk._cache_size()
    assert s.sample(50, bit_packed=True).shape[0] == 50
    assert np.asarray(s.sample(61, bit_packed=True, on_device=True)).shape[0] == 61
    assert S._chunk._cache_size() == sizes


def test_chunks_cover_the_shots_with_little_padding_and_blockable_sizes():
    """A chunk holds all the shots it can (up to the budget), wastes at most 1/8 beyond 1,024 words, and
    its word count is one the Pallas kernels can block."""
    for shots in [1, 31, 33, 4096, 4097, 10_000, 100_000, 1_000_000, 12_345_678]:
        words = S.chunk_words(shots, 1 << 20)
        assert 32 * words >= shots and kernels.block_words(words) is not None, shots
        assert words <= 1024 or 32 * words <= shots * 9 / 8, shots
        assert S.chunk_words(shots, 64) == min(words, 64)


def test_chunks_reserve_dense_draw_memory_only_where_the_program_draws_densely(monkeypatch, jax_engine):
    """The same code with one probability above the sparse limit holds dense-draw code and gets
    smaller chunks where the scan runs the frames; without it the chunks are larger (the budget is the
    same). The GPU's frame kernel draws in registers: there both get the same chunks."""
    monkeypatch.setattr(S, "_CHUNK_BYTES", 1 << 24)
    text = str(_noisy("repetition_code:memory", 5, 0.01))
    sparse = compile_detector_sampler(Circuit(text), seed=0)
    dense = compile_detector_sampler(Circuit("X_ERROR(0.75) 0\n" + text), seed=0)
    assert not any(d is not None and d.dense for d in sparse._limits)
    assert any(d is not None and d.dense for d in dense._limits)
    if S.frames.frame_engine("auto", 128) == "jax":
        assert sparse._budget_words() > dense._budget_words()
    else:
        assert sparse._budget_words() == dense._budget_words()


def test_a_call_runs_chunks_of_one_size(monkeypatch, jax_engine):
    """However many chunks the budget makes, they share one word count (one compiled frame program a
    call) and cover every shot once, in order."""
    monkeypatch.setattr(S, "_CHUNK_BYTES", 1 << 16)
    s = compile_detector_sampler(Circuit(_noisy("repetition_code:memory", 3, 0.05)), seed=0)
    budget = s._budget_words()
    for shots in [1, 32 * budget - 1, 32 * budget + 1, 5 * 32 * budget + 77, 40_000]:
        plan = s._plan(shots)
        assert len({words for _, _, words in plan}) == 1 and plan[0][2] <= budget, (shots, plan)
        assert [start for start, _, _ in plan] == list(np.cumsum([0] + [n for _, n, _ in plan])[:-1])
        assert sum(n for _, n, _ in plan) == shots and len(plan) <= -(-shots // (32 * budget))


def test_outputs_are_shot_major_transposes_of_the_record():
    """transpose_words + shot_major equal numpy's unpack-and-transpose of the record rows (70 rows: two
    full 32-row blocks and a partial one), packed and not."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2**32, (70, 3), dtype=np.uint32)
    want = np.unpackbits(rows.view(np.uint8), axis=1, bitorder="little").T.astype(bool)[:90]
    words = S.transpose_words(jnp.asarray(rows))
    np.testing.assert_array_equal(np.asarray(S.shot_major(words, 70, 90, False)), want)
    np.testing.assert_array_equal(np.asarray(S.shot_major(words, 70, 90, True)), _packbits(want))


def test_samples_do_not_depend_on_the_global_x64_setting(engine):
    """The frame program runs under jax.enable_x64 either way: the same seed gives the same shots."""
    c = Circuit(_noisy("repetition_code:memory", 3, 0.05))
    want = compile_detector_sampler(c, seed=9).sample(37)
    with jax.enable_x64(False):
        got = compile_detector_sampler(c, seed=9).sample(37)
    np.testing.assert_array_equal(got, want)


def test_shots_beyond_one_chunk(monkeypatch, jax_engine):
    """Chunking: with a tiny per-chunk budget the shots come in many chunks and rates are unchanged."""
    monkeypatch.setattr(S, "_CHUNK_BYTES", 1 << 10)
    c = Circuit("X_ERROR(0.25) 0\nM 0")
    bits = compile_sampler(c, seed=0).sample(5000)
    assert bits.shape == (5000, 1)
    assert abs(bits.mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 5000)


def test_a_sweep_over_noise_compiles_nothing_after_its_first_circuit(jax_engine):
    """Circuits that differ in their noise strengths (a threshold sweep's tasks at one distance) share
    every compiled program: after the first, sampling them compiles nothing, and each one's detection
    rates are still its own (they grow with p)."""
    def sample(p, rounds=3):
        c = stim.Circuit.generated("surface_code:rotated_memory_z", distance=3, rounds=rounds,
                                   after_clifford_depolarization=p, before_measure_flip_probability=p,
                                   after_reset_flip_probability=p, before_round_data_depolarization=p)
        return compile_detector_sampler(Circuit(c), seed=0).sample(2048, separate_observables=True)[0].mean()

    sample(1e-3)
    with _compilations() as compiled:
        rates = [sample(p) for p in (2e-3, 1e-2, 5e-2)]
    assert compiled == [], compiled
    assert rates[0] < rates[1] < rates[2], rates


def test_circuits_of_one_size_bucket_share_the_frame_program(jax_engine):
    """The frame program is keyed by bucketed sizes and holds repeat counts and probabilities as data:
    memory experiments over 3 and 4 rounds (33 and 41 measurements) at two noise strengths give flat
    programs of one shape: the same compiled frame program (the output layout follows the detector
    count's bucket)."""
    def key(rounds, p):
        c = stim.Circuit.generated("surface_code:rotated_memory_z", distance=3, rounds=rounds,
                                   after_clifford_depolarization=p, before_measure_flip_probability=p)
        s = compile_detector_sampler(Circuit(c))
        return s._qubit_rows, s._record_rows, s._depth, s._limits, jax.tree_util.tree_map(np.shape, s._flat)

    assert key(3, 1e-3) == key(4, 1e-3) == key(4, 2e-2)


class _compilations:
    """The programs JAX compiles inside the block (from its compile log), as a list."""

    def __enter__(self):
        import logging

        self.names, self.logger = [], logging.getLogger("jax._src.dispatch")
        names = self.names

        class Handler(logging.Handler):
            def emit(self, record):
                if "Finished XLA compilation" in record.getMessage():
                    names.append(record.getMessage())

        self.handler, self.before = Handler(), jax.config.jax_log_compiles
        logging.getLogger("jax").addHandler(self.handler)
        jax.config.update("jax_log_compiles", True)
        return names

    def __exit__(self, *exc):
        import logging

        logging.getLogger("jax").removeHandler(self.handler)
        jax.config.update("jax_log_compiles", self.before)
