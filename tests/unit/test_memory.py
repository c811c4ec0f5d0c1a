"""Giving freed C heap memory back after a large read (connectors/core/memory.py)."""

from __future__ import annotations

import ctypes

import pytest

from eos_connectors.core import memory


def _resident_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_a_small_read_is_not_trimmed() -> None:
    assert not memory.trim_after(memory.TRIM_MIN_RECORDS - 1)


@pytest.mark.skipif(memory._malloc_trim() is None, reason="not glibc: no malloc_trim")
def test_a_large_read_hands_freed_heap_memory_back() -> None:
    """64 MB freed in small blocks (as librdkafka frees a fetched batch's messages) stays
    resident until the trim."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(16_384)]
    for block in blocks[:-1]:  # the last one keeps the heap's top in use
        ctypes.memset(block, 1, 4096)
        libc.free(block)
    before = _resident_kb()
    assert memory.trim_after(memory.TRIM_MIN_RECORDS)
    assert before - _resident_kb() > 32 * 1024, "less than half of the freed 64 MB went back"
    libc.free(blocks[-1])
