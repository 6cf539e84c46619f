"""The CUDA executor's device buffers: the KV cache of a ``new_cache`` and the inputs/outputs of one call shape.

* ``CudaKVCache``: every layer's K and V in **one** device allocation
  ``[2 * layers, slots, *slot shape]`` (past_key.0, past_value.0, past_key.1, ...), so that moving a token's K/V
  in every layer (a slot copy, a tree's accepted path) is one 2-D copy rather than one per layer.
* ``StepIO``: everything bound for one call shape (first slot, rows, tokens, logit rows). Its inputs (ids,
  positions, logit rows, a tree engine's tree_mask, the engine's extra inputs) share one host staging
  buffer and one device buffer, each bound at its offset with its own type: a step costs **one** host-to-device
  copy. Its outputs (logits and the engine's extra outputs, engine_format.extra_io) share one device buffer:
  **one** device-to-host copy. The binding is made once; with CUDA graphs the shape is captured once and replayed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...kv_cache import KVCache
from ..base import StepOutput
from .cuda_host import D2H

CudaExecutor = Any  # cuda.CudaExecutor, which imports this module: named here for the annotations only

ALIGN = 256  # bytes: every section of a packed buffer starts on a boundary any kernel's vector loads accept


class CudaKVCache(KVCache):
    """KVCache bookkeeping (lengths, rollback, room checks) over one device allocation of its own.

    slab: a CUDA OrtValue of ``2 * layers * num_slots * slot_elems`` elements, zeroed once.
    shapes: the call shapes bound to this cache (each a StepIO, maybe a CUDA graph).
    """

    def __init__(self, owner: CudaExecutor, num_slots: int):
        m, b = owner.model, owner.build
        super().__init__(m.num_layers, num_slots, m.num_kv_heads, b.kv_capacity, m.head_dim, b.max_seq_len, b.kv_layout, storage=False)
        self.owner = owner
        self.slot_bytes = owner.slot_bytes
        self.layer_bytes = num_slots * self.slot_bytes  # one (layer, K|V) part
        owner._rt.set_device(owner.device_id)
        count = 2 * m.num_layers * num_slots * (self.slot_bytes // owner.cache_itemsize)
        self.slab = owner._ort.OrtValue.ortvalue_from_shape_and_type([count], owner.cache_elem, "cuda", owner.device_id)
        # zeroed once: positions past a slot's length are masked, but must never hold NaN/Inf garbage
        owner._rt.memset(self.slab.data_ptr(), 2 * m.num_layers * self.layer_bytes)
        owner._rt.synchronize()  # cudaMemset may return early; ONNX Runtime's stream does not wait for the legacy one
        self.shapes: dict[tuple[int, int, int, int, int], StepIO] = {}

    def ptr(self, part: int, slot: int) -> int:
        """Device address of (layer, K|V) part ``part`` (2 * layer + 0|1) at slot ``slot``."""
        return self.slab.data_ptr() + part * self.layer_bytes + slot * self.slot_bytes

    def move_positions(self, slot_src: int, slot_dst: int, src: int, dst: int, count: int, source: CudaKVCache | None = None) -> None:
        """Copy positions src..src+count-1 of slot_src to dst.. of slot_dst, in every layer's K and V (not synchronized).
        ``source``: the cache slot_src belongs to (another cache of the same executor: a prefix pool), default this one."""
        ex, source = self.owner, source or self
        m, hd, item = ex.model, ex.model.head_dim, ex.cache_itemsize
        parts = 2 * m.num_layers
        if self.layout == "bsh":  # a position is one row of kv_heads * head_dim: one 2-D copy across all parts
            row = m.num_kv_heads * hd * item
            ex._rt.copy_2d(self.ptr(0, slot_dst) + dst * row, self.layer_bytes, source.ptr(0, slot_src) + src * row, source.layer_bytes,
                          count * row, parts)
            return
        pitch = self.capacity * hd * item  # bnsh: per part, one 2-D copy over the kv heads
        for part in range(parts):
            ex._rt.copy_2d(self.ptr(part, slot_dst) + dst * hd * item, pitch, source.ptr(part, slot_src) + src * hd * item, pitch,
                          count * hd * item, m.num_kv_heads)


def _sections(specs: list[tuple[str, tuple[int, ...], type]]) -> tuple[dict[str, tuple[int, tuple[int, ...], type]], int]:
    """name -> (byte offset, shape, dtype) of each array packed into one buffer, and its total size."""
    out, offset = {}, 0
    for name, shape, dtype in specs:
        out[name] = (offset, shape, dtype)
        offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
    return out, max(offset, ALIGN)


class StepIO:
    """One call shape's buffers and I/O binding. Host views: ids, positions, index, tree, inputs (the engine's extra
    inputs by name), written by the executor before each run, and ``output``, a StepOutput of the logits and the
    engine's extra outputs (valid after ``run``, until the next run of this shape)."""

    def __init__(self, ex: CudaExecutor, cache: CudaKVCache, first: int, n: int, width: int, rows: int, graph_id: int):
        ort, dev = ex._ort, ex.device_id
        ins = [("input_ids", (n, width), np.int64), ("position_ids", (n, width), np.int64), ("logits_index", (n, rows), np.int64)]
        if ex.tree_attention:
            ins.append(("tree_mask", (n, width, width), np.bool_))
        # the engine's extra inputs and outputs (engine_format.extra_io: float32, per fed token or per logits row)
        ins += [(t.name, t.shape(n, width, rows), np.float32) for t in ex.extra_in]
        outs = [("logits", (n, rows, ex.vocab_size), np.float32)] + [(t.name, t.shape(n, width, rows), np.float32) for t in ex.extra_out]
        in_sec, in_bytes = _sections(ins)
        out_sec, out_bytes = _sections(outs)
        self.host_in, self.host_out = np.zeros(in_bytes, np.uint8), np.zeros(out_bytes, np.uint8)
        self.dev_in = ort.OrtValue.ortvalue_from_shape_and_type([in_bytes], np.uint8, "cuda", dev)
        self.dev_out = ort.OrtValue.ortvalue_from_shape_and_type([out_bytes], np.uint8, "cuda", dev)
        def view(buf, sec, name):  # sec[name]: (byte offset, shape, dtype) of one array in the buffer
            start, shape, dtype = sec[name]
            return buf[start : start + int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

        self.ids, self.positions, self.index = (view(self.host_in, in_sec, k) for k in ("input_ids", "position_ids", "logits_index"))
        self.index[:] = np.arange(rows)
        self.tree = view(self.host_in, in_sec, "tree_mask") if "tree_mask" in in_sec else None  # [n, width, width]
        self.causal = np.tril(np.ones((width, width), bool))
        if self.tree is not None:
            self.tree[:] = self.causal
        self.tree_rows: list[int] = []  # rows the last call made trees (base.fill_tree resets them)
        self.inputs = {t.name: view(self.host_in, in_sec, t.name) for t in ex.extra_in}  # [n, width, *tail] each
        self.output = StepOutput(view(self.host_out, out_sec, "logits"), {t.name: view(self.host_out, out_sec, t.name) for t in ex.extra_out})
        self.total = np.zeros((), np.int32)  # a GQA engine's host-side attention bound (cuda.attention_bound)
        b = self.binding = ex.session.io_binding()
        for name, (off, shape, dtype) in in_sec.items():
            b.bind_input(name, "cuda", dev, dtype, list(shape), self.dev_in.data_ptr() + off)
        for name, (off, shape, dtype) in out_sec.items():
            b.bind_output(name, "cuda", dev, dtype, list(shape), self.dev_out.data_ptr() + off)
        if ex.has_total:
            b.bind_input("total_sequence_length", "cpu", 0, np.int32, [], self.total.ctypes.data)
        for part, name in enumerate(ex.kv_names):
            ptr, shape = cache.ptr(part, first), [n, *ex.slot_shape]
            b.bind_input(name, "cuda", dev, ex.cache_elem, shape, ptr)
            b.bind_output(name.replace("past_", "present_"), "cuda", dev, ex.cache_elem, shape, ptr)  # in place
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("gpu_graph_id", str(graph_id))  # -1: run without a graph
        ex._configure_run(self.run_options, width, rows)

    def run(self, ex: CudaExecutor) -> None:
        """Inputs to the device (one copy), the network, outputs back (one copy)."""
        ex._rt.set_device(ex.device_id)
        self.dev_in.update_inplace(self.host_in)
        ex.session.run_with_iobinding(self.binding, self.run_options)
        ex._rt.copy(self.host_out.ctypes.data, self.dev_out.data_ptr(), self.host_out.nbytes, D2H)

