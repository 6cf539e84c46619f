"""Supported architectures: a registry keyed by ``config.architectures[0]``.

Each entry says only how the family differs from Llama. The network builder
reads a normalised ``ModelConfig``; everything family-specific is decided here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..formats.config_strings import shown_value
from ..formats.engine_format import ModelConfig
from ..formats.errors import CheckpointError
from ..formats.hf_config import INT32_MAX, ConfigFields

# frequency_factors is specdec's: one divisor per rotary frequency, as llama.cpp's rope_freqs tensor stores Llama 3.1's
# scaling (a GGUF file's config says it; builder/gguf_checkpoint.py)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "frequency_factors")


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

BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "phi3": "Phi3ForCausalLM"}  # a config.json without "architectures"


def _rope(cfg: ConfigFields, max_seq_len: int | None = None) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and scaling, from either spelling.

    Published checkpoints write ``rope_theta`` + ``rope_scaling`` ({"type"|"rope_type": ...});
    transformers 5.x writes ``rope_parameters`` = {"rope_type", "rope_theta", ...}.
    """
    params = cfg.section("rope_parameters")
    if params is not None and "full_attention" in params.cfg:  # per-layer-type form
        params = params.section("full_attention")
    fields = params or cfg.section("rope_scaling") or ConfigFields({}, "config.json's rope_scaling")
    theta = (fields if "rope_theta" in fields else cfg).number("rope_theta", 10000.0, above=True)
    scaling = {k: v for k, v in fields.cfg.items() if k not in ("rope_theta", "rope_type", "type")}
    rope_type = fields.cfg.get("rope_type") or fields.cfg.get("type") or "default"
    if not isinstance(rope_type, str):
        raise CheckpointError(f"{fields.where} names rope type {shown_value(rope_type, 40)}; expected one of {', '.join(SUPPORTED_ROPE_TYPES)}.")
    # transformers 5 copies partial_rotary_factor into rope_parameters (Phi-4-mini: 0.75): refuse it there too
    partial = scaling.pop("partial_rotary_factor", None)
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"partial_rotary_factor {shown_value(partial, 40)} is not supported (field rope_parameters.partial_rotary_factor); "
                              "expected 1.0.")
    if rope_type in ("su", "yarn") and cfg.cfg.get("architectures") == ["Phi3ForCausalLM"]:
        rope_type = "longrope"  # transformers reads Phi-3's older spellings as longrope
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"rope_scaling type {shown_value(rope_type, 40)} is not supported (field rope_scaling/rope_parameters); "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}."
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        return theta, _longrope(cfg, fields, max_seq_len)
    if rope_type == "frequency_factors":
        factors = fields.number_list("factors")
        if not factors or min(factors) <= 0:
            raise CheckpointError(f"{fields.where} of type 'frequency_factors' needs a non-empty list 'factors' of positive numbers.")
        return theta, {"rope_type": rope_type, "factors": factors}
    if "factor" not in scaling:
        raise CheckpointError(f"rope_scaling of type {rope_type!r} needs a 'factor' field.")
    checked = {"factor": fields.number("factor", above=True)}
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in scaling:
                raise CheckpointError(f"rope_scaling of type 'llama3' needs the field {key!r}.")
        checked |= {key: fields.number(key, above=True) for key in ("low_freq_factor", "high_freq_factor")}
        checked["original_max_position_embeddings"] = fields.int("original_max_position_embeddings")
    return theta, {"rope_type": rope_type, **{k: v for k, v in scaling.items() if v is not None}, **checked}


def _longrope(cfg: ConfigFields, scaling: ConfigFields, max_seq_len: int | None) -> dict[str, Any]:
    """LongRoPE (Phi-3 128k), as transformers computes it for sequences up to original_max_position_embeddings.

    transformers rescales with short_factor while a sequence fits the pretraining length and switches every
    position, cached keys' rotations aside, to long_factor once it is longer: no fixed table reproduces that
    switch, so an engine whose sequences could pass that length is refused.
    """
    for key in ("short_factor", "long_factor"):
        if not isinstance(scaling.cfg.get(key), list):
            raise CheckpointError(f"rope_scaling of type 'longrope' needs the list field {key!r}.")
    # Phi-3 keeps the pretraining length beside rope_scaling, and transformers prefers that copy
    key = "original_max_position_embeddings"
    if key not in cfg and key not in scaling:
        raise CheckpointError("rope_scaling of type 'longrope' needs the field 'original_max_position_embeddings'.")
    original = (cfg if key in cfg else scaling).int(key)
    if max_seq_len is not None and max_seq_len > original:
        raise CheckpointError(
            f"rope_scaling type 'longrope' (field rope_scaling) is supported only up to original_max_position_embeddings="
            f"{original}, not max_seq_len={max_seq_len}: past it transformers switches to long_factor mid-sequence. "
            f"Build with --max_seq_len {original} or less."
        )
    # transformers' Phi-3 rule when factor is absent: the context extension ratio
    factor = scaling.number("factor", cfg.int("max_position_embeddings", original) / original, above=True)
    # the LongRoPE paper's cos/sin scale, applied at every length
    default_attention = 1.0 if factor <= 1.0 or original == 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {
        "rope_type": "longrope",
        "short_factor": scaling.number_list("short_factor"),
        "long_factor": scaling.number_list("long_factor"),
        "original_max_position_embeddings": original,
        "attention_factor": scaling.number("attention_factor", default_attention, above=True),
    }


def model_config_from_hf(hf_config: dict[str, Any], max_seq_len: int | None = None) -> ModelConfig:
    """Normalise a Hugging Face config.json; refuse anything we would build wrong, or could not read."""
    cfg = ConfigFields(hf_config)
    archs = hf_config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else archs
    if arch is None:  # as transformers' Auto classes read a config without the field: by its model_type
        arch = BY_MODEL_TYPE.get(hf_config.get("model_type"))
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise CheckpointError(
            f"architecture {shown_value(arch, 40)} (config.json field 'architectures') is not supported; "
            f"supported: {', '.join(ARCHITECTURES)}."
        )
    family = ARCHITECTURES[arch]
    for required in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if required not in cfg:
            raise CheckpointError(f"config.json lacks the field {required!r}, which {arch} needs.")
    if hf_config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act {shown_value(hf_config['hidden_act'], 40)} is not supported (field hidden_act); expected 'silu'.")
    partial = hf_config.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"partial_rotary_factor {shown_value(partial, 40)} is not supported (field partial_rotary_factor); expected 1.0.")
    window = family.sliding_window_active(hf_config)
    if window is not None:
        window = cfg.int("sliding_window")
        if max_seq_len is not None and window < max_seq_len:
            raise CheckpointError(
                f"sliding_window={window} is smaller than max_seq_len={max_seq_len}; sliding-window attention is not "
                f"implemented. Build with --max_seq_len {window} or less."
            )
    hidden, num_heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    num_kv = cfg.int("num_key_value_heads", num_heads)
    if num_heads % num_kv:
        raise CheckpointError(f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv}.")
    if "head_dim" not in cfg and hidden % num_heads:
        raise CheckpointError(f"hidden_size={hidden} is not a multiple of num_attention_heads={num_heads}, and config.json has no head_dim.")
    head_dim = cfg.int("head_dim", hidden // num_heads)
    theta, scaling = _rope(cfg, max_seq_len)
    if scaling and scaling["rope_type"] == "frequency_factors" and len(scaling["factors"]) != head_dim // 2:
        raise CheckpointError(f"rope frequency factors: {len(scaling['factors'])} of them; head_dim={head_dim} needs {head_dim // 2}.")
    if scaling and scaling["rope_type"] == "longrope" and len(scaling["short_factor"]) != head_dim // 2:
        raise CheckpointError(f"rope_scaling.short_factor has {len(scaling['short_factor'])} entries; head_dim={head_dim} needs {head_dim // 2}.")
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=cfg.int("intermediate_size"),
        num_layers=cfg.int("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        rms_norm_eps=cfg.number("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.int("max_position_embeddings", 2048),
        tie_word_embeddings=cfg.boolean("tie_word_embeddings", False),
        qkv_bias=family.qkv_bias(hf_config),
        qk_norm=family.qk_norm,
        bos_token_id=cfg.optional_int("bos_token_id", minimum=-INT32_MAX),  # early Llama configs write -1 for "none"
        eos_token_id=cfg.int_list("eos_token_id", minimum=-INT32_MAX),
        pad_token_id=cfg.optional_int("pad_token_id", minimum=-INT32_MAX),
    )


def checkpoint_dtype(cfg: dict[str, Any]) -> str:
    """The dtype the checkpoint says it holds (``dtype`` in transformers 5.x, ``torch_dtype`` before)."""
    value = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return str(value).removeprefix("torch.")
