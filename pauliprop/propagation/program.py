"""Lowering: a Circuit becomes a Program, the static gate table that `propagate` scans.

One row per operation, in circuit order, with one of five kinds:

  CLIFFORD  a 1- or 2-qubit Clifford as a 16-entry table of images and signs on the local
            symplectic code (a 1-qubit gate uses qubits (a, a) and the diagonal codes c | c << 2).
  ROTATION  exp(-i a/2 G) for a Pauli word G: splits anticommuting words (merge follows).
  QUARTER   a rotation with a fixed angle k*pi/2: a Clifford that maps words in place.
  CHANNEL   a single-qubit Pauli channel: scales the coefficients of X, Z, Y words.
  DAMP      amplitude damping: Z -> (1-g) Z + g I, X, Y -> sqrt(1-g) (splits Z words).

Angles are scale * params[index] + offset (index -1: fixed). Every backend reads the same gate
records (`pauliprop.circuits.gates`): the Clifford tables are derived from the gates' unitaries.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..algebra import words
from ..circuits import gates
from ..circuits.circuit import Circuit, Param

CLIFFORD, ROTATION, QUARTER, CHANNEL, DAMP = range(5)
KIND_NAMES = ("clifford", "rotation", "quarter", "channel", "damp")


class Program(NamedTuple):
    """Arrays with one row per operation (numpy; converted to jax in propagate)."""

    kind: np.ndarray  # (L,) int32
    qubits: np.ndarray  # (L, 2) int32
    table: np.ndarray  # (L, 16) int32: Clifford image codes
    sign: np.ndarray  # (L, 16) float: Clifford signs; CHANNEL: factors for codes I, X, Z, Y in [:4]
    gx: np.ndarray  # (L, W) uint32: rotation generators
    gz: np.ndarray  # (L, W) uint32
    param_index: np.ndarray  # (L,) int32, -1 for fixed angles
    scale: np.ndarray  # (L,) float
    offset: np.ndarray  # (L,) float (fixed angle; DAMP: gamma)
    num_qubits: int
    num_params: int

    @property
    def length(self) -> int:
        return int(self.kind.shape[0])


_IDENTITY_TABLE = np.arange(16, dtype=np.int32)
_ONES = np.ones(16)  # a row's sign where nothing changes sign (shared by the rows; never written)
_ONES.flags.writeable = False


def _table_1q(image, sign):
    """Embed a 1-qubit action in a 16-entry table on the diagonal codes c | c << 2."""
    table, sgn = _IDENTITY_TABLE.copy(), np.ones(16)
    for c in range(4):
        table[c | c << 2] = image[c] | image[c] << 2
        sgn[c | c << 2] = sign[c]
    return table, sgn


_clifford_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def clifford_table(gate: gates.GateDef):
    """The 16-entry (image, sign) table of a Clifford gate, derived from its unitary (cached)."""
    if gate.name not in _clifford_cache:
        image, sign = gates.clifford_action(gate.matrix())
        _clifford_cache[gate.name] = _table_1q(image, sign) if gate.num_qubits == 1 else (image, sign.astype(float))
    return _clifford_cache[gate.name]


def channel_factors(ins) -> np.ndarray:
    """Heisenberg scaling of the local codes I, X, Z, Y by a single-qubit Pauli channel."""
    name, a = ins.name, ins.args
    if name == "depolarize":
        px = py = pz = a[0] / 4
    elif name == "dephase":
        px, py, pz = 0.0, 0.0, a[0] / 2
    else:
        px, py, pz = a
    return np.array([1.0, 1 - 2 * (py + pz), 1 - 2 * (px + py), 1 - 2 * (px + pz)])


def lower(circuit: Circuit) -> Program:
    """Build the Program of a circuit (host-side, once per circuit). Column by column: a row's table and
    sign are shared arrays (a gate's cached ones, or the identity's), stacked once at the end (the 127-qubit
    kicked Ising's 5,420 rows: 0.15 s with a dict and fresh arrays a row, 2-core CPU)."""
    n = circuit.num_qubits
    w = words.num_lanes(n)
    kind, qubits, table, sign, gen, param_index, scale, offset = ([] for _ in range(8))
    for ins in circuit.instructions:
        g = ins.gate
        row_kind, row_table, row_sign, row_gen, row_param, row_scale, row_offset = \
            CLIFFORD, _IDENTITY_TABLE, _ONES, None, -1, 0.0, 0.0
        if g.kind == "clifford":
            if g.name == "id":
                continue
            row_table, row_sign = clifford_table(g)
        elif g.kind == "rotation":
            word = {q: ch for q, ch in zip(ins.qubits, ins.generator) if ch != "I"}
            angle = g.fixed_angle if g.fixed_angle is not None else ins.args[0]
            if not word:
                continue  # exp(-i a/2 I) is a global phase
            row_gen = word
            if isinstance(angle, Param):
                row_kind, row_param, row_scale, row_offset = ROTATION, angle.index, angle.scale, angle.offset
            else:
                k = gates.quarter_turns(angle)
                if k is not None and k % 4 == 0:
                    continue  # identity up to phase
                row_kind = QUARTER if k is not None else ROTATION
                row_offset = float(angle if k is None else k * math.pi / 2)
        elif g.name == "amplitude_damp":  # channels
            row_kind, row_offset = DAMP, ins.args[0]
        else:
            row_kind, row_sign = CHANNEL, np.concatenate([channel_factors(ins), _ONES[4:]])
        kind.append(row_kind)
        qubits.append((ins.qubits[0], ins.qubits[-1]))
        table.append(row_table)
        sign.append(row_sign)
        gen.append(row_gen or {})
        param_index.append(row_param)
        scale.append(row_scale)
        offset.append(row_offset)

    L = len(kind)
    gx, gz = words.pack(gen, n) if L else (np.zeros((0, w), np.uint32),) * 2
    return Program(
        kind=np.array(kind, dtype=np.int32),
        qubits=np.array(qubits, dtype=np.int32).reshape(L, 2),
        table=np.array(table, dtype=np.int32).reshape(L, 16),
        sign=np.array(sign, dtype=float).reshape(L, 16),
        gx=gx.reshape(L, w), gz=gz.reshape(L, w),
        param_index=np.array(param_index, dtype=np.int32),
        scale=np.array(scale, dtype=float),
        offset=np.array(offset, dtype=float),
        num_qubits=n,
        num_params=circuit.num_params,
    )


def row_masks(prog: Program) -> list[int]:
    """The qubits each row acts on, as bit masks (Python ints): a rotation's or quarter turn's generator's
    qubits, a Clifford's two qubits (one, for a one-qubit gate), a channel's or damping's qubit. Made from the
    lanes that hold bits (a generator acts on a few qubits whatever the width: 100,000 rows of 313 lanes took
    0.25 s as whole rows' bytes, 5,420 rows of 127 qubits 70 ms a row at a time)."""
    kind = np.asarray(prog.kind)
    bits = prog.gx | prog.gz  # (R, W): 32 qubits a lane, lane 0 lowest
    generated = np.isin(kind, (ROTATION, QUARTER))
    masks = [0] * len(kind)
    rows, lanes = np.nonzero(bits)
    for r, lane, v in zip(rows.tolist(), lanes.tolist(), bits[rows, lanes].tolist()):
        masks[r] |= v << (words.LANE_BITS * lane)
    one = np.asarray(prog.qubits[:, 0]).tolist()
    two = np.where(kind == CLIFFORD, prog.qubits[:, 1], prog.qubits[:, 0]).tolist()
    return [m if g else (1 << a) | (1 << b) for m, g, a, b in zip(masks, generated.tolist(), one, two)]


def light_cone(prog: Program, support: int) -> np.ndarray:
    """The rows that can act on an observable whose words act on the qubits of `support` (a bit mask):
    walking the rows backward, a row is kept when it acts on a qubit the observable's words can reach
    by then, and they can then reach all of its qubits. A row outside acts on every word as the
    identity (a Clifford maps I to I, a rotation commutes, a channel's factor on I is 1), so leaving
    it out changes nothing. Returns the kept rows, in circuit order."""
    return light_cone_reach(prog, support)[0]


def light_cone_reach(prog: Program, support: int) -> tuple[np.ndarray, int]:
    """(light_cone's rows, the qubits the words can reach through them: `support` and every kept row's qubits,
    as a bit mask)."""
    kept = []
    masks = row_masks(prog)
    for r in range(prog.length - 1, -1, -1):
        acts = masks[r]
        if acts & support:
            kept.append(r)
            support |= acts
    return np.array(kept[::-1], dtype=np.int64), support


def mask_qubits(mask: int) -> np.ndarray:
    """The qubits (increasing) of a bit mask."""
    bits = np.frombuffer(mask.to_bytes(words.LANE_BITS // 8 * max(1, words.num_lanes(mask.bit_length())), "little"),
                         np.uint8)
    return np.flatnonzero(np.unpackbits(bits, bitorder="little"))


def renumbered(prog: Program, qubits: np.ndarray) -> Program:
    """The program on `qubits` alone (increasing; every row acts within them), qubit qubits[k] as qubit k: its
    words take num_lanes(len(qubits)) lanes. The order of the qubits is kept, so the schedule's units are the
    same."""
    index = np.full(prog.num_qubits, -1, np.int32)
    index[qubits] = np.arange(len(qubits), dtype=np.int32)
    lanes, rows = words.num_lanes(len(qubits)), np.arange(len(qubits))
    return prog._replace(qubits=index[prog.qubits], gx=words.moved(prog.gx, qubits, rows, lanes),
                         gz=words.moved(prog.gz, qubits, rows, lanes), num_qubits=len(qubits))


def restrict(prog: Program, rows: np.ndarray) -> Program:
    """The program of the given rows only."""
    take = lambda a: a[rows]
    return prog._replace(kind=take(prog.kind), qubits=take(prog.qubits), table=take(prog.table), sign=take(prog.sign),
                         gx=take(prog.gx), gz=take(prog.gz), param_index=take(prog.param_index),
                         scale=take(prog.scale), offset=take(prog.offset))
