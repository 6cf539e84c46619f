"""Fuzzing what specdec-build reads besides its flags: config.json, its quantization_config, and the config.json of
Medusa heads and EAGLE modules, as mutations of valid ones (a field deleted, null, of another type, a number at the
edges, deep nesting), and non-finite values in every tensor it reads (tests/fuzzing.py: the budget and the property).

Each example builds in-process: an engine, or one clean error line and nothing on disk.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from checkpoints import make_checkpoint, save_fp8_checkpoint, write_eagle_module, write_medusa_heads
from click.testing import CliRunner
from fuzzing import assert_clean, fuzz_settings, mutated, no_hang
from hypothesis import given, strategies as st
from quant_layouts import save_quantized_checkpoint
from safetensors.numpy import load_file, save_file

from specdec.cli.build import main as build_main

pytestmark = pytest.mark.fuzz
LIMITS = ("--max_seq_len", "64", "--max_batch_size", "2")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-ckpt")
    base = make_checkpoint(d / "base", num_hidden_layers=2, intermediate_size=64)
    save_quantized_checkpoint(base, d / "gptq", "gptq", bits=4, group_size=32)
    save_quantized_checkpoint(base, d / "awq", "awq", bits=4, group_size=32)
    save_fp8_checkpoint(base, d / "fp8", "compressed-tensors")
    save_fp8_checkpoint(base, d / "fp8-block", "fp8", block=32)
    save_fp8_checkpoint(base, d / "modelopt", "modelopt")
    write_medusa_heads(base, d / "medusa")
    write_eagle_module(base, d / "eagle", num_layers=1)
    return d


def with_config(src, dst, config: dict):
    """A copy of checkpoint (or head) directory ``src`` whose config.json is ``config``; the weights are linked, not copied."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    (dst / "config.json").write_text(json.dumps(config, allow_nan=True))
    return dst


def build(*args):
    with no_hang(what=args):
        return CliRunner().invoke(build_main, [str(a) for a in args])


def config_of(path) -> dict:
    return json.loads((path / "config.json").read_text())


def check_build(result, out) -> None:
    assert_clean(result, out)
    if result.exit_code == 0:
        assert (out / "config.json").is_file()


@pytest.fixture(scope="module")
def valid(ckpts):
    return {path.name: config_of(path) for path in ckpts.iterdir()}


# The valid configs come from a fixture: each test draws its mutation from st.data().
@fuzz_settings(60)
@given(st.data())
def test_config_json_mutations(ckpts, valid, tmp_path_factory, data):
    config = data.draw(mutated(valid["base"]), label="config.json")
    d = tmp_path_factory.mktemp("c")
    check_build(build("--checkpoint_dir", with_config(ckpts / "base", d / "ckpt", config), "--output_dir", d / "engine", *LIMITS), d / "engine")


@pytest.mark.parametrize("kind", ["gptq", "awq", "fp8", "fp8-block", "modelopt"])
@fuzz_settings(25)
@given(data=st.data())
def test_quantization_config_mutations(ckpts, valid, tmp_path_factory, kind, data):
    config = valid[kind]
    part = data.draw(mutated({"quantization_config": config["quantization_config"]}), label="quantization_config")
    d = tmp_path_factory.mktemp("q")
    check_build(build("--checkpoint_dir", with_config(ckpts / kind, d / "ckpt", {**config, **part}), "--output_dir", d / "engine", *LIMITS),
                d / "engine")


@pytest.mark.parametrize("mode", ["medusa", "eagle"])
@fuzz_settings(50)
@given(data=st.data())
def test_head_config_mutations(ckpts, valid, tmp_path_factory, mode, data):
    config = data.draw(mutated(valid[mode]), label=f"{mode} config.json")
    d = tmp_path_factory.mktemp("h")
    heads = with_config(ckpts / mode, d / "heads", config)
    out = d / "engine"
    check_build(build("--checkpoint_dir", ckpts / "base", "--output_dir", out, *LIMITS, "--speculative_decoding_mode", mode, f"--{mode}_dir", heads),
                out)


def edited(valid: dict, *path_and_value) -> dict:
    """A deep copy of ``valid`` with the value at ``path`` (keys) replaced; ``value`` = DELETE removes it."""
    config = json.loads(json.dumps(valid))
    *path, value = path_and_value
    parent = config
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return config


# Each was a traceback (or, for rope_theta, a silent engine of NaN rotations) before config.json was read field by field.
@pytest.mark.parametrize(("kind", "edit", "message"), [
    ("base", ("hidden_size", None), "config.json lacks the field 'hidden_size'"),  # int(None): TypeError
    ("base", ("architectures", 100), "architecture 100 (config.json field 'architectures') is not supported"),  # 100[0]: TypeError
    ("base", ("rms_norm_eps", "1T"), "config.json field 'rms_norm_eps' is '1T'; expected a finite number >= 0"),  # ValueError
    ("base", ("rms_norm_eps", -1.0), "config.json field 'rms_norm_eps' is -1.0"),  # ONNX Runtime's SkipLayerNorm refused it at load
    ("base", ("eos_token_id", [[0]]), "config.json field 'eos_token_id' is [[0]]"),  # int([0]): TypeError
    ("base", ("rope_parameters", "rope_theta", 5e-324), "gives rotary tables that are not finite"),  # built, and decoded NaN
    ("gptq", ("quantization_config", 2147483647), "config.json field 'quantization_config' is 2147483647; expected a JSON object"),
    ("fp8", ("quantization_config", "config_groups", "group_0", None), "quantization_config.config_groups.group_0 is None; expected a JSON object"),
    ("fp8-block", ("quantization_config", "weight_block_size", [[32], 32]), "weight_block_size [[32], 32]; expected [n, n]"),  # set([[32]])
])
def test_malformed_configs_are_one_clean_line(ckpts, valid, tmp_path, kind, edit, message):
    out = tmp_path / "engine"
    r = build("--checkpoint_dir", with_config(ckpts / kind, tmp_path / "ckpt", edited(valid[kind], *edit)), "--output_dir", out, *LIMITS)
    assert_clean(r, out)
    assert r.exit_code == 1 and message in r.stderr, r.output


def test_a_config_json_that_is_not_an_object(ckpts, tmp_path):
    ckpt = with_config(ckpts / "base", tmp_path / "ckpt", {})
    (ckpt / "config.json").write_text("[1, 2]")  # regression: [1, 2].get raised AttributeError
    r = build("--checkpoint_dir", ckpt, "--output_dir", tmp_path / "engine", *LIMITS)
    assert_clean(r, tmp_path / "engine")
    assert r.exit_code == 1 and "holds list; expected a JSON object" in r.stderr


def test_an_eagle_config_naming_no_list_of_architectures(ckpts, valid, tmp_path):
    heads = with_config(ckpts / "eagle", tmp_path / "heads", edited(valid["eagle"], "architectures", 265))  # 265 in ...: TypeError
    r = build("--checkpoint_dir", ckpts / "base", "--output_dir", tmp_path / "engine", *LIMITS, "--speculative_decoding_mode", "eagle", "--eagle_dir",
              heads)
    assert_clean(r, tmp_path / "engine")
    assert r.exit_code == 0, r.output  # its eagle_config says what it is


# -- non-finite weights in the heads and the EAGLE module ------------------------------------------------


@pytest.mark.parametrize(("mode", "tensor"), [("medusa", "medusa_heads.1.0.linear.weight"), ("eagle", "layers.0.self_attn.k_proj.weight"),
                                              ("eagle", "fc.weight")])
def test_nonfinite_head_weights_are_refused_or_built_with_one_warning(ckpts, tmp_path, mode, tensor):
    heads = tmp_path / "heads"
    shutil.copytree(ckpts / mode, heads)
    tensors = load_file(heads / "model.safetensors")
    tensors[tensor] = tensors[tensor].copy()
    tensors[tensor][0, :3] = [np.nan, np.inf, np.nan]
    save_file(tensors, heads / "model.safetensors", metadata={"format": "pt"})
    args = ("--checkpoint_dir", ckpts / "base", *LIMITS, "--speculative_decoding_mode", mode, f"--{mode}_dir", heads)
    refused = build(*args, "--output_dir", tmp_path / "refused")
    assert_clean(refused, tmp_path / "refused")  # regression: built, and its drafts were garbage the target never accepted
    assert refused.exit_code == 1 and f"non-finite weights in {heads}: {tensor} holds 2 NaN and 1 Inf." in refused.stderr, refused.output
    built = build(*args, "--output_dir", tmp_path / "built", "--allow_nonfinite")
    assert built.exit_code == 0, built.output
    assert built.stderr.splitlines() == [f"warning: building with non-finite weights (--allow_nonfinite): {tensor} holds 2 NaN and 1 Inf."]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A valid GGUF file (Q4_0 layers, a BPE tokenizer, a chat template), and where its tensors' data begins."""
    import gguf
    from gguf_files import add_bpe_tokenizer, write_gguf

    d = tmp_path_factory.mktemp("fuzz-gguf")
    base = add_bpe_tokenizer(make_checkpoint(d / "ckpt", num_hidden_layers=1, hidden_size=64, intermediate_size=64, vocab_size=300), 300)
    path = write_gguf(base, d / "model.gguf", linear_type="Q4_0", chat_template="{{ messages[0]['content'] }}")
    return path, int(gguf.GGUFReader(str(path)).data_offset)


def byte_edits(data, valid: bytes, head: int, in_head: str) -> bytes:
    """``valid`` with 1 to 4 bytes set to random values, each in its first ``head`` bytes (a binary file's header) or after."""
    edits = data.draw(st.lists(st.tuples(st.integers(0, head - 1) if data.draw(st.booleans(), label=in_head)
                                         else st.integers(head, len(valid) - 1), st.integers(0, 255)), min_size=1, max_size=4),
                      label="byte edits")
    mutated_file = bytearray(valid)
    for where, value in edits:
        mutated_file[where] = value
    return bytes(mutated_file)


@fuzz_settings(60)
@given(data=st.data())
def test_gguf_file_mutations(gguf_file, tmp_path_factory, data):
    """llama.cpp's files are binary: random bytes anywhere in the header, the metadata (names, lengths, types, the
    tokenizer's strings) and the tensor index, or in the tensors' blocks."""
    path, head = gguf_file
    d = tmp_path_factory.mktemp("g")
    (d / "model.gguf").write_bytes(byte_edits(data, path.read_bytes(), head, "in the metadata"))
    check_build(build("--checkpoint_dir", d / "model.gguf", "--output_dir", d / "engine", *LIMITS), d / "engine")


@pytest.fixture(scope="module")
def lora_adapter(ckpts):
    """A valid LoRA adapter of the base checkpoint, as peft writes one: q_proj and down_proj of both layers, an alpha pattern."""
    d = ckpts / "lora"
    if not d.exists():
        d.mkdir()
        config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": False, "target_modules": ["q_proj", "down_proj"],
                  "alpha_pattern": {"down_proj": 4}, "rank_pattern": {}, "modules_to_save": None, "use_dora": False, "lora_bias": False,
                  "fan_in_fan_out": False, "base_model_name_or_path": str(ckpts / "base")}
        (d / "adapter_config.json").write_text(json.dumps(config))
        shapes = {"self_attn.q_proj": (64, 64), "mlp.down_proj": (64, 64)}  # [out, in] of TINY's hidden 64, intermediate 64
        rng = np.random.default_rng(0)
        tensors = {}
        for layer in range(2):
            for module, (n_out, n_in) in shapes.items():
                key = f"base_model.model.model.layers.{layer}.{module}"
                tensors[f"{key}.lora_A.weight"] = rng.standard_normal((4, n_in)).astype(np.float32)
                tensors[f"{key}.lora_B.weight"] = rng.standard_normal((n_out, 4)).astype(np.float32)
        save_file(tensors, str(d / "adapter_model.safetensors"))
    return d


@fuzz_settings(40)
@given(data=st.data())
def test_lora_adapter_config_mutations(ckpts, lora_adapter, tmp_path_factory, data):
    config = data.draw(mutated(json.loads((lora_adapter / "adapter_config.json").read_text())), label="adapter_config.json")
    d = tmp_path_factory.mktemp("l")
    adapter = with_config(lora_adapter, d / "adapter", {})
    (adapter / "adapter_config.json").unlink()
    (adapter / "adapter_config.json").write_text(json.dumps(config, allow_nan=True))
    check_build(build("--checkpoint_dir", ckpts / "base", "--output_dir", d / "engine", "--lora_dir", adapter, *LIMITS), d / "engine")


@fuzz_settings(40)
@given(data=st.data())
def test_lora_adapter_weights_mutations(ckpts, lora_adapter, tmp_path_factory, data):
    """Random bytes in the adapter's safetensors header (names, shapes, dtypes, offsets) or its tensors."""
    valid = (lora_adapter / "adapter_model.safetensors").read_bytes()
    head = 8 + int.from_bytes(valid[:8], "little")
    d = tmp_path_factory.mktemp("w")
    adapter = d / "adapter"
    adapter.mkdir()
    shutil.copy(lora_adapter / "adapter_config.json", adapter)
    (adapter / "adapter_model.safetensors").write_bytes(byte_edits(data, valid, head, "in the header"))
    check_build(build("--checkpoint_dir", ckpts / "base", "--output_dir", d / "engine", "--lora_dir", adapter, *LIMITS), d / "engine")
