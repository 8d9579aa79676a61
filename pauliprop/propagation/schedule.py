"""Steps: the lowered circuit grouped into what one iteration of the propagation loop applies.

The observable walks the circuit backward, and `schedule` cuts that walk into steps:

  MERGE     the full merge: the observable itself (which may repeat words) before the first
            step, and each amplitude damping (whose damped words may equal any other word).
  CLIFFORD  a maximal run of Clifford operations (Clifford gates and rotations by multiples of
            pi/2). Applied as one dense map composed on the host (`algebra/clifford.py`: one pass
            over the words whatever the run's length), or gate by gate inside the step where the
            weight must be checked after every gate or the run is short beside the number of qubits.
  LAYER     consecutive rotations on pairwise disjoint qubits (they commute): exp(-i a/2 G).
  CHANNEL   consecutive Pauli channels (they commute): each scales a word by its code's factor.

Whether an operation is Clifford is read off the circuit alone: a rotation whose angle is a
`Param` is a rotation at every value (so circuits of one shape share one program); a fixed angle
that is a multiple of pi/2 is Clifford.

The tables are padded to bucketed lengths (`bucket`) so that circuits of similar size share one
compiled program: a padding step is a NOOP.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..algebra import clifford, words
from . import program

MERGE, CLIFFORD, LAYER, CHANNEL, NOOP = range(5)
KIND_NAMES = ("merge", "clifford", "layer", "channel", "noop")
TABLE, GENERATOR = 0, 1  # how a Clifford element is given: 16-entry table on (a, b), or a quarter turn of G
MIN_BUCKET = 64
MIN_MAPS = 32  # dense maps are 512 W^2 bytes each (x and z images): a small table of them still shares programs
MAPS_PADDING_BYTES = 1 << 26  # ...up to 64 MiB of padding; past 2,048 qubits the table pads to fewer maps (at
#                               10,000 qubits 32 maps took 1.5 GB and 3.2 s to fill: 2 maps now)


def bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """The padded length of a table of n rows: the next power of two, at least `minimum`."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


class Schedule(NamedTuple):
    """The steps of one circuit (host arrays, backward order), and the operations they hold."""

    num_qubits: int
    num_lanes: int
    num_ops: int  # rows of the lowered program (PropagationStats.terms has one entry per row)
    # steps
    kind: np.ndarray  # (S,) int32
    start: np.ndarray  # (S,) int32: first element (in the table of the step's kind)
    count: np.ndarray  # (S,) int32: elements
    dense: np.ndarray  # (S,) bool: CLIFFORD applied as the map maps[start]
    # Clifford elements
    cl_kind: np.ndarray  # (Gc,) TABLE or GENERATOR
    cl_qubits: np.ndarray  # (Gc, 2)
    cl_table: np.ndarray  # (Gc, 16) image codes
    cl_sign: np.ndarray  # (Gc, 16) +-1
    cl_gx: np.ndarray  # (Gc, W)
    cl_gz: np.ndarray  # (Gc, W)
    cl_turns: np.ndarray  # (Gc,) quarter turns k (GENERATOR)
    cl_op: np.ndarray  # (Gc,) row of the lowered program
    # dense maps
    map_x: np.ndarray  # (M, 2N, W)
    map_z: np.ndarray  # (M, 2N, W)
    map_phase: np.ndarray  # (M, 2N)
    # rotations
    rot_gx: np.ndarray  # (Gr, W)
    rot_gz: np.ndarray  # (Gr, W)
    rot_index: np.ndarray  # (Gr,) parameter index, -1 for a fixed angle
    rot_scale: np.ndarray  # (Gr,)
    rot_offset: np.ndarray  # (Gr,)
    rot_op: np.ndarray  # (Gr,)
    # channels
    ch_qubit: np.ndarray  # (Gch,)
    ch_factor: np.ndarray  # (Gch, 4) factors of the codes I, X, Z, Y
    ch_op: np.ndarray  # (Gch,)
    # merges (amplitude damping; the first step merges the observable with gamma 0)
    mg_qubit: np.ndarray  # (Gm,)
    mg_gamma: np.ndarray  # (Gm,)
    mg_op: np.ndarray  # (Gm,) -1: the observable's merge
    step_ops: tuple  # each step's rows of the lowered program, in the order applied (host only)

    @property
    def num_steps(self) -> int:
        return int(self.kind.shape[0])


def quarter_table(gx: np.ndarray, gz: np.ndarray, turns: int, a: int, b: int):
    """The 16-entry (image, sign) table on qubits (a, b) of a quarter turn of a generator on them (shared,
    read-only arrays: one per generator's letters and turns)."""
    site = lambda words, q: int((words[q // 32] >> np.uint32(q % 32)) & 1)
    local = (site(gx, a), site(gz, a), site(gx, b), site(gz, b))
    return _local_quarter_table(local, int(turns) % 4, a == b)


@functools.lru_cache(maxsize=None)
def _local_quarter_table(local: tuple, turns: int, one_qubit: bool):
    """quarter_table on qubits (0, 1) for the generator with bits local = (x_a, z_a, x_b, z_b): the
    table depends on the generator's letters on (a, b) and the turns only (so it is built once)."""
    codes = np.arange(16)
    x = ((codes & 1) | ((codes >> 2) & 1) << 1).astype(np.uint32)[:, None]
    z = (((codes >> 1) & 1) | ((codes >> 3) & 1) << 1).astype(np.uint32)[:, None]
    gx = np.array([local[0] | local[2] << 1], np.uint32)
    gz = np.array([local[1] | local[3] << 1], np.uint32)
    if one_qubit:  # a one-qubit table acts on the diagonal codes c | c << 2 (program._table_1q)
        gx, gz = gx & np.uint32(1), gz & np.uint32(1)
        x, z = x & np.uint32(1), z & np.uint32(1)
    rx, rz, sign = clifford.apply_quarter_numpy(x, z, gx, gz, turns)
    bit = lambda words, q: ((words[:, 0] >> np.uint32(q)) & 1).astype(np.int32)
    if one_qubit:
        image = bit(rx, 0) | bit(rz, 0) << 1
        image = image | image << 2
        diag = (codes & 3) == (codes >> 2)
        image, sign = np.where(diag, image, codes).astype(np.int32), np.where(diag, sign, 1.0)
    else:
        image = (bit(rx, 0) | bit(rz, 0) << 1 | bit(rx, 1) << 2 | bit(rz, 1) << 3).astype(np.int32)
    image.flags.writeable = sign.flags.writeable = False  # cached: every caller shares them
    return image, sign


def prefer_dense(num_gates: int, num_lanes: int, backend: str) -> bool:
    """Whether a Clifford run is cheaper as one dense map than gate by gate (a cost model).

    The map looks up 8 W bytes of every word in its tables, about 4 W + 1 ns a byte on a 2-core CPU
    (measured: 74 ms for 131,072 words of 4 lanes). Gate by gate, a CPU pays about one copy of the
    buffer a gate (0.6 ns a byte, 8 W + 12 bytes a slot); a GPU sweeps all words, eight gates to a
    launch, where the map takes W / 4 launches."""
    if num_lanes == 1:  # a map of 64 bits is cheap, and programs without a gate loop compile faster
        return True
    if backend == "cpu":
        return num_gates * (2 * num_lanes + 3) >= 3 * num_lanes * (4 * num_lanes + 1)
    return num_gates >= 4 * num_lanes


def schedule(prog: program.Program, weight_each_gate: bool = False, backend: str = "cpu") -> Schedule:
    """Group a lowered Program into steps (backward order).

    weight_each_gate: Clifford runs are applied gate by gate, so that the weight rule can drop a
    word after the gate that made it too heavy (truncation per gate with max_weight).
    """
    n, w = prog.num_qubits, words.num_lanes(prog.num_qubits)
    masks = program.row_masks(prog)  # each row's qubits as a bit mask
    steps: list[list] = [[MERGE, [-1], 0]]  # [kind, [rows], the qubits a LAYER step holds (a bit mask)]
    kinds = prog.kind.tolist()
    for r in range(prog.length - 1, -1, -1):
        k = kinds[r]
        if k in (program.CLIFFORD, program.QUARTER):
            kind = CLIFFORD
        elif k == program.ROTATION:
            kind = LAYER
        elif k == program.CHANNEL:
            kind = CHANNEL
        else:
            kind = MERGE
        last = steps[-1]
        support = masks[r] if kind == LAYER else 0
        if kind == LAYER and last[0] == LAYER:
            if not (support & last[2]):
                last[1].append(r)
                last[2] |= support
                continue
        elif kind in (CLIFFORD, CHANNEL) and last[0] == kind:
            last[1].append(r)
            continue
        steps.append([kind, [r], support])

    cl, maps, rot, ch, mg = [], [], [], [], []
    kind_a, start_a, count_a, dense_a = [], [], [], []
    for kind, rows, _ in steps:
        dense = False
        if kind == CLIFFORD:
            dense = not weight_each_gate and prefer_dense(len(rows), w, backend)
            elems = [_clifford_element(prog, r, w, masks[r]) for r in rows]
            if dense:
                start = len(maps)
                maps.append(_compose(elems, w))
            else:
                start = len(cl)
                cl.extend(elems)
        elif kind == LAYER:
            start = len(rot)
            rot.extend(rows)
        elif kind == CHANNEL:
            start = len(ch)
            ch.extend(rows)
        else:
            start = len(mg)
            mg.extend(rows)
        kind_a.append(kind)
        start_a.append(start)
        count_a.append(1 if dense else len(rows))
        dense_a.append(dense)

    two_n = 64 * w
    if maps:
        map_x = np.stack([m.image_x for m in maps])
        map_z = np.stack([m.image_z for m in maps])
        map_phase = np.stack([m.phase for m in maps])
    else:
        map_x = map_z = np.zeros((0, two_n, w), np.uint32)
        map_phase = np.zeros((0, two_n), np.int32)
    col = lambda items, i, dtype: np.array([e[i] for e in items], dtype=dtype)
    rot = np.array(rot, dtype=np.int64)
    ch = np.array(ch, dtype=np.int64)
    mg_rows = np.array(mg, dtype=np.int64)
    return Schedule(
        num_qubits=n, num_lanes=w, num_ops=prog.length,
        kind=np.array(kind_a, np.int32), start=np.array(start_a, np.int32), count=np.array(count_a, np.int32),
        dense=np.array(dense_a, bool),
        cl_kind=col(cl, 0, np.int32), cl_qubits=col(cl, 1, np.int32).reshape(-1, 2),
        cl_table=col(cl, 2, np.int32).reshape(-1, 16), cl_sign=col(cl, 3, np.int8).reshape(-1, 16),
        cl_gx=col(cl, 4, np.uint32).reshape(-1, w), cl_gz=col(cl, 5, np.uint32).reshape(-1, w),
        cl_turns=col(cl, 6, np.int32), cl_op=col(cl, 7, np.int32),
        map_x=map_x, map_z=map_z, map_phase=map_phase,
        rot_gx=prog.gx[rot].reshape(-1, w), rot_gz=prog.gz[rot].reshape(-1, w),
        rot_index=prog.param_index[rot].astype(np.int32), rot_scale=prog.scale[rot].astype(float),
        rot_offset=prog.offset[rot].astype(float), rot_op=rot.astype(np.int32),
        ch_qubit=prog.qubits[ch, 0].astype(np.int32), ch_factor=prog.sign[ch, :4].astype(float).reshape(-1, 4),
        ch_op=ch.astype(np.int32),
        mg_qubit=np.array([prog.qubits[r, 0] if r >= 0 else 0 for r in mg_rows], np.int32),
        mg_gamma=np.array([prog.offset[r] if r >= 0 else 0.0 for r in mg_rows], float),
        mg_op=mg_rows.astype(np.int32),
        step_ops=tuple(tuple(r for r in rows if r >= 0) for _, rows, _ in steps),
    )


def _clifford_element(prog: program.Program, r: int, w: int, mask: int):
    """(kind, qubits, table, sign, gx, gz, turns, row) of one Clifford row; mask: its qubits (program.row_masks).
    The arrays may be shared (schedule stacks them into new ones)."""
    zero = _zero_lanes(w)
    if int(prog.kind[r]) == program.CLIFFORD:
        return (TABLE, tuple(int(q) for q in prog.qubits[r]), prog.table[r], prog.sign[r].astype(np.int8),
                zero, zero, 0, r)
    turns = int(round(float(prog.offset[r]) / (math.pi / 2))) % 4
    a, b = (mask & -mask).bit_length() - 1, mask.bit_length() - 1  # its lowest and highest qubit
    if bin(mask).count("1") <= 2:
        table, sign = quarter_table(prog.gx[r], prog.gz[r], turns, a, b)
        return TABLE, (a, b), table, sign.astype(np.int8), zero, zero, 0, r
    return (GENERATOR, (a, b), np.arange(16, dtype=np.int32), np.ones(16, np.int8), prog.gx[r], prog.gz[r], turns, r)


@functools.lru_cache(maxsize=None)
def _zero_lanes(w: int) -> np.ndarray:
    zero = np.zeros(w, np.uint32)
    zero.flags.writeable = False
    return zero


_COMPOSED: dict = {}  # _compose's memo: the elements' content -> the map (the 64 newest)


def _compose(elems, w: int) -> clifford.CliffordMap:
    """The run's dense map: the 2N generators pushed through its elements in order (backward).
    Memoised on the elements' content: a circuit repeats its Clifford layers (the kicked Ising's
    RZZ(-pi/2) layer, 20 times a circuit and again for every angle of a sweep), and composing one
    costs about 9 ms on 127 qubits."""
    key = (w,) + tuple((kind, ab, np.asarray(table).tobytes(), np.asarray(sgn).tobytes(), np.asarray(gx).tobytes(),
                        np.asarray(gz).tobytes(), turns) for kind, ab, table, sgn, gx, gz, turns, _ in elems)
    if key not in _COMPOSED:
        if len(_COMPOSED) >= 64:
            del _COMPOSED[next(iter(_COMPOSED))]
        m = _compose_elements([e[:7] for e in elems], w)
        for a in m:
            a.setflags(write=False)  # shared by every schedule that holds the run
        _COMPOSED[key] = m
    return _COMPOSED[key]


def _compose_elements(elems, w: int) -> clifford.CliffordMap:
    x, z = clifford.generators(w)
    sign = np.ones(len(x))
    for kind, (a, b), table, sgn, gx, gz, turns in elems:
        if kind == TABLE:
            x, z, s = clifford.apply_table_numpy(x, z, a, b, table, sgn)
        else:
            x, z, s = clifford.apply_quarter_numpy(x, z, gx, gz, turns)
        sign = sign * s
    return clifford.map_from_images(x, z, sign)


def min_maps(num_lanes: int) -> int:
    """The fewest maps a padded table holds: MIN_MAPS, fewer where they would pass MAPS_PADDING_BYTES."""
    fit = MAPS_PADDING_BYTES // (512 * num_lanes * num_lanes)
    return max(1, min(MIN_MAPS, 1 << max(0, fit.bit_length() - 1)))


def padded(s: Schedule, minimum: int = MIN_BUCKET) -> dict:
    """The schedule's tables as numpy arrays padded to bucketed lengths (the jitted loop's input)."""

    def pad(a, length, fill=0):
        out = np.full((length,) + a.shape[1:], fill, dtype=a.dtype)
        out[:a.shape[0]] = a
        return out

    steps = bucket(s.num_steps, minimum)
    gc, gr = bucket(len(s.cl_kind), minimum), bucket(len(s.rot_op), minimum)
    gch, gm = bucket(len(s.ch_op), minimum), bucket(len(s.mg_op), minimum)
    m = bucket(len(s.map_x), min_maps(s.num_lanes))
    return dict(
        kind=pad(s.kind, steps, NOOP), start=pad(s.start, steps), count=pad(s.count, steps),
        dense=pad(s.dense, steps),
        cl_kind=pad(s.cl_kind, gc), cl_qubits=pad(s.cl_qubits, gc), cl_table=pad(s.cl_table, gc),
        cl_sign=pad(s.cl_sign, gc, 1), cl_gx=pad(s.cl_gx, gc), cl_gz=pad(s.cl_gz, gc),
        cl_turns=pad(s.cl_turns, gc), cl_op=pad(s.cl_op, gc, -1),
        map_x=pad(s.map_x, m), map_z=pad(s.map_z, m), map_phase=pad(s.map_phase, m),
        rot_gx=pad(s.rot_gx, gr), rot_gz=pad(s.rot_gz, gr), rot_index=pad(s.rot_index, gr, -1),
        rot_scale=pad(s.rot_scale, gr), rot_offset=pad(s.rot_offset, gr), rot_op=pad(s.rot_op, gr, -1),
        ch_qubit=pad(s.ch_qubit, gch), ch_factor=pad(s.ch_factor, gch, 1.0), ch_op=pad(s.ch_op, gch, -1),
        mg_qubit=pad(s.mg_qubit, gm), mg_gamma=pad(s.mg_gamma, gm), mg_op=pad(s.mg_op, gm, -1),
    )


# ---- units: what one iteration of the engine's loop applies --------------------------------------------

U_MERGE, U_CLIFFORD, U_SPLIT, U_CHANNEL, U_TRUNCATE, U_NOOP, U_LAYER = range(7)
UNIT_NAMES = ("merge", "clifford", "split", "channel", "truncate", "noop", "layer")


class Units(NamedTuple):
    """The loop's iterations (backward order), each over elements of the schedule's tables."""

    kind: np.ndarray  # (U,) int32
    start: np.ndarray  # (U,) int32
    count: np.ndarray  # (U,) int32
    dense: np.ndarray  # (U,) bool (CLIFFORD: apply maps[start])
    defer: np.ndarray  # (U,) bool: the truncation rules wait for the end of the step (per="layer")
    unit_of_op: np.ndarray  # (L,) int32: the unit after which row r's term count is read

    @property
    def length(self) -> int:
        return int(self.kind.shape[0])


def units(s: Schedule, per: str = "gate", layers: bool = False) -> Units:
    """The schedule's steps as loop iterations.

    Without `layers`, each rotation is a SPLIT unit. With `layers`, rotations share LAYER units whose
    passes (engine.layer_unit, tiled.rotation_unit) give the same result as the rotations one by one:
    - per="gate": each rotation joins the rotation unit right before it (across steps, where no other
      unit comes between) when it has the same letter as that unit's rotations on every qubit they
      share (`_joins`), so that all of a unit's rotations commute;
    - per="layer": the rules wait for the end of each step: the step's rotations (on disjoint qubits)
      are cut into runs whose lowest qubits increase or decrease (`monotone_runs`), they defer the
      rules, and a TRUNCATE unit applies them to the whole buffer after the step's last rotation.
    """
    kind, start, count, dense, defer = [], [], [], [], []
    unit_of_op = np.zeros(s.num_ops, np.int32)
    gx, gz = as_ints(s.rot_gx), as_ints(s.rot_gz)  # the rotations' generators as Python ints (_joins)
    unit_x = unit_z = 0  # the letters of the rotation unit being built (the OR of its generators)
    most = words.LANE_BITS * s.num_lanes

    def add(k, st, c, d=False, df=False, ops=()):
        for r in ops:
            unit_of_op[r] = len(kind)
        kind.append(k)
        start.append(st)
        count.append(c)
        dense.append(d)
        defer.append(df)

    for i in range(s.num_steps):
        k, st, c = int(s.kind[i]), int(s.start[i]), int(s.count[i])
        ops = s.step_ops[i]
        if k == MERGE:
            add(U_MERGE, st, 1, ops=ops)
        elif k == CLIFFORD:
            add(U_CLIFFORD, st, c, d=bool(s.dense[i]), ops=ops)
        elif k == CHANNEL:
            add(U_CHANNEL, st, c, ops=ops)
        else:
            deferred = per == "layer" and c > 1
            if layers and per == "gate":
                for j in range(st, st + c):  # each rotation joins the rotation unit before it where it may
                    after = bool(kind) and kind[-1] in (U_LAYER, U_SPLIT) and start[-1] + count[-1] == j
                    if after and _joins(unit_x, unit_z, count[-1], gx[j], gz[j], most):
                        kind[-1] = U_LAYER
                        count[-1] += 1
                        unit_of_op[int(s.rot_op[j])] = len(kind) - 1
                        unit_x, unit_z = unit_x | gx[j], unit_z | gz[j]
                    else:
                        add(U_SPLIT, j, 1, ops=(int(s.rot_op[j]),))
                        unit_x, unit_z = gx[j], gz[j]
            elif layers and c > 1:
                for first, length, _ in monotone_runs(lowest_qubits(s.rot_gx[st:st + c], s.rot_gz[st:st + c])):
                    rows = tuple(int(r) for r in s.rot_op[st + first:st + first + length])
                    if length == 1:
                        add(U_SPLIT, st + first, 1, df=deferred, ops=rows)
                    else:
                        add(U_LAYER, st + first, length, df=deferred, ops=rows)
            else:
                for j in range(c):
                    add(U_SPLIT, st + j, 1, df=deferred, ops=(int(s.rot_op[st + j]),))
            if deferred:
                add(U_TRUNCATE, 0, 0, ops=ops)
    return Units(np.array(kind, np.int32), np.array(start, np.int32), np.array(count, np.int32),
                 np.array(dense, bool), np.array(defer, bool), unit_of_op)


def _joins(unit_x: int, unit_z: int, count: int, jx: int, jz: int, most: int) -> bool:
    """Whether a rotation (generator bits jx, jz) may join a unit of `count` rotations whose generators OR to
    unit_x, unit_z: at most `most` (32 W: one bit each in a word) of them, and on every qubit it shares with them
    the same letter. Then they commute, so a word's turns by some of them leave which of them it anticommutes with
    unchanged (each word meets the rotations it anticommutes with in circuit order, one a pass), and its
    anticommutation with each is the parity of its per-qubit anticommutations with the unit's letters over that
    rotation's support (tiled.layer_of's fold)."""
    shared = (unit_x | unit_z) & (jx | jz)
    return count < most and not shared & ((unit_x ^ jx) | (unit_z ^ jz))


def as_ints(rows: np.ndarray) -> list[int]:
    """Rows of W uint32 lanes as Python ints (lane l: bits 32 l .. 32 l + 31)."""
    return [int.from_bytes(r.astype("<u4").tobytes(), "little") for r in rows]


def lowest_qubits(gx: np.ndarray, gz: np.ndarray) -> np.ndarray:
    """The lowest qubit each generator (rows of W lanes) acts on."""
    site = (gx | gz).astype(np.uint64)
    lane = np.argmax(site != 0, axis=1)
    bits = site[np.arange(len(site)), lane]
    low = np.log2((bits & (~bits + np.uint64(1))).astype(np.float64)).astype(np.int64)
    return lane * words.LANE_BITS + low


def monotone_runs(qubits: np.ndarray) -> list[tuple[int, int, bool]]:
    """(first, length, decreasing) of the maximal runs of a sequence whose values only increase or only
    decrease (distinct values: a layer's rotations act on disjoint qubits)."""
    runs, first = [], 0
    for i in range(1, len(qubits) + 1):
        length = i - first
        if i < len(qubits) and (length < 2 or (qubits[i] < qubits[i - 1]) == (qubits[first + 1] < qubits[first])):
            continue
        runs.append((first, length, bool(length > 1 and qubits[first + 1] < qubits[first])))
        first = i
    return runs


def padded_units(u: Units, minimum: int = MIN_BUCKET) -> dict:
    length = bucket(u.length, minimum)
    pad = lambda a, fill=0: np.concatenate([a, np.full(length - len(a), fill, a.dtype)])
    return dict(u_kind=pad(u.kind, U_NOOP), u_start=pad(u.start), u_count=pad(u.count), u_dense=pad(u.dense),
                u_defer=pad(u.defer), unit_of_op=np.concatenate([u.unit_of_op, np.zeros(
                    bucket(len(u.unit_of_op), minimum) - len(u.unit_of_op), np.int32)]))
