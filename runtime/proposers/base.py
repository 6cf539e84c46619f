"""The proposer interface the orchestrator loop talks to.

The loop never asks what kind of proposer it has: it asks for up to
``draft_lens[b]`` drafts per row, verifies them, and reports back what was
accepted so the proposer can update its state (a draft model rolls back its
KV cache; an n-gram pool learns the new tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Proposal:
    tokens: list[np.ndarray]  # per row: draft token ids [k_b] (k_b may be 0)
    probs: list[np.ndarray | None]  # per row: draft distributions q [k_b, vocab], or None for deterministic drafts


class Proposer(Protocol):
    name: str

    def prefill(self, prompts: list[list[int]], first_tokens: list[int], rngs: list[np.random.Generator] | None = None) -> None:
        """Start a batch: the prompts, the first token the target picked after each, one RNG per row."""

    def room(self) -> np.ndarray:
        """[batch] the most drafts each row can take this round (capacity limits)."""

    def propose(self, draft_lens: np.ndarray) -> Proposal:
        """Up to draft_lens[b] drafts for each row, following its last token."""

    def commit(self, row: int, num_drafted: int, num_accepted: int, emitted: list[int]) -> None:
        """Row ``row`` kept ``num_accepted`` of ``num_drafted`` drafts; ``emitted`` are all tokens it appended."""

    def keep_rows(self, rows: np.ndarray) -> None:
        """Finished rows leave the batch."""
