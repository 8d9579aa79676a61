"""Pauli-frame simulation of many shots at once, shots packed as bits along the word axis.

Each shot carries a Pauli frame: the difference between its noisy run and the noiseless reference
run (`reference_sample`). Gates conjugate frames (signs do not matter), noise XORs random Paulis
in, a measurement's outcome flips where its frame anticommutes with the measured observable, and
after a measurement or reset the frame takes a random copy of the new stabilizer (harmless to the
state, it makes later measurements of that qubit in another basis random, as they must be).
Outcomes are reference XOR flips; detectors and observables are parities of flips (DESIGN.md
section 5: the reference shot is not optional).

Words are uint32 of 32 shots; x and z have shape (num_qubits + 1, words) (the last row is the
lowering's spare qubit). `run_program` runs a lowered circuit (`stabilizer.program`) as one scan.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import kernels
from .program import GATE, pair_codes, run_segments


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


# ---- a lowered program (stabilizer.program) over all shots of a chunk -----------------------------

class _Carry(NamedTuple):
    f: Frames
    record: jax.Array  # (M + 1, words): flips of every measurement; the last row is scratch
    base: jax.Array  # int32: measurements recorded so far
    counter: jax.Array  # uint32: ops run so far (the random stream of op i is fold_in(key, i))
    chain: jax.Array  # (words,): shots where the current E / ELSE chain has fired


def _maybe_bernoulli(key, p, shape):
    return lax.cond(p > 0, lambda: bernoulli_bits(key, p, shape), lambda: jnp.zeros(shape, jnp.uint32))


def _op_gate(c: _Carry, row, key, kernel: str = "jax") -> _Carry:
    q0, q1 = row["q"][:, 0], row["q"][:, 1]
    if kernel != "jax":
        fwd = row["fwd"]
        one_qubit = (fwd[4] == 4) & (fwd[8] == 8) & jnp.all((fwd[:4] & 12) == 0)  # the b qubit is padding
        qubits = jnp.stack([jnp.where(row["active"], q0, -1), jnp.where(one_qubit, -1, q1)], axis=1)
        x, z = kernels.frame_gate(c.f.x, c.f.z, qubits, fwd, interpret=kernel == "interpret")
        return c._replace(f=Frames(x, z))
    bits = [c.f.x[q0], c.f.z[q0], c.f.x[q1], c.f.z[q1]]
    outs = [jnp.zeros_like(bits[0]) for _ in range(4)]
    for i in range(4):  # up to sign a Clifford is linear on the frame's bits: XOR the generators' images
        image = row["fwd"][1 << i]
        for b in range(4):
            outs[b] = outs[b] ^ jnp.where((image >> b) & 1, bits[i], jnp.uint32(0))
    x = c.f.x.at[q0].set(outs[0]).at[q1].set(outs[2])
    z = c.f.z.at[q0].set(outs[1]).at[q1].set(outs[3])
    return c._replace(f=Frames(x, z))


def _op_measure(c: _Carry, row, key) -> _Carry:
    q = row["q"][:, 0]
    k1, k2 = jax.random.split(key)
    xq, zq = c.f.x[q], c.f.z[q]
    flips = xq ^ _maybe_bernoulli(k1, row["probs"][0], xq.shape)
    scratch = c.record.shape[0] - 1
    record = c.record.at[jnp.where(row["rec"] >= 0, c.base + row["rec"], scratch)].set(flips)
    r = random_bits(k2, xq.shape)
    reset = row["reset"][:, None]
    x = c.f.x.at[q].set(jnp.where(reset, jnp.uint32(0), xq))
    z = c.f.z.at[q].set(jnp.where(reset, r, zq ^ r))
    return c._replace(f=Frames(x, z), record=record, base=c.base + row["advance"])


def _op_noise(c: _Carry, row, key) -> _Carry:
    q0, q1 = row["q"][:, 0], row["q"][:, 1]
    shape = c.f.x[q0].shape
    edges = jnp.cumsum(row["probs"])
    thresholds = jnp.minimum(jnp.round(edges * 2.0**32), 2.0**32 - 1).astype(jnp.uint32)
    thresholds = jnp.where(edges >= 1.0, jnp.uint32(2**32 - 1), thresholds)

    def sample():
        u = jax.random.bits(key, shape + (32,), jnp.uint32)
        event = jnp.sum(u[..., None] >= thresholds, axis=-1)  # 15 = nothing happened
        code = jnp.asarray(pair_codes())[event]
        return [pack(((code >> b) & 1).astype(bool)) for b in range(4)]

    def skip():
        return [jnp.zeros(shape, jnp.uint32)] * 4

    xa, za, xb, zb = lax.cond(edges[-1] > 0, sample, skip)
    active = row["active"][:, None]
    x = c.f.x.at[q0].set(c.f.x[q0] ^ xa).at[q1].set(c.f.x[q1] ^ jnp.where(active, xb, 0))
    z = c.f.z.at[q0].set(c.f.z[q0] ^ za).at[q1].set(c.f.z[q1] ^ jnp.where(active, zb, 0))
    return c._replace(f=Frames(x, z))


def _op_correlated(c: _Carry, row, key) -> _Carry:
    fire = _maybe_bernoulli(key, row["probs"][0], c.chain.shape)
    fire, chain = (jnp.where(row["is_else"], fire & ~c.chain, fire), jnp.where(row["is_else"], c.chain | fire, fire))
    return _xor_slots(c, row, jnp.broadcast_to(fire, (row["q"].shape[0],) + fire.shape))._replace(chain=chain)


def _xor_slots(c: _Carry, row, masks) -> _Carry:
    q = row["q"][:, 0]
    on = lambda flag: jnp.where((row["active"] & flag)[:, None], masks, jnp.uint32(0))
    return c._replace(f=Frames(c.f.x.at[q].set(c.f.x[q] ^ on(row["px"])), c.f.z.at[q].set(c.f.z[q] ^ on(row["pz"]))))


def _op_feedback(c: _Carry, row, key) -> _Carry:
    bits = c.record[jnp.where(row["active"], c.base - row["rec"], c.record.shape[0] - 1)]
    return _xor_slots(c, row, bits)


def _op_mpad(c: _Carry, row, key) -> _Carry:
    shape = (row["rec"].shape[0], c.record.shape[1])
    flips = _maybe_bernoulli(key, row["probs"][0], shape)
    scratch = c.record.shape[0] - 1
    record = c.record.at[jnp.where(row["rec"] >= 0, c.base + row["rec"], scratch)].set(flips)
    return c._replace(record=record, base=c.base + row["advance"])


_OPS = (_op_gate, _op_measure, _op_noise, _op_correlated, _op_feedback, _op_mpad)


@partial(jax.jit, static_argnames=("structure", "num_qubits", "num_measurements", "words", "kernel"))
def run_program(structure, tables, key, num_qubits: int, num_measurements: int, words: int, kernel: str = "auto"):
    """Frames of `32 * words` shots through a lowered program. Returns the record flips (M, words).
    kernel: "auto" (the pure-JAX rules: measured faster), "jax", "pallas" or "interpret" (tests)."""
    carry = _Carry(zeros(num_qubits + 1, words), jnp.zeros((num_measurements + 1, words), jnp.uint32),
                   jnp.zeros((), jnp.int32), jnp.zeros((), jnp.uint32), jnp.zeros(words, jnp.uint32))
    # every qubit starts freshly reset: its frame's Z part is random (harmless on |0>)
    carry = carry._replace(f=Frames(carry.f.x, random_bits(jax.random.fold_in(key, 2**32 - 1), carry.f.z.shape)))
    ops = list(_OPS)
    # the frame kernel is not the default: XLA's fused rule was 10-20% faster on the surface-code
    # benchmark (H100, 2026-11-22, experiments/results/stabilizer_surface_h100_*.json, ours-kernel)
    ops[GATE] = partial(_op_gate, kernel=kernels.kernel_mode(kernel, words, on_gpu="jax"))
    carry = run_segments(structure, tables, carry, ops, key)
    return carry.record[:num_measurements]
