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
from specdec.runtime.sampling import (
    ACCEPT_TEST,
    DRAW,
    RESIDUAL,
    SamplingConfig,
    TargetDraws,
    draft_generator,
    draw,
    processed_probs,
    sample,
)

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
    rng = np.random.default_rng(7)  # the drafts' samples
    for i in range(N):
        drafts = np.array([sample(q[j], rng) for j in range(K)])
        n, nxt = rule(drafts, q, TargetDraws(7, stream=i).at(0))  # the target's: each round a request of its own
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
        def rule(d, q, draws):
            return accept_rejection_sampling(d, q, TARGET_LOGITS, SAMPLING, draws)
    else:
        def rule(d, q, draws):
            return accept_token_compare(d, TARGET_LOGITS, SAMPLING, draws)
    p = processed_probs(TARGET_LOGITS, SAMPLING)
    hist = emitted_histograms(rule)
    assert tv(hist[0], p[0]) < TV_BOUND
    assert tv(hist[1], p[1]) < TV_BOUND


def test_the_bound_catches_a_wrong_residual():
    """Resampling from p after a rejection (instead of max(0, p - q)) is biased; the test must see it."""
    p = processed_probs(TARGET_LOGITS, SAMPLING)

    def wrong(drafts, q, draws):
        for j in range(K):
            x = drafts[j]
            if draws.uniform(j, ACCEPT_TEST) < min(1.0, p[j, x] / q[j, x]):
                continue
            return j, draw(p[j], draws.uniform(j, RESIDUAL))
        return K, draws.draw(p[K], K)

    hist = emitted_histograms(wrong)
    assert tv(hist[0], p[0]) > 2 * TV_BOUND


def test_greedy_accepts_the_matching_prefix():
    logits = np.full((4, V), -5.0)
    for j, t in enumerate([1, 2, 3, 4]):
        logits[j, t] = 5.0
    draws = TargetDraws(0).at(0)
    assert accept_token_compare(np.array([1, 2, 5]), logits, SamplingConfig(), draws) == (2, 3)
    assert accept_token_compare(np.array([1, 2, 3]), logits, SamplingConfig(), draws) == (3, 4)  # bonus token
    assert accept_token_compare(np.array([0, 2, 3]), logits, SamplingConfig(), draws) == (0, 1)
    assert accept_token_compare(np.array([], np.int64), logits[:1], SamplingConfig(), draws) == (0, 1)


def test_greedy_on_plain_rows_compares_the_argmaxes_as_ints():
    """accept_greedy_plain (the round's path for a greedy request without logits processing) keeps the drafts up to the
    first that differs from the target's argmax, then that argmax; every draft kept: the bonus pick."""
    from specdec.runtime.acceptance import accept_greedy_plain

    assert accept_greedy_plain([1, 2, 5], [1, 2, 3, 4]) == (2, 3)
    assert accept_greedy_plain([1, 2, 3], [1, 2, 3, 4]) == (3, 4)  # bonus token
    assert accept_greedy_plain([0, 2, 3], [1, 2, 3, 4]) == (0, 1)
    assert accept_greedy_plain([], [7]) == (0, 7)  # target-only: the row's argmax


def test_target_draws_are_keyed_by_position_and_uniform():
    """The uniform at a position is a function of (seed, stream, position, purpose) alone: the same whenever it is asked
    for and whatever was asked before, different across each of the four; and the numbers are uniform on [0, 1)."""
    a, b = TargetDraws(3, 1), TargetDraws(3, 1)
    first = [a.uniform(t) for t in range(6)]
    assert [b.uniform(t) for t in reversed(range(6))] == first[::-1]  # asked in another order: the same numbers
    assert a.at(4).uniform(1) == first[5]  # a call whose row 0 is position 4: its row 1 is position 5
    others = {TargetDraws(4, 1).uniform(0), TargetDraws(3, 0).uniform(0), a.uniform(0, ACCEPT_TEST), a.uniform(0, RESIDUAL), a.uniform(1)}
    assert len(others | {first[0]}) == 6
    # nor the drafts' generator's first number, nor another seed's and stream's (numpy's SeedSequence splits a large entry
    # into 32-bit words and drops trailing zero words: [S + 2**32, 0] and [S, 1] were one key)
    assert TargetDraws(5).uniform(0, DRAW) != draft_generator(5, 0).random()
    assert TargetDraws(5 + 2**32, 0).uniform(0) != TargetDraws(5, 1).uniform(0)
    assert draft_generator(5 + 2**32, 0).random() != draft_generator(5, 1).random()
    assert TargetDraws(2**64 - 1, 3).uniform(2**20) == TargetDraws(2**64 - 1, 3).uniform(2**20)  # the largest seed the server passes
    u = np.array([TargetDraws(9, s).uniform(t) for s in range(40) for t in range(250)])  # 10,000 numbers
    counts = np.histogram(u, bins=20, range=(0.0, 1.0))[0]
    chi2 = float(((counts - 500) ** 2 / 500).sum())
    assert 0.0 <= u.min() and u.max() < 1.0
    assert chi2 < 43.8  # 19 degrees of freedom: p = 0.001


@pytest.mark.parametrize("rule", ["token_compare", "tree"])
def test_token_compare_samples_target_onlys_tokens_whatever_the_drafts(rule):
    """With the same target draws, verification by token compare emits the tokens target-only sampling picks at those
    positions, one call or several, whatever the drafts: a request's sampled output does not depend on its drafts."""
    from specdec.runtime.tree import accept_tree_token_compare

    rows = np.random.default_rng(4).normal(size=(40, V)) * 1.5  # the target's row at output position t (history-free here)
    p = processed_probs(rows, SAMPLING)
    draws = TargetDraws(11, 2)
    alone = [draws.at(t).draw(p[t], 0) for t in range(len(rows))]  # target-only: one token a call
    drafts_rng = np.random.default_rng(0)
    for _ in range(20):  # drafts of random lengths, some right (taken from target-only's output), some not
        out: list[int] = []
        while len(out) < len(rows) - K - 1:
            t, k = len(out), int(drafts_rng.integers(0, K + 1))
            guess = [alone[t + j] if drafts_rng.random() < 0.6 else int(drafts_rng.integers(V)) for j in range(k)]
            if rule == "token_compare":
                n, nxt = accept_token_compare(np.array(guess, np.int64), rows[t : t + k + 1], SAMPLING, draws.at(t))
                out += guess[:n] + [nxt]
            else:  # the same guesses as a chain tree, beside a wrong sibling at the root
                tokens = np.array(guess + [(alone[t] + 1) % V], np.int64)
                parents = np.array(list(range(-1, k - 1)) + [-1], np.int64)
                tree_rows = np.concatenate([rows[t : t + k + 1], rows[t : t + 1]])  # row j + 1: node j's; the sibling's is position t + 1's
                tree_rows[k + 1] = rows[t + 1]
                path, nxt = accept_tree_token_compare(tokens, parents, tree_rows, SAMPLING, draws.at(t))
                out += [int(tokens[j]) for j in path] + [nxt]
        assert out == alone[: len(out)]
