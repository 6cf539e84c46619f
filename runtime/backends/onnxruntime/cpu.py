"""Run one engine: ``num_tokens`` new tokens for each row of a batch.

The ONNX Runtime executor binds the KV buffers once as both the cache input
and the updated-cache output (TensorScatter, or specdec's RotaryCachedAttention, then writes in place), and
reuses preallocated output buffers (per cache and call shape), so a decode
step allocates nothing big and copies no cache. The engine's extra inputs and
outputs are bound by name as its config declares them (engine_format.extra_io),
taken from forward(extra_inputs=) and returned in the call's StepOutput.extras.
"""

from __future__ import annotations

import functools
import os
import re
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ....formats.engine_format import EngineDir, ExtraTensor, extra_io
from ....formats.errors import EngineError, RequestError
from ....formats.kv_layout import kv_cache_bytes
from ....hardware.cpu import physical_memory_bytes
from ...kv_cache import KVCache
from ..base import Placement, StepOutput, check_extra_inputs, fill_tree, plan_step, refuse_trees
from .network_io import check_network_io


class ApproximateTreesWarning(UserWarning):
    """An engine built with --cpu_kernels specdec before specdec's attention took trees: its trees run ONNX Runtime's
    Attention, exact only up to near-ties (docs/precision.md#attention-over-a-tree)."""


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


# -- the Backend protocol (runtime/backends/base.py) --------------------------------------
def make_executor(engine: EngineDir, placement: Placement) -> OrtExecutor:
    return OrtExecutor(engine, num_threads=placement.num_threads)


def device_count() -> int:
    return 1  # the CPU is one device


def check_placement(engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
    """Nothing to refuse up front: the KV cache is host memory, allocated when an engine opens."""


def check_host_memory(engine: EngineDir) -> None:
    """The engine's KV cache (max_batch_size slots, float32) must fit this machine's physical memory: the builder refuses
    limits that do not (builder/validation.py), and an engine built on a bigger machine, or a config.json edited
    after the build, is refused here in one line, before anything is allocated."""
    m, b = engine.config.model, engine.config.build
    need, host = kv_cache_bytes(m, b.max_batch_size, b.kv_capacity), physical_memory_bytes()
    if host is not None and need > host:
        raise EngineError(f"{engine.path}: max_seq_len={b.max_seq_len} with max_batch_size={b.max_batch_size} needs a KV cache of {need / 2**30:.1f} "
                          "GiB, "
                          f"more than this machine's physical memory ({host / 2**30:.1f} GiB): run it on a bigger host, or rebuild it with lower "
                          "limits.")


class OrtExecutor:
    """The onnxruntime backend's executor on the CPU (implements runtime.backends.base.Executor)."""

    device = "cpu"

    def __init__(self, engine: EngineDir, num_threads: int | None = None):
        import onnxruntime as ort

        build = engine.config.build
        if build.lowering == "ort_cuda" and (build.attends_with_gqa or build.dtype != "float32"):
            # GroupQueryAttention's host-side total_sequence_length and float16/bfloat16 compute: the CUDA provider's, not the CPU's
            # (a float32 ort_cuda engine with masked attention runs here: the lowering's CPU check)
            gpu = ("run it on an NVIDIA GPU (--device cuda, onnxruntime-gpu)" if build.dtype != "float32" else
                   "ONNX Runtime's CUDA GroupQueryAttention takes float16/bfloat16 only, so rebuild it with --dtype bfloat16 for a GPU")
            attention = "GroupQuery" if build.attends_with_gqa else "masked"
            raise EngineError(f"{engine.path} was built for ONNX Runtime's CUDA provider (--lowering ort_cuda, {build.dtype}, "
                              f"{attention} attention): {gpu}, or rebuild it without --lowering to run on the CPU.")
        self.engine = engine
        self._name = str(engine.path)  # for plan_step's errors, made once rather than on every forward
        self._min_width = engine.config.build.min_step_width  # (a property: read once)
        self.model = engine.config.model
        self.build = engine.config.build
        opts = session_options(num_threads)
        record = self.build.weight_only
        if self.build.cpu_kernels == "specdec":  # int4 layers on specdec's Q4Gemm op, attention on its own (plugins/cpu_kernels.py)
            from ....hardware.cpu_kernels import LAYOUT, KernelBuildError, kernel_library

            try:  # (a float engine holds no Q4Gemm weights, whose layout the library must read: its attention only)
                library = kernel_library(record.get("kernel_layout", 0) if record else LAYOUT)
                opts.register_custom_ops_library(str(library))
            except KernelBuildError as err:
                raise EngineError(f"{engine.path} was built with --cpu_kernels specdec: {err}") from None
            except Exception as err:  # onnxruntime's own errors are untyped
                raise EngineError(f"{engine.path} was built with --cpu_kernels specdec and specdec's CPU kernel library (int4/int8 GEMMs, "
                                  f"attention) does not load here ({err}); rebuild the engine with --cpu_kernels ort") from err
        try:
            self.session = ort.InferenceSession(str(engine.network_path), opts, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's own errors are untyped
            missing = re.search(r"ai\.specdec\.cpu:(\w+)\(-?\d+\) is not a registered function/op", str(err))
            if missing:  # an op a later specdec added (RotaryCachedAttention, SwiGLU came after CachedAttention)
                raise EngineError(f"{engine.path} runs specdec's CPU op {missing.group(1)}, which this specdec's kernels do not have: the "
                                  "engine was built by a newer specdec. Run it with that version, or rebuild it with this one.") from None
            raise EngineError(f"ONNX Runtime could not load {engine.network_path}: {err}") from err
        check_network_io(engine, self.session.get_inputs(), self.session.get_outputs())
        # (a float tree engine with specdec's ops, no weight-only record, is never older than its attention's trees)
        if self.build.tree_attention and self.build.cpu_kernels == "specdec" and record and record.get("attention_op", "Attention") == "Attention":
            warnings.warn(f"{engine.path} verifies trees with ONNX Runtime's Attention (it was built before specdec's attention took trees): "
                          "its greedy tree output equals target-only's only up to near-ties. Rebuild it with this specdec for trees "
                          "verified bit for bit (docs/precision.md#attention-over-a-tree).", ApproximateTreesWarning, stacklevel=3)
        self._ort = ort
        self._cache_values: tuple[tuple, list] | None = None  # (cache key, its OrtValues): made once per slot range
        # per cache, its call shapes' buffers: what a call returns is overwritten by the next call of that shape on that
        # cache only (never by a call on another cache), and goes with the cache
        self._ios: weakref.WeakKeyDictionary[KVCache, dict[tuple[int, int, int], _StepIO]] = weakref.WeakKeyDictionary()
        self._last_ios: tuple[weakref.ref, dict] = (lambda: None, {})  # (the last cache, its buffers): most calls are on it
        check_host_memory(engine)
        self._decode_width = max(2, self.build.max_draft_len + 1)  # widest decode step: its buffers stay
        self._steps = np.arange(max(self.build.max_input_len, self.build.kv_capacity), dtype=np.int64)
        self.vocab_size = self.model.vocab_size
        # the inputs and outputs the engine has beyond the ABI's, bound by name as its config declares them
        self._extra_in, self._extra_out = extra_io(self.model, self.build)
        self.extra_inputs = frozenset(t.name for t in self._extra_in)
        self.extra_outputs = frozenset(t.name for t in self._extra_out)
        self._per_token = frozenset(t.name for t in self._extra_out if t.per_token)  # cut by StepPlan.trim
        self.tree_attention = bool(self.build.tree_attention)  # a tree_mask input: forward(parents=...) verifies trees
        self._plain_calls = not self.tree_attention and not self._extra_in  # forward's calls may take _plain_forward
        self._warm_up()

    def use_session(self, session) -> None:
        """Run on another ONNX Runtime session of the same engine (a benchmark's: its profiler on, another kernel
        library): every call shape binds again on it."""
        self.session = session
        self._ios = weakref.WeakKeyDictionary()
        self._last_ios = (lambda: None, {})
        self._cache_values = None

    def _warm_up(self) -> None:
        """ONNX Runtime plans memory on its first runs: do that at load, not in the first request's latency."""
        for width in (2, 1):
            cache = self.new_cache(1)
            inputs = {t.name: np.zeros((1, width, *t.tail), np.float32) for t in self._extra_in}
            self.forward(cache, [[0] * width], all_logits=True, extra_inputs=inputs)
        self._cache_values = None  # the warm-up caches' buffers go with them

    # -- cache ------------------------------------------------------------------
    def new_cache(self, num_slots: int) -> KVCache:
        if num_slots > self.build.max_batch_size:
            raise RequestError(f"{num_slots} cache slots exceed {self.engine.path}'s max_batch_size={self.build.max_batch_size}.")
        m = self.model
        return KVCache(m.num_layers, num_slots, m.num_kv_heads, self.build.kv_capacity, m.head_dim, self.build.max_seq_len, self.build.kv_layout)

    def copy_slot(self, cache: KVCache, src: int, dst: int) -> None:
        cache.copy_host_slot(src, dst)

    def clear_slot(self, cache: KVCache, slot: int) -> None:
        cache.clear_host_slot(slot)

    def new_prefix_pool(self, num_slots: int) -> KVCache:
        """Host storage for cached prefixes (numpy zeros: pages are committed only as entries fill them)."""
        m = self.model
        return KVCache(m.num_layers, num_slots, m.num_kv_heads, self.build.kv_capacity, m.head_dim, self.build.max_seq_len, self.build.kv_layout)

    def copy_prefix(self, src: KVCache, src_slot: int, dst: KVCache, dst_slot: int, length: int) -> None:
        dst.copy_host_prefix(src, src_slot, dst_slot, length)

    def compact_slot(self, cache: KVCache, slot: int, start: int, keep: Sequence[int]) -> None:
        """After a tree step fed at ``start``: move the K/V of the call's tokens ``keep`` (ascending, keep[0] = 0)
        to slots start, start + 1, ... and set the slot's length to start + len(keep)."""
        cache.compact_host_slot(slot, start, keep)

    def _bind_cache(self, io: _StepIO, cache: KVCache, first: int, rows: int) -> None:
        # Hold the cache itself, not its id(): a new cache may reuse a freed one's id,
        # and the binding would then point ONNX Runtime at freed memory.
        key = (cache, cache.version, first, rows)
        if io.bound_cache == key[1:]:  # io belongs to this cache (OrtExecutor._io)
            return
        made = self._cache_values
        if made is None or made[0][0] is not cache or made[0][1:] != key[1:]:
            # a range of slots is a contiguous view of the [num_slots, ...] buffer: no copy
            values = [self._ort.OrtValue.ortvalue_from_numpy(arr[first : first + rows]) for arr in (*cache.keys, *cache.values)]
            made = self._cache_values = (key, values)
        layers = len(cache.keys)
        for i in range(layers):
            for kind, ov in (("key", made[1][i]), ("value", made[1][layers + i])):
                io.binding.bind_ortvalue_input(f"past_{kind}.{i}", ov)
                io.binding.bind_ortvalue_output(f"present_{kind}.{i}", ov)
        io.bound_cache = key[1:]

    # -- compute ----------------------------------------------------------------
    def forward(
        self,
        cache: KVCache,
        tokens: Sequence[Sequence[int]] | np.ndarray,
        all_logits: bool,
        advance: np.ndarray | None = None,
        first_slot: int = 0,
        parents: Sequence[np.ndarray | None] | None = None,
        extra_inputs: Mapping[str, np.ndarray] | None = None,
    ) -> StepOutput:
        """Append ``tokens[i]`` to slot ``first_slot + i`` of ``cache``; its logits and the engine's extra outputs.

        tokens: one sequence per slot of the range (ragged allowed, each non-empty).
        logits: ``[n, num_tokens, vocab]`` if ``all_logits`` (rows past a
        row's own count are padding), else ``[n, 1, vocab]`` for each
        row's last token. The arrays are this cache's buffers for the call's shape, reused by its next call of that shape: copy to keep.
        Rows where ``advance`` is False ride along (a batch runs every row)
        and keep their length: what they wrote is stale at once.
        parents: per row, None (a chain) or the parent of each of its tokens ([len] int, -1 <= parents[j] < j; -1: it follows
            the cache): a tree, each token attending to the cache and its ancestors only, at position length + depth (depth 0
            for parent -1; tree_attention engines).
            The row's K/V land in call order: compact_slot() keeps an accepted path.
        extra_inputs: name -> [n, width, *tail] float32, each of the engine's extra inputs (rows past a row's count: anything).
        """
        if advance is None and parents is None and not extra_inputs and self._plain_calls:
            out = self._plain_forward(cache, tokens, all_logits, first_slot)
            if out is not None:
                return out
        step = plan_step(cache, tokens, advance, first_slot, self._name, self._min_width)
        batch, width = step.ids.shape
        io = self._io(cache, batch, width, width if all_logits else 1)
        io.ids[...] = step.ids
        np.add(step.lengths[:, None], io.steps, out=io.positions)
        if io.tree is not None:
            fill_tree(io.tree, io.causal, io.tree_rows, io.positions, step.lengths, parents)
        elif parents is not None:
            refuse_trees(parents, self._name)
        if extra_inputs or self._extra_in:
            check_extra_inputs(extra_inputs, self._extra_in, batch, step.tokens, self._name)
            for name, buffer in io.inputs.items():
                buffer[...] = step.widened(extra_inputs[name])
        if not all_logits:
            np.subtract(step.num_new, 1, out=io.index[:, 0])
        self._bind_cache(io, cache, first_slot, batch)
        io.run()
        step.lengths += step.grow
        return step.trim(io.output, self._per_token)

    def _plain_forward(self, cache: KVCache, tokens: Sequence[Sequence[int]] | np.ndarray, all_logits: bool, first_slot: int) -> StepOutput | None:
        """forward() of the calls a round and a draft model make every step (no tree, no extra inputs, every row
        advancing), planned in Python ints: plan_step's checks, the same buffers, written through memoryviews. Right after
        a model call each numpy call costs several microseconds (the call has evicted numpy's code from the CPU's caches),
        and plan_step makes a dozen. None where the call is not one of these or a check fails: forward() then plans it
        with plan_step, which raises the error."""
        if type(tokens) is list:
            if not tokens:
                return None
            lens = list(map(len, tokens))  # (builtins, no Python frame: each costs here)
            batch, width = len(lens), max(lens)
            if min(lens) < 1:
                return None
        elif isinstance(tokens, np.ndarray) and tokens.ndim == 2 and tokens.shape[1] >= 1:
            batch, width = tokens.shape
            lens = [width] * batch
        else:
            return None
        if width < self._min_width or first_slot < 0 or first_slot + batch > len(cache.lengths):
            return None
        held = cache.lengths_view
        lengths = held[first_slot : first_slot + batch].tolist()
        if max(lengths) + width > cache.capacity:
            return None
        for length, n in zip(lengths, lens, strict=True):
            if length + n > cache.max_seq_len:
                return None
        io = self._io(cache, batch, width, width if all_logits else 1)
        if width > self._decode_width or type(tokens) is not list:  # a prompt, or an array: numpy fills it at once
            if batch == 1 or min(lens) == width:
                io.ids[...] = tokens
            else:
                for row, t in enumerate(tokens):
                    io.ids[row, : lens[row]] = t
                    io.ids[row, lens[row] :] = 0
            np.add(cache.lengths[first_slot : first_slot + batch, None], io.steps, out=io.positions)
        elif width == 1 and batch == 1:  # one token (target-only decoding, a draft model's steps): two ints
            io.flat_ids[0], io.flat_positions[0] = tokens[0][0], lengths[0]
        else:  # a decode step: a few ints a row ([batch, width] ids zero-padded, as pad_tokens pads them; positions)
            ids, positions = io.flat_ids, io.flat_positions
            for row, t in enumerate(tokens):
                at, length = row * width, lengths[row]
                for j, token in enumerate(t):
                    ids[at + j] = token
                for j in range(lens[row], width):
                    ids[at + j] = 0
                for j in range(width):
                    positions[at + j] = length + j
        if not all_logits:
            for row, n in enumerate(lens):
                io.flat_index[row] = n - 1
        self._bind_cache(io, cache, first_slot, batch)
        io.run()
        if batch == 1:  # (the loop's own iterators cost microseconds here: the run has evicted the interpreter's state)
            held[first_slot] = lengths[0] + lens[0]
        else:
            for row, (length, n) in enumerate(zip(lengths, lens, strict=True)):
                held[first_slot + row] = length + n
        return io.output

    def _io(self, cache: KVCache, batch: int, width: int, rows: int) -> _StepIO:
        """Input/output buffers and an I/O binding for one call shape on ``cache``, bound once and then filled in
        place: rebinding three inputs and the output every step cost ~100 us, a fifth of a step, and
        with one binding per shape a loop that alternates widths (draft_len=auto, n-gram misses) does
        not rebind either (alternating widths 1 and 3 cost 7-15% more per step with one binding)."""
        key = (batch, width, rows)
        last_cache, ios = self._last_ios  # the cache of the previous call (a weak reference): no WeakKeyDictionary lookup
        if last_cache() is not cache:
            ios = self._ios.get(cache)
            if ios is None:
                ios = self._ios[cache] = {}
            self._last_ios = (weakref.ref(cache), ios)
        io = ios.get(key)
        if io is None:
            if width > self._decode_width:  # prompt widths vary per request: keep only the latest one
                for old in [k for k in ios if k[1] > self._decode_width]:
                    del ios[old]
            io = ios[key] = _StepIO(batch, width, rows, self.vocab_size, self.tree_attention, self._extra_in, self._extra_out)
            io.steps = self._steps[:width]  # [width] 0, 1, ...: a row's positions past its length
            ort, b = self._ort, self.session.io_binding()
            io.binding = b
            b.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(io.ids))
            b.bind_ortvalue_input("position_ids", ort.OrtValue.ortvalue_from_numpy(io.positions))
            b.bind_ortvalue_input("logits_index", ort.OrtValue.ortvalue_from_numpy(io.index))
            b.bind_output("logits", "cpu", 0, np.float32, list(io.logits.shape), io.logits.ctypes.data)
            if io.tree is not None:
                b.bind_ortvalue_input("tree_mask", ort.OrtValue.ortvalue_from_numpy(io.tree))
            for name, arr in io.inputs.items():
                b.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))
            for name, arr in io.outputs.items():
                b.bind_output(name, "cpu", 0, np.float32, list(arr.shape), arr.ctypes.data)
            io.run = direct_run(self.session, b)
        return io


def session_options(num_threads: int | None = None):
    """A CPU engine's ONNX Runtime session options (onnxruntime.SessionOptions), before any custom op library."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = num_threads or _default_threads()
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    # Fold DequantizeLinear of constant FP8 weights into float32 once, at load: the CPU
    # has no FP8 GEMM, and dequantizing every step would cost more than the MatMul.
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    # ONNX Runtime's worker threads spin while they wait for work, and by default go on spinning after a run returns: a
    # core each, burnt while Python does a round's work, and taken from the draft's session, the server, other processes
    # (the 1.5B int4 step at 2 threads beside one busy process: 84 ms spinning on, 30 ms stopped at each run's end).
    # $SPECDEC_ORT_SPIN: stop (default: spin within a run only), on (ONNX Runtime's default), off (never spin: for cores
    # shared with other busy processes, as OMP_WAIT_POLICY=passive).
    spin = os.environ.get("SPECDEC_ORT_SPIN", "stop")
    if spin not in SPIN_POLICIES:
        raise EngineError(f"SPECDEC_ORT_SPIN={spin!r}: expected one of {', '.join(SPIN_POLICIES)}.")
    for key, value in SPIN_POLICIES[spin].items():
        opts.add_session_config_entry(key, value)
    return opts


SPIN_POLICIES = {"stop": {"session.force_spinning_stop": "1"}, "on": {}, "off": {"session.intra_op.allow_spinning": "0"}}


def direct_run(session, binding) -> Callable[[], None]:
    """session.run_with_iobinding(binding) as one call: the C++ session's own, without the Python wrapper's WebGPU
    graph-capture checks (a CPU session never captures; three Python calls and a lookup a step) where this
    onnxruntime exposes it, else the wrapper."""
    native_session, native_binding = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
    if native_session is None or native_binding is None or not hasattr(native_session, "run_with_iobinding"):
        return functools.partial(session.run_with_iobinding, binding)
    return functools.partial(native_session.run_with_iobinding, native_binding, None)


class _StepIO:
    """The buffers of one call shape (batch, tokens, logit rows)."""

    def __init__(self, batch: int, width: int, rows: int, vocab: int, tree: bool, extra_in: Sequence[ExtraTensor], extra_out: Sequence[ExtraTensor]):
        self.ids = np.zeros((batch, width), np.int64)
        self.positions = np.zeros((batch, width), np.int64)
        # all rows' logits, or (filled per call) each row's last real token
        self.index = np.broadcast_to(np.arange(rows, dtype=np.int64), (batch, rows)).copy()
        self.logits = np.empty((batch, rows, vocab), np.float32)
        self.causal = np.tril(np.ones((width, width), bool)) if tree else None
        self.tree = np.broadcast_to(self.causal, (batch, width, width)).copy() if tree else None  # [batch, width, width]
        self.tree_rows: list[int] = []  # rows the last call filled with a tree (reset to causal by the next)
        # the engine's extra inputs (zeroed: a row's padding is read) and outputs, by name
        self.inputs = {t.name: np.zeros(t.shape(batch, width, rows), np.float32) for t in extra_in}  # forward(extra_inputs=) fills them
        self.outputs = {t.name: np.empty(t.shape(batch, width, rows), np.float32) for t in extra_out}
        self.output = StepOutput(self.logits, self.outputs)  # what every call of this shape returns
        self.binding = None  # this shape's IOBinding (OrtExecutor._io)
        self.run: Callable[[], None] = lambda: None  # runs the session on this binding (direct_run)
        self.steps = np.arange(width, dtype=np.int64)
        # the int64 inputs as flat memoryviews (row * width + column): a decode step writes a few ints without numpy calls
        self.flat_ids, self.flat_positions, self.flat_index = (memoryview(a).cast("B").cast("q") for a in (self.ids, self.positions, self.index))
        self.bound_cache: tuple | None = None  # (version, first slot, rows): the range of its cache bound to it
