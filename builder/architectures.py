"""Supported architectures: a registry keyed by ``config.architectures[0]``.

Each entry says only how the family differs from Llama. The network builder
reads a normalised ``ModelConfig``; everything family-specific is decided here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..runtime.engine_format import ModelConfig
from ..runtime.errors import CheckpointError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclass(frozen=True)
class Family:
    qkv_bias: Callable[[dict[str, Any]], bool]
    qk_norm: bool
    # name of the config field that holds a sliding attention window, if any
    sliding_window_active: Callable[[dict[str, Any]], int | None]
    # Phi-3 stores q|k|v as one self_attn.qkv_proj and gate|up as one mlp.gate_up_proj, in the order the
    # network splits them: each is read as one module
    fused_projections: bool = False


def _never(_: dict[str, Any]) -> None:
    return None


def _mistral_window(cfg: dict[str, Any]) -> int | None:
    return cfg.get("sliding_window")


def _qwen_window(cfg: dict[str, Any]) -> int | None:
    # Qwen2/3 write sliding_window but only use it when use_sliding_window is true.
    return cfg.get("sliding_window") if cfg.get("use_sliding_window") else None


ARCHITECTURES: dict[str, Family] = {
    "LlamaForCausalLM": Family(lambda c: bool(c.get("attention_bias", False)), False, _never),
    "MistralForCausalLM": Family(lambda c: False, False, _mistral_window),
    "Qwen2ForCausalLM": Family(lambda c: True, False, _qwen_window),
    "Qwen3ForCausalLM": Family(lambda c: bool(c.get("attention_bias", False)), True, _qwen_window),
    # transformers masks Phi-3's window whenever sliding_window is set (Phi-3-mini-4k: 2047)
    "Phi3ForCausalLM": Family(lambda c: False, False, _mistral_window, fused_projections=True),
}


def _rope(cfg: dict[str, Any], max_seq_len: int | None = None) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and scaling, from either spelling.

    Published checkpoints write ``rope_theta`` + ``rope_scaling`` ({"type"|"rope_type": ...});
    transformers 5.x writes ``rope_parameters`` = {"rope_type", "rope_theta", ...}.
    """
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:  # per-layer-type form
        params = params["full_attention"]
    scaling = dict(params) if isinstance(params, dict) else dict(cfg.get("rope_scaling") or {})
    theta = float(scaling.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    # transformers 5 copies partial_rotary_factor into rope_parameters (Phi-4-mini: 0.75): refuse it there too
    partial = scaling.pop("partial_rotary_factor", None)
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"partial_rotary_factor {partial} is not supported (field rope_parameters.partial_rotary_factor); expected 1.0.")
    if rope_type in ("su", "yarn") and (cfg.get("architectures") or [None])[0] == "Phi3ForCausalLM":
        rope_type = "longrope"  # transformers reads Phi-3's older spellings as longrope
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"rope_scaling type {rope_type!r} is not supported (field rope_scaling/rope_parameters); "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}."
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        return theta, _longrope(cfg, scaling, max_seq_len)
    if "factor" not in scaling:
        raise CheckpointError(f"rope_scaling of type {rope_type!r} needs a 'factor' field.")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in scaling:
                raise CheckpointError(f"rope_scaling of type 'llama3' needs the field {key!r}.")
    return theta, {"rope_type": rope_type, **{k: v for k, v in scaling.items() if v is not None}}


def _longrope(cfg: dict[str, Any], scaling: dict[str, Any], max_seq_len: int | None) -> dict[str, Any]:
    """LongRoPE (Phi-3 128k), as transformers computes it for sequences up to original_max_position_embeddings.

    transformers rescales with short_factor while a sequence fits the pretraining length and switches every
    position, cached keys' rotations aside, to long_factor once it is longer: no fixed table reproduces that
    switch, so an engine whose sequences could pass that length is refused.
    """
    for key in ("short_factor", "long_factor"):
        if not isinstance(scaling.get(key), list):
            raise CheckpointError(f"rope_scaling of type 'longrope' needs the list field {key!r}.")
    # Phi-3 keeps the pretraining length beside rope_scaling, and transformers prefers that copy
    original = cfg.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
    if original is None:
        raise CheckpointError("rope_scaling of type 'longrope' needs the field 'original_max_position_embeddings'.")
    original = int(original)
    if max_seq_len is not None and max_seq_len > original:
        raise CheckpointError(
            f"rope_scaling type 'longrope' (field rope_scaling) is supported only up to original_max_position_embeddings="
            f"{original}, not max_seq_len={max_seq_len}: past it transformers switches to long_factor mid-sequence. "
            f"Build with --max_seq_len {original} or less."
        )
    factor = scaling.get("factor")
    if factor is None:  # transformers' Phi-3 rule: the context extension ratio
        factor = int(cfg.get("max_position_embeddings", original)) / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:  # the LongRoPE paper's cos/sin scale, applied at every length
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in scaling["short_factor"]],
        "long_factor": [float(f) for f in scaling["long_factor"]],
        "original_max_position_embeddings": original,
        "attention_factor": float(attention_factor),
    }


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def model_config_from_hf(cfg: dict[str, Any], max_seq_len: int | None = None) -> ModelConfig:
    """Normalise a Hugging Face config.json; refuse anything we would build wrong."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"architecture {arch!r} (config.json field 'architectures') is not supported; "
            f"supported: {', '.join(ARCHITECTURES)}."
        )
    family = ARCHITECTURES[arch]
    for required in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if required not in cfg:
            raise CheckpointError(f"config.json lacks the field {required!r}, which {arch} needs.")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act {cfg['hidden_act']!r} is not supported (field hidden_act); expected 'silu'.")
    partial = cfg.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"partial_rotary_factor {partial} is not supported (field partial_rotary_factor); expected 1.0.")
    window = family.sliding_window_active(cfg)
    if window is not None and max_seq_len is not None and int(window) < max_seq_len:
        raise CheckpointError(
            f"sliding_window={window} is smaller than max_seq_len={max_seq_len}; sliding-window attention is not "
            f"implemented. Build with --max_seq_len {window} or less."
        )
    num_heads = int(cfg["num_attention_heads"])
    num_kv = int(cfg.get("num_key_value_heads") or num_heads)
    if num_heads % num_kv:
        raise CheckpointError(f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv}.")
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // num_heads)
    theta, scaling = _rope(cfg, max_seq_len)
    if scaling and scaling["rope_type"] == "longrope" and len(scaling["short_factor"]) != head_dim // 2:
        raise CheckpointError(f"rope_scaling.short_factor has {len(scaling['short_factor'])} entries; head_dim={head_dim} needs {head_dim // 2}.")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=family.qkv_bias(cfg),
        qk_norm=family.qk_norm,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=_eos_ids(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"),
    )


def checkpoint_dtype(cfg: dict[str, Any]) -> str:
    """The dtype the checkpoint says it holds (``dtype`` in transformers 5.x, ``torch_dtype`` before)."""
    value = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return str(value).removeprefix("torch.")
