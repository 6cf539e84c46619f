"""Assemble an orchestrator from engine directories, checking they fit together.

Every mismatch a user can hit is answered here, before any decoding, with
the numbers and the fix.
"""

from __future__ import annotations

from pathlib import Path

from .config_strings import DraftTargetConfig, NGramConfig
from .devices import validate_devices
from .engine_format import EngineDir, load_engine_dir
from .errors import EngineError, RequestError
from .executor import OrtExecutor
from .orchestrator import Orchestrator
from .proposers.draft_model import DraftModelProposer
from .proposers.ngram import NGramProposer
from .sampling import SamplingConfig
from .tokenizer import Tokenizer


def open_executor(engine: EngineDir, num_threads: int | None = None, device: int = 0):
    backend = engine.config.build.backend
    if backend == "onnxruntime":
        return OrtExecutor(engine, num_threads=num_threads)
    if backend == "tensorrt":
        from .trt_executor import TrtExecutor  # needs tensorrt + cuda-python: only on GPU hosts

        return TrtExecutor(engine, device=device)
    raise EngineError(f"{engine.path} was built for backend {backend!r}, which has no executor in this version.")


def check_draft_len(target: EngineDir, draft_len: int, what: str) -> None:
    build = target.config.build
    if build.speculative_decoding_mode != "draft_tokens_external":
        raise EngineError(
            f"the target engine {target.path} was built with --speculative_decoding_mode {build.speculative_decoding_mode}, "
            f"so it cannot verify drafts. Rebuild it with --speculative_decoding_mode draft_tokens_external --max_draft_len {draft_len}."
        )
    if draft_len > build.max_draft_len:
        raise EngineError(
            f"{what}={draft_len} is larger than the target engine's max_draft_len={build.max_draft_len} (baked in at build time). "
            f"Use {what} <= {build.max_draft_len}, or rebuild the target with --max_draft_len {draft_len}."
        )


def _check_tokenizers(target: EngineDir, draft: EngineDir) -> None:
    t, d = target.tokenizer_path, draft.tokenizer_path
    if t is None or d is None:
        return  # nothing to compare: token ids are the user's responsibility
    if target.config.files.get(t.name) == draft.config.files.get(d.name):
        return  # the same file (sha256 checked at load): no need to parse both
    if Tokenizer(t.parent).vocab() != Tokenizer(d.parent).vocab():
        raise EngineError(
            f"the draft engine {draft.path} and the target engine {target.path} have different tokenizers; "
            "speculative decoding needs a draft that shares the target's tokenizer."
        )


def _engine(d: str | Path | EngineDir) -> EngineDir:
    return d if isinstance(d, EngineDir) else load_engine_dir(d)


def gpu_placements(placed: list[tuple[EngineDir, int]]) -> list[tuple[EngineDir, int]]:
    """The (engine, device) pairs whose KV cache and plan take GPU memory: tensorrt engines only
    (an onnxruntime engine's device 0 is the CPU, its cache host memory)."""
    return [(e, d) for e, d in placed if e.config.build.backend == "tensorrt"]


def load_orchestrator(
    target_dir: str | Path | EngineDir,
    draft_dir: str | Path | EngineDir | None = None,
    draft_target: DraftTargetConfig | None = None,
    ngram: NGramConfig | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    ngram_keep_all: bool = True,
    ngram_use_oldest: bool = False,
    num_threads: int | None = None,
    target_devices: list[int] | None = None,
    draft_num_threads: int = 1,
    draft_confidence_threshold: float = 0.0,
    ngram_min_match: int = 1,
    target_executor: OrtExecutor | None = None,  # or a TrtExecutor: the same interface
) -> Orchestrator:
    """Target-only when neither ``draft_dir`` nor ``ngram`` is given.

    ``target_executor``: an executor already open on this target engine (say,
    an earlier orchestrator's ``.target``), reused instead of opening a second
    session of the same engine.

    On CPU the target gets ``num_threads`` (default: all cores) and the draft
    one thread: a small draft step is per-node overhead that threads do not
    shorten, and two sessions spinning worker threads on the same cores cut
    draft-target throughput by 3x (measured on 2 cores).
    """
    if draft_target is not None and ngram is not None:
        raise RequestError("choose one drafting method: a draft model (--draft_target_model_config) or n-gram (--ngram_config), not both.")
    target = _engine(target_dir)  # an already loaded EngineDir is not hashed again
    if ngram is not None:
        validate_devices(ngram.devices, target, "target")
        check_draft_len(target, ngram.max_draft_len, "ngram max_draft_len")
        proposer = NGramProposer(ngram.max_draft_len, ngram.max_matching_ngram_size, ngram_keep_all, ngram_use_oldest, ngram_min_match)
        return Orchestrator(target_executor or open_executor(target, num_threads, ngram.devices[0]), proposer, draft_len=ngram.max_draft_len)
    if draft_dir is None:
        if draft_target is not None:
            raise RequestError("--draft_target_model_config needs a draft engine: pass --draft_engine_dir.")
        devices = target_devices or [0]
        validate_devices(devices, target, "target")
        return Orchestrator(target_executor or open_executor(target, num_threads, devices[0]))
    draft = _engine(draft_dir)
    cfg = draft_target or DraftTargetConfig(min(4, max(target.config.build.max_draft_len, 1)), [0], [0], False)
    validate_devices(cfg.draft_devices, draft, "draft")
    validate_devices(cfg.target_devices, target, "target")
    check_draft_len(target, cfg.draft_len, "draft_len")
    _check_tokenizers(target, draft)
    tv, dv = target.config.model.vocab_size, draft.config.model.vocab_size
    # Vocabularies padded to different sizes share the tokenizer's ids: compare over the common range.
    vocab_limit = min(tv, dv) if tv != dv else None
    on_gpu = gpu_placements([(target, cfg.target_devices[0]), (draft, cfg.draft_devices[0])])
    if on_gpu:
        from .trt_executor import check_memory  # refuse, with the numbers, before allocating anything

        check_memory([e for e, _ in on_gpu], [d for _, d in on_gpu])
    proposer = DraftModelProposer(open_executor(draft, draft_num_threads, cfg.draft_devices[0]), sampling, cfg.use_logits, vocab_limit, draft_confidence_threshold)
    target_ex = target_executor or open_executor(target, num_threads, cfg.target_devices[0])
    return Orchestrator(target_ex, proposer, draft_len=cfg.draft_len, use_logits=cfg.use_logits, vocab_limit=vocab_limit)
