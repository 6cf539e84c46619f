"""specdec-build: turn a Hugging Face checkpoint into an engine directory."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import click

from ..formats.engine_format import EAGLE_MODULE_DIR, TREE_MODES, BuildConfig, is_engine_config
from ..formats.errors import BuildConfigError, CheckpointError
from .common import check_output_dir, clean_errors, human_bytes, option

BUILD_EXTRA = ("onnx", "ml_dtypes", "tqdm")  # pyproject.toml's [build] extra


def _require_build_extra(missing: str | None = None) -> None:
    """A runtime-only install (pip install specdec) gets one line saying which extra to add, not a traceback."""
    for name in [missing] if missing else BUILD_EXTRA:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            sys.exit(f"error: specdec-build needs the build extra ({name} is not installed): pip install 'specdec[build]' "
                     "(from a clone: pip install '.[build]'). Running engines does not need it.")


try:
    from tqdm import tqdm

    from ..builder.backends import BACKENDS
    from ..builder.build import DTYPES, FP8_ACTIVATIONS, MODES, QUANTIZATIONS, build_engine
except ModuleNotFoundError as err:
    if (err.name or "").split(".")[0] not in BUILD_EXTRA:
        raise
    _require_build_extra(err.name.split(".")[0])


class _LogProgress:
    """Progress where stderr is not a terminal: one plain line every ``every`` seconds, the first after ``after``,
    so a build of seconds prints nothing more and a build of minutes says where it is in a log."""

    def __init__(self, what: str, after: float = 5.0, every: float = 15.0):
        self.what, self.after, self.every = what, after, every
        self.start = time.monotonic()
        self.next = self.start + after

    def __call__(self, step: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + self.every
            click.echo(f"{self.what}: {step} ({done}/{total} steps, {now - self.start:.0f} s)", err=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@option("checkpoint_dir", "--model_dir", required=True, type=click.Path(),
        help="Hugging Face model directory: config.json + *.safetensors (+ tokenizer files); or a llama.cpp GGUF file (model.gguf: "
             "Q4_0 / Q8_0 layers kept as they are, other types dequantized; needs the gguf extra).")
@option("output_dir", required=True, type=click.Path(),
        help="Where to write the engine directory (refused if it exists and is not empty, unless --force).")
@option("dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
        help="Weight storage dtype of the engine; auto = the checkpoint's. The onnxruntime backend computes in float32 "
             "whatever the storage (ONNX Runtime on CPU has no float16/bfloat16 MatMul), so float16/bfloat16 halve the engine size, not the compute.")
@option("max_batch_size", type=int, default=8, show_default=True, help="Most sequences per call.")
@option("max_input_len", type=int, default=None, help="Longest prompt in tokens [default: max_seq_len / 2].")
@option("max_seq_len", type=int, default=None,
        help="Longest prompt + output in tokens; the KV cache capacity [default: min(max_position_embeddings, 4096)].")
@option("max_draft_len", type=int, default=None,
        help="Most draft tokens verified per step; baked into the engine. Needs --speculative_decoding_mode draft_tokens_external, medusa, "
             "eagle or peagle; for medusa, eagle and peagle it is the draft tree's node budget (a chain of k drafts is k nodes) "
             "[default: 8 with those modes, else 0].")
@option("speculative_decoding_mode", type=click.Choice(MODES), default="none", show_default=True,
        help="draft_tokens_external: the target engine accepts 1..max_draft_len+1 tokens per sequence per step and returns logits for all of them "
             "(build TARGET engines this way). "
             "medusa: the same, with the Medusa heads of --medusa_dir in the network and tree attention (a tree_mask input; docs/medusa-eagle.md). "
             "eagle: the same, with tree attention and the EAGLE-3 module of --eagle_dir: its fc in the network (the eagle_hidden output), "
             "the module itself built as a second engine in OUTPUT_DIR/eagle. peagle: as eagle, with the P-EAGLE module of --peagle_dir, "
             "whose engine drafts a whole block in one call. none: one token per step (draft engines, plain decoding).")
@option("tree_attention", is_flag=True,
        help="With --speculative_decoding_mode draft_tokens_external: verify trees of drafts too (a tree_mask input), for suffix decoding's "
             "frequency trees (docs/suffix-decoding.md); medusa, eagle and peagle targets always have it.")
@option("medusa_dir", type=click.Path(), default=None,
        help="With --speculative_decoding_mode medusa: Medusa heads in ModelOpt's layout (specdec-train's output).")
@option("eagle_dir", type=click.Path(), default=None,
        help="With --speculative_decoding_mode eagle: an EAGLE-3 module in ModelOpt's layout (specdec-train's output, or ModelOpt's export) "
             "trained on this base model; one with a draft vocabulary of its own (draft_vocab_size, d2t, as published EAGLE-3 heads) too.")
@option("peagle_dir", type=click.Path(), default=None,
        help="With --speculative_decoding_mode peagle: a P-EAGLE module (specdec-train run --mode peagle: EAGLE-3's layout plus mask_hidden and "
             "ptd_token_id) trained on this base model.")
@option("lora_dir", type=click.Path(), multiple=True,
        help="A peft LoRA adapter folder (adapter_config.json + adapter_model.safetensors) merged into the checkpoint's weights at build time, "
             "as peft's merge_and_unload does: the engine decodes the adapted model at the base model's cost per step. Repeat to merge several, "
             "in order. LoRA on linear layers and embeddings, and modules_to_save; DoRA and other variants are refused "
             "(docs/cli-build.md#lora-adapters).")
@option("lora_scale", type=float, multiple=True,
        help="Multiplies a --lora_dir adapter's update (llama.cpp's --lora-scaled): once for all adapters, or once per --lora_dir in the same "
             "order [default: 1.0].")
@option("quantization", "--qformat", type=click.Choice(QUANTIZATIONS), default="auto", show_default=True,
        help="fp8: linear-layer weights stored as float8 e4m3 with per-channel scales, or per-tile for block-scaled checkpoints (quantized at build "
             "time from a "
             "float checkpoint, or read from an FP8 checkpoint: ModelOpt, compressed-tensors, fine-grained fp8). The graph carries "
             "DequantizeLinear, so TensorRT can run FP8 GEMMs; ONNX Runtime on CPU dequantizes once at load and computes in float32. "
             "int8_wo / int4_wo: weight-only integers (W8A16 / W4A16), round-to-nearest at build time, or read as they are from a GPTQ / AWQ / "
             "compressed-tensors checkpoint; int4_awq: int4 with activation-aware scales searched on --calib_dataset. See docs/precision.md. "
             "auto = what the checkpoint holds (fp8, int8_wo/int4_wo), else none; none on a quantized checkpoint dequantizes it.")
@option("use_weight_only", is_flag=True, help="TensorRT-LLM's spelling of --qformat int8_wo / int4_wo (with --weight_only_precision).")
@option("weight_only_precision", type=click.Choice(["int8", "int4"]), default=None,
        help="With --use_weight_only: int8 (W8A16) or int4 (W4A16) [default: int8, as TensorRT-LLM's].")
@option("group_size", type=int, default=None,
        help="Weight-only: input rows sharing one scale: 32, 64, 128, or 0 = one per output channel [default: 128 for int4, 0 for int8].")
@option("asymmetric", is_flag=True, help="Weight-only: a zero point per group as well as a scale (default: symmetric, zero at mid-range).")
@option("quantize_lm_head", is_flag=True,
        help="Weight-only: quantize the LM head too (off by default: it decides acceptance). Embeddings stay in --dtype; tied embeddings keep their "
             "float copy.")
@option("quantize_draft_heads", is_flag=True,
        help="Weight-only, with --speculative_decoding_mode medusa, eagle or peagle: quantize the draft heads as the target's layers (round to "
             "nearest, on the target's --cpu_kernels): Medusa's ResBlocks, or the EAGLE-3 / P-EAGLE module's layers and the fc that feeds it; "
             "their LM heads too with --quantize_lm_head. Off by default: the heads stay in --dtype. On a CPU float heads are a large share of "
             "each draft step's memory reads (docs/medusa-eagle.md).")
@option("fp8_activations", type=click.Choice(FP8_ACTIVATIONS), default="none", show_default=True,
        help="With fp8: how linear-layer inputs are scaled. none = weight-only; static = fixed scales (the checkpoint's "
             "input_scale, or calibrated with --calib_dataset); dynamic = amax of each step's input.")
@option("calib_dataset", type=click.Path(),
        help="UTF-8 text file to calibrate on: static FP8 activation scales (--fp8_activations static) or int4_awq's scales (needs the "
             "checkpoint's tokenizer.json).")
@option("calib_size", type=int, default=None, help="Calibration samples (chunks of up to 256 tokens) taken from --calib_dataset [default: 64].")
@option("backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
        help="onnxruntime runs everywhere (CPU); tensorrt compiles the same ONNX network into a TensorRT plan (NVIDIA GPU + TensorRT >= 10.15; "
             "untested in CI, see docs/tensorrt.md); tensorrt_rtx compiles it ahead of time with TensorRT for RTX for the GPUs of --target_sm, on "
             "any Linux host (no GPU needed; runs on RTX GPUs, not yet run: docs/tensorrt.md#tensorrt-for-rtx); torch writes the weights in the "
             "layout specdec's own torch forward reads (Triton kernels and CUDA graphs on an NVIDIA GPU, float32 on a CPU; building needs no torch: "
             "docs/gpu.md); auto picks onnxruntime and says whether TensorRT could be used.")
@option("target_sm", default=None,
        help="With --backend tensorrt_rtx: the RTX GPUs to build for, comma-separated: sm86 (RTX 30xx), sm89 (RTX 40xx), sm120 (RTX 50xx), sm121 "
             "(GB10). One engine each.")
@option("lowering", type=click.Choice(["auto", "portable", "ort_cpu", "ort_cuda", "torch"]), default="auto", show_default=True,
        help="How attention and the KV update become graph nodes (plugins/). auto = ort_cpu for onnxruntime, portable for tensorrt and tensorrt_rtx, "
             "torch for torch (no graph: the torch backend's own forward). "
             "ort_cuda: for --device cuda (ONNX Runtime's CUDA provider): computes in --dtype (bfloat16/float16), fused attention, CUDA graphs; see "
             "docs/gpu.md.")
@option("cpu_kernels", type=click.Choice(["ort", "specdec"]), default="ort", show_default=True,
        help="CPU engines (--lowering ort_cpu): ort = ONNX Runtime's own ops (MatMulNBits for int4/int8); specdec = specdec's own ops, "
             "compiled with the system C compiler on first use, here and on the hosts that run the engine (AVX-512 VNNI; AVX2 or portable C "
             "elsewhere): Q4Gemm / Q8Gemm for int4 / int8 weights (a verification step costs little more than a one-token step, no row "
             "padding), RotaryCachedAttention (a layer's rotary, cache write and attention over the cache in place; in a tree engine each node "
             "reads its ancestors in path order, so trees verify with a chain's bits) for engines of any precision, "
             "and SwiGLU (an MLP gate after a float or MatMulNBits gate|up) "
             "(docs/precision.md#specdecs-int4-kernel-q4gemm).")
@option("cuda_attention", type=click.Choice(["auto", "gqa", "masked"]), default="auto", show_default=True,
        help="With --lowering ort_cuda: gqa = GroupQueryAttention (fastest one-token decode; several tokens with a past only one row at a time, "
             "no trees); masked = TensorScatter + Attention with a mask (a verification round is one call at any batch size; Medusa/EAGLE trees). "
             "auto = masked for targets that verify drafts or trees, gqa otherwise. See docs/gpu.md.")
@option("trt_timing_cache", type=click.Path(dir_okay=False), default=None,
        help="TensorRT timing cache file: read if present, updated after the build (tensorrt backend).")
@option("trt_version_compatible", is_flag=True,
        help="Build a version-compatible TensorRT plan: it embeds its lean runtime, so hosts can run it with the small dispatch runtime "
             "(specdec[tensorrt-dispatch]) or a newer TensorRT of a supported major; may be slower. See docs/tensorrt.md.")
@option("trt_exclude_lean_runtime", is_flag=True,
        help="With --trt_version_compatible: leave the lean runtime out of the plan (smaller); then only tensorrt-lean or tensorrt of exactly the "
             "build's version can run it.")
@option("tp_size", type=int, default=1, show_default=True, help="Tensor-parallel ranks (only 1 is supported).")
@option("allow_pickle", is_flag=True,
        help="Allow loading pickled pytorch_model*.bin weights (unpickling can run arbitrary code: only for checkpoints you trust).")
@option("allow_nonfinite", is_flag=True, help="Build even if a weight holds NaN or Inf (refused by default: such an engine emits garbage).")
@option("force", is_flag=True,
        help="Replace the engine in a non-empty --output_dir (an engine and nothing else: other files are refused, never deleted).")
@clean_errors
def main(checkpoint_dir, output_dir, dtype, max_batch_size, max_input_len, max_seq_len, max_draft_len, speculative_decoding_mode, tree_attention,
         medusa_dir, eagle_dir, peagle_dir, quantization, use_weight_only, weight_only_precision, group_size, asymmetric, quantize_lm_head,
         quantize_draft_heads, fp8_activations, calib_dataset, calib_size, backend, target_sm, lowering, cpu_kernels, cuda_attention,
         trt_timing_cache, trt_version_compatible, trt_exclude_lean_runtime, tp_size, allow_pickle, allow_nonfinite, force, lora_dir,
         lora_scale) -> None:
    """Build an engine directory from a Hugging Face checkpoint (or a llama.cpp GGUF file).

    \b
    Target engine for draft-target or n-gram speculative decoding:
      specdec-build --checkpoint_dir ./llama --output_dir engines/target \\
          --speculative_decoding_mode draft_tokens_external --max_draft_len 8
    EAGLE-3 target (the module's engine goes into engines/target/eagle):
      specdec-build --checkpoint_dir ./llama --output_dir engines/target \\
          --speculative_decoding_mode eagle --eagle_dir ./llama-eagle3
    P-EAGLE target (its module drafts a whole block in one call):
      specdec-build --checkpoint_dir ./llama --output_dir engines/target \\
          --speculative_decoding_mode peagle --peagle_dir ./llama-peagle
    Draft engine (or a plain engine):
      specdec-build --checkpoint_dir ./llama-small --output_dir engines/draft
    A fine-tune's LoRA adapter merged into the base (peft's folder):
      specdec-build --checkpoint_dir ./llama --lora_dir ./llama-lora --output_dir engines/target \\
          --speculative_decoding_mode draft_tokens_external
    From llama.cpp's file (its Q4_0 blocks become an int4 engine, bit for bit):
      specdec-build --checkpoint_dir model-Q4_0.gguf --output_dir engines/target \\
          --speculative_decoding_mode draft_tokens_external --cpu_kernels specdec
    """
    _require_build_extra()  # the builder imports onnx only when it writes the network: check before any work
    from ..builder.memory import reuse_freed_memory

    reuse_freed_memory()  # a build's weight-sized temporaries reuse freed memory instead of faulting fresh pages in
    from ..builder.architectures import model_config_from_hf
    from ..builder.checkpoint import read_hf_config

    hf_config = read_hf_config(checkpoint_dir)
    _refuse_engine_dir(checkpoint_dir, hf_config)
    check_output_dir(output_dir, "--output_dir")  # before the work, not after it
    model = model_config_from_hf(hf_config)  # for the default limits; build_engine reads the weights
    if max_seq_len is None:
        max_seq_len = min(model.max_position_embeddings, 4096)
    if max_seq_len < 2:  # (before the defaults that follow from it name values nobody set)
        raise BuildConfigError(f"--max_seq_len {max_seq_len} must be >= 2: a prompt token and a generated one.")
    if max_input_len is None:
        max_input_len = max(1, max_seq_len // 2)
    if max_draft_len is None:
        max_draft_len = 8 if speculative_decoding_mode in ("draft_tokens_external", *TREE_MODES) else 0
    quantization = _weight_only_alias(quantization, use_weight_only, weight_only_precision)
    if tree_attention and speculative_decoding_mode != "draft_tokens_external" and speculative_decoding_mode not in TREE_MODES:
        raise BuildConfigError("--tree_attention needs --speculative_decoding_mode draft_tokens_external (a target); got "
                               f"{speculative_decoding_mode}{' (the default)' if speculative_decoding_mode == 'none' else ''}.")
    if calib_size is not None and calib_dataset is None:
        raise BuildConfigError("--calib_size counts samples of --calib_dataset, which is not given: pass both, or neither.")
    calib_size = 64 if calib_size is None else calib_size
    build = BuildConfig(
        dtype=dtype, max_batch_size=max_batch_size, max_input_len=max_input_len, max_seq_len=max_seq_len,
        max_draft_len=max_draft_len, speculative_decoding_mode=speculative_decoding_mode, backend=backend, tp_size=tp_size,
        quantization=quantization, fp8_activations=fp8_activations, lowering=lowering, cpu_kernels=cpu_kernels, cuda_attention=cuda_attention,
        group_size=group_size, symmetric=not asymmetric, quantize_lm_head=quantize_lm_head, quantize_draft_heads=quantize_draft_heads,
        tree_attention=tree_attention,
    )
    bars: list[tqdm] = []  # made on the first report, after the inputs were validated
    log_lines = _LogProgress(f"building {output_dir}")

    def progress(step: str, done: int, total: int) -> None:
        if not sys.stderr.isatty():  # a log or a pipe: plain lines for a long build, no '\r' frames
            log_lines(step, done, total)
            return
        if not bars:
            bars.append(tqdm(total=total, desc=f"building {output_dir}", unit="step", leave=False, dynamic_ncols=True))
        bars[0].set_postfix_str(step)
        bars[0].n = done
        bars[0].refresh()

    try:
        result = build_engine(checkpoint_dir, output_dir, build, force=force, allow_pickle=allow_pickle, progress=progress, say=tqdm.write,
                              calib_dataset=calib_dataset, calib_size=calib_size, trt_timing_cache=trt_timing_cache,
                              trt_version_compatible=trt_version_compatible, trt_exclude_lean_runtime=trt_exclude_lean_runtime, target_sm=target_sm,
                              allow_nonfinite=allow_nonfinite, medusa_dir=medusa_dir, eagle_dir=eagle_dir,
                              peagle_dir=peagle_dir, lora_dirs=lora_dir, lora_scales=lora_scale)
    finally:
        for bar in bars:
            bar.close()
    b = result.config.build
    wo = b.weight_only
    int_note = ""
    if wo:
        group = f"group {wo['group_size']}" if wo["group_size"] else "per channel"
        int_note = (f", int{wo['bits']} weights ({group}, {'symmetric' if wo['symmetric'] else 'asymmetric'}, "
                    f"{wo['source']}{', lm_head' if 'lm_head' in wo['layers'] else ''})")
    click.echo(
        f"built {result.output_dir}  [{model.architecture}, {result.num_parameters / 1e6:.2f}M params, {b.dtype}"
        f"{', fp8 weights' if b.quantization == 'fp8' else ''}{int_note}"
        f"{f' + fp8 {b.fp8_activations} activations' if b.fp8_activations != 'none' else ''}, "
        f"backend {b.backend}]\n"
        f"  limits: batch {b.max_batch_size}, input {b.max_input_len}, seq {b.max_seq_len}, draft {b.max_draft_len} ({b.speculative_decoding_mode})\n"
        f"  size {human_bytes(result.engine_bytes)}, {len(result.config.files)} files, {result.seconds:.1f}s"
    )
    if result.backend_summary:  # what the backend made beyond the network (builder/backends/: Compiled.summary)
        click.echo(f"  {result.backend_summary}")
    if b.speculative_decoding_mode in ("eagle", "peagle"):
        title = "EAGLE-3" if b.speculative_decoding_mode == "eagle" else "P-EAGLE"
        click.echo(f"  {title} module engine: {Path(result.output_dir) / EAGLE_MODULE_DIR}  "
                   f"[{b.eagle_num_layers} layer(s), fed by layers {', '.join(map(str, b.eagle_aux_layer_ids))} through eagle_hidden"
                   f"{', weight-only as the target (its layers and the fc)' if b.quantize_draft_heads else ''}]")
    if b.speculative_decoding_mode in TREE_MODES and b.weight_only is not None and not b.quantize_draft_heads:
        # on a CPU the heads' float weights are much of a draft step's memory reads
        click.echo(f"  the draft heads are in {b.dtype}; --quantize_draft_heads builds them as the target's layers (docs/medusa-eagle.md)")


def _weight_only_alias(quantization: str, use_weight_only: bool, precision: str | None) -> str:
    """TensorRT-LLM's --use_weight_only --weight_only_precision int8|int4 -> --qformat int8_wo|int4_wo."""
    if precision is not None and not use_weight_only:
        raise BuildConfigError(f"--weight_only_precision {precision} needs --use_weight_only (or use --qformat {precision}_wo).")
    if not use_weight_only:
        return quantization
    wanted = f"{precision or 'int8'}_wo"  # TensorRT-LLM's default precision is int8
    if quantization not in ("auto", wanted):
        raise BuildConfigError(f"--use_weight_only --weight_only_precision {precision or 'int8'} means --qformat {wanted}, not {quantization}; pass "
                               "one of the two.")
    return wanted


def _refuse_engine_dir(checkpoint_dir: str, hf_config: dict) -> None:
    """An engine directory given as the checkpoint: say so (its config.json is ours, not Hugging Face's)."""
    if not (is_engine_config(hf_config) and "files" in hf_config):
        return
    source = (hf_config.get("extra") or {}).get("checkpoint")
    hint = f" It was built from {source}; pass that." if source and Path(source).is_dir() else " Pass the Hugging Face checkpoint it was built from."
    raise CheckpointError(f"--checkpoint_dir {checkpoint_dir} is an engine directory (made by specdec-build), not a Hugging Face checkpoint.{hint}")


if __name__ == "__main__":
    main()
