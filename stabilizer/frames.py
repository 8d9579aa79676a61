"""Pauli-frame simulation of many shots at once, shots packed as bits along the word axis.

Each shot carries a Pauli frame: the difference between its noisy run and the noiseless reference
run (`reference_sample`). Gates conjugate frames (signs do not matter), noise XORs random Paulis
in, a measurement's outcome flips where its frame anticommutes with the measured observable, and
after a measurement or reset the frame takes a random copy of the new stabilizer (harmless to the
state, it makes later measurements of that qubit in another basis random, as they must be).
Outcomes are reference XOR flips; detectors and observables are parities of flips (DESIGN.md
section 5: the reference shot is not optional).

Words are uint32 of 32 shots; x and z have shape (num_qubits, words).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Frames(NamedTuple):
    x: jax.Array  # (Q, S/32) uint32: X part of each shot's frame
    z: jax.Array  # (Q, S/32) uint32


def zeros(num_qubits: int, words: int) -> Frames:
    return Frames(jnp.zeros((num_qubits, words), jnp.uint32), jnp.zeros((num_qubits, words), jnp.uint32))


def random_bits(key, shape) -> jax.Array:
    return jax.random.bits(key, shape, jnp.uint32)


def bernoulli_bits(key, p, shape) -> jax.Array:
    """Packed bits, each 1 with probability p: shape (..., words) -> uint32 words of 32 draws."""
    draws = jax.random.uniform(key, shape + (32,)) < p
    return pack(draws)


def pack(bits) -> jax.Array:
    """(..., 32) bool -> (...) uint32, draw j at bit j."""
    return jnp.sum(bits.astype(jnp.uint32) << jnp.arange(32, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)


def _literal(v, bit):
    return jnp.where(bit, v, ~v)


@partial(jax.jit, static_argnames=("arity",), donate_argnums=(0,))
def apply_gate(f: Frames, qubits, image, arity: int) -> Frames:
    """Conjugate frames by gates on disjoint qubits: qubits (k, arity); image (4**arity,) the forward
    action P -> G P G^dagger on local codes (bit 2j: x of qubit j, 2j+1: z), signs dropped.

    Bit-sliced: each output bit is the OR of the minterms of the codes whose image sets it.
    """
    bits = []
    for j in range(arity):
        bits += [f.x[qubits[:, j]], f.z[qubits[:, j]]]
    outs = [jnp.zeros_like(bits[0]) for _ in bits]
    for code in range(4**arity):
        minterm = _literal(bits[0], code & 1)
        for b in range(1, 2 * arity):
            minterm = minterm & _literal(bits[b], (code >> b) & 1)
        for b in range(2 * arity):
            outs[b] = outs[b] | jnp.where((image[code] >> b) & 1, minterm, jnp.uint32(0))
    x, z = f.x, f.z
    for j in range(arity):
        x = x.at[qubits[:, j]].set(outs[2 * j])
        z = z.at[qubits[:, j]].set(outs[2 * j + 1])
    return Frames(x, z)


@partial(jax.jit, donate_argnums=(0,))
def xor_paulis(f: Frames, qubits, x_bits, z_bits) -> Frames:
    """Multiply Paulis into the frames: qubits (k,), x_bits / z_bits (k, words) packed masks."""
    return Frames(f.x.at[qubits].set(f.x[qubits] ^ x_bits), f.z.at[qubits].set(f.z[qubits] ^ z_bits))


@partial(jax.jit, static_argnames=("reset",), donate_argnums=(0,))
def measure_product(f: Frames, qubits, px, pz, key, reset: bool = False):
    """Measure Pauli products: qubits, px, pz (k, m) give m factors each (padding factors have px =
    pz = 0). Returns (frames, flips (k, words)). Afterwards each frame takes a random multiple of the
    measured product (or, for resets of single qubits, is cleared and then randomised)."""
    fx, fz = f.x[qubits], f.z[qubits]  # (k, m, words)
    mask = lambda b: jnp.uint32(0) - b.astype(jnp.uint32)[..., None]
    anti = (fx & mask(pz)) ^ (fz & mask(px))
    flips = lax.reduce(anti, jnp.uint32(0), lax.bitwise_xor, (1,))
    r = random_bits(key, flips.shape)[:, None, :]
    if reset:
        fx, fz = jnp.zeros_like(fx), jnp.zeros_like(fz)
    fx = fx ^ (r & mask(px))
    fz = fz ^ (r & mask(pz))
    x, z = f.x, f.z
    for j in range(qubits.shape[1]):
        x = x.at[qubits[:, j]].set(fx[:, j])
        z = z.at[qubits[:, j]].set(fz[:, j])
    return Frames(x, z), flips


@partial(jax.jit, static_argnames=("shape", "num_paulis"))
def sample_paulis(key, probs, shape, num_paulis: int):
    """Independent draws of one of `num_paulis` disjoint events with probabilities `probs` (the rest:
    nothing). Returns (num_paulis, *shape) packed masks of which event happened."""
    u = jax.random.uniform(key, shape + (32,))
    edges = jnp.cumsum(probs)
    event = jnp.sum(u[..., None] >= edges, axis=-1)  # index of the event, num_paulis = none
    return jnp.stack([pack(event == e) for e in range(num_paulis)])
