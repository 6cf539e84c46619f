"""Logits processing in one place: every per-request setting that changes a distribution.

One request's chain, applied at every position the engine samples or verifies,
with that position's own history (the committed output plus the drafts
before it), to the target's logits and to a draft's alike:

    penalties    repetition (prompt + output), frequency and presence (output)   on the raw logits
    logit_bias   added per token id
    allowed      tokens outside allowed_token_ids get -inf (runtime/bans.py)
    grammar      tokens the request's grammar forbids get -inf (runtime/grammar.py)
    bans         bad words, repeated n-grams, and the end ids before min_output_len: -inf, unless that leaves no token (runtime/bans.py)
    ---- the processed logits: greedy picks their argmax; logprobs are their log-softmax
    temperature, top-k, min-p, top-p    runtime/sampling.py's processed_probs -> the distribution sampled

Rejection sampling is exact when p and q are the distributions the target and
the draft really define at a position; computing both here, with the
position's history, is what keeps speculative output distributed as
target-only output for every setting, and greedy output identical to it.

    proc = LogitsProcessor(sampling, prompt_ids, grammar_state)
    x = proc.logits(row, appended)   # row [vocab] -> processed [vocab]; appended: the drafts before this position
    proc.commit(tokens)              # tokens joined the output
    rows = Rows(logits, proc, drafts)  # a round's target rows [k + 1, vocab], processed lazily
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .bans import TokenBans
from .sampling import SamplingConfig, processed_probs, sample

if TYPE_CHECKING:
    from .grammar import GrammarState


class LogitsProcessor:
    """One request's chain and the history it reads."""

    def __init__(self, cfg: SamplingConfig, prompt_ids: Sequence[int] = (), grammar: GrammarState | None = None,
                 end_ids: Sequence[int] = (), min_output_len: int = 0):
        self.cfg = cfg
        self.grammar = grammar
        self.bans = TokenBans(cfg, prompt_ids, end_ids, min_output_len) if TokenBans.needed(cfg, end_ids, min_output_len) else None
        self.counts: Counter[int] = Counter()  # output tokens (frequency, presence)
        self.seen: set[int] = set(int(t) for t in prompt_ids) if cfg.repetition_penalty != 1.0 else set()
        self.bias_ids = np.array([t for t, _ in cfg.logit_bias], np.int64)
        self.bias_values = np.array([b for _, b in cfg.logit_bias], np.float64)
        self.penalized = cfg.repetition_penalty != 1.0 or cfg.frequency_penalty != 0.0 or cfg.presence_penalty != 0.0
        self.plain = self._plain()

    # -- the chain ------------------------------------------------------------------------
    def logits(self, row: np.ndarray, appended: Sequence[int] = ()) -> np.ndarray:
        """row: [vocab] raw logits at a position after the committed output and ``appended`` -> processed [vocab]."""
        if self.plain:
            return row
        x = np.array(row, dtype=np.float64)
        width = len(x)
        if self.penalized:
            self._penalize(x, appended)
        if len(self.bias_ids):
            inside = self.bias_ids < width
            x[self.bias_ids[inside]] += self.bias_values[inside]
        # a tiny repetition penalty divides a logit past float64's range: the largest finite one instead, never inf - inf
        np.minimum(x, np.finfo(np.float64).max, out=x)
        if self.bans is not None:
            self.bans.apply_allowed(x)
        if self.grammar is not None:
            mask = self.grammar.allowed(appended)  # [grammar vocab]
            x[: min(width, len(mask))][~mask[:width]] = -np.inf
            x[len(mask) :] = -np.inf
        if self.bans is not None:
            self.bans.apply_bans(x, appended)  # after the constraints: a ban that would leave no token yields
        return x

    def _penalize(self, x: np.ndarray, appended: Sequence[int]) -> None:
        cfg, width = self.cfg, len(x)
        counts = self.counts + Counter(int(t) for t in appended) if len(appended) else self.counts
        if cfg.repetition_penalty != 1.0:
            # transformers' and vLLM's rule: divide a positive logit, multiply a negative one
            ids = np.fromiter(self.seen | counts.keys(), np.int64)
            ids = ids[ids < width]
            v = x[ids]
            with np.errstate(over="ignore"):  # overflow to inf is clamped below
                x[ids] = np.where(v > 0, v / cfg.repetition_penalty, v * cfg.repetition_penalty)
        if counts and (cfg.frequency_penalty or cfg.presence_penalty):
            ids = np.fromiter(counts.keys(), np.int64, len(counts))
            n = np.fromiter(counts.values(), np.float64, len(counts))
            inside = ids < width
            x[ids[inside]] -= cfg.frequency_penalty * n[inside] + cfg.presence_penalty
        return None

    # -- drafts and commits ---------------------------------------------------------------
    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of these chained drafts the request may emit (a token the grammar forbids ends the draft)."""
        return self.grammar.valid_prefix(tokens) if self.grammar is not None else len(tokens)

    def commit(self, tokens: Sequence[int]) -> None:
        """Tokens joined the output: the history every later position reads."""
        if self.plain:
            return
        self.counts.update(int(t) for t in tokens)
        if self.cfg.repetition_penalty != 1.0:
            self.seen.update(int(t) for t in tokens)
        if self.grammar is not None:
            self.grammar.commit(tokens)
        if self.bans is not None:
            self.bans.commit(tokens)
            if not self.bans.active:  # min_output_len reached and nothing else banned: back to the plain paths
                self.bans = None
                self.plain = self._plain()

    def _plain(self) -> bool:
        """Nothing to apply: the raw logits are the processed ones (the engine's fast paths)."""
        return not (self.penalized or len(self.bias_ids) or self.grammar is not None or self.bans is not None)

    def failed(self, output: Sequence[int]) -> str | None:
        """Why the output cannot go on after exactly ``output`` (its grammar's llguidance gave up there), or None."""
        return self.grammar.failed(output) if self.grammar is not None else None

    @property
    def done(self) -> bool:
        """The request's grammar is complete: it must end here."""
        return self.grammar is not None and self.grammar.done

    # -- picking a token --------------------------------------------------------------------
    def pick(self, row: np.ndarray, appended: Sequence[int], rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
        """The token this request's settings pick at a draft's position, with the request's generator (the target's
        draws are keyed by position: runtime/sampling.py's TargetDraws), and the distribution it was drawn from ([vocab],
        None when greedy)."""
        return self.choose(self.logits(row, appended), rng)

    def choose(self, x: np.ndarray, rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
        """``pick`` on logits this chain has processed already."""
        if self.cfg.greedy:
            return int(np.argmax(x)), None
        q = processed_probs(x[None], self.cfg)[0]
        return sample(q, rng), q


class Rows:
    """The target's rows of one request in one verification call, processed lazily.

    logits: [k + 1, vocab], row j the position after the committed output and drafts[:j] (a chain). A row is
    processed only when acceptance reaches it: past the first rejection none is needed.
    """

    def __init__(self, logits: np.ndarray, processor: LogitsProcessor | None = None, drafts: Sequence[int] = ()):
        self.raw = logits
        self.processor = processor
        self._drafts = drafts  # as ints when a row is processed (plain rows never read them)
        self._done: dict[int, np.ndarray] = {}

    @property
    def drafts(self) -> list[int]:
        if not isinstance(self._drafts, list):
            self._drafts = [int(t) for t in self._drafts]
        return self._drafts

    @property
    def plain(self) -> bool:
        return self.processor is None or self.processor.plain

    def __len__(self) -> int:
        return len(self.raw)

    def logits(self, j: int, appended: Sequence[int] | None = None) -> np.ndarray:
        """Row j processed with its history: drafts[:j] for a chain, or ``appended`` (a tree node's path)."""
        if self.plain:
            return self.raw[j]
        if appended is not None:
            return self.processor.logits(self.raw[j], appended)  # type: ignore[union-attr]
        if j not in self._done:
            self._done[j] = self.processor.logits(self.raw[j], self.drafts[:j])  # type: ignore[union-attr]
        return self._done[j]

    def probs(self, j: int, cfg: SamplingConfig, appended: Sequence[int] | None = None) -> np.ndarray:
        """Row j's processed distribution (its history as logits() takes it)."""
        return processed_probs(self.logits(j, appended)[None], cfg)[0]


def as_rows(target: Rows | np.ndarray, drafts: Sequence[int] = ()) -> Rows:
    return target if isinstance(target, Rows) else Rows(np.asarray(target), None, drafts)


FLOOR = -9999.0  # OpenAI's log-probability for a token that cannot occur (JSON has no -inf)


class TokenLogprob(NamedTuple):
    """One token's log-probability (after the request's logits processing) and its most likely alternatives: what a
    request with logprobs on records per token (Request.logprobs, RequestOutput.new_logprobs), and a server returns."""

    logprob: float
    top: list[tuple[int, float]]  # (id, log-probability), most likely first: the request's ``logprobs`` of them


class RankedLogprob(NamedTuple):
    """A TokenLogprob with the token's rank: 1 + the tokens more likely than it (vLLM's prompt_logprobs report it)."""

    logprob: float
    top: list[tuple[int, float]]
    rank: int


def logprobs(x: np.ndarray, token: int, top: int = 0, rank: bool = False) -> TokenLogprob | RankedLogprob:
    """x: [vocab] processed logits -> (the token's log-probability, the ``top`` most likely (id, log-probability)).

    Tokens the processing forbids (-inf: a grammar's mask) are never listed among the alternatives."""
    z = np.asarray(x, np.float64)
    finite = np.isfinite(z)
    m = z[finite].max() if finite.any() else 0.0
    lse = m + np.log(np.exp(z[finite] - m).sum()) if finite.any() else 0.0
    lp = z - lse
    best: list[tuple[int, float]] = []
    if top > 0:
        k = min(top, int(finite.sum()))
        if k > 0:
            idx = np.argpartition(-np.where(finite, lp, -np.inf), k - 1)[:k]
            idx = idx[np.lexsort((idx, -lp[idx]))]
            best = [(int(i), float(lp[i])) for i in idx]
    own = float(lp[token])
    if rank:
        return RankedLogprob(own if np.isfinite(own) else FLOOR, best, 1 + int(np.count_nonzero(lp > lp[token])))
    return TokenLogprob(own if np.isfinite(own) else FLOOR, best)
