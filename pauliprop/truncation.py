"""Truncation rules: which terms the estimator drops, and the keep-largest selection.

All rules are combinable; None switches a rule off. Dropped 1-norm is accounted per rule in
`PropagationStats`, so the cost of an approximation is always visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

# order of the dropped-norm entries in PropagationStats.dropped_norm
RULES = ("max_weight", "min_abs_coeff", "max_sins", "max_terms", "overflow")


@dataclass(frozen=True)
class Truncation:
    """Which terms to drop after each gate.

    max_weight:    drop words with more than this many non-identity sites.
    min_abs_coeff: drop terms with |coefficient| below this.
    max_terms:     keep only the max_terms largest |coefficient| after each splitting gate.
    max_sins:      drop paths that took more than this many sine branches (Clifford
                   quarter turns do not count).
    """

    max_weight: int | None = None
    min_abs_coeff: float | None = None
    max_terms: int | None = None
    max_sins: int | None = None

    def __post_init__(self):
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


NO_TRUNCATION = Truncation()


def violations(trunc: Truncation, coeffs, weights, sins):
    """Masks (weight, coeff, sins) of the terms each rule drops (a term is charged to its first rule)."""
    false = jnp.zeros(coeffs.shape, bool)
    w = weights > trunc.max_weight if trunc.max_weight is not None else false
    c = (jnp.abs(coeffs) < trunc.min_abs_coeff) & ~w if trunc.min_abs_coeff is not None else false
    s = (sins > trunc.max_sins) & ~w & ~c if trunc.max_sins is not None else false
    return w, c, s


def keep_largest(magnitudes, mask, k):
    """Mask of the k largest magnitudes among `mask` (ties broken by position), or `mask` if it has <= k.

    Finds the k-th largest value by bisection on the float's bit pattern (monotone for values >= 0):
    a fixed number of reductions, no sort, the same on CPU and GPU.
    """
    itype = jnp.int64 if magnitudes.dtype == jnp.float64 else jnp.int32
    bits = lax.bitcast_convert_type(magnitudes, itype)
    bits = jnp.where(mask, bits, -1)
    nbits = 64 if itype == jnp.int64 else 32

    def count_at_least(t):
        return jnp.sum(bits >= t)

    def body(_, lohi):
        lo, hi = lohi
        mid = lo + (hi - lo) // 2
        ok = count_at_least(mid) >= k
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo0 = jnp.zeros((), itype)
    hi0 = jnp.max(bits).astype(itype) + 1
    t, _ = lax.fori_loop(0, nbits, body, (lo0, hi0))
    above = bits > t
    ties = bits == t
    room = k - jnp.sum(above)
    tie_rank = jnp.cumsum(ties.astype(jnp.int32)) - 1
    return above | (ties & (tie_rank < room))
