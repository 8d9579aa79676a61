"""Sharded state vectors (pauliprop/statevector/sharding.py): on 1, 2 and 4 devices (forced CPU host devices, in a
subprocess, since JAX fixes its device count when it starts), sharded amplitudes and their gradients
equal the single-device simulation, fused or not, and bad meshes name the cause."""

from __future__ import annotations

import textwrap

import pytest

from .._devices import forced_devices_result

SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import pauliprop as pp
    from pauliprop.statevector import simulator as SV
    from pauliprop.statevector.sharding import qubit_mesh, simulate_sharded

    out = {"devices": len(jax.devices()), "amplitudes": [], "gradients": [], "errors": {}}
    rng = np.random.default_rng(7)
    # gates on the leading (global) qubits of every mesh, across them, and a 3-qubit Pauli rotation
    c = pp.ansatz.hardware_efficient(6, 2, rotations=("ry", "rz"), entangler="cx")
    c.h(5).cx(5, 0).rzz(4, 5, 0.3).swap(0, 5).pauli_rotation("XYZ", [5, 2, 4], 0.7).cz(3, 5)
    p = jnp.asarray(rng.uniform(-1, 1, c.num_params))
    state = "0+1-r0"
    ref = np.asarray(SV.simulate(c, p, state))
    for nd in (1, 2, 4):
        mesh = qubit_mesh(jax.devices()[:nd])
        for fuse in (None, 3):
            psi = simulate_sharded(c, p, state, fuse=fuse, mesh=mesh)
            shards = sorted((s.index[0].start or 0, int(s.device.id)) for s in psi.addressable_shards)
            out["amplitudes"].append({"devices": nd, "fuse": fuse, "error": float(np.abs(np.asarray(psi) - ref).max()),
                                      "shard_starts": [a for a, _ in shards], "shard_devices": [d for _, d in shards]})
    from qiskit.synthesis.qft import synth_qft_full  # diagonal blocks on global qubits, swaps as relabeling
    qft = pp.Circuit.from_qiskit(synth_qft_full(6))
    ref = np.asarray(SV.simulate(qft, state="1-0+11"))
    for nd in (2, 4):
        psi = simulate_sharded(qft, None, "1-0+11", fuse=3, mesh=qubit_mesh(jax.devices()[:nd]))
        out["amplitudes"].append({"devices": nd, "fuse": "qft", "error": float(np.abs(np.asarray(psi) - ref).max())})
    # a compiled program called twice, with a plan given or chosen by the cost model
    from pauliprop.statevector import fusion
    from pauliprop.statevector.sharding import sharded_program
    for fuse in (fusion.plan(qft, 3, lookahead=8), "auto"):
        program = sharded_program(qft, "1-0+11", fuse=fuse, mesh=qubit_mesh(jax.devices()[:2]))
        for _ in range(2):
            psi = program(jnp.zeros(0))
            out["amplitudes"].append({"devices": 2, "fuse": str(fuse)[:20], "error": float(np.abs(np.asarray(psi) - ref).max())})
    def all_to_alls(c, nd, fuse=None):
        program = sharded_program(c, fuse=fuse, mesh=qubit_mesh(jax.devices()[:nd]))
        return program.lower(jnp.zeros(c.num_params)).as_text().count("all_to_all")

    walsh = pp.Circuit(6)
    for q in range(6):
        walsh.h(q)
    diagonal = pp.Circuit(6).rz(5, 0.3).cz(4, 5).rzz(3, 5, 0.2).rz(4, pp.Param(0))
    out["all_to_alls"] = {"walsh_2": all_to_alls(walsh, 2), "walsh_4": all_to_alls(walsh, 4),
                          "walsh_4_fused": all_to_alls(walsh, 4, 3), "qft_2": all_to_alls(qft, 2),
                          "qft_4": all_to_alls(qft, 4), "qft_4_fused": all_to_alls(qft, 4, 3),
                          "diagonal_4": all_to_alls(diagonal, 4), "diagonal_4_fused": all_to_alls(diagonal, 4, 3)}
    h = jnp.asarray(pp.hamiltonians.tfim(6).to_matrix())
    energy = lambda f: (lambda q: jnp.real(jnp.vdot(f(q), h @ f(q))))
    g0 = np.asarray(jax.grad(energy(lambda q: SV.simulate(c, q, state)))(p))
    for nd in (2, 4):
        mesh = qubit_mesh(jax.devices()[:nd])
        g = jax.jit(jax.grad(energy(lambda q: simulate_sharded(c, q, state, fuse=3, mesh=mesh))))(p)
        out["gradients"].append({"devices": nd, "error": float(np.abs(np.asarray(g) - g0).max())})

    def error(f):
        try:
            f()
        except ValueError as e:
            return str(e)
        return None

    out["errors"]["three_devices"] = error(lambda: qubit_mesh(jax.devices()[:3]))
    out["errors"]["wide_gate"] = error(lambda: simulate_sharded(pp.Circuit(3).pauli_rotation("XYZ", [0, 1, 2], 0.2), mesh=qubit_mesh()))
    out["errors"]["too_few_qubits"] = error(lambda: simulate_sharded(pp.Circuit(1).h(0), mesh=qubit_mesh()))
    out["errors"]["no_params"] = error(lambda: simulate_sharded(pp.Circuit(4).rx(0, pp.Param(0)), mesh=qubit_mesh()))
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return forced_devices_result(SCRIPT, "test_sharding", tmp_path_factory)


def test_sharded_amplitudes_equal_the_single_device_ones_fused_or_not(result):
    assert len(result["amplitudes"]) == 12
    for row in result["amplitudes"]:
        assert row["error"] < 1e-13, row


def test_device_d_holds_the_block_of_amplitudes_whose_leading_bits_are_d(result):
    for row in [r for r in result["amplitudes"] if "shard_starts" in r]:
        nd = row["devices"]
        assert row["shard_starts"] == [d * 2**6 // nd for d in range(nd)], row
        assert row["shard_devices"] == list(range(nd)), row


def test_swaps_are_as_few_as_the_layout_allows(result):
    """The global slots start with the wires needed local last, and a swap sends away the local wire
    needed last (one no block needs again, best one that ends global); diagonal gates on global
    wires read the device's coordinate and never communicate."""
    n = result["all_to_alls"]
    # every wire needs an H, and the output's G global wires must be local for theirs and global at
    # the end: at least one exchange in and one back a global slot, and no more
    assert (n["walsh_2"], n["walsh_4"], n["walsh_4_fused"]) == (2, 4, 4), n
    # the QFT's last H is on wire 0, which its final swaps make the top bit: it starts global
    assert (n["qft_2"], n["qft_4"], n["qft_4_fused"]) == (2, 4, 4), n
    assert n["diagonal_4"] == n["diagonal_4_fused"] == 0, n


def test_gradients_through_the_all_to_all_swaps_equal_the_single_device_ones(result):
    assert [r["devices"] for r in result["gradients"]] == [2, 4]
    for row in result["gradients"]:
        assert row["error"] < 1e-12, row


def test_bad_meshes_and_circuits_name_the_cause(result):
    e = result["errors"]
    assert "power of two of devices, got 3" in e["three_devices"]
    assert "3-qubit gate or block needs 3 local qubits" in e["wide_gate"] and "leave 1" in e["wide_gate"]
    assert "1 qubits cannot be sharded over 4 devices" in e["too_few_qubits"]
    assert "parameter(s) but params is None" in e["no_params"]
