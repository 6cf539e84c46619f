"""The network on disk: ``model.onnx`` + its weights in ``model.onnx.data``.

Every backend starts from these two files (the onnxruntime backend ships
them as they are, the tensorrt backend compiles them), and calibration and
AWQ run the float network from them under ONNX Runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

NETWORK_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"


def save_network(model: onnx.ModelProto, out_dir: Path) -> str:
    """Serialize the network into ``out_dir``, weights external (one proto is capped at 2 GiB); return the network file's name."""
    # onnx refuses a weights file that exists at ``location`` taken relative to the CURRENT directory, not the model's: a build
    # run from inside an engine directory (or into ".") failed with FileExistsError. Checked where the file goes instead.
    target = (out_dir / NETWORK_FILE).resolve()  # before the chdir: a relative out_dir is relative to where we are now
    back = os.getcwd()
    os.chdir(target.parent)  # (contextlib.chdir is 3.11's; a build runs on one thread)
    try:
        onnx.save_model(
            model,
            str(target),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=WEIGHTS_FILE,
            size_threshold=1024,
        )
    finally:
        os.chdir(back)
    return NETWORK_FILE
