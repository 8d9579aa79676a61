"""The native CPU engine: the tiled engine's units as loops over words, in C (_native.c, compiled when the
package is installed: a process's first call compiles nothing).

On CPUs a pass of the tiled engine (tiled.py) is some thirty XLA:CPU ops of gathers and scatters
over every word, 5-7 ns an element each; a C loop visits each word once a gate and does all of that
gate's work on it. It runs the same units as the tiled engine (schedule.units with layers) with the
same arithmetic and the same truncation decisions, so values, term counts and dropped norms agree
with the tiled engine's (tests/pauliprop/propagation/test_native.py):

  Clifford run  each word through the run's dense map (`chunk_tables`: a lookup a non-zero byte of
                the word, so sparse words cost a few lookups), or gate by gate where the weight
                rule applies after every gate; then the unit's end rules.
  rotation      a layer's rotations one after another (each word meets them in the layer's order,
                as the tiled engine's passes make it do). A rotation by G
                lists the words that anticommute with G, pairs each with its partner P xor G
                through a hash table keyed by the pair's canonical member (a table stamped per
                pass: nothing to clear), mixes each pair in place, appends the missing partners,
                applies the rules to what changed and fills the holes of what they dropped from
                the end of the buffer.
  channel       each word's coefficient scaled by its code's factor at each channel.
  truncate      the rules on every word (per="layer": the end of a step).

The buffers are numpy arrays the caller grows (no program depends on a capacity): a rotation whose
appended words would not fit returns the slots it needs before writing anything, and the caller
resumes at that rotation in larger buffers. The loop over units is C's too (`run`: one ctypes call a
run, the GIL released throughout, so a thread that traces a GPU program beside it costs it nothing), once
per coefficient type (float64, float32). From THREAD_MIN live words a unit runs on several threads
(OpenMP, where the compiler had it; PAULIPROP_NATIVE_THREADS, default every core the process may use):
Clifford runs, channels and rules by buckets; a rotation's turning lists by ranges of buckets, then its
bucket pairs by ranges of pairs (8 ranges a thread, handed out as threads come free), a barrier between;
a layout (laid_out) by ranges of the old buckets, each word where one thread puts it.

Importing this module fails (ImportError) where the C library was not built (no C compiler at install:
setup.py builds it as optional); propagate.native_engine then runs CPUs' concrete calls on XLA's engines.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from typing import NamedTuple

import numpy as np

from ..algebra.clifford import CHUNK, popcount
from ..runtime import memory
from . import _native  # the C library, built at install (setup.py); ImportError where it was not
from . import schedule
from .truncation import Limits, Rules


def slot_bytes(lanes: int, coeff_bytes: int) -> int:
    """Bytes a slot of the buffers takes: word, coefficient, sines, gone flag, holes, partner, turning list
    (the pair table: 32 bytes a slot of one bucket)."""
    return 8 * lanes + coeff_bytes + 4 + 1 + 4 + 4 + 4


# ---- host tables ----------------------------------------------------------------------------------------

def chunk_tables(image_x: np.ndarray, image_z: np.ndarray, phase: np.ndarray):
    """clifford.chunk_tables in numpy: for each byte c of a packed word (x lanes, then z lanes) and each
    value b of it, the XOR of the images of the generators set in b and its phase term (the sum of
    their phases plus twice the parity of the crossings among them, in generator order).
    Returns (tx, tz, te): (8 W, 256, W) uint32 twice and (8 W, 256) int32."""
    two_n, w = image_x.shape
    chunks = two_n // CHUNK
    ix = image_x.reshape(chunks, CHUNK, w).astype(np.uint32)
    iz = image_z.reshape(chunks, CHUNK, w).astype(np.uint32)
    ph = phase.reshape(chunks, CHUNK).astype(np.int64)
    # cross[c, j, k] = parity(iz_j & ix_k) for generators j < k of chunk c
    cross = (popcount(iz[:, :, None, :] & ix[:, None, :, :]).sum(-1) & 1) * np.triu(np.ones((CHUNK, CHUNK), np.int64), 1)
    tx = np.zeros((chunks, 256, w), np.uint32)
    tz = np.zeros((chunks, 256, w), np.uint32)
    te = np.zeros((chunks, 256), np.int64)
    for b in range(1, 256):  # b = its lowest bit j, then the rest r (built before b)
        j = (b & -b).bit_length() - 1
        r = b & (b - 1)
        rest_bits = [k for k in range(CHUNK) if r >> k & 1]
        tx[:, b] = tx[:, r] ^ ix[:, j]
        tz[:, b] = tz[:, r] ^ iz[:, j]
        te[:, b] = te[:, r] + ph[:, j] + 2 * cross[:, j, rest_bits].sum(-1)
    return tx, tz, (te & 3).astype(np.int32)


class Tables:
    """The numpy tables of a lowered circuit that run reads (built once; propagate caches them)."""

    def __init__(self, sched: schedule.Schedule, units: schedule.Units):
        w = sched.num_lanes
        self.lanes = w
        self.unit_kind, self.unit_start = units.kind.astype(np.int64), units.start.astype(np.int64)
        self.unit_count, self.unit_dense = units.count.astype(np.int64), units.dense.astype(np.bool_)
        self.unit_defer = units.defer.astype(np.bool_)
        self.cl_kind = sched.cl_kind.astype(np.int64)
        self.cl_qubits = sched.cl_qubits.reshape(-1, 2).astype(np.int64)
        self.cl_table = sched.cl_table.reshape(-1, 16).astype(np.int64)
        self.cl_sign = sched.cl_sign.reshape(-1, 16).astype(np.int64)
        self.cl_gens = np.concatenate([sched.cl_gx.reshape(-1, w), sched.cl_gz.reshape(-1, w)], 1).astype(np.uint32)
        self.cl_turns = sched.cl_turns.astype(np.int64)
        maps = [chunk_tables(x, z, p) for x, z, p in zip(sched.map_x, sched.map_z, sched.map_phase)]
        self.map_tx = np.stack([m[0] for m in maps]) if maps else np.zeros((0, 8 * w, 256, w), np.uint32)
        self.map_tz = np.stack([m[1] for m in maps]) if maps else np.zeros((0, 8 * w, 256, w), np.uint32)
        self.map_te = np.stack([m[2] for m in maps]) if maps else np.zeros((0, 8 * w, 256), np.int32)
        self.rot_gens = np.concatenate([sched.rot_gx.reshape(-1, w), sched.rot_gz.reshape(-1, w)], 1).astype(np.uint32)
        self.rot_index, self.rot_scale, self.rot_offset = sched.rot_index, sched.rot_scale, sched.rot_offset
        self.ch_qubit = sched.ch_qubit.astype(np.int64)
        self.ch_factor = sched.ch_factor.reshape(-1, 4).astype(np.float64)
        self.last_layout: tuple | None = None  # (k, cap) of the last run's buckets: the next run starts there
        self.c_tables = _CircuitTables(
            len(self.unit_kind), w, *(_at(a, t) for a, t in (
                (self.unit_kind, _I64), (self.unit_start, _I64), (self.unit_count, _I64), (self.unit_dense, _B),
                (self.unit_defer, _B), (self.cl_kind, _I64), (self.cl_qubits, _I64), (self.cl_table, _I64),
                (self.cl_sign, _I64), (self.cl_gens, _U32), (self.cl_turns, _I64), (self.map_tx, _U32),
                (self.map_tz, _U32), (self.map_te, _I32), (self.rot_gens, _U32), (self.ch_qubit, _I64),
                (self.ch_factor, _F64))))

    def angles(self, params: np.ndarray) -> np.ndarray:
        """Each rotation's angle (engine.rotation_angle on the host)."""
        p = params[np.maximum(self.rot_index, 0)] if params.shape[0] else np.zeros(self.rot_index.shape, params.dtype)
        return np.where(self.rot_index >= 0, self.rot_scale.astype(params.dtype) * p, 0) + self.rot_offset.astype(params.dtype)


# ---- buffers ---------------------------------------------------------------------------------------------

class Workspace(NamedTuple):
    """A run's buffers: 2^k buckets of `cap` slots each (C = cap << k slots), bucket b's live words in
    [b cap, b cap + count[b]); the passes' scratch in the same geometry."""

    words: np.ndarray  # (C, 2W) uint32: x lanes, then z lanes
    coeffs: np.ndarray  # (C,)
    sins: np.ndarray  # (C,) int32: the sine branches of each path (max_sins)
    gone: np.ndarray  # (C,) uint8: 1 where a unit dropped the word, until its holes are filled (all 0 between)
    holes: np.ndarray  # (C,) int32: the slots a unit dropped, per bucket
    partner: np.ndarray  # (C,) int32: a rotation's pairing
    turning: np.ndarray  # (C,) int32: the slots of the words a rotation turns, per bucket
    table: np.ndarray  # (4 cap,) int64: a bucket pair's hash table, -1 where empty (cleared after each pair)
    count: np.ndarray  # (2^k,) int64: live words of each bucket
    turning_count: np.ndarray  # (2^k,) int64: a rotation's turning words of each bucket

    @property
    def cap(self) -> int:
        return int(self.coeffs.shape[0]) // len(self.count)

    @property
    def bucket_bits(self) -> int:
        """k of the 2^k buckets."""
        return len(self.count).bit_length() - 1

    @property
    def capacity(self) -> int:
        return int(self.coeffs.shape[0])

    @property
    def n(self) -> int:
        return int(self.count.sum())


_KEPT: dict = {}  # the last run's buffers, (k, cap, lanes, dtype) -> Workspace: the next run's, if it lays out alike
_KEPT_LOCK = threading.Lock()


def keep_workspace(ws: Workspace) -> None:
    """Keep a finished run's buffers for the next run (they are left fit: flags clear, table empty)."""
    with _KEPT_LOCK:
        _KEPT.clear()
        _KEPT[(ws.bucket_bits, ws.cap, ws.words.shape[1] // 2, ws.coeffs.dtype.name)] = ws


def empty_workspace(k: int, cap: int, lanes: int, dtype) -> Workspace:
    """Buffers of 2^k buckets of `cap` slots (a power of two), none live: the kept ones where they have
    this shape (their pages already mapped: fresh ones cost the operating system's zeroing), else new."""
    if cap & (cap - 1):
        raise ValueError(f"bucket capacity {cap} is not a power of two")
    with _KEPT_LOCK:
        ws = _KEPT.pop((k, cap, lanes, np.dtype(dtype).name), None)
    if ws is not None:
        ws.count[:] = 0
        return ws
    c = cap << k
    slots = lambda t: np.empty(c, t)
    return Workspace(np.empty((c, 2 * lanes), np.uint32), slots(dtype), slots(np.int32), np.zeros(c, np.uint8),
                     slots(np.int32), slots(np.int32), slots(np.int32), np.full(4 * cap, -1, np.int64),
                     np.zeros(1 << k, np.int64), np.zeros(1 << k, np.int64))


TARGET_BUCKET = 2048  # live words a bucket holds on average after a layout: a bucket pair's words fit the L2 cache
MAX_BUCKET_BITS = 24
MIN_BUCKET_CAP = 64


def hash_rows(lanes: int) -> np.ndarray:
    """(MAX_BUCKET_BITS, 2W) uint32: random linear functionals on the words' bits, whose parities are the
    bucket's bits (fixed seed: a run's layout does not depend on the process)."""
    return np.random.default_rng(20261129).integers(0, 1 << 32, (MAX_BUCKET_BITS, 2 * lanes), dtype=np.uint32)


def bucket_bits(n: int) -> int:
    """The k of 2^k buckets for n live words: about TARGET_BUCKET words a bucket."""
    return int(min(MAX_BUCKET_BITS, max(0, math.floor(math.log2(max(n, 1) / TARGET_BUCKET)) + 1)))


def laid_out(ws: Workspace, hashes: np.ndarray, k: int, cap_at_least: int, most_slots: int,
             threads_at_most: int | None = None) -> tuple:
    """(the live words of ws in 2^k buckets by `hashes` (their first k rows), each bucket of at least
    cap_at_least slots and twice its words; the slots that takes). The workspace is None where that is
    more than most_slots. From THREAD_MIN live words on threads as `run`'s units (the same layout: one H200
    host's 16 cores, 2026-11-29, the 8x8 Ising's 19 layouts took 0.8 s of its 3.7 s first call on one)."""
    threads_ = _threads_at_most(threads_at_most) if ws.n >= THREAD_MIN else 1
    per_part = _count_buckets(ws.words, ws.count, ws.cap, hashes, k, threads_)
    most = int(per_part.sum(axis=0).max(initial=0))
    cap = max(MIN_BUCKET_CAP, cap_at_least, 1 << max(0, 2 * most - 1).bit_length())
    if cap << k > most_slots:
        return None, cap << k
    new = empty_workspace(k, cap, ws.words.shape[1] // 2, ws.coeffs.dtype)
    _rebucket(ws.words, ws.coeffs, ws.sins, ws.count, ws.cap, new.words, new.coeffs, new.sins, new.count, cap, hashes, k,
              per_part)
    return new, cap << k


def loaded(words: np.ndarray, coeffs: np.ndarray, dtype) -> Workspace:
    """The observable's words (distinct) as one bucket."""
    t = len(words)
    ws = empty_workspace(0, max(MIN_BUCKET_CAP, 1 << max(0, t - 1).bit_length()), words.shape[1] // 2, dtype)
    ws.words[:t], ws.coeffs[:t], ws.sins[:t] = words, coeffs, 0
    ws.count[0] = t
    return ws


class Progress(NamedTuple):
    """Where a call of `run` stopped."""

    unit: int  # the next unit (the number of units: done)
    step: int  # the rotation of that unit to resume at
    need: int  # > 0: the slots a bucket of the stopped rotation needed (it wrote nothing)
    peak: int  # the most live terms after any pass
    threads: int = 1  # the most threads a unit of the call ran on


def run(tables: Tables, ws: Workspace, hashes: np.ndarray, unit: int, step: int, cos: np.ndarray, sin: np.ndarray,
        limits: Limits, rules: Rules, unit_terms: np.ndarray, dropped: np.ndarray,
        peak: int, threads_at_most: int | None = None) -> Progress:
    """Apply the units from `unit` (rotation `step` of it) to the live words of ws. hashes: the bucket
    functionals, which follow the words through the Clifford units (updated in place). limits and rules:
    the truncation's (Truncation.limits in the coefficients' dtype, Truncation.rules). Writes the live terms
    after each unit into unit_terms (int32) and adds the 1-norm each rule dropped into dropped (float64).

    The loop over units is C's too: one call, the GIL released throughout (a thread of this process that
    runs Python, as a GPU program's compilation does, never waits on it unit by unit). From THREAD_MIN live
    words a unit runs on threads() threads, or on threads_at_most (cores left to other work of the process,
    such as a GPU program's compilation)."""
    c = ws.coeffs
    if hashes.shape[0] < ws.bucket_bits or hashes.shape[1] != 2 * tables.lanes or ws.words.shape[1] != 2 * tables.lanes:
        raise ValueError(f"hashes {hashes.shape} and words {ws.words.shape} for {ws.bucket_bits} bucket bits and "
                         f"{tables.lanes} lanes")
    if len(unit_terms) < len(tables.unit_kind) or len(dropped) < 3:
        raise ValueError("unit_terms needs a slot per unit and dropped one per rule")
    for a in (cos, sin):
        if len(a) < len(tables.rot_gens):
            raise ValueError(f"{len(a)} angles' cos or sin for {len(tables.rot_gens)} rotations")
    work = _Workspace(_at(ws.words, _U32), _at(c, c.dtype), _at(ws.sins, _I32), _at(ws.gone, _U8), _at(ws.holes, _I32),
                      _at(ws.partner, _I32), _at(ws.turning, _I32), _at(ws.table, _I64), _at(ws.count, _I64),
                      _at(ws.turning_count, _I64), len(ws.count), len(ws.words), len(ws.table))
    out = np.zeros(5, np.int64)
    filled = limits.filled()  # the C loops hold every rule: an off one drops nothing
    max_weight, min_abs, max_sins = int(filled.max_weight), float(filled.min_abs_coeff), int(filled.max_sins)
    _kernels(c).run(ctypes.byref(tables.c_tables), ctypes.byref(work), _at(hashes, _U32), unit, step,
                    _at(cos, c.dtype), _at(sin, c.dtype), max_weight, min_abs, max_sins, rules.per == "layer",
                    rules.weight_each_gate, _threads_at_most(threads_at_most), THREAD_MIN, _at(unit_terms, _I32),
                    _at(dropped, _F64), peak, out.ctypes.data)
    return Progress(*(int(v) for v in out))


# ---- the C loops (_native.c) ----------------------------------------------------------------------------

_LIB = ctypes.CDLL(_native.__file__)
_P, _I, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


def _declare(name: str, restype, *argtypes):
    f = getattr(_LIB, name)
    f.restype, f.argtypes = restype, argtypes
    return f


_count_buckets_c = _declare("count_buckets", None, _I, _P, _P, _I, _I, _P, _I, _P, _I)
_layout_parts = _declare("layout_parts", _I, _I, _I, _I)


class _CircuitTables(ctypes.Structure):
    """_native.c's circuit_tables: a Tables' arrays by address (the Tables keeps them alive)."""

    _fields_ = [("units", _I), ("lanes", _I)] + [(name, _P) for name in (
        "unit_kind", "unit_start", "unit_count", "unit_dense", "unit_defer", "cl_kind", "cl_qubits", "cl_table",
        "cl_sign", "cl_gens", "cl_turns", "map_tx", "map_tz", "map_te", "rot_gens", "ch_qubit", "ch_factor")]


class _Workspace(ctypes.Structure):
    """_native.c's workspace: a Workspace's arrays by address, its buckets, slots and pair-table entries."""

    _fields_ = [(name, _P) for name in ("words", "coeffs", "sins", "gone", "holes", "partner", "turning", "table",
                                        "count", "turning_count")] + [("buckets", _I), ("slots", _I), ("table_size", _I)]


class _Kernels(NamedTuple):
    """The loops of one coefficient type (_native_kernels.h)."""

    run: object
    rebucket: object
    value: object


def _kernels_of(suffix: str) -> _Kernels:
    return _Kernels(
        _declare(f"run_{suffix}", None, ctypes.POINTER(_CircuitTables), ctypes.POINTER(_Workspace), _P, _I, _I, _P, _P,
                 _I, _D, _I, _I, _I, _I, _I, _P, _P, _I, _P),
        _declare(f"rebucket_{suffix}", None, _I, *[_P] * 5, _I, _I, *[_P] * 4, _I, _P, _I, _I),
        _declare(f"value_{suffix}", _D, *[_P] * 3, _I, _I, _P, _I))


_KERNELS = {np.dtype(np.float64): _kernels_of("f64"), np.dtype(np.float32): _kernels_of("f32")}


def _kernels(coeffs: np.ndarray) -> _Kernels:
    try:
        return _KERNELS[coeffs.dtype]
    except KeyError:
        raise TypeError(f"the native engine's coefficients are float64 or float32, not {coeffs.dtype}") from None


def _at(a: np.ndarray, dtype) -> int:
    """The address of a C-ordered array of `dtype` (the C loops index it as such: anything else is refused,
    never read as something it is not)."""
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise TypeError(f"the native engine takes C-ordered {np.dtype(dtype)} arrays here, not "
                        f"{'C-ordered' if a.flags.c_contiguous else 'strided'} {a.dtype}")
    return a.ctypes.data


_U32, _I64, _I32, _U8, _F64, _B = (np.dtype(t) for t in (np.uint32, np.int64, np.int32, np.uint8, np.float64, np.bool_))

_unit_kinds = np.zeros(7, np.int64)
_LIB.unit_kinds(ctypes.c_void_p(_unit_kinds.ctypes.data))
if tuple(_unit_kinds) != (schedule.U_MERGE, schedule.U_CLIFFORD, schedule.U_SPLIT, schedule.U_CHANNEL,
                          schedule.U_TRUNCATE, schedule.U_NOOP, schedule.U_LAYER):  # a library of another version
    raise ImportError(f"the native engine's unit kinds {tuple(_unit_kinds)} are not schedule.py's: rebuild it "
                      "(pip install -e .)")


def _count_buckets(words, bucket_count, cap, hashes, k, threads_: int = 1) -> np.ndarray:
    """(parts, 2^k): each part's live words (in buckets of `cap` slots, the parts ranges of them in order) that fall
    in each bucket of 2^k by the hashes; as many parts as threads_ and the buckets allow (_native.c layout_parts),
    each counted on a thread of its own. Their sum over parts: the new buckets' counts."""
    per_part = np.zeros((_layout_parts(threads_, len(bucket_count), k), 1 << k), np.int64)
    _count_buckets_c(len(per_part), _at(words, _U32), _at(bucket_count, _I64), len(bucket_count), cap,
                     _at(hashes, _U32), k, _at(per_part, _I64), words.shape[1] // 2)
    return per_part


def _rebucket(words, coeffs, sins, bucket_count, cap, new_words, new_coeffs, new_sins, new_count, new_cap, hashes, k,
              per_part: np.ndarray):
    """The live words into 2^k buckets of new_cap slots by the hashes (new_count: zeros, then their counts), in the
    parts _count_buckets counted (per_part: its output, used up here), each word where one thread puts it."""
    if new_coeffs.dtype != coeffs.dtype:
        raise TypeError(f"relaying out {coeffs.dtype} coefficients into {new_coeffs.dtype} ones")
    _kernels(coeffs).rebucket(len(per_part), _at(per_part, _I64), _at(words, _U32), _at(coeffs, coeffs.dtype),
                              _at(sins, _I32), _at(bucket_count, _I64), len(bucket_count), cap, _at(new_words, _U32),
                              _at(new_coeffs, coeffs.dtype), _at(new_sins, _I32), _at(new_count, _I64), new_cap,
                              _at(hashes, _U32), k, words.shape[1] // 2)


def value(words, coeffs, bucket_count, table) -> float:
    """sum over the live words of coefficient * <state| P |state> (algebra.overlap.overlap_table's factors: (32 W, 4))."""
    table = np.ascontiguousarray(table, np.float64)
    if table.shape != (16 * words.shape[1], 4):
        raise ValueError(f"an overlap table of {table.shape} for words of {words.shape[1] // 2} lanes")
    return _kernels(coeffs).value(_at(words, _U32), _at(coeffs, coeffs.dtype), _at(bucket_count, _I64),
                                  len(bucket_count), len(words), _at(table, _F64), words.shape[1] // 2)


def live_terms(ws: Workspace) -> tuple[np.ndarray, np.ndarray]:
    """(words (n, 2W), coeffs (n,)) of the live words, bucket by bucket."""
    cap = ws.cap
    rows = np.concatenate([np.arange(b * cap, b * cap + c) for b, c in enumerate(ws.count.tolist())]) \
        if len(ws.count) else np.zeros(0, np.int64)
    return ws.words[rows], ws.coeffs[rows]


# ---- threads -------------------------------------------------------------------------------------------------

THREADS = "PAULIPROP_NATIVE_THREADS"  # environment: the threads a run's units use (default: every core it may use)
THREAD_MIN = 1 << 15  # live words from which a unit runs on several threads (below, its work is too little for
#                       the threads' start and a rotation's two barriers)
OPENMP = bool(_LIB.openmp())  # whether the library was built with OpenMP (else every unit runs on one thread)


def threads() -> int:
    """The threads a run's units use: PAULIPROP_NATIVE_THREADS, else the cores this process may run on; one
    where the library was built without OpenMP."""
    given = os.environ.get(THREADS, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ValueError(f"{THREADS}={given!r}: give the number of threads, a positive integer")
        return int(given) if OPENMP else 1
    return memory.cores() if OPENMP else 1


def _threads_at_most(most: int | None) -> int:
    """threads(), or fewer where the caller leaves cores to other work (most: None, no limit)."""
    return max(1, min(threads(), most or threads()))
