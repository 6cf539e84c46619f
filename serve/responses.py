"""Response bodies and stream chunks, shaped as OpenAI's (plus the extension fields).

Extensions, ignored by clients that do not know them:
    choices[i].token_ids   the tokens of this text (a chunk's: this round's), never the echoed prompt's
    choices[i].error       with finish_reason "error" only: why, in OpenAI's error shape (code nonfinite_logits | grammar_failed)
    usage.prompt_tokens_details.cached_tokens   OpenAI's field: prompt tokens copied from the prefix cache
    speculative            the request's method and draft length, and its acceptance figures
    timings                queue, time to first token, time per output token, end to end (seconds)

Log-probabilities are the target's, after the request's logits processing
(penalties, logit_bias, the grammar mask; before temperature and truncation):
runtime/logits.py. Prompt tokens (``echo``) get the raw model's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..formats.tokenizer import Tokenizer
from ..runtime.logits import TokenLogprob
from .jobs import ChoiceResult, Event, Job, Result
from .params import Served


def speculative(job: Job, result: Result) -> dict[str, Any]:
    m = result.metrics
    return {
        "method": job.plan.method,
        "num_draft_tokens": job.plan.num_draft_tokens,
        "rounds": m.rounds,  # target verification calls after the prompt's
        "num_drafts": m.drafting_rounds,  # rounds that had drafts (vLLM's num_drafts)
        "drafted": m.drafted,
        "accepted": m.accepted,
        "acceptance_rate": m.acceptance_rate,
        "mean_acceptance_length": m.mean_acceptance_length,
        "per_position_acceptance": m.per_position_acceptance,
        "accepted_per_position": list(m.accepted_at),
        "drafted_per_position": list(m.drafted_at),
        "silent_drafts": m.silent_drafts,  # choices whose drafts never landed (runtime/guards.py); the server logs each once
    }


def usage(result: Result) -> dict[str, Any]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}


def _head(job: Job, model: str, obj: str) -> dict[str, Any]:
    return {"id": job.id, "object": obj, "created": job.created, "model": model}


# -- log-probabilities ---------------------------------------------------------------------------
def _piece(tok: Tokenizer | None, t: int) -> str:
    return tok.decode_token(t) if tok is not None else f"<{t}>"


def completion_logprobs(served: Served, ids: Sequence[int], lps: Sequence[TokenLogprob | None], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy completions form: tokens, token_logprobs, top_logprobs, text_offset."""
    tok = served.tokenizer
    tokens = [_piece(tok, t) for t in ids]
    offsets, at = [], offset
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [lp[0] if lp is not None else None for lp in lps],
        # OpenAI: "always the logprob of the sampled token, so there may be up to logprobs+1 elements"
        "top_logprobs": [{**{_piece(tok, a): v for a, v in lp[1]}, **({} if s in dict(lp[1]) else {_piece(tok, s): lp[0]})}
                         if lp is not None else None for s, lp in zip(ids, lps, strict=False)],
        "text_offset": offsets,
    }


def chat_logprobs(served: Served, ids: Sequence[int], lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    tok = served.tokenizer

    def entry(t: int, lp: float) -> dict[str, Any]:
        s = _piece(tok, t)
        exact = served.token_bytes(t)  # a token ending inside a character: its own bytes, not U+FFFD's
        return {"token": s, "logprob": lp, "bytes": list(exact if exact is not None else s.encode("utf-8", "replace"))}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, v) for a, v in top]} for t, (lp, top) in zip(ids, lps, strict=False)]}


# -- whole responses -----------------------------------------------------------------------------
def completion(job: Job, served: Served, r: Result) -> dict[str, Any]:
    choices = [_completion_choice(job, served, c) for c in r.choices]
    return {**_head(job, served.model_name, "text_completion"), "choices": choices, "usage": usage(r), "speculative": speculative(job, r),
            "timings": r.timings}


def _completion_choice(job: Job, served: Served, c: ChoiceResult) -> dict[str, Any]:
    plan = job.plan
    ids, text, lps = list(c.token_ids), c.text, c.logprobs
    logprobs = None
    if plan.logprobs is not None:
        if plan.echo:
            prompt_lps = [lp if lp is None else lp._replace(top=lp.top[: plan.logprobs]) for lp in c.prompt_logprobs or [None] * len(c.prompt_ids)]
            logprobs = completion_logprobs(served, c.prompt_ids + ids, prompt_lps + list(lps or []))
        else:
            logprobs = completion_logprobs(served, ids, lps or [])
    text = echoed_prompt(job, served, c.index) + text if plan.echo else text
    choice = {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason, "token_ids": ids}
    if plan.prompt_logprobs is not None:
        choice["prompt_logprobs"] = vllm_prompt_logprobs(served, c.prompt_ids, c.prompt_logprobs, plan.prompt_logprobs)
    return _with_error(choice, c.error)


def vllm_prompt_logprobs(served: Served, prompt_ids: list[int], lps: list[TokenLogprob | None] | None, top: int) -> list[dict[str, Any] | None]:
    """vLLM's prompt_logprobs: per prompt token (None for the first, and where no distribution scored it), the token's own
    and its ``top`` most likely alternatives, by id: {"logprob", "rank", "decoded_token"}."""
    out: list[dict[str, Any] | None] = []
    for t, lp in zip(prompt_ids, lps or [None] * len(prompt_ids), strict=True):
        if lp is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": lp.logprob, "rank": getattr(lp, "rank", None), "decoded_token": _piece(served.tokenizer, t)}}
        for i, (alt, value) in enumerate(lp.top[:top]):
            entry.setdefault(str(alt), {"logprob": value, "rank": i + 1, "decoded_token": _piece(served.tokenizer, alt)})
        out.append(entry)
    return out


def echoed_prompt(job: Job, served: Served, index: int) -> str:
    """The prompt of choice ``index`` as echo returns it: the text as sent, or token ids decoded."""
    p = index // job.plan.n
    text = job.plan.prompt_texts[p] if p < len(job.plan.prompt_texts) else None
    if text is None:
        text = served.tokenizer.decode(job.plan.prompts[p]) if served.tokenizer is not None else ""
    return text


def _with_error(choice: dict[str, Any], error: dict[str, Any] | None) -> dict[str, Any]:
    """A choice that ended with finish_reason "error" says why, in OpenAI's error shape (an extension field)."""
    if error is not None:
        choice["error"] = error
    return choice


def chat_completion(job: Job, served: Served, r: Result) -> dict[str, Any]:
    choices = []
    for c in r.choices:
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        reason = c.finish_reason
        if job.plan.tools is not None:
            content, calls = job.plan.tools.parse(c.text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls" if reason == "stop" else reason
        logprobs = chat_logprobs(served, c.token_ids, c.logprobs) if job.plan.logprobs is not None and c.logprobs is not None else None
        choices.append(_with_error({"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": reason, "token_ids": c.token_ids},
                                   c.error))
    body = {**_head(job, served.model_name, "chat.completion"), "choices": choices, "usage": usage(r), "speculative": speculative(job, r),
            "timings": r.timings}
    if job.plan.prompt_logprobs is not None and r.choices:  # vLLM's: the conversation's, once (every choice shares it)
        first = r.choices[0]
        body["prompt_logprobs"] = vllm_prompt_logprobs(served, first.prompt_ids, first.prompt_logprobs, job.plan.prompt_logprobs)
    return body


# -- streams -------------------------------------------------------------------------------------
def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


def completion_chunks(job: Job, served: Served) -> Callable[[Event], list[dict[str, Any]]]:
    """A completion stream's chunks. With echo, a choice's first chunk opens with its prompt (and the prompt's
    log-probabilities), as the non-streamed answer does: the chunks joined equal it, text, logprobs and offsets."""
    echoed: set[int] = set()
    offsets: dict[int, int] = {}  # per choice: where the next chunk's logprobs text_offset starts

    def chunks(ev: Event) -> list[dict[str, Any]]:
        plan = job.plan
        text, ids, lps = ev.text, ev.token_ids, list(ev.logprobs)
        head_text, head_ids, head_lps = "", [], []
        if plan.echo and ev.index not in echoed:
            echoed.add(ev.index)
            head_text = echoed_prompt(job, served, ev.index)
            if plan.logprobs is not None:
                p = ev.index // plan.n
                head_ids = plan.prompts[p]
                head_lps = list(ev.prompt_logprobs or [None] * len(head_ids))
        logprobs = None
        if plan.logprobs is not None:
            at = offsets.get(ev.index, 0)
            logprobs = completion_logprobs(served, head_ids + ids, head_lps + lps, at)
            offsets[ev.index] = at + sum(len(t) for t in logprobs["tokens"])
        choice = _with_error({"index": ev.index, "text": head_text + text, "logprobs": logprobs, "finish_reason": ev.finish_reason, "token_ids": ids},
                             ev.choice_error)
        chunk = {**_head(job, served.model_name, "text_completion"), "choices": [choice]}
        if ev.result is not None:
            chunk.update(speculative=speculative(job, ev.result), timings=ev.result.timings)
        return [chunk]

    return chunks


def chat_opening(job: Job, served: Served, index: int) -> dict[str, Any]:
    """The opening chunk of a choice: it names the role."""
    choice = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return {**_head(job, served.model_name, "chat.completion.chunk"), "choices": [choice]}


def chat_chunk(job: Job, served: Served, ev: Event, text: str, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One round's text of one choice (``text``: what may be shown now); the last one may carry tool calls."""
    delta: dict[str, Any] = {"content": text} if text or (ev.finish_reason is None and not tool_calls) else {}
    reason = ev.finish_reason
    if tool_calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        reason = "tool_calls" if reason == "stop" else reason
    logprobs = chat_logprobs(served, ev.token_ids, ev.logprobs) if job.plan.logprobs is not None else None
    choice = _with_error({"index": ev.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason, "token_ids": ev.token_ids},
                         ev.choice_error)
    chunk = {**_head(job, served.model_name, "chat.completion.chunk"), "choices": [choice]}
    if ev.result is not None:
        chunk.update(speculative=speculative(job, ev.result), timings=ev.result.timings)
    return chunk


def usage_chunk(job: Job, model: str, obj: str, r: Result) -> dict[str, Any]:
    return {**_head(job, model, obj), "choices": [], "usage": usage(r), "speculative": speculative(job, r), "timings": r.timings}
