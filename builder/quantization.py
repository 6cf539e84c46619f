"""FP8 weights: read them as checkpoints publish them, or make them at build time.

A linear layer's weight reaches the network as a ``LinearWeight``: either
dense float32, or float8 e4m3 bits with scales. The network then carries the
precision explicitly (``DequantizeLinear`` from float8), so the same graph
means FP8 GEMMs under TensorRT and FP8-stored weights dequantized once, at
load, to float32 under ONNX Runtime on CPU.

Checkpoint conventions read (from ``quantization_config`` in config.json,
or ModelOpt's ``hf_quant_config.json``):

  modelopt            weight F8_E4M3 + ``weight_scale`` (per tensor, or per
                      output channel) + optional static ``input_scale``
  compressed-tensors  ``format: float-quantized``; weight F8_E4M3 +
                      ``weight_scale`` [out, 1] (channel) or [1] (tensor)
  fp8                 transformers' fine-grained FP8: weight F8_E4M3 +
                      ``weight_scale_inv`` per [block, block] tile

Pre-quantized integer checkpoints (GPTQ, AWQ, compressed-tensors
``pack-quantized``) are recognised and unpacked in builder/quant_checkpoints.py
into an ``IntWeight`` held by ``LinearWeight.int_weight``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats.errors import CheckpointError
from ..formats.hf_config import config_groups
from .quant_checkpoints import IntConvention, detect_int_convention, read_int_weight
from .weight_only import IntWeight

FP8_MAX = 448.0  # largest finite float8 e4m3fn


@dataclass
class LinearWeight:
    """A linear layer's weight, transposed to [in, out] for MatMul."""

    dense: np.ndarray | None = None  # [in, out] float32
    fp8_bits: np.ndarray | None = None  # [in, out] uint8 (float8 e4m3fn bits)
    scale: np.ndarray | None = None  # [out] per output channel, or [in // block, out] blockwise
    block_size: int = 0  # 0: per channel (axis 1); else blocks of that many rows along axis 0
    input_scale: float | None = None  # static activation scale from the checkpoint
    int_weight: IntWeight | None = None  # weight-only int8/int4 (builder/weight_only.py)
    name: str = ""  # the checkpoint module it was read from (for errors about fusing)

    @property
    def is_fp8(self) -> bool:
        return self.fp8_bits is not None

    @property
    def is_int(self) -> bool:
        return self.int_weight is not None

    def dequantized(self) -> np.ndarray:
        if self.int_weight is not None:
            return self.int_weight.dequantized()
        if not self.is_fp8:
            return self.dense  # type: ignore[return-value]
        w = fp8_bits_to_float32(self.fp8_bits)
        if self.block_size:
            return w * np.repeat(self.scale, self.block_size, axis=0)[: w.shape[0]]
        return w * self.scale[None, :]


def _ml_dtypes():
    import ml_dtypes  # installed with onnx (the build extra)

    return ml_dtypes


def fp8_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return bits.view(_ml_dtypes().float8_e4m3fn).astype(np.float32)


def quantize_fp8_per_channel(w_t: np.ndarray) -> LinearWeight:
    """float32 [in, out] -> e4m3 bits with one scale per output channel (amax / 448)."""
    amax = np.abs(w_t).max(axis=0)
    scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    q = np.clip(w_t / scale[None, :], -FP8_MAX, FP8_MAX).astype(_ml_dtypes().float8_e4m3fn)
    return LinearWeight(fp8_bits=q.view(np.uint8), scale=scale)


def concat_out(parts: list[LinearWeight]) -> LinearWeight:
    """Fuse projections along the output axis (q|k|v, gate|up), keeping FP8 and integer weights exact."""
    if any(p.is_int for p in parts):
        return LinearWeight(int_weight=_concat_int(parts), name="|".join(p.name for p in parts))
    if not any(p.is_fp8 for p in parts):
        # the parts are [in, out] views of [out, in] tensors: join those along their rows (a plain copy) and view the
        # result as [in, out] again; the one transpose happens when the weight is written (graph.c_order)
        return LinearWeight(dense=np.concatenate([p.dense.T for p in parts], axis=0).T)
    if not all(p.is_fp8 for p in parts) or len({p.block_size for p in parts}) != 1:
        raise CheckpointError("projections of one layer mix FP8 layouts; expected the same quantization for q/k/v and gate/up.")
    scales = [p.input_scale for p in parts if p.input_scale is not None]
    return LinearWeight(
        fp8_bits=np.concatenate([p.fp8_bits for p in parts], axis=1),
        scale=np.concatenate([p.scale for p in parts], axis=-1),
        block_size=parts[0].block_size,
        input_scale=max(scales) if scales else None,  # one activation feeds all of them
    )


def _concat_int(parts: list[LinearWeight]) -> IntWeight:
    """Integer weights share the input rows, so they fuse along the outputs only when each row
    means the same for all: same bits, group size, symmetry and act-order permutation."""
    names = ", ".join(p.name or "?" for p in parts)
    if not all(p.is_int for p in parts):
        raise CheckpointError(f"layers {names} mix integer-quantized and float weights; expected the same quantization for the projections fused "
                              "into one MatMul.")
    ws = [p.int_weight for p in parts]
    first = ws[0]
    for w in ws[1:]:
        if (w.bits, w.group_size, w.symmetric) != (first.bits, first.group_size, first.symmetric):
            raise CheckpointError(
                f"layers {names} are quantized differently (bits, group_size, symmetric: "
                + "; ".join(f"{x.bits}, {x.group_size}, {x.symmetric}" for x in ws)
                + "); expected the same scheme for the projections fused into one MatMul."
            )
        same_perm = (w.perm is None and first.perm is None) or (w.perm is not None and first.perm is not None and np.array_equal(w.perm, first.perm))
        if not same_perm:
            raise CheckpointError(f"layers {names} have different act-order permutations (g_idx); expected one input order for the projections fused "
                                  "into one MatMul.")
    return IntWeight(
        codes=np.concatenate([w.codes for w in ws], axis=1),
        scale=np.concatenate([w.scale for w in ws], axis=1),
        zero=np.concatenate([w.zero for w in ws], axis=1),
        bits=first.bits,
        group_size=first.group_size,
        symmetric=first.symmetric,
        perm=first.perm,
        source=first.source,
    )


@dataclass(frozen=True)
class Fp8Convention:
    method: str  # modelopt | compressed-tensors | fp8
    block_size: int = 0


def detect_fp8(hf_config: dict[str, Any], checkpoint_dir) -> Fp8Convention | None:
    """Which FP8 convention a checkpoint uses, or None for an unquantized one."""
    qc = hf_config.get("quantization_config")
    hf_quant = checkpoint_dir / "hf_quant_config.json"
    if qc is None and hf_quant.is_file():
        qc = {"quant_method": "modelopt", **json.loads(hf_quant.read_text()).get("quantization", {})}
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "FP8")).upper()
        if algo != "FP8":
            raise CheckpointError(f"quantization_config quant_algo {algo!r} is not supported; only FP8 is.")
        return Fp8Convention("modelopt")
    if method == "compressed-tensors":
        if qc.get("format") not in ("float-quantized", "naive-quantized", None):
            raise CheckpointError(f"compressed-tensors format {qc.get('format')!r} is not supported; expected float-quantized (FP8).")
        for group in config_groups(qc).values():
            w = group.get("weights") or {}
            if w.get("type") != "float" or w.get("num_bits") != 8:
                raise CheckpointError(f"compressed-tensors weights {w} are not FP8 (type float, 8 bits): not supported.")
        return Fp8Convention("compressed-tensors")
    if method == "fp8":
        block = qc.get("weight_block_size") or [128, 128]
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b < 2**31 for b in block)):
            from ..formats.config_strings import shown_value

            raise CheckpointError(f"quantization_config.weight_block_size {shown_value(block, 40)}; expected [n, n], n a positive integer.")
        if block[0] != block[1]:
            raise CheckpointError(f"weight_block_size {block} is not square; expected [n, n].")
        return Fp8Convention("fp8", block[0])
    raise CheckpointError(f"quantization_config quant_method {method!r} is not supported (supported: modelopt, compressed-tensors, fp8).")


def detect_checkpoint_quantization(hf_config: dict[str, Any], checkpoint_dir) -> Fp8Convention | IntConvention | None:
    """Which quantization a checkpoint holds: an FP8 or an integer convention, or None for float weights.

    GPTQ, AWQ and compressed-tensors pack-quantized are integer conventions
    (builder/quant_checkpoints.py); everything else goes to ``detect_fp8``, which
    refuses the quant_methods it does not know.
    """
    qc = hf_config.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        from ..formats.config_strings import shown_value

        raise CheckpointError(f"config.json field 'quantization_config' is {shown_value(qc, 40)}; expected a JSON object (or none, for float "
                              "weights).")
    return detect_int_convention(hf_config, checkpoint_dir) or detect_fp8(hf_config, checkpoint_dir)


def read_linear(ckpt, name: str, conv: Fp8Convention | IntConvention | None) -> LinearWeight:
    """Module ``name``'s weight as a LinearWeight: ``<name>.weight`` ([out, in] in the checkpoint),
    or, in an integer checkpoint, its packed tensors unpacked exactly into an IntWeight."""
    if isinstance(conv, IntConvention):
        int_weight = read_int_weight(ckpt, name, conv)
        if int_weight is not None:
            return LinearWeight(int_weight=int_weight, name=name)
        conv = None  # this module was left in float (modules_to_not_convert / ignore)
    elif f"{name}.qweight" in ckpt or f"{name}.weight_packed" in ckpt:
        raise CheckpointError(f"{name} is stored as packed integers but config.json has no quantization_config saying how (expected quant_method "
                              "gptq, awq or compressed-tensors).")
    wname = f"{name}.weight"
    code = ckpt.dtype_name(wname)  # a missing tensor is a CheckpointError naming it
    if code == "F8_E5M2":
        raise CheckpointError(f"{wname} is float8 e5m2; only e4m3 (F8_E4M3) FP8 weights are supported.")
    if code != "F8_E4M3":
        return LinearWeight(dense=ckpt.float32(wname).T, name=name)
    if conv is None:
        raise CheckpointError(f"{wname} is FP8 but config.json has no quantization_config saying how it is scaled.")
    bits = np.ascontiguousarray(ckpt.raw(wname).T)  # [in, out]
    n_in, n_out = bits.shape
    if conv.method == "fp8":
        sname = f"{name}.weight_scale_inv"
        scale = _scale(ckpt, sname, wname)
        b = conv.block_size
        want = (-(-n_out // b), -(-n_in // b))
        if scale.shape != want:
            raise CheckpointError(f"{sname} has shape {list(scale.shape)}; expected {list(want)} for {b}x{b} blocks of {wname} [{n_out}, {n_in}].")
        # [out/b, in/b] tiles -> [in/b, out]: each tile's scale repeated over its columns (exact)
        per_col = np.repeat(scale, b, axis=0)[:n_out].T.copy()
        return LinearWeight(fp8_bits=bits, scale=per_col.astype(np.float32), block_size=b, name=name)
    sname = f"{name}.weight_scale"
    scale = _scale(ckpt, sname, wname).reshape(-1)
    if scale.size == 1:
        scale = np.full(n_out, scale[0], np.float32)
    elif scale.size != n_out:
        raise CheckpointError(f"{sname} has {scale.size} values; expected 1 (per tensor) or {n_out} (per output channel of {wname}).")
    iname = f"{name}.input_scale"
    input_scale = float(_scale(ckpt, iname, wname).reshape(-1).max()) if iname in ckpt else None
    return LinearWeight(fp8_bits=bits, scale=scale.astype(np.float32), input_scale=input_scale, name=name)


def _scale(ckpt, sname: str, wname: str) -> np.ndarray:
    if sname not in ckpt:
        raise CheckpointError(f"FP8 weight {wname} has no scale tensor {sname!r}; the checkpoint is incomplete or uses another convention.")
    s = ckpt.float32(sname)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise CheckpointError(f"{sname} holds non-positive or non-finite scales.")
    return s
