"""ort_cuda's attention for engines that verify drafts or trees: TensorScatter + ONNX Attention with a device mask.

Why not GroupQueryAttention for these: ONNX Runtime 1.31's CUDA GQA refuses
several new tokens per row together with a past above batch 1, and takes no
per-row tree mask; a verification step of a batch would be one call per row.
This form is the portable lowering's (the one TensorRT parses and every test
checks against), made fit for CUDA graphs and half precision:

* The cache is ``[batch, kv_capacity, kv_heads * head_dim]`` (bsh, as
  ort_cpu's) in the compute dtype: q/k/v stay 3-D end to end, so no
  Transpose per layer. ``TensorScatter`` writes each row's new K/V at its own
  length, in place (the executor binds one buffer as past and present).
* Attention spans the whole cache, with an additive mask and a per-row bound
  (``nonpad_kv_seqlen``, opset 24) that are computed **on the device** from
  position_ids (and tree_mask): no ReduceMax read back to the host, no host
  input, the same shapes at every step of a (batch, width) bucket, so every
  decode and verification shape can be replayed as a CUDA graph.
* The mask: a chain token at position p sees slots <= p; a tree token
  (tree_attention engines: Medusa/EAGLE targets, EAGLE modules) sees the slots
  before the call and the call's slots of its ancestors (tree_mask), as
  plugins/attention.py's portable tree mask, but as a boolean matrix product
  (call token i's slot is first + i) instead of GatherElements with a clamp
  whose bound would be a host value.
* No padding nodes for one-token steps: in an engine that verifies drafts the
  executors feed every step at least two tokens per row (a second one rides
  along, BuildConfig.min_step_width), so a one-token step and a (k+1)-token
  verification run the same kernels and give the same bits.

Rotary is ONNX ``RotaryEmbedding`` on 3-D q and k (``num_heads``), which the
CUDA provider runs in float16/bfloat16.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .attention import Shared
from .ort_cuda import OrtCudaBase

# The mask's "not visible": the lowest finite value of the compute dtype (a finite value keeps a kernel's running
# max finite where a block of keys is all masked; -inf could give inf - inf there).
_LOWEST = {TensorProto.FLOAT: float(np.finfo(np.float32).min), TensorProto.FLOAT16: float(np.finfo(np.float16).min),
           TensorProto.BFLOAT16: float(np.array([0xFF7F0000], np.uint32).view(np.float32)[0])}


class OrtCudaMaskedAttention(OrtCudaBase):
    """ort_cuda with TensorScatter + ONNX Attention and a device-computed mask (cuda_attention masked)."""

    kv_layout = "bsh"

    def prelude(self, shared: Shared) -> Shared:
        gb, p = self.gb, "/model/attn_prelude"
        i64 = lambda n, v: gb.const(f"{p}/{n}", np.array(v, np.int64))  # noqa: E731
        self._axis1, self._zero1 = i64("axis1", [1]), i64("zero1", [0])
        first = gb.op("Gather", [shared.positions, i64("idx0", 0)], f"{p}/write_index", axis=1)  # [B]: each row's first new slot
        steps = gb.op("Shape", [shared.positions], f"{p}/step_shape")  # [2]: B, S (host: shapes live on the CPU)
        tokens = gb.op("Slice", [steps, i64("one_1d", [1]), i64("two_1d", [2])], f"{p}/num_tokens")  # [1]: S
        if shared.capacity < 1:
            raise ValueError("the masked ort_cuda attention needs Shared.capacity (the engine's kv_capacity)")
        slots = gb.const(f"{p}/slots", np.arange(shared.capacity, dtype=np.int64))  # [L]: every cache slot
        call = gb.op("Slice", [slots, self._zero1, tokens], f"{p}/call_index")  # [S]: 0 .. S-1
        call_slots = gb.op("Add", [gb.op("Unsqueeze", [first, self._axis1], f"{p}/first_col"), call], f"{p}/call_slots")  # [B, S]
        # each row attends to keys [0, last call slot + 1): the bound a kernel may use to skip the rest of the cache
        self._kv_len = gb.op("Add", [gb.op("Gather", [call_slots, i64("idx_last", -1)], f"{p}/last_slot", axis=1), i64("one", 1)], f"{p}/kv_len")
        if self.tree_attention:
            visible = self._tree_visible(p, first, call_slots, slots)
        else:  # a chain: token j at position p_j sees slots <= p_j
            visible = gb.op("LessOrEqual", [slots, gb.op("Unsqueeze", [shared.positions, i64("axis_last", [-1])], f"{p}/pos_col")], f"{p}/visible")
        t = gb.compute_type
        zero, lowest = (gb.op("Cast", [gb.const(f"{p}/{n}", np.array(v, np.float32))], f"{p}/{n}_compute", to=t) if t != TensorProto.FLOAT
                        else gb.const(f"{p}/{n}", np.array(v, np.float32)) for n, v in (("mask_zero", 0.0), ("mask_lowest", _LOWEST[t])))
        bias = gb.op("Unsqueeze", [gb.op("Where", [visible, zero, lowest], f"{p}/mask_bias"), self._axis1], f"{p}/mask")  # [B, 1, S, L]
        self._bias = bias
        self._cos, self._sin = (gb.op("Cast", [c], f"{p}/rope_{n}", to=t) if t != TensorProto.FLOAT else c
                                for n, c in (("cos", shared.cos), ("sin", shared.sin)))
        shared.write_index = first
        return shared

    def _tree_visible(self, p: str, first: str, call_slots: str, slots: str) -> str:
        """[B, S, L]: slot s < first (the cache before the call), or s = first + i for a call token i with tree_mask[b, j, i]."""
        gb = self.gb
        tree = gb.input("tree_mask", TensorProto.BOOL, ["batch", "num_tokens", "num_tokens"])
        before = gb.op("Less", [slots, gb.op("Unsqueeze", [first, self._axis1], f"{p}/first_col2")], f"{p}/before_call")  # [B, L]
        at = gb.op("Equal", [gb.op("Unsqueeze", [call_slots, gb.const(f"{p}/axis_last2", np.array([-1], np.int64))], f"{p}/call_slot_col"), slots],
                   f"{p}/call_token_slot")  # [B, S, L]: call token i sits at slot s
        f32 = TensorProto.FLOAT
        hits = gb.op("MatMul", [gb.op("Cast", [tree], f"{p}/tree_f", to=f32), gb.op("Cast", [at], f"{p}/slot_f", to=f32)],
                     f"{p}/tree_slots")  # [B, S, L]
        in_tree = gb.op("Greater", [hits, gb.const(f"{p}/half", np.array(0.5, np.float32))], f"{p}/tree_part")
        return gb.op("Or", [gb.op("Unsqueeze", [before, self._axis1], f"{p}/before_rows"), in_tree], f"{p}/visible")

    def layer(self, prefix: str, q: str, k: str, v: str, layer: int, shared: Shared) -> str:
        """q [B,S,nh*hd], k/v [B,S,kvh*hd] -> [B,S,nh*hd]."""
        gb, cfg = self.gb, self.cfg
        q = gb.op("RotaryEmbedding", [q, self._cos, self._sin, shared.positions], f"{prefix}/q_rope", num_heads=cfg.num_heads)
        k = gb.op("RotaryEmbedding", [k, self._cos, self._sin, shared.positions], f"{prefix}/k_rope", num_heads=cfg.num_kv_heads)
        full = self.write_cache(prefix, k, v, layer, shared, gb.compute_type)  # attention reads the whole caches: masked, bounded per row
        out = gb.op(
            "Attention",
            [q, full[0], full[1], self._bias, "", "", self._kv_len],
            f"{prefix}/attention",
            q_num_heads=cfg.num_heads,
            kv_num_heads=cfg.num_kv_heads,
            scale=float(cfg.head_dim) ** -0.5,
        )
        # ONNX shape inference gives 3-D grouped Attention the width of V (kv heads), not of Q: say what it is
        width = gb.const(f"{prefix}/o_shape", np.array([0, 0, cfg.num_heads * cfg.head_dim], np.int64))
        return gb.op("Reshape", [out, width], f"{prefix}/o_flat")
