"""Attention with a runtime-owned, static-capacity KV cache.

The cache of layer i is a graph input ``past_key.i`` (``[batch, kv_heads,
capacity, head_dim]`` here; ``[batch, capacity, kv_heads * head_dim]`` in the
ort_cpu lowering); the updated cache is the output ``present_key.i``.
The runtime binds the same buffer to both, so TensorScatter writes the new
K/V in place. Each token's cache slot is its position, so rolling back
rejected drafts is only moving the runtime's per-row length back: stale
slots past it are masked (slot j is visible to a token at position p iff
j <= p) and later overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from ..formats.engine_format import ModelConfig
from .graph_api import GraphOps
from .quantized_gemm import IntWeightLike, dq_matmul, permute_input


@dataclass
class Shared:
    """Values computed once per graph and used by every layer."""

    positions: str  # [batch, num_tokens] int64
    cos: str  # [capacity, head_dim/2] float32
    sin: str
    write_index: str = ""  # [batch] int64: the first new slot of each row
    mask: str = ""  # [batch, 1, num_tokens, live_len] bool
    live_len: str = ""  # [1] int64: longest live row, bounds attention cost
    capacity: int = 0  # the engine's kv_capacity (cache slots per row), for lowerings that index every slot


class AttentionLowering:
    name = "base"
    # Set for engines that verify drafts: a one-token step computes every row with the kernels a
    # (k + 1)-token verification step uses, so the two give the same bits (docs/precision.md).
    consistent_rows = False
    probe_rows = 10  # with consistent_rows: the most rows a call verifies (max_batch_size * (max_draft_len + 1), + 1 padded)
    step_padding_needed = False  # set while building when some GEMM needs pad_step's even rows
    # Set for engines that verify (or draft) a tree of tokens in one call: a tree_mask input says which of the
    # call's tokens each one attends to (its ancestors and itself); the cache before the call is visible to all.
    tree_attention = False
    # specdec: int4 / int8 weights on Q4Gemm / Q8Gemm, chain attention on RotaryCachedAttention, other MLP gates on SwiGLU, where the
    # lowering has them (ort_cpu)
    cpu_kernels = "ort"
    q4gemm_layers = 0  # set while building: the layers written as Q4Gemm / Q8Gemm
    kernel_ops: frozenset[str] = frozenset()  # set while building: which of the two
    attention_op = "Attention"  # what the layers' attention lowers to (an engine built with --cpu_kernels specdec records it)
    swiglu_layers = 0  # MLP gates on specdec's SwiGLU op (set while building)
    kv_layout = "bnsh"  # cache layout: bnsh = [batch, kv_heads, capacity, head_dim]; bsh = [batch, capacity, kv_heads * head_dim]
    extra_opsets: dict[str, int] = {}
    extra_inputs: tuple[str, ...] = ()  # graph inputs beyond the engine ABI's (the runtime feeds them)

    @classmethod
    def compute_dtype(cls, build) -> str:
        """The dtype activations (and the KV cache) are computed in: float32 unless a lowering says otherwise."""
        return "float32"

    @classmethod
    def pads_lone_rows(cls, build) -> bool:
        """Whether the graph itself keeps a one-token step on a verification step's kernels (consistent_rows): for
        engines that verify drafts on ONNX Runtime. A lowering whose executor feeds such steps two tokens instead
        (BuildConfig.min_step_width) needs no padding nodes."""
        return build.max_draft_len > 0 and build.backend == "onnxruntime" and build.min_step_width == 1

    @classmethod
    def variant(cls, build) -> type[AttentionLowering]:
        """The class that builds ``build``'s network: this one, unless a lowering has several forms (ort_cuda)."""
        return cls

    def __init__(self, gb: GraphOps, cfg: ModelConfig):
        self.gb, self.cfg = gb, cfg

    def prelude(self, shared: Shared) -> Shared:
        raise NotImplementedError

    def pad_step(self, ids: str, positions: str) -> tuple[str, str]:
        """In an engine that verifies drafts (not a tree engine): ids, positions [B, S] as every layer reads them.
        A lowering whose kernels need even row counts pads here, once per step; this one needs nothing."""
        return ids, positions

    def layer(self, prefix: str, q: str, k: str, v: str, layer: int, shared: Shared) -> str:
        """q: [B,S,nh*hd], k/v: [B,S,kvh*hd] (after any q/k norm) -> [B,S,nh*hd]."""
        raise NotImplementedError

    def cache_shape(self) -> list[int | str]:
        cfg = self.cfg
        if self.kv_layout == "bnsh":
            return ["batch", cfg.num_kv_heads, "kv_capacity", cfg.head_dim]
        return ["batch", "kv_capacity", cfg.num_kv_heads * cfg.head_dim]

    def cache_io(self, layer: int, elem_type: int = TensorProto.FLOAT) -> tuple[list[str], list[str]]:
        """The layer's cache as graph inputs [past_key, past_value] and outputs [present_key, present_value], whole caches
        of cache_shape() (the runtime binds each pair to one buffer: the op that writes present writes in place)."""
        gb, shape = self.gb, self.cache_shape()
        past = [gb.input(f"past_{kind}.{layer}", elem_type, shape) for kind in ("key", "value")]
        present = [f"present_{kind}.{layer}" for kind in ("key", "value")]
        for name in present:
            gb.output(name, elem_type, shape)
        return past, present

    def write_cache(self, prefix: str, k: str, v: str, layer: int, shared: Shared, elem_type: int = TensorProto.FLOAT) -> list[str]:
        """The layer's past_key/past_value inputs with k/v written at each row's write_index (TensorScatter, in place when
        the runtime binds one buffer as past and present): [present_key, present_value], the whole caches."""
        pasts, presents = self.cache_io(layer, elem_type)
        for kind, new, past, present in zip(("key", "value"), (k, v), pasts, presents, strict=True):
            # the capacity axis is -2 of either layout
            self.gb.op("TensorScatter", [past, new, shared.write_index], f"{prefix}/{kind}_cache_update", outputs=[present], axis=-2)
        return presents

    def cached_attention(self, prefix: str, q: str, k: str, v: str, layer: int, shared: Shared) -> str:
        """Write k/v into the layer's cache in place, then attend over its live slots."""
        gb, cfg = self.gb, self.cfg
        live = [gb.op("Slice", [present, self._zero, shared.live_len, self._cache_axis], f"{prefix}/{kind}_live")
                for kind, present in zip(("key", "value"), self.write_cache(prefix, k, v, layer, shared), strict=True)]
        if self.consistent_rows:  # a lone query row takes another kernel: give it a zero partner
            q = gb.op("Pad", [q, self._query_pads], f"{prefix}/two_query_rows")
        out = gb.op(
            "Attention",
            [q, live[0], live[1], shared.mask],
            f"{prefix}/attention",
            q_num_heads=cfg.num_heads,
            kv_num_heads=cfg.num_kv_heads,
            scale=float(cfg.head_dim) ** -0.5,
        )
        if self.consistent_rows:
            out = gb.op("Slice", [out, self._zero, self._num_tokens, self._query_axis], f"{prefix}/drop_query_pad")
        return out

    def int_matmul_parts(self, name: str, x: str, w: IntWeightLike, rows: str, splits: list[int]) -> list[str] | None:
        """x @ deq(w) as its parts along the output axis (widths ``splits``), each its own output of one node; None
        where this lowering has no such node for ``w`` (the caller splits int_matmul's output)."""
        return None

    def int_swiglu(self, name: str, x: str, w: IntWeightLike, rows: str) -> str | None:
        """silu(gate) * up of the gate|up projection x @ deq(w) in one node; None where this lowering has none for ``w``."""
        return None

    def swiglu(self, name: str, y: str, width: int) -> str | None:
        """silu(gate) * up of a computed gate|up projection y [..., 2 * width] in one node; None where this lowering has none
        (the caller splits y)."""
        return None

    def takes_packed_qkv(self) -> bool:
        """Whether ``layer`` takes the fused q|k|v projection as ``q`` (k and v None) instead of three parts."""
        return False

    def silu(self, prefix: str, x: str) -> str:
        """x * sigmoid(x), the MLP's activation."""
        gb = self.gb
        return gb.op("Mul", [x, gb.op("Sigmoid", [x], f"{prefix}/sigmoid")], f"{prefix}/silu")

    def add_norm(self, name: str, x: str, delta: str | None, weight: str) -> tuple[str, str]:
        """(RMSNorm(x + delta), x + delta): the residual add and the next norm."""
        gb = self.gb
        if delta is not None:
            x = gb.op("Add", [x, delta], f"{name}/residual")
        return gb.op("RMSNormalization", [x, weight], name, axis=-1, epsilon=self.cfg.rms_norm_eps), x

    weight_only_op = "DequantizeLinear+MatMul"  # what int_matmul lowers to (recorded in the engine config)

    def int_matmul(self, name: str, x: str, w: IntWeightLike, rows: str) -> str:
        """x [B, S, in] @ deq(w) -> [B, S, out] for a weight-only int8/int4 weight.

        rows: a [B, S] value with x's leading shape (position_ids or logits_index), for lowerings that reshape.
        Standard ONNX: blocked DequantizeLinear feeding MatMul, which TensorRT fuses into a weight-only GEMM.
        """
        return dq_matmul(self.gb, name, permute_input(self.gb, name, x, w), w)


class PortableAttention(AttentionLowering):
    name = "portable"

    def prelude(self, shared: Shared) -> Shared:
        gb = self.gb
        p = "/model/attn_prelude"
        zero = gb.const(f"{p}/zero", np.array([0], np.int64))
        one = gb.const(f"{p}/one", np.array(1, np.int64))
        first = gb.op("Gather", [shared.positions, gb.const(f"{p}/idx0", np.array(0, np.int64))], f"{p}/write_index", axis=1)
        # Attention only spans the longest live row, not the whole capacity:
        # on a small model this decides whether a step costs the weights or the cache.
        if self.tree_attention:
            live, slots, mask = self._tree_mask(p, shared.positions, first, one)
        else:
            top = gb.op("ReduceMax", [shared.positions], f"{p}/max_pos", keepdims=0)
            live = gb.op("Add", [top, one], f"{p}/live_len_scalar")
            slots = gb.op("Range", [gb.const(f"{p}/zero_s", np.array(0, np.int64)), live, one], f"{p}/slots")
            pos4 = gb.op("Unsqueeze", [shared.positions, gb.const(f"{p}/axes13", np.array([1, 3], np.int64))], f"{p}/pos4")
            mask = gb.op("LessOrEqual", [slots, pos4], f"{p}/mask")  # [B,1,S,L]
        live1 = gb.op("Unsqueeze", [live, zero], f"{p}/live_len")
        # the capacity axis, along which the cache is sliced to the live length
        self._zero, self._cache_axis = zero, gb.const(f"{p}/cache_axis", np.array([2 if self.kv_layout == "bnsh" else 1], np.int64))
        if self.consistent_rows:
            mask = self._two_query_rows(p, shared.positions, mask, zero)
        shared.write_index, shared.mask, shared.live_len = first, mask, live1
        return shared

    def _tree_mask(self, p: str, positions: str, first: str, one: str) -> tuple[str, str, str]:
        """(live length [], slots [L], mask [B,1,S,L]) of a tree step: the call's S tokens are written to slots
        first..first+S-1 of each row (first = position_ids[:, 0], the root's cache length), whatever their
        positions (= first + depth). Token j sees slot s < first, and slot first + i where tree_mask[b, j, i].
        A chain's tree_mask is lower-triangular: the same mask as the plain engine's. Standard ops only
        (GatherElements places each row's [S, S] block at its own offset)."""
        gb = self.gb
        tree = gb.input("tree_mask", TensorProto.BOOL, ["batch", "num_tokens", "num_tokens"])
        shape = gb.op("Shape", [positions], f"{p}/tree_step_shape")  # [2]: B, S
        tokens = gb.op("Gather", [shape, one], f"{p}/tree_num_tokens")  # []
        live = gb.op("Add", [gb.op("ReduceMax", [first], f"{p}/max_first", keepdims=0), tokens], f"{p}/live_len_scalar")
        slots = gb.op("Range", [gb.const(f"{p}/zero_s", np.array(0, np.int64)), live, one], f"{p}/slots")  # [L]
        rel = gb.op("Sub", [slots, gb.op("Unsqueeze", [first, gb.const(f"{p}/axis1", np.array([1], np.int64))], f"{p}/first_col")],
                    f"{p}/slot_in_call")  # [B, L]: slot - first
        before = gb.op("Less", [rel, gb.const(f"{p}/zero_i", np.array(0, np.int64))], f"{p}/before_call")  # [B, L]
        last = gb.op("Sub", [tokens, one], f"{p}/last_token")
        in_call = gb.op("And", [gb.op("Not", [before], f"{p}/not_before"), gb.op("LessOrEqual", [rel, last], f"{p}/within_call")], f"{p}/in_call")
        # [B, L] clamped into [0, S): Max/Min rather than an integer Clip, which not every TensorRT version parses
        idx = gb.op("Max", [gb.op("Min", [rel, last], f"{p}/call_index_hi"), gb.const(f"{p}/call_index_lo", np.array(0, np.int64))],
                    f"{p}/call_index")
        axis1 = gb.const(f"{p}/axis1b", np.array([1], np.int64))
        full = gb.op("Concat", [shape, gb.op("Unsqueeze", [live, gb.const(f"{p}/axis0", np.array([0], np.int64))], f"{p}/live_1d")], f"{p}/bsl",
                     axis=0)
        idx3 = gb.op("Expand", [gb.op("Unsqueeze", [idx, axis1], f"{p}/call_index_3d"), full], f"{p}/call_index_bsl")  # [B, S, L]
        picked = gb.op("GatherElements", [tree, idx3], f"{p}/tree_rows", axis=2)  # [B, S, L]: tree_mask[b, j, slot - first]
        visible = gb.op("Or", [gb.op("Unsqueeze", [before, axis1], f"{p}/before_3d"),
                               gb.op("And", [picked, gb.op("Unsqueeze", [in_call, axis1], f"{p}/in_call_3d")], f"{p}/tree_part")], f"{p}/visible")
        mask = gb.op("Unsqueeze", [visible, axis1], f"{p}/mask")  # [B, 1, S, L]
        return live, slots, mask

    def _two_query_rows(self, p: str, positions: str, mask: str, zero: str) -> str:
        """ONNX Runtime's Attention computes a lone query row with another kernel than two or more
        (the last bits differ); with two or more, a row's result does not depend on how many others
        there are, nor on the live length. A one-token step gets a zero second query (its mask row a
        copy of the first), sliced off after: the same bits as that token's row in a verification step.
        Returns the mask with that row."""
        gb = self.gb
        tokens = gb.op("Slice", [gb.op("Shape", [positions], f"{p}/step_shape"), gb.const(f"{p}/one_1d", np.array([1], np.int64)),
                                 gb.const(f"{p}/two_1d", np.array([2], np.int64))], f"{p}/num_tokens")  # [1]
        lone = gb.op("Cast", [gb.op("Less", [tokens, gb.const(f"{p}/two_rows", np.array([2], np.int64))], f"{p}/lone_query")],
                     f"{p}/lone_query_count", to=TensorProto.INT64)  # [1]: 1 for a one-token step, else 0
        q_axis = 2 if self.kv_layout == "bnsh" else 1  # q: [B, heads, S, head_dim] or [B, S, heads * head_dim]
        rank = 4 if self.kv_layout == "bnsh" else 3
        before = gb.const(f"{p}/pads_before", np.zeros(rank + q_axis, np.int64))
        after = gb.const(f"{p}/pads_after", np.zeros(rank - q_axis - 1, np.int64))
        self._query_pads = gb.op("Concat", [before, lone, after], f"{p}/query_pads", axis=0)
        mask_pads = gb.op("Concat", [gb.const(f"{p}/mask_pads_before", np.zeros(6, np.int64)), lone, zero], f"{p}/mask_pads", axis=0)
        self._num_tokens, self._query_axis = tokens, gb.const(f"{p}/query_axis", np.array([q_axis], np.int64))
        return gb.op("Pad", [mask, mask_pads], f"{p}/mask_two_rows", mode="edge")  # [B, 1, max(S, 2), L]

    def layer(self, prefix: str, q: str, k: str, v: str, layer: int, shared: Shared) -> str:
        gb, cfg = self.gb, self.cfg
        perm = [0, 2, 1, 3]
        heads = {"q": cfg.num_heads, "k": cfg.num_kv_heads, "v": cfg.num_kv_heads}
        q, k, v = (
            gb.op("Transpose",
                  [gb.op("Reshape", [x, gb.const(f"{prefix}/{n}_shape", np.array([0, 0, heads[n], cfg.head_dim], np.int64))], f"{prefix}/{n}_heads")],
                  f"{prefix}/{n}_bnsh", perm=perm)
            for n, x in (("q", q), ("k", k), ("v", v))
        )
        q = gb.op("RotaryEmbedding", [q, shared.cos, shared.sin, shared.positions], f"{prefix}/q_rope")
        k = gb.op("RotaryEmbedding", [k, shared.cos, shared.sin, shared.positions], f"{prefix}/k_rope")
        out = self.cached_attention(prefix, q, k, v, layer, shared)
        out = gb.op("Transpose", [out], f"{prefix}/o_bsnh", perm=perm)
        return gb.op("Reshape", [out, gb.const(f"{prefix}/o_shape", np.array([0, 0, cfg.num_heads * cfg.head_dim], np.int64))], f"{prefix}/o_flat")
