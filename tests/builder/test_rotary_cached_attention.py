"""ai.specdec.cpu::RotaryCachedAttention (hardware/kernels/ort_attention.c), a chain engine's whole attention in one node:
rotary on q and k, k and v written into the caches at each row's slots, and CachedAttention's attention over them.

Against a float64 reference; against the graph it replaces (RotaryEmbedding x 2, TensorScatter x 2, CachedAttention, the
form engines built before it still run) bit for bit; with the caches written in place when present is bound to past's
buffer, and copied first when not; the same bits whatever the call's tokens and whichever kernel runs it; bad inputs
refused in one line."""

import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from specdec.builder.rope import cos_sin_tables
from specdec.hardware import cpu_kernels as rk
from specdec.plugins import cpu_kernels as ck

pytestmark = pytest.mark.skipif(rk.compiler() is None, reason="needs a C compiler")

HEADS, KV_HEADS, HD, CAPACITY = 4, 2, 16, 24


def tables(hd: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [positions, hd / 2] as the builder makes them (rope_theta 10000)."""
    angles = np.arange(positions)[:, None] / 10000.0 ** (np.arange(0, hd, 2) / hd)[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def fused_model(heads: int, kv_heads: int, packed: bool, tree: bool = False) -> bytes:
    """One RotaryCachedAttention node as plugins/cpu_kernels.py writes it: inputs q (or qkv), k, v, past_k, past_v, pos,
    cos, sin (and a tree engine's tree: its tree_mask); outputs y, present_k, present_v."""
    names = ["q", "" if packed else "k", "" if packed else "v", "past_k", "past_v", "pos", "cos", "sin"] + (["tree"] if tree else [])
    node = helper.make_node("RotaryCachedAttention", names, ["y", "present_k", "present_v"], domain=ck.DOMAIN, num_heads=heads,
                            kv_num_heads=kv_heads)
    types = {"pos": TensorProto.INT64, "tree": TensorProto.BOOL}
    inputs = [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), None) for n in names if n]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "present_k", "present_v")]
    return _model([node], inputs, outputs)


def separate_model(heads: int, kv_heads: int) -> bytes:
    """The graph RotaryCachedAttention replaces, as engines built before it have it per layer: RotaryEmbedding on q and k,
    TensorScatter of k and v at positions[:, 0], CachedAttention over the scattered caches."""
    nodes = [
        helper.make_node("Gather", ["pos", "zero"], ["write"], axis=1),
        helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["q_rope"], num_heads=heads),
        helper.make_node("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["k_rope"], num_heads=kv_heads),
        helper.make_node("TensorScatter", ["past_k", "k_rope", "write"], ["present_k"], axis=-2),
        helper.make_node("TensorScatter", ["past_v", "v", "write"], ["present_v"], axis=-2),
        helper.make_node("CachedAttention", ["q_rope", "present_k", "present_v", "pos"], ["y"], domain=ck.DOMAIN, num_heads=heads,
                         kv_num_heads=kv_heads),
    ]
    names = ["q", "k", "v", "past_k", "past_v", "pos", "cos", "sin"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "pos" else TensorProto.FLOAT, None) for n in names]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "present_k", "present_v")]
    return _model(nodes, inputs, outputs, [helper.make_tensor("zero", TensorProto.INT64, [], [0])])


def _model(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "a", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid(ck.DOMAIN, 1)])
    model.ir_version = 11
    return model.SerializeToString()


def session(model: bytes, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(rk.kernel_library()))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def problem(rng, batch: int, tokens: int, heads: int = HEADS, kv_heads: int = KV_HEADS, hd: int = HD, capacity: int = CAPACITY):
    """A step's q, k, v, the caches before it (slots past each row's live length hold garbage a leak would show) and the
    positions: each row's tokens at consecutive positions from a ragged start."""
    q = rng.standard_normal((batch, tokens, heads * hd)).astype(np.float32)
    k = rng.standard_normal((batch, tokens, kv_heads * hd)).astype(np.float32)
    v = rng.standard_normal((batch, tokens, kv_heads * hd)).astype(np.float32)
    past_k = rng.standard_normal((batch, capacity, kv_heads * hd)).astype(np.float32)
    past_v = rng.standard_normal((batch, capacity, kv_heads * hd)).astype(np.float32)
    starts = rng.integers(0, capacity - tokens + 1, batch)
    pos = (starts[:, None] + np.arange(tokens)[None]).astype(np.int64)
    for r in range(batch):
        past_k[r, starts[r]:] = 1e4
        past_v[r, starts[r]:] = 1e6
    return dict(q=q, k=k, v=v, past_k=past_k, past_v=past_v, pos=pos)


def rotate(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, heads: int) -> np.ndarray:
    """[B, S, heads * hd] rotated per head (halves, not interleaved), in float64."""
    b, s, width = x.shape
    hd = width // heads
    h = x.reshape(b, s, heads, hd).astype(np.float64)
    c, sn = cos[pos][:, :, None].astype(np.float64), sin[pos][:, :, None].astype(np.float64)  # [B, S, 1, hd / 2]
    re, im = h[..., : hd // 2], h[..., hd // 2:]
    return np.concatenate([re * c - im * sn, re * sn + im * c], axis=-1).reshape(b, s, width)


def reference(p: dict, heads: int, kv_heads: int, cos: np.ndarray, sin: np.ndarray):
    """float64: (y, present_k, present_v)."""
    key, value = p["past_k"].astype(np.float64), p["past_v"].astype(np.float64)
    q, k = rotate(p["q"], p["pos"], cos, sin, heads), rotate(p["k"], p["pos"], cos, sin, kv_heads)
    b, s, width = q.shape
    hd, group = width // heads, heads // kv_heads
    for r in range(b):
        key[r, p["pos"][r, 0]: p["pos"][r, 0] + s] = k[r]
        value[r, p["pos"][r, 0]: p["pos"][r, 0] + s] = p["v"][r]
    out = np.zeros((b, s, heads, hd))
    for r in range(b):
        for t in range(s):
            n = p["pos"][r, t] + 1
            for h in range(heads):
                g = h // group
                scores = key[r, :n, g * hd:(g + 1) * hd] @ q[r, t, h * hd:(h + 1) * hd] / np.sqrt(hd)
                w = np.exp(scores - scores.max())
                out[r, t, h] = w @ value[r, :n, g * hd:(g + 1) * hd] / w.sum()
    return out.reshape(b, s, width), key, value


def fused_feeds(p: dict, cos, sin, packed: bool) -> dict:
    feeds = dict(past_k=p["past_k"], past_v=p["past_v"], pos=p["pos"], cos=cos, sin=sin)
    if packed:
        return dict(q=np.concatenate([p["q"], p["k"], p["v"]], axis=-1), **feeds)
    return dict(q=p["q"], k=p["k"], v=p["v"], **feeds)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("heads,kv_heads,hd", [(4, 2, 16), (8, 2, 32), (6, 6, 24), (8, 1, 20), (12, 2, 128)])
def test_the_op_is_rotary_cache_write_and_attention(packed, heads, kv_heads, hd):
    """B = 1..3 rows at ragged positions, S = 1..9 tokens, GQA, MHA and MQA, a packed q|k|v or three inputs: the float64
    reference's output and caches within float32 rounding; slots the step does not write keep their bits."""
    rng = np.random.default_rng(heads * 10 + hd)
    cos, sin = tables(hd, 40)
    sess = session(fused_model(heads, kv_heads, packed), threads=2)
    for batch in (1, 3):
        for tokens in (1, 2, 5, 9):
            p = problem(rng, batch, tokens, heads, kv_heads, hd, capacity=40)
            y, key, value = sess.run(None, fused_feeds(p, cos, sin, packed))
            want_y, want_k, want_v = reference(p, heads, kv_heads, cos, sin)
            np.testing.assert_allclose(y, want_y, rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(key, want_k, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(value, want_v.astype(np.float32))
            for r in range(batch):
                written = slice(p["pos"][r, 0], p["pos"][r, 0] + tokens)
                untouched = np.ones(40, bool)
                untouched[written] = False
                np.testing.assert_array_equal(key[r, untouched], p["past_k"][r, untouched])


def _host_has_avx2_fma() -> bool:
    """Whether ONNX Runtime's MLAS takes its AVX2 rotary kernel here (the CPU's flags, whatever SPECDEC_Q4_KERNEL says)."""
    try:
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    except OSError:
        return False
    return {"avx2", "fma"} <= set(flags)


@pytest.mark.skipif(not _host_has_avx2_fma(), reason="ONNX Runtime's RotaryEmbedding rounds with FMAs only in its AVX2 kernel")
@pytest.mark.parametrize("hd", [16, 24, 64, 128])
@pytest.mark.parametrize("packed", [False, True])
def test_the_same_bits_as_the_graph_it_replaces(hd, packed):
    """Engines built before the op run RotaryEmbedding + TensorScatter + CachedAttention: the op computes their output and
    caches bit for bit (ONNX Runtime's AVX2 RotaryEmbedding takes the same two FMAs, its masked tail too: head dims 24
    and 16; the builder's own cos/sin tables), packed or not, on 1 and 2 threads, and with pad_step's extra token (the
    last token and position repeated)."""
    rng = np.random.default_rng(hd)
    cos, sin = cos_sin_tables(_rope_config(hd), CAPACITY)
    for threads in (1, 2):
        fused, separate = session(fused_model(HEADS, KV_HEADS, packed), threads), session(separate_model(HEADS, KV_HEADS), threads)
        for batch, tokens in ((1, 1), (1, 5), (2, 9), (3, 3)):
            p = problem(rng, batch, tokens, hd=hd)
            if tokens > 1 and batch > 1:  # pad_step's padding: the last token again, at the last position
                for name in ("q", "k", "v"):
                    p[name][:, -1] = p[name][:, -2]
                p["pos"][:, -1] = p["pos"][:, -2]
            want = separate.run(None, fused_feeds(p, cos, sin, False))
            for got, expected in zip(fused.run(None, fused_feeds(p, cos, sin, packed)), want, strict=True):
                np.testing.assert_array_equal(got, expected)


def _rope_config(hd: int):
    """The fields cos_sin_tables reads, of a Llama-like model with head_dim hd."""
    from types import SimpleNamespace

    return SimpleNamespace(head_dim=hd, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=4096)


def bound_run(sess: ort.InferenceSession, p: dict, cos, sin, key: np.ndarray, value: np.ndarray, present: tuple | None = None) -> np.ndarray:
    """A run with present bound to past's buffers, as the runtime binds them (the caches are written in place), or to the
    buffers ``present`` (key, value)."""
    b = sess.io_binding()
    b.bind_output("y")  # the first output bound: copy_outputs_to_cpu()[0]
    for name, arr in fused_feeds(p, cos, sin, True).items():
        if name not in ("past_k", "past_v"):
            b.bind_cpu_input(name, arr)
    for i, (kind, arr) in enumerate((("k", key), ("v", value))):
        ov = ort.OrtValue.ortvalue_from_numpy(arr)
        b.bind_ortvalue_input(f"past_{kind}", ov)
        b.bind_ortvalue_output(f"present_{kind}", ov if present is None else ort.OrtValue.ortvalue_from_numpy(present[i]))
    sess.run_with_iobinding(b)
    return b.copy_outputs_to_cpu()[0]


def test_present_bound_to_past_is_written_in_place():
    """With present bound to past's buffer the step writes its slots into that buffer and nothing else changes; the
    output and caches equal an unbound run's (which copies past into present first and leaves past as it was) and a run
    whose present is bound to other buffers, full of garbage (past copied over it, past left as it was)."""
    rng = np.random.default_rng(7)
    cos, sin = tables(HD, CAPACITY)
    sess = session(fused_model(HEADS, KV_HEADS, True))
    p = problem(rng, 2, 5)
    before_k, before_v = p["past_k"].copy(), p["past_v"].copy()
    y, present_k, present_v = sess.run(None, fused_feeds(p, cos, sin, True))
    np.testing.assert_array_equal(p["past_k"], before_k)  # unbound: past itself untouched
    np.testing.assert_array_equal(p["past_v"], before_v)
    elsewhere = (np.full_like(before_k, np.nan), np.full_like(before_v, -7.0))
    np.testing.assert_array_equal(bound_run(sess, p, cos, sin, p["past_k"], p["past_v"], elsewhere), y)
    np.testing.assert_array_equal(elsewhere[0], present_k)
    np.testing.assert_array_equal(elsewhere[1], present_v)
    np.testing.assert_array_equal(p["past_k"], before_k)
    key, value = p["past_k"].copy(), p["past_v"].copy()
    y_bound = bound_run(sess, p, cos, sin, key, value)
    np.testing.assert_array_equal(y_bound, y)
    np.testing.assert_array_equal(key, present_k)
    np.testing.assert_array_equal(value, present_v)
    assert not np.array_equal(key, before_k)


def steps_by_width(width: int, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A 9-token continuation of 2 rows fed `width` tokens a call into caches bound in place: (outputs, keys)."""
    rng = np.random.default_rng(13)
    cos, sin = tables(HD, CAPACITY)
    p = problem(rng, 2, 9)
    p["pos"] = np.stack([np.arange(3, 12), np.arange(10, 19)]).astype(np.int64)
    sess = session(fused_model(HEADS, KV_HEADS, True), threads)
    key, value = p["past_k"].copy(), p["past_v"].copy()
    ys = []
    for t0 in range(0, 9, width):
        part = {n: (a[:, t0:t0 + width] if n in ("q", "k", "v", "pos") else a) for n, a in p.items()}
        ys.append(bound_run(sess, part, cos, sin, key, value))
    return np.concatenate(ys, axis=1), key


@pytest.mark.parametrize("threads", [1, 2])
def test_a_tokens_output_and_cache_are_the_same_bits_whatever_the_call(threads):
    """Nine tokens fed 1, 2, 3, 4, 5 or 9 a call: the same outputs and caches, bit for bit (a one-token step and a
    verification step agree exactly: docs/precision.md)."""
    y1, k1 = steps_by_width(1, threads)
    for width in (2, 3, 4, 5, 9):
        y, k = steps_by_width(width, threads)
        np.testing.assert_array_equal(y, y1)
        np.testing.assert_array_equal(k, k1)


@pytest.mark.parametrize("kernel", ["avx2", "portable"])
def test_every_kernel_computes_the_same_bits(tmp_path, kernel):
    """SPECDEC_Q4_KERNEL=avx2 | portable: the rotary (FMAs as vector instructions or libm's fmaf) and the attention of the
    slower kernels give the same bits."""
    if kernel == "avx2" and rk.kernel_name(rk.kernel_library()) == "AVX2":
        pytest.skip("this CPU runs the AVX2 kernel already: no faster one to compare it with")
    fast = steps_by_width(3)
    script = (f"import numpy as np, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_rotary_cached_attention as t; "
              f"y, k = t.steps_by_width(3); np.save({str(tmp_path / 'y.npy')!r}, y); np.save({str(tmp_path / 'k.npy')!r}, k)")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "SPECDEC_Q4_KERNEL": kernel})
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), fast[0])
    np.testing.assert_array_equal(np.load(tmp_path / "k.npy"), fast[1])


@pytest.mark.parametrize("bad,expected", [
    ("past_capacity", "do not fit the cache"),
    ("negative", "do not fit the cache"),
    ("past_tables", "past cos_cache's and sin_cache's rows"),
    ("visible", "a position is outside the cache"),
    ("packed_width", "a packed query's last dimension"),
    ("key_only", "key and value are given together, or neither"),
    ("cache_width", "past_key and past_value must both be"),
    ("tables", "cos_cache and sin_cache must both be"),
    ("rows", "positions must be [batch, tokens]"),
])
def test_bad_inputs_are_one_clear_error(bad, expected):
    rng = np.random.default_rng(0)
    cos, sin = tables(HD, CAPACITY)
    p = problem(rng, 2, 3)
    packed = bad != "key_only"
    if bad == "past_capacity":
        p["pos"][1] = [CAPACITY - 2, CAPACITY - 1, CAPACITY]
    elif bad == "negative":
        p["pos"][0, 0] = -1
    elif bad == "past_tables":
        cos, sin = cos[:10], sin[:10]
        p["pos"][1] = [9, 10, 11]
    elif bad == "visible":  # tables long enough: the cache is what it is past
        cos, sin = tables(HD, 600)
        p["pos"][1] = [3, 4, 500]
    elif bad == "cache_width":
        p["past_v"] = p["past_v"][:, :, :HD]
    elif bad == "tables":
        cos = cos[:, :4]
    elif bad == "rows":
        p["pos"] = p["pos"][:1]
    feeds = fused_feeds(p, cos, sin, packed)
    if bad == "packed_width":
        feeds["q"] = feeds["q"][:, :, :-1]
    model = fused_model(HEADS, KV_HEADS, packed)
    if bad == "key_only":
        feeds.pop("v")
        model = _model([helper.make_node("RotaryCachedAttention", ["q", "k", "", "past_k", "past_v", "pos", "cos", "sin"],
                                         ["y", "present_k", "present_v"], domain=ck.DOMAIN, num_heads=HEADS, kv_num_heads=KV_HEADS)],
                       [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "pos" else TensorProto.FLOAT, None) for n in feeds],
                       [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "present_k", "present_v")])
    with pytest.raises(Exception, match=expected.replace("[", r"\[")):
        session(model).run(None, feeds)
