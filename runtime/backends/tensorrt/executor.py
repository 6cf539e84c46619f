"""Run one TensorRT engine (``rank0.engine``) on one GPU, same interface as OrtExecutor.

Status: this executor has never run on a GPU. It was written from TensorRT's
and cuda-python's documented APIs; on GPU-less hosts the tests check its
calls against the real ``tensorrt_dispatch`` / ``tensorrt_lean`` modules and
its refusal of a host without a GPU, nothing more (docs/tensorrt.md).

The KV cache lives on the device, allocated once at ``max_batch_size`` rows
of full capacity: one slab per (layer, K|V), each ``[max_batch, kv_heads,
kv_capacity, head_dim]``. A call on slots ``s..s+B-1`` binds the slab at
row ``s`` with shape ``[B, ...]`` (the runtime keeps the running requests in
contiguous slots), and ``copy_slot`` moves one row on the device
(cudaMemcpyAsync of its live part). The cache input ``past_*``
and output ``present_*`` are bound to the same address: TensorRT's
KV-cache-update layer (what its ONNX parser makes of ``TensorScatter``)
requires its output to share the cache input's memory, which the engine
confirms through ``ICudaEngine.get_aliased_input_tensor``.

Everything that touches TensorRT or ``cuda`` imports it lazily (runtime choice: host.py), so this
module imports (and its pure helpers are tested) on hosts without either.
No torch: buffers are raw device pointers from cuda-python's cudart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ....formats.engine_format import EngineDir
from ....formats.errors import DeviceError, EngineError, RequestError
from ....formats.kv_layout import kv_cache_bytes
from ....formats.tensorrt_plan import CONTEXT_PROFILE, ENGINE_FILE, GENERATION_PROFILE
from ....hardware.tensorrt import (
    MIN_TENSORRT,
    check_gpu_arch,
    cuda_call,
    cuda_device_info,
    cudart_module,
    import_runtime,
    require_gpu,
    visible_gpu_count,
)
from ...kv_cache import KVCache
from ..base import Placement, StepOutput, compact_chain, plan_step, refuse_extra_inputs, refuse_prefix_pool, refuse_trees

_ALIGN = 256  # IExecutionContext: tensor / device memory addresses 256-byte aligned
MIB = 1 << 20


# -- the Backend protocol (runtime/backends/base.py) --------------------------------------
def make_executor(engine: EngineDir, placement: Placement) -> TrtExecutor:
    return TrtExecutor(engine, device=placement.index)  # needs tensorrt + cuda-python: only on GPU hosts


def device_count() -> int:
    return visible_gpu_count("a tensorrt engine")


def check_placement(engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
    """Each engine's KV cache and plan are allocated up front: refuse, with the numbers, what its GPU cannot hold."""
    check_memory(engines, devices)


# -- pure helpers (tested on CPU) ----------------------------------------------------
def choose_profile(width: int, rows: int, gen_max: int, ctx_max: int) -> int:
    """The generation profile whenever the call fits it, else the context profile.

    A profile only bounds shapes (the network is the same), so any profile
    whose ranges hold the call is correct; the generation one was timed at
    decode widths, which is what every step after prefill sends.
    """
    if width <= gen_max and rows <= gen_max:
        return GENERATION_PROFILE
    if width <= ctx_max and rows <= ctx_max:
        return CONTEXT_PROFILE
    raise RequestError(
        f"a call of {width} tokens per row exceeds both TensorRT profiles (context: up to max_input_len={ctx_max}, "
        f"generation: up to {gen_max}); send at most {max(ctx_max, gen_max)} tokens per row."
    )


def check_memory(engines: Sequence[EngineDir], devices: Sequence[int], free: Mapping[int, int] | None = None) -> None:
    """Refuse to start when the engines placed on one GPU do not fit its free memory.

    ``engines[i]`` goes on ``devices[i]``. Each needs its KV cache (allocated
    up front) plus its plan (the weights live in it); activation scratch is
    not known before deserialization, so leave headroom. ``free`` maps device
    -> free bytes; by default it is measured with cudaMemGetInfo.
    """
    need: dict[int, list[tuple[EngineDir, int, int]]] = {}
    for eng, dev in zip(engines, devices, strict=True):
        plan_file = eng.path / ENGINE_FILE
        need.setdefault(dev, []).append((eng, kv_cache_bytes(eng.config.model, eng.config.build.max_batch_size, eng.config.build.kv_capacity),
                                         plan_file.stat().st_size if plan_file.is_file() else 0))
    for dev, items in need.items():
        if free is not None:
            have = free[dev]
        else:
            cuda_call(cudart_module().cudaSetDevice(dev), f"cudaSetDevice({dev})")
            have = int(cuda_call(cudart_module().cudaMemGetInfo(), "cudaMemGetInfo")[0])
        total = sum(kv + plan for _, kv, plan in items)
        if total > have:
            parts = "; ".join(
                f"{e.path}: KV cache {kv / MIB:.1f} MiB (max_batch_size={e.config.build.max_batch_size} x kv_capacity={e.config.build.kv_capacity}) "
                f"+ plan {plan / MIB:.1f} MiB" for e, kv, plan in items
            )
            raise DeviceError(
                f"GPU {dev} has {have / MIB:.1f} MiB free but the engines placed on it need {total / MIB:.1f} MiB ({parts}). "
                "Rebuild with a smaller --max_batch_size or --max_seq_len, or put the draft on another GPU."
            )


# -- the device KV cache -------------------------------------------------------------
class DeviceKVCache(KVCache):
    """KVCache semantics (lengths, rollback, check_room) over the executor's device slabs."""

    def __init__(self, owner: TrtExecutor, num_slots: int, generation: int):
        m, build = owner.model, owner.build
        # the tensors live on the device (owner._slab): no host storage
        super().__init__(m.num_layers, num_slots, m.num_kv_heads, build.kv_capacity, m.head_dim, build.max_seq_len, build.kv_layout, storage=False)
        self.owner, self.generation = owner, generation


# -- the executor --------------------------------------------------------------------
class TrtExecutor:
    """The tensorrt backend's executor: one engine on one GPU."""

    tree_attention = False  # TensorRT builds refuse tree attention: chains only
    extra_outputs: frozenset[str] = frozenset()  # TensorRT builds refuse the modes with extra inputs or outputs
    extra_inputs: frozenset[str] = frozenset()

    def __init__(self, engine: EngineDir, device: int = 0, warm_up: bool = True):
        where = str(engine.path)
        self._ptrs: list[int] = []
        meta = engine.config.extra.get("tensorrt", {})
        # Order matters: every check that can say what is wrong runs before TensorRT
        # touches the plan or the GPU (TensorRT without a usable GPU can crash).
        trt = import_runtime(meta, where)  # full, dispatch or lean: whichever can run this plan
        require_gpu(device, f"{where} (TensorRT engine)")
        self._trt, self._rt = trt, cudart_module()
        self.engine, self.model, self.build = engine, engine.config.model, engine.config.build
        self._name = str(engine.path)  # for plan_step's errors, made once rather than on every forward
        self.vocab_size, self.device_index, self.device = self.model.vocab_size, device, f"cuda:{device}"
        self._set_device()
        check_gpu_arch(meta, cuda_device_info(device)[1], where)
        logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(logger)
        if meta.get("version_compatible") and not meta.get("exclude_lean_runtime"):
            self._runtime.engine_host_code_allowed = True  # the plan embeds its lean runtime (host code) and is trusted
        self._plan = self._runtime.deserialize_cuda_engine((engine.path / ENGINE_FILE).read_bytes())
        if self._plan is None:
            raise EngineError(f"TensorRT {trt.__version__} could not deserialize {engine.path / ENGINE_FILE} (see its log above); rebuild the engine "
                              "on this host.")
        self._context = self._plan.create_execution_context()
        if self._context is None:
            raise EngineError(f"TensorRT could not create an execution context for {engine.path} (out of GPU memory?).")
        self._stream = cuda_call(self._rt.cudaStreamCreate(), "cudaStreamCreate")
        self._check_io()
        self._allocate()
        self._profile, self._generation, self._host_out = -1, 0, {}
        if warm_up:
            self._warm_up()

    # -- setup ---------------------------------------------------------------------
    def _set_device(self) -> None:  # draft and target may sit on different GPUs of one thread
        cuda_call(self._rt.cudaSetDevice(self.device_index), f"cudaSetDevice({self.device_index})")

    def _check_io(self) -> None:
        trt, plan = self._trt, self._plan
        names = {plan.get_tensor_name(i) for i in range(plan.num_io_tensors)}
        self._kv = [f"past_{k}.{i}" for i in range(self.model.num_layers) for k in ("key", "value")]
        want = {"input_ids", "position_ids", "logits_index", "logits", *self._kv, *(n.replace("past_", "present_") for n in self._kv)}
        if names != want:
            raise EngineError(f"{self.engine.path}: the plan's I/O {sorted(names ^ want)} differs from the engine ABI; rebuild it with this specdec.")
        if plan.num_optimization_profiles != 2:
            raise EngineError(f"{self.engine.path}: expected 2 optimization profiles (context, generation), found {plan.num_optimization_profiles}; "
                              "rebuild it.")
        for past in self._kv:
            present = past.replace("past_", "present_")
            if not hasattr(plan, "get_aliased_input_tensor") or plan.get_aliased_input_tensor(present) != past:
                raise EngineError(
                    f"{self.engine.path}: TensorRT {trt.__version__} does not update {past} in place ({present} is not aliased to it); "
                    f"rebuild with TensorRT >= {'.'.join(map(str, MIN_TENSORRT))}, whose ONNX parser maps TensorScatter onto its KV-cache-update "
                    "layer."
                )
        self._dtype = {n: np.dtype(trt.nptype(plan.get_tensor_dtype(n))) for n in ("input_ids", "position_ids", "logits_index", "logits",
                                                                                   self._kv[0])}
        self._on_host = {n for n in ("input_ids", "position_ids", "logits_index") if plan.get_tensor_location(n) == trt.TensorLocation.HOST}
        self._ctx_max = int(plan.get_tensor_profile_shape("input_ids", CONTEXT_PROFILE)[2][1])
        self._gen_max = int(plan.get_tensor_profile_shape("input_ids", GENERATION_PROFILE)[2][1])

    def _malloc(self, nbytes: int) -> int:
        ptr = int(cuda_call(self._rt.cudaMalloc(max(nbytes, _ALIGN)), f"cudaMalloc({nbytes / MIB:.1f} MiB)"))
        self._ptrs.append(ptr)
        return ptr

    def _allocate(self) -> None:
        m, b = self.model, self.build
        self._row_bytes = m.num_kv_heads * b.kv_capacity * m.head_dim * self._dtype[self._kv[0]].itemsize
        self._slab_stride = -(-b.max_batch_size * self._row_bytes // _ALIGN) * _ALIGN
        base = self._malloc(self._slab_stride * len(self._kv))
        # Zeroed once: slots past a row's length are masked, but must never hold NaN/Inf garbage.
        # On our stream, like every later use: ordered without relying on legacy default-stream semantics.
        cuda_call(self._rt.cudaMemsetAsync(base, 0, self._slab_stride * len(self._kv), self._stream), "cudaMemsetAsync(KV cache)")
        self._slab = {name: base + i * self._slab_stride for i, name in enumerate(self._kv)}
        width = max(self._ctx_max, self._gen_max)
        self._inputs = {n: self._malloc(b.max_batch_size * width * self._dtype[n].itemsize) for n in ("input_ids", "position_ids", "logits_index")}
        self._logits_ptr, self._logits_bytes = 0, 0  # grown on demand: [B, R, V] rows actually requested

    def _warm_up(self) -> None:
        """First runs of each profile load kernels: pay that at load, not in the first request."""
        widths = [min(2, self._gen_max)] + ([self._gen_max + 1] if self._gen_max + 1 <= self._ctx_max else [])
        for width in widths:
            self.forward(self.new_cache(1), [[0] * width], all_logits=True)

    # -- cache ---------------------------------------------------------------------
    def new_cache(self, num_slots: int) -> DeviceKVCache:
        """A view of the one device KV buffer; it supersedes every earlier cache of this executor."""
        if num_slots > self.build.max_batch_size:
            raise RequestError(f"{num_slots} cache slots exceed {self.engine.path}'s max_batch_size={self.build.max_batch_size}.")
        self._generation += 1
        return DeviceKVCache(self, num_slots, self._generation)

    def _own(self, cache: KVCache) -> None:
        if not isinstance(cache, DeviceKVCache) or cache.owner is not self or cache.generation != self._generation:
            raise RequestError(
                "this KV cache is not the live cache of this TensorRT executor: the executor owns one device KV buffer, "
                "and each new_cache() call supersedes the previous cache."
            )

    def copy_slot(self, cache: KVCache, src: int, dst: int) -> None:
        self._own(cache)
        self._set_device()
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        # a row is [kv_heads, capacity, head_dim]: every head's live prefix is its own span
        m, n = self.model, int(cache.lengths[src])
        head_bytes = self._row_bytes // m.num_kv_heads
        span = n * m.head_dim * self._dtype[self._kv[0]].itemsize
        for base in self._slab.values():  # distinct rows never overlap; same stream as execute, so ordered
            for h in range(m.num_kv_heads if span else 0):
                off = h * head_bytes
                cuda_call(self._rt.cudaMemcpyAsync(base + dst * self._row_bytes + off, base + src * self._row_bytes + off, span, kind, self._stream),
                          "cudaMemcpyAsync(KV slot)")
        cache.lengths[dst] = n

    def clear_slot(self, cache: KVCache, slot: int) -> None:
        self._own(cache)
        self._set_device()
        for base in self._slab.values():  # a slot is one row of each K/V tensor; same stream as execute, so ordered
            cuda_call(self._rt.cudaMemsetAsync(base + slot * self._row_bytes, 0, self._row_bytes, self._stream), "cudaMemsetAsync(KV slot)")
        cache.lengths[slot] = 0

    def compact_slot(self, cache: KVCache, slot: int, start: int, keep: Sequence[int]) -> None:
        compact_chain(cache, slot, start, keep, self._name)

    def new_prefix_pool(self, num_slots: int) -> KVCache:
        refuse_prefix_pool(self._name, "the tensorrt executor holds one device KV buffer of max_batch_size rows, and a second cache "
                                       "would supersede it (new_cache)")

    def copy_prefix(self, src: KVCache, src_slot: int, dst: KVCache, dst_slot: int, length: int) -> None:
        refuse_prefix_pool(self._name, "the tensorrt executor holds no prefix pool")

    # -- compute -------------------------------------------------------------------
    def forward(
        self, cache: KVCache, tokens: Sequence[Sequence[int]] | np.ndarray, all_logits: bool, advance: np.ndarray | None = None, first_slot: int = 0,
        parents=None, extra_inputs: Mapping[str, np.ndarray] | None = None,
    ) -> StepOutput:
        """Same contract as OrtExecutor.forward: append tokens[i] to slot first_slot + i, return logits [n, R, V]."""
        refuse_trees(parents, self._name)
        refuse_extra_inputs(extra_inputs, self._name)
        step = plan_step(cache, tokens, advance, first_slot, self._name)
        batch, width = step.ids.shape
        positions = step.lengths[:, None] + np.arange(width, dtype=np.int64)[None, :]
        index = np.broadcast_to(np.arange(width, dtype=np.int64), (batch, width)) if all_logits else (step.num_new - 1)[:, None]
        logits = self.run(cache, step.ids, positions, np.ascontiguousarray(index), first_slot)
        step.lengths += step.grow
        return StepOutput(logits)

    def run(self, cache: KVCache, ids: np.ndarray, positions: np.ndarray, logits_index: np.ndarray, first_slot: int = 0) -> np.ndarray:
        """The raw ABI call: ids/positions [B,S], logits_index [B,R] -> logits [B,R,V] (host, reused per shape)."""
        self._own(cache)
        self._set_device()
        batch, width = ids.shape
        rows = logits_index.shape[1]
        if batch > self.build.max_batch_size:
            raise RequestError(f"batch of {batch} exceeds the engine's max_batch_size={self.build.max_batch_size}.")
        ctx, rt, stream = self._context, self._rt, self._stream
        profile = choose_profile(width, rows, self._gen_max, self._ctx_max)
        if profile != self._profile:
            # Documented: TensorRT may enqueue copies on `stream`; we execute on the same stream, so no extra sync.
            if not ctx.set_optimization_profile_async(profile, int(stream)):
                raise EngineError(f"TensorRT refused optimization profile {profile} for {self.engine.path}.")
            self._profile = profile
        host = {"input_ids": ids, "position_ids": positions, "logits_index": logits_index}
        h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name, arr in host.items():
            arr = host[name] = np.ascontiguousarray(arr, dtype=self._dtype[name])
            if name in self._on_host:  # a shape-inference input TensorRT reads on the host
                ptr = arr.ctypes.data
            else:
                ptr = self._inputs[name]
                cuda_call(rt.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, h2d, stream), f"cudaMemcpyAsync({name})")
            self._bind(name, ptr, arr.shape)
        kv_shape = (batch, self.model.num_kv_heads, self.build.kv_capacity, self.model.head_dim)
        for past, base in self._slab.items():
            row0 = base + first_slot * self._row_bytes
            self._bind(past, row0, kv_shape)
            self._bind(past.replace("past_", "present_"), row0)  # in place: same address (KVCacheUpdate)
        out = self._host_out.get((batch, rows))
        if out is None:
            out = self._host_out[(batch, rows)] = np.empty((batch, rows, self.vocab_size), self._dtype["logits"])
        if out.nbytes > self._logits_bytes:
            if self._logits_ptr:
                cuda_call(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
                cuda_call(rt.cudaFree(self._logits_ptr), "cudaFree(logits)")
                self._ptrs.remove(self._logits_ptr)
            self._logits_ptr, self._logits_bytes = self._malloc(out.nbytes), out.nbytes
        self._bind("logits", self._logits_ptr)
        if tuple(ctx.get_tensor_shape("logits")) != out.shape:
            raise EngineError(f"TensorRT infers logits of shape {tuple(ctx.get_tensor_shape('logits'))}, expected {out.shape}.")
        if not ctx.execute_async_v3(int(stream)):
            raise EngineError(f"TensorRT execution failed for {self.engine.path} (batch {batch}, {width} tokens); see the TensorRT log.")
        cuda_call(rt.cudaMemcpyAsync(out.ctypes.data, self._logits_ptr, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream),
                  "cudaMemcpyAsync(logits)")
        cuda_call(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return out

    def _bind(self, name: str, ptr: int, shape: tuple[int, ...] | None = None) -> None:
        ctx = self._context
        if shape is not None and not ctx.set_input_shape(name, shape):
            raise RequestError(f"TensorRT rejects shape {shape} for {name} in profile {self._profile} of {self.engine.path}.")
        if not ctx.set_tensor_address(name, ptr):
            raise EngineError(f"TensorRT rejects the address of {name}.")

    def close(self) -> None:
        """Free the device buffers and the stream (also on garbage collection)."""
        rt, ptrs, self._ptrs = getattr(self, "_rt", None), getattr(self, "_ptrs", []), []
        if rt is not None and getattr(self, "_stream", None) is not None:
            rt.cudaSetDevice(self.device_index)
            rt.cudaStreamSynchronize(self._stream)
            for ptr in ptrs:
                rt.cudaFree(ptr)
            rt.cudaStreamDestroy(self._stream)
            self._stream = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: cudart may already be gone
            pass
