"""What a server must survive: bad requests, bad keys, oversize bodies, clients that leave; and /metrics that add up.

Every refusal is OpenAI's error JSON with the right status, never a 500 and
never a traceback, and the server keeps answering afterwards.
"""

import threading
import time

import httpx
import openai
import pytest
from servers import LONG, engines, metric, running, scrape, served_pair, sse_events

from specdec.serve import build_served

LIMIT = 64 * 1024  # the test server's --max_request_bytes


@pytest.fixture(scope="module")
def server():
    with running(served_pair(), max_request_bytes=LIMIT) as url:
        yield url


OK = {"prompt": "def fib(n):", "max_tokens": 4, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
# (name, route, body (dict, or raw bytes), status, param in the error or None)
BATTERY = [
    ("malformed JSON", "completions", b'{"prompt": "x", "max_tokens": ', 400, None),
    ("not an object", "completions", b"[1, 2, 3]", 400, None),
    ("missing prompt", "completions", {"max_tokens": 4}, 400, "prompt"),
    ("prompt of floats", "completions", {**OK, "prompt": [1.5, 2.5]}, 400, "prompt"),
    ("temperature as a string", "completions", {**OK, "temperature": "hot"}, 400, "temperature"),
    ("max_tokens as a string", "completions", {**OK, "max_tokens": "10"}, 400, "max_tokens"),
    ("stream as a string", "completions", {**OK, "stream": "yes"}, 400, "stream"),
    ("temperature out of range", "completions", {**OK, "temperature": 5}, 400, "temperature"),
    ("max_tokens 0 without echo", "completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "completions", {**OK, "max_tokens": -1}, 400, "max_tokens"),
    ("unknown model", "completions", {**OK, "model": "gpt-9"}, 404, "model"),
    ("n over 128", "completions", {**OK, "n": 129}, 400, "n"),
    ("best_of below n", "completions", {**OK, "n": 3, "best_of": 2}, 400, "best_of"),
    ("best_of streamed", "completions", {**OK, "best_of": 2, "stream": True}, 400, "best_of"),
    ("too many sequences", "completions", {**OK, "prompt": ["a"] * 20, "n": 20}, 400, "n"),
    ("logprobs over 20", "completions", {**OK, "logprobs": 21}, 400, "logprobs"),
    ("suffix", "completions", {**OK, "suffix": "x"}, 400, "suffix"),
    ("presence_penalty out of range", "completions", {**OK, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("repetition_penalty 0", "completions", {**OK, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("logit_bias key not a token id", "completions", {**OK, "logit_bias": {"abc": 1}}, 400, "logit_bias.abc"),
    ("logit_bias out of range", "completions", {**OK, "logit_bias": {"5": 101}}, 400, "logit_bias.5"),
    ("logit_bias outside the vocabulary", "completions", {**OK, "logit_bias": {"100000": 1}}, 400, "logit_bias"),
    ("empty token list", "completions", {**OK, "prompt": []}, 400, "prompt"),
    ("an empty prompt among several", "completions", {**OK, "prompt": [[5, 6], []]}, 400, "prompt"),
    ("lone surrogate in the prompt", "completions", b'{"prompt": "ab\\ud800c", "max_tokens": 2}', 400, "prompt"),
    ("lone surrogate in a stop string", "completions", b'{"prompt": "ab", "stop": ["\\udfff"]}', 400, "stop.0"),
    ("lone surrogate in a message", "chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', 400, "messages.0.content"),
    ("nesting too deep", "completions", b'{"prompt": "a", "response_format": ' + b"[" * 100 + b"]" * 100 + b"}", 400, None),
    ("nesting past the parser", "completions", b"[" * 30000 + b"]" * 30000, 400, None),
    ("invalid UTF-8", "completions", b'{"prompt": "\xff\xfe"}', 400, None),
    ("response_format of an unknown type", "completions", {**OK, "response_format": {"type": "yaml"}}, 400, "response_format.type"),
    ("json_schema without a schema", "completions", {**OK, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema"),
    ("a schema llguidance refuses", "completions",
     {**OK, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, 400,
     "response_format.json_schema.schema"),
    ("an invalid regex", "completions", {**OK, "structured_outputs": {"regex": "[a-"}}, 400, "structured_outputs.regex"),
    ("two structured outputs", "completions", {**OK, "structured_outputs": {"regex": "a", "choice": ["b"]}}, 400, "structured_outputs"),
    ("token ids outside the vocabulary", "completions", {**OK, "prompt": [5, 500]}, 400, "prompt"),
    ("prompt longer than max_input_len", "completions", {**OK, "prompt": "x" * 70}, 400, "prompt"),
    ("max_tokens beyond max_seq_len", "completions", {**OK, "max_tokens": 200}, 400, "max_tokens"),
    ("seed beyond 64 bits", "completions", {**OK, "seed": 2**64}, 400, "seed"),
    ("stream_options without stream", "completions", {**OK, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("speculative method not loaded", "completions", {**OK, "speculative": {"method": "medusa"}}, 400, "speculative.method"),
    ("unknown speculative method", "completions", {**OK, "speculative": {"method": "lookahead"}}, 400, "speculative.method"),
    ("num_draft_tokens over max_draft_len", "completions", {**OK, "speculative": {"method": "draft", "num_draft_tokens": 9}}, 400,
     "speculative.num_draft_tokens"),
    ("num_draft_tokens not a number", "completions", {**OK, "speculative": {"num_draft_tokens": "many"}}, 400, "speculative.num_draft_tokens"),
    ("drafts with method none", "completions", {**OK, "speculative": {"method": "none", "num_draft_tokens": 2}}, 400, "speculative.num_draft_tokens"),
    ("speculative typo", "completions", {**OK, "speculative": {"num_draft_token": 2}}, 400, "speculative.num_draft_token"),
    ("speculative not an object", "completions", {**OK, "speculative": "draft"}, 400, "speculative"),
    ("messages missing", "chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("messages empty", "chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("message without role", "chat/completions", {**CHAT, "messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    ("user message without content", "chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, 400, "messages.0"),
    ("role the template refuses", "chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "hi"}]}, 400, "messages"),
    ("role no one knows", "chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
    ("image content", "chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages"),
    ("tools auto, a template without tools", "chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tool_choice"),
    ("tool_choice names no tool", "chat/completions",
     {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
     "tool_choice"),
    ("tool_choice without tools", "chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ("a function name with spaces", "chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f g"}}]}, 400,
     "tools.0.function.name"),
    ("top_logprobs without logprobs", "chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    # vLLM's extensions this server does not implement: refused by name, never dropped without a word
    ("vLLM's guided_json", "completions", {**OK, "guided_json": {"type": "object"}}, 400, "guided_json"),
    ("vLLM's length_penalty", "chat/completions", {**CHAT, "length_penalty": 0.5}, 400, "length_penalty"),
    ("prompt_logprobs past 20", "completions", {**OK, "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("min_tokens beyond max_tokens", "chat/completions", {**CHAT, "min_tokens": 5}, 400, "min_tokens"),
    ("allowed_token_ids outside the vocabulary", "completions", {**OK, "allowed_token_ids": [10**6]}, 400, "allowed_token_ids"),
    ("allowed_token_ids empty", "completions", {**OK, "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("allowed_token_ids beside structured outputs", "completions", {**OK, "allowed_token_ids": [70], "structured_outputs": {"choice": ["a"]}},
     400, "allowed_token_ids"),
    ("bad_words of whitespace only", "completions", {**OK, "bad_words": ["  "]}, 400, "bad_words"),
    ("truncate_prompt_tokens 0", "completions", {**OK, "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
    ("truncate_prompt_tokens past max_input_len", "completions", {**OK, "prompt": "x" * 100, "truncate_prompt_tokens": 80}, 400,
     "truncate_prompt_tokens"),
    ("allowed_token_ids all end ids, held back by min_tokens", "completions", {**OK, "allowed_token_ids": [2], "min_tokens": 2}, 400,
     "allowed_token_ids"),
    ("vLLM's use_beam_search", "completions", {**OK, "use_beam_search": True}, 400, "use_beam_search"),
    ("stop_token_ids outside the vocabulary", "completions", {**OK, "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
    ("chat max_tokens beyond max_seq_len", "chat/completions", {"messages": CHAT["messages"], "max_completion_tokens": 1000}, 400,
     "max_completion_tokens"),
    ("max_tokens and max_completion_tokens differ", "chat/completions", {**CHAT, "max_completion_tokens": 5}, 400, "max_completion_tokens"),
    ("completions: the two limits differ", "completions", {**OK, "max_completion_tokens": 5}, 400, "max_completion_tokens"),
    ("max_completion_tokens beyond max_seq_len", "completions", {"prompt": "x", "max_completion_tokens": 1000}, 400, "max_completion_tokens"),
    ("too many stop strings", "completions", {**OK, "stop": [str(i) for i in range(17)]}, 400, "stop"),
]


def check_error(r: httpx.Response, status: int, param=None) -> dict:
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and "\n" not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


def test_allowed_token_ids_that_are_all_bad_words_are_a_400(server):
    """Checked by GenerationConfig, from two fields together: a 400 naming allowed_token_ids, not a 500."""
    from specdec.formats.tokenizer import Tokenizer

    x = Tokenizer(engines()["target"]).encode("x", add_special_tokens=False)
    with httpx.Client(base_url=server, timeout=30) as c:
        err = check_error(c.post("/v1/completions", json={**OK, "allowed_token_ids": x, "bad_words": ["x"]}), 400, "allowed_token_ids")
        assert "one-token bad word" in err["message"]
        assert c.post("/v1/completions", json=OK).status_code == 200


def test_the_bad_request_battery_then_the_server_still_serves(server):
    with httpx.Client(base_url=server, timeout=30) as c:
        for _name, route, body, status, param in BATTERY:
            kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
            check_error(c.post(f"/v1/{route}", **kw), status, param)
        check_error(c.get("/v1/nothing-here"), 404)
        check_error(c.get("/v1/completions"), 405)
        # oversize bodies: declared, and chunked (no Content-Length)
        big = {**OK, "prompt": "x" * (LIMIT + 10)}
        check_error(c.post("/v1/completions", json=big), 413)
        check_error(c.post("/v1/completions", content=iter([b'{"prompt": "', b"x" * (LIMIT + 10), b'"}'])), 413)
        assert c.get("/health").status_code == 200
        r = c.post("/v1/completions", json=OK)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_clear_messages(server):
    with httpx.Client(base_url=server, timeout=30) as c:
        err = check_error(c.post("/v1/completions", json={**OK, "speculative": {"method": "draft", "num_draft_tokens": 9}}), 400)
        assert "max_draft_len=4" in err["message"]
        err = check_error(c.post("/v1/completions", json={**OK, "max_tokens": 200}), 400)
        assert "maximum context length is 160" in err["message"] and err["code"] == "context_length_exceeded"
        err = check_error(c.post("/v1/completions", json={**OK, "model": "gpt-9"}), 404)
        assert err["code"] == "model_not_found" and "'target'" in err["message"]
        err = check_error(c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "tool", "content": "x"}]}), 400)
        assert "roles must be system, user or assistant" in err["message"]
        # a union's member that matched the type says what is wrong, not the first member ("a valid string")
        err = check_error(c.post("/v1/completions", json={**OK, "stop": [str(i) for i in range(17)]}), 400)
        assert "at most 16 items" in err["message"]
        for bad in ("AUTO", 2.5):  # each member of int | "auto" says what it takes
            err = check_error(c.post("/v1/completions", json={**OK, "speculative": {"num_draft_tokens": bad}}), 400)
            assert "valid integer" in err["message"] and "'auto'" in err["message"], err
        for body in (b"[1, 2]", b'"text"'):  # a body that is not an object, or JSON sent without its content type
            err = check_error(c.post("/v1/completions", content=body, headers={"content-type": "application/json"}), 400)
            assert "must be a JSON object" in err["message"]
        err = check_error(c.post("/v1/completions", content=b'{"prompt": "x"}'), 400)
        assert "Content-Type: application/json" in err["message"]


def test_invalid_bodies_are_400s_the_openai_client_raises_as_bad_requests(server):
    """OpenAI and vLLM answer a body that fails validation with 400: the openai client raises BadRequestError (a 422
    would be its UnprocessableEntityError), and /openapi.json documents no 422."""
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="target", prompt="x", temperature="hot")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="messages.0.role"):
        client.chat.completions.create(model="target", messages=[{"role": "robot", "content": "hi"}])  # type: ignore[list-item]
    schema = httpx.get(f"{server}/openapi.json").json()
    assert all("422" not in op["responses"] for path in schema["paths"].values() for op in path.values())


def test_a_prompt_of_megabytes_is_refused_by_its_length_in_tokens():
    """A one-word prompt of 3 MB (under the default 4 MiB body limit): the refusal says how many tokens it is against
    max_input_len, not that it is not a prompt; the chat route and a token-id prompt too. The server serves on."""
    with running(served_pair()) as url, httpx.Client(base_url=url, timeout=60) as c:
        word = "a" * 3_000_000
        err = check_error(c.post("/v1/completions", json={**OK, "prompt": word}), 400, "prompt")
        assert "3000001 tokens, more than max_input_len=64" in err["message"] and err["code"] == "context_length_exceeded"
        err = check_error(c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": word}]}), 400, "messages")
        assert "tokens, more than max_input_len=64" in err["message"]
        err = check_error(c.post("/v1/completions", json={**OK, "prompt": [5] * 1_500_000}), 400, "prompt")
        assert "1500000 tokens, more than max_input_len=64" in err["message"]
        assert c.post("/v1/completions", json=OK).json()["usage"]["completion_tokens"] == 4


def test_a_method_the_server_did_not_load_and_a_model_without_chat_template():
    plain = build_served(engines()["one-slot"], num_threads=1)
    with running(plain) as url, httpx.Client(base_url=url, timeout=30) as c:
        err = check_error(c.post("/v1/completions", json={**OK, "speculative": {"method": "ngram"}}), 400, "speculative.method")
        assert "not loaded on this server (loaded: none)" in err["message"] and "--ngram_config" in err["message"]
        err = check_error(c.post("/v1/completions", json={**OK, "speculative": {"method": "suffix"}}), 400, "speculative.method")
        assert "not loaded on this server (loaded: none)" in err["message"] and "--suffix_config" in err["message"]
        err = check_error(c.post("/v1/chat/completions", json=CHAT), 400, "messages")
        assert "no chat template" in err["message"]
        assert c.get("/health").status_code == 200


def test_ngram_drafts_past_its_own_max_draft_len_are_refused():
    """The n-gram proposer says its own limit (Proposer.max_draft_len, from --ngram_config), below the target's 4:
    a request asking for more is a 400 naming it, one within it is served."""
    from specdec.formats.config_strings import NGramConfig

    served = build_served(engines()["target"], ngram=NGramConfig(2, 2, [0]), num_threads=1)
    with running(served) as url, httpx.Client(base_url=url, timeout=30) as c:
        err = check_error(c.post("/v1/completions", json={**OK, "speculative": {"method": "ngram", "num_draft_tokens": 3}}), 400,
                          "speculative.num_draft_tokens")
        assert "n-gram pool's max_draft_len=2" in err["message"]
        r = c.post("/v1/completions", json={**OK, "speculative": {"method": "ngram", "num_draft_tokens": 2}})
        assert r.status_code == 200 and r.json()["speculative"]["num_draft_tokens"] == 2


def test_suffix_drafts_past_its_own_max_draft_len_are_refused():
    from specdec.runtime.proposers.suffix import SuffixConfig

    served = build_served(engines()["target"], suffix=SuffixConfig(max_draft_len=2), num_threads=1)
    with running(served) as url, httpx.Client(base_url=url, timeout=30) as c:
        err = check_error(c.post("/v1/completions", json={**OK, "speculative": {"method": "suffix", "num_draft_tokens": 3}}), 400,
                          "speculative.num_draft_tokens")
        assert "suffix decoding's max_draft_len=2 (--suffix_config)" in err["message"]
        r = c.post("/v1/completions", json={**OK, "speculative": {"method": "suffix", "num_draft_tokens": "auto"}})
        assert r.status_code == 200 and r.json()["speculative"]["method"] == "suffix"


def test_api_key(tmp_path):
    with running(served_pair(), api_key="s3cret") as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/health").status_code == 200  # probes need no key
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer s3cret-and-more"}):
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/nowhere")):
                r = c.request(method, path, json=OK, headers=headers)
                err = check_error(r, 401)
                assert err["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/metrics", headers=ok).status_code == 200
        assert c.get("/metrics", headers={"Authorization": "bearer s3cret"}).status_code == 200  # the scheme is case-insensitive (RFC 7235)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        assert client.completions.create(model="target", prompt="hi", max_tokens=3, temperature=0).usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).models.list()


def _wait_for(cond, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_client_that_disconnects_frees_its_slot():
    """One slot. A holds it for up to LONG tokens; B queues; A's client leaves; B is served."""
    long = {"prompt": "def fib(n):", "max_tokens": LONG - 64, "temperature": 0, "ignore_eos": True}
    with running(build_served(engines()["one-slot"], num_threads=1)) as url:
        with httpx.Client(base_url=url, timeout=60) as a:
            with a.stream("POST", "/v1/completions", json={**long, "stream": True}) as r:
                lines = r.iter_lines()
                assert sse_events([next(lines) for _ in range(2)])  # decoding: A holds the slot
                got = {}
                b = threading.Thread(target=lambda: got.update(b=httpx.post(f"{url}/v1/completions", json={**OK, "max_tokens": 6}, timeout=60)))
                b.start()
                assert _wait_for(lambda: metric(scrape(url), "specdec:num_requests_waiting") == 1)  # B is queued behind A
            # the stream is closed: the server aborts A and B gets the slot
        b.join(60)
        assert got["b"].status_code == 200 and got["b"].json()["usage"]["completion_tokens"] == 6
        s = scrape(url)
        assert metric(s, "specdec:request_success_total", finished_reason="abort") == 1
        assert metric(s, "specdec:generation_tokens_total") < long["max_tokens"]  # A was cut short, not finished
        # a non-streaming client that gives up is aborted too
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=long, timeout=0.3)
        assert _wait_for(lambda: metric(scrape(url), "specdec:request_success_total", finished_reason="abort") == 2)
        s = scrape(url)
        assert metric(s, "specdec:num_requests_running") == 0 and metric(s, "specdec:generation_tokens_total") < 2 * long["max_tokens"]
        assert httpx.post(f"{url}/v1/completions", json=OK, timeout=60).status_code == 200


def test_metrics_move_by_exactly_what_the_responses_reported():
    requests = [
        ({"prompt": "abc abc abc abc", "max_tokens": 30, "speculative": {"method": "ngram"}}, False),
        ({"prompt": "def fib(n):", "max_tokens": 25, "speculative": {"method": "draft"}}, False),
        ({"prompt": "def fib(n):", "max_tokens": 20, "speculative": {"method": "draft", "num_draft_tokens": 2}}, True),
        ({"prompt": "Hello", "max_tokens": 12, "speculative": {"method": "none"}}, True),
        ({"prompt": "x = 1", "max_tokens": 16, "speculative": {"method": "draft", "num_draft_tokens": 4}}, False),  # with a stop string
    ]
    with running(served_pair()) as url, httpx.Client(base_url=url, timeout=60) as c:
        text = c.post("/v1/completions", json={**requests[-1][0], "temperature": 0, "ignore_eos": True}).json()["choices"][0]["text"]
        requests[-1][0]["stop"] = text[6:8]  # ends it mid-round, by an abort: still counted as what it reported
        before = scrape(url)
        reports = []
        for body, stream in requests:
            body = {**body, "temperature": 0, "ignore_eos": True}
            if stream:
                with c.stream("POST", "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
                    usage_chunk = sse_events(r.iter_lines())[-2]
                reports.append((usage_chunk["usage"], usage_chunk["speculative"]))
            else:
                r = c.post("/v1/completions", json=body).json()
                reports.append((r["usage"], r["speculative"]))
        after = scrape(url)

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    specs = [s for _, s in reports]
    assert moved("specdec:spec_decode_num_drafts_total") == sum(s["num_drafts"] for s in specs) > 0
    assert moved("specdec:spec_decode_num_draft_tokens_total") == sum(s["drafted"] for s in specs) > 0
    assert moved("specdec:spec_decode_num_accepted_tokens_total") == sum(s["accepted"] for s in specs) > 0
    for pos in range(4):
        assert moved("specdec:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == sum(
            s["accepted_per_position"][pos] for s in specs if len(s["accepted_per_position"]) > pos)
    assert moved("specdec:generation_tokens_total") == sum(u["completion_tokens"] for u, _ in reports)
    assert moved("specdec:prompt_tokens_total") == sum(u["prompt_tokens"] for u, _ in reports)
    assert moved("specdec:request_success_total", finished_reason="length") == 4
    assert moved("specdec:request_success_total", finished_reason="stop") == 1
    for hist in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "request_time_per_output_token_seconds"):
        assert moved(f"specdec:{hist}_count") == len(requests)


def test_an_engine_failure_is_a_500_for_its_requests_and_the_server_goes_on():
    served = served_pair()
    real_step, calls = served.engine.step, []

    def failing_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("an executor failed")  # as an ONNX Runtime or CUDA error would surface
        return real_step()

    served.engine.step = failing_once
    with running(served) as url, httpx.Client(base_url=url, timeout=30) as c:
        err = check_error(c.post("/v1/completions", json=OK), 500)
        assert err["type"] == "server_error" and "server log" in err["message"]
        assert c.get("/health").status_code == 200
        r = c.post("/v1/completions", json=OK)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
