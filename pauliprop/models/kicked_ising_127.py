"""Model circuits and observables: IBM's 127-qubit kicked Ising on the heavy-hex lattice.

The lattice is generated from its rule (rows of 14/15 qubits joined by 4 bridge qubits), and the
test suite checks it edge for edge against ../shared/data/kicked_ising/heavy_hex_127.json.
"""

from __future__ import annotations

import math

from ..algebra.paulisum import PauliSum
from ..circuits.circuit import Circuit, Param


def heavy_hex_127() -> list[tuple[int, int]]:
    """The 144 edges of IBM Eagle's 127-qubit heavy-hex coupling graph (0-indexed, sorted)."""
    rows, q = [], 0
    lengths = [14, 15, 15, 15, 15, 15, 14]
    first_col = [0, 0, 0, 0, 0, 0, 1]
    bridges = []
    for r, (length, c0) in enumerate(zip(lengths, first_col)):
        rows.append({c0 + k: q + k for k in range(length)})
        q += length
        if r < len(lengths) - 1:
            bridges.append({col: q + k for k, col in enumerate((0, 4, 8, 12) if r % 2 == 0 else (2, 6, 10, 14))})
            q += 4
    edges = set()
    for r, row in enumerate(rows):
        cols = sorted(row)
        edges |= {(row[a], row[b]) for a, b in zip(cols, cols[1:])}
        if r < len(bridges):
            for col, bq in bridges[r].items():
                edges |= {(row[col], bq), (bq, rows[r + 1][col])}
    return sorted(edges)


def kicked_ising(steps: int, theta_h, theta_j=-math.pi / 2, edges=None, num_qubits: int = 127) -> Circuit:
    """Kim et al., Nature 618, 500 (2023): per step RX(theta_h) on every qubit, then RZZ(theta_j) on every edge.

    theta_h / theta_j may be floats or Params. At theta_j = -pi/2 the RZZ gates are Clifford.
    """
    edges = heavy_hex_127() if edges is None else edges
    c = Circuit(num_qubits)
    for _ in range(steps):
        for q in range(num_qubits):
            c.rx(q, theta_h)
        for a, b in edges:
            c.rzz(a, b, theta_j)
    return c


def kicked_ising_parametrized(steps: int, edges=None, num_qubits: int = 127) -> Circuit:
    """Kicked Ising with an independent Param per gate (RX then RZZ, step by step, in order)."""
    edges = heavy_hex_127() if edges is None else edges
    c, k = Circuit(num_qubits), 0
    for _ in range(steps):
        for q in range(num_qubits):
            c.rx(q, Param(k))
            k += 1
        for a, b in edges:
            c.rzz(a, b, Param(k))
            k += 1
    return c


def magnetization(num_qubits: int = 127) -> PauliSum:
    """M_z = (1/n) sum_i Z_i."""
    return PauliSum.from_list([("Z", [q], 1.0 / num_qubits) for q in range(num_qubits)], num_qubits)


def single_z(qubit: int, num_qubits: int = 127) -> PauliSum:
    return PauliSum.from_list([("Z", [qubit], 1.0)], num_qubits)


# Published reference values (Begusic, Gray, Chan, arXiv:2308.05077, MIT licence; the full tables
# are in ../shared/data/kicked_ising), at theta_h = k*pi/32:
# exact M_z after 5 steps (their exact.csv, column 4a), and Z62 after 20 steps by their MIX and SPD
# methods (mix.csv and spd.csv, column 5b; no exact value exists), all 17 angles for Z62.
EXACT_MZ_5_STEPS = {4: 0.9048427074671951, 8: 0.45280386917341503, 12: 0.0372627785874283}
MIX_Z62_20_STEPS = {0: 1.0000145435333252, 1: 0.9955850839614868, 2: 0.9787507057189941, 3: 0.9258077144622803,
                    4: 0.8494130969047546, 5: 0.797005832195282, 6: 0.6808770298957825, 7: 0.511045515537262,
                    8: 0.2685871422290802, 9: 0.0943908616900444, 10: 0.016264472156763077,
                    11: 0.0006644048844464123, 12: 1.249899924005149e-06, 13: 1.2992994180560657e-10,
                    14: -9.515916471754368e-16, 15: -8.076651277691716e-21, 16: -0.0}
SPD_Z62_20_STEPS = {0: 1.0, 1: 0.995952, 2: 0.979519, 3: 0.926329, 4: 0.853414, 5: 0.804827, 6: 0.712703,
                    7: 0.537281, 8: 0.26453, 9: 0.084126, 10: 0.01731, 11: 0.001379, 12: 3.8e-05, 13: 0.0, 14: 0.0,
                    15: 0.0, 16: 0.0}
