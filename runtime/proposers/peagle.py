"""P-EAGLE drafts: EAGLE-3's module and features, a whole block of drafts in ONE module call.

A peagle target (``--speculative_decoding_mode peagle``) returns ``eagle_hidden`` as an eagle target does, and its
module engine (the target's ``eagle/`` folder, mode peagle_module) reads the same pairs (features of token p, token
p + 1) plus placeholder rows: token id ``vocab_size`` stands for a position not drafted yet (builder/eagle.py). A
round feeds each drafting request, in one ragged call,

    [its pending real pairs (the last verification's), then k - 1 placeholders]

and reads k rows of logits: the last real pair's (the guess for the token after the one just appended, as EAGLE's
depth 1) and each placeholder's, the position after it. Every placeholder sees the real pairs and the placeholders
before it (the module was trained on exactly these rows, train/peagle.py), never a drafted token: the k guesses
are independent draws given the context, which is what makes them one call. The placeholders' K/V are dropped
at once (the cache keeps the real pairs only), as EAGLE rolls its drafted rows back.

Chains take each position's pick (greedy: argmax; sampled: a draw from the processed distribution, passed on for
rejection sampling; runtime/proposers/medusa.py's ``positional_draft``, Medusa's heads being the same kind of
per-position guesses); trees (``--peagle_choices``) take, from the same single call, each depth's top candidates
(greedy) or its draws without replacement (sampled, verified by recursive rejection sampling: runtime/tree.py), the
same under every parent.

Pending pairs, prefill and removal are EAGLE's (EagleProposer), except that a backlog (a long prompt, rounds without
drafts) is fed up to its last pair: that one goes with the block, so a round is always one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...formats.engine_format import MODULE_MODES
from ..request import Request
from .base import Draft, adjacent_runs
from .eagle import CATCH_UP_AFTER, HIDDEN_IN, EagleProposer
from .medusa import positional_draft
from .own import DraftTreeConfig, own_drafter_method


class PEagleProposer(EagleProposer):
    name = "peagle"
    choices_flag = "--peagle_choices"
    title, module_flag = "P-EAGLE", "--peagle_dir"
    module_mode = MODULE_MODES[name]
    drafts_in_one_call = True  # draft_len=auto prices a round's drafts as one call (a line over k, once two k were timed)

    @property
    def placeholder(self) -> int:
        """The token id of the first position not drafted yet (depth 1; depth d is this + d - 1): past the vocabulary
        (builder/eagle.py)."""
        return self.module.model.vocab_size

    # -- backlogs: fed up to their last pair --------------------------------------------
    def backlog(self, request: Request) -> int:
        pending = len(self.pending[request.request_id][1])
        return pending - 1 if pending > CATCH_UP_AFTER else 0

    def catch_up(self, requests: Sequence[Request]) -> int:
        slots = sorted(self.slot_of[r.request_id] for r in requests if self.backlog(r))
        fed = 0
        for run in adjacent_runs(slots):
            fed += self._feed(run[0], run[-1] + 1, {self.order[s]: 0 for s in run})
        return fed

    # -- a round ------------------------------------------------------------------------
    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        out = [Draft.empty() for _ in requests]
        rows_for: dict[str, int] = {}  # request -> positions its draft reads (its chain, or its tree's depth)
        for r, k in zip(requests, draft_lens, strict=False):
            if k > 0 and self.pending[r.request_id][1]:
                rows_for[r.request_id] = self._positions(int(k))
        if not rows_for:
            return out
        slots = sorted(self.slot_of[rid] for rid in rows_for)
        blocks: dict[str, np.ndarray] = {}
        self._feed(slots[0], slots[-1] + 1, rows_for, blocks)
        for i, (r, k) in enumerate(zip(requests, draft_lens, strict=False)):
            if r.request_id in blocks:
                out[i] = positional_draft(r, blocks[r.request_id], int(k), self.tree)
        return out

    def _positions(self, k: int) -> int:
        """The block's positions a draft of k reads: its chain, or its tree's depth."""
        if self.tree is None:
            return k
        return int(self.tree.depths[: min(k, len(self.tree))].max())

    def _feed(self, lo: int, hi: int, rows_for: dict[str, int], blocks: dict[str, np.ndarray] | None = None) -> int:
        """One call on slots lo..hi: each request of ``rows_for`` fed its pending pairs (all but the last when it drafts
        0 positions: a catch-up), then positions - 1 placeholders; the real pairs stay in the cache, the placeholders do
        not. ``blocks``: filled with each drafting request's logits [positions, vocab]. Returns the pairs fed. One call
        per slot when a row riding along would write past the cache's capacity."""
        ids = self.order[lo:hi]
        go = np.array([rid in rows_for for rid in ids])
        pairs = [len(self.pending[rid][1]) - (rows_for[rid] == 0) if g else 0 for rid, g in zip(ids, go, strict=False)]
        extra = [max(rows_for[rid] - 1, 0) if g else 0 for rid, g in zip(ids, go, strict=False)]
        width = max(p + e for p, e in zip(pairs, extra, strict=False))
        if width == 0:
            return 0
        if hi - lo > 1 and int(self.cache.lengths[lo:hi].max()) + width > self.cache.capacity:
            return sum(self._feed(s, s + 1, {ids[s - lo]: rows_for[ids[s - lo]]}, blocks) for s in range(lo, hi) if go[s - lo])
        hidden_size = self.module.model.hidden_size
        tokens, hidden = [], np.zeros((len(ids), width, hidden_size), np.float32)  # [n, width, hidden]
        joined: dict[str, np.ndarray] = {}  # [pending, hidden] per fed request: a catch-up keeps its tail from it
        for i, rid in enumerate(ids):
            if not go[i] or pairs[i] + extra[i] == 0:
                tokens.append([0])  # rides along (not advanced: what it writes is stale at once)
                go[i] = False
                continue
            tokens.append(self.pending[rid][1][: pairs[i]] + [self.placeholder + j for j in range(extra[i])])  # placeholder of depth j + 1
            rows = joined[rid] = self._pending_features(rid)
            hidden[i, : pairs[i]] = rows[: pairs[i]]
            hidden[i, pairs[i] : pairs[i] + extra[i]] = rows[pairs[i] - 1]  # the anchor's features (read when anchored)
        real = self.cache.lengths[lo:hi].copy()
        step = self.module.forward(self.cache, tokens, all_logits=blocks is not None, advance=go, first_slot=lo, extra_inputs={HIDDEN_IN: hidden})
        self.cache.lengths[lo:hi] = real + np.where(go, pairs, 0)  # the real pairs stay, the placeholders go
        for i, rid in enumerate(ids):
            if not go[i]:
                continue
            if blocks is not None and rows_for[rid] > 0:  # the last real pair's row, then each placeholder's
                blocks[rid] = step.logits[i, pairs[i] - 1 : pairs[i] - 1 + rows_for[rid]].copy()
            nxt = self.pending[rid][1]
            if pairs[i] == len(nxt):
                self.pending[rid] = ([], [])
            else:  # a catch-up: the last pair waits for the block
                self.pending[rid] = ([joined[rid][pairs[i]:]], nxt[pairs[i]:])
        return int(sum(p for p, g in zip(pairs, go, strict=False) if g))


# -- the method's registration (runtime/methods.py: a peagle target carries it) -----------------------------------
@dataclass(frozen=True)
class PEagleConfig(DraftTreeConfig):
    """P-EAGLE drafting with the module in a --speculative_decoding_mode peagle target's eagle/ folder: a draft tree
    (each depth's top candidates from the one call's block), or chains."""


METHOD = own_drafter_method(
    PEagleProposer, PEagleConfig,
    'A --speculative_decoding_mode peagle target: the draft tree, as --medusa_choices, e.g. "[[0],[1],[0,0],[0,1],[0,0,0]]", '
    "drafted from one module call [default: a chain of --draft_len drafts, 4].")
