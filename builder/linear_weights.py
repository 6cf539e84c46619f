"""A layer's weights as the checkpoint gives them, fused and quantized as the build asks: what every network writer reads.

builder/network.py writes them into an ONNX graph (its ``_Linears`` adds the graph side); builder/torch_network.py
writes them into the torch backend's safetensors files. Both read the checkpoint through this class, so an engine
of either kind holds the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..formats.engine_format import BuildConfig
from .checkpoint import Checkpoint
from .quantization import Fp8Convention, IntConvention, LinearWeight, concat_out, quantize_fp8_per_channel, read_linear
from .weight_only import IntWeight, WeightOnlyScheme, quantize_rtn

# Hugging Face name -> our name, per layer. A table, not a regex.
LAYER_WEIGHTS = {
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
    "qkv_proj": "self_attn.qkv_proj",  # Phi-3: q|k|v in one module, in the order the network splits them
    "gate_up_proj": "mlp.gate_up_proj",  # Phi-3: gate|up in one module (transformers chunks gate first)
}  # linear layers name the module: the weight (and any FP8 scales) hang off it


def layer_names(ckpt: Checkpoint, i: int) -> tuple[Callable[[str], np.ndarray], Callable[..., list[str]]]:
    """(w, mod) of layer i: w(key) reads a LAYER_WEIGHTS tensor, mod(*keys) names linear modules."""

    def w(key: str) -> np.ndarray:
        return ckpt.float32(f"model.layers.{i}.{LAYER_WEIGHTS[key]}")

    def mod(*keys: str) -> list[str]:
        return [f"model.layers.{i}.{LAYER_WEIGHTS[k]}" for k in keys]

    return w, mod


class LinearWeights:
    """Linear layers' weights, dense, FP8 or weight-only int8/int4, by the network's layer names."""

    def __init__(self, ckpt: Checkpoint, build: BuildConfig, convention: Fp8Convention | IntConvention | None, awq_layers: dict):
        self.ckpt, self.build, self.convention, self.awq_layers = ckpt, build, convention, awq_layers
        self.scheme = WeightOnlyScheme.of(build)  # None unless int8_wo / int4_wo / int4_awq

    def weights(self, name: str, modules: list[str]) -> LinearWeight:
        """The projections ``modules`` fused along the output axis, in the build's precision."""
        parts = [read_linear(self.ckpt, m, self.convention) for m in modules]
        if getattr(self.convention, "method", None) == "gguf" and len({p.is_int for p in parts}) > 1:
            # a GGUF file may give fused projections different types (llama-quantize --tensor-type): the group is read as float
            parts = [LinearWeight(dense=p.dequantized(), name=p.name) if p.is_int else p for p in parts]
        w = concat_out(parts)
        q = self.build.quantization
        if q == "fp8" and not w.is_fp8:
            w = quantize_fp8_per_channel(w.dense)
        elif q == "none" and (w.is_fp8 or w.is_int):
            w = LinearWeight(dense=w.dequantized())
        elif self.scheme is not None and w.dense is not None and not isinstance(self.convention, IntConvention):
            # a float checkpoint: round to nearest, after AWQ's scaling of the input channels when it has one;
            # a layer an integer checkpoint left in float stays float
            w = LinearWeight(int_weight=self.quantize(name, w.dense))
        return w

    def quantize(self, name: str, w_t: np.ndarray) -> IntWeight:
        awq, scheme = self.awq_layers.get(name), self.scheme
        if awq is None:
            return quantize_rtn(w_t, scheme.bits, scheme.group_size, scheme.symmetric)
        # Q(s W) (clipped per group), source "awq": the layer computes (x / s) @ deq(q), its 1/s folded into
        # the norm before it, or multiplied in
        return awq.quantize(w_t, scheme.bits, scheme.group_size, scheme.symmetric)

    def awq_inverse(self, name: str) -> np.ndarray | None:
        """1 / s of an AWQ-scaled layer (to fold into the norm that feeds it), or None."""
        awq = self.awq_layers.get(name)
        return None if awq is None else (1.0 / np.asarray(awq.scale, np.float64)).astype(np.float32)

    def norm_weight(self, name: str, weight: np.ndarray) -> np.ndarray:
        """An RMSNorm's weight, times AWQ's 1/s of the one linear layer ``name`` it feeds (exact up to a float rounding)."""
        inverse = self.awq_inverse(name)
        return weight if inverse is None else weight * inverse
