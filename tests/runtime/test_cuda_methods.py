"""Every method on the GPU (marked cuda: run on a host with an NVIDIA GPU and onnxruntime-gpu; skipped elsewhere).

The demo pair and its Medusa heads and EAGLE module, built with the ort_cuda lowering in bfloat16 (its masked
attention for every engine that verifies; the draft with GroupQueryAttention), and an int4 weight-only target.
Half precision computes differently from float32, so exactness is against the same engine's own target-only
decoding (docs/gpu.md): every speculative output must equal it, at batch 1, 4 and 16, for draft-target, n-gram,
suffix decoding (tree and chain), Medusa, EAGLE and P-EAGLE (chain and tree each). Also: a one-token step and a verification give the same
logits (the condition for that exactness), CUDA-graph replay after a tree step and its compaction matches a run
without graphs, and the GQA draft's split calls (token columns / rows) match one call on the CPU form.

The same graphs run on the CPU in float32 in tests/runtime/test_gpu_graphs_on_cpu.py (every CI run).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"
TEXTS = [
    "def fibonacci(n):\n    ",
    "import os\n\ndef list_files(path):\n    result = []\n    for name in os.listdir(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_lines(filename):\n    with open(filename) as f:\n",
]
pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    from specdec.formats.tokenizer import Tokenizer
    from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor

    d = tmp_path_factory.mktemp("cuda_methods")
    limits = dict(max_batch_size=16, max_input_len=128, max_seq_len=256, dtype="bfloat16", lowering="ort_cuda")
    quiet = dict(say=lambda _: None)
    build_engine(DEMO / "target", d / "eagle", spec_build(8, speculative_decoding_mode="eagle", **limits), eagle_dir=DEMO / "heads" / "eagle",
                 **quiet)
    build_engine(DEMO / "target", d / "medusa", spec_build(8, speculative_decoding_mode="medusa", **limits), medusa_dir=DEMO / "heads" / "medusa",
                 **quiet)
    build_engine(DEMO / "target", d / "peagle", spec_build(8, speculative_decoding_mode="peagle", **limits), peagle_dir=DEMO / "heads" / "peagle",
                 **quiet)
    build_engine(DEMO / "target", d / "int4", spec_build(4, quantization="int4_wo", **limits), **quiet)
    build_engine(DEMO / "draft", d / "draft", spec_build(0, **limits), **quiet)
    open_ = lambda name: CudaExecutor(load_engine_dir(d / name), 0)  # noqa: E731
    ex = {name: open_(name) for name in ("eagle", "medusa", "int4", "draft", "peagle")}
    ex["module"] = CudaExecutor(load_engine_dir(eagle_module_dir(ex["eagle"].engine)), 0)
    ex["peagle_module"] = CudaExecutor(load_engine_dir(eagle_module_dir(ex["peagle"].engine)), 0)
    tok = Tokenizer(DEMO / "target")
    # 16 prompts of 6..30 tokens; every fourth repeats itself (n-gram's case)
    prompts = [tok.encode(TEXTS[i % 4])[: 6 + (i * 7) % 25] for i in range(16)]
    prompts = [p * 2 if i % 4 == 3 else p for i, p in enumerate(prompts)]
    return {"ex": ex, "prompts": prompts, "dir": d}


def generate(target, prompts, proposer=None, draft_len=0, max_output_len=40):
    from specdec.runtime.orchestrator import Orchestrator
    from specdec.runtime.request import GenerationConfig

    outs, metrics = Orchestrator(target, proposer, draft_len).generate(prompts, GenerationConfig(max_output_len=max_output_len))
    return [o.output_ids for o in outs], metrics


def test_the_engines_are_the_gpu_forms(gpu):
    ex = gpu["ex"]
    for name in ("eagle", "medusa", "int4", "module", "peagle", "peagle_module"):
        b = ex[name].build
        assert (b.cuda_attention, b.kv_layout, b.min_step_width) == ("masked", "bsh", 2) and ex[name].cuda_graphs, name
    assert ex["draft"].build.cuda_attention == "gqa" and ex["draft"].build.min_step_width == 1


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_every_method_equals_target_only(gpu, batch):
    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.eagle import EagleProposer
    from specdec.runtime.proposers.medusa import MedusaProposer
    from specdec.runtime.proposers.ngram import NGramProposer

    ex, prompts = gpu["ex"], gpu["prompts"][:batch]
    target, medusa, draft, module = ex["eagle"], ex["medusa"], ex["draft"], ex["module"]
    want, _ = generate(target, prompts)
    cases = {
        "draft-target k=4": (target, lambda: DraftModelProposer(draft), 4),
        "draft-target k=2": (target, lambda: DraftModelProposer(draft), 2),
        "draft-target auto": (target, lambda: DraftModelProposer(draft), "auto"),
        "n-gram": (target, lambda: NGramProposer(4, 3), 4),
        "EAGLE chain": (target, lambda: EagleProposer(target, module), 4),
        "EAGLE tree": (target, lambda: EagleProposer(target, module, TREE), len(json.loads(TREE))),
    }
    for name, (t, make, k) in cases.items():
        got, metrics = generate(t, prompts, make(), k)
        assert got == want, f"{name}, batch {batch}"
        assert metrics.drafted > 0, name
    # suffix decoding's trees (shapes vary per round: each its own CUDA graph), a second pass drafting from the first's
    # answers through the global cache
    from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer

    for trees in (True, False):
        proposer = SuffixProposer(SuffixConfig(), trees=trees)
        for rerun in range(2):
            got, metrics = generate(target, prompts, proposer, SuffixConfig().max_draft_len)
            assert got == want, f"suffix {'tree' if trees else 'chain'} pass {rerun + 1}, batch {batch}"
            assert metrics.drafted > 0, f"suffix {'tree' if trees else 'chain'} pass {rerun + 1} drafted nothing"
    medusa_want, _ = generate(medusa, prompts)
    for choices, k in ((None, 3), (TREE, len(json.loads(TREE)))):
        got, _ = generate(medusa, prompts, MedusaProposer(medusa, choices), k)
        assert got == medusa_want, f"Medusa {'tree' if choices else 'chain'}, batch {batch}"
    from specdec.runtime.proposers.peagle import PEagleProposer

    peagle, peagle_module = ex["peagle"], ex["peagle_module"]  # its own target engine: its own target-only output
    peagle_want, _ = generate(peagle, prompts)
    for choices, k in ((None, 6), (TREE, len(json.loads(TREE)))):
        got, metrics = generate(peagle, prompts, PEagleProposer(peagle, peagle_module, choices), k)
        assert got == peagle_want and metrics.drafted > 0, f"P-EAGLE {'tree' if choices else 'chain'}, batch {batch}"


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_int4_target_speculation_equals_its_own_target_only(gpu, batch):
    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.ngram import NGramProposer

    ex, prompts = gpu["ex"], gpu["prompts"][:batch]
    want, _ = generate(ex["int4"], prompts)
    for make, k in ((lambda: DraftModelProposer(ex["draft"]), 4), (lambda: NGramProposer(4, 3), 4)):
        got, metrics = generate(ex["int4"], prompts, make(), k)
        assert got == want and metrics.drafted > 0


@pytest.mark.parametrize("name", ["eagle", "int4"])
def test_a_verification_step_gives_the_one_token_steps_logits(gpu, name):
    """k+1 tokens in one call and k+1 one-token calls: the same logits (bit for bit), at batch 1 and 4."""
    ex = gpu["ex"][name]
    prompts = gpu["prompts"][:4]
    toks = [[11, 12, 13, 14, 15]] * 4
    for batch in (1, 4):
        one, seq = ex.new_cache(batch), ex.new_cache(batch)
        ex.forward(one, prompts[:batch], all_logits=False)
        ex.forward(seq, prompts[:batch], all_logits=False)
        wide = ex.forward(one, toks[:batch], all_logits=True).logits.copy()
        narrow = np.stack([ex.forward(seq, [[t[j]] for t in toks[:batch]], all_logits=True).logits[:, 0].copy() for j in range(5)], axis=1)
        np.testing.assert_array_equal(wide, narrow, err_msg=f"{name} batch {batch}")


def test_graph_replay_after_a_tree_step_and_its_compaction(gpu):
    """Graphs replay tree masks, depth positions and the compacted K/V: the logits of a run without graphs."""
    from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor

    engine = load_engine_dir(gpu["dir"] / "eagle")
    graphs, plain = CudaExecutor(engine, 0, cuda_graphs=True), CudaExecutor(engine, 0, cuda_graphs=False)
    prompts = gpu["prompts"][:3]
    parents = np.array([-1, 0, 0, 1, 2, 3])  # root, two children, a grandchild under each, one more level
    outs = []
    for ex in (graphs, plain):
        cache, got = ex.new_cache(3), []
        ex.forward(cache, prompts, all_logits=False)
        for step in range(4):
            start = cache.lengths.copy()
            got.append(ex.forward(cache, [[20 + step + j for j in range(6)]] * 3, all_logits=True, parents=[parents] * 3).logits.copy())
            for row in range(3):
                ex.compact_slot(cache, row, int(start[row]), [0, 2, 4] if row != 1 else [0, 1, 3, 5])  # non-contiguous paths
            got.append(ex.forward(cache, [[7], [8], [9]], all_logits=True).logits.copy())
            if step == 1:
                ex.copy_slot(cache, 2, 0)
        outs.append(got)
    for i, (a, b) in enumerate(zip(*outs, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"call {i}")


def test_gqa_draft_split_calls_match_one_batched_call(gpu, tmp_path):
    """The GQA draft's several-tokens-with-a-past calls (token columns at batch 4 for 2 tokens, rows for 5) give the
    logits the masked form computes in one call (the same weights, bfloat16: within a few ulps)."""
    from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor

    limits = dict(max_batch_size=4, max_input_len=128, max_seq_len=256, dtype="bfloat16", lowering="ort_cuda")
    build_engine(DEMO / "draft", tmp_path / "masked", spec_build(0, cuda_attention="masked", **limits), say=lambda _: None)
    gqa, masked = gpu["ex"]["draft"], CudaExecutor(load_engine_dir(tmp_path / "masked"), 0)
    prompts = gpu["prompts"][:4]
    caches = [ex.new_cache(4) for ex in (gqa, masked)]
    for tokens in (prompts, [[5, 6], [7, 8], [9], [10, 11]], [[1, 2, 3, 4, 5], [6], [7, 8], [9, 10, 11]], [[12], [13], [14], [15]]):
        a, b = (ex.forward(c, tokens, all_logits=True).logits.copy() for ex, c in zip((gqa, masked), caches, strict=True))
        for row, t in enumerate(tokens):
            assert (a[row, : len(t)].argmax(-1) == b[row, : len(t)].argmax(-1)).all()
            want = b[row, : len(t)]  # [tokens, vocab]
            # the two forms round their sums differently through both layers: an error of some ulps of the row's largest
            # logit, anywhere in the row (H200: 2 ulps in one session, over 4 in the next). A wrong cache position or
            # mask moves logits by whole units and flips argmaxes (checked above); 16 ulps (1.0 at logits of 8-16) is
            # far below that
            ulp = np.exp2(np.floor(np.log2(np.abs(want).max(-1, keepdims=True))) - 7)  # bfloat16's spacing there
            err = np.abs(a[row, : len(t)] - want) / ulp
            assert err.max() < 16, f"row {row} of {tokens}: {err.max():.1f} ulps of the row's largest logit"
