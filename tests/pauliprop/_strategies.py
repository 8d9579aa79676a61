"""Hypothesis strategies: random circuits over the whole gate table, observables, states, params.

JAX compiles the propagation scan once per (number of operations, set of operation kinds, capacity,
truncation, observable terms, lanes): random circuits are therefore built with a fixed operation
count and a fixed set of kinds. `anchored_circuit` adds one operation of each required kind and pads
with Hadamards until the lowered program has exactly the requested length (the lowering drops `id`,
identity generators and fixed rotations by multiples of 2 pi, which the random gates do produce).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.circuits import gates as G
from pauliprop.propagation import program as P

CLIFFORD_1Q = sorted(n for n, g in G.GATES.items() if g.kind == "clifford" and g.num_qubits == 1)
CLIFFORD_2Q = sorted(n for n, g in G.GATES.items() if g.kind == "clifford" and g.num_qubits == 2)
ROTATIONS_1Q = ["rx", "ry", "rz"]
ROTATIONS_2Q = ["rxx", "ryy", "rzz"]
FIXED_1Q = ["t", "tdg"]
CHANNELS = ["depolarize", "dephase", "pauli_channel", "amplitude_damp"]
QUARTER_TURNS = [math.pi / 2, -math.pi / 2, math.pi, -math.pi, 3 * math.pi / 2, 0.0, 2 * math.pi]
NUM_PARAMS = 6

# Shared shapes (one compile each): unitary circuits on up to 8 qubits, and small noisy circuits on up to
# 3 qubits (4^3 = 64 words, so SMALL_CAPACITY can never overflow).
UNITARY_OPS, UNITARY_TERMS, CAPACITY = 20, 4, 4096
UNITARY_KINDS = (P.CLIFFORD, P.ROTATION, P.QUARTER)
SMALL_OPS, SMALL_TERMS, SMALL_CAPACITY = 14, 3, 64
ALL_KINDS = (P.CLIFFORD, P.ROTATION, P.QUARTER, P.CHANNEL, P.DAMP)

# every gate of the table is reachable from the strategies below, but the composites, which the builder
# appends as the gates above (their decompositions: circuits/test_gates.py)
assert set(CLIFFORD_1Q + CLIFFORD_2Q + ROTATIONS_1Q + ROTATIONS_2Q + FIXED_1Q + CHANNELS
           + ["pauli_rotation"]) == {n for n, g in G.GATES.items() if g.kind != "composite"}


def angles(num_params: int = NUM_PARAMS):
    """Fixed floats (generic and quarter turns) and Params (plain and affine)."""
    param = st.builds(lambda k, form: [pp.Param(k), 2 * pp.Param(k) + 0.5, -pp.Param(k) / 2, 1 - pp.Param(k)][form],
                      st.integers(0, num_params - 1), st.integers(0, 3))
    return st.one_of(st.floats(-2 * math.pi, 2 * math.pi, allow_nan=False), st.sampled_from(QUARTER_TURNS), param)


probabilities = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.01, 0.99))


@st.composite
def gate(draw, n: int, noise: bool = False, num_params: int = NUM_PARAMS, max_rotation_qubits: int = 4):
    """One random (name, qubits, args, pauli) over the whole gate table."""
    families = ["c1", "r1", "f1", "pr"] + (["c2", "r2"] if n >= 2 else []) + (["ch"] if noise else [])
    fam = draw(st.sampled_from(families))
    perm = draw(st.permutations(range(n)))
    if fam == "c1":
        return draw(st.sampled_from(CLIFFORD_1Q)), perm[:1], (), None
    if fam == "c2":
        return draw(st.sampled_from(CLIFFORD_2Q)), perm[:2], (), None
    if fam == "f1":
        return draw(st.sampled_from(FIXED_1Q)), perm[:1], (), None
    if fam == "r1":
        return draw(st.sampled_from(ROTATIONS_1Q)), perm[:1], (draw(angles(num_params)),), None
    if fam == "r2":
        return draw(st.sampled_from(ROTATIONS_2Q)), perm[:2], (draw(angles(num_params)),), None
    if fam == "pr":
        k = draw(st.integers(1, min(max_rotation_qubits, n)))
        gen = draw(st.text("IXYZ", min_size=k, max_size=k))
        return "pauli_rotation", perm[:k], (draw(angles(num_params)),), gen
    name = draw(st.sampled_from(CHANNELS))
    if name == "pauli_channel":
        px, py = draw(st.floats(0, 0.5)), draw(st.floats(0, 0.5))
        args = (px, py, draw(st.floats(0, max(0.0, 1 - px - py))))
    else:
        args = (draw(probabilities),)
    return name, perm[:1], args, None


def build(n: int, ops, site=None) -> pp.Circuit:
    """A Circuit from (name, qubits, args, pauli) tuples; `site` maps small qubits into a larger register."""
    c = pp.Circuit(n)
    for name, qubits, args, pauli in ops:
        qs = [site[q] if site is not None else q for q in qubits]
        c.append(name, qs, *args, pauli=pauli)
    return c


def _anchor_ops(n, kinds, draw):
    q = draw(st.integers(0, n - 1))
    table = {P.CLIFFORD: ("h", (q,), (), None), P.ROTATION: ("rz", (q,), (pp.Param(0),), None),
             P.QUARTER: ("rx", (q,), (math.pi / 2,), None), P.CHANNEL: ("depolarize", (q,), (0.1,), None),
             P.DAMP: ("amplitude_damp", (q,), (0.2,), None)}
    return [table[k] for k in kinds]


@st.composite
def anchored_ops(draw, n: int, length: int, kinds=(P.CLIFFORD, P.ROTATION, P.QUARTER), noise: bool = False,
                 num_params: int = NUM_PARAMS):
    """Random ops whose lowered program has exactly `length` + len(kinds) rows, with every kind in `kinds`."""
    ops = [draw(gate(n, noise=noise, num_params=num_params)) for _ in range(length)]
    for a in _anchor_ops(n, kinds, draw):
        ops.insert(draw(st.integers(0, len(ops))), a)
    target = length + len(kinds)
    rows = P.lower(build(n, ops)).length
    while rows < target:
        ops.insert(draw(st.integers(0, len(ops))), ("h", (draw(st.integers(0, n - 1)),), (), None))
        rows += 1
    assert P.lower(build(n, ops)).length == target
    return ops


def params_vector(num_params: int = NUM_PARAMS):
    values = st.one_of(st.floats(-4, 4, allow_subnormal=False), st.sampled_from([0.0, math.pi / 2, -math.pi / 2, math.pi]))
    return st.lists(values, min_size=num_params, max_size=num_params).map(lambda v: np.array(v, dtype=float))


coefficients = st.one_of(st.floats(0.05, 1.0), st.floats(-1.0, -0.05))


def observable_terms(n: int, num_terms: int, distinct: bool = False):
    """{label: coeff} (distinct labels) or a list of (label, coeff) with exactly num_terms entries."""
    if distinct:
        assert num_terms <= 4**n
        if n <= 4:  # few labels: pick distinct ones directly (a uniqueness filter would keep retrying)
            labels = st.permutations(range(4**n)).map(
                lambda p: ["".join("IXYZ"[(i >> (2 * q)) & 3] for q in range(n)) for i in p[:num_terms]])
        else:
            labels = st.lists(st.text("IXYZ", min_size=n, max_size=n), min_size=num_terms, max_size=num_terms,
                              unique=True)
        return st.tuples(labels, st.lists(coefficients, min_size=num_terms, max_size=num_terms)).map(
            lambda lc: dict(zip(*lc)))
    label = st.text("IXYZ", min_size=n, max_size=n)
    return st.lists(st.tuples(label, coefficients), min_size=num_terms, max_size=num_terms)


def paulisum(terms, n: int) -> pp.PauliSum:
    return pp.PauliSum.from_list([(lab, list(range(n)), c) for lab, c in terms], n)


def states(n: int):
    """'0', '+', a bitstring, or a string over 0 1 + - r l."""
    return st.one_of(st.just("0"), st.just("+"), st.text("01", min_size=n, max_size=n),
                     st.text("01+-rl", min_size=n, max_size=n))


def bloch_vectors(n: int, mixed: bool = True):
    """(n, 3) Bloch vectors of norm <= 1 (mixed) or = 1."""
    vec = st.tuples(st.floats(-1, 1), st.floats(-1, 1), st.floats(-1, 1)).filter(lambda v: np.linalg.norm(v) > 1e-3)

    def normalise(vs, radii):
        out = np.array(vs, dtype=float)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out * np.array(radii)[:, None]

    radius = st.floats(0, 1) if mixed else st.just(1.0)
    return st.builds(normalise, st.lists(vec, min_size=n, max_size=n), st.lists(radius, min_size=n, max_size=n))


def disjoint_rotation_layer(c: pp.Circuit, rng, k: int, singles=("rx",)) -> int:
    """Append RZZ on a shuffled pairing of the qubits, then each of `singles` on every qubit in a
    shuffled order (layers on disjoint qubits whose lowest qubits come in no order: the tiled engine's
    passes), parameters Param(k), Param(k + 1), ...; returns the next parameter index."""
    n = c.num_qubits
    perm = rng.permutation(n)
    for i in range(0, n - 1, 2):
        c.rzz(int(perm[i]), int(perm[i + 1]), pp.Param(k))
        k += 1
    for q in rng.permutation(n):
        for gate in singles:
            getattr(c, gate)(int(q), pp.Param(k))
            k += 1
    return k


def commuting_rotations(c: pp.Circuit, rng, k: int, rotations: int, most_qubits: int = 3) -> int:
    """Append `rotations` rotations that commute and overlap: each qubit gets a letter, each rotation 1 to
    `most_qubits` random qubits with their letters (as the 2D Ising's ZZ couplings and the Z fields after them:
    one LAYER unit of the tiled engine, whose rotations share qubits), parameters Param(k), Param(k + 1), ...;
    returns the next parameter index."""
    n = c.num_qubits
    letters = rng.choice(list("XYZ"), size=n)
    for _ in range(rotations):
        qubits = [int(q) for q in rng.choice(n, size=int(rng.integers(1, min(most_qubits, n) + 1)), replace=False)]
        c.pauli_rotation("".join(letters[q] for q in qubits), qubits, pp.Param(k))
        k += 1
    return k
