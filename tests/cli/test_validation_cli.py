"""specdec-build refuses a checkpoint that disagrees with its config.json, non-finite weights and impossible
limits as a user meets it: exit status 1, one "error:" line on stderr, no traceback, nothing left on disk."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from checkpoints import make_checkpoint
from click.testing import CliRunner, Result
from quant_layouts import save_quantized_checkpoint
from safetensors.numpy import load_file, save_file

from specdec.cli.build import main as build_main

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def corrupt(src: Path, dst: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> Path:
    """Copy checkpoint ``src`` to ``dst`` and rewrite its weights with ``edit`` (in place on the name -> array dict)."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("valcli") / "llama", head_dim=32)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("valcli") / "qwen3", "Qwen3ForCausalLM", head_dim=32)


def build(ckpt: Path, out: Path, *flags) -> Result:
    return CliRunner().invoke(build_main, [str(a) for a in ("--checkpoint_dir", ckpt, "--output_dir", out, "--max_seq_len", 64, *flags)])


def assert_refused(result, out: Path, message: str) -> None:
    """Exit 1, exactly one clean line on stderr, and neither the engine directory nor its temporary beside it."""
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith("error: "), result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), list(out.parent.iterdir())


def transpose_q_proj(t):
    t[Q_PROJ] = np.ascontiguousarray(t[Q_PROJ].T)


def grow_embedding(t):
    t["model.embed_tokens.weight"] = np.concatenate([t["model.embed_tokens.weight"], np.zeros((4, 64), np.float32)])


def nan_in_norm(t):
    t["model.layers.1.input_layernorm.weight"][0] = np.nan


def int_norm(t):
    t["model.norm.weight"] = t["model.norm.weight"].astype(np.int32)


@pytest.mark.parametrize("edit,message", [
    (transpose_q_proj, f"error: {Q_PROJ} in model.safetensors has shape [64, 128]; config.json implies [128, 64] = "
                       "[num_attention_heads*head_dim, hidden_size] (transposed?"),
    (grow_embedding, "error: model.embed_tokens.weight in model.safetensors has 100 rows but config.json's vocab_size is 96"),
    (nan_in_norm, "model.layers.1.input_layernorm.weight holds 1 NaN. An engine built from them emits garbage; re-export the checkpoint, "
                  "or pass --allow_nonfinite to build anyway."),
    (int_norm, "error: model.norm.weight in model.safetensors has dtype I32; expected a float tensor (F32, F16, BF16)."),
])
def test_corrupt_llama_checkpoints_are_refused(tmp_path, llama, edit, message):
    bad = corrupt(llama, tmp_path / "ckpt", edit)
    assert_refused(build(bad, tmp_path / "engines" / "e"), tmp_path / "engines" / "e", message)


def test_qwen3_q_norm_of_wrong_size_is_refused(tmp_path, qwen3):
    def shrink(t):
        t["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)

    bad = corrupt(qwen3, tmp_path / "ckpt", shrink)
    assert_refused(build(bad, tmp_path / "e"), tmp_path / "e",
                   "error: model.layers.0.self_attn.q_norm.weight in model.safetensors has shape [16]; config.json implies [32] = [head_dim].")


def test_packed_scales_that_do_not_match_the_group_size_are_refused(tmp_path, llama):
    import safetensors.torch

    ckpt = tmp_path / "gptq"
    save_quantized_checkpoint(llama, ckpt, "gptq", bits=4, group_size=32)
    tensors = safetensors.torch.load_file(ckpt / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.scales"
    tensors[name] = tensors[name][:1].clone()  # 64 input rows in groups of 32 need 2 rows of scales
    safetensors.torch.save_file(tensors, ckpt / "model.safetensors")
    assert_refused(build(ckpt, tmp_path / "e"), tmp_path / "e", f"error: {name} has shape [1, 128]; expected [2, 128] (2 groups of 32 input rows")


@pytest.mark.parametrize("flags,message", [
    (["--max_seq_len", 10**12], "error: max_seq_len=1000000000000 with max_batch_size=8 needs a KV cache of "),
    (["--max_batch_size", 10**9], "error: max_seq_len=64 with max_batch_size=1000000000 needs a KV cache of "),
    (["--max_seq_len", 10**30, "--max_batch_size", 10**30], " bytes (2 x 2 layers x "),
])
def test_limits_that_could_never_be_allocated_are_refused(tmp_path, llama, flags, message):
    result = build(llama, tmp_path / "e", *flags)
    assert_refused(result, tmp_path / "e", message)
    assert "the engine could never allocate it" in result.stderr


def test_valid_checkpoint_builds(tmp_path, llama):
    result = build(llama, tmp_path / "e")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "e" / "config.json").is_file() and not result.stderr


def test_allow_nonfinite_builds_with_one_warning(tmp_path, llama):
    bad = corrupt(llama, tmp_path / "ckpt", nan_in_norm)
    result = build(bad, tmp_path / "e", "--allow_nonfinite")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["warning: building with non-finite weights (--allow_nonfinite): "
                                          "model.layers.1.input_layernorm.weight holds 1 NaN."]
    assert (tmp_path / "e" / "config.json").is_file()


def test_refusal_in_a_real_process(tmp_path, llama):
    bad = corrupt(llama, tmp_path / "ckpt", transpose_q_proj)
    out = tmp_path / "e"
    r = subprocess.run([sys.executable, "-m", "specdec.cli.build", "--checkpoint_dir", str(bad), "--output_dir", str(out), "--max_seq_len", "64"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith(f"error: {Q_PROJ} in model.safetensors has shape [64, 128]"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert not out.exists() and not list(tmp_path.glob(".e*"))
