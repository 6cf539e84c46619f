"""Drafts from a smaller model's engine, run autoregressively.

The draft keeps its own KV cache alive across rounds. ``pending[b]`` holds the
tokens of row b that the draft has not yet seen (the last accepted token, and,
after a round where every draft was accepted, the last draft too: the draft
produced it but never fed it). They are fed first in the next round.
"""

from __future__ import annotations

import numpy as np

from ..executor import OrtExecutor
from ..kv_cache import KVCache
from ..sampling import SamplingConfig, processed_probs, sample
from .base import Proposal


class DraftModelProposer:
    name = "draft_model"

    def __init__(self, executor: OrtExecutor, sampling: SamplingConfig, use_logits: bool, vocab_limit: int | None = None, confidence_threshold: float = 0.0):
        self.executor = executor
        # A row stops drafting after a token the draft itself gave less than this probability
        # (Hugging Face's assistant_confidence_threshold): fewer wasted draft steps and a
        # narrower verification, which on CPU costs compute per token. 0 = fixed draft_len.
        self.confidence_threshold = confidence_threshold
        self.sampling = sampling
        # With use_logits the drafts are sampled from q and q is kept for rejection
        # sampling; otherwise the draft proposes its most likely token.
        self.use_logits = use_logits and not sampling.greedy
        self.vocab_limit = vocab_limit
        self.cache: KVCache | None = None
        self.pending: list[list[int]] = []
        self.rngs: list[np.random.Generator] = []

    def prefill(self, prompts: list[list[int]], first_tokens: list[int], rngs: list[np.random.Generator] | None = None) -> None:
        self.cache = self.executor.new_cache(len(prompts))
        self.executor.forward(self.cache, prompts, all_logits=False)
        self.pending = [[t] for t in first_tokens]
        self.rngs = rngs or [np.random.default_rng(i) for i in range(len(prompts))]

    def room(self) -> np.ndarray:
        assert self.cache is not None
        fed = self.cache.lengths + np.array([len(p) for p in self.pending])
        # k drafts feed pending + (k - 1) drafts
        return np.maximum(self.cache.max_seq_len - fed + 1, 0)

    def propose(self, draft_lens: np.ndarray) -> Proposal:
        cache, ex = self.cache, self.executor
        assert cache is not None
        batch = cache.batch_size
        draft_lens = draft_lens.copy()  # rows may stop early (confidence threshold)
        steps = int(draft_lens.max(initial=0))
        drafts = np.zeros((batch, steps), np.int64)
        probs: list[list[np.ndarray]] = [[] for _ in range(batch)]
        # step 0 feeds each row's pending tokens (1 or 2: ragged); later steps one draft per row
        feed: list[list[int]] | np.ndarray = [p if k > 0 else [p[-1]] for p, k in zip(self.pending, draft_lens)]
        for j in range(steps):
            idle = draft_lens <= j  # rows that already have their drafts ride along, then roll back
            logits = ex.forward(cache, feed, all_logits=False, advance=~idle)[:, 0, : self.vocab_limit]
            active = np.flatnonzero(~idle)
            if self.use_logits:
                q = processed_probs(logits[active], self.sampling)  # only rows still drafting
                for i, b in enumerate(active):
                    drafts[b, j] = sample(q[i], self.rngs[b])
                    probs[b].append(q[i])
            else:
                drafts[:, j] = logits.argmax(axis=-1)
            if self.confidence_threshold > 0:
                top = q.max(axis=-1) if self.use_logits else _top_probability(logits[active])
                draft_lens[active[top < self.confidence_threshold]] = j + 1
                if not (draft_lens > j + 1).any():
                    break
            feed = drafts[:, j : j + 1]
        return Proposal(
            tokens=[drafts[b, : draft_lens[b]] for b in range(batch)],
            probs=[np.stack(probs[b]) if probs[b] else None for b in range(batch)],
        )

    def commit(self, row: int, num_drafted: int, num_accepted: int, emitted: list[int]) -> None:
        assert self.cache is not None
        if num_drafted == 0:  # the draft was not fed this round
            self.pending[row] = self.pending[row] + emitted
            return
        # fed: pending + drafts[: num_drafted - 1]; of those drafts, the accepted ones stay
        kept = min(num_accepted, num_drafted - 1)
        self.cache.rollback(row, int(self.cache.lengths[row]) - (num_drafted - 1 - kept))  # drop the rejected fed drafts
        self.pending[row] = emitted[kept:]

    def keep_rows(self, rows: np.ndarray) -> None:
        assert self.cache is not None
        self.cache.keep_rows(rows)
        self.pending = [self.pending[r] for r in rows]
        self.rngs = [self.rngs[r] for r in rows]


def _top_probability(logits: np.ndarray) -> np.ndarray:
    """logits [rows, vocab] -> the softmax probability of each row's argmax."""
    x = logits - logits.max(axis=-1, keepdims=True)
    return 1.0 / np.exp(x).sum(axis=-1)
