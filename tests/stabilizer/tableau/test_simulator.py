"""TableauSimulator (stabilizer/tableau/simulator.py) runs Stim circuits as Stim does: every
measurement outcome that Stim determines, we determine identically; forced to Stim's random outcomes,
we end in Stim's state; noise channels apply the Paulis Stim's would."""

from __future__ import annotations

import numpy as np
import pytest

from stabilizer.circuits.circuit import Circuit
from stabilizer.circuits.program import GATE, disjoint_runs
from stabilizer.tableau.simulator import TableauSimulator

from .test_tableau import STIM_GATES, gate_action

stim = pytest.importorskip("stim")

MEASURE_1Q = ["M", "MX", "MY", "MR", "MRX", "MRY"]


class _Forced:
    """Stands in for the simulator's numpy generator: measurement guesses from a queue, no noise."""

    def __init__(self, guesses):
        self.guesses = list(guesses)

    def integers(self, k, size=None):
        if size is not None:  # the compiled path draws all its guesses at once
            out, self.guesses = np.array(self.guesses[:size]), self.guesses[size:]
            return out
        return self.guesses.pop(0) if k == 2 else 0

    def random(self):
        return 1.0


@pytest.fixture(params=["direct", "program"])
def path(request, monkeypatch):
    """Run circuits instruction by instruction, or as one compiled program."""
    import stabilizer.tableau.simulator as S

    monkeypatch.setattr(S, "PROGRAM_MIN_INSTRUCTIONS", 10**9 if request.param == "direct" else 0)
    return request.param


def _random_circuit(rng, n: int, length: int) -> str:
    lines, measured = [], 0
    for _ in range(length):
        r = rng.random()
        if r < 0.5:
            g = STIM_GATES[rng.integers(len(STIM_GATES))]
            k = gate_action(g)[2]
            lines.append(f"{g} " + " ".join(map(str, rng.choice(n, size=2 * k, replace=False))))
        elif r < 0.65:
            q = rng.choice(n, size=2, replace=False)
            lines.append(f"{MEASURE_1Q[rng.integers(6)]} {'!' if rng.random() < 0.3 else ''}{q[0]} {q[1]}")
            measured += 2
        elif r < 0.72:  # a reset's hidden collapse is Stim's random choice: measure first to fix it
            b, q = ["", "X", "Y"][rng.integers(3)], rng.integers(n)
            lines.append(f"M{b} {q}\nR{b} {q}")
            measured += 1
        elif r < 0.82:
            qs = rng.choice(n, size=3, replace=False)
            ps = rng.choice(list("XYZ"), size=3)
            lines.append(f"MPP {'!' if rng.random() < 0.3 else ''}{ps[0]}{qs[0]}*{ps[1]}{qs[1]} {ps[2]}{qs[2]}")
            measured += 2
        elif r < 0.9:
            a, b = rng.choice(n, size=2, replace=False)
            lines.append(f"M{'XYZ'[rng.integers(3)] * 2} {a} {'!' if rng.random() < 0.3 else ''}{b}")
            measured += 1
        elif measured:
            k = int(rng.integers(1, min(measured, 3) + 1))
            gate = ["CX", "CY", "CZ"][rng.integers(3)]
            lines.append(f"{gate} rec[-{k}] {rng.integers(n)}" if rng.random() < 0.5 or gate != "CZ"
                         else f"CZ {rng.integers(n)} rec[-{k}]")
    return "\n".join(lines)


def _raw_outcomes(circuit: Circuit, record: list[bool], resets: bool = True) -> list[int]:
    """The guess queue that makes our random outcomes Stim's: the raw result of each measurement
    (record bit with its '!' undone) and 0 for resets (which the compiled path does not draw), in
    the order the simulator draws them."""
    out, i = [], 0
    for ins in circuit.flattened():
        kind = ins.definition.kind
        if kind == "reset":
            out += [0] * len(ins.targets) * resets
        elif kind in ("measure", "measure_reset"):
            for t in ins.targets:
                out.append(int(record[i] ^ t.is_inverted_result_target))
                i += 1
        elif kind == "pair_measure":
            for a, b in zip(ins.targets[::2], ins.targets[1::2]):
                out.append(int(record[i] ^ a.is_inverted_result_target ^ b.is_inverted_result_target))
                i += 1
        elif kind == "mpp":
            from stabilizer.circuits.circuit import product_groups

            for group in product_groups(ins):
                out.append(int(record[i] ^ (sum(t.is_inverted_result_target for t in group) % 2)))
                i += 1
    return out


@pytest.mark.parametrize("seed", range(12))
def test_random_circuits_with_measurement_reset_and_feedback_follow_stim(seed, path):
    rng = np.random.default_rng(seed)
    n = 6 if seed % 3 else 40  # a register across the 32-bit word boundary too
    _follows_stim(_random_circuit(rng, n, 60), n, seed, path)


@pytest.mark.parametrize("seed", range(2))
def test_long_gate_runs_follow_stim(seed, path):
    """Stretches of 40 gate layers between measurements: the compiled path scans them as Runs."""
    rng = np.random.default_rng(seed)
    n = 6
    layer = lambda: f"CX {' '.join(map(str, rng.permutation(n)[:4]))}\n{STIM_GATES[rng.integers(len(STIM_GATES))]} 0 1"
    stretches = ["\n".join(layer() for _ in range(40)) for _ in range(3)]
    circuit = _follows_stim("\nM 0 2\nMR 3\n".join(stretches) + "\nM 0 1 2 3 4 5", n, seed, path)
    if path == "program":
        (prog,) = circuit._lowered.values()
        assert prog.structure().count(("run", GATE)) == 3


def _follows_stim(text: str, n: int, seed: int, path: str) -> Circuit:
    """The simulator, forced to Stim's random outcomes, gives Stim's record and state: the circuit it ran."""
    circuit = Circuit(text)
    ref = stim.TableauSimulator(seed=seed)
    ref.set_num_qubits(n)
    ref.do(stim.Circuit(text))
    theirs = ref.current_measurement_record()
    sim = TableauSimulator(num_qubits=n)
    sim._rng = _Forced(_raw_outcomes(circuit, theirs, resets=path == "direct"))
    sim.do(circuit)
    assert sim.current_measurement_record() == theirs
    check = stim.TableauSimulator()
    check.set_inverse_tableau(sim.current_inverse_tableau())
    assert check.canonical_stabilizers() == ref.canonical_stabilizers()
    return circuit


def test_peeks_equal_stims():
    text = "H 0\nS 0\nH 1\nCX 1 2\nX 3\nH 4\nSQRT_Y 5"
    sim = TableauSimulator(seed=0)
    sim.do(Circuit(text))
    ref = stim.TableauSimulator()
    ref.do(stim.Circuit(text))
    for q in range(7):
        assert (sim.peek_x(q), sim.peek_y(q), sim.peek_z(q)) == (ref.peek_x(q), ref.peek_y(q), ref.peek_z(q)), q


def test_gate_methods_by_stim_name_and_stim_circuits():
    sim = TableauSimulator(seed=5)
    sim.h(0)
    sim.cnot(0, 1)
    sim.sqrt_x_dag(2)
    sim.do(stim.Circuit("CZ 1 2"))
    ref = stim.TableauSimulator()
    ref.do(stim.Circuit("H 0\nCX 0 1\nSQRT_X_DAG 2\nCZ 1 2"))
    assert sim.current_inverse_tableau() == ref.current_inverse_tableau()
    a, b = sim.measure(0), sim.measure(1)
    assert a == b and sim.current_measurement_record() == [a, b]
    with pytest.raises(AttributeError):
        sim.not_a_gate(0)


def _canonical(sim: TableauSimulator):
    check = stim.TableauSimulator()
    check.set_inverse_tableau(sim.current_inverse_tableau())
    return check.canonical_stabilizers()


@pytest.mark.parametrize("seed", range(4))
def test_measure_kickback_flips_between_the_two_outcomes(seed):
    """Random measurements return a kickback K: the state after outcome r, with K applied, is the
    state after the other outcome. Determined outcomes return None, where Stim does."""
    rng = np.random.default_rng(seed)
    n = 40
    text = "\n".join(f"{g} " + " ".join(map(str, rng.choice(n, gate_action(g)[2], replace=False)))
                     for g in rng.choice(STIM_GATES, 80)) + "\nM 0 1 2"
    for q in rng.choice(n, 6, replace=False):
        ref = stim.TableauSimulator()
        ref.do(stim.Circuit(text))
        _, ref_kick = ref.measure_kickback(int(q))
        outcomes = []
        for forced in (False, True):
            sim = TableauSimulator(seed=seed, num_qubits=n)  # the same outcomes for M 0 1 2
            sim.do(Circuit(text))
            sim._rng = _Forced([int(forced)])
            outcomes.append((sim, *sim.measure_kickback(int(q))))
        (a, ra, kick), (b, rb, _) = outcomes
        assert (kick is None) == (ref_kick is None)
        if kick is None:
            assert ra == rb
            continue
        assert (ra, rb) == (False, True) and a.current_measurement_record()[-1] is False
        a.do(kick)
        assert _canonical(a) == _canonical(b)
        assert a.peek_z(int(q)) == -1


def test_stim_api_methods():
    sim = TableauSimulator(seed=4)
    sim.reset_x(0)
    sim.reset_y(1)
    sim.x(2)
    assert (sim.peek_x(0), sim.peek_y(1), sim.peek_z(2)) == (1, 1, -1)
    assert sim.measure_many(2, 3) == [True, False]
    c = Circuit()
    c.append_from_stim_program_text("REPEAT 2 {\n  CX 0 1\n}\nM(0.5) 0")
    assert c[0].body_copy() == c[0].body and c[1].targets_copy()[0].value == 0 and c[1].gate_args_copy() == [0.5]


@pytest.mark.parametrize("k", range(15))
def test_pauli_channel_2_applies_stims_pair(k, path):
    """Certain noise (one probability 1) applies the Pauli pair Stim applies, in Stim's order."""
    probs = [0.0] * 15
    probs[k] = 1.0
    text = ("H 0 1\nS 0 1\nCX 0 2 1 3\nPAULI_CHANNEL_2(" + ",".join(map(str, probs)) + ") 0 1\n"
            + "CX 0 2 1 3\nS_DAG 0 1\nH 0 1\nM 0 1 2 3")
    ref = stim.TableauSimulator()
    ref.do(stim.Circuit(text))
    sim = TableauSimulator(seed=0)
    sim.do(Circuit(text))
    assert sim.current_measurement_record()[:2] == ref.current_measurement_record()[:2]


@pytest.mark.parametrize("text,record", [
    ("X_ERROR(1) 0\nM 0", [True]),
    ("Y_ERROR(1) 0\nM 0", [True]),
    ("Z_ERROR(1) 0\nM 0", [False]),
    ("H 0\nZ_ERROR(1) 0\nMX 0", [True]),
    ("X_ERROR(1) 0 0\nM 0", [False]),  # repeated targets compose
    ("PAULI_CHANNEL_1(0, 0, 1) 0\nH 1\nPAULI_CHANNEL_1(0, 0, 1) 1\nMX 1\nM 0", [True, False]),
    ("E(1) X0\nELSE_CORRELATED_ERROR(1) X1\nE(0) X2\nELSE_CORRELATED_ERROR(1) X3 Y4\nM 0 1 2 3 4",
     [True, False, False, True, True]),
    ("H 0\nELSE_CORRELATED_ERROR(1) X1\nH 0\nM 0 1", [False, True]),  # an ELSE with no E: as Stim
    ("M(1) 0 !1", [True, False]),
    ("MPAD 1 0", [True, False]),
    ("X 0\nMR 0 0", [True, False]),
    ("H 0\nRX 0\nMX 0", [False]),
    ("I_ERROR(0.5) 0\nII_ERROR 0 1\nM 0", [False]),
    ("X 1\nM 1\nCX rec[-1] 0 sweep[0] 2\nM 0 2", [True, True, False]),
])
def test_noise_and_classical_control(text, record, path):
    sim = TableauSimulator(seed=1)
    sim.do(Circuit(text))
    assert sim.current_measurement_record() == record
    ref = stim.TableauSimulator()
    ref.do(stim.Circuit(text))
    assert ref.current_measurement_record() == record


def test_depolarize_rates():
    """DEPOLARIZE1(p) flips a Z measurement with probability 2p/3 (X or Y of the three Paulis)."""
    sim = TableauSimulator(seed=11)
    shots = 3000
    sim.do(Circuit("REPEAT 3000 {\n DEPOLARIZE1(0.3) 0\n M 0\n R 0\n}"))
    rate = np.mean(sim.current_measurement_record())
    assert abs(rate - 0.2) < 5 * np.sqrt(0.2 * 0.8 / shots)


def test_disjoint_runs_keep_order():
    assert disjoint_runs([(0, 1), (2, 3), (1, 4), (5, 6), (0, 2)]) == [[(0, 1), (2, 3)], [(1, 4), (5, 6), (0, 2)]]
    assert disjoint_runs([(0,), (0,), (1,)]) == [[(0,)], [(0,), (1,)]]


def test_compiled_path_continues_the_state_and_the_record(path):
    """A circuit run after earlier calls starts from their state, on a simulator with more qubits."""
    sim = TableauSimulator(seed=3, num_qubits=40)
    sim.x(39)
    sim.h(5)
    first = sim.measure(5)
    sim.do(Circuit("CX 39 2\nM 2 39\nX 7\nM 7"))
    assert sim.current_measurement_record() == [first, True, True, True]
    assert sim.num_qubits == 40 and sim.peek_z(0) == 1
    sim.do(Circuit("H 0 1\nCX 0 1 2 3\nS 0\nCZ 2 3"))  # padded windows touch only the spare qubit 40...
    sim.set_num_qubits(41)
    assert sim.peek_z(40) == 1 and sim.peek_x(40) == 0  # ...which is still |0> when it becomes a real qubit
