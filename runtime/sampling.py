"""Sampling settings and the processed distribution they define.

Draft and target probabilities are always computed by the same function with
the same settings: rejection sampling is only exact when p and q are the
*same* processed distributions (temperature, top-k, min-p and top-p applied to
both). The settings that read a request's history (penalties, logit bias, token
bans, a grammar) are applied before these, by runtime/logits.py.

The settings themselves, checked, and what counts as greedy: formats/sampling_params.py.
"""

from __future__ import annotations

import numpy as np

from ..formats.sampling_params import GREEDY_TEMPERATURE, SamplingConfig  # noqa: F401  (the runtime's names for them)


def processed_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """logits: [rows, vocab] -> probabilities [rows, vocab] (float64) after temperature, top-k, min-p, top-p."""
    x = np.asarray(logits)
    if cfg.greedy:
        out = np.zeros(x.shape, np.float64)
        out[np.arange(len(x)), x.argmax(axis=-1)] = 1.0
        return out
    return np.stack([_row_probs(row, cfg) for row in x]) if len(x) != 1 else _row_probs(x[0], cfg)[None]


# Where top-p looks for the nucleus first: the tokens above this share of the most likely one's probability. A model's
# distribution holds nearly all its mass there, so sorting those few hundred replaces sorting the whole vocabulary
# (14-18 ms a row at 128k-152k tokens on a 2-core Xeon: docs/benchmarks.md); where they hold less than top_p, the cut is
# lowered, down to a sort of everything.
_NUCLEUS_CUTS = (1e-3, 1e-6, 1e-12)


def _row_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """One row [vocab] -> its probabilities [vocab] (float64). The tokens still possible after each setting are carried
    as indices into the vocabulary (``support``), so top-k, min-p and top-p work on those alone, not on every token."""
    vocab = logits.shape[-1]
    x = np.array(logits, dtype=np.float64)  # a copy, changed in place below
    top = x.max()
    if np.isnan(top):  # no distribution: NaN throughout, as the whole-row version gave, for the caller's guard to refuse
        return np.full(vocab, np.nan)
    # shifted before the division: a tiny temperature sends the others to -inf, never inf - inf
    x -= top
    with np.errstate(over="ignore"):  # -> -inf: the token cannot be drawn
        x /= cfg.temperature
    support: np.ndarray | None = None  # the possible tokens' ids, ascending; None: every token
    if 0 < cfg.top_k < vocab:
        kth = np.partition(x, -cfg.top_k)[-cfg.top_k]
        support = np.flatnonzero(x >= kth)  # ties with the k-th kept
        x = x[support]
    p = np.exp(x, out=x)  # the most likely token is at 0 already (shifted above; top-k keeps it): no second shift
    p /= p.sum()
    if cfg.min_p > 0.0:
        kept = np.flatnonzero(p >= cfg.min_p * p.max())
        support = kept if support is None else support[kept]
        p = p[kept]
        p /= p.sum()
    if 0.0 < cfg.top_p < 1.0:
        kept = _nucleus(p, cfg.top_p)
        support = kept if support is None else support[kept]
        p = p[kept]
        p /= p.sum()
    if support is None:
        return p
    out = np.zeros(vocab, np.float64)
    out[support] = p
    return out


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The ids (ascending) of the smallest set of most likely tokens whose mass reaches top_p, the token that crosses
    it kept, ties in probability taken in id order: a stable sort of -p over every token, cut where the mass before a
    token reaches top_p. p: [n] probabilities summing to 1."""
    top = float(p.max())
    for cut in _NUCLEUS_CUTS:
        candidates = np.flatnonzero(p > cut * top)  # every token more likely than the cut, and only those
        if len(candidates) == len(p):
            break
        if p[candidates].sum() < top_p - 1e-6:  # a quick look (the sum in sorted order below decides)
            continue
        order, cum = _sorted_mass(p, candidates)
        # the tokens left out are the least likely, so the sorted candidates are the whole row's sorted order up to
        # there, and the mass before the first token left out is cum[-1]: reaching top_p, it and all after it are cut
        if cum[-1] >= top_p:
            return _cut(order, p, cum, top_p)
    order, cum = _sorted_mass(p, np.arange(len(p)))
    return _cut(order, p, cum, top_p)


def _sorted_mass(p: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ids (ascending) sorted most likely first, ties in id order, and the running sum of their probabilities."""
    order = ids[np.argsort(-p[ids], kind="stable")]
    return order, np.cumsum(p[order])


def _cut(order: np.ndarray, p: np.ndarray, cum: np.ndarray, top_p: float) -> np.ndarray:
    """The sorted ids up to and including the token whose mass before it is still below top_p, ascending."""
    before = cum - p[order]  # nondecreasing
    return np.sort(order[: max(int(np.searchsorted(before, top_p, side="left")), 1)])


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector [vocab], with the generator's next uniform (a draft's samples)."""
    return draw(probs, rng.random())


def sample_distinct(probs: np.ndarray, m: int, rng: np.random.Generator) -> list[int]:
    """Up to m tokens drawn one after another from probs [vocab] without replacement: each from the distribution left
    when the ones before it are removed (fewer where fewer tokens have mass). A sampled draft tree's children of one
    node, in the order recursive rejection sampling tests them (runtime/tree.py).

    One CDF serves every draw: a draw that lands on a token already taken is drawn again, which is exactly the
    distribution left (q restricted to the rest, renormalized); once half the mass is taken, the rest is drawn from
    directly (a vocabulary-long pass per draw, as retries would grow)."""
    cdf = np.cumsum(probs, dtype=np.float64)  # [vocab]
    total = float(cdf[-1]) if len(cdf) else 0.0
    out: list[int] = []
    taken = 0.0  # the mass of the tokens drawn
    while len(out) < m and total > 0 and total - taken > total * 1e-12:
        if taken > 0.5 * total:
            rest = np.array(probs, dtype=np.float64)
            rest[out] = 0.0
            t = draw(rest, rng.random())
            if rest[t] <= 0:  # (rounding past the last token with mass: nothing left to draw)
                break
        else:
            t = int(min(np.searchsorted(cdf, rng.random() * total, side="right"), len(cdf) - 1))
            if probs[t] <= 0 or t in out:
                continue  # a token taken (or rounding onto one without mass): draw again
        out.append(t)
        taken += float(probs[t])
    return out


def draw(probs: np.ndarray, u: float) -> int:
    """The token a uniform ``u`` in [0, 1) picks from a probability vector [vocab] (the inverse of its CDF)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(probs) - 1))


# what a target uniform at a position is for: the token's draw, and rejection sampling's test of a draft and its draw
# from the residual (each its own number: within a position they must be independent)
DRAW, ACCEPT_TEST, RESIDUAL = 0, 1, 2
_TARGET_TAG, _DRAFT_TAG = 0x5EED_D4A7, 0xD4AF_75EE  # the kinds of keys apart, and never a trailing zero


def sibling_test(i: int) -> int:
    """The purpose of the uniform that tests a tree node's i-th child (0: the first, as a chain's draft is tested;
    then 3, 4, ..., past RESIDUAL)."""
    return ACCEPT_TEST if i == 0 else RESIDUAL + i


def seed_words(*values: int) -> list[int]:
    """Integers below 2**64 as two 32-bit words each, low first: numpy's SeedSequence splits an entry into as many words
    as it needs and drops trailing zero words, so [S + 2**32, 0] and [S, 1] would be the same key; fixed widths cannot
    run into each other."""
    return [w for v in values for w in (int(v) & 0xFFFF_FFFF, int(v) >> 32)]


def draft_generator(seed: int, stream: int) -> np.random.Generator:
    """A request's generator for its drafts' samples: keyed by (seed, stream), apart from its TargetDraws."""
    return np.random.default_rng([*seed_words(seed, stream), _DRAFT_TAG])


class TargetDraws:
    """A request's target-side random numbers: the uniform for output position t is a function of (seed, stream, t)
    alone, hashed by numpy's SeedSequence, not of how many numbers were drawn before it.

    A draft generator's stream would shift with every draft the target does not read, so the token the target samples
    at a position would depend on how many drafts each round took. Keyed by position it does not: a request whose drafts
    are verified by token compare (n-gram, suffix, drafts through another tokenizer; target-only too) samples the same
    tokens as target-only with its seed, whatever the draft lengths, ``draft_len="auto"`` or the batch. The draft's own
    samples come from the request's generator (Request.rng), apart from these. About 8 us a draw.
    """

    __slots__ = ("seed", "stream", "_key")

    def __init__(self, seed: int, stream: int = 0) -> None:
        self.seed, self.stream = int(seed), int(stream)
        self._key = seed_words(self.seed, self.stream)  # the request's words of every key, split once

    def uniform(self, position: int, purpose: int = DRAW) -> float:
        """The uniform in [0, 1) for output ``position`` (0: the first output token) and ``purpose``."""
        (bits,) = np.random.SeedSequence([*self._key, *seed_words(position), _TARGET_TAG + purpose]).generate_state(1, np.uint64)
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
