"""The model as one ONNX graph: the engine ABI, written once per family.

Inputs
  input_ids      [batch, num_tokens]  int64
  position_ids   [batch, num_tokens]  int64   position (= cache slot) of each token
  logits_index   [batch, num_logits]  int64   which of the num_tokens rows get logits
  past_key.i / past_value.i  [batch, kv_heads, kv_capacity, head_dim] float32
Outputs
  logits         [batch, num_logits, vocab]   float32
  present_key.i / present_value.i  (bound to the past buffers: updated in place)

The context phase sends a whole prompt per row and asks for the last row's
logits; the generation phase sends 1 .. max_draft_len + 1 tokens per row and
asks for all of them (verifying k drafts needs k + 1 rows of logits).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto

from ..plugins import get_lowering
from ..plugins.attention import Shared
from ..runtime.engine_format import BuildConfig, ModelConfig
from .checkpoint import Checkpoint
from .graph import GraphBuilder
from .rope import cos_sin_tables

# Hugging Face name -> our name, per layer. A table, not a regex.
LAYER_WEIGHTS = {
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
}


def _shape(gb: GraphBuilder, name: str, dims: list[int]) -> str:
    return gb.const(name, np.array(dims, np.int64))


def build_network(ckpt: Checkpoint, cfg: ModelConfig, build: BuildConfig, on_layer: Callable[[int], None] | None = None):
    """Return the ONNX ModelProto of ``cfg`` with weights from ``ckpt``."""
    gb = GraphBuilder(weight_dtype=build.dtype)
    lowering = get_lowering(build.lowering)(gb, cfg)
    ids = gb.input("input_ids", TensorProto.INT64, ["batch", "num_tokens"])
    positions = gb.input("position_ids", TensorProto.INT64, ["batch", "num_tokens"])
    logits_index = gb.input("logits_index", TensorProto.INT64, ["batch", "num_logits"])

    cos, sin = cos_sin_tables(cfg, build.kv_capacity)
    shared = lowering.prelude(Shared(positions=positions, cos=gb.const("rope_cos", cos), sin=gb.const("rope_sin", sin)))

    embed = gb.weight("model.embed_tokens.weight", ckpt.float32("model.embed_tokens.weight"))
    x = gb.op("Gather", [embed, ids], "/model/embed_tokens")
    for i in range(cfg.num_layers):
        x = _decoder_layer(gb, lowering, ckpt, cfg, i, x, shared)
        if on_layer:
            on_layer(i)

    # Only the rows the caller asked for go through the final norm and lm_head.
    rows = gb.op("Unsqueeze", [logits_index, gb.const("/model/axis_last", np.array([-1], np.int64))], "/model/logits_rows")
    x = gb.op("GatherND", [x, rows], "/model/gather_logit_rows", batch_dims=1)
    x = _rms_norm(gb, "/model/norm", x, ckpt.float32("model.norm.weight"), cfg.rms_norm_eps)
    if cfg.tie_word_embeddings or "lm_head.weight" not in ckpt:
        lm_head = gb.op("Transpose", [embed], "/lm_head/tied_weight_t", perm=[1, 0])
    else:
        lm_head = gb.weight("lm_head.weight", ckpt.float32("lm_head.weight").T)
    gb.op("MatMul", [x, lm_head], "/lm_head/matmul", outputs=["logits"])
    gb.output("logits", TensorProto.FLOAT, ["batch", "num_logits", cfg.vocab_size])
    return gb.model(f"specdec_{cfg.architecture}", extra_opsets=lowering.extra_opsets)


def _rms_norm(gb: GraphBuilder, name: str, x: str, weight: np.ndarray, eps: float) -> str:
    w = gb.weight(f"{name}.weight", weight)
    return gb.op("RMSNormalization", [x, w], name, axis=-1, epsilon=eps)


def _linear(gb: GraphBuilder, name: str, x: str, weight_t: np.ndarray, bias: np.ndarray | None = None) -> str:
    """x @ weight_t (+ bias); weight_t is [in, out]."""
    y = gb.op("MatMul", [x, gb.weight(f"{name}.weight", weight_t)], name)
    if bias is not None:
        y = gb.op("Add", [y, gb.weight(f"{name}.bias", bias)], f"{name}/bias")
    return y


def _decoder_layer(gb: GraphBuilder, lowering, ckpt: Checkpoint, cfg: ModelConfig, i: int, x: str, shared: Shared) -> str:
    p = f"/model/layers.{i}"

    def w(key: str) -> np.ndarray:
        return ckpt.float32(f"model.layers.{i}.{LAYER_WEIGHTS[key]}")

    nh, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = _rms_norm(gb, f"{p}/input_layernorm", x, w("input_layernorm"), cfg.rms_norm_eps)
    # One fused q|k|v projection: a third of the MatMul calls.
    qkv_t = np.concatenate([w("q_proj").T, w("k_proj").T, w("v_proj").T], axis=1)
    bias = np.concatenate([w("q_bias"), w("k_bias"), w("v_bias")]) if cfg.qkv_bias else None
    qkv = _linear(gb, f"{p}/attn/qkv_proj", h, qkv_t, bias)
    split = _shape(gb, f"{p}/attn/qkv_split", [nh * hd, kvh * hd, kvh * hd])
    q, k, v = gb.op("Split", [qkv, split], f"{p}/attn/qkv_split_op", num_outputs=3, axis=-1)
    q = gb.op("Reshape", [q, _shape(gb, f"{p}/attn/q_shape", [0, 0, nh, hd])], f"{p}/attn/q_heads")
    k = gb.op("Reshape", [k, _shape(gb, f"{p}/attn/k_shape", [0, 0, kvh, hd])], f"{p}/attn/k_heads")
    v = gb.op("Reshape", [v, _shape(gb, f"{p}/attn/v_shape", [0, 0, kvh, hd])], f"{p}/attn/v_heads")
    if cfg.qk_norm:
        q = _rms_norm(gb, f"{p}/attn/q_norm", q, w("q_norm"), cfg.rms_norm_eps)
        k = _rms_norm(gb, f"{p}/attn/k_norm", k, w("k_norm"), cfg.rms_norm_eps)
    attn = lowering.layer(f"{p}/attn", q, k, v, i, shared)
    x = gb.op("Add", [x, _linear(gb, f"{p}/attn/o_proj", attn, w("o_proj").T)], f"{p}/attn/residual")

    h = _rms_norm(gb, f"{p}/post_attention_layernorm", x, w("post_attention_layernorm"), cfg.rms_norm_eps)
    gate_up_t = np.concatenate([w("gate_proj").T, w("up_proj").T], axis=1)
    gate_up = _linear(gb, f"{p}/mlp/gate_up_proj", h, gate_up_t)
    gate, up = gb.op("Split", [gate_up, _shape(gb, f"{p}/mlp/split", [cfg.intermediate_size] * 2)], f"{p}/mlp/split_op", num_outputs=2, axis=-1)
    silu = gb.op("Mul", [gate, gb.op("Sigmoid", [gate], f"{p}/mlp/sigmoid")], f"{p}/mlp/silu")
    down = _linear(gb, f"{p}/mlp/down_proj", gb.op("Mul", [silu, up], f"{p}/mlp/gated"), w("down_proj").T)
    return gb.op("Add", [x, down], f"{p}/mlp/residual")
