"""Independent dense references for the tests: plain numpy, written from the documented semantics.

Nothing here calls the engine (propagate, merge, words, overlap, statevector); it only reads the gate
records (`pauliprop.circuits.gates`: matrices and Kraus operators, which test_gates.py checks against Qiskit and
closed forms) and the circuit's instruction list.

* `dense_unitary`, `density_matrix`, `dense_expectation`: Schroedinger-picture references
  (little-endian: qubit q is bit q of a basis index).
* `reference_propagate`: a dict-based Heisenberg propagator with truncation, applying the rules after
  every operation exactly as pauliprop/propagation/truncation.py, merge.py and propagate.py document them.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

from pauliprop.circuits import gates as G
from pauliprop.circuits.circuit import Param

PAULI = G.PAULI_MATRICES
LETTERS = "IXYZ"


# ---- small dense helpers -------------------------------------------------------------------------

def pauli_dense(label: str) -> np.ndarray:
    """Kronecker product, qubit 0 = rightmost factor (label character q acts on qubit q)."""
    m = np.eye(1, dtype=complex)
    for ch in label:
        m = np.kron(PAULI[ch], m)
    return m


def operator(terms: dict, n: int) -> np.ndarray:
    m = np.zeros((2**n, 2**n), dtype=complex)
    for lab, c in terms.items():
        m += c * pauli_dense(lab)
    return m


def apply_left(m: np.ndarray, gate: np.ndarray, qubits, n: int) -> np.ndarray:
    """(gate on `qubits`) @ m for m of shape (2^n, ...); gate is little-endian on its own qubits."""
    k = len(qubits)
    rest = m.shape[1:]
    t = m.reshape((2,) * n + rest)
    g = gate.reshape((2,) * (2 * k))  # axes: out bits (q_{k-1} .. q_0), in bits (q_{k-1} .. q_0)
    axes = [n - 1 - q for q in reversed(qubits)]  # tensor axis of qubit q is n-1-q
    out = np.tensordot(g, t, axes=(list(range(k, 2 * k)), axes))
    out = np.moveaxis(out, list(range(k)), axes)
    return out.reshape((2**n,) + rest)


def angle_value(a, params) -> float:
    if isinstance(a, Param):
        return a.scale * float(params[a.index]) + a.offset
    return float(a)


def gate_matrix(ins, params) -> np.ndarray:
    g = ins.gate
    if g.name == "pauli_rotation":
        return G.rotation_matrix(ins.pauli, angle_value(ins.args[0], params))
    if g.unitary is not None:
        return g.unitary
    return g.matrix(angle_value(ins.args[0], params))


def dense_unitary(circuit, params=None) -> np.ndarray:
    n = circuit.num_qubits
    u = np.eye(2**n, dtype=complex)
    for ins in circuit.instructions:
        if ins.gate.kind == "channel":
            raise ValueError("dense_unitary: noisy circuit")
        u = apply_left(u, gate_matrix(ins, params), ins.qubits, n)
    return u


KETS = {"0": np.array([1, 0]), "1": np.array([0, 1]), "+": np.array([1, 1]) / math.sqrt(2),
        "-": np.array([1, -1]) / math.sqrt(2), "r": np.array([1, 1j]) / math.sqrt(2),
        "l": np.array([1, -1j]) / math.sqrt(2)}


def state_string(state: str, n: int) -> str:
    return state * n if len(state) == 1 else state


def initial_density(state, n: int) -> np.ndarray:
    """rho = tensor product of single-qubit states (a string over 0 1 + - r l, or (n, 3) Bloch vectors)."""
    rho = np.eye(1, dtype=complex)
    if isinstance(state, str):
        for ch in state_string(state, n):
            k = KETS[ch].astype(complex)
            rho = np.kron(np.outer(k, k.conj()), rho)
    else:
        for bx, by, bz in np.asarray(state, float):
            rho = np.kron((PAULI["I"] + bx * PAULI["X"] + by * PAULI["Y"] + bz * PAULI["Z"]) / 2, rho)
    return rho


def initial_ket(state: str, n: int) -> np.ndarray:
    psi = np.ones(1, dtype=complex)
    for ch in state_string(state, n):
        psi = np.kron(KETS[ch], psi)
    return psi


def density_matrix(circuit, params=None, state="0") -> np.ndarray:
    """rho after the (possibly noisy) circuit; channels through their Kraus operators."""
    n = circuit.num_qubits
    rho = initial_density(state, n)
    for ins in circuit.instructions:
        if ins.gate.kind == "channel":
            new = np.zeros_like(rho)
            for k in ins.gate.kraus(*ins.args):
                kr = apply_left(rho, k, ins.qubits, n)
                new += apply_left(kr.conj().T, k, ins.qubits, n).conj().T
            rho = new
        else:
            u = gate_matrix(ins, params)
            rho = apply_left(apply_left(rho, u, ins.qubits, n).conj().T, u, ins.qubits, n).conj().T
    return rho


def dense_expectation(circuit, terms: dict, params=None, state="0") -> float:
    rho = density_matrix(circuit, params, state)
    return float(np.real(np.trace(rho @ operator(terms, circuit.num_qubits))))


# ---- a dict-based reference propagator with truncation ---------------------------------------------

LOCAL = {k: [''.join(p) for p in product(LETTERS, repeat=k)] for k in range(1, 5)}


def _decompose(m: np.ndarray, k: int) -> dict:
    """Pauli coefficients of a k-qubit operator (labels over the gate's own qubits), tiny ones dropped."""
    out = {}
    for lab in LOCAL[k]:
        v = np.trace(pauli_dense(lab) @ m) / 2**k
        if abs(v) > 1e-13:
            if abs(v.imag) > 1e-9:
                raise AssertionError(f"non-Hermitian image {v} on {lab}")
            out[lab] = float(v.real)
    return out


def _single_pauli(m: np.ndarray, k: int) -> tuple[str, float]:
    """An operator that must be +-1 times one Pauli: (label, exact sign)."""
    d = _decompose(m, k)
    (lab, v), = d.items()
    assert abs(abs(v) - 1) < 1e-9, (lab, v)
    return lab, float(np.sign(v))


def _with_local(label: str, qubits, local: str) -> str:
    chars = list(label)
    for q, ch in zip(qubits, local):
        chars[q] = ch
    return "".join(chars)


def weight(label: str) -> int:
    return sum(ch != "I" for ch in label)


def classify(ins) -> str:
    """The operation kind the documented lowering (pauliprop/propagation/program.py) gives an instruction."""
    g = ins.gate
    if g.kind == "clifford":
        return "skip" if g.name == "id" else "clifford"
    if g.kind == "channel":
        return "damp" if g.name == "amplitude_damp" else "channel"
    generator = ins.pauli if g.name == "pauli_rotation" else g.generator
    if set(generator) == {"I"}:
        return "skip"
    angle = g.fixed_angle if g.fixed_angle is not None else ins.args[0]
    if isinstance(angle, Param):
        return "rotation"
    k = G.quarter_turns(angle)
    if k is None:
        return "rotation"
    return "skip" if k % 4 == 0 else "quarter"


class Ambiguous(Exception):
    """A truncation decision within rounding of its threshold: the engine may decide either way."""


def reference_propagate(circuit, terms: dict, params=None, *, max_weight=None, min_abs_coeff=None,
                        max_terms=None, max_sins=None, tie_rtol=1e-9, return_counts=False):
    """Heisenberg propagation of {label: coeff} (distinct labels) with truncation after every operation.

    Semantics (pauliprop/propagation/truncation.py, merge.py, propagate.py): the observable and the output of every
    non-splitting operation (Clifford, quarter turn, Pauli channel) go through the per-term rules
    (max_weight, then min_abs_coeff); after a splitting operation (a rotation that is not a quarter
    turn, amplitude damping) the merged terms go through all rules (zero coefficients stay: they carry
    derivatives): max_weight, min_abs_coeff, max_sins (a term is charged to its first rule), then the max_terms
    largest |coeff| are kept. Merged terms take the smallest sine count of their contributors.

    Returns ({label: coeff}, {label: sins}, dropped[5]) and, with return_counts, the number of terms
    after each lowered operation in propagation order; raises Ambiguous when a decision sits within
    rounding of a threshold or a tie at the max_terms cut.
    """
    dropped = np.zeros(5)
    cur = {lab: (float(c), 0) for lab, c in terms.items()}

    def drop_rules(d, with_sins=False):
        """max_weight, then min_abs_coeff, then (after splits) max_sins: a term is charged to its first rule."""
        out = {}
        for lab, (c, s) in d.items():
            if max_weight is not None and weight(lab) > max_weight:
                dropped[0] += abs(c)
                continue
            if min_abs_coeff is not None:
                if abs(abs(c) - min_abs_coeff) <= tie_rtol * max(min_abs_coeff, 1e-300) and c != 0:
                    raise Ambiguous("coefficient at the min_abs_coeff threshold")
                if abs(c) < min_abs_coeff:
                    dropped[1] += abs(c)
                    continue
            if with_sins and max_sins is not None and s > max_sins:
                dropped[2] += abs(c)
                continue
            out[lab] = (c, s)
        return out

    def split_rules(d):
        out = drop_rules(d, with_sins=True)
        if max_terms is not None and len(out) > max_terms:
            ranked = sorted(out.items(), key=lambda kv: -abs(kv[1][0]))
            last_kept, first_cut = abs(ranked[max_terms - 1][1][0]), abs(ranked[max_terms][1][0])
            if last_kept - first_cut <= tie_rtol * last_kept and first_cut > 1e-12:
                raise Ambiguous("tie at the max_terms cut")
            for _, (c, _s) in ranked[max_terms:]:
                dropped[3] += abs(c)
            out = dict(ranked[:max_terms])
        return out

    def merge(pairs):
        d = {}
        for lab, c, s in pairs:
            if lab in d:
                c0, s0 = d[lab]
                d[lab] = (c0 + c, min(s0, s))
            else:
                d[lab] = (c, s)
        return d

    cur = drop_rules(cur)
    counts = []
    for ins in reversed(circuit.instructions):
        kind = classify(ins)
        qs = ins.qubits
        k = len(qs)
        if kind == "skip":
            continue
        if kind in ("clifford", "quarter"):
            u = gate_matrix(ins, params)
            image = {loc: _single_pauli(u.conj().T @ pauli_dense(loc) @ u, k) for loc in LOCAL[k]}
            new = {}
            for lab, (c, s) in cur.items():
                loc = "".join(lab[q] for q in qs)
                img, sign = image[loc]
                new[_with_local(lab, qs, img)] = (sign * c, s)
            cur = drop_rules(new)
        elif kind == "rotation":
            gen = ins.pauli if ins.gate.name == "pauli_rotation" else ins.gate.generator
            angle = ins.gate.fixed_angle if ins.gate.fixed_angle is not None else angle_value(ins.args[0], params)
            cos, sin = math.cos(angle), math.sin(angle)
            gm = pauli_dense(gen)
            pairs = []
            for lab, (c, s) in cur.items():
                loc = "".join(lab[q] for q in qs)
                pm = pauli_dense(loc)
                if np.allclose(gm @ pm, -pm @ gm):
                    r, sign = _single_pauli(1j * gm @ pm, k)
                    pairs += [(lab, cos * c, s), (_with_local(lab, qs, r), sin * sign * c, s + 1)]
                else:
                    pairs.append((lab, c, s))
            cur = split_rules(merge(pairs))
        elif kind == "channel":
            kraus = ins.gate.kraus(*ins.args)
            factor = {}
            for loc in "IXYZ":
                pm = PAULI[loc]
                img = sum(kk.conj().T @ pm @ kk for kk in kraus)
                d = _decompose(img, 1)
                assert set(d) <= {loc}, d  # a Pauli channel is diagonal on Paulis
                factor[loc] = d.get(loc, 0.0)
            cur = drop_rules({lab: (c * factor[lab[qs[0]]], s) for lab, (c, s) in cur.items()})
        elif kind == "damp":
            kraus = ins.gate.kraus(*ins.args)
            images = {loc: _decompose(sum(kk.conj().T @ PAULI[loc] @ kk for kk in kraus), 1) for loc in "IXYZ"}
            # Z -> (1-g) Z + g I: the I partner is a contributor (for the sine count of a merge) even at g = 0
            images["Z"].setdefault("I", 0.0)
            pairs = []
            for lab, (c, s) in cur.items():
                for loc, f in images[lab[qs[0]]].items():
                    pairs.append((_with_local(lab, qs, loc), f * c, s))
            cur = split_rules(merge(pairs))
        else:  # pragma: no cover
            raise AssertionError(kind)
        counts.append(len(cur))
    coeffs = {lab: c for lab, (c, s) in cur.items()}
    sins = {lab: s for lab, (c, s) in cur.items()}
    return (coeffs, sins, dropped, counts) if return_counts else (coeffs, sins, dropped)


def overlap_dense(terms: dict, state, n: int) -> float:
    return float(np.real(np.trace(initial_density(state, n) @ operator(terms, n)))) if terms else 0.0
