"""The MLP's gate: SiLU(gate) * up, from the joined gate|up projection [T, 2 * I] (gate first, as transformers chunks it)."""

from __future__ import annotations

import torch

from ._triton import kernel

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton

BLOCK = 1024


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2 * I] -> [T, I]: silu(gate) * up, computed in float32, in gate_up's dtype."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


@kernel()
def _silu_mul_kernel(gu_ptr, out_ptr, inter, gu_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row * stride passes 2**31 in a long prefill
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < inter
    g = tl.load(gu_ptr + row * gu_stride + cols, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * gu_stride + inter + cols, mask=keep, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=keep)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    T, two_i = gate_up.shape
    out = torch.empty((T, two_i // 2), dtype=gate_up.dtype, device=gate_up.device)
    _silu_mul_kernel[(T, -(-(two_i // 2) // BLOCK))](gate_up, out, two_i // 2, gate_up.stride(0), out.stride(0), BLOCK=BLOCK)
    return out
