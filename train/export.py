"""Write trained heads in ModelOpt's layout (layout.py says which and why): model.safetensors + config.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..formats.heads import CONFIG_FILE, EAGLE3_ARCHITECTURE, EAGLE_CONFIG_DEFAULTS, WEIGHTS_FILE


def medusa_config(base_config: dict, num_heads: int, num_layers: int, provenance: dict) -> dict:
    """The base's config.json plus ModelOpt's "medusa" block (HFMedusaModel.modify writes the same)."""
    cfg = copy.deepcopy(base_config)
    cfg["medusa"] = {"num_medusa_heads": num_heads, "num_medusa_layers": num_layers}
    cfg["specdec_train"] = provenance
    return cfg


def eagle_config(base_config: dict, eagle_cfg, aux_ids: list[int], provenance: dict) -> dict:
    """ModelOpt's EAGLE-3 export template (llama_eagle_template_config), filled from the EAGLE decoder and the base."""
    rope = getattr(eagle_cfg, "rope_parameters", None) or {}
    return {
        "architectures": [EAGLE3_ARCHITECTURE],
        "model_type": "llama",
        "bos_token_id": base_config.get("bos_token_id"),
        "eos_token_id": base_config.get("eos_token_id"),
        "pad_token_id": base_config.get("pad_token_id"),
        "hidden_act": eagle_cfg.hidden_act,
        "hidden_size": eagle_cfg.hidden_size,
        "initializer_range": eagle_cfg.initializer_range,
        "intermediate_size": eagle_cfg.intermediate_size,
        "max_position_embeddings": eagle_cfg.max_position_embeddings,
        "num_attention_heads": eagle_cfg.num_attention_heads,
        "num_key_value_heads": eagle_cfg.num_key_value_heads,
        "num_hidden_layers": eagle_cfg.num_hidden_layers,
        "head_dim": eagle_cfg.head_dim,
        "rms_norm_eps": eagle_cfg.rms_norm_eps,
        "rope_theta": rope.get("rope_theta"),
        "rope_scaling": dict(rope) or None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": eagle_cfg.vocab_size,
        "draft_vocab_size": eagle_cfg.vocab_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_ids), **EAGLE_CONFIG_DEFAULTS},
        "specdec_train": provenance,
    }


def head_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict as contiguous CPU tensors (safetensors refuses shared or strided storage)."""
    return {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}


def save_heads(module: nn.Module, config: dict, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(head_tensors(module), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
