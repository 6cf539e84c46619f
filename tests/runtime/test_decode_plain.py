"""A lone plain request (target-only, greedy, no logits processing, no log-probabilities) runs
SpeculativeRound.decode_plain, the general round cut to what such a request needs (issue 41: the loop's own cost).

It must be the general round: the same tokens, finish reasons and counted metrics with the short form as without it,
for every way a request ends (length, an end id, a stop word, the engine's max_seq_len), with and without the prefix
cache, in an engine that also drafts for other requests; and the requests it does not take (sampled, log-probabilities,
drafting, a batch of two) take the general round.
"""

from __future__ import annotations

import time

import pytest
from checkpoints import add_word_tokenizer, make_checkpoint, write_eagle_module
from conftest import spec_build
from engine_runs import run_until_done

from specdec.builder.build import build_engine
from specdec.runtime import GenerationConfig, load_engine
from specdec.runtime.prefix_cache import PrefixCacheConfig
from specdec.runtime.round import SpeculativeRound
from specdec.runtime.sampling import SamplingConfig

PROMPT = [1, 40, 41, 42, 43, 44]
COUNTED = ("rounds", "drafted", "accepted", "no_draft_rounds", "output_tokens", "rejected", "cached_tokens")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode_plain")
    ckpt = add_word_tokenizer(make_checkpoint(d / "ckpt", max_position_embeddings=1024))
    build_engine(ckpt, d / "target", spec_build(4, max_input_len=32, max_seq_len=48), say=lambda _: None)
    build_engine(ckpt, d / "draft", spec_build(0, max_input_len=32, max_seq_len=48), say=lambda _: None)
    return d


def run(d, configs: list[GenerationConfig], fast: bool, monkeypatch, **engine_kw):
    """Each config's request in turn (alone unless ``together``), with decode_plain allowed or not: outputs, engine stats,
    how many rounds decode_plain ran."""
    taken = []
    with monkeypatch.context() as m:
        if fast:
            plain = SpeculativeRound.decode_plain
            m.setattr(SpeculativeRound, "decode_plain", lambda self, reqs, new: taken.append(1) or plain(self, reqs, new))
        else:
            m.setattr(SpeculativeRound, "plain_decoding", lambda self, r: False)
        engine = load_engine(d / "target", num_threads=1, **engine_kw)
        outs = []
        for config in configs:
            rid = engine.add_request(PROMPT, config)
            outs.append(run_until_done(engine)[rid])
            assert not engine.requests and not engine.running  # let go: its slot and record freed
    return outs, engine.stats, len(taken)


def same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.output_ids, x.finish_reason, x.error) == (y.output_ids, y.finish_reason, y.error)
        assert {k: getattr(x.metrics, k) for k in COUNTED} == {k: getattr(y.metrics, k) for k in COUNTED}


@pytest.mark.parametrize("prefix", [True, False])
def test_the_short_round_is_the_general_one(engines, monkeypatch, prefix):
    kw = {} if prefix else {"prefix_caching": PrefixCacheConfig(enabled=False)}
    (ref,), _, _ = run(engines, [GenerationConfig(max_output_len=12)], False, monkeypatch, **kw)
    out = ref.output_ids
    configs = [
        GenerationConfig(max_output_len=12),  # length
        GenerationConfig(max_output_len=12, end_ids=(out[5],)),  # an end id at its first occurrence
        GenerationConfig(max_output_len=12, stop_words=((out[3], out[4]),)),  # a stop word
        GenerationConfig(max_output_len=100),  # the engine's max_seq_len
        GenerationConfig(max_output_len=1),  # done at its prefill: no round at all
    ]
    want, want_stats, _ = run(engines, configs, False, monkeypatch, **kw)
    got, got_stats, taken = run(engines, configs, True, monkeypatch, **kw)
    same(got, want)
    assert [o.finish_reason for o in got] == ["length", "end_id", "stop_words", "max_seq_len", "length"]
    assert len(got[1].output_ids) == out.index(out[5]) + 1 and len(got[3].output_ids) == 48 - len(PROMPT)
    assert taken == sum(o.metrics.rounds for o in got) > 0  # every round of these requests was the short one
    assert {k: getattr(got_stats, k) for k in COUNTED} == {k: getattr(want_stats, k) for k in COUNTED}


def test_an_engine_that_drafts_runs_its_target_only_requests_short(engines, monkeypatch):
    """draft_len=auto in the engine, a request that asks for no method: short; one that drafts: the general round."""
    kw = dict(draft_dir=engines / "draft", draft_len="auto")
    target_only = GenerationConfig(max_output_len=10, method="none")
    want, _, _ = run(engines, [target_only], False, monkeypatch, **kw)
    got, _, taken = run(engines, [target_only], True, monkeypatch, **kw)
    same(got, want)
    assert taken == got[0].metrics.rounds == 9
    drafting, _, taken = run(engines, [GenerationConfig(max_output_len=10, draft_len=4)], True, monkeypatch, **kw)
    assert taken == 0 and drafting[0].metrics.drafted > 0 and drafting[0].output_ids == got[0].output_ids


@pytest.mark.parametrize("config", [GenerationConfig(max_output_len=8, sampling=SamplingConfig(temperature=0.8, random_seed=3)),
                                    GenerationConfig(max_output_len=8, logprobs=2)], ids=["sampled", "logprobs"])
def test_requests_it_does_not_take_run_the_general_round(engines, monkeypatch, config):
    want, _, _ = run(engines, [config], False, monkeypatch)
    got, _, taken = run(engines, [config], True, monkeypatch)
    same(got, want)
    assert taken == 0 and got[0].logprobs == want[0].logprobs


def test_a_batch_of_two_runs_the_general_round(engines, monkeypatch):
    taken = []
    plain = SpeculativeRound.decode_plain
    monkeypatch.setattr(SpeculativeRound, "decode_plain", lambda self, reqs, new: taken.append(1) or plain(self, reqs, new))
    engine = load_engine(engines / "target", num_threads=1)
    a = engine.add_request(PROMPT, GenerationConfig(max_output_len=6))
    b = engine.add_request(PROMPT[:3], GenerationConfig(max_output_len=12))
    done = run_until_done(engine)
    # 5 rounds together (a ends), then b alone: its last 6 rounds short
    assert len(done[a].output_ids) == 6 and len(done[b].output_ids) == 12 and len(taken) == 6


def test_on_an_eagle_target_the_short_round_feeds_the_prefix_cache(tmp_path, monkeypatch):
    """An EAGLE target's rows carry per-token features (eagle_hidden) into the prefix pool; a target-only request's short
    rounds must record them as the general round does: an EAGLE request that starts from its rows drafts the same."""
    ckpt = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=3, seed=0)
    write_eagle_module(ckpt, tmp_path / "module", aux_ids=[0, 2])
    build_engine(ckpt, tmp_path / "eagle", spec_build(4, speculative_decoding_mode="eagle", max_input_len=40, max_seq_len=64),
                 say=lambda _: None, eagle_dir=tmp_path / "module")
    results = {}
    for fast in (False, True):
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(SpeculativeRound, "plain_decoding", lambda self, r: False)
            engine = load_engine(tmp_path / "eagle", num_threads=1)
            first = engine.add_request(PROMPT, GenerationConfig(max_output_len=26, method="none"))
            out = run_until_done(engine)[first]
            follow = engine.add_request(PROMPT + out.output_ids, GenerationConfig(max_output_len=10, method="eagle", draft_len=3))
            results[fast] = (out, run_until_done(engine)[follow])
    (a, b), (a2, b2) = results[False], results[True]
    same([a, b], [a2, b2])
    assert b2.metrics.cached_tokens == b.metrics.cached_tokens >= 16 and b2.metrics.drafted > 0


def test_auto_leaves_out_the_calls_that_captured_a_cuda_graph(engines, monkeypatch):
    """A call that captured a CUDA graph (backends.base.Setups: a new shape on a cache, mid-run for a draft model's cache
    or a new batch bucket) is timed for none of auto's costs: a capture's tens of ms would price a shape far above what
    it costs. Here every third target call and every third draft call "capture" (count a setup and take 30 ms more)."""
    from specdec.runtime.backends.base import Setups
    from specdec.runtime.draft_len import AutoDraftLen

    recorded = []
    for name in ("record_verify", "record_draft", "record_catch_up"):
        real = getattr(AutoDraftLen, name)
        monkeypatch.setattr(AutoDraftLen, name, lambda self, *a, _real=real, _name=name: recorded.append((_name, a[-1])) or _real(self, *a))
    engine = load_engine(engines / "target", num_threads=1, draft_dir=engines / "draft", draft_len="auto")
    def capturing(real):
        calls = 0

        def forward(*a, **k):
            nonlocal calls
            calls += 1
            if calls % 3 == 0:
                Setups.count += 1
                time.sleep(0.03)
            return real(*a, **k)
        return forward

    for ex in (engine.target, next(iter(engine.proposers.values())).executor):
        monkeypatch.setattr(ex, "forward", capturing(ex.forward))
    engine.add_request(PROMPT, GenerationConfig(max_output_len=24, draft_len="auto"))
    run_until_done(engine)
    kinds = {name for name, _ in recorded}
    assert {"record_verify", "record_draft"} <= kinds  # the other calls are timed
    assert max(seconds for _, seconds in recorded) < 0.025, sorted(recorded, key=lambda r: -r[1])[:3]
