"""Tiny real Hugging Face checkpoints, made on the fly with save_pretrained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

from specdec.builder.weight_only import quantize_rtn

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
    "Phi3ForCausalLM": transformers.Phi3Config,
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


LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")


def is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in LINEAR_SUFFIXES


def save_fp8_checkpoint(src: Path, dst: Path, convention: str = "modelopt", block: int = 32) -> dict[str, torch.Tensor]:
    """Re-save ``src`` with FP8 e4m3 linear weights, the way published FP8 checkpoints lay them out.

    modelopt: per-tensor weight_scale + input_scale; compressed-tensors: per-channel
    weight_scale [out, 1]; fp8: weight_scale_inv per [block, block] tile.
    Returns the dequantized weights (the independent torch reference).
    """
    import json

    from safetensors.torch import save_file

    tensors = copy_without_weights(src, dst)
    out, reference = {}, {}
    for name, w in tensors.items():
        if not is_linear(name):
            out[name] = w
            continue
        w = w.float()
        base = name[: -len(".weight")]
        if convention == "modelopt":
            scale = w.abs().max() / 448.0
            q = (w / scale).to(torch.float8_e4m3fn)
            out[f"{base}.weight_scale"] = scale.reshape(())
            out[f"{base}.input_scale"] = torch.tensor(0.05)
            deq = q.float() * scale
        elif convention == "compressed-tensors":
            scale = w.abs().amax(dim=1, keepdim=True) / 448.0
            q = (w / scale).to(torch.float8_e4m3fn)
            out[f"{base}.weight_scale"] = scale
            deq = q.float() * scale
        elif convention == "fp8":
            o, i = w.shape
            tiles = w.reshape(o // block, block, i // block, block)
            scale = tiles.abs().amax(dim=(1, 3)) / 448.0
            q = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn).reshape(o, i)
            out[f"{base}.weight_scale_inv"] = scale
            deq = (q.float().reshape(o // block, block, i // block, block) * scale[:, None, :, None]).reshape(o, i)
        else:
            raise ValueError(convention)
        out[name] = q
        reference[name] = deq
    save_file(out, dst / "model.safetensors")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {
        "modelopt": {"quant_method": "modelopt", "quant_algo": "FP8"},
        "compressed-tensors": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
        },
        "fp8": {"quant_method": "fp8", "weight_block_size": [block, block]},
    }[convention]
    (dst / "config.json").write_text(json.dumps(cfg))
    return reference


def hf_with_weights(src: Path, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = load_hf(src)
    state = model.state_dict()
    with torch.no_grad():
        for name, w in weights.items():
            state[name].copy_(w)
    return model


SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3; eos = 2 as in TINY


def add_word_tokenizer(ckpt: Path) -> Path:
    """Words w4..w95, one per id: text prompts become known token ids, and decoded outputs are words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = SPECIAL + [f"w{i}" for i in range(len(SPECIAL), 96)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                                                            "add_bos_token": True}))
    return ckpt


def copy_without_weights(src: Path, dst: Path) -> dict:
    """Copy checkpoint ``src`` to a new ``dst`` except model.safetensors; return its tensors (torch) to re-save."""
    import shutil

    from safetensors.torch import load_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    return load_file(src / "model.safetensors")


def write_eagle_module(base_ckpt: Path, out: Path, num_layers: int = 2, aux_ids: list[int] | None = None, seed: int = 1, scale: float = 2.0):
    """An EAGLE-3 module of random weights for ``base_ckpt``, in ModelOpt's layout (specdec-train's export).

    Norms away from 1 and sharp projections, so that a wrong wiring shows. Returns the torch Eagle3Module."""
    from specdec.train.eagle import Eagle3Module, eagle_llama_config
    from specdec.train.export import eagle_config, save_heads

    base_cfg = json.loads((base_ckpt / "config.json").read_text())
    aux_ids = [0, base_cfg["num_hidden_layers"] - 1] if aux_ids is None else aux_ids
    hf = load_hf(base_ckpt)
    cfg = eagle_llama_config(hf.config, num_layers)
    torch.manual_seed(seed)
    module = Eagle3Module(cfg, len(aux_ids), hf.lm_head.weight.detach()).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name != "lm_head.weight":
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) * scale / p.shape[1] ** 0.5)
    save_heads(module, eagle_config(base_cfg, cfg, aux_ids, {"test": True}), out)
    return module


def write_peagle_module(base_ckpt: Path, out: Path, num_layers: int = 2, aux_ids: list[int] | None = None, seed: int = 1, scale: float = 2.0,
                        mask_token_id: int = 3, depths: int = 6, placeholders: str = "anchored", trained: dict | None = None):
    """A P-EAGLE module of random weights for ``base_ckpt`` (specdec-train --mode peagle's export; ``placeholders``:
    anchored, ours, or constant, vLLM's; ``trained``: more of its specdec_train provenance, e.g. peagle_refine).
    Returns the torch PEagleModule."""
    from specdec.train.eagle import eagle_llama_config
    from specdec.train.export import peagle_config, save_heads
    from specdec.train.peagle import PEagleModule

    base_cfg = json.loads((base_ckpt / "config.json").read_text())
    aux_ids = [0, base_cfg["num_hidden_layers"] - 1] if aux_ids is None else aux_ids
    hf = load_hf(base_ckpt)
    cfg = eagle_llama_config(hf.config, num_layers)
    torch.manual_seed(seed)
    module = PEagleModule(cfg, len(aux_ids), hf.lm_head.weight.detach(), hf.get_input_embeddings().weight[mask_token_id],
                          anchored=placeholders == "anchored", placeholders=depths - 1).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name == "mask_hidden":
                p.normal_()
            elif name != "lm_head.weight":
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) * scale / p.shape[1] ** 0.5)
    save_heads(module, peagle_config(base_cfg, cfg, aux_ids, mask_token_id, depths, {"test": True, **(trained or {})}, placeholders), out)
    return module


def write_medusa_heads(base_ckpt: Path, out: Path, num_heads: int = 2, num_layers: int = 1, seed: int = 1):
    """Medusa heads for ``base_ckpt`` in ModelOpt's layout (specdec-train's export), as a fresh run initialises them."""
    from specdec.train.export import medusa_config, save_heads
    from specdec.train.medusa import MedusaHeads

    base_cfg = json.loads((base_ckpt / "config.json").read_text())
    torch.manual_seed(seed)
    heads = MedusaHeads(base_cfg["hidden_size"], base_cfg["vocab_size"], num_heads, num_layers, load_hf(base_ckpt).lm_head.weight.detach())
    save_heads(heads, medusa_config(base_cfg, num_heads, num_layers, {"test": True}), out)
    return heads


def dequantized_checkpoint(src: Path, dst: Path, bits: int, group: int, sym: bool = True, lm_head: bool = False) -> Path:
    """The checkpoint with every linear weight replaced by its round-to-nearest dequantization (the float reference)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    tensors = load_file(src / "model.safetensors")
    for name, w in tensors.items():
        if is_linear(name) or (lm_head and name == "lm_head.weight"):
            # the engine fuses q|k|v and gate|up along the output axis; groups run along the input axis, so
            # quantizing each projection alone gives the same codes and scales
            tensors[name] = np.ascontiguousarray(quantize_rtn(w.T, bits, group, sym).dequantized().T)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst
