"""Does speculative sampling keep the target's distribution: the sampled runs and the chi-square homogeneity test
the runtime tests share (Medusa, P-EAGLE and suffix decoding each compare theirs with target-only sampling's)."""

from __future__ import annotations

import numpy as np

from specdec.runtime.engine import Engine
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a statistic with ``df`` degrees of freedom exceeds with probability ~0.001 (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * a**0.5) ** 3


def sampled_pairs(engine: Engine, prompt: list[int], sampling: dict, seeds: int = 1200) -> list[tuple[int, ...]]:
    """Output tokens 1..2 of ``prompt`` sampled once per seed 0..seeds-1 (3 tokens each, one request per seed)."""
    for seed in range(seeds):
        engine.add_request(prompt, GenerationConfig(max_output_len=3, sampling=SamplingConfig(random_seed=seed, **sampling)), seed_stream=seed)
    seen = []
    while engine.has_unfinished():
        seen += [tuple(o.output_ids[1:3]) for o in engine.step() if o.finished]
    return seen


def homogeneity(a: list, b: list) -> tuple[float, int]:
    """The chi-square homogeneity statistic of two samples over the outcomes seen at least 10 times in both together,
    and how many such outcomes there are (the test's degrees of freedom + 1)."""
    keys = [k for k in sorted(set(a) | set(b)) if a.count(k) + b.count(k) >= 10]
    table = np.array([[sample.count(k) for k in keys] for sample in (a, b)], float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum()), len(keys)
