"""CUDA graphs of the torch executor's decode and verification steps.

A step shape is (batch bucket, width, logit rows, tree or chain). Its graph is captured on a cache at the shape's
first call and replayed by every later one: the inputs go into the graph's static device buffers (one pinned host
buffer, one copy per input), the graph replays, the outputs come back into pinned host buffers. Nothing in a step
reads the device from the host (attention reads each row's length on the device), so a replay is valid after any
rollback, copy_slot or compact_slot: those change lengths and cache contents, never addresses.

Batch buckets: every size up to 8, then multiples of 8 (and the engine's max_batch_size). A call of n rows replays
the smallest bucket >= n; rows n .. bucket - 1 are padding that read and write the cache's scratch slot, and their
outputs are dropped. A graph captures the cache's address, so graphs belong to a cache (cache.graphs); every graph
of an executor draws its intermediates from one memory pool (their replays never overlap).
"""

from __future__ import annotations

import numpy as np
import torch

from .model import StepInputs


def batch_buckets(max_batch: int) -> list[int]:
    return sorted({*range(1, min(8, max_batch) + 1), *range(8, max_batch + 1, 8), max_batch})


def step_graph(ex, cache, n: int, width: int, logit_rows: int, tree: bool) -> "StepGraph":
    """The cache's graph for this call shape, made (not yet captured) at its first call."""
    rows = next(b for b in batch_buckets(ex.build.max_batch_size) if b >= n)
    key = (rows, width, logit_rows, tree)
    graph = cache.graphs.get(key)
    if graph is None:
        graph = cache.graphs[key] = StepGraph(ex, cache, rows, width, logit_rows, tree)
    return graph


class StepGraph:
    def __init__(self, ex, cache, rows: int, width: int, logit_rows: int, tree: bool):
        dev = ex.torch_device
        self.ex, self.cache, self.rows, self.width = ex, cache, rows, width
        ints = [("ids", (rows, width)), ("positions", (rows, width)), ("start", (rows,)), ("slots", (rows,)), ("logits_index", (rows, logit_rows))]
        sizes = [int(np.prod(shape)) for _, shape in ints]
        self.host_ints = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=True)  # every integer input, one copy
        self.dev_ints = torch.empty(sum(sizes), dtype=torch.int64, device=dev)
        offsets = np.cumsum([0, *sizes])
        self.host_views = {name: self.host_ints[a:b].view(shape).numpy() for (name, shape), a, b in zip(ints, offsets, offsets[1:])}
        dev_views = {name: self.dev_ints[a:b].view(shape) for (name, shape), a, b in zip(ints, offsets, offsets[1:])}
        self.host_tree = torch.empty((rows, width, width), dtype=torch.bool, pin_memory=True) if tree else None
        # the engine's extra inputs (an EAGLE module's hidden_states), by name: float32 on the host, the compute dtype on the device
        self.host_extra = {t.name: torch.empty((rows, width, *t.tail), dtype=torch.float32, pin_memory=True) for t in ex.extra_in}
        self.step = StepInputs(**dev_views, tree=None if self.host_tree is None else torch.empty_like(self.host_tree, device=dev),
                               extra={name: torch.empty(h.shape, dtype=ex.dtype, device=dev) for name, h in self.host_extra.items()})
        self.causal = np.tril(np.ones((width, width), bool))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: dict[str, torch.Tensor] = {}  # the graph's static outputs (device)
        self.host_out: dict[str, torch.Tensor] = {}  # their pinned host copies: what a call returns views of

    def _fill(self, ids, positions, start, first: int, index, tree, extra: dict[str, np.ndarray]) -> None:
        n, v = ids.shape[0], self.host_views
        v["ids"][:n], v["positions"][:n], v["start"][:n], v["logits_index"][:n] = ids, positions, start, index
        v["slots"][:n] = first + np.arange(n)
        # padding rows: the scratch slot, from position 0 (what they compute is dropped)
        v["ids"][n:], v["positions"][n:], v["start"][n:], v["slots"][n:] = 0, np.arange(self.width), 0, self.cache.scratch
        v["logits_index"][n:] = v["logits_index"][:1]
        self.dev_ints.copy_(self.host_ints, non_blocking=True)  # the integer inputs are views of dev_ints: one copy fills them all
        if self.host_tree is not None:
            t = self.host_tree.numpy()
            t[:n], t[n:] = tree, self.causal
            self.step.tree.copy_(self.host_tree, non_blocking=True)
        for name, host in self.host_extra.items():
            h = host.numpy()
            h[:n], h[n:] = extra[name], 0.0
            self.step.extra[name].copy_(host, non_blocking=True)

    def run(self, ids, positions, start, first: int, index, tree, extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = ids.shape[0]
        self._fill(ids, positions, start, first, index, tree, extra)
        with torch.inference_mode():
            if self.graph is None:
                outputs = self._capture()
            else:
                self.graph.replay()
                outputs = self.outputs
            if not self.host_out:
                self.host_out = {name: torch.empty(t.shape, dtype=torch.float32, pin_memory=True) for name, t in outputs.items()}
            for name, t in outputs.items():
                self.host_out[name].copy_(t, non_blocking=True)
        torch.cuda.current_stream(self.ex.torch_device).synchronize()
        return {name: t.numpy()[:n] for name, t in self.host_out.items()}

    def _capture(self) -> dict[str, torch.Tensor]:
        """The shape's first call: run it eagerly on a side stream (Triton compiles, cuBLAS sets up: what capture cannot do),
        then capture the same forward for the calls after it. The eager run's outputs are this call's."""
        ex, main = self.ex, torch.cuda.current_stream(self.ex.torch_device)
        side = torch.cuda.Stream(self.ex.torch_device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            eager = ex.net(self.step, self.cache.kv)
        main.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=ex.graph_pool):
            self.outputs = ex.net(self.step, self.cache.kv)
        self.graph = graph
        return eager
