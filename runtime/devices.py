"""Device lists: validated the same way on every backend, so scripts move unchanged to GPU hosts."""

from __future__ import annotations

from .engine_format import EngineDir
from .errors import DeviceError


def available_devices(backend: str) -> list[int]:
    if backend == "onnxruntime":
        return [0]  # the one CPU device
    if backend == "tensorrt":
        from .trt_host import visible_gpu_count

        return list(range(visible_gpu_count("a tensorrt engine")))
    raise DeviceError(f"backend {backend!r} has no executor in this version of specdec.")


def validate_devices(devices: list[int], engine: EngineDir, role: str) -> None:
    build = engine.config.build
    if len(devices) != build.tp_size:
        raise DeviceError(
            f"the {role} device list {devices} names {len(devices)} device(s), but the {role} engine {engine.path} "
            f"was built with tp_size={build.tp_size}: give exactly {build.tp_size} device id(s), e.g. [0]."
        )
    have = available_devices(build.backend)
    for d in devices:
        if d not in have:
            where = "the onnxruntime backend runs on the CPU, which is device 0" if build.backend == "onnxruntime" else f"available: {have}"
            raise DeviceError(f"{role} device {d} does not exist ({where}).")
