"""The samplers' C engine (stabilizer/frames/native.py, _frames.c): on random circuits of every gate, noise
channel, measurement, reset, feedback, padding and repeat kind its measurement and detection statistics equal
Stim's within 5 sigma; noiseless it gives exactly the reference record, which equals Stim's reference sample;
its outputs have the JAX sampler's layouts and shapes, the same shots whatever the threads; bad input is
refused; without the library (or with STABILIZER_NATIVE=0) the samplers run the JAX programs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import stabilizer.frames.sampler as S
from stabilizer.circuits import program as P
from stabilizer.circuits.circuit import Circuit

from ..tableau.test_tableau import STIM_GATES

stim = pytest.importorskip("stim")
native = pytest.importorskip("stabilizer.frames.native", reason="the C library was not built (no C compiler)")

pytestmark = pytest.mark.skipif(S.native_engine() is None, reason="the samplers run the C engine on CPUs only")

SHOTS = 4096
NOISE_1 = ["X_ERROR", "Y_ERROR", "Z_ERROR", "DEPOLARIZE1"]
MEASURES = ["M", "MX", "MY", "MR", "MRX", "MRY"]


def _p(rng) -> float:
    """A probability for the sparse draws (at most native's DENSE_MIN 0.25) or the dense ones."""
    return float(rng.choice([0.003, 0.05, 0.2, 0.4, 0.8]))


def _random_body(rng, n: int, length: int, measured: int, noisy: bool) -> tuple[list[str], int]:
    lines = []
    for _ in range(length):
        r = rng.random()
        if r < 0.4:
            g = STIM_GATES[rng.integers(len(STIM_GATES))]
            k = P.gate_action(g)[2]
            lines.append(f"{g} " + " ".join(map(str, rng.choice(n, size=2 * k, replace=False))))
        elif r < 0.5:
            q = rng.choice(n, size=2, replace=False)
            flip = f"({_p(rng)})" if noisy and rng.random() < 0.3 else ""
            lines.append(f"{MEASURES[rng.integers(6)]}{flip} {'!' if rng.random() < 0.3 else ''}{q[0]} {q[1]}")
            measured += 2
        elif r < 0.55:
            lines.append(f"{['R', 'RX', 'RY'][rng.integers(3)]} {rng.integers(n)}")
        elif r < 0.62:
            qs, ps = rng.choice(n, size=3, replace=False), rng.choice(list("XYZ"), size=3)
            flip = f"({_p(rng)})" if noisy and rng.random() < 0.3 else ""
            lines.append(f"MPP{flip} {'!' if rng.random() < 0.3 else ''}{ps[0]}{qs[0]}*{ps[1]}{qs[1]} {ps[2]}{qs[2]}")
            measured += 2
        elif r < 0.67:
            a, b = rng.choice(n, size=2, replace=False)
            lines.append(f"M{'XYZ'[rng.integers(3)] * 2} {a} {'!' if rng.random() < 0.3 else ''}{b}")
            measured += 1
        elif r < 0.7:
            flip = f"({_p(rng)})" if noisy and rng.random() < 0.5 else ""
            lines.append(f"MPAD{flip} {rng.integers(2)} {rng.integers(2)}")
            measured += 2
        elif r < 0.78:
            if measured:
                k = int(rng.integers(1, min(measured, 4) + 1))
                gate = ["CX", "CY", "CZ"][rng.integers(3)]
                lines.append(f"{gate} rec[-{k}] {rng.integers(n)}" if rng.random() < 0.5 or gate != "CZ"
                             else f"CZ {rng.integers(n)} rec[-{k}]")
        elif noisy and r < 0.88:
            q = rng.choice(n, size=2, replace=False)
            kind = rng.integers(4)
            if kind == 0:
                lines.append(f"{NOISE_1[rng.integers(4)]}({_p(rng)}) {q[0]} {q[1]}")
            elif kind == 1:
                probs = rng.dirichlet(np.ones(3)) * _p(rng)
                lines.append("PAULI_CHANNEL_1({:.6f}, {:.6f}, {:.6f}) {} {}".format(*probs, *q))
            elif kind == 2:
                lines.append(f"DEPOLARIZE2({_p(rng)}) {q[0]} {q[1]}")
            else:
                probs = rng.dirichlet(np.ones(15)) * _p(rng) * (rng.random(15) < 0.6)
                lines.append("PAULI_CHANNEL_2(" + ", ".join(f"{v:.6f}" for v in probs) + f") {q[0]} {q[1]}")
        elif noisy and r < 0.94:
            qs, ps = rng.choice(n, size=3, replace=False), rng.choice(list("XYZ"), size=3)
            lines.append(f"E({_p(rng)}) {ps[0]}{qs[0]} {ps[1]}{qs[1]}\nELSE_CORRELATED_ERROR({_p(rng)}) {ps[2]}{qs[2]}")
    return lines, measured


def random_circuit(seed: int, n: int = 6, noisy: bool = True) -> str:
    """Gates of every Stim name, measurements in every basis (inverted, noisy), resets, Pauli products, pair
    measurements, padding, feedback, noise channels (sparse and dense draws), correlated error chains, and a
    REPEAT with a nested REPEAT, whose bodies hold the same kinds."""
    rng = np.random.default_rng(seed)
    head, measured = _random_body(rng, n, 30, 0, noisy)
    outer, measured = _random_body(rng, n, 10, measured, noisy)
    inner, measured = _random_body(rng, n, 8, measured, noisy)
    tail, measured = _random_body(rng, n, 20, measured, noisy)
    return "\n".join(head + ["REPEAT 3 {"] + outer + ["REPEAT 2 {"] + inner + ["}", "}"] + tail
                     + [f"M {' '.join(map(str, range(n)))}"])


def _sigmas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|mean(a) - mean(b)| per column in units of the pooled sampling sigma (bool arrays of shots x columns)."""
    pa, pb = a.mean(0), b.mean(0)
    pooled = (pa + pb) / 2
    sigma = np.sqrt(np.maximum(pooled * (1 - pooled), 1 / len(a)) * (1 / len(a) + 1 / len(b)))
    return np.abs(pa - pb) / sigma


def _with_pairs(bits: np.ndarray) -> np.ndarray:
    """Each column and the XOR of each column with the next (correlations a marginal would not show)."""
    return np.concatenate([bits, bits[:, 1:] ^ bits[:, :-1]], axis=1)


@pytest.mark.parametrize("seed", range(12))
def test_measurement_statistics_equal_stims_on_random_circuits(seed):
    """Every measurement's rate and every neighbouring pair's parity rate within 5 sigma of Stim's."""
    text = random_circuit(seed)
    sampler = S.compile_sampler(Circuit(text), seed=seed)
    assert sampler.engine == "native"
    ours = sampler.sample(SHOTS)
    theirs = stim.Circuit(text).compile_sampler(seed=seed).sample(SHOTS)
    assert ours.shape == theirs.shape
    sig = _sigmas(_with_pairs(ours), _with_pairs(theirs))
    assert sig.max() < 5, (sig.max(), text)


@pytest.mark.parametrize("seed", range(30))
def test_reference_equals_stims_and_noiseless_shots_are_determined(seed):
    """The reference record equals Stim's reference sample; noiseless, every measurement Stim finds
    determined (one value in all its shots) takes that value in every shot of ours."""
    text = random_circuit(100 + seed, noisy=False)
    c = stim.Circuit(text)
    want = c.reference_sample()
    np.testing.assert_array_equal(S.reference_sample(Circuit(text)), want, err_msg=text)
    sampler = S.compile_sampler(Circuit(text), seed=seed)
    np.testing.assert_array_equal(sampler.reference, want)
    ours, theirs = sampler.sample(512), c.compile_sampler(seed=seed).sample(512)
    fixed = np.all(theirs == theirs[:1], axis=0)
    assert fixed.any()
    np.testing.assert_array_equal(ours[:, fixed], np.broadcast_to(theirs[0, fixed], ours[:, fixed].shape))


@pytest.mark.parametrize("seed", range(4))
def test_reference_of_many_random_measurements_equals_stims(seed):
    """Measurement ops of 8 or more slots that meet a random outcome collapse on the transposed tableau
    (_frames.c, TRANSPOSE_MIN): after random layers on 70 qubits (row and column words cross 64), measure-all
    ops in Z, X and Y with inverted targets and resets, one whose first targets are determined, and a
    second round on the collapsed state give Stim's reference sample."""
    rng = np.random.default_rng(seed)
    n = 70
    lines = []
    for _ in range(6):
        perm = rng.permutation(n)
        for a, b in perm[:40].reshape(-1, 2):
            lines.append(f"{['CX', 'CZ', 'ISWAP', 'SQRT_XX', 'CY'][rng.integers(5)]} {a} {b}")
        lines += [f"{['H', 'S', 'SQRT_X', 'C_XYZ', 'H_YZ'][rng.integers(5)]} {q}" for q in perm[40:]]
    targets = lambda qs: " ".join(("!" if rng.random() < 0.3 else "") + str(q) for q in qs)
    order = rng.permutation(n)
    flips = " ".join(map(str, rng.permutation(n)[:35]))  # the collapsed basis state's bits: signs matter below
    pairs = " ".join(map(str, rng.permutation(n)[:40]))
    text = "\n".join(lines + [f"M {targets(range(5))}", f"MR {targets(order[:35])}", f"MX {targets(range(30, 60))}",
                               f"MY {targets(order[35:])}", f"M {targets(range(n))}", f"X {flips}\nCX {pairs}",
                               "H 3 7 11 40\nS 7\nCX 3 4 7 8 11 12 40 41\nH 11", f"M {targets(range(n))}",
                               f"MX {targets(range(n))}"])
    np.testing.assert_array_equal(S.reference_sample(Circuit(text)), stim.Circuit(text).reference_sample())


@pytest.mark.parametrize("code,d", [("surface_code:rotated_memory_x", 5), ("surface_code:rotated_memory_z", 7),
                                    ("surface_code:unrotated_memory_z", 3), ("color_code:memory_xyz", 5),
                                    ("repetition_code:memory", 9)])
def test_noiseless_codes_give_the_reference_and_never_fire(code, d):
    c = stim.Circuit.generated(code, distance=d, rounds=d)
    dets, obs = S.compile_detector_sampler(Circuit(c), seed=0).sample(1000, separate_observables=True)
    assert dets.shape == (1000, c.num_detectors) and obs.shape == (1000, c.num_observables)
    assert not dets.any() and not obs.any()
    np.testing.assert_array_equal(S.reference_sample(Circuit(c)), c.reference_sample())


@pytest.mark.parametrize("code,d,p", [("surface_code:rotated_memory_z", 5, 0.01), ("surface_code:rotated_memory_x", 7, 0.003),
                                      ("color_code:memory_xyz", 5, 0.02), ("repetition_code:memory", 7, 0.27)])
def test_detection_statistics_equal_stims_on_codes(code, d, p):
    """Each detector's and observable's rate, and each neighbouring detector pair's parity rate, within
    5 sigma of Stim's (p = 0.27 draws the repetition code's noise densely)."""
    c = stim.Circuit.generated(code, distance=d, rounds=d, after_clifford_depolarization=p,
                               before_measure_flip_probability=p, after_reset_flip_probability=p,
                               before_round_data_depolarization=p)
    shots = 1 << 14
    ours = S.compile_detector_sampler(Circuit(c), seed=1).sample(shots, append_observables=True)
    theirs = c.compile_detector_sampler(seed=1).sample(shots, append_observables=True)
    sig = _sigmas(_with_pairs(ours), _with_pairs(theirs))
    assert sig.max() < 5, sig.max()
    assert 0.005 < ours[:, :c.num_detectors].mean() < 0.6


@pytest.mark.parametrize("p", [0.0, 1e-3, 0.25, 0.3, 1.0])
def test_flips_hit_every_position_with_probability_p(p):
    """130 qubits over 4 chunks: every qubit's rate, every bit of the word's and every chunk's is p (exactly
    at 0 and 1), on both sides of the sparse draw's limit."""
    n = 130
    text = f"X_ERROR({p}) {' '.join(map(str, range(n)))}\nM {' '.join(map(str, range(n)))}"
    shots = 4 * 64 * native.CHUNK_WORDS
    bits = S.compile_sampler(Circuit(text), seed=4).sample(shots)
    if p in (0.0, 1.0):
        assert np.all(bits == p)
        return
    sigma = lambda count: np.sqrt(p * (1 - p) / count)
    assert abs(bits.mean() - p) < 5 * sigma(bits.size)
    by_bit = bits.reshape(-1, 64, n).mean(axis=(0, 2))
    by_chunk = bits.reshape(4, -1, n).mean(axis=(1, 2))
    for means, count in ((bits.mean(axis=0), shots), (by_bit, bits.size / 64), (by_chunk, bits.size / 4)):
        assert np.all(np.abs(means - p) < 5 * sigma(count)), means


def test_outputs_have_the_jax_samplers_layouts(monkeypatch):
    """The layouts of both samplers (bool, packed, on the device; observables separate, appended or
    prepended) have the JAX sampler's shapes, types and dtypes; packed outputs are np.packbits of the bool
    ones (the same shots for a seed), and the layouts hold the same rows."""
    c = Circuit(stim.Circuit.generated("repetition_code:memory", distance=3, rounds=3, before_measure_flip_probability=0.1))
    layouts = [{}, {"separate_observables": True}, {"append_observables": True, "bit_packed": True},
               {"prepend_observables": True}, {"bit_packed": True, "on_device": True, "separate_observables": True}]
    shots = 101

    def outputs(engine, layouts):
        if engine == "jax":
            monkeypatch.setenv(S.NATIVE, "0")
        else:
            monkeypatch.delenv(S.NATIVE, raising=False)
        det = [S.compile_detector_sampler(c, seed=5).sample(shots, **kw) for kw in layouts]
        meas = [S.compile_sampler(c, seed=6).sample(shots, **kw) for kw in ({}, {"bit_packed": True})]
        assert S.compile_sampler(c).engine == engine
        return det + meas

    flat = lambda out: out if isinstance(out, tuple) else (out,)
    ours = outputs("native", layouts)
    jax_layouts = [layouts[i] for i in (0, 2, 4)]  # (each JAX layout compiles its program: seconds)
    for a, b in zip([ours[i] for i in (0, 2, 4, 5, 6)], outputs("jax", jax_layouts)):
        assert type(a) is type(b) and len(flat(a)) == len(flat(b))
        for x, y in zip(flat(a), flat(b)):
            assert type(x) is type(y) and x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape)
    pack = lambda a: np.packbits(a, axis=1, bitorder="little")
    dets, obs = ours[1]
    assert dets.shape == (shots, c.num_detectors) and obs.shape == (shots, c.num_observables) and dets.any()
    np.testing.assert_array_equal(ours[0], dets)
    np.testing.assert_array_equal(ours[2], pack(np.concatenate([dets, obs], axis=1)))
    np.testing.assert_array_equal(ours[3], np.concatenate([obs, dets], axis=1))
    np.testing.assert_array_equal(np.asarray(ours[4][0]), pack(dets))
    np.testing.assert_array_equal(np.asarray(ours[4][1]), pack(obs))
    assert ours[5].shape == (shots, c.num_measurements)
    np.testing.assert_array_equal(ours[6], pack(ours[5]))


def test_shots_do_not_depend_on_the_threads(monkeypatch):
    """A seed gives the same shots on one thread and on three (chunks are seeded by their index), and a
    second call gives new shots."""
    c = Circuit(stim.Circuit.generated("surface_code:rotated_memory_z", distance=3, rounds=3,
                                       after_clifford_depolarization=0.01))
    shots = 5 * 64 * native.CHUNK_WORDS + 17
    got = {}
    for threads in ("1", "3"):
        monkeypatch.setenv(native.THREADS, threads)
        s = S.compile_detector_sampler(c, seed=11)
        got[threads] = s.sample(shots, bit_packed=True), s.sample(shots, bit_packed=True)
    np.testing.assert_array_equal(got["1"][0], got["3"][0])
    np.testing.assert_array_equal(got["1"][1], got["3"][1])
    assert not np.array_equal(got["1"][0], got["1"][1])


def test_many_measurements_take_smaller_chunks(monkeypatch):
    """A record that would outgrow CHUNK_RECORD_BYTES at CHUNK_WORDS words gets fewer words a chunk (here
    5: 3,000 measurements in 2^17 bytes), and its shots keep their statistics across the chunks."""
    monkeypatch.setattr(native, "CHUNK_RECORD_BYTES", 1 << 17)
    n = 3000
    text = f"X_ERROR(0.1) {' '.join(map(str, range(n)))}\nM {' '.join(map(str, range(n)))}"
    s = S.compile_sampler(Circuit(text), seed=0)
    assert s._native.chunk_words(10**6) == 5
    bits = s.sample(1000)
    assert bits.shape == (1000, n) and abs(bits.mean() - 0.1) < 5 * np.sqrt(0.09 / bits.size)
    per_chunk = [bits[i:i + 320].mean() for i in range(0, 1000, 320)]
    assert np.all(np.abs(np.array(per_chunk) - 0.1) < 5 * np.sqrt(0.09 / (320 * n))), per_chunk


def test_bad_input_is_refused(monkeypatch):
    c = Circuit("X_ERROR(0.1) 0\nM 0 1")
    s = S.compile_sampler(c, seed=0)
    prog, out = s._native, native.output([[0], [1]])
    with pytest.raises(TypeError, match="C-ordered int32 arrays here, not C-ordered int64"):
        native.sample(prog, [out._replace(idx=out.idx.astype(np.int64))], 10, False, (0, 0))
    with pytest.raises(TypeError, match="not strided int64"):
        native.sample(prog, [out._replace(ptr=np.repeat(out.ptr, 2)[::2])], 10, False, (0, 0))
    with pytest.raises(ValueError, match="outside the 2 measurements"):
        native.sample(prog, [native.output([[0], [2]])], 10, False, (0, 0))
    with pytest.raises(ValueError, match="one or two outputs"):
        native.sample(prog, [out] * 3, 10, False, (0, 0))
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv(native.THREADS, bad)
        with pytest.raises(ValueError, match=f"STABILIZER_NATIVE_THREADS must be a positive integer, not '{bad}'"):
            s.sample(10)
    monkeypatch.delenv(native.THREADS)
    with pytest.raises(TypeError, match="seed must be an int or None"):
        S.compile_sampler(c, seed=1.5)
    with pytest.raises(ValueError, match="shots must be a non-negative int"):
        s.sample(-3)
    assert s.sample(0).shape == (0, 2)


def test_stabilizer_native_0_runs_the_jax_programs(monkeypatch):
    monkeypatch.setenv(S.NATIVE, "0")
    s = S.compile_detector_sampler(Circuit("X_ERROR(1) 0\nM 0\nDETECTOR rec[-1]"), seed=0)
    assert s.engine == "jax" and s.sample(40).all()


def test_stabilizer_native_host_runs_the_c_loops_beside_a_gpu(monkeypatch):
    """STABILIZER_NATIVE picks the engine: by default the C loops only where JAX's backend is the CPU, `host`
    wherever it is (the same shots for a seed), 0 never; another value is refused, naming the variable."""
    c = Circuit(stim.Circuit.generated("repetition_code:memory", distance=3, rounds=3,
                                       before_measure_flip_probability=0.1))
    want = S.compile_detector_sampler(c, seed=3).sample(64, bit_packed=True)
    monkeypatch.setattr(S.jax, "default_backend", lambda: "gpu")  # a GPU machine, as the engine choice sees it
    assert S.native_engine() is None
    monkeypatch.setenv(S.NATIVE, "host")
    s = S.compile_detector_sampler(c, seed=3)
    assert s.engine == "native"
    np.testing.assert_array_equal(s.sample(64, bit_packed=True), want)
    monkeypatch.setenv(S.NATIVE, "0")
    assert S.native_engine() is None
    monkeypatch.setenv(S.NATIVE, "yes")
    with pytest.raises(ValueError, match="STABILIZER_NATIVE must be one of 0, 1, host, not 'yes'"):
        S.compile_detector_sampler(c)


def test_without_the_library_the_samplers_run_the_jax_programs():
    """A process where the C library cannot be imported (as after an install without a C compiler) samples
    with the JAX programs, and its reference sample is Stim's."""
    code = ("import sys; sys.modules['stabilizer.frames._frames'] = None\n"
            "import numpy as np, stabilizer as st\n"
            "from stabilizer.frames import sampler as S\n"
            "c = st.Circuit('H 0\\nCX 0 1\\nX_ERROR(1) 1\\nM 0 1\\nDETECTOR rec[-1] rec[-2]')\n"
            "s = st.compile_detector_sampler(c, seed=0)\n"
            "assert S.native_engine() is None and s.engine == 'jax', s.engine\n"
            "assert s.sample(64).all()\n"
            "assert st.compile_sampler(c).engine == 'jax'\n"
            "print('ok', st.reference_sample(c).astype(int).tolist())\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop(S.NATIVE, None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == "ok [0, 0]"  # the Bell pair's random outcome taken as 0, noiseless
