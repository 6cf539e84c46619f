"""Assemble an engine from engine directories, checking they fit together.

Every mismatch a user can hit is answered here or in the Engine itself,
before any decoding, with the numbers and the fix. The draft length, the
pairing checks and the vocabulary limit are decided once, in the Engine, so
no path (CLI, bench, eval, a user's own loop) can skip them.
"""

from __future__ import annotations

from pathlib import Path

from .backends import check_placement, open_executor
from .backends.base import Executor, Placement
from ..formats.config_strings import DraftTargetConfig, NGramConfig
from .devices import placement
from .engine import Engine, SpeculationConfig
from ..formats.engine_format import EngineDir, load_engine_dir
from ..formats.errors import RequestError
from .orchestrator import Orchestrator
from .pairing import Pairing, pair
from .proposers.base import Proposer
from .proposers.draft_model import DraftModelProposer
from .proposers.ngram import NGramProposer
from .proposers.suffix import SuffixConfig, SuffixProposer
from .proposers.own import OwnDrafter, own_drafter

__all__ = ["load_engine", "load_orchestrator", "method_draft_lens", "open_executor", "Pairing", "Placement"]


def _engine(d: str | Path | EngineDir) -> EngineDir:
    return d if isinstance(d, EngineDir) else load_engine_dir(d)


def load_engine(
    target_dir: str | Path | EngineDir,
    draft_dir: str | Path | EngineDir | None = None,
    draft_target: DraftTargetConfig | None = None,
    ngram: NGramConfig | None = None,
    *,
    method: str | None = None,
    draft_len: int | str | None = None,
    ngram_keep_all: bool = True,
    ngram_use_oldest: bool = False,
    ngram_min_match: int = 1,
    num_threads: int | None = None,
    target_devices: list[int] | None = None,
    device: str = "auto",
    draft_device: str | None = None,
    draft_num_threads: int = 1,
    draft_confidence_threshold: float = 0.0,
    allow_vocab_mismatch: bool = False,
    target_executor: Executor | None = None,
    medusa_choices: str | list | None = None,
    eagle_choices: str | list | None = None,
    suffix: SuffixConfig | None = None,
) -> Engine:
    """An engine with every proposer asked for loaded (a draft model, n-gram, suffix decoding), and the target's own
    drafter when it has one (a medusa target's heads, an eagle target's EAGLE module in its eagle/ folder).

    A draft whose tokenizer is not the target's drafts through text (cross-tokenizer mode); the engine's
    ``pairing`` says which mode was chosen and why (runtime/pairing.py).
    ``suffix``: suffix decoding's settings (its global cache, seeded from ``suffix.seed_file``); it drafts
    trees when the target has tree attention (--tree_attention, medusa, eagle), else chains.

    ``method``: the default for requests that do not choose (default: draft if a draft engine is given,
    else ngram if ``ngram`` is, else suffix if ``suffix`` is, else medusa / eagle for such a target, else none).
    ``draft_len``: the default drafts per round, an int or "auto" (default: the draft-target or
    n-gram config's; Medusa and EAGLE: the proposer's ``default_draft_len``, its tree's nodes, or a chain
    of every head (Medusa) or of min(4, max_draft_len) (EAGLE)).
    ``medusa_choices`` / ``eagle_choices``: a draft tree in TensorRT-LLM's format (runtime/tree.py);
    None: chains.
    ``device``: cpu | cuda | auto (docs/cli.md: device lists index devices of that kind).

    ``target_executor``: an executor already open on this target engine (say, an
    earlier engine's ``.target``), reused instead of opening a second session.

    On CPU the target gets ``num_threads`` (default: all cores) and the draft one
    thread: a small draft step is per-node overhead that threads do not shorten, and
    two sessions spinning worker threads on the same cores cut draft-target throughput
    by 3x (measured on 2 cores).
    """
    target = _engine(target_dir)  # an already loaded EngineDir is not hashed again
    if draft_target is not None and draft_dir is None:
        raise RequestError("--draft_target_model_config needs a draft engine: pass --draft_engine_dir.")
    draft = _engine(draft_dir) if draft_dir is not None else None
    dtm = draft_target or (DraftTargetConfig.default_for(target.config.build.max_draft_len) if draft else None)
    target_ids = dtm.target_devices if dtm else ngram.devices if ngram else target_devices or [0]
    where = placement(target_ids, target, "target", device, num_threads)
    proposers: list[Proposer] = []
    pairing = pair(target, draft, allow_vocab_mismatch) if draft is not None else None  # refuses what cannot work, before opening
    if draft is not None and dtm is not None:
        dwhere = placement(dtm.draft_devices, draft, "draft", draft_device or device, draft_num_threads)
        if where.kind == dwhere.kind:  # two engines that may share a device: each backend refuses what cannot fit, before any opens
            check_placement([(target, where), (draft, dwhere)])
        proposer = DraftModelProposer(open_executor(draft, dwhere), dtm.use_logits, draft_confidence_threshold)
        proposers.append(_cross_tokenizer(target, draft, proposer) if pairing is not None and pairing.mode == "cross_tokenizer" else proposer)
    if ngram is not None:
        proposers.append(NGramProposer(ngram.max_draft_len, ngram.max_matching_ngram_size, ngram_keep_all, ngram_use_oldest, ngram_min_match))
    if suffix is not None:
        proposers.append(_suffix(target, suffix))
    mode = target.config.build.speculative_decoding_mode
    choices = {"medusa": medusa_choices, "eagle": eagle_choices}
    own_cls = _own_drafter_class(target, choices)
    # a medusa / eagle target is an onnxruntime engine (the builder refuses others): both of its executors, CPU and CUDA,
    # bind tree_mask and the extra inputs and outputs their configs declare (engine_format.extra_io)
    target_ex = target_executor or open_executor(target, where)
    own = None
    if own_cls is not None:
        beside = Placement(where.kind, where.index, draft_num_threads)
        own = own_cls.for_target(target_ex, choices[mode], lambda engine: open_executor(engine, beside))
        proposers.append(own)
    default = method or ("draft" if draft is not None else "ngram" if ngram is not None else "suffix" if suffix is not None else
                         own.name if own is not None else "none")
    if draft_len is None:
        draft_len = (dtm.draft_len if default == "draft" and dtm else ngram.max_draft_len if default == "ngram" and ngram else
                     suffix.max_draft_len if default == "suffix" and suffix else own.default_draft_len if own is not None and default == own.name else 0)
    spec = SpeculationConfig(default, draft_len if default != "none" else 0)
    engine = Engine(target_ex, proposers, spec, allow_vocab_mismatch)
    engine.pairing = pairing
    return engine


def _cross_tokenizer(target: EngineDir, draft: EngineDir, inner: DraftModelProposer) -> Proposer:
    """The draft model proposer wrapped to draft through text (both engines ship a tokenizer.json: pair() checked)."""
    from .proposers.cross_tokenizer import CrossTokenizerProposer
    from .token_bytes import TokenBytes
    from ..formats.tokenizer import Tokenizer

    t_tok, d_tok = Tokenizer(target.path), Tokenizer(draft.path)
    return CrossTokenizerProposer(inner, TokenBytes(t_tok), TokenBytes(d_tok), t_tok.bos_token_id, d_tok.bos_token_id)


def _suffix(target: EngineDir, config: SuffixConfig) -> SuffixProposer:
    """Suffix decoding on this target: trees where it verifies them; the global cache seeded from the config's file."""
    proposer = SuffixProposer(config, trees=bool(target.config.build.tree_attention))
    if config.seed_file and proposer.cache is not None:
        encode = None
        if target.tokenizer_path is not None:
            from ..formats.tokenizer import Tokenizer

            encode = Tokenizer(target.path).encode
        proposer.cache.load(config.seed_file, encode)
    return proposer


def _own_drafter_class(target: EngineDir, choices: dict[str, str | list | None]) -> type[OwnDrafter] | None:
    """The class of the drafter the target carries (proposers/own.py), or None; a draft tree for another mode is refused.

    choices: mode -> the draft tree given for that mode's drafter (None: not given)."""
    mode = target.config.build.speculative_decoding_mode
    for wanted, given in choices.items():
        if given is not None and mode != wanted:
            raise RequestError(f"{own_drafter(wanted).choices_flag} needs a target engine built with --speculative_decoding_mode {wanted}; "
                               f"{target.path} was built with {mode}.")
    return own_drafter(mode)


def method_draft_lens(engine: Engine, draft_target: DraftTargetConfig | None = None, ngram: NGramConfig | None = None) -> dict[str, int | str]:
    """Each loaded method's drafts per round for a request that names the method but no length (specdec-serve's
    ``speculative.method``): the default method's is the engine's ``draft_len`` (--draft_len, when given); a draft
    model's is its config's (DraftTargetConfig.default_for without one); n-gram's and suffix decoding's their config's
    max_draft_len, at most the target's; a target's own drafter's its tree's nodes or its default chain.

    ``draft_target`` / ``ngram``: the configs ``load_engine`` was given."""
    max_draft = engine.target.build.max_draft_len
    lens: dict[str, int | str] = {}
    if "draft" in engine.proposers:
        lens["draft"] = (draft_target or DraftTargetConfig.default_for(max_draft)).draft_len
    if ngram is not None:
        lens["ngram"] = min(ngram.max_draft_len, max_draft)
    if "suffix" in engine.proposers:
        lens["suffix"] = min(engine.proposers["suffix"].config.max_draft_len, max_draft)
    for name, proposer in engine.proposers.items():
        if isinstance(proposer, OwnDrafter):
            lens[name] = proposer.default_draft_len
    if engine.speculation.method != "none":
        lens[engine.speculation.method] = engine.speculation.draft_len
    return lens


def load_orchestrator(
    target_dir: str | Path | EngineDir,
    draft_dir: str | Path | EngineDir | None = None,
    draft_target: DraftTargetConfig | None = None,
    ngram: NGramConfig | None = None,
    **kwargs,
) -> Orchestrator:
    """Target-only when neither ``draft_dir`` nor ``ngram`` is given; one drafting method at most.

    Takes ``load_engine``'s keyword arguments.
    """
    if draft_target is not None and ngram is not None:
        raise RequestError("choose one drafting method: a draft model (--draft_target_model_config) or n-gram (--ngram_config), not both.")
    if draft_dir is not None and ngram is not None:
        raise RequestError("choose one drafting method: a draft engine (--draft_engine_dir) or n-gram (--ngram_config), not both.")
    kwargs.pop("sampling", None)  # sampling is per request (GenerationConfig), not per engine
    engine = load_engine(target_dir, draft_dir, draft_target, ngram, **kwargs)
    return Orchestrator.from_engine(engine)
