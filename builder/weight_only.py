"""Weight-only integer weights (W8A16 / W4A16): one representation for every source.

A linear layer's quantized weight is an ``IntWeight``: unsigned codes, a scale
and a zero point per (group of input rows, output column). Round-to-nearest at
build time, AWQ-scaled weights and GPTQ/AWQ/compressed-tensors checkpoints all
become this, and the lowerings (plugins/) pack it for their op
(``com.microsoft.MatMulNBits``, or blocked ``DequantizeLinear`` + ``MatMul``).

    w[i, o] = (codes[i, o] - zero[i // group_size, o]) * scale[i // group_size, o]

computed in float32 is what every lowering must mean (``dequantized``); the
tests compare the engines against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BITS = (4, 8)
WEIGHT_ONLY_BITS = {"int8_wo": 8, "int4_wo": 4, "int4_awq": 4}  # --quantization -> bits
DEFAULT_GROUP_SIZE = {4: 128, 8: 0}  # int4: groups of 128 input rows; int8: per output channel (TensorRT-LLM's defaults)
GROUP_SIZES = (0, 32, 64, 128)  # 0 = per output channel


@dataclass(frozen=True)
class WeightOnlyScheme:
    """How a build quantizes its linear layers, resolved from the BuildConfig."""

    bits: int
    group_size: int  # 0 = per output channel
    symmetric: bool

    @classmethod
    def of(cls, build) -> WeightOnlyScheme | None:
        """None unless ``build.quantization`` is a weight-only one (its group size already resolved)."""
        bits = WEIGHT_ONLY_BITS.get(build.quantization)
        if bits is None:
            return None
        group = DEFAULT_GROUP_SIZE[bits] if build.group_size is None else build.group_size
        return cls(bits, group, build.symmetric)


@dataclass
class IntWeight:
    """A linear layer's weight as integer codes, transposed to [in, out] like ``LinearWeight``."""

    codes: np.ndarray  # [in, out] uint8, 0 .. 2**bits - 1
    scale: np.ndarray  # [groups, out] float32, groups = ceil(in / group_size)
    zero: np.ndarray  # [groups, out] uint8 codes; symmetric: all 2**(bits - 1)
    bits: int
    group_size: int  # input rows per scale; == in for per-channel
    symmetric: bool
    # GPTQ act-order: stored row r holds input channel perm[r], so y = x[..., perm] @ w_stored
    perm: np.ndarray | None = None  # [in] int64
    source: str = "rtn"  # rtn | awq | gptq | awq-checkpoint | compressed-tensors | gguf

    @property
    def in_features(self) -> int:
        return self.codes.shape[0]

    @property
    def out_features(self) -> int:
        return self.codes.shape[1]

    def dequantized_stored(self) -> np.ndarray:
        """[in, out] float32 in stored row order (before undoing ``perm``)."""
        g = self.group_size
        n_in = self.codes.shape[0]
        zero = np.repeat(self.zero.astype(np.float32), g, axis=0)[:n_in]
        scale = np.repeat(self.scale.astype(np.float32), g, axis=0)[:n_in]
        return (self.codes.astype(np.float32) - zero) * scale

    def dequantized(self) -> np.ndarray:
        """[in, out] float32 in input-channel order: what the layer computes with."""
        w = self.dequantized_stored()
        if self.perm is None:
            return w
        out = np.empty_like(w)
        out[self.perm] = w
        return out


def quantize_rtn(w_t: np.ndarray, bits: int, group_size: int, symmetric: bool = True) -> IntWeight:
    """Round-to-nearest: float32 [in, out] -> IntWeight; ``group_size`` 0 = per output channel.

    symmetric: scale = amax / (2**(bits-1) - 1), zero = 2**(bits-1) (codes use -7..7 / -127..127 around it).
    asymmetric: the group's [min, max] (widened to hold 0, so zero is exact) over 2**bits - 1 steps.
    An all-zero group gets scale 1: its codes dequantize to exact zeros.
    """
    if bits not in BITS:
        raise ValueError(f"bits={bits}; expected one of {BITS}")
    w_t = np.asarray(w_t, np.float32)
    n_in, n_out = w_t.shape
    g = group_size or n_in
    groups = -(-n_in // g)
    padded = np.zeros((groups * g, n_out), np.float32)
    padded[:n_in] = w_t
    blocks = padded.reshape(groups, g, n_out)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        amax = np.abs(blocks).max(axis=1)
        scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
        zero = np.full((groups, n_out), 2 ** (bits - 1), np.uint8)
        q = np.clip(np.rint(blocks / scale[:, None, :]), -qmax, qmax) + 2 ** (bits - 1)
    else:
        levels = 2**bits - 1
        lo = np.minimum(blocks.min(axis=1), 0.0)
        hi = np.maximum(blocks.max(axis=1), 0.0)
        scale = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
        zero_f = np.clip(np.rint(-lo / scale), 0, levels)
        zero = zero_f.astype(np.uint8)
        q = np.clip(np.rint(blocks / scale[:, None, :]) + zero_f[:, None, :], 0, levels)
    codes = q.reshape(groups * g, n_out)[:n_in].astype(np.uint8)
    return IntWeight(codes=codes, scale=scale, zero=zero, bits=bits, group_size=g, symmetric=symmetric)
