"""What a tensorrt_rtx engine needs from the host, checked before anything is loaded.

* the NVIDIA driver: ``libcuda.so.1``, asked through ``ctypes`` for the GPU's
  name and compute capability (no cuda-python, no torch);
* a GPU whose SM the engine was built for (``--target_sm``); TensorRT for RTX
  runs on compute capability 8.6, 8.9 and 12.x only;
* ONNX Runtime's TensorRT-RTX execution provider package, bundling the same
  TensorRT-RTX release that built the engine (an engine loads in no other).

Each failure is one DeviceError line saying what to install or rebuild.
Nothing here is imported or loaded at module level.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from types import ModuleType

from ....formats.engine_format import EngineDir
from ....formats.errors import DeviceError

EP_NAME = "NvTensorRTRTXExecutionProvider"
EP_PACKAGE = "onnxruntime_ep_nv_tensorrt_rtx"
INSTALL_HINT = "pip install 'specdec[tensorrt-rtx]'"
_CC_MAJOR, _CC_MINOR = 75, 76  # CUdevice_attribute: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


def rtx_supported(sm: str) -> bool:
    """Whether TensorRT for RTX runs on this compute capability (the provider's rule: 8.6, 8.9, and 12.0 or newer)."""
    cc = int(sm.removeprefix("sm"))
    return cc in (86, 89) or cc >= 120


class Driver:
    """The CUDA driver API calls the checks need, through ctypes on libcuda.so.1."""

    def __init__(self, what: str) -> None:
        try:
            self._lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise DeviceError(f"{what} needs an NVIDIA RTX GPU and its driver, but the driver library is not loadable ({err}): "
                              "install the NVIDIA driver (the engines were built ahead of time; running them needs the GPU).") from err
        self._call(self._lib.cuInit(0), "cuInit", what)

    def _call(self, code: int, name: str, what: str) -> None:
        if code != 0:
            raise DeviceError(f"{what}: the NVIDIA driver answered {name} with CUDA error {code}: is a GPU visible (nvidia-smi, "
                              "CUDA_VISIBLE_DEVICES)?")

    def count(self) -> int:
        n = ctypes.c_int(0)
        self._call(self._lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount", "counting GPUs")
        return int(n.value)

    def describe(self, device: int) -> tuple[str, str]:
        """(name, "smXY") of GPU ``device``."""
        handle, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        what = f"GPU {device}"
        self._call(self._lib.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet", what)
        self._call(self._lib.cuDeviceGetName(name, len(name), handle), "cuDeviceGetName", what)
        self._call(self._lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, handle), "cuDeviceGetAttribute", what)
        self._call(self._lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, handle), "cuDeviceGetAttribute", what)
        return name.value.decode(errors="replace"), f"sm{major.value}{minor.value}"


def rtx_gpu_count() -> int:
    """GPUs the driver sees; a one-line DeviceError without a driver."""
    return Driver("a tensorrt_rtx engine").count()


def pick_target(engine: EngineDir, gpu: str, sm: str) -> dict[str, str]:
    """The engine's files for this GPU's SM ({network_file, engine_file}); one line when it has none."""
    targets: dict[str, dict[str, str]] = engine.config.extra.get("tensorrt_rtx", {}).get("targets", {})
    if sm in targets:
        return targets[sm]
    built = ", ".join(targets) or "no SM"
    if not rtx_supported(sm):
        raise DeviceError(f"{engine.path}: engine built for {built}; this GPU ({gpu}) is {sm}, which TensorRT for RTX does not support.")
    raise DeviceError(f"{engine.path}: engine built for {built}; this GPU ({gpu}) is {sm}: rebuild with --target_sm {','.join([*targets, sm])}.")


def ep_package() -> ModuleType:
    """The execution provider's Python package; one line naming the extra when it is missing."""
    try:
        import onnxruntime_ep_nv_tensorrt_rtx as pkg
    except Exception as err:  # ImportError, or OSError from its preloads
        raise DeviceError(f"running a tensorrt_rtx engine needs ONNX Runtime's TensorRT-RTX execution provider ({err}): {INSTALL_HINT}.") from err
    return pkg


def bundled_tensorrt_rtx(package_dir: Path) -> str | None:
    """The TensorRT-RTX release the provider package bundles ("1.7.1"), from its library's file name."""
    versions = [m.group(1) for p in package_dir.glob("libtensorrt_rtx.so.*") if (m := re.fullmatch(r"libtensorrt_rtx\.so\.(\d+\.\d+\.\d+)", p.name))]
    return max(versions, key=lambda v: tuple(map(int, v.split("."))), default=None)


def check_release(engine: EngineDir, bundled: str | None) -> None:
    """An engine deserializes only in the TensorRT-RTX release that built it: refuse another one in one line."""
    built = engine.config.extra.get("tensorrt_rtx", {}).get("tensorrt_rtx_version", "")
    if bundled is None or built.split(".")[:3] != bundled.split("."):
        raise DeviceError(f"{engine.path} was built by TensorRT for RTX {built}, but the installed execution provider bundles "
                          f"{bundled or 'no recognisable release'}: install the provider of that release ({INSTALL_HINT}, whose pins move "
                          "together) or rebuild the engine with the installed builder.")


def check_rtx_host(engine: EngineDir, device: int) -> tuple[dict[str, str], ModuleType, Path]:
    """Everything checked before a tensorrt_rtx engine is loaded: (its files for this GPU, the provider package, its directory)."""
    driver = Driver(str(engine.path))
    count = driver.count()
    if not 0 <= device < count:
        raise DeviceError(f"{engine.path} asks for GPU {device}, but the driver sees {count} GPU(s): use an index from 0 to {count - 1}.")
    files = pick_target(engine, *driver.describe(device))
    pkg = ep_package()
    package_dir = Path(pkg.__file__).resolve().parent
    check_release(engine, bundled_tensorrt_rtx(package_dir))
    return files, pkg, package_dir


def preload_bundled_cudart(package_dir: Path) -> Path | None:
    """Load the provider's own CUDA runtime globally, so its NEEDED libcudart.so.13 resolves to it (the wheel
    ships only the versioned file, no soname link); the executor's device copies use the same library."""
    found = sorted(package_dir.glob("libcudart.so.*"))
    if not found:
        return None
    ctypes.CDLL(str(found[-1]), mode=ctypes.RTLD_GLOBAL)
    return found[-1]
