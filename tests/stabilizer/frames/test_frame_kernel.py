"""The frame program's Pallas kernel (stabilizer/frames/frame_kernel.py), compiled on a GPU and
interpreted on the CPU: where the frames are determined (gates, certain errors, records, feedback) it
equals the scan of stabilizer/frames/frames.py bit for bit; where they are random, its events and
flips have the channel's probabilities, and the samplers built on it match Stim."""

from __future__ import annotations

from functools import partial

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import stabilizer.frames.sampler as S
from stabilizer.circuits import program as P
from stabilizer.circuits.circuit import Circuit
from stabilizer.frames import frame_kernel as K
from stabilizer.frames import frames as F

from ..tableau.test_tableau import STIM_GATES
from .test_sampler import CIRCUITS, SHOTS, _noisy, _tv, check_surface_rates

stim = pytest.importorskip("stim")

KERNEL = "pallas" if jax.default_backend() == "gpu" else "interpret"


def _bits(words) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(np.asarray(words)).view(np.uint8), axis=-1, bitorder="little")


def _record(text: str, words: int, kernel: str, seed: int = 0) -> np.ndarray:
    prog = P.lower(Circuit(text))
    return np.asarray(F.run_program(prog.structure(), prog.tables(), jax.random.key(seed), prog.num_qubits,
                                    prog.num_measurements, words, kernel=kernel))


@pytest.fixture
def kernel_sampler(monkeypatch):
    """The samplers with their frames run by the kernel (on the CPU: interpreted); the test fails if
    no sampler traced the kernel."""
    traced = []
    run_segments = K.run_segments
    monkeypatch.setenv(S.NATIVE, "0")  # on CPUs the samplers would run the C engine
    monkeypatch.setattr(F, "frame_engine", lambda kernel, words: KERNEL)
    monkeypatch.setattr(K, "run_segments", lambda *a, **k: traced.append(1) or run_segments(*a, **k))
    S._chunk.clear_cache()  # a program traced before the patch would not trace the kernel again
    yield
    assert traced, "the samplers did not run the frame kernel"


def test_threefry_is_jaxs():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**32, (6, 2), dtype=np.uint64).astype(np.uint32)
    counts = rng.integers(0, 2**32, (6, 2), dtype=np.uint64).astype(np.uint32)
    for key, count in zip(keys, counts):
        want = np.asarray(jax.extend.random.threefry_2x32(jnp.asarray(key), jnp.asarray(count)))
        got = K.threefry2x32(*(jnp.uint32(v) for v in (*key, *count)))
        np.testing.assert_array_equal(want, np.array(got))


def _determined_circuit(seed: int, qubits: int = 6) -> str:
    """Every Stim gate on random qubits, certain Pauli errors and correlated errors between them, in a
    REPEAT; then measurements, certain flips, padding, feedback and more measurements. The initial
    frames' random Z parts reach the records only through gates, which both runners apply to the same
    initial frames, and a measurement's new random Z part never reaches an X part (no gate follows it)."""
    rng = np.random.default_rng(seed)
    lines = []
    for name in rng.permutation(STIM_GATES):
        arity = P.gate_action(str(name))[2]
        targets = rng.permutation(qubits)[:2 * arity]
        lines.append(f"{name} " + " ".join(map(str, targets)))
        error = rng.choice(["X_ERROR(1)", "Y_ERROR(1)", "Z_ERROR(1)", "PAULI_CHANNEL_1(0, 1, 0)",
                            "E(1) X0 Z3", "ELSE_CORRELATED_ERROR(1) Y1", "X_ERROR(0)"])
        lines.append(error if error.startswith(("E", "ELSE")) else f"{error} {rng.integers(qubits)}")
    body = "\n".join(lines)
    return (f"REPEAT 2 {{\n{body}\n}}\n{body}\nM(1) 0 2\nM 1 3 4 5\nMPAD 1 0\nCX rec[-1] 0 rec[-3] 4\n"
            f"CZ rec[-2] 1\nX_ERROR(1) 5\nM 0 1 4 5\nMR 2\nM 2")


@pytest.mark.parametrize("words", [1, 4, 64], ids=["one word", "four words", "two programs"])
def test_determined_records_equal_the_scans(words):
    for seed in range(2):
        text = _determined_circuit(seed)
        want, got = (_record(text, words, kernel) for kernel in ("jax", KERNEL))
        np.testing.assert_array_equal(got, want, err_msg=text)
        assert want[:-1].any() and not got[-1].any()  # records carry flips; the zero row stays zero


_PAULI_CHANNEL_2 = np.linspace(0.01, 0.05, 15) * 0.6 / np.linspace(0.01, 0.05, 15).sum()


@pytest.mark.parametrize("probs", [_PAULI_CHANNEL_2, np.full(15, 0.3 / 15)], ids=["PAULI_CHANNEL_2", "DEPOLARIZE2"])
def test_pair_noise_events_have_their_probabilities(probs, kernel_sampler):
    """Bell pairs (0, 2) and (1, 3) read out after the channel on 0 and 1 give each shot's event
    (z_a, z_b, x_a, x_b): each of the 15 with its probability over 2**14 shots."""
    channel = "PAULI_CHANNEL_2(" + ", ".join(f"{p:.17g}" for p in probs) + ") 0 1"
    text = f"H 0 1\nCX 0 2 1 3\n{channel}\nCX 0 2 1 3\nH 0 1\nM 0 1 2 3"
    bits = S.compile_sampler(Circuit(text), seed=3).sample(1 << 14).astype(int)
    codes = bits[:, 2] | bits[:, 0] << 1 | bits[:, 3] << 2 | bits[:, 1] << 3
    for k, (a, b) in enumerate(P.PAIRS):
        code = P._XBIT[a] | P._ZBIT[a] << 1 | P._XBIT[b] << 2 | P._ZBIT[b] << 3
        rate = np.mean(codes == code)
        assert abs(rate - probs[k]) < 5 * np.sqrt(probs[k] / len(codes)), (a + b, rate, probs[k])
    assert abs(np.mean(codes == 0) - (1 - probs.sum())) < 5 * np.sqrt(probs.sum() / len(codes))


@pytest.mark.parametrize("p", [0.0, 2e-3, 0.4, 1.0])
def test_flips_hit_every_position_with_probability_p(p):
    """40 qubits (two tiles of slots) over 64 words (two programs): the rate is p (exactly at 0 and 1)
    in every qubit, every bit of the word and every word; a gap, tile or block error would bias one."""
    text = "X_ERROR({}) {}\nM {}".format(p, " ".join(map(str, range(40))), " ".join(map(str, range(40))))
    bits = _bits(_record(text, 64, KERNEL, seed=4))[:40]  # (40 qubits, 64 * 32 shots)
    if p in (0.0, 1.0):
        assert np.all(bits == p)
        return
    sigma = lambda n: np.sqrt(p * (1 - p) / n)
    assert abs(bits.mean() - p) < 5 * sigma(bits.size)
    for axis_means, n in ((bits.mean(axis=1), bits.shape[1]),
                          (bits.reshape(40, 64, 32).mean(axis=(0, 1)), bits.size / 32),
                          (bits.reshape(40, 64, 32).mean(axis=(0, 2)), bits.size / 64)):
        assert np.all(np.abs(axis_means - p) < 5 * sigma(n)), axis_means


def test_else_fires_only_where_the_chain_has_not(kernel_sampler):
    text = "E(0.3) X0\nELSE_CORRELATED_ERROR(0.5) X1\nELSE_CORRELATED_ERROR(1) X2\nM 0 1 2"
    bits = S.compile_sampler(Circuit(text), seed=5).sample(1 << 13)
    assert not np.any(bits.sum(axis=1) != 1)  # exactly one of the chain fires (the last one is certain)
    for rate, p in zip(bits.mean(axis=0), (0.3, 0.35, 0.35)):
        assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / len(bits)), (rate, p)


@pytest.mark.parametrize("d", [3, 5])
def test_noisy_surface_code_rates_match_stim(d, kernel_sampler):
    """Each detector's and the observable's firing rate within 5 sigma of Stim's (as test_sampler)."""
    check_surface_rates(d)


@pytest.mark.parametrize("text", CIRCUITS)
def test_outcome_distributions_match_stim(text, kernel_sampler):
    ours = S.compile_sampler(Circuit(text), seed=2).sample(SHOTS)
    theirs = stim.Circuit(text).compile_sampler(seed=2).sample(SHOTS)
    k = len(np.unique(np.packbits(theirs, axis=1), axis=0))
    assert _tv(ours, theirs) < 3 * np.sqrt(k / SHOTS), (_tv(ours, theirs), k)


def test_frames_that_cannot_be_blocked_are_refused():
    prog = P.lower(Circuit("H 0\nM 0"))
    table, spans = K._concatenated(prog.structure(), prog.tables())
    x = jnp.zeros((2, 24), jnp.uint32)
    with pytest.raises(ValueError, match="cannot be blocked"):
        K.run_table(table, spans[0], x, x, jnp.zeros((2, 24), jnp.uint32), jnp.zeros((2, 24), jnp.uint32),
                    jnp.zeros(2, jnp.uint32), jnp.uint32(0), jnp.int32(0), interpret=True)


def test_the_kernel_lowers_to_triton_on_any_machine():
    """Lowering for CUDA runs Pallas's Triton lowering here too: a primitive it cannot lower (as
    jnp.any's reduce_or once was) fails on the CPU, not on a GPU machine. Every op kind is present."""
    text = (str(_noisy("surface_code:rotated_memory_z", 3, 1e-3)) + "\nE(0.1) X0\nELSE_CORRELATED_ERROR(0.2) Z1\n"
            "CX rec[-1] 2\nMPAD 1\nPAULI_CHANNEL_2(0.01,0,0,0,0,0,0,0,0,0,0,0,0,0,0.02) 0 1")
    prog = P.lower(Circuit(text))
    structure, tables = prog.structure(), prog.tables()
    with jax.enable_x64(True):
        lowered = F._run_kernel.trace(structure, tables, jax.random.key(0), prog.num_qubits, prog.num_measurements,
                                      128, "pallas").lower(lowering_platforms=("cuda",))
    assert "triton" in lowered.as_text()
