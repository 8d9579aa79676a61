"""Parametrized circuits for variational loops: hardware-efficient layers and QAOA.

Each builder numbers its parameters Param(0), Param(1), ... in the order the docstring states, so
`circuit.num_params` is the length of the params vector that `pp.expectation` takes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..circuits.circuit import Circuit, Param
from .hamiltonians import Edges, checked_edges, weighted_edges

_ROTATIONS = ("rx", "ry", "rz")
_ENTANGLERS = ("cx", "cz", "rzz", "rxx", "ryy")


def hardware_efficient(num_qubits: int, layers: int, rotations: Sequence[str] = ("ry", "rz"),
                       entangler: str = "cx", edges: Edges | None = None, periodic: bool = False,
                       final_rotations: bool = True) -> Circuit:
    """`layers` times: each rotation in `rotations` on every qubit, then `entangler` on every edge
    (default a chain). final_rotations adds one more rotation block at the end.

    Parameters, in order: layer by layer, rotation kind by kind, qubit by qubit; a parametrized
    entangler (rzz, rxx, ryy) takes one parameter per edge after its layer's rotations.
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise ValueError(f"layers must be a non-negative int, got {layers!r}")
    bad = [r for r in rotations if r not in _ROTATIONS]
    if bad or not rotations:
        raise ValueError(f"rotations must be a non-empty list of {_ROTATIONS}, got {list(rotations)!r}")
    if entangler not in _ENTANGLERS:
        raise ValueError(f"entangler must be one of {_ENTANGLERS}, got {entangler!r}")
    e = checked_edges(num_qubits, edges, periodic)
    c, k = Circuit(num_qubits), 0

    def rotation_block():
        nonlocal k
        for r in rotations:
            for q in range(num_qubits):
                c.append(r, [q], Param(k))
                k += 1

    for _ in range(layers):
        rotation_block()
        for a, b in e:
            if entangler in ("cx", "cz"):
                c.append(entangler, [a, b])
            else:
                c.append(entangler, [a, b], Param(k))
                k += 1
    if final_rotations:
        rotation_block()
    return c


def qaoa(edges: Edges, layers: int, num_qubits: int | None = None, weights: Sequence[float] | None = None) -> Circuit:
    """QAOA for MaxCut (Farhi, Goldstone, Gutmann 2014): H on every qubit, then per layer l the cost
    unitary exp(-i gamma_l C) with C = `hamiltonians.maxcut(edges, ...)` and the mixer
    exp(-i beta_l sum_i X_i).

    Parameters: (gamma_0, beta_0, gamma_1, beta_1, ...). Up to a global phase, exp(-i gamma C) is
    RZZ(-gamma w) on each edge and the mixer RX(2 beta) on each qubit.
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a positive int, got {layers!r}")
    num_qubits, e, w = weighted_edges("qaoa", edges, num_qubits, weights)
    c = Circuit(num_qubits)
    for q in range(num_qubits):
        c.h(q)
    for layer in range(layers):
        gamma, beta = Param(2 * layer), Param(2 * layer + 1)
        for (a, b), wi in zip(e, w):
            c.rzz(a, b, -wi * gamma)
        for q in range(num_qubits):
            c.rx(q, 2 * beta)
    return c
