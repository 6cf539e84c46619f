"""Backends compile the one ONNX network into what an executor loads."""

from __future__ import annotations

from ...runtime.errors import BuildConfigError

BACKENDS = ("auto", "onnxruntime", "tensorrt")


def resolve_backend(name: str, say=print) -> str:
    """``auto`` -> the best backend this machine can build for."""
    if name not in BACKENDS:
        raise BuildConfigError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}.")
    if name in ("tensorrt", "auto"):
        from .tensorrt import tensorrt_available

        ok, why = tensorrt_available()
        if name == "tensorrt" and not ok:
            raise BuildConfigError(f"--backend tensorrt cannot build on this host: {why} Use --backend onnxruntime, which runs the same network on CPU.")
        if name == "auto":
            say(f"backend: auto -> {'tensorrt' if ok else 'onnxruntime'}" + ("" if ok else f" ({why})"))
            return "tensorrt" if ok else "onnxruntime"
    return name
