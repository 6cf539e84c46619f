"""RMSNorm, and the residual add fused with the next RMSNorm.

A decoder layer adds each block's output to the residual stream and normalises the sum for the next block: one
pass reads both, writes the sum (the new residual) and the normalised row. Statistics in float32; the sum is
rounded to the activation dtype before it is normalised (what the residual stream holds is what the norm reads).
The block's output may come as a split GEMM's float32 partials (gemm.Partials): the pass adds them in part order and
rounds them to the activation dtype first, as gemm's sum kernel would have, so the bits are the same.
"""

from __future__ import annotations

import torch

from . import gemm
from ._triton import kernel, next_power_of_2

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton


# -- references ----------------------------------------------------------------------------
def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H] -> x / rms(x) * weight, computed in float32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def add_rmsnorm_ref(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + delta), x + delta); x, delta [T, H]; the sum in x's dtype. delta None: (rmsnorm(x), x)."""
    s = x if delta is None else (x.float() + delta.float()).to(x.dtype)
    return rmsnorm_ref(s, weight, eps), s


# -- kernel --------------------------------------------------------------------------------
@kernel()
def _add_rmsnorm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, sum_ptr, H, x_stride, delta_stride, part_stride, out_stride, sum_stride, eps,
                        HAS_DELTA: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """PARTS > 0: delta is a split GEMM's float32 partials (gemm.Partials, part p at delta + p * part_stride), added here in
    part order and rounded to x's dtype, as gemm._sum_parts_kernel would have written it."""
    row = tl.program_id(0).to(tl.int64)  # row * stride passes 2**31 in a long prefill
    cols = tl.arange(0, BLOCK)
    keep = cols < H
    x = tl.load(x_ptr + row * x_stride + cols, mask=keep, other=0.0)
    if HAS_DELTA:
        if PARTS:
            acc = tl.load(delta_ptr + row * delta_stride + cols, mask=keep, other=0.0)
            for part in tl.static_range(1, PARTS):  # part * part_stride in int32: Partials stay within gemm.PARTIAL_BYTES
                acc += tl.load(delta_ptr + part * part_stride + row * delta_stride + cols, mask=keep, other=0.0)
            d = acc.to(x.dtype)
        else:
            d = tl.load(delta_ptr + row * delta_stride + cols, mask=keep, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * sum_stride + cols, x, mask=keep)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (xf * inv * w).to(x.dtype), mask=keep)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | gemm.Partials | None, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rmsnorm_ref as one kernel: a program per row. x, delta [T, H] with unit stride along H. delta may be a split
    GEMM's gemm.Partials, summed here (the same bits as summing them first, one kernel and one round trip fewer)."""
    T, H = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if delta is not None else x
    parts = 0
    if isinstance(delta, gemm.Partials):
        if tuple(delta.shape) != (T, H):
            raise ValueError(f"add_rmsnorm: partials of shape {tuple(delta.shape)} for a residual of shape {(T, H)}")
        if delta.dtype != x.dtype:  # the fused sum rounds to x's dtype: another output dtype is summed on its own first
            delta = delta.sum()
        else:
            parts, delta = delta.parts.shape[0], delta.parts  # [parts, T, H] float32
    d = delta if delta is not None else x
    part_stride = d.stride(0) if parts else 0
    row_stride = d.stride(1) if parts else d.stride(0)
    _add_rmsnorm_kernel[(T,)](x, d, weight, out, summed, H, x.stride(0), row_stride, part_stride, out.stride(0), summed.stride(0), eps,
                              HAS_DELTA=delta is not None, PARTS=parts, BLOCK=next_power_of_2(H))
    return out, summed


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return add_rmsnorm(x, None, weight, eps)[0]
