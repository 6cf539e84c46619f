"""Deciding how many drafts survive, knowing nothing of where they came from.

Both rules return ``(num_accepted, next_token)``: the first ``num_accepted``
drafts are kept and ``next_token`` (the target's correction, or the bonus
token when every draft survived) is appended after them.

The target's rows come raw ([k + 1, vocab]) or as runtime/logits.py's
``Rows``: each row then processed with its own history (the committed output
and the drafts before it: penalties, logit bias, the grammar mask), and only
when the rule reaches it.
"""

from __future__ import annotations

import numpy as np

from .logits import Rows, as_rows
from .sampling import ACCEPT_TEST, RESIDUAL, RowDraws, SamplingConfig, draw


def accept_token_compare(drafts: np.ndarray, target_logits: np.ndarray | Rows, cfg: SamplingConfig, draws: RowDraws) -> tuple[int, int]:
    """Accept while the draft equals the token the target picks at that position.

    drafts: [k]; target_logits: [k + 1, vocab]. With sampling, the target's
    token is drawn from its own processed distribution at each position, with
    that position's uniform (``draws``, keyed by output position), so the
    output is target-only sampling's with the same seed, token for token,
    whatever the drafts were (for a deterministic draft this is the rule
    "accept x with probability p(x), else sample from p without x").
    """
    k = len(drafts)
    rows = as_rows(target_logits, drafts)
    if cfg.greedy:
        if rows.plain:
            listed = drafts.tolist() if isinstance(drafts, np.ndarray) else list(drafts)
            return accept_greedy_plain(listed, rows.raw[: k + 1].argmax(axis=-1).tolist())
        for j in range(k + 1):
            pick = int(np.argmax(rows.logits(j)))
            if j == k or pick != drafts[j]:
                return j, pick
    # each row's distribution is computed only when the loop reaches it: past the first rejection
    # none is needed, and one costs milliseconds at a 100k+ vocabulary with top-p
    for j in range(k):
        t = draws.draw(rows.probs(j, cfg), j)
        if t != drafts[j]:
            return j, t
    return k, draws.draw(rows.probs(k, cfg), k)


def accept_greedy_plain(drafts: list[int], picks: list[int]) -> tuple[int, int]:
    """accept_token_compare for a greedy request whose rows need no processing (no penalties, bias or grammar), on the
    rows' argmaxes compared as Python ints. picks: the argmaxes of the target's raw rows [k + 1, vocab], at least up to
    the first that differs from its draft (all k + 1 when every draft matches)."""
    for n, (pick, draft) in enumerate(zip(picks, drafts, strict=False)):  # k + 1 picks, k drafts
        if pick != draft:
            return n, pick
    return len(drafts), picks[len(drafts)]


def accept_rejection_sampling(
    drafts: np.ndarray, draft_probs: np.ndarray, target_logits: np.ndarray | Rows, cfg: SamplingConfig, draws: RowDraws
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    drafts: [k] sampled from draft_probs [k, vocab] (q, already processed with
    ``cfg`` and the position's history); target_logits: [k + 1, vocab] -> p with the same processing.
    Accept x with probability min(1, p(x)/q(x)); at the first rejection draw
    from normalize(max(0, p - q)); if all survive, draw the bonus from p[k].
    The test and the residual's draw take the position's own uniforms; the
    bonus takes target-only's, as token compare does.
    """
    k = len(drafts)
    rows = as_rows(target_logits, drafts)
    if cfg.greedy:
        return accept_token_compare(drafts, rows, cfg, draws)
    for j in range(k):
        x = int(drafts[j])
        p = rows.probs(j, cfg)
        px, qx = p[x], draft_probs[j, x]
        if qx > 0 and draws.uniform(j, ACCEPT_TEST) < min(1.0, px / qx):
            continue
        residual = np.maximum(p - draft_probs[j], 0.0)
        total = residual.sum()
        return j, draw(residual / total if total > 0 else p, draws.uniform(j, RESIDUAL))
    return k, draws.draw(rows.probs(k, cfg), k)
