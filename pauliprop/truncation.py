"""Truncation rules: which terms the estimator drops, and the keep-largest selection.

All rules are combinable; None switches a rule off. Dropped 1-norm is accounted per rule in
`PropagationStats`, so the cost of an approximation is always visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .batching import shared
from .prefix import count, first_set, prefix_count

# order of the dropped-norm entries in PropagationStats.dropped_norm
RULES = ("max_weight", "min_abs_coeff", "max_sins", "max_terms", "overflow")


@dataclass(frozen=True)
class Truncation:
    """Which terms to drop after each gate.

    max_weight:    drop words with more than this many non-identity sites.
    min_abs_coeff: drop terms with |coefficient| below this.
    max_terms:     keep only the max_terms largest |coefficient| after each splitting gate
                   (and in the observable itself).
    max_sins:      drop paths that took more than this many sine branches (Clifford
                   quarter turns do not count).
    per:           "gate" (default): the rules apply after every gate, as PauliPropagation.jl and
                   cuPauliProp apply them. "layer": after every step of the schedule instead, a
                   run of Clifford gates or a layer of commuting rotations on disjoint qubits
                   (pauliprop.schedule), so the result does not depend on how commuting gates are
                   ordered; nothing is dropped inside a step. Untruncated, both are exact.
    """

    max_weight: int | None = None
    min_abs_coeff: float | None = None
    max_terms: int | None = None
    max_sins: int | None = None
    per: str = "gate"

    def __post_init__(self):
        if self.per not in ("gate", "layer"):
            raise ValueError(f"Truncation.per must be 'gate' or 'layer', got {self.per!r}")
        for name in ("max_weight", "max_terms", "max_sins"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "max_terms" else 0)):
                raise ValueError(f"Truncation.{name} must be a {'positive' if name == 'max_terms' else 'non-negative'}"
                                 f" int or None, got {v!r}")
        c = self.min_abs_coeff
        if c is not None and not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0):
            raise ValueError(f"Truncation.min_abs_coeff must be a finite float >= 0 or None, got {c!r}")

    @property
    def is_exact(self) -> bool:
        return all(getattr(self, f) is None for f in ("max_weight", "min_abs_coeff", "max_terms", "max_sins"))

    @property
    def rules(self) -> tuple[bool, bool, bool, bool]:
        """Which rules are on (max_weight, min_abs_coeff, max_terms, max_sins): what the compiled
        program holds code for. Their values are data (`limits`), so one program serves them all."""
        return tuple(getattr(self, f) is not None for f in ("max_weight", "min_abs_coeff", "max_terms", "max_sins"))

    def limits(self, dtype) -> "Limits":
        """The rules' values as arrays (None for rules that are off)."""
        f = lambda v, t: None if v is None else np.asarray(v, t)
        return Limits(f(self.max_weight, np.int32), f(self.min_abs_coeff, dtype), f(self.max_terms, np.int32),
                      f(self.max_sins, np.int32))


NO_TRUNCATION = Truncation()

OFF = 1 << 30  # a weight, term or sine limit that never binds


class Limits(NamedTuple):
    """The truncation inside the engine: each rule's value as data, None where the rule is off."""

    max_weight: jax.Array | None = None
    min_abs_coeff: jax.Array | None = None
    max_terms: jax.Array | None = None
    max_sins: jax.Array | None = None

    def off_unless(self, on) -> "Limits":
        """These limits where `on`, else limits that drop nothing (the rules of a deferred step)."""
        pick = lambda v, off: None if v is None else jnp.where(on, v, jnp.asarray(off, jnp.asarray(v).dtype))
        return Limits(pick(self.max_weight, OFF), pick(self.min_abs_coeff, 0), pick(self.max_terms, OFF),
                      pick(self.max_sins, OFF))


def violations(trunc, coeffs, weights, sins):
    """Masks (weight, coeff, sins) of the terms each rule drops (a term is charged to its first rule).
    `trunc`: a Truncation or Limits (fields None where a rule is off)."""
    false = jnp.zeros(coeffs.shape, bool)
    w = weights > trunc.max_weight if trunc.max_weight is not None else false
    c = (jnp.abs(coeffs) < trunc.min_abs_coeff) & ~w if trunc.min_abs_coeff is not None else false
    s = (sins > trunc.max_sins) & ~w & ~c if trunc.max_sins is not None else false
    return w, c, s


def keep_largest(magnitudes, mask, k, method: str | None = None, tiebreak=None):
    """Mask of the k largest magnitudes among `mask`, or `mask` if it has <= k.

    Kept: the first k masked entries in the order (-magnitude, tiebreak, position). Ties at the
    threshold are common (equal-angle circuits give equal magnitudes); they prefer the smallest
    `tiebreak` (the Pauli weight: low-weight words are the likelier to overlap the state), then the
    earliest position, so the kept set does not depend on the merge path. `tiebreak` is an array or a
    function of an index array (then only the entries that can matter are evaluated).
    Selection works on the float's bit pattern (monotone for values >= 0), with no full sort:
    "bucket" (CPUs): one 16-bit histogram finds the bucket holding the k-th largest, and the exact
    selection runs on its few entries (1.8 ms instead of 4 ms at 1.4e5 entries, kicked-Ising data); a
    bucket larger than BUCKET_ROOM falls back to "radix": six 11-bit histogram passes over all entries.
    "bisect" (GPUs): one fused count per bit (histograms would serialise on atomics).
    """
    method = method or ("bucket" if jax.default_backend() == "cpu" else "bisect")
    if method not in ("bucket", "radix", "bisect"):
        raise ValueError(f"unknown keep_largest method {method!r}")
    itype = jnp.int64 if magnitudes.dtype == jnp.float64 else jnp.int32
    bits = lax.bitcast_convert_type(magnitudes, itype)
    value_bits = 63 if itype == jnp.int64 else 31  # the sign bit is 0 for magnitudes
    if tiebreak is None:
        tb_at = lambda i: jnp.zeros(i.shape, jnp.int32)
    else:
        at = tiebreak if callable(tiebreak) else (lambda i: tiebreak[i])
        tb_at = lambda i: jnp.clip(at(i), 0, TIE_LEVELS - 1).astype(jnp.int32)
    everywhere = lambda: tb_at(jnp.arange(bits.shape[0])) if callable(tiebreak) or tiebreak is None else \
        jnp.clip(tiebreak, 0, TIE_LEVELS - 1).astype(jnp.int32)
    keep = lambda: _select_and_break_ties(bits, mask, k, everywhere(), value_bits, itype, method)
    if method != "bucket":
        return keep()
    return _bucket_cut(bits, mask, k, tb_at, value_bits, itype, keep)


TIE_LEVELS = 1024  # tiebreak values are clipped to [0, TIE_LEVELS)
BUCKET_BITS = 16
BUCKET_ROOM = 4096  # entries of the threshold's bucket that "bucket" gathers


def _bucket_cut(bits, mask, k, tb_at, value_bits, itype, fallback):
    """keep_largest by one histogram of the top bits and an exact selection in the threshold's bucket."""
    width = BUCKET_BITS
    shift = value_bits - width
    size = 1 << width
    top = (bits >> shift).astype(jnp.int32)
    hist = histogram(jnp.where(mask, top, size), size)
    d, above = _kth_largest_bin(hist, k)

    def gathered_bucket(_):
        # the bucket's entries, in position order, then the exact selection among those few
        n = bits.shape[0]
        room = min(BUCKET_ROOM, n)
        src = first_set(mask & (top == d), room)
        ok = src < n
        s = jnp.minimum(src, n - 1)
        kept = _select_and_break_ties(bits[s], ok, k - above, tb_at(s), value_bits, itype, "radix")
        return (mask & (top > d)).at[jnp.where(ok, src, n)].set(kept, mode="drop")

    covered = count(mask) <= k
    pick = jnp.where(covered, 0, jnp.where(hist[d] <= min(BUCKET_ROOM, bits.shape[0]), 1, 2))
    # in a batch (batching.shared) a covered member may run another member's branch: it keeps its mask
    return jnp.where(covered, mask, lax.switch(shared(pick), [lambda _: mask, gathered_bucket, lambda _: fallback()], None))


def histogram(bins, size: int):
    """int32 counts of bins in [0, size); entries equal to size (or beyond) are not counted.
    (jnp.bincount counts in int64 under x64, and its prefix sums then cost twice as much.)"""
    return jnp.zeros(size, jnp.int32).at[bins].add(1, mode="drop")


def _kth_largest_bin(hist, k):
    """(d, above): the bin holding the k-th largest entry (counting from the top bin down) and the
    number of entries in bins above it. Two levels of sqrt(size) bins, so that no prefix sum runs
    over the whole histogram (a 65536-bin cumsum took 0.15 ms per cut on the 2-core CPU)."""
    size = hist.shape[0]
    side = 1 << ((size.bit_length() - 1) // 2)
    rows = hist.reshape(size // side, side)
    rows_at_least = jnp.cumsum(rows.sum(axis=1)[::-1])[::-1]  # entries in rows >= r
    r = jnp.maximum(jnp.sum(rows_at_least >= k) - 1, 0)
    above_row = jnp.where(r + 1 < rows.shape[0], rows_at_least[jnp.minimum(r + 1, rows.shape[0] - 1)], 0)
    at_least = jnp.cumsum(rows[r][::-1])[::-1] + above_row  # entries in bins >= (r, c)
    c = jnp.maximum(jnp.sum(at_least >= k) - 1, 0)
    above = jnp.where(c + 1 < side, at_least[jnp.minimum(c + 1, side - 1)], above_row)
    return r * side + c, above


def _select_and_break_ties(bits, mask, k, tb, value_bits, itype, method):
    t = (_radix_select if method in ("bucket", "radix") else _bisect_select)(bits, mask, k, value_bits, itype)
    above = mask & (bits > t)
    ties = mask & (bits == t)
    room = k - count(above)
    at_most = jnp.cumsum(histogram(jnp.where(ties, tb, TIE_LEVELS), TIE_LEVELS))
    cut = jnp.sum(at_most < room)  # smallest level whose cumulative count reaches room
    below = jnp.where(cut > 0, at_most[jnp.maximum(cut - 1, 0)], 0)
    take_all = ties & (tb < cut)
    ties = ties & (tb == cut)
    above = above | take_all
    room = room - below
    tie_rank = prefix_count(ties) - 1
    return above | (ties & (tie_rank < room))


def _radix_select(bits, mask, k, value_bits, itype):
    """The k-th largest of bits[mask], most significant digit first: one histogram a digit, in a
    fori_loop (a single histogram in the program: XLA:CPU compiles each scatter for tens of ms)."""
    unsigned = jnp.uint64 if itype == jnp.int64 else jnp.uint32
    width = 9 if itype == jnp.int64 else 8  # 7 digits of the 63 value bits, or 4 of 32 (the sign bit is 0)
    digits = -(-value_bits // width)
    size = 1 << width
    ubits = bits.astype(unsigned)

    def digit_step(i, carry):
        prefix, need = carry
        shift = ((digits - 1 - i) * width).astype(unsigned)
        # shifts past the type's width give 0 in XLA, so the first digit's prefix test passes everywhere
        in_prefix = mask & ((ubits >> (shift + width)) == prefix)
        digit = ((ubits >> shift) & (size - 1)).astype(jnp.int32)
        hist = histogram(jnp.where(in_prefix, digit, size), size)
        at_least = jnp.cumsum(hist[::-1])[::-1]  # at_least[d] = count with digit >= d
        d = jnp.sum(at_least >= need) - 1  # at_least is non-increasing: the ok digits are a prefix
        above = jnp.where(d + 1 < size, at_least[jnp.minimum(d + 1, size - 1)], 0)
        return (prefix << width) | d.astype(unsigned), need - above

    prefix, _ = lax.fori_loop(0, digits, digit_step, (jnp.zeros((), unsigned), jnp.asarray(k, jnp.int32)))
    return prefix.astype(itype)


def _bisect_select(bits, mask, k, value_bits, itype):
    """The k-th largest of bits[mask] by bisection: count(bits >= lo) >= k > count(bits >= hi)."""
    bits = jnp.where(mask, bits, -1)

    def body(_, lohi):
        lo, hi = lohi
        mid = lo + (hi - lo) // 2
        ok = jnp.sum(bits >= mid) >= k
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    hi0 = jnp.max(bits).astype(itype) + 1
    t, _ = lax.fori_loop(0, value_bits + 1, body, (jnp.zeros((), itype), hi0))
    return t
