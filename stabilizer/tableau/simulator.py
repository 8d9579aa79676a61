"""`TableauSimulator`: Stim's interactive stabilizer simulator, on the packed inverse tableau.

Gates, measurements, resets, noise and classical feedback of a `Circuit` (or called one by one with
Stim's method names) update a `stabilizer.tableau.Tableau`. Consecutive targets of one instruction
that touch disjoint qubits are applied as one batch (Stim applies them in order; disjoint gates
commute, so the result is the same). Randomness (measurement outcomes, noise) comes from a numpy
generator seeded by `seed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..circuits import program
from ..circuits.circuit import (
    INSTRUCTIONS,
    Circuit,
    CircuitInstruction,
    CircuitRepeatBlock,
    GateTarget,
    canonical_name,
    product_groups,
    validate_instruction,
)
from ..circuits.program import (
    PAIRS,
    bucket,
    disjoint_runs,
    gate_action,
    noise_probabilities,
    unitary_parts,
)
from . import tableau

_PAULI_FLIPS = {"X": (True, False), "Y": (True, True), "Z": (False, True)}  # (x part, z part)
# circuits with at least this many instructions (repeats counted) run as one compiled program
PROGRAM_MIN_INSTRUCTIONS = 200


def _instruction_count(c: Circuit) -> int:
    return sum(op.repeat_count * _instruction_count(op.body) if isinstance(op, CircuitRepeatBlock) else 1
               for op in c.operations)


class TableauSimulator:
    """Stim-compatible stabilizer simulator: `sim.do(circuit)`, `sim.h(0)`, `sim.measure(0)`, ...

    A whole circuit of PROGRAM_MIN_INSTRUCTIONS or more runs as one compiled program (lowered once
    and cached on the circuit): no round trip to Python per gate or measurement. Smaller circuits
    and single calls run instruction by instruction (no compile per circuit).
    """

    def __init__(self, *, seed: int | None = None, num_qubits: int = 0):
        self._rng = np.random.default_rng(seed)
        self._n = 0
        self._tableau = tableau.identity(num_qubits + 1)
        self._record: list[bool] = []
        self._chain_fired = False  # an E / ELSE_CORRELATED_ERROR chain has fired
        self.set_num_qubits(num_qubits)

    # ---- size ------------------------------------------------------------------------------------
    @property
    def num_qubits(self) -> int:
        return self._n

    def set_num_qubits(self, n: int) -> None:
        if n > self._n:
            self._tableau = tableau.grow(self._tableau, n + 1)  # + 1: the compiled path's spare qubit
            self._n = n

    def _ensure(self, qubits: Iterable[int]) -> None:
        qs = list(qubits)
        if qs:
            if min(qs) < 0:
                raise ValueError(f"qubit {min(qs)} is negative")
            self.set_num_qubits(max(qs) + 1)

    # ---- unitary gates ---------------------------------------------------------------------------
    def _apply(self, stim_name: str, groups: Sequence[tuple[int, ...]]) -> None:
        image, sign, arity = gate_action(stim_name)
        self._ensure(q for g in groups for q in g)
        for run in disjoint_runs(groups):
            size = bucket(len(run))
            qubits = np.array(run + [run[0]] * (size - len(run)), np.int32).reshape(size, arity)
            images, signs = jnp.asarray(np.tile(image, (size, 1))), jnp.asarray(np.tile(sign, (size, 1)))
            self._tableau = tableau.prepend(self._tableau, jnp.asarray(qubits), images, signs,
                                            jnp.arange(size) < len(run), arity=arity)

    def _paulis(self, flips: Iterable[tuple[int, str]]) -> None:
        """Prepend Paulis given as (qubit, 'X'|'Y'|'Z') pairs (noise, feedback); repeats compose."""
        flips = list(flips)
        if not flips:
            return
        self._ensure(q for q, _ in flips)
        n = self._tableau.capacity
        xf, zf = np.zeros(n, bool), np.zeros(n, bool)
        for q, p in flips:
            a, b = _PAULI_FLIPS[p]
            xf[q] ^= a
            zf[q] ^= b
        self._tableau = tableau.flip_signs(self._tableau, jnp.asarray(xf), jnp.asarray(zf))

    # ---- measurement -----------------------------------------------------------------------------
    def _measure_z(self, q: int) -> bool:
        self._ensure([q])
        guess = bool(self._rng.integers(2))
        self._tableau, result, _ = tableau.measure_z(self._tableau, jnp.int32(q), jnp.bool_(guess))
        return bool(result)

    def _basis_in(self, basis: str, qubits: Sequence[int]) -> None:
        """Rotate `basis` to Z on the qubits (each change is its own inverse)."""
        if basis != "Z" and qubits:
            self._apply("H" if basis == "X" else "H_YZ", [(q,) for q in qubits])

    def _measure(self, basis: str, q: int) -> bool:
        self._basis_in(basis, [q])
        r = self._measure_z(q)
        self._basis_in(basis, [q])
        return r

    def _reset(self, basis: str, q: int) -> None:
        self._basis_in(basis, [q])
        if self._measure_z(q):
            self._paulis([(q, "X")])
        self._basis_in(basis, [q])

    def _measure_product(self, factors: Sequence[tuple[str, int]]) -> bool:
        """Measure a Pauli product on distinct qubits: rotate each factor to Z, fold the parity onto
        the first qubit with CX, measure it, undo."""
        for p, q in factors:
            self._basis_in(p, [q])
        first = factors[0][1]
        pairs = [(q, first) for _, q in factors[1:]]
        for pair in pairs:
            self._apply("CX", [pair])
        r = self._measure_z(first)
        for pair in reversed(pairs):
            self._apply("CX", [pair])
        for p, q in factors:
            self._basis_in(p, [q])
        return r

    # ---- Stim's public methods -------------------------------------------------------------------
    def measure(self, q: int) -> bool:
        r = self._measure("Z", q)
        self._record.append(r)
        return r

    def measure_kickback(self, q: int):
        """Measure Z_q as Stim does: (result, kickback), the kickback a `stim.PauliString` that flips
        between the two post-measurement states, or None when the result was determined (needs stim)."""
        import stim

        self._ensure([q])
        guess = bool(self._rng.integers(2))
        self._tableau, result, was_random, xs, zs = tableau.measure_kickback_z(self._tableau, jnp.int32(q),
                                                                                jnp.bool_(guess))
        self._record.append(bool(result))
        if not bool(was_random):
            return bool(result), None
        xs, zs = np.asarray(xs)[: self._n], np.asarray(zs)[: self._n]
        return bool(result), stim.PauliString.from_numpy(xs=xs, zs=zs)

    def measure_many(self, *qubits: int) -> list[bool]:
        return [self.measure(q) for q in qubits]

    def reset(self, *qubits: int) -> None:
        for q in qubits:
            self._reset("Z", q)

    def reset_x(self, *qubits: int) -> None:
        for q in qubits:
            self._reset("X", q)

    def reset_y(self, *qubits: int) -> None:
        for q in qubits:
            self._reset("Y", q)

    def peek_z(self, q: int) -> int:
        """+1 or -1 when Z_q is determined, 0 when measuring it would be random."""
        if q >= self._n:
            return 1
        return int(tableau.peek_z(self._tableau, jnp.int32(q)))

    def peek_x(self, q: int) -> int:
        return self._peek("X", q)

    def peek_y(self, q: int) -> int:
        return self._peek("Y", q)

    def _peek(self, basis: str, q: int) -> int:
        if q >= self._n:
            return 0
        self._basis_in(basis, [q])
        v = self.peek_z(q)
        self._basis_in(basis, [q])
        return v

    def current_measurement_record(self) -> list[bool]:
        return list(self._record)

    def current_inverse_tableau(self):
        """The inverse tableau as a `stim.Tableau` over num_qubits (needs stim)."""
        import stim

        n, cap = self._n, self._tableau.capacity
        xs, zs, signs = (np.asarray(a) for a in self._tableau)
        bits = lambda words, rows: np.unpackbits(words[rows].view(np.uint8), axis=1, bitorder="little")[:, :n]
        rows_x, rows_z = np.arange(n), cap + np.arange(n)
        return stim.Tableau.from_numpy(
            x2x=bits(xs, rows_x).astype(bool), x2z=bits(zs, rows_x).astype(bool),
            z2x=bits(xs, rows_z).astype(bool), z2z=bits(zs, rows_z).astype(bool),
            x_signs=signs[rows_x], z_signs=signs[rows_z])

    def __getattr__(self, name: str):
        """Gate methods by Stim name: sim.h(0, 1), sim.cx(0, 1, 2, 3), sim.sqrt_x_dag(4), ..."""
        canon = canonical_name(name) if not name.startswith("_") else None
        if canon is None or INSTRUCTIONS[canon].kind != "unitary":
            raise AttributeError(f"TableauSimulator has no attribute '{name}'")

        def gate(*targets: int):
            self.do(CircuitInstruction(canon, tuple(GateTarget(int(t)) for t in targets)))

        return gate

    # ---- circuits --------------------------------------------------------------------------------
    def do(self, item) -> None:
        """Run a Circuit, a stim.Circuit, an instruction, a repeat block, or a stim.PauliString."""
        if isinstance(item, Circuit):
            if _instruction_count(item) >= PROGRAM_MIN_INSTRUCTIONS:
                self._do_program(item)
                return
            for op in item.operations:
                self.do(op)
        elif isinstance(item, CircuitRepeatBlock):
            for _ in range(item.repeat_count):
                self.do(item.body)
        elif isinstance(item, CircuitInstruction):
            if item.line == 0:  # built in code: not checked by the parser yet
                validate_instruction(item, len(self._record))
            self._do_instruction(item)
        elif type(item).__module__.startswith("stim") and type(item).__name__ == "PauliString":
            self._paulis((q, "_XYZ"[p]) for q, p in enumerate(item) if p)  # its sign is a global phase
        elif type(item).__module__.startswith("stim"):
            self.do(Circuit(str(item)))
        else:
            raise TypeError(f"cannot run a {type(item).__name__}")

    do_circuit = do

    def _do_program(self, circuit: Circuit) -> None:
        """Run a whole circuit as one compiled program (stabilizer.circuits.program: its tables as
        scans, long runs of one op kind without the switch over kinds) on the current tableau."""
        self.set_num_qubits(circuit.num_qubits)  # keeps room for the spare
        prog = program.lowered(circuit, spare=self._n, merge_gates=True, runs=True)
        structure, tables = prog.structure(), program.device_tables(prog)
        guesses = jnp.asarray(self._rng.integers(2, size=prog.num_measurements).astype(bool))
        key = jax.random.key(int(self._rng.integers(2**62)))
        self._tableau, record = tableau.run_program(structure, tables, self._tableau, guesses, key, noisy=True,
                                                    live_qubits=self._n + 1)  # + 1: the spare
        self._record.extend(np.asarray(record).tolist())

    def _do_instruction(self, ins: CircuitInstruction) -> None:
        d = ins.definition
        ts = ins.targets
        kind = d.kind
        if kind == "unitary":
            self._unitary(ins)
        elif kind in ("measure", "measure_reset"):
            p = ins.gate_args[0] if ins.gate_args else 0.0
            for t in ts:
                r = self._measure(d.basis, t.value)
                if kind == "measure_reset" and r:
                    self._basis_in(d.basis, [t.value])
                    self._paulis([(t.value, "X")])
                    self._basis_in(d.basis, [t.value])
                self._record.append(r ^ t.is_inverted_result_target ^ bool(p and self._rng.random() < p))
        elif kind == "reset":
            for t in ts:
                self._reset(d.basis, t.value)
        elif kind == "pair_measure":
            p = ins.gate_args[0] if ins.gate_args else 0.0
            for a, b in zip(ts[::2], ts[1::2]):
                r = self._measure_product([(d.basis, a.value), (d.basis, b.value)])
                inv = a.is_inverted_result_target ^ b.is_inverted_result_target
                self._record.append(r ^ inv ^ bool(p and self._rng.random() < p))
        elif kind == "mpp":
            p = ins.gate_args[0] if ins.gate_args else 0.0
            for group in product_groups(ins):
                r = self._measure_product([(t.pauli, t.value) for t in group])
                inv = sum(t.is_inverted_result_target for t in group) % 2 == 1  # each '!' flips
                self._record.append(r ^ inv ^ bool(p and self._rng.random() < p))
        elif kind == "mpad":
            p = ins.gate_args[0] if ins.gate_args else 0.0
            for t in ts:
                self._record.append(bool(t.value) ^ bool(p and self._rng.random() < p))
        elif kind == "noise":
            self._noise(ins)
        elif kind == "correlated":
            self._correlated(ins)
        elif kind == "annotation":
            self._ensure(t.value for t in ts if t.is_qubit_target)
        else:  # pragma: no cover - the parser admits no other kinds
            raise ValueError(f"line {ins.line}: {ins.name}: no simulation rule")

    def _unitary(self, ins: CircuitInstruction) -> None:
        for part in unitary_parts(ins):
            if part[0] == "gate":
                self._apply(ins.name, part[1])
            else:
                _, target, lookback, pauli = part
                if self._record[-lookback]:
                    self._paulis([(target, pauli)])

    def _noise(self, ins: CircuitInstruction) -> None:
        if ins.name in ("I_ERROR", "II_ERROR"):
            return
        probs = noise_probabilities(ins)
        arity = ins.definition.arity
        flips: list[tuple[int, str]] = []
        for i in range(0, len(ins.targets), arity):
            k = self._pick(probs)
            if k is not None:  # one-qubit channels draw events XI, YI, ZI: the "I" has no target
                group = [t.value for t in ins.targets[i:i + arity]]
                flips += [(q, p) for q, p in zip(group, PAIRS[k]) if p != "I"]
        self._paulis(flips)

    def _pick(self, probs: Sequence[float]) -> int | None:
        """Index of the event that happens (probabilities of disjoint events), or None."""
        u = self._rng.random()
        acc = 0.0
        for k, p in enumerate(probs):
            acc += p
            if u < acc:
                return k
        return None

    def _correlated(self, ins: CircuitInstruction) -> None:
        if ins.name == "E":  # an ELSE with no E before it finds nothing fired, as in Stim
            self._chain_fired = False
        if self._chain_fired:
            return
        if self._rng.random() < ins.gate_args[0]:
            self._chain_fired = True
            self._paulis([(t.value, t.pauli) for t in ins.targets])
