"""The circuit builder: a list of validated instructions, read by every backend.

A circuit only records what to do. Angles are floats (fixed) or `Param` references into the
`params` vector given at evaluation time, so one circuit serves a whole optimisation loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

from . import gates, qasm


@dataclass(frozen=True)
class Param:
    """An angle read from params[index] at evaluation time, as scale * params[index] + offset.

    `Param(k)` is the plain parameter; arithmetic with numbers (2 * Param(0), -Param(1) / 2 + 0.3)
    gives affine expressions, which exact decompositions (QASM's cp, crx, u3, ...) need.
    """

    index: int
    scale: float = 1.0
    offset: float = 0.0

    def __post_init__(self):
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"Param index must be a non-negative int, got {self.index!r}")

    def __mul__(self, k):
        return Param(self.index, self.scale * float(k), self.offset * float(k))

    __rmul__ = __mul__

    def __truediv__(self, k):
        return self * (1.0 / float(k))

    def __neg__(self):
        return self * -1.0

    def __add__(self, k):
        if isinstance(k, Param):
            raise TypeError("sums of two Params are not supported; use one Param per angle")
        return Param(self.index, self.scale, self.offset + float(k))

    __radd__ = __add__

    def __sub__(self, k):
        return self + (-float(k))

    def __rsub__(self, k):
        return (-self) + k


Angle = Union[float, Param]


@dataclass(frozen=True)
class Instruction:
    """One gate application: the gate's table name, its qubits and its arguments."""

    name: str
    qubits: tuple[int, ...]
    args: tuple = ()  # angles (float | Param) for rotations, probabilities for channels
    pauli: str | None = None  # generator of a pauli_rotation

    @property
    def gate(self) -> gates.GateDef:
        return gates.GATES[self.name]

    @property
    def generator(self) -> str | None:
        """The Pauli generator of a rotation, character j on qubits[j] (a pauli_rotation's own string)."""
        return self.pauli if self.name == "pauli_rotation" else self.gate.generator


def _check_angle(gate: str, a) -> Angle:
    if isinstance(a, Param):
        return a
    if isinstance(a, (str, bytes)):  # float("0.1") would accept text silently
        raise TypeError(f"gate '{gate}': angle must be a float or pp.Param, got {a!r}")
    try:
        v = float(a)
    except (TypeError, ValueError):
        raise TypeError(f"gate '{gate}': angle must be a float or pp.Param, got {a!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"gate '{gate}': angle {v} is not finite")
    return v


class Circuit:
    """A quantum circuit on `num_qubits` qubits. Builder methods validate and return self."""

    def __init__(self, num_qubits: int):
        if isinstance(num_qubits, bool) or not isinstance(num_qubits, int) or num_qubits < 1:
            raise ValueError(f"num_qubits must be a positive int, got {num_qubits!r}")
        self.num_qubits = num_qubits
        self.instructions: list[Instruction] = []
        self._program_cache = None
        self._num_params = None

    # ---- generic entry point ------------------------------------------------------------------
    def append(self, name: str, qubits: Sequence[int], *args, pauli: str | None = None) -> "Circuit":
        """Append gate `name` (or an alias) on `qubits` with angle or probability `args`; a composite
        (p, u, cp, crx, ch, ccx, ...) is appended as its exact decomposition from the gate table."""
        g = gates.lookup(name)
        qubits = tuple(self._check_qubit(g.name, q) for q in qubits)
        if g.name == "pauli_rotation":
            if not isinstance(pauli, str) or not pauli or set(pauli.upper()) - set("IXYZ"):
                raise ValueError(f"pauli_rotation: generator must be a string over I, X, Y, Z, got {pauli!r}")
            pauli = pauli.upper()
            if len(pauli) != len(qubits):
                raise ValueError(f"pauli_rotation: generator '{pauli}' has {len(pauli)} letters "
                                 f"but {len(qubits)} qubits were given")
        elif len(qubits) != g.num_qubits:
            raise ValueError(f"gate '{g.name}' acts on {g.num_qubits} qubit(s), got {len(qubits)}: {qubits}")
        if len(set(qubits)) != len(qubits):
            raise ValueError(f"gate '{g.name}': qubits must be distinct, got {qubits}")
        if len(args) != g.num_params:
            raise ValueError(f"gate '{g.name}' takes {g.num_params} parameter(s), got {len(args)}")
        if g.kind == "channel":
            args = tuple(self._check_probability(g.name, p) for p in args)
            if g.name == "pauli_channel" and sum(args) > 1 + 1e-12:
                raise ValueError(f"pauli_channel: px + py + pz = {sum(args)} exceeds 1")
        else:
            args = tuple(_check_angle(g.name, a) for a in args)
        if g.kind == "composite":  # the table's exact decomposition, so backends only see their own gates
            for name, local, angles, *generator in g.decompose(*args):
                self.append(name, [qubits[j] for j in local], *angles, pauli=generator[0] if generator else None)
            return self
        self.instructions.append(Instruction(g.name, qubits, args, pauli))
        self._program_cache = self._num_params = None  # the lowered gate table (propagation.program) is stale now
        return self

    def _check_qubit(self, gate: str, q) -> int:
        if isinstance(q, bool) or not isinstance(q, (int,)) and not hasattr(q, "__index__"):
            raise TypeError(f"gate '{gate}': qubit must be an int, got {q!r}")
        q = int(q)
        if not 0 <= q < self.num_qubits:
            raise ValueError(f"gate '{gate}': qubit {q} out of range for a {self.num_qubits}-qubit circuit")
        return q

    @staticmethod
    def _check_probability(gate: str, p) -> float:
        if isinstance(p, Param):
            raise TypeError(f"gate '{gate}': noise strengths are fixed floats, not Params")
        p = float(p)
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"gate '{gate}': probability {p} is not in [0, 1]")
        return p

    # ---- named builders (DESIGN.md section 2) ---------------------------------------------------
    def h(self, q): return self.append("h", [q])
    def x(self, q): return self.append("x", [q])
    def y(self, q): return self.append("y", [q])
    def z(self, q): return self.append("z", [q])
    def s(self, q): return self.append("s", [q])
    def sdg(self, q): return self.append("sdg", [q])
    def t(self, q): return self.append("t", [q])
    def tdg(self, q): return self.append("tdg", [q])
    def sx(self, q): return self.append("sx", [q])
    def sxdg(self, q): return self.append("sxdg", [q])
    def cx(self, a, b): return self.append("cx", [a, b])
    def cy(self, a, b): return self.append("cy", [a, b])
    def cz(self, a, b): return self.append("cz", [a, b])
    def swap(self, a, b): return self.append("swap", [a, b])
    def iswap(self, a, b): return self.append("iswap", [a, b])
    def rx(self, q, a): return self.append("rx", [q], a)
    def ry(self, q, a): return self.append("ry", [q], a)
    def rz(self, q, a): return self.append("rz", [q], a)
    def rxx(self, p, q, a): return self.append("rxx", [p, q], a)
    def ryy(self, p, q, a): return self.append("ryy", [p, q], a)
    def rzz(self, p, q, a): return self.append("rzz", [p, q], a)
    # composites of the gate table (gates.py): appended as their exact decompositions
    def p(self, q, a): return self.append("p", [q], a)
    def u(self, q, theta, phi, lam): return self.append("u", [q], theta, phi, lam)
    def r(self, q, theta, phi): return self.append("r", [q], theta, phi)
    def rzx(self, p, q, a): return self.append("rzx", [p, q], a)
    def ecr(self, a, b): return self.append("ecr", [a, b])
    def cp(self, c, t, a): return self.append("cp", [c, t], a)
    def crx(self, c, t, a): return self.append("crx", [c, t], a)
    def cry(self, c, t, a): return self.append("cry", [c, t], a)
    def crz(self, c, t, a): return self.append("crz", [c, t], a)
    def cu(self, c, t, theta, phi, lam, gamma=0.0): return self.append("cu", [c, t], theta, phi, lam, gamma)
    def ch(self, c, t): return self.append("ch", [c, t])
    def ccx(self, a, b, t): return self.append("ccx", [a, b, t])
    def ccz(self, a, b, c): return self.append("ccz", [a, b, c])
    def rccx(self, a, b, t): return self.append("rccx", [a, b, t])

    def pauli_rotation(self, pauli: str, qubits: Sequence[int], a) -> "Circuit":
        """exp(-i a/2 P) with P = pauli[0] on qubits[0] x pauli[1] on qubits[1] x ..."""
        return self.append("pauli_rotation", qubits, a, pauli=pauli)

    def depolarize(self, q, p): return self.append("depolarize", [q], p)
    def dephase(self, q, p): return self.append("dephase", [q], p)
    def pauli_channel(self, q, px, py, pz): return self.append("pauli_channel", [q], px, py, pz)
    def amplitude_damp(self, q, gamma): return self.append("amplitude_damp", [q], gamma)

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        """1 + the largest Param index used (0 if the circuit has no Params). Remembered for the
        current instruction count (a call asks several times; a 5,000-gate circuit takes 1 ms)."""
        known = getattr(self, "_num_params", None)
        if known is None or known[0] != len(self.instructions):
            idx = [a.index for ins in self.instructions for a in ins.args if isinstance(a, Param)]
            self._num_params = known = (len(self.instructions), max(idx) + 1 if idx else 0)
        return known[1]

    @property
    def has_noise(self) -> bool:
        return any(ins.gate.kind == "channel" for ins in self.instructions)

    def __len__(self):
        return len(self.instructions)

    def __iter__(self):
        return iter(self.instructions)

    def __repr__(self):
        return f"Circuit(num_qubits={self.num_qubits}, gates={len(self.instructions)}, params={self.num_params})"

    def copy(self) -> "Circuit":
        c = Circuit(self.num_qubits)
        c.instructions = list(self.instructions)
        return c

    def __add__(self, other: "Circuit") -> "Circuit":
        if other.num_qubits != self.num_qubits:
            raise ValueError(f"cannot concatenate circuits on {self.num_qubits} and {other.num_qubits} qubits")
        c = self.copy()
        c.instructions += other.instructions
        return c

    # ---- import ----------------------------------------------------------------------------------
    @classmethod
    def from_qasm(cls, text: str, params=None) -> "Circuit":
        """Parse OpenQASM 2.0 (qelib1.inc) or the OpenQASM 3 gate subset (needs the `qasm` extra);
        params: values of OpenQASM 3 `input` parameters (by name, or in the order of their names)."""
        return qasm.circuit_from_qasm(text, params, new_circuit=cls)

    @classmethod
    def from_qiskit(cls, qc) -> "Circuit":
        """Convert a qiskit.QuantumCircuit; its unbound Parameters become Param(k), k = the position in
        qc.parameters (barriers are skipped, measurements refused)."""
        return qasm.circuit_from_qiskit(qc, new_circuit=cls, new_param=Param)
