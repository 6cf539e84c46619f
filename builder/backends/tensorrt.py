"""The tensorrt backend: the engine ABI's ONNX network compiled into ``rank0.engine``.

The same ``model.onnx`` that ONNX Runtime runs everywhere is what TensorRT's
ONNX parser reads here: ``TensorScatter`` (opset 24) becomes TensorRT's
in-place KV-cache-update layer and ``Attention`` (opset 23) its attention
layer. Precision is already in the graph (casts), so the network is strongly
typed.

The ONNX-side work (the static cache axis, parsing, the two optimization
profiles) is shared with the TensorRT-for-RTX backend: ``trt_onnx``.

Every ``tensorrt`` / ``cuda`` import is inside a function: importing this
module (and the pure ``profile_shapes``) works on hosts without either.

Status: written from TensorRT's documented Python API and checked on GPU-less
hosts only (tests/builder/test_tensorrt_backend.py: the profiles, the static
cache axis, the refusals, and the builder's API names against the TensorRT for
RTX module where one is installed). This backend has never built or run an
engine on a GPU here (docs/tensorrt.md); every build that uses it says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...formats.engine_format import BuildConfig, ModelConfig
from ...formats.errors import BuildConfigError, DeviceError
from ...formats.tensorrt_plan import ENGINE_FILE
from ...hardware.tensorrt import MIN_TENSORRT, cuda_call, cuda_device_info, cudart_module, visible_gpu_count
from ..weight_only import WeightOnlyScheme
from .base import Compiled
from .trt_onnx import add_profiles, collecting_logger, generation_width, parse_portable, profile_shapes, profiles_record, static_kv_onnx  # noqa: F401 (re-exported)

TITLE = "TensorRT"
DEVICE = "cuda"
DEFAULT_LOWERING = "portable"
LOWERINGS = ("portable",)  # TensorRT's ONNX parser maps the portable graph's standard ops; ort_* use ONNX Runtime's own ops
TREE_ATTENTION = False  # the tree_mask input is not verified on TensorRT
NETWORK = "onnx"
KV_LAYOUT = None  # the lowering's
OPTIONS = {  # build_engine keyword -> specdec-build flag
    "trt_timing_cache": "--trt_timing_cache",
    "trt_version_compatible": "--trt_version_compatible",
    "trt_exclude_lean_runtime": "--trt_exclude_lean_runtime",
}
NEVER_RUN = "the tensorrt backend has never built or run an engine on a GPU here (docs/tensorrt.md)"
NOTICE = f"{NEVER_RUN}: this engine is untested; compare its outputs with an --backend onnxruntime build before relying on it."
INSTALL_HINT = 'pip install "specdec[tensorrt]" on a host with an NVIDIA GPU and its driver'


def tensorrt_available() -> tuple[bool, str]:
    """(True, "") when this host can build TensorRT engines, else (False, what is missing and how to get it)."""
    try:
        import tensorrt  # noqa: F401
    except Exception as err:  # ImportError, or OSError when libnvinfer is missing
        return False, f"the `tensorrt` Python module is not importable ({err}); {INSTALL_HINT}."
    try:
        visible_gpu_count("building a TensorRT engine")
    except DeviceError as err:  # no cuda-python, or no GPU: the message says which
        return False, str(err)
    return True, ""


def host_problem() -> str | None:
    ok, why = tensorrt_available()
    return None if ok else f"{why} {NEVER_RUN[0].upper()}{NEVER_RUN[1:]}; use --backend onnxruntime, which runs the same network on CPU."


def auto_note() -> str | None:
    ok, _ = tensorrt_available()
    return "TensorRT can build here: pass --backend tensorrt to use it (never built or run on a GPU here)" if ok else "no TensorRT on this host"


def check_options(options: dict[str, Any]) -> None:
    if options.get("trt_exclude_lean_runtime") and not options.get("trt_version_compatible"):
        raise BuildConfigError("--trt_exclude_lean_runtime only applies to version-compatible plans: add --trt_version_compatible.")


def refusals(build: BuildConfig) -> list[str]:
    """Weight-only forms this backend's DequantizeLinear path does not take."""
    scheme = WeightOnlyScheme.of(build)
    problems = []
    if scheme is not None and not scheme.symmetric:
        problems.append("the tensorrt backend takes symmetric weight-only weights (no zero points): drop --asymmetric")
    if scheme is not None and scheme.bits == 8 and scheme.group_size:
        problems.append("the tensorrt backend takes int8 weights per channel only: use --group_size 0 (the int8 default)")
    return problems


def check_build(build: BuildConfig, options: dict[str, Any]) -> None:
    pass  # its refusals are phrases (refusals) and its options' checks (check_options)


def compile_engine(out_dir: Path, network_file: str, build: BuildConfig, model: ModelConfig, options: dict[str, Any],
                   say: Callable[[str], None]) -> Compiled:
    """The plan beside the ONNX it was parsed from (the graph stays: what the plan was built from)."""
    cache = options.get("trt_timing_cache")
    meta = build_tensorrt_engine(out_dir / network_file, out_dir, build, model, Path(cache) if cache else None,
                                 bool(options.get("trt_version_compatible")), exclude_lean_runtime=bool(options.get("trt_exclude_lean_runtime")),
                                 say=say)
    return Compiled(ENGINE_FILE, {"tensorrt": meta["tensorrt_version"]}, {"tensorrt": meta})


def build_tensorrt_engine(
    onnx_path: Path,
    out_dir: Path,
    build: BuildConfig,
    model: ModelConfig,
    timing_cache: Path | None,
    version_compatible: bool,
    device: int = 0,
    exclude_lean_runtime: bool = False,
    tf32: bool = False,
    say: Callable[[str], None] = print,
) -> dict:
    """Parse ``onnx_path``, build, write ``out_dir/rank0.engine``; return metadata for config.json (extra.tensorrt)."""
    ok, why = tensorrt_available()
    if not ok:
        raise BuildConfigError(f"--backend tensorrt cannot build on this host: {why}")
    import tensorrt as trt

    version = trt.__version__
    major = int(version.split(".")[0])
    if tuple(int(p) for p in version.split(".")[:2]) < MIN_TENSORRT:
        raise BuildConfigError(
            f"TensorRT {version} is too old: the network updates its KV cache with ONNX TensorScatter, which TensorRT's parser "
            f"maps onto its in-place KV-cache-update layer from {'.'.join(map(str, MIN_TENSORRT))}. Upgrade: {INSTALL_HINT}."
        )
    if exclude_lean_runtime and not version_compatible:
        raise BuildConfigError("excluding the lean runtime only applies to --trt_version_compatible engines.")
    cuda_call(cudart_module().cudaSetDevice(device), f"cudaSetDevice({device})")
    gpu, sm = cuda_device_info(device)
    logger = collecting_logger(trt, say)
    flags = 0
    if major < 11 and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        # TensorRT 10: opt in. TensorRT 11: always strongly typed (the flag is deprecated and ignored).
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    builder, network, parser = parse_portable(trt, logger, onnx_path, build.kv_capacity, flags)
    config = builder.create_builder_config()
    profiles = add_profiles(trt, builder, config, network, build, model)
    if not tf32 and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # float32 graphs stay float32 (parity with ONNX Runtime)
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)  # plan carries its lean runtime: runs on newer TensorRT
        # Documented: plugin libraries the parser used must travel inside a version-compatible plan.
        config.plugins_to_serialize = list(parser.get_used_vc_plugin_libraries())
        if exclude_lean_runtime:
            config.set_flag(trt.BuilderFlag.EXCLUDE_LEAN_RUNTIME)
    cache = _attach_timing_cache(trt, config, timing_cache, say)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BuildConfigError(f"TensorRT {version} failed to build {onnx_path} on {gpu} "
                               f"({sm}):\n" + "\n".join(logger.errors or ["(see the TensorRT log above)"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ENGINE_FILE).write_bytes(memoryview(plan))
    if timing_cache is not None and cache is not None:
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = timing_cache.with_name(f".{timing_cache.name}.{os.getpid()}")
        tmp.write_bytes(memoryview(config.get_timing_cache().serialize()))
        os.replace(tmp, timing_cache)  # atomic: a concurrent build never reads half a cache
    return {
        "tensorrt_version": version,
        "gpu": gpu,
        "compute_capability": sm,
        "device": device,
        "version_compatible": version_compatible,
        "exclude_lean_runtime": exclude_lean_runtime,
        "strongly_typed": True,
        "tf32": tf32,
        "engine_file": ENGINE_FILE,
        "profiles": profiles_record(profiles),
    }


def _attach_timing_cache(trt, config, path: Path | None, say: Callable[[str], None]):
    """Load the timing cache at ``path`` (or start an empty one); a cache from another GPU/version is replaced."""
    if path is None:
        return None
    blob = path.read_bytes() if path.is_file() else b""
    try:
        cache = config.create_timing_cache(blob)
    except Exception:  # a cache file TensorRT cannot read at all (another version, truncated)
        cache = None
    if cache is None or not config.set_timing_cache(cache, False):  # ignore_mismatch=False: never reuse timings of another device
        say(f"warning: timing cache {path} was made on another GPU or TensorRT version; starting a new one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    return cache
