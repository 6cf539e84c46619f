"""specdec.runtime: load engine directories and run speculative decoding.

Imports nothing heavier than numpy, onnxruntime and tokenizers, so a host that
only runs engines needs neither torch nor transformers.

    from specdec.runtime import load_orchestrator, GenerationConfig
    orch = load_orchestrator("engines/target", "engines/draft")
    outputs, metrics = orch.generate([[1, 2, 3]], GenerationConfig(max_output_len=64))

    # request by request (a server's loop): runtime/engine.py
    from specdec.runtime import load_engine
    engine = load_engine("engines/target", "engines/draft", draft_len="auto")
    rid = engine.add_request([1, 2, 3], GenerationConfig(max_output_len=64))
    while engine.has_unfinished():
        for out in engine.step(): ...

The names below load on first use (PEP 562): importing ``specdec.runtime``, or one of its modules, loads
nothing else of it, so reading an engine's config or a Hugging Face config costs no runtime import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..formats import __version__  # noqa: F401  (the version users read as specdec.runtime.__version__)

# public name -> the module that defines it (relative to specdec)
_PUBLIC = {
    "DraftTargetConfig": "formats.config_strings",
    "NGramConfig": "formats.config_strings",
    "parse_draft_target_config": "formats.config_strings",
    "parse_ngram_config": "formats.config_strings",
    "EngineDir": "formats.engine_format",
    "load_engine_dir": "formats.engine_format",
    "SpecdecError": "formats.errors",
    "open_executor": "runtime.backends",
    "Executor": "runtime.backends.base",
    "Placement": "runtime.backends.base",
    "Engine": "runtime.engine",
    "SpeculationConfig": "runtime.engine",
    "KVCache": "runtime.kv_cache",
    "load_engine": "runtime.loading",
    "load_orchestrator": "runtime.loading",
    "Metrics": "runtime.metrics",
    "PrefixCacheConfig": "runtime.prefix_cache",
    "GenerationConfig": "runtime.orchestrator",
    "Orchestrator": "runtime.orchestrator",
    "RequestOutput": "runtime.orchestrator",
    "SamplingConfig": "runtime.sampling",
    "SuffixConfig": "runtime.proposers.suffix",  # the methods' typed configs beside NGramConfig and DraftTargetConfig
    "PEagleConfig": "runtime.proposers.peagle",
    "OrtExecutor": "runtime.backends.onnxruntime.cpu",
}
__all__ = ["__version__", *_PUBLIC]

if TYPE_CHECKING:  # what type checkers and editors see (re-exported: `X as X`); at run time each name loads on first use
    from ..formats.config_strings import (
        DraftTargetConfig as DraftTargetConfig,
        NGramConfig as NGramConfig,
        parse_draft_target_config as parse_draft_target_config,
        parse_ngram_config as parse_ngram_config,
    )
    from ..formats.engine_format import EngineDir as EngineDir, load_engine_dir as load_engine_dir
    from ..formats.errors import SpecdecError as SpecdecError
    from .backends import open_executor as open_executor
    from .backends.base import Executor as Executor, Placement as Placement
    from .backends.onnxruntime.cpu import OrtExecutor as OrtExecutor
    from .engine import Engine as Engine, SpeculationConfig as SpeculationConfig
    from .kv_cache import KVCache as KVCache
    from .loading import load_engine as load_engine, load_orchestrator as load_orchestrator
    from .metrics import Metrics as Metrics
    from .orchestrator import GenerationConfig as GenerationConfig, Orchestrator as Orchestrator, RequestOutput as RequestOutput
    from .prefix_cache import PrefixCacheConfig as PrefixCacheConfig
    from .proposers.peagle import PEagleConfig as PEagleConfig
    from .proposers.suffix import SuffixConfig as SuffixConfig
    from .sampling import SamplingConfig as SamplingConfig


def __getattr__(name: str) -> Any:
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"specdec.{where}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
