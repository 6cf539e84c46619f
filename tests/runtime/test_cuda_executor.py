"""The ONNX Runtime CUDA executor (runtime/backends/onnxruntime/cuda.py).

On every host: its refusals, each one clean line, and the pure rules it feeds
the ort_cuda lowering with. Nothing here pretends a GPU exists: a test that
needs a missing provider or a missing GPU is skipped where it has one.

Marked ``cuda`` (run on a GPU host with specdec[gpu]; skipped elsewhere with
the reason): the demo pair on the GPU against the CPU executor, speculative
decoding against target-only, rollback, CUDA-graph replay after the cache
changed, and a draft on the CPU with its target on the GPU.
"""

from pathlib import Path

import numpy as np
import pytest
from conftest import engine_greedy, spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import load_engine_dir
from specdec.formats.errors import DeviceError, EngineError, RequestError
from specdec.runtime.backends import Placement, open_executor
from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor, attention_bound, check_engine, rows_one_by_one
from specdec.runtime.backends.onnxruntime.cuda_host import cuda_gpu_count, require_cuda_provider, require_gpu
from specdec.runtime.devices import placement

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"


def has_cuda_provider() -> bool:
    try:
        require_cuda_provider("probe")
    except DeviceError:
        return False
    return True


@pytest.fixture(scope="module")
def cpu_engines(tmp_path_factory, llama_ckpt):
    d = tmp_path_factory.mktemp("cuda_ex")
    out = {}
    builds = {"ort_cpu": spec_build(lowering="ort_cpu"), "gqa_fp32": spec_build(0, lowering="ort_cuda", dtype="float32"),
              "masked_fp32": spec_build(lowering="ort_cuda", dtype="float32")}
    for name, build in builds.items():
        build_engine(llama_ckpt, d / name, build, say=lambda _: None)
        out[name] = load_engine_dir(d / name)
    return out


# -- every host --------------------------------------------------------------------------
def one_line(err: Exception) -> str:
    msg = str(err)
    assert "\n" not in msg and msg.endswith("."), msg
    return msg


@pytest.mark.skipif(has_cuda_provider(), reason="onnxruntime here has the CUDA provider")
def test_without_onnxruntime_gpu_asking_for_cuda_says_what_to_install(cpu_engines):
    engine = cpu_engines["ort_cpu"]
    for ask in (lambda: open_executor(engine, Placement("cuda", 0)), lambda: placement([0], engine, "target", "cuda")):
        with pytest.raises(DeviceError) as err:
            ask()
        msg = one_line(err.value)
        assert "CUDAExecutionProvider" in msg and "pip install 'specdec[gpu]' && pip install --force-reinstall --no-deps onnxruntime-gpu" in msg


@pytest.mark.skipif(cuda_gpu_count() > 0, reason="CUDA sees a GPU here")
def test_no_gpu_visible_is_one_line():
    with pytest.raises(DeviceError, match="CUDA sees no GPU") as err:
        require_gpu(0, "engines/target")
    one_line(err.value)


def test_float32_gqa_engine_is_refused_before_any_gpu_work(cpu_engines):
    with pytest.raises(EngineError, match="float16/bfloat16 only. Rebuild it with --dtype bfloat16") as err:
        CudaExecutor(cpu_engines["gqa_fp32"], 0)
    one_line(err.value)
    assert check_engine(cpu_engines["masked_fp32"], None) is True  # the masked form's Attention runs float32 on CUDA too


def test_engines_that_verify_get_two_tokens_per_row_at_least(cpu_engines):
    """A masked ort_cuda engine that verifies drafts: a one-token step gets a second token that rides along (same kernels
    as a verification), written past the row's length; the caller sees its own width, the length grows by its own tokens."""
    from specdec.runtime.backends.base import plan_step
    from specdec.runtime.kv_cache import KVCache

    builds = {name: cpu_engines[name].config.build for name in ("ort_cpu", "gqa_fp32", "masked_fp32")}
    assert {name: b.min_step_width for name, b in builds.items()} == {"ort_cpu": 1, "gqa_fp32": 1, "masked_fp32": 2}
    cache = KVCache(1, 2, 1, 20, 4, 16, "bsh")
    cache.lengths[:] = [3, 15]  # row 1: one token from max_seq_len, and the extra one still within the capacity
    plan = plan_step(cache, [[7], [8]], None, 0, "e", min_width=2)
    assert plan.ids.tolist() == [[7, 7], [8, 8]] and plan.tokens == 1 and plan.grow.tolist() == [1, 1]
    from specdec.runtime.backends.base import StepOutput

    full = StepOutput(np.zeros((2, 2, 3)), {"eagle_hidden": np.zeros((2, 2, 5)), "hidden_out": np.zeros((2, 1, 5))})  # all logits rows / the last
    trimmed = plan.trim(full, per_token=frozenset({"eagle_hidden"}))
    assert trimmed.logits.shape == (2, 1, 3) and trimmed.extras["eagle_hidden"].shape == (2, 1, 5) and trimmed.extras["hidden_out"].shape == (2, 1, 5)
    assert plan.widened(np.ones((2, 1, 5))).shape == (2, 2, 5)
    wide = plan_step(cache, [[1, 2, 3], [4]], None, 0, "e", min_width=2)
    assert wide.ids.shape == (2, 3) and wide.tokens == 3  # wide enough: untouched
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ex = OrtExecutor(cpu_engines["masked_fp32"], num_threads=1)
    c = ex.new_cache(2)
    ex.forward(c, [[5, 6, 7], [8]], all_logits=False)
    out = ex.forward(c, [[9], [10]], all_logits=True).logits
    assert out.shape == (2, 1, ex.vocab_size) and c.lengths.tolist() == [4, 2]


def test_cuda_graphs_need_the_ort_cuda_lowering(cpu_engines):
    with pytest.raises(EngineError, match="CUDA graphs need an engine built with --lowering ort_cuda"):
        check_engine(cpu_engines["ort_cpu"], cuda_graphs=True)
    assert check_engine(cpu_engines["ort_cpu"], cuda_graphs=None) is False  # portable/ort_cpu: run without graphs


def test_attention_bound_is_the_width_for_a_first_prompt_else_the_capacity():
    # a first prompt (every row empty, several tokens) is GQA's "prompt" case: total == width
    assert attention_bound(np.array([0, 0]), 7, 101) == 7
    # a single token, or any row with a past: the capacity, constant, so a captured graph stays valid
    assert attention_bound(np.array([0]), 1, 101) == 101
    assert attention_bound(np.array([0, 5]), 3, 101) == 101
    assert attention_bound(np.array([9]), 5, 101) == 101


def test_rows_go_one_by_one_only_for_several_tokens_with_a_past_at_batch_above_one():
    assert rows_one_by_one(np.array([3, 0]), 5)  # verification of drafts on a batch
    assert not rows_one_by_one(np.array([3]), 5)  # batch 1: GQA takes it
    assert not rows_one_by_one(np.array([3, 4]), 1)  # decode: one token per row
    assert not rows_one_by_one(np.array([0, 0]), 5)  # a first prompt: batched


# -- on a GPU ----------------------------------------------------------------------------
PROMPT_TEXTS = [
    "def fibonacci(n):\n    ",
    "import os\n\ndef list_files(path):\n    result = []\n    for name in os.listdir(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_lines(filename):\n    with open(filename) as f:\n",
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo pair, built for the GPU (ort_cuda bf16) and for the CPU (ort_cpu fp32)."""
    from specdec.formats.tokenizer import Tokenizer

    d = tmp_path_factory.mktemp("demo_gpu")
    builds = {
        "target_fp32": ("target", dict(lowering="ort_cpu", dtype="float32")),
        "target_portable": ("target", dict(lowering="portable", dtype="float32")),
        "target_bf16": ("target", dict(lowering="ort_cuda", dtype="bfloat16")),  # masked attention (it verifies drafts)
        "target_masked_fp32": ("target", dict(lowering="ort_cuda", dtype="float32")),
        "draft_bf16": ("draft", dict(lowering="ort_cuda", dtype="bfloat16", max_draft_len=0)),
        "draft_fp32": ("draft", dict(lowering="ort_cpu", dtype="float32", max_draft_len=0)),
    }
    engines = {}
    for name, (which, kw) in builds.items():
        limits = dict(max_batch_size=4, max_input_len=128, max_seq_len=256)
        build_engine(DEMO / which, d / name, spec_build(**{**limits, **kw}), say=lambda _: None)
        engines[name] = load_engine_dir(d / name)
    tok = Tokenizer(DEMO / "target")
    return engines, [tok.encode(t) for t in PROMPT_TEXTS]


def generate(target, prompts, proposer=None, draft_len=0, max_output_len=48):
    from specdec.runtime.orchestrator import Orchestrator
    from specdec.runtime.request import GenerationConfig

    outs, metrics = Orchestrator(target, proposer, draft_len).generate(prompts, GenerationConfig(max_output_len=max_output_len))
    return [o.output_ids for o in outs], metrics


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["target_fp32", "target_portable", "target_masked_fp32"])
def test_demo_pair_greedy_on_the_gpu_equals_the_cpu_executor(demo, name):
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    engines, prompts = demo
    cpu, gpu = OrtExecutor(engines[name], num_threads=2), CudaExecutor(engines[name], 0)
    assert gpu.device == "cuda:0" and gpu.cuda_graphs == (name == "target_masked_fp32")
    for p in prompts:
        assert engine_greedy(gpu, p, 48) == engine_greedy(cpu, p, 48)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 4])
def test_speculative_equals_target_only_on_the_gpu(demo, batch):
    """Half precision: exactness is against the same engine's own target-only decoding (docs/gpu.md)."""
    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.ngram import NGramProposer

    engines, prompts = demo
    prompts = prompts[:batch]
    target = CudaExecutor(engines["target_bf16"], 0)
    assert target.cuda_graphs
    want, _ = generate(target, prompts)
    draft = CudaExecutor(engines["draft_bf16"], 0)
    for make, k in ((lambda: DraftModelProposer(draft, use_logits=False), 4), (lambda: NGramProposer(4, 2), 4),
                    (lambda: DraftModelProposer(draft, use_logits=False), 2)):
        proposer = make()
        got, metrics = generate(target, prompts, proposer, k)
        assert got == want, f"{proposer.name} k={k}"
        assert metrics.drafted > 0


@pytest.mark.cuda
def test_draft_on_cpu_target_on_gpu(demo):
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
    from specdec.runtime.proposers.draft_model import DraftModelProposer

    engines, prompts = demo
    target = CudaExecutor(engines["target_bf16"], 0)
    want, _ = generate(target, prompts[:2])
    got, metrics = generate(target, prompts[:2], DraftModelProposer(OrtExecutor(engines["draft_fp32"], num_threads=1), use_logits=False), 3)
    assert got == want and metrics.accepted > 0


@pytest.mark.cuda
def test_rollback_leaves_no_trace(demo):
    engines, prompts = demo
    ex = CudaExecutor(engines["target_bf16"], 0)
    cache = ex.new_cache(1)
    ex.forward(cache, [prompts[1]], all_logits=False)
    n = int(cache.lengths[0])
    ex.forward(cache, [[11, 12, 13, 14, 15]], all_logits=True)  # drafts that get rejected
    cache.rollback(0, n)
    after_rollback = ex.forward(cache, [[21, 22]], all_logits=True).logits.copy()
    fresh = ex.new_cache(1)
    ex.forward(fresh, [prompts[1]], all_logits=False)
    np.testing.assert_array_equal(ex.forward(fresh, [[21, 22]], all_logits=True).logits, after_rollback)


@pytest.mark.cuda
def test_graph_replay_after_the_cache_changed(demo):
    """Replayed graphs read the new lengths, positions and slot contents: same logits as without graphs."""
    engines, prompts = demo
    graphs, plain = CudaExecutor(engines["target_bf16"], 0, cuda_graphs=True), CudaExecutor(engines["target_bf16"], 0, cuda_graphs=False)
    caches = [ex.new_cache(3) for ex in (graphs, plain)]
    for step, (tokens, action) in enumerate([
        (prompts[:3], None),
        ([[5], [6], [7]], None),
        ([[8], [9], [10]], ("rollback", 1, 3)),  # row 1 loses 3 tokens
        ([[11], [12], [13]], ("copy", 2, 0)),  # slot 2's K/V moves into slot 0
        ([[14], [15], [16]], None),
        ([[17, 18, 19]], None),  # batch 1, several tokens with a past
        ([[20], [21], [22]], None),
    ]):
        outs = []
        for ex, cache in zip((graphs, plain), caches, strict=True):
            if action and action[0] == "rollback":
                cache.rollback(action[1], int(cache.lengths[action[1]]) - action[2])
            elif action:
                ex.copy_slot(cache, action[1], action[2])
            outs.append(ex.forward(cache, tokens, all_logits=False).logits.copy())
        np.testing.assert_allclose(outs[0], outs[1], atol=1e-3, rtol=0, err_msg=f"step {step}")
        assert (outs[0].argmax(-1) == outs[1].argmax(-1)).all()
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist()


@pytest.mark.cuda
def test_foreign_cache_and_bad_device_are_refused(demo):
    engines, _ = demo
    ex, other = CudaExecutor(engines["target_bf16"], 0), CudaExecutor(engines["target_bf16"], 0)
    with pytest.raises(RequestError, match="not made by the CUDA executor"):
        ex.forward(other.new_cache(1), [[1]], all_logits=False)
    with pytest.raises(DeviceError, match="has [0-9]+ GPU") as err:
        CudaExecutor(engines["target_bf16"], cuda_gpu_count())
    one_line(err.value)
