"""The `pauliprop` command (pauliprop/cli.py): `pauliprop estimate` on files written by Qiskit agrees
with the Python API, and bad input gets one line naming the cause and a non-zero exit, never a
traceback."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import pauliprop as pp
from pauliprop import cli

qiskit = pytest.importorskip("qiskit")
pytest.importorskip("qiskit_qasm3_import")
from qiskit import QuantumCircuit, qasm2, qasm3  # noqa: E402
from qiskit.circuit import Parameter  # noqa: E402


def _qiskit_circuit(theta=0.3):
    qc = QuantumCircuit(4)
    qc.h(0)
    qc.rx(theta, 1)
    qc.cx(0, 2)
    qc.ry(0.7, 3)
    qc.rzz(0.4, 1, 3)
    qc.s(2)
    return qc


def _run(capsys, *argv):
    code = cli.main(["estimate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def qasm_file(tmp_path):
    path = tmp_path / "c.qasm"
    path.write_text(qasm2.dumps(_qiskit_circuit()))
    return path


@pytest.mark.parametrize("method, flags", [("pauli", []), ("pauli", ["--min-abs-coeff", "0.3", "--max-weight", "1"]),
                                           ("statevector", [])])
def test_estimate_agrees_with_the_python_api(capsys, qasm_file, method, flags):
    code, out, err = _run(capsys, str(qasm_file), "--observable", "Z0 Z2 + 0.5 X1 - 0.25 Y3", "--method", method,
                          "--state", "0+01", "--json", *flags)
    assert code == 0 and err == ""
    got = json.loads(out)
    circuit = pp.Circuit.from_qasm(qasm_file.read_text())
    obs = pp.PauliSum.from_list([("ZZ", [0, 2], 1.0), ("X", [1], 0.5), ("Y", [3], -0.25)], 4)
    kw = {} if method == "statevector" else dict(truncation=pp.Truncation(
        min_abs_coeff=0.3 if flags else None, max_weight=1 if flags else None))
    want = float(pp.expectation(circuit, obs, state="0+01", method=method, **kw))
    assert abs(got["value"] - want) < 1e-12
    if method == "pauli":
        assert (got["total_dropped_norm"] > 0) == bool(flags) and got["peak_terms"] >= 1
    exact = float(pp.expectation(circuit, obs, state="0+01", method="statevector"))
    if not flags:
        assert abs(got["value"] - exact) < 1e-10


def test_observable_files_and_qasm3_parameters(capsys, tmp_path):
    theta = Parameter("theta")
    path = tmp_path / "c3.qasm"
    path.write_text(qasm3.dumps(_qiskit_circuit(theta)))
    sparse = tmp_path / "obs.json"
    sparse.write_text(json.dumps([["ZZ", [0, 2], 1.0], ["X", [1], 0.5]]))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"ZIZI": 1.0, "IXII": 0.5}))
    written = tmp_path / "obs.txt"
    written.write_text("Z0 Z2\n+ 0.5 X1\n")
    want = float(pp.expectation(pp.Circuit.from_qiskit(_qiskit_circuit(0.9)),
                                pp.PauliSum.from_text("Z0 Z2 + 0.5 X1", 4), method="statevector"))
    for obs in (sparse, labels, written):
        for params in ("theta=0.9", "0.9"):
            code, out, err = _run(capsys, str(path), "--observable-file", str(obs), "--params", params, "--json")
            assert code == 0, err
            assert abs(json.loads(out)["value"] - want) < 1e-10


def test_human_output_names_value_dropped_norm_and_terms(capsys, qasm_file):
    code, out, _ = _run(capsys, str(qasm_file), "--observable", "Z0", "--min-abs-coeff", "0.2")
    assert code == 0
    assert out.startswith("value ") and "dropped 1-norm" in out and "peak terms" in out


@pytest.mark.parametrize("argv, cause", [
    (["missing.qasm", "--observable", "Z0"], "No such file"),
    (["{qasm}", "--observable", "Z0 + * X1"], "expected a term at character"),
    (["{qasm}", "--observable", "Z0 Q1"], "unexpected 'Q'"),
    (["{qasm}", "--observable", "Z9"], "qubit 9 is out of range for 4 qubits"),
    (["{bad}", "--observable", "Z0"], "QASM line 4"),
    (["{qasm}", "--observable", "Z0", "--params", "0.1"], "no input parameters"),
    (["{qasm}", "--observable", "Z0", "--method", "statevector", "--max-weight", "2"], "takes no truncation"),
])
def test_bad_input_is_one_line_naming_the_cause(capsys, tmp_path, qasm_file, argv, cause):
    bad = tmp_path / "bad.qasm"
    bad.write_text('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nfoo q[0];\n')
    argv = [a.format(qasm=qasm_file, bad=bad) for a in argv]
    code, out, err = _run(capsys, *argv)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and cause in err and "Traceback" not in err


@pytest.mark.parametrize("argv, cause", [(["c.qasm", "--observable", "Z0", "--bogus"], "unrecognized arguments: --bogus"),
                                         ([], "the following arguments are required: circuit"),
                                         (["c.qasm"], "one of the arguments --observable --observable-file"),
                                         (["c.qasm", "--observable", "Z0", "--max-weight", "two"], "invalid int")])
def test_bad_flags_are_one_line(capsys, argv, cause):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["estimate", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and cause in err


def test_the_demos_bad_flags_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--angles", "x"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip().splitlines() == ["pauliprop: error: argument --angles: invalid int "
                                                                  "value: 'x'"]


def test_the_installed_command_runs_in_a_fresh_process(qasm_file):
    """As users run it: a new interpreter, the module's entry point, JSON on stdout."""
    proc = subprocess.run([sys.executable, "-m", "pauliprop.cli", "estimate", str(qasm_file), "--observable",
                           "X1", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    value = json.loads(proc.stdout)["value"]
    circuit = pp.Circuit.from_qasm(qasm_file.read_text())
    assert np.isclose(value, float(pp.expectation(circuit, pp.PauliSum.from_text("X1", 4), method="statevector")))


def test_the_demo_prints_its_estimates_and_writes_its_plot(capsys, tmp_path):
    """`pauliprop` (one Trotter step, two angles): the estimates (<Z62> after one step is cos(theta_h)),
    a progress bar on stderr, and the PNG where it says."""
    png = tmp_path / "demo.png"
    assert cli.main(["--steps", "1", "--angles", "4", "8", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if "*pi/32" in line]
    assert [r[0] for r in rows] == ["4*pi/32", "8*pi/32"]
    for k, row in zip((4, 8), rows):
        assert abs(float(row[1]) - math.cos(k * math.pi / 32)) < 1e-6
    assert f"plot written to {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["--steps", "1", "--angles", "4", "--no-plot"]) == 0
    assert "plot" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, cause", [(["--steps", "-1"], "argument --steps: must be at least 1, got -1"),
                                         (["--capacity", "0"], "argument --capacity: must be at least 1, got 0"),
                                         (["--angles", "4", "--max-terms", "0"], "pauliprop: error: "),
                                         (["--steps", "1", "--angles", "4", "--plot", "/no/such/dir/p.png"],
                                          "pauliprop: error: ")])
def test_the_demos_bad_values_are_one_line(capsys, argv, cause):
    try:
        code = cli.main([*argv, *([] if "--plot" in argv else ["--no-plot"])])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len([line for line in err if "error" in line]) == 1 and cause in err[-1]
    assert not any("Traceback" in line for line in err)
