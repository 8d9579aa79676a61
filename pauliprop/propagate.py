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

from . import adjoint as _a
from . import program as _p
from . import truncation as _t
from . import words as _w
from . import merge as _m
from .batching import batch_size, batched, shared
from .circuit import Circuit
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


def _remap(buf, touched, image, trunc, capacity, rec=None):
    """Apply a word map (a Clifford: it permutes signed words) to the `touched` live words.

    image(x, z) -> (x, z, sign). None touched: nothing to do (common outside the light
    cone). A few (up to C/16): they are gathered into the smallest room that holds them, so the cost
    follows their count. More: one pass over the buffer, which measured faster than gathering them.
    Magnitudes and sine counts stay, so only max_weight can drop a moved word.
    rec: None, or (permutes,) to return (buffer, adjoint.Record) as well: each word keeps its slot.
    """
    count = jnp.sum(touched)
    sign_code = lambda sign: jnp.where(sign > 0, _a.ONE, _a.MINUS_ONE)

    def heavy_out(b, x, z, c, mask, at):
        heavy = mask & (_w.weight(x, z) > trunc.max_weight)
        return (b.dropped.at[0].add(jnp.sum(jnp.where(heavy, jnp.abs(c), 0))),
                b.live.at[at].set(b.live[at] & ~heavy, mode="drop") if at is not None else b.live & ~heavy,
                jnp.where(heavy, 0, c))

    def gathered(b, room):
        src = first_set(touched, room)
        at = jnp.where(src < capacity, src, capacity)
        s = jnp.minimum(src, capacity - 1)
        x, z, sign = image(b.x[s], b.z[s])
        c = b.coeffs[s] * sign.astype(b.coeffs.dtype)
        live, dropped = b.live, b.dropped
        if trunc.max_weight is not None:
            dropped, live, c = heavy_out(b, x, z, c, src < capacity, at)
        b = b._replace(x=b.x.at[at].set(x, mode="drop"), z=b.z.at[at].set(z, mode="drop"),
                       coeffs=b.coeffs.at[at].set(c, mode="drop"), live=live, dropped=dropped)
        if rec is None:
            return b
        codes = jnp.full(capacity, _a.ONE, jnp.uint8).at[at].set(sign_code(sign).astype(jnp.uint8), mode="drop")
        return b, _a.in_place_record(codes, capacity, *rec)

    def everywhere(b):
        x, z, sign = image(b.x, b.z)
        x, z = jnp.where(touched[:, None], x, b.x), jnp.where(touched[:, None], z, b.z)
        c = jnp.where(touched, b.coeffs * sign.astype(b.coeffs.dtype), b.coeffs)
        live, dropped = b.live, b.dropped
        if trunc.max_weight is not None:
            dropped, live, c = heavy_out(b, x, z, c, touched, None)
        b = b._replace(x=x, z=z, coeffs=c, live=live, dropped=dropped)
        if rec is None:
            return b
        return b, _a.in_place_record(jnp.where(touched, sign_code(sign), _a.ONE), capacity, *rec)

    unchanged = (lambda b: b) if rec is None else (lambda b: (b, _a.identity_record(capacity, *rec)))
    rooms = tuple(r for r in (capacity // 64, capacity // 16) if r >= 256)
    pick = shared(jnp.where(count == 0, 0, 1 + jnp.sum(count > jnp.asarray(rooms))))
    return lax.switch(pick, [unchanged] + [partial(gathered, room=r) for r in rooms] + [everywhere], buf)


def _clifford(buf, row, params, trunc, capacity, rec=None):
    a, b = row["qubits"][0], row["qubits"][1]

    def image(x, z):
        code = _local_code(x, z, a, b)
        img = row["table"][code].astype(jnp.uint32)
        one = jnp.uint32(1)
        x = _w.set_site(_w.set_site(x, a, img & one), b, (img >> 2) & one)
        z = _w.set_site(_w.set_site(z, a, (img >> 1) & one), b, (img >> 3) & one)
        return x, z, row["sign"][code]

    # words that are the identity on both sites stay where they are
    return _remap(buf, buf.live & (_local_code(buf.x, buf.z, a, b) != 0), image, trunc, capacity, rec)


def _rotation(buf, row, params, trunc, capacity, rec=None):
    angle = _angle(row, params).astype(buf.coeffs.dtype)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    gx, gz = row["gx"], row["gz"]
    ac = buf.live & _w.anticommutes(buf.x, buf.z, gx, gz)
    splitting = jnp.sum(ac)

    def split(b, room):
        *out, moves = _m.pair_split_uncapped(b.x, b.z, b.coeffs, b.sins, b.live, ac, gx, gz, cos, sin, trunc,
                                             capacity, room, moves=True)
        x, z, c, s, live, dropped = out
        b = _Buffer(x, z, c, s, live, b.dropped + dropped)
        return b if rec is None else (b, _a.rotation_record(moves, capacity, *rec))

    # a rotation that commutes with every live word is the identity (its derivative is zero too):
    # common outside the observable's light cone, where it costs one pass to count
    unchanged = (lambda b: b) if rec is None else (lambda b: (b, _a.identity_record(capacity, *rec)))
    rooms = _split_rooms(capacity, recording=rec is not None)
    pick = shared(jnp.where(splitting == 0, 0, 1 + jnp.sum(splitting > jnp.asarray(rooms[:-1]))))
    out = lax.switch(pick, [unchanged] + [partial(split, room=r) for r in rooms], buf)
    buf = out if rec is None else out[0]
    # the largest-terms cut, one for all rooms (each room would otherwise compile its own)
    live, coeffs, dropped = _m.cap_terms(buf.x, buf.z, buf.coeffs, buf.live, buf.dropped, trunc, capacity)
    buf = buf._replace(live=live, coeffs=coeffs, dropped=dropped)
    return buf if rec is None else (buf, out[1])


def _split_rooms(capacity: int, recording: bool = False) -> tuple[int, ...]:
    """Sizes of the splitting set a rotation gathers, smallest first: it takes the smallest that
    holds its splitting words (its sort and gathers cost what the room holds). On the 127-qubit kicked
    Ising a third of the rotations split under C/64 words, the rest spread up to C/2, many between C/4
    and 3C/8 (experiments/README.md). Each room adds to the compilation, so the in-between rooms C/8
    and 3C/8 come only on CPUs with large buffers, where they save 5-15% of the run (an H100 sorts
    fast enough that they only added 5 s of compilation), and not when recording for reverse mode,
    where they saved 2.5% of the run and cost 2 s of its compilation. Recording on a GPU takes only
    C/16 and C/2: on an H100 that compiled the 5,420-gate gradient in 6.2 s instead of 8.7 s and ran
    it 1% slower."""
    if recording and not on_cpu():
        fractions = ((1, 16), (1, 2))
    elif on_cpu() and not recording and capacity >= 1 << 15:
        fractions = ((1, 64), (1, 16), (1, 8), (1, 4), (3, 8), (1, 2))
    else:
        fractions = ((1, 64), (1, 16), (1, 4), (1, 2))
    rooms = tuple(r for r in (capacity * a // b for a, b in fractions) if r >= 256)
    return rooms + (capacity,)


def _quarter(buf, row, params, trunc, capacity, rec=None):
    k = jnp.round(row["offset"] / (math.pi / 2)).astype(jnp.int32) % 4
    cos = jnp.array([1, 0, -1, 0], jnp.int32)[k]
    sin = jnp.array([0, 1, 0, -1], jnp.int32)[k]
    gx, gz = row["gx"], row["gz"]

    def image(x, z):  # every word here anticommutes with G
        sign = _w.product_sign(x, z, gx, gz)
        odd = k % 2 == 1
        return jnp.where(odd, x ^ gx, x), jnp.where(odd, z ^ gz, z), cos + sin * sign

    # words that commute with G stay where they are
    return _remap(buf, buf.live & _w.anticommutes(buf.x, buf.z, gx, gz), image, trunc, capacity, rec)


def _channel(buf, row, params, trunc, capacity, rec=None):
    a = row["qubits"][0]
    code = (_w.get_site(buf.x, a) | _w.get_site(buf.z, a) << 1).astype(jnp.int32)
    coeffs = buf.coeffs * row["sign"][code].astype(buf.coeffs.dtype)
    buf = _drop_rules(buf._replace(coeffs=coeffs), _t.Truncation(min_abs_coeff=trunc.min_abs_coeff))
    return buf if rec is None else (buf, _a.in_place_record(_a.TABLE + code, capacity, *rec))


def _damp(buf, row, params, trunc, capacity, rec=None):
    a = row["qubits"][0]
    gamma = row["offset"].astype(buf.coeffs.dtype)
    xa, za = _w.get_site(buf.x, a), _w.get_site(buf.z, a)
    is_z = buf.live & (xa == 0) & (za == 1)
    factor = jnp.where(is_z, 1 - gamma, jnp.where(xa == 1, jnp.sqrt(1 - gamma), 1.0))
    new_z = _w.set_site(buf.z, a, jnp.zeros_like(za))
    new = jnp.where(is_z, gamma * buf.coeffs, 0)
    cat = lambda u, v: jnp.concatenate([u, v])
    *out, dest = _m.full_merge(cat(buf.x, buf.x), cat(buf.z, new_z), cat(buf.coeffs * factor, new),
                               cat(buf.sins, buf.sins), cat(buf.live, is_z), trunc, capacity, destinations=True)
    x, z, c, s, live, dropped = out
    buf = _Buffer(x, z, c, s, live, buf.dropped + dropped)
    if rec is None:
        return buf
    # the old word goes to dest[q] times 1, 1 - gamma (Z) or sqrt(1 - gamma) (X, Y); Z words also feed
    # their damped copy at dest[C + q] times gamma
    a_code = jnp.where(is_z, _a.TABLE, jnp.where(xa == 1, _a.TABLE + 1, _a.ONE))
    code = a_code | jnp.where(is_z, _a.GAMMA << _a.B_SHIFT, 0)
    return buf, _a.Record(o2=dest[capacity:], code=code.astype(jnp.uint8), moved=jnp.asarray(True),
                          o1=dest[:capacity])


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


class _Setup(NamedTuple):
    buf: _Buffer  # the merged, truncated observable
    obs_dest: jax.Array  # (C,) the slot each observable term went to (capacity: merged away or dropped)
    rows: dict  # the reversed program, padded to whole segments
    step: object  # step(buf, row) -> (buf, live terms): one gate
    recording_step: object  # step(buf, row) -> (buf, (live terms, c_in, live_out, adjoint.Record))
    length: int  # gates
    seg: int  # gates per segment


def _setup(prog_arrays: dict, obs: PauliSum, params, truncation, capacity, kinds_present, seg_of) -> _Setup:
    dtype = jnp.result_type(float)
    buf = _initial_buffer(obs, capacity, dtype)
    # merge repeated words (the rotations rely on distinct words) and apply every truncation rule
    x, z, c, s, live, dropped, obs_dest = _m.full_merge(buf.x, buf.z, buf.coeffs, buf.sins, buf.live, truncation,
                                                         capacity, destinations=True)
    buf = _Buffer(x, z, c, s, live, dropped)
    # only the kinds this circuit uses become branches: fewer branches, smaller compiled program
    length = int(prog_arrays["kind"].shape[0])
    seg = seg_of(length)
    padded = -length % seg
    branch_of_kind = np.full(_NOOP + 1, 0, dtype=np.int32)
    for i, k in enumerate(kinds_present):
        branch_of_kind[k] = i
    branch_of_kind[_NOOP] = len(kinds_present)  # rows that fill the last segment do nothing
    branch_of_kind = jnp.asarray(branch_of_kind)
    rows = {k: jnp.concatenate([v, jnp.repeat(v[-1:], padded, axis=0)]) if padded else jnp.asarray(v)
            for k, v in prog_arrays.items()}
    if padded:
        rows["kind"] = rows["kind"].at[length:].set(_NOOP)
    permutes = _p.DAMP in kinds_present

    def make_step(rec):
        branches = [lambda b, r, _f=_BRANCHES[k]: _f(b, r, params, truncation, capacity, rec) for k in kinds_present]
        if padded:
            branches.append((lambda b, r: b) if rec is None else
                            (lambda b, r: (b, _a.identity_record(capacity, permutes))))

        def step(b, row):
            c_in = jnp.where(b.live, b.coeffs, 0)
            out = branches[0](b, row) if len(branches) == 1 else lax.switch(branch_of_kind[row["kind"]], branches,
                                                                              b, row)
            b = out if rec is None else out[0]
            terms = jnp.sum(b.live).astype(jnp.int32)
            return b, terms if rec is None else (terms, c_in, b.live, out[1])

        return step

    return _Setup(buf, obs_dest, rows, make_step(None), make_step((permutes,)), length, seg)


def _stats(terms, buf: _Buffer, initial: _Buffer, length: int, capacity: int) -> PropagationStats:
    terms = terms.reshape(-1)[:length]
    n0 = jnp.sum(initial.live).astype(jnp.int32)
    return PropagationStats(terms=terms[::-1], dropped_norm=buf.dropped, overflow=buf.dropped[4] > 0,
                            capacity=capacity, max_terms_seen=jnp.maximum(jnp.max(terms, initial=0), n0))


def propagate_buffers(prog_arrays: dict, obs: PauliSum, params, truncation: _t.Truncation, capacity: int,
                      kinds_present: tuple[int, ...] = tuple(range(5)), checkpointed: bool = True):
    """Pure core: scan the reversed program over a fixed-capacity buffer.

    checkpointed: scan in checkpoint segments of about sqrt(L) gates, so that JAX's reverse mode
    holds O(sqrt(L)) buffers instead of L. The nested scan costs 10-20% on XLA:CPU, so calls that
    cannot be differentiated (outside any JAX transformation) pass False. (`expectation` under a
    transformation does not differentiate this scan: it has its own reverse mode, `_estimate`.)

    Returns (PauliSum of `capacity` slots, dead slots zero, PropagationStats).
    """
    dtype = jnp.result_type(float)
    params = jnp.asarray(params if params is not None else jnp.zeros(0), dtype)
    seg_of = segment_length if checkpointed else (lambda n: max(n, 1))
    st = _setup(prog_arrays, obs, params, truncation, capacity, kinds_present, seg_of)
    if checkpointed:
        rows = {k: v.reshape((-1, st.seg) + v.shape[1:]) for k, v in st.rows.items()}
        buf, terms = lax.scan(jax.checkpoint(lambda b, r: lax.scan(st.step, b, r)), st.buf, rows)
    else:
        buf, terms = lax.scan(st.step, st.buf, st.rows)
    out = PauliSum(buf.x, buf.z, jnp.where(buf.live, buf.coeffs, 0), obs.num_qubits)
    return out, _stats(terms, buf, st.buf, st.length, capacity)


def _state_arg(state):
    """A hashable form of a state description (strings stay; Bloch arrays become nested tuples)."""
    return state if isinstance(state, str) else tuple(map(tuple, np.asarray(state, float).tolist()))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _estimate(static, prog_arrays, obs_x, obs_z, coeffs, params):
    """<state| propagated observable |state> and the stats. Its reverse mode is the adjoint sweep
    (_estimate_fwd); batches of it share their branches (batching.py)."""
    return batched(partial(_value, static))(prog_arrays, obs_x, obs_z, coeffs, params)


def _value(static, prog_arrays, obs_x, obs_z, coeffs, params):
    """The flat scan, then the overlap."""
    truncation, capacity, kinds, state, n, budget = static
    obs = PauliSum(obs_x, obs_z, coeffs, n)
    out, stats = propagate_buffers(prog_arrays, obs, params, truncation, capacity, kinds, checkpointed=False)
    return _overlap_value(out, state), stats


def _overlap_value(out: PauliSum, state):
    from .overlap import word_overlaps

    w = word_overlaps(out.x, out.z, state if isinstance(state, str) else np.asarray(state), out.num_qubits)
    return jnp.sum(out.coeffs * w.astype(out.coeffs.dtype))


def _estimate_fwd(static, prog_arrays, obs_x, obs_z, coeffs, params):
    return batched(partial(_value_and_gradients, static))(prog_arrays, obs_x, obs_z, coeffs, params)


def _value_and_gradients(static, prog_arrays, obs_x, obs_z, coeffs, params):
    """Value and gradient in one pass (adjoint.value_and_gradient): the output is a scalar, so the
    backward rule only scales the gradient by its cotangent."""
    from .overlap import word_overlaps

    truncation, capacity, kinds, state, n, budget = static
    dtype = jnp.result_type(float)
    params_ = jnp.asarray(params, dtype)

    obs = PauliSum(obs_x, obs_z, coeffs, n)
    length = int(prog_arrays["kind"].shape[0])
    # every gate's record when they fit the budget (one pass forward), else sqrt(L) checkpoints
    stored = length * _a.record_bytes(capacity, _p.DAMP in kinds, dtype) * batch_size() <= budget
    st = _setup(prog_arrays, obs, params_, truncation, capacity, kinds, (lambda n: max(n, 1)) if stored
                else segment_length)
    rows = {k: v.reshape((-1, st.seg) + v.shape[1:]) for k, v in st.rows.items()}
    num_segments = rows["kind"].shape[0]

    def final_cotangent(buf):
        w = word_overlaps(buf.x, buf.z, state if isinstance(state, str) else np.asarray(state), n)
        w = jnp.where(buf.live, w.astype(dtype), 0)
        return jnp.sum(buf.coeffs * w), w

    record_scan = lambda b, r: lax.scan(st.recording_step, b, r)
    angle_of = lambda row: _angle(row, params_).astype(dtype)
    if stored:
        value, buf, terms, d_angles, lam0 = _a.value_and_gradient_stored(st.buf, st.rows, record_scan,
                                                                         final_cotangent, angle_of)
    else:
        value, buf, terms, d_angles, lam0 = _a.value_and_gradient(st.buf, rows, params_, num_segments, record_scan,
                                                                  final_cotangent, angle_of)
    # d value / d params: each rotation's angle is scale * params[index] + offset
    d_rows = d_angles.reshape(-1)
    index = rows["param_index"].reshape(-1)
    scale = rows["scale"].reshape(-1).astype(dtype)
    d_params = jnp.zeros(params_.shape[0], dtype).at[jnp.maximum(index, 0)].add(
        jnp.where(index >= 0, scale * d_rows, 0))
    # the initial merge summed each observable term into its slot
    d_coeffs = lam0.at[st.obs_dest[:coeffs.shape[0]]].get(mode="fill", fill_value=0)
    stats = _stats(terms, buf, st.buf, st.length, capacity)
    return (value, stats), (d_params.astype(jnp.result_type(params)), d_coeffs)


def _estimate_bwd(static, res, cotangents):
    d_params, d_coeffs = res
    ct = cotangents[0]
    return None, None, None, ct * d_coeffs, ct * d_params


_estimate.defvjp(_estimate_fwd, _estimate_bwd)


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
    kinds = _kinds(prog)
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
    Differentiable (reverse mode) in params and in the observable's coefficients: the derivative of
    the estimator with its truncation decisions frozen, by the adjoint sweep of adjoint.py; under
    jax.vmap the batch shares the engine's branches (batching.py). Under a trace pass `capacity`.
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
    if _is_traced(params, observable):
        # under a transformation: the estimate with its own reverse mode (adjoint.py)
        truncation = truncation or _t.NO_TRUNCATION
        prog, arrays = _lowered(circuit)
        cap = capacity if capacity is not None else (initial_capacity or default_capacity(observable, truncation))
        if cap < 1 or cap < len(observable):
            raise ValueError(f"capacity {cap} is smaller than the observable's {len(observable)} terms")
        dtype = jnp.result_type(float)
        params = jnp.zeros(0, dtype) if params is None else params
        val, stats = _estimate_jit(arrays, jnp.asarray(observable.x, jnp.uint32), jnp.asarray(observable.z, jnp.uint32),
                                   jnp.asarray(observable.coeffs, dtype), params, truncation=truncation, capacity=cap,
                                   kinds=_kinds(prog), state=_state_arg(state), num_qubits=circuit.num_qubits,
                                   record_budget=_a.record_budget())
        jax.debug.callback(_warn_overflow, stats.overflow, stats.dropped_norm[4], cap)
        stats = stats._replace(capacity=cap)
        return (val, stats) if return_stats else val
    out, stats = propagate(circuit, observable, params, truncation, capacity, initial_capacity=initial_capacity)
    val = overlap(out, state)
    return (val, stats) if return_stats else val


@partial(jax.jit, static_argnames=("truncation", "capacity", "kinds", "state", "num_qubits", "record_budget"))
def _estimate_jit(arrays, obs_x, obs_z, coeffs, params, *, truncation, capacity, kinds, state, num_qubits,
                  record_budget):
    # jitted also under a caller's trace: the gate table stays an argument, not a constant of the
    # caller's program, so circuits of one shape share one compilation
    return _estimate((truncation, capacity, kinds, state, num_qubits, record_budget), arrays, obs_x, obs_z, coeffs,
                     params)


def _kinds(prog) -> tuple[int, ...]:
    return tuple(sorted(set(prog.kind.tolist()))) or (0,)
