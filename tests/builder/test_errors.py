"""Bad inputs to the build get clear errors and leave no partial engine directory."""

import json
import shutil

import pytest
from checkpoints import make_checkpoint
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import BuildConfig, load_engine_dir
from specdec.formats.errors import BuildConfigError, CheckpointError, EngineError


def leftovers(parent, name):
    return [p.name for p in parent.iterdir() if name in p.name]


def build(ckpt, out, build_cfg=None, **kw):
    return build_engine(ckpt, out, build_cfg or spec_build(), say=lambda _: None, **kw)


def test_missing_config_json(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        build(tmp_path / "ckpt", tmp_path / "out")
    assert not leftovers(tmp_path, "out")


def test_unsupported_architecture(tmp_path, llama_ckpt):
    ckpt = shutil.copytree(llama_ckpt, tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="architecture 'GPTNeoXForCausalLM'.*supported: LlamaForCausalLM"):
        build(ckpt, tmp_path / "out")
    assert not leftovers(tmp_path, "out")


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}, "rope_scaling type 'yarn'"),
        ("hidden_act", "gelu", "hidden_act 'gelu'"),
    ],
)
def test_unsupported_config_values_name_the_field(tmp_path, llama_ckpt, field, value, message):
    ckpt = shutil.copytree(llama_ckpt, tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[field] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message):
        build(ckpt, tmp_path / "out")


def test_sliding_window_smaller_than_max_seq_len(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "MistralForCausalLM", sliding_window=32)
    with pytest.raises(CheckpointError, match="sliding_window=32 is smaller than max_seq_len=96"):
        build(ckpt, tmp_path / "out")
    build(ckpt, tmp_path / "ok", spec_build(max_seq_len=32, max_input_len=16))  # within the window: fine


def test_truncated_safetensors(tmp_path, llama_ckpt):
    ckpt = shutil.copytree(llama_ckpt, tmp_path / "ckpt")
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        build(ckpt, tmp_path / "out")
    assert not leftovers(tmp_path, "out")


def test_pickle_only_checkpoint_needs_opt_in(tmp_path, llama_ckpt):
    import torch
    from safetensors.torch import load_file

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(llama_ckpt / "config.json", ckpt)
    torch.save(load_file(llama_ckpt / "model.safetensors"), ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="does not unpickle.*--allow_pickle"):
        build(ckpt, tmp_path / "out")
    assert not leftovers(tmp_path, "out")
    build(ckpt, tmp_path / "out", allow_pickle=True)
    load_engine_dir(tmp_path / "out")


def test_non_empty_output_dir_needs_force(tmp_path, llama_ckpt):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(BuildConfigError, match="not empty; pass --force"):
        build(llama_ckpt, out)
    assert (out / "precious.txt").read_text() == "keep me"
    build(llama_ckpt, out, force=True)
    assert not (out / "precious.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary directory left


@pytest.mark.parametrize(
    "cfg,message",
    [
        (BuildConfig(max_input_len=96, max_seq_len=96), "max_input_len=96 must be smaller than max_seq_len=96"),
        (BuildConfig(max_input_len=8, max_seq_len=32, speculative_decoding_mode="draft_tokens_external", max_draft_len=0),
         "needs max_draft_len >= 1"),
        (BuildConfig(max_input_len=8, max_seq_len=32, max_draft_len=4), "needs --speculative_decoding_mode draft_tokens_external"),
        (BuildConfig(max_input_len=8, max_seq_len=32, tp_size=2), "tp_size=2"),
    ],
)
def test_inconsistent_limits(tmp_path, llama_ckpt, cfg, message):
    with pytest.raises(BuildConfigError, match=message):
        build(llama_ckpt, tmp_path / "out", cfg)
    assert not leftovers(tmp_path, "out")


def test_interrupted_build_leaves_nothing(tmp_path, llama_ckpt):
    def interrupt(step, done, total):
        if step == "write":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(llama_ckpt, tmp_path / "out", progress=interrupt)
    assert list(tmp_path.iterdir()) == []


def test_corrupt_or_missing_engine_files_are_caught_at_load(tmp_path, llama_ckpt):
    out = tmp_path / "engine"
    build(llama_ckpt, out)
    load_engine_dir(out)
    data = out / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(EngineError, match="model.onnx.data is corrupt"):
        load_engine_dir(out)
    data.unlink()
    with pytest.raises(EngineError, match="is missing"):
        load_engine_dir(out)
    (out / "config.json").write_text("{not json")
    with pytest.raises(EngineError, match="not valid JSON"):
        load_engine_dir(out)
    with pytest.raises(EngineError, match="looks like a Hugging Face checkpoint"):
        load_engine_dir(llama_ckpt)  # a checkpoint is not an engine
