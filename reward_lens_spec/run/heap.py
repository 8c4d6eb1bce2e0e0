"""The C library's free heap memory given back to the system between a run's phases (issue 40 item 5).

A streamed run's chunks free what they allocated, but glibc keeps the freed memory in its heaps (resident, between
live blocks), and the completion's passes over the stored outputs then grow the process past it
(benchmarks/results.md §39). ``trim_heap`` is glibc's ``malloc_trim(0)``, what dask.distributed calls in its
workers; elsewhere (macOS, musl without the symbol) it does nothing.
"""
from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):       # no glibc: no such function
        return None


def trim_heap() -> bool:
    """Return the free pages of every glibc heap to the system (``malloc_trim(0)``). Returns True when glibc
    was asked (whether or not it had pages to return), False where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
