"""Weight-only int8/int4: quantization, the lowerings' packing, and engines against the dequantized reference.

The one reference is ``IntWeight.dequantized()`` (float32, numpy). Every
lowering packs the same IntWeight for its op; these tests unpack the packing
back to the codes, run each op alone against the reference, and build whole
engines against a float32 engine whose linear weights are that reference.
"""

import json

import numpy as np
import onnxruntime as ort
import pytest
from checkpoints import dequantized_checkpoint, make_checkpoint
from conftest import build_and_load, cli_build, spec_build
from onnx import TensorProto

from specdec.builder.build import build_engine
from specdec.builder.graph import GraphBuilder
from specdec.builder.weight_only import IntWeight, quantize_rtn
from specdec.formats.errors import BuildConfigError
from specdec.plugins.quantized_gemm import (
    EvenRows,
    dq_codes,
    dq_matmul,
    dq_tensors,
    matmul_nbits,
    pack_matmul_nbits,
    permute_input,
    unpack_matmul_nbits,
)

LAYOUTS = [(bits, group, sym) for bits in (8, 4) for group in (32, 64, 128, 0) for sym in (True, False)]
IDS = [5, 17, 33, 2, 61, 8, 90, 41, 12, 7]


def numpy_dequantize(codes, scale, zero, group):
    """Written out independently of IntWeight: w[i, o] = (codes[i, o] - zero[i // g, o]) * scale[i // g, o]."""
    w = np.empty(codes.shape, np.float32)
    for i in range(codes.shape[0]):
        w[i] = (codes[i].astype(np.float32) - zero[i // group].astype(np.float32)) * scale[i // group]
    return w


@pytest.mark.parametrize("bits,group,sym", LAYOUTS)
def test_round_trip_matches_numpy_reference(bits, group, sym):
    rng = np.random.default_rng(bits * 1000 + group)
    w = rng.standard_normal((200, 24)).astype(np.float32)  # 200 rows: the last group of 32/64/128 is partial
    w[:, 3] = 0.0  # an all-zero column dequantizes to exact zeros
    q = quantize_rtn(w, bits, group, sym)
    g = group or 200
    assert q.group_size == g and q.scale.shape == (-(-200 // g), 24)
    assert q.codes.max() <= 2**bits - 1
    if sym:
        assert (q.zero == 2 ** (bits - 1)).all() and q.codes.min() >= 1  # -7..7 / -127..127 around the zero
    np.testing.assert_array_equal(q.dequantized(), numpy_dequantize(q.codes, q.scale, q.zero, g))
    assert (q.dequantized()[:, 3] == 0).all()
    # round to nearest: every value within half a step of its group's grid
    step = np.repeat(q.scale, g, axis=0)[:200]
    assert (np.abs(q.dequantized() - w) <= 0.5 * step + 1e-6 * np.abs(w)).all()


def test_act_order_perm_dequantizes_in_input_order():
    rng = np.random.default_rng(3)
    q = quantize_rtn(rng.standard_normal((64, 8)).astype(np.float32), 4, 32)
    perm = rng.permutation(64)
    permuted = IntWeight(q.codes, q.scale, q.zero, 4, 32, True, perm=perm)
    # stored row r holds input channel perm[r]: x @ deq == x[perm] @ stored
    x = rng.standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(x @ permuted.dequantized(), x[perm] @ q.dequantized(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits,group,sym", LAYOUTS)
def test_matmul_nbits_packing_unpacks_to_the_codes(bits, group, sym):
    rng = np.random.default_rng(7)
    q = quantize_rtn(rng.standard_normal((96, 40)).astype(np.float32), bits, group, sym)
    p = pack_matmul_nbits(q)
    assert p.b.dtype == np.uint8 and p.b.shape[2] == p.block_size * bits // 8
    assert p.block_size >= 16 and p.block_size & (p.block_size - 1) == 0
    codes, scale, zero = unpack_matmul_nbits(p)
    np.testing.assert_array_equal(codes, q.codes)
    rows = np.arange(96) // p.block_size  # each row's block; a block's scale/zero are its group's
    np.testing.assert_array_equal(scale[rows], np.repeat(q.scale, q.group_size, axis=0)[:96])
    np.testing.assert_array_equal(zero[rows], np.repeat(q.zero, q.group_size, axis=0)[:96])
    assert (p.zero_points is None) == sym  # symmetric: MatMulNBits' default zero (mid-range), nothing stored


@pytest.mark.parametrize("bits,group,sym", LAYOUTS)
def test_dequantize_linear_packing_unpacks_to_the_codes(bits, group, sym):
    rng = np.random.default_rng(8)
    q = quantize_rtn(rng.standard_normal((96, 40)).astype(np.float32), bits, group, sym)
    elem_type, raw, zero = dq_tensors(q)
    codes = dq_codes(elem_type, raw, q.codes.shape)
    if sym:  # signed codes, no zero point: what TensorRT's weight-only GEMMs take
        assert elem_type == (TensorProto.INT4 if bits == 4 else TensorProto.INT8) and zero is None
        np.testing.assert_array_equal(codes, q.codes.astype(np.int16) - 2 ** (bits - 1))
    else:
        assert elem_type == (TensorProto.UINT4 if bits == 4 else TensorProto.UINT8)
        np.testing.assert_array_equal(codes, q.codes)
        np.testing.assert_array_equal(zero, q.zero)


def run_op(lower, q: IntWeight, x: np.ndarray) -> np.ndarray:
    """One quantized GEMM alone, as a lowering writes it: x [B, S, K] -> [B, S, N]."""
    gb = GraphBuilder()
    xin = gb.input("x", TensorProto.FLOAT, ["b", "s", q.in_features])
    rows = gb.input("rows", TensorProto.INT64, ["b", "s"])
    y = lower(gb, "/l", permute_input(gb, "/l", xin, q), q, rows)
    gb.op("Identity", [y], "/out", outputs=["y"])
    gb.output("y", TensorProto.FLOAT, ["b", "s", q.out_features])
    model = gb.model("op", extra_opsets={"com.microsoft": 1})
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    # no graph rewrites: the op as written (ONNX Runtime would otherwise turn DQ + MatMul into MatMulNBits)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "rows": np.zeros(x.shape[:2], np.int64)})[0]


def nbits(accuracy_level):
    return lambda gb, name, x, q, rows: matmul_nbits(gb, name, x, q, EvenRows(gb, rows), accuracy_level)


def dq(gb, name, x, q, rows):
    return dq_matmul(gb, name, x, q)


@pytest.mark.parametrize("bits,group,sym", LAYOUTS)
@pytest.mark.parametrize("act_order", [False, True])
def test_each_op_computes_the_reference(bits, group, sym, act_order):
    """Both lowerings' ops against x @ IntWeight.dequantized() in float64.

    DequantizeLinear + MatMul and MatMulNBits at accuracy_level 0 compute in float32: within float32 rounding.
    accuracy_level 4 (the ort_cpu choice) quantizes each block of activations to int8 (scale amax / 127): an
    error up to amax / 254 per input element, about 0.4% of the output's scale on these random inputs.
    """
    rng = np.random.default_rng(bits + group)
    q = quantize_rtn(rng.standard_normal((96, 40)).astype(np.float32), bits, group, sym)
    if act_order:
        q.perm = rng.permutation(96)
    x = rng.standard_normal((3, 3, 96)).astype(np.float32)  # 9 rows: odd, padded to 10 for MatMulNBits
    want = x.astype(np.float64) @ q.dequantized().astype(np.float64)
    scale = np.abs(want).max()
    for lower, tol in ((dq, 1e-6), (nbits(0), 1e-6), (nbits(4), 1e-2)):
        got = run_op(lower, q, x)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= tol * scale, (lower, np.abs(got - want).max() / scale)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_matmul_nbits_rows_agree_whatever_the_row_count(bits, accuracy_level):
    """MatMulNBits computes one row with another kernel than a pair of rows (their last bits differ);
    padded to an even count, a row's result is the same bits in a 1-row (decode) and a 9-row (verify) call."""
    rng = np.random.default_rng(11)
    q = quantize_rtn(rng.standard_normal((256, 64)).astype(np.float32), bits, 128)
    x = rng.standard_normal((1, 9, 256)).astype(np.float32)
    together = run_op(nbits(accuracy_level), q, x)
    alone = np.concatenate([run_op(nbits(accuracy_level), q, x[:, i : i + 1]) for i in range(9)], axis=1)
    np.testing.assert_array_equal(together, alone)
    batched = run_op(nbits(accuracy_level), q, x[0].reshape(3, 3, 256)).reshape(1, 9, 64)  # rows of a ragged batch
    np.testing.assert_array_equal(batched, together)


# -- engines ----------------------------------------------------------------------

ARCH = dict(hidden_size=128, intermediate_size=256, vocab_size=96)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("wo") / "base", "LlamaForCausalLM", **ARCH)


def logits(ex, ids=IDS) -> np.ndarray:
    cache = ex.new_cache(1)
    return ex.forward(cache, [ids], all_logits=True).logits.copy()[0]


@pytest.mark.parametrize("lowering", ["ort_cpu", "portable", "ort_cuda"])
@pytest.mark.parametrize("bits,group,sym", [(4, 32, True), (4, 64, False), (8, 0, True)])
def test_int_engine_matches_float_engine_of_dequantized_weights(base, tmp_path, lowering, bits, group, sym):
    """Tolerances, per lowering as the executor runs it:

    ort_cuda (its float32 build, which the CPU runs): MatMulNBits without an accuracy level computes in the
    activations' dtype, float32 here: equal up to float32 rounding, as portable. (Its bfloat16 build rounds the
    scales to bfloat16 too: what it computes is checked against its own target-only output, on a GPU.)

    portable: the executor folds DequantizeLinear of constant weights into float32 once, at load
    (session.disable_quant_qdq, as for FP8), so the engine computes with exactly the dequantized weights:
    equal up to float32 rounding (1e-5 of the logits' range).
    ort_cpu: MatMulNBits at accuracy_level 4 rounds each block of a GEMM's input to int8, about 0.4% of its
    scale per GEMM (test_each_op_computes_the_reference). Through 2 layers x 4 GEMMs, with RMSNorm
    renormalising in between, that stays under 3% of the logits' range here; a wrong packing (codes,
    scales, zero points or groups misplaced) moves them by tens of percent.
    """
    q = f"int{bits}_wo"
    ex = build_and_load(base, tmp_path / "int", spec_build(quantization=q, group_size=group, symmetric=sym, lowering=lowering, dtype="float32"))
    ref = build_and_load(dequantized_checkpoint(base, tmp_path / "deq", bits, group or 0, sym), tmp_path / "f32",
                         spec_build(quantization="none", lowering=lowering, dtype="float32"))
    got, want = logits(ex), logits(ref)
    span = want.max() - want.min()
    tolerance = 0.03 if lowering == "ort_cpu" else 1e-5  # ort_cuda: see the docstring
    assert np.abs(got - want).max() <= tolerance * span, np.abs(got - want).max() / span
    if bits == 4:
        # int4's rounding is far larger than the kernels' int8 activations: the engine is much closer to the
        # dequantized reference than to the float model it was quantized from (int8's rounding is not)
        original = build_and_load(base, tmp_path / "orig", spec_build(quantization="none", lowering=lowering, dtype="float32"))
        assert np.abs(got - want).max() < 0.5 * np.abs(got - logits(original)).max()
    cfg = json.loads((tmp_path / "int" / "config.json").read_text())["build"]
    assert cfg["quantization"] == q
    wo = cfg["weight_only"]
    assert (wo["bits"], wo["group_size"], wo["symmetric"], wo["source"]) == (bits, group, sym, "rtn")
    assert wo["layers"] == ["attn/o_proj", "attn/qkv_proj", "mlp/down_proj", "mlp/gate_up_proj"]  # not lm_head unless asked


def test_lowerings_agree(base, tmp_path):
    """ort_cpu (MatMulNBits, int8 activations) against portable (float32 after the folded DequantizeLinear): the 3% above."""
    engines = {lw: build_and_load(base, tmp_path / lw,
                                  spec_build(quantization="int4_wo", group_size=64, lowering=lw)) for lw in ("ort_cpu", "portable")}
    a, b = logits(engines["ort_cpu"]), logits(engines["portable"])
    assert np.abs(a - b).max() <= 0.03 * (b.max() - b.min())


def test_quantize_lm_head_and_tied_embeddings(tmp_path):
    """The LM head is quantized only when asked; a tied embedding keeps its float copy for the lookup."""
    ckpt = make_checkpoint(tmp_path / "tied", "LlamaForCausalLM", tie_word_embeddings=True, **ARCH)
    plain = build_and_load(ckpt, tmp_path / "plain", spec_build(quantization="int4_wo", group_size=32))
    head = build_and_load(ckpt, tmp_path / "head", spec_build(quantization="int4_wo", group_size=32, quantize_lm_head=True))
    assert not np.array_equal(logits(plain), logits(head))
    wo = json.loads((tmp_path / "head" / "config.json").read_text())["build"]["weight_only"]
    assert "lm_head" in wo["layers"]
    import onnx

    model = onnx.load(str(tmp_path / "head" / "model.onnx"), load_external_data=False)
    names = {t.name: t for t in model.graph.initializer}
    assert names["model.embed_tokens.weight"].data_type == TensorProto.FLOAT  # the embedding stays in --dtype
    assert any(n.op_type == "MatMulNBits" and n.name.startswith("/lm_head/") for n in model.graph.node)


def test_int4_engine_is_smaller(base, tmp_path):
    sizes = {}
    for q in ("none", "int8_wo", "int4_wo"):
        build_engine(base, tmp_path / q, spec_build(quantization=q, dtype="float32"), say=lambda _: None)
        sizes[q] = (tmp_path / q / "model.onnx.data").stat().st_size
    # embeddings stay float32 in this tiny model (vocab 96 x 128), so the ratios are above 1/4 and 1/8
    assert sizes["int4_wo"] < sizes["int8_wo"] < 0.5 * sizes["none"], sizes


@pytest.mark.parametrize("kw,message", [
    (dict(quantization="int4_wo", group_size=48), "--group_size 48 is not one of"),
    (dict(quantization="fp8", group_size=64), "applies only to weight-only quantization"),
    (dict(quantization="none", quantize_lm_head=True), "applies only to weight-only quantization"),
    (dict(quantization="int8_wo", fp8_activations="dynamic"), "needs --quantization fp8"),
    (dict(quantization="int4_awq"), "--calib_dataset"),
])
def test_invalid_combinations_are_refused(base, tmp_path, kw, message):
    with pytest.raises(BuildConfigError, match=message):
        build_engine(base, tmp_path / "e", spec_build(**kw), say=lambda _: None)
    assert not (tmp_path / "e").exists()


def test_plugins_import_nothing_from_builder():
    """The dependency runs one way, builder -> plugins: lowerings build through plugins/graph_api.GraphOps."""
    import ast
    from pathlib import Path

    import specdec.plugins

    root = Path(specdec.plugins.__file__).parent
    offenders = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                if (module.startswith("..builder") or module.startswith("specdec.builder")
                        or (node.level == 2 and any(a.name == "builder" for a in node.names))):
                    offenders.append(f"{path.name}: from {module} import ...")
            elif isinstance(node, ast.Import):
                offenders += [f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("specdec.builder")]
    assert offenders == []


@pytest.mark.parametrize("flags,bits,group", [
    (("--use_weight_only", "--weight_only_precision", "int4"), 4, 128),  # TensorRT-LLM's spelling; int4 groups of 128
    (("--use_weight_only",), 8, 0),  # TensorRT-LLM's default precision: int8, per channel
    (("--qformat", "int4_wo", "--group_size", "64", "--asymmetric"), 4, 64),
    (("--use-weight-only", "--weight-only-precision", "int8", "--group-size", "32"), 8, 32),
])
def test_cli_weight_only_flags(base, tmp_path, flags, bits, group):
    r = cli_build(base, tmp_path / "e", *flags)
    assert r.exit_code == 0, r.output
    wo = json.loads((tmp_path / "e" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["bits"], wo["group_size"], wo["symmetric"]) == (bits, group, "--asymmetric" not in flags)
    assert f"int{bits} weights" in r.output


@pytest.mark.parametrize("flags,message", [
    (("--weight_only_precision", "int4"), "needs --use_weight_only"),
    (("--use_weight_only", "--weight_only_precision", "int4", "--qformat", "fp8"), "means --qformat int4_wo, not fp8"),
    (("--qformat", "int4_wo", "--group_size", "100"), "--group_size 100 is not one of"),
    (("--qformat", "fp8", "--quantize_lm_head"), "applies only to weight-only quantization"),
])
def test_cli_refuses_bad_weight_only_flags_in_one_line(base, tmp_path, flags, message):
    r = cli_build(base, tmp_path / "e", *flags)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("error: ") and r.stderr.strip().count("\n") == 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "e").exists() and not list(tmp_path.glob(".e*"))


@pytest.fixture(scope="module")
def gptq_act_order(tmp_path_factory):
    """A GPTQ act-order int4 checkpoint in the published layout (tests/quant_layouts.py) and its float32 twin."""
    from quant_layouts import save_float_checkpoint, save_quantized_checkpoint

    d = tmp_path_factory.mktemp("gptq")
    src = make_checkpoint(d / "float", "LlamaForCausalLM", **ARCH)
    meant = save_quantized_checkpoint(src, d / "gptq", method="gptq", bits=4, group_size=32, symmetric=True, act_order=True)
    return d / "gptq", save_float_checkpoint(d / "gptq", d / "twin", meant)


@pytest.mark.parametrize("flags", [("--qformat", "none"), ("--qformat", "auto", "--max_draft_len", "4",
                                                           "--speculative_decoding_mode", "draft_tokens_external")])
def test_checkpoint_dequantized_or_portable_equals_its_float_twin(gptq_act_order, tmp_path, flags):
    """--qformat none dequantizes the checkpoint; a portable int4 engine computes with the folded float32
    weights (act-order Gather included): both within float32 rounding of the float twin."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ckpt, twin = gptq_act_order
    build_engine(ckpt, tmp_path / "e", spec_build(4 if "auto" in flags else 0, quantization=flags[1], lowering="portable", dtype="float32"),
                 say=lambda _: None)
    build_engine(twin, tmp_path / "t", spec_build(0, dtype="float32"), say=lambda _: None)
    got, want = (logits(OrtExecutor(load_engine_dir(tmp_path / d), num_threads=1)) for d in ("e", "t"))
    assert np.abs(got - want).max() <= 1e-5 * (want.max() - want.min())
    wo = json.loads((tmp_path / "e" / "config.json").read_text())["build"]["weight_only"]
    assert wo is None if flags[1] == "none" else (wo["source"], wo["act_order"]) == ("gptq", True)


def test_checkpoint_on_the_gpu_lowering_equals_its_float_twin(gptq_act_order, tmp_path):
    """A GPTQ act-order checkpoint built for ort_cuda (MatMulNBits, the act-order Gather), in float32 on the CPU."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ckpt, twin = gptq_act_order
    build_engine(ckpt, tmp_path / "e", spec_build(4, lowering="ort_cuda", dtype="float32"), say=lambda _: None)
    build_engine(twin, tmp_path / "t", spec_build(0, dtype="float32"), say=lambda _: None)
    got, want = (logits(OrtExecutor(load_engine_dir(tmp_path / d), num_threads=1)) for d in ("e", "t"))
    assert np.abs(got - want).max() <= 1e-5 * (want.max() - want.min())
    wo = json.loads((tmp_path / "e" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["source"], wo["act_order"], wo["op"]) == ("gptq", True, "MatMulNBits(compute dtype activations)")


def test_gpu_lowering_refuses_groups_matmul_nbits_cannot_hold(tmp_path):
    """A group of 40 rows has no power-of-two block: ort_cpu dequantizes it at load, ort_cuda has no such path."""
    from quant_layouts import save_quantized_checkpoint

    src = make_checkpoint(tmp_path / "float", "LlamaForCausalLM", hidden_size=160, intermediate_size=320, vocab_size=96)
    save_quantized_checkpoint(src, tmp_path / "g40", method="gptq", bits=4, group_size=40)
    r = cli_build(tmp_path / "g40", tmp_path / "e", "--lowering", "ort_cuda", "--dtype", "bfloat16")
    assert r.exit_code == 1 and "no power-of-two MatMulNBits block" in r.stderr and r.stderr.strip().count("\n") == 0, r.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("flags,message", [
    (("--qformat", "int8_wo"), "build them as they are"),
    (("--qformat", "int4_awq"), "build them as they are"),
    (("--qformat", "fp8"), "build them as they are"),
    (("--group_size", "64"), "kept as is; leave --group_size out"),
])
def test_checkpoint_is_not_requantized(gptq_act_order, tmp_path, flags, message):
    r = cli_build(gptq_act_order[0], tmp_path / "e", *flags)
    assert r.exit_code == 1 and message in r.stderr and r.stderr.strip().count("\n") == 0, r.output
    assert not (tmp_path / "e").exists()
