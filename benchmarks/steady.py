"""A steady C allocator for the suites that time steps on the CPU.

With glibc's defaults a step of this project's small language models spent
0-92 ms of its 205 ms in page faults, in multiples of one 32 MB buffer (the
logits, the head's weight gradient): malloc hands a freed block that size
back to the kernel (``mmap``, or trimming the heap's top) and the next step
faults it in again, so a step's time varied more from step to step than most
plans cost. A GPU's caching allocator keeps what it frees; so does glibc once
told (``mallopt``): that is what the timing suites run under, every side of a
comparison alike, and their pages say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["steady_allocator"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_ONE_GIB = 1 << 30


def steady_allocator() -> str:
    """Keep glibc's malloc from handing freed memory back (no trimming; no ``mmap`` below 1 GiB) for the rest of
    the process; returns what a page says about its allocator."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_TRIM_THRESHOLD, _ONE_GIB) == 1 and libc.mallopt(_M_MMAP_THRESHOLD, _ONE_GIB) == 1
    except (OSError, AttributeError):
        ok = False
    return ("glibc malloc keeps what it frees (M_TRIM_THRESHOLD and M_MMAP_THRESHOLD at 1 GiB, "
            "benchmarks/steady.py)" if ok else "the C library's allocator as it is (mallopt unavailable)")
