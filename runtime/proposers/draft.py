"""The ``draft`` method (TensorRT-LLM's Draft-Target-Model): a smaller model's engine drafts for the target.

Its config names the draft engine and TensorRT-LLM's draft-target string
(draft_len, device lists, use_logits). Opening it pairs the two engines first
(runtime/pairing.py: shared token ids, or drafting through text when the
tokenizers differ), places the draft on its device ids where it fits beside
the target, and returns a ``DraftModelProposer`` (draft_model.py), wrapped in
a ``CrossTokenizerProposer`` (cross_tokenizer.py) for another tokenizer.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...formats.config_strings import DTM_FORM, DraftTargetConfig, parse_draft_target_config
from ...formats.engine_format import EngineDir, check_decodes_alone
from ...formats.errors import RequestError
from ..pairing import PairWarning, pair
from .base import Proposer
from .draft_model import DraftModelProposer
from .method import Flag, Method, OpenContext


@dataclass(frozen=True)
class DraftModelConfig:
    """Draft-target decoding: the draft engine, and how it drafts."""

    engine_dir: str | Path | EngineDir  # the draft model's engine
    # draft_len, draft and target device ids, use_logits (rejection sampling on the draft's q); None:
    # DraftTargetConfig.default_for(the target's max_draft_len)
    draft_target: DraftTargetConfig | None = None
    confidence_threshold: float = 0.0  # a row stops drafting after a token the draft gave less than this (0: never)

    def resolved(self, target_max_draft_len: int) -> DraftTargetConfig:
        return self.draft_target or DraftTargetConfig.default_for(target_max_draft_len)


def open_draft(config: DraftModelConfig, context: OpenContext) -> Proposer:
    """Pair the draft with the target (refusing what cannot work before anything opens), open it on its devices, draft."""
    target, draft = context.target, context.load(config.engine_dir)
    check_decodes_alone(draft, "draft")
    dtm = config.resolved(target.config.build.max_draft_len)
    pairing = pair(target, draft, context.allow_vocab_mismatch)
    if pairing.mode == "cross_tokenizer" and dtm.use_logits:  # said, not dropped without a word
        warnings.warn("use_logits=True is not used with a draft of another tokenizer: its drafts are its argmax tokens, verified "
                      "token by token (docs/suffix-decoding.md#a-draft-with-another-tokenizer).", PairWarning, stacklevel=2)
    executor = context.open_own(draft, dtm.draft_devices)
    proposer = DraftModelProposer(executor, dtm.use_logits, config.confidence_threshold, draft_len=dtm.draft_len, pairing=pairing)
    return cross_tokenizer(target, draft, proposer) if pairing.mode == "cross_tokenizer" else proposer


def cross_tokenizer(target: EngineDir, draft: EngineDir, inner: DraftModelProposer) -> Proposer:
    """The draft model proposer wrapped to draft through text (both engines ship a tokenizer.json: pair() checked)."""
    from ...formats.tokenizer import Tokenizer
    from ..token_bytes import TokenBytes
    from .cross_tokenizer import CrossTokenizerProposer

    t_tok, d_tok = Tokenizer(target.path), Tokenizer(draft.path)
    return CrossTokenizerProposer(inner, TokenBytes(t_tok), TokenBytes(d_tok), t_tok.bos_token_id, d_tok.bos_token_id)


def draft_from_flags(values: Mapping[str, Any]) -> DraftModelConfig | None:
    engine_dir, text = values.get("draft_engine_dir"), values.get("draft_target_model_config")
    dtm = parse_draft_target_config(text) if text else None  # a malformed string is said first
    if dtm and not engine_dir:
        raise RequestError("--draft_target_model_config needs a draft engine: pass --draft_engine_dir.")
    return DraftModelConfig(engine_dir, dtm, values.get("draft_confidence_threshold", 0.0)) if engine_dir else None


METHOD = Method(
    name="draft",
    config=DraftModelConfig,
    open=open_draft,
    proposer=DraftModelProposer,
    flag="--draft_engine_dir",
    flags=(
        Flag("draft_engine_dir", "Draft engine directory: enables draft-target speculative decoding.", path=True),
        Flag("draft_target_model_config", f'Draft-target settings, TensorRT-LLM style: "{DTM_FORM}", e.g. "[4,[0],[0],False]". '
             "use_logits=True: rejection sampling on logits; False: token compare."),
        Flag("draft_confidence_threshold", "Draft-target: a row stops drafting after a token the draft gave less than this probability "
             "(like Hugging Face's assistant_confidence_threshold); 0 = always draft_len tokens, as TensorRT-LLM does. Output is unchanged "
             "either way.", float, 0.0),
    ),
    from_flags=draft_from_flags,
    # TensorRT-LLM's string names the target's devices too; without one the target runs on device 0
    target_devices=lambda config: (config.draft_target or DraftTargetConfig.default_for(1)).target_devices,
)
