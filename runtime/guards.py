"""What a round watches for besides tokens: logits that are not numbers, and drafts that never land.

Non-finite logits. A target whose logits hold NaN or Inf (an engine built with --allow_nonfinite, or values
that overflow float32) would still "pick" a token: argmax takes the first NaN, sampling a NaN distribution
picks the last id. So the rows a request's step reads (its prefill row; the root's and the accepted drafts'
rows of a round) are checked, and at the first row that is not finite the request stops with finish_reason
"error" and a message: the tokens of the rows before it are kept, none is picked from it. Rows past the first
rejection are not read. But a draft token whose embedding is NaN puts NaN into its call's keys and values, and
masked attention does not hold it back (a zero weight times NaN is NaN): the rows before it turn NaN too. So
with speculation a request can stop earlier than target-only decoding would, never later, and every token it
emitted is one target-only decoding emits (greedy). Other requests of the batch are other rows: untouched, and the
slot of a request that ended so is zeroed before another request uses it (Executor.clear_slot).

Drafts that never land. A draft whose token ids mean something else to the target (another tokenizer, a
model trained on another vocabulary, when no tokenizer file can prove it) still decodes correctly, the target
corrects every token, but at 0% acceptance, paying for every draft. Each drafting round reaches the first
draft at least; a pair that works even poorly (a first draft accepted a quarter of the time) is rejected
SILENT_DRAFT_ROUNDS = 48 rounds in a row with probability 0.75^48, about 1e-6. So after 48 consecutive
drafting rounds with nothing accepted, the request says so once (``Metrics.silent_drafts``, and the message
in ``RequestOutput.warning`` of that step), and with draft_len="auto" it stops drafting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

METHOD_NAMES = {"draft": "draft-model", "ngram": "n-gram", "suffix": "suffix", "medusa": "Medusa", "eagle": "EAGLE", "peagle": "P-EAGLE"}
SILENT_DRAFT_ROUNDS = 48  # consecutive drafting rounds with no draft accepted: (1 - 0.25)^48 ~ 1e-6 for a weak working pair


def finite(rows: np.ndarray) -> bool:
    """All of rows [..., vocab] finite: one reduction, no boolean copy of the rows. A sum is NaN or Inf when some value
    is; it could also overflow with every value finite (logits near 1e34), which the exact check below then clears."""
    with np.errstate(over="ignore", invalid="ignore"):  # a NaN or Inf is the answer sought, not a warning for the user's stderr
        total = np.add.reduce(rows, axis=None)  # (the ufunc itself: ndarray.sum adds a Python call)
    if not rows.size or math.isfinite(total):
        return True
    return bool(np.isfinite(rows).all())


def first_nonfinite(rows: np.ndarray) -> int | None:
    """The first of rows [n, vocab] holding a NaN or Inf, or None (the common case costs one reduction)."""
    if finite(rows):
        return None
    return int(np.flatnonzero(~np.isfinite(rows).all(axis=-1))[0])


def first_nonfinite_of_argmax(rows: np.ndarray, tops: Sequence[int]) -> int | None:
    """first_nonfinite for rows [n, vocab] whose argmaxes the caller has (``tops[i]`` = rows[i].argmax()): np.argmax
    returns a row's first NaN when it holds one, so a row is finite exactly when its values at its argmax and at its
    argmin are. An argmin instead of a reduction: right after a model call numpy's reduction machinery is cold in the
    CPU's caches, and it cost several times the arg-search that the argmax has just brought in."""
    bottoms = rows.argmin(axis=-1).tolist()
    for i, (top, bottom) in enumerate(zip(tops, bottoms, strict=False)):  # tops may be longer: rows are the ones read
        if not (math.isfinite(rows.item(i, top)) and math.isfinite(rows.item(i, bottom))):
            return i
    return None


def nonfinite_message(position: int) -> str:
    return (f"the target's logits are not finite (NaN or Inf) at output position {position}: the request stops rather than emit a token "
            "picked from them (an engine built with --allow_nonfinite, or a model whose values overflow float32).")


def silent_draft_message(method: str, rounds: int, stopped: bool) -> str:
    why = ("the text rarely repeats what the n-gram pool matches (--ngram_min_match 2 or 3 drafts less, and better)" if method == "ngram" else
           "the text rarely repeats what it or earlier responses held" if method == "suffix" else
           "the draft's token ids may mean something else to the target (another tokenizer or vocabulary), or it was trained for another model")
    then = "; draft_len=auto stopped drafting for it" if stopped else ""
    return f"the target rejected every {METHOD_NAMES.get(method, method)} draft of the last {rounds} drafting rounds: {why}{then}."
