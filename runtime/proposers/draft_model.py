"""Drafts from a smaller model's engine, run autoregressively, keyed by request.

The draft keeps its own KV cache alive across rounds, one slot per request,
with running requests compacted into slots ``0..n-1`` (a leaving request's
slot takes the last one). ``pending[id]`` holds the tokens of a request that
the draft has not yet seen (the last accepted token; after a round where
every draft was accepted, the last draft too: the draft produced it but
never fed it; after rounds without drafting, every token emitted since).
They are fed first in the next round that drafts.

A request with ``draft_len="auto"`` joins with its whole prompt pending: the
draft model pays for the prompt only if the request ever drafts. At a full
batch on a CPU, auto often decides that drafting does not pay (a wider target
call costs most of a step there), and a prefill of every prompt on the draft
was then 8% of the wall time for nothing. A pending backlog longer than one
round's tokens is fed in a call of its own (``catch_up``), so it does not
widen the first draft step of every row beside it; auto weighs that cost
before a request first drafts (runtime/draft_len.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...formats.config_strings import DEFAULT_DRAFT_LEN
from ...formats.errors import RequestError
from ..backends.base import Executor
from ..pairing import Pairing
from ..request import AUTO, Request
from ..sampling import processed_probs, sample
from .base import Draft, Proposer, TargetOutput, adjacent_runs, free_slot

CATCH_UP_AFTER = 9  # pending tokens beyond one round's worth (k + 1 at k = 8) are fed in a call of their own


class DraftModelProposer(Proposer):
    name = "draft"
    label = "draft-target"

    def __init__(self, executor: Executor, use_logits: bool = False, confidence_threshold: float = 0.0, draft_len: int = DEFAULT_DRAFT_LEN,
                 pairing: Pairing | None = None):
        """draft_len: its default drafts per round (a draft-target config's); pairing: how it was checked against the target."""
        if not 0.0 <= confidence_threshold <= 1.0:  # a probability (NaN fails too)
            raise RequestError(f"--draft_confidence_threshold {confidence_threshold}: expected a probability in [0, 1] (0 = always draft_len "
                               "tokens).")
        self.executor = executor
        self.default_draft_len, self.pairing = draft_len, pairing
        # With use_logits (and a sampled request) drafts are sampled from q and q is kept for
        # rejection sampling; otherwise the draft proposes its most likely token.
        self.use_logits = use_logits
        # A request stops drafting after a token the draft itself gave less than this probability
        # (Hugging Face's assistant_confidence_threshold): fewer wasted draft steps and a
        # narrower verification, which on CPU costs compute per token. 0 = fixed draft_len.
        self.confidence_threshold = confidence_threshold
        self.cache = executor.new_cache(executor.build.max_batch_size)
        self.order: list[str] = []  # order[s]: the request in slot s
        self.slot_of: dict[str, int] = {}
        self.pending: dict[str, list[int]] = {}
        self.proposed: dict[str, int] = {}  # drafts made (and all but the last fed) this round, until observe

    # -- requests come and go -----------------------------------------------------------
    @property
    def samples_drafts(self) -> bool:  # type: ignore[override]  (Proposer's attribute, here use_logits)
        return self.use_logits

    def add(self, requests: Sequence[Request]) -> None:
        prompts: dict[int, list[int]] = {}  # slot -> prompt, of the requests prefilled now (a fixed draft_len)
        for r in requests:
            slot = self.slot_of[r.request_id] = len(self.order)
            self.order.append(r.request_id)
            if r.draft_len == AUTO:  # pays for its prompt when it first drafts (catch_up)
                self.pending[r.request_id] = [*r.prompt_ids, *r.output_ids]
            else:
                self.pending[r.request_id], prompts[slot] = list(r.output_ids), r.prompt_ids
        for run in adjacent_runs(sorted(prompts)):  # one call for the batch when every request has a fixed draft_len
            self.executor.forward(self.cache, [prompts[s] for s in run], all_logits=False, first_slot=run[0])

    def remove(self, request_id: str) -> None:
        if free_slot(request_id, self.slot_of, self.order, self.cache, self.executor.copy_slot):
            self.pending.pop(request_id, None)
            self.proposed.pop(request_id, None)

    def room(self, request: Request) -> int:
        fed = self.cache.lengths_view[self.slot_of[request.request_id]] + len(self.pending[request.request_id])
        return max(self.cache.max_seq_len - fed + 1, 0)  # k drafts feed pending + (k - 1) drafts

    def measure_costs(self, batches: Sequence[int]) -> tuple[dict[int, float], dict[int, float]]:
        """Its one-token steps at each batch size its cache holds and its catch-up feeds (step_costs.measure_draft_costs)."""
        from ..step_costs import measure_draft_costs

        return measure_draft_costs(self.executor, self.cache, batches)

    def backlog(self, request: Request) -> int:
        pending = len(self.pending[request.request_id])
        return pending - 1 if pending > CATCH_UP_AFTER else 0

    def catch_up(self, requests: Sequence[Request]) -> int:
        """Feed each request's backlog but its last token (the next draft step feeds that one): one call per run
        of adjacent slots, so no request rides along with a long feed it does not need; one call per slot where a
        padded row would write past the cache's capacity, and pieces no longer than the engine's max_input_len (a
        backlog is the prompt plus every token emitted while the request did not draft)."""
        slots = sorted(self.slot_of[r.request_id] for r in requests if self.backlog(r))
        if not slots:  # every round of a fixed draft_len: nothing held back
            return 0
        runs = adjacent_runs(slots)
        piece = max(int(self.executor.build.max_input_len), 1)
        fed = 0
        for run in runs:
            width = max(len(self.pending[self.order[s]]) - 1 for s in run)
            alone = len(run) > 1 and (width > piece or int(self.cache.lengths[run[0] : run[-1] + 1].max()) + width > self.cache.capacity)
            for group in ([[s] for s in run] if alone else [run]):
                while any(len(self.pending[self.order[s]]) > 1 for s in group):
                    feeds = [self.pending[self.order[s]][:-1][:piece] for s in group]
                    self.executor.forward(self.cache, feeds, all_logits=False, first_slot=group[0])
                    for s, f in zip(group, feeds, strict=True):
                        rid = self.order[s]
                        fed += len(f)
                        self.pending[rid] = self.pending[rid][len(f) :]
        return fed

    # -- a round ------------------------------------------------------------------------
    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        out = [Draft.empty()] * len(requests)  # (one shared empty draft: nothing writes into a draft)
        want = {r.request_id: (i, int(k)) for i, (r, k) in enumerate(zip(requests, draft_lens, strict=True)) if k > 0}
        if not want:
            return out
        # a no-op after the round's own catch_up (timed apart there); here for callers that propose directly, since
        # step 0 below feeds each row's whole pending list and a backlog may exceed the engine's max_input_len
        self.catch_up([r for r, k in zip(requests, draft_lens, strict=True) if k > 0])
        slots = sorted(self.slot_of[rid] for rid in want)
        lo, hi = slots[0], slots[-1] + 1
        # Slots in the range that do not draft ride along and write stale K/V past their length;
        # if one has no room for that, draft each request in its own call (rare: near max_seq_len).
        width = max(len(self.pending[rid]) for rid in want)
        riding = [s for s in range(lo, hi) if self.order[s] not in want]
        if riding and any(self.cache.lengths_view[s] + width > self.cache.capacity for s in riding):
            ranges = [(s, s + 1) for s in slots]
        else:
            ranges = [(lo, hi)]
        for lo, hi in ranges:
            self._draft_range(lo, hi, want, requests, out)
        return out

    def _draft_range(self, lo: int, hi: int, want: dict[str, tuple[int, int]], requests: Sequence[Request], out: list[Draft]) -> None:
        ids = self.order[lo:hi]
        reqs = [requests[want[rid][0]] if rid in want else None for rid in ids]
        wanted = [want[rid][1] if rid in want else 0 for rid in ids]
        steps, every_row_drafts = max(wanted), min(wanted)  # every_row_drafts: steps in which no row rides along
        drafted: list[list[int]] = [[] for _ in ids]  # each row's drafts so far, as ints (fed back as lists: no numpy per step)
        probs: list[list[np.ndarray]] = [[] for _ in ids]
        sampled = [r is not None and self.use_logits and not r.config.sampling.greedy for r in reqs]
        any_sampled = any(sampled)
        # rows whose pick is not the argmax: sampled, or with their own logits processing (penalties, bias, bans, grammar)
        picked = [i for i, r in enumerate(reqs) if sampled[i] or (r is not None and r.processor is not None and not r.processor.plain)]
        # step 0 feeds each row's pending tokens (ragged); later steps one draft per row
        feed = [self.pending[rid] if k > 0 else [self.pending[rid][-1]] for rid, k in zip(ids, wanted, strict=True)]
        track_top = any_sampled or self.confidence_threshold > 0
        # rows may stop early (confidence) or want fewer: then the rows done ride along, as an array (lens changes only when track_top)
        lens = np.array(wanted, np.int64) if track_top or every_row_drafts < steps else None
        for j in range(steps):
            # rows that already have their drafts ride along, then roll back (none while every row still drafts)
            idle = lens <= j if lens is not None and (track_top or j >= every_row_drafts) else None
            advance = None if idle is None else ~idle
            logits = self.executor.forward(self.cache, feed, all_logits=False, advance=advance, first_slot=lo).logits[:, 0, : self.vocab_limit]
            picks = logits.argmax(axis=-1).tolist()
            top = np.zeros(len(ids)) if track_top else None
            for i in picked:  # the request's own logits processing, with this position's history (its drafts so far)
                if idle is not None and idle[i]:
                    continue
                r = reqs[i]
                t, q = r.processor.pick(logits[i], list(drafted[i]), r.rng) if r.processor is not None else _plain_pick(logits[i], r)  # type: ignore[union-attr]
                picks[i] = t
                if sampled[i]:
                    probs[i].append(q)
                    top[i] = q.max()  # type: ignore[index]
            for row, t in zip(drafted, picks, strict=True):
                row.append(t)
            if top is not None and self.confidence_threshold > 0:
                active = np.flatnonzero(advance)  # (idle is set: track_top)
                plain = [i for i in active if not sampled[i]]
                if plain:
                    top[plain] = _top_probability(logits[plain])
                lens[active[top[active] < self.confidence_threshold]] = j + 1  # type: ignore[index]
                if not (lens > j + 1).any():  # type: ignore[operator]
                    break
            feed = [[t] for t in picks]
        for i, rid in enumerate(ids):
            if rid in want:
                k = int(lens[i]) if lens is not None else wanted[i]
                self.proposed[rid] = k
                out[want[rid][0]] = Draft(np.array(drafted[i][:k], np.int64), np.stack(probs[i][:k]) if probs[i] else None)

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        # the drafts this proposer made and fed, not len(draft): the round may have cut them since (draft_len=auto's
        # batch-width cap), and the cache holds what was fed
        rid, k = request.request_id, self.proposed.pop(request.request_id, 0)
        if k == 0:  # the draft was not fed this round
            self.pending[rid] = self.pending[rid] + target.emitted
            return
        # fed: pending + drafts[: k - 1]; of those drafts, the accepted ones stay
        kept = min(target.num_accepted, k - 1)
        if kept < k - 1:
            slot = self.slot_of[rid]
            self.cache.rollback(slot, self.cache.lengths_view[slot] - (k - 1 - kept))  # drop the rejected fed drafts
        self.pending[rid] = target.emitted[kept:]

    def resync(self, request_id: str, tokens: Sequence[int], agree: int) -> None:
        """The request's tokens are now ``tokens`` (a draft with another tokenizer re-encodes its text each round,
        runtime/proposers/cross_tokenizer.py): the cache keeps the first ``agree`` of them (at most what it holds,
        and never the last: pending is fed before drafting), the rest become pending."""
        slot = self.slot_of[request_id]
        self.proposed.pop(request_id, None)  # the cross-tokenizer adapter tracks what was fed itself
        keep = max(min(agree, int(self.cache.lengths[slot]), len(tokens) - 1), 0)
        self.cache.rollback(slot, keep)
        self.pending[request_id] = list(tokens[keep:])


def _plain_pick(logits: np.ndarray, r: Request) -> tuple[int, np.ndarray]:
    """A request without a processing chain (built by hand): temperature, top-k/p, min-p only."""
    q = processed_probs(logits[None], r.config.sampling)[0]
    return sample(q, r.rng), q


def _top_probability(logits: np.ndarray) -> np.ndarray:
    """logits [rows, vocab] -> the softmax probability of each row's argmax."""
    x = logits - logits.max(axis=-1, keepdims=True)
    return 1.0 / np.exp(x).sum(axis=-1)
