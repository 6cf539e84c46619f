"""A request body -> a checked plan for the engine: prompts, GenerationConfig, stops, choices, grammar.

Every check that needs the loaded engines lives here, and every refusal is an
``ApiError`` whose message says what was wrong and what the server can do.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..formats.errors import SpecdecError
from ..formats.tokenizer import Tokenizer
from ..runtime.engine import Engine, check_draft_len
from ..runtime.grammar import Grammar, GrammarCompiler, GrammarSpec
from ..runtime.methods import TARGET_ONLY, method_names
from ..runtime.proposers.method import get_method
from ..runtime.proposers.own import OwnDrafter
from ..runtime.request import AUTO, GenerationConfig
from ..runtime.sampling import SamplingConfig
from ..runtime.token_bytes import TokenBytes
from .chat import RESERVED, render_chat
from .errors import ApiError
from .protocol import (
    UNSUPPORTED_VLLM_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    Sampling,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from .tools import ToolPlan, plan_tools

MAX_CHOICES = 256  # engine requests one HTTP request may start (prompts x best_of)


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
    _grammars: GrammarCompiler | None = None
    _compiled: OrderedDict = field(default_factory=OrderedDict)  # (kind, source) -> Grammar: agents resend the same schema
    _lock: threading.Lock = field(default_factory=threading.Lock)  # requests are planned in worker threads (serve/app.py)
    _token_bytes: TokenBytes | None = None  # made on the first chat logprobs

    @property
    def max_seq_len(self) -> int:
        return self.engine.target.build.max_seq_len

    @property
    def methods(self) -> list[str]:
        return [TARGET_ONLY, *self.engine.proposers]

    def token_bytes(self, token: int) -> bytes | None:
        """The exact bytes a token stands for (a piece of a multi-byte character decodes to U+FFFD, its bytes do not);
        a special token's text; None without a tokenizer."""
        if self.tokenizer is None:
            return None
        if self._token_bytes is None:  # (checked again under the lock: grammar compiles hold it, a response need not wait on them)
            with self._lock:
                if self._token_bytes is None:
                    self._token_bytes = TokenBytes(self.tokenizer)
        return self._token_bytes.bytes_of([token]) or self.tokenizer.decode_token(token).encode("utf-8")

    def grammar(self, spec: GrammarSpec, param: str) -> Grammar:
        """The compiled grammar for a spec (cached), or a 400 naming ``param``."""
        if self.tokenizer is None:
            raise ApiError(400, "structured outputs need the model's tokenizer and the engine has none: restart with --tokenizer_dir.", param)
        key = (spec.kind, json.dumps(spec.source, sort_keys=True))
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
            try:
                if self._grammars is None:
                    self._grammars = GrammarCompiler(self.tokenizer.to_json(), self.engine.target.vocab_size, self.end_ids)
                compiled = self._grammars.compile(spec)
            except SpecdecError as err:
                raise ApiError(400, str(err), param) from None
            self._compiled[key] = compiled
            if len(self._compiled) > 64:
                self._compiled.popitem(last=False)
            return compiled


@dataclass
class Plan:
    """A checked request, ready for the engine loop: ``samples`` engine requests per prompt."""

    prompts: list[list[int]]
    config: GenerationConfig
    stops: tuple[str, ...]
    method: str  # resolved: a loaded method (runtime/methods.py), or none
    num_draft_tokens: int | str  # resolved: k or "auto"
    stream: bool
    include_usage: bool
    n: int = 1  # choices returned per prompt
    samples: int = 1  # engine requests per prompt: best_of, or n
    echo: bool = False
    logprobs: int | None = None  # alternatives per token in the response; None: no logprobs
    drop_output: bool = False  # max_tokens=0 with echo: the prompt only (no completion token, none counted)
    prompt_texts: list[str | None] = field(default_factory=list)  # per prompt: the text as sent (echo returns it), None for token ids
    tools: ToolPlan | None = None
    grammar_param: str | None = None  # the request field the output's grammar came from (named by a grammar's error)
    include_stop: bool = False  # include_stop_str_in_output: the text ends after the stop string, not before it
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: alternatives per prompt token in the response's prompt_logprobs


def check_model(model: str | None, served: Served) -> None:
    if model is not None and model != served.model_name:
        raise ApiError(404, f"the model {model!r} does not exist on this server; it serves {served.model_name!r} (GET /v1/models).", "model",
                       "model_not_found")


def check_common(req: Sampling, served: Served) -> None:
    check_model(req.model, served)
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true.", "stream_options")


def completion_prompts(req: CompletionRequest, served: Served) -> list[list[int]]:
    prompt = req.prompt
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    out = []
    for p in prompts:
        if isinstance(p, str):
            if served.tokenizer is None:
                raise ApiError(400, "text prompts need a tokenizer and the engine has none: send token ids, or restart with --tokenizer_dir.",
                               "prompt")
            out.append(served.tokenizer.encode(p))
        else:
            out.append(list(p))
    return out


def tokenized(req: TokenizeChatRequest | TokenizeCompletionRequest, served: Served) -> dict[str, Any]:
    """vLLM's /tokenize: the ids a completion's prompt or a chat's conversation becomes here."""
    check_model(req.model, served)
    if served.tokenizer is None:
        raise ApiError(400, "the engine has no tokenizer to tokenize with: restart with --tokenizer_dir.", "prompt")
    if isinstance(req, TokenizeChatRequest):
        ids = chat_prompt(req, served, plan_tools(req, served), req.add_special_tokens)
    else:
        ids = served.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    strs = [served.tokenizer.id_to_token(t) for t in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": served.max_seq_len, "tokens": ids, "token_strs": strs}


def detokenized(req: DetokenizeRequest, served: Served) -> dict[str, Any]:
    """vLLM's /detokenize: the text of token ids, special tokens kept (as vLLM's: /tokenize's ids of a rendered chat come back)."""
    check_model(req.model, served)
    if served.tokenizer is None:
        raise ApiError(400, "the engine has no tokenizer to detokenize with: restart with --tokenizer_dir.", "tokens")
    inside_vocabulary(req.tokens, served.engine.target.vocab_size, "tokens")
    return {"prompt": served.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def chat_prompt(req: ChatCompletionRequest, served: Served, tools: ToolPlan | None, add_special_tokens: bool = False) -> list[int]:
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
    extra: dict[str, Any] = dict(req.chat_template_kwargs or {})  # vLLM's: say, {"enable_thinking": false} for Qwen3's template
    taken = sorted(RESERVED & extra.keys())
    if taken:
        raise ApiError(400, f"chat_template_kwargs may not set {', '.join(taken)}: the server gives the template those (send messages, "
                            "tools and add_generation_prompt as request fields).", "chat_template_kwargs")
    if tools is not None and tools.definitions:
        extra["tools"] = tools.definitions
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(400, "continue_final_message continues the last message, add_generation_prompt starts a new one: send "
                            "add_generation_prompt=false with it.", "continue_final_message")
    text = render_chat(served.chat_template, messages, served.special_tokens, req.add_generation_prompt, req.continue_final_message, **extra)
    return served.tokenizer.encode(text, add_special_tokens=add_special_tokens)  # the template writes the special tokens itself


def completion_plan(req: CompletionRequest, served: Served) -> Plan:
    refuse_unsupported_fields(req)
    same_limit(req)
    if req.suffix:
        raise ApiError(400, "suffix (insertion) is not supported by this server.", "suffix")
    n, best_of = req.n, req.best_of or req.n
    if best_of < n:
        raise ApiError(400, f"best_of={best_of} must be >= n={n}.", "best_of")
    if best_of > n and req.stream:
        raise ApiError(400, "best_of > n cannot be streamed: the best choices are known only at the end. Send stream=false.", "best_of")
    if req.max_tokens == 0 and not req.echo:
        raise ApiError(400, "max_tokens=0 is only allowed with echo=true (scoring the prompt); send max_tokens >= 1.", "max_tokens")
    prompts, cut = truncated(req, completion_prompts(req, served), served)
    if len(prompts) * best_of > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts x {'best_of' if req.best_of else 'n'}={best_of} is {len(prompts) * best_of} sequences; at most "
                            f"{MAX_CHOICES} per request.", "n")
    drop = req.max_tokens == 0
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    limit = 1 if drop else req.max_completion_tokens or req.max_tokens
    p = plan(req, prompts, limit, served, default_max_tokens=16, max_tokens_param=name)  # 16: OpenAI's default
    logprobs = req.logprobs
    want = logprobs if logprobs is not None else (0 if best_of > n else None)  # best_of ranks by log-probability
    echo_scores = req.echo and logprobs is not None
    top = max(req.prompt_logprobs, logprobs or 0) if req.prompt_logprobs is not None else None  # echo's alternatives are cut to logprobs
    config = replace(p.config, logprobs=want, prompt_logprobs=echo_scores or req.prompt_logprobs is not None, prompt_logprobs_top=top)
    texts = [None if was_cut else t for t, was_cut in zip(_prompt_texts(req.prompt), cut, strict=True)] if req.echo else []
    return replace(p, config=config, n=n, samples=best_of, echo=req.echo, logprobs=logprobs, drop_output=drop, prompt_texts=texts)


def _prompt_texts(prompt: Any) -> list[str | None]:
    """Each prompt as sent, for echo: OpenAI and vLLM echo a text prompt as it came, not as its tokens decode."""
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    return [p if isinstance(p, str) else None for p in prompts]


def truncated(req: Sampling, prompts: list[list[int]], served: Served) -> tuple[list[list[int]], list[bool]]:
    """vLLM's truncate_prompt_tokens: each prompt's last k tokens (-1: the engine's max_input_len); whether each was cut."""
    k = req.truncate_prompt_tokens
    if k is None:
        return prompts, [False] * len(prompts)
    if k == 0:
        raise ApiError(400, "truncate_prompt_tokens=0 would leave no prompt: send k >= 1 (the prompt's last k tokens), or -1 "
                            f"(the engine's max_input_len, {served.engine.max_input_len}).", "truncate_prompt_tokens")
    limit = served.engine.max_input_len
    if k > limit and any(len(p) > limit for p in prompts):
        raise ApiError(400, f"truncate_prompt_tokens={k} keeps more than the engine's max_input_len={limit} tokens: send at most {limit}, "
                            "or -1.", "truncate_prompt_tokens", "context_length_exceeded")
    k = limit if k == -1 else k
    return [p[-k:] for p in prompts], [len(p) > k for p in prompts]


def refuse_unsupported_fields(req: Sampling) -> None:
    """vLLM's extensions this server does not implement: refused by name unless neutral (dropped, they would change
    nothing without a word)."""
    for name, (neutral, instead) in UNSUPPORTED_VLLM_FIELDS.items():
        value = getattr(req, name)
        if value is not None and value != neutral:
            raise ApiError(400, f"{name} (a vLLM extension) is not supported by this server{instead}.", name)


def same_limit(req: CompletionRequest | ChatCompletionRequest) -> None:
    """max_tokens and max_completion_tokens (OpenAI's newer name) may both come, if they agree."""
    if req.max_tokens is not None and req.max_completion_tokens is not None and req.max_tokens != req.max_completion_tokens:
        raise ApiError(400, "max_tokens and max_completion_tokens differ; send one of them.", "max_completion_tokens")


def chat_plan(req: ChatCompletionRequest, served: Served) -> Plan:
    refuse_unsupported_fields(req)
    same_limit(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true.", "top_logprobs")
    tools = plan_tools(req, served)
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    prompts, _ = truncated(req, [chat_prompt(req, served, tools)], served)
    p = plan(req, prompts, req.max_completion_tokens or req.max_tokens, served, None, name, tools=tools)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    config = replace(p.config, logprobs=logprobs, prompt_logprobs=req.prompt_logprobs is not None, prompt_logprobs_top=req.prompt_logprobs)
    return replace(p, config=config, n=req.n, samples=req.n, logprobs=logprobs, tools=tools)


def plan(req: Sampling, prompts: list[list[int]], max_tokens: int | None, served: Served, default_max_tokens: int | None,
         max_tokens_param: str = "max_tokens", tools: ToolPlan | None = None) -> Plan:
    engine = served.engine
    where = "prompt" if isinstance(req, CompletionRequest) else "messages"
    checked = []
    for i, prompt_ids in enumerate(prompts):
        what = "the prompt" if len(prompts) == 1 else f"prompt {i}"
        try:
            checked.append(engine.validate(prompt_ids, what))
        except SpecdecError as err:
            code = "context_length_exceeded" if len(prompt_ids) > engine.max_input_len else None
            raise ApiError(400, str(err), where, code) from None
    longest = max(len(ids) for ids in checked)
    room = served.max_seq_len - longest
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room) if default_max_tokens else room
    if max_tokens > room or room <= 0:
        raise ApiError(
            400,
            f"this model's maximum context length is {served.max_seq_len} tokens (the engine's max_seq_len), but you requested "
            f"{longest + max_tokens} tokens ({longest} in the prompt, {max_tokens} for the completion). Reduce {max_tokens_param} or the prompt.",
            max_tokens_param,
            "context_length_exceeded",
        )
    method, k = speculation(req, served)
    stops = stop_strings(req, served)
    # no seed (or vLLM's -1, "random"): a fresh one per request
    seed = req.seed if req.seed is not None and req.seed != -1 else secrets.randbits(63)
    sampling = SamplingConfig(
        temperature=1.0 if req.temperature is None else req.temperature,  # OpenAI's default
        # top_p 0 is OpenAI's nucleus of the most probable token alone (SamplingConfig's 0 is TensorRT-LLM's "off")
        top_k=1 if req.top_p == 0 else max(req.top_k or 0, 0),
        top_p=1.0 if req.top_p is None else req.top_p,
        random_seed=seed % 2**64,  # OpenAI takes any 64-bit seed; numpy's take non-negative ones
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=logit_bias(req, engine.target.vocab_size),
        allowed_token_ids=allowed_token_ids(req, engine.vocab_limit or engine.target.vocab_size),
        bad_words_ids=bad_words_ids(req, served),
    )
    proposer = engine.proposers.get(method)
    tree = proposer.tree if proposer is not None and isinstance(k, int) and k > 0 else None
    if tree is not None:  # what the request runs with: the tree cut to k nodes
        k = min(k, len(tree))
    elif isinstance(proposer, OwnDrafter) and isinstance(k, int):  # a chain: at most one draft per Medusa head / module depth
        k = min(k, proposer.max_chain_len)
    grammar = None
    spec, param = tools.grammar if tools is not None and tools.grammar is not None else grammar_spec(req)
    if spec is not None:
        if req.allowed_token_ids:
            raise ApiError(400, f"allowed_token_ids cannot be combined with structured outputs or tools ({param}): the two together could "
                                "leave no token; constrain the output with one of them.", "allowed_token_ids")
        grammar = served.grammar(spec, param)
    min_tokens = req.min_tokens or 0
    if min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens={min_tokens} is larger than {max_tokens_param}={max_tokens}.", "min_tokens")
    try:
        config = GenerationConfig(
            max_output_len=max_tokens,
            min_output_len=min_tokens,
            sampling=sampling,
            end_ids=(() if req.ignore_eos and grammar is None else served.end_ids) + stop_token_ids(req, engine.target.vocab_size),
            method=method,
            draft_len=k,  # 0 for TARGET_ONLY (speculation)
            grammar=grammar,
        )
    except SpecdecError as err:  # what the fields say together (allowed ids that are all bad words): a 400, never a 500
        raise ApiError(400, str(err), "allowed_token_ids" if "allowed_token_ids" in str(err) else None) from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.prompt_logprobs is not None and req.stream:
        raise ApiError(400, "prompt_logprobs are returned with the whole response: send stream=false (or, on /v1/completions, echo with "
                            "logprobs, which streams the prompt's scores in the first chunk).", "prompt_logprobs")
    return Plan(checked, config, stops, method, k, req.stream, include_usage, grammar_param=param if grammar is not None else None,
                include_stop=req.include_stop_str_in_output, prompt_logprobs=req.prompt_logprobs)


def inside_vocabulary(ids: Sequence[int], vocab: int, param: str) -> tuple[int, ...]:
    """A request's token ids, each once (in order), or a 400 naming ``param`` for the first outside [0, vocab)."""
    for t in ids:
        if t >= vocab:
            raise ApiError(400, f"{param} has token id {t}, outside the vocabulary [0, {vocab}).", param)
    return tuple(dict.fromkeys(ids))


def stop_token_ids(req: Sampling, vocab: int) -> tuple[int, ...]:
    """vLLM's stop_token_ids: the request ends at any of them (the id kept in token_ids as an end id is, its text left out
    unless include_stop_str_in_output; ignore_eos leaves them on, as vLLM's does)."""
    return inside_vocabulary(req.stop_token_ids or (), vocab, "stop_token_ids")


def allowed_token_ids(req: Sampling, vocab: int) -> tuple[int, ...]:
    return inside_vocabulary(req.allowed_token_ids or (), vocab, "allowed_token_ids")


def bad_words_ids(req: Sampling, served: Served) -> tuple[tuple[int, ...], ...]:
    """vLLM's bad_words: each word tokenized as it starts a text and after a space, both banned (vLLM keeps the second only
    where it is as many tokens as the first); a word's last token is banned where its other tokens end the prompt + output
    (vLLM reads the output alone)."""
    if not req.bad_words:
        return ()
    if served.tokenizer is None:
        raise ApiError(400, "bad_words are tokenized with the model's tokenizer and the engine has none: restart with --tokenizer_dir, or "
                            "ban token ids with logit_bias (-100).", "bad_words")
    words: dict[tuple[int, ...], None] = {}
    for word in req.bad_words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(served.tokenizer.encode(text, add_special_tokens=False)) if text.strip() else ()
            if ids:
                words[ids] = None
    if not words:
        raise ApiError(400, "bad_words holds only whitespace: nothing to ban.", "bad_words")
    return tuple(words)


def logit_bias(req: Sampling, vocab: int) -> tuple[tuple[int, float], ...]:
    if not req.logit_bias:
        return ()
    bias = [(int(key), float(value)) for key, value in req.logit_bias.items()]  # ("7" and "07": both kept, as before)
    inside_vocabulary([t for t, _ in bias], vocab, "logit_bias")
    return tuple(bias)


def grammar_spec(req: Sampling) -> tuple[GrammarSpec | None, str]:
    """response_format / structured_outputs -> what the output is constrained to (one of them at most)."""
    fmt, so = req.response_format, req.structured_outputs
    if fmt is not None and fmt.type != "text" and so is not None:
        raise ApiError(400, "send either response_format or structured_outputs, not both.", "structured_outputs")
    if so is not None:
        if so.json_ is not None:
            return GrammarSpec("json_schema", so.json_), "structured_outputs.json"
        if so.regex is not None:
            return GrammarSpec("regex", so.regex), "structured_outputs.regex"
        if so.choice is not None:
            return GrammarSpec("choice", so.choice), "structured_outputs.choice"
        return GrammarSpec("lark", so.grammar), "structured_outputs.grammar"
    if fmt is None or fmt.type == "text":
        return None, ""
    if fmt.type == "json_object":
        return GrammarSpec("json_object"), "response_format"
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, 'response_format type json_schema needs "json_schema": {"name": ..., "schema": {...}}.', "response_format.json_schema")
    return GrammarSpec("json_schema", fmt.json_schema.schema_), "response_format.json_schema.schema"


def speculation(req: Sampling, served: Served) -> tuple[str, int | str]:
    """The request's speculation method and drafts per round, checked against what the server loaded."""
    spec = req.speculative
    engine = served.engine
    method = spec.method if spec and spec.method is not None else engine.speculation.method
    if method not in served.methods:
        raise ApiError(
            400,
            f"speculative.method {method!r} is not loaded on this server (loaded: {', '.join(served.methods)}); start specdec-serve with "
            f"{get_method(method).loaded_by} to serve it.",
            "speculative.method",
        )
    k = spec.num_draft_tokens if spec and spec.num_draft_tokens is not None else None
    if method == TARGET_ONLY:
        if k not in (None, 0):
            drafting = method_names()[1:]
            raise ApiError(400, f"speculative.num_draft_tokens={k!r} needs a method that drafts ({', '.join(drafting[:-1])} or {drafting[-1]}), "
                           f"not {TARGET_ONLY!r}.", "speculative.num_draft_tokens")
        return method, 0
    if k is None:
        k = served.draft_lens.get(method, engine.speculation.draft_len if method == engine.speculation.method else AUTO)
    if k != AUTO:
        try:
            check_draft_len(engine.target.engine, k, "speculative.num_draft_tokens")
        except SpecdecError as err:
            raise ApiError(400, str(err), "speculative.num_draft_tokens") from None
        cap = engine.proposers[method].max_draft_len  # a limit of the proposer's own config: n-gram's and suffix's have one
        if cap is not None and k > cap:
            m = get_method(method)
            source = m.limit_name or f"{method}'s max_draft_len"
            raise ApiError(400, f"speculative.num_draft_tokens={k} is larger than {source}={cap} ({m.flag}); use <= {cap}.",
                           "speculative.num_draft_tokens")
    return method, k


def stop_strings(req: Sampling, served: Served) -> tuple[str, ...]:
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    stops = tuple(s for s in stops if s)
    if stops and served.tokenizer is None:
        raise ApiError(400, "stop strings are matched on text and the engine has no tokenizer: restart with --tokenizer_dir.", "stop")
    return stops
