"""How much memory the default device has, and how much of it is free: the budgets that size
reverse-mode records, state vectors and the Pauli engine's buffers, read when a computation is
planned; and the host's cores this process may use (its threads)."""

from __future__ import annotations

import os

from . import devices


def _stats() -> dict:
    try:
        return devices.device().memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory stats (CPU)
        return {}


def device_memory_bytes() -> int:
    """The default device's memory: its allocator's limit on GPUs, the machine's physical memory on
    CPUs (and other backends without memory statistics)."""
    limit = _stats().get("bytes_limit")
    if not limit:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(limit)


def available_bytes(platform: str | None = None) -> int:
    """Memory a new buffer can take now: the allocator's limit less what it holds (GPUs), or the
    kernel's MemAvailable (CPUs; the physical memory where /proc/meminfo is missing). platform "cpu":
    the host's, whatever the default device (the native engine's numpy buffers on a GPU machine)."""
    stats = _stats() if platform != "cpu" else {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if platform == "cpu" else device_memory_bytes()


def cores() -> int:
    """The cores this process may run on (its affinity mask; all of the machine's where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
