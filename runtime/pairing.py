"""Draft and target checked against each other, once, wherever a loop is built.

``pair`` chooses how a draft model drafts for a target, and says so:

* ``shared``: the two tokenizers are the same (or one side has none and the
  vocabularies agree in size): draft ids are target ids.
* ``cross_tokenizer``: both sides ship a tokenizer and they differ: drafts go
  through text (runtime/proposers/cross_tokenizer.py). ``allow_mismatch``
  keeps shared ids instead, for users who know their ids agree.
* refused: what cannot work: vocabularies that differ beyond padding where
  one side has no tokenizer.json to draft through text.

A draft whose ids mean something else than the target's would not fail: it
would run at 0% acceptance. So in shared mode ``check_pair`` refuses a pair
unless its token ids provably mean the same thing:

* the tokenizers (when both engines ship one) agree on every token's id and
  on the special ids (bos/eos/pad/unk);
* the vocabulary sizes differ only by padding: the smaller one still holds
  every id the tokenizer can produce; where neither engine holds a tokenizer
  to show it, sizes that differ are said (a PairWarning naming both) before
  the first round;
* the draft's limits are reported when they would cap speculation.

``allow_mismatch=True`` turns a refusal into a warning, for users who know
their ids agree.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..formats.engine_format import EngineDir
from ..formats.errors import EngineError

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class PairWarning(UserWarning):
    """A draft/target pair that works, but not as well as it could."""


@lru_cache(maxsize=16)
def _tokenizer_identity(path: Path, digest: str) -> tuple[dict[str, int], dict[str, int | None]]:
    """(vocabulary with added tokens, special ids) of a tokenizer.json (cached by its sha256)."""
    from ..formats.tokenizer import Tokenizer

    tok = Tokenizer(path.parent)
    return tok.vocab(), {k: tok._special_id(k) for k in SPECIAL_KEYS}


def _identity(engine: EngineDir) -> tuple[dict[str, int], dict[str, int | None]] | None:
    path = engine.tokenizer_path
    if path is None:
        return None
    return _tokenizer_identity(path, engine.config.files.get(path.name, ""))


def _refuse(message: str, allow_mismatch: bool) -> None:
    if allow_mismatch:
        warnings.warn(message + " Going on because the mismatch was allowed (allow_mismatch / --allow_vocab_mismatch).", PairWarning, stacklevel=3)
        return
    raise EngineError(message + " Use a draft that shares the target's tokenizer, or pass --allow_vocab_mismatch if you know the ids agree.")


def _refuse_unreadable(target: EngineDir, draft: EngineDir, allow_mismatch: bool) -> None:
    """Refuse a draft whose vocabulary stops short of ids the target's tokenizer writes, when its ids would be taken as
    the target's: no mode reads them (allow_mismatch included)."""
    tv, dv = target.config.model.vocab_size, draft.config.model.vocab_size
    t_id, d_id = _identity(target), _identity(draft)
    where = f"the draft engine {draft.path} and the target engine {target.path}"
    used = max(t_id[0].values(), default=-1) + 1 if t_id is not None else None  # ids the target's tokenizer writes
    if used is not None and used > dv:  # not even with allow_mismatch: the draft cannot read tokens the target writes, and keeping
        # the target to the draft's ids (the shared limit) would change the target's output
        if allow_mismatch and d_id is not None and d_id != t_id:
            fix = "Leave out --allow_vocab_mismatch: the draft then drafts through text (cross-tokenizer mode)."
        elif d_id is None:
            fix = "Rebuild the draft from a checkpoint with its tokenizer files to draft through text."
        else:  # the same tokenizer over a smaller embedding: not a pair any mode can use
            fix = "The draft's vocabulary is smaller than its own tokenizer's: rebuild it from a checkpoint whose vocabulary covers it."
        raise EngineError(f"{where} have vocabularies of {dv} and {tv} ids, but the target's tokenizer uses ids up to {used - 1}: the "
                          f"draft cannot read the target's tokens past id {dv - 1}, so its ids cannot be taken as the target's. {fix}")


def check_pair(target: EngineDir, draft: EngineDir, allow_mismatch: bool = False) -> int | None:
    """Refuse a draft whose token ids mean something else; return the shared vocabulary
    limit (None when both vocabularies have the same size)."""
    tv, dv = target.config.model.vocab_size, draft.config.model.vocab_size
    t_id, d_id = _identity(target), _identity(draft)
    where = f"the draft engine {draft.path} and the target engine {target.path}"
    used = max(t_id[0].values(), default=-1) + 1 if t_id is not None else None  # ids the target's tokenizer writes
    _refuse_unreadable(target, draft, allow_mismatch)
    if t_id is not None and d_id is not None:
        (t_vocab, t_special), (d_vocab, d_special) = t_id, d_id
        if t_vocab != d_vocab:
            differ = sorted(set(t_vocab.items()) ^ set(d_vocab.items()))[:3]
            _refuse(
                f"{where} have different tokenizers ({len(d_vocab)} vs {len(t_vocab)} tokens; e.g. {differ}): "
                "speculative decoding needs a draft whose token ids mean the same as the target's.",
                allow_mismatch,
            )
        elif t_special != d_special:
            diff = {k: (d_special[k], t_special[k]) for k in SPECIAL_KEYS if d_special[k] != t_special[k]}
            _refuse(f"{where} have the same vocabulary but different special token ids (draft, target): {diff}.", allow_mismatch)
    if tv != dv and t_id is None and d_id is None and not allow_mismatch:
        warnings.warn(
            f"{where} have vocabularies of {dv} and {tv} ids, and neither holds a tokenizer.json to show that their ids mean the same: "
            "if they do not, the target rejects every draft (the output stays the target's, at no gain). Rebuild them from checkpoints "
            "with their tokenizer files, or pass --allow_vocab_mismatch if you know the ids agree.",
            PairWarning,
            stacklevel=2,
        )
    if tv != dv:
        if used is not None and used > min(tv, dv):
            _refuse(
                f"{where} have vocabularies of {dv} and {tv} ids, but the tokenizer uses ids up to {used - 1}: "
                "the sizes differ by more than padding.",
                allow_mismatch,
            )
    tb, db = target.config.build, draft.config.build
    short = [f"{name} {getattr(db, name)} < {getattr(tb, name)}" for name in ("max_seq_len", "max_input_len",
                                                                              "max_batch_size") if getattr(db, name) < getattr(tb, name)]
    if short:
        warnings.warn(
            f"the draft engine {draft.path} has smaller limits than the target ({', '.join(short)}): requests are capped "
            "at the smaller limits, and past the draft's max_seq_len rounds run without drafts. Rebuild the draft with the target's limits.",
            PairWarning,
            stacklevel=2,
        )
    return min(tv, dv) if tv != dv else None


@dataclass(frozen=True)
class Pairing:
    mode: str  # shared | cross_tokenizer
    note: str  # one line: the mode and why


def pair(target: EngineDir, draft: EngineDir, allow_mismatch: bool = False) -> Pairing:
    """How ``draft`` drafts for ``target`` (see the module's docstring); refuses, before anything is opened, ids
    that one side's tokenizer uses beyond the other side's vocabulary when that side has no tokenizer to go through,
    and a draft that cannot read the target's ids. Shared mode's other checks (``check_pair``) run where the engine is built."""
    t_id, d_id = _identity(target), _identity(draft)
    if t_id is not None and d_id is not None and t_id != d_id and not allow_mismatch:
        return Pairing("cross_tokenizer", f"the draft's tokenizer ({len(d_id[0])} tokens) is not the target's ({len(t_id[0])} tokens): "
                                          "drafting through text (cross-tokenizer mode; --allow_vocab_mismatch keeps the ids as they are).")
    tv, dv = target.config.model.vocab_size, draft.config.model.vocab_size
    known = t_id if t_id is not None else d_id
    if (t_id is None) != (d_id is None) and tv != dv and not allow_mismatch and known is not None:
        used = max(known[0].values(), default=-1) + 1
        if used > min(tv, dv):
            missing = target if t_id is None else draft
            raise EngineError(f"the draft engine {draft.path} ({dv} ids) and the target engine {target.path} ({tv} ids) have different "
                              f"vocabularies and {missing.path} has no tokenizer.json to draft through text; rebuild it from a checkpoint "
                              "with its tokenizer files, or pass --allow_vocab_mismatch if you know the ids agree.")
    _refuse_unreadable(target, draft, allow_mismatch)
    return Pairing("shared", "the draft shares the target's token ids." if t_id is not None and d_id is not None else
                   "the draft's ids are taken as the target's (an engine without tokenizer.json: checked by size only).")
