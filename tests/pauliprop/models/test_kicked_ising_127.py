"""Model circuits (pauliprop/models/kicked_ising_127.py): IBM Eagle's heavy-hex lattice and the kicked Ising circuit."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, deque

import numpy as np
import pytest

import pauliprop as pp
from pauliprop.models import kicked_ising_127 as M
from pauliprop.propagation import program as P


def test_heavy_hex_127_equals_the_reference_file(kicked_ising_dir):
    data = json.loads((kicked_ising_dir / "heavy_hex_127.json").read_text())
    assert data["num_qubits"] == 127
    assert M.heavy_hex_127() == sorted(tuple(e) for e in data["edges"])


def test_heavy_hex_127_is_a_heavy_hex_lattice():
    edges = M.heavy_hex_127()
    assert len(edges) == 144 and len(set(edges)) == 144 and edges == sorted(edges)
    assert all(0 <= a < b < 127 for a, b in edges)
    degree = Counter(q for e in edges for q in e)
    assert set(degree) == set(range(127)) and max(degree.values()) == 3
    # connected and bipartite (heavy-hex: every hexagon's edges are subdivided)
    adj = {q: [] for q in range(127)}
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    colour, todo = {0: 0}, deque([0])
    while todo:
        q = todo.popleft()
        for r in adj[q]:
            if r not in colour:
                colour[r] = 1 - colour[q]
                todo.append(r)
            assert colour[r] != colour[q]
    assert len(colour) == 127
    # degree-3 qubits only neighbour degree-2 qubits
    assert all(degree[r] <= 2 for a, b in edges for q, r in ((a, b), (b, a)) if degree[q] == 3)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_kicked_ising_builds_271_gates_per_step(steps):
    c = M.kicked_ising(steps, 0.3)
    assert c.num_qubits == 127 and len(c) == 271 * steps
    edges = M.heavy_hex_127()
    for s in range(steps):
        layer = c.instructions[271 * s: 271 * (s + 1)]
        assert [(i.name, i.qubits, i.args) for i in layer[:127]] == [("rx", (q,), (0.3,)) for q in range(127)]
        assert [(i.name, i.qubits, i.args) for i in layer[127:]] == [("rzz", e, (-math.pi / 2,)) for e in edges]
    prog = P.lower(c)  # RZZ(-pi/2) is a Clifford quarter turn; RX(0.3) a rotation
    assert Counter(prog.kind.tolist()) == {P.ROTATION: 127 * steps, P.QUARTER: 144 * steps}


def test_kicked_ising_takes_params_and_custom_lattices():
    c = M.kicked_ising(2, pp.Param(0), pp.Param(1), edges=[(0, 1), (1, 2)], num_qubits=3)
    assert len(c) == 2 * (3 + 2) and c.num_params == 2
    cp = M.kicked_ising_parametrized(3)
    assert len(cp) == 3 * 271 and cp.num_params == 3 * 271
    assert [i.args[0].index for i in cp] == list(range(3 * 271))


def test_observables():
    mz = M.magnetization(127)
    assert len(mz) == 127 and mz.to_dict() == {"I" * q + "Z" + "I" * (126 - q): 1 / 127 for q in range(127)}
    assert M.single_z(62).to_dict() == {"I" * 62 + "Z" + "I" * 64: 1.0}


@pytest.mark.parametrize("theta_h", [0.3, math.pi / 4])
def test_one_step_magnetization_is_cos_theta(theta_h):
    """After one step <Z_q> = cos(theta_h) on every qubit: the RZZ layer commutes with Z_q, and RX(theta)
    sends Z to cos(theta) Z + sin(theta) Y, whose |0> overlap is cos(theta). Checked on the lattice's first
    7 qubits with the state vector."""
    n = 7
    edges = [(a, b) for a, b in M.heavy_hex_127() if b < n]
    c = M.kicked_ising(1, pp.Param(0), edges=edges, num_qubits=n)
    val = pp.expectation(c, M.magnetization(n), np.array([theta_h]), method="statevector")
    assert abs(float(val) - math.cos(theta_h)) < 1e-12


def _csv_column(path, column):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {round(float(r["theta_h"]) / (math.pi / 32)): float(r[column]) for r in rows}


def test_published_constants_match_the_data_files(kicked_ising_dir):
    exact = _csv_column(kicked_ising_dir / "exact.csv", "4a")
    mix = _csv_column(kicked_ising_dir / "mix.csv", "5b")
    spd = _csv_column(kicked_ising_dir / "spd.csv", "5b")
    for k, v in M.EXACT_MZ_5_STEPS.items():
        assert v == pytest.approx(exact[k], abs=1e-12)
    assert M.MIX_Z62_20_STEPS.keys() == M.SPD_Z62_20_STEPS.keys() == set(range(17))
    for k, v in M.MIX_Z62_20_STEPS.items():
        assert v == pytest.approx(mix[k], abs=1e-12)
    for k, v in M.SPD_Z62_20_STEPS.items():
        assert v == pytest.approx(spd[k], abs=1e-12)
    assert exact[0] == pytest.approx(1.0, abs=1e-9)  # theta_h = 0: nothing moves


def test_five_step_magnetization_at_pi_4_matches_the_exact_value():
    """127-qubit kicked Ising, M_z after 5 steps at theta_h = pi/4: within 1e-3 of the exact value.

    min_abs_coeff 1e-5 keeps about 1.5e6 terms; the exact value is exact.csv's column 4a (kept in
    pauliprop.models.kicked_ising_127 with its source). Called as a user calls it (no capacity): on CPUs the
    native engine where its C library is built (seconds), else the tiled engine.
    """
    circuit = M.kicked_ising(5, math.pi / 4)
    val, stats = pp.expectation(circuit, M.magnetization(), truncation=pp.Truncation(min_abs_coeff=1e-5),
                                return_stats=True)
    assert not bool(stats.overflow)
    assert abs(float(val) - M.EXACT_MZ_5_STEPS[8]) < 1e-3
