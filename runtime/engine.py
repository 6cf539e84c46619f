"""The request-level engine: requests join and leave a running batch.

    add_request(prompt_ids, config) -> request id      queued (first come, first served)
    step() -> [RequestOutput]                           one round for every running request,
                                                        then newcomers admitted and prefilled
    abort(request_id)                                   frees its slot at once
    has_unfinished()

The engine checks what it is given (the draft length, the pairing of draft and
target, prompts against the limits) and keeps the request ids; the two parts
under it are each one screen:

    runtime/scheduler.py   the queue and the cache slots: who runs, who waits, slot moves when one leaves
    runtime/round.py       the round (propose -> verify -> accept -> append) and the prefill of newcomers

Per request: its own sampling, stops, RNG (its output never depends on its
batch), speculation method and draft length, and metrics.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..formats.engine_format import TREE_MODES, EngineDir
from ..formats.errors import EngineError, RequestError
from .backends.base import Executor
from .draft_len import AutoDraftLen
from .draft_policy import AutoDraftPolicy
from .logits import LogitsProcessor
from .methods import TARGET_ONLY
from .metrics import Metrics
from .pairing import Pairing, check_pair
from .prefix_cache import PrefixCacheConfig, open_prefix_cache
from .proposers.base import Proposer
from .request import AUTO, GenerationConfig, Request, RequestOutput, RequestStatus
from .round import SpeculativeRound
from .sampling import TargetDraws, draft_generator
from .scheduler import Scheduler


@dataclass(frozen=True)
class SpeculationConfig:
    """The engine's defaults for requests that do not choose (one source of truth)."""

    method: str = TARGET_ONLY  # a registered method (runtime/methods.py), or none
    draft_len: int | str = 0  # drafts per round, or "auto"

    @property
    def drafts(self) -> bool:
        """Requests that do not choose draft (the default method is not TARGET_ONLY)."""
        return self.method != TARGET_ONLY


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


def _loaded_by(method: str) -> str:
    """What loads ``method``, for messages (imported here: proposers import the engine's modules)."""
    from .proposers.method import get_method

    try:
        return get_method(method).loaded_by
    except KeyError:
        return "a registered drafting method"


class Engine:
    def __init__(
        self,
        target: Executor,
        proposers: Sequence[Proposer] = (),
        speculation: SpeculationConfig = SpeculationConfig(),
        allow_vocab_mismatch: bool = False,
        prefix_caching: PrefixCacheConfig = PrefixCacheConfig(),
    ):
        """``prefix_caching``: keep finished and running requests' K/V and let newcomers copy their longest cached prefix
        (runtime/prefix_cache.py); on by default where the executor can (``prefix_caching_off`` says why not)."""
        self.target = target
        self.proposers: dict[str, Proposer] = {p.name: p for p in proposers}
        self.speculation = speculation
        build = target.build
        executors = [target] + [p.executor for p in proposers if p.executor is not None]
        self.max_batch = min(e.build.max_batch_size for e in executors)
        self.max_input_len = min(e.build.max_input_len for e in executors)
        # which engine sets the input limit, for the error that names it (the draft's may be the smaller)
        short = min(executors, key=lambda e: e.build.max_input_len)
        self._input_limit_by = ("the target engine" if short is target
                                else f"the draft engine {short.engine.path} (the target's is {build.max_input_len})")
        # The vocabulary draft and target share (padded vocabularies compare over the common ids).
        self.vocab_limit: int | None = None
        for p in proposers:
            if p.executor is not None and not p.own_vocabulary:  # another tokenizer: its adapter maps ids
                limit = check_pair(target.engine, p.executor.engine, allow_vocab_mismatch)
                self.vocab_limit = limit if self.vocab_limit is None or limit is None else min(self.vocab_limit, limit)
                p.vocab_limit = limit
        if speculation.drafts and speculation.method not in self.proposers:
            raise EngineError(f"speculation method {speculation.method!r} is not loaded (loaded: {', '.join(self.proposers) or 'none'}): "
                              f"it needs {_loaded_by(speculation.method)}.")
        if speculation.drafts:
            self._check_draft_len(speculation.draft_len, self.proposers[speculation.method].draft_len_name)
        self.cache = target.new_cache(self.max_batch)
        self.scheduler = Scheduler(target, self.cache, self.max_batch)
        self.prefix, self.prefix_caching_off = open_prefix_cache(target, self.cache, prefix_caching)
        self.requests: dict[str, Request] = {}
        # draft_len="auto"'s cost model (measured step costs, per-method acceptance), behind the round's one policy seam
        self.auto = AutoDraftLen(build.max_draft_len, self.max_batch, even_rows=bool((build.weight_only or {}).get("even_rows")))
        self.auto.one_call = {name for name, p in self.proposers.items() if p.drafts_in_one_call}
        # P-EAGLE --peagle_refine auto: the most refining calls a chain of max_draft_len takes (call m + 1 fixes position m + 1)
        self.auto.refining = {name: min(p.auto_refine_calls, build.max_draft_len - 1) for name, p in self.proposers.items()
                              if p.auto_refine_calls and build.max_draft_len > 1}
        self.auto.trees = {name: p.tree for name, p in self.proposers.items() if p.tree is not None}
        self.stats = Metrics()  # engine totals: every request's counts, merged as it finishes
        self.round = SpeculativeRound(target, self.cache, self.proposers, self.vocab_limit, AutoDraftPolicy(self.auto), self.stats, self.prefix)
        self._ids = itertools.count()
        self._aborted: list[Request] = []
        self.step_costs_note: str | None = None  # what measure_step_costs timed, for the CLIs to say
        np.random.default_rng(0)  # numpy.random loads lazily (~30 ms): pay it here, not in the first request

    def measure_step_costs(self, batches: Sequence[int] | None = None, widths: Sequence[int] | None = None) -> dict[tuple[int, int], float]:
        """Time the target's calls of each (batch size, width) on this engine's cache before any request (runtime/step_costs.py)
        and give draft_len=auto those costs: it prices its first rounds from them instead of a prior. Default: the batch sizes
        of step_costs.batch_sizes, widths 1 .. max_draft_len + 1. Returns the costs, seconds by (rows, width)."""
        from .step_costs import batch_sizes, measure_verify_costs

        if self.has_unfinished():
            raise RequestError("measure_step_costs runs on the engine's own cache: call it before adding requests.")
        batches = batch_sizes(self.max_batch) if batches is None else batches
        widths = range(1, self.target.build.max_draft_len + 2) if widths is None else widths
        t0 = time.perf_counter()
        costs = measure_verify_costs(self.target, self.cache, batches, widths)
        self.auto.seed_verify(costs)
        drafts = []
        for name, p in self.proposers.items():  # a draft model's step and catch-up (an EAGLE module's calls are learned online)
            if (measured := p.measure_costs(batches)) is not None:
                self.auto.seed_draft(name, *measured)
                drafts.append(name)
        self.step_costs_note = f"timed the target's calls at {len(costs)} shapes (batch sizes {', '.join(map(str, batches))}; widths " \
                               f"{min(widths)}-{max(widths)})" + (" and the draft's steps and catch-ups" if drafts else "") + \
                               f" in {time.perf_counter() - t0:.1f} s: draft_len=auto prices its first rounds from them"
        return costs

    @property
    def pairing(self) -> Pairing | None:
        """How the draft model drafts for this target, when its method paired them (runtime/pairing.py): shared ids or text."""
        return next((p.pairing for p in self.proposers.values() if p.pairing is not None), None)

    def sample_differs(self, method: str | None = None) -> str | None:
        """Why a sampled request of ``method`` (default: the engine's) need not give target-only's tokens for its seed,
        or None when it does: drafts verified by token compare draw target-only's own tokens, rejection sampling follows
        its drafts, and a draft with a smaller vocabulary cuts sampling to the ids both share."""
        proposer = self.proposers.get(method or self.speculation.method)
        if proposer is None:
            return None
        if proposer.samples_drafts:
            return "rejection sampling: the sample follows the drafts"
        if self.vocab_limit is not None:
            return f"sampled over the {self.vocab_limit} ids draft and target share"
        return None

    @property
    def running(self) -> list[Request]:
        """The requests holding a slot, ``running[s]`` in slot ``s``."""
        return self.scheduler.running

    @property
    def waiting(self) -> deque[Request]:
        return self.scheduler.waiting

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
    def add_request(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig(), request_id: str | None = None,
                    seed_stream: int = 0) -> str:
        """Queue a request; it joins the running batch at the next step with a free slot.

        ``seed_stream``: with the sampling seed, keys this request's RNG (generate() passes
        each prompt's index, so prompts with the same seed still draw differently).
        """
        ids = self.validate(prompt_ids)
        # (a bad word's id past the vocabulary bans nothing: such a token is never produced)
        vocab = self.vocab_limit or self.target.vocab_size  # a draft's smaller vocabulary cuts every row to the ids both have
        outside = [t for t in config.sampling.allowed_token_ids if t >= vocab]
        if outside:
            raise RequestError(f"allowed_token_ids holds token id {outside[0]}, outside the vocabulary [0, {vocab}).")
        method = config.method or self.speculation.method
        proposer = self.proposers.get(method)  # None: the request decodes target-only
        if proposer is None and method != TARGET_ONLY:
            raise RequestError(f"speculation method {method!r} is not loaded in this engine (loaded: {', '.join([TARGET_ONLY, *self.proposers])}).")
        draft_len = config.draft_len if config.draft_len is not None else self.speculation.draft_len
        if proposer is None:
            draft_len = 0
        else:
            try:
                self._check_draft_len(draft_len, "draft_len")
            except EngineError as err:
                raise RequestError(str(err)) from None
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise RequestError(f"request id {rid!r} is already in use.")
        seed = config.sampling.random_seed
        req = Request(rid, ids, config, method, draft_len, draft_generator(seed, seed_stream), draws=TargetDraws(seed, seed_stream))
        req.processor = LogitsProcessor(config.sampling, ids, config.grammar.start() if config.grammar is not None else None,
                                        config.end_ids, config.min_output_len)
        req.metrics.prompt_tokens = len(ids)
        self.requests[rid] = req
        self.scheduler.add(req)
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
            self.scheduler.dequeue(req)
        else:
            self._leave(req)
        req.status, req.finish_reason = RequestStatus.ABORTED, "abort"
        self._close(req)
        self._aborted.append(req)
        return self._output(req, [])

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache's pool (a benchmark's cold start, vLLM's /reset_prefix_cache); False when it is off."""
        if self.prefix is None:
            return False
        self.prefix.reset()
        return True

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self._aborted)

    def step(self) -> list[RequestOutput]:
        """One verification round for the running requests, then admit and prefill newcomers.

        Returns one output per request that produced tokens or ended in this step.
        """
        new: dict[str, list[int]] = {}
        ended = self._aborted
        self._aborted = []
        if self.running and (finished := self.round.run(self.running, new)):
            ended += self._let_go(finished)
        batch = self.scheduler.admit()
        if batch:
            calls = [batch] if self.prefix is None else self.prefix.plan(batch)  # leaders, then who copies their rows
            if len(calls) > 1:
                self.scheduler.place([r for call in calls for r in call])
            first_tokens = [r for call in calls for r in self.round.prefill(call, call[0].slot, new)]
            ended += self._let_go(first_tokens)
        outs = [self._output(self.requests[rid], tokens) for rid, tokens in new.items()]
        outs += [self._output(r, []) for r in ended if r.request_id not in new]
        for r in ended:
            del self.requests[r.request_id]
        return outs

    # -- leaving ------------------------------------------------------------------------
    def _let_go(self, ended: list[Request]) -> list[Request]:
        """Free the slots of requests that finished this step, highest slot first (the moved last slot is never
        an ended one), and close their metrics."""
        for r in sorted(ended, key=lambda r: -r.slot):
            self._leave(r)
            self._close(r)
        return ended

    def _leave(self, r: Request) -> None:
        if self.prefix is not None:
            self.prefix.release(r)  # its rows into the prefix pool, before its slot is reused
        self.scheduler.release(r)
        if r.proposing:  # not a request that ended at its prefill, nor one whose prefill raised
            self.proposers[r.method].remove(r.request_id)
            r.proposing = False

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
        lps = r.logprobs[len(r.output_ids) - len(tokens) : len(r.output_ids)] if r.config.logprobs is not None else []
        warning, r.warning = r.warning, ""  # said once
        return RequestOutput(
            input_ids=r.prompt_ids,
            output_ids=list(r.output_ids),
            finish_reason=r.finish_reason,
            request_id=r.request_id,
            new_token_ids=tokens,
            finished=r.finished,
            metrics=r.metrics,
            new_logprobs=lps,
            logprobs=r.logprobs[: len(r.output_ids)] if r.config.logprobs is not None else [],
            prompt_logprobs=r.prompt_logprobs if len(r.output_ids) == len(tokens) else None,
            error=r.error,
            error_cause=r.error_cause,
            warning=warning,
        )
