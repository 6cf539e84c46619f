"""What the ONNX Runtime CUDA executor needs from the host: the CUDA provider, the GPUs, raw copies.

* ``require_cuda_provider()``: onnxruntime with ``CUDAExecutionProvider``
  (the ``onnxruntime-gpu`` package), or a one-line DeviceError saying what to
  install.
* ``Cudart``: the few CUDA runtime calls ONNX Runtime's Python API lacks
  (device count, memset, 1-D/2-D device copies), through ``ctypes`` on the
  ``libcudart`` that onnxruntime-gpu itself loads: no torch, no cuda-python,
  no cupy.

Nothing here imports onnxruntime or loads CUDA at module level, so this
module imports (and its refusals are tested) on any host.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from functools import lru_cache
from typing import Any

from ....formats.errors import DeviceError

# The CPU and GPU wheels install the same `onnxruntime` module and specdec depends on the CPU one:
# the GPU wheel must be written last.
GPU_EXTRA_HINT = "pip install 'specdec[gpu]' && pip install --force-reinstall --no-deps onnxruntime-gpu"
CUDA_PROVIDER = "CUDAExecutionProvider"

H2D, D2H, D2D = 1, 2, 3  # cudaMemcpyKind


def require_cuda_provider(what: str) -> Any:
    """onnxruntime, if it has the CUDA execution provider; else a DeviceError naming ``what``."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise DeviceError(f"{what} needs onnxruntime-gpu, which is not importable ({err}): {GPU_EXTRA_HINT}.") from err
    providers = ort.get_available_providers()
    if CUDA_PROVIDER not in providers:
        raise DeviceError(
            f"{what} needs ONNX Runtime's {CUDA_PROVIDER}, but the installed onnxruntime {ort.__version__} "
            f"has only {', '.join(providers)}: {GPU_EXTRA_HINT}."
        )
    return ort


def _cuda_major() -> str:
    try:
        from onnxruntime.capi import build_and_package_info as info

        return str(getattr(info, "cuda_version", "") or "").split(".")[0]
    except Exception:
        return ""


def _library_candidates(major: str) -> list[str]:
    names = [f"libcudart.so.{major}"] if major else []
    names.append("libcudart.so")
    # pip-installed CUDA runtimes (nvidia-cuda-runtime-cu12 / cu13): site-packages/nvidia/**/lib
    pattern = f"libcudart.so.{major}*" if major else "libcudart.so.*"
    for root in sys.path:
        names += sorted(glob.glob(os.path.join(root, "nvidia", "**", "lib", pattern), recursive=True))
    return names


class Cudart:
    """ctypes bindings of the CUDA runtime calls the executor needs; every failure is a DeviceError."""

    def __init__(self, library: str | None = None) -> None:
        """library: a libcudart to use (the TensorRT-RTX provider's own); default: the one onnxruntime-gpu uses."""
        major = _cuda_major()
        try:  # onnxruntime-gpu's own loader for pip-installed CUDA libraries (harmless if already loaded)
            import onnxruntime as ort

            if hasattr(ort, "preload_dlls"):
                ort.preload_dlls(cuda=True, cudnn=False, msvc=False)
        except Exception:
            pass
        errors = []
        for name in [library] if library else _library_candidates(major):
            try:
                self._lib = ctypes.CDLL(name)
                break
            except OSError as err:
                errors.append(str(err))
        else:
            raise DeviceError(
                f"cannot load the CUDA {major or ''} runtime library libcudart ({'; '.join(errors[:2])}): install the CUDA runtime that "
                f"onnxruntime-gpu was built for (pip install nvidia-cuda-runtime-cu{major or '12'}) or add it to LD_LIBRARY_PATH."
            )
        lib, vp, sz, i = self._lib, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(i)]
        lib.cudaSetDevice.argtypes = [i]
        lib.cudaMemset.argtypes = [vp, i, sz]
        lib.cudaMemcpy.argtypes = [vp, vp, sz, i]
        lib.cudaMemcpy2D.argtypes = [vp, sz, vp, sz, sz, sz, i]
        lib.cudaDeviceSynchronize.argtypes = []

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise DeviceError(f"CUDA {what} failed: error {code} ({self._lib.cudaGetErrorString(code).decode()}).")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        code = self._lib.cudaGetDeviceCount(ctypes.byref(n))
        return int(n.value) if code == 0 else 0  # no driver / no device: CUDA says so with an error code

    def set_device(self, device: int) -> None:
        self._check(self._lib.cudaSetDevice(device), f"cudaSetDevice({device})")

    def memset(self, ptr: int, nbytes: int) -> None:
        self._check(self._lib.cudaMemset(ptr, 0, nbytes), "cudaMemset")

    def copy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        self._check(self._lib.cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy")

    def synchronize(self) -> None:
        """Wait for all work on the current device (a device-to-device cudaMemcpy may return before it is done)."""
        self._check(self._lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def copy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
        """``height`` rows of ``width`` bytes, device to device (pitches in bytes)."""
        self._check(self._lib.cudaMemcpy2D(dst, dpitch, src, spitch, width, height, D2D), "cudaMemcpy2D")


@lru_cache(maxsize=1)
def cudart() -> Cudart:
    return Cudart()


def cuda_gpu_count() -> int:
    """GPUs CUDA sees; 0 when the CUDA runtime or a driver is missing (the caller words the error)."""
    try:
        return cudart().device_count()
    except DeviceError:
        return 0


def visible_cuda_gpus(what: str) -> int:
    """GPUs ONNX Runtime's CUDA provider can use; a one-line DeviceError when there is no provider or no GPU."""
    require_cuda_provider(what)
    count = cuda_gpu_count()
    if count == 0:
        raise DeviceError(f"{what} needs an NVIDIA GPU, but CUDA sees none (cudaGetDeviceCount): install the NVIDIA driver and check "
                          "CUDA_VISIBLE_DEVICES.")
    return count


def require_gpu(device: int, what: str) -> None:
    """``device`` must be one of the GPUs CUDA sees; a one-line DeviceError otherwise."""
    count = cuda_gpu_count()
    if count == 0:
        raise DeviceError(f"{what} asks for GPU {device}, but CUDA sees no GPU (cudaGetDeviceCount): install the NVIDIA driver and check "
                          "CUDA_VISIBLE_DEVICES.")
    if not 0 <= device < count:
        raise DeviceError(f"{what} asks for GPU {device}, but this host has {count} GPU(s): use an index from 0 to {count - 1} (CUDA_VISIBLE_DEVICES "
                          "renumbers them).")
