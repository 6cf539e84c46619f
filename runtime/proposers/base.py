"""The proposer interface the engine talks to, keyed by request (vLLM's proposer split).

The engine never asks what kind of proposer it has. Per round it asks for up
to ``draft_lens[i]`` drafts for each of the requests that use this proposer,
verifies them in one target call, and reports back to each request's
proposer what was accepted and what the target computed (``observe``), so a
proposer can update its state: a draft model rolls its KV cache back, an
n-gram pool learns the new tokens, a drafter that reads the target's hidden
states (EAGLE) takes them from the target outputs.

Drafts carry their structure: ``parents[j]`` is the index of draft j's
parent (-1: the request's last accepted token). A chain is ``[-1, 0, 1, ...]``;
a tree verifies several branches in one call (Medusa/EAGLE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..request import Request


@dataclass
class Draft:
    tokens: np.ndarray  # [k] draft token ids (k may be 0)
    probs: np.ndarray | None = None  # [k, vocab] the draft distributions q (rejection sampling), or None: deterministic drafts
    parents: np.ndarray | None = None  # [k] parent index per draft (-1: the last accepted token); None = a chain
    depths: np.ndarray | None = None  # [k] a tree's depth per draft (1 = a child of the last accepted token)

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def empty() -> "Draft":
        return Draft(np.zeros(0, np.int64))


@dataclass
class TargetOutput:
    """What the target computed for one request in a verification call."""

    logits: np.ndarray  # [k + 1, vocab] the rows of the fed tokens (last accepted token + drafts)
    num_accepted: int  # drafts kept
    emitted: list[int]  # the accepted drafts + the recovered or bonus token
    rows: list[int]  # the rows of the kept tokens in the call (0 = the last accepted token): 0..n for a chain,
    #                  the accepted path for a tree; rows[-1] is the row whose logits gave the recovered/bonus token


class Proposer(Protocol):
    name: str  # the method it implements: draft | ngram | medusa | eagle

    def add(self, requests: Sequence["Request"]) -> None:
        """Start these requests: each has its prompt and the first token the target picked."""

    def remove(self, request_id: str) -> None:
        """The request finished or was aborted: free what it holds."""

    def room(self, request: "Request") -> int:
        """The most drafts this request can take this round (the proposer's own limits)."""

    def propose(self, requests: Sequence["Request"], draft_lens: Sequence[int]) -> list[Draft]:
        """Up to ``draft_lens[i]`` drafts following each request's last token."""

    def observe(self, request: "Request", draft: Draft, target: TargetOutput) -> None:
        """The target verified ``draft``: ``target.num_accepted`` kept, ``target.emitted`` appended."""

    # Optional: ``prefilled(requests, first_slot)``, called right after ``add`` for requests the target has just
    # prefilled in slots first_slot.. (row r.slot - first_slot of that call's outputs). A proposer that reads the
    # target's own outputs (Medusa: its heads on the last prompt row) defines it; the engine calls it only where it exists.
