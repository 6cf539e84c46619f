"""Draft and target checked against each other, once, wherever a loop is built.

A draft with another tokenizer does not fail: it runs at 0% acceptance. So
the pair is refused unless its token ids provably mean the same thing:

* the tokenizers (when both engines ship one) agree on every token's id and
  on the special ids (bos/eos/pad/unk);
* the vocabulary sizes differ only by padding: the smaller one still holds
  every id the tokenizer can produce;
* the draft's limits are reported when they would cap speculation.

``allow_mismatch=True`` turns a refusal into a warning, for users who know
their ids agree.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

from .engine_format import EngineDir
from .errors import EngineError

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class PairWarning(UserWarning):
    """A draft/target pair that works, but not as well as it could."""


@lru_cache(maxsize=16)
def _tokenizer_identity(path: Path, digest: str) -> tuple[dict[str, int], dict[str, int | None]]:
    """(vocabulary with added tokens, special ids) of a tokenizer.json (cached by its sha256)."""
    from .tokenizer import Tokenizer

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


def check_pair(target: EngineDir, draft: EngineDir, allow_mismatch: bool = False) -> int | None:
    """Refuse a draft whose token ids mean something else; return the shared vocabulary
    limit (None when both vocabularies have the same size)."""
    tv, dv = target.config.model.vocab_size, draft.config.model.vocab_size
    t_id, d_id = _identity(target), _identity(draft)
    where = f"the draft engine {draft.path} and the target engine {target.path}"
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
    if tv != dv:
        used = max(t_id[0].values(), default=-1) + 1 if t_id is not None else None
        if used is not None and used > min(tv, dv):
            _refuse(
                f"{where} have vocabularies of {dv} and {tv} ids, but the tokenizer uses ids up to {used - 1}: "
                "the sizes differ by more than padding.",
                allow_mismatch,
            )
    tb, db = target.config.build, draft.config.build
    short = [f"{name} {getattr(db, name)} < {getattr(tb, name)}" for name in ("max_seq_len", "max_input_len", "max_batch_size") if getattr(db, name) < getattr(tb, name)]
    if short:
        warnings.warn(
            f"the draft engine {draft.path} has smaller limits than the target ({', '.join(short)}): requests are capped "
            "at the smaller limits, and past the draft's max_seq_len rounds run without drafts. Rebuild the draft with the target's limits.",
            PairWarning,
            stacklevel=2,
        )
    return min(tv, dv) if tv != dv else None
