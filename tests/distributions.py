"""Does speculative sampling keep the target's distribution: the sampled runs and the chi-square homogeneity test
the runtime tests share (Medusa, P-EAGLE and suffix decoding each compare theirs with target-only sampling's)."""

from __future__ import annotations

import numpy as np

from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a statistic with ``df`` degrees of freedom exceeds with probability ~0.001 (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * a**0.5) ** 3


def sampled_pairs(engine: Engine, prompt: list[int], sampling: dict, seeds: int = 1200, max_output_len: int = 3) -> list[tuple[int, ...]]:
    """Output tokens 1..2 of ``prompt`` sampled once per seed 0..seeds-1 (one request per seed). A request of 3 tokens
    drafts one token after the prefill's (its room): a longer one lets a tree draft whole."""
    for seed in range(seeds):
        cfg = GenerationConfig(max_output_len=max_output_len, sampling=SamplingConfig(random_seed=seed, **sampling))
        engine.add_request(prompt, cfg, seed_stream=seed)
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


def assert_drawn_tree(draft, vocab: int) -> None:
    """A sampled request's tree draft: every node carries the distribution q [vocab] it was drawn from (summing to 1,
    with mass on its token), siblings share it and hold distinct tokens, and parents come first."""
    assert draft.parents is not None and draft.probs is not None and draft.probs.shape == (len(draft), vocab)
    np.testing.assert_allclose(draft.probs.sum(-1), 1.0, rtol=1e-5)
    assert (draft.probs[np.arange(len(draft)), draft.tokens] > 0).all()
    for parent in set(draft.parents.tolist()):
        kids = np.flatnonzero(draft.parents == parent)
        assert parent < kids.min() and len(set(draft.tokens[kids].tolist())) == len(kids)
        np.testing.assert_array_equal(draft.probs[kids], np.broadcast_to(draft.probs[kids[0]], (len(kids), vocab)))


def keeps_target_distribution(target, proposer_for, method: str, draft_len: int | str, prompt: list[int], sampling: dict,
                              prepare=None, nodes: int = 6) -> None:
    """Output tokens 1..2 over 1200 seeds with ``method`` (a fresh proposer from ``proposer_for()``) drafting
    ``draft_len`` tokens or tree nodes (``auto``: up to ``nodes``) against target-only sampling's: chi-square
    homogeneity, p > 0.001. Requests run long enough to draft whole trees; some drafts were kept, and some round
    verified a node with several children (more nodes than its depth). ``prepare(engine)``: before the method's runs."""
    counts = {}
    longest = draft_len if isinstance(draft_len, int) else nodes
    for name in ("none", method):
        engine = Engine(target, [proposer_for()] if name == method else [], SpeculationConfig(name, draft_len if name == method else 0))
        if name == method and prepare is not None:
            prepare(engine)
        counts[name] = sampled_pairs(engine, prompt, sampling, max_output_len=3 + longest)
        if name == method:
            assert engine.stats.accepted > 0 and engine.stats.drafted > sum(engine.stats.drafted_at)
    stat, n_keys = homogeneity(counts["none"], counts[method])
    assert n_keys >= 4 and stat < chi_square_critical(n_keys - 1), (stat, n_keys)
