"""llama.cpp's GGUF files read as a checkpoint: ``specdec-build --checkpoint_dir model.gguf``.

Who reads what (libraries where one exists):

  metadata -> config.json   transformers' GGUF support (what ``from_pretrained(..., gguf_file=...)`` reads), plus
                            what it leaves out and specdec's network needs: the architecture, tied embeddings and
                            attention biases from the tensors present, and llama.cpp's ``rope_freqs`` tensor (Llama
                            3.1's rotary scaling, stored as one divisor per frequency) as specdec's
                            ``frequency_factors`` rope type.
  tokenizer                 transformers' GGUF tokenizer converters, saved as tokenizer.json + tokenizer_config.json
                            (with the file's chat template) into a folder the build copies from.
  tensors                   gguf-py (llama.cpp's own reader), memory-mapped; each tensor dequantized to float32 when
                            the build reads it. Q4_0 and Q8_0 blocks (32 weights and one float16 scale d:
                            w = d * (q - 8), w = d * q) are specdec's int4 / int8 weights with group size 32 already,
                            so they are read as integer codes (``int_weight``), bit for bit, with no second rounding.

llama.cpp stores the q and k projections of its ``llama`` architecture (Llama, Mistral) with each head's rows
interleaved for its rotary layout (convert_hf_to_gguf.py's ``LlamaModel.permute``); they are put back in Hugging
Face's order. That moves whole rows, so a block of 32 input weights stays whole.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import weakref
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.errors import CheckpointError
from .architectures import BY_MODEL_TYPE
from .weight_only import IntWeight

# general.architecture (transformers' model_type where it renames one: a 'llama' file named Mistral) -> the class built
ARCHITECTURES = BY_MODEL_TYPE
PERMUTED_QK = ("llama", "mistral")  # llama.cpp's llama architecture: q and k rows interleaved per head

# GGUF tensor names -> Hugging Face's. A table, not a regex: a name not in it is refused (experts, vision towers).
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",  # Phi-3: q|k|v in one tensor, as in its HF checkpoint
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",  # Phi-3: gate|up in one tensor (mlp.gate_up_proj)
    "ffn_down.weight": "mlp.down_proj.weight",
}
ROPE_FREQS = "rope_freqs.weight"
# ggml types read as integer codes: (bits, the code of w = 0, bytes per block of 32)
INT_BLOCKS = {"Q4_0": (4, 8, 18), "Q8_0": (8, 128, 34)}
BLOCK = 32
INSTALL = "reading a GGUF file needs the gguf extra: pip install 'specdec[build,gguf]' (install torch's CPU build first: docs/install.md)"


def is_gguf(path: str | Path) -> bool:
    return Path(path).is_file() and Path(path).suffix.lower() == ".gguf"


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError(INSTALL) from None
    return gguf


def _open(path: Path):
    gguf = _gguf()
    try:
        return gguf.GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001  gguf-py raises numpy's and its own errors, of many types, on a damaged file
        raise CheckpointError(f"{path} is not a readable GGUF file ({_said(err)}).") from None


def _said(err: Exception) -> str:
    """A library's error in one line: its type and the start of its message (some span lines)."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def _field(reader, key: str) -> Any:
    """A scalar metadata value (a string or a number), or None when the file has no such key."""
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == _gguf().GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0] if len(value) == 1 else None


def _version(path: str | Path) -> tuple[str, int, int]:
    """What the caches below are keyed by: the file, and its version (a file rewritten in place is read again)."""
    p = Path(path).resolve()
    stat = p.stat()
    return str(p), stat.st_mtime_ns, stat.st_size


@lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int):
    """One parse of the file's header and metadata (a large vocabulary's strings take a while) for the config and the tensors."""
    return _open(Path(path))


@lru_cache(maxsize=4)
def _hf_config_cached(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    return _synthesize_config(Path(path), _reader(path, mtime_ns, size))


def gguf_hf_config(path: str | Path) -> dict[str, Any]:
    """The Hugging Face config.json the GGUF file stands for (metadata and tensor names only; no tensor data read).
    Read once per file version: specdec-build asks for it before the build (its default limits) and in it."""
    return copy.deepcopy(_hf_config_cached(*_version(path)))


# transformers' GGUF tokenizer converters before this read some files wrongly (pyproject.toml's gguf extra says how)
TRANSFORMERS_FLOOR = (5, 24)


def _transformers_checked() -> None:
    try:
        import transformers
    except ImportError:
        raise CheckpointError(INSTALL) from None
    found = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if found < TRANSFORMERS_FLOOR:
        raise CheckpointError(f"reading a GGUF file needs transformers >= {'.'.join(map(str, TRANSFORMERS_FLOOR))} (found "
                              f"{transformers.__version__}, whose GGUF tokenizer conversion gets some files wrong): "
                              f"pip install 'transformers>={'.'.join(map(str, TRANSFORMERS_FLOOR))},<6'")


def _synthesize_config(path: Path, reader) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    names = {t.name for t in reader.tensors}
    parts = _field(reader, "split.count")
    if isinstance(parts, int) and parts > 1:
        raise CheckpointError(f"{path} is one of {parts} parts of a split GGUF file: merge them first (llama-gguf-split --merge FIRST-PART "
                              "merged.gguf) and pass the merged file.")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} (field general.architecture) is not supported; supported: "
                              f"{', '.join(a for a in ARCHITECTURES if a != 'mistral')} (Llama and Mistral files are 'llama').")
    _transformers_checked()
    try:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError:
        raise CheckpointError(INSTALL) from None
    try:
        cfg = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
    except ImportError:  # transformers reads GGUF metadata only with torch installed
        raise CheckpointError(INSTALL) from None
    except Exception as err:  # noqa: BLE001  transformers reads damaged metadata with whatever error the value meets
        raise CheckpointError(f"{path}: transformers could not read its metadata ({_said(err)}).") from None
    model_type = cfg.get("model_type", arch)
    cfg["architectures"] = [ARCHITECTURES.get(model_type, ARCHITECTURES[arch])]
    cfg["tie_word_embeddings"] = "output.weight" not in names
    if arch in ("llama", "qwen3"):
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    # transformers reads rope.dimension_count as head_dim; a rotary part smaller than the head (partial rotary) is refused.
    # Values go into the config as they are: model_config_from_hf checks each (a number, in range) as it does config.json's
    key_length, rope_dim = _field(reader, f"{arch}.attention.key_length"), _field(reader, f"{arch}.rope.dimension_count")
    if key_length is not None:
        cfg["head_dim"] = key_length
    if rope_dim is not None and key_length is not None and rope_dim != key_length:
        raise CheckpointError(f"{path}: rotary dimensions {rope_dim} of a head of {key_length} (partial rotary) are not supported.")
    window = _field(reader, f"{arch}.attention.sliding_window")  # Phi-3's (llama.cpp ignores it; transformers masks by it)
    if window:
        cfg["sliding_window"] = window
    _rope_from_gguf(path, reader, arch, cfg, names)
    cfg["dtype"] = _float_dtype(reader)
    quantization = _int_blocks_held(reader)
    if quantization is not None:
        cfg["quantization_config"] = quantization
    return cfg


def _rope_from_gguf(path: Path, reader, arch: str, cfg: dict[str, Any], names: set[str]) -> None:
    """rope_parameters from the file: its base, llama.cpp's linear scaling, and rope_freqs as frequency factors."""
    theta = cfg.pop("rope_theta", _field(reader, f"{arch}.rope.freq_base") or 10000.0)
    kind = _field(reader, f"{arch}.rope.scaling.type")
    if any(n.startswith("rope_factors_") for n in names) or kind not in (None, "none", "linear"):
        raise CheckpointError(f"{path}: rotary scaling {kind or 'longrope (rope_factors_long/short)'!r} is not supported from a GGUF file; build "
                              "from the Hugging Face checkpoint it was converted from.")
    if kind == "linear":
        cfg["rope_parameters"] = {"rope_type": "linear", "rope_theta": theta, "factor": _field(reader, f"{arch}.rope.scaling.factor")}
    elif ROPE_FREQS in names:
        factors = _dequantized(_tensor(reader, ROPE_FREQS)).reshape(-1)
        cfg["rope_parameters"] = {"rope_type": "frequency_factors", "rope_theta": theta, "factors": [float(f) for f in factors]}
    else:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    cfg.pop("rope_scaling", None)


def _dequantized(t) -> np.ndarray:
    """A gguf-py tensor's values as float32, in the order the file stores them (gguf-py's own dequantization)."""
    return np.asarray(_gguf().quants.dequantize(t.data, t.tensor_type), np.float32)


def _float_dtype(reader) -> str:
    """The dtype of the file's float matrices: float16 or bfloat16 where it holds them, else float32 (norms are F32 in every GGUF)."""
    kinds = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    return "bfloat16" if "BF16" in kinds else "float16" if "F16" in kinds else "float32"


def _linear_tensors(reader) -> list:
    return [t for t in reader.tensors if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2]


def _int_blocks_held(reader) -> dict[str, Any] | None:
    """quantization_config for a file whose linear layers are Q4_0 or Q8_0 (the more common of the two where both are):
    those layers are built from their codes as they are; layers of other types are dequantized and stay float."""
    counts = Counter(t.tensor_type.name for t in _linear_tensors(reader) if t.tensor_type.name in INT_BLOCKS)
    if not counts:
        return None
    kind = counts.most_common(1)[0][0]
    return {"quant_method": "gguf", "ggml_type": kind, "bits": INT_BLOCKS[kind][0], "group_size": BLOCK}


def _tensor(reader, name: str):
    for t in reader.tensors:
        if t.name == name:
            return t
    raise CheckpointError(f"{reader.data.filename}: the GGUF file has no tensor {name!r}.")


def _hf_name(name: str) -> str | None:
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    return None


def _is_linear(hf_name: str) -> bool:
    """A decoder layer's projection weight (what the network reads as a linear layer), not a norm or a bias."""
    return hf_name.startswith("model.layers.") and hf_name.endswith("_proj.weight")


def hf_row_order(n_rows: int, n_head: int) -> np.ndarray:
    """For llama.cpp's ``permute(w, n_head)``: row r of the GGUF tensor is row order[r] of the Hugging Face one."""
    half = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, 2, half).swapaxes(1, 2).reshape(-1)


class GgufTensors:
    """Checkpoint reader over one GGUF file: Hugging Face names, [out, in] shapes, float32 values (dequantized)."""

    def __init__(self, path: Path, reader, hf_config: dict[str, Any], heads: int, kv_heads: int):
        self.path, self.reader = path, reader
        self.int_type = (hf_config.get("quantization_config") or {}).get("ggml_type")  # Q4_0 | Q8_0 | None: read as codes
        arch = _field(reader, "general.architecture")
        self.tensors: dict[str, Any] = {}
        self.row_order: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            if t.name == ROPE_FREQS:
                continue  # read into the config's rope_parameters
            hf = _hf_name(t.name)
            if hf is None:
                raise CheckpointError(f"{path}: tensor {t.name!r} is not one a {arch} network reads (a mixture-of-experts or multimodal file?); "
                                      "specdec builds dense text models.")
            if arch == "phi3" and hf.endswith("mlp.up_proj.weight"):
                hf = hf.replace("mlp.up_proj", "mlp.gate_up_proj")
            self.tensors[hf] = t
            if arch in PERMUTED_QK and (".q_proj." in hf or ".k_proj." in hf):
                n = heads if ".q_proj." in hf else kv_heads
                rows = int(t.shape[-1]) if len(t.shape) > 1 else int(t.shape[0])  # ggml shapes list the input dimension first
                if rows % (2 * n):
                    raise CheckpointError(f"{path}: {t.name} has {rows} rows, not a whole number of {n} heads' rotary pairs.")
                self.row_order[hf] = hf_row_order(rows, n)

    def keys(self):
        return self.tensors.keys()

    def dtype_name(self, name: str) -> str:
        """The held type (Q4_0 / Q8_0) for the linear layers read as codes (int_weight), so that the checks read them so too
        (not dequantized); F32 for every other tensor, which is handed out dequantized."""
        return self.int_type if self._as_codes(name) else "F32"

    def _as_codes(self, name: str) -> bool:
        """Whether ``name`` is read as integer codes: a linear layer of the file's main int type (Q8_0 in a Q4_0 file is not)."""
        return self.tensors[name].tensor_type.name == self.int_type and _is_linear(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self.tensors[name].shape))  # ggml lists ne0 (the input dimension) first

    def _in_hf_order(self, name: str, rows: np.ndarray) -> np.ndarray:
        order = self.row_order.get(name)
        if order is None:
            return rows
        out = np.empty_like(rows)
        out[order] = rows
        return out

    def float32(self, name: str) -> np.ndarray:
        return self._in_hf_order(name, _dequantized(self.tensors[name]).reshape(self.shape(name)))

    def int_weight(self, name: str) -> IntWeight | None:
        """A Q4_0 / Q8_0 linear weight as specdec's codes ([in, out]), bit for bit; None for other types."""
        if not self._as_codes(name):  # the file's other types, Q8_0 in a Q4_0 file too, are read dequantized
            return None
        t = self.tensors[name]
        kind = t.tensor_type.name
        bits, zero, nbytes = INT_BLOCKS[kind]
        n_out, n_in = self.shape(name)
        blocks = np.asarray(t.data, np.uint8).reshape(n_out, n_in // BLOCK, nbytes)
        scale = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[..., 0].astype(np.float32)  # [out, groups]
        if kind == "Q4_0":  # 16 bytes: elements 0-15 in the low nibbles, 16-31 in the high ones
            qs = blocks[:, :, 2:]
            codes = np.concatenate([qs & 0xF, qs >> 4], axis=2)
        else:  # 32 signed bytes
            codes = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + zero).astype(np.uint8)
        codes = self._in_hf_order(name, codes.reshape(n_out, n_in))
        scale = self._in_hf_order(name, scale)
        if not np.all(np.isfinite(scale)):
            raise CheckpointError(f"{self.path}: {t.name} holds non-finite scales.")
        groups = n_in // BLOCK
        return IntWeight(codes=np.ascontiguousarray(codes.T), scale=np.ascontiguousarray(scale.T), zero=np.full((groups, n_out), zero, np.uint8),
                         bits=bits, group_size=BLOCK, symmetric=True, source="gguf")


def dequantized_note(tensors: GgufTensors, quantization: str) -> str | None:
    """What the build does with the linear layers it reads dequantized: ggml types specdec has no kernel for (K-quants,
    i-quants, ...) and, in a Q4_0 or Q8_0 file, layers of any other type, which stay float beside the codes."""
    held = tensors.int_type
    if held is not None and quantization == "none":
        return None  # every layer dequantized, as asked
    others = Counter(t.tensor_type.name for t in _linear_tensors(tensors.reader) if t.tensor_type.name not in ("F32", "F16", "BF16", held))
    if not others:
        return None
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(others.items()))
    if held is not None:
        return (f"note: {tensors.path.name} holds linear layers of other types beside its {held} ones ({kinds}): they are read dequantized "
                f"and stay float in this engine, as do the {held} projections fused with one of them (q|k|v, gate|up).")
    if quantization == "none":
        fate = "this engine stores them in float, as large as a float checkpoint; --qformat int4_wo --group_size 32 rounds them to int4 again"
    else:
        fate = f"--qformat {quantization} rounds them again (a second rounding)"
    return f"note: {tensors.path.name} holds linear layers in ggml types specdec has no kernel for ({kinds}), read dequantized: {fate}."


def load_gguf(path: Path):
    """A Checkpoint over a GGUF file, its tokenizer written to a folder of its own (removed with the file's tensors, which every
    copy of the checkpoint holds: a LoRA merge's with_readers copy keeps the folder alive)."""
    from .architectures import model_config_from_hf
    from .checkpoint import Checkpoint

    hf_config = gguf_hf_config(path)
    model = model_config_from_hf(hf_config)  # checked before any tensor is mapped: a damaged header is one clean error
    reader = _reader(*_version(path))
    tensors = GgufTensors(path, reader, hf_config, model.num_heads, model.num_kv_heads)
    tokenizer_dir = Path(tempfile.mkdtemp(prefix="specdec-gguf-tokenizer-"))
    ckpt = Checkpoint(path, hf_config, dict.fromkeys(tensors.keys(), tensors), tokenizer_dir=tokenizer_dir, gguf=tensors)
    weakref.finalize(tensors, shutil.rmtree, tokenizer_dir, True)
    if _field(reader, "tokenizer.ggml.model") is not None:  # without one the build warns, as for a checkpoint without tokenizer.json
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise CheckpointError(f"{path} names a tokenizer (tokenizer.ggml.model) but holds no token list (tokenizer.ggml.tokens): the file is "
                                  "damaged; convert it again.")
        _write_tokenizer(path, tokenizer_dir, len(tokens.data))
    return ckpt


def _write_tokenizer(path: Path, folder: Path, num_tokens: int) -> None:
    """The file's tokenizer as tokenizer.json (+ config, chat template) in ``folder``. transformers is pointed at a folder
    holding only a link to the file: beside it, tokenizer files of the checkpoint it was converted from (where
    convert_hf_to_gguf.py writes by default) would replace the file's own."""
    from transformers import AutoTokenizer

    link = folder / "model.gguf"
    link.symlink_to(path.resolve())
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=link.name)
    except ImportError:
        raise CheckpointError(INSTALL) from None
    except Exception as err:  # noqa: BLE001  the tokenizers library raises a bare Exception on a damaged vocabulary
        raise CheckpointError(f"{path}: transformers could not read its tokenizer ({_said(err)}).") from None
    finally:
        link.unlink()
    tokenizer.save_pretrained(str(folder))
    # transformers' GPT-2 converter adds its default "<|endoftext|>" whether the file has it or not (Llama 3's has not): past
    # the file's tokens it would encode to an id the model has no row for
    tok_file = folder / "tokenizer.json"
    spec = json.loads(tok_file.read_text(encoding="utf-8"))
    added = spec.get("added_tokens") or []
    kept = [t for t in added if t.get("id", 0) < num_tokens]
    if len(kept) != len(added):
        spec["added_tokens"] = kept
        tok_file.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
