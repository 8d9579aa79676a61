"""Reverse mode of the propagation loop: each unit's recorded coefficient map, transposed by gathers.

With its truncation decisions frozen, every unit maps the coefficient vector linearly, and simply:
an input slot feeds at most two output slots (engine.Record). The forward pass runs the units with
`record=True` and keeps each unit's Record; the backward sweep applies their transposes, last unit
first: lam_in = A * lam_out[own] + B * lam_out[to] (gathers), and for a rotation the angle's
derivative sum_q c_q (A' lam_out[q] + B' lam_out[to_q]) from the recorded input coefficients. No
unit runs again in the sweep.

Memory (`record_budget`): a Record is 13 bytes a slot (float64 coefficients) a unit. When the
records of all units, times the batch being traced, fit a quarter of the device's memory (GPUs: the
allocator's limit; CPUs: the machine's physical memory) and half of what is free when the gradient
is traced, one forward pass keeps them all. Otherwise (`checkpointed`) the forward keeps only the
buffer at the start of each segment of about sqrt(units) units, and each segment runs once more,
recording, just before its sweep: one replay, (segments + segment length) buffers of memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..runtime import memory
from ..runtime.batching import batch_size, shared
from ..runtime.prefix import count, on_cpu
from . import engine, schedule
from .engine import DAMPED, FED, NEG, OWN, TURN
from .truncation import Limits

# bytes the records may take; None: record_budget's rule. Read when a gradient is traced, and JAX keeps
# traces: a new value takes effect for programs traced after jax.clear_caches()
RECORD_BUDGET: int | None = None


def record_budget() -> int:
    """RECORD_BUDGET, or a quarter of the device's memory and at most half of what is free (read when a
    gradient is traced)."""
    if RECORD_BUDGET is not None:
        return int(RECORD_BUDGET)
    return min(memory.device_memory_bytes() // 4, memory.available_bytes() // 2)


def record_rows(num_units: int) -> int:
    """The units a gradient program runs: num_units rounded up to a sixteenth of its power of two (the
    tables' own padding doubles, which would double the records), so similar circuits share programs."""
    n = max(int(num_units), 1)
    step = max(1, (1 << (n - 1).bit_length()) // 16)
    return -(-n // step) * step


def segment_length(rows: int) -> int:
    """The checkpointed sweep's segment: a power of two near sqrt(rows) that divides rows."""
    seg = 1 << ((max(rows, 1).bit_length() - 1 + 1) // 2)
    while rows % seg:
        seg //= 2
    return seg


def unit_backward(rec: engine.Record, u, lam, T, params):
    """(cotangent of unit u's input coefficients, d value / d its angle) from lam, that of its output.

    CPUs pick the unit kind's transpose in a lax.switch (a diagonal unit gathers nothing); GPUs compute
    all three and select, where a conditional would wait for the host at every unit."""
    zero = jnp.zeros((), lam.dtype)
    at = lambda idx: lam.at[idx].get(mode="fill", fill_value=0)  # the capacity: no slot, 0
    has = lambda bit: (rec.code & bit) != 0
    kind = T["u_kind"][u]

    def diagonal(lam):
        return rec.value * lam, zero

    def rotation(lam, to_lam):
        j, _, _ = engine.generator(T, u)
        angle = engine.rotation_angle(T, j, params).astype(lam.dtype)
        cos, sin = jnp.cos(angle), jnp.sin(angle)
        own, fed = jnp.where(has(OWN), lam, 0), jnp.where(has(FED), to_lam, 0) * jnp.where(has(NEG), -1, 1)
        turn = has(TURN)
        d_angle = jnp.sum(rec.value * (jnp.where(turn, -sin, 0) * own + cos * fed))
        return jnp.where(turn, cos, 1) * own + sin * fed, d_angle

    def merged(to_lam, damped_to):
        gamma = T["mg_gamma"][T["u_start"][u]].astype(lam.dtype)
        scale = rec.code & 3
        factor = jnp.where(scale == 1, 1, jnp.where(scale == 2, jnp.sqrt(1 - gamma), jnp.where(scale == 3, 1 - gamma, 0)))
        return factor * to_lam + jnp.where(has(DAMPED), gamma * at(damped_to), 0), zero

    is_merge, is_split = kind == schedule.U_MERGE, kind == schedule.U_SPLIT
    if on_cpu():
        index = jnp.where(is_merge, 2, jnp.where(is_split, 1, 0))
        return lax.switch(index, [diagonal, lambda lam: rotation(lam, at(rec.to)),
                                  lambda lam: merged(at(rec.to), rec.value.astype(jnp.int32))], lam)
    to_lam = at(rec.to)
    damped_to = jnp.where(is_merge, rec.value, lam.shape[0]).astype(jnp.int32)  # value: a coefficient elsewhere
    pick = lambda a, b, c: jax.tree_util.tree_map(
        lambda x, y, z: jnp.where(is_merge, z, jnp.where(is_split, y, x)), a, b, c)
    return pick(diagonal(lam), rotation(lam, to_lam), merged(to_lam, damped_to))


def _param_grads(T, d_angles, params):
    """d value / d params from each unit's d value / d angle (rotations only; angle = scale p + offset)."""
    rows = d_angles.shape[0]
    j = jnp.minimum(T["u_start"][:rows], T["rot_index"].shape[0] - 1)
    idx = T["rot_index"][j]
    mine = (T["u_kind"][:rows] == schedule.U_SPLIT) & (idx >= 0)
    d = jnp.where(mine, T["rot_scale"][j].astype(d_angles.dtype) * d_angles, 0)
    return jnp.zeros_like(params).at[jnp.where(mine, idx, params.shape[0])].add(d.astype(params.dtype), mode="drop")


def _final(end: engine.Buffer, table):
    """(value, its cotangent on the final coefficients: each live word's overlap)."""
    overlaps = engine.word_overlaps(end.x, end.z, table).astype(end.coeffs.dtype)
    lam = jnp.where(end.live, overlaps, 0)
    return jnp.sum(jnp.where(end.live, end.coeffs, 0) * overlaps), lam


def _run(T, params, limits, cfg, first):
    """A lax.scan body over units first, first + 1, ... that keeps their Records and live counts. Its
    carry: (buffer, peak, where the live words act, as engine.run keeps it with cfg.skip_unmet)."""

    def one(carry, i):
        b, peak, acts = carry
        u = first + i
        b, _, rec = engine.apply_unit(b, u, T, params, limits, cfg, acts=acts if cfg.skip_unmet else None,
                                      record=True)
        live = count(b.live)
        if cfg.skip_unmet:  # as engine.run: a rotation adds its generator's sites, other units move words
            _, gx, gz = engine.generator(T, u)
            acts = lax.cond(shared(T["u_kind"][u] == schedule.U_SPLIT), lambda: acts | jnp.concatenate([gx, gz]),
                            lambda: engine.support(b))
        return (b, jnp.maximum(peak, live), acts), (rec, live)

    return one


def _start(buf, peak, cfg):
    return buf, peak, engine.support(buf) if cfg.skip_unmet else jnp.uint32(0)


def value_and_grad(T: dict, buf: engine.Buffer, params, limits: Limits, table, cfg: engine.Config, rows: int):
    """(value, final buffer, Progress, d value / d params, d value / d initial coefficients).

    Runs units 0 .. rows - 1 (rows >= the circuit's units; the rest are NOOPs) with the truncation of a
    program that cuts (no stop). Records all units when they fit record_budget, else checkpointed.

    A unit that changes no coefficient (a rotation that turned no word and dropped none, a no-op: most
    of a light cone's rotations while the observable is small) keeps no record: its transpose is the
    identity on the cotangent, which stays 0 on dead slots. The others' records are stacked in the
    order they come (CPUs write only theirs: a record is 13 bytes a slot to move), and the sweep
    reads each unit's row from `index` (-1: none)."""
    need = rows * engine.record_bytes(cfg.capacity, buf.coeffs.dtype) * batch_size()
    if need > record_budget():
        return checkpointed(T, buf, params, limits, table, cfg, rows)
    c, dtype = cfg.capacity, buf.coeffs.dtype
    step = _run(T, params, limits, cfg, 0)
    cpu = on_cpu()

    def forward(u, carry):
        state, stack, index, k, terms = carry
        before = count(state[0].live)
        state, (rec, live) = step(state, u)
        kind = T["u_kind"][u]
        same = ((kind == schedule.U_SPLIT) & (count((rec.code & TURN) != 0) == 0) & (live == before)) | (
            kind == schedule.U_NOOP)
        same = shared(same)
        write = lambda st: jax.tree_util.tree_map(lambda a, r: lax.dynamic_update_slice(a, r[None], (k, jnp.int32(0))), st, rec)
        stack = lax.cond(same, lambda st: st, write, stack) if cpu else write(stack)
        index = index.at[u].set(jnp.where(same, -1, k))
        return state, stack, index, k + jnp.where(same, 0, 1).astype(jnp.int32), terms.at[u].set(live)

    stack = engine.Record(jnp.zeros((rows, c), jnp.int32), jnp.zeros((rows, c), jnp.uint8), jnp.zeros((rows, c), dtype))
    init = (_start(buf, count(buf.live), cfg), stack, jnp.full(rows, -1, jnp.int32), jnp.int32(0),
            jnp.zeros(rows, jnp.int32))
    (end, peak, _), stack, index, _, terms = lax.fori_loop(0, rows, forward, init)
    val, lam = _final(end, table)

    def back(lam, u):
        i = index[u]
        transpose = lambda lam: unit_backward(jax.tree_util.tree_map(lambda a: a[jnp.maximum(i, 0)], stack), u, lam,
                                              T, params)
        if cpu:
            return lax.cond(shared(i < 0), lambda lam: (lam, jnp.zeros((), lam.dtype)), transpose, lam)
        out, d = transpose(lam)
        return jnp.where(i < 0, lam, out), jnp.where(i < 0, 0, d)

    lam, d_angles = lax.scan(back, lam, jnp.arange(rows), reverse=True)
    return val, end, _progress(T, rows, terms, peak), _param_grads(T, d_angles, params), jnp.where(buf.live, lam, 0)


def _progress(T, rows, terms, peak):
    total = T["u_kind"].shape[0]
    return engine.Progress(jnp.asarray(rows, jnp.int32), jnp.int32(0),
                           jnp.zeros(total, jnp.int32).at[:rows].set(terms.reshape(-1)), peak)


def checkpointed(T: dict, buf: engine.Buffer, params, limits: Limits, table, cfg: engine.Config, rows: int):
    """value_and_grad keeping only segment starts: one scan over 2 S tasks, the first S running the
    segments forward (from the buffer), the last S running each segment again from its start, last
    first, and sweeping back over its records. Forward and replay are one loop body (one copy of the
    engine in the program)."""
    seg = segment_length(rows)
    S = rows // seg
    starts = jax.tree_util.tree_map(lambda a: jnp.zeros((S,) + a.shape, a.dtype), buf)
    pick = lambda flag, a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(flag, x, y), a, b)

    def task(carry, t):
        b, starts, lam, val, d_angles, terms, peak = carry
        forward = t < S
        s = jnp.where(forward, t, 2 * S - 1 - t)
        begin = pick(forward, b, jax.tree_util.tree_map(lambda a: a[s], starts))
        (end, seg_peak, _), (recs, counts) = lax.scan(_run(T, params, limits, cfg, s * seg),
                                                      _start(begin, peak, cfg), jnp.arange(seg))
        starts = jax.tree_util.tree_map(lambda st, x: st.at[s].set(jnp.where(forward, x, st[s])), starts, begin)
        b = pick(forward, end, b)
        terms = terms.at[s].set(jnp.where(forward, counts, terms[s]))
        peak = jnp.where(forward, seg_peak, peak)
        val, lam = lax.cond(t == S - 1, lambda: _final(end, table), lambda: (val, lam))

        def sweep(lam):
            back = lambda lam, xs: unit_backward(xs[0], s * seg + xs[1], lam, T, params)
            return lax.scan(back, lam, (recs, jnp.arange(seg)), reverse=True)

        lam, d_seg = lax.cond(forward, lambda lam: (lam, jnp.zeros(seg, lam.dtype)), sweep, lam)
        d_angles = d_angles.at[s].set(jnp.where(forward, d_angles[s], d_seg))
        return (b, starts, lam, val, d_angles, terms, peak), None

    dtype = buf.coeffs.dtype
    init = (buf, starts, jnp.zeros_like(buf.coeffs), jnp.zeros((), dtype), jnp.zeros((S, seg), dtype),
            jnp.zeros((S, seg), jnp.int32), count(buf.live))
    (end, _, lam, val, d_angles, terms, peak), _ = lax.scan(task, init, jnp.arange(2 * S))
    return (val, end, _progress(T, rows, terms, peak), _param_grads(T, d_angles.reshape(-1), params),
            jnp.where(buf.live, lam, 0))
