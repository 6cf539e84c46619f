"""Every speculative method through the ort_cuda lowering's masked attention, run on the CPU in float32.

The masked form takes nothing but the engine ABI's inputs, so the CPU executor runs its float32 build with the
inputs the CUDA executor feeds it: one call per round at any batch size, ragged rows, trees, Medusa's and
EAGLE's extra outputs, the EAGLE module's own cache. Greedy output must be the same engine's target-only output
for draft-target (with a draft of the same lowering), n-gram, Medusa, EAGLE and P-EAGLE (chain and tree each),
alone and in a ragged batch of 3. On a GPU the same graphs run in bfloat16 (tests/runtime/test_cuda_executor.py,
marked cuda).
"""

import json

import pytest
from checkpoints import make_checkpoint, write_eagle_module, write_peagle_module
from conftest import build_and_load, spec_build
from engine_runs import generate
from test_medusa import write_heads

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.eagle import EagleProposer
from specdec.runtime.proposers.medusa import MedusaProposer
from specdec.runtime.proposers.ngram import NGramProposer
from specdec.runtime.proposers.peagle import PEagleProposer

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
GPU_FORM = dict(lowering="ort_cuda", dtype="float32")  # cuda_attention auto: masked for every engine here that verifies


def check_exact(target, make_proposers, method, lengths) -> int:
    """Greedy output == target-only's for each draft length, alone and in a ragged batch; returns tokens accepted."""
    accepted = 0
    for prompts in ([PROMPTS[0]], PROMPTS):
        want, _ = generate(target, [], "none", 0, prompts)
        for k in lengths:
            got, stats = generate(target, make_proposers(), method, k, prompts)
            assert got == want, (method, len(prompts), k)
            assert stats.drafted > 0
            accepted += stats.accepted
    return accepted


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_form")
    target = make_checkpoint(d / "target", num_hidden_layers=2, seed=0)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    return {
        "dir": d,
        "ckpt": target,
        "target": build_and_load(target, d / "te", spec_build(4, **GPU_FORM)),
        # a draft in the masked form too: the CPU executor feeds no GroupQueryAttention host input
        "draft": build_and_load(draft, d / "de", spec_build(0, cuda_attention="masked", **GPU_FORM)),
        "self": build_and_load(target, d / "se", spec_build(0, cuda_attention="masked", **GPU_FORM)),
    }


def test_engines_are_the_masked_gpu_form(pair):
    for name in ("target", "draft"):
        build = pair[name].build
        assert (build.lowering, build.cuda_attention, build.kv_layout) == ("ort_cuda", "masked", "bsh"), name


def test_draft_target_and_ngram_are_exact(pair):
    t = pair["target"]
    check_exact(t, lambda: [DraftModelProposer(pair["draft"])], "draft", [1, 2, 4, "auto"])
    assert check_exact(t, lambda: [DraftModelProposer(pair["self"])], "draft", [4]) > 0  # the target as its own draft: all accepted
    check_exact(t, lambda: [NGramProposer(4, 3)], "ngram", [4])


def test_medusa_chain_and_tree_are_exact(pair):
    d = pair["dir"]
    write_heads(pair["ckpt"], d / "heads", copy_lm_head=True)  # heads that draft repeats of the next token: some accepted
    build_engine(pair["ckpt"], d / "medusa", spec_build(8, speculative_decoding_mode="medusa", **GPU_FORM), say=lambda _: None,
                 medusa_dir=d / "heads")
    target = OrtExecutor(load_engine_dir(d / "medusa"), num_threads=1)
    assert (target.build.cuda_attention, target.tree_attention) == ("masked", True)
    check_exact(target, lambda: [MedusaProposer(target)], "medusa", [1, 3])
    check_exact(target, lambda: [MedusaProposer(target, TREE)], "medusa", [len(json.loads(TREE))])


def test_eagle_chain_and_tree_are_exact(pair, tmp_path):
    base = make_checkpoint(tmp_path / "base", num_hidden_layers=3, seed=0)
    write_eagle_module(base, tmp_path / "module", aux_ids=[0, 2])
    build_engine(base, tmp_path / "eagle", spec_build(8, speculative_decoding_mode="eagle", **GPU_FORM), say=lambda _: None,
                 eagle_dir=tmp_path / "module")
    target = OrtExecutor(load_engine_dir(tmp_path / "eagle"), num_threads=1)
    module = OrtExecutor(load_engine_dir(eagle_module_dir(target.engine)), num_threads=1)
    assert module.build.cuda_attention == "masked" and module.build.kv_layout == "bsh"  # the module's own cache, the target's form
    check_exact(target, lambda: [EagleProposer(target, module)], "eagle", [1, 3])
    check_exact(target, lambda: [EagleProposer(target, module, TREE)], "eagle", [len(json.loads(TREE))])


def test_peagle_chain_and_tree_are_exact(pair, tmp_path):
    """P-EAGLE's module in the masked form: no tree_mask (one causal call of pairs and placeholders per round)."""
    base = make_checkpoint(tmp_path / "base", num_hidden_layers=3, seed=0)
    write_peagle_module(base, tmp_path / "module", aux_ids=[0, 2])
    build_engine(base, tmp_path / "peagle", spec_build(8, speculative_decoding_mode="peagle", **GPU_FORM), say=lambda _: None,
                 peagle_dir=tmp_path / "module")
    target = OrtExecutor(load_engine_dir(tmp_path / "peagle"), num_threads=1)
    module = OrtExecutor(load_engine_dir(eagle_module_dir(target.engine)), num_threads=1)
    assert (module.build.cuda_attention, module.build.kv_layout, module.tree_attention) == ("masked", "bsh", False)
    check_exact(target, lambda: [PEagleProposer(target, module)], "peagle", [1, 3, 6])
    check_exact(target, lambda: [PEagleProposer(target, module, TREE)], "peagle", [len(json.loads(TREE))])
