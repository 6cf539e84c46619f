"""Function-preserving, zero-padded enlargement of a Llama-family checkpoint.

    python benchmarks/enlarge.py --preset target325m examples/demo-pair/target /tmp/big/target
    python benchmarks/enlarge.py --preset draft examples/demo-pair/draft /tmp/big/draft
    python benchmarks/enlarge.py --heads /tmp/demo-heads/medusa --base /tmp/big/target /tmp/big/heads/medusa
    python benchmarks/enlarge.py --hidden_size 128 --intermediate_size 256 --num_heads 8 \\
        --num_kv_heads 4 --extra_layers 2 SRC DST

The demo pair (about 6M parameters) is so small that per-call overhead, not
weight bytes, decides its speed, so speculative decoding measured on it says
little about real models. This script makes a checkpoint of a few hundred
million parameters whose logits equal the small one's up to float rounding:
every decode step reads the bytes of the big model and computes the small
one's function.

What grows, and why the function stays the same (h -> H hidden, nh -> NH query
heads, kvh -> KVH kv heads, I -> I' FFN, L -> L + E layers; head_dim and the GQA group kept unless a
preset or --head_dim says otherwise, see benchmarks/head_layout.py for how heads move then):

* Every new row/column is zero, and the real weights sit in the top-left
  corner of each padded tensor, so real heads keep indices 0..nh-1.
* The residual stream is zero in dims h..H-1: the embedding's new columns are
  zero and so are the rows of o_proj / down_proj that write those dims.
* Heads: new q heads use new kv heads only. The group NH / KVH must equal
  nh / kvh, so q head i still reads kv head i // group, which is real for
  i < nh and new for i >= nh. New q/k/v rows are zero, so a new head attends
  uniformly over zero values and outputs zero; its o_proj columns are zero too.
* MLP: new gate/up rows are zero, so silu(0) * 0 = 0; new down columns are zero.
* New layers go at the end and are dead: attention and MLP add exact zeros to
  the residual stream, although most of their weights are random (see trap 2
  and ``dead_layer``).
* lm_head (or the tied embedding) gets zero columns for the new dims.

Trap 1, RMSNorm: it averages x^2 over the padded width. With x zero in dims
h..H-1, mean_H(x^2) = (h/H) mean_h(x^2). With eps' = eps * h/H,
    sqrt(mean_H(x^2) + eps') = sqrt(h/H) * sqrt(mean_h(x^2) + eps),
so the padded norm x * w' / sqrt(mean_H + eps') equals the original
x * w / sqrt(mean_h + eps) exactly when w' = sqrt(h/H) * w (and the new dims
stay zero whatever their weight, since x is zero there).
So every hidden-width norm weight (input_layernorm, post_attention_layernorm,
model.norm) is multiplied by sqrt(h/H) and rms_norm_eps by h/H. With H/h a
power of 4 (both presets: 4x) sqrt(h/H) is a power of two and the scaling is
exact in every float format. Qwen3's q_norm/k_norm run over head_dim, which
does not change, so their weights stay -- but Hugging Face (and specdec's
builder) give them the same config rms_norm_eps, so their eps shrinks too:
a relative change of at most eps * (1 - h/H) / (2 mean(q^2)) per head vector
(about 4e-7 for eps = 1e-6 and unit-scale q), far below fp16/bf16 storage
rounding. That is the one place the enlargement is not exact.

Trap 2, shared constants: ONNX Runtime keeps one prepacked copy of
byte-identical constant weights, so identical all-zero layers (or identical
zero blocks) would be read once and the big model would read fewer bytes than
its size. Padding zeros get a pseudo-random sign bit (+0.0 or -0.0, seeded per
tensor name), which keeps float tensors apart, but quantization erases it: an
all-zero layer quantized to int8/int4 codes is byte-identical to the next one.
So the extra layers are dead but distinct rather than zero:

* q_proj, k_proj, down_proj: random (std 0.02, seeded per tensor name).
* v_proj / o_proj: each value dim of a kv head is either live (random v_proj
  row; the o_proj columns of that dim of the q heads reading the head are
  zero) or dead (zero v_proj row: those q heads output a weighted sum of
  zeros there; random o_proj columns). Every o_proj term is 0 * finite.
* gate_proj / up_proj: each FFN channel has a random gate row and a zero up
  row, or the reverse: silu(g) * 0 = 0 and silu(0) * u = 0 * u = 0.
* norms: sqrt(h/H) * (1 + 0.1 * noise) (q_norm/k_norm: 1 + 0.1 * noise), the
  scale of the real norms, so the dead layers see activations of the usual
  size; biases stay zero (o_proj's and down_proj's feed the residual).

The partitions are drawn per layer, so no two layers share a tensor's bytes,
and zeros stay exact zeros under any round-to-nearest quantization (a zero
group dequantizes to zero, a zero weight to code == zero point): the function
is preserved exactly in float and after int8/int4 weight-only quantization,
as long as the random scores and silu stay finite (they are of order 0.1).
The script checks that no generated tensor shares its bytes with another and
refuses to finish otherwise.

Presets (sized for examples/demo-pair; any size flag overrides its value):

* llama8b (target), llama3b (target) and llama1b (draft): the shapes of
  Llama-3.1-8B (hidden 4096, 32 layers, 32/8 heads x 128, FFN 14336: 6.98B
  parameters in its layers), Llama-3.2-3B (3072, 28, 24/8 x 128, 8192) and
  Llama-3.2-1B (2048, 16, 32/8 x 64, 8192). head_dim and the GQA group grow
  (benchmarks/head_layout.py): exact for the 8B and 3B targets' head_dim
  (32 -> 128, queries x 2), one rounding of the draft's query weights (32 -> 64,
  x sqrt 2). The vocabulary stays the demo's 4096 tokens, so the embedding and
  LM head are 16 MB, not Llama's 1 GB each: a decode step reads 14.0 GB of
  bfloat16 weights where Llama-3.1-8B reads 15.0 GB (the floor is computed from
  the bytes actually read).

* target325m: 256 -> 1024 hidden, 8/4 -> 32/16 heads, FFN 768 -> 3328,
  6 + 18 = 24 layers: about 325M parameters (the scale DESIGN.md's figures
  were taken at). Width and depth both x4; the FFN (3.25 x hidden rather than
  the source's 3x) is what lands the total on 325M.
* draft: 128 -> 512 hidden, 4/2 -> 16/8 heads, FFN 384 -> 1536, 2 + 6 = 8
  layers: about 27M parameters, 8% of the target's bytes. The same x4 width
  and x4 depth as the target, so the pair keeps its proportions in shape, and
  a draft step costs about 5-10% of a target step (measured, see
  benchmarks/README.md), the range where draft-target pays on real pairs.
* target1b5: the demo target at Llama-3.2-1B's widths (2048 hidden, 32/8
  heads x 64, FFN 8192) and 6 + 19 = 25 layers: 1.54B parameters, about
  0.9 GB as an int4 engine, 28 times a 32 MiB last-level cache: a one-token
  step streams its weights from memory on any CPU, as a user's model does.
  Store it with --dtype bfloat16 (3 GB; float32 would be 6 GB). Its
  query weights take the one rounding of llama1b's (x sqrt 2).

Heads (``--heads DIR --base ENLARGED_BASE OUT``): Medusa heads, EAGLE-3 and
P-EAGLE modules trained on the small base, in ModelOpt's layout, padded the same way to
run on its enlargement (widths read from the enlarged base's config.json).
Medusa ResBlocks [h,h] -> [H,H] and their LM heads [V,h] -> [V,H] get zeros;
EAGLE-3's fc puts aux block a at columns a*H.., layer 0's q/k/v put the
embedding half at columns 0.. and the hidden half at H.., its hidden-width
norms (hidden_norm included) get sqrt(h/H) and its eps h/H, as above; a
P-EAGLE module's mask_hidden puts aux block a at a*H.., as fc reads it. Aux
layer ids stay (the dead layers come after the real ones); the module gets no
extra layers. See ``enlarge_heads``.

Needs numpy and ml_dtypes (bfloat16); not torch (safetensors is used when installed, else the format is written here).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

try:
    from safetensors.numpy import save_file
except ImportError:  # a build-only install (pip install ".[build]", as the quickstart does): write the format directly

    def save_file(tensors: dict[str, np.ndarray], path: str | Path, metadata: dict[str, str] | None = None) -> None:
        """The safetensors layout: u64 header size, JSON header (names, dtypes, shapes, offsets), raw bytes."""
        codes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16"}
        header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for name, arr in tensors.items():
            header[name] = {"dtype": codes[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
            offset += arr.nbytes
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        with open(path, "wb") as f:
            f.write(len(head).to_bytes(8, "little") + head)
            for arr in tensors.values():
                f.write(np.ascontiguousarray(arr).tobytes())

sys.path.insert(0, str(Path(__file__).parent))
from head_layout import HeadLayout, check_heads, head_layout, place, widen_rope  # noqa: E402

from specdec.builder.checkpoint import TOKENIZER_FILES, load_checkpoint  # noqa: E402
from specdec.formats.errors import SpecdecError  # noqa: E402


class EnlargeError(SpecdecError):
    """A checkpoint or a size the enlargement cannot honour."""


PRESETS: dict[str, dict[str, int]] = {
    "target325m": dict(hidden_size=1024, intermediate_size=3328, num_heads=32, num_kv_heads=16, extra_layers=18),
    "draft": dict(hidden_size=512, intermediate_size=1536, num_heads=16, num_kv_heads=8, extra_layers=6),
    # a target whose int4 weights (about 0.9 GB) outgrow a server CPU's last-level cache many times over, built within
    # 24 GiB (--dtype bfloat16): Llama-3.2-1B's widths, 25 layers, 1.5B parameters
    "target1b5": dict(hidden_size=2048, intermediate_size=8192, num_heads=32, num_kv_heads=8, head_dim=64, extra_layers=19),
    # the shapes users bring (config.json of each model): the demo target 6 + 26 layers, the demo draft 2 + 14
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, head_dim=128, extra_layers=26),  # Llama-3.1-8B
    "llama3b": dict(hidden_size=3072, intermediate_size=8192, num_heads=24, num_kv_heads=8, head_dim=128, extra_layers=22),  # Llama-3.2-3B
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_heads=32, num_kv_heads=8, head_dim=64, extra_layers=14),  # Llama-3.2-1B
}
SIZE_FLAGS = ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "extra_layers")
SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_STORED = {"F32": DTYPES["float32"], "F16": DTYPES["float16"], "BF16": DTYPES["bfloat16"]}

# Hugging Face name within model.layers.{i} -> what each axis is sized by. A table, not a regex.
LAYER_TENSORS: dict[str, tuple[str, ...]] = {
    "input_layernorm.weight": ("hidden",),
    "post_attention_layernorm.weight": ("hidden",),
    "self_attn.q_proj.weight": ("q", "hidden"),
    "self_attn.q_proj.bias": ("q",),
    "self_attn.k_proj.weight": ("kv", "hidden"),
    "self_attn.k_proj.bias": ("kv",),
    "self_attn.v_proj.weight": ("kv", "hidden"),
    "self_attn.v_proj.bias": ("kv",),
    "self_attn.o_proj.weight": ("hidden", "q"),
    "self_attn.o_proj.bias": ("hidden",),
    "self_attn.q_norm.weight": ("head_dim",),
    "self_attn.k_norm.weight": ("head_dim",),
    "mlp.gate_proj.weight": ("ffn", "hidden"),
    "mlp.gate_proj.bias": ("ffn",),
    "mlp.up_proj.weight": ("ffn", "hidden"),
    "mlp.up_proj.bias": ("ffn",),
    "mlp.down_proj.weight": ("hidden", "ffn"),
    "mlp.down_proj.bias": ("hidden",),
}
GLOBAL_TENSORS: dict[str, tuple[str, ...]] = {
    "model.embed_tokens.weight": ("vocab", "hidden"),
    "lm_head.weight": ("vocab", "hidden"),
    "model.norm.weight": ("hidden",),
}
HIDDEN_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight")
COPIED_AS_IS = ("rotary_emb.inv_freq",)  # old checkpoints store RoPE's buffer; it is per head_dim


def count_parameters(cfg: dict[str, Any], qkv_bias: bool = False, qk_norm: bool = False) -> int:
    """Parameters of a Llama-family model from its config.json (tied embeddings counted once)."""
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    attn = h * nh * hd + 2 * h * kvh * hd + nh * hd * h + (nh + 2 * kvh) * hd * qkv_bias + 2 * hd * qk_norm
    per_layer = attn + 3 * h * inter + 2 * h
    return layers * per_layer + vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h


# --------------------------------------------------------------------------- tensors


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little"))


def signed_zeros(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Exact zeros whose sign bits are random: equal in value, distinct in bytes."""
    bits = np.dtype(f"u{dtype.itemsize}")
    sign = bits.type(1 << (8 * dtype.itemsize - 1))
    raw = rng.integers(0, np.iinfo(bits).max, size=shape, dtype=bits, endpoint=True)
    return np.bitwise_and(raw, sign, out=raw).view(dtype)


def pad(real: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``real`` in the leading corner of a ``shape`` tensor of signed zeros."""
    out = signed_zeros(shape, real.dtype, rng)
    out[tuple(slice(0, n) for n in real.shape)] = real
    return out


DEAD_STD = 0.02  # the nonzero weights of a dead layer: an ordinary initializer scale, so no score or silu overflows


def dead_layer(index: int, keys: list[str], sizes: dict[str, int], dtypes: dict[str, np.dtype], seed: int, ratio: float) -> dict[str, np.ndarray]:
    """Tensors of an extra layer that adds exact zeros to the residual stream, whatever their quantization.

    Attention: each v_proj row (a kv head's value dim d) is either random, and
    then the o_proj columns of dim d of the q heads that read that kv head are
    zero, or zero, and then those q heads output exact zeros in dim d (a
    weighted sum of zeros) and their o_proj columns are random. Every o_proj
    product is 0 * finite or finite * 0. MLP: each FFN channel has either
    a random gate row and a zero up row (silu(g) * 0) or a zero gate row and a
    random up row (silu(0) * u = 0 * u); down_proj is random. q/k are random,
    norms near sqrt(h/H), biases zero. The partitions are drawn per layer.
    """
    prefix = f"model.layers.{index}."
    rng = _rng(seed, prefix + "partition")
    head_dim = sizes["head_dim"]
    kv_heads = sizes["kv"] // head_dim
    group = sizes["q"] // sizes["kv"]
    live_v = _split(rng, sizes["kv"])  # [kv]: v_proj rows that are random
    # q head j reads kv head j // group: its output dim d is nonzero iff that head's v row d is random
    live_q = np.broadcast_to(live_v.reshape(kv_heads, 1, head_dim), (kv_heads, group, head_dim)).reshape(-1)
    gate_rows = _split(rng, sizes["ffn"])  # random gate row (zero up row) or the opposite

    def random(shape: tuple[int, ...], r: np.random.Generator, std: float = DEAD_STD) -> np.ndarray:
        return r.standard_normal(shape, np.float32) * np.float32(std)

    out: dict[str, np.ndarray] = {}
    for key in keys:
        name = prefix + key
        shape = tuple(sizes[k] for k in LAYER_TENSORS[key])
        r = _rng(seed, name)
        arr = signed_zeros(shape, dtypes[key], r)  # biases (and o_proj's bias: it feeds the residual) stay zero
        if key in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.down_proj.weight"):
            arr[...] = random(shape, r)
        elif key == "self_attn.v_proj.weight":
            arr[live_v] = random((int(live_v.sum()), shape[1]), r)
        elif key == "self_attn.o_proj.weight":
            arr[:, ~live_q] = random((shape[0], int((~live_q).sum())), r)
        elif key == "mlp.gate_proj.weight":
            arr[gate_rows] = random((int(gate_rows.sum()), shape[1]), r)
        elif key == "mlp.up_proj.weight":
            arr[~gate_rows] = random((int((~gate_rows).sum()), shape[1]), r)
        elif key in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            arr[...] = (1 + random(shape, r, 0.1)) * np.float32(math.sqrt(ratio))  # the scale the real norms have
        elif key in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            arr[...] = 1 + random(shape, r, 0.1)
        out[name] = arr
    return out


def _split(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random boolean mask with both values present (n >= 2), else all True."""
    if n < 2:
        return np.ones(n, bool)
    mask = rng.random(n) < 0.5
    mask[rng.choice(n, 2, replace=False)] = (True, False)
    return mask


def _read(ckpt, name: str) -> np.ndarray:
    code = ckpt.dtype_name(name)
    if code not in _STORED:
        raise EnlargeError(f"tensor {name!r} is stored as {code}; only float32/float16/bfloat16 checkpoints can be enlarged (dequantize FP8 first).")
    return np.asarray(ckpt.raw(name)).view(_STORED[code])


def _cast(arr: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    if dtype is None or arr.dtype == dtype:
        return np.array(arr)  # a writable copy of the memory-mapped tensor
    return arr.astype(np.float32).astype(dtype)


# --------------------------------------------------------------------------- checks


def _sizes(cfg: dict[str, Any]) -> dict[str, int]:
    nh = int(cfg["num_attention_heads"])
    kvh = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or cfg["hidden_size"] // nh)
    return {"hidden": int(cfg["hidden_size"]), "q": nh * hd, "kv": kvh * hd, "ffn": int(cfg["intermediate_size"]),
            "head_dim": hd, "vocab": int(cfg["vocab_size"])}


def _check_source(cfg: dict[str, Any], src: Path) -> None:
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in SUPPORTED:
        raise EnlargeError(f"{src}: architecture {arch!r} (config.json 'architectures') is not supported; supported: {', '.join(SUPPORTED)}.")
    if cfg.get("quantization_config"):
        raise EnlargeError(f"{src} is a quantized checkpoint (config.json has quantization_config); enlarge the float checkpoint it came from.")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise EnlargeError(f"{src}/config.json: {key}={cfg.get(key)!r} must be a positive integer.")
    nh, kvh = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if nh % kvh:
        raise EnlargeError(f"{src}/config.json: num_attention_heads={nh} is not a multiple of num_key_value_heads={kvh}.")
    layer_types = cfg.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise EnlargeError(f"{src}/config.json: layer_types has {sorted(set(layer_types))}; only all-'full_attention' models can be enlarged.")


def _source_heads(cfg: dict[str, Any]) -> tuple[int, int, int]:
    nh = int(cfg["num_attention_heads"])
    return nh, int(cfg.get("num_key_value_heads") or nh), int(cfg.get("head_dim") or cfg["hidden_size"] // nh)


def _check_sizes(old: dict[str, Any], new: dict[str, int]) -> HeadLayout:
    """Refuse sizes that cannot hold the source; the head maps of those that can."""
    nh, kvh, hd = _source_heads(old)
    head_dim = new.get("head_dim") or hd
    problems = []
    for key, src_key, src in (
        ("hidden_size", "hidden_size", old["hidden_size"]),
        ("intermediate_size", "intermediate_size", old["intermediate_size"]),
        ("num_heads", "num_attention_heads", nh),
        ("num_kv_heads", "num_key_value_heads", kvh),
    ):
        if new[key] < src:
            problems.append(f"{key}={new[key]} is smaller than the source's {src_key}={src}")
    if new["extra_layers"] < 0:
        problems.append(f"extra_layers={new['extra_layers']} must be >= 0")
    problems += check_heads(old, nh, kvh, hd, new["num_heads"], new["num_kv_heads"], head_dim)
    if problems:
        raise EnlargeError("cannot enlarge: " + "; ".join(problems) + ".")
    return head_layout(nh, kvh, hd, new["num_heads"], new["num_kv_heads"], head_dim)


def _prepare_output(dst: Path, src: Path, force: bool) -> None:
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise EnlargeError(f"the output {dst} must not be the source checkpoint {src} or inside it.")
    if dst.exists() and not dst.is_dir():
        raise EnlargeError(f"the output {dst} exists and is not a directory.")
    if dst.is_dir() and any(dst.iterdir()) and not force:
        raise EnlargeError(f"the output {dst} exists and is not empty; pass --force to replace it.")


# --------------------------------------------------------------------------- the enlargement


def enlarge_checkpoint(
    src_dir: str | Path,
    dst_dir: str | Path,
    hidden_size: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    extra_layers: int,
    dtype: str | None = None,
    *,
    head_dim: int | None = None,
    force: bool = False,
    seed: int = 0,
    progress: bool = True,
    workers: int | None = None,
) -> dict[str, Any]:
    """Write a zero-padded, function-preserving enlargement of ``src_dir`` to ``dst_dir``.

    dtype: None keeps each tensor's stored dtype; else float32 / float16 / bfloat16.
    head_dim: None keeps the source's; a wider one moves the real dims and rope_theta (benchmarks/head_layout.py).
    workers: threads that draw the new layers and hash the tensors (default: the CPUs, at most 16). Every tensor has a
    random generator of its own, seeded by its name, so the output is the same bytes whatever the count; numpy's
    generators and hashlib release the GIL over large arrays, so an 8B-shaped enlargement scales with the cores.
    Returns {"dst", "config", "source_parameters", "num_parameters", "bytes", "seconds"}.
    """
    t0 = time.perf_counter()
    src, dst = Path(src_dir), Path(dst_dir)
    if dtype is not None and dtype not in DTYPES:
        raise EnlargeError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    out_dtype = DTYPES[dtype] if dtype else None
    ckpt = load_checkpoint(src)
    old = ckpt.hf_config
    _check_source(old, src)
    sizes = dict(hidden_size=hidden_size, intermediate_size=intermediate_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
                 extra_layers=extra_layers)
    if head_dim is not None:
        sizes["head_dim"] = head_dim
    heads = _check_sizes(old, sizes)
    _prepare_output(dst, src, force)

    cfg = _enlarged_config(old, sizes, dtype, heads)
    before, after = _sizes(old), _sizes(cfg)
    num_layers = int(old["num_hidden_layers"])
    ratio = before["hidden"] / after["hidden"]
    tied = bool(old.get("tie_word_embeddings", False))

    def new_shape(name: str, kinds: tuple[str, ...], arr: np.ndarray) -> tuple[int, ...]:
        expected = tuple(before[k] for k in kinds)
        if arr.shape != expected:
            raise EnlargeError(f"{src}: tensor {name!r} has shape {list(arr.shape)}, but config.json implies {list(expected)}.")
        return tuple(after[k] for k in kinds)

    def enlarge(name: str, kinds: tuple[str, ...]) -> np.ndarray:
        arr = _cast(_read(ckpt, name), out_dtype)
        shape = new_shape(name, kinds, arr)
        if name.endswith(HIDDEN_NORMS):
            arr = (arr.astype(np.float32) * np.float32(math.sqrt(ratio))).astype(arr.dtype)
        return _place_heads(arr, shape, kinds, heads, query=".q_proj." in name, rng=_rng(seed, name))

    names = list(ckpt._tensors)  # the checkpoint's tensor names (Checkpoint has no public list)
    keys, global_names, copied = _classify(names, num_layers, tied, src)
    out: dict[str, np.ndarray] = {name: enlarge(name, GLOBAL_TENSORS[name]) for name in global_names}
    # RoPE's stored buffer is per head_dim: a wider head gets transformers' own, recomputed from the new theta
    out.update({name: _cast(_read(ckpt, name), out_dtype) for name in copied if heads.identity})

    dtypes = {k: out_dtype or _STORED[ckpt.dtype_name(f"model.layers.0.{k}")] for k in keys}
    generated: set[str] = set()
    bar = _progress(num_layers + extra_layers, progress)
    for i in range(num_layers):  # the real layers, padded (the checkpoint's reader is used from this thread only)
        out.update({f"model.layers.{i}.{key}": enlarge(f"model.layers.{i}.{key}", LAYER_TENSORS[key]) for key in keys})
        bar(f"layer {i + 1}/{num_layers + extra_layers}")
    threads = max(1, workers or min(16, os.cpu_count() or 1))
    with ThreadPoolExecutor(threads) as pool:  # the new layers: dead (they add exact zeros) but distinct in their bytes
        for i, layer in enumerate(pool.map(lambda i: dead_layer(i, keys, after, dtypes, seed, ratio), range(num_layers, num_layers + extra_layers)),
                                  start=num_layers):
            out.update(layer)
            generated.update(layer)
            bar(f"layer {i + 1}/{num_layers + extra_layers} (new, dead)")
        _check_distinct(out, generated, pool)

    n_params = sum(a.size for a in out.values())
    report = {
        "source": str(src.resolve()),
        "seed": seed,
        "sizes": sizes,
        "source_parameters": sum(_read(ckpt, n).size for n in names if not (tied and n == "lm_head.weight")),
        "num_parameters": int(n_params),
    }
    if progress:  # the write of a large checkpoint takes a while of its own
        print(f"enlarge: writing {dst} ({sum(a.nbytes for a in out.values()) / 2**30:.1f} GiB)", file=sys.stderr, flush=True)
    nbytes = _write(src, dst, ckpt, cfg, out, report, force)
    return {"dst": str(dst), "config": cfg, "source_parameters": report["source_parameters"], "num_parameters": int(n_params),
            "bytes": nbytes, "seconds": time.perf_counter() - t0}


def _place_heads(arr: np.ndarray, shape: tuple[int, ...], kinds: tuple[str, ...], heads: HeadLayout, query: bool,
                 rng: np.random.Generator) -> np.ndarray:
    """``arr`` in a ``shape`` tensor of signed zeros: q/kv axes through the head maps (query rows times sqrt(D/d)), every
    other axis in its leading positions."""
    if heads.identity:
        return pad(arr, shape, rng)
    if query and heads.q_scale != 1.0:
        arr = (arr.astype(np.float32) * np.float32(heads.q_scale)).astype(arr.dtype)
    maps = {"q": heads.q, "kv": heads.kv}
    return place(arr, signed_zeros(shape, arr.dtype, rng), [maps.get(k) for k in kinds])


def _classify(names: list[str], num_layers: int, tied: bool, src: Path) -> tuple[list[str], list[str], list[str]]:
    """(per-layer keys, global tensors to pad, tensors copied as they are); refuses what it cannot pad."""
    layer_keys: dict[int, set[str]] = {i: set() for i in range(num_layers)}
    global_names, copied = [], []
    for name in names:
        if name.startswith("model.layers."):
            index, _, key = name[len("model.layers."):].partition(".")
            if not index.isdigit() or int(index) >= num_layers:
                raise EnlargeError(f"{src}: tensor {name!r} is outside the {num_layers} layers config.json declares.")
            if key.endswith(COPIED_AS_IS):
                copied.append(name)
            elif key not in LAYER_TENSORS:
                raise EnlargeError(f"{src}: tensor {name!r} is not one the enlargement knows how to pad ({', '.join(LAYER_TENSORS)}).")
            else:
                layer_keys[int(index)].add(key)
        elif name == "lm_head.weight" and tied:
            continue  # tied: the embedding is the head; a stored copy would be padded apart from it
        elif name in GLOBAL_TENSORS:
            global_names.append(name)
        else:
            raise EnlargeError(f"{src}: tensor {name!r} is not one the enlargement knows how to pad.")
    keys = layer_keys[0]
    for i, k in layer_keys.items():
        if k != keys:
            raise EnlargeError(f"{src}: layer {i} holds {sorted(k)} but layer 0 holds {sorted(keys)}; every layer must have the same tensors.")
    for required in ("model.embed_tokens.weight", "model.norm.weight"):
        if required not in global_names:
            raise EnlargeError(f"{src}: the checkpoint has no {required!r}.")
    if not tied and "lm_head.weight" not in global_names:
        raise EnlargeError(f"{src}: tie_word_embeddings is false but the checkpoint has no 'lm_head.weight'.")
    return sorted(keys), global_names, copied


def _enlarged_config(old: dict[str, Any], sizes: dict[str, int], dtype: str | None, heads: HeadLayout) -> dict[str, Any]:
    cfg = json.loads(json.dumps(old))  # deep: the rope dicts are rewritten
    h, nh = old["hidden_size"], old["num_attention_heads"]
    cfg["head_dim"] = int(sizes.get("head_dim") or old.get("head_dim") or h // nh)
    widen_rope(cfg, heads.theta_power)
    cfg["hidden_size"] = sizes["hidden_size"]
    cfg["intermediate_size"] = sizes["intermediate_size"]
    cfg["num_attention_heads"] = sizes["num_heads"]
    cfg["num_key_value_heads"] = sizes["num_kv_heads"]
    cfg["num_hidden_layers"] = old["num_hidden_layers"] + sizes["extra_layers"]
    # RMSNorm over the padded width: eps' = eps * h / H (see the module docstring)
    cfg["rms_norm_eps"] = float(old.get("rms_norm_eps", 1e-6)) * h / sizes["hidden_size"]
    if old.get("layer_types"):
        cfg["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]
    if dtype:
        cfg["dtype"] = dtype
        if "torch_dtype" in cfg:
            cfg["torch_dtype"] = dtype
    return cfg


def _check_distinct(tensors: dict[str, np.ndarray], generated: set[str], pool: ThreadPoolExecutor | None = None) -> None:
    """No generated tensor may share its bytes with any other tensor (ONNX Runtime would keep one copy)."""
    def digest(arr: np.ndarray) -> tuple:
        return arr.dtype.str, arr.shape, hashlib.blake2b(np.ascontiguousarray(arr).view(np.uint8), digest_size=16).digest()

    seen: dict[tuple, str] = {}
    for name, key in zip(tensors, (pool.map if pool else map)(digest, tensors.values()), strict=True):
        other = seen.setdefault(key, name)
        if other != name and (name in generated or other in generated):
            raise EnlargeError(f"{name} and {other} have identical bytes; pass another --seed.")


def _progress(total: int, enabled: bool) -> Callable[[str], None]:
    """A bar on a terminal; elsewhere (a log, a pipe) a plain line at each quarter of the layers, no '\\r' frames."""
    if not enabled:
        return lambda _: None
    if not sys.stderr.isatty():
        done = [0]

        def line(text: str) -> None:
            done[0] += 1
            if done[0] * 4 // total > (done[0] - 1) * 4 // total or done[0] == total:
                print(f"enlarge: {done[0]}/{total} layers ({text})", file=sys.stderr, flush=True)

        return line
    from tqdm import tqdm

    bar = tqdm(total=total, unit="layer", file=sys.stderr)

    def step(text: str) -> None:
        bar.set_postfix_str(text)
        bar.update(1)
        if bar.n >= total:
            bar.close()

    return step


def _write(src: Path, dst: Path, ckpt, cfg: dict[str, Any], tensors: dict[str, np.ndarray], report: dict[str, Any], force: bool) -> int:
    """Everything goes into a temporary directory beside ``dst`` and is moved into place when complete."""
    with _staged(dst, src, force) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "enlargement.json").write_text(json.dumps(report, indent=2) + "\n")
        for name in (*TOKENIZER_FILES, "added_tokens.json", "chat_template.jinja"):
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        return sum(p.stat().st_size for p in tmp.iterdir())


@contextlib.contextmanager
def _staged(dst: Path, src: Path, force: bool) -> Iterator[Path]:
    """A temporary directory beside ``dst`` to write into; on success it replaces ``dst``, on any error it is removed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        yield tmp
        old = _publish(tmp, dst, src, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _publish(tmp: Path, dst: Path, src: Path, force: bool) -> Path | None:
    """Make the finished ``tmp`` readable as the umask says and rename it to ``dst``; returns the old ``dst``, moved aside
    (the caller deletes it), or None."""
    umask = os.umask(0)
    os.umask(umask)
    for p in tmp.iterdir():  # mkdtemp and safetensors create owner-only files; others read these
        p.chmod(0o666 & ~umask)
    tmp.chmod(0o777 & ~umask)
    old = None
    if dst.exists():
        _prepare_output(dst, src, force)  # re-check: it may have filled up meanwhile
        old = dst.with_name(f".{dst.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
        dst.rename(old)
    tmp.rename(dst)
    return old


# --------------------------------------------------------------------------- head checkpoints (Medusa, EAGLE-3)
#
# Heads trained on the small base, enlarged to run on its enlargement with the same function. Medusa heads read
# the base's post-norm hidden state and EAGLE-3 the outputs of real base layers (the dead layers come after them,
# so aux ids keep naming the same, real, layers): both inputs are the small model's, zero in dims h..H-1. The
# tensors are read and written in float32 (load_heads' dtype); the builder never quantizes an EAGLE module, and
# every padded head tensor keeps real weights in its corner, so no two share bytes: pad()'s signed zeros come for
# free but are not what keeps them apart (nothing here is generated, so trap 2 does not arise).

HEAD_EXTRA_FILES = ("training_log.json", "loss_curve.png")  # describe the same training, still true of the enlarged heads


def enlarge_heads(heads_dir: str | Path, base_dir: str | Path, dst_dir: str | Path, *, force: bool = False, seed: int = 0) -> dict[str, Any]:
    """Write Medusa heads or an EAGLE-3 (P-EAGLE) module (ModelOpt layout) enlarged to run on ``base_dir``, an enlarge.py output.

    The target widths are read from the enlarged base's config.json; its enlargement.json (when present) says which
    layers are real. Returns {"dst", "mode", "config", "num_parameters"}.
    """
    from specdec.formats.heads import CONFIG_FILE, WEIGHTS_FILE, load_heads

    src, base, dst = Path(heads_dir), Path(base_dir), Path(dst_dir)
    heads = load_heads(src)
    base_cfg = load_checkpoint(base).hf_config
    real_layers = _real_layers(base, base_cfg)
    if heads.vocab_size != base_cfg["vocab_size"]:
        raise EnlargeError(f"{src}: vocab_size {heads.vocab_size} differs from the base's {base_cfg['vocab_size']} ({base}): heads of another model?")
    if heads.hidden_size > base_cfg["hidden_size"]:
        raise EnlargeError(f"{src}: hidden_size {heads.hidden_size} exceeds the base's {base_cfg['hidden_size']}; pass the enlarged base.")
    _prepare_output(dst, src, force)
    if heads.mode == "medusa":
        tensors, cfg = _enlarge_medusa(heads, base_cfg, seed)
    else:
        if max(heads.aux_layer_ids) >= real_layers:
            raise EnlargeError(f"{src}: eagle_aux_hidden_state_layer_ids {heads.aux_layer_ids} name layers beyond the base's {real_layers} real "
                               "ones.")
        tensors, cfg = _enlarge_eagle(heads, base_cfg, seed)
    cfg["specdec_enlarge"] = {"source_heads": str(src.resolve()), "base": str(base.resolve()), "seed": seed,
                              "source_hidden_size": heads.hidden_size, "hidden_size": cfg["hidden_size"]}
    n_params = int(sum(a.size for a in tensors.values()))
    _write_heads(src, dst, tensors, cfg, heads.mode, base, force, CONFIG_FILE, WEIGHTS_FILE)
    return {"dst": str(dst), "mode": heads.mode, "config": cfg, "num_parameters": n_params}


def _real_layers(base: Path, base_cfg: dict[str, Any]) -> int:
    """Layers of the enlarged base that compute something: the source's, per enlargement.json; all when it is absent."""
    report = base / "enlargement.json"
    if report.is_file():
        r = json.loads(report.read_text())
        return int(base_cfg["num_hidden_layers"]) - int(r.get("sizes", {}).get("extra_layers", 0))
    return int(base_cfg["num_hidden_layers"])


def _pad_named(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...], seed: int, norm_scale: float | None = None) -> np.ndarray:
    arr = tensors[name].astype(np.float32)
    if norm_scale is not None:  # trap 1: a hidden-width RMSNorm weight times sqrt(h/H)
        arr = arr * np.float32(norm_scale)
    return pad(arr, shape, _rng(seed, "heads:" + name))


def _enlarge_medusa(heads, base_cfg: dict[str, Any], seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """ResBlocks x + silu(W x + b): zero rows/bias give silu(0) = 0 in the new dims; each LM head gets zero columns."""
    H, t = int(base_cfg["hidden_size"]), heads.tensors
    out: dict[str, np.ndarray] = {}
    for i in range(heads.num_heads):
        for j in range(heads.num_layers):
            p = f"medusa_heads.{i}.{j}.linear."
            out[p + "weight"] = _pad_named(t, p + "weight", (H, H), seed)
            out[p + "bias"] = _pad_named(t, p + "bias", (H,), seed)
        name = f"medusa_heads.{i}.{heads.num_layers}.weight"
        out[name] = _pad_named(t, name, (t[name].shape[0], H), seed)
    # the heads' config is the base's plus the "medusa" block: take the enlarged base's, keep the heads' own blocks
    cfg = {**base_cfg, **{k: v for k, v in heads.config.items() if k not in base_cfg or k in ("medusa", "specdec_train")}}
    return out, cfg


def _enlarge_eagle(heads, base_cfg: dict[str, Any], seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """fc, the decoder layers (layer 0's q/k/v read [embedding | fused hidden], each half padded on its own), norms
    times sqrt(h/H), eps times h/H, lm_head zero columns. The module gets the enlarged base's widths and group, no
    extra layers: it is not what the benchmark's bytes are about, and dead layers would only cost draft time."""
    old = heads.config
    sizes = dict(hidden_size=int(base_cfg["hidden_size"]), intermediate_size=int(base_cfg["intermediate_size"]),
                 num_heads=int(base_cfg["num_attention_heads"]),
                 num_kv_heads=int(base_cfg.get("num_key_value_heads") or base_cfg["num_attention_heads"]),
                 extra_layers=0, head_dim=int(base_cfg.get("head_dim") or base_cfg["hidden_size"] // base_cfg["num_attention_heads"]))
    layout = _check_sizes(old, sizes)  # the base layers' rules: real q heads keep reading real kv heads, rotary pairs stay pairs
    cfg = json.loads(json.dumps(old))
    cfg["head_dim"] = sizes["head_dim"]
    widen_rope(cfg, layout.theta_power)  # the module attends with the base's rope (eagle_llama_config copies it)
    cfg.update(hidden_size=sizes["hidden_size"], intermediate_size=sizes["intermediate_size"],
               num_attention_heads=sizes["num_heads"], num_key_value_heads=sizes["num_kv_heads"])
    h, H = int(old["hidden_size"]), sizes["hidden_size"]
    # eps' = eps * h/H: the module's own eps (eagle_llama_config copies the base's), so this is the enlarged base's
    cfg["rms_norm_eps"] = float(old.get("rms_norm_eps", 1e-6)) * h / H
    before, after = _sizes(old), _sizes(cfg)
    scale = math.sqrt(h / H)
    t = heads.tensors
    out: dict[str, np.ndarray] = {}
    num_aux = len(heads.aux_layer_ids)
    fc = signed_zeros((H, num_aux * H), np.dtype(np.float32), _rng(seed, "heads:fc.weight"))
    for a in range(num_aux):  # aux layer a's output sits at a*h.. in the small input, a*H.. in the enlarged one
        fc[:h, a * H : a * H + h] = t["fc.weight"][:, a * h : (a + 1) * h]
    out["fc.weight"] = fc
    out["layers.0.hidden_norm.weight"] = _pad_named(t, "layers.0.hidden_norm.weight", (H,), seed, scale)
    for i in range(heads.num_layers):
        p = f"layers.{i}."
        for key in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
                    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.q_proj.weight",
                    "self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            kinds = LAYER_TENSORS[key]
            doubled = i == 0 and key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))  # layer 0 reads [embedding | hidden]
            if t[p + key].shape != tuple(before[k] for k in kinds) and not doubled:
                raise EnlargeError(f"{heads.path}: {p + key} has shape {list(t[p + key].shape)}, config.json implies {[before[k] for k in kinds]}.")
            if doubled:
                # [out, 2h] = [embedding half | hidden half] -> [out', 2H], halves at columns 0.. and H..; rows by the head maps
                w = t[p + key].astype(np.float32) * np.float32(layout.q_scale if ".q_proj." in key else 1.0)
                rows = layout.q if ".q_proj." in key else layout.kv
                big = signed_zeros((after[kinds[0]], 2 * H), np.dtype(np.float32), _rng(seed, "heads:" + p + key))
                place(w, big, [rows, np.concatenate([np.arange(h), H + np.arange(h)])])
                out[p + key] = big
            elif key.startswith("self_attn."):  # q/k/v rows and o_proj columns through the head maps
                arr, shape = t[p + key].astype(np.float32), tuple(after[k] for k in kinds)
                out[p + key] = _place_heads(arr, shape, kinds, layout, query=".q_proj." in key, rng=_rng(seed, "heads:" + p + key))
            else:
                out[p + key] = _pad_named(t, p + key, tuple(after[k] for k in kinds), seed, scale if key.endswith("layernorm.weight") else None)
    out["norm.weight"] = _pad_named(t, "norm.weight", (H,), seed, scale)
    out["lm_head.weight"] = _pad_named(t, "lm_head.weight", (t["lm_head.weight"].shape[0], H), seed)
    if "d2t" in t:
        out["d2t"] = t["d2t"]  # a vocabulary map: no hidden width in it
    if heads.mode == "peagle":  # the placeholders' vectors [D, num_aux * h]: aux block a at a*H.., as the fused layers' outputs sit
        m = t["mask_hidden"].astype(np.float32)
        if m.shape[1] == h:  # already fused (fc applied): hidden-width vectors
            big = pad(m, (m.shape[0], H), _rng(seed, "heads:mask_hidden"))
        else:
            big = signed_zeros((m.shape[0], num_aux * H), np.dtype(np.float32), _rng(seed, "heads:mask_hidden"))
            for a in range(num_aux):
                big[:, a * H : a * H + h] = m[:, a * h : (a + 1) * h]
        out["mask_hidden"] = big[None]  # [1, D, width]: vLLM speculators' shape (D = 1 for its constant placeholder)
    return out, cfg


def _write_heads(src: Path, dst: Path, tensors: dict[str, np.ndarray], cfg: dict[str, Any], mode: str, base: Path, force: bool,
                 config_file: str, weights_file: str) -> None:
    """Into a temporary directory beside ``dst``, then moved into place; the model card says what was done."""
    with _staged(dst, src, force) as tmp:
        save_file(tensors, tmp / weights_file, metadata={"format": "pt"})
        (tmp / config_file).write_text(json.dumps(cfg, indent=2) + "\n")
        note = (f"> **Enlarged** by `benchmarks/enlarge.py --heads` from `{src.resolve()}` to run on `{base.resolve()}` "
                f"(hidden {cfg['specdec_enlarge']['source_hidden_size']} -> {cfg['hidden_size']}, zero-padded, function-preserving: "
                f"on the enlarged base these {mode} heads give the same logits as the originals on the small base, up to float rounding). "
                "The training figures below are the original heads'.\n\n")
        if (src / "README.md").is_file():
            (tmp / "README.md").write_text(note + (src / "README.md").read_text())
        for name in HEAD_EXTRA_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the math and the presets.")
    ap.add_argument("paths", nargs="+", metavar="SRC DST | OUT",
                    help="source Hugging Face checkpoint and output directory; with --heads, the output directory only "
                         "(written elsewhere first, then moved into place)")
    ap.add_argument("--heads", metavar="DIR", help="enlarge Medusa heads / an EAGLE-3 or P-EAGLE module (ModelOpt layout) instead, to match --base")
    ap.add_argument("--base", metavar="DIR", help="with --heads: the enlarged base (an output of this script) whose widths the heads get")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="sizes: target325m / draft for the demo pair's target / draft at 325M / 27M; "
                    "llama8b / llama3b (targets) and llama1b (draft) for the shapes of Llama-3.1-8B, -3.2-3B and -3.2-1B; "
                    "target1b5: a 1.5B target bigger than any CPU cache")
    for flag in SIZE_FLAGS:
        ap.add_argument(f"--{flag}", f"--{flag.replace('_', '-')}", type=int, dest=flag,
                        help="overrides the preset" if flag != "extra_layers" else "dead layers appended (overrides the preset)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="store the output in this dtype [default: the source's]")
    ap.add_argument("--seed", type=int, default=0, help="seed of the +0.0/-0.0 sign patterns and the dead layers' weights")
    ap.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--workers", type=int, default=None, help="threads drawing the new layers (default: the CPUs, at most 16); "
                    "the output is the same bytes whatever the count")
    args = ap.parse_args(argv)
    from specdec.builder.memory import reuse_freed_memory

    reuse_freed_memory()  # the enlargement's tensor-sized temporaries (signed zeros, random layers) reuse freed memory
    if args.heads or args.base:
        return _main_heads(ap, args)
    if len(args.paths) != 2:
        ap.error("expected SRC DST (or --heads DIR --base DIR OUT)")
    args.src, args.dst = args.paths
    try:
        sizes = dict(PRESETS.get(args.preset or "", {}))
        for key in SIZE_FLAGS:
            if getattr(args, key) is not None:
                sizes[key] = getattr(args, key)
        missing = [k for k in SIZE_FLAGS if k not in sizes and k != "head_dim"]
        if missing:
            raise EnlargeError(f"no size for {', '.join('--' + m for m in missing)}: pass them, or a --preset ({', '.join(PRESETS)}).")
        r = enlarge_checkpoint(args.src, args.dst, **sizes, dtype=args.dtype, force=args.force, seed=args.seed, progress=not args.quiet,
                               workers=args.workers)
    except SpecdecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: {err.strerror or err}" + (f" ({err.filename})" if err.filename else "") + ".", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    c = r["config"]
    print(
        f"wrote {r['dst']}: {r['num_parameters'] / 1e6:.1f}M parameters (source {r['source_parameters'] / 1e6:.1f}M), "
        f"hidden {c['hidden_size']}, heads {c['num_attention_heads']}/{c['num_key_value_heads']} x {c['head_dim']}, FFN {c['intermediate_size']}, "
        f"{c['num_hidden_layers']} layers, {r['bytes'] / 2**20:.0f} MiB, {r['seconds']:.1f} s"
    )
    return 0


def _main_heads(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if not (args.heads and args.base) or len(args.paths) != 1:
        ap.error("head enlargement is --heads HEADS_DIR --base ENLARGED_BASE_DIR OUT_DIR")
    if args.preset or any(getattr(args, k) is not None for k in (*SIZE_FLAGS, "dtype")):
        ap.error("with --heads the sizes come from --base's config.json; drop --preset and the size/--dtype flags")
    try:
        r = enlarge_heads(args.heads, args.base, args.paths[0], force=args.force, seed=args.seed)
    except SpecdecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: {err.strerror or err}" + (f" ({err.filename})" if err.filename else "") + ".", file=sys.stderr)
        return 1
    c = r["config"]
    what = {"medusa": "Medusa heads", "eagle": "EAGLE-3 module", "peagle": "P-EAGLE module"}[r["mode"]]
    print(f"wrote {r['dst']}: {what}, hidden {c['specdec_enlarge']['source_hidden_size']} -> {c['hidden_size']}, "
          f"{r['num_parameters'] / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
