"""Backward Pauli propagation: the observable walks the circuit from the last gate to the first.

`propagate_buffers` is the pure core: a `lax.scan` over the reversed Program with a fixed-capacity
term buffer (static shapes, so it jits, vmaps and differentiates, and compile time does not grow
with depth). `propagate` and `expectation` wrap it: they lower the circuit, pick a capacity and,
outside of a trace, grow it and retry when it overflowed, so a result is never silently lossy.
"""

from __future__ import annotations

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
    live: jax.Array  # (C,) bool
    keys: jax.Array  # (C,) uint64 merge keys (x64), valid while `ordered`; (C,) zeros otherwise
    ordered: jax.Array  # bool: the live words sit in increasing key order (see merge.insert_merge)
    dropped: jax.Array  # (5,) 1-norm dropped per truncation rule


_NO_SINS = jnp.iinfo(jnp.int32).max  # sins of a dropped slot, so a revived slot takes the new count


def _angle(row, params):
    idx = row["param_index"]
    p = params[jnp.maximum(idx, 0)] if params.shape[0] else jnp.zeros((), row["offset"].dtype)
    return jnp.where(idx >= 0, row["scale"] * p, 0.0) + row["offset"]


def _drop_rules(buf: _Buffer, trunc: _t.Truncation) -> _Buffer:
    """Apply the per-term rules in place (no compaction: dead slots are reclaimed by the next merge)."""
    if trunc.max_weight is None and trunc.min_abs_coeff is None:
        return buf
    drop_w, drop_c, _ = _t.violations(trunc, buf.coeffs, _w.weight(buf.x, buf.z), buf.sins)
    drop_w, drop_c = drop_w & buf.live, drop_c & buf.live
    mag = jnp.abs(buf.coeffs)
    dropped = buf.dropped.at[0].add(jnp.sum(jnp.where(drop_w, mag, 0))).at[1].add(jnp.sum(jnp.where(drop_c, mag, 0)))
    gone = drop_w | drop_c
    return buf._replace(coeffs=jnp.where(gone, 0, buf.coeffs), live=buf.live & ~gone,
                        sins=jnp.where(gone, _NO_SINS, buf.sins), dropped=dropped)


def _local_code(buf, a, b):
    return (_w.get_site(buf.x, a) | _w.get_site(buf.z, a) << 1 | _w.get_site(buf.x, b) << 2
            | _w.get_site(buf.z, b) << 3).astype(jnp.int32)


def _clifford(buf, row, params, trunc, capacity):
    a, b = row["qubits"][0], row["qubits"][1]
    code = _local_code(buf, a, b)
    img = row["table"][code].astype(jnp.uint32)
    one = jnp.uint32(1)
    x = _w.set_site(buf.x, a, img & one)
    z = _w.set_site(buf.z, a, (img >> 1) & one)
    x = _w.set_site(x, b, (img >> 2) & one)
    z = _w.set_site(z, b, (img >> 3) & one)
    coeffs = buf.coeffs * row["sign"][code].astype(buf.coeffs.dtype)
    return _drop_rules(buf._replace(x=x, z=z, coeffs=coeffs, ordered=jnp.zeros((), bool)), trunc)


def _split(buf, new_x, new_z, new_coeffs, new_sins, new_live, old_coeffs, trunc, capacity):
    """Old terms (with updated coefficients) plus new partner terms -> merged, truncated buffer."""
    cat = lambda a, b: jnp.concatenate([a, b])
    x, z, c, s, live, keys, ordered, dropped = _m.full_merge(
        cat(buf.x, new_x), cat(buf.z, new_z), cat(old_coeffs, new_coeffs), cat(buf.sins, new_sins),
        cat(buf.live, new_live), trunc, capacity)
    if keys is None:  # no x64: no merge keys, the buffer is never key-ordered
        keys, ordered = buf.keys, jnp.zeros((), bool)
    return _Buffer(x, z, c, s, live, keys, ordered, buf.dropped + dropped)


def _rotation(buf, row, params, trunc, capacity):
    angle = _angle(row, params).astype(buf.coeffs.dtype)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    gx, gz = row["gx"], row["gz"]

    def full(b):
        ac = b.live & _w.anticommutes(b.x, b.z, gx, gz)
        sign = _w.product_sign(b.x, b.z, gx, gz).astype(b.coeffs.dtype)
        old = jnp.where(ac, cos * b.coeffs, b.coeffs)
        new = jnp.where(ac, sin * sign * b.coeffs, 0)
        return _split(b, b.x ^ gx, b.z ^ gz, new, b.sins + 1, ac, old, trunc, capacity)

    if not _m.x64():
        return full(buf)

    def incremental(b, room):
        ok, (x, z, c, s, live, keys, dropped) = _m.insert_merge(
            b.x, b.z, b.coeffs, b.sins, b.live, b.keys, gx, gz, cos, sin, trunc, capacity, room)
        merged = _Buffer(x, z, c, s, live, keys, jnp.ones((), bool), b.dropped + dropped)
        return lax.cond(ok, lambda _: merged, full, b)

    rooms = _insert_rooms(capacity)
    if len(rooms) == 1:
        return lax.cond(buf.ordered, partial(incremental, room=rooms[0]), full, buf)
    splitting = jnp.sum(buf.live & _w.anticommutes(buf.x, buf.z, gx, gz))
    smallest_fit = jnp.sum(splitting > jnp.asarray(rooms[:-1]))  # the smallest room that holds them
    branches = [partial(incremental, room=r) for r in rooms] + [full]
    return lax.switch(jnp.where(buf.ordered, smallest_fit, len(rooms)), branches, buf)


def _insert_rooms(capacity: int) -> tuple[int, ...]:
    """New-word slot counts of the incremental merge, smallest first: a rotation takes the smallest
    that holds its splitting words (the merge's cost follows the room); more than the largest, half
    the capacity, take the full merge.

    Measured on the 127-qubit kicked Ising (Z62, 20 steps, 1e5 terms, 2-core CPU): up to half the
    words anticommute with a central qubit's RX; one room of C/4 took 31.7 s, C/2 25.3 s, 3C/4 28.9 s;
    the four rooms C/16..C/2 took 18 s (experiments/README.md, "CPU engine").
    """
    top = max(16, capacity // 2)
    return tuple(r for r in (top // 8, top // 4, top // 2) if r >= 1024) + (top,)


def _quarter(buf, row, params, trunc, capacity):
    k = jnp.round(row["offset"] / (math.pi / 2)).astype(jnp.int32) % 4
    cos = jnp.array([1.0, 0.0, -1.0, 0.0], buf.coeffs.dtype)[k]
    sin = jnp.array([0.0, 1.0, 0.0, -1.0], buf.coeffs.dtype)[k]
    gx, gz = row["gx"], row["gz"]
    ac = buf.live & _w.anticommutes(buf.x, buf.z, gx, gz)
    flip = ac & (k % 2 == 1)
    sign = _w.product_sign(buf.x, buf.z, gx, gz).astype(buf.coeffs.dtype)
    coeffs = jnp.where(ac, (cos + sin * sign) * buf.coeffs, buf.coeffs)
    x = jnp.where(flip[:, None], buf.x ^ gx, buf.x)
    z = jnp.where(flip[:, None], buf.z ^ gz, buf.z)
    return _drop_rules(buf._replace(x=x, z=z, coeffs=coeffs, ordered=jnp.zeros((), bool)), trunc)


def _channel(buf, row, params, trunc, capacity):
    a = row["qubits"][0]
    code = (_w.get_site(buf.x, a) | _w.get_site(buf.z, a) << 1).astype(jnp.int32)
    coeffs = buf.coeffs * row["sign"][code].astype(buf.coeffs.dtype)
    return _drop_rules(buf._replace(coeffs=coeffs), trunc)


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
    keys = jnp.zeros(capacity, jnp.uint64 if _m.x64() else jnp.uint32)
    return _Buffer(pad(jnp.asarray(obs.x, jnp.uint32)), pad(jnp.asarray(obs.z, jnp.uint32)), pad(coeffs),
                   jnp.zeros(capacity, jnp.int32), jnp.arange(capacity) < t, keys, jnp.zeros((), bool),
                   jnp.zeros(5, dtype))


def propagate_buffers(prog_arrays: dict, obs: PauliSum, params, truncation: _t.Truncation, capacity: int,
                      kinds_present: tuple[int, ...] = tuple(range(5))):
    """Pure core: scan the reversed program over a fixed-capacity buffer.

    Returns (PauliSum of `capacity` slots, dead slots zero, PropagationStats).
    """
    dtype = jnp.result_type(float)
    params = jnp.asarray(params if params is not None else jnp.zeros(0), dtype)
    buf = _initial_buffer(obs, capacity, dtype)
    buf = _drop_rules(buf, truncation)
    # only the kinds this circuit uses become branches: fewer branches, smaller compiled program
    branch_of_kind = np.full(5, 0, dtype=np.int32)
    for i, k in enumerate(kinds_present):
        branch_of_kind[k] = i
    branch_of_kind = jnp.asarray(branch_of_kind)
    branches = [lambda b, r, _f=_BRANCHES[k]: _f(b, r, params, truncation, capacity) for k in kinds_present]

    def step(b, row):
        if len(branches) == 1:
            b = branches[0](b, row)
        else:
            b = lax.switch(branch_of_kind[row["kind"]], branches, b, row)
        return b, jnp.sum(b.live).astype(jnp.int32)

    buf, terms = lax.scan(step, buf, prog_arrays)
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
    if _is_traced(params, observable):
        return propagate_buffers(arrays, observable, params, truncation, capacity, kinds)
    return _jitted(arrays, observable, params, truncation, capacity, kinds)


_jitted = jax.jit(propagate_buffers, static_argnames=("truncation", "capacity", "kinds_present"))


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
