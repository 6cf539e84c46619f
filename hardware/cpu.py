"""This machine's CPUs and memory: what the builder, the trainer and the runtime each check before they start."""

from __future__ import annotations

import os

from ..formats.errors import DeviceError


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_num_threads(num_threads: int | None, flag: str = "--num_threads") -> None:
    """None (the default) or 1 .. the usable CPUs: more ONNX Runtime threads than CPUs spin waiting on each other
    (300 threads on 2 CPUs decoded 35x slower), and a C int cannot hold an absurd count at all."""
    if num_threads is None:
        return
    cpus = usable_cpus()
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or not 1 <= num_threads <= cpus:
        raise DeviceError(f"{flag} {num_threads}: expected a number of threads from 1 to {cpus}, the CPUs this process may use "
                          "(more threads than CPUs only wait on each other).")


def physical_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None
