"""Stim's circuit format: parsing, validation and printing.

A `Circuit` is a list of `CircuitInstruction`s and `CircuitRepeatBlock`s (REPEAT bodies stay loops,
never unrolled into memory). Names follow Stim (`stim.Circuit`, `CircuitInstruction`, `GateTarget`)
so code written against Stim reads the same. Gate names and arities of the unitary gates come from
the shared gate table (`pauliprop.circuits.gates`); everything Stim-specific (measurements, resets,
noise, annotations) is described in `INSTRUCTIONS` below. Every input error names the line and the
instruction; nothing is skipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property

import numpy as np

from pauliprop.circuits import gates

# ---- what each instruction accepts -----------------------------------------------------------------


@dataclass(frozen=True)
class InstructionDef:
    """Stim-side facts about one instruction name (canonical upper-case name)."""

    name: str
    kind: str  # unitary | measure | reset | measure_reset | mpp | pair_measure | noise | correlated | annotation | mpad
    arity: int  # 1 or 2 for per-qubit / per-pair instructions, 0 for variable (MPP, E, annotations)
    num_args: tuple[int, int]  # allowed number of parenthesised arguments (min, max)
    basis: str = "Z"  # measurement / reset basis
    gate: str | None = None  # unitary gates: the name in pauliprop.circuits.gates.GATES


def _table() -> dict[str, InstructionDef]:
    defs: dict[str, InstructionDef] = {}
    for g in gates.GATES.values():
        for s in g.stim_names:
            defs[s] = InstructionDef(s, "unitary", g.num_qubits, (0, 0), gate=g.name)
    for b in "XYZ":
        suffix = "" if b == "Z" else b  # M, R, MR measure in Z (MZ, RZ, MRZ are ALIASES)
        defs[f"M{suffix}"] = InstructionDef(f"M{suffix}", "measure", 1, (0, 1), basis=b)
        defs[f"R{suffix}"] = InstructionDef(f"R{suffix}", "reset", 1, (0, 0), basis=b)
        defs[f"MR{suffix}"] = InstructionDef(f"MR{suffix}", "measure_reset", 1, (0, 1), basis=b)
        defs[f"M{b}{b}"] = InstructionDef(f"M{b}{b}", "pair_measure", 2, (0, 1), basis=b)
        defs[f"{b}_ERROR"] = InstructionDef(f"{b}_ERROR", "noise", 1, (1, 1))
    defs["MPP"] = InstructionDef("MPP", "mpp", 0, (0, 1))
    defs["MPAD"] = InstructionDef("MPAD", "mpad", 0, (0, 1))
    defs["DEPOLARIZE1"] = InstructionDef("DEPOLARIZE1", "noise", 1, (1, 1))
    defs["DEPOLARIZE2"] = InstructionDef("DEPOLARIZE2", "noise", 2, (1, 1))
    defs["PAULI_CHANNEL_1"] = InstructionDef("PAULI_CHANNEL_1", "noise", 1, (3, 3))
    defs["PAULI_CHANNEL_2"] = InstructionDef("PAULI_CHANNEL_2", "noise", 2, (15, 15))
    defs["I_ERROR"] = InstructionDef("I_ERROR", "noise", 1, (0, 255))  # no effect: Stim's placeholder noise
    defs["II_ERROR"] = InstructionDef("II_ERROR", "noise", 2, (0, 255))
    defs["E"] = InstructionDef("E", "correlated", 0, (1, 1))
    defs["ELSE_CORRELATED_ERROR"] = InstructionDef("ELSE_CORRELATED_ERROR", "correlated", 0, (1, 1))
    for name in ("DETECTOR", "OBSERVABLE_INCLUDE", "QUBIT_COORDS", "SHIFT_COORDS", "TICK"):
        n_args = {"OBSERVABLE_INCLUDE": (1, 1), "TICK": (0, 0)}.get(name, (0, 255))
        defs[name] = InstructionDef(name, "annotation", 0, n_args)
    return defs


INSTRUCTIONS: dict[str, InstructionDef] = _table()
ALIASES = {"CORRELATED_ERROR": "E", "MZ": "M", "RZ": "R", "MRZ": "MR"}
NOT_SUPPORTED = {"HERALDED_ERASE", "HERALDED_PAULI_CHANNEL_1", "SPP", "SPP_DAG"}


def canonical_name(name: str) -> str | None:
    """Stim's canonical upper-case name for `name` (an alias or any case), or None if unknown."""
    up = name.upper()
    up = ALIASES.get(up, up)
    if up in INSTRUCTIONS:
        g = INSTRUCTIONS[up]
        if g.kind == "unitary":  # aliases of unitary gates map to the first Stim name of the table entry
            return gates.GATES[g.gate].stim_names[0]
        return up
    return None


# ---- targets, instructions, blocks ----------------------------------------------------------------


@dataclass(frozen=True)
class GateTarget:
    """One target: a qubit (possibly inverted `!q`), a Pauli on a qubit (`X3`), `rec[-k]`,
    `sweep[k]`, or the MPP combiner `*`."""

    value: int
    pauli: str = ""  # "X" | "Y" | "Z" for Pauli targets
    is_inverted_result_target: bool = False
    is_measurement_record_target: bool = False
    is_sweep_bit_target: bool = False
    is_combiner: bool = False
    is_qubit_target: bool = field(init=False, repr=False, compare=False)
    qubit_value: int | None = field(init=False, repr=False, compare=False)  # the qubit of qubit/Pauli targets

    def __post_init__(self):  # plain attributes: large circuits read them millions of times
        plain = not (self.pauli or self.is_measurement_record_target or self.is_sweep_bit_target or self.is_combiner)
        object.__setattr__(self, "is_qubit_target", plain)
        object.__setattr__(self, "qubit_value", self.value if (plain or self.pauli) else None)

    def __str__(self) -> str:
        if self.is_combiner:
            return "*"
        if self.is_measurement_record_target:
            return f"rec[{self.value}]"
        if self.is_sweep_bit_target:
            return f"sweep[{self.value}]"
        return ("!" if self.is_inverted_result_target else "") + self.pauli + str(self.value)


class CircuitInstruction:
    """One instruction: a canonical name, targets, parenthesised arguments, its source line and tag.

    Targets that are all plain qubits (the bulk of large circuits) are held as one int64 array,
    `qubit_array`; `targets` builds the GateTarget tuple from it only when asked.
    """

    def __init__(self, name: str, targets: Sequence[GateTarget] | np.ndarray = (), gate_args: tuple[float, ...] = (),
                 line: int = 0, tag: str = ""):
        self.name, self.gate_args, self.line, self.tag = name, tuple(gate_args), line, tag
        if isinstance(targets, np.ndarray):
            self._qubits, self._targets = targets.astype(np.int64, copy=False).reshape(-1), None
        else:
            self._qubits, self._targets = None, tuple(targets)

    @property
    def targets(self) -> tuple[GateTarget, ...]:
        if self._targets is None:
            return tuple(map(_qubit_target, self._qubits.tolist()))
        return self._targets

    @property
    def qubit_array(self) -> np.ndarray | None:
        """The targets as an int64 array of qubits when they are all plain qubits, else None."""
        if self._qubits is None and all(t.is_qubit_target and not t.is_inverted_result_target for t in self._targets):
            self._qubits = np.fromiter((t.value for t in self._targets), np.int64, len(self._targets))
        return self._qubits

    def __len__(self) -> int:
        return len(self._qubits) if self._targets is None else len(self._targets)

    def __eq__(self, other) -> bool:
        if not isinstance(other, CircuitInstruction):
            return NotImplemented
        return (self.name, self.gate_args, self.tag) == (other.name, other.gate_args, other.tag) and (
            self.targets == other.targets)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"stabilizer.CircuitInstruction({str(self)!r})"

    def targets_copy(self) -> list[GateTarget]:
        return list(self.targets)

    def gate_args_copy(self) -> list[float]:
        return list(self.gate_args)

    @property
    def definition(self) -> InstructionDef:
        return INSTRUCTIONS[self.name]

    @cached_property
    def max_qubit(self) -> int:
        """The largest qubit this instruction touches (-1 if none)."""
        if self._targets is None:
            return int(self._qubits.max(initial=-1))
        return max((t.qubit_value for t in self._targets if t.qubit_value is not None), default=-1)

    def num_measurements(self) -> int:
        kind = self.definition.kind
        if kind in ("measure", "measure_reset", "mpad"):
            return len(self)
        if kind == "pair_measure":
            return len(self) // 2
        if kind == "mpp":
            return len(self.targets) - 2 * sum(t.is_combiner for t in self.targets)
        return 0

    def __str__(self) -> str:
        tag = f"[{self.tag}]" if self.tag else ""
        args = "(" + ", ".join(_fmt(a) for a in self.gate_args) + ")" if self.gate_args else ""
        if self._targets is None:
            out = [" ".join(map(str, self._qubits.tolist()))] if len(self._qubits) else []
        else:
            out = []
            for t in self._targets:  # MPP products are written X0*Y1, not X0 * Y1
                if t.is_combiner:
                    out[-1] += "*"
                elif out and out[-1].endswith("*"):
                    out[-1] += str(t)
                else:
                    out.append(str(t))
        return f"{self.name}{tag}{args}" + ("" if not out else " " + " ".join(out))


@dataclass(frozen=True)
class CircuitRepeatBlock:
    repeat_count: int
    body: Circuit
    line: int = 0

    @property
    def name(self) -> str:
        return "REPEAT"

    def body_copy(self) -> Circuit:
        return self.body.copy()


Operation = CircuitInstruction | CircuitRepeatBlock


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


class CircuitError(ValueError):
    """A malformed circuit: the message names the line and the instruction."""


# ---- the circuit ----------------------------------------------------------------------------------


class Circuit:
    """A Stim circuit: `Circuit(text)`, `Circuit(stim.Circuit)`, or built with `append`."""

    def __init__(self, source: str | Circuit | object | None = None):
        self.operations: list[Operation] = []
        if source is None:
            return
        if isinstance(source, Circuit):
            self.operations = list(source.operations)
        elif isinstance(source, str):
            _Parser(source).parse_into(self)
        elif type(source).__module__.startswith("stim") and type(source).__name__ == "Circuit":
            _Parser(str(source)).parse_into(self)
        else:
            raise TypeError(f"Circuit() takes Stim circuit text or a stim.Circuit, got {type(source).__name__}")

    # -- building
    def append(self, name: str, targets: int | GateTarget | Sequence = (), arg=None, tag: str = "") -> Circuit:
        """Append an instruction as Stim does: `c.append("CX", [0, 1])`, `c.append("X_ERROR", [0], 0.1)`,
        targets given as ints, GateTargets, Stim's target text ("rec[-1]", "X2", "!3"), or an integer
        numpy array of qubits (held as is: the fast way to build large circuits)."""
        if isinstance(name, (CircuitInstruction, CircuitRepeatBlock)):
            self._validate_and_add(name)
            return self
        if isinstance(targets, np.ndarray) and targets.dtype.kind in "iu":  # many qubits at once
            parsed = targets.reshape(-1).astype(np.int64)
            if parsed.size and parsed.min() < 0:
                raise CircuitError(f"{name}: target {parsed.min()} is not a qubit (negative)")
        else:
            parsed = []
            for t in [targets] if isinstance(targets, (int, str, GateTarget)) else list(targets):
                if isinstance(t, GateTarget):
                    parsed.append(t)
                elif isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer, str)):
                    raise CircuitError(f"{name}: target {t!r} is not an int, a GateTarget or target text")
                else:
                    one = _parse_targets(str(t), 0, name)
                    parsed.extend(map(_qubit_target, one.tolist()) if isinstance(one, np.ndarray) else one)
        args = () if arg is None else tuple(float(a) for a in (arg if isinstance(arg, (list, tuple)) else [arg]))
        canon = canonical_name(name)
        if canon is None:
            raise CircuitError(_unknown(name, 0))
        self._validate_and_add(CircuitInstruction(canon, parsed, args, 0, tag))
        return self

    def append_from_stim_program_text(self, text: str) -> Circuit:
        _Parser(text).parse_into(self)
        return self

    def _validate_and_add(self, op: Operation):
        if isinstance(op, CircuitInstruction):
            validate_instruction(op, self.num_measurements)
        elif op.repeat_count < 1:
            raise CircuitError(f"line {op.line}: REPEAT count must be >= 1, got {op.repeat_count}")
        self.operations.append(op)

    # -- queries (Stim's names)
    @property
    def num_qubits(self) -> int:
        return 1 + self._max_qubit()

    def _max_qubit(self) -> int:
        return max((op.body._max_qubit() if isinstance(op, CircuitRepeatBlock) else op.max_qubit
                    for op in self.operations), default=-1)

    def _count(self, per_instruction) -> int:
        return self._count_ops(self.operations, per_instruction)

    @staticmethod
    def _count_ops(operations, per_instruction) -> int:
        total = 0
        for op in operations:
            if isinstance(op, CircuitRepeatBlock):
                total += op.repeat_count * op.body._count(per_instruction)
            else:
                total += per_instruction(op)
        return total

    @property
    def num_measurements(self) -> int:
        # operations are immutable and only ever appended, so the count extends from the last one
        # (appending instruction by instruction stays linear); a shorter list is counted afresh
        seen, count = self.__dict__.get("_measured", (0, 0))
        if seen > len(self.operations):
            seen, count = 0, 0
        count += Circuit._count_ops(self.operations[seen:], CircuitInstruction.num_measurements)
        self._measured = (len(self.operations), count)
        return count

    @property
    def num_detectors(self) -> int:
        return self._count(lambda op: int(op.name == "DETECTOR"))

    @property
    def num_observables(self) -> int:
        def highest(c: Circuit) -> int:
            best = 0
            for op in c.operations:
                if isinstance(op, CircuitRepeatBlock):
                    best = max(best, highest(op.body))
                elif op.name == "OBSERVABLE_INCLUDE":
                    best = max(best, int(op.gate_args[0]) + 1)
            return best

        return highest(self)

    @property
    def num_ticks(self) -> int:
        return self._count(lambda op: int(op.name == "TICK"))

    def flattened(self) -> Circuit:
        """The circuit with every REPEAT block unrolled (memory grows with the repeat counts)."""
        out = Circuit()
        for op in self.operations:
            if isinstance(op, CircuitRepeatBlock):
                body = op.body.flattened().operations
                for _ in range(op.repeat_count):
                    out.operations.extend(body)
            else:
                out.operations.append(op)
        return out

    def copy(self) -> Circuit:
        return Circuit(self)

    def __iter__(self):
        return iter(self.operations)

    def __len__(self):
        return len(self.operations)

    def __getitem__(self, i):
        return self.operations[i]

    def __eq__(self, other):
        return isinstance(other, Circuit) and str(self) == str(other)

    def __add__(self, other: Circuit) -> Circuit:
        out = self.copy()
        for op in other.operations:
            out._validate_and_add(op)
        return out

    def __mul__(self, repetitions: int) -> Circuit:
        if repetitions < 1:
            raise CircuitError(f"a circuit repeated {repetitions} times is empty; use >= 1")
        out = Circuit()
        out.operations.append(CircuitRepeatBlock(int(repetitions), self.copy()))
        return out

    def __str__(self) -> str:
        return "\n".join(self._lines(""))

    def _lines(self, indent: str):
        for op in self.operations:
            if isinstance(op, CircuitRepeatBlock):
                yield f"{indent}REPEAT {op.repeat_count} {{"
                yield from op.body._lines(indent + "    ")
                yield f"{indent}}}"
            else:
                yield indent + str(op)

    def __repr__(self) -> str:
        return f"stabilizer.Circuit('''\n{self}\n''')"

    # Stim's sampler methods run the samplers, which sit above the parser (stabilizer/frames/sampler.py)
    # and hand their functions down when imported (`provide_samplers`; importing stabilizer does it)
    def compile_sampler(self, *, seed: int | None = None, skip_reference_sample: bool = False):
        return _SAMPLERS["compile_sampler"](self, seed=seed, skip_reference_sample=skip_reference_sample)

    def compile_detector_sampler(self, *, seed: int | None = None):
        return _SAMPLERS["compile_detector_sampler"](self, seed=seed)

    def reference_sample(self):
        return _SAMPLERS["reference_sample"](self)

    def to_stim(self):
        """This circuit as a `stim.Circuit` (needs stim)."""
        import stim

        return stim.Circuit(str(self))


_SAMPLERS: dict[str, Callable] = {}  # the functions behind Circuit's sampler methods, by name


def provide_samplers(compile_sampler: Callable, compile_detector_sampler: Callable,
                     reference_sample: Callable) -> None:
    """Give Circuit's sampler methods their functions (stabilizer/frames/sampler.py, when imported)."""
    _SAMPLERS.update(compile_sampler=compile_sampler, compile_detector_sampler=compile_detector_sampler,
                     reference_sample=reference_sample)


# ---- parsing ----------------------------------------------------------------------------------------

_HEAD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\[[^\]]*\])?\s*(\(([^)]*)\))?")  # name[tag](args); targets follow
_TARGET = re.compile(r"^(!?)([XYZxyz]?)(\d+)$")
_REC = re.compile(r"^rec\[(-?\d+)\]$")
_SWEEP = re.compile(r"^sweep\[(\d+)\]$")


def _unknown(name: str, line: int) -> str:
    where = f"line {line}: " if line else ""
    if name.upper() in NOT_SUPPORTED:
        return f"{where}instruction '{name}' is valid Stim but not supported by this simulator"
    return f"{where}unknown instruction '{name}'"


@cache
def _qubit_target(q: int) -> GateTarget:
    return GateTarget(q)


_PLAIN = re.compile(r"[0-9\s]*")


def _parse_targets(text: str, line: int, name: str) -> list[GateTarget] | np.ndarray:
    """Target text -> GateTargets, or an int64 array when every target is a plain qubit."""
    where = f"line {line}: {name}" if line else name
    if _PLAIN.fullmatch(text):  # plain qubit targets: the bulk of large circuits, parsed in C
        return np.fromstring(text, np.int64, sep=" ") if text.strip() else np.zeros(0, np.int64)
    out: list[GateTarget] = []
    for tok in text.replace("*", " * ").split():
        if tok == "*":
            out.append(GateTarget(0, is_combiner=True))
            continue
        m = _TARGET.match(tok)
        if m:
            inv, pauli, q = m.groups()
            out.append(GateTarget(int(q), pauli.upper(), is_inverted_result_target=bool(inv)))
            continue
        m = _REC.match(tok)
        if m:
            k = int(m.group(1))
            if k >= 0:
                raise CircuitError(f"{where}: rec[{k}] is not a record target; lookbacks are rec[-1], rec[-2], ...")
            out.append(GateTarget(k, is_measurement_record_target=True))
            continue
        m = _SWEEP.match(tok)
        if m:
            out.append(GateTarget(int(m.group(1)), is_sweep_bit_target=True))
            continue
        raise CircuitError(f"{where}: cannot parse target '{tok}'")
    return out


def _parse_args(text: str | None, line: int, name: str) -> tuple[float, ...]:
    if text is None or not text.strip():
        return ()
    out = []
    for tok in text.split(","):
        try:
            v = float(tok.strip())
        except ValueError:
            raise CircuitError(f"line {line}: {name}: argument '{tok.strip()}' is not a number") from None
        if not math.isfinite(v):
            raise CircuitError(f"line {line}: {name}: argument '{tok.strip()}' is not finite")
        out.append(v)
    return tuple(out)


class _Parser:
    def __init__(self, text: str):
        self.lines = text.splitlines()

    def parse_into(self, circuit: Circuit):
        end, _ = self._block(circuit, 0, depth=0, measured=circuit.num_measurements)
        if end != len(self.lines):
            raise CircuitError(f"line {end + 1}: '}}' without a matching REPEAT block")

    def _block(self, circuit: Circuit, i: int, depth: int, measured: int) -> tuple[int, int]:
        """Parse lines from i into circuit until a closing brace (depth > 0) or the end. `measured`
        counts the measurements before line i (what a rec lookback may reach). Returns the index of
        the closing brace line (or len(lines)) and the count after the block's first pass."""
        while i < len(self.lines):
            raw = self.lines[i].split("#", 1)[0].strip()
            lineno = i + 1
            i += 1
            if not raw:
                continue
            if raw == "}":
                if depth == 0:
                    raise CircuitError(f"line {lineno}: '}}' without a matching REPEAT block")
                return i - 1, measured
            if raw.upper().startswith("REPEAT") and (len(raw) == 6 or not (raw[6].isalnum() or raw[6] == "_")):
                m = re.match(r"^REPEAT\s*(\[[^\]]*\])?\s+(\S+)\s*\{$", raw, re.IGNORECASE)
                if not m:
                    raise CircuitError(f"line {lineno}: REPEAT: expected 'REPEAT <count> {{', got '{raw}'")
                try:
                    count = int(m.group(2))
                except ValueError:
                    raise CircuitError(f"line {lineno}: REPEAT: count '{m.group(2)}' is not an integer") from None
                if count < 1:
                    raise CircuitError(f"line {lineno}: REPEAT: count must be >= 1, got {count}")
                body = Circuit()
                close, after = self._block(body, i, depth + 1, measured)
                if close >= len(self.lines):
                    raise CircuitError(f"line {lineno}: REPEAT block is never closed with '}}'")
                if not body.operations:
                    raise CircuitError(f"line {lineno}: REPEAT block is empty")
                circuit.operations.append(CircuitRepeatBlock(count, body, lineno))
                measured += count * (after - measured)
                i = close + 1
                continue
            m = _HEAD.match(raw)
            if not m:
                raise CircuitError(f"line {lineno}: cannot parse '{raw}'")
            name, tag, _, args = m.groups()
            rest = raw[m.end():].strip()
            canon = canonical_name(name)
            if canon is None:
                raise CircuitError(_unknown(name, lineno))
            ins = CircuitInstruction(canon, _parse_targets(rest, lineno, name),
                                     _parse_args(args, lineno, name), lineno, (tag or "")[1:-1])
            validate_instruction(ins, measured)
            circuit.operations.append(ins)
            measured += ins.num_measurements()
        return i, measured


# ---- validation -------------------------------------------------------------------------------------


def validate_instruction(ins: CircuitInstruction, measurements_before: int) -> None:
    """Raise CircuitError (naming the line and instruction) unless `ins` is valid Stim."""
    d = ins.definition
    where = (f"line {ins.line}: " if ins.line else "") + ins.name
    lo, hi = d.num_args
    n = len(ins.gate_args)
    if not lo <= n <= hi:
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        raise CircuitError(f"{where}: takes {want} parenthesised argument(s), got {n}")
    if d.kind in ("noise", "correlated", "measure", "measure_reset", "pair_measure", "mpp", "mpad") and d.name not in (
            "I_ERROR", "II_ERROR"):
        _check_probabilities(ins, where)
    if ins._targets is None and (d.kind in _PLAIN_KINDS or d.name == "QUBIT_COORDS"):
        _check_plain(ins, where)
        return
    ts = ins.targets
    qubit = lambda t: t.is_qubit_target
    if d.kind == "unitary":
        _check_unitary_targets(ins, where)
    elif d.kind in ("measure", "measure_reset", "reset", "noise", "pair_measure"):
        bad = [t for t in ts if not qubit(t)]
        if bad:
            raise CircuitError(f"{where}: target '{bad[0]}' must be a qubit")
        if d.kind == "reset" and any(t.is_inverted_result_target for t in ts):
            raise CircuitError(f"{where}: reset targets cannot be inverted")
        if d.arity == 2:
            _check_pairs(ins, where)
    elif d.kind == "mpad":
        for t in ts:
            if not qubit(t) or t.is_inverted_result_target or t.value > 1:
                raise CircuitError(f"{where}: targets are the padded values 0 or 1, got '{t}'")
    elif d.kind == "mpp":
        _check_products(ins, where)
    elif d.kind == "correlated":
        bad = [t for t in ts if not t.pauli or t.is_inverted_result_target]
        if bad or not ts:
            raise CircuitError(f"{where}: targets must be Pauli targets like X0 Y1 Z2"
                               + (f", got '{bad[0]}'" if bad else ", got none"))
        if len({t.value for t in ts}) != len(ts):
            raise CircuitError(f"{where}: a qubit appears twice in one correlated error")
    elif d.name in ("DETECTOR", "OBSERVABLE_INCLUDE"):
        bad = [t for t in ts if not t.is_measurement_record_target]
        if bad:
            raise CircuitError(f"{where}: target '{bad[0]}' must be a measurement record target rec[-k]")
        if d.name == "OBSERVABLE_INCLUDE":
            k = ins.gate_args[0]
            if k < 0 or not float(k).is_integer():
                raise CircuitError(f"{where}: observable index must be a non-negative integer, got {_fmt(k)}")
    elif d.name == "QUBIT_COORDS":
        if any(not qubit(t) for t in ts):
            raise CircuitError(f"{where}: targets must be qubits")
    elif d.name in ("SHIFT_COORDS", "TICK") and ts:
        raise CircuitError(f"{where}: takes no targets")
    for t in ts:
        if t.is_measurement_record_target and -t.value > measurements_before:
            raise CircuitError(f"{where}: rec[{t.value}] looks back further than the {measurements_before} "
                               "measurement(s) made before it")


_PLAIN_KINDS = ("unitary", "measure", "measure_reset", "reset", "noise", "pair_measure", "mpad")


def _check_plain(ins: CircuitInstruction, where: str):
    """`validate_instruction` for targets held as a qubit array (kinds that take plain qubits),
    vectorised."""
    qs = ins.qubit_array
    if ins.definition.kind == "mpad":
        if qs.size and qs.max() > 1:
            raise CircuitError(f"{where}: targets are the padded values 0 or 1, got '{qs.max()}'")
    elif ins.definition.arity == 2:
        _check_pairs(ins, where)


def _check_probabilities(ins: CircuitInstruction, where: str):
    ps = ins.gate_args
    for p in ps:
        if not 0.0 <= p <= 1.0:
            raise CircuitError(f"{where}: probability {_fmt(p)} is not in [0, 1]")
    if ins.name in ("PAULI_CHANNEL_1", "PAULI_CHANNEL_2") and sum(ps) > 1 + 1e-12:
        raise CircuitError(f"{where}: probabilities sum to {sum(ps):.6g} > 1")


def _check_pairs(ins: CircuitInstruction, where: str):
    if len(ins) % 2:
        raise CircuitError(f"{where}: a two-qubit instruction needs an even number of targets, got {len(ins)}")
    qs = ins.qubit_array
    if qs is not None:  # plain qubits: compared as arrays
        same = qs[::2][qs[::2] == qs[1::2]].tolist()
    else:
        firsts, seconds = [t.qubit_value for t in ins.targets[::2]], [t.qubit_value for t in ins.targets[1::2]]
        same = [a for a, b in zip(firsts, seconds) if a is not None and a == b]
    if same:
        raise CircuitError(f"{where}: a pair acts twice on qubit {same[0]}")


# two-qubit gates that accept classical controls (rec/sweep) and on which side (0: first, 1: second)
_CLASSICAL_SIDES = {"CX": (0,), "CY": (0,), "CZ": (0, 1), "XCZ": (1,), "YCZ": (1,)}


def _check_unitary_targets(ins: CircuitInstruction, where: str):
    g = gates.GATES[ins.definition.gate]
    ts = ins.targets
    plain = all(t.is_qubit_target and not t.is_inverted_result_target for t in ts)
    if plain:  # the bulk of large circuits: only the pairs need a look
        if g.num_qubits == 2:
            _check_pairs(ins, where)
        return
    classical = lambda t: t.is_measurement_record_target or t.is_sweep_bit_target
    for t in ts:
        if t.pauli or t.is_combiner or t.is_inverted_result_target:
            raise CircuitError(f"{where}: target '{t}' must be a qubit")
    if g.num_qubits == 1:
        if any(classical(t) for t in ts):
            raise CircuitError(f"{where}: target '{next(t for t in ts if classical(t))}' must be a qubit")
        return
    _check_pairs(ins, where)
    sides = _CLASSICAL_SIDES.get(ins.name, ())
    for a, b in zip(ts[::2], ts[1::2]):
        for side, t in enumerate((a, b)):
            if classical(t) and side not in sides:
                raise CircuitError(f"{where}: '{t}' cannot be used there: classical controls are only the "
                                   "control of CX/CY/CZ (either side of CZ, the target side of XCZ/YCZ)")
        if classical(a) and classical(b):
            raise CircuitError(f"{where}: both targets of a pair are classical ({a} {b})")


def _check_products(ins: CircuitInstruction, where: str):
    ts = ins.targets
    if not ts:
        return
    expect_term = True
    for i, t in enumerate(ts):
        if expect_term:
            if not t.pauli:
                raise CircuitError(f"{where}: '{t}' must be a Pauli target like X0 (products are X0*Y1)")
            expect_term = False
        else:
            expect_term = t.is_combiner
            if not t.is_combiner and not t.pauli:
                raise CircuitError(f"{where}: '{t}' must be a Pauli target like X0")
    if expect_term:
        raise CircuitError(f"{where}: a product ends with '*'")
    for group in product_groups(ins):
        qs = [t.value for t in group]
        if len(set(qs)) != len(qs):
            raise CircuitError(f"{where}: a qubit appears twice in the product {'*'.join(map(str, group))}")


def product_groups(ins: CircuitInstruction) -> list[list[GateTarget]]:
    """MPP targets split into the Pauli products they measure (X0*Y1 Z2 -> [[X0, Y1], [Z2]])."""
    groups: list[list[GateTarget]] = []
    joined = False
    for t in ins.targets:
        if t.is_combiner:
            joined = True
            continue
        if joined and groups:
            groups[-1].append(t)
        else:
            groups.append([t])
        joined = False
    return groups
