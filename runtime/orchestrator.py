"""``generate``: the convenience over the request-level engine (runtime/engine.py).

    orch = Orchestrator(target, DraftModelProposer(draft), draft_len=4)
    outputs, metrics = orch.generate(prompts, GenerationConfig(max_output_len=64))

adds every prompt, steps until all are done, and returns one ``RequestOutput``
per prompt (in order) and the summed ``Metrics``. More prompts than
``max_batch_size`` queue and join the batch as slots free up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..formats.errors import RequestError
from .backends.base import Executor
from .engine import Engine, SpeculationConfig
from .metrics import Metrics
from .proposers.base import Proposer
from .request import GenerationConfig, RequestOutput

# the engine's times a generate() reports: each call counted once (the requests' own are shares of shared calls), and
# the rounds' deciding of draft lengths (so that other_s is the loop's own time, not the decisions' too)
ENGINE_TIMES = ("target_s", "draft_s", "prompt_target_s", "prompt_draft_s", "decide_s")

__all__ = ["GenerationConfig", "Orchestrator", "RequestOutput", "TokenCallback"]

# on_tokens(prompt_index, new_token_ids): called as tokens are accepted (streaming);
# returning True ends that request (finish_reason "abort"), e.g. when a stop string matched its text
TokenCallback = Callable[[int, list[int]], "bool | None"]


class Orchestrator:
    """One target, at most one proposer, one default draft length: the V1 interface."""

    def __init__(self, target: Executor, proposer: Proposer | None = None, draft_len: int | str = 0, allow_vocab_mismatch: bool = False):
        spec = SpeculationConfig(proposer.name, draft_len) if proposer is not None else SpeculationConfig()
        self.engine = Engine(target, [proposer] if proposer is not None else [], spec, allow_vocab_mismatch)
        self.proposer = proposer

    @classmethod
    def from_engine(cls, engine: Engine) -> Orchestrator:
        orch = cls.__new__(cls)
        orch.engine, orch.proposer = engine, next(iter(engine.proposers.values()), None)
        return orch

    @property
    def target(self) -> Executor:
        return self.engine.target

    @property
    def draft_len(self) -> int | str:
        return self.engine.speculation.draft_len

    @property
    def vocab_limit(self) -> int | None:
        return self.engine.vocab_limit

    @property
    def max_batch(self) -> int:
        return self.engine.max_batch

    @property
    def max_input_len(self) -> int:
        return self.engine.max_input_len

    def generate(self, prompts: Sequence[Sequence[int]], config: GenerationConfig,
                 on_tokens: TokenCallback | None = None) -> tuple[list[RequestOutput], Metrics]:
        """Decode every prompt: add all, step until done."""
        engine = self.engine
        if not prompts:
            raise RequestError("no prompts given.")
        checked = [engine.validate(p, f"prompt {i}") for i, p in enumerate(prompts)]  # all, before anything runs
        stats = engine.stats
        before = [getattr(stats, name) for name in ENGINE_TIMES]
        start = time.perf_counter()
        index = {engine.add_request(p, config, seed_stream=i): i for i, p in enumerate(checked)}
        done: dict[int, RequestOutput] = {}
        try:
            while len(done) < len(index):
                for out in engine.step():
                    i = index.get(out.request_id)
                    if i is None:
                        continue  # another caller's request on a shared engine
                    if on_tokens and out.new_token_ids and on_tokens(i, out.new_token_ids) and not out.finished:
                        engine.abort(out.request_id)  # the caller's stop: its output comes back at the next step
                    if out.finished:
                        done[i] = out
        finally:
            for rid in index:
                engine.abort(rid)  # a no-op for finished requests; frees slots if a step raised
        metrics = Metrics()
        for i in range(len(checked)):
            metrics.merge(done[i].metrics)  # type: ignore[arg-type]
        metrics.total_s = time.perf_counter() - start
        for name, then in zip(ENGINE_TIMES, before, strict=True):
            setattr(metrics, name, getattr(stats, name) - then)
        return [done[i] for i in range(len(checked))], metrics
