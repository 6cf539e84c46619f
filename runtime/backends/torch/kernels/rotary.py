"""Rotary position embedding on q and k, and the KV cache append, in one pass.

Row b's call tokens j = 0..S-1 are written to cache slot ``slots[b]`` at positions ``start[b] + j`` (call order: a
tree's nodes too), rotated by their own position ``positions[b, j]`` (cache length + depth for a tree node). The
rotation is the non-interleaved one (transformers' rotate_half, ONNX RotaryEmbedding): with x = [x1, x2] halves,
[x1 cos - x2 sin, x2 cos + x1 sin], computed in float32 from the engine's float32 tables.
"""

from __future__ import annotations

import torch

from ._triton import kernel, next_power_of_2

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton


# -- reference -----------------------------------------------------------------------------
def rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, S, heads, hd] rotated by positions [B, S] (cos/sin [capacity, hd / 2] float32), in x's dtype."""
    c, s = cos[positions][:, :, None], sin[positions][:, :, None]  # [B, S, 1, hd / 2]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rope_append_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                    cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """q [B, S, heads, hd], k, v [B, S, kv_heads, hd]; cache_k, cache_v [slots, kv_heads, capacity, hd], written in place at
    [slots[b], :, start[b] + j]. Returns q rotated (a new tensor)."""
    write = start[:, None] + torch.arange(q.shape[1], device=q.device)  # [B, S]
    cache_k[slots[:, None], :, write] = rotate_ref(k, cos, sin, positions)
    cache_v[slots[:, None], :, write] = v
    return rotate_ref(q, cos, sin, positions)


# -- kernel --------------------------------------------------------------------------------
@kernel()
def _rope_append_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, cos_ptr, sin_ptr, pos_ptr, ck_ptr, cv_ptr, slot_ptr, start_ptr,
                        S, HD, q_row, q_tok, q_head, k_row, k_tok, k_head, v_row, v_tok, v_head, cache_slot, cache_head, cache_pos,
                        NH: tl.constexpr, KVH: tl.constexpr, NH_PAD: tl.constexpr, KVH_PAD: tl.constexpr, HALF: tl.constexpr):
    # int64: offsets of a long prefill pass 2**31. The call's token: row b = t // S, column j = t % S; one program does every head of it
    t = tl.program_id(0).to(tl.int64)
    b = t // S
    j = t % S
    d = tl.arange(0, HALF)[None, :]  # [1, HALF]: a position in each half of head_dim
    d_ok = d < HD // 2
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * (HD // 2) + d, mask=d_ok, other=0.0)
    s = tl.load(sin_ptr + pos * (HD // 2) + d, mask=d_ok, other=0.0)
    slot = tl.load(slot_ptr + b)
    at = tl.load(start_ptr + b) + j
    # q: rotated into q_out [B * S, NH, HD]
    h = tl.arange(0, NH_PAD)[:, None]
    keep = (h < NH) & d_ok
    src = q_ptr + b * q_row + j * q_tok + h * q_head + d
    x1 = tl.load(src, mask=keep, other=0.0)
    x2 = tl.load(src + HD // 2, mask=keep, other=0.0)
    dst = q_out_ptr + (t * NH + h) * HD + d
    tl.store(dst, (x1.to(tl.float32) * c - x2.to(tl.float32) * s).to(x1.dtype), mask=keep)
    tl.store(dst + HD // 2, (x2.to(tl.float32) * c + x1.to(tl.float32) * s).to(x1.dtype), mask=keep)
    # k: rotated into the cache; v: copied into it
    h = tl.arange(0, KVH_PAD)[:, None]
    keep = (h < KVH) & d_ok
    src = k_ptr + b * k_row + j * k_tok + h * k_head + d
    x1 = tl.load(src, mask=keep, other=0.0)
    x2 = tl.load(src + HD // 2, mask=keep, other=0.0)
    dst = slot * cache_slot + h * cache_head + at * cache_pos + d
    tl.store(ck_ptr + dst, (x1.to(tl.float32) * c - x2.to(tl.float32) * s).to(x1.dtype), mask=keep)
    tl.store(ck_ptr + dst + HD // 2, (x2.to(tl.float32) * c + x1.to(tl.float32) * s).to(x1.dtype), mask=keep)
    src = v_ptr + b * v_row + j * v_tok + h * v_head + d
    tl.store(cv_ptr + dst, tl.load(src, mask=keep, other=0.0), mask=keep)
    tl.store(cv_ptr + dst + HD // 2, tl.load(src + HD // 2, mask=keep, other=0.0), mask=keep)


def rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """rope_append_ref as one kernel: a program per call token, over every q, k and v head of it. q, k, v may be strided
    views (of the joined q|k|v projection): each needs unit stride along head_dim; the cache is contiguous."""
    B, S, NH, HD = q.shape
    KVH = k.shape[2]
    assert all(x.stride(3) == 1 for x in (q, k, v)) and positions.is_contiguous() and cache_k.is_contiguous() and cache_v.is_contiguous()
    q_out = torch.empty((B, S, NH, HD), dtype=q.dtype, device=q.device)
    _rope_append_kernel[(B * S,)](
        q, k, v, q_out, cos, sin, positions, cache_k, cache_v, slots, start,
        S, HD, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        NH=NH, KVH=KVH, NH_PAD=next_power_of_2(NH), KVH_PAD=next_power_of_2(KVH), HALF=next_power_of_2(HD // 2))
    return q_out
