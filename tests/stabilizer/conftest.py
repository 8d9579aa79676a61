"""Stabilizer tests compile without the session's persistent compilation cache (tests/conftest.py).

Their programs rarely repeat across tests, so the cache gains them little. In a full CI run (jax
0.10.2, CPU) writing one of their executables to the cache crashed the interpreter (a segfault in
jax's compilation_cache.put_executable_and_time, 2026-11-22), so they do not write to it.
"""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def _no_persistent_cache_writes():
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
