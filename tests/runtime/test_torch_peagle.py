"""P-EAGLE on the torch backend, on a CPU (float32, the kernels' torch references), against the onnxruntime engines of
the same checkpoints: the shipped demo pair's target with its trained P-EAGLE head (anchored placeholders) and a tiny
random checkpoint with vLLM's constant placeholders. The module's calls (real pairs, placeholders of every depth and
past the trained ones, ragged rows, rows riding along) give the onnxruntime module's logits; every round's drafts
(chains, trees, a ragged batch) are the onnxruntime module's; greedy output is the torch target's own target-only
output; a round is one module call.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from checkpoints import make_checkpoint, write_peagle_module
from conftest import spec_build
from engine_runs import CountingModule, generate, open_cpu_executor, run_until_done, torch_one_thread  # noqa: F401 (a fixture)

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir
from specdec.formats.safetensors_io import SafetensorsFile
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.backends.torch.executor import TorchExecutor
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.peagle import PEagleProposer
from specdec.runtime.request import GenerationConfig

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
TEXTS = ["def fibonacci(n):\n    ", "import os\n\ndef list_files(path):\n    result = []\n", "class Stack:\n    def __init__(self):\n"]
TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
BACKENDS = ("onnxruntime", "torch")


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> {"prompts", backend -> (target, module)}: "demo" (the demo target and its trained anchored head) and "constant"
    (a tiny random checkpoint and a P-EAGLE module of vLLM's constant placeholders), each built float32 for both backends."""
    d = tmp_path_factory.mktemp("torch_peagle")
    tiny = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    write_peagle_module(tiny, d / "constant_module", aux_ids=[0, 2], placeholders="constant", trained={"peagle_refine": True})  # may refine
    tok = Tokenizer(DEMO / "target")
    sources = {"demo": (DEMO / "target", DEMO / "heads" / "peagle", [tok.encode(t) for t in TEXTS]),
               "constant": (tiny, d / "constant_module", [[5, 6, 7, 8, 9, 10], [11, 12, 13], list(range(20, 31))])}
    out = {}
    for name, (ckpt, head, prompts) in sources.items():
        out[name] = {"prompts": prompts}
        for backend in BACKENDS:
            path = d / name / backend
            build_engine(ckpt, path, spec_build(8, speculative_decoding_mode="peagle", backend=backend, dtype="float32", max_input_len=64,
                                                max_seq_len=128), peagle_dir=head, say=lambda _: None)
            target = open_cpu_executor(path, backend)
            out[name][backend] = (target, open_cpu_executor(eagle_module_dir(target.engine), backend))
    return out


def test_the_torch_module_engine_holds_the_placeholder_rows(pairs):
    """The module's files (formats/torch_layout.py): the embedding with ptd_token_id's row appended, and each depth's
    vector (row 0 zeros) under its form's name; the target returns eagle_hidden, the module reads hidden_states only."""
    for name, form, token in (("demo", "anchored", 1), ("constant", "constant", 3)):
        target, module = pairs[name]["torch"]
        assert (target.extra_outputs, module.extra_inputs, module.extra_outputs) == ({"eagle_hidden"}, {"hidden_states"}, frozenset())
        top = SafetensorsFile(module.engine.path / "model.safetensors")
        embed = np.array(top.raw("embed"))
        assert embed.shape[0] == module.vocab_size + 1 and np.array_equal(embed[-1], embed[token])
        assert f"placeholders.{form}" in top.entries and len([e for e in top.entries if e.startswith("placeholders.")]) == 1
        vectors = np.array(top.raw(f"placeholders.{form}"))
        assert not vectors[0].any() and np.abs(vectors[1:]).min(axis=1).max() > 0
        assert vectors.shape[0] == (8 if name == "demo" else 2)  # 7 trained depths after the anchor (para_depths 8), or one constant


def module_calls(module, rng):
    """The module calls P-EAGLE makes, on a fresh 3-slot cache: a ragged catch-up, a ragged block of real pairs and
    placeholders (depths 1..9: past the trained ones) with a row riding along, and a block after a rollback."""
    v, hidden = module.vocab_size, module.model.hidden_size
    h = lambda n, w: rng.standard_normal((n, w, hidden)).astype(np.float32)  # noqa: E731
    cache, outs = module.new_cache(3), []
    outs.append(module.forward(cache, [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], all_logits=False, extra_inputs={"hidden_states": h(3, 5)}).logits)
    start = cache.lengths.copy()
    block = [[15, v, v + 1, v + 2], [16, 17] + [v + j for j in range(9)], [18]]
    outs.append(module.forward(cache, block, all_logits=True, advance=np.array([True, True, False]), extra_inputs={"hidden_states": h(3, 11)}).logits)
    cache.lengths[:] = start + [1, 2, 0]  # the placeholders' K/V dropped, as PEagleProposer does
    outs.append(module.forward(cache, [[19, v, v + 1], [20, v], [21, 22, v]], all_logits=True, extra_inputs={"hidden_states": h(3, 3)}).logits)
    return [np.array(o) for o in outs], cache.lengths.copy()


@pytest.mark.parametrize("name", ["demo", "constant"])
def test_every_module_call_gives_the_onnxruntime_modules_logits(pairs, name):
    got = {backend: module_calls(pairs[name][backend][1], np.random.default_rng(0)) for backend in BACKENDS}
    (torch_out, torch_len), (ort_out, ort_len) = got["torch"], got["onnxruntime"]
    assert torch_len.tolist() == ort_len.tolist()
    for i, (a, b) in enumerate(zip(torch_out, ort_out, strict=True)):
        assert a.shape == b.shape, i
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(float(np.abs(b).max()), 1.0), err_msg=f"{name} call {i}")


class RecordingProposer(PEagleProposer):
    """PEagleProposer, each round's drafts (tokens, parents) kept in ``rounds``."""

    rounds: list[list[tuple]]

    def propose(self, requests, draft_lens):
        drafts = super().propose(requests, draft_lens)
        self.rounds.append([(d.tokens.tolist(), None if d.parents is None else d.parents.tolist()) for d in drafts])
        return drafts


def run(target, module, prompts, k, choices=None):
    """P-EAGLE over ``prompts`` (greedy): every round's drafts, and the steps that drafted, each checked to call the module
    once (after the prefill step: a long prompt's backlog is fed in a call of its own there)."""
    counted = CountingModule(module)
    proposer = RecordingProposer(target, counted, choices)
    proposer.rounds = []
    engine = Engine(target, [proposer], SpeculationConfig("peagle", k))
    requests = [engine.requests[engine.add_request(p, GenerationConfig(max_output_len=24))] for p in prompts]
    drafting_steps = 0
    engine.step()
    while engine.has_unfinished():
        rounds, calls = sum(r.metrics.drafting_rounds for r in requests), counted.calls
        engine.step()
        drafted = sum(r.metrics.drafting_rounds for r in requests) > rounds
        assert counted.calls - calls == int(drafted), (k, choices, counted.calls - calls, drafted)
        drafting_steps += drafted
    return proposer.rounds, drafting_steps


CASES = [("chain k=1", 1, None), ("chain k=4", 4, None), ("chain k=8", 8, None), ("tree", len(json.loads(TREE)), TREE)]


@pytest.mark.parametrize("name", ["demo", "constant"])
@pytest.mark.parametrize("batch", [1, 3])
def test_drafts_are_the_onnxruntime_modules_and_greedy_output_is_target_only(pairs, name, batch):
    """Every round's drafts on the torch engines are the onnxruntime engines' (chains of 1, 4 and 8, a tree; alone and a ragged
    batch of 3), and greedy output is the torch target's own target-only output."""
    prompts = pairs[name]["prompts"][:batch]
    t_torch, m_torch = pairs[name]["torch"]
    want, _ = generate(t_torch, [], "none", 0, prompts, max_output_len=24)
    assert want == generate(pairs[name]["onnxruntime"][0], [], "none", 0, prompts, max_output_len=24)[0]
    for label, k, choices in CASES:
        got, stats = generate(t_torch, [PEagleProposer(t_torch, m_torch, choices)], "peagle", k, prompts, max_output_len=24)
        assert got == want, f"{name} {label}, batch {batch}"
        assert stats.drafted > 0, label
        drafts = {backend: run(*pairs[name][backend], prompts, k, choices)[0] for backend in BACKENDS}
        assert drafts["torch"] == drafts["onnxruntime"], f"{name} {label}, batch {batch}"
        assert sum(len(tokens) for round_ in drafts["torch"] for tokens, _ in round_) > 0


def test_a_round_is_one_module_call_whatever_k(pairs):
    """Chains of 2, 5 and 8 and a tree in a ragged batch: each step that drafts calls the torch module once (the catch-up of
    the last verification's pairs and the placeholders together), a step without drafts calls it at most once."""
    t, m = pairs["demo"]["torch"]
    for k, choices in ((2, None), (5, None), (8, None), (len(json.loads(TREE)), TREE)):
        rounds, drafting_steps = run(t, m, pairs["demo"]["prompts"], k, choices)
        assert drafting_steps > 2 and len(rounds) >= drafting_steps, (k, choices)


def test_refined_drafts_are_the_onnxruntime_modules_and_greedy_output_is_target_only(pairs):
    """--peagle_refine 2 (the constant-placeholder module says it was trained to read drafts): every round's drafts on the torch
    engines are the onnxruntime engines', in a ragged batch of 3, chain and tree, and greedy output is target-only's."""
    prompts = pairs["constant"]["prompts"]
    want, _ = generate(pairs["constant"]["torch"][0], [], "none", 0, prompts, max_output_len=24)
    for k, choices in ((4, None), (len(json.loads(TREE)), TREE)):
        drafts = {}
        for backend in BACKENDS:
            target, module = pairs["constant"][backend]
            proposer = RecordingProposer(target, module, choices, 2)
            proposer.rounds = []
            engine = Engine(target, [proposer], SpeculationConfig("peagle", k))
            ids = [engine.add_request(p, GenerationConfig(max_output_len=24)) for p in prompts]
            done = run_until_done(engine)
            assert [done[i].output_ids for i in ids] == want, (backend, choices)
            drafts[backend] = proposer.rounds
        assert drafts["torch"] == drafts["onnxruntime"], choices
        assert sum(len(tokens) for round_ in drafts["torch"] for tokens, _ in round_) > 0


def test_the_triton_kernels_give_the_references_module_logits(pairs):
    """The GPU path's ops (ops.TritonOps) under Triton's interpreter: the constant-placeholder module's calls, the references' logits."""
    pytest.importorskip("triton")
    module = pairs["constant"]["torch"][1]
    triton_module = TorchExecutor(module.engine, "cpu", kernels="triton", warm_up=False)
    (got, got_len), (want, want_len) = (module_calls(m, np.random.default_rng(1)) for m in (triton_module, module))
    assert got_len.tolist() == want_len.tolist()
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(float(np.abs(b).max()), 1.0), err_msg=f"call {i}")
