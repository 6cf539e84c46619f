"""A job (one HTTP request) and what crosses between the engine loop's thread and the HTTP handlers: the events of
each round, the result of a finished job, and how the runtime's finish reasons read in OpenAI's terms (serve/loop.py
drives the engine; serve/responses.py turns these into responses)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..runtime.logits import TokenLogprob
from ..runtime.metrics import Metrics
from ..runtime.text import TextStream
from .errors import ApiError
from .params import Plan, Served

FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "stop": "stop", "grammar": "stop", "length": "length", "max_seq_len": "length",
                  "abort": "abort",
                  "error": "error"}



@dataclass
class ChoiceResult:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # stop | length | abort | error
    prompt_ids: list[int]
    logprobs: list[TokenLogprob] | None
    prompt_logprobs: list[TokenLogprob | None] | None  # echo: one per prompt token (None for the first)
    metrics: Metrics
    error: dict[str, Any] | None = None  # with finish_reason "error": {"message", "type", "param", "code"}


@dataclass
class Result:
    """What a finished job reports: its choices as the client gets them, and its figures."""

    choices: list[ChoiceResult]
    prompt_tokens: int
    completion_tokens: int  # every sample's, best_of ones included (as OpenAI counts them)
    cached_tokens: int  # per prompt, the prompt tokens its first sample copied from the prefix cache (the others copy its rows)
    metrics: Metrics  # the samples' merged
    timings: dict[str, float | None]


@dataclass
class Event:
    """One round's share of one choice: new text and tokens; the job's last event carries the result."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    result: Result | None = None
    error: ApiError | None = None  # the whole job failed (the stream's error event; the handler's error response)
    choice_error: dict[str, Any] | None = None  # this choice ended with finish_reason "error": why
    prompt_logprobs: list[TokenLogprob | None] | None = None  # echo with logprobs: the choice's prompt's (its first chunk sends them)


class Choice:
    """One engine request of a job."""

    def __init__(self, job: Job, index: int, prompt: int, served: Served):
        self.index, self.prompt = index, prompt
        self.request_id = f"{job.id}-{index}"
        ids = job.plan.prompts[prompt]
        plan = job.plan
        self.stream = (TextStream(served.tokenizer, ids, plan.stops, keep_stop=plan.include_stop, min_tokens=plan.config.min_output_len)
                       if served.tokenizer else None)
        self.token_ids: list[int] = []
        self.text: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.finish_reason: str | None = None
        self.error: dict[str, Any] | None = None  # with finish_reason "error"
        self.metrics: Metrics | None = None
        self.first_token = 0.0


class Job:
    def __init__(self, plan: Plan, served: Served, aio: asyncio.AbstractEventLoop, prefix: str = "cmpl"):
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.plan = plan
        self.choices = [Choice(self, p * plan.samples + j, p, served) for p in range(len(plan.prompts)) for j in range(plan.samples)]
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._aio = aio
        self.arrival = time.perf_counter()
        self.added = 0.0  # given to the engine
        self.first_token = 0.0

    def push(self, event: Event) -> None:
        try:
            self._aio.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's event loop has closed (the server is going down): nobody to tell
            pass
