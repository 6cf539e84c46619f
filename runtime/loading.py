"""Assemble an engine from engine directories, checking they fit together.

Every mismatch a user can hit is answered here or in the Engine itself,
before any decoding, with the numbers and the fix. The draft length, the
pairing checks and the vocabulary limit are decided once, in the Engine, so
no path (CLI, bench, eval, a user's own loop) can skip them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..formats.config_strings import DraftTargetConfig, NGramConfig
from ..formats.engine_format import EngineDir, check_decodes_alone, load_engine_dir
from ..formats.errors import RequestError
from .backends import check_placement, open_executor
from .backends.base import Executor, Placement
from .devices import placement
from .engine import Engine, SpeculationConfig, check_draft_len
from .methods import TARGET_ONLY, carried_by, method_names
from .orchestrator import Orchestrator
from .pairing import Pairing
from .prefix_cache import PrefixCacheConfig
from .proposers.method import Method, OpenContext, get_method, method_of
from .request import AUTO

__all__ = ["load_engine", "load_orchestrator", "method_draft_lens", "open_executor", "open_engine", "Pairing", "Placement"]


def load_engine(
    target_dir: str | Path | EngineDir,
    draft_dir: str | Path | EngineDir | None = None,
    draft_target: DraftTargetConfig | None = None,
    ngram: NGramConfig | None = None,
    *,
    drafters: Sequence[Any] = (),
    method: str | None = None,
    draft_len: int | str | None = None,
    ngram_keep_all: bool | None = None,
    ngram_use_oldest: bool | None = None,
    ngram_min_match: int | None = None,
    num_threads: int | None = None,
    target_devices: list[int] | None = None,
    device: str = "auto",
    draft_device: str | None = None,
    draft_num_threads: int = 1,
    draft_confidence_threshold: float = 0.0,
    allow_vocab_mismatch: bool = False,
    target_executor: Executor | None = None,
    verify: str = "stamp",
    medusa_choices: str | list | None = None,
    eagle_choices: str | list | None = None,
    suffix: Any = None,
    prefix_caching: PrefixCacheConfig = PrefixCacheConfig(),
    measure_step_costs: bool | None = None,
) -> Engine:
    """An engine with a drafter for each method asked for, and the target's own drafter when it has one (a medusa
    target's heads, an eagle target's EAGLE module in its eagle/ folder).

    ``drafters``: the typed config of each method to load (runtime/methods.py names them: ``DraftModelConfig``,
    ``NGramConfig``, ``SuffixConfig``, ``MedusaConfig``, ``EagleConfig``, or a registered method's own). The other
    method arguments say the same the older way, and become such configs: ``draft_dir`` with ``draft_target`` and
    ``draft_confidence_threshold`` (a draft model: a draft whose tokenizer is not the target's drafts through text;
    the engine's ``pairing`` says which mode was chosen and why, runtime/pairing.py), ``ngram`` with
    ``ngram_keep_all``, ``ngram_use_oldest`` and ``ngram_min_match`` (n-gram; each None: the config's), ``suffix``
    (suffix decoding's SuffixConfig: its global cache, seeded from ``suffix.seed_file``; it drafts trees when the
    target has tree attention, else chains), ``medusa_choices`` / ``eagle_choices`` (a draft tree in TensorRT-LLM's
    format, runtime/tree.py; None: chains).

    ``method``: the default for requests that do not choose (default: draft if a draft engine is given,
    else ngram if ``ngram`` is, else suffix if ``suffix`` is, else medusa / eagle for such a target, else none).
    ``draft_len``: the default drafts per round, an int or "auto" (default: the default method's proposer's
    ``default_draft_len``: the draft-target or n-gram config's; Medusa and EAGLE: their tree's nodes, or a chain of
    every head (Medusa) or of min(4, max_draft_len) (EAGLE)).
    ``device``: cpu | cuda | auto (docs/gpu.md#the-device-rule: device lists index devices of that kind); ``draft_device``: the draft
    model's, when it differs; ``target_devices``: the target's device ids when no config string names them.

    ``measure_step_costs``: time the target's calls at each batch size and width before the first request
    (Engine.measure_step_costs), so that draft_len=auto prices its first rounds from them rather than from a prior, and a
    GPU executor captures those shapes' CUDA graphs at load rather than in a request's latency. None (default): on a GPU
    executor with a drafter loaded; True / False: always / never.

    ``prefix_caching``: newcomers copy the longest cached prefix of their prompt (runtime/prefix_cache.py): on by
    default where the target's executor can hold a prefix pool; ``PrefixCacheConfig(enabled=False)`` turns it off.

    ``target_executor``: an executor already open on this target engine (say, an
    earlier engine's ``.target``), reused instead of opening a second session.
    ``verify``: how the engine directories given as paths are checked (formats/engine_format.py: load_engine_dir).

    On CPU the target gets ``num_threads`` (default: all cores) and the engines opened beside it (a draft model, an
    EAGLE module) ``draft_num_threads``: a small draft step is per-node overhead that threads do not shorten, and
    two sessions spinning worker threads on the same cores cut draft-target throughput by 3x (measured on 2 cores).
    """
    if draft_target is not None and draft_dir is None:
        raise RequestError("--draft_target_model_config needs a draft engine: pass --draft_engine_dir.")
    configs = list(drafters)
    if draft_dir is not None:
        from .proposers.draft import DraftModelConfig

        configs.append(DraftModelConfig(draft_dir, draft_target, draft_confidence_threshold))
    if ngram is not None:
        given = {"is_keep_all": ngram_keep_all, "is_use_oldest": ngram_use_oldest, "min_matching_ngram_size": ngram_min_match}
        configs.append(replace(ngram, **{k: v for k, v in given.items() if v is not None}))
    if suffix is not None:
        configs.append(suffix)
    for name, choices in (("medusa", medusa_choices), ("eagle", eagle_choices)):
        if choices is not None:
            configs.append(get_method(name).config(choices))
    return open_engine(target_dir, configs, method=method, draft_len=draft_len, num_threads=num_threads, target_devices=target_devices,
                       device=device, draft_device=draft_device, draft_num_threads=draft_num_threads,
                       allow_vocab_mismatch=allow_vocab_mismatch, target_executor=target_executor, verify=verify,
                       prefix_caching=prefix_caching, measure_step_costs=measure_step_costs)


def open_engine(
    target_dir: str | Path | EngineDir,
    drafters: Sequence[Any] = (),
    *,
    method: str | None = None,
    draft_len: int | str | None = None,
    num_threads: int | None = None,
    target_devices: list[int] | None = None,
    device: str = "auto",
    draft_device: str | None = None,
    draft_num_threads: int = 1,
    allow_vocab_mismatch: bool = False,
    target_executor: Executor | None = None,
    verify: str = "stamp",
    prefix_caching: PrefixCacheConfig = PrefixCacheConfig(),
    measure_step_costs: bool | None = None,
) -> Engine:
    """The target and the drafter of each config in ``drafters`` (and the one the target carries): ``load_engine``
    without its older arguments. Each backend refuses what cannot fit before anything opens."""
    def load(d: str | Path | EngineDir) -> EngineDir:
        return d if isinstance(d, EngineDir) else load_engine_dir(d, verify)  # an already loaded EngineDir is not hashed again

    target = load(target_dir)
    check_decodes_alone(target)
    asked = _methods(target, drafters)
    # the flags alone, before anything opens: drafts asked for with nothing to draft them, a length the target cannot verify
    names = [m.name for m, _ in asked if m.target_mode is None] + [m.name for m, _ in asked if m.target_mode is not None]  # opening order
    default = method or (names[0] if names else TARGET_ONLY)  # the first drafter opened below, unless the caller chose
    if default == TARGET_ONLY and draft_len not in (None, 0):  # not a silent target-only run
        if names:
            raise RequestError(f"draft_len={draft_len} is the default method's, and that is {TARGET_ONLY!r} (target-only): choose a method "
                               f"that drafts ({', '.join(names)}), or leave draft_len out.")
        hint = "; ".join(f"{m.name}: {m.loaded_by}" for m in map(get_method, method_names()[1:]))
        raise RequestError(f"draft_len={draft_len} but no drafting method is loaded, so nothing would draft ({hint}).")
    if draft_len is not None and draft_len != AUTO:  # the caller's own length: an error names it as given, not as a method's config
        check_draft_len(target, draft_len)
    ids = next((ids for m, c in asked if (ids := m.target_devices(c)) is not None), None)
    where = placement(ids or target_devices or [0], target, "target", device, num_threads)
    opened: list[Executor] = [target_executor] if target_executor is not None else []

    def open_target() -> Executor:
        if not opened:
            opened.append(open_executor(target, where))
        return opened[0]

    def open_own(engine: EngineDir, devices: list[int]) -> Executor:
        own = placement(devices, engine, "draft", draft_device or device, draft_num_threads)
        if where.kind == own.kind:  # two engines that may share a device: each backend refuses what cannot fit, before any opens
            check_placement([(target, where), (engine, own)])
        return open_executor(engine, own)

    beside = Placement(where.kind, where.index, draft_num_threads)
    context = OpenContext(target, where, allow_vocab_mismatch, open_target, open_own, lambda engine: open_executor(engine, beside), load)
    # the drafters that need no target executor first (a draft model is refused before the target opens), then the target's own
    proposers = [m.open(c, context) for m, c in asked if m.target_mode is None]
    target_ex = open_target()
    proposers += [m.open(c, context) for m, c in asked if m.target_mode is not None]
    if draft_len is None:
        draft_len = next((p.default_draft_len for p in proposers if p.name == default), 0)
    engine = Engine(target_ex, proposers, SpeculationConfig(default, draft_len if default != TARGET_ONLY else 0), allow_vocab_mismatch,
                    prefix_caching)
    if measure_step_costs or (measure_step_costs is None and proposers and target_ex.device != "cpu"):
        engine.measure_step_costs()
    return engine


def _methods(target: EngineDir, drafters: Sequence[Any]) -> list[tuple[Method, Any]]:
    """Each config's method, in the registry's order, with the drafter the target carries (its default config when none
    was given); a config for a drafter another kind of target carries is refused."""
    names = method_names()[1:]
    given: dict[str, Any] = {}
    for config in drafters:
        m = method_of(config, names)
        if m.name in given:
            raise RequestError(f"two configs for the drafting method {m.name!r}: give one.")
        given[m.name] = config
    mode = target.config.build.speculative_decoding_mode
    for name in given:
        m = get_method(name)
        if m.target_mode is not None and m.target_mode != mode:
            raise RequestError(f"{m.flag} needs a target engine built with --speculative_decoding_mode {m.target_mode}; "
                               f"{target.path} was built with {mode}.")
    own = carried_by(mode)
    if own is not None and own not in given:
        given[own] = get_method(own).default_config()
    return [(get_method(name), given[name]) for name in names if name in given]


def method_draft_lens(engine: Engine, draft_target: DraftTargetConfig | None = None, ngram: NGramConfig | None = None) -> dict[str, int | str]:
    """Each loaded method's drafts per round for a request that names the method but no length (specdec-serve's
    ``speculative.method``): the default method's is the engine's ``draft_len`` (--draft_len, when given); the others'
    their proposer's ``default_draft_len`` (a draft model's config's, DraftTargetConfig.default_for without one;
    n-gram's and suffix decoding's config's max_draft_len, at most the target's; a target's own drafter's its tree's
    nodes or its default chain).

    ``draft_target`` / ``ngram``: accepted for callers that pass ``load_engine``'s configs; the proposers hold them."""
    max_draft = engine.target.build.max_draft_len
    lens: dict[str, int | str] = {}
    for name, proposer in engine.proposers.items():
        k = proposer.default_draft_len
        lens[name] = min(k, max_draft) if proposer.max_draft_len is not None else k  # a limit of its own: at most the target's
    if engine.speculation.drafts:
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
