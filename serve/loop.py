"""The engine loop: one thread drives ``step()``; requests cross over through a queue.

The engine is not thread-safe, so exactly one thread touches it. HTTP
handlers (asyncio) hand it jobs and aborts through a thread-safe queue; the
loop adds newcomers between rounds (they join the running batch at the next
step), runs a round, turns each request's new tokens into text, and sends
the handler one event per round through the handler's own asyncio queue.

A job ends in this thread, in this order: its engine request finishes (or is
aborted: a stop string matched, or the client went away), its figures go to
the Prometheus counters, then its last event is sent. So a client that has
its response sees its request counted in /metrics.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from ..runtime.errors import SpecdecError
from ..runtime.metrics import Metrics
from .errors import ApiError
from .metrics import ServerMetrics
from .params import Plan, Served
from .text import TextStream

log = logging.getLogger("specdec.serve")

FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "stop": "stop", "length": "length", "max_seq_len": "length", "abort": "abort"}


@dataclass
class Result:
    """What a finished job reports: its text and tokens as the client gets them, and its figures."""

    text: str
    token_ids: list[int]
    finish_reason: str  # stop | length | abort
    prompt_tokens: int
    metrics: Metrics
    timings: dict[str, float | None]

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Event:
    """One round's share of a job: new text and tokens; the last one carries the result."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    result: Result | None = None
    error: ApiError | None = None


class Job:
    def __init__(self, plan: Plan, served: Served, aio: asyncio.AbstractEventLoop, prefix: str = "cmpl"):
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.plan = plan
        self.stream = TextStream(served.tokenizer, plan.prompt_ids, plan.stops) if served.tokenizer else None
        self.token_ids: list[int] = []  # sent to the client so far
        self.text: list[str] = []
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._aio = aio
        self.arrival = time.perf_counter()
        self.added = 0.0  # given to the engine
        self.first_token = 0.0

    def push(self, event: Event) -> None:
        try:
            self._aio.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's event loop has closed (the server is going down): nobody to tell
            pass


class EngineLoop:
    def __init__(self, served: Served, metrics: ServerMetrics):
        self.served, self.metrics = served, metrics
        self.engine = served.engine
        self.jobs: dict[str, Job] = {}  # touched by the loop thread only
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="specdec-engine-loop", daemon=True)

    # -- the handlers' side (any thread) ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        if not self.alive:
            raise ApiError(503, "the engine loop is not running; restart the server.")
        self._inbox.put(("add", job))

    def abort(self, job_id: str) -> None:
        """The client went away: end the request and free its slot (a no-op once it has ended)."""
        self._inbox.put(("abort", job_id))

    # -- the loop thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._drain(block=not self.engine.has_unfinished()):
                break
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # an engine failure ends the requests in flight, not the server
                log.exception("engine step failed")
                self._fail_all(ApiError(500, "the engine failed while decoding this request; see the server log."), inbox=False)
                continue
            for out in outputs:
                job = self.jobs.get(out.request_id)
                if job is None:
                    continue
                try:
                    self._on_output(job, out)
                except Exception:  # one request's failure (say, in its text) ends that request, not the loop
                    log.exception("processing the output of %s failed", job.id)
                    self._fail(job, ApiError(500, "the server failed while processing this request's output; see the server log."))
            self._gauges()
        self._fail_all(ApiError(503, "the server is shutting down."), inbox=True)

    def _drain(self, block: bool) -> bool:
        """Take what the handlers sent; False when asked to stop."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, arg = item
            if kind == "stop":
                return False
            if kind == "add":
                self._add(arg)
            else:
                self._abort(arg)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        self._gauges()
        return True

    def _add(self, job: Job) -> None:
        try:
            self.engine.add_request(job.plan.prompt_ids, job.plan.config, request_id=job.id)
        except SpecdecError as err:  # the handler checked already; a last line of defence
            job.push(Event(error=ApiError(400, str(err))))
            return
        except Exception:
            log.exception("adding %s failed", job.id)
            job.push(Event(error=ApiError(500, "the server failed to start this request; see the server log.")))
            return
        job.added = time.perf_counter()
        self.jobs[job.id] = job

    def _abort(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        out = self.engine.abort(job_id)  # its final output, metrics included
        self._finish(job, "abort", "", [], out.metrics if out is not None else Metrics(requests=1))

    def _on_output(self, job: Job, out) -> None:
        now = time.perf_counter()
        if out.new_token_ids and not job.first_token:
            job.first_token = now
        new = list(out.new_token_ids)
        text, stopped = "", False
        if job.stream is not None:
            before = job.stream.num_tokens
            text, stopped = job.stream.feed(new)
            new = new[: job.stream.num_tokens - before]  # none past the one that completed a stop string
        if stopped and not out.finished:
            self.engine.abort(job.id)  # frees the slot now; its late "abort" output is ignored
        if not (out.finished or stopped):
            job.token_ids += new
            job.text.append(text)
            job.push(Event(text, new))
            return
        if job.stream is not None:
            text += job.stream.finish()
        reason = "stop" if stopped else FINISH_REASONS.get(out.finish_reason, "stop")
        self._finish(job, reason, text, new, out.metrics)

    def _finish(self, job: Job, reason: str, text: str, new: list[int], metrics: Metrics) -> None:
        del self.jobs[job.id]
        job.token_ids += new
        job.text.append(text)
        end = time.perf_counter()
        n = len(job.token_ids)
        engine_queue = metrics.queue_s[0] if metrics.queue_s else None
        timings = {
            "queue_s": (job.added - job.arrival) + engine_queue if engine_queue is not None else None,
            "ttft_s": job.first_token - job.arrival if job.first_token else None,
            "tpot_s": (end - job.first_token) / (n - 1) if job.first_token and n >= 2 else None,
            "e2e_s": end - job.arrival,
        }
        m = copy.deepcopy(metrics)
        result = Result("".join(job.text), list(job.token_ids), reason, len(job.plan.prompt_ids), m, timings)
        self.metrics.record(m, reason, result.prompt_tokens, n, timings["e2e_s"], timings["ttft_s"], timings["tpot_s"], timings["queue_s"])
        job.push(Event(text, new, result=result))

    def _fail(self, job: Job, error: ApiError) -> None:
        try:
            self.engine.abort(job.id)
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
        self.metrics.running.set(len(self.engine.running))
        self.metrics.waiting.set(len(self.engine.waiting))
