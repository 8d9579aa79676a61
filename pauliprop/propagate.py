"""Backward Pauli propagation: the observable walks the circuit from the last gate to the first.

`propagate_buffers` is the pure core: a `lax.scan` over the reversed Program with a fixed-capacity
term buffer (static shapes, so it jits, vmaps and differentiates, and compile time does not grow
with depth). `propagate` and `expectation` wrap it: they lower the circuit, pick a capacity and,
outside of a trace, grow it and retry when it overflowed, so a result is never silently lossy.
"""

from __future__ import annotations

import functools
import math
import warnings
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import program as _p
from . import truncation as _t
from . import words as _w
from .circuit import Circuit
from . import merge as _m
from .paulisum import PauliSum
from .prefix import first_set, on_cpu


class PropagationStats(NamedTuple):
    """What propagation did: live terms after each operation (circuit order), the 1-norm each rule
    dropped (order of `truncation.RULES`), whether the capacity overflowed, and the capacity."""

    terms: jax.Array  # (L,) int32, terms after each operation, in circuit order
    dropped_norm: jax.Array  # (5,) float: max_weight, min_abs_coeff, max_sins, max_terms, overflow
    overflow: jax.Array  # bool
    capacity: int
    max_terms_seen: jax.Array  # int32, the largest live count

    @property
    def total_dropped_norm(self):
        return jnp.sum(self.dropped_norm)

    def summary(self) -> str:
        d = dict(zip(_t.RULES, np.asarray(self.dropped_norm).tolist()))
        return (f"capacity {self.capacity}, peak terms {int(self.max_terms_seen)}, final terms "
                f"{int(self.terms[0]) if len(self.terms) else 0}, overflow {bool(self.overflow)}, dropped 1-norm {d}")


class _Buffer(NamedTuple):
    x: jax.Array  # (C, W) uint32
    z: jax.Array  # (C, W) uint32
    coeffs: jax.Array  # (C,)
    sins: jax.Array  # (C,) int32, sine branches taken
    live: jax.Array  # (C,) bool; the live words are distinct, dead slots are free
    dropped: jax.Array  # (5,) 1-norm dropped per truncation rule


def _angle(row, params):
    idx = row["param_index"]
    p = params[jnp.maximum(idx, 0)] if params.shape[0] else jnp.zeros((), row["offset"].dtype)
    return jnp.where(idx >= 0, row["scale"] * p, 0.0) + row["offset"]


def _drop_rules(buf: _Buffer, trunc: _t.Truncation) -> _Buffer:
    """Apply the per-term rules in place (a dropped slot becomes free)."""
    if trunc.max_weight is None and trunc.min_abs_coeff is None:
        return buf
    drop_w, drop_c, _ = _t.violations(trunc, buf.coeffs, _w.weight(buf.x, buf.z), buf.sins)
    drop_w, drop_c = drop_w & buf.live, drop_c & buf.live
    mag = jnp.abs(buf.coeffs)
    dropped = buf.dropped.at[0].add(jnp.sum(jnp.where(drop_w, mag, 0))).at[1].add(jnp.sum(jnp.where(drop_c, mag, 0)))
    gone = drop_w | drop_c
    return buf._replace(coeffs=jnp.where(gone, 0, buf.coeffs), live=buf.live & ~gone, dropped=dropped)


def _local_code(x, z, a, b):
    return (_w.get_site(x, a) | _w.get_site(z, a) << 1 | _w.get_site(x, b) << 2
            | _w.get_site(z, b) << 3).astype(jnp.int32)


def _remap(buf, touched, image, trunc, capacity):
    """Apply a word map (a Clifford: it permutes signed words) to the `touched` live words.

    image(x, z, coeffs) -> (x, z, coeffs). None touched: nothing to do (common outside the light
    cone). A few (up to C/16): they are gathered into the smallest room that holds them, so the cost
    follows their count. More: one pass over the buffer, which measured faster than gathering them.
    Magnitudes and sine counts stay, so only max_weight can drop a moved word.
    """
    count = jnp.sum(touched)

    def heavy_out(b, x, z, c, mask, at):
        heavy = mask & (_w.weight(x, z) > trunc.max_weight)
        return (b.dropped.at[0].add(jnp.sum(jnp.where(heavy, jnp.abs(c), 0))),
                b.live.at[at].set(b.live[at] & ~heavy, mode="drop") if at is not None else b.live & ~heavy,
                jnp.where(heavy, 0, c))

    def gathered(b, room):
        src = first_set(touched, room)
        at = jnp.where(src < capacity, src, capacity)
        s = jnp.minimum(src, capacity - 1)
        x, z, c = image(b.x[s], b.z[s], b.coeffs[s])
        live, dropped = b.live, b.dropped
        if trunc.max_weight is not None:
            dropped, live, c = heavy_out(b, x, z, c, src < capacity, at)
        return b._replace(x=b.x.at[at].set(x, mode="drop"), z=b.z.at[at].set(z, mode="drop"),
                          coeffs=b.coeffs.at[at].set(c, mode="drop"), live=live, dropped=dropped)

    def everywhere(b):
        x, z, c = image(b.x, b.z, b.coeffs)
        x, z = jnp.where(touched[:, None], x, b.x), jnp.where(touched[:, None], z, b.z)
        c = jnp.where(touched, c, b.coeffs)
        live, dropped = b.live, b.dropped
        if trunc.max_weight is not None:
            dropped, live, c = heavy_out(b, x, z, c, touched, None)
        return b._replace(x=x, z=z, coeffs=c, live=live, dropped=dropped)

    rooms = tuple(r for r in (capacity // 64, capacity // 16) if r >= 256)
    pick = jnp.where(count == 0, 0, 1 + jnp.sum(count > jnp.asarray(rooms)))
    return lax.switch(pick, [lambda b: b] + [partial(gathered, room=r) for r in rooms] + [everywhere], buf)


def _clifford(buf, row, params, trunc, capacity):
    a, b = row["qubits"][0], row["qubits"][1]

    def image(x, z, c):
        code = _local_code(x, z, a, b)
        img = row["table"][code].astype(jnp.uint32)
        one = jnp.uint32(1)
        x = _w.set_site(_w.set_site(x, a, img & one), b, (img >> 2) & one)
        z = _w.set_site(_w.set_site(z, a, (img >> 1) & one), b, (img >> 3) & one)
        return x, z, c * row["sign"][code].astype(c.dtype)

    # words that are the identity on both sites stay where they are
    return _remap(buf, buf.live & (_local_code(buf.x, buf.z, a, b) != 0), image, trunc, capacity)


def _split(buf, new_x, new_z, new_coeffs, new_sins, new_live, old_coeffs, trunc, capacity):
    """Old terms (with updated coefficients) plus new terms -> merged, truncated buffer."""
    cat = lambda a, b: jnp.concatenate([a, b])
    x, z, c, s, live, dropped = _m.full_merge(
        cat(buf.x, new_x), cat(buf.z, new_z), cat(old_coeffs, new_coeffs), cat(buf.sins, new_sins),
        cat(buf.live, new_live), trunc, capacity)
    return _Buffer(x, z, c, s, live, buf.dropped + dropped)


def _rotation(buf, row, params, trunc, capacity):
    angle = _angle(row, params).astype(buf.coeffs.dtype)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    gx, gz = row["gx"], row["gz"]
    ac = buf.live & _w.anticommutes(buf.x, buf.z, gx, gz)
    splitting = jnp.sum(ac)

    def split(b, room):
        x, z, c, s, live, dropped = _m.pair_split_uncapped(b.x, b.z, b.coeffs, b.sins, b.live, ac, gx, gz, cos,
                                                           sin, trunc, capacity, room)
        return _Buffer(x, z, c, s, live, b.dropped + dropped)

    # a rotation that commutes with every live word is the identity (its derivative is zero too):
    # common outside the observable's light cone, where it costs one pass to count
    rooms = _split_rooms(capacity)
    pick = jnp.where(splitting == 0, 0, 1 + jnp.sum(splitting > jnp.asarray(rooms[:-1])))
    buf = lax.switch(pick, [lambda b: b] + [partial(split, room=r) for r in rooms], buf)
    # the largest-terms cut, one for all rooms (each room would otherwise compile its own)
    live, coeffs, dropped = _m.cap_terms(buf.x, buf.z, buf.coeffs, buf.live, buf.dropped, trunc, capacity)
    return buf._replace(live=live, coeffs=coeffs, dropped=dropped)


def _split_rooms(capacity: int) -> tuple[int, ...]:
    """Sizes of the splitting set a rotation gathers, smallest first: it takes the smallest that
    holds its splitting words (its sort and gathers cost what the room holds). On the 127-qubit kicked
    Ising a third of the rotations split under C/64 words, the rest spread up to C/2, many between C/4
    and 3C/8 (experiments/README.md). Each room adds to the compilation, so the in-between rooms C/8
    and 3C/8 come only on CPUs with large buffers, where they save 5-15% of the run (an H100 sorts
    fast enough that they only added 5 s of compilation)."""
    fine = on_cpu() and capacity >= 1 << 15
    fractions = ((1, 64), (1, 16), (1, 8), (1, 4), (3, 8), (1, 2)) if fine else ((1, 64), (1, 16), (1, 4), (1, 2))
    rooms = tuple(r for r in (capacity * a // b for a, b in fractions) if r >= 256)
    return rooms + (capacity,)


def _quarter(buf, row, params, trunc, capacity):
    k = jnp.round(row["offset"] / (math.pi / 2)).astype(jnp.int32) % 4
    cos = jnp.array([1.0, 0.0, -1.0, 0.0], buf.coeffs.dtype)[k]
    sin = jnp.array([0.0, 1.0, 0.0, -1.0], buf.coeffs.dtype)[k]
    gx, gz = row["gx"], row["gz"]

    def image(x, z, c):  # every word here anticommutes with G
        sign = _w.product_sign(x, z, gx, gz).astype(c.dtype)
        odd = k % 2 == 1
        return jnp.where(odd, x ^ gx, x), jnp.where(odd, z ^ gz, z), (cos + sin * sign) * c

    # words that commute with G stay where they are
    return _remap(buf, buf.live & _w.anticommutes(buf.x, buf.z, gx, gz), image, trunc, capacity)


def _channel(buf, row, params, trunc, capacity):
    a = row["qubits"][0]
    code = (_w.get_site(buf.x, a) | _w.get_site(buf.z, a) << 1).astype(jnp.int32)
    coeffs = buf.coeffs * row["sign"][code].astype(buf.coeffs.dtype)
    return _drop_rules(buf._replace(coeffs=coeffs), _t.Truncation(min_abs_coeff=trunc.min_abs_coeff))


def _damp(buf, row, params, trunc, capacity):
    a = row["qubits"][0]
    gamma = row["offset"].astype(buf.coeffs.dtype)
    xa, za = _w.get_site(buf.x, a), _w.get_site(buf.z, a)
    is_z = buf.live & (xa == 0) & (za == 1)
    factor = jnp.where(is_z, 1 - gamma, jnp.where(xa == 1, jnp.sqrt(1 - gamma), 1.0))
    new_z = _w.set_site(buf.z, a, jnp.zeros_like(za))
    new = jnp.where(is_z, gamma * buf.coeffs, 0)
    return _split(buf, buf.x, new_z, new, buf.sins, is_z, buf.coeffs * factor, trunc, capacity)


_BRANCHES = (_clifford, _rotation, _quarter, _channel, _damp)
_NOOP = len(_BRANCHES)  # the kind of the rows that pad the last checkpoint segment


def segment_length(num_gates: int) -> int:
    """Gates per checkpoint segment: about sqrt(L), which minimises the (L/seg + seg) buffers that
    reverse mode holds. Short programs are one segment."""
    return math.isqrt(num_gates - 1) + 1 if num_gates > 64 else max(num_gates, 1)


def program_arrays(prog: _p.Program, dtype) -> dict:
    """The Program as numpy arrays, reversed (propagation runs from the last gate to the first).

    numpy, not jax: a circuit first used inside a jax trace must not cache that trace's values.
    """
    r = lambda a, dt=None: np.ascontiguousarray(a[::-1], dtype=None if dt is None else np.dtype(dt))
    return dict(kind=r(prog.kind), qubits=r(prog.qubits), table=r(prog.table), sign=r(prog.sign, dtype),
                gx=r(prog.gx), gz=r(prog.gz), param_index=r(prog.param_index), scale=r(prog.scale, dtype),
                offset=r(prog.offset, dtype))


def _initial_buffer(obs: PauliSum, capacity: int, dtype) -> _Buffer:
    t = len(obs)
    if t > capacity:
        raise ValueError(f"observable has {t} terms, more than the capacity {capacity}")
    pad = lambda a, fill=0: jnp.concatenate([jnp.asarray(a), jnp.full((capacity - t,) + a.shape[1:], fill, a.dtype)])
    coeffs = jnp.asarray(obs.coeffs, dtype)
    return _Buffer(pad(jnp.asarray(obs.x, jnp.uint32)), pad(jnp.asarray(obs.z, jnp.uint32)), pad(coeffs),
                   jnp.zeros(capacity, jnp.int32), jnp.arange(capacity) < t, jnp.zeros(5, dtype))


def propagate_buffers(prog_arrays: dict, obs: PauliSum, params, truncation: _t.Truncation, capacity: int,
                      kinds_present: tuple[int, ...] = tuple(range(5)), checkpointed: bool = True):
    """Pure core: scan the reversed program over a fixed-capacity buffer.

    checkpointed: scan in checkpoint segments of about sqrt(L) gates, so that reverse mode holds
    O(sqrt(L)) buffers instead of L. The nested scan costs 10-20% on XLA:CPU, so calls that cannot
    be differentiated (outside any JAX transformation) pass False.

    Returns (PauliSum of `capacity` slots, dead slots zero, PropagationStats).
    """
    dtype = jnp.result_type(float)
    params = jnp.asarray(params if params is not None else jnp.zeros(0), dtype)
    buf = _initial_buffer(obs, capacity, dtype)
    # merge repeated words (the rotations rely on distinct words) and apply every truncation rule
    x, z, c, s, live, dropped = _m.full_merge(buf.x, buf.z, buf.coeffs, buf.sins, buf.live, truncation, capacity)
    buf = _Buffer(x, z, c, s, live, dropped)
    # only the kinds this circuit uses become branches: fewer branches, smaller compiled program
    length = int(prog_arrays["kind"].shape[0])
    seg = segment_length(length) if checkpointed else max(length, 1)
    padded = -length % seg
    branch_of_kind = np.full(_NOOP + 1, 0, dtype=np.int32)
    for i, k in enumerate(kinds_present):
        branch_of_kind[k] = i
    branches = [lambda b, r, _f=_BRANCHES[k]: _f(b, r, params, truncation, capacity) for k in kinds_present]
    if padded:  # rows that fill the last segment do nothing
        branch_of_kind[_NOOP] = len(branches)
        branches.append(lambda b, r: b)
    branch_of_kind = jnp.asarray(branch_of_kind)

    def step(b, row):
        if len(branches) == 1:
            b = branches[0](b, row)
        else:
            b = lax.switch(branch_of_kind[row["kind"]], branches, b, row)
        return b, jnp.sum(b.live).astype(jnp.int32)

    # segments of `seg` gates, each a checkpoint: reverse mode keeps the buffer at segment boundaries
    # and replays one segment at a time, so its memory is (L/seg + seg) buffers, not L
    rows = {k: jnp.concatenate([v, jnp.repeat(v[-1:], padded, axis=0)]) if padded else v
            for k, v in prog_arrays.items()}
    if padded:
        rows["kind"] = rows["kind"].at[length:].set(_NOOP)
    if checkpointed:
        rows = {k: v.reshape((-1, seg) + v.shape[1:]) for k, v in rows.items()}
        buf, terms = lax.scan(jax.checkpoint(lambda b, r: lax.scan(step, b, r)), buf, rows)
    else:
        buf, terms = lax.scan(step, buf, rows)
    terms = terms.reshape(-1)[:length]
    n0 = jnp.sum(_initial_buffer(obs, capacity, dtype).live).astype(jnp.int32)
    stats = PropagationStats(
        terms=terms[::-1], dropped_norm=buf.dropped, overflow=buf.dropped[4] > 0, capacity=capacity,
        max_terms_seen=jnp.maximum(jnp.max(terms, initial=0), n0))
    out = PauliSum(buf.x, buf.z, jnp.where(buf.live, buf.coeffs, 0), obs.num_qubits)
    return out, stats


# ---- the public wrappers ---------------------------------------------------------------------------

def _lowered(circuit: Circuit):
    """Program and device arrays of a circuit, cached on the circuit until it changes."""
    dtype = jnp.result_type(float)
    key = (len(circuit.instructions), str(dtype))
    cache = getattr(circuit, "_program_cache", None)
    if cache is None or cache[0] != key:
        prog = _p.lower(circuit)
        cache = (key, prog, program_arrays(prog, dtype))
        circuit._program_cache = cache
    return cache[1], cache[2]


def _check_inputs(circuit: Circuit, obs: PauliSum, params):
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
        shape = jnp.shape(params)
        if len(shape) != 1:
            raise ValueError(f"params must be a 1-d array, got shape {shape} (use jax.vmap for batches)")
        if shape[0] < need:
            raise ValueError(f"circuit uses Param({need - 1}) but params has only {shape[0]} entries")
        if not _is_traced(params):
            p = np.asarray(params)
            if not np.all(np.isfinite(p)):
                bad = int(np.flatnonzero(~np.isfinite(p))[0])
                raise ValueError(f"params[{bad}] = {p[bad]} is not finite")


def _is_traced(*xs) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for x in xs for leaf in jax.tree_util.tree_leaves(x))


def default_capacity(obs: PauliSum, truncation: _t.Truncation) -> int:
    """A first capacity: max_terms when given, else room for modest growth (a power of two)."""
    want = truncation.max_terms if truncation.max_terms is not None else 64 * max(len(obs), 16)
    return 1 << max(6, int(math.ceil(math.log2(max(want, len(obs), 1)))))


def _warn_overflow(overflow, dropped, capacity):
    if bool(overflow):
        warnings.warn(f"pauliprop: capacity {capacity} overflowed; dropped 1-norm {float(dropped):.3g}. "
                      "Pass a larger capacity (or truncation.max_terms).", RuntimeWarning, stacklevel=3)


def propagate(circuit: Circuit, observable: PauliSum, params=None, truncation: _t.Truncation | None = None,
              capacity: int | None = None, max_capacity: int = 1 << 26, initial_capacity: int | None = None):
    """Heisenberg-propagate `observable` backward through `circuit`: returns (PauliSum, PropagationStats).

    capacity: slots in the term buffer (static). None: chosen automatically and, outside a jax
    trace, doubled and retried until nothing overflows (up to max_capacity). Inside a trace an
    overflow cannot be retried: it is reported in the stats and by a warning.
    initial_capacity: where the automatic growth starts (e.g. the capacity a similar run needed:
    each new capacity costs a compilation).
    """
    truncation = truncation or _t.NO_TRUNCATION
    _check_inputs(circuit, observable, params)
    prog, arrays = _lowered(circuit)
    kinds = tuple(sorted(set(prog.kind.tolist()))) or (0,)
    traced = _is_traced(params, observable)
    cap = capacity if capacity is not None else (initial_capacity or default_capacity(observable, truncation))
    if cap < 1 or cap < len(observable):
        raise ValueError(f"capacity {cap} is smaller than the observable's {len(observable)} terms")
    while True:
        out, stats = _run(arrays, observable, params, truncation, cap, kinds)
        stats = stats._replace(capacity=cap)  # a static int, not the array jit returns for the leaf
        if traced:
            jax.debug.callback(_warn_overflow, stats.overflow, stats.dropped_norm[4], cap)
            return out, stats
        if not bool(stats.overflow) or capacity is not None:
            _warn_overflow(stats.overflow, stats.dropped_norm[4], cap)
            return out, stats
        if cap * 2 > max_capacity:
            raise MemoryError(f"propagation needs more than max_capacity={max_capacity} terms; "
                              "add truncation (min_abs_coeff, max_terms, max_weight) or raise max_capacity")
        cap *= 2


def _run(arrays, observable, params, truncation, capacity, kinds):
    # jitted also under a caller's trace (grad, vmap, jit): the gate table stays an argument, not a
    # constant of the caller's program, so circuits of one shape share one compilation. Only there can
    # the call be differentiated, so only there does it scan in checkpoint segments.
    nested = _is_traced(params, observable)
    return _jit_for(jax.default_backend(), nested)(arrays, observable, params, truncation, capacity, kinds,
                                                    checkpointed=nested)


# XLA:CPU copies each lax.switch result back into the scan's carry (three copies of the buffer per
# gate) unless copy insertion runs its region analysis: 10.9 -> 8.4 s on the 127-qubit kicked Ising
# (experiments/README.md). A per-executable option, so JAX's global settings stay untouched; JAX takes
# it only on a top-level jit: under your own jax.jit on a CPU, pass
# compiler_options=pauliprop.CPU_COMPILER_OPTIONS there.
CPU_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


@functools.cache
def _jit_for(backend: str, nested: bool):
    options = CPU_COMPILER_OPTIONS if backend == "cpu" and not nested else None
    return jax.jit(propagate_buffers, static_argnames=("truncation", "capacity", "kinds_present", "checkpointed"),
                   compiler_options=options)


def expectation(circuit: Circuit, observable: PauliSum, params=None, state="0",
                truncation: _t.Truncation | None = None, method: str = "pauli", capacity: int | None = None,
                return_stats: bool = False, initial_capacity: int | None = None):
    """<psi| observable |psi> with psi = circuit |state>: a jax scalar, differentiable in params.

    method: "pauli" (backward Pauli propagation, with truncation) or "statevector" (exact, small n).
    state: "0", "+", a bitstring such as "0110" (character q is qubit q), a string over
    0 1 + - r l per qubit, or an (n, 3) array of Bloch vectors (a product state).
    """
    from .overlap import overlap, parse_state

    _check_inputs(circuit, observable, params)
    parse_state(state, circuit.num_qubits)  # fail before propagating
    if method == "statevector":
        from . import statevector

        if truncation is not None and not truncation.is_exact:
            raise ValueError("method='statevector' is exact: it takes no truncation")
        val = statevector.expectation(circuit, observable, params, state=state)
        return (val, None) if return_stats else val
    if method != "pauli":
        raise ValueError(f"unknown method {method!r}: use 'pauli' or 'statevector'")
    out, stats = propagate(circuit, observable, params, truncation, capacity, initial_capacity=initial_capacity)
    val = overlap(out, state)
    return (val, stats) if return_stats else val
