"""A draft model with another tokenizer, drafting through text (Hugging Face's universal assisted generation).

The inner ``DraftModelProposer`` runs in the draft's own token ids; this
adapter keeps it in step with the target's text and turns its drafts into
target ids:

* The draft's sequence is the draft tokenizer's encoding of the accepted
  text up to its last whole character (a character the target's tokens split
  waits until it is complete). After each round only a tail is re-encoded:
  from ``LOOKBEHIND`` draft tokens back (a token boundary that is also a
  character boundary), since appended text can change how the last tokens
  merge (" fo" + "o" is one token " foo"); Hugging Face's UAG re-encodes a
  look-behind window the same way. The draft's KV cache keeps its longest
  prefix that still agrees (its accepted drafts, often) and is fed the rest.
* A draft is the bytes of the inner drafts, past the accepted text (the
  bytes of a held-back partial character must match first), encoded with the
  target's tokenizer byte for byte (runtime/token_bytes.py: a character
  split across tokens is spelled with single-byte tokens at the start and
  left for the next round at the end).
* The target verifies the ids as any draft: greedy output is the target's
  own, whatever the draft proposed. Drafts are the draft's argmax (its
  distribution q is over another vocabulary), so sampled requests are
  verified by token compare, which keeps the target's distribution.

Cost: two short encodes per request per round (tens of microseconds with
``tokenizers``) and the few re-fed draft tokens at the seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..request import Request
from ..token_bytes import TokenBytes
from .base import Draft, Proposer, TargetOutput
from .draft_model import DraftModelProposer

LOOKBEHIND = 4  # draft tokens re-encoded each round besides the new text
EXTRA_DRAFTS = 1  # draft tokens asked beyond the target's k: the two tokenizers cut text at different places


@dataclass
class _Text:
    """One request's text and the draft's tokens for it."""

    data: bytearray  # the accepted text's bytes (target tokens decoded)
    ids: list[int] = field(default_factory=list)  # the draft's tokens for data[:ends[-1]]
    ends: list[int] = field(default_factory=list)  # ends[j]: the byte where draft token j ends
    fed: list[int] = field(default_factory=list)  # what the inner proposer holds (cache + pending), in its ids
    joined: bool = False  # the inner proposer has the request (it needs two draft tokens to start)
    synced: int = 0  # len(data) when ids were last re-encoded: the rounds without drafts only append bytes


class CrossTokenizerProposer(Proposer):
    name = "draft"
    label = "draft-target (cross-tokenizer)"
    own_vocabulary = True  # its draft's ids are the draft's: the engine skips the shared-vocabulary check

    def __init__(self, inner: DraftModelProposer, target_bytes: TokenBytes, draft_bytes: TokenBytes,
                 target_bos: int | None = None, draft_bos: int | None = None):
        inner.use_logits = False  # q is over the draft's vocabulary: drafts are its argmax, verified by token compare
        self.inner = inner
        self.executor = inner.executor
        self.default_draft_len, self.pairing = inner.default_draft_len, inner.pairing
        self.target_bytes, self.draft_bytes = target_bytes, draft_bytes
        self.target_bos, self.draft_bos = target_bos, draft_bos
        self.texts: dict[str, _Text] = {}
        self.shadows: dict[str, Request] = {}  # the inner proposer's view of each request (draft ids)

    # -- requests come and go -----------------------------------------------------------
    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            t = self.texts[r.request_id] = _Text(bytearray(self.target_bytes.bytes_of(list(r.prompt_ids) + list(r.output_ids))))
            if self.draft_bos is not None and r.prompt_ids and r.prompt_ids[0] == self.target_bos:
                t.ids, t.ends = [self.draft_bos], [0]  # the prompt starts a document: so does the draft's
            self._reencode(t)
        self._join([r for r in requests if len(self.texts[r.request_id].ids) >= 2])

    def _join(self, requests: Sequence[Request]) -> None:
        shadows = []
        for r in requests:
            t = self.texts[r.request_id]
            shadow = Request(r.request_id, t.ids[:-1], r.config, "draft", r.draft_len, r.rng, output_ids=[t.ids[-1]])
            self.shadows[r.request_id], t.fed, t.joined = shadow, list(t.ids), True
            shadows.append(shadow)
        if shadows:
            self.inner.add(shadows)

    def remove(self, request_id: str) -> None:
        t = self.texts.pop(request_id, None)
        self.shadows.pop(request_id, None)
        if t is not None and t.joined:
            self.inner.remove(request_id)

    def room(self, request: Request) -> int:
        t = self.texts[request.request_id]
        if not t.joined:
            return 0
        unsynced = len(t.data) - t.synced  # at most one draft token per byte still to feed
        return max(self.inner.room(self.shadows[request.request_id]) - EXTRA_DRAFTS - unsynced, 0)

    def backlog(self, request: Request) -> int:
        t = self.texts[request.request_id]
        return self.inner.backlog(self.shadows[request.request_id]) if t.joined else 0

    def catch_up(self, requests: Sequence[Request]) -> int:
        joined = [r for r in requests if self.texts[r.request_id].joined]
        for r in joined:
            self._sync(r.request_id)
        return self.inner.catch_up([self.shadows[r.request_id] for r in joined])

    # -- a round ------------------------------------------------------------------------
    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        out = [Draft.empty() for _ in requests]
        asked = [(i, r, int(k)) for i, (r, k) in enumerate(zip(requests, draft_lens, strict=True)) if k > 0 and self.texts[r.request_id].joined]
        if not asked:
            return out
        for _, r, _ in asked:
            self._sync(r.request_id)
        inner = self.inner.propose([self.shadows[r.request_id] for _, r, _ in asked], [k + EXTRA_DRAFTS for _, _, k in asked])
        for (i, r, k), d in zip(asked, inner, strict=True):
            t = self.texts[r.request_id]
            t.fed += d.tokens[:-1].tolist()  # the inner fed every draft but its last
            out[i] = Draft(np.array(self._to_target(t, d.tokens.tolist())[:k], np.int64))
        return out

    def _to_target(self, t: _Text, drafts: list[int]) -> list[int]:
        """Target ids spelling what the drafts add to the accepted text."""
        proposed = self.draft_bytes.bytes_of(drafts)
        held = bytes(t.data[t.ends[-1] :])  # accepted bytes the draft's tokens do not cover yet (a partial character)
        if not proposed.startswith(held):
            return []
        return self.target_bytes.encode_bytes(proposed[len(held) :])

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        """Append the accepted text; the draft catches up when it drafts next (a round at k = 0 costs a bytes append)."""
        t = self.texts[request.request_id]
        t.data += self.target_bytes.bytes_of(target.emitted)
        if not t.joined:
            self._reencode(t)
            if len(t.ids) >= 2:
                self._join([request])

    def _sync(self, request_id: str) -> None:
        """Re-encode the text appended since the last sync; the inner proposer's cache keeps the prefix that agrees."""
        t = self.texts[request_id]
        if t.synced == len(t.data):
            return
        self._reencode(t)
        agree = 0
        for a, b in zip(t.fed, t.ids, strict=False):
            if a != b:
                break
            agree += 1
        self.inner.resync(request_id, t.ids, agree)
        t.fed = list(t.ids)

    def _reencode(self, t: _Text) -> None:
        """Re-encode the text from LOOKBEHIND draft tokens back to its last whole character."""
        first = 1 if t.ids and t.ids[0] == self.draft_bos and t.ends[0] == 0 else 0  # a BOS stays
        j = max(len(t.ids) - LOOKBEHIND, first)
        while j > first and t.ends[j - 1] < len(t.data) and 0x80 <= t.data[t.ends[j - 1]] < 0xC0:
            j -= 1  # token j starts inside a character: start from a whole one
        start = t.ends[j - 1] if j > 0 else 0
        tail = self.draft_bytes.encode_bytes(bytes(t.data[start:]))  # stops before a partial character at the end
        ends, at = [], start
        for i in tail:
            at += len(self.draft_bytes.table[i])
            ends.append(at)
        t.ids, t.ends = t.ids[:j] + tail, t.ends[:j] + ends
        t.synced = len(t.data)
