"""Backward Pauli propagation (pauliprop/propagation/propagate.py): exactness, embedding, gradients, transforms, errors.

The untruncated estimator is exact: for random circuits over the whole gate table it must agree with
the state vector (and, with noise, with a density-matrix reference) to 1e-10, the propagated sum must
be the Heisenberg operator U^dag H U, the answer must not depend on where the qubits sit in the packed
lanes, and its gradient must be the exact gradient. At 5,000 and 10,000 qubits, circuits whose answer is
known (Clifford, product rotations, light-cone-limited brickworks) give it, truncated runs included.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pauliprop as pp
from pauliprop.propagation import program as P
from pauliprop.propagation import schedule as S
from pauliprop.runtime import compilation

from .. import _reference as R
from .._strategies import (ALL_KINDS, CAPACITY, NUM_PARAMS, SMALL_CAPACITY, SMALL_OPS, SMALL_TERMS, UNITARY_KINDS,
                          UNITARY_OPS, UNITARY_TERMS, anchored_ops, bloch_vectors, build, observable_terms,
                          params_vector, paulisum, states)

LANE_SITES = [0, 31, 32, 63, 64, 95, 96, 126]  # both sides of every 32-bit lane boundary of a 127-qubit word


@st.composite
def unitary_case(draw, max_n=8):
    n = draw(st.integers(1, max_n))
    ops = draw(anchored_ops(n, UNITARY_OPS, UNITARY_KINDS))
    terms = draw(observable_terms(n, UNITARY_TERMS))
    return n, ops, terms, draw(params_vector()), draw(states(n))


def _exact(n, ops, terms, params, state):
    return pp.expectation(build(n, ops), paulisum(terms, n), params, state=state, method="statevector")


def _pauli(c, h, params, state="0", **kw):
    val, stats = pp.expectation(c, h, params, state=state, capacity=kw.pop("capacity", CAPACITY), return_stats=True,
                                **kw)
    assume(not bool(stats.overflow))  # a fixed capacity keeps one compile; overflow is tested on its own
    return float(val), stats


def fixed_unitary_circuit(n: int) -> pp.Circuit:
    """A deterministic circuit with the shared unitary shape (same compile as the random ones)."""
    c = pp.Circuit(n)
    for k in range(UNITARY_OPS):
        q, r = k % n, (k + 1) % n
        if k % 4 == 0:
            c.ry(q, pp.Param(k % NUM_PARAMS))
        elif k % 4 == 1:
            c.cx(q, r) if n > 1 else c.h(q)
        elif k % 4 == 2:
            c.rzz(q, r, 0.3 + 0.1 * k) if n > 1 else c.rz(q, 0.3 + 0.1 * k)
        else:
            c.t(q)
    c.h(0).rz(0, pp.Param(0)).rx(n - 1, math.pi / 2)
    assert P.lower(c).length == UNITARY_OPS + 3
    return c


def fixed_terms(n):
    labels = ["Z" * n, "X" + "I" * (n - 1), "I" * (n - 1) + "Y", "Z" + "X" * (n - 1)]
    return list(zip(labels, [0.7, -0.4, 0.25, 1.1]))


def fixed_observable(n):
    return paulisum(fixed_terms(n), n)


PARAMS = np.array([0.3, -1.2, 0.8, 2.0, -0.4, 1.5])


# ---- exactness -----------------------------------------------------------------------------------

@settings(max_examples=10)  # each example compiles new eager state-vector kernels (the embedding test below checks 30 more against numpy)
@given(unitary_case())
def test_untruncated_expectation_equals_statevector(case):
    n, ops, terms, params, state = case
    val, stats = _pauli(build(n, ops), paulisum(terms, n), params, state)
    assert abs(val - float(_exact(*case))) < 1e-10
    assert not np.any(np.asarray(stats.dropped_norm))


@settings(max_examples=10)
@given(unitary_case())
def test_per_layer_truncation_without_cuts_equals_statevector(case):
    """Rules applied per layer (after each step) that cut nothing: the exact value."""
    n, ops, terms, params, state = case
    trunc = pp.Truncation(min_abs_coeff=1e-300, max_weight=n, per="layer")
    val, stats = _pauli(build(n, ops), paulisum(terms, n), params, state, truncation=trunc)
    assert abs(val - float(_exact(*case))) < 1e-10


def test_per_layer_rules_wait_for_the_end_of_the_layer():
    """Two commuting rotations on disjoint qubits (one layer), max_weight 3, observable X0 Z1 X2.
    Backward, ZX on (2, 3) first makes X0 Z1 Y2 X3 (weight 4), which ZZ on (0, 1) brings back to
    Y0 Y2 X3 (weight 3). Per gate the weight-4 word is cut in the middle of the layer and the
    value on |r0r+> is 0; per layer only the end counts, and the value is exact (sin a sin b)."""
    a, b = 0.7, 0.4
    c = pp.Circuit(4).pauli_rotation("ZZ", [0, 1], b).pauli_rotation("ZX", [2, 3], a)
    h = pp.PauliSum.from_labels({"XZXI": 1.0})
    exact = float(pp.expectation(c, h, state="r0r+", method="statevector"))
    assert abs(abs(exact) - math.sin(a) * math.sin(b)) < 1e-12
    per_gate = pp.expectation(c, h, state="r0r+", truncation=pp.Truncation(max_weight=3))
    per_layer = pp.expectation(c, h, state="r0r+", truncation=pp.Truncation(max_weight=3, per="layer"))
    assert abs(float(per_gate)) < 1e-12 and abs(float(per_layer) - exact) < 1e-12


def _small_value(n, ops, terms, params, state):
    """<psi|H|psi> of the small circuit from the numpy state vector (tests/pauliprop/_reference.py)."""
    psi = R.dense_unitary(build(n, ops), params) @ R.initial_ket(state, n)
    return float(np.real(psi.conj() @ R.operator(_merge(terms), n) @ psi))


@settings(max_examples=30)
@given(unitary_case(), st.permutations(LANE_SITES))
def test_embedding_across_lane_boundaries_gives_the_same_value(case, sites):
    """The small circuit, and the same circuit placed on a 127-qubit register at sites on both sides of
    lane boundaries, both equal the small circuit's (numpy) state-vector value."""
    n, ops, terms, params, state = case
    exact = _small_value(*case)
    val, _ = _pauli(build(n, ops), paulisum(terms, n), params, state)
    assert abs(val - exact) < 1e-10
    big = 127
    site = sites[:n]
    h = pp.PauliSum.from_list([(lab, [site[q] for q in range(n)], c) for lab, c in terms], big)
    big_state = state
    if len(state) > 1:  # place the per-qubit state characters at the sites; idle qubits in |0>
        chars = ["0"] * big
        for q, ch in enumerate(state):
            chars[site[q]] = ch
        big_state = "".join(chars)
    val, _ = _pauli(build(big, ops, site=site), h, params, big_state)
    assert abs(val - exact) < 1e-10


@given(unitary_case(max_n=4))
def test_propagated_sum_is_the_heisenberg_operator(case):
    n, ops, terms, params, _ = case
    c = build(n, ops)
    out, stats = pp.propagate(c, paulisum(terms, n), params, capacity=CAPACITY)
    assert not bool(stats.overflow)
    u = R.dense_unitary(c, params)
    expected = u.conj().T @ R.operator(_merge(terms), n) @ u
    np.testing.assert_allclose(out.to_matrix(), expected, atol=1e-10)


def _merge(terms):
    d = {}
    for lab, c in terms:
        d[lab] = d.get(lab, 0.0) + c
    return d


@given(unitary_case(max_n=3), st.data())
def test_bloch_vector_states_match_the_density_matrix(case, data):
    n, ops, terms, params, _ = case
    bloch = data.draw(bloch_vectors(n, mixed=True))
    val, _ = _pauli(build(n, ops), paulisum(terms, n), params, bloch)
    assert abs(val - R.dense_expectation(build(n, ops), _merge(terms), params, bloch)) < 1e-10


def test_rotations_gather_their_splitting_words_in_the_smallest_room_and_stay_exact():
    """A rotation gathers its splitting words in the smallest room that holds them (on CPUs C/64, C/8,
    C/2 and C, rooms under 256 slots left out, up to 4,096 slots only C; on GPUs C/16 and C, up to
    2^17 slots only C); with about 100 and 3,000-7,000
    splitting words the rotations below use several rooms, and the untruncated value still equals the
    state vector. (Small capacities, as in the other tests, have one room, C.)"""
    from pauliprop.propagation.engine import rooms_for

    assert rooms_for(1 << 15, "cpu") == (512, 4096, 16384, 32768)
    assert rooms_for(1 << 15, "gpu") == (32768,) and rooms_for(1 << 18, "gpu") == (16384, 1 << 18)
    assert rooms_for(1 << 12, "cpu") == rooms_for(1 << 12, "gpu") == (4096,)  # small buffers: one room
    assert rooms_for(64, "cpu") == rooms_for(64, "gpu") == (64,)
    rng = np.random.default_rng(3)
    n = 10
    labels = {"".join(rng.choice(list("IXYZ"), n - 1)) + "I" for _ in range(6000)}
    labels |= {"".join(rng.choice(list("IXYZ"), n - 1)) + "Z" for _ in range(100)}
    h = pp.PauliSum.from_labels({lab: float(rng.normal()) for lab in sorted(labels)})
    # backward order: rx(9) splits ~100 words (room 512), rzz(1, 5) ~3,000, ry(3) ~4,500, rx(0) ~6,700
    c = pp.Circuit(n).rx(0, 0.3).ry(3, 0.5).rzz(1, 5, 0.2).h(2).rx(9, 0.4)
    params = jnp.zeros(0)
    val, stats = pp.expectation(c, h, params, capacity=1 << 15, return_stats=True)
    assert not bool(stats.overflow) and int(stats.max_terms_seen) > 16384
    exact = pp.expectation(c, h, params, method="statevector")
    assert abs(float(val) - float(exact)) < 1e-9 * max(1.0, abs(float(exact)))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="GPU programs hold the room of the whole buffer")
def test_a_rotation_that_splits_more_than_half_the_buffer_resumes_in_the_program_with_that_room(monkeypatch):
    """CPU programs that stop and cut in two rooms leave out the room of the whole buffer
    (engine.whole_room_for): a rotation that splits more than half the buffer writes nothing, and
    the loop resumes it in the program that holds that room (here it then overflows and the buffer
    grows). The value equals the state vector."""
    from pauliprop.propagation import propagate as PR
    configs = []
    forward_jit = PR._forward_jit
    monkeypatch.setattr(PR, "_forward_jit", lambda cfg, *a: configs.append(cfg) or forward_jit(cfg, *a))
    rng = np.random.default_rng(5)
    n = 8
    # X or Y on qubit 0: every word splits under the last RZ(0), about 5,500 words in 8,192 slots
    labels = {str(rng.choice(["X", "Y"])) + "".join(rng.choice(list("IXYZ"), n - 1)) for _ in range(6000)}
    h = pp.PauliSum.from_labels({lab: float(rng.normal()) for lab in sorted(labels)})
    c = pp.Circuit(n).ry(3, 0.4).cx(0, 1).rx(2, 0.3).rz(0, 0.7)
    val, stats = pp.expectation(c, h, truncation=pp.Truncation(max_terms=10**6), initial_capacity=8192,
                                return_stats=True)
    assert len(labels) > 4096 and not configs[0].whole_room and configs[-1].whole_room
    assert stats.capacity > 8192 and not bool(stats.overflow)
    exact = float(pp.expectation(c, h, method="statevector"))
    assert abs(float(val) - exact) < 1e-9 * max(1.0, abs(exact))


def test_stats_report_terms_per_operation():
    n = 4
    c, h = fixed_unitary_circuit(n), fixed_observable(n)
    out, stats = pp.propagate(c, h, PARAMS, capacity=CAPACITY)
    terms = np.asarray(stats.terms)
    assert terms.shape == (P.lower(c).length,)
    assert int(stats.max_terms_seen) == max(int(terms.max()), len(h))
    assert not bool(stats.overflow) and float(stats.total_dropped_norm) == 0.0
    assert stats.capacity == CAPACITY
    assert "overflow False" in stats.summary()
    # terms after each operation (circuit order) = the support of the exact Heisenberg operator there;
    # in particular only anticommuting words split
    ref, _, _, counts = R.reference_propagate(c, dict(_merge(fixed_terms(n))), PARAMS, return_counts=True)
    np.testing.assert_array_equal(terms, counts[::-1])
    assert np.count_nonzero(np.asarray(out.coeffs)) == terms[0] == len(ref)


def test_empty_circuit_is_the_overlap():
    n = 3
    h = pp.PauliSum.from_labels({"ZIZ": 0.5, "XII": 2.0, "IIZ": -1.0})
    for state, want in [("0", -0.5), ("+", 2.0), ("101", 0.5 - 1.0 * -1)]:
        assert abs(float(pp.expectation(pp.Circuit(n), h, state=state)) - want) < 1e-12


# ---- noise ----------------------------------------------------------------------------------------

@given(st.data())
def test_noisy_circuits_match_the_density_matrix(data):
    n = data.draw(st.integers(1, 3))
    ops = data.draw(anchored_ops(n, SMALL_OPS, ALL_KINDS, noise=True))
    terms = data.draw(observable_terms(n, SMALL_TERMS, distinct=True))
    params = data.draw(params_vector())
    state = data.draw(st.one_of(states(n), bloch_vectors(n, mixed=True)))
    c = build(n, ops)
    val, stats = _pauli(c, paulisum(terms.items(), n), params, state, capacity=SMALL_CAPACITY)
    assert abs(val - R.dense_expectation(c, terms, params, state)) < 1e-10


# ---- gradients and transforms ---------------------------------------------------------------------

# random circuits' gradients against the state vector's: test_adjoint.py (the reverse mode's own file)

def test_gradient_at_zero_angles_equals_statevector_gradient():
    n = 3
    c, h = fixed_unitary_circuit(n), fixed_observable(n)
    p = jnp.zeros(NUM_PARAMS)  # a common initialisation of variational loops
    g = jax.grad(lambda q: pp.expectation(c, h, q, capacity=CAPACITY))(p)
    g_ref = jax.grad(lambda q: pp.expectation(c, h, q, method="statevector"))(p)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-8)


def test_jit_and_vmap_over_params_equal_the_eager_loop():
    """jax.jit(jax.vmap(expectation)) over 4 parameter sets equals the eager values, one by one."""
    n = 4
    c, h = fixed_unitary_circuit(n), fixed_observable(n)
    batch = np.stack([PARAMS, -PARAMS, PARAMS * 0.5 + 0.1, np.full(NUM_PARAMS, math.pi / 2)])
    loop = [float(pp.expectation(c, h, p, state="+", capacity=CAPACITY)) for p in batch]
    f = jax.jit(jax.vmap(lambda p: pp.expectation(c, h, p, state="+", capacity=CAPACITY)))
    vals = np.asarray(f(jnp.asarray(batch)))
    np.testing.assert_allclose(vals, loop, atol=1e-12)
    exact = [float(pp.expectation(c, h, p, state="+", method="statevector")) for p in batch]
    np.testing.assert_allclose(vals, exact, atol=1e-10)


def test_a_circuit_traced_under_jit_is_reusable():
    c = pp.Circuit(1).rx(0, pp.Param(0))
    h = pp.PauliSum.from_labels({"Z": 1.0})
    p = jnp.array([0.1])
    assert abs(float(jax.jit(lambda q: pp.expectation(c, h, q, capacity=64))(p)) - math.cos(0.1)) < 1e-12
    assert abs(float(pp.expectation(c, h, p, capacity=64)) - math.cos(0.1)) < 1e-12


# ---- capacity ---------------------------------------------------------------------------------------

def _growing_circuit():
    """1,752 terms at the peak on 6 qubits: more than the default first capacity (1024), fewer than 2048.
    Rotations only: a single operation kind keeps the compiles small."""
    n = 6
    c = pp.Circuit(n)
    for q in range(n):
        c.rx(q, 0.3 + 0.1 * q)
    for q in range(n - 1):
        c.rzz(q, q + 1, 0.5 + 0.05 * q)
    for q in range(n):
        c.ry(q, 0.7 - 0.1 * q)
    return c, pp.PauliSum.from_labels({"ZZZZZI": 1.0})


def test_capacity_overflow_is_reported_and_growth_is_exact(monkeypatch):
    """The loop of engine.py (batches, max_terms and amplitude damping run there; tiled.py, the rest of
    the concrete calls, has its own tests): a fixed capacity cuts and reports, no capacity grows."""
    from pauliprop.propagation import propagate as PR
    monkeypatch.setattr(PR, "tiled_supported", lambda *a: False)
    c, h = _growing_circuit()
    exact = float(pp.expectation(c, h, method="statevector"))
    # an explicit capacity that is too small: flagged, with the lost norm, and a warning
    with pytest.warns(RuntimeWarning, match="overflow"):
        val, stats = pp.expectation(c, h, capacity=1024, return_stats=True)
    assert bool(stats.overflow) and float(stats.dropped_norm[4]) > 0
    assert float(np.sum(np.asarray(stats.dropped_norm)[:4])) == 0.0
    assert abs(float(val) - exact) <= float(stats.dropped_norm[4]) + 1e-10
    # the same as the program that cuts from the first gate (under jit, where shapes cannot grow): the
    # overflow's cut goes gate by gate (on GPUs the call runs again without its layers of rotations)
    with pytest.warns(RuntimeWarning, match="overflow"):
        cut, cut_stats = jax.jit(lambda cf: pp.expectation(c, pp.PauliSum(h.x, h.z, cf, h.num_qubits), capacity=1024,
                                                           return_stats=True))(h.coeffs)
        jax.block_until_ready(cut)
    assert abs(float(val) - float(cut)) < 1e-12
    np.testing.assert_allclose(np.asarray(stats.dropped_norm), np.asarray(cut_stats.dropped_norm), atol=1e-12)
    # no room to grow: an error, not a lossy answer
    with pytest.raises(MemoryError, match="max_capacity"):
        pp.propagate(c, h, max_capacity=1024)
    # capacity=None: grows and retries until nothing is lost
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        val, stats = pp.expectation(c, h, return_stats=True)
    # it resumes at the overflowing operation in a buffer of at least twice the capacity and the need
    assert not bool(stats.overflow) and stats.capacity in (2048, 4096) and 1024 < int(stats.max_terms_seen) <= 2048
    assert abs(float(val) - exact) < 1e-10
    # initial_capacity: growth starts there (and still grows when it is too small)
    val, stats = pp.expectation(c, h, return_stats=True, initial_capacity=512)
    assert stats.capacity in (2048, 4096) and abs(float(val) - exact) < 1e-10
    val, stats = pp.expectation(c, h, return_stats=True, initial_capacity=4096)
    assert stats.capacity == 4096 and abs(float(val) - exact) < 1e-10
    assert isinstance(stats.capacity, int)
    # a call at the capacity growth found runs the growing call's program: nothing new to compile
    misses = PR._forward_jit.cache_info().misses
    assert float(pp.expectation(c, h, capacity=4096)) == float(val)
    assert PR._forward_jit.cache_info().misses == misses


# ---- bad input ----------------------------------------------------------------------------------------

def test_bad_input_raises_naming_the_cause():
    n = 4
    c, h = fixed_unitary_circuit(n), fixed_observable(n)
    with pytest.raises(ValueError, match="observable acts on 5 qubits but the circuit has 4"):
        pp.expectation(c, pp.PauliSum.from_labels({"ZZZZZ": 1.0}), PARAMS)
    with pytest.raises(ValueError, match="params has only 2 entries"):
        pp.expectation(c, h, PARAMS[:2])
    with pytest.raises(ValueError, match="params is None"):
        pp.expectation(c, h)
    bad = PARAMS.copy()
    bad[1] = np.nan
    with pytest.raises(ValueError, match=r"params\[1\] = nan is not finite"):
        pp.expectation(c, h, bad)
    with pytest.raises(ValueError, match="1-d"):
        pp.expectation(c, h, PARAMS[None, None, :])
    with pytest.raises(ValueError, match="unknown method"):
        pp.expectation(c, h, PARAMS, method="mps")
    with pytest.raises(ValueError, match="capacity"):
        pp.propagate(c, h, PARAMS, capacity=2)
    with pytest.raises(TypeError, match="Circuit"):
        pp.expectation("h 0", h, PARAMS)
    with pytest.raises(TypeError, match="PauliSum"):
        pp.expectation(c, {"ZZZZ": 1.0}, PARAMS)
    with pytest.raises(ValueError, match="takes no truncation"):
        pp.expectation(c, h, PARAMS, method="statevector", truncation=pp.Truncation(max_weight=2))


@pytest.mark.parametrize("state, cause", [("0x10", r"unsupported state character\(s\) \['x'\]"),
                                          ("01", "2 characters but the circuit has 4 qubits"),
                                          ("", "0 characters")])
def test_unsupported_state_raises_naming_the_cause(state, cause):
    n = 4
    c, h = fixed_unitary_circuit(n), fixed_observable(n)
    with pytest.raises(ValueError, match=cause):
        pp.expectation(c, h, PARAMS, state=state, capacity=CAPACITY)
    with pytest.raises(ValueError, match=cause):
        pp.expectation(c, h, PARAMS, state=state, method="statevector")


def test_without_x64_results_are_float32_and_agree_with_the_state_vector():
    """jax_enable_x64 off (a fresh process): float32 coefficients, the two-key merge, same values to 1e-5."""
    import subprocess
    import sys

    code = """
import jax, numpy as np
assert not jax.config.jax_enable_x64
import pauliprop as pp
c = pp.Circuit(5)
for q in range(5):
    c.h(q).rx(q, pp.Param(q))
for q in range(4):
    c.cx(q, q + 1).rzz(q, q + 1, pp.Param(5 + q)).t(q)
h = pp.PauliSum.from_list([("ZZ", [0, 1], 1.0), ("X", [2], 0.5), ("YZ", [3, 4], -0.7)], 5)
p = np.linspace(0.1, 0.9, 9)
val, stats = pp.expectation(c, h, p, capacity=1024, return_stats=True)
assert val.dtype == np.float32, val.dtype
ref = pp.expectation(c, h, p, method="statevector", )
g = jax.grad(lambda q: pp.expectation(c, h, q, capacity=1024))(jax.numpy.asarray(p, jax.numpy.float32))
assert g.dtype == np.float32
print(float(val), float(ref))
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    val, ref = map(float, out.stdout.split())
    assert abs(val - ref) < 1e-5


def test_with_x64_results_are_float64():
    c = pp.Circuit(2).rx(0, pp.Param(0)).cx(0, 1)
    h = pp.PauliSum.from_labels({"ZI": 1.0})  # CX leaves Z on the control alone: <Z0> = cos(a)
    val = pp.expectation(c, h, np.array([0.3]), capacity=64)
    assert val.dtype == np.float64 and abs(float(val) - math.cos(0.3)) < 1e-15


def test_the_observables_merge_runs_before_the_loop_and_equals_the_loops_own():
    """An observable with duplicate words, a word over max_weight and one under min_abs_coeff is
    merged and truncated before the loop (whose program then holds no merge code, unless amplitude
    damping merges later): the value, the terms and the dropped norms equal those of the merge in the
    loop (pp.expectation under jax.jit runs it there), untruncated equal to the state vector; and
    on the host's CPU backend (GPUs merge small observables there) the same buffer."""
    from pauliprop.propagation import propagate as PR
    n = 5
    h = pp.PauliSum.from_list([("ZZ", [0, 1], 0.5), ("X", [2], 0.25), ("ZZ", [0, 1], 0.25), ("XXXX", [0, 1, 2, 3], 0.3),
                               ("Y", [4], 1e-6), ("X", [2], -0.125), ("ZX", [3, 4], 0.7)], n)
    c = pp.Circuit(n).ry(0, pp.Param(0)).cx(0, 1).rx(2, pp.Param(1)).rzz(3, 4, pp.Param(2)).h(4)
    p = jnp.asarray([0.3, -0.7, 1.1])
    for trunc in (pp.Truncation(max_weight=3, min_abs_coeff=1e-4), pp.Truncation()):
        val, stats = pp.expectation(c, h, p, truncation=trunc, capacity=256, return_stats=True)
        in_loop, loop_stats = jax.jit(lambda q: pp.expectation(c, h, q, truncation=trunc, capacity=256,
                                                                 return_stats=True))(p)
        assert abs(float(val) - float(in_loop)) < 1e-12
        np.testing.assert_allclose(np.asarray(stats.dropped_norm), np.asarray(loop_stats.dropped_norm), atol=1e-12)
        np.testing.assert_array_equal(np.asarray(stats.terms), np.asarray(loop_stats.terms))
    exact = pp.expectation(c, h, p, method="statevector")
    assert abs(float(val) - float(exact)) < 1e-10
    assert float(np.asarray(loop_stats.dropped_norm).sum()) == 0
    low = PR.lowered(c, pp.Truncation(), jax.default_backend())
    assert S.U_MERGE not in PR.config(low, pp.Truncation(), 256, True, "cpu", merged=True).units
    damped = PR.lowered(pp.Circuit(n).amplitude_damp(0, 0.1).rx(0, 0.2), pp.Truncation(), jax.default_backend())
    assert S.U_MERGE in PR.config(damped, pp.Truncation(), 256, True, "cpu", merged=True).units
    # a GPU merges a small observable on the host's CPU backend: the same buffer
    trunc = pp.Truncation(max_weight=3, min_abs_coeff=1e-4)
    low = PR.lowered(c, trunc, "cpu")
    args = (low, h, trunc, trunc.limits(np.float64), np.float64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jax, "devices", lambda backend=None: jax.local_devices(backend="cpu"))  # "gpu": this CPU
        on_host = PR._merge_observable(*args, "gpu")
    own = PR._merge_observable(*args, "cpu")
    for a, b in zip(jax.tree_util.tree_leaves(on_host), jax.tree_util.tree_leaves(own)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("batch", [(), (3,)])
def test_a_buffer_grows_the_same_on_the_device_and_on_the_host(batch):
    """GPUs pad a device buffer on the device (propagate._pad_slots), CPUs and host arrays on the
    host (propagate._grown): the same slots, zeros after the old ones, the dropped norms untouched."""
    from pauliprop.propagation import propagate as PR
    from pauliprop.propagation import engine

    rng = np.random.default_rng(0)
    buf = engine.Buffer(rng.integers(0, 2**32, batch + (8, 4), dtype=np.uint32), rng.normal(size=batch + (8,)),
                        rng.integers(0, 7, batch + (8,)).astype(np.int32), rng.normal(size=batch + (5,)))
    host = PR._grown(buf, 32)
    device = PR._pad_slots(jax.tree_util.tree_map(jnp.asarray, buf), 32)
    for h, d in zip(host, device):
        np.testing.assert_array_equal(np.asarray(h), np.asarray(d))
    assert host.coeffs.shape == batch + (32,) and not np.any(np.asarray(host.meta)[..., 8:])
    assert PR._grown(buf, 8) is buf


def test_an_observables_merge_is_remembered_and_survives_the_loops_donation(monkeypatch):
    """A loop that passes one observable many times merges it once (the buffer is remembered on the
    observable, keyed by its arrays' identity); the loop donates its own buffer, never the remembered
    one, even when the two have the same size (600 words of 5 qubits: 1,024 slots both). (The loop of
    engine.py: batches, max_terms and amplitude damping run there.)"""
    from pauliprop.propagation import propagate as PR
    monkeypatch.setattr(PR, "tiled_supported", lambda *a: False)
    rng = np.random.default_rng(5)
    codes = rng.choice(4**5, 600, replace=False)
    words = [{q: "IXYZ"[(int(c) >> (2 * q)) & 3] for q in range(5) if (int(c) >> (2 * q)) & 3} for c in codes]
    h = pp.PauliSum.from_words(words, rng.normal(size=600), 5)
    c = pp.Circuit(5).ry(0, pp.Param(0)).cx(0, 1).rx(2, 0.4).cz(3, 4).rzz(1, 3, pp.Param(0))
    low = PR.lowered(c, pp.Truncation(), jax.default_backend())
    assert PR.default_capacity(h, pp.Truncation()) == PR.schedule.bucket(len(h), 64) == 1024
    vals = [float(pp.expectation(c, h, np.array([a]))) for a in (0.3, 0.3, -1.2)]
    remembered = h._merged[2]
    assert float(pp.expectation(c, h, np.array([-1.2]))) == vals[2] and h._merged[2] is remembered
    assert vals[0] == vals[1] and abs(vals[2] - float(pp.expectation(c, h, np.array([-1.2]), method="statevector"))) < 1e-10
    renamed = pp.PauliSum(h.x, h.z, h.coeffs * 2, 5)  # new arrays: merged afresh
    assert abs(float(pp.expectation(c, renamed, np.array([0.3]))) - 2 * vals[0]) < 1e-10
    assert renamed._merged[2] is not remembered


def test_compile_options_that_xla_does_not_know_are_dropped(monkeypatch):
    """Option names come and go between jaxlib versions (jax 0.11 has no xla_cpu_use_fusion_emitters):
    a program whose options XLA rejects compiles again without the unknown ones, same result."""
    from pauliprop.propagation import propagate as PR
    monkeypatch.setattr(PR, "FAST_COMPILE", {**PR.FAST_COMPILE, "xla_no_such_option_anywhere": True})
    PR._forward_jit.cache_clear()
    PR._merge_jit.cache_clear()
    try:
        c = pp.Circuit(3).h(0).cx(0, 1).rx(2, pp.Param(0)).cz(1, 2)
        h = pp.PauliSum.from_labels({"ZZI": 1.0, "IXZ": 0.5})
        val = float(pp.expectation(c, h, np.array([0.7])))
    finally:
        PR._forward_jit.cache_clear()
        PR._merge_jit.cache_clear()
    assert abs(val - float(pp.expectation(c, h, np.array([0.7]), method="statevector"))) < 1e-12
    if jax.default_backend() == "cpu":
        assert not compilation.xla_knows("xla_no_such_option_anywhere", True)
        assert compilation.xla_knows("xla_backend_optimization_level", 0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="GPUs run a batch as one vmapped program")
def test_a_cpu_batch_of_large_members_runs_them_side_by_side_each_its_own(monkeypatch):
    """On CPUs a batch whose buffers start large runs its members on threads, each driven alone (its
    own capacity growth): every member's value, propagated sum and dropped norms are those of its
    own call, and the stats have the vmapped batch's shapes."""
    from pauliprop.propagation import propagate as PR
    c = pp.Circuit(40)
    for step in range(3):
        for q in range(6):
            c.rx(q, pp.Param(q % 2))
        for q in range(5):
            c.rzz(q, q + 1, -math.pi / 2)
    obs = pp.PauliSum.from_list([("Z", [2], 1.0), ("XX", [0, 5], 0.5)], 40)
    trunc = pp.Truncation(max_terms=40, min_abs_coeff=1e-4)
    batch = np.array([[0.3, -1.2], [1.1, 0.4], [0.0, 2.5]])
    kw = dict(truncation=trunc, initial_capacity=16, return_stats=True)
    vmapped_vals, vmapped_stats = pp.expectation(c, obs, batch, **kw)
    vmapped_sum, _ = pp.propagate(c, obs, batch, truncation=trunc, initial_capacity=16)
    drives = []
    real_drive = PR._drive_side_by_side
    monkeypatch.setattr(PR, "_drive_side_by_side", lambda *a: drives.append(a[-1]) or real_drive(*a))
    monkeypatch.setattr(PR, "SIDE_BY_SIDE_CAPACITY", 16)
    monkeypatch.setattr(PR.memory, "cores", lambda: 2)
    vals, stats = pp.expectation(c, obs, batch, **kw)
    summed, _ = pp.propagate(c, obs, batch, truncation=trunc, initial_capacity=16)
    assert drives == [2, 2]  # both calls ran side by side, on two threads
    for got, want in zip(stats, vmapped_stats):
        assert np.shape(got) == np.shape(want)
    for k, q in enumerate(batch):
        v, s = pp.expectation(c, obs, q, **kw)
        assert float(vals[k]) == float(v) and abs(float(vmapped_vals[k]) - float(v)) < 1e-12
        np.testing.assert_array_equal(np.asarray(stats.dropped_norm)[k], np.asarray(s.dropped_norm))
        one, _ = pp.propagate(c, obs, q, truncation=trunc, initial_capacity=16)
        mine = {(a.tobytes(), b.tobytes()): w for a, b, w in zip(np.asarray(summed.x[k]), np.asarray(summed.z[k]),
                                                                   np.asarray(summed.coeffs[k])) if w != 0}
        ref = {(a.tobytes(), b.tobytes()): w for a, b, w in zip(np.asarray(one.x), np.asarray(one.z),
                                                                 np.asarray(one.coeffs)) if w != 0}
        assert mine == ref


def test_capacities_below_the_observables_merge_bucket_work():
    """The observable's merge runs in a buffer of at least 64 slots; a capacity (or a first capacity)
    below that, still holding the observable, runs and grows as any other."""
    c = pp.Circuit(3).rx(0, 0.4).rzz(0, 1, 0.9).ry(2, -0.3).cx(1, 2)
    obs = pp.PauliSum.from_labels({"ZII": 1.0, "IXZ": 0.5})
    exact = float(pp.expectation(c, obs, method="statevector"))
    for kw in (dict(capacity=4), dict(initial_capacity=2), dict(capacity=16)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # capacity=4 may overflow (reported)
            val, stats = pp.expectation(c, obs, return_stats=True, **kw)
        if not bool(stats.overflow):
            assert abs(float(val) - exact) < 1e-12, kw
    assert not bool(pp.expectation(c, obs, initial_capacity=2, return_stats=True)[1].overflow)


def test_threads_that_start_together_share_one_program(monkeypatch):
    """A CPU batch runs its members on threads (propagate._drive_side_by_side), which ask for the
    same program at the same moment: they get one jitted function (so one compilation), not one
    each. jax.jit is slowed down here so that, unguarded, both threads would build their own."""
    import threading
    import time

    from pauliprop.propagation import propagate as PR
    jit = jax.jit
    monkeypatch.setattr(PR.jax, "jit", lambda *a, **k: time.sleep(0.3) or jit(*a, **k))
    c = pp.Circuit(3).h(0).cx(0, 1).rx(2, pp.Param(0))
    low = PR.lowered(c, pp.Truncation(), jax.default_backend())
    cfg = PR.config(low, pp.Truncation(), 64, True, jax.default_backend())._replace(unroll=3)  # a key no other test has
    got = [None, None]

    def ask(i):
        got[i] = PR._forward_jit(cfg, False, jax.default_backend())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] is got[1] is not None


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([3, 40, 127]), st.data(), st.sampled_from([0.0, 1e-9, 0.3, -2.5]),
       st.sampled_from([None, 0, 2, 5]), st.sampled_from([None, 1e-6, 0.5]), st.sampled_from([None, 1, 7]))
def test_a_one_term_observable_is_merged_on_the_host_as_the_program_merges_it(n, data, coeff, max_weight,
                                                                              min_abs_coeff, max_terms):
    """One term needs no merge program: the host's buffer, live count and dropped norms equal the
    merge program's, for every rule that can drop or keep it."""
    from pauliprop.propagation import propagate as PR
    label = "".join(data.draw(st.lists(st.sampled_from("IIXYZ"), min_size=n, max_size=n)))
    obs = pp.PauliSum.from_labels({label: coeff})
    trunc = pp.Truncation(max_weight=max_weight, min_abs_coeff=min_abs_coeff, max_terms=max_terms)
    c = pp.Circuit(n).rx(0, pp.Param(0))
    low = PR.lowered(c, trunc, "cpu")
    dtype = jnp.result_type(float)
    host_buf, host_live = PR._one_term_merged(obs, trunc, dtype, 64)
    cfg = PR.config(low, trunc, 64, True, "cpu")
    prog_buf, prog_live = PR._merge_jit(cfg, "cpu")(low.device_tables("cpu"), PR._initial_buffer(obs, 64, dtype),
                                                     trunc.limits(dtype))
    assert int(host_live) == int(prog_live)
    for a, b in zip(host_buf, prog_buf):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_small_run_starts_on_the_loop_and_one_that_outgrows_it_goes_on_to_the_tiled_engine(monkeypatch):
    """A run that can hold at most SMALL_RUN_BOUND words runs first on the loop of engine.py, in a buffer
    that compiles fast; one whose terms outgrow that buffer runs on the tiled engine, and later calls of
    that circuit and observable go there at once. Exact either way."""
    from pauliprop.propagation import propagate as PR
    monkeypatch.setenv(PR.NATIVE, "0")  # XLA's engines (a CPU without the native engine)
    calls = []
    run_tiled, drive = PR._run_tiled, PR._drive
    monkeypatch.setattr(PR, "_run_tiled", lambda *a, **k: calls.append("tiled") or run_tiled(*a, **k))
    monkeypatch.setattr(PR, "_drive", lambda *a, **k: calls.append("loop") or drive(*a, **k))
    rng = np.random.default_rng(5)
    for n, layers, grows in [(5, 2, False), (7, 6, True)]:
        c = pp.Circuit(n)
        for _ in range(layers):
            for q in range(n):
                c.rx(q, rng.uniform(-1, 1)).rz(q, rng.uniform(-1, 1))
            for q in range(n - 1):
                c.rzz(q, q + 1, rng.uniform(-1, 1))
        h = pp.PauliSum.from_list([("ZZ", [1, 2], 1.0), ("X", [0], 0.5)], n)
        assert PR.small_run_capacity(c, h, pp.Truncation()) is not None
        calls.clear()
        val, stats = pp.expectation(c, h, return_stats=True)
        assert abs(float(val) - float(pp.expectation(c, h, method="statevector"))) < 1e-10
        assert (int(stats.max_terms_seen) > PR.FAST_COMPILE_CAPACITY) == grows
        assert calls == (["loop", "tiled"] if grows else ["loop"])
        calls.clear()
        again = pp.expectation(c, h)
        assert float(again) == float(val) and calls == (["tiled"] if grows else ["loop"])
        out, _ = pp.propagate(c, h)  # the live terms, whichever engine ran
        assert np.all(np.asarray(out.coeffs) != 0)


# ---- 5,000 and 10,000 qubits ------------------------------------------------------------------------
# Words cover any n (157 and 313 lanes here). Each circuit's answer is known without the engine: a Clifford
# circuit's from Stim's Heisenberg map, product rotations' from 2x2 matrices, a brickwork's from the numpy
# state vector of the few qubits in each term's backward light cone (gates outside it do not act on the term).

LARGE_N = [5000, 10000]
BLOCH = {"0": (0, 0, 1), "1": (0, 0, -1), "+": (1, 0, 0), "-": (-1, 0, 0), "r": (0, 1, 0), "l": (0, -1, 0)}


@pytest.fixture
def no_first_try_on_the_loop(monkeypatch):
    """Small runs at these sizes skip their first try on the loop (propagate.SMALL_RUN_BOUND), as large runs
    do: the loop's XLA programs grow with the lanes (a 5,000-qubit Clifford run's first call compiled for
    10 s, 27 s at 10,000, on the 2-core CPU), while the native engine's C loops are the same for any n (and
    where the C library is built, small runs skip the loop anyway)."""
    from pauliprop.propagation import propagate as PR
    monkeypatch.setattr(PR, "SMALL_RUN_BOUND", {})


def random_state(n: int, rng) -> str:
    return "".join(rng.choice(list(BLOCH), n))


def lane_edge_terms(n: int):
    """Terms on both sides of lane boundaries (32, 64, 4096), at both ends and far apart."""
    return [("Z", [0], 0.7), ("XY", [31, 32], -0.4), ("ZXYZ", [63, 64, 4095, 4096], 1.1), ("Y", [n - 1], 0.3),
            ("ZZ", [0, n - 1], -0.9), ("XZ", [n // 2, n // 2 + 1], 0.5)]


def stim_clifford_pair(n: int, layers: int, rng):
    """The same random circuit of the table's Stim-named Cliffords as a pp.Circuit and a stim.Circuit: each
    layer a two-qubit gate on random pairs of all qubits, then a one-qubit gate on every qubit."""
    stim = pytest.importorskip("stim")
    cliffords = [g for g in pp.GATES.values() if g.kind == "clifford" and g.stim_names]
    one = [g for g in cliffords if g.num_qubits == 1]
    two = [g for g in cliffords if g.num_qubits == 2]
    c, lines = pp.Circuit(n), []
    for _ in range(layers):
        for a, b in rng.permutation(n).reshape(-1, 2):
            g = two[rng.integers(len(two))]
            c.append(g.name, [int(a), int(b)])
            lines.append(f"{g.stim_names[0]} {a} {b}")
        for q in range(n):
            g = one[rng.integers(len(one))]
            c.append(g.name, [q])
            lines.append(f"{g.stim_names[0]} {q}")
    return c, stim.Circuit("\n".join(lines))


def eigenstate_value(word: pp.PauliSum, state: str) -> float:
    """sum_t c_t <state| P_t |state> for a product of Pauli eigenstates (one character a qubit)."""
    x = site_bits(word.x, word.num_qubits)
    z = site_bits(word.z, word.num_qubits)
    bloch = np.array([BLOCH[ch] for ch in state], dtype=float)  # (n, 3): <X>, <Y>, <Z>
    factors = (np.where(x & ~z, bloch[:, 0], 1.0) * np.where(x & z, bloch[:, 1], 1.0)
               * np.where(~x & z, bloch[:, 2], 1.0))
    return float(np.sum(np.asarray(word.coeffs) * np.prod(factors, axis=1)))


def site_bits(lanes, n: int) -> np.ndarray:
    """(T, W) packed lanes -> (T, n) booleans, qubit q in column q."""
    from pauliprop.algebra.words import unpack_bits
    return unpack_bits(np.asarray(lanes), n).astype(bool)


def word_as_stim(word: pp.PauliSum):
    """A one-term PauliSum as a stim.PauliString (its coefficient left out)."""
    import stim
    (label,) = word.labels()
    return stim.PauliString(label.replace("I", "_"))


@pytest.mark.parametrize("n", LARGE_N)
def test_clifford_circuits_at_scale_map_each_word_as_stims_heisenberg_map(n, no_first_try_on_the_loop):
    """Property: through two layers of random Cliffords of the table on all n qubits, every term comes out
    as the one signed word Stim's PauliString.before gives (U^dag P U), and expectation values in random
    eigenstate products (0 1 + - r l a qubit) are that word's overlaps."""
    rng = np.random.default_rng(n)
    c, sc = stim_clifford_pair(n, 2, rng)
    terms = lane_edge_terms(n)
    h = pp.PauliSum.from_list(terms, n)
    want = {}
    for label, sites, coeff in terms:
        word = pp.PauliSum.from_list([(label, sites, 1.0)], n)
        image = pp.PauliSum.from_stim(word_as_stim(word).before(sc), coeff)
        for key, value in image.to_dict().items():
            want[key] = want.get(key, 0.0) + value
    out, stats = pp.propagate(c, h)
    assert out.to_dict() == pytest.approx(want, abs=1e-12) and int(stats.max_terms_seen) <= len(terms)
    assert sum(key.count("I") < n - 2 for key in want) >= 3  # the words spread: the test is not trivial
    expected = pp.PauliSum.from_labels(want, n)
    for state in ["0", "+", random_state(n, rng)]:
        full = state if len(state) == n else state * n
        assert abs(float(pp.expectation(c, h, state=state)) - eigenstate_value(expected, full)) < 1e-12


def single_qubit_value(gates_and_angles, label: str, ch: str) -> float:
    """<s| u^dag P u |s> for the one-qubit unitary u of the (gate, angle) list, P of label, |s> of character ch."""
    u = np.eye(2, dtype=complex)
    for gate, angle in gates_and_angles:
        u = pp.GATES[gate].matrix(*([] if angle is None else [angle])) @ u
    ket = R.initial_ket(ch, 1)
    return float(np.real(np.vdot(u @ ket, R.pauli_dense(label) @ (u @ ket))))


@pytest.mark.parametrize("n", LARGE_N)
def test_product_rotations_at_scale_equal_the_product_of_one_qubit_values(n, no_first_try_on_the_loop):
    """Property: with a Clifford, a rotation by Param(q) and a Clifford on every qubit, one-qubit terms at 40
    random sites and words of weight 2-12 at lane edges equal sums of products of one-qubit values, in a
    random eigenstate product, for two parameter vectors. (A term on every qubit costs the engine gates x
    terms x lanes: 8 s warm at 5,000 qubits, 8x that at 10,000.)"""
    rng = np.random.default_rng(n + 1)
    cliffords = ["id", "h", "s", "sdg", "sx", "x", "h_yz", "c_xyz"]
    c = pp.Circuit(n)
    per_qubit = []
    for q in range(n):
        first, axis, last = rng.choice(cliffords), rng.choice(["rx", "ry", "rz"]), rng.choice(cliffords)
        c.append(first, [q]).append(axis, [q], pp.Param(q)).append(last, [q])
        per_qubit.append((first, axis, last))
    terms = [(str(rng.choice(list("XYZ"))), [int(q)], float(rng.uniform(-1, 1)))
             for q in rng.choice(n, 40, replace=False)]
    wide = sorted({0, 31, 32, 63, 64, 4095, 4096, n // 2, n - 2, n - 1, *map(int, rng.choice(n, 2, replace=False))})
    terms += [("".join(rng.choice(list("XYZ"), len(wide))), wide, 0.8), ("XZ", [31, n - 1], -0.6)]
    h = pp.PauliSum.from_list(terms, n)
    state = random_state(n, rng)
    for x in rng.uniform(-np.pi, np.pi, (2, n)):
        def one(q, ch):
            first, axis, last = per_qubit[q]
            return single_qubit_value([(first, None), (axis, x[q]), (last, None)], ch, state[q])
        want = sum(coeff * math.prod(one(q, ch) for q, ch in zip(sites, label)) for label, sites, coeff in terms)
        assert abs(float(pp.expectation(c, h, x, state=state)) - want) < 1e-10


def brickwork(n: int, layers: int, rng) -> pp.Circuit:
    """Layers of a random rx/ry/rz on every qubit, then on the pairs (q, q + 1), q of the layer's parity, a
    cz or an rzz by a random angle: every qubit's backward light cone widens by one a side a layer."""
    c = pp.Circuit(n)
    for layer in range(layers):
        axes, angles = rng.choice(["rx", "ry", "rz"], n), rng.uniform(-np.pi, np.pi, n)
        for q in range(n):
            c.append(str(axes[q]), [q], float(angles[q]))
        for q in range(layer % 2, n - 1, 2):
            c.cz(q, q + 1) if rng.random() < 0.5 else c.rzz(q, q + 1, float(rng.uniform(-np.pi, np.pi)))
    return c


def light_cone(circuit: pp.Circuit, sites) -> tuple[pp.Circuit, list[int]]:
    """The gates in the backward light cone of `sites`, on their qubits relabeled 0..m-1 in increasing order:
    going back from the last gate, a gate that touches the support is kept and its qubits join it."""
    support, kept = set(sites), []
    for ins in reversed(circuit.instructions):
        if support.intersection(ins.qubits):
            kept.append(ins)
            support.update(ins.qubits)
    qubits = sorted(support)
    where = {q: k for k, q in enumerate(qubits)}
    small = pp.Circuit(len(qubits))
    for ins in reversed(kept):
        small.append(ins.name, [where[q] for q in ins.qubits], *ins.args, pauli=ins.pauli)
    return small, qubits


def light_cone_value(circuit: pp.Circuit, terms, state: str) -> float:
    """sum_t c_t <psi|P_t|psi> from the numpy state vector of each term's light cone (tests/pauliprop/_reference.py)."""
    total = 0.0
    for label, sites, coeff in terms:
        small, qubits = light_cone(circuit, sites)
        where = {q: k for k, q in enumerate(qubits)}
        local = ["I"] * len(qubits)
        for ch, q in zip(label, sites):
            local[where[q]] = ch
        psi = R.initial_ket("".join(state[q] for q in qubits), len(qubits))
        for ins in small.instructions:  # gate by gate on the ket: a cone of 16 qubits has a 64 GiB unitary
            psi = R.apply_left(psi, R.gate_matrix(ins, None), ins.qubits, len(qubits))
        image = psi
        for k, ch in enumerate(local):
            if ch != "I":
                image = R.apply_left(image, R.PAULI[ch], [k], len(qubits))
        total += coeff * float(np.real(np.vdot(psi, image)))
    return total


BRICK_LAYERS = 3


@pytest.mark.parametrize("engine", ["native", "tiled"])
def test_a_local_observable_runs_on_its_light_cones_qubits_with_the_same_answer(engine, no_first_try_on_the_loop,
                                                                                  monkeypatch):
    """A concrete call renumbers its observable's light cone's qubits in order where they take fewer lanes than
    the circuit's (lowered(renumber=True)): on 300 qubits its words take one lane where the circuit's take ten,
    and the value in a product of random Bloch vectors, the dropped norms, the terms after each row and the
    live terms (back on the circuit's qubits) are those of the run on every lane; with Pauli channels in the cone."""
    from pauliprop.propagation import propagate as PR

    if engine == "tiled":
        monkeypatch.setenv(PR.NATIVE, "0")
    n = 300
    rng = np.random.default_rng(11)
    bloch = rng.normal(size=(n, 3))
    state = bloch / np.linalg.norm(bloch, axis=1, keepdims=True)
    cut = pp.Truncation(max_weight=5, min_abs_coeff=1e-3)
    h = pp.PauliSum.from_list([("XZ", [150, 151], 1.0), ("Y", [290], -0.5)], n)

    def run(renumber: bool):
        c = brickwork(n, BRICK_LAYERS, np.random.default_rng(3))  # a new circuit: its lowered programs are new
        for q in (10, 149, 151, 289):  # channels in the cone and outside it, renumbered with its gates
            c.depolarize(q, 0.05).pauli_channel(q + 1, 0.01, 0.02, 0.03)
        with pytest.MonkeyPatch.context() as m:
            if not renumber:  # the cone as wide as the circuit: nothing to renumber
                m.setattr(P, "mask_qubits", lambda mask: np.arange(n))
            val, stats = pp.expectation(c, h, state=state, truncation=cut, return_stats=True)
            out, _ = pp.propagate(c, h, truncation=cut)
            low = PR.lowered(c, cut, None, layers=True, support=PR.observable_support(h), renumber=True)
        x, z, coeffs = np.asarray(out.x), np.asarray(out.z), np.asarray(out.coeffs)
        terms = {(x[i].tobytes(), z[i].tobytes()): coeffs[i] for i in range(len(coeffs))}
        return float(val), stats, terms, low

    val, stats, terms, low = run(True)
    whole, whole_stats, whole_terms, whole_low = run(False)
    assert whole_low.qubits is None and whole_low.program.gx.shape[1] == 10
    assert low.program.gx.shape[1] == 1 and 150 in low.qubits and 290 in low.qubits
    assert abs(val - whole) < 1e-12 and int(stats.max_terms_seen) > 50
    np.testing.assert_allclose(stats.dropped_norm, whole_stats.dropped_norm, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(stats.terms, whole_stats.terms)
    assert terms.keys() == whole_terms.keys()
    np.testing.assert_allclose([terms[k] for k in whole_terms], list(whole_terms.values()), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n", LARGE_N)
def test_a_brickwork_at_scale_equals_the_state_vector_of_each_terms_light_cone(n, no_first_try_on_the_loop):
    """Property: through a 3-layer brickwork of random rotations, cz and rzz on all n qubits, terms at the
    ends, across lane boundaries and far apart (Z_0 Z_{n-1}: two light cones) have the value of the state
    vector on their light cones, untruncated (to 1e-10), in |0...0> and a random eigenstate product."""
    rng = np.random.default_rng(n + 2)
    c = brickwork(n, BRICK_LAYERS, rng)
    terms = lane_edge_terms(n)
    h = pp.PauliSum.from_list(terms, n)
    for state in ["0" * n, random_state(n, rng)]:
        val, stats = pp.expectation(c, h, state=state, return_stats=True)
        assert abs(float(val) - light_cone_value(c, terms, state)) < 1e-10
        assert float(jnp.sum(stats.dropped_norm)) == 0.0
    assert int(stats.max_terms_seen) > 100  # rotations split the words: the test is not trivial


def test_truncation_at_scale_decides_as_on_the_light_cone_and_its_error_is_bounded(no_first_try_on_the_loop):
    """Property: truncated (weight and coefficient), the 5,000-qubit brickwork's estimate and dropped norm equal
    those of its light cone's circuit run alone on its few qubits (the rules see the same words), and the
    estimate is within the dropped 1-norm of the exact value."""
    n = 5000
    rng = np.random.default_rng(7)
    c = brickwork(n, BRICK_LAYERS, rng)
    terms = [("XZ", [2500, 2501], 1.0), ("Y", [2503], -0.5)]
    cut = pp.Truncation(max_weight=3, min_abs_coeff=0.02)
    val, stats = pp.expectation(c, pp.PauliSum.from_list(terms, n), truncation=cut, return_stats=True)
    dropped = float(jnp.sum(stats.dropped_norm))
    assert dropped > 0.01
    assert abs(float(val) - light_cone_value(c, terms, "0" * n)) <= dropped + 1e-12
    small, qubits = light_cone(c, [q for _, sites, _ in terms for q in sites])
    where = {q: k for k, q in enumerate(qubits)}
    local = pp.PauliSum.from_list([(label, [where[q] for q in sites], coeff) for label, sites, coeff in terms],
                                  len(qubits))
    small_val, small_stats = pp.expectation(small, local, truncation=cut, return_stats=True)
    assert abs(float(val) - float(small_val)) < 1e-12
    np.testing.assert_allclose(np.asarray(stats.dropped_norm), np.asarray(small_stats.dropped_norm), atol=1e-12)


def _host_first_case(monkeypatch):
    """A circuit, observable, parameters and truncation, with the CPU standing in for a GPU (HOST_FIRST_BACKENDS,
    its native engine off the direct path, no first try on the loop) and no program compiled in this process."""
    from pauliprop.propagation import propagate as PR
    if PR._native_module() is None:
        pytest.skip("the native engine's C library was not built")
    rng = np.random.default_rng(3)
    c = pp.Circuit(7)
    for layer in range(4):
        for q in range(7):
            c.rx(q, pp.Param(7 * layer + q))
        for q in range(layer % 2, 6, 2):
            c.rzz(q, q + 1, 0.4)
    monkeypatch.setattr(PR, "HOST_FIRST_BACKENDS", frozenset({"cpu"}))
    monkeypatch.setattr(PR, "native_engine", lambda: None)
    monkeypatch.setattr(PR, "SMALL_RUN_BOUND", {})
    jax.clear_caches()
    return c, pp.PauliSum.from_labels({"IIIZZII": 1.0, "XIIIIIY": 0.5}), rng.normal(size=28), \
        pp.Truncation(min_abs_coeff=1e-3, max_weight=5)


def test_a_call_whose_gpu_program_is_not_compiled_is_answered_on_the_host_meanwhile(monkeypatch):
    """Where the device's program is not compiled (a backend of HOST_FIRST_BACKENDS: GPUs; here the CPU stands
    in, with its native engine taken off the direct path), the native engine answers on the host and the
    device's run starts in a background thread, under the caller's default device; once that is done, the next
    call runs the compiled program. Both answers (value, terms after every row, dropped norms) are the tiled
    engine's; PAULIPROP_HOST_FIRST=0 waits for the program instead."""
    import threading

    from pauliprop.propagation import propagate as PR
    from pauliprop.runtime import background
    c, h, params, truncation = _host_first_case(monkeypatch)
    host, device_runs = [], []
    drive_native, run_tiled = PR._drive_native, PR._run_tiled
    monkeypatch.setattr(PR, "_drive_native", lambda *a, **k: host.append(1) or drive_native(*a, **k))
    monkeypatch.setattr(PR, "_run_tiled", lambda *a, **k: device_runs.append(
        (threading.current_thread() is threading.main_thread(), jax.config.jax_default_device)) or run_tiled(*a, **k))
    started = background.started()
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        first = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    assert host == [1] and background.started() == started + 1
    assert background.wait(600) and device_runs == [(False, cpu)]
    second = pp.expectation(c, h, params, truncation=truncation, return_stats=True)
    assert host == [1] and device_runs[-1] == (True, None)
    np.testing.assert_allclose(float(first[0]), float(second[0]), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(first[1].terms), np.asarray(second[1].terms))
    np.testing.assert_allclose(np.asarray(first[1].dropped_norm), np.asarray(second[1].dropped_norm), atol=1e-12)
    assert int(first[1].max_terms_seen) == int(second[1].max_terms_seen)
    jax.clear_caches()
    monkeypatch.setenv(PR.HOST_FIRST, "0")
    third = pp.expectation(c, h, params, truncation=truncation)
    assert host == [1] and background.started() == started + 1 and float(third) == float(second[0])


def test_a_host_first_answer_on_the_light_cones_qubits_is_the_devices(monkeypatch):
    """Host first with a local observable of a 100-qubit brickwork (its light cone's qubits renumbered onto one
    lane of the circuit's four) in a product of random Bloch vectors: the host's answer is the device's."""
    from pauliprop.propagation import propagate as PR
    from pauliprop.runtime import background
    _host_first_case(monkeypatch)  # the CPU standing in for a GPU
    host, drive_native = [], PR._drive_native
    monkeypatch.setattr(PR, "_drive_native", lambda *a, **k: host.append(1) or drive_native(*a, **k))
    n = 100
    rng = np.random.default_rng(5)
    c = brickwork(n, BRICK_LAYERS, rng)
    h = pp.PauliSum.from_list([("XZ", [50, 51], 1.0), ("Y", [80], -0.5)], n)
    bloch = rng.normal(size=(n, 3))
    state = bloch / np.linalg.norm(bloch, axis=1, keepdims=True)
    cut = pp.Truncation(max_weight=5, min_abs_coeff=1e-3)
    first = float(pp.expectation(c, h, state=state, truncation=cut))
    assert host == [1] and background.wait(600)
    second = float(pp.expectation(c, h, state=state, truncation=cut))
    assert host == [1]
    low = PR.lowered(c, cut, "cpu", layers=True, support=PR.observable_support(h), renumber=True)
    assert low.qubits is not None and low.program.gx.shape[1] == 1
    assert abs(first - second) < 1e-12


def test_calls_while_the_program_compiles_run_on_the_host_and_leave_it_cores(monkeypatch):
    """A call made while the device's run (its compilation) is under way in the background runs on the host
    with HOST_CORES_FOR_COMPILING cores fewer, and starts no second compilation, of that program or another
    (one at a time)."""
    import threading

    from pauliprop.propagation import native
    from pauliprop.propagation import propagate as PR
    from pauliprop.runtime import background
    c, h, params, truncation = _host_first_case(monkeypatch)
    monkeypatch.setenv(native.THREADS, "6")
    release, run_tiled = threading.Event(), PR._run_tiled
    monkeypatch.setattr(PR, "_run_tiled", lambda *a, **k: release.wait(600) and run_tiled(*a, **k))
    host, run = [], native.run
    monkeypatch.setattr(native, "run", lambda *a, **k: host.append(k.get("threads_at_most")) or run(*a, **k))
    started = background.started()
    try:
        first = float(pp.expectation(c, h, params, truncation=truncation))
        at = len(host)  # the first call's native runs (one more each time its buffers grew)
        second = float(pp.expectation(c, h, params, truncation=truncation))
        other = pp.Circuit(9).rx(0, 0.3).rzz(0, 8, 0.2)  # another shape, whose program is not compiled either
        pp.expectation(other, pp.PauliSum.from_labels({"ZIIIIIIIZ": 1.0}), truncation=truncation)
        assert background.started() == started + 1
    finally:
        release.set()
        assert background.wait(600)
    assert first == second and set(host[:at]) == {None} and set(host[at:]) == {6 - PR.HOST_CORES_FOR_COMPILING}

