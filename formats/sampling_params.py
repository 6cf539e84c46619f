"""A request's sampling settings, checked: what the runtime samples with (runtime/sampling.py applies them), what
the server parses into, and what specdec-train prepare-data generates its data with.

Greedy: a temperature below GREEDY_TEMPERATURE (1e-5, vLLM's _SAMPLING_EPS) is greedy decoding, exactly:
argmax, no random draw. The OpenAI API documents 0 as the deterministic end. Below the line sampling means
nothing more (at 1e-5 two logits 1e-3 apart already differ by exp(100) in probability), and a subnormal
temperature overflows the division (before this rule it drew a garbage token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import RequestError

GREEDY_TEMPERATURE = 1e-5  # temperatures below this are greedy (module docstring)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 (anything below GREEDY_TEMPERATURE) = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 (or 0, TensorRT-LLM's spelling) = off
    random_seed: int = 0
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one; 0 = off
    # read the request's history: applied by runtime/logits.py before the settings above
    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # tokens in the prompt or output: positive logits divided, negative multiplied; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    # token bans, applied with the settings above (runtime/logits.py); all exact under speculation: each position reads its own history
    allowed_token_ids: tuple[int, ...] = ()  # only these may be sampled (vLLM's allowed_token_ids); empty = every token
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # token sequences never produced: the last token is banned after the others
    no_repeat_ngram_size: int = 0  # no n-gram of this size occurs twice in prompt + output (transformers', TensorRT-LLM's); 0 = off

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature={self.temperature} must be a finite number >= 0 (below {GREEDY_TEMPERATURE:g} means greedy).")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise RequestError(f"top_k={self.top_k} must be an integer >= 0 (0 means off).")
        if not (isinstance(self.top_p, (int, float)) and 0 <= self.top_p <= 1):  # NaN fails the comparison too
            raise RequestError(f"top_p={self.top_p} must be in [0, 1] (0 and 1 mean off).")
        if not 0 <= self.min_p <= 1:
            raise RequestError(f"min_p={self.min_p} must be in [0, 1] (0 means off).")
        if not (self.repetition_penalty > 0 and np.isfinite(self.repetition_penalty)):
            raise RequestError(f"repetition_penalty={self.repetition_penalty} must be a finite number > 0 (1 means off).")
        values = [self.presence_penalty, self.frequency_penalty, *(b for _, b in self.logit_bias)]
        if not np.isfinite(values).all():
            raise RequestError("presence_penalty, frequency_penalty and logit_bias values must be finite numbers.")
        if not _is_int(self.random_seed) or self.random_seed < 0:
            raise RequestError(f"random_seed={self.random_seed} must be an integer >= 0.")
        if not isinstance(self.allowed_token_ids, (tuple, list)) or not all(_is_id(t) for t in self.allowed_token_ids):
            raise RequestError(f"allowed_token_ids={self.allowed_token_ids!r} must be a tuple of token ids (integers >= 0); "
                               "empty allows every token.")
        if not isinstance(self.bad_words_ids, (tuple, list)) or not all(
                isinstance(w, (tuple, list)) and w and all(_is_id(t) for t in w) for w in self.bad_words_ids):
            raise RequestError(f"bad_words_ids={self.bad_words_ids!r} must be a tuple of non-empty token-id sequences, e.g. ((53,), (80, 12)).")
        if not _is_int(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise RequestError(f"no_repeat_ngram_size={self.no_repeat_ngram_size} must be an integer >= 0 (0 means off).")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_id(value: object) -> bool:
    return _is_int(value) and value >= 0  # type: ignore[operator]
