"""TensorRT-LLM's config strings, parsed by a real parser (never ``eval``).

    --draft_target_model_config "[draft_len, [draft devices], [target devices], use_logits]"   e.g. "[4,[0],[1],False]"
    --ngram_config              "[max_draft_len, max_matching_ngram_size, [devices]]"          e.g. "[10,2,[0]]"

The grammar is tiny: value := int | bool | '[' value (',' value)* ']'. Integers are ASCII digits that fit
in 64 bits, and lists nest at most MAX_DEPTH deep: the forms need 2, and an input past either limit is
refused before it can reach a C long or Python's recursion limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigStringError

_TOKEN = re.compile(r"\s*(?:(\[)|(\])|(,)|(-?[0-9]+)|(True|False|true|false))")
_CLOSE = re.compile(r"\s*\]")
_NEXT = re.compile(r"\s*([,\]])")

DTM_FORM = "[draft_len, [draft device ids], [target device ids], use_logits]"
DTM_EXAMPLE = "[4,[0],[0],False]"
NGRAM_FORM = "[max_draft_len, max_matching_ngram_size, [device ids]]"
NGRAM_EXAMPLE = "[10,2,[0]]"
DEFAULT_DRAFT_LEN = 4  # drafts per round of a draft model (and an EAGLE chain) when nothing chose: at most the target's max_draft_len
MAX_DEPTH = 4
INT64 = 2**63
SHOWN_CHARS = 80  # of a malformed string, in its error message: one line of readable length


def parse_value(text: str):
    pos, value = _parse(text, 0, 0)
    if text[pos:].strip():
        raise ValueError(f"unexpected {shown(text[pos:].strip(), 20)} after the value")
    return value


def _parse(text: str, pos: int, depth: int):
    m = _TOKEN.match(text, pos)
    if not m:
        raise ValueError(f"unexpected {shown(text[pos:].strip(), 10)}" if text[pos:].strip() else "unexpected end")
    open_, close, comma, number, boolean = m.groups()
    pos = m.end()
    if number is not None:
        if len(number.lstrip("-")) > 19 or not -INT64 <= int(number) < INT64:
            raise ValueError(f"{shown(number, 20)} does not fit in 64 bits")
        return pos, int(number)
    if boolean is not None:
        return pos, boolean.lower() == "true"
    if open_ is None:
        raise ValueError(f"unexpected {(close or comma)!r}")
    if depth == MAX_DEPTH:
        raise ValueError(f"lists nested more than {MAX_DEPTH} deep")
    items = []
    m = _CLOSE.match(text, pos)
    if m:
        return m.end(), items
    while True:
        pos, item = _parse(text, pos, depth + 1)
        items.append(item)
        m = _NEXT.match(text, pos)
        if not m:
            raise ValueError("expected ',' or ']'")
        pos = m.end()
        if m.group(1) == "]":
            return pos, items


def _int_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class DraftTargetConfig:
    draft_len: int
    draft_devices: list[int]
    target_devices: list[int]
    use_logits: bool

    def __post_init__(self) -> None:  # a config built in Python gets the config string's checks (parse_draft_target_config)
        if not (_is_int(self.draft_len) and _int_list(self.draft_devices) and _int_list(self.target_devices)
                and isinstance(self.use_logits, bool)):
            raise ConfigStringError(f"{self!r}: expected DraftTargetConfig(draft_len: int, draft_devices: list[int], target_devices: "
                                    "list[int], use_logits: bool).")
        if self.draft_len < 1:
            raise ConfigStringError(f"DraftTargetConfig: draft_len must be >= 1, got {self.draft_len}.")
        if not self.draft_devices or not self.target_devices:  # (an empty list read as the default device)
            raise ConfigStringError("DraftTargetConfig: the device lists need a device id each, e.g. [0].")

    @classmethod
    def default_for(cls, max_draft_len: int) -> DraftTargetConfig:
        """What a draft engine given without --draft_target_model_config gets: DEFAULT_DRAFT_LEN drafts (fewer when the
        target verifies fewer; 1 for a target that verifies none, which the engine then refuses), device 0, argmax drafts."""
        return cls(min(DEFAULT_DRAFT_LEN, max(max_draft_len, 1)), [0], [0], False)


@dataclass(frozen=True)
class NGramConfig:
    """N-gram / prompt-lookup drafting (TensorRT-LLM's NGramDecodingConfig): the config string's three fields, and the
    pool's settings that have flags of their own (--ngram_keep_all, --ngram_use_oldest, --ngram_min_match)."""

    max_draft_len: int
    max_matching_ngram_size: int
    devices: list[int]
    is_keep_all: bool = True  # keep every earlier occurrence of a pattern, or only the newest
    is_use_oldest: bool = False  # draft from a pattern's oldest occurrence (TensorRT-LLM's default) or its newest
    min_matching_ngram_size: int = 1  # the shortest pattern matched

    def __post_init__(self) -> None:  # a config built in Python gets the config string's and the flags' checks
        if not (_is_int(self.max_draft_len) and _is_int(self.max_matching_ngram_size) and _int_list(self.devices)
                and _is_int(self.min_matching_ngram_size)):
            raise ConfigStringError(f"{self!r}: expected NGramConfig(max_draft_len: int, max_matching_ngram_size: int, devices: list[int]).")
        if self.max_draft_len < 1 or self.max_matching_ngram_size < 1:
            raise ConfigStringError(f"NGramConfig: max_draft_len and max_matching_ngram_size must be >= 1, got {self.max_draft_len} and "
                                    f"{self.max_matching_ngram_size}.")
        if not self.devices:  # (an empty list read as the default device)
            raise ConfigStringError("NGramConfig: the device list needs the target's device id, e.g. [0].")
        if not 1 <= self.min_matching_ngram_size <= self.max_matching_ngram_size:
            raise ConfigStringError(f"--ngram_min_match {self.min_matching_ngram_size}: expected a pattern length >= 1 and at most "
                                    f"max_matching_ngram_size ({self.max_matching_ngram_size}).")


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` quoted for a one-line message: repr escapes newlines and lone surrogates; a long one is cut."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def shown_value(value: object, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for a one-line message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _fail(flag: str, text: str, why: str, form: str, example: str) -> ConfigStringError:
    return ConfigStringError(f"{flag} {shown(text)} is malformed ({why}); expected {form}, e.g. {flag} \"{example}\".")


def parse_draft_target_config(text: str, flag: str = "--draft_target_model_config") -> DraftTargetConfig:
    try:
        v = parse_value(text)
    except ValueError as err:
        raise _fail(flag, text, str(err), DTM_FORM, DTM_EXAMPLE) from None
    if not (isinstance(v, list) and len(v) == 4 and _is_int(v[0]) and _int_list(v[1]) and _int_list(v[2]) and isinstance(v[3], bool)):
        raise _fail(flag, text, "wrong shape", DTM_FORM, DTM_EXAMPLE)
    if v[0] < 1:
        raise _fail(flag, text, f"draft_len must be >= 1, got {v[0]}", DTM_FORM, DTM_EXAMPLE)
    try:
        return DraftTargetConfig(v[0], v[1], v[2], v[3])
    except ConfigStringError as err:  # the config's own checks, said of the flag as given
        raise _fail(flag, text, str(err).split(": ", 1)[-1].rstrip("."), DTM_FORM, DTM_EXAMPLE) from None


def parse_ngram_config(text: str, flag: str = "--ngram_config") -> NGramConfig:
    try:
        v = parse_value(text)
    except ValueError as err:
        raise _fail(flag, text, str(err), NGRAM_FORM, NGRAM_EXAMPLE) from None
    if not (isinstance(v, list) and len(v) == 3 and _is_int(v[0]) and _is_int(v[1]) and _int_list(v[2])):
        raise _fail(flag, text, "wrong shape", NGRAM_FORM, NGRAM_EXAMPLE)
    if v[0] < 1 or v[1] < 1:
        raise _fail(flag, text, "max_draft_len and max_matching_ngram_size must be >= 1", NGRAM_FORM, NGRAM_EXAMPLE)
    try:
        return NGramConfig(v[0], v[1], v[2])
    except ConfigStringError as err:  # the config's own checks, said of the flag as given
        raise _fail(flag, text, str(err).split(": ", 1)[-1].rstrip("."), NGRAM_FORM, NGRAM_EXAMPLE) from None
