"""Medusa chain drafts: the target engine's own Medusa heads guess the tokens after the next one.

A ``--speculative_decoding_mode medusa`` target returns, beside its logits,
``medusa_logits`` [rows, heads, vocab] for the same rows. On the row of the
last token a round keeps, the target's logits pick the next token t+1 (the
bonus or recovered token the engine appends) and head i guesses t+2+i, so
the next round's chain is ``[argmax head 0, ..., argmax head k-1]``, which
follows the token just appended. The proposer reads the heads from the target
executor's ``medusa_logits`` (the buffer of its latest call) right after the
prefill (``prefilled``) and after every verification (``observe``): the engine
makes no other target call in between. Proposing costs no model call. Verification is draft-target's
token compare (the drafts carry no probabilities), so greedy output is exactly
the target's own. Chains only: Medusa's trees (``--medusa_choices``) are not
implemented (docs/medusa-eagle.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import EngineError
from ..request import Request
from .base import Draft, TargetOutput


class MedusaProposer:
    name = "medusa"

    def __init__(self, target):
        """target: the executor of a --speculative_decoding_mode medusa engine (the Engine's target)."""
        heads = getattr(target, "medusa_heads", 0)
        if not heads:
            raise EngineError(
                f"Medusa drafting needs a target engine built with --speculative_decoding_mode medusa --medusa_dir HEADS; "
                f"{target.engine.path} was built with --speculative_decoding_mode {target.build.speculative_decoding_mode}"
                + ("" if target.build.speculative_decoding_mode != "medusa" else f" and its {type(target).__name__} does not return medusa_logits")
                + "."
            )
        self.num_heads = int(heads)
        self.target = target
        self.next: dict[str, np.ndarray] = {}  # request id -> the chain after its last token, one draft per head

    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.next[r.request_id] = np.zeros(0, np.int64)  # until prefilled() hands over the prompt's head rows

    def prefilled(self, requests: Sequence[Request], first_slot: int) -> None:
        """The target just prefilled ``requests`` in slots first_slot..: each one's heads on its last prompt row."""
        heads = self.target.medusa_logits  # [len(prefilled), 1, heads, vocab]
        for r in requests:
            self._take(r.request_id, heads[r.slot - first_slot, 0])

    def remove(self, request_id: str) -> None:
        self.next.pop(request_id, None)

    def room(self, request: Request) -> int:
        return len(self.next[request.request_id])

    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        return [Draft(self.next[r.request_id][: int(k)].copy()) for r, k in zip(requests, draft_lens)]

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        # the row of the last kept token: its target logits gave the appended token, its heads the ones after it
        self._take(request.request_id, self.target.medusa_logits[request.slot, target.num_accepted])  # [heads, vocab]

    def _take(self, rid: str, heads: np.ndarray) -> None:
        self.next[rid] = heads.argmax(axis=-1).astype(np.int64)  # [heads]
