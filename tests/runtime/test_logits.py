"""Invariant 5: every setting gives the same result with and without speculation, for every method.

The logits processing chain (runtime/logits.py) reads each position's own
history, the drafts before it included. On fixed distributions over a tiny
vocabulary, rejection sampling with penalties, a logit bias, min-p and top-k
keeps the target's *joint* distribution of two emitted tokens; a chain that
forgets the drafted history does not, and the bound sees it. On real engines,
greedy output under every setting equals target-only's for every method, the
log-probabilities equal target-only's to float tolerance, and sampled output
is distributed as target-only's (chi-square).
"""

import numpy as np
import pytest
from checkpoints import make_checkpoint, write_eagle_module
from conftest import build_and_load, spec_build, spec_pair
from engine_runs import run_until_done

from specdec.builder.build import build_engine
from specdec.runtime.acceptance import accept_rejection_sampling, accept_token_compare
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.logits import LogitsProcessor, Rows, logprobs
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer
from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig, TargetDraws, processed_probs

V, N = 6, 6000
TV_BOUND = 0.025  # measured at N=6000: 0.003-0.008 for the right rules, 0.18 for the forgetful one
rng0 = np.random.default_rng(5)
TARGET = rng0.normal(size=(3, V)) * 1.5  # rows for positions 0, 1, 2 (the model's logits do not depend on the token here)
DRAFT = rng0.normal(size=(2, V)) * 1.5
SETTINGS = SamplingConfig(temperature=0.9, top_k=5, min_p=0.05, presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.3,
                          logit_bias=((2, 1.5), (4, -1.0)))
PROMPT = [1, 3]
HISTORY = [0, 1]  # the output so far


class Memo(LogitsProcessor):
    """The chain, each (row, history) processed once: the loops below ask for the same few 30,000 times."""

    def __init__(self, *a):
        super().__init__(*a)
        self.memo: dict = {}

    def logits(self, row, appended=()):
        key = (np.asarray(row).tobytes(), tuple(int(t) for t in appended))
        if key not in self.memo:
            self.memo[key] = super().logits(row, appended)
        return self.memo[key]


def processor() -> LogitsProcessor:
    p = Memo(SETTINGS, PROMPT)
    p.commit(HISTORY)
    return p


def exact_joint() -> np.ndarray:
    """p(t0, t1) = p0(t0) * p1(t1 | t0): the target alone, each position processed with its history."""
    proc = processor()
    p0 = processed_probs(proc.logits(TARGET[0])[None], SETTINGS)[0]
    joint = np.zeros((V, V))
    for t0 in range(V):
        joint[t0] = p0[t0] * processed_probs(proc.logits(TARGET[1], [t0])[None], SETTINGS)[0]
    return joint


def joint_histogram(rule, history_for_draft: bool = True) -> np.ndarray:
    proc = processor()
    rng = np.random.default_rng(11)  # the drafts' samples
    hist = np.zeros((V, V))
    for i in range(N):
        drafts, qs = [], []
        for j in range(2):
            t, q = proc.pick(DRAFT[j], drafts if history_for_draft else [], rng)
            drafts.append(t)
            qs.append(q)
        out = rule(proc, np.array(drafts), np.stack(qs), TargetDraws(11, stream=i).at(0))  # the target's: a request of its own
        hist[out[0], out[1]] += 1
    return hist / N


def tv(a, b) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def rejection(proc, drafts, qs, draws):
    n, nxt = accept_rejection_sampling(drafts, qs, Rows(TARGET, proc, drafts), SETTINGS, draws)
    out = list(drafts[:n]) + [nxt]
    if len(out) < 2:  # one more step of target-only sampling after the correction
        out.append(draws.draw(processed_probs(proc.logits(TARGET[1], out)[None], SETTINGS)[0], 1))  # position 1's own
    return out


def compare(proc, drafts, qs, draws):
    n, nxt = accept_token_compare(drafts, Rows(TARGET, proc, drafts), SETTINGS, draws)
    out = list(drafts[:n]) + [nxt]
    if len(out) < 2:
        out.append(draws.draw(processed_probs(proc.logits(TARGET[1], out)[None], SETTINGS)[0], 1))  # position 1's own
    return out


@pytest.mark.parametrize("rule", [rejection, compare], ids=["rejection_sampling", "token_compare"])
def test_every_setting_keeps_the_targets_joint_distribution(rule):
    d = tv(joint_histogram(rule), exact_joint())
    assert d < TV_BOUND


def test_the_bound_catches_a_target_row_processed_without_the_drafted_history():
    """The bug the chain exists to prevent: verifying row 1 as if draft 0 were not in the output."""

    def forgetful(proc, drafts, qs, draws):
        rows = Rows(np.stack([proc.logits(TARGET[0]), proc.logits(TARGET[1]), proc.logits(TARGET[2])]), None)
        n, nxt = accept_rejection_sampling(drafts, qs, rows, SETTINGS, draws)
        out = list(drafts[:n]) + [nxt]
        if len(out) < 2:
            out.append(draws.draw(processed_probs(proc.logits(TARGET[1], out)[None], SETTINGS)[0], 1))  # position 1's own
        return out

    d = tv(joint_histogram(forgetful), exact_joint())
    assert d > 2 * TV_BOUND


def test_the_chain_step_by_step():
    cfg = SamplingConfig(presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=2.0, logit_bias=((3, 10.0),))
    proc = LogitsProcessor(cfg, [0])
    proc.commit([1, 1])
    x = proc.logits(np.array([1.0, 1.0, 1.0, 1.0, -1.0]), [2])
    # 0: prompt, repetition only (1 / 2); 1: twice in the output (repetition, then 1.0 + 0.5 * 2);
    # 2: the drafted history (repetition, then 1.0 + 0.5); 3: biased; 4: untouched
    np.testing.assert_allclose(x, [0.5, 0.5 - 2.0, 0.5 - 1.5, 11.0, -1.0])
    lp, top = logprobs(x, 3, top=2)
    assert top[0][0] == 3 and np.isclose(lp, top[0][1]) and np.isclose(np.exp(lp),
                                                                       1 / (1 + np.exp(-10.5) + np.exp(-12) + np.exp(-12.5) + np.exp(-10.5 - 1.5)))


# -- real engines ----------------------------------------------------------------------------------
MAX_DRAFT = 4
PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 40, 41, 42, 40], [11, 12, 13]]
GREEDY = SamplingConfig(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=0.3, logit_bias=((7, 2.0), (42, -3.0)))


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    d = tmp_path_factory.mktemp("logits")
    pair = spec_pair(d, MAX_DRAFT)
    ckpt = make_checkpoint(d / "target", num_hidden_layers=2, seed=0)  # the pair's target checkpoint, again
    write_eagle_module(ckpt, d / "module")
    build_engine(ckpt, d / "ee", spec_build(6, speculative_decoding_mode="eagle"), say=lambda _: None, eagle_dir=d / "module")
    pair["tree"] = build_and_load(ckpt, d / "tt", spec_build(MAX_DRAFT, tree_attention=True))  # verifies suffix decoding's trees
    return pair


def engine_for(ex, method: str, tree=None) -> Engine:
    if method in ("eagle", "eagle-tree"):
        from specdec.runtime.loading import load_engine

        return load_engine(ex["dirs"] / "ee", num_threads=1, eagle_choices=tree)
    if method in ("suffix", "suffix-tree"):  # chains, or frequency trees on a target with tree attention
        tree = method == "suffix-tree"
        return Engine(ex["tree" if tree else "target"], [SuffixProposer(SuffixConfig(max_draft_len=MAX_DRAFT), trees=tree)],
                      SpeculationConfig("suffix", MAX_DRAFT))
    proposers = {"draft": [DraftModelProposer(ex["draft"], use_logits=True)], "identity": [DraftModelProposer(ex["identity"], use_logits=True)],
                 "ngram": [NGramProposer(MAX_DRAFT, 2)], "none": []}[method]
    name = "draft" if method == "identity" else method
    return Engine(ex["target"], proposers, SpeculationConfig(name, MAX_DRAFT if name != "none" else 0))


def run(engine: Engine, prompts, cfg: GenerationConfig, method: str | None = None, seeds=None):
    ids = [engine.add_request(p, cfg if seeds is None else GenerationConfig(**{**cfg.__dict__,
                                                                               "sampling": SamplingConfig(**{**cfg.sampling.__dict__,
                                                                                                             "random_seed": s})}),
                              seed_stream=i) for i, (p, s) in enumerate(zip(prompts, seeds or [0] * len(prompts), strict=True))]
    done = run_until_done(engine)
    return [done[i] for i in ids]


METHODS = ["draft", "identity", "ngram", "suffix", "suffix-tree", "eagle", "eagle-tree"]


@pytest.mark.parametrize("method", METHODS)
def test_greedy_with_penalties_and_bias_equals_target_only(ex, method):
    cfg = GenerationConfig(max_output_len=20, sampling=GREEDY, logprobs=3)
    base_engine = engine_for(ex, "none") if not method.startswith("eagle") else engine_for(ex, "eagle")
    want = run(base_engine, PROMPTS, GenerationConfig(**{**cfg.__dict__, "method": "none", "draft_len": 0}))
    plain = run(engine_for(ex, "none") if not method.startswith("eagle") else engine_for(ex, "eagle"), PROMPTS,
                GenerationConfig(max_output_len=20, method="none", draft_len=0))
    assert [o.output_ids for o in plain] != [o.output_ids for o in want]  # the settings do change the output
    engine = engine_for(ex, method, "[[0],[1],[0,0],[0,1],[0,0,0]]" if method == "eagle-tree" else None)
    # suffix decoding: the second pass drafts from the first pass's responses (its global cache), so its drafts
    # run on (the penalties leave the prompts little to repeat) and the acceptance path runs with the processing
    for _ in range(2 if method.startswith("suffix") else 1):
        got = run(engine, PROMPTS, cfg)
        assert [o.output_ids for o in got] == [o.output_ids for o in want]
    assert engine.stats.drafted > 0
    if method in ("identity", "suffix", "suffix-tree"):
        assert engine.stats.accepted > 0  # the acceptance path ran, not only rejections
    for g, w in zip(got, want, strict=True):  # the target's log-probabilities after processing, as target-only's
        assert len(g.logprobs) == len(w.logprobs) == len(w.output_ids)
        for (a, ta), (b, tb) in zip(g.logprobs, w.logprobs, strict=True):
            assert abs(a - b) < 1e-4
            assert [t for t, _ in ta] == [t for t, _ in tb] and np.allclose([v for _, v in ta], [v for _, v in tb], atol=1e-4)


@pytest.mark.parametrize("method", ["draft", "suffix"])
def test_sampled_with_every_setting_keeps_the_target_distribution(ex, method):
    """The first two output tokens over 1000 seeds, target-only against the draft model (its drafts sampled from
    its processed q, accepted or rejected by rejection sampling against the processed p) and against suffix decoding
    (deterministic drafts from the earlier requests' responses, token compare against the processed p): chi-square
    homogeneity, p > 0.001."""
    sampling = SamplingConfig(temperature=1.3, top_k=6, min_p=0.02, repetition_penalty=1.5, frequency_penalty=0.8, logit_bias=((8, 1.0),))
    counts = {}
    for m in ("none", method):
        engine = engine_for(ex, m)
        outs = run(engine, [PROMPTS[2]] * 1000, GenerationConfig(max_output_len=3, sampling=sampling), seeds=list(range(1000)))
        counts[m] = [tuple(o.output_ids[1:3]) for o in outs]
        if m != "none":
            assert engine.stats.accepted > 0 and engine.stats.rejected > 0
    keys = [k for k in sorted(set(counts["none"]) | set(counts[method])) if counts["none"].count(k) + counts[method].count(k) >= 10]
    table = np.array([[counts[m].count(k) for k in keys] for m in ("none", method)], float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = len(keys) - 1
    a = 2.0 / (9.0 * df)
    assert len(keys) >= 4 and stat < df * (1.0 - a + 3.09 * a**0.5) ** 3, (stat, len(keys))


def test_logprobs_never_list_a_forbidden_token_and_stay_finite():
    x = np.array([0.0, -np.inf, 1.0, -np.inf])
    lp, top = logprobs(x, 2, top=4)
    assert [t for t, _ in top] == [2, 0] and all(np.isfinite(v) for _, v in top)
    assert logprobs(x, 1)[0] == -9999.0  # OpenAI's figure for a token that cannot occur: JSON has no -inf


def test_a_subnormal_repetition_penalty_keeps_the_logits_finite():
    """Found by the server's fuzzer: 5e-324 divided a positive logit into +inf, and the softmax into NaN."""
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=5e-324)
    proc = LogitsProcessor(cfg, [0, 1])
    x = proc.logits(np.array([2.0, 1.0, 0.5, -1.0]))
    assert np.isfinite(x).all() and x[0] == x[1] == np.finfo(np.float64).max
    p = processed_probs(x[None], cfg)[0]
    np.testing.assert_allclose(p, [0.5, 0.5, 0.0, 0.0])
    assert np.isfinite(logprobs(x, 0, top=2)[0])


def test_prompt_logprobs_skip_a_prompt_id_past_the_pairs_shared_vocabulary():
    """A draft with a smaller vocabulary cuts the target's rows to the ids both have; a prompt id past them gets no score
    (it raised IndexError), and vLLM's prompt_logprobs get each scored token's rank."""
    from types import SimpleNamespace

    from specdec.runtime.round import SpeculativeRound

    rows = np.log(np.array([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]))  # [prompt len, vocab 4]
    cut = SimpleNamespace(vocab_limit=3)
    req = SimpleNamespace(prompt_ids=[0, 3, 2], config=GenerationConfig(prompt_logprobs=True, prompt_logprobs_top=1))
    scores = SpeculativeRound._prompt_logprobs(cut, req, rows)
    assert scores[0] is None and scores[1] is None  # id 3: past the shared 3
    assert scores[2].rank == 2 and scores[2].top[0][0] == 1 and np.isclose(np.exp(scores[2].logprob), 0.2 / 0.9)
