"""Exact dense state-vector simulation: the reference for every estimate, and the exact method.

Amplitudes are little-endian (qubit q is bit q of the basis index). Gate matrices come from the
shared gate table (passes.py). `simulate(fuse=None)` is the small, clear reference: a lax.scan over the
circuit's gate table, one pass per gate, whose compile time does not grow with depth.
`simulate(fuse=k | "auto" | plan)` runs a fusion plan (fusion.py), a few passes for hundreds of
gates, up to the device's memory; the plan unrolls into the trace per pass (fixed gates are
multiplied into their block on the host, so only parametrized gates add to the trace).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..algebra.overlap import bloch_vectors
from ..algebra.paulisum import PauliSum
from ..algebra.words import unpack_bits
from ..circuits.circuit import Circuit, Param
from .fusion import apply_diagonal, block_matrix, diagonal_tables, resolve_plan
from ..runtime.memory import device_memory_bytes
from .passes import apply_block, unitary_gate


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


class GateTable(NamedTuple):
    """A circuit as arrays, one row per gate, for the scanned reference executor (`run_gates`).

    kind 0: a fixed unitary on qubits (a, b) as a 4 x 4 matrix (bit 0 of its index is qubit a; a
    one-qubit gate is padded with the identity on a partner qubit b). kind 1: a Pauli rotation
    exp(-i angle/2 P) on any qubits, P = phase X^xmask Z^zmask (phase = i^{number of Y}), with
    angle = scale * params[index] + offset."""

    kind: np.ndarray
    matrix: np.ndarray
    a: np.ndarray
    b: np.ndarray
    xmask: np.ndarray
    zmask: np.ndarray
    phase: np.ndarray
    index: np.ndarray
    scale: np.ndarray
    offset: np.ndarray


def padded_length(num_gates: int) -> int:
    """Rows of a circuit's gate table: a power of two, at least 16 (identity gates pad it), so that a
    loop over many circuits compiles one program per (qubits, bucket), not one per circuit."""
    return max(16, 1 << max(0, num_gates - 1).bit_length())


def gate_table(circuit: Circuit, num_qubits: int, length: int | None = None) -> GateTable:
    """The circuit's gates as a GateTable over num_qubits (>= 2) qubits, built on the host; `length`
    rows (identity gates after the circuit's)."""
    ins = circuit.instructions
    count = len(ins) if length is None else length
    t = GateTable(np.zeros(count, np.int32), np.tile(np.eye(4, dtype=complex), (count, 1, 1)),
                  np.zeros(count, np.int32), np.ones(count, np.int32), np.zeros(count, np.int64),
                  np.zeros(count, np.int64), np.ones(count, complex), np.zeros(count, np.int32),
                  np.zeros(count), np.zeros(count))
    for g, i in enumerate(ins):
        gd = unitary_gate(i)
        if gd.unitary is not None:
            u = np.asarray(gd.unitary, complex)
            if len(i.qubits) == 1:
                t.a[g], t.b[g] = i.qubits[0], (i.qubits[0] + 1) % num_qubits
                u = np.kron(np.eye(2), u)  # identity on the partner (the index's high bit)
            else:
                t.a[g], t.b[g] = i.qubits
            t.matrix[g] = u
            continue
        t.kind[g] = 1
        generator = i.generator
        for ch, q in zip(generator, i.qubits):
            t.xmask[g] |= (ch in "XY") << q
            t.zmask[g] |= (ch in "ZY") << q
        t.phase[g] = 1j ** generator.count("Y")
        angle = i.args[0]
        if isinstance(angle, Param):
            t.index[g], t.scale[g], t.offset[g] = angle.index, angle.scale, angle.offset
        else:
            t.offset[g] = float(angle)
    return t


def index_type(num_qubits: int):
    """The integer type that indexes 2^n amplitudes (int64 from 31 qubits, which needs x64)."""
    if num_qubits >= 31 and not jax.config.jax_enable_x64:
        raise ValueError(f"indexing 2^{num_qubits} amplitudes needs 64-bit integers: enable jax_enable_x64")
    return jnp.int64 if num_qubits >= 31 else jnp.int32


def parameter_values(params, real):
    """params and a trailing 0 (the padding rows' index), padded to a bucketed length (8, 16, ...)."""
    if params is None:
        return np.zeros(8, real)
    traced = isinstance(params, jax.core.Tracer)
    p = (jnp if traced else np).asarray(params, real).reshape(-1)
    width = max(8, 1 << p.shape[0].bit_length())
    return (jnp if traced else np).pad(p, (0, width - p.shape[0]))


def gate_rows(table: GateTable, params, dtype, itype) -> tuple:
    """The table as device arrays, one row per gate (scan's xs), with each gate's angle evaluated."""
    real = jnp.finfo(dtype).dtype
    values = parameter_values(params, real)
    angles = jnp.asarray(table.scale, real) * values[table.index] + jnp.asarray(table.offset, real)
    return (jnp.asarray(table.kind), jnp.asarray(table.matrix, dtype), jnp.asarray(table.a, itype),
            jnp.asarray(table.b, itype), jnp.asarray(table.xmask, itype), jnp.asarray(table.zmask, itype),
            jnp.asarray(table.phase, dtype), angles)


def pauli_times(j, psi, xmask, zmask, phase):
    """P psi for P = phase X^xmask Z^zmask (j: the amplitudes' indices): (X^x Z^z psi)[j] =
    (-1)^{|(j ^ x) & z|} psi[j ^ x]."""
    source = j ^ xmask
    sign = (1 - 2 * (jax.lax.population_count(source & zmask) & 1)).astype(jnp.real(psi).dtype)
    return phase * sign * psi[source]


def gate_step(j, psi, row, inverse: bool = False):
    """psi after one row of gate_rows (or after its inverse): a gather of the 4 source amplitudes of a
    fixed gate by index bits, or cos(a/2) psi - i sin(a/2) P psi for a Pauli rotation."""
    kind, m, a, b, xmask, zmask, phase, angle = row

    def fixed(psi):
        matrix = (jnp.conj(m).T if inverse else m).reshape(-1)
        rows = ((j >> a) & 1) + 2 * ((j >> b) & 1)
        base = j & ~((1 << a) | (1 << b))
        return sum(matrix[rows * 4 + c] * psi[base | ((c & 1) << a) | ((c >> 1) << b)] for c in range(4))

    def rotation(psi):
        half = (-angle if inverse else angle) / 2
        return jnp.cos(half).astype(psi.dtype) * psi - 1j * jnp.sin(half).astype(psi.dtype) * pauli_times(j, psi, xmask, zmask, phase)

    return jax.lax.cond(kind == 0, fixed, rotation, psi)


def reference_start(circuit: Circuit, params, state, dtype) -> tuple:
    """(j, table, rows, psi) for the scanned reference: the amplitudes' indices, the gate table, its
    rows (gate_rows) and the initial product state. A one-qubit circuit runs on two qubits, the
    second |0> (the table pairs every qubit with a partner): take the first 2 amplitudes after."""
    width = max(circuit.num_qubits, 2)
    psi = product_state(product_kets(state, circuit.num_qubits), range(circuit.num_qubits - 1, -1, -1), dtype).reshape(-1)
    psi = jnp.concatenate([psi, jnp.zeros(2**width - psi.shape[0], dtype)])
    table = gate_table(circuit, width, padded_length(len(circuit.instructions)))
    j = jax.lax.iota(index_type(width), 2**width)
    return j, table, gate_rows(table, params, dtype, j.dtype), psi


@jax.jit
def _run_reference(table: GateTable, values, psi):
    """psi after the table's gates (one compiled program per qubit count and table bucket)."""
    j = jax.lax.iota(index_type(int(np.log2(psi.shape[0]))), psi.shape[0])
    return run_gates(j, gate_rows(table, values, psi.dtype, j.dtype), psi)


def run_gates(j, rows, psi):
    """psi after the rows' gates, one lax.scan step per gate (gate_step). The trace holds one step
    whatever the depth, so compilation is flat in the number of gates."""
    return jax.lax.scan(lambda psi, row: (gate_step(j, psi, row), None), psi, rows)[0]


def require_params(circuit: Circuit, params) -> None:
    """Raise, naming the count, when the circuit has parameters and params is None."""
    if circuit.num_params and params is None:
        raise ValueError(f"circuit uses {circuit.num_params} parameter(s) but params is None")


def check_size(num_qubits: int, dtype, devices: int = 1) -> None:
    """Raise, before anything is allocated, when a state of num_qubits (split over `devices`) cannot
    fit: a pass holds the state, its result and a transposed copy, so 3 x 2^n x itemsize per device
    must fit in the device's memory."""
    itemsize = jnp.dtype(dtype).itemsize
    need = 3 * itemsize * 2**num_qubits // devices
    have = device_memory_bytes()
    if need > have:
        where = f" over {devices} devices" if devices > 1 else ""
        raise ValueError(f"{num_qubits} qubits need 2^{num_qubits} amplitudes ({itemsize * 2.0**num_qubits / 2**30:.3g} GiB "
                         f"at {jnp.dtype(dtype).name}{where}; a pass needs 3x that per device, "
                         f"{need / 2**30:.3g} GiB), but the device has {have / 2**30:.3g} GiB")


def product_state(kets, wires, dtype):
    """The product state as an array of shape (2,)*len(wires), axis a holding wire wires[a] (built on
    the device: nothing of size 2^n crosses from the host)."""
    psi = jnp.ones((), dtype)
    for w in wires:
        psi = psi[..., None] * jnp.asarray(kets[w], dtype)
    return psi


def initial_state(state, num_qubits, dtype=jnp.complex128):
    """Product state |psi> from a state description (pure states only), as 2^n amplitudes."""
    return product_state(product_kets(state, num_qubits), range(num_qubits - 1, -1, -1), dtype).reshape(-1)


def run_plan(plan, params, psi, at, dtype):
    """Apply a fusion.Plan's blocks to psi (axis a holds wire at[a]) without transposing back: the
    layout is tracked instead. Returns (psi, at)."""
    at = list(at)
    for block in plan.blocks:
        if block.diagonal:
            psi = apply_diagonal(psi, diagonal_tables(plan.circuit, block, params, dtype), at)
        else:
            m = block_matrix(plan.circuit, block, params, dtype)
            psi, moved = apply_block(psi, m, [at.index(q) for q in block.qubits], plan.elementwise_width)
            at = [at[a] for a in moved]
    return psi, at


def simulate(circuit: Circuit, params=None, state="0", dtype=jnp.complex128, fuse=None):
    """The 2^n amplitudes of circuit|state> (little-endian).

    fuse: None (the plain reference: a scan over the gates, one pass each), k (fusion.plan: dense blocks
    of at most k qubits, diagonal runs element-wise, swaps as relabeling), "auto" (fusion.choose_plan:
    k and the element-wise width from pass times measured on this device), or a fusion.Plan of this
    circuit (to choose once and reuse). Wrap in jax.jit to run it as one program; gradients in params
    flow through every mode."""
    n = circuit.num_qubits
    check_size(n, dtype)
    require_params(circuit, params)
    if params is not None:
        params = jnp.asarray(params)
    if fuse is None:
        width = max(n, 2)
        psi = product_state(product_kets(state, n), range(n - 1, -1, -1), dtype).reshape(-1)
        if width > n:
            psi = jnp.concatenate([psi, jnp.zeros(2**width - psi.shape[0], dtype)])
        table = gate_table(circuit, width, padded_length(len(circuit.instructions)))
        psi = _run_reference(table, parameter_values(params, jnp.finfo(dtype).dtype), psi)
        return psi if width == n else psi[:2**n]
    p = resolve_plan(circuit, fuse, dtype)  # checks fuse before anything is allocated
    at = list(range(n - 1, -1, -1))
    psi, at = run_plan(p, params, product_state(product_kets(state, n), at, dtype), at, dtype)
    # amplitude bit q is wire wire_of[q]: axis a of the result holds bit n-1-a
    return jnp.transpose(psi, [at.index(p.wire_of[n - 1 - a]) for a in range(n)]).reshape(-1)


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


def observable_masks(obs: PauliSum, itype) -> tuple:
    """(xmask, zmask, phase) per term as device arrays: P_t = phase_t X^xmask_t Z^zmask_t."""
    return tuple(jnp.asarray(m) for m in _masks(obs, itype))


def _masks(obs: PauliSum, itype) -> tuple:
    """observable_masks as numpy arrays."""
    n = obs.num_qubits
    weights = 1 << np.arange(n, dtype=np.int64)
    xb = unpack_bits(np.asarray(obs.x), n).astype(np.int64)
    zb = unpack_bits(np.asarray(obs.z), n).astype(np.int64)
    return ((xb @ weights).astype(itype), (zb @ weights).astype(itype), 1j ** (np.sum(xb & zb, axis=1) % 4))


def pauli_expectations(psi, obs: PauliSum):
    """<psi|P_t|psi> for every term of obs (real), for a state of 2^n amplitudes.

    On the device, with nothing of size 2^n built on the host, and one compiled program per qubit
    count and bucket of terms (lax.map over the terms' masks, in chunks of about 2^20 amplitude-terms;
    the masks padded with identities to a power of two)."""
    n = obs.num_qubits
    if np.size(psi) != 2**n:
        raise ValueError(f"the observable acts on {n} qubits (2^{n} amplitudes) but the state has {np.size(psi)} amplitudes")
    if len(obs) == 0:  # an empty sum (words.unpack_bits cannot reshape a (0, W) array)
        return jnp.zeros(0)
    return _expectations(jnp.reshape(psi, -1), _padded_masks(obs, index_type(n)))[:len(obs)]


def _padded_masks(obs: PauliSum, itype) -> tuple:
    """`_masks` padded with identities to a power of two (at least 8): one program per bucket of terms."""
    size = max(8, 1 << (len(obs) - 1).bit_length())
    return tuple(np.pad(m, (0, size - len(obs)), constant_values=1 if k == 2 else 0)
                 for k, m in enumerate(_masks(obs, itype)))


@jax.jit
def _expectations(psi, masks):
    j = jax.lax.iota(masks[0].dtype, psi.shape[0])
    conj = jnp.conj(psi)

    def term(m):
        return jnp.real(jnp.sum(conj * pauli_times(j, psi, *m)))

    batch = max(1, min(masks[0].shape[0], 2**20 // psi.shape[0]))
    return jax.lax.map(term, masks, batch_size=batch)


def expectation(circuit: Circuit, observable: PauliSum, params=None, state="0", dtype=jnp.complex128):
    """Exact <psi|H|psi>, psi = circuit|state>, differentiable in params.

    One compiled program (product state, gates, terms) per qubit count and bucket of gates and
    terms; everything else is built on the host, so a first call compiles one program, not one per
    array operation (an 8-qubit circuit's first call on the 2-core CPU: 28 programs before)."""
    n = circuit.num_qubits
    if observable.num_qubits != n:
        raise ValueError(f"the observable acts on {observable.num_qubits} qubits (2^{observable.num_qubits} "
                         f"amplitudes) but the state has {2**n} amplitudes")
    check_size(n, dtype)
    require_params(circuit, params)
    coeffs = observable.coeffs
    if len(observable) == 0:
        return jnp.zeros((), jnp.result_type(coeffs))
    width = max(n, 2)
    kets = np.concatenate([product_kets(state, n), np.tile([[1, 0]], (width - n, 1))]).astype(dtype)
    table = gate_table(circuit, width, padded_length(len(circuit.instructions)))
    masks = _padded_masks(observable, index_type(width))
    extra = (0, masks[0].shape[0] - len(observable))
    coeffs = jnp.pad(coeffs, extra) if isinstance(coeffs, jax.core.Tracer) else np.pad(np.asarray(coeffs), extra)
    return _reference_expectation(table, parameter_values(params, jnp.finfo(dtype).dtype), kets, masks, coeffs)


@jax.jit
def _reference_expectation(table: GateTable, values, kets, masks, coeffs):
    """sum_t coeffs_t <psi|P_t|psi>, psi = the table's gates on the product state of `kets` (row q:
    qubit q; qubits past the circuit's are |0>)."""
    psi = _run_reference(table, values, product_state(kets, range(kets.shape[0] - 1, -1, -1), kets.dtype).reshape(-1))
    return jnp.sum(coeffs * _expectations(psi, masks).astype(coeffs.dtype))
