"""The torch backend on the CPU: float32 engines through the kernels' torch references (how CI checks the forward)."""

from __future__ import annotations

from collections.abc import Sequence

from ....formats.engine_format import EngineDir
from ..base import Placement
from .executor import TorchExecutor


def make_executor(engine: EngineDir, placement: Placement) -> TorchExecutor:
    return TorchExecutor(engine, "cpu")


def device_count() -> int:
    return 1  # the CPU is one device


def check_placement(engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
    """Nothing to refuse up front: the weights and the KV cache are host memory, allocated when an engine opens."""
