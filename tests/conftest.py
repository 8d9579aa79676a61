"""Test-session setup shared by every test package.

* Float64 everywhere: the exactness properties (agreement with the state vector to 1e-10) are stated
  under jax_enable_x64, as DESIGN.md and pauliprop's docstring say.
* Compiled executables are released (jax.clear_caches) once the process maps more than half of
  vm.max_map_count memory regions. XLA:CPU maps each kernel of an executable separately (one
  propagation executable: about 2,000 regions), so a session that keeps every executable exhausts
  the default limit of 65,530 after a few dozen programs, and LLVM then fails with "Cannot allocate
  memory" and aborts in whatever compiles next (three CI runs, 2026-11-22/23: in a persistent-cache
  write, a cache read and a sampler compile).
* One persistent compilation cache for the test run, in its temporary folder (shared by the
  pytest-xdist workers and the subprocesses the tests start, through JAX_COMPILATION_CACHE_DIR), so a
  program that several processes need compiles once a run; never the user's cache
  (PAULIPROP_NO_CACHE=1 keeps pauliprop from turning on its default one;
  tests/pauliprop/runtime/test_compilation.py tests that one in subprocesses of its own). An explicit
  JAX_COMPILATION_CACHE_DIR from the environment is kept.
* Hypothesis: no deadline (the first example of a property pays for the JAX compile).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PAULIPROP_NO_CACHE", "1")  # before pauliprop is imported

import jax
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """The run's compilation cache: <basetemp>/jax-cache (the workers' common parent under xdist)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    base = config._tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-cache"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)
    jax.config.update("jax_compilation_cache_dir", str(folder))


@pytest.fixture
def several_rooms(monkeypatch):
    """Buffers of test sizes with several rooms: pauliprop gives a buffer of at most
    engine.ONE_ROOM_CAPACITY slots one room, so tests of the room paths lower that bound."""
    from pauliprop.propagation import engine

    monkeypatch.setattr(engine, "ONE_ROOM_CAPACITY", 256)


try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("pauliprop", deadline=None, max_examples=30, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pauliprop"))
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


def _mapped_regions() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no region count to watch
        return 0


def _map_limit() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


_REGION_BUDGET = _map_limit() // 2


@pytest.fixture(autouse=True)
def _release_executables_under_map_pressure():
    yield
    if _mapped_regions() > _REGION_BUDGET:
        jax.clear_caches()


REPO_ROOT = Path(__file__).resolve().parents[1]
KICKED_ISING_DIR = REPO_ROOT.parent / "shared" / "data" / "kicked_ising"


@pytest.fixture(scope="session")
def kicked_ising_dir() -> Path:
    """../shared/data/kicked_ising relative to the repository root; skips the test when absent."""
    if not KICKED_ISING_DIR.is_dir():
        pytest.skip(f"reference data not found at {KICKED_ISING_DIR} (the kicked Ising tables live in "
                    "../shared/data/kicked_ising beside the repository)")
    return KICKED_ISING_DIR
