"""Checkpoint and limit checks that run before any graph is built.

Every tensor the network will read is checked against what config.json implies
(shape, dtype, finiteness), and limits that could never be allocated are
refused with the memory they would need: one clear line, nothing written.

Speed: each float tensor is read once, as stored (safetensors are memory-mapped,
so it costs one scan of its bytes, no float32 copy). Non-finite values are found
from the exponent bits, which works alike for F32, F16, BF16 and FP8 without
widening them. FP8 and packed integer layers go through read_linear, as the
network reads them: their unpacking is most of this check's cost.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..formats.engine_format import BuildConfig, ModelConfig
from ..formats.errors import BuildConfigError, CheckpointError, big_int
from ..formats.kv_layout import kv_cache_bytes
from ..hardware.cpu import physical_memory_bytes
from .quantization import LinearWeight, read_linear

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # what Checkpoint.float32 widens exactly
FP8_DTYPE = "F8_E4M3"  # only linear weights of an FP8 checkpoint (read_linear reads them)

# A value is NaN or Inf exactly when all its exponent bits are set; NaN when its mantissa is not zero too
# (float8 e4m3fn has no Inf: all of exponent and mantissa set is its NaN). Keyed by the stored dtype:
# (the bits as unsigned ints, exponent mask, mantissa mask).
_FLOAT_BITS = {
    "F64": (np.uint64, 0x7FF0_0000_0000_0000, 0x000F_FFFF_FFFF_FFFF),
    "F32": (np.uint32, 0x7F80_0000, 0x007F_FFFF),
    "F16": (np.uint16, 0x7C00, 0x03FF),
    "BF16": (np.uint16, 0x7F80, 0x007F),
    FP8_DTYPE: (np.uint8, 0x7F, 0x7F),
}

# The ceiling for a KV cache that lives on a GPU (a backend whose DEVICE is not the CPU, lowering ort_cuda): the engine runs on a
# GPU that need not be this machine's, and tp_size is 1, so one GPU holds the whole cache. No single
# accelerator has more than this today (NVIDIA B300 / Rubin, AMD MI355X: 288 GB); raise it when one does.
LARGEST_ACCELERATOR_BYTES = 288 * 2**30
# Where the host's physical memory cannot be read: what one 64-bit process can address at all (48-bit).
ADDRESS_SPACE_BYTES = 2**48
_KV_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


# ---------------------------------------------------------------------------------------------- limits


def memory_bound(build: BuildConfig) -> tuple[int, str]:
    """The most memory the engine's KV cache could ever get, and what that is, in words."""
    from .backends import backend_module

    if backend_module(build.backend).DEVICE != "cpu" or build.lowering == "ort_cuda":
        return LARGEST_ACCELERATOR_BYTES, f"the memory of the largest single GPU ({_human(LARGEST_ACCELERATOR_BYTES)})"
    host = physical_memory_bytes()
    if host is None:
        return ADDRESS_SPACE_BYTES, f"what one process can address ({_human(ADDRESS_SPACE_BYTES)})"
    # CPU engines: the cache is host memory of the machine that builds (and test-loads) the engine
    return host, f"this machine's physical memory ({_human(host)})"


def check_memory_limits(model: ModelConfig, build: BuildConfig) -> None:
    """Refuse max_seq_len / max_batch_size whose KV cache could never be allocated."""
    itemsize = _kv_itemsize(build)
    need = kv_cache_bytes(model, build.max_batch_size, build.kv_capacity, itemsize)
    bound, what = memory_bound(build)
    if need <= bound:
        return
    per_slot = kv_cache_bytes(model, 1, 1, itemsize)  # one token of one sequence
    slots = bound // per_slot
    seq_fit = slots // build.max_batch_size - build.max_draft_len - 1  # kv_capacity = max_seq_len + max_draft_len + 1
    batch_fit = slots // build.kv_capacity
    fits = []
    if seq_fit >= 2:  # room for a 1-token prompt and one output token
        fits.append(f"--max_seq_len {seq_fit} at --max_batch_size {build.max_batch_size}")
    if batch_fit >= 1:
        fits.append(f"--max_batch_size {batch_fit} at --max_seq_len {build.max_seq_len}")
    advice = f"What fits: {', or '.join(fits)}." if fits else "Lower --max_seq_len and --max_batch_size."
    raise BuildConfigError(
        f"max_seq_len={big_int(build.max_seq_len)} with max_batch_size={big_int(build.max_batch_size)} needs a KV cache of {_human(need)} "
        f"(2 x {model.num_layers} layers x {big_int(build.max_batch_size)} sequences x {big_int(build.kv_capacity)} slots x "
        f"{model.num_kv_heads} KV heads x {model.head_dim} head_dim x {itemsize} bytes), more than {what}: "
        f"the engine could never allocate it. {advice}"
    )


def _kv_itemsize(build: BuildConfig) -> int:
    from ..plugins import LOWERINGS

    lowering = LOWERINGS.get(build.lowering)
    return _KV_ITEMSIZE.get(lowering.compute_dtype(build), 4) if lowering else 4


def _human(n: int) -> str:
    if n >= 1024**7:  # past EiB: an absurd limit, say how absurd without a 40-digit number
        return f"{big_int(n)} bytes"
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class Expected:
    """A tensor the network reads, with the shape config.json implies (Hugging Face's [out, in] for linears)."""

    name: str  # a tensor name; for a linear layer, the module name (its weight may be packed)
    shape: tuple[int, ...]
    fields: str  # the config.json fields that imply the shape, e.g. "[vocab_size, hidden_size]"


def expected_tensors(model: ModelConfig, has_lm_head: bool) -> tuple[list[Expected], list[Expected]]:
    """(dense tensors, linear layers) that the network reads, in the order it reads them."""
    from .architectures import ARCHITECTURES
    from .linear_weights import LAYER_WEIGHTS

    fused = ARCHITECTURES[model.architecture].fused_projections

    hidden, inter, hd = model.hidden_size, model.intermediate_size, model.head_dim
    q_out, kv_out = model.num_heads * hd, model.num_kv_heads * hd
    q_fields, kv_fields = "num_attention_heads*head_dim", "num_key_value_heads*head_dim"
    dense = [Expected("model.embed_tokens.weight", (model.vocab_size, hidden), "[vocab_size, hidden_size]")]
    linear = []
    for i in range(model.num_layers):
        def name(key: str, i: int = i) -> str:
            return f"model.layers.{i}.{LAYER_WEIGHTS[key]}"

        dense += [Expected(name(k), (hidden,), "[hidden_size]") for k in ("input_layernorm", "post_attention_layernorm")]
        if model.qk_norm:
            dense += [Expected(name(k), (hd,), "[head_dim]") for k in ("q_norm", "k_norm")]
        if model.qkv_bias:
            dense += [Expected(name("q_bias"), (q_out,), f"[{q_fields}]")]
            dense += [Expected(name(k), (kv_out,), f"[{kv_fields}]") for k in ("k_bias", "v_bias")]
        if fused:  # Phi-3: one q|k|v module and one gate|up module
            linear += [
                Expected(name("qkv_proj"), (q_out + 2 * kv_out, hidden), f"[{q_fields} + 2*{kv_fields}, hidden_size]"),
                Expected(name("o_proj"), (hidden, q_out), f"[hidden_size, {q_fields}]"),
                Expected(name("gate_up_proj"), (2 * inter, hidden), "[2*intermediate_size, hidden_size]"),
            ]
        else:
            linear += [
                Expected(name("q_proj"), (q_out, hidden), f"[{q_fields}, hidden_size]"),
                Expected(name("k_proj"), (kv_out, hidden), f"[{kv_fields}, hidden_size]"),
                Expected(name("v_proj"), (kv_out, hidden), f"[{kv_fields}, hidden_size]"),
                Expected(name("o_proj"), (hidden, q_out), f"[hidden_size, {q_fields}]"),
                Expected(name("gate_proj"), (inter, hidden), "[intermediate_size, hidden_size]"),
                Expected(name("up_proj"), (inter, hidden), "[intermediate_size, hidden_size]"),
            ]
        linear.append(Expected(name("down_proj"), (hidden, inter), "[hidden_size, intermediate_size]"))
    dense.append(Expected("model.norm.weight", (hidden,), "[hidden_size]"))
    if has_lm_head:
        dense.append(Expected("lm_head.weight", (model.vocab_size, hidden), "[vocab_size, hidden_size]"))
    return dense, linear


def validate_checkpoint(ckpt, model: ModelConfig, build: BuildConfig, convention, allow_nonfinite: bool = False) -> None:
    """Shapes, dtypes and finiteness of every tensor the network reads, before it is built."""
    # the network decodes with the embedding where model.tie_word_embeddings (resolved as transformers reads it: lm_head.py)
    has_lm_head = not model.tie_word_embeddings
    dense, linear = expected_tensors(model, has_lm_head)
    nonfinite: list[str] = []  # "name holds 1 NaN": dense tensors first, then linear layers
    for want in dense:
        stored, code = _dense_tensor(ckpt, want)
        _count_nonfinite(want.name, stored, code, nonfinite)
    for want in linear:
        _check_linear(ckpt, want, convention, nonfinite)
    _report_nonfinite(nonfinite, ckpt.path, "An engine built from them emits garbage", allow_nonfinite)


def validate_head_weights(heads, allow_nonfinite: bool = False) -> None:
    """Finiteness of every float tensor of Medusa heads or an EAGLE module (formats.heads.load_heads read them as float32):
    the builder reads them all, into the target's network (Medusa, EAGLE's fc) or the module's engine."""
    nonfinite: list[str] = []
    for name in sorted(heads.tensors):
        values = heads.tensors[name]
        if values.dtype.kind == "f":  # d2t is an integer map
            _count_nonfinite(name, values, "F32", nonfinite)
    what = "Medusa heads" if heads.mode == "medusa" else "an EAGLE module"
    _report_nonfinite(nonfinite, heads.path, f"The target would verify garbage drafts from {what} built from them, and accept none", allow_nonfinite)


def _report_nonfinite(nonfinite: list[str], where, consequence: str, allow_nonfinite: bool) -> None:
    """Refuse (or, with --allow_nonfinite, warn about) the non-finite tensors found in ``where``, three named."""
    if not nonfinite:
        return
    shown = "; ".join(nonfinite[:3]) + (f"; and {len(nonfinite) - 3} more tensors" if len(nonfinite) > 3 else "")
    if not allow_nonfinite:
        raise CheckpointError(f"non-finite weights in {where}: {shown}. {consequence}; "
                              "re-export the checkpoint, or pass --allow_nonfinite to build anyway.")
    warnings.warn(f"building with non-finite weights (--allow_nonfinite): {shown}.", stacklevel=3)


def _dense_tensor(ckpt, want: Expected) -> tuple[np.ndarray, str]:
    """A float tensor read as stored, refused if its dtype or shape disagrees with config.json."""
    code = ckpt.dtype_name(want.name)  # a missing tensor is a CheckpointError naming it
    if code not in FLOAT_DTYPES:
        raise CheckpointError(f"{want.name}{_where(ckpt, want.name)} has dtype {code}; expected a float tensor ({', '.join(FLOAT_DTYPES[:3])}).")
    stored = _stored(ckpt, want.name)
    _check_shape(ckpt, want, tuple(stored.shape))
    return stored, code


def _check_linear(ckpt, want: Expected, convention, nonfinite: list[str]) -> None:
    """A linear layer: float weights checked as stored; FP8 and packed integer ones as read_linear unpacks them."""
    wname = f"{want.name}.weight"
    code = ckpt.dtype_name(wname) if wname in ckpt else None
    if code in FLOAT_DTYPES:
        stored = _stored(ckpt, wname)
        _check_shape(ckpt, Expected(wname, want.shape, want.fields), tuple(stored.shape))
        _count_nonfinite(wname, stored, code, nonfinite)
        return
    if code is not None and code != FP8_DTYPE and convention is None:
        raise CheckpointError(f"{wname}{_where(ckpt, wname)} has dtype {code}; expected a float tensor ({', '.join(FLOAT_DTYPES[:3])}), "
                              "or a quantization_config in config.json that says how it is quantized.")
    weight = read_linear(ckpt, want.name, convention)  # unpacks; refuses packed sizes that do not fit, and non-finite scales
    _check_unpacked(ckpt, want, weight, code, convention)
    if weight.is_fp8:  # e4m3fn bits can hold NaN; integer codes cannot
        _count_nonfinite(wname, weight.fp8_bits, FP8_DTYPE, nonfinite)


def _check_unpacked(ckpt, want: Expected, weight: LinearWeight, code: str | None, convention) -> None:
    """The [in, out] read_linear unpacked, against config.json (the packed sizes themselves read_linear checks)."""
    values = weight.int_weight.codes if weight.is_int else weight.fp8_bits if weight.is_fp8 else weight.dense
    n_in, n_out = values.shape
    what = f"{want.name}.weight" if code else f"{want.name} ({getattr(convention, 'method', 'quantized')}, unpacked)"
    _check_shape(ckpt, Expected(what, want.shape, want.fields), (n_out, n_in), stored_name=f"{want.name}.weight" if code else None)


def _check_shape(ckpt, want: Expected, actual: tuple[int, ...], stored_name: str | None = None) -> None:
    if actual == want.shape:
        return
    where = _where(ckpt, stored_name or want.name)
    rows_differ = len(actual) == 2 and actual[1:] == want.shape[1:] and actual[0] != want.shape[0]
    if rows_differ and want.fields.startswith("[vocab_size"):
        raise CheckpointError(f"{want.name}{where} has {actual[0]} rows but config.json's vocab_size is {want.shape[0]}: the config and the "
                              "weights disagree on the vocabulary. Fix vocab_size in config.json or re-export the checkpoint.")
    transposed = len(actual) == 2 and actual == want.shape[::-1]
    raise CheckpointError(f"{want.name}{where} has shape {list(actual)}; config.json implies {list(want.shape)} = {want.fields}"
                          f"{' (transposed? Hugging Face stores linear weights as [out, in])' if transposed else ''}. "
                          "The checkpoint does not match its config.json.")


def _count_nonfinite(label: str, values: np.ndarray, code: str, found: list[str]) -> None:
    """Append 'label holds n NaN' to ``found`` if any value is NaN or Inf; one scan when all are finite."""
    if values.size == 0:
        return
    if values.dtype.kind == "f":  # widened already (pickled checkpoints, read_linear): key by the array itself
        code = {8: "F64", 4: "F32", 2: "F16"}[values.dtype.itemsize]
    uint, exponent_mask, mantissa_mask = _FLOAT_BITS[code]
    bits = values.view(uint)
    exponent = np.bitwise_and(bits, uint(exponent_mask))
    if exponent.max() != exponent_mask:
        return
    bad = bits[exponent == exponent_mask]
    nan = int(np.count_nonzero(np.bitwise_and(bad, uint(mantissa_mask))))
    inf = bad.size - nan
    found.append(f"{label} holds " + " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "Inf")) if n))


def _stored(ckpt, name: str) -> np.ndarray:
    """The tensor with its stored bits, without a copy; a pickled checkpoint (--allow_pickle) only gives float32."""
    try:
        return ckpt.raw(name)
    except AttributeError:
        return ckpt.float32(name)


def _where(ckpt, name: str) -> str:
    """' in model-00001-of-00002.safetensors': which file holds the tensor, where the reader knows it."""
    path = getattr(ckpt._tensors.get(name), "path", None)
    return f" in {Path(path).name}" if path else ""
