"""Checkpoints that disagree with their config.json, non-finite weights and impossible limits are refused
before any graph is built, with a message that names the tensor (or limit) and what was expected."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint, save_fp8_checkpoint
from quant_layouts import save_quantized_checkpoint

from specdec.builder import validation
from specdec.builder.architectures import model_config_from_hf
from specdec.builder.checkpoint import load_checkpoint
from specdec.builder.quantization import detect_checkpoint_quantization
from specdec.builder.validation import check_memory_limits, validate_checkpoint
from specdec.formats.engine_format import BuildConfig
from specdec.formats.errors import BuildConfigError, CheckpointError
from specdec.formats.kv_layout import kv_cache_bytes

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
CPU_BUILD = BuildConfig(max_seq_len=64, max_input_len=32, lowering="ort_cpu", backend="onnxruntime")


def corrupt(src: Path, dst: Path, edit: Callable[[dict], None], framework: str = "numpy") -> Path:
    """Copy checkpoint ``src`` to ``dst`` and rewrite its weights with ``edit`` (in place on the name -> tensor dict).

    framework torch: for bfloat16 and float8 tensors, which numpy has no type for.
    """
    import safetensors.numpy
    import safetensors.torch

    api = safetensors.torch if framework == "torch" else safetensors.numpy
    shutil.copytree(src, dst)
    tensors = api.load_file(dst / "model.safetensors")
    edit(tensors)
    api.save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def validate(path: Path, allow_nonfinite: bool = False) -> None:
    ckpt = load_checkpoint(path)
    model = model_config_from_hf(ckpt.hf_config)
    validate_checkpoint(ckpt, model, CPU_BUILD, detect_checkpoint_quantization(ckpt.hf_config, ckpt.path), allow_nonfinite)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    # head_dim 32 with 4 heads: q_proj is [128, 64], so a transposed one is told apart; an untied lm_head to check too
    return make_checkpoint(tmp_path_factory.mktemp("val") / "llama", head_dim=32, tie_word_embeddings=False)


@pytest.mark.parametrize("arch,kw", [
    ("LlamaForCausalLM", {}),
    ("Qwen2ForCausalLM", {}),  # q/k/v biases
    ("Qwen3ForCausalLM", {"head_dim": 32}),  # q/k norms over head_dim
])
def test_valid_checkpoints_pass(tmp_path, arch, kw):
    validate(make_checkpoint(tmp_path / "ckpt", arch, **kw))


def test_valid_bfloat16_and_fp8_checkpoints_pass(tmp_path, llama):
    validate(make_checkpoint(tmp_path / "bf16", dtype=torch.bfloat16))
    save_fp8_checkpoint(llama, tmp_path / "fp8", "fp8", block=32)
    validate(tmp_path / "fp8")


def test_transposed_linear_weight(tmp_path, llama):
    def transpose(t):
        t[Q_PROJ] = np.ascontiguousarray(t[Q_PROJ].T)

    with pytest.raises(CheckpointError, match=rf"{Q_PROJ} in model.safetensors has shape \[64, 128\]; config.json implies \[128, 64\] = "
                                              r"\[num_attention_heads\*head_dim, hidden_size\] \(transposed\?"):
        validate(corrupt(llama, tmp_path / "bad", transpose))


def test_mis_sized_linear_weight(tmp_path, llama):
    def shrink(t):
        name = "model.layers.1.mlp.down_proj.weight"
        t[name] = np.ascontiguousarray(t[name][:, :100])

    with pytest.raises(CheckpointError, match=r"down_proj.weight in model.safetensors has shape \[64, 100\]; config.json implies \[64, 128\] = "
                                              r"\[hidden_size, intermediate_size\]\. The checkpoint"):
        validate(corrupt(llama, tmp_path / "bad", shrink))


@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "lm_head.weight"])
def test_vocabulary_disagreeing_with_config(tmp_path, llama, name):
    def grow(t):
        t[name] = np.concatenate([t[name], np.zeros((4, 64), np.float32)])

    with pytest.raises(CheckpointError, match=rf"{name} in model.safetensors has 100 rows but config.json's vocab_size is 96"):
        validate(corrupt(llama, tmp_path / "bad", grow))


def test_qwen3_q_norm_of_wrong_size(tmp_path):
    src = make_checkpoint(tmp_path / "qwen3", "Qwen3ForCausalLM", head_dim=32)

    def wrong(t):
        t["model.layers.1.self_attn.q_norm.weight"] = np.ones(16, np.float32)

    with pytest.raises(CheckpointError,
                       match=r"layers.1.self_attn.q_norm.weight in model.safetensors has shape \[16\]; config.json implies \[32\] = \[head_dim\]"):
        validate(corrupt(src, tmp_path / "bad", wrong))


def test_qwen2_bias_of_wrong_size(tmp_path):
    src = make_checkpoint(tmp_path / "qwen2", "Qwen2ForCausalLM")

    def wrong(t):
        t["model.layers.0.self_attn.k_proj.bias"] = np.zeros(64, np.float32)

    with pytest.raises(CheckpointError,
                       match=r"k_proj.bias in model.safetensors has shape \[64\]; config.json implies \[32\] = \[num_key_value_heads\*head_dim\]"):
        validate(corrupt(src, tmp_path / "bad", wrong))


@pytest.mark.parametrize("name,message", [
    ("model.layers.0.input_layernorm.weight", "has dtype I32; expected a float tensor (F32, F16, BF16)."),
    (Q_PROJ, "has dtype I32; expected a float tensor (F32, F16, BF16), or a quantization_config"),
])
def test_integer_tensor_where_floats_belong(tmp_path, llama, name, message):
    def to_int(t):
        t[name] = t[name].astype(np.int32)

    with pytest.raises(CheckpointError) as err:
        validate(corrupt(llama, tmp_path / "bad", to_int))
    assert str(err.value).startswith(f"{name} in model.safetensors {message}")


def test_missing_tensor_is_named(tmp_path, llama):
    with pytest.raises(CheckpointError, match="has no tensor 'model.layers.1.post_attention_layernorm.weight'"):
        validate(corrupt(llama, tmp_path / "bad", lambda t: t.pop("model.layers.1.post_attention_layernorm.weight")))


def test_nonfinite_weights_refused_unless_allowed(tmp_path, llama):
    def poison(t):
        t["model.norm.weight"][3] = np.nan
        t["model.layers.1.mlp.up_proj.weight"][0, :2] = [np.inf, -np.inf]
        t["model.layers.1.mlp.up_proj.weight"][5, 7] = np.nan

    bad = corrupt(llama, tmp_path / "bad", poison)
    with pytest.raises(CheckpointError) as err:
        validate(bad)
    # dense tensors are checked before the linear layers
    assert "model.norm.weight holds 1 NaN; model.layers.1.mlp.up_proj.weight holds 1 NaN and 2 Inf." in str(err.value)
    assert "--allow_nonfinite" in str(err.value)
    with pytest.warns(UserWarning, match=r"non-finite weights \(--allow_nonfinite\): .*model.norm.weight holds 1 NaN"):
        validate(bad, allow_nonfinite=True)


def test_nonfinite_found_in_bfloat16_and_fp8_bits(tmp_path, llama):
    def poison_bf16(t):
        t["model.layers.0.self_attn.v_proj.weight"][1, 1] = float("-inf")

    bf16 = make_checkpoint(tmp_path / "bf16", dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match=r"v_proj.weight holds 1 Inf\."):
        validate(corrupt(bf16, tmp_path / "bad_bf16", poison_bf16, "torch"))

    def poison_fp8(t):
        t["model.layers.0.mlp.gate_proj.weight"].view(torch.uint8)[2, 3] = 0x7F  # e4m3fn's NaN (it has no Inf)

    save_fp8_checkpoint(llama, tmp_path / "fp8", "compressed-tensors")
    with pytest.raises(CheckpointError, match=r"gate_proj.weight holds 1 NaN\."):
        validate(corrupt(tmp_path / "fp8", tmp_path / "bad_fp8", poison_fp8, "torch"))


@pytest.mark.parametrize("spec", [
    dict(method="gptq", bits=4, group_size=32, act_order=True),
    dict(method="awq", bits=4, group_size=32, symmetric=False),
    dict(method="compressed-tensors", bits=8, group_size=0),
])
def test_valid_packed_checkpoints_pass(tmp_path, llama, spec):
    save_quantized_checkpoint(llama, tmp_path / "q", **spec)
    validate(tmp_path / "q")


def test_packed_layer_that_unpacks_to_the_wrong_shape(tmp_path, llama):
    # each packed tensor agrees with the others of its layer, but the layer is not the one config.json implies
    save_quantized_checkpoint(llama, tmp_path / "gptq", "gptq", bits=4, group_size=32)

    def swap_up_and_down(t):
        for part in ("qweight", "qzeros", "scales", "g_idx"):
            up, down = f"model.layers.0.mlp.up_proj.{part}", f"model.layers.0.mlp.down_proj.{part}"
            t[up], t[down] = t[down], t[up]

    with pytest.raises(CheckpointError, match=r"model.layers.0.mlp.up_proj \(gptq, unpacked\) has shape \[64, 128\]; "
                                              r"config.json implies \[128, 64\] = \[intermediate_size, hidden_size\] \(transposed\?"):
        validate(corrupt(tmp_path / "gptq", tmp_path / "bad", swap_up_and_down, "torch"))


# ------------------------------------------------------------------------------------------------ limits


def test_kv_cache_bytes_is_what_the_runtime_allocates(llama):
    from specdec.runtime.kv_cache import KVCache

    model = model_config_from_hf(load_checkpoint(llama).hf_config)
    build = BuildConfig(max_batch_size=3, max_seq_len=40, max_input_len=20, max_draft_len=4, speculative_decoding_mode="draft_tokens_external")
    cache = KVCache(model.num_layers, build.max_batch_size, model.num_kv_heads, build.kv_capacity, model.head_dim, build.max_seq_len)
    assert kv_cache_bytes(model, build.max_batch_size, build.kv_capacity) == sum(b.nbytes for b in cache.keys + cache.values)


@pytest.mark.parametrize("limits", [dict(max_seq_len=10**12), dict(max_batch_size=10**12), dict(max_seq_len=10**40, max_batch_size=10**40)])
def test_absurd_limits_get_the_memory_they_need(llama, limits):
    model = model_config_from_hf(load_checkpoint(llama).hf_config)
    build = BuildConfig(**{"max_seq_len": 64, "max_input_len": 32, "lowering": "ort_cpu", **limits})
    with pytest.raises(BuildConfigError,
                       match=r"needs a KV cache of [0-9.e+]+ (bytes|[KMGTPE]iB) \(2 x 2 layers x .*the engine could never allocate it"):
        check_memory_limits(model, build)


def test_largest_limits_that_fit_are_the_ones_suggested(llama, monkeypatch):
    model = model_config_from_hf(load_checkpoint(llama).hf_config)
    per_slot = kv_cache_bytes(model, 1, 1)  # 2 x 2 layers x 2 heads x 32 x 4 = 1024 bytes
    monkeypatch.setattr(validation, "physical_memory_bytes", lambda: 1000 * per_slot)
    build = BuildConfig(max_batch_size=4, max_seq_len=300, max_input_len=100, max_draft_len=4, speculative_decoding_mode="draft_tokens_external",
                        lowering="ort_cpu")
    with pytest.raises(BuildConfigError) as err:
        check_memory_limits(model, build)
    message = str(err.value)
    assert message.startswith("max_seq_len=300 with max_batch_size=4 needs a KV cache of 1.2 MiB (2 x 2 layers x 4 sequences x 305 slots")
    assert "more than this machine's physical memory (1000.0 KiB)" in message
    # 1000 slots: 250 per sequence at batch 4 (245 + 4 drafts + 1); 3 sequences of 305 slots
    assert message.endswith("What fits: --max_seq_len 245 at --max_batch_size 4, or --max_batch_size 3 at --max_seq_len 300.")
    check_memory_limits(model, BuildConfig(**{**build.__dict__, "max_seq_len": 245}))
    check_memory_limits(model, BuildConfig(**{**build.__dict__, "max_batch_size": 3}))
    with pytest.raises(BuildConfigError):
        check_memory_limits(model, BuildConfig(**{**build.__dict__, "max_seq_len": 246}))


def test_gpu_engines_are_bounded_by_the_largest_gpu_not_this_host(llama, monkeypatch):
    model = model_config_from_hf(load_checkpoint(llama).hf_config)
    monkeypatch.setattr(validation, "physical_memory_bytes", lambda: 2**20)  # a small build host
    trt = BuildConfig(max_batch_size=8, max_seq_len=4096, max_input_len=2048, backend="tensorrt", lowering="portable")
    check_memory_limits(model, trt)  # 256 MiB of cache: fine on any GPU, whatever this host has
    with pytest.raises(BuildConfigError, match=r"more than the memory of the largest single GPU \(288.0 GiB\)"):
        check_memory_limits(model, BuildConfig(**{**trt.__dict__, "max_seq_len": 2**30}))
    # ort_cuda keeps its cache in the compute dtype: half the bytes of float32
    cuda = BuildConfig(max_batch_size=1, max_seq_len=2**30, max_input_len=8, dtype="bfloat16", lowering="ort_cuda")
    with pytest.raises(BuildConfigError, match=r"x 32 head_dim x 2 bytes\)"):
        check_memory_limits(model, cuda)
