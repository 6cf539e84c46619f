"""Weight-only integer GEMMs (W8A16 / W4A16): how each lowering stores and multiplies them.

Every lowering means the same thing, ``y = x[..., perm] @ deq(codes)`` with
``deq = (codes - zero) * scale`` per (group of input rows, output column),
computed in float32 by builder/weight_only.py's ``IntWeight.dequantized``.
They differ in what the backend runs fastest:

* portable: standard ONNX ``DequantizeLinear`` (int4/uint4 or int8/uint8
  weight ``[in, out]``, ``block_size`` along the input axis) feeding
  ``MatMul``: the pattern TensorRT fuses into weight-only GEMMs. The
  executor (runtime/backends/onnxruntime/cpu.py, ``session.disable_quant_qdq``) has ONNX
  Runtime fold these constant DequantizeLinear into float32 at load: small
  on disk, float32 in memory and compute on a CPU.
* ort_cpu: ``com.microsoft.MatMulNBits``: the weight stays packed in memory
  and each step reads its 4 or 8 bits per value. Some of its kernels compute
  one row differently from a pair of rows (docs/precision.md); where the
  installed ONNX Runtime does that for a weight's shape (``nbits_rows_split``
  measures it at build time), the activations are padded to an even number of
  rows: a one-token step then runs the very kernel a verification step runs,
  and speculative decoding stays exact. Where it does not, nothing is padded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from onnx import TensorProto

from .arrays import c_order
from .graph_api import GraphOps

CONTRIB = "com.microsoft"
NBITS_BLOCKS = (128, 64, 32, 16)  # MatMulNBits block sizes, largest first (powers of two >= 16)
NBITS_ACCURACY_LEVEL = 4  # int8 activations per block: measured fastest (docs/precision.md)


class IntWeightLike(Protocol):
    """builder/weight_only.py's IntWeight, as the lowerings read it."""

    codes: np.ndarray  # [in, out] uint8
    scale: np.ndarray  # [groups, out] float32
    zero: np.ndarray  # [groups, out] uint8
    bits: int
    group_size: int
    perm: np.ndarray | None  # [in] int64 (GPTQ act-order) or None


def _is_signed(w: IntWeightLike) -> bool:
    """Every zero point at mid-range: the codes are plain signed integers around it, no zero point needed."""
    return bool(np.all(w.zero == 1 << (w.bits - 1)))


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """uint8 values 0..15, flat -> two per byte, the first in the low nibble (ONNX int4 and MatMulNBits order)."""
    v = np.asarray(values, np.uint8).reshape(-1)
    if v.size % 2:
        v = np.concatenate([v, np.zeros(1, np.uint8)])
    return (v[0::2] & 0xF) | ((v[1::2] & 0xF) << 4)


def unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    p = np.asarray(packed, np.uint8).reshape(-1)
    return np.stack([p & 0xF, p >> 4], axis=-1).reshape(-1)[:count]


# -- com.microsoft.MatMulNBits ---------------------------------------------------


@dataclass
class NBitsWeight:
    """A weight in MatMulNBits' layout."""

    b: np.ndarray  # [N, k_blocks, block_size * bits / 8] uint8: codes along K, low nibble first for 4 bits
    scales: np.ndarray  # [N * k_blocks] float32
    zero_points: np.ndarray | None  # 4 bits: [N * ceil(k_blocks / 2)] packed; 8 bits: [N * k_blocks]; None = mid-range
    k: int
    n: int
    bits: int
    block_size: int


def nbits_block_size(in_features: int, group_size: int) -> int:
    """The MatMulNBits block for a group: the largest power of two >= 16 dividing it (each group's scale
    repeated over its blocks, exact), else, for one group spanning K (per channel), one block covering K."""
    for b in NBITS_BLOCKS:
        if group_size % b == 0:
            return b
    if group_size >= in_features:
        return max(16, 1 << (in_features - 1).bit_length())
    raise ValueError(f"group size {group_size} has no power-of-two block >= 16 dividing it; MatMulNBits cannot hold it exactly")


def nbits_holds(w: IntWeightLike) -> bool:
    """Whether MatMulNBits can hold ``w``'s groups exactly (a checkpoint may use a group of 40 rows, say)."""
    try:
        nbits_block_size(w.codes.shape[0], w.group_size)
    except ValueError:
        return False
    return True


def pack_matmul_nbits(w: IntWeightLike) -> NBitsWeight:
    k, n = w.codes.shape
    block = nbits_block_size(k, w.group_size)
    k_blocks = -(-k // block)
    group_of_block = np.minimum(np.arange(k_blocks) * block // w.group_size, w.scale.shape[0] - 1)
    codes = np.zeros((k_blocks * block, n), np.uint8)  # rows past K: never multiplied (A has K columns)
    codes[:k] = w.codes
    b = c_order(codes.T).reshape(n, k_blocks, block)
    zero = np.ascontiguousarray(w.zero[group_of_block].T)  # [N, k_blocks]
    if w.bits == 4:
        b = pack_nibbles(b).reshape(n, k_blocks, block // 2)
        if _is_signed(w):
            zero_points = None
        else:  # each output column's zero points start on a byte: pad every row to an even count, pack all at once
            zero_points = pack_nibbles(np.pad(zero, ((0, 0), (0, k_blocks % 2))))
    else:
        zero_points = zero.reshape(-1) if not _is_signed(w) else None
    scales = np.ascontiguousarray(w.scale[group_of_block].T, dtype=np.float32).reshape(-1)
    return NBitsWeight(b=b, scales=scales, zero_points=zero_points, k=k, n=n, bits=w.bits, block_size=block)


def unpack_matmul_nbits(p: NBitsWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (codes [K, N], scale [k_blocks, N], zero [k_blocks, N]): the inverse of the packing, for tests."""
    n, k_blocks, _ = p.b.shape
    if p.bits == 4:
        codes = unpack_nibbles(p.b, n * k_blocks * p.block_size).reshape(n, k_blocks * p.block_size)
    else:
        codes = p.b.reshape(n, k_blocks * p.block_size)
    scale = p.scales.reshape(n, k_blocks).T
    if p.zero_points is None:
        zero = np.full((k_blocks, n), 1 << (p.bits - 1), np.uint8)
    elif p.bits == 4:
        per_col = -(-k_blocks // 2)
        zero = np.stack([unpack_nibbles(p.zero_points[c * per_col : (c + 1) * per_col], k_blocks) for c in range(n)]).T
    else:
        zero = p.zero_points.reshape(n, k_blocks).T
    return codes.T[: p.k], scale, zero


@functools.cache
def nbits_rows_split(k: int, n: int, bits: int, block_size: int, accuracy_level: int, max_rows: int) -> bool:
    """Whether this machine's ONNX Runtime computes some row of a MatMulNBits call of 2..max_rows rows with
    other bits than the same row alone (a lone row takes another kernel). Measured, not assumed: MLAS picks
    kernels by bits, block size, accuracy level and instruction set, and a new release may change which.

    Raises RuntimeError when even-row padding would not help either (a row of an even-row call differs from
    the row in a two-row call): no padding makes such a kernel exact.
    """
    import onnxruntime as ort
    from onnx import helper

    rng = np.random.default_rng(0)
    k_blocks = -(-k // block_size)
    codes = rng.integers(0, 1 << bits, size=(n, k_blocks * block_size), dtype=np.uint8)
    b = (pack_nibbles(codes) if bits == 4 else codes.reshape(-1)).reshape(n, k_blocks, block_size * bits // 8)
    scales = rng.uniform(0.001, 0.02, n * k_blocks).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["x", "b", "scales"], ["y"], domain=CONTRIB, K=k, N=n, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "rows_probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                              [helper.make_tensor("b", TensorProto.UINT8, list(b.shape), b.tobytes(), raw=True),
                               helper.make_tensor("scales", TensorProto.FLOAT, [scales.size], scales.tobytes(), raw=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(CONTRIB, 1)])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((max_rows, k)).astype(np.float32)  # x: [rows, K]
    alone = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(max_rows)])  # [rows, N]
    paired = np.concatenate([sess.run(None, {"x": np.stack([x[i], np.zeros(k, np.float32)])})[0][:1] for i in range(max_rows)])
    split = False
    for m in range(2, max_rows + 1):
        y = sess.run(None, {"x": x[:m]})[0]
        split |= not np.array_equal(y, alone[:m])
        if m % 2 == 0 and not np.array_equal(y, paired[:m]):
            raise RuntimeError(f"ONNX Runtime {ort.__version__}'s MatMulNBits ({bits} bits, K={k}, N={n}, block {block_size}, "
                               f"accuracy_level {accuracy_level}) computes rows of a {m}-row call unlike the same rows in pairs: "
                               "verification could not reproduce one-token steps; build with another --group_size or --lowering portable.")
    return split


class EvenRows:
    """Values shared by the MatMulNBits calls whose activations have the leading shape of ``rows``
    ([B, S]): the padding that makes their row count B * S even, and the slice that undoes it.

    B * S is odd only when B and S both are, and then B * (S + 1) is even: one zero token at the end
    of every sequence does it, on the 3-D activation itself (no reshapes: two extra nodes a GEMM).
    """

    def __init__(self, gb: GraphOps, rows: str):
        p = f"{rows}/even_rows"
        lead = gb.op("Shape", [rows], f"{p}/lead")  # [2]: batch, tokens
        count = gb.op("ReduceProd", [lead], f"{p}/count", keepdims=1)  # [1]
        odd = gb.op("Mod", [count, gb.const(f"{p}/two", np.array([2], np.int64))], f"{p}/odd")
        # Pad's [begin x3, end x3] on [B, S, K]: `odd` zero tokens after each sequence
        self.pads = gb.op("Concat", [gb.const(f"{p}/zeros", np.zeros(4, np.int64)), odd, gb.const(f"{p}/zero", np.array([0], np.int64))],
                          f"{p}/pads", axis=0)
        self.tokens = gb.op("Slice", [lead, gb.const(f"{p}/one", np.array([1], np.int64)), gb.const(f"{p}/two_end", np.array([2], np.int64))],
                            f"{p}/tokens")  # [1]: S
        self.start = gb.const(f"{p}/start", np.array([0], np.int64))
        self.axis = gb.const(f"{p}/axis", np.array([1], np.int64))


def matmul_nbits(gb: GraphOps, name: str, x: str, w: IntWeightLike | NBitsWeight, rows: EvenRows | None,
                 accuracy_level: int = NBITS_ACCURACY_LEVEL, scale_type: int = TensorProto.FLOAT) -> str:
    """x [B, S, K] @ deq(w) -> [B, S, N] with MatMulNBits; over an even number of rows unless ``rows`` is None.

    scale_type: the activations' type, which MatMulNBits' scales must share (float16/bfloat16 on a GPU: the scales are
    rounded to it, so the engine's weights are (codes - zero) * scale in that precision)."""
    p = w if isinstance(w, NBitsWeight) else pack_matmul_nbits(w)
    inputs = [gb.const(f"{name}.weight_packed", p.b), _scales(gb, f"{name}.weight_scales", p.scales, scale_type)]
    if p.zero_points is not None:
        inputs.append(gb.const(f"{name}.weight_zero_points", p.zero_points))
    attrs = dict(domain=CONTRIB, K=p.k, N=p.n, bits=p.bits, block_size=p.block_size, accuracy_level=accuracy_level)
    if rows is None:
        return gb.op("MatMulNBits", [x, *inputs], name, **attrs)
    padded = gb.op("Pad", [x, rows.pads], f"{name}/even_rows")
    y = gb.op("MatMulNBits", [padded, *inputs], f"{name}/matmul_nbits", **attrs)
    return gb.op("Slice", [y, rows.start, rows.tokens, rows.axis], name)


def _scales(gb: GraphOps, name: str, scales: np.ndarray, elem_type: int) -> str:
    """float32 scales in ``elem_type``: float32 as given; a half-precision lowering's (whose weights are stored in the
    compute dtype, so gb.weight adds no cast) rounded to that dtype like every other weight."""
    if elem_type == TensorProto.FLOAT:
        return gb.const(name, scales.astype(np.float32))
    if gb.compute_type != elem_type:
        raise ValueError(f"{name}: scales of type {elem_type} need a lowering that computes in that type")
    return gb.weight(name, scales)


# -- standard ONNX: blocked DequantizeLinear + MatMul ------------------------------


def dq_tensors(w: IntWeightLike) -> tuple[int, bytes, np.ndarray | None]:
    """-> (ONNX element type, raw bytes of the [in, out] weight, zero point array or None).

    Symmetric weights (every zero at mid-range) become signed int4/int8 without a zero point
    (what TensorRT's weight-only GEMMs take); others unsigned with a zero point per group.
    """
    mid = 1 << (w.bits - 1)
    if _is_signed(w):
        signed = (w.codes.astype(np.int16) - mid).astype(np.int8)
        if w.bits == 4:
            return TensorProto.INT4, pack_nibbles(signed.view(np.uint8) & 0xF).tobytes(), None
        return TensorProto.INT8, signed.tobytes(), None
    if w.bits == 4:
        return TensorProto.UINT4, pack_nibbles(w.codes).tobytes(), w.zero
    return TensorProto.UINT8, np.ascontiguousarray(w.codes).tobytes(), w.zero


def dq_codes(elem_type: int, raw: bytes, shape: tuple[int, int]) -> np.ndarray:
    """The inverse of ``dq_tensors``' weight bytes: signed or unsigned codes as int16 [in, out], for tests."""
    count = shape[0] * shape[1]
    if elem_type in (TensorProto.INT4, TensorProto.UINT4):
        v = unpack_nibbles(np.frombuffer(raw, np.uint8), count).astype(np.int16)
        if elem_type == TensorProto.INT4:
            v = np.where(v >= 8, v - 16, v)
        return v.reshape(shape)
    dtype = np.int8 if elem_type == TensorProto.INT8 else np.uint8
    return np.frombuffer(raw, dtype).astype(np.int16).reshape(shape)


def dq_matmul(gb: GraphOps, name: str, x: str, w: IntWeightLike) -> str:
    """x [B, S, K] @ DequantizeLinear(w) -> [B, S, N]: blocked along K, or per output channel for one group."""
    elem_type, raw, zero = dq_tensors(w)
    k, n = w.codes.shape
    per_channel = w.scale.shape[0] == 1
    scale = w.scale[0] if per_channel else w.scale  # [out] per channel, else [groups, out]
    inputs = [gb.raw_const(f"{name}.weight", elem_type, [k, n], raw), gb.const(f"{name}.weight_scale", np.asarray(scale, np.float32))]
    if zero is not None:
        zdims = [n] if per_channel else list(zero.shape)
        zraw = pack_nibbles(zero).tobytes() if w.bits == 4 else np.ascontiguousarray(zero).tobytes()
        inputs.append(gb.raw_const(f"{name}.weight_zero_point", elem_type, zdims, zraw))
    attrs = dict(axis=1) if per_channel else dict(axis=0, block_size=w.group_size)
    weight = gb.op("DequantizeLinear", inputs, f"{name}/dequant", **attrs)
    return gb.op("MatMul", [x, weight], name)


def permute_input(gb: GraphOps, name: str, x: str, w: IntWeightLike) -> str:
    """GPTQ act-order: the stored row r holds input channel perm[r], so the layer reads x[..., perm]."""
    if w.perm is None:
        return x
    return gb.op("Gather", [x, gb.const(f"{name}.input_perm", np.asarray(w.perm, np.int64))], f"{name}/act_order", axis=-1)
