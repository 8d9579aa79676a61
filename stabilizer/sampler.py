"""Many-shot samplers with Stim's API: `compile_sampler` (measurement records) and
`compile_detector_sampler` (detection events and observable flips).

One noiseless reference shot from the tableau simulator (random outcomes taken as 0), then Pauli
frames for all shots (`stabilizer.frames`), in chunks so that any number of shots fits in memory.
Output layouts follow Stim: (shots, bits) of bool, or bit-packed uint8 rows (little-endian bits).
"""

from __future__ import annotations

from functools import cache

import jax
import jax.numpy as jnp
import numpy as np

from pauliprop import gates as _gates

from . import frames as _f
from .circuit import Circuit, CircuitInstruction, CircuitRepeatBlock, product_groups
from .simulator import (
    _FEEDBACK,
    _PAIRS,
    TableauSimulator,
    canonical_gate,
    disjoint_runs,
)

_CHUNK_BYTES = 1 << 28  # frames and flips of one chunk of shots stay under ~256 MiB
_X, _Z = {"X": 1, "Y": 1, "Z": 0, "I": 0}, {"X": 0, "Y": 1, "Z": 1, "I": 0}


class _NoRandomness:
    """The reference run's generator: random outcomes are 0 and no noise fires."""

    def integers(self, k):
        return 0

    def random(self):
        return 1.0


def reference_sample(circuit: Circuit) -> np.ndarray:
    """A noiseless measurement record (random outcomes chosen as 0), as Stim's `reference_sample`."""
    sim = TableauSimulator(num_qubits=circuit.num_qubits)
    sim._rng = _NoRandomness()
    sim.do(circuit)
    return np.array(sim.current_measurement_record(), dtype=bool)


@cache
def _forward_image(stim_name: str) -> tuple[np.ndarray, int]:
    """P -> G P G^dagger on local codes (frames move forward in time); signs are irrelevant to frames."""
    g = _gates.GATES[canonical_gate(stim_name)]
    image, _ = _gates.clifford_action(g.matrix().conj().T)
    return image.astype(np.int32), g.num_qubits


def _bucket(k: int) -> int:
    return 1 << max(0, (k - 1).bit_length())


def _padded(groups: list[tuple], fill=None) -> np.ndarray:
    size = _bucket(len(groups))
    return np.array(groups + [groups[0] if fill is None else fill] * (size - len(groups)))


class _FrameRun:
    """One chunk of shots walking the circuit."""

    def __init__(self, num_qubits: int, words: int, key):
        self.f = _f.zeros(max(num_qubits, 1), words)
        self.words = words
        self.key = key
        self.draws = 0
        self.flips: list[jax.Array] = []  # one (words,) row per measurement
        self.detectors: list[list[int]] = []
        self.observables: dict[int, list[int]] = {}
        self.chain = None
        # the reset randomises z: start every qubit "freshly reset" so first measurements are exact
        qs = np.arange(max(num_qubits, 1))
        self._measure([[(q, "Z")] for q in qs], reset=True, record=False)

    def next_key(self):
        self.draws += 1
        return jax.random.fold_in(self.key, self.draws)

    def bernoulli(self, p: float, rows: int) -> jax.Array:
        if p <= 0:
            return jnp.zeros((rows, self.words), jnp.uint32)
        return _f.bernoulli_bits(self.next_key(), p, (rows, self.words))

    # -- instruction kinds
    def run(self, circuit: Circuit):
        for op in circuit.operations:
            if isinstance(op, CircuitRepeatBlock):
                for _ in range(op.repeat_count):
                    self.run(op.body)
            else:
                self.instruction(op)

    def instruction(self, ins: CircuitInstruction):
        d, ts = ins.definition, ins.targets
        p = ins.gate_args[0] if ins.gate_args else 0.0
        if d.kind == "unitary":
            self._unitary(ins)
        elif d.kind in ("measure", "measure_reset", "reset"):
            self._measure([[(t.value, d.basis)] for t in ts], reset=d.kind != "measure",
                          record=d.kind != "reset", flip_p=p)
        elif d.kind == "pair_measure":
            self._measure([[(a.value, d.basis), (b.value, d.basis)] for a, b in zip(ts[::2], ts[1::2])],
                          reset=False, record=True, flip_p=p)
        elif d.kind == "mpp":
            self._measure([[(t.value, t.pauli) for t in g] for g in product_groups(ins)], reset=False,
                          record=True, flip_p=p)
        elif d.kind == "mpad":
            for _ in ts:
                self.flips.append(self.bernoulli(p, 1)[0])
        elif d.kind == "noise":
            self._noise(ins)
        elif d.kind == "correlated":
            self._correlated(ins)
        elif ins.name == "DETECTOR":
            self.detectors.append([len(self.flips) + t.value for t in ts])
        elif ins.name == "OBSERVABLE_INCLUDE":
            self.observables.setdefault(int(ins.gate_args[0]), []).extend(len(self.flips) + t.value for t in ts)

    def _unitary(self, ins: CircuitInstruction):
        image, arity = _forward_image(ins.name)
        ts = ins.targets
        groups = [tuple(t.value for t in ts[i:i + arity]) for i in range(0, len(ts), arity)]
        quantum: list[tuple] = []

        def flush():
            for run in disjoint_runs(quantum):
                self.f = _f.apply_gate(self.f, jnp.asarray(_padded(run), jnp.int32), jnp.asarray(image), arity=arity)
            quantum.clear()

        for i, g in enumerate(groups):
            pair = ts[i * arity:(i + 1) * arity]
            if all(t.is_qubit_target for t in pair):
                quantum.append(g)
                continue
            flush()
            ctrl, target = (pair[0], pair[1]) if not pair[0].is_qubit_target else (pair[1], pair[0])
            if ctrl.is_measurement_record_target:  # the frame of a fed-back Pauli is the record's flip
                flip = self.flips[len(self.flips) + ctrl.value]
                pauli = _FEEDBACK[ins.name]
                self._xor([target.value], [pauli], flip[None])
        flush()

    def _xor(self, qubits, paulis, masks):
        """Multiply paulis[i] on qubits[i] into the shots where masks[i] is set (disjoint qubits)."""
        xb = jnp.stack([m if _X[p] else jnp.zeros_like(m) for p, m in zip(paulis, masks)])
        zb = jnp.stack([m if _Z[p] else jnp.zeros_like(m) for p, m in zip(paulis, masks)])
        self.f = _f.xor_paulis(self.f, jnp.asarray(qubits, jnp.int32), xb, zb)

    def _measure(self, products, reset: bool, record: bool, flip_p: float = 0.0):
        groups = [tuple(q for q, _ in prod) for prod in products]
        start = 0
        for run in disjoint_runs(groups):
            prods = products[start:start + len(run)]
            start += len(run)
            m = max(len(p) for p in prods)
            k = _bucket(len(prods))
            qubits = np.zeros((k, m), np.int32)
            px, pz = np.zeros((k, m), bool), np.zeros((k, m), bool)
            for i in range(k):
                prod = prods[i] if i < len(prods) else prods[0]
                for j in range(m):  # padding factors repeat the first one with no Pauli
                    q, pauli = prod[j] if j < len(prod) else (prod[0][0], "I")
                    qubits[i, j], px[i, j], pz[i, j] = q, _X[pauli], _Z[pauli]
            self.f, flips = _f.measure_product(self.f, jnp.asarray(qubits), jnp.asarray(px), jnp.asarray(pz),
                                               self.next_key(), reset=reset)
            if record:
                flips = flips[:len(prods)] ^ self.bernoulli(flip_p, len(prods))
                self.flips.extend(flips)

    def _noise(self, ins: CircuitInstruction):
        name, args, ts = ins.name, ins.gate_args, ins.targets
        if name in ("I_ERROR", "II_ERROR"):
            return
        if ins.definition.arity == 1:
            for run in disjoint_runs([(t.value,) for t in ts]):
                qubits = [g[0] for g in run]
                if name in ("X_ERROR", "Y_ERROR", "Z_ERROR"):
                    self._xor(qubits, [name[0]] * len(qubits), self.bernoulli(args[0], len(qubits)))
                    continue
                probs = [args[0] / 3] * 3 if name == "DEPOLARIZE1" else list(args)
                ev = _f.sample_paulis(self.next_key(), jnp.asarray(probs), (len(qubits), self.words), num_paulis=3)
                xb, zb = ev[0] | ev[1], ev[1] | ev[2]
                self.f = _f.xor_paulis(self.f, jnp.asarray(qubits, jnp.int32), xb, zb)
            return
        probs = [args[0] / 15] * 15 if name == "DEPOLARIZE2" else list(args)
        for run in disjoint_runs([(a.value, b.value) for a, b in zip(ts[::2], ts[1::2])]):
            ev = _f.sample_paulis(self.next_key(), jnp.asarray(probs), (len(run), self.words), num_paulis=15)
            for side in (0, 1):
                xb = _or([ev[k] for k, pair in enumerate(_PAIRS) if _X[pair[side]]])
                zb = _or([ev[k] for k, pair in enumerate(_PAIRS) if _Z[pair[side]]])
                self.f = _f.xor_paulis(self.f, jnp.asarray([g[side] for g in run], jnp.int32), xb, zb)

    def _correlated(self, ins: CircuitInstruction):
        fire = self.bernoulli(ins.gate_args[0], 1)[0]
        if ins.name == "E":
            self.chain = fire
        else:
            if self.chain is None:
                raise ValueError(f"line {ins.line}: ELSE_CORRELATED_ERROR must follow E or ELSE_CORRELATED_ERROR")
            fire, self.chain = fire & ~self.chain, self.chain | fire
        self._xor([t.value for t in ins.targets], [t.pauli for t in ins.targets], [fire] * len(ins.targets))

    # -- results
    def flip_rows(self) -> jax.Array:
        if not self.flips:
            return jnp.zeros((0, self.words), jnp.uint32)
        return jnp.stack(self.flips)

    def parities(self, index_lists: list[list[int]]) -> jax.Array:
        """XOR of the flip rows listed for each output (detector or observable)."""
        rows = self.flip_rows()
        if not index_lists:
            return jnp.zeros((0, self.words), jnp.uint32)
        width = max(1, max(len(ix) for ix in index_lists))
        sentinel = rows.shape[0]
        idx = np.full((len(index_lists), width), sentinel, np.int32)
        for i, ix in enumerate(index_lists):
            idx[i, :len(ix)] = ix
        return _xor_rows(jnp.concatenate([rows, jnp.zeros((1, self.words), jnp.uint32)]), jnp.asarray(idx))


@jax.jit
def _xor_rows(rows, idx):
    return jax.lax.reduce(rows[idx], jnp.uint32(0), jax.lax.bitwise_xor, (1,))


def _or(masks):
    out = masks[0]
    for m in masks[1:]:
        out = out | m
    return out


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
    def __init__(self, circuit, seed: int | None):
        self.circuit = circuit if isinstance(circuit, Circuit) else Circuit(circuit)
        self._key = jax.random.key(np.random.SeedSequence(seed).generate_state(1)[0] if seed is None else seed)
        self._calls = 0

    def _chunks(self, shots: int):
        if not isinstance(shots, (int, np.integer)) or isinstance(shots, bool) or shots < 0:
            raise ValueError(f"shots must be a non-negative int, got {shots!r}")
        c = self.circuit
        per_shot_bits = 2 * max(c.num_qubits, 1) + c.num_measurements + c.num_detectors + c.num_observables
        fit = max(1, _CHUNK_BYTES * 8 // per_shot_bits // 32)  # words of shots per chunk in the budget
        chunk_words = 1 << (fit.bit_length() - 1)
        self._calls += 1
        call_key = jax.random.fold_in(self._key, self._calls)
        done = 0
        while done < shots:
            # a power-of-two number of words per chunk: calls with other shot counts reuse the compiles
            words = min(_bucket(-(-(shots - done) // 32)), chunk_words)
            n = min(32 * words, shots - done)
            run = _FrameRun(c.num_qubits, words, jax.random.fold_in(call_key, done))
            run.run(c)
            yield n, run
            done += n


class CompiledMeasurementSampler(_Sampler):
    """`sample(shots)`: (shots, num_measurements) outcomes; noise sampled per shot."""

    def __init__(self, circuit, *, seed: int | None = None, skip_reference_sample: bool = False):
        super().__init__(circuit, seed)
        self.reference = (np.zeros(self.circuit.num_measurements, bool) if skip_reference_sample
                          else reference_sample(self.circuit))

    def sample(self, shots: int, *, bit_packed: bool = False) -> np.ndarray:
        parts = [_unpack(run.flip_rows(), n) ^ self.reference for n, run in self._chunks(shots)]
        bits = np.concatenate(parts) if parts else np.zeros((0, self.circuit.num_measurements), bool)
        return _finish(bits, bit_packed)


class CompiledDetectorSampler(_Sampler):
    """`sample(shots)`: detection events (and observable flips), relative to the noiseless reference."""

    def __init__(self, circuit, *, seed: int | None = None):
        super().__init__(circuit, seed)

    def sample(self, shots: int, *, prepend_observables: bool = False, append_observables: bool = False,
               separate_observables: bool = False, bit_packed: bool = False):
        c = self.circuit
        dets, obs = [], []
        for n, run in self._chunks(shots):
            dets.append(_unpack(run.parities(run.detectors), n))
            obs.append(_unpack(run.parities([run.observables.get(k, []) for k in range(c.num_observables)]), n))
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
