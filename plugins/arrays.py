"""Array copies the builder and the lowerings make of every weight, made fast where numpy is slow."""

from __future__ import annotations

import numpy as np

TRANSPOSE_TILE = 256  # elements per side: a tile of each array fits in the cache


def c_order(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array. A transposed 2-D view (every linear weight: checkpoints store [out, in], the graph
    [in, out]; MatMulNBits packs [N, K] back) is copied tile by tile: numpy's own strided copy of a large transpose
    runs 2-3x slower (an 8B model's weights are billions of such elements)."""
    if a.flags.c_contiguous:
        return a
    if a.ndim != 2 or not a.flags.f_contiguous:
        return np.ascontiguousarray(a)
    out = np.empty(a.shape, a.dtype)
    t = TRANSPOSE_TILE
    for i in range(0, a.shape[0], t):
        for j in range(0, a.shape[1], t):
            out[i : i + t, j : j + t] = a[i : i + t, j : j + t]
    return out
