"""What a host can run: which TensorRT runtime module, which plans, which GPU.

TensorRT ships three runtimes, each its own Python module and PyPI package:

| module              | pip package (extra)                          | runs                                                            |
|---------------------|----------------------------------------------|-----------------------------------------------------------------|
| `tensorrt`          | tensorrt (`specdec[tensorrt]`), also builds  | plans of its own version; version-compatible plans of an older  |
|                     |                                              | TensorRT of a supported major, through their embedded runtime   |
| `tensorrt_dispatch` | tensorrt-dispatch (`specdec[tensorrt-dispatch]`), ~5 MB | version-compatible plans that embed their lean runtime, same major |
| `tensorrt_lean`     | tensorrt-lean (`specdec[tensorrt-lean]`)     | version-compatible plans of exactly its own version             |

"Version-compatible" is ``--trt_version_compatible`` at build time
(BuilderFlag.VERSION_COMPATIBLE); it embeds the lean runtime in the plan
unless the plan was built with EXCLUDE_LEAN_RUNTIME, and then only a
runtime of the builder's exact version can run it. The rules come from
TensorRT's "Version Compatibility" docs and the ``Runtime.load_runtime``
docstring; they are decided here, before TensorRT sees the plan, because a
refused plan is a clearer error than TensorRT's log, and because TensorRT
crashes (SIGSEGV, seen with tensorrt_lean 11.4 on a host without a driver)
where a check could have said "no GPU".

Nothing here imports ``tensorrt`` or ``cuda`` at module level.

Status: these rules are tested with the real runtime modules on GPU-less
hosts; they have never loaded a plan on a GPU (docs/tensorrt.md).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ..formats.errors import DeviceError, EngineError

# Preference order: the full runtime runs the most plans; dispatch beats lean
# because it follows the plan's embedded runtime across versions.
RUNTIME_MODULES = ("tensorrt", "tensorrt_dispatch", "tensorrt_lean")
RUNTIME_ENV = "SPECDEC_TENSORRT_RUNTIME"
MIN_TENSORRT = (10, 15)  # TensorScatter -> IKVCacheUpdateLayer in the ONNX parser
# Cross-major pairs that version-compatible plans support (TensorRT "Engine Compatibility" docs).
CROSS_MAJOR_VC = {(8, 10), (10, 11)}
CUDA_PYTHON_HINT = "pip install \"cuda-python>=12.6\" (its major must match the driver's CUDA: 12.x for r535+, 13.x for r580+)"


# -- cuda-python (cudart) ------------------------------------------------------------
def cudart_module() -> Any:
    """cuda-python's runtime bindings: ``cuda.bindings.runtime`` (12.6+), else the older ``cuda.cudart``."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[no-redef]
        except ImportError as err:
            raise DeviceError(f"cuda-python is not importable ({err}): {CUDA_PYTHON_HINT}.") from err
    return runtime


def cuda_call(result: tuple, what: str) -> Any:
    """cuda-python returns ``(err, *values)``: raise on err, return the value(s)."""
    err, rest = result[0], result[1:]
    if int(err) != 0:
        desc = cudart_module().cudaGetErrorString(err)[1]
        desc = desc.decode() if isinstance(desc, bytes) else str(desc)
        raise DeviceError(f"CUDA {what} failed: {getattr(err, 'name', err)} ({desc}).")
    return rest[0] if len(rest) == 1 else (rest or None)


def cuda_device_count() -> int:
    """GPUs visible to CUDA (cudaGetDeviceCount); 0 when cuda-python or a driver is missing."""
    try:
        err, count = cudart_module().cudaGetDeviceCount()
    except Exception:  # DeviceError without cuda-python, or a loader error without a driver
        return 0
    return int(count) if int(err) == 0 and count else 0


def cuda_device_info(device: int) -> tuple[str, str]:
    """(GPU name, compute capability as ``sm_90``) from cudaGetDeviceProperties."""
    prop = cuda_call(cudart_module().cudaGetDeviceProperties(device), f"cudaGetDeviceProperties({device})")
    name = prop.name.split(b"\0", 1)[0].decode() if isinstance(prop.name, bytes) else str(prop.name)
    return name, f"sm_{prop.major}{prop.minor}"


def visible_gpu_count(what: str) -> int:
    """GPUs CUDA sees; a one-line DeviceError naming ``what`` when there are none."""
    count = cuda_device_count()
    if count == 0:
        cudart_module()  # a missing cuda-python says so itself
        raise DeviceError(f"{what} needs an NVIDIA GPU, but CUDA sees none (cudaGetDeviceCount): install the NVIDIA driver and check "
                          "CUDA_VISIBLE_DEVICES.")
    return count


def require_gpu(device: int, what: str) -> None:
    """Refuse, in one line, before TensorRT touches a GPU that is not there."""
    count = visible_gpu_count(what)
    if not 0 <= device < count:
        raise DeviceError(f"{what}: GPU {device} does not exist (CUDA sees {count}: {list(range(count))}).")


# -- which plans a runtime can run ---------------------------------------------------
def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())


def build_metadata(meta: Mapping[str, Any], where: str) -> tuple[str, str]:
    """(TensorRT version, compute capability) the plan was built with, from config.json's extra.tensorrt."""
    built, sm = meta.get("tensorrt_version"), meta.get("compute_capability")
    if not built or not sm:
        raise EngineError(f"{where} records no TensorRT build metadata (extra.tensorrt in config.json); rebuild it with --backend tensorrt.")
    return str(built), str(sm)


def version_problem(meta: Mapping[str, Any], module: str, host: str) -> str | None:
    """Why runtime ``module`` at version ``host`` cannot run the plan described by ``meta``; None when it can."""
    built = str(meta["tensorrt_version"])
    compatible, excluded = bool(meta.get("version_compatible")), bool(meta.get("exclude_lean_runtime"))
    if module == "tensorrt_lean":
        if not compatible:
            return "the lean runtime runs only version-compatible plans (build with --trt_version_compatible)"
        if host != built:
            return f"the lean runtime runs only plans built by its own version (pip install tensorrt-lean=={built})"
        return None
    if module == "tensorrt" and host == built:
        return None
    if not compatible:
        if module == "tensorrt_dispatch":
            return "the dispatch runtime runs only version-compatible plans (build with --trt_version_compatible)"
        return f"the plan is specific to TensorRT {built} (rebuild on this host, or build with --trt_version_compatible)"
    if excluded:
        return (f"the plan was built without its lean runtime (EXCLUDE_LEAN_RUNTIME), so only TensorRT {built} itself "
                f"or tensorrt-lean=={built} can run it")
    b, h = version_tuple(built), version_tuple(host)
    if h < b:
        return "a version-compatible plan runs only on the same or a newer TensorRT"
    if b[0] != h[0] and (module != "tensorrt" or (b[0], h[0]) not in CROSS_MAJOR_VC):
        # The dispatch library itself says "TensorRT plan major version does not match runtime
        # major version": across majors (10 -> 11) only the full runtime is documented to work.
        return f"across TensorRT majors ({b[0]} -> {h[0]}) a version-compatible plan runs only on the full tensorrt" + (
            "" if (b[0], h[0]) in CROSS_MAJOR_VC else f", and {b[0]} -> {h[0]} is not a supported pair")
    return None


def check_gpu_arch(meta: Mapping[str, Any], host_sm: str, where: str) -> None:
    built, sm = build_metadata(meta, where)
    if sm != host_sm:
        raise EngineError(f"{where} was built with TensorRT {built} for {sm}, but this GPU is {host_sm}: rebuild on this host (a TensorRT plan is "
                          "specific to the GPU architecture it was built on).")


def install_advice(meta: Mapping[str, Any]) -> str:
    """The packages that can run this plan, best first."""
    built = str(meta["tensorrt_version"])
    major = version_tuple(built)[0]
    if not meta.get("version_compatible"):
        return f"tensorrt=={built} (pip install \"specdec[tensorrt]\" \"tensorrt=={built}\")"
    if meta.get("exclude_lean_runtime"):
        return f"tensorrt-lean=={built} (pip install \"specdec[tensorrt-lean]\" \"tensorrt-lean=={built}\") or tensorrt=={built}"
    return (f"the small dispatch runtime (pip install \"specdec[tensorrt-dispatch]\" \"tensorrt-dispatch>={built},<{major + 1}\"), "
            f"tensorrt-lean=={built}, or tensorrt >= {built}")


def import_runtime(meta: Mapping[str, Any], where: str) -> ModuleType:
    """The first installed TensorRT runtime module (full, dispatch, lean) that can run this plan.

    ``SPECDEC_TENSORRT_RUNTIME=tensorrt_dispatch`` (or another module name)
    allows only that one: to try, on a build host, what a shipped host will run.
    """
    built, sm = build_metadata(meta, where)
    forced = os.environ.get(RUNTIME_ENV, "").strip()
    if forced and forced not in RUNTIME_MODULES:
        raise EngineError(f"{RUNTIME_ENV}={forced!r} is not a TensorRT runtime module; use one of {', '.join(RUNTIME_MODULES)}, or unset it.")
    tried: list[str] = []
    for name in (forced,) if forced else RUNTIME_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # ImportError, or OSError when its libnvinfer is missing
            if forced:
                raise EngineError(f"{RUNTIME_ENV}={forced} but `import {forced}` failed ({err}); install {forced.replace('_', '-')}, or unset "
                                  f"{RUNTIME_ENV}.") from err
            continue
        problem = version_problem(meta, name, module.__version__)
        if problem is None:
            return module
        tried.append(f"{name} {module.__version__}: {problem}")
    head = f"{where} is a TensorRT {built} plan for {sm}"
    if not tried:
        raise EngineError(f"{head}, but no TensorRT runtime is importable here (tried {', '.join(RUNTIME_MODULES)}). Install {install_advice(meta)} "
                          "on a GPU host.")
    raise EngineError(f"{head}, and no installed TensorRT runtime can run it ({'; '.join(tried)}). Install {install_advice(meta)}, or rebuild on "
                      "this host.")
