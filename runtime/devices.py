"""Device lists: validated the same way on every backend, so scripts move unchanged to GPU hosts.

The rule: ``--device`` picks the device kind (``cpu`` or ``cuda``; ``auto`` =
the engine backend's natural one: cpu for onnxruntime engines, cuda for
tensorrt and tensorrt_rtx engines), and the device ids of TensorRT-LLM's lists (``[0]``,
``[1]``) are indices among the devices of that kind. The CPU is one device,
``0``.
"""

from __future__ import annotations

from ..formats.engine_format import EngineDir
from ..formats.errors import DeviceError
from ..hardware.cpu import check_num_threads
from .backends import available_devices, device_kinds, natural_kind
from .backends.base import DEVICE_KINDS, Placement


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
            # --device auto means the backend's own kind (a GPU for torch engines): say where else the engine runs
            also = ""
            if kind != "cpu" and not have and "cpu" in device_kinds(build.backend):
                also = (f"; a float32 {build.backend} engine runs on the CPU too: pass --device cpu" if build.dtype == "float32" else
                        f"; a {build.backend} engine runs on the CPU in float32 only: rebuild it with --dtype float32, then --device cpu")
            raise DeviceError(f"{role} device {d} does not exist ({where}){also}.")
    return Placement(kind, devices[0], num_threads)
