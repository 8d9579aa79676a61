"""Exact dense state-vector simulation: the reference for every estimate, and the exact method.

Amplitudes are little-endian (qubit q is bit q of the basis index). Gate matrices come from the
shared gate table. This is the small, clear reference; it unrolls gates into the trace, so it
suits circuits of up to a few hundred gates on up to ~20 qubits.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import gates as _g
from .circuit import Circuit, Param
from .overlap import bloch_vectors
from .paulisum import PauliSum
from .words import unpack_bits

MAX_QUBITS = 26


def _angle(a, params):
    if isinstance(a, Param):
        return a.scale * params[a.index] + a.offset
    return a


def _gate_matrix(ins, params, dtype):
    g = ins.gate
    if g.kind == "channel":
        raise ValueError(f"gate '{g.name}' is a noise channel: the state-vector backend simulates unitaries only")
    if g.unitary is not None:
        return jnp.asarray(g.unitary, dtype)
    generator = ins.pauli if g.name == "pauli_rotation" else g.generator
    a = _angle(ins.args[0], params)
    p = jnp.asarray(_g.pauli_matrix(generator), dtype)
    return jnp.cos(a / 2).astype(dtype) * jnp.eye(p.shape[0], dtype=dtype) - 1j * jnp.sin(a / 2).astype(dtype) * p


def apply_matrix(psi, matrix, qubits, num_qubits):
    """Apply a k-qubit matrix (little-endian on `qubits`) to a state of shape (2,)*n (axis n-1-q = qubit q)."""
    return apply_on_axes(psi, matrix, [num_qubits - 1 - q for q in qubits])


def apply_on_axes(psi, matrix, axes):
    """Apply a k-qubit matrix to the array axes `axes` of psi: bit i of the matrix index is axis
    axes[i] (other axes, trailing ones included, are untouched)."""
    k = len(axes)
    m = matrix.reshape((2,) * (2 * k))  # row index bits, most significant first: axes[k-1] ... axes[0]
    axes = list(reversed(axes))  # matrix axis j <-> axes[k-1-j]
    # HIGHEST: GPUs otherwise contract complex64 in TF32 (1e-4 errors)
    out = jnp.tensordot(m, psi, axes=(list(range(k, 2 * k)), axes), precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(out, list(range(k)), axes)


def product_kets(state, num_qubits) -> np.ndarray:
    """(n, 2) single-qubit kets of a pure product state description (row q: qubit q)."""
    bloch = bloch_vectors(state, num_qubits)
    if np.any(np.abs(np.linalg.norm(bloch, axis=1) - 1) > 1e-9):
        raise ValueError("the state-vector backend needs pure product states (Bloch vectors of norm 1)")
    kets = []
    for bx, by, bz in bloch:
        theta, phi = math.acos(max(-1.0, min(1.0, bz))), math.atan2(by, bx)
        kets.append([math.cos(theta / 2), np.exp(1j * phi) * math.sin(theta / 2)])
    return np.array(kets, dtype=complex).reshape(num_qubits, 2)


def initial_state(state, num_qubits, dtype=jnp.complex128):
    """Product state |psi> from a state description (pure states only)."""
    psi = np.ones(1, dtype=complex)
    for ket in product_kets(state, num_qubits):  # qubit q is bit q: later qubits are more significant
        psi = np.kron(ket, psi)
    return jnp.asarray(psi, dtype)


def simulate(circuit: Circuit, params=None, state="0", dtype=jnp.complex128, fuse: int | None = None):
    """The 2^n amplitudes of circuit|state> (little-endian).

    fuse: None (one pass over the state per gate), or k: runs of gates on at most k qubits are
    multiplied into one unitary first and applied in one pass (fusion.py)."""
    n = circuit.num_qubits
    if n > MAX_QUBITS:
        raise ValueError(f"{n} qubits need 2^{n} amplitudes ({16 * 2**n / 2**30:.0f} GiB at complex128); "
                         f"this reference simulator stops at {MAX_QUBITS}")
    if circuit.num_params and params is None:
        raise ValueError(f"circuit uses {circuit.num_params} parameter(s) but params is None")
    if params is not None:
        params = jnp.asarray(params)
    if fuse is not None:
        from .fusion import block_matrix, partition

        blocks = partition(circuit, fuse)  # checks fuse before allocating
    psi = initial_state(state, n, dtype).reshape((2,) * n)
    if fuse is None:
        for ins in circuit.instructions:
            psi = apply_matrix(psi, _gate_matrix(ins, params, dtype), ins.qubits, n)
    else:
        for block in blocks:
            psi = apply_matrix(psi, block_matrix(circuit, block, params, dtype), block.qubits, n)
    return psi.reshape(-1)


def sample(circuit: Circuit, shots: int, seed: int = 0, params=None, state="0", dtype=jnp.complex128) -> np.ndarray:
    """`shots` measurements of every qubit of circuit|state> in the Z basis: a (shots, n) bool array,
    column q = qubit q (Stim's layout; row k as a bitstring, character q = qubit q, is the `state`
    string that would prepare it). Reproducible: the same seed gives the same shots."""
    if isinstance(shots, bool) or not isinstance(shots, (int, np.integer)) or shots < 0:
        raise ValueError(f"shots must be a non-negative int, got {shots!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    n = circuit.num_qubits
    probs = jnp.abs(simulate(circuit, params, state, dtype)) ** 2
    index = jax.random.choice(jax.random.PRNGKey(int(seed)), probs.shape[0], (int(shots),), p=probs / jnp.sum(probs))
    return (np.asarray(index)[:, None] >> np.arange(n)) & 1 == 1


def pauli_expectations(psi, obs: PauliSum):
    """<psi|P_t|psi> for every term of obs (real), for a state of 2^n amplitudes."""
    n = obs.num_qubits
    if len(obs) == 0:  # an empty sum (words.unpack_bits cannot reshape a (0, W) array)
        return jnp.zeros(0)
    idx = np.arange(2**n)
    xb = unpack_bits(np.asarray(obs.x), n)
    zb = unpack_bits(np.asarray(obs.z), n)
    weights = 1 << np.arange(n)
    vals = []
    for xr, zr in zip(xb, zb):
        xm, zm = int(xr @ weights), int(zr @ weights)
        ny = int(np.sum(xr & zr))
        # (X^x Z^z psi)[j] = (-1)^{|(j^xm) & zm|} psi[j^xm];  P = i^{|x&z|} X^x Z^z
        src = idx ^ xm
        sign = 1 - 2 * (np.vectorize(lambda v: bin(v).count("1"))(src & zm) & 1) if zm else np.ones(len(idx))
        amp = jnp.sum(jnp.conj(psi) * jnp.asarray(sign) * psi[src])
        vals.append(jnp.real((1j**ny) * amp))
    return jnp.stack(vals) if vals else jnp.zeros(0)


def expectation(circuit: Circuit, observable: PauliSum, params=None, state="0", dtype=jnp.complex128):
    """Exact <psi|H|psi>, psi = circuit|state>, differentiable in params."""
    psi = simulate(circuit, params, state, dtype)
    coeffs = jnp.asarray(observable.coeffs)
    return jnp.sum(coeffs * pauli_expectations(psi, observable).astype(coeffs.dtype))
