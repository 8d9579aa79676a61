"""The tableau's Pallas kernels (stabilizer/tableau/kernels.py), compiled on a GPU and interpreted on the CPU:
each equals the pure-JAX rule it replaces, bit for bit, and through it Stim's results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pauliprop.circuits import gates as G
from stabilizer import Circuit
from stabilizer.circuits.program import gate_action, lowered
from stabilizer.tableau import kernels as K
from stabilizer.tableau import tableau as T
from stabilizer.tableau.simulator import TableauSimulator

stim = pytest.importorskip("stim")

# the compiled kernels where they run, else the interpreter: both are checked against the pure rules
KERNEL = "pallas" if jax.default_backend() == "gpu" else "interpret"
WIDE = 500  # tableaux of several words per row
STIM_GATES = sorted({g.stim_names[0] for g in G.GATES.values() if g.stim_names})


def _random_words(rng, shape):
    return jnp.asarray(rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32))


def test_block_and_padding_rules():
    for words in range(1, 700):
        padded = K.padded_words(words)
        assert padded >= words and K.block_words(padded) is not None
        assert padded < 2 * words or padded <= K.MAX_BLOCK_WORDS
    assert K.block_words(24) is None and K.block_words(130) is None and K.block_words(4) == 4
    with pytest.raises(ValueError, match="kernel must be"):
        K.kernel_mode("cuda", 4)
    with pytest.raises(ValueError, match="cannot be blocked"):
        K.prepend_rows(jnp.zeros((4, 24), jnp.uint32), jnp.zeros((4, 24), jnp.uint32), jnp.zeros((1, 2), jnp.int32),
                       jnp.zeros((1, 2), jnp.int32), interpret=True)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2]), st.sampled_from([1, 4, 256]))
def test_prepend_rows_equals_the_pure_rule(seed, arity, words):
    """Random rows, random product codes (any subset of the slot's rows), some slots inactive, rows
    of one to several blocks: the kernel's rows and phases equal the pure-JAX rule's."""
    rng = np.random.default_rng(seed)
    g, k = 2 * arity, 5
    num_rows = 4 * k * arity
    xs, zs = _random_words(rng, (num_rows, words)), _random_words(rng, (num_rows, words))
    rows = rng.permutation(num_rows)[: k * g].reshape(k, g).astype(np.int32)
    rows[rng.random(k) < 0.3] = -1
    codes = jnp.asarray(rng.integers(0, 2**g, size=(k, g)).astype(np.int32))
    want = T._products_jax(xs, zs, jnp.asarray(rows), codes)
    got = K.prepend_rows(jnp.array(xs), jnp.array(zs), jnp.asarray(rows), codes, interpret=KERNEL == "interpret")
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("words,live", [(4, 3), (4, 1), (256, 200), (256, 128), (256, 129)])
def test_prepend_rows_past_the_live_words_reads_and_writes_nothing(words, live):
    """Rows with no bits from word `live` on (the qubits past the state's), the kernel told so: the same
    rows and phases as the pure rule, and the words past `live` of every row, the slots' included, keep
    whatever they held (here garbage, so a read or a write there shows)."""
    rng = np.random.default_rng(words + live)
    g, k = 4, 5
    num_rows = 4 * k * 2
    xs, zs = _random_words(rng, (num_rows, words)), _random_words(rng, (num_rows, words))
    rows = rng.permutation(num_rows)[: k * g].reshape(k, g).astype(np.int32)
    rows[1] = -1
    codes = jnp.asarray(rng.integers(0, 2**g, size=(k, g)).astype(np.int32))
    live_part = lambda a: a.at[:, live:].set(0)
    want = T._products_jax(live_part(xs), live_part(zs), jnp.asarray(rows), codes)
    got = K.prepend_rows(jnp.array(xs), jnp.array(zs), jnp.asarray(rows), codes, live_words=live,
                         interpret=KERNEL == "interpret")
    for a, b, before in zip(want, got, (xs, zs)):
        np.testing.assert_array_equal(np.asarray(a)[:, :live], np.asarray(b)[:, :live])
        np.testing.assert_array_equal(np.asarray(before)[:, live:], np.asarray(b)[:, live:])
    np.testing.assert_array_equal(np.asarray(want[2]), np.asarray(got[2]))


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 4, 256]))
def test_collapse_rows_equals_the_pure_rule(seed, words):
    """The measurement's fan-out on random rows (several word blocks carry the prefix parity):
    kernel and pure rule give the same x words, sign flips and z parities."""
    rng = np.random.default_rng(seed)
    r = 2 * K.ROW_BLOCK
    xs, zs, kmask = _random_words(rng, (r, words)), _random_words(rng, (r, words)), _random_words(rng, (words,))
    xp, zp = (jnp.asarray(rng.integers(0, 2, r).astype(np.uint32)) for _ in range(2))
    want = T._fan_out_jax(xs, zs, kmask, xp, zp)
    got = K.collapse_rows(jnp.array(xs), zs, kmask, xp, zp, interpret=KERNEL == "interpret")
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_random_measurements_through_the_kernel_equal_stims():
    """Measurements forced to Stim's random outcomes, on a random state wider than one word block:
    the kernel's collapses give Stim's record and inverse tableau."""
    rng = np.random.default_rng(8)
    n = 200
    prefix = "\n".join(f"{name} " + " ".join(map(str, rng.choice(n, gate_action(name)[2], replace=False)))
                       for name in rng.choice(STIM_GATES, 400))
    ref = stim.TableauSimulator()
    ref.set_num_qubits(WIDE)
    ref.do(stim.Circuit(prefix))
    sim = TableauSimulator(num_qubits=WIDE)
    sim.do(Circuit(prefix))
    for q in rng.choice(n, 12, replace=False):
        want = ref.measure(int(q))
        sim._tableau, got, _ = T.measure_z(sim._tableau, jnp.int32(q), jnp.bool_(want), kernel=KERNEL)
        assert bool(got) == want
    assert sim.current_inverse_tableau() == ref.current_inverse_tableau()


def test_every_gate_through_the_kernel_equals_stims_tableau():
    """Each Stim gate prepended by the kernel, in a window with padding slots, on qubits
    across word boundaries of a random state, gives Stim's inverse tableau."""
    rng = np.random.default_rng(5)
    n = 70
    prefix = "\n".join(f"{name} " + " ".join(map(str, rng.choice(n, gate_action(name)[2], replace=False)))
                       for name in rng.choice(STIM_GATES, 60))
    for name in STIM_GATES:
        image, sign, arity = gate_action(name)
        qubits = np.array([[31, 32], [63, 64], [0, 69], [0, 0]])[:, :arity]  # the last slot is padding
        if arity == 1:
            qubits = np.array([[31], [32], [69], [31]])
        sim = TableauSimulator(num_qubits=WIDE)
        sim.do(Circuit(prefix))
        sim._tableau = T.prepend(sim._tableau, jnp.asarray(qubits, jnp.int32), jnp.asarray(np.tile(image, (4, 1))),
                                 jnp.asarray(np.tile(sign, (4, 1))), jnp.array([True, True, True, False]),
                                 arity=arity, kernel=KERNEL)
        ref = stim.TableauSimulator()
        ref.set_num_qubits(WIDE)
        ref.do(stim.Circuit(prefix + f"\n{name} " + " ".join(map(str, qubits[:3].ravel()))))
        assert sim.current_inverse_tableau() == ref.current_inverse_tableau(), name


def _random_program_text(n: int, rng, depth: int) -> str:
    lines = []
    for _ in range(depth):
        perm = rng.permutation(n)
        lines.append("CX " + " ".join(map(str, perm)))
        lines.append(f"{rng.choice(['H', 'S', 'SQRT_X', 'C_XYZ'])} " + " ".join(map(str, perm[: n // 3])))
        lines.append(f"{rng.choice(['ISWAP', 'CZ', 'SWAP', 'XCY'])} " + " ".join(map(str, perm[n // 3: n // 3 + 4])))
        lines.append("M " + " ".join(map(str, perm[:3])))
        lines.append("R " + str(perm[5]))
    return "\n".join(lines)


def test_tableau_program_with_the_kernel_equals_the_pure_program():
    """Also with the gates told the qubits past n + 1 (n and the spare) are untouched: the kernel then skips
    the words past them (2 of 16 here)."""
    rng = np.random.default_rng(11)
    n = 40
    prog = lowered(Circuit(_random_program_text(n, rng, 12)))
    guesses = jnp.asarray(rng.random(prog.num_measurements) < 0.5)
    runs = [T.run_program(prog.structure(), prog.tables(), T.identity(WIDE), guesses, jax.random.key(0),
                          noisy=False, kernel=kernel, live_qubits=live)
            for kernel, live in (("jax", None), (KERNEL, None), (KERNEL, n + 1))]
    (t1, r1), *others = runs
    for t2, r2 in others:
        np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))
        for a, b in zip(t1, t2):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- many measurements in blocks: the plan and apply kernels -------------------------------------------

def _measured_rows(n: int, seed: int):
    """A random state on n qubits (a quarter left determined) and a block of MEASURE_BLOCK measured
    rows T(Z_q) in random order, some slots inactive, random outcomes to take."""
    from .test_measure_many import _state_text, _tableau

    rng = np.random.default_rng(seed)
    t = _tableau(_state_text(n, rng, 3, deterministic=n // 4), n)
    b = T.MEASURE_BLOCK
    rows = t.capacity + jnp.asarray(rng.permutation(max(n, b))[:b] % n)
    active, guesses = jnp.asarray(rng.random(b) < 0.85), jnp.asarray(rng.random(b) < 0.5)
    return t, T.Tableau(t.xs[rows], t.zs[rows], t.signs[rows]), active, guesses


@pytest.mark.parametrize("n,seed", [(33, 1), (130, 2), (300, 3)])
def test_plan_and_apply_kernels_equal_the_pure_rules(n, seed):
    """A block's plan (pivots, fan-out masks, H or H_YZ, fixes, outcomes) and its replay on every row
    of the tableau, by the kernels, equal the pure rules bit for bit (use_yz only where the collapse
    is random: elsewhere neither rule uses it). Rows of one word block and of several; a recurring
    row makes a pivot column recur."""
    t, rows, active, guesses = _measured_rows(n, seed)
    want = T._plan_block(rows, active, guesses, "jax")
    got = T._plan_block(rows, active, guesses, KERNEL)
    random = np.asarray(want.random)
    assert random.any()
    for name, a, b in zip(want._fields, want, got):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_array_equal(a[random] if name == "use_yz" else a, b[random] if name == "use_yz" else b)
    copy = lambda t: jax.tree_util.tree_map(jnp.copy, t)
    for a, b in zip(T._apply_block(copy(t), want, "jax"), T._apply_block(copy(t), want, KERNEL)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("n,seed", [(40, 6), (300, 7)])
def test_apply_launch_that_plans_the_next_block_equals_apply_then_plan(n, seed):
    """The measure loop's two launches: replay_inputs copies out the next block's measured rows (block 1
    of the slots, read before the apply), and apply_rows with that lookahead gives the tableau of the
    plain apply and the next block's plan as plan_rows makes it from that block's rows after the apply
    (rows some of which the apply changes, some slots inactive), its choices read from its own slots and
    its outcomes written to its slots of the record, nowhere else."""
    t, rows, active, guesses = _measured_rows(n, seed)
    plan = T._plan_block(rows, active, guesses, KERNEL)
    rng = np.random.default_rng(seed + 100)
    b = T.MEASURE_BLOCK
    qubits = jnp.asarray(rng.permutation(n)[:b] % n, dtype=jnp.int32)
    f_active, f_guesses = jnp.asarray(rng.random(b) < 0.85), jnp.asarray(rng.random(b) < 0.5)
    copy = lambda t: jax.tree_util.tree_map(jnp.copy, t)
    skip = jnp.zeros(t.xs.shape[0] // K.APPLY_ROWS, jnp.int32)
    applied = T._apply_block(copy(t), plan, KERNEL, skip)
    want = T._plan_block(T.Tableau(*(a[t.capacity + qubits] for a in applied)), f_active, f_guesses, KERNEL)
    # block 1 of three; the other blocks' slots hold other qubits and the opposite choices
    slots = lambda v, other: jnp.concatenate([other[:b], v, other[:3]]).astype(jnp.int32)
    choices = lambda v: slots(v.astype(jnp.int32), 1 - v.astype(jnp.int32))
    *planned, window = T._plan_for_kernel(plan)
    interpret = KERNEL == "interpret"
    t0, block = copy(t), jnp.array([1], jnp.int32)
    signs = t0.signs.astype(jnp.int32)
    *inputs, nx, nz, nsigns = K.replay_inputs(*planned, following=(t0.xs, t0.zs, signs, slots(qubits, qubits[::-1]), block),
                                              interpret=interpret)
    for a, got in zip(t, (nx, nz, nsigns == 1)):
        np.testing.assert_array_equal(np.asarray(a[t.capacity + qubits]), np.asarray(got))
    for a, got in zip(K.replay_inputs(*planned, interpret=interpret), inputs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(got))
    xs, zs, signs, record, got_plan = K.apply_rows(
        t0.xs, t0.zs, signs, *inputs, skip, window,
        lookahead=(nx, nz, nsigns, choices(f_active), choices(f_guesses), block, jnp.full(2 * b + 3, 7, jnp.int32),
                   jnp.full(skip.shape, 1 << 30, jnp.int32)),
        interpret=interpret)
    got_plan = T._plan_from_kernel(*got_plan)
    for a, b_ in zip(applied, (xs, zs, signs == 1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b_))
    for name, a, b_ in zip(want._fields, want, got_plan):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b_), err_msg=name)
    record = np.asarray(record)
    np.testing.assert_array_equal(record[b:2 * b], np.asarray(want.outcome).astype(np.int32))
    assert (record[:b] == 7).all() and (record[2 * b:] == 7).all()


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 8]), st.sampled_from([4, 40, 256]))
def test_plan_kernel_equals_the_pure_rule_on_any_rows(seed, words, span):
    """Any rows, not only a state's: x bits in the first `span` columns (few columns make pivots recur
    and rows run out of x: deterministic outcomes), inactive slots, rows of one to several words
    (three: padded for the program). The kernel's pivots, fan-out masks, flags and outcomes equal the
    pure rule's (use_yz only where the collapse is random)."""
    rng = np.random.default_rng(seed)
    b = T.MEASURE_BLOCK
    bits = np.zeros((b, 32 * words), np.uint8)
    span = min(span, 32 * words)
    bits[:, :span] = rng.random((b, span)) < rng.uniform(0.05, 0.6)
    bits[rng.random(b) < 0.1] = 0  # rows with no x: determined from the start
    pack = lambda a: jnp.asarray(np.packbits(a, axis=1, bitorder="little").view(np.uint32))
    xs, zs = pack(bits), pack(rng.random((b, 32 * words)) < 0.5)
    rows = T.Tableau(xs, zs, jnp.asarray(rng.random(b) < 0.5))
    active, guesses = jnp.asarray(rng.random(b) < 0.85), jnp.asarray(rng.random(b) < 0.5)
    want = T._plan_block(rows, active, guesses, "jax")
    got = T._plan_block(rows, active, guesses, KERNEL)
    random = np.asarray(want.random)
    for name, a, b_ in zip(want._fields, want, got):
        a, b_ = np.asarray(a), np.asarray(b_)
        np.testing.assert_array_equal(a[random] if name == "use_yz" else a, b_[random] if name == "use_yz" else b_,
                                      err_msg=name)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 4, 256]), st.sampled_from([1, 8, 1000]))
def test_replay_inputs_kernel_equals_the_pure_rule(seed, words, columns):
    """Any plan (pivots in the first `columns` columns, so few columns make them recur; some collapses
    not random; fan-out masks anywhere; rows of one to several of the kernel's word blocks): the
    kernel's steps, pivot bits of the fan-outs, fan-outs off the pivots, tables and pivot mask equal
    tableau._replay's."""
    rng = np.random.default_rng(seed)
    b = T.MEASURE_BLOCK
    random = rng.random(b) < 0.8
    pivot = np.where(random, rng.integers(0, min(columns, 32 * words), b), 0).astype(np.int32)
    kmask = np.where(random[:, None], rng.integers(0, 2**32, (b, words), dtype=np.uint64), 0).astype(np.uint32)
    bits = lambda: jnp.asarray(rng.random(b) < 0.5)
    plan = T._Plan(jnp.asarray(pivot), jnp.asarray(kmask), bits(), bits(), jnp.asarray(random), bits())
    r = T._replay(plan, words)
    flags = plan.random.astype(jnp.int32) | (plan.use_yz.astype(jnp.int32) << 1) | (plan.fix.astype(jnp.int32) << 2)
    steps = jnp.stack([r.word, r.shift.astype(jnp.int32), r.first.astype(jnp.int32), r.slot.astype(jnp.int32), flags])
    want = steps, r.kp, r.kext, jnp.concatenate(r.tables), r.pmask
    got = K.replay_inputs(*T._plan_for_kernel(plan)[:3], interpret=KERNEL == "interpret")
    for name, a, b_ in zip(("steps", "kp", "kext", "tables", "pmask"), want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b_), err_msg=name)


def test_plan_kernel_counts_apart_for_wide_rows(monkeypatch):
    """Rows too wide to pack two bit counts in one int32 take two sums: forced here on narrow rows (the
    kernel traced afresh, outside jit), the plan still equals the pure rule."""
    t, rows, active, guesses = _measured_rows(130, 5)
    monkeypatch.setattr(K, "PACKED_COUNTS_BITS", 0)
    as_int = lambda v: v.astype(jnp.int32)
    pivot, kmask, flags, _ = K.plan_rows.__wrapped__(rows.xs, rows.zs, as_int(rows.signs), as_int(active),
                                                  as_int(guesses), interpret=KERNEL == "interpret")
    want = T._plan_block(rows, active, guesses, "jax")
    np.testing.assert_array_equal(np.asarray(pivot), np.asarray(want.pivot))
    np.testing.assert_array_equal(np.asarray(kmask), np.asarray(want.kmask))
    got = np.asarray(flags)
    for bit, name in ((0, "random"), (2, "fix"), (3, "outcome")):
        np.testing.assert_array_equal((got >> bit) & 1 == 1, np.asarray(getattr(want, name)))


def _narrow_kernels(monkeypatch):
    """The kernels traced afresh with blocks of two words (rows of 6 words: the plan holds them in
    pieces of 4 and 2) and one-word parity and rewrite tiles, so narrow tableaux skip tiles at both
    ends of a block's window."""
    monkeypatch.setattr(K, "MAX_BLOCK_WORDS", 2)
    monkeypatch.setattr(K, "APPLY_WORDS", 1)
    monkeypatch.setattr(K, "REWRITE_WORDS", 1)
    monkeypatch.setattr(K, "apply_rows", jax.jit(K.apply_rows.__wrapped__, static_argnames=("interpret",),
                                                 donate_argnums=(0, 1, 2)))


@pytest.mark.parametrize("lo,span", [(0, 1), (7, 1), (3, 2), (2, 5), (0, 8)])
def test_plan_window_holds_every_collapse_of_the_block(lo, span):
    """Rows with x bits only in words [lo, lo + span) of 8 (z bits everywhere): the plan's window is
    exactly those words, every pivot and fan-out lies inside it, and the plan equals the pure rule."""
    rng = np.random.default_rng(100 * lo + span)
    b, words = T.MEASURE_BLOCK, 8
    bits = np.zeros((b, 32 * words), np.uint8)
    bits[:, 32 * lo: 32 * (lo + span)] = rng.random((b, 32 * span)) < 0.3
    bits[:, 32 * lo] = 1  # the window's first and last words are not empty
    bits[:, 32 * (lo + span) - 1] |= rng.random(b) < 0.5
    pack = lambda a: jnp.asarray(np.packbits(a, axis=1, bitorder="little").view(np.uint32))
    rows = T.Tableau(pack(bits), pack(rng.random((b, 32 * words)) < 0.5), jnp.asarray(rng.random(b) < 0.5))
    active, guesses = jnp.asarray(rng.random(b) < 0.85), jnp.asarray(rng.random(b) < 0.5)
    pivot, kmask, flags, window = K.plan_rows(*T._plan_args(rows, active, guesses), interpret=KERNEL == "interpret")
    assert np.asarray(window).tolist() == [lo, lo + span]
    random = (np.asarray(flags) & 1) == 1
    assert random.sum() > 8
    used = np.flatnonzero(np.asarray(kmask).any(axis=0))
    assert used.min() >= lo and used.max() < lo + span
    assert np.all((np.asarray(pivot)[random] // 32 >= lo) & (np.asarray(pivot)[random] // 32 < lo + span))
    want = T._plan_block(rows, active, guesses, "jax")
    got = T._plan_from_kernel(pivot, kmask, flags)
    for name, a, b_ in zip(want._fields, want, got):
        a, b_ = np.asarray(a), np.asarray(b_)
        np.testing.assert_array_equal(a[random] if name == "use_yz" else a, b_[random] if name == "use_yz" else b_,
                                      err_msg=name)


def test_measure_all_in_windows_of_words_equals_one_collapse_at_a_time(monkeypatch):
    """Measure-all in order, the first 32 qubits in |+> (their rows' window is word 0) and the rest
    entangled (words 1-4), in a tableau of 6 words a row (word 5 unused) held by the plan in two pieces,
    the apply's tiles one word wide so that it skips words at both ends of each window: the outcomes
    and tableau equal `measure_z` one qubit at a time."""
    from .test_measure_many import _state_text, _tableau

    _narrow_kernels(monkeypatch)
    rng = np.random.default_rng(31)
    n = 160
    text = "H " + " ".join(map(str, range(32))) + "\n" + _state_text(n, rng, 6, deterministic=32)
    t = _tableau(text, n)
    assert t.xs.shape[1] == 6 and K.plan_chunks(6) == [(0, 4), (4, 2)]
    first = K.plan_rows(*T._plan_args(T.Tableau(*(a[t.capacity + np.arange(32)] for a in t)), jnp.ones(32, bool),
                                      jnp.zeros(32, bool)), interpret=KERNEL == "interpret")[3]
    second = K.plan_rows(*T._plan_args(T.Tableau(*(a[t.capacity + 32 + np.arange(32)] for a in t)), jnp.ones(32, bool),
                                       jnp.zeros(32, bool)), interpret=KERNEL == "interpret")[3]
    assert np.asarray(first).tolist() == [0, 1] and np.asarray(second).tolist() == [1, 5]
    _assert_blocks_equal_one_collapse_at_a_time(t, np.arange(n), rng.random(n) < 0.5,
                                                measure=T.measure_many_z.__wrapped__)


def _assert_blocks_equal_one_collapse_at_a_time(t, order, guesses, measure=T.measure_many_z) -> list[bool]:
    """measure_many_z by the kernels on the qubits `order` equals measure_z one qubit at a time with the
    same random choices: outcomes and tableau. Returns the outcomes."""
    seq, outs = jax.tree_util.tree_map(jnp.copy, t), []
    for q, g in zip(order, guesses):
        seq, r, _ = T.measure_z(seq, jnp.int32(q), jnp.bool_(g), kernel="jax")
        outs.append(bool(r))
    got, outcomes = measure(jax.tree_util.tree_map(jnp.copy, t), jnp.asarray(order, jnp.int32),
                            jnp.ones(len(order), bool), jnp.asarray(guesses), kernel=KERNEL)
    assert [bool(o) for o in np.asarray(outcomes)] == outs
    for a, b in zip(got, seq):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return outs


def test_measure_all_through_the_kernels_equals_one_collapse_at_a_time():
    """All qubits of a random 70-qubit state measured in blocks by the kernels: the outcomes and the
    tableau of `measure_z` one qubit at a time with the same random choices."""
    rng = np.random.default_rng(4)
    t, _, _, _ = _measured_rows(70, 4)
    order = rng.permutation(70).astype(np.int32)
    guesses = rng.random(70) < 0.5
    _assert_blocks_equal_one_collapse_at_a_time(t, order, guesses)


def test_measure_all_in_order_of_a_partly_product_state_equals_one_collapse_at_a_time():
    """Every qubit measured in order, the first 32 in |+> (all random, each row ends as +-Z at its
    pivot), the rest entangled, in a tableau with room for twice the qubits (the apply kernel skips the
    rows of the unused ones): the outcomes and tableau of `measure_z` one qubit at a time."""
    from .test_measure_many import _state_text, _tableau

    rng = np.random.default_rng(12)
    n = 128
    t = _tableau("H " + " ".join(map(str, range(32))) + "\n" + _state_text(n, rng, 4, deterministic=32), n)
    guesses = rng.random(n) < 0.5
    outs = _assert_blocks_equal_one_collapse_at_a_time(t, np.arange(n), guesses)
    assert outs[:32] == guesses[:32].tolist()


def test_measure_all_of_an_entangled_state_keeps_every_measured_row_up_to_date():
    """Every qubit of a random entangled state measured in order (all random): a row that a collapse
    made Z at its pivot still carries Zs elsewhere, and later fan-outs change its z bits at their
    pivots. The tableau equals that of `measure_z` one qubit at a time (an earlier rule skipped such
    rows as settled and left 22 of them stale here)."""
    from .test_measure_many import _state_text, _tableau

    rng = np.random.default_rng(21)
    n = 64
    t = _tableau(_state_text(n, rng, 20), n)
    _assert_blocks_equal_one_collapse_at_a_time(t, np.arange(n), rng.random(n) < 0.5)


def test_measure_blocks_of_padding_slots_change_nothing():
    """Slots 32-63 and 80-95 inactive (a whole block of padding, and a block's tail): the kernels
    run every block, and the empty one leaves the tableau and its outcomes as the pure rule does."""
    rng = np.random.default_rng(13)
    t, _, _, _ = _measured_rows(120, 13)
    qubits = jnp.asarray(rng.permutation(120)[:96].astype(np.int32))
    active = jnp.asarray((np.arange(96) < 32) | ((np.arange(96) >= 64) & (np.arange(96) < 80)))
    guesses = jnp.asarray(rng.random(96) < 0.5)
    runs = [T.measure_many_z(jax.tree_util.tree_map(jnp.copy, t), qubits, active, guesses, kernel=kernel)
            for kernel in ("jax", KERNEL)]
    (t1, o1), (t2, o2) = runs
    np.testing.assert_array_equal(np.asarray(o1)[np.asarray(active)], np.asarray(o2)[np.asarray(active)])
    for a, b in zip(t1, t2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_measure_kernels_lower_to_triton_on_any_machine():
    """Lowering for CUDA runs Pallas's Triton lowering on any machine: the plan and apply kernels use
    only primitives it can lower."""
    t = T.identity(300)
    k = 2 * T.MEASURE_BLOCK
    lowered = T.measure_many_z.trace(t, jnp.arange(k, dtype=jnp.int32), jnp.ones(k, bool), jnp.zeros(k, bool),
                                     kernel="pallas").lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("triton") >= 2
