"""Truncation rules (pauliprop/propagation/truncation.py) as the engine applies them (merge.py, propagate.py).

The main property compares the engine with a dict-based reference propagator written from the
documented semantics (tests/pauliprop/_reference.py): rules applied after every operation, a term
charged to its first violated rule, max_terms keeping the largest |coeff| after merging. On random
circuits of 1-3 qubits the final sums, the values and the dropped 1-norm per rule must agree.

Two facts hold for every truncation and are checked everywhere:
* |exact - truncated| <= total dropped 1-norm. Dropping D after operation t changes the final value by
  tr(rho_t D) (the rest of the propagation is linear and exact on D), and |tr(rho P)| <= 1.
* The output obeys the rules: weights <= max_weight, |coeff| >= min_abs_coeff, at most max_terms terms.
"""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.propagation import truncation as T

from .. import _reference as R
from .._strategies import (ALL_KINDS, SMALL_CAPACITY, SMALL_OPS, SMALL_TERMS, UNITARY_KINDS, anchored_ops, bloch_vectors,
                          build, observable_terms, params_vector, paulisum, states)


# ---- the Truncation record ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, cause", [
    (dict(max_weight=-1), "max_weight"), (dict(max_weight=2.5), "max_weight"), (dict(max_weight=True), "max_weight"),
    (dict(max_terms=0), "max_terms must be a positive"), (dict(max_sins=-2), "max_sins"),
    (dict(min_abs_coeff=-1e-3), "min_abs_coeff"), (dict(min_abs_coeff=float("nan")), "min_abs_coeff"),
    (dict(min_abs_coeff=float("inf")), "min_abs_coeff"), (dict(min_abs_coeff="1e-3"), "min_abs_coeff"),
])
def test_invalid_rules_raise_naming_the_field(kwargs, cause):
    with pytest.raises(ValueError, match=cause):
        pp.Truncation(**kwargs)


def test_is_exact_only_without_rules():
    assert pp.Truncation().is_exact
    for kw in (dict(max_weight=0), dict(min_abs_coeff=0.0), dict(max_terms=1), dict(max_sins=0)):
        assert not pp.Truncation(**kw).is_exact


def test_violations_charge_each_term_to_its_first_rule():
    trunc = pp.Truncation(max_weight=2, min_abs_coeff=0.1, max_sins=1)
    coeffs = jnp.array([0.5, 0.01, 0.01, 0.5, 0.01, 0.5])
    weights = jnp.array([3, 3, 1, 1, 1, 1])
    sins = jnp.array([5, 5, 5, 5, 0, 1])
    w, c, s = (np.asarray(m) for m in T.violations(trunc, coeffs, weights, sins))
    np.testing.assert_array_equal(w, [1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(c, [0, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(s, [0, 0, 0, 1, 0, 0])
    assert not np.any(w & c) and not np.any(w & s) and not np.any(c & s)
    # the host's merge (numpy coefficients) charges the same terms, with numpy masks
    host = T.violations(trunc.limits(np.float64), np.asarray(coeffs), np.asarray(weights), np.asarray(sins))
    assert all(isinstance(m, np.ndarray) for m in host)
    for a, b in zip(host, (w, c, s)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs", [{}, dict(max_weight=3), dict(max_weight=3, per="layer"), dict(max_terms=10),
                                    dict(max_terms=10, per="layer"), dict(min_abs_coeff=1e-3, max_sins=2)])
def test_rules_and_limits_say_the_same_as_the_truncation(kwargs):
    """Truncation.rules (the programs' static part) and .limits (their data) carry every rule: on where it
    is given, its value where on; the weight rule acts gate by gate, and the cut is global, only per gate."""
    trunc = pp.Truncation(**kwargs)
    rules, limits = trunc.rules, trunc.limits(np.float32)
    fields = ("max_weight", "min_abs_coeff", "max_terms", "max_sins")
    for f in fields:
        assert getattr(rules, f) == (f in kwargs) == (getattr(limits, f) is not None)
        if f in kwargs:
            assert getattr(limits, f).item() == pytest.approx(kwargs[f], rel=1e-6)
    assert rules.per == trunc.per
    assert rules.weight_each_gate == ("max_weight" in kwargs and trunc.per == "gate")
    assert rules.cut_each_gate == ("max_terms" in kwargs and trunc.per == "gate")
    assert limits.min_abs_coeff is None or limits.min_abs_coeff.dtype == np.float32
    assert trunc.limits(np.float32) is limits  # made once a process
    for a in (a for a in limits if a is not None):  # shared by every call: read-only
        with pytest.raises(ValueError):
            a[...] = 0
    filled = limits.filled()
    for f in fields:
        assert getattr(filled, f) == (getattr(limits, f).item() if f in kwargs else T.DROPS_NOTHING[f])


# ---- keep_largest ----------------------------------------------------------------------------------

METHODS = ["bucket", "sort", "bisect"]  # the CPU selection, its fallback, the GPU selection; all run anywhere
_keep_largest = jax.jit(T.keep_largest, static_argnames=("method",))
_keep_largest_tb = jax.jit(lambda m, mask, k, tb, method: T.keep_largest(m, mask, k, method=method, tiebreak=tb),
                           static_argnames=("method",))


@pytest.mark.parametrize("method", METHODS)
def test_keep_largest_ties_are_broken_by_position(method):
    mags = jnp.array([1.0, 2.0, 2.0, 2.0, 0.5, 3.0])
    mask = jnp.ones(6, bool)
    np.testing.assert_array_equal(_keep_largest(mags, mask, 3, method=method), [0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(_keep_largest(mags, mask, 1, method=method), [0, 0, 0, 0, 0, 1])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("top", [0, 2**48 - 8])
def test_keep_largest_ties_are_broken_by_the_tiebreak_before_position(method, top):
    """Tied magnitudes go by the tiebreak, smallest first, whatever its bits (low or high) and the
    position; the largest magnitude stays whatever its tiebreak."""
    mags = jnp.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0])
    tb = jnp.asarray(np.array([5, 4, 3, 2, 1, 0, 7]) + top)
    for k, want in ((1, [0, 0, 0, 0, 0, 0, 1]), (3, [0, 0, 0, 0, 1, 1, 1]), (5, [0, 0, 1, 1, 1, 1, 1])):
        np.testing.assert_array_equal(_keep_largest_tb(mags, jnp.ones(7, bool), k, tb, method), want)


@pytest.mark.parametrize("method", METHODS)
def test_keep_largest_returns_the_mask_when_k_covers_it(method):
    mags = jnp.array([1.0, 0.0, 2.0, 2.0, 0.5, 3.0])
    mask = jnp.array([1, 1, 0, 1, 1, 0], bool)
    for k in (4, 5, 6, 100):
        np.testing.assert_array_equal(_keep_largest(mags, mask, k, method=method), mask)


@pytest.mark.parametrize("method", METHODS)
def test_keep_largest_ignores_masked_out_values(method):
    mags = jnp.array([9.0, 1.0, 8.0, 2.0, 3.0, 7.0])
    mask = jnp.array([0, 1, 0, 1, 1, 0], bool)
    np.testing.assert_array_equal(_keep_largest(mags, mask, 2, method=method), [0, 0, 0, 1, 1, 0])


@settings(max_examples=40)
@given(st.lists(st.sampled_from([0.0, 1e-30, 0.1, 0.5, 0.5000000000000001, 1.0, 2.0, 1e30]) | st.floats(0, 10),
                min_size=32, max_size=32),
       st.lists(st.booleans(), min_size=32, max_size=32), st.integers(1, 40), st.sampled_from([np.float64, np.float32]),
       st.sampled_from(METHODS), st.none() | st.lists(st.integers(0, 6), min_size=32, max_size=32)
       | st.lists(st.sampled_from([0, 1, 2**47, 2**48 - 2, 2**48 - 1]) | st.integers(0, 2**48 - 1), min_size=32,
                  max_size=32))
def test_keep_largest_keeps_the_k_largest(mags, mask, k, dtype, method, tiebreak):
    """The kept set is the first min(k, count) masked entries ordered by (-magnitude, tiebreak, position),
    tiebreaks over their whole width (TIE_BITS)."""
    mags = np.asarray(mags).astype(dtype)
    mask = np.asarray(mask)
    if tiebreak is None:
        got = np.asarray(_keep_largest(jnp.asarray(mags), jnp.asarray(mask), k, method=method))
    else:
        got = np.asarray(_keep_largest_tb(jnp.asarray(mags), jnp.asarray(mask), k, jnp.asarray(tiebreak), method))
    tb = np.zeros(32, int) if tiebreak is None else np.asarray(tiebreak)
    order = sorted(np.flatnonzero(mask), key=lambda i: (-mags[i], tb[i], i))
    want = np.zeros(32, bool)
    want[order[:k]] = True
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("method", METHODS)
def test_keep_largest_with_a_threshold_bucket_larger_than_its_room(method):
    """Thousands of equal magnitudes at the threshold (the bucket method falls back to the full sort)."""
    rng = np.random.default_rng(3)
    n = 3 * T.BUCKET_ROOM
    mags = np.where(rng.random(n) < 0.8, 0.25, rng.random(n))
    mask = rng.random(n) < 0.9
    tb = rng.integers(0, 5, n) << rng.choice([0, 44], n)  # small keys and keys across TIE_BITS
    k = int(np.sum(mask & (mags > 0.25))) + T.BUCKET_ROOM + 7  # the cut falls inside the tied block
    got = np.asarray(_keep_largest_tb(jnp.asarray(mags), jnp.asarray(mask), k, jnp.asarray(tb), method))
    order = sorted(np.flatnonzero(mask), key=lambda i: (-mags[i], tb[i], i))
    want = np.zeros(n, bool)
    want[order[:k]] = True
    np.testing.assert_array_equal(got, want)
    # the tiebreak given as a function of indices (evaluated only where needed) selects the same
    as_function = jax.jit(lambda m, mk, t: T.keep_largest(m, mk, k, method=method, tiebreak=lambda i: t[i]))
    np.testing.assert_array_equal(np.asarray(as_function(jnp.asarray(mags), jnp.asarray(mask), jnp.asarray(tb))), want)
    # and every entry's keys from tiebreak_all, which this cut consults (other keys there change the result)
    with_all = jax.jit(lambda m, mk, t, every: T.keep_largest(m, mk, k, method=method, tiebreak=lambda i: t[i],
                                                               tiebreak_all=lambda: every))
    args = jnp.asarray(mags), jnp.asarray(mask), jnp.asarray(tb)
    np.testing.assert_array_equal(np.asarray(with_all(*args, jnp.asarray(tb))), want)
    assert not np.array_equal(np.asarray(with_all(*args, jnp.asarray(tb[::-1]))), want)


@pytest.mark.parametrize("method", ["bucket", "bisect"])
def test_keep_largest_ties_of_a_large_buffer_order_by_the_keys_top_bits(method):
    """Past 2**16 entries the tie sort's single key keeps the tiebreak's top 64 - log2(n) bits above the
    position: 2**17 equal magnitudes drop the tiebreak's lowest bit, so keys that differ only there
    go by position, and all others by key."""
    rng = np.random.default_rng(11)
    n = 1 << 17
    drop = T.TIE_BITS + 17 - 64
    mags = np.full(n, 0.5)
    mask = rng.random(n) < 0.9
    tb = rng.integers(0, 2**T.TIE_BITS, n, dtype=np.int64)
    k = int(mask.sum()) // 3
    got = np.asarray(_keep_largest_tb(jnp.asarray(mags), jnp.asarray(mask), k, jnp.asarray(tb), method))
    np.testing.assert_array_equal(got, _want(mags, mask, k, tb >> drop))


_WITHOUT_X64 = """
import numpy as np, jax, jax.numpy as jnp
assert not jax.config.jax_enable_x64
from pauliprop.propagation import truncation as T
rng = np.random.default_rng(0)
n = 3 * T.BUCKET_ROOM + 5
mags = np.where(rng.random(n) < 0.7, np.float32(0.25), rng.random(n).astype(np.float32))
mask = rng.random(n) < 0.9
tb = (rng.integers(0, 2**32, n, dtype=np.int64) >> rng.choice([0, 28], n)).astype(np.uint32)
for method in ("bucket", "sort", "bisect"):
    for k in (5, int(np.sum(mask & (mags > 0.25))) + T.BUCKET_ROOM + 7, n - 3):
        order = sorted(np.flatnonzero(mask), key=lambda i: (-mags[i], int(tb[i]), i))
        want = np.zeros(n, bool)
        want[order[:k]] = True
        got = T.keep_largest(jnp.asarray(mags), jnp.asarray(mask), k, method=method, tiebreak=jnp.asarray(tb))
        assert np.array_equal(np.asarray(got), want), (method, k)
print("ok")
"""


def test_keep_largest_without_x64_breaks_ties_by_32_bit_keys():
    """Without jax_enable_x64 tiebreak keys are uint32 and the tie sorts take several keys: the same
    definition, (-magnitude, tiebreak, position), for every method (thousands of ties at the threshold)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", _WITHOUT_X64], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _want(mags, mask, k, tb):
    order = sorted(np.flatnonzero(mask), key=lambda i: (-mags[i], tb[i], i))
    want = np.zeros(len(mags), bool)
    want[order[:k]] = True
    return want


def _keep_in_a_room_of_four(mags, mask, k, tb):
    with mock.patch.object(T, "BUCKET_ROOM", 4):  # read while tracing: this program gathers 4 entries at most
        return T.keep_largest(mags, mask, k, method="bucket", tiebreak=tb)


_keep_small_room = jax.jit(_keep_in_a_room_of_four)


@settings(max_examples=60)
@given(st.lists(st.sampled_from([0.0, 1e-30, 0.5, 0.5000000000000001, 0.5000000000000002, 1.0, 1.0000000000000002])
                | st.floats(0, 4) | st.builds(lambda m, e: m * 2.0 ** e, st.floats(1, 2), st.integers(-60, 60)),
                min_size=48, max_size=48),
       st.lists(st.booleans(), min_size=48, max_size=48), st.integers(1, 50), st.sampled_from([np.float64, np.float32]),
       st.lists(st.integers(0, 3), min_size=48, max_size=48)
       | st.lists(st.sampled_from([0, 5, 2**40, 2**48 - 1]), min_size=48, max_size=48))
def test_keep_largest_bucket_search_in_a_small_room(mags, mask, k, dtype, tiebreak):
    """With a room of 4 entries the bucket method narrows through several levels of digits, gathers a
    bucket, or (more than 4 equal magnitudes at the threshold) sorts everything: all keep the same
    set as the definition, (-magnitude, tiebreak, position)."""
    mags, mask, tb = np.asarray(mags).astype(dtype), np.asarray(mask), np.asarray(tiebreak)
    got = np.asarray(_keep_small_room(jnp.asarray(mags), jnp.asarray(mask), k, jnp.asarray(tb)))
    np.testing.assert_array_equal(got, _want(mags, mask, k, tb))


@pytest.mark.parametrize("method", METHODS)
def test_keep_largest_of_many_distinct_magnitudes(method):
    """Tens of thousands of distinct magnitudes over many binades (a saturated propagation's buffer):
    the bucket method narrows to a bucket it gathers."""
    rng = np.random.default_rng(5)
    n = 12 * T.BUCKET_ROOM
    mags = 10.0 ** rng.uniform(-6, 0, n)
    mask = rng.random(n) < 0.95
    tb = rng.integers(0, 9, n)
    for k in (1, 777, n // 2, int(mask.sum()) - 1):
        got = np.asarray(_keep_largest_tb(jnp.asarray(mags), jnp.asarray(mask), k, jnp.asarray(tb), method))
        np.testing.assert_array_equal(got, _want(mags, mask, k, tb))


# ---- the engine against the reference propagator ------------------------------------------------------

# One compile per rule set (a Truncation is static): the two structural rules together, the coefficient
# threshold alone, max_terms alone (ties at the cut need many examples), and everything at once with noise.
RULE_SETS = [dict(max_weight=2, max_sins=1), dict(min_abs_coeff=0.08)]
COMBINED = dict(max_weight=2, min_abs_coeff=0.02, max_terms=6, max_sins=2)


@st.composite
def small_case(draw, noise):
    n = draw(st.integers(1, 3))
    kinds = ALL_KINDS if noise else UNITARY_KINDS
    ops = draw(anchored_ops(n, SMALL_OPS, kinds, noise=noise))
    terms = draw(observable_terms(n, SMALL_TERMS, distinct=True))
    state = draw(st.one_of(states(n), bloch_vectors(n, mixed=noise)))
    return n, ops, terms, draw(params_vector()), state


def _check_against_reference(rules: dict, case):
    n, ops, terms, params, state = case
    c = build(n, ops)
    out, stats = pp.propagate(c, paulisum(terms.items(), n), params, truncation=pp.Truncation(**rules),
                              capacity=SMALL_CAPACITY)
    val = float(pp.overlap(out, state))
    dropped = np.asarray(stats.dropped_norm)
    exact = R.dense_expectation(c, terms, params, state)

    # facts that hold for any truncation
    assert not bool(stats.overflow) and dropped[4] == 0
    assert np.all(dropped >= 0)
    assert abs(val - exact) <= dropped.sum() + 1e-10
    got = {lab: v for lab, v in out.to_dict().items() if abs(v) > 1e-12}
    if "max_weight" in rules:
        assert all(R.weight(lab) <= rules["max_weight"] for lab in got)
    if "min_abs_coeff" in rules:
        assert all(abs(v) >= rules["min_abs_coeff"] for v in out.to_dict().values())
    if "max_terms" in rules:
        assert len(out.to_dict()) <= rules["max_terms"]
    if rules.get("max_weight", -1) >= n:
        assert dropped[0] == 0  # nothing can be heavier than n
        if rules.keys() == {"max_weight"}:
            assert abs(val - exact) < 1e-10

    try:
        ref, _, ref_dropped = R.reference_propagate(c, terms, params, **rules)
    except R.Ambiguous as e:  # a decision within rounding of a threshold: either outcome is right
        event(f"ambiguous: {e}")
        return
    ref = {lab: v for lab, v in ref.items() if abs(v) > 1e-12}
    assert got.keys() == ref.keys()
    for lab in ref:
        assert abs(got[lab] - ref[lab]) < 1e-10, lab
    np.testing.assert_allclose(dropped, ref_dropped, atol=1e-10)
    assert abs(val - R.overlap_dense(ref, state, n)) < 1e-10
    if not ref_dropped.any():
        assert abs(val - exact) < 1e-10
    event("something dropped" if ref_dropped.any() else "nothing dropped")


@pytest.mark.parametrize("rules", RULE_SETS, ids=lambda r: ",".join(r))
@settings(max_examples=25)
@given(case=small_case(noise=False))
def test_rules_match_the_reference(rules, case):
    _check_against_reference(rules, case)


@settings(max_examples=60)
@given(case=small_case(noise=False))
def test_max_terms_matches_the_reference(case):
    """Many examples: a tie at the cut (T gates split into equal halves) leaves only the invariants to check."""
    _check_against_reference(dict(max_terms=5), case)


@settings(max_examples=30)
@given(case=small_case(noise=True))
def test_combined_rules_with_noise_match_the_reference(case):
    _check_against_reference(COMBINED, case)


@settings(max_examples=15)
@given(case=small_case(noise=True))
def test_no_rules_with_noise_match_the_reference(case):
    _check_against_reference({}, case)
