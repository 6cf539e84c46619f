"""Structured outputs: a grammar that masks the logits, through llguidance.

    compiler = GrammarCompiler(tokenizer, vocab_size, end_ids)  # once per tokenizer (tens of ms)
    grammar = compiler.compile(GrammarSpec("json_schema", schema))  # RequestError naming what is wrong
    state = grammar.start()                                       # one per request
    state.allowed(appended)   # bool [vocab]: the tokens allowed after the committed ones + ``appended``
    state.valid_prefix(drafts)  # how many of these drafts the grammar allows, in order
    state.commit(tokens)        # tokens appended to the output
    state.done                  # the grammar is complete and takes no more tokens

Why llguidance (docs/serving-api.md#structured-outputs; its cost: docs/benchmarks.md): it
needs no torch (xgrammar needs torch, transformers and triton), it takes
context-free grammars as well as JSON Schema and regular expressions
(outlines-core takes the last two only), it computes a mask lazily per step
in tens of microseconds on the demo tokenizer, and vLLM, SGLang, llama.cpp
and TensorRT-LLM use it. It is imported here only, lazily: a host that runs
engines without the ``serve`` extra never loads it.

Speculation: the grammar's state is per request, advanced only by committed
tokens. A verified position's mask is computed after the request's own
drafts before it (``appended``), and rolled back to the committed state
afterwards; a draft token the grammar forbids ends the draft there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..formats.errors import RequestError

KINDS = ("json_object", "json_schema", "regex", "lark", "choice")
# Whitespace between JSON tokens: none, as OpenAI's outputs have. A flexible one lets a model that has lost
# its way emit whitespace forever inside a valid prefix.
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to.

    kind: json_object (any JSON object) | json_schema (``source``: the schema, a dict) | regex | lark
    (llguidance's Lark dialect) | choice (``source``: a list of strings, the output is exactly one of them).
    """

    kind: str
    source: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RequestError(f"unknown grammar kind {self.kind!r}; expected one of {', '.join(KINDS)}.")


def _llguidance():
    try:
        import llguidance
    except ImportError as err:
        raise RequestError(f"structured outputs need llguidance: pip install 'specdec[serve]' ({err}).") from None
    return llguidance


class GrammarCompiler:
    """llguidance's view of one tokenizer, shared by every request that uses it."""

    def __init__(self, tokenizer_json: str, vocab_size: int, end_ids: Sequence[int]):
        llg = _llguidance()
        self.vocab_size = int(vocab_size)  # the engine's logits width; ids past the tokenizer's are never allowed
        self.end_ids = tuple(int(t) for t in end_ids)
        eos = list(self.end_ids) or None
        try:
            self.tokenizer = llg.LLTokenizer(tokenizer_json, n_vocab=self.vocab_size, eos_token=eos)
        except Exception as err:  # llguidance raises ValueError/RuntimeError on tokenizers it cannot read
            raise RequestError(f"llguidance cannot read this tokenizer for structured outputs: {err}") from None
        self._llg = llg

    def source(self, spec: GrammarSpec) -> str:
        """The spec as an llguidance grammar string (not yet checked)."""
        M = self._llg.LLMatcher
        try:
            if spec.kind == "json_object":
                return M.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
            if spec.kind == "json_schema":
                return M.grammar_from_json_schema(spec.source, defaults=JSON_OPTIONS)
            if spec.kind == "regex":
                return M.grammar_from_regex(spec.source)
            if spec.kind == "lark":
                return M.grammar_from_lark(spec.source)
            return self._llg.grammar_from("choice", json.dumps(list(spec.source)))
        except (ValueError, TypeError) as err:
            raise RequestError(f"the {spec.kind} is not valid: {err}") from None

    def compile(self, spec: GrammarSpec) -> "Grammar":
        source = self.source(spec)
        is_error, messages = self._llg.LLMatcher.validate_grammar_with_warnings(source, self.tokenizer)
        if is_error:
            first = " ".join(messages[0].split()) if messages else "unknown error"
            raise RequestError(f"the {spec.kind} is not valid: {first[:400]}")
        return Grammar(self, source, spec)


class Grammar:
    """A checked grammar; ``start()`` makes one request's state."""

    def __init__(self, compiler: GrammarCompiler, source: str, spec: GrammarSpec):
        self.compiler, self.source, self.spec = compiler, source, spec

    def start(self) -> "GrammarState":
        matcher = self.compiler._llg.LLMatcher(self.compiler.tokenizer, self.source, log_level=0)
        if matcher.is_error():
            raise RequestError(f"the {self.spec.kind} is not valid: {matcher.get_error()}")
        return GrammarState(matcher, self.compiler.vocab_size, self.compiler.end_ids)


class GrammarState:
    """One request's position in its grammar: the committed tokens plus a speculative tail."""

    def __init__(self, matcher, vocab_size: int, end_ids: tuple[int, ...]):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.end_ids = end_ids
        self.tail: list[int] = []  # consumed past the committed tokens (drafts being verified)
        self._bits = np.zeros((vocab_size + 31) // 32, np.int32)

    def _seek(self, appended: Sequence[int]) -> bool:
        """Put the matcher at committed + appended; False if the grammar forbids that sequence."""
        appended = [int(t) for t in appended]
        same = 0
        for a, b in zip(self.tail, appended):
            if a != b:
                break
            same += 1
        if same < len(self.tail):
            self.matcher.rollback(len(self.tail) - same)
            del self.tail[same:]
        for t in appended[same:]:
            if self.matcher.validate_tokens([t]) != 1:
                return False
            self.matcher.consume_token(t)
            self.tail.append(t)
        return True

    def allowed(self, appended: Sequence[int] = ()) -> np.ndarray:
        """bool [vocab]: the tokens the grammar allows after the committed tokens and ``appended``."""
        if not self._seek(appended):
            if not self.matcher.is_stopped():
                raise RequestError("internal: a position past a token the grammar forbids was asked for its mask.")
            mask = np.zeros(self.vocab_size, bool)  # past the grammar's end (a draft ran on): the request ends there anyway
        else:
            self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab_size].astype(bool)
        if not mask.any():  # complete, or (defensive) a matcher in an error state: only an end token
            ends = [t for t in self.end_ids if t < self.vocab_size]
            mask[ends if ends else slice(None)] = True  # no end token: anything, since the request ends here and is cut
        return mask

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (a chain after the committed tokens) the grammar allows, in order."""
        self._seek(())
        return int(self.matcher.validate_tokens([int(t) for t in tokens])) if len(tokens) else 0

    def commit(self, tokens: Sequence[int]) -> None:
        """``tokens`` joined the output: they become the committed state."""
        tokens = [int(t) for t in tokens]
        n = self.valid_prefix(tokens)  # rolls the speculative tail back first
        if n < len(tokens) and not (self.done and n == len(tokens) - 1):
            raise RequestError(f"internal: the output token {tokens[n]} is not allowed by the request's grammar.")
        self.matcher.consume_tokens(tokens[:n])

    @property
    def done(self) -> bool:
        """Complete: the grammar takes no more tokens (beyond an end-of-sequence token)."""
        return bool(self.matcher.is_stopped())
