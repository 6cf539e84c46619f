"""EAGLE-3 drafting through the request-level engine: chains and trees, greedy exactness, sampled chains.

The module is its own engine with its own KV cache (the eagle target's eagle/ folder); the target returns the
features the module reads (eagle_hidden). Greedy output must be the target's own, chain and tree, alone and in
a ragged batch. The first draft of a round must be what the torch module predicts from the same features.
"""

import json
import time

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint, write_eagle_module
from conftest import spec_build
from distributions import assert_drawn_tree, keeps_target_distribution
from engine_runs import WIDE_TREE, run_to_max_seq_len_with_a_late_long_prompt, run_until_done

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.formats.errors import EngineError
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.eagle import EagleProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig
from specdec.runtime.tree import parse_choices
from specdec.train.base import run_base

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"


@pytest.fixture(scope="module")
def eagle(tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle_run")
    ckpt = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    module = write_eagle_module(ckpt, d / "module", aux_ids=[0, 2])
    build_engine(ckpt, d / "engine", spec_build(8, speculative_decoding_mode="eagle"), say=lambda _: None, eagle_dir=d / "module")
    target = OrtExecutor(load_engine_dir(d / "engine"), num_threads=1)
    mod = OrtExecutor(load_engine_dir(eagle_module_dir(target.engine)), num_threads=1)
    return {"dir": d, "ckpt": ckpt, "module": module, "target": target, "mod": mod}


def generate(target, module, prompts, method, draft_len, choices=None, sampling=SamplingConfig(), max_output_len=20):
    proposers = [EagleProposer(target, module, choices)] if method == "eagle" else []
    engine = Engine(target, proposers, SpeculationConfig(method, draft_len))
    ids = [engine.add_request(p, GenerationConfig(max_output_len=max_output_len, sampling=sampling), seed_stream=i) for i, p in enumerate(prompts)]
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids], engine.stats


@pytest.mark.parametrize("choices", [None, TREE])
def test_greedy_eagle_is_exact(eagle, choices):
    """Chain (draft_len 1..4) and tree: the target's greedy output, alone and in a ragged batch of 3."""
    t, m = eagle["target"], eagle["mod"]
    for prompts in ([PROMPTS[0]], PROMPTS):
        want, _ = generate(t, m, prompts, "none", 0)
        for k in ([1, 2, 4] if choices is None else [len(json.loads(TREE))]):
            got, stats = generate(t, m, prompts, "eagle", k, choices)
            assert got == want, (len(prompts), k, choices)
            assert stats.drafted > 0


def test_first_draft_is_the_torch_modules_guess(eagle):
    """After the prefill, the module's depth-1 guess = Eagle3Module on (fc(aux features) of the prompt, the prompt
    shifted by one + the first token): the proposer's pairing and the engines agree with training's."""
    t, m, module = eagle["target"], eagle["mod"], eagle["module"]
    prompt = PROMPTS[2]
    proposer = EagleProposer(t, m)
    engine = Engine(t, [proposer], SpeculationConfig("eagle", 1))
    rid = engine.add_request(prompt, GenerationConfig(max_output_len=8))
    engine.step()
    req = engine.requests[rid]
    first = req.output_ids[0]
    (draft,) = proposer.propose([req], [1])
    hf = load_hf(eagle["ckpt"])
    seq = torch.tensor([prompt + [first]])
    with torch.no_grad():
        aux = run_base(hf, seq, torch.ones_like(seq), [0, 2]).aux_hidden
        logits = module(aux[:, :-1], hf.get_input_embeddings()(seq[:, 1:]))  # [1, len(prompt), vocab]
    np.testing.assert_allclose(proposer.next_logits[rid], logits[0, -1].numpy(), atol=2e-4)
    assert int(draft.tokens[0]) == int(logits[0, -1].argmax())


def test_eagle_reads_its_own_target_call_when_the_target_runs_in_between(eagle):
    """The features EAGLE pairs with tokens come with the target call they belong to (StepOutput at the prefill,
    TargetOutput after each verification), never from whatever the target executor ran last. A draft model that is
    the target's own executor (a cache of its own) prefills its request between the target's prefill and EAGLE's
    reading of it: EAGLE's drafts (they depend on the features it read), the outputs and the counts are those of the
    same engine with EAGLE reading first, chain and tree."""
    from specdec.runtime.proposers.draft_model import DraftModelProposer

    t, m = eagle["target"], eagle["mod"]
    methods = ["eagle", "draft", "eagle"]
    want, _ = generate(t, m, PROMPTS, "none", 0)
    for choices, k in ((None, 3), (TREE, 6)):
        runs = []
        for eagle_first in (True, False):
            eagle_p = EagleProposer(t, m, choices)
            proposers = [eagle_p, DraftModelProposer(t)]
            engine = Engine(t, proposers if eagle_first else proposers[::-1], SpeculationConfig("none", 0))
            ids = [engine.add_request(p, GenerationConfig(max_output_len=20, method=meth, draft_len=k))
                   for p, meth in zip(PROMPTS, methods, strict=True)]
            engine.step()  # the prefill
            mine = [engine.requests[i] for i, meth in zip(ids, methods, strict=True) if meth == "eagle"]
            drafts = [d.tokens.tolist() for d in eagle_p.propose(mine, [k] * len(mine))]
            done = run_until_done(engine)
            runs.append((drafts, [(done[i].output_ids, done[i].metrics.drafted, done[i].metrics.accepted) for i in ids]))
        assert [out for out, _, _ in runs[1][1]] == want, choices
        assert runs[1] == runs[0], choices
        assert all(len(d) == k for d in runs[1][0]), choices


def test_sampled_eagle_chain_gives_probabilities(eagle):
    t, m = eagle["target"], eagle["mod"]
    proposer = EagleProposer(t, m)
    engine = Engine(t, [proposer], SpeculationConfig("eagle", 3))
    rid = engine.add_request(PROMPTS[1], GenerationConfig(max_output_len=6, sampling=SamplingConfig(temperature=0.9, top_k=5, random_seed=1)))
    engine.step()
    (draft,) = proposer.propose([engine.requests[rid]], [3])
    assert draft.probs is not None and draft.probs.shape == (3, t.vocab_size)
    assert all(draft.probs[j, int(x)] > 0 for j, x in enumerate(draft.tokens))
    outs, stats = generate(t, m, PROMPTS, "eagle", 3, sampling=SamplingConfig(temperature=0.9, top_k=5, random_seed=1))
    assert all(len(o) == 20 for o in outs) and stats.drafted > 0


def test_eagle_refusals(eagle):
    t, m = eagle["target"], eagle["mod"]
    with pytest.raises(EngineError, match="not an EAGLE module"):
        EagleProposer(t, t)
    with pytest.raises(EngineError, match="needs a target engine built with --speculative_decoding_mode eagle"):
        EagleProposer(m, m)



def test_every_request_drafts_the_tree(eagle):
    """Greedy and sampled requests in one batch both draft the tree: a greedy one the module's top candidates, a
    sampled one each node's children drawn without replacement from the module's distribution there, with it."""
    t, m = eagle["target"], eagle["mod"]
    proposer = EagleProposer(t, m, TREE)
    engine = Engine(t, [proposer], SpeculationConfig("eagle", 6))
    greedy = engine.add_request(PROMPTS[0], GenerationConfig(max_output_len=10))
    sampled = engine.add_request(PROMPTS[1], GenerationConfig(max_output_len=10, sampling=SamplingConfig(temperature=0.7, random_seed=2)))
    engine.step()
    tree, drawn = proposer.propose([engine.requests[greedy], engine.requests[sampled]], [6, 6])
    assert tree.parents is not None and len(tree) == 6 and tree.probs is None
    assert_drawn_tree(drawn, t.vocab_size)
    assert len(drawn) == 6 and not np.array_equal(drawn.probs[0], drawn.probs[2])  # depth 2: the module's row under its parent
    done = run_until_done(engine)
    want, _ = generate(t, m, [PROMPTS[0]], "none", 0, max_output_len=10)
    assert done[greedy].output_ids == want[0] and len(done[sampled].output_ids) == 10  # the greedy request stays exact beside a sampled one


def test_a_node_whose_distribution_has_fewer_tokens_than_children_drafts_fewer(eagle):
    """top_k=2: two tokens with mass at every node, so two draws: the root's third child is not drawn, nor its own
    child; the draft is the rest of the tree, renumbered."""
    t, m = eagle["target"], eagle["mod"]
    proposer = EagleProposer(t, m, "[[0], [1], [2], [0, 0], [2, 0]]")
    engine = Engine(t, [proposer], SpeculationConfig("eagle", 5))
    rid = engine.add_request(PROMPTS[2], GenerationConfig(max_output_len=10, sampling=SamplingConfig(temperature=0.7, top_k=2, random_seed=3)))
    engine.step()
    (draft,) = proposer.propose([engine.requests[rid]], [5])
    assert_drawn_tree(draft, t.vocab_size)
    assert draft.parents.tolist() == [-1, -1, 0] and ((draft.probs > 0).sum(-1) == 2).all()  # [0], [1], [0, 0]


@pytest.mark.parametrize("greedy", [True, False])
def test_a_tree_under_a_grammar_that_forces_tokens(eagle, greedy):
    """A grammar that allows one token at every other position ('~' after each digit): a sampled request's node there
    has one draw and its siblings none; their children are not drafted (no path to process), and the output keeps to
    the grammar. (The demo tokenizer's grammar over this model's 96 ids: the digits and '~' are among them.)"""
    from pathlib import Path

    from specdec.formats.tokenizer import Tokenizer
    from specdec.runtime.grammar import GrammarCompiler, GrammarSpec

    tok = Tokenizer(Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target")
    compiler = GrammarCompiler(tok.to_json(), len(tok.vocab()), [tok.eos_token_id])
    t, m = eagle["target"], eagle["mod"]
    engine = Engine(t, [EagleProposer(t, m, TREE)], SpeculationConfig("eagle", 6))
    sampling = SamplingConfig() if greedy else SamplingConfig(temperature=0.8, random_seed=1)
    rid = engine.add_request(PROMPTS[0], GenerationConfig(max_output_len=12, sampling=sampling,
                                                          grammar=compiler.compile(GrammarSpec("regex", "([0-9]~){6}"))))
    out = run_until_done(engine)[rid]
    text = tok.decode(out.output_ids)
    assert out.finish_reason != "error" and len(text) == 12 and all(c.isdigit() for c in text[::2]) and set(text[1::2]) == {"~"}
    assert engine.stats.drafted > 0


def test_sampled_eagle_tree_keeps_the_target_distribution(eagle):
    """Sampled trees, verified by recursive rejection sampling: the first two output tokens over 1200 seeds are
    distributed as target-only sampling's (chi-square homogeneity test, p > 0.001)."""
    t, m = eagle["target"], eagle["mod"]
    # a random module: flat distributions, so that its draws are kept now and then
    keeps_target_distribution(t, lambda: EagleProposer(t, m, TREE), "eagle", 6, PROMPTS[1], dict(temperature=3.0, top_k=8))


def test_bench_sweep_measures_eagle_chains_and_a_tree(eagle):
    """specdec-bench's sweep: EAGLE chain rows for each draft length and one tree row, each identical to target-only."""
    from specdec.bench.sweep import run_sweep

    data = [{"input_ids": p, "output_len": 12} for p in PROMPTS]
    target = load_engine_dir(eagle["dir"] / "engine")
    result = run_sweep(target, ["none", "eagle"], None, [1, 2], 2, data, threads=1, warmup=0, cost_reps=2,
                       heads_dirs={"eagle": target}, choices={"eagle": TREE})
    labels = [r["label"] for r in result["rows"]]
    assert labels == ["target-only", "eagle chain k=1", "eagle chain k=2", "eagle tree n=6"]
    assert all(r["identical_to_target_only"] for r in result["rows"])
    assert result["rows"][-1]["tree"] == TREE and result["settings"]["eagle_choices"] == TREE
    sampled = run_sweep(target, ["none", "eagle"], None, [2], 2, data, threads=1, warmup=0, cost_reps=2,
                        heads_dirs={"eagle": target}, choices={"eagle": TREE}, sampling=SamplingConfig(temperature=0.8, random_seed=3))
    rows = {r["label"]: r for r in sampled["rows"]}
    assert rows["target-only"]["identical_expected"]  # rejection sampling follows its drafts: not compared
    assert not rows["eagle chain k=2"]["identical_expected"] and not rows["eagle tree n=6"]["identical_expected"]
    assert rows["eagle tree n=6"]["mean_acceptance_length"] > 1 and sampled["settings"]["sampling"]["temperature"] == 0.8


def test_load_engine_opens_the_module_beside_an_eagle_target(eagle):
    """The loader takes the drafter from the mode table (proposers/own.py); the module opens from the target's eagle/
    folder; a chain defaults to min(4, max_draft_len) drafts, a tree to its nodes; with_tree shares both executors."""
    from specdec.runtime.loading import load_engine, method_draft_lens
    from specdec.runtime.proposers.own import own_drafter

    engine = load_engine(eagle["dir"] / "engine", num_threads=1)
    proposer = engine.proposers["eagle"]
    assert own_drafter("eagle") is EagleProposer and type(proposer) is EagleProposer
    assert proposer.module.engine.path == eagle_module_dir(proposer.target.engine)
    assert (proposer.max_chain_len, proposer.default_draft_len) == (8, 4)
    assert engine.speculation == SpeculationConfig("eagle", 4) and method_draft_lens(engine) == {"eagle": 4}
    treed = proposer.with_tree(parse_choices(TREE, "--eagle_choices"))
    assert (treed.target, treed.module, treed.default_draft_len) == (proposer.target, proposer.module, 6)
    assert load_engine(eagle["dir"] / "engine", num_threads=1, eagle_choices=TREE).speculation.draft_len == 6


def test_a_hand_written_modelopt_checkpoint_builds_and_runs(eagle, tmp_path):
    """An EAGLE-3 draft directory written here by hand, as the official EAGLE-3 checkpoints and older ModelOpt exports
    are (docs/train-heads.md: ``midlayer.*`` names, the template config.json, bfloat16 weights), not by our exporter:
    it builds, and greedy EAGLE output equals target-only."""
    from safetensors.torch import save_file

    base = json.loads((eagle["ckpt"] / "config.json").read_text())
    h, v, heads, kv = base["hidden_size"], base["vocab_size"], base["num_attention_heads"], base["num_key_value_heads"]
    hd, inter = h // heads, base["intermediate_size"]
    g = torch.Generator().manual_seed(7)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * (0.3 if len(shape) == 1 else 1.0 / shape[-1] ** 0.5)
                + (1.0 if len(shape) == 1 else 0.0)).to(torch.bfloat16)

    tensors = {"fc.weight": rnd(h, 2 * h), "midlayer.hidden_norm.weight": rnd(h), "midlayer.input_layernorm.weight": rnd(h),
               "midlayer.post_attention_layernorm.weight": rnd(h), "midlayer.self_attn.q_proj.weight": rnd(heads * hd, 2 * h),
               "midlayer.self_attn.k_proj.weight": rnd(kv * hd, 2 * h), "midlayer.self_attn.v_proj.weight": rnd(kv * hd, 2 * h),
               "midlayer.self_attn.o_proj.weight": rnd(h, heads * hd), "midlayer.mlp.gate_proj.weight": rnd(inter, h),
               "midlayer.mlp.up_proj.weight": rnd(inter, h), "midlayer.mlp.down_proj.weight": rnd(h, inter), "norm.weight": rnd(h),
               "lm_head.weight": rnd(v, h)}
    d = tmp_path / "official"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h, "intermediate_size": inter,
        "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1, "vocab_size": v, "draft_vocab_size": v,
        "rms_norm_eps": base.get("rms_norm_eps", 1e-6), "rope_theta": 10000.0, "max_position_embeddings": base["max_position_embeddings"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2], "use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                         "use_last_layernorm": True, "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                         "parallel_draft_heads_num_layers": 1}}))
    build_engine(eagle["ckpt"], tmp_path / "engine", spec_build(6, speculative_decoding_mode="eagle"), say=lambda _: None, eagle_dir=d)
    t = OrtExecutor(load_engine_dir(tmp_path / "engine"), num_threads=1)
    m = OrtExecutor(load_engine_dir(eagle_module_dir(t.engine)), num_threads=1)
    assert (m.model.num_layers, list(t.build.eagle_aux_layer_ids)) == (1, [0, 2])
    want, _ = generate(t, m, PROMPTS, "none", 0)
    for k, choices in ((3, None), (6, TREE)):
        got, stats = generate(t, m, PROMPTS, "eagle", k, choices)
        assert got == want and stats.drafted > 0


def test_trees_run_to_max_seq_len_and_late_joiners_catch_up(eagle):
    """A wide tree drafted until the engine is full (its levels never grow the module's cache), and a long prompt
    joining a request deep into its context (its pairs go in a call of their own): both exact, no capacity error."""
    t, m = eagle["target"], eagle["mod"]
    run_to_max_seq_len_with_a_late_long_prompt(Engine(t, [EagleProposer(t, m, WIDE_TREE)], SpeculationConfig("eagle", 6)), t, PROMPTS[2])


@pytest.mark.parametrize("choices", [None, TREE])
def test_an_auto_request_feeds_the_module_when_it_first_drafts(eagle, choices):
    """draft_len=auto: the module reads a request's prompt pairs when the request first drafts (its backlog, in a
    call of its own), not at admission; a fixed draft_len feeds them at admission. Both exact, alone and batched."""
    t, m = eagle["target"], eagle["mod"]
    long_prompt = list(range(5, 25))  # 20 pairs: more than one round's worth, so a backlog
    for prompts in ([long_prompt], [long_prompt, *PROMPTS]):
        want, _ = generate(t, m, prompts, "none", 0)
        for draft_len in ("auto", 3 if choices is None else len(json.loads(TREE))):
            proposer = EagleProposer(t, m, choices)
            engine = Engine(t, [proposer], SpeculationConfig("eagle", draft_len))
            engine.auto.verify_cost = lambda rows, width: 1.0 + 0.01 * width  # drafting pays: auto drafts at once
            engine.auto.draft_cost = lambda method, rows, default: 0.0
            ids = [engine.add_request(p, GenerationConfig(max_output_len=20)) for p in prompts]
            engine.step()  # the target's prefill: the module joins
            first = engine.requests[ids[0]]
            assert proposer.backlog(first) == (len(long_prompt) if draft_len == "auto" else 0), draft_len
            assert (int(proposer.cache.lengths[proposer.slot_of[ids[0]]]) == 0) == (draft_len == "auto")
            done = run_until_done(engine)
            assert [done[i].output_ids for i in ids] == want, (len(prompts), draft_len, choices)
            assert engine.stats.drafted > 0


def test_rounds_without_drafts_keep_the_targets_features_for_the_module(eagle, monkeypatch):
    """A batch of draft_len=auto requests where drafting does not pay: the policy declines the method once a round (no
    request is asked on its own), and each request's pending pairs hold the target's features of every token it saw,
    prompt and rounds (what one prefill of the whole text gives), with the token after each; once drafting pays they
    are fed and the outputs are target-only's."""
    from specdec.runtime.draft_policy import AutoDraftPolicy

    t, m = eagle["target"], eagle["mod"]
    want, _ = generate(t, m, PROMPTS, "none", 0)
    proposer = EagleProposer(t, m)
    engine = Engine(t, [proposer], SpeculationConfig("eagle", "auto"))
    engine.auto.verify_cost = lambda rows, width: float(width)  # a drafted token costs a whole step: nothing pays
    engine.auto.draft_cost = lambda method, rows, default: 0.0

    def asked(*a, **k):
        raise AssertionError("a declined method's requests are not asked one by one")

    monkeypatch.setattr(AutoDraftPolicy, "declines", asked)
    ids = [engine.add_request(p, GenerationConfig(max_output_len=20)) for p in PROMPTS]
    for _ in range(6):  # the prefill, then 5 rounds
        engine.step()
    cache = t.new_cache(1)
    for rid, prompt in zip(ids, PROMPTS, strict=True):
        r = engine.requests[rid]
        assert r.metrics.drafted == 0 and r.auto_k == 0 and len(r.output_ids) == 6
        text = prompt + r.output_ids
        pending = proposer.pending[rid]
        assert pending.tokens == text[1:]  # each token the target saw pairs with the one after it
        cache.lengths[:] = 0
        whole = t.forward(cache, [text[:-1]], all_logits=True).extras["eagle_hidden"][0]  # [len(text) - 1, hidden]
        np.testing.assert_allclose(pending.features, whole, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    engine.auto.verify_cost = lambda rows, width: 1.0 + 0.01 * width  # now drafting pays
    done = run_until_done(engine)
    assert [done[i].output_ids for i in ids] == want
    assert engine.stats.drafted > 0


def test_pending_pairs_grow_drop_and_give_back_their_buffer():
    """PendingPairs: rows appended one at a time or in blocks past its spare room come back in order; dropping fed pairs
    keeps the rest (an overlapping move), and a big buffer left with a few rows shrinks to them and its spare rows."""
    from specdec.runtime.proposers.eagle import SPARE_ROWS, PendingPairs

    rows = np.arange(100 * 3, dtype=np.float32).reshape(100, 3)
    p = PendingPairs(3, rows[:40], range(40))
    for i in range(40, 60):
        p.add_one(rows[i], i)
    p.add(rows[60:100], range(60, 100))
    np.testing.assert_array_equal(p.features, rows)
    assert p.tokens == list(range(100)) and len(p) == 100
    p.drop(70)
    np.testing.assert_array_equal(p.features, rows[70:])
    assert p.tokens == list(range(70, 100))
    p.drop(30)
    assert len(p) == 0 and p.features.shape == (0, 3) and p._rows.shape == (SPARE_ROWS, 3)
    p.add_one(rows[5], 5)
    np.testing.assert_array_equal(p.features, rows[5:6])
    p.add(rows[:60], range(60))
    p.drop(60)  # P-EAGLE's catch-up: all but the last pair fed
    np.testing.assert_array_equal(p.features, rows[59:60])
    assert p.tokens == [59] and p._rows.shape == (1 + SPARE_ROWS, 3)


def test_a_request_with_draft_len_0_never_feeds_the_module(eagle):
    """A request of the EAGLE method that asks for no drafts (draft_len 0, as a server request's num_draft_tokens 0)
    is decoded target-only: its prompt is not prefilled on the module, which never runs for it, and no features are
    kept for it; a fixed-length request beside it still is, at admission. Both exact."""
    t, m = eagle["target"], eagle["mod"]
    long_prompt, other = list(range(5, 25)), list(range(30, 50))  # 20 pairs each: a backlog at admission
    want, _ = generate(t, m, [long_prompt, other], "none", 0)
    proposer = EagleProposer(t, m)
    engine = Engine(t, [proposer], SpeculationConfig("eagle", 3))
    calls = []
    run = proposer.module.forward
    proposer.module.forward = lambda *a, **k: calls.append(1) or run(*a, **k)
    none = engine.add_request(long_prompt, GenerationConfig(max_output_len=20, draft_len=0))
    three = engine.add_request(other, GenerationConfig(max_output_len=20))
    engine.step()  # the target's prefill
    assert int(proposer.cache.lengths[proposer.slot_of[none]]) == 0 and len(proposer.pending[none]) == 0
    assert int(proposer.cache.lengths[proposer.slot_of[three]]) > 0
    engine.step()
    assert len(proposer.pending[none]) == 0  # nor are the rounds' features kept for it
    done = run_until_done(engine)
    assert [done[none].output_ids, done[three].output_ids] == want
    assert done[none].metrics.drafted == 0 and done[three].metrics.drafted > 0 and calls


def test_metrics_keep_the_prompts_apart_from_the_rounds(eagle, monkeypatch):
    """draft_s and target_s count the prompts' passes too (the module over the prompt's features, the prefill);
    prompt_draft_s and prompt_target_s are those shares, so round_draft_s is what the rounds' drafting cost (what
    bench_heads draft-cost divides by the rounds). A known delay in the prompt's pass and in each round's proposal lands
    in its own share."""
    from specdec.runtime.orchestrator import Orchestrator

    t, m = eagle["target"], eagle["mod"]
    proposer = EagleProposer(t, m)
    prefilled, propose = proposer.prefilled, proposer.propose
    calls = []

    def slow_prefilled(*a, **kw):
        time.sleep(0.2)
        return prefilled(*a, **kw)

    def slow_propose(*a, **kw):
        calls.append(1)
        time.sleep(0.01)
        return propose(*a, **kw)

    monkeypatch.setattr(proposer, "prefilled", slow_prefilled)
    monkeypatch.setattr(proposer, "propose", slow_propose)
    outs, metrics = Orchestrator(t, proposer, 3).generate([PROMPTS[2]], GenerationConfig(max_output_len=12))
    assert 0 < len(calls) <= metrics.rounds
    assert 0.2 <= metrics.prompt_draft_s < 0.2 + 0.5 * len(calls) * 0.01 + 0.1
    assert 0.01 * len(calls) <= metrics.round_draft_s < metrics.draft_s - 0.19
    assert 0 < metrics.prompt_target_s < metrics.target_s and 0 < metrics.round_target_s < metrics.target_s
    per_request = outs[0].metrics
    assert per_request.prompt_draft_s >= 0.2 and per_request.prompt_target_s == pytest.approx(metrics.prompt_target_s)
    d = metrics.to_dict()
    assert d["round_draft_s"] == metrics.round_draft_s and d["round_target_s"] == metrics.round_target_s


def test_rounds_without_drafts_keep_at_most_max_pending_pairs_unfed(eagle, monkeypatch):
    """draft_len=auto where nothing pays: a request's unfed pairs stay within MAX_PENDING (here 12): a prompt past it is
    fed at admission, the rounds' pairs once they pass it, drafting or not (the module's cache holds the rest, the
    feeds timed as catch-ups); outputs are target-only's, alone and when drafting pays later."""
    from specdec.runtime.proposers import eagle as eagle_module

    monkeypatch.setattr(eagle_module, "MAX_PENDING", 12)
    t, m = eagle["target"], eagle["mod"]
    prompts = [list(range(5, 25)), PROMPTS[1]]  # 20 pairs: past the bound at admission; 3: within it
    want, _ = generate(t, m, prompts, "none", 0, max_output_len=30)
    proposer = EagleProposer(t, m)
    engine = Engine(t, [proposer], SpeculationConfig('eagle', "auto"))
    engine.auto.verify_cost = lambda rows, width: float(width)  # a drafted token costs a whole step: nothing pays
    engine.auto.draft_cost = lambda method, rows, default: 0.0
    ids = [engine.add_request(p, GenerationConfig(max_output_len=30)) for p in prompts]
    engine.step()  # the prefill
    fed = {rid: int(proposer.cache.lengths[proposer.slot_of[rid]]) for rid in ids}
    assert fed[ids[0]] >= 20 - 1 and len(proposer.pending[ids[0]]) <= 1 and fed[ids[1]] == 0
    for _ in range(20):
        engine.step()
        for rid, prompt in zip(ids, prompts, strict=True):
            r, pending = engine.requests[rid], proposer.pending[rid]
            assert len(pending) <= 12 + 1  # (the round's own pair lands after its feed)
            assert int(proposer.cache.lengths[proposer.slot_of[rid]]) + len(pending) == len(prompt) + len(r.output_ids) - 1
    assert all(engine.requests[rid].metrics.drafted == 0 for rid in ids)
    assert int(proposer.cache.lengths[proposer.slot_of[ids[1]]]) > 0 and 'eagle' in engine.auto.catch_up_s
    engine.auto.verify_cost = lambda rows, width: 1.0 + 0.01 * width  # now drafting pays
    done = run_until_done(engine)
    assert [done[i].output_ids for i in ids] == want
    assert engine.stats.drafted > 0
