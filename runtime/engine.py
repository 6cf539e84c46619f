"""The request-level engine: requests join and leave a running batch.

    add_request(prompt_ids, config) -> request id      queued (first come, first served)
    step() -> [RequestOutput]                           one round for every running request,
                                                        then newcomers admitted and prefilled
    abort(request_id)                                   frees its slot at once
    has_unfinished()

The target's KV cache has ``max_batch_size`` slots; a running request holds
one, and running requests always sit in slots ``0..n-1`` (a leaving request's
slot takes the last request, a copy of that request's live K/V only). So a
verification round is one target call on slots ``0..n-1``, and a newcomer is
prefilled in one call on its own slot ``n`` with no other row padded to its
prompt (docs/architecture.md says why this and not chunked prefill).

A round, per request (gpt-fast's verbs):

    propose   the request's proposer offers up to k drafts (k fixed, or chosen by draft_len=auto)
    verify    the target scores [last token, d1..dk] in ONE call with every other request
    accept    token compare or rejection sampling keeps n <= k drafts
    append    d1..dn and the recovered (or bonus) token; the target rolls back to what was kept,
              the proposer observes the outcome

Per request: its own sampling, stops, RNG (its output never depends on its
batch), speculation method and draft length, and metrics.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .acceptance import accept_rejection_sampling, accept_token_compare
from .tree import accept_tree_greedy
from .backend import Executor
from .draft_len import PROBE_EVERY, AutoDraftLen
from .engine_format import TREE_MODES, EngineDir
from .errors import EngineError, RequestError
from .metrics import Metrics
from .pairing import check_pair
from .proposers.base import Draft, Proposer, TargetOutput
from .request import AUTO, GenerationConfig, Request, RequestOutput, RequestStatus
from .sampling import next_token


@dataclass(frozen=True)
class SpeculationConfig:
    """The engine's defaults for requests that do not choose (one source of truth)."""

    method: str = "none"  # none | draft | ngram | medusa | eagle
    draft_len: int | str = 0  # drafts per round, or "auto"


def check_draft_len(target: EngineDir, draft_len: int | str, what: str = "draft_len") -> None:
    """Every path that drafts passes here: a length the target cannot verify is refused."""
    build = target.config.build
    if draft_len == 0:
        return
    if build.speculative_decoding_mode not in ("draft_tokens_external", *TREE_MODES):
        raise EngineError(
            f"the target engine {target.path} was built with --speculative_decoding_mode {build.speculative_decoding_mode}, "
            "so it cannot verify drafts (a draft or plain engine). If it is the draft, pass it as the draft engine (--draft_engine_dir) "
            "and the target as --engine_dir; otherwise rebuild the target with --speculative_decoding_mode draft_tokens_external "
            f"--max_draft_len {max(8, draft_len) if draft_len != AUTO else 8}."
        )
    if draft_len != AUTO and int(draft_len) > build.max_draft_len:
        raise EngineError(
            f"{what}={draft_len} is larger than the target engine's max_draft_len={build.max_draft_len} (baked in at build time). "
            f"Use {what} <= {build.max_draft_len}, or rebuild the target with --max_draft_len {draft_len}."
        )


class Engine:
    def __init__(
        self,
        target: Executor,
        proposers: Sequence[Proposer] = (),
        speculation: SpeculationConfig = SpeculationConfig(),
        allow_vocab_mismatch: bool = False,
    ):
        self.target = target
        self.proposers: dict[str, Proposer] = {p.name: p for p in proposers}
        self.speculation = speculation
        build = target.build
        executors = [target] + [p.executor for p in proposers if hasattr(p, "executor")]  # type: ignore[attr-defined]
        self.max_batch = min(e.build.max_batch_size for e in executors)
        self.max_input_len = min(e.build.max_input_len for e in executors)
        # which engine sets the input limit, for the error that names it (the draft's may be the smaller)
        short = min(executors, key=lambda e: e.build.max_input_len)
        self._input_limit_by = "the target engine" if short is target else f"the draft engine {short.engine.path} (the target's is {build.max_input_len})"
        # The vocabulary draft and target share (padded vocabularies compare over the common ids).
        self.vocab_limit: int | None = None
        for p in proposers:
            ex = getattr(p, "executor", None)
            if ex is not None:
                limit = check_pair(target.engine, ex.engine, allow_vocab_mismatch)
                self.vocab_limit = limit if self.vocab_limit is None or limit is None else min(self.vocab_limit, limit)
                p.vocab_limit = limit  # type: ignore[attr-defined]
        # proposers that read the target's own outputs of a prefill call (Medusa: its heads on the last prompt row)
        self._prefill_hooks = {name: p.prefilled for name, p in self.proposers.items() if hasattr(p, "prefilled")}
        if speculation.method != "none" and speculation.method not in self.proposers:
            raise EngineError(f"the default speculation method {speculation.method!r} has no proposer loaded (loaded: {', '.join(self.proposers) or 'none'}).")
        if self.proposers:
            what = "ngram max_draft_len" if speculation.method == "ngram" else "draft_len"
            self._check_draft_len(speculation.draft_len if speculation.method != "none" else 0, what)
        self.cache = target.new_cache(self.max_batch)
        self.running: list[Request] = []  # running[s] holds slot s
        self.waiting: deque[Request] = deque()
        self.requests: dict[str, Request] = {}
        self.auto = AutoDraftLen(build.max_draft_len, self.max_batch)
        self.stats = Metrics()  # engine totals: every request's counts, merged as it finishes
        self._ids = itertools.count()
        self._aborted: list[Request] = []
        np.random.default_rng(0)  # numpy.random loads lazily (~30 ms): pay it here, not in the first request

    # -- checks ---------------------------------------------------------------------------
    def _check_draft_len(self, draft_len: int | str, what: str) -> None:
        check_draft_len(self.target.engine, draft_len, what)

    def validate(self, prompt: Sequence[int], what: str = "the prompt") -> list[int]:
        ids = [int(t) for t in prompt]
        if not ids:
            raise RequestError(f"{what} is empty.")
        if len(ids) > self.max_input_len:
            raise RequestError(
                f"{what} has {len(ids)} tokens, more than max_input_len={self.max_input_len} of {self._input_limit_by}. "
                "Shorten it or rebuild that engine with a larger --max_input_len."
            )
        vocab = self.target.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"{what} has token ids outside the vocabulary [0, {vocab}).")
        return ids

    # -- the request API --------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig(), request_id: str | None = None, seed_stream: int = 0) -> str:
        """Queue a request; it joins the running batch at the next step with a free slot.

        ``seed_stream``: with the sampling seed, keys this request's RNG (generate() passes
        each prompt's index, so prompts with the same seed still draw differently).
        """
        ids = self.validate(prompt_ids)
        method = config.method or self.speculation.method
        if method != "none" and method not in self.proposers:
            raise RequestError(f"speculation method {method!r} is not loaded in this engine (loaded: {', '.join(['none', *self.proposers])}).")
        draft_len = config.draft_len if config.draft_len is not None else self.speculation.draft_len
        if method == "none":
            draft_len = 0
        else:
            try:
                self._check_draft_len(draft_len, "draft_len")
            except EngineError as err:
                raise RequestError(str(err)) from None
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise RequestError(f"request id {rid!r} is already in use.")
        rng = np.random.default_rng([config.sampling.random_seed, seed_stream])
        req = Request(rid, ids, config, method, draft_len, rng)
        req.metrics.prompt_tokens = len(ids)
        self.requests[rid] = req
        self.waiting.append(req)
        return rid

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now: a queued one leaves the queue, a running one frees its slot.

        Returns its final output (tokens so far, metrics), also reported by the next step;
        None for an unknown or already finished request.
        """
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return None
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        else:
            self._free(req)
        req.status, req.finish_reason = RequestStatus.ABORTED, "abort"
        self._close(req)
        self._aborted.append(req)
        return self._output(req, [])

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self._aborted)

    def step(self) -> list[RequestOutput]:
        """One verification round for the running requests, then admit and prefill newcomers.

        Returns one output per request that produced tokens or ended in this step.
        """
        new: dict[str, list[int]] = {}
        ended = self._aborted
        self._aborted = []
        if self.running:
            ended += self._round(new)
        ended += self._admit(new)
        outs = [self._output(self.requests[rid], tokens) for rid, tokens in new.items()]
        outs += [self._output(r, []) for r in ended if r.request_id not in new]
        for r in ended:
            del self.requests[r.request_id]
        return outs

    # -- admission ------------------------------------------------------------------------
    def _admit(self, new: dict[str, list[int]]) -> list[Request]:
        free = self.max_batch - len(self.running)
        if not self.waiting or free <= 0:
            return []
        batch = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        first = len(self.running)
        now = time.perf_counter()
        for i, r in enumerate(batch):
            r.status, r.slot, r.times.scheduled = RequestStatus.RUNNING, first + i, now
        self.running += batch
        t0 = time.perf_counter()
        # logits: [len(batch), 1, vocab] at each prompt's last token
        logits = self.target.forward(self.cache, [r.prompt_ids for r in batch], all_logits=False, first_slot=first)[:, 0, : self.vocab_limit]
        firsts = [next_token(logits[i], r.config.sampling, r.rng) for i, r in enumerate(batch)]
        t1 = time.perf_counter()
        self.stats.target_s += t1 - t0
        ended = []
        for r, tok in zip(batch, firsts):
            r.times.first_token = t1
            r.metrics.target_s += (t1 - t0) / len(batch)
            if self._append(r, [tok], new):
                ended.append(r)
        for name, proposer in self.proposers.items():
            joining = [r for r in batch if r.method == name and r not in ended]
            if joining:
                t2 = time.perf_counter()
                proposer.add(joining)
                if name in self._prefill_hooks:  # a proposer that reads the target's prefill outputs (Medusa)
                    self._prefill_hooks[name](joining, first)
                dt = time.perf_counter() - t2
                self.stats.draft_s += dt
                for r in joining:
                    r.metrics.draft_s += dt / len(joining)
        for r in sorted(ended, key=lambda r: -r.slot):
            self._free(r, joined=False)
            self._close(r)
        return ended

    # -- a round --------------------------------------------------------------------------
    def _draft_len(self, r: Request) -> int:
        """How many drafts request r may take this round."""
        if r.method == "none":
            return 0
        proposer = self.proposers[r.method]
        limit = min(
            self.target.build.max_draft_len,
            r.config.max_output_len - len(r.output_ids) - 1,
            self.cache.max_seq_len - int(self.cache.lengths[r.slot]) - 2,
            proposer.room(r),
        )
        if limit <= 0:
            return 0
        if r.draft_len != AUTO:
            return min(int(r.draft_len), limit)
        if getattr(proposer, "tree", None) is not None:  # auto's cost model is a chain's: a tree is drafted as given
            return limit
        k = self.auto.choose(r.method, r.metrics.accepted, r.metrics.rejected, limit, len(self.running), r.auto_k)
        r.auto_k = k
        if k == 0:
            r.idle_rounds += 1
            if r.idle_rounds >= PROBE_EVERY:  # look again: the text may have changed
                r.idle_rounds, k = 0, 1
        else:
            r.idle_rounds = 0
        return k

    def _round(self, new: dict[str, list[int]]) -> list[Request]:
        reqs = self.running
        lens = [self._draft_len(r) for r in reqs]
        timing = any(r.draft_len == AUTO for r in reqs)  # step costs feed draft_len=auto only
        drafts: list[Draft] = [Draft.empty()] * len(reqs)
        for name, proposer in self.proposers.items():
            idx = [i for i, r in enumerate(reqs) if r.method == name and lens[i] > 0]
            if not idx:
                continue
            t0 = time.perf_counter()
            got = proposer.propose([reqs[i] for i in idx], [lens[i] for i in idx])
            dt = time.perf_counter() - t0
            self.stats.draft_s += dt
            if timing:
                self.auto.record_draft(name, len(idx), max(len(d) for d in got), dt)
            for i, d in zip(idx, got):
                drafts[i] = d
                reqs[i].metrics.draft_s += dt / len(idx)
        # feed [last token, d1..dk] per slot 0..n-1; logits: [n, max k + 1, vocab]
        feed = [[r.last_token, *d.tokens.tolist()] for r, d in zip(reqs, drafts)]
        # a tree's parents in the call's order: the last token (row 0) is the root
        trees = [None if d.parents is None else np.concatenate([[-1], d.parents + 1]) for d in drafts]
        t0 = time.perf_counter()
        logits = self.target.forward(self.cache, feed, all_logits=True, parents=trees if any(t is not None for t in trees) else None)
        t1 = time.perf_counter()
        self.stats.target_s += t1 - t0
        if timing:
            self.auto.record_verify(len(reqs), logits.shape[1], t1 - t0)
        ended = []
        for r, d in zip(reqs, drafts):
            k = len(d)  # a proposer may offer fewer than allowed (n-gram: no match)
            rows = logits[r.slot, : k + 1, : self.vocab_limit]
            sampling = r.config.sampling
            start = int(self.cache.lengths[r.slot]) - k - 1  # where the call's k + 1 tokens went
            if d.parents is not None:  # a tree: greedy requests only (proposers draft chains for sampled ones)
                path, nxt = accept_tree_greedy(d.tokens, d.parents, rows)
                n, kept = len(path), [0] + [j + 1 for j in path]
                emitted = d.tokens[path].tolist() + [nxt]
                self.target.compact_slot(self.cache, r.slot, start, kept)  # the path's K/V into contiguous slots
                depth = int(d.depths.max()) if k else 0
            else:
                if d.probs is not None:
                    n, nxt = accept_rejection_sampling(d.tokens, d.probs, rows, sampling, r.rng)
                else:
                    n, nxt = accept_token_compare(d.tokens, rows, sampling, r.rng)
                emitted, kept, depth = d.tokens[:n].tolist() + [nxt], list(range(n + 1)), k
                self.cache.rollback(r.slot, start + 1 + n)  # keep the last token and n drafts
            if r.method != "none":
                self.proposers[r.method].observe(r, d, TargetOutput(rows, n, emitted, kept))
                self.auto.record_round(r.method, k, n)
            r.metrics.record_round(k, n, depth)
            r.metrics.target_s += (t1 - t0) / len(reqs)
            if self._append(r, emitted, new):
                ended.append(r)
        for r in sorted(ended, key=lambda r: -r.slot):  # highest slot first: the moved last slot is never an ended one
            self._free(r)
            self._close(r)
        return ended

    # -- bookkeeping ----------------------------------------------------------------------
    def _append(self, r: Request, tokens: list[int], new: dict[str, list[int]]) -> bool:
        """Append tokens one by one, stopping at the first stop condition. True if r finished."""
        cfg, out = r.config, r.output_ids
        added = new.setdefault(r.request_id, [])
        reason = ""
        for t in tokens:
            out.append(t)
            added.append(t)
            if t in cfg.end_ids:
                reason = "end_id"
            elif any(len(s) <= len(out) and tuple(out[-len(s):]) == s for s in cfg.stop_words):
                reason = "stop_words"
            elif len(out) >= cfg.max_output_len:
                reason = "length"
            if reason:
                break
        if not reason and r.num_tokens >= self.cache.max_seq_len:
            reason = "max_seq_len"  # the engine holds no more: a clean stop, never an overflow
        if reason:
            r.status, r.finish_reason = RequestStatus.FINISHED, reason
        return bool(reason)

    def _free(self, r: Request, joined: bool = True) -> None:
        """Give r's slot back: the last running request moves into it."""
        slot, last = r.slot, len(self.running) - 1
        if slot != last:
            moved = self.running[last]
            self.target.copy_slot(self.cache, last, slot)
            self.running[slot], moved.slot = moved, slot
        self.running.pop()
        self.cache.lengths[last] = 0
        r.slot = -1
        if joined and r.method != "none":
            self.proposers[r.method].remove(r.request_id)

    def _close(self, r: Request) -> None:
        t = r.times
        t.finished = time.perf_counter()
        m = r.metrics
        m.output_tokens = len(r.output_ids)
        m.total_s = t.finished - t.arrival
        if t.first_token:
            m.ttft_s, m.queue_s = [t.ttft_s], [t.queue_s]
        if len(r.output_ids) >= 2:
            m.tpot_s = [t.tpot_s(len(r.output_ids))]
        self.stats.merge(m)

    @staticmethod
    def _output(r: Request, tokens: list[int]) -> RequestOutput:
        return RequestOutput(
            input_ids=r.prompt_ids,
            output_ids=list(r.output_ids),
            finish_reason=r.finish_reason,
            request_id=r.request_id,
            new_token_ids=tokens,
            finished=r.finished,
            metrics=r.metrics,
        )
