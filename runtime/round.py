"""One speculative round over the running requests, and the prefill that starts each one.

A round, per request (gpt-fast's verbs):

    propose   the request's proposer offers up to k drafts (k: the DraftPolicy's, runtime/draft_policy.py:
              the request's own, or what draft_len=auto's cost model expects to pay)
    verify    the target scores [last token, d1..dk] in ONE call with every other request
    accept    token compare, rejection sampling or a tree's path (greedy, token compare or recursive rejection
              sampling) keeps n <= k drafts
    append    d1..dn and the recovered (or bonus) token; the target rolls back to what was kept,
              the proposer observes the outcome

The round never picks who runs (runtime/scheduler.py does) and never frees a
slot: it returns the requests that finished, and the engine lets them go.

Each request's logits processing chain (runtime/logits.py: penalties, logit
bias, a grammar) is applied at every position the target samples or
verifies, with that position's own history (the drafts before it included),
and by the proposers to the drafts alike; a draft token the request's
grammar forbids ends its draft there (``trim``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from .acceptance import accept_greedy_plain, accept_rejection_sampling, accept_token_compare
from .backends.base import NO_EXTRAS, Executor, Setups, StepOutput
from .draft_policy import DraftPolicy
from .guards import SILENT_DRAFT_ROUNDS, finite, first_nonfinite, first_nonfinite_of_argmax, nonfinite_message, silent_draft_message
from .kv_cache import KVCache
from .logits import Rows, logprobs
from .metrics import Metrics
from .prefix_cache import PrefixCache
from .proposers.base import Draft, Proposer, TargetOutput
from .request import AUTO, Request, RequestStatus
from .sampling import processed_probs
from .tree import accept_tree_rejection_sampling, accept_tree_token_compare

NewTokens = dict[str, list[int]]  # request id -> the tokens this step appended to it
ONE_ROW = [0]  # the rows a round without drafts keeps: its only one (never written to)


def append(r: Request, tokens: list[int], new: NewTokens, max_seq_len: int) -> bool:
    """Append tokens one by one, stopping at the first stop condition. True if r finished."""
    cfg, out, proc = r.config, r.output_ids, r.processor
    # only a grammar fails or completes, only a chain that reads the history commits (LogitsProcessor.failed/done/commit)
    grammar = proc if proc is not None and proc.grammar is not None else None
    history = proc if proc is not None and not proc.plain else None
    end_ids, stop_words, max_output_len = cfg.end_ids, cfg.stop_words, cfg.max_output_len
    added = new.setdefault(r.request_id, [])
    reason = ""
    for t in tokens:
        if grammar is not None and (why := grammar.failed(out)):  # t came from a mask llguidance could not compute
            return fail(r, why, "grammar")
        out.append(t)
        added.append(t)
        if history is not None:
            history.commit([t])
        if t in end_ids:
            reason = "end_id"
        elif grammar is not None and grammar.done:
            reason = "grammar"  # the output is complete: its grammar takes no more tokens
        elif stop_words and len(out) > cfg.min_output_len and any(len(s) <= len(out) and tuple(out[-len(s):]) == s for s in stop_words):
            reason = "stop_words"
        elif len(out) >= max_output_len:
            reason = "length"
        if reason:
            break
    if not reason and grammar is not None and (why := grammar.failed(out)):  # no next mask: the grammar cannot go on after out
        return fail(r, why, "grammar")
    if not reason and len(r.prompt_ids) + len(out) >= max_seq_len:
        reason = "max_seq_len"  # the engine holds no more: a clean stop, never an overflow
    if reason:
        r.status, r.finish_reason = RequestStatus.FINISHED, reason
    return bool(reason)


def fail(r: Request, error: str, cause: str) -> bool:
    """Stop r with finish_reason "error", emitting nothing more. True (it finished).
    cause: what failed, for whoever reports it: nonfinite_logits | grammar (runtime/request.py: ERROR_CAUSES)."""
    r.status, r.finish_reason, r.error, r.error_cause = RequestStatus.FINISHED, "error", error, cause
    return True


def watch_drafts(r: Request, drafted: int, accepted: int) -> None:
    """Count drafting rounds with nothing accepted; say so once after SILENT_DRAFT_ROUNDS in a row (runtime/guards.py),
    and with draft_len=auto stop drafting for r."""
    if not drafted:
        return
    r.rejected_rounds = 0 if accepted else r.rejected_rounds + 1
    if r.rejected_rounds >= SILENT_DRAFT_ROUNDS and not r.metrics.silent_drafts:
        r.drafting_stopped = r.draft_len == AUTO
        r.metrics.silent_drafts = 1
        r.warning = silent_draft_message(r.method, SILENT_DRAFT_ROUNDS, r.drafting_stopped)


class SpeculativeRound:
    """The target, its cache and the proposers, run one round at a time (engine totals in ``stats``)."""

    def __init__(self, target: Executor, cache: KVCache, proposers: Mapping[str, Proposer], vocab_limit: int | None,
                 policy: DraftPolicy, stats: Metrics, prefix: PrefixCache | None = None):
        self.target, self.cache, self.proposers = target, cache, proposers
        self.vocab_limit, self.policy, self.stats = vocab_limit, policy, stats  # policy: how many drafts (draft_policy.py)
        self.prefix = prefix  # the prefix cache: a newcomer's cached rows are copied, not prefilled
        self.rounds = 0  # rounds run: requests at k = 0 under draft_len=auto probe together (AutoDraftLen.probe_due)
        self._plain_logits: np.ndarray | None = None  # decode_plain's last logits buffer and its row
        self._plain_row: np.ndarray | None = None

    # -- prefill: a newcomer's prompt and its first token --------------------------------
    def prefill(self, batch: list[Request], first: int, new: NewTokens) -> list[Request]:
        """Run the prompts of ``batch`` (in slots first, first + 1, ...), pick each first token, start the
        proposers; the requests that finished on their first token."""
        t0 = time.perf_counter()
        echo = any(r.config.prompt_logprobs for r in batch)  # every row's logits, for the prompts' log-probabilities
        if self.prefix is not None:
            self.prefix.copy_in(batch)  # cached rows: the prompt is fed from metrics.cached_tokens on
        feeds = [r.prompt_ids[r.metrics.cached_tokens :] for r in batch]
        step = self.target.forward(self.cache, feeds, all_logits=echo, first_slot=first)
        out = step.logits  # [len(batch), 1 or the longest feed, vocab]
        # logits: [len(batch), vocab] at each prompt's last token
        logits = out[np.arange(len(batch)), [len(f) - 1 if echo else 0 for f in feeds], : self.vocab_limit]
        for i, r in enumerate(batch):
            if r.config.prompt_logprobs:  # scored whether or not a token can be picked after them
                r.prompt_logprobs = self._prompt_logprobs(r, out[i])
        firsts = [self._first_token(r, logits[i]) if finite(logits[i]) else None for i, r in enumerate(batch)]
        if self.prefix is not None:  # the proposers see the prefill a cold server would have run (per-token outputs whole)
            step = self.prefix.prefilled(batch, step, first)
        t1 = time.perf_counter()
        self.stats.target_s += t1 - t0
        self.stats.prompt_target_s += t1 - t0
        share = (t1 - t0) / len(batch)
        ended = []
        for r, tok in zip(batch, firsts, strict=True):
            r.metrics.target_s += share
            r.metrics.prompt_target_s += share
            if tok is None:  # no token from logits that are not numbers
                fail(r, nonfinite_message(0), "nonfinite_logits")
                ended.append(r)
                continue
            r.times.first_token = t1
            if append(r, [tok], new, self.cache.max_seq_len):
                ended.append(r)
        for name, proposer in self.proposers.items():
            joining = [r for r in batch if r.method == name and r not in ended]
            if joining:
                t2 = time.perf_counter()
                for r in joining:
                    r.proposing = True  # before add: one cut short may hold some of them (remove takes what it holds)
                proposer.add(joining)
                proposer.prefilled(joining, step, first)  # Medusa's heads, EAGLE's features of the prompt
                dt = time.perf_counter() - t2
                self.stats.draft_s += dt
                self.stats.prompt_draft_s += dt
                for r in joining:
                    r.metrics.draft_s += dt / len(joining)
                    r.metrics.prompt_draft_s += dt / len(joining)
        return ended

    def _prompt_logprobs(self, r: Request, rows: np.ndarray) -> list:
        """rows: [prompt len, vocab], the prompt's every row: row t - 1 scores prompt token t. None for the first token,
        and for a token after a row that holds NaN or Inf (no distribution to score it by)."""
        cfg, width = r.config, self.vocab_limit or rows.shape[-1]
        top, rank = (cfg.logprobs or 0, False) if cfg.prompt_logprobs_top is None else (cfg.prompt_logprobs_top, True)
        # (a prompt id past a smaller draft's vocabulary, which cuts the rows: no score, as for a row that is not finite)
        return [None] + [logprobs(rows[t - 1, :width], r.prompt_ids[t], top, rank) if r.prompt_ids[t] < width and finite(rows[t - 1, :width])
                         else None for t in range(1, len(r.prompt_ids))]

    def _first_token(self, r: Request, last: np.ndarray) -> int:
        """The token the prefill picks (last: [vocab] at the prompt's last token)."""
        proc = r.processor
        x = proc.logits(last) if proc is not None else last
        tok = r.target_draws.draw(processed_probs(x[None], r.config.sampling)[0], 0) if not r.config.sampling.greedy else int(np.argmax(x))
        if r.config.logprobs is not None:
            r.logprobs.append(logprobs(x, tok, r.config.logprobs))
        return tok

    # -- a round ------------------------------------------------------------------------
    def run(self, reqs: list[Request], new: NewTokens) -> list[Request]:
        """One round for ``reqs`` (the running requests, request i in slot i); the requests that finished."""
        if len(reqs) == 1 and self.plain_decoding(reqs[0]):
            return self.decode_plain(reqs, new)
        self.rounds += 1
        # deciding: the policy's begin, each request's length and the batch's fit (a clock read is a system call on some
        # hosts, hundreds of ns, and more right after a model call: none is repeated where a proposer cannot run between)
        t_decide = time.perf_counter()
        self.policy.begin(reqs, self.rounds)
        lens = self.draft_lens(reqs)
        t_decided = time.perf_counter()
        if any(lens) or any(p.overdue for p in self.proposers.values()):
            drafts = self.propose(reqs, lens)
            t_fit = time.perf_counter()
            drafts = self.batch_cap(reqs, drafts)
        else:  # no request drafts: nothing to propose or fit
            drafts, t_fit = [Draft.empty()] * len(reqs), t_decided
        decide_s = t_decided - t_decide + time.perf_counter() - t_fit
        self.stats.decide_s += decide_s
        for r in reqs:
            r.metrics.decide_s += decide_s / len(reqs)
        setups = Setups.count
        step, share_s, feed, t0 = self.verify(reqs, drafts)
        plain = self.plain_picks(reqs, drafts, step)
        if plain:
            self.observe_plain(reqs, plain, step)
        ended = [r for r, d, fed in zip(reqs, drafts, feed, strict=True)
                 if (self.accept_plain(r, d, plain[r.slot], step, share_s, new) if r.slot in plain else self.accept(r, d, fed, step, share_s, new))]
        # the call and the per-row work after it (acceptance, rollback, the proposers' observe): what a width costs,
        # unless the call captured a CUDA graph (a new shape on this cache: once, not the width's cost)
        if Setups.count == setups:
            self.policy.verified(len(reqs), step.logits.shape[1], time.perf_counter() - t0)
        return ended

    def plain_decoding(self, r: Request) -> bool:
        """r decodes target-only (no proposer for its method), greedy, with no logits processing or log-probabilities:
        its round is one token, its argmax (decode_plain)."""
        proc = r.processor
        return (r.method not in self.proposers and r.config.logprobs is None and r.config.sampling.greedy
                and (proc is None or proc.plain))

    def decode_plain(self, reqs: list[Request], new: NewTokens) -> list[Request]:
        """run() for one request that plain_decoding() takes: the same call, token, checks and bookkeeping as propose,
        verify, accept and keep make for it (no drafts: nothing to decide, fit or roll back), in a few lines. On a small
        model a step is a few milliseconds and each Python call after it runs on cold caches (the call streamed the
        weights through them): the general round's ~100 calls cost about 5% of a step there (issue 41)."""
        (r,) = reqs
        self.rounds += 1
        self.policy.begin(reqs, self.rounds)  # (draft_len=auto times the target's width-1 calls in rounds it prices)
        t0 = time.perf_counter()
        step = self.target.forward(self.cache, [[r.output_ids[-1]]], all_logits=True)
        t1 = time.perf_counter()
        self.stats.target_s += t1 - t0
        r.metrics.target_s += t1 - t0
        if step.logits is not self._plain_logits:  # the call shape's output buffer, the same one every step: its row view kept
            self._plain_logits, self._plain_row = step.logits, step.logits[0, 0, : self.vocab_limit]  # [vocab]
        row = self._plain_row
        token, bottom = int(row.argmax()), int(row.argmin())
        if not (math.isfinite(row.item(token)) and math.isfinite(row.item(bottom))):  # first_nonfinite_of_argmax's test, one row
            # as accept: no token from this row (append of none still ends r at max_seq_len, and lists it in new)
            ended = append(r, [], new, self.cache.max_seq_len) or fail(r, nonfinite_message(len(r.output_ids)), "nonfinite_logits")
        else:
            if self.prefix is not None:
                self.prefix.observe(r, step, ONE_ROW)
            r.metrics.record_round(0, 0, 0)
            ended = append(r, [token], new, self.cache.max_seq_len)
        self.policy.verified(1, 1, time.perf_counter() - t0)
        return [r] if ended else []  # a new list: reqs is the engine's running list, which letting r go empties

    def draft_lens(self, reqs: list[Request]) -> list[int]:
        """Each request's draft_len this round. A method whose draft_len=auto requests all take none this round (the
        policy's one check for the batch: DraftPolicy.declines_all) does not have them asked one by one."""
        running, policy = len(reqs), self.policy
        quiet = {name for name, proposer in self.proposers.items() if policy.declines_all(name, proposer, running)}
        if not quiet:
            return [self.draft_len(r, running) for r in reqs]
        return [0 if r.method in quiet and r.draft_len == AUTO else self.draft_len(r, running) for r in reqs]

    def draft_len(self, r: Request, running: int) -> int:
        """How many drafts request r may take this round (``running``: requests in the batch): the policy's choice,
        within what the target, the request's length, its cache slot and its proposer leave room for."""
        proposer = self.proposers.get(r.method)  # None: the request decodes target-only
        if proposer is None or r.drafting_stopped or self.policy.declines(r, proposer, running):
            return 0
        limit = min(
            self.target.build.max_draft_len,
            r.config.max_output_len - len(r.output_ids) - 1,
            self.cache.max_seq_len - self.cache.lengths_view[r.slot] - 2,
            proposer.room(r),
        )
        return self.policy.draft_len(r, proposer, limit, running) if limit > 0 else 0

    def batch_cap(self, reqs: list[Request], drafts: list[Draft]) -> list[Draft]:
        """The drafts the round verifies, as the policy keeps them: one call verifies them all and is as wide as its
        widest row (draft_len=auto: a scored draft's prefix that pays, then the width that pays for the whole batch)."""
        return self.policy.fit(reqs, drafts)

    def propose(self, reqs: list[Request], lens: list[int]) -> list[Draft]:
        """Each request's drafts (empty where it takes none), one ``propose`` call per proposer; the backlogs of the
        requests that draft, and the proposer's overdue ones, fed first."""
        drafts: list[Draft] = [Draft.empty()] * len(reqs)
        for name, proposer in self.proposers.items():
            idx = [i for i, r in enumerate(reqs) if r.method == name and lens[i] > 0]
            feeding = [reqs[i] for i in idx]
            if proposer.overdue:  # backlogs past what it keeps: fed now, drafting or not
                feeding += [r for i, r in enumerate(reqs) if r.request_id in proposer.overdue and lens[i] == 0]
            if not feeding:
                continue
            setups = Setups.count
            t0 = time.perf_counter()
            fed = proposer.catch_up(feeding)  # timed apart: a prefill is not a draft step
            t1 = time.perf_counter()
            if not idx:  # backlogs alone
                self.stats.draft_s += t1 - t0
                if Setups.count == setups:
                    self.policy.proposed(name, 0, 0, 0.0, fed, t1 - t0)
                for r in feeding:
                    r.metrics.draft_s += (t1 - t0) / len(feeding)
                continue
            got = proposer.propose([reqs[i] for i in idx], [lens[i] for i in idx])
            t2 = time.perf_counter()
            self.stats.draft_s += t2 - t0
            if Setups.count == setups:  # a call that captured a CUDA graph is not what drafting costs
                calls, refine_s = proposer.refined  # (P-EAGLE's refining calls: timed apart from the call that drafted)
                self.policy.proposed(name, len(idx), max(d.drafted for d in got), t2 - t1 - refine_s, fed, t1 - t0, (calls, refine_s))
            for i, d in zip(idx, got, strict=True):
                drafts[i] = trim(reqs[i], d)
                reqs[i].metrics.draft_s += (t2 - t0) / len(idx)
        return drafts

    def verify(self, reqs: list[Request], drafts: Sequence[Draft]) -> tuple[StepOutput, float, list[list[int]], float]:
        """One target call on slots 0..n-1 fed [last token, d1..dk] per request: (its outputs, logits [n, max k + 1, vocab],
        each request's share of the call's seconds, what each request was fed as ints, when the call started)."""
        feed = [[r.output_ids[-1], *d.tokens.tolist()] if len(d.tokens) else [r.output_ids[-1]] for r, d in zip(reqs, drafts, strict=True)]
        # a tree's parents in the call's order: the last token (row 0) is the root
        trees = None
        if any(d.parents is not None for d in drafts):
            trees = [None if d.parents is None else np.concatenate([[-1], d.parents + 1]) for d in drafts]
        t0 = time.perf_counter()
        step = self.target.forward(self.cache, feed, all_logits=True, parents=trees)
        t1 = time.perf_counter()
        self.stats.target_s += t1 - t0
        return step, (t1 - t0) / len(reqs), feed, t0

    def plain_picks(self, reqs: list[Request], drafts: Sequence[Draft], step: StepOutput) -> dict[int, int]:
        """slot -> token for the rows ``accept_plain`` takes: no drafts, greedy, no logits processing or log-probabilities,
        a finite row. Their argmaxes (and argmins: a row is finite exactly when its values at both are, as
        first_nonfinite_of_argmax reads it) in one call over the batch instead of a few numpy calls per request: at 64
        requests on a GPU the per-request work is a visible share of a round. Empty under two such rows."""
        if len(reqs) < 2:  # batch 1 (issue 41's loop cost): not even the scan for such rows
            return {}
        slots = [r.slot for r, d in zip(reqs, drafts, strict=True) if not len(d) and r.config.logprobs is None and r.config.sampling.greedy
                 and (r.processor is None or r.processor.plain)]
        if len(slots) < 2:
            return {}
        rows = step.logits[:, 0, : self.vocab_limit]  # [n, vocab], a view (every row: a copy of a batch's rows costs more)
        at = np.asarray(slots)
        tops, bottoms = rows.argmax(axis=-1)[at], rows.argmin(axis=-1)[at]
        finite_rows = np.isfinite(rows[at, tops]) & np.isfinite(rows[at, bottoms])
        return {s: t for s, t, ok in zip(slots, tops.tolist(), finite_rows.tolist(), strict=True) if ok}

    def observe_plain(self, reqs: list[Request], plain: dict[int, int], step: StepOutput) -> None:
        """The proposers' observe for the rows of plain_picks, one call per proposer for all of its requests among them
        (Proposer.observe_plain): at a full batch where draft_len=auto does not draft, every request's row is one."""
        for name, proposer in self.proposers.items():
            mine = [r for r in reqs if r.method == name and r.slot in plain]
            if mine:
                proposer.observe_plain(mine, step, [plain[r.slot] for r in mine], self.vocab_limit)

    def accept_plain(self, r: Request, d: Draft, token: int, step: StepOutput, share_s: float, new: NewTokens) -> bool:
        """``accept`` for a row of plain_picks: its one token is the row's argmax (what accept does for such a row); its
        proposer has observed it already (observe_plain)."""
        r.metrics.target_s += share_s
        return self.keep(r, d, step, step.logits[r.slot, :1, : self.vocab_limit], 0, [token], ONE_ROW, 0, new, observed=True)

    def accept(self, r: Request, d: Draft, fed: list[int], step: StepOutput, share_s: float, new: NewTokens) -> bool:
        """Keep what the target agrees with, roll the rest back, append, tell the proposer. True if r finished.
        fed: what the call fed r, [last token, *d.tokens] as ints."""
        k = len(d)  # a proposer may offer fewer than allowed (n-gram: no match)
        raw = step.logits[r.slot, : k + 1, : self.vocab_limit]
        sampling, proc = r.config.sampling, r.processor
        rows: Rows | None = None  # each row processed with its own history, when reached (not needed for plain greedy rows)
        picks: list[int] | None = None  # the raw rows' argmaxes, when acceptance took them
        if d.parents is not None:  # a tree: the path of argmaxes (greedy), of recursive rejection sampling (drawn children)
            rows = Rows(raw, proc, d.tokens)  # or of the target's own draws (sampled, deterministic nodes: token compare)
            if d.probs is not None:
                path, nxt = accept_tree_rejection_sampling(d.tokens, d.parents, d.probs, rows, sampling, r.target_draws)
            else:
                path, nxt = accept_tree_token_compare(d.tokens, d.parents, rows, sampling, r.target_draws)
            n, kept = len(path), [0] + [j + 1 for j in path]
            emitted = d.tokens[path].tolist() + [nxt]
            depth = int(d.depths.max()) if k else 0
        else:
            if (proc is None or proc.plain) and sampling.greedy:  # what both rules do for such a request, without Rows
                drafted = fed[1:]
                # the raw rows' argmaxes, as far as they are read: row 0's, then the others' at once if its draft was kept (a
                # row of a 100k+ vocabulary is a scan of its own, and an n-gram's 8 drafts often end at the first)
                picks = [int((raw[0] if k else raw).argmax())]  # (raw [1, vocab] at k = 0: its flat argmax is the column)
                if k and picks[0] == drafted[0]:
                    picks += raw[1:].argmax(axis=-1).tolist()
                n, nxt = accept_greedy_plain(drafted, picks)
                emitted = drafted[:n]
                emitted.append(nxt)
            else:
                rows = Rows(raw, proc, d.tokens)
                if d.probs is not None:
                    n, nxt = accept_rejection_sampling(d.tokens, d.probs, rows, sampling, r.target_draws)
                else:
                    n, nxt = accept_token_compare(d.tokens, rows, sampling, r.target_draws)
                emitted = d.tokens[:n].tolist() + [nxt]
            kept, depth = list(range(n + 1)), k
        r.metrics.target_s += share_s
        # the raw rows read: emitted[i] comes from the i-th
        bad = first_nonfinite(raw[kept]) if d.parents is not None else first_nonfinite(raw[: n + 1]) if picks is None else \
            first_nonfinite_of_argmax(raw if n == k else raw[: n + 1], picks)
        if bad is not None:  # keep the tokens of the finite rows before it, pick none from it (runtime/guards.py)
            return append(r, emitted[:bad], new, self.cache.max_seq_len) or fail(r, nonfinite_message(len(r.output_ids)), "nonfinite_logits")
        if d.parents is not None:
            start = int(self.cache.lengths[r.slot]) - k - 1  # where the call's k + 1 tokens went
            self.target.compact_slot(self.cache, r.slot, start, kept)  # the path's K/V into contiguous slots
        elif n < k:
            self.cache.rollback(r.slot, self.cache.lengths_view[r.slot] - (k - n))  # keep the last token and n drafts
        if r.config.logprobs is not None:  # the emitted token j came from row kept[j], after emitted[:j]
            if rows is None:
                rows = Rows(raw, proc, d.tokens)
            # a chain's rows are Rows' own (drafts[:j] == emitted[:j]): processed once, during acceptance; a tree's need the path
            r.logprobs += [logprobs(rows.logits(row, None if d.parents is None else emitted[:j]), t, r.config.logprobs)
                           for j, (row, t) in enumerate(zip(kept, emitted, strict=True))]
        return self.keep(r, d, step, raw, n, emitted, kept, depth, new)

    def keep(self, r: Request, d: Draft, step: StepOutput, raw: np.ndarray, n: int, emitted: list[int], kept: list[int], depth: int,
             new: NewTokens, observed: bool = False) -> bool:
        """The round kept ``n`` of r's drafts, the call's rows ``kept``: the prefix cache and the proposer see them (unless
        ``observed``: its proposer has), the metrics count them, and ``emitted`` is appended. True if r finished."""
        k = len(d)
        if self.prefix is not None:
            self.prefix.observe(r, step, kept)  # the kept rows' per-token outputs, for the pool
        if not observed and (proposer := self.proposers.get(r.method)) is not None:  # None: the request decodes target-only
            # the target's extra outputs it asked for, on the request's fed rows
            extras = {name: step.extras[name][r.slot, : k + 1] for name in proposer.target_outputs} if proposer.target_outputs else NO_EXTRAS
            proposer.observe(r, d, TargetOutput(raw, n, emitted, kept, extras))
        if k:  # (a round without drafts teaches the policy nothing)
            self.policy.observed(r, d, n, [row - 1 for row in kept[1:]] if d.tree_index is not None else (), emitted)
        r.metrics.record_round(k, n, depth)
        watch_drafts(r, k, n)
        return append(r, emitted, new, self.cache.max_seq_len)


def trim(r: Request, d: Draft) -> Draft:
    """A draft cut where the request's grammar forbids a token: a chain at its first forbidden token, a tree to the
    nodes whose whole path it allows. In a sampled tree (drafts with probabilities) a node's children are tried in the
    order drawn, so a cut child takes its later siblings with it (recursive rejection sampling needs the draws before
    each child it tests)."""
    proc = r.processor
    if proc is None or proc.grammar is None or not len(d):
        return d
    if d.parents is None:
        n = proc.valid_prefix(d.tokens)
        return d if n == len(d) else d.prefix(n)
    keep: list[int] = []
    kept: set[int] = {-1}
    closed: set[int] = set()  # parents with a child cut, in a sampled tree: no later child of theirs is kept
    for j, parent in enumerate(d.parents.tolist()):
        if parent not in kept or parent in closed:
            continue  # its parent was cut, or an earlier sibling was
        path, a = [int(d.tokens[j])], parent
        while a >= 0:
            path.append(int(d.tokens[a]))
            a = int(d.parents[a])
        if proc.valid_prefix(path[::-1]) == len(path):
            kept.add(j)
            keep.append(j)
        elif d.probs is not None:
            closed.add(parent)
    # the kept nodes keep their order (parents first) and their scores (suffix decoding's, for draft_len=auto)
    return d.nodes(keep)
