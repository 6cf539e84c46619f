"""The onnxruntime backend: the network ships as it was written, ``model.onnx`` + ``model.onnx.data``.

Its engines run on ONNX Runtime: on the CPU (lowerings ``ort_cpu``, the default,
and ``portable``) or on its CUDA provider (lowering ``ort_cuda``, docs/gpu.md).
Compiling is checking: ONNX Runtime on the CPU opens the network once, so an
engine that cannot be loaded fails at build time, not on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...formats.engine_format import BuildConfig, ModelConfig
from ...formats.errors import BuildConfigError
from .base import Compiled

TITLE = "ONNX Runtime"
DEVICE = "cpu"  # ort_cuda's graphs run on the CUDA provider: the lowering says so (validation.memory_bound)
DEFAULT_LOWERING = "ort_cpu"
LOWERINGS = ("ort_cpu", "portable", "ort_cuda")
TREE_ATTENTION = True
NETWORK = "onnx"
KV_LAYOUT = None  # the lowering's
OPTIONS: dict[str, str] = {}
NOTICE = None


def host_problem() -> str | None:
    return None  # onnx and onnxruntime are the build extra's own dependencies


def auto_note() -> str | None:
    return None


def check_options(options: dict[str, Any]) -> None:
    pass


def refusals(build: BuildConfig) -> list[str]:
    return []


def check_build(build: BuildConfig, options: dict[str, Any]) -> None:
    pass


def compile_engine(out_dir: Path, network_file: str, build: BuildConfig, model: ModelConfig, options: dict[str, Any],
            say: Callable[[str], None]) -> Compiled:
    """Open the network under ONNX Runtime on the CPU; a half-precision graph (ort_cuda), which the CPU provider has no
    kernels for, gets the ONNX checker instead."""
    from ...plugins import get_lowering

    library = None
    if build.cpu_kernels == "specdec":  # the op's library: compiled into this user's cache, never into the engine
        from ...hardware.cpu_kernels import KernelBuildError, kernel_library, kernel_name

        try:
            library = kernel_library()
        except KernelBuildError as err:
            raise BuildConfigError(str(err)) from None
        name = kernel_name(library)
        say(f"compiled specdec's int4/int8 CPU kernels ({name}" + ("" if name == "AVX-512 VNNI" else
            ": this CPU has no AVX-512 VNNI, so it is slower here; a CPU that has runs the fast kernel, with the same bits") + ")")
    if get_lowering(build.lowering).compute_dtype(build) == "float32":
        check_loads(out_dir / network_file, library)
    else:
        check_graph(out_dir / network_file)
    return Compiled(network_file)


def check_loads(path: Path, kernels: Path | None = None) -> None:
    """Create one ONNX Runtime session: a build that cannot be loaded fails here, not on the host."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if kernels is not None:
        opts.register_custom_ops_library(str(kernels))
    try:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped errors
        raise BuildConfigError(f"ONNX Runtime {ort.__version__} cannot load the built network: {err}") from err


def check_graph(path: Path) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as err:  # onnx raises several untyped errors
        raise BuildConfigError(f"the built network {path.name} is not a valid ONNX model: {err}") from err
