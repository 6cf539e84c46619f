"""Read safetensors files into numpy without torch.

numpy has no bfloat16 or float8 types, so those tensors are widened here:
bfloat16 -> float32 exactly (it is the top half of a float32), float8 is
returned as raw ``uint8`` bits with its dtype name for the quantization code.
A truncated or malformed file gets a CheckpointError naming the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .errors import CheckpointError

_NUMPY_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_RAW_DTYPES = {"BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _check_entry(name: str, entry: object) -> None:
    """A header entry as the format defines it: a dtype code, a shape of sizes, and [start, stop] offsets that hold
    exactly the shape's bytes (a damaged header fails here, with a name, rather than in a reshape later)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        raise ValueError(f"tensor {name!r} has no dtype")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r} has shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"tensor {name!r} has data_offsets {offsets!r}")
    dtype = _NUMPY_DTYPES.get(entry["dtype"]) or _RAW_DTYPES.get(entry["dtype"])
    if dtype is not None and offsets[1] - offsets[0] != int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize:
        raise ValueError(f"tensor {name!r} of shape {shape} and dtype {entry['dtype']} has {offsets[1] - offsets[0]} bytes")


class SafetensorsFile:
    """One .safetensors file, memory-mapped; tensors are read on demand."""

    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError("file shorter than its 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8:
                    raise ValueError(f"header length {n} runs past the end of the file ({size} bytes)")
                header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError(f"its header is {type(header).__name__}, not an object")
            header.pop("__metadata__", None)  # free-form strings, not a tensor
            for name, entry in header.items():
                _check_entry(name, entry)
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as err:
            raise CheckpointError(f"{path} is not a readable safetensors file ({str(err)[:200] or 'nested too deeply'}). Re-save or "
                                  "re-download the checkpoint.") from err
        self._data_start = 8 + n
        self.entries: dict[str, dict] = header
        end = max((e["data_offsets"][1] for e in header.values()), default=0)
        if self._data_start + end > size:
            raise CheckpointError(
                f"{path} is truncated: its header describes {self._data_start + end} bytes but the file has {size}. "
                "Re-save or re-download the checkpoint."
            )
        self._mmap = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)

    def keys(self) -> list[str]:
        return list(self.entries)

    def dtype_name(self, name: str) -> str:
        return self.entries[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.entries[name]["shape"])

    def raw(self, name: str) -> np.ndarray:
        """The tensor with its stored bits: BF16 as uint16, F8 as uint8."""
        e = self.entries[name]
        code, shape = e["dtype"], e["shape"]
        np_dtype = _NUMPY_DTYPES.get(code) or _RAW_DTYPES.get(code)
        if np_dtype is None:
            raise CheckpointError(f"tensor {name!r} in {self.path} has dtype {code}, which specdec cannot read.")
        start, stop = e["data_offsets"]
        buf = self._mmap[self._data_start + start : self._data_start + stop]
        return np.frombuffer(buf, dtype=np_dtype).reshape(shape)

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32 (bfloat16 widened exactly)."""
        code = self.dtype_name(name)
        arr = self.raw(name)
        if code == "BF16":
            return bf16_bits_to_float32(arr)
        if code.startswith("F8"):
            raise CheckpointError(f"tensor {name!r} is {code}; FP8 checkpoints need the quantization path.")
        return arr.astype(np.float32)


# numpy dtype name -> the safetensors dtype code it is written as (bfloat16: ml_dtypes' type, found by name so that
# this module needs numpy only; float8 goes through the FP8 quantization path, never here)
_WRITE_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
                "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` as one safetensors file (little-endian, C order), tensor by tensor: nothing is joined in memory.

    Written here rather than with the safetensors package because the reader above is ours too (the two must
    agree on every code) and numpy has no bfloat16 of its own: a bfloat16 array is ml_dtypes' type, found by name."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, arr in tensors.items():
        code = _WRITE_CODES.get(arr.dtype.name)
        if code is None:
            raise ValueError(f"tensor {name!r} has dtype {arr.dtype}, which write_safetensors does not write.")
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the safetensors package writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in tensors.values():
            data = np.ascontiguousarray(arr)
            if data.dtype.byteorder == ">":
                data = data.byteswap().view(data.dtype.newbyteorder("<"))
            f.write(memoryview(data.reshape(-1).view(np.uint8)))
