"""FP8: checkpoints as published (ModelOpt, compressed-tensors, block-wise) and build-time quantization.

The reference is independent: torch quantizes/dequantizes the weights and
transformers runs the dequantized model.
"""

import json

import numpy as np
import onnx
import pytest
import torch
from checkpoints import hf_with_weights, make_checkpoint, save_fp8_checkpoint
from conftest import build_and_load, spec_build

from specdec.builder.build import build_engine
from specdec.formats.errors import CheckpointError

ARCH = dict(hidden_size=64, intermediate_size=128, vocab_size=96)
IDS = torch.tensor([[5, 17, 33, 2, 61, 8, 90, 41, 12, 7]])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("fp8") / "base", "LlamaForCausalLM", **ARCH)


def engine_logits(ex, ids=IDS) -> np.ndarray:
    cache = ex.new_cache(1)
    return ex.forward(cache, [ids[0].tolist()], all_logits=True).logits.copy()[0]


def engine_context_logits_all(ex, ids=IDS):
    cache = ex.new_cache(1)
    ex.forward(cache, [ids[0, :1].tolist()], all_logits=False)
    return ex.forward(cache, [ids[0, 1:].tolist()], all_logits=True).logits.copy()[0]


@pytest.mark.parametrize("convention", ["modelopt", "compressed-tensors", "fp8"])
def test_fp8_checkpoint_matches_dequantized_reference(base, tmp_path, convention):
    reference = save_fp8_checkpoint(base, tmp_path / "ckpt", convention)
    ex = build_and_load(tmp_path / "ckpt", tmp_path / "engine")
    cfg = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert cfg["build"]["quantization"] == "fp8" and cfg["extra"]["checkpoint_fp8"] == convention
    with torch.no_grad():
        want = hf_with_weights(base, reference)(IDS).logits[0, 1:].numpy()
    np.testing.assert_allclose(engine_context_logits_all(ex), want, atol=2e-4, rtol=0)


def test_build_time_quantization_round_trip(base, tmp_path):
    """Quantize at build time; save the same per-channel quantization as a compressed-tensors checkpoint; same engine."""
    built = build_and_load(base, tmp_path / "q", spec_build(quantization="fp8"))
    reference = save_fp8_checkpoint(base, tmp_path / "ct", "compressed-tensors")
    loaded = build_and_load(tmp_path / "ct", tmp_path / "ct-engine")
    np.testing.assert_array_equal(engine_logits(built), engine_logits(loaded))
    with torch.no_grad():
        want = hf_with_weights(base, reference)(IDS).logits[0].numpy()
    np.testing.assert_allclose(engine_logits(built), want, atol=2e-4, rtol=0)


def test_fp8_engine_is_about_a_quarter_of_float32(base, tmp_path):
    ckpt = make_checkpoint(tmp_path / "wide", "LlamaForCausalLM", hidden_size=128, intermediate_size=512, vocab_size=96)
    sizes = {}
    for q in ("none", "fp8"):
        build_engine(ckpt, tmp_path / q, spec_build(quantization=q, dtype="float32"), say=lambda _: None)
        sizes[q] = (tmp_path / q / "model.onnx.data").stat().st_size
    assert sizes["fp8"] < 0.3 * sizes["none"], sizes


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_fp8_activations(base, tmp_path, mode):
    # "static" takes the ModelOpt checkpoint's input_scale; calibration is tested below
    ckpt = save_fp8_checkpoint(base, tmp_path / "ckpt", "modelopt") and tmp_path / "ckpt"
    ex = build_and_load(ckpt, tmp_path / "e", spec_build(fp8_activations=mode))
    weight_only = build_and_load(ckpt, tmp_path / "w", spec_build())
    a, b = engine_logits(ex), engine_logits(weight_only)
    assert np.isfinite(a).all()
    assert not np.array_equal(a, b)  # activations really went through float8
    assert np.abs(a - b).max() < 0.25 * np.abs(b).max()


def test_calibrated_static_scales(base, tmp_path):
    (tmp_path / "ckpt").mkdir()
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    import shutil

    shutil.copytree(base, tmp_path / "ckpt", dirs_exist_ok=True)
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    texts = {"e": " ".join(f"w{(i * 7) % 96}" for i in range(400)), "e1": "w1 " * 400}  # varied, and one token repeated
    scales = {}
    for out, text in texts.items():
        (tmp_path / f"{out}.txt").write_text(text)
        build_engine(tmp_path / "ckpt", tmp_path / out, spec_build(quantization="fp8", fp8_activations="static"),
                     say=lambda _: None, calib_dataset=tmp_path / f"{out}.txt", calib_size=4)
        graph = onnx.load(str(tmp_path / out / "model.onnx"), load_external_data=False).graph
        scales[out] = {t.name: float(onnx.numpy_helper.to_array(t)) for t in graph.initializer if t.name.endswith("/input_scale")}
    layers = json.loads((base / "config.json").read_text())["num_hidden_layers"]
    assert len(scales["e"]) == 4 * layers  # the fused qkv, o, fused gate_up, down inputs of every layer
    assert all(0 < v < np.inf for v in scales["e"].values())
    assert scales["e"] != scales["e1"]  # the scales come from the calibration text
    from conftest import OrtExecutor, load_engine_dir

    ex = OrtExecutor(load_engine_dir(tmp_path / "e"), num_threads=1)
    ref = build_and_load(tmp_path / "ckpt", tmp_path / "f", spec_build(quantization="fp8"))
    a, b = engine_logits(ex), engine_logits(ref)
    assert not np.array_equal(a, b)  # activations really went through float8
    assert np.abs(a - b).max() < 0.25 * np.abs(b).max()


def _edit(path, fn):
    from safetensors.torch import load_file, save_file

    t = load_file(path / "model.safetensors")
    fn(t)
    save_file(t, path / "model.safetensors")


def test_missing_scale(base, tmp_path):
    save_fp8_checkpoint(base, tmp_path / "c", "compressed-tensors")
    _edit(tmp_path / "c", lambda t: t.pop("model.layers.0.self_attn.k_proj.weight_scale"))
    with pytest.raises(CheckpointError, match="model.layers.0.self_attn.k_proj.weight has no scale tensor"):
        build_engine(tmp_path / "c", tmp_path / "e", spec_build(), say=lambda _: None)
    assert not (tmp_path / "e").exists()


def test_wrong_scale_shape(base, tmp_path):
    save_fp8_checkpoint(base, tmp_path / "c", "compressed-tensors")
    _edit(tmp_path / "c", lambda t: t.__setitem__("model.layers.1.mlp.down_proj.weight_scale", torch.ones(3, 1)))
    with pytest.raises(CheckpointError, match="down_proj.weight_scale has 3 values; expected 1 .* or 64"):
        build_engine(tmp_path / "c", tmp_path / "e", spec_build(), say=lambda _: None)


def test_e5m2_weights_are_refused(base, tmp_path):
    save_fp8_checkpoint(base, tmp_path / "c", "modelopt")
    name = "model.layers.0.mlp.up_proj.weight"
    _edit(tmp_path / "c", lambda t: t.__setitem__(name, t[name].float().to(torch.float8_e5m2)))
    with pytest.raises(CheckpointError, match="float8 e5m2; only e4m3"):
        build_engine(tmp_path / "c", tmp_path / "e", spec_build(), say=lambda _: None)


def test_fp8_without_quantization_config(base, tmp_path):
    save_fp8_checkpoint(base, tmp_path / "c", "modelopt")
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    del cfg["quantization_config"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="is FP8 but config.json has no quantization_config"):
        build_engine(tmp_path / "c", tmp_path / "e", spec_build(), say=lambda _: None)
