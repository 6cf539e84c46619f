"""Test-side writers of the published pre-quantized layouts (GPTQ, AWQ GEMM, compressed-tensors).

Written independently of builder/quant_checkpoints.py, the way each tool's
packer is written: word-by-word loops with explicit shifts (AutoGPTQ's
QuantLinear.pack, AutoAWQ's WQLinear_GEMM.from_linear with its order_map,
compressed-tensors' pack_to_int32 with its signed offset). The reader is then
checked against these, never against itself.

Every writer takes unsigned codes [in, out] and, per (group, out), zero points
(unsigned, what w = (q - zero) * scale subtracts) and scales; ``g_idx`` [in]
names each input row's group.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import torch
from checkpoints import copy_without_weights

AWQ_ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of a word holds column order_map[i]


def reference(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray) -> np.ndarray:
    """[in, out] float32: w[i, o] = (q[i, o] - zero[g_idx[i], o]) * scale[g_idx[i], o]."""
    z = zeros.astype(np.float32)[g_idx]
    s = scales.astype(np.float32)[g_idx]
    return (codes.astype(np.float32) - z) * s


def pack_gptq(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray, bits: int, v1: bool = True) -> dict[str, torch.Tensor]:
    """AutoGPTQ QuantLinear.pack: qweight packs 32/bits input rows per word; qzeros packs
    32/bits output columns per word, storing zero - 1 in the v1 format (no masking: a zero of 0
    wraps and spills, as it does there)."""
    n_in, n_out = codes.shape
    per = 32 // bits
    qweight = np.zeros((n_in // per, n_out), np.uint32)
    for row in range(n_in // per):
        for j in range(per):
            qweight[row] |= codes[row * per + j].astype(np.uint32) << np.uint32(bits * j)
    stored = zeros.astype(np.int64) - (1 if v1 else 0)
    stored = stored.astype(np.uint32)  # -1 wraps to 0xFFFFFFFF like numpy's astype(uint32) there
    qzeros = np.zeros((zeros.shape[0], n_out // per), np.uint32)
    for col in range(n_out // per):
        for j in range(per):
            qzeros[:, col] |= stored[:, col * per + j] << np.uint32(bits * j)
    return {
        "qweight": torch.from_numpy(qweight.view(np.int32).copy()),
        "qzeros": torch.from_numpy(qzeros.view(np.int32).copy()),
        "scales": torch.from_numpy(scales.astype(np.float16)),
        "g_idx": torch.from_numpy(g_idx.astype(np.int32)),
    }


def pack_awq(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> dict[str, torch.Tensor]:
    """AutoAWQ WQLinear_GEMM.from_linear (4-bit): qweight [in, out/8] and qzeros [groups, out/8],
    word `col` holding columns col*8 + order_map[i] at nibble i."""
    def pack(values: np.ndarray) -> np.ndarray:
        out = np.zeros((values.shape[0], values.shape[1] // 8), np.uint32)
        for col in range(values.shape[1] // 8):
            for i in range(8):
                out[:, col] |= values[:, col * 8 + AWQ_ORDER_MAP[i]].astype(np.uint32) << np.uint32(i * 4)
        return out.view(np.int32).copy()

    return {
        "qweight": torch.from_numpy(pack(codes)),
        "qzeros": torch.from_numpy(pack(zeros)),
        "scales": torch.from_numpy(scales.astype(np.float16)),
    }


def _pack_to_int32(signed: np.ndarray, bits: int) -> np.ndarray:
    """compressed-tensors pack_to_int32 along the last axis: add 2**(bits-1), pad to whole words,
    value j of each word at bit j * bits."""
    per = 32 // bits
    unsigned = (signed.astype(np.int64) + (1 << (bits - 1))).astype(np.uint32)
    rows, cols = unsigned.shape
    words = -(-cols // per)
    padded = np.zeros((rows, words * per), np.uint32)
    padded[:, :cols] = unsigned
    out = np.zeros((rows, words), np.uint32)
    for w in range(words):
        for j in range(per):
            out[:, w] += padded[:, w * per + j] << np.uint32(j * bits)
    return out.view(np.int32).copy()


def pack_compressed(
    codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray | None, bits: int, symmetric: bool, scale_dtype=torch.bfloat16
) -> dict[str, torch.Tensor]:
    """compressed-tensors PackedQuantizationCompressor.compress_weight: signed q = codes - 2**(bits-1)
    in weight_packed [out, ceil(in/per)]; weight_scale [out, groups]; asymmetric zero points signed,
    packed along the outputs (packed_dim=0); weight_shape [out, in]; weight_g_idx when act-ordered."""
    offset = 1 << (bits - 1)
    q = codes.T.astype(np.int64) - offset  # [out, in] signed
    out = {
        "weight_packed": torch.from_numpy(_pack_to_int32(q, bits)),
        "weight_scale": torch.from_numpy(scales.T.astype(np.float32).copy()).to(scale_dtype),
        "weight_shape": torch.tensor(list(q.shape), dtype=torch.int64),
    }
    if not symmetric:
        zp = zeros.astype(np.int64) - offset  # [groups, out] signed
        out["weight_zero_point"] = torch.from_numpy(_pack_to_int32(zp, bits).T.copy())  # packed_dim=0: along out
    if g_idx is not None:
        out["weight_g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
    return out


def random_layer(rng: np.random.Generator, n_in: int, n_out: int, bits: int, group_size: int, symmetric: bool, act_order: bool, zero_min: int = 0):
    """Random codes / zeros / fp16-exact scales, and g_idx (a shuffled assignment when act_order)."""
    g = group_size or n_in
    groups = -(-n_in // g)
    codes = rng.integers(0, 2**bits, size=(n_in, n_out)).astype(np.uint8)
    if symmetric:
        zeros = np.full((groups, n_out), 2 ** (bits - 1), np.uint8)
    else:
        zeros = rng.integers(zero_min, 2**bits, size=(groups, n_out)).astype(np.uint8)
    scales = rng.uniform(1e-3, 2e-2, size=(groups, n_out)).astype(np.float16).astype(np.float32)
    g_idx = np.arange(n_in) // g
    if act_order:
        g_idx = g_idx[rng.permutation(n_in)]
    return codes, zeros, scales, g_idx


# ---------------------------------------------------------------------------
# Whole checkpoints: a float tiny model re-saved in a published layout
# ---------------------------------------------------------------------------

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantization_config(method: str, bits: int, group_size: int, symmetric: bool = True, act_order: bool = False, v1: bool = True) -> dict:
    """quantization_config as each tool writes it into config.json."""
    if method == "gptq":  # GPTQModel's quantize_config.json fields
        return {
            "quant_method": "gptq", "bits": bits, "group_size": group_size or -1, "desc_act": act_order, "sym": symmetric,
            "lm_head": False, "checkpoint_format": "gptq" if v1 else "gptq_v2", "pack_dtype": "int32",
            "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
        }
    if method == "awq":  # AutoAWQ / transformers AwqConfig
        return {"quant_method": "awq", "bits": bits, "group_size": group_size or -1, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}
    if method == "compressed-tensors":  # llm-compressor W4A16 / W8A16
        weights = {
            "num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": "group" if group_size else "channel",
            "group_size": group_size or None, "actorder": "group" if act_order else None, "dynamic": False, "observer": "minmax",
        }
        return {
            "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None,
        }
    raise ValueError(method)


def _rtn_codes(w_t: np.ndarray, bits: int, g: int, symmetric: bool, g_idx: np.ndarray):
    """Round-to-nearest codes for groups given by g_idx: (codes [in, out], zeros, fp16-exact scales)."""
    n_in, n_out = w_t.shape
    groups = int(g_idx.max()) + 1
    codes = np.zeros((n_in, n_out), np.uint8)
    zeros = np.zeros((groups, n_out), np.uint8)
    scales = np.zeros((groups, n_out), np.float32)
    for k in range(groups):
        rows = np.flatnonzero(g_idx == k)
        block = w_t[rows]
        if symmetric:
            zero = np.full(n_out, 2 ** (bits - 1))
            scale = np.maximum(np.abs(block).max(0), 1e-6) / (2 ** (bits - 1) - 1)
        else:  # zero in 1 .. 2**bits - 1, so the v1 "zero - 1" never wraps
            lo, hi = np.minimum(block.min(0), -1e-6), np.maximum(block.max(0), 1e-6)
            scale = (hi - lo) / (2**bits - 2)
            zero = np.clip(np.rint(-lo / scale) + 1, 1, 2**bits - 1)
        scale = scale.astype(np.float16).astype(np.float32)
        codes[rows] = np.clip(np.rint(block / scale) + zero, 0, 2**bits - 1).astype(np.uint8)
        zeros[k], scales[k] = zero, scale
    return codes, zeros, scales


def save_quantized_checkpoint(
    src: Path, dst: Path, method: str, bits: int = 4, group_size: int = 32, symmetric: bool = True, act_order: bool = False, v1: bool = True
) -> dict[str, np.ndarray]:
    """Re-save the float checkpoint ``src`` as ``method`` publishes it (other tensors in float16,
    like published checkpoints). Returns name -> the [out, in] float32 weight each linear means."""
    from safetensors.torch import save_file

    tensors = copy_without_weights(src, dst)
    out, meant = {}, {}
    for name, w in tensors.items():
        parts = name.split(".")
        if not (name.endswith(".weight") and parts[-2] in LINEARS):
            out[name] = w.to(torch.float16)
            continue
        base = name[: -len(".weight")]
        w_t = w.float().numpy().T  # [in, out]
        n_in = w_t.shape[0]
        g = group_size or n_in
        g_idx = np.arange(n_in) // g
        if act_order:  # one shuffle per layer input, as GPTQ's q/k/v (and gate/up) share theirs
            shared = (".attn_in" if parts[-2] in ("q_proj", "k_proj", "v_proj")
                      else ".mlp_in" if parts[-2] in ("gate_proj", "up_proj") else "." + parts[-2])
            layer_input = ".".join(parts[:4]) + shared
            g_idx = g_idx[np.random.default_rng(zlib.crc32(layer_input.encode())).permutation(n_in)]
        codes, zeros, scales = _rtn_codes(w_t, bits, g, symmetric, g_idx)
        meant[name] = reference(codes, zeros, scales, g_idx).T.copy()
        if method == "gptq":
            packed = pack_gptq(codes, zeros, scales, g_idx, bits, v1=v1)
        elif method == "awq":
            packed = pack_awq(codes, zeros, scales)
        else:
            packed = pack_compressed(codes, zeros, scales, g_idx if act_order else None, bits, symmetric, scale_dtype=torch.float16)
        out.update({f"{base}.{k}": v for k, v in packed.items()})
    save_file(out, dst / "model.safetensors")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(method, bits, group_size, symmetric, act_order, v1)
    cfg["torch_dtype"] = cfg["dtype"] = "float16"
    (dst / "config.json").write_text(json.dumps(cfg))
    return meant


def save_float_checkpoint(quantized: Path, dst: Path, meant: dict[str, np.ndarray]) -> Path:
    """The float32 twin of a quantized checkpoint: the same float16 non-linear tensors (widened)
    and each linear as the [out, in] weight it means."""
    from safetensors.torch import save_file

    packed = ("qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
    tensors = {k: v.float() for k, v in copy_without_weights(quantized, dst).items() if k.split(".")[-1] not in packed}
    tensors.update({k: torch.from_numpy(v) for k, v in meant.items()})
    save_file(tensors, dst / "model.safetensors")
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("quantization_config")
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst
