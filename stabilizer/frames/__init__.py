"""The frame engine: Pauli frames of many shots, and the compiled samplers built on them.

  frames        Pauli frames of all shots as bit-parallel words (32 shots a uint32) through a lowered
                program: gates conjugate frames, noise XORs sparse random flips in, measurements
                record flips; on GPUs the program runs as frame_kernel, elsewhere as one loop over a
                flat table (sizes bucketed: circuits of similar size share the compiled program)
  frame_kernel  the frame program on GPUs: one Pallas kernel runs a whole op table for a block of shots
  native        the samplers' CPU engine: the same flat program and the reference shot's tableau as C
                loops (_frames.c, compiled at install: nothing to compile at run time), chunks of shots
                on several threads, outputs written in Stim's layouts; absent (ImportError) where the
                library was not built
  sampler       `compile_sampler`, `compile_detector_sampler`: a noiseless reference shot on the
                tableau, then frames for all shots in chunks; the outputs (XORs of record rows, a bit
                transpose to Stim's shot-major layouts) built on the device. On CPUs with the C library
                (`native_engine`; STABILIZER_NATIVE=0 turns it off, =host on beside a GPU) both run in native

Imports stabilizer.tableau (the reference shot, the kernel mode and word helpers) and
stabilizer.circuits. The names of frames.py and the samplers are this package's too, as
`stabilizer.frames.run_program(...)`; the modules read their own globals, so patch those (in
stabilizer.frames.frames, stabilizer.frames.sampler), not the copies here.
"""

from .frames import (COMPILER_OPTIONS, FLAT_STATIC, FLIP, KERNEL_STATIC, NOISY_KINDS, PAIR_EVENTS, ROUND_RATE, SPARSE_MAX,
                     Draw, Frames, flat_record, flip_budget, frame_engine, kernel_record, noise_limits, noise_masks, pack,
                     random_bits, run_program, uniform64, zeros)
from .sampler import (CompiledDetectorSampler, CompiledMeasurementSampler, chunk_words, compile_detector_sampler,
                      compile_sampler, reference_sample, shot_major, transpose_words, xor_rows)

__all__ = ["COMPILER_OPTIONS", "FLAT_STATIC", "FLIP", "KERNEL_STATIC", "NOISY_KINDS", "PAIR_EVENTS", "ROUND_RATE",
           "SPARSE_MAX", "CompiledDetectorSampler", "CompiledMeasurementSampler", "Draw", "Frames", "chunk_words",
           "compile_detector_sampler", "compile_sampler", "flat_record", "flip_budget", "frame_engine", "kernel_record",
           "noise_limits", "noise_masks", "pack", "random_bits",
           "reference_sample", "run_program", "shot_major", "transpose_words", "uniform64", "xor_rows", "zeros"]
