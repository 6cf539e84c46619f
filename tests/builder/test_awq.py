"""AWQ input scales: the search on synthetic layers, the calibration taps on a real network, and the CLI."""

import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import cli_build as conftest_cli_build

from specdec.builder.awq import (
    RTN,
    AwqLayer,
    InputStats,
    awq_input_scales,
    awq_search,
    candidate_scale,
    clip_weight,
    output_error,
    search_clip,
    search_network_scales,
    search_scale,
    weight_mean,
)
from specdec.builder.weight_only import quantize_rtn

N_IN, N_OUT, ROWS = 256, 128, 2048
OUTLIERS = [3, 77, 150, 200]


def outlier_layer(seed: int = 0, outlier_gain: float = 30.0):
    """X [rows, in] with a few input channels 30x larger than the rest, W [in, out]: the case AWQ is for."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    x[:, OUTLIERS] *= outlier_gain
    w = (rng.standard_normal((N_IN, N_OUT)) * 0.05).astype(np.float32)
    stats = InputStats.empty(N_IN)
    stats.add(x[None])  # [1, rows, in], as a network output arrives
    return x, w, stats


def direct_mse(x, w, s, bits=4, group_size=128, symmetric=True) -> float:
    """What the engine computes, (x / s) @ deq(Q(s W)), against the float layer."""
    deq = quantize_rtn(s[:, None] * w, bits, group_size, symmetric).dequantized()
    return float(np.mean((x.astype(np.float64) @ w - (x / s) @ deq) ** 2))


@pytest.mark.parametrize("symmetric", [True, False])
def test_searched_scales_cut_output_error_on_outlier_channels(symmetric):
    x, w, stats = outlier_layer()
    r = search_scale(w, stats, 4, 128, symmetric)
    rtn = direct_mse(x, w, np.ones(N_IN, np.float32), symmetric=symmetric)
    awq = direct_mse(x, w, r.scale, symmetric=symmetric)
    assert awq < 0.5 * rtn  # measured ~0.26x (symmetric): a real margin, not noise
    assert 0 < r.alpha < 1
    x_only = search_scale(w, stats, 4, 128, symmetric, duo=False)  # the paper's activation-only grid
    assert x_only.choice[1] is False and direct_mse(x, w, x_only.scale, symmetric=symmetric) < 0.5 * rtn
    assert r.loss <= x_only.loss  # duo candidates only add to the grid
    assert r.scale.dtype == np.float32 and r.scale.shape == (N_IN,)
    assert np.all(np.isfinite(r.scale)) and np.all(r.scale > 0)
    # the salient channels are the ones scaled up
    assert r.scale[OUTLIERS].min() > np.delete(r.scale, OUTLIERS).max()


def test_gram_loss_equals_the_direct_output_error():
    x, w, stats = outlier_layer(seed=1)
    s = candidate_scale(stats.mean_abs, 0.4)
    np.testing.assert_allclose(output_error(w, s, stats.gram, 4, 128, True) / (ROWS * N_OUT), direct_mse(x, w, s), rtol=1e-5)


def test_alpha_zero_is_round_to_nearest():
    x, w, stats = outlier_layer(seed=2)
    s = candidate_scale(stats.mean_abs, 0.0)
    np.testing.assert_array_equal(s, np.ones(N_IN, np.float32))
    np.testing.assert_array_equal(quantize_rtn(s[:, None] * w, 4, 128).dequantized(), quantize_rtn(w, 4, 128).dequantized())
    r = search_scale(w, stats, 4, 128, True)
    assert r.loss <= r.losses[RTN]  # the search can only keep or beat RTN on its own loss
    # with no outliers there is little to buy, but never a loss
    flat = InputStats.empty(N_IN)
    flat.add(np.random.default_rng(3).standard_normal((ROWS, N_IN)))
    r = search_scale(w, flat, 4, 128, True)
    assert r.loss <= r.losses[RTN]


def test_weight_mean_is_relative_to_each_group_max():
    w = np.array([[1.0, -2.0], [0.5, 4.0], [3.0, 1.0], [-6.0, 2.0]], np.float32)  # [in 4, out 2], groups of 2 rows
    np.testing.assert_allclose(weight_mean(w, 2), [(1 + 0.5) / 2, (0.5 + 1) / 2, (0.5 + 0.5) / 2, (1 + 1) / 2])


def test_dead_channels_get_finite_positive_scales():
    x, w, _ = outlier_layer(seed=4)
    x[:, 10:20] = 0.0  # channels that never fire
    stats = InputStats.empty(N_IN)
    stats.add(x)
    w[:, :] = np.where(np.arange(N_IN)[:, None] == 5, 0.0, w)  # and a weight row of zeros
    for a in (0.0, 0.5, 1.0):
        for w_mean in (None, weight_mean(w, 128)):
            s = candidate_scale(stats.mean_abs, a, w_mean)
            assert np.all(np.isfinite(s)) and np.all(s > 0)
    silent = InputStats.empty(N_IN)
    silent.add(np.zeros((4, N_IN)))  # a layer whose input is all zero: every candidate ties; RTN is kept
    r = search_scale(w, silent, 4, 128, True)
    assert r.choice == RTN and np.all(r.scale == 1)


def test_clip_weight_bounds_each_group_and_column():
    w = np.array([[1.0, -2.0], [-4.0, 1.0], [3.0, 0.5], [2.0, 1.0]], np.float32)  # [in 4, out 2], groups of 2 rows
    ratio = np.array([[0.5, 1.0], [1.0, 0.5]], np.float32)  # [groups, out]
    np.testing.assert_array_equal(clip_weight(w, ratio, 2, True), [[1.0, -2.0], [-2.0, 1.0], [3.0, 0.5], [2.0, 0.5]])
    # asymmetric: ratio * [min(w, 0), max(w, 0)]: column 1 of group 1 has no negative values, so 0 stays the floor
    np.testing.assert_array_equal(clip_weight(w, ratio, 2, False), [[0.5, -2.0], [-2.0, 1.0], [3.0, 0.5], [2.0, 0.5]])
    np.testing.assert_array_equal(clip_weight(w, np.ones((2, 2), np.float32), 2, True), w)


@pytest.mark.parametrize("symmetric", [True, False])
def test_clipping_cuts_output_error_on_heavy_tailed_weights(symmetric):
    """Student-t weights: a few large values stretch their group's grid; shrinking its reach pays."""
    x, _, stats = outlier_layer(seed=5)
    w = (np.random.default_rng(5).standard_t(3, (N_IN, N_OUT)) * 0.05).astype(np.float32)
    found = search_scale(w, stats, 4, 128, symmetric)
    inv = 1.0 / found.scale.astype(np.float64)
    ratio = search_clip(found.scale[:, None] * w, stats.gram * np.outer(inv, inv), 4, 128, symmetric)
    assert ratio.shape == (N_IN // 128, N_OUT) and ratio.dtype == np.float32
    assert 0.5 < ratio.min() and ratio.max() == 1.0 and (ratio < 1).mean() > 0.2
    scaled, clipped = AwqLayer(found.scale, None), AwqLayer(found.scale, ratio)
    mse = {k: float(np.mean((x @ w - (x / a.scale) @ a.quantize(w, 4, 128, symmetric).dequantized()) ** 2))
           for k, a in (("s", scaled), ("c", clipped))}
    assert mse["c"] < 0.95 * mse["s"], mse  # measured 0.79x (symmetric), 0.83x (asymmetric), on top of what the scales bought
    q = clipped.quantize(w, 4, 128, symmetric)
    assert q.source == "awq"
    np.testing.assert_array_equal(scaled.quantize(w, 4, 128, symmetric).dequantized(),
                                  quantize_rtn(found.scale[:, None] * w, 4, 128, symmetric).dequantized())


def test_clipping_keeps_a_group_it_cannot_improve():
    """A group whose values sit on the grid already (codes exactly representable) has nothing to gain: ratio 1."""
    rng = np.random.default_rng(6)
    w = (rng.integers(-7, 8, (N_IN, N_OUT)) * 0.01).astype(np.float32)
    w[0] = 0.07  # every group's max |w| is on the grid: RTN is exact
    _, _, stats = outlier_layer(seed=6)
    assert np.all(search_clip(w, stats.gram, 4, 128, True) == 1.0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("awq") / "base", "LlamaForCausalLM", hidden_size=64, intermediate_size=128, vocab_size=96)


def float_network_with_taps(ckpt):
    from dataclasses import replace

    from conftest import spec_build

    from specdec.builder.architectures import model_config_from_hf
    from specdec.builder.build import resolve_lowering
    from specdec.builder.checkpoint import load_checkpoint
    from specdec.builder.network import build_network
    from specdec.runtime.kv_cache import KVCache

    c = load_checkpoint(ckpt)
    model = model_config_from_hf(c.hf_config, max_seq_len=128)
    build = resolve_lowering(replace(spec_build(), backend="onnxruntime", dtype="float32", quantization="none", max_seq_len=128, max_input_len=64))
    taps: dict[str, str] = {}
    net = build_network(c, model, build, linear_inputs=taps)
    cache_shape = KVCache(1, 1, model.num_kv_heads, build.kv_capacity, model.head_dim, build.max_seq_len, build.kv_layout).keys[0].shape
    return c, model, net, taps, cache_shape


def test_network_search_reads_every_layer_input(ckpt):
    """Each layer's statistics come from its own input: layer 0's qkv input is input_layernorm(embedding)."""
    c, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    rng = np.random.default_rng(0)
    samples = [rng.integers(3, 96, 40).tolist() for _ in range(3)]
    weights = {n: next(np.array(onnx_array(t)) for t in net.graph.initializer if t.name == f"{n}.weight") for n in taps}
    results = search_network_scales(net, taps, cache_shape, model.num_layers, samples, 4, 32, True)
    assert set(results) == set(taps) and len(taps) == 4 * model.num_layers
    for name, r in results.items():
        assert r.scale.shape == (weights[name].shape[0],) and np.all(np.isfinite(r.scale)) and np.all(r.scale > 0)
        assert r.loss <= r.losses[RTN]
    # the statistics the search used, rebuilt by hand for layer 0's fused q|k|v input
    emb = c.float32("model.embed_tokens.weight")[np.concatenate(samples)]
    h = emb / np.sqrt((emb.astype(np.float64) ** 2).mean(-1, keepdims=True) + model.rms_norm_eps) * c.float32("model.layers.0.input_layernorm.weight")
    gram = h.T @ h
    name = "/model/layers.0/attn/qkv_proj"
    r = results[name]
    w_mean = weight_mean(weights[name], 32)
    want = [output_error(weights[name], candidate_scale(np.abs(h).mean(0), a, w_mean if duo else None), gram, 4, 32, True)
            for a, duo in (RTN, r.choice)]
    np.testing.assert_allclose([r.losses[RTN], r.loss], want, rtol=1e-3)


def onnx_array(t):
    from onnx import numpy_helper

    return numpy_helper.to_array(t)


def test_awq_search_returns_scales_and_clipping_per_layer(ckpt):
    _, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    in_out = {t.name[: -len(".weight")]: tuple(t.dims) for t in net.graph.initializer if t.name.endswith("_proj.weight")}
    layers = awq_search(net, taps, cache_shape, model.num_layers, [list(range(3, 60))], 4, 32, True)
    assert set(layers) == set(taps)
    for name, layer in layers.items():
        n_in, n_out = in_out[name]
        assert layer.scale.shape == (n_in,) and layer.clip.shape == (n_in // 32, n_out)
        assert np.all(layer.clip > 0.5) and np.all(layer.clip <= 1)


def test_calibration_in_several_passes_finds_the_same_scales(ckpt, monkeypatch):
    """Layers whose Gram matrices do not fit the budget together are calibrated in more passes, to the same result."""
    import specdec.builder.awq as awq

    samples = [list(range(3, 50)), list(range(40, 90))]
    _, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    one_pass = awq_input_scales(net, taps, cache_shape, model.num_layers, samples, 4, 32, True)
    assert len(awq._tap_groups({n: 64 for n in taps}, awq.GRAM_BUDGET_BYTES)) == 1
    monkeypatch.setattr(awq, "GRAM_BUDGET_BYTES", 128 * 128 * 8)  # one 128-wide down_proj input, or four 64-wide ones
    groups = awq._tap_groups({n: (128 if n.endswith("down_proj") else 64) for n in taps}, awq.GRAM_BUDGET_BYTES)
    assert [[n.rsplit("/", 1)[1] for n in g] for g in groups] == [["qkv_proj", "o_proj", "gate_up_proj"], ["down_proj"]] * model.num_layers
    _, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    several = awq_input_scales(net, taps, cache_shape, model.num_layers, samples, 4, 32, True)
    for name, s in one_pass.items():
        np.testing.assert_array_equal(several[name], s)


def test_awq_input_scales_contract(ckpt):
    """The function build.py calls: name -> s [in] float32 > 0 for every tap."""
    _, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    in_features = {t.name[: -len(".weight")]: t.dims[0] for t in net.graph.initializer if t.name.endswith("_proj.weight")}
    scales = awq_input_scales(net, taps, cache_shape, model.num_layers, [list(range(3, 60))], 4, 32, False)
    assert set(scales) == set(taps)
    for name, s in scales.items():
        assert s.dtype == np.float32 and s.shape == (in_features[name],) and np.all(np.isfinite(s)) and np.all(s > 0)


# -- specdec-build --qformat int4_awq ----------------------------------------------

OUTLIER_CHANNELS = [5, 40]


@pytest.fixture(scope="module")
def outlier_ckpt(tmp_path_factory):
    """A tiny Llama whose norms amplify two hidden channels 20x (every layer's qkv and gate_up inputs get outlier
    channels, as trained LLMs have), with a word-level tokenizer and calibration text."""
    import shutil

    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("awq-cli")
    base = make_checkpoint(d / "base", "LlamaForCausalLM", hidden_size=64, intermediate_size=128, vocab_size=96)
    ckpt = d / "ckpt"
    shutil.copytree(base, ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    for name, t in tensors.items():
        if name.endswith("layernorm.weight"):
            t[OUTLIER_CHANNELS] *= 20.0
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    (d / "calib.txt").write_text(" ".join(f"w{(i * 7 + i // 96) % 93 + 3}" for i in range(600)))
    return ckpt, d / "calib.txt"


def cli_build(ckpt, out, *flags):
    return conftest_cli_build(ckpt, out, "--dtype", "float32", *flags)


def fake_quant_checkpoint(src, dst, layers: dict[str, AwqLayer], group: int):
    """``src`` with each linear weight W replaced by deq(Q(clip(s W))) / s: in float, what an AWQ int4 engine computes."""
    import shutil

    from safetensors.numpy import load_file, save_file

    modules = {"attn/qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "attn/o_proj": ["self_attn.o_proj"],
               "mlp/gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"], "mlp/down_proj": ["mlp.down_proj"]}
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    for name, awq in layers.items():
        layer, kind = name.removeprefix("/model/layers.").split("/", 1)
        keys = [f"model.layers.{layer}.{m}.weight" for m in modules[kind]]
        w_t = np.concatenate([tensors[k].T for k in keys], axis=1)  # [in, out] fused, as the engine (and its clipping) sees it
        deq = awq.quantize(w_t, 4, group, True).dequantized() / awq.scale[:, None]
        for k, part in zip(keys, np.split(deq, np.cumsum([tensors[k].shape[0] for k in keys])[:-1], axis=1), strict=True):
            tensors[k] = np.ascontiguousarray(part.T)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_cli_int4_awq_builds_runs_and_computes_the_scaled_weights(outlier_ckpt, tmp_path):
    """The engine computes (x / s) @ deq(Q(s W)) (clip(s W) when the build clips) with what awq_search finds on the same text.

    Tolerance as in test_weight_only: MatMulNBits rounds each GEMM's input blocks to int8 (accuracy_level 4),
    under 3% of the logits' range through 2 layers; a scale left out of the input or folded twice moves the
    logits by far more (the outlier channels are scaled by up to ~20x).
    """
    import json

    from conftest import OrtExecutor, build_and_load, load_engine_dir, spec_build

    from specdec.builder.calibration import calibration_samples

    ckpt, calib = outlier_ckpt
    r = cli_build(ckpt, tmp_path / "awq", "--qformat", "int4_awq", "--group_size", 32, "--calib_dataset", calib, "--calib_size", 8)
    assert r.exit_code == 0, r.output
    wo = json.loads((tmp_path / "awq" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["bits"], wo["group_size"], wo["source"]) == (4, 32, "awq")
    got = logits(OrtExecutor(load_engine_dir(tmp_path / "awq"), num_threads=1))

    _, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    import specdec.builder.build as build_module

    clip = getattr(build_module, "AWQ_CLIP", False)  # whether the build clips as well as scales: the reference does what it does
    layers = awq_search(net, taps, cache_shape, model.num_layers, calibration_samples(calib, ckpt, 8, 48), 4, 32, True, clip=clip)
    assert any(np.abs(np.log(a.scale)).max() > 0.5 for a in layers.values())  # the outliers moved the scales well away from 1
    assert not clip or any((a.clip < 1).any() for a in layers.values())
    build = spec_build(quantization="none", dtype="float32")
    want = logits(build_and_load(fake_quant_checkpoint(ckpt, tmp_path / "awq-ref", layers, 32), tmp_path / "awq-ref-e", build))
    plain = {n: AwqLayer(np.ones_like(a.scale), None) for n, a in layers.items()}
    rtn = logits(build_and_load(fake_quant_checkpoint(ckpt, tmp_path / "rtn-ref", plain, 32), tmp_path / "rtn-ref-e", build))
    span = want.max() - want.min()
    assert np.abs(got - want).max() <= 0.03 * span, np.abs(got - want).max() / span
    assert np.abs(got - want).max() < 0.5 * np.abs(got - rtn).max()  # it is the scaled weights the engine computes with

    # and AWQ is what it is for: closer to the float model than round-to-nearest int4
    flt = logits(build_and_load(ckpt, tmp_path / "f32", build))
    r = cli_build(ckpt, tmp_path / "rtn", "--qformat", "int4_wo", "--group_size", 32)
    assert r.exit_code == 0, r.output
    plain = logits(OrtExecutor(load_engine_dir(tmp_path / "rtn"), num_threads=1))
    assert np.mean((got - flt) ** 2) < np.mean((plain - flt) ** 2)


def logits(ex, ids=(5, 17, 33, 2, 61, 8, 90, 41, 12, 7)) -> np.ndarray:
    return ex.forward(ex.new_cache(1), [list(ids)], all_logits=True).logits.copy()[0]


def test_cli_int4_awq_without_calibration_text_is_refused(outlier_ckpt, tmp_path):
    ckpt, _ = outlier_ckpt
    out = tmp_path / "e"
    r = cli_build(ckpt, out, "--qformat", "int4_awq", "--group_size", 32)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("error: ") and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--calib_dataset" in r.stderr and "Traceback" not in r.output
    assert not out.exists() and not list(tmp_path.glob(".e*"))


def test_calibration_text_that_nothing_reads_or_that_is_not_text_is_refused_and_little_text_said(outlier_ckpt, tmp_path):
    """--calib_dataset / --calib_size where nothing calibrates, and bytes that are not UTF-8, were taken without a word; a file
    that gives fewer samples than --calib_size builds, saying how little the scales rest on."""
    ckpt, calib = outlier_ckpt
    (tmp_path / "bin.txt").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "short.txt").write_text("def f(x): return x\n")
    for args, message in [
        (["--calib_size", 8], "--calib_size counts samples of --calib_dataset, which is not given"),
        (["--calib_dataset", calib], "--calib_dataset is read only to calibrate --fp8_activations static or --qformat int4_awq"),
        (["--qformat", "int4_awq", "--group_size", 32, "--calib_dataset", tmp_path / "bin.txt"], "is not UTF-8 text"),
    ]:
        r = cli_build(ckpt, tmp_path / "e", *args)
        assert r.exit_code == 1 and message in r.stderr and "Traceback" not in r.output, (args, r.output)
        assert not (tmp_path / "e").exists()
    r = cli_build(ckpt, tmp_path / "e", "--qformat", "int4_awq", "--group_size", 32, "--calib_dataset", tmp_path / "short.txt")
    assert r.exit_code == 0, r.output
    assert "gives 1 sample(s)" in r.output and "not --calib_size 64" in r.output, r.output


@pytest.mark.skipif(__import__("specdec.hardware.cpu_kernels", fromlist=["compiler"]).compiler() is None, reason="needs a C compiler")
def test_cli_int4_awq_with_specdec_kernels(outlier_ckpt, tmp_path):
    """--cpu_kernels specdec: the float32 network AWQ calibrates on runs ONNX Runtime's own ops (no specdec library in its
    session), and the engine runs Q4Gemm and RotaryCachedAttention."""
    import json

    ckpt, calib = outlier_ckpt
    r = cli_build(ckpt, tmp_path / "awq", "--qformat", "int4_awq", "--group_size", 32, "--calib_dataset", calib, "--calib_size", 4,
                  "--cpu_kernels", "specdec")
    assert r.exit_code == 0, r.output
    wo = json.loads((tmp_path / "awq" / "config.json").read_text())["build"]["weight_only"]
    assert wo["source"] == "awq" and wo["op"].startswith("Q4Gemm") and wo["attention_op"].startswith("RotaryCachedAttention")
