"""Streamed and non-streamed completions agree, whatever the fields: echo, max_tokens at the edges, n, logprobs,
several prompts as text or token ids, stop strings (tests/fuzzing.py says how the fuzz tests run).

Property: the stream's chunks joined per choice equal the non-streamed choice (text, token ids, logprobs with their
offsets, finish reason) and its usage chunk the non-streamed usage; usage counts the tokens returned (none with
max_tokens 0); echo puts each prompt as sent before its completion; or both are the same one-line 400.
"""

from __future__ import annotations

import httpx
import pytest
from fuzzing import any_text, edge_ints, fuzz_settings
from hypothesis import event, given, strategies as st
from servers import join_choices, running, served_pair, sse_events

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def url():
    with running(served_pair()) as base:
        yield base


def joined(events: list) -> tuple[list[dict], dict | None]:
    chunks = [e for e in events if e != "[DONE]"]
    usage = None
    for e in chunks:
        assert "error" not in e, e
        if e.get("usage"):
            usage = e["usage"]
    return join_choices(chunks), usage


prompt_texts = st.one_of(st.sampled_from(["abc abc", "def f(x):", "x", " "]),
                         st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=12),
                         any_text(12))  # text at the edges: controls, non-ASCII (outside this tokenizer), lone surrogates
prompts = st.one_of(prompt_texts, st.lists(st.integers(4, 99), min_size=1, max_size=6), st.lists(prompt_texts, min_size=1, max_size=3),
                    st.lists(st.lists(st.integers(4, 99), min_size=1, max_size=5), min_size=1, max_size=3))


@fuzz_settings(20)
@given(prompt=prompts, max_tokens=st.one_of(*[st.sampled_from([0, 1, 2, 5, 9])] * 3, edge_ints()), n=st.integers(1, 3), echo=st.booleans(),
       logprobs=st.sampled_from([None, 0, 2]),
       stop=st.sampled_from([None, "a", ["b", "\n"]]), method=st.sampled_from(["none", "draft", "ngram"]))
def test_streamed_and_not_agree_and_usage_counts_what_was_returned(url, prompt, max_tokens, n, echo, logprobs, stop, method):
    body = {"prompt": prompt, "max_tokens": max_tokens, "n": n, "echo": echo, "temperature": 0, "speculative": {"method": method}}
    if logprobs is not None:
        body["logprobs"] = logprobs
    if stop is not None:
        body["stop"] = stop
    whole = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=60) as r:
        status = r.status_code
        events = sse_events(r.iter_lines()) if status == 200 else None
        if status != 200:
            r.read()
            streamed_error = r.json()
    assert whole.status_code == status, (whole.text, status)
    event(f"status {status}")
    if status != 200:
        assert status == 400 and whole.json() == streamed_error and "\n" not in whole.json()["error"]["message"]
        event("400: " + whole.json()["error"]["message"][:40])
        return
    streamed, usage = joined(events)
    got = whole.json()
    keys = ("index", "text", "token_ids", "finish_reason", "logprobs")
    assert [{k: c[k] for k in keys} for c in got["choices"]] == streamed
    assert usage == got["usage"] and got["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in got["choices"])
    sent = prompt if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else [prompt]
    for c in got["choices"]:
        assert 0 <= len(c["token_ids"]) <= max_tokens  # (a max_tokens past the context is a 400, above)
        if max_tokens == 0:
            assert c["token_ids"] == [] and c["finish_reason"] == "length"
        p = sent[c["index"] // n]
        if echo and isinstance(p, str):
            assert c["text"].startswith(p)
