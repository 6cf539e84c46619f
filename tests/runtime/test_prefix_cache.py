"""Prefix caching is exact: a request served from the cache gives what the same request gives on a cold engine.

Every case compares a warm engine (prefix caching on, an earlier request's rows in its pool or in a running slot)
with a cold one (prefix caching off) on the same request: output tokens and log-probabilities, equal to the bit,
and the rows the hit copied (metrics.cached_tokens). Speculation methods: none, a draft model (greedy and sampled
with rejection sampling), n-gram, suffix decoding; Medusa and EAGLE in tests/runtime/test_prefix_cache_heads.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_and_load, spec_build, spec_pair
from engine_runs import run_until_done

from specdec.formats.errors import EngineError, RequestError
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.prefix_cache import MIN_FRESH, PrefixCacheConfig, open_prefix_cache
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer
from specdec.runtime.proposers.suffix import SuffixProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig

BLOCK = 4
GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(temperature=0.9, top_k=20, random_seed=11)
rng = np.random.default_rng(0)
SYSTEM = rng.integers(3, 96, 20).tolist()  # a shared "system prompt"
A = SYSTEM + rng.integers(3, 96, 6).tolist()
B = SYSTEM + rng.integers(3, 96, 5).tolist()
OTHERS = [rng.integers(3, 96, n).tolist() for n in (9, 30, 14)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return spec_pair(tmp_path_factory.mktemp("prefix_pair"), 4)


def proposers(pair, method: str, use_logits: bool = False):
    if method == "draft":
        return [DraftModelProposer(pair["draft"], use_logits=use_logits)]
    if method == "ngram":
        return [NGramProposer(4, 3)]
    if method == "suffix":
        return [SuffixProposer()]
    return []


def engine(ex, props=(), method="none", k=0, on=True, slots=None):
    return Engine(ex, props, SpeculationConfig(method, k), prefix_caching=PrefixCacheConfig(enabled=on, slots=slots, block=BLOCK))


def run(eng, prompts, sampling=GREEDY, n_out=12, logprobs=2, **kw):
    """Add every prompt at once (seed stream i for prompt i), step to the end; the outputs in order."""
    cfg = GenerationConfig(max_output_len=n_out, sampling=sampling, logprobs=logprobs, **kw)
    ids = [eng.add_request(p, cfg, seed_stream=i) for i, p in enumerate(prompts)]
    done = run_until_done(eng)
    return [done[i] for i in ids]


def common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def same(got, want):
    assert got.output_ids == want.output_ids
    assert got.logprobs == want.logprobs  # floats compared exactly: the same bits


CASES = [("none", 0, GREEDY, False), ("none", 0, SAMPLED, False), ("draft", 3, GREEDY, False), ("draft", 3, SAMPLED, True),
         ("ngram", 3, GREEDY, False), ("suffix", 4, GREEDY, False)]


@pytest.mark.parametrize("method,k,sampling,use_logits", CASES, ids=lambda v: getattr(v, "temperature", v))
def test_a_hit_on_a_finished_requests_rows_gives_the_cold_output(pair, method, k, sampling, use_logits):
    t = pair["target"]
    warm = engine(t, proposers(pair, method, use_logits), method, k)
    run(warm, [A], sampling)
    (got,) = run(warm, [B], sampling)
    (want,) = run(engine(t, proposers(pair, method, use_logits), method, k, on=False), [B], sampling)
    same(got, want)
    assert got.metrics.cached_tokens == len(SYSTEM)
    assert want.metrics.cached_tokens == 0


@pytest.mark.parametrize("method,k", [("none", 0), ("draft", 3), ("ngram", 3)])
def test_the_next_turn_of_a_conversation_reuses_the_earlier_prompt_and_answer(pair, method, k):
    """Each turn's prompt is the previous prompt + its answer + a tool result: the hit covers the answer's rows too
    (this target verifies drafts, so a decoding step's rows are a prefill's bits)."""
    t = pair["target"]
    warm, cold = engine(t, proposers(pair, method), method, k), engine(t, proposers(pair, method), method, k, on=False)
    prompt = A
    for turn in range(3):
        (got,) = run(warm, [prompt], n_out=6)
        (want,) = run(cold, [prompt], n_out=6)
        same(got, want)
        if turn:
            # all but the tool result's 3 tokens and the answer's last token (never fed: the round that made it ended)
            assert got.metrics.cached_tokens == len(prompt) - 3 - 1
        prompt = prompt + got.output_ids + [7, 8, 9]


def test_a_hit_in_a_busy_batch_gives_the_output_it_gives_alone_on_a_cold_engine(pair):
    t = pair["target"]
    warm = engine(t, proposers(pair, "draft"), "draft", 3)
    run(warm, [A])
    outs = run(warm, [OTHERS[0], B, *OTHERS[1:]])  # B copies SYSTEM's rows while three others prefill beside it
    assert [o.metrics.cached_tokens for o in outs] == [0, len(SYSTEM), 0, 0]
    for prompt, got in zip([OTHERS[0], B, *OTHERS[1:]], outs, strict=True):
        (want,) = run(engine(t, proposers(pair, "draft"), "draft", 3, on=False), [prompt])
        same(got, want)


def test_a_running_requests_prompt_is_a_source_for_a_newcomer(pair):
    t = pair["target"]
    warm = engine(t)
    first = warm.add_request(A, GenerationConfig(max_output_len=20, logprobs=1))
    warm.step()  # A is running
    second = warm.add_request(B, GenerationConfig(max_output_len=8, logprobs=1))
    done = run_until_done(warm)
    assert done[second].metrics.cached_tokens == len(SYSTEM)
    cold = engine(t, on=False)
    for rid, prompt, n in ((first, A, 20), (second, B, 8)):
        (want,) = run(cold, [prompt], n_out=n, logprobs=1)
        same(done[rid], want)


@pytest.mark.parametrize("method,k", [("none", 0), ("draft", 3)])
def test_samples_of_one_prompt_share_its_rows(pair, method, k):
    """n choices of one prompt (added together, seed streams 0..2): the first prefills, the others copy its rows in a
    second call and prefill the last MIN_FRESH tokens; each sample is what it is on a cold engine."""
    t = pair["target"]
    got = run(engine(t, proposers(pair, method), method, k), [A] * 3, SAMPLED)
    want = run(engine(t, proposers(pair, method), method, k, on=False), [A] * 3, SAMPLED)
    for g, w in zip(got, want, strict=True):
        same(g, w)
    assert [o.metrics.cached_tokens for o in got] == [0] + [len(A) - MIN_FRESH] * 2
    assert len({tuple(o.output_ids) for o in got}) > 1  # the samples did differ


def test_a_plain_engine_keeps_prompt_rows_only(pair):
    """A target built without draft verification runs a one-token step on other kernels than a prefill: its pool keeps
    prompt rows only, and the next turn reuses the earlier prompt, not its answer."""
    t = pair["identity"]
    assert not t.build.rows_consistent and pair["target"].build.rows_consistent
    warm, cold = engine(t), engine(t, on=False)
    (first,) = run(warm, [A], n_out=6)
    prompt = A + first.output_ids + [7, 8, 9]
    (got,) = run(warm, [prompt], n_out=6)
    (want,) = run(cold, [prompt], n_out=6)
    same(got, want)
    assert got.metrics.cached_tokens == len(A)


def test_prompt_logprobs_read_nothing_from_the_cache(pair):
    t = pair["target"]
    warm = engine(t)
    run(warm, [A])
    (got,) = run(warm, [B], prompt_logprobs=True)
    (want,) = run(engine(t, on=False), [B], prompt_logprobs=True)
    assert got.metrics.cached_tokens == 0
    same(got, want)
    assert got.prompt_logprobs == want.prompt_logprobs


def test_the_pool_forgets_the_least_recently_used_sequence(pair):
    t = pair["target"]
    other = OTHERS[1]
    warm = engine(t, slots=1)
    run(warm, [A])
    (held,) = run(warm, [other])  # the one slot now holds `other` and its answer but the last token
    prompt = other + [5, 6, 7]
    (again,) = run(warm, [prompt])
    assert again.metrics.cached_tokens == min(common(other + held.output_ids[:-1], prompt), len(prompt) - MIN_FRESH)
    (late,) = run(warm, [B])
    assert late.metrics.cached_tokens == 0  # A's rows were evicted


def test_a_long_hit_beside_a_long_prompt_is_prefilled_in_calls_that_fit(pair):
    """One newcomer copies 40 rows, another prefills 45 tokens: one call of both would write past the capacity (96 +
    4 + 1), so each gets its own; both are what they are cold."""
    t = pair["target"]
    long_system = rng.integers(3, 96, 42).tolist()
    warm = engine(t)
    (held,) = run(warm, [long_system + [5]], n_out=4)
    prompts = [long_system + [6, 7, 8], rng.integers(3, 96, 45).tolist()]
    outs = run(warm, prompts, n_out=4)
    assert outs[0].metrics.cached_tokens == common(long_system + [5] + held.output_ids, prompts[0]) >= len(long_system)
    for prompt, got in zip(prompts, outs, strict=True):
        (want,) = run(engine(t, on=False), [prompt], n_out=4)
        same(got, want)


def test_an_executor_without_a_prefix_pool_turns_caching_off_or_refuses(pair):
    from specdec.runtime.backends.tensorrt.executor import TrtExecutor

    trt = object.__new__(TrtExecutor)  # no GPU here: its refusal needs nothing that __init__ opens
    trt._name, trt.build = "engines/trt", pair["target"].build
    cache = pair["target"].new_cache(1)
    off, why = open_prefix_cache(trt, cache, PrefixCacheConfig())
    assert off is None and "prefix caching is not available for engines/trt" in why and "--no-enable-prefix-caching" in why
    with pytest.raises(EngineError, match="holds one device KV buffer"):
        open_prefix_cache(trt, cache, PrefixCacheConfig(enabled=True))
    assert open_prefix_cache(pair["target"], cache, PrefixCacheConfig(enabled=False)) == (None, "")


def test_copy_prefix_copies_the_rows_between_a_cache_and_a_pool(pair):
    t = pair["target"]
    cache, pool = t.new_cache(2), t.new_prefix_pool(3)
    t.forward(cache, [A], all_logits=False)
    t.copy_prefix(cache, 0, pool, 2, 10)
    t.copy_prefix(pool, 2, cache, 1, 7)
    assert pool.lengths[2] == 10 and cache.lengths[1] == 7
    for a, b in zip(cache.keys + cache.values, pool.keys + pool.values, strict=True):
        np.testing.assert_array_equal(a[1][:7] if a.ndim == 3 else a[1][:, :7], a[0][:7] if a.ndim == 3 else a[0][:, :7])
        np.testing.assert_array_equal(b[2][:10] if b.ndim == 3 else b[2][:, :10], a[0][:10] if a.ndim == 3 else a[0][:, :10])
    with pytest.raises(ValueError):
        t.copy_prefix(cache, 1, pool, 0, 8)  # slot 1 holds 7


def test_bad_settings_are_refused():
    with pytest.raises(RequestError, match="at least 1 slot"):
        PrefixCacheConfig(slots=0)


def test_two_threads_give_the_bits_of_one_call(tmp_path):
    """The hit's rows were computed by another call than a cold prefill's: with two threads splitting the work too."""
    from checkpoints import make_checkpoint

    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ckpt = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=2, hidden_size=128, intermediate_size=256, seed=3)
    build_and_load(ckpt, tmp_path / "e", spec_build(4))
    t = OrtExecutor(load_engine_dir(tmp_path / "e"), num_threads=2)
    warm = engine(t)
    run(warm, [A])
    (got,) = run(warm, [B])
    (want,) = run(engine(t, on=False), [B])
    same(got, want)
    assert got.metrics.cached_tokens == len(SYSTEM)
