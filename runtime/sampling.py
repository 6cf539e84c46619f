"""Sampling settings and the processed distribution they define.

Draft and target probabilities are always computed by the same function with
the same settings: rejection sampling is only exact when p and q are the
*same* processed distributions (temperature, top-k, min-p and top-p applied to
both). The settings that read a request's history (penalties, logit bias, a
grammar) are applied before these, by runtime/logits.py.

The settings themselves, checked, and what counts as greedy: formats/sampling_params.py.
"""

from __future__ import annotations

import numpy as np

from ..formats.sampling_params import GREEDY_TEMPERATURE, SamplingConfig  # noqa: F401  (the runtime's names for them)


def processed_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """logits: [rows, vocab] -> probabilities [rows, vocab] (float64) after temperature, top-k, min-p, top-p."""
    x = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        out = np.zeros_like(x)
        out[np.arange(len(x)), x.argmax(axis=-1)] = 1.0
        return out
    # shifted before the division: a tiny temperature sends the others to -inf, never inf - inf
    with np.errstate(over="ignore"):  # -> -inf: the token cannot be drawn
        x = (x - x.max(axis=-1, keepdims=True)) / cfg.temperature
    if 0 < cfg.top_k < x.shape[-1]:
        kth = np.partition(x, -cfg.top_k, axis=-1)[:, -cfg.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if cfg.min_p > 0.0:
        p = np.where(p < cfg.min_p * p.max(axis=-1, keepdims=True), 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    if 0.0 < cfg.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it is kept)
        drop_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) >= cfg.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector [vocab], with the generator's next uniform (a draft's samples)."""
    return draw(probs, rng.random())


def draw(probs: np.ndarray, u: float) -> int:
    """The token a uniform ``u`` in [0, 1) picks from a probability vector [vocab] (the inverse of its CDF)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(probs) - 1))


# what a target uniform at a position is for: the token's draw, and rejection sampling's test of a draft and its draw
# from the residual (each its own number: within a position they must be independent)
DRAW, ACCEPT_TEST, RESIDUAL = 0, 1, 2
_TAG = 0x5EED_D4A7  # keeps these keys apart from the draft generator's [seed, stream] (SeedSequence drops trailing zeros)


class TargetDraws:
    """A request's target-side random numbers: the uniform for output position t is a function of (seed, stream, t)
    alone, hashed by numpy's SeedSequence, not of how many numbers were drawn before it.

    A draft generator's stream would shift with every draft the target does not read, so the token the target samples
    at a position would depend on how many drafts each round took. Keyed by position it does not: a request whose drafts
    are verified by token compare (n-gram, suffix, drafts through another tokenizer; target-only too) samples the same
    tokens as target-only with its seed, whatever the draft lengths, ``draft_len="auto"`` or the batch. The draft's own
    samples come from the request's generator (Request.rng), apart from these. About 8 us a draw.
    """

    __slots__ = ("seed", "stream")

    def __init__(self, seed: int, stream: int = 0) -> None:
        self.seed, self.stream = int(seed), int(stream)

    def uniform(self, position: int, purpose: int = DRAW) -> float:
        """The uniform in [0, 1) for output ``position`` (0: the first output token) and ``purpose``."""
        (bits,) = np.random.SeedSequence([self.seed, self.stream, _TAG + purpose, position]).generate_state(1, np.uint64)
        return float(bits >> np.uint64(11)) * 2.0**-53  # the top 53 bits: every double in [0, 1) a multiple of 2**-53

    def at(self, start: int) -> RowDraws:
        """The uniforms of a verification call whose row 0 picks output position ``start``."""
        return RowDraws(self, start)


class RowDraws:
    """TargetDraws seen from one verification call: row j picks output position start + j (a chain's row j, a tree's node
    at depth j)."""

    __slots__ = ("draws", "start")

    def __init__(self, draws: TargetDraws, start: int) -> None:
        self.draws, self.start = draws, start

    def uniform(self, row: int, purpose: int = DRAW) -> float:
        return self.draws.uniform(self.start + row, purpose)

    def draw(self, probs: np.ndarray, row: int) -> int:
        """The target's token at row ``row`` from its processed distribution probs [vocab]."""
        return draw(probs, self.uniform(row))
