"""Structured outputs and tools fuzzed through a real server on the demo pair (whose tokenizer llguidance reads).

Property, for any constraint drawn by class (tests/constraint_strategies.py) on either route and any method:
a 400 whose one-line message names the constraint's field, or a 200 whose every choice is honest: "stop" only
with text that satisfies the constraint (checked apart from llguidance: jsonschema_rs, Python's re, the choice
list), "error" with an error object, "length" with text; never a 5xx, never NaN in the JSON. After the run the
server answers a good request with exactly its output alone. The same bodies also go through schemathesis
(test_serve_fuzz.py) for the response schema.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema_rs
import pytest
from constraint_strategies import json_schemas, structured_outputs, tools_bodies
from fuzzing import fuzz_settings, no_hang
from hypothesis import event, given, strategies as st
from servers import running, served_demo

pytestmark = pytest.mark.fuzz
GOOD = {"model": "demo", "prompt": "def fib(n):", "max_tokens": 12, "temperature": 0}
FIELDS = {"json": "structured_outputs.json", "regex": "structured_outputs.regex", "choice": "structured_outputs.choice",
          "grammar": "structured_outputs.grammar"}


@pytest.fixture(scope="module")
def url():
    with running(served_demo(), request_timeout=30.0) as base:
        yield base


@pytest.fixture(scope="module")
def solo(url):
    return httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60).json()["choices"][0]["token_ids"]


def satisfies(constraint: dict, text: str) -> bool | None:
    """Whether ``text`` satisfies the constraint, by a checker that is not llguidance; None where none can tell."""
    kind, value = next(iter(constraint.items()))
    if kind == "choice":
        return text in value
    if kind == "regex":
        try:
            return re.fullmatch(value, text) is not None
        except (re.error, RecursionError, OverflowError):
            return None  # a dialect Python's re does not read
    if kind == "json":
        try:
            instance = json.loads(text)
        except ValueError:
            return False
        try:
            return jsonschema_rs.validator_for(value).is_valid(instance)
        except Exception:  # a schema jsonschema_rs does not take (llguidance took it): no second opinion
            return None
    return None  # Lark: no checker but llguidance's own


def check(r: httpx.Response, field: str | None, constraint: dict | None) -> None:
    assert r.status_code in (200, 400), (r.status_code, r.text[:500])
    body = r.json()
    json.dumps(body, allow_nan=False)
    if r.status_code == 400:
        err = body["error"]
        assert err["message"] and "\n" not in err["message"] and len(err["message"]) <= 1000, err
        assert field is None or err["param"] is None or err["param"].startswith(field.split(".")[0]), err
        event("400")
        return
    for c in body["choices"]:
        reason = c["finish_reason"]
        event(f"200 {reason}")
        text = c["text"] if "text" in c else (c["message"]["content"] or "")
        assert reason in ("stop", "length", "error", "tool_calls"), c
        if reason == "error":
            assert c["error"]["message"] and c["error"]["code"] in ("grammar_failed", "nonfinite_logits"), c
        if reason == "stop" and constraint is not None:
            ok = satisfies(constraint, text)
            assert ok is not False, f"a 'stop' whose text does not satisfy {constraint!r}: {text!r}"


@fuzz_settings(20)
@given(so=structured_outputs(), method=st.sampled_from(["none", "draft", "ngram"]), n=st.integers(1, 2))
def test_completions_with_any_structured_output_are_honest(url, solo, so, method, n):
    body = {**GOOD, "prompt": "x = ", "max_tokens": 16, "n": n, "speculative": {"method": method}, "structured_outputs": so}
    with no_hang(120, so):
        check(httpx.post(f"{url}/v1/completions", json=body, timeout=120), FIELDS[next(iter(so))], so)
    assert httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60).json()["choices"][0]["token_ids"] == solo


@fuzz_settings(15)
@given(schema=json_schemas(), tools=tools_bodies(), use_tools=st.booleans(), stream=st.booleans())
def test_chat_with_any_response_format_or_tools_is_honest(url, solo, schema, tools, use_tools, stream):
    body = {"model": "demo", "messages": [{"role": "user", "content": "Answer as JSON."}], "max_tokens": 16, "temperature": 0}
    if use_tools:
        body.update(tools)
        field, constraint = "tools", None
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        field, constraint = "response_format", ({"json": schema} if isinstance(schema, dict) else None)
    with no_hang(120, body):
        if not stream:
            check(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120), field, constraint)
        else:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            assert r.status_code in (200, 400), r.status_code
            if r.status_code == 200:
                assert lines and lines[-1] == "data: [DONE]"
                events = [json.loads(line[6:]) for line in lines[:-1]]
                assert all("error" not in e or e["error"]["code"] for e in events)  # a job's error event, if any, is OpenAI's shape
                ends = [c for e in events for c in e.get("choices", []) if c["finish_reason"]]
                assert ends and all(c["finish_reason"] in ("stop", "length", "error", "tool_calls") for c in ends)
                assert all(c["finish_reason"] != "error" or c["error"]["code"] for c in ends)
    assert httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60).json()["choices"][0]["token_ids"] == solo
