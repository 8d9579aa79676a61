"""Compilation as a user meets it (pauliprop/runtime/compilation.py and the bucketed tables).

* A second process running the same job compiles nothing: the persistent cache is on by default,
  in the directory the environment names, and off with PAULIPROP_NO_CACHE=1. The first compiles the
  engine's programs alone (nothing for building the observable or returning the value).
* One long process over many distinct small circuits compiles a bounded set of programs: after the
  first circuits, new ones reuse what is compiled (no growth in programs or memory maps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

JOB = r"""
import json, logging, re, sys
import jax
programs = []  # the names of the programs compiled (or read from the cache)
class Names(logging.Handler):
    def emit(self, record):
        m = re.search(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
        programs.extend(m.groups() if m else ())
logging.getLogger("jax").addHandler(Names())
jax.config.update("jax_log_compiles", True)
events = []  # XLA compilations (also on a cache hit), and the persistent cache's hits and misses
jax.monitoring.register_event_duration_secs_listener(lambda event, duration, **kw: events.append(event))
jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))
import pauliprop as pp
from pauliprop.runtime import compilation
c = pp.Circuit(4).h(0).cx(0, 1).rx(2, pp.Param(0)).rzz(1, 2, 0.3).t(3).ry(3, pp.Param(1))
h = pp.PauliSum.from_labels({"ZZII": 1.0, "IXIY": 0.5})
v = float(pp.expectation(c, h, params=[0.1, 0.2]))
count = lambda name: sum(e == name for e in events)
print(json.dumps({"value": v, "compiles": count("/jax/core/compile/backend_compile_duration"),
                  "hits": count("/jax/compilation_cache/cache_hits"),
                  "misses": count("/jax/compilation_cache/cache_misses"), "cache": compilation.enable(),
                  "programs": sorted(programs)}))
"""


def _job(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PAULIPROP_NO_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(JAX_PLATFORMS="cpu", **env_extra)
    proc = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    first = _job({"PAULIPROP_CACHE_DIR": str(cache)})
    assert first["cache"] == str(cache) and first["misses"] > 0 and any(cache.iterdir())
    # the engine's programs alone (the observable's merge, the loop): building the observable and returning
    # the value compile nothing of their own (an eager jnp op does: a program per shape, 50-170 ms on a GPU)
    assert first["programs"] == ["_forward", "merge"], first["programs"]
    second = _job({"PAULIPROP_CACHE_DIR": str(cache)})
    assert second["misses"] == 0 and second["hits"] == second["compiles"] > 0  # every program read from disk
    assert second["value"] == first["value"]
    off = _job({"PAULIPROP_CACHE_DIR": str(tmp_path / "unused"), "PAULIPROP_NO_CACHE": "1"})
    assert off["cache"] is None and off["hits"] == off["misses"] == 0 and off["compiles"] > 0
    assert not (tmp_path / "unused").exists()


def test_many_distinct_circuits_compile_a_bounded_set_of_programs():
    """200 random QASM circuits (1-8 qubits, 5-40 gates), each untruncated against the state vector
    (which raises on a mismatch): the first 100 compile about a hundred programs; circuits 101-200
    reuse them (a rare new combination of qubit count and table bucket may still compile one).
    Before tables were bucketed every circuit compiled anew, and such a loop died after about 70
    circuits with LLVM out of memory maps."""
    pytest.importorskip("qiskit", reason="the circuits are parsed from OpenQASM (pip install -e '.[test]')")
    sys.path.insert(0, str(REPO_ROOT / "experiments"))
    try:
        import many_circuits
    finally:
        sys.path.pop(0)
    result = many_circuits.run(200, seed=1, every=100)
    half, end = result["rows"]
    assert end["compilations"] - half["compilations"] <= 5, result["rows"]
    assert end["memory_maps"] - half["memory_maps"] <= 0.2 * half["memory_maps"], result["rows"]
    assert result["worst_abs_error"] < 1e-9
