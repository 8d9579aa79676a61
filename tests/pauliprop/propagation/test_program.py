"""Lowering (pauliprop/propagation/program.py): one row per operation, the documented kinds, tables and factors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.circuits import gates as G
from pauliprop.propagation import program as P
from pauliprop.algebra import words as W

from .. import _reference as R
from .._strategies import build, gate

KIND_OF = {"clifford": P.CLIFFORD, "rotation": P.ROTATION, "quarter": P.QUARTER, "channel": P.CHANNEL,
           "damp": P.DAMP}


@settings(max_examples=40)
@given(st.integers(1, 70).flatmap(lambda n: st.tuples(st.just(n), st.lists(gate(n, noise=True), max_size=25))))
def test_one_row_per_operation_in_circuit_order(n_ops):
    """Rows follow the circuit; only identities (id, identity generators, fixed multiples of 2 pi) vanish."""
    n, ops = n_ops
    c = build(n, ops)
    prog = P.lower(c)
    kept = [ins for ins in c.instructions if R.classify(ins) != "skip"]
    assert prog.length == len(kept) and prog.num_qubits == n and prog.num_params == c.num_params
    w = W.num_lanes(n)
    assert prog.qubits.shape == (len(kept), 2) and prog.table.shape == (len(kept), 16)
    assert prog.gx.shape == prog.gz.shape == (len(kept), w)
    for row, ins in enumerate(kept):
        kind = R.classify(ins)
        assert prog.kind[row] == KIND_OF[kind]
        assert tuple(prog.qubits[row]) == (ins.qubits[0], ins.qubits[-1])
        if kind in ("rotation", "quarter"):
            gen = ins.pauli if ins.name == "pauli_rotation" else ins.gate.generator
            gx, gz = W.pack([{q: ch for q, ch in zip(ins.qubits, gen) if ch != "I"}], n)
            np.testing.assert_array_equal(prog.gx[row], gx[0])
            np.testing.assert_array_equal(prog.gz[row], gz[0])
            a = ins.gate.fixed_angle if ins.gate.fixed_angle is not None else ins.args[0]
            if isinstance(a, pp.Param):
                assert (prog.param_index[row], prog.scale[row], prog.offset[row]) == (a.index, a.scale, a.offset)
            else:
                assert prog.param_index[row] == -1
                if kind == "quarter":  # snapped to the exact multiple of pi/2
                    assert prog.offset[row] == G.quarter_turns(a) * math.pi / 2
                else:
                    assert prog.offset[row] == a
        else:
            assert prog.param_index[row] == -1
            assert not prog.gx[row].any() and not prog.gz[row].any()
        if kind == "clifford":
            table, sign = P.clifford_table(ins.gate)
            np.testing.assert_array_equal(prog.table[row], table)
            np.testing.assert_array_equal(prog.sign[row], sign)
        if kind == "damp":
            assert prog.offset[row] == ins.args[0]


def test_identities_are_dropped():
    c = (pp.Circuit(3).append("id", [0]).rx(0, 0.0).rz(1, 2 * math.pi).ry(2, -4 * math.pi)
         .pauli_rotation("II", [0, 2], 0.7).rxx(0, 1, 8 * math.pi))
    assert P.lower(c).length == 0
    c.rx(0, pp.Param(0))  # a Param is never dropped, whatever its value will be
    prog = P.lower(c)
    assert prog.length == 1 and prog.kind[0] == P.ROTATION


def test_quarter_turns_and_fixed_rotations():
    c = pp.Circuit(2).rx(0, math.pi / 2).rzz(0, 1, -math.pi / 2).ry(1, math.pi).t(0).tdg(1).rx(0, 0.3)
    c.rx(1, math.pi / 2 + 1e-9)
    prog = P.lower(c)
    assert list(prog.kind) == [P.QUARTER, P.QUARTER, P.QUARTER, P.ROTATION, P.ROTATION, P.ROTATION, P.ROTATION]
    np.testing.assert_allclose(prog.offset, [math.pi / 2, -math.pi / 2, math.pi, math.pi / 4, -math.pi / 4, 0.3,
                                             math.pi / 2 + 1e-9])


@pytest.mark.parametrize("name, args", [("depolarize", (0.3,)), ("dephase", (0.3,)), ("pauli_channel", (0.1, 0.2, 0.3)),
                                        ("pauli_channel", (0.0, 0.0, 0.0)), ("depolarize", (1.0,)),
                                        ("dephase", (1.0,))])
def test_channel_factors_are_the_kraus_heisenberg_action(name, args):
    """CHANNEL rows scale I, X, Z, Y (the symplectic code order) by sum_k K^dag P K = f_P P."""
    c = pp.Circuit(1).append(name, [0], *args)
    prog = P.lower(c)
    assert list(prog.kind) == [P.CHANNEL]
    kraus = G.GATES[name].kraus(*args)
    for code, lab in enumerate("IXZY"):
        p = R.PAULI[lab]
        np.testing.assert_allclose(sum(k.conj().T @ p @ k for k in kraus), prog.sign[0, code] * p, atol=1e-12)
    np.testing.assert_allclose(P.channel_factors(c.instructions[0]), prog.sign[0, :4])


def test_documented_channel_strengths():
    f = lambda name, *a: P.channel_factors(pp.Circuit(1).append(name, [0], *a).instructions[0])
    np.testing.assert_allclose(f("depolarize", 0.3), [1, 0.7, 0.7, 0.7])  # X, Y, Z damped by 1 - p
    np.testing.assert_allclose(f("dephase", 0.3), [1, 0.7, 1, 0.7])  # X, Y damped by 1 - p
    np.testing.assert_allclose(f("pauli_channel", 0.1, 0.2, 0.3), [1, 1 - 2 * 0.5, 1 - 2 * 0.3, 1 - 2 * 0.4])


@pytest.mark.parametrize("name", sorted(n for n, g in G.GATES.items() if g.kind == "clifford" and g.num_qubits == 2))
def test_two_qubit_tables_are_the_clifford_action(name):
    table, sign = P.clifford_table(G.GATES[name])
    image, s = G.clifford_action(G.GATES[name].matrix())
    np.testing.assert_array_equal(table, image)
    np.testing.assert_array_equal(sign, s)


def test_empty_circuit():
    prog = P.lower(pp.Circuit(40))
    assert prog.length == 0 and prog.gx.shape == (0, 2) and prog.table.shape == (0, 16)


def test_light_cone_keeps_the_rows_that_can_reach_the_observable():
    """Walking backward from the observable's qubits: a row is kept when it acts on a qubit reached so
    far, and then its qubits are reached too."""
    c = pp.Circuit(6)
    c.h(0).cx(0, 1).rx(4, 0.3)  # rows 0-2: qubit 4 is reached only after row 3 (backward: before it)
    c.cx(1, 4).rz(5, 0.2).h(3)  # rows 3-5: the observable sits on qubit 1
    prog = P.lower(c)
    assert P.light_cone(prog, 1 << 1).tolist() == [0, 1, 2, 3]
    assert P.light_cone(prog, 1 << 3).tolist() == [5]
    assert P.light_cone(prog, 0).tolist() == []
    assert P.light_cone(prog, (1 << 6) - 1).tolist() == list(range(prog.length))
    assert P.light_cone_reach(prog, 1 << 1)[1] == (1 << 0) | (1 << 1) | (1 << 4)
    assert P.light_cone_reach(prog, 1 << 3)[1] == 1 << 3


def test_renumbered_program_acts_on_the_same_qubits_under_their_new_numbers():
    """renumbered(prog, the qubits its rows act on): row for row the same operations (kinds, tables, angles), each
    acting on qubit k where the original acts on qubits[k], its generators on fewer lanes."""
    c = pp.Circuit(300)
    c.rzz(31, 290, 0.3).rx(126, pp.Param(0)).cx(0, 64).h(95).pauli_rotation("XYZ", [33, 64, 290], 0.2)
    c.depolarize(126, 0.01).s(0)
    prog = P.lower(c)
    mask = 1 << 200
    for m in P.row_masks(prog):
        mask |= m
    qubits = P.mask_qubits(mask)
    assert qubits.tolist() == [0, 31, 33, 64, 95, 126, 200, 290]
    small = P.renumbered(prog, qubits)
    assert small.num_qubits == 8 and small.gx.shape == (prog.length, 1)
    where = {int(q): k for k, q in enumerate(qubits)}
    assert P.row_masks(small) == [sum(1 << where[q] for q in range(300) if m >> q & 1) for m in P.row_masks(prog)]
    assert small.qubits.tolist() == [[where[a], where[b]] for a, b in prog.qubits.tolist()]
    for field in ("kind", "table", "sign", "param_index", "scale", "offset"):
        np.testing.assert_array_equal(getattr(small, field), getattr(prog, field))
    pauli = lambda g, x, z, q: "IXZY"[(x >> q & 1) + 2 * (z >> q & 1)]
    gen = lambda p, r, qs: "".join(pauli(None, int(p.gx[r, q // 32]), int(p.gz[r, q // 32]), q % 32) for q in qs)
    assert gen(small, 4, range(8)) == gen(prog, 4, qubits)


def test_each_rows_mask_is_the_qubits_its_operation_acts_on_across_lanes():
    """row_masks: a rotation's or quarter turn's generator's qubits, a Clifford's one or two, a channel's one,
    on both sides of 32-bit lane boundaries (qubit q is bit q of the mask)."""
    c = pp.Circuit(130)
    c.rzz(31, 32, 0.3).rx(126, 0.2).cx(0, 64).h(95).s(129).depolarize(100, 0.01).rzz(63, 127, np.pi / 2)
    masks = P.row_masks(P.lower(c))
    want = [{31, 32}, {126}, {0, 64}, {95}, {129}, {100}, {63, 127}]
    assert masks == [sum(1 << q for q in qs) for qs in want]


@settings(max_examples=20)
@given(st.integers(2, 7).flatmap(lambda n: st.tuples(st.just(n), st.lists(gate(n, noise=True), min_size=1, max_size=25),
                                                      st.text("IXYZ", min_size=n, max_size=n))))
def test_light_cone_leaves_the_estimate_unchanged(case):
    """The rows outside the light cone act as the identity on every word the observable can have there:
    the estimate, its dropped norms and its final terms are those of the whole circuit. (The terms after a
    row can differ: a row outside the cone is read after the rows applied before it, where the whole
    circuit reads it after the layer of rotations it shares with rows of the cone.)"""
    from pauliprop.propagation import propagate as PR

    n, ops, label = case
    c, h = build(n, ops), pp.PauliSum.from_labels({label: 1.0, "Z" + "I" * (n - 1): 0.5})
    params = np.linspace(0.1, 0.9, 8)
    truncation = pp.Truncation(min_abs_coeff=1e-3, max_weight=3)
    val, stats = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(PR, "observable_support", lambda obs: None)
        whole, whole_stats = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    assert abs(float(val) - float(whole)) < 1e-12
    np.testing.assert_allclose(stats.dropped_norm, whole_stats.dropped_norm, atol=1e-12)
    assert len(stats.terms) == len(whole_stats.terms) == P.lower(c).length
    assert stats.terms[:1].tolist() == whole_stats.terms[:1].tolist()
    assert int(stats.max_terms_seen) <= int(whole_stats.max_terms_seen)
