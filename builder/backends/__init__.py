"""Backends compile the one ONNX network into what an executor loads."""

from __future__ import annotations

from ...runtime.errors import BuildConfigError

BACKENDS = ("auto", "onnxruntime", "tensorrt", "tensorrt_rtx")


def resolve_backend(name: str, say=print) -> str:
    """``auto`` -> the best backend this machine can build for."""
    if name not in BACKENDS:
        raise BuildConfigError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}.")
    if name == "tensorrt_rtx":
        from .tensorrt_rtx import tensorrt_rtx_available

        ok, why = tensorrt_rtx_available()
        if not ok:
            raise BuildConfigError(f"--backend tensorrt_rtx cannot build on this host: {why}")
        return name
    if name in ("tensorrt", "auto"):
        from .tensorrt import tensorrt_available

        ok, why = tensorrt_available()
        if name == "tensorrt" and not ok:
            raise BuildConfigError(f"--backend tensorrt cannot build on this host: {why} Use --backend onnxruntime, which runs the same network on CPU.")
        if name == "auto":
            # The TensorRT path has not been verified on a GPU yet (docs/tensorrt.md): never pick it silently.
            note = "TensorRT can build here: pass --backend tensorrt to use it (not yet verified on a GPU)" if ok else "no TensorRT on this host"
            say(f"backend: auto -> onnxruntime ({note})")
            return "onnxruntime"
    return name
