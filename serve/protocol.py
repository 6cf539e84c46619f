"""The request bodies the server accepts: OpenAI's fields, plus two extensions.

Types are checked strictly (a string where a number belongs is a 422, never
coerced); value checks that need the loaded engines (model name, context
length, speculation) are made by ``serve/params.py`` and answered with 400.
Fields an OpenAI client may send that this server does not implement are
refused by name when they are used (``UNSUPPORTED``), never silently ignored;
unknown fields are ignored, as OpenAI-compatible servers do.

Extensions (ignored by clients that do not know them):
    "speculative": {"method": "none" | "draft" | "ngram", "num_draft_tokens": k | "auto"}
    "ignore_eos": true        decode max_tokens tokens whatever the model says (benchmarks)
    "top_k": k                as vLLM and llama.cpp accept it
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

STRICT = ConfigDict(strict=True, extra="ignore")

Prompt = Union[str, list[int], list[str], list[list[int]]]
Stop = Union[str, list[str], None]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class Speculative(BaseModel):
    """The per-request speculation extension. Unknown keys are refused: a typo must not pass silently."""

    model_config = ConfigDict(strict=True, extra="forbid")
    method: Union[str, None] = None  # none | draft | ngram; default: the server's
    num_draft_tokens: Union[int, str, None] = None  # 0..max_draft_len, or "auto"; default: the server's


class Sampling(BaseModel):
    """What completions and chat share."""

    model_config = STRICT
    model: Union[str, None] = None
    temperature: Union[float, None] = Field(None, ge=0.0, le=2.0)
    top_p: Union[float, None] = Field(None, ge=0.0, le=1.0)
    top_k: Union[int, None] = Field(None, ge=-1)  # -1 or 0: off
    n: int = 1
    stream: bool = False
    stream_options: Union[StreamOptions, None] = None
    stop: Stop = None
    seed: Union[int, None] = None
    presence_penalty: Union[float, None] = 0.0
    frequency_penalty: Union[float, None] = 0.0
    logit_bias: Union[dict[str, Any], None] = None
    user: Union[str, None] = None
    ignore_eos: bool = False
    speculative: Union[Speculative, None] = None


class CompletionRequest(Sampling):
    prompt: Prompt
    max_tokens: Union[int, None] = Field(None, ge=1)
    echo: bool = False
    logprobs: Union[int, None] = None
    best_of: Union[int, None] = None
    suffix: Union[str, None] = None


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: Union[str, None] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # tool_calls, reasoning, ...: passed to the template as sent
    role: str
    content: Union[str, list[ContentPart], None] = None
    name: Union[str, None] = None


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Union[int, None] = Field(None, ge=1)
    max_completion_tokens: Union[int, None] = Field(None, ge=1)
    logprobs: Union[bool, None] = False
    top_logprobs: Union[int, None] = None
    tools: Union[list[Any], None] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    response_format: Union[dict[str, Any], None] = None


# field -> (is it used?, why it is refused)
UNSUPPORTED = {
    "echo": (lambda v: bool(v), "echo is not supported: the response holds the completion only (prepend the prompt yourself)."),
    "logprobs": (lambda v: v is not None and v is not False, "logprobs are not supported by this server."),
    "top_logprobs": (lambda v: v is not None, "top_logprobs are not supported by this server."),
    "best_of": (lambda v: v is not None and v != 1, "best_of is not supported: this server returns one choice per request (best_of=1)."),
    "suffix": (lambda v: bool(v), "suffix (insertion) is not supported by this server."),
    "presence_penalty": (lambda v: bool(v), "presence_penalty is not supported by this server (0 only)."),
    "frequency_penalty": (lambda v: bool(v), "frequency_penalty is not supported by this server (0 only)."),
    "logit_bias": (lambda v: bool(v), "logit_bias is not supported by this server."),
    "tools": (lambda v: bool(v), "tools (function calling) are not supported by this server."),
    "tool_choice": (lambda v: v not in (None, "none"), "tool_choice is not supported by this server."),
    "response_format": (lambda v: bool(v) and v.get("type") != "text", "response_format other than text is not supported by this server."),
}
