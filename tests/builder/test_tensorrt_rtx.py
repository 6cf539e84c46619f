"""The tensorrt_rtx backend: real TensorRT-for-RTX engines, built on this GPU-less host.

TensorRT for RTX builds for a named compute capability without a GPU, so these
tests run the real builder (``tensorrt_rtx`` from the ``tensorrt-rtx-build``
extra, in ``dev`` on Linux x86-64) and check what it wrote: engines, EPContext
models and the engine directory's contract. What they cannot check is an engine
running: that needs an RTX GPU (docs/tensorrt.md#tensorrt-for-rtx).
"""

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest
from checkpoints import make_checkpoint
from conftest import spec_build

from specdec.builder.backends.trt_onnx import profile_shapes, profiles_record, static_kv_proto
from specdec.builder.build import build_engine
from specdec.formats.engine_format import load_engine_dir
from specdec.formats.errors import BuildConfigError, EngineError

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
needs_rtx = pytest.mark.skipif(not HAS_RTX,
                               reason="needs TensorRT for RTX: pip install -e '.[build,tensorrt-rtx-build]' (Linux x86-64, no GPU needed)")
ROOT = Path(__file__).resolve().parents[2]
QUIET = dict(say=lambda _: None)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("rtx") / "ckpt", "LlamaForCausalLM", tie_word_embeddings=True)


def ep_context_schema():
    """ONNX Runtime's own definition of the com.microsoft EPContext op (the installed onnxruntime)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    return next(s for s in C.get_all_operator_schema() if s.name == "EPContext" and s.domain == "com.microsoft")


def check_engine_dir(out: Path, targets: tuple[str, ...]) -> dict:
    """The engine directory contract of a tensorrt_rtx build; returns config.json's extra.tensorrt_rtx."""
    engine = load_engine_dir(out)  # every file's sha256 checked
    cfg = engine.config
    meta = cfg.extra["tensorrt_rtx"]
    assert cfg.build.backend == "tensorrt_rtx" and cfg.build.lowering == "portable"
    assert list(meta["targets"]) == list(targets)
    assert cfg.network_file == meta["targets"][targets[0]]["network_file"]
    assert cfg.versions["tensorrt_rtx"] == meta["tensorrt_rtx_version"]
    assert meta["profiles"] == profiles_record(profile_shapes(cfg.build, cfg.model))
    expected_files = {"model.onnx", "model.onnx.data", *(f for t in meta["targets"].values() for f in t.values())}
    assert expected_files <= set(cfg.files)

    schema = ep_context_schema()
    abi = static_kv_proto(out / meta["onnx_file"], cfg.build.kv_capacity).graph
    for sm, files in meta["targets"].items():
        assert (out / files["engine_file"]).stat().st_size > 1 << 20  # a real engine, megabytes even for a tiny model
        ctx = onnx.load(str(out / files["network_file"]))
        onnx.checker.check_model(ctx)
        (node,) = ctx.graph.node
        assert (node.domain, node.op_type) == ("com.microsoft", "EPContext")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for a in node.attribute:  # every attribute is one ONNX Runtime defines, with its type
            assert a.name in schema.attributes, a.name
            assert onnx.AttributeProto.AttributeType.Name(a.type) == str(schema.attributes[a.name].type).split(".")[-1], a.name
        assert attrs["embed_mode"] == 0 and attrs["main_context"] == 1
        assert attrs["ep_cache_context"].decode() == files["engine_file"]  # relative, beside the model, as the provider requires
        assert attrs["source"].decode() == "NvTensorRTRTXExecutionProvider" and attrs["hardware_architecture"].decode() == sm
        # the engine ABI around the node: the portable network's inputs and outputs, the cache axis static
        assert ctx.graph.input == abi.input and ctx.graph.output == abi.output
        assert list(node.input) == [i.name for i in abi.input] and list(node.output) == [o.name for o in abi.output]
    return meta


@needs_rtx
def test_target_and_draft_build_for_several_sms(ckpt, tmp_path):
    target = build_engine(ckpt, tmp_path / "target", spec_build(4, backend="tensorrt_rtx"), target_sm="sm89,sm120", **QUIET)
    meta = check_engine_dir(target.output_dir, ("sm89", "sm120"))
    assert meta["decomposable_attention_layers"] == 2  # one per layer: float32 attention has no fused kernel
    # the generation profile spans exactly the verify width of max_draft_len 4
    assert meta["profiles"][1]["input_ids"] == [[1, 1], [4, 5], [4, 5]]
    engines = {sm: (target.output_dir / t["engine_file"]).read_bytes() for sm, t in meta["targets"].items()}
    assert engines["sm89"] != engines["sm120"]

    draft = build_engine(ckpt, tmp_path / "draft", spec_build(0, backend="tensorrt_rtx"), target_sm="sm86", **QUIET)
    meta = check_engine_dir(draft.output_dir, ("sm86",))
    assert meta["profiles"][1]["input_ids"] == [[1, 1], [4, 1], [4, 2]]  # the draft's catch-up step feeds 2 tokens


# The report of which graph ops TensorRT-RTX's parser and builder take (docs/tensorrt.md#tensorrt-for-rtx):
# DequantizeLinear of float8 (fp8), blocked int4 and per-channel / grouped int8 weights, QuantizeLinear of
# dynamic FP8 activations; the float graph's TensorScatter, Attention, RotaryEmbedding, RMSNormalization.
@needs_rtx
@pytest.mark.parametrize("kw", [dict(quantization="fp8"), dict(quantization="fp8", fp8_activations="dynamic"),
                                dict(quantization="int4_wo"), dict(quantization="int8_wo", group_size=64), dict(dtype="bfloat16")],
                         ids=["fp8", "fp8-dynamic", "int4", "int8-g64", "bf16"])
def test_quantized_graphs_build(ckpt, tmp_path, kw):
    result = build_engine(ckpt, tmp_path / "e", spec_build(2, backend="tensorrt_rtx", max_batch_size=2, **kw), target_sm="sm89", **QUIET)
    check_engine_dir(result.output_dir, ("sm89",))


@needs_rtx
@pytest.mark.parametrize("kw, target_sm, says", [
    (dict(quantization="fp8"), "sm89,sm86", "--qformat fp8 cannot target sm86: Ampere GPUs have no FP8"),
    (dict(quantization="int4_wo", symmetric=False), "sm89", "takes symmetric weight-only weights"),
    ({}, None, "--target_sm is missing"),
    ({}, "sm90", "--target_sm sm90: is not one of sm86, sm89, sm120, sm121"),
    (dict(lowering="ort_cpu"), "sm89", "the tensorrt_rtx backend parses the portable lowering only"),
])
def test_refused_before_any_work(ckpt, tmp_path, kw, target_sm, says):
    with pytest.raises(BuildConfigError, match=says.replace("(", r"\(")):
        build_engine(ckpt, tmp_path / "e", spec_build(4, backend="tensorrt_rtx", **kw), target_sm=target_sm, **QUIET)
    assert not any(tmp_path.iterdir())  # nothing written, not even a temporary directory


def test_target_sm_belongs_to_tensorrt_rtx(ckpt, tmp_path):
    with pytest.raises(BuildConfigError, match="--target_sm only applies to --backend tensorrt_rtx"):
        build_engine(ckpt, tmp_path / "e", spec_build(4, backend="onnxruntime"), target_sm="sm89", **QUIET)


def test_missing_tensorrt_rtx_names_the_extra(ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)  # import fails, as on a host without the extra
    with pytest.raises(BuildConfigError, match=r"--backend tensorrt_rtx cannot build on this host: .*tensorrt-rtx-build"):
        build_engine(ckpt, tmp_path / "e", spec_build(4, backend="tensorrt_rtx"), target_sm="sm89", **QUIET)


@needs_rtx
def test_demo_pair_builds_with_the_cli(tmp_path):
    """What CI builds every run: the demo pair's target and draft for an RTX 40xx, through specdec-build as a user types it."""
    from click.testing import CliRunner

    from specdec.cli.build import main

    demo = ROOT / "examples" / "demo-pair"
    for role, flags in (("target", ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "4"]), ("draft", [])):
        args = ["--checkpoint_dir", str(demo / role), "--output_dir", str(tmp_path / role), "--backend", "tensorrt_rtx", "--target_sm", "sm89",
                "--max_seq_len", "256", "--max_batch_size", "4", *flags]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "TensorRT for RTX" in result.output and "sm89 (model.sm89.ctx.onnx)" in result.output
        check_engine_dir(tmp_path / role, ("sm89",))
        assert load_engine_dir(tmp_path / role).tokenizer_path is not None  # the checkpoint's tokenizer travels with the engines
    # a tampered engine is refused at load, as every engine file is
    engine = tmp_path / "target" / "model.sm89.engine"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="model.sm89.engine"):
        load_engine_dir(tmp_path / "target")
