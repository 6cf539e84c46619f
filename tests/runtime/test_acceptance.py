"""Invariant 3: with sampling, the output is distributed as the target's.

The acceptance rules are checked on fixed distributions over a tiny
vocabulary: many seeded rounds, and the total variation distance between the
emitted tokens and the exact target distribution must stay under a bound that
a wrong rule (the classic bug: resampling from p instead of max(0, p - q))
exceeds; a test of the test shows it.
"""

import numpy as np
import pytest

from specdec.runtime.acceptance import accept_rejection_sampling, accept_token_compare
from specdec.runtime.sampling import SamplingConfig, processed_probs, sample

V, K, N = 6, 3, 30000
TV_BOUND = 0.02  # sampling noise at N=30000, V=6 is about 0.006

rng0 = np.random.default_rng(123)
TARGET_LOGITS = rng0.normal(size=(K + 1, V)) * 1.5
DRAFT_LOGITS = rng0.normal(size=(K, V)) * 1.5
SAMPLING = SamplingConfig(temperature=0.8, top_k=5, top_p=0.95)


def emitted_histograms(rule) -> np.ndarray:
    """hist[j] = empirical distribution of the j-th emitted token (positions are independent here)."""
    hist = np.zeros((K + 1, V))
    q = processed_probs(DRAFT_LOGITS, SAMPLING)
    rng = np.random.default_rng(7)
    for _ in range(N):
        drafts = np.array([sample(q[j], rng) for j in range(K)])
        n, nxt = rule(drafts, q, rng)
        for j, t in enumerate(list(drafts[:n]) + [nxt]):
            hist[j, t] += 1
    return hist / hist.sum(axis=1, keepdims=True)


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def test_processed_probs_apply_top_k_and_top_p():
    p = processed_probs(np.log(np.array([[0.5, 0.3, 0.15, 0.05]])), SamplingConfig(temperature=1.0, top_k=3, top_p=0.8))
    # top-k keeps 3; of (0.526, 0.316, 0.158) top-p 0.8 keeps the first two
    np.testing.assert_allclose(p[0], [0.625, 0.375, 0, 0], atol=1e-9)


@pytest.mark.parametrize("name", ["rejection_sampling", "token_compare"])
def test_output_distribution_is_the_targets(name):
    if name == "rejection_sampling":
        def rule(d, q, rng):
            return accept_rejection_sampling(d, q, TARGET_LOGITS, SAMPLING, rng)
    else:
        def rule(d, q, rng):
            return accept_token_compare(d, TARGET_LOGITS, SAMPLING, rng)
    p = processed_probs(TARGET_LOGITS, SAMPLING)
    hist = emitted_histograms(rule)
    assert tv(hist[0], p[0]) < TV_BOUND
    assert tv(hist[1], p[1]) < TV_BOUND


def test_the_bound_catches_a_wrong_residual():
    """Resampling from p after a rejection (instead of max(0, p - q)) is biased; the test must see it."""
    p = processed_probs(TARGET_LOGITS, SAMPLING)

    def wrong(drafts, q, rng):
        for j in range(K):
            x = drafts[j]
            if rng.random() < min(1.0, p[j, x] / q[j, x]):
                continue
            return j, sample(p[j], rng)
        return K, sample(p[K], rng)

    hist = emitted_histograms(wrong)
    assert tv(hist[0], p[0]) > 2 * TV_BOUND


def test_greedy_accepts_the_matching_prefix():
    logits = np.full((4, V), -5.0)
    for j, t in enumerate([1, 2, 3, 4]):
        logits[j, t] = 5.0
    rng = np.random.default_rng(0)
    assert accept_token_compare(np.array([1, 2, 5]), logits, SamplingConfig(), rng) == (2, 3)
    assert accept_token_compare(np.array([1, 2, 3]), logits, SamplingConfig(), rng) == (3, 4)  # bonus token
    assert accept_token_compare(np.array([0, 2, 3]), logits, SamplingConfig(), rng) == (0, 1)
    assert accept_token_compare(np.array([], np.int64), logits[:1], SamplingConfig(), rng) == (0, 1)


def test_greedy_on_plain_rows_compares_the_argmaxes_as_ints():
    """accept_greedy_plain (the round's path for a greedy request without logits processing) keeps the drafts up to the
    first that differs from the target's argmax, then that argmax; every draft kept: the bonus pick."""
    from specdec.runtime.acceptance import accept_greedy_plain

    assert accept_greedy_plain([1, 2, 5], [1, 2, 3, 4]) == (2, 3)
    assert accept_greedy_plain([1, 2, 3], [1, 2, 3, 4]) == (3, 4)  # bonus token
    assert accept_greedy_plain([0, 2, 3], [1, 2, 3, 4]) == (0, 1)
    assert accept_greedy_plain([], [7]) == (0, 7)  # target-only: the row's argmax
