"""Gate fusion for the state-vector backend: the circuit becomes a short plan of passes over the state.

A state of 2^n amplitudes costs a full pass of memory per applied operator, whatever its size up to a
few qubits, so fewer, fuller passes are faster (HyQuas). The plan has three kinds of step:

- dense blocks: runs of gates on at most k qubits multiplied into one 2^m x 2^m unitary, applied as
  one matrix product (HyQuas's TransMM) or, when narrow, as sums of slices in one element-wise pass;
- diagonal blocks: runs of diagonal gates (rz, rzz, cz, s, t, Z-type Pauli rotations...) on any
  number of qubits, applied element-wise as a product of small tables of at most `table_width`
  qubits each, which XLA fuses into one pass. Diagonal gates commute with one another, so the
  partitioner moves them past each other freely;
- swaps: not applied at all. A swap only relabels which wire holds which qubit; the relabeling is
  tracked and undone by the executor's final transpose.

`partition` builds the blocks greedily; `plan` adds the swap relabeling; `choose_plan` picks k, and the
widest block applied as sums of slices, from pass times measured on the current device
(`measure_pass_seconds`): HyQuas's cost model in small.
Block unitaries and tables multiply their fixed gates on the host and their parametrized gates inside
JAX: a fixed circuit's plan is a few constants, and fused simulation stays differentiable in params.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..circuits.circuit import Circuit, Instruction
from ..runtime import devices
from .passes import (ELEMENTWISE_WIDTH, MAX_ELEMENTWISE_WIDTH, apply_block, apply_matrix, block_layout, gate_matrix,
                     gemm_in_place, is_fixed)

TABLE_WIDTH = 10  # qubits per diagonal table (2^10 entries): cheap to build, cached on chip
MAX_DIAGONAL_GATES = 512  # per diagonal block: bounds the traced product and the fused kernel


class Block(NamedTuple):
    qubits: tuple[int, ...]  # sorted; for a dense block, bit j of its matrix index is qubit qubits[j]
    gates: tuple[int, ...]  # indices into the circuit's instructions, in application order
    diagonal: bool = False  # applied element-wise (any width) instead of as a dense matrix


class Plan(NamedTuple):
    """The circuit as fused blocks over wires. `circuit` is the input with swaps removed and every
    gate moved to the wire that holds its qubit; amplitude bit q of the result is wire wire_of[q]."""

    circuit: Circuit
    blocks: list[Block]
    wire_of: tuple[int, ...]
    elementwise_width: int = 2  # dense blocks up to this width run as sums of slices (passes.apply_block)
    width: int | None = None  # the k it was partitioned with (None: not made by `plan`)


def is_diagonal(ins: Instruction) -> bool:
    """Whether the gate's matrix is diagonal in the computational basis (for every angle)."""
    g = ins.gate
    if g.kind == "channel":
        return False
    if g.unitary is not None:
        u = np.asarray(g.unitary)
        return bool(np.allclose(u, np.diag(np.diagonal(u))))
    return set(ins.generator) <= {"I", "Z"}


def partition(circuit: Circuit, k: int, diagonal: bool = True, lookahead: int = 1) -> list[Block]:
    """The circuit's gates grouped into dense blocks of at most k qubits (a gate wider than k is a
    block of its own) and, with `diagonal`, diagonal blocks of any width.

    Each block is filled by scanning the gates not yet placed; a gate may join a block ahead of
    skipped gates when it commutes with all of them: it shares no qubit with them, or it and every
    skipped gate it shares a qubit with are diagonal. A block is grown from the first unplaced gate
    and, with lookahead L > 1, also from each of the next L - 1 gates of the front (gates that no
    unplaced gate precedes on any of their qubits); when the first unplaced gate is diagonal, a
    diagonal block is grown from it too. The candidate holding the most gates is kept (ties: the
    earliest), which on brickwork circuits finds fuller blocks than the first gate's alone."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"fusion width k must be a positive int, got {k!r}")
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
        raise ValueError(f"lookahead must be a positive int, got {lookahead!r}")
    ins = circuit.instructions
    diag = [diagonal and is_diagonal(i) for i in ins]
    n = circuit.num_qubits

    def grow(remaining, want_diagonal, seed=None):
        qubits, gates = set() if seed is None else set(ins[seed].qubits), []
        blocks_all, blocks_dense = set(), set()  # qubits of skipped non-diagonal / diagonal gates
        for i in remaining:
            touched = set(ins[i].qubits)
            movable = not touched & blocks_all and (diag[i] or not touched & blocks_dense)
            fits = (diag[i] and len(gates) < MAX_DIAGONAL_GATES) if want_diagonal else \
                ((not gates and seed is None) or len(qubits | touched) <= k)
            if movable and fits:
                qubits |= touched
                gates.append(i)
            else:
                (blocks_dense if diag[i] else blocks_all).update(touched)
                if len(blocks_all) == n:  # every later gate waits behind a skipped one
                    break
        return Block(tuple(sorted(qubits)), tuple(gates), want_diagonal)

    def front(remaining):  # up to lookahead - 1 seeds after the first gate, each at most k wide
        seen, seeds = set(ins[remaining[0]].qubits), []
        for i in remaining[1:]:
            if len(seeds) == lookahead - 1 or len(seen) == n:
                break
            touched = set(ins[i].qubits)
            if not touched & seen and len(touched) <= k:
                seeds.append(i)
            seen |= touched
        return seeds

    remaining = list(range(len(ins)))
    blocks = []
    while remaining:
        candidates = [grow(remaining, False)]
        if diag[remaining[0]]:
            candidates.insert(0, grow(remaining, True))  # ties: diagonal
        if lookahead > 1:
            candidates += [grow(remaining, False, seed) for seed in front(remaining)]
        block = max(candidates, key=lambda b: len(b.gates))
        placed = set(block.gates)
        remaining = [i for i in remaining if i not in placed]
        blocks.append(block)
    return blocks


def relabel_swaps(circuit: Circuit) -> tuple[Circuit, tuple[int, ...]]:
    """The circuit without its swaps, each gate moved to the wire that holds its qubit, and wire_of
    (qubit q ends on wire wire_of[q])."""
    wire_of = list(range(circuit.num_qubits))
    moved = Circuit(circuit.num_qubits)
    for ins in circuit.instructions:
        if ins.name == "swap":
            a, b = ins.qubits
            wire_of[a], wire_of[b] = wire_of[b], wire_of[a]
        else:
            moved.instructions.append(dataclasses.replace(ins, qubits=tuple(wire_of[q] for q in ins.qubits)))
    return moved, tuple(wire_of)


def check_plan(circuit: Circuit, p: Plan) -> Plan:
    """p, when it is a plan of this circuit (its gates, after swap relabeling, are the circuit's, and
    each is placed once); else a ValueError naming the mismatch."""
    moved, wire_of = relabel_swaps(circuit)
    if p.circuit.num_qubits != circuit.num_qubits or p.circuit.instructions != moved.instructions or p.wire_of != wire_of:
        raise ValueError(f"the plan is not one of this circuit ({circuit.num_qubits} qubits, {len(circuit.instructions)} "
                         f"gates): it was made for a circuit of {p.circuit.num_qubits} qubits and "
                         f"{len(p.circuit.instructions)} gates after swap relabeling; plan this circuit")
    if sorted(i for b in p.blocks for i in b.gates) != list(range(len(moved.instructions))):
        raise ValueError("the plan does not place each of the circuit's gates exactly once")
    return p


def plan(circuit: Circuit, k: int, diagonal: bool = True, elementwise_width: int | None = None,
         lookahead: int = 1) -> Plan:
    """Swaps turned into relabeling (relabel_swaps), then `partition` (with its lookahead).
    elementwise_width: see Plan (None: the default, passes.ELEMENTWISE_WIDTH)."""
    if elementwise_width is None:
        elementwise_width = ELEMENTWISE_WIDTH
    if isinstance(elementwise_width, bool) or not isinstance(elementwise_width, int) \
            or not 0 <= elementwise_width <= MAX_ELEMENTWISE_WIDTH:
        raise ValueError(f"elementwise_width must be an int in 0..{MAX_ELEMENTWISE_WIDTH}, got {elementwise_width!r}")
    moved, wire_of = relabel_swaps(circuit)
    return Plan(moved, partition(moved, k, diagonal, lookahead), wire_of, elementwise_width, k)


def resolve_plan(circuit: Circuit, fuse, dtype, max_width: int | None = None) -> Plan:
    """The plan a `fuse` argument names: a Plan (checked against the circuit), "auto" (choose_plan,
    widths up to max_width) or a width k (plan)."""
    if isinstance(fuse, Plan):
        return check_plan(circuit, fuse)
    if isinstance(fuse, str) and fuse == "auto":
        return choose_plan(circuit, dtype=dtype, max_width=max_width)
    return plan(circuit, fuse)


def block_matrix(circuit: Circuit, block: Block, params, dtype):
    """A dense block's unitary (2^m x 2^m, m = len(block.qubits)): its gates applied in order to the
    identity, each on the block's local axes. Runs of fixed gates (no Param) are multiplied on the
    host, so the trace holds one product per parametrized gate: a fixed circuit's blocks are constants
    and its compile time follows the number of passes, not of gates."""
    m = len(block.qubits)
    local = {q: j for j, q in enumerate(block.qubits)}
    eye = np.eye(2**m, dtype=complex).reshape((2,) * m + (2**m,))  # columns: the basis states
    traced, fixed, pending = None, eye, False  # block = fixed @ traced; pending: fixed is not the identity
    for i in block.gates:
        ins = circuit.instructions[i]
        axes = [local[q] for q in ins.qubits]
        if is_fixed(ins):
            fixed, pending = apply_matrix(fixed, gate_matrix(ins, params, dtype), axes, m), True
            continue
        start = jnp.asarray(fixed, dtype) if traced is None else _times(fixed, traced, m) if pending else traced
        traced, fixed, pending = apply_matrix(start, gate_matrix(ins, params, dtype), axes, m), eye, False
    if traced is None:
        return jnp.asarray(fixed.reshape(2**m, 2**m), dtype)
    return (_times(fixed, traced, m) if pending else traced).reshape(2**m, 2**m)


def _times(host, traced, m):
    """host @ traced for block unitaries stored as (2,)*m + (2^m,)."""
    product = jnp.matmul(jnp.asarray(host.reshape(2**m, 2**m), traced.dtype), traced.reshape(2**m, 2**m),
                         precision=jax.lax.Precision.HIGHEST)
    return product.reshape(traced.shape)


def broadcast_on(values, value_qubits, target_qubits):
    """values, shape (2,)*m with axis j <-> qubit value_qubits[j], reshaped to broadcast against an
    array whose axis a holds qubit target_qubits[a] (size 2 on those axes, 1 elsewhere). Stays on the
    host for a numpy input."""
    order = sorted(range(len(value_qubits)), key=lambda j: target_qubits.index(value_qubits[j]))
    shape = [2 if q in value_qubits else 1 for q in target_qubits]
    xp = np if isinstance(values, np.ndarray) else jnp
    return xp.transpose(values, order).reshape(shape)


def apply_diagonal(psi, tables, at):
    """psi (axis a holds wire at[a]) times the diagonal given as [(qubits, table)] (diagonal_tables),
    in one element-wise pass over the flat state: each amplitude gathers its entry of every table by
    the bits of its own index. (Broadcasting the tables over a rank-n array instead makes XLA's CPU
    compiler emit n nested loops per table and take minutes.)"""
    n = len(at)
    if n >= 31 and not jax.config.jax_enable_x64:
        raise ValueError(f"diagonal passes over {n} qubits index 2^{n} amplitudes: enable jax_enable_x64")
    index = jax.lax.iota(jnp.int64 if n >= 31 else jnp.int32, 2**n)
    factor = None
    for qubits, table in tables:
        entry = 0
        for w in qubits:  # table axis j <-> qubits[j], row-major: the first axis is the most significant
            entry = entry * 2 + ((index >> (n - 1 - at.index(w))) & 1)
        value = table.reshape(-1)[entry] if qubits else table
        factor = value if factor is None else factor * value
    return psi if factor is None else (psi.reshape(-1) * factor).reshape(psi.shape)


def diagonal_tables(circuit: Circuit, block: Block, params, dtype, table_width: int = TABLE_WIDTH):
    """A diagonal block as [(qubits, table)]: the block's diagonal is the product of the tables, each
    of shape (2,)*len(qubits) with axis j <-> qubits[j]. Gates are packed greedily into tables of at
    most table_width qubits (a wider gate gets its own)."""
    groups: list[tuple[list[int], list[int]]] = []  # (qubits, gates)
    for i in block.gates:
        qs = circuit.instructions[i].qubits
        for qubits, gates in groups:
            if len(set(qubits) | set(qs)) <= table_width:
                qubits.extend(q for q in qs if q not in qubits)
                gates.append(i)
                break
        else:
            groups.append((list(qs), [i]))
    tables = []
    for qubits, gates in groups:
        host, traced = np.ones((2,) * len(qubits), complex), None  # fixed gates' product on the host
        for i in gates:
            ins = circuit.instructions[i]
            d = gate_matrix(ins, params, dtype)
            d = (np.diagonal(d) if isinstance(d, np.ndarray) else jnp.diagonal(d)).reshape((2,) * len(ins.qubits))
            factor = broadcast_on(d, list(reversed(ins.qubits)), qubits)  # row-major: last qubit first
            if isinstance(factor, np.ndarray):
                host = host * factor
            else:
                traced = factor if traced is None else traced * factor
        table = jnp.asarray(host, dtype) if traced is None else jnp.asarray(host, dtype) * traced
        tables.append((tuple(qubits), table))
    return tables


def measure_pass_seconds(num_qubits: int, widths=range(1, 8), dtype=jnp.complex128, repeats: int = 5) -> dict:
    """The cost model's input: seconds of one pass over a state of num_qubits on the default device
    (median of `repeats` after a compile), keyed
      w                  a GEMM block of width w on mid-state axes (a transpose, then the product);
      ("in_place", w)    a GEMM block on the trailing axes, which needs no transpose (passes.gemm_in_place);
      ("elementwise", w) sums of slices on mid-state axes, for w up to passes.MAX_ELEMENTWISE_WIDTH;
      "diagonal"         an element-wise diagonal;
      "transpose"        a permutation of the state's axes (the executor's last step, unless the
                         tracked layout ends where it began)."""
    rng = np.random.default_rng(0)
    psi = jnp.asarray(rng.standard_normal(2**num_qubits), dtype).reshape((2,) * num_qubits)

    def timed(f, *args):
        f(*args).block_until_ready()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(*args).block_until_ready()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def block(axes, elementwise_width):
        return jax.jit(lambda p, m: apply_block(p, m, axes, elementwise_width)[0])

    out = {}
    for w in widths:
        if w > num_qubits:
            continue
        m = jnp.asarray(rng.standard_normal((2**w, 2**w)), dtype)
        mid = list(range(num_qubits // 2 - w // 2, num_qubits // 2 - w // 2 + w))
        edge = list(range(num_qubits - 1, num_qubits - 1 - w, -1))
        out[w] = timed(block(mid, 0), psi, m)
        out[("in_place", w)] = timed(block(edge, 0), psi, m)
        if w <= MAX_ELEMENTWISE_WIDTH:
            out[("elementwise", w)] = timed(block(mid, w), psi, m)
    t = jnp.asarray(rng.standard_normal((2,) * min(TABLE_WIDTH, num_qubits)), dtype)
    out["diagonal"] = timed(jax.jit(lambda p, t: p * t.reshape(t.shape + (1,) * (num_qubits - t.ndim))), psi, t)
    rotated = list(range(num_qubits // 3, num_qubits)) + list(range(num_qubits // 3))
    out["transpose"] = timed(jax.jit(lambda p: jnp.transpose(p, rotated)), psi)
    return out


@functools.lru_cache(maxsize=None)
def _device_pass_seconds(platform: str, num_qubits: int, dtype_name: str) -> tuple:
    return tuple(measure_pass_seconds(num_qubits, dtype=jnp.dtype(dtype_name)).items())


# The size at which choose_plan measures pass times, per backend: large enough that the ratios
# between widths are those of big states (on an H100 they still shift between 20 and 28 qubits),
# small enough to take well under a second (a 26-qubit pass is ~2 ms on a GPU, ~1 s on a CPU core).
COST_MODEL_QUBITS = {"cpu": 18, "gpu": 26, "cuda": 26, "rocm": 26}


def elementwise_width_from(pass_seconds: dict) -> int:
    """The widest w such that sums of slices cost no more than a GEMM, in place, at every width up to
    w (the default, passes.ELEMENTWISE_WIDTH, when pass_seconds has no element-wise times)."""
    if not any(isinstance(key, tuple) and key[0] == "elementwise" for key in pass_seconds):
        return ELEMENTWISE_WIDTH
    width = 0
    while ("elementwise", width + 1) in pass_seconds and \
            pass_seconds[("elementwise", width + 1)] <= pass_seconds.get(("in_place", width + 1), np.inf):
        width += 1
    return width


LOOKAHEADS = (1, 8)  # partition lookaheads the cost model tries at every width


def choose_plan(circuit: Circuit, pass_seconds: dict | None = None, dtype=jnp.complex128,
                max_width: int | None = None) -> Plan:
    """The plan with the least predicted time over fusion widths k (up to max_width) and
    LOOKAHEADS: the sum over its blocks of the measured seconds of one pass of that block's width
    and form (sums of slices up to `elementwise_width_from(pass_seconds)`, else a GEMM in place or
    transposed as the executor's tracked layout will have it), plus a transpose when the layout
    does not end where it began. pass_seconds: as from measure_pass_seconds; None: measured once
    per process on the default device at min(n, COST_MODEL_QUBITS) qubits (the ratios between
    widths, not the absolute times, decide)."""
    if pass_seconds is None:
        n = min(circuit.num_qubits, COST_MODEL_QUBITS.get(devices.backend(), 20))
        pass_seconds = dict(_device_pass_seconds(devices.backend(), n, jnp.dtype(dtype).name))
    widths = sorted(w for w in pass_seconds if isinstance(w, int) and (max_width is None or w <= max_width))
    if not widths:
        raise ValueError(f"pass_seconds has no dense widths (at most {max_width})" if max_width else
                         "pass_seconds has no dense widths")
    elementwise = elementwise_width_from(pass_seconds)

    def pass_cost(w, form):  # the nearest measured width at or above w; beyond the widest, 2x per qubit
        above = [v for v in widths if v >= w]
        v = above[0] if above else widths[-1]
        t = pass_seconds.get((form, v), pass_seconds[v])
        return t * 2.0 ** max(0, w - v)

    def cost(p):
        n = circuit.num_qubits
        at, total = list(range(n - 1, -1, -1)), 0.0
        for b in p.blocks:
            if b.diagonal:
                total += pass_seconds["diagonal"]
                continue
            axes = [at.index(q) for q in b.qubits]
            form = "elementwise" if len(axes) <= elementwise else "in_place" if gemm_in_place(n, axes) else "mid"
            total += pass_cost(len(axes), form)
            at = [at[a] for a in block_layout(n, axes, elementwise)]
        if [at.index(p.wire_of[n - 1 - a]) for a in range(n)] != list(range(n)):  # simulate's final transpose
            total += pass_seconds.get("transpose", 0.0)
        return total

    plans = [plan(circuit, k, elementwise_width=elementwise, lookahead=lookahead) for k in widths for lookahead in LOOKAHEADS]
    return min(plans, key=cost)


def choose_width(circuit: Circuit, pass_seconds: dict | None = None, dtype=jnp.complex128) -> int:
    """The fusion width k of choose_plan's plan."""
    return choose_plan(circuit, pass_seconds, dtype).width
