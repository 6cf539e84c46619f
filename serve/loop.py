"""The engine loop: one thread drives ``step()``; requests cross over through a queue.

The engine is not thread-safe, so exactly one thread touches it. HTTP
handlers (asyncio) hand it jobs and aborts through a thread-safe queue; the
loop adds newcomers between rounds (they join the running batch at the next
step), runs a round, turns each request's new tokens into text, and sends
the handler one event per round and choice through the handler's own
asyncio queue.

A job is one HTTP request: one engine request per prompt and sample (``n``
or ``best_of`` of them, several prompts on /v1/completions). The samples of
a job are added together: with prefix caching on (the default), the first
sample of a prompt prefills it and the others copy its rows
(runtime/prefix_cache.py); each keeps its own cache slot.
Sample j of a prompt draws with the request's seed and stream j, so a seeded
request gives the same choices whatever else shares the batch.

A choice ends in this thread, in this order: its engine request finishes (or
is aborted: a stop string matched, or the client went away), its figures go
to the Prometheus counters, then its last event is sent. So a client that
has its response sees its request counted in /metrics.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from ..formats.errors import SpecdecError
from ..runtime.logits import TokenLogprob
from ..runtime.metrics import Metrics
from ..runtime.request import RequestOutput
from .errors import ApiError, choice_error
from .jobs import FINISH_REASONS, Choice, ChoiceResult, Event, Job, Result
from .metrics import ServerMetrics
from .params import Served

log = logging.getLogger("specdec.serve")

class EngineLoop:
    def __init__(self, served: Served, metrics: ServerMetrics, max_queued: int | None = None):
        self.served, self.metrics = served, metrics
        self.engine = served.engine
        self.max_queued = max_queued  # requests waiting for a slot beyond the free ones; None: no limit
        self.jobs: dict[str, Job] = {}  # touched by the loop thread only
        self.owner: dict[str, tuple[Job, Choice]] = {}  # engine request id -> its job and choice
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="specdec-engine-loop", daemon=True)
        self._lock = threading.Lock()
        self._unadded = 0  # samples submitted, not yet given to the engine (under _lock)
        self._waiting = 0  # the engine's waiting queue, as of the last step
        self._running = 0
        self._recent_e2e: deque[float] = deque(maxlen=32)
        self.drain_deadline: float | None = None  # set by drain(): requests still running then are ended

    # -- the handlers' side (any thread) ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout)

    def drain(self, grace_s: float) -> None:
        """Shutting down: no new requests; the running ones get ``grace_s`` seconds, then end with a 503."""
        self.drain_deadline = time.monotonic() + grace_s
        self._inbox.put(("wake", None))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the queue ahead of it at the recent pace."""
        pace = sum(self._recent_e2e) / len(self._recent_e2e) if self._recent_e2e else 1.0
        ahead = (self._unadded + self._waiting) / max(self.engine.max_batch, 1)
        return max(1, min(600, round(pace * max(ahead, 1.0))))

    def submit(self, job: Job) -> None:
        if not self.alive:
            raise ApiError(503, "the engine loop is not running; restart the server.")
        if self.draining:
            raise ApiError(503, "the server is shutting down; send the request to another replica.", headers={"Retry-After": "5"})
        samples = len(job.choices)
        if self.max_queued is not None and samples > self.engine.max_batch + self.max_queued:
            raise ApiError(400, f"this request asks for {samples} sequences (prompts x n or best_of); this server holds at most "
                           f"{self.engine.max_batch + self.max_queued} at once (max_batch_size {self.engine.max_batch} + --max_queued_requests "
                           f"{self.max_queued}).", "n")
        with self._lock:
            if self.max_queued is not None:
                free = self.engine.max_batch - self._running
                queued = self._unadded + self._waiting + samples - max(free, 0)
                if queued > self.max_queued:
                    raise ApiError(
                        503,
                        f"the server is at capacity: {self._running} sequences running and {self._unadded + self._waiting} accepted, "
                        f"{max(free, 0)} slots free of max_batch_size {self.engine.max_batch}, and this request's {samples} would "
                        f"queue past --max_queued_requests {self.max_queued}; retry after the Retry-After header's seconds.",
                        code="server_overloaded",
                        headers={"Retry-After": str(self.retry_after())},
                    )
            self._unadded += samples
        self._inbox.put(("add", job))

    def reset_prefix_cache(self) -> concurrent.futures.Future[bool]:
        """Empty the prefix cache's pool, between two steps (the loop thread owns the engine); the future says whether
        the server has a prefix cache."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        if not self.alive:
            raise ApiError(503, "the engine loop is not running; restart the server.")
        self._inbox.put(("reset", done))
        return done

    def abort(self, job_id: str) -> None:
        """The client went away (or timed out): end its requests and free their slots (a no-op once ended)."""
        self._inbox.put(("abort", job_id))

    # -- the loop thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._drain_inbox(block=not self.engine.has_unfinished()):
                break
            if self.drain_deadline is not None and time.monotonic() >= self.drain_deadline and self.jobs:
                self._fail_all(ApiError(503, "the server is shutting down and this request did not finish in time (--shutdown_timeout)."),
                               inbox=False)
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # an engine failure ends the requests in flight, not the server
                log.exception("engine step failed")
                self._fail_all(ApiError(500, "the engine failed while decoding this request; see the server log."), inbox=False)
                continue
            for out in outputs:
                owned = self.owner.get(out.request_id)
                if owned is None:
                    continue
                job, choice = owned
                try:
                    self._on_output(job, choice, out)
                except Exception:  # one request's failure (say, in its text) ends that request, not the loop
                    log.exception("processing the output of %s failed", job.id)
                    self._fail(job, ApiError(500, "the server failed while processing this request's output; see the server log."))
            self._gauges()
        self._fail_all(ApiError(503, "the server is shutting down."), inbox=True)

    def _drain_inbox(self, block: bool) -> bool:
        """Take what the handlers sent; False when asked to stop."""
        try:
            timeout = None if self.drain_deadline is None else max(self.drain_deadline - time.monotonic(), 0.0) + 0.01
            item = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, arg = item
            if kind == "stop":
                return False
            if kind == "add":
                self._add(arg)
            elif kind == "abort":
                self._abort(arg)
            elif kind == "reset":
                arg.set_result(self.engine.reset_prefix_cache())
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        self._gauges()
        return True

    def _add(self, job: Job) -> None:
        added: list[str] = []
        with self._lock:
            self._unadded -= len(job.choices)
        try:
            for c in job.choices:
                j = c.index % job.plan.samples
                self.engine.add_request(job.plan.prompts[c.prompt], job.plan.config, request_id=c.request_id, seed_stream=j)
                added.append(c.request_id)
        except Exception as err:
            for rid in added:
                self.engine.abort(rid)
            if isinstance(err, SpecdecError):  # the handler checked already; a last line of defence
                job.push(Event(error=ApiError(400, str(err))))
            else:
                log.exception("adding %s failed", job.id)
                job.push(Event(error=ApiError(500, "the server failed to start this request; see the server log.")))
            return
        job.added = time.perf_counter()
        self.jobs[job.id] = job
        for c in job.choices:
            self.owner[c.request_id] = (job, c)

    def _abort(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        for c in job.choices:
            if c.finish_reason is None:
                out = self.engine.abort(c.request_id)  # its final output, metrics included
                self._finish(job, c, "abort", "", [], [], out.metrics if out is not None else Metrics(requests=1))

    def _on_output(self, job: Job, c: Choice, out: RequestOutput) -> None:
        now = time.perf_counter()
        if out.warning:  # the runtime says it once per request (runtime/guards.py: drafts that never land); so does the log
            log.warning("request %s (speculative method %s, %s draft tokens): %s", c.request_id, job.plan.method, job.plan.num_draft_tokens,
                        out.warning)
        if out.new_token_ids and not c.first_token:
            c.first_token = now
            job.first_token = job.first_token or now
        if out.prompt_logprobs is not None and c.prompt_logprobs is None:
            c.prompt_logprobs = list(out.prompt_logprobs)
        if job.plan.drop_output:  # max_tokens=0 with echo: the prompt's scores only; the token its prefill picked is no answer
            if not out.finished:  # (max_output_len=1 ends it at its first token)
                self.engine.abort(c.request_id)
            if out.finish_reason == "error":
                c.error = self._choice_error(job, c, out)
            self._finish(job, c, "error" if c.error else "length", "", [], [], out.metrics)
            return
        new = list(out.new_token_ids)
        lps = list(out.new_logprobs)
        text, stopped = "", False
        if c.stream is not None:
            # the end id (or stop_token_ids entry) that ended it stays in token_ids and usage, and its text is left out, as
            # vLLM leaves it out, unless include_stop_str_in_output
            end = out.finish_reason == "end_id" and not job.plan.include_stop and bool(new)
            before = c.stream.num_tokens
            text, stopped = c.stream.feed(new[:-1] if end else new)
            if stopped:
                new = new[: c.stream.num_tokens - before]  # none past the one that completed a stop string
                lps = lps[: len(new)]
        if stopped and not out.finished:
            self.engine.abort(c.request_id)  # frees the slot now; its late "abort" output is ignored
        if not (out.finished or stopped):
            c.token_ids += new
            c.logprobs += lps
            c.text.append(text)
            job.push(Event(c.index, text, new, lps, prompt_logprobs=c.prompt_logprobs))
            return
        if c.stream is not None:
            text += c.stream.finish()
        reason = "stop" if stopped else FINISH_REASONS.get(out.finish_reason, "stop")
        if reason == "error":
            c.error = self._choice_error(job, c, out)
        self._finish(job, c, reason, text, new, lps, out.metrics)

    def _choice_error(self, job: Job, c: Choice, out: RequestOutput) -> dict[str, Any]:
        """What a choice that ended with the runtime's finish reason "error" tells its client, its log line and its counter."""
        error = choice_error(out.error_cause or "nonfinite_logits", out.error, job.plan.grammar_param)
        log.warning("request %s ended with an error after %d output tokens: %s", c.request_id, len(c.token_ids) + len(out.new_token_ids), out.error)
        self.metrics.request_error(error["code"])
        return error

    def _finish(self, job: Job, c: Choice, reason: str, text: str, new: list[int], lps: list[TokenLogprob], metrics: Metrics) -> None:
        self.owner.pop(c.request_id, None)
        c.token_ids += new
        c.logprobs += lps
        c.text.append(text)
        c.finish_reason = reason
        c.metrics = copy.deepcopy(metrics)
        end = time.perf_counter()
        n = len(c.token_ids)
        engine_queue = metrics.queue_s[0] if metrics.queue_s else None
        queue_s = (job.added - job.arrival) + engine_queue if engine_queue is not None else None
        ttft = c.first_token - job.arrival if c.first_token else None
        tpot = (end - c.first_token) / (n - 1) if c.first_token and n >= 2 else None
        self.metrics.record(c.metrics, reason, len(job.plan.prompts[c.prompt]), n, end - job.arrival, ttft, tpot, queue_s)
        if any(x.finish_reason is None for x in job.choices):
            job.push(Event(c.index, text, new, lps, finish_reason=reason, choice_error=c.error, prompt_logprobs=c.prompt_logprobs))
            return
        del self.jobs[job.id]
        self._recent_e2e.append(end - job.arrival)
        timings = {
            "queue_s": queue_s,
            "ttft_s": job.first_token - job.arrival if job.first_token else None,
            "tpot_s": tpot,
            "e2e_s": end - job.arrival,
        }
        job.push(Event(c.index, text, new, lps, finish_reason=reason, result=self._result(job, timings), choice_error=c.error,
                       prompt_logprobs=c.prompt_logprobs))

    def _result(self, job: Job, timings: dict[str, Any]) -> Result:
        plan = job.plan
        merged = Metrics()
        for c in job.choices:
            merged.merge(c.metrics)  # type: ignore[arg-type]
        picked: list[ChoiceResult] = []
        for p in range(len(plan.prompts)):
            samples = [c for c in job.choices if c.prompt == p]
            if plan.samples > plan.n:  # best_of: the n with the highest log-probability per token
                samples = sorted(samples, key=lambda c: -_mean_logprob(c))[: plan.n]
            for j, c in enumerate(samples):
                picked.append(ChoiceResult(
                    index=p * plan.n + j,
                    text="".join(c.text),
                    token_ids=list(c.token_ids),
                    finish_reason=c.finish_reason or "stop",
                    prompt_ids=plan.prompts[p],
                    logprobs=list(c.logprobs) if plan.logprobs is not None else None,
                    prompt_logprobs=c.prompt_logprobs,
                    metrics=c.metrics,  # type: ignore[arg-type]
                    error=c.error,
                ))
        prompt_tokens = sum(len(ids) for ids in plan.prompts)
        completion_tokens = sum(len(c.token_ids) for c in job.choices)
        cached = sum(min(c.metrics.cached_tokens for c in job.choices if c.prompt == p) for p in range(len(plan.prompts)))  # type: ignore[union-attr]
        return Result(picked, prompt_tokens, completion_tokens, cached, merged, timings)

    def _fail(self, job: Job, error: ApiError) -> None:
        for c in job.choices:
            self.owner.pop(c.request_id, None)
            if c.finish_reason is None:
                try:
                    self.engine.abort(c.request_id)
                except Exception:  # the engine may be broken already; the job still gets its answer
                    log.exception("abort after a failure")
        self.jobs.pop(job.id, None)
        job.push(Event(error=error))

    def _fail_all(self, error: ApiError, inbox: bool) -> None:
        for job in list(self.jobs.values()):
            self._fail(job, error)
        while inbox:  # shutting down: jobs that never reached the engine
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                arg.push(Event(error=error))
        self._gauges()

    def _gauges(self) -> None:
        running, waiting = len(self.engine.running), len(self.engine.waiting)
        with self._lock:
            self._running, self._waiting = running, waiting
        self.metrics.running.set(running)
        self.metrics.waiting.set(waiting + self._unadded)


def _mean_logprob(c: Choice) -> float:
    return sum(lp for lp, _ in c.logprobs) / len(c.logprobs) if c.logprobs else float("-inf")
