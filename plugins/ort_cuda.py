"""The GPU lowering for ONNX Runtime's CUDA provider: half-precision compute, fused attention, no host sync.

What it changes against the portable lowering, and why:

* **Compute dtype = storage dtype.** Weights stay in float16/bfloat16 and
  every activation is computed in that dtype (the KV cache too); only the
  logits leave as float32 (the engine ABI). A float32 build of this lowering
  exists to check it on a CPU against the portable lowering.
* **Attention is ``com.microsoft.GroupQueryAttention``** with the KV cache as
  a shared past/present buffer ``[batch, kv_heads, kv_capacity, head_dim]``
  (the executor binds one buffer as both): it writes the new K/V at each
  row's length and attends over each row's own live length, read on the
  device from ``seqlens_k`` (= position of the row's last token). Rotary is
  fused into it when head_dim is a multiple of 16.
* **No device-to-host read inside a step.** The portable prelude computes the
  live length with ReduceMax(position_ids), which ONNX Runtime copies to the
  host every step (a sync that also rules out CUDA graphs). Here the only
  host-side value is a graph input of this lowering,
  ``total_sequence_length`` (int32 scalar in host memory, which GQA takes on
  the CPU by design). The runtime knows it without asking the device: the
  call's width for a first prompt (every row empty), else the KV capacity
  (runtime/backends/onnxruntime/cuda.py: ``attention_bound``). Each row's real bound is
  ``seqlens_k``, computed on the device from position_ids.
* The MLP's SiLU is one ``com.microsoft.QuickGelu`` (alpha 1) and, with fused
  rotary, GQA takes the packed q|k|v projection: fewer, not faster, kernels
  (a 325M-parameter decode step is a few hundred kernels of 1-5 us each).

ONNX Runtime 1.31's GQA takes more than one new token per row together with
a past only for batch 1 ("batch_size must be 1 when sequence_length > 1 and
past context is given"); the CUDA executor splits such calls into one call
per row. A first prompt (every row empty) may be batched and ragged.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..runtime.engine_format import BuildConfig
from .attention import AttentionLowering, Shared
from .ort_cpu import CONTRIB, OrtCpuAttention

TOTAL_LEN_INPUT = "total_sequence_length"  # [] int32, host memory: see attention_bound in runtime/backends/onnxruntime/cuda.py


class OrtCudaAttention(AttentionLowering):
    name = "ort_cuda"
    kv_layout = "bnsh"
    extra_opsets = {CONTRIB: 1}
    extra_inputs = (TOTAL_LEN_INPUT,)

    @classmethod
    def compute_dtype(cls, build: BuildConfig) -> str:
        return build.dtype

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

    weight_only_op = ""  # none: refused at build time (validate_build_config)

    def int_matmul(self, name: str, x: str, w, rows: str) -> str:
        raise NotImplementedError("the ort_cuda lowering has no weight-only int8/int4 GEMM (untested without a GPU); use ort_cpu or portable")

    def takes_packed_qkv(self) -> bool:
        return self._fused_rotary  # GQA splits a packed q|k|v itself; separate RotaryEmbedding ops need q and k apart

    def silu(self, prefix: str, x: str) -> str:
        """QuickGelu with alpha 1 is x * sigmoid(x): one kernel instead of Sigmoid + Mul."""
        return self.gb.op("QuickGelu", [x], f"{prefix}/silu", domain=CONTRIB, alpha=1.0)

    def layer(self, prefix: str, q: str, k: str | None, v: str | None, layer: int, shared: Shared) -> str:
        """q: [B,S,nh*hd] and k/v: [B,S,kvh*hd], or (takes_packed_qkv) q: [B,S,(nh+2*kvh)*hd] with k, v None."""
        gb, cfg = self.gb, self.cfg
        rotary: dict = {}
        if self._fused_rotary:
            rotary = dict(do_rotary=1, rotary_interleaved=0)
        else:
            q = gb.op("RotaryEmbedding", [q, self._cos, self._sin, shared.positions], f"{prefix}/q_rope", num_heads=cfg.num_heads)
            k = gb.op("RotaryEmbedding", [k, self._cos, self._sin, shared.positions], f"{prefix}/k_rope", num_heads=cfg.num_kv_heads)
        shape = self.cache_shape()
        past = [gb.input(f"past_{kind}.{layer}", gb.compute_type, shape) for kind in ("key", "value")]
        present = [f"present_{kind}.{layer}" for kind in ("key", "value")]
        inputs = [q, k or "", v or "", *past, self._seqlens, self._total] + ([self._cos, self._sin] if self._fused_rotary else [])
        out = gb.op(
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
        for name in present:
            gb.output(name, gb.compute_type, shape)
        return out

    def add_norm(self, name: str, x: str, delta: str | None, weight: str) -> tuple[str, str]:
        """The residual add + next RMSNorm as one SkipSimplifiedLayerNormalization, as on the CPU (CUDA has it too)."""
        if delta is None:
            return super().add_norm(name, x, None, weight)
        return OrtCpuAttention.fused_add_norm(self.gb, self.cfg, name, x, delta, weight)
