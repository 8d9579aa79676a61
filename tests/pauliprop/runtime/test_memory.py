"""The budgets' memory (pauliprop/runtime/memory.py): the default device's where it reports its allocator (GPUs),
the host's for the host's own buffers (the native engine's numpy arrays) whatever the default device; the host's
allocator keeps freed memory where asked (a program's temporaries reuse their pages from call to call)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

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


FAULTS = r"""
import ctypes, json, resource, sys
from pauliprop.runtime import memory
kept = memory.keep_freed_host_memory() if sys.argv[1] == "keep" else False
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def block():  # 256 MiB malloc'd (as XLA:CPU's temporaries are), touched, freed
    p = libc.malloc(1 << 28)
    ctypes.memset(p, 1, 1 << 28)
    libc.free(p)

block()
before = faults()
block()  # again: the same pages where freed memory is kept, fresh ones (65,536 of 4 KiB) where not
print(json.dumps({"kept": kept, "faults": faults() - before, "again": memory.keep_freed_host_memory()}))
"""


def _faults(mode: str, **env) -> dict:
    env = {**{k: v for k, v in os.environ.items() if k != memory.KEEP_HOST_MEMORY}, **env}
    proc = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's malloc's")
def test_kept_host_memory_reuses_a_freed_blocks_pages_and_is_off_by_the_environment():
    kept, plain = _faults("keep"), _faults("plain")
    assert kept["kept"] and kept["again"]  # set once, and it stays set
    assert kept["faults"] < 2_000 < 30_000 < plain["faults"], (kept, plain)  # 65,536 pages of 4 KiB
    off = _faults("keep", **{memory.KEEP_HOST_MEMORY: "0"})
    assert not off["kept"] and off["faults"] > 30_000
