"""One pass over a state's amplitudes: a gate's matrix, and a k-qubit matrix applied to a state of
shape (2,)*n as sums of slices (narrow blocks) or one tensordot (wide ones), with the axis layout
that leaves (tracked by the caller instead of transposed back).

The passes that simulator.py, fusion.py and sharding.py all run; it imports only the front end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..circuits import gates
from ..circuits.circuit import Param

ELEMENTWISE_WIDTH = 2  # default: blocks up to this width are applied as sums of slices, wider ones as a GEMM
MAX_ELEMENTWISE_WIDTH = 4  # the widest the cost model may apply as sums of slices (2^k terms per amplitude)


def _angle(a, params):
    if isinstance(a, Param):
        return a.scale * params[a.index] + a.offset
    return a


def is_fixed(ins) -> bool:
    """Whether the gate's matrix is known without params (no Param angle): fusion multiplies such
    gates into their block on the host, so they cost nothing in the trace."""
    return not any(isinstance(a, Param) for a in ins.args)


def unitary_gate(ins):
    """The instruction's gate, which must be a unitary (the state-vector backend has no channels)."""
    g = ins.gate
    if g.kind == "channel":
        raise ValueError(f"gate '{g.name}' is a noise channel: the state-vector backend simulates unitaries only")
    return g


def gate_matrix(ins, params, dtype):
    """The gate's unitary: a host (numpy, complex128) array when it is fixed, else traced in `dtype`."""
    g = unitary_gate(ins)
    if g.unitary is not None:
        return np.asarray(g.unitary, complex)
    generator = ins.generator
    if is_fixed(ins):
        return gates.rotation_matrix(generator, float(ins.args[0]))
    a = _angle(ins.args[0], params)
    p = jnp.asarray(gates.pauli_matrix(generator), dtype)
    return jnp.cos(a / 2).astype(dtype) * jnp.eye(p.shape[0], dtype=dtype) - 1j * jnp.sin(a / 2).astype(dtype) * p


def apply_matrix(psi, matrix, qubits, num_qubits):
    """Apply a k-qubit matrix (little-endian on `qubits`) to a state of shape (2,)*n (axis n-1-q = qubit q).
    On the host (numpy) when both are numpy arrays, else in JAX in psi's dtype."""
    axes = [num_qubits - 1 - q for q in qubits]
    xp = np if isinstance(psi, np.ndarray) and isinstance(matrix, np.ndarray) else jnp
    return xp.moveaxis(_contract(psi, matrix, axes), list(range(len(axes))), list(reversed(axes)))


def _contract(psi, matrix, axes):
    """tensordot of the matrix with psi's `axes` (bit j of the matrix index is axis axes[j]); the
    result has the block's axes first, most significant bit first, then psi's other axes in order.
    On the host (numpy) when both are numpy arrays."""
    k = len(axes)
    pairs = (list(range(k, 2 * k)), list(reversed(axes)))
    if isinstance(psi, np.ndarray) and isinstance(matrix, np.ndarray):
        return np.tensordot(matrix.reshape((2,) * (2 * k)), psi, axes=pairs)
    m = jnp.asarray(matrix, psi.dtype).reshape((2,) * (2 * k))  # row index bits, most significant first
    # HIGHEST: GPUs otherwise contract complex64 in TF32 (1e-4 errors)
    return jnp.tensordot(m, psi, axes=pairs, precision=jax.lax.Precision.HIGHEST)


def apply_block(psi, matrix, axes, elementwise_width: int = ELEMENTWISE_WIDTH):
    """Apply a k-qubit matrix to psi's axes `axes` (bit j of the matrix index is axis axes[j]).
    Returns (psi, moved): moved[i] is the input axis now at axis i.

    Up to `elementwise_width` qubits: each output slice is a sum of 2^k input slices, which XLA fuses
    into one element-wise pass (a dot over a few rows would be a poor GEMM plus transposes). Wider:
    one tensordot, whose result keeps the block's axes first instead of being transposed back."""
    k = len(axes)
    moved = block_layout(psi.ndim, axes, elementwise_width)
    if k > elementwise_width:
        return _contract(psi, matrix, axes), moved
    slices = {}
    for col in range(2**k):
        index = [slice(None)] * psi.ndim
        for j, a in enumerate(axes):
            index[a] = (col >> j) & 1
        slices[col] = psi[tuple(index)]
    outs = [sum(matrix[row, col] * slices[col] for col in range(2**k)) for row in range(2**k)]
    # restack: the block's axes go last (most significant bit first), then are not moved back
    return jnp.stack(outs, axis=-1).reshape(slices[0].shape + (2,) * k), moved


def block_layout(ndim: int, axes, elementwise_width: int = ELEMENTWISE_WIDTH) -> list[int]:
    """apply_block's `moved`: where each input axis goes when a block acts on `axes` (the block's
    axes, most significant bit first, go last for element-wise blocks and first for GEMMs)."""
    rest = [a for a in range(ndim) if a not in axes]
    rows = list(reversed(axes))
    return rest + rows if len(axes) <= elementwise_width else rows + rest


def gemm_in_place(ndim: int, axes) -> bool:
    """Whether a GEMM block on `axes` needs no transpose first: its axes are the leading or trailing
    ones, in the order the matrix's index reads them (axes[0], its bit 0, the most minor)."""
    k = len(axes)
    return list(reversed(axes)) in (list(range(k)), list(range(ndim - k, ndim)))
