"""16 clients at once, mixed prompt lengths, output lengths and speculation settings.

The engine has 4 slots, so requests queue and join the running batch between
rounds. Every response must be complete and equal, token for token, to the
same request decoded alone: nothing mixed up between clients.
"""

import threading

import httpx
from servers import engines, metric, running, scrape, served_pair, sse_events

from specdec.runtime import GenerationConfig, load_orchestrator

SPECS = [{"method": "none"}, {"method": "draft"}, {"method": "draft", "num_draft_tokens": 1}, {"method": "ngram"},
         {"method": "ngram", "num_draft_tokens": "auto"},
         {"method": "suffix"}, {"method": "suffix", "num_draft_tokens": "auto"}]


def _ask(url, body, results, i):
    with httpx.Client(timeout=60) as c:
        if not body.get("stream"):
            results[i] = c.post(f"{url}/v1/completions", json=body).json()
            return
        with c.stream("POST", f"{url}/v1/completions", json=body) as r:
            events = sse_events(r.iter_lines())
        assert events[-1] == "[DONE]"
        chunks = [e for e in events[:-1] if e["choices"]]
        results[i] = {
            "choices": [{"token_ids": [t for e in chunks for t in e["choices"][0]["token_ids"]],
                         "finish_reason": chunks[-1]["choices"][0]["finish_reason"]}],
            "usage": events[-2]["usage"],
        }


def test_sixteen_concurrent_clients_each_get_their_solo_output():
    served = served_pair()
    # token-id prompts of 2..47 tokens (some repetitive, n-gram's case), 4..60 new tokens each
    prompts = [[(7 * i + 3 * j) % 90 + 4 for j in range(2 + (i * 13) % 46)] for i in range(16)]
    prompts[3] = [10, 11, 12] * 8
    lengths = [4 + (i * 11) % 57 for i in range(16)]
    solo = load_orchestrator(engines()["target"])
    want = [solo.generate([p], GenerationConfig(max_output_len=n, end_ids=served.end_ids))[0][0].output_ids
            for p, n in zip(prompts, lengths, strict=True)]
    results: list = [None] * 16
    with running(served) as url:
        bodies = [
            {"prompt": p, "max_tokens": n, "temperature": 0, "speculative": SPECS[i % len(SPECS)], "stream": i % 3 == 0,
             **({"stream_options": {"include_usage": True}} if i % 3 == 0 else {})}
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        ]
        threads = [threading.Thread(target=_ask, args=(url, b, results, i)) for i, b in enumerate(bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads)
        samples = scrape(url)
    got = [r["choices"][0]["token_ids"] for r in results]
    assert got == want
    assert all(r["usage"]["completion_tokens"] == len(w) for r, w in zip(results, want, strict=True))
    ended = sum(v for (name, _), v in samples.items() if name == "specdec:request_success_total")
    assert ended == 16 and metric(samples, "specdec:num_requests_running") == 0 and metric(samples, "specdec:num_requests_waiting") == 0
    assert metric(samples, "specdec:request_queue_time_seconds_count") == 16
