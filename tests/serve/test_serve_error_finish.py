"""A request the runtime stops with finish_reason "error" is served as one: never a 200 "stop" with empty text.

A real engine built (--allow_nonfinite) from a checkpoint whose embedding row of one token is NaN: a prompt holding
that token has NaN logits from its prefill on. Its choice ends with finish_reason "error" and an OpenAI-shaped
error object (code nonfinite_logits), streamed or not; /metrics counts it; the server's log names it once; the
other choices of the request and the next requests are served as if it never happened.
"""

from __future__ import annotations

import logging
import shutil

import httpx
import numpy as np
import pytest
from checkpoints import add_word_tokenizer, make_checkpoint
from safetensors.numpy import load_file, save_file
from servers import metric, running, scrape, sse_events

from specdec.builder.build import build_engine
from specdec.formats.engine_format import BuildConfig
from specdec.serve import build_served

POISON = 50  # the token whose embedding is NaN
CLEAN = [1, 40, 41, 42, 43]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    d = tmp_path_factory.mktemp("nonfinite")
    ckpt = add_word_tokenizer(make_checkpoint(d / "ckpt", tie_word_embeddings=False))
    nan = d / "ckpt-nan"
    shutil.copytree(ckpt, nan)
    tensors = load_file(nan / "model.safetensors")
    tensors["model.embed_tokens.weight"][POISON] = np.nan
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="non-finite"):
        build_engine(nan, d / "engine", BuildConfig(max_batch_size=4, max_input_len=16, max_seq_len=64), say=lambda _: None, allow_nonfinite=True)
    with running(build_served(d / "engine", num_threads=1)) as base:
        yield base


def post(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"max_tokens": 6, "temperature": 0, **body}, timeout=60)


def test_nonfinite_logits_end_the_choice_with_an_error_the_client_sees(url, caplog):
    solo = post(url, prompt=CLEAN).json()["choices"][0]
    assert solo["finish_reason"] == "length" and "error" not in solo
    before = scrape(url)
    with caplog.at_level(logging.WARNING, logger="specdec.serve"):
        r = post(url, prompt=[CLEAN, [1, 40, POISON, 42]])
    assert r.status_code == 200, r.text
    good, bad = r.json()["choices"]
    assert good == solo | {"index": 0}  # the other prompt of the request: untouched
    assert bad["finish_reason"] == "error" and bad["token_ids"] == [] and bad["text"] == ""
    assert bad["error"]["code"] == "nonfinite_logits" and bad["error"]["type"] == "server_error"
    assert "not finite" in bad["error"]["message"] and "\n" not in bad["error"]["message"]
    assert r.json()["usage"]["completion_tokens"] == len(solo["token_ids"])
    after = scrape(url)
    assert metric(after, "specdec:request_success_total", finished_reason="error") == metric(before, "specdec:request_success_total",
                                                                                             finished_reason="error") + 1
    assert metric(after, "specdec:request_errors_total", code="nonfinite_logits") == metric(before, "specdec:request_errors_total",
                                                                                            code="nonfinite_logits") + 1
    assert sum("not finite" in rec.getMessage() for rec in caplog.records) == 1
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert post(url, prompt=CLEAN).json()["choices"][0] == solo  # the server serves on, with the same output


def test_streamed_the_last_chunk_carries_the_error(url):
    with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": [1, POISON], "max_tokens": 6, "temperature": 0, "stream": True},
                      timeout=60) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    last = events[-2]["choices"][0]
    assert last["finish_reason"] == "error" and last["error"]["code"] == "nonfinite_logits"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_echoed_scores_of_nonfinite_rows_are_json(url, max_tokens):
    """The prompt's rows from the poisoned token on are NaN (and, in the same call, those before it: masked attention
    multiplies the NaN values by zero weights, runtime/guards.py): the tokens they score get no score (null, as the
    first token), never NaN, which is not JSON; the choice ends with its error, max_tokens 0 too."""
    r = post(url, prompt=[1, 40, POISON, 42], echo=True, logprobs=3, max_tokens=max_tokens)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "error" and c["error"]["code"] == "nonfinite_logits" and c["token_ids"] == []
    import json

    json.dumps(r.json(), allow_nan=False)
    scores = c["logprobs"]["token_logprobs"]
    assert scores[0] is None and scores[3] is None and all(v is None or v <= 0 for v in scores), scores  # row 2 (after the poison) is NaN
