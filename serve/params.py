"""A request body -> a checked plan for the engine: prompt ids, GenerationConfig, stop strings.

Every check that needs the loaded engines lives here, and every refusal is an
``ApiError`` whose message says what was wrong and what the server can do.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from ..runtime.engine import Engine, check_draft_len
from ..runtime.errors import SpecdecError
from ..runtime.request import AUTO, METHODS, GenerationConfig
from ..runtime.sampling import SamplingConfig
from ..runtime.tokenizer import Tokenizer
from .chat import render_chat
from .errors import ApiError
from .protocol import UNSUPPORTED, ChatCompletionRequest, CompletionRequest, Sampling

MAX_STOPS = 16


@dataclass
class Served:
    """What the server loaded: the engine and everything a request is checked against."""

    engine: Engine
    tokenizer: Tokenizer | None
    model_name: str
    end_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)
    draft_lens: dict[str, int | str] = field(default_factory=dict)  # method -> default drafts per round

    @property
    def max_seq_len(self) -> int:
        return self.engine.target.build.max_seq_len

    @property
    def methods(self) -> list[str]:
        return ["none", *self.engine.proposers]


@dataclass
class Plan:
    """A checked request, ready for the engine loop."""

    prompt_ids: list[int]
    config: GenerationConfig
    stops: tuple[str, ...]
    method: str  # resolved: none | draft | ngram | medusa | eagle
    num_draft_tokens: int | str  # resolved: k or "auto"
    stream: bool
    include_usage: bool


def check_common(req: Sampling, served: Served) -> None:
    if req.model is not None and req.model != served.model_name:
        raise ApiError(404, f"the model {req.model!r} does not exist on this server; it serves {served.model_name!r} (GET /v1/models).", "model", "model_not_found")
    if req.n != 1:
        raise ApiError(400, f"n={req.n} is not supported: this server returns one choice per request (n=1); send {req.n} requests instead.", "n")
    for name, (used, why) in UNSUPPORTED.items():
        if name in type(req).model_fields and used(getattr(req, name)):
            raise ApiError(400, why, name)


def completion_prompt(req: CompletionRequest, served: Served) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt holds {len(prompt)} prompts; this server takes one prompt per request (send several requests, they are batched).", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if served.tokenizer is None:
            raise ApiError(400, "text prompts need a tokenizer and the engine has none: send token ids, or restart with --tokenizer_dir.", "prompt")
        return served.tokenizer.encode(prompt)
    return list(prompt)


def chat_prompt(req: ChatCompletionRequest, served: Served) -> list[int]:
    if served.tokenizer is None or served.chat_template is None:
        raise ApiError(
            400,
            f"the model {served.model_name!r} has no chat template (no chat_template in its tokenizer_config.json): "
            "use /v1/completions, or restart specdec-serve with --chat_template FILE.",
            "messages",
        )
    messages = []
    for i, m in enumerate(req.messages):
        msg = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            bad = next((p for p in m.content if p.type != "text" or p.text is None), None)
            if bad is not None:
                why = "without text" if bad.type == "text" else f"of type {bad.type!r}"
                raise ApiError(400, f"messages[{i}] has a content part {why}; this server takes text parts only.", "messages")
            msg["content"] = "".join(p.text or "" for p in m.content)
        messages.append(msg)
    text = render_chat(served.chat_template, messages, served.special_tokens)
    return served.tokenizer.encode(text, add_special_tokens=False)


def plan(req: Sampling, prompt_ids: list[int], max_tokens: int | None, served: Served, default_max_tokens: int | None, max_tokens_param: str = "max_tokens") -> Plan:
    engine = served.engine
    try:
        ids = engine.validate(prompt_ids)
    except SpecdecError as err:
        code = "context_length_exceeded" if len(prompt_ids) > engine.max_input_len else None
        raise ApiError(400, str(err), "prompt" if isinstance(req, CompletionRequest) else "messages", code) from None
    room = served.max_seq_len - len(ids)
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room) if default_max_tokens else room
    if max_tokens > room or room <= 0:
        raise ApiError(
            400,
            f"this model's maximum context length is {served.max_seq_len} tokens (the engine's max_seq_len), but you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the completion). Reduce {max_tokens_param} or the prompt.",
            max_tokens_param,
            "context_length_exceeded",
        )
    method, k = speculation(req, served)
    stops = stop_strings(req, served)
    seed = req.seed if req.seed is not None else secrets.randbits(63)
    if seed < 0:
        raise ApiError(400, f"seed={seed} must be >= 0.", "seed")
    sampling = SamplingConfig(
        temperature=1.0 if req.temperature is None else req.temperature,  # OpenAI's default
        top_k=max(req.top_k or 0, 0),
        top_p=1.0 if req.top_p is None else req.top_p,
        random_seed=seed,
    )
    config = GenerationConfig(
        max_output_len=max_tokens,
        sampling=sampling,
        end_ids=() if req.ignore_eos else served.end_ids,
        method=method,
        draft_len=k if method != "none" else 0,
    )
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true.", "stream_options")
    return Plan(ids, config, stops, method, k if method != "none" else 0, req.stream, include_usage)


def speculation(req: Sampling, served: Served) -> tuple[str, int | str]:
    """The request's speculation method and drafts per round, checked against what the server loaded."""
    spec = req.speculative
    engine = served.engine
    method = spec.method if spec and spec.method is not None else engine.speculation.method
    if method not in METHODS:
        raise ApiError(400, f"unknown speculative.method {method!r}; expected one of {', '.join(METHODS)}.", "speculative.method")
    if method not in served.methods:
        hint = {"draft": "--draft_engine_dir", "ngram": "--ngram_config"}.get(method, f"a target engine built with --speculative_decoding_mode {method}")
        raise ApiError(
            400,
            f"speculative.method {method!r} is not loaded on this server (loaded: {', '.join(served.methods)}); start specdec-serve with {hint} to serve it.",
            "speculative.method",
        )
    k = spec.num_draft_tokens if spec and spec.num_draft_tokens is not None else None
    if method == "none":
        if k not in (None, 0):
            raise ApiError(400, f"speculative.num_draft_tokens={k!r} needs a method that drafts (draft, ngram, medusa or eagle), not 'none'.", "speculative.num_draft_tokens")
        return method, 0
    if k is None:
        k = served.draft_lens.get(method, engine.speculation.draft_len if method == engine.speculation.method else AUTO)
    if isinstance(k, str) and k != AUTO or isinstance(k, int) and k < 0:
        raise ApiError(400, f"speculative.num_draft_tokens={k!r} must be an integer >= 0 or 'auto'.", "speculative.num_draft_tokens")
    if k != AUTO:
        try:
            check_draft_len(engine.target.engine, k, "speculative.num_draft_tokens")
        except SpecdecError as err:
            raise ApiError(400, str(err), "speculative.num_draft_tokens") from None
        cap = engine.proposers[method].max_draft_len  # a limit of the proposer's own config: only n-gram's (--ngram_config) has one
        if cap is not None and k > cap:
            raise ApiError(400, f"speculative.num_draft_tokens={k} is larger than the n-gram pool's max_draft_len={cap} (--ngram_config); use <= {cap}.", "speculative.num_draft_tokens")
    return method, k


def stop_strings(req: Sampling, served: Served) -> tuple[str, ...]:
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    stops = tuple(s for s in stops if s)
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop holds {len(stops)} strings; at most {MAX_STOPS}.", "stop")
    if stops and served.tokenizer is None:
        raise ApiError(400, "stop strings are matched on text and the engine has no tokenizer: restart with --tokenizer_dir.", "stop")
    return stops
