"""Structured outputs: a grammar that masks the logits, through llguidance.

    compiler = GrammarCompiler(tokenizer, vocab_size, end_ids)  # once per tokenizer (tens of ms)
    grammar = compiler.compile(GrammarSpec("json_schema", schema))  # RequestError naming what is wrong
    state = grammar.start()                                       # one per request
    state.allowed(appended)   # bool [vocab]: the tokens allowed after the committed ones + ``appended``
    state.valid_prefix(drafts)  # how many of these drafts the grammar allows, in order
    state.commit(tokens)        # tokens appended to the output
    state.done                  # the grammar is complete and takes no more tokens
    state.failed(output)        # why llguidance cannot go on after exactly these output tokens, or None

What no string can satisfy is refused at ``compile`` (a RequestError: the
server's 400) where llguidance can tell up front: a schema or grammar it
rejects, no token that can begin an output (a regex that matches nothing),
or llguidance giving up on the tokens every output must begin with (a $ref
cycle or a rule that always recurses, with no finite output). Where it can
only tell later, on one output's path, the state records where it gave up
(``failed``) and the request ends there with finish_reason "error", never
with an end token picked from an empty mask (runtime/round.py).

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats.errors import RequestError

PROBE_FORCED = 64  # forced tokens the compile-time probe follows (each a consume: microseconds)
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
            raise RequestError(f"the {spec.kind} is not valid: {one_line(str(err))}") from None
        except RecursionError:  # a schema nested past Python's recursion limit (the server refuses bodies past 64 levels first)
            raise RequestError(f"the {spec.kind} is nested too deeply to read.") from None

    def compile(self, spec: GrammarSpec) -> Grammar:
        source = self.source(spec)
        is_error, messages = self._llg.LLMatcher.validate_grammar_with_warnings(source, self.tokenizer)
        if is_error:
            raise RequestError(f"the {spec.kind} is not valid: {one_line(messages[0] if messages else 'unknown error')}")
        grammar = Grammar(self, source, spec)
        self._probe(grammar)
        return grammar

    def _probe(self, grammar: Grammar) -> None:
        """Refuse what every request of ``grammar`` would fail on: no token can begin an output, or llguidance gives up
        on the tokens every output must begin with (its forced tokens: a $ref cycle or an always-recursive rule makes
        them endless). Costs a mask and up to PROBE_FORCED consumes, once per grammar (the server caches grammars)."""
        kind = grammar.spec.kind
        m = grammar.matcher()
        bits = np.zeros((self.vocab_size + 31) // 32, np.int32)
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if m.is_error():
            raise RequestError(f"no output satisfies the {kind}: no token of this model's vocabulary can begin one "
                               f"(llguidance: {one_line(m.get_error())}).")
        forced = m.compute_ff_tokens()[:PROBE_FORCED]
        for i, t in enumerate(forced):
            if not m.consume_token(t) or m.is_error():
                text = self.tokenizer.decode_str(forced[: i + 1])
                raise RequestError(f"no output satisfies the {kind}: every output must begin {text[:80]!r} and llguidance gives up "
                                   f"there ({one_line(m.get_error())}); a $ref cycle or a rule that always recurses leaves no finite output.")


class Grammar:
    """A checked grammar; ``start()`` makes one request's state."""

    def __init__(self, compiler: GrammarCompiler, source: str, spec: GrammarSpec):
        self.compiler, self.source, self.spec = compiler, source, spec

    def matcher(self):
        """A fresh llguidance matcher at the start of the output."""
        matcher = self.compiler._llg.LLMatcher(self.compiler.tokenizer, self.source, log_level=0)
        if matcher.is_error():
            raise RequestError(f"the {self.spec.kind} is not valid: {one_line(matcher.get_error())}")
        return matcher

    def start(self) -> GrammarState:
        return GrammarState(self)


class GrammarState:
    """One request's position in its grammar: the committed tokens plus a speculative tail.

    llguidance's matcher stops for good when it gives up (its item limits: a grammar whose text never ends). A
    speculative path may lead there while the output does not follow it, so the state records the path it gave up
    after (``failed``) and starts a fresh matcher at the committed tokens: the request ends only if its output
    reaches that path.
    """

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.matcher = grammar.matcher()
        self.vocab_size = grammar.compiler.vocab_size
        self.end_ids = grammar.compiler.end_ids
        self.committed: list[int] = []
        self.tail: list[int] = []  # consumed past the committed tokens (drafts being verified)
        self.failure: tuple[tuple[int, ...], str] | None = None  # (output tokens after which llguidance gave up, why)
        self._bits = np.zeros((self.vocab_size + 31) // 32, np.int32)

    def _give_up(self, appended: Sequence[int]) -> None:
        """llguidance gave up after committed + appended: remember it, and start again at the committed tokens."""
        path = (*self.committed, *appended)
        why = one_line(self.matcher.get_error() or "it stopped")
        self.failure = (path, f"llguidance gave up on the request's {self.grammar.spec.kind} after {len(path)} output tokens ({why}); "
                              "a $ref cycle or a rule that always recurses can leave no finite output.")
        self._restart()

    def _restart(self) -> None:
        """A fresh matcher at the committed tokens (llguidance's matcher cannot leave its error state)."""
        self.matcher = self.grammar.matcher()
        self.tail = []
        if self.committed and (not self.matcher.consume_tokens(self.committed) or self.matcher.is_error()):  # it took them before
            raise RequestError(f"internal: llguidance no longer accepts the request's own output: {one_line(self.matcher.get_error())}")

    def failed(self, output: Sequence[int]) -> str | None:
        """Why the output cannot go on after exactly ``output`` (llguidance gave up there), or None."""
        if self.failure is None or len(self.failure[0]) != len(output) or tuple(int(t) for t in output) != self.failure[0]:
            return None
        return self.failure[1]

    def _failed_within(self, appended: Sequence[int]) -> bool:
        """llguidance gave up at committed + appended or before it."""
        if self.failure is None:
            return False
        path, n = (*self.committed, *(int(t) for t in appended)), len(self.failure[0])
        return n <= len(path) and path[:n] == self.failure[0]

    def _seek(self, appended: Sequence[int]) -> bool:
        """Put the matcher at committed + appended; False if the grammar forbids that sequence, or llguidance gives up on it."""
        appended = [int(t) for t in appended]
        same = 0
        for a, b in zip(self.tail, appended, strict=False):
            if a != b:
                break
            same += 1
        if same < len(self.tail):
            if self.matcher.rollback(len(self.tail) - same) and not self.matcher.is_error():
                del self.tail[same:]
            else:  # llguidance can fail to roll back past a state it gave up on inside (found by the fuzzer): start again
                self._restart()
                same = 0
        for i in range(same, len(appended)):
            t = appended[i]
            if self.matcher.validate_tokens([t]) != 1:
                return False
            if not self.matcher.consume_token(t) or self.matcher.is_error():
                self._give_up(appended[: i + 1])
                return False
            self.tail.append(t)
        return True

    def allowed(self, appended: Sequence[int] = ()) -> np.ndarray:
        """bool [vocab]: the tokens the grammar allows after the committed tokens and ``appended``."""
        mask = np.zeros(self.vocab_size, bool)
        if not self._seek(appended):
            if not (self.matcher.is_stopped() or self._failed_within(appended)):
                raise RequestError("internal: a position past a token the grammar forbids was asked for its mask.")
            # past the grammar's end (a draft ran on), or past where llguidance gave up: the request ends before it
        else:
            self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            if self.matcher.is_error():
                self._give_up(appended)
            else:
                mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab_size].astype(bool)
        if not mask.any():  # complete, or no mask: only an end token (the round ends a request that llguidance gave up on first)
            ends = [t for t in self.end_ids if t < self.vocab_size]
            mask[ends if ends else slice(None)] = True  # no end token: anything, since the request ends here and is cut
        return mask

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (a chain after the committed ones) the grammar allows, in order."""
        self._seek(())
        if not len(tokens):
            return 0
        n = int(self.matcher.validate_tokens([int(t) for t in tokens]))
        if self.matcher.is_error():  # (not seen: validating consumes nothing) drafts dropped; the next mask says if the output can go on
            self._restart()
            return 0
        return n

    def commit(self, tokens: Sequence[int]) -> None:
        """``tokens`` joined the output: they become the committed state (up to where llguidance gives up, if it does)."""
        for t in (int(t) for t in tokens):
            if self.failed(self.committed) is not None:
                return  # the output ends before t (runtime/round.py); nothing past the failure can be committed
            n = self.valid_prefix([t])
            if n < 1 and not self.done:
                raise RequestError(f"internal: the output token {t} is not allowed by the request's grammar.")
            if n < 1:
                continue  # an end token after a complete grammar
            if not self.matcher.consume_token(t) or self.matcher.is_error():
                self._give_up([t])  # the output holds t and ends after it (runtime/round.py)
                return
            self.committed.append(t)

    @property
    def done(self) -> bool:
        """Complete: the grammar takes no more tokens (beyond an end-of-sequence token)."""
        return bool(self.matcher.is_stopped()) and not self.matcher.is_error()


def one_line(text: str, limit: int = 300) -> str:
    """llguidance's messages span lines (a grammar excerpt, its state): the first sentence's words, on one line."""
    first = text.strip().split("\n<state>")[0]
    return " ".join(first.split())[:limit]
