"""Lowering circuits to op tables (stabilizer/circuits/program.py): the gate catalogue is the shared
gate table's, a merged lowering puts every gate on disjoint qubits between two other ops into one op
and keeps the order of gates that share a qubit, and the tableau run of a merged program equals the
unmerged one bit for bit (which the simulator and kernel tests hold to Stim); cutting runs of one op
kind out as Runs keeps the ops, their order and the run bit for bit, stays within its bound, and
takes the switch out of a Run's scan."""

from __future__ import annotations

import dataclasses

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


def test_clifford_action_equals_the_shared_gate_tables():
    """The catalogue's vectorised Clifford action is gates.clifford_action, code for code and sign for sign,
    for every gate of the catalogue in both directions; a non-Clifford is refused as it refuses it."""
    from pauliprop.circuits import gates

    for name in P.gate_catalogue()[0]:
        for m in (gates.GATES[name].matrix(), gates.GATES[name].matrix().conj().T):
            for got, want in zip(P.clifford_action(m), gates.clifford_action(m)):
                np.testing.assert_array_equal(got, want, err_msg=name)
    with pytest.raises(ValueError, match="not a Clifford"):
        P.clifford_action(np.diag([1, np.exp(0.25j * np.pi)]))


def test_flat_loops_return_to_their_bodies_after_earlier_repeats():
    """A REPEAT after another REPEAT, and one nested after a repeat in its parent's body, flatten with each
    loop row sending the runner back to its own body's first row (the count of earlier rows once took a
    loop row for a table: KeyError)."""
    text = ("H 0\nREPEAT 2 {\n  S 0\n  M 0\n}\nREPEAT 3 {\n  SQRT_X 0\n  REPEAT 5 {\n    SQRT_Y 0\n  }\n"
            "  REPEAT 4 {\n    C_XYZ 0\n    M 0\n  }\n}\nM 0")
    prog = P.lower(Circuit(text))
    flat, _, _ = P.flatten(prog.structure(), prog.tables(), prog.num_qubits, prog.num_measurements)
    t = flat.table
    loops = np.flatnonzero(t["loop_level"][:flat.ops] >= 0)
    starts = {int(t["loop_count"][i]): (int(t["loop_level"][i]), int(t["gate"][t["loop_start"][i], 0])) for i in loops}
    assert starts == {2: (0, P.gate_number("S")), 3: (0, P.gate_number("SQRT_X")), 5: (1, P.gate_number("SQRT_Y")),
                      4: (1, P.gate_number("C_XYZ"))}
    assert flat.depth == 2


def test_sorted_collapses_measure_unsorted_x_and_y_targets_in_order_first():
    """With sorted_collapses an MX / MY / MRY / RX instruction whose targets are out of order gets one
    unrecorded, noiseless measurement of its sorted targets before its own (Stim's collapse order); sorted
    targets, Z bases and the default lowering get none, and the records are the same."""
    def measures(text, **kw):
        (table,) = P.lower(Circuit(text), **kw).tables()
        rows = np.flatnonzero(table["kind"] == P.MEASURE)
        return [(table["q"][i][table["active"][i]][:, 0].tolist(), int(table["advance"][i])) for i in rows]

    assert measures("MY 2 0 1", sorted_collapses=True) == [([0, 1, 2], 0), ([2, 0, 1], 3)]
    assert measures("RX 1 0", sorted_collapses=True) == [([0, 1], 0), ([1, 0], 0)]
    assert measures("MRY(0.1) 1 0 1", sorted_collapses=True) == [([0, 1], 0), ([1, 0], 2), ([1], 1)]
    assert measures("MX 0 2", sorted_collapses=True) == [([0, 2], 2)]
    assert measures("M 2 0", sorted_collapses=True) == [([2, 0], 2)]
    assert measures("MY 2 0") == [([2, 0], 2)]


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


def _mixed_circuit(rng, n: int) -> Circuit:
    """Stretches of 1 to 25 ops of one kind (gate layers that share qubits, noise ops, measurements),
    resets, feedback, E / ELSE chains and MPAD between them, and REPEAT blocks of such stretches."""
    q = lambda: int(rng.integers(n))

    def stretch():
        length = int(rng.integers(1, 26))
        pair = lambda: " ".join(map(str, rng.permutation(n)[:2]))
        return [
            [f"CX {' '.join(map(str, rng.permutation(n)[:8]))}\nH_YZ {q()}" for _ in range(length)],
            [f"DEPOLARIZE1(0.2) {q()}\nPAULI_CHANNEL_2(0.1,0,0.1,0,0,0.1,0,0,0,0,0,0,0,0.1,0.1) {pair()}"
             for _ in range(length)],
            [f"M({rng.random() * 0.2:.2f}) {'!' if rng.random() < 0.3 else ''}{q()}" for _ in range(length)],
            [f"MR {q()}\nCX rec[-1] {q()}\nE(0.3) X{q()}\nELSE_CORRELATED_ERROR(0.5) Y{q()}\nMPAD 1 0\nH {q()}"],
        ][rng.integers(4)]

    lines = []
    for _ in range(int(rng.integers(3, 7))):
        if rng.random() < 0.3:
            body = stretch() + stretch()
            lines.append(f"REPEAT {int(rng.integers(2, 4))} {{\n" + "\n".join(body) + "\nM 0\n}")
        else:
            lines += stretch()
    return Circuit("H 0 1 2 3\n" + "\n".join(lines))


def _joined(segments):
    """The segments with each stretch of tables and Runs between repeats joined into one table (as
    lists), and repeats as (count, joined body): the same for a program and its split."""
    out, tables = [], []
    for s in segments + (None,):
        if isinstance(s, (dict, P.Run)):
            tables.append(s.table if isinstance(s, P.Run) else s)
            continue
        if tables:
            out.append({k: np.concatenate([t[k] for t in tables]).tolist() for k in tables[0]})
            tables = []
        if isinstance(s, P.Repeat):
            out.append((s.count, _joined(s.body)))
    return out


def _runs(segments):
    for s in segments:
        if isinstance(s, P.Repeat):
            yield from _runs(s.body)
        elif isinstance(s, P.Run):
            yield s


@pytest.mark.parametrize("seed", range(30))
def test_split_runs_keeps_the_ops_in_order(seed):
    """The same ops in the same order; each Run is at least min_run ops of its kind, at most max_runs."""
    rng = np.random.default_rng(seed)
    prog = P.lower(_mixed_circuit(rng, 9), merge_gates=bool(seed % 2))
    min_run, max_runs = int(rng.integers(2, 8)), int(rng.integers(1, 9))
    split = P.split_runs(prog.segments, min_run, max_runs)
    assert _joined(split) == _joined(prog.segments)
    runs = list(_runs(split))
    assert 0 < len(runs) <= max_runs
    for r in runs:
        assert len(r.table["kind"]) >= min_run and (r.table["kind"] == r.kind).all()


def _layers(count: int) -> str:
    """`count` gate layers, each sharing qubit 0 with the last: `count` GATE ops in a merged lowering."""
    return "\n".join("CX 0 1\nS 2" if i % 2 else "H 0 1 2\nCX 3 4" for i in range(count))


def test_a_program_gets_at_most_max_runs_those_that_run_the_most_ops():
    """Ten runs of 17 to 26 gate layers, one of 16 in a loop run 5 times and one of 15: the loop's
    (80 ops run) and the three longest are cut out, the rest stay in their tables."""
    text = "\n".join(f"{_layers(length)}\nM 0" for length in range(17, 27))
    circuit = Circuit(text + f"\nREPEAT 5 {{\n{_layers(P.MIN_RUN)}\nM 1\n}}\n{_layers(P.MIN_RUN - 1)}")
    prog = P.lower(circuit, merge_gates=True, runs=True)
    assert P.MAX_RUNS == 4
    runs = list(_runs(prog.segments))
    assert [len(r.table["kind"]) for r in runs] == [24, 25, 26, P.MIN_RUN]
    assert {r.kind for r in runs} == {P.GATE}
    assert _joined(prog.segments) == _joined(P.lower(circuit, merge_gates=True).segments)


@pytest.mark.parametrize("seed", range(4))
def test_split_program_gives_the_unsplit_tableau_and_record(seed):
    """Random circuits of mixed op kinds with REPEAT blocks, run noiseless (even seeds) and noisy (odd):
    with Runs (of 3 ops or more, up to 6) the final tableau and record equal the unsplit program's."""
    rng = np.random.default_rng(seed)
    circuit = _mixed_circuit(rng, 9)
    prog = P.lower(circuit, merge_gates=True)
    split = dataclasses.replace(prog, segments=P.split_runs(prog.segments, min_run=3, max_runs=6))
    assert len(list(_runs(split.segments))) > 1
    guesses = jnp.asarray(rng.random(prog.num_measurements) < 0.5)
    run = lambda p: T.run_program(p.structure(), P.device_tables(p), T.identity(10), guesses, jax.random.key(seed),
                                  noisy=bool(seed % 2), kernel="jax")
    (t1, r1), (t2, r2) = run(prog), run(split)
    np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))
    for a, b in zip(t1, t2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _scans(jaxpr):
    """(length, whether a cond is inside) of every scan in a jaxpr, nested ones included."""
    def subs(eqn):
        for v in eqn.params.values():
            for x in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(x, "jaxpr", x)
                if hasattr(inner, "eqns"):
                    yield inner

    def eqns(j):
        for e in j.eqns:
            yield e
            for sub in subs(e):
                yield from eqns(sub)

    return [(e.params["length"], any(i.primitive.name == "cond" for s in subs(e) for i in eqns(s)))
            for e in eqns(jaxpr) if e.primitive.name == "scan"]


def test_a_run_of_gate_layers_scans_without_the_switch():
    """The simulator's lowering of 40 gate layers and a measurement: the layers are one scan with no
    conditional in its step (the measurement's table keeps its switch)."""
    prog = P.lowered(Circuit(_layers(40) + "\nM 0 1"), spare=8, merge_gates=True, runs=True)
    assert prog.structure() == (("run", P.GATE), "table")
    run = lambda tables: T.run_program(prog.structure(), tables, T.identity(9), jnp.zeros(2, bool),
                                       jax.random.key(0), noisy=True, kernel="jax")
    scans = _scans(jax.make_jaxpr(run)(P.device_tables(prog)).jaxpr)
    assert [s for s in scans if s[0] == 40] == [(40, False)] and (1, True) in scans
