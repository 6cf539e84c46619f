"""processed_probs works on the tokens each setting leaves possible, not on the whole vocabulary: it must give the
distribution the settings define, which the reference computes the plain way, over every token (temperature, top-k,
min-p, top-p, each renormalized; top-p by a stable sort of the whole row): benchmarks/bench_sampling.py's
whole_vocabulary_probs, the version it replaced, which the benchmark times it against."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specdec.runtime.sampling import SamplingConfig, processed_probs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_sampling import whole_vocabulary_probs as reference_probs  # noqa: E402  (the definition, beside its benchmark)


def assert_same(logits: np.ndarray, cfg: SamplingConfig) -> None:
    got, want = processed_probs(logits, cfg), reference_probs(logits, cfg)
    assert got.dtype == np.float64 and got.shape == want.shape
    differ = (got > 0) != (want > 0)
    if differ.any():  # only where rounding decides: the mass before a token equals top_p
        before_top_p = reference_probs(logits, dataclasses.replace(cfg, top_p=1.0))
        for row, token in zip(*np.nonzero(differ), strict=True):
            p = before_top_p[row]
            ahead = (p > p[token]) | ((p == p[token]) & (np.arange(len(p)) < token))  # the stable sort's tokens before it
            assert abs(p[ahead].sum() - cfg.top_p) < 1e-9, f"token {token} differs away from a top-p tie"
        return
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


CONFIGS = [
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=0.7, top_p=0.95),
    SamplingConfig(temperature=1.0, top_p=0.5),
    SamplingConfig(temperature=1.3, top_k=50),
    SamplingConfig(temperature=0.7, top_k=40, top_p=0.9),
    SamplingConfig(temperature=0.7, min_p=0.05),
    SamplingConfig(temperature=0.6, min_p=0.05, top_p=0.9, top_k=100),
]


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0, 10.0])  # nearly flat (top-p keeps most of the vocabulary) to peaked
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"t{c.temperature}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
def test_a_large_vocabulary_gets_the_reference_distribution(cfg, scale):
    logits = (np.random.default_rng(int(scale * 10)).standard_t(3, size=(2, 32_000)) * scale).astype(np.float32)
    assert_same(logits, cfg)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    vocab=st.integers(1, 60),
    temperature=st.sampled_from([1e-4, 0.05, 0.5, 1.0, 2.0]),
    top_k=st.integers(0, 70),
    top_p=st.sampled_from([1.0, 0.0, 1e-9, 0.3, 0.9, 0.999999]),
    min_p=st.sampled_from([0.0, 0.01, 0.5, 1.0]),
)
def test_every_setting_matches_the_reference_on_ties_and_masked_tokens(data, vocab, temperature, top_k, top_p, min_p):
    """Small integer logits make ties at the top-k, min-p and top-p cuts (ties in probability: lower ids first); -inf
    stands for a token a grammar or a logit bias masked."""
    values = data.draw(st.lists(st.sampled_from([-np.inf, -3.0, -1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0]), min_size=vocab, max_size=vocab))
    if all(v == -np.inf for v in values):
        values[0] = 0.0  # a row with a possible token (the engine stops a request on a row without one)
    assert_same(np.array([values], np.float32), SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))


def test_top_p_cut_at_the_last_token_of_a_look_or_past_it():
    """Two likely tokens and a long tail: at top_p 0.85 the second token crosses it, the last of the first look's tokens,
    and the tail is cut; at 0.95 the crossing lies in the tail, past that look: the whole row's order decides."""
    p = np.full(100_002, 0.1 / 100_000)
    p[:2] = [0.6, 0.3]
    for top_p in (0.85, 0.9, 0.95):
        assert_same(np.log(p)[None], SamplingConfig(temperature=1.0, top_p=top_p))
    assert (processed_probs(np.log(p)[None], SamplingConfig(temperature=1.0, top_p=0.85)) > 0).sum() == 2
    assert (processed_probs(np.log(p)[None], SamplingConfig(temperature=1.0, top_p=0.95)) > 0).sum() == 50_002


def test_top_p_finds_a_nucleus_past_the_first_cut():
    """A row whose top-p set reaches far below the most likely token (a long flat tail) is cut where the whole row's
    sorted order cuts it, through the wider looks and the whole sort."""
    p = np.full(50_000, 1e-9)
    p[:3] = [0.5, 0.2, 0.1]
    p[3:] = (1 - 0.8) / (len(p) - 3)  # 20% of the mass in a tail each 1e-5 as likely as the top token
    assert_same(np.log(p)[None], SamplingConfig(temperature=1.0, top_p=0.9))
    assert_same(np.log(p)[None], SamplingConfig(temperature=1.0, top_p=0.79))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"t{c.temperature}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
def test_a_row_with_nan_gives_nan_for_the_callers_guard(cfg):
    """No distribution for a row holding NaN: NaN throughout, as the whole-row version gives, so the round's non-finite
    check ends that request (runtime/guards.py) rather than an error raised from inside a setting."""
    row = np.array([[0.5, np.nan, 2.0, 1.0, -1.0, 3.0]], np.float32)
    assert np.isnan(processed_probs(row, cfg)).all() and np.isnan(reference_probs(row, cfg)).all()


@pytest.mark.parametrize("q", [[0.1, 0.2, 0.3, 0.25, 0.15], [0.7, 0.05, 0.15, 0.1, 0.0]])
def test_sample_distinct_draws_without_replacement(q):
    """The pair of first two draws follows q(a) q(b) / (1 - q(a)) (chi-square goodness of fit over 20,000 pairs,
    p > 0.001), with a flat q and with one holding 0.7 of the mass (its second draw taken from the rest directly);
    draws are distinct and never a token without mass; a q with fewer tokens with mass gives fewer draws."""
    from distributions import chi_square_critical

    from specdec.runtime.sampling import sample_distinct

    q = np.array(q)
    rng = np.random.default_rng(11)
    counts = np.zeros((5, 5))
    for _ in range(20000):
        drawn = sample_distinct(q, 3, rng)
        assert len(drawn) == 3 and len(set(drawn)) == 3 and all(q[t] > 0 for t in drawn)
        counts[drawn[0], drawn[1]] += 1
    expected = 20000 * q[:, None] * q[None, :] / (1 - q[:, None])
    np.fill_diagonal(expected, 0.0)
    cells = expected > 0
    stat = float(((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum())
    assert counts[~cells].sum() == 0 and stat < chi_square_critical(int(cells.sum()) - 1), stat
    assert sorted(sample_distinct(np.array([0.0, 0.6, 0.0, 0.4]), 3, rng)) == [1, 3]
    assert sample_distinct(np.zeros(4), 2, rng) == []
