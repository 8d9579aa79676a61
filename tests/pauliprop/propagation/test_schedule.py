"""Steps and units (pauliprop/propagation/schedule.py): how the lowered circuit is grouped for the loop.

* Every row of the lowered program is in exactly one step, and steps hold what they say: Clifford
  runs, rotations on pairwise disjoint qubits, channels.
* Whether a rotation is Clifford is read off the circuit, never off a parameter's value; circuits of
  one shape share their tables' shapes (one compiled program).
* A kicked-Ising step is one rotation layer and one Clifford map.
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop import models
from pauliprop.algebra.words import unpack_bits
from pauliprop.propagation import program as P
from pauliprop.propagation import schedule as S

from .._strategies import ALL_KINDS, anchored_ops, build

from pauliprop.propagation.propagate import lowered


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_every_row_is_in_one_step_of_its_kind(data):
    n = data.draw(st.integers(1, 5))
    prog = P.lower(build(n, data.draw(anchored_ops(n, data.draw(st.integers(0, 30)), ALL_KINDS, noise=True))))
    sched = S.schedule(prog)
    rows = [r for ops in sched.step_ops for r in ops]
    assert rows == list(range(prog.length - 1, -1, -1))  # backward order, each row once
    want = {P.CLIFFORD: S.CLIFFORD, P.QUARTER: S.CLIFFORD, P.ROTATION: S.LAYER, P.CHANNEL: S.CHANNEL,
            P.DAMP: S.MERGE}
    for kind, ops in zip(sched.kind, sched.step_ops):
        assert all(want[int(prog.kind[r])] == kind for r in ops)
        if kind == S.LAYER:  # pairwise disjoint supports
            acts = unpack_bits(prog.gx[list(ops)] | prog.gz[list(ops)], n)  # (rows, n): the qubits each acts on
            assert np.all(acts.sum(axis=0) <= 1)
    # maximal runs: no two neighbouring Clifford (or channel) steps
    for a, b in zip(sched.kind[:-1], sched.kind[1:]):
        assert not (a == b and a in (S.CLIFFORD, S.CHANNEL))
    # units: each row is read after one unit; per="layer" adds one truncation after each multi-rotation layer.
    # With layers=True and per="gate", units of commuting rotations (_assert_commuting_units); per="layer", a
    # multi-rotation layer is cut into runs whose lowest qubits only increase or only decrease: a run of several
    # rotations is one LAYER unit (tiled.layer_of finds its direction), a run of one a SPLIT unit, in the step's
    # order, and every row of the layer is read after its truncation
    for per in ("gate", "layer"):
        layers = [i for i, (k, c) in enumerate(zip(sched.kind, sched.count)) if k == S.LAYER and c > 1]
        span = lambda i, first=0, length=None: slice(sched.start[i] + first,
                                                     sched.start[i] + first + (sched.count[i] if length is None else length))
        runs = {i: S.monotone_runs(S.lowest_qubits(sched.rot_gx[span(i)], sched.rot_gz[span(i)])) for i in layers}
        for as_layers in (False, True):
            u = S.units(sched, per, layers=as_layers)
            assert u.unit_of_op.shape == (prog.length,) and np.all(u.unit_of_op < u.length)
            assert int(np.sum(u.kind == S.U_TRUNCATE)) == (len(layers) if per == "layer" else 0)
            several = sum(length > 1 for i in layers for _, length, _ in runs[i])
            if not (as_layers and per == "gate"):
                assert int(np.sum(u.kind == S.U_LAYER)) == (several if as_layers else 0)
            rotations = int(sum(c for k, c in zip(sched.kind, sched.count) if k == S.LAYER))
            assert int(np.sum(u.count[u.kind == S.U_LAYER]) + np.sum(u.kind == S.U_SPLIT)) == rotations
            if as_layers and per == "gate":
                _assert_commuting_units(sched, u)
                continue
            for i in (layers if as_layers else ()):
                assert sum(length for _, length, _ in runs[i]) == sched.count[i]
                if per == "layer":
                    unit = {int(u.unit_of_op[r]) for r in sched.step_ops[i]}
                    assert len(unit) == 1 and u.kind[unit.pop()] == S.U_TRUNCATE
                    continue
                seen = []
                for first, length, down in runs[i]:
                    q = S.lowest_qubits(sched.rot_gx[span(i, first, length)], sched.rot_gz[span(i, first, length)])
                    assert np.all(np.diff(q) < 0) if down else np.all(np.diff(q) > 0)
                    unit = {int(u.unit_of_op[r]) for r in sched.rot_op[span(i, first, length)]}
                    assert len(unit) == 1
                    k = unit.pop()
                    assert u.kind[k] == (S.U_LAYER if length > 1 else S.U_SPLIT) and u.count[k] == length
                    assert u.start[k] == sched.start[i] + first
                    seen.append(k)
                assert seen == sorted(set(seen))  # one unit a run, in the step's order


def _assert_commuting_units(sched, u):
    """Per-gate rules with layers: the rotation units take the rotations in order, each unit at most 32 W of them
    with the same letter on every qubit two of them share (so they commute), and maximal: a rotation unit right
    after another (no other unit between) could not have joined it."""
    rot = [k for k in range(u.length) if u.kind[k] in (S.U_LAYER, S.U_SPLIT)]
    assert [int(u.start[k]) for k in rot] == list(np.cumsum([0] + [int(u.count[k]) for k in rot])[:-1])
    for k in rot:
        first, count = int(u.start[k]), int(u.count[k])
        assert u.kind[k] == (S.U_LAYER if count > 1 else S.U_SPLIT)
        assert count <= 32 * sched.num_lanes
        x, z = sched.rot_gx[first:first + count], sched.rot_gz[first:first + count]
        for a in range(count):  # on every qubit two rotations share, the same letter
            for b in range(a):
                shared = (x[a] | z[a]) & (x[b] | z[b])
                assert not np.any(shared & ((x[a] ^ x[b]) | (z[a] ^ z[b])))
        assert all(u.unit_of_op[sched.rot_op[j]] == k for j in range(first, first + count))
        if k + 1 < u.length and k + 1 in rot:
            ux, uz = (functools.reduce(operator.or_, S.as_ints(a[first:first + count]), 0) for a in
                      (sched.rot_gx, sched.rot_gz))
            jx, jz = (S.as_ints(a[first + count:first + count + 1])[0] for a in (sched.rot_gx, sched.rot_gz))
            assert not S._joins(ux, uz, count, jx, jz, 32 * sched.num_lanes)


def test_a_kicked_ising_step_is_one_rotation_layer_and_one_map():
    """20 steps of 127 RX and 144 RZZ(-pi/2): 40 steps of the loop (plus the observable's merge),
    with the angles as Params and as fixed values other than multiples of pi/2."""
    for theta in (pp.Param(0), 0.3):
        c = models.kicked_ising(20, theta)
        sched = S.schedule(P.lower(c), backend="gpu")
        assert list(sched.kind) == [S.MERGE] + [S.CLIFFORD, S.LAYER] * 20
        assert all(sched.count[i] == 127 for i in range(2, 41, 2)) and all(sched.dense[1::2])


def test_equal_clifford_runs_are_composed_once(monkeypatch):
    """The kicked Ising repeats one RZZ(-pi/2) layer: its map is composed once for the 20 steps and
    reused by the next circuit of the sweep; another layer gets its own map; the stored map equals a
    fresh composition and cannot be written to."""
    monkeypatch.setattr(S, "_COMPOSED", {})
    first = S.schedule(P.lower(models.kicked_ising(20, 0.3)), backend="gpu")
    assert len(S._COMPOSED) == 1 and np.all(first.map_x[:20] == first.map_x[0])
    again = S.schedule(P.lower(models.kicked_ising(20, 0.5)), backend="gpu")
    assert len(S._COMPOSED) == 1 and np.array_equal(again.map_x, first.map_x)
    c = models.kicked_ising(2, 0.3)
    c.cx(0, 1)  # the last step's Clifford run now differs
    S.schedule(P.lower(c), backend="gpu")
    assert len(S._COMPOSED) == 2
    m = next(iter(S._COMPOSED.values()))  # the RZZ layer's map
    monkeypatch.setattr(S, "_COMPOSED", {})
    fresh = S.schedule(P.lower(models.kicked_ising(1, 0.3)), backend="gpu")
    assert np.array_equal(fresh.map_x[0], m.image_x) and np.array_equal(fresh.map_phase[0], m.phase)
    assert not m.image_x.flags.writeable


def test_a_params_value_never_changes_the_program():
    """RX(Param) at 0 and at pi/2 is a rotation (a fixed 0 or pi/2 is not): the same tables for
    every value, so a sweep over angles compiles once."""
    c = models.kicked_ising(3, pp.Param(0), num_qubits=6, edges=[(0, 1), (2, 3), (4, 5), (1, 2)])
    low = lowered(c, pp.Truncation(min_abs_coeff=1e-4))
    for value in (0.0, math.pi / 2, 0.3):
        again = lowered(c, pp.Truncation(min_abs_coeff=1e-4))
        assert again is low  # cached on the circuit: nothing in it depends on the value
        assert abs(float(pp.expectation(c, models.single_z(2, 6), [value])) -
                   float(pp.expectation(c, models.single_z(2, 6), [value], method="statevector"))) < 1e-10
    fixed = [S.schedule(P.lower(models.kicked_ising(3, a, num_qubits=6, edges=[(0, 1)]))) for a in (0.0, math.pi / 2)]
    assert all(S.LAYER not in list(s.kind) for s in fixed)  # fixed quarter turns are Clifford


def test_circuits_of_similar_size_share_table_shapes():
    """Tables are padded to bucketed lengths: 5 to 40 gates on up to 8 qubits give one set of shapes
    per (lanes, kinds present), so a loop over many small circuits reuses compiled programs."""
    rng = np.random.default_rng(0)
    shapes = set()
    for _ in range(30):
        n = int(rng.integers(1, 9))
        c = pp.Circuit(n)
        for _ in range(int(rng.integers(5, 41))):
            q = int(rng.integers(n))
            [lambda: c.h(q), lambda: c.rx(q, float(rng.normal())), lambda: c.t(q),
             lambda: c.cx(q, (q + 1) % n) if n > 1 else c.s(q)][rng.integers(4)]()
        tables = {**S.padded(S.schedule(P.lower(c))), **S.padded_units(S.units(S.schedule(P.lower(c))))}
        shapes.add(tuple(sorted((k, np.shape(v)) for k, v in tables.items())))
    assert len(shapes) == 1


@given(st.lists(st.integers(0, 200), unique=True, max_size=40))
def test_monotone_runs_cut_a_layer_where_its_order_turns(qubits):
    """The runs cover the sequence in order, each only increases or only decreases, and no two
    neighbouring runs could be one (each run but the last ends where the next value turns it)."""
    runs = S.monotone_runs(np.array(qubits, np.int64))
    assert sum(length for _, length, _ in runs) == len(qubits)
    at = 0
    for first, length, down in runs:
        assert first == at
        part = qubits[first:first + length]
        assert all((b < a) == down for a, b in zip(part, part[1:]))
        at += length
    for (first, length, down), (nxt, _, _) in zip(runs, runs[1:]):
        extended = qubits[first:nxt + 1]
        assert not (len(extended) > 1 and all((b < a) == (extended[1] < extended[0])
                                               for a, b in zip(extended, extended[1:])))


def test_the_map_table_pads_to_fewer_maps_where_maps_are_large(monkeypatch):
    """Property: up to 2,048 qubits (64 lanes) the dense maps' table pads to MIN_MAPS; past it, to at most
    MAPS_PADDING_BYTES of maps but at least one (10,000 qubits: 1 map of 25 MB, where 32 took 1.5 GB); a run
    whose table pads to just the maps it has stays exact."""
    assert S.min_maps(1) == S.min_maps(64) == S.MIN_MAPS
    for lanes in (65, 157, 313, 1000):
        fewest = S.min_maps(lanes)
        assert fewest < S.MIN_MAPS and (fewest == 1 or fewest * 512 * lanes ** 2 <= S.MAPS_PADDING_BYTES)
    monkeypatch.setattr(S, "MAPS_PADDING_BYTES", 0)  # every table pads to the maps it has (a power of two)
    c = pp.Circuit(5)
    for k in range(3):  # three Clifford runs between rotations: three dense maps (one lane: every run is dense)
        c.h(0).cx(0, 1).s(2).cz(2, 3).swap(3, 4).sx(1)
        c.rx(k, 0.3 + k).rzz(k, k + 1, -0.7)
    sched = S.schedule(P.lower(c))
    assert len(sched.map_x) == 3 and S.padded(sched)["map_x"].shape[0] == 4
    h = pp.PauliSum.from_list([("ZXY", [0, 2, 4], 1.0), ("X", [3], -0.5)], 5)
    assert abs(float(pp.expectation(c, h)) - float(pp.expectation(c, h, method="statevector"))) < 1e-10
