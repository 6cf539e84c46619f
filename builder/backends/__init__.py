"""Backends compile the one ONNX network into what an executor loads."""

from __future__ import annotations

from ...runtime.errors import BuildConfigError

BACKENDS = ("auto", "onnxruntime", "tensorrt")


def resolve_backend(name: str, say=print) -> str:
    """``auto`` -> the best backend this machine can build for."""
    if name not in BACKENDS:
        raise BuildConfigError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}.")
    if name == "tensorrt":
        raise BuildConfigError(
            "--backend tensorrt is not available in this version of specdec: the TensorRT backend is not implemented yet "
            "(see docs/tensorrt.md). Use --backend onnxruntime, which runs the same network on CPU."
        )
    if name == "auto":
        say("backend: auto -> onnxruntime (the TensorRT backend is not implemented yet)")
        return "onnxruntime"
    return name
