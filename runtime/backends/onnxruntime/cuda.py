"""Run one onnxruntime engine on one NVIDIA GPU through ONNX Runtime's CUDA execution provider.

The trap this executor exists to avoid: ONNX Runtime's I/O binding copies a
host (numpy) input to the GPU when it is *bound*, so the CPU executor's habit
(bind numpy buffers once, rewrite them in place every step) feeds a GPU stale
inputs and decodes garbage without an error. Here:

* **KV cache on the device, allocated once per cache** (``new_cache``): one
  CUDA buffer per (layer, K|V), ``[slots, ...]`` in the engine's cache dtype,
  zeroed once. A call on slots ``first .. first+n-1`` binds the buffer's
  address at slot ``first`` with shape ``[n, ...]`` as both the cache input
  and the updated-cache output, so the network updates it in place.
* **Per-step inputs pushed every step** into fixed device buffers (one copy:
  ids, positions and logit rows share one int64 buffer), and only the logit
  rows asked for come back to the host.
* **One I/O binding per call shape** (first slot, rows, tokens, logit rows),
  bound once: a step then costs one host-to-device copy, the run and one
  device-to-host copy. With the ``ort_cuda`` lowering (no host read inside
  the graph) decode shapes are replayed as **CUDA graphs**, one per shape.
* ``copy_slot`` copies the live part of a slot with cudaMemcpy2D.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...engine_format import EngineDir
from ...errors import DeviceError, EngineError, RequestError
from ...kv_cache import KVCache
from ..base import Placement, StepOutput, compact_chain, plan_step, refuse_hidden, refuse_trees
from .cuda_host import CUDA_PROVIDER, D2D, D2H, cudart, require_cuda_provider, require_gpu, visible_cuda_gpus

# ONNX type strings of the cache -> (numpy dtype for sizes, ONNX TensorProto element type for binding)
_CACHE_TYPES = {"tensor(float)": (np.float32, 1), "tensor(float16)": (np.float16, 10), "tensor(bfloat16)": (np.uint16, 16)}
GRAPH_LOWERINGS = ("ort_cuda",)  # lowerings with no host read inside a step: CUDA graphs can replay them


# -- the Backend protocol (runtime/backends/base.py) --------------------------------------
def make_executor(engine: EngineDir, placement: Placement) -> "CudaExecutor":
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
    """ONNX Runtime 1.31's GQA takes several new tokens with a past only at batch 1: then one call per row."""
    return width > 1 and len(lengths) > 1 and bool(lengths.any())


def check_engine(engine: EngineDir, cuda_graphs: bool | None) -> bool:
    """Refuse what an engine rules out on this executor; whether its steps are replayed as CUDA graphs."""
    build, where = engine.config.build, str(engine.path)
    if build.backend != "onnxruntime":
        raise EngineError(f"{where} is a {build.backend} engine; the CUDA executor runs onnxruntime engines.")
    if build.lowering == "ort_cuda" and build.dtype == "float32":
        raise EngineError(
            f"{where} is an ort_cuda engine that computes in float32 (a build for checking the lowering on a CPU): "
            "GroupQueryAttention on CUDA runs float16/bfloat16 only. Rebuild it with --dtype bfloat16 (or float16), "
            "or use the ort_cpu or portable lowering for float32."
        )
    possible = build.lowering in GRAPH_LOWERINGS
    if cuda_graphs and not possible:
        raise EngineError(
            f"{where} uses the {build.lowering} lowering, which reads the live length back to the host inside every step: "
            "CUDA graphs need an engine built with --lowering ort_cuda."
        )
    return possible if cuda_graphs is None else cuda_graphs


class CudaKVCache(KVCache):
    """KVCache bookkeeping (lengths, rollback, room checks) over device buffers of its own.

    slabs: past name -> CUDA OrtValue ``[num_slots, *slot shape]``, zeroed once.
    shapes: the call shapes bound to these buffers (each with its I/O binding, maybe a CUDA graph).
    """

    def __init__(self, owner: "CudaExecutor", num_slots: int, slabs: dict):
        m, b = owner.model, owner.build
        super().__init__(m.num_layers, num_slots, m.num_kv_heads, b.kv_capacity, m.head_dim, b.max_seq_len, b.kv_layout, storage=False)
        self.owner, self.slabs = owner, slabs
        self.shapes: dict[tuple[int, int, int, int, int], _Shape] = {}


class _Shape:
    """Everything bound for one call shape: fixed device inputs, the logits buffer, its I/O binding."""

    def __init__(self, ex: "CudaExecutor", slabs: dict, first: int, n: int, width: int, rows: int, graph_id: int):
        ort = ex._ort
        # ids | positions | logits_index in one int64 device buffer: one copy per step
        self.host = np.zeros(2 * n * width + n * rows, np.int64)
        self.ids = self.host[: n * width].reshape(n, width)
        self.positions = self.host[n * width : 2 * n * width].reshape(n, width)
        self.index = self.host[2 * n * width :].reshape(n, rows)
        self.index[:] = np.arange(rows)
        self.inputs = ort.OrtValue.ortvalue_from_shape_and_type(list(self.host.shape), np.int64, "cuda", ex.device_id)
        self.logits = ort.OrtValue.ortvalue_from_shape_and_type([n, rows, ex.vocab_size], np.float32, "cuda", ex.device_id)
        self.logits_host = np.empty((n, rows, ex.vocab_size), np.float32)
        self.total = np.zeros((), np.int32)  # ort_cuda's host-side attention bound (attention_bound)
        b = self.binding = ex.session.io_binding()
        base, dev = self.inputs.data_ptr(), ex.device_id
        b.bind_input("input_ids", "cuda", dev, np.int64, [n, width], base)
        b.bind_input("position_ids", "cuda", dev, np.int64, [n, width], base + 8 * n * width)
        b.bind_input("logits_index", "cuda", dev, np.int64, [n, rows], base + 16 * n * width)
        if ex._has_total:
            b.bind_input("total_sequence_length", "cpu", 0, np.int32, [], self.total.ctypes.data)
        for name, slab in slabs.items():
            ptr, shape = slab.data_ptr() + first * ex._slot_bytes, [n, *ex._slot_shape]
            b.bind_input(name, "cuda", dev, ex._cache_elem, shape, ptr)
            b.bind_output(name.replace("past_", "present_"), "cuda", dev, ex._cache_elem, shape, ptr)  # in place
        b.bind_output("logits", "cuda", dev, np.float32, [n, rows, ex.vocab_size], self.logits.data_ptr())
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("gpu_graph_id", str(graph_id))  # -1: run without a graph
        ex._configure_run(self.run_options, width, rows)


class CudaExecutor:
    """The onnxruntime backend's executor on one NVIDIA GPU (ONNX Runtime's CUDAExecutionProvider)."""

    tree_attention = False  # no tree_mask bound: chains only
    extra_outputs: frozenset[str] = frozenset()  # medusa_logits / eagle_hidden are not bound here

    def __init__(self, engine: EngineDir, device: int = 0, cuda_graphs: bool | None = None, warm_up: bool = True, provider_options: dict[str, str] | None = None):
        """cuda_graphs: None = whenever the lowering allows it (ort_cuda). provider_options: extra
        CUDAExecutionProvider options (e.g. ``{"sdpa_kernel": "1"}``, ONNX Runtime's attention kernel choice)."""
        where = str(engine.path)
        self.engine, self.model, self.build = engine, engine.config.model, engine.config.build
        self._name = str(engine.path)  # for plan_step's errors, made once rather than on every forward
        self.vocab_size, self.device_id, self.device = self.model.vocab_size, device, f"cuda:{device}"
        self.cuda_graphs = check_engine(engine, cuda_graphs)  # what the engine itself rules out, before touching a GPU
        ort = require_cuda_provider(f"{where} on a GPU")
        require_gpu(device, where)
        self._ort, self._rt = ort, cudart()
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        provider = {"device_id": str(device), "enable_cuda_graph": "1" if self.cuda_graphs else "0"}
        if self.build.dtype == "float32" or self.build.lowering != "ort_cuda":  # float32 compute: real float32, not TF32 (greedy parity with the CPU)
            provider["use_tf32"] = "0"
        else:
            # ONNX Runtime's own flash attention: a k+1-token verification then attends exactly as k+1 one-token
            # steps do (measured on H100: max |logit diff| 0 at contexts 140-700), so greedy speculative output is
            # target-only's. The default (cuDNN SDPA) is ~8% faster per step but differs by one bf16 ulp past 128
            # positions, which flipped near-tied tokens on 2 of 8 prompts (docs/gpu.md).
            provider["sdpa_kernel"] = "1"
        provider.update(provider_options or {})
        try:
            self.session = ort.InferenceSession(str(engine.network_path), opts, providers=[(CUDA_PROVIDER, provider), "CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's own errors are untyped
            raise EngineError(f"ONNX Runtime could not load {engine.network_path} on GPU {device}: {err}") from err
        if self.session.get_providers()[0] != CUDA_PROVIDER:
            raise DeviceError(f"ONNX Runtime fell back to {self.session.get_providers()[0]} for {where}: the CUDA provider did not load (see ONNX Runtime's log; CUDA/cuDNN libraries missing?).")
        self._check_inputs(where)
        self._allocate()
        self._decode_width = max(2, self.build.max_draft_len + 1)  # widest decode step: its shapes get graphs
        self._next_graph = 0
        self._steps = np.arange(max(self.build.max_input_len, self.build.kv_capacity), dtype=np.int64)
        if warm_up:
            self._warm_up()

    # -- setup -------------------------------------------------------------------
    def _configure_run(self, run_options, width: int, rows: int) -> None:
        """Run options of one call shape beyond the graph id (the TensorRT-RTX executor picks a profile here)."""

    def _check_inputs(self, where: str) -> None:
        types = {i.name: i.type for i in self.session.get_inputs()}
        self._kv = [f"past_{k}.{i}" for i in range(self.model.num_layers) for k in ("key", "value")]
        missing = [n for n in ("input_ids", "position_ids", "logits_index", *self._kv) if n not in types]
        if missing:
            raise EngineError(f"{where}: the network lacks the engine ABI inputs {missing}; rebuild it with this specdec.")
        cache_type = types[self._kv[0]]
        if cache_type not in _CACHE_TYPES:
            raise EngineError(f"{where}: KV cache of type {cache_type} is not supported (expected float, float16 or bfloat16).")
        self._cache_np, self._cache_elem = _CACHE_TYPES[cache_type]
        self._has_total = "total_sequence_length" in types

    def _allocate(self) -> None:
        m, b = self.model, self.build
        self._slot_shape = [m.num_kv_heads, b.kv_capacity, m.head_dim] if b.kv_layout == "bnsh" else [b.kv_capacity, m.num_kv_heads * m.head_dim]
        self._itemsize = np.dtype(self._cache_np).itemsize
        self._slot_bytes = int(np.prod(self._slot_shape)) * self._itemsize

    def _slabs(self, num_slots: int) -> dict:
        """One zeroed CUDA buffer per (layer, K|V) of ``num_slots`` slots."""
        self._rt.set_device(self.device_id)
        slabs = {}
        for name in self._kv:
            slab = self._ort.OrtValue.ortvalue_from_shape_and_type([num_slots, *self._slot_shape], self._cache_elem, "cuda", self.device_id)
            # zeroed once: positions past a slot's length are masked, but must never hold NaN/Inf garbage
            self._rt.memset(slab.data_ptr(), num_slots * self._slot_bytes)
            slabs[name] = slab
        self._rt.synchronize()  # cudaMemset may return early; ONNX Runtime's stream does not wait for the legacy one
        return slabs

    def _warm_up(self) -> None:
        """Kernel selection and memory planning happen on the first runs: pay them at load."""
        graphs, self.cuda_graphs = self.cuda_graphs, False  # a graph of a throw-away cache would never be replayed
        try:
            cache = self.new_cache(1)
            self.forward(cache, [[0] * min(3, self.build.max_input_len)], all_logits=False)
            self.forward(cache, [[0]], all_logits=True)
        finally:
            self.cuda_graphs = graphs

    # -- cache ---------------------------------------------------------------------
    def new_cache(self, num_slots: int) -> CudaKVCache:
        """A cache of ``num_slots`` slots in device buffers of its own (every length 0)."""
        if num_slots > self.build.max_batch_size:
            raise RequestError(f"{num_slots} cache slots exceed {self.engine.path}'s max_batch_size={self.build.max_batch_size}.")
        return CudaKVCache(self, num_slots, self._slabs(num_slots))

    def _own(self, cache: KVCache) -> None:
        if not isinstance(cache, CudaKVCache) or cache.owner is not self:
            raise RequestError(f"this KV cache was not made by the CUDA executor of {self.engine.path}: use its new_cache().")

    def copy_slot(self, cache: KVCache, src: int, dst: int) -> None:
        """Copy slot ``src``'s live K/V to slot ``dst`` on the device and set its length."""
        self._own(cache)
        n = int(cache.lengths[src])
        if src != dst and n:
            self._rt.set_device(self.device_id)
            m, cap = self.model, self.build.kv_capacity
            for slab in cache.slabs.values():
                base = slab.data_ptr()
                s, d = base + src * self._slot_bytes, base + dst * self._slot_bytes
                if self.build.kv_layout == "bnsh":  # per KV head: the first n positions of capacity
                    pitch = cap * m.head_dim * self._itemsize
                    self._rt.copy_2d(d, pitch, s, pitch, n * m.head_dim * self._itemsize, m.num_kv_heads)
                else:  # bsh: the first n positions are contiguous
                    self._rt.copy(d, s, n * m.num_kv_heads * m.head_dim * self._itemsize, D2D)
            self._rt.synchronize()  # device-to-device copies may return early: done before the next run reads the slot
        cache.lengths[dst] = n

    def compact_slot(self, cache: KVCache, slot: int, start: int, keep: Sequence[int]) -> None:
        compact_chain(cache, slot, start, keep, self._name)

    # -- compute -------------------------------------------------------------------
    def forward(self, cache: KVCache, tokens: Sequence[Sequence[int]] | np.ndarray, all_logits: bool, advance: np.ndarray | None = None, first_slot: int = 0,
                parents=None, hidden: np.ndarray | None = None) -> StepOutput:
        """Append ``tokens[i]`` to slot ``first_slot + i``; logits on the host, ``[n, width or 1, vocab]`` (reused per shape)."""
        refuse_trees(parents, self._name)
        refuse_hidden(hidden, self._name)
        self._own(cache)
        plan = plan_step(cache, tokens, advance, first_slot, self._name)
        ids, num_new, grow, lengths = plan.ids, plan.num_new, plan.grow, plan.lengths
        n, width = ids.shape
        if self._has_total and rows_one_by_one(lengths, width):
            logits = self._per_row(cache, ids, num_new, all_logits, first_slot)
        else:
            index = None if all_logits else num_new - 1
            logits = self._run(cache, first_slot, ids, lengths, index)
        cache.lengths[first_slot : first_slot + n] += grow
        return StepOutput(logits)

    def _per_row(self, cache: KVCache, ids: np.ndarray, num_new: np.ndarray, all_logits: bool, first_slot: int) -> np.ndarray:
        """ONNX Runtime 1.31's GroupQueryAttention takes several new tokens with a past only at batch 1: one call per slot."""
        n, width = ids.shape
        out = np.zeros((n, width if all_logits else 1, self.vocab_size), np.float32)
        for i in range(n):
            k = int(num_new[i])
            slot = first_slot + i
            row = self._run(cache, slot, ids[i : i + 1, :k], cache.lengths[slot : slot + 1], None if all_logits else np.array([k - 1]))
            out[i, : row.shape[1]] = row[0]
        return out

    def _run(self, cache: CudaKVCache, first: int, ids: np.ndarray, lengths: np.ndarray, last: np.ndarray | None) -> np.ndarray:
        """ids [n, width] for slots first..first+n-1 at ``lengths``; logits of every token, or of token ``last[i]`` of row i."""
        n, width = ids.shape
        rows = width if last is None else 1
        total = attention_bound(lengths, width, self.build.kv_capacity)
        key = (first, n, width, rows, total)  # a first prompt (total == width) is its own shape, never a graph
        shapes = cache.shapes
        shape = shapes.get(key)
        if shape is None:
            if width > self._decode_width or total == width:  # prompt widths vary per request: keep only the latest, never graph them
                for old in [k for k in shapes if k[2] > self._decode_width or k[2] == k[4]]:
                    del shapes[old]
                graph_id = -1
            else:
                graph_id = self._next_graph if self.cuda_graphs else -1
                self._next_graph += graph_id >= 0
            shape = shapes[key] = _Shape(self, cache.slabs, first, n, width, rows, graph_id)
        shape.ids[...] = ids
        np.add(lengths[:, None], self._steps[:width], out=shape.positions)
        if last is not None:
            shape.index[:, 0] = last
        shape.total[...] = total
        rt = self._rt
        rt.set_device(self.device_id)
        shape.inputs.update_inplace(shape.host)
        self.session.run_with_iobinding(shape.binding, shape.run_options)
        rt.copy(shape.logits_host.ctypes.data, shape.logits.data_ptr(), shape.logits_host.nbytes, D2H)
        return shape.logits_host
