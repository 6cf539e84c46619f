"""GGUF files written from tiny Hugging Face checkpoints the way llama.cpp's convert_hf_to_gguf.py writes them.

gguf-py (llama.cpp's own package) does the writing, names the tensors (its ``get_tensor_name_map``, the converter's
table) and quantizes them (its Q4_0 / Q8_0 reference); what is written here by hand is what the converter does
around it: the metadata keys, the q/k row interleave of the ``llama`` architecture (``LlamaModel.permute``), Llama
3.1's rotary scaling as a ``rope_freqs`` tensor, and the byte-level BPE vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

GGUF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "Phi3ForCausalLM": "phi3"}
MODEL_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3, "phi3": gguf.MODEL_ARCH.PHI3}
LINEAR_TYPES = {"F32": None, "F16": None, "Q4_0": gguf.GGMLQuantizationType.Q4_0, "Q8_0": gguf.GGMLQuantizationType.Q8_0,
                "Q5_0": gguf.GGMLQuantizationType.Q5_0}  # Q5_0: a type specdec has no kernel for (as K-quants, which gguf-py cannot write)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows from [first half | second half] to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's rope_freqs for rope_type llama3: one divisor per frequency."""
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def write_gguf(ckpt: Path, out: Path, linear_type: str = "F32", embedding_type: str | None = None, chat_template: str | None = None,
               name: str | None = None, types: dict[str, str] | None = None, extra_keys: dict[str, int] | None = None) -> Path:
    """``ckpt`` (config.json + model.safetensors, optionally a byte-level BPE tokenizer.json) as the GGUF file ``out``.

    linear_type: the type of the blocks' matrices (F32, F16, Q4_0, Q8_0, Q5_0); embedding_type: token_embd's (default F32;
    llama-quantize leaves norms in F32 and quantizes the embedding too); types: other types for some matrices, by their
    name in a block ({"attn_v": "Q8_0"}: llama-quantize --tensor-type); extra_keys: more integer metadata, as written.
    """
    cfg = json.loads((ckpt / "config.json").read_text())
    arch = GGUF_ARCH[cfg["architectures"][0]]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0), **(cfg.get("rope_scaling") or {})}
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name or cfg["architectures"][0])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("sliding_window") and arch == "phi3":  # Phi3MiniModel.set_gguf_parameters writes it
        w.add_sliding_window(cfg["sliding_window"])
    for key, value in (extra_keys or {}).items():
        w.add_uint32(key, value)
    kind = rope.get("rope_type") or rope.get("type")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    _add_tokenizer(w, ckpt, cfg, chat_template)

    names = gguf.get_tensor_name_map(MODEL_ARCH[arch], cfg["num_hidden_layers"])
    for hf_name, value in sorted(load_file(str(ckpt / "model.safetensors")).items()):
        value = value.astype(np.float32)
        if arch == "llama" and ".q_proj." in hf_name:
            value = permute(value, heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            value = permute(value, kv_heads)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, hf_name
        block_matrix = gguf_name.startswith("blk.") and value.ndim == 2
        kind_here = (types or {}).get(gguf_name.split(".")[2], linear_type) if block_matrix else None
        _add(w, gguf_name, value, kind_here or (embedding_type if gguf_name == "token_embd.weight" and embedding_type else "F32"))
    if kind == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, head_dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add(w, name: str, value: np.ndarray, kind: str) -> None:
    if kind == "F16":
        w.add_tensor(name, value.astype(np.float16))
    elif LINEAR_TYPES.get(kind) is not None:
        w.add_tensor(name, gguf.quants.quantize(value, LINEAR_TYPES[kind]), raw_dtype=LINEAR_TYPES[kind])
    else:
        w.add_tensor(name, value)


def _add_tokenizer(w, ckpt: Path, cfg: dict, chat_template: str | None) -> None:
    """A byte-level BPE tokenizer.json as convert_hf_to_gguf.py's _set_vocab_gpt2 writes it."""
    tok_file = ckpt / "tokenizer.json"
    if not tok_file.is_file():
        return
    tok = json.loads(tok_file.read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab.update(special)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if by_id[i] in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id), ("pad_token_id", w.add_pad_token_id)):
        if isinstance(cfg.get(key), int):
            add(cfg[key])
    tok_config = json.loads((ckpt / "tokenizer_config.json").read_text()) if (ckpt / "tokenizer_config.json").is_file() else {}
    if "add_bos_token" in tok_config:  # gguf-py's SpecialVocab writes it when the tokenizer's config says it
        w.add_add_bos_token(bool(tok_config["add_bos_token"]))
    if chat_template:
        w.add_chat_template(chat_template)


def add_bpe_tokenizer(ckpt: Path, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens (ids 0-2 special: <pad> <s> </s>), trained on a few lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def push(self, x):\n        self.items.append(x)\n",
             "The quick brown fox jumps over the lazy dog.\n", "for i in range(10):\n    print(i * i)\n"] * 20
    tok.train_from_iterator(lines, trainer)
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False}))
    return ckpt
