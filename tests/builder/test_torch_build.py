"""specdec-build --backend torch: the engine's files (formats/torch_layout.py), written with numpy (no torch), and
what they compute: transformers' logits for every architecture (float32, on the CPU executor), and for weight-only
and pre-quantized checkpoints the onnxruntime engine's logits of the same integers (its portable lowering dequantizes
them in float32, as the torch engine does)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint
from conftest import cli_build, spec_build
from test_awq import outlier_ckpt  # noqa: F401  (a module fixture: a checkpoint with outlier channels and calibration text)
from test_parity import CASES
from test_weight_only import ARCH, gptq_act_order  # noqa: F401  (a module fixture)

from specdec.builder.build import build_engine
from specdec.formats.engine_format import load_engine_dir
from specdec.formats.errors import BuildConfigError
from specdec.formats.safetensors_io import SafetensorsFile
from specdec.formats.torch_layout import MODEL_FILE, layer_file, pack_int4, unpack_int4
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.backends.torch.executor import TorchExecutor

QUIET = dict(say=lambda _: None)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a busy machine's spinning threads cost more than they give
    yield
    torch.set_num_threads(threads)


def torch_engine(ckpt, out, **build):
    build_engine(ckpt, out, spec_build(**{"max_draft_len": 4, **build, "backend": "torch"}), **QUIET)
    return TorchExecutor(load_engine_dir(out), "cpu")


def logits(ex, ids=(5, 17, 33, 2, 61, 8, 90, 41, 12, 7)) -> np.ndarray:
    return ex.forward(ex.new_cache(1), [list(ids)], all_logits=True).logits[0].copy()


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(case, tmp_path):
    """Context phase, a one-token step and a 5-token verification: transformers' float32 logits."""
    arch, overrides = CASES[case]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    ex = torch_engine(ckpt, tmp_path / "engine")
    ids = torch.randint(3, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = load_hf(ckpt)(ids).logits[0].numpy()
    cache = ex.new_cache(1)
    got = [ex.forward(cache, [ids[0, :12].tolist()], all_logits=False).logits[0, 0],
           ex.forward(cache, [ids[0, 12:13].tolist()], all_logits=True).logits[0, 0],
           *ex.forward(cache, [ids[0, 13:18].tolist()], all_logits=True).logits[0]]
    np.testing.assert_allclose(np.stack(got), ref[11:18], atol=2e-4, rtol=0)


def test_the_files_hold_the_layout_and_the_checkpoints_numbers(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", tie_word_embeddings=False)
    build_engine(ckpt, tmp_path / "bf16", spec_build(0, backend="torch", dtype="bfloat16"), **QUIET)
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert (cfg["network_file"], cfg["build"]["lowering"], cfg["build"]["kv_layout"]) == (MODEL_FILE, "torch", "bnsh")
    assert cfg["extra"]["torch"] == {"layout_version": 1} and set(cfg["files"]) >= {MODEL_FILE, layer_file(0), layer_file(1),
                                                                                    "config.json"} - {"config.json"}
    layer = SafetensorsFile(tmp_path / "bf16" / layer_file(1))
    assert layer.dtype_name("qkv.weight") == "BF16" and SafetensorsFile(tmp_path / "bf16" / MODEL_FILE).dtype_name("rope_cos") == "F32"
    hf = load_hf(ckpt).model.layers[1]
    want = torch.cat([hf.self_attn.q_proj.weight, hf.self_attn.k_proj.weight, hf.self_attn.v_proj.weight]).detach()  # [out, in]
    np.testing.assert_array_equal(layer.float32("qkv.weight"), want.to(torch.bfloat16).float().numpy())  # rounded once, to nearest
    gate_up = torch.cat([hf.mlp.gate_proj.weight, hf.mlp.up_proj.weight]).detach()
    np.testing.assert_array_equal(layer.float32("gate_up.weight"), gate_up.to(torch.bfloat16).float().numpy())
    assert "lm_head.weight" in SafetensorsFile(tmp_path / "bf16" / MODEL_FILE).keys()  # untied: its own head


def test_int4_packing_round_trips():
    codes = np.random.default_rng(0).integers(0, 16, size=(7, 5), dtype=np.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (4, 5) and (packed[:, :] & 0x0F == codes[0::2]).all() and (packed[3] >> 4 == 0).all()
    np.testing.assert_array_equal(unpack_int4(packed, 7), codes)


def test_building_needs_no_torch(tmp_path):
    """The builder reads the checkpoint with numpy and writes with formats/safetensors_io.py: torch cannot even be imported."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM")
    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            "from specdec.builder.build import build_engine\n"
            "from specdec.formats.engine_format import BuildConfig\n"
            f"build_engine({str(ckpt)!r}, {str(tmp_path / 'e')!r}, BuildConfig(max_seq_len=96, max_input_len=48, max_draft_len=4, "
            "speculative_decoding_mode='draft_tokens_external', backend='torch', quantization='int4_wo', group_size=32), say=lambda _: None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "e" / "config.json").read_text())["build"]["weight_only"]["bits"] == 4


@pytest.mark.parametrize("bits, group, symmetric", [(4, 32, True), (4, 0, False), (8, 0, True), (8, 64, False)])
def test_weight_only_engines_compute_the_onnxruntime_engines_integers(bits, group, symmetric, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM")
    build = dict(max_draft_len=4, quantization=f"int{bits}_wo", group_size=group, symmetric=symmetric, quantize_lm_head=bits == 8)
    got = logits(torch_engine(ckpt, tmp_path / "torch", **build))
    build_engine(ckpt, tmp_path / "ort", spec_build(**build, lowering="portable"), **QUIET)
    want = logits(OrtExecutor(load_engine_dir(tmp_path / "ort"), num_threads=1))
    assert np.abs(got - want).max() <= 1e-5 * (want.max() - want.min())
    wo = json.loads((tmp_path / "torch" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["bits"], wo["group_size"], wo["symmetric"]) == (bits, group, symmetric) and ("lm_head" in wo["layers"]) == (bits == 8)


def test_a_gptq_act_order_checkpoint_equals_its_float_twin(gptq_act_order, tmp_path):  # noqa: F811
    ckpt, twin = gptq_act_order
    got = logits(torch_engine(ckpt, tmp_path / "e", dtype="float32"))  # (a float16 checkpoint: the CPU runs float32 engines)
    build_engine(twin, tmp_path / "t", spec_build(0, dtype="float32"), **QUIET)
    want = logits(OrtExecutor(load_engine_dir(tmp_path / "t"), num_threads=1))
    assert np.abs(got - want).max() <= 1e-5 * (want.max() - want.min())
    wo = json.loads((tmp_path / "e" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["source"], wo["act_order"]) == ("gptq", True)
    assert "qkv.perm" in SafetensorsFile(tmp_path / "e" / layer_file(0)).keys()


def test_int4_awq_finds_the_onnxruntime_builds_scales(outlier_ckpt, tmp_path):  # noqa: F811
    """The search runs on a float32 ONNX network under ONNX Runtime whatever the backend: the same scales, the same engine."""
    ckpt, calib = outlier_ckpt
    flags = ("--qformat", "int4_awq", "--group_size", 32, "--calib_dataset", calib, "--calib_size", 8)
    r = cli_build(ckpt, tmp_path / "torch", "--backend", "torch", *flags)
    assert r.exit_code == 0, r.output
    r = cli_build(ckpt, tmp_path / "ort", "--lowering", "portable", *flags)
    assert r.exit_code == 0, r.output
    got = logits(TorchExecutor(load_engine_dir(tmp_path / "torch"), "cpu"))
    want = logits(OrtExecutor(load_engine_dir(tmp_path / "ort"), num_threads=1))
    assert np.abs(got - want).max() <= 1e-5 * (want.max() - want.min())
    assert "o.input_scale" in SafetensorsFile(tmp_path / "torch" / layer_file(0)).keys()  # o_proj: AWQ's 1/s multiplied in


def test_fp8_is_refused_in_one_line(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM")
    with pytest.raises(BuildConfigError, match="the torch backend has no FP8 path yet"):
        build_engine(ckpt, tmp_path / "e", spec_build(0, backend="torch", quantization="fp8"), **QUIET)
    assert not (tmp_path / "e").exists()


def test_the_cli_builds_a_torch_engine(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM")
    r = cli_build(ckpt, tmp_path / "e", "--backend", "torch", "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", 4)
    assert r.exit_code == 0, r.output
    assert "torch engine: runs on an NVIDIA GPU with --device cuda" in r.output
    r = cli_build(ckpt, tmp_path / "e2", "--backend", "torch", "--lowering", "portable")
    assert r.exit_code != 0 and "the torch backend parses the torch lowering only, not 'portable'" in r.output + r.stderr
    r = cli_build(ckpt, tmp_path / "e3", "--lowering", "torch")
    assert r.exit_code != 0
    assert "parses the ort_cpu or portable or ort_cuda lowering only, not 'torch' (torch is the torch backend's: --backend torch)" in r.stderr
