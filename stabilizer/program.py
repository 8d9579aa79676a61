"""Lowering a Stim circuit to op tables that one `lax.scan` runs (compile time flat in depth).

Every instruction becomes windows of up to K slots on disjoint qubits, of six kinds:

  GATE        a two-qubit Clifford on (q0, q1) per slot (single-qubit gates act on (q, spare));
              both actions are stored: forward (for frames) and Heisenberg with signs (for the tableau)
  MEASURE     Z measurements (record offset, inversion, reset after); other bases and Pauli products
              are rotated to Z by GATE windows around them, so frames and tableau share one rule
  NOISE       one of 15 two-qubit Pauli events per slot (one-qubit channels use XI, YI, ZI)
  CORRELATED  E / ELSE_CORRELATED_ERROR: one Pauli product, fired per shot
  FEEDBACK    a Pauli on a qubit, controlled by an earlier record bit
  MPAD        padding record bits

REPEAT blocks stay loops: a program is a list of segments, each an op table or a (count, program)
repeat. Record positions are offsets from the running measurement count, so a loop body is one table.
Slot padding uses the spare qubit (index num_qubits) and the scratch record row; their contents are
never read back.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from pauliprop import gates as _gates

from .circuit import Circuit, CircuitInstruction, CircuitRepeatBlock, product_groups
from .simulator import _FEEDBACK, _PAIRS, canonical_gate, disjoint_runs

GATE, MEASURE, NOISE, CORRELATED, FEEDBACK, MPAD = range(6)
KINDS = ("gate", "measure", "noise", "correlated", "feedback", "mpad")
_XBIT, _ZBIT = {"I": 0, "X": 1, "Y": 1, "Z": 0}, {"I": 0, "X": 0, "Y": 1, "Z": 1}
_SINGLE_EVENT = {"X": _PAIRS.index(("X", "I")), "Y": _PAIRS.index(("Y", "I")), "Z": _PAIRS.index(("Z", "I"))}


@cache
def gate_tables(stim_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward image, Heisenberg image, Heisenberg sign) on two-qubit codes (a single-qubit gate acts
    on the first qubit, identity on the second)."""
    g = _gates.GATES[canonical_gate(stim_name)]
    fwd, _ = _gates.clifford_action(g.matrix().conj().T)
    inv, sign = _gates.clifford_action(g.matrix())
    if g.num_qubits == 1:
        codes = np.arange(16)
        lo, hi = codes & 3, codes & 12
        return fwd[lo] | hi, inv[lo] | hi, sign[lo]
    return fwd, inv, sign


_IDENTITY = gate_tables("I")


@dataclass
class _Op:
    kind: int
    slots: list  # per slot: dict of fields
    gate: str = "I"
    probs: tuple = ()
    advance: int = 0
    is_else: bool = False


class _Lowering:
    def __init__(self, num_qubits: int):
        self.spare = num_qubits
        self.ops: list[_Op] = []

    def gate(self, name: str, groups: list[tuple[int, ...]]):
        for run in disjoint_runs(groups):
            self.ops.append(_Op(GATE, [{"q": (g[0], g[1] if len(g) > 1 else self.spare)} for g in run], gate=name))

    def basis(self, paulis_qubits: list[tuple[str, int]]):
        """Rotate X or Y factors to Z (each rotation is its own inverse)."""
        for p, gate in (("X", "H"), ("Y", "H_YZ")):
            qs = [(q,) for b, q in paulis_qubits if b == p]
            if qs:
                self.gate(gate, qs)

    def measure(self, slots: list[dict], reset: bool, record: bool, flip: float = 0.0):
        """Z measurements on disjoint qubits (slot: q, invert); records in slot order."""
        op_slots = []
        for i, s in enumerate(slots):
            op_slots.append({"q": (s["q"], self.spare), "rec": i if record else -1, "invert": s.get("invert", False),
                             "reset": reset})
        self.ops.append(_Op(MEASURE, op_slots, probs=(flip,), advance=len(slots) if record else 0))

    def products(self, prods: list[list[tuple[str, int]]], inverts: list[bool], flip: float):
        """Measure Pauli products on distinct qubits (per product): basis change, CX parity onto the
        first qubit, Z measurement, undo."""
        groups = [tuple(q for _, q in p) for p in prods]
        start = 0
        for run in disjoint_runs(groups):
            ps, inv = prods[start:start + len(run)], inverts[start:start + len(run)]
            start += len(run)
            factors = [f for p in ps for f in p]
            self.basis(factors)
            width = max(len(p) for p in ps)
            for j in range(1, width):
                self.gate("CX", [(p[j][1], p[0][1]) for p in ps if len(p) > j])
            self.measure([{"q": p[0][1], "invert": v} for p, v in zip(ps, inv)], reset=False, record=True, flip=flip)
            for j in reversed(range(1, width)):
                self.gate("CX", [(p[j][1], p[0][1]) for p in ps if len(p) > j])
            self.basis(factors)

    def instruction(self, ins: CircuitInstruction):
        d, ts = ins.definition, ins.targets
        p = ins.gate_args[0] if ins.gate_args else 0.0
        if d.kind == "unitary":
            self._unitary(ins)
        elif d.kind in ("measure", "measure_reset", "reset"):
            pos = 0
            for run in disjoint_runs([(t.value,) for t in ts]):
                chunk = ts[pos:pos + len(run)]
                pos += len(run)
                self.basis([(d.basis, t.value) for t in chunk])
                self.measure([{"q": t.value, "invert": t.is_inverted_result_target} for t in chunk],
                             reset=d.kind != "measure", record=d.kind != "reset", flip=p)
                self.basis([(d.basis, t.value) for t in chunk])
        elif d.kind == "pair_measure":
            pairs = list(zip(ts[::2], ts[1::2]))
            self.products([[(d.basis, a.value), (d.basis, b.value)] for a, b in pairs],
                          [a.is_inverted_result_target ^ b.is_inverted_result_target for a, b in pairs], p)
        elif d.kind == "mpp":
            groups = product_groups(ins)
            self.products([[(t.pauli, t.value) for t in g] for g in groups],
                          [sum(t.is_inverted_result_target for t in g) % 2 == 1 for g in groups], p)
        elif d.kind == "mpad":
            self.ops.append(_Op(MPAD, [{"q": (self.spare, self.spare), "rec": i, "value": bool(t.value)}
                                       for i, t in enumerate(ts)], probs=(p,), advance=len(ts)))
        elif d.kind == "noise":
            self._noise(ins)
        elif d.kind == "correlated":
            self.ops.append(_Op(CORRELATED, [{"q": (t.value, self.spare), "pauli": t.pauli} for t in ts],
                                probs=(p,), is_else=ins.name != "E"))

    def _unitary(self, ins: CircuitInstruction):
        arity = _gates.GATES[canonical_gate(ins.name)].num_qubits
        ts = ins.targets
        quantum: list[tuple[int, ...]] = []
        for i in range(0, len(ts), arity):
            group = ts[i:i + arity]
            if all(t.is_qubit_target for t in group):
                quantum.append(tuple(t.value for t in group))
                continue
            if quantum:
                self.gate(ins.name, quantum)
                quantum = []
            ctrl, target = (group[0], group[1]) if not group[0].is_qubit_target else (group[1], group[0])
            if ctrl.is_measurement_record_target:  # sweep bits are 0: no effect
                self.ops.append(_Op(FEEDBACK, [{"q": (target.value, self.spare), "rec": -ctrl.value,
                                                "pauli": _FEEDBACK[ins.name]}]))
        if quantum:
            self.gate(ins.name, quantum)

    def _noise(self, ins: CircuitInstruction):
        name, args, ts = ins.name, ins.gate_args, ins.targets
        if name in ("I_ERROR", "II_ERROR"):
            return
        probs = np.zeros(15)
        if name in ("X_ERROR", "Y_ERROR", "Z_ERROR"):
            probs[_SINGLE_EVENT[name[0]]] = args[0]
        elif name in ("DEPOLARIZE1", "PAULI_CHANNEL_1"):
            for p, v in zip("XYZ", [args[0] / 3] * 3 if name == "DEPOLARIZE1" else args):
                probs[_SINGLE_EVENT[p]] = v
        else:
            probs[:] = [args[0] / 15] * 15 if name == "DEPOLARIZE2" else args
        arity = ins.definition.arity
        groups = [tuple(t.value for t in ts[i:i + arity]) for i in range(0, len(ts), arity)]
        for run in disjoint_runs(groups):
            self.ops.append(_Op(NOISE, [{"q": (g[0], g[1] if arity == 2 else self.spare)} for g in run],
                                probs=tuple(probs)))


def _table(ops: list[_Op], width: int, spare: int) -> dict[str, np.ndarray]:
    """Op list -> arrays with `width` slots per op."""
    n = len(ops)
    t = {
        "kind": np.zeros(n, np.int32),
        "q": np.full((n, width, 2), spare, np.int32),
        "fwd": np.tile(_IDENTITY[0], (n, 1)).astype(np.int32),
        "inv": np.tile(_IDENTITY[1], (n, 1)).astype(np.int32),
        "sign": np.tile(_IDENTITY[2], (n, 1)).astype(np.int32),
        "probs": np.zeros((n, 15)),
        "rec": np.full((n, width), -1, np.int32),
        "invert": np.zeros((n, width), bool),
        "reset": np.zeros((n, width), bool),
        "px": np.zeros((n, width), bool),
        "pz": np.zeros((n, width), bool),
        "active": np.zeros((n, width), bool),
        "is_else": np.zeros(n, bool),
        "advance": np.zeros(n, np.int32),
    }
    for i, op in enumerate(ops):
        t["kind"][i] = op.kind
        t["fwd"][i], t["inv"][i], t["sign"][i] = gate_tables(op.gate)
        t["probs"][i, :len(op.probs)] = op.probs
        t["is_else"][i], t["advance"][i] = op.is_else, op.advance
        for j, s in enumerate(op.slots):
            t["q"][i, j] = s["q"]
            t["active"][i, j] = True
            t["rec"][i, j] = s.get("rec", -1)
            t["invert"][i, j] = s.get("invert", False) or s.get("value", False)
            t["reset"][i, j] = s.get("reset", False)
            pauli = s.get("pauli", "I")
            t["px"][i, j], t["pz"][i, j] = _XBIT[pauli], _ZBIT[pauli]
    return t


@dataclass(frozen=True)
class Repeat:
    count: int
    body: tuple  # segments


@dataclass
class Program:
    """Segments (op tables and Repeats), the slot width, sizes and the detector/observable index lists."""

    segments: tuple
    width: int
    num_qubits: int  # without the spare
    num_measurements: int
    detectors: list[list[int]]
    observables: list[list[int]]

    @property
    def spare(self) -> int:
        return self.num_qubits

    def tables(self):
        """The op tables in segment order (a pytree of numpy arrays; the structure is static)."""
        def walk(segs):
            return [walk(s.body) if isinstance(s, Repeat) else s for s in segs]

        return walk(self.segments)


def lower(circuit: Circuit) -> Program:
    """Lower a circuit to a Program (see the module docstring)."""
    n = circuit.num_qubits
    all_ops: list[list[_Op]] = []

    def segments(c: Circuit) -> tuple:
        out, low = [], _Lowering(n)
        for op in c.operations:
            if isinstance(op, CircuitRepeatBlock):
                if low.ops:
                    out.append(low.ops)
                    all_ops.append(low.ops)
                    low = _Lowering(n)
                out.append(Repeat(op.repeat_count, segments(op.body)))
            else:
                low.instruction(op)
        if low.ops:
            out.append(low.ops)
            all_ops.append(low.ops)
        return tuple(out)

    raw = segments(circuit)
    width = max((len(op.slots) for ops in all_ops for op in ops), default=1)

    def tabulate(segs):
        return tuple(Repeat(s.count, tabulate(s.body)) if isinstance(s, Repeat) else _table(s, width, n) for s in segs)

    detectors, observables = _detector_indices(circuit)
    return Program(tabulate(raw), width, n, circuit.num_measurements, detectors, observables)


def _detector_indices(circuit: Circuit) -> tuple[list[list[int]], list[list[int]]]:
    """Absolute record indices of every detector and observable (walks repeats without storing them)."""
    detectors: list[list[int]] = []
    observables: dict[int, list[int]] = {}
    count = 0

    def walk(c: Circuit):
        nonlocal count
        for op in c.operations:
            if isinstance(op, CircuitRepeatBlock):
                for _ in range(op.repeat_count):
                    walk(op.body)
            elif op.name == "DETECTOR":
                detectors.append([count + t.value for t in op.targets])
            elif op.name == "OBSERVABLE_INCLUDE":
                observables.setdefault(int(op.gate_args[0]), []).extend(count + t.value for t in op.targets)
            else:
                count += op.num_measurements()

    walk(circuit)
    return detectors, [observables.get(k, []) for k in range(circuit.num_observables)]
