"""Attention over the static KV cache: one-token decode, chain and tree verification, and prefill, in one kernel.

Row b's S call tokens sit in cache slot ``slots[b]`` at positions start[b] .. start[b] + S - 1 (rope_append wrote
them). Call token j sees every cache position before the call (< start[b]) and, of the call's own tokens, those its
mask allows: j' <= j for a chain (causal), ``tree[b, j, j']`` for a tree (its ancestors and itself). Positions past
what any token of a program sees are never read, and each row's bound is read on the device (start[b]), so a step
needs no host value: CUDA graphs replay it as rows grow.

A query row's result does not depend on the call: the kernel walks the key positions in blocks of BLOCK_N from 0,
in order, for every call shape (a block the row does not see adds exact zeros), and the tile shape is fixed. So a
token verified among k others gets the bits it gets in a one-token step, and greedy speculation stays exact.
(FlexAttention was the other option: it generates its kernel through torch.compile, which the Triton interpreter
cannot run on a CPU in CI, and its decoding path splits the keys by length: neither fits.)
"""

from __future__ import annotations

import torch

from ._triton import kernel, next_power_of_2

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton

BLOCK_M, BLOCK_N = 16, 32  # query rows (token x head of a KV group) and key positions per step: fixed for every call


# -- reference -----------------------------------------------------------------------------
def visible_ref(start: torch.Tensor, tree: torch.Tensor | None, num_tokens: int, live: int) -> torch.Tensor:
    """[B, S, live] bool: which cache positions each call token sees (the module docstring's rule)."""
    rel = torch.arange(live, device=start.device)[None, None, :] - start[:, None, None]  # [B, 1, live]: position - start
    j = torch.arange(num_tokens, device=start.device)[None, :, None]  # [1, S, 1]
    if tree is None:
        return rel <= j
    index = rel.clamp(0, num_tokens - 1).expand(-1, num_tokens, -1)  # [B, S, live]
    in_call = (rel >= 0) & (rel < num_tokens)
    return (rel < 0) | (in_call & torch.gather(tree, 2, index))


def attention_ref(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor, start: torch.Tensor,
                  tree: torch.Tensor | None, scale: float, live: int) -> torch.Tensor:
    """q [B, S, heads, hd] -> [B, S, heads, hd] in q's dtype, softmax in float32. cache_k/v [slots, kv_heads, capacity, hd];
    live: a host bound >= max(start) + S (the positions read)."""
    B, S, NH, HD = q.shape
    group = NH // cache_k.shape[1]
    k = cache_k[slots, :, :live].float().repeat_interleave(group, dim=1)  # [B, heads, live, hd]
    v = cache_v[slots, :, :live].float().repeat_interleave(group, dim=1)
    scores = q.float().transpose(1, 2) @ k.transpose(-1, -2) * scale  # [B, heads, S, live]
    scores = scores.masked_fill(~visible_ref(start, tree, S, live)[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).to(q.dtype)


# -- kernel --------------------------------------------------------------------------------
@kernel(do_not_specialize=["S"])  # one compiled kernel for one-token and (k+1)-token calls: the same code for a query row
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, slot_ptr, start_ptr, tree_ptr, S, scale, cache_slot, cache_head, cache_pos,
                      NH: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, TREE: tl.constexpr,
                      IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0) // KVH
    kh = tl.program_id(0) % KVH
    r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this KV head: r = j * G + (head - kh * G)
    j = r // G
    row_ok = r < S * G
    head = kh * G + r % G
    d = tl.arange(0, HD_PAD)
    d_ok = d < HD
    q_at = ((b * S + j) * NH + head)[:, None] * HD + d[None, :]
    q = tl.load(q_ptr + q_at, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HD_PAD]
    slot = tl.load(slot_ptr + b)
    start = tl.load(start_ptr + b)
    last_j = tl.minimum((tl.program_id(1) * BLOCK_M + BLOCK_M - 1) // G, S - 1)
    end = start + last_j + 1  # the last position any row of this program sees, + 1
    k_base = k_ptr + slot * cache_slot + kh * cache_head
    v_base = v_ptr + slot * cache_slot + kh * cache_head
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD_PAD], tl.float32)
    for n0 in range(0, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        kt = tl.load(k_base + n[None, :] * cache_pos + d[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [HD_PAD, BLOCK_N]
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee") * scale
        else:
            s = tl.dot(q, kt) * scale
        rel = n - start
        if TREE:
            in_call = (rel >= 0) & (rel < S)
            allowed = tl.load(tree_ptr + ((b * S + j) * S)[:, None] + rel[None, :], mask=row_ok[:, None] & in_call[None, :], other=0)
            seen = (rel[None, :] < 0) | (allowed != 0)
        else:
            seen = rel[None, :] <= j[:, None]
        s = tl.where(seen & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_use[:, None])
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * cache_pos + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, HD_PAD]
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + q_at, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor, start: torch.Tensor,
              tree: torch.Tensor | None, scale: float) -> torch.Tensor:
    """attention_ref as one kernel: a program per (row, KV head, BLOCK_M query rows of its head group). q contiguous."""
    B, S, NH, HD = q.shape
    KVH = cache_k.shape[1]
    q = q.contiguous()
    out = torch.empty_like(q)
    grid = (B * KVH, -(-(S * (NH // KVH)) // BLOCK_M))
    tree_bytes = tree.view(torch.uint8) if tree is not None else start  # (a placeholder pointer when there is no tree)
    _attention_kernel[grid](q, cache_k, cache_v, out, slots, start, tree_bytes, S, scale,
                            cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), NH=NH, KVH=KVH, G=NH // KVH, HD=HD,
                            HD_PAD=max(16, next_power_of_2(HD)), TREE=tree is not None, IEEE=q.dtype == torch.float32,
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return out
