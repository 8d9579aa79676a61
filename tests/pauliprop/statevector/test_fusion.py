"""Gate fusion (pauliprop/statevector/fusion.py): a partition that places every gate once, keeps the order of any
two gates that do not commute, keeps dense blocks within k qubits and diagonal blocks diagonal;
fused simulation (swaps as relabeling included) equal to gate-by-gate simulation, gradients too; a
cost model that picks the width with the least predicted time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.statevector import simulator as SV
from pauliprop.statevector import fusion, passes
from pauliprop.statevector.fusion import is_diagonal, partition

from .._strategies import build, gate, params_vector, states


@st.composite
def circuits(draw, max_n=6, length=16):
    n = draw(st.integers(1, max_n))
    return build(n, [draw(gate(n)) for _ in range(length)]), draw(params_vector()), draw(states(n))


@settings(max_examples=30)
@given(circuits(), st.integers(1, 5), st.integers(1, 6))
def test_blocks_cover_every_gate_once_keeping_the_order_of_gates_that_do_not_commute(case, k, lookahead):
    c, _, _ = case
    ins = c.instructions
    for diagonal in (False, True):
        blocks = partition(c, k, diagonal=diagonal, lookahead=lookahead)
        order = [i for b in blocks for i in b.gates]
        assert sorted(order) == list(range(len(ins)))
        position = {g: j for j, g in enumerate(order)}
        for a in range(len(ins)):
            for b in range(a + 1, len(ins)):
                both_diagonal = diagonal and is_diagonal(ins[a]) and is_diagonal(ins[b])
                if set(ins[a].qubits) & set(ins[b].qubits) and not both_diagonal:
                    assert position[a] < position[b], (a, b)
        for b in blocks:
            touched = set().union(*(ins[i].qubits for i in b.gates))
            assert set(b.qubits) == touched and list(b.qubits) == sorted(b.qubits)
            if b.diagonal:
                assert diagonal and all(is_diagonal(ins[i]) for i in b.gates)
            else:
                assert len(b.qubits) <= k or len(b.gates) == 1  # only a gate wider than k stands alone wider


def test_diagonal_gates_are_the_ones_with_diagonal_matrices():
    for name, g in pp.GATES.items():
        if g.kind == "channel" or name == "pauli_rotation":
            continue
        c = pp.Circuit(g.num_qubits).append(name, range(g.num_qubits), *([0.7] * g.num_params))
        u = np.asarray(passes.gate_matrix(c.instructions[0], None, jnp.complex128))
        assert is_diagonal(c.instructions[0]) == bool(np.allclose(u, np.diag(np.diagonal(u)))), name
    assert is_diagonal(pp.Circuit(3).pauli_rotation("ZIZ", [0, 1, 2], 0.3).instructions[0])
    assert not is_diagonal(pp.Circuit(3).pauli_rotation("ZXZ", [0, 1, 2], 0.3).instructions[0])


@settings(max_examples=12)
@given(circuits(), st.integers(1, 5), st.integers(0, passes.MAX_ELEMENTWISE_WIDTH))
def test_fused_amplitudes_equal_gate_by_gate(case, k, elementwise_width):
    c, p, state = case
    plain = np.asarray(SV.simulate(c, p, state))
    steps = fusion.plan(c, k, elementwise_width=elementwise_width)  # GEMMs, sums of slices, or both
    fused = np.asarray(jax.jit(lambda q: SV.simulate(c, q, state, fuse=steps))(p))
    assert abs(np.vdot(plain, fused)) ** 2 > 1 - 1e-12  # fidelity, and no global phase either:
    np.testing.assert_allclose(fused, plain, atol=1e-12)


def test_fusion_shrinks_a_layered_circuit_and_keeps_its_gradient():
    c = pp.ansatz.hardware_efficient(6, 4, rotations=("ry", "rz"), entangler="cz")
    blocks = partition(c, 3)
    assert len(blocks) < len(c.instructions) / 3
    h = pp.hamiltonians.tfim(6)
    p = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, c.num_params))

    def energy(fuse):
        return lambda q: jnp.real(jnp.vdot(SV.simulate(c, q, fuse=fuse),
                                           jnp.asarray(h.to_matrix()) @ SV.simulate(c, q, fuse=fuse)))

    np.testing.assert_allclose(np.asarray(jax.grad(energy(3))(p)), np.asarray(jax.grad(energy(None))(p)), atol=1e-12)


def test_fixed_gates_fold_into_constants_so_the_trace_follows_the_passes_not_the_gates():
    rng = np.random.default_rng(3)

    def random_fixed(depth, param_every=0):
        c = pp.Circuit(4)
        for j in range(depth):
            a, b = (int(q) for q in rng.choice(4, 2, replace=False))
            angle = pp.Param(j % 3) if param_every and j % param_every == 2 else float(rng.uniform(-3, 3))
            [lambda: c.h(a), lambda: c.cx(a, b), lambda: c.rx(a, angle), lambda: c.rzz(a, b, angle), lambda: c.t(b)][j % 5]()
        return c

    def trace_size(c, p=None):
        return len(jax.make_jaxpr(lambda q: SV.simulate(c, q, fuse=4))(p).eqns)

    shallow, deep = random_fixed(20), random_fixed(400)
    assert len(partition(shallow, 4)) == len(partition(deep, 4)) == 1
    assert trace_size(deep) == trace_size(shallow)
    np.testing.assert_allclose(np.asarray(SV.simulate(deep, fuse=4)), np.asarray(SV.simulate(deep)), atol=1e-12)
    # parametrized gates stay traced (and differentiable); the fixed runs between them are one product each
    mixed = random_fixed(400, param_every=50)
    p = jnp.asarray([0.3, -1.1, 2.0])
    assert trace_size(mixed, p) < trace_size(random_fixed(400, param_every=5), p)
    np.testing.assert_allclose(np.asarray(SV.simulate(mixed, p, fuse=4)), np.asarray(SV.simulate(mixed, p)), atol=1e-12)


def test_a_bad_width_names_the_cause_before_allocating(monkeypatch):
    monkeypatch.setattr(SV, "product_state", lambda *a, **k: (_ for _ in ()).throw(AssertionError("allocated")))
    with pytest.raises(ValueError, match="fusion width k must be a positive int, got 0"):
        SV.simulate(pp.Circuit(2).h(0), fuse=0)


def test_a_qft_fuses_into_few_passes_and_its_swaps_cost_nothing():
    from qiskit.synthesis.qft import synth_qft_full

    n = 8
    c = pp.Circuit.from_qiskit(synth_qft_full(n))
    names = {i.name for i in c.instructions}
    assert "swap" in names and {"h", "rz", "rzz"} <= names
    p = fusion.plan(c, 4)
    assert not any(i.name == "swap" for i in p.circuit.instructions)
    assert sorted(p.wire_of) == list(range(n)) and p.wire_of != tuple(range(n))
    assert len(p.blocks) <= 5, [(b.qubits, b.diagonal) for b in p.blocks]
    x = np.random.default_rng(1).standard_normal(2**n) + 0j  # QFT of a basis state is a Fourier mode
    for j in (0, 5, 77):
        state = "".join("1" if j >> q & 1 else "0" for q in range(n))
        psi = np.asarray(SV.simulate(c, state=state, fuse=4))
        mode = np.exp(2j * np.pi * j * np.arange(2**n) / 2**n) / 2 ** (n / 2)
        assert abs(np.vdot(mode, psi)) > 1 - 1e-12, j


def test_diagonal_tables_multiply_to_the_blocks_diagonal():
    c = pp.Circuit(6)
    for a in range(6):
        c.rz(a, 0.1 * (a + 1))
        for b in range(a + 1, 6):
            c.rzz(a, b, 0.05 * (a + 2 * b)).cz(a, b)
    (block,) = partition(c, 2)
    assert block.diagonal
    full = np.ones(2**6, complex)
    for qubits, table in fusion.diagonal_tables(c, block, None, jnp.complex128, table_width=3):
        assert len(qubits) <= 3
        full = full * np.broadcast_to(fusion.broadcast_on(table, list(qubits), list(range(5, -1, -1))), (2,) * 6).reshape(-1)
    np.testing.assert_allclose(full, np.asarray(SV.simulate(c, state="++++++")) * 8, atol=1e-12)


def test_the_cost_model_picks_the_width_with_the_least_predicted_time():
    c = pp.ansatz.hardware_efficient(8, 3, rotations=("ry", "rz"), entangler="cx")
    flat = {w: 1.0 for w in range(1, 6)} | {"diagonal": 1.0}  # every pass costs the same: widest wins
    assert fusion.choose_width(c, flat) == 5
    steep = {w: 4.0**w for w in range(1, 6)} | {"diagonal": 1.0}  # wide passes cost more than they save:
    assert fusion.choose_width(c, steep) == 2  # the width of the widest gate (cx) wins
    measured = fusion.measure_pass_seconds(10, widths=(1, 3), repeats=2)
    assert set(measured) == {1, 3, ("in_place", 1), ("in_place", 3), ("elementwise", 1), ("elementwise", 3),
                             "diagonal", "transpose"} and all(t > 0 for t in measured.values())
    # a GEMM on the state's edge axes costs its in-place time: cheap in-place passes favour them
    edge = {w: 1.0 for w in range(1, 6)} | {("in_place", w): 0.01 for w in range(3, 6)} | {"diagonal": 1.0}
    walsh = pp.Circuit(12)
    for q in range(12):
        walsh.h(q)
    assert fusion.choose_width(walsh, edge) in (3, 4, 5)
    assert fusion.choose_width(c, measured) in (1, 3)
    np.testing.assert_allclose(np.asarray(SV.simulate(c, np.ones(c.num_params), fuse="auto")),
                               np.asarray(SV.simulate(c, np.ones(c.num_params))), atol=1e-12)

def test_the_cost_model_applies_blocks_as_sums_of_slices_up_to_the_width_where_they_stop_paying():
    timings = {w: 10.0 for w in range(1, 6)} | {("in_place", w): 2.0 for w in range(1, 6)} | {"diagonal": 1.0}
    sums = {("elementwise", 1): 1.0, ("elementwise", 2): 1.5, ("elementwise", 3): 1.9, ("elementwise", 4): 2.5}
    assert fusion.elementwise_width_from(timings) == passes.ELEMENTWISE_WIDTH  # nothing measured: the default
    assert fusion.elementwise_width_from(timings | sums) == 3  # 4 is dearer than a GEMM in place
    assert fusion.elementwise_width_from(timings | sums | {("elementwise", 2): 9.0}) == 1  # every width up to it
    c = pp.ansatz.hardware_efficient(8, 3, rotations=("ry", "rz"), entangler="cx")
    chosen = fusion.choose_plan(c, timings | sums)
    assert chosen.elementwise_width == 3
    np.testing.assert_allclose(np.asarray(SV.simulate(c, np.ones(c.num_params), fuse=chosen)),
                               np.asarray(SV.simulate(c, np.ones(c.num_params))), atol=1e-12)


def test_a_plan_of_another_circuit_is_refused():
    c = pp.Circuit(3).h(0).cx(0, 1).swap(1, 2).rz(2, 0.3)
    other = pp.Circuit(3).h(0).cx(0, 1).rz(2, 0.3)
    good = fusion.plan(c, 2)
    assert fusion.check_plan(c, good) is good
    with pytest.raises(ValueError, match="the plan is not one of this circuit"):
        SV.simulate(c, fuse=fusion.plan(other, 2))
    with pytest.raises(ValueError, match="exactly once"):
        SV.simulate(c, fuse=good._replace(blocks=good.blocks[1:]))
    with pytest.raises(ValueError, match="elementwise_width must be an int in 0..4, got 5"):
        fusion.plan(c, 2, elementwise_width=5)


def test_lookahead_finds_fuller_blocks_on_a_brickwork_and_the_cost_model_tries_it():
    c = pp.Circuit(8)
    for layer in range(8):
        for a in range(layer % 2, 7, 2):
            c.rxx(a, a + 1, 0.3 + 0.1 * a).ryy(a, a + 1, 0.2 * layer)
    assert len(partition(c, 3, lookahead=8)) < len(partition(c, 3)) == 15
    ahead = fusion.plan(c, 3, lookahead=8)
    np.testing.assert_allclose(np.asarray(SV.simulate(c, fuse=ahead)), np.asarray(SV.simulate(c)), atol=1e-12)
    per_pass = {3: 1.0, "diagonal": 1.0}  # every pass costs the same: the plan with the fewest passes wins
    assert len(fusion.choose_plan(c, per_pass).blocks) == len(ahead.blocks)
    with pytest.raises(ValueError, match="lookahead must be a positive int, got 0"):
        partition(c, 3, lookahead=0)


def test_the_cost_model_counts_the_final_transpose_when_the_layout_does_not_end_where_it_began():
    walsh = pp.Circuit(12)
    for q in range(12):
        walsh.h(q)
    # width 4 returns every axis to its place after 3 GEMMs in place (12 = 3 x 4); width 5 (two GEMMs and
    # a 2-qubit block of slices) is cheaper by its passes but does not, and pays the transpose
    timings = {w: 5.0 for w in (1, 2, 4, 5)} | {("in_place", 4): 1.0, ("in_place", 5): 0.9} | \
        {("elementwise", 1): 1.0, ("elementwise", 2): 1.0, "diagonal": 1.0}
    assert fusion.choose_width(walsh, timings | {"transpose": 0.0}) == 5
    assert fusion.choose_width(walsh, timings | {"transpose": 2.0}) == 4
