"""The onnxruntime backend: the network as ``model.onnx`` + external weights."""

from __future__ import annotations

from pathlib import Path

import onnx

from ...runtime.errors import BuildConfigError

NETWORK_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"


def write_engine(model: onnx.ModelProto, out_dir: Path) -> str:
    """Serialize the network into ``out_dir``; return the network file's name."""
    onnx.save_model(
        model,
        str(out_dir / NETWORK_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=WEIGHTS_FILE,
        size_threshold=1024,
    )
    return NETWORK_FILE


def check_loads(out_dir: Path) -> None:
    """Create one ONNX Runtime session: a build that cannot be loaded fails here, not on the host."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(out_dir / NETWORK_FILE), opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped errors
        raise BuildConfigError(f"ONNX Runtime {ort.__version__} cannot load the built network: {err}") from err
