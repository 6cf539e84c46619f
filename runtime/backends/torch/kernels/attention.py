"""Attention over the static KV cache: one-token decode, chain and tree verification, and prefill, in one kernel.

Row b's S call tokens sit in cache slot ``slots[b]`` at positions start[b] .. start[b] + S - 1 (rope_append wrote
them). Call token j sees every cache position before the call (< start[b]) and, of the call's own tokens, those its
mask allows: j' <= j for a chain (causal), ``tree[b, j, j']`` for a tree (its ancestors and itself). Positions past
what a token sees are never read, and each row's bound is read on the device, so a step needs no host value: CUDA
graphs replay it as rows grow.

A query's result does not depend on the call: a program takes one call token (its heads of one KV head), and walks
the keys it sees in *virtual* positions, blocks of BLOCK_N from 0: the cache before the call, then the token's
ancestors by depth (``path[b, j, d]``: the call index of its ancestor at depth d; a chain's is d itself). Those are
the keys, in the same blocks and lanes, that the same token sees in a one-token step after its path was kept, and
the tile shape is fixed: a token verified in a chain or a tree gets the bits of a one-token step, and greedy
speculation stays exact. (FlexAttention was the other option: it generates its kernel through torch.compile, which
the Triton interpreter cannot run on a CPU in CI, and its decoding path splits the keys by length: neither fits.)
"""

from __future__ import annotations

import torch

from ._triton import kernel, next_power_of_2

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton

BLOCK_M, BLOCK_N = 16, 32  # query rows (the heads of one KV head, at least) and key positions per step: fixed for every call


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


def tree_path(tree: torch.Tensor) -> torch.Tensor:
    """[B, S, S] bool tree mask -> [B, S, S] int32: row j lists the call indices j' with tree[b, j, j'] ascending (its
    ancestors by depth, then itself; a parent precedes its children), then the others."""
    return torch.argsort((~tree).to(torch.int8), dim=-1, stable=True).to(torch.int32)


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
@kernel(do_not_specialize=["S"])  # one compiled kernel for one-token and (k+1)-token calls: the same code for a query
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, slot_ptr, start_ptr, pos_ptr, path_ptr, S, scale, cache_slot, cache_head, cache_pos,
                      NH: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, TREE: tl.constexpr,
                      IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0) // KVH
    kh = tl.program_id(0) % KVH
    j = tl.program_id(1)  # the call token: its G heads of KV head kh are the rows
    r = tl.arange(0, BLOCK_M)
    row_ok = r < G
    d = tl.arange(0, HD_PAD)
    d_ok = d < HD
    q_at = ((b * S + j) * NH + kh * G + r)[:, None] * HD + d[None, :]
    q = tl.load(q_ptr + q_at, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HD_PAD]
    slot = tl.load(slot_ptr + b)
    start = tl.load(start_ptr + b)
    end = tl.load(pos_ptr + b * S + j) + 1  # the token's position + 1: start + its depth (a chain's: start + j) + 1
    k_base = k_ptr + slot * cache_slot + kh * cache_head
    v_base = v_ptr + slot * cache_slot + kh * cache_head
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD_PAD], tl.float32)
    for n0 in range(0, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # virtual positions: the cache, then the token's path by depth
        n_ok = n < end
        if TREE:
            depth = tl.where(n >= start, n - start, 0)
            ancestor = tl.load(path_ptr + (b * S + j) * S + depth, mask=n_ok & (n >= start), other=0)
            at = tl.where(n >= start, start + ancestor, n)  # where that key sits in the cache (a tree's nodes in call order)
        else:
            at = n
        kt = tl.load(k_base + at[None, :] * cache_pos + d[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [HD_PAD, BLOCK_N]
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee") * scale
        else:
            s = tl.dot(q, kt) * scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_use[:, None])
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + at[:, None] * cache_pos + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, HD_PAD]
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + q_at, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor, start: torch.Tensor,
              positions: torch.Tensor, path: torch.Tensor | None, scale: float) -> torch.Tensor:
    """attention_ref as one kernel: a program per (row, KV head, call token). positions [B, S]: each token's position
    (start + its depth); path [B, S, S] int32 (tree_path of the call's tree mask), None for a chain. q contiguous."""
    B, S, NH, HD = q.shape
    KVH = cache_k.shape[1]
    G = NH // KVH
    q = q.contiguous()
    out = torch.empty_like(q)
    _attention_kernel[(B * KVH, S)](q, cache_k, cache_v, out, slots, start, positions, path if path is not None else positions, S, scale,
                                   cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), NH=NH, KVH=KVH, G=G, HD=HD,
                                   HD_PAD=max(16, next_power_of_2(HD)), TREE=path is not None, IEEE=q.dtype == torch.float32,
                                   BLOCK_M=max(BLOCK_M, next_power_of_2(G)), BLOCK_N=BLOCK_N)
    return out
