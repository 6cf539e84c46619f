"""Device lists: validated the same way on every backend, so scripts move unchanged to GPU hosts.

The rule: ``--device`` picks the device kind (``cpu`` or ``cuda``; ``auto`` =
the engine backend's natural one: cpu for onnxruntime engines, cuda for
tensorrt and tensorrt_rtx engines), and the device ids of TensorRT-LLM's lists (``[0]``,
``[1]``) are indices among the devices of that kind. The CPU is one device,
``0``.
"""

from __future__ import annotations

import os

from .backends import available_devices, natural_kind
from .backends.base import DEVICE_KINDS, Placement
from .engine_format import EngineDir
from .errors import DeviceError


def device_kind(engine: EngineDir, device: str = "auto") -> str:
    if device == "auto":
        return natural_kind(engine.config.build.backend)
    if device not in DEVICE_KINDS:
        raise DeviceError(f"unknown device {device!r}; expected auto, {' or '.join(DEVICE_KINDS)}.")
    return device


def placement(devices: list[int], engine: EngineDir, role: str, device: str = "auto", num_threads: int | None = None) -> Placement:
    """Check a device list against the engine and the host; the Placement of its first device."""
    check_num_threads(num_threads, "--num_threads" if role == "target" else f"--{role}_num_threads")
    kind = device_kind(engine, device)
    build = engine.config.build
    if len(devices) != build.tp_size:
        raise DeviceError(
            f"the {role} device list {devices} names {len(devices)} device(s), but the {role} engine {engine.path} "
            f"was built with tp_size={build.tp_size}: give exactly {build.tp_size} device id(s), e.g. [0]."
        )
    have = available_devices(engine, kind)
    for d in devices:
        if d not in have:
            where = "the CPU is device 0" if kind == "cpu" else f"this host has {len(have)} {kind} device(s): {have}"
            raise DeviceError(f"{role} device {d} does not exist ({where}).")
    return Placement(kind, devices[0], num_threads)


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
