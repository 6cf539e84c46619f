"""Write trained heads in ModelOpt's layout (layout.py says which and why): model.safetensors + config.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..formats.heads import CONFIG_FILE, EAGLE3_ARCHITECTURE, EAGLE_CONFIG_DEFAULTS, PEAGLE_DEPTHS_KEY, PLACEHOLDERS_KEY, PTD_TOKEN_KEY, WEIGHTS_FILE


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


def peagle_config(base_config: dict, eagle_cfg, aux_ids: list[int], mask_token_id: int, depths: int, provenance: dict,
                  placeholders: str = "constant") -> dict:
    """The EAGLE-3 export plus what P-EAGLE adds (vLLM's parallel-drafting names): ``ptd_token_id``, the token whose
    embedding placeholders read, and ``para_depths``, the drafting positions it was trained for; and ours,
    ``peagle_placeholders`` "anchored" when each depth's vector is added to the anchor's features (absent: vLLM's one
    constant placeholder). The tensor ``mask_hidden`` travels in model.safetensors."""
    cfg = eagle_config(base_config, eagle_cfg, aux_ids, provenance)
    specdec = cfg.pop("specdec_train")
    ours = {PLACEHOLDERS_KEY: placeholders} if placeholders != "constant" else {}
    return cfg | {PTD_TOKEN_KEY: mask_token_id, PEAGLE_DEPTHS_KEY: depths, **ours, "specdec_train": specdec}


def head_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict as contiguous CPU tensors (safetensors refuses shared or strided storage)."""
    return {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}


def save_heads(module: nn.Module, config: dict, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(head_tensors(module), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
