"""experiments/statevector_bench.py runs end to end at toy sizes and records every part it promises:
the floor, the pass costs the cost model reads, each circuit in every mode with its plan, and the
weak-scaling rows over forced host devices with their all-to-alls (qiskit-aer is not a test
dependency, so it is off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("qiskit", reason="the benchmark builds its circuits with qiskit (pip install -e '.[test]')")

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_state_vector_benchmark_records_every_part(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2")
    cmd = [sys.executable, str(REPO_ROOT / "experiments" / "statevector_bench.py"), "--sizes", "6",
           "--hyquas-qubits", "6", "--widths", "3", "--aer-max", "0", "--unfused-max", "6", "--repeats", "1",
           "--weak-scaling", "5", "--note", "smoke", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["note"] == "smoke" and set(result["floor_s"]) == {"5", "6"}
    assert {"diagonal", "transpose", "3", "('in_place', 3)", "('elementwise', 3)"} <= set(result["pass_seconds"])
    names = [row["circuit"] for row in result["rows"]]
    assert names == ["walsh", "qft"] + [f"hyquas_{c}" for c in ("bc", "bv", "hs", "qaoa", "qft", "qv", "sp")]
    for row in result["rows"]:
        modes = [o["fuse"] for o in row["ours"]]
        assert modes == ["auto", 3, None], row["circuit"]
        for o in row["ours"]:
            assert o["run_s"] > 0 and o["passes"] >= 1
            if o["fuse"] is not None:
                assert 0 <= o["elementwise_width"] <= 4 and o["diagonal_passes"] <= o["passes"]
    scaling = [(r["circuit"], r["qubits"], r["devices"]) for r in result["weak_scaling"]]
    assert scaling == [(c, n, d) for c in names for n, d in ((5, 1), (6, 2))]
    assert all(r["run_s"] > 0 and r["efficiency"] > 0 for r in result["weak_scaling"])
    # the all-to-alls counted in each program (none on one device; Walsh's one global wire comes in
    # and goes back), their share from one swap timed alone on the leading and a middle local axis
    assert all((r["all_to_alls"] == 0) == (r["devices"] == 1) for r in result["weak_scaling"])
    assert next(r for r in result["weak_scaling"] if r["circuit"] == "walsh" and r["devices"] == 2)["all_to_alls"] == 2
    assert all(r["all_to_all_share"] > 0 for r in result["weak_scaling"] if r["devices"] == 2)
    assert [(r["devices"], r["local_qubits"], r["axis"]) for r in result["swap_alone"]] == [(2, 5, 0), (2, 5, 2)]
    assert all(r["seconds"] > 0 for r in result["swap_alone"])
