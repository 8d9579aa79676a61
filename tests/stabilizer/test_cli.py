"""The `stabilizer` command (stabilizer/cli.py): `sample` and `detect` read Stim circuit files and write
Stim's result formats, bit for bit the Python samplers' output for the same seed; bad input is one
line naming the cause and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import stabilizer as st
from stabilizer import cli
from stabilizer.formats import FORMATS

stim = pytest.importorskip("stim")

SHOTS = 128


@pytest.fixture(scope="module")
def circuit_file(tmp_path_factory):
    c = stim.Circuit.generated("surface_code:rotated_memory_z", distance=3, rounds=2,
                               after_clifford_depolarization=0.02, before_measure_flip_probability=0.01)
    path = tmp_path_factory.mktemp("circuit") / "c.stim"
    path.write_text(str(c))
    return path


def _read(path, fmt, **counts):
    return stim.read_shot_data_file(path=str(path), format=fmt, **counts)


@pytest.mark.parametrize("fmt", FORMATS)
def test_sample_writes_the_python_samplers_bits(tmp_path, circuit_file, fmt):
    out = tmp_path / "m"
    assert cli.main(["sample", "--shots", str(SHOTS), "--in", str(circuit_file), "--out", str(out),
                     "--out_format", fmt, "--seed", "7"]) == 0
    c = st.Circuit(circuit_file.read_text())
    want = st.compile_sampler(c, seed=7).sample(SHOTS)
    np.testing.assert_array_equal(_read(out, fmt, num_measurements=c.num_measurements), want)


@pytest.mark.parametrize("fmt", ["01", "b8", "dets", "r8"])
def test_detect_writes_detectors_and_observables(tmp_path, circuit_file, fmt):
    c = st.Circuit(circuit_file.read_text())
    d, o = c.num_detectors, c.num_observables
    dets, obs = st.compile_detector_sampler(c, seed=3).sample(SHOTS, separate_observables=True)
    out, obs_out, both = tmp_path / "d", tmp_path / "o", tmp_path / "b"
    assert cli.main(["detect", "--shots", str(SHOTS), "--in", str(circuit_file), "--out", str(out), "--out-format",
                     fmt, "--obs_out", str(obs_out), "--obs_out_format", fmt, "--seed", "3"]) == 0
    np.testing.assert_array_equal(_read(out, fmt, num_detectors=d), dets)
    np.testing.assert_array_equal(_read(obs_out, fmt, num_observables=o), obs)
    assert cli.main(["detect", "--shots", str(SHOTS), "--in", str(circuit_file), "--out", str(both), "--out_format",
                     fmt, "--append_observables", "--seed", "3"]) == 0
    np.testing.assert_array_equal(_read(both, fmt, num_detectors=d, num_observables=o),
                                  np.concatenate([dets, obs], axis=1))


@pytest.mark.parametrize("argv, cause", [
    (["sample", "--in", "missing.stim"], "No such file"),
    (["sample", "--in", "{bad}"], "line 2"),
    (["sample", "--in", "{good}", "--shots", "-3"], "--shots must be >= 0"),
    (["detect", "--in", "{good}", "--shots", "10", "--out_format", "ptb64"], "not a multiple of 64"),
])
def test_bad_input_is_one_line_naming_the_cause(capsys, tmp_path, circuit_file, argv, cause):
    bad = tmp_path / "bad.stim"
    bad.write_text("H 0\nFOO 1\n")
    code = cli.main([a.format(bad=bad, good=circuit_file) for a in argv])
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1 and cause in err and "Traceback" not in err


@pytest.mark.parametrize("argv, cause", [(["sample", "--bogus"], "unrecognized arguments: --bogus"),
                                         (["sampel"], "invalid choice: 'sampel'"),
                                         (["sample", "--out_format", "csv"], "invalid choice: 'csv'")])
def test_bad_flags_are_one_line(capsys, argv, cause):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and cause in err


def test_the_command_reads_stdin_and_writes_stdout_in_a_fresh_process(circuit_file):
    """As pipelines run it: `stabilizer sample < c.stim > out` in a new interpreter."""
    proc = subprocess.run([sys.executable, "-m", "stabilizer.cli", "sample", "--shots", "5", "--seed", "2"],
                          input=circuit_file.read_text(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    c = st.Circuit(circuit_file.read_text())
    want = st.compile_sampler(c, seed=2).sample(5)
    assert proc.stdout.splitlines() == ["".join("1" if b else "0" for b in row) for row in want]
