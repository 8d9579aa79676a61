"""How much memory the default device has: the budget for reverse-mode records and the limit on
state-vector sizes, read when a computation is planned."""

from __future__ import annotations

import os

import jax


def device_memory_bytes() -> int:
    """The default device's memory: its allocator's limit on GPUs, the machine's physical memory on
    CPUs (and other backends without memory statistics)."""
    limit = None
    try:
        limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001 - backends without memory stats (CPU)
        limit = None
    if not limit:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(limit)
