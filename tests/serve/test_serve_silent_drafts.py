"""specdec-serve with a draft that never lands (issue 27's silent pair): a real server on 127.0.0.1 whose draft's LM
head is rolled by one row, so it always proposes the token after the target's choice. Both share one tokenizer.json:
no tokenizer check can see that its ids mean something else. The runtime notices after SILENT_DRAFT_ROUNDS drafting
rounds with nothing accepted (runtime/guards.py); the server counts it in /metrics, logs it once per request, and
reports it in the response's ``speculative`` block, while the text stays exactly target-only's.
"""

import logging
import shutil

import httpx
import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import spec_build
from safetensors.numpy import load_file, save_file
from servers import char_tokenizer, metric, running, scrape, sse_events

from specdec.builder.build import build_engine
from specdec.formats.config_strings import DraftTargetConfig
from specdec.runtime.guards import SILENT_DRAFT_ROUNDS
from specdec.serve import build_served

COUNTER = "specdec:spec_decode_silent_drafts_total"
LONG = SILENT_DRAFT_ROUNDS + 16  # tokens: each round of a never-accepting draft emits one, so the 48th drafting round comes
SHORT = SILENT_DRAFT_ROUNDS // 2


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve_silent")
    ckpt = make_checkpoint(d / "ckpt", tie_word_embeddings=False)
    char_tokenizer(ckpt, None)
    shutil.copytree(ckpt, d / "rolled")
    tensors = load_file(d / "rolled" / "model.safetensors")
    tensors["lm_head.weight"] = np.roll(tensors["lm_head.weight"], 1, axis=0)  # row t scores what the target scores t - 1
    save_file(tensors, d / "rolled" / "model.safetensors", metadata={"format": "pt"})
    limits = dict(max_batch_size=2, max_input_len=32, max_seq_len=128)
    build_engine(ckpt, d / "target", spec_build(4, **limits), say=lambda _: None)
    build_engine(d / "rolled", d / "draft", spec_build(0, **limits), say=lambda _: None)
    served = build_served(d / "target", d / "draft", DraftTargetConfig(3, [0], [0], False), num_threads=1)
    with running(served) as base:
        yield base


def complete(url, max_tokens, method="draft", **kw):
    body = {"prompt": "def fib(n):", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "speculative": {"method": method}, **kw}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def silent_lines(caplog) -> list[logging.LogRecord]:
    return [rec for rec in caplog.records if rec.name == "specdec.serve" and "rejected every" in rec.getMessage()]


def test_a_draft_that_never_lands_is_counted_logged_once_and_decodes_as_target_only(url, caplog):
    caplog.set_level(logging.WARNING, logger="specdec.serve")
    alone = complete(url, LONG, method="none")
    before = metric(scrape(url), COUNTER)
    out = complete(url, LONG)
    spec = out["speculative"]
    assert spec["accepted"] == 0 and spec["drafted"] >= 3 * SILENT_DRAFT_ROUNDS  # it drafted all along: nothing landed
    assert spec["silent_drafts"] == 1
    assert out["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]  # still exactly target-only's
    assert metric(scrape(url), COUNTER) == before + 1
    lines = silent_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert f"request {out['id']}-0 (speculative method draft, 3 draft tokens)" in message
    assert f"the target rejected every draft-model draft of the last {SILENT_DRAFT_ROUNDS} drafting rounds" in message


def test_streamed_and_with_several_choices_each_request_is_said_once(url, caplog):
    caplog.set_level(logging.WARNING, logger="specdec.serve")
    before = metric(scrape(url), COUNTER)
    with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={
            "prompt": "x = 1", "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "n": 2, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        chunks = sse_events(r.iter_lines())
    assert r.status_code == 200 and chunks[-1] == "[DONE]"
    assert chunks[-2]["speculative"]["silent_drafts"] == 2  # the usage chunk: both choices' drafts never landed
    assert metric(scrape(url), COUNTER) == before + 2
    assert len(silent_lines(caplog)) == 2 and len({rec.getMessage().split(" ")[1] for rec in silent_lines(caplog)}) == 2  # one per choice


def test_short_requests_and_target_only_are_not_reported(url, caplog):
    caplog.set_level(logging.WARNING, logger="specdec.serve")
    before = metric(scrape(url), COUNTER)
    short = complete(url, SHORT)  # fewer drafting rounds than the window: chance is not ruled out yet
    plain = complete(url, LONG, method="none")
    assert short["speculative"]["accepted"] == 0 and short["speculative"]["silent_drafts"] == 0
    assert plain["speculative"]["silent_drafts"] == 0
    assert metric(scrape(url), COUNTER) == before and not silent_lines(caplog)
