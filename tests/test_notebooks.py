"""The notebooks run end to end at small sizes and reach what they claim.

Each notebook reads its sizes from PAULIPROP_NB_* environment variables (full sizes when unset), runs
in a fresh python3 kernel of this interpreter (nbclient + ipykernel) with matplotlib's Agg backend,
asserts its own checks in its last cell and prints them as a `SUMMARY {json}` line, which the test
checks again. About 20-30 s each on a 2-core CPU, JAX compilation included.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (pip install -e '.[test]')")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient (pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="the notebook tests need ipykernel (pip install -e '.[test]')")
pytest.importorskip("matplotlib", reason="the notebooks plot with matplotlib (pip install -e '.[test]')")

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO_ROOT / "notebooks"
KERNEL = "pauliprop-test-python"


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec that runs this very interpreter (not whatever `python3` a user kernelspec names),
    importing pauliprop from this checkout, with the Agg backend."""
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "pauliprop tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    return monkeypatch


def run_notebook(name: str, monkeypatch, **sizes) -> tuple[dict, float]:
    """Executes notebooks/<name> with PAULIPROP_NB_<KEY>=value; returns its SUMMARY and the wall time."""
    for key, value in sizes.items():
        monkeypatch.setenv(f"PAULIPROP_NB_{key.upper()}", str(value))
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    for cell in reversed(nb.cells):
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                if line.startswith("SUMMARY "):
                    return json.loads(line[len("SUMMARY "):]), seconds
    raise AssertionError(f"{name} printed no SUMMARY line")


def test_vqe_notebook_reaches_the_ground_energy(kernel_env):
    summary, seconds = run_notebook("vqe.ipynb", kernel_env, qubits=6, steps=200)
    print(f"vqe.ipynb: {seconds:.1f} s, {summary}")
    assert summary["qubits"] == 6
    assert summary["rel_error"] <= 1e-3
    # untruncated, the Pauli run is exact: it takes the same steps as the state vector
    assert summary["max_step_diff_pauli_vs_statevector"] < 1e-8


def test_qaoa_notebook_pauli_optimum_equals_statevector(kernel_env):
    pytest.importorskip("networkx", reason="the QAOA notebook draws its graph with networkx")
    summary, seconds = run_notebook("qaoa.ipynb", kernel_env, nodes=6, steps=60, starts=2)
    print(f"qaoa.ipynb: {seconds:.1f} s, {summary}")
    assert summary["nodes"] == 6 and summary["exact"]
    assert summary["rel_diff"] <= 1e-6  # untruncated Pauli optimum == state-vector optimum
    assert summary["statevector_best"] <= summary["maxcut"] + 1e-9
    assert summary["approximation_ratio"] > 0.9


def test_live_words_notebook_counts_words_and_matches_the_state_vector(kernel_env):
    summary, seconds = run_notebook("live_words.ipynb", kernel_env, layers=12, words=200)
    print(f"live_words.ipynb: {seconds:.1f} s, {summary}")
    assert summary["clifford_flat"] and summary["max_abs_error"] < 1e-9
    peaks = summary["peaks"]
    assert peaks["Clifford only"] == summary["initial_words"] < min(peaks["mixed"], peaks["rotation heavy"])
    assert 0.9 * 4**7 <= peaks["rotation heavy"] <= 4**7


def test_surface_threshold_notebook_shows_the_crossing(kernel_env):
    pytest.importorskip("stim", reason="the threshold notebook builds its circuits with stim")
    pytest.importorskip("pymatching", reason="the threshold notebook decodes with pymatching")
    summary, seconds = run_notebook("surface_threshold.ipynb", kernel_env, distances="3,5", ps="0.003,0.015",
                                    shots=20000)
    print(f"surface_threshold.ipynb: {seconds:.1f} s, {summary}")
    assert summary["growing"] and summary["below_sigmas"] > 3 and summary["above_sigmas"] > 3
    assert summary["detector_rate_sigmas"] < 5


def test_kicked_ising_notebook_follows_the_published_values(kernel_env):
    summary, seconds = run_notebook("kicked_ising.ipynb", kernel_env, angles="4,8,12")
    print(f"kicked_ising.ipynb: {seconds:.1f} s, {summary}")
    assert summary["steps"] == 20 and summary["worst_error_vs_mix"] < 0.06
    values = {int(k): v for k, v in summary["values"].items()}
    assert abs(values[8] - 0.2613) < 1e-3  # cuPauliProp's value at these settings (DESIGN.md section 7)
