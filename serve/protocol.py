"""The request bodies the server accepts: OpenAI's fields, plus a few extensions.

The schema is strict enough to describe what is accepted (ranges, lengths,
enums): it is the OpenAPI document at ``/openapi.json``, and schemathesis
fuzzes the server against it (tests/serve/test_serve_fuzz.py). Types are
checked strictly (a string where a number belongs is a 400, never coerced).
Checks that need the loaded engines (model name, context length, token ids in
the vocabulary, speculation, a grammar that compiles) are made by
``serve/params.py`` and answered with 400. Unknown fields are ignored, as
OpenAI-compatible servers do; ``suffix`` is refused by name when used.

Extensions (ignored by clients that do not know them):
    "speculative": {"method": "none" | "draft" | "ngram" | "suffix" | "medusa" | "eagle" | "peagle", "num_draft_tokens": k | "auto"}
    "ignore_eos": true        decode max_tokens tokens whatever the model says (benchmarks)
    "top_k", "min_p", "repetition_penalty", "stop_token_ids"     as vLLM accepts them
    "min_tokens", "allowed_token_ids", "bad_words", "include_stop_str_in_output", "truncate_prompt_tokens", "prompt_logprobs"   as vLLM's
    chat: "chat_template_kwargs", "add_generation_prompt", "continue_final_message"   as vLLM's
    vLLM's other sampling extensions (guided_json, use_beam_search, length_penalty, ...: UNSUPPORTED_VLLM_FIELDS) are
    refused by name when set to anything but their neutral value: dropped, they would change nothing without a word
    "structured_outputs": {"json": schema} | {"regex": "..."} | {"choice": [...]} | {"grammar": "lark"}   as vLLM's
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from ..runtime.methods import method_names

METHODS = method_names()  # what speculative.method may name: none and the methods registered when the server starts

STRICT = ConfigDict(strict=True, extra="ignore")
CLOSED = ConfigDict(strict=True, extra="forbid")  # a typo in an extension must not pass silently

INT64 = 2**63 - 1
MAX_LOGPROBS = 20  # top alternatives per token (vLLM's default max_logprobs; OpenAI's chat takes 20 too)
MAX_N = 128  # choices per prompt (OpenAI's limit)
MAX_BEST_OF = 20
MAX_PROMPTS = 256
MAX_STOPS = 16
MAX_TEXT = 1_000_000  # characters in a string field that is not tokenized as a prompt (a description, a stop string's list ...)
MAX_BIAS = 1024  # logit_bias entries
MAX_STOP_IDS = 64  # stop_token_ids entries
MAX_ALLOWED = 1 << 20  # allowed_token_ids entries (a vocabulary's worth)
MAX_BAD_WORDS = 1024

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
# A prompt's length has no limit of its own: the body limit (--max_request_bytes) bounds it, and the engine's
# max_input_len refuses it in tokens (serve/params.py), which is what a client needs to hear
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
PromptText = str
Text = Annotated[str, Field(max_length=MAX_TEXT)]
Prompt = (PromptText | TokenIds | Annotated[list[PromptText], Field(min_length=1, max_length=MAX_PROMPTS)]
          | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)])
Stop = Annotated[str, Field(max_length=1000)] | Annotated[list[Annotated[str, Field(max_length=1000)]], Field(max_length=MAX_STOPS)] | None
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
JsonSchema = dict[str, Any]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class Speculative(BaseModel):
    """The per-request speculation extension. Unknown keys are refused: a typo must not pass silently."""

    model_config = CLOSED
    method: Literal[METHODS] | None = None  # a method runtime/methods.py registers; default: the server's
    num_draft_tokens: Annotated[int, Field(ge=0, le=1024)] | Literal["auto"] | None = None  # default: the server's


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")] = "response"
    description: Text | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's extension: exactly one of these."""

    model_config = CLOSED
    json_: JsonSchema | None = Field(None, alias="json")
    regex: Annotated[str, Field(min_length=1, max_length=100000)] | None = None
    choice: Annotated[list[Annotated[str, Field(max_length=10000)]], Field(min_length=1, max_length=1024)] | None = None
    grammar: Annotated[str, Field(min_length=1, max_length=100000)] | None = None

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputs:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar")
        return self


class Sampling(BaseModel):
    """What completions and chat share."""

    model_config = STRICT
    model: Annotated[str, Field(max_length=256)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=2 ** 31 - 1)] | None = None  # -1 or 0: off
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: Annotated[int, Field(ge=-2 ** 63, le=INT64)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    logit_bias: Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], Annotated[float, Field(ge=-100.0, le=100.0)]],
                          Field(max_length=MAX_BIAS)] | None = None
    user: Annotated[str, Field(max_length=1000)] | None = None
    ignore_eos: bool = False
    speculative: Speculative | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_IDS)] | None = None  # vLLM's: any of them ends the request
    # vLLM's, as vLLM reads them (serve/params.py)
    min_tokens: Annotated[int, Field(ge=0, le=INT64)] | None = None  # no end id, stop id or stop string before this many tokens
    include_stop_str_in_output: bool = False  # the stop string ends the text, instead of being cut off
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1, max_length=MAX_ALLOWED)] | None = None  # only these are sampled
    bad_words: Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]], Field(max_length=MAX_BAD_WORDS)] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64)] | None = None  # keep the prompt's last k tokens; -1: max_input_len
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None  # vLLM's: each prompt token's, with k alternatives
    # vLLM's extensions not implemented here (serve/params.py refuses them unless neutral); typed loosely: the refusal names them
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    typical_p: float | None = None


# vLLM's extension -> its neutral value (sent by clients that fill in defaults: served as nothing), and what to use here
UNSUPPORTED_VLLM_FIELDS: dict[str, tuple[Any, str]] = {
    "guided_json": (None, '; send structured_outputs {"json": schema} or response_format'),
    "guided_regex": (None, '; send structured_outputs {"regex": "..."}'),
    "guided_choice": (None, '; send structured_outputs {"choice": [...]}'),
    "guided_grammar": (None, '; send structured_outputs {"grammar": "..."}'),
    "use_beam_search": (False, ""),
    "length_penalty": (1.0, ""),
    "typical_p": (1.0, ""),
}


class CompletionRequest(Sampling):
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=0, le=INT64)] | None = None  # 0: only with echo (score the prompt)
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT64)] | None = None  # chat's newer name, taken here too
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_BEST_OF)] | None = None
    suffix: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Annotated[str, Field(max_length=64)]
    text: PromptText | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # tool_calls, tool_call_id, reasoning, ...: passed to the template as sent
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: PromptText | Annotated[list[ContentPart], Field(max_length=1024)] | None = None
    name: Annotated[str, Field(max_length=256)] | None = None

    @model_validator(mode="after")
    def _content(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":  # as OpenAI: only an assistant message (with tool_calls) may have none
            raise ValueError(f"a {self.role} message needs content (only an assistant message, with tool_calls, may leave it out)")
        return self


class FunctionDefinition(BaseModel):
    model_config = STRICT
    name: FunctionName
    description: Text | None = None
    parameters: JsonSchema | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class Conversation(BaseModel):
    """A conversation and how the chat template renders it: what /v1/chat/completions and /tokenize share."""

    model_config = STRICT
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=10_000)]
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's: how the chat template renders the conversation
    chat_template_kwargs: Annotated[dict[Annotated[str, Field(max_length=256)], Any], Field(max_length=64)] | None = None
    add_generation_prompt: bool = True  # end with the assistant's turn opened (false: the conversation as it stands)
    continue_final_message: bool = False  # the model continues the final (assistant) message, as transformers cuts it


class ChatCompletionRequest(Sampling, Conversation):
    max_tokens: Annotated[int, Field(ge=1, le=INT64)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT64)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None


class TokenizeCompletionRequest(BaseModel):
    """vLLM's /tokenize, a prompt: its token ids as /v1/completions reads it."""

    model_config = STRICT
    model: Annotated[str, Field(max_length=256)] | None = None
    prompt: PromptText
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(Conversation):
    """vLLM's /tokenize, a conversation: its token ids as /v1/chat/completions renders it (the template writes the special
    tokens: none are added by default)."""

    model: Annotated[str, Field(max_length=256)] | None = None
    response_format: ResponseFormat | None = None  # (read by the tools' plan; no grammar is compiled here)
    structured_outputs: StructuredOutputs | None = None
    add_special_tokens: bool = False
    return_token_strs: bool = False


# the union's member tags (messages, prompt): pydantic puts them in error locations, where they name no field
TOKENIZE_TAGS = ("tokenize-messages", "tokenize-prompt")


def _tokenize_form(body: Any) -> str:
    return TOKENIZE_TAGS[0] if isinstance(body, dict) and "messages" in body else TOKENIZE_TAGS[1]


# /tokenize's body: a conversation when it has messages, else a prompt (app.py drops TOKENIZE_TAGS from error locations: errors
# name the field alone)
TokenizeRequest = Annotated[Annotated[TokenizeChatRequest, Tag(TOKENIZE_TAGS[0])] | Annotated[TokenizeCompletionRequest, Tag(TOKENIZE_TAGS[1])],
                            Discriminator(_tokenize_form)]


class DetokenizeRequest(BaseModel):
    """vLLM's /detokenize: token ids -> text."""

    model_config = STRICT
    model: Annotated[str, Field(max_length=256)] | None = None
    tokens: TokenIds


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every refusal: OpenAI's shape."""

    error: ErrorDetail
