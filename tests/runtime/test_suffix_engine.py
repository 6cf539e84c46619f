"""Suffix decoding in the engine: greedy output equals target-only (chains and trees, alone and in a ragged
batch, with and without the global cache), and a sampled request keeps the target's distribution."""

import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build
from distributions import chi_square_critical, homogeneity, sampled_pairs
from engine_runs import run_until_done, seeded_outputs

from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer
from specdec.runtime.request import GenerationConfig, Request
from specdec.runtime.sampling import SamplingConfig

MAX_DRAFT = 6
PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 40, 41, 42, 40], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [7, 8]]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("suffix")
    ckpt = make_checkpoint(d / "target", num_hidden_layers=2, seed=0)
    return {
        "chain": build_and_load(ckpt, d / "chain", spec_build(MAX_DRAFT)),
        "tree": build_and_load(ckpt, d / "tree", spec_build(MAX_DRAFT, tree_attention=True)),
    }


def run(engine, prompts, cfg):
    ids = [engine.add_request(p, cfg) for p in prompts]
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids]


@pytest.fixture(scope="module")
def want(targets):
    cfg = GenerationConfig(max_output_len=32)
    return run(Engine(targets["chain"]), PROMPTS, cfg)


@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("global_cache", [True, False])
def test_greedy_suffix_is_exact(targets, want, kind, global_cache):
    target = targets[kind]
    drafted = accepted = 0
    for draft_len in (2, MAX_DRAFT, "auto"):
        proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT, global_cache=global_cache), trees=kind == "tree")
        engine = Engine(target, [proposer], SpeculationConfig("suffix", draft_len))
        cfg = GenerationConfig(max_output_len=32)
        for rep in range(2):  # the second pass drafts from the first pass's responses when the cache is on
            assert run(engine, PROMPTS[:1], cfg) == want[:1], (kind, draft_len, rep)  # alone
            assert run(engine, PROMPTS, cfg) == want, (kind, draft_len, rep)  # a ragged batch
        drafted += engine.stats.drafted
        accepted += engine.stats.accepted
        if global_cache:
            assert len(proposer.cache) == 10  # every finished response joined the cache
    assert drafted > 0 and accepted > 0  # drafts were verified and some kept, not only rejected


def test_the_global_cache_drafts_earlier_responses(targets, want):
    """A request whose text repeats an earlier response gets most of it accepted: the global cache at work."""
    proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT), trees=True)
    engine = Engine(targets["tree"], [proposer], SpeculationConfig("suffix", MAX_DRAFT))
    cfg = GenerationConfig(max_output_len=32)
    run(engine, PROMPTS[2:3], cfg)
    before = engine.stats.accepted
    assert run(engine, PROMPTS[2:3], cfg) == want[2:3]
    again = engine.stats.accepted - before
    assert again >= 20, again  # of 31 tokens after the first, most came from the cached response


@pytest.mark.parametrize("tail", [0, 3, 16])
def test_a_prompt_that_ends_as_an_earlier_one_drafts_its_response_from_the_first_token(tail):
    """Responses join the global cache behind their prompt's last ``cached_prompt_tokens`` tokens (no more than
    the prompt has): a new prompt with the same ending drafts the earlier response before it has any output; with
    0 the cache holds the response alone and the new request has nothing to match."""
    prompt = [30, 31, 32, 33, 34, 35]
    first = Request("a", prompt, GenerationConfig(), "suffix", MAX_DRAFT, np.random.default_rng(0))
    proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT, cached_prompt_tokens=tail), trees=True)
    proposer.add([first])
    proposer.stores["a"].append([60, 61, 62, 63])  # its response, as observe() appends it
    proposer.remove("a")
    assert proposer.cache.response(0) == prompt[len(prompt) - min(tail, len(prompt)) :] + [60, 61, 62, 63]
    second = Request("b", [90, 91, 33, 34, 35], GenerationConfig(), "suffix", MAX_DRAFT, np.random.default_rng(0))
    proposer.add([second])
    drafted = proposer.propose([second], [MAX_DRAFT])[0].tokens.tolist()
    assert drafted == ([] if tail == 0 else [60, 61, 62])  # the 3-token match (33, 34, 35) earns 3 nodes


def test_trees_carry_their_structure():
    # after [1, 2] came 3 twice and 4 once: a tree with both (3 first), for greedy and sampled requests alike
    prompt = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2, 3, 8, 1, 2]
    greedy = Request("g", prompt, GenerationConfig(), "suffix", MAX_DRAFT, np.random.default_rng(0))
    sampled = Request("s", prompt, GenerationConfig(sampling=SamplingConfig(temperature=1.0)), "suffix", MAX_DRAFT, np.random.default_rng(0))
    proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT, global_cache=False), trees=True)
    proposer.add([greedy, sampled])
    for tree in proposer.propose([greedy, sampled], [MAX_DRAFT, MAX_DRAFT]):
        assert (tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()) == ([3, 4], [-1, -1], [1, 1])
    # a target without tree attention gets the best path: 3, then what followed [1, 2, 3] last
    plain = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT, global_cache=False), trees=False)
    plain.add([greedy, sampled])
    for chain in plain.propose([greedy, sampled], [MAX_DRAFT, MAX_DRAFT]):
        assert chain.tokens.tolist() == [3, 8] and chain.parents is None


def test_sampled_suffix_keeps_the_target_distribution(targets):
    """Sampled requests draft the frequency tree (this target verifies trees) and are walked by token compare; the
    output tokens 1..2 over 1200 seeds are distributed as target-only sampling's (chi-square homogeneity test,
    p > 0.001)."""
    target = targets["tree"]
    sampling = dict(temperature=1.5, top_k=4)
    prompt = PROMPTS[1]
    counts = {}
    for method in ("none", "suffix"):
        proposers = [SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT), trees=True)] if method == "suffix" else []
        engine = Engine(target, proposers, SpeculationConfig(method, 3 if method == "suffix" else 0))
        if method == "suffix":  # responses that continue the prompt as the target most often does: drafts to accept
            greedy = run(engine, [prompt], GenerationConfig(max_output_len=3))[0]
            for _ in range(3):
                proposers[0].cache.add(greedy)
        counts[method] = sampled_pairs(engine, prompt, sampling)
        if method == "suffix":
            assert engine.stats.accepted > 0 and engine.stats.drafted > engine.stats.accepted
    stat, n_keys = homogeneity(counts["none"], counts["suffix"])
    assert n_keys >= 4 and stat < chi_square_critical(n_keys - 1), (stat, n_keys)


@pytest.mark.parametrize("target_kind", ["tree", "chain"])
def test_a_sampled_suffix_request_is_target_onlys_sample_for_its_seed(targets, target_kind):
    """Trees (a target with tree attention) or chains: a sampled request's output is target-only's for its seed, token
    for token, under every sampling setting, beside a greedy request, with a global cache that holds what these
    prompts go on to (so drafts are kept)."""
    target = targets[target_kind]
    want, _ = seeded_outputs(target, [], "none", 0, PROMPTS)
    proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT), trees=target_kind == "tree")
    for out in want:  # responses to draft from
        proposer.cache.add(out)
    got, stats = seeded_outputs(target, [proposer], "suffix", MAX_DRAFT, PROMPTS)
    assert got == want and stats.accepted > 0


def test_tree_attention_build_refusals(tmp_path):
    from conftest import cli_build

    ckpt = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=1, seed=0)
    r = cli_build(ckpt, tmp_path / "a", "--tree_attention")
    assert r.exit_code == 1 and "--tree_attention needs --speculative_decoding_mode draft_tokens_external" in r.output
    r = cli_build(ckpt, tmp_path / "b", "--tree_attention", "--speculative_decoding_mode", "draft_tokens_external", "--backend", "tensorrt")
    assert r.exit_code == 1 and "--tree_attention runs on the onnxruntime backend only" in r.output
    assert all(len(line) for line in r.output.strip().splitlines()) and r.output.strip().count("\n") == 0


def test_auto_caps_the_batch_width_and_stays_exact(targets, want):
    """draft_len=auto under fixed costs where each verified token past the first costs a quarter of a call at more
    than one row: one request that repeats a cached response would draft deep for the whole batch; the round cuts the batch's
    drafts to the width that pays (SpeculativeRound.batch_cap), and the output is still target-only's."""
    proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT), trees=True)
    engine = Engine(targets["tree"], [proposer], SpeculationConfig("suffix", "auto"))
    engine.auto.verify_cost = lambda rows, width: 1.0 + (0.0 if rows == 1 else 0.25) * (width - 1)
    engine.auto.draft_cost = lambda method, rows, default: 0.0
    cuts = []
    real = engine.round.batch_cap

    def watched(reqs, drafts):  # the real cap; record how wide the call was before and after it
        out = real(reqs, drafts)
        cuts.append((max(len(d) for d in drafts), max(len(d) for d in out)))
        return out

    engine.round.batch_cap = watched
    cfg = GenerationConfig(max_output_len=32)
    assert run(engine, PROMPTS[2:3], cfg) == want[2:3]  # its response joins the global cache
    assert run(engine, PROMPTS, cfg) == want  # request 2 repeats it; the others have little to draft
    assert any(after < before for before, after in cuts), cuts


@pytest.mark.parametrize("draft_s, every_round", [(0.0, True), (1.0, False)])
def test_auto_keeps_proposing_when_proposing_is_free(targets, want, draft_s, every_round):
    """draft_len=auto, a verification where each more token costs half a step: a request's weak draft does not pay.
    It looks again next round when proposing costs nothing (a match may start at the next token); when each
    proposal costs a target step not even a perfect draft would pay (AutoDraftLen.pays_at), so it never proposes."""
    proposer = SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT, global_cache=False), trees=True)
    engine = Engine(targets["tree"], [proposer], SpeculationConfig("suffix", "auto"))
    engine.auto.verify_cost = lambda rows, width: 1.0 + 0.5 * (width - 1)
    engine.auto.draft_cost = lambda method, rows, default: draft_s
    calls = []
    real = proposer.propose

    def counted(requests, draft_lens):
        calls.append(len(requests))
        return real(requests, draft_lens)

    proposer.propose = counted
    assert run(engine, PROMPTS[1:2], GenerationConfig(max_output_len=32)) == want[1:2]
    rounds = engine.stats.rounds  # the last round may have no room for a draft (max_output_len)
    assert (len(calls) >= rounds - 1) if every_round else (len(calls) == 0), (len(calls), rounds)
