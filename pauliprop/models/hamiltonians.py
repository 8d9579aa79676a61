"""Hamiltonians users otherwise write by hand, as PauliSums: TFIM, Heisenberg/XXZ, MaxCut, and sums
from OpenFermion-style term dictionaries.

Lattices are edge lists of (a, b) qubit pairs; `chain` gives the open or periodic 1-d chain. Signs
follow the usual physics conventions and are spelled out in each docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..algebra.paulisum import PauliSum

Edges = Sequence[tuple[int, int]]


def chain(num_qubits: int, periodic: bool = False) -> list[tuple[int, int]]:
    """Edges (i, i+1) of a 1-d chain; periodic adds (n-1, 0) when n > 2."""
    if isinstance(num_qubits, bool) or not isinstance(num_qubits, int) or num_qubits < 1:
        raise ValueError(f"num_qubits must be a positive int, got {num_qubits!r}")
    edges = [(i, i + 1) for i in range(num_qubits - 1)]
    if periodic and num_qubits > 2:
        edges.append((num_qubits - 1, 0))
    return edges


def checked_edges(num_qubits: int, edges: Edges | None, periodic: bool) -> list[tuple[int, int]]:
    """The edges as (a, b) int pairs of distinct qubits in range (a ValueError names the first bad
    one), or the chain (open or periodic) when edges is None."""
    if edges is None:
        return chain(num_qubits, periodic)
    out = []
    for i, e in enumerate(edges):
        try:
            a, b = (int(q) for q in e)
        except (TypeError, ValueError):
            raise ValueError(f"edge {i}: expected a pair of qubits, got {e!r}") from None
        if a == b:
            raise ValueError(f"edge {i}: ({a}, {b}) joins a qubit to itself")
        for q in (a, b):
            if not 0 <= q < num_qubits:
                raise ValueError(f"edge {i}: qubit {q} out of range for {num_qubits} qubits")
        out.append((a, b))
    return out


def weighted_edges(caller: str, edges: Edges, num_qubits: int | None, weights: Sequence[float] | None):
    """(num_qubits, edges, weights) of a weighted graph, checked: num_qubits defaults to 1 + the
    largest qubit, weights to 1. `caller` names the function in errors."""
    edges = list(edges)
    if num_qubits is None:
        if not edges:
            raise ValueError(f"{caller}: no edges and no num_qubits")
        num_qubits = 1 + max(max(int(a), int(b)) for a, b in edges)
    e = checked_edges(num_qubits, edges, False)
    w = [1.0] * len(e) if weights is None else [float(v) for v in weights]
    if len(w) != len(e):
        raise ValueError(f"{caller}: {len(w)} weights for {len(e)} edges")
    return num_qubits, e, w


def tfim(num_qubits: int, j: float = 1.0, h: float = 1.0, edges: Edges | None = None,
         periodic: bool = False) -> PauliSum:
    """Transverse-field Ising model H = -j sum_<a,b> Z_a Z_b - h sum_i X_i (on `edges`, default a chain).

    j = h = 1 is the critical point of the chain. PauliPropagation.jl's TFI benchmark
    (H = sum X + sum ZZ) is j = h = -1.
    """
    e = checked_edges(num_qubits, edges, periodic)
    terms = [("ZZ", [a, b], -j) for a, b in e] + [("X", [q], -h) for q in range(num_qubits)]
    return PauliSum.from_list([t for t in terms if t[2] != 0], num_qubits)


def heisenberg(num_qubits: int, jx: float = 1.0, jy: float = 1.0, jz: float = 1.0, h: float = 0.0,
               edges: Edges | None = None, periodic: bool = False) -> PauliSum:
    """Heisenberg model H = sum_<a,b> (jx X_a X_b + jy Y_a Y_b + jz Z_a Z_b) + h sum_i Z_i.

    Positive couplings are antiferromagnetic. The XXZ chain is `xxz`.
    """
    e = checked_edges(num_qubits, edges, periodic)
    terms = [(p + p, [a, b], c) for a, b in e for p, c in (("X", jx), ("Y", jy), ("Z", jz))]
    terms += [("Z", [q], h) for q in range(num_qubits)]
    return PauliSum.from_list([t for t in terms if t[2] != 0], num_qubits)


def xxz(num_qubits: int, delta: float, j: float = 1.0, h: float = 0.0, edges: Edges | None = None,
        periodic: bool = False) -> PauliSum:
    """XXZ model H = j sum_<a,b> (X_a X_b + Y_a Y_b + delta Z_a Z_b) + h sum_i Z_i."""
    return heisenberg(num_qubits, j, j, j * delta, h, edges, periodic)


def maxcut(edges: Edges, num_qubits: int | None = None, weights: Sequence[float] | None = None) -> PauliSum:
    """The cut value as an observable: C = sum_<a,b> w_ab (1 - Z_a Z_b) / 2.

    <z|C|z> is the weight of the edges that bitstring z cuts, so QAOA maximises <C> (minimise -<C>).
    num_qubits defaults to 1 + the largest qubit in `edges`; weights default to 1.
    """
    num_qubits, e, w = weighted_edges("maxcut", edges, num_qubits, weights)
    terms = [("", [], 0.5 * sum(w))] + [("ZZ", [a, b], -0.5 * wi) for (a, b), wi in zip(e, w)]
    return PauliSum.from_list(terms, num_qubits).simplify()


def from_openfermion(terms, num_qubits: int | None = None) -> PauliSum:
    """A PauliSum from OpenFermion's QubitOperator (or its `.terms` dictionary):
    {((0, "X"), (3, "Z")): 0.5, (): -1.2}. Coefficients must be real (a Hermitian operator);
    num_qubits defaults to 1 + the largest qubit."""
    terms = getattr(terms, "terms", terms)
    if not isinstance(terms, Mapping):
        raise TypeError(f"expected a QubitOperator or a dict of terms, got {type(terms).__name__}")
    items = []
    for i, (word, c) in enumerate(terms.items()):
        try:
            pairs = [(int(q), str(p).upper()) for q, p in word]
        except (TypeError, ValueError):
            raise ValueError(f"term {i}: expected ((qubit, 'X'|'Y'|'Z'), ...), got {word!r}") from None
        items.append(("".join(p for _, p in pairs), [q for q, _ in pairs], c))
    if num_qubits is None:
        qubits = [q for _, qs, _ in items for q in qs]
        num_qubits = 1 + max(qubits) if qubits else 1
    return PauliSum.from_list(items, num_qubits)
