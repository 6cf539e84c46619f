"""Which matrix decodes: the LM head as transformers reads a checkpoint's tie_word_embeddings and lm_head.weight.

    tie_word_embeddings  lm_head.weight stored        transformers 5.x (5.24, tested)                 specdec-build
    true                 no                           the embedding                                   the same
    true                 yes, the embedding's bits    the embedding (the same matrix)                 the same (one copy)
    true                 yes, other values            lm_head.weight, with a warning: "both are       the same, with a warning: line
                                                      present with different values, so we will
                                                      NOT tie them"
    true or false        yes, of another shape        refuses (size mismatch)                         refuses in one line
    false                no                           a new, random head (a warning)                  refuses in one line
    false                yes                          lm_head.weight                                  the same

The result is recorded as the engine's model.tie_word_embeddings: true only where the embedding decodes. A head
that the checkpoint does not hold, and a random one, are never decoded from (tests/builder/test_lm_head.py
compares each case with the installed transformers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..formats.engine_format import ModelConfig
from ..formats.errors import CheckpointError
from ..formats.safetensors_io import bf16_bits_to_float32

HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"
ROWS_PER_CHUNK = 4096  # rows compared at a time: a 128k x 4096 head is never held twice


def resolve_lm_head(model: ModelConfig, ckpt, say: Callable[[str], None]) -> ModelConfig:
    """``model`` with tie_word_embeddings saying what decodes: the embedding (true) or the stored lm_head.weight (false)."""
    if HEAD not in ckpt:
        if model.tie_word_embeddings:
            return model
        raise CheckpointError(
            f"{ckpt.path}: config.json says tie_word_embeddings is false, and the checkpoint holds no {HEAD}: there is no LM head to "
            f"decode with (transformers would initialise a random one). If the head is the embedding, set \"tie_word_embeddings\": true "
            "in config.json; otherwise re-export the checkpoint with its lm_head.weight.")
    if not model.tie_word_embeddings:
        return model  # its shape is checked with the other tensors (validation.py), as transformers refuses a mismatch
    if ckpt.shape(HEAD) != ckpt.shape(EMBED) or _same(ckpt, HEAD, EMBED):
        # another shape: read as the head, whose shape check refuses it (transformers: size mismatch); the same bits: tied
        return replace(model, tie_word_embeddings=ckpt.shape(HEAD) == ckpt.shape(EMBED))
    say(f"warning: config.json says tie_word_embeddings is true, but the checkpoint's {HEAD} differs from its {EMBED}: decoding with "
        f"{HEAD}, as transformers does (it does not tie them); set \"tie_word_embeddings\": false to say so.")
    return replace(model, tie_word_embeddings=False)


def _same(ckpt, a: str, b: str) -> bool:
    """Whether two stored tensors of one shape hold the same values (their stored bits when stored alike), chunk by chunk."""
    codes = ckpt.dtype_name(a), ckpt.dtype_name(b)
    if codes[0] != codes[1]:
        for name, code in ((a, codes[0]), (b, codes[1])):
            if code.startswith("F8"):
                ckpt.float32(name)  # refuses in one line: float8 is read through the quantization path
    x, y = ckpt.stored(a), ckpt.stored(b)  # mapped, not copied (safetensors)
    for start in range(0, x.shape[0], ROWS_PER_CHUNK):
        rows = slice(start, start + ROWS_PER_CHUNK)
        if codes[0] == codes[1]:  # stored alike: the same values are the same bits
            same = np.array_equal(x[rows], y[rows])
        else:  # each chunk widened to float32 on its own
            same = np.array_equal(_float32(x[rows], codes[0]), _float32(y[rows], codes[1]))
        if not same:
            return False
    return True


def _float32(chunk: np.ndarray, code: str) -> np.ndarray:
    """A chunk of stored values (bfloat16 as its bits) as float32; a reader that maps nothing gives float32 already."""
    return bf16_bits_to_float32(chunk) if code == "BF16" and chunk.dtype == np.uint16 else chunk.astype(np.float32)
