"""Rotary position embedding on q and k, and the KV cache append, in one pass.

Row b's call tokens j = 0..S-1 are written to cache slot ``slots[b]`` at positions ``start[b] + j`` (call order: a
tree's nodes too), rotated by their own position ``positions[b, j]`` (cache length + depth for a tree node). The
rotation is the non-interleaved one (transformers' rotate_half, ONNX RotaryEmbedding): with x = [x1, x2] halves,
[x1 cos - x2 sin, x2 cos + x1 sin], computed in float32 from the engine's float32 tables.
"""

from __future__ import annotations

import torch

from ._triton import kernel, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the references run without Triton
    tl = None


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
                        S, HD, q_tok, q_head, k_tok, k_head, v_tok, v_head, cache_slot, cache_head, cache_pos,
                        NH: tl.constexpr, KVH: tl.constexpr, HALF: tl.constexpr):
    t = tl.program_id(0)  # the call's token: row b = t // S, column j = t % S
    h = tl.program_id(1)  # 0..NH-1: a q head; NH..NH+KVH-1: a k head; then a v head
    b = t // S
    j = t % S
    d = tl.arange(0, HALF)
    keep = d < HD // 2
    pos = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + b)
    at = tl.load(start_ptr + b) + j
    if h < NH + KVH:
        if h < NH:
            src = q_ptr + t * q_tok + h * q_head
        else:
            src = k_ptr + t * k_tok + (h - NH) * k_head
        x1 = tl.load(src + d, mask=keep, other=0.0)
        x2 = tl.load(src + HD // 2 + d, mask=keep, other=0.0)
        c = tl.load(cos_ptr + pos * (HD // 2) + d, mask=keep, other=0.0)
        s = tl.load(sin_ptr + pos * (HD // 2) + d, mask=keep, other=0.0)
        y1 = (x1.to(tl.float32) * c - x2.to(tl.float32) * s).to(x1.dtype)
        y2 = (x2.to(tl.float32) * c + x1.to(tl.float32) * s).to(x1.dtype)
        if h < NH:
            dst = q_out_ptr + (t * NH + h) * HD
        else:
            dst = ck_ptr + slot * cache_slot + (h - NH) * cache_head + at * cache_pos
        tl.store(dst + d, y1, mask=keep)
        tl.store(dst + HD // 2 + d, y2, mask=keep)
    else:
        src = v_ptr + t * v_tok + (h - NH - KVH) * v_head
        dst = cv_ptr + slot * cache_slot + (h - NH - KVH) * cache_head + at * cache_pos
        tl.store(dst + d, tl.load(src + d, mask=keep, other=0.0), mask=keep)
        tl.store(dst + HD // 2 + d, tl.load(src + HD // 2 + d, mask=keep, other=0.0), mask=keep)


def rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """rope_append_ref as one kernel: a program per (token, head) of q, k and v. q, k, v may be strided views (of the
    joined q|k|v projection): each needs unit stride along head_dim; the cache is contiguous."""
    B, S, NH, HD = q.shape
    KVH = k.shape[2]
    for x in (q, k, v):
        assert x.stride(0) == S * x.stride(1) and x.stride(3) == 1, "q, k, v must be [B, S, heads, hd] views of [B * S, ...] rows"
    assert positions.is_contiguous() and cache_k.is_contiguous() and cache_v.is_contiguous()
    q_out = torch.empty((B, S, NH, HD), dtype=q.dtype, device=q.device)
    # token strides: a [B, S, ...] view of a [B * S, ...] tensor steps S rows per b, so stride(1) is the per-token stride
    _rope_append_kernel[(B * S, NH + 2 * KVH)](
        q, k, v, q_out, cos, sin, positions, cache_k, cache_v, slots, start,
        S, HD, q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), NH=NH, KVH=KVH, HALF=next_power_of_2(HD // 2))
    return q_out
