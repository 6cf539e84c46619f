"""specdec-serve fuzzed against its own OpenAPI schema with schemathesis, on a real server on 127.0.0.1.

Every operation of /openapi.json gets requests that follow the schema
(positive) and requests that break it (negative), a bounded number each with
a fixed seed. Every response must be one the schema documents (status,
content type, body), every error OpenAI's JSON shape, never a 500; and after
the run the server answers a good request with exactly the output that
request gets alone. The text and number edges (lone surrogates, subnormal and
huge numbers, 64-bit overflow) have their own cases below, as the fuzzer may
not draw them.

Structured outputs and tools run on a second server, the demo pair (whose tokenizer llguidance reads: on the
character tokenizer every constraint stops at "llguidance cannot read this tokenizer"): schemathesis' bodies of both
POST routes get a structured_outputs, response_format or tools field drawn by class (tests/constraint_strategies.py),
and the same checks hold.

The release check runs the same test longer (docs/serving-operations.md#fuzzing-the-server):
    SPECDEC_FUZZ_CASES=2000 pytest tests/serve/test_serve_fuzz.py     # 2000 per operation and mode: 24,000 cases
"""

import json
import os

import httpx
import pytest
import schemathesis
from constraint_strategies import json_schemas, structured_outputs, tools_bodies
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance
from servers import running, served_demo, served_pair

CASES = int(os.environ.get("SPECDEC_FUZZ_CASES", "25"))  # per operation and mode
SEED = int(os.environ.get("SPECDEC_FUZZ_SEED", "20251125"))
GOOD = {"prompt": "def fib(n):", "max_tokens": 12, "temperature": 0, "speculative": {"method": "draft"}}


@pytest.fixture(scope="module")
def server():
    # a short request timeout bounds what a fuzzed request may cost (n=128 x max_tokens); a 504 is documented
    with running(served_pair(), max_request_bytes=256 * 1024, request_timeout=3.0, max_queued_requests=64) as url:
        yield url


def check_error_shape(response) -> None:
    if response.status_code >= 400:
        err = response.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"], response.text
        assert "Traceback" not in response.text


def test_every_operation_fuzzed_against_the_schema(server):
    with httpx.Client(base_url=server, timeout=60) as c:
        before = c.post("/v1/completions", json=GOOD).json()["choices"][0]["token_ids"]
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/completions", "POST /v1/chat/completions", "GET /health"}
    seen: dict[str, set[int]] = {}
    counts: dict[str, int] = {}

    def fuzz(op, mode) -> None:  # one operation in one mode (a function of its own: run() closes over op, not the loop's)
        @seed(SEED)
        @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate], print_blob=True)
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            response = case.call(base_url=server, timeout=60)
            # documented statuses only (503 and 504 are: a full queue, a request past --request_timeout); never a 500
            assert response.status_code != 500, response.text
            case.validate_response(response, checks=[status_code_conformance, content_type_conformance, response_schema_conformance])
            check_error_shape(response)
            seen.setdefault(op.label, set()).add(response.status_code)
            counts[op.label] = counts.get(op.label, 0) + 1

        run()

    for op in operations:
        # a GET (and a POST without a body: /reset_prefix_cache) has nothing to break
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if op.method.upper() == "POST" and len(op.body) else (GenerationMode.POSITIVE,)
        for mode in modes:
            fuzz(op, mode)
    print(f"schemathesis: {sum(counts.values())} cases (seed {SEED}):", counts, {k: sorted(v) for k, v in seen.items()})
    # the fuzzer reached past validation into the engine, and was refused there too
    assert 200 in seen["POST /v1/completions"] and 400 in seen["POST /v1/completions"], seen
    with httpx.Client(base_url=server, timeout=60) as c:
        assert c.get("/health").json() == {"status": "ok"}
        after = c.post("/v1/completions", json=GOOD).json()["choices"][0]["token_ids"]
    assert after == before


@pytest.fixture(scope="module")
def demo_server():
    with running(served_demo(), max_request_bytes=256 * 1024, request_timeout=10.0, max_queued_requests=64) as url:
        yield url


def _constrained(case, extra: dict):
    """A schemathesis case whose JSON body gets a constraint field (bodies that are not objects stay as they are)."""
    if isinstance(case.body, dict):
        # what is a 400 beside the constraint by design (serve/params.py), so that such a body is never served: the other constraint
        # field, and allowed_token_ids
        for name in ("structured_outputs", "response_format", "allowed_token_ids"):
            case.body.pop(name, None)
        case.body.update(extra)
        if "prompt" in case.body:  # a completion's prompt is fuzzed by the test above; here the constraint is, on a prompt that runs
            case.body["prompt"] = "def fib(n):"
        case.body["max_tokens" if "max_completion_tokens" not in case.body else "max_completion_tokens"] = 12  # bounded work per case
    return case


def test_structured_output_and_tool_bodies_fuzzed_against_the_schema(demo_server):
    good = {"model": "demo", "prompt": "def fib(n):", "max_tokens": 12, "temperature": 0}
    with httpx.Client(base_url=demo_server, timeout=60) as c:
        before = c.post("/v1/completions", json=good).json()["choices"][0]["token_ids"]
    schema = schemathesis.openapi.from_url(f"{demo_server}/openapi.json")
    posts = {op.label: op for op in (o.ok() for o in schema.get_all_operations()) if op.method.upper() == "POST"}
    fields = {
        "POST /v1/completions": st.one_of(structured_outputs().map(lambda so: {"structured_outputs": so}),
                                          json_schemas().map(lambda s: {"response_format": {"type": "json_schema",
                                                                                            "json_schema": {"name": "r", "schema": s}}})),
        "POST /v1/chat/completions": st.one_of(tools_bodies(), structured_outputs().map(lambda so: {"structured_outputs": so}),
                                               json_schemas().map(lambda s: {"response_format": {"type": "json_schema",
                                                                                                 "json_schema": {"name": "r", "schema": s}}})),
    }
    seen: dict[str, set[int]] = {}

    def fuzz(label: str, extra) -> None:  # one route (a function of its own: run() closes over label, not the loop's)
        op = posts[label]

        @seed(SEED)
        @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate], print_blob=True)
        @given(case=st.tuples(op.as_strategy(generation_mode=GenerationMode.POSITIVE), extra).map(lambda pair: _constrained(*pair)))
        def run(case):
            response = case.call(base_url=demo_server, timeout=60)
            assert response.status_code < 500 or response.status_code in (503, 504), response.text
            case.validate_response(response, checks=[status_code_conformance, content_type_conformance, response_schema_conformance])
            check_error_shape(response)
            seen.setdefault(label, set()).add(response.status_code)

        run()

    for label, extra in fields.items():
        fuzz(label, extra)
    print("schemathesis with constraints:", {k: sorted(v) for k, v in seen.items()})
    # constraints were refused on both routes, and served (most of schemathesis' completion bodies break some other field)
    assert all(400 in v for v in seen.values()) and any(200 in v for v in seen.values()), seen
    with httpx.Client(base_url=demo_server, timeout=60) as c:
        assert c.post("/v1/completions", json=good).json()["choices"][0]["token_ids"] == before


EDGES = [
    # text at the edges: valid JSON, not Unicode text
    ("completions", b'{"prompt": "\\ud800", "max_tokens": 2}', 400),
    ("completions", b'{"prompt": "ok", "max_tokens": 2, "stop": "\\udc00x"}', 400),
    ("completions", b'{"prompt": "ok", "max_tokens": 2, "logit_bias": {"5": 1}, "user": "\\ud83d"}', 400),
    ("completions", b'{"prompt": "ok", "max_tokens": 2, "structured_outputs": {"choice": ["\\udbff"]}}', 400),
    ("chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}', 400),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "hi", "\\ud800": 1}]}', 400),
    ("completions", b'{"prompt": "\\ud83d\\ude00 ok", "max_tokens": 2, "temperature": 0}', 200),  # a real pair is text
    # numbers at the edges: they parse, and must not break arithmetic downstream
    ("completions", {"prompt": "ok", "max_tokens": 3, "temperature": 5e-324, "seed": 1}, 200),  # subnormal: greedy in effect
    ("completions", {"prompt": "ok", "max_tokens": 3, "temperature": 1e-300, "top_p": 1e-300, "seed": 1}, 200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "temperature": 2.0, "min_p": 1.0, "seed": 1}, 200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "temperature": 1.0, "top_k": 2**31 - 1, "seed": 1}, 200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "seed": -(2**63)}, 200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "seed": 2**63 - 1}, 200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "seed": 2**63}, 400),
    ("completions", {"prompt": "ok", "max_tokens": 2**63 - 1}, 400),
    ("completions", {"prompt": "ok", "max_tokens": 2**64}, 400),
    ("completions", {"prompt": [2**31 - 1], "max_tokens": 2}, 400),
    ("completions", {"prompt": [2**40], "max_tokens": 2}, 400),
    ("completions", {"prompt": "ok", "max_tokens": 3, "logit_bias": {"9999999999": 1}}, 400),
    ("completions", {"prompt": "ok", "max_tokens": 3, "logit_bias": {"5": -100, "6": 100}, "presence_penalty": -2, "frequency_penalty": 2, "seed": 3},
     200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "repetition_penalty": 5e-324, "seed": 3}, 200),
    ("completions", {"prompt": "ok", "max_tokens": 3, "speculative": {"method": "draft", "num_draft_tokens": 1024}}, 400),
    # found by the fuzzer: a subnormal repetition penalty divides a logit into infinity, and NaN is not JSON
    ("completions", {"prompt": "abcabc", "max_tokens": 4, "repetition_penalty": 5e-324, "logprobs": 5, "temperature": 0}, 200),
    ("completions", {"prompt": "abcabc", "max_tokens": 4, "repetition_penalty": 5e-324, "logprobs": 5, "temperature": 1, "seed": 2}, 200),
    ("completions", b'{"prompt": "ok", "max_tokens": 3, "temperature": NaN}', 400),
    ("completions", b'{"prompt": "ok", "max_tokens": 3, "temperature": Infinity}', 400),
    ("completions", b'{"prompt": "ok", "max_tokens": 3, "temperature": 1e400}', 400),
]


@pytest.mark.parametrize("route,body,status", EDGES, ids=lambda x: str(x)[:60] if not isinstance(x, int) else str(x))
def test_text_and_numbers_at_the_edges(server, route, body, status):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server}/v1/{route}", timeout=60, **kw)
    assert r.status_code == status, r.text
    check_error_shape(r)
    if status == 200:
        json.dumps(r.json(), allow_nan=False)  # no NaN or infinity in what the server answers
