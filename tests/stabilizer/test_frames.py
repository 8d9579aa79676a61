"""Pauli frames (stabilizer/frames.py): the bit-sliced rules equal the per-shot Pauli algebra."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stabilizer import frames as F
from stabilizer.sampler import _forward_image

from .test_tableau import STIM_GATES

stim = pytest.importorskip("stim")
_LETTER = {(0, 0): "_", (1, 0): "X", (1, 1): "Y", (0, 1): "Z"}


def _bits(words: np.ndarray) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=-1, bitorder="little")


@pytest.mark.parametrize("name", STIM_GATES)
def test_gate_conjugates_every_shot_as_stim(name):
    """Shot by shot, the new frame is G P G^dagger up to sign (stim.Tableau applied to the frame)."""
    image, arity = _forward_image(name)
    rng = np.random.default_rng(0)
    f = F.Frames(jnp.asarray(rng.integers(0, 2**32, (3, 2), dtype=np.uint32)),
                 jnp.asarray(rng.integers(0, 2**32, (3, 2), dtype=np.uint32)))
    qubits = np.array([[2, 0][:arity]], np.int32)
    before = tuple(_bits(np.asarray(a)) for a in f)
    out = F.apply_gate(F.Frames(*[a.copy() for a in f]), jnp.asarray(qubits), jnp.asarray(image), arity=arity)
    after = tuple(_bits(np.asarray(a)) for a in out)
    tab = stim.Tableau.from_named_gate(name)
    for shot in range(0, 64, 7):
        p = stim.PauliString("".join(_LETTER[(before[0][q, shot], before[1][q, shot])] for q in range(3)))
        want = p.after(tab, targets=list(qubits[0]))
        got = "".join(_LETTER[(after[0][q, shot], after[1][q, shot])] for q in range(3))
        assert str(want)[1:] == got, (name, shot)


def test_measurement_flips_are_anticommutation_and_leave_a_stabilizer():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2**32, (2, 1), dtype=np.uint32)
    z = rng.integers(0, 2**32, (2, 1), dtype=np.uint32)
    qubits = jnp.asarray([[0, 1]], jnp.int32)
    px, pz = jnp.asarray([[True, False]]), jnp.asarray([[True, True]])  # measure Y0 Z1
    f, flips = F.measure_product(F.Frames(jnp.asarray(x), jnp.asarray(z)), qubits, px, pz, jax.random.key(0))
    want = (z[0] ^ x[0]) ^ x[1]  # Y anticommutes with X and Z parts that differ; Z with X
    np.testing.assert_array_equal(np.asarray(flips)[0], want[0])
    # the frame changed only by a multiple of Y0 Z1: x0 and z0 flipped together, z1 with them, x1 fixed
    dx, dz = np.asarray(f.x) ^ x, np.asarray(f.z) ^ z
    np.testing.assert_array_equal(dx[0], dz[0])
    np.testing.assert_array_equal(dz[1], dz[0])
    assert not dx[1].any()


def test_bernoulli_bits_and_categorical_rates():
    bits = _bits(np.asarray(F.bernoulli_bits(jax.random.key(3), 0.1, (4, 64))))
    assert abs(bits.mean() - 0.1) < 5 * np.sqrt(0.09 / bits.size)
    ev = _bits(np.asarray(F.sample_paulis(jax.random.key(4), jnp.asarray([0.1, 0.2, 0.3]), (4, 64), num_paulis=3)))
    assert np.all(ev.sum(0) <= 1)  # disjoint events
    for e, p in enumerate([0.1, 0.2, 0.3]):
        assert abs(ev[e].mean() - p) < 5 * np.sqrt(p * (1 - p) / ev[e].size)


def test_pack_puts_draw_j_at_bit_j():
    draws = np.zeros((1, 32), bool)
    draws[0, [0, 5, 31]] = True
    assert int(F.pack(jnp.asarray(draws))[0]) == (1 | 1 << 5 | 1 << 31)
