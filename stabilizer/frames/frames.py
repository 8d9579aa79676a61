"""Pauli-frame simulation of many shots at once, shots packed as bits along the word axis.

Each shot carries a Pauli frame: the difference between its noisy run and the noiseless reference
run (`reference_sample`). Gates conjugate frames (signs do not matter), noise XORs random Paulis
in, a measurement's outcome flips where its frame anticommutes with the measured observable, and
after a measurement or reset the frame takes a random copy of the new stabilizer (harmless to the
state, it makes later measurements of that qubit in another basis random, as they must be).
Outcomes are reference XOR flips; detectors and observables are parities of flips (DESIGN.md
section 5: the reference shot is not optional).

Words are uint32 of 32 shots; x and z have shape (num_qubits + 1, words) (the last row is the
lowering's spare qubit). `run_program` runs a lowered circuit (`stabilizer.circuits.program`): on GPUs as
`frame_kernel`'s Pallas kernel (one launch an op table), elsewhere as one scan of the op rules below.

Noise is drawn sparsely, as Stim does: the gaps between hit bit positions are geometric, so a draw
at p = 1e-3 costs about 1e-3 random draws a shot instead of one (the dense draw of a uniform per
shot, compared and packed, took 54 of the 76 ms of the d = 17 frame program on an H100; on a CPU the
sparse draw is 300x cheaper at 1e-3 and still 2x at 1/4). The bit-sliced comparison of 32 random
words against p's binary digits was the alternative: branch-free, but it needs about 30 + log2(1/p)
random words per word for 1e-9 relative accuracy, more than the dense draw it replaces. Static shapes
make the sparse draw take gaps in rounds of a fixed budget (`flip_budget` at ROUND_RATE, whatever the
probability), as many rounds as the row needs: the compiled program does not depend on the
probabilities, so a sweep over p compiles nothing new. Probabilities above SPARSE_MAX are drawn
densely, code for which is compiled only where a program has one. All draws are exact to float64
rounding (the frame program runs under jax.enable_x64), not quantised to 2^-32.

Elsewhere a lowered program runs as one table (`stabilizer.circuits.program.flatten`): one while loop
whose step is the op-kind switch below, with sizes bucketed, so that circuits of similar size (a
sweep over the distance within a bucket, or over noise strengths) share one compiled program. (The
samplers run that flat table on CPUs as C loops where the library is built, `native.py`; this loop is
then what CPUs run without it, or with STABILIZER_NATIVE=0.)
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..circuits.program import CORRELATED, MEASURE, MPAD, NOISE, flatten, gate_catalogue, pair_codes, run_flat
from ..tableau import kernels
from ..tableau.kernels import pack
from . import frame_kernel


class Frames(NamedTuple):
    x: jax.Array  # (Q, S/32) uint32: X part of each shot's frame
    z: jax.Array  # (Q, S/32) uint32


def zeros(num_qubits: int, words: int) -> Frames:
    return Frames(jnp.zeros((num_qubits, words), jnp.uint32), jnp.zeros((num_qubits, words), jnp.uint32))


def key_words(key) -> jax.Array:
    """The two uint32 words (2,) of a key: a typed JAX key's data (its first two words), or the words
    themselves. Inside the frame programs randomness is JAX's Threefry-2x32 as elementwise ops
    (`frame_kernel.threefry2x32`) of counters under such words, as in the GPU kernel: jax.random's
    fold_in, split and bits ran on CPUs as loops of five hash rounds, a dozen small ops each, and
    those ops were a third of the d = 5 frame program's compiled kernels (46 of 142) and of its
    compile time (each kernel costs XLA:CPU 20-30 ms to compile on the 2-core CPU)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return key[..., :2].astype(jnp.uint32)


def fold_words(key, a, b=0) -> jax.Array:
    """The key words (2,) of stream (a, b) under a key or its words: one Threefry-2x32 hash."""
    words = key_words(key)
    h0, h1 = frame_kernel.threefry2x32(words[0], words[1], jnp.asarray(a, jnp.uint32), jnp.asarray(b, jnp.uint32))
    return jnp.stack([h0, h1])


def _hashes(words, rows: int, cols: int):
    """Threefry-2x32 (h0, h1) of the counters (column, row) of a rows x cols grid under the key words."""
    c0, c1 = lax.broadcasted_iota(jnp.uint32, (rows, cols), 1), lax.broadcasted_iota(jnp.uint32, (rows, cols), 0)
    return frame_kernel.threefry2x32(words[0], words[1], c0, c1)


def random_bits(key, shape) -> jax.Array:
    """uint32 random words of `shape` under a key (or its words, `key_words`): one hash gives two words,
    the two halves of a row. One fused op."""
    rows, cols = math.prod(shape[:-1]), (shape[-1] if shape else 1)
    return jnp.concatenate(_hashes(key_words(key), rows, -(-cols // 2)), axis=1)[:, :cols].reshape(shape)


def uniform64(key, shape) -> jax.Array:
    """Uniform float64 in [0, 1) from 64 random bits (one hash) under a key (or its words): P(u < p) is p
    to 2^-64 near 0 (float64 rounding elsewhere)."""
    rows, cols = math.prod(shape[:-1]), (shape[-1] if shape else 1)
    return _unit(*_hashes(key_words(key), rows, cols)).reshape(shape)


def _unit(h0, h1) -> jax.Array:
    """Two random uint32 words -> a float64 uniform in [0, 1) (the top 2^-54 of the range would round up
    to 1: clamped below it)."""
    return jnp.minimum(h0.astype(jnp.float64) * 2.0**-32 + h1.astype(jnp.float64) * 2.0**-64, 1.0 - 2.0**-53)


# ---- noise: which bit positions an event hits, and which event ------------------------------------

SPARSE_MAX = 0.5  # probabilities above it are drawn densely
# A sparse draw's round makes room for the flips of this rate (mean + 8 sigma): one round at p <= 1e-3,
# ten at 1e-2; a round's cost is its budget's draws, so a larger rate would slow the common case.
ROUND_RATE = 2.0**-10
FLIP = np.array([1], np.uint32)  # the event codes of a lone flip (one event, one plane)
PAIR_EVENTS = pair_codes()[:15]  # the 15 two-qubit Pauli events, code x_a | z_a << 1 | x_b << 2 | z_b << 3


def flip_budget(bits: int, limit: float) -> int:
    """Flips a sparse draw makes room for over `bits` positions at probability <= limit: the mean plus
    8 sigma plus 16 (a Chernoff bound puts running out below 1e-10)."""
    mean = bits * limit
    return int(min(bits, math.ceil(mean + 8 * math.sqrt(mean) + 16)))


class Draw(NamedTuple):
    """How a program draws one op kind's noise (static): probabilities up to `sparse` by geometric
    skipping (0: never), larger ones densely, code for which is compiled only where `dense`."""

    sparse: float
    dense: bool


def noise_masks(key, probs, codes: np.ndarray, shape: tuple, draw: Draw | None) -> jax.Array:
    """(planes,) + shape uint32 masks: each of the 32 * prod(shape) bit positions takes, independently,
    event e with probability probs[e] (events are disjoint; none with the rest), and plane b holds bit b
    of the taken event's code (codes: static, nonzero).

    A total probability of at most draw.sparse is drawn sparsely (`_sparse`, Stim's geometric
    skipping), a larger one densely (`_dense`, which draw.dense must allow); draw None: the caller
    knows every probability is 0. Both are exact to float64 rounding."""
    planes = int(codes.max()).bit_length()
    none = jnp.zeros((planes,) + shape, jnp.uint32)
    if draw is None:
        return none
    total = jnp.cumsum(probs)[-1]
    kw = key_words(key)
    k_sparse, k_dense = fold_words(kw, 0, 1), fold_words(kw, 1, 1)
    hits = none
    if draw.sparse > 0:
        budget = flip_budget(32 * math.prod(shape), ROUND_RATE)
        hits = lax.cond((total > 0) & (total <= draw.sparse), lambda: _sparse(k_sparse, probs, codes, shape, budget),
                        lambda: none)
    if draw.dense:
        hits = hits | lax.cond(total > draw.sparse, lambda: _dense(k_dense, probs, codes, shape), lambda: none)
    return hits


def _planes(code, planes: int):
    """(..., 32) event codes -> (planes, ...) packed words, bit b of the code in plane b."""
    return jnp.stack([pack((code >> b) & 1) for b in range(planes)])


def _events(u, probs):
    """The event each uniform u (float64 in [0, 1)) picks given that one happens: e with probability
    probs[e] / total."""
    edges = jnp.cumsum(probs)
    x = u * edges[-1]
    last = probs.shape[0] - 1 - jnp.argmax(probs[::-1] > 0)  # rounding must not pick a zero event past it
    return jnp.minimum(jnp.sum(x[..., None] >= edges[:-1], axis=-1), last)


def _dense(key, probs, codes, shape):
    """One 64-bit uniform per bit position against the cumulative probabilities (cost: 32 draws a word)."""
    u = uniform64(key, shape + (32,))
    event = jnp.sum(u[..., None] >= jnp.cumsum(probs), axis=-1)  # len(probs): nothing happened
    return _planes(jnp.asarray(np.append(codes, 0))[event], int(codes.max()).bit_length())


def _sparse(key, probs, codes, shape, budget: int):
    """Stim's geometric skipping with static shapes: the gaps between hit positions are Geometric(total),
    floor(log(1 - u) / log(1 - total)); a round draws `budget` gaps from where the last round ended,
    each hit takes its event, and the hits are scattered into the words (distinct bits of a word add
    as OR); rounds go on until the row has ended (one round almost always where the budget was sized
    for the probability: exact either way, as the gaps are memoryless). Cost: about 32 * total draws a
    word instead of 32, and at least one round's budget."""
    words = math.prod(shape)
    bits = 32 * words
    planes = int(codes.max()).bit_length()
    log1mp = jnp.log1p(-jnp.cumsum(probs)[-1])

    words_key = key_words(key)

    def draw_round(state):
        hits, start, r = state
        u = _round_uniforms(words_key, r, 2 if len(codes) > 1 else 1, budget)  # gaps, events
        gaps = jnp.minimum(jnp.floor(jnp.log1p(-u[0]) / log1mp), bits).astype(jnp.int64)
        pos = start + jnp.cumsum(gaps + 1) - 1  # increasing; past the row once it has ended
        code = jnp.asarray(codes)[_events(u[1], probs)] if len(codes) > 1 else jnp.full(budget, codes[0])
        payload = ((code >> jnp.arange(planes, dtype=jnp.uint32)[:, None]) & 1) << (pos % 32).astype(jnp.uint32)
        return hits.at[:, pos // 32].add(payload, mode="drop"), jnp.minimum(pos[-1] + 1, bits), r + 1

    start = (jnp.zeros((planes, words), jnp.uint32), jnp.zeros((), jnp.int64), jnp.zeros((), jnp.uint32))
    hits, _, _ = lax.while_loop(lambda s: s[1] < bits, draw_round, start)
    return hits.reshape((planes,) + shape)


def _round_uniforms(words_key, r, rows: int, budget: int) -> jax.Array:
    """(rows, budget) float64 uniforms in [0, 1) of a sparse draw's round r: JAX's Threefry-2x32 of the
    counter (lane, rows * r + row) under the op's key, as elementwise ops (`frame_kernel.threefry2x32`),
    exact to float64 rounding as `uniform64`. One fused op a round: jax.random's bits under a key folded
    with r ran on CPUs as a loop of five rounds, a dozen small ops, which with the fold made a round's
    fixed cost, so ten rounds at p = 1e-2 (ROUND_RATE) cost 1.3x the d = 9 sample of one round sized
    for p (2-core CPU, 2026-11-28)."""
    lane = lax.broadcasted_iota(jnp.uint32, (rows, budget), 1)
    row = lax.broadcasted_iota(jnp.uint32, (rows, budget), 0) + r * jnp.uint32(rows)
    return _unit(*frame_kernel.threefry2x32(words_key[0], words_key[1], lane, row))


NOISY_KINDS = (MEASURE, NOISE, CORRELATED, MPAD)  # the op kinds that draw noise


def noise_limits(table) -> tuple:
    """Per op kind, how a program's op table (numpy: a Flat's, or any lowered table) draws its noise: a
    `Draw` that draws up to SPARSE_MAX sparsely and, where the kind has a larger probability, densely;
    None where the kind draws nothing (every probability 0, or no such op). It depends on the
    probabilities only through those two tests, so circuits that differ in their noise strengths
    share a compiled program."""
    kind, probs = np.asarray(table["kind"]), np.asarray(table["probs"], np.float64)
    total = np.where(kind == NOISE, probs.sum(1), probs[:, 0])
    limits = []
    for k in range(MPAD + 1):
        p = total[(kind == k) & (total > 0)] if k in NOISY_KINDS else total[:0]
        # the device may sum the probabilities in another order: its sparse test has room for rounding
        limits.append(Draw(SPARSE_MAX * (1 + 1e-9), bool(np.any(p > SPARSE_MAX))) if p.size else None)
    return tuple(limits)


# ---- a lowered program (stabilizer.circuits.program) over all shots of a chunk --------------------

class _Carry(NamedTuple):
    f: Frames
    record: jax.Array  # (M + 1, words): flips of every measurement; the last row stays zero (nothing writes it)
    base: jax.Array  # int32: measurements recorded so far
    counter: jax.Array  # uint32: ops run so far (op i draws under fold_words(key words, i))
    chain: jax.Array  # (words,): shots where the current E / ELSE chain has fired


class _Reads(NamedTuple):
    """What an op reads: the frame rows (S, words) of its S slots' qubits q0 (a) and q1 (b), the chain,
    and (read only: feedback) the record and the measurement count."""

    xa: jax.Array
    za: jax.Array
    xb: jax.Array
    zb: jax.Array
    chain: jax.Array
    record: jax.Array
    base: jax.Array


class _Writes(NamedTuple):
    """What an op writes: its slots' new frame rows, the chain, and the record rows `flips` (S, words) of
    an op that records (MEASURE, MPAD: `_write` puts them at the op's record rows; other ops' flips are
    any (S, words) array, written nowhere). Every op writes all of them (a switch's branches return one
    structure)."""

    xa: jax.Array
    za: jax.Array
    xb: jax.Array
    zb: jax.Array
    chain: jax.Array
    flips: jax.Array


def _read(c: _Carry, row) -> _Reads:
    """Gather an op's rows, so that only they pass through the op-kind switch (branches that returned
    the whole frames and record copied them: 13 of the 35 kernels an op took on an H100). The record
    goes in whole but read only: what no branch returns is not copied."""
    q0, q1 = row["q"][:, 0], row["q"][:, 1]
    return _Reads(c.f.x[q0], c.f.z[q0], c.f.x[q1], c.f.z[q1], c.chain, c.record, c.base)


def _write(c: _Carry, row, w: _Writes) -> _Carry:
    """Scatter an op's rows back: frame rows on q0 then q1 (writes to the spare qubit, padding, are
    dropped), the flips at the op's record rows (`_record_rows`). The table's advance is zero for ops
    that record nothing."""
    spare = c.f.x.shape[0] - 1
    q0, q1 = (jnp.where(q == spare, spare + 1, q) for q in (row["q"][:, 0], row["q"][:, 1]))
    x = c.f.x.at[q0].set(w.xa, mode="drop").at[q1].set(w.xb, mode="drop")
    z = c.f.z.at[q0].set(w.za, mode="drop").at[q1].set(w.zb, mode="drop")
    record = c.record.at[_record_rows(c.base, row, c.record.shape[0])].set(w.flips, mode="drop")
    return c._replace(f=Frames(x, z), record=record, base=c.base + row["advance"], chain=w.chain)


def _unchanged(r: _Reads) -> _Writes:
    """Writes that change nothing: the rows as read (flips too: an op that records nothing writes them
    nowhere). A branch builds no new array for what it does not change: each one it built (zero flips,
    an index row) was one more kernel for XLA:CPU to compile, 20-30 ms each on the 2-core CPU."""
    return _Writes(r.xa, r.za, r.xb, r.zb, r.chain, r.xa)


def _record_rows(base, row, records: int) -> jax.Array:
    """The record rows of an op's slots: base + rec for the slots of an op that records (advance > 0:
    MEASURE, MPAD; a slot with rec -1 records nothing), else `records` (past the end: nowhere; a
    FEEDBACK op's rec is a lookback)."""
    return jnp.where((row["rec"] >= 0) & (row["advance"] > 0), base + row["rec"], jnp.int32(records))


def _op_gate(r: _Reads, row, key) -> _Writes:
    forward = jnp.asarray(gate_catalogue()[1])[row["gate"][0].astype(jnp.int32)]  # one gate an op (not merged)
    bits = [r.xa, r.za, r.xb, r.zb]
    outs = [jnp.zeros_like(bits[0]) for _ in range(4)]
    for i in range(4):  # up to sign a Clifford is linear on the frame's bits: XOR the generators' images
        image = forward[1 << i]
        for b in range(4):
            outs[b] = outs[b] ^ jnp.where((image >> b) & 1, bits[i], jnp.uint32(0))
    return _unchanged(r)._replace(xa=outs[0], za=outs[1], xb=outs[2], zb=outs[3])


def _op_measure(r: _Reads, row, key, draw: Draw | None) -> _Writes:
    k1, k2 = fold_words(key, 0, 2), fold_words(key, 1, 2)
    flips = r.xa ^ noise_masks(k1, row["probs"][:1], FLIP, r.xa.shape, draw)[0]
    rand = random_bits(k2, r.xa.shape)
    reset = row["reset"][:, None]
    return _unchanged(r)._replace(xa=jnp.where(reset, jnp.uint32(0), r.xa), za=jnp.where(reset, rand, r.za ^ rand),
                                  flips=flips)


def _op_noise(r: _Reads, row, key, draw: Draw | None) -> _Writes:
    xa, za, xb, zb = noise_masks(key, row["probs"], PAIR_EVENTS, r.xa.shape, draw)
    return _unchanged(r)._replace(xa=r.xa ^ xa, za=r.za ^ za, xb=r.xb ^ xb, zb=r.zb ^ zb)


def _op_correlated(r: _Reads, row, key, draw: Draw | None) -> _Writes:
    fire = noise_masks(key, row["probs"][:1], FLIP, r.chain.shape, draw)[0]
    fire, chain = (jnp.where(row["is_else"], fire & ~r.chain, fire), jnp.where(row["is_else"], r.chain | fire, fire))
    return _xor_slots(r, row, jnp.broadcast_to(fire, r.xa.shape))._replace(chain=chain)


def _xor_slots(r: _Reads, row, masks) -> _Writes:
    """XOR the Pauli (px, pz) of each active slot, where `masks` (S, words), into its q0 rows."""
    on = lambda flag: jnp.where((row["active"] & flag)[:, None], masks, jnp.uint32(0))
    return _unchanged(r)._replace(xa=r.xa ^ on(row["px"]), za=r.za ^ on(row["pz"]))


def _op_feedback(r: _Reads, row, key) -> _Writes:
    return _xor_slots(r, row, r.record[jnp.where(row["active"], r.base - row["rec"], r.record.shape[0] - 1)])


def _op_mpad(r: _Reads, row, key, draw: Draw | None) -> _Writes:
    flips = noise_masks(key, row["probs"][:1], FLIP, r.xa.shape, draw)[0]
    return _unchanged(r)._replace(flips=flips)


_OPS = (_op_gate, _op_measure, _op_noise, _op_correlated, _op_feedback, _op_mpad)


def run_program(structure, tables, key, num_qubits: int, num_measurements: int, words: int, kernel: str = "auto",
                limits: tuple | None = None):
    """Frames of `32 * words` shots through a lowered program's segments. Returns the record flips
    (M + 1, words), the last row zero (the parity of no measurement, for the detector and observable
    tables). kernel: "auto" (on GPUs the Pallas kernel of `frame_kernel`, one launch an op table;
    elsewhere the flat program's loop below), "jax", "pallas" or "interpret" (the kernel run by
    Pallas's interpreter: tests). limits: as `noise_limits` of the flat table (None: computed; the
    kernel draws every noise sparsely). Runs under jax.enable_x64: the noise draws need float64
    whatever the global setting (pass tables converted under it, or numpy)."""
    engine = frame_engine(kernel, words)
    with jax.enable_x64(True):
        if engine != "jax":
            return _run_kernel(structure, tables, key, num_qubits, num_measurements, words, engine)
        flat, qubits, records = flatten(structure, tables, num_qubits, num_measurements)
        limits = noise_limits(flat.table) if limits is None else limits
        record = _run_flat(flat.table, flat.ops, key, qubits, records, flat.depth, words, limits)
        return record[:num_measurements + 1]


def frame_engine(kernel: str, words: int) -> str:
    """What runs frames of `words` words: "jax" (the flat loop), "pallas" or "interpret" (`frame_kernel`)."""
    return kernels.kernel_mode(kernel, words) if frame_kernel.block_words(words) else "jax"


# XLA's GPU autotuner times candidate kernels on buffers of the program's size: compiling the d = 5
# surface code's program for 32,768 words took 36.4 s with it and 4.1 s without (H100, jax 0.11.2,
# 2026-11-25); the program has no matrix products or convolutions, which is what it tunes best.
# XLA:GPU puts runs of at least xla_gpu_graph_min_graph_size commands into CUDA graphs: with its
# default of 5, once the op step's rows left the switch, the noise draws' conditionals of the d = 5
# surface code's program ran from the host (48 more waits on the device: 7.7-8.1 ms warm for 1e5
# shots against 5.9-6.1 ms with 1; d = 17 29.3 against 28.5-28.8 ms; H100, jax 0.11.2, 2026-11-25).
COMPILER_OPTIONS = {"xla_gpu_autotune_level": 0, "xla_gpu_graph_min_graph_size": 1}
FLAT_STATIC = ("qubits", "records", "depth", "words", "limits")
KERNEL_STATIC = ("structure", "num_qubits", "num_measurements", "words", "kernel")


def _initial(key, qubits: int, words: int) -> Frames:
    """Every qubit starts freshly reset: its frame's Z part is random (harmless on |0>)."""
    return Frames(jnp.zeros((qubits, words), jnp.uint32), random_bits(fold_words(key_words(key), 2**32 - 1, 3),
                                                                      (qubits, words)))


def flat_record(table, ops, key, qubits: int, records: int, depth: int, words: int, limits):
    """The record (records, words) of a Flat program (`stabilizer.circuits.program.flatten`; frames of
    `qubits` rows, the spare last) run by the op rules above, to trace inside a larger program (under
    jax.enable_x64). Rows past the program's measurements stay zero."""
    carry = _Carry(_initial(key, qubits, words), jnp.zeros((records, words), jnp.uint32), jnp.zeros((), jnp.int32),
                   jnp.zeros((), jnp.uint32), jnp.zeros(words, jnp.uint32))
    ops_ = list(_OPS)
    for kind in NOISY_KINDS:
        ops_[kind] = partial(_OPS[kind], draw=limits[kind])
    return run_flat(table, ops, depth, carry, ops_, key_words(key), read=_read, write=_write, fold=fold_words).record


def kernel_record(structure, tables, key, num_qubits, num_measurements, words, kernel):
    """The record (M + 1, words) of a program's segments run by `frame_kernel` (GPUs; "interpret": its
    interpreter), to trace inside a larger program (under jax.enable_x64)."""
    f = _initial(key, num_qubits + 1, words)
    record = jnp.zeros((num_measurements + 1, words), jnp.uint32)
    return frame_kernel.run_segments(structure, tables, f.x, f.z, record, key_words(key),
                                     interpret=kernel == "interpret")


_run_flat = jax.jit(flat_record, static_argnames=FLAT_STATIC, compiler_options=COMPILER_OPTIONS)
_run_kernel = jax.jit(kernel_record, static_argnames=KERNEL_STATIC, compiler_options=COMPILER_OPTIONS)
