"""Truncation rules: which terms the estimator drops, and the keep-largest selection.

All rules are combinable; None switches a rule off. Dropped 1-norm is accounted per rule in
`PropagationStats`, so the cost of an approximation is always visible.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..runtime.batching import shared
from ..runtime.prefix import count, first_set
from ..runtime import devices

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
                   (pauliprop.propagation.schedule), so the result does not depend on how commuting gates are
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
    def rules(self) -> "Rules":
        """Which rules are on and where they act: what a compiled program holds code for. Their values
        are data (`limits`), so one program serves them all."""
        return Rules(*(getattr(self, f) is not None for f in ("max_weight", "min_abs_coeff", "max_terms", "max_sins")),
                     per=self.per)

    def limits(self, dtype) -> "Limits":
        """The rules' values as the engines compare with them: 0-d arrays (the weight, term and sine limits
        int32, min_abs_coeff in the coefficients' dtype), None for rules that are off. Made once a process
        for each truncation and dtype, read-only."""
        return _limits(self, np.dtype(dtype).name)


@functools.lru_cache(maxsize=256)
def _limits(truncation: Truncation, dtype: str) -> "Limits":
    def value(v, t):
        if v is None:
            return None
        a = np.asarray(v, t)
        a.flags.writeable = False
        return a

    return Limits(value(truncation.max_weight, np.int32), value(truncation.min_abs_coeff, dtype),
                  value(truncation.max_terms, np.int32), value(truncation.max_sins, np.int32))


class Rules(NamedTuple):
    """A truncation's static part (`Truncation.rules`): which rules are on, and whether they act after each
    gate or each step. The engines' Configs carry it; the values are `Limits`."""

    max_weight: bool = False
    min_abs_coeff: bool = False
    max_terms: bool = False
    max_sins: bool = False
    per: str = "gate"

    @property
    def weight_each_gate(self) -> bool:
        """The weight rule acts after every gate of a Clifford run too (per="gate" with max_weight): such
        runs go gate by gate, where otherwise one map and the rules at the run's end serve."""
        return self.per == "gate" and self.max_weight

    @property
    def cut_each_gate(self) -> bool:
        """The largest-terms cut acts after every splitting gate (per="gate" with max_terms): a global cut,
        so a layer of rotations cannot be one unit (engine.layers_for)."""
        return self.per == "gate" and self.max_terms


NO_TRUNCATION = Truncation()

OFF = 1 << 30  # a weight, term or sine limit that never binds


class Limits(NamedTuple):
    """The truncation inside the engine: each rule's value as data, None where the rule is off."""

    max_weight: jax.Array | None = None
    min_abs_coeff: jax.Array | None = None
    max_terms: jax.Array | None = None
    max_sins: jax.Array | None = None

    def off_unless_each(self, on: dict) -> "Limits":
        """Each rule's limit where on[its name], else one that drops nothing (`on`: bools by field name)."""
        pick = lambda f: None if getattr(self, f) is None else jnp.where(
            on[f], getattr(self, f), jnp.asarray(DROPS_NOTHING[f], jnp.asarray(getattr(self, f)).dtype))
        return Limits(*(pick(f) for f in self._fields))

    def off_unless(self, on) -> "Limits":
        """These limits where `on`, else limits that drop nothing (the rules of a deferred step)."""
        return self.off_unless_each(dict.fromkeys(self._fields, on))

    def filled(self) -> "Limits":
        """Each rule's limit, the value that drops nothing (DROPS_NOTHING) where the rule is off: for code
        that holds every rule (the native engine's C loops)."""
        return Limits(*(DROPS_NOTHING[f] if getattr(self, f) is None else getattr(self, f).item() for f in self._fields))


DROPS_NOTHING = dict(max_weight=OFF, min_abs_coeff=0.0, max_terms=OFF, max_sins=OFF)  # each rule's value when off


def violations(trunc, coeffs, weights, sins=None):
    """Masks (weight, coeff, sins) of the terms each rule drops (a term is charged to its first rule).
    `trunc`: a Truncation or Limits (fields None where a rule is off); numpy masks for numpy coefficients
    (the observable's merge on the host), jax's otherwise; sins None: no path took a sine."""
    xp = np if isinstance(coeffs, np.ndarray) else jnp
    false = xp.zeros(coeffs.shape, bool)
    w = weights > trunc.max_weight if trunc.max_weight is not None else false
    c = (xp.abs(coeffs) < trunc.min_abs_coeff) & ~w if trunc.min_abs_coeff is not None else false
    s = (sins > trunc.max_sins) & ~w & ~c if trunc.max_sins is not None and sins is not None else false
    return w, c, s


def keep_largest(magnitudes, mask, k, method: str | None = None, tiebreak=None, tiebreak_all=None):
    """Mask of the k largest magnitudes among `mask`, or `mask` if it has <= k.

    Kept: the first k masked entries in the order (-magnitude, tiebreak, position). Ties at the
    threshold are common (equal-angle circuits give equal magnitudes); `tiebreak` decides them:
    non-negative integer keys below 2**TIE_BITS (2**32 without x64), smallest first, as an array or
    a function of an index array (then only the entries that can matter are evaluated; `tiebreak_all`,
    a function of no arguments, may give every entry's key where that costs less memory than the
    function of all indices, which gathers every entry's data first). The
    propagation passes `merge.tie_keys` (the Pauli weight, then the word's fingerprint), so which of
    equally large terms stay depends on the words alone, not on the slots they sit in: a batch, a
    larger capacity or another room keeps the same terms. Position decides only among equal keys.
    Selection works on the float's bit pattern (monotone for values >= 0), one unsigned array of it
    for every method: a signed copy beside it, or a masked one, took 8 bytes an entry more wherever
    XLA kept both (a rotation's cut runs over the capacity and its room together):
    "bucket" (CPUs): 16-bit histograms of the bits, most significant first, narrow the threshold down
    to a bucket of at most BUCKET_ROOM entries, which are gathered and sorted (`_bucket_cut`); more
    exactly equal magnitudes than that at the threshold are the threshold itself, and its ties are
    cut by one sort of (tiebreak, position) packed in a key (`_first_by_key`). "sort": one sort of
    every entry by (-magnitude, tiebreak, position). "bisect" (GPUs): one fused count per bit
    (histograms would serialise on atomics), then, only if the threshold has more ties than room,
    the sort of `_first_by_key`.
    The CPU methods are built from few, small kernels: each copy of the selection in a program costs
    its compilation (XLA:CPU compiles every fusion, about 20 ms each on one core).
    """
    method = method or ("bucket" if devices.backend() == "cpu" else "bisect")
    if method not in ("bucket", "sort", "bisect"):
        raise ValueError(f"unknown keep_largest method {method!r}")
    bits = lax.bitcast_convert_type(magnitudes, jnp.uint64 if magnitudes.dtype == jnp.float64 else jnp.uint32)
    utype = tie_type()
    if tiebreak is None:
        tb_at = lambda i: jnp.zeros(i.shape, utype)
    elif callable(tiebreak):
        tb_at = lambda i: tiebreak(i).astype(utype)
    else:
        tb_at = lambda i: jnp.asarray(tiebreak)[i].astype(utype)
    if tiebreak_all is not None:
        everywhere = lambda: tiebreak_all().astype(utype)
    elif tiebreak is not None and not callable(tiebreak):
        everywhere = lambda: jnp.asarray(tiebreak).astype(utype)
    else:
        everywhere = lambda: tb_at(jnp.arange(bits.shape[0], dtype=jnp.int32))

    def cut_at(t, some_tie_may_stay):
        """Everything above the threshold t, and the first of its ties by (tiebreak, position)."""
        above, ties = mask & (bits > t), mask & (bits == t)
        need = k - count(above)
        first = lambda: _first_by_key(ties, need, everywhere())
        if some_tie_may_stay:  # sort only when some tied entry goes
            return above | lax.cond(shared(count(ties) > need), first, lambda: ties)
        return above | first()

    if method == "bisect":
        return cut_at(_bisect_select(bits, mask, k), True)
    covered = count(mask) <= k
    if method == "sort":
        return jnp.where(covered, mask, _sorted_cut(bits, mask, k, everywhere()))
    # the bucket's last branch: more ties at the threshold than its room, so some go
    return _bucket_cut(bits, mask, k, covered, tb_at, lambda t: cut_at(t, False))


TIE_BITS = 48  # tiebreak keys are below 2**TIE_BITS under x64 (merge.tie_keys), below 2**32 without
DIGIT_BITS = 16  # bits a level of the bucket search resolves
BUCKET_ROOM = 4096  # entries of the threshold's bucket that "bucket" gathers and sorts


def tie_type():
    return jnp.uint64 if jax.config.jax_enable_x64 else jnp.uint32


def _first_by_key(sel, need, tb):
    """Mask of the first `need` entries of `sel` in the order (tb, position). Under x64 one sort of a
    single uint64 key, the tiebreak above the position (4 ms at 1.3e5 entries on one core of the
    2-core CPU, against 50 ms for a stable sort with a second key and a payload); past 2**16 entries
    the tiebreak's lowest bits make room for the position's. Without x64 a stable sort of two keys
    (outside `sel`, tb) and the position."""
    n = sel.shape[0]
    pos_bits = max(1, (n - 1).bit_length())
    if tb.dtype == jnp.uint64:
        drop = max(0, TIE_BITS + pos_bits - 64)
        key = jnp.where(sel, ((tb >> drop) << pos_bits) | jnp.arange(n, dtype=jnp.uint64), jnp.uint64(2**64 - 1))
        last = lax.sort(key)[jnp.clip(need - 1, 0, n - 1)]
        return sel & (key <= last) & (need > 0)
    at = lax.sort(((~sel).astype(jnp.uint32), tb, jnp.arange(n, dtype=jnp.int32)), num_keys=2, is_stable=True)[2]
    return jnp.zeros(n, bool).at[at].set(jnp.arange(n) < need) & sel


def _sorted_cut(bits, mask, k, tb):
    """keep_largest by one stable sort of every entry by (outside the mask, -magnitude, tiebreak)."""
    n = bits.shape[0]
    keys = ((~mask).astype(jnp.uint32), ~bits, tb, jnp.arange(n, dtype=jnp.int32))
    at = lax.sort(keys, num_keys=3, is_stable=True)[3]
    return jnp.zeros(n, bool).at[at].set(jnp.arange(n) < k) & mask


def _bucket_cut(bits, mask, k, covered, tb_at, ties_at):
    """keep_largest: a loop of 16-bit histograms over the entries that share the digits found so far
    finds the bucket (a prefix of the bits) that holds the k-th largest and at most BUCKET_ROOM
    entries (kicked-Ising cuts: one level, a few two); the entries above it are kept, its own are
    gathered and cut by two one-key sorts (a sort with several keys or a payload costs 6x more on
    XLA:CPU): by (-magnitude, position), which finds the threshold, then the entries tied at it by
    (tiebreak, position). A bucket still larger after every digit holds only the threshold's ties:
    `ties_at(threshold)` cuts them. The program holds one histogram and three sorts."""
    n = bits.shape[0]
    room = min(BUCKET_ROOM, n)
    unsigned = bits.dtype.type
    total = 8 * bits.dtype.itemsize
    size = 1 << DIGIT_BITS
    # the leading `b` bits of every entry (0 bits: 0; a shift by the type's width is undefined)
    leading = lambda b: jnp.where(b > 0, bits >> (total - jnp.maximum(b, 1)).astype(unsigned), 0)

    def level(state):
        depth, prefix, above, _ = state
        inside = mask & (leading(DIGIT_BITS * depth) == prefix)
        digit = (leading(DIGIT_BITS * (depth + 1)) & (size - 1)).astype(jnp.int32)
        hist = histogram(jnp.where(inside, digit, size), size)
        d, higher = _kth_largest_bin(hist, k - above)
        return depth + 1, (prefix << DIGIT_BITS) | d.astype(unsigned), above + higher.astype(jnp.int32), hist[d]

    # at least one level (then the bucket's entries share 16 bits, and its rest fits a sort key)
    narrow = lambda state: (state[3] > room) & (state[0] < total // DIGIT_BITS)
    depth, prefix, above, inside = lax.while_loop(lambda s: shared(narrow(s)), level,
                                                  (jnp.int32(0), jnp.zeros((), unsigned), jnp.int32(0),
                                                   jnp.int32(room + 1)))
    top = leading(DIGIT_BITS * depth)
    higher = mask & (top > prefix)

    def gathered_bucket(_):
        src = first_set(mask & (top == prefix), room)  # the bucket's entries in position order
        ok = src < n
        s = jnp.minimum(src, n - 1)
        ib = max(1, (room - 1).bit_length())  # bits of an index into the gathered entries
        at = jnp.arange(room, dtype=unsigned)
        rest = (unsigned(1) << (total - DIGIT_BITS * depth).astype(unsigned)) - 1  # the bits below the prefix
        low = bits[s] & rest
        order = lax.sort(jnp.where(ok, ((rest - low) << ib) | at, unsigned(jnp.iinfo(unsigned).max)))
        order = order & unsigned((1 << ib) - 1)
        need = k - above
        t = low[order[jnp.clip(need - 1, 0, room - 1)]]  # the k-th largest's bits
        kept = ok & (low > t)
        tied = ok & (low == t)
        # the tied entries by (tiebreak, position): the first `need - kept` of them stay (the tiebreak
        # is evaluated only when some tied entry goes)
        room_left = need - count(kept)
        chosen = lax.cond(shared(count(tied) > room_left), lambda: _first_by_key(tied, room_left, tb_at(s)),
                          lambda: tied)
        return higher.at[jnp.where(kept | chosen, src, n)].set(True, mode="drop")

    pick = jnp.where(covered, 0, jnp.where(inside <= room, 1, 2))
    # in a batch (batching.shared) a covered member may run another member's branch: it keeps its mask
    branches = [lambda _: mask, gathered_bucket, lambda _: ties_at(prefix)]
    return jnp.where(covered, mask, lax.switch(shared(pick), branches, None))


def _kth_largest_bin(hist, k):
    """(d, above): the bin holding the k-th largest entry (counting from the top bin down) and the
    number of entries in bins above it. Two levels of sqrt(size) bins, so that no prefix sum runs
    over the whole histogram (a 65536-bin cumsum takes 0.5 ms on one core of the 2-core CPU)."""
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


def histogram(bins, size: int):
    """int32 counts of bins in [0, size); entries equal to size (or beyond) are not counted.
    (jnp.bincount counts in int64 under x64, and its prefix sums then cost twice as much.)"""
    return jnp.zeros(size, jnp.int32).at[bins].add(1, mode="drop")


def _bisect_select(bits, mask, k):
    """The k-th largest of bits[mask] (unsigned, top bit clear) by bisection:
    count(bits[mask] >= lo) >= k > count(bits[mask] >= hi); the mask is applied inside each count."""
    def body(_, lohi):
        lo, hi = lohi
        mid = lo + (hi - lo) // 2
        ok = count(mask & (bits >= mid)) >= k
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    hi0 = jnp.max(jnp.where(mask, bits, 0)) + 1
    t, _ = lax.fori_loop(0, 8 * bits.dtype.itemsize, body, (jnp.zeros((), bits.dtype), hi0))
    return t
