"""The CPU lowering for ONNX Runtime: fewer, fatter nodes.

A decode step of a small model costs its weight reads plus a few
microseconds per graph node, so this lowering removes nodes the portable
graph needs only for TensorRT's sake:

* the KV cache is 3-D, ``[batch, capacity, kv_heads * head_dim]``, so Q/K/V
  stay ``[batch, tokens, heads * head_dim]`` end to end: RotaryEmbedding and
  Attention take 3-D inputs, and no Reshape/Transpose is left per layer;
* the residual add and the next RMSNorm are one
  ``com.microsoft.SkipSimplifiedLayerNormalization``;
* with ``--cpu_kernels specdec``, a layer's attention is one specdec
  ``RotaryCachedAttention`` node (plugins/cpu_kernels.py) from the q|k|v
  projection to the attention output: the Split of q|k|v, both
  RotaryEmbeddings and TensorScatters and the attention over the whole cache
  in place, with no Slice copies of the live slots, no padded query row and
  no mask nodes. A tree engine's node takes its ``tree_mask`` input as is and
  reads each token's ancestors in path order: the bits of a chain.
* with ``--cpu_kernels specdec``, the MLP's silu(gate) * up is one node: in the
  gate|up Q4Gemm / Q8Gemm itself, or a SwiGLU node after a float MatMul or a
  MatMulNBits (no Split, Sigmoid and two Muls).

Same ABI and semantics as the portable lowering (the cache written in place
at each row's length, by TensorScatter or RotaryCachedAttention; attention
spans the live length); the tests run both against transformers.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .attention import PortableAttention, Shared
from .cpu_kernels import DOMAIN, ROTARY_CACHED_ATTENTION, TILE, q4_gemm, q4_holds, rotary_cached_attention
from .quantized_gemm import (
    CONTRIB,
    NBITS_ACCURACY_LEVEL,
    EvenRows,
    IntWeightLike,
    dq_matmul,
    matmul_nbits,
    nbits_holds,
    nbits_rows_split,
    pack_matmul_nbits,
    permute_input,
)


class OrtCpuAttention(PortableAttention):
    name = "ort_cpu"
    kv_layout = "bsh"
    extra_opsets = {CONTRIB: 1}
    weight_only_op = f"MatMulNBits(accuracy_level={NBITS_ACCURACY_LEVEL})"

    def __init__(self, gb, cfg):
        super().__init__(gb, cfg)
        self._even_rows: dict[str, EvenRows] = {}  # per leading shape (the logit rows, the layers' tokens in a tree engine)
        self.step_rows = ""  # the padded position_ids of pad_step: GEMMs on these rows are even already
        self._tree_input: str | None = None  # a tree engine's tree_mask input, with RotaryCachedAttention

    def _own_attention(self) -> bool:
        """specdec's RotaryCachedAttention: with --cpu_kernels specdec, for chain and tree engines alike."""
        return self.cpu_kernels == "specdec"

    def prelude(self, shared: Shared) -> Shared:
        """RotaryCachedAttention needs only the positions (its write index, its mask and its rotary angles) and a tree
        engine's tree_mask input as the runtime feeds it: no live length, mask nodes or padded query row."""
        if not self._own_attention():
            return super().prelude(shared)
        self.attention_op = ROTARY_CACHED_ATTENTION
        if self.tree_attention:
            self._tree_input = self.gb.input("tree_mask", TensorProto.BOOL, ["batch", "num_tokens", "num_tokens"])
        return shared

    def takes_packed_qkv(self) -> bool:
        """RotaryCachedAttention splits a packed q|k|v itself (no Split node)."""
        return self._own_attention()

    def pad_step(self, ids: str, positions: str) -> tuple[str, str]:
        """ids, positions [B, S] -> [B, S'] with S' = S + 1 when B * S is odd, else S: every decoder GEMM then
        has an even row count, paid once per step (two Pad nodes) instead of a Pad and a Slice around each
        GEMM. The extra token repeats each sequence's last token and position; it writes K/V one slot past
        the call's tokens (a slot past the live length, which no token reads before it is written again, as
        a rejected draft's) and gets no logits (logits_index names real tokens). ``step_padding_needed``
        says afterwards whether some GEMM needed it; the builder drops the two Pads when none did."""
        gb, p = self.gb, "/model/step_rows"
        lead = gb.op("Shape", [ids], f"{p}/lead")  # [2]: batch, tokens
        odd = gb.op("Mod", [gb.op("ReduceProd", [lead], f"{p}/count", keepdims=1), gb.const(f"{p}/two", np.array([2], np.int64))], f"{p}/odd")
        pads = gb.op("Concat", [gb.const(f"{p}/zeros", np.zeros(3, np.int64)), odd], f"{p}/pads", axis=0)  # [4]: odd tokens after each sequence
        self.step_rows = gb.op("Pad", [positions, pads], f"{p}/position_ids", mode="edge")
        return gb.op("Pad", [ids, pads], f"{p}/input_ids", mode="edge"), self.step_rows

    def int_matmul(self, name: str, x: str, w: IntWeightLike, rows: str) -> str:
        """MatMulNBits: the weight stays packed. In an engine that verifies drafts, where this ONNX Runtime computes
        a lone row with another kernel than rows in pairs (nbits_rows_split, measured for this weight's shape),
        the rows are made even: by pad_step's padded step (rows == step_rows), else around this GEMM
        (plugins/quantized_gemm.py's EvenRows). Where it does not, no row is added."""
        x = permute_input(self.gb, name, x, w)
        if self._kernel_holds(w):  # a row's bits never depend on the call's rows: no padding
            return self._q_gemm(name, x, w)
        if not nbits_holds(w):  # a group MatMulNBits' power-of-two blocks cannot hold: exact, float32 at load
            return dq_matmul(self.gb, name, x, w)
        packed = pack_matmul_nbits(w)
        if not self.consistent_rows or not nbits_rows_split(packed.k, packed.n, packed.bits, packed.block_size, NBITS_ACCURACY_LEVEL,
                                                            self.probe_rows):
            return matmul_nbits(self.gb, name, x, packed, None)
        if rows == self.step_rows:
            self.step_padding_needed = True
            return matmul_nbits(self.gb, name, x, packed, None)
        if rows not in self._even_rows:
            self._even_rows[rows] = EvenRows(self.gb, rows)
        return matmul_nbits(self.gb, name, x, packed, self._even_rows[rows])

    def _kernel_holds(self, w: IntWeightLike) -> bool:
        return self.cpu_kernels == "specdec" and q4_holds(w)

    def _q_gemm(self, name: str, x: str, w: IntWeightLike, **parts):
        """Q4Gemm / Q8Gemm (plugins/cpu_kernels.py), counted for the engine's record."""
        self.q4gemm_layers += 1
        self.kernel_ops = self.kernel_ops | {"Q4Gemm" if w.bits == 4 else "Q8Gemm"}
        return q4_gemm(self.gb, name, x, w, **parts)

    def int_matmul_parts(self, name: str, x: str, w: IntWeightLike, rows: str, splits: list[int]) -> list[str] | None:
        """One Q4Gemm / Q8Gemm node with an output per part (no Split node after a fused q|k|v), where the kernels
        take the weight and every part is a whole number of 16-column tiles."""
        if not self._kernel_holds(w) or any(n % TILE for n in splits):
            return None
        return self._q_gemm(name, permute_input(self.gb, name, x, w), w, splits=splits)

    def int_swiglu(self, name: str, x: str, w: IntWeightLike, rows: str) -> str | None:
        """silu(gate) * up in the gate|up GEMM itself (Q4Gemm / Q8Gemm swiglu=1: no Split, Sigmoid or Mul nodes)."""
        if not self._kernel_holds(w) or w.codes.shape[1] % (2 * TILE):
            return None
        return self._q_gemm(name, permute_input(self.gb, name, x, w), w, swiglu=True)

    def swiglu(self, name: str, y: str, width: int) -> str | None:
        """With --cpu_kernels specdec, silu(gate) * up of a gate|up projection not on Q4Gemm / Q8Gemm (a float MatMul, a
        MatMulNBits) in one SwiGLU node instead of Split, Sigmoid and two Muls (hardware/kernels/ort_swiglu.c)."""
        if self.cpu_kernels != "specdec":
            return None
        self.swiglu_layers += 1
        return self.gb.op("SwiGLU", [y], f"{name}/swiglu", domain=DOMAIN)

    def layer(self, prefix: str, q: str, k: str | None, v: str | None, layer: int, shared: Shared) -> str:
        """q: [B,S,nh*hd] and k/v: [B,S,kvh*hd], or (takes_packed_qkv) q: [B,S,(nh+2*kvh)*hd] with k, v None."""
        gb, cfg = self.gb, self.cfg
        if self._own_attention():  # [B, S, heads * head_dim], and no shape inferred to correct
            return rotary_cached_attention(gb, f"{prefix}/attention", q, k, v, *self.cache_io(layer), shared.positions, shared.cos,
                                           shared.sin, cfg.num_heads, cfg.num_kv_heads, self._tree_input)
        q = gb.op("RotaryEmbedding", [q, shared.cos, shared.sin, shared.positions], f"{prefix}/q_rope", num_heads=cfg.num_heads)
        k = gb.op("RotaryEmbedding", [k, shared.cos, shared.sin, shared.positions], f"{prefix}/k_rope", num_heads=cfg.num_kv_heads)
        out = self.cached_attention(prefix, q, k, v, layer, shared)
        # ONNX shape inference gives 3-D grouped Attention the width of V (kv heads), not of Q;
        # the kernel returns [B, S, heads * head_dim]. Say so, or the o_proj MatMul fails to load.
        width = gb.const(f"{prefix}/o_shape", np.array([0, 0, cfg.num_heads * cfg.head_dim], np.int64))
        return gb.op("Reshape", [out, width], f"{prefix}/o_flat")

    def add_norm(self, name: str, x: str, delta: str | None, weight: str) -> tuple[str, str]:
        if delta is None:
            return super().add_norm(name, x, None, weight)
        return self.fused_add_norm(self.gb, self.cfg, name, x, delta, weight)

    @staticmethod
    def fused_add_norm(gb, cfg, name: str, x: str, delta: str, weight: str) -> tuple[str, str]:
        normed, _, _, total = gb.op(
            "SkipSimplifiedLayerNormalization",
            [delta, x, weight],
            name,
            outputs=[f"{name}/out0", "", "", f"{name}/residual_sum"],
            domain=CONTRIB,
            epsilon=cfg.rms_norm_eps,
        )
        return normed, total
