"""Tiny real Hugging Face checkpoints, made on the fly with save_pretrained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

CONFIG_CLASSES = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "MistralForCausalLM": transformers.MistralConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
}


def make_checkpoint(path: Path, arch: str = "LlamaForCausalLM", dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> Path:
    """Save a randomly initialised model of ``arch`` to ``path`` (safetensors)."""
    torch.manual_seed(seed)
    cfg = CONFIG_CLASSES[arch](**{**TINY, **overrides})
    model = getattr(transformers, arch)(cfg).eval()
    # Random init gives near-uniform logits; sharpen them so greedy decoding is
    # decisive and a wrong cache shows up as a different token.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    model.to(dtype).save_pretrained(path, safe_serialization=True)
    return path


def load_hf(path: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
