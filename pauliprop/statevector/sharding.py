"""State vectors sharded over devices: the leading (global) qubits index the device, the rest live in
each device's block, and gates run on local qubits only (HyQuas section 5).

With D = 2^G devices, the mesh has G axes of size 2, one per global qubit. A gate (or fused block)
that touches a global qubit first swaps it with a local qubit it does not touch: one all-to-all on
that qubit's mesh axis, which exchanges half of every block. The swaps are planned while tracing:
the slots start with the wires needed local last (the product state is built in any layout), and a
swap sends away the local wire needed last (Belady's rule for a cache, here of local slots). Which
wire sits where, global slots and local axes alike (blocks run through passes.apply_block), is
tracked, so nothing is transposed back between gates; at the end the layout is restored (swaps, then
a local transpose) and the amplitudes come out little-endian, sharded by their leading bits. The
same code runs on one device (G = 0), on a CPU with forced host devices, and on several GPUs.
"""

from __future__ import annotations

import bisect
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from ..circuits.circuit import Circuit
from . import simulator
from .fusion import Block, Plan, apply_diagonal, block_matrix, diagonal_tables, is_diagonal, resolve_plan
from .passes import apply_block


def qubit_mesh(devices=None) -> Mesh:
    """A mesh of G axes of size 2 ("g0" the most significant qubit) over 2^G devices."""
    devices = list(jax.devices() if devices is None else devices)
    g = int(math.log2(len(devices))) if devices else -1
    if g < 0 or 2**g != len(devices):
        raise ValueError(f"sharding needs a power of two of devices, got {len(devices)}")
    return Mesh(np.array(devices).reshape((2,) * g), tuple(f"g{i}" for i in range(g)))


def simulate_sharded(circuit: Circuit, params=None, state="0", dtype=jnp.complex128, fuse=None,
                     mesh: Mesh | None = None):
    """circuit|state> as 2^n amplitudes (little-endian) sharded over `mesh` (default: all devices)
    by their leading G bits. fuse: as in statevector.simulate (None: one step per gate; k; "auto";
    a fusion.Plan). Equal to the single-device simulate; compiled as one program (jit) per call:
    `sharded_program` gives the compiled function of params, to call repeatedly."""
    program = sharded_program(circuit, state, dtype, fuse, mesh)
    simulator.require_params(circuit, params)
    return program(jnp.zeros(0) if params is None else jnp.asarray(params))


def sharded_program(circuit: Circuit, state="0", dtype=jnp.complex128, fuse=None, mesh: Mesh | None = None):
    """simulate_sharded as a jitted function of params, checked and planned once."""
    mesh = mesh or qubit_mesh()
    G, n = len(mesh.axis_names), circuit.num_qubits
    L = n - G
    if L < 0:
        raise ValueError(f"{n} qubits cannot be sharded over {2**G} devices: at most 2^{n} devices")
    simulator.check_size(n, dtype, devices=2**G)
    if fuse is None:  # every gate a block of its own, swaps included; diagonal ones need no wire local
        steps = Plan(circuit, [Block(tuple(sorted(i.qubits)), (g,), is_diagonal(i))
                               for g, i in enumerate(circuit.instructions)], tuple(range(n)))
    else:
        steps = resolve_plan(circuit, fuse, dtype, max_width=L)  # "auto": blocks must fit the local qubits
    widest = max((len(b.qubits) for b in steps.blocks if not b.diagonal), default=0)
    if widest > L:
        raise ValueError(f"a {widest}-qubit gate or block needs {widest} local qubits, but {n} qubits over "
                         f"{2**G} devices leave {L}: use fewer devices or a smaller fuse width")
    kets = simulator.product_kets(state, n)
    dense_uses = {}  # wire -> indices of the dense blocks that need it local, in order
    for b, block in enumerate(steps.blocks):
        for w in () if block.diagonal else block.qubits:
            dense_uses.setdefault(w, []).append(b)
    end_slot = {steps.wire_of[n - 1 - i]: i for i in range(G)}  # the wires the output keeps global

    def global_rank(wire, now):
        """How well a wire suits a global slot from block `now` on (the largest rank): one no dense
        block needs again, best one that ends global (the restore then leaves it); else the one
        needed last (Belady's rule: the fewest swaps)."""
        uses = dense_uses.get(wire, [])
        i = bisect.bisect_left(uses, now)
        unused = i == len(uses)
        return (unused, unused and wire in end_slot, 0 if unused else uses[i])

    # the product state can start with any wires global: those a swap would send away first, each
    # that ends global in its own slot (ties keep the leading wires global)
    start = sorted(range(n), key=lambda w: (*global_rank(w, 0), w), reverse=True)[:G]
    first_glob = [None] * G
    for w in start:
        if w in end_slot:
            first_glob[end_slot[w]] = w
    others = iter([w for w in start if w not in end_slot])
    first_glob = [next(others) if w is None else w for w in first_glob]

    def local(params):
        # layout: global slot i holds wire glob[i]; local axis j holds wire loc[j]
        glob, loc = list(first_glob), [w for w in range(n - 1, -1, -1) if w not in first_glob]
        psi = simulator.product_state(kets, loc, dtype)
        for i, w in enumerate(glob):
            psi = psi * jnp.asarray(kets[w], dtype)[lax.axis_index(f"g{i}")]

        def swap(psi, i, j):  # global slot i <-> local axis j: one all-to-all exchanging half of each block
            psi = lax.all_to_all(psi, f"g{i}", j, j, tiled=True)
            glob[i], loc[j] = loc[j], glob[i]
            return psi

        def make_local(psi, wires, keep, now):
            for w in wires:
                if w in glob:
                    # ties to the leading axis, whose halves are contiguous
                    free = max((j for j in range(L) if loc[j] not in keep),
                               key=lambda j: (*global_rank(loc[j], now), -j))
                    psi = swap(psi, glob.index(w), free)
            return psi

        for now, block in enumerate(steps.blocks):
            if block.diagonal:  # no communication: a global wire's bit is the device's coordinate
                tables = []
                for qubits, table in diagonal_tables(steps.circuit, block, params, dtype):
                    qubits = list(qubits)
                    for w in [w for w in qubits if w in glob]:
                        a = qubits.index(w)
                        table = lax.dynamic_index_in_dim(table, lax.axis_index(f"g{glob.index(w)}"), a, keepdims=False)
                        qubits.pop(a)
                    tables.append((tuple(qubits), table))
                psi = apply_diagonal(psi, tables, loc)
            else:
                psi = make_local(psi, block.qubits, set(block.qubits), now)
                matrix = block_matrix(steps.circuit, block, params, dtype)
                psi, moved = apply_block(psi, matrix, [loc.index(w) for w in block.qubits], steps.elementwise_width)
                loc[:] = [loc[a] for a in moved]  # tracked, not transposed back (as in simulator.run_plan)
        # restore: slot i holds the wire of bit n-1-i, local axis j the wire of bit n-1-G-j
        want_glob = [steps.wire_of[n - 1 - i] for i in range(G)]
        for i in range(G):
            if glob[i] != want_glob[i]:
                psi = make_local(psi, [want_glob[i]], set(want_glob[:i]), len(steps.blocks))  # bring it local...
                psi = swap(psi, i, loc.index(want_glob[i]))  # ...then into its slot
        psi = jnp.transpose(psi, [loc.index(steps.wire_of[n - 1 - G - j]) for j in range(L)])
        return psi.reshape(-1)

    if G == 0:
        return jax.jit(local)
    # jitted: shard_map outside jit would dispatch op by op
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(mesh.axis_names),
                                 check_vma=False))
