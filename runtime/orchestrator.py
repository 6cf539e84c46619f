"""The V1 orchestrator loop: propose, verify, accept, append.

    prefill   target (and proposer) read the prompts; the target picks token 1
    propose   up to draft_len drafts per row
    verify    the target scores [last token, d1..dk] in ONE call: k + 1 rows of logits
    accept    token compare or rejection sampling decides n <= k survivors
    append    d1..dn and the target's next token; both caches roll back to what was kept

No prefill is ever re-run: the caches live across rounds. Target-only
decoding is the same loop with a proposer that proposes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .acceptance import accept_rejection_sampling, accept_token_compare
from .errors import RequestError
from .executor import OrtExecutor
from .metrics import Metrics
from .proposers.base import Proposal, Proposer
from .sampling import SamplingConfig, next_token


@dataclass(frozen=True)
class GenerationConfig:
    max_output_len: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    end_ids: tuple[int, ...] = ()  # stop after any of these (empty: never)
    stop_words: tuple[tuple[int, ...], ...] = ()  # token sequences that end a row

    def __post_init__(self) -> None:
        if self.max_output_len < 1:
            raise RequestError(f"max_output_len={self.max_output_len} must be >= 1.")


@dataclass
class RequestOutput:
    input_ids: list[int]
    output_ids: list[int]  # new tokens only
    finish_reason: str = ""  # end_id | stop_words | length | max_seq_len
    text: str | None = None


# on_tokens(request_index, new_token_ids): called as tokens are accepted (streaming)
TokenCallback = Callable[[int, list[int]], None]


class NoDraft:
    """The proposer of plain target-only decoding."""

    name = "none"

    def prefill(self, prompts, first_tokens, rngs=None) -> None:
        self._batch = len(prompts)

    def room(self) -> np.ndarray:
        return np.zeros(self._batch, np.int64)

    def propose(self, draft_lens: np.ndarray) -> Proposal:
        empty = np.zeros(0, np.int64)
        return Proposal(tokens=[empty] * self._batch, probs=[None] * self._batch)

    def commit(self, row, num_drafted, num_accepted, emitted) -> None:
        pass

    def keep_rows(self, rows: np.ndarray) -> None:
        self._batch = len(rows)


class Orchestrator:
    def __init__(self, target: OrtExecutor, proposer: Proposer | None = None, draft_len: int = 0, use_logits: bool = False, vocab_limit: int | None = None):
        self.target = target
        self.proposer = proposer or NoDraft()
        self.draft_len = draft_len if proposer is not None else 0
        self.use_logits = use_logits
        self.vocab_limit = vocab_limit  # compare over the shared vocabulary when draft and target pad differently
        max_batch = target.build.max_batch_size
        executor = getattr(proposer, "executor", None)
        self.max_batch = min(max_batch, executor.build.max_batch_size) if executor else max_batch
        self.max_input_len = min(target.build.max_input_len, executor.build.max_input_len) if executor else target.build.max_input_len
        np.random.default_rng(0)  # numpy.random loads lazily (~30 ms): pay it here, not in the first request

    def generate(self, prompts: Sequence[Sequence[int]], config: GenerationConfig, on_tokens: TokenCallback | None = None) -> tuple[list[RequestOutput], Metrics]:
        """Decode every prompt; more prompts than max_batch_size run in chunks."""
        prompts = [list(map(int, p)) for p in prompts]
        self._validate(prompts)
        metrics = Metrics(requests=len(prompts), prompt_tokens=sum(map(len, prompts)))
        outputs: list[RequestOutput] = []
        start = time.perf_counter()
        for lo in range(0, len(prompts), self.max_batch):
            chunk = prompts[lo : lo + self.max_batch]
            rngs = [np.random.default_rng([config.sampling.random_seed, lo + i]) for i in range(len(chunk))]
            outputs += self._run_batch(chunk, lo, config, rngs, metrics, on_tokens, start)
        metrics.total_s = time.perf_counter() - start
        metrics.output_tokens = sum(len(o.output_ids) for o in outputs)
        return outputs, metrics

    def _validate(self, prompts: list[list[int]]) -> None:
        if not prompts:
            raise RequestError("no prompts given.")
        vocab = self.target.vocab_size
        for i, p in enumerate(prompts):
            if not p:
                raise RequestError(f"prompt {i} is empty.")
            if len(p) > self.max_input_len:
                raise RequestError(
                    f"prompt {i} has {len(p)} tokens, more than the engines' max_input_len={self.max_input_len}. "
                    "Shorten it or rebuild with a larger --max_input_len."
                )
            if min(p) < 0 or max(p) >= vocab:
                raise RequestError(f"prompt {i} has token ids outside the vocabulary [0, {vocab}).")

    def _run_batch(self, prompts, offset, config: GenerationConfig, rngs, metrics: Metrics, on_tokens, t_start) -> list[RequestOutput]:
        target, proposer, sampling = self.target, self.proposer, config.sampling
        batch = len(prompts)
        results = [RequestOutput(input_ids=p, output_ids=[]) for p in prompts]
        cache = target.new_cache(batch)

        t0 = time.perf_counter()
        logits = target.forward(cache, prompts, all_logits=False)[:, 0, : self.vocab_limit]
        first = [next_token(logits[b], sampling, rngs[b]) for b in range(batch)]
        metrics.target_s += time.perf_counter() - t0
        metrics.ttft_s += [time.perf_counter() - t_start] * batch

        t0 = time.perf_counter()
        proposer.prefill(prompts, first, rngs)
        metrics.draft_s += time.perf_counter() - t0

        rows = np.arange(batch)  # active row -> index into this batch
        last = np.zeros(batch, np.int64)
        finished = [self._append(results[b], [first[b]], config, cache.max_seq_len, offset + b, on_tokens) for b in range(batch)]
        last[:] = first
        rows, last = self._drop_finished(rows, last, finished, cache)

        while len(rows):
            produced = np.array([len(results[r].output_ids) for r in rows])
            draft_lens = np.minimum.reduce([
                np.full(len(rows), self.draft_len),
                config.max_output_len - produced - 1,
                cache.max_seq_len - cache.lengths - 2,
                proposer.room(),
            ]).clip(min=0)

            t0 = time.perf_counter()
            proposal = proposer.propose(draft_lens)
            t1 = time.perf_counter()
            feed = [[int(last[i])] + proposal.tokens[i].tolist() for i in range(len(rows))]
            logits = target.forward(cache, feed, all_logits=True)
            t2 = time.perf_counter()
            metrics.draft_s += t1 - t0
            metrics.target_s += t2 - t1

            finished = []
            for i, r in enumerate(rows):
                drafts = proposal.tokens[i]
                k = len(drafts)  # a proposer may offer fewer than allowed (n-gram: no match)
                row_logits = logits[i, : k + 1, : self.vocab_limit]
                if self.use_logits and proposal.probs[i] is not None:
                    n, nxt = accept_rejection_sampling(drafts, proposal.probs[i], row_logits, sampling, rngs[r])
                else:
                    n, nxt = accept_token_compare(drafts, row_logits, sampling, rngs[r])
                emitted = drafts[:n].tolist() + [nxt]
                cache.rollback(i, int(cache.lengths[i]) - k + n)  # fed k + 1, keep the last token and n drafts
                proposer.commit(i, k, n, emitted)
                metrics.record_round(k, n)
                last[i] = nxt
                finished.append(self._append(results[r], emitted, config, cache.max_seq_len, offset + r, on_tokens))
            metrics.draft_s += time.perf_counter() - t2  # acceptance + bookkeeping counts as draft overhead
            rows, last = self._drop_finished(rows, last, finished, cache)
        return results

    def _drop_finished(self, rows, last, finished: list[bool], cache) -> tuple[np.ndarray, np.ndarray]:
        if not any(finished):
            return rows, last
        keep = np.flatnonzero(~np.asarray(finished))
        cache.keep_rows(keep)
        self.proposer.keep_rows(keep)
        return rows[keep], last[keep]

    @staticmethod
    def _append(out: RequestOutput, tokens: list[int], config: GenerationConfig, max_seq_len: int, request: int, on_tokens) -> bool:
        """Append tokens one by one, stopping at the first stop condition. True if the row finished."""
        added = []
        reason = ""
        for t in tokens:
            out.output_ids.append(t)
            added.append(t)
            if t in config.end_ids:
                reason = "end_id"
            elif any(len(s) <= len(out.output_ids) and tuple(out.output_ids[-len(s):]) == s for s in config.stop_words):
                reason = "stop_words"
            elif len(out.output_ids) >= config.max_output_len:
                reason = "length"
            if reason:
                break
        if not reason and len(out.input_ids) + len(out.output_ids) >= max_seq_len:
            reason = "max_seq_len"  # the engine holds no more: a clean stop, never an overflow
        if on_tokens and added:
            on_tokens(request, added)
        out.finish_reason = reason
        return bool(reason)
