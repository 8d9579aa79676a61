"""Pauli terms sharded over devices: each device owns the words whose hash modulo D is its index.

The term buffer is split into D shards of `capacity / D` slots, one a device of a one-axis mesh,
and one program (`jax.shard_map` inside `jax.jit`) runs the loop of engine.py on every shard at
once. A unit (engine.apply_unit: a Clifford run, a rotation, channels, a merge) runs on each shard
as in the unsharded engine, and then, for the units that make or change words:

  route      each live word's owner is `owner(word)` = a 32-bit hash of the word modulo D, so equal
             words always meet on one device, whichever device made them;
  exchange   the words a device holds but does not own (a rotation's spawned partners, a Clifford
             run's moved words) go to their owners in one `lax.all_to_all` of D fixed-size buckets
             of `bucket` words each (static shapes; a bucket that overflows stops the loop and the
             driver doubles it and resumes at that unit, as the unsharded driver grows its buffer);
  settle     the words received are merged with the owner's words they may equal: for a rotation
             exp(-i a/2 G) that is only the owner's words that anticommute with G (a received
             P xor G meets only them), gathered into the smallest room that holds them and merged
             by merge.full_merge, which applies the per-term rules (max_weight, min_abs_coeff,
             max_sins) to the merged coefficients; a Clifford run's moved words equal no other
             word (it permutes words), so they take free slots; an amplitude damping's merge
             merges the whole shard with them;
  cut        the largest-terms cut (max_terms) is global: a radix select on the magnitudes' bits
             whose counts are summed over the devices (`lax.psum`, one a round of 4 bits) finds the
             threshold that keeps exactly max_terms terms, and its ties are decided by
             merge.tie_keys (the word's weight, then its fingerprint; a second global select), so
             the kept set is the one a single device keeps (tie_keys are a function of the word
             alone). Only equal tie keys of two different words (a 48-bit collision) would then be
             ordered by (device, slot) instead of the single device's slot: deterministic, but
             possibly another of the two.

Bits: untruncated and under the per-term rules the results equal the single device's to rounding,
not always bit for bit: a pair split over two devices is summed by merge.full_merge as two rounded
products, cos(a) c_P + sin(a) c_Q, where XLA may contract the single device's sum into one fused
multiply-add (it did on the 2-core CPU in the kicked Ising's rotations). The max_terms cut then keeps
the single device's set wherever the magnitudes agree bit for bit; where exact magnitudes tie (equal
angles) and rounding ordered them, another member of the tie may stay. Measured: the kicked Ising,
20 steps at pi/4, max_terms 200 and min_abs_coeff 1e-9, on 2 and 4 forced host devices kept a few
other terms than one device (value equal to 6e-17, dropped 1-norm 98.978 against 98.982); without
min_abs_coeff the same run kept the same set, with the same coefficients bit for bit, on 1, 2 and 4
devices. (One device is not bit-stable across programs either: pp.expectation gave
0.27315420244121935 without min_abs_coeff and 0.2731542024412193 with it, whose rule dropped 5e-16.)

A rotation's pair {P, P xor G} may sit on two devices: each then sees an unpaired word, keeps
cos(a) c and spawns the partner with sin(a) c, which travels to the partner's owner and is summed
there; so the per-term rules must wait for the exchange (a rule on the half-made coefficient would
drop the wrong terms). On several devices the units therefore run with the per-term rules and the
cut switched off (data: truncation.Limits.off_unless) and `settle` and `cut` apply them; on one
device every pair, duplicate and cut is local, so the unit applies the truncation itself, exactly as
the unsharded engine does, and the exchange (an all-to-all over an axis of size 1) carries nothing.
The dropped 1-norms are kept per device and summed (psum) with the overlap at the end.

Growth: outside a jax trace, a unit that does not fit (a shard's capacity, a bucket, a merge's
received words) is not applied on any device (every shard keeps its buffer from before the unit);
the loop stops there, the driver grows what overflowed (the shards' capacity to at least twice
what the unit needed, or the buckets) and resumes at that unit. So nothing is lost silently. With
a fixed `capacity` an overflow of the shards raises MemoryError instead (the unsharded path cuts
there and reports it; the sharded one has no global cut for an overflow).

Multi-host: call `jax.distributed.initialize()` (with coordinator_address, num_processes and
process_id, or the cluster's environment that JAX reads: SLURM, Open MPI, Cloud TPU) in every
process before anything else touches JAX; `jax.devices()` then lists the devices of all hosts,
the default mesh spans them all, and every process calls `expectation` with the same arguments
(SPMD). The all-to-all and the sums then run over the network through XLA's collectives (NCCL on
GPUs); there is no other transport. The overlap and the stats come back replicated on every host.

Gradients: with traced params (jax.grad, jax.jit) `expectation` runs `run_static`: fixed shards and
buckets, every unit in a scan of checkpointed segments (as engine._run_static), which JAX's own
reverse mode differentiates through the all-to-alls and the cuts: the derivative of the estimator
with its truncation decisions frozen, as pp.expectation's (the engine's adjoint, adjoint.py, records
units' maps on one buffer and does not cross an exchange, so it is not used here). Nothing grows there: a
unit that overflows a shard or a bucket is skipped on every shard, counted and warned about (a
RuntimeWarning), as the unsharded traced path warns about its overflow cuts.

Limits: rotations run one unit each (no layers: engine.layer_unit's passes would each need an
exchange); one parameter set a call (a 2-d params is refused; jax.vmap runs, without the engine's
shared branches); derivatives in params only (the observable's coefficients must be concrete). Memory a device: its shard and, on several
devices, the shard again (the buffer from before the unit, kept to undo a unit that overflowed
somewhere) and 2 x D x bucket exchanged words (the default bucket, a shard's slots / D, makes that
two shards' worth of words: a dense Clifford run moves nearly every word). Every unit's all-to-all
moves the whole buckets, full or not, and a shard hashes all its words after every unit to find
the ones it does not own; on several devices a rotation also sorts its arrivals with the owner's
anticommuting words (merge.full_merge), a second sort beside the split's own.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..algebra import words as pauli_words
from ..algebra.paulisum import PauliSum
from ..circuits.circuit import Circuit
from ..runtime.compilation import Jitted
from ..runtime.prefix import count as _count, first_set, prefix_count
from . import engine, merge, schedule
from .propagate import (Lowered, as_sum, check_inputs, compiler_options, config, default_capacity, is_traced,
                        lowered, merged_observable, next_capacity, observable_support, one_program_per_key,
                        operation_at, params_array, state_table)
from .truncation import NO_TRUNCATION, OFF, Limits, Truncation, tie_type
from ..runtime.devices import backend as current_backend

AXIS = "terms"  # the mesh axis of the default mesh
MIN_SLOTS = 64  # a shard's smallest capacity
ROUTE_SALT = np.uint32(0x5BD1E995)  # the owner's hash is the fingerprint's first half mixed again with this


# ---- routing ------------------------------------------------------------------------------------------

def owner(words, devices: int):
    """(N,) int32: the device that owns each packed word (N, 2W): a hash of the word modulo `devices`.
    A function of the word alone, so equal words made on different devices meet on their owner."""
    if devices == 1:
        return jnp.zeros(words.shape[0], jnp.int32)
    x, z = merge.halves(words)
    h = pauli_words.mix32(pauli_words.fingerprint(x, z)[0] ^ ROUTE_SALT)
    return (h % jnp.uint32(devices)).astype(jnp.int32)


class Exchange(NamedTuple):
    """Words on their way to their owners: D buckets of `bucket` entries (dead entries: meta 0)."""

    words: jax.Array  # (D, B, 2W) uint32
    coeffs: jax.Array  # (D, B)
    meta: jax.Array  # (D, B) int32


def _send(buf: engine.Buffer, devices: int, bucket: int, me):
    """(buffer without the words it does not own, their buckets by owner, the largest bucket's need).
    A bucket holds its first `bucket` words in slot order; the need says how many it should hold."""
    cap, lanes = buf.words.shape
    empty = Exchange(jnp.zeros((devices, bucket, lanes), buf.words.dtype),
                     jnp.zeros((devices, bucket), buf.coeffs.dtype), jnp.zeros((devices, bucket), jnp.int32))
    if devices == 1:  # every word is the one device's own
        return buf, empty, jnp.int32(0)
    own = owner(buf.words, devices)
    away = buf.live & (own != me)
    picks, counts = [], []
    for d in range(devices):
        to_d = away & (own == d)
        counts.append(_count(to_d))
        picks.append(first_set(to_d, bucket))  # slots, `cap` past the end
    src = jnp.stack(picks)  # (D, B)
    ok = src < cap
    s = jnp.minimum(src, cap - 1)
    out = Exchange(jnp.where(ok[..., None], buf.words[s], 0), jnp.where(ok, buf.coeffs[s], 0),
                   jnp.where(ok, buf.meta[s], 0))
    counts = jnp.stack(counts)
    # the words sent leave the shard (when a bucket overflows, the unit is undone anyway)
    buf = buf._replace(coeffs=jnp.where(away, 0, buf.coeffs), meta=jnp.where(away, 0, buf.meta))
    need = jnp.max(counts)
    return buf, out, jnp.where(need > bucket, need, 0)


def _exchange(out: Exchange, axis: str, packed: bool = True) -> Exchange:
    """Bucket d of every device to device d: row j of the result came from device j. One all-to-all
    of the words, the coefficients' bits and the meta packed side by side, not three (each collective
    is a call into the runtime, every unit)."""
    if not packed:  # the coefficients as floats, for JAX to differentiate (their bits would not be)
        return Exchange(*(lax.all_to_all(a, axis, 0, 0) for a in out))
    lanes = out.words.shape[-1]
    bits = lax.bitcast_convert_type(out.coeffs, jnp.uint32)  # float64: (D, B, 2); float32: (D, B)
    bits = bits.reshape(out.coeffs.shape + (-1,))
    packed = jnp.concatenate([out.words, bits, lax.bitcast_convert_type(out.meta, jnp.uint32)[..., None]], -1)
    got = lax.all_to_all(packed, axis, 0, 0)
    coeff_bits = got[..., lanes:-1]
    coeff_bits = coeff_bits if coeff_bits.shape[-1] > 1 else coeff_bits[..., 0]
    coeffs = lax.bitcast_convert_type(coeff_bits, out.coeffs.dtype)
    return Exchange(got[..., :lanes], coeffs, lax.bitcast_convert_type(got[..., -1], jnp.int32))


# ---- settling what arrived ----------------------------------------------------------------------------

def _place(buf: engine.Buffer, words, coeffs, meta, room: int):
    """The live entries among the first `room` of (words, coeffs, meta) (compacted to the front) into
    the shard's first free slots. Returns (buffer, slots needed if they do not fit, else 0)."""
    cap = buf.coeffs.shape[0]
    live = buf.live
    n = _count(merge.live_of(meta))
    free = cap - _count(live)
    slot = first_set(~live, room)
    dest = jnp.where(jnp.arange(room) < n, slot, cap)
    buf = buf._replace(words=buf.words.at[dest].set(words[:room], mode="drop"),
                       coeffs=buf.coeffs.at[dest].set(coeffs[:room], mode="drop"),
                       meta=buf.meta.at[dest].set(meta[:room], mode="drop"))
    return buf, jnp.where(n > free, cap - free + n, 0).astype(jnp.int32)


def _compact(words, coeffs, meta, room: int):
    """The live entries of an exchange (flattened) moved to the front of `room` entries."""
    src = first_set(merge.live_of(meta), room)
    ok = src < meta.shape[0]
    s = jnp.minimum(src, meta.shape[0] - 1)
    return jnp.where(ok[:, None], words[s], 0), jnp.where(ok, coeffs[s], 0), jnp.where(ok, meta[s], 0)


def _settle_rotation(buf: engine.Buffer, got: Exchange, u, T, rules: Limits, cfg: engine.Config):
    """A rotation's spawned partners that arrived, merged with the owner's words that anticommute
    with the generator (the only words they can equal), the per-term rules applied to every word
    the rotation touched, the survivors back into the shard. (buffer, slots needed or 0)."""
    _, gx, gz = engine.generator(T, u)
    cand = buf.live & pauli_words.anticommutes(buf.x, buf.z, gx, gz)
    rw, rc, rm = (a.reshape((-1,) + a.shape[2:]) for a in got)
    rlive = merge.live_of(rm)
    cap = buf.coeffs.shape[0]

    def in_room(b, room):
        src = first_set(cand, room)
        ok = src < cap
        s = jnp.minimum(src, cap - 1)
        w2, c2, m2 = _compact(rw, rc, rm, room)
        words = jnp.concatenate([jnp.where(ok[:, None], b.words[s], 0), w2])
        coeffs = jnp.concatenate([jnp.where(ok, b.coeffs[s], 0), c2])
        meta = jnp.concatenate([jnp.where(ok, b.meta[s], 0), m2])
        mw, mc, mm, dropped, _ = merge.full_merge(words, coeffs, meta, rules, 2 * room, stop=True, exact=cfg.exact)
        at = jnp.where(ok, src, cap)
        b = b._replace(coeffs=b.coeffs.at[at].set(0, mode="drop"), meta=b.meta.at[at].set(0, mode="drop"),
                       dropped=b.dropped + dropped)
        return _place(b, mw, mc, mm, 2 * room)

    most = jnp.maximum(_count(cand), _count(rlive))
    pick = jnp.where(most == 0, 0, 1 + jnp.sum(most > jnp.asarray(cfg.rooms[:-1], jnp.int32)))
    return lax.switch(pick, [lambda b: (b, jnp.int32(0))] + [partial(in_room, room=r) for r in cfg.rooms], buf)


def _settle_merge(buf: engine.Buffer, got: Exchange, rules: Limits, cfg: engine.Config):
    """An amplitude damping's damped words may equal any word: the whole shard merged with what arrived."""
    cap = buf.coeffs.shape[0]
    cat = lambda a, b: jnp.concatenate([a, b.reshape((-1,) + b.shape[2:])])
    mw, mc, mm, dropped, need = merge.full_merge(cat(buf.words, got.words), cat(buf.coeffs, got.coeffs),
                                                 cat(buf.meta, got.meta), rules, cap, stop=True, exact=cfg.exact)
    return engine.Buffer(mw, mc, mm, buf.dropped + dropped), need.astype(jnp.int32)


def _settle_moved(buf: engine.Buffer, got: Exchange):
    """A Clifford run's moved words: it permutes the words, so they equal none of the owner's."""
    w, c, m = (a.reshape((-1,) + a.shape[2:]) for a in got)
    room = m.shape[0]
    return _place(buf, *_compact(w, c, m, room), room)


# ---- the largest-terms cut over all devices ----------------------------------------------------------

RADIX = 4  # bits a round of radix_select: 2^RADIX - 1 counts a round, summed over the devices in one psum


def radix_select(values, sel, k, axis: str, largest: bool):
    """The k-th largest (or smallest) of the unsigned `values` where `sel`, over all devices
    (1 <= k <= their number): a radix select from the top digit down, RADIX bits a round. A round
    counts the selected values below each digit (2^RADIX - 1 counts in one fused pass), sums them
    over the devices in one psum, and keeps the digit that holds the k-th; 64-bit values take 16
    rounds, where a bisection would take 64, each a psum that waits on every device."""
    digits = jnp.arange(1, 2**RADIX, dtype=jnp.int32)
    prefix = jnp.zeros((), values.dtype)
    for shift in range(8 * values.dtype.itemsize - RADIX, -1, -RADIX):
        digit = ((values >> shift) & (2**RADIX - 1)).astype(jnp.int32)
        rank = (2**RADIX - 1) - digit if largest else digit  # rank 0: the end the count starts from
        below = lax.psum(jnp.sum(sel[:, None] & (rank[:, None] < digits), axis=0, dtype=jnp.int32), axis)
        r = jnp.sum(below < k, dtype=jnp.int32)  # the rank whose values hold the k-th
        k = k - jnp.where(r > 0, below[jnp.maximum(r - 1, 0)], 0)
        sel = sel & (rank == r)
        d = (2**RADIX - 1) - r if largest else r
        prefix = prefix | (d.astype(values.dtype) << shift)
    return prefix


def _keep_largest(bits, mask, k, tie_all, axis: str):
    """Mask of the k largest entries of `mask` over all devices, in the order (-magnitude bits,
    tiebreak, device, slot) of truncation.keep_largest (bits: the magnitudes' unsigned bit patterns;
    k below the number of entries). Two selects whose counts are summed over the devices: the k-th
    largest magnitude, then, where more entries tie at it than stay, the tie key that splits them."""
    psum = lambda a: lax.psum(a, axis)
    t = radix_select(bits, mask, k, axis, largest=True)
    above, ties = mask & (bits > t), mask & (bits == t)
    need = k - psum(_count(above))

    def cut_ties():
        keys = tie_all()
        s = radix_select(keys, ties, need, axis, largest=False)
        below, at = ties & (keys < s), ties & (keys == s)
        room = need - psum(_count(below))
        counts = lax.all_gather(_count(at), axis)
        before = jnp.sum(jnp.where(jnp.arange(counts.shape[0]) < lax.axis_index(axis), counts, 0))
        return below | (at & (prefix_count(at) - 1 + before < room))

    return above | lax.cond(psum(_count(ties)) > need, cut_ties, lambda: ties)


def _cut(buf: engine.Buffer, limits: Limits, axis: str) -> engine.Buffer:
    """Keep the max_terms largest live terms of all shards together (none to cut: the buffer as it is)."""
    if limits.max_terms is None:
        return buf
    live = buf.live

    def cut(b):
        mag = jnp.abs(b.coeffs)
        bits = lax.bitcast_convert_type(mag, jnp.uint64 if mag.dtype == jnp.float64 else jnp.uint32)
        kept = _keep_largest(bits, live, limits.max_terms, lambda: merge.tie_keys(b.words).astype(tie_type()), axis)
        return b._replace(coeffs=jnp.where(kept, b.coeffs, 0), meta=jnp.where(kept, b.meta, 0),
                          dropped=b.dropped.at[3].add(jnp.sum(jnp.where(live & ~kept, mag, 0))))

    return lax.cond(lax.psum(_count(live), axis) > limits.max_terms, cut, lambda b: b, buf)


# ---- the loop ----------------------------------------------------------------------------------------

class Progress(NamedTuple):
    unit: jax.Array  # the next unit to apply (the one that overflowed, if stopped)
    need: jax.Array  # slots a shard needed (0: none; merge.COLLIDED, engine.WHOLE_ROOM as in engine.Progress)
    need_bucket: jax.Array  # entries a bucket needed (0: they fitted)
    unit_terms: jax.Array  # (U,) int32 live terms of all shards after each unit
    peak: jax.Array  # int32 the largest live count of all shards


def _unit(b: engine.Buffer, u, active, live, acts, T, params, limits: Limits, cfg: engine.Config, devices: int,
          bucket: int, axis: str):
    """Unit u on this shard, its words routed to their owners and settled, the global cut. Returns
    (buffer, need, bucket need, acts); a unit that overflowed anywhere leaves every shard as it was.
    live: the shard's live words."""
    kind = T["u_kind"][jnp.minimum(u, T["u_kind"].shape[0] - 1)]
    defer = T["u_defer"][jnp.minimum(u, T["u_kind"].shape[0] - 1)]
    spread = devices > 1
    if spread:  # rules and cut after the exchange: the unit runs without them (truncation.Limits.off_unless)
        no_cut = limits._replace(max_terms=None if limits.max_terms is None else jnp.asarray(OFF, jnp.int32))
        local = no_cut.off_unless(~((kind == schedule.U_SPLIT) | (kind == schedule.U_MERGE)))
    else:
        local = limits
    before = b
    b, need = engine.apply_unit(b, u, T, params, local, cfg, live_count=live, active=active,
                                acts=acts if cfg.skip_unmet else None)
    me = lax.axis_index(axis)
    b, out, need_bucket = _send(b, devices, bucket, me)
    got = _exchange(out, axis, packed=not cfg.static_loops)
    got_support = lax.reduce(jnp.where(merge.live_of(got.meta)[..., None], got.words, jnp.uint32(0)), jnp.uint32(0),
                             lax.bitwise_or, (0, 1))
    if spread:
        rules = limits.off_unless(~defer)._replace(max_terms=None)
        branches = [lambda b: _settle_moved(b, got), lambda b: _settle_rotation(b, got, u, T, rules, cfg)]
        branch = jnp.where(kind == schedule.U_SPLIT, 1, 0)
        if schedule.U_MERGE in cfg.units:  # amplitude damping (its code only where the circuit has some)
            branches.append(lambda b: _settle_merge(b, got, rules, cfg))
            branch = jnp.where(kind == schedule.U_MERGE, 2, branch)
        b, need_settle = lax.switch(jnp.where(active, branch, 0), branches, b)
        b = _cut(b, limits.off_unless(~defer), axis)
        need = jnp.where(need == 0, need_settle, need)
    # one verdict for all shards: grow (the most any shard needed), else order exactly, else the whole room
    verdict = lax.pmax(jnp.stack([jnp.maximum(need, 0), need_bucket, (need == merge.COLLIDED).astype(jnp.int32),
                                  (need == engine.WHOLE_ROOM).astype(jnp.int32)]), axis)  # one collective
    most, need_bucket, collided, whole = verdict[0], verdict[1], verdict[2] > 0, verdict[3] > 0
    need = jnp.where(most > 0, most, jnp.where(collided, merge.COLLIDED, jnp.where(whole, engine.WHOLE_ROOM, 0)))
    if spread:
        stop = (need != 0) | (need_bucket != 0)
        b = jax.tree_util.tree_map(lambda old, new: jnp.where(stop, old, new), before, b)
    if cfg.skip_unmet:  # as engine.run: where the live words act; a rotation's also where its arrivals act
        _, gx, gz = engine.generator(T, u)
        acts = lax.cond(kind == schedule.U_SPLIT, lambda: acts | jnp.concatenate([gx, gz]) | got_support,
                        lambda: engine.support(b))
    return b, need, need_bucket, acts


def run(T: dict, buf: engine.Buffer, start, params, limits: Limits, table, *, cfg: engine.Config, devices: int,
        bucket: int, axis: str):
    """The shard's loop (inside shard_map): units start .. until the end or an overflow anywhere.
    Returns (shard, Progress, the overlap summed over the devices, the dropped 1-norms summed)."""
    num_units = T["num_units"]

    def one(carry):
        u, b, need, need_bucket, terms, live, acts = carry
        active = (u < num_units) & (need == 0) & (need_bucket == 0)
        b, need_u, bucket_u, acts = _unit(b, u, active, live, acts, T, params, limits, cfg, devices, bucket, axis)
        need, need_bucket = jnp.where(active, need_u, need), jnp.where(active, bucket_u, need_bucket)
        advance = active & (need == 0) & (need_bucket == 0)
        live = _count(b.live)
        # the shard's count: the counts of all shards are summed once, after the loop
        terms = terms.at[u].set(jnp.where(advance, live, terms[u]))
        return jnp.where(advance, u + 1, u), b, need, need_bucket, terms, live, acts

    def body(carry):
        if cfg.units_per_test == 1:
            return one(carry)
        return lax.fori_loop(0, cfg.units_per_test, lambda i, c: one(c), carry)

    cond = lambda c: (c[0] < num_units) & (c[2] == 0) & (c[3] == 0)
    live = _count(buf.live)
    acts = engine.support(buf) if cfg.skip_unmet else jnp.uint32(0)
    init = (jnp.asarray(start, jnp.int32), buf, jnp.int32(0), jnp.int32(0), jnp.zeros(T["u_kind"].shape[0], jnp.int32),
            live, acts)
    u, buf, need, need_bucket, terms, _, _ = lax.while_loop(cond, body, init)
    terms, start_total = lax.psum((terms, live), axis)
    value = lax.psum(engine.value(buf, table), axis)
    peak = jnp.maximum(start_total, jnp.max(terms))
    return buf, Progress(u, need, need_bucket, terms, peak), value, lax.psum(buf.dropped, axis)


def run_static(T: dict, buf: engine.Buffer, params, limits: Limits, table, *, cfg: engine.Config, devices: int,
               bucket: int, axis: str):
    """Every unit from 1 on (padding ones are no-ops) in a scan of checkpointed segments, as
    engine._run_static: JAX differentiates it (reverse mode holds O(sqrt(units)) shards). Nothing
    grows: a unit that overflows a shard or a bucket anywhere is skipped on every shard and counted.
    Returns (this shard's part of the overlap, its dropped 1-norms, the units that overflowed)."""
    total = T["u_kind"].shape[0]
    seg = 1 << ((total.bit_length() - 1 + 1) // 2)

    def segment(carry, s):
        def one(c, i):
            b, live, acts, missed = c
            u = s * seg + i
            b, need, need_bucket, acts = _unit(b, u, (u >= 1) & (u < T["num_units"]), live, acts, T, params, limits,
                                               cfg, devices, bucket, axis)
            return (b, _count(b.live), acts, missed + ((need != 0) | (need_bucket != 0))), None

        return lax.scan(one, carry, jnp.arange(seg))[0], None

    acts = engine.support(buf) if cfg.skip_unmet else jnp.uint32(0)
    (buf, _, _, missed), _ = lax.scan(jax.checkpoint(segment), (buf, _count(buf.live), acts, jnp.int32(0)),
                                      jnp.arange(total // seg))
    return engine.value(buf, table)[None], buf.dropped, missed


def _shard_map(fn, mesh: Mesh, in_specs, out_specs):
    """jax.shard_map (jax >= 0.7; jax.experimental.shard_map before), the replication checks off."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map

    return shard_map(fn, mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


@one_program_per_key
def program(cfg: engine.Config, mesh: Mesh, bucket: int, backend: str):
    """The jitted loop over all shards of `mesh` (its one axis) for this configuration: a function of
    (tables, buffer sharded by slots, start unit, params, limits, overlap table)."""
    axis = mesh.axis_names[0]
    devices = mesh.devices.size
    fn = partial(run, cfg=cfg, devices=devices, bucket=bucket, axis=axis)
    rep, by_slot = PartitionSpec(), PartitionSpec(axis)
    mapped = _shard_map(fn, mesh, in_specs=(rep, by_slot, rep, rep, rep, rep),
                        out_specs=(by_slot, Progress(rep, rep, rep, rep, rep), rep, rep))
    return Jitted(mapped, compiler_options(backend, cfg.capacity), donate_argnums=(1,))


@one_program_per_key
def static_program(cfg: engine.Config, mesh: Mesh, bucket: int):
    """The jitted `run_static` over all shards of `mesh`: a function of (tables, buffer, params, limits,
    overlap table) -> (each shard's part of the overlap (D,), dropped 1-norms (D*5,), overflowed units)."""
    axis = mesh.axis_names[0]
    fn = partial(run_static, cfg=cfg, devices=mesh.devices.size, bucket=bucket, axis=axis)
    rep, by_slot = PartitionSpec(), PartitionSpec(axis)
    return jax.jit(_shard_map(fn, mesh, in_specs=(rep, by_slot, rep, rep, rep), out_specs=(by_slot, by_slot, rep)))


# ---- the driver --------------------------------------------------------------------------------------

class ShardedStats(NamedTuple):
    """PropagationStats' fields (terms of all shards together; dropped 1-norms summed over the devices;
    overflow is always False: an overflow grows the buffer or raises) and the layout the run ended with."""

    terms: np.ndarray
    dropped_norm: np.ndarray
    overflow: bool
    capacity: int  # slots of all shards together
    max_terms_seen: int
    devices: int
    bucket: int  # words a bucket of the exchange held
    resumed: int  # times the loop stopped at an overflow (shards or buckets) and resumed

    @property
    def total_dropped_norm(self):
        return float(np.sum(self.dropped_norm))


def default_mesh(devices=None) -> Mesh:
    """A mesh of one axis ("terms") over `devices` (default: every device JAX sees, all hosts')."""
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("a mesh needs at least one device")
    return Mesh(np.array(devices), (AXIS,))


def _check_mesh(mesh) -> Mesh:
    if mesh is None:
        return default_mesh()
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if len(mesh.axis_names) != 1:
        raise ValueError(f"the terms are sharded over a mesh of one axis; got axes {tuple(mesh.axis_names)} "
                         f"of shape {tuple(mesh.devices.shape)} (use pauliprop.sharded.default_mesh(devices))")
    return mesh


def _shard_slots(total: int, devices: int, what: str) -> int:
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < 1:
        raise ValueError(f"{what} must be a positive int, got {total!r}")
    if total % devices:
        raise ValueError(f"{what} {total} does not divide over the mesh's {devices} devices: pass a multiple of "
                         f"{devices}")
    per = total // devices
    if per < MIN_SLOTS:
        raise ValueError(f"{what} {total} over {devices} devices leaves {per} slots a device; at least {MIN_SLOTS}")
    return per


@jax.jit
def _owners_of(words, devices_array):
    return owner(words, devices_array.shape[0])


def _distribute(merged: engine.Buffer, live: int, devices: int, per: int):
    """Host arrays (D, per, ...) of the merged observable's words, each in its owner's shard (the slots
    a shard needs, if more than `per`)."""
    at = np.flatnonzero(np.asarray(merged.meta) & 1)
    words, coeffs, meta = (np.asarray(a)[at] for a in merged[:3])
    live = len(at)
    own = np.asarray(_owners_of(jnp.asarray(words), jnp.zeros(devices))) if live else np.zeros(0, np.int64)
    most = int(np.bincount(own, minlength=devices).max()) if live else 0
    if most > per:
        return None, most
    w = np.zeros((devices, per, words.shape[1]), np.uint32)
    c = np.zeros((devices, per), coeffs.dtype)
    m = np.zeros((devices, per), np.int32)
    for d in range(devices):
        at = np.flatnonzero(own == d)
        w[d, :len(at)], c[d, :len(at)], m[d, :len(at)] = words[at], coeffs[at], meta[at]
    dropped = np.zeros((devices, 5), coeffs.dtype)
    dropped[0] = np.asarray(merged.dropped)
    return (w, c, m, dropped), most


def _global(host, sharding: NamedSharding):
    """Host arrays (a pytree; None leaves stay) as global arrays with this sharding, each process
    placing the shards of its own devices (so the same call serves one host and several)."""
    place = lambda a: jax.make_array_from_callback(np.shape(a), sharding, lambda index: np.asarray(a)[index])
    return jax.tree_util.tree_map(place, host)


def _put(arrays, mesh: Mesh):
    """(D, per, ...) host arrays as a Buffer of global arrays sharded by slots over the mesh."""
    flat = [a.reshape((-1,) + a.shape[2:]) for a in arrays]
    return engine.Buffer(*_global(flat, NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))))


@one_program_per_key
def _padding(mesh: Mesh, per: int):
    """The jitted growth of every shard to `per` slots (each device pads its own: no host copy)."""
    def pad(b: engine.Buffer) -> engine.Buffer:
        grow = lambda a: jnp.pad(a, [(0, per - a.shape[0])] + [(0, 0)] * (a.ndim - 1))
        return engine.Buffer(grow(b.words), grow(b.coeffs), grow(b.meta), b.dropped)

    spec = PartitionSpec(mesh.axis_names[0])
    return jax.jit(_shard_map(pad, mesh, in_specs=(spec,), out_specs=spec))


def expectation(circuit: Circuit, observable: PauliSum, params=None, state="0",
                truncation: Truncation | None = None, mesh: Mesh | None = None, capacity: int | None = None,
                initial_capacity: int | None = None, bucket: int | None = None, max_capacity: int = 1 << 30,
                return_stats: bool = False):
    """<psi| observable |psi>, psi = circuit |state>, with the terms sharded over the devices of `mesh`.

    The value pp.expectation gives (the same units, rules and tie rule; untruncated equal to
    rounding), computed by D devices that each hold the words they own (see the module docstring).
    mesh: a jax.sharding.Mesh of one axis (default: every device, `default_mesh`). capacity: slots
    of all shards together, a multiple of the devices (fixed: an overflow raises MemoryError); or
    initial_capacity, where growth starts (default: pauliprop's default capacity for this
    observable and truncation, times the devices). bucket: words each device can send to each other
    device after a unit (default: a shard's slots / D; doubled when a unit needs more).
    max_capacity: slots of all shards that growth may reach. Returns a jax scalar (and ShardedStats
    with return_stats). Differentiable in params (jax.grad, jax.jit): with traced params the shards
    and buckets are fixed (capacity, else initial_capacity, else the default) and a unit that
    overflows them is skipped with a RuntimeWarning (see the module docstring); return_stats is then
    not available. params: one parameter set (1-d); jax.vmap over sets runs (every member takes
    every branch: pp.expectation batches them better).
    """
    if is_traced(params) and not is_traced(observable):
        if return_stats:
            raise ValueError("sharded.expectation under a jax transformation returns the value only "
                             "(return_stats=False)")
        return _traced(circuit, observable, params, state, truncation, mesh, capacity, initial_capacity, bucket)
    _, stats, val = _drive(circuit, observable, params, state, truncation, mesh, capacity, initial_capacity, bucket,
                           max_capacity)
    val = jnp.asarray(val)
    return (val, stats) if return_stats else val


def _warn_missed(missed, overflow_norm):
    if int(missed) or float(overflow_norm) > 0:
        warnings.warn(f"pauliprop.sharded: under a jax transformation nothing grows: {int(missed)} unit(s) "
                      f"overflowed a shard or a bucket and were skipped, and the shards' own cuts dropped a 1-norm of "
                      f"{float(overflow_norm):.3g}; pass a larger capacity or bucket", RuntimeWarning, stacklevel=2)


class _Setup(NamedTuple):
    mesh: Mesh
    devices: int
    truncation: Truncation
    table: np.ndarray  # the state's overlap table
    per: int  # slots a device
    bucket: int
    backend: str
    low: "Lowered"
    dtype: jnp.dtype
    limits: Limits


def _setup(circuit, observable, state, truncation, mesh, capacity, initial_capacity, bucket) -> _Setup:
    """What both drivers start from: the mesh, the slots a device (from capacity, else
    initial_capacity, else the observable's default capacity), the buckets, the lowered circuit and
    the truncation's limits in the coefficients' dtype."""
    mesh = _check_mesh(mesh)
    devices = mesh.devices.size
    truncation = truncation or NO_TRUNCATION
    table = state_table(state, circuit.num_qubits, observable.num_lanes)
    if capacity is not None:
        per = _shard_slots(capacity, devices, "capacity")
    elif initial_capacity is not None:
        per = _shard_slots(initial_capacity, devices, "initial_capacity")
    else:
        per = max(MIN_SLOTS, default_capacity(observable, truncation))
    backend = current_backend()
    dtype = jnp.result_type(float)
    return _Setup(mesh, devices, truncation, table, per, _bucket(bucket, per, devices), backend,
                  lowered(circuit, truncation, backend, layers=False, support=observable_support(observable)), dtype,
                  truncation.limits(dtype))


def _traced(circuit, observable, params, state, truncation, mesh, capacity, initial_capacity, bucket):
    """expectation with traced params (jax.grad, jit, vmap): fixed shards and buckets, every unit in a
    static loop JAX differentiates (run_static); an overflow is skipped, counted and warned about."""
    check_inputs(circuit, observable, params)
    if jnp.ndim(params) != 1:
        raise ValueError(f"sharded.expectation takes one parameter set (a 1-d params); got shape {jnp.shape(params)} "
                         "(under jax.vmap, vmap pp.expectation instead)")
    mesh, devices, truncation, table, per, bucket, backend, low, dtype, limits = _setup(
        circuit, observable, state, truncation, mesh, capacity, initial_capacity, bucket)
    with jax.ensure_compile_time_eval():  # the observable is concrete: its merge runs now, under jit too
        merged, live = merged_observable(low, observable, truncation, limits, dtype, backend)
        arrays, most = _distribute(merged, int(live), devices, per)
    if arrays is None:
        raise MemoryError(f"the observable's merged terms put {most} on one device, more than the {per} slots a device "
                          "has; pass a larger capacity")
    replicated = NamedSharding(mesh, PartitionSpec())
    longest = int(max(low.units.count.max(initial=1), 1))
    cfg = config(low, truncation, per, False, backend, merged=True)._replace(static_loops=longest)
    parts, dropped, missed = static_program(cfg, mesh, bucket)(
        _global(low.tables, replicated), _put(arrays, mesh), params_array(params, circuit.num_params, dtype),
        *_global((limits, table), replicated))
    jax.debug.callback(_warn_missed, missed, jnp.sum(dropped.reshape(devices, 5)[:, 4]))
    return jnp.sum(parts)


def propagate(circuit: Circuit, observable: PauliSum, params=None, truncation: Truncation | None = None,
              mesh: Mesh | None = None, capacity: int | None = None, initial_capacity: int | None = None,
              bucket: int | None = None, max_capacity: int = 1 << 30):
    """The propagated observable as (PauliSum, ShardedStats): pp.propagate's terms, made by the shards of
    `mesh` (arguments as in `expectation`). The PauliSum's arrays are the shards' slots one after the
    other (dead slots have coefficient 0), sharded over the mesh."""
    buf, stats, _ = _drive(circuit, observable, params, "0", truncation, mesh, capacity, initial_capacity, bucket,
                           max_capacity)
    return PauliSum(*as_sum(buf.words, buf.coeffs, buf.meta), observable.num_qubits), stats


def _bucket(bucket, per: int, devices: int) -> int:
    if bucket is not None and (isinstance(bucket, bool) or not isinstance(bucket, (int, np.integer)) or bucket < 1):
        raise ValueError(f"bucket must be a positive int, got {bucket!r}")
    # one device sends nothing: its buckets are a token
    return int(bucket) if bucket is not None else (1 if devices == 1 else max(1, per // devices))


def _drive(circuit, observable, params, state, truncation, mesh, capacity, initial_capacity, bucket, max_capacity):
    """(sharded buffer, ShardedStats, value): the loop run, grown and resumed until it completes."""
    check_inputs(circuit, observable, params)
    if is_traced(params, observable):
        raise TypeError("pauliprop.sharded.propagate runs outside jax transformations (jit, grad, vmap), and "
                        "sharded.expectation differentiates in params only (the observable's coefficients must be "
                        "concrete); pp.expectation differentiates in both")
    if params is not None and np.ndim(params) != 1:
        raise ValueError(f"sharded.expectation takes one parameter set (a 1-d params); got shape {np.shape(params)}")
    mesh, devices, truncation, table, per, bucket, backend, low, dtype, limits = _setup(
        circuit, observable, state, truncation, mesh, capacity, initial_capacity, bucket)
    fixed = capacity is not None
    p = params_array(params, circuit.num_params, dtype)
    assert int(low.units.kind[0]) == schedule.U_MERGE, "the schedule's first unit is the observable's merge"
    merged, live = merged_observable(low, observable, truncation, limits, dtype, backend)
    live = int(live)
    while True:
        arrays, most = _distribute(merged, live, devices, per)
        if arrays is not None:
            break
        if fixed:
            raise MemoryError(f"the observable's {live} merged terms put {most} on one device, more than the "
                              f"capacity {capacity} leaves a device ({per}); pass a larger capacity")
        per = next_capacity(per, most)
    buf = _put(arrays, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    T = _global(low.tables, replicated)
    args = _global((p, limits, table), replicated)
    unit_terms = np.zeros(low.tables["u_kind"].shape[0], np.int32)
    unit_terms[0] = live
    start, exact_order, whole_room, peak, resumed = 1, False, False, live, 0
    while True:
        cfg = config(low, truncation, per, True, backend, merged=True, exact_order=exact_order,
                     whole_room=whole_room)
        fn = program(cfg, mesh, bucket, backend)
        buf, prog, val, dropped = fn(T, buf, np.int32(start), *args)
        unit, need, need_bucket, terms, top = (int(v) if np.ndim(v) == 0 else np.asarray(v) for v in
                                               jax.device_get((prog.unit, prog.need, prog.need_bucket,
                                                               prog.unit_terms, prog.peak)))
        unit_terms[start:] = terms[start:]
        peak = max(peak, top)
        if need == 0 and need_bucket == 0:
            break
        resumed += 1
        start = unit
        if need_bucket > 0:
            bucket = next_capacity(bucket, need_bucket)  # at least twice the old and what it needed
        if need == merge.COLLIDED:
            exact_order = True
        elif need == engine.WHOLE_ROOM:
            whole_room = True
        elif need > 0:
            if fixed:
                raise MemoryError(f"a shard needs {need} slots at {operation_at(low, unit)}, more than the "
                                  f"{per} a device that capacity={capacity} gives; pass a larger capacity or "
                                  "initial_capacity (which grows)")
            grown = next_capacity(per, need)
            if grown * devices > max_capacity:
                raise MemoryError(f"a shard needs {need} slots at {operation_at(low, unit)}: {grown} a device "
                                  f"over {devices} devices is more than max_capacity={max_capacity}; add truncation or "
                                  "raise max_capacity")
            per = grown
            buf = _padding(mesh, per)(buf)
    terms = low.terms_per_row(unit_terms)
    stats = ShardedStats(terms=terms, dropped_norm=np.asarray(dropped), overflow=False, capacity=per * devices,
                         max_terms_seen=int(max(peak, int(terms.max(initial=0)))), devices=devices, bucket=bucket,
                         resumed=resumed)
    return buf, stats, val
