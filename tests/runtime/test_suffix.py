"""Suffix decoding's store, scoring and global cache on literal token arrays."""

import heapq
import json

import numpy as np
import pytest

from specdec.formats.errors import ConfigStringError, RequestError
from specdec.runtime.proposers.suffix import SuffixConfig, parse_suffix_config
from specdec.runtime.suffix_cache import ResponseCache
from specdec.runtime.suffix_index import SpecParams, TokenStore, best_draft

TREE = SpecParams(max_depth=24, max_spec_factor=1.0, min_token_prob=0.1)


def store(*seqs, index=False) -> TokenStore:
    s = TokenStore()
    for i, seq in enumerate(seqs):
        s.append(seq, end=i < len(seqs) - 1)
    if index:
        s.reindex()
    return s


def draft(seq, limit=8, tree=True, params=TREE):
    s = store(seq)
    return best_draft(s, seq[-(params.max_depth - 1):], limit, params, tree)


def test_one_earlier_occurrence_is_copied():
    # the tail [1, 2, 3] occurred once, followed by 7 8 9: a match of 3 earns 3 drafts (factor 1)
    d = draft([1, 2, 3, 7, 8, 9, 5, 1, 2, 3])
    assert (d.tokens, d.parents, d.probs, d.match_len) == ([7, 8, 9], [-1, 0, 1], [1.0, 1.0, 1.0], 3)


def test_the_budget_grows_with_the_match_length():
    # the same continuation after a 1-token match earns only 1 draft
    d = draft([4, 7, 8, 9, 5, 4])
    assert (d.tokens, d.match_len) == ([7], 1)


def test_frequencies_score_a_tree():
    # [1, 2] was followed by 3 twice and by 4 once: 3 (2/3) and 4 (1/3) are both children of the root
    d = draft([5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2, 3, 8, 1, 2])
    assert (d.tokens, d.parents) == ([3, 4], [-1, -1])
    assert d.probs == pytest.approx([2 / 3, 1 / 3])
    # a chain takes the most frequent child, then its most frequent child (9 and 8 tie at 1/2: the lower id)
    c = draft([5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2, 3, 8, 1, 2], tree=False)
    assert (c.tokens, c.parents) == ([3, 8], [-1, 0])
    assert c.probs == pytest.approx([2 / 3, 1 / 3])


def test_min_token_prob_drops_rare_continuations():
    # after [6] came 1 nine times and 2 once: 2's probability (0.1) is below 0.15
    seq = [6, 1] * 9 + [6, 2, 6]
    d = draft(seq, params=SpecParams(min_token_prob=0.15))
    assert 2 not in d.tokens and d.tokens[0] == 1


def test_the_depth_cap_limits_match_plus_draft():
    # a 10-token match in a tree 12 deep leaves room for 2 drafts, but a 6-token match of the same occurrence for 6
    seq = list(range(10, 30)) + list(range(10, 20))
    d = draft(seq, params=SpecParams(max_depth=12))
    assert d.tokens == [20, 21, 22, 23, 24, 25] and d.match_len == 6


def test_the_context_own_occurrence_is_not_a_match():
    assert draft([1, 2, 3, 4]).tokens == []


def test_a_continuation_stops_at_the_end_of_a_sequence():
    # in a store of two sequences, what followed [7, 8] in the first ends with it: nothing runs across
    s = store([1, 7, 8], [7, 8])
    assert best_draft(s, [7, 8], 8, TREE, True).tokens == []


def test_index_and_scan_agree():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 6, 400).tolist()
    scanned, indexed = store(seq), store(seq, index=True)
    indexed.append(seq[:50])  # half indexed, half scanned
    scanned.append(seq[:50])
    ctx = (seq + seq[:50])[-23:]
    for (a, b) in zip(scanned.matches(ctx, 23), indexed.matches(ctx, 23), strict=True):
        assert a[:2] == b[:2] and sorted(a[2].tolist()) == sorted(b[2].tolist())


def _reference(seq, limit, params, tree):
    """ArcticInference's speculate() written plainly: counts by brute force over occurrences that end
    before the context's own, a heap of nodes best first, every match length tried (ties: the longer)."""
    n = len(seq)

    def count(path):  # occurrences of `path` whose matched context ends before the end
        return sum(seq[s : s + len(path)] == path for s in range(n - len(path) + 1) if s + m < n)

    best = ([], [], [], 0)
    for m in range(1, min(params.max_depth, n)):
        ctx = seq[-m:]
        if not count(ctx):
            break
        budget = min(limit, int(m * params.max_spec_factor + params.max_spec_offset + 1e-6), params.max_depth - m)
        toks, parents, probs = [], [], []
        heap, order = [], 0

        def push(path, prob, parent, m=m, heap=heap):
            nonlocal order
            total = count(path)
            kids = sorted({seq[s + len(path)] for s in range(n - len(path)) if seq[s : s + len(path)] == path and s + m < n})
            ranked = sorted(((count(path + [t]), t) for t in kids), key=lambda c: (-c[0], c[1]))
            for c, t in ranked:
                if prob * c / total >= params.min_token_prob:
                    heapq.heappush(heap, (-prob * c / total, order, path + [t], parent, t))
                    order += 1
                    if not tree:
                        break

        push(ctx, 1.0, -1)
        while heap and len(toks) < budget:
            neg, _, path, parent, t = heapq.heappop(heap)
            toks.append(t), parents.append(parent), probs.append(-neg)
            push(path, -neg, len(toks) - 1)
        if sum(probs) >= sum(best[2]) and toks:
            best = (toks, parents, probs, m)
    return best


@pytest.mark.parametrize("tree", [True, False])
def test_drafts_equal_a_plain_reference(tree):
    rng = np.random.default_rng(7)
    params = SpecParams(max_depth=10, max_spec_factor=1.5, max_spec_offset=1.0, min_token_prob=0.05)
    for trial in range(40):
        alphabet = int(rng.integers(2, 5))
        seq = rng.integers(0, alphabet, int(rng.integers(5, 60))).tolist()
        got = draft(seq, limit=6, tree=tree, params=params)
        want = _reference(seq, 6, params, tree)
        assert (got.tokens, got.parents) == (want[0], want[1]), (trial, seq)
        assert got.probs == pytest.approx(want[2])


def test_the_cache_holds_its_token_cap_and_evicts_least_recently_used():
    cache = ResponseCache(max_tokens=100, max_responses=1000)
    for i in range(5):
        cache.add([1000 + i] + [i] * 19)  # 5 responses of 20 tokens: exactly the cap
    assert cache.num_tokens == 100 and len(cache) == 5
    # drafting from response 0 makes it the most recently used
    d = cache.speculate([1000, 0, 0], 4, TREE, tree=False)
    assert d.tokens == [0, 0, 0]
    cache.touch(d)
    cache.add([2000] + [9] * 19)  # over the cap: the least recently used leave until <= 90 tokens
    kept = [cache.response(i)[0] for i in range(len(cache))]
    assert cache.num_tokens <= 90 and kept == [1000, 1003, 1004, 2000]
    assert cache.evicted == 2
    # the evicted responses are gone from the store: nothing follows their first tokens any more
    assert cache.speculate([1001, 1], 4, TREE, tree=False).tokens == []


def test_the_cache_memory_stays_bounded():
    cache = ResponseCache(max_tokens=5000, max_responses=100)
    rng = np.random.default_rng(0)
    peak = 0
    for _ in range(400):
        cache.add(rng.integers(0, 50_000, int(rng.integers(10, 200))))
        peak = max(peak, cache.nbytes)
        assert cache.num_tokens <= 5000 and len(cache) <= 100
    # int32 tokens (with the buffer's doubling) + int64 pair keys and positions: ~40 bytes a token at most
    assert peak < 40 * 5000 + 16 * 1024


def test_the_cache_response_cap():
    cache = ResponseCache(max_tokens=10**6, max_responses=10)
    for i in range(25):
        cache.add([i, i + 1])
    assert len(cache) <= 10 and cache.response(len(cache) - 1) == [24, 25]


def test_seed_file(tmp_path):
    f = tmp_path / "seed.jsonl"
    f.write_text(json.dumps({"token_ids": [5, 6, 7, 8]}) + "\n\n" + json.dumps({"text": "ab"}) + "\n" + json.dumps("c") + "\n")
    cache = ResponseCache()
    assert cache.load(f, encode=lambda text: [ord(c) for c in text]) == 3
    assert [cache.response(i) for i in range(3)] == [[5, 6, 7, 8], [97, 98], [99]]
    assert cache.speculate([5, 6], 4, TREE, tree=False).tokens == [7, 8]


@pytest.mark.parametrize("content, where", [
    ("{not json\n", "seed.jsonl:1 is not JSON"),
    ('{"token_ids": [1, -2]}\n', "seed.jsonl:1 is neither"),
    ('[1, 2]\n', "seed.jsonl:1 is neither"),
])
def test_seed_file_refusals(tmp_path, content, where):
    f = tmp_path / "seed.jsonl"
    f.write_text(content)
    cache = ResponseCache()
    with pytest.raises(RequestError, match=where):
        cache.load(f)
    assert len(cache) == 0  # nothing half-loaded


def test_seed_file_text_needs_a_tokenizer(tmp_path):
    f = tmp_path / "seed.jsonl"
    f.write_text('{"token_ids": [1, 2]}\n{"text": "hi"}\n')
    cache = ResponseCache()
    with pytest.raises(RequestError, match="no tokenizer"):
        cache.load(f)
    assert len(cache) == 0
    with pytest.raises(RequestError, match="does not exist"):
        cache.load(tmp_path / "missing.jsonl")


def test_suffix_config_strings():
    assert parse_suffix_config("[12, 32]") == SuffixConfig(max_draft_len=12, max_tree_depth=32)
    cfg = parse_suffix_config('{"max_draft_len": 4, "min_token_prob": 0.2, "global_cache": false, "max_cached_tokens": 1e5}')
    assert (cfg.max_draft_len, cfg.min_token_prob, cfg.global_cache, cfg.max_cached_tokens) == (4, 0.2, False, 100000)


@pytest.mark.parametrize("text, why", [
    ("[8, 24", "malformed"),
    ("[0]", "max_draft_len must be >= 1"),
    ('{"max_draft_len": 2.5}', "must be an integer"),
    ('{"global_cache": 1}', "true or false"),
    ('{"tree_depth": 3}', "unknown key 'tree_depth'"),
    ('{"min_token_prob": 2}', "min_token_prob must be in"),
    ('{"cached_prompt_tokens": -1}', "cached_prompt_tokens must be >= 0"),
    ('"fast"', "neither a list nor an object"),
])
def test_suffix_config_refusals(text, why):
    with pytest.raises(ConfigStringError, match=why) as err:
        parse_suffix_config(text)
    assert "\n" not in str(err.value) and "e.g. --suffix_config" in str(err.value)
