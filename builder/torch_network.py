"""The torch backend's network: the checkpoint's tensors in the layout runtime/backends/torch reads, no graph.

formats/torch_layout.py names every file and tensor. The numbers are the ONNX network's (builder/network.py): both
read the checkpoint through builder/linear_weights.py (q|k|v and gate|up fused, weight-only rounding, AWQ's 1/s
folded into the norm before a layer), the rotary tables come from builder/rope.py, and a Medusa target's heads and
an EAGLE-3 target's fc are the same tensors. Written with numpy only (formats/safetensors_io.py's writer), one
decoder layer per file, so at most one layer is held in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..formats.engine_format import BuildConfig, ModelConfig
from ..formats.safetensors_io import write_safetensors
from ..formats.torch_layout import DRAFT_TO_TARGET, MODEL_FILE, layer_file, pack_int4
from .architectures import ARCHITECTURES
from .checkpoint import Checkpoint
from .linear_weights import LinearWeights, layer_names
from .quantization import Fp8Convention, IntConvention, LinearWeight
from .rope import cos_sin_tables

OP = "specdec's weight-only GEMM (runtime/backends/torch/kernels/gemm.py; its torch reference on a CPU)"


@dataclass
class Written:
    """What the writer made, for config.json and specdec-build's report."""

    network_file: str = MODEL_FILE
    int_layers: list[str] = field(default_factory=list)  # linear layers stored as int8/int4, by the ONNX network's names
    act_order: bool = False  # some layer gathers its input channels (GPTQ g_idx)
    num_parameters: int = 0

    def record(self, build: BuildConfig, convention=None) -> dict | None:
        """What config.json says about the weight-only layers written (builder/build.py's weight_only_record)."""
        from .build import weight_only_record

        return weight_only_record(build, convention, self.int_layers, OP, self.act_order)


class _Tensors:
    """One file's tensors in the engine's dtype (float32 scales, rope tables and integer codes as they are)."""

    def __init__(self, dtype: str, written: Written):
        self.dtype, self.written, self.tensors = dtype, written, {}

    def float(self, name: str, value: np.ndarray) -> None:
        value = np.asarray(value, np.float32)
        if self.dtype == "bfloat16":
            import ml_dtypes  # the build extra's (onnx needs it)

            value = value.astype(ml_dtypes.bfloat16)
        elif self.dtype == "float16":
            value = value.astype(np.float16)
        self.tensors[name] = np.ascontiguousarray(value)
        self.written.num_parameters += value.size if not name.endswith(".input_scale") else 0

    def head(self, name: str, w: np.ndarray, kind: str, linears: LinearWeights | None, bias: np.ndarray | None = None) -> None:
        """A LINEAR outside the decoder layers (an LM head, a draft head's layer), ``w`` [out, in]: weight-only, rounded to
        nearest through ``linears`` and recorded as ``kind``; in float where ``linears`` is None."""
        if linears is None:
            self.float(f"{name}.weight", w)
            if bias is not None:
                self.float(f"{name}.bias", bias)
            return
        self.linear(name, LinearWeight(int_weight=linears.quantize(kind, np.asarray(w).T)), bias)
        self.written.int_layers.append(kind)

    def linear(self, name: str, w: LinearWeight, bias: np.ndarray | None = None, input_scale: np.ndarray | None = None) -> None:
        """A LINEAR (formats/torch_layout.py): dense [out, in], or weight-only codes, scales and zero points."""
        if w.is_int:
            iw = w.int_weight
            self.tensors[f"{name}.qweight"] = pack_int4(iw.codes) if iw.bits == 4 else np.ascontiguousarray(iw.codes, np.uint8)
            self.tensors[f"{name}.scales"] = np.ascontiguousarray(iw.scale, np.float32)
            self.tensors[f"{name}.zeros"] = np.ascontiguousarray(iw.zero, np.uint8)
            if iw.perm is not None:
                self.tensors[f"{name}.perm"] = np.asarray(iw.perm, np.int64)
                self.written.act_order = True
            self.written.num_parameters += iw.codes.size
        else:
            self.float(f"{name}.weight", w.dequantized().T)  # [out, in]: F.linear's layout
        if bias is not None:
            self.float(f"{name}.bias", bias)
        if input_scale is not None:
            self.float(f"{name}.input_scale", input_scale)


def write_torch_network(out_dir: Path, ckpt: Checkpoint, cfg: ModelConfig, build: BuildConfig, convention: Fp8Convention | IntConvention | None,
                        awq_layers: dict | None = None, medusa=None, eagle=None, on_layer: Callable[[int], None] | None = None) -> Written:
    """Write a target (or plain) model's files into ``out_dir``; medusa / eagle: the heads or EAGLE-3 module whose
    in-network part (Medusa's heads, EAGLE's fc) the target carries (formats.heads.HeadCheckpoint), or None."""
    written = Written()
    linears = LinearWeights(ckpt, build, convention, awq_layers or {})
    fused = ARCHITECTURES[cfg.architecture].fused_projections
    for i in range(cfg.num_layers):
        w, mod = layer_names(ckpt, i)
        files = _Tensors(build.dtype, written)
        _layer(files, linears, i, w, mod("qkv_proj") if fused else mod("q_proj", "k_proj", "v_proj"),
               mod("gate_up_proj") if fused else mod("gate_proj", "up_proj"), mod("o_proj"), mod("down_proj"), cfg)
        write_safetensors(out_dir / layer_file(i), files.tensors)
        if on_layer:
            on_layer(i)
    top = _Tensors(build.dtype, written)
    top.float("embed", ckpt.float32("model.embed_tokens.weight"))
    top.float("norm", ckpt.float32("model.norm.weight"))
    tied = cfg.tie_word_embeddings  # what decodes, as transformers reads the checkpoint (builder/lm_head.py)
    quantized_head = linears.scheme is not None and build.quantize_lm_head
    if quantized_head or not tied:  # a quantized copy for a tied head: the embedding stays in dtype
        top.head("lm_head", ckpt.float32("model.embed_tokens.weight" if tied else "lm_head.weight"), "lm_head", linears if quantized_head else None)
    _rope(top, cfg, build)
    draft = linears if linears.scheme is not None and build.quantize_draft_heads else None  # draft heads weight-only as the layers
    if medusa is not None:
        _medusa(top, medusa, draft, draft if build.quantize_lm_head else None)
    if eagle is not None:
        top.head("eagle_fc", eagle.tensors["fc.weight"], "eagle/fc", draft)  # [hidden, num_aux * hidden]
    write_safetensors(out_dir / MODEL_FILE, top.tensors)
    return written


def _layer(files: _Tensors, linears: LinearWeights, i: int, w, qkv_modules: list[str], gate_up_modules: list[str], o_modules: list[str],
           down_modules: list[str], cfg: ModelConfig) -> None:
    """Decoder layer i's tensors, named as the ONNX network names its linear layers (AWQ's search is keyed by them)."""
    p = f"/model/layers.{i}"
    files.float("input_norm", linears.norm_weight(f"{p}/attn/qkv_proj", w("input_layernorm")))
    files.float("post_norm", linears.norm_weight(f"{p}/mlp/gate_up_proj", w("post_attention_layernorm")))
    if cfg.qk_norm:
        files.float("q_norm", w("q_norm"))
        files.float("k_norm", w("k_norm"))
    bias = np.concatenate([w("q_bias"), w("k_bias"), w("v_bias")]) if cfg.qkv_bias else None
    for short, name, modules, folded in (("qkv", "attn/qkv_proj", qkv_modules, True), ("o", "attn/o_proj", o_modules, False),
                                         ("gate_up", "mlp/gate_up_proj", gate_up_modules, True), ("down", "mlp/down_proj", down_modules, False)):
        weight = linears.weights(f"{p}/{name}", modules)
        scale = None
        if weight.is_int:
            files.written.int_layers.append(f"{p}/{name}")
            if weight.int_weight.source == "awq" and not folded:  # o_proj / down_proj: no norm in front to fold AWQ's 1/s into
                scale = linears.awq_inverse(f"{p}/{name}")
        files.linear(short, weight, bias if short == "qkv" else None, scale)


def _rope(files: _Tensors, cfg: ModelConfig, build: BuildConfig) -> None:
    cos, sin = cos_sin_tables(cfg, build.kv_capacity)  # [kv_capacity, head_dim / 2]
    files.tensors["rope_cos"], files.tensors["rope_sin"] = cos, sin


def _medusa(files: _Tensors, heads, resblocks: LinearWeights | None, lm_heads: LinearWeights | None) -> None:
    """Head i: num_layers ResBlocks (h + SiLU(h W^T + b)), then its own LM head (builder/network.py's _medusa_heads);
    weight-only through ``resblocks`` / ``lm_heads`` (--quantize_draft_heads, and --quantize_lm_head), float where None."""
    t = heads.tensors
    for i in range(heads.num_heads):
        for j in range(heads.num_layers):
            files.head(f"medusa.{i}.{j}", t[f"medusa_heads.{i}.{j}.linear.weight"], "medusa/resblock", resblocks,
                       t[f"medusa_heads.{i}.{j}.linear.bias"])  # [hidden, hidden]
        files.head(f"medusa.{i}.lm_head", t[f"medusa_heads.{i}.{heads.num_layers}.weight"], "medusa/lm_head", lm_heads)  # [vocab, hidden]


def write_torch_eagle_module(out_dir: Path, base: Checkpoint, heads, cfg: ModelConfig, build: BuildConfig) -> Written:
    """An EAGLE-3 (P-EAGLE) module's own engine files (builder/eagle.py says what the module computes): the base's
    embedding, its layers (layer 0 with hidden_norm and 2 * hidden wide q|k|v inputs), its norm and lm_head; float unless
    ``build`` has a weight-only scheme (module_build_config: quantize_draft_heads). A P-EAGLE module's embedding has one
    more row, and its placeholder vectors beside it."""
    from .eagle import ModuleWeights

    written = Written()
    weights = ModuleWeights(heads)
    linears = LinearWeights(weights, build, None, {})
    for i in range(cfg.num_layers):
        w, mod = layer_names(weights, i)
        files = _Tensors(build.dtype, written)
        _layer(files, linears, i, w, mod("q_proj", "k_proj", "v_proj"), mod("gate_proj", "up_proj"), mod("o_proj"), mod("down_proj"), cfg)
        if i == 0:
            files.float("hidden_norm", weights.float32("model.layers.0.hidden_norm.weight"))
        write_safetensors(out_dir / layer_file(i), files.tensors)
    top = _Tensors(build.dtype, written)
    embed = base.float32("model.embed_tokens.weight")  # [vocab, hidden]
    if heads.mode == "peagle":
        embed = _placeholders(top, embed, heads)
    top.float("embed", embed)
    top.float("norm", weights.float32("norm.weight"))
    top.head("lm_head", weights.float32("lm_head.weight"), "lm_head", linears if linears.scheme is not None and build.quantize_lm_head else None)
    columns = heads.target_columns()
    if columns is not None:  # the map builder/eagle.py's graph gathers with
        top.tensors[DRAFT_TO_TARGET] = columns
    _rope(top, cfg, build)
    write_safetensors(out_dir / MODEL_FILE, top.tensors)
    return written


def _placeholders(files: _Tensors, embed: np.ndarray, heads) -> np.ndarray:
    """A P-EAGLE module's placeholder vectors (builder/eagle.py's _placeholders, the same constants): row 0 zeros for real
    tokens, row d depth d's fc(mask_hidden[d]), kept float32 as the ONNX module adds them. Returns the embedding with
    ptd_token_id's row appended (row vocab: what every placeholder reads)."""
    vectors = heads.placeholder_features().astype(np.float32)  # [D, hidden]
    offsets = np.concatenate([np.zeros((1, vectors.shape[1]), np.float32), vectors])  # [D + 1, hidden]
    files.tensors[f"placeholders.{heads.placeholder_form}"] = np.ascontiguousarray(offsets)  # formats/torch_layout.py's PLACEHOLDER_FORMS
    files.written.num_parameters += offsets.size
    return np.concatenate([embed, embed[heads.mask_token_id][None]])  # [vocab + 1, hidden]
