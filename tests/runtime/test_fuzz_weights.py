"""Fuzzing an engine's weights with values that break arithmetic: NaN, infinities, and finite values that overflow
float32 on the way (1e38, 1e30 in a product), in a few elements, a whole row, or a norm, anywhere in the network.
An engine built with --allow_nonfinite holds such weights; so does one whose finite weights overflow.

Property (runtime/guards.py): every request ends with a finish reason (an error only with its message), never an
exception; with drafts, greedy output is a prefix of target-only greedy output and equal to it unless it stopped
with an error (a draft's NaN may stop it sooner, never later); specdec-run exits 0, or 1 with one error line.
The poisoned bytes are written into a copy of a built engine (and its hashes updated): no build per example.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from checkpoints import make_checkpoint
from click.testing import CliRunner
from conftest import spec_build
from fuzzing import assert_clean, fuzz_settings, no_hang
from hypothesis import event, given, strategies as st

from specdec.builder.build import build_engine
from specdec.cli.run import main as run_main
from specdec.formats.config_strings import DraftTargetConfig
from specdec.formats.engine_format import CONFIG_FILE, sha256_file
from specdec.runtime import GenerationConfig, load_orchestrator

pytestmark = pytest.mark.fuzz
PROMPTS = [[1, 40, 41, 42, 43], [1, 70, 71, 72, 73, 74]]
OUT = 12
POISONS = [float("nan"), float("inf"), float("-inf"), 1e38, -3.4e38, 1e30, 1e20]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("poison")
    ckpt = make_checkpoint(d / "ckpt", tie_word_embeddings=False)
    build_engine(ckpt, d / "target", spec_build(3, max_batch_size=2, max_input_len=16, max_seq_len=64), say=lambda _: None)
    build_engine(ckpt, d / "draft", spec_build(0, max_batch_size=2, max_input_len=16, max_seq_len=64), say=lambda _: None)
    model = onnx.load(str(d / "target" / "model.onnx"), load_external_data=False)
    tensors = {}  # float32 initializers in model.onnx.data: name -> (offset, shape)
    for t in model.graph.initializer:
        where = {e.key: e.value for e in t.external_data}
        if t.data_type == onnx.TensorProto.FLOAT and where.get("location") == "model.onnx.data" and len(t.dims) in (1, 2):
            tensors[t.name] = (int(where.get("offset", 0)), tuple(t.dims))
    return {"dir": d, "tensors": tensors}


@st.composite
def poisonings(draw, tensors: dict) -> list[tuple[str, int, int, float]]:
    """1-2 edits: (tensor, first element, how many, value): a few elements, a whole row, or a whole 1-D tensor."""
    edits = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(sorted(tensors)))
        shape = tensors[name][1]
        size = int(np.prod(shape))
        if len(shape) == 2 and draw(st.booleans()):  # a row (a token's embedding or LM-head row, an output column's weights)
            row = draw(st.integers(0, shape[0] - 1))
            first, count = row * shape[1], shape[1]
        else:
            first = draw(st.integers(0, size - 1))
            count = draw(st.sampled_from([1, 2, size - first]))
        edits.append((name, first, max(1, min(count, size - first)), draw(st.sampled_from(POISONS))))
    return edits


def poisoned_copy(engines, dst: Path, edits) -> Path:
    shutil.copytree(engines["dir"] / "target", dst)
    data = dst / "model.onnx.data"
    raw = np.memmap(data, dtype=np.uint8, mode="r+")
    for name, first, count, value in edits:
        offset = engines["tensors"][name][0]
        raw[offset + 4 * first : offset + 4 * (first + count)] = np.full(count, value, np.float32).view(np.uint8)
    raw.flush()
    del raw
    cfg = json.loads((dst / CONFIG_FILE).read_text())
    cfg["files"]["model.onnx.data"] = sha256_file(data)
    (dst / CONFIG_FILE).write_text(json.dumps(cfg))
    return dst


@fuzz_settings(12)
@given(data=st.data())
def test_weights_that_break_arithmetic_stop_requests_honestly(engines, tmp_path_factory, data):
    edits = data.draw(poisonings(engines["tensors"]))
    target = poisoned_copy(engines, tmp_path_factory.mktemp("poisoned") / "target", edits)
    config = GenerationConfig(max_output_len=OUT, end_ids=())
    with no_hang(120, edits):
        alone, _ = load_orchestrator(target, num_threads=1).generate(PROMPTS, config)
        spec, _ = load_orchestrator(target, engines["dir"] / "draft", DraftTargetConfig(3, [0], [0], False), num_threads=1).generate(PROMPTS, config)
    for a, s in zip(alone, spec, strict=True):
        for out in (a, s):
            assert out.finish_reason in ("length", "max_seq_len", "error"), out.finish_reason
            assert (out.finish_reason == "error") == bool(out.error)
            event(f"finish {out.finish_reason}")
        assert s.output_ids == a.output_ids[: len(s.output_ids)], (s.output_ids, a.output_ids)  # never a token target-only would not emit
        if s.finish_reason != "error":
            assert s.output_ids == a.output_ids and s.finish_reason == a.finish_reason
    csv = target.parent / "p.csv"
    csv.write_text("\n".join(",".join(map(str, p)) for p in PROMPTS) + "\n")
    r = CliRunner().invoke(run_main, [str(a) for a in ("--engine_dir", target, "--input_file", csv, "--end_id", -1, "--max_output_len", OUT,
                                                      "--num_threads", 1)])
    assert_clean(r)
    assert (r.exit_code == 1) == any(a.finish_reason == "error" for a in alone), r.output
