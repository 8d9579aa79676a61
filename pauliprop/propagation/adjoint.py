"""Reverse mode of the propagation loop: each unit's recorded coefficient map, transposed by gathers.

With its truncation decisions frozen, every unit maps the coefficient vector linearly, and simply:
an input slot feeds at most two output slots (engine.Record). The forward pass runs the units with
`record=True` and keeps their Records as rows of a stack (a LAYER unit a row per pass, with each
slot's rotation in the layer); the backward sweep applies their transposes, last row first:
lam_in = A * lam_out[own] + B * lam_out[to] (gathers), and for a rotation the angle's derivative
sum_q c_q (A' lam_out[q] + B' lam_out[to_q]) from the recorded input coefficients, added to its
rotation's row (`d_rot`, one a row of the rotation table). No unit runs again in the sweep.

Rows: a unit that changes no coefficient (a rotation that turned no word and dropped none, a no-op)
writes none; the others one, a LAYER unit one a pass (`layer_rows` bounds them), so
`RecordRows.full` bounds the rows a forward pass writes.

Memory (`stack_rows`, `record_budget`): a row is 13 bytes a slot (float64 coefficients; 14-17 with
layers). The units run in segments of about sqrt(2 units); the forward keeps each segment's starting
buffer and records segments while the stack has room for a whole one, and the sweep runs a segment
it could not record once more, from its start, just before sweeping it: one replay at most. GPUs hold
every row a forward pass can write when that fits a quarter of the device's memory (the allocator's
limit) and half of what is free when the gradient is traced, times the batch being traced; CPUs a
third of them (XLA:CPU fills each row with zeros at every call); a budget too small for that holds
one segment's rows, and every segment replays.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..algebra import words as pauli_words
from ..algebra.overlap import table_overlaps
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
    """num_units rounded up to a sixteenth of its power of two (the tables' own padding doubles, which
    would double the records), so similar circuits share programs."""
    n = max(int(num_units), 1)
    step = max(1, (1 << (n - 1).bit_length()) // 16)
    return -(-n // step) * step


def segment_length(units: int) -> int:
    """Units a segment (value_and_grad): about sqrt(2 units). Each of the 2 S tasks moves a few buffers
    (its start, the replay's), so fewer, longer segments cost less where nothing replays (kicked Ising
    at 8 steps, 1,280 units, 2-core CPU: value_and_grad 0.44 s in segments of 32 units, 0.41 s in
    segments of 64), while a replay holds a segment's rows: memory about sqrt(units) either way."""
    return max(1, math.isqrt(2 * max(units, 1) - 1) + 1)


class RecordRows(NamedTuple):
    """The static sizes of a gradient program (part of its key)."""

    units: int  # the units it runs (the circuit's, then no-ops: record_rows)
    full: int  # the most rows a forward pass writes (layer_rows)
    segment: int  # ... a segment of segment_length(units) units writes


def layer_rows(units: "schedule.Units", sched: "schedule.Schedule", max_weight: int | None = None) -> np.ndarray:
    """Rows each unit can write: one, a LAYER unit one a pass, at most one a rotation of its layer. With
    a per-gate max_weight, the words meeting a layer weigh at most that much, and a word's passes are
    the layer's rotations it anticommutes with, at most max_weight times the most of them on one
    qubit (a layer of 64 RX under max_weight 5: 5 passes, not 64)."""
    rows = np.ones(units.length, np.int64)
    for u in np.flatnonzero(units.kind == schedule.U_LAYER):
        start, count = int(units.start[u]), int(units.count[u])
        rows[u] = max(count, 1)
        if max_weight is not None:
            sites = np.unpackbits((sched.rot_gx[start:start + count] | sched.rot_gz[start:start + count])
                                  .astype("<u4").view(np.uint8), axis=1, bitorder="little")
            rows[u] = max(1, min(count, max_weight * int(sites.sum(axis=0).max(initial=1))))
    return rows


def record_shape(units: "schedule.Units", sched: "schedule.Schedule", truncation) -> RecordRows:
    """RecordRows of a program's units (layer_rows)."""
    n = record_rows(units.length)
    seg = segment_length(n)
    weight = truncation.max_weight if truncation.rules.weight_each_gate else None
    per_unit = np.ones(-(-n // seg) * seg, np.int64)
    per_unit[:units.length] = layer_rows(units, sched, weight)
    per_segment = per_unit.reshape(-1, seg).sum(1)
    return RecordRows(n, record_rows(int(per_unit[:n].sum())), record_rows(int(per_segment.max())))


class Stack(NamedTuple):
    """Recorded rows, in the order they come."""

    recs: engine.Record  # (K, C) each
    gates: jax.Array | None  # (K, C): a layer pass's rotation of each slot, in its layer (None: no layers)
    unit: jax.Array  # (K,) int32: the unit each row records


def _gate_dtype(lanes: int):
    """The narrowest integer that holds a rotation's place in a layer (at most 32 W of them)."""
    most = pauli_words.LANE_BITS * lanes
    return jnp.uint8 if most <= 256 else jnp.int16 if most <= 32768 else jnp.int32


def _empty_stack(rows: int, c: int, dtype, cfg: engine.Config, lanes: int) -> Stack:
    gate = _gate_dtype(lanes)
    layers = schedule.U_LAYER in cfg.units
    return Stack(engine.Record(jnp.zeros((rows, c), jnp.int32), jnp.zeros((rows, c), jnp.uint8),
                               jnp.zeros((rows, c), dtype)),
                 jnp.zeros((rows, c), gate) if layers else None, jnp.zeros(rows, jnp.int32))


def row_bytes(cfg: engine.Config, dtype, lanes: int) -> int:
    """Bytes of a stack row (_empty_stack)."""
    gates = jnp.dtype(_gate_dtype(lanes)).itemsize if schedule.U_LAYER in cfg.units else 0
    return engine.record_bytes(cfg.capacity, dtype) + cfg.capacity * gates + 4


def _put(stack: Stack, k, rec: engine.Record, u, gate=None) -> Stack:
    """stack with row k = (rec, gate, u)."""
    row = lambda a, r: lax.dynamic_update_slice(a, r[None].astype(a.dtype), (k, jnp.int32(0)))
    gates = stack.gates
    if gates is not None:  # programs with layers: every row has its gates (zeros but a layer's pass)
        gates = row(gates, gate)
    return Stack(jax.tree_util.tree_map(row, stack.recs, rec), gates, stack.unit.at[k].set(u))


def _unturned(rec: engine.Record):
    return count((rec.code & TURN) != 0) == 0


def _record_units(T, params, limits, cfg, first, n, size: int, state, stack: Stack, k, write):
    """Units first .. first + n - 1 forward from state (buffer, peak live count, where the live words act
    as engine.run keeps it with cfg.skip_unmet), each row that changes a coefficient (a unit's, a
    layer's pass's) written to stack at k, k + 1, ... where `write`: (state, stack, next free row, live
    terms after each unit, `size` >= n of them). n may be traced (a while loop).

    Units that change nothing (no-ops, rotations that split no word: most of a deep circuit's) are
    passed in a loop of their own, whose carry holds no buffer. The others write their rows, where not
    `write` (or where they changed nothing after all) to the stack's last row, a scratch row: the
    stack never enters a conditional, which XLA:CPU copies whole at each one unless copy insertion runs
    its region analysis (a user's own jax.jit: 160 s a call for the kicked Ising's 1 GB of rows
    instead of 0.4 s), nor a loop of its own per unit but a layer (XLA:CPU copies the buffer into one)."""
    layers = schedule.U_LAYER in cfg.units
    others = any(k not in (schedule.U_NOOP, schedule.U_LAYER) for k in cfg.units)  # kinds of a row of their own
    lanes, dtype = state[0].words.shape[1] // 2, state[0].coeffs.dtype
    scratch = stack.unit.shape[0] - 1

    def keep(stack, k, rec, u, same, gate=None):
        """The row unless it changes nothing (in a batch: for every member, which share their rows)."""
        advance = write & shared(~same)
        stack = _put(stack, jnp.where(advance, k, scratch), rec, u, gate)
        return stack, k + advance.astype(jnp.int32)

    def unit_row(b, u, acts, rotation, active):
        before = count(b.live)
        b, _, rec = engine.apply_unit(b, u, T, params, limits, cfg, live_count=before, record=True, active=active,
                                      acts=acts if cfg.skip_unmet else None, rotation=rotation)
        same = ~active | ((T["u_kind"][u] == schedule.U_SPLIT) & _unturned(rec) & (count(b.live) == before))
        return b, rec, same

    def idle(i, b, acts):
        """Whether unit first + i changes nothing: a no-op (or a kind the program holds no code for: the
        observable's merge where it ran before the loop), or a rotation that splits no word (for every
        member of a batch); and its rotation (engine.unit_rotation; None in a program without
        rotations one by one)."""
        u = (first + i).astype(jnp.int32)
        kind = T["u_kind"][u]
        noop = ~jnp.any(kind == jnp.asarray([k for k in cfg.units if k != schedule.U_NOOP] or [-1]))
        if schedule.U_SPLIT not in cfg.units:
            return ~shared(~noop), None
        rotation = engine.unit_rotation(b, u, T, params, acts if cfg.skip_unmet else None, kind == schedule.U_SPLIT)
        return ~shared(~(noop | ((kind == schedule.U_SPLIT) & (rotation[3] == 0)))), rotation

    def after(u, b, acts):
        return engine.acts_after(T, u, b, acts) if cfg.skip_unmet else acts

    def skip(i, b, acts, terms):
        """Past the units from first + i on that change nothing, in a loop whose carry holds no buffer (a
        unit that changes nothing writes no row, and runs no code beyond its test); with the rotation of
        the unit it stops at, which its test computed."""
        live = count(b.live)

        def test(i, acts):
            still, rotation = idle(i, b, acts)
            return (i < n) & still, rotation

        def go(c):
            i, acts, terms, _, _ = c
            acts = after((first + i).astype(jnp.int32), b, acts)
            return (i + 1, acts, terms.at[i].set(live)) + test(i + 1, acts)

        i, acts, terms, _, rotation = lax.while_loop(lambda c: c[3], go, (i, acts, terms) + test(i, acts))
        return i, acts, terms, rotation

    def step(carry):
        """One unit: its row, or a layer's passes (a loop of rows: on GPUs, a test of the host a row
        rather than the several a row in one loop over all rows)."""
        i, (b, peak, acts), stack, k, terms = carry
        i, acts, terms, rotation = skip(i, b, acts, terms)
        active = i < n  # past the last unit: a no-op whose row goes to the scratch row
        u = jnp.minimum(first + i, T["u_kind"].shape[0] - 1).astype(jnp.int32)
        if layers:
            layer = engine.layer_of(u, T, params, limits, dtype)
            is_layer = shared(active & (T["u_kind"][u] == schedule.U_LAYER))
            # a program of layers alone has no other unit a step meets (no-ops pass in the skip loop), and
            # past the last unit it runs no pass
            passes = lax.cond(is_layer, lambda b: engine.layer_passes(b, layer), lambda b: jnp.int32(int(others)), b)
            no_gate = jnp.zeros(b.coeffs.shape, _gate_dtype(lanes))

            def row(j, c):  # the unit's row, or the layer's pass j
                b, stack, k = c

                def pass_(b):
                    b, _, rec, gate = engine.layer_pass(b, layer, j, cfg, record=True)
                    return b, rec, _unturned(rec), gate.astype(no_gate.dtype)

                if not others:
                    b, rec, same, gate = pass_(b)
                else:
                    b, rec, same, gate = lax.cond(is_layer, pass_,
                                                  lambda b: unit_row(b, u, acts, rotation, active) + (no_gate,), b)
                stack, k = keep(stack, k, rec, u, same, gate)
                return b, stack, k

            b, stack, k = lax.fori_loop(0, passes, row, (b, stack, k))
        else:
            b, rec, same = unit_row(b, u, acts, rotation, active)
            stack, k = keep(stack, k, rec, u, same)
        live = count(b.live)
        terms = terms.at[jnp.minimum(i, size - 1)].set(jnp.where(active, live, terms[jnp.minimum(i, size - 1)]))
        return i + 1, (b, jnp.maximum(peak, live), after(u, b, acts)), stack, k, terms

    _, state, stack, k, terms = lax.while_loop(lambda c: c[0] < n, step,
                                               (jnp.int32(0), state, stack, k, jnp.zeros(size, jnp.int32)))
    return state, stack, k, terms


def _start(buf, peak, cfg):
    return buf, peak, engine.support(buf) if cfg.skip_unmet else jnp.uint32(0)


def row_backward(rec: engine.Record, gate, u, lam, T, params, d_rot, kinds=None):
    """(cotangent of a row's input coefficients, d_rot plus its rotations' d value / d angle) from lam,
    that of its output. The row is unit u's Record, or with `gate` (each slot's rotation in u's
    layer) a pass of LAYER unit u. kinds: the unit kinds the program holds (None: all), whose
    transposes it needs.

    CPUs pick the row kind's transpose in a lax.switch (a diagonal unit gathers nothing); GPUs compute
    all of them and select, where a conditional would wait for the host at every row."""
    at = lambda idx: lam.at[idx].get(mode="fill", fill_value=0)  # the capacity: no slot, 0
    has = lambda bit: (rec.code & bit) != 0
    kind = T["u_kind"][u]
    j, _, _ = engine.generator(T, u)
    rot_rows = d_rot.shape[0]

    def diagonal(lam, to_lam):
        return rec.value * lam, d_rot

    def turned(lam, to_lam, cos, sin):
        """The rotation's transpose with each slot's cos and sin, and each slot's d value / d its angle."""
        own, fed = jnp.where(has(OWN), lam, 0), jnp.where(has(FED), to_lam, 0) * jnp.where(has(NEG), -1, 1)
        turn = has(TURN)
        d = rec.value * (jnp.where(turn, -sin, 0) * own + cos * fed)
        return jnp.where(turn, cos, 1) * own + sin * fed, d

    def rotation(lam, to_lam):
        angle = engine.rotation_angle(T, j, params).astype(lam.dtype)
        out, d = turned(lam, to_lam, jnp.cos(angle), jnp.sin(angle))
        return out, d_rot.at[j].add(jnp.sum(d))

    def layer_pass(lam, to_lam):
        rows = engine.layer_rotations(u, T)
        angle = engine.rotation_angle(T, rows, params).astype(lam.dtype)
        g = jnp.minimum(gate.astype(jnp.int32), rows.shape[0] - 1)
        out, d = turned(lam, to_lam, jnp.cos(angle)[g], jnp.sin(angle)[g])
        return out, d_rot.at[jnp.where(has(TURN), rows[g], rot_rows)].add(d, mode="drop")

    def merged(lam, to_lam):
        gamma = T["mg_gamma"][T["u_start"][u]].astype(lam.dtype)
        scale = rec.code & 3
        factor = jnp.where(scale == 1, 1, jnp.where(scale == 2, jnp.sqrt(1 - gamma), jnp.where(scale == 3, 1 - gamma, 0)))
        damped_to = jnp.where(has(DAMPED), rec.value, lam.shape[0]).astype(jnp.int32)  # value: a slot elsewhere
        return factor * to_lam + jnp.where(has(DAMPED), gamma * at(damped_to), 0), d_rot

    # a row's kind: its unit's (no-ops write none: _record_units passes them); the first branch where none held
    held = lambda *ks: kinds is None or any(k in kinds for k in ks)
    branches, index = [], jnp.int32(0)
    for ks, transpose in (((schedule.U_CLIFFORD, schedule.U_CHANNEL, schedule.U_TRUNCATE), diagonal),
                          ((schedule.U_SPLIT,), rotation), ((schedule.U_MERGE,), merged),
                          ((schedule.U_LAYER,), layer_pass)):
        if held(*ks) and (transpose is not layer_pass or gate is not None):
            index = jnp.where(jnp.any(kind == jnp.asarray(ks)), len(branches), index)
            branches.append(transpose)
    if len(branches) <= 1:  # one kind of row (a program of layers alone): no switch
        only = (branches or [diagonal])[0]
        return only(lam, None if only is diagonal else at(rec.to))
    if on_cpu():
        return lax.switch(index, [lambda lam, f=f: f(lam, None if f is diagonal else at(rec.to)) for f in branches],
                          lam)
    to_lam = at(rec.to)
    outs = [f(lam, to_lam) for f in branches]
    return jax.tree_util.tree_map(lambda *xs: jnp.select([index == i for i in range(1, len(xs))], xs[1:], xs[0]),
                                  *outs)


def _sweep(T, params, stack: Stack, lo, hi, lam, d_rot, kinds=None):
    """The transposes of stack rows hi - 1, ..., lo (traced bounds) applied to lam: (lam, d_rot). kinds:
    the unit kinds the program holds (None: all)."""

    def back(i, carry):
        lam, d_rot = carry
        k = hi - 1 - i
        rec = jax.tree_util.tree_map(lambda a: a[k], stack.recs)
        gate = None if stack.gates is None else stack.gates[k]
        return row_backward(rec, gate, stack.unit[k], lam, T, params, d_rot, kinds)

    return lax.fori_loop(0, hi - lo, back, (lam, d_rot))


def _param_grads(T, d_rot, params):
    """d value / d params from each rotation row's d value / d angle (angle = scale p + offset)."""
    idx = T["rot_index"]
    mine = idx >= 0
    d = jnp.where(mine, T["rot_scale"].astype(d_rot.dtype) * d_rot, 0)
    return jnp.zeros_like(params).at[jnp.where(mine, idx, params.shape[0])].add(d.astype(params.dtype), mode="drop")


def _final(end: engine.Buffer, table):
    """(value, its cotangent on the final coefficients: each live word's overlap)."""
    overlaps = table_overlaps(end.x, end.z, table).astype(end.coeffs.dtype)
    lam = jnp.where(end.live, overlaps, 0)
    return jnp.sum(jnp.where(end.live, end.coeffs, 0) * overlaps), lam


def stack_rows(rows: RecordRows, nbytes: int, cpu: bool) -> int:
    """The rows the forward pass may record into (the stack holds rows.segment more, for the replays,
    and a scratch row): all it can write (rows.full) where they fit record_budget, on CPUs a third of
    them (see value_and_grad), and never fewer than one segment's (rows.segment). nbytes: a row's
    bytes times the batch being traced."""
    want = max(rows.full // 3, 2 * rows.segment) if cpu else rows.full
    budget = record_budget() // max(nbytes, 1) - rows.segment - 1
    return max(rows.segment, min(want, rows.full, budget))


def value_and_grad(T: dict, buf: engine.Buffer, params, limits: Limits, table, cfg: engine.Config,
                   rows: RecordRows):
    """(value, the final buffer's dropped norms, Progress, d value / d params, d value / d initial
    coefficients).

    Runs units 0 .. rows.units - 1 (the circuit's, then no-ops) with the truncation of a program that
    cuts (no stop), in segments of segment_length units: one scan over 2 S tasks, the first S running
    the segments forward (keeping each one's starting buffer) and recording their rows into the stack
    while it has room for a whole segment's, the last S sweeping back over each segment's rows, last
    segment first; a segment the forward could not record runs once more from its start, recording
    into the rows past the recorded ones, just before its sweep. Forward and replay are one loop body
    (one copy of the engine in the program).

    The stack's rows (`stack_rows`): GPUs hold all a forward pass can write where they fit the
    budget, so nothing replays. CPUs hold a third: XLA:CPU has no uninitialized buffer, so every row
    is zero-filled at each call, and most units change no coefficient and write none (the kicked
    Ising at 8 steps, 2-core CPU: 335 of 1,280 rows written). A CPU stack of KEEP_ABOVE bytes or more
    has the host's allocator keep freed memory (memory.keep_freed_host_memory), else each call faults
    all its pages in again: value_and_grad there 0.42 s with 426 rows and 0.62 s with 1,280 when they
    were faulted in, 0.31-0.37 s and 0.30 s when kept (a third holds memory down at about that speed)."""
    dtype, lanes = buf.coeffs.dtype, buf.words.shape[1] // 2
    seg = segment_length(rows.units)
    S = -(-rows.units // seg)  # the last segment may hold fewer units
    nbytes = row_bytes(cfg, dtype, lanes) * batch_size()
    K = stack_rows(rows, nbytes, on_cpu())
    if on_cpu() and (K + rows.segment + 1) * nbytes >= memory.KEEP_ABOVE:
        memory.keep_freed_host_memory()  # the stack's pages reused from call to call, not faulted in again
    # segment starts, and a slot the backward tasks write to (no conditional copies a buffer)
    starts = jax.tree_util.tree_map(lambda a: jnp.zeros((S + 1,) + a.shape, a.dtype), buf)

    def task(carry, t):
        b, starts, stack, k, spans, lam, val, dropped, d_rot, terms, peak = carry
        forward = t < S
        s = jnp.where(forward, t, 2 * S - 1 - t)
        recorded = spans[s, 0] >= 0
        # the forward records a segment while a whole segment's rows fit its K rows; the sweep replays one it
        # did not, into the rows past the recorded ones (the stack holds rows.segment more)
        write = jnp.where(forward, k + rows.segment <= K, ~recorded)
        runs = jnp.where(forward | ~recorded, jnp.clip(rows.units - s * seg, 0, seg), 0)
        starts = jax.tree_util.tree_map(lambda st, x: lax.dynamic_update_index_in_dim(st, x, jnp.where(forward, s, S), 0),
                                        starts, b)
        begin = jax.tree_util.tree_map(lambda st: st[s], starts)
        (b, seg_peak, _), stack, k_end, counts = _record_units(T, params, limits, cfg, s * seg, runs, seg,
                                                               _start(begin, peak, cfg), stack, k, write)
        spans = spans.at[s].set(jnp.where(forward & write, jnp.stack([k, k_end]), spans[s]))
        terms = terms.at[s].set(jnp.where(forward, counts, terms[s]))
        peak = jnp.where(forward, seg_peak, peak)
        val, lam, dropped = lax.cond(t == S - 1, lambda: _final(b, table) + (b.dropped,), lambda: (val, lam, dropped))
        # the rows to sweep: none forward; the forward's where it recorded the segment, else the replay's
        lo = jnp.where(forward, 0, jnp.where(recorded, spans[s, 0], k))
        hi = jnp.where(forward, 0, jnp.where(recorded, spans[s, 1], k_end))
        lam, d_rot = _sweep(T, params, stack, lo, hi, lam, d_rot, cfg.units)
        k = jnp.where(forward, k_end, k)  # replays reuse the rows past the recorded ones
        return (b, starts, stack, k, spans, lam, val, dropped, d_rot, terms, peak), None

    init = (buf, starts, _empty_stack(K + rows.segment + 1, cfg.capacity, dtype, cfg, lanes), jnp.int32(0),
            jnp.full((S, 2), -1, jnp.int32), jnp.zeros_like(buf.coeffs), jnp.zeros((), dtype), buf.dropped,
            jnp.zeros(T["rot_index"].shape[0], dtype), jnp.zeros((S, seg), jnp.int32), count(buf.live))
    (_, _, _, _, _, lam, val, dropped, d_rot, terms, peak), _ = lax.scan(task, init, jnp.arange(2 * S))
    return (val, dropped, _progress(T, rows.units, terms, peak), _param_grads(T, d_rot, params),
            jnp.where(buf.live, lam, 0))


def _progress(T, units, terms, peak):
    total = T["u_kind"].shape[0]
    return engine.Progress(jnp.asarray(units, jnp.int32), jnp.int32(0),
                           jnp.zeros(total, jnp.int32).at[:units].set(terms.reshape(-1)[:units]), peak)
