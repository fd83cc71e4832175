"""Process-level settings for fast CPU training.

XLA:CPU allocates its large temporaries with malloc. glibc serves big requests with fresh
mmap()s and returns freed memory to the OS, so every step page-faults its buffers in again
(measured: ~650k minor faults and ~1 s of kernel time per 41M-class step on 2 cores). Keeping
freed memory in the heap removes that cost.

The settings are the whole process's, so only a process's own entry point applies them, before
the first large allocation (``python train.py``, ``python -m jaxdepth.experiments.depth_sweep``,
a benchmark script); calling ``train.main`` from a notebook or a test worker leaves that
process's allocator as it is (changed mid-life under threads that already hold arenas, it was
suspected in the test workers' crashes).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8


def tune_malloc() -> bool:
    """Keep freed memory for reuse (glibc only); returns whether the settings were applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl): nothing to tune
    ok = mallopt(_M_MMAP_MAX, 0)  # serve big blocks from the heap, not fresh mmaps
    ok &= mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # never give freed heap back to the OS
    ok &= mallopt(_M_TOP_PAD, 1 << 30)  # grow the heap in large steps
    ok &= mallopt(_M_ARENA_MAX, 1)  # one arena: memory freed by one thread is reused by all
    return bool(ok)
