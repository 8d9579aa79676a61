"""Many-shot samplers with Stim's API: `compile_sampler` (measurement records) and
`compile_detector_sampler` (detection events and observable flips).

The circuit is lowered once (`stabilizer.program`); one noiseless reference shot runs it on the
tableau (random outcomes taken as 0), then Pauli frames run it for all shots (`stabilizer.frames`),
in chunks so that any number of shots fits in memory. Each is one compiled scan per circuit.
Output layouts follow Stim: (shots, bits) of bool, or bit-packed uint8 rows (little-endian bits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import frames as _f
from . import program as _p
from . import tableau as _t
from .circuit import Circuit

_CHUNK_BYTES = None  # working-set budget of one chunk of shots; None: an eighth of device memory


def _chunk_bytes() -> int:
    if _CHUNK_BYTES is not None:
        return _CHUNK_BYTES
    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return max(1 << 26, limit // 8) if limit else 1 << 28  # CPUs report no limit: 256 MiB


def reference_sample(circuit: Circuit) -> np.ndarray:
    """A noiseless measurement record (random outcomes taken as 0), as Stim's `reference_sample`."""
    circuit = circuit if isinstance(circuit, Circuit) else Circuit(circuit)
    return _reference(_p.lowered(circuit))


def _reference(prog: _p.Program) -> np.ndarray:
    rec = _t.reference_record(prog.structure(), _p.device_tables(prog), prog.num_qubits, prog.num_measurements)
    return np.asarray(rec, dtype=bool)


@jax.jit
def _xor_rows(rows, idx):
    """Parity of the listed rows for each output: rows (R, words) with a zero row last; idx (D, L)."""
    return jax.lax.reduce(rows[idx], jnp.uint32(0), jax.lax.bitwise_xor, (1,))


def _index_table(lists: list[list[int]], zero_row: int) -> np.ndarray:
    width = max([1] + [len(ix) for ix in lists])
    idx = np.full((len(lists), width), zero_row, np.int32)
    for i, ix in enumerate(lists):
        idx[i, :len(ix)] = ix
    return idx


def _unpack(words: jax.Array, shots: int) -> np.ndarray:
    """(rows, words) uint32 -> (shots, rows) bool."""
    a = np.asarray(words)
    if a.shape[0] == 0:
        return np.zeros((shots, 0), bool)
    bits = np.unpackbits(np.ascontiguousarray(a).view(np.uint8), axis=1, bitorder="little")[:, :shots]
    return bits.T.astype(bool)


def _finish(bits: np.ndarray, bit_packed: bool) -> np.ndarray:
    return np.packbits(bits, axis=1, bitorder="little") if bit_packed else bits


class _Sampler:
    def __init__(self, circuit, *, seed: int | None = None):
        self.circuit = circuit if isinstance(circuit, Circuit) else Circuit(circuit)
        self.program = _p.lowered(self.circuit)
        self._structure = self.program.structure()
        self._tables = _p.device_tables(self.program)
        self._key = jax.random.key(np.random.SeedSequence(seed).generate_state(1)[0] if seed is None else seed)
        self._calls = 0

    def _chunks(self, shots: int):
        """Yield (shots in chunk, record flips (M + 1, words) with a zero last row) chunk by chunk."""
        if not isinstance(shots, (int, np.integer)) or isinstance(shots, bool) or shots < 0:
            raise ValueError(f"shots must be a non-negative int, got {shots!r}")
        prog = self.program
        per_word = 4 * (2 * (prog.num_qubits + 1) + prog.num_measurements + 1 + 100 * prog.width
                        + len(prog.detectors) + len(prog.observables))
        fit = max(1, _chunk_bytes() // per_word)
        chunk_words = 1 << (fit.bit_length() - 1)
        self._calls += 1
        call_key = jax.random.fold_in(self._key, self._calls)
        done = 0
        while done < shots:
            # a power-of-two number of words per chunk: calls with other shot counts reuse the compiles
            words = min(_p.bucket(-(-(shots - done) // 32)), chunk_words)
            n = min(32 * words, shots - done)
            flips = _f.run_program(self._structure, self._tables, jax.random.fold_in(call_key, done),
                                   prog.num_qubits, prog.num_measurements, words)
            yield n, jnp.concatenate([flips, jnp.zeros((1, words), jnp.uint32)])
            done += n


class CompiledMeasurementSampler(_Sampler):
    """`sample(shots)`: (shots, num_measurements) outcomes; noise sampled per shot."""

    def __init__(self, circuit, *, seed: int | None = None, skip_reference_sample: bool = False):
        super().__init__(circuit, seed=seed)
        self.reference = (np.zeros(self.circuit.num_measurements, bool) if skip_reference_sample
                          else _reference(self.program))

    def sample(self, shots: int, *, bit_packed: bool = False) -> np.ndarray:
        parts = [_unpack(rows[:-1], n) ^ self.reference for n, rows in self._chunks(shots)]
        bits = np.concatenate(parts) if parts else np.zeros((0, self.circuit.num_measurements), bool)
        return _finish(bits, bit_packed)


class CompiledDetectorSampler(_Sampler):
    """`sample(shots)`: detection events (and observable flips), relative to the noiseless reference."""

    def sample(self, shots: int, *, prepend_observables: bool = False, append_observables: bool = False,
               separate_observables: bool = False, bit_packed: bool = False):
        c, prog = self.circuit, self.program
        zero = prog.num_measurements
        det_idx = jnp.asarray(_index_table(prog.detectors, zero))
        obs_idx = jnp.asarray(_index_table(prog.observables, zero))
        dets, obs = [], []
        for n, rows in self._chunks(shots):
            dets.append(_unpack(_xor_rows(rows, det_idx), n) if prog.detectors else np.zeros((n, 0), bool))
            obs.append(_unpack(_xor_rows(rows, obs_idx), n) if prog.observables else np.zeros((n, 0), bool))
        d = np.concatenate(dets) if dets else np.zeros((0, c.num_detectors), bool)
        o = np.concatenate(obs) if obs else np.zeros((0, c.num_observables), bool)
        if separate_observables:
            return _finish(d, bit_packed), _finish(o, bit_packed)
        parts = ([o] if prepend_observables else []) + [d] + ([o] if append_observables else [])
        return _finish(np.concatenate(parts, axis=1), bit_packed)


def compile_sampler(circuit, *, seed: int | None = None, skip_reference_sample: bool = False):
    return CompiledMeasurementSampler(circuit, seed=seed, skip_reference_sample=skip_reference_sample)


def compile_detector_sampler(circuit, *, seed: int | None = None):
    return CompiledDetectorSampler(circuit, seed=seed)
