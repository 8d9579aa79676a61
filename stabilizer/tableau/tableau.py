"""The bit-packed inverse stabilizer tableau and its pure update rules.

The state U|0...0> is stored as the inverse tableau T(P) = U^dagger P U (Stim's convention, DESIGN.md
section 5): row q holds T(X_q), row N + q holds T(Z_q), each as packed x and z bits over N qubits
(uint32 words, qubit j is bit j % 32 of word j // 32) with a sign bit, Y = i X Z per site. Then

* a gate G applied to the state is prepended: T'(P) = T(G^dagger P G), a product of the rows of
  G's qubits, from G's Heisenberg action in the shared gate table;
* measuring Z_q reads row N + q: no x bits means deterministic, the outcome is its sign;
* a random outcome collapses the state with gates appended at the start of time, which act on every
  row's columns: a CX fan-out from the pivot (an exclusive prefix-XOR along the row gives the
  signs of the whole fan-out at once, QuaSARQ section 3.2), then H or H_YZ, then X to set the result.

All functions are pure (state in, state out) and jit-compiled per tableau size and batch size.
"""

from __future__ import annotations

import os
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..circuits.program import GATE, MEASURE, gate_catalogue, pair_codes, run_segments
from . import kernels
from .kernels import pack

WORD = 32


class Tableau(NamedTuple):
    """Inverse tableau over N qubits (N a multiple of 32): rows 0..N-1 are T(X_q), N..2N-1 are T(Z_q)."""

    xs: jax.Array  # (2N, W) uint32
    zs: jax.Array  # (2N, W) uint32
    signs: jax.Array  # (2N,) bool, True = -1

    @property
    def capacity(self) -> int:
        return self.xs.shape[1] * WORD


def identity(num_qubits: int) -> Tableau:
    """The identity tableau for at least `num_qubits` qubits, built on the device. Capacity is rounded
    up to whole words, and then to rows the GPU kernels can block (kernels.padded_words)."""
    return _identity(kernels.padded_words(max(1, -(-num_qubits // WORD))) * WORD)


@partial(jax.jit, static_argnums=(0,))
def _identity(n: int) -> Tableau:
    q = jnp.arange(n)
    eye = jnp.zeros((2 * n, n // WORD), jnp.uint32)
    bit = jnp.uint32(1) << (q % WORD).astype(jnp.uint32)
    return Tableau(eye.at[q, q // WORD].set(bit), eye.at[n + q, q // WORD].set(bit), jnp.zeros(2 * n, bool))


def grow(t: Tableau, num_qubits: int) -> Tableau:
    """The same state with capacity for at least `num_qubits` (the new qubits in |0>), on the device.
    Capacity at least doubles, so growing one qubit at a time costs amortised O(1) copies."""
    if num_qubits <= t.capacity:
        return t
    big = identity(max(num_qubits, 2 * t.capacity))
    n, n2, w = t.capacity, big.capacity, t.xs.shape[1]
    xs = big.xs.at[:n, :w].set(t.xs[:n]).at[n2:n2 + n, :w].set(t.xs[n:])
    zs = big.zs.at[:n, :w].set(t.zs[:n]).at[n2:n2 + n, :w].set(t.zs[n:])
    signs = big.signs.at[:n].set(t.signs[:n]).at[n2:n2 + n].set(t.signs[n:])
    return Tableau(xs, zs, signs)


# ---- Pauli rows ------------------------------------------------------------------------------------

def _popcount(v):
    return jnp.sum(lax.population_count(v).astype(jnp.int32), axis=-1)


def product_phase(x1, z1, x2, z2):
    """g with P1 P2 = i^g (P1 xor P2) for Hermitian Pauli rows (summed over the last axis)."""
    X1, Y1, Z1 = x1 & ~z1, x1 & z1, ~x1 & z1
    X2, Y2, Z2 = x2 & ~z2, x2 & z2, ~x2 & z2
    plus = (X1 & Y2) | (Y1 & Z2) | (Z1 & X2)
    minus = (X1 & Z2) | (Y1 & X2) | (Z1 & Y2)
    return _popcount(plus) - _popcount(minus)


def _bit(words, q):
    """Bit q of every row: words (R, W), q scalar -> (R,) uint32 in {0, 1}."""
    return (words[:, q // WORD] >> (q % WORD).astype(jnp.uint32)) & jnp.uint32(1)


def _set_bit(words, q, bits):
    w, b = q // WORD, (q % WORD).astype(jnp.uint32)
    col = words[:, w]
    col = (col & ~(jnp.uint32(1) << b)) | (bits.astype(jnp.uint32) << b)
    return words.at[:, w].set(col)


# ---- gates: prepend a batch of gates on disjoint qubits -------------------------------------------

def _products_jax(xs, zs, rows, codes):
    """The pure-JAX rule of kernels.prepend_rows (same arguments and results, not in place)."""
    gx, gz = xs[rows], zs[rows]  # (k, G, W)
    outs_x, outs_z, phases = [], [], []
    for g in range(rows.shape[1]):
        x, z = jnp.zeros_like(gx[:, 0]), jnp.zeros_like(gz[:, 0])
        phase = jnp.zeros(rows.shape[0], jnp.int32)
        for f in range(rows.shape[1]):
            use = ((codes[:, g] >> f) & 1).astype(bool)[:, None]
            fx, fz = jnp.where(use, gx[:, f], 0), jnp.where(use, gz[:, f], 0)
            phase = phase + product_phase(x, z, fx, fz)
            x, z = x ^ fx, z ^ fz
        outs_x.append(x)
        outs_z.append(z)
        phases.append(phase)
    flat = rows.reshape(-1)
    keep = flat >= 0
    flat = jnp.where(keep, flat, xs.shape[0])  # inactive slots write nowhere
    xs = xs.at[flat].set(jnp.stack(outs_x, 1).reshape(flat.shape[0], -1), mode="drop")
    zs = zs.at[flat].set(jnp.stack(outs_z, 1).reshape(flat.shape[0], -1), mode="drop")
    return xs, zs, jnp.where(rows[:, :1] >= 0, jnp.stack(phases, 1) % 4, 0)


@partial(jax.jit, static_argnames=("arity", "kernel", "live_qubits"), donate_argnums=(0,))
def prepend(t: Tableau, qubits, image, sign, active, arity: int, kernel: str = "auto",
            live_qubits: int | None = None) -> Tableau:
    """Apply gates on disjoint qubits: qubits (k, arity) int32; image, sign (k, 4**arity) the Heisenberg
    action P -> G^dagger P G of each gate on local Pauli codes (bit 2j: x of qubit j, 2j+1: z);
    active (k,) bool: padding slots are False and do nothing.

    kernel: "auto" (the Pallas kernel on GPUs, pure JAX elsewhere), "jax", "pallas" or "interpret"
    (the Pallas kernel interpreted on any backend, for tests). live_qubits: no gate so far, these
    included, has touched a qubit from this one on (so the rows the gates name have no bits there: the
    kernel skips those words; the capacity rounds 10,001 qubits up to 12,288); None: every qubit.
    """
    n = t.capacity
    rows = jnp.concatenate([jnp.stack([qubits[:, j], n + qubits[:, j]], axis=1) for j in range(arity)], axis=1)
    rows = jnp.where(active[:, None], rows, -1)
    gens = [1 << g for g in range(2 * arity)]  # the local generators X_a, Z_a, X_b, Z_b
    codes = image[:, gens]
    mode = kernels.kernel_mode(kernel, t.xs.shape[1])
    if mode == "jax":
        xs, zs, phase = _products_jax(t.xs, t.zs, rows, codes)
    else:
        live = None if live_qubits is None else -(-live_qubits // WORD)
        xs, zs, phase = kernels.prepend_rows(t.xs, t.zs, rows, codes, live_words=live, interpret=mode == "interpret")
    # T(P_code) = i^{#Y} T(X_a)^{x_a} T(Z_a)^{z_a} ...: add the factors' signs, the Ys and the image sign
    factor_signs = t.signs[jnp.maximum(rows, 0)].astype(jnp.int32)  # (k, G)
    uses = (codes[:, :, None] >> jnp.arange(2 * arity)) & 1  # (k, G generators, G factors)
    ys = sum(((codes >> (2 * j)) & (codes >> (2 * j + 1)) & 1) for j in range(arity))
    phase = phase + 2 * jnp.sum(uses * factor_signs[:, None, :], axis=-1) + ys + jnp.where(sign[:, gens] < 0, 2, 0)
    flat = jnp.where(rows >= 0, rows, 2 * n).reshape(-1)
    signs = t.signs.at[flat].set(((phase % 4) == 2).reshape(-1), mode="drop")
    return Tableau(xs, zs, signs)


@jax.jit
def flip_signs(t: Tableau, x_flip, z_flip) -> Tableau:
    """Prepend Paulis: x_flip (N,) bool applies X on those qubits (negates T(Z_q)), z_flip applies Z
    (negates T(X_q)); both: Y."""
    return t._replace(signs=t.signs ^ jnp.concatenate([z_flip, x_flip]))


# ---- measurement ---------------------------------------------------------------------------------

def _exclusive_prefix_xor(v):
    """Bit j of the result is the XOR of bits < j of the row (words (R, W), bit order as qubits)."""
    inc = v
    for s in (1, 2, 4, 8, 16):
        inc = inc ^ (inc << jnp.uint32(s))
    parity = (lax.population_count(v) & 1).astype(jnp.uint32)
    carry = (jnp.cumsum(parity, axis=1, dtype=jnp.uint32) - parity) & 1  # parity of earlier words
    return (inc ^ v) ^ (jnp.uint32(0) - carry)


# Heisenberg actions (P -> V^dagger P V on codes x | z << 1) of the collapse's single-qubit gates
_H = (np.array([0, 2, 1, 3]), np.array([1, 1, 1, -1]))
_H_YZ = (np.array([0, 1, 3, 2]), np.array([1, -1, 1, 1]))


def _append_1q(t: Tableau, q, image, sign) -> Tableau:
    code = (_bit(t.xs, q) | (_bit(t.zs, q) << 1)).astype(jnp.int32)
    new = image[code]
    return Tableau(_set_bit(t.xs, q, new & 1), _set_bit(t.zs, q, (new >> 1) & 1), t.signs ^ (sign[code] < 0))


def _fan_out_jax(xs, zs, kmask, xp, zp):
    """The pure-JAX rule of kernels.collapse_rows (same arguments and results, not in place)."""
    zk = zs & kmask
    before = _exclusive_prefix_xor(zk) ^ (jnp.uint32(0) - zp)[:, None]  # z of the pivot before each CX
    flips = _popcount(zk & ~(xs ^ before)) & 1
    return xs ^ (kmask & (jnp.uint32(0) - xp)[:, None]), flips, (_popcount(zk) & 1).astype(jnp.uint32)


def _collapse(t: Tableau, q, result, kernel: str = "jax"):
    """Random Z_q measurement forced to `result`: Stim's collapse (see the module docstring).
    Returns (tableau, pivot): X on the pivot at the start of time flips the outcome."""
    t, pivot, _, _, _ = _collapse_row(t, t.capacity + q, result, jnp.bool_(True), kernel)
    return t, pivot


_IDENTITY_1Q = (np.arange(4), np.ones(4, np.int32))


def _collapse_row(t: Tableau, r, result, random, kernel: str = "jax"):
    """Stim's collapse of the measured row r (T(Z_q)) forced to `result`, on every row of t (t may be
    any set of rows); nothing happens where `random` is False. Returns (tableau, pivot, kmask, use_yz,
    fix): the column operations it appended, which `_apply_block` replays (CX from the pivot to the
    columns of kmask, then H_YZ if use_yz else H on the pivot, then X on the pivot if fix)."""
    row = t.xs[r]
    w = jnp.argmax(row != 0)
    low = row[w] & (jnp.uint32(0) - row[w])
    pivot = w * WORD + lax.population_count(low - jnp.uint32(1)).astype(jnp.int32)
    # CX(pivot, k) for every other k with an x bit in T(Z_q), appended to every row at once
    kmask = jnp.where(random, row.at[w].set(row[w] & ~low), jnp.uint32(0))
    xp, zp = _bit(t.xs, pivot), _bit(t.zs, pivot)
    mode = kernels.kernel_mode(kernel, t.xs.shape[1])
    if mode == "jax":
        xs, flips, zpar = _fan_out_jax(t.xs, t.zs, kmask, xp, zp)
    else:
        xs, flips, zpar = kernels.collapse_rows(t.xs, t.zs, kmask, xp, zp, interpret=mode == "interpret")
    t = Tableau(xs, _set_bit(t.zs, pivot, zp ^ zpar), t.signs ^ ((xp == 1) & (flips == 1)))
    # now T(Z_q) has a single x bit, at the pivot: rotate it to Z there
    use_yz = _bit(t.zs, pivot)[r] == 1
    image = jnp.where(random, jnp.where(use_yz, jnp.asarray(_H_YZ[0]), jnp.asarray(_H[0])), _IDENTITY_1Q[0])
    sign = jnp.where(random, jnp.where(use_yz, jnp.asarray(_H_YZ[1]), jnp.asarray(_H[1])), _IDENTITY_1Q[1])
    t = _append_1q(t, pivot, image, sign)
    # X at the start of time flips every row with a Z or Y at the pivot: sets the outcome
    fix = random & (t.signs[r] != result)
    t = t._replace(signs=t.signs ^ (fix & (_bit(t.zs, pivot) == 1)))
    return t, pivot.astype(jnp.int32), kmask, use_yz, fix


@partial(jax.jit, static_argnames=("kernel",), donate_argnums=(0,))
def measure_z(t: Tableau, q, random_result, kernel: str = "auto"):
    """Measure Z on qubit q. Returns (tableau, outcome, was_random); a random outcome is `random_result`.
    kernel: as in `prepend` (the collapse's fan-out)."""
    return _measure_z_inner(t, q, random_result, kernel)


@partial(jax.jit, static_argnames=("kernel",), donate_argnums=(0,))
def measure_kickback_z(t: Tableau, q, random_result, kernel: str = "auto"):
    """`measure_z` that also returns the kickback of a random outcome: (tableau, outcome, was_random,
    x bits (N,), z bits (N,)) of the Pauli U X_p U^dagger, p the collapse's pivot, which flips
    between the two post-measurement states (Stim's measure_kickback; bits are 0 if determined).

    Its bits are read off the pivot's column, with no inversion: the forward image F(X_p) has an x
    on qubit j where it anticommutes with Z_j, that is where X_p anticommutes with T(Z_j) (z bit p of
    row N + j), and a z on j where X_p anticommutes with T(X_j) (z bit p of row j)."""
    n = t.capacity
    t, result, was_random, pivot = _measure_z_inner(t, q, random_result, kernel, with_pivot=True)
    column = (_bit(t.zs, pivot) == 1) & was_random
    return t, result, was_random, column[n:], column[:n]


@jax.jit
def peek_z(t: Tableau, q):
    """+1 or -1 if Z_q is determined, 0 if a measurement would be random."""
    n = t.capacity
    random = jnp.any(t.xs[n + q] != 0)
    return jnp.where(random, 0, jnp.where(t.signs[n + q], -1, 1))


# ---- many Z measurements at once: blocks of MEASURE_BLOCK, one pass over the tableau a block -------
#
# Measuring qubits one by one moves the whole tableau once per random outcome. A block of b targets
# is done in two steps instead:
#
# 1. plan: the b measured rows T(Z_q) alone are collapsed one after another (`_collapse_row` on a
#    (b, W) tableau). A collapse is a list of column operations whose parameters (pivot, fan-out
#    columns, H or H_YZ, X) depend on the measured row only, and each row evolves under column
#    operations by itself, so this small problem gives every outcome and every operation exactly as
#    the sequential rule would.
# 2. apply: the b collapses are replayed on all 2N rows in one pass. Within a block z bits change only
#    at pivot columns and x bits are read only there, so a row's part in the replay is its bits at
#    the (at most b) pivot columns, one uint32 each for x and z, plus the parities of its z bits
#    under each fan-out mask off the pivot columns (one XOR-and reduction). The b steps run on those
#    words; the x bits off the pivots take the XOR of the fan-out masks a row's controls select (four
#    8-bit lookup tables, M4RI style). Signs: a CNOT circuit maps X^x Z^z to X^x' Z^z' with no
#    phase, so with P = i^{#Y} X^x Z^z a row's sign changes by i^(#Y before - #Y after + the phases
#    of the pivots' H, H_YZ and X), all read from the pivot words.
#
# The result is bit for bit the tableau of the sequential rule with the same random outcomes. On GPUs
# both steps are Pallas kernels (kernels.plan_rows, kernels.apply_rows, whose inputs kernels.replay_inputs
# makes from the plan in one launch), checked against these rules; there a block's apply launch also
# plans the next block (`_measure_many_inner`'s loop), so the plan's one long program runs beside the
# apply's many instead of after them.

MEASURE_BLOCK = 32  # targets planned together: a row's bits at their pivots fill one uint32
# a MEASURE op runs in blocks when its table has room for a block (MEASURE_BLOCK slots or more) and at
# least this many slots are active; below it, one collapse per random outcome moves less data.
# STABILIZER_MEASURE=slots (read when a program is traced) turns blocks off, for A/B timings.
BATCH_MIN_ACTIVE = 16


def _columns(words, cols):
    """Bits at columns cols (b,) of every row: words (R, W) -> (R, b) uint32 0/1."""
    return (words[:, cols // WORD] >> (cols % WORD).astype(jnp.uint32)) & jnp.uint32(1)


def _xor_table(rows):
    """(F, W) words -> (2^F, W): entry v is the XOR of the rows at the set bits of v."""
    f = rows.shape[0]
    use = (jnp.arange(1 << f, dtype=jnp.uint32)[:, None] >> jnp.arange(f, dtype=jnp.uint32)) & 1  # (2^F, F)
    picked = jnp.where(use[:, :, None] == 1, rows[None], jnp.uint32(0))
    return lax.reduce(picked, jnp.uint32(0), lax.bitwise_xor, (1,))


class _Plan(NamedTuple):
    pivot: jax.Array  # (b,) int32 column of each collapse (0 where not random)
    kmask: jax.Array  # (b, W) uint32 its fan-out columns (0 where not random)
    use_yz: jax.Array  # (b,) bool
    fix: jax.Array  # (b,) bool
    random: jax.Array  # (b,) bool
    outcome: jax.Array  # (b,) bool


def _plan_from_kernel(pivot, kmask, flags, window=None) -> _Plan:
    """A plan as kernels.plan_rows returns it (flags: bit 0 random, 1 use_yz, 2 fix, 3 outcome; the
    window of words is not part of the rule's plan)."""
    bit = lambda i: (flags >> i) & 1 == 1
    return _Plan(pivot, kmask, bit(1), bit(2), bit(0), bit(3))


def _plan_for_kernel(plan: _Plan):
    """The inverse of _plan_from_kernel: (pivot, kmask, flags, window), the window every word."""
    flags = sum(v.astype(jnp.int32) << i for i, v in enumerate((plan.random, plan.use_yz, plan.fix, plan.outcome)))
    return plan.pivot, plan.kmask, flags, jnp.array([0, plan.kmask.shape[1]], jnp.int32)


def _plan_args(rows: Tableau, active, guesses):
    """A block's measured rows and choices as kernels.plan_rows takes them (flags as int32 0/1)."""
    as_int = lambda v: v.astype(jnp.int32)
    return rows.xs, rows.zs, as_int(rows.signs), as_int(active), as_int(guesses)


def _plan_block(rows: Tableau, active, guesses, kernel: str = "jax") -> _Plan:
    """Step 1: collapse the measured rows (rows (b, W): row j is T(Z_q_j)) in order. kernel: as in
    `prepend` (the Pallas plan is one program; its use_yz is not this rule's where not random)."""
    b, w = rows.xs.shape
    mode = kernels.kernel_mode(kernel, w)
    if mode != "jax":
        return _plan_from_kernel(*kernels.plan_rows(*_plan_args(rows, active, guesses), interpret=mode == "interpret"))
    plan = _Plan(jnp.zeros(b, jnp.int32), jnp.zeros((b, w), jnp.uint32), jnp.zeros(b, bool), jnp.zeros(b, bool),
                 jnp.zeros(b, bool), jnp.zeros(b, bool))

    def step(j, carry):
        rows, plan = carry
        random = active[j] & jnp.any(rows.xs[j] != 0)
        rows, pivot, kmask, use_yz, fix = _collapse_row(rows, j, guesses[j], random)
        plan = _Plan(plan.pivot.at[j].set(jnp.where(random, pivot, 0)), plan.kmask.at[j].set(kmask),
                     plan.use_yz.at[j].set(use_yz), plan.fix.at[j].set(fix), plan.random.at[j].set(random),
                     plan.outcome.at[j].set(rows.signs[j]))
        return rows, plan

    return lax.fori_loop(0, b, step, (rows, plan))[1]


class _Replay(NamedTuple):
    """What step 2 reads of a plan (see the section comment)."""
    word: jax.Array  # (b,) int32 each collapse's pivot word
    shift: jax.Array  # (b,) uint32 its bit in the word
    first: jax.Array  # (b,) uint32 1 where the pivot column is new to the block (its slot)
    slot: jax.Array  # (b,) uint32 the slot of its pivot column (its first collapse)
    pivot_bits: jax.Array  # (b,) uint32 each distinct pivot's bit in its word
    pmask: jax.Array  # (W,) uint32 the block's pivot columns
    kext: jax.Array  # (b, W) uint32 the fan-outs off the pivot columns
    kp: jax.Array  # (b,) uint32 the fan-outs at the pivot columns, as slot bits
    tables: list  # XORs of the fan-outs, F = kernels.TABLE_FANOUTS controls a (2^F, W) table


def _replay(plan: _Plan, words: int) -> _Replay:
    b = plan.pivot.shape[0]
    slots = jnp.arange(b)
    p, random = plan.pivot, plan.random
    # a pivot column may recur in a block: its bits live at the slot of its first collapse
    same = (p[:, None] == p[None, :]) & random[:, None] & random[None, :]
    slot = jnp.argmax(same, axis=1).astype(jnp.uint32)
    first = (random & (slot == slots)).astype(jnp.uint32)
    word, shift = p // WORD, (p % WORD).astype(jnp.uint32)
    pivot_bits = first << shift  # (b,): each distinct pivot once
    pmask = jnp.zeros(words, jnp.uint32).at[word].add(pivot_bits)  # distinct bits: add is OR
    kext = plan.kmask & ~pmask
    kp = pack(((plan.kmask[:, word] >> shift) & 1) * first)  # fan-out j's pivot columns, as slot bits
    f = kernels.TABLE_FANOUTS
    tables = [_xor_table(kext[g:g + f]) for g in range(0, b, f)]
    return _Replay(word, shift, first, slot, pivot_bits, pmask, kext, kp, tables)


def _apply_block(t: Tableau, plan: _Plan, kernel: str = "jax", skip=None) -> Tableau:
    """Step 2: the planned collapses on every row of t, in one pass (see the section comment). kernel:
    as in `prepend` (the Pallas kernel, kernels.apply_rows); skip (R / kernels.APPLY_ROWS,) int32,
    for the kernel: nonzero for blocks of rows the collapses leave as they are (the pure rule
    computes them anyway: the same bits)."""
    b = plan.pivot.shape[0]
    slots = jnp.arange(b)
    mode = kernels.kernel_mode(kernel, t.xs.shape[1])
    if mode != "jax":
        if skip is None:
            skip = jnp.zeros(t.xs.shape[0] // kernels.APPLY_ROWS, jnp.int32)
        return _apply_planned(t, _plan_for_kernel(plan), skip, mode == "interpret")
    r = _replay(plan, t.xs.shape[1])
    p, random = plan.pivot, plan.random
    xo = pack(_columns(t.xs, p) * r.first)  # (R,) each row's bits at the pivots
    zo = pack(_columns(t.zs, p) * r.first)

    def parity(j, zk):  # bit j: parity of the row's z under kext[j] (a loop: 5x faster than one
        # (R, b, W) reduction on the 2-core CPU at 16,384 x 256 words, 0.06 s against 0.29 s a block)
        ones = jnp.sum(lax.population_count(t.zs & r.kext[j]), axis=1, dtype=jnp.uint32)
        return zk | ((ones & 1) << j.astype(jnp.uint32))

    zk = lax.fori_loop(0, b, parity, jnp.zeros(t.xs.shape[0], jnp.uint32))
    ys_before = _popcount(t.xs & t.zs)
    one = jnp.uint32(1)

    def step(j, carry):
        j = j.astype(jnp.uint32)
        return kernels.replay_collapse(*carry, j, (zk >> j) & one, r.slot[j], random[j], plan.use_yz[j], plan.fix[j],
                                       r.kp[j])

    zero = jnp.zeros(t.xs.shape[0], jnp.uint32)
    xn, zn, controls, phase = lax.fori_loop(0, b, step, (xo, zo, zero, jnp.zeros(t.xs.shape[0], jnp.int32)))
    xs = t.xs  # off the pivots: XOR of the fan-out masks the row's controls select (kext has no pivot bits)
    f = kernels.TABLE_FANOUTS
    for g, table in enumerate(r.tables):
        xs = xs ^ table[(controls >> (f * g)) & ((1 << f) - 1)]

    def set_pivots(words, new, old):  # pivot bits from `old` to `new` (slot bits (R,)): adding the
        # difference at distinct bits is exact, and a recurring pivot column is one slot
        bit = lambda v: (v[:, None] >> slots.astype(jnp.uint32)) & 1
        return words.at[:, r.word].add((bit(new) - bit(old)) * r.pivot_bits)

    xs, zs = set_pivots(xs, xn, xo), set_pivots(t.zs, zn, zo)
    flip = ((ys_before - _popcount(xs & zs) + phase) % 4) == 2
    return Tableau(xs, zs, t.signs ^ flip)


def _apply_planned(t: Tableau, planned, skip, interpret: bool) -> Tableau:
    """Step 2 on the kernel path, from a plan as the kernels return it (pivot, kmask, flags, window): two
    launches, kernels.replay_inputs and kernels.apply_rows (the measure loop makes them itself, with the
    next block's plan in the apply's launch)."""
    *plan, window = planned
    inputs = kernels.replay_inputs(*plan, interpret=interpret)
    xs, zs, signs = kernels.apply_rows(t.xs, t.zs, t.signs.astype(jnp.int32), *inputs, skip, window,
                                       interpret=interpret)
    return Tableau(xs, zs, signs == 1)


def _settled(t: Tableau):
    """(2N,) bool: the rows of qubits the state leaves alone (T(X_q) = +-X_q and T(Z_q) = +-Z_q: U is a
    Pauli on q times a unitary on the rest). No measured row has support on such a q, so no collapse
    reads or changes these rows (the capacity's unused qubits: 2,288 of 12,288 at 10,000 qubits)."""
    n = t.capacity
    q = jnp.arange(n)
    word, bit = q // WORD, jnp.uint32(1) << (q % WORD).astype(jnp.uint32)
    only_q = lambda w: (_popcount(w) == 1) & ((w[q, word] & bit) != 0)  # the one bit of row q is bit q
    none = lambda w: ~jnp.any(w != 0, axis=1)
    alone = only_q(t.xs[:n]) & none(t.zs[:n]) & none(t.xs[n:]) & only_q(t.zs[n:])
    return jnp.concatenate([alone, alone])


def _measure_many_inner(t: Tableau, qubits, active, guesses, kernel: str = "jax"):
    n, b = t.capacity, MEASURE_BLOCK
    k = qubits.shape[0]
    if k == 0:
        return t, jnp.zeros(0, bool)
    pad = -k % b
    qubits = jnp.concatenate([qubits, jnp.zeros(pad, qubits.dtype)])
    active = jnp.concatenate([active, jnp.zeros(pad, bool)])
    guesses = jnp.concatenate([guesses, jnp.zeros(pad, bool)])
    blocks = (k + pad) // b
    mode = kernels.kernel_mode(kernel, t.xs.shape[1])
    if mode == "jax":
        part = lambda a, i: lax.dynamic_slice_in_dim(a, i * b, b)
        measured = lambda t, i: Tableau(*(a[n + part(qubits, i)] for a in t))
        record = lambda outcomes, bits, i: lax.dynamic_update_slice_in_dim(outcomes, bits, i * b, 0)  # block i's

        def block(i, carry):
            t, outcomes = carry
            plan = _plan_block(measured(t, i), part(active, i), part(guesses, i), kernel)
            t = lax.cond(jnp.any(plan.random), partial(_apply_block, kernel=kernel), lambda t, plan: t, t, plan)
            return t, record(outcomes, plan.outcome, i)

        last = jnp.max(jnp.where(active, jnp.arange(k + pad), -1))  # no block after the last active slot
        t, outcomes = lax.fori_loop(0, (last + b) // b, block, (t, jnp.zeros(k + pad, bool)))
        return t, outcomes[:k]

    # The kernel path runs every block (a loop count or a conditional from data waits for the host each
    # block; the kernels skip empty blocks) as one kind of launch: launch i applies block i - 1 and plans
    # block i (kernels.apply_rows with a lookahead). Launch 0 applies a plan of no collapses, and the last
    # plans a block of inactive slots, so the op compiles one apply kernel, not also a plan alone and an
    # apply alone (lowering and compiling the op at 10,000 qubits on an H100: 4.1-4.4 s, was 4.4-5.7 s,
    # three processes each; the extra launch costs about 0.15 ms). Rows no collapse of the op reads or
    # changes are skipped (a measured row is not among them once collapsed: it is Z at its pivot times Zs
    # elsewhere, and later fan-outs change its z bits). Plans stay as the kernels return them (pivot,
    # kmask, flags, window); the signs, slots and outcomes stay int32 through the loop, the apply
    # updating the signs in place and each plan writing its block's outcomes; the replay launch also
    # copies out the next block's measured rows, so a block launches its two kernels, the loop's count
    # and one small copy, not also small kernels for the gather, conversions, sign XORs or the record
    # (measure-all at 10,000 qubits on an H100, 2026-11-27: a block every 124 us, was 130).
    interpret = mode == "interpret"
    skip = jnp.all(_settled(t).reshape(-1, kernels.APPLY_ROWS), axis=1).astype(jnp.int32)  # (a block with no
    # random collapse skips every row: the kernel reads that from its plan)
    # for each program of rows, the block after which its rows are all Z rows of qubits this op measured (a
    # Z row is x-free once its qubit is measured, and later blocks only clear its z bits at their pivots:
    # kernels._clear_pivots); X rows and rows of qubits not measured here never are
    never = jnp.int32(1 << 30)
    block_of = jnp.full(n, never).at[qubits].min(jnp.where(active, jnp.arange(k + pad, dtype=jnp.int32) // b, never))
    rows = kernels.APPLY_ROWS
    measured_by = jnp.concatenate([jnp.full(n // rows, never), jnp.max(block_of.reshape(-1, rows), axis=1)])
    # through the loop as the kernels take them (int32 0/1; the slots of one more block, all inactive,
    # for the last launch to plan); the record is written by the plans
    slots = lambda a: jnp.concatenate([a.astype(jnp.int32), jnp.zeros(b, jnp.int32)])
    qubits, active, guesses = slots(qubits), slots(active), slots(guesses)
    none_planned = (jnp.zeros(b, jnp.int32), jnp.zeros((b, t.xs.shape[1]), jnp.uint32), jnp.zeros(b, jnp.int32),
                    jnp.zeros(2, jnp.int32))

    def block(i, carry):
        xs, zs, signs, bits, planned = carry
        *plan, window = planned
        i = i.reshape(1)
        *inputs, nx, nz, nsigns = kernels.replay_inputs(*plan, following=(xs, zs, signs, qubits, i), interpret=interpret)
        lookahead = (nx, nz, nsigns, active, guesses, i, bits, measured_by)
        return kernels.apply_rows(xs, zs, signs, *inputs, skip, window, lookahead=lookahead, interpret=interpret)

    start = (t.xs, t.zs, t.signs.astype(jnp.int32), jnp.zeros(k + pad + b, jnp.int32), none_planned)
    xs, zs, signs, bits, _ = lax.fori_loop(0, blocks + 1, block, start)
    return Tableau(xs, zs, signs == 1), bits[:k] == 1


@partial(jax.jit, static_argnames=("kernel",), donate_argnums=(0,))
def measure_many_z(t: Tableau, qubits, active, random_results, kernel: str = "auto"):
    """Measure Z on distinct qubits (k,) int32 in order, in blocks of MEASURE_BLOCK (see above);
    slots where active (k,) is False do nothing. Returns (tableau, outcomes (k,) bool); a random
    outcome is its `random_results` entry. Same tableau and outcomes as `measure_z` in a loop.
    kernel: as in `prepend` (a block's plan and apply)."""
    return _measure_many_inner(t, qubits, active, random_results, kernel)


# ---- a lowered program (stabilizer.circuits.program) on the tableau -------------------------------

class _Carry(NamedTuple):
    t: Tableau
    record: jax.Array  # (M + 1,) bool, last entry scratch
    base: jax.Array  # int32: measurements so far
    guesses: jax.Array  # (M + 1,) bool: the outcome each random measurement takes
    counter: jax.Array  # uint32: ops so far (op i draws from fold_in(key, i))
    chain: jax.Array  # bool: the current E / ELSE chain has fired


def _op_gate(c: _Carry, row, key, noisy, kernel: str = "jax", live_qubits: int | None = None) -> _Carry:
    _, _, images, signs = gate_catalogue()
    number = row["gate"].astype(jnp.int32)  # each slot's gate (a merged op mixes them)
    image, sign = jnp.asarray(images)[number], jnp.asarray(signs)[number]
    return c._replace(t=prepend(c.t, row["q"], image, sign, row["active"], arity=2, kernel=kernel,
                                live_qubits=live_qubits))


def _op_measure(c: _Carry, row, key, noisy, kernel: str = "jax") -> _Carry:
    k = row["q"].shape[0]
    flips = jax.random.uniform(key, (k,)) < row["probs"][0] if noisy else jnp.zeros(k, bool)
    if k < MEASURE_BLOCK or os.environ.get("STABILIZER_MEASURE") == "slots":  # the env: for A/B timings
        return _measure_slots(c, row, flips, kernel)
    many = jnp.sum(row["active"]) >= BATCH_MIN_ACTIVE
    return lax.cond(many, partial(_measure_blocks, kernel=kernel), partial(_measure_slots, kernel=kernel), c, row,
                    flips)


def _measure_blocks(c: _Carry, row, flips, kernel: str = "jax") -> _Carry:
    """A MEASURE op in blocks (`_measure_many_inner`): the same tableau and record as `_measure_slots`."""
    n = c.t.capacity
    scratch = c.record.shape[0] - 1
    q, active = row["q"][:, 0], row["active"]
    rec = jnp.where(active & (row["rec"] >= 0), c.base + row["rec"], scratch)
    t, outcomes = _measure_many_inner(c.t, q, active, c.guesses[rec], kernel)
    record = c.record.at[rec].set(outcomes ^ row["invert"] ^ flips)
    # a reset sets the sign after the measurement; the later collapses of the op leave that row alone
    signs = t.signs.at[n + q].set(jnp.where(active & row["reset"], False, t.signs[n + q]))
    return c._replace(t=t._replace(signs=signs), record=record, base=c.base + row["advance"])


def _measure_slots(c: _Carry, row, flips, kernel: str = "jax") -> _Carry:
    """A MEASURE op one slot at a time (one collapse, a full pass over the tableau, per random outcome)."""
    n = c.t.capacity
    scratch = c.record.shape[0] - 1
    k = row["q"].shape[0]

    def slot(j, c):
        def on(c):
            q = row["q"][j, 0]
            rec = jnp.where(row["rec"][j] >= 0, c.base + row["rec"][j], scratch)
            t, result, _ = _measure_z_inner(c.t, q, c.guesses[rec], kernel)
            record = c.record.at[rec].set(result ^ row["invert"][j] ^ flips[j])
            signs = t.signs.at[n + q].set(jnp.where(row["reset"][j], False, t.signs[n + q]))
            return c._replace(t=t._replace(signs=signs), record=record)

        return lax.cond(row["active"][j], on, lambda c: c, c)

    c = lax.fori_loop(0, k, slot, c)
    return c._replace(base=c.base + row["advance"])


def _pauli_signs(c: _Carry, q, x_part, z_part) -> _Carry:
    """Prepend Paulis: an X part negates T(Z_q), a Z part negates T(X_q) (q may repeat as padding)."""
    n = c.t.capacity
    signs = c.t.signs.at[n + q].set(c.t.signs[n + q] ^ x_part)
    signs = signs.at[q].set(signs[q] ^ z_part)
    return c._replace(t=c.t._replace(signs=signs))


def _op_noise(c: _Carry, row, key, noisy) -> _Carry:
    if not noisy:
        return c
    u = jax.random.uniform(key, row["active"].shape)
    event = jnp.sum(u[:, None] >= jnp.cumsum(row["probs"]), axis=-1)
    code = jnp.where(row["active"], jnp.asarray(pair_codes())[event], 0)
    bit = lambda b: ((code >> b) & 1).astype(bool)
    c = _pauli_signs(c, row["q"][:, 0], bit(0), bit(1))
    return _pauli_signs(c, row["q"][:, 1], bit(2), bit(3))


def _op_correlated(c: _Carry, row, key, noisy) -> _Carry:
    if not noisy:
        return c
    fire = jax.random.uniform(key) < row["probs"][0]
    fire = jnp.where(row["is_else"], fire & ~c.chain, fire)
    chain = jnp.where(row["is_else"], c.chain | fire, fire)
    on = row["active"] & fire
    return _pauli_signs(c, row["q"][:, 0], on & row["px"], on & row["pz"])._replace(chain=chain)


def _op_feedback(c: _Carry, row, key, noisy) -> _Carry:
    scratch = c.record.shape[0] - 1
    bit = c.record[jnp.where(row["active"], c.base - row["rec"], scratch)] & row["active"]
    return _pauli_signs(c, row["q"][:, 0], bit & row["px"], bit & row["pz"])


def _op_mpad(c: _Carry, row, key, noisy) -> _Carry:
    scratch = c.record.shape[0] - 1
    k = row["rec"].shape[0]
    flips = jax.random.uniform(key, (k,)) < row["probs"][0] if noisy else jnp.zeros(k, bool)
    record = c.record.at[jnp.where(row["rec"] >= 0, c.base + row["rec"], scratch)].set(row["invert"] ^ flips)
    return c._replace(record=record, base=c.base + row["advance"])


_OPS = (_op_gate, _op_measure, _op_noise, _op_correlated, _op_feedback, _op_mpad)


def _measure_z_inner(t: Tableau, q, random_result, kernel: str = "jax", with_pivot: bool = False):
    n = t.capacity
    was_random = jnp.any(t.xs[n + q] != 0)
    t, pivot = lax.cond(was_random, lambda s: _collapse(s, q, random_result, kernel),
                        lambda s: (s, jnp.zeros((), jnp.int32)), t)
    out = (t, t.signs[n + q], was_random)
    return out + (pivot,) if with_pivot else out


@partial(jax.jit, static_argnames=("structure", "noisy", "kernel", "live_qubits"), donate_argnums=(2,))
def run_program(structure, tables, t: Tableau, guesses, key, noisy: bool, kernel: str = "auto",
                live_qubits: int | None = None):
    """Run a lowered program on tableau `t`: (final tableau, measurement record).

    guesses (M,) bool: the outcome each measurement takes if it is random; noisy: sample the noise
    channels and measurement flips (else the run is noiseless, as a reference shot); kernel, live_qubits:
    as in `prepend` (no operation of the program or before it on `t` touches a qubit from live_qubits on).
    """
    m = guesses.shape[0]
    c = _Carry(t, jnp.zeros(m + 1, bool), jnp.zeros((), jnp.int32), jnp.concatenate([guesses, jnp.zeros(1, bool)]),
               jnp.zeros((), jnp.uint32), jnp.zeros((), bool))
    ops = [partial(op, noisy=noisy) for op in _OPS]
    ops[GATE] = partial(_op_gate, noisy=noisy, kernel=kernel, live_qubits=live_qubits)
    ops[MEASURE] = partial(_op_measure, noisy=noisy, kernel=kernel)
    c = run_segments(structure, tables, c, ops, key)
    return c.t, c.record[:m]


def reference_record(structure, tables, num_qubits: int, num_measurements: int):
    """The noiseless record of a lowered program, random outcomes taken as 0 (Stim's reference sample)."""
    _, record = run_program(structure, tables, identity(num_qubits + 1), jnp.zeros(num_measurements, bool),
                            jax.random.key(0), noisy=False, live_qubits=num_qubits + 1)
    return record
