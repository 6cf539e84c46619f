"""Engines built with --cpu_kernels specdec attend with specdec's RotaryCachedAttention (plugins/cpu_kernels.py): the same greedy
tokens as the same engine on ONNX Runtime's Attention and as transformers, and greedy speculation on it is exactly
target-only (invariant 2), without padding a lone query row. Int4 engines, and float ones (whose MatMuls stay ONNX
Runtime's: the op is their attention only)."""

import numpy as np
import pytest
import torch
from checkpoints import dequantized_checkpoint, load_hf, make_checkpoint
from conftest import build_and_load, engine_greedy, spec_build
from tree_paths import path_to

from specdec.hardware.cpu_kernels import compiler
from specdec.plugins.cpu_kernels import ROTARY_CACHED_ATTENTION
from specdec.plugins.ort_cpu import OrtCpuAttention
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer

pytestmark = pytest.mark.skipif(compiler() is None, reason="--cpu_kernels specdec needs a C compiler")

MAX_DRAFT = 6
GROUP = 32
ARCH = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)  # head_dim 32, 2 heads per KV head
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38]]
REPETITIVE = [[40, 41, 42, 43, 44, 45, 40, 41, 42, 43, 44, 45, 40, 41], [7, 8, 9, 7, 8, 9, 7, 8]]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("cached_attention")
    target = make_checkpoint(d / "target", seed=0, **ARCH)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, seed=1, **ARCH)
    int4 = dict(quantization="int4_wo", group_size=GROUP, cpu_kernels="specdec")
    built = {"target": build_and_load(target, d / "t", spec_build(MAX_DRAFT, **int4)),
             "draft": build_and_load(draft, d / "d", spec_build(0, **int4)),
             "tree": build_and_load(target, d / "tree", spec_build(MAX_DRAFT, tree_attention=True, **int4))}
    with pytest.MonkeyPatch.context() as mp:  # the same engine on ONNX Runtime's Attention (the path before the op)
        mp.setattr(OrtCpuAttention, "_own_attention", lambda self: False)
        built["onnx_attention"] = build_and_load(target, d / "o", spec_build(MAX_DRAFT, **int4))
    built["hf"] = load_hf(dequantized_checkpoint(target, d / "deq", 4, GROUP))  # the reference: int4 round-to-nearest weights
    return built


@pytest.fixture(scope="module")
def float_engines(tmp_path_factory):
    """float32 engines with --cpu_kernels specdec (RotaryCachedAttention, SwiGLU, MatMul; a chain target and a tree one) and
    without (ONNX Attention), a draft too."""
    d = tmp_path_factory.mktemp("cached_attention_float")
    target = make_checkpoint(d / "target", seed=0, **ARCH)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, seed=1, **ARCH)
    return {"target": build_and_load(target, d / "t", spec_build(MAX_DRAFT, cpu_kernels="specdec")),
            "tree": build_and_load(target, d / "tree", spec_build(MAX_DRAFT, tree_attention=True, cpu_kernels="specdec")),
            "draft": build_and_load(draft, d / "d", spec_build(0, cpu_kernels="specdec")),
            "onnx_attention": build_and_load(target, d / "o", spec_build(MAX_DRAFT)),
            "hf": load_hf(target)}


def ops(ex) -> list[str]:
    import onnx

    return [n.op_type for n in onnx.load(str(ex.engine.network_path), load_external_data=False).graph.node]


def test_a_chain_engine_attends_with_cached_attention_over_the_cache_in_place(engines):
    """One RotaryCachedAttention a layer from q|k|v's one Q4Gemm output to the attention output: no Split, RotaryEmbedding,
    TensorScatter or Attention, no Slice of the live slots, no mask and no Pad of a lone query row; the engine's config
    says which attention op it runs. A tree engine's node takes its tree_mask as is (no mask nodes either)."""
    ex = engines["target"]
    found = ops(ex)
    layers = ex.engine.config.model.num_layers
    assert found.count("RotaryCachedAttention") == layers
    assert not {"Attention", "CachedAttention", "TensorScatter", "RotaryEmbedding", "Split", "Slice", "Pad", "LessOrEqual", "Range"} & set(found)
    assert ex.build.weight_only["attention_op"] == ROTARY_CACHED_ATTENTION
    assert ops(engines["onnx_attention"]).count("Attention") == layers
    tree = engines["tree"]
    assert ops(tree).count("RotaryCachedAttention") == layers and tree.build.weight_only["attention_op"] == ROTARY_CACHED_ATTENTION
    assert not {"Attention", "GatherElements", "LessOrEqual", "Range"} & set(ops(tree))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_onnx_attention_and_transformers(engines, prompt):
    """40 tokens one step at a time (up to 59 cache slots): the op picks the tokens ONNX Runtime's Attention picks on the
    same engine; and on transformers' own greedy sequence (dequantized weights), fed one token a step, the engine's logits
    stay within Q4Gemm's int8-activation rounding of transformers' (2% of their range; tests/builder/test_weight_only.py
    allows 3%) and pick transformers' token wherever its lead over the runner-up is more than twice that: the int8
    activations, not attention, decide near-ties (this tiny model has many; greedy runs part after about 20 tokens)."""
    own = engine_greedy(engines["target"], prompt, 40)
    assert own == engine_greedy(engines["onnx_attention"], prompt, 40)
    with torch.no_grad():
        seq = engines["hf"].generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        want = engines["hf"](seq).logits[0, len(prompt) - 1 : -1].numpy()  # [40, vocab]: the logits that chose each token
    tokens = seq[0, len(prompt):].tolist()
    ex = engines["target"]
    cache = ex.new_cache(1)
    got = [ex.forward(cache, [prompt], all_logits=False).logits[0, -1].copy()]
    got += [ex.forward(cache, [[t]], all_logits=False).logits[0, -1].copy() for t in tokens[:-1]]
    got = np.stack(got)
    span = want.max(-1) - want.min(-1)  # [40]
    assert (np.abs(got - want).max(-1) <= 0.02 * span).all()  # (1% measured here)
    top2 = np.sort(want, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.04 * span  # no logit moved by 2% can swap these two
    assert clear.sum() >= 5 and (got.argmax(-1) == np.array(tokens))[clear].all()


def test_logits_match_onnx_attention(engines):
    """A ragged batch's prompt and one-token steps: the two attention paths' logits agree to 1% of their size. (The
    attention outputs differ in their last bits, the order of float32 sums; where that moves one of the next Q4Gemm's
    int8 activation codes, a logit moves by about 0.1%.)"""
    for name in ("target", "onnx_attention"):
        ex = engines[name]
        cache = ex.new_cache(3)
        steps = [ex.forward(cache, PROMPTS, all_logits=True).logits.copy()]
        for i in range(5):
            steps.append(ex.forward(cache, [[50 + i], [60 + i], [70 + i]], all_logits=True).logits.copy())
        engines[f"{name}_logits"] = steps
    for a, b in zip(engines["target_logits"], engines["onnx_attention_logits"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=0.01 * np.abs(b).max())


@pytest.mark.parametrize("batch", [1, 3])
def test_verification_logits_equal_one_token_logits_bit_for_bit(engines, batch):
    """One call of 7 tokens per row against 7 one-token calls on the same cache: the same bits, with no padded query row."""
    verification_equals_one_token_steps(engines["target"], batch)


def verification_equals_one_token_steps(ex, batch: int) -> None:
    prompts = [p[:n] for p, n in zip(PROMPTS, (3, 2, 7), strict=True)][:batch]
    follow = [[30 + i + r for i in range(7)] for r in range(batch)]
    together = ex.new_cache(batch)
    ex.forward(together, prompts, all_logits=False)
    one_call = ex.forward(together, follow, all_logits=True).logits.copy()
    stepwise = ex.new_cache(batch)
    ex.forward(stepwise, prompts, all_logits=False)
    alone = np.concatenate([ex.forward(stepwise, [[f[i]] for f in follow], all_logits=True).logits.copy() for i in range(7)], axis=1)
    np.testing.assert_array_equal(one_call, alone)


# a tree whose paths skip one sibling row and two then one (where ONNX Runtime's Attention regrouped a token's sums)
TREE = [-1, 0, 0, 1, 1, 2, 3, 3, 6, -1]


@pytest.mark.parametrize("kind", ["int4", "float"])
@pytest.mark.parametrize("context", [0, 2, 17])
def test_a_tree_verification_gives_each_node_the_logits_of_its_path_bit_for_bit(engines, float_engines, kind, context):
    """A tree engine verifies 10 nodes in one call: each node's logits equal, bit for bit, those of its path fed one token a
    step after the same prompt (as a chain is verified, and as greedy decoding would have reached it): tree output is exactly
    the target's (docs/precision.md). Int4 (Q4Gemm) and float32 (ONNX Runtime's MatMul) engines."""
    ex = (engines if kind == "int4" else float_engines)["tree"]
    prompt = (PROMPTS[2] * 2)[: context + 1]
    tokens = [40 + j for j in range(len(TREE))]
    cache = ex.new_cache(1)
    ex.forward(cache, [prompt], all_logits=False)
    tree = ex.forward(cache, [tokens], all_logits=True, parents=[np.array(TREE)]).logits[0].copy()
    for j in range(len(TREE)):
        np.testing.assert_array_equal(tree[j], decoded_path(ex, prompt, tokens, TREE, j), err_msg=f"node {j}, path {path_to(TREE, j)}")


def decoded_path(ex, prompt: list[int], tokens: list[int], parents: list[int], j: int) -> np.ndarray:
    """The logits after node j's path, fed a token a step after ``prompt`` on a fresh cache: what greedy decoding of that
    path computes."""
    chain = ex.new_cache(1)
    ex.forward(chain, [prompt], all_logits=False)
    for t in path_to(parents, j):
        last = ex.forward(chain, [[tokens[t]]], all_logits=False).logits[0, -1]
    return last


@pytest.mark.parametrize("kind", ["int4", "float"])
def test_a_batch_of_trees_chains_and_padded_trees_is_exact(engines, float_engines, kind):
    """One ragged call as a batched round sends it: a 10-node tree, a chain and a 3-node tree with two roots (padded to the
    call's width), after prompts of different lengths: every real node's logits equal its path's decoded a token a step."""
    ex = (engines if kind == "int4" else float_engines)["tree"]
    short = [-1, -1, 0]
    prompts = [[5, 6, 7, 8], [11, 12, 13, 14, 15, 16, 17], [20, 21]]
    rows = [[40 + j for j in range(len(TREE))], [50 + j for j in range(6)], [60, 61, 62]]
    parents = [np.array(TREE), None, np.array(short)]
    cache = ex.new_cache(3)
    ex.forward(cache, prompts, all_logits=False)
    out = ex.forward(cache, rows, all_logits=True, parents=parents).logits.copy()
    for r, (prompt, tokens, par) in enumerate(zip(prompts, rows, [TREE, list(range(-1, 5)), short], strict=True)):
        for j in range(len(tokens)):
            np.testing.assert_array_equal(out[r, j], decoded_path(ex, prompt, tokens, par, j), err_msg=f"row {r}, node {j}")


def test_a_tree_engine_built_before_the_ops_trees_warns_at_load(tmp_path):
    """An int4 tree engine whose layers run ONNX Attention (as --cpu_kernels specdec built them before the op took trees)
    opens with one ApproximateTreesWarning that says to rebuild; a tree engine on the op, and a chain engine on ONNX
    Attention, open without one."""
    import warnings

    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import ApproximateTreesWarning, OrtExecutor

    target = make_checkpoint(tmp_path / "target", seed=0, num_hidden_layers=1, **ARCH)
    int4 = dict(quantization="int4_wo", group_size=GROUP, cpu_kernels="specdec")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OrtCpuAttention, "_own_attention", lambda self: False)
        with pytest.warns(ApproximateTreesWarning):  # (build_and_load opens it too)
            build_and_load(target, tmp_path / "old-tree", spec_build(MAX_DRAFT, tree_attention=True, **int4))
        build_and_load(target, tmp_path / "old-chain", spec_build(MAX_DRAFT, **int4))
    build_and_load(target, tmp_path / "tree", spec_build(MAX_DRAFT, tree_attention=True, **int4))
    with pytest.warns(ApproximateTreesWarning, match="Rebuild it with this specdec") as caught:
        OrtExecutor(load_engine_dir(tmp_path / "old-tree"), num_threads=1)
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", ApproximateTreesWarning)
        for name in ("tree", "old-chain"):
            OrtExecutor(load_engine_dir(tmp_path / name), num_threads=1)


def run(orch, prompts, n=40):
    outputs, metrics = orch.generate(prompts, GenerationConfig(max_output_len=n))
    return [o.output_ids for o in outputs], metrics


@pytest.mark.parametrize("draft_len", [1, 3, 6])
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "ragged-batch3"])
def test_draft_target_is_exactly_target_only(engines, draft_len, prompts):
    base, _ = run(Orchestrator(engines["target"]), prompts)
    spec, m = run(Orchestrator(engines["target"], DraftModelProposer(engines["draft"]), draft_len), prompts)
    assert spec == base and m.drafted > 0


@pytest.mark.parametrize("draft_len", [2, 6])
def test_ngram_is_exactly_target_only(engines, draft_len):
    base, _ = run(Orchestrator(engines["target"]), REPETITIVE, 48)
    spec, m = run(Orchestrator(engines["target"], NGramProposer(draft_len, 2), draft_len), REPETITIVE, 48)
    assert spec == base and m.accepted > 0


def test_a_float_chain_engine_attends_with_cached_attention(float_engines):
    """A float32 engine with --cpu_kernels specdec: one RotaryCachedAttention a layer on the q|k|v MatMul's output (no Split
    of it) and one SwiGLU on the gate|up MatMul's, its MatMuls ONNX Runtime's, no Attention, Slice or Pad, and no weight-only
    record (nothing in it is quantized); the draft's too."""
    for name in ("target", "draft"):
        ex = float_engines[name]
        found = ops(ex)
        layers = ex.engine.config.model.num_layers
        assert found.count("RotaryCachedAttention") == layers and "MatMul" in found
        assert found.count("SwiGLU") == layers  # the MLP's silu(gate) * up after the gate|up MatMul
        assert not {"Attention", "RotaryEmbedding", "TensorScatter", "Split", "Sigmoid", "Slice", "Pad", "Q4Gemm", "Q8Gemm"} & set(found)
        assert ex.build.cpu_kernels == "specdec" and ex.build.weight_only is None
    assert len(ops(float_engines["target"])) < len(ops(float_engines["onnx_attention"]))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_float_greedy_tokens_and_logits_equal_onnx_attention_and_transformers(float_engines, prompt):
    """40 greedy tokens: those of the same float32 engine on ONNX Attention and of transformers; every step's logits
    within float32 summation order of transformers' (1e-4 of their range)."""
    own = engine_greedy(float_engines["target"], prompt, 40)
    assert own == engine_greedy(float_engines["onnx_attention"], prompt, 40)
    with torch.no_grad():
        seq = float_engines["hf"].generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        want = float_engines["hf"](seq).logits[0, len(prompt) - 1 : -1].numpy()  # [40, vocab]
    assert own == seq[0, len(prompt):].tolist()
    ex = float_engines["target"]
    cache = ex.new_cache(1)
    got = [ex.forward(cache, [prompt], all_logits=False).logits[0, -1].copy()]
    got += [ex.forward(cache, [[t]], all_logits=False).logits[0, -1].copy() for t in own[:-1]]
    span = want.max(-1) - want.min(-1)
    assert (np.abs(np.stack(got) - want).max(-1) <= 1e-4 * span).all()


@pytest.mark.parametrize("batch", [1, 3])
def test_float_verification_logits_equal_one_token_logits_bit_for_bit(float_engines, batch):
    """What greedy speculation's exactness rests on, with no padded query row: 7 tokens in one call, the bits of 7
    one-token calls."""
    verification_equals_one_token_steps(float_engines["target"], batch)


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "ragged-batch3"])
def test_float_speculation_is_exactly_target_only(float_engines, prompts):
    base, _ = run(Orchestrator(float_engines["target"]), prompts)
    for draft_len in (1, 4, 6):
        spec, m = run(Orchestrator(float_engines["target"], DraftModelProposer(float_engines["draft"]), draft_len), prompts)
        assert spec == base and m.drafted > 0
    base, _ = run(Orchestrator(float_engines["target"]), REPETITIVE, 48)
    spec, m = run(Orchestrator(float_engines["target"], NGramProposer(6, 2), 6), REPETITIVE, 48)
    assert spec == base and m.accepted > 0


def test_an_engine_of_a_newer_specdec_is_refused_in_one_line(float_engines, tmp_path):
    """An engine whose graph runs a specdec op this specdec's library lacks (built by a later specdec; here SwiGLU renamed
    to an op no library has) is refused naming the op and what to do, not with ONNX Runtime's bare load error."""
    import shutil

    import onnx

    from specdec.formats.engine_format import load_engine_dir
    from specdec.formats.errors import EngineError
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    newer = tmp_path / "newer"
    shutil.copytree(float_engines["target"].engine.path, newer)
    engine = load_engine_dir(newer)  # its files' hashes checked here, before the edit
    model = onnx.load(str(engine.network_path), load_external_data=False)
    next(n for n in model.graph.node if n.op_type == "SwiGLU").op_type = "SwiGLUFromTheFuture"
    onnx.save(model, str(engine.network_path))
    with pytest.raises(EngineError, match="runs specdec's CPU op SwiGLUFromTheFuture, which this specdec's kernels do not have: the engine "
                                          "was built by a newer specdec"):
        OrtExecutor(engine, num_threads=1)


def test_a_qwen3_engine_feeds_the_op_its_normed_q_and_k_apart(tmp_path):
    """Qwen3 norms q and k per head before rotary, so its layers give RotaryCachedAttention q, k and v apart (a Split, the
    two norms, then the op): its logits within float32 summation order of transformers', its verification logits its
    one-token logits bit for bit, and greedy n-gram speculation exactly target-only."""
    ckpt = make_checkpoint(tmp_path / "qwen3", arch="Qwen3ForCausalLM", seed=2, head_dim=32, **ARCH)
    ex = build_and_load(ckpt, tmp_path / "e", spec_build(MAX_DRAFT, cpu_kernels="specdec"))
    found = ops(ex)
    assert found.count("RotaryCachedAttention") == ex.engine.config.model.num_layers and "RotaryEmbedding" not in found
    prompt = PROMPTS[2]
    with torch.no_grad():
        want = load_hf(ckpt)(torch.tensor([prompt])).logits[0].numpy()
    got = ex.forward(ex.new_cache(1), [prompt], all_logits=True).logits[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * (want.max() - want.min()))
    verification_equals_one_token_steps(ex, 3)
    base, _ = run(Orchestrator(ex), REPETITIVE, 32)
    spec, m = run(Orchestrator(ex, NGramProposer(MAX_DRAFT, 2), MAX_DRAFT), REPETITIVE, 32)
    assert spec == base and m.drafted > 0
