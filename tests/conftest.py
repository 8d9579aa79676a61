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
* XLA:CPU compiles the test session's programs fast (TEST_XLA_FLAGS: LLVM at -O0, no fusion emitters,
  pauliprop's propagate.FAST_COMPILE for every program): tests run small buffers, whose programs take
  seconds to optimise and milliseconds to run, and most of them are compiled by plain jax.jit (the
  traced estimator under jax.grad, a test's own jits, the state vector, stabilizer) where pauliprop's
  per-program options do not reach. A program pauliprop compiles with explicit options (large
  buffers: propagate.CPU_COMPILER_OPTIONS) keeps the optimisation level they set. The flags go into
  XLA_FLAGS before JAX starts its backend, so the subprocesses the tests start compile fast too;
  flags this jaxlib does not know (XLA aborts on an unknown flag) are left out.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PAULIPROP_NO_CACHE", "1")  # before pauliprop is imported

# A 6-qubit circuit's value_and_grad (6 programs, tests/pauliprop/propagation/test_adjoint.py's layered
# case): 10.7 s of CPU time compiled with XLA's defaults, 7.5 s with -O0 alone, 3.7 s with both flags.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
_KNOWN_FLAGS = "PAULIPROP_TEST_XLA_FLAGS"  # the flags a session's first process found known, for its workers


def _known_xla_flags(flags) -> list[str]:
    """The flags this jaxlib's XLA takes, tried in a subprocess (an unknown one aborts it): all at once,
    else one at a time."""
    import subprocess
    import sys

    def takes(some) -> bool:
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""), *some]))
        probe = "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0

    if not flags or takes(flags):
        return list(flags)
    return [f for f in flags if takes([f])]


def _fast_test_compiles():
    if _KNOWN_FLAGS not in os.environ:  # the session's first process (pytest-xdist's workers inherit it)
        wanted = [f for f in TEST_XLA_FLAGS if f.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]
        os.environ[_KNOWN_FLAGS] = " ".join(_known_xla_flags(wanted))
    add = [f for f in os.environ[_KNOWN_FLAGS].split() if f not in os.environ.get("XLA_FLAGS", "")]
    if add:
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *add]).strip()


_fast_test_compiles()  # before JAX starts its backend

import jax
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """The run's compilation cache: <basetemp>/jax-cache (the workers' common parent under xdist)."""
    base = config._tmp_path_factory.getbasetemp()
    common = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    folder = common / "jax-cache"
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
