"""Many-shot samplers with Stim's API: `compile_sampler` (measurement records) and
`compile_detector_sampler` (detection events and observable flips).

The circuit is lowered once (`stabilizer.circuits.program`); one noiseless reference shot runs it on
the tableau (random outcomes taken as 0), then Pauli frames run it for all shots
(`stabilizer.frames.frames`), in chunks so that any number of shots fits in memory. A chunk is one
compiled program (key, frames, outputs: one dispatch; six dispatches took 1.4 of the 2.3 ms of a
d = 5, 1e5-shot sample on an H100), compiled per chunk size and output layout: a sampler called in a
second layout compiles its frames again (seconds on a GPU), the price of the single dispatch. On CPUs
the program is keyed by the flat program's bucketed sizes (`program.flatten`) and the outputs' padded
index tables, not by the circuit: samplers of circuits that differ in probabilities, targets or repeat
counts within those buckets reuse it (a threshold sweep over p compiles once).

On CPUs, where the C library is built (`native_engine`; STABILIZER_NATIVE=0 turns it off, =host
turns it on beside a GPU too), the reference shot and the frames run as C loops instead
(`stabilizer.frames.native`, the same flat program): nothing is compiled, a sampler's first call costs
what its later ones do, and the outputs are written straight into the host arrays (on_device=True puts
them on the device afterwards). Its shots for a seed are not the JAX program's (as the GPU kernel's are
not). GPUs run the JAX programs unless STABILIZER_NATIVE is host.

Output layouts follow Stim: (shots, bits) of bool, or bit-packed (shots, ceil(bits / 8)) uint8 rows
with little-endian bits. They are built on the device from the record (rows of bits, shots along
words): the output rows are XORs of record rows, then a bit transpose makes them shot-major, so the
host receives the final array in one transfer, and `on_device=True` leaves it on the device (as
`jax.Array`s) for pipelines that decode there. (Unpacking and transposing on the host took 87% of a
d = 17 surface-code sample on an H100.)
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from ..circuits import program
from ..circuits.circuit import Circuit, provide_samplers
from ..tableau import tableau
from . import frames

_CHUNK_BYTES = None  # working-set budget of one chunk of shots; None: an eighth of device memory


def _chunk_bytes() -> int:
    return _device_chunk_bytes() if _CHUNK_BYTES is None else _CHUNK_BYTES


@cache
def _device_chunk_bytes() -> int:
    """An eighth of the default device's memory (read once: a driver call every sample cost time)."""
    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return max(1 << 26, limit // 8) if limit else 1 << 28  # CPUs report no limit: 256 MiB


# ---- the engine: C loops on CPUs (native.py), else the JAX programs ---------------------------------------

NATIVE = "STABILIZER_NATIVE"  # 0: CPUs' samplers run the JAX programs although the C library is built; 1 (the
#   default): the C loops where JAX's backend is the CPU; host: the C loops on the host's cores beside a GPU too
NATIVE_MODES = ("0", "1", "host")


@cache
def _native_module():
    try:
        from . import native
    except ImportError:  # its C library was not built (no C compiler at install)
        return None
    return native


def native_engine():
    """native.py where samplers run on it (its C library built; CPUs unless STABILIZER_NATIVE is 0; beside a
    GPU where it is `host`), else None. Read when a sampler is built (and by `reference_sample`). `host`
    serves many small one-off samplers, a sweep's, which the C loops answer with nothing to compile where a
    GPU compiles each circuit's programs; its shots for a seed are the C loops' wherever they run."""
    mode = os.environ.get(NATIVE, "1")
    if mode not in NATIVE_MODES:
        raise ValueError(f"{NATIVE} must be one of {', '.join(NATIVE_MODES)}, not {mode!r}")
    if mode == "0" or (mode == "1" and jax.default_backend() != "cpu"):
        return None
    return _native_module()


def _flatten(prog: program.Program):
    """(Flat, qubit rows, record rows) of a lowered program (`program.flatten`)."""
    return program.flatten(prog.structure(), prog.tables(), prog.num_qubits, prog.num_measurements)


def reference_sample(circuit: Circuit) -> np.ndarray:
    """A noiseless measurement record (random outcomes taken as 0), as Stim's `reference_sample`."""
    circuit = circuit if isinstance(circuit, Circuit) else Circuit(circuit)
    prog = program.lowered(circuit, sorted_collapses=True)
    native = native_engine()
    if native is not None:
        return native.reference(native.Program(_flatten(prog)[0], prog.num_qubits, prog.num_measurements))
    return _reference(prog)


def _reference(prog: program.Program) -> np.ndarray:
    """The reference shot on the tableau's JAX program."""
    rec = tableau.reference_record(prog.structure(), program.device_tables(prog), prog.num_qubits,
                                   prog.num_measurements)
    return np.asarray(rec, dtype=bool)


def _seed_value(seed) -> int:
    """The sampler's seed as an int: the given one, or fresh entropy (as Stim's samplers take without one)."""
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1)[0])
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, not {seed!r}")
    return int(seed)


# ---- the record (rows of bits, 32 shots a word) -> Stim's shot-major layouts ------------------------

@jax.jit
def xor_rows(rows, idx):
    """Parity of the listed rows for each output: rows (R, words); idx (D, L), padded with a zero row."""
    return jax.lax.reduce(rows[idx], jnp.uint32(0), jax.lax.bitwise_xor, (1,))


_SWAPS = [(16, 0x0000FFFF), (8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)]


def transpose_words(rows):
    """(R, words) uint32 -> (32 * words, ceil(R / 32)) uint32: word b of shot s holds rows 32b .. 32b + 31
    of that shot, row 32b + j at bit j. Each 32 x 32 bit block is transposed by five rounds of masked
    swaps between row pairs (Hacker's Delight 7-3), all on whole words."""
    r, words = rows.shape
    blocks = -(-r // 32)
    a = jnp.pad(rows, ((0, 32 * blocks - r), (0, 0))).reshape(blocks, 32, words)
    for shift, mask in _SWAPS:  # swap the high `shift` bits of row j with the low ones of row j + shift
        pairs = a.reshape(blocks, 32 // (2 * shift), 2, shift, words)
        lo, hi = pairs[:, :, 0], pairs[:, :, 1]
        t = ((lo >> shift) ^ hi) & jnp.uint32(mask)
        a = jnp.stack([lo ^ (t << shift), hi ^ t], axis=2).reshape(blocks, 32, words)
    return a.transpose(2, 1, 0).reshape(32 * words, blocks)  # [shot word, bit in word, block]


@partial(jax.jit, static_argnames=("bits", "shots", "bit_packed"))
def shot_major(words, bits: int, shots: int, bit_packed: bool):
    """Output of `transpose_words` -> the first `shots` shots of `bits` bits in Stim's layout: (shots, bits)
    bool, or (shots, ceil(bits / 8)) uint8 with bit j of byte k holding bit 8k + j."""
    words = words[:shots]
    if bit_packed:
        nbytes = words[:, :, None] >> jnp.arange(0, 32, 8, dtype=jnp.uint32)
        return nbytes.astype(jnp.uint8).reshape(shots, -1)[:, :-(-bits // 8)]
    unpacked = (words[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return unpacked.astype(bool).reshape(shots, -1)[:, :bits]


@partial(jax.jit, static_argnames=("bit_packed",))
def _outputs(record, idx, invert, bit_packed: bool):
    """XOR of record rows (idx, padded with the record's zero last row), flipped where invert, shot-major:
    every shot of the chunk (32 * words), padding included, so that the compiled size follows the
    chunk's bucketed word count, not the caller's shot count."""
    rows = xor_rows(record, idx) ^ jnp.where(invert, ~jnp.uint32(0), jnp.uint32(0))[:, None]
    return shot_major(transpose_words(rows), idx.shape[0], 32 * record.shape[1], bit_packed)


@partial(jax.jit, static_argnames=("engine", "words", "limits", "bit_packed"), compiler_options=frames.COMPILER_OPTIONS)
def _chunk(engine, program, key, counters, outputs, words, limits, bit_packed):
    """One chunk of shots in one program (one dispatch): its key (the sampler's key folded with the call
    count, then the chunk's first shot: counters (2,) uint32, one transfer), the frames' record, and the
    outputs (idx, invert) in Stim's layout for every shot of the chunk (padding included). engine:
    ("flat", qubits, records, depth) with program (table, ops) of a Flat program, or ("kernel",
    structure, num_qubits, num_measurements, records, mode) with the program's tables; the record has
    `records` rows either way, the last one zero."""
    key = frames.fold_words(frames.key_words(key), counters[0], counters[1])  # (key words: one small hash)
    if engine[0] == "flat":
        _, qubits, records, depth = engine
        table, ops = program
        record = frames.flat_record(table, ops, key, qubits, records, depth, words, limits)
    else:
        _, structure, num_qubits, num_measurements, records, mode = engine
        record = frames.kernel_record(structure, program, key, num_qubits, num_measurements, words, mode)
        record = jnp.pad(record, ((0, records - record.shape[0]), (0, 0)))
    return [_outputs(record, idx, invert, bit_packed) for idx, invert in outputs]


@partial(jax.jit, static_argnames=("shapes",))
def _leading(parts, shapes: tuple):
    """The leading (shots, columns) block of each of a chunk's outputs, in one dispatch (an eager slice of
    each cost about 0.15 ms of a 1 ms d = 5, 1e5-shot sample on an H100)."""
    return [p[:rows, :cols] for p, (rows, cols) in zip(parts, shapes)]


@partial(jax.jit, donate_argnums=0)
def _place(out, part, start):
    """Write a chunk's rows into the device output, in place."""
    return jax.lax.dynamic_update_slice(out, part, (start, 0))


def _start_host_copy(x: jax.Array) -> jax.Array:
    """Start copying x to the host; read the result with np.asarray. On GPUs the copy goes to
    page-locked host memory, which the DMA engine fills at bus speed (1.44 GB in 28 ms on an H100,
    where np.asarray's pageable copy took 1.03 s, 2026-11-25); elsewhere it is the usual async copy."""
    device = next(iter(x.devices()))
    if device.platform == "gpu" and "pinned_host" in {m.kind for m in device.addressable_memories()}:
        return jax.device_put(x, x.sharding.with_memory_kind("pinned_host"))
    x.copy_to_host_async()
    return x


class _HostBuffer:
    """The first rows of a chunk's host copy through numpy's array interface: a writable view that
    keeps the chunk alive. The chunk is a fresh buffer that nothing else holds, so it can become the
    user's output, as a Stim sampler's array is theirs."""

    def __init__(self, x: jax.Array, rows: int):
        self._chunk = x
        self.__array_interface__ = {"data": (x.unsafe_buffer_pointer(), False), "shape": (rows,) + x.shape[1:],
                                    "typestr": np.dtype(x.dtype).str, "version": 3}


def _host_rows(x: jax.Array, n: int) -> np.ndarray:
    """The first n rows of a chunk's host copy (`_start_host_copy`) as a writable numpy array, without a
    copy: on an H100 the copy out of page-locked memory took 1.25 ms of a d = 5, 1e6-shot packed
    sample's 2.9 ms on one core (0.4 ms over threads). Falls back to a copy where the array has no
    single host buffer."""
    x.block_until_ready()
    try:
        return np.asarray(_HostBuffer(x, n))
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        return np.array(np.asarray(x)[:n])


def _copy_into(outs, start, n, parts):
    """Write a chunk's first n rows into the host outputs, a large copy split by rows over threads:
    numpy releases the GIL while it copies, so the first-touch page faults of a fresh output and the
    copy itself run on several cores (one core took 1.25 ms for the 16 MB of a d = 5, 1e6-shot packed
    sample on an H100's host, as long as the rest of the call; np.asarray of the page-locked chunk is
    a view, 0.03 ms). The outputs stay ordinary writable arrays, as Stim's are."""
    for o, p in zip(outs, parts):
        src, dst = np.asarray(p)[:n, :o.shape[1]], o[start:start + n]
        pieces = min(_COPY_THREADS, dst.nbytes // _COPY_PIECE_BYTES)
        if pieces <= 1:
            dst[...] = src
            continue
        bounds = np.linspace(0, n, pieces + 1).astype(int)
        list(_copy_threads().map(lambda a, b: dst.__setitem__(slice(a, b), src[a:b]), bounds[:-1], bounds[1:]))


_COPY_PIECE_BYTES = 1 << 21  # a thread's share of a host copy is at least this much
_COPY_THREADS = min(8, os.cpu_count() or 1)


@cache
def _copy_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_COPY_THREADS, thread_name_prefix="stabilizer-copy")


def _index_table(lists: list[list[int]], zero_row: int) -> np.ndarray:
    """Rows of record indices, one a list, padded with `zero_row` to bucketed sizes (rows by
    `fine_bucket`, columns by `bucket`): outputs of similar size share the compiled program, and the
    padding rows are zero bits that the samplers cut off."""
    width = program.bucket(max([1] + [len(ix) for ix in lists]))
    idx = np.full((program.fine_bucket(max(1, len(lists))), width), zero_row, np.int32)
    for i, ix in enumerate(lists):
        idx[i, :len(ix)] = ix
    return idx


def chunk_words(shots: int, budget: int) -> int:
    """Words (of 32 shots) of the next chunk, capped by the power-of-two `budget`: a power of two up to
    128 words, then a multiple of 128 rounded up to four significant bits (at most 1/8 of the work
    wasted on padding shots, at most 8 compiled sizes per doubling of the shot count, and the Pallas
    kernels can block every size)."""
    words = -(-shots // 32)
    if words <= 128:
        return min(program.bucket(words), budget)
    step = max(128, 1 << (words.bit_length() - 4))
    return min(-(-words // step) * step, budget)


class _Sampler:
    _out_rows: int  # rows of the widest output layout (each sampler sets it)

    def __init__(self, circuit, *, seed: int | None = None):
        self.circuit = circuit if isinstance(circuit, Circuit) else Circuit(circuit)
        self.program = program.lowered(self.circuit, sorted_collapses=True)  # (Stim's reference sample)
        self._structure = self.program.structure()
        tables = self.program.tables()
        flat, self._qubit_rows, self._record_rows = program.flatten(self._structure, tables, self.program.num_qubits,
                                                                    self.program.num_measurements)
        self._limits = frames.noise_limits(flat.table)
        self._depth, self._ops = flat.depth, flat.ops
        self._flat_table, self._flat_device = flat.table, None  # (on the device when the JAX program first runs)
        self._tables = None  # the segments' tables, for frame_kernel (converted when first used)
        self._tables_np = tables
        self._seed = _seed_value(seed)
        self._jax_key = None
        self._calls = 0
        native = native_engine()
        self._native = None if native is None else native.Program(flat, self.program.num_qubits,
                                                                  self.program.num_measurements)

    @property
    def engine(self) -> str:
        """"native" (the C loops, CPUs) or "jax" (the JAX programs: the flat loop, or the GPU kernel)."""
        return "jax" if self._native is None else "native"

    @property
    def _flat(self):
        """The flat program's table on the device (float64 probabilities, whatever the global setting)."""
        if self._flat_device is None:
            with jax.enable_x64(True):
                self._flat_device = jax.device_put(self._flat_table)  # (jnp.asarray compiles a program per shape)
        return self._flat_device

    @property
    def _key(self):
        if self._jax_key is None:
            self._jax_key = jax.random.key(self._seed)
        return self._jax_key

    def _output_table(self, lists: list[list[int]], invert=None) -> tuple:
        """An output: XORs of the listed record rows, flipped where invert: for the JAX programs (index
        table, invert, rows), `rows` of the padded table's rows real (`_index_table`); for the C loops a
        native.Output."""
        if self._native is not None:
            return _native_module().output(lists, invert)
        idx = _index_table(lists, self._record_rows - 1)
        flips = np.zeros(len(idx), bool)
        flips[:len(lists)] = False if invert is None else invert
        return jax.device_put(idx), jax.device_put(flips), len(lists)

    def _engine(self, words: int):
        """(static engine, program data) of `_chunk` for frames of `words` words."""
        mode = frames.frame_engine("auto", words)
        if mode == "jax":
            return ("flat", self._qubit_rows, self._record_rows, self._depth), (self._flat, self._ops)
        if self._tables is None:
            with jax.enable_x64(True):
                self._tables = jax.device_put(self._tables_np)
        prog = self.program
        return ("kernel", self._structure, prog.num_qubits, prog.num_measurements, self._record_rows, mode), self._tables

    def _budget_words(self) -> int:
        """Words (of 32 shots) in a full chunk: the largest power of two whose working set fits the chunk
        budget: frames, record, an op's rows where the scan runs the frames (`width` slots: gathered
        frames, random words, noise masks, about 32 words a slot; the GPU kernel holds none), dense noise
        draws where the scan makes any (two 64-bit values a shot per slot and event: 160 words a slot;
        sparse draws take a few words a hit), and the widest output's rows (XOR rows, their transpose,
        packed output; a bool output adds 7 words a row). It does not depend on the layout asked for,
        so a seed gives the same shots in every layout."""
        prog = self.program
        dense = any(d is not None and d.dense for d in self._limits)
        per_slot = 0 if frames.frame_engine("auto", 128) != "jax" else 160 if dense else 32
        per_word = 4 * (2 * self._qubit_rows + self._record_rows + per_slot * program.fine_bucket(prog.width) + 160
                        + 3 * program.fine_bucket(self._out_rows))
        return 1 << (max(1, _chunk_bytes() // per_word).bit_length() - 1)

    def _plan(self, shots: int) -> list[tuple[int, int, int]]:
        """(first shot, shots, words) of each chunk: the fewest chunks the budget allows, all of one size
        (one compiled frame program a call; only the last chunk has padding shots)."""
        if shots == 0:
            return []
        budget = self._budget_words()
        count = -(-shots // (32 * budget))
        words = chunk_words(-(-shots // count), budget)
        return [(start, min(32 * words, shots - start), words) for start in range(0, shots, 32 * words)]

    def _chunks(self, plan, outputs, bit_packed: bool):
        """Yield (first shot, shots in chunk, the chunk's outputs, padded columns included) chunk by chunk."""
        self._calls += 1
        for start, n, words in plan:
            engine, data = self._engine(words)
            with jax.enable_x64(True):  # the noise draws' float64 (the tables were converted under it)
                parts = _chunk(engine, data, self._key, np.array([self._calls, start], np.uint32), outputs, words,
                               self._limits, bit_packed)
            yield start, n, parts

    def _sample(self, shots: int, tables, bit_packed: bool, on_device: bool):
        """One array per (idx, invert, rows) of `tables`: those output rows of every shot, in Stim's
        layout (the chunks' padding columns cut off)."""
        if not isinstance(shots, (int, np.integer)) or isinstance(shots, bool) or shots < 0:
            raise ValueError(f"shots must be a non-negative int, got {shots!r}")
        if self._native is not None:  # the C loops write the outputs in their layouts on the host
            self._calls += 1
            outs = _native_module().sample(self._native, list(tables), int(shots), bit_packed, (self._seed, self._calls))
            return [jax.device_put(o) for o in outs] if on_device else outs
        shapes = [(shots, -(-rows // 8) if bit_packed else rows) for _, _, rows in tables]
        dtype = np.uint8 if bit_packed else np.bool_
        plan = self._plan(shots)
        chunks = self._chunks(plan, [(idx, invert) for idx, invert, _ in tables], bit_packed)
        if on_device:  # chunks (whole, padding shots included) go into one output each, cut to the shots once
            if not plan:
                return [jnp.zeros(s, dtype) for s in shapes]
            padded = plan[-1][0] + 32 * plan[-1][2]
            outs = None
            for start, n, parts in chunks:
                if len(plan) == 1:  # a whole chunk is returned as it is, or cut to the shots in one dispatch
                    same = all(p.shape == s for p, s in zip(parts, shapes))
                    return parts if same else _leading(parts, tuple(shapes))
                outs = [_place(o, p, start) for o, p in
                        zip(outs or [jnp.zeros((padded,) + p.shape[1:], dtype) for p in parts], parts)]
            return _leading(outs, tuple(shapes))
        if len(plan) == 1:  # one chunk: its host buffers become the outputs, uncopied where no column is cut
            (start, n, parts), = chunks
            if jax.default_backend() != "cpu" and any(p.shape[1] != s[1] for p, s in zip(parts, shapes)):
                # padding columns (the output rows' bucket) cut on the device, so the host receives exactly the
                # bytes it keeps and copies nothing (one H200, d = 17, 1e6 shots packed: 32 ms before the
                # buckets, 182-199 ms with the cut on the host)
                parts = _leading(parts, tuple(shapes))
            outs = [_host_rows(_start_host_copy(p), n) for p in parts]
            return [o if o.shape == s else np.ascontiguousarray(o[:, :s[1]]) for o, s in zip(outs, shapes)]
        outs = [np.empty(s, dtype) for s in shapes]
        previous = None
        for start, n, parts in chunks:  # advancing the generator dispatches the next chunk before this one is copied
            chunk = start, n, [_start_host_copy(p) for p in parts]
            if previous:
                _copy_into(outs, *previous)
            previous = chunk
        if previous:
            _copy_into(outs, *previous)
        return outs


class CompiledMeasurementSampler(_Sampler):
    """`sample(shots)`: (shots, num_measurements) outcomes; noise sampled per shot."""

    def __init__(self, circuit, *, seed: int | None = None, skip_reference_sample: bool = False):
        super().__init__(circuit, seed=seed)
        self.reference = (np.zeros(self.circuit.num_measurements, bool) if skip_reference_sample
                          else _reference(self.program) if self._native is None
                          else _native_module().reference(self._native))
        m = self.program.num_measurements
        self._table = self._output_table([[i] for i in range(m)], self.reference)
        self._out_rows = m

    def sample(self, shots: int, *, bit_packed: bool = False, on_device: bool = False):
        """Outcomes as Stim's sampler gives them: (shots, num_measurements) bool, or bit-packed uint8 rows.
        on_device: return a `jax.Array` left on the device (not in Stim's API)."""
        return self._sample(shots, [self._table], bit_packed, on_device)[0]


class CompiledDetectorSampler(_Sampler):
    """`sample(shots)`: detection events (and observable flips), relative to the noiseless reference."""

    def __init__(self, circuit, *, seed: int | None = None):
        super().__init__(circuit, seed=seed)
        self._layouts = {}  # (prepend, append, separate) -> the (index table, invert) of each output
        self._out_rows = len(self.program.detectors) + 2 * len(self.program.observables)  # the widest layout

    def sample(self, shots: int, *, prepend_observables: bool = False, append_observables: bool = False,
               separate_observables: bool = False, bit_packed: bool = False, on_device: bool = False):
        """Detection events as Stim's sampler gives them (the same keywords and layouts); on_device:
        return `jax.Array`s left on the device (not in Stim's API)."""
        if separate_observables and (prepend_observables or append_observables):
            raise ValueError("Can't specify separate_observables=True with append_observables=True or "
                             "prepend_observables=True")
        layout = (prepend_observables, append_observables, separate_observables)
        if layout not in self._layouts:
            prog = self.program
            dets, obs = prog.detectors, prog.observables
            lists = [dets, obs] if separate_observables else [
                (obs if prepend_observables else []) + dets + (obs if append_observables else [])]
            self._layouts[layout] = [self._output_table(ix) for ix in lists]
        out = self._sample(shots, self._layouts[layout], bit_packed, on_device)
        return tuple(out) if separate_observables else out[0]


def compile_sampler(circuit, *, seed: int | None = None, skip_reference_sample: bool = False):
    return CompiledMeasurementSampler(circuit, seed=seed, skip_reference_sample=skip_reference_sample)


def compile_detector_sampler(circuit, *, seed: int | None = None):
    return CompiledDetectorSampler(circuit, seed=seed)


provide_samplers(compile_sampler, compile_detector_sampler, reference_sample)  # Circuit's sampler methods
