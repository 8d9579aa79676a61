"""Test-session setup shared by every test package.

* Float64 everywhere: the exactness properties (agreement with the state vector to 1e-10) are stated
  under jax_enable_x64, as DESIGN.md and pauliprop's docstring say.
* A session-local persistent compilation cache: programs that differ only in static metadata (a
  PauliSum's num_qubits is pytree metadata, so every register size retraces) lower to the same HLO
  and then compile once. It lives in a temporary directory removed at the end of the session; an
  explicit JAX_COMPILATION_CACHE_DIR from the environment is respected instead.
* Hypothesis: no deadline (the first example of a property pays for the JAX compile).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)

_CACHE_DIR = None
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _CACHE_DIR = tempfile.mkdtemp(prefix="pauliprop-tests-jax-cache-")
    jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("pauliprop", deadline=None, max_examples=30, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pauliprop"))
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass

REPO_ROOT = Path(__file__).resolve().parents[1]
KICKED_ISING_DIR = REPO_ROOT.parent / "shared" / "data" / "kicked_ising"


def pytest_sessionfinish(session, exitstatus):
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def kicked_ising_dir() -> Path:
    """../shared/data/kicked_ising relative to the repository root; skips the test when absent."""
    if not KICKED_ISING_DIR.is_dir():
        pytest.skip(f"reference data not found at {KICKED_ISING_DIR} (the kicked Ising tables live in "
                    "../shared/data/kicked_ising beside the repository)")
    return KICKED_ISING_DIR
