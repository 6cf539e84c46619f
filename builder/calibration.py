"""Static FP8 activation scales, calibrated on a text file.

The unquantized network is built once with every linear layer's input exposed
as an extra output; calibration text runs through it under ONNX Runtime
(context phase, batch 1) and each layer's scale is amax / 448.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from ..formats.errors import BuildConfigError
from .quantization import FP8_MAX


def calibration_samples(text_file: Path, tokenizer_dir: Path, num_samples: int, sample_len: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    if not text_file.is_file():
        raise BuildConfigError(f"--calib_dataset {text_file} does not exist; expected a UTF-8 text file.")
    tok_file = tokenizer_dir / "tokenizer.json"
    if not tok_file.is_file():
        raise BuildConfigError(f"calibration needs the checkpoint's tokenizer.json, which {tokenizer_dir} lacks.")
    try:
        text = text_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise BuildConfigError(f"--calib_dataset {text_file} is not UTF-8 text (byte {err.start}): calibrate on text like the model's.") from None
    ids = Tokenizer.from_file(str(tok_file)).encode(text).ids
    samples = [ids[i : i + sample_len] for i in range(0, len(ids), sample_len)][:num_samples]
    samples = [s for s in samples if len(s) >= 2]
    if not samples:
        raise BuildConfigError(f"--calib_dataset {text_file} is too short to calibrate on.")
    return samples


def calibrate_activation_scales(model, taps: dict[str, str], cache_shape: tuple[int, ...], num_layers: int,
                                samples: list[list[int]]) -> dict[str, float]:
    """Run ``samples`` through the float network ``model``; amax/448 per linear layer input (``taps``: name -> value)."""
    import onnxruntime as ort

    from .network_file import save_network

    graph = model.graph
    for value in taps.values():
        graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="specdec-calib-") as tmp:
        # From files, weights external: one serialized proto is capped at 2 GiB (~500M float32 parameters);
        # the session runs inside the block, so the files outlive it everywhere.
        sess = ort.InferenceSession(str(Path(tmp) / save_network(model, Path(tmp))), opts, providers=["CPUExecutionProvider"])
        names = list(taps)
        amax = dict.fromkeys(names, 0.0)
        for feed in context_feeds(samples, cache_shape, num_layers):
            outs = sess.run([taps[k] for k in names], feed)
            for k, v in zip(names, outs, strict=True):
                amax[k] = max(amax[k], float(np.abs(v).max()))
    return {k: max(v, 1e-12) / FP8_MAX for k, v in amax.items()}


def context_feeds(samples: list[list[int]], cache_shape: tuple[int, ...], num_layers: int):
    """One context-phase feed (batch 1, the whole sample, last row's logits) per calibration sample."""
    # A plain run() returns new caches and leaves these inputs as they are: one set of zeros serves every sample.
    empty = {f"past_{kind}.{i}": np.zeros(cache_shape, np.float32) for i in range(num_layers) for kind in ("key", "value")}
    for ids in samples:
        n = len(ids)
        yield {
            "input_ids": np.array([ids], np.int64),  # [1, n]
            "position_ids": np.arange(n, dtype=np.int64)[None],  # [1, n]
            "logits_index": np.array([[n - 1]], np.int64),  # [1, 1]
            **empty,
        }
