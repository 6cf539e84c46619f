"""The ort_cuda lowering (plugins/ort_cuda.py, plugins/ort_cuda_masked.py), checked on a CPU against the portable lowering.

ONNX Runtime's CPU provider runs every op of a float32 ort_cuda build (GroupQueryAttention, TensorScatter,
Attention with nonpad_kv_seqlen, RotaryEmbedding, MatMulNBits, QuickGelu, SkipSimplifiedLayerNormalization),
so each form is fed here exactly as the CUDA executor feeds it and must give the portable lowering's logits:

* gqa: shared past/present buffers, ``total_sequence_length`` from ``attention_bound``, one call per row for
  several tokens with a past (CpuRunner below);
* masked: the engine ABI's inputs only (no host-side input), so the CPU executor itself runs it, one call per
  step at any batch, ragged rows and trees included.

The half-precision builds, which only a GPU runs, are checked for what makes them GPU engines: compute dtype,
cache dtype, float32 outputs, no host read of the positions and no op the CUDA provider lacks in that dtype.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import load_engine_dir
from specdec.formats.errors import BuildConfigError
from specdec.runtime.backends.base import pad_tokens
from specdec.runtime.backends.onnxruntime.cuda import attention_bound, rows_one_by_one

CASES = {
    "llama (packed qkv, fused rotary)": ("LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3 (head_dim 24: RotaryEmbedding ops, qk norm)": ("Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=False)),
    "qwen2 (qkv bias)": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
}
STEPS = [
    [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]],  # first prompt: ragged
    [[21], [22], [23]],  # one token per row at ragged lengths
    [[24, 25, 26, 27, 28], [29, 30], [31, 32, 33]],  # drafts with a past, ragged
    [[34], [35], [36]],
]
AFTER_ROLLBACK = ([[40, 41, 42], [43], [44]], [[45], [46], [47]])
quiet = dict(say=lambda _: None)


class CpuRunner:
    """A gqa ort_cuda engine on ONNX Runtime CPU, fed by the CUDA executor's rules (shared cache buffers, attention_bound)."""

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

    def rollback(self, slot: int, to: int) -> None:
        self.lengths[slot] = to

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


class ExecutorRunner:
    """A masked ort_cuda engine on the CPU executor: the ABI's inputs only, every step one call."""

    def __init__(self, ex, slots: int):
        self.ex, self.cache = ex, ex.new_cache(slots)

    def forward(self, tokens: list[list[int]]) -> np.ndarray:
        return self.ex.forward(self.cache, tokens, all_logits=True).logits

    def rollback(self, slot: int, to: int) -> None:
        self.cache.rollback(slot, to)


def check_steps(ref, got) -> None:
    """STEPS, a rollback of row 0 over its last 6 tokens (rejected drafts), AFTER_ROLLBACK: the same logits as ``ref``."""
    cache = ref.new_cache(3)
    for i, tokens in enumerate(STEPS):
        want = ref.forward(cache, tokens, all_logits=True).logits.copy()
        out = got.forward(tokens)
        for row, t in enumerate(tokens):
            np.testing.assert_allclose(out[row, : len(t)], want[row, : len(t)], atol=2e-5, rtol=0, err_msg=f"step {i}, row {row}")
    cache.rollback(0, cache.lengths[0] - 6)
    got.rollback(0, int(cache.lengths[0]))
    for tokens in AFTER_ROLLBACK:
        want = ref.forward(cache, tokens, all_logits=True).logits.copy()
        out = got.forward(tokens)
        for row, t in enumerate(tokens):
            np.testing.assert_allclose(out[row, : len(t)], want[row, : len(t)], atol=2e-5, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_both_forms_in_float32_match_portable(case, tmp_path):
    arch, overrides = CASES[case]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    ref = build_and_load(ckpt, tmp_path / "portable", spec_build(lowering="portable"))
    build_engine(ckpt, tmp_path / "gqa", spec_build(lowering="ort_cuda", dtype="float32", cuda_attention="gqa"), **quiet)
    check_steps(ref, CpuRunner(tmp_path / "gqa", slots=3))
    masked = build_and_load(ckpt, tmp_path / "masked", spec_build(lowering="ort_cuda", dtype="float32"))
    assert (masked.build.cuda_attention, masked.build.kv_layout) == ("masked", "bsh")  # auto: a target that verifies drafts
    inputs = {i.name for i in masked.session.get_inputs()}
    assert "total_sequence_length" not in inputs  # nothing on the host: every step of a shape is the same graph
    check_steps(ref, ExecutorRunner(masked, slots=3))


def test_auto_picks_gqa_for_engines_that_never_verify(llama_ckpt, tmp_path):
    build_engine(llama_ckpt, tmp_path / "draft", spec_build(0, lowering="ort_cuda", dtype="float32"), **quiet)
    build = load_engine_dir(tmp_path / "draft").config.build
    assert (build.cuda_attention, build.kv_layout) == ("gqa", "bnsh")
    ex = build_and_load(llama_ckpt, tmp_path / "forced", spec_build(0, lowering="ort_cuda", dtype="float32", cuda_attention="masked"))
    assert (ex.build.cuda_attention, ex.build.kv_layout) == ("masked", "bsh")
    logits = ex.forward(ex.new_cache(2), [[5, 6, 7], [8, 9]], all_logits=True).logits  # a masked draft batches its catch-up too
    assert np.isfinite(logits).all()


def graph_of(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path / "model.onnx"), load_external_data=False)


def half_precision_checks(model: onnx.ModelProto, half: int) -> list[str]:
    """What makes a half-precision build a GPU engine; returns its op types."""
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    outputs = {o.name: o.type.tensor_type for o in model.graph.output}
    assert inputs["past_key.0"].elem_type == half and outputs["present_value.0"].elem_type == half
    assert all(o.elem_type == onnx.TensorProto.FLOAT for n, o in outputs.items() if not n.startswith("present_"))  # the ABI's float32 outputs
    ops = [n.op_type for n in model.graph.node]
    assert "ReduceMax" not in ops, "the live length must not be computed on the device (a host copy per step)"
    assert "Pad" not in ops, "ONNX Runtime's CUDA Pad has no bfloat16 kernel: a CPU fallback would copy activations to the host"
    # weights are used as stored: float casts only of the rope tables, mask constants, hidden_states in and the outputs
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert all(".weight" not in n.input[0] for n in casts), [n.input[0] for n in casts]
    weights = [t for t in model.graph.initializer if t.name.endswith((".weight", ".weight_scales"))]
    assert weights and all(t.data_type == half for t in weights)
    return ops


def test_the_cpu_executor_refuses_what_only_the_cuda_provider_runs(llama_ckpt, tmp_path):
    """GroupQueryAttention's host input and half-precision compute are the CUDA provider's: one line saying what to rebuild, not
    ONNX Runtime's missing-input traceback at the first step. A float32 masked engine runs (the lowering's CPU check)."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.formats.errors import EngineError
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    for name, kw, fix in (("gqa32", dict(dtype="float32", cuda_attention="gqa"), "rebuild it with --dtype bfloat16 for a GPU"),
                          ("half", dict(dtype="float16", cuda_attention="masked"), "run it on an NVIDIA GPU \\(--device cuda")):
        build_engine(llama_ckpt, tmp_path / name, spec_build(lowering="ort_cuda", **kw), **quiet)
        with pytest.raises(EngineError, match=f"built for ONNX Runtime's CUDA provider .*{fix}.*or rebuild it without --lowering"):
            OrtExecutor(load_engine_dir(tmp_path / name), num_threads=1)
    build_engine(llama_ckpt, tmp_path / "masked32", spec_build(lowering="ort_cuda", dtype="float32", cuda_attention="masked"), **quiet)
    OrtExecutor(load_engine_dir(tmp_path / "masked32"), num_threads=1)


def test_the_cpu_executor_refuses_an_older_gqa_engine_recorded_as_auto(llama_ckpt, tmp_path):
    """Engines built before --cuda_attention was resolved at build time record "auto" and attend with GroupQueryAttention:
    refused like "gqa" (the CUDA executor's uses_gqa counted them; the CPU executor's check did not)."""
    import json

    from specdec.formats.engine_format import CONFIG_FILE, STAMP_FILE, load_engine_dir, sha256_file
    from specdec.formats.errors import EngineError
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    engine = tmp_path / "older"
    build_engine(llama_ckpt, engine, spec_build(lowering="ort_cuda", dtype="float32", cuda_attention="gqa"), **quiet)
    cfg, stamp = (json.loads((engine / name).read_text()) for name in (CONFIG_FILE, STAMP_FILE))
    for held in (cfg, stamp):
        held["build"]["cuda_attention"] = "auto"
    (engine / STAMP_FILE).write_text(json.dumps(stamp))
    cfg["files"][STAMP_FILE] = sha256_file(engine / STAMP_FILE)
    (engine / CONFIG_FILE).write_text(json.dumps(cfg))
    older = load_engine_dir(engine)
    assert older.config.build.cuda_attention == "auto" and older.config.build.attends_with_gqa
    with pytest.raises(EngineError, match=r"GroupQuery attention\): ONNX Runtime's CUDA GroupQueryAttention takes float16"):
        OrtExecutor(older, num_threads=1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_builds_compute_in_their_dtype(dtype, llama_ckpt, tmp_path):
    half = {"bfloat16": onnx.TensorProto.BFLOAT16, "float16": onnx.TensorProto.FLOAT16}[dtype]
    build_engine(llama_ckpt, tmp_path / "gqa", spec_build(0, lowering="ort_cuda", dtype=dtype), **quiet)
    gqa = graph_of(tmp_path / "gqa")
    ops = half_precision_checks(gqa, half)
    total = {i.name: i.type.tensor_type for i in gqa.graph.input}["total_sequence_length"]
    assert total.elem_type == onnx.TensorProto.INT32 and len(total.shape.dim) == 0
    assert ops.count("GroupQueryAttention") == 2 and "Attention" not in ops and "TensorScatter" not in ops

    build_engine(llama_ckpt, tmp_path / "masked", spec_build(lowering="ort_cuda", dtype=dtype, quantization="int4_wo"), **quiet)
    masked = graph_of(tmp_path / "masked")
    ops = half_precision_checks(masked, half)
    assert ops.count("Attention") == 2 and ops.count("TensorScatter") == 4 and "GroupQueryAttention" not in ops
    assert ops.count("SkipSimplifiedLayerNormalization") == 3 and ops.count("QuickGelu") == 2  # residual + norm fused, SiLU one kernel
    assert ops.count("MatMulNBits") == 8  # qkv, o, gate|up, down per layer: weight-only int4 with half-precision activations
    assert {i.name for i in masked.graph.input} == {"input_ids", "position_ids", "logits_index",
                                                    *(f"past_{k}.{i}" for i in range(2) for k in ("key", "value"))}


@pytest.mark.parametrize("kw,message", [
    (dict(lowering="ort_cuda", dtype="bfloat16", quantization="fp8"), "ort_cuda .* no FP8 path"),
    (dict(lowering="ort_cpu", cuda_attention="masked"), "--cuda_attention masked applies to --lowering ort_cuda only"),
    (dict(lowering="ort_cuda", tree_attention=True, cuda_attention="gqa"), "GroupQueryAttention cannot mask"),
])
def test_refusals_are_one_line(llama_ckpt, tmp_path, kw, message):
    with pytest.raises(BuildConfigError, match=message) as err:
        build_engine(llama_ckpt, tmp_path / "e", spec_build(**kw), **quiet)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "e").exists()
