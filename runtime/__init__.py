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
"""

__version__ = "0.1.0"

from .config_strings import DraftTargetConfig, NGramConfig, parse_draft_target_config, parse_ngram_config  # noqa: E402,F401
from .engine_format import EngineDir, load_engine_dir  # noqa: E402,F401
from .errors import SpecdecError  # noqa: E402,F401
from .backends import open_executor  # noqa: E402,F401
from .backends.base import Executor, Placement  # noqa: E402,F401
from .engine import Engine, SpeculationConfig  # noqa: E402,F401
from .kv_cache import KVCache  # noqa: E402,F401
from .loading import load_engine, load_orchestrator  # noqa: E402,F401
from .metrics import Metrics  # noqa: E402,F401
from .orchestrator import GenerationConfig, Orchestrator, RequestOutput  # noqa: E402,F401
from .sampling import SamplingConfig  # noqa: E402,F401


def __getattr__(name: str):
    """``OrtExecutor`` on first use: importing the runtime loads no backend until something asks for one."""
    if name == "OrtExecutor":
        from .backends.onnxruntime.cpu import OrtExecutor

        return OrtExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
