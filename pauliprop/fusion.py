"""Gate fusion for the state-vector backend: runs of gates on at most k qubits become one dense
k-qubit unitary, applied to the state as one matrix product (HyQuas's TransMM step).

A state of 2^n amplitudes costs a full pass of memory per applied matrix, whatever its size up to a
few qubits, so fusing g gates into one block saves g - 1 passes. `partition` groups the gates
greedily (HyQuas's partitioner also picks k and the kernel per group by a cost model; here k is
given), and `block_matrix` multiplies a block's gates into its 2^m x 2^m unitary inside JAX, so fused
simulation stays differentiable in the parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from .circuit import Circuit


class Block(NamedTuple):
    qubits: tuple[int, ...]  # sorted; bit j of the block matrix's index is qubit qubits[j]
    gates: tuple[int, ...]  # indices into circuit.instructions, in circuit order


def partition(circuit: Circuit, k: int) -> list[Block]:
    """The circuit's gates grouped into blocks of at most k qubits (a gate wider than k is a block of
    its own). Each block is filled by scanning the gates not yet placed: a gate joins when the block
    stays within k qubits and no skipped earlier gate shares a qubit with it (gates on disjoint
    qubits commute, so it may move ahead of them). Every gate lands in exactly one block, and any two
    gates that share a qubit keep their order."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"fusion width k must be a positive int, got {k!r}")
    n = circuit.num_qubits
    remaining = list(range(len(circuit.instructions)))
    blocks = []
    while remaining:
        qubits, gates, blocked = set(), [], set()
        for i in remaining:
            touched = set(circuit.instructions[i].qubits)
            if not touched & blocked and (not gates or len(qubits | touched) <= k):
                qubits |= touched
                gates.append(i)
            else:
                blocked |= touched
                if len(blocked) == n:  # every later gate waits behind a skipped one
                    break
        placed = set(gates)
        remaining = [i for i in remaining if i not in placed]
        blocks.append(Block(tuple(sorted(qubits)), tuple(gates)))
    return blocks


def block_matrix(circuit: Circuit, block: Block, params, dtype):
    """The block's unitary (2^m x 2^m, m = len(block.qubits)): its gates applied in order to the
    identity, each on the block's local axes."""
    from .statevector import _gate_matrix, apply_matrix

    m = len(block.qubits)
    local = {q: j for j, q in enumerate(block.qubits)}
    u = jnp.eye(2**m, dtype=dtype).reshape((2,) * m + (2**m,))  # columns: the basis states
    for i in block.gates:
        ins = circuit.instructions[i]
        u = apply_matrix(u, _gate_matrix(ins, params, dtype), [local[q] for q in ins.qubits], m)
    return u.reshape(2**m, 2**m)
