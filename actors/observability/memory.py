"""Giving freed heap back to the operating system after a large, passing allocation.

A scrape of 100,000 jobs' series and a reload of a 100,000-job config each
allocate and free tens of MB. CPython frees them into glibc's heap, which keeps
most of it (RSS stays up: 474 MB against 573 MB after ``malloc_trim`` in
``bench_config_scale --jobs 100000``). ``trim_heap`` asks glibc to return the
free pages; elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


def trim_heap() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
