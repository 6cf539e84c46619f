"""The tensorrt backend: the engine ABI's ONNX network compiled into ``rank0.engine``.

The same ``model.onnx`` that ONNX Runtime runs everywhere is what TensorRT's
ONNX parser reads here: ``TensorScatter`` (opset 24) becomes TensorRT's
in-place KV-cache-update layer and ``Attention`` (opset 23) its attention
layer. Precision is already in the graph (casts), so the network is strongly
typed.

Two optimization profiles, because TensorRT times its kernels at a profile's
``opt`` shape and a single range from 1 to ``max_input_len`` tokens would tune
either for long prefills or for the 1..k+1-token decode steps that make up
nearly all of the calls. The context profile (0) spans whole prompts, the
generation profile (1) the decode widths; the executor picks per call.

Every ``tensorrt`` / ``cuda`` import is inside a function: importing this
module (and the pure ``profile_shapes``) works on hosts without either.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ...runtime.engine_format import BuildConfig, ModelConfig
from ...runtime.errors import BuildConfigError, DeviceError
from ...runtime.backends.tensorrt.executor import CONTEXT_PROFILE, ENGINE_FILE, GENERATION_PROFILE
from ...runtime.backends.tensorrt.host import MIN_TENSORRT, cuda_call, cuda_device_info, cudart_module, visible_gpu_count

INSTALL_HINT = 'pip install "specdec[tensorrt]" on a host with an NVIDIA GPU and its driver'
Shape = tuple[int, ...]


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


def generation_width(build: BuildConfig) -> int:
    """Most tokens per row in a generation call: the last token + max_draft_len drafts, and at
    least 2, because the draft model's catch-up step feeds its pending 2 tokens at once."""
    return max(2, build.max_draft_len + 1)


def profile_shapes(build: BuildConfig, model: ModelConfig) -> list[dict[str, tuple[Shape, Shape, Shape]]]:
    """(min, opt, max) shape of every network input, for profile 0 (context) and 1 (generation).

    opt: a full batch in both (decoding keeps the batch full until rows
    finish); half of max_input_len for prompts; exactly max_draft_len + 1
    tokens for generation (the verify width of a target, 1 for a draft).
    Batch sizes agree across inputs at opt, as TensorRT requires.
    """
    mb, ctx, gen = build.max_batch_size, build.max_input_len, generation_width(build)
    kv = (model.num_kv_heads, build.kv_capacity, model.head_dim)  # capacity is static: KVCacheUpdate needs it
    caches = [f"past_{k}.{i}" for i in range(model.num_layers) for k in ("key", "value")]

    def profile(tokens: tuple[int, int], rows: tuple[int, int]) -> dict[str, tuple[Shape, Shape, Shape]]:
        ids = ((1, 1), (mb, tokens[0]), (mb, tokens[1]))
        shapes = {"input_ids": ids, "position_ids": ids, "logits_index": ((1, 1), (mb, rows[0]), (mb, rows[1]))}
        shapes.update({c: ((1, *kv), (mb, *kv), (mb, *kv)) for c in caches})
        return shapes

    by_index = {
        CONTEXT_PROFILE: profile((max(1, -(-ctx // 2)), ctx), (1, ctx)),  # prefill asks for the last row only
        GENERATION_PROFILE: profile((build.max_draft_len + 1, gen), (build.max_draft_len + 1, gen)),
    }
    return [by_index[i] for i in sorted(by_index)]


def static_kv_onnx(onnx_path: Path, capacity: int) -> bytes:
    """The network with the cache's sequence axis fixed to ``capacity``.

    TensorRT's KV-cache-update layer needs the cache to be a network input
    with a static sequence dimension; the ONNX graph leaves it symbolic
    (``kv_capacity``). Only the small graph proto is rewritten: weights stay
    in ``model.onnx.data``, found through the path given to the parser.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    for value in [*model.graph.input, *model.graph.output]:
        if value.name.startswith(("past_key.", "past_value.", "present_key.", "present_value.")):
            value.type.tensor_type.shape.dim[2].dim_value = capacity  # oneof: clears dim_param
    return model.SerializeToString()


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
    logger = _collecting_logger(trt, say)
    builder = trt.Builder(logger)
    flags = 0
    if major < 11 and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        # TensorRT 10: opt in. TensorRT 11: always strongly typed (the flag is deprecated and ignored).
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # parse(model, path): documented for models with external weights, like parse_from_file, but
    # takes the proto with the static cache axis.
    if not parser.parse(static_kv_onnx(onnx_path, build.kv_capacity), str(onnx_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        lines = [f"  node {e.node_name() or e.node()} ({e.node_operator() or '?'}): {e.desc()}" for e in errors]
        raise BuildConfigError(f"TensorRT {version}'s ONNX parser rejected {onnx_path}:\n" + "\n".join(lines or logger.errors or ["  (no parser error recorded)"]))

    config = builder.create_builder_config()
    profiles = profile_shapes(build, model)
    inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    if inputs != set(profiles[0]):
        raise BuildConfigError(f"the parsed network's inputs differ from the engine ABI: {sorted(inputs ^ set(profiles[0]))}.")
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        if config.add_optimization_profile(profile) < 0:
            raise BuildConfigError(f"TensorRT rejected optimization profile {shapes}.")
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
        raise BuildConfigError(f"TensorRT {version} failed to build {onnx_path} on {gpu} ({sm}):\n" + "\n".join(logger.errors or ["(see the TensorRT log above)"]))
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
        "profiles": [{n: [list(s) for s in mm] for n, mm in p.items() if not n.startswith("past_")} for p in profiles],
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


def _collecting_logger(trt, say: Callable[[str], None]):
    """A trt.ILogger that shows warnings and keeps errors for the exception message."""

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)  # documented: subclasses must call the base __init__
            self.errors: list[str] = []

        def log(self, severity, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(f"  {msg}")
                say(f"TensorRT error: {msg}")
            elif severity == trt.ILogger.Severity.WARNING:
                say(f"TensorRT warning: {msg}")

    return Logger()
