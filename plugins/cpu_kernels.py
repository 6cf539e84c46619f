"""specdec's own CPU kernel for int4 weights: the ai.specdec.cpu::Q4Gemm op (hardware/kernels/).

ONNX Runtime's MatMulNBits reads and unpacks the 4-bit weights once for every *pair* of rows, so a 5-token
verification costs about 2x a one-token step on an int4 target, and it computes a lone row with other kernels
than rows in pairs, which costs an engine that verifies drafts an even-row padding on every one-token step
(docs/precision.md). Q4Gemm unpacks each weight block once for up to 4 rows (a tile of 4 rows x 32-64 columns,
AVX-512 VNNI integer dot products, as llama.cpp's tinyBLAS tiles do for Q4_0), and every row takes the same
instructions whatever the call's row count: no padding, and the verification logits equal the one-token logits
bit for bit.

This module is the graph side: which weights the op takes, its weight layout, the node. The C sources and their
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
    """An int4 weight in Q4Gemm's layout (hardware/kernels/q4_kernels.h)."""

    w: np.ndarray  # [N / 16, G, group / 8, 64] uint8
    scales: np.ndarray  # [N / 16, G, 16] float32
    zeros: np.ndarray  # [N / 16, G, 16] int32
    k: int
    n: int
    group: int


def q4_holds(w) -> bool:
    """Whether Q4Gemm takes ``w`` (an IntWeightLike): 4 bits, equal groups of a multiple of 8 rows (no shorter last
    group), and a multiple of 16 output columns. Others stay on MatMulNBits."""
    k, n = w.codes.shape
    g = _group(w)
    return w.bits == 4 and g > 0 and g % 8 == 0 and w.scale.shape[0] * g == k and n % TILE == 0


def _group(w) -> int:
    """Rows per scale as Q4Gemm reads them: one group spans K whatever its nominal size (128 over 64 rows, per
    channel); several must all be group_size long (the last one of ceil(K / group_size) may be short: refused)."""
    return w.codes.shape[0] if w.scale.shape[0] == 1 else w.group_size


def pack_q4(w) -> Q4Weight:
    """codes [K, N] (0..15), scale / zero [G, N] -> Q4Gemm's tiles."""
    k, n = w.codes.shape
    group = _group(w)
    g = k // group
    c = np.asarray(w.codes, np.uint8).reshape(g, group // 8, 2, 4, n // TILE, TILE)  # group, quad pair, half, j, tile, column
    c = c.transpose(4, 0, 1, 2, 5, 3)  # tile, group, quad pair, half, column, j
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(n // TILE, g, group // 8, 64)
    def per_tile(a, dtype) -> np.ndarray:  # [G, N] -> [N // TILE, G, TILE]
        return np.ascontiguousarray(np.asarray(a, dtype).reshape(g, n // TILE, TILE).transpose(1, 0, 2))

    return Q4Weight(w=np.ascontiguousarray(packed), scales=per_tile(w.scale, np.float32), zeros=per_tile(w.zero, np.int32), k=k, n=n, group=group)


def unpack_q4(p: Q4Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (codes [K, N], scale [G, N], zero [G, N]): the inverse of pack_q4, for tests."""
    t, g = p.w.shape[:2]
    halves = np.stack([p.w & 0x0F, p.w >> 4], axis=3).reshape(t, g, p.group // 8, 2, TILE, 4)
    codes = halves.transpose(1, 2, 3, 5, 0, 4).reshape(p.k, p.n)
    def flat(a: np.ndarray) -> np.ndarray:  # [N // TILE, G, TILE] -> [G, N]
        return a.transpose(1, 0, 2).reshape(g, p.n)

    return codes, flat(p.scales), flat(p.zeros)


def q4_gemm(gb: GraphOps, name: str, x: str, w) -> str:
    """x [..., K] @ deq(w) -> [..., N] with Q4Gemm."""
    p = pack_q4(w)
    inputs = [gb.const(f"{name}.weight_q4", p.w), gb.const(f"{name}.weight_scales", p.scales), gb.const(f"{name}.weight_zeros", p.zeros)]
    return gb.op("Q4Gemm", [x, *inputs], name, domain=DOMAIN, K=p.k, N=p.n, group_size=p.group)
