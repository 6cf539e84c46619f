"""Step costs measured on an executor before the first request: what draft_len=auto prices its first rounds with.

draft_len=auto learns what a target call of ``rows`` x ``width`` tokens costs from the rounds it runs
(runtime/draft_len.py), starting from a prior (each verified token 10% of a call) until it has timed a width at a
batch size. On a GPU that prior is wrong both ways: at one row a 9-token verification costs about a 1-token step,
at 64 rows it can cost twice one. ``measure_verify_costs`` times every (batch size, width) the engine will run on its
own cache (rows riding along, so the context stays put), and ``Engine.measure_step_costs`` gives auto those lines
before its first round; the rounds then keep them current. On the torch executor the same calls capture the CUDA
graphs of those shapes, so they are captured at load rather than in a request's latency.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..formats.errors import RequestError
from .backends.base import Executor
from .kv_cache import KVCache

CONTEXT = 64  # tokens in each row's cache while timing (attention's share of a step at short contexts)
REPEATS = 3  # timed calls per shape, after one untimed call (a first call pays shape setup: a CUDA graph's capture)


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes timed: powers of two and multiples of 16 up to max_batch, and max_batch (auto prices the others from
    the nearest one timed)."""
    return sorted({*(1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch), *range(16, max_batch + 1, 16), max_batch})


def measure_draft_costs(executor: Executor, cache: KVCache, batches: Sequence[int]) -> tuple[dict[int, float], dict[int, float]]:
    """A draft model's costs before its first round: (rows -> seconds of a one-token step at each batch size it holds,
    tokens -> seconds of a catch-up feed of that many tokens on one row). Without them draft_len=auto learns them from
    its first drafting rounds, and one slow first call (a CUDA graph's capture, a kernel compiled for a new width) can
    make drafting look as if it never pays, after which no round comes to correct it."""
    rows = [b for b in batches if b <= cache.num_slots]
    steps = {b: s for (b, _), s in measure_verify_costs(executor, cache, rows, [1]).items()}
    room = min(int(executor.build.max_input_len), cache.max_seq_len - CONTEXT - 1)
    feeds = sorted({w for w in (8, 32, CONTEXT) if w <= room})
    catch_up = {w: s for (_, w), s in measure_verify_costs(executor, cache, [1], feeds).items()} if feeds else {}
    return steps, catch_up


def measure_verify_costs(executor: Executor, cache: KVCache, batches: Sequence[int], widths: Sequence[int],
                         extra_inputs=None) -> dict[tuple[int, int], float]:
    """(rows, width) -> seconds of one ``executor.forward`` of ``width`` tokens on slots 0 .. rows - 1 of ``cache``, each
    holding CONTEXT tokens. The cache's lengths are 0 again afterwards (what was written is stale).

    extra_inputs(rows, width) -> the call's extra inputs, for an engine that takes some (an EAGLE module)."""
    context = min(CONTEXT, executor.build.max_input_len, cache.max_seq_len - max(widths) - 1)
    if context < 1:
        raise RequestError(f"cannot time calls of {max(widths)} tokens on {executor.engine.path}: its max_seq_len={cache.max_seq_len} leaves "
                           "no room for a context before them (lower the widths).")
    costs: dict[tuple[int, int], float] = {}
    kw = (lambda rows, width: {"extra_inputs": extra_inputs(rows, width)}) if extra_inputs else (lambda rows, width: {})
    for rows in batches:
        cache.lengths[:] = 0
        executor.forward(cache, np.full((rows, context), 5, np.int64), all_logits=False, **kw(rows, context))
        still = np.zeros(rows, bool)
        for width in widths:
            tokens = np.full((rows, width), 5, np.int64)
            executor.forward(cache, tokens, all_logits=True, advance=still, **kw(rows, width))
            t0 = time.perf_counter()
            for _ in range(REPEATS):
                executor.forward(cache, tokens, all_logits=True, advance=still, **kw(rows, width))
            costs[(rows, width)] = (time.perf_counter() - t0) / REPEATS
    cache.lengths[:] = 0
    return costs
