"""The propagation loop: the schedule's units applied to a fixed-capacity term buffer.

`run` is one `lax.while_loop` over the units of `schedule.units` (MERGE, CLIFFORD, SPLIT, CHANNEL,
TRUNCATE, and on GPUs LAYER: a layer of rotations in a few passes, `layer_unit`), each a branch of
one `lax.switch`. Everything that describes the circuit, the
observable, the parameters, the truncation values and the initial state is data; what is static
(`Config`) is the capacity, which rules exist, the truncation semantics and the backend's variant.
So one compiled program serves every circuit whose tables fall in the same buckets, and the
program's size does not grow with the circuit.

With `Config.stop`, a unit whose result would not fit the capacity is not applied: the loop stops
there and returns the unit's index, and the caller grows the buffer and resumes from that unit
(propagate.py). Without it (inside a caller's trace, where shapes cannot grow) the unit keeps the
largest terms and charges the rest to the overflow entry of the dropped norms.

Reverse mode (adjoint.py): `apply_unit(..., record=True)` also returns the unit's `Record`, its
coefficient map with the truncation decisions frozen (each slot's destinations and factors), which
adjoint.py transposes with gathers.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..algebra import words as pauli_words
from ..algebra.clifford import apply_map
from ..algebra.overlap import table_overlaps
from ..runtime.batching import shared
from ..runtime.prefix import count as _count, first_set
from . import merge, schedule
from .truncation import Limits, Rules


class Buffer(NamedTuple):
    words: jax.Array  # (C, 2W) uint32: x lanes, then z lanes
    coeffs: jax.Array  # (C,)
    meta: jax.Array  # (C,) int32: bit 0 live (the live words are distinct, dead slots are free), the rest sines
    dropped: jax.Array  # (5,) 1-norm dropped per truncation rule (truncation.RULES)

    @property
    def live(self):
        return merge.live_of(self.meta)

    @property
    def x(self):
        return merge.halves(self.words)[0]

    @property
    def z(self):
        return merge.halves(self.words)[1]


class Config(NamedTuple):
    """The static part of a propagation: what the compiled program depends on."""

    capacity: int
    rules: Rules  # Truncation.rules: which rules exist and where they act (their values are data: Limits)
    stop: bool  # stop at an overflow (resumable) instead of cutting
    sweep: bool  # Clifford gates swept over all words, SWEEP at a time (GPUs), else gathered in rooms (CPUs)
    rooms: tuple  # the SPLIT unit's room sizes, ascending, the last = capacity
    cut_rooms: int = 1  # how many of the largest rooms hold the largest-terms cut (split_rooms_with_cut)
    whole_room: bool = True  # the SPLIT unit holds its room of the whole buffer; without it (whole_room_for)
    #   a rotation that needs that room writes nothing and the loop stops there (need WHOLE_ROOM); the
    #   caller resumes in the program that holds it
    skip_unmet: bool = False  # the loop keeps where the live words act; a rotation that meets none of
    #   those sites splits nothing and skips its pass over the buffer (CPUs: GPUs pass in microseconds)
    exact: bool = False  # words sort by their own bits (merge.hashes): at most 16 qubits
    units: tuple = tuple(range(len(schedule.UNIT_NAMES)))  # the unit kinds the program holds code for (others: no-ops)
    clifford: tuple = (True, True, True)  # Clifford runs as: dense maps, gate tables, quarter turns of generators
    unroll: int = 1  # bytes of a word a dense map's loop looks up per iteration (clifford.apply_map)
    units_per_test: int = 1  # units the loop applies between two tests of its end (GPUs: more, see run)
    static_loops: int = 0  # > 0: every loop has a static trip count (this bound on a unit's elements), so
    #                        JAX's own reverse mode can differentiate the loop (pp.propagate under jax.grad)
    report_collisions: bool = False  # with stop: a rotation whose words' fingerprints collide writes nothing
    #   and the loop stops there (need COLLIDED); the caller resumes with rooms that order exactly. So the
    #   program holds no exact sort (a sort of 2W + 1 keys a room: seconds of GPU compilation) for an
    #   event of probability ~C^2 / 2^64. Off: every room orders exactly after a collision, inline.


class Record(NamedTuple):
    """One unit's coefficient map with its truncation decisions frozen, per input slot q (C,): the
    cotangent of q's coefficient is A[q] lam[own] + B[q] lam[to[q]] of the output's cotangent lam.

    diagonal units (Clifford runs, channels, truncations, no-ops): own = q, A = value (the sign or
    factor, 0 where the word was dropped or the slot is dead), B = 0.
    rotations: own = q, A = cos (a splitting word; TURN) or 1, where OWN; B = +-sin (NEG), where FED;
    value = q's input coefficient (d/d angle of A and B times it is the angle's derivative).
    merges: own = to[q], A = 1, sqrt(1 - gamma) or 1 - gamma (code & 3: 1, 2, 3; 0: dropped);
    where DAMPED, B = gamma into slot int(value) (the Z word's damped copy)."""

    to: jax.Array  # (C,) int32, C: none
    code: jax.Array  # (C,) uint8 bits
    value: jax.Array  # (C,) coefficient dtype


OWN, TURN, FED, NEG, DAMPED = 1, 2, 4, 8, 16  # Record.code bits (a merge's low two bits are its factor)


def record_bytes(capacity: int, dtype) -> int:
    """Bytes of one unit's Record."""
    return capacity * (4 + 1 + jnp.dtype(dtype).itemsize)


def _diagonal_record(factor, live, dtype) -> Record:
    c = live.shape[0]
    return Record(jnp.full(c, c, jnp.int32), jnp.zeros(c, jnp.uint8), jnp.where(live, factor, 0).astype(dtype))


def _elements(start, count, cfg: Config, body, init):
    """body(j, valid, carry) over elements start .. start + count - 1: a loop of `count` steps, or
    with cfg.static_loops one of static_loops steps whose extra steps have valid = False."""
    if cfg.static_loops:
        return lax.fori_loop(0, cfg.static_loops, lambda i, c: body(start + i, i < count, c), init)
    return lax.fori_loop(start, start + count, lambda j, c: body(j, jnp.asarray(True), c), init)


def features(units: "schedule.Units", sched: "schedule.Schedule") -> dict:
    """The Config fields that say which code a program needs for these units (the rest compiles to no-ops)."""
    present = tuple(sorted(set(int(k) for k in units.kind) | {schedule.U_NOOP}))
    cl = (bool(np.any(sched.dense & (sched.kind == schedule.CLIFFORD))), bool(np.any(sched.cl_kind == schedule.TABLE)),
          bool(np.any(sched.cl_kind == schedule.GENERATOR)))
    return dict(exact=merge.exact_words(sched.num_qubits), units=present, clifford=cl)


SWEEP = 8  # Clifford gates a sweep applies per iteration (one fused launch on a GPU)


ONE_ROOM_CAPACITY = 1 << 12  # buffers up to this many slots have one room (rooms_for)
GPU_ONE_ROOM_CAPACITY = 1 << 17  # on GPUs, up to this many


def rooms_for(capacity: int, backend: str) -> tuple:
    """Room sizes of the SPLIT unit: a rotation gathers its splitting words into the smallest room
    that holds them (its sort costs what the room holds). Each room is a copy of the split in the
    compiled program, so few: CPUs sort slowly and gain from small rooms, GPUs do not. A buffer of
    at most ONE_ROOM_CAPACITY slots has one room: sorting all of it takes microseconds, and a room is
    compile time (an 8-qubit, 40-gate circuit on the 2-core CPU, mean of five fresh processes: first
    call 1.03 -> 0.75 s, later calls 34 -> 21 ms). GPUs sort 2^16 words about as fast as 2^12, so
    there one room serves up to GPU_ONE_ROOM_CAPACITY slots (the kicked Ising's 17-angle sweep at
    2^16 slots on an H100: the same 0.56 s warm, 3 s less compilation than with rooms of 2^12 and 2^16)."""
    if capacity <= (ONE_ROOM_CAPACITY if backend == "cpu" else GPU_ONE_ROOM_CAPACITY):
        return (capacity,)
    fractions = ((1, 64), (1, 8), (1, 2)) if backend == "cpu" else ((1, 16),)
    rooms = tuple(r for r in (capacity * a // b for a, b in fractions) if r >= 256)
    return rooms + (capacity,)


def split_rooms_with_cut(rooms: tuple, backend: str, rules: Rules, stop: bool) -> int:
    """How many of the largest rooms hold the code that cuts the buffer and a rotation's new words
    together (a rotation whose new words may not fit the free slots needs one of them). Where a cut
    can happen (per-gate max_terms, or a program that does not stop) on CPUs: the two largest, so the
    common case at saturation, live words near max_terms and a few 10^4 splitting ones, sorts and
    moves half the buffer, not all of it (kicked Ising at pauli-prop's settings, 1e5 terms in 2^17
    slots: 184 of an angle's 863 splitting rotations did not fit, none split more than 2^16 words).
    Each such room costs its cut's compilation, so GPUs (one room up to 2^17 slots) and programs
    that stop at an overflow instead keep one; a CPU program that stops leaves the largest of the two
    out until a rotation needs it (whole_room_for)."""
    cuts = rules.max_terms or not stop
    return 2 if backend == "cpu" and cuts and len(rooms) > 2 else 1


WHOLE_ROOM = -2  # a unit's "slots needed" when its rotation needs the room this program leaves out


def whole_room_for(backend: str, cut_rooms: int, stop: bool) -> bool:
    """Whether a program holds the SPLIT unit's room of the whole buffer. Not on CPUs where two rooms
    hold the cut and the program stops: there the whole room serves only a rotation that splits
    more than half the buffer (at saturation, near max_terms, rare: the kicked Ising at pauli-prop's
    settings, 1e5 terms in 2^17 slots, never split more than half of them at k = 4, 8, 12: at most
    54,563 words at k = 8), and its copy of the split and the cut compiled in 1.6-3.8 of 9-11 s (one
    core, interleaved). Such a rotation stops the loop and the caller resumes it in the program that
    holds the room."""
    return not (backend == "cpu" and cut_rooms == 2 and stop)


def layers_for(backend: str, rules: Rules, traced_capacity: int | None = None) -> bool:
    """Whether a layer of rotations is one LAYER unit (layer_unit) rather than a SPLIT unit each: on
    GPUs, where the truncation is per term (a per-gate max_terms cut is global, so it needs the gates
    one by one). CPUs keep the rotations one by one where their buffer has rooms: there a pass over
    the whole buffer costs what the rooms save (kicked Ising, 20 steps at pi/4, 1e-4 and weight 8,
    2-core CPU: 6.8 s a call in layers against 1.6 s; at 8 steps after the layers' fibers, 0.41
    against 0.35 s). A traced program (pp.expectation under jit or grad; the concrete CPU path is the
    native engine) whose `traced_capacity` is one room sorts the whole buffer at every rotation, so
    there layers win: 64-qubit TFI, 508 rotations at capacity 4,096, 9-11 ms against 90 ms."""
    if rules.cut_each_gate:
        return False
    if backend != "cpu":
        return True
    return traced_capacity is not None and len(rooms_for(traced_capacity, backend)) == 1


def rotation_angle(T, rows, params):
    """The angles of rotation rows (a row index or an array of them): scale * params[index] + offset, or the
    fixed offset where the row has no parameter."""
    idx = T["rot_index"][rows]
    p = params[jnp.maximum(idx, 0)] if params.shape[0] else jnp.zeros(jnp.shape(idx), params.dtype)
    return (jnp.where(idx >= 0, T["rot_scale"][rows].astype(params.dtype) * p, 0)
            + T["rot_offset"][rows].astype(params.dtype))


def _room_pick(count, rooms: tuple):
    """The branch for `count` words: 0 when there are none, else 1 + the index of the smallest of
    `rooms` that holds them (len(rooms) + 1: none does). One branch for a whole batch (its largest)."""
    return shared(jnp.where(count == 0, 0, 1 + jnp.sum(count > jnp.asarray(rooms, jnp.int32))))


def _heavy_out(buf: Buffer, mask, limits: Limits) -> Buffer:
    """Drop the words of `mask` heavier than max_weight (their norm charged to the weight rule)."""
    if limits.max_weight is None:
        return buf
    heavy = mask & buf.live & (merge.weight(buf.words) > limits.max_weight)
    return buf._replace(meta=jnp.where(heavy, 0, buf.meta), coeffs=jnp.where(heavy, 0, buf.coeffs),
                        dropped=buf.dropped.at[0].add(jnp.sum(jnp.where(heavy, jnp.abs(buf.coeffs), 0))))


def _drop_rules(buf: Buffer, limits: Limits) -> Buffer:
    """The per-term rules on every live word (a dropped slot becomes free)."""
    live = buf.live
    keep, charge = merge.rule_charges(limits, buf.coeffs, merge.weight(buf.words), merge.sins_of(buf.meta), live)
    return buf._replace(coeffs=jnp.where(keep, buf.coeffs, 0), meta=jnp.where(keep, buf.meta, 0),
                        dropped=buf.dropped.at[:3].add(charge))


def _cap(buf: Buffer, limits: Limits, capacity: int) -> Buffer:
    coeffs, meta, dropped = merge.cap_terms(buf.words, buf.coeffs, buf.meta, buf.dropped, limits, capacity)
    return buf._replace(coeffs=coeffs, meta=meta, dropped=dropped)


# ---- the units ----------------------------------------------------------------------------------------

def merge_unit(buf: Buffer, u, T, params, limits, cfg: Config, record: bool = False):
    """The full merge (of the observable; of amplitude damping's words): Z -> (1-g) Z + g I on a qubit,
    X, Y -> sqrt(1-g) X, Y, then duplicates summed, the rules applied, the survivors compacted.
    Returns (buffer, slots needed when it overflowed, else 0) (and its Record, with `record`)."""
    j = T["u_start"][u]
    q = T["mg_qubit"][j]
    damp = T["mg_op"][j] >= 0
    gamma = T["mg_gamma"][j].astype(buf.coeffs.dtype)
    xa, za = pauli_words.get_site(buf.x, q), pauli_words.get_site(buf.z, q)
    is_z = buf.live & damp & (xa == 0) & (za == 1)
    factor = jnp.where(damp, jnp.where(is_z, 1 - gamma, jnp.where(xa == 1, jnp.sqrt(1 - gamma), 1.0)), 1.0)
    damped = jnp.concatenate([buf.x, pauli_words.set_site(buf.z, q, jnp.zeros_like(za))], axis=-1)
    cat = lambda a, b: jnp.concatenate([a, b])
    out = merge.full_merge(cat(buf.words, damped), cat(buf.coeffs * factor, jnp.where(is_z, gamma * buf.coeffs, 0)),
                           cat(buf.meta, jnp.where(is_z, buf.meta, 0)), limits, cfg.capacity, stop=cfg.stop,
                           exact=cfg.exact, moves=record)
    new = Buffer(*out[:3], buf.dropped + out[3])
    if record:
        c = cfg.capacity
        to, damped_to = out[4][:c], out[4][c:]
        scale = jnp.where(is_z, 3, jnp.where(damp & (xa == 1), 2, 1))
        code = jnp.where(to < c, scale, 0) | jnp.where(is_z & (damped_to < c), DAMPED, 0)
        return new, jnp.int32(0), Record(to, code.astype(jnp.uint8), damped_to.astype(buf.coeffs.dtype))
    if not cfg.stop:
        return new, jnp.int32(0)
    need = out[4]
    return jax.tree_util.tree_map(lambda a, b: jnp.where(need > 0, a, b), buf, new), need


def _site_mask(q, lanes: int):
    """(W,) uint32: qubit q's bit in a packed word (q traced)."""
    shift = (q % pauli_words.LANE_BITS).astype(jnp.uint32)
    return jnp.where(jnp.arange(lanes) == q // pauli_words.LANE_BITS, jnp.uint32(1) << shift, jnp.uint32(0))


def _has(words, mask):
    """(T,) uint32: whether each word has the mask's bit (elementwise and a reduction over the lanes,
    so an element's steps fuse into a few kernels; a dynamic lane index would gather)."""
    return jnp.any((words & mask) != 0, axis=-1).astype(jnp.uint32)


def _table_code(T, j, x, z):
    """(each word's code on element j's qubits (a, b), x_a | z_a << 1 | x_b << 2 | z_b << 3, and the
    masks of a and b)."""
    ma, mb = _site_mask(T["cl_qubits"][j, 0], x.shape[-1]), _site_mask(T["cl_qubits"][j, 1], x.shape[-1])
    return _has(x, ma) | _has(z, ma) << 1 | _has(x, mb) << 2 | _has(z, mb) << 3, ma, mb


def _element_touched(T, j, words, kinds=(True, True, True)):
    """The words Clifford element j moves: non-identity on its qubits (a table), anticommuting (a turn)."""
    x, z = merge.halves(words)
    on_table = _table_code(T, j, x, z)[0] != 0
    if not kinds[2]:
        return on_table
    ac = pauli_words.anticommutes(x, z, T["cl_gx"][j], T["cl_gz"][j])
    if not kinds[1]:
        return ac
    return jnp.where(T["cl_kind"][j] == schedule.TABLE, on_table, ac)


def element_image(T, j, words, kinds=(True, True, True)):
    """The image of words under Clifford element j: (words, sign, touched). kinds: which element forms
    (gate tables, quarter turns of generators) the program holds code for. A table's 16 image codes
    and signs are packed into three scalars and read by shifts: no gathers over the words."""
    x, z = merge.halves(words)
    out = []
    if kinds[1]:
        code, ma, mb = _table_code(T, j, x, z)
        four = jnp.arange(8, dtype=jnp.uint32) * 4
        row = T["cl_table"][j].astype(jnp.uint32)
        low, high = jnp.sum(row[:8] << four, dtype=jnp.uint32), jnp.sum(row[8:] << four, dtype=jnp.uint32)
        negative = jnp.sum(jnp.where(T["cl_sign"][j] < 0, jnp.uint32(1) << jnp.arange(16, dtype=jnp.uint32), 0),
                           dtype=jnp.uint32)
        img = (jnp.where(code < 8, low, high) >> (4 * (code & 7))) & 15
        bit = lambda k, m: jnp.where(((img >> k) & 1)[:, None] != 0, m, jnp.uint32(0))
        keep = ~(ma | mb)
        tx = (x & keep) | bit(0, ma) | bit(2, mb)
        tz = (z & keep) | bit(1, ma) | bit(3, mb)
        sign = 1 - 2 * ((negative >> code) & 1).astype(jnp.int32)
        out.append((jnp.concatenate([tx, tz], -1), sign, code != 0))
    if kinds[2]:  # a quarter turn of a generator on three or more qubits
        gx, gz = T["cl_gx"][j], T["cl_gz"][j]
        k = T["cl_turns"][j] % 4
        ac = pauli_words.anticommutes(x, z, gx, gz)
        odd = (k % 2) == 1
        ps = pauli_words.product_sign(x, z, gx, gz).astype(jnp.int32)
        g_sign = jnp.where(ac, jnp.where(odd, jnp.where(k == 1, 1, -1) * ps, -1), 1)
        flip = ac & odd
        g = jnp.concatenate([gx, gz])
        out.append((jnp.where(flip[:, None], words ^ g, words), g_sign, ac))
    if len(out) == 1:
        return out[0]
    table = T["cl_kind"][j] == schedule.TABLE
    return tuple(jnp.where(table[..., None] if t.ndim == 2 else table, t, g) for t, g in zip(*out))


def _remap(buf: Buffer, touched, image, limits: Limits, capacity: int) -> Buffer:
    """Apply a word map (a Clifford: it permutes signed words) to the `touched` live words.

    None touched: nothing to do (common outside the light cone). A few (up to C/16): gathered into
    the smallest room that holds them, so the cost follows their count. More: one pass over the
    buffer. Only the weight rule can drop a moved word."""
    count = _count(touched)

    def gathered(b, room):
        src = first_set(touched, room)
        at = jnp.where(src < capacity, src, capacity)
        s = jnp.minimum(src, capacity - 1)
        words, sign = image(b.words[s])
        b = b._replace(words=b.words.at[at].set(words, mode="drop"),
                       coeffs=b.coeffs.at[at].set(b.coeffs[s] * sign.astype(b.coeffs.dtype), mode="drop"))
        return _heavy_out(b, jnp.zeros(capacity, bool).at[at].set(True, mode="drop"), limits)

    def everywhere(b):
        words, sign = image(b.words)
        b = b._replace(words=jnp.where(touched[:, None], words, b.words),
                       coeffs=jnp.where(touched, b.coeffs * sign.astype(b.coeffs.dtype), b.coeffs))
        return _heavy_out(b, touched, limits)

    rooms = tuple(r for r in (capacity // 64, capacity // 16) if r >= 256)
    return lax.switch(_room_pick(count, rooms), [lambda b: b] + [partial(gathered, room=r) for r in rooms]
                      + [everywhere], buf)


def clifford_unit(buf: Buffer, u, T, params, limits, cfg: Config, record: bool = False):
    """A run of Clifford operations: one dense map, or gate by gate (rooms on CPUs, sweeps on GPUs).
    Per gate, the weight rule drops a word after the gate that made it too heavy; per layer (and for
    a dense map) after the run. With `record`, the run maps unit coefficients instead: each slot's
    sign (0 where the weight rule dropped it, a rule of the words alone) is its Record, and the
    coefficients are multiplied by it (bit for bit what the run makes of them)."""
    if record:
        probe, _ = clifford_unit(buf._replace(coeffs=jnp.ones_like(buf.coeffs)), u, T, params, limits, cfg)
        gone = buf.live & ~probe.live
        dropped = buf.dropped.at[0].add(jnp.sum(jnp.where(gone, jnp.abs(buf.coeffs), 0)))
        out = probe._replace(coeffs=buf.coeffs * probe.coeffs, dropped=dropped)
        return out, jnp.int32(0), _diagonal_record(probe.coeffs, probe.live, buf.coeffs.dtype)
    weight_each = cfg.rules.weight_each_gate
    end_limits = limits if not weight_each else Limits()
    gate_limits = Limits(max_weight=limits.max_weight) if weight_each else Limits()

    def dense(b):
        m = T["u_start"][u]
        x, z, sign = apply_map(b.x, b.z, T["map_x"][m], T["map_z"][m], T["map_phase"][m], cfg.unroll)
        b = b._replace(words=jnp.concatenate([x, z], -1), coeffs=b.coeffs * sign.astype(b.coeffs.dtype))
        return _heavy_out(b, b.live, limits)

    def by_gates(b):
        start, count = T["u_start"][u], T["u_count"][u]
        if cfg.sweep:
            chunks = (count + SWEEP - 1) // SWEEP

            def chunk(i, ok, b):
                for t in range(SWEEP):
                    j = start + i * SWEEP + t
                    valid = ok & (j < start + count)
                    words, sign, touched = element_image(T, jnp.minimum(j, T["cl_kind"].shape[0] - 1), b.words,
                                                          cfg.clifford)
                    touched = touched & b.live & valid
                    b = b._replace(words=jnp.where(touched[:, None], words, b.words),
                                   coeffs=jnp.where(touched, b.coeffs * sign.astype(b.coeffs.dtype), b.coeffs))
                    b = _heavy_out(b, touched, gate_limits)
                return b

            static = cfg._replace(static_loops=(cfg.static_loops + SWEEP - 1) // SWEEP) if cfg.static_loops else cfg
            b = _elements(0, chunks, static, chunk, b)
        else:
            def gate(j, valid, b):
                j = jnp.minimum(j, T["cl_kind"].shape[0] - 1)
                image = lambda words: element_image(T, j, words, cfg.clifford)[:2]
                touched = b.live & _element_touched(T, j, b.words, cfg.clifford) & valid
                return _remap(b, touched, image, gate_limits, cfg.capacity)

            b = _elements(start, count, cfg, gate, b)
        return _heavy_out(b, b.live, end_limits)

    has_dense, has_gates = cfg.clifford[0], cfg.clifford[1] or cfg.clifford[2]
    if has_dense and has_gates:
        return lax.cond(T["u_dense"][u], dense, by_gates, buf), jnp.int32(0)
    return (dense if has_dense else by_gates)(buf), jnp.int32(0)


def support(buf: Buffer):
    """(2W,) uint32: the OR of the live words (x lanes, then z lanes), where any of them acts."""
    return lax.reduce(jnp.where(buf.live[:, None], buf.words, jnp.uint32(0)), jnp.uint32(0), lax.bitwise_or, (0,))


def acts_after(T, u, buf: Buffer, acts):
    """Where the live words act after unit u (buf: its output), from `acts` before it, kept as a superset
    (cfg.skip_unmet): a rotation's new words act on its generator's sites too, truncation only removes
    words; other units move words: the OR of the live ones (`support`)."""
    _, gx, gz = generator(T, u)
    return lax.cond(shared(T["u_kind"][u] == schedule.U_SPLIT), lambda: acts | jnp.concatenate([gx, gz]),
                    lambda: support(buf))


def generator(T, u):
    """(the rotation table's row of unit u, clamped into the table, and its generator's x and z lanes)."""
    j = jnp.minimum(T["u_start"][u], T["rot_gx"].shape[0] - 1)
    return j, T["rot_gx"][j], T["rot_gz"][j]


def unit_rotation(buf: Buffer, u, T, params, acts=None, split=True):
    """(angle, generator word, anticommuting live words, their count) of the rotation of unit u.
    acts: a superset of where the live words act (`support`), or None. Where no live word can
    anticommute with the generator (it meets none of their sites: outside the observable's light
    cone, most rotations of a deep circuit's last layers), or the unit is no rotation (not `split`),
    the pass over the buffer is skipped."""
    j, gx, gz = generator(T, u)
    angle = rotation_angle(T, j, params).astype(buf.coeffs.dtype)

    def anticommuting():
        ac = buf.live & pauli_words.anticommutes(buf.x, buf.z, gx, gz)
        return ac, _count(ac)

    if acts is None:
        ac, n = anticommuting()
    else:
        ax, az = merge.halves(acts)
        meets = split & jnp.any(((ax & gz) | (az & gx)) != 0)
        ac, n = lax.cond(shared(meets), anticommuting,
                         lambda: (jnp.zeros(buf.meta.shape, bool), jnp.int32(0)))
    return angle, jnp.concatenate([gx, gz]), ac, n


def _split_pick(live_count, splitting, cfg: Config):
    """The room branch of a rotation: 0 when nothing splits, else 1 + the smallest room that holds the
    splitting words, one with the cut's code (the last cfg.cut_rooms) unless the live and splitting
    words together fit the buffer. A larger branch index serves every smaller one (batches take
    their members' largest: batching.shared)."""
    fits = live_count + splitting <= cfg.capacity
    smallest_cut = 1 + len(cfg.rooms) - cfg.cut_rooms
    needs_cut = ~fits & (splitting > 0)
    return shared(jnp.maximum(_room_pick(splitting, cfg.rooms[:-1]), jnp.where(needs_cut, smallest_cut, 0)))


def _split_in(buf: Buffer, u, T, limits, cfg: Config, room: int, rotation, record: bool = False):
    """The rotation of unit u with its splitting words in `room` slots (merge.pair_split), no cut after."""
    angle, g, ac, _ = rotation
    out = merge.pair_split(buf.words, buf.coeffs, buf.meta, ac, g, jnp.cos(angle), jnp.sin(angle),
                           limits.off_unless(~T["u_defer"][u]), cfg.capacity, room, stop=cfg.stop, exact=cfg.exact,
                           fits=room < cfg.rooms[-cfg.cut_rooms], report_collisions=cfg.report_collisions,
                           moves=record)
    new = Buffer(*out[:3], buf.dropped + out[3])
    if record:
        return new, jnp.int32(0), _rotation_record(out[4], ac, buf.coeffs, cfg.capacity)
    return new, (out[4] if cfg.stop else jnp.int32(0))


def _rotation_record(moves, turning, coeffs, capacity: int) -> Record:
    """A rotation's Record from merge.pair_split's moves: each slot keeps its word (OWN, scaled by cos
    where TURN) and feeds +-sin of its coefficient to `to` (FED, NEG); value: its input coefficient."""
    own, at, fed, negative = moves
    to = jnp.full(capacity, capacity, jnp.int32).at[at].set(fed, mode="drop")
    neg = jnp.zeros(capacity, bool).at[at].set(negative, mode="drop")
    bits = lambda m, b: jnp.where(m, b, 0)
    code = bits(own, OWN) | bits(turning, TURN) | bits(to < capacity, FED) | bits(neg, NEG)
    return Record(to, code.astype(jnp.uint8), coeffs)


def _unsplit(buf: Buffer, u=None, **_):
    """A rotation that splits no word, with its Record: every live word keeps its slot."""
    c = buf.coeffs.shape[0]
    return buf, jnp.int32(0), Record(jnp.full(c, c, jnp.int32), jnp.where(buf.live, OWN, 0).astype(jnp.uint8),
                                     buf.coeffs)


def _room_branches(u, T, limits, cfg: Config, rotation, record: bool = False) -> list:
    """The rotation of unit u in each of cfg.rooms (`_split_in`), one switch branch a room; without
    cfg.whole_room the last branch writes nothing and needs WHOLE_ROOM."""
    branches = [partial(_split_in, u=u, T=T, limits=limits, cfg=cfg, room=r, rotation=rotation, record=record)
                for r in cfg.rooms]
    if not cfg.whole_room:
        branches[-1] = lambda b: (b, jnp.int32(WHOLE_ROOM))
    return branches


def split_unit(buf: Buffer, u, T, params, limits, cfg: Config):
    """One rotation exp(-i a/2 G): its splitting words gathered into the smallest room that holds
    them, paired and mixed (merge.pair_split), then the largest-terms cut. (The loop runs the same
    steps with the room chosen in its own switch: apply_unit.)"""
    rotation = unit_rotation(buf, u, T, params)
    pick = _split_pick(_count(buf.live), rotation[3], cfg)
    buf, need = lax.switch(pick, [lambda b: (b, jnp.int32(0))] + _room_branches(u, T, limits, cfg, rotation), buf)
    return _cap(buf, limits.off_unless(~T["u_defer"][u]), cfg.capacity), need


class Layer(NamedTuple):
    """A LAYER unit's rotations, padded to the 32 W a layer may hold (layer_of)."""

    gx: jax.Array  # (32 W, W) their generators' x lanes
    gz: jax.Array
    cos: jax.Array  # (32 W,) of their angles
    sin: jax.Array
    present: jax.Array  # (32 W,) bool: the layer's count of them
    limits: Limits  # the rules its passes apply (off where they wait for the step's end)


def layer_rotations(u, T):
    """The rotation-table rows of LAYER unit u's rotations, padded (clamped into the table) to the 32 W a
    layer may hold (schedule._joins)."""
    most = pauli_words.LANE_BITS * T["rot_gx"].shape[1]
    return jnp.minimum(T["u_start"][u] + jnp.arange(most), T["rot_gx"].shape[0] - 1)


def layer_of(u, T, params, limits, dtype) -> Layer:
    rows = layer_rotations(u, T)
    most = rows.shape[0]
    angle = rotation_angle(T, rows, params).astype(dtype)
    return Layer(T["rot_gx"][rows], T["rot_gz"][rows], jnp.cos(angle), jnp.sin(angle),
                 jnp.arange(most) < T["u_count"][u], limits.off_unless(~T["u_defer"][u]))


def _layer_anticommuting(buf: Buffer, layer: Layer):
    """(C, W) uint32, bit i of lane l: the live word anticommutes with the layer's rotation 32 l + i."""
    lanes = layer.gx.shape[1]
    ac = (pauli_words.anticommutes(buf.x[:, None, :], buf.z[:, None, :], layer.gx[None], layer.gz[None])
          & layer.present & buf.live[:, None])
    bits = ac.reshape(-1, lanes, pauli_words.LANE_BITS).astype(jnp.uint32) << jnp.arange(pauli_words.LANE_BITS,
                                                                                       dtype=jnp.uint32)
    return lax.reduce(bits, jnp.uint32(0), lax.bitwise_or, (2,))


def layer_passes(buf: Buffer, layer: Layer):
    """The passes a layer takes: the most of its rotations any live word anticommutes with (shared by a
    batch). int32 sums: a plain one widens to int64 under x64, which XLA:GPU kept per word."""
    return shared(jnp.max(jnp.sum(pauli_words.popcount(_layer_anticommuting(buf, layer)), axis=1, dtype=jnp.int32)))


def layer_pass(buf: Buffer, layer: Layer, j, cfg: Config, record: bool = False):
    """Pass j of a layer: every live word turned by its j-th anticommuting rotation of the layer, the
    turning words in the smallest room that holds them (as a rotation's, _room_pick). Returns (buffer,
    slots needed if it overflowed (cfg.stop), else 0), and with `record` (not with cfg.stop) the
    pass's Record (a rotation's, each slot with its own angle) and each slot's rotation in the layer."""
    gate, turning = pauli_words.nth_set_bit(_layer_anticommuting(buf, layer), j)
    gens = jnp.concatenate([layer.gx, layer.gz], -1)

    def in_room(b, room):
        out = merge.pair_split(b.words, b.coeffs, b.meta, turning, gens[gate], layer.cos[gate], layer.sin[gate],
                               layer.limits, cfg.capacity, room, stop=cfg.stop, exact=cfg.exact,
                               report_collisions=cfg.report_collisions, moves=record)
        new = Buffer(*out[:3], b.dropped + out[3])
        if record:
            return new, jnp.int32(0), _rotation_record(out[4], turning, b.coeffs, cfg.capacity)
        return new, (out[4] if cfg.stop else jnp.int32(0))

    def no_turn(b):
        return (b, jnp.int32(0)) + ((_unsplit(b)[2],) if record else ())

    out = lax.switch(_room_pick(_count(turning), cfg.rooms[:-1]),
                     [no_turn] + [partial(in_room, room=r) for r in cfg.rooms], buf)
    return out + ((gate,) if record else ())


def layer_unit(buf: Buffer, u, T, params, limits, cfg: Config):
    """The rotations of a layer (schedule.units: the same letter on every qubit two of them share, so
    they commute) in a few passes over the buffer instead of one unit each: the same result as the
    rotations one by one, truncated per gate.

    Commuting rotations make each word's set of anticommuting rotations the same for every word its
    rotations reach (its fiber), and the fibers do not meet. Pass j turns every word by its j-th
    anticommuting rotation in the layer's order (layer_pass: merge.pair_split with a generator a
    word): each fiber then sees its rotations in order, pairs meet only inside a fiber, and the
    per-term rules (min_abs_coeff, max_weight, max_sins) drop what they drop gate by gate. A pass
    costs one sort of its turning words (in the smallest room that holds them), so a layer of 127 RX
    under max_weight 8 is at most 8 passes, not 127 units (and at most one a rotation of the layer).
    The largest-terms cut is global, so a layer holds none (units() makes layers only where per-gate
    max_terms is absent). With cfg.stop, a pass that would overflow (or that reports a collision)
    leaves the layer unapplied: the caller grows the buffer (or orders exactly) and resumes at this
    unit. Reverse mode records the passes one by one (adjoint.py)."""
    layer = layer_of(u, T, params, limits, buf.coeffs.dtype)

    def step(state):
        j, b, need = state
        b, need = layer_pass(b, layer, j, cfg)
        return j + 1, b, need

    passes = layer_passes(buf, layer)
    _, out, need = lax.while_loop(lambda st: (st[0] < passes) & (st[2] == 0), step, (jnp.int32(0), buf, jnp.int32(0)))
    if not cfg.stop:
        return out, jnp.int32(0)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(need != 0, a, b), buf, out), need


def _channel_factor(T, j, valid, words):
    """Each word's factor under channel j (1 where not `valid`)."""
    j = jnp.minimum(j, T["ch_qubit"].shape[0] - 1)
    x, z = merge.halves(words)
    q = T["ch_qubit"][j]
    code = (pauli_words.get_site(x, q) | pauli_words.get_site(z, q) << 1).astype(jnp.int32)
    return jnp.where(valid, T["ch_factor"][j][code], 1)


def channel_unit(buf: Buffer, u, T, params, limits, cfg: Config, record: bool = False):
    """Pauli channels: each scales a word by the factor of its code on the channel's qubit; per gate,
    the coefficient rule drops what falls under it after each channel. Record: the product of the
    factors where the word stays (the channels keep words in their slots)."""
    each = Limits(min_abs_coeff=limits.min_abs_coeff) if cfg.rules.per == "gate" else Limits()

    def one(j, valid, b):
        b = b._replace(coeffs=b.coeffs * _channel_factor(T, j, valid, b.words).astype(b.coeffs.dtype))
        return _drop_rules(b, each) if each.min_abs_coeff is not None else b

    out = _elements(T["u_start"][u], T["u_count"][u], cfg, one, buf)
    if cfg.rules.per == "layer":
        out = _cap(_drop_rules(out, limits), limits, cfg.capacity)
    if not record:
        return out, jnp.int32(0)
    product = lambda j, valid, f: f * _channel_factor(T, j, valid, buf.words).astype(f.dtype)
    factor = _elements(T["u_start"][u], T["u_count"][u], cfg, product, jnp.ones_like(buf.coeffs))
    return out, jnp.int32(0), _diagonal_record(factor, out.live, buf.coeffs.dtype)


def truncate_unit(buf: Buffer, u, T, params, limits, cfg: Config, record: bool = False):
    """The rules on the whole buffer (the end of a step whose rotations deferred them)."""
    out = _cap(_drop_rules(buf, limits), limits, cfg.capacity)
    return (out, jnp.int32(0)) + ((_diagonal_record(1, out.live, buf.coeffs.dtype),) if record else ())


def noop_unit(buf: Buffer, u, T, params, limits, cfg: Config, record: bool = False):
    return (buf, jnp.int32(0)) + ((_diagonal_record(1, buf.live, buf.coeffs.dtype),) if record else ())


UNIT_FUNCTIONS = {schedule.U_MERGE: merge_unit, schedule.U_CLIFFORD: clifford_unit, schedule.U_SPLIT: split_unit,
                  schedule.U_CHANNEL: channel_unit, schedule.U_TRUNCATE: truncate_unit, schedule.U_NOOP: noop_unit,
                  schedule.U_LAYER: layer_unit}


def apply_unit(buf: Buffer, u, T, params, limits, cfg: Config, live_count=None, active=True, acts=None,
               record: bool = False, rotation=None):
    """(buffer after unit u, the slots it needed if it overflowed and was not applied, else 0), and
    with `record` (not with cfg.stop) the unit's Record as a third entry (a LAYER unit is a no-op
    then: adjoint.py records its passes one by one, layer_pass).

    One `lax.switch` whose branches are the unit kinds, a rotation's once per room (its room is
    picked with its kind: one conditional a rotation, not two nested ones, each of which costs a
    copy of the buffer on CPUs and a wait for the host on GPUs), then the largest-terms cut after a
    rotation. live_count: the buffer's live words, when the caller knows it. acts: a superset of
    the live words' `support`, when the caller keeps one. rotation: the unit's `unit_rotation`, when the
    caller has it. Inactive: a no-op."""
    if record and cfg.stop:
        raise ValueError("units record their maps only in programs that cut (no stop)")
    live_count = _count(buf.live) if live_count is None else live_count
    kind = T["u_kind"][u]
    split = kind == schedule.U_SPLIT
    pick = 0
    if schedule.U_SPLIT in cfg.units:  # (a program without rotations one by one holds no code for their test)
        rotation = unit_rotation(buf, u, T, params, acts, split & active) if rotation is None else rotation
        pick = _split_pick(live_count, rotation[3], cfg)
    kinds = len(UNIT_FUNCTIONS)
    index = jnp.where(active, jnp.where(split & (pick > 0), kinds + pick - 1, kind), schedule.U_NOOP)
    common = dict(T=T, params=params, limits=limits, cfg=cfg, **({"record": True} if record else {}))
    own_code = [k for k in cfg.units if k != schedule.U_SPLIT and not (record and k == schedule.U_LAYER)]
    branches = [partial(UNIT_FUNCTIONS[k] if k in own_code else noop_unit, u=u, **common) for k in range(kinds)]
    if record:
        branches[schedule.U_SPLIT] = _unsplit
    if schedule.U_SPLIT in cfg.units:
        branches += _room_branches(u, T, limits, cfg, rotation, record)
    out = lax.switch(shared(index), [lambda b, f=f: f(b) for f in branches], buf)
    buf, need = out[:2]
    if schedule.U_SPLIT in cfg.units:
        buf = _cap(buf, limits.off_unless(split & ~T["u_defer"][u]), cfg.capacity)
    if not record:
        return buf, need
    rec = out[2]
    if schedule.U_SPLIT in cfg.units and limits.max_terms is not None:  # what the cut dropped feeds nothing
        live, c = buf.live, cfg.capacity
        kept = jnp.where(live, OWN, 0) | jnp.where(live[jnp.minimum(rec.to, c - 1)] & (rec.to < c), FED, 0)
        code = jnp.where(split, rec.code & (kept | TURN | NEG), rec.code)
        rec = rec._replace(code=code.astype(jnp.uint8))
    return buf, need, rec


# ---- the loop ------------------------------------------------------------------------------------------

class Progress(NamedTuple):
    unit: jax.Array  # the next unit to apply (the one that overflowed, if stopped)
    need: jax.Array  # the slots the overflowing unit needed (0: it did not stop; merge.COLLIDED: a collision;
    #                  WHOLE_ROOM: a rotation that needs the room this program leaves out)
    unit_terms: jax.Array  # (U,) int32 live terms after each unit
    peak: jax.Array  # int32 largest live count


def run(T: dict, buf: Buffer, start, params, limits: Limits, cfg: Config):
    """Apply units start .. num_units - 1 (or, with cfg.stop, until one overflows or reports a collision).

    A while loop whose step applies cfg.units_per_test units in a fixed-count loop (the units past
    the end or past an overflow are no-ops): a GPU copies a while loop's predicate to the host at
    every step and waits for it, so it tests once per that many units."""
    if cfg.static_loops:
        return _run_static(T, buf, params, limits, cfg)
    num_units = T["num_units"]

    def cond(carry):
        u, b, need, terms, peak, live, acts = carry
        return (u < num_units) & (need == 0)

    def one(carry):
        u, b, need, terms, peak, live, acts = carry
        active = (u < num_units) & (need == 0)
        b, need_u = apply_unit(b, u, T, params, limits, cfg, live_count=live, active=active,
                               acts=acts if cfg.skip_unmet else None)
        # a batch stops together (the unit's own overflow and collision tests are shared), so the unit
        # index stays one for the batch and every lax.switch on it keeps one branch (runtime/batching.py)
        need = jnp.where(active, shared(need_u), need)
        advance = active & (need == 0)
        count = _count(b.live)
        terms = terms.at[u].set(jnp.where(advance, count, terms[u]))
        if cfg.skip_unmet:
            acts = acts_after(T, jnp.minimum(u, num_units - 1), b, acts)
        return jnp.where(advance, u + 1, u), b, need, terms, jnp.maximum(peak, count), count, acts

    def body(carry):
        if cfg.units_per_test == 1:
            return one(carry)
        return lax.fori_loop(0, cfg.units_per_test, lambda i, c: one(c), carry)

    terms = jnp.zeros(T["u_kind"].shape[0], jnp.int32)
    live = _count(buf.live)
    u, buf, need, terms, peak, _, _ = lax.while_loop(cond, body, (jnp.asarray(start, jnp.int32), buf, jnp.int32(0),
                                                                  terms, live, live,
                                                                  support(buf) if cfg.skip_unmet else jnp.uint32(0)))
    return buf, Progress(u, need, terms, peak)


def _run_static(T: dict, buf: Buffer, params, limits: Limits, cfg: Config):
    """All units (padding ones are no-ops) in a scan of checkpointed segments: JAX differentiates it in
    both modes, holding O(sqrt(units)) buffers in reverse mode."""
    total = T["u_kind"].shape[0]
    seg = 1 << ((total.bit_length() - 1 + 1) // 2)

    def segment(carry, s):
        def one(c, i):
            b, peak = c
            u = s * seg + i
            b, _ = apply_unit(b, u, T, params, limits, cfg)
            count = _count(b.live)
            return (b, jnp.maximum(peak, count)), count

        return lax.scan(one, carry, jnp.arange(seg))

    peak = _count(buf.live)
    (buf, peak), terms = lax.scan(jax.checkpoint(segment), (buf, peak), jnp.arange(total // seg))
    return buf, Progress(jnp.asarray(total, jnp.int32), jnp.int32(0), terms.reshape(-1), peak)


# ---- the value: the live words' overlaps with the product state (algebra.overlap) -------------------

def value(buf: Buffer, table):
    return jnp.sum(jnp.where(buf.live, buf.coeffs, 0) * table_overlaps(buf.x, buf.z, table).astype(buf.coeffs.dtype))
