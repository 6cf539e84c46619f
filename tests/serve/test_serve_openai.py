"""specdec-serve over real HTTP: the official openai client and raw SSE, against the runtime's own outputs.

Greedy decoding is deterministic, so every server answer is checked against
specdec-run or Orchestrator.generate on the same engine: the server adds
transport, never a different token.
"""

import json

import httpx
import openai
import pytest
from click.testing import CliRunner
from servers import MAX_DRAFT, engines, running, served_pair, sse_events

from specdec.cli.run import main as run_main
from specdec.runtime import GenerationConfig, load_orchestrator

PROMPTS = ["def fib(n):", "Hello world", "abc abc abc abc", "x = [1, 2, 3]"]
SPECS = [{"method": "none"}, {"method": "draft"}, {"method": "draft", "num_draft_tokens": 2}, {"method": "ngram"},
         {"method": "draft", "num_draft_tokens": "auto"},
         {"method": "suffix"}, {"method": "suffix", "num_draft_tokens": "auto"}]


@pytest.fixture(scope="module")
def server():
    served = served_pair()
    with running(served) as url:
        yield url, served


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """specdec-run's greedy outputs (target-only) for PROMPTS: ids and text."""
    out = tmp_path_factory.mktemp("run") / "out.json"
    args = ["--engine_dir", str(engines()["target"]), "--max_output_len", "24", "--output_json", str(out), "--num_threads", "1"]
    for p in PROMPTS:
        args += ["--input_text", p]
    res = CliRunner().invoke(run_main, args)
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["requests"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['method']}-{s.get('num_draft_tokens', 'default')}")
def test_greedy_completions_equal_specdec_run(client, reference, spec):
    drafted = 0
    for prompt, ref in zip(PROMPTS, reference, strict=True):
        r = client.completions.create(model="target", prompt=prompt, max_tokens=24, temperature=0, extra_body={"speculative": spec})
        choice = r.choices[0]
        assert choice.text == ref["text"] and choice.model_extra["token_ids"] == ref["output_ids"]
        assert choice.finish_reason == ("stop" if ref["finish_reason"] == "end_id" else "length")
        assert r.usage.prompt_tokens == len(ref["input_ids"]) and r.usage.completion_tokens == len(ref["output_ids"])
        sp = r.model_extra["speculative"]
        assert sp["method"] == spec["method"]
        if spec["method"] == "none":
            assert sp["drafted"] == 0 and sp["num_drafts"] == 0
        if spec.get("num_draft_tokens") == 2:
            assert len(sp["drafted_per_position"]) <= 2  # its own draft length, not the server's 3
        assert sp["accepted"] == sum(sp["accepted_per_position"]) and sp["drafted"] == sum(sp["drafted_per_position"])
        drafted += sp["drafted"]
    assert (drafted > 0) == (spec["method"] != "none")  # every method drafted somewhere (suffix: "abc abc abc abc")


def test_token_id_prompts(client, server):
    served = server[1]
    ids = served.tokenizer.encode("def fib(n):")
    ref, _ = load_orchestrator(engines()["target"]).generate([ids], GenerationConfig(max_output_len=20, end_ids=served.end_ids))
    for prompt in (ids, [ids]):
        r = client.completions.create(model="target", prompt=prompt, max_tokens=20, temperature=0)
        assert r.choices[0].model_extra["token_ids"] == ref[0].output_ids
        assert r.choices[0].text == served.tokenizer.decode(ref[0].output_ids)


def test_streaming_sends_one_chunk_per_round_and_the_same_text(server):
    url, _ = server
    body = {"prompt": "abc abc abc abc", "max_tokens": 40, "temperature": 0, "ignore_eos": True, "speculative": {"method": "ngram"}}
    whole = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]  # the usage chunk: empty choices
    assert usage["speculative"]["drafted"] == whole["speculative"]["drafted"] and usage["speculative"]["accepted"] > 0
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["choices"][0]["token_ids"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    # the prompt's first token, then one chunk per verification round; some rounds accepted drafts
    assert len(chunks) == 1 + usage["speculative"]["rounds"]
    assert max(len(c["choices"][0]["token_ids"]) for c in chunks) > 1


def test_openai_client_streams_with_usage(client):
    full = client.completions.create(model="target", prompt="x = [1, 2, 3]", max_tokens=16, temperature=0)
    stream = client.completions.create(model="target", prompt="x = [1, 2, 3]", max_tokens=16, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_stop_strings_cut_the_text_before_the_stop(client):
    full = client.completions.create(model="target", prompt="def fib(n):", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text[12:15]
    cut = text[: text.find(stop)]
    for method in ("none", "draft"):
        r = client.completions.create(model="target", prompt="def fib(n):", max_tokens=40, temperature=0, stop=[stop, "@@never@@"],
                                      extra_body={"ignore_eos": True, "speculative": {"method": method}})
        assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens < full.usage.completion_tokens
        chunks = list(client.completions.create(model="target", prompt="def fib(n):", max_tokens=40, temperature=0, stop=stop, stream=True,
                                                extra_body={"ignore_eos": True, "speculative": {"method": method}}))
        streamed = [c.choices[0].text for c in chunks]
        assert "".join(streamed) == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_chat_uses_the_checkpoints_template_as_transformers_renders_it(client, server):
    from transformers import PreTrainedTokenizerFast

    served = server[1]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write fib in Python."}]
    hf = PreTrainedTokenizerFast.from_pretrained(engines()["target-ckpt"])
    ids = list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    ref, _ = load_orchestrator(engines()["target"]).generate([ids], GenerationConfig(max_output_len=24, end_ids=served.end_ids))
    for spec in ({"method": "none"}, {"method": "draft"}):
        r = client.chat.completions.create(model="target", messages=messages, max_tokens=24, temperature=0, extra_body={"speculative": spec})
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].model_extra["token_ids"] == ref[0].output_ids
        assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == served.tokenizer.decode(ref[0].output_ids)
    chunks = list(client.chat.completions.create(model="target", messages=messages, max_completion_tokens=24, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    parts = [{"role": "user", "content": [{"type": "text", "text": "Write fib "}, {"type": "text", "text": "in Python."}]}]
    r2 = client.chat.completions.create(model="target", messages=[messages[0], *parts], max_tokens=24, temperature=0)
    assert r2.choices[0].message.content == r.choices[0].message.content  # text parts are joined


def test_vllms_chat_template_fields_render_as_transformers_renders_them(client, server):
    """chat_template_kwargs (Qwen3's enable_thinking, say), add_generation_prompt and continue_final_message: the prompt
    is the one transformers' apply_chat_template makes with the same arguments."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(engines()["target-ckpt"])
    user = [{"role": "user", "content": "Write fib in Python."}]
    started = [*user, {"role": "assistant", "content": "def fib(n):"}]
    cases = [
        (user, {"chat_template_kwargs": {"enable_thinking": False}}, dict(add_generation_prompt=True, enable_thinking=False)),
        (user, {}, dict(add_generation_prompt=True)),
        (started, {"add_generation_prompt": False}, dict(add_generation_prompt=False)),
        (started, {"add_generation_prompt": False, "continue_final_message": True}, dict(continue_final_message=True)),
    ]
    counts = []
    for messages, fields, hf_kw in cases:
        ids = list(hf.apply_chat_template(messages, tokenize=True, return_dict=True, **hf_kw)["input_ids"])
        r = client.chat.completions.create(model="target", messages=messages, max_tokens=4, temperature=0, extra_body=fields)
        assert r.usage.prompt_tokens == len(ids), (fields, hf.decode(ids))
        counts.append(len(ids))
    assert counts[0] != counts[1] and counts[2] != counts[3]  # the fields changed the prompt
    # the ids themselves, where the final message's text (trimmed by the template) also appears in an earlier turn
    echoing = [{"role": "user", "content": "Answer: fib"}, {"role": "assistant", "content": "Answer: "}]
    want = list(hf.apply_chat_template(echoing, tokenize=True, return_dict=True, continue_final_message=True)["input_ids"])
    with httpx.Client(base_url=server[0], timeout=30) as c:
        got = c.post("/tokenize", json={"messages": echoing, "add_generation_prompt": False, "continue_final_message": True}).json()["tokens"]
    assert got == want and hf.decode(got).endswith("assistant: Answer:")
    for fields, param in (({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
                          ({"continue_final_message": True}, "continue_final_message")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="target", messages=started, max_tokens=4, extra_body=fields)
        assert err.value.body["param"] == param


def test_vllms_tokenize_and_detokenize_routes(client, server):
    """/tokenize gives the ids the generation routes read (a prompt, or a conversation through the template, its fields
    included); /detokenize gives their text back."""
    url, _ = server
    messages = [{"role": "user", "content": "Write fib in Python."}]
    with httpx.Client(base_url=url, timeout=30) as c:
        t = c.post("/tokenize", json={"model": "target", "prompt": "def fib(n):", "return_token_strs": True}).json()
        done = client.completions.create(model="target", prompt="def fib(n):", max_tokens=1, temperature=0)
        assert t["count"] == len(t["tokens"]) == done.usage.prompt_tokens == len(t["token_strs"]) and t["max_model_len"] == 160
        assert c.post("/detokenize", json={"tokens": t["tokens"]}).json() == {"prompt": "<s>def fib(n):"}  # special tokens kept, as vLLM's
        counts = []
        for fields in ({}, {"chat_template_kwargs": {"enable_thinking": False}}):
            chat = c.post("/tokenize", json={"messages": messages, **fields}).json()
            r = client.chat.completions.create(model="target", messages=messages, max_tokens=1, temperature=0, extra_body=fields)
            assert chat["count"] == r.usage.prompt_tokens and chat["token_strs"] is None
            counts.append(chat["count"])
        assert counts[0] != counts[1]
        # a conversation's body is read as one: its sampling fields are not /tokenize's (ignored, as unknown fields are)
        assert c.post("/tokenize", json={"messages": messages, "temperature": "hot"}).json()["count"] == counts[0]
        r = c.post("/tokenize", json=["not", "an", "object"])
        assert r.status_code == 400 and "must be a JSON object" in r.json()["error"]["message"]
        for route, body, status, param in (("/detokenize", {"tokens": [10**6]}, 400, "tokens"), ("/tokenize", {"prompt": 5}, 400, "prompt"),
                                           ("/tokenize", {}, 400, "prompt"), ("/tokenize", {"prompt": "x", "add_special_tokens": "no"}, 400,
                                                                               "add_special_tokens"),
                                           ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model")):
            r = c.post(route, json=body)
            assert r.status_code == status and (param is None or r.json()["error"]["param"] == param), r.text


def test_seeded_sampling_is_reproducible(client):
    def ask(seed, method):
        r = client.completions.create(model="target", prompt="Hello world", max_tokens=20, temperature=0.9, top_p=0.95, seed=seed,
                                      extra_body={"speculative": {"method": method}, "ignore_eos": True})
        return r.choices[0].model_extra["token_ids"]

    for method in ("none", "draft"):
        assert ask(7, method) == ask(7, method)
    assert len({tuple(ask(s, "none")) for s in (1, 2, 3)}) > 1


def test_models_version_health(client, server):
    url, served = server
    models = client.models.list()
    assert [m.id for m in models.data] == ["target"]
    card = models.data[0].model_extra
    assert card["max_model_len"] == httpx.get(f"{url}/version").json()["max_seq_len"] and 0 < card["max_input_len"] <= card["max_model_len"]
    v = httpx.get(f"{url}/version").json()
    assert v["speculative_methods"] == ["none", "draft", "ngram", "suffix"] and v["max_draft_len"] == MAX_DRAFT and v["max_batch_size"] == 4
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_a_template_that_a_clients_variables_overflow_is_a_400():
    """chat_template_kwargs reach the template: what they make it raise (here the sandbox's "range too big") is the
    client's 400, never a 500."""
    from specdec.serve.chat import render_chat
    from specdec.serve.errors import ApiError

    template = "{% for i in range(n) %}x{% endfor %}{{ messages[0]['content'] }}"
    assert render_chat(template, [{"role": "user", "content": "hi"}], {}, n=2) == "xxhi"
    for n in (10**9, 10**30):
        with pytest.raises(ApiError) as err:
            render_chat(template, [{"role": "user", "content": "hi"}], {}, n=n)
        assert err.value.status == 400
