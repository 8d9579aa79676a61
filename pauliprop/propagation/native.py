"""The CPU engine compiled by numba (the `native` extra): the tiled engine's units as loops over words.

On CPUs a pass of the tiled engine (tiled.py) is some thirty XLA:CPU ops of gathers and scatters
over every word, 5-7 ns an element each; a loop compiled by numba visits each word once a gate and
does all of that gate's work on it. It runs the same units as the tiled engine (schedule.units with
layers) with the same arithmetic and the same truncation decisions, so values, term counts and
dropped norms agree with the tiled engine's (tests/pauliprop/propagation/test_native.py):

  Clifford run  each word through the run's dense map (`chunk_tables`: a lookup a non-zero byte of
                the word, so sparse words cost a few lookups), or gate by gate where the weight
                rule applies after every gate; then the unit's end rules.
  rotation      a layer's rotations one after another (they act on disjoint qubits, so each word
                meets them in the layer's order, as the tiled engine's passes do). A rotation by G
                lists the words that anticommute with G, pairs each with its partner P xor G
                through a hash table keyed by the pair's canonical member (a table stamped per
                pass: nothing to clear), mixes each pair in place, appends the missing partners,
                applies the rules to what changed and fills the holes of what they dropped from
                the end of the buffer.
  channel       each word's coefficient scaled by its code's factor at each channel.
  truncate      the rules on every word (per="layer": the end of a step).

The buffers are numpy arrays the caller grows (no program depends on a capacity): a rotation whose
appended words would not fit returns the slots it needs before writing anything, and the caller
resumes at that rotation in larger buffers. The loop over units is Python's (`run`): each unit's
function is compiled on its own, once per coefficient dtype, and cached on disk (numba's cache, under
pauliprop's cache directory: `configure_cache`). From THREAD_MIN live words a unit's rotations run on
several threads (PAULIPROP_NATIVE_THREADS, default every core the process may use): each rotation's
turning lists by ranges of buckets, then its bucket pairs by ranges of pairs.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np
from numba import njit

from ..algebra.clifford import CHUNK, popcount
from ..runtime import compilation, memory
from . import schedule
from .truncation import OFF  # a weight or sine limit that never binds

# numba's on-disk cache of these functions: under pauliprop's cache directory, so that one directory holds
# every compiled program of pauliprop (empty it for a cold start), unless NUMBA_CACHE_DIR says otherwise; off
# with PAULIPROP_NO_CACHE, unless NUMBA_CACHE_DIR names a folder. numba reads its CACHE_DIR when a function is
# decorated: it is set for this module's decorators only and restored at the end of the module.
CACHE = not compilation.disabled() or bool(os.environ.get("NUMBA_CACHE_DIR"))
_USERS_CACHE_DIR = numba.config.CACHE_DIR
if CACHE and not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(compilation.cache_directory() / "numba")


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


def laid_out(ws: Workspace, hashes: np.ndarray, k: int, cap_at_least: int, most_slots: int) -> tuple:
    """(the live words of ws in 2^k buckets by `hashes` (their first k rows), each bucket of at least
    cap_at_least slots and twice its words; the slots that takes). The workspace is None where that is
    more than most_slots."""
    counts = np.zeros(1 << k, np.int64)
    _count_buckets(ws.words, ws.count, ws.cap, hashes, k, counts)
    cap = max(MIN_BUCKET_CAP, cap_at_least, 1 << max(0, 2 * int(counts.max(initial=0)) - 1).bit_length())
    if cap << k > most_slots:
        return None, cap << k
    new = empty_workspace(k, cap, ws.words.shape[1] // 2, ws.coeffs.dtype)
    _rebucket(ws.words, ws.coeffs, ws.sins, ws.count, ws.cap, new.words, new.coeffs, new.sins, new.count, cap, hashes, k)
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


def run(tables: Tables, ws: Workspace, hashes: np.ndarray, unit: int, step: int, cos: np.ndarray, sin: np.ndarray,
        limits: tuple, per_layer: bool, weight_each: bool, unit_terms: np.ndarray, dropped: np.ndarray,
        peak: int) -> Progress:
    """Apply the units from `unit` (rotation `step` of it) to the live words of ws. hashes: the bucket
    functionals, which follow the words through the Clifford units (updated in place). limits:
    (max_weight, min_abs_coeff, max_sins), OFF / 0.0 / OFF where a rule is off. Writes the live terms
    after each unit into unit_terms and adds the 1-norm each rule dropped into dropped (float64).

    The loop over units is Python's (a few dozen calls a circuit, microseconds each): each unit's function
    is compiled on its own, so a cold start compiles no program that holds them all again."""
    t, w = tables, tables.lanes
    max_weight, min_abs, max_sins = int(limits[0]), float(limits[1]), int(limits[2])
    for u in range(unit, len(t.unit_kind)):
        kind, start, count = int(t.unit_kind[u]), int(t.unit_start[u]), int(t.unit_count[u])
        # the rules this unit applies (tiled.end_rules; a rotation's own unless its step defers them)
        lw, lc, ls = max_weight, min_abs, max_sins
        if kind in (schedule.U_SPLIT, schedule.U_LAYER) and t.unit_defer[u]:
            lw, lc, ls = OFF, 0.0, OFF
        elif kind == schedule.U_CHANNEL and not per_layer:
            lw, ls = OFF, OFF
        if kind == schedule.U_CLIFFORD:
            clifford = (bool(t.unit_dense[u]), start, count, t.cl_kind, t.cl_qubits, t.cl_table, t.cl_sign,
                        t.cl_gens, t.cl_turns, t.map_tx, t.map_tz, t.map_te)
            _clifford_unit(*clifford, ws.words, ws.coeffs, ws.sins, ws.gone, ws.holes, ws.count, w, weight_each,
                           not weight_each, max_weight, dropped)
            _follow(clifford, hashes, ws.bucket_bits, w, ws.coeffs.dtype)
        elif kind == schedule.U_CHANNEL:
            _channel_unit(start, count, t.ch_qubit, t.ch_factor, ws.words, ws.coeffs, ws.sins, ws.gone, ws.holes,
                          ws.count, w, lw, lc, ls, dropped)
        elif kind == schedule.U_TRUNCATE:
            _rules_unit(ws.words, ws.coeffs, ws.sins, ws.gone, ws.holes, ws.count, w, lw, lc, ls, dropped)
        elif kind in (schedule.U_SPLIT, schedule.U_LAYER):
            parts = min(threads(), len(ws.count) // 2) if ws.n >= THREAD_MIN else 1
            if parts > 1:
                r, need, peak = _rotations_side_by_side(parts, start + step, start + count, cos, sin, t.rot_gens, ws,
                                                        hashes, w, lw, lc, ls, dropped, peak)
            else:
                r, need, peak = _rotations(start + step, start + count, cos, sin, t.rot_gens, ws.words, ws.coeffs,
                                           ws.sins, ws.gone, ws.holes, ws.partner, ws.turning, ws.table, ws.count,
                                           ws.turning_count, hashes, w, lw, lc, ls, dropped, peak)
            if need > 0:
                return Progress(u, r - start, need, peak)
            step = 0
        n = int(ws.count.sum())
        unit_terms[u] = n
        peak = max(peak, n)
    return Progress(len(t.unit_kind), 0, 0, peak)


def _follow(clifford: tuple, hashes: np.ndarray, k: int, w: int, dtype) -> None:
    """The first k bucket functionals through a Clifford run, so that its words stay in their buckets: a
    functional f on the words before the run is f' = S M S f after it (S swaps the x and z halves; M^-1 =
    S M^T S for the symplectic bit map M of the run), so bucket_of(M P) under f' is bucket_of(P) under f.
    The rows go through the run as words would (_clifford_unit on a bucket of k words, no rule)."""
    if k == 0:
        return
    rows = np.concatenate([hashes[:k, w:], hashes[:k, :w]], 1)
    slots = lambda t: np.zeros(k, t)
    _clifford_unit(*clifford, rows, slots(dtype), slots(np.int32), slots(np.uint8), slots(np.int32),
                   np.array([k], np.int64), w, False, False, OFF, np.zeros(3, np.float64))
    hashes[:k, :w], hashes[:k, w:] = rows[:, w:], rows[:, :w]


# ---- word kernels ---------------------------------------------------------------------------------------

@njit(inline="always")
def _pop(v):
    """Set bits of a value below 2^32 (int64)."""
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24) & 0xFF


@njit(inline="always")
def _weight(words, i, w):
    t = 0
    for l in range(w):
        t += _pop(np.int64(words[i, l]) | np.int64(words[i, w + l]))
    return t


@njit(inline="always")
def _anticommutes(words, i, gens, g, w):
    par = 0
    for l in range(w):
        par ^= (np.int64(words[i, l]) & np.int64(gens[g, w + l])) ^ (np.int64(words[i, w + l]) & np.int64(gens[g, l]))
    return _pop(par) & 1


@njit(inline="always")
def _product_sign(words, i, gens, g, w):
    """s with i G P = s (P xor G) for anticommuting P (row i) and G (words.product_sign)."""
    e = 0
    for l in range(w):
        x, z = np.int64(words[i, l]), np.int64(words[i, w + l])
        gx, gz = np.int64(gens[g, l]), np.int64(gens[g, w + l])
        e += _pop(gx & gz) + _pop(x & z) - _pop((x ^ gx) & (z ^ gz)) + 2 * _pop(gz & x)
    return 1.0 if ((e + 1) & 3) == 0 else -1.0


@njit(inline="always")
def _bucket_of(words, i, hashes, k, w):
    """The bucket of row i: bit r is the parity of the word against hash row r."""
    b = 0
    for r in range(k):
        par = 0
        for l in range(2 * w):
            par ^= np.int64(words[i, l]) & np.int64(hashes[r, l])
        b |= (_pop(par) & 1) << r
    return b


@njit(inline="always")
def _violates(c, weight, sins, max_weight, min_abs, max_sins):
    """The rule that drops a term: 0 weight, 1 coefficient, 2 sines (a term is charged to its first),
    -1 none (truncation.violations)."""
    if weight > max_weight:
        return 0
    if abs(c) < min_abs:
        return 1
    if sins > max_sins:
        return 2
    return -1


@njit(inline="always")
def _hash(words, i, gens, g, flip, w):
    """Hash of the canonical member of the pair of word i under G (XOR G when `flip`)."""
    h = np.uint64(0x632BE59BD9B4E019)
    for l in range(2 * w):
        v = np.uint64(words[i, l])
        if flip:
            v ^= np.uint64(gens[g, l])
        h = (h ^ v) * np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return np.int64(h >> np.uint64(1))


@njit(inline="always")
def _same_canonical(words, i, fi, j, fj, gens, g, w):
    for l in range(2 * w):
        a, b = np.int64(words[i, l]), np.int64(words[j, l])
        if fi:
            a ^= np.int64(gens[g, l])
        if fj:
            b ^= np.int64(gens[g, l])
        if a != b:
            return False
    return True


@njit(inline="always")
def _fill_bucket(words, coeffs, sins, gone, holes, base, count, h):
    """Remove the h words listed in holes[base:base + h] (marked in gone) from the bucket's live words
    [base, base + count): the staying words from m = base + count - h on fill the holes below m; clears
    their gone flags. Returns the bucket's new count."""
    m = base + count - h
    src = m
    for k in range(base, base + h):
        d = holes[k]
        if d >= m:
            continue
        while gone[src]:
            src += 1
        for l in range(words.shape[1]):
            words[d, l] = words[src, l]
        coeffs[d] = coeffs[src]
        sins[d] = sins[src]
        src += 1
    for k in range(base, base + h):
        gone[holes[k]] = 0
    return count - h


@njit(inline="always")
def _drop(gone, holes, at, i, dropped, rule, c):
    """Mark slot i gone, listed at holes[at]; its 1-norm charged to `rule`."""
    gone[i] = 1
    holes[at] = i
    dropped[rule] += abs(c)


@njit(inline="always")
def _clifford_word(dense, start, count, cl_kind, cl_qubits, cl_table, cl_sign, cl_gens, cl_turns, map_tx, map_tz,
                   map_te, words, i, w, rx, rz, weight_each, max_weight):
    """Row i through a Clifford run: its image written in place. Returns (sign flipped, dropped by the
    weight rule after a gate (weight_each; the row is then left midway))."""
    negate = False
    if dense:
        e = 0
        cross = 0
        for l in range(w):
            rx[l] = 0
            rz[l] = 0
            e += _pop(np.int64(words[i, l]) & np.int64(words[i, w + l]))
        for lane in range(2 * w):
            v = np.int64(words[i, lane])
            byte_at = 0
            while v != 0:
                b = v & 0xFF
                if b != 0:
                    c = 4 * lane + byte_at
                    for l in range(w):
                        ix = np.int64(map_tx[start, c, b, l])
                        cross ^= rz[l] & ix
                        rx[l] ^= ix
                        rz[l] ^= np.int64(map_tz[start, c, b, l])
                    e += map_te[start, c, b]
                v >>= 8
                byte_at += 1
        y = 0
        for l in range(w):
            y += _pop(rx[l] & rz[l])
            words[i, l] = rx[l]
            words[i, w + l] = rz[l]
        return ((e + 2 * _pop(cross) - y) & 3) != 0, False
    for j in range(start, start + count):
        if cl_kind[j] == schedule.TABLE:
            a, b = cl_qubits[j, 0], cl_qubits[j, 1]
            la, sa, lb, sb = a // 32, a % 32, b // 32, b % 32
            xa, za = (np.int64(words[i, la]) >> sa) & 1, (np.int64(words[i, w + la]) >> sa) & 1
            xb, zb = (np.int64(words[i, lb]) >> sb) & 1, (np.int64(words[i, w + lb]) >> sb) & 1
            code = xa | za << 1 | xb << 2 | zb << 3
            if code == 0:
                continue
            img = cl_table[j, code]
            # clear then set the bits of qubits a and b (for a one-qubit gate a == b: its diagonal code)
            words[i, la] = (np.int64(words[i, la]) & ~(np.int64(1) << sa)) | ((img & 1) << sa)
            words[i, w + la] = (np.int64(words[i, w + la]) & ~(np.int64(1) << sa)) | (((img >> 1) & 1) << sa)
            words[i, lb] = (np.int64(words[i, lb]) & ~(np.int64(1) << sb)) | (((img >> 2) & 1) << sb)
            words[i, w + lb] = (np.int64(words[i, w + lb]) & ~(np.int64(1) << sb)) | (((img >> 3) & 1) << sb)
            if cl_sign[j, code] < 0:
                negate = not negate
        else:  # a quarter turn of a generator on three or more qubits
            k = cl_turns[j] % 4
            if k == 0 or not _anticommutes(words, i, cl_gens, j, w):
                continue
            if k == 2:
                negate = not negate
            else:
                s = _product_sign(words, i, cl_gens, j, w)
                if k == 3:
                    s = -s
                for l in range(2 * w):
                    words[i, l] = np.int64(words[i, l]) ^ np.int64(cl_gens[j, l])
                if s < 0:
                    negate = not negate
        if weight_each and _weight(words, i, w) > max_weight:
            return negate, True
    return negate, False


# ---- units ----------------------------------------------------------------------------------------------

@njit(cache=CACHE, nogil=True)
def _clifford_unit(dense, start, count, cl_kind, cl_qubits, cl_table, cl_sign, cl_gens, cl_turns,
                   map_tx, map_tz, map_te, words, coeffs, sins, gone, holes, bucket_count, w,
                   weight_each, end_weight, max_weight, dropped):
    """A Clifford run on every word, then the weight rule (after each gate when weight_each, else at the
    run's end when end_weight)."""
    cap = words.shape[0] // bucket_count.shape[0]
    rx = np.zeros(w, np.int64)
    rz = np.zeros(w, np.int64)
    for bucket in range(bucket_count.shape[0]):
        base = bucket * cap
        h = 0
        for i in range(base, base + bucket_count[bucket]):
            negate, dead = _clifford_word(dense, start, count, cl_kind, cl_qubits, cl_table, cl_sign, cl_gens,
                                          cl_turns, map_tx, map_tz, map_te, words, i, w, rx, rz, weight_each,
                                          max_weight)
            if negate:
                coeffs[i] = -coeffs[i]
            if dead or (end_weight and _weight(words, i, w) > max_weight):
                _drop(gone, holes, base + h, i, dropped, 0, coeffs[i])
                h += 1
        if h > 0:
            bucket_count[bucket] = _fill_bucket(words, coeffs, sins, gone, holes, base, bucket_count[bucket], h)


@njit(cache=CACHE, nogil=True)
def _rules_unit(words, coeffs, sins, gone, holes, bucket_count, w, max_weight, min_abs, max_sins, dropped):
    """The rules on every word (the end of a deferred step)."""
    cap = words.shape[0] // bucket_count.shape[0]
    for bucket in range(bucket_count.shape[0]):
        base = bucket * cap
        h = 0
        for i in range(base, base + bucket_count[bucket]):
            rule = _violates(coeffs[i], _weight(words, i, w), sins[i], max_weight, min_abs, max_sins)
            if rule >= 0:
                _drop(gone, holes, base + h, i, dropped, rule, coeffs[i])
                h += 1
        if h > 0:
            bucket_count[bucket] = _fill_bucket(words, coeffs, sins, gone, holes, base, bucket_count[bucket], h)


@njit(cache=CACHE, nogil=True)
def _channel_unit(start, count, ch_qubit, ch_factor, words, coeffs, sins, gone, holes, bucket_count, w,
                  max_weight, min_abs, max_sins, dropped):
    """Pauli channels scale each word by its code's factor, then the end rules (per gate the coefficient
    rule: the factors are at most 1 in size; per layer all of them)."""
    cap = words.shape[0] // bucket_count.shape[0]
    for bucket in range(bucket_count.shape[0]):
        base = bucket * cap
        h = 0
        for i in range(base, base + bucket_count[bucket]):
            c = coeffs[i]
            for j in range(start, start + count):
                q = ch_qubit[j]
                code = (((np.int64(words[i, q // 32]) >> (q % 32)) & 1)
                        | (((np.int64(words[i, w + q // 32]) >> (q % 32)) & 1) << 1))
                c *= ch_factor[j, code]
            coeffs[i] = c
            rule = _violates(c, _weight(words, i, w), sins[i], max_weight, min_abs, max_sins)
            if rule >= 0:
                _drop(gone, holes, base + h, i, dropped, rule, c)
                h += 1
        if h > 0:
            bucket_count[bucket] = _fill_bucket(words, coeffs, sins, gone, holes, base, bucket_count[bucket], h)


@njit(inline="always")
def _bits(buckets):
    """k of 2^k buckets."""
    k = 0
    while (1 << k) < buckets:
        k += 1
    return k


@njit(cache=CACHE, nogil=True)
def _turning(g, part, parts, gens, words, bucket_count, turning, turning_count, w):
    """A rotation by G, first step, on part `part` of `parts` of the buckets (a contiguous range): each bucket's
    words that anticommute with G listed in turning (per bucket), their number in turning_count."""
    buckets = bucket_count.shape[0]
    cap = words.shape[0] // buckets
    for bucket in range(part * buckets // parts, (part + 1) * buckets // parts):
        base, t = bucket * cap, 0
        for i in range(base, base + bucket_count[bucket]):
            if _anticommutes(words, i, gens, g, w):
                turning[base + t] = i
                t += 1
        turning_count[bucket] = t


@njit(cache=CACHE, nogil=True)
def _need(g, gens, words, bucket_count, turning_count, hashes, w):
    """0 where every bucket has room for its words and every turning word of its partner bucket (P xor G lies
    in bucket b xor bucket_of(G): the functionals are linear), else the most slots a bucket needs (a bound,
    known before anything is written)."""
    buckets = bucket_count.shape[0]
    cap = words.shape[0] // buckets
    shift = _bucket_of(gens, g, hashes, _bits(buckets), w)
    most = 0
    for bucket in range(buckets):
        need = bucket_count[bucket] + turning_count[bucket ^ shift]
        if need > cap:
            most = max(most, need)
    return most


@njit(cache=CACHE, nogil=True)
def _pairs(g, cos, sin, part, parts, gens, words, coeffs, sins, gone, holes, partner, turning, table,
           bucket_count, turning_count, hashes, w, max_weight, min_abs, max_sins, dropped):
    """A rotation by G, second step (after _turning on every part and _need found room), on part `part` of
    `parts` of the bucket pairs (a, a xor bucket_of(G)): P -> cos P + sin i G P for the turning words P, each
    pair of buckets alone, its words in the cache. Parts touch disjoint buckets; each has its own table (4 cap
    entries, -1: empty; left empty) and dropped."""
    buckets = bucket_count.shape[0]
    cap = words.shape[0] // buckets
    shift = _bucket_of(gens, g, hashes, _bits(buckets), w)
    top = _bits(shift + 1) - 1  # the top set bit of shift: a pair's lower bucket has it clear
    pairs = buckets // 2 if shift else buckets
    # the bit that tells a pair's two members apart: the lowest set bit of G
    flip_lane, flip_bit = 0, np.int64(0)
    for l in range(2 * w):
        v = np.int64(gens[g, l])
        if v != 0:
            flip_lane, flip_bit = l, v & -v
            break
    for j in range(part * pairs // parts, (part + 1) * pairs // parts):
        a = ((j >> top) << (top + 1)) | (j & ((1 << top) - 1)) if shift else j  # bit `top` of a is 0
        b = a ^ shift
        ta = turning_count[a]
        tb = turning_count[b] if b != a else 0
        t = ta + tb
        if t == 0:
            continue
        size = 2
        while size < 2 * t:  # a table of at least twice the turning words
            size <<= 1
        mask = size - 1
        base_a, base_b = a * cap, b * cap
        ha, hb = 0, 0
        # pair the turning words through the table; a pair mixes when its second member finds the first,
        # whose words are then in the cache: P -> cos P + sin s Q, Q -> cos Q - sin s P
        for kk in range(t):
            i = turning[base_a + kk] if kk < ta else turning[base_b + kk - ta]
            fi = (np.int64(words[i, flip_lane]) & flip_bit) != 0
            hv = _hash(words, i, gens, g, fi, w)
            slot = hv & mask
            tag = (hv >> 40) & 0x7FFFFF  # 23 bits of the hash beside the slot: most mismatches read no word
            partner[i] = -1
            while True:
                entry = table[slot]
                if entry < 0:
                    table[slot] = (tag << 32) | i
                    break
                if (entry >> 32) == tag:
                    j = entry & 0xFFFFFFFF
                    fj = (np.int64(words[j, flip_lane]) & flip_bit) != 0
                    if _same_canonical(words, i, fi, j, fj, gens, g, w):
                        partner[i] = j
                        partner[j] = i
                        sign = _product_sign(words, j, gens, g, w)
                        c, s, cq, sq = coeffs[j], sins[j], coeffs[i], sins[i]
                        mine, theirs = cos * c - sin * sign * cq, cos * cq + sin * sign * c
                        my_sins, their_sins = min(s, sq + 1), min(sq, s + 1)
                        coeffs[j], sins[j] = mine, my_sins
                        coeffs[i], sins[i] = theirs, their_sins
                        rule = _violates(mine, _weight(words, j, w), my_sins, max_weight, min_abs, max_sins)
                        if rule >= 0:
                            if j < base_b or a == b:
                                _drop(gone, holes, base_a + ha, j, dropped, rule, mine)
                                ha += 1
                            else:
                                _drop(gone, holes, base_b + hb, j, dropped, rule, mine)
                                hb += 1
                        rule = _violates(theirs, _weight(words, i, w), their_sins, max_weight, min_abs, max_sins)
                        if rule >= 0:
                            if kk < ta:
                                _drop(gone, holes, base_a + ha, i, dropped, rule, theirs)
                                ha += 1
                            else:
                                _drop(gone, holes, base_b + hb, i, dropped, rule, theirs)
                                hb += 1
                        break
                slot = (slot + 1) & mask
        for kk in range(size):
            table[kk] = -1
        # the words left alone keep cos of their coefficients; their partners are appended to the other
        # bucket with sin s of them
        add_a, add_b = 0, 0
        for kk in range(t):
            in_a = kk < ta
            i = turning[base_a + kk] if in_a else turning[base_b + kk - ta]
            if partner[i] >= 0:
                continue
            c, s = coeffs[i], sins[i]
            sign = _product_sign(words, i, gens, g, w)
            mine, spawn = cos * c, sin * sign * c
            coeffs[i] = mine
            rule = _violates(mine, _weight(words, i, w), s, max_weight, min_abs, max_sins)
            if rule >= 0:
                if in_a:
                    _drop(gone, holes, base_a + ha, i, dropped, rule, mine)
                    ha += 1
                else:
                    _drop(gone, holes, base_b + hb, i, dropped, rule, mine)
                    hb += 1
            into_b = in_a and a != b
            d = base_b + bucket_count[b] + add_b if into_b else base_a + bucket_count[a] + add_a
            for l in range(2 * w):
                words[d, l] = np.int64(words[i, l]) ^ np.int64(gens[g, l])
            rule = _violates(spawn, _weight(words, d, w), s + 1, max_weight, min_abs, max_sins)
            if rule >= 0:
                dropped[rule] += abs(spawn)
            else:
                coeffs[d], sins[d] = spawn, s + 1
                if into_b:
                    add_b += 1
                else:
                    add_a += 1
        bucket_count[a] = _fill_bucket(words, coeffs, sins, gone, holes, base_a, bucket_count[a] + add_a, ha)
        if b != a:
            bucket_count[b] = _fill_bucket(words, coeffs, sins, gone, holes, base_b, bucket_count[b] + add_b, hb)


@njit(cache=CACHE, nogil=True)
def _rotations(first, end, rot_cos, rot_sin, gens, words, coeffs, sins, gone, holes, partner, turning, table,
               bucket_count, turning_count, hashes, w, max_weight, min_abs, max_sins, dropped, peak):
    """The rotations first .. end - 1 of a unit, one after another, on one thread: exp(-i a/2 G) on every
    word. Returns (the rotation it stopped at (end: done), the slots a bucket needs there (0: done; nothing
    of that rotation written), the most live words after any rotation (at least peak))."""
    for g in range(first, end):
        _turning(g, 0, 1, gens, words, bucket_count, turning, turning_count, w)
        need = _need(g, gens, words, bucket_count, turning_count, hashes, w)
        if need > 0:
            return g, need, peak
        _pairs(g, rot_cos[g], rot_sin[g], 0, 1, gens, words, coeffs, sins, gone, holes, partner, turning, table,
               bucket_count, turning_count, hashes, w, max_weight, min_abs, max_sins, dropped)
        peak = max(peak, bucket_count.sum())
    return end, 0, peak


@njit(cache=CACHE, nogil=True)
def _count_buckets(words, bucket_count, cap, hashes, k, out):
    """out[b]: the live words (in buckets of `cap` slots) that fall in bucket b of 2^k by the hashes."""
    w = words.shape[1] // 2
    for bucket in range(bucket_count.shape[0]):
        for i in range(bucket * cap, bucket * cap + bucket_count[bucket]):
            out[_bucket_of(words, i, hashes, k, w)] += 1


@njit(cache=CACHE, nogil=True)
def _rebucket(words, coeffs, sins, bucket_count, cap, new_words, new_coeffs, new_sins, new_count, new_cap, hashes, k):
    """The live words into 2^k buckets of new_cap slots by the hashes (new_count: zeros, then their counts)."""
    w = words.shape[1] // 2
    for bucket in range(bucket_count.shape[0]):
        for i in range(bucket * cap, bucket * cap + bucket_count[bucket]):
            b = _bucket_of(words, i, hashes, k, w)
            d = b * new_cap + new_count[b]
            new_count[b] += 1
            for l in range(2 * w):
                new_words[d, l] = words[i, l]
            new_coeffs[d] = coeffs[i]
            new_sins[d] = sins[i]


@njit(cache=CACHE, nogil=True)
def value(words, coeffs, bucket_count, table):
    """sum over the live words of coefficient * <state| P |state> (engine.overlap_table's factors)."""
    w = words.shape[1] // 2
    cap = words.shape[0] // bucket_count.shape[0]
    total = 0.0
    for bucket in range(bucket_count.shape[0]):
        for i in range(bucket * cap, bucket * cap + bucket_count[bucket]):
            ov = 1.0
            for l in range(w):
                x, z = np.int64(words[i, l]), np.int64(words[i, w + l])
                sites = x | z
                while sites != 0 and ov != 0.0:
                    low = sites & -sites
                    q = 32 * l + _pop(low - 1)
                    code = (1 if (x & low) != 0 else 0) | (2 if (z & low) != 0 else 0)
                    ov *= table[q, code]
                    sites ^= low
            total += coeffs[i] * ov
    return total


def live_terms(ws: Workspace) -> tuple[np.ndarray, np.ndarray]:
    """(words (n, 2W), coeffs (n,)) of the live words, bucket by bucket."""
    cap = ws.cap
    rows = np.concatenate([np.arange(b * cap, b * cap + c) for b, c in enumerate(ws.count.tolist())]) \
        if len(ws.count) else np.zeros(0, np.int64)
    return ws.words[rows], ws.coeffs[rows]


# ---- threads -------------------------------------------------------------------------------------------------

THREADS = "PAULIPROP_NATIVE_THREADS"  # environment: the threads a run's rotations use (default: every core it may use)
THREAD_MIN = 1 << 17  # live words from which a unit's rotations run on several threads (below, a rotation's work
#                       is too little for two thread hand-offs and five calls from Python, about 0.1 ms)
_POOL: list = [None, 0]  # the threads' pool and its size (grown, never shrunk)
_POOL_LOCK = threading.Lock()


def threads() -> int:
    """The threads a run's rotations use: PAULIPROP_NATIVE_THREADS, else the cores this process may run on."""
    given = os.environ.get(THREADS, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ValueError(f"{THREADS}={given!r}: give the number of threads, a positive integer")
        return int(given)
    return memory.cores()


def _side_by_side(parts: int, call) -> None:
    """call(part) for every part: part 0 on this thread, the others on the pool's threads (the functions
    release the GIL); returns once all are done."""
    with _POOL_LOCK:
        pool, size = _POOL
        if pool is None or size < parts - 1:  # (a smaller one left as it is: a caller may still be submitting)
            pool = ThreadPoolExecutor(max_workers=parts - 1, thread_name_prefix="pauliprop-native")
            _POOL[:] = [pool, parts - 1]
    futures = [pool.submit(call, p) for p in range(1, parts)]
    try:
        call(0)
    finally:
        for f in futures:
            f.result()


def _rotations_side_by_side(parts: int, first: int, end: int, cos: np.ndarray, sin: np.ndarray, gens: np.ndarray,
                            ws: Workspace, hashes: np.ndarray, w: int, max_weight: int, min_abs: float,
                            max_sins: int, dropped: np.ndarray, peak: int) -> tuple:
    """_rotations on `parts` threads: each rotation's turning lists by ranges of buckets, then (where every
    bucket has room) its bucket pairs by ranges of pairs, each thread with its own table and dropped. The
    same values and terms as on one thread (a pair's arithmetic does not depend on who does it); the dropped
    norms summed in another order."""
    tables = [ws.table] + [np.full_like(ws.table, -1) for _ in range(1, parts)]
    drops = np.zeros((parts, len(dropped)))
    try:
        for g in range(first, end):
            _side_by_side(parts, lambda p: _turning(g, p, parts, gens, ws.words, ws.count, ws.turning,
                                                    ws.turning_count, w))
            need = _need(g, gens, ws.words, ws.count, ws.turning_count, hashes, w)
            if need > 0:
                return g, need, peak
            c, s = cos[g], sin[g]
            _side_by_side(parts, lambda p: _pairs(g, c, s, p, parts, gens, ws.words, ws.coeffs, ws.sins, ws.gone,
                                                  ws.holes, ws.partner, ws.turning, tables[p], ws.count,
                                                  ws.turning_count, hashes, w, max_weight, min_abs, max_sins,
                                                  drops[p]))
            peak = max(peak, int(ws.count.sum()))
        return end, 0, peak
    finally:
        dropped += drops.sum(0)


numba.config.CACHE_DIR = _USERS_CACHE_DIR
