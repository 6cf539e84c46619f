"""TorchExecutor: one torch engine on one device (the Executor protocol of runtime/backends/base.py).

torch is imported when an engine opens (host.require_torch), never at import: the registry imports this module to
read its class on any host. The forward is model.py's, over ops.py's kernels (Triton on a GPU, their torch references
on a CPU); a call's inputs are made on the host as the other executors make them (base.plan_step, base.fill_tree)
and sent in one go. On a GPU, decode and verification shapes run as CUDA graphs (graphs.py), one per (batch bucket,
width, logit rows, tree or chain) and cache, captured at their first call; prompts run eagerly.

Outputs come back to the host as float32 numpy arrays (the protocol's StepOutput), valid until the next call on that
cache (the protocol's rule): on a GPU they are views of one pinned buffer per cache that every graph's call overwrites.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence

import numpy as np

from ....formats.engine_format import EngineDir, extra_io
from ....formats.errors import EngineError, RequestError
from ...kv_cache import KVCache
from ..base import StepOutput, check_extra_inputs, fill_tree, plan_step
from .host import DENSE, check_engine, cuda_device, require_torch, torch_dtype

KERNELS = ("triton", "torch")  # SPECDEC_TORCH_KERNELS: the ops a GPU runs (torch: the references, for comparing); a CPU runs torch


class TorchExecutor:
    """The torch backend's executor on the CPU (float32, references) or one NVIDIA GPU (Triton kernels, CUDA graphs)."""

    def __init__(self, engine: EngineDir, device: str = "cpu", cuda_graphs: bool | None = None, kernels: str | None = None,
                 dense: str | None = None, warm_up: bool = True):
        """device: "cpu" or "cuda:N". cuda_graphs: None = on a GPU with the Triton kernels, unless SPECDEC_TORCH_GRAPHS=0.
        kernels / dense: as KERNELS / DENSE (default: the environment's SPECDEC_TORCH_KERNELS / SPECDEC_TORCH_DENSE, else
        triton on a GPU, and stable)."""
        torch = self._torch = require_torch(f"{engine.path} (a torch engine)")
        kind = "cpu" if device == "cpu" else "cuda"
        check_engine(engine, kind)
        self.engine, self.model, self.build = engine, engine.config.model, engine.config.build
        self._name, self.vocab_size = str(engine.path), self.model.vocab_size
        self.torch_device = torch.device("cpu") if kind == "cpu" else cuda_device(torch, int(device.partition(":")[2] or 0), engine)
        self.device = str(self.torch_device)
        self.kernels = kernels or os.environ.get("SPECDEC_TORCH_KERNELS") or ("triton" if kind == "cuda" else "torch")
        self.dense = dense or os.environ.get("SPECDEC_TORCH_DENSE") or "stable"
        self._check_choices(kind)
        if cuda_graphs is None and os.environ.get("SPECDEC_TORCH_GRAPHS") == "0":  # the switch for a run without graphs
            cuda_graphs = False
        self.cuda_graphs = (kind == "cuda" and self.kernels == "triton") if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and not (kind == "cuda" and self.kernels == "triton"):
            raise EngineError(f"{engine.path}: CUDA graphs need a GPU and the Triton kernels (their attention reads each row's length on the "
                              "device; the torch references read it on the host).")
        from .model import Forward
        from .ops import ReferenceOps, TritonOps
        from .weights import load_weights

        self.dtype = torch_dtype(torch, self.build.dtype)
        with torch.inference_mode():
            weights = load_weights(engine, self.torch_device)
        self.net = Forward(weights, self.model, self.build, TritonOps(self.dense) if self.kernels == "triton" else ReferenceOps())
        # the engine's inputs and outputs beyond the ABI's, by name (engine_format.extra_io); model.py computes the outputs
        # named there and reads the inputs: the only place a name means something (StepInputs.extra, Forward._outputs)
        self.extra_in, self.extra_out = extra_io(self.model, self.build)
        self.extra_inputs = frozenset(t.name for t in self.extra_in)
        self.extra_outputs = frozenset(t.name for t in self.extra_out)
        self._per_token = frozenset(t.name for t in self.extra_out if t.per_token)  # cut by StepPlan.trim
        self.tree_attention = True  # the attention kernel takes a tree mask for any engine, and compact_slot keeps any path
        self._steps = np.arange(max(self.build.max_input_len, self.build.kv_capacity), dtype=np.int64)
        self.graph_width = max(2, self.build.max_draft_len + 1)  # widest decode / verification call: wider ones (prompts) run eagerly
        if self.build.speculative_decoding_mode == "peagle_module":  # a round: up to max_draft_len + 1 pending pairs, then k - 1 placeholders
            self.graph_width = max(2, 2 * self.build.max_draft_len)
        self.graph_pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None  # every graph's intermediates: replays never overlap
        self.graph_outputs = None  # graphs.GraphOutputs: the device buffers every graph leaves its outputs in
        if warm_up:
            self._warm_up()

    def _check_choices(self, kind: str) -> None:
        if self.kernels not in KERNELS or self.dense not in DENSE:
            raise EngineError(f"SPECDEC_TORCH_KERNELS={self.kernels!r} / SPECDEC_TORCH_DENSE={self.dense!r}: expected one of {KERNELS} / {DENSE}.")
        if self.kernels == "triton":
            from .kernels._triton import triton_problem

            problem = triton_problem()
            if problem:
                raise EngineError(f"{self.engine.path}: the torch backend's kernels need Triton: {problem}.")
            if kind == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
                raise EngineError(f"{self.engine.path}: Triton kernels on a CPU run only under its interpreter (TRITON_INTERPRET=1, for tests); "
                                  "leave SPECDEC_TORCH_KERNELS unset on a CPU.")

    def _warm_up(self) -> None:
        """Kernel compilation happens at the first launches: pay it at load, without graphs (a throw-away cache's would never replay)."""
        graphs, self.cuda_graphs = self.cuda_graphs, False
        try:
            cache = self.new_cache(1)
            for width in (min(3, self.build.max_input_len), 1):
                inputs = {t.name: np.zeros((1, width, *t.tail), np.float32) for t in self.extra_in}
                self.forward(cache, [[0] * width], all_logits=width == 1, extra_inputs=inputs)
        finally:
            self.cuda_graphs = graphs

    # -- cache -------------------------------------------------------------------------
    def new_cache(self, num_slots: int) -> KVCache:
        """A cache of ``num_slots`` rows on this executor's device (cache.py), every length 0."""
        if num_slots > self.build.max_batch_size:
            raise RequestError(f"{num_slots} cache slots exceed {self.engine.path}'s max_batch_size={self.build.max_batch_size}.")
        return self._new_kv(num_slots)

    def new_prefix_pool(self, num_slots: int) -> KVCache:
        """A cache of its own (any number of slots) that holds cached prefixes (runtime/prefix_cache.py): only copied from
        and into, never run, so it has no graphs."""
        return self._new_kv(num_slots)

    def _new_kv(self, num_slots: int) -> KVCache:
        from .cache import TorchKVCache

        m, b = self.model, self.build
        return TorchKVCache(self, num_slots, m.num_layers, m.num_kv_heads, b.kv_capacity, m.head_dim, b.max_seq_len, self.dtype, self.torch_device)

    def copy_prefix(self, src: KVCache, src_slot: int, dst: KVCache, dst_slot: int, length: int) -> None:
        """Positions 0..length-1 of ``src``'s slot into ``dst``'s slot (caches or prefix pools of this executor; one copy
        over every layer, queued on the device) and ``dst``'s length."""
        src, dst = self._own(src), self._own(dst)
        dst.check_prefix_copy(src, src_slot, length)
        if length and (src is not dst or src_slot != dst_slot):
            with self._torch.inference_mode():
                dst.kv[:, :, dst_slot, :, :length] = src.kv[:, :, src_slot, :, :length]
        dst.lengths[dst_slot] = length

    def _own(self, cache: KVCache):
        if getattr(cache, "owner", None) is not self:
            raise RequestError(f"this KV cache was not made by the torch executor of {self.engine.path}: use its new_cache().")
        return cache

    def copy_slot(self, cache: KVCache, src: int, dst: int) -> None:
        """Slot ``src``'s live K/V to slot ``dst`` (one copy over every layer, queued on the device) and its length."""
        with self._torch.inference_mode():
            self._own(cache).copy_slot(src, dst)

    def clear_slot(self, cache: KVCache, slot: int) -> None:
        with self._torch.inference_mode():
            self._own(cache).clear_slot(slot)

    def compact_slot(self, cache: KVCache, slot: int, start: int, keep: Sequence[int]) -> None:
        """After a step fed at ``start``: the K/V of the call's tokens ``keep`` (ascending, keep[0] = 0) to positions start,
        start + 1, ... and the slot's length start + len(keep): a chain's rollback, or a tree's accepted path."""
        with self._torch.inference_mode():
            self._own(cache).compact(slot, start, keep)

    # -- compute -----------------------------------------------------------------------
    def forward(self, cache: KVCache, tokens: Sequence[Sequence[int]] | np.ndarray, all_logits: bool, advance: np.ndarray | None = None,
                first_slot: int = 0, parents: Sequence[np.ndarray | None] | None = None,
                extra_inputs: Mapping[str, np.ndarray] | None = None) -> StepOutput:
        """Append ``tokens[i]`` to slot ``first_slot + i``; the logits and the engine's extra outputs on the host (as the
        onnxruntime executors': ragged rows, rows riding along where ``advance`` is False, a tree per row in ``parents``,
        each of the engine's extra inputs [n, width, *tail] float32 in ``extra_inputs``)."""
        cache = self._own(cache)
        plan = plan_step(cache, tokens, advance, first_slot, self._name)
        n, width = plan.ids.shape
        positions = plan.lengths[:, None] + self._steps[:width]  # [n, width]
        tree = None
        if parents is not None and any(p is not None for p in parents):
            causal = np.tril(np.ones((width, width), bool))
            tree = np.broadcast_to(causal, (n, width, width)).copy()
            fill_tree(tree, causal, [], positions, plan.lengths, parents)  # depth positions, ancestor masks
        if extra_inputs or self.extra_in:
            check_extra_inputs(extra_inputs, self.extra_in, n, plan.tokens, self._name)
            extra_inputs = {t.name: plan.widened(np.asarray(extra_inputs[t.name], np.float32)) for t in self.extra_in}
        index = np.broadcast_to(self._steps[:width], (n, width)) if all_logits else (plan.num_new - 1)[:, None]
        arrays = self._run(cache, first_slot, plan.ids, positions, plan.lengths.copy(), np.ascontiguousarray(index), tree, extra_inputs or {})
        plan.lengths += plan.grow
        logits = arrays.pop("logits")
        return plan.trim(StepOutput(logits, arrays), self._per_token)

    def _run(self, cache, first: int, ids: np.ndarray, positions: np.ndarray, start: np.ndarray, index: np.ndarray, tree: np.ndarray | None,
             extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One step on slots first .. first + n - 1 (arrays as forward() made them): its float32 outputs on the host, by name."""
        n, width = ids.shape
        torch, dev = self._torch, self.torch_device
        if self.cuda_graphs and width <= self.graph_width:
            from .graphs import step_graph

            with torch.cuda.device(dev):  # Triton launches on the current device
                return step_graph(self, cache, n, width, index.shape[1], tree is not None).run(ids, positions, start, first, index, tree, extra)
        from .model import StepInputs, tree_path

        as_dev = lambda a: torch.from_numpy(np.array(a)).to(dev)  # noqa: E731  (a copy: the tensor never aliases a caller's array)
        step = StepInputs(ids=as_dev(ids), positions=as_dev(positions), start=as_dev(start), slots=as_dev(first + np.arange(n)),
                          logits_index=as_dev(index), tree=None if tree is None else as_dev(tree),
                          path=None if tree is None else as_dev(tree_path(tree)),
                          extra={name: as_dev(a).to(self.dtype) for name, a in extra.items()}, live=int(start.max()) + width)
        with torch.inference_mode(), (torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()):
            out = self.net(step, cache.kv)
            return {name: t.cpu().numpy() for name, t in out.items()}  # (on a GPU: one synchronising copy per output)
