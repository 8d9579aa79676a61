"""The samplers' CPU engine: the flat frame program and the noiseless reference shot as C loops (_frames.c,
compiled when the package is installed: a sampler's first call compiles nothing).

On CPUs the JAX frame program (frames.py) is one XLA program per bucket of sizes, which XLA:CPU compiles in
seconds on a small machine (a d = 5 surface code's first sample: about 7 s on an empty cache, 2-core CPU,
2026-11-29), and the reference shot's tableau program as much again. This module runs the same flat
program (`stabilizer.circuits.program.flatten`: the same op table, every op kind with the rule frames.py
gives it, loops as loop rows) in C:

  sample     Pauli frames of 64 shots a uint64 word, in chunks of CHUNK_WORDS words (a chunk's frames and
             record stay in the cache), the chunks on several threads (OpenMP, where the compiler has it;
             STABILIZER_NATIVE_THREADS, default every core the process may use); noise by geometric gap
             sampling as Stim does (a p = 1e-3 channel costs about p random draws a bit), its own
             xoshiro256** stream a chunk, seeded from (seed, call, chunk), so a seed's shots do not depend
             on the threads or the layout asked for (they are not the JAX program's shots for that seed,
             as the GPU kernel's are not). Outputs: XORs of record rows, flipped where `invert`, written
             straight into Stim's layouts (bool, or bit-packed little-endian bytes).
  reference  the noiseless record on the inverse tableau (Stim's convention, as tableau.py), random outcomes
             taken as 0 (Stim's reference sample).

Every array is checked for its type and C order before its address goes to C (a TypeError otherwise, never
read as something it is not). Importing this module fails (ImportError) where the library was not built (no
C compiler at install: setup.py builds it as optional); the samplers then run the JAX programs
(sampler.native_engine).
"""

from __future__ import annotations

import ctypes
import importlib
import os
from typing import NamedTuple

import numpy as np

from ..circuits import program

# the C library, built at install (setup.py); ImportError where it was not. (By name: `from . import _frames`
# reads to the import graph as an import of this package, whose samplers import this module.)
_frames = importlib.import_module(__name__.rpartition(".")[0] + "._frames")

THREADS = "STABILIZER_NATIVE_THREADS"  # threads a sample runs its chunks on (default: every core the process may use)
CHUNK_WORDS = 16  # words (of 64 shots) a chunk: 1,024 shots, whose frames and record stay in the cache
CHUNK_RECORD_BYTES = 1 << 24  # a chunk's record at most this large: circuits with many measurements take fewer words
PROG_FIELDS = ("kind", "slots", "gate", "advance", "is_else", "loop_level", "loop_start", "loop_count")
RESET, PX, PZ, INVERT = 1, 2, 4, 8  # a slot's flags

_LIB = ctypes.CDLL(_frames.__file__)
_P, _I, _U = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64


def _declare(name: str, restype, *argtypes):
    f = getattr(_LIB, name)
    f.restype, f.argtypes = restype, argtypes
    return f


_frames_sample = _declare("frames_sample", _I, *[_I] * 6, *[_P] * 4, _I, _P, _P, _P, _I, _P, _P, _P, _P, _I, _P,
                          _I, _I, _I, _U, _U, _I)
_reference_record = _declare("reference_record", _I, *[_I] * 6, *[_P] * 5)
_openmp = _declare("openmp", _I)


def openmp() -> bool:
    """Whether the library was built with OpenMP (chunks of shots on several threads)."""
    return bool(_openmp())


def _at(a: np.ndarray, dtype) -> int:
    """The address of a C-ordered array of `dtype` (the C loops index it as such: anything else is refused)."""
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        what = type(a).__name__ if not isinstance(a, np.ndarray) else \
            f"{'C-ordered' if a.flags.c_contiguous else 'strided'} {a.dtype}"
        raise TypeError(f"the native sampler takes C-ordered {np.dtype(dtype)} arrays here, not {what}")
    return a.ctypes.data


def threads() -> int:
    """Threads a sample runs on: STABILIZER_NATIVE_THREADS (a positive integer), else every core the process
    may use."""
    value = os.environ.get(THREADS)
    if value is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{THREADS} must be a positive integer, not {value!r}")
    return n


class Program:
    """A lowered program's flat table (`program.flatten`) packed for the C loops:

      prog  (ops, 8) int32: PROG_FIELDS (slots: the op's active slots, a prefix of its row)
      probs (ops, 15) float64
      slots (ops, width, 4) int32: q0, q1, rec, flags (RESET, PX, PZ, INVERT); the spare qubit is
            `num_qubits` (one frame row past the circuit's qubits)

    with the gate catalogue's tables: forward images (frames), Heisenberg images and signs (tableau)."""

    def __init__(self, flat: program.Flat, num_qubits: int, num_measurements: int):
        t, ops = flat.table, flat.ops
        take = lambda name: np.asarray(t[name])[:ops]
        active = take("active")
        count = active.sum(axis=1)
        if np.any(active != (np.arange(active.shape[1]) < count[:, None])):
            raise ValueError("an op's active slots are not a prefix of its row")
        gate = take("gate")
        if np.any(np.where(active, gate != gate[:, :1], False) & (take("kind") == program.GATE)[:, None]):
            raise ValueError("the native sampler runs one gate an op (a program lowered without merge_gates)")
        self.prog = np.ascontiguousarray(np.stack(
            [take("kind"), count, gate[:, 0], take("advance"), take("is_else"), take("loop_level"), take("loop_start"),
             take("loop_count")], axis=1).astype(np.int32))
        self.probs = np.ascontiguousarray(take("probs"), np.float64)
        q = np.minimum(take("q"), num_qubits)  # flatten's spare (its last qubit row) -> num_qubits
        flags = (take("reset") * RESET | take("px") * PX | take("pz") * PZ | take("invert") * INVERT).astype(np.int32)
        self.slots = np.ascontiguousarray(np.stack([q[..., 0], q[..., 1], take("rec"), flags], axis=-1), np.int32)
        self.ops, self.width = ops, self.slots.shape[1]
        self.depth = flat.depth
        self.num_qubits, self.num_measurements = num_qubits, num_measurements
        _, forward, image, sign = program.gate_catalogue()
        self.forward, self.image, self.sign = (np.ascontiguousarray(a, np.int32) for a in (forward, image, sign))

    def chunk_words(self, shots: int) -> int:
        """Words a chunk of a `shots`-shot sample: CHUNK_WORDS, fewer where the record would outgrow
        CHUNK_RECORD_BYTES or the shots fill fewer."""
        fit = max(1, CHUNK_RECORD_BYTES // (8 * max(1, self.num_measurements)))
        return max(1, min(CHUNK_WORDS, fit, -(-shots // 64)))


class Output(NamedTuple):
    """An output's rows: row i is the XOR of the record rows idx[ptr[i]:ptr[i + 1]], flipped where invert[i]."""

    ptr: np.ndarray  # (rows + 1,) int64
    idx: np.ndarray  # (nnz,) int32
    invert: np.ndarray  # (rows,) uint8
    rows: int


def output(lists: list[list[int]], invert=None) -> Output:
    """The Output of rows that XOR the listed record rows (flipped where invert, a bool per row or None)."""
    lengths = np.fromiter((len(ix) for ix in lists), np.int64, len(lists))
    ptr = np.zeros(len(lists) + 1, np.int64)
    np.cumsum(lengths, out=ptr[1:])
    idx = np.fromiter((i for ix in lists for i in ix), np.int32, int(ptr[-1]))
    flips = np.zeros(len(lists), np.uint8)
    if invert is not None:
        flips[:] = np.asarray(invert, bool)
    return Output(ptr, idx, flips, len(lists))


def sample(prog: Program, outputs: list[Output], shots: int, bit_packed: bool, seed: tuple[int, int]) -> list[np.ndarray]:
    """`shots` shots of the program's frames, each output in Stim's layout: (shots, rows) bool, or
    (shots, ceil(rows / 8)) uint8 bit-packed little-endian. seed: two 64-bit words (the sampler's seed and its
    call count); chunk c of a sample draws from the stream (seed, c)."""
    if not 1 <= len(outputs) <= 2:
        raise ValueError(f"the native sampler writes one or two outputs a call, not {len(outputs)}")
    m = prog.num_measurements
    for o in outputs:
        if o.idx.size and (o.idx.min() < 0 or o.idx.max() >= m):
            raise ValueError(f"an output reads record rows outside the {m} measurements")
        if o.ptr.shape != (o.rows + 1,) or o.invert.shape != (o.rows,) or o.ptr[-1] != o.idx.size:
            raise ValueError("an output's row pointers, invert flags and indices disagree")
    arrays = [np.empty((shots, -(-o.rows // 8) if bit_packed else o.rows), np.uint8 if bit_packed else np.bool_)
              for o in outputs]
    args = []
    for o, a in zip(outputs + outputs[:1] * (2 - len(outputs)), arrays + arrays[:1] * (2 - len(arrays))):
        args += [_at(o.ptr, np.int64), _at(o.idx, np.int32), _at(o.invert, np.uint8), o.rows,
                 _at(a, np.uint8 if bit_packed else np.bool_)]
    status = _frames_sample(prog.ops, prog.width, prog.num_qubits + 1, m, prog.depth, prog.num_qubits,
                            _at(prog.prog, np.int32), _at(prog.probs, np.float64), _at(prog.slots, np.int32),
                            _at(prog.forward, np.int32), len(outputs), *args, int(bit_packed), shots,
                            prog.chunk_words(shots), seed[0] & (2**64 - 1), seed[1] & (2**64 - 1), threads())
    if status:
        raise MemoryError("the native sampler could not allocate a chunk's frames and record")
    return arrays


def reference(prog: Program) -> np.ndarray:
    """The noiseless measurement record, random outcomes taken as 0 (Stim's reference sample), as bools."""
    record = np.zeros(prog.num_measurements, np.uint8)
    status = _reference_record(prog.ops, prog.width, prog.num_qubits, prog.num_measurements, prog.depth,
                               prog.num_qubits, _at(prog.prog, np.int32), _at(prog.slots, np.int32),
                               _at(prog.image, np.int32), _at(prog.sign, np.int32), _at(record, np.uint8))
    if status == -1:
        raise MemoryError(f"no memory for the reference shot's tableau of {prog.num_qubits} qubits")
    if status:
        raise RuntimeError("the reference shot's gate tables gave a non-Hermitian row (a wrong gate catalogue)")
    return record.astype(bool)
