"""The torch backend on NVIDIA GPUs: specdec's Triton kernels, CUDA graphs per (batch, width) bucket."""

from __future__ import annotations

from collections.abc import Sequence

from ....formats.engine_format import EngineDir
from ....formats.errors import DeviceError
from ....formats.kv_layout import kv_cache_bytes
from ..base import Placement
from .executor import TorchExecutor
from .host import cuda_count, require_torch


def make_executor(engine: EngineDir, placement: Placement) -> TorchExecutor:
    return TorchExecutor(engine, f"cuda:{placement.index}")


def device_count() -> int:
    return cuda_count()


def engine_bytes(engine: EngineDir) -> int:
    """What opening ``engine`` allocates on its GPU at least: its weights and a KV cache of max_batch_size rows."""
    build, model = engine.config.build, engine.config.model
    weights = sum(p.stat().st_size for p in engine.path.glob("*.safetensors"))
    return weights + kv_cache_bytes(model, build.max_batch_size + 1, build.kv_capacity, 4 if build.dtype == "float32" else 2)


def check_placement(engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
    """Refuse engines whose weights and KV caches exceed a GPU's free memory, before any is opened."""
    torch = require_torch("a torch engine on --device cuda")
    if not torch.cuda.is_available():
        return  # opening says why, in its own line
    need: dict[int, int] = {}
    for engine, device in zip(engines, devices, strict=True):
        need[device] = need.get(device, 0) + engine_bytes(engine)
    for device, total in need.items():
        if device < torch.cuda.device_count():
            free, _ = torch.cuda.mem_get_info(device)
            if total > free:
                raise DeviceError(f"the torch engines placed on cuda:{device} need {total / 2**30:.1f} GiB (weights and KV caches of max_batch_size "
                                  f"rows) and it has {free / 2**30:.1f} GiB free: place them on several GPUs, or rebuild with a smaller "
                                  "--max_batch_size or --max_seq_len.")
