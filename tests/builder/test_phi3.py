"""Phi3ForCausalLM: what differs from Llama (fused qkv_proj / gate_up_proj, LongRoPE, Phi-4-mini's partial rotary).

Logits and greedy parity against transformers run in test_parity.py (cases phi3-*); here: the fused
modules under int4 weight-only, the checks of their shapes, and what is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint
from conftest import build_and_load, spec_build
from test_weight_only import dequantized_checkpoint

from specdec.builder.build import build_engine
from specdec.formats.errors import CheckpointError
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer

MAX_DRAFT = 6
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [40, 41, 42, 43, 40, 41, 42, 43, 40, 41]]
IDS = [5, 17, 33, 2, 61, 8, 90, 41, 12, 7]
LONGROPE = dict(rope_type="longrope", short_factor=[1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0, 12.0], long_factor=[16.0] * 8)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("phi3") / "ckpt", "Phi3ForCausalLM")


def build(ckpt: Path, out: Path, **kw) -> None:
    build_engine(ckpt, out, spec_build(**kw), say=lambda _: None)


def logits(ex, ids=IDS) -> np.ndarray:
    return ex.forward(ex.new_cache(1), [ids], all_logits=True).logits.copy()[0]


def test_checkpoint_stores_the_fused_modules(phi3):
    """What the tests build from is Phi-3's layout: no separate q/k/v or gate/up tensors to fall back on."""
    from safetensors import safe_open

    with safe_open(phi3 / "model.safetensors", "np") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not {n.split(".")[-2] for n in names} & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


def test_int4_engine_matches_transformers_on_dequantized_weights(phi3, tmp_path):
    """int4 RTN of the fused modules: the engine (portable: DequantizeLinear folded to float32 at load) equals
    transformers running the same checkpoint with every linear weight replaced by its dequantization. Groups run
    along the input axis, so quantizing qkv_proj whole or q, k, v apart gives the same codes."""
    ex = build_and_load(phi3, tmp_path / "int4", spec_build(quantization="int4_wo", group_size=32, lowering="portable"))
    deq = dequantized_checkpoint(phi3, tmp_path / "deq", 4, 32, True)
    with torch.no_grad():
        want = load_hf(deq)(torch.tensor([IDS])).logits[0].numpy()
        original = load_hf(phi3)(torch.tensor([IDS])).logits[0].numpy()
    got = logits(ex)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    assert np.abs(got - original).max() > 100 * 2e-4  # int4 moved the logits: the comparison above is not vacuous
    wo = json.loads((tmp_path / "int4" / "config.json").read_text())["build"]["weight_only"]
    assert wo["layers"] == ["attn/o_proj", "attn/qkv_proj", "mlp/down_proj", "mlp/gate_up_proj"]


@pytest.fixture(scope="module")
def int4_engines(tmp_path_factory, phi3):
    d = tmp_path_factory.mktemp("phi3_spec")
    draft = make_checkpoint(d / "draft", "Phi3ForCausalLM", num_hidden_layers=1, seed=1)
    int4 = dict(quantization="int4_wo", group_size=128)  # 64-row blocks: where MatMulNBits' lone-row kernel differs
    return {
        "target": build_and_load(phi3, d / "t4", spec_build(MAX_DRAFT, **int4)),
        "draft": build_and_load(draft, d / "d4", spec_build(0, quantization="int4_wo", group_size=64)),
    }


def generate(orch: Orchestrator, prompts=PROMPTS):
    outputs, metrics = orch.generate(prompts, GenerationConfig(max_output_len=40))
    return [o.output_ids for o in outputs], metrics


@pytest.mark.parametrize("draft_len", [1, 3, MAX_DRAFT])
def test_int4_speculative_output_equals_its_target_only_output(int4_engines, draft_len):
    target = int4_engines["target"]
    base, _ = generate(Orchestrator(target))
    assert all(len(t) == 40 for t in base)
    spec, m = generate(Orchestrator(target, DraftModelProposer(int4_engines["draft"]), draft_len))
    assert spec == base and m.drafted > 0
    spec, m = generate(Orchestrator(target, NGramProposer(draft_len, 2), draft_len))
    assert spec == base and m.accepted > 0


def test_mis_sized_fused_module_is_refused(phi3, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    bad = shutil.copytree(phi3, tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    name = "model.layers.1.self_attn.qkv_proj.weight"
    tensors[name] = np.ascontiguousarray(tensors[name][:96])  # q and k only: v missing
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"{name} in model.safetensors has shape \[96, 64\]; config.json implies \[128, 64\] = "
                                              r"\[num_attention_heads\*head_dim \+ 2\*num_key_value_heads\*head_dim, hidden_size\]"):
        build(bad, tmp_path / "out")


def edit_config(ckpt: Path, dst: Path, **fields) -> Path:
    import shutil

    dst = shutil.copytree(ckpt, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_longrope_past_the_pretraining_length_is_refused(tmp_path):
    """transformers switches every position to long_factor once a sequence passes original_max_position_embeddings."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "Phi3ForCausalLM", max_position_embeddings=512, original_max_position_embeddings=64,
                           rope_scaling=LONGROPE)
    with pytest.raises(CheckpointError, match=r"rope_scaling type 'longrope' .* only up to original_max_position_embeddings=64, "
                                              r"not max_seq_len=96.* --max_seq_len 64 or less"):
        build(ckpt, tmp_path / "out")
    build(ckpt, tmp_path / "ok", max_seq_len=64, max_input_len=32)
    built = json.loads((tmp_path / "ok" / "config.json").read_text())["model"]["rope_scaling"]
    assert built["rope_type"] == "longrope" and built["attention_factor"] == pytest.approx((1 + np.log(8) / np.log(64)) ** 0.5)


def test_published_longrope_spelling(phi3, tmp_path):
    """Phi-3-mini-128k's config.json: rope_scaling {"type": "su"} beside rope_theta and original_max_position_embeddings."""
    cfg = json.loads((phi3 / "config.json").read_text())
    ckpt = edit_config(phi3, tmp_path / "su", rope_parameters=None, rope_theta=10000.0, max_position_embeddings=1024,
                       original_max_position_embeddings=96, rope_scaling={"type": "su", **{k: v for k, v in LONGROPE.items() if k != "rope_type"}})
    assert cfg["rope_parameters"]["rope_type"] == "default"
    build(ckpt, tmp_path / "out")
    built = json.loads((tmp_path / "out" / "config.json").read_text())["model"]
    assert built["rope_scaling"]["rope_type"] == "longrope" and built["rope_scaling"]["original_max_position_embeddings"] == 96


@pytest.mark.parametrize("fields", [
    dict(partial_rotary_factor=0.75),  # Phi-4-mini as published
    dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}),  # as transformers 5 saves it
])
def test_partial_rotary_is_refused(phi3, tmp_path, fields):
    ckpt = edit_config(phi3, tmp_path / "partial", **fields)
    with pytest.raises(CheckpointError, match=r"partial_rotary_factor 0.75 is not supported \(field (rope_parameters\.)?partial_rotary_factor\)"):
        build(ckpt, tmp_path / "out")


def test_sliding_window_smaller_than_max_seq_len(phi3, tmp_path):
    ckpt = edit_config(phi3, tmp_path / "window", sliding_window=32)
    with pytest.raises(CheckpointError, match="sliding_window=32 is smaller than max_seq_len=96"):
        build(ckpt, tmp_path / "out")
