"""CUDA graphs of the torch executor's decode and verification steps.

A step shape is (batch bucket, width, logit rows, tree or chain). Its graph is captured on a cache at the shape's
first call and replayed by every later one: the inputs go into the graph's static device buffers (one pinned host
buffer, one copy per input), the graph replays, the outputs come back into pinned host buffers. Nothing in a step
reads the device from the host (attention reads each row's length on the device), so a replay is valid after any
rollback, copy_slot or compact_slot: those change lengths and cache contents, never addresses.

Batch buckets: every size up to 8, then multiples of 8 (and the engine's max_batch_size). A call of n rows replays
the smallest bucket >= n; rows n .. bucket - 1 are padding that read and write the cache's scratch slot, and their
outputs are dropped. A graph captures the cache's address, so graphs belong to a cache (cache.graphs).

Memory: replays never overlap, so every graph of an executor draws its intermediates from one pool, and copies its
outputs into one device buffer per output (GraphOutputs: the widest call's logits, 295 MB at 64 rows x 9 tokens x a
128K vocabulary) instead of keeping its own; each cache has one pinned host buffer per output, which a call returns
views of (valid until the next call on that cache, as the protocol says). Per-graph outputs would hold the logits of
every captured shape: several GB at that size.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import torch

from ..base import Setups
from .model import StepInputs, tree_path

WARMUPS = 1  # eager runs of a shape before its capture (lazy setup, Triton's compilation and module loads, must not happen inside one)


def batch_buckets(max_batch: int) -> list[int]:
    return sorted({*range(1, min(8, max_batch) + 1), *range(8, max_batch + 1, 8), max_batch})


class GraphOutputs:
    """Flat float32 buffers, one per output name, as large as the widest graph's output: device (per executor) or pinned
    host (per cache). ``view(name, shape)`` is the first elements of the buffer as ``shape``."""

    def __init__(self, ex, device: torch.device | None):
        rows, width = max(batch_buckets(ex.build.max_batch_size)), ex.graph_width
        sizes = {"logits": rows * width * ex.vocab_size, **{t.name: rows * width * int(np.prod(t.tail)) for t in ex.extra_out}}
        pin = device is None
        self.flat = {name: torch.empty(size, dtype=torch.float32, device=device or "cpu", pin_memory=pin) for name, size in sizes.items()}

    def view(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self.flat[name][: int(np.prod(shape))].view(shape)


def step_graph(ex, cache, n: int, width: int, logit_rows: int, tree: bool) -> StepGraph:
    """The cache's graph for this call shape, made (not yet captured) at its first call."""
    if ex.graph_outputs is None:
        ex.graph_outputs = GraphOutputs(ex, ex.torch_device)
    if cache.host_outputs is None:
        cache.host_outputs = GraphOutputs(ex, None)
    rows = next(b for b in batch_buckets(ex.build.max_batch_size) if b >= n)
    key = (rows, width, logit_rows, tree)
    graph = cache.graphs.get(key)
    if graph is None:
        graph = cache.graphs[key] = StepGraph(ex, cache, rows, width, logit_rows, tree)
    return graph


class StepGraph:
    def __init__(self, ex, cache, rows: int, width: int, logit_rows: int, tree: bool):
        dev = ex.torch_device
        # the cache's tensor and scratch slot, not the cache: no cycle (cache.graphs holds this), so a dropped cache and its
        # graphs go at once, never in a garbage collection that could fall inside another graph's capture
        self.ex, self.kv, self.scratch, self.rows, self.width = ex, cache.kv, cache.scratch, rows, width
        ints = [("ids", (rows, width)), ("positions", (rows, width)), ("start", (rows,)), ("slots", (rows,)), ("logits_index", (rows, logit_rows))]
        sizes = [int(np.prod(shape)) for _, shape in ints]
        self.host_ints = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=True)  # every integer input, one copy
        self.dev_ints = torch.empty(sum(sizes), dtype=torch.int64, device=dev)
        offsets = np.cumsum([0, *sizes])
        self.host_views = {name: self.host_ints[a:b].view(shape).numpy() for (name, shape), a, b in zip(ints, offsets, offsets[1:], strict=False)}
        dev_views = {name: self.dev_ints[a:b].view(shape) for (name, shape), a, b in zip(ints, offsets, offsets[1:], strict=False)}
        self.host_tree = torch.empty((rows, width, width), dtype=torch.bool, pin_memory=True) if tree else None
        self.host_path = torch.empty((rows, width, width), dtype=torch.int32, pin_memory=True) if tree else None
        # the engine's extra inputs (an EAGLE module's hidden_states), by name: float32 on the host, the compute dtype on the device
        self.host_extra = {t.name: torch.empty((rows, width, *t.tail), dtype=torch.float32, pin_memory=True) for t in ex.extra_in}
        self.step = StepInputs(**dev_views, tree=None if self.host_tree is None else torch.empty_like(self.host_tree, device=dev),
                               path=None if self.host_path is None else torch.empty_like(self.host_path, device=dev),
                               extra={name: torch.empty(h.shape, dtype=ex.dtype, device=dev) for name, h in self.host_extra.items()})
        self.causal = np.tril(np.ones((width, width), bool))
        self.graph: torch.cuda.CUDAGraph | None = None
        # where the graph leaves its outputs (views of the executor's shared buffers) and where they come back (the cache's)
        per_token = {t.name for t in ex.extra_out if t.per_token}
        shapes = {"logits": (rows, logit_rows, ex.vocab_size),
                  **{t.name: (rows, width if t.name in per_token else logit_rows, *t.tail) for t in ex.extra_out}}
        self.outputs = {name: ex.graph_outputs.view(name, shape) for name, shape in shapes.items()}
        self.host_out = {name: cache.host_outputs.view(name, shape) for name, shape in shapes.items()}

    def _fill(self, ids, positions, start, first: int, index, tree, extra: dict[str, np.ndarray]) -> None:
        n, v = ids.shape[0], self.host_views
        v["ids"][:n], v["positions"][:n], v["start"][:n], v["logits_index"][:n] = ids, positions, start, index
        v["slots"][:n] = first + np.arange(n)
        # padding rows: the scratch slot, from position 0 (what they compute is dropped)
        v["ids"][n:], v["positions"][n:], v["start"][n:], v["slots"][n:] = 0, np.arange(self.width), 0, self.scratch
        v["logits_index"][n:] = v["logits_index"][:1]
        self.dev_ints.copy_(self.host_ints, non_blocking=True)  # the integer inputs are views of dev_ints: one copy fills them all
        if self.host_tree is not None:
            t = self.host_tree.numpy()
            t[:n], t[n:] = tree, self.causal
            self.host_path.numpy()[...] = tree_path(t)
            self.step.tree.copy_(self.host_tree, non_blocking=True)
            self.step.path.copy_(self.host_path, non_blocking=True)
        for name, host in self.host_extra.items():
            h = host.numpy()
            h[:n], h[n:] = extra[name], 0.0
            self.step.extra[name].copy_(host, non_blocking=True)

    def run(self, ids, positions, start, first: int, index, tree, extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = ids.shape[0]
        self._fill(ids, positions, start, first, index, tree, extra)
        with torch.inference_mode():
            if self.graph is None:
                self._capture()
            else:
                self.graph.replay()
            for name, t in self.outputs.items():
                self.host_out[name].copy_(t, non_blocking=True)
        torch.cuda.current_stream(self.ex.torch_device).synchronize()
        return {name: t.numpy()[:n] for name, t in self.host_out.items()}

    def _forward(self) -> None:
        """The step, its outputs copied into the shared buffers (what the graph records)."""
        result = self.ex.net(self.step, self.kv)
        for name, t in self.outputs.items():
            t.copy_(result[name])

    def _capture(self) -> None:
        """The shape's first call: run it eagerly on a side stream, WARMUPS times (Triton compiles and loads its kernels,
        cuBLAS sets up: what a capture cannot do; the same inputs write the same K/V each time), then capture the same
        forward for the calls after it. The eager run's outputs are this call's. A capture that fails leaves this call's
        outputs as they are and turns the executor's graphs off, saying so once: correctness never depends on a graph."""
        Setups.count += 1  # this call's time is not the shape's cost (draft_len=auto skips it)
        main = torch.cuda.current_stream(self.ex.torch_device)
        side = torch.cuda.Stream(self.ex.torch_device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(WARMUPS):
                self._forward()
        main.wait_stream(side)
        torch.cuda.synchronize(self.ex.torch_device)
        graph = torch.cuda.CUDAGraph()
        gc.disable()  # no garbage collection inside the capture: freeing another cache's graph there invalidates the capture
        try:
            with torch.cuda.graph(graph, pool=self.ex.graph_pool):  # records, does not run: the cache keeps the eager run's writes
                self._forward()
        except RuntimeError as err:  # a CUDA error inside the capture: this executor runs without graphs from now on
            self.ex.cuda_graphs = False
            warnings.warn(f"{self.ex.engine.path}: capturing a CUDA graph of {self.rows} rows x {self.width} tokens failed ({err}); "
                          "the executor runs without CUDA graphs from now on (SPECDEC_TORCH_GRAPHS=0 skips them).", RuntimeWarning, stacklevel=2)
            with torch.cuda.stream(side):
                self._forward()  # this call's outputs again (the failed capture left the shared buffers undefined)
            main.wait_stream(side)
            return
        finally:
            gc.enable()
        self.graph = graph
