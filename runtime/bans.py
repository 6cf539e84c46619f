"""Tokens a request may not produce at a position: the bans of its logits processing chain (runtime/logits.py).

    allowed_token_ids      only these (vLLM's allowed_token_ids)
    bad_words_ids          a sequence's last token, where the tokens before it end the history (transformers'
                           bad_words_ids, TensorRT-LLM's --bad_words, vLLM's bad_words once tokenized)
    no_repeat_ngram_size   a token that would repeat an n-gram of prompt + output (transformers', TensorRT-LLM's)
    min_output_len         the end ids, while the output is shorter (vLLM's min_tokens, transformers' min_new_tokens)

Each ban reads the position's own history, the committed output plus the drafts before the position, as
penalties do, so a banned token is banned at the same positions whatever drafted them: greedy output stays
target-only's, and sampled output keeps its distribution.

allowed_token_ids is a constraint, as a grammar is: it always holds. The other bans yield at a position where
they would leave no token at all: where a grammar allows nothing but an end id before min_output_len, the output
ends there (an output the grammar rejects would not be one). Allowed ids that are all one-token bad words are
refused when the request is made (GenerationConfig), and so are allowed ids beside a grammar.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from .sampling import SamplingConfig


class TokenBans:
    """One request's bans and the history they read: the prompt and output (bad words, n-grams), the output's length."""

    def __init__(self, cfg: SamplingConfig, prompt_ids: Sequence[int] = (), end_ids: Sequence[int] = (), min_output_len: int = 0):
        self.allowed = np.unique(np.asarray(cfg.allowed_token_ids, np.int64)) if cfg.allowed_token_ids else None
        self._outside: np.ndarray | None = None  # [vocab] bool: the tokens allowed_token_ids leaves out
        words = [tuple(int(t) for t in w) for w in cfg.bad_words_ids]
        self.banned_always = np.unique(np.asarray([w[0] for w in words if len(w) == 1], np.int64))
        self.phrases = [w for w in words if len(w) > 1]  # their last token is banned after the others
        self.ngram = cfg.no_repeat_ngram_size
        self.min_output_len = min_output_len
        self.ends = np.unique(np.asarray(end_ids, np.int64)) if min_output_len > 0 and len(end_ids) else None
        self.num_output = 0  # committed output tokens (min_output_len)
        self.reads_history = bool(self.phrases) or self.ngram > 0
        self.history = [int(t) for t in prompt_ids] if self.reads_history else []  # prompt + committed output
        self._keep = max([len(w) - 1 for w in self.phrases] + [self.ngram - 1, 0])  # its last tokens that a ban reads
        self.seen_ngrams: defaultdict[tuple[int, ...], set[int]] = defaultdict(set)  # (n-1 tokens) -> tokens that followed them
        if self.ngram > 0:
            for end in range(self.ngram, len(self.history) + 1):
                self._index(end)

    @staticmethod
    def needed(cfg: SamplingConfig, end_ids: Sequence[int], min_output_len: int) -> bool:
        """Whether a request bans anything (most do not: nothing is built for them)."""
        return bool(cfg.allowed_token_ids or cfg.bad_words_ids or cfg.no_repeat_ngram_size or (min_output_len > 0 and len(end_ids)))

    @property
    def active(self) -> bool:
        """Whether any ban can still apply (min_output_len's ends stop applying once the output reaches it)."""
        return (self.allowed is not None or len(self.banned_always) > 0 or self.reads_history
                or (self.ends is not None and self.num_output < self.min_output_len))

    def apply_allowed(self, x: np.ndarray) -> None:
        """x: [vocab] logits: every token outside allowed_token_ids -> -inf, in place (a constraint, as a grammar's is)."""
        if self.allowed is None:
            return
        if self._outside is None or len(self._outside) != len(x):  # made once per width: a row of a real vocabulary is ~1 MB
            self._outside = np.ones(len(x), bool)
            self._outside[self.allowed[self.allowed < len(x)]] = False
        np.putmask(x, self._outside, -np.inf)

    def apply_bans(self, x: np.ndarray, appended: Sequence[int]) -> None:
        """x: [vocab] logits at the position after the committed output and ``appended``, after the allowed ids and the
        grammar: bad words, repeated n-grams, then (while the output is short) the end ids -> -inf, in place. Each yields
        where it would leave no token at all (the allowed ids or the grammar take none of the others)."""
        width = len(x)
        banned = [int(t) for t in self.banned_always if t < width]
        if self.reads_history:
            banned += [t for t in self._history_bans(appended) if t < width]
        _ban_unless_nothing_left(x, np.asarray(banned, np.int64))
        if self.ends is not None and self.num_output + len(appended) < self.min_output_len:
            _ban_unless_nothing_left(x, self.ends[self.ends < width])

    def commit(self, tokens: Sequence[int]) -> None:
        self.num_output += len(tokens)
        if self.reads_history:
            for t in tokens:
                self.history.append(int(t))
                if self.ngram > 0 and len(self.history) >= self.ngram:
                    self._index(len(self.history))

    def _index(self, end: int) -> None:
        """Record the n-gram of history ending before ``end``."""
        gram = self.history[end - self.ngram : end]
        self.seen_ngrams[tuple(gram[:-1])].add(gram[-1])

    def _history_bans(self, appended: Sequence[int]) -> set[int]:
        """Tokens that would complete a bad word or repeat an n-gram after history + appended."""
        drafts = [int(t) for t in appended]
        tail = (self.history[-self._keep :] if self._keep else []) + drafts  # the history any ban reads
        bans: set[int] = set()
        for w in self.phrases:
            before = w[:-1]
            if len(tail) >= len(before) and tuple(tail[len(tail) - len(before) :]) == before:
                bans.add(w[-1])
        n = self.ngram
        if n == 1:  # every token seen
            bans |= self.seen_ngrams.get((), set())
            bans.update(drafts)
        elif n > 1 and len(tail) >= n - 1:
            prefix = tuple(tail[len(tail) - (n - 1) :])
            bans |= self.seen_ngrams.get(prefix, set())
            # the n-grams that end inside the drafts: not indexed (drafts are not committed)
            for end in range(max(n, len(tail) - len(drafts) + 1), len(tail) + 1):
                if tuple(tail[end - n : end - 1]) == prefix:
                    bans.add(tail[end - 1])
        return bans


def _ban_unless_nothing_left(x: np.ndarray, ids: np.ndarray) -> None:
    if not len(ids):
        return
    held = x[ids].copy()
    x[ids] = -np.inf
    if not np.isfinite(x).any():
        x[ids] = held
