"""Duplicate merging, truncation and prefix-sum compaction of a candidate buffer.

After a splitting gate the candidates (old terms and their new partners, 2C slots) hold duplicate
words. We sort by a 64-bit fingerprint so equal words sit together, sum each run, apply the
truncation rules, and scatter the survivors to the front of a C-slot buffer by prefix sum.

Sorting, measured (DESIGN.md section 4): XLA's sort of one uint64 key is fast on both backends,
a key with a payload is fast on GPUs (radix) but 6x slower on CPUs. So on CPUs the run index is
packed into the key's low bits; on GPUs the key is the full fingerprint and the index a payload.
Fingerprints can collide: runs are checked word by word and a collision switches that gate to an
exact lexicographic sort, so results never depend on hash luck. Without jax_enable_x64 the key is
two uint32 halves (a slower two-key sort, same results).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from . import truncation as _t
from . import words as _w


def _x64() -> bool:
    return jax.config.jax_enable_x64


def _fingerprint_order(h1, h2, live):
    """Permutation putting live words first, ordered by fingerprint (dead slots last)."""
    m = h1.shape[0]
    idx = jnp.arange(m, dtype=jnp.int32)
    if not _x64():
        dead = (~live).astype(jnp.uint32)
        return lax.sort((dead, h1, h2, idx), num_keys=3)[-1]
    key = (h1.astype(jnp.uint64) << 32) | h2.astype(jnp.uint64)
    key = (key >> 1) | (jnp.where(live, 0, 1).astype(jnp.uint64) << 63)  # dead slots sort last
    if jax.default_backend() == "cpu":
        nb = max(1, (m - 1).bit_length())
        low = jnp.uint64((1 << nb) - 1)
        packed = (key & ~low) | idx.astype(jnp.uint64)
        return (lax.sort(packed) & low).astype(jnp.int32)
    return lax.sort((key, idx), num_keys=1)[1]


def _exact_order(x, z, live):
    """Lexicographic order on the words themselves (the collision fallback)."""
    idx = jnp.arange(x.shape[0], dtype=jnp.int32)
    keys = [(~live).astype(jnp.uint32)] + [x[:, i] for i in range(x.shape[1])] + [z[:, i] for i in range(z.shape[1])]
    return lax.sort((*keys, idx), num_keys=len(keys))[-1]


def _same_as_previous(xs, zs, ls):
    eq = jnp.all(xs[1:] == xs[:-1], axis=1) & jnp.all(zs[1:] == zs[:-1], axis=1)
    return jnp.concatenate([jnp.zeros(1, bool), eq & ls[1:] & ls[:-1]])


def merge_and_truncate(x, z, coeffs, sins, live, truncation: _t.Truncation, capacity: int):
    """Merge duplicates among the live candidates, truncate, and compact into `capacity` slots.

    Returns (x, z, coeffs, sins, live, dropped) with arrays of leading size `capacity`, live
    terms first, and `dropped` the 1-norm dropped per rule (order of truncation.RULES).
    """
    m = x.shape[0]
    h1, h2 = _w.fingerprint(x, z)
    order = _fingerprint_order(h1, h2, live)
    hs1, hs2, ls = h1[order], h2[order], live[order]
    xs, zs = x[order], z[order]
    same_key = jnp.concatenate([jnp.zeros(1, bool), (hs1[1:] == hs1[:-1]) & (hs2[1:] == hs2[:-1]) & ls[1:] & ls[:-1]])
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
    run = jnp.maximum(jnp.cumsum(head.astype(jnp.int32)) - 1, 0)
    run_coeff = jnp.zeros(m, cs.dtype).at[run].add(cs)
    big = jnp.iinfo(jnp.int32).max
    run_sins = jnp.full(m, big, jnp.int32).at[run].min(jnp.where(ls, ss, big))
    c = run_coeff[run]
    s = run_sins[run]

    drop_w, drop_c, drop_s = _t.violations(truncation, c, _w.weight(xs, zs), s)
    keep = head & (c != 0) & ~drop_w & ~drop_c & ~drop_s
    mag = jnp.abs(c)
    dropped = [jnp.sum(jnp.where(head & d, mag, 0)) for d in (drop_w, drop_c, drop_s)]

    limit = capacity if truncation.max_terms is None else min(truncation.max_terms, capacity)
    n_keep = jnp.sum(keep)
    capped = lax.cond(n_keep > limit, lambda k: _t.keep_largest(mag, k, limit), lambda k: k, keep)
    cap_norm = jnp.sum(jnp.where(keep & ~capped, mag, 0))
    is_max_terms = truncation.max_terms is not None and truncation.max_terms <= capacity
    zero = jnp.zeros((), mag.dtype)
    dropped += [cap_norm, zero] if is_max_terms else [zero, cap_norm]

    slot = jnp.where(capped, jnp.cumsum(capped.astype(jnp.int32)) - 1, capacity)
    out = lambda a, fill=0: jnp.full((capacity,) + a.shape[1:], fill, a.dtype).at[slot].set(a, mode="drop")
    n_out = jnp.sum(capped)
    return (out(xs), out(zs), out(c), out(s), jnp.arange(capacity) < n_out, jnp.stack(dropped))
