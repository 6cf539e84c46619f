"""formats/safetensors_io.py: bfloat16 read into float32 bit for bit, whatever the bits; a damaged header refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec.formats.errors import CheckpointError
from specdec.formats.safetensors_io import SafetensorsFile, bf16_bits_to_float32, write_safetensors

ml_dtypes = pytest.importorskip("ml_dtypes")


def test_bfloat16_bits_widen_to_the_float32_ml_dtypes_gives():
    """Every one of the 65536 bfloat16 bit patterns (zeros of both signs, subnormals, infinities, NaNs) widens to the
    float32 whose top half it is, as ml_dtypes' cast does; a 2-D and a strided view too."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = bf16_bits_to_float32(bits)
    assert got.dtype == np.float32 and got.shape == bits.shape
    assert np.array_equal(got.view(np.uint32), bits.astype(np.uint32) << 16)
    want = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    grid = bits.reshape(256, 256)[:, ::3]
    assert np.array_equal(bf16_bits_to_float32(grid).view(np.uint32), grid.astype(np.uint32) << 16)


def test_a_bfloat16_tensor_reads_back_as_its_float32_values(tmp_path):
    values = np.random.default_rng(0).standard_normal((5, 7)).astype(ml_dtypes.bfloat16)
    write_safetensors(tmp_path / "t.safetensors", {"w": values})
    f = SafetensorsFile(tmp_path / "t.safetensors")
    assert f.dtype_name("w") == "BF16"
    assert np.array_equal(f.float32("w"), values.astype(np.float32))


def _with_header(path, header: object) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(len(body).to_bytes(8, "little") + body + bytes(64))


@pytest.mark.parametrize("header, said", [
    ([1, 2], "its header is list"),
    ({"w": {"dtype": "F32", "shape": [2, 2]}}, "tensor 'w' has data_offsets None"),
    ({"w": {"shape": [2], "data_offsets": [0, 8]}}, "tensor 'w' has no dtype"),
    ({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}}, "tensor 'w' has shape [2, -1]"),
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 0]}}, "data_offsets [8, 0]"),
    ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, "has 12 bytes"),
    ({"w": "F32"}, "tensor 'w' has no dtype"),
])
def test_a_damaged_header_is_one_checkpoint_error_naming_the_file(tmp_path, header, said):
    path = tmp_path / "model.safetensors"
    _with_header(path, header)
    with pytest.raises(CheckpointError, match="is not a readable safetensors file") as err:
        SafetensorsFile(path)
    assert said in str(err.value) and str(path) in str(err.value)
