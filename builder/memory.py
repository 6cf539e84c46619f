"""Process memory settings for the builder's big numpy arrays."""

from __future__ import annotations

import ctypes
import sys

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def reuse_freed_memory() -> bool:
    """Keep the memory of freed large arrays for the next ones (Linux, glibc), instead of returning it to the kernel.

    A build allocates and frees a few temporaries of every weight's size (widen, cast, transpose, quantize). By
    default glibc serves each from a fresh mmap and unmaps it on free, so every temporary's pages fault in again:
    on a 400M-parameter int4 build that was 7 s of kernel time in 12 s of CPU (19 s instead of 49 s wall with this;
    the peak memory stays the same). Returns whether the settings took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)  # arrays under 1 GiB come from the heap
        return bool(ok and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))  # and stay there when freed
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): keep the defaults
        return False
