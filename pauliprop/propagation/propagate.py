"""Backward Pauli propagation: the public entry points around the engine's loop.

`propagate` and `expectation` lower the circuit once (program.py, schedule.py; cached on the
circuit), pick a capacity, and run the loop of engine.py. Outside a jax trace a unit that would
overflow the buffer stops the loop; the buffer is grown and the loop resumes at that unit, so a
result is never silently lossy and never recomputed from the first gate. Inside a trace (jit,
grad, vmap) the capacity is fixed: an overflow keeps the largest terms, is counted in the stats
and warned about. Gradients come from the engine's own reverse mode (adjoint.py).

On CPUs, concrete calls that the tiled engine takes run on the native engine instead (native.py and its C
loops, built at install; `_drive_native`; PAULIPROP_NATIVE=0 turns it off): the same units and truncation
decisions, compiled ahead of time, in numpy buffers that grow without recompiling. Where the C library was
not built, they run on the tiled engine, small runs first on the loop.

Programs are shared: the compiled loop depends on the capacity, the lanes, the rules that exist,
the truncation semantics and the bucketed lengths of the tables, not on the gates; params may be a
batch (B, P) of parameter sets, which run together in one program (on CPUs, a batch of large
members instead runs them side by side on the cores, each alone: `_drive_side_by_side`).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import statevector
from ..algebra import words as pauli_words
from ..algebra.overlap import overlap_table, parse_state
from ..algebra.paulisum import PauliSum
from ..circuits.circuit import Circuit
from ..runtime.batching import batched, vmap_shared
from ..runtime import background, memory
from ..runtime.compilation import Jitted, signature
from . import adjoint, engine, merge, program, schedule, tiled
from .truncation import NO_TRUNCATION, RULES, Truncation, violations
from ..runtime import devices


class PropagationStats(NamedTuple):
    """What propagation did: live terms after each operation (circuit order; inside a fused run or a
    layer, the count after that step), the 1-norm each rule dropped (order of `truncation.RULES`),
    whether the capacity overflowed, and the capacity."""

    terms: jax.Array  # (L,) int32, terms after each operation, in circuit order
    dropped_norm: jax.Array  # (5,) float: max_weight, min_abs_coeff, max_sins, max_terms, overflow
    overflow: jax.Array  # bool
    capacity: int
    max_terms_seen: jax.Array  # int32, the largest live count

    @property
    def total_dropped_norm(self):
        return jnp.sum(self.dropped_norm)

    def summary(self) -> str:
        d = dict(zip(RULES, np.asarray(self.dropped_norm).tolist()))
        return (f"capacity {self.capacity}, peak terms {int(self.max_terms_seen)}, final terms "
                f"{int(self.terms[0]) if len(self.terms) else 0}, overflow {bool(self.overflow)}, dropped 1-norm {d}")


# ---- lowering, cached on the circuit ------------------------------------------------------------------

class Lowered(NamedTuple):
    program: program.Program  # the rows in the observable's light cone (all rows without an observable)
    schedule: schedule.Schedule
    units: schedule.Units
    tables: dict  # padded numpy tables, the loop's input
    on_device: dict  # backend -> the tables as device arrays (copied once, not at every call)
    rows: np.ndarray  # the circuit's rows that `program` holds (indices into program.lower(circuit))
    row_units: np.ndarray  # (L,) for every row of the circuit, the unit after which its term count is read
    qubits: np.ndarray | None = None  # the circuit's qubits that `program`'s qubits 0, 1, ... are (None: the same)

    def device_tables(self, backend: str) -> dict:
        if backend not in self.on_device:
            self.on_device[backend] = jax.device_put(self.tables, jax.devices(backend)[0])
        return self.on_device[backend]

    def terms_per_row(self, unit_terms):
        """PropagationStats.terms: the live terms after each row of the circuit, from each unit's count (a
        row outside the light cone: the count of the row applied before it)."""
        return unit_terms[self.row_units] if len(self.row_units) else unit_terms[:0]


def observable_support(obs: PauliSum) -> int | None:
    """The qubits the observable's words act on, as a bit mask (None: its words are traced)."""
    if is_traced(obs.x, obs.z):
        return None
    acts = np.bitwise_or.reduce(np.asarray(obs.x, np.uint32) | np.asarray(obs.z, np.uint32), axis=0) \
        if len(obs) else np.zeros(obs.num_lanes, np.uint32)
    return sum(int(bits) << (32 * lane) for lane, bits in enumerate(np.atleast_1d(acts).tolist()))


def _circuit_cache(circuit: Circuit) -> dict:
    """What pauliprop keeps on a circuit (its lowered programs, facts about its gates), keyed by its length among
    the rest: the circuit drops it when it changes."""
    cache = getattr(circuit, "_program_cache", None)
    if not isinstance(cache, dict):
        cache = circuit._program_cache = {}
    return cache


def lowered(circuit: Circuit, truncation: Truncation, backend: str | None = None, layers: bool = False,
            support: int | None = None, renumber: bool = False) -> Lowered:
    """The circuit's program, steps, units and tables for this truncation's semantics, restricted to the
    light cone of an observable acting on the qubits of `support` (program.light_cone; None: every row).
    Cached on the circuit until it changes. layers: a layer of rotations is one unit (engine.layer_unit).
    renumber: where the light cone's qubits fit in fewer lanes than the circuit's, the program acts on them
    alone, renumbered in order (Lowered.qubits; `on_cone` moves the observable and the state there): a local
    observable of a 5,000-qubit circuit runs on words of a lane or two, where it took 157."""
    backend = backend or devices.backend()
    weight_each = truncation.rules.weight_each_gate
    key = (len(circuit.instructions), truncation.per, weight_each, backend, layers, support,
           renumber and support is not None)
    cache = _circuit_cache(circuit)
    if key not in cache:
        whole = cache.get("program")
        if whole is None or whole[0] != len(circuit.instructions):
            whole = cache["program"] = (len(circuit.instructions), program.lower(circuit))
        full = whole[1]
        sibling = cache.get(key[:4] + (not layers,) + key[5:])  # the same program and schedule, other units
        if sibling is not None:
            rows, prog, sched, qubits = sibling.rows, sibling.program, sibling.schedule, sibling.qubits
        else:
            rows, reach = program.light_cone_reach(full, support) if support is not None else \
                (np.arange(full.length), None)
            prog = program.restrict(full, rows) if len(rows) < full.length else full
            qubits = None
            if key[-1]:
                cone = program.mask_qubits(reach)
                if len(cone) and pauli_words.num_lanes(len(cone)) < pauli_words.num_lanes(prog.num_qubits):
                    prog, qubits = program.renumbered(prog, cone), cone
            sched = schedule.schedule(prog, weight_each_gate=weight_each, backend=backend)
        units = schedule.units(sched, truncation.per, layers=layers)
        tables = {**schedule.padded(sched), **schedule.padded_units(units), "num_units": np.int32(units.length)}
        for old in [k for k in cache if k != "program" and k[0] != key[0]]:  # lowered before the circuit grew
            del cache[old]
        if len(cache) > 64:  # many observables' light cones of one circuit: keep the newest
            del cache[next(k for k in cache if k != "program")]
        cache[key] = Lowered(prog, sched, units, tables, {}, rows, _row_units(full.length, rows, units.unit_of_op),
                             qubits)
    return cache[key]


def on_cone(low: Lowered, x, z, table) -> tuple:
    """(x, z, table): an observable's lanes and a state's overlap table (algebra.overlap.overlap_table) on the qubits of
    low's program: renumbered where `lowered` renumbered them (Lowered.qubits), else as they are."""
    if low.qubits is None:
        return np.asarray(x, np.uint32), np.asarray(z, np.uint32), table
    m = len(low.qubits)
    lanes, to = pauli_words.num_lanes(m), np.arange(m)
    table = np.asarray(table)
    cone_table = np.zeros((pauli_words.LANE_BITS * lanes, table.shape[1]), table.dtype)
    cone_table[:, 0] = 1.0  # the identity's factor on the padding qubits
    cone_table[:m] = table[low.qubits]
    return pauli_words.moved(x, low.qubits, to, lanes), pauli_words.moved(z, low.qubits, to, lanes), cone_table


def off_cone(low: Lowered, x, z, num_lanes: int) -> tuple:
    """Words on low's program's qubits back on the circuit's (`on_cone`'s inverse)."""
    if low.qubits is None:
        return x, z
    back = lambda a: pauli_words.moved(a, np.arange(len(low.qubits)), low.qubits, num_lanes)
    return back(x), back(z)


def _row_units(length: int, rows: np.ndarray, unit_of_op: np.ndarray) -> np.ndarray:
    """For each of the circuit's rows, the unit whose count is the live terms after it: its own unit when
    it is in the light cone, else that of the nearest row applied before it (backward: the next kept row
    after it in circuit order), or unit 0 (the observable's merge)."""
    out = np.zeros(length, np.int32)
    at = np.full(length, -1, np.int64)
    at[rows] = np.arange(len(rows))
    current = 0
    for r in range(length - 1, -1, -1):
        if at[r] >= 0:
            current = int(unit_of_op[at[r]])
        out[r] = current
    return out


# ---- inputs -------------------------------------------------------------------------------------------

def check_inputs(circuit: Circuit, obs: PauliSum, params):
    if not isinstance(circuit, Circuit):
        raise TypeError(f"expected a pauliprop.Circuit, got {type(circuit).__name__}")
    if not isinstance(obs, PauliSum):
        raise TypeError(f"expected a pauliprop.PauliSum observable, got {type(obs).__name__}")
    if obs.num_qubits != circuit.num_qubits:
        raise ValueError(f"observable acts on {obs.num_qubits} qubits but the circuit has {circuit.num_qubits}")
    need = circuit.num_params
    if need and params is None:
        raise ValueError(f"circuit uses {need} parameter(s) (Param(0)..Param({need - 1})) but params is None")
    if params is not None:
        shape = jnp.shape(params) if is_traced(params) else np.shape(params)
        if len(shape) not in (1, 2):
            raise ValueError(f"params must be a 1-d array (or 2-d: a batch of parameter sets), got shape {shape}")
        if shape[-1] < need:
            raise ValueError(f"circuit uses Param({need - 1}) but params has only {shape[-1]} entries")
        if not is_traced(params):
            p = np.asarray(params)
            if not np.all(np.isfinite(p)):
                bad = np.argwhere(~np.isfinite(p))[0]
                raise ValueError(f"params[{', '.join(map(str, bad))}] = {p[tuple(bad)]} is not finite")


def _ndim(params) -> int:
    return jnp.ndim(params) if is_traced(params) else np.ndim(params)


def is_traced(*xs) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for x in xs for leaf in jax.tree_util.tree_leaves(x))


def default_capacity(obs: PauliSum, truncation: Truncation, num_qubits: int | None = None) -> int:
    """A first capacity (a power of two): max_terms and a quarter more when given (a rotation whose
    spawned words do not fit cuts the buffer and them together to max_terms); otherwise
    room for modest growth, at most the 4^n words of n qubits, and 2^14 (CPUs) or 2^16 (GPUs) for
    truncated propagation on more than 32 qubits, where growth is the rule."""
    n = num_qubits or obs.num_qubits
    if truncation.max_terms is not None:
        want = truncation.max_terms + truncation.max_terms // 4
    else:
        want = min(64 * max(len(obs), 16), 4 ** min(n, 15))
        if n > 32 and not truncation.is_exact:
            want = max(want, 1 << (14 if devices.backend() == "cpu" else 16))
    return 1 << max(6, int(math.ceil(math.log2(max(want, len(obs), 1)))))


def params_array(params, num_params: int, dtype):
    """params as a (P,) or (B, P) array of the coefficients' dtype, padded to a bucketed length."""
    if params is None:
        params = np.zeros(0, dtype)  # numpy: an eager jnp.zeros compiles two programs (0.2 s on a GPU's first call)
    p = params if is_traced(params) else np.asarray(params)
    width = schedule.bucket(max(p.shape[-1], num_params), 1)
    pad = [(0, 0)] * (p.ndim - 1) + [(0, width - p.shape[-1])]
    return (jnp if is_traced(p) else np).pad(p.astype(dtype), pad)


def _initial_buffer(obs: PauliSum, capacity: int, dtype) -> engine.Buffer:
    """The observable in a buffer of `capacity` slots (host arrays unless its coefficients are traced)."""
    t = len(obs)
    if t > capacity:
        raise ValueError(f"observable has {t} terms, more than the capacity {capacity}")
    w = obs.num_lanes
    words = np.zeros((capacity, 2 * w), np.uint32)
    words[:t, :w] = np.asarray(obs.x, np.uint32).reshape(t, w)
    words[:t, w:] = np.asarray(obs.z, np.uint32).reshape(t, w)
    if is_traced(obs.coeffs):
        coeffs = jnp.zeros(capacity, dtype).at[:t].set(jnp.asarray(obs.coeffs, dtype))
    else:
        coeffs = np.zeros(capacity, dtype)
        coeffs[:t] = np.asarray(obs.coeffs, dtype)
    return engine.Buffer(words, coeffs, (np.arange(capacity) < t).astype(np.int32), np.zeros(5, dtype))


def _grown(buf: engine.Buffer, capacity: int) -> engine.Buffer:
    """The buffer in `capacity` slots; a buffer of that size as it is. Host arrays (and CPUs' buffers)
    are padded on the host (no program to compile for the copy); device buffers on GPUs on the
    device, where a copy through the host costs milliseconds a call (P3's 8K words: 5.5 ms)."""
    axis = np.ndim(buf.coeffs) - 1
    if np.shape(buf.coeffs)[axis] == capacity:
        return buf
    if isinstance(buf.coeffs, jax.Array) and devices.backend() != "cpu":
        return _pad_slots(buf, capacity)

    def grow(a):
        a = np.asarray(a)
        pad = [(0, 0)] * a.ndim
        pad[axis] = (0, capacity - a.shape[axis])
        return np.pad(a, pad)

    return engine.Buffer(grow(buf.words), grow(buf.coeffs), grow(buf.meta), np.asarray(buf.dropped))


@partial(jax.jit, static_argnums=1)
def _pad_slots(buf: engine.Buffer, capacity: int) -> engine.Buffer:
    axis = buf.coeffs.ndim - 1
    grow = lambda a: jnp.pad(a, [(0, capacity - a.shape[axis]) if i == axis else (0, 0) for i in range(a.ndim)])
    return engine.Buffer(grow(buf.words), grow(buf.coeffs), grow(buf.meta), buf.dropped)


def next_capacity(capacity: int, need: int) -> int:
    """The capacity to resume with: at least twice the old one and twice what the step needed."""
    return 1 << int(math.ceil(math.log2(max(2 * capacity, 2 * need))))


UNITS_PER_TEST = 16  # GPUs: units a loop step applies between two waits for the host (engine.run)


def _units_per_test(low: Lowered, backend: str) -> int:
    """UNITS_PER_TEST on GPUs for programs of many units; 1 on CPUs (a test costs nothing there) and for
    a few units (a unit past the end still runs the switch, which waits for the host on GPUs: P3's
    three-unit program took 10 ms with 16, 7.5 ms with 1, on an H100)."""
    return UNITS_PER_TEST if backend != "cpu" and low.units.length >= 4 * UNITS_PER_TEST else 1


LARGE_MAP_CAPACITY = 1 << 20  # GPUs: buffers from this many slots unroll a dense map's loop less (map_unroll)


def map_unroll(backend: str, capacity: int) -> int:
    """Bytes of a word a dense Clifford map looks up per loop iteration (clifford.apply_map). CPUs: 1.
    GPUs: 32 (every byte of 128 qubits in one kernel) below LARGE_MAP_CAPACITY slots, where a map is
    a few launches' latency; 8 from there on, because XLA:GPU keeps every unrolled byte's looked-up
    rows and indices at once: at 2^22 slots the max_terms program held 225 bytes a slot of
    temporaries with 32, 123 with 8 (120 with 4), and ran as fast (one H100, 2026-11-26: the map of
    2^22 words 2.44-2.54 ms with 32, 2.54 with 8, 3.2-3.3 with 4; the kicked Ising's max_terms run at
    2^20 slots 1.41-1.43 s warm with either). With 8 the 2^16-slot kicked Ising ran about 5% slower
    (0.078-0.085 s warm against 0.072-0.077)."""
    if backend == "cpu":
        return 1
    return 32 if capacity < LARGE_MAP_CAPACITY else 8


def config(low: Lowered, truncation: Truncation, capacity: int, stop: bool, backend: str,
           merged: bool = False, exact_order: bool = False, whole_room: bool = False) -> engine.Config:
    """merged: the observable's merge (unit 0) ran before the loop (`merged_observable`): the program
    holds no merge code unless a later unit merges (amplitude damping). A program that stops reports
    fingerprint collisions (Config.report_collisions) unless exact_order: its rooms order exactly.
    whole_room: the program holds the room of the whole buffer where engine.whole_room_for leaves it out."""
    features = engine.features(low.units, low.schedule)
    if merged and schedule.U_MERGE not in low.units.kind[1:]:
        features["units"] = tuple(k for k in features["units"] if k != schedule.U_MERGE)
    rooms = engine.rooms_for(capacity, backend)
    cut_rooms = engine.split_rooms_with_cut(rooms, backend, truncation.rules, stop)
    return engine.Config(capacity=capacity, rules=truncation.rules, stop=stop,
                         sweep=backend != "cpu", rooms=rooms, cut_rooms=cut_rooms,
                         whole_room=whole_room or engine.whole_room_for(backend, cut_rooms, stop),
                         skip_unmet=backend == "cpu",
                         unroll=map_unroll(backend, capacity), units_per_test=_units_per_test(low, backend),
                         report_collisions=stop and not exact_order, **features)


def one_program_per_key(factory):
    """functools.cache for the factories of jitted programs, safe for threads (a CPU batch's members
    run on threads: _drive_side_by_side). Two threads that missed a plain functools.cache together
    each built their own jax.jit, and each compiled the same program: two compilations of the
    kicked-Ising program at once took 15-19 s instead of 6 on the 2-core CPU. (jax.jit itself
    compiles once for threads that call one jitted function together.)"""
    cached = functools.cache(factory)
    lock = threading.Lock()

    @functools.wraps(factory)
    def get(*key):
        with lock:
            return cached(*key)

    get.cache_info, get.cache_clear = cached.cache_info, cached.cache_clear
    return get


@one_program_per_key
def _merge_jit(cfg: engine.Config, backend: str):
    def merge(T, buf, limits):
        out = engine.merge_unit(buf, 0, T, None, limits, cfg)[0]
        return out, jnp.sum(out.live, dtype=jnp.int32)

    return Jitted(merge, compiler_options(backend, cfg.capacity), key=("merge", cfg))


HOST_MERGE_TERMS = 1 << 12  # GPUs: observables of up to this many terms are merged by the host's CPU


def merged_observable(low: Lowered, obs: PauliSum, truncation: Truncation, limits, dtype,
                      backend: str) -> tuple[engine.Buffer, jax.Array]:
    """`_merge_observable`, remembered on the observable for its next call with the same circuit and
    settings (a VQE or sweep loop passes one observable many times: the merge and, on GPUs, a copy
    from the host a call are saved). Its arrays are compared by identity, so a new array is a new
    observable. The caller must not donate the buffer returned."""
    same = (low.tables, obs.x, obs.z, obs.coeffs)
    key = (truncation, np.dtype(dtype).name, backend)
    hit = getattr(obs, "_merged", None)
    if hit is not None and all(a is b for a, b in zip(hit[0], same)) and hit[1] == key:
        return hit[2]
    merged = _merge_observable(low, obs, truncation, limits, dtype, backend)
    obs._merged = (same, key, merged)
    return merged


def _merge_observable(low: Lowered, obs: PauliSum, truncation: Truncation, limits, dtype,
                      backend: str) -> tuple[engine.Buffer, jax.Array]:
    """(buffer, live words): the loop's first unit, the observable's merge (duplicates summed, the rules applied, the words
    in the merge's order), run alone on a buffer of the observable's size: the loop's program then
    needs no merge code (about 1.3 s of the kicked Ising's 7 s compilation on the 2-core CPU), and
    this small program compiles in a fraction of that. The same function on the same words: the
    result is the one the loop's unit would give. On GPUs an observable of up to HOST_MERGE_TERMS
    terms is merged by the CPU backend and its buffer (of the observable's size) copied to the GPU:
    the GPU's compilation of this program took 1.1-1.3 s on an H100, the CPU's 0.3 s. (Larger ones
    merge on the GPU: P3's 30,000 words took 7 ms a call on the host, 2.8 ms on the GPU.)"""
    small = schedule.bucket(len(obs), 64)
    if backend != "cpu" and small <= HOST_MERGE_TERMS:
        with jax.default_device(jax.devices("cpu")[0]):
            merged = _merge_observable(low, obs, truncation, limits, dtype, "cpu")
        return jax.device_put(merged, jax.devices(backend)[0])
    if len(obs) == 1 and not is_traced(obs.coeffs):
        return _one_term_merged(obs, truncation, dtype, small)
    cfg = config(low, truncation, small, True, backend)  # a merge never outgrows its input's buffer
    return _merge_jit(cfg, backend)(low.device_tables(backend), _initial_buffer(obs, small, dtype), limits)


def _one_term_merged(obs: PauliSum, truncation: Truncation, dtype, slots: int) -> tuple[engine.Buffer, int]:
    """The merge of a one-term observable (a single Pauli, the common case), on the host
    (`_merged_on_host`: max_terms >= 1 cuts nothing, so only max_weight and min_abs_coeff can drop
    the term). The merge program's result, without compiling it (0.5-0.7 s of a fresh process on the
    2-core CPU; on GPUs its copy to the device stays)."""
    buf = _merged_on_host(obs, truncation, slots, dtype)
    return buf, np.int32(buf.meta[0])


# ---- the compiled loop -------------------------------------------------------------------------------

# XLA:CPU copies each lax.switch result back into the loop's carry unless copy insertion runs its region
# analysis (three buffer copies per gate on the kicked Ising). A per-executable option, so JAX's global
# settings stay untouched; JAX takes it only on a top-level jit: under your own jax.jit on a CPU, pass
# compiler_options=pauliprop.CPU_COMPILER_OPTIONS there. LLVM at -O1 instead of the default: the kicked
# Ising's loop program (pauli-prop's settings, 2^17 slots) compiles in 8.4-8.8 s instead of 8.7-9.0 s
# on one core of the 2-core CPU and runs as fast (4.0-4.3 s an angle, interleaved runs); -O0 runs 4.5x slower.
CPU_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True, "xla_backend_optimization_level": 1}
# Small buffers run in milliseconds whatever the code's quality, so there XLA:CPU skips its slow
# optimisation: a 4-qubit circuit's program compiles in 0.7 s instead of 2.0 s (and runs in 3 ms, not 1).
FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0}
FAST_COMPILE_CAPACITY = 1 << 12


def compiler_options(backend: str, capacity: int) -> dict | None:
    """The XLA options of the loop's program on this backend at this capacity."""
    if backend != "cpu":
        return None
    return {**CPU_COMPILER_OPTIONS, **(FAST_COMPILE if capacity <= FAST_COMPILE_CAPACITY else {})}


def _forward(T, buf, start, params, limits, table, *, cfg):
    buf, progress = engine.run(T, buf, start, params, limits, cfg)
    return buf, progress, engine.value(buf, table)


@one_program_per_key
def _forward_jit(cfg: engine.Config, batch: bool, backend: str):
    fn = partial(_forward, cfg=cfg)
    if batch:
        fn = vmap_shared(fn, (None, 0, None, 0, None, None))
    return Jitted(fn, compiler_options(backend, cfg.capacity), key=("forward", cfg, batch), donate_argnums=(1,))


def _drive(circuit: Circuit, obs: PauliSum, params, truncation: Truncation, capacity, max_capacity,
           initial_capacity, table, layers: bool | None = None, outgrow: bool = True):
    """Concrete inputs: run the loop, growing the buffer and resuming where it overflowed. A fixed
    capacity runs the same program (one that stops at an overflow) and, only if a unit overflows,
    the rest in the program that keeps the largest terms: the result is the latter's from the start
    (the two agree on every unit that fits), and a call at the capacity that growth found compiles
    nothing new. The overflow's cut happens in the units pp.expectation's traced program runs at
    this capacity (`traced_lowering`: a layer's passes cut in another order than its rotations one
    by one): where this call ran other units, it runs again in those (layers: None picks
    engine.layers_for)."""
    backend = devices.backend()
    layers = engine.layers_for(backend, truncation.rules) if layers is None else layers
    low = lowered(circuit, truncation, backend, layers=layers, support=observable_support(obs))
    dtype = jnp.result_type(float)
    p = params_array(params, circuit.num_params, dtype)
    batch = p.shape[0] if p.ndim == 2 else None
    fixed = capacity is not None
    cap = capacity if fixed else (initial_capacity or default_capacity(obs, truncation))
    if cap < 1 or cap < len(obs):
        raise ValueError(f"capacity {cap} is smaller than the observable's {len(obs)} terms")
    workers = min(batch or 1, memory.cores())
    if backend == "cpu" and workers > 1 and cap >= SIDE_BY_SIDE_CAPACITY:
        return _drive_side_by_side(circuit, obs, np.asarray(params), truncation, capacity, max_capacity,
                                   initial_capacity, table, workers)
    limits = truncation.limits(dtype)
    unit_terms = np.zeros(low.tables["u_kind"].shape[0], np.int32)
    # the observable's merge (unit 0: schedule.schedule puts it first) runs alone, outside the loop
    assert int(low.units.kind[0]) == schedule.U_MERGE, "the schedule's first unit is the observable's merge"
    merged, live = merged_observable(low, obs, truncation, limits, dtype, backend)
    if merged.coeffs.shape[-1] > cap:  # the merge's buffer is bucketed (64 slots at least) and compacted
        merged = merged._replace(words=merged.words[:cap], coeffs=merged.coeffs[:cap], meta=merged.meta[:cap])
    buf = _grown(merged, cap)
    if buf is merged:  # the loop donates its buffer: not the one remembered on the observable
        buf = jax.tree_util.tree_map(lambda a: jax.device_put(a, may_alias=False), buf)  # a copy, compiled by none
    peak = 0  # the loop's own peak starts from the buffer it is given
    if batch is not None:
        buf = jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (batch,) + a.shape), buf)
    start, exact_order, whole_room, cut = 1, False, False, False
    while True:
        cfg = config(low, truncation, cap, not cut, backend, merged=True, exact_order=exact_order,
                     whole_room=whole_room)
        fwd = _forward_jit(cfg, batch is not None, backend)
        buf, prog, val = fwd(low.device_tables(backend), buf, np.int32(start), p, limits, table)
        # one wait for the device, whose copies overlap
        unit, needs, terms, peaks, dropped, live = jax.device_get((prog.unit, prog.need, prog.unit_terms, prog.peak,
                                                                  buf.dropped, live))
        unit_terms[0] = live
        stop = int(np.reshape(unit, -1)[0])
        need = int(np.max(needs))
        terms = terms.max(axis=0) if terms.ndim == 2 else terms
        unit_terms[start:] = terms[start:]
        peak = max(peak, int(np.max(peaks)))
        if need == 0:
            break
        start = stop
        if need == merge.COLLIDED:  # two words' fingerprints collided: the rest in rooms that order exactly
            exact_order = True
            continue
        if need == engine.WHOLE_ROOM:  # a rotation split more than half the buffer: the rest in the program
            whole_room = True  # that holds the room of the whole buffer
            continue
        if fixed:  # the caller's capacity: the rest keeps the largest terms (reported as overflow), in the
            # units a traced call of this capacity runs, so that both cut the same (a layer cuts its own way)
            traced_layers = engine.layers_for(backend, truncation.rules, traced_capacity=cap)
            if layers != traced_layers:
                return _drive(circuit, obs, params, truncation, capacity, max_capacity, initial_capacity, table,
                              layers=traced_layers)
            cut = True
            continue
        grown = next_capacity(cap, need)
        if grown > max_capacity and not outgrow:
            return None
        if grown > max_capacity:
            raise MemoryError(f"propagation needs {need} term slots at {operation_at(low, stop)}, more than "
                              f"capacity {cap} and max_capacity={max_capacity} allow; add truncation "
                              "(min_abs_coeff, max_terms, max_weight) or raise max_capacity")
        cap = grown
        buf = _grown(buf, cap)
    terms = low.terms_per_row(unit_terms)
    # dropped: host arithmetic, no small programs to compile for the stats
    stats = PropagationStats(terms=terms, dropped_norm=dropped, overflow=dropped[..., 4] > 0,
                             capacity=cap, max_terms_seen=np.int32(max(peak, int(terms.max(initial=0)))))
    _warn_overflow(stats.overflow, stats.dropped_norm[..., 4], cap)
    return buf, stats, val


SIDE_BY_SIDE_CAPACITY = 1 << 14  # CPUs: a batch whose buffers start this large runs members side by side


def _drive_side_by_side(circuit, obs, params, truncation, capacity, max_capacity, initial_capacity, table,
                        workers: int):
    """A CPU batch of large members, each driven alone (its own capacity growth, the unbatched
    program) on one of `workers` threads. XLA:CPU runs a member's sorts, gathers and scatters on
    one core, so members side by side use the others: the kicked Ising at pauli-prop's settings (1e5
    terms), two angles on the 2-core CPU in 5.2-5.8 s side by side against 8.3-8.6 s one after the
    other. (One vmapped program instead takes every member through its largest member's room.) The
    results are the members' own; the batch's buffers are padded to the largest capacity."""
    drive = lambda q: _drive(circuit, obs, q, truncation, capacity, max_capacity, initial_capacity, table)
    with ThreadPoolExecutor(workers) as pool:
        runs = list(pool.map(drive, params))
    cap = max(stats.capacity for _, stats, _ in runs)
    buf = jax.tree_util.tree_map(lambda *a: np.stack([np.asarray(x) for x in a]), *[_grown(b, cap) for b, _, _ in runs])
    stats = [s for _, s, _ in runs]
    stats = PropagationStats(terms=np.max([s.terms for s in stats], axis=0),
                             dropped_norm=np.stack([s.dropped_norm for s in stats]),
                             overflow=np.stack([s.overflow for s in stats]), capacity=cap,
                             max_terms_seen=np.int32(max(int(s.max_terms_seen) for s in stats)))
    return buf, stats, np.stack([np.asarray(v) for _, _, v in runs])


# ---- the tiled engine: one program however far the terms grow --------------------------------------------

# Slots a tile of the tiled engine's passes holds. CPUs: small tiles, whose loop costs little there and whose
# data stays in the caches (2-core CPU, 4x4 Ising 8 steps: 0.18-0.25 s warm with 2^10-2^12, 0.92 s with 2^15).
# GPUs: 2^18, where a tile's kernels still fill the GPU and few tiles cost few launches (one H100, 2026-11-28,
# warm 4x4 / 6x6 Ising: 0.81 / 3.1 s with 2^16, 0.44 / 1.8 s with 2^18, 0.44 / 1.7 s with 2^20), and 2^16 for a
# Clifford run's word-by-word map, where a tile wider than the live words is work for nothing (kicked Ising,
# 53K terms: 0.25 s warm with 2^20 tiles, 0.096 s with 2^18, 0.060 s with 2^16).
TILE = {"cpu": 1 << 12}
GPU_TILE = 1 << 18
GPU_CLIFFORD_TILE = 1 << 16
SWEEP = 4  # GPUs: Clifford gates an iteration of a run's gate-by-gate map (kicked Ising on an H100: 8 compiled
#            1.1 s longer for the same 0.060 s warm; 1: 0.084 s)
# A pass's mix by the kernels of fused.py ("gpu"; "interpret": by Pallas's interpreter, for tests), or by XLA ("")
FUSED = {"gpu": "gpu"}
# the most lanes (32 qubits each) a program's words may have for the fused kernels: their code is unrolled over the
# lanes, and Triton's compile grows faster than it (this 2-core AMD, triton 3.9 for sm_90, experiments/HISTORY: the
# largest kernel 1.1 s at 4 lanes, 1.6 s at 8, 4.2 s at 16; at 157 lanes a GPU call did not return in 245 s). Wider
# words run on XLA's passes, whose program does not grow with the lanes
FUSED_MAX_LANES = 8
# the fewest slots a run's buffers have: small circuits of one shape share a program whatever their sizes
MIN_CAPACITY = {"cpu": 1 << 12}
GPU_MIN_CAPACITY = 1 << 16
CPU_FIRST_BUDGET = 1 << 29  # bytes: a CPU run's first buffers take at most this much (zeroed once a process)
MEMORY_SHARE = 0.5  # of the memory free at a process's first run that the buffers may take


def tiled_supported(circuit: Circuit, truncation: Truncation, params, capacity) -> bool:
    """Whether a concrete call runs on the tiled engine (tiled.py): one parameter set, no capacity of the
    caller's, no keep-largest cut and no amplitude damping (their merges are the old loop's: engine.py)."""
    if capacity is not None or truncation.max_terms is not None:
        return False
    if params is not None and np.ndim(params) != 1:
        return False
    return not _has_amplitude_damping(circuit)


def _has_amplitude_damping(circuit: Circuit) -> bool:
    """Whether the circuit damps amplitudes anywhere (cached on it until it changes: a 50,000-gate circuit's
    scan cost 12 ms a call)."""
    cache = _circuit_cache(circuit)
    key = ("amplitude_damp", len(circuit.instructions))
    if key not in cache:
        cache[key] = any(ins.gate.name == "amplitude_damp" for ins in circuit.instructions)
    return cache[key]


# CPUs without the native engine: a run that can never hold more words than this (terms_bound: 8 qubits, or few
# rotations) tries the loop engine (engine.py) first, in a buffer of at most FAST_COMPILE_CAPACITY slots, compiled fast; only a run that
# outgrows it goes on to the tiled engine (from the start). 2-core CPU, 2026-11-28, a fresh process's first call:
# 4 qubits, 15 gates 1.0-1.1 s on the loop against 1.5 s on the tiled engine (warm 7 against 24 ms); 8 qubits, 40
# gates (521 terms at most) 1.1-1.3 s against 2.9-3.3 s (the tiled program, 65,536 slots, compiles slowly).
SMALL_RUN_BOUND = {"cpu": 1 << 16}


def small_run_capacity(circuit: Circuit, obs: PauliSum, truncation: Truncation) -> int | None:
    """The loop engine's capacity for a first try at a small run (SMALL_RUN_BOUND), else None (also for
    a run of this circuit and observable that outgrew the try before: later calls go straight on)."""
    backend = devices.backend()
    most = SMALL_RUN_BOUND.get(backend, 0)
    if not most or len(obs) > min(most, FAST_COMPILE_CAPACITY):
        return None
    low = lowered(circuit, truncation, backend, layers=True, support=observable_support(obs))
    bound = terms_bound(low, len(obs))
    if bound > most or _circuit_cache(circuit).get(_outgrown_key(circuit, obs, truncation)):
        return None
    return min(1 << max(6, (bound - 1).bit_length()), default_capacity(obs, truncation))


def _outgrown_key(circuit: Circuit, obs: PauliSum, truncation: Truncation) -> tuple:
    """Where a circuit remembers (in the cache `lowered` keeps on it, dropped when the circuit grows) that
    a small run of this observable outgrew the loop's first buffer."""
    return len(circuit.instructions), "outgrew the small run", truncation, observable_support(obs), len(obs)


def _drive_concrete(circuit: Circuit, obs: PauliSum, params, truncation: Truncation, capacity, max_capacity,
                    initial_capacity, table, want_terms: bool = False):
    """(value, stats, (x, z, coeffs) of the result when want_terms) of a concrete call: the tiled engine where
    it applies (tiled_supported), small runs first on the loop (small_run_capacity), the rest on the loop."""
    # a concrete batch goes to the native engine set by set, where the tiled engine would take each set
    native_batch = (params is not None and np.ndim(params) == 2 and len(params) and not want_terms
                    and not initial_capacity and native_engine() is not None
                    and tiled_supported(circuit, truncation, None, capacity))
    if native_batch or tiled_supported(circuit, truncation, params, capacity):
        # without the native engine, small runs first on the loop, whose first call compiles in about a second
        # (the tiled engine's programs take longer); the native engine compiles nothing
        small = None if initial_capacity or native_engine() is not None else small_run_capacity(circuit, obs,
                                                                                                  truncation)
        run = small and _drive(circuit, obs, params, truncation, None, FAST_COMPILE_CAPACITY, small, table,
                               outgrow=False)
        if not run:
            if small:
                _circuit_cache(circuit)[_outgrown_key(circuit, obs, truncation)] = True
            if native_batch:
                return _drive_native_batch(circuit, obs, params, truncation, max_capacity, table)
            if native_engine() is not None:
                return _drive_native(circuit, obs, params, truncation, max_capacity, table, want_terms)
            call = _tiled_call(circuit, obs, params, truncation, max_capacity, table)
            return _host_first(call, circuit, obs, params, want_terms) or _run_tiled(call, want_terms)
    else:
        run = _drive(circuit, obs, params, truncation, capacity, max_capacity, initial_capacity, table)
    buf, stats, val = run
    if not want_terms:
        return val, stats, None
    x, z, c = as_sum(buf.words, buf.coeffs, buf.meta)
    if np.ndim(buf.meta) == 1:  # one parameter set: its live terms, as the tiled engine gives them
        x, z, c, live = jax.device_get((x, z, c, merge.live_of(buf.meta)))
        x, z, c = x[live], z[live], c[live]
    return val, stats, (x, z, c)


def terms_bound(low: Lowered, terms: int) -> int:
    """A bound on the words a run can hold at once: 4^n, and the observable's terms doubled by each rotation."""
    rotations = int(np.sum(low.program.kind == program.ROTATION))
    return min(4 ** low.program.num_qubits, terms << min(rotations, 62))


@functools.cache
def _budget(backend: str, first: bool) -> int:
    """Bytes the tiled engine's buffers may take: a share of what was free at the first call of the
    process (so every later call sizes its buffers, and picks its program, the same way); on CPUs,
    whose zeroing of fresh memory costs about 0.4 s a GiB, a first buffer of at most CPU_FIRST_BUDGET."""
    share = int(MEMORY_SHARE * memory.available_bytes(backend))
    return min(share, CPU_FIRST_BUDGET) if backend == "cpu" and first else share


def _floor_pow2(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)


def most_slots(lanes: int, dtype, max_capacity: int, backend: str, first: bool = True) -> int:
    """The most slots a run's buffers may have: the memory budget's and max_capacity's."""
    per_slot = tiled.slot_bytes(lanes, np.dtype(dtype).itemsize)
    return min(_floor_pow2(_budget(backend, first) // per_slot), _floor_pow2(max_capacity))


def tiled_capacity(low: Lowered, terms: int, lanes: int, dtype, max_capacity: int, backend: str) -> int:
    """The slots of a run's first buffers: what the circuit can need at most (terms_bound), within the
    memory budget and max_capacity, and at least MIN_CAPACITY and the observable's bucket."""
    want = 1 << max(6, (max(terms_bound(low, terms), terms) - 1).bit_length())
    most = most_slots(lanes, dtype, max_capacity, backend)
    return max(schedule.bucket(terms, 64), min(max(want, MIN_CAPACITY.get(backend, GPU_MIN_CAPACITY)), most))


def tiled_config(low: Lowered, truncation: Truncation, capacity: int, backend: str) -> tiled.Config:
    features = engine.features(low.units, low.schedule)
    fused = FUSED.get(backend, "") if low.program.gx.shape[1] <= FUSED_MAX_LANES else ""
    tile = TILE.get(backend, GPU_TILE)  # (the fused kernels take every live block in one launch whatever the tile)
    return tiled.Config(capacity=capacity, tile=min(capacity, tile), rules=truncation.rules,
                        units=features["units"], clifford=features["clifford"],
                        unroll=map_unroll(backend, capacity), sweep=1 if backend == "cpu" else SWEEP,
                        clifford_tile=0 if backend == "cpu" else min(capacity, GPU_CLIFFORD_TILE),
                        fused=fused)


_WORKSPACE: dict = {}  # the last run's buffers, (capacity, lanes, dtype) -> tiled.Work: the next run's
_WORKSPACE_LOCK = threading.Lock()


def _take_workspace(capacity: int, lanes: int, dtype) -> tiled.Work:
    """The buffers of the last run if they have this shape (a run leaves them fit for the next: no
    zeroing), else new ones (the old ones are released first)."""
    key = (capacity, lanes, np.dtype(dtype).name)
    with _WORKSPACE_LOCK:
        work = _WORKSPACE.pop(key, None)
        _WORKSPACE.clear()
    if work is None:  # committed to the device as the program's outputs are (else a second call compiles again)
        work = jax.device_put(_empty_work(capacity, lanes, np.dtype(dtype).name)(), devices.device())
    return work


def _keep_workspace(work: tiled.Work):
    key = (work.coeffs.shape[0], work.words.shape[1] // 2, work.coeffs.dtype.name)
    with _WORKSPACE_LOCK:
        _WORKSPACE.clear()
        _WORKSPACE[key] = work


@one_program_per_key
def _empty_work(capacity: int, lanes: int, dtype: str) -> Jitted:
    """The program that makes a run's empty buffers."""
    return Jitted(partial(tiled.empty_work, capacity, lanes, dtype), None, key=("empty_work", capacity, lanes, dtype))


@partial(jax.jit, static_argnums=1)
def _grown_work(work: tiled.Work, capacity: int) -> tiled.Work:
    """The buffers in `capacity` slots, the live prefix (and the empty table) kept."""
    new = tiled.empty_work(capacity, work.words.shape[1] // 2, work.coeffs.dtype)
    c = work.coeffs.shape[0]
    return new._replace(words=new.words.at[:c].set(work.words), coeffs=new.coeffs.at[:c].set(work.coeffs),
                        sins=new.sins.at[:c].set(work.sins))


@partial(jax.jit, static_argnums=1)
def _prefix(work: tiled.Work, rows: int):
    return work.words[:rows], work.coeffs[:rows]


def _tiled_forward(T, work, obs_words, obs_coeffs, n, unit, step, fresh, params, limits, table, *, cfg):
    # the observable into the first rows of a fresh run, by a scatter (a select of the rows read back would
    # make XLA copy the whole buffer), nothing for a run that resumes
    at = jnp.where(fresh, jnp.arange(obs_words.shape[0]), work.coeffs.shape[0])
    work = work._replace(words=work.words.at[at].set(obs_words, mode="drop"),
                         coeffs=work.coeffs.at[at].set(obs_coeffs, mode="drop"),
                         sins=work.sins.at[at].set(0, mode="drop"))
    st = tiled.run(T, work, n, unit, step, params, limits, cfg)
    return st, tiled.value(st.work, st.n, table, cfg.word_tile)


@one_program_per_key
def _tiled_jit(cfg: tiled.Config, backend: str):
    options = compiler_options(backend, cfg.capacity) if backend == "cpu" else GPU_TILED_OPTIONS
    return Jitted(partial(_tiled_forward, cfg=cfg), options, key=("tiled", cfg), donate_argnums=(1,))


# GPUs: the tiled program's loops as CUDA graphs with device-side conditionals, so a loop's test does not
# wait for the host (XLA's default list plus WHILE and CONDITIONAL; one H100, 2026-11-28: the 4x4 Ising
# 0.62 -> 0.44 s warm, the kicked Ising 0.124 -> 0.101 s). A per-program option: JAX's flags stay as they are.
GPU_TILED_OPTIONS = {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"}


class _TiledCall(NamedTuple):
    """A concrete call's inputs to the tiled engine, made in the caller's thread: the run needs nothing else
    (so a background thread can run it, runtime/background.py), and they fix its first program."""

    low: Lowered
    backend: str
    device: jax.Device
    dtype: np.dtype
    x64: bool
    params: np.ndarray
    obs_words: np.ndarray  # (rows, 2W) the merged observable, padded to a bucketed number of rows
    obs_coeffs: np.ndarray
    terms: int
    lanes: int
    dropped: np.ndarray  # what the observable's own merge dropped
    capacity: int  # the first buffers' slots
    truncation: Truncation
    max_capacity: int
    table: np.ndarray  # the state's overlap table on the program's qubits (on_cone)
    num_lanes: int  # the circuit's (the words' lanes where the program's qubits are renumbered: off_cone)
    circuit_table: np.ndarray  # the state's overlap table on the circuit's qubits (the host's run: _host_first)

    def first_args(self, work) -> tuple:
        """The first program's arguments, with `work` the buffers (or their jax.ShapeDtypeStruct)."""
        return (self.low.device_tables(self.backend), work, self.obs_words, self.obs_coeffs, np.int32(self.terms),
                np.int32(1), np.int32(0), np.bool_(True), self.params, self.truncation.limits(self.dtype),
                self.table)

    def first_program(self) -> tuple:
        """(the first program, the signature of its arguments): what `ready` and a background job's key read."""
        program = _tiled_jit(tiled_config(self.low, self.truncation, self.capacity, self.backend), self.backend)
        return program, self.first_args(_work_shape(self.capacity, self.lanes, np.dtype(self.dtype).name))


@functools.cache
def _work_shape(capacity: int, lanes: int, dtype: str):
    """The shapes and dtypes of a run's buffers (jax.ShapeDtypeStruct): made once, since every GPU call asks whether
    its program is ready (tracing them each time cost the kicked Ising's 25 ms warm call about 3 ms)."""
    return jax.eval_shape(partial(tiled.empty_work, capacity, lanes, dtype))


def _tiled_call(circuit: Circuit, obs: PauliSum, params, truncation: Truncation, max_capacity: int,
                table) -> _TiledCall:
    backend = devices.backend()
    low = lowered(circuit, truncation, backend, layers=True, support=observable_support(obs), renumber=True)
    dtype = np.dtype(jnp.result_type(float))
    p = params_array(params, circuit.num_params, dtype)
    x, z, cone_table = on_cone(low, obs.x, obs.z, table)
    words, coeffs, dropped0 = tiled.host_merge(x, z, obs.coeffs, truncation.limits(dtype))
    t, lanes = len(words), x.shape[1]
    rows = schedule.bucket(t, 64)
    obs_words = np.zeros((rows, 2 * lanes), np.uint32)
    obs_words[:t] = words
    obs_coeffs = np.zeros(rows, dtype)
    obs_coeffs[:t] = coeffs
    cap = tiled_capacity(low, t, lanes, dtype, max_capacity, backend)
    return _TiledCall(low, backend, devices.device(), dtype, bool(jax.config.jax_enable_x64), p, obs_words,
                      obs_coeffs, t, lanes, np.asarray(dropped0, dtype), cap, truncation, max_capacity,
                      np.asarray(cone_table), obs.num_lanes, np.asarray(table))


def _run_tiled(call: _TiledCall, want_terms: bool = False):
    """The tiled engine's run of a call. One program runs the whole circuit; only a CPU run that outgrows
    its first buffers continues in a second, sized from the free memory. Past the memory: a MemoryError."""
    low, backend, dtype, lanes, cap, max_capacity = (call.low, call.backend, call.dtype, call.lanes, call.capacity,
                                                      call.max_capacity)
    work = _take_workspace(cap, lanes, dtype)
    unit_terms = np.zeros(low.tables["u_kind"].shape[0], np.int32)
    unit_terms[0] = call.terms
    n, unit, step, fresh, peak, dropped = call.terms, 1, 0, True, call.terms, call.dropped
    args = call.first_args(work)
    while True:
        cfg = tiled_config(low, call.truncation, cap, backend)
        st, val = _tiled_jit(cfg, backend)(*args)
        work = st.work
        n, stop, step, need, more, terms, top, val = jax.device_get((st.n, st.unit, st.step, st.need, st.dropped,
                                                                     st.terms, st.peak, val))
        n, need = int(n), int(need)
        unit_terms[unit:stop + 1] = terms[unit:stop + 1]
        dropped = dropped + more
        peak = max(peak, int(top))
        if need == 0:
            break
        unit, step, fresh = int(stop), int(step), False
        grown = min(1 << (2 * need - 1).bit_length(), most_slots(lanes, dtype, max_capacity, backend, first=False))
        if grown < need or grown <= cap:
            per_slot = tiled.slot_bytes(lanes, np.dtype(dtype).itemsize)
            _keep_workspace(work)
            raise MemoryError(
                f"propagation needs {need} term slots at {operation_at(low, unit)}, more than the {cap} slots "
                f"({per_slot} bytes each) that max_capacity={max_capacity} and {MEMORY_SHARE:.0%} of the "
                f"{memory.available_bytes() / 2**30:.1f} GiB free allow; add truncation (min_abs_coeff, "
                "max_weight, max_terms) or raise max_capacity")
        work, cap = _grown_work(work, grown), grown
        args = (args[0], work, args[2], args[3], np.int32(n), np.int32(unit), np.int32(step), np.bool_(fresh),
                *args[8:])
    out = None
    if want_terms:
        w, c = jax.device_get(_prefix(work, schedule.bucket(max(n, 1), 64)))
        out = (*off_cone(low, w[:n, :lanes], w[:n, lanes:], call.num_lanes), c[:n])
    _keep_workspace(work)
    terms = low.terms_per_row(unit_terms)
    stats = PropagationStats(terms=terms, dropped_norm=dropped, overflow=np.bool_(False), capacity=cap,
                             max_terms_seen=np.int32(max(peak, int(terms.max(initial=0)))))
    return val, stats, out


# ---- GPUs: the host answers while the GPU's program compiles -----------------------------------------------

# A GPU's concrete call whose program is not compiled (not in this process, not stored: an empty cache) waits
# seconds for XLA (the 127-qubit kicked Ising: 0.7 s tracing, 1.1 s lowering, 3.5 s compiling on an H200); the
# native engine on the host's cores answers it in a fraction of that. So such a call runs there, and then a
# thread (runtime/background.py) runs it on the GPU: the program is compiled and stored, and the calls after it,
# once it is, run on the GPU; calls made meanwhile run on the host, leaving cores to the compilation (one at a
# time: a call whose program is not compiled while another compiles starts none). The values
# are the same run's (the engines make the same truncation decisions; sums in another order).
# The two do not race: on one H200's 16-core host (2026-11-29) the compilation beside the host's run slowed both
# (the 2D Ising 4x4's host run 1.0 s alone, 2.3-4.8 s beside it; the 8x8's GPU answer 5.6-5.9 s against 4.0 s
# alone), so the host's run comes first, alone. PAULIPROP_HOST_FIRST=0 turns it off (every call waits for the
# GPU's program).
HOST_FIRST = "PAULIPROP_HOST_FIRST"
HOST_FIRST_BACKENDS = frozenset({"gpu"})
HOST_CORES_FOR_COMPILING = 2  # cores a host run leaves to a compilation under way (its thread, XLA's)


def _host_first(call: _TiledCall, circuit: Circuit, obs: PauliSum, params, want_terms: bool):
    """Where `call`'s GPU program is not ready: the native engine's answer, after which the GPU's run starts in the
    background (unless one of that program runs there already); else None."""
    if (call.backend not in HOST_FIRST_BACKENDS or os.environ.get(HOST_FIRST, "1") == "0"
            or os.environ.get(NATIVE, "1") == "0" or _native_module() is None):
        return None
    jitted, args = call.first_program()
    if jitted.ready(*args):
        return None
    key = ("tiled", jitted, signature(args))
    # one host core short, OpenMP's barriers wait on a preempted thread: leave cores to a compilation under way
    threads = _native_module().threads() - HOST_CORES_FOR_COMPILING if background.busy() else None
    answer = _drive_native(circuit, obs, params, call.truncation, call.max_capacity, call.circuit_table, want_terms,
                           threads)

    def on_the_gpu():
        with jax.default_device(call.device), jax.enable_x64(call.x64):
            _run_tiled(call)

    # one compilation at a time (a sweep over many circuit shapes queues none: a shape's call after the last
    # compilation ended starts the next)
    background.start(key, on_the_gpu, "the GPU's first run (compiling)", alone=True)
    return answer


# ---- the native CPU engine (native.py, its C loops built at install) -------------------------------------------

NATIVE = "PAULIPROP_NATIVE"  # set to 0 to run CPUs' concrete calls on the tiled engine although the C library is built


@functools.cache
def _native_module():
    try:
        from . import native
    except ImportError:  # its C library was not built (no C compiler at install)
        return None
    return native


def native_engine():
    """native.py where a concrete call runs on it (CPUs, its C library built, PAULIPROP_NATIVE not 0), else None."""
    if devices.backend() != "cpu" or os.environ.get(NATIVE, "1") == "0":
        return None
    return _native_module()


def _native_lowered(circuit: Circuit, obs: PauliSum, truncation: Truncation) -> tuple:
    """(the circuit lowered for the native engine, on its observable's light cone's qubits (lowered's renumber),
    its tables): made once, kept on the circuit."""
    low = lowered(circuit, truncation, "cpu", layers=True, support=observable_support(obs), renumber=True)
    tables = low.on_device.get("native")
    if tables is None:
        tables = low.on_device["native"] = _native_module().Tables(low.schedule, low.units)
    return low, tables


def _drive_native(circuit: Circuit, obs: PauliSum, params, truncation: Truncation, max_capacity: int, table,
                  want_terms: bool = False, threads_at_most: int | None = None):
    """A concrete call on the native engine: (value, PropagationStats, (x, z, coeffs) of the result when
    want_terms). Its buffers are numpy arrays: a run that outgrows them continues in larger ones (nothing
    to compile); past the memory, a MemoryError. threads_at_most: native.run's."""
    native = _native_module()
    low, tables = _native_lowered(circuit, obs, truncation)
    dtype = np.dtype(jnp.result_type(float))
    p = params_array(params, circuit.num_params, dtype)
    angles = tables.angles(p)
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    x, z, table = on_cone(low, obs.x, obs.z, table)
    limits = truncation.limits(dtype)
    words, coeffs, dropped0 = tiled.host_merge(x, z, obs.coeffs, limits)
    t, lanes = len(words), x.shape[1]
    per_slot = native.slot_bytes(lanes, dtype.itemsize)
    most = min(_floor_pow2(_budget("cpu", False) // per_slot), _floor_pow2(max_capacity))
    hashes = native.hash_rows(lanes)  # the run's bucket functionals (they follow the words through Cliffords)
    # the layout the last run of this circuit ended in, if it fits: a warm call lays out once
    observable = native.loaded(words, coeffs.astype(dtype), dtype)
    k, cap = tables.last_layout or (native.bucket_bits(t), 0)
    ws, slots = native.laid_out(observable, hashes, k, cap, most)
    if ws is None:
        ws, slots = native.laid_out(observable, hashes, native.bucket_bits(t), 0, most)
    if ws is None:
        raise MemoryError(f"the observable's {t} terms need {slots} term slots, more than the {most} slots that "
                          f"max_capacity={max_capacity} and the memory allow")
    unit_terms = np.zeros(low.units.length, np.int32)
    unit_terms[0] = t
    dropped = np.asarray(dropped0, np.float64).copy()
    at = native.Progress(1, 0, 0, t)
    while True:
        at = native.run(tables, ws, hashes, at.unit, at.step, cos, sin, limits, truncation.rules, unit_terms,
                        dropped, at.peak, threads_at_most=threads_at_most)
        if at.need == 0:
            break
        # more buckets for more words, or larger ones
        k, bits = ws.bucket_bits, native.bucket_bits(ws.n)
        bigger, slots = native.laid_out(ws, hashes, max(k, bits), 2 * ws.cap if bits <= k else 0, most,
                                        threads_at_most)
        if bigger is None:
            raise MemoryError(
                f"propagation needs {slots} term slots at {operation_at(low, at.unit)} ({ws.n} live words in "
                f"{len(ws.count)} buckets, one needing {at.need} of its {ws.cap}), more than the {most} slots "
                f"({per_slot} bytes each) that max_capacity={max_capacity} and {MEMORY_SHARE:.0%} of the "
                f"{memory.available_bytes('cpu') / 2**30:.1f} GiB free allow; add truncation (min_abs_coeff, "
                "max_weight, max_terms) or raise max_capacity")
        ws = bigger
    val = np.asarray(native.value(ws.words, ws.coeffs, ws.count, np.asarray(table, np.float64)), dtype)
    out = None
    if want_terms:
        w, c = native.live_terms(ws)
        out = (*off_cone(low, w[:, :lanes], w[:, lanes:], obs.num_lanes), c)
    tables.last_layout = (ws.bucket_bits, ws.cap)
    native.keep_workspace(ws)
    terms = low.terms_per_row(unit_terms)
    stats = PropagationStats(terms=terms, dropped_norm=dropped.astype(dtype), overflow=np.bool_(False),
                             capacity=ws.capacity, max_terms_seen=np.int32(max(at.peak, int(terms.max(initial=0)))))
    return val, stats, out


def _drive_native_batch(circuit: Circuit, obs: PauliSum, params, truncation: Truncation, max_capacity: int, table):
    """A concrete batch (B, P) on the native engine: the sets one after another (each warm in the last one's
    buffers), with the batched loop's stats: terms after each row the most of any set, dropped norms and
    overflow per set."""
    runs = [_drive_native(circuit, obs, p, truncation, max_capacity, table) for p in np.asarray(params)]
    stats = [s for _, s, _ in runs]
    return np.stack([v for v, _, _ in runs]), PropagationStats(
        terms=np.max([s.terms for s in stats], axis=0), dropped_norm=np.stack([s.dropped_norm for s in stats]),
        overflow=np.zeros(len(stats), bool), capacity=max(s.capacity for s in stats),
        max_terms_seen=np.int32(max(int(s.max_terms_seen) for s in stats))), None


def operation_at(low: Lowered, unit: int) -> str:
    ops = low.rows[np.flatnonzero(low.units.unit_of_op == unit)]
    return f"row {int(ops.max())} of the lowered circuit" if len(ops) else f"unit {unit}"


def _warn_overflow(overflow, dropped, capacity):
    if bool(np.any(np.asarray(overflow))):
        warnings.warn(f"pauliprop: capacity {capacity} overflowed; dropped 1-norm {float(np.max(dropped)):.3g}. "
                      "Pass a larger capacity (or truncation.max_terms).", RuntimeWarning, stacklevel=3)


def propagate(circuit: Circuit, observable: PauliSum, params=None, truncation: Truncation | None = None,
              capacity: int | None = None, max_capacity: int = 1 << 26, initial_capacity: int | None = None):
    """Heisenberg-propagate `observable` backward through `circuit`: returns (PauliSum, PropagationStats).

    capacity: slots in the term buffer (static). None: chosen automatically and, outside a jax
    trace, grown when a step would overflow it (up to max_capacity), resuming at that step. With a
    given capacity (and inside a trace) an overflow keeps the largest terms and is reported in the
    stats and by a warning. initial_capacity: where the automatic growth starts.
    params: (P,) or a batch (B, P); a batch gives a PauliSum whose arrays have a leading batch axis.
    """
    truncation = truncation or NO_TRUNCATION
    check_inputs(circuit, observable, params)
    if is_traced(params, observable):
        return _propagate_traced(circuit, observable, params, truncation, capacity, initial_capacity)
    _, stats, (x, z, c) = _drive_concrete(circuit, observable, params, truncation, capacity, max_capacity,
                                          initial_capacity, np.ones((32 * observable.num_lanes, 4)), want_terms=True)
    return PauliSum(x, z, c, observable.num_qubits), stats


@jax.jit
def as_sum(words, coeffs, meta):
    """(x, z, coeffs with dead slots 0) of a buffer: one dispatch, not one per array."""
    b = engine.Buffer(words, coeffs, meta, None)
    return b.x, b.z, jnp.where(b.live, coeffs, 0)


def _propagate_traced(circuit, observable, params, truncation, capacity, initial_capacity):
    """Under a trace: a fixed capacity, and a loop of static trip counts that JAX differentiates."""
    if params is not None and _ndim(params) == 2:
        return jax.vmap(lambda q: _propagate_traced(circuit, observable, q, truncation, capacity, initial_capacity))(params)
    backend = devices.backend()
    low = lowered(circuit, truncation, backend, support=observable_support(observable))
    dtype = jnp.result_type(float)
    cap = capacity or initial_capacity or default_capacity(observable, truncation)
    p = params_array(params, circuit.num_params, dtype)
    buf = _initial_buffer(observable, cap, dtype)
    longest = int(max(low.units.count.max(initial=1), 1))
    cfg = config(low, truncation, cap, False, backend)._replace(static_loops=longest)
    buf, prog = _propagate_static(low.tables, buf, p, truncation.limits(dtype), cfg=cfg)
    terms = low.terms_per_row(prog.unit_terms)
    stats = PropagationStats(terms, buf.dropped, buf.dropped[4] > 0, cap,
                             jnp.maximum(prog.peak, jnp.max(terms, initial=0)))
    jax.debug.callback(_warn_overflow, stats.overflow, stats.dropped_norm[4], cap)
    return PauliSum(buf.x, buf.z, jnp.where(buf.live, buf.coeffs, 0), observable.num_qubits), stats


@partial(jax.jit, static_argnames=("cfg",))
def _propagate_static(T, buf, params, limits, *, cfg):
    # jitted also under a caller's trace, so circuits of one shape share one compilation
    return engine.run(T, buf, 0, params, limits, cfg)


# ---- expectation values, with reverse mode --------------------------------------------------------------

def state_table(state, num_qubits: int, num_lanes: int):
    """algebra.overlap.overlap_table of the state, checked first; a state given as a string is kept (read-only) for the
    next call (5,000 qubits: 25 ms a call to parse and pack)."""
    if isinstance(state, str):
        return _eigenstate_table(state, num_qubits, num_lanes)
    parse_state(state, num_qubits)  # fail before propagating
    return overlap_table(state, num_qubits, num_lanes)


@functools.lru_cache(maxsize=64)
def _eigenstate_table(state: str, num_qubits: int, num_lanes: int) -> np.ndarray:
    parse_state(state, num_qubits)
    table = overlap_table(state, num_qubits, num_lanes)
    table.setflags(write=False)
    return table


def expectation(circuit: Circuit, observable: PauliSum, params=None, state="0",
                truncation: Truncation | None = None, method: str = "pauli", capacity: int | None = None,
                return_stats: bool = False, initial_capacity: int | None = None):
    """<psi| observable |psi> with psi = circuit |state>: a jax scalar, differentiable in params.

    method: "pauli" (backward Pauli propagation, with truncation) or "statevector" (exact, small n).
    state: "0", "+", a bitstring such as "0110" (character q is qubit q), a string over
    0 1 + - r l per qubit, or an (n, 3) array of Bloch vectors (a product state).
    params: (P,), or a batch (B, P) of parameter sets that propagate together (values of shape (B,); on
    the native CPU engine a concrete batch runs set by set, with the same values and stats).
    Differentiable (reverse mode) in params and in the observable's coefficients: the derivative of
    the estimator with its truncation decisions frozen, by the engine's reverse mode (adjoint.py);
    under jax.vmap the batch shares the engine's branches (runtime/batching.py). Under a trace pass `capacity`.
    """
    check_inputs(circuit, observable, params)
    table = state_table(state, circuit.num_qubits, observable.num_lanes)
    if method == "statevector":
        if truncation is not None and not truncation.is_exact:
            raise ValueError("method='statevector' is exact: it takes no truncation")
        if params is not None and _ndim(params) == 2:
            val = jax.vmap(lambda p: statevector.expectation(circuit, observable, p, state=state))(jnp.asarray(params))
        else:
            val = statevector.expectation(circuit, observable, params, state=state)
        return (val, None) if return_stats else val
    if method != "pauli":
        raise ValueError(f"unknown method {method!r}: use 'pauli' or 'statevector'")
    truncation = truncation or NO_TRUNCATION
    if is_traced(params, observable):
        if params is not None and _ndim(params) == 2:
            run = lambda p: expectation(circuit, observable, p, state, truncation, method, capacity, True,
                                        initial_capacity)
            val, stats = jax.vmap(run)(params)
        else:
            val, stats = _traced_estimate(circuit, observable, params, truncation, capacity, initial_capacity, table)
        return (val, stats) if return_stats else val
    val, stats, _ = _drive_concrete(circuit, observable, params, truncation, capacity, 1 << 26, initial_capacity,
                                    table)
    val = jax.device_put(val)  # a transfer, where jnp.asarray compiles a program on a fresh process's first call
    return (val, stats) if return_stats else val


def traced_lowering(circuit: Circuit, observable: PauliSum, truncation: Truncation, capacity: int,
                    backend: str | None = None) -> Lowered:
    """The lowering of a traced estimate (pp.expectation under jit, grad or vmap) at this capacity."""
    backend = backend or devices.backend()
    layers = engine.layers_for(backend, truncation.rules, traced_capacity=capacity)
    return lowered(circuit, truncation, backend, layers=layers, support=observable_support(observable))


def traced_program(circuit: Circuit, observable: PauliSum, truncation: Truncation, capacity: int, backend: str,
                   merged: bool = True) -> tuple:
    """(Lowered, engine.Config, adjoint.RecordRows): what a traced estimate's program is made of at this
    capacity. merged: the observable's merge ran before it (`_merged_on_host`)."""
    low = traced_lowering(circuit, observable, truncation, capacity, backend)
    cfg = config(low, truncation, capacity, False, backend, merged=merged)
    return low, cfg, adjoint.record_shape(low.units, low.schedule, truncation)


def gradient_records(circuit: Circuit, observable: PauliSum, truncation: Truncation, capacity: int) -> tuple:
    """(adjoint.RecordRows, bytes of the full record stack of one parameter set) of a traced gradient."""
    _, cfg, rows = traced_program(circuit, observable, truncation, capacity, devices.backend())
    return rows, rows.full * adjoint.row_bytes(cfg, jnp.result_type(float), observable.num_lanes)


def _merged_on_host(obs: PauliSum, truncation: Truncation, capacity: int, dtype) -> engine.Buffer | None:
    """The observable's merge (the loop's unit 0) from its concrete words, for a traced estimate: the
    duplicates found on the host (np.unique), their coefficients summed by one scatter-add (traced
    where they are), max_weight and min_abs_coeff applied and charged as the merge charges them (a
    term to its first rule, truncation.violations), the distinct words in the first slots. So the
    loop's program holds no merge code (64-qubit TFI on the 2-core CPU: the value's compilation 2.5 ->
    1.7 s, the gradient's 3.3 -> 1.7 s). None where the merge could cut (more distinct words than
    max_terms): the loop's merge unit does it then."""
    w = obs.num_lanes
    distinct, inverse, weights = tiled.distinct_words(obs.x, obs.z)
    u = len(distinct)
    if truncation.max_terms is not None and u > truncation.max_terms:
        return None
    limits = truncation.limits(dtype)  # the values the loop compares with, in its dtypes
    xp = jnp if is_traced(obs.coeffs) else np
    if xp is jnp:
        summed = jnp.zeros(u, dtype).at[inverse].add(jnp.asarray(obs.coeffs, dtype))
    else:
        summed = np.zeros(u, dtype)
        np.add.at(summed, inverse, np.asarray(obs.coeffs, dtype))
    heavy, small, _ = violations(limits, summed, weights)
    mag = xp.abs(summed)
    keep = ~heavy & ~small
    full = np.zeros((capacity, 2 * w), np.uint32)
    full[:u] = distinct if xp is jnp else np.where(keep[:, None], distinct, 0)  # as the program: no dropped word
    pad = lambda a: xp.concatenate([a, xp.zeros(capacity - u, a.dtype)])
    dropped = xp.stack([xp.sum(xp.where(heavy, mag, 0)), xp.sum(xp.where(small, mag, 0))]).astype(dtype)
    return engine.Buffer(full, pad(xp.where(keep, summed, 0).astype(dtype)), pad(keep.astype(np.int32)),
                         xp.concatenate([dropped, xp.zeros(3, dtype)]))


def _traced_estimate(circuit, observable, params, truncation, capacity, initial_capacity, table):
    backend = devices.backend()
    dtype = jnp.result_type(float)
    cap = capacity if capacity is not None else (initial_capacity or default_capacity(observable, truncation))
    if cap < 1 or cap < len(observable):
        raise ValueError(f"capacity {cap} is smaller than the observable's {len(observable)} terms")
    p = params_array(params, circuit.num_params, dtype)
    buf = _merged_on_host(observable, truncation, cap, dtype)
    merged = buf is not None
    buf = buf if merged else _initial_buffer(observable, cap, dtype)
    low, cfg, rows = traced_program(circuit, observable, truncation, cap, backend, merged)
    words = (buf.words, buf.meta)
    val, (dropped, unit_terms, peak) = _estimate_jit(low.tables, words, buf.coeffs, p, truncation.limits(dtype),
                                                     table, cfg=cfg, rows=rows)
    dropped = dropped + buf.dropped  # the merge's, where it ran here
    terms = low.terms_per_row(unit_terms)
    stats = PropagationStats(terms, dropped, dropped[4] > 0, cap, jnp.maximum(peak, jnp.max(terms, initial=0)))
    jax.debug.callback(_warn_overflow, stats.overflow, stats.dropped_norm[4], cap)
    return val, stats


@partial(jax.jit, static_argnames=("cfg", "rows"))
def _estimate_jit(T, words, coeffs, params, limits, table, *, cfg, rows):
    # jitted also under a caller's trace: the tables stay arguments, not constants of the caller's
    # program, so circuits of one shape share one compilation
    return _estimate((cfg, rows), T, words, coeffs, params, limits, table)


def _buffer(words, coeffs):
    return engine.Buffer(words[0], coeffs, words[1], jnp.zeros(5, coeffs.dtype))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _estimate(static, T, words, coeffs, params, limits, table):
    """<state| propagated observable |state> and (dropped, unit terms, peak). Its reverse mode is the
    engine's adjoint (_estimate_fwd); batches of it share their branches (runtime/batching.py)."""
    return batched(partial(_value, static))(T, words, coeffs, params, limits, table)


def _value(static, T, words, coeffs, params, limits, table):
    cfg, _ = static
    buf, progress = engine.run(T, _buffer(words, coeffs), 0, params, limits, cfg)
    return engine.value(buf, table), (buf.dropped, progress.unit_terms, progress.peak)


def _estimate_fwd(static, T, words, coeffs, params, limits, table):
    return batched(partial(_value_and_grad, static))(T, words, coeffs, params, limits, table)


def _value_and_grad(static, T, words, coeffs, params, limits, table):
    cfg, rows = static
    val, dropped, progress, d_params, d_coeffs = adjoint.value_and_grad(T, _buffer(words, coeffs), params, limits,
                                                                        table, cfg, rows)
    return (val, (dropped, progress.unit_terms, progress.peak)), (d_params, d_coeffs)


def _estimate_bwd(static, res, cotangents):
    d_params, d_coeffs = res
    ct = cotangents[0]
    return None, None, ct * d_coeffs, ct * d_params, None, None


_estimate.defvjp(_estimate_fwd, _estimate_bwd)
