"""PEFT LoRA adapters merged into a checkpoint's weights as the build reads them (specdec-build --lora_dir).

    W' = W + s * (alpha / r) * B @ A          alpha / sqrt(r) with use_rslora; s = --lora_scale

for each adapter in the order given, as peft's ``merge_and_unload`` computes it: an engine built with an adapter
decodes what the adapted model decodes, at one engine's cost (no extra matmuls per step, any --qformat after the merge).
Adapters in peft's files: ``adapter_config.json`` + ``adapter_model.safetensors`` (``.bin`` only with --allow_pickle),
LoRA on any linear layer the network reads (q/k/v/o, gate/up/down, Phi-3's fused qkv_proj / gate_up_proj, lm_head),
LoRA on embed_tokens, and ``modules_to_save`` (whole tensors that replace the checkpoint's).

Written here rather than through peft: peft merges a model loaded whole into torch (the model's size in float, then a
merged checkpoint written to disk and read back), where this adds each update to its one tensor as the build reads it.
The tests compare engines against peft's own forward.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.errors import BuildConfigError, CheckpointError
from ..formats.file_stamps import sha256_file
from ..formats.safetensors_io import SafetensorsFile
from .checkpoint import Checkpoint, PickledReader, read_json_object

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"
PREFIX = "base_model.model."  # peft's saved names: base_model.model.<the model's own module name>...
EMBEDDINGS = ("model.embed_tokens.weight", "lm_head.weight")

# adapter_config.json settings whose adapted layer is not W + B·A (or not always): refused rather than merged wrongly
NOT_MERGEABLE = {
    "use_dora": "DoRA (a learned magnitude per output column)",
    "lora_bias": "a bias on lora_B",
    "fan_in_fan_out": "fan_in_fan_out (GPT-2's Conv1D layers)",
    "use_qalora": "QA-LoRA (pooled inputs)",
    "alora_invocation_tokens": "activated LoRA (on only after its invocation tokens)",
    "use_bdlora": "block-diagonal LoRA",
    "target_parameters": "LoRA on bare parameters (mixture-of-experts)",
    "trainable_token_indices": "trainable tokens",
    "layer_replication": "layer replication",
    "arrow_config": "Arrow routing (adapters chosen per token)",
}


@dataclass(frozen=True)
class LoraUpdate:
    """One low-rank update of a tensor stored [rows, cols]: delta = scaling * b @ a."""

    a: np.ndarray  # [r, cols] float32
    b: np.ndarray  # [rows, r] float32
    scaling: float  # alpha / r (alpha / sqrt(r) with rslora), times the adapter's --lora_scale

    @property
    def shape(self) -> tuple[int, int]:
        return self.b.shape[0], self.a.shape[1]


@dataclass
class LoraAdapter:
    """An adapter read from its folder: the updates and the replacements it makes, by checkpoint tensor name."""

    path: Path
    scale: float
    config: dict[str, Any]
    updates: dict[str, LoraUpdate] = field(default_factory=dict)
    replacements: dict[str, tuple[Any, str]] = field(default_factory=dict)  # name -> (the adapter file's reader, its key)
    sha256: str = ""

    @property
    def ranks(self) -> list[int]:
        return sorted({u.a.shape[0] for u in self.updates.values()})

    def record(self) -> dict[str, Any]:
        """What the engine's config.json says of it."""
        return {"path": str(self.path), "scale": self.scale, "sha256": self.sha256, "r": self.ranks, "lora_alpha": self.config.get("lora_alpha", 8),
                "use_rslora": bool(self.config.get("use_rslora")), "updated": len(self.updates), "replaced": sorted(self.replacements),
                "base_model_name_or_path": self.config.get("base_model_name_or_path")}


def load_lora_adapters(dirs: Sequence[str | Path], scales: Sequence[float] = (), allow_pickle: bool = False) -> list[LoraAdapter]:
    """The adapters of ``dirs``, each with its scale: ``scales`` empty (1.0 each), one for all, or one per adapter."""
    if len(scales) not in (0, 1, len(dirs)) or (scales and not dirs):
        raise BuildConfigError(f"--lora_scale was given {len(scales)} time{'s' * (len(scales) != 1)} for {len(dirs)} --lora_dir: give one "
                               "scale for all adapters, or one per --lora_dir in the same order.")
    for s in scales:
        if not math.isfinite(s):
            raise BuildConfigError(f"--lora_scale {s} is not a finite number.")
    per_dir = list(scales) * len(dirs) if len(scales) == 1 else list(scales) or [1.0] * len(dirs)
    return [load_lora_adapter(d, s, allow_pickle) for d, s in zip(dirs, per_dir, strict=True)]


def load_lora_adapter(path: str | Path, scale: float = 1.0, allow_pickle: bool = False) -> LoraAdapter:
    """One adapter folder read and checked on its own (against the checkpoint: merge_lora); its A/B pairs held in float32."""
    root = Path(path)
    config = _read_config(root)
    weights, where, digest = _open_weights(root, allow_pickle)
    adapter = LoraAdapter(root.resolve(), float(scale), config, sha256=digest)
    pairs: dict[str, dict[str, str]] = {}  # module -> {"A": key, "B": key, "kind": linear|embedding}
    for key in weights.keys():
        if not key.startswith(PREFIX):
            raise CheckpointError(f"{where} holds {key!r}, which is not a peft adapter's tensor name (base_model.model.<module>...). "
                                  "Save the adapter with peft's save_pretrained.")
        name = key[len(PREFIX):]
        if m := re.fullmatch(r"(.+)\.lora_([AB])\.weight", name):
            pairs.setdefault(m[1], {"kind": "linear"})[m[2]] = key
        elif m := re.fullmatch(r"(.+)\.lora_embedding_([AB])", name):
            pairs.setdefault(m[1], {"kind": "embedding"})[m[2]] = key
        elif ".base_layer." in name:  # the layer's own tensor, saved beside its LoRA: an embedding's (save_embedding_layers), a bias
            adapter.replacements[name.replace(".base_layer.", ".")] = (weights, key)  # trained with bias="all" / "lora_only"
        elif ".lora_" in name or "lora_magnitude_vector" in name:
            raise CheckpointError(f"{where} holds {key!r}, a LoRA tensor of a kind specdec does not merge (LoRA A/B pairs on linear "
                                  "and embedding layers are merged); merge it with peft (merge_and_unload) and build from the result.")
        else:  # modules_to_save (a whole layer trained in place of the model's), a bias trained with bias="all"
            adapter.replacements[name] = (weights, key)
    for reader, key in adapter.replacements.values():
        if not np.isfinite(reader.float32(key)).all():
            raise CheckpointError(f"{where}: {key} holds NaN or Inf; the adapter is damaged.")
    for module, pair in sorted(pairs.items()):
        if "A" not in pair or "B" not in pair:
            raise CheckpointError(f"{where} holds LoRA {'A' if 'A' in pair else 'B'} of {module} without its "
                                  f"{'B' if 'A' in pair else 'A'}: the adapter file is incomplete.")
        a, b = weights.float32(pair["A"]), weights.float32(pair["B"])
        if pair["kind"] == "embedding":  # lora_embedding_A [r, vocab], _B [hidden, r]: the weight [vocab, hidden] moves by (B @ A).T
            a, b = np.ascontiguousarray(b.T), np.ascontiguousarray(a.T)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise CheckpointError(f"{where}: {module}'s LoRA A {list(a.shape)} and B {list(b.shape)} do not share a rank.")
        r = a.shape[0]
        alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", 8)))
        scaling = alpha / (math.sqrt(r) if config.get("use_rslora") else r) * adapter.scale
        for what, t in (("A", a), ("B", b)):
            if not np.isfinite(t).all():
                raise CheckpointError(f"{where}: {module}'s LoRA {what} holds NaN or Inf; the adapter is damaged.")
        adapter.updates[f"{module}.weight"] = LoraUpdate(a, b, scaling)
    if not adapter.updates and not adapter.replacements:
        raise CheckpointError(f"{where} holds no LoRA weights.")
    return adapter


def _read_config(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise CheckpointError(f"--lora_dir {root} does not exist or is not a directory: it takes a peft LoRA adapter's folder "
                              f"({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}, as peft's save_pretrained writes it).")
    cfg_file = root / ADAPTER_CONFIG
    if not cfg_file.is_file():
        hint = " (it holds config.json: a whole model, not an adapter; pass it as --checkpoint_dir)" if (root / "config.json").is_file() else ""
        raise CheckpointError(f"--lora_dir {root} has no {ADAPTER_CONFIG}{hint}: expected a peft LoRA adapter's folder.")
    config = read_json_object(cfg_file, "a peft adapter config")
    kind = config.get("peft_type")
    if kind != "LORA":
        raise CheckpointError(f"{cfg_file} describes a {kind or 'untyped'} adapter (peft_type); specdec merges LORA adapters only.")
    for key, what in NOT_MERGEABLE.items():
        if config.get(key):
            raise CheckpointError(f"{cfg_file} uses {what} ({key}), which a merge as W + B·A does not express; merge it with peft "
                                  "(merge_and_unload, save_pretrained) and build from the saved checkpoint.")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and (init.lower().startswith(("pissa", "corda")) or init.lower() in ("olora", "loftq", "lora_ga")):
        raise CheckpointError(f"{cfg_file}: init_lora_weights {init!r} subtracts its initial B·A from the base weights, so the adapter applies "
                              "to a changed base, not to this checkpoint. Save it with peft's save_pretrained(..., "
                              "path_initial_model_for_weight_conversion=...) (a plain LoRA of the original base), or merge it with peft "
                              "(merge_and_unload) and build from the saved checkpoint.")
    for key in ("lora_alpha", "r"):
        _positive(config.get(key, 8), f"{cfg_file}: {key}")
    if config.get("use_rslora") not in (None, True, False):
        raise CheckpointError(f"{cfg_file}: use_rslora is {config['use_rslora']!r}; expected true or false.")
    patterns = config.get("alpha_pattern") or {}
    if not isinstance(patterns, dict):
        raise CheckpointError(f"{cfg_file}: alpha_pattern is {patterns!r}; expected an object of module patterns and alphas.")
    for pattern, alpha in patterns.items():
        _positive(alpha, f"{cfg_file}: alpha_pattern[{pattern!r}]")
        try:
            re.compile(pattern)
        except re.error as err:
            raise CheckpointError(f"{cfg_file}: alpha_pattern key {pattern!r} is not a regular expression peft can match ({err}).") from None
    return config


def _positive(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise CheckpointError(f"{what} is {value!r}; expected a positive number.")


def _open_weights(root: Path, allow_pickle: bool) -> tuple[SafetensorsFile | PickledReader, Path, str]:
    """The adapter file's reader, its path and its SHA-256."""
    safe, pickled = root / ADAPTER_WEIGHTS, root / ADAPTER_PICKLE
    if safe.is_file():
        reader: SafetensorsFile | PickledReader = SafetensorsFile(safe)
        path = safe
    elif pickled.is_file():
        if not allow_pickle:
            raise CheckpointError(f"--lora_dir {root} holds only a pickled adapter ({ADAPTER_PICKLE}); specdec does not unpickle files by default "
                                  "because unpickling can run arbitrary code. Re-save it with peft's save_pretrained (safetensors, its default), "
                                  "or pass --allow_pickle if you trust the file.")
        reader = PickledReader(pickled)
        path = pickled
    else:
        raise CheckpointError(f"--lora_dir {root} has no {ADAPTER_WEIGHTS}: expected a peft LoRA adapter's folder.")
    return reader, path, sha256_file(path)


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """peft's alpha_pattern / rank_pattern lookup: the first key that matches the module name's end, on a dot boundary."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


class _MergedReader:
    """A checkpoint tensor read as the base's (or an adapter's replacement) plus the adapters' updates, in float32."""

    ROWS = 4096  # rows of an update added at a time: no weight-sized temporary (a 128k-token LM head's would be gigabytes)

    def __init__(self, base: tuple[Any, str], updates: list[LoraUpdate]):
        self.base, self.updates = base, updates

    def dtype_name(self, name: str) -> str:
        return "F32"

    def shape(self, name: str) -> tuple[int, ...]:
        reader, key = self.base
        return tuple(reader.shape(key))

    def float32(self, name: str) -> np.ndarray:
        reader, key = self.base
        w = np.array(reader.float32(key), dtype=np.float32)  # a copy: the file's own values may be a read-only map
        for update in self.updates:
            b = update.b * np.float32(update.scaling)  # [rows, r]: scaled while small
            for start in range(0, w.shape[0], self.ROWS):
                w[start : start + self.ROWS] += b[start : start + self.ROWS] @ update.a
        return w

    raw = float32


def merge_lora(ckpt: Checkpoint, adapters: list[LoraAdapter], tie_word_embeddings: bool, quantized: str | None,
               say: Callable[[str], None] = print) -> Checkpoint:
    """``ckpt`` with every tensor the adapters touch read merged: the same Checkpoint otherwise.

    quantized: what the checkpoint holds when its linear layers are not float ("fp8", "int4 (gptq)", ...), else None."""
    if quantized is not None:
        raise BuildConfigError(f"--lora_dir merges an adapter into float weights, and {ckpt.path} holds {quantized} weights: build from the float "
                               "checkpoint the adapter was trained on (--qformat then quantizes the merged weights).")
    merged: dict[str, tuple[tuple[Any, str], list[LoraUpdate]]] = {}
    for adapter in adapters:
        for name in sorted({*adapter.updates, *adapter.replacements}):
            _check_target(ckpt, adapter, name, tie_word_embeddings)
            base, updates = merged.get(name, ((ckpt.reader(name), name), []))
            if name in adapter.replacements:  # a whole tensor of this adapter: earlier adapters' updates to it are gone, as in peft
                base, updates = adapter.replacements[name], []
            if name in adapter.updates:
                updates = [*updates, adapter.updates[name]]
            merged[name] = (base, updates)
    for adapter in adapters:
        ranks = "/".join(map(str, adapter.ranks)) or "-"
        say(f"note: LoRA adapter {adapter.path} merged (scale {adapter.scale:g}, r {ranks}): {len(adapter.updates)} layers updated"
            f"{f', {len(adapter.replacements)} tensors taken whole from it' if adapter.replacements else ''}.")
    readers = {name: _MergedReader(base, updates) for name, (base, updates) in merged.items()}
    return ckpt.with_readers(readers, lora=(*ckpt.lora, *(a.record() for a in adapters)))


def _check_target(ckpt: Checkpoint, adapter: LoraAdapter, name: str, tie_word_embeddings: bool) -> None:
    if tie_word_embeddings and name in EMBEDDINGS:  # (before "not in the checkpoint": a tied one has no lm_head.weight)
        raise CheckpointError(f"LoRA adapter {adapter.path} changes {name.removesuffix('.weight')}, and checkpoint {ckpt.path} ties its LM head to "
                              "its embedding (tie_word_embeddings): merging would change both, which is not the adapted model peft runs. "
                              "LoRA on the attention and MLP layers of such a model merges.")
    if name not in ckpt:
        module = name.removesuffix(".weight")
        raise CheckpointError(f"LoRA adapter {adapter.path} changes {module}, which checkpoint {ckpt.path} does not have: the adapter was trained "
                              f"on another model (its base_model_name_or_path: {adapter.config.get('base_model_name_or_path')}).")
    want = tuple(ckpt.shape(name))
    if name in adapter.updates and adapter.updates[name].shape != want:
        got = list(adapter.updates[name].shape)
        raise CheckpointError(f"LoRA adapter {adapter.path}: the update of {name} is {got}, the checkpoint's {name} is {list(want)}: the adapter "
                              "was trained on another model.")
    if name in adapter.replacements:
        reader, key = adapter.replacements[name]
        got = tuple(reader.shape(key))
        if got != want:
            grew = " (the adapter resized the vocabulary: not supported; build from the model saved with its new vocabulary)" if (
                name in EMBEDDINGS and got[1:] == want[1:]) else ""
            raise CheckpointError(f"LoRA adapter {adapter.path}: its {key} is {list(got)}, the checkpoint's {name} is {list(want)}{grew}.")
