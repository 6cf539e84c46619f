"""The forward's operations, two ways: ReferenceOps (the kernels' torch references: the CPU path) and TritonOps
(specdec's Triton kernels: the GPU path). model.py calls one of them and never asks which.

Shapes: T = batch x tokens rows of hidden states; q [B, S, heads, head_dim]; the cache of a layer [slots, kv_heads,
capacity, head_dim] (K and V alike).
"""

from __future__ import annotations

import torch

from .host import DENSE
from .kernels import attention, gemm, norm, rotary, silu
from .weights import Linear


class ReferenceOps:
    """Plain torch: every op as its kernel's reference defines it. ``attention`` needs a host bound on the positions it reads
    (``live``), which is why this path never runs inside a CUDA graph."""

    needs_live = True  # attention reads the cache up to a host-side length (model.py passes it)

    def add_rmsnorm(self, x: torch.Tensor, delta: torch.Tensor | gemm.Partials | None, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(x + delta), x + delta); delta: the block's output, as linear(..., into_norm=True) gave it."""
        return norm.add_rmsnorm_ref(x, delta, weight, eps)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm.rmsnorm_ref(x, weight, eps)

    def rope_append(self, q, k, v, cos, sin, positions, cache_k, cache_v, slots, start) -> torch.Tensor:
        return rotary.rope_append_ref(q, k, v, cos, sin, positions, cache_k, cache_v, slots, start)

    def attention(self, q, cache_k, cache_v, step, scale: float) -> torch.Tensor:
        """q [B, S, heads, head_dim] over a layer's cache for the call ``step`` (model.StepInputs: slots, start, the tree)."""
        return attention.attention_ref(q, cache_k, cache_v, step.slots, step.start, step.tree, scale, step.live)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu.silu_mul_ref(gate_up)

    def matmul(self, x: torch.Tensor, lin: Linear, out_dtype: torch.dtype | None, unsummed: bool = False) -> torch.Tensor | gemm.Partials:
        if lin.weight is not None:
            return gemm.linear_ref(x, lin.weight, out_dtype)
        return gemm.int_linear_ref(x, lin.qweight, lin.scales, lin.zeros, lin.bits, lin.group_size, out_dtype)

    def linear(self, x: torch.Tensor, lin: Linear, out_dtype: torch.dtype | None = None,
               into_norm: bool = False) -> torch.Tensor | gemm.Partials:
        """x [T, in] -> [T, out]: an act-order layer gathers its inputs, a build-time AWQ one scales them, a bias adds on.
        into_norm: the output goes to add_rmsnorm as its delta, and may come back unsummed (gemm.Partials: TritonOps)."""
        if lin.perm is not None:
            x = x.index_select(-1, lin.perm)
        if lin.input_scale is not None:
            x = x * lin.input_scale
        y = self.matmul(x.contiguous() if x.stride(-1) != 1 else x, lin, out_dtype, into_norm and lin.bias is None)
        return y if lin.bias is None else y + lin.bias.to(y.dtype)


class TritonOps(ReferenceOps):
    """specdec's kernels. ``dense``: "stable" runs dense layers on specdec's GEMM too, each layer on the tile of its shape
    (gemm.tile_for: a row's bits never depend on the call's row count, so speculation is exact; a call of at most 16 rows
    on gemm.small_tile_for's tile where it gives the same bits), and leaves the sum of a split o_proj / down_proj to the
    next add_rmsnorm; "unfused" is the same with those sums in a kernel of their own (the same bits, for comparing);
    "shape" runs every call on the shape tile (no small-call tile: the same bits, for comparing); "fixed" runs every layer,
    weight-only ones too, on the one 16 x 32 tile (gemm.FIXED: the kernels' first tiles, for comparing); "cublas" runs
    dense layers with torch's matmul (cuBLAS picks its kernel per shape: not row-exact). Weight-only layers always take
    specdec's GEMM."""

    needs_live = False

    def __init__(self, dense: str = "stable"):
        if dense not in DENSE:
            raise ValueError(f"dense GEMM {dense!r}: expected one of {DENSE}")
        self.dense = dense
        self.tile = gemm.FIXED if dense == "fixed" else None  # None: gemm.tile_for the layer's shape
        self.fuse_sums = dense != "unfused"  # a split o_proj's / down_proj's sum in the next add_rmsnorm ("fixed" never splits)
        self.small_calls = dense != "shape"  # calls of at most 16 rows on gemm.small_tile_for's tile, where its bits agree

    def add_rmsnorm(self, x, delta, weight, eps):
        return norm.add_rmsnorm(x, delta, weight, eps)

    def rmsnorm(self, x, weight, eps):
        return norm.rmsnorm(x, weight, eps)

    def rope_append(self, q, k, v, cos, sin, positions, cache_k, cache_v, slots, start):
        return rotary.rope_append(q, k, v, cos, sin, positions, cache_k, cache_v, slots, start)

    def attention(self, q, cache_k, cache_v, step, scale):
        return attention.attention(q, cache_k, cache_v, step.slots, step.start, step.positions, step.path, scale)

    def silu_mul(self, gate_up):
        return silu.silu_mul(gate_up)

    def matmul(self, x, lin, out_dtype, unsummed=False):
        unsummed = unsummed and self.fuse_sums
        if lin.weight is None:
            return gemm.int_linear(x, lin.qweight, lin.scales, lin.zeros, lin.bits, lin.group_size, out_dtype, tile=self.tile, unsummed=unsummed)
        if self.dense == "cublas":
            return gemm.linear_ref(x, lin.weight, out_dtype)
        return gemm.linear(x, lin.weight, out_dtype, tile=self.tile, unsummed=unsummed, small=self.small_calls)
