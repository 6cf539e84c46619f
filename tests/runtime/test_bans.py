"""Token bans (runtime/bans.py): allowed_token_ids, bad words, no repeated n-grams, min_output_len.

Each ban is checked against a reference that reads the whole sequence from scratch (prompt + committed output +
the drafts before the position), over hypothesis-drawn histories committed in pieces; then on real engines, where
greedy output under every method equals target-only's with the same bans, and sampled output keeps target-only's
distribution (chi-square).
"""

import numpy as np
import pytest
from engine_runs import run_until_done
from hypothesis import given, settings, strategies as st
from test_logits import PROMPTS, engine_for, ex, run  # noqa: F401  (ex: the engines, a module fixture)

from specdec.formats.errors import RequestError
from specdec.runtime.logits import LogitsProcessor
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig

V = 8


def reference_bans(cfg: SamplingConfig, prompt, output, appended, end_ids, min_output_len) -> set[int]:
    """Every token banned after prompt + output + appended, computed from the whole sequence: the allowed ids always
    hold; bad words and n-grams, then the end ids before min_output_len, only where they leave some token."""
    everything = set(range(V))
    seq = list(prompt) + list(output) + list(appended)
    banned = everything - set(cfg.allowed_token_ids) if cfg.allowed_token_ids else set()
    soft: set[int] = set()
    for w in cfg.bad_words_ids:
        before = list(w[:-1])
        if not before or seq[len(seq) - len(before):] == before:
            soft.add(w[-1])
    n = cfg.no_repeat_ngram_size
    if n and len(seq) >= n - 1:
        prefix = seq[len(seq) - (n - 1):] if n > 1 else []
        for i in range(len(seq) - n + 1):
            if seq[i:i + n - 1] == prefix:
                soft.add(seq[i + n - 1])
    if banned | soft != everything:
        banned |= soft
    if len(output) + len(appended) < min_output_len and banned | set(end_ids) != everything:
        banned |= set(end_ids)
    return banned


tokens = st.lists(st.integers(0, V - 1), max_size=12)


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=8), pieces=st.lists(tokens, max_size=4), appended=tokens,
       allowed=st.lists(st.integers(0, V - 1), max_size=5), words=st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=3), max_size=3),
       ngram=st.integers(0, 4), min_len=st.integers(0, 20), ends=st.lists(st.integers(0, V - 1), max_size=2))
def test_bans_equal_a_reference_that_reads_the_whole_sequence(prompt, pieces, appended, allowed, words, ngram, min_len, ends):
    cfg = SamplingConfig(allowed_token_ids=tuple(allowed), bad_words_ids=tuple(tuple(w) for w in words), no_repeat_ngram_size=ngram)
    proc = LogitsProcessor(cfg, prompt, None, ends, min_len)
    output: list[int] = []
    for piece in pieces:  # committed in rounds, as the engine does
        proc.commit(piece)
        output += piece
    row = np.linspace(1.0, 2.0, V)
    x = proc.logits(row, appended)
    want = reference_bans(cfg, prompt, output, appended, ends, min_len)
    assert set(np.flatnonzero(~np.isfinite(x))) == want and np.isfinite(x).any()
    np.testing.assert_array_equal(x[np.isfinite(x)], row[np.isfinite(x)])  # nothing else changed


def test_min_output_len_stops_banning_and_the_fast_paths_return():
    proc = LogitsProcessor(SamplingConfig(), [1, 2], None, (3,), 2)
    assert not proc.plain and np.isneginf(proc.logits(np.zeros(V), [5])[3])
    assert np.isfinite(proc.logits(np.zeros(V), [5, 6])[3])  # the third token may end it
    proc.commit([5, 6])
    assert proc.plain and proc.bans is None


def test_a_request_whose_allowed_tokens_are_all_banned_is_refused():
    with pytest.raises(RequestError, match="every one of allowed_token_ids"):
        GenerationConfig(sampling=SamplingConfig(allowed_token_ids=(2, 3), bad_words_ids=((3,), (2,))), max_output_len=4)
    GenerationConfig(sampling=SamplingConfig(allowed_token_ids=(2, 3), bad_words_ids=((3,),)), end_ids=(2,), min_output_len=1)
    with pytest.raises(RequestError, match="min_output_len=5 is larger than max_output_len=4"):
        GenerationConfig(min_output_len=5, max_output_len=4)
    for bad in (dict(allowed_token_ids=(-1,)), dict(bad_words_ids=((),)), dict(bad_words_ids=(1,)), dict(no_repeat_ngram_size=-1)):
        with pytest.raises(RequestError):
            SamplingConfig(**bad)


def test_a_grammar_that_must_end_ends_before_min_output_len():
    """The end ids yield where nothing else is left (a grammar that allows only them): the output ends, valid."""

    class OnlyEnd:  # a grammar state allowing token 3 alone
        def allowed(self, appended):
            m = np.zeros(V, bool)
            m[3] = True
            return m

    proc = LogitsProcessor(SamplingConfig(), [1], OnlyEnd(), (3,), 5)
    x = proc.logits(np.zeros(V))
    assert np.isfinite(x[3]) and np.isneginf(np.delete(x, 3)).all()


# -- real engines ----------------------------------------------------------------------------------
METHODS = ["draft", "identity", "ngram", "suffix", "suffix-tree", "eagle"]


def target_only(ex, method, cfg):  # noqa: F811
    base = engine_for(ex, "eagle" if method.startswith("eagle") else "none")
    return run(base, PROMPTS, GenerationConfig(**{**cfg.__dict__, "method": "none", "draft_len": 0}))


@pytest.mark.parametrize("method", METHODS)
def test_greedy_with_bans_equals_target_only(ex, method):  # noqa: F811
    plain = target_only(ex, method, GenerationConfig(max_output_len=16))
    often = [t for o in plain for t in o.output_ids]
    top = max(set(often), key=often.count)  # the token target-only emits most: banning it changes every output
    second = [t for t in plain[0].output_ids if t != top][:2]
    sampling = SamplingConfig(temperature=0.0, bad_words_ids=((top,), tuple(second)) if len(second) == 2 else ((top,),), no_repeat_ngram_size=3)
    ends = (plain[1].output_ids[2],)  # target-only would end its second request at its third token
    cfg = GenerationConfig(max_output_len=16, sampling=sampling, end_ids=ends, min_output_len=6, logprobs=2)
    want = target_only(ex, method, cfg)
    assert [o.output_ids for o in want] != [o.output_ids for o in plain]
    engine = engine_for(ex, method)
    for _ in range(2 if method.startswith("suffix") else 1):  # suffix decoding drafts from the first pass's responses
        got = run(engine, PROMPTS, cfg)
        assert [o.output_ids for o in got] == [o.output_ids for o in want]
    assert engine.stats.drafted > 0
    for prompt, o in zip(PROMPTS, got, strict=True):
        assert top not in o.output_ids
        seq = prompt + o.output_ids
        grams = [tuple(seq[i:i + 3]) for i in range(len(seq) - 2)]
        assert all(grams[i] not in grams[:i] for i in range(len(prompt) - 2, len(grams))), "an output token repeated a 3-gram"
        if o.finish_reason == "end_id":
            assert len(o.output_ids) > 6
        assert all(t not in ends for t in o.output_ids[:6])
        for a, b in zip(o.logprobs, want[PROMPTS.index(prompt)].logprobs, strict=True):
            assert abs(a[0] - b[0]) < 1e-4


@pytest.mark.parametrize("method", METHODS)
def test_min_output_len_alone_equals_target_only_and_hands_back_the_fast_paths(ex, method):  # noqa: F811
    """Only end ids held back: the processor goes back to plain once the output reaches min_output_len, mid-round."""
    plain = target_only(ex, method, GenerationConfig(max_output_len=16))
    ends = (plain[1].output_ids[2], plain[0].output_ids[1])  # target-only would end early
    cfg = GenerationConfig(max_output_len=16, end_ids=ends, min_output_len=5)
    want = target_only(ex, method, cfg)
    assert [o.output_ids for o in want] != [o.output_ids for o in target_only(ex, method, replace_min(cfg, 0))]  # it holds the ends back
    engine = engine_for(ex, method)
    for _ in range(2 if method.startswith("suffix") else 1):
        ids = [engine.add_request(p, cfg) for p in PROMPTS]
        done, seen = {}, {True: 0, False: 0}  # running requests' processors past / before min_output_len: plain?
        while engine.has_unfinished():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = o
                else:
                    proc = engine.requests[o.request_id].processor
                    assert proc.plain == (len(o.output_ids) >= 5), (len(o.output_ids), proc.plain)
                    seen[proc.plain] += 1
        assert [done[i].output_ids for i in ids] == [o.output_ids for o in want]
    assert seen[True] and seen[False]
    assert all(len(o.output_ids) > 5 or o.finish_reason != "end_id" for o in want)


def replace_min(cfg: GenerationConfig, n: int) -> GenerationConfig:
    return GenerationConfig(**{**cfg.__dict__, "min_output_len": n})


def test_stop_words_are_not_matched_before_min_output_len(ex):  # noqa: F811
    plain = target_only(ex, "ngram", GenerationConfig(max_output_len=12))
    out = plain[0].output_ids
    stop = (out[1],)  # would stop at the second token
    cfg = GenerationConfig(max_output_len=12, stop_words=(stop,))
    assert target_only(ex, "ngram", cfg)[0].output_ids == out[:2]
    later = GenerationConfig(max_output_len=12, stop_words=(stop,), min_output_len=4)
    got = run(engine_for(ex, "ngram"), [PROMPTS[0]], later)[0]
    assert got.output_ids[:4] == out[:4] and (got.finish_reason == "length" or got.output_ids[-1] == stop[0])


def test_allowed_token_ids_keep_the_output_inside_them(ex):  # noqa: F811
    allowed = (5, 9, 11, 40)
    cfg = GenerationConfig(max_output_len=10, sampling=SamplingConfig(temperature=0.0, allowed_token_ids=allowed))
    want = target_only(ex, "draft", cfg)
    got = run(engine_for(ex, "identity"), PROMPTS, cfg)
    assert [o.output_ids for o in got] == [o.output_ids for o in want]
    assert all(set(o.output_ids) <= set(allowed) for o in got)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine_for(ex, "none").add_request(PROMPTS[0], GenerationConfig(sampling=SamplingConfig(allowed_token_ids=(10**6,))))


def test_sampled_with_bans_keeps_the_target_distribution(ex):  # noqa: F811
    """The first two output tokens over 1000 seeds, target-only against the draft model under rejection sampling, with a
    bad word, a two-token bad word and no repeated bigram: chi-square homogeneity, p > 0.001."""
    probe = run(engine_for(ex, "none"), [PROMPTS[2]], GenerationConfig(max_output_len=3, method="none", draft_len=0))[0].output_ids
    sampling = SamplingConfig(temperature=1.3, top_k=6, bad_words_ids=((probe[0],), (probe[1], probe[2])), no_repeat_ngram_size=2)
    counts = {}
    for m in ("none", "draft"):
        engine = engine_for(ex, m)
        ids = [engine.add_request(PROMPTS[2], GenerationConfig(max_output_len=3, sampling=SamplingConfig(**{**sampling.__dict__, "random_seed": s})),
                                  seed_stream=s) for s in range(1000)]
        done = run_until_done(engine)
        counts[m] = [tuple(done[i].output_ids[1:3]) for i in ids]
        assert all(probe[0] not in done[i].output_ids for i in ids)
        if m != "none":
            assert engine.stats.accepted > 0 and engine.stats.rejected > 0
    keys = [k for k in sorted(set(counts["none"]) | set(counts["draft"])) if counts["none"].count(k) + counts["draft"].count(k) >= 10]
    table = np.array([[counts[m].count(k) for k in keys] for m in ("none", "draft")], float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = len(keys) - 1
    a = 2.0 / (9.0 * df)
    assert len(keys) >= 4 and stat < df * (1.0 - a + 3.09 * a**0.5) ** 3, (stat, len(keys))
