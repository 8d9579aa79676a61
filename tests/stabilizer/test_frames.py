"""Pauli frames (stabilizer/frames.py): the bit-sliced op rules equal the per-shot Pauli algebra."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stabilizer import frames as F
from stabilizer import program as P
from stabilizer.circuit import Circuit

from .test_tableau import STIM_GATES, gate_action

stim = pytest.importorskip("stim")
_LETTER = {(0, 0): "_", (1, 0): "X", (1, 1): "Y", (0, 1): "Z"}


def _bits(words) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(np.asarray(words)).view(np.uint8), axis=-1, bitorder="little")


def _carry(rng, qubits: int, words: int = 2, measurements: int = 4) -> F._Carry:
    rand = lambda: jnp.asarray(rng.integers(0, 2**32, (qubits, words), dtype=np.uint32))
    return F._Carry(F.Frames(rand(), rand()), jnp.zeros((measurements + 1, words), jnp.uint32),
                    jnp.zeros((), jnp.int32), jnp.zeros((), jnp.uint32), jnp.zeros(words, jnp.uint32))


def _row(op_kind, qubits, spare, **fields):
    """One op-table row: qubits a list of (q0, q1) slots; fields as in stabilizer.program._Op."""
    fields = {k: np.asarray(v) if isinstance(v, list) else v for k, v in fields.items()}
    op = P._Op(op_kind, np.asarray(qubits), **fields)
    return {k: jnp.asarray(v[0]) for k, v in P._table([op], len(qubits), spare).items()}


@pytest.mark.parametrize("name", STIM_GATES)
def test_gate_conjugates_every_shot_as_stim(name):
    """Shot by shot, the new frame is G P G^dagger up to sign (stim.Tableau applied to the frame)."""
    arity = gate_action(name)[2]
    rng = np.random.default_rng(0)
    c = _carry(rng, 4)  # qubits 0..2 and the spare 3
    qubits = [2, 0][:arity]
    row = _row(P.GATE, [(qubits[0], qubits[1] if arity == 2 else 3)], 3, gate=name)
    out = F._op_gate(c, row, jax.random.key(0))
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
    out = F._op_measure(c, row, jax.random.key(5))
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
    out = F._op_feedback(c, row, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.f.x[0]) ^ np.asarray(c.f.x[0]), [0xF0F0F0F0, 0x1])
    np.testing.assert_array_equal(np.asarray(out.f.z[0]) ^ np.asarray(c.f.z[0]), [0xF0F0F0F0, 0x1])


def test_noise_events_have_their_probabilities():
    """PAULI_CHANNEL_2 with distinct probabilities: each pair's frequency over 2**14 shots."""
    probs = np.linspace(0.01, 0.05, 15)
    probs /= probs.sum() / 0.6
    c = _carry(np.random.default_rng(3), 3, words=512)
    c = c._replace(f=F.zeros(3, 512))
    out = F._op_noise(c, _row(P.NOISE, [(0, 1)], 2, probs=tuple(probs)), jax.random.key(7))
    xa, za, xb, zb = (_bits(a) for a in (out.f.x[0], out.f.z[0], out.f.x[1], out.f.z[1]))
    codes = xa | za << 1 | xb << 2 | zb << 3
    for k, (a, b) in enumerate(P.PAIRS):
        code = P._XBIT[a] | P._ZBIT[a] << 1 | P._XBIT[b] << 2 | P._ZBIT[b] << 3
        rate = np.mean(codes == code)
        assert abs(rate - probs[k]) < 5 * np.sqrt(probs[k] / codes.size), (a + b, rate, probs[k])


def test_run_program_flips_only_where_noise_is():
    prog = P.lower(Circuit("H 0\nCX 0 1\nX_ERROR(1) 1\nM 0 1\nREPEAT 3 {\n  MR 1\n}"))
    flips = F.run_program(prog.structure(), prog.tables(), jax.random.key(0), prog.num_qubits,
                          prog.num_measurements, 4)
    bits = _bits(flips)
    assert bits.shape == (5, 128)
    assert np.all(bits[0] ^ bits[1])  # the X error flips qubit 1 relative to qubit 0 in every shot
    assert 0.3 < bits[0].mean() < 0.7  # the Bell pair's outcome is random per shot
    assert np.all(bits[2] == ~bits[0] & 1) and not bits[3:].any()  # MR resets: later MRs are noiseless


def test_pack_puts_draw_j_at_bit_j():
    draws = np.zeros((1, 32), bool)
    draws[0, [0, 5, 31]] = True
    assert int(F.pack(jnp.asarray(draws))[0]) == (1 | 1 << 5 | 1 << 31)
