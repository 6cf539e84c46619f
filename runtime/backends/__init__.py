"""The backends: which module runs an engine of a given backend on a given device kind.

    runtime/backends/
      base.py                the Executor and Backend protocols, Placement, the checks before every call
      onnxruntime/cpu.py     OrtExecutor: ONNX Runtime on the CPU (numpy KV buffers)
      onnxruntime/cuda.py    CudaExecutor: ONNX Runtime's CUDA provider (device KV slabs, CUDA graphs); cuda_host.py
      tensorrt/executor.py   TrtExecutor: a TensorRT plan on one GPU; host.py picks the TensorRT runtime
      tensorrt_rtx/executor.py  RtxExecutor: a TensorRT-for-RTX engine (EPContext model) on one RTX GPU; host.py checks driver, SM, provider
      torch/cpu.py, cuda.py  TorchExecutor (torch/executor.py): specdec's forward in torch; Triton kernels and CUDA graphs on a GPU

The registry names each backend by module path and imports it only when an
engine asks for it (``open_executor``, ``available_devices``,
``check_placement``), so a host without TensorRT or CUDA never imports their
code, and adding a backend is one module plus one line here. A backend module
implements ``base.Backend``: ``make_executor``, ``device_count``,
``check_placement``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import cast

from ...formats.engine_format import EngineDir
from ...formats.errors import DeviceError, EngineError
from .base import DEVICE_KINDS, Backend, Executor, Placement

# (engine backend, device kind) -> the module that runs it
_REGISTRY: dict[tuple[str, str], str] = {
    ("onnxruntime", "cpu"): f"{__name__}.onnxruntime.cpu",
    ("onnxruntime", "cuda"): f"{__name__}.onnxruntime.cuda",
    ("tensorrt", "cuda"): f"{__name__}.tensorrt.executor",
    ("tensorrt_rtx", "cuda"): f"{__name__}.tensorrt_rtx.executor",
    ("torch", "cpu"): f"{__name__}.torch.cpu",
    ("torch", "cuda"): f"{__name__}.torch.cuda",
}
# the device kind an engine of this backend runs on with --device auto
_NATURAL_KIND: dict[str, str] = {"onnxruntime": "cpu", "tensorrt": "cuda", "tensorrt_rtx": "cuda", "torch": "cuda"}


def register_backend(backend: str, kind: str, module: str, natural: bool = False) -> None:
    """Make ``module`` (a dotted path, implementing ``base.Backend``) run ``backend`` engines on ``kind`` devices.

    ``natural``: ``--device auto`` picks ``kind`` for this backend's engines.
    """
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {DEVICE_KINDS}")
    _REGISTRY[(backend, kind)] = module
    if natural or backend not in _NATURAL_KIND:
        _NATURAL_KIND[backend] = kind


def device_kinds(backend: str) -> list[str]:
    """The device kinds that have an executor for ``backend`` engines."""
    return [k for b, k in _REGISTRY if b == backend]


def natural_kind(backend: str) -> str:
    """The device kind ``--device auto`` means for ``backend`` engines (cpu for a backend nobody registered)."""
    return _NATURAL_KIND.get(backend, "cpu")


def backend_for(engine: EngineDir, kind: str) -> Backend:
    """The backend module that runs ``engine`` on ``kind`` devices, imported now."""
    backend = engine.config.build.backend
    module = _REGISTRY.get((backend, kind))
    if module is None:
        kinds = device_kinds(backend)
        if not kinds:
            raise EngineError(f"{engine.path} was built for backend {backend!r}, which has no executor in this version.")
        raise DeviceError(f"a {backend} engine ({engine.path}) cannot run on device {kind!r}; it runs on: {', '.join(kinds)}.")
    return cast(Backend, importlib.import_module(module))


def available_devices(engine: EngineDir, kind: str) -> list[int]:
    """Indices of the ``kind`` devices this host has for ``engine``'s backend."""
    return list(range(backend_for(engine, kind).device_count()))


def placement_groups(placed: Sequence[tuple[EngineDir, Placement]]) -> dict[tuple[str, str], list[tuple[EngineDir, int]]]:
    """The engines each backend is asked about: (backend, kind) -> [(engine, device index)], in the order given."""
    groups: dict[tuple[str, str], list[tuple[EngineDir, int]]] = {}
    for engine, where in placed:
        groups.setdefault((engine.config.build.backend, where.kind), []).append((engine, where.index))
    return groups


def check_placement(placed: Sequence[tuple[EngineDir, Placement]]) -> None:
    """Let each backend refuse, with its numbers, engines that cannot share their devices, before any is opened."""
    for (_, kind), items in placement_groups(placed).items():
        engines = [e for e, _ in items]
        backend_for(engines[0], kind).check_placement(engines, [d for _, d in items])


def open_executor(engine: EngineDir, placement: Placement = Placement()) -> Executor:
    """The registered executor for the engine's backend on ``placement``."""
    return backend_for(engine, placement.kind).make_executor(engine, placement)


__all__ = ["Backend", "Executor", "Placement", "available_devices", "backend_for", "check_placement", "device_kinds",
           "natural_kind", "open_executor", "placement_groups", "register_backend"]
