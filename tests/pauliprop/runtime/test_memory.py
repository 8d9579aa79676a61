"""The budgets' memory (pauliprop/runtime/memory.py): the default device's where it reports its allocator (GPUs),
the host's for the host's own buffers (the native engine's numpy arrays) whatever the default device."""

from __future__ import annotations

import os

from pauliprop.runtime import memory


def test_the_host_platform_reads_the_hosts_memory_beside_a_device_that_reports_its_own(monkeypatch):
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setattr(memory, "_stats", lambda: {"bytes_limit": 1 << 50, "bytes_in_use": 1 << 40})
    assert memory.available_bytes() == (1 << 50) - (1 << 40) and memory.device_memory_bytes() == 1 << 50
    assert 0 < memory.available_bytes("cpu") <= physical


def test_a_device_without_allocator_statistics_reads_the_hosts_memory(monkeypatch):
    monkeypatch.setattr(memory, "_stats", lambda: {})
    # both MemAvailable (which moves between two reads)
    assert memory.available_bytes() > 0 and abs(memory.available_bytes() - memory.available_bytes("cpu")) < 1 << 30
    assert memory.device_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
