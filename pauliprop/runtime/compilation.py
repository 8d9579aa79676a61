"""Compiled programs that outlive the process: JAX's persistent compilation cache, on by default.

pauliprop's programs depend on the shapes of a circuit's tables, not on its gates
(propagation/schedule.py), so a second process running the same job finds every program it needs on
disk and compiles nothing.
`enable()` runs when pauliprop is imported. It points JAX's cache at the user's cache directory,
`$XDG_CACHE_HOME/pauliprop/jax` (default `~/.cache/pauliprop/jax`), or at `$PAULIPROP_CACHE_DIR`,
and caches every program (JAX's own default skips programs that compile in under a second, which
are most of ours). It leaves alone a cache that is already configured (`jax_compilation_cache_dir`
or `$JAX_COMPILATION_CACHE_DIR`), and does nothing when `$PAULIPROP_NO_CACHE` is set to a
non-empty value other than 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

NO_CACHE = "PAULIPROP_NO_CACHE"
CACHE_DIR = "PAULIPROP_CACHE_DIR"


def cache_directory() -> Path:
    """Where pauliprop keeps compiled programs (whether or not the cache is on)."""
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pauliprop" / "jax"


def disabled() -> bool:
    return os.environ.get(NO_CACHE, "") not in ("", "0")


def enable() -> str | None:
    """Turn JAX's persistent cache on at cache_directory(); returns the directory in use (None: off)."""
    configured = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if configured:
        return str(configured)
    if disabled():
        return None
    path = cache_directory()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: run without the cache
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)
