"""Pre-quantized GPTQ / AWQ / compressed-tensors checkpoints read exactly.

Random codes, zero points and scales are packed by the test's own writers of
the published layouts (tests/quant_layouts.py), saved to safetensors, read
back by the builder, and IntWeight.dequantized() must equal the numpy
reference (q - zero) * scale bit for bit.
"""

import json

import numpy as np
import pytest
import torch
from conftest import cli_build
from quant_layouts import (
    pack_awq,
    pack_compressed,
    pack_gptq,
    quantization_config,
    random_layer,
    reference,
    save_float_checkpoint,
    save_quantized_checkpoint,
)
from safetensors.torch import save_file

from specdec.builder.checkpoint import load_checkpoint
from specdec.builder.quant_checkpoints import IntConvention
from specdec.builder.quantization import LinearWeight, concat_out, detect_checkpoint_quantization, read_linear
from specdec.formats.errors import CheckpointError

N_IN, N_OUT = 256, 64


def write(tmp_path, tensors: dict[str, torch.Tensor], qc: dict | None):
    """A checkpoint directory holding ``tensors``; returns (Checkpoint, its detected convention)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "model.safetensors")
    cfg = {"quantization_config": qc} if qc else {}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ckpt = load_checkpoint(tmp_path)
    return ckpt, detect_checkpoint_quantization(ckpt.hf_config, ckpt.path)


def prefixed(name: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v for k, v in tensors.items()}


def assert_exact(lw: LinearWeight, codes, zeros, scales, g_idx, bits, source):
    assert lw.is_int and lw.int_weight.bits == bits and lw.int_weight.source == source
    got, want = lw.int_weight.dequantized(), reference(codes, zeros, scales, g_idx)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want)


GROUPS = [32, 64, 128, 0]  # 0: per output channel (group_size -1 / strategy channel)


GROUPINGS = [(g, False) for g in GROUPS] + [(g, True) for g in GROUPS if g]  # act-order needs groups to permute


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size,act_order", GROUPINGS)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("v1", [True, False])
def test_gptq_round_trip(tmp_path, bits, group_size, symmetric, act_order, v1):
    rng = np.random.default_rng(bits * 1000 + group_size + 7 * symmetric + 3 * act_order + v1)
    # v1 stores zero - 1: a zero of 0 cannot be written (tested separately below)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, bits, group_size, symmetric, act_order, zero_min=1 if v1 else 0)
    ckpt, conv = write(tmp_path, prefixed("layer", pack_gptq(codes, zeros, scales, g_idx, bits, v1=v1)),
                       quantization_config("gptq", bits, group_size, symmetric, act_order, v1))
    assert conv == IntConvention("gptq", bits, group_size, symmetric, act_order, "gptq" if v1 else "gptq_v2")
    lw = read_linear(ckpt, "layer", conv)
    assert_exact(lw, codes, zeros, scales, g_idx, bits, "gptq")
    w = lw.int_weight
    if act_order:  # rows regrouped: stored row r is input channel perm[r], and groups are contiguous again
        assert w.perm is not None and np.array_equal(np.sort(w.perm), np.arange(N_IN))
        assert np.array_equal(g_idx[w.perm], np.arange(N_IN) // group_size)
    else:
        assert w.perm is None
    assert w.symmetric == symmetric and w.group_size == (group_size or N_IN)


@pytest.mark.parametrize("group_size", GROUPS)
def test_awq_gemm_round_trip(tmp_path, group_size):
    rng = np.random.default_rng(group_size)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, 4, group_size, symmetric=False, act_order=False)
    ckpt, conv = write(tmp_path, prefixed("layer", pack_awq(codes, zeros, scales)), quantization_config("awq", 4, group_size))
    assert conv == IntConvention("awq", 4, group_size, False, False, "gemm")
    assert_exact(read_linear(ckpt, "layer", conv), codes, zeros, scales, g_idx, 4, "awq-checkpoint")


def test_awq_interleave_is_undone(tmp_path):
    """Column c of the word must come back as column c: codes 0..7 in columns 0..7 of one word."""
    codes = np.tile(np.arange(8, dtype=np.uint8), (32, 1))  # [32 in, 8 out], column c holds c
    zeros = np.zeros((1, 8), np.uint8)
    scales = np.ones((1, 8), np.float32)
    packed = pack_awq(codes, zeros, scales)
    assert packed["qweight"][0, 0].item() == 0x75316420  # nibble i holds column [0,2,4,6,1,3,5,7][i]
    ckpt, conv = write(tmp_path, prefixed("layer", packed), quantization_config("awq", 4, 32))
    assert np.array_equal(read_linear(ckpt, "layer", conv).int_weight.codes, codes)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size,act_order", GROUPINGS)
@pytest.mark.parametrize("symmetric", [True, False])
def test_compressed_tensors_round_trip(tmp_path, bits, group_size, symmetric, act_order):
    rng = np.random.default_rng(bits * 100 + group_size + 5 * symmetric + act_order)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, bits, group_size, symmetric, act_order)
    tensors = pack_compressed(codes, zeros, scales, g_idx if act_order else None, bits, symmetric)
    ckpt, conv = write(tmp_path, prefixed("layer", tensors), quantization_config("compressed-tensors", bits, group_size, symmetric, act_order))
    assert conv == IntConvention("compressed-tensors", bits, group_size, symmetric, act_order, "pack-quantized")
    # bfloat16 scales: the reference uses the same bfloat16-rounded values
    scales = tensors["weight_scale"].float().numpy().T
    assert_exact(read_linear(ckpt, "layer", conv), codes, zeros, scales, g_idx, bits, "compressed-tensors")


def test_compressed_tensors_unaligned_input_width(tmp_path):
    """196 inputs: weight_packed pads the last word, weight_shape says where the row ends; the last group is short."""
    rng = np.random.default_rng(3)
    codes, zeros, scales, g_idx = random_layer(rng, 196, 24, 4, 32, symmetric=False, act_order=False)
    tensors = pack_compressed(codes, zeros, scales, None, 4, symmetric=False)
    assert tuple(tensors["weight_packed"].shape) == (24, 25)
    ckpt, conv = write(tmp_path, prefixed("layer", tensors), quantization_config("compressed-tensors", 4, 32, symmetric=False))
    assert_exact(read_linear(ckpt, "layer", conv), codes, zeros, tensors["weight_scale"].float().numpy().T, g_idx, 4, "compressed-tensors")


def test_compressed_tensors_tensor_strategy_and_unpacked_zero_points(tmp_path):
    """One scale for the whole tensor (strategy tensor), and zero points stored as plain signed int8 [out, groups]
    (writers before packed zero points): both mean the same w = (q - z) * s."""
    rng = np.random.default_rng(4)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, 4, 0, symmetric=False, act_order=False)
    scales[:] = scales[0, 0]
    tensors = pack_compressed(codes, zeros, scales, None, 4, symmetric=False)
    tensors["weight_scale"] = tensors["weight_scale"][:1, :1].reshape(1).contiguous()
    tensors["weight_zero_point"] = torch.from_numpy((zeros.T.astype(np.int64) - 8).astype(np.int8))  # [out, 1] signed
    qc = quantization_config("compressed-tensors", 4, 0, symmetric=False)
    qc["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"
    ckpt, conv = write(tmp_path, prefixed("layer", tensors), qc)
    scales = np.full_like(scales, tensors["weight_scale"].float().item())
    assert_exact(read_linear(ckpt, "layer", conv), codes, zeros, scales, g_idx, 4, "compressed-tensors")


def test_legacy_quantize_config_json_is_read(tmp_path):
    """AutoGPTQ checkpoints from before transformers' integration keep their settings in quantize_config.json."""
    rng = np.random.default_rng(2)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, 4, 128, symmetric=True, act_order=False)
    ckpt, conv = write(tmp_path, prefixed("layer", pack_gptq(codes, zeros, scales, g_idx, 4)), None)
    assert conv is None
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False, "sym": True}))
    conv = detect_checkpoint_quantization(ckpt.hf_config, ckpt.path)
    assert conv == IntConvention("gptq", 4, 128, True, False, "gptq")
    assert_exact(read_linear(ckpt, "layer", conv), codes, zeros, scales, g_idx, 4, "gptq")


def test_fused_act_order_projections_stay_exact(tmp_path):
    """q|k|v share their input, so GPTQ gives them one g_idx; the fused weight is still exact."""
    rng = np.random.default_rng(11)
    g_idx = (np.arange(N_IN) // 32)[rng.permutation(N_IN)]
    tensors, refs = {}, []
    for name, n_out in (("q", 64), ("k", 32), ("v", 32)):
        codes, zeros, scales, _ = random_layer(rng, N_IN, n_out, 4, 32, symmetric=True, act_order=False)
        tensors.update(prefixed(name, pack_gptq(codes, zeros, scales, g_idx, 4)))
        refs.append(reference(codes, zeros, scales, g_idx))
    ckpt, conv = write(tmp_path, tensors, quantization_config("gptq", 4, 32, act_order=True))
    fused = concat_out([read_linear(ckpt, n, conv) for n in ("q", "k", "v")])
    assert fused.int_weight.codes.shape == (N_IN, 128)
    assert np.array_equal(fused.int_weight.dequantized(), np.concatenate(refs, axis=1))


def test_fusing_refuses_different_layouts(tmp_path):
    rng = np.random.default_rng(12)
    tensors = {}
    for name in ("q", "k"):  # each with its own shuffle: two different input orders
        codes, zeros, scales, g_idx = random_layer(rng, N_IN, 32, 4, 32, symmetric=True, act_order=True)
        tensors.update(prefixed(name, pack_gptq(codes, zeros, scales, g_idx, 4)))
    tensors["v.weight"] = torch.zeros(32, N_IN)  # left in float
    ckpt, conv = write(tmp_path, tensors, quantization_config("gptq", 4, 32, act_order=True))
    with pytest.raises(CheckpointError, match="layers q, k have different act-order permutations"):
        concat_out([read_linear(ckpt, n, conv) for n in ("q", "k")])
    with pytest.raises(CheckpointError, match="layers q, v mix integer-quantized and float weights"):
        concat_out([read_linear(ckpt, n, conv) for n in ("q", "v")])
    assert read_linear(ckpt, "v", conv).dense.shape == (N_IN, 32)  # a module left unquantized reads as float


def gptq_tensors(rng, bits=4, group_size=32, act_order=False, n_in=N_IN):
    codes, zeros, scales, g_idx = random_layer(rng, n_in, N_OUT, bits, group_size, True, act_order)
    return prefixed("layer", pack_gptq(codes, zeros, scales, g_idx, bits))


def test_corrupt_gptq_tensors_get_clear_errors(tmp_path):
    rng = np.random.default_rng(5)
    qc = quantization_config("gptq", 4, 32)
    good = gptq_tensors(rng)

    def read(tensors, cfg=qc, sub="x"):
        ckpt, conv = write(tmp_path / sub, tensors, cfg)
        return read_linear(ckpt, "layer", conv)

    # wrong packed size: qweight with rows missing no longer matches its 8 groups of scales
    with pytest.raises(CheckpointError, match=r"layer.scales has shape \[8, 64\]; expected \[7, 64\]"):
        read({**good, "layer.qweight": good["layer.qweight"][:28]}, sub="short")
    with pytest.raises(CheckpointError, match=r"quantized weight layer.qweight has no 'layer.scales'"):
        read({k: v for k, v in good.items() if k != "layer.scales"}, sub="noscales")
    with pytest.raises(CheckpointError, match=r"layer.qzeros has shape \[8, 4\]; expected \[8, 8\]"):
        read({**good, "layer.qzeros": good["layer.qzeros"][:, :4]}, sub="zeros")
    with pytest.raises(CheckpointError, match=r"layer.g_idx has shape \[255\]; expected \[256\]"):
        read({**good, "layer.g_idx": good["layer.g_idx"][:-1]}, sub="gidx")
    with pytest.raises(CheckpointError, match="layer.qweight has dtype F32; expected I32"):
        read({**good, "layer.qweight": good["layer.qweight"].float()}, sub="dtype")
    # the config says symmetric but the zero points say otherwise
    asymmetric = prefixed("layer", pack_gptq(*random_layer(rng, N_IN, N_OUT, 4, 32, False, False, zero_min=1), 4))
    with pytest.raises(CheckpointError, match="says symmetric but the zero points are not all 8"):
        read(asymmetric, sub="asym")
    # a permuted g_idx the config does not declare
    with pytest.raises(CheckpointError, match="does not declare act-order"):
        read(gptq_tensors(rng, act_order=True), sub="undeclared")


def test_act_order_with_uneven_groups_is_refused(tmp_path):
    rng = np.random.default_rng(6)
    codes, zeros, scales, _ = random_layer(rng, N_IN, N_OUT, 4, 32, True, False)
    g_idx = np.arange(N_IN) // 32
    g_idx[0], g_idx[-1] = 7, 7  # group 7 gets 33 channels, group 0 31
    ckpt, conv = write(tmp_path, prefixed("layer", pack_gptq(codes, zeros, scales, g_idx, 4)), quantization_config("gptq", 4, 32, act_order=True))
    with pytest.raises(CheckpointError, match="puts 31..33 input channels in a group; act-order is read only when every group holds group_size=32"):
        read_linear(ckpt, "layer", conv)


def test_gptq_v1_zero_point_overflow_is_refused(tmp_path):
    """v1 stores zero - 1; a zero of 0 wraps to 15 (and spills into its neighbours): it cannot mean a 4-bit zero."""
    rng = np.random.default_rng(8)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, 4, 32, False, False, zero_min=1)
    zeros[0, 7] = 0  # the last nibble of its word: wraps to 15 without spilling
    ckpt, conv = write(tmp_path, prefixed("layer", pack_gptq(codes, zeros, scales, g_idx, 4)), quantization_config("gptq", 4, 32, symmetric=False))
    with pytest.raises(CheckpointError, match="stored zero point of 15: v1 GPTQ means 16.*re-save it in gptq_v2"):
        read_linear(ckpt, "layer", conv)


def test_compressed_tensors_corrupt_tensors(tmp_path):
    rng = np.random.default_rng(9)
    codes, zeros, scales, g_idx = random_layer(rng, N_IN, N_OUT, 4, 32, False, False)
    good = prefixed("layer", pack_compressed(codes, zeros, scales, None, 4, symmetric=False))
    qc = quantization_config("compressed-tensors", 4, 32, symmetric=False)

    def read(tensors, sub):
        ckpt, conv = write(tmp_path / sub, tensors, qc)
        return read_linear(ckpt, "layer", conv)

    with pytest.raises(CheckpointError, match=r"layer.weight_packed has shape \[64, 16\]; expected \[64, 32\]"):
        read({**good, "layer.weight_packed": good["layer.weight_packed"][:, :16]}, "packed")
    with pytest.raises(CheckpointError, match="asymmetric compressed-tensors weight layer.weight_packed has no 'layer.weight_zero_point'"):
        read({k: v for k, v in good.items() if k != "layer.weight_zero_point"}, "nozp")
    with pytest.raises(CheckpointError, match="has no 'layer.weight_scale'"):
        read({k: v for k, v in good.items() if k != "layer.weight_scale"}, "noscale")


@pytest.mark.parametrize(
    "qc,message",
    [
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ checkpoint with bits=3 is not supported; expected one of 4, 8"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin' is not supported"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"-:.*": {}}}, r"per-module overrides \(quantization_config.dynamic\)"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}, "quantized lm_head"),
        ({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"}, "AWQ checkpoint with bits=8 is not supported; expected one of 4"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "AWQ version 'gemv' is not supported; expected 'gemm'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "zero_point: false is not supported"),
        (quantization_config("compressed-tensors", 4,
                             128) | {"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
                                                             "input_activations": {"num_bits": 8}}}}, "quantizes activations too"),
        (quantization_config("compressed-tensors", 2, 128), "compressed-tensors checkpoint with bits=2 is not supported"),
        (quantization_config("compressed-tensors", 4,
                             128) | {"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "block"}}}},
         "strategy 'block' is not supported"),
    ],
)
def test_unsupported_conventions_are_refused(tmp_path, qc, message):
    with pytest.raises(CheckpointError, match=message):
        detect_checkpoint_quantization({"quantization_config": qc}, tmp_path)


def test_quantized_lm_head_is_refused_before_it_is_tied(tmp_path):
    """The network ties lm_head to the embedding when lm_head.weight is absent: a packed lm_head must stop the build."""
    rng = np.random.default_rng(10)
    tensors = {**gptq_tensors(rng), **prefixed("lm_head", pack_gptq(*random_layer(rng, N_IN, N_OUT, 4, 32, True, False), 4))}
    with pytest.raises(CheckpointError, match=r"quantizes lm_head \(lm_head.qweight\)"):
        write(tmp_path, tensors, quantization_config("gptq", 4, 32))


def test_packed_weights_without_quantization_config(tmp_path):
    ckpt, conv = write(tmp_path, gptq_tensors(np.random.default_rng(1)), None)
    assert conv is None
    with pytest.raises(CheckpointError, match="layer is stored as packed integers but config.json has no quantization_config"):
        read_linear(ckpt, "layer", conv)


def test_fp8_and_float_checkpoints_are_not_integer_conventions(tmp_path):
    assert detect_checkpoint_quantization({}, tmp_path) is None
    fp8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}}
    assert not isinstance(detect_checkpoint_quantization({"quantization_config": fp8}, tmp_path), IntConvention)


# ---------------------------------------------------------------------------
# Whole checkpoints in the published layouts, through specdec-build and specdec-run
# ---------------------------------------------------------------------------

# hidden 128 / intermediate 256: every group size divides every input width; head_dim 32
QUANT_TINY = dict(hidden_size=128, intermediate_size=256)
QUANTIZED = {  # name -> save_quantized_checkpoint arguments: the variants users meet most
    "gptq-act-order": dict(method="gptq", bits=4, group_size=32, symmetric=True, act_order=True),
    "awq": dict(method="awq", bits=4, group_size=32, symmetric=False),
    "compressed-tensors-int8": dict(method="compressed-tensors", bits=8, group_size=0, symmetric=True),
    # a group MatMulNBits' power-of-two blocks cannot hold: ort_cpu falls back to DequantizeLinear + MatMul
    "gptq-group-40": dict(method="gptq", bits=4, group_size=40, symmetric=True),
}


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    from checkpoints import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("quant_ckpt") / "float", **QUANT_TINY)


def engine_logits(engine_dir, ids=(5, 17, 33, 2, 61, 8, 90, 41, 12, 7)) -> np.ndarray:
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ex = OrtExecutor(load_engine_dir(engine_dir), num_threads=1)
    return ex.forward(ex.new_cache(1), [list(ids)], all_logits=True).logits.copy()[0]  # [tokens, vocab]


@pytest.mark.parametrize("variant", list(QUANTIZED))
def test_published_checkpoint_builds_and_decodes(tmp_path, float_model, variant):
    """Tolerance: the int engine runs the checkpoint's codes in com.microsoft.MatMulNBits at accuracy_level 4,
    which rounds each block of a GEMM's input to int8 (about 0.4% of its scale per GEMM, see
    test_weight_only.py); through 2 layers x 4 GEMMs that stays within 3% of the logits' range, while
    reading the packing wrongly (a nibble order, the v1 zero offset, the act-order permutation) moves them by
    tens of percent; an int4 engine must also be much closer to its dequantized twin than to the float model
    the codes were rounded from."""
    spec = QUANTIZED[variant]
    quantized = tmp_path / variant
    meant = save_quantized_checkpoint(float_model, quantized, **spec)
    twin = save_float_checkpoint(quantized, tmp_path / "dequantized", meant)

    r = cli_build(quantized, tmp_path / "int", "--dtype", "float32", "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", 4)
    assert r.exit_code == 0, r.output
    wo = json.loads((tmp_path / "int" / "config.json").read_text())["build"]["weight_only"]
    source = {"gptq": "gptq", "awq": "awq-checkpoint", "compressed-tensors": "compressed-tensors"}[spec["method"]]
    assert (wo["bits"], wo["group_size"], wo["symmetric"], wo["act_order"], wo["source"]) == (
        spec["bits"], spec["group_size"], spec["symmetric"], spec.get("act_order", False), source)
    for ckpt, out in ((twin, "f32"), (float_model, "orig")):
        assert cli_build(ckpt, tmp_path / out, "--dtype", "float32").exit_code == 0

    got, want, original = (engine_logits(tmp_path / d) for d in ("int", "f32", "orig"))
    span = want.max() - want.min()
    assert np.abs(got - want).max() <= 0.03 * span, np.abs(got - want).max() / span
    if spec["bits"] == 4:  # int4's rounding dwarfs the int8 activations' (int8 weights' does not)
        assert np.abs(got - want).max() < 0.5 * np.abs(got - original).max()

    # decodes through specdec-run, target-only and with n-gram drafts verified by the quantized target,
    # token for token the same (tests/runtime/test_weight_only_spec.py holds the lowering to it bit for bit).
    from click.testing import CliRunner

    from specdec.cli.run import main as run_main

    (tmp_path / "prompts.csv").write_text("5,6,7,8,5,6,7\n9,10,11\n")
    r = CliRunner().invoke(run_main, [str(a) for a in ("--engine_dir", tmp_path / "int", "--ngram_config", "[4,2,[0]]",
                                                        "--input_file", tmp_path / "prompts.csv", "--max_output_len", 12,
                                                        "--baseline", "--output_json", tmp_path / "o.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "o.json").read_text())
    assert [len(q["output_ids"]) for q in report["requests"]] == [12, 12]
    assert report["metrics"]["drafted"] > 0  # the prompts repeat: n-gram drafts were verified
    assert "outputs identical to target-only: yes" in r.output


def corrupt_gptq(tensors):
    tensors["model.layers.0.self_attn.q_proj.qweight"] = tensors["model.layers.0.self_attn.q_proj.qweight"][:12].contiguous()


def drop_scales(tensors):
    del tensors["model.layers.1.mlp.down_proj.scales"]


def short_g_idx(tensors):
    tensors["model.layers.0.mlp.up_proj.g_idx"] = tensors["model.layers.0.mlp.up_proj.g_idx"][:-1].contiguous()


def three_bits(cfg):
    cfg["quantization_config"]["bits"] = 3


@pytest.mark.parametrize("edit_tensors,edit_config,message", [
    (corrupt_gptq, None, "error: model.layers.0.self_attn.q_proj.scales has shape [4, 128]; expected [3, 128]"),
    (drop_scales, None, "error: quantized weight model.layers.1.mlp.down_proj.qweight has no 'model.layers.1.mlp.down_proj.scales'"),
    (short_g_idx, None, "error: model.layers.0.mlp.up_proj.g_idx has shape [127]; expected [128]"),
    (None, three_bits, "error: GPTQ checkpoint with bits=3 is not supported; expected one of 4, 8."),
])
def test_corrupt_checkpoint_is_one_clean_cli_error(tmp_path, float_model, edit_tensors, edit_config, message):
    from safetensors.torch import load_file

    ckpt = tmp_path / "gptq"
    save_quantized_checkpoint(float_model, ckpt, "gptq", bits=4, group_size=32, act_order=True)
    if edit_tensors:
        tensors = load_file(ckpt / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, ckpt / "model.safetensors")
    if edit_config:
        cfg = json.loads((ckpt / "config.json").read_text())
        edit_config(cfg)
        (ckpt / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "engine"
    r = cli_build(ckpt, out)
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(message), r.stderr
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    assert not out.exists() and not list(tmp_path.glob(".engine*")), list(tmp_path.iterdir())
