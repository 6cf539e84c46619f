"""Linear layers: y = x @ W (+ bias), W dense or weight-only int8/int4 (W8A16, W4A16) with per-group scales.

Every launch uses one tile shape (BLOCK_M x BLOCK_N, BLOCK_K along the reduction) whatever the row count M, no
split of the reduction, and the row count is not specialised on: one compiled kernel serves every call. Each output
element is then the same float32 sum in the same order, of the same products, in every call: a row's result does
not depend on how many rows the call has, so a token verified among k + 1 gets the bits of a one-token step and
speculation on the target is exact at every batch size (the principle of the CPU int4 kernel, hardware/kernels/).
The programs of one column tile sit next to each other in launch order (M varies fastest), so a weight tile read
from memory by the first is in L2 for the others.

Integer weights (formats/torch_layout.py): codes [K, N] (int8) or [ceil(K / 2), N] (int4: row r = input rows 2r and
2r + 1 in its low and high nibbles), w[k, n] = (code - zeros[k // group, n]) * scales[k // group, n] in float32,
rounded to the activation dtype, then multiplied as a dense weight would be. int4 needs no interleaving: the even
and odd input rows are two dot products of half a tile each, in a fixed order.
"""

from __future__ import annotations

import torch

from ._triton import kernel

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton

BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 64  # fixed for every call (the module docstring says why)


# -- references ----------------------------------------------------------------------------
def dequantize_ref(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int, K: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """[K, N] in ``dtype``: (code - zero) * scale per (group of input rows, column), in float32, then rounded."""
    if bits == 4:
        codes = torch.stack([qweight & 0x0F, qweight >> 4], dim=1).reshape(-1, qweight.shape[1])[:K]  # rows 2r, 2r + 1
    else:
        codes = qweight
    g = torch.arange(K, device=qweight.device) // group
    return ((codes.float() - zeros[g].float()) * scales[g]).to(dtype)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (F.linear's layout) -> [M, N] in out_dtype (default x's)."""
    return torch.nn.functional.linear(x, weight).to(out_dtype or x.dtype)


def int_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize_ref(...) [K, N] -> [M, N]."""
    return (x @ dequantize_ref(qweight, scales, zeros, bits, group, x.shape[1], x.dtype)).to(out_dtype or x.dtype)


# -- kernels -------------------------------------------------------------------------------
@kernel(do_not_specialize=["M"])
def _dense_kernel(x_ptr, w_ptr, y_ptr, M, N, K, x_stride, w_stride, y_stride,
                  IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: m * stride passes 2**31 in a long prefill
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + n[None, :] * w_stride + k[:, None], mask=(n[None, :] < N) & (k[:, None] < K), other=0.0)  # [BLOCK_K, BLOCK_N]
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    tl.store(y_ptr + m[:, None] * y_stride + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=(m[:, None] < M) & (n[None, :] < N))


@kernel(do_not_specialize=["M"])
def _int_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, GROUP, x_stride, y_stride,
                BITS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: m * stride passes 2**31 in a long prefill
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m[:, None] < M
    n_ok = n[None, :] < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if BITS == 4:
            half = tl.arange(0, BLOCK_K // 2)
            packed = tl.load(q_ptr + (k0 // 2 + half)[:, None] * N + n[None, :], mask=((k0 + 2 * half)[:, None] < K) & n_ok, other=0)
            for part in tl.static_range(2):  # the even input rows (low nibbles), then the odd ones
                k = k0 + 2 * half + part
                k_ok = k[:, None] < K
                codes = (packed >> (4 * part)) & 0x0F
                zero = tl.load(z_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0)
                scale = tl.load(s_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0.0)
                x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=m_ok & (k[None, :] < K), other=0.0)
                w = ((codes.to(tl.float32) - zero.to(tl.float32)) * scale).to(x.dtype)  # [BLOCK_K / 2, BLOCK_N]
                if IEEE:
                    acc += tl.dot(x, w, input_precision="ieee")
                else:
                    acc += tl.dot(x, w)
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k[:, None] < K
            codes = tl.load(q_ptr + k[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0)
            zero = tl.load(z_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0)
            scale = tl.load(s_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0.0)
            x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=m_ok & (k[None, :] < K), other=0.0)
            w = ((codes.to(tl.float32) - zero.to(tl.float32)) * scale).to(x.dtype)
            if IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w)
    tl.store(y_ptr + m[:, None] * y_stride + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_ok & n_ok)


def _grid(M: int, N: int) -> tuple[int, int]:
    return (-(-M // BLOCK_M), -(-N // BLOCK_N))


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """linear_ref as the fixed-tile kernel. x [M, K] (unit stride along K), weight [N, K] contiguous."""
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    _dense_kernel[_grid(M, N)](x, weight, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0), IEEE=x.dtype == torch.float32,
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y


def int_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """int_linear_ref as the fixed-tile kernel. x [M, K] (unit stride along K); qweight, scales, zeros contiguous."""
    M, K = x.shape
    N = qweight.shape[1]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    _int_kernel[_grid(M, N)](x, qweight, scales, zeros, y, M, N, K, group, x.stride(0), y.stride(0), BITS=bits, IEEE=x.dtype == torch.float32,
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y
