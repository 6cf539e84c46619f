"""Invariant 1: engine logits match transformers on the same checkpoint.

Each case is a tiny random checkpoint saved with save_pretrained; the engine
runs a context phase, a 1-token step and a (k+1)-token step, and greedy
decoding of 32 tokens must equal model.generate(do_sample=False).
"""

import json

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint
from conftest import build_and_load, engine_greedy, spec_build

CASES = {
    "llama-gqa-tied": ("LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "llama-rope-llama3": (
        "LlamaForCausalLM",
        dict(rope_theta=50000.0,
             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)),
    ),
    "llama-rope-linear": ("LlamaForCausalLM", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None)),
    "qwen2-qkv-bias": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3-qk-norm-head-dim": ("Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=False)),
    # fused qkv_proj / gate_up_proj, GQA (TINY: 4 heads, 2 KV heads), Phi-3-mini-4k's window (wider than max_seq_len)
    "phi3-gqa": ("Phi3ForCausalLM", dict(sliding_window=2047)),
    # Phi-3-128k's LongRoPE within original_max_position_embeddings: short_factor, and cos/sin scaled by
    # sqrt(1 + ln(512 / 128) / ln(128)), both far from 1 so that a table without them fails
    "phi3-longrope": ("Phi3ForCausalLM", dict(
        max_position_embeddings=512, original_max_position_embeddings=128,
        rope_scaling=dict(rope_type="longrope", short_factor=[1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0, 12.0], long_factor=[16.0] * 8),
    )),
}


def check_parity(ckpt, tmp_path, atol=2e-4, lowering="auto"):
    ex = build_and_load(ckpt, tmp_path / "engine", spec_build(lowering=lowering))
    hf = load_hf(ckpt)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (1, 20), generator=gen)
    with torch.no_grad():
        ref = hf(ids).logits[0].numpy()
    cache = ex.new_cache(1)
    context = ex.forward(cache, [ids[0, :12].tolist()], all_logits=False).logits
    np.testing.assert_allclose(context[0, 0], ref[11], atol=atol, rtol=0)
    one = ex.forward(cache, [ids[0, 12:13].tolist()], all_logits=True).logits
    np.testing.assert_allclose(one[0, 0], ref[12], atol=atol, rtol=0)
    several = ex.forward(cache, [ids[0, 13:18].tolist()], all_logits=True).logits  # k+1 = 5 rows
    np.testing.assert_allclose(several[0], ref[13:18], atol=atol, rtol=0)

    prompt = ids[0, :10]
    with torch.no_grad():
        want = hf.generate(prompt[None], max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
    assert engine_greedy(ex, prompt.tolist(), 32) == want


@pytest.mark.parametrize("lowering", ["ort_cpu", "portable"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(case, lowering, tmp_path):
    """Both lowerings: ort_cpu (the onnxruntime default) and portable (what TensorRT parses)."""
    arch, overrides = CASES[case]
    check_parity(make_checkpoint(tmp_path / "ckpt", arch, **overrides), tmp_path, lowering=lowering)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoints(dtype, tmp_path):
    """fp16/bf16 weights are stored as they are and computed in float32: exact vs HF upcast."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", dtype=dtype)
    check_parity(ckpt, tmp_path)
    cfg = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert cfg["build"]["dtype"] == str(dtype).removeprefix("torch.")


def test_legacy_config_spelling(tmp_path):
    """Checkpoints published before transformers 5 write torch_dtype / rope_theta / rope_scaling."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", rope_theta=20000.0, rope_scaling=dict(rope_type="linear", factor=2.0))
    cfg = json.loads((ckpt / "config.json").read_text())
    assert "rope_parameters" in cfg and "dtype" in cfg  # what transformers 5 wrote
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = {"type": params.pop("rope_type"), **params}
    cfg["torch_dtype"] = cfg.pop("dtype")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    check_parity(ckpt, tmp_path)
    built = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert built["model"]["rope_theta"] == 20000.0
    assert built["model"]["rope_scaling"]["rope_type"] == "linear"


def test_sharded_checkpoint(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM")
    model = load_hf(ckpt)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    check_parity(sharded, tmp_path)
