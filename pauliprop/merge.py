"""Duplicate merging, truncation and prefix-sum compaction of the term buffer.

Two ways to merge, chosen per gate:

* `full_merge`: sort all candidates (old terms and new partners) by a 64-bit fingerprint key, sum
  runs of equal words, truncate, compact. O(N log N); needed after Cliffords, which move words.
* `insert_merge`: the buffer is kept sorted by key, so a rotation only sorts its new partner words
  (the anticommuting fraction), binary-searches them into the buffer, adds coefficients of words
  already there and splices the rest in by prefix sums. O(M log M + N) for M new words.

Measured (DESIGN.md section 4 and experiments/README.md): XLA sorts one uint64 key fast on
both backends, but a key with a payload 6x slower on CPUs; so on CPUs the slot index is packed into
the key's low bits, and on GPUs it is a payload. Fingerprints can collide: equal keys are checked
word by word and a collision sends the gate to an exact lexicographic sort, so results never
depend on hash luck. Without jax_enable_x64 the merge always takes the full path with a two-key
uint32 sort (slower, same results).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import truncation as _t
from . import words as _w
from .prefix import on_cpu, prefix_count

DEAD_KEY = np.uint64((1 << 64) - 1)


def x64() -> bool:
    return bool(jax.config.jax_enable_x64)


def index_bits(capacity: int) -> int:
    """Low key bits reserved for the slot index on CPUs (room for the 2*capacity candidates)."""
    return max(1, (2 * capacity - 1).bit_length()) if on_cpu() else 0


def sort_keys(x, z, live, nbits: int):
    """uint64 keys: the words' fingerprint with the low `nbits` cleared; dead slots get DEAD_KEY."""
    h1, h2 = _w.fingerprint(x, z)
    key = ((h1.astype(jnp.uint64) << 32) | h2.astype(jnp.uint64)) >> 1
    key = key & ~jnp.uint64((1 << nbits) - 1)
    return jnp.where(live, key, DEAD_KEY)


def argsort_keys(keys, nbits: int):
    """Permutation sorting `keys` (low nbits zero). CPU: one packed uint64 sort; GPU: key + payload."""
    idx = jnp.arange(keys.shape[0], dtype=jnp.int32)
    if nbits:
        low = jnp.uint64((1 << nbits) - 1)
        return (lax.sort((keys & ~low) | idx.astype(jnp.uint64)) & low).astype(jnp.int32)
    return lax.sort((keys, idx), num_keys=1)[1]


def _exact_order(x, z, live):
    """Lexicographic order on the words themselves (the collision fallback)."""
    idx = jnp.arange(x.shape[0], dtype=jnp.int32)
    keys = [(~live).astype(jnp.uint32)] + [x[:, i] for i in range(x.shape[1])] + [z[:, i] for i in range(z.shape[1])]
    return lax.sort((*keys, idx), num_keys=len(keys))[-1]


def _fingerprint_order_32(h1, h2, live):
    """Without x64: live words first, by the two uint32 fingerprint halves (a three-key sort)."""
    idx = jnp.arange(h1.shape[0], dtype=jnp.int32)
    return lax.sort(((~live).astype(jnp.uint32), h1, h2, idx), num_keys=3)[-1]


def _same_as_previous(xs, zs, ls):
    eq = jnp.all(xs[1:] == xs[:-1], axis=1) & jnp.all(zs[1:] == zs[:-1], axis=1)
    return jnp.concatenate([jnp.zeros(1, bool), eq & ls[1:] & ls[:-1]])


def _truncate_and_compact(parts, truncation, capacity):
    """Apply the truncation rules to merged candidates and compact the survivors, in order.

    `parts` is a list of candidate groups, each a tuple (slots, x, z, coeffs, sins, keys,
    candidate); `slots` give every candidate of every group a distinct position in one order, and
    survivors are written to the front of `capacity` slots in that order. Groups are scattered
    separately, so large arrays are never concatenated.
    Returns (x, z, coeffs, sins, live, keys, dropped[5]).
    """
    keeps, mags, weights, dropped = [], [], [], []
    for slots, x, z, c, s, keys, candidate in parts:
        weights.append(_w.weight(x, z))
        drop_w, drop_c, drop_s = _t.violations(truncation, c, weights[-1], s)
        # zero coefficients stay: their words carry derivatives (sin(a) c at a = 0); min_abs_coeff drops them
        keeps.append(candidate & ~drop_w & ~drop_c & ~drop_s)
        mags.append(jnp.abs(c))
        dropped.append(jnp.stack([jnp.sum(jnp.where(candidate & d, mags[-1], 0)) for d in (drop_w, drop_c, drop_s)]))
    keep, mag = jnp.concatenate(keeps), jnp.concatenate(mags)
    dropped = sum(dropped)
    limit = capacity if truncation.max_terms is None else min(truncation.max_terms, capacity)
    weight = jnp.concatenate(weights)
    capped = lax.cond(jnp.sum(keep) > limit, lambda k: _t.keep_largest(mag, k, limit, tiebreak=weight),
                      lambda k: k, keep)
    cap_norm = jnp.sum(jnp.where(keep & ~capped, mag, 0))
    zero = jnp.zeros((), mag.dtype)
    is_max_terms = truncation.max_terms is not None and truncation.max_terms <= capacity
    dropped = jnp.concatenate([dropped, jnp.stack([cap_norm, zero] if is_max_terms else [zero, cap_norm])])

    # position of each survivor = number of survivors before it in slot order
    sizes = [p[0].shape[0] for p in parts]
    splits = [sum(sizes[:i]) for i in range(1, len(sizes))]
    capped_parts = jnp.split(capped, splits) if splits else [capped]
    in_order = jnp.zeros(sum(sizes), bool)
    for (slots, *_), cp in zip(parts, capped_parts):
        in_order = in_order.at[slots].set(cp)
    rank = prefix_count(in_order) - 1
    _, x0, z0, c0, s0, k0, _ = parts[0]
    dead_key = DEAD_KEY if k0.dtype == jnp.uint64 else 0  # without x64 the keys are unused zeros
    outs = [jnp.zeros((capacity,) + a.shape[1:], a.dtype) for a in (x0, z0, c0, s0)]
    outs.append(jnp.full(capacity, dead_key, k0.dtype))
    for (slots, *payload), cp in zip(parts, capped_parts):
        dest = jnp.where(cp, rank[slots], capacity)
        outs = [o.at[dest].set(a, mode="drop") for o, a in zip(outs, payload[:5])]
    x, z, c, s, keys = outs
    return x, z, c, s, jnp.arange(capacity) < jnp.sum(capped), keys, dropped


def full_merge(x, z, coeffs, sins, live, truncation: _t.Truncation, capacity: int):
    """Merge duplicates among all live candidates, truncate, compact into `capacity` slots.

    Returns (x, z, coeffs, sins, live, keys, sorted_by_key, dropped). keys is None without x64.
    """
    m = x.shape[0]
    if x64():
        nbits = index_bits(capacity)
        keys = sort_keys(x, z, live, nbits)
        order = argsort_keys(keys, nbits)
        ks = keys[order]
        same_key = jnp.concatenate([jnp.zeros(1, bool), (ks[1:] == ks[:-1]) & (ks[1:] != DEAD_KEY)])
    else:
        h1, h2 = _w.fingerprint(x, z)
        order = _fingerprint_order_32(h1, h2, live)
        hs1, hs2, ls_ = h1[order], h2[order], live[order]
        same_key = jnp.concatenate([jnp.zeros(1, bool), (hs1[1:] == hs1[:-1]) & (hs2[1:] == hs2[:-1])
                                    & ls_[1:] & ls_[:-1]])
        keys = None
    xs, zs, ls = x[order], z[order], live[order]
    collision = jnp.any(same_key & ~_same_as_previous(xs, zs, ls))

    def exact(_):
        o = _exact_order(x, z, live)
        return o, x[o], z[o]

    order, xs, zs = lax.cond(collision, exact, lambda _: (order, xs, zs), None)
    ls = live[order]
    cs = jnp.where(ls, coeffs[order], 0)
    ss = sins[order]

    # runs of equal words: the head of each run collects the run's coefficient
    head = ls & ~_same_as_previous(xs, zs, ls)
    run = jnp.maximum(prefix_count(head) - 1, 0)
    run_coeff = jnp.zeros(m, cs.dtype).at[run].add(cs)
    big = jnp.iinfo(jnp.int32).max
    run_sins = jnp.full(m, big, jnp.int32).at[run].min(jnp.where(ls, ss, big))
    ks = keys[order] if keys is not None else jnp.zeros(m, jnp.uint32)
    x_, z_, c_, s_, live_, keys_, dropped = _truncate_and_compact(
        [(jnp.arange(m), xs, zs, run_coeff[run], run_sins[run], ks, head)], truncation, capacity)
    return x_, z_, c_, s_, live_, keys_ if keys is not None else None, ~collision, dropped


def insert_merge(x, z, coeffs, sins, live, keys, gx, gz, cos, sin, truncation: _t.Truncation, capacity: int,
                 room: int):
    """Rotation exp(-i a/2 G) on a key-sorted buffer, merging only the new partner words.

    Words anticommuting with G keep cos * c and spawn G xor P with sin * sign * c. At most `room`
    new words are handled here. Returns (ok, (x, z, coeffs, sins, live, keys, dropped)); ok is False
    when more than `room` words split or a fingerprint collides, and the caller falls back to
    `full_merge`.
    """
    cap = x.shape[0]
    nbits = index_bits(capacity)
    ac = live & _w.anticommutes(x, z, gx, gz)
    n_new = jnp.sum(ac)
    # gather the anticommuting terms into `room` slots
    src = jnp.full(room, cap, jnp.int32).at[jnp.where(ac, prefix_count(ac) - 1, room)].set(
        jnp.arange(cap, dtype=jnp.int32), mode="drop")
    valid = src < cap
    srcc = jnp.minimum(src, cap - 1)
    ox, oz = x[srcc], z[srcc]
    sign = _w.product_sign(ox, oz, gx, gz).astype(coeffs.dtype)
    nx, nz = ox ^ gx, oz ^ gz
    nc = jnp.where(valid, sin * sign * coeffs[srcc], 0)
    ns = sins[srcc] + 1
    nkeys = sort_keys(nx, nz, valid, nbits)
    order = argsort_keys(nkeys, nbits)
    nx, nz, nc, ns, nkeys, valid = nx[order], nz[order], nc[order], ns[order], nkeys[order], valid[order]

    # binary search each new word in the sorted buffer
    pos = jnp.searchsorted(keys, nkeys, side="left", method="scan").astype(jnp.int32)
    posc = jnp.minimum(pos, cap - 1)
    key_hit = valid & (pos < cap) & (keys[posc] == nkeys)
    word_hit = jnp.all(x[posc] == nx, axis=1) & jnp.all(z[posc] == nz, axis=1)
    found = key_hit & word_hit
    # distinct new words with equal keys would break the key order's uniqueness
    twin = jnp.any((nkeys[1:] == nkeys[:-1]) & valid[1:] & valid[:-1])
    collision = jnp.any(key_hit & ~word_hit) | twin
    # a hit on a dead-but-kept slot revives it (its coefficient is 0)
    old_c = jnp.where(ac, cos * coeffs, coeffs).at[jnp.where(found, pos, cap)].add(nc, mode="drop")
    old_s = sins.at[jnp.where(found, pos, cap)].min(ns, mode="drop")
    old_live = live.at[jnp.where(found, pos, cap)].set(True, mode="drop")

    # splice the inserted words: old slot i moves up by the number of inserted words with pos <= i
    inserted = valid & ~found
    # (several inserted words can share a pos)
    shift = prefix_count(jnp.zeros(cap, jnp.int32).at[jnp.where(inserted, pos, cap)].add(1, mode="drop"))
    old_slot = jnp.arange(cap, dtype=jnp.int32) + shift
    new_slot = pos + prefix_count(inserted) - 1
    # unused new slots are parked after every used position (they are not candidates)
    parked = cap + room - prefix_count(~inserted)
    new_slot = jnp.where(inserted, new_slot, parked)
    result = _truncate_and_compact([(old_slot, x, z, old_c, old_s, keys, old_live),
                                    (new_slot, nx, nz, nc, ns, nkeys, inserted)], truncation, capacity)
    return (n_new <= room) & ~collision, result
