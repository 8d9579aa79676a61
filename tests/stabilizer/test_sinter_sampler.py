"""stabilizer.SinterSampler (stabilizer/sinter_sampler.py): a sinter.Sampler whose logical error rates
equal sinter's stim + PyMatching within sampling noise, usable by name in sinter.collect."""

from __future__ import annotations

import numpy as np
import pytest

sinter = pytest.importorskip("sinter", reason="stabilizer.SinterSampler needs sinter (the sampler extra)")
stim = pytest.importorskip("stim")
pytest.importorskip("pymatching", reason="SinterSampler decodes with PyMatching by default")

import stabilizer  # noqa: E402


def _task(d: int, p: float) -> sinter.Task:
    c = stim.Circuit.generated("surface_code:rotated_memory_x", distance=d, rounds=d, after_clifford_depolarization=p,
                               before_measure_flip_probability=p, after_reset_flip_probability=p,
                               before_round_data_depolarization=p)
    return sinter.Task(circuit=c, json_metadata={"d": d, "p": p})


def _within_5_sigma(errors_a: int, shots_a: int, errors_b: int, shots_b: int) -> bool:
    pa, pb = errors_a / shots_a, errors_b / shots_b
    pooled = (errors_a + errors_b) / (shots_a + shots_b)
    sigma = np.sqrt(max(pooled * (1 - pooled), 1 / (shots_a + shots_b)) * (1 / shots_a + 1 / shots_b))
    return abs(pa - pb) <= 5 * sigma


def test_logical_error_rate_equals_stim_and_pymatching():
    """At d = 3, p = 1% (about 4% logical errors), the compiled sampler's error count over 2^15 shots is
    within 5 sigma of stim's detector sampler decoded by the same PyMatching graph, and its stats
    count every shot it took."""
    task = _task(3, 0.01)
    compiled = stabilizer.SinterSampler(seed=1).compiled_sampler_for_task(task)
    stats = compiled.sample(1 << 15)
    assert stats.shots == 1 << 15 and stats.discards == 0
    dets, obs = task.circuit.compile_detector_sampler(seed=1).sample(1 << 15, separate_observables=True, bit_packed=True)
    decoder = sinter.BUILT_IN_DECODERS["pymatching"].compile_decoder_for_dem(
        dem=task.circuit.detector_error_model(decompose_errors=True))
    theirs = int(np.count_nonzero(np.any(decoder.decode_shots_bit_packed(bit_packed_detection_event_data=dets) ^ obs,
                                         axis=1)))
    assert 0.01 < stats.errors / stats.shots < 0.1, stats
    assert _within_5_sigma(stats.errors, stats.shots, theirs, 1 << 15), (stats.errors, theirs)
    assert compiled.sample(5).shots >= 5  # sinter may ask for few shots: a call takes at least that many


def test_collect_runs_it_by_decoder_name():
    """sinter.collect takes it as a custom decoder by name, in its worker process."""
    stats = sinter.collect(num_workers=1, tasks=[_task(3, 0.02)], decoders=["ours"], max_shots=2000,
                           custom_decoders={"ours": stabilizer.SinterSampler()})
    assert len(stats) == 1 and stats[0].decoder == "ours" and stats[0].shots >= 2000
    assert 0 < stats[0].errors < stats[0].shots


def test_an_unknown_decoder_is_refused_by_name():
    with pytest.raises(ValueError, match="not 'no-such-decoder'"):
        stabilizer.SinterSampler("no-such-decoder")
