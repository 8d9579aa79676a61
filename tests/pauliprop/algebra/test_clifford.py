"""Clifford runs as one symplectic map (pauliprop/algebra/clifford.py, composed by schedule.py).

* A run's composed map sends every word P to the signed word U^dag P U of the run's dense unitary.
* The device's one-pass application (byte lookup tables) equals the numpy reference, across lane
  boundaries and on dense words.
* A Clifford-only circuit is one map: one CLIFFORD step, whatever its depth.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.algebra import clifford as K
from pauliprop.propagation import program as P
from pauliprop.propagation import schedule as S
from pauliprop.algebra import words as W

from .. import _reference as R
from .._strategies import CLIFFORD_1Q, CLIFFORD_2Q, QUARTER_TURNS, build


@st.composite
def clifford_ops(draw, n: int, length: int):
    """Clifford gates, and rotations by fixed quarter turns (two-qubit and wider generators too)."""
    ops = []
    for _ in range(length):
        fam = draw(st.sampled_from(["c1", "c2", "q"] if n >= 2 else ["c1", "q"]))
        perm = draw(st.permutations(range(n)))
        if fam == "c1":
            ops.append((draw(st.sampled_from(CLIFFORD_1Q)), perm[:1], (), None))
        elif fam == "c2":
            ops.append((draw(st.sampled_from(CLIFFORD_2Q)), perm[:2], (), None))
        else:
            k = draw(st.integers(1, min(n, 4)))
            gen = draw(st.text("XYZ", min_size=k, max_size=k))
            ops.append(("pauli_rotation", perm[:k], (draw(st.sampled_from(QUARTER_TURNS)),), gen))
    return ops


def _one_map(circuit) -> K.CliffordMap:
    sched = S.schedule(P.lower(circuit))
    if list(sched.kind) == [S.MERGE]:  # every gate lowered to nothing (rotations by multiples of 2 pi)
        return K.identity_map(1)
    assert list(sched.kind) == [S.MERGE, S.CLIFFORD] and bool(sched.dense[1]), "not a single dense map"
    return K.CliffordMap(sched.map_x[0], sched.map_z[0], sched.map_phase[0])


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_a_composed_run_conjugates_every_word_like_its_unitary(data):
    n = data.draw(st.integers(1, 3))
    c = build(n, data.draw(clifford_ops(n, data.draw(st.integers(1, 12)))))
    u = R.dense_unitary(c)
    labels = ["".join(p) for p in itertools.product("IXYZ", repeat=n)]
    x, z = W.pack([{q: ch for q, ch in enumerate(lab) if ch != "I"} for lab in labels], n)
    rx, rz, sign = K.apply_map_numpy(x, z, _one_map(c))
    for lab, out, s in zip(labels, W.labels_of(rx, rz, n), sign):
        want = u.conj().T @ R.pauli_dense(lab) @ u
        np.testing.assert_allclose(s * R.pauli_dense(out), want, atol=1e-12, err_msg=f"{lab} -> {s:+} {out}")


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_the_device_pass_equals_the_reference_across_lanes(data):
    """70 qubits (three lanes): gates placed on both sides of each lane boundary."""
    n = 70
    sites = [0, 31, 32, 63, 64, 69]
    ops = data.draw(clifford_ops(len(sites), 24))
    c = build(n, ops, site=sites)
    prog = P.lower(c)
    m = S._compose([S._clifford_element(prog, r, 3, mask) for r, mask in reversed(list(enumerate(P.row_masks(prog))))], 3)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    words = [{int(q): "XYZ"[rng.integers(3)] for q in rng.choice(sites + [5, 40], rng.integers(0, 6), replace=False)}
             for _ in range(200)]
    x, z = W.pack(words, n)
    want = K.apply_map_numpy(x, z, m)
    got = jax.jit(K.apply_map)(jnp.asarray(x), jnp.asarray(z), m.image_x, m.image_z, m.phase)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@given(st.data())
@settings(max_examples=20, deadline=None)
def test_the_byte_tables_equal_the_generator_by_generator_map_on_dense_words(data):
    """Dense random words (every qubit set at random, two lanes): the device pass, which looks each
    byte's image and phase up in a table, equals the reference that visits the generators one by one
    (the crossings between bytes included)."""
    n = 64
    ops = data.draw(clifford_ops(n, 30))
    prog = P.lower(build(n, ops))
    m = S._compose([S._clifford_element(prog, r, 2, mask) for r, mask in reversed(list(enumerate(P.row_masks(prog))))], 2)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(0, 2**32, (300, 2), dtype=np.uint32)
    z = rng.integers(0, 2**32, (300, 2), dtype=np.uint32)
    want = K.apply_map_numpy(x, z, m)
    got = jax.jit(K.apply_map)(jnp.asarray(x), jnp.asarray(z), m.image_x, m.image_z, m.phase)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_clifford_only_circuit_is_one_map_at_any_depth():
    """A 7-qubit brickwork of 1,000 Clifford gates is one CLIFFORD step, and its value is exact."""
    n = 7
    rng = np.random.default_rng(4)
    c = pp.Circuit(n)
    for _ in range(100):
        for q in range(n):
            c.append(["h", "s", "sdg", "sx"][rng.integers(4)], [q])
        for q in range(0, n - 1, 2):
            c.cx(q, q + 1)
    c.rx(0, math.pi / 2).pauli_rotation("XYZ", [1, 3, 5], -math.pi / 2)
    sched = S.schedule(P.lower(c))
    assert list(sched.kind) == [S.MERGE, S.CLIFFORD] and sched.count[1] == 1
    h = pp.PauliSum.from_labels({"ZIIXIIY": 0.7, "IXZIIII": -0.3})
    exact = float(pp.expectation(c, h, method="statevector", state="0+1-0+1"))
    assert abs(float(pp.expectation(c, h, state="0+1-0+1")) - exact) < 1e-12


@given(st.data())
@settings(max_examples=15, deadline=None)
def test_a_map_that_fixes_the_z_generators_skips_their_bytes_and_equals_the_reference(data):
    """Layers of diagonal Cliffords (CZ, S, S^dag, Z, RZZ by quarter turns) fix every Z generator:
    the device pass skips the Z bytes and still equals the generator-by-generator reference. An X
    or H among them (Z -> -Z, Z -> X) makes the pass visit every byte, with the same result; so does
    the unrolled pass (GPUs), which visits every byte."""
    n = 64
    sites = data.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=12, unique=True))
    ops = []
    for _ in range(data.draw(st.integers(1, 20))):
        fam = data.draw(st.sampled_from(["cz", "s", "sdg", "z", "rzz"]))
        a, b = data.draw(st.permutations(sites))[:2]
        if fam == "cz":
            ops.append(("cz", [a, b], (), None))
        elif fam == "rzz":
            ops.append(("rzz", [a, b], (data.draw(st.sampled_from(QUARTER_TURNS)),), None))
        else:
            ops.append((fam, [a], (), None))
    other = data.draw(st.sampled_from([None, "x", "h"]))
    if other:
        ops.insert(data.draw(st.integers(0, len(ops))), (other, [sites[0]], (), None))
    prog = P.lower(build(n, ops))
    m = S._compose([S._clifford_element(prog, r, 2, mask) for r, mask in reversed(list(enumerate(P.row_masks(prog))))], 2)
    assert bool(K.fixes_z(m.image_x, m.image_z, m.phase)) == (other is None)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(0, 2**32, (300, 2), dtype=np.uint32)
    z = rng.integers(0, 2**32, (300, 2), dtype=np.uint32)
    want = K.apply_map_numpy(x, z, m)
    unroll = data.draw(st.sampled_from([1, 4, 8, 32]))  # GPUs: 8 and 32 (propagate.map_unroll)
    got = jax.jit(K.apply_map, static_argnums=5)(jnp.asarray(x), jnp.asarray(z), m.image_x, m.image_z, m.phase,
                                                 unroll)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
