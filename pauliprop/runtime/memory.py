"""How much memory the default device has, and how much of it is free: the budgets that size
reverse-mode records, state vectors and the Pauli engine's buffers, read when a computation is
planned; the host's cores this process may use (its threads); and the host allocator's setting that
lets a CPU program reuse its pages from call to call."""

from __future__ import annotations

import ctypes
import os
import platform

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


KEEP_HOST_MEMORY = "PAULIPROP_KEEP_HOST_MEMORY"  # environment: "0" leaves the host's allocator as it is
KEEP_ABOVE = 64 << 20  # bytes of a CPU program's temporaries from which keep_freed_host_memory pays
_KEPT: list = []  # the setting's outcome, once set


def keep_freed_host_memory() -> bool:
    """Have glibc's malloc serve large blocks from its heap and keep there what is freed, so a program
    run again reuses the pages it touched before instead of faulting fresh ones in.

    Why: XLA:CPU allocates a program's temporaries at every call, and glibc maps a block above 32 MiB
    afresh and unmaps it when freed, so every call faults every page in again, at 4 KiB a fault (the
    kicked Ising's gradient at 8 steps, 450 MB of records, on the 2-core CPU: about 0.1 s of a 0.45 s
    call). Sets M_MMAP_MAX = 0 and M_TRIM_THRESHOLD = 2 GiB for this process, once: its memory then
    stays near its peak while it lives, as with tcmalloc or jemalloc. Where glibc is not the C library,
    or with PAULIPROP_KEEP_HOST_MEMORY=0, nothing changes. True where the setting holds."""
    if _KEPT:
        return _KEPT[0]
    ok = False
    if os.environ.get(KEEP_HOST_MEMORY, "1") != "0" and platform.libc_ver()[0] == "glibc":
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is not None:
            m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
            ok = bool(mallopt(m_trim_threshold, ctypes.c_int((1 << 31) - 1)) and mallopt(m_mmap_max, ctypes.c_int(0)))
    _KEPT.append(ok)
    return ok
