"""The GPU's kernels of a rotation pass (pauliprop/propagation/fused.py), run by Pallas's interpreter.

Properties: the tiled engine with the kernels (the rotations' passes, the Clifford runs gate by gate)
gives the XLA passes' answer word for word (the same live terms with the same coefficients, the value,
the dropped 1-norm per rule, the peak terms) on layered circuits of one to four lanes under every rule, with blocks and tiles small enough that pairs and
appended words cross them, in float64 and in float32; untruncated it equals the state vector; the
pairing by linear probing pairs every turning word with its partner even in a half-full table; a run
leaves the table empty and no word gone, fit for the next run. On a GPU the same kernels are compiled
by Triton (experiments/native_peers.py checks their values there).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import pauliprop as pp
from pauliprop.propagation import fused, pairing, propagate as prop

from .._strategies import commuting_rotations, disjoint_rotation_layer


@pytest.fixture
def kernels(monkeypatch):
    """The fused kernels by the interpreter on this CPU, in blocks of 64 words and tiles of 256."""
    monkeypatch.setitem(prop.FUSED, "cpu", "interpret")
    monkeypatch.setitem(prop.TILE, "cpu", 256)
    monkeypatch.setattr(prop, "SMALL_RUN_BOUND", {})  # small circuits too on the tiled engine
    monkeypatch.setenv(prop.NATIVE, "0")  # not the native engine, which CPUs' runs take where its C library is built
    monkeypatch.setattr(fused, "BLOCK", 64)
    return monkeypatch


def _layered(n: int, layers: int, rng) -> tuple[pp.Circuit, np.ndarray]:
    """Layers of one- and two-qubit rotations on disjoint qubits in shuffled orders (a layer's passes,
    its generators folded), a three-qubit rotation and Cliffords between them (gate tables and a
    quarter turn of a three-qubit generator)."""
    c, k = pp.Circuit(n), 0
    for _ in range(layers):
        k = disjoint_rotation_layer(c, rng, k, singles=("rx", "rz"))
        c.pauli_rotation("XYZ", [1, n - 2, n // 2], pp.Param(k)).cx(0, n - 1).h(n // 3)
        c.pauli_rotation("XZY", [0, n // 3, n - 1], math.pi / 2).s(n // 2)  # a Clifford turn of a generator
        k += 1
    return c, rng.uniform(-1.2, 1.2, size=k)


def _observable(n: int, rng) -> pp.PauliSum:
    terms = [("ZZ", [n // 2, n // 2 + 1], 1.0), ("XY", [0, n - 1], 0.5), ("Z", [int(rng.integers(n))], -0.25)]
    return pp.PauliSum.from_list(terms, n)


def _run(c, h, params, truncation):
    """(<0...0| the result |0...0>, dropped 1-norm per rule, peak terms, the live terms {(x bytes, z bytes):
    coefficient})."""
    out, stats = pp.propagate(c, h, params, truncation=truncation)
    x, z, coeffs = np.asarray(out.x), np.asarray(out.z), np.asarray(out.coeffs)
    terms = {(x[i].tobytes(), z[i].tobytes()): coeffs[i] for i in range(len(coeffs))}
    assert len(terms) == len(coeffs)  # distinct words
    value = float(np.sum(coeffs[~np.any(x != 0, axis=1)]))  # words without X or Y have overlap 1
    return value, np.asarray(stats.dropped_norm), int(stats.max_terms_seen), terms


def _assert_same(got, want, rtol=1e-12):
    """Word for word: the same peak, the same live words with the same coefficients, the same value (both
    compactions fill holes the same way, so the words come in the same order); the dropped 1-norm summed
    by block, not by tile."""
    assert got[0] == want[0] and got[2] == want[2] and got[3] == want[3]
    np.testing.assert_allclose(got[1], want[1], rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("n, layers, truncation", [
    (8, 3, pp.Truncation(min_abs_coeff=2e-3)),
    (40, 2, pp.Truncation(min_abs_coeff=3e-3, max_weight=6)),
    (70, 2, pp.Truncation(min_abs_coeff=3e-4, max_sins=6)),
    (127, 2, pp.Truncation(min_abs_coeff=5e-3, max_weight=7, per="layer")),
])
def test_kernels_give_the_xla_passes_answer(kernels, n, layers, truncation):
    rng = np.random.default_rng(n)
    c, params = _layered(n, layers, rng)
    h = _observable(n, rng)
    kernels.setitem(prop.FUSED, "cpu", "")
    want = _run(c, h, params, truncation)
    kernels.setitem(prop.FUSED, "cpu", "interpret")
    got = _run(c, h, params, truncation)
    assert want[2] > 256  # the terms spread over several tiles
    _assert_same(got, want)


@pytest.mark.parametrize("few", [0, 32])
def test_layers_found_by_parity_or_by_the_fold_give_the_xla_passes_answer(kernels, few):
    """Which rotations of a layer a word anticommutes with, found rotation by rotation (layers of at most
    fused.FEW; 32: every layer on one lane) or by the fold's byte tables (FEW 0: every layer), is the same."""
    rng = np.random.default_rng(7)
    c, params = _layered(40, 2, rng)
    h = _observable(40, rng)
    truncation = pp.Truncation(min_abs_coeff=3e-3, max_weight=6)
    kernels.setitem(prop.FUSED, "cpu", "")
    want = _run(c, h, params, truncation)
    kernels.setitem(prop.FUSED, "cpu", "interpret")
    default, fused.FEW = fused.FEW, few
    jax.clear_caches()  # FEW is read where the program is traced
    try:
        got = _run(c, h, params, truncation)
    finally:
        fused.FEW = default
        jax.clear_caches()
    _assert_same(got, want)


@pytest.mark.parametrize("n, rotations, few", [(40, 40, 0), (70, 70, fused.FEW), (12, 12, 32)])
def test_layers_of_rotations_sharing_qubits_give_the_xla_passes_answer(kernels, n, rotations, few):
    """Layers of commuting rotations on shared qubits (the fold maps a qubit to several rotations' bits, the bits
    are the rotations' places), over one to three lanes, found by the fold or by parity (layers of at most FEW)."""
    rng = np.random.default_rng(n)
    c, k = pp.Circuit(n), 0
    for _ in range(3):
        k = commuting_rotations(c, rng, k, rotations)
        c.h(int(rng.integers(n))).cx(0, n - 1).s(n // 2)
    h = _observable(n, rng)
    params = rng.uniform(-1.2, 1.2, size=k)
    truncation = pp.Truncation(min_abs_coeff=3e-3, max_weight=6)
    kernels.setitem(prop.FUSED, "cpu", "")
    want = _run(c, h, params, truncation)
    kernels.setitem(prop.FUSED, "cpu", "interpret")
    default, fused.FEW = fused.FEW, few
    jax.clear_caches()  # FEW is read where the program is traced
    try:
        got = _run(c, h, params, truncation)
    finally:
        fused.FEW = default
        jax.clear_caches()
    assert want[2] > 256  # the terms spread over several tiles
    _assert_same(got, want)


def test_words_wider_than_the_kernels_take_run_on_the_xla_passes(kernels):
    """Past FUSED_MAX_LANES lanes a word (the kernels' code is unrolled over them) a run takes XLA's passes,
    with their answer; at the limit it takes the kernels."""
    rng = np.random.default_rng(3)
    c, params = _layered(40, 2, rng)
    h = _observable(40, rng)
    truncation = pp.Truncation(min_abs_coeff=3e-3, max_weight=6)
    # the run's lanes: its light cone's qubits, renumbered (one lane here, where the circuit's words take two)
    low = prop.lowered(c, truncation, "cpu", layers=True, support=prop.observable_support(h), renumber=True)
    lanes = low.program.gx.shape[1]
    kernels.setattr(prop, "FUSED_MAX_LANES", lanes)
    assert prop.tiled_config(low, truncation, 1 << 12, "cpu").fused == "interpret"
    kernels.setattr(prop, "FUSED_MAX_LANES", lanes - 1)
    assert prop.tiled_config(low, truncation, 1 << 12, "cpu").fused == ""
    taken, config = [], prop.tiled_config

    def recorded(*args):  # the passes each program of the run is built with
        cfg = config(*args)
        taken.append(cfg.fused)
        return cfg

    kernels.setattr(prop, "tiled_config", recorded)
    got = _run(c, h, params, truncation)
    assert taken and set(taken) == {""}
    kernels.setitem(prop.FUSED, "cpu", "")
    _assert_same(got, _run(c, h, params, truncation), rtol=0)


def test_untruncated_kernels_equal_the_statevector(kernels):
    rng = np.random.default_rng(2)
    c, params = _layered(7, 3, rng)
    h = _observable(7, rng)
    exact = float(pp.expectation(c, h, params, method="statevector"))
    assert abs(float(pp.expectation(c, h, params)) - exact) < 1e-10
    work = next(iter(prop._WORKSPACE.values()))
    assert bool(np.all(np.asarray(work.table) == pairing.EMPTY)) and not bool(np.any(np.asarray(work.gone)))


def test_each_units_own_layer_tables_give_the_same_answer(kernels):
    """Past tiled.LAYER_TABLES_BYTES each unit makes its own layer tables in the loop (row 0 of tables of
    one unit) instead of the kernels reading its row of every unit's: word for word the same."""
    from pauliprop.propagation import tiled

    rng = np.random.default_rng(5)
    c, params = _layered(9, 3, rng)
    h = _observable(9, rng)
    truncation = pp.Truncation(min_abs_coeff=1e-3, max_weight=5)
    want = _run(c, h, params, truncation)
    kernels.setattr(tiled, "LAYER_TABLES_BYTES", 0)
    prop._tiled_jit.cache_clear()  # the constant is read when the program is traced
    try:
        got = _run(c, h, params, truncation)
    finally:
        prop._tiled_jit.cache_clear()
    _assert_same(got, want, rtol=0)


def test_pairing_in_a_half_full_table(kernels):
    """Linear probing with long runs of taken slots (the table part twice the words, not four times):
    every pair still meets, so the answer is unchanged."""
    rng = np.random.default_rng(4)
    c, params = _layered(10, 3, rng)
    h = _observable(10, rng)
    truncation = pp.Truncation(min_abs_coeff=1e-3)
    kernels.setattr(pairing, "LOAD", 2)
    got = _run(c, h, params, truncation)
    kernels.setitem(prop.FUSED, "cpu", "")
    want = _run(c, h, params, truncation)
    _assert_same(got, want)


def test_float32_kernels_give_the_xla_passes_answer(kernels):
    """Without x64 (float32 coefficients, as GPU users often run) the kernels still give the XLA passes'
    answer word for word."""
    import jax

    rng = np.random.default_rng(9)
    c, params = _layered(12, 3, rng)
    h = _observable(12, rng)
    truncation = pp.Truncation(min_abs_coeff=1e-3, max_weight=5, max_sins=6)
    with jax.enable_x64(False):
        got = _run(c, h, params.astype(np.float32), truncation)
        kernels.setitem(prop.FUSED, "cpu", "")
        want = _run(c, h, params.astype(np.float32), truncation)
    assert want[2] > 256
    _assert_same(got, want, rtol=1e-5)


@pytest.mark.parametrize("blocks, channels, live", [(48, 2, 32), (8, 1, 5), (32, None, 32), (16, 2, 0)])
def test_offsets_are_running_sums_of_the_live_blocks(monkeypatch, blocks, channels, live):
    """`offsets`: each live block's base (a block holds the words [4 b, 4 b + 4)) is the start plus every
    count before it (each channel on its own) and the total their sum, whether the blocks take one scan or
    several (BLOCK 4: 48 blocks in twelve); the counts of blocks past the live words (never written by the
    kernels) are not read."""
    from types import SimpleNamespace

    monkeypatch.setattr(fused, "BLOCK", 4)
    rng = np.random.default_rng(blocks)
    shape = (blocks,) + ((channels,) if channels else ())
    counts = rng.integers(0, 50, shape).astype(np.int32)
    counts[live:] = 1 << 20  # unwritten
    words = max(4 * live - 3, 0)  # the last live block holds one word
    scal = np.array([words, 7], np.int32)
    base, total = fused.offsets(counts, scal, SimpleNamespace(fused="interpret", tile=4), start_at=1)
    flat = counts[:live].reshape(live, channels or 1)
    want = 7 + np.cumsum(flat, axis=0) - flat
    np.testing.assert_array_equal(np.asarray(base)[:live].reshape(live, channels or 1), want)
    np.testing.assert_array_equal(np.asarray(total).reshape(-1), flat.sum(axis=0))
