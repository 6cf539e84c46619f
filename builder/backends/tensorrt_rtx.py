"""The tensorrt_rtx backend: the portable ONNX compiled ahead of time by TensorRT for RTX, on any Linux host.

TensorRT for RTX (``tensorrt_rtx``, PyPI ``tensorrt-rtx-cu13``) builds an engine
for a named compute capability without a GPU or its driver: the builder runs
on the CPU and the engine is specialised (JIT) on the RTX GPU when first loaded.
Each ``--target_sm`` gets its own engine, ``model.<sm>.engine``, and an
EPContext model, ``model.<sm>.ctx.onnx``: one ``com.microsoft`` ``EPContext``
node whose ``ep_cache_context`` names the engine file, the form in which ONNX
Runtime's ``NvTensorRTRTXExecutionProvider`` loads a precompiled engine without
rebuilding it. The ONNX network the engines came from stays beside them.

Why not let that execution provider compile the EPContext model itself: on
Linux it creates its devices only through the CUDA driver (its driverless
"virtual device" path is for Windows sandboxes only), so with no GPU there is
no device to compile for (docs/tensorrt.md#tensorrt-for-rtx records the
attempt). The same TensorRT-RTX release builds the engine here directly.

Every ``tensorrt_rtx`` / ``onnx`` import is inside a function.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...formats.engine_format import BuildConfig, ModelConfig
from ...formats.errors import BuildConfigError
from ..weight_only import WeightOnlyScheme
from .base import Compiled
from .trt_onnx import add_profiles, collecting_logger, parse_portable, profiles_record, static_kv_proto

TITLE = "TensorRT for RTX"
DEVICE = "cuda"
DEFAULT_LOWERING = "portable"
LOWERINGS = ("portable",)  # the same ONNX parser as TensorRT's: the portable graph's standard ops
TREE_ATTENTION = False  # the tree_mask input is not verified on TensorRT for RTX
NETWORK = "onnx"
KV_LAYOUT = None  # the lowering's
OPTIONS = {"target_sm": "--target_sm"}  # build_engine keyword -> specdec-build flag
NOTICE = None  # its build runs and is tested here; its engines say where they run (docs/tensorrt.md#tensorrt-for-rtx)
INSTALL_HINT = "pip install 'specdec[build,tensorrt-rtx-build]' (any Linux x86-64 host; no GPU needed)"
EP_NAME = "NvTensorRTRTXExecutionProvider"
# The compute capabilities TensorRT for RTX and its execution provider build for (the provider's
# nv_target_sm values): Ampere RTX 30xx, Ada RTX 40xx, Blackwell RTX 50xx, GB10.
TARGET_SMS = ("sm86", "sm89", "sm120", "sm121")
FP8_SMS = ("sm89", "sm120", "sm121")  # Ampere has no FP8 tensor cores: TensorRT-RTX refuses e4m3 for sm86


def engine_file(sm: str) -> str:
    return f"model.{sm}.engine"


def context_file(sm: str) -> str:
    return f"model.{sm}.ctx.onnx"


def tensorrt_rtx_available() -> tuple[bool, str]:
    """(True, "") when this host can build TensorRT-RTX engines (no GPU needed), else (False, what to install)."""
    try:
        import tensorrt_rtx  # noqa: F401
    except Exception as err:  # ImportError, or OSError when libtensorrt_rtx is missing
        return False, f"the `tensorrt_rtx` Python module is not importable ({err}); {INSTALL_HINT}."
    return True, ""


def host_problem() -> str | None:
    ok, why = tensorrt_rtx_available()
    return None if ok else why


def auto_note() -> str | None:
    return None  # auto picks onnxruntime; an RTX build is asked for by name, with the GPUs it targets


def check_options(options: dict[str, Any]) -> None:
    pass  # --target_sm is checked with the build (check_build): it needs the quantization


def refusals(build: BuildConfig) -> list[str]:
    return []  # said in its own sentences, with the targets (check_build)


def check_build(build: BuildConfig, options: dict[str, Any]) -> None:
    """--target_sm is required, and what TensorRT for RTX refuses for those targets is refused now."""
    check_rtx_build(build, parse_target_sms(options.get("target_sm")))


def compile_engine(out_dir: Path, network_file: str, build: BuildConfig, model: ModelConfig, options: dict[str, Any],
                   say: Callable[[str], None]) -> Compiled:
    """One engine + EPContext model per target SM; the first target's EPContext model is config.json's network_file (the
    executor picks the one of its GPU). The portable network runs under ONNX Runtime before TensorRT for RTX compiles it."""
    from .onnxruntime import check_loads

    check_loads(out_dir / network_file)
    targets = parse_target_sms(options.get("target_sm"))
    meta = build_rtx_engines(out_dir / network_file, out_dir, build, model, targets, say=say)
    summary = (f"TensorRT for RTX {meta['tensorrt_rtx_version']} engines: "
               + ", ".join(f"{sm} ({t['network_file']})" for sm, t in meta["targets"].items()) + "; run on an RTX GPU of that SM")
    return Compiled(meta["targets"][targets[0]]["network_file"], {"tensorrt_rtx": meta["tensorrt_rtx_version"]}, {"tensorrt_rtx": meta}, summary)


def parse_target_sms(text: str | None) -> tuple[str, ...]:
    """``"sm89,sm86"`` -> ("sm89", "sm86"); one line naming the accepted values otherwise."""
    sms = tuple(dict.fromkeys(s.strip().lower() for s in (text or "").split(",") if s.strip()))
    bad = [s for s in sms if s not in TARGET_SMS]
    choices = (f"{', '.join(TARGET_SMS)}, comma-separated (sm86: RTX 30xx, sm89: RTX 40xx, sm120: RTX 50xx, sm121: GB10); "
               "TensorRT for RTX does not build for data-centre GPUs (H100 is sm90)")
    if not sms:
        raise BuildConfigError(f"--target_sm is missing: --backend tensorrt_rtx builds for the RTX GPUs it names, one or more of {choices}.")
    if bad:
        raise BuildConfigError(f"--target_sm {', '.join(bad)}: {'is' if len(bad) == 1 else 'are'} not one of {choices}.")
    return sms


def check_rtx_build(build: BuildConfig, targets: tuple[str, ...]) -> None:
    """What TensorRT for RTX refuses for these targets, before any work."""
    if build.quantization == "fp8":
        no_fp8 = [s for s in targets if s not in FP8_SMS]
        if no_fp8:
            raise BuildConfigError(f"--qformat fp8 cannot target {', '.join(no_fp8)}: Ampere GPUs have no FP8 (TensorRT for RTX refuses float8 e4m3 "
                                   f"there); target {', '.join(FP8_SMS)}, or build {', '.join(no_fp8)} without fp8.")
    scheme = WeightOnlyScheme.of(build)
    if scheme is not None and not scheme.symmetric:
        raise BuildConfigError("the tensorrt_rtx backend takes symmetric weight-only weights: TensorRT for RTX's parser cannot import "
                               "the unsigned integers of --asymmetric weights; drop --asymmetric.")


def mark_attention_decomposable(trt, network) -> int:
    """Let TensorRT split every attention it has no fused kernel for into plain layers; return how many.

    The portable lowering computes attention in float32 (and small models have head sizes without
    a fused kernel), for which TensorRT-RTX's builder otherwise stops with "Attention operation was
    not supported by a dedicated kernel" and points at IAttention.decomposable.
    """
    marked = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type in (trt.LayerType.ATTENTION_INPUT, trt.LayerType.ATTENTION_OUTPUT):
            layer.__class__ = trt.IAttentionBoundaryLayer  # TensorRT's documented downcast of a network layer
            attention = layer.attention
            if not attention.decomposable:
                attention.decomposable = True
                marked += 1
    return marked


def build_rtx_engines(
    onnx_path: Path,
    out_dir: Path,
    build: BuildConfig,
    model: ModelConfig,
    targets: tuple[str, ...],
    say: Callable[[str], None] = print,
) -> dict:
    """One engine + EPContext model per target SM in ``out_dir``; metadata for config.json (extra.tensorrt_rtx)."""
    ok, why = tensorrt_rtx_available()
    if not ok:
        raise BuildConfigError(f"--backend tensorrt_rtx cannot build on this host: {why}")
    import tensorrt_rtx as trt

    logger = collecting_logger(trt, say)
    builder, network, parser = parse_portable(trt, logger, onnx_path, build.kv_capacity, product="TensorRT for RTX")
    decomposed = mark_attention_decomposable(trt, network)
    built: dict[str, dict[str, str]] = {}
    profiles = []
    io_graph = static_kv_proto(onnx_path, build.kv_capacity)  # the ABI's inputs and outputs, for every EPContext model
    for sm in targets:
        config = builder.create_builder_config()
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, sm.upper()), 0)
        profiles = add_profiles(trt, builder, config, network, build, model)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise BuildConfigError(f"TensorRT for RTX {trt.__version__} failed to build {onnx_path} for "
                                   f"{sm}:\n" + "\n".join(logger.errors or ["(see the TensorRT log above)"]))
        (out_dir / engine_file(sm)).write_bytes(memoryview(plan))
        write_ep_context(out_dir / context_file(sm), io_graph, onnx_path.name, engine_file(sm), sm, trt.__version__)
        built[sm] = {"network_file": context_file(sm), "engine_file": engine_file(sm)}
    del parser  # the network's weights were the parser's: kept until every engine was built
    return {
        "tensorrt_rtx_version": trt.__version__,
        "execution_provider": EP_NAME,
        "targets": built,
        "onnx_file": onnx_path.name,
        "decomposable_attention_layers": decomposed,
        "profiles": profiles_record(profiles),
    }


def write_ep_context(path: Path, network, onnx_name: str, engine_name: str, sm: str, version: str) -> None:
    """The EPContext model of one engine: the engine ABI's inputs and outputs around one EPContext node.

    embed_mode 0: the engine stays in its own file beside this one (the provider refuses an absolute
    path or one leaving the directory), so engines of any size work and the same file can be read by
    TensorRT-RTX's own runtime. ``network``: the portable network's weightless ModelProto with the cache at its
    static capacity (static_kv_proto), whose inputs and outputs the EPContext model keeps.
    """
    import onnx
    from onnx import helper

    node = helper.make_node(
        "EPContext",
        [i.name for i in network.graph.input],
        [o.name for o in network.graph.output],
        name=f"tensorrt_rtx_{sm}",
        domain="com.microsoft",
        main_context=1,
        embed_mode=0,
        ep_cache_context=engine_name,
        source=EP_NAME,
        ep_sdk_version=version,
        hardware_architecture=sm,
        onnx_model_filename=onnx_name,
        partition_name=f"tensorrt_rtx_{sm}",
    )
    graph = helper.make_graph([node], f"{network.graph.name}_{sm}", list(network.graph.input), list(network.graph.output))
    ctx = helper.make_model(graph, opset_imports=[*network.opset_import, helper.make_opsetid("com.microsoft", 1)],
                            producer_name="specdec-build", ir_version=network.ir_version)
    onnx.save_model(ctx, str(path))
