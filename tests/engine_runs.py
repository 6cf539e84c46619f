"""Stepping a request-level Engine to the end, as the runtime tests do it (one helper instead of a loop per file)."""

from __future__ import annotations

import pytest

from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.metrics import Metrics
from specdec.runtime.request import GenerationConfig, RequestOutput
from specdec.runtime.sampling import SamplingConfig

# sampled requests with their own seeds, and every setting that reshapes the target's distribution
SEEDED = [SamplingConfig(temperature=0.9, random_seed=s) for s in range(6)] + [
    SamplingConfig(temperature=1.3, top_k=5, random_seed=6), SamplingConfig(temperature=0.6, top_p=0.8, random_seed=7),
    SamplingConfig(temperature=1.0, min_p=0.05, repetition_penalty=1.3, random_seed=8),
    SamplingConfig(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.4, random_seed=9)]


def open_cpu_executor(path, backend: str):
    """The executor of the engine at ``path``: onnxruntime's CPU one on one thread, or the torch backend's on the CPU."""
    from specdec.formats.engine_format import load_engine_dir

    engine = load_engine_dir(path)
    if backend == "torch":
        from specdec.runtime.backends.torch.executor import TorchExecutor

        return TorchExecutor(engine, "cpu")
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    return OrtExecutor(engine, num_threads=1)


def run_until_done(engine: Engine) -> dict[str, RequestOutput]:
    """Step ``engine`` until no request is left; each request's final output, by request id."""
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    return done


def generate(target, proposers, method: str, draft_len, prompts: list[list[int]], max_output_len: int = 20) -> tuple[list[list[int]], Metrics]:
    """Greedy outputs of ``prompts`` (in order) through a fresh Engine over ``target`` with ``proposers``, and its stats."""
    engine = Engine(target, proposers, SpeculationConfig(method, draft_len))
    ids = [engine.add_request(p, GenerationConfig(max_output_len=max_output_len)) for p in prompts]
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids], engine.stats


def seeded_outputs(target, proposers, method: str, draft_len, prompts: list[list[int]], samplings=SEEDED,
                   max_output_len: int = 16) -> tuple[list[list[int]], Metrics]:
    """One request per sampling config (on the prompts in turn, each with its own seed stream, as generate() gives
    them) in one engine, beside a greedy request on the first prompt: their outputs (the greedy one last) and the
    engine's stats. Run with method "none" for target-only's."""
    engine = Engine(target, proposers, SpeculationConfig(method, draft_len))
    ids = [engine.add_request(prompts[i % len(prompts)], GenerationConfig(max_output_len=max_output_len, sampling=s), seed_stream=i)
           for i, s in enumerate(samplings)]
    ids.append(engine.add_request(prompts[0], GenerationConfig(max_output_len=max_output_len)))
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids], engine.stats


class CountingModule:
    """The module executor, its forward calls counted (every other attribute is the executor's own)."""

    def __init__(self, executor):
        self.executor, self.calls = executor, 0

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.executor.forward(*args, **kwargs)


WIDE_TREE = "[[0],[1],[2],[3],[0,0],[1,0]]"  # a wide tree: its levels must never grow a module's cache
LATE_LONG_PROMPT = list(range(5, 50))  # 45 tokens


def run_to_max_seq_len_with_a_late_long_prompt(engine: Engine, target, first_prompt: list[int], after_join=None) -> None:
    """``first_prompt`` drafted until its 70th token, then LATE_LONG_PROMPT joining it deep into its context
    (``after_join(second)``, when given, after the step that prefills it); both run until the engine is full, and must
    end at max_seq_len with target-only's output (no capacity error on the way)."""
    first = engine.add_request(first_prompt, GenerationConfig(max_output_len=200))
    while engine.requests[first].num_tokens < 70:
        engine.step()
    second = engine.add_request(LATE_LONG_PROMPT, GenerationConfig(max_output_len=200))
    if after_join is not None:
        engine.step()
        after_join(second)
    outs = run_until_done(engine)
    assert outs[first].finish_reason == outs[second].finish_reason == "max_seq_len"
    want, _ = generate(target, [], "none", 0, [first_prompt, LATE_LONG_PROMPT], max_output_len=200)
    assert [outs[first].output_ids, outs[second].output_ids] == want


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch's CPU ops on one thread: these calls are tiny, and a busy machine's spinning OpenMP threads make them 100x slower.
    A test module takes it with ``pytestmark = pytest.mark.usefixtures("torch_one_thread")`` and imports it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_plan(target, proposers, method: str, prefix_caching: bool, plan: list[list[list[int]]], sampling=None,
             max_output_len: int = 24) -> list[list[RequestOutput]]:
    """``plan``'s batches one after the other on one Engine (the later ones hit the earlier ones' rows when
    ``prefix_caching``), with log-probabilities and a seed stream per request: the finished requests per batch."""
    from specdec.runtime.prefix_cache import PrefixCacheConfig
    from specdec.runtime.sampling import SamplingConfig

    engine = Engine(target, proposers, SpeculationConfig(method, 3 if method != "none" else 0),
                    prefix_caching=PrefixCacheConfig(enabled=prefix_caching))
    cfg = GenerationConfig(max_output_len=max_output_len, sampling=sampling or SamplingConfig(), logprobs=1)
    outs = []
    for batch in plan:
        ids = [engine.add_request(p, cfg, seed_stream=i) for i, p in enumerate(batch)]
        done = run_until_done(engine)
        outs.append([done[i] for i in ids])
    return outs
