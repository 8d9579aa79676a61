"""The gate table: one record per gate, the single source of truth for every backend.

Each record gives the name, aliases, arity, number of angle parameters, its kind and its
unitary (little-endian on the gate's own qubits: the first qubit argument is bit 0). Everything
else is derived from it: the Heisenberg action of Clifford gates (`clifford_action`), the Pauli
generator of rotations, the state-vector matrices, the parser's names.
`tests/pauliprop/circuits/test_gates.py` checks, for every entry, that the derived actions agree with
the matrix, and for every composite that its decomposition multiplies out to its matrix.

Kinds:
  clifford  maps each Pauli word to one signed word (conjugation by the unitary).
  rotation  exp(-i a/2 G) for a Pauli generator G; splits anticommuting words.
            T and Tdg are rotations with fixed angles (equal to T, Tdg up to a global phase).
  channel   a noise channel acting on one qubit (Heisenberg picture in `pauliprop.propagation.program`).
  composite a gate the engines do not have (p, u, cp, crx, ch, ccx, ...): `decompose(*angles)` gives an
            exact decomposition (up to a global phase) into the gates above, which the circuit builder
            appends in its place, so no backend ever sees a composite. Its angles may be `Param`s:
            the decompositions only scale, negate and shift one angle at a time (affine in it), which
            `Param` carries as scale and offset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

PAULI_MATRICES = {
    "I": np.eye(2, dtype=complex),
    "X": np.array([[0, 1], [1, 0]], dtype=complex),
    "Y": np.array([[0, -1j], [1j, 0]], dtype=complex),
    "Z": np.array([[1, 0], [0, -1]], dtype=complex),
}


def pauli_matrix(label: str) -> np.ndarray:
    """Dense matrix of a Pauli string; character i acts on local qubit i (bit i, little-endian)."""
    m = np.eye(1, dtype=complex)
    for ch in label:  # qubit i is bit i, so later characters are more significant (left kron factors)
        m = np.kron(PAULI_MATRICES[ch], m)
    return m


def rotation_matrix(generator: str, angle: float) -> np.ndarray:
    """exp(-i a/2 G) for a Pauli string G (G^2 = I)."""
    g = pauli_matrix(generator)
    return math.cos(angle / 2) * np.eye(len(g)) - 1j * math.sin(angle / 2) * g


@dataclass(frozen=True)
class GateDef:
    """One gate: name, arity, parameters, kind and unitary (or Kraus channel) definition."""

    name: str
    num_qubits: int
    kind: str  # "clifford" | "rotation" | "channel" | "composite"
    num_params: int = 0
    generator: str | None = None  # rotations: the Pauli generator G of exp(-i a/2 G)
    fixed_angle: float | None = None  # rotations with a fixed angle (T, Tdg)
    unitary: np.ndarray | None = None  # Cliffords and fixed rotations: the exact matrix
    kraus: Callable[..., list] | None = None  # channels: Kraus operators for given parameters
    aliases: tuple[str, ...] = ()
    doc: str = ""
    qasm_names: tuple[str, ...] = field(default=())
    stim_names: tuple[str, ...] = field(default=())  # names in Stim's circuit format (Cliffords)
    # composites: angles -> [(gate, local qubits, angles), ...] or with a 4th item, a pauli_rotation's
    # generator; and the closed-form unitary of parametrized composites (Qiskit's definition)
    decompose: Callable[..., list] | None = None
    unitary_of: Callable[..., np.ndarray] | None = None

    def matrix(self, *angles: float) -> np.ndarray:
        """The gate's unitary for the given angles (rotations, parametrized composites) or its fixed matrix."""
        if self.kind == "channel":
            raise ValueError(f"gate '{self.name}' is a noise channel and has no unitary")
        if self.unitary is not None:
            return self.unitary
        if self.unitary_of is not None:
            return np.asarray(self.unitary_of(*angles), dtype=complex)
        (angle,) = angles
        return rotation_matrix(self.generator, angle)


_s2 = 1 / math.sqrt(2)
_SX = 0.5 * np.array([[1 + 1j, 1 - 1j], [1 - 1j, 1 + 1j]])


def _controlled(u: np.ndarray) -> np.ndarray:
    """Two-qubit controlled-u: control is the first argument (bit 0), target the second (bit 1)."""
    m = np.eye(4, dtype=complex)
    # basis index = control + 2 * target; the control=1 block is indices 1 and 3
    m[np.ix_([1, 3], [1, 3])] = u
    return m


def _depolarize(p):
    # With probability p the qubit is replaced by the maximally mixed state:
    # rho -> (1 - p) rho + p I/2, i.e. X, Y, Z errors with probability p/4 each.
    return _pauli_kraus(p / 4, p / 4, p / 4)


def _dephase(p):
    # Z error with probability p/2: X and Y are damped by (1 - p), as PauliPropagation.jl's DephasingNoise.
    return _pauli_kraus(0.0, 0.0, p / 2)


def _pauli_kraus(px, py, pz):
    pi = 1.0 - px - py - pz
    return [math.sqrt(max(w, 0.0)) * PAULI_MATRICES[s] for w, s in ((pi, "I"), (px, "X"), (py, "Y"), (pz, "Z"))]


def _amplitude_damp(gamma):
    return [
        np.array([[1, 0], [0, math.sqrt(1 - gamma)]], dtype=complex),
        np.array([[0, math.sqrt(gamma)], [0, 0]], dtype=complex),
    ]


def _clifford(name, n, unitary, aliases=(), doc="", qasm=(), stim=None):
    stim = (name.upper(),) if stim is None else stim
    return GateDef(name, n, "clifford", unitary=np.asarray(unitary, dtype=complex), aliases=aliases,
                   doc=doc, qasm_names=qasm, stim_names=stim)


def _pauli_controlled(p: str, q: str) -> np.ndarray:
    """Pauli-controlled Pauli (Stim's XCY etc.): (I + P_a + Q_b - P_a Q_b) / 2, P on the first qubit."""
    pa = np.kron(np.eye(2), PAULI_MATRICES[p])
    qb = np.kron(PAULI_MATRICES[q], np.eye(2))
    return (np.eye(4) + pa + qb - pa @ qb) / 2


def _sqrt_pp(p: str, sign: int) -> np.ndarray:
    """Stim's SQRT_PP (sign +1) and SQRT_PP_DAG (-1): (I -+ i PP) / sqrt(2), the RPP(+-pi/2) matrices."""
    return rotation_matrix(p + p, sign * math.pi / 2)


_r2 = np.array  # short alias for the literal 2x2 matrices below (Stim's, little-endian)
_CX = _controlled(PAULI_MATRICES["X"])
_SWAP = np.eye(4)[[0, 2, 1, 3]]


def _rotation(name, generator, aliases=(), doc="", qasm=()):
    return GateDef(name, len(generator), "rotation", num_params=1, generator=generator, aliases=aliases,
                   doc=doc, qasm_names=qasm)


def _composite(name, n, num_params, decompose, unitary, aliases=(), doc="", qasm=()):
    fixed = not num_params
    return GateDef(name, n, "composite", num_params=num_params, decompose=decompose, aliases=aliases, doc=doc,
                   unitary=np.asarray(unitary, dtype=complex) if fixed else None,
                   unitary_of=None if fixed else unitary, qasm_names=qasm)


def _diag(*entries):
    return np.diag(np.asarray(entries, dtype=complex))


def _u3(t, p, lam):  # Qiskit's U(t, p, l)
    c, s = math.cos(t / 2), math.sin(t / 2)
    return np.array([[c, -np.exp(1j * lam) * s], [np.exp(1j * p) * s, np.exp(1j * (p + lam)) * c]])


def _controlled_rotation(axis: str):
    """|0><0| I + |1><1| R_P(t) = exp(-i t/4 P_t) exp(+i t/4 Z_c P_t) (the two factors commute)."""
    def steps(t):
        return [("r" + axis.lower(), (1,), (t / 2,)), ("pauli_rotation", (0, 1), (-t / 2,), "Z" + axis)]
    return steps


def _cu(t, p, lam, g=0.0):
    """controlled(e^{ig} U(t, p, l)) = P_c(g + (p + l)/2) C-RZ(p) C-RY(t) C-RZ(l); the phase on the control
    as three RZs, so that each angle stays affine in one parameter."""
    crz, cry = _controlled_rotation("Z"), _controlled_rotation("Y")
    return [*crz(lam), *cry(t), *crz(p), ("rz", (0,), (g,)), ("rz", (0,), (p / 2,)), ("rz", (0,), (lam / 2,))]


def _ccp(target: str):
    """CC-P on (c0, c1, t) with P = X or Z: exp(i pi |11><11| (I - P)/2), as the seven commuting pi/4
    rotations of the product of (I - Z_c0)(I - Z_c1)(I - P_t)/8, up to the phase e^{i pi/8}."""
    q = math.pi / 4
    return lambda: [("rz", (0,), (q,)), ("rz", (1,), (q,)), ("r" + target.lower(), (2,), (q,)),
                    ("rzz", (0, 1), (-q,)), ("pauli_rotation", (0, 2), (-q,), "Z" + target),
                    ("pauli_rotation", (1, 2), (-q,), "Z" + target), ("pauli_rotation", (0, 1, 2), (q,), "ZZ" + target)]


def _cc(u: np.ndarray) -> np.ndarray:
    """Doubly controlled u: controls the first two arguments (bits 0, 1), target the third (bit 2)."""
    m = np.eye(8, dtype=complex)
    m[np.ix_([3, 7], [3, 7])] = u
    return m


_R2 = 1 / math.sqrt(2)
_H = _R2 * np.array([[1, 1], [1, -1]])
# Qiskit's RCCX (Margolus): CCX up to a relative phase, 3 CX; its definition h t cx tdg cx t cx tdg h
_RCCX_STEPS = [("h", (2,), ()), ("t", (2,), ()), ("cx", (1, 2), ()), ("tdg", (2,), ()), ("cx", (0, 2), ()),
               ("t", (2,), ()), ("cx", (1, 2), ()), ("tdg", (2,), ()), ("h", (2,), ())]
_RCCX = np.zeros((8, 8), dtype=complex)  # the product of those steps, written out: i on |011>->|111>, -i back, -1 on |101>
for _b in range(8):
    _RCCX[_b, _b] = 1
_RCCX[3, 3] = _RCCX[7, 7] = 0
_RCCX[7, 3], _RCCX[3, 7], _RCCX[5, 5] = 1j, -1j, -1


GATES: dict[str, GateDef] = {
    g.name: g
    for g in [
        _clifford("id", 1, np.eye(2), aliases=("i",), doc="identity", qasm=("id",), stim=("I",)),
        _clifford("h", 1, _s2 * np.array([[1, 1], [1, -1]]), aliases=("h_xz",), doc="Hadamard", qasm=("h",),
                  stim=("H", "H_XZ")),
        _clifford("x", 1, PAULI_MATRICES["X"], doc="Pauli X", qasm=("x",)),
        _clifford("y", 1, PAULI_MATRICES["Y"], doc="Pauli Y", qasm=("y",)),
        _clifford("z", 1, PAULI_MATRICES["Z"], doc="Pauli Z", qasm=("z",)),
        _clifford("s", 1, np.diag([1, 1j]), aliases=("sqrt_z",), doc="S = diag(1, i)", qasm=("s",),
                  stim=("S", "SQRT_Z")),
        _clifford("sdg", 1, np.diag([1, -1j]), aliases=("s_dag", "sqrt_z_dag"), doc="S^dagger", qasm=("sdg",),
                  stim=("S_DAG", "SQRT_Z_DAG")),
        _clifford("sx", 1, _SX, aliases=("sqrt_x",), doc="sqrt(X)", qasm=("sx",), stim=("SQRT_X",)),
        _clifford("sxdg", 1, _SX.conj().T, aliases=("sqrt_x_dag",), doc="sqrt(X)^dagger", qasm=("sxdg",),
                  stim=("SQRT_X_DAG",)),
        _clifford("sqrt_y", 1, _s2 * _r2([[1, -1], [1, 1]]), doc="sqrt(Y)"),
        _clifford("sqrt_y_dag", 1, _s2 * _r2([[1, 1], [-1, 1]]), doc="sqrt(Y)^dagger"),
        _clifford("h_xy", 1, _r2([[0, 1], [1j, 0]]), doc="swaps X and Y (Z -> -Z)"),
        _clifford("h_yz", 1, _s2 * _r2([[1, -1j], [1j, -1]]), doc="swaps Y and Z (X -> -X)"),
        _clifford("h_nxy", 1, _r2([[0, 1], [-1j, 0]]), doc="swaps X and -Y"),
        _clifford("h_nxz", 1, _s2 * _r2([[1, -1], [-1, -1]]), doc="swaps X and -Z"),
        _clifford("h_nyz", 1, _s2 * _r2([[1, 1j], [-1j, -1]]), doc="swaps Y and -Z"),
        _clifford("c_xyz", 1, _s2 * _r2([[1, -1j], [1, 1j]]), doc="cycles X -> Y -> Z -> X"),
        _clifford("c_zyx", 1, _s2 * _r2([[1, 1], [1j, -1j]]), doc="cycles Z -> Y -> X -> Z"),
        _clifford("c_nxyz", 1, _s2 * _r2([[1, -1j], [-1, -1j]]), doc="cycles -X -> Y -> Z -> -X"),
        _clifford("c_xnyz", 1, _s2 * _r2([[1, 1j], [1, -1j]]), doc="cycles X -> -Y -> Z -> X"),
        _clifford("c_xynz", 1, _s2 * _r2([[1, 1j], [-1, 1j]]), doc="cycles X -> Y -> -Z -> X"),
        _clifford("c_nzyx", 1, _s2 * _r2([[1, -1], [-1j, -1j]]), doc="cycles -Z -> Y -> X -> -Z"),
        _clifford("c_znyx", 1, _s2 * _r2([[1, 1], [-1j, 1j]]), doc="cycles Z -> -Y -> X -> Z"),
        _clifford("c_zynx", 1, _s2 * _r2([[1, -1], [1j, 1j]]), doc="cycles Z -> Y -> -X -> Z"),
        _clifford("cx", 2, _CX, aliases=("cnot", "zcx"), doc="controlled X (control, target)",
                  qasm=("cx", "CX"), stim=("CX", "CNOT", "ZCX")),
        _clifford("cy", 2, _controlled(PAULI_MATRICES["Y"]), aliases=("zcy",), doc="controlled Y", qasm=("cy",),
                  stim=("CY", "ZCY")),
        _clifford("cz", 2, _controlled(PAULI_MATRICES["Z"]), aliases=("zcz",), doc="controlled Z", qasm=("cz",),
                  stim=("CZ", "ZCZ")),
        *[_clifford(f"{p}c{q}".lower(), 2, _pauli_controlled(p, q), doc=f"{p}-controlled {q}")
          for p in "XY" for q in "XYZ"],
        _clifford("swap", 2, _SWAP, doc="swap", qasm=("swap",)),
        _clifford("iswap", 2, np.array([[1, 0, 0, 0], [0, 0, 1j, 0], [0, 1j, 0, 0], [0, 0, 0, 1]]), doc="iSWAP",
                  qasm=("iswap",)),
        _clifford("iswap_dag", 2, np.array([[1, 0, 0, 0], [0, 0, -1j, 0], [0, -1j, 0, 0], [0, 0, 0, 1]]),
                  doc="iSWAP^dagger"),
        _clifford("cxswap", 2, _SWAP @ _CX, doc="CX then SWAP"),
        _clifford("swapcx", 2, _CX @ _SWAP, doc="SWAP then CX"),
        _clifford("czswap", 2, _SWAP @ _controlled(PAULI_MATRICES["Z"]), aliases=("swapcz",), doc="CZ then SWAP",
                  stim=("CZSWAP", "SWAPCZ")),
        *[_clifford(f"sqrt_{p}{p}{d}".lower(), 2, _sqrt_pp(p, -1 if d else 1), doc=f"sqrt({p}{p}){'^dagger' if d else ''}")
          for p in "XYZ" for d in ("", "_DAG")],
        _clifford("ii", 2, np.eye(4), doc="two-qubit identity", stim=("II",)),
        GateDef("t", 1, "rotation", generator="Z", fixed_angle=math.pi / 4, unitary=np.diag([1, np.exp(1j * math.pi / 4)]),
                doc="T = diag(1, e^{i pi/4}) = e^{i pi/8} RZ(pi/4)", qasm_names=("t",)),
        GateDef("tdg", 1, "rotation", generator="Z", fixed_angle=-math.pi / 4,
                unitary=np.diag([1, np.exp(-1j * math.pi / 4)]), aliases=("t_dag",), doc="T^dagger",
                qasm_names=("tdg",)),
        _rotation("rx", "X", doc="RX(a) = exp(-i a X/2)", qasm=("rx",)),
        _rotation("ry", "Y", doc="RY(a) = exp(-i a Y/2)", qasm=("ry",)),
        _rotation("rz", "Z", doc="RZ(a) = exp(-i a Z/2)", qasm=("rz",)),
        _rotation("rxx", "XX", doc="RXX(a) = exp(-i a XX/2)", qasm=("rxx",)),
        _rotation("ryy", "YY", doc="RYY(a) = exp(-i a YY/2)", qasm=("ryy",)),
        _rotation("rzz", "ZZ", doc="RZZ(a) = exp(-i a ZZ/2)", qasm=("rzz",)),
        GateDef("pauli_rotation", -1, "rotation", num_params=1, doc="exp(-i a/2 P) for a Pauli string P"),
        _clifford("ecr", 2, _R2 * np.array([[0, 1, 0, 1j], [1, 0, -1j, 0], [0, 1j, 0, 1], [-1j, 0, 1, 0]]),
                  doc="echoed cross-resonance (Qiskit's ECR: RZX(pi/4) X RZX(-pi/4) on (q0, q1))", qasm=("ecr",),
                  stim=()),
        # composites (see the module docstring): exact decompositions into the gates above
        _composite("p", 1, 1, lambda lam: [("rz", (0,), (lam,))], lambda lam: _diag(1, np.exp(1j * lam)),
                   aliases=("phase", "u1"), doc="P(l) = diag(1, e^{il}) = e^{il/2} RZ(l)", qasm=("p", "u1")),
        _composite("u", 1, 3, lambda t, p, lam: [("rz", (0,), (lam,)), ("ry", (0,), (t,)), ("rz", (0,), (p,))], _u3,
                   aliases=("u3",), doc="U(t, p, l) = e^{i(p+l)/2} RZ(p) RY(t) RZ(l)", qasm=("u", "u3", "U")),
        _composite("u2", 1, 2, lambda p, lam: [("rz", (0,), (lam,)), ("ry", (0,), (math.pi / 2,)), ("rz", (0,), (p,))],
                   lambda p, lam: _u3(math.pi / 2, p, lam), doc="U2(p, l) = U(pi/2, p, l)", qasm=("u2",)),
        _composite("r", 1, 2, lambda t, f: [("rz", (0,), (-f,)), ("rx", (0,), (t,)), ("rz", (0,), (f,))],
                   lambda t, f: math.cos(t / 2) * np.eye(2) - 1j * math.sin(t / 2) * (
                       math.cos(f) * PAULI_MATRICES["X"] + math.sin(f) * PAULI_MATRICES["Y"]),
                   doc="R(t, f) = exp(-i t/2 (cos f X + sin f Y)) = RZ(f) RX(t) RZ(-f)", qasm=("r",)),
        _composite("rzx", 2, 1, lambda t: [("pauli_rotation", (0, 1), (t,), "ZX")],
                   lambda t: rotation_matrix("ZX", t), doc="RZX(t) = exp(-i t/2 Z_0 X_1)", qasm=("rzx",)),
        _composite("cp", 2, 1, lambda lam: [("rz", (0,), (lam / 2,)), ("rz", (1,), (lam / 2,)), ("rzz", (0, 1), (-lam / 2,))],
                   lambda lam: _diag(1, 1, 1, np.exp(1j * lam)), aliases=("cphase", "cu1"),
                   doc="controlled phase diag(1, 1, 1, e^{il}) = e^{il/4} exp(-i l/4 (Z_0 + Z_1 - Z_0 Z_1))",
                   qasm=("cp", "cu1")),
        *[_composite(f"cr{a.lower()}", 2, 1, _controlled_rotation(a),
                     (lambda a: lambda t: _controlled(rotation_matrix(a, t)))(a),
                     doc=f"controlled R{a} (control, target): R{a}(t/2) on the target, then exp(+i t/4 Z_c {a}_t)",
                     qasm=(f"cr{a.lower()}",)) for a in "XYZ"],
        _composite("cu", 2, 4, _cu, lambda t, p, lam, g: _controlled(np.exp(1j * g) * _u3(t, p, lam)),
                   doc="controlled e^{ig} U(t, p, l) (Qiskit's CU)", qasm=("cu",)),
        _composite("cu3", 2, 3, _cu, lambda t, p, lam: _controlled(_u3(t, p, lam)),
                   doc="controlled U(t, p, l) (qelib1's cu3)", qasm=("cu3",)),
        _composite("ch", 2, 0, lambda: [("s", (1,), ()), ("h", (1,), ()), ("t", (1,), ()), ("cx", (0, 1), ()),
                                        ("tdg", (1,), ()), ("h", (1,), ()), ("sdg", (1,), ())],
                   _controlled(_H), doc="controlled Hadamard: S H T CX Tdg H Sdg (Qiskit's definition)", qasm=("ch",)),
        _composite("ccx", 3, 0, _ccp("X"), _cc(PAULI_MATRICES["X"]), aliases=("toffoli",),
                   doc="Toffoli (controls, target): seven commuting pi/4 Pauli rotations", qasm=("ccx",)),
        _composite("ccz", 3, 0, _ccp("Z"), _cc(PAULI_MATRICES["Z"]), doc="doubly controlled Z", qasm=("ccz",)),
        _composite("rccx", 3, 0, lambda: _RCCX_STEPS, _RCCX,
                   doc="Qiskit's RCCX: Toffoli up to a relative phase (3 CX)", qasm=("rccx",)),
        GateDef("depolarize", 1, "channel", num_params=1, kraus=_depolarize,
                doc="depolarizing: rho -> (1-p) rho + p I/2; X, Y, Z damped by 1-p"),
        GateDef("dephase", 1, "channel", num_params=1, kraus=_dephase, doc="dephasing: X, Y damped by 1-p"),
        GateDef("pauli_channel", 1, "channel", num_params=3, kraus=_pauli_kraus,
                doc="X, Y, Z errors with probabilities px, py, pz"),
        GateDef("amplitude_damp", 1, "channel", num_params=1, kraus=_amplitude_damp,
                doc="amplitude damping with decay probability gamma"),
    ]
}

ALIASES: dict[str, str] = {a: g.name for g in GATES.values() for a in (g.name, *g.aliases)}


def lookup(name: str) -> GateDef:
    """The gate record for a name or alias (case-insensitive); a clear error for unknown names."""
    key = ALIASES.get(name.lower())
    if key is None:
        raise ValueError(f"unknown gate '{name}'; known gates: {', '.join(sorted(GATES))}")
    return GATES[key]


# ---- Heisenberg action of Clifford unitaries, derived from the matrix -----------------------------
#
# A local Pauli on k qubits is coded symplectically as 2k bits: bit 2j is x_j, bit 2j+1 is z_j
# (I=00, X=01, Z=10, Y=11 per qubit, Y = i X Z so every code denotes a Hermitian Pauli).

_SYMPLECTIC_TO_LABEL = {0: "I", 1: "X", 2: "Z", 3: "Y"}


def local_label(code: int, k: int) -> str:
    return "".join(_SYMPLECTIC_TO_LABEL[(code >> (2 * j)) & 3] for j in range(k))


def clifford_action(unitary: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Heisenberg action P -> U^dagger P U of a Clifford unitary on every local Pauli code.

    Returns (image, sign): image[c] is the code of the output word and sign[c] = +-1. Raises if the
    unitary is not Clifford (some Pauli maps to a sum of Paulis).
    """
    k = int(round(math.log2(unitary.shape[0])))
    labels = [local_label(c, k) for c in range(4**k)]
    mats = [pauli_matrix(lab) for lab in labels]
    image = np.zeros(4**k, dtype=np.int32)
    sign = np.zeros(4**k, dtype=np.int32)
    for c, p in enumerate(mats):
        m = unitary.conj().T @ p @ unitary
        overlaps = np.array([np.trace(q.conj().T @ m) / 2**k for q in mats])
        j = int(np.argmax(np.abs(overlaps)))
        if not (abs(abs(overlaps[j]) - 1) < 1e-9 and abs(overlaps[j].imag) < 1e-9):
            raise ValueError("unitary is not a Clifford: a Pauli maps to a sum of Paulis")
        image[c], sign[c] = j, int(round(overlaps[j].real))
    return image, sign


def quarter_turns(angle: float, tol: float = 1e-12) -> int | None:
    """k if angle = k * pi/2 (within tol), else None: rotations at such angles are Clifford."""
    k = round(angle / (math.pi / 2))
    return int(k) if abs(angle - k * math.pi / 2) <= tol else None
