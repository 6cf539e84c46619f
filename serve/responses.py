"""Response bodies and stream chunks, shaped as OpenAI's (plus the extension fields).

Extensions, ignored by clients that do not know them:
    choices[i].token_ids   the tokens of this text (a chunk's: this round's)
    speculative            the request's method and draft length, and its acceptance figures
    timings                queue, time to first token, time per output token, end to end (seconds)
"""

from __future__ import annotations

import json
from typing import Any

from .loop import Event, Job, Result


def speculative(job: Job, result: Result) -> dict[str, Any]:
    m = result.metrics
    return {
        "method": job.plan.method,
        "num_draft_tokens": job.plan.num_draft_tokens,
        "rounds": m.rounds,  # target verification calls after the prompt's
        "num_drafts": m.rounds - m.no_draft_rounds,  # rounds that had drafts (vLLM's num_drafts)
        "drafted": m.drafted,
        "accepted": m.accepted,
        "acceptance_rate": m.acceptance_rate,
        "mean_acceptance_length": m.mean_acceptance_length,
        "per_position_acceptance": m.per_position_acceptance,
        "accepted_per_position": list(m.accepted_at),
        "drafted_per_position": list(m.drafted_at),
    }


def usage(result: Result) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens, "total_tokens": result.prompt_tokens + result.completion_tokens}


def _head(job: Job, model: str, obj: str) -> dict[str, Any]:
    return {"id": job.id, "object": obj, "created": job.created, "model": model}


def completion(job: Job, model: str, r: Result) -> dict[str, Any]:
    choice = {"index": 0, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason, "token_ids": r.token_ids}
    return {**_head(job, model, "text_completion"), "choices": [choice], "usage": usage(r), "speculative": speculative(job, r), "timings": r.timings}


def chat_completion(job: Job, model: str, r: Result) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": r.text}, "logprobs": None, "finish_reason": r.finish_reason, "token_ids": r.token_ids}
    return {**_head(job, model, "chat.completion"), "choices": [choice], "usage": usage(r), "speculative": speculative(job, r), "timings": r.timings}


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


def completion_chunk(job: Job, model: str, ev: Event) -> dict[str, Any]:
    r = ev.result
    choice = {"index": 0, "text": ev.text, "logprobs": None, "finish_reason": r.finish_reason if r else None, "token_ids": ev.token_ids}
    chunk = {**_head(job, model, "text_completion"), "choices": [choice]}
    if r is not None:
        chunk.update(speculative=speculative(job, r), timings=r.timings)
    return chunk


def chat_chunk(job: Job, model: str, ev: Event | None) -> dict[str, Any]:
    """ev None: the opening chunk that names the role."""
    if ev is None:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return {**_head(job, model, "chat.completion.chunk"), "choices": [choice]}
    r = ev.result
    delta = {"content": ev.text} if ev.text or r is None else {}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": r.finish_reason if r else None, "token_ids": ev.token_ids}
    chunk = {**_head(job, model, "chat.completion.chunk"), "choices": [choice]}
    if r is not None:
        chunk.update(speculative=speculative(job, r), timings=r.timings)
    return chunk


def usage_chunk(job: Job, model: str, obj: str, r: Result) -> dict[str, Any]:
    return {**_head(job, model, obj), "choices": [], "usage": usage(r), "speculative": speculative(job, r), "timings": r.timings}
