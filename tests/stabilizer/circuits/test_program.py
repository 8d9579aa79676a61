"""Lowering circuits to op tables (stabilizer/circuits/program.py): the gate catalogue is the shared
gate table's, a merged lowering puts every gate on disjoint qubits between two other ops into one op
and keeps the order of gates that share a qubit, and the tableau run of a merged program equals the
unmerged one bit for bit (which the simulator and kernel tests hold to Stim)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stabilizer import Circuit
from stabilizer.circuits import program as P
from stabilizer.tableau import tableau as T


def test_catalogue_numbers_every_unitary_gate_with_its_tables():
    numbers, forward, heisenberg, signs = P.gate_catalogue()
    assert numbers[P.canonical_gate("I")] == 0  # zero-filled slots do nothing
    for stim_name in ("H", "S_DAG", "CX", "ISWAP", "C_XYZ", "SQRT_ZZ_DAG", "XCY"):
        n = P.gate_number(stim_name)
        for table, want in zip((forward, heisenberg, signs), P.gate_tables(stim_name)):
            np.testing.assert_array_equal(table[n], want)
    assert len(set(numbers.values())) == len(numbers) == forward.shape[0]


def _gate_ops(prog):
    (table,) = prog.tables()
    gate = table["kind"] == P.GATE
    return [(sorted(q for q in table["q"][i][table["active"][i]].ravel().tolist() if q != prog.spare),
             table["gate"][i][table["active"][i]].tolist()) for i in np.flatnonzero(gate)]


def test_merged_lowering_makes_one_op_a_layer_and_keeps_order_on_shared_qubits():
    text = "H 0 1\nCX 2 3\nS 4\nX 1\nM 5\nCZ 0 1\nSWAP 2 3\nH 2"
    plain, merged = P.lower(Circuit(text)), P.lower(Circuit(text), merge_gates=True)
    assert len(_gate_ops(plain)) == 7 and not plain.merged_gates
    ops = _gate_ops(merged)
    number = P.gate_number
    # H 0 1, CX 2 3, S 4 are disjoint: one op; X 1 shares qubit 1 with H: a new op, then M breaks it;
    # CZ 0 1 and SWAP 2 3 merge, H 2 shares qubit 2 with SWAP
    assert [q for q, _ in ops] == [[0, 1, 2, 3, 4], [1], [0, 1, 2, 3], [2]]
    assert ops[0][1] == [number("H"), number("H"), number("CX"), number("S")]
    assert ops[2][1] == [number("CZ"), number("SWAP")] and merged.merged_gates


@pytest.mark.parametrize("seed", range(4))
def test_merged_program_gives_the_unmerged_tableau_and_record(seed):
    """Random layers of mixed one- and two-qubit gates with measurements, resets and feedback between
    them: the merged program's final tableau and record equal the unmerged program's bit for bit."""
    rng = np.random.default_rng(seed)
    n = 37
    lines = []
    for layer in range(8):
        perm = rng.permutation(n)
        for name, group in (("CX", perm[:10]), ("ISWAP", perm[10:14]), ("SQRT_XX_DAG", perm[14:16]),
                            ("H", perm[16:22]), ("C_XYZ", perm[22:25]), ("Y", perm[25:27]), ("S", perm[:3])):
            lines.append(f"{name} " + " ".join(map(str, group)))
        if layer % 3 == 1:
            lines.append("M " + " ".join(map(str, perm[27:30])) + "\nR " + str(perm[30]))
            lines.append(f"CX rec[-1] {perm[31]}")
    circuit = Circuit("\n".join(lines))
    runs = []
    for merge in (False, True):
        prog = P.lower(circuit, merge_gates=merge)
        guesses = jnp.asarray(np.random.default_rng(seed).random(prog.num_measurements) < 0.5)
        runs.append(T.run_program(prog.structure(), P.device_tables(prog), T.identity(n + 1), guesses,
                                  jax.random.key(0), noisy=False, kernel="jax"))
        runs[-1] = runs[-1] + (sum(int(k == P.GATE) for k in prog.tables()[0]["kind"]),)
    (t1, r1, ops1), (t2, r2, ops2) = runs
    assert ops2 < ops1 / 3
    np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))
    for a, b in zip(t1, t2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_lowered_caches_each_variant_until_the_circuit_changes():
    c = Circuit("H 0\nCX 0 1")
    plain, merged = P.lowered(c), P.lowered(c, merge_gates=True)
    assert P.lowered(c) is plain and P.lowered(c, merge_gates=True) is merged and plain is not merged
    c.append("S", [1])
    assert P.lowered(c) is not plain and len(c._lowered) == 1
