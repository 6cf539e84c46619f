"""NGram / prompt-lookup drafting: drafts copied from the sequence itself.

The pool maps a pattern (a tuple of 1..max_matching_ngram_size tokens) to the
positions right after its earlier occurrences. The draft for a position p is
``seq[p : p + max_draft_len]``, read when proposing, so a continuation that
was short when it was indexed grows with the sequence.

Lookup follows TensorRT-LLM's NGram drafter: the last
``max_matching_ngram_size`` tokens are the pattern; if the pool has no match,
try one token shorter, down to 1; if nothing matches, the row drafts nothing
this round and decodes one token normally.

Which earlier occurrence wins (TensorRT-LLM's options):
  is_keep_all=True    keep every occurrence of a pattern; False keeps only the newest
  is_use_oldest=False use the newest kept occurrence; True the oldest
Our default is the newest occurrence, where TensorRT-LLM and Hugging Face
prompt lookup take the oldest: the newest is the local context being copied,
the oldest is often an unrelated early use of a common pattern. Measured on
the demo pair (8 held-out functions, 128 tokens, best of 3): copy-heavy
prompts 1.35x over target-only with newest vs 1.11x with oldest; ordinary
prompts 1.31x vs 1.34x.

min_matching_ngram_size (ours; TensorRT-LLM falls back to 1): the shortest
pattern allowed. 1-token patterns match often and draft badly; on the demo
pair 2 or 3 gave 1.4-1.6x where 1 gave 1.3x. Default 1, TensorRT-LLM's algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ...formats.config_strings import NGRAM_FORM, NGramConfig, parse_ngram_config
from ...formats.errors import RequestError
from ..request import Request
from .base import Draft, Proposer, TargetOutput
from .method import Flag, Method, OpenContext


class NGramPool:
    """The pool of one sequence, updated incrementally."""

    def __init__(self, max_draft_len: int, max_matching_ngram_size: int, is_keep_all: bool = True, is_use_oldest: bool = False,
                 min_matching_ngram_size: int = 1):
        self.max_draft_len = max_draft_len
        self.max_ngram = max_matching_ngram_size
        self.min_ngram = max(1, min(min_matching_ngram_size, max_matching_ngram_size))
        self.is_keep_all = is_keep_all
        self.is_use_oldest = is_use_oldest
        self.tokens: list[int] = []
        self.pool: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens and index only the new tail: each new position p records
        the patterns that end right before it."""
        start = len(self.tokens)
        self.tokens.extend(map(int, new_tokens))
        seq = self.tokens
        pool, keep_all = self.pool, self.is_keep_all
        for p in range(max(start, 1), len(seq)):
            for n in range(1, min(self.max_ngram, p) + 1):
                key = tuple(seq[p - n : p])
                hits = pool.get(key) if keep_all else None  # (no empty list made for a pattern seen before)
                if hits is None:
                    pool[key] = [p]
                else:
                    hits.append(p)

    def draft(self, limit: int | None = None) -> list[int]:
        """Up to ``limit`` (default max_draft_len) tokens that followed the longest matching tail pattern."""
        k = self.max_draft_len if limit is None else min(limit, self.max_draft_len)
        seq = self.tokens
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            hits = self.pool.get(tuple(seq[-n:]))
            if hits:
                p = hits[0] if self.is_use_oldest else hits[-1]
                return seq[p : p + k]
        return []


class NGramProposer(Proposer):
    name = "ngram"
    draft_len_name = "ngram max_draft_len"  # its default draft length is its config's limit

    def __init__(self, max_draft_len: int, max_matching_ngram_size: int, is_keep_all: bool = True, is_use_oldest: bool = False,
                 min_matching_ngram_size: int = 1):
        if isinstance(min_matching_ngram_size, bool) or not isinstance(min_matching_ngram_size, int) or min_matching_ngram_size < 1:
            raise RequestError(f"--ngram_min_match {min_matching_ngram_size}: expected a pattern length >= 1 (up to max_matching_ngram_size).")
        self.max_draft_len = max_draft_len  # a request asking for more is refused (Proposer.max_draft_len)
        self.default_draft_len = max_draft_len
        self.settings = (max_draft_len, max_matching_ngram_size, is_keep_all, is_use_oldest, min_matching_ngram_size)
        self.pools: dict[str, NGramPool] = {}

    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            pool = self.pools[r.request_id] = NGramPool(*self.settings)
            pool.extend(list(r.prompt_ids) + list(r.output_ids))

    def remove(self, request_id: str) -> None:
        self.pools.pop(request_id, None)

    def room(self, request: Request) -> int:
        return self.max_draft_len

    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        drafts = [self.pools[r.request_id].draft(int(k)) for r, k in zip(requests, draft_lens, strict=True)]
        return [Draft(np.array(d, np.int64)) if d else Draft.empty() for d in drafts]  # no match: the shared empty draft

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        self.pools[request.request_id].extend(target.emitted)


# -- the method's registration (runtime/methods.py) -------------------------------------------------------------
def open_ngram(config: NGramConfig, context: OpenContext) -> NGramProposer:
    return NGramProposer(config.max_draft_len, config.max_matching_ngram_size, config.is_keep_all, config.is_use_oldest,
                         config.min_matching_ngram_size)


def ngram_from_flags(values: Mapping[str, Any]) -> NGramConfig | None:
    if not values.get("ngram_config"):
        return None
    return replace(parse_ngram_config(values["ngram_config"]), is_keep_all=values.get("ngram_keep_all", True),
                   is_use_oldest=values.get("ngram_use_oldest", False), min_matching_ngram_size=values.get("ngram_min_match", 1))


METHOD = Method(
    name="ngram",
    config=NGramConfig,
    open=open_ngram,
    proposer=NGramProposer,
    flag="--ngram_config",
    flags=(
        Flag("ngram_config", f'NGram / prompt-lookup drafting without a draft model: "{NGRAM_FORM}", e.g. "[8,2,[0]]" '
             "(max_draft_len up to the target's).", aliases=("prompt_lookup_config",)),
        Flag("ngram_keep_all", "NGram: keep every earlier occurrence of a pattern, or only the newest.", bool, True, off="ngram_keep_newest"),
        Flag("ngram_use_oldest", "NGram: when a pattern occurred more than once, draft from the oldest occurrence (TensorRT-LLM's default) or "
             "the newest (ours: the local context being copied; 1.35x vs 1.11x on copy-heavy prompts with the demo pair).", bool, False,
             off="ngram_use_newest"),
        Flag("ngram_min_match", "NGram: shortest pattern to match; TensorRT-LLM falls back down to 1 token, and 1-token matches draft badly "
             "(2-3 was faster on the demo pair).", int, 1),
    ),
    from_flags=ngram_from_flags,
    target_devices=lambda config: config.devices,
    limit_name="the n-gram pool's max_draft_len",
)
