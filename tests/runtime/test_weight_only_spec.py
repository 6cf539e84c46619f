"""Invariant 2 with weight-only targets: greedy speculative decoding emits exactly the int4/int8 target's
own greedy tokens (never compared with float32 here: the quantized target is the reference).

MatMulNBits computes a lone row with another kernel than a pair of rows for some block sizes, and ONNX
Runtime's Attention a lone query with another kernel than several; a target engine pads where the kernels
split (and only there) so that a one-token step and a (k+1)-token verification step compute each row with
the same kernels, bit for bit (docs/precision.md).
"""

import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build

from specdec.hardware.cpu_kernels import compiler
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer

MAX_DRAFT = 8
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
REPETITIVE = [[40, 41, 42, 43, 44, 45, 40, 41, 42, 43, 44, 45, 40, 41], [7, 8, 9, 7, 8, 9, 7, 8], [3, 4, 3, 4, 3, 4]]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("wo_spec")
    target = make_checkpoint(d / "target", num_hidden_layers=2, hidden_size=64, intermediate_size=128, seed=0)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, hidden_size=64, intermediate_size=128, seed=1)
    # group 128 (one 64-row block per input here): blocks of 64 rows and more are where MatMulNBits computes a
    # lone row with another kernel (groups of 32 would pass without the padding, testing nothing)
    int4 = dict(quantization="int4_wo", group_size=128)
    return {
        "target": build_and_load(target, d / "t4", spec_build(MAX_DRAFT, **int4)),
        # groups of 32: blocks whose lone rows MatMulNBits computes as it computes pairs (on the machines measured)
        "target32": build_and_load(target, d / "t32", spec_build(MAX_DRAFT, quantization="int4_wo", group_size=32)),
        "target8": build_and_load(target, d / "t8", spec_build(MAX_DRAFT, quantization="int8_wo", quantize_lm_head=True)),
        "draft4": build_and_load(draft, d / "d4", spec_build(0, quantization="int4_wo", group_size=64, symmetric=False)),
        "draft_float": build_and_load(draft, d / "df", spec_build(0)),
        "identity": build_and_load(target, d / "i4", spec_build(0, **int4)),  # the int4 target itself, built as a draft
        "target_float": build_and_load(target, d / "tf", spec_build(MAX_DRAFT)),
        # specdec's own int4 op (plugins/cpu_kernels.py): rows never split, so nothing is padded
        **({"target_q4": build_and_load(target, d / "tq", spec_build(MAX_DRAFT, **int4, cpu_kernels="specdec")),
            "target_q4_asym": build_and_load(target, d / "tqa", spec_build(MAX_DRAFT, quantization="int4_wo", group_size=32, symmetric=False,
                                                                            cpu_kernels="specdec")),
            "draft_q4": build_and_load(draft, d / "dq", spec_build(0, quantization="int4_wo", group_size=64, cpu_kernels="specdec")),
            # int8 on the same kernel family (Q8Gemm), per channel, its LM head too; and an int4 LM head on Q4Gemm
            "target_q8": build_and_load(target, d / "tq8",
                                        spec_build(MAX_DRAFT, quantization="int8_wo", quantize_lm_head=True, cpu_kernels="specdec")),
            "target_q4_head": build_and_load(target, d / "tqh", spec_build(MAX_DRAFT, **int4, quantize_lm_head=True, cpu_kernels="specdec"))}
           if compiler() else {}),
    }


needs_cc = pytest.mark.skipif(compiler() is None, reason="--cpu_kernels specdec needs a C compiler")
Q4 = [pytest.param(name, marks=needs_cc) for name in ("target_q4", "target_q4_asym", "target_q8", "target_q4_head")]


def run(orch, prompts, max_output_len=40):
    return orch.generate(prompts, GenerationConfig(max_output_len=max_output_len))


def tokens(outputs):
    return [o.output_ids for o in outputs]


@pytest.mark.parametrize("draft_len", range(1, MAX_DRAFT + 1))
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "ragged-batch3"])
@pytest.mark.parametrize("draft", ["draft4", "draft_float"])
@pytest.mark.parametrize("target", ["target", *Q4])
def test_draft_target_equals_int4_target_greedy(engines, draft_len, prompts, draft, target):
    base, _ = run(Orchestrator(engines[target]), prompts)
    spec, m = run(Orchestrator(engines[target], DraftModelProposer(engines[draft]), draft_len), prompts)
    assert tokens(spec) == tokens(base)
    assert m.drafted > 0


@pytest.mark.parametrize("draft_len", [1, 3, 5, 8])
@pytest.mark.parametrize("prompts", [REPETITIVE[:1], REPETITIVE], ids=["batch1", "ragged-batch3"])
@pytest.mark.parametrize("target", ["target", *Q4])
def test_ngram_equals_int4_target_greedy(engines, draft_len, prompts, target):
    base, _ = run(Orchestrator(engines[target]), prompts, 48)
    spec, m = run(Orchestrator(engines[target], NGramProposer(draft_len, 2), draft_len), prompts, 48)
    assert tokens(spec) == tokens(base)
    assert m.accepted > 0


@pytest.mark.parametrize("draft_len", [3, 8])
def test_int8_target_with_quantized_head(engines, draft_len):
    base, _ = run(Orchestrator(engines["target8"]), PROMPTS)
    spec, _ = run(Orchestrator(engines["target8"], DraftModelProposer(engines["draft4"]), draft_len), PROMPTS)
    assert tokens(spec) == tokens(base)


@pytest.mark.parametrize("draft_len", [4, 8])
def test_padded_steps_run_to_max_seq_len(engines, draft_len):
    """A padded step writes one K/V slot past its tokens: up to the last position the engine allows, that slot
    stays inside the cache (kv_capacity's slack) and the output stays the target's own."""
    build = engines["target"].build
    assert build.weight_only["even_rows"]
    prompt = [[(7 * i) % 50 + 3 for i in range(build.max_input_len)]]
    n = build.max_seq_len - build.max_input_len
    base, _ = run(Orchestrator(engines["target"]), prompt, n)
    spec, m = run(Orchestrator(engines["target"], DraftModelProposer(engines["draft4"]), draft_len), prompt, n)
    assert tokens(spec) == tokens(base) and len(tokens(base)[0]) == n
    assert m.drafted > 0


def test_identity_draft_accepts_every_token(engines):
    """The int4 target drafting for itself: its one-token steps and the target's verification steps must
    compute the same logits, or some draft would be rejected."""
    spec, m = run(Orchestrator(engines["target"], DraftModelProposer(engines["identity"]), MAX_DRAFT), PROMPTS)
    assert tokens(spec) == tokens(run(Orchestrator(engines["target"]), PROMPTS)[0])
    assert m.acceptance_rate == 1.0


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("target", ["target", "target32", "target8", "target_float", *Q4])
def test_verification_logits_equal_one_token_logits_bit_for_bit(engines, batch, target):
    """One call of 9 tokens per row against 9 one-token calls on the same cache: the same bits, row by row.

    Two kernel splits would break it: MatMulNBits computes a lone row (and the odd last row of a call)
    with another kernel than rows in pairs, and ONNX Runtime's Attention a lone query row with another
    kernel than two or more. A target engine pads both (plugins/quantized_gemm.py, plugins/attention.py).
    """
    ex = engines[target]
    prompts = [p[:n] for p, n in zip(PROMPTS, (3, 2, 7), strict=True)][:batch]  # ragged: rows at different cache lengths
    follow = [[30 + i + r for i in range(9)] for r in range(batch)]
    one_call = ex.new_cache(batch)
    ex.forward(one_call, prompts, all_logits=False)
    together = ex.forward(one_call, follow, all_logits=True).logits.copy()  # [batch, 9, vocab]
    stepwise = ex.new_cache(batch)
    ex.forward(stepwise, prompts, all_logits=False)
    alone = np.concatenate([ex.forward(stepwise, [[f[i]] for f in follow], all_logits=True).logits.copy() for i in range(9)], axis=1)
    np.testing.assert_array_equal(together, alone)


def test_a_draft_engine_is_left_unpadded(engines):
    """Engines that never verify (mode none) skip the padding: nothing to agree with, and it costs a little."""
    import onnx

    for name, padded in (("draft4", False), ("target", True)):
        model = onnx.load(str(engines[name].engine.network_path), load_external_data=False)
        ops = [n.op_type for n in model.graph.node]
        assert ("Pad" in ops) == padded, name


@needs_cc
@pytest.mark.parametrize("name", ["target_q4", "target_q4_asym", "draft_q4", "target_q8", "target_q4_head"])
def test_a_q4gemm_engine_pads_nothing(engines, name):
    """--cpu_kernels specdec: every int4 (int8) layer on Q4Gemm (Q8Gemm), whose rows never split, so no Pad, no
    MatMulNBits, and the int4 draft drafting with the same op; q|k|v is one node whose one output RotaryCachedAttention
    reads whole and the MLP's silu(gate) * up is computed in the gate|up node (no Split, Sigmoid or Mul); the engine
    directory carries no native code (the runtime compiles it)."""
    import onnx

    ex = engines[name]
    op = "Q8Gemm" if name == "target_q8" else "Q4Gemm"
    model = onnx.load(str(ex.engine.network_path), load_external_data=False)
    layers = [n for n in model.graph.node if n.name.startswith("/model/layers.")]
    ops = [n.op_type for n in layers]
    assert ops.count(op) == 4 * ex.engine.config.model.num_layers  # q|k|v, o, gate|up, down
    assert [len(n.output) for n in layers if n.name.endswith("qkv_proj")] == [1] * ex.engine.config.model.num_layers
    assert not {"Split", "Sigmoid", "QuickGelu", "MatMulNBits"} & set(ops)
    assert "Pad" not in [n.op_type for n in model.graph.node]  # RotaryCachedAttention needs no padded query row either
    assert ops.count("RotaryCachedAttention") == ex.engine.config.model.num_layers and "Attention" not in ops
    head = [n.op_type for n in model.graph.node if n.name.startswith("/lm_head/")]
    assert (op in head) == ex.build.quantize_lm_head
    assert ex.build.weight_only["even_rows"] is False and ex.build.weight_only["op"].startswith(op)
    assert ex.build.weight_only["kernel_layout"] == 2 and not [f for f in ex.engine.config.files if f.endswith(".so")]


@needs_cc
def test_a_q4gemm_engine_on_a_host_that_cannot_compile_its_kernel_is_one_clear_error(engines, tmp_path, monkeypatch):
    """The runtime compiles the kernel on first use; without a C compiler (and nothing compiled yet) it says what to do,
    and an engine of another kernel layout is refused, not misread."""
    import json
    import shutil

    from specdec.formats.engine_format import load_engine_dir, sha256_file
    from specdec.formats.errors import EngineError
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(EngineError, match="built with --cpu_kernels specdec.*no C compiler"):
        OrtExecutor(load_engine_dir(engines["draft_q4"].engine.path), num_threads=1)
    monkeypatch.delenv("CC")
    copy = tmp_path / "engine"
    shutil.copytree(engines["draft_q4"].engine.path, copy)
    config = json.loads((copy / "config.json").read_text())
    config["build"]["weight_only"]["kernel_layout"] = 1  # an engine of the layout before this one (per-column zero points always)
    # an engine an earlier specdec built with layout 1: its stamp says so too (an edit of config.json alone is refused first)
    stamp = json.loads((copy / "build_stamp.json").read_text())
    stamp["build"]["weight_only"]["kernel_layout"] = 1
    (copy / "build_stamp.json").write_text(json.dumps(stamp))
    config["files"]["build_stamp.json"] = sha256_file(copy / "build_stamp.json")
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="layout is 1, this specdec's is 2: rebuild the engine"):
        OrtExecutor(load_engine_dir(copy), num_threads=1)


def _rows_split(model, node) -> bool:
    """Measured here, independently of the builder's probe: whether this MatMulNBits node (its own packed weights)
    gives some row of a 2..10-row call other bits than the same row alone."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}  # loaded with their external data
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weights = [inits[name] for name in node.input[1:]]
    one = helper.make_node("MatMulNBits", ["x", *node.input[1:]], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([one], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["m", attrs["K"]])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["m", attrs["N"]])], weights)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal((10, attrs["K"])).astype(np.float32)
    alone = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(10)])
    return any(not np.array_equal(sess.run(None, {"x": x[:m]})[0], alone[:m]) for m in range(2, 11))


@pytest.mark.parametrize("name", ["target", "target32", "target8", "draft4"])
def test_a_step_is_padded_only_where_the_kernels_split(engines, name):
    """An engine that verifies drafts pads a step to even rows (one extra token, once per step) where some
    MatMulNBits of its layers computes a lone row with another kernel, as measured here on its own weights;
    where none does, a one-token step runs one row: nothing added that it does not need."""
    import onnx

    path = engines[name].engine.network_path
    model = onnx.load(str(path), load_external_data=True)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    layer_gemms = [n for n in nbits if n.name.startswith("/model/layers.")]
    assert layer_gemms, name
    needed = engines[name].build.max_draft_len > 0 and any(_rows_split(model, n) for n in layer_gemms)
    names = {n.name for n in model.graph.node}
    assert ("/model/step_rows/input_ids" in names) == needed, name
    assert not any(n.op_type == "Pad" and n.name.startswith("/model/layers.") and "/attn/" not in n.name for n in model.graph.node), \
        "a GEMM padded on its own: the step's padding covers the layers"


@pytest.fixture(scope="module")
def gptq_target(tmp_path_factory):
    """A GPTQ act-order int4 checkpoint as published (tests/quant_layouts.py), built as a target: its codes as they are."""
    from quant_layouts import save_quantized_checkpoint

    d = tmp_path_factory.mktemp("gptq_spec")
    src = make_checkpoint(d / "float", num_hidden_layers=2, hidden_size=64, intermediate_size=128, seed=2)
    save_quantized_checkpoint(src, d / "gptq", method="gptq", bits=4, group_size=32, symmetric=True, act_order=True)
    return build_and_load(d / "gptq", d / "te", spec_build(MAX_DRAFT))


@pytest.mark.parametrize("draft_len", [1, 4, 8])
def test_gptq_act_order_target(engines, gptq_target, draft_len):
    assert gptq_target.engine.config.build.weight_only["act_order"]
    base, _ = run(Orchestrator(gptq_target), PROMPTS)
    spec, _ = run(Orchestrator(gptq_target, DraftModelProposer(engines["draft4"]), draft_len), PROMPTS)
    assert tokens(spec) == tokens(base)
    ngram, _ = run(Orchestrator(gptq_target, NGramProposer(draft_len, 2), draft_len), REPETITIVE)
    assert tokens(ngram) == tokens(run(Orchestrator(gptq_target), REPETITIVE)[0])
