"""Lowering a Stim circuit to op tables that one `lax.scan` runs (compile time flat in depth).

Every instruction becomes windows of up to K slots on disjoint qubits, of six kinds:

  GATE        a two-qubit Clifford on (q0, q1) per slot (single-qubit gates act on (q, spare)), named
              per slot by its number in `gate_catalogue` (forward action for frames, Heisenberg
              action with signs for the tableau); an op is one instruction's run of disjoint gates,
              or, lowered with merge_gates (the tableau's programs), every gate on disjoint qubits
              between two other ops: a layer of mixed gates is one op
  MEASURE     Z measurements (record offset, inversion, reset after); other bases and Pauli products
              are rotated to Z by GATE windows around them, so frames and tableau share one rule
  NOISE       one of 15 two-qubit Pauli events per slot (one-qubit channels use XI, YI, ZI)
  CORRELATED  E / ELSE_CORRELATED_ERROR: one Pauli product, fired per shot
  FEEDBACK    a Pauli on a qubit, controlled by an earlier record bit
  MPAD        padding record bits

REPEAT blocks stay loops: a program is a list of segments, each an op table or a (count, program)
repeat. Record positions are offsets from the running measurement count, so a loop body is one table.
The tableau's programs also cut their longest runs of one op kind out as Runs (`split_runs`), which
scan that kind's op with no switch over kinds.
Slot padding uses the spare qubit (index num_qubits) and the scratch record row; their contents are
never read back.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial

import numpy as np

from pauliprop.circuits import gates

from .circuit import (
    INSTRUCTIONS,
    Circuit,
    CircuitInstruction,
    CircuitRepeatBlock,
    canonical_name,
    product_groups,
)

GATE, MEASURE, NOISE, CORRELATED, FEEDBACK, MPAD = range(6)  # op kinds; the runners' op tuples follow this order
_XBIT, _ZBIT = {"I": 0, "X": 1, "Y": 1, "Z": 0}, {"I": 0, "X": 0, "Y": 1, "Z": 1}
# Stim's order of the 15 two-qubit Paulis in DEPOLARIZE2 / PAULI_CHANNEL_2: IX IY IZ XI XX ... ZZ
PAIRS = [(a, b) for a in "IXYZ" for b in "IXYZ"][1:]
_SINGLE_EVENT = {"X": PAIRS.index(("X", "I")), "Y": PAIRS.index(("Y", "I")), "Z": PAIRS.index(("Z", "I"))}
# classical feedback: the Pauli applied on the quantum side when the record bit is 1
FEEDBACK_PAULI = {"CX": "X", "CY": "Y", "CZ": "Z", "XCZ": "X", "YCZ": "Y"}


def canonical_gate(stim_name: str) -> str:
    """The shared gate table's name of a unitary Stim gate."""
    return INSTRUCTIONS[canonical_name(stim_name)].gate


@cache
def _paulis(k: int) -> np.ndarray:
    """(4^k, 2^k, 2^k) matrices of the k-qubit Pauli codes, as gates.clifford_action orders them."""
    return np.stack([gates.pauli_matrix(gates.local_label(c, k)) for c in range(4**k)])


def clifford_action(unitary: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gates.clifford_action (P -> U^dagger P U on every local Pauli code: image codes, signs +-1) in two
    numpy products instead of a Python loop of traces: the 46 gates of the catalogue took 0.56 s of a
    process's first sampler (2-core CPU), now a few milliseconds. Raises as it does for a non-Clifford."""
    k = int(round(np.log2(unitary.shape[0])))
    paulis = _paulis(k)
    images = unitary.conj().T[None] @ paulis @ unitary[None]  # (4^k, 2^k, 2^k)
    overlaps = np.einsum("jab,cba->cj", paulis.conj().transpose(0, 2, 1), images) / 2**k  # tr(Q_j^dagger M_c)
    image = np.argmax(np.abs(overlaps), axis=1)
    best = overlaps[np.arange(len(image)), image]
    if not (np.all(np.abs(np.abs(best) - 1) < 1e-9) and np.all(np.abs(best.imag) < 1e-9)):
        raise ValueError("unitary is not a Clifford: a Pauli maps to a sum of Paulis")
    return image.astype(np.int32), np.rint(best.real).astype(np.int32)


@cache
def gate_action(stim_name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(image, sign, arity) of a unitary Stim gate: its Heisenberg action from the shared gate table."""
    g = gates.GATES[canonical_gate(stim_name)]
    image, sign = clifford_action(g.matrix())
    return image.astype(np.int32), sign.astype(np.int32), g.num_qubits


def pair_codes() -> np.ndarray:
    """4-bit codes (x_a, z_a, x_b, z_b) of the 15 two-qubit Pauli events, and 0 for 'nothing' (index 15)."""
    return np.array([_XBIT[a] | _ZBIT[a] << 1 | _XBIT[b] << 2 | _ZBIT[b] << 3 for a, b in PAIRS] + [0], np.uint32)


def bucket(k: int) -> int:
    """The next power of two >= k: batch sizes padded to it reuse compiled programs."""
    return 1 << max(0, (k - 1).bit_length())


def fine_bucket(k: int) -> int:
    """k rounded up to four significant bits (16, 17, 18, ..., 32, 34, ...): sizes that cost work in
    every op (slots, output rows) padded by at most 1/16 beyond 16, with few distinct values per
    doubling (a surface code's 81 slots cost 88: at 3 bits, 96 made d = 9 sampling 15% slower)."""
    step = 1 << max(0, k.bit_length() - 4)
    return -(-k // step) * step


def noise_probabilities(ins: CircuitInstruction) -> np.ndarray:
    """A noise channel as probabilities of the 15 disjoint Pauli events of PAIRS (one-qubit channels
    use XI, YI, ZI: the Pauli on the target, identity on no second target)."""
    name, args = ins.name, ins.gate_args
    probs = np.zeros(15)
    if name in ("X_ERROR", "Y_ERROR", "Z_ERROR"):
        probs[_SINGLE_EVENT[name[0]]] = args[0]
    elif name in ("DEPOLARIZE1", "PAULI_CHANNEL_1"):
        for p, v in zip("XYZ", [args[0] / 3] * 3 if name == "DEPOLARIZE1" else args):
            probs[_SINGLE_EVENT[p]] = v
    elif name in ("DEPOLARIZE2", "PAULI_CHANNEL_2"):
        probs[:] = [args[0] / 15] * 15 if name == "DEPOLARIZE2" else args
    return probs  # I_ERROR, II_ERROR: nothing happens


def unitary_parts(ins: CircuitInstruction):
    """A unitary instruction's pairs in order: ("gate", [qubit groups]) for runs of quantum targets,
    ("feedback", target qubit, rec lookback k > 0, Pauli) for a classically controlled pair. Pairs
    controlled by sweep bits are dropped: without sweep data the bits are 0, as in Stim's samplers."""
    arity = gates.GATES[canonical_gate(ins.name)].num_qubits
    ts = ins.targets
    quantum: list[tuple[int, ...]] = []
    for i in range(0, len(ts), arity):
        group = ts[i:i + arity]
        if all(t.is_qubit_target for t in group):
            quantum.append(tuple(t.value for t in group))
            continue
        if quantum:
            yield "gate", quantum
            quantum = []
        ctrl, target = (group[0], group[1]) if not group[0].is_qubit_target else (group[1], group[0])
        if ctrl.is_measurement_record_target:
            yield "feedback", target.value, -ctrl.value, FEEDBACK_PAULI[ins.name]
    if quantum:
        yield "gate", quantum


def disjoint_runs(groups) -> list[list[tuple[int, ...]]]:
    """Split an instruction's target groups, in order, into runs that touch each qubit at most once
    (a run is applied as one batch: disjoint gates commute)."""
    runs: list[list[tuple[int, ...]]] = []
    seen: set[int] = set()
    for g in groups:
        if not runs or seen.intersection(g):
            runs.append([])
            seen = set()
        runs[-1].append(g)
        seen.update(g)
    return runs


@cache
def gate_tables(stim_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward image, Heisenberg image, Heisenberg sign) on two-qubit codes (a single-qubit gate acts
    on the first qubit, identity on the second)."""
    g = gates.GATES[canonical_gate(stim_name)]
    fwd, _ = clifford_action(g.matrix().conj().T)
    inv, sign, _ = gate_action(stim_name)
    if g.num_qubits == 1:
        codes = np.arange(16)
        lo, hi = codes & 3, codes & 12
        return fwd[lo] | hi, inv[lo] | hi, sign[lo]
    return fwd, inv, sign


@cache
def gate_catalogue() -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """Every unitary gate of the instruction table numbered (identity first: a zero-filled slot does
    nothing): (number by shared-table name, forward images, Heisenberg images, Heisenberg signs), the
    arrays (gates, 16) as `gate_tables` gives them. Op tables name a slot's gate by its number."""
    first: dict[str, str] = {}
    for stim_name, d in INSTRUCTIONS.items():
        if d.kind == "unitary":
            first.setdefault(d.gate, stim_name)
    names = [canonical_gate("I")] + sorted(set(first) - {canonical_gate("I")})
    tables = [gate_tables(first[g]) for g in names]
    return ({g: i for i, g in enumerate(names)},) + tuple(np.stack(a).astype(np.int32) for a in zip(*tables))


def gate_number(stim_name: str) -> int:
    """A unitary Stim gate's number in `gate_catalogue`."""
    return gate_catalogue()[0][canonical_gate(stim_name)]


@dataclass
class _Op:
    """One window: k slots given as arrays (q: (k, 2) qubits; the rest (k,) or None for defaults)."""

    kind: int
    q: np.ndarray
    gate: str = "I"  # GATE: every slot's gate, unless gate_numbers names them one by one
    gate_numbers: np.ndarray | None = None  # (k,) numbers in gate_catalogue (a merged op)
    probs: tuple = ()
    advance: int = 0
    is_else: bool = False
    rec: np.ndarray | None = None  # MEASURE/MPAD: offset from the running count (-1: none); FEEDBACK: lookback
    invert: np.ndarray | None = None  # MEASURE: '!' targets; MPAD: the padded value
    reset: np.ndarray | None = None
    px: np.ndarray | None = None  # FEEDBACK/CORRELATED: the Pauli's x and z parts
    pz: np.ndarray | None = None


def _runs(groups: np.ndarray) -> list[np.ndarray]:
    """disjoint_runs on a (g, arity) array, with a fast path when no qubit repeats."""
    if groups.size == 0 or np.bincount(groups.ravel()).max() <= 1:
        return [groups]
    out, start = [], 0
    for run in disjoint_runs([tuple(g) for g in groups.tolist()]):
        out.append(groups[start:start + len(run)])
        start += len(run)
    return out


def _qubit_values(ins: CircuitInstruction) -> np.ndarray:
    """The values of an instruction's targets (qubits, or MPAD's bits) as an int64 array."""
    qs = ins.qubit_array
    return qs if qs is not None else np.fromiter((t.value for t in ins.targets), np.int64, len(ins))


class _Lowering:
    def __init__(self, spare: int, merge_gates: bool = False, sorted_collapses: bool = False):
        self.spare = spare
        self.merge_gates = merge_gates
        self.sorted_collapses = sorted_collapses
        self.ops: list[_Op] = []
        self._busy = np.zeros(spare + 1, bool)  # merge_gates: the qubits of the last op, if a GATE op

    def _pad(self, qubits: np.ndarray) -> np.ndarray:
        """(k,) or (k, 1) -> (k, 2) with the spare as the second qubit."""
        qubits = qubits.reshape(len(qubits), -1)
        return qubits if qubits.shape[1] == 2 else np.column_stack([qubits[:, 0], np.full(len(qubits), self.spare)])

    def gate(self, name: str, groups):
        groups = np.asarray(groups, np.int64).reshape(len(groups), -1)
        for run in _runs(groups):
            q = self._pad(run)
            if not self.merge_gates:
                self.ops.append(_Op(GATE, q, gate=name))
                continue
            numbers = np.full(len(q), gate_number(name), np.uint8)
            last = self.ops[-1] if self.ops else None
            if last is None or last.kind != GATE or self._busy[run].any():  # gates on a qubit in use: a new op
                self._busy[:] = False
                self.ops.append(_Op(GATE, q, gate_numbers=numbers))
            else:  # disjoint gates commute: one op
                last.q, last.gate_numbers = np.concatenate([last.q, q]), np.concatenate([last.gate_numbers, numbers])
            self._busy[run] = True

    def basis(self, basis: np.ndarray, qubits: np.ndarray):
        """Rotate X or Y factors to Z (each rotation is its own inverse); basis: (k,) of 'X' 'Y' 'Z'."""
        for p, gate in (("X", "H"), ("Y", "H_YZ")):
            qs = qubits[basis == p]
            if qs.size:
                self.gate(gate, qs[:, None])

    def measure(self, qubits: np.ndarray, inverts: np.ndarray, reset: bool, record: bool, flip: float = 0.0):
        """Z measurements on disjoint qubits; records in slot order."""
        k = len(qubits)
        self.ops.append(_Op(MEASURE, self._pad(qubits), probs=(flip,), advance=k if record else 0,
                            rec=np.arange(k) if record else np.full(k, -1), invert=np.asarray(inverts, bool),
                            reset=np.full(k, reset)))

    def measure_collapsed(self, qubits: np.ndarray, basis: str):
        """Measure distinct qubits in the X or Y basis, unrecorded and noiseless (a collapse)."""
        b = np.full(len(qubits), basis)
        self.basis(b, qubits)
        self.measure(qubits, np.zeros(len(qubits), bool), reset=False, record=False)
        self.basis(b, qubits)

    def products(self, prods: list[list[tuple[str, int]]], inverts: list[bool], flip: float):
        """Measure Pauli products on distinct qubits (per product): basis change, CX parity onto the
        first qubit, Z measurement, undo."""
        start = 0
        for run in disjoint_runs([tuple(q for _, q in p) for p in prods]):
            ps, inv = prods[start:start + len(run)], inverts[start:start + len(run)]
            start += len(run)
            factors = np.array([f[0] for p in ps for f in p]), np.array([f[1] for p in ps for f in p])
            self.basis(*factors)
            width = max(len(p) for p in ps)
            for j in range(1, width):
                self.gate("CX", [(p[j][1], p[0][1]) for p in ps if len(p) > j])
            self.measure(np.array([p[0][1] for p in ps]), np.array(inv), reset=False, record=True, flip=flip)
            for j in reversed(range(1, width)):
                self.gate("CX", [(p[j][1], p[0][1]) for p in ps if len(p) > j])
            self.basis(*factors)

    def instruction(self, ins: CircuitInstruction):
        d = ins.definition
        p = ins.gate_args[0] if ins.gate_args else 0.0
        if d.kind == "unitary":
            self._unitary(ins)
        elif d.kind in ("measure", "measure_reset", "reset"):
            qubits = _qubit_values(ins)
            plain = ins.qubit_array is not None
            inverts = np.zeros(len(ins), bool) if plain else np.fromiter(
                (t.is_inverted_result_target for t in ins.targets), bool, len(ins))
            runs = _runs(qubits[:, None])
            # Stim collapses an X or Y instruction's random targets in sorted order (a std::set) before it
            # reads them in the given order, which decides its reference sample's outcomes where they are
            # correlated ("H 0, CX 0 1, MY 1 0" gives 1 0): with sorted_collapses, targets out of order are
            # first measured sorted, unrecorded and noiseless (measuring a measured qubit changes nothing)
            collapse = (np.unique(qubits) if self.sorted_collapses and d.basis != "Z" and np.any(np.diff(qubits) < 0)
                        else None)
            if collapse is not None and len(runs) > 1:
                self.measure_collapsed(collapse, d.basis)
                collapse = None
            start = 0
            for run in runs:
                qs, inv = run[:, 0], inverts[start:start + len(run)]
                start += len(run)
                basis = np.full(len(qs), d.basis)
                self.basis(basis, qs)
                if collapse is not None:
                    self.measure(collapse, np.zeros(len(collapse), bool), reset=False, record=False)
                self.measure(qs, inv, reset=d.kind != "measure", record=d.kind != "reset", flip=p)
                self.basis(basis, qs)
        elif d.kind == "pair_measure":
            pairs = list(zip(ins.targets[::2], ins.targets[1::2]))
            self.products([[(d.basis, a.value), (d.basis, b.value)] for a, b in pairs],
                          [a.is_inverted_result_target ^ b.is_inverted_result_target for a, b in pairs], p)
        elif d.kind == "mpp":
            groups = product_groups(ins)
            self.products([[(t.pauli, t.value) for t in g] for g in groups],
                          [sum(t.is_inverted_result_target for t in g) % 2 == 1 for g in groups], p)
        elif d.kind == "mpad":
            k = len(ins)
            self.ops.append(_Op(MPAD, np.full((k, 2), self.spare), probs=(p,), advance=k, rec=np.arange(k),
                                invert=_qubit_values(ins).astype(bool)))
        elif d.kind == "noise":
            self._noise(ins)
        elif d.kind == "correlated":
            paulis = [t.pauli for t in ins.targets]
            self.ops.append(_Op(CORRELATED, self._pad(_qubit_values(ins)), probs=(p,), is_else=ins.name != "E",
                                px=np.array([_XBIT[x] for x in paulis], bool),
                                pz=np.array([_ZBIT[x] for x in paulis], bool)))

    def _unitary(self, ins: CircuitInstruction):
        if ins.qubit_array is not None:  # the common case, without a Python loop per pair
            self.gate(ins.name, ins.qubit_array.reshape(-1, gate_action(ins.name)[2]))
            return
        for part in unitary_parts(ins):
            if part[0] == "gate":
                self.gate(ins.name, part[1])
            else:
                _, target, lookback, pauli = part
                self.ops.append(_Op(FEEDBACK, self._pad(np.array([target])), rec=np.array([lookback]),
                                    px=np.array([_XBIT[pauli]], bool), pz=np.array([_ZBIT[pauli]], bool)))

    def _noise(self, ins: CircuitInstruction):
        if ins.name in ("I_ERROR", "II_ERROR"):
            return
        probs = tuple(noise_probabilities(ins))
        for run in _runs(_qubit_values(ins).reshape(-1, ins.definition.arity)):
            self.ops.append(_Op(NOISE, self._pad(run), probs=probs))


def _table(ops: list[_Op], width: int, spare: int) -> dict[str, np.ndarray]:
    """Op list -> arrays with `width` slots per op."""
    n = len(ops)
    t = {
        "kind": np.zeros(n, np.int32),
        "q": np.full((n, width, 2), spare, np.int32),
        "gate": np.zeros((n, width), np.uint8),  # numbers in gate_catalogue; 0 is the identity
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
        k = len(op.q)
        t["kind"][i] = op.kind
        t["gate"][i, :k] = op.gate_numbers if op.gate_numbers is not None else gate_number(op.gate)
        t["probs"][i, :len(op.probs)] = op.probs
        t["is_else"][i], t["advance"][i] = op.is_else, op.advance
        t["q"][i, :k] = op.q
        t["active"][i, :k] = True
        for name in ("rec", "invert", "reset", "px", "pz"):
            value = getattr(op, name)
            if value is not None:
                t[name][i, :k] = value
    return t


@dataclass(frozen=True)
class Repeat:
    count: int
    body: tuple  # segments


@dataclass(frozen=True)
class Run:
    """Consecutive ops of one kind cut out of an op table (`split_runs`)."""

    kind: int
    table: dict


# A Run is one more compiled scan body, and the rest of its table after it one more (the switch's):
# compile time grows with the Runs, not with depth, so a program gets at most MAX_RUNS, those that run
# the most ops, each at least MIN_RUN ops long.
MIN_RUN = 16
MAX_RUNS = 4


def _rows(table: dict, start: int, stop: int) -> dict:
    return {name: a[start:stop] for name, a in table.items()}


def split_runs(segments: tuple, min_run: int = MIN_RUN, max_runs: int = MAX_RUNS) -> tuple:
    """The segments with up to `max_runs` runs of at least `min_run` consecutive ops of one kind cut out
    of their tables as Runs: those that run the most ops (a repeat's body counted `count` times, ties
    in program order). The same ops in the same order.

    Why: on GPUs the switch of a table's scan step copies its index to the host and waits, every op,
    and its branches copy what they pass through (100 gate layers on 10,000 qubits: 14 ms, of it
    5.2 ms gate kernels; H100); a Run's step calls its kind's op directly."""
    tables, found = [], []  # tables in walk order; found: (ops run, table number, start, stop)

    def find(segs, times):
        for s in segs:
            if isinstance(s, Repeat):
                find(s.body, times * s.count)
                continue
            cuts = (np.flatnonzero(np.diff(s["kind"])) + 1).tolist()
            found.extend(((b - a) * times, len(tables), a, b)
                         for a, b in zip([0] + cuts, cuts + [len(s["kind"])]) if b - a >= min_run)
            tables.append(s)

    find(segments, 1)
    cut: dict[int, list[tuple[int, int]]] = {}
    for _, i, a, b in sorted(found, key=lambda r: -r[0])[:max_runs]:
        cut.setdefault(i, []).append((a, b))
    numbers = iter(range(len(tables)))

    def rebuild(segs):
        out = []
        for s in segs:
            if isinstance(s, Repeat):
                out.append(Repeat(s.count, rebuild(s.body)))
                continue
            done = 0
            for a, b in sorted(cut.get(next(numbers), [])):
                out += [_rows(s, done, a)] if a > done else []
                out.append(Run(int(s["kind"][a]), _rows(s, a, b)))
                done = b
            n = len(s["kind"])
            out += [s if done == 0 else _rows(s, done, n)] if done < n else []
        return tuple(out)

    return rebuild(segments)


@dataclass
class Program:
    """Segments (op tables and Repeats), the slot width, sizes and the detector/observable index lists."""

    segments: tuple
    width: int
    num_qubits: int  # without the spare
    num_measurements: int
    detectors: list[list[int]]
    observables: list[list[int]]
    merged_gates: bool = False  # GATE ops mix gates (per-slot numbers): the tableau runs it, frames do not

    @property
    def spare(self) -> int:
        return self.num_qubits

    def structure(self) -> tuple:
        """The static shape of the segments, hashable for jit: "table", ("run", kind) or
        ("repeat", count, inner)."""
        def shape(s):
            if isinstance(s, Repeat):
                return "repeat", s.count, walk(s.body)
            return ("run", s.kind) if isinstance(s, Run) else "table"

        def walk(segs):
            return tuple(shape(s) for s in segs)

        return walk(self.segments)

    def tables(self):
        """The op tables in segment order (a pytree of numpy arrays; the structure is static)."""
        def walk(segs):
            return [walk(s.body) if isinstance(s, Repeat) else s.table if isinstance(s, Run) else s for s in segs]

        return walk(self.segments)


def lower(circuit: Circuit, spare: int | None = None, merge_gates: bool = False, runs: bool = False,
          sorted_collapses: bool = False) -> Program:
    """Lower a circuit to a Program (see the module docstring). `spare`: the padding qubit, by default
    num_qubits (a simulator with more qubits passes its own count); merge_gates: one GATE op for all
    gates on disjoint qubits between two other ops (a random layer of 11 gate kinds: one op, not 11);
    runs: with Runs (`split_runs`; the frames' kernel and noise_limits read tables and repeats only);
    sorted_collapses: an X or Y measurement or reset whose targets are out of order collapses them in
    sorted order first, as Stim does (the samplers' programs: their reference shot is then Stim's
    reference sample; the simulator draws its random outcomes in the targets' order)."""
    n = circuit.num_qubits if spare is None else spare
    if n < circuit.num_qubits:
        raise ValueError(f"spare qubit {n} is used by the circuit ({circuit.num_qubits} qubits)")
    all_ops: list[list[_Op]] = []

    def segments(c: Circuit) -> tuple:
        out, low = [], _Lowering(n, merge_gates, sorted_collapses)
        for op in c.operations:
            if isinstance(op, CircuitRepeatBlock):
                if low.ops:
                    out.append(low.ops)
                    all_ops.append(low.ops)
                    low = _Lowering(n, merge_gates, sorted_collapses)
                out.append(Repeat(op.repeat_count, segments(op.body)))
            else:
                low.instruction(op)
        if low.ops:
            out.append(low.ops)
            all_ops.append(low.ops)
        return tuple(out)

    raw = segments(circuit)
    width = max((len(op.q) for ops in all_ops for op in ops), default=1)

    def tabulate(segs):
        return tuple(Repeat(s.count, tabulate(s.body)) if isinstance(s, Repeat) else _table(s, width, n) for s in segs)

    segs = tabulate(raw)
    detectors, observables = _detector_indices(circuit)
    return Program(split_runs(segs) if runs else segs, width, n, circuit.num_measurements, detectors, observables,
                   merge_gates)


def _fingerprint(circuit: Circuit) -> tuple:
    """Identity of a circuit's contents: its (immutable) instructions and its repeat blocks' bodies."""
    return tuple((op.repeat_count, _fingerprint(op.body)) if isinstance(op, CircuitRepeatBlock) else id(op)
                 for op in circuit.operations)


def lowered(circuit: Circuit, spare: int | None = None, merge_gates: bool = False, runs: bool = False,
            sorted_collapses: bool = False) -> Program:
    """`lower(circuit, spare, merge_gates, runs, sorted_collapses)`, cached on the circuit until its
    instructions change."""
    fingerprint = _fingerprint(circuit)
    key = (spare, merge_gates, runs, sorted_collapses, fingerprint)
    cache = circuit.__dict__.setdefault("_lowered", {})
    if key not in cache:
        for stale in [k for k in cache if k[-1] != fingerprint]:
            del cache[stale]
        cache[key] = lower(circuit, spare, merge_gates, runs, sorted_collapses)
    return cache[key]


def device_tables(prog: Program):
    """The program's tables as device arrays (converted once per program)."""
    if getattr(prog, "_device_tables", None) is None:
        import jax

        prog._device_tables = jax.device_put(prog.tables())  # (jnp.asarray compiles a program per shape)
    return prog._device_tables


def run_segments(structure, tables, carry, ops, key, read=None, write=None):
    """Run a program's segments on `carry` (which has a `counter` field): each table is one
    `lax.scan` whose step switches to ops[kind](read(carry, row), row, fold_in(key, counter)) and puts
    the result back with write(carry, row, result); a Run's scan calls its ops[kind] with no switch;
    each repeat is a `lax.fori_loop`. By default an op takes and returns the whole carry; a runner
    with a large carry reads and writes only an op's rows, since every branch returns a copy of what
    it passes through. (Switching over only the kinds a table holds made GPU compiles of the surface
    code 7x slower, 42 s against 6 s, for no run-time gain: measured on an H100, 2026-11-22.)"""
    import jax
    from jax import lax

    read = read or (lambda c, row: c)
    write = write or (lambda c, row, result: result)

    def step(c, row, kind=None):
        args = read(c, row), row, jax.random.fold_in(key, c.counter)
        result = lax.switch(row["kind"], ops, *args) if kind is None else ops[kind](*args)
        return write(c, row, result)._replace(counter=c.counter + 1), None

    for shape, table in zip(structure, tables):
        if shape == "table":
            carry, _ = lax.scan(step, carry, table)
        elif shape[0] == "run":
            carry, _ = lax.scan(partial(step, kind=shape[1]), carry, table)
        else:
            _, count, inner = shape
            carry = lax.fori_loop(0, count, lambda i, c, inner=inner, table=table:
                                  run_segments(inner, table, c, ops, key, read, write), carry)
    return carry


# ---- one table for a whole program (the frames' scan on CPUs) ---------------------------------------

LOOP_FIELDS = ("loop_level", "loop_start", "loop_count")
_SLOT_FIELDS = ("q", "gate", "rec", "invert", "reset", "px", "pz", "active")  # (ops, slots, ...) arrays


@dataclass(frozen=True)
class Flat:
    """A program as one op table run by `run_flat`: every segment's rows in order, a repeat's body once
    followed by a loop row (an identity GATE op whose loop fields send the runner back to the body's
    first row `loop_count` times; loop_level -1 on other rows), padded with identity rows. Sizes are
    bucketed, so circuits of similar size share one compiled program, and everything that differs
    between them (gates, targets, probabilities, repeat counts, the number of rows) is data:

      rows      table rows (a power of two; `ops` of them run)
      width     slots an op (`fine_bucket`)
      qubits    frame rows, the spare (last row) included (a power of two)
      records   record rows, the zero row (last) included (a power of two)
      depth     loop nesting levels (a power of two)"""

    table: dict
    ops: int
    depth: int

    @property
    def rows(self) -> int:
        return len(self.table["kind"])

    @property
    def width(self) -> int:
        return self.table["q"].shape[1]


def flatten(structure, tables, num_qubits: int, num_measurements: int) -> tuple[Flat, int, int]:
    """(Flat, qubit rows, record rows) of a program's segments (`Program.structure()` and `tables()`,
    numpy or concrete arrays; no Runs). The lowering's spare qubit `num_qubits` becomes the last of the
    bucketed qubit rows."""
    qubits, records = bucket(num_qubits + 1), bucket(num_measurements + 1)
    pieces: list[dict] = []
    depth = 0

    def walk(structure, tables, level):
        nonlocal depth
        for shape, table in zip(structure, tables):
            if shape == "table":
                pieces.append({k: np.asarray(v) for k, v in table.items()})
                continue
            if shape[0] != "repeat":
                raise ValueError(f"a flat program has no {shape[0]} segments (lower it without runs)")
            depth = max(depth, level + 1)
            start = sum(1 if "loop" in p else len(p["kind"]) for p in pieces)
            walk(shape[2], table, level + 1)
            pieces.append({"loop": (level, start, shape[1])})

    walk(structure, tables, 0)
    width = fine_bucket(max([1] + [p["q"].shape[1] for p in pieces if "q" in p]))
    ops = sum(1 if "loop" in p else len(p["kind"]) for p in pieces)
    rows = bucket(max(ops, 1))
    blank = _table([], width, qubits - 1)
    out = {k: np.zeros((rows,) + v.shape[1:], v.dtype) for k, v in blank.items()}
    out["q"][:], out["rec"][:] = qubits - 1, -1
    for name in LOOP_FIELDS:
        out[name] = np.full(rows, -1 if name == "loop_level" else 0, np.int32)
    at = 0
    for p in pieces:
        if "loop" in p:
            out["loop_level"][at], out["loop_start"][at], out["loop_count"][at] = p["loop"]
            at += 1
            continue
        n, k = len(p["kind"]), p["q"].shape[1]
        for name, value in p.items():
            if name == "q":
                value = np.where(value == num_qubits, qubits - 1, value)
            if name in _SLOT_FIELDS:
                out[name][at:at + n, :k] = value
            else:
                out[name][at:at + n] = value
        at += n
    return Flat(out, ops, bucket(depth) if depth else 0), qubits, records


def run_flat(table, ops, depth: int, carry, step_ops, key, read=None, write=None, fold=None):
    """`run_segments` for a Flat program: one `lax.while_loop` over its rows, whose step runs row `pc`
    (the op-kind switch, as run_segments' scan step) and then moves `pc` on, or back to a loop's first
    row while the loop's counter (one a nesting level) is short of its count. One step body for the
    whole program, whatever its repeats: compile time does not grow with the circuit's structure.
    fold(key, counter) gives an op's key (default jax.random.fold_in)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    read = read or (lambda c, row: c)
    write = write or (lambda c, row, result: result)
    fold = fold or jax.random.fold_in

    def body(state):
        pc, loops, c = state
        row = {name: a[pc] for name, a in table.items()}
        result = lax.switch(row["kind"], step_ops, read(c, row), row, fold(key, c.counter))
        c = write(c, row, result)._replace(counter=c.counter + 1)
        if depth == 0:
            return pc + 1, loops, c
        level = jnp.maximum(row["loop_level"], 0)
        done = loops[level] + 1
        again = (row["loop_level"] >= 0) & (done < row["loop_count"])
        loops = jnp.where(row["loop_level"] >= 0, loops.at[level].set(jnp.where(again, done, 0)), loops)
        return jnp.where(again, row["loop_start"], pc + 1), loops, c

    state = (jnp.zeros((), jnp.int32), jnp.zeros(max(depth, 1), jnp.int32), carry)
    return lax.while_loop(lambda s: s[0] < ops, body, state)[2]


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
