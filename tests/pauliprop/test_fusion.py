"""Gate fusion (pauliprop/fusion.py): a partition that keeps every gate once and in order within
blocks of at most k qubits, and fused simulation equal to gate-by-gate simulation, gradients too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop import statevector as SV
from pauliprop.fusion import partition

from ._strategies import build, gate, params_vector, states


@st.composite
def circuits(draw, max_n=6, length=16):
    n = draw(st.integers(1, max_n))
    return build(n, [draw(gate(n)) for _ in range(length)]), draw(params_vector()), draw(states(n))


@settings(max_examples=30)
@given(circuits(), st.integers(1, 5))
def test_blocks_cover_every_gate_once_keeping_the_order_of_gates_that_share_a_qubit(case, k):
    c, _, _ = case
    blocks = partition(c, k)
    order = [i for b in blocks for i in b.gates]
    assert sorted(order) == list(range(len(c.instructions)))
    position = {g: j for j, g in enumerate(order)}
    for a in range(len(c.instructions)):
        for b in range(a + 1, len(c.instructions)):
            if set(c.instructions[a].qubits) & set(c.instructions[b].qubits):
                assert position[a] < position[b], (a, b)
    for b in blocks:
        touched = set().union(*(c.instructions[i].qubits for i in b.gates))
        assert set(b.qubits) == touched and list(b.qubits) == sorted(b.qubits)
        assert len(b.qubits) <= k or len(b.gates) == 1  # only a gate wider than k stands alone wider


@settings(max_examples=12)
@given(circuits(), st.integers(1, 5))
def test_fused_amplitudes_equal_gate_by_gate(case, k):
    c, p, state = case
    fused = np.asarray(SV.simulate(c, p, state, fuse=k))
    plain = np.asarray(SV.simulate(c, p, state))
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


def test_a_bad_width_names_the_cause_before_allocating(monkeypatch):
    monkeypatch.setattr(SV, "initial_state", lambda *a, **k: (_ for _ in ()).throw(AssertionError("allocated")))
    with pytest.raises(ValueError, match="fusion width k must be a positive int, got 0"):
        SV.simulate(pp.Circuit(2).h(0), fuse=0)
