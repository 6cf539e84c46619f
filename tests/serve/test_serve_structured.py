"""Structured outputs and tool calls on the demo pair (a real BPE tokenizer), through the openai client; and chat
logprobs' bytes, which a byte-level tokenizer's pieces of a character need.

The grammar masks the target's logits at every verified position and cuts the
drafts where it forbids a token, for every method: the output always parses
and validates, and greedy constrained output is identical to constrained
target-only output.
"""

import json

import jsonschema_rs
import openai
import pytest
from servers import DEMO, DEMO_TEMPLATE, running, served_demo

from specdec.builder.build import build_engine
from specdec.formats.engine_format import BuildConfig
from specdec.runtime.proposers.suffix import SuffixConfig
from specdec.serve import build_served

METHODS = ["none", "draft", "ngram", "suffix"]
TEMPLATE = DEMO_TEMPLATE
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the forecast", "parameters": WEATHER}},
         {"type": "function",
          "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                                           "required": ["a", "b"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def client():
    with running(served_demo()) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tree_url(tmp_path_factory):
    """The demo target built with tree attention, serving suffix decoding's frequency trees (greedy requests)."""
    d = tmp_path_factory.mktemp("demo-tree")
    build_engine(DEMO / "target", d / "target", BuildConfig(dtype="float32", max_batch_size=4, max_input_len=512, max_seq_len=768, max_draft_len=6,
                                                             speculative_decoding_mode="draft_tokens_external", tree_attention=True),
                 say=lambda _: None)
    (d / "chat.jinja").write_text(TEMPLATE)
    served = build_served(d / "target", num_threads=1, suffix=SuffixConfig(max_draft_len=6), served_model_name="demo", chat_template=d / "chat.jinja")
    assert served.methods == ["none", "suffix"] and served.engine.proposers["suffix"].trees
    with running(served) as url:
        yield url


def chat(client, method, **kw):
    return client.chat.completions.create(model="demo", messages=[{"role": "user", "content": kw.pop("say", "Describe a person as JSON.")}],
                                          max_tokens=kw.pop("max_tokens", 96), temperature=kw.pop("temperature", 0),
                                          extra_body={"speculative": {"method": method}, **kw.pop("extra", {})}, **kw)


def test_json_schema_greedy_is_valid_and_identical_for_every_method(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    texts = []
    for method in METHODS:
        c = chat(client, method, response_format=fmt).choices[0]
        assert c.finish_reason == "stop", c
        jsonschema_rs.validate(PERSON, json.loads(c.message.content))
        texts.append(c.message.content)
    assert texts[1:] == texts[:-1]
    # streamed: the same text
    stream = chat(client, "draft", response_format=fmt, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == texts[0]


@pytest.mark.parametrize("method", METHODS)
def test_sampled_constrained_output_validates(client, method):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for seed in range(3):
        c = chat(client, method, response_format=fmt, temperature=0.9, seed=seed, extra={"presence_penalty": 0.5}).choices[0]
        assert c.finish_reason == "stop"
        jsonschema_rs.validate(PERSON, json.loads(c.message.content))


def test_suffix_trees_are_cut_to_what_the_grammar_allows(tree_url):
    """Greedy constrained output from suffix decoding's trees equals constrained target-only output. The second time
    a request is sent, its first answer (in the global cache) is drafted as a tree: the grammar cuts its forbidden
    branches, the allowed path is accepted."""
    import httpx

    body = {"model": "demo", "prompt": "def f(x):\n    return", "max_tokens": 24, "temperature": 0,
            "structured_outputs": {"regex": r" [0-9]{3}-[a-z]{2,4}|\{\"a\": [0-9]+\}"}}
    want = httpx.post(f"{tree_url}/v1/completions", json={**body, "speculative": {"method": "none"}}, timeout=120).json()
    for _ in range(2):
        got = httpx.post(f"{tree_url}/v1/completions", json={**body, "speculative": {"method": "suffix"}}, timeout=120).json()
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["speculative"]["accepted"] > 0
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    chat_body = {"model": "demo", "messages": [{"role": "user", "content": "Describe a person as JSON."}], "max_tokens": 96, "temperature": 0,
                 "response_format": fmt, "presence_penalty": 0.3, "logit_bias": {"90": 2.0}}
    want = httpx.post(f"{tree_url}/v1/chat/completions", json={**chat_body, "speculative": {"method": "none"}}, timeout=120).json()
    jsonschema_rs.validate(PERSON, json.loads(want["choices"][0]["message"]["content"]))
    for _ in range(2):
        got = httpx.post(f"{tree_url}/v1/chat/completions", json={**chat_body, "speculative": {"method": "suffix"}}, timeout=120).json()
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert got["speculative"]["accepted"] > 0 and max(got["speculative"]["drafted_per_position"]) > 0


def test_regex_choice_and_json_object(client):
    for method in METHODS:
        r = client.completions.create(model="demo", prompt="def f(x):\n    return", max_tokens=20, temperature=0,
                                      extra_body={"speculative": {"method": method}, "structured_outputs": {"regex": r" [0-9]{3}-[a-z]{2,4}"}})
        import re

        assert re.fullmatch(r" [0-9]{3}-[a-z]{2,4}", r.choices[0].text), r.choices[0].text
        r = client.completions.create(model="demo", prompt="x =", max_tokens=10, temperature=0.7, seed=1,
                                      extra_body={"speculative": {"method": method}, "structured_outputs": {"choice": [" True", " False", " None"]}})
        assert r.choices[0].text in (" True", " False", " None")
    c = chat(client, "draft", response_format={"type": "json_object"}, max_tokens=200).choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:  # cut by max_tokens: a valid beginning of an object
        assert c.message.content.startswith("{")


def _args_valid(call):
    tool = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema_rs.validate(tool, json.loads(call.function.arguments))


@pytest.mark.parametrize("method", METHODS)
def test_tool_calls_required_and_named(client, method):
    r = chat(client, method, say="What is the weather in Paris?", tools=TOOLS, tool_choice="required", max_tokens=120)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and c.message.tool_calls
    for call in c.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        _args_valid(call)
    r = chat(client, method, say="Add 2 and 3.", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=60)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add" and r.choices[0].finish_reason == "tool_calls"
    _args_valid(call)


def test_tool_calls_streamed_as_the_client_expects(client):
    kw = dict(say="Add 2 and 3.", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=60)
    whole = chat(client, "draft", **kw).choices[0].message.tool_calls[0]
    calls: dict[int, dict] = {}
    reason = None
    for chunk in chat(client, "draft", stream=True, **kw):
        for c in chunk.choices:
            reason = c.finish_reason or reason
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
    assert reason == "tool_calls" and calls == {0: {"name": "add", "arguments": whole.function.arguments}}


def test_tool_choice_auto_and_a_conversation_with_tool_results(client):
    for method in METHODS:
        r = chat(client, method, say="What is the weather in Paris?", tools=TOOLS, max_tokens=80)
        c = r.choices[0]
        for call in c.message.tool_calls or []:  # the model chooses; a call it makes is valid
            _args_valid(call)
        assert c.message.tool_calls or c.message.content is not None
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model="demo", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0)
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)


def test_logprobs_with_a_grammar_list_only_allowed_tokens(client):
    """Found by the fuzzer's class: a grammar forbids most tokens (-inf), and -inf is not JSON."""
    r = client.completions.create(model="demo", prompt="x =", max_tokens=4, temperature=0, logprobs=20,
                                  extra_body={"structured_outputs": {"choice": [" True", " False"]}})
    c = r.choices[0]
    assert c.text in (" True", " False")
    assert all(len(top) < 20 and all(v > -9999 for v in top.values()) for top in c.logprobs.top_logprobs)


def test_chat_logprob_bytes_are_a_partial_characters_own(client):
    """A token that ends inside a UTF-8 character decodes to U+FFFD; OpenAI's bytes field is there for it: the token's
    own bytes (0xC3 here, the demo vocabulary's 'Ã'), not U+FFFD's three."""
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=1, temperature=0,
                                       logprobs=True, top_logprobs=1, logit_bias={"129": 100})
    (entry,) = r.choices[0].logprobs.content
    assert entry.token == "\ufffd" and entry.bytes == [0xC3]
    assert entry.top_logprobs[0].bytes == [0xC3]


# -- constraints that no string satisfies -----------------------------------------------------------
# A $ref cycle with no way out: every instance holds another ({"x": {"x": ...}}), so none is finite.
ENDLESS = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"], "additionalProperties": False}
NO_STRING = [
    # (what, route, body, the field the 400 names)
    ("a regex that matches nothing", "completions", {"prompt": "x", "structured_outputs": {"regex": "[^\\s\\S]"}}, "structured_outputs.regex"),
    ("a $ref cycle with no finite instance", "completions", {"prompt": "x", "structured_outputs": {"json": ENDLESS}}, "structured_outputs.json"),
    ("the same as a response_format", "chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": ENDLESS}}},
     "response_format.json_schema.schema"),
    ("a Lark grammar that derives no string", "completions", {"prompt": "x", "structured_outputs": {"grammar": 'start: a\na: "x" a'}},
     "structured_outputs.grammar"),
    ("a named tool whose parameters never end", "chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[0].function.parameters"),
    ("the only tool, required", "chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}],
      "tool_choice": "required"}, "tools"),
    ("a schema llguidance finds unsatisfiable", "completions",
     {"prompt": "x", "structured_outputs": {"json": {"type": "integer", "minimum": 5, "maximum": 3}}},
     "structured_outputs.json"),
]


@pytest.mark.parametrize("what,route,body,param", NO_STRING, ids=[c[0] for c in NO_STRING])
def test_a_constraint_no_string_satisfies_is_a_400_naming_it(client, what, route, body, param):
    import httpx

    r = httpx.post(f"{client.base_url}{route}", json={"model": "demo", "max_tokens": 16, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert "\n" not in err["message"] and len(err["message"]) < 600, err["message"]


# One branch is an integer; the other a $ref cycle: llguidance cannot tell up front, and gives up on the output's path
# once the model takes the endless branch (a logit_bias on "{" makes it).
BRANCHES = {"$defs": {"e": {**ENDLESS, "properties": {"x": {"$ref": "#/$defs/e"}}}}, "anyOf": [{"type": "integer"}, {"$ref": "#/$defs/e"}]}


@pytest.mark.parametrize("method", METHODS)
def test_llguidance_giving_up_on_the_outputs_path_is_an_error_finish(client, method):
    import httpx

    url = f"{client.base_url}completions"
    body = {"model": "demo", "prompt": "x = ", "max_tokens": 24, "temperature": 0, "speculative": {"method": method},
            "structured_outputs": {"json": BRANCHES}}
    plain = httpx.post(url, json=body, timeout=120).json()["choices"][0]
    assert plain["finish_reason"] in ("stop", "length") and "error" not in plain  # the integer branch: served as ever
    r = httpx.post(url, json={**body, "logit_bias": {"92": 100}}, timeout=120)  # 92: "{"
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "error" and c["text"].startswith("{"), c
    assert c["error"]["code"] == "grammar_failed" and c["error"]["param"] == "structured_outputs.json"
    assert "llguidance gave up" in c["error"]["message"]
    alone = httpx.post(url, json={**body, "logit_bias": {"92": 100}, "speculative": {"method": "none"}}, timeout=120).json()["choices"][0]
    assert c["token_ids"] == alone["token_ids"]  # drafts change nothing: it ends where target-only decoding ends
    events = []
    with httpx.stream("POST", url, json={**body, "logit_bias": {"92": 100}, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == c["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "error" and events[-1]["choices"][0]["error"] == c["error"]
    assert httpx.post(url, json=body, timeout=120).json()["choices"][0] == plain  # and the server serves on
