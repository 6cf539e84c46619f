"""EAGLE-3 builds: the target's eagle_hidden output and the module's own engine (OUT/eagle), against torch.

Parity: run with onnxruntime directly (a fresh zero cache, positions 0.., a lower-triangular tree_mask: plain
causal attention), eagle_hidden equals the module's fc over the base's decoder-layer outputs (train/base.py's
run_base), and the module engine equals train/eagle.py's Eagle3Module on the same inputs, in both lowerings.
"""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from checkpoints import dequantized_checkpoint, load_hf, make_checkpoint, write_eagle_module
from conftest import cli_build, spec_build

from specdec.builder.build import build_engine
from specdec.builder.weight_only import quantize_rtn
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.formats.errors import BuildConfigError, SpecdecError
from specdec.runtime.backends.onnxruntime.cpu import session_options
from specdec.train.base import run_base
from specdec.train.eagle import Eagle3Module
from specdec.train.export import medusa_config, save_heads
from specdec.train.medusa import MedusaHeads

AUX_IDS = [0, 2]  # two of the base's three layers: low and high
EAGLE_LAYERS = 2  # layer 0 (the [embedding, hidden] one) and a plain Llama layer


def write_module(base_ckpt, out, num_layers=EAGLE_LAYERS, aux_ids=AUX_IDS, seed=1) -> Eagle3Module:
    """An EAGLE-3 module of random weights, in ModelOpt's layout (specdec-train's export)."""
    return write_eagle_module(base_ckpt, out, num_layers, aux_ids, seed)


@pytest.fixture(scope="module")
def eagle(tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle")
    ckpt = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    module = write_module(ckpt, d / "module")
    return {"dir": d, "ckpt": ckpt, "module": module, "hf": load_hf(ckpt)}


def eagle_build(max_draft_len=4, **kw):
    return spec_build(max_draft_len, speculative_decoding_mode="eagle", **kw)


def run_onnx(engine_dir, feeds: dict[str, np.ndarray], past: dict[str, np.ndarray] | None = None, start: int = 0,
             tree_mask: bool = True) -> dict[str, np.ndarray]:
    """One call of an engine's network with onnxruntime (past/present as plain inputs/outputs): the tokens at
    positions start.., all rows' logits, a chain's (lower-triangular) tree_mask (tree_mask=False: the engine has
    none); past: the cache of an earlier call's outputs (present_* by name), else a fresh zero cache."""
    import onnxruntime as ort

    engine = load_engine_dir(engine_dir)
    # the runtime's session options: DequantizeLinear of constant weights folded into float32 at load, as the executor runs it
    sess = ort.InferenceSession(str(engine.network_path), session_options(1), providers=["CPUExecutionProvider"])
    batch, tokens = feeds["input_ids"].shape
    feeds = {**feeds, "position_ids": np.broadcast_to(np.arange(start, start + tokens, dtype=np.int64), (batch, tokens)).copy(),
             "logits_index": np.broadcast_to(np.arange(tokens, dtype=np.int64), (batch, tokens)).copy()}
    if tree_mask:
        feeds["tree_mask"] = np.broadcast_to(np.tril(np.ones((tokens, tokens), bool)), (batch, tokens, tokens)).copy()
    dims = {"batch": batch, "kv_capacity": engine.config.build.kv_capacity}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_"):
            feeds[inp.name] = past["present_" + inp.name[len("past_"):]] if past else np.zeros([dims.get(s, s) for s in inp.shape], np.float32)
    assert {i.name for i in sess.get_inputs()} == set(feeds)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


@pytest.mark.parametrize("lowering", ["portable", "ort_cpu"])
def test_eagle_engines_match_torch(eagle, lowering, tmp_path):
    out = tmp_path / "e"
    build_engine(eagle["ckpt"], out, eagle_build(lowering=lowering), say=lambda _: None, eagle_dir=eagle["dir"] / "module")
    target, module = load_engine_dir(out), load_engine_dir(eagle_module_dir(load_engine_dir(out)))
    b = target.config.build
    assert (b.speculative_decoding_mode, b.tree_attention, b.eagle_num_layers, list(b.eagle_aux_layer_ids)) == ("eagle", True, EAGLE_LAYERS, AUX_IDS)
    m = module.config.build
    assert (m.speculative_decoding_mode, m.tree_attention, m.eagle_num_layers, m.lowering, m.max_draft_len) == ("eagle_module", True, EAGLE_LAYERS,
                                                                                                                lowering, 4)
    assert (module.config.model.architecture, module.config.model.num_layers, module.config.model.vocab_size) == ("Eagle3", EAGLE_LAYERS, 96)

    ids = torch.randint(4, 96, (2, 11), generator=torch.Generator().manual_seed(3))
    got = run_onnx(out, {"input_ids": ids.numpy()})
    with torch.no_grad():
        base = run_base(eagle["hf"], ids, torch.ones_like(ids), AUX_IDS)
        fused = eagle["module"].fc(base.aux_hidden)  # [2, 11, hidden]
        want_logits = eagle["hf"](ids).logits
    assert got["eagle_hidden"].shape == (2, 11, 64)
    np.testing.assert_allclose(got["eagle_hidden"], fused.numpy(), atol=1e-4)
    np.testing.assert_allclose(got["logits"], want_logits.numpy(), atol=2e-4)

    # the module: position p pairs the features at p with the embedding of token p+1
    got = run_onnx(eagle_module_dir(target), {"input_ids": ids[:, 1:].numpy(), "hidden_states": fused[:, :-1].numpy()})
    pre_norm = []
    hook = eagle["module"].norm.register_forward_hook(lambda _m, inp, _out: pre_norm.append(inp[0]))
    try:
        with torch.no_grad():
            want = eagle["module"](base.aux_hidden[:, :-1], eagle["hf"].model.embed_tokens(ids[:, 1:]))
    finally:
        hook.remove()
    assert got["logits"].shape == (2, 10, 96) and got["hidden_out"].shape == (2, 10, 64)
    np.testing.assert_allclose(got["logits"], want.numpy(), atol=2e-4)
    np.testing.assert_allclose(got["hidden_out"], pre_norm[0].numpy(), atol=1e-4)

    # drafting a token at a time on the module's cache: the same rows as the whole sequence at once
    first = run_onnx(eagle_module_dir(target), {"input_ids": ids[:, 1:9].numpy(), "hidden_states": fused[:, :8].numpy()})
    step = run_onnx(eagle_module_dir(target), {"input_ids": ids[:, 9:10].numpy(), "hidden_states": fused[:, 8:9].numpy()}, past=first, start=8)
    np.testing.assert_allclose(step["logits"][:, 0], want[:, 8].numpy(), atol=2e-4)
    np.testing.assert_allclose(step["hidden_out"][:, 0], pre_norm[0][:, 8].numpy(), atol=1e-4)


def _dequantized_copy(module: Eagle3Module, bits: int, group: int, head: bool, sym: bool = True) -> Eagle3Module:
    """A copy of ``module`` whose decoder linears (and LM head with ``head``) hold their round-to-nearest codes
    dequantized: what a module built with --quantize_draft_heads computes. q, k and v (gate and up) are fused along
    the output axis in the engine; groups run along the input axis, so each projection alone gets the same codes."""
    import copy

    twin = copy.deepcopy(module)
    linears = [m for layer in twin.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)] + ([twin.lm_head] if head else [])
    with torch.no_grad():
        for m in linears:
            m.weight.copy_(torch.from_numpy(quantize_rtn(m.weight.numpy().T, bits, group, sym).dequantized().T.copy()))
    return twin


@pytest.mark.parametrize("bits, head, sym", [(4, False, True), (8, True, True), (4, False, False)])
def test_a_quantized_module_computes_its_dequantized_weights(eagle, bits, head, sym, tmp_path):
    """--quantize_draft_heads on the portable lowering (DequantizeLinear folded into float32 at load): the module engine
    equals the torch module with its linears' codes dequantized, up to float32 rounding, and the float module it came
    from is farther away than that: the codes, scales, zero points and groups land where the graph reads them."""
    out = tmp_path / "e"
    build = eagle_build(lowering="portable", quantization=f"int{bits}_wo", group_size=32, symmetric=sym, quantize_draft_heads=True,
                        quantize_lm_head=head)
    build_engine(eagle["ckpt"], out, build, say=lambda _: None, eagle_dir=eagle["dir"] / "module")
    module_build = load_engine_dir(out / "eagle").config.build
    assert (module_build.quantization, module_build.group_size, module_build.symmetric) == (f"int{bits}_wo", 32, sym)
    assert ("lm_head" in module_build.weight_only["layers"]) == head
    ids = torch.randint(4, 96, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        aux = run_base(eagle["hf"], ids, torch.ones_like(ids), AUX_IDS).aux_hidden
        fused = eagle["module"].fc(aux)  # [2, 11, hidden]: the fc stays float, in the target
        embeds = eagle["hf"].model.embed_tokens(ids[:, 1:])
        want = _dequantized_copy(eagle["module"], bits, 32, head, sym)(aux[:, :-1], embeds)
        original = eagle["module"](aux[:, :-1], embeds)
    got = run_onnx(out / "eagle", {"input_ids": ids[:, 1:].numpy(), "hidden_states": fused[:, :-1].numpy()})["logits"]
    np.testing.assert_allclose(got, want.numpy(), atol=2e-4)
    assert np.abs(got - original.numpy()).max() > 10 * np.abs(got - want.numpy()).max()
    # the fc, in the target: its features are the dequantized fc over the aux layers of the dequantized target
    target = run_onnx(out, {"input_ids": ids.numpy()})
    deq = load_hf(dequantized_checkpoint(eagle["ckpt"], tmp_path / "deq", bits, 32, sym))
    with torch.no_grad():
        aux_q = run_base(deq, ids, torch.ones_like(ids), AUX_IDS).aux_hidden.numpy()  # [2, 11, num_aux * hidden]
    fc_float = eagle["module"].fc.weight.detach().numpy().T  # [num_aux * hidden, hidden]
    fc_t = quantize_rtn(fc_float, bits, 32, sym).dequantized()
    np.testing.assert_allclose(target["eagle_hidden"], aux_q @ fc_t, atol=1e-4)
    assert np.abs(target["eagle_hidden"] - aux_q @ fc_float).max() > 10 * np.abs(target["eagle_hidden"] - aux_q @ fc_t).max()
    assert "eagle/fc" in load_engine_dir(out).config.build.weight_only["layers"]


def test_an_awq_targets_module_is_rounded_to_nearest_in_its_scheme():
    """AWQ searched the target's layers only: its module takes int4_wo in the same groups and symmetry, on the same
    kernels; a float module takes none of it."""
    from types import SimpleNamespace

    from specdec.builder.eagle import module_build_config

    heads = SimpleNamespace(mode="eagle", num_layers=1)
    target = eagle_build(quantization="int4_awq", group_size=64, symmetric=False, cpu_kernels="specdec", quantize_draft_heads=True)
    m = module_build_config(target, heads)
    assert (m.quantization, m.group_size, m.symmetric, m.cpu_kernels, m.quantize_draft_heads) == ("int4_wo", 64, False, "specdec", False)
    m = module_build_config(replace(target, quantize_draft_heads=False), heads)
    assert (m.quantization, m.group_size, m.cpu_kernels) == ("none", None, "ort")


@pytest.mark.parametrize("head", [False, True])
def test_quantized_medusa_heads_compute_their_dequantized_weights(eagle, head, tmp_path):
    """--quantize_draft_heads on a Medusa target (portable lowering: exact dequantized weights): medusa_logits equal the
    torch heads with their ResBlocks' codes dequantized (their LM heads' too with --quantize_lm_head)."""
    medusa = _random_medusa(eagle["ckpt"], tmp_path / "medusa", seed=5)
    out = tmp_path / "m"
    build = spec_build(4, speculative_decoding_mode="medusa", lowering="portable", quantization="int4_wo", group_size=32, quantize_draft_heads=True,
                       quantize_lm_head=head)
    build_engine(eagle["ckpt"], out, build, say=lambda _: None, medusa_dir=tmp_path / "medusa")
    layers = load_engine_dir(out).config.build.weight_only["layers"]
    assert "medusa/resblock" in layers and ("medusa/lm_head" in layers) == head
    ids = torch.randint(4, 96, (2, 9), generator=torch.Generator().manual_seed(4))
    got = run_onnx(out, {"input_ids": ids.numpy()})["medusa_logits"]  # [2, 9, heads, vocab]
    with torch.no_grad():  # the heads read the int4 target's rows after its final norm: the dequantized target's
        last = load_hf(dequantized_checkpoint(eagle["ckpt"], tmp_path / "deq", 4, 32)).model(ids).last_hidden_state  # [2, 9, hidden]
        original = medusa(last).permute(1, 2, 0, 3).numpy()  # [heads, B, S, vocab] -> [B, S, heads, vocab]
        for block in medusa.medusa_heads:
            for m in block.modules():
                if isinstance(m, torch.nn.Linear) and (head or m is not block[-1]):
                    m.weight.copy_(torch.from_numpy(quantize_rtn(m.weight.numpy().T, 4, 32).dequantized().T.copy()))
        want = medusa(last).permute(1, 2, 0, 3).numpy()
    np.testing.assert_allclose(got, want, atol=2e-4)
    assert np.abs(got - original).max() > 10 * np.abs(got - want).max()


def _random_medusa(ckpt, out, seed: int) -> MedusaHeads:
    """Medusa heads of random weights (ResBlocks start at zero in training: nothing to round), saved to ``out``."""
    cfg = json.loads((ckpt / "config.json").read_text())
    heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], 2, 1)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    save_heads(heads, medusa_config(cfg, 2, 1, {"test": True}), out)
    return heads


def _medusa_dir(ckpt, out):
    cfg = json.loads((ckpt / "config.json").read_text())
    heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], 2, 1, load_hf(ckpt).lm_head.weight.detach())
    save_heads(heads, medusa_config(cfg, 2, 1, {"test": True}), out)
    return out


@pytest.mark.parametrize(
    "case, match",
    [
        ("no_mode", "--eagle_dir needs --speculative_decoding_mode eagle"),
        ("no_dir", "needs --eagle_dir"),
        ("medusa_dir", "holds Medusa heads"),
        ("hidden", "hidden_size"),
        ("aux_ids", "name layers the 3-layer base"),
        ("tensorrt", "onnxruntime backend only"),
        ("ort_cuda_gqa", "GroupQueryAttention cannot mask"),
        ("no_drafts", "needs max_draft_len >= 1"),
        ("float_quantized_module", "--quantize_draft_heads quantizes a target's draft heads"),
    ],
)
def test_bad_eagle_builds_say_why(eagle, tmp_path, case, match):
    d, ckpt = eagle["dir"], eagle["ckpt"]
    module_dir, build = d / "module", eagle_build()
    if case == "no_mode":
        build = spec_build(4)
    elif case == "no_dir":
        module_dir = None
    elif case == "medusa_dir":
        module_dir = _medusa_dir(ckpt, tmp_path / "medusa")
    elif case == "hidden":
        other = make_checkpoint(tmp_path / "other", num_hidden_layers=3, hidden_size=32, intermediate_size=64)
        module_dir = tmp_path / "other_module"
        write_module(other, module_dir)
    elif case == "aux_ids":
        module_dir = tmp_path / "deep_module"
        write_module(ckpt, module_dir, aux_ids=[0, 5])
    elif case == "tensorrt":
        build = eagle_build(backend="tensorrt")
    elif case == "ort_cuda_gqa":  # ort_cuda builds EAGLE targets with its masked attention; GQA has no tree mask
        build = eagle_build(lowering="ort_cuda", dtype="float16", cuda_attention="gqa")
    elif case == "no_drafts":
        build = eagle_build(0)
    elif case == "float_quantized_module":  # nothing to quantize the module as
        build = eagle_build(quantize_draft_heads=True)
    with pytest.raises(SpecdecError, match=match) as info:
        build_engine(ckpt, tmp_path / "out", build, say=lambda _: None, eagle_dir=module_dir)
    assert isinstance(info.value, BuildConfigError)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_cli_builds_an_eagle_engine(eagle, tmp_path):
    out = tmp_path / "engine"
    done = cli_build(eagle["ckpt"], out, "--speculative_decoding_mode", "eagle", "--eagle_dir", eagle["dir"] / "module", "--max_batch_size", 2)
    assert done.exit_code == 0, done.output
    assert f"EAGLE-3 module engine: {out / 'eagle'}" in done.output
    target = load_engine_dir(out)
    module = load_engine_dir(out / "eagle")
    assert (target.config.build.speculative_decoding_mode, target.config.build.max_draft_len) == ("eagle", 8)  # the tree's default node budget
    assert (module.config.build.speculative_decoding_mode, module.config.build.max_draft_len) == ("eagle_module", 8)
    assert "eagle/model.onnx" in target.config.files  # the target's hashes cover the module too
    bad = cli_build(eagle["ckpt"], tmp_path / "bad", "--eagle_dir", eagle["dir"] / "module")
    assert bad.exit_code != 0 and "--eagle_dir needs --speculative_decoding_mode eagle" in bad.output
    assert not (tmp_path / "bad").exists()


def test_cli_quantizes_the_module_when_asked_and_only_where_it_can(eagle, tmp_path):
    flags = ("--speculative_decoding_mode", "eagle", "--eagle_dir", eagle["dir"] / "module", "--use_weight_only", "--weight_only_precision", "int4",
             "--group_size", 32)
    done = cli_build(eagle["ckpt"], tmp_path / "int4", *flags, "--quantize_draft_heads")
    assert done.exit_code == 0, done.output
    assert "weight-only as the target (its layers and the fc)" in done.output
    assert load_engine_dir(tmp_path / "int4").config.build.quantize_draft_heads
    assert load_engine_dir(tmp_path / "int4" / "eagle").config.build.weight_only["bits"] == 4
    plain = cli_build(eagle["ckpt"], tmp_path / "plain", *flags)
    assert plain.exit_code == 0 and "weight-only as the target (" not in plain.output
    assert "the draft heads are in float32; --quantize_draft_heads builds them as the target's layers" in plain.output
    assert load_engine_dir(tmp_path / "plain" / "eagle").config.build.weight_only is None
    float_target = (*flags[:4], "--quantize_draft_heads")
    no_module = ("--speculative_decoding_mode", "draft_tokens_external", "--use_weight_only", "--quantize_draft_heads")
    for bad_flags, what in ((float_target, "eagle, none"), (no_module, "draft_tokens_external, int8_wo")):
        bad = cli_build(eagle["ckpt"], tmp_path / "bad", *bad_flags)
        assert bad.exit_code != 0 and "--quantize_draft_heads quantizes a target's draft heads" in bad.output, bad.output
        assert f"(this build: {what})" in bad.output and "Traceback" not in bad.output
        assert not (tmp_path / "bad").exists()
