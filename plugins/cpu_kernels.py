"""specdec's own CPU kernels: the ai.specdec.cpu::Q4Gemm and Q8Gemm ops for int4 and int8 weights, and CachedAttention
(hardware/kernels/).

ONNX Runtime's MatMulNBits reads and unpacks the 4-bit weights once for every *pair* of rows, so a 5-token
verification costs about 2x a one-token step on an int4 target, and it computes a lone row with other kernels
than rows in pairs, which costs an engine that verifies drafts an even-row padding on every one-token step
(docs/precision.md). Q4Gemm reads and unpacks each weight block once for up to 8 rows (AVX-512 VNNI integer dot
products, as llama.cpp's tinyBLAS tiles do for Q4_0), and every row takes the same instructions whatever the call's
row count: no padding, and the verification logits equal the one-token logits bit for bit. Q8Gemm is the same for
int8 codes. One node computes a fused projection's parts as separate outputs (q, k, v; no Split after it), or the
MLP's silu(gate) * up straight from the gate|up weight (swiglu).

CachedAttention attends over the whole static-capacity cache as TensorScatter left it (no Slice copies of the live
slots; the token at position p sees slots 0..p), a KV head's query heads together, and a token's output is the same bits
whatever the call's rows and tokens: no padding of a lone query row either (ONNX Runtime's Attention needs one).

This module is the graph side: which weights the ops take, their weight layouts, the nodes. The C sources and their
compiling and loading are the runtime's (hardware/kernels/, hardware/cpu_kernels.py): an engine records the layout
(LAYOUT), never native code, and every host compiles the installed sources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graph_api import GraphOps

# The packing below is layout hardware/cpu_kernels.LAYOUT (engines record it): change both together.
DOMAIN = "ai.specdec.cpu"
TILE = 16  # output columns per tile


@dataclass
class Q4Weight:
    """An int4 or int8 weight in Q4Gemm's / Q8Gemm's layout (hardware/kernels/q4_kernels.h)."""

    w: np.ndarray  # [N / 16, G, group / 8, 64] uint8 (int4: two codes a byte) or [N / 16, G, group / 4, 64] (int8)
    scales: np.ndarray  # [N / 16, G, 16] float32
    zeros: np.ndarray  # [N / 16, G, 16] int32, or [1]: one zero point every column and group shares (symmetric)
    k: int
    n: int
    group: int
    bits: int = 4

    @property
    def op(self) -> str:
        return "Q4Gemm" if self.bits == 4 else "Q8Gemm"


MAX_Q8_GROUP = 65536  # Q8Gemm's int32 sums hold a group of at most this many rows (65536 x 255 x 127 < 2^31)


def q4_holds(w) -> bool:
    """Whether Q4Gemm or Q8Gemm takes ``w`` (an IntWeightLike): 4 or 8 bits, equal groups of a multiple of 8 (int4) or
    4 (int8) rows (no shorter last group), and a multiple of 16 output columns. Others stay on MatMulNBits."""
    k, n = w.codes.shape
    g = _group(w)
    per_block = {4: 8, 8: 4}.get(w.bits)
    return (per_block is not None and g > 0 and g % per_block == 0 and w.scale.shape[0] * g == k and n % TILE == 0
            and (w.bits == 4 or g <= MAX_Q8_GROUP))


def _group(w) -> int:
    """Rows per scale as the kernels read them: one group spans K whatever its nominal size (128 over 64 rows, per
    channel); several must all be group_size long (the last one of ceil(K / group_size) may be short: refused)."""
    return w.codes.shape[0] if w.scale.shape[0] == 1 else w.group_size


def pack_q4(w) -> Q4Weight:
    """codes [K, N] (0..15 or 0..255), scale / zero [G, N] -> the kernels' tiles; zero points all equal (symmetric
    weights) are stored once."""
    k, n = w.codes.shape
    group = _group(w)
    g = k // group
    if w.bits == 4:
        c = np.asarray(w.codes, np.uint8).reshape(g, group // 8, 2, 4, n // TILE, TILE)  # group, quad pair, half, j, tile, column
        c = c.transpose(4, 0, 1, 2, 5, 3)  # tile, group, quad pair, half, column, j
        packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(n // TILE, g, group // 8, 64)
    else:
        c = np.asarray(w.codes, np.uint8).reshape(g, group // 4, 4, n // TILE, TILE)  # group, quad, j, tile, column
        packed = c.transpose(3, 0, 1, 4, 2).reshape(n // TILE, g, group // 4, 64)  # tile, group, quad, column, j

    def per_tile(a, dtype) -> np.ndarray:  # [G, N] -> [N // TILE, G, TILE]
        return np.ascontiguousarray(np.asarray(a, dtype).reshape(g, n // TILE, TILE).transpose(1, 0, 2))

    zero = np.asarray(w.zero)
    zeros = np.array([zero.flat[0]], np.int32) if np.all(zero == zero.flat[0]) else per_tile(zero, np.int32)
    return Q4Weight(w=np.ascontiguousarray(packed), scales=per_tile(w.scale, np.float32), zeros=zeros, k=k, n=n, group=group, bits=w.bits)


def unpack_q4(p: Q4Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (codes [K, N], scale [G, N], zero [G, N]): the inverse of pack_q4, for tests."""
    t, g = p.w.shape[:2]
    if p.bits == 4:
        halves = np.stack([p.w & 0x0F, p.w >> 4], axis=3).reshape(t, g, p.group // 8, 2, TILE, 4)
        codes = halves.transpose(1, 2, 3, 5, 0, 4).reshape(p.k, p.n)
    else:
        codes = p.w.reshape(t, g, p.group // 4, TILE, 4).transpose(1, 2, 4, 0, 3).reshape(p.k, p.n)

    def flat(a: np.ndarray) -> np.ndarray:  # [N // TILE, G, TILE] -> [G, N]
        return a.transpose(1, 0, 2).reshape(g, p.n)

    zero = np.full((g, p.n), p.zeros[0], np.int32) if p.zeros.size == 1 else flat(p.zeros)
    return codes, flat(p.scales), zero


def q4_gemm(gb: GraphOps, name: str, x: str, w, splits: list[int] | None = None, swiglu: bool = False) -> str | list[str]:
    """x [..., K] @ deq(w) -> [..., N] with Q4Gemm (int4) or Q8Gemm (int8).

    splits: the output's parts along N (each a multiple of 16): one output each, returned as a list (no Split node).
    swiglu: w is gate|up (N = 2 x the MLP's width); the one output [..., N / 2] is silu(gate) * up."""
    p = pack_q4(w)
    inputs = [x, gb.const(f"{name}.weight_q{p.bits}", p.w), gb.const(f"{name}.weight_scales", p.scales), gb.const(f"{name}.weight_zeros", p.zeros)]
    attrs = dict(domain=DOMAIN, K=p.k, N=p.n, group_size=p.group)
    if swiglu:
        return gb.op(p.op, inputs, f"{name}/swiglu", swiglu=1, **attrs)
    if splits is None:
        return gb.op(p.op, inputs, name, **attrs)
    inputs.append(gb.const(f"{name}/splits", np.asarray(splits, np.int64)))
    out = gb.op(p.op, inputs, name, outputs=[f"{name}/out{i}" for i in range(len(splits))], **attrs)
    return out if isinstance(out, list) else [out]


ROTARY_CACHED_ATTENTION = f"RotaryCachedAttention ({DOMAIN})"  # what an engine's weight_only["attention_op"] says when it uses the op
# (engines built before it say "CachedAttention (ai.specdec.cpu)": that op is still registered, no longer built)


def rotary_cached_attention(gb: GraphOps, name: str, q: str, k: str | None, v: str | None, past: list[str], present: list[str], positions: str,
                            cos: str, sin: str, heads: int, kv_heads: int, tree_mask: str | None = None) -> str:
    """A layer's attention from its projection: q [B, S, heads * head_dim] with k, v [B, S, kv_heads * head_dim], or the
    packed q|k|v [B, S, (heads + 2 kv_heads) * head_dim] with k, v None; past [key, value] the layer's caches
    [B, capacity, kv_heads * head_dim], present their names after the step (the same buffers where the runtime binds
    them so); positions [B, S] int64; cos, sin [positions, head_dim / 2]. Rotary on q and k, k and v written at slots
    positions[b][0] + s, then each token attends to slots 0..its position (hardware/kernels/ort_attention.c), or with
    tree_mask [B, S, S] bool (a tree engine's) to the slots before positions[b][0] and the call's tokens its mask row
    names, in call order: a tree token's output the same bits as in a chain once its path is accepted
    -> [B, S, heads * head_dim]."""
    inputs = [q, k or "", v or "", *past, positions, cos, sin] + ([tree_mask] if tree_mask else [])
    out = gb.op("RotaryCachedAttention", inputs, name, outputs=[f"{name}/out0", *present], domain=DOMAIN, num_heads=heads,
                kv_num_heads=kv_heads)
    return out[0]


def cached_attention_model(heads: int, kv_heads: int) -> bytes:
    """One CachedAttention node as a serialized model (q, k, v float32 and pos int64 -> y), for running the op alone
    (its tests, benchmarks/attention_bits.py): the session that loads it registers specdec's kernel library."""
    from onnx import TensorProto, helper

    node = helper.make_node("CachedAttention", ["q", "k", "v", "pos"], ["y"], domain=DOMAIN, num_heads=heads, kv_num_heads=kv_heads)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("q", "k", "v")]
    graph = helper.make_graph([node], "a", [*inputs, helper.make_tensor_value_info("pos", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString()
