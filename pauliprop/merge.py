"""Duplicate merging, truncation and compaction of the term buffer.

The buffer holds distinct live words in arbitrary slots (dead slots are free). Two ways to merge:

* `pair_split`, every rotation: a word P that anticommutes with the generator G meets only its partner
  P xor G, which anticommutes too. So a rotation gathers its M splitting words, sorts them by the
  pair's canonical member, mixes each pair in place and spawns the missing partners into free slots:
  O(M log M) plus a few streaming passes over the buffer, whatever its size.
* `full_merge`: sort all candidates by a 64-bit fingerprint key, sum runs of equal words, truncate,
  compact. O(N log N); for the initial observable (which may repeat words) and amplitude damping
  (whose new words may equal any word).

Measured (DESIGN.md section 4 and experiments/README.md): XLA sorts one uint64 key fast on both
backends, but a key with a payload 6x slower on CPUs; so on CPUs the slot index is packed into the
key's low bits, and on GPUs it is a payload. Fingerprints can collide: equal keys are checked word
by word and a collision sends the sort to an exact lexicographic one, so results never depend on hash
luck. Without jax_enable_x64 the sort takes two uint32 fingerprint keys (slower, same results).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import truncation as _t
from . import words as _w
from .batching import shared
from .prefix import first_set, on_cpu, prefix_count

DEAD_KEY = np.uint64((1 << 64) - 1)


def x64() -> bool:
    return bool(jax.config.jax_enable_x64)


def index_bits(n: int) -> int:
    """Low key bits reserved for the index of n sorted items on CPUs (GPUs sort it as a payload)."""
    return max(1, (n - 1).bit_length()) if on_cpu() else 0


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


def _truncate_and_compact(parts, truncation, capacity, destinations=False):
    """Apply the truncation rules to merged candidates and compact the survivors, in order.

    `parts` is a list of candidate groups, each a tuple (slots, x, z, coeffs, sins, candidate); `slots` give every candidate of every group a distinct position in one order, and
    survivors are written to the front of `capacity` slots in that order. Groups are scattered
    separately, so large arrays are never concatenated.
    Returns (x, z, coeffs, sins, live, dropped[5]), and with `destinations` the output slot of every
    candidate of the first group (`capacity` where it did not survive).
    """
    keeps, mags, weights, dropped = [], [], [], []
    for slots, x, z, c, s, candidate in parts:
        weights.append(_w.weight(x, z))
        drop_w, drop_c, drop_s = _t.violations(truncation, c, weights[-1], s)
        # zero coefficients stay: their words carry derivatives (sin(a) c at a = 0); min_abs_coeff drops them
        keeps.append(candidate & ~drop_w & ~drop_c & ~drop_s)
        mags.append(jnp.abs(c))
        dropped.append(jnp.stack([jnp.sum(jnp.where(candidate & d, mags[-1], 0)) for d in (drop_w, drop_c, drop_s)]))
    keep, mag = jnp.concatenate(keeps), jnp.concatenate(mags)
    dropped = sum(dropped)
    limit, rule = _limit(truncation, capacity)
    weight = jnp.concatenate(weights)
    capped = lax.cond(shared(jnp.sum(keep) > limit), lambda k: _t.keep_largest(mag, k, limit, tiebreak=weight),
                      lambda k: k, keep)
    dropped = jnp.concatenate([dropped, jnp.zeros(2, mag.dtype)]).at[rule].add(
        jnp.sum(jnp.where(keep & ~capped, mag, 0)))

    # position of each survivor = number of survivors before it in slot order
    sizes = [p[0].shape[0] for p in parts]
    splits = [sum(sizes[:i]) for i in range(1, len(sizes))]
    capped_parts = jnp.split(capped, splits) if splits else [capped]
    in_order = jnp.zeros(sum(sizes), bool)
    for (slots, *_), cp in zip(parts, capped_parts):
        in_order = in_order.at[slots].set(cp)
    rank = prefix_count(in_order) - 1
    outs = [jnp.zeros((capacity,) + a.shape[1:], a.dtype) for a in parts[0][1:5]]
    dests = []
    for (slots, *payload), cp in zip(parts, capped_parts):
        dests.append(jnp.where(cp, rank[slots], capacity))
        outs = [o.at[dests[-1]].set(a, mode="drop") for o, a in zip(outs, payload[:4])]
    x, z, c, s = outs
    out = (x, z, c, s, jnp.arange(capacity) < jnp.sum(capped), dropped)
    return (*out, dests[0]) if destinations else out


def full_merge(x, z, coeffs, sins, live, truncation: _t.Truncation, capacity: int, destinations: bool = False):
    """Merge duplicates among all live candidates, truncate, compact into `capacity` slots.

    Returns (x, z, coeffs, sins, live, dropped), and with `destinations` also the output slot each
    candidate's coefficient went to (`capacity` where it was dropped): the move record of reverse mode.
    """
    m = x.shape[0]
    if x64():
        nbits = index_bits(m)
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
    xs, zs, ls = x[order], z[order], live[order]
    collision = jnp.any(same_key & ~_same_as_previous(xs, zs, ls))

    def exact(_):
        o = _exact_order(x, z, live)
        return o, x[o], z[o]

    order, xs, zs = lax.cond(shared(collision), exact, lambda _: (order, xs, zs), None)
    ls = live[order]
    cs = jnp.where(ls, coeffs[order], 0)
    ss = sins[order]

    # runs of equal words: the head of each run collects the run's coefficient
    head = ls & ~_same_as_previous(xs, zs, ls)
    run = jnp.maximum(prefix_count(head) - 1, 0)
    run_coeff = jnp.zeros(m, cs.dtype).at[run].add(cs)
    big = jnp.iinfo(jnp.int32).max
    run_sins = jnp.full(m, big, jnp.int32).at[run].min(jnp.where(ls, ss, big))
    out = _truncate_and_compact([(jnp.arange(m), xs, zs, run_coeff[run], run_sins[run], head)], truncation,
                                capacity, destinations)
    if not destinations:
        return out
    # a candidate's coefficient goes where its run's head went
    head_pos = lax.cummax(jnp.where(head, jnp.arange(m), 0))
    dest_sorted = jnp.where(ls, out[-1][head_pos], capacity)
    return *out[:-1], jnp.zeros(m, jnp.int32).at[order].set(dest_sorted)


def _pivot(gx, gz):
    """One site bit of G (its lowest): (lane, mask, on_x). P and P xor G differ there, so 'that bit is 0'
    picks one member of every pair {P, P xor G}."""
    g = gx | gz
    lane = jnp.argmax(g != 0)
    mask = g[lane] & (~g[lane] + jnp.uint32(1))
    return lane, mask, (gx[lane] & mask) != 0


def pair_split(x, z, coeffs, sins, live, ac, gx, gz, cos, sin, truncation: _t.Truncation, capacity: int,
               room: int):
    """Rotation exp(-i a/2 G) on a buffer of distinct live words, touching only the splitting words.

    A word P that anticommutes with G keeps cos * c and feeds sin * sign * c to P xor G, which also
    anticommutes with G: so every merge happens inside the splitting set A. Sorting A (at most `room`
    words, the caller's choice) by the pair's canonical member puts each pair {P, P xor G} side by side;
    a pair mixes in place, an unpaired word spawns its partner into a free slot. Nothing else moves, and
    only A and the spawned words can break a truncation rule; the largest-terms cut, when it applies,
    is the one pass over the whole buffer.
    Returns (x, z, coeffs, sins, live, dropped[5]).
    """
    x, z, coeffs, sins, live, dropped = pair_split_uncapped(x, z, coeffs, sins, live, ac, gx, gz, cos, sin,
                                                            truncation, capacity, room)
    live, coeffs, dropped = cap_terms(x, z, coeffs, live, dropped, truncation, capacity)
    return x, z, coeffs, sins, live, dropped


def _limit(truncation: _t.Truncation, capacity: int):
    """(terms kept after a cut, the dropped-norm entry the cut charges: max_terms, or overflow)."""
    if truncation.max_terms is not None and truncation.max_terms <= capacity:
        return truncation.max_terms, 3
    return capacity, 4


def cap_terms(x, z, coeffs, live, dropped, truncation: _t.Truncation, capacity: int):
    """Keep the largest live terms when there are more than max_terms (or the capacity): one pass over
    the buffer, ties broken by the Pauli weight. Returns (live, coeffs, dropped)."""
    limit, rule = _limit(truncation, capacity)

    def cut(args):
        live, coeffs, dropped = args
        mag = jnp.abs(coeffs)
        kept = _t.keep_largest(mag, live, limit, tiebreak=lambda i: _w.weight(x[i], z[i]))
        return kept, jnp.where(kept, coeffs, 0), dropped.at[rule].add(jnp.sum(jnp.where(live & ~kept, mag, 0)))

    return lax.cond(shared(jnp.sum(live) > limit), cut, lambda a: a, (live, coeffs, dropped))


def pair_split_uncapped(x, z, coeffs, sins, live, ac, gx, gz, cos, sin, truncation: _t.Truncation,
                        capacity: int, room: int, moves: bool = False):
    """pair_split up to the largest-terms cut, which the caller makes with cap_terms: the spawned words
    are placed in free slots, so the live count may exceed max_terms (never the capacity: when the
    spawned words do not fit the free slots, the cut runs here, on the buffer and the spawned words).

    moves: also return what reverse mode needs (`adjoint.rotation_record`): per room entry its slot,
    whether its own word survived there (coefficient cos * c), the slot its sin * sign * c went to
    (its partner's, or its spawned word's; `capacity` if that did not survive) and that sign; and per
    slot whether its word survived the cut (a spawned word may take the slot of a cut one).
    """
    cap = x.shape[0]
    src = first_set(ac, room)
    valid = src < cap
    s = jnp.minimum(src, cap - 1)
    px, pz, pc, ps = x[s], z[s], coeffs[s], sins[s]
    lane, mask, on_x = _pivot(gx, gz)
    flip = (jnp.where(on_x, px[:, lane], pz[:, lane]) & mask) != 0
    qx, qz = jnp.where(flip[:, None], px ^ gx, px), jnp.where(flip[:, None], pz ^ gz, pz)  # canonical member

    if x64():
        nbits = index_bits(room)
        keys = sort_keys(qx, qz, valid, nbits)
        order = argsort_keys(keys, nbits)
        same_key = keys[order][1:] == keys[order][:-1]
    else:
        h1, h2 = _w.fingerprint(qx, qz)
        order = _fingerprint_order_32(h1, h2, valid)
        same_key = (h1[order][1:] == h1[order][:-1]) & (h2[order][1:] == h2[order][:-1])

    def in_order(o):
        # the words in sorted order, and which of them equal their successor's canonical member
        ox, oz, of, ov = px[o], pz[o], flip[o], valid[o]
        cx, cz = jnp.where(of[:, None], ox ^ gx, ox), jnp.where(of[:, None], oz ^ gz, oz)
        nxt = jnp.all(cx[1:] == cx[:-1], axis=1) & jnp.all(cz[1:] == cz[:-1], axis=1) & ov[1:] & ov[:-1]
        return o, ox, oz, ov, nxt

    sorted_ = in_order(order)
    vo, pair_next = sorted_[3], sorted_[4]
    # equal keys of different words could interleave two pairs: then order exactly by the words
    collision = jnp.any(same_key & vo[1:] & vo[:-1] & ~pair_next)
    order, px, pz, valid, pair_next = lax.cond(shared(collision), lambda: in_order(_exact_order(qx, qz, valid)),
                                               lambda: sorted_)
    pc, ps, src = pc[order], ps[order], src[order]
    no = jnp.zeros(1, bool)
    with_next, with_prev = jnp.concatenate([pair_next, no]), jnp.concatenate([no, pair_next])
    paired = with_next | with_prev
    i = jnp.arange(room)
    partner = jnp.where(with_next, i + 1, jnp.where(with_prev, i - 1, i))
    sign = _w.product_sign(px, pz, gx, gz)
    feed = sin * sign.astype(pc.dtype) * pc  # i G P = sign (P xor G)
    new_c = jnp.where(valid, cos * pc + jnp.where(paired, feed[partner], 0), 0)
    new_s = jnp.where(paired, jnp.minimum(ps, ps[partner] + 1), ps)
    spawn = valid & ~paired
    sx, sz, sc, ss = px ^ gx, pz ^ gz, jnp.where(spawn, feed, 0), ps + 1

    # truncation rules on the touched words (the rest satisfied them already)
    dropped = jnp.zeros(5, coeffs.dtype)
    keeps = []
    for cand, cx, cz, cc, cs in ((valid, px, pz, new_c, new_s), (spawn, sx, sz, sc, ss)):
        drop_w, drop_c, drop_s = _t.violations(truncation, cc, _w.weight(cx, cz), cs)
        mag = jnp.abs(cc)
        dropped = dropped.at[:3].add(jnp.stack([jnp.sum(jnp.where(cand & d, mag, 0)) for d in (drop_w, drop_c, drop_s)]))
        keeps.append(cand & ~drop_w & ~drop_c & ~drop_s)
    keep_old, keep_new = keeps
    at = jnp.where(valid, src, cap)
    coeffs = coeffs.at[at].set(jnp.where(keep_old, new_c, 0), mode="drop")
    sins = sins.at[at].set(new_s, mode="drop")
    live = live.at[at].set(keep_old, mode="drop")

    # when the spawned survivors do not fit the free slots, keep the largest of the buffer and them.
    # A rotation starts with at most `limit` live words, so a room of up to capacity - limit words
    # always fits: it compiles no cut.
    limit, rule = _limit(truncation, capacity)
    free = capacity - limit

    def cut_both(args):
        live, keep_new = args
        mag = jnp.concatenate([jnp.abs(coeffs), jnp.abs(sc)])
        mask = jnp.concatenate([live, keep_new])

        def weight_at(i):  # the tiebreak, evaluated only where the cut needs it
            a, b = jnp.minimum(i, cap - 1), jnp.clip(i - cap, 0, room - 1)
            return jnp.where(i < cap, _w.weight(x[a], z[a]), _w.weight(sx[b], sz[b]))

        # max_terms: the bucket selection (fast, common at saturation); otherwise this is the overflow
        # path, which reruns at a larger capacity: the radix select, which compiles faster
        kept = _t.keep_largest(mag, mask, limit, tiebreak=weight_at,
                               method="radix" if rule == 4 and on_cpu() else None)
        return kept[:cap], kept[cap:], jnp.sum(jnp.where(mask & ~kept, mag, 0))

    if room > free:
        live, keep_new, cut_norm = lax.cond(shared(jnp.sum(live) + jnp.sum(keep_new) > cap), cut_both,
                                            lambda a: (*a, jnp.zeros((), coeffs.dtype)), (live, keep_new))
        dropped = dropped.at[rule].add(cut_norm)
        coeffs = jnp.where(live, coeffs, 0)

    if moves:  # before the spawned words take free slots: a dropped or cut word's slot may be reused
        kept = live
        own = valid & live[jnp.minimum(at, cap - 1)]
    # spawned survivors take the first free slots (after the cut there are enough)
    slot = first_set(~live, room)
    rank = prefix_count(keep_new) - 1
    dest = jnp.where(keep_new, slot[jnp.clip(rank, 0, room - 1)], cap)
    if room <= free:  # no cut here: should a caller break the invariant, what does not fit is overflow
        dropped = dropped.at[4].add(jnp.sum(jnp.where(keep_new & (dest >= cap), jnp.abs(sc), 0)))
    x, z = x.at[dest].set(sx, mode="drop"), z.at[dest].set(sz, mode="drop")
    coeffs, sins = coeffs.at[dest].set(sc, mode="drop"), sins.at[dest].set(ss, mode="drop")
    live = live.at[dest].set(True, mode="drop")
    if not moves:
        return x, z, coeffs, sins, live, dropped
    fed = jnp.where(paired, jnp.where(own[partner], at[partner], cap), dest)
    return x, z, coeffs, sins, live, dropped, (at, own, fed, sign > 0, kept)
