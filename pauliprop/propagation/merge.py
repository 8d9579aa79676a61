"""Duplicate merging, truncation and compaction of the term buffer.

The buffer holds distinct live words in arbitrary slots (dead slots are free), as three arrays:
`words` (C, 2W) uint32 (x lanes, then z lanes), `coeffs` (C,) and `meta` (C,) int32 (bit 0: live,
the rest: the sine branches the path took). A slot moves with one gather or scatter per array, which
keeps the compiled programs small (XLA:CPU spends 15-25 ms compiling each gather and scatter).

Two ways to merge:

* `pair_split`, every rotation: a word P that anticommutes with the generator G meets only its partner
  P xor G, which anticommutes too. So a rotation gathers its M splitting words, sorts them by the
  pair's canonical member, mixes each pair in place and spawns the missing partners into free slots:
  O(M log M) plus a few streaming passes over the buffer, whatever its size.
* `full_merge`: sort all candidates by a 64-bit key, sum runs of equal words, truncate, compact.
  O(N log N); for the initial observable (which may repeat words) and amplitude damping (whose new
  words may equal any word).

Both take the truncation as data (`truncation.Limits`, or a Truncation, converted), and both can
stop instead of cutting: with `stop=True` a result that does not fit the capacity (and that no
max_terms cut brings under it) is not made; the last output says how many slots it needed, and the
caller grows the buffer and resumes there (propagate.py) instead of losing terms.

Measured (DESIGN.md section 4 and experiments/HISTORY.md): XLA sorts one uint64 key fast on both
backends, but a key with a payload 6x slower on CPUs; so on CPUs the slot index is packed into the
key's low bits, and on GPUs it is a payload. Words of up to 16 qubits are their own key (`exact`).
Longer ones sort by a fingerprint, which can collide: equal keys are checked word by word and a
collision sends the sort to an exact lexicographic one, so results never depend on hash luck.
Without jax_enable_x64 the sort takes two uint32 keys (slower, same results).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..algebra import words as pauli_words
from ..runtime.batching import shared
from ..runtime.prefix import count, first_set, on_cpu, prefix_count
from .truncation import Limits, keep_largest, violations

DEAD_KEY = np.uint64((1 << 64) - 1)
BIG = np.int32(2**30)  # a sine count above any limit


def x64() -> bool:
    return bool(jax.config.jax_enable_x64)


def halves(words):
    """(x, z) views of packed words (..., 2W)."""
    w = words.shape[-1] // 2
    return words[..., :w], words[..., w:]


def weight(words):
    x, z = halves(words)
    return pauli_words.weight(x, z)


def live_of(meta):
    return (meta & 1) != 0


def sins_of(meta):
    return meta >> 1


def pack_meta(live, sins):
    return (jnp.minimum(sins, BIG) << 1) | live.astype(jnp.int32)


def index_bits(n: int) -> int:
    """Low key bits reserved for the index of n sorted items on CPUs (GPUs sort it as a payload)."""
    return max(1, (n - 1).bit_length()) if on_cpu() else 0


def exact_words(num_qubits: int) -> bool:
    """Whether words of this many qubits sort by their own bits (merge.hashes)."""
    return num_qubits <= 16


def tie_keys(words):
    """The largest-terms cut's tiebreak of each word (truncation.keep_largest): its Pauli weight (low
    weights are the likelier to overlap the state), then its fingerprint. A function of the word
    alone, so which of equally large terms a cut keeps does not depend on the slots they sit in (a
    batch member, another capacity or room keeps the same terms). truncation.TIE_BITS bits (32
    without x64)."""
    x, z = halves(words)
    w = jnp.minimum(pauli_words.weight(x, z), 1023)
    h1, h2 = pauli_words.fingerprint(x, z)
    if x64():
        return (w.astype(jnp.uint64) << 38) | (h1.astype(jnp.uint64) << 6) | (h2 >> 26).astype(jnp.uint64)
    return (w.astype(jnp.uint32) << 22) | (h1 >> 10)


def hashes(words, exact: bool = False):
    """Two uint32 keys per word: its fingerprint, or with `exact` (one lane, at most 16 qubits) the word
    itself (z << 16 | x, 0), which needs no collision check."""
    x, z = halves(words)
    if exact:
        return (x[:, 0] | (z[:, 0] << 16)).astype(jnp.uint32), jnp.zeros(x.shape[0], jnp.uint32)
    return pauli_words.fingerprint(x, z)


def sort_keys(words, live, nbits: int, exact: bool = False):
    """uint64 keys: the words' hashes with the low `nbits` cleared; dead slots get DEAD_KEY."""
    h1, h2 = hashes(words, exact)
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


PREFIX_SORT_MIN = 1 << 14  # rooms from this many slots sort the smallest of a quarter, half or all of them


def _in_prefix(order_of, count, n: int):
    """The permutation order_of(n), where order_of(m) sorts the first m entries (m static), the live
    ones are the first `count` and dead ones sort last in position order. CPUs sort the smallest of
    n/4, n/2 and n entries that holds the live ones and leave the rest in place: a room takes the
    rotations of a range of sizes (std::sort of 2^16 keys 1.6 ms, of 2^15 0.75 ms on one core)."""
    if count is None or not on_cpu() or n < PREFIX_SORT_MIN:
        return order_of(n)
    sizes = (n // 4, n // 2, n)
    rest = lambda m: jnp.arange(m, n, dtype=jnp.int32)
    branches = [lambda m=m: jnp.concatenate([order_of(m), rest(m)]) for m in sizes[:-1]] + [lambda: order_of(n)]
    return lax.switch(shared(jnp.sum(count > jnp.asarray(sizes[:-1], jnp.int32))), branches)


def _exact_order(words, live):
    """Lexicographic order on the words themselves (the collision fallback)."""
    idx = jnp.arange(words.shape[0], dtype=jnp.int32)
    keys = [(~live).astype(jnp.uint32)] + [words[:, i] for i in range(words.shape[1])]
    return lax.sort((*keys, idx), num_keys=len(keys))[-1]


def order_words(words, live, exact: bool = False, count=None):
    """(order, same_key): a permutation putting equal live words side by side (live first), and which
    sorted entries have the key of their predecessor (for the collision check). count: the live
    words are the first `count` entries (then CPUs sort only a prefix that holds them: `_in_prefix`)."""
    n = words.shape[0]
    if x64():
        nbits = index_bits(n)
        keys = sort_keys(words, live, nbits, exact)
        order = _in_prefix(lambda m: argsort_keys(keys[:m], nbits), count, n)
        ks = keys[order]
        return order, (ks[1:] == ks[:-1]) & (ks[1:] != DEAD_KEY)
    h1, h2 = hashes(words, exact)
    idx = jnp.arange(n, dtype=jnp.int32)
    dead = (~live).astype(jnp.uint32)
    order = _in_prefix(lambda m: lax.sort((dead[:m], h1[:m], h2[:m], idx[:m]), num_keys=3)[-1], count, n)
    ls = live[order]
    return order, (h1[order][1:] == h1[order][:-1]) & (h2[order][1:] == h2[order][:-1]) & ls[1:] & ls[:-1]


def _same_as_previous(ws, ls):
    eq = jnp.all(ws[1:] == ws[:-1], axis=1)
    return jnp.concatenate([jnp.zeros(1, bool), eq & ls[1:] & ls[:-1]])


def as_limits(truncation) -> Limits:
    """Limits (data) from a Truncation, or Limits as they are."""
    if isinstance(truncation, Limits):
        return truncation
    return truncation.limits(jnp.result_type(float))


def _limit(limits: Limits, capacity: int):
    """(terms kept after a cut, the dropped-norm entry it charges: 3 for max_terms, 4 for overflow)."""
    if limits.max_terms is None:
        return capacity, 4
    return jnp.minimum(limits.max_terms, capacity), jnp.where(limits.max_terms <= capacity, 3, 4)


def rule_charges(limits, coeffs, weights, sins, candidate):
    """(keep mask, the 1-norm each per-term rule dropped (weight, coefficient, sines))."""
    drop_w, drop_c, drop_s = violations(limits, coeffs, weights, sins)
    mag = jnp.abs(coeffs)
    charge = jnp.stack([jnp.sum(jnp.where(candidate & d, mag, 0)) for d in (drop_w, drop_c, drop_s)])
    # zero coefficients stay: their words carry derivatives (sin(a) c at a = 0); min_abs_coeff drops them
    return candidate & ~drop_w & ~drop_c & ~drop_s, charge


def full_merge(words, coeffs, meta, truncation, capacity: int, stop: bool = False, exact: bool = False,
               moves: bool = False):
    """Merge duplicates among all live candidates, truncate, compact into `capacity` slots.

    Returns (words, coeffs, meta, dropped[5]); with `stop` also the slots the result needs (above `capacity`: an overflow that no max_terms cut brings under it, and the output
    is void). exact: the words sort by their own bits (merge.hashes). moves: also each candidate's
    output slot (`capacity`: dropped or dead), the frozen map that reverse mode records.
    """
    limits = as_limits(truncation)
    m = words.shape[0]
    live = live_of(meta)
    order, same_key = order_words(words, live, exact)
    ws, ms = words[order], meta[order]
    ls = live_of(ms)
    if not exact:
        collision = jnp.any(same_key & ~_same_as_previous(ws, ls)[1:])

        def exact_order(_):
            o = _exact_order(words, live)
            return o, words[o], meta[o]

        order, ws, ms = lax.cond(shared(collision), exact_order, lambda _: (order, ws, ms), None)
        ls = live_of(ms)
    cs = jnp.where(ls, coeffs[order], 0)

    # runs of equal words: the head of each run collects the run's coefficient (and its fewest sines)
    head = ls & ~_same_as_previous(ws, ls)
    run = jnp.maximum(prefix_count(head) - 1, 0)
    run_coeff = jnp.zeros(m, cs.dtype).at[run].add(cs)[run]
    if limits.max_sins is not None:
        run_sins = jnp.full(m, BIG, jnp.int32).at[run].min(jnp.where(ls, sins_of(ms), BIG))[run]
    else:
        run_sins = sins_of(ms)
    keep, charge = rule_charges(limits, run_coeff, weight(ws), run_sins, head)
    dropped = jnp.concatenate([charge, jnp.zeros(2, charge.dtype)])
    limit, rule = _limit(limits, capacity)
    need = count(keep)
    if not (stop and limits.max_terms is None):
        mag = jnp.abs(run_coeff)
        cut = lambda k: keep_largest(mag, k, limit, tiebreak=lambda i: tie_keys(ws[i]),
                                     tiebreak_all=lambda: tie_keys(ws))
        capped = lax.cond(shared(need > limit), cut, lambda k: k, keep)
        dropped = dropped.at[rule].add(jnp.sum(jnp.where(keep & ~capped, mag, 0)))
        keep = capped
    # survivors, in sorted order, to the front
    rank = prefix_count(keep) - 1
    dest = jnp.where(keep & (rank < capacity), rank, capacity)
    out_words = jnp.zeros((capacity, words.shape[1]), words.dtype).at[dest].set(ws, mode="drop")
    out_coeffs = jnp.zeros(capacity, coeffs.dtype).at[dest].set(run_coeff, mode="drop")
    out_meta = jnp.zeros(capacity, jnp.int32).at[dest].set(pack_meta(keep, run_sins), mode="drop")
    out = (out_words, out_coeffs, out_meta, dropped)
    if stop:
        overflow = shared((need > capacity) & (rule == 4))
        out = (*out, jnp.where(overflow, need, 0))
    if moves:  # each sorted entry goes where its run's head went
        at_run = jnp.full(m, capacity, jnp.int32).at[run].min(jnp.where(head, dest, capacity))
        out = (*out, jnp.full(m, capacity, jnp.int32).at[order].set(jnp.where(ls, at_run[run], capacity)))
    return out


def pivot(g):
    """One site bit of G (its lowest): (lane of the packed word, mask). P and P xor G differ there, so
    'that bit is 0' picks one member of every pair {P, P xor G}. g: (2W,), or (M, 2W) (one a word)."""
    gx, gz = halves(g)
    w = gx.shape[-1]
    site = gx | gz
    lane = lax.argmax(site != 0, site.ndim - 1, jnp.int32)  # jnp.argmax: int64 under x64, kept a word on GPUs
    bits = jnp.take_along_axis(site, lane[..., None], axis=-1)[..., 0]
    mask = bits & (~bits + jnp.uint32(1))
    in_x = (jnp.take_along_axis(gx, lane[..., None], axis=-1)[..., 0] & mask) != 0
    return jnp.where(in_x, lane, lane + w), mask


def cap_terms(words, coeffs, meta, dropped, truncation, capacity: int):
    """Keep the largest live terms when there are more than max_terms: one pass over the buffer, ties
    broken by tie_keys. Returns (coeffs, meta, dropped); nothing to do without max_terms."""
    limits = as_limits(truncation)
    if limits.max_terms is None:
        return coeffs, meta, dropped
    limit, rule = _limit(limits, capacity)
    live = live_of(meta)

    def cut(args):
        coeffs, meta, dropped = args
        mag = jnp.abs(coeffs)
        kept = keep_largest(mag, live, limit, tiebreak=lambda i: tie_keys(words[i]),
                            tiebreak_all=lambda: tie_keys(words))
        return (jnp.where(kept, coeffs, 0), jnp.where(kept, meta, 0),
                dropped.at[rule].add(jnp.sum(jnp.where(live & ~kept, mag, 0))))

    return lax.cond(shared(count(live) > limit), cut, lambda a: a, (coeffs, meta, dropped))


COLLIDED = -1  # pair_split's "slots needed" when it met a fingerprint collision and reported it (wrote nothing)


def pair_split(words, coeffs, meta, ac, g, cos, sin, truncation, capacity: int, room: int, stop: bool = False,
               exact: bool = False, fits: bool = False, report_collisions: bool = False, moves: bool = False):
    """Rotation exp(-i a/2 G) on a buffer of distinct live words, touching only the splitting words.
    g (2W,), cos and sin (scalars): one rotation. Or one a slot (g (C, 2W), cos and sin (C,)): each
    word P turns by its own generator, where P and P xor G have the same one (engine.layer_unit).

    A word P that anticommutes with G (`ac`) keeps cos * c and feeds sin * sign * c to P xor G, which
    also anticommutes with G: so every merge happens inside the splitting set A. Sorting A (at most
    `room` words, the caller's choice) by the pair's canonical member puts each pair {P, P xor G} side
    by side; a pair mixes in place, an unpaired word spawns its partner into a free slot. Nothing else
    moves, and only A and the spawned words can break a truncation rule.

    The largest-terms cut is the caller's (`cap_terms`, one pass over the whole buffer), except when
    the spawned survivors do not fit the free slots: then the buffer and the spawned words are cut
    together here, to max_terms (or to the capacity, charged to overflow). With `stop` and no
    max_terms below the capacity such a rotation is not made: nothing is written, and the last output
    is the slots it needed (0 when it fitted). fits: the caller knows that the live words and the
    splitting ones together fit the buffer, so neither the cut nor the overflow can happen (the
    program then holds no code for them: a cut costs seconds of compilation per room).
    report_collisions (with `stop`): two words whose fingerprints collide are not ordered exactly
    here; the rotation writes nothing and the slots needed are COLLIDED, for the caller to redo it
    in a program that orders exactly (so the usual program holds no exact sort).
    Returns (words, coeffs, meta, dropped[5]) (and the slots needed, with `stop`); with `moves` (not with
    `stop`) also the frozen map reverse mode records: (each slot keeps its own word, scaled: (capacity,)
    bool; per room entry its slot (capacity: none), the slot its sine feeds (capacity: none) and
    whether that feed is negated).
    """
    limits = as_limits(truncation)
    cap = words.shape[0]
    src = first_set(ac, room)
    valid = src < cap
    s = jnp.minimum(src, cap - 1)
    pw = words[s]
    each = g.ndim == 2  # a generator (and angle) for every word
    if each:
        g, cos, sin = g[s], cos[s], sin[s]
    lane, mask = pivot(g)
    at_lane = jnp.take_along_axis(pw, lane[:, None], axis=1)[:, 0] if each else pw[:, lane]
    flip = (at_lane & mask) != 0
    qw = jnp.where(flip[:, None], pw ^ g, pw)  # canonical member
    order, same_key = order_words(qw, valid, exact, count=count(valid))

    def in_order(o):
        # the words in sorted order (from their canonical members: one gather of words, not two), and
        # which of them equal their successor's canonical member
        cw, ov = qw[o], valid[o]
        ow = jnp.where(flip[o][:, None], cw ^ (g[o] if each else g), cw)
        return o, ow, ov, jnp.all(cw[1:] == cw[:-1], axis=1) & ov[1:] & ov[:-1]

    collided = jnp.asarray(False)
    if exact:
        order, pw, valid, pair_next = in_order(order)
    else:
        sorted_ = in_order(order)
        # equal keys of different words could interleave two pairs: then order exactly by the words
        collision = shared(jnp.any(same_key & sorted_[2][1:] & sorted_[2][:-1] & ~sorted_[3]))
        if report_collisions and stop:
            order, pw, valid, pair_next = sorted_
            collided = collision
        else:
            order, pw, valid, pair_next = lax.cond(collision, lambda: in_order(_exact_order(qw, valid)),
                                                   lambda: sorted_)
    src = src[order]
    if each:
        g, cos, sin = g[order], cos[order], sin[order]
    at = jnp.where(valid, src, cap)
    pc, pm = coeffs[jnp.minimum(src, cap - 1)], meta[jnp.minimum(src, cap - 1)]
    ps = sins_of(pm)
    no = jnp.zeros(1, bool)
    with_next, with_prev = jnp.concatenate([pair_next, no]), jnp.concatenate([no, pair_next])
    paired = with_next | with_prev
    i = jnp.arange(room)
    partner = jnp.where(with_next, i + 1, jnp.where(with_prev, i - 1, i))
    px, pz = halves(pw)
    gx, gz = halves(g)
    sign = pauli_words.product_sign(px, pz, gx, gz)
    feed = sin * sign.astype(pc.dtype) * pc  # i G P = sign (P xor G)
    new_c = jnp.where(valid, cos * pc + jnp.where(paired, feed[partner], 0), 0)
    new_s = jnp.where(paired, jnp.minimum(ps, ps[partner] + 1), ps)
    spawn = valid & ~paired
    sw, sc, ss = pw ^ g, jnp.where(spawn, feed, 0), ps + 1

    # truncation rules on the touched words (the rest satisfied them already)
    keep_old, charge_old = rule_charges(limits, new_c, weight(pw), new_s, valid)
    keep_new, charge_new = rule_charges(limits, sc, weight(sw), ss, spawn)
    dropped = jnp.concatenate([charge_old + charge_new, jnp.zeros(2, charge_old.dtype)])
    live = live_of(meta)
    limit, rule = _limit(limits, capacity)
    cut_here = not fits and not (stop and limits.max_terms is None)
    overflow, need = collided, jnp.where(collided, COLLIDED, 0)
    if stop and not fits:  # an overflowing rotation writes nothing
        need = count(live) - count(valid & ~keep_old) + count(keep_new)
        overflow = shared((need > cap) & (rule == 4))
        need = jnp.where(collided, COLLIDED, need)
        overflow = overflow | collided
    if stop:  # an overflowing (or collided) rotation writes nothing
        at = jnp.where(overflow, cap, at)
        keep_new = keep_new & ~overflow
        dropped = jnp.where(overflow, 0, dropped)
    coeffs = coeffs.at[at].set(jnp.where(keep_old, new_c, 0), mode="drop")
    meta = meta.at[at].set(pack_meta(keep_old, new_s), mode="drop")
    live = live_of(meta)

    if cut_here:  # the spawned survivors do not fit the free slots: keep the largest of the buffer and them
        def cut_both(args):
            live, keep_new = args
            mag = jnp.concatenate([jnp.abs(coeffs), jnp.abs(sc)])
            both = jnp.concatenate([live, keep_new])

            def keys_at(i):  # the tiebreak, evaluated only where the cut needs it
                a, b = jnp.minimum(i, cap - 1), jnp.clip(i - cap, 0, room - 1)
                return tie_keys(jnp.where((i < cap)[:, None], words[a], sw[b]))

            # every entry's: the keys of the two arrays as they are, not of a gathered (capacity + room,
            # 2W) copy of their words (48-64 bytes a slot where XLA kept it)
            keys_all = lambda: jnp.concatenate([tie_keys(words), tie_keys(sw)])
            # max_terms: the bucket selection (fast, common at saturation); otherwise this is the overflow
            # path, which reruns at a larger capacity: one sort, which compiles fastest
            kept = keep_largest(mag, both, limit, tiebreak=keys_at, tiebreak_all=keys_all,
                                method="sort" if limits.max_terms is None and on_cpu() else None)
            return kept[:cap], kept[cap:], jnp.sum(jnp.where(both & ~kept, mag, 0))

        live, keep_new, cut_norm = lax.cond(shared(count(live) + count(keep_new) > cap), cut_both,
                                            lambda a: (*a, jnp.zeros((), coeffs.dtype)), (live, keep_new))
        dropped = dropped.at[rule].add(cut_norm)
        coeffs = jnp.where(live, coeffs, 0)
        meta = jnp.where(live, meta, 0)

    # spawned survivors take the first free slots (after the cut there are enough)
    slot = first_set(~live, room)
    rank = prefix_count(keep_new) - 1
    dest = jnp.where(keep_new, slot[jnp.clip(rank, 0, room - 1)], cap)
    own = live  # the words that keep their slot (before spawned words take free ones)
    words = words.at[dest].set(sw, mode="drop")
    coeffs = coeffs.at[dest].set(sc, mode="drop")
    meta = meta.at[dest].set(pack_meta(jnp.ones_like(keep_new), ss), mode="drop")
    out = (words, coeffs, meta, dropped)
    if stop:
        return (*out, jnp.where(overflow, need, 0).astype(jnp.int32))
    if moves:  # a sine feeds the partner's slot where the partner's mixed word stays, else the spawned word's
        them = jnp.minimum(src[partner], cap - 1)
        fed = jnp.where(paired, jnp.where(own[them], them, cap), dest)
        out = (*out, (own, jnp.where(valid, src, cap), jnp.where(valid, fed, cap), sign < 0))
    return out
