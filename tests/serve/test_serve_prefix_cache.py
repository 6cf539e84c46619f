"""Prefix caching through specdec-serve: OpenAI's usage.prompt_tokens_details.cached_tokens, the /metrics counters, n
samples sharing their prompt, and answers equal to a server that runs without it (--no-enable-prefix-caching)."""

import httpx
import pytest
from servers import metric, running, scrape, served_pair

from specdec.runtime.prefix_cache import MIN_FRESH, PrefixCacheConfig

SYSTEM = list(range(10, 50))  # 40 token ids: a shared system prompt
TURN_1, TURN_2 = SYSTEM + [60, 61, 62], SYSTEM + [70, 71]
SPECS = [{"method": "none"}, {"method": "draft"}, {"method": "ngram"}, {"method": "draft", "num_draft_tokens": "auto"}]


@pytest.fixture(scope="module")
def servers():
    with running(served_pair()) as warm, running(served_pair(prefix_caching=PrefixCacheConfig(enabled=False))) as cold:
        yield warm, cold


def complete(url, prompt, spec, **kw):
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 2, "speculative": spec, **kw}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def answer(body):
    return [(c["token_ids"], c["logprobs"]) for c in body["choices"]]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['method']}-{s.get('num_draft_tokens', 'default')}")
def test_a_shared_prefix_is_reported_cached_and_the_answer_is_the_cold_servers(servers, spec):
    warm, cold = servers
    before = scrape(warm)
    first = complete(warm, TURN_1, spec)
    second = complete(warm, TURN_2, spec)
    # an earlier case left both prompts in the pool: then all but the last MIN_FRESH tokens are cached
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] in (0, len(TURN_1) - MIN_FRESH)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] in (len(SYSTEM), len(TURN_2) - MIN_FRESH)
    for got, prompt in ((first, TURN_1), (second, TURN_2)):
        want = complete(cold, prompt, spec)
        assert answer(got) == answer(want)
        assert want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    after = scrape(warm)
    hits = metric(after, "specdec:prefix_cache_hits_total") - metric(before, "specdec:prefix_cache_hits_total")
    queries = metric(after, "specdec:prefix_cache_queries_total") - metric(before, "specdec:prefix_cache_queries_total")
    cached = first["usage"]["prompt_tokens_details"]["cached_tokens"] + second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert (queries, hits) == (len(TURN_1) + len(TURN_2), cached)


def test_n_samples_share_their_prompt(servers):
    """Three seeded samples of one prompt: the first prefills it, the others copy its rows (counted in /metrics); the
    choices are the cold server's, and usage reports the prompt as computed (its first sample copied nothing)."""
    warm, cold = servers
    prompt = [90, 91, 92] + SYSTEM[::-1]  # no earlier request shares its first block
    before = scrape(warm)
    kw = {"n": 3, "temperature": 0.8, "seed": 4}
    got = complete(warm, prompt, {"method": "draft"}, **kw)
    want = complete(cold, prompt, {"method": "draft"}, **kw)
    assert answer(got) == answer(want) and len({tuple(t) for t, _ in answer(got)}) > 1
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    hits = metric(scrape(warm), "specdec:prefix_cache_hits_total") - metric(before, "specdec:prefix_cache_hits_total")
    assert hits == 2 * (len(prompt) - MIN_FRESH)


def test_reset_prefix_cache_empties_the_pool(servers):
    """vLLM's POST /reset_prefix_cache: the next request finds nothing; a server without the cache says so."""
    warm, cold = servers
    prompt = [80, 81] + SYSTEM
    complete(warm, prompt, {"method": "none"})
    assert complete(warm, prompt, {"method": "none"})["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) - MIN_FRESH
    assert httpx.post(f"{warm}/reset_prefix_cache", timeout=30).json() == {"reset": True}
    assert complete(warm, prompt, {"method": "none"})["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert httpx.post(f"{cold}/reset_prefix_cache", timeout=30).json() == {"reset": False}
