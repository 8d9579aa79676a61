"""Reverse mode of the propagation: move records and the adjoint (transposed) sweep.

With its truncation decisions frozen, every operation maps the coefficient vector linearly, and in a
simple way: the coefficient in slot q feeds at most two output slots,

    c'[o1[q]] += A[q] c[q]        (its own word: 1, -1, cos, a channel or damping factor, or 0)
    c'[o2[q]] += B[q] c[q]        (its partner's or its spawned word: +-sin, or the damping rate)

A `Record` holds (o1, o2, codes) per slot; A and B are looked up from a per-gate table of eight and
four values, so the records stay small integers and the same adjoint step serves every gate kind.
The adjoint step gathers: lam[q] = A[q] lam'[o1[q]] + B[q] lam'[o2[q]], and the gate's angle
derivative is sum_q c[q] (A'[q] lam'[o1[q]] + B'[q] lam'[o2[q]]). Only rotations depend on an angle.

`value_and_gradient` runs the forward pass in checkpoint segments of about sqrt(L) gates (saving
each segment's first buffer), then replays the segments last to first, recording their moves, and
sweeps each one backwards. Forward and replay are the same loop body, so the engine compiles once.
Memory: (L/seg) buffers + seg records, O(sqrt(L) C).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .batching import shared
from .memory import device_memory_bytes

# A codes (3 bits): 0, 1, -1, cos, then the gate's four table values (channel factors for the site's
# I, X, Z, Y; amplitude damping's 1 - gamma and sqrt(1 - gamma))
ZERO, ONE, MINUS_ONE, COS, TABLE = 0, 1, 2, 3, 4
# B codes (2 bits, shifted by 3): nothing, sin, -sin, gamma
SIN, MINUS_SIN, GAMMA = 1, 2, 3
B_SHIFT = 3


class Record(NamedTuple):
    """One operation's moves, per input slot (C,): see the module docstring."""

    o2: jax.Array  # int32, the second output slot (capacity: none)
    code: jax.Array  # uint8, A code | B code << 3
    moved: jax.Array  # bool scalar; False: the identity (the adjoint step only applies the kills)
    o1: jax.Array | None = None  # int32, the first output slot; None: the slot itself


def identity_record(capacity: int, permutes: bool, moved=False) -> Record:
    return Record(jnp.full(capacity, capacity, jnp.int32), jnp.full(capacity, ONE, jnp.uint8), jnp.asarray(moved),
                  jnp.arange(capacity, dtype=jnp.int32) if permutes else None)


def in_place_record(codes, capacity: int, permutes: bool) -> Record:
    """Each slot keeps its word, times the factor of its A code."""
    return identity_record(capacity, permutes, True)._replace(code=codes.astype(jnp.uint8))


def rotation_record(moves, capacity: int, permutes: bool) -> Record:
    """From a rotation's moves (per room entry: slot, own word kept, fed slot, positive sign; per slot:
    kept by the cut). Words the cut dropped keep nothing, even where a spawned word takes their slot."""
    at, own, fed, positive, kept = moves
    rec = in_place_record(jnp.where(kept, ONE, ZERO), capacity, permutes)
    code = jnp.where(own, COS, ZERO) | (jnp.where(positive, SIN, MINUS_SIN) << B_SHIFT)
    return rec._replace(o2=rec.o2.at[at].set(jnp.where(fed < capacity, fed, capacity), mode="drop"),
                        code=rec.code.at[at].set(code.astype(jnp.uint8), mode="drop"))


def adjoint_step(lam, c_in, live_out, rec: Record, row, angle):
    """Cotangent of one gate's output coefficients -> that of its input, and d value / d angle.

    The A and B factors are selected arithmetically from the codes (XLA:CPU gathers from a small
    table cost several times more than these vectorised compares)."""
    dtype = lam.dtype
    cos, sin = jnp.cos(angle).astype(dtype), jnp.sin(angle).astype(dtype)
    gamma = row["offset"].astype(dtype)
    damp = jnp.stack([1 - gamma, jnp.sqrt(jnp.maximum(1 - gamma, 0)), 0 * gamma, 0 * gamma])
    table = jnp.where(row["kind"] == DAMP_KIND, damp, row["sign"][:4].astype(dtype))
    ca, cb = rec.code & 7, rec.code >> B_SHIFT
    is_ = lambda codes, k: (codes == k).astype(dtype)
    a = is_(ca, ONE) - is_(ca, MINUS_ONE) + cos * is_(ca, COS)
    a = a + sum(table[k] * is_(ca, TABLE + k) for k in range(4))
    sign_b = is_(cb, SIN) - is_(cb, MINUS_SIN)
    b = sin * sign_b + gamma * is_(cb, GAMMA)
    lam = jnp.where(live_out, lam, 0)

    def moved(lam):
        l1 = lam if rec.o1 is None else lam.at[rec.o1].get(mode="fill", fill_value=0)
        l2 = lam.at[rec.o2].get(mode="fill", fill_value=0)
        d_angle = jnp.sum(c_in * (cos * sign_b * l2 - sin * is_(ca, COS) * l1))
        return a * l1 + b * l2, d_angle

    return lax.cond(shared(rec.moved), moved, lambda lam: (lam, jnp.zeros((), dtype)), lam)


DAMP_KIND = 4  # program.DAMP, repeated here to keep this module free of the engine's imports


RECORD_BUDGET: int | None = None  # bytes reverse mode may keep in records; None: a quarter of the device's memory


def record_budget() -> int:
    """RECORD_BUDGET, or a quarter of the default device's memory (its allocator's limit on GPUs,
    the machine's physical memory on CPUs). Read when a gradient is traced."""
    if RECORD_BUDGET is not None:
        return int(RECORD_BUDGET)
    return device_memory_bytes() // 4


def record_bytes(capacity: int, permutes: bool, dtype) -> int:
    """Bytes one gate's record holds: o2, code, (o1,) c_in, live_out."""
    return capacity * (4 + 1 + (4 if permutes else 0) + jnp.dtype(dtype).itemsize + 1)


def value_and_gradient_stored(start, rows: dict, run_all, final_cotangent, angle_of):
    """One recording pass that keeps every gate's record, then the adjoint sweep over them: the
    fastest reverse mode, holding L records (record_bytes each). Same contract as value_and_gradient,
    with rows of shape (L, ...) and run_all(buf, rows) the recording scan over all of them; terms
    and d value / d angle come back as (1, L)."""
    end, (terms, c_in, live_out, recs) = run_all(start, rows)
    value, lam = final_cotangent(end)

    def back(lam, xs):
        row, c, live, rec = xs
        return adjoint_step(lam, c, live, rec, row, angle_of(row))

    lam, d_angles = lax.scan(back, lam, (rows, c_in, live_out, recs), reverse=True)
    return value, end, terms[None], d_angles[None], jnp.where(start.live, lam, 0)


def value_and_gradient(start, rows: dict, params, num_segments: int, run_segment, final_cotangent, angle_of):
    """Forward in segments, then replay and adjoint sweep, in one loop over 2 * num_segments tasks.

    start: the initial buffer (a pytree whose `coeffs` and `live` fields are (C,)); rows: the gate table
    as (num_segments, seg, ...) arrays; run_segment(buf, rows_s) -> (buf, (terms, c_in, live_out,
    Record)) stacked over the segment; final_cotangent(buf) -> (value, d value / d coeffs);
    angle_of(row) -> the gate's angle. Returns (value, the final buffer, terms (num_segments, seg),
    d value / d angle per gate (num_segments, seg), d value / d initial coeffs).
    """
    S = num_segments
    seg = rows["kind"].shape[1]
    starts = jax.tree_util.tree_map(lambda a: jnp.zeros((S,) + a.shape, a.dtype), start)
    zero = jnp.zeros((), start.coeffs.dtype)

    def task(carry, t):
        buf, starts, lam, value, d_angles, terms = carry
        forward = t < S
        s = jnp.where(forward, t, 2 * S - 1 - t)
        begin = jax.tree_util.tree_map(lambda b, st: jnp.where(forward, b, st[s]), buf, starts)
        rows_s = jax.tree_util.tree_map(lambda a: a[s], rows)
        end, (seg_terms, c_in, live_out, recs) = run_segment(begin, rows_s)
        starts = jax.tree_util.tree_map(lambda st, b: st.at[s].set(jnp.where(forward, b, st[s])), starts, begin)
        buf = jax.tree_util.tree_map(lambda e, b: jnp.where(forward, e, b), end, buf)
        terms = terms.at[s].set(jnp.where(forward, seg_terms, terms[s]))
        value, lam = lax.cond(t == S - 1, lambda: final_cotangent(end), lambda: (value, lam))

        def sweep(lam):
            def back(lam, k):
                row = jax.tree_util.tree_map(lambda a: a[k], rows_s)
                rec = jax.tree_util.tree_map(lambda a: a[k], recs)
                return adjoint_step(lam, c_in[k], live_out[k], rec, row, angle_of(row))

            return lax.scan(back, lam, jnp.arange(seg - 1, -1, -1))

        lam, d_seg = lax.cond(forward, lambda lam: (lam, jnp.zeros(seg, lam.dtype)), sweep, lam)
        d_angles = d_angles.at[s].set(jnp.where(forward, d_angles[s], d_seg[::-1]))
        return (buf, starts, lam, value, d_angles, terms), None

    lam0 = jnp.zeros_like(start.coeffs)
    init = (start, starts, lam0, zero, jnp.zeros((S, seg), lam0.dtype), jnp.zeros((S, seg), jnp.int32))
    (buf, _, lam, value, d_angles, terms), _ = lax.scan(task, init, jnp.arange(2 * S))
    return value, buf, terms, d_angles, jnp.where(start.live, lam, 0)
