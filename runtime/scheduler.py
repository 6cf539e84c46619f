"""Which requests hold the target's cache slots (vLLM v1's scheduler, without its token budget).

    waiting   first come, first served: ``add`` queues, ``admit`` hands out the free slots
    running   ``running[s]`` holds slot ``s``; running requests always sit in slots ``0..n-1``
    release   a leaving request's slot takes the last running request (``copy_slot``: its live K/V only)

So a verification round is one target call on slots ``0..n-1``, and a newcomer
is prefilled in one call on its own slot ``n`` with no other row padded to its
prompt (docs/architecture.md says why this and not chunked prefill).
"""

from __future__ import annotations

import time
from collections import deque

from .backends.base import Executor
from .kv_cache import KVCache
from .request import Request, RequestStatus


class Scheduler:
    def __init__(self, target: Executor, cache: KVCache, max_batch: int):
        self.target, self.cache, self.max_batch = target, cache, max_batch
        self.running: list[Request] = []  # running[s] holds slot s
        self.waiting: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def dequeue(self, req: Request) -> None:
        """A waiting request leaves the queue (aborted before it got a slot)."""
        self.waiting.remove(req)

    def admit(self) -> list[Request]:
        """The newcomers that get a slot now, in arrival order, in slots ``len(running)..``; marked RUNNING."""
        free = self.max_batch - len(self.running)
        if not self.waiting or free <= 0:
            return []
        batch = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        first = len(self.running)
        now = time.perf_counter()
        for i, r in enumerate(batch):
            r.status, r.slot, r.times.scheduled = RequestStatus.RUNNING, first + i, now
        self.running += batch
        return batch

    def place(self, batch: list[Request]) -> None:
        """Give the newcomers ``admit`` just returned their slots again, in this order (the prefix cache prefills the
        requests that copy another newcomer's rows after it: runtime/prefix_cache.py). Nothing is in them yet."""
        first = len(self.running) - len(batch)
        for i, r in enumerate(batch):
            r.slot = first + i
        self.running[first:] = batch

    def release(self, req: Request) -> None:
        """Give ``req``'s slot back: the last running request moves into it."""
        slot, last = req.slot, len(self.running) - 1
        if req.error_cause == "nonfinite_logits":  # its K/V may hold NaN/Inf, which masking does not hold back
            self.target.clear_slot(self.cache, slot)
        if slot != last:
            moved = self.running[last]
            self.target.copy_slot(self.cache, last, slot)
            self.running[slot], moved.slot = moved, slot
        self.running.pop()
        self.cache.lengths[last] = 0
        req.slot = -1
