"""Draft heads quantized as their int4 target (specdec-build --quantize_draft_heads), on the demo pair: Medusa heads, and
EAGLE-3 and P-EAGLE modules (with the fc that feeds them).

Heads only draft, so the output must stay the target's own whatever their weights; what quantizing may cost is
acceptance. The demo target's trained heads draft code well, so heads whose int4 weights were packed wrong (codes,
scales or groups misplaced) would show as acceptance falling towards none.
"""

from pathlib import Path

import onnx
import pytest
from conftest import spec_build
from engine_runs import generate

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.proposers.eagle import EagleProposer
from specdec.runtime.proposers.medusa import MedusaProposer
from specdec.runtime.proposers.peagle import PEagleProposer

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
TEXTS = ["def fibonacci(n):\n    ", "import os\n\ndef list_files(path):\n    result = []\n", "class Stack:\n    def __init__(self):\n"]
TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
PROPOSERS = {"medusa": MedusaProposer, "eagle": EagleProposer, "peagle": PEagleProposer}
MODULES = ("eagle", "peagle")  # the modes whose heads are an engine of their own (the target's eagle/ folder)
# the heads' precision: float32 beside the int4 target (the default), int4 on specdec's Q4Gemm as the target,
# int4 on ONNX Runtime's MatMulNBits with their LM heads int4 too, and the torch backend's int4 heads on the CPU
VARIANTS = {
    "float": {"cpu_kernels": "specdec"},
    "q4gemm": {"cpu_kernels": "specdec", "quantize_draft_heads": True},
    "nbits_head": {"quantize_draft_heads": True, "quantize_lm_head": True},
    "torch": {"backend": "torch", "quantize_draft_heads": True},
}


def open_(path: Path, backend: str):
    engine = load_engine_dir(path)
    if backend == "torch":
        from specdec.runtime.backends.torch.executor import TorchExecutor

        return TorchExecutor(engine, "cpu")
    return OrtExecutor(engine, num_threads=1)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(mode, variant) -> (path, target executor, module executor or None); "prompts": the demo texts' ids."""
    d = tmp_path_factory.mktemp("quantized_module")
    out = {"prompts": [Tokenizer(DEMO / "target").encode(t) for t in TEXTS]}
    for mode in PROPOSERS:
        for variant, kw in VARIANTS.items():
            path = d / f"{mode}-{variant}"
            build = spec_build(8, speculative_decoding_mode=mode, quantization="int4_wo", dtype="float32", max_input_len=64, max_seq_len=128, **kw)
            build_engine(DEMO / "target", path, build, say=lambda _: None, **{f"{mode}_dir": DEMO / "heads" / mode})
            target = open_(path, kw.get("backend", "onnxruntime"))
            module = open_(eagle_module_dir(target.engine), kw.get("backend", "onnxruntime")) if mode in MODULES else None
            out[mode, variant] = (path, target, module)
    return out


@pytest.mark.parametrize("mode", MODULES)
def test_the_module_is_built_and_recorded_in_the_targets_precision(engines, mode):
    float_path = engines[mode, "float"][0]
    assert load_engine_dir(float_path / "eagle").config.build.weight_only is None  # the default: the module stays in --dtype
    assert "eagle/fc" not in load_engine_dir(float_path).config.build.weight_only["layers"]
    for variant in ("q4gemm", "nbits_head", "torch"):
        path = engines[mode, variant][0]
        target, module = load_engine_dir(path).config.build, load_engine_dir(path / "eagle").config.build
        assert target.quantize_draft_heads and not module.quantize_draft_heads
        assert "eagle/fc" in target.weight_only["layers"]  # the fc that feeds the module, in the target
        assert (module.quantization, module.cpu_kernels, module.quantize_lm_head) == ("int4_wo", target.cpu_kernels, target.quantize_lm_head)
        wo = module.weight_only
        assert (wo["bits"], wo["group_size"], wo["source"]) == (4, 128, "rtn")
        layers = ["attn/o_proj", "attn/qkv_proj", "mlp/down_proj", "mlp/gate_up_proj"]
        assert wo["layers"] == (sorted([*layers, "lm_head"]) if variant == "nbits_head" else layers)
        if variant == "torch":
            continue
        graph = onnx.load(str(path / "eagle" / "model.onnx"), load_external_data=False).graph
        ops = [n.op_type for n in graph.node if n.op_type in ("Q4Gemm", "MatMulNBits", "MatMul")]
        if variant == "q4gemm":  # every decoder linear on specdec's kernel, the LM head in float
            assert wo["op"].startswith("Q4Gemm (ai.specdec.cpu) for 4 of 4 layers") and wo["kernel_layout"] >= 1
            assert ops.count("Q4Gemm") == 4 and ops.count("MatMulNBits") == 0
        else:
            assert ops.count("Q4Gemm") == 0 and ops.count("MatMulNBits") == 5
        module_bytes = (path / "eagle" / "model.onnx.data").stat().st_size
        assert module_bytes < 0.75 * (float_path / "eagle" / "model.onnx.data").stat().st_size  # the embedding stays float32


def test_medusa_heads_are_built_and_recorded_in_the_targets_precision(engines):
    assert not any(k.startswith("medusa/") for k in load_engine_dir(engines["medusa", "float"][0]).config.build.weight_only["layers"])
    for variant in ("q4gemm", "nbits_head", "torch"):
        layers = load_engine_dir(engines["medusa", variant][0]).config.build.weight_only["layers"]
        assert "medusa/resblock" in layers and ("medusa/lm_head" in layers) == (variant == "nbits_head")


@pytest.mark.parametrize("mode", list(PROPOSERS))
@pytest.mark.parametrize("draft_len, choices", [(3, None), (6, TREE)])  # (the demo Medusa has 3 heads)
def test_greedy_output_is_the_targets_and_acceptance_holds(engines, mode, draft_len, choices):
    """Alone and in a batch of 3, chain and tree: the int4 target's own output; the quantized heads' tokens accepted per
    drafting round at least 75% of the float heads' beside the same target (over these 96 tokens rounding moves them by
    up to 15% either way; heads packed wrong accept next to nothing)."""
    prompts = engines["prompts"]
    accepted = {}
    for variant in VARIANTS:
        _, target, module = engines[mode, variant]

        def proposer(target=target, module=module):
            return MedusaProposer(target, choices) if module is None else PROPOSERS[mode](target, module, choices)

        want, _ = generate(target, [], "none", 0, prompts, max_output_len=32)
        alone, _ = generate(target, [proposer()], mode, draft_len, prompts[:1], max_output_len=32)
        got, stats = generate(target, [proposer()], mode, draft_len, prompts, max_output_len=32)
        assert got == want and alone == want[:1], variant
        accepted[variant] = stats.accepted / stats.drafting_rounds
    assert accepted["float"] > 0.8, accepted  # the trained heads draft this code: the comparison means something
    for variant in ("q4gemm", "nbits_head", "torch"):
        assert accepted[variant] >= 0.75 * accepted["float"], accepted
