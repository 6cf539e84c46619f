"""Hugging Face checkpoint directories: config.json + safetensors (+ tokenizer), and llama.cpp's GGUF files read as one.

Pickled ``.bin`` weights are never loaded unless the caller opts in
(``allow_pickle=True``), because unpickling runs arbitrary code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..formats.errors import CheckpointError
from ..formats.safetensors_io import SafetensorsFile
from .gguf_checkpoint import is_gguf

if TYPE_CHECKING:
    from .gguf_checkpoint import GgufTensors
    from .weight_only import IntWeight

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",  # where newer transformers save the chat template (specdec-serve reads it)
)


@dataclass
class Checkpoint:
    """A checkpoint on disk: its raw HF config and a name -> tensor reader."""

    path: Path
    hf_config: dict[str, Any]
    _tensors: dict[str, Any]  # name -> the reader of the file that holds it
    tokenizer_dir: Path | None = None  # where its tokenizer files are, when not beside config.json (a GGUF file's, converted)
    gguf: GgufTensors | None = None  # a GGUF file's tensors (builder/gguf_checkpoint.py), else None
    lora: tuple[dict[str, Any], ...] = ()  # the LoRA adapters merged into its tensors (builder/lora.py), as config.json records them

    @property
    def tokenizer_path(self) -> Path:
        return self.tokenizer_dir or self.path

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def reader(self, name: str) -> Any:
        if name not in self._tensors:
            raise CheckpointError(f"checkpoint {self.path} has no tensor {name!r}; is the config's architecture right?")
        return self._tensors[name]

    def with_readers(self, readers: dict[str, Any], **changes: Any) -> Checkpoint:
        """This checkpoint with some tensors read by other readers (builder/lora.py: merged ones), and ``changes`` to its fields."""
        return replace(self, _tensors={**self._tensors, **readers}, **changes)

    def dtype_name(self, name: str) -> str:
        return self.reader(name).dtype_name(name)

    def raw(self, name: str) -> np.ndarray:
        """Stored bits (float8 as uint8, bfloat16 as uint16)."""
        return self.reader(name).raw(name)

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape, read from the file's header (no tensor data)."""
        return self.reader(name).shape(name)

    def stored(self, name: str) -> np.ndarray:
        """The stored bits where the file maps them (safetensors: no copy), else the values as float32."""
        reader = self.reader(name)
        return reader.raw(name) if hasattr(reader, "raw") else reader.float32(name)

    def float32(self, name: str) -> np.ndarray:
        return self.reader(name).float32(name)

    def int_weight(self, name: str) -> IntWeight | None:
        """A GGUF file's Q4_0 / Q8_0 weight as integer codes (an IntWeight), None where it holds another type."""
        reader = self.reader(name)
        return reader.int_weight(name) if hasattr(reader, "int_weight") else None

    def tokenizer_files(self) -> Iterator[Path]:
        for name in TOKENIZER_FILES:
            p = self.tokenizer_path / name
            if p.is_file():
                yield p


def load_checkpoint(path: str | Path, allow_pickle: bool = False) -> Checkpoint:
    root = Path(path)
    if is_gguf(root):  # llama.cpp's format: its metadata, tokenizer and tensors read as a checkpoint (builder/gguf_checkpoint.py)
        from .gguf_checkpoint import load_gguf

        return load_gguf(root)
    return Checkpoint(root, read_hf_config(root), _index_tensors(root, allow_pickle))


def _looks_like_hub_id(text: str) -> bool:
    """'org/name' as the Hub spells repositories: one slash, no leading ./ or /, no file suffix."""
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and "\\" not in text


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint directory, without opening (or unpickling) its weights."""
    root = Path(path)
    if is_gguf(root):
        from .gguf_checkpoint import gguf_hf_config

        return gguf_hf_config(root)
    if not root.is_dir():
        if root.is_file():
            raise CheckpointError(f"checkpoint directory {root} is a file, not a checkpoint directory (pass the folder that holds "
                                  "config.json).")
        # "org/name" that is no folder here reads as a Hugging Face Hub id: specdec reads local folders only
        hub = (f"; if {path} is a Hugging Face Hub id, download it first (nothing is downloaded here): "
               f"hf download {path} --local-dir {root.name}, then pass --checkpoint_dir {root.name}") if _looks_like_hub_id(str(path)) else ""
        raise CheckpointError(f"checkpoint directory {root} does not exist{hub}.")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(
            f"{root} has no config.json; expected a Hugging Face model directory (config.json + *.safetensors), "
            "as written by `model.save_pretrained(dir)`."
        )
    return read_json_object(cfg_file, "a Hugging Face config")


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object (``what`` names it in the error): a config.json, a peft adapter_config.json."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError; nesting past json's recursion
        raise CheckpointError(f"{path} is not valid JSON: {str(err)[:120] or 'nested too deeply'}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds {type(value).__name__}; expected a JSON object ({what}).")
    return value


def _index_tensors(root: Path, allow_pickle: bool) -> dict[str, Any]:
    index = root / "model.safetensors.index.json"
    single = root / "model.safetensors"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text()).get("weight_map", {})
        if not weight_map:
            raise CheckpointError(f"{index} has an empty weight_map.")
        readers: dict[str, SafetensorsFile] = {}
        tensors = {}
        for name, shard in weight_map.items():
            shard_path = root / shard
            if not shard_path.is_file():
                raise CheckpointError(f"shard {shard} named in {index.name} is missing from {root}.")
            reader = readers.setdefault(shard, SafetensorsFile(shard_path))
            if name not in reader.entries:
                raise CheckpointError(f"{index.name} places {name!r} in {shard}, but that shard does not hold it.")
            tensors[name] = reader
        return tensors
    if single.is_file():
        reader = SafetensorsFile(single)
        return dict.fromkeys(reader.keys(), reader)
    others = sorted(p.name for p in root.glob("*.safetensors"))
    if others:
        tensors = {}
        for name in others:
            reader = SafetensorsFile(root / name)
            tensors.update(dict.fromkeys(reader.keys(), reader))
        return tensors
    bins = sorted(root.glob("pytorch_model*.bin"))
    if bins:
        if not allow_pickle:
            raise CheckpointError(
                f"{root} holds only pickled PyTorch weights ({bins[0].name}); specdec does not unpickle files by default "
                "because unpickling can run arbitrary code. Convert once with "
                "`python -c \"from transformers import AutoModelForCausalLM as M; M.from_pretrained('DIR').save_pretrained('DIR', "
                "safe_serialization=True)\"`, "
                "or pass --allow_pickle if you trust the file."
            )
        return _index_pickled(bins)
    raise CheckpointError(f"{root} has no model weights: expected model.safetensors or model.safetensors.index.json.")


class PickledReader:
    """Opt-in only: torch.load with weights_only=True (still a pickle)."""

    def __init__(self, path: Path):
        import torch  # the build extra; only reached with allow_pickle

        self.state = torch.load(path, map_location="cpu", weights_only=True)

    def keys(self) -> list[str]:
        return list(self.state)

    def dtype_name(self, key: str) -> str:
        return {"torch.bfloat16": "BF16", "torch.float16": "F16"}.get(str(self.state[key].dtype), "F32")

    def float32(self, key: str) -> np.ndarray:
        return self.state[key].float().numpy()

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.state[key].shape)


def _index_pickled(bins: list[Path]) -> dict[str, Any]:
    tensors = {}
    for b in bins:
        reader = PickledReader(b)
        tensors.update(dict.fromkeys(reader.state, reader))
    return tensors
