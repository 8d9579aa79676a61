"""Compilation as a user meets it (pauliprop/runtime/compilation.py and the bucketed tables).

* A second process running the same job compiles nothing: the persistent cache is on by default,
  in the directory the environment names, and off with PAULIPROP_NO_CACHE=1. The first compiles the
  engine's programs alone (nothing for building the observable or returning the value).
* A program given a key is stored whole and a later process (or this one, once its executables are
  released) loads it without tracing; a broken file is compiled again; the store keeps at most
  MAX_PROGRAMS files; an executable JAX's cache supplied is not stored (XLA:CPU drops kernels re-serializing it).
* One long process over many distinct small circuits compiles a bounded set of programs: after the
  first circuits, new ones reuse what is compiled (no growth in programs or memory maps).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from pauliprop.runtime import compilation

REPO_ROOT = Path(__file__).resolve().parents[3]

JOB = r"""
import json, logging, re, sys
import jax
programs, traced = [], []  # the names of the programs compiled (or read from JAX's cache), and traced
class Names(logging.Handler):
    def emit(self, record):
        m = re.search(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
        programs.extend(m.groups() if m else ())
        m = re.search(r"Finished tracing (\w+) for jit", record.getMessage())
        traced.extend(m.groups() if m else ())
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
                  "programs": sorted(programs), "traced": sorted(traced)}))
"""


def _job(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PAULIPROP_NO_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(JAX_PLATFORMS="cpu", PAULIPROP_NATIVE="0", **env_extra)  # XLA's programs, not the native engine's (test_native)
    proc = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    first = _job({"PAULIPROP_CACHE_DIR": str(cache)})
    assert first["cache"] == str(cache) and first["misses"] > 0
    # the engine's programs alone (the observable's merge, the loop): building the observable and returning
    # the value compile nothing of their own (an eager jnp op does: a program per shape, 50-170 ms on a GPU)
    assert first["programs"] == ["_forward", "merge"], first["programs"]
    assert len(list((cache / compilation.PROGRAMS).glob("*.bin"))) == 2  # both stored whole
    # the second loads them: nothing traced, lowered or compiled
    second = _job({"PAULIPROP_CACHE_DIR": str(cache)})
    assert second["traced"] == [] and second["compiles"] == second["misses"] == 0, second
    assert second["value"] == first["value"]
    # without the stored programs JAX's own cache serves them (traced and lowered again, compiled by none), and
    # they are not stored again: XLA:CPU serializes an executable read from JAX's cache without some kernels
    # (a later process would fail at its first run), so a fourth process is served by JAX's cache too
    shutil.rmtree(cache / compilation.PROGRAMS)
    third = _job({"PAULIPROP_CACHE_DIR": str(cache)})
    assert third["misses"] == 0 and third["hits"] == third["compiles"] > 0 and third["value"] == first["value"]
    assert not list((cache / compilation.PROGRAMS).glob("*.bin"))
    fourth = _job({"PAULIPROP_CACHE_DIR": str(cache)})
    assert fourth["hits"] == third["hits"] and fourth["value"] == first["value"]
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


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The program store on, in a folder of the test's own; the process's loaded programs released."""
    monkeypatch.setenv("PAULIPROP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PAULIPROP_NO_CACHE", raising=False)
    compilation._LOADED.cache_clear()
    yield tmp_path / compilation.PROGRAMS
    compilation._LOADED.cache_clear()


def _counting(traces: list):
    def fn(x, y):
        traces.append(1)  # runs when traced, never when a stored program runs
        return {"sum": x + y, "prod": x * y}
    return fn


def test_a_stored_program_runs_without_tracing(store):
    traces = []
    x, y = np.arange(4.0), np.float64(3.0)
    first = compilation.Jitted(_counting(traces), None, key=("test", 1))(x, y)
    assert traces == [1] and len(list(store.glob("*.bin"))) == 1
    compilation._LOADED.cache_clear()  # as a new process: nothing loaded
    again = compilation.Jitted(_counting(traces), None, key=("test", 1))(x, y)
    assert traces == [1]  # loaded from the store, not traced
    assert np.array_equal(again["sum"], first["sum"]) and np.array_equal(again["prod"], x * 3)
    # another shape or another key is another program
    compilation.Jitted(_counting(traces), None, key=("test", 1))(np.arange(5.0), y)
    compilation.Jitted(_counting(traces), None, key=("test", 2))(x, y)
    assert traces == [1, 1, 1] and len(list(store.glob("*.bin"))) == 3


def test_a_broken_stored_program_is_compiled_again(store):
    traces = []
    x = np.arange(3.0)
    compilation.Jitted(_counting(traces), None, key=("broken",))(x, x)
    (path,) = store.glob("*.bin")
    path.write_bytes(b"not an executable")
    compilation._LOADED.cache_clear()
    out = compilation.Jitted(_counting(traces), None, key=("broken",))(x, x)
    assert traces == [1, 1] and np.array_equal(out["prod"], x * x)
    compilation._LOADED.cache_clear()
    compilation.Jitted(_counting(traces), None, key=("broken",))(x, x)  # the file was replaced by a good one
    assert traces == [1, 1]


def test_the_store_keeps_the_most_recent_programs(store, monkeypatch):
    monkeypatch.setattr(compilation, "MAX_PROGRAMS", 2)
    jitted = compilation.Jitted(_counting([]), None, key=("many",))
    for n in (1, 2, 3):
        jitted(np.zeros(n), np.zeros(n))
    assert len(list(store.glob("*.bin"))) == 2


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the option is an XLA:CPU one")
def test_a_stored_program_drops_options_xla_does_not_know(store):
    traces = []
    jitted = compilation.Jitted(_counting(traces), {"xla_no_such_option_anywhere": True}, key=("options",))
    assert np.array_equal(jitted(np.ones(2), np.ones(2))["sum"], [2.0, 2.0]) and len(list(store.glob("*.bin"))) == 1


def test_no_store_without_a_key_or_with_the_cache_off(store, monkeypatch):
    compilation.Jitted(_counting([]), None)(np.zeros(2), np.zeros(2))
    monkeypatch.setenv("PAULIPROP_NO_CACHE", "1")
    compilation.Jitted(_counting([]), None, key=("off",))(np.zeros(2), np.zeros(2))
    assert not store.exists()


def test_clear_caches_releases_loaded_programs(store):
    compilation.Jitted(_counting([]), None, key=("clear",))(np.zeros(2), np.zeros(2))
    assert compilation._LOADED.cache_info() == 1
    jax.clear_caches()
    assert compilation._LOADED.cache_info() == 0


@pytest.mark.parametrize("stored", [True, False])
def test_a_keyed_program_is_ready_once_compiled_here_or_stored(store, monkeypatch, stored):
    """ready(*args) says whether a call would compile: not before the first call, yes after it (from arrays or
    from jax.ShapeDtypeStruct of their shapes), and, once the process released its programs, yes only where
    the store keeps it (a new process with a filled cache), not with the cache off."""
    if not stored:
        monkeypatch.setenv("PAULIPROP_NO_CACHE", "1")
    traces = []
    x, y = np.arange(4.0), np.float64(2.0)
    jitted = compilation.Jitted(_counting(traces), None, key=("ready", stored))
    specs = (jax.ShapeDtypeStruct(x.shape, x.dtype), y)
    assert not jitted.ready(x, y) and not jitted.ready(*specs)
    jitted(x, y)
    assert jitted.ready(x, y) and jitted.ready(*specs) and not jitted.ready(np.arange(5.0), y)
    jax.clear_caches()  # the process releases its programs
    assert jitted.ready(*specs) == stored
    assert not compilation.Jitted(_counting([]), None).ready(x, y)  # without a key: jax.jit's own, never known
