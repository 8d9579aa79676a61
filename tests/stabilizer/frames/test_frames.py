"""Pauli frames (stabilizer/frames/frames.py): the bit-sliced op rules equal the per-shot Pauli
algebra, and the noise draws (sparse and dense) hit every bit position with the channel's
probabilities."""

from __future__ import annotations

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from stabilizer.circuits import program as P
from stabilizer.circuits.circuit import Circuit
from stabilizer.frames import frames as F

from ..tableau.test_tableau import STIM_GATES, gate_action

stim = pytest.importorskip("stim")
_LETTER = {(0, 0): "_", (1, 0): "X", (1, 1): "Y", (0, 1): "Z"}


def _bits(words) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(np.asarray(words)).view(np.uint8), axis=-1, bitorder="little")


def _carry(rng, qubits: int, words: int = 2, measurements: int = 4) -> F._Carry:
    rand = lambda: jnp.asarray(rng.integers(0, 2**32, (qubits, words), dtype=np.uint32))
    return F._Carry(F.Frames(rand(), rand()), jnp.zeros((measurements + 1, words), jnp.uint32),
                    jnp.zeros((), jnp.int32), jnp.zeros((), jnp.uint32), jnp.zeros(words, jnp.uint32))


def _apply(op, c: F._Carry, row, key, **options) -> F._Carry:
    """One op on a carry, as the program's scan step runs it: read its rows, op, write them back."""
    return F._write(c, row, op(F._read(c, row), row, key, **options))


def _row(op_kind, qubits, spare, width=None, **fields):
    """One op-table row: qubits a list of (q0, q1) slots, padded to `width` slots as the lowering pads
    them; fields as in stabilizer.circuits.program._Op."""
    fields = {k: np.asarray(v) if isinstance(v, list) else v for k, v in fields.items()}
    op = P._Op(op_kind, np.asarray(qubits), **fields)
    return {k: jnp.asarray(v[0]) for k, v in P._table([op], width or len(qubits), spare).items()}


@pytest.mark.parametrize("name", STIM_GATES)
def test_gate_conjugates_every_shot_as_stim(name):
    """Shot by shot, the new frame is G P G^dagger up to sign (stim.Tableau applied to the frame)."""
    arity = gate_action(name)[2]
    rng = np.random.default_rng(0)
    c = _carry(rng, 4)  # qubits 0..2 and the spare 3
    qubits = [2, 0][:arity]
    row = _row(P.GATE, [(qubits[0], qubits[1] if arity == 2 else 3)], 3, gate=name)
    out = _apply(F._op_gate, c, row, jax.random.key(0))
    before = [_bits(a) for a in c.f]
    after = [_bits(a) for a in out.f]
    tab = stim.Tableau.from_named_gate(name)
    for shot in range(0, 64, 5):
        p = stim.PauliString("".join(_LETTER[(before[0][q, shot], before[1][q, shot])] for q in range(3)))
        got = "".join(_LETTER[(after[0][q, shot], after[1][q, shot])] for q in range(3))
        assert str(p.after(tab, targets=qubits))[1:] == got, (name, shot)


@pytest.mark.parametrize("reset", [False, True])
def test_measurement_records_the_x_part_and_leaves_a_z_stabilizer(reset):
    rng = np.random.default_rng(1)
    c = _carry(rng, 3)
    row = _row(P.MEASURE, [(1, 2)], 2, rec=[0], reset=[reset], advance=1)
    out = _apply(F._op_measure, c, row, jax.random.key(5), draw=None)
    np.testing.assert_array_equal(np.asarray(out.record[0]), np.asarray(c.f.x[1]))
    assert int(out.base) == 1
    x_after = np.asarray(out.f.x[1])
    np.testing.assert_array_equal(x_after, 0 if reset else np.asarray(c.f.x[1]))  # Z frames are harmless
    np.testing.assert_array_equal(np.asarray(out.f.x[0]), np.asarray(c.f.x[0]))  # other qubits untouched


def test_feedback_xors_the_recorded_flip():
    rng = np.random.default_rng(2)
    c = _carry(rng, 3)
    c = c._replace(record=c.record.at[0].set(jnp.asarray([0xF0F0F0F0, 0x1], jnp.uint32)), base=jnp.int32(1))
    row = _row(P.FEEDBACK, [(0, 2)], 2, rec=[1], px=[True], pz=[True])
    out = _apply(F._op_feedback, c, row, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.f.x[0]) ^ np.asarray(c.f.x[0]), [0xF0F0F0F0, 0x1])
    np.testing.assert_array_equal(np.asarray(out.f.z[0]) ^ np.asarray(c.f.z[0]), [0xF0F0F0F0, 0x1])


_PADDED_OPS = {  # (kind, slots, fields) of one window on qubits 0..2 (3 is the spare), base 1
    "gate": (P.GATE, [(2, 1)], dict(gate="CX")),
    "measure": (P.MEASURE, [(1, 3)], dict(rec=[0], reset=[True], advance=1, probs=(0.5,))),
    "noise": (P.NOISE, [(1, 2)], dict(probs=tuple(np.full(15, 1 / 15)))),
    "correlated": (P.CORRELATED, [(0, 3)], dict(probs=(1.0,), px=[True], pz=[True])),
    "feedback": (P.FEEDBACK, [(0, 3)], dict(rec=[1], px=[True], pz=[True])),
    "mpad": (P.MPAD, [(3, 3)], dict(rec=[0], advance=1, probs=(0.5,))),
}


@pytest.mark.parametrize("name", list(_PADDED_OPS))
def test_padding_slots_change_no_qubit_and_no_record_row(name):
    """A window padded with 3 slots (on the spare, recording nothing) changes only its own qubits and
    record rows (base + 0 where it records); the record's last row stays the zero row."""
    kind, slots, fields = _PADDED_OPS[name]
    rng = np.random.default_rng(4)
    c = _carry(rng, 4)
    c = c._replace(record=jnp.asarray(rng.integers(0, 2**32, (5, 2), dtype=np.uint32)).at[4].set(0), base=jnp.int32(1))
    options = {"draw": F.Draw(F.SPARSE_MAX, dense=True)} if kind in F.NOISY_KINDS else {}
    out = _apply(F._OPS[kind], c, _row(kind, slots, 3, width=4, **fields), jax.random.key(9), **options)
    for q in set(range(3)) - set(slots[0]):
        np.testing.assert_array_equal(np.asarray(out.f.x[q]), np.asarray(c.f.x[q]), err_msg=f"x of qubit {q}")
        np.testing.assert_array_equal(np.asarray(out.f.z[q]), np.asarray(c.f.z[q]), err_msg=f"z of qubit {q}")
    written = {1} if kind in (P.MEASURE, P.MPAD) else set()
    for m in set(range(5)) - written:
        np.testing.assert_array_equal(np.asarray(out.record[m]), np.asarray(c.record[m]), err_msg=f"record row {m}")


_PAULI_CHANNEL_2 = np.linspace(0.01, 0.05, 15) * 0.6 / np.linspace(0.01, 0.05, 15).sum()


@pytest.mark.parametrize("probs", [_PAULI_CHANNEL_2, np.full(15, 0.3 / 15)], ids=["PAULI_CHANNEL_2", "DEPOLARIZE2"])
@pytest.mark.parametrize("limit", [1.0, 0.0], ids=["sparse", "dense"])
def test_pair_noise_events_have_their_probabilities(probs, limit):
    """Each of the 15 two-qubit Paulis lands on a shot with its own probability (over 2**14 shots),
    whether the draw is sparse (hits, then each hit's event) or dense."""
    c = _carry(np.random.default_rng(3), 3, words=512)
    c = c._replace(f=F.zeros(3, 512))
    op = jax.jit(lambda c, row, key: _apply(F._op_noise, c, row, key, draw=F.Draw(limit, dense=True)))
    out = op(c, _row(P.NOISE, [(0, 1)], 2, probs=tuple(probs)), jax.random.key(7))
    xa, za, xb, zb = (_bits(a) for a in (out.f.x[0], out.f.z[0], out.f.x[1], out.f.z[1]))
    codes = xa | za << 1 | xb << 2 | zb << 3
    for k, (a, b) in enumerate(P.PAIRS):
        code = P._XBIT[a] | P._ZBIT[a] << 1 | P._XBIT[b] << 2 | P._ZBIT[b] << 3
        rate = np.mean(codes == code)
        assert abs(rate - probs[k]) < 5 * np.sqrt(probs[k] / codes.size), (a + b, rate, probs[k])
    assert abs(np.mean(codes == 0) - (1 - probs.sum())) < 5 * np.sqrt(probs.sum() / codes.size)


@pytest.mark.parametrize("limit", [F.SPARSE_MAX, 0.0], ids=["sparse", "dense"])
def test_flips_hit_every_bit_position_with_probability_p(limit):
    """Over 2**20 positions the rate is p (exactly, at 0 and 1), in every bit of the word and every row:
    a gap or word-boundary error in the skipping would show as a biased bit or row."""
    draw = jax.jit(lambda key, probs: F.noise_masks(key, probs, F.FLIP, (64, 512), F.Draw(limit, dense=True))[0])
    for p in (0.0, 1e-3, 0.4, 1.0):
        bits = _bits(draw(jax.random.key(11), jnp.array([p])))  # (64 rows, 512 * 32 positions)
        if p in (0.0, 1.0):
            assert np.all(bits == p), p
            continue
        sigma = lambda n, p=p: np.sqrt(p * (1 - p) / n)
        assert abs(bits.mean() - p) < 5 * sigma(bits.size), p
        by_bit = bits.reshape(64, 512, 32).mean(axis=(0, 1))
        assert np.all(np.abs(by_bit - p) < 5 * sigma(bits.size / 32)), (p, by_bit)
        assert np.all(np.abs(bits.mean(axis=1) - p) < 5 * sigma(bits.shape[1])), (p, bits.mean(axis=1))


@pytest.mark.parametrize("shape", [(4,), (2, 2)], ids=["one row", "two rows"])
def test_a_sparse_draw_that_runs_out_of_budget_stays_exact(monkeypatch, shape):
    """With room for only 4 hits a round at p = 0.3, the draw goes on in more rounds from where the last
    one ended: every one of the 128 positions still flips with probability 0.3 (over 4096 draws), none
    twice as often. No dense code is needed for that."""
    monkeypatch.setattr(F, "flip_budget", lambda bits, limit: 4)
    draw = jax.jit(jax.vmap(lambda key: F.noise_masks(key, jnp.array([0.3]), F.FLIP, shape, F.Draw(1.0, False))[0]))
    bits = _bits(draw(jax.random.split(jax.random.key(5), 4096)).reshape(4096, 4))  # (4096 draws, 128 positions)
    rates = bits.mean(axis=0)
    assert np.all(np.abs(rates - 0.3) < 5 * np.sqrt(0.21 / 4096)), rates


def test_noise_limits_do_not_depend_on_the_probabilities():
    """Circuits that differ only in their noise strengths (below SPARSE_MAX) get equal limits, so one
    compiled program; only kinds with a probability above SPARSE_MAX hold dense code, and kinds without
    noise draw nothing."""
    text = "X_ERROR({p}) 0 1\nREPEAT 50 {{\n  DEPOLARIZE1({p}) 0\n  M({q}) 0\n}}\nX_ERROR({big}) 1\nM 1\nMPAD 0"

    def limits(**ps):
        prog = P.lower(Circuit(text.format(**ps)))
        return F.noise_limits(P.flatten(prog.structure(), prog.tables(), prog.num_qubits, prog.num_measurements)[0].table)

    base = limits(p=0.001, q=0.01, big=0.3)
    assert base == limits(p=0.004, q=0.2, big=0.1) == limits(p=1e-5, q=0.5, big=0.5)
    assert base[P.NOISE].sparse >= F.SPARSE_MAX and not base[P.NOISE].dense
    assert limits(p=0.001, q=0.01, big=0.75)[P.NOISE].dense and not limits(p=0.001, q=0.01, big=0.75)[P.MEASURE].dense
    assert base[P.GATE] is base[P.CORRELATED] is base[P.MPAD] is None


def test_run_program_flips_only_where_noise_is():
    prog = P.lower(Circuit("H 0\nCX 0 1\nX_ERROR(1) 1\nM 0 1\nREPEAT 3 {\n  MR 1\n}"))
    flips = F.run_program(prog.structure(), prog.tables(), jax.random.key(0), prog.num_qubits,
                          prog.num_measurements, 4)
    bits = _bits(flips)
    assert bits.shape == (6, 128) and not bits[5].any()  # the last row is the zero row
    assert np.all(bits[0] ^ bits[1])  # the X error flips qubit 1 relative to qubit 0 in every shot
    assert 0.3 < bits[0].mean() < 0.7  # the Bell pair's outcome is random per shot
    assert np.all(bits[2] == ~bits[0] & 1) and not bits[3:].any()  # MR resets: later MRs are noiseless


def _subjaxprs(jaxpr):
    """The jaxprs an equation of `jaxpr` holds (loop bodies, branches, calls)."""
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(v, jax.extend.core.ClosedJaxpr):
                    yield v.jaxpr
                elif isinstance(v, jax.extend.core.Jaxpr):
                    yield v


def test_the_op_switch_returns_only_an_ops_rows():
    """No branch of the loop step's op-kind switch returns the whole frames or record: XLA copies
    whatever a branch returns, every op (13 of the 35 kernels an op took on an H100 when it did). The
    program has one switch, whatever its repeats."""
    prog = P.lower(Circuit("H 0\nCX 0 1\nX_ERROR(0.1) 1\nM 0 1\nREPEAT 3 {\n  MR 1\n  CX rec[-1] 0\n}"))
    flat, qubits, records = P.flatten(prog.structure(), prog.tables(), prog.num_qubits, prog.num_measurements)
    words = 4
    with jax.enable_x64(True):
        traced = F._run_flat.trace(flat.table, flat.ops, jax.random.key(0), qubits, records, flat.depth, words,
                                   F.noise_limits(flat.table))
    whole = {(qubits, words), (records, words)}
    switches, todo = 0, [traced.jaxpr.jaxpr]
    while todo:
        jaxpr = todo.pop()
        todo.extend(_subjaxprs(jaxpr))
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "cond" and len(eqn.params["branches"]) == len(F._OPS):
                switches += 1
                shapes = [v.aval.shape for v in eqn.outvars]
                assert not whole.intersection(shapes), shapes
    assert switches == 1


def test_pack_puts_draw_j_at_bit_j():
    draws = np.zeros((1, 32), bool)
    draws[0, [0, 5, 31]] = True
    assert int(F.pack(jnp.asarray(draws))[0]) == (1 | 1 << 5 | 1 << 31)
