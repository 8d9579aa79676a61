"""`SinterSampler`: sinter's threshold sweeps with this package's detector sampler.

    import sinter, stabilizer
    stats = sinter.collect(num_workers=1, tasks=tasks, decoders=["ours"], max_shots=100_000,
                           custom_decoders={"ours": stabilizer.SinterSampler()})

sinter (1.14 and later) takes a custom `sinter.Sampler` under a decoder name: for each task it asks
for a compiled sampler, whose `sample(shots)` returns `sinter.AnonTaskStats`. Here a task's circuit is
sampled by `compile_detector_sampler` (detection events and observable flips, bit-packed) and decoded
by a sinter decoder, PyMatching unless another is named. On CPUs the samplers run as C loops
(stabilizer.frames.native): a task compiles nothing. Elsewhere the tasks of a sweep share the frames'
compiled programs (probabilities and repeat counts are data, sizes bucketed), so a sweep over the
noise strength compiles once per size bucket, and the persistent compilation cache (on when
`stabilizer` is imported, see its docstring) carries them to sinter's worker processes.

sinter and the decoders are optional: importing this module needs sinter (the `sampler` extra).
"""

from __future__ import annotations

import numpy as np
import sinter

from .circuits.circuit import Circuit
from .frames.sampler import compile_detector_sampler

# Shots a call takes at most (sinter asks for the shots a worker has left: a bounded batch keeps the
# memory of the outputs and the decoder's input small) and at least (sinter's first calls ask for few
# shots; each distinct chunk size is one more compiled program).
MAX_BATCH = 1 << 17
MIN_BATCH = 1 << 10


def _decoder(decoder) -> sinter.Decoder:
    if isinstance(decoder, sinter.Decoder):
        return decoder
    if isinstance(decoder, str) and decoder in sinter.BUILT_IN_DECODERS:
        return sinter.BUILT_IN_DECODERS[decoder]
    raise ValueError(f"decoder must be a sinter.Decoder or one of sinter's decoder names "
                     f"{sorted(sinter.BUILT_IN_DECODERS)}, not {decoder!r}")


class SinterSampler(sinter.Sampler):
    """A `sinter.Sampler`: detection events from `compile_detector_sampler`, decoded by `decoder` (a
    name in sinter.BUILT_IN_DECODERS, default "pymatching", or a `sinter.Decoder`). seed: the samplers'
    seed (None: fresh entropy in every worker, as sinter's own sampler)."""

    def __init__(self, decoder="pymatching", *, seed: int | None = None):
        _decoder(decoder)  # a bad name fails here, not in a worker
        self.decoder = decoder
        self.seed = seed

    def __repr__(self) -> str:
        return f"stabilizer.SinterSampler(decoder={self.decoder!r})"

    def compiled_sampler_for_task(self, task: sinter.Task) -> sinter.CompiledSampler:
        return CompiledSinterSampler(task, _decoder(self.decoder), seed=self.seed)


class CompiledSinterSampler(sinter.CompiledSampler):
    """One task's sampler and decoder. `sample(shots)` takes between MIN_BATCH and MAX_BATCH shots
    (sinter accepts more or fewer than it suggests) and counts the shots, errors (a predicted
    observable differs) and discards (a postselected detector fired, or a postselected observable was
    mispredicted), as sinter's own sampler does."""

    def __init__(self, task: sinter.Task, decoder: sinter.Decoder, *, seed: int | None = None):
        self.task = task
        dem = task.detector_error_model
        if dem is None:  # sinter's workers pass it; a direct caller may not
            dem = task.circuit.detector_error_model(decompose_errors=True, approximate_disjoint_errors=True)
        self.decoder = decoder.compile_decoder_for_dem(dem=dem)
        self.sampler = compile_detector_sampler(Circuit(task.circuit), seed=seed)
        self.num_obs = task.circuit.num_observables
        mask = task.postselected_observables_mask
        self.obs_mask = None if mask is None else np.asarray(mask, np.uint8)

    def handles_throttling(self) -> bool:
        return True  # batches of fixed sizes, not sinter's ramp from one shot (a compile per size)

    def sample(self, suggested_shots: int) -> sinter.AnonTaskStats:
        import time

        t0 = time.monotonic()
        shots = min(max(int(suggested_shots), MIN_BATCH), MAX_BATCH)
        dets, obs = self.sampler.sample(shots, separate_observables=True, bit_packed=True)
        discards = 0
        if self.task.postselection_mask is not None:
            keep = ~np.any(dets & self.task.postselection_mask, axis=1)
            discards += int(shots - np.count_nonzero(keep))
            dets, obs = dets[keep], obs[keep]
        predictions = self.decoder.decode_shots_bit_packed(bit_packed_detection_event_data=dets)
        if predictions.shape != obs.shape:
            raise ValueError(f"the decoder predicted {predictions.shape} observable bytes for {obs.shape}")
        wrong = obs ^ predictions
        if self.obs_mask is not None:
            postselected = np.any(wrong & self.obs_mask, axis=1)
            discards += int(np.count_nonzero(postselected))
            wrong = wrong[~postselected]
        errors = int(np.count_nonzero(np.any(wrong, axis=1)))
        return sinter.AnonTaskStats(shots=shots, errors=errors, discards=discards, seconds=time.monotonic() - t0)
