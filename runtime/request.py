"""A request and its settings: what it asked for, where it is, what it produced.

Every setting that can differ between requests lives in ``GenerationConfig``:
sampling, stops, and speculation (method and draft length). The engine fills
the speculation fields it leaves unset from its own defaults, once, when the
request is added.

Lifecycle: WAITING (queued) -> RUNNING (holds a cache slot; prefilled on
admission, then one verification round per step) -> FINISHED or ABORTED.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..formats.errors import RequestError
from .methods import method_names
from .metrics import Metrics
from .sampling import SamplingConfig, TargetDraws

if TYPE_CHECKING:
    from .logits import LogitsProcessor, TokenLogprob
    from .sampling import RowDraws

METHODS = method_names()  # the methods registered at import (runtime/methods.py: method_names() sees later ones too)
AUTO = "auto"
# What ends a request with finish_reason "error": the target's logits held NaN or Inf (runtime/guards.py), or llguidance
# gave up on the request's grammar on the output's path (runtime/grammar.py). The server reports them apart.
ERROR_CAUSES = ("nonfinite_logits", "grammar")


@dataclass(frozen=True)
class GenerationConfig:
    max_output_len: int = 128
    min_output_len: int = 0  # the end ids are banned, and stop words not matched, before this many new tokens (vLLM's min_tokens)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    end_ids: tuple[int, ...] = ()  # stop after any of these (empty: never)
    stop_words: tuple[tuple[int, ...], ...] = ()  # token sequences that end a request
    # speculation; None = the engine's default
    method: str | None = None  # a registered method (runtime/methods.py: draft | ngram | medusa | eagle | peagle | suffix), or none
    draft_len: int | str | None = None  # 0..max_draft_len, or "auto": chosen each round
    # log-probabilities of the emitted tokens (the target's, after logits processing): None = off,
    # k >= 0 = each token's own plus its k most likely alternatives
    logprobs: int | None = None
    prompt_logprobs: bool = False  # the raw model's log-probability of every prompt token after the first
    prompt_logprobs_top: int | None = None  # with it: alternatives per prompt token, and each token's rank (None: logprobs' count)
    grammar: Any = None  # runtime.grammar.Grammar (or anything with .start() -> a GrammarState): the output's constraint

    def __post_init__(self) -> None:
        if self.max_output_len < 1:
            raise RequestError(f"max_output_len={self.max_output_len} must be >= 1.")
        if isinstance(self.min_output_len, bool) or not isinstance(self.min_output_len, (int, np.integer)) or self.min_output_len < 0:
            raise RequestError(f"min_output_len={self.min_output_len} must be an integer >= 0 (0 means off).")
        if self.min_output_len > self.max_output_len:
            raise RequestError(f"min_output_len={self.min_output_len} is larger than max_output_len={self.max_output_len}.")
        if self.method is not None and self.method not in method_names():
            raise RequestError(f"unknown speculation method {self.method!r}; expected one of {', '.join(method_names())}.")
        if isinstance(self.draft_len, str) and self.draft_len != AUTO:
            raise RequestError(f"draft_len={self.draft_len!r} must be an integer >= 0 or 'auto'.")
        if isinstance(self.draft_len, int) and (isinstance(self.draft_len, bool) or self.draft_len < 0):
            raise RequestError(f"draft_len={self.draft_len} must be an integer >= 0 or 'auto'.")
        if self.prompt_logprobs_top is not None and self.prompt_logprobs_top < 0:
            raise RequestError(f"prompt_logprobs_top={self.prompt_logprobs_top} must be None or an integer >= 0.")
        if self.logprobs is not None and self.logprobs < 0:
            raise RequestError(f"logprobs={self.logprobs} must be None (off) or an integer >= 0 (alternatives per token).")
        # token ids, not text: a string here would be read character by character and match nothing (vLLM's and Hugging Face's
        # stop strings are text; the CLIs and the server match those on the decoded output, cli/stops.py)
        if not isinstance(self.end_ids, (tuple, list)) or not all(_is_id(t) for t in self.end_ids):
            raise RequestError(f"end_ids={self.end_ids!r} must be a tuple of token ids (integers >= 0).")
        if not isinstance(self.stop_words, (tuple, list)) or not all(
                isinstance(w, (tuple, list)) and w and all(_is_id(t) for t in w) for w in self.stop_words):
            raise RequestError(f"stop_words={self.stop_words!r} must be a tuple of token-id sequences, e.g. ((53, 51),): token ids, "
                               "not text (encode a stop string with the tokenizer, or stop on text as specdec-run --stop_words does).")
        allowed = set(self.sampling.allowed_token_ids)
        if allowed and self.grammar is not None:
            raise RequestError("allowed_token_ids beside a grammar (structured outputs): constrain the grammar instead; the two "
                               "together could leave no token.")
        if allowed and self.min_output_len and allowed <= set(self.end_ids):
            raise RequestError(f"every one of allowed_token_ids {sorted(allowed)[:8]} is an end id, which min_output_len="
                               f"{self.min_output_len} holds back: the output could not reach it.")
        if allowed and allowed <= {w[0] for w in self.sampling.bad_words_ids if len(w) == 1}:
            raise RequestError(f"every one of allowed_token_ids {sorted(allowed)[:8]} is a one-token bad word: nothing could be produced.")


def _is_id(t: object) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


# read once: an enum member read off its class costs ~0.3 us (EnumType's lookup), and every step asks each request
_ENDED = (RequestStatus.FINISHED, RequestStatus.ABORTED)


@dataclass
class RequestTimes:
    """perf_counter() stamps of one request's life."""

    arrival: float = field(default_factory=time.perf_counter)
    scheduled: float = 0.0  # admitted: got a slot, prefill starts
    first_token: float = 0.0
    finished: float = 0.0

    @property
    def queue_s(self) -> float:
        return max(self.scheduled - self.arrival, 0.0) if self.scheduled else 0.0

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.arrival if self.first_token else 0.0

    def tpot_s(self, num_output: int) -> float:
        """Time per output token after the first."""
        if num_output < 2 or not self.finished:
            return 0.0
        return (self.finished - self.first_token) / (num_output - 1)


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    config: GenerationConfig
    method: str  # resolved: a loaded method, or none (runtime/methods.py: TARGET_ONLY)
    draft_len: int | str  # resolved: a fixed length or "auto"
    rng: np.random.Generator  # its drafts' samples (its own: its output never depends on its batch)
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str = ""  # end_id | stop_words | grammar | length | max_seq_len | abort | error
    error: str = ""  # why it stopped, with finish_reason "error" (runtime/guards.py, runtime/grammar.py)
    error_cause: str = ""  # with finish_reason "error": one of ERROR_CAUSES
    warning: str = ""  # said once, in the next step's output (runtime/guards.py: drafts that never land)
    slot: int = -1  # the target cache row while RUNNING
    metrics: Metrics = field(default_factory=lambda: Metrics(requests=1))
    times: RequestTimes = field(default_factory=RequestTimes)
    auto_k: int | None = None  # the draft length draft_len=auto chose last round
    auto_nodes: np.ndarray | None = None  # a static tree's nodes draft_len=auto keeps this round (None: what was drafted)
    auto_expected: float = 0.0  # the accepted drafts its verified static tree nodes promised so far (AutoDraftLen.tree_scale)
    refine_calls: int | None = None  # P-EAGLE --peagle_refine auto: the refining calls it makes this round (None: the proposer's own)
    auto_refine: int | None = None  # ... the number the cost model chose last (exploring rounds make more): kept unless another pays
    processor: LogitsProcessor | None = None  # its logits processing chain (runtime/logits.py), made on add_request
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when asked
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (None for the first), when asked
    rejected_rounds: int = 0  # consecutive drafting rounds in which the target accepted no draft
    drafting_stopped: bool = False  # draft_len=auto gave up on drafts that never land (runtime/guards.py)
    proposing: bool = False  # its proposer holds it (it joins after its prefill): leaving, it is removed from there
    draws: TargetDraws | None = None  # the target's uniforms, keyed by output position: (its seed, stream 0) when not given

    def __post_init__(self) -> None:
        if self.draws is None:
            self.draws = TargetDraws(self.config.sampling.random_seed)

    @property
    def target_draws(self) -> RowDraws:
        """The target's uniforms for its next call: row 0 picks the output's next position."""
        return self.draws.at(len(self.output_ids))  # type: ignore[union-attr]  (set by __post_init__)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status in _ENDED


@dataclass
class RequestOutput:
    """What ``generate`` returns per prompt, and ``step`` per request that moved."""

    input_ids: list[int]
    output_ids: list[int]  # every new token so far
    finish_reason: str = ""
    text: str | None = None
    request_id: str = ""
    new_token_ids: list[int] = field(default_factory=list)  # produced by this step
    finished: bool = False
    metrics: Metrics | None = None  # this request's (drafted, accepted, TTFT, ...)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)  # per token of new_token_ids, with logprobs on
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per token of output_ids, with logprobs on
    prompt_logprobs: list[TokenLogprob | None] | None = None  # with prompt_logprobs on: one per prompt token (None for the first)
    error: str = ""  # with finish_reason "error": why the request stopped (non-finite logits, a grammar llguidance gave up on)
    error_cause: str = ""  # with finish_reason "error": one of ERROR_CAUSES
    warning: str = ""  # said in the one step it arose: its drafts were rejected SILENT_DRAFT_ROUNDS rounds in a row
