"""Backends compile the one ONNX network into what an executor loads.

    builder/backends/
      base.py          the BuildBackend protocol (what a backend declares and does) and Compiled
      onnxruntime.py   ships model.onnx + model.onnx.data as they are, after ONNX Runtime loads them
      tensorrt.py      compiles the same ONNX into a TensorRT plan (rank0.engine)
      tensorrt_rtx.py  compiles it with TensorRT for RTX, one engine + EPContext model per --target_sm (no GPU needed)
      trt_onnx.py      the ONNX-side work both TensorRT backends share (static cache axis, parsing, profiles)
      torch.py         no graph: the tensors in the layout the torch executor reads (builder/torch_network.py writes them)

The registry names each backend by module path and imports it only when a
build asks for it (or asks every backend a question: what ``auto`` could pick,
whose option a flag is). build.py and validation.py ask the backend, never
its name; adding a backend is a module implementing ``base.BuildBackend`` and
a line here (and its executor in runtime/backends/).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

from ...formats.errors import BuildConfigError
from .base import BuildBackend, Compiled

_REGISTRY: dict[str, str] = {
    "onnxruntime": f"{__name__}.onnxruntime",
    "tensorrt": f"{__name__}.tensorrt",
    "tensorrt_rtx": f"{__name__}.tensorrt_rtx",
    "torch": f"{__name__}.torch",
}
AUTO = "onnxruntime"  # what --backend auto picks: the backend this project verifies (docs/tensorrt.md says why)
BACKENDS = ("auto", *_REGISTRY)


def backend_module(name: str) -> BuildBackend:
    """The module of backend ``name``, imported now."""
    if name not in _REGISTRY:
        raise BuildConfigError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}.")
    return cast(BuildBackend, importlib.import_module(_REGISTRY[name]))


def resolve_backend(name: str, say: Callable[[str], None] = print) -> str:
    """``auto`` -> AUTO, saying what the other backends could do here; a named backend this host cannot build for is refused."""
    if name == "auto":
        notes = [note for other in _REGISTRY if other != AUTO and (note := backend_module(other).auto_note())]
        say(f"backend: auto -> {AUTO}" + (f" ({'; '.join(notes)})" if notes else ""))
        return AUTO
    module = backend_module(name)
    problem = module.host_problem()
    if problem:
        raise BuildConfigError(f"--backend {name} cannot build on this host: {problem}")
    if module.NOTICE:
        say(f"warning: {module.NOTICE}")
    return name


def check_own_options(options: dict[str, Any]) -> None:
    """Let each backend refuse its own given options (build_engine keywords; falsy = not given) that contradict each other,
    whichever backend the build uses: before any work, when the backend may still be auto."""
    given = {k: v for k, v in options.items() if v}
    if not given:
        return
    for name in _REGISTRY:
        module = backend_module(name)
        mine = {k: v for k, v in given.items() if k in module.OPTIONS}
        if mine:
            module.check_options(mine)


def refuse_foreign_options(backend: str, options: dict[str, Any]) -> None:
    """Refuse given options that belong to a backend other than the build's (resolved) one, naming the one that takes them."""
    given = [k for k, v in options.items() if v]
    if not given:
        return
    for name in _REGISTRY:
        module = backend_module(name)
        foreign = [module.OPTIONS[k] for k in given if k in module.OPTIONS]
        if foreign and name != backend:
            verb = "applies" if len(foreign) == 1 else "apply"
            raise BuildConfigError(f"{', '.join(foreign)} only {verb} to --backend {name} (this build uses {backend}).")


__all__ = ["AUTO", "BACKENDS", "BuildBackend", "Compiled", "backend_module", "check_own_options", "refuse_foreign_options", "resolve_backend"]
