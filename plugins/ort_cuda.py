"""The GPU lowering for ONNX Runtime's CUDA provider: half-precision compute, fused kernels, no host sync.

What every ort_cuda engine does differently from the portable lowering, and why:

* **Compute dtype = storage dtype.** Weights stay in float16/bfloat16 and
  every activation is computed in that dtype (the KV cache too); only the
  ABI's float32 outputs leave as float32. A float32 build of this lowering
  exists to check it on a CPU against the portable lowering.
* **No device-to-host read inside a step**, so a step can be captured as a
  CUDA graph (the portable prelude's ReduceMax(position_ids) is copied to the
  host every step by ONNX Runtime).
* **Fewer kernels**: the residual add and the next RMSNorm are one
  ``SkipSimplifiedLayerNormalization``; the MLP's SiLU is one
  ``com.microsoft.QuickGelu`` (alpha 1); q|k|v and gate|up are one GEMM each
  (builder/network.py); weight-only int8/int4 layers are one
  ``com.microsoft.MatMulNBits`` each, with half-precision activations.

Attention comes in two forms (``build.cuda_attention``, resolved at build time):

* ``gqa`` (this module): ``com.microsoft.GroupQueryAttention`` with fused
  rotary over a shared past/present cache ``[batch, kv_heads, kv_capacity,
  head_dim]``. Fastest for one-token decode, but ONNX Runtime 1.31's CUDA GQA
  takes several new tokens together with a past only at batch 1 ("batch_size
  must be 1 when sequence_length > 1 and past context is given"): the CUDA
  executor then runs such a call as one call per row, or one call per token
  column (runtime/backends/onnxruntime/cuda.py), and it has no tree mask. The default for
  engines that never verify drafts (draft models, target-only builds).
* ``masked`` (plugins/ort_cuda_masked.py): TensorScatter + ONNX Attention with
  an additive mask computed on the device from position_ids (and tree_mask):
  one call per round at any batch size, ragged rows, trees. The default for
  engines that verify drafts (max_draft_len > 0) or trees (Medusa, EAGLE).

GQA details: the only host-side value is the graph input ``total_sequence_length``
(int32 scalar in host memory, which GQA takes on the CPU by design); the
runtime knows it without asking the device: the call's width for a first
prompt (every row empty), else the KV capacity (runtime/backends/onnxruntime/cuda.py:
``attention_bound``). Each row's real bound is ``seqlens_k``, computed on the
device from position_ids. Rotary is fused into GQA when head_dim is a multiple
of 16 (else RotaryEmbedding ops), and then GQA takes the packed q|k|v.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..formats.engine_format import BuildConfig
from ..formats.errors import BuildConfigError
from .attention import AttentionLowering, Shared
from .ort_cpu import OrtCpuAttention
from .quantized_gemm import CONTRIB, IntWeightLike, matmul_nbits, nbits_holds, permute_input

TOTAL_LEN_INPUT = "total_sequence_length"  # [] int32, host memory: see attention_bound in runtime/backends/onnxruntime/cuda.py
CUDA_ATTENTION = ("auto", "gqa", "masked")
# MatMulNBits' accuracy_level only matters to its CPU kernels (int8 activations); on CUDA the activations stay in
# the compute dtype. 0 = unset: the CPU run of a float32 build computes in float32, as the reference does.
CUDA_NBITS_ACCURACY_LEVEL = 0


def resolve_cuda_attention(build: BuildConfig) -> str:
    """gqa | masked for an ort_cuda build: auto = masked for engines that verify drafts or trees, gqa otherwise."""
    if build.cuda_attention != "auto":
        return build.cuda_attention
    return "masked" if build.max_draft_len > 0 or build.tree_attention else "gqa"


class OrtCudaBase(AttentionLowering):
    """What both ort_cuda attention forms share: the compute dtype, the fused norms and activation, int GEMMs."""

    name = "ort_cuda"
    extra_opsets = {CONTRIB: 1}
    weight_only_op = "MatMulNBits(compute dtype activations)"

    @classmethod
    def compute_dtype(cls, build: BuildConfig) -> str:
        return build.dtype

    @classmethod
    def variant(cls, build: BuildConfig) -> type[AttentionLowering]:
        from .ort_cuda_masked import OrtCudaMaskedAttention

        return OrtCudaMaskedAttention if resolve_cuda_attention(build) == "masked" else OrtCudaAttention

    def silu(self, prefix: str, x: str) -> str:
        """QuickGelu with alpha 1 is x * sigmoid(x): one kernel instead of Sigmoid + Mul."""
        return self.gb.op("QuickGelu", [x], f"{prefix}/silu", domain=CONTRIB, alpha=1.0)

    def add_norm(self, name: str, x: str, delta: str | None, weight: str) -> tuple[str, str]:
        """The residual add + next RMSNorm as one SkipSimplifiedLayerNormalization (CUDA has it in float16/bfloat16)."""
        if delta is None:
            return super().add_norm(name, x, None, weight)
        return OrtCpuAttention.fused_add_norm(self.gb, self.cfg, name, x, delta, weight)

    def int_matmul(self, name: str, x: str, w: IntWeightLike, rows: str) -> str:
        """MatMulNBits with activations, scales and output in the compute dtype (CUDA: float16 and, from compute
        capability 8.0, bfloat16). No padding nodes: CUDA's MatMulNBits computes one row with a kernel of its own
        (TryMatMul4BitsM1), which the executors avoid by feeding engines that verify drafts at least two tokens per
        row (BuildConfig.min_step_width)."""
        if not nbits_holds(w):
            raise BuildConfigError(f"{name}: a group of {w.group_size} input rows has no power-of-two MatMulNBits block, and ONNX Runtime's CUDA "
                             "DequantizeLinear has no bfloat16 output; use --lowering ort_cpu or portable for this checkpoint")
        x = permute_input(self.gb, name, x, w)
        return matmul_nbits(self.gb, name, x, w, None, accuracy_level=CUDA_NBITS_ACCURACY_LEVEL, scale_type=self.gb.compute_type)


class OrtCudaAttention(OrtCudaBase):
    """ort_cuda with GroupQueryAttention (cuda_attention gqa)."""

    kv_layout = "bnsh"
    extra_inputs = (TOTAL_LEN_INPUT,)

    def __init__(self, gb, cfg):
        super().__init__(gb, cfg)
        self._fused_rotary = cfg.head_dim % 16 == 0  # GQA's own rotary needs it; else RotaryEmbedding ops

    def prelude(self, shared: Shared) -> Shared:
        gb, p = self.gb, "/model/attn_prelude"
        # seqlens_k = total length of each row after the step, minus one = position of its last (padded) token
        last = gb.op("Gather", [shared.positions, gb.const(f"{p}/last", np.array(-1, np.int64))], f"{p}/last_position", axis=1)
        self._seqlens = gb.op("Cast", [last], f"{p}/seqlens_k", to=TensorProto.INT32)
        self._total = gb.input(TOTAL_LEN_INPUT, TensorProto.INT32, [])
        t = gb.compute_type
        self._cos = gb.op("Cast", [shared.cos], f"{p}/rope_cos", to=t) if t != TensorProto.FLOAT else shared.cos
        self._sin = gb.op("Cast", [shared.sin], f"{p}/rope_sin", to=t) if t != TensorProto.FLOAT else shared.sin
        return shared

    def takes_packed_qkv(self) -> bool:
        return self._fused_rotary  # GQA splits a packed q|k|v itself; separate RotaryEmbedding ops need q and k apart

    def layer(self, prefix: str, q: str, k: str | None, v: str | None, layer: int, shared: Shared) -> str:
        """q: [B,S,nh*hd] and k/v: [B,S,kvh*hd], or (takes_packed_qkv) q: [B,S,(nh+2*kvh)*hd] with k, v None."""
        gb, cfg = self.gb, self.cfg
        rotary: dict = {}
        if self._fused_rotary:
            rotary = dict(do_rotary=1, rotary_interleaved=0)
        else:
            q = gb.op("RotaryEmbedding", [q, self._cos, self._sin, shared.positions], f"{prefix}/q_rope", num_heads=cfg.num_heads)
            k = gb.op("RotaryEmbedding", [k, self._cos, self._sin, shared.positions], f"{prefix}/k_rope", num_heads=cfg.num_kv_heads)
        past, present = self.cache_io(layer, gb.compute_type)
        inputs = [q, k or "", v or "", *past, self._seqlens, self._total] + ([self._cos, self._sin] if self._fused_rotary else [])
        return gb.op(
            "GroupQueryAttention",
            inputs,
            f"{prefix}/gqa",
            outputs=[f"{prefix}/gqa/out0", *present],
            domain=CONTRIB,
            num_heads=cfg.num_heads,
            kv_num_heads=cfg.num_kv_heads,
            scale=float(cfg.head_dim) ** -0.5,
            **rotary,
        )[0]
