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
    """One draw from a probability vector [vocab]."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))


def next_token(logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator) -> int:
    """logits: [vocab] -> the token the sampling settings pick."""
    if cfg.greedy:
        return int(np.argmax(logits))
    return sample(processed_probs(logits[None], cfg)[0], rng)
