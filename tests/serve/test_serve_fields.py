"""Every sampling field through the official openai client, streaming and not, for every loaded method.

Greedy answers must be identical whatever the method, and log-probabilities
the same to float tolerance: speculation changes how fast, never what.
"""

import math

import httpx
import openai
import pytest
from servers import join_choices, running, served_pair, sse_events

METHODS = [{"method": "none"}, {"method": "draft"}, {"method": "ngram"}, {"method": "draft", "num_draft_tokens": "auto"}, {"method": "suffix"},
           {"method": "suffix", "num_draft_tokens": "auto"}]
IDS = ["none", "draft", "ngram", "auto", "suffix", "suffix-auto"]
PROMPT = "abc abc abc abc"
PENALTIES = {"presence_penalty": 0.5, "frequency_penalty": 0.4, "repetition_penalty": 1.3, "logit_bias": {"70": 3.0, "69": -5.0}}


@pytest.fixture(scope="module")
def server():
    with running(served_pair()) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def complete(client, spec, **kw):
    return client.completions.create(model="target", prompt=PROMPT, max_tokens=16, temperature=0,
                                     extra_body={"speculative": spec, "ignore_eos": True, **kw.pop("extra", {})}, **kw)


def test_logprobs_are_the_targets_for_every_method(client):
    base = complete(client, METHODS[0], logprobs=3, extra=PENALTIES).choices[0]
    lp = base.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 16
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 3 for t in lp.top_logprobs)
    # greedy: the chosen token is the most likely one after processing
    assert all(math.isclose(max(top.values()), v, abs_tol=1e-6) for top, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True))
    for spec in METHODS[1:]:
        c = complete(client, spec, logprobs=3, extra=PENALTIES).choices[0]
        assert c.text == base.text
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(c.logprobs.token_logprobs, lp.token_logprobs, strict=True))
        assert [sorted(t) for t in c.logprobs.top_logprobs] == [sorted(t) for t in lp.top_logprobs]


@pytest.mark.parametrize("spec", METHODS, ids=IDS)
def test_penalties_and_bias_keep_greedy_output_identical(client, spec):
    want = complete(client, METHODS[0], extra=PENALTIES).choices[0].model_extra["token_ids"]
    plain = complete(client, METHODS[0]).choices[0].model_extra["token_ids"]
    assert want != plain  # the settings change the output
    got = complete(client, spec, extra={**PENALTIES, "min_p": 0.1, "top_k": 5}).choices[0].model_extra["token_ids"]
    assert got == want


def test_sampled_top_logprobs_hold_the_sampled_token(client):
    """OpenAI's legacy completions: 'the logprob of the sampled token' always, so up to logprobs + 1 entries (a sampled
    token outside the top ones was left out; logprobs 0 gave empty dicts)."""
    for n in (0, 2):
        c = client.completions.create(model="target", prompt=PROMPT, max_tokens=12, temperature=2.0, seed=5, logprobs=n,
                                      extra_body={"ignore_eos": True}).choices[0]
        lp = c.logprobs
        assert all(n <= len(top) <= n + 1 for top in lp.top_logprobs)
        assert all(top[t] == v for top, t, v in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs, strict=True))
    assert any(len(top) == 3 for top in lp.top_logprobs)  # at temperature 2 some sampled token was not among the top 2


@pytest.mark.parametrize("spec", METHODS, ids=IDS)
def test_a_seeded_sample_by_token_compare_is_target_onlys(client, spec):
    """Every method here verifies by token compare (draft-target without use_logits, n-gram, suffix; auto): a seeded
    sampled request gives target-only's tokens for that seed (the target draws each position with its own number), with
    n > 1 too; a seed of -1 (vLLM's "random") draws a fresh seed each time."""
    def tokens(s, seed):
        r = client.completions.create(model="target", prompt=PROMPT, max_tokens=16, temperature=0.8, top_p=0.9, seed=seed, n=2,
                                      extra_body={"speculative": s, "ignore_eos": True})
        return [c.model_extra["token_ids"] for c in sorted(r.choices, key=lambda c: c.index)]

    want = tokens(METHODS[0], 11)
    assert tokens(spec, 11) == want and want[0] != want[1]
    assert tokens(spec, -1) != tokens(spec, -1)


def test_vllms_stop_token_ids_end_the_request_and_neutral_extensions_pass(client):
    """stop_token_ids (vLLM's) end a request at the first of them, its id kept in token_ids and its text left out unless
    include_stop_str_in_output (vLLM's way), with finish_reason stop, under speculation too and with ignore_eos on (as
    vLLM's); vLLM's extensions this server lacks pass when a client sends their neutral values (refused otherwise:
    test_serve_errors)."""
    neutral = {"min_tokens": 0, "use_beam_search": False, "typical_p": 1.0, "length_penalty": 1.0, "include_stop_str_in_output": False,
               "guided_json": None}
    plain = complete(client, METHODS[0], extra=neutral).choices[0].model_extra["token_ids"]
    stop_at = next(t for t in plain[5:] if t > 2)  # a token with text (0-2: the character tokenizer's special tokens)
    want = plain[: plain.index(stop_at) + 1]
    pieces = complete(client, METHODS[0], logprobs=0).choices[0].logprobs.tokens  # each token's text, special ones too

    def text(n: int) -> str:  # the first n tokens' text, as a completion shows it (special tokens left out)
        return "".join(p for p in pieces[:n] if p not in ("<pad>", "<s>", "</s>"))

    for spec in METHODS:
        c = complete(client, spec, extra={"stop_token_ids": [stop_at]}).choices[0]
        assert c.model_extra["token_ids"] == want and c.finish_reason == "stop", spec
        assert c.text == text(len(want) - 1) and text(len(want)) != c.text  # the stop token's text left out, as vLLM leaves it out
    kept = complete(client, METHODS[1], extra={"stop_token_ids": [stop_at], "include_stop_str_in_output": True}).choices[0]
    assert kept.model_extra["token_ids"] == want and kept.text == text(len(want))


@pytest.mark.parametrize("spec", METHODS, ids=IDS)
def test_vllms_min_tokens_allowed_token_ids_and_bad_words_keep_greedy_output_identical(client, spec):
    """min_tokens holds back the stop ids (and stop strings) for its first tokens; allowed_token_ids keeps the output inside
    them; bad_words never appear (tokenized as vLLM does); each changes the output, and speculation does not."""
    plain = complete(client, METHODS[0]).choices[0]
    ids = plain.model_extra["token_ids"]
    cases = [
        {"stop_token_ids": [ids[1]], "min_tokens": 6},
        {"allowed_token_ids": sorted(set(ids[2:6]))},
        {"bad_words": [plain.text[:2], plain.text[4]]},
    ]
    for extra in cases:
        want = complete(client, METHODS[0], extra=extra).choices[0]
        got = complete(client, spec, extra=extra).choices[0]
        assert got.model_extra["token_ids"] == want.model_extra["token_ids"] != ids, extra
        assert got.text == want.text and got.finish_reason == want.finish_reason
    first, limited, banned = (complete(client, spec, extra=e).choices[0] for e in cases)
    assert len(first.model_extra["token_ids"]) > 6 and ids[1] not in first.model_extra["token_ids"][:6]
    assert set(limited.model_extra["token_ids"]) <= set(ids[2:6])
    assert plain.text[:2] not in banned.text and plain.text[4] not in banned.text


def test_stop_strings_wait_for_min_tokens_and_include_stop_str_in_output_keeps_them(client):
    plain = complete(client, METHODS[0]).choices[0].text
    stop = plain[1]
    early = complete(client, METHODS[0], stop=[stop]).choices[0]
    assert early.text == plain[:1] and early.finish_reason == "stop"
    kept = complete(client, METHODS[1], stop=[stop], extra={"include_stop_str_in_output": True}).choices[0]
    assert kept.text == plain[:2] and kept.finish_reason == "stop"
    pieces = complete(client, METHODS[0], logprobs=0).choices[0].logprobs.tokens  # each token's text
    first = next(j for j in range(len(pieces)) if stop in "".join(pieces[: j + 1]))  # the token that completes the first stop
    later = complete(client, METHODS[2], stop=[stop], extra={"min_tokens": first + 1}).choices[0]  # the first stop is in the first tokens
    again = plain.find(stop, 2)
    assert later.text == (plain[:again] if again >= 0 else plain) and later.finish_reason == ("stop" if again >= 0 else "length")


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(client):
    long = "xyz " * 10 + PROMPT
    kw = dict(model="target", prompt=long, max_tokens=8, temperature=0, echo=True)
    whole = client.completions.create(**kw, extra_body={"ignore_eos": True})
    cut = client.completions.create(**kw, extra_body={"truncate_prompt_tokens": len(PROMPT), "ignore_eos": True})
    assert whole.usage.prompt_tokens == len(long) + 1 and cut.usage.prompt_tokens == len(PROMPT)  # one token a character, and BOS
    assert whole.choices[0].text.startswith(long) and cut.choices[0].text.startswith(PROMPT)  # echo: the prompt the model read
    assert not cut.choices[0].text.startswith("xyz")
    messages = [{"role": "user", "content": "hi " * 40}]  # more than the engine's max_input_len (64) once templated
    with pytest.raises(openai.BadRequestError, match="max_input_len"):
        client.chat.completions.create(model="target", messages=messages, max_tokens=4, temperature=0)
    chat = client.chat.completions.create(model="target", messages=messages, max_tokens=4, temperature=0,
                                          extra_body={"truncate_prompt_tokens": -1})
    assert chat.usage.prompt_tokens == 64  # the rendered conversation's last max_input_len tokens


def test_vllms_prompt_logprobs(client, server):
    """Each prompt token's log-probability (the raw model's, as echo's), its rank, and k alternatives by id; the first None."""
    echo = client.completions.create(model="target", prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=1)
    with httpx.Client(base_url=server, timeout=30) as c:
        body = {"model": "target", "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
        for spec in (METHODS[0], METHODS[1]):
            got = c.post("/v1/completions", json={**body, "speculative": spec}).json()["choices"][0]["prompt_logprobs"]
            assert got[0] is None and len(got) == echo.usage.prompt_tokens
            for entry, own in zip(got[1:], echo.choices[0].logprobs.token_logprobs[1:echo.usage.prompt_tokens], strict=True):
                assert 2 <= len(entry) <= 3 and sorted(v["rank"] for v in entry.values())[:2] == [1, 2]
                mine = [v for v in entry.values() if math.isclose(v["logprob"], own, abs_tol=1e-5)]
                assert mine and all(v["rank"] >= 1 and v["decoded_token"] for v in entry.values())
        # both at once: echo's alternatives stay logprobs' count
        both = c.post("/v1/completions", json={**body, "echo": True, "logprobs": 1}).json()["choices"][0]
        assert all(t is None or len(t) <= 2 for t in both["logprobs"]["top_logprobs"]) and len(both["prompt_logprobs"][1]) >= 2
        chat = c.post("/v1/chat/completions", json={"model": "target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                    "prompt_logprobs": 0}).json()
        assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"] and all(len(e) == 1 for e in chat["prompt_logprobs"][1:])
        r = c.post("/v1/completions", json={**body, "stream": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_echo_scores_the_prompt(client):
    r = client.completions.create(model="target", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0)
    c = r.choices[0]
    prompt_ids = r.usage.prompt_tokens
    assert c.text == PROMPT and c.model_extra["token_ids"] == []
    assert c.logprobs.token_logprobs[0] is None and len(c.logprobs.token_logprobs) == prompt_ids
    assert all(v <= 0 for v in c.logprobs.token_logprobs[1:])
    # with a completion: the prompt's scores, then the completion's, as one sequence
    r2 = client.completions.create(model="target", prompt=PROMPT, max_tokens=4, echo=True, logprobs=1, temperature=0, extra_body={"ignore_eos": True})
    c2 = r2.choices[0]
    assert c2.text.startswith(PROMPT) and len(c2.logprobs.token_logprobs) == prompt_ids + 4
    assert c2.logprobs.token_logprobs[0] is None
    assert c2.logprobs.token_logprobs[1:prompt_ids] == pytest.approx(c.logprobs.token_logprobs[1:], abs=1e-5)
    # echo scores equal whatever the method (the prompt's rows come from the prefill)
    r3 = client.completions.create(model="target", prompt=PROMPT, max_tokens=4, echo=True, logprobs=1, temperature=0,
                                   extra_body={"speculative": {"method": "ngram"}, "ignore_eos": True})
    assert r3.choices[0].text == c2.text
    assert all(a is None and b is None or math.isclose(a, b, abs_tol=1e-4)
               for a, b in zip(r3.choices[0].logprobs.token_logprobs, c2.logprobs.token_logprobs, strict=True))


def test_several_prompts_n_and_seeds(client):
    prompts = ["def fib(n):", "Hello", PROMPT]
    alone = [client.completions.create(model="target", prompt=p, max_tokens=8, temperature=0).choices[0].text for p in prompts]
    r = client.completions.create(model="target", prompt=prompts, max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2] and [c.text for c in r.choices] == alone
    assert r.usage.prompt_tokens == sum(len(p) + 1 for p in prompts)  # the character tokenizer adds BOS
    # n sampled choices per prompt: index = prompt * n + j, each its own draw, the same again with the same seed
    kw = dict(model="target", prompt=prompts[:2], max_tokens=8, temperature=1.0, n=3, seed=7)
    a, b = client.completions.create(**kw), client.completions.create(**kw, extra_body={"speculative": {"method": "ngram"}})
    assert [c.index for c in a.choices] == list(range(6)) and a.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in a.choices)
    assert len({c.text for c in a.choices[:3]}) > 1
    assert [c.text for c in client.completions.create(**kw).choices] == [c.text for c in a.choices]
    assert len(b.choices) == 6


def test_best_of_returns_the_most_likely(client):
    r = client.completions.create(model="target", prompt=PROMPT, max_tokens=6, temperature=1.0, best_of=4, n=2, seed=3, logprobs=0,
                                  extra_body={"ignore_eos": True})
    assert len(r.choices) == 2 and r.usage.completion_tokens == 4 * 6  # every sample's tokens count
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in r.choices]
    assert means[0] >= means[1]
    every = client.completions.create(model="target", prompt=PROMPT, max_tokens=6, temperature=1.0, n=4, seed=3, logprobs=0,
                                      extra_body={"ignore_eos": True})
    best = sorted(every.choices, key=lambda c: -sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs))[:2]
    assert [c.text for c in r.choices] == [c.text for c in best]


def test_chat_logprobs_and_n_streamed(server, client):
    msgs = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model="target", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, n=2,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in whole.choices] == [0, 1] and whole.choices[0].message.content == whole.choices[1].message.content
    content = whole.choices[0].logprobs.content
    assert len(content) == 8 and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)
    stream = client.chat.completions.create(model="target", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, n=2,
                                            stream=True,
                                            extra_body={"speculative": {"method": "draft"}, "ignore_eos": True})
    texts, lps = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            lps[c.index] += [e.logprob for e in (c.logprobs.content if c.logprobs else [])]
    assert texts[0] == texts[1] == whole.choices[0].message.content
    assert lps[0] == pytest.approx([e.logprob for e in content], abs=1e-4)


def test_completion_stream_with_logprobs_and_several_prompts(server):
    body = {"prompt": ["abc", "xyz"], "max_tokens": 6, "temperature": 0, "logprobs": 2, "stream": True, "speculative": {"method": "ngram"},
            "ignore_eos": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    by = {0: [], 1: []}
    for e in events[:-1]:
        for c in e["choices"]:
            by[c["index"]] += c["logprobs"]["token_logprobs"]
    assert len(by[0]) == len(by[1]) == 6


def _streamed(server, body):
    """A completion stream joined per choice: text, token ids, logprobs (tokens, token_logprobs, text_offset), finish, usage."""
    with httpx.stream("POST", f"{server}/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=60) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    return join_choices(events[:-2]), events[-2]["usage"]


ECHO = [  # (prompt, max_tokens, n, logprobs)
    (PROMPT, 0, 1, None), (PROMPT, 0, 2, 1), ([PROMPT, "def f"], 0, 1, 2), (PROMPT, 5, 1, None), (PROMPT, 5, 2, 1),
        ([[1, 70, 71, 72], [1, 80, 81]], 3, 2, 0),
]


@pytest.mark.parametrize("prompt,max_tokens,n,logprobs", ECHO)
def test_echo_streamed_and_not_agree_and_usage_counts_what_was_returned(server, prompt, max_tokens, n, logprobs):
    """OpenAI's legacy completions and vLLM: echo puts the prompt before the completion, in the first chunk when streamed;
    max_tokens=0 returns the prompt alone with finish_reason "length" and no completion token counted."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "n": n, "echo": True, "temperature": 0, "ignore_eos": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    whole = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    streamed, usage = _streamed(server, body)
    keys = ("index", "text", "token_ids", "finish_reason", "logprobs")
    assert [{k: c[k] for k in keys} for c in whole["choices"]] == streamed  # the same computation: equal to the bit
    assert usage == whole["usage"]
    prompts = prompt if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else [prompt]
    for c in whole["choices"]:
        sent = prompts[c["index"] // n]
        if isinstance(sent, str):
            assert c["text"].startswith(sent)  # the prompt as sent, then the completion
        assert len(c["token_ids"]) == max_tokens and (c["finish_reason"] == "length")
        if logprobs is not None:  # the prompt's tokens (the character tokenizer adds BOS to text), then the completion's
            prompt_len = len(sent) + 1 if isinstance(sent, str) else len(sent)
            assert len(c["logprobs"]["tokens"]) == len(c["logprobs"]["token_logprobs"]) == prompt_len + max_tokens
            assert c["logprobs"]["token_logprobs"][0] is None
    assert whole["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in whole["choices"]) == max_tokens * n * len(prompts)


def test_top_p_zero_keeps_the_most_likely_token_alone(client):
    """OpenAI reads top_p 0 as a nucleus of the most probable token (SamplingConfig's 0 would be "off": a full draw)."""
    greedy = complete(client, METHODS[0]).choices[0].model_extra["token_ids"]
    for seed in (1, 2, 3):
        for spec in (METHODS[0], METHODS[1]):
            got = client.completions.create(model="target", prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=0, seed=seed,
                                            extra_body={"speculative": spec, "ignore_eos": True}).choices[0].model_extra["token_ids"]
            assert got == greedy


def test_max_completion_tokens_limits_a_completion_too(client):
    """Chat's newer name for max_tokens is taken on /v1/completions as well, never dropped as an unknown field."""
    r = client.completions.create(model="target", prompt=PROMPT, temperature=0, extra_body={"max_completion_tokens": 3, "ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    same = client.completions.create(model="target", prompt=PROMPT, temperature=0, max_tokens=3,
                                     extra_body={"max_completion_tokens": 3, "ignore_eos": True})
    assert same.choices[0].text == r.choices[0].text
