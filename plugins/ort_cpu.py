"""The CPU lowering for ONNX Runtime: fewer, fatter nodes.

A decode step of a small model costs its weight reads plus a few
microseconds per graph node, so this lowering removes nodes the portable
graph needs only for TensorRT's sake:

* the KV cache is 3-D, ``[batch, capacity, kv_heads * head_dim]``, so Q/K/V
  stay ``[batch, tokens, heads * head_dim]`` end to end: RotaryEmbedding and
  Attention take 3-D inputs, and no Reshape/Transpose is left per layer;
* the residual add and the next RMSNorm are one
  ``com.microsoft.SkipSimplifiedLayerNormalization``.

Same ABI and semantics as the portable lowering (TensorScatter writes in
place at each row's length; attention spans the live length); the tests run
both against transformers.
"""

from __future__ import annotations

import numpy as np

from .attention import PortableAttention, Shared
from .quantized_gemm import CONTRIB, NBITS_ACCURACY_LEVEL, EvenRows, IntWeightLike, dq_matmul, matmul_nbits, nbits_holds, permute_input


class OrtCpuAttention(PortableAttention):
    name = "ort_cpu"
    kv_layout = "bsh"
    extra_opsets = {CONTRIB: 1}
    weight_only_op = f"MatMulNBits(accuracy_level={NBITS_ACCURACY_LEVEL})"

    def __init__(self, gb, cfg):
        super().__init__(gb, cfg)
        self._even_rows: dict[str, EvenRows] = {}  # per leading shape (the layers' tokens, the logit rows)

    def int_matmul(self, name: str, x: str, w: IntWeightLike, rows: str) -> str:
        """MatMulNBits: the weight stays packed; in an engine that verifies drafts, activations padded to an
        even row count so that every row takes the same kernel (plugins/quantized_gemm.py)."""
        x = permute_input(self.gb, name, x, w)
        if not nbits_holds(w):  # a group MatMulNBits' power-of-two blocks cannot hold: exact, float32 at load
            return dq_matmul(self.gb, name, x, w)
        if not self.consistent_rows:
            return matmul_nbits(self.gb, name, x, w, None)
        if rows not in self._even_rows:
            self._even_rows[rows] = EvenRows(self.gb, rows)
        return matmul_nbits(self.gb, name, x, w, self._even_rows[rows])

    def layer(self, prefix: str, q: str, k: str, v: str, layer: int, shared: Shared) -> str:
        gb, cfg = self.gb, self.cfg
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
