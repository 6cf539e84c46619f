"""Pre-quantized integer checkpoints, read as they are published: GPTQ, AWQ, compressed-tensors.

Each convention packs the same thing, w = (q - zero) * scale per (group of
input rows, output column), into int32 words in its own order. Here each is
unpacked into an ``IntWeight`` (builder/weight_only.py) bit for bit: the codes,
zero points and scales are the checkpoint's own, so ``IntWeight.dequantized()``
is exactly what the checkpoint means, with no dequantize-requantize step.

Layouts (the writers and loaders each function follows are named at it):

  gptq   qweight [in * bits / 32, out] int32, packed along the input rows;
         qzeros [groups, out * bits / 32] int32, packed along the output
         columns; scales [groups, out] fp16; g_idx [in] int32 (act-order).
         checkpoint_format "gptq" (v1) stores zero - 1; "gptq_v2" stores zero.
  awq    (AutoAWQ GEMM) qweight [in, out * bits / 32] and qzeros
         [groups, out * bits / 32], both packed along the output columns in the
         interleaved order [0, 2, 4, 6, 1, 3, 5, 7]; scales [groups, out] fp16.
  compressed-tensors  (format pack-quantized) weight_packed [out, ceil(in * bits / 32)]
         packed along the input; weight_scale [out, groups]; signed codes and
         zero points stored offset by 2**(bits - 1); asymmetric zero points
         packed along the output rows ([ceil(out * bits / 32), groups]);
         weight_shape [out, in]; optional weight_g_idx [in].

Within an int32 word, value j always sits at bits [j * bits, (j + 1) * bits).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.errors import CheckpointError
from ..formats.hf_config import config_groups, value_at
from .gguf_checkpoint import is_gguf
from .weight_only import BITS, IntWeight

# AutoAWQ WQLinear_GEMM.from_linear packs output column order_map[j] into nibble j
# (order_map = [0, 2, 4, 6, 1, 3, 5, 7]); transformers/vLLM unpack with its inverse.
AWQ_PACK_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])


@dataclass(frozen=True)
class IntConvention:
    """A pre-quantized integer (weight-only) checkpoint: how its packed tensors are laid out."""

    method: str  # gptq | awq | compressed-tensors
    bits: int
    group_size: int  # 0 = per output channel
    symmetric: bool
    act_order: bool = False  # GPTQ desc_act / compressed-tensors actorder "group": g_idx permutes the groups
    layout: str = ""  # gptq | gptq_v2 (zero points stored as is) | gemm | pack-quantized | Q4_0 | Q8_0 (gguf)


# ---------------------------------------------------------------------------
# config.json -> IntConvention
# ---------------------------------------------------------------------------


def detect_int_convention(hf_config: dict[str, Any], checkpoint_dir) -> IntConvention | None:
    """The integer convention of a GPTQ / AWQ / compressed-tensors pack-quantized checkpoint, else None."""
    qc = hf_config.get("quantization_config")
    if qc is None and checkpoint_dir is not None:
        legacy = Path(checkpoint_dir) / "quantize_config.json"  # AutoGPTQ before transformers integration
        if legacy.is_file():
            qc = {"quant_method": "gptq", **json.loads(legacy.read_text())}
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "gguf" and checkpoint_dir is not None and is_gguf(checkpoint_dir):  # its Q4_0 / Q8_0 blocks (gguf_checkpoint.py says so)
        return IntConvention("gguf", int(qc["bits"]), int(qc["group_size"]), True, layout=str(qc["ggml_type"]))
    if method == "gptq":
        conv = _gptq_convention(qc)
    elif method == "awq":
        conv = _awq_convention(qc)
    elif method == "compressed-tensors" and _is_pack_quantized(qc):
        conv = _compressed_convention(qc)
    else:
        return None
    if checkpoint_dir is not None:
        _refuse_quantized_lm_head(Path(checkpoint_dir), conv)
    return conv


def _bits(value: Any, method: str, allowed: tuple[int, ...] = BITS) -> int:
    if value not in allowed:
        raise CheckpointError(f"{method} checkpoint with bits={value!r} is not supported; expected one of {', '.join(map(str, allowed))}.")
    return int(value)


def _group_size(value: Any, method: str) -> int:
    """-1 (or None) means one group over all input rows: per output channel, 0 here."""
    if value in (-1, None):
        return 0
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{method} checkpoint with group_size={value!r} is not supported; expected a positive integer or -1 (per channel).")
    return value


def _gptq_convention(qc: dict[str, Any]) -> IntConvention:
    # Field names as AutoGPTQ / GPTQModel write them into quantize_config.json and config.json.
    bits = _bits(qc.get("bits"), "GPTQ")
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if qc.get("is_marlin_format"):
        fmt = "marlin"
    if fmt not in ("gptq", "gptq_v2"):
        raise CheckpointError(f"GPTQ checkpoint_format {fmt!r} is not supported; expected 'gptq' or 'gptq_v2' (re-save the model in GPTQ format).")
    if qc.get("pack_dtype", "int32") != "int32":
        raise CheckpointError(f"GPTQ pack_dtype {qc.get('pack_dtype')!r} is not supported; expected int32.")
    if qc.get("dynamic"):
        raise CheckpointError("GPTQ per-module overrides (quantization_config.dynamic) are not supported; expected one bits/group_size for every "
                              "layer.")
    if qc.get("lm_head"):
        raise CheckpointError("GPTQ checkpoint with a quantized lm_head (lm_head: true) is not supported; expected lm_head in float.")
    return IntConvention(
        "gptq", bits, _group_size(qc.get("group_size", 128), "GPTQ"), bool(qc.get("sym", True)), bool(qc.get("desc_act", False)), fmt
    )


def _awq_convention(qc: dict[str, Any]) -> IntConvention:
    # transformers' AwqConfig (bits, group_size, zero_point, version, backend); AutoAWQ's own
    # quant_config spelling (w_bit, q_group_size) accepted too.
    bits = _bits(qc.get("bits", qc.get("w_bit")), "AWQ", allowed=(4,))  # AutoAWQ GEMM packs 4-bit only
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise CheckpointError(f"AWQ version {version!r} is not supported; expected 'gemm' (GEMV, GEMV_fast, Marlin and ExLlama layouts pack "
                              "differently).")
    backend = str(qc.get("backend", "autoawq")).lower()
    if backend != "autoawq":
        raise CheckpointError(f"AWQ backend {backend!r} is not supported; expected AutoAWQ's GEMM layout (backend 'autoawq').")
    if not qc.get("zero_point", True):
        raise CheckpointError("AWQ checkpoint with zero_point: false is not supported; AutoAWQ's GEMM layout stores zero points (expected "
                              "zero_point: true).")
    group_size = _group_size(qc.get("group_size", qc.get("q_group_size", 128)), "AWQ")
    return IntConvention("awq", bits, group_size, symmetric=False, layout="gemm")


def _is_pack_quantized(qc: dict[str, Any]) -> bool:
    groups = config_groups(qc).values()
    return qc.get("format") == "pack-quantized" or any(g.get("format") == "pack-quantized" for g in groups)


def _compressed_convention(qc: dict[str, Any]) -> IntConvention:
    # compressed-tensors QuantizationConfig / QuantizationArgs field names.
    schemes = {}
    for name, group in config_groups(qc).items():
        if group.get("input_activations") or group.get("output_activations"):
            raise CheckpointError(f"compressed-tensors group {name!r} quantizes activations too; only weight-only (W4A16 / W8A16) pack-quantized "
                                  "checkpoints are supported.")
        fmt = group.get("format") or qc.get("format")
        if fmt != "pack-quantized":
            raise CheckpointError(f"compressed-tensors group {name!r} has format {fmt!r}; mixed formats are not supported (expected pack-quantized "
                                  "throughout).")
        w = group.get("weights") or {}
        schemes[json.dumps({k: w.get(k) for k in ("num_bits", "type", "symmetric", "strategy", "group_size", "actorder", "dynamic")},
                           sort_keys=True)] = w
    if len(schemes) != 1:
        raise CheckpointError(f"compressed-tensors checkpoint has {len(schemes)} different weight schemes; expected exactly one (mixed precision is "
                              "not supported).")
    sparsity = qc.get("sparsity_config") or {}
    if not isinstance(sparsity, dict) or sparsity.get("format") not in (None, "dense"):
        raise CheckpointError(f"compressed-tensors sparsity format {value_at(qc, 'sparsity_config.format')!r} is not supported; expected dense.")
    if qc.get("transform_config"):
        raise CheckpointError("compressed-tensors checkpoint with transform_config (rotations) is not supported.")
    (w,) = schemes.values()
    if w.get("type") != "int":
        raise CheckpointError(f"compressed-tensors pack-quantized weights of type {w.get('type')!r} are not supported; expected int.")
    if w.get("dynamic"):
        raise CheckpointError("compressed-tensors weights with dynamic: true are not supported; expected static scales.")
    bits = _bits(w.get("num_bits"), "compressed-tensors")
    strategy = w.get("strategy")
    if strategy == "group":
        group_size = _group_size(w.get("group_size"), "compressed-tensors")
    elif strategy in ("channel", "tensor"):  # a per-tensor scale is the same scale in every column
        group_size = 0
    else:
        raise CheckpointError(f"compressed-tensors weight strategy {strategy!r} is not supported; expected group, channel or tensor.")
    act_order = w.get("actorder") in ("group", "dynamic")  # "weight"/"static" keep contiguous groups
    return IntConvention("compressed-tensors", bits, group_size, bool(w.get("symmetric", True)), act_order, "pack-quantized")


_PACKED_NAMES = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}


def _refuse_quantized_lm_head(root: Path, conv: IntConvention) -> None:
    """The network reads lm_head.weight (else ties it to the embedding): a packed lm_head must not go unnoticed."""
    packed = f"lm_head.{_PACKED_NAMES[conv.method]}"
    index = root / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = set(json.loads(index.read_text()).get("weight_map", {}))
        else:
            from ..formats.safetensors_io import SafetensorsFile

            names = {n for f in root.glob("*.safetensors") for n in SafetensorsFile(f).keys()}
    except (OSError, ValueError, CheckpointError):
        return  # load_checkpoint reports unreadable files itself
    if packed in names:
        raise CheckpointError(f"{conv.method} checkpoint quantizes lm_head ({packed}); a quantized lm_head is not supported, expected lm_head.weight "
                              "in float.")


# ---------------------------------------------------------------------------
# int32 words -> codes
# ---------------------------------------------------------------------------


def _pack_factor(bits: int) -> int:
    return 32 // bits


def unpack_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] int32 -> [R * 32/bits, C] uint8: value j of word [r, c] is row r * 32/bits + j."""
    pf = _pack_factor(bits)
    if sys.byteorder == "little" and bits in (4, 8):
        # Byte k of a little-endian word holds its values 2k, 2k+1 (4 bits) or k (8 bits): work on bytes, about
        # twice as fast as shifting whole words (GPTQ qweight is most of a checkpoint, read twice per build).
        r, c = packed.shape
        b = np.ascontiguousarray(packed).view(np.uint8).reshape(r, c, 4).transpose(0, 2, 1)  # [R, 4, C]
        if bits == 8:
            return b.reshape(r * 4, c)
        out = np.empty((r, 8, c), np.uint8)
        np.bitwise_and(b, 0xF, out=out[:, 0::2])
        np.right_shift(b, 4, out=out[:, 1::2])
        return out.reshape(r * 8, c)
    shifts = (np.arange(pf, dtype=np.uint32) * bits)[None, :, None]
    words = packed.view(np.uint32)[:, None, :]
    return ((words >> shifts) & (2**bits - 1)).astype(np.uint8).reshape(packed.shape[0] * pf, packed.shape[1])


def unpack_cols(packed: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] int32 -> [R, C * 32/bits] uint8: value j of word [r, c] is column c * 32/bits + j."""
    pf = _pack_factor(bits)
    shifts = np.arange(pf, dtype=np.uint32) * bits
    words = packed.view(np.uint32)[:, :, None]
    return ((words >> shifts) & (2**bits - 1)).astype(np.uint8).reshape(packed.shape[0], packed.shape[1] * pf)


def unpack_awq_cols(packed: np.ndarray, bits: int = 4) -> np.ndarray:
    """AutoAWQ GEMM: [R, C] int32 -> [R, C * 8] uint8, undoing the [0, 2, 4, 6, 1, 3, 5, 7] interleave."""
    nibbles = unpack_cols(packed, bits).reshape(packed.shape[0], packed.shape[1], 8)
    out = np.empty_like(nibbles)
    out[:, :, AWQ_PACK_ORDER] = nibbles  # nibble j holds column AWQ_PACK_ORDER[j]
    return out.reshape(packed.shape[0], packed.shape[1] * 8)


# ---------------------------------------------------------------------------
# tensors -> IntWeight
# ---------------------------------------------------------------------------


def read_int_weight(ckpt, name: str, conv: IntConvention) -> IntWeight | None:
    """Module ``name``'s packed weight as an IntWeight; None when the module is stored in float
    (modules_to_not_convert / ignore lists leave some layers unquantized)."""
    if conv.method == "gguf":  # the layer's own ggml type decides: Q4_0 / Q8_0 as codes, anything else dequantized
        return ckpt.int_weight(f"{name}.weight")
    packed = f"{name}.{_PACKED_NAMES[conv.method]}"
    if packed not in ckpt:
        if f"{name}.weight" in ckpt:
            return None
        raise CheckpointError(f"checkpoint {ckpt.path} has neither {packed!r} ({conv.method}) nor {name}.weight; is the config's architecture right?")
    reader = {"gptq": _read_gptq, "awq": _read_awq, "compressed-tensors": _read_compressed}[conv.method]
    return reader(ckpt, name, conv)


def _tensor(ckpt, name: str, owner: str, dtypes: tuple[str, ...]) -> np.ndarray:
    if name not in ckpt:
        raise CheckpointError(f"quantized weight {owner} has no {name!r}; the checkpoint is incomplete or uses another convention.")
    code = ckpt.dtype_name(name)
    if code not in dtypes:
        raise CheckpointError(f"{name} has dtype {code}; expected {' or '.join(dtypes)}.")
    try:
        return ckpt.raw(name) if code.startswith(("I", "U")) else ckpt.float32(name)
    except AttributeError as err:  # the opt-in pickle reader has no raw bits
        raise CheckpointError(f"{name}: packed integer checkpoints are read from safetensors only.") from err


_FLOATS = ("F16", "BF16", "F32")
_INTS = ("I32", "I64")


def _expect(name: str, array: np.ndarray, shape: tuple[int, ...], why: str) -> None:
    if tuple(array.shape) != tuple(shape):
        raise CheckpointError(f"{name} has shape {list(array.shape)}; expected {list(shape)} ({why}).")


def _scales(name: str, scale: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(scale)):
        raise CheckpointError(f"{name} holds non-finite scales.")
    return np.ascontiguousarray(scale, dtype=np.float32)


def _groups(n_in: int, conv: IntConvention) -> tuple[int, int]:
    """(rows per group, number of groups) for ``n_in`` input rows."""
    g = conv.group_size or n_in
    return g, -(-n_in // g)


def _act_order(name: str, g_idx: np.ndarray, codes: np.ndarray, g: int, groups: int, allowed: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Input row i belongs to group g_idx[i]. Sort the rows by group (stable) so each group is
    contiguous again: stored row r = input channel perm[r]. Exact when every group then holds
    the rows a contiguous layout would give it (group_size rows, the last one the remainder)."""
    n_in = codes.shape[0]
    _expect(name, g_idx, (n_in,), "one group index per input channel")
    g_idx = g_idx.astype(np.int64)
    contiguous = np.arange(n_in) // g
    if np.array_equal(g_idx, contiguous):
        return codes, None
    if g_idx.min() < 0 or g_idx.max() >= groups:
        raise CheckpointError(f"{name} holds group indices outside 0..{groups - 1}.")
    if not allowed:
        raise CheckpointError(f"{name} permutes the groups but the config does not declare act-order (desc_act / actorder: group); the checkpoint "
                              "contradicts itself.")
    perm = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[perm], contiguous):
        counts = np.bincount(g_idx, minlength=groups)
        raise CheckpointError(f"{name} puts {counts.min()}..{counts.max()} input channels in a group; act-order is read only when every group holds "
                              f"group_size={g} channels.")
    return np.ascontiguousarray(codes[perm]), perm


def _check_symmetric(name: str, zero: np.ndarray, conv: IntConvention) -> None:
    mid = 2 ** (conv.bits - 1)
    if conv.symmetric and not np.all(zero == mid):
        raise CheckpointError(f"{name}: the config says symmetric but the zero points are not all {mid}; expected sym/zero_point to match the "
                              "tensors.")


def _read_gptq(ckpt, name: str, conv: IntConvention) -> IntWeight:
    """AutoGPTQ QuantLinear.pack / GPTQModel (v1 "gptq", v2 "gptq_v2"); the meaning is AutoGPTQ's torch
    dequantization: w[i, o] = scales[g, o] * (q[i, o] - zero[g, o]), g = g_idx[i]; v1 zero = stored + 1."""
    bits, pf = conv.bits, _pack_factor(conv.bits)
    qname = f"{name}.qweight"
    qweight = _tensor(ckpt, qname, qname, ("I32",))
    if qweight.ndim != 2:
        raise CheckpointError(f"{qname} has shape {list(qweight.shape)}; expected 2-D [in * {bits} / 32, out].")
    codes = unpack_rows(qweight, bits)  # [in, out]
    n_in, n_out = codes.shape
    g, groups = _groups(n_in, conv)
    sname, zname = f"{name}.scales", f"{name}.qzeros"
    scale = _tensor(ckpt, sname, qname, _FLOATS)
    _expect(sname, scale, (groups, n_out), f"{groups} groups of {g} input rows x {n_out} outputs for {qname} {list(qweight.shape)}")
    qzeros = _tensor(ckpt, zname, qname, ("I32",))
    _expect(zname, qzeros, (groups, -(-n_out // pf)), f"{bits}-bit zero points packed along the {n_out} outputs")
    zero = unpack_cols(qzeros, bits)[:, :n_out].astype(np.int32)
    if conv.layout == "gptq":  # v1 stores zero - 1 (AutoGPTQ's `zeros -= 1` before packing)
        zero += 1
        if zero.max() > 2**bits - 1:
            raise CheckpointError(
                f"{zname} holds a stored zero point of {2**bits - 1}: v1 GPTQ means {2**bits}, which {bits} bits cannot hold "
                "(the zero-point overflow of asymmetric v1 checkpoints); re-save it in gptq_v2 format."
            )
    zero = zero.astype(np.uint8)
    _check_symmetric(zname, zero, conv)
    perm = None
    gname = f"{name}.g_idx"
    if gname in ckpt:
        codes, perm = _act_order(gname, _tensor(ckpt, gname, qname, _INTS), codes, g, groups, conv.act_order)
    elif conv.act_order and conv.group_size:
        raise CheckpointError(f"GPTQ act-order (desc_act: true) checkpoint has no {gname!r}; expected one group index per input channel.")
    return IntWeight(codes, _scales(sname, scale), zero, bits, g, conv.symmetric, perm, source="gptq")


def _read_awq(ckpt, name: str, conv: IntConvention) -> IntWeight:
    """AutoAWQ WQLinear_GEMM (and transformers / vLLM's AWQ loaders): zero points stored as they are,
    w[i, o] = (q[i, o] - zero[i // group_size, o]) * scales[i // group_size, o]."""
    qname = f"{name}.qweight"
    qweight = _tensor(ckpt, qname, qname, ("I32",))
    if qweight.ndim != 2:
        raise CheckpointError(f"{qname} has shape {list(qweight.shape)}; expected 2-D [in, out * 4 / 32].")
    codes = unpack_awq_cols(qweight, conv.bits)  # [in, out]
    n_in, n_out = codes.shape
    g, groups = _groups(n_in, conv)
    if n_in % g:
        raise CheckpointError(f"{qname} has {n_in} input rows, not a multiple of group_size={g} (AutoAWQ GEMM needs whole groups).")
    sname, zname = f"{name}.scales", f"{name}.qzeros"
    scale = _tensor(ckpt, sname, qname, _FLOATS)
    _expect(sname, scale, (groups, n_out), f"{groups} groups of {g} input rows x {n_out} outputs for {qname} {list(qweight.shape)}")
    qzeros = _tensor(ckpt, zname, qname, ("I32",))
    _expect(zname, qzeros, (groups, qweight.shape[1]), "zero points packed like qweight along the outputs")
    zero = unpack_awq_cols(qzeros, conv.bits)
    return IntWeight(codes, _scales(sname, scale), zero, conv.bits, g, False, source="awq-checkpoint")


def _read_compressed(ckpt, name: str, conv: IntConvention) -> IntWeight:
    """compressed-tensors PackedQuantizationCompressor: signed codes q and zero points z stored
    offset by 2**(bits - 1); w = (q - z) * scale, so codes = q + offset and zero = z + offset here."""
    bits, pf, offset = conv.bits, _pack_factor(conv.bits), 2 ** (conv.bits - 1)
    pname = f"{name}.weight_packed"
    packed = _tensor(ckpt, pname, pname, ("I32",))
    shape_name = f"{name}.weight_shape"
    shape = _tensor(ckpt, shape_name, pname, _INTS).reshape(-1)
    if shape.size != 2 or np.any(shape <= 0):
        raise CheckpointError(f"{shape_name} is {shape.tolist()}; expected [out, in].")
    n_out, n_in = int(shape[0]), int(shape[1])
    _expect(pname, packed, (n_out, -(-n_in // pf)), f"weight_shape {[n_out, n_in]} with {pf} {bits}-bit values per int32 along the inputs")
    codes = np.ascontiguousarray(unpack_cols(packed, bits)[:, :n_in].T)  # [in, out], already offset (unsigned)
    g, groups = _groups(n_in, conv)
    sname = f"{name}.weight_scale"
    scale = _tensor(ckpt, sname, pname, _FLOATS)
    if scale.size == 1:  # strategy tensor: one scale for every column
        scale = np.full((n_out, 1), scale.reshape(-1)[0], np.float32)
    _expect(sname, scale, (n_out, groups), f"{n_out} outputs x {groups} groups of {g} input rows")
    zname = f"{name}.weight_zero_point"
    if zname in ckpt:
        zp = _tensor(ckpt, zname, pname, ("I32", "I8"))
        if zp.dtype == np.int32:  # packed along the outputs (pack_to_int32(..., packed_dim=0))
            _expect(zname, zp, (-(-n_out // pf), groups), f"{bits}-bit zero points packed along the {n_out} outputs")
            zero = unpack_rows(zp, bits)[:n_out].astype(np.int32)
        else:  # int8, signed, not packed (older writers; per-tensor zero points)
            if zp.size == 1:  # strategy tensor
                zp = np.full((n_out, groups), zp.reshape(-1)[0], np.int8)
            _expect(zname, zp, (n_out, groups), f"{n_out} outputs x {groups} groups")
            zero = zp.astype(np.int32) + offset
        if zero.min() < 0 or zero.max() > 2**bits - 1:
            raise CheckpointError(f"{zname} holds zero points outside the {bits}-bit range.")
        zero = np.ascontiguousarray(zero.T.astype(np.uint8))  # [groups, out]
    elif conv.symmetric:
        zero = np.full((groups, n_out), offset, np.uint8)
    else:
        raise CheckpointError(f"asymmetric compressed-tensors weight {pname} has no {zname!r}; the checkpoint is incomplete.")
    _check_symmetric(zname, zero, conv)
    perm = None
    gname = f"{name}.weight_g_idx"
    if gname in ckpt:
        codes, perm = _act_order(gname, _tensor(ckpt, gname, pname, _INTS), codes, g, groups, allowed=True)
    elif conv.act_order:
        raise CheckpointError(f"compressed-tensors actorder: group checkpoint has no {gname!r}; expected one group index per input channel.")
    return IntWeight(codes, _scales(sname, scale.T), zero, bits, g, conv.symmetric, perm, source="compressed-tensors")
