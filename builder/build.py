"""specdec-build's engine: checkpoint -> network -> engine directory, as a pipeline of named steps.

    check_before_work   what the flags alone refuse (output directory, options, head flags, tree attention)
    load_checkpoint     config.json + safetensors; the model config and the checkpoint's quantization
    resolve_build       every auto decided: quantization, dtype, backend, lowering, tree attention, attention form
    check_resolved      what the resolved build refuses (limits, memory, the backend's refusals, calibration)
    load_build_heads    Medusa heads / an EAGLE-3 module, checked against the base (builder/heads.py)
    make_network        calibration when needed, the network, the weight-only record
    write_engine_dir    files, compile, hashes, config.json: written beside the output and moved into place only when
                        complete, so a failed or interrupted build leaves nothing (builder/engine_dir.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..formats.engine_format import CPU_KERNELS, TREE_MODES, BuildConfig, EngineConfig, ModelConfig
from ..formats.errors import BuildConfigError
from .architectures import checkpoint_dtype, model_config_from_hf
from .backends import AUTO, BACKENDS, backend_module, check_own_options, refuse_foreign_options, resolve_backend
from .checkpoint import load_checkpoint
from .engine_dir import prepare_output, write_engine_dir
from .gguf_checkpoint import dequantized_note
from .heads import HEAD_FLAGS, Heads, check_head_flags, check_heads
from .lm_head import resolve_lm_head
from .lora import load_lora_adapters, merge_lora
from .quantization import Fp8Convention, IntConvention, detect_checkpoint_quantization
from .validation import check_memory_limits, validate_checkpoint
from .weight_only import GROUP_SIZES, WEIGHT_ONLY_BITS, WeightOnlyScheme

DTYPES = ("auto", "float32", "float16", "bfloat16")
MODES = ("none", "draft_tokens_external", "medusa", "eagle", "peagle")
QUANTIZATIONS = ("auto", "none", "fp8", *WEIGHT_ONLY_BITS)
# int4_awq: also search each group's clipping of the scaled weight (builder/awq.py): on the demo pair
# it takes held-out perplexity from 16.44 (scales only) to 16.41 (float32 16.23, RTN 16.51).
AWQ_CLIP = True
# IntConvention.method -> source
CHECKPOINT_SOURCES = {"gptq": "gptq", "awq": "awq-checkpoint", "compressed-tensors": "compressed-tensors", "gguf": "gguf"}
FP8_ACTIVATIONS = ("none", "static", "dynamic")


@dataclass
class BuildResult:
    output_dir: Path
    config: EngineConfig
    num_parameters: int
    engine_bytes: int
    seconds: float
    backend_summary: str | None = None  # the backend's line for the report (Compiled.summary)


def validate_build_config(build: BuildConfig, model: ModelConfig) -> None:
    problems = []
    if build.max_batch_size < 1:
        problems.append(f"max_batch_size={build.max_batch_size} must be >= 1")
    if build.max_input_len < 1:
        problems.append(f"max_input_len={build.max_input_len} must be >= 1")
    if build.max_input_len >= build.max_seq_len:
        problems.append(f"max_input_len={build.max_input_len} must be smaller than max_seq_len={build.max_seq_len} (room for output tokens)")
    if build.speculative_decoding_mode not in MODES:
        problems.append(f"speculative_decoding_mode={build.speculative_decoding_mode!r} is not one of {', '.join(MODES)}")
    elif build.speculative_decoding_mode == "draft_tokens_external" and build.max_draft_len < 1:
        problems.append("speculative_decoding_mode=draft_tokens_external needs max_draft_len >= 1")
    elif build.speculative_decoding_mode in TREE_MODES and build.max_draft_len < 1:
        problems.append(f"speculative_decoding_mode={build.speculative_decoding_mode} needs max_draft_len >= 1 (the draft tree's nodes verified per "
                        "step)")
    elif build.speculative_decoding_mode == "none" and build.max_draft_len != 0:
        problems.append(f"max_draft_len={build.max_draft_len} needs --speculative_decoding_mode draft_tokens_external (or medusa / eagle / peagle, "
                        "with their heads)")
    if build.max_draft_len < 0:
        problems.append(f"max_draft_len={build.max_draft_len} must be >= 0")
    elif build.max_draft_len >= build.max_seq_len:  # a step verifies max_draft_len + 1 tokens of one sequence
        problems.append(f"max_draft_len={build.max_draft_len} must be smaller than max_seq_len={build.max_seq_len} (a step verifies the drafts and "
                        "the last token in one sequence)")
    if build.tp_size != 1:
        problems.append(f"tp_size={build.tp_size}: tensor parallelism is not supported yet (use 1)")
    if build.dtype not in DTYPES[1:]:
        problems.append(f"dtype={build.dtype!r} is not one of {', '.join(DTYPES)}")
    if build.quantization not in QUANTIZATIONS[1:]:
        problems.append(f"quantization={build.quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    if build.fp8_activations not in FP8_ACTIVATIONS:
        problems.append(f"fp8_activations={build.fp8_activations!r} is not one of {', '.join(FP8_ACTIVATIONS)}")
    elif build.fp8_activations != "none" and build.quantization != "fp8":
        problems.append(f"fp8_activations={build.fp8_activations} needs --quantization fp8")
    if build.lowering == "ort_cuda" and build.quantization == "fp8":
        problems.append("lowering ort_cuda computes in the storage dtype and has no FP8 path: use --qformat none (or another lowering)")
    scheme = WeightOnlyScheme.of(build)
    if scheme is None and (build.group_size is not None or not build.symmetric or build.quantize_lm_head):
        given = [f for f, on in (("--group_size", build.group_size is not None), ("--asymmetric", not build.symmetric),
                                 ("--quantize_lm_head", build.quantize_lm_head)) if on]
        verb = "applies" if len(given) == 1 else "apply"
        problems.append(f"{', '.join(given)} {verb} only to weight-only quantization (--qformat int8_wo, int4_wo or int4_awq), not to "
                        f"{build.quantization}")
    if build.quantize_draft_heads and (scheme is None or build.speculative_decoding_mode not in TREE_MODES):
        problems.append("--quantize_draft_heads quantizes a target's draft heads (Medusa heads, an EAGLE-3 or P-EAGLE module) as its weight-only "
                        "layers: use it with --speculative_decoding_mode medusa, eagle or peagle and --qformat int8_wo, int4_wo or int4_awq "
                        f"(this build: {build.speculative_decoding_mode}, {build.quantization})")
    problems += cpu_kernels_problems(build)
    if build.backend in BACKENDS[1:]:  # what the backend itself cannot build (its module says)
        problems += backend_module(build.backend).refusals(build)
    if problems:
        raise BuildConfigError("invalid build configuration: " + "; ".join(problems) + ".")


def cpu_kernels_problems(build: BuildConfig) -> list[str]:
    """--cpu_kernels specdec: specdec's CPU ops of the ort_cpu lowering (plugins/cpu_kernels.py): int4 / int8 weights on
    Q4Gemm / Q8Gemm, a chain or tree engine's attention on RotaryCachedAttention, and an MLP gate after a gate|up the GEMMs do
    not take (float, MatMulNBits) on SwiGLU, whatever its precision."""
    if build.cpu_kernels not in CPU_KERNELS:
        return [f"cpu_kernels={build.cpu_kernels!r} is not one of {', '.join(CPU_KERNELS)}"]
    if build.cpu_kernels == "ort":
        return []
    problems = []
    if build.lowering != "ort_cpu":  # (a lowering only the onnxruntime backend takes)
        problems.append(f"--cpu_kernels specdec is an op of the ort_cpu lowering on the onnxruntime backend (this build: {build.backend}, "
                        f"{build.lowering})")
    from ..hardware.cpu_kernels import compiler

    if not problems and compiler() is None:
        problems.append("--cpu_kernels specdec compiles a C library and found no C compiler (cc, gcc, clang or $CC): install one, or build with "
                        "--cpu_kernels ort "
                        "(hosts that run the engine need one too)")
    return problems


def resolve_quantization(build: BuildConfig, convention: Fp8Convention | IntConvention | None) -> BuildConfig:
    """auto -> what the checkpoint holds; a weight-only build gets its group size (the checkpoint's, or the default)."""
    q = build.quantization
    if isinstance(convention, IntConvention):
        held = f"int{convention.bits}_wo"
        where = f"the checkpoint holds {convention.method} int{convention.bits} weights (group size {convention.group_size or 'per channel'})"
        if q == "auto":
            q = held
        if q not in ("none", held):
            raise BuildConfigError(f"--qformat {q}: {where}; build them as they are (--qformat auto or {held}), or dequantize them with --qformat "
                                   "none.")
        if q == held:
            if build.group_size is not None and build.group_size != convention.group_size:
                raise BuildConfigError(f"--group_size {build.group_size}: {where}, which is kept as is; leave --group_size out.")
            if not build.symmetric and convention.symmetric:
                raise BuildConfigError(f"--asymmetric: {where}, symmetric, kept as is; leave --asymmetric out.")
            return replace(build, quantization=q, group_size=convention.group_size, symmetric=convention.symmetric)
        return replace(build, quantization=q)
    if q == "auto":
        q = "fp8" if convention is not None else "none"
    if q in WEIGHT_ONLY_BITS:
        if convention is not None:
            raise BuildConfigError(f"--qformat {q}: the checkpoint holds FP8 weights; build it as fp8 (--qformat auto) or dequantize it with "
                                   "--qformat none.")
        if build.group_size is not None and build.group_size not in GROUP_SIZES:
            raise BuildConfigError(f"--group_size {build.group_size} is not one of {', '.join(map(str, GROUP_SIZES))} (0 = per output channel).")
        scheme = WeightOnlyScheme.of(replace(build, quantization=q))
        return replace(build, quantization=q, group_size=scheme.group_size)
    return replace(build, quantization=q)


def weight_only_record(build: BuildConfig, convention, layers: list[str], op: str, act_order: bool = False, even_rows: bool = False) -> dict | None:
    """What config.json says about a weight-only engine: the scheme, which layers, where the integers came from."""
    scheme = WeightOnlyScheme.of(build)
    if scheme is None:
        return None
    kinds = sorted({name.split("/", 3)[-1] if name.startswith("/model/layers.") else name for name in layers})
    if isinstance(convention, IntConvention):
        source = CHECKPOINT_SOURCES.get(convention.method, convention.method)
    else:
        source = "awq" if build.quantization == "int4_awq" else "rtn"
    return {
        "bits": scheme.bits,
        "group_size": scheme.group_size,  # 0 = per output channel
        "symmetric": scheme.symmetric,
        "act_order": act_order,  # what was built: some layer gathers its input channels (GPTQ g_idx)
        "source": source,
        "layers": kinds,  # e.g. attn/qkv_proj, mlp/down_proj, lm_head
        "num_layers_quantized": len(layers),
        "op": op,
        # a step's tokens padded to an even row count (one repeated token per sequence when batch x tokens is
        # odd): this ONNX Runtime's GEMM kernels compute a lone row otherwise (measured at build, plugins/quantized_gemm.py)
        "even_rows": even_rows,
    }


def resolve_attention(build: BuildConfig) -> BuildConfig:
    """ort_cuda's attention form (gqa | masked) and the KV layout of the form: after tree_attention is known."""
    from ..plugins import lowering_for
    from ..plugins.ort_cuda import CUDA_ATTENTION, resolve_cuda_attention

    if build.cuda_attention not in CUDA_ATTENTION:
        raise BuildConfigError(f"--cuda_attention {build.cuda_attention!r} is not one of {', '.join(CUDA_ATTENTION)}.")
    if build.lowering != "ort_cuda":
        if build.cuda_attention != "auto":
            raise BuildConfigError(f"--cuda_attention {build.cuda_attention} applies to --lowering ort_cuda only (this build uses {build.lowering}).")
        return build
    build = replace(build, cuda_attention=resolve_cuda_attention(build))  # gqa with trees: refused by check_tree_backend
    return replace(build, kv_layout=lowering_for(build).kv_layout)


def resolve_lowering(build: BuildConfig) -> BuildConfig:
    """auto -> the fastest lowering the backend runs; record the KV layout it implies."""
    from ..plugins import LOWERINGS

    backend = backend_module(build.backend)
    name = backend.DEFAULT_LOWERING if build.lowering == "auto" else build.lowering
    owners = [b for b in BACKENDS[1:] if name in backend_module(b).LOWERINGS]  # a lowering no graph has is its backend's own (torch)
    if name not in LOWERINGS and not owners:
        raise BuildConfigError(f"lowering {name!r} is not one of auto, {', '.join(LOWERINGS)}.")
    if name not in backend.LOWERINGS:
        whose = f" ({name} is the {owners[0]} backend's: --backend {owners[0]})" if name not in LOWERINGS else ""
        raise BuildConfigError(f"the {build.backend} backend parses the {' or '.join(backend.LOWERINGS)} lowering only, not {name!r}{whose}.")
    # an ONNX lowering's cache layout is the lowering's; a backend that writes no ONNX (torch) declares its own
    return replace(build, lowering=name, kv_layout=LOWERINGS[name].kv_layout if backend.NETWORK == "onnx" else backend.KV_LAYOUT)


def resolve_dtype(requested: str, hf_config: dict) -> str:
    if requested not in DTYPES:
        raise BuildConfigError(f"--dtype {requested!r} is not one of {', '.join(DTYPES)}.")
    if requested != "auto":
        return requested
    found = checkpoint_dtype(hf_config)
    return found if found in DTYPES else "float32"


def build_engine(
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    build: BuildConfig,
    force: bool = False,
    allow_pickle: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    say: Callable[[str], None] = print,
    calib_dataset: str | Path | None = None,
    calib_size: int = 64,
    trt_timing_cache: str | Path | None = None,
    trt_version_compatible: bool = False,
    trt_exclude_lean_runtime: bool = False,
    target_sm: str | None = None,
    allow_nonfinite: bool = False,
    medusa_dir: str | Path | None = None,
    eagle_dir: str | Path | None = None,
    peagle_dir: str | Path | None = None,
    lora_dirs: Sequence[str | Path] = (),
    lora_scales: Sequence[float] = (),
) -> BuildResult:
    """Build one engine directory. ``progress(step, done, total)`` reports work.

    medusa_dir: Medusa heads in ModelOpt's layout (docs/train-heads.md), built into the network as its
    medusa_logits output; needs speculative_decoding_mode "medusa".
    eagle_dir: an EAGLE-3 module in ModelOpt's layout; needs speculative_decoding_mode "eagle". Its fc goes into
    the network (the eagle_hidden output), the rest into its own engine in output_dir/eagle (builder/eagle.py).
    peagle_dir: a P-EAGLE module (EAGLE-3's layout plus mask_hidden); needs speculative_decoding_mode "peagle". Built as
    eagle_dir is, its engine drafting a whole block in one call.
    target_sm: with backend tensorrt_rtx, the RTX compute capabilities to build for ("sm89" or "sm86,sm89,sm120").
    lora_dirs: peft LoRA adapters merged into the checkpoint's weights, in order, each scaled by its ``lora_scales`` entry
    (none: 1.0 each; one: for all) (builder/lora.py).
    """
    t0 = time.perf_counter()
    output_dir = Path(output_dir).resolve()  # "." gets a name; a link is written through, to where it points
    # the backends' own options, each refused by the backend that takes it (backends/__init__.py)
    options = {"trt_timing_cache": trt_timing_cache, "trt_version_compatible": trt_version_compatible,
               "trt_exclude_lean_runtime": trt_exclude_lean_runtime, "target_sm": target_sm}
    head_dirs = {"medusa": medusa_dir, "eagle": eagle_dir, "peagle": peagle_dir}
    inputs = {"--checkpoint_dir": checkpoint_dir, "--calib_dataset": calib_dataset, **{f"--{m}_dir": d for m, d in head_dirs.items()},
              **{"--lora_dir" + (f" #{i + 1}" if i else ""): d for i, d in enumerate(lora_dirs)}}
    check_before_work(build, output_dir, force, options, head_dirs, inputs)
    ckpt = load_checkpoint(checkpoint_dir, allow_pickle=allow_pickle)
    adapters = load_lora_adapters(lora_dirs, lora_scales, allow_pickle) if lora_dirs or lora_scales else []
    model = model_config_from_hf(ckpt.hf_config, max_seq_len=build.max_seq_len)
    convention = detect_checkpoint_quantization(ckpt.hf_config, ckpt.path)
    fp8 = convention if isinstance(convention, Fp8Convention) else None
    build = resolve_build(build, ckpt.hf_config, convention, say)
    check_resolved(build, model, fp8, options, calib_dataset, calib_size, say)
    model = resolve_lm_head(model, ckpt, say)  # what decodes, as transformers reads the checkpoint
    if adapters:
        ckpt = merge_lora(ckpt, adapters, model.tie_word_embeddings, _quantized_weights(convention), say)
    if ckpt.gguf is not None and (note := dequantized_note(ckpt.gguf, build.quantization)):
        say(note)
    validate_checkpoint(ckpt, model, build, convention, allow_nonfinite=allow_nonfinite)
    if not (ckpt.tokenizer_path / "tokenizer.json").is_file():  # builds, and takes token ids only: said now rather than at the first text prompt
        say(f"warning: {checkpoint_dir} has no tokenizer files (tokenizer.json): the engine takes token ids; text needs --tokenizer_dir "
            "at run time.")
    heads = load_build_heads(build, model, head_dirs, allow_nonfinite)
    build = heads.recorded(build)
    total = model.num_layers + 3 + (heads.eagle is not None)
    report = progress or (lambda *_: None)
    network, build = make_network(ckpt, model, build, convention, heads, calib_dataset, calib_size, report, total, say)
    written = write_engine_dir(output_dir, checkpoint_dir, ckpt, network, model, build, heads.eagle, fp8, options, report, total, say)
    return BuildResult(output_dir, written.config, network.num_parameters, written.engine_bytes, time.perf_counter() - t0, written.backend_summary)


def _quantized_weights(convention: Fp8Convention | IntConvention | None) -> str | None:
    """What a quantized checkpoint's linear layers hold ("FP8 (fp8)", "int4 (gptq)"), None for a float checkpoint."""
    if convention is None:
        return None
    return f"FP8 ({convention.method})" if isinstance(convention, Fp8Convention) else f"int{convention.bits} ({convention.method})"


def check_before_work(build: BuildConfig, output_dir: Path, force: bool, options: dict, head_dirs: dict[str, str | Path | None],
                      inputs: dict[str, str | Path | None] | None = None) -> None:
    """What the flags alone can refuse, before the checkpoint is read: the backends' own options, the output directory (not
    one of the build's ``inputs``), a head directory without its mode (or the other way round), tree attention on a backend
    without it."""
    check_own_options(options)
    prepare_output(output_dir, force, inputs)
    check_head_flags(build, head_dirs)
    check_tree_backend(build)


def resolve_build(build: BuildConfig, hf_config: dict, convention: Fp8Convention | IntConvention | None, say: Callable[[str], None]) -> BuildConfig:
    """Every ``auto`` of the build decided, each step reading the ones before it: the quantization (what the checkpoint
    holds), the dtype and the backend, the lowering the backend runs (and its KV layout), tree attention (medusa and
    eagle targets verify trees), ort_cuda's attention form."""
    build = resolve_quantization(build, convention)
    build = replace(build, dtype=resolve_dtype(build.dtype, hf_config), backend=resolve_backend(build.backend, say))
    build = resolve_lowering(build)
    build = replace(build, tree_attention=build.tree_attention or build.speculative_decoding_mode in TREE_MODES)
    return resolve_attention(build)


def check_resolved(build: BuildConfig, model: ModelConfig, fp8: Fp8Convention | None, options: dict, calib_dataset, calib_size: int,
                   say: Callable[[str], None]) -> None:
    """What the resolved build can refuse, before any network is built: the limits and choices, the memory, the backend's
    own refusals and options, the calibration the quantization needs."""
    validate_build_config(build, model)
    check_memory_limits(model, build)
    refuse_foreign_options(build.backend, options)
    backend_module(build.backend).check_build(build, {k: v for k, v in options.items() if v})
    if calib_size < 1:
        raise BuildConfigError(f"--calib_size {calib_size} must be >= 1 (calibration samples).")
    if build.fp8_activations == "static" and calib_dataset is None and fp8 is None:
        raise BuildConfigError("--fp8_activations static needs calibration: pass --calib_dataset FILE (or use dynamic).")
    if build.quantization == "int4_awq" and calib_dataset is None:
        raise BuildConfigError("--qformat int4_awq searches its scales on calibration text: pass --calib_dataset FILE (or use int4_wo, plain "
                               "round-to-nearest).")
    if calib_dataset is not None and not (build.fp8_activations == "static" or build.quantization == "int4_awq"):
        raise BuildConfigError("--calib_dataset is read only to calibrate --fp8_activations static or --qformat int4_awq, and this build "
                               f"does neither (--qformat {build.quantization}, --fp8_activations {build.fp8_activations}): leave it out.")
    if build.max_seq_len > model.max_position_embeddings:
        say(f"warning: max_seq_len={build.max_seq_len} exceeds the model's max_position_embeddings={model.max_position_embeddings}")


def load_build_heads(build: BuildConfig, model: ModelConfig, head_dirs: dict[str, str | Path | None], allow_nonfinite: bool = False) -> Heads:
    """The head checkpoint the build's mode takes (check_head_flags made sure its directory was given), checked against
    the base (builder/heads.py); none for the other modes."""
    mode = build.speculative_decoding_mode
    if mode not in HEAD_FLAGS:
        return Heads()
    from ..formats.heads import load_heads

    flag, holds = HEAD_FLAGS[mode]
    if not Path(head_dirs[mode]).is_dir():  # (load_heads says it too, without the flag)
        raise BuildConfigError(f"{flag} {head_dirs[mode]} does not exist or is not a directory: it takes {holds} (specdec-train's output).")
    heads = check_heads(mode, load_heads(head_dirs[mode]), head_dirs[mode], model, allow_nonfinite)
    return Heads(medusa=heads) if mode == "medusa" else Heads(eagle=heads)


def make_network(ckpt, model: ModelConfig, build: BuildConfig, convention, heads: Heads, calib_dataset, calib_size: int,
                 report: Callable[[str, int, int], None], total: int, say: Callable[[str], None] = lambda _: None):
    """The network (calibrated first when the quantization needs it), and ``build`` with its weight-only record: the ONNX
    graph of the build's lowering, or the torch backend's tensors (builder/network_writers.py: written into the engine's
    folder, which records their weight-only layers then)."""
    from .network import build_network
    from .network_writers import OnnxNetwork, TorchNetwork

    report("network", 0, total)
    scales = awq_layers = None
    onnx = backend_module(build.backend).NETWORK == "onnx"
    if (build.fp8_activations == "static" and calib_dataset is not None) or build.quantization == "int4_awq":
        scales, awq_layers = calibrate(ckpt, model, build, convention, Path(calib_dataset), calib_size, report, total, onnx, say)
    if not onnx:
        return TorchNetwork(ckpt, model, build, convention, awq_layers, heads.medusa, heads.eagle,
                            lambda i: report(f"layer {i}", i + 1, total)), build
    weight_only_built: dict = {}
    network = build_network(ckpt, model, build, on_layer=lambda i: report(f"layer {i}", i + 1, total), convention=convention,
                            activation_scales=scales,
                            awq_layers=awq_layers, weight_only_built=weight_only_built, medusa=heads.medusa, eagle=heads.eagle)
    return OnnxNetwork(network, _count_parameters(network)), replace(build, weight_only=built_record(build, convention, weight_only_built))


def built_record(build: BuildConfig, convention, built: dict) -> dict | None:
    """weight_only_record of an ONNX network, from what its builder filled ``built`` with (build_network's and
    build_eagle_network's weight_only_built): the op the lowering wrote, and specdec's kernel layout where it used them."""
    from ..plugins import lowering_for

    op = lowering_for(build).weight_only_op
    if built.get("q4gemm_layers"):  # --cpu_kernels specdec: Q4Gemm / Q8Gemm where they take the weight, MatMulNBits elsewhere
        kernels = "/".join(sorted(built["kernel_ops"]))
        op = f"{kernels} (ai.specdec.cpu) for {built['q4gemm_layers']} of {len(built.get('layers', []))} layers, else {op}"
    record = weight_only_record(build, convention, built.get("layers", []), op, built.get("act_order", False), built.get("even_rows", False))
    if record is not None and build.cpu_kernels == "specdec":
        from ..hardware.cpu_kernels import LAYOUT

        record["kernel_layout"] = LAYOUT  # the runtime refuses an engine of a layout its Q4Gemm does not read
        record["attention_op"] = built.get("attention_op", "Attention")  # RotaryCachedAttention (chain and tree engines)
    return record


def calibrate(ckpt, model: ModelConfig, build: BuildConfig, convention, calib_dataset: Path, calib_size: int,
              report: Callable[[str, int, int], None], total: int, onnx: bool = True, say: Callable[[str], None] = lambda _: None):
    """(static FP8 activation scales, AWQ's per-layer scales): the one the build needs, from a float32 network of the
    same lowering with every linear layer's input exposed, run over the calibration samples under ONNX Runtime on this
    CPU; ``onnx`` False (a backend that writes no graph: torch): a float32 ort_cpu network of the same checkpoint."""
    from ..formats.kv_layout import kv_cache_shape
    from .calibration import calibrate_activation_scales, calibration_samples
    from .network import build_network

    report("calibrate", 0, total)
    sample_len = min(256, build.max_input_len)
    samples = calibration_samples(calib_dataset, ckpt.tokenizer_path, calib_size, sample_len)
    if len(samples) < calib_size:  # the scales rest on what the file holds: say how little, rather than build as if it were enough
        say(f"warning: --calib_dataset {calib_dataset} gives {len(samples)} sample(s) of up to {sample_len} tokens "
            f"({sum(map(len, samples))} tokens), not --calib_size {calib_size}: the calibration rests on that much text.")
    taps: dict[str, str] = {}
    float_build = replace(build, quantization="none", fp8_activations="none", dtype="float32", group_size=None, symmetric=True,
                          quantize_lm_head=False, cpu_kernels="ort")  # (a float network: ONNX Runtime's own ops, no library to load)
    if not onnx:
        float_build = replace(float_build, backend=AUTO, lowering="ort_cpu", kv_layout="bsh", cuda_attention="auto")
    float_net = build_network(ckpt, model, float_build, convention=convention, linear_inputs=taps)
    cache_shape = kv_cache_shape(float_build.kv_layout, 1, model.num_kv_heads, build.kv_capacity, model.head_dim)
    if build.quantization == "int4_awq":
        from .awq import awq_search

        scheme = WeightOnlyScheme.of(build)
        return None, awq_search(float_net, taps, cache_shape, model.num_layers, samples, scheme.bits, scheme.group_size, scheme.symmetric,
                                clip=AWQ_CLIP, progress=lambda done, of: report(f"AWQ search, {done}/{of} linear layers", 0, total))
    return calibrate_activation_scales(float_net, taps, cache_shape, model.num_layers, samples), None


def check_tree_backend(build: BuildConfig) -> None:
    """Medusa and EAGLE targets (and --tree_attention ones) verify trees of drafts: a tree_mask input, which every onnxruntime
    lowering builds (ort_cuda with its masked attention), compiled by the backends that declare TREE_ATTENTION."""
    mode = build.speculative_decoding_mode
    if mode not in TREE_MODES and not build.tree_attention:
        return
    what = f"--speculative_decoding_mode {mode}" if mode in TREE_MODES else "--tree_attention"
    name = AUTO if build.backend == "auto" else build.backend  # auto always resolves to AUTO (resolve_backend): one check covers it
    backend = backend_module(name) if name in BACKENDS[1:] else None  # an unknown name: resolve_backend refuses it
    if backend is not None and not backend.TREE_ATTENTION:
        raise BuildConfigError(f"{what} runs on the {AUTO} backend only for now (tree attention is not verified "
                               f"on {backend.TITLE}): use --backend {AUTO}.")
    if build.lowering == "ort_cuda" and build.cuda_attention == "gqa":
        raise BuildConfigError(f"{what} verifies trees, which GroupQueryAttention cannot mask: use --cuda_attention masked (or auto).")


def _count_parameters(network) -> int:
    """Weights and biases, integer ones counted by their [in, out] (MatMulNBits, Q4Gemm and Q8Gemm pack them in blocks)."""
    count = sum(int(np.prod(t.dims)) for t in network.graph.initializer if t.name.endswith((".weight", ".bias")))
    for node in network.graph.node:
        if node.op_type in ("MatMulNBits", "Q4Gemm", "Q8Gemm"):
            attrs = {a.name: a.i for a in node.attribute}
            count += attrs["K"] * attrs["N"]
    return count
