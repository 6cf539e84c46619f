"""What one step of an engine costs on a GPU: ms against the HBM floor, and kernels launched (benchmarks/bench_gpu.py).

* ``hbm_bandwidth``: a 1 GiB device-to-device copy, read + write bytes / time (ONNX Runtime's CUDA runtime).
* ``read_bandwidth``: a reduction over a few GiB (torch): read bytes / time, what a decode step's weights cost to read.
* ``weight_bytes``: the engine's weights (model.onnx.data, or a torch engine's safetensors): what a decode step reads at least.
* ``step_ms``: ms per forward of ``width`` new tokens on each of ``batch`` rows at ``context``; the same
  positions are rewritten every call (advance=False), so the context stays put.
* ``kernel_profile``: CUDA kernels per step and their summed GPU time, counted by CUPTI through
  torch.profiler (it records every kernel of the process, ONNX Runtime's too; the kernels inside a replayed
  CUDA graph are recorded as well). A step whose kernel time is far below its wall time is launch-bound; a
  step whose kernel time is near it but far above the floor is kernel-bound (small, slow kernels).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def hbm_bandwidth(device: int = 0, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting the read and the write."""
    import onnxruntime as ort

    from specdec.runtime.backends.onnxruntime.cuda_host import D2D, cudart

    a = ort.OrtValue.ortvalue_from_shape_and_type([nbytes], np.uint8, "cuda", device)
    b = ort.OrtValue.ortvalue_from_shape_and_type([nbytes], np.uint8, "cuda", device)
    rt = cudart()
    rt.copy(b.data_ptr(), a.data_ptr(), nbytes, D2D)
    rt.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        rt.copy(b.data_ptr(), a.data_ptr(), nbytes, D2D)
    rt.synchronize()  # a device-to-device cudaMemcpy may return before the copy is done
    return 2 * nbytes * reps / (time.perf_counter() - t)


def read_bandwidth(device: str = "cuda", nbytes: int = 4 << 30, reps: int = 10) -> float:
    """Bytes/s a kernel reads: the best of ``reps`` sums over ``nbytes`` of float32 (the write is one number). A decode step
    reads its weights and writes little, so this, not a copy, is its floor."""
    import torch

    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    x.sum()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        sync()
        best = min(best, time.perf_counter() - t)
    del x
    return nbytes / best


def weight_bytes(engine_dir: Path) -> int:
    """The engine's weight files (its own folder, not an EAGLE module's eagle/): ONNX external data or torch safetensors."""
    return sum(p.stat().st_size for pattern in ("*.onnx.data", "*.safetensors") for p in Path(engine_dir).glob(pattern))


def _filled(ex, batch: int, context: int):
    """A cache of ``batch`` rows, each ``context`` tokens long."""
    cache = ex.new_cache(batch)
    ex.forward(cache, [[5] * context] * batch, all_logits=False)
    return cache


def _step_args(ex, batch: int, width: int) -> dict:
    """The engine's extra inputs (an EAGLE module's hidden_states), zeros."""
    from specdec.formats.engine_format import extra_io

    inputs, _ = extra_io(ex.model, ex.build)
    return {"extra_inputs": {t.name: np.zeros((batch, width, *t.tail), np.float32) for t in inputs}} if inputs else {}


def step_ms(ex, batch: int, width: int, context: int = 200, reps: int = 100) -> float:
    """ms per target call of ``width`` new tokens on each of ``batch`` rows at ``context`` (CUDA graphs replayed if on)."""
    cache = _filled(ex, batch, context)
    tokens, still, kw = [[5] * width] * batch, np.zeros(batch, bool), _step_args(ex, batch, width)
    for _ in range(10):
        ex.forward(cache, tokens, all_logits=True, advance=still, **kw)
    t = time.perf_counter()
    for _ in range(reps):
        ex.forward(cache, tokens, all_logits=True, advance=still, **kw)
    return (time.perf_counter() - t) / reps * 1e3


def kernel_profile(ex, batch: int, width: int, context: int = 200, steps: int = 20) -> dict | None:
    """Kernels per step and GPU kernel time per step (ms), or None without torch (CUPTI comes with it)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None

    cache = _filled(ex, batch, context)
    tokens, still, kw = [[5] * width] * batch, np.zeros(batch, bool), _step_args(ex, batch, width)
    for _ in range(5):
        ex.forward(cache, tokens, all_logits=True, advance=still, **kw)
    torch.cuda.synchronize()  # the device: ONNX Runtime's stream and torch's alike
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            ex.forward(cache, tokens, all_logits=True, advance=still, **kw)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.lower().startswith(("memcpy", "memset"))]
    copies = [e for e in prof.events() if e.device_type.name == "CUDA" and e.name.lower().startswith("memcpy")]
    return {
        "kernels_per_step": len(kernels) / steps,
        "kernel_ms_per_step": sum(e.device_time for e in kernels) / steps / 1e3,  # device_time: us
        "copies_per_step": len(copies) / steps,
        "top_kernels": _top([e.name for e in kernels], steps),
    }


def _top(names: list[str], steps: int, n: int = 8) -> list[tuple[str, float]]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [(k[:80], v / steps) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:n]]


def graph_nodes(engine_dir: Path) -> dict:
    """ONNX nodes of the engine's graph as written (before ONNX Runtime's own fusions): per decoder layer (layer 0's,
    by op type) and outside the layers: what the lowering asks of the runtime, beside what the profile counts."""
    import onnx

    model = onnx.load(str(Path(engine_dir) / "model.onnx"), load_external_data=False)
    layer0 = [n.op_type for n in model.graph.node if n.name.startswith("/model/layers.0/")]
    outside = [n for n in model.graph.node if not n.name.startswith("/model/layers.")]
    return {"per_layer": len(layer0), "outside_layers": len(outside), "layer_ops": {op: layer0.count(op) for op in sorted(set(layer0))}}

