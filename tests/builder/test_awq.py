"""AWQ input scales: the search on synthetic layers, the calibration taps on a real network, and the CLI."""

import numpy as np
import pytest
from checkpoints import make_checkpoint

from specdec.builder.awq import InputStats, awq_input_scales, candidate_scale, output_error, search_network_scales, search_scale
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
    assert r.losses[r.alpha] <= r.losses[0.0]  # the search can only keep or beat RTN on its own loss
    # with no outliers there is little to buy, but never a loss
    flat = InputStats.empty(N_IN)
    flat.add(np.random.default_rng(3).standard_normal((ROWS, N_IN)))
    r = search_scale(w, flat, 4, 128, True)
    assert r.losses[r.alpha] <= r.losses[0.0]


def test_dead_channels_get_finite_positive_scales():
    x, w, _ = outlier_layer(seed=4)
    x[:, 10:20] = 0.0  # channels that never fire
    stats = InputStats.empty(N_IN)
    stats.add(x)
    for a in (0.0, 0.5, 1.0):
        s = candidate_scale(stats.mean_abs, a)
        assert np.all(np.isfinite(s)) and np.all(s > 0)
    silent = InputStats.empty(N_IN)
    silent.add(np.zeros((4, N_IN)))  # a layer whose input is all zero: every candidate ties; RTN is kept
    r = search_scale(w, silent, 4, 128, True)
    assert r.alpha == 0.0 and np.all(r.scale == 1)


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
        assert r.losses[r.alpha] <= r.losses[0.0]
    # the statistics the search used, rebuilt by hand for layer 0's fused q|k|v input
    emb = c.float32("model.embed_tokens.weight")[np.concatenate(samples)]
    h = emb / np.sqrt((emb.astype(np.float64) ** 2).mean(-1, keepdims=True) + model.rms_norm_eps) * c.float32("model.layers.0.input_layernorm.weight")
    gram = h.T @ h
    name = "/model/layers.0/attn/qkv_proj"
    r = results[name]
    want = {a: output_error(weights[name], candidate_scale(np.abs(h).mean(0), a), gram, 4, 32, True) for a in (0.0, r.alpha)}
    np.testing.assert_allclose([r.losses[0.0], r.losses[r.alpha]], [want[0.0], want[r.alpha]], rtol=1e-3)


def onnx_array(t):
    from onnx import numpy_helper

    return numpy_helper.to_array(t)


def test_awq_input_scales_contract(ckpt):
    """The function build.py calls: name -> s [in] float32 > 0 for every tap."""
    _, model, net, taps, cache_shape = float_network_with_taps(ckpt)
    in_features = {t.name[: -len(".weight")]: t.dims[0] for t in net.graph.initializer if t.name.endswith("_proj.weight")}
    scales = awq_input_scales(net, taps, cache_shape, model.num_layers, [list(range(3, 60))], 4, 32, False)
    assert set(scales) == set(taps)
    for name, s in scales.items():
        assert s.dtype == np.float32 and s.shape == (in_features[name],) and np.all(np.isfinite(s)) and np.all(s > 0)
