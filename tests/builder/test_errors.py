"""Bad inputs to the build get clear errors and leave no partial engine directory."""

import json
import shutil
from pathlib import Path

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
    # --force replaces an engine, never a directory of other files (it used to delete them)
    with pytest.raises(BuildConfigError, match="holds files that are not a specdec engine's \\(precious.txt\\): --force replaces only"):
        build(llama_ckpt, out, force=True)
    assert (out / "precious.txt").read_text() == "keep me"
    (out / "precious.txt").unlink()
    build(llama_ckpt, out)  # empty: filled in place
    first = load_engine_dir(out).config.files
    build(llama_ckpt, out, force=True)  # an engine: replaced whole
    assert load_engine_dir(out).config.files == first
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary directory left
    (out / "bench.json").write_text("mine")  # an engine with a file of the user's beside it: not replaced, the file kept
    with pytest.raises(BuildConfigError, match="holds files that are not a specdec engine's \\(bench.json\\)"):
        build(llama_ckpt, out, force=True)
    assert (out / "bench.json").read_text() == "mine"


def test_the_output_is_never_an_input_and_dots_and_links_resolve(tmp_path, llama_ckpt, monkeypatch):
    """Building into the checkpoint (or a folder holding it) would delete what is being built from: refused, --force or not.
    "." builds into the current directory, and a link is written through to where it points."""
    ckpt = Path(shutil.copytree(llama_ckpt, tmp_path / "parent" / "ckpt"))
    for out in (ckpt, ckpt.parent):
        for force in (False, True):
            with pytest.raises(BuildConfigError, match="is or holds --checkpoint_dir .*: building there would delete it"):
                build(ckpt, out, force=force)
    assert (ckpt / "config.json").is_file() and any(ckpt.glob("*.safetensors"))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    build(ckpt, Path("."))
    load_engine_dir(here)
    with pytest.raises(BuildConfigError, match="is the current directory and holds an engine"):  # swapping it would delete the shell's
        build(ckpt, Path("."), force=True)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    build(ckpt, tmp_path / "link")
    build(ckpt, tmp_path / "link", force=True)
    assert (tmp_path / "link").is_symlink() and load_engine_dir(real).config.build
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left beside them


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


def test_a_config_without_architectures_builds_by_its_model_type_and_a_file_is_not_a_checkpoint(tmp_path, llama_ckpt):
    """transformers reads a config.json without "architectures" by its model_type, and so does the builder (it said
    "architecture None is not supported"); a weights file given as --checkpoint_dir is said to be a file, not missing."""
    ckpt = Path(shutil.copytree(llama_ckpt, tmp_path / "ckpt"))
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("architectures")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert load_engine_dir(build(ckpt, tmp_path / "e").output_dir).config.model.architecture == "LlamaForCausalLM"
    weights = next(ckpt.glob("*.safetensors"))
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        build(weights, tmp_path / "f")


def test_a_hub_id_or_a_gguf_file_is_named_for_what_it_is(tmp_path, monkeypatch):
    """Users of transformers pass a Hub id: the error says what it is and what to do (it said 'does not exist'); a .gguf
    that is not one says so; a plain missing folder stays a plain error."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"Hugging Face Hub id, download it first .*hf download Qwen/Qwen2\.5-0\.5B --local-dir "
                                              r"Qwen2\.5-0\.5B, then pass --checkpoint_dir Qwen2\.5-0\.5B"):
        build("Qwen/Qwen2.5-0.5B", tmp_path / "e")
    (tmp_path / "model-q4_0.gguf").write_bytes(b"GGUF")  # a .gguf is read as one (tests/builder/test_gguf.py): this one is not readable
    with pytest.raises(CheckpointError, match=r"model-q4_0\.gguf is not a readable GGUF file"):
        build("model-q4_0.gguf", tmp_path / "e")
    with pytest.raises(CheckpointError, match=r"checkpoint directory nothere does not exist\.$"):
        build("nothere", tmp_path / "e")
