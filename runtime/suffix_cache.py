"""The global suffix cache: finished responses, searchable by suffix, bounded in memory.

One per engine (so one per ``specdec-serve`` process). Responses join when
their request ends; a lookup that drafts from a response marks it used. When
the cache holds more than ``max_tokens`` tokens or ``max_responses``
responses, the least recently used responses leave until it is back under
90% of both caps (least recently used: added or drafted from longest ago), and
the store is rebuilt from the rest, so a rebuild happens once per tenth of the
cap at most. Memory is ~4 bytes a token for the tokens plus 16 for the index:
about 20 MB at the default cap of one million tokens.

A file of earlier responses seeds it (``load``): JSON lines, each
``{"token_ids": [..]}`` or ``{"text": ".."}`` (encoded with the target's
tokenizer), or a bare JSON string of text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..formats.errors import RequestError
from ..formats.jsonl import json_lines
from .suffix_index import SpecParams, SuffixDraft, TokenStore, best_draft

LOW_WATER = 0.9  # evict down to this share of the caps


class ResponseCache:
    def __init__(self, max_tokens: int = 1_000_000, max_responses: int = 10_000):
        if max_tokens < 1 or max_responses < 1:
            raise RequestError(f"the suffix cache needs max_tokens >= 1 and max_responses >= 1, got {max_tokens} and {max_responses}.")
        self.max_tokens = max_tokens
        self.max_responses = max_responses
        self.store = TokenStore()
        self.starts: list[int] = []  # each response's first position in the store, in store order
        self.lengths: list[int] = []
        self.used: list[int] = []  # the clock when each was added or last drafted from
        self.num_tokens = 0
        self.clock = 0
        self.evicted = 0  # responses evicted so far
        self._starts_array: np.ndarray | None = None  # self.starts as an array, made again after a change

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def nbytes(self) -> int:
        """Bytes held: the store's array and its index."""
        return self.store.nbytes

    def add(self, tokens: Sequence[int]) -> None:
        tokens = np.asarray(tokens, np.int32)[-self.max_tokens :]  # a response longer than the cap keeps its end
        if not len(tokens):
            return
        self.clock += 1
        self._append(tokens, self.clock)
        if self.num_tokens > self.max_tokens or len(self) > self.max_responses:
            self._evict()

    def _append(self, tokens: np.ndarray, used: int, index: bool = True) -> None:
        self._starts_array = None
        self.starts.append(self.store.size)
        self.lengths.append(len(tokens))
        self.used.append(used)
        self.num_tokens += len(tokens)
        self.store.append(tokens, end=True, index=index)

    def _evict(self) -> None:
        """Drop least recently used responses until under LOW_WATER of both caps, then rebuild."""
        keep = set(range(len(self)))
        total = self.num_tokens
        for i in sorted(keep, key=lambda i: self.used[i]):
            if total <= LOW_WATER * self.max_tokens and len(keep) <= LOW_WATER * self.max_responses:
                break
            keep.discard(i)
            total -= self.lengths[i]
        kept = sorted(keep)
        self.evicted += len(self) - len(kept)
        old = self.store.tokens
        rows = [(old[self.starts[i] : self.starts[i] + self.lengths[i]].copy(), self.used[i]) for i in kept]
        self.store, self.starts, self.lengths, self.used, self.num_tokens = TokenStore(), [], [], [], 0
        self._starts_array = None
        for tokens, used in rows:
            self._append(tokens, used, index=False)
        self.store.reindex()  # once for the whole rebuild

    def response(self, i: int) -> list[int]:
        """The i-th cached sequence (store order: oldest surviving first): a response, behind its prompt's last
        tokens when the proposer caches them (SuffixConfig.cached_prompt_tokens)."""
        return self.store.tokens[self.starts[i] : self.starts[i] + self.lengths[i]].tolist()

    def speculate(self, context: Sequence[int], limit: int, params: SpecParams, tree: bool) -> SuffixDraft:
        """The cache's best draft for the context (``touch`` it if it is used)."""
        return best_draft(self.store, context, limit, params, tree)

    def touch(self, draft: SuffixDraft) -> None:
        """A draft from this cache was proposed: the responses it drew from stay longer."""
        if len(draft) and draft.ends is not None:
            self.clock += 1
            if self._starts_array is None:  # searchsorted on the list would convert it on every draft
                self._starts_array = np.asarray(self.starts)
            for i in set(np.searchsorted(self._starts_array, draft.ends, side="right").tolist()):
                self.used[i - 1] = self.clock

    def load(self, path: str | Path, encode: Callable[[str], list[int]] | None = None) -> int:
        """Add the responses of a JSON-lines file; returns how many. Bad input: one line saying where."""
        p = Path(path)
        if not p.is_file():
            raise RequestError(f"the suffix cache seed file {p} does not exist; expected JSON lines of {{\"token_ids\": [..]}} or {{\"text\": "
                               f"\"..\"}}.")
        rows: list[list[int]] = []
        for where, item in json_lines(p):  # not UTF-8, not JSON, too deep, a lone surrogate: one line each
            text = item if isinstance(item, str) else item.get("text") if isinstance(item, dict) else None
            ids = item.get("token_ids") if isinstance(item, dict) else None
            if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in ids):  # the store holds int32
                rows.append(ids)
            elif isinstance(text, str) and encode is not None:
                rows.append(encode(text))
            elif isinstance(text, str):
                raise RequestError(f"{where} holds text, but this engine has no tokenizer to encode it; give {{\"token_ids\": [..]}} instead.")
            else:
                raise RequestError(f"{where} is neither {{\"token_ids\": [ids from 0 to 2**31 - 1]}} nor {{\"text\": \"..\"}}.")
        for ids in rows:  # every line checked before any is added
            self.add(ids)
        return len(rows)
