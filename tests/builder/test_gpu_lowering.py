"""The ort_cuda lowering (plugins/ort_cuda.py), checked on a CPU against the portable lowering.

ONNX Runtime runs GroupQueryAttention, QuickGelu and
SkipSimplifiedLayerNormalization on the CPU in float32, so a float32 build of
the GPU lowering is fed here exactly as the CUDA executor feeds it (shared
past/present buffers, ``total_sequence_length`` from ``attention_bound``, one
call per row for several tokens with a past) and must give the portable
lowering's logits. The half-precision builds, which only a GPU runs, are
checked for what makes them GPU engines: compute dtype, cache dtype, float32
logits and no host read of the positions.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from checkpoints import make_checkpoint
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.runtime.backends.onnxruntime.cuda import attention_bound, rows_one_by_one
from specdec.runtime.engine_format import load_engine_dir
from specdec.runtime.errors import BuildConfigError
from specdec.runtime.backends.base import pad_tokens
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

CASES = {
    "llama (packed qkv, fused rotary)": ("LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3 (head_dim 24: RotaryEmbedding ops, qk norm)": ("Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=False)),
    "qwen2 (qkv bias)": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
}


class CpuRunner:
    """An ort_cuda engine on ONNX Runtime CPU, fed by the CUDA executor's rules (shared cache buffers, attention_bound)."""

    def __init__(self, engine_dir: Path, slots: int):
        import onnxruntime as ort

        self.ort, cfg = ort, load_engine_dir(engine_dir).config
        self.session = ort.InferenceSession(str(engine_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        self.capacity, self.vocab = cfg.build.kv_capacity, cfg.model.vocab_size
        shape = (slots, cfg.model.num_kv_heads, self.capacity, cfg.model.head_dim)
        self.cache = {f"past_{k}.{i}": np.zeros(shape, np.float32) for i in range(cfg.model.num_layers) for k in ("key", "value")}
        self.lengths = np.zeros(slots, np.int64)

    def forward(self, tokens: list[list[int]]) -> np.ndarray:
        ids, num_new = pad_tokens(tokens)
        n, width = ids.shape
        if rows_one_by_one(self.lengths[:n], width):
            out = np.zeros((n, width, self.vocab), np.float32)
            for i, row in enumerate(tokens):
                out[i, : len(row)] = self._run(i, np.array([row]))[0]
            self.lengths[:n] += num_new
            return out
        out = self._run(0, ids)
        self.lengths[:n] += num_new
        return out

    def _run(self, first: int, ids: np.ndarray) -> np.ndarray:
        n, width = ids.shape
        lengths = self.lengths[first : first + n]
        b = self.session.io_binding()
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("position_ids", lengths[:, None] + np.arange(width))
        b.bind_cpu_input("logits_index", np.broadcast_to(np.arange(width), (n, width)).copy())
        b.bind_cpu_input("total_sequence_length", np.array(attention_bound(lengths, width, self.capacity), np.int32))
        b.bind_output("logits")
        for name, buf in self.cache.items():  # a contiguous range of slots, bound as both past and present: in place
            ov = self.ort.OrtValue.ortvalue_from_numpy(buf[first : first + n])
            b.bind_ortvalue_input(name, ov)
            b.bind_ortvalue_output(name.replace("past_", "present_"), ov)
        self.session.run_with_iobinding(b)
        return b.copy_outputs_to_cpu()[0]


@pytest.mark.parametrize("case", CASES)
def test_ort_cuda_float32_matches_portable(case, tmp_path):
    arch, overrides = CASES[case]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    build_engine(ckpt, tmp_path / "portable", spec_build(lowering="portable"), say=lambda _: None)
    build_engine(ckpt, tmp_path / "ort_cuda", spec_build(lowering="ort_cuda", dtype="float32"), say=lambda _: None)
    ref = OrtExecutor(load_engine_dir(tmp_path / "portable"), num_threads=1)
    gpu_form = CpuRunner(tmp_path / "ort_cuda", slots=3)
    cache = ref.new_cache(3)
    steps = [
        [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]],  # first prompt: ragged, one batched GQA "prompt" call
        [[21], [22], [23]],  # one token per row at ragged lengths
        [[24, 25, 26, 27, 28], [29, 30], [31, 32, 33]],  # drafts with a past: one call per row on ONNX Runtime 1.31
        [[34], [35], [36]],
    ]
    for i, tokens in enumerate(steps):
        want = ref.forward(cache, tokens, all_logits=True).logits
        got = gpu_form.forward(tokens)
        for row, t in enumerate(tokens):
            np.testing.assert_allclose(got[row, : len(t)], want[row, : len(t)], atol=2e-5, rtol=0, err_msg=f"step {i}, row {row}")
    # roll row 0 back over its last 6 tokens (rejected drafts) and send others: no trace of the rejected ones
    cache.rollback(0, cache.lengths[0] - 6)
    gpu_form.lengths[0] -= 6
    for tokens in ([[40, 41, 42], [43], [44]], [[45], [46], [47]]):
        want = ref.forward(cache, tokens, all_logits=True).logits
        got = gpu_form.forward(tokens)
        for row, t in enumerate(tokens):
            np.testing.assert_allclose(got[row, : len(t)], want[row, : len(t)], atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_build_computes_in_its_dtype(dtype, llama_ckpt, tmp_path):
    build_engine(llama_ckpt, tmp_path / "e", spec_build(lowering="ort_cuda", dtype=dtype), say=lambda _: None)
    model = onnx.load(str(tmp_path / "e" / "model.onnx"), load_external_data=False)
    half = {"bfloat16": onnx.TensorProto.BFLOAT16, "float16": onnx.TensorProto.FLOAT16}[dtype]
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    outputs = {o.name: o.type.tensor_type for o in model.graph.output}
    assert inputs["past_key.0"].elem_type == half and outputs["present_value.0"].elem_type == half
    assert outputs["logits"].elem_type == onnx.TensorProto.FLOAT  # the ABI's logits stay float32
    total = inputs["total_sequence_length"]
    assert total.elem_type == onnx.TensorProto.INT32 and len(total.shape.dim) == 0
    ops = [n.op_type for n in model.graph.node]
    assert "ReduceMax" not in ops, "the live length must not be computed on the device (a host copy per step)"
    assert ops.count("GroupQueryAttention") == 2 and "Attention" not in ops and "TensorScatter" not in ops
    # weights are used as stored: the only float casts are the rope tables in and the logits out
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert all(".weight" not in n.input[0] for n in casts), [n.input[0] for n in casts]
    weights = [t for t in model.graph.initializer if t.name.endswith(".weight")]
    assert weights and all(t.data_type == half for t in weights)


def test_ort_cuda_refuses_fp8(llama_ckpt, tmp_path):
    with pytest.raises(BuildConfigError, match="ort_cuda .* no FP8 path"):
        build_engine(llama_ckpt, tmp_path / "e", spec_build(lowering="ort_cuda", dtype="bfloat16", quantization="fp8"), say=lambda _: None)
