"""Run one onnxruntime engine on one NVIDIA GPU through ONNX Runtime's CUDA execution provider.

The trap this executor exists to avoid: ONNX Runtime's I/O binding copies a
host (numpy) input to the GPU when it is *bound*, so the CPU executor's habit
(bind numpy buffers once, rewrite them in place every step) feeds a GPU stale
inputs and decodes garbage without an error. Here:

* **KV cache on the device, allocated once per cache** (``new_cache``): every
  (layer, K|V) part in one CUDA allocation, in the engine's cache dtype,
  zeroed once (cuda_io.CudaKVCache). A call on slots ``first .. first+n-1``
  binds each part's address at slot ``first`` with shape ``[n, ...]`` as both
  the cache input and the updated-cache output, so the network updates it in
  place.
* **Per-step inputs pushed every step** into fixed device buffers, one copy
  (ids, positions, logit rows, a tree engine's tree_mask and the engine's
  extra inputs share one buffer), and the outputs (logits and the engine's
  extra outputs, engine_format.extra_io) come back in one copy (cuda_io.StepIO).
* **One I/O binding per call shape** (first slot, rows, tokens, logit rows),
  bound once. With the ``ort_cuda`` lowering (no host read inside the graph)
  decode and verification shapes are replayed as **CUDA graphs**, one per shape.
* Trees (engines built with tree attention: ort_cuda's masked attention):
  ``forward(parents=...)`` fills the tree mask and depth positions as the CPU
  executor does (base.fill_tree); ``compact_slot`` moves an accepted path's K/V
  with one 2-D copy per moved token across all layers.
* ``copy_slot`` copies the live part of a slot with cudaMemcpy2D.
* An engine with GroupQueryAttention (ort_cuda's gqa form) takes several new
  tokens with a past only at batch 1: such a call runs as one call per token
  column (all rows, one token each: what draft catch-ups need) when that is
  fewer calls than one per row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ....formats.engine_format import EngineDir, extra_io
from ....formats.errors import DeviceError, EngineError, RequestError
from ...kv_cache import KVCache
from ..base import Placement, StepOutput, check_extra_inputs, fill_tree, plan_step, refuse_extra_inputs, refuse_trees
from .cuda_host import CUDA_PROVIDER, cudart, require_cuda_provider, require_gpu, visible_cuda_gpus
from .cuda_io import CudaKVCache, StepIO
from .network_io import check_network_io

# ONNX type strings of the cache -> (numpy dtype for sizes, ONNX TensorProto element type for binding)
_CACHE_TYPES = {"tensor(float)": (np.float32, 1), "tensor(float16)": (np.float16, 10), "tensor(bfloat16)": (np.uint16, 16)}
GRAPH_LOWERINGS = ("ort_cuda",)  # lowerings with no host read inside a step: CUDA graphs can replay them


# -- the Backend protocol (runtime/backends/base.py) --------------------------------------
def make_executor(engine: EngineDir, placement: Placement) -> CudaExecutor:
    return CudaExecutor(engine, device=placement.index)  # needs onnxruntime-gpu: only on GPU hosts


def device_count() -> int:
    return visible_cuda_gpus("an onnxruntime engine on --device cuda")


def check_placement(engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
    """Nothing measured up front: ONNX Runtime's session reports what does not fit when the engine opens."""


def attention_bound(lengths: np.ndarray, width: int, capacity: int) -> int:
    """ort_cuda's host-side ``total_sequence_length`` for a call of ``width`` tokens per row.

    A first prompt (every row empty, several tokens) is GroupQueryAttention's
    "prompt" case, announced by total == width. Every other call gets the KV
    capacity, a constant: each row's real bound is read on the device
    (seqlens_k), so a captured CUDA graph stays valid as rows grow, and a
    decode shape never changes GQA's case between capture and replay.
    """
    return width if width > 1 and not lengths.any() else capacity


def rows_one_by_one(lengths: np.ndarray, width: int) -> bool:
    """ONNX Runtime 1.31's GQA takes several new tokens with a past only at batch 1: then the call is split
    (one call per row, or per token column: ``CudaExecutor._split``)."""
    return width > 1 and len(lengths) > 1 and bool(lengths.any())


def uses_gqa(engine: EngineDir) -> bool:
    """Whether an ort_cuda engine attends with GroupQueryAttention (engines built before cuda_attention existed do)."""
    return engine.config.build.attends_with_gqa


def check_engine(engine: EngineDir, cuda_graphs: bool | None) -> bool:
    """Refuse what an engine rules out on this executor; whether its steps are replayed as CUDA graphs."""
    build, where = engine.config.build, str(engine.path)
    if build.backend != "onnxruntime":
        raise EngineError(f"{where} is a {build.backend} engine; the CUDA executor runs onnxruntime engines.")
    if uses_gqa(engine) and build.dtype == "float32":
        raise EngineError(
            f"{where} is an ort_cuda engine with GroupQueryAttention that computes in float32 (a build for checking the lowering "
            "on a CPU): GroupQueryAttention on CUDA runs float16/bfloat16 only. Rebuild it with --dtype bfloat16 (or float16), "
            "or use the ort_cpu or portable lowering for float32."
        )
    possible = build.lowering in GRAPH_LOWERINGS
    if cuda_graphs and not possible:
        raise EngineError(
            f"{where} uses the {build.lowering} lowering, which reads the live length back to the host inside every step: "
            "CUDA graphs need an engine built with --lowering ort_cuda."
        )
    return possible if cuda_graphs is None else cuda_graphs


class CudaExecutor:
    """The onnxruntime backend's executor on one NVIDIA GPU (ONNX Runtime's CUDAExecutionProvider)."""

    def __init__(self, engine: EngineDir, device: int = 0, cuda_graphs: bool | None = None, warm_up: bool = True,
                 provider_options: dict[str, str] | None = None, session_options=None):
        """cuda_graphs: None = whenever the lowering allows it (ort_cuda). provider_options: extra
        CUDAExecutionProvider options (e.g. ``{"sdpa_kernel": "1"}``, ONNX Runtime's attention kernel choice).
        session_options: an ``onnxruntime.SessionOptions`` to start from (a benchmark's profiling, say)."""
        where = str(engine.path)
        self.engine, self.model, self.build = engine, engine.config.model, engine.config.build
        self._name = str(engine.path)  # for plan_step's errors, made once rather than on every forward
        self.vocab_size, self.device_id, self.device = self.model.vocab_size, device, f"cuda:{device}"
        self.cuda_graphs = check_engine(engine, cuda_graphs)  # what the engine itself rules out, before touching a GPU
        ort = require_cuda_provider(f"{where} on a GPU")
        require_gpu(device, where)
        self._ort, self._rt = ort, cudart()
        opts = session_options or ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        provider = {"device_id": str(device), "enable_cuda_graph": "1" if self.cuda_graphs else "0"}
        if self.build.dtype == "float32" or self.build.lowering != "ort_cuda":  # float32 compute: real float32, not TF32 (greedy parity with the CPU)
            provider["use_tf32"] = "0"
        elif uses_gqa(engine):
            # ONNX Runtime's own flash attention: a k+1-token verification then attends exactly as k+1 one-token
            # steps do (measured on H100: max |logit diff| 0 at contexts 140-700), so greedy speculative output is
            # target-only's. The default (cuDNN SDPA) is ~8% faster per step but differs by one bf16 ulp past 128
            # positions, which flipped near-tied tokens on 2 of 8 prompts (docs/gpu.md). (The masked form's
            # Attention takes a mask, which flash attention does not: ONNX Runtime picks its kernel there.)
            provider["sdpa_kernel"] = "1"
        provider.update(provider_options or {})
        try:
            self.session = ort.InferenceSession(str(engine.network_path), opts, providers=[(CUDA_PROVIDER, provider), "CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's own errors are untyped
            raise EngineError(f"ONNX Runtime could not load {engine.network_path} on GPU {device}: {err}") from err
        if self.session.get_providers()[0] != CUDA_PROVIDER:
            raise DeviceError(f"ONNX Runtime fell back to {self.session.get_providers()[0]} for {where}: the CUDA provider did not load (see ONNX "
                              "Runtime's log; CUDA/cuDNN libraries missing?).")
        check_network_io(engine, self.session.get_inputs(), self.session.get_outputs())
        self._check_inputs(where)
        self._allocate()
        b = self.build
        self._decode_width = max(2, b.max_draft_len + 1)  # widest decode step: its shapes get graphs
        self._next_graph = 0
        self._steps = np.arange(max(b.max_input_len, b.kv_capacity), dtype=np.int64)
        if warm_up:
            self._warm_up()

    # -- setup -------------------------------------------------------------------
    def _configure_run(self, run_options, width: int, rows: int) -> None:
        """Run options of one call shape beyond the graph id (the TensorRT-RTX executor picks a profile here)."""

    def _allocate(self) -> None:
        """What every cache and call shape of this engine is sized by (also the TensorRT-RTX executor's, a subclass)."""
        m, b = self.model, self.build
        self.slot_shape = [m.num_kv_heads, b.kv_capacity, m.head_dim] if b.kv_layout == "bnsh" else [b.kv_capacity, m.num_kv_heads * m.head_dim]
        self.slot_bytes = int(np.prod(self.slot_shape)) * self.cache_itemsize
        # the inputs and outputs the engine has beyond the ABI's (engine_format.extra_io), bound in each StepIO
        self.extra_in, self.extra_out = extra_io(m, b)
        self.extra_inputs = frozenset(t.name for t in self.extra_in)
        self.extra_outputs = frozenset(t.name for t in self.extra_out)
        self._per_token = frozenset(t.name for t in self.extra_out if t.per_token)  # cut by StepPlan.trim
        self.tree_attention = bool(b.tree_attention)

    def _check_inputs(self, where: str) -> None:
        types = {i.name: i.type for i in self.session.get_inputs()}
        self.kv_names = [f"past_{k}.{i}" for i in range(self.model.num_layers) for k in ("key", "value")]
        missing = [n for n in ("input_ids", "position_ids", "logits_index", *self.kv_names) if n not in types]
        if missing:
            raise EngineError(f"{where}: the network lacks the engine ABI inputs {missing}; rebuild it with this specdec.")
        cache_type = types[self.kv_names[0]]
        if cache_type not in _CACHE_TYPES:
            raise EngineError(f"{where}: KV cache of type {cache_type} is not supported (expected float, float16 or bfloat16).")
        cache_np, self.cache_elem = _CACHE_TYPES[cache_type]
        self.cache_itemsize = np.dtype(cache_np).itemsize
        self.has_total = "total_sequence_length" in types

    def _warm_up(self) -> None:
        """Kernel selection and memory planning (and MatMulNBits' one-time weight checks, which a CUDA graph capture
        refuses) happen on the first runs: pay them at load, without graphs."""
        graphs, self.cuda_graphs = self.cuda_graphs, False  # a graph of a throw-away cache would never be replayed
        try:
            cache = self.new_cache(1)
            for width, all_logits in ((min(3, self.build.max_input_len), False), (1, True)):
                inputs = {t.name: np.zeros((1, width, *t.tail), np.float32) for t in self.extra_in}
                self.forward(cache, [[0] * width], all_logits=all_logits, extra_inputs=inputs)
        finally:
            self.cuda_graphs = graphs

    # -- cache ---------------------------------------------------------------------
    def new_cache(self, num_slots: int) -> CudaKVCache:
        """A cache of ``num_slots`` slots in a device allocation of its own (every length 0)."""
        if num_slots > self.build.max_batch_size:
            raise RequestError(f"{num_slots} cache slots exceed {self.engine.path}'s max_batch_size={self.build.max_batch_size}.")
        return CudaKVCache(self, num_slots)

    def _own(self, cache: KVCache) -> CudaKVCache:
        if not isinstance(cache, CudaKVCache) or cache.owner is not self:
            raise RequestError(f"this KV cache was not made by the CUDA executor of {self.engine.path}: use its new_cache().")
        return cache

    def copy_slot(self, cache: KVCache, src: int, dst: int) -> None:
        """Copy slot ``src``'s live K/V to slot ``dst`` on the device and set its length."""
        cache = self._own(cache)
        n = int(cache.lengths[src])
        if src != dst and n:
            self._rt.set_device(self.device_id)
            cache.move_positions(src, dst, 0, 0, n)
            self._rt.synchronize()  # device-to-device copies may return early: done before the next run reads the slot
        cache.lengths[dst] = n

    def clear_slot(self, cache: KVCache, slot: int) -> None:
        """Zero slot ``slot``'s K/V on the device (a slot is one span of each (layer, K|V) part) and its length."""
        cache = self._own(cache)
        self._rt.set_device(self.device_id)
        for part in range(2 * self.model.num_layers):
            self._rt.memset(cache.ptr(part, slot), cache.slot_bytes)
        self._rt.synchronize()  # cudaMemset may return early; ONNX Runtime's stream does not wait for the legacy one
        cache.lengths[slot] = 0

    def new_prefix_pool(self, num_slots: int) -> CudaKVCache:
        """Device storage for cached prefixes: a cache of its own (any number of slots), allocated and zeroed now."""
        return CudaKVCache(self, num_slots)

    def copy_prefix(self, src: KVCache, src_slot: int, dst: KVCache, dst_slot: int, length: int) -> None:
        """Copy positions 0..length-1 of ``src``'s slot into ``dst``'s slot on the device (two caches or pools of this
        executor, or one) and set its length."""
        src, dst = self._own(src), self._own(dst)
        dst.check_prefix_copy(src, src_slot, length)
        if length and (src is not dst or src_slot != dst_slot):
            self._rt.set_device(self.device_id)
            dst.move_positions(src_slot, dst_slot, 0, 0, length, source=src)
            self._rt.synchronize()  # device-to-device copies may return early: done before the next run reads the slot
        dst.lengths[dst_slot] = length

    def compact_slot(self, cache: KVCache, slot: int, start: int, keep: Sequence[int]) -> None:
        """After a tree step fed at ``start``: move the K/V of the call's tokens ``keep`` (ascending, keep[0] = 0) to
        positions start, start + 1, ... and set the slot's length to start + len(keep). Runs of consecutive kept tokens
        move in one copy; sources are never overwritten before they are read (keep[i] >= i)."""
        cache = self._own(cache)
        keep = np.asarray(keep, np.int64)
        if len(keep) == 0 or keep[0] != 0 or (np.diff(keep) <= 0).any() or start + int(keep[-1]) >= cache.capacity:
            raise ValueError(f"cannot compact slot {slot} at {start} with path {keep.tolist()}")
        moved = np.flatnonzero(keep != np.arange(len(keep)))
        if moved.size:
            self._rt.set_device(self.device_id)
            i = int(moved[0])
            while i < len(keep):
                j = i + 1
                while j < len(keep) and keep[j] == keep[j - 1] + 1:
                    j += 1
                cache.move_positions(slot, slot, start + int(keep[i]), start + i, j - i)
                i = j
            self._rt.synchronize()
        cache.lengths[slot] = start + len(keep)

    # -- compute -------------------------------------------------------------------
    def forward(self, cache: KVCache, tokens: Sequence[Sequence[int]] | np.ndarray, all_logits: bool, advance: np.ndarray | None = None,
                first_slot: int = 0,
                parents=None, extra_inputs: Mapping[str, np.ndarray] | None = None) -> StepOutput:
        """Append ``tokens[i]`` to slot ``first_slot + i``; the logits and the engine's extra outputs on the host
        (buffers of the call's shape on ``cache``, reused by its next call).

        parents / extra_inputs: as the CPU executor's (runtime/backends/onnxruntime/cpu.py): a tree per row for
        tree_attention engines, the engine's extra inputs by name ([n, width, *tail] each)."""
        cache = self._own(cache)
        if not self.tree_attention:
            refuse_trees(parents, self._name)
        plan = plan_step(cache, tokens, advance, first_slot, self._name, self.build.min_step_width)
        ids, num_new, grow, lengths = plan.ids, plan.num_new, plan.grow, plan.lengths
        n, width = ids.shape
        inputs = None
        if self.extra_in:
            check_extra_inputs(extra_inputs, self.extra_in, n, plan.tokens, self._name)
            inputs = {name: plan.widened(np.asarray(a, np.float32)) for name, a in extra_inputs.items()}
        else:
            refuse_extra_inputs(extra_inputs, self._name)
        if self.has_total and rows_one_by_one(lengths, width):  # GQA engines: plain ones, no extra outputs
            out = StepOutput(self._split(cache, ids, num_new, all_logits, first_slot))
        else:
            out = self._run(cache, first_slot, ids, lengths, None if all_logits else num_new - 1, parents, inputs)
        cache.lengths[first_slot : first_slot + n] += grow
        return plan.trim(out, self._per_token)

    def _split(self, cache: CudaKVCache, ids: np.ndarray, num_new: np.ndarray, all_logits: bool, first_slot: int) -> np.ndarray:
        """A GQA engine's call of several tokens with a past at batch > 1, as calls GQA takes: one per token column when
        the call is narrower than its batch (all rows, one token each; a row with fewer tokens repeats its last one at its
        last position, which rewrites the same K/V), else one per row."""
        n, width = ids.shape
        out = np.zeros((n, width if all_logits else 1, self.vocab_size), np.float32)
        lengths = cache.lengths[first_slot : first_slot + n]
        if width < n:
            rows = np.arange(n)
            for t in range(width):
                col = np.minimum(t, num_new - 1)  # [n]: each row's token index in this column
                logits = self._run(cache, first_slot, ids[rows, col][:, None], lengths + col, None).logits  # [n, 1, vocab]
                if all_logits:
                    out[:, t] = logits[:, 0]
                else:
                    last = num_new - 1 == t
                    out[last, 0] = logits[last, 0]
            return out
        for i in range(n):
            k, slot = int(num_new[i]), first_slot + i
            row = self._run(cache, slot, ids[i : i + 1, :k], cache.lengths[slot : slot + 1], None if all_logits else np.array([k - 1])).logits
            out[i, : row.shape[1]] = row[0]
        return out

    def _run(self, cache: CudaKVCache, first: int, ids: np.ndarray, lengths: np.ndarray, last: np.ndarray | None, parents=None,
             inputs: Mapping[str, np.ndarray] | None = None) -> StepOutput:
        """ids [n, width] for slots first..first+n-1 at ``lengths``; logits of every token, or of token ``last[i]`` of row i."""
        n, width = ids.shape
        rows = width if last is None else 1
        total = attention_bound(lengths, width, self.build.kv_capacity) if self.has_total else self.build.kv_capacity
        key = (first, n, width, rows, total)  # a GQA first prompt (total == width) is its own shape, never a graph
        shapes = cache.shapes
        io = shapes.get(key)
        if io is None:
            prompt = width > self._decode_width or (self.has_total and total == width)
            if prompt:  # prompt widths vary per request: keep only the latest, never graph them
                for old in [k for k in shapes if k[2] > self._decode_width or (self.has_total and k[2] == k[4])]:
                    del shapes[old]
                graph_id = -1
            else:
                graph_id = self._next_graph if self.cuda_graphs else -1
                self._next_graph += graph_id >= 0
            io = shapes[key] = StepIO(self, cache, first, n, width, rows, graph_id)
        io.ids[...] = ids
        np.add(lengths[:, None], self._steps[:width], out=io.positions)
        if io.tree is not None:
            fill_tree(io.tree, io.causal, io.tree_rows, io.positions, lengths, parents)
        for name, buffer in io.inputs.items():  # the engine's extra inputs, at the call's width
            buffer[...] = inputs[name]
        if last is not None:
            io.index[:, 0] = last
        io.total[...] = total
        io.run(self)
        return io.output
