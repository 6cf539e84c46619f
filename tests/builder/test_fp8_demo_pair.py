"""FP8 on a trained model: greedy agreement with the float32 engine on the demo pair.

Random tiny models sit on ties, so this uses the shipped demo target
(examples/demo-pair). Measured: 0.78 of tokens agree over 6 prompts x 96
tokens (docs/precision.md). The threshold below leaves room for noise-free
differences between prompt sets, not for a broken FP8 path (which gives ~0).
"""

from pathlib import Path

import numpy as np
import pytest

from specdec.builder.build import build_engine
from specdec.formats.engine_format import BuildConfig
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.loading import load_orchestrator
from specdec.runtime.orchestrator import GenerationConfig

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target"
AGREEMENT_THRESHOLD = 0.6
PROMPTS = [
    "def split_words(text):\n    \"\"\"Split text into words.\"\"\"\n",
    "class Counter:\n    def __init__(self):\n        self.",
    "import os\n\n\ndef read_lines(path):\n",
    "    for key, value in sorted(",
]


@pytest.mark.skipif(not DEMO.is_dir(), reason="the demo pair is not in this checkout")
def test_fp8_greedy_agreement_on_the_demo_model(tmp_path):
    outputs = {}
    for name, q in (("float32", "none"), ("fp8", "fp8")):
        build_engine(DEMO, tmp_path / name, BuildConfig(dtype="float32", quantization=q, max_batch_size=4, max_input_len=64, max_seq_len=160),
                     say=lambda _: None)
        tok = Tokenizer(tmp_path / name)
        orch = load_orchestrator(tmp_path / name, num_threads=1)
        outs, _ = orch.generate([tok.encode(p) for p in PROMPTS], GenerationConfig(max_output_len=64))
        outputs[name] = [o.output_ids for o in outs]
    agreement = np.mean([np.mean(np.array(a) == np.array(b)) for a, b in zip(outputs["fp8"], outputs["float32"], strict=True)])
    assert agreement >= AGREEMENT_THRESHOLD, agreement
    # linear weights shrink 4x; the float32 embedding (a fifth of this model) does not
    assert (tmp_path / "fp8" / "model.onnx.data").stat().st_size < 0.4 * (tmp_path / "float32" / "model.onnx.data").stat().st_size
