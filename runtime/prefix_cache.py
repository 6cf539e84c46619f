"""Prefix caching: a newcomer copies the longest cached prefix of its prompt and prefills only the rest.

    holders   where reusable K/V lives: a running request's slot (its prompt's rows), or a slot of the
              prefix pool (a finished request's prompt and output), indexed by their tokens
              (runtime/prefix_index.py)
    plan      at admission, each newcomer's longest match; a newcomer whose best match is an earlier
              newcomer of the same step (``n`` choices, ``best_of``, one system prompt) follows it: the
              followers are prefilled in a second call, after the leaders, and copy their rows
    copy_in   the matched rows go into the newcomer's slot (Executor.copy_prefix), its length set to them
    release   a request that leaves is copied into the pool: into the entry it extends (a conversation's
              next turn), else a free slot, else the least recently used entry's

Exact, not approximate: a hit computes what a cold prefill computes. On engines whose rows do not depend on
the call (``rows_consistent``: a one-token step padded to a verification step's kernels, and rows independent of
the batch and the live length), the K/V of a token is the same bits whether a prompt, a suffix or a decoding step
computed it, so a pool entry holds a finished request's prompt and output; on the others (plain target-only
engines), only prompt rows are kept. A hit still prefills at least ``MIN_FRESH`` prompt tokens: the last for the
first token's logits, and a second because a lone query row runs another attention kernel. What else a prefill
computes is given too: the target's per-token outputs (an EAGLE target's features of every prompt token, which
its module catches up on) are kept beside the K/V and handed to the proposers as a cold prefill's would be.
A request that asks for its prompt's log-probabilities reads nothing from the cache (they need every prompt row's
logits), and draft models prefill their own prompt as they would cold (runtime/proposers/draft_model.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..formats.engine_format import extra_io
from ..formats.errors import EngineError, RequestError
from .backends.base import Executor, StepOutput
from .kv_cache import KVCache
from .prefix_index import PrefixIndex
from .proposers.base import kept_rows
from .request import Request

MIN_FRESH = 2  # prompt tokens a hit still prefills


@dataclass(frozen=True)
class PrefixCacheConfig:
    """``enabled``: None = on where the target's executor can hold a prefix pool (said once when it cannot).
    ``slots``: the pool's slots (finished sequences kept), None = the target's max_batch_size; each slot costs one
    cache row of the engine's full capacity (allocated as it fills on the CPU, up front on a GPU).
    ``block``: tokens per edge of the index (matches are exact to the token, at least one block long)."""

    enabled: bool | None = None
    slots: int | None = None
    block: int = 16

    def __post_init__(self) -> None:
        if self.slots is not None and self.slots < 1:
            raise RequestError(f"prefix_cache_slots={self.slots}: give at least 1 slot, or turn prefix caching off.")
        if self.slots is not None and self.enabled is False:
            raise RequestError(f"prefix_cache_slots={self.slots} with prefix caching off: drop one of the two.")
        if self.block < 1:
            raise RequestError(f"prefix cache block={self.block}: a block holds at least one token.")


def rows_consistent(executor: Executor) -> bool:
    """Whether a token's K/V (and logits) are the same bits whatever call computed it (build.rows_consistent)."""
    return bool(executor.build.rows_consistent)


class _Entry:
    """A pool slot's sequence: its tokens and the target's per-token outputs on them ([len, ...] each)."""

    pending = False
    leader = False

    def __init__(self, slot: int):
        self.slot, self.tokens, self.features, self.used = slot, [], {}, 0

    @property
    def usable(self) -> int:
        return len(self.tokens)


class _Running:
    """A running request's prompt rows in its own slot; ``pending`` until its prefill ran (a leader of this step's
    newcomers may be copied from by the followers, after it ran)."""

    def __init__(self, request: Request, leader: bool):
        self.request, self.leader, self.pending = request, leader, True
        self.features: dict[str, list[np.ndarray]] = {}  # name -> per-token outputs of every fed token, in order

    @property
    def usable(self) -> int:
        return len(self.request.prompt_ids)


class PrefixCache:
    def __init__(self, target: Executor, cache: KVCache, config: PrefixCacheConfig = PrefixCacheConfig()):
        self.target, self.cache, self.config = target, cache, config
        self.block = config.block
        slots = config.slots or target.build.max_batch_size
        self.pool = target.new_prefix_pool(slots)  # EngineError where the executor cannot hold one
        self.entries = [_Entry(s) for s in range(slots)]
        self.index = PrefixIndex(config.block)
        self.running: dict[str, _Running] = {}
        self.plans: dict[str, tuple[_Entry | _Running | None, int]] = {}  # request id -> (source, rows to copy)
        self.copied: dict[str, _Entry | _Running] = {}  # request id -> the source its rows came from, until its prefill ran
        self.keeps_outputs = rows_consistent(target)  # pool entries keep output rows too (else prompt rows only)
        # the target's outputs of every fed token (an EAGLE target's features): kept beside the K/V
        self.per_token = [t.name for t in extra_io(target.model, target.build)[1] if t.per_token]
        self.tick = 0

    # -- admission ------------------------------------------------------------------------
    def plan(self, batch: list[Request]) -> list[list[Request]]:
        """Each newcomer's source and rows to reuse; the calls to prefill them in, in order (leaders, then the
        followers that copy from them), each a run of requests to give adjacent slots in that order."""
        leaders: list[Request] = []
        followers: list[Request] = []
        for r in batch:
            source, n = self._match(r)
            self.plans[r.request_id] = (source, n)
            follows = source is not None and source.pending
            (followers if follows else leaders).append(r)
            holder = self.running[r.request_id] = _Running(r, leader=not follows)
            self.index.add(holder, r.prompt_ids)
        return [call for wave in (leaders, followers) for call in self._fit(wave)]

    def _match(self, r: Request) -> tuple[_Entry | _Running | None, int]:
        limit = len(r.prompt_ids) - MIN_FRESH
        if r.config.prompt_logprobs or limit < self.block:
            return None, 0
        source, n = self.index.match(r.prompt_ids, eligible=lambda h: not h.pending or h.leader, rank=lambda h: not h.pending)
        if source is None:
            return None, 0
        n = min(n, limit, source.usable)
        return (source, n) if n >= self.block else (None, 0)

    def _fit(self, wave: list[Request]) -> list[list[Request]]:
        """One call for the wave, unless a row's reused rows plus the call's width would write past a slot's
        capacity (the call pads every row to its widest): then one call per request."""
        if not wave:
            return []
        reused = [self.plans[r.request_id][1] for r in wave]
        width = max(len(r.prompt_ids) - n for r, n in zip(wave, reused, strict=True))
        return [wave] if max(reused) + width <= self.cache.capacity else [[r] for r in wave]

    def copy_in(self, batch: Sequence[Request]) -> None:
        """Copy each request's planned rows into its slot (its length set to them); fed next: prompt_ids[cached:]."""
        self.tick += 1
        for r in batch:
            source, n = self.plans.pop(r.request_id, (None, 0))
            r.metrics.cached_tokens = n
            if source is None or not n:
                continue
            if isinstance(source, _Entry):
                self.target.copy_prefix(self.pool, source.slot, self.cache, r.slot, n)
                source.used = self.tick
            else:
                self.target.copy_prefix(self.cache, source.request.slot, self.cache, r.slot, n)
            self.index.touch(source)
            if self.per_token:
                self.copied[r.request_id] = source

    def prefilled(self, batch: Sequence[Request], step: StepOutput, first: int) -> StepOutput:
        """The prefill call ran: ``step`` as a cold prefill of the whole prompts would have returned it (the per-token
        outputs of the reused rows put back in front), for the proposers; the rows are now a source for others."""
        for r in batch:
            self.running[r.request_id].pending = False
        if not self.per_token:
            return step
        width = max(len(r.prompt_ids) for r in batch)
        whole = {}
        for name in self.per_token:
            fed = step.extras[name]  # [len(batch), width of the call, ...]
            out = np.zeros((len(batch), width, *fed.shape[2:]), fed.dtype)
            for r in batch:
                i, n, p = r.slot - first, r.metrics.cached_tokens, len(r.prompt_ids)
                if n:
                    out[i, :n] = self._features(self.copied[r.request_id], name)[:n]
                out[i, n:p] = fed[i, : p - n]
                self.running[r.request_id].features[name] = [out[i, :p].copy()]
            whole[name] = out
        for r in batch:
            self.copied.pop(r.request_id, None)
        return dataclasses.replace(step, extras={**step.extras, **whole})

    # -- running ---------------------------------------------------------------------------
    def observe(self, r: Request, step: StepOutput, kept: Sequence[int]) -> None:
        """A verification kept the call's rows ``kept`` of request r: their per-token outputs follow its earlier ones."""
        holder = self.running.get(r.request_id)
        if holder is None:
            return
        for name in self.per_token:
            holder.features[name].append(kept_rows(step.extras[name][r.slot], kept))

    def release(self, r: Request) -> None:
        """``r`` leaves its slot (finished or aborted): its rows go into the pool, unless they are there already."""
        holder = self.running.pop(r.request_id, None)
        self.plans.pop(r.request_id, None)
        self.copied.pop(r.request_id, None)
        if holder is None:
            return
        self.index.remove(holder)
        if r.finish_reason == "error" or holder.pending:  # non-finite logits: its K/V may be too; never prefilled
            return
        valid = min(int(self.cache.lengths[r.slot]), r.num_tokens)
        if not self.keeps_outputs:
            valid = min(valid, len(r.prompt_ids))
        if valid < self.block:
            return
        tokens = [*r.prompt_ids, *r.output_ids][:valid]
        self.tick += 1
        held, n = self.index.match(tokens, eligible=lambda h: isinstance(h, _Entry))
        if held is not None and n == valid:  # an entry holds all of it already
            held.used = self.tick
            self.index.touch(held)
            return
        if held is not None and n == held.usable:  # an entry holds a prefix of it (an earlier turn): extend that entry
            entry = held
        else:
            entry = min(self.entries, key=lambda e: e.used)  # a free slot (never used: 0) or the least recently used
        self.target.copy_prefix(self.cache, r.slot, self.pool, entry.slot, valid)
        entry.tokens, entry.used = tokens, self.tick
        entry.features = {name: np.concatenate(holder.features[name])[:valid] for name in self.per_token if holder.features.get(name)}
        self.index.add(entry, tokens)

    def reset(self) -> None:
        """Forget every finished sequence in the pool (vLLM's reset_prefix_cache); running requests' prompts stay."""
        for entry in self.entries:
            self.index.remove(entry)
            entry.tokens, entry.features, entry.used = [], {}, 0

    @staticmethod
    def _features(holder, name: str) -> np.ndarray:
        feats = holder.features[name]
        if isinstance(feats, list):  # a running holder's: per call, joined once
            feats[:] = [np.concatenate(feats)] if len(feats) > 1 else feats
            return feats[0]
        return feats

    @property
    def held_tokens(self) -> int:
        """Tokens the pool holds now."""
        return sum(e.usable for e in self.entries)


def open_prefix_cache(target: Executor, cache: KVCache, config: PrefixCacheConfig) -> tuple[PrefixCache | None, str]:
    """The engine's prefix cache, or None and why not (said once) when it is off."""
    if config.enabled is False:
        return None, ""
    try:
        return PrefixCache(target, cache, config), ""
    except EngineError as err:
        if config.enabled:
            raise
        return None, str(err)
