"""specdec's CPU attention op, ai.specdec.cpu::CachedAttention (hardware/kernels/attention.c): attention over the whole
static-capacity cache read in place, against a numpy reference (ragged positions, GQA, stale slots past each row's
position that must not leak in), and the property the engines rely on: a token's output is the same bits whatever the
call's batch and token count, and whichever kernel (AVX-512, AVX2, portable C) computes it."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from specdec.hardware import cpu_kernels as rk
from specdec.plugins import cpu_kernels as ck

pytestmark = pytest.mark.skipif(rk.compiler() is None, reason="needs a C compiler")


def session(heads: int, kv_heads: int, threads: int = 1) -> ort.InferenceSession:
    """One CachedAttention node, as plugins/cpu_kernels.py writes it."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(rk.kernel_library()))
    return ort.InferenceSession(ck.cached_attention_model(heads, kv_heads), so, providers=["CPUExecutionProvider"])


def reference(q, k, v, pos, heads: int, kv_heads: int) -> np.ndarray:
    """float64 attention: token at position p sees slots 0..p of its row; query head h reads KV head h // group."""
    b, s, width = q.shape
    hd, group = width // heads, heads // kv_heads
    out = np.zeros((b, s, heads, hd))
    for r in range(b):
        for t in range(s):
            n = pos[r, t] + 1
            for h in range(heads):
                g = h // group
                qh = q[r, t, h * hd:(h + 1) * hd].astype(np.float64)
                keys, values = k[r, :n, g * hd:(g + 1) * hd].astype(np.float64), v[r, :n, g * hd:(g + 1) * hd].astype(np.float64)
                scores = keys @ qh / np.sqrt(hd)
                w = np.exp(scores - scores.max())
                out[r, t, h] = w @ values / w.sum()
    return out.reshape(b, s, width)


def problem(rng, batch: int, tokens: int, heads: int, kv_heads: int, hd: int, capacity: int):
    """q, k, v, positions: each row's tokens at consecutive positions from a ragged start, and the slots past each row's
    last position filled with huge garbage (a stale draft), which a leak would show."""
    q = rng.standard_normal((batch, tokens, heads * hd)).astype(np.float32) * 2
    k = rng.standard_normal((batch, capacity, kv_heads * hd)).astype(np.float32) * 2
    v = rng.standard_normal((batch, capacity, kv_heads * hd)).astype(np.float32)
    starts = rng.integers(0, capacity - tokens + 1, batch)
    pos = (starts[:, None] + np.arange(tokens)[None]).astype(np.int64)
    for r in range(batch):
        k[r, pos[r, -1] + 1:] = 1e4
        v[r, pos[r, -1] + 1:] = 1e6
    return q, k, v, pos


@pytest.mark.parametrize("heads,kv_heads,hd", [(4, 2, 16), (12, 2, 128), (8, 2, 32), (16, 4, 64), (6, 6, 24), (8, 1, 80), (3, 1, 5)])
def test_the_op_is_attention_over_each_tokens_visible_slots(heads, kv_heads, hd):
    """S = 1..9 tokens, B = 1..4 rows at ragged positions, GQA (and MHA, MQA, head dims not a multiple of 16): the
    float64 reference within float32 rounding, and nothing of the garbage past each row's position."""
    rng = np.random.default_rng(heads * 100 + hd)
    sess = session(heads, kv_heads, threads=2)
    for batch in (1, 2, 4):
        for tokens in (1, 2, 5, 9):
            q, k, v, pos = problem(rng, batch, tokens, heads, kv_heads, hd, capacity=40)
            y = sess.run(None, {"q": q, "k": k, "v": v, "pos": pos})[0]
            assert y.shape == q.shape and np.isfinite(y).all()
            np.testing.assert_allclose(y, reference(q, k, v, pos, heads, kv_heads), rtol=2e-5, atol=2e-5)


def test_large_scores_are_softmaxed_stably():
    """Scores in the thousands (exp would overflow without the max subtracted) give the reference's output, finite:
    within what float32 scores that large can hold (a score of 1000 is known to 6e-5, so is its weight's exponent)."""
    rng = np.random.default_rng(3)
    q, k, v, pos = problem(rng, 2, 3, 4, 2, 16, capacity=24)
    q *= 300
    y = session(4, 2).run(None, {"q": q, "k": k, "v": v, "pos": pos})[0]
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, reference(q, k, v, pos, 4, 2), rtol=1e-3, atol=1e-3)


def outputs_by_shape(heads: int, kv_heads: int, hd: int, threads: int = 1, capacity: int = 300) -> np.ndarray:
    """Every token of a fixed 4-row, 9-token problem, computed in calls of every batch (1..4 rows) and width (1..9 tokens):
    [B-calls x S-calls, 4, 9, width], the calls' outputs put back where their tokens are. A small ``capacity`` puts the
    tokens at the first slots (under 8 or 16 seen: the kernels' partial first blocks)."""
    rng = np.random.default_rng(11)
    q, k, v, pos = problem(rng, 4, 9, heads, kv_heads, hd, capacity=capacity)
    sess = session(heads, kv_heads, threads)
    results = []
    for rows in (1, 2, 3, 4):
        for width in range(1, 10):
            y = np.empty_like(q)
            for r0 in range(0, 4, rows):
                for t0 in range(0, 9, width):
                    sl = (slice(r0, r0 + rows), slice(t0, t0 + width))
                    y[sl] = sess.run(None, {"q": q[sl], "k": k[r0:r0 + rows], "v": v[r0:r0 + rows], "pos": pos[sl]})[0]
            results.append(y)
    return np.stack(results)


@pytest.mark.parametrize("heads,kv_heads,hd", [(12, 2, 128), (8, 2, 32), (16, 4, 64), (4, 2, 16), (3, 1, 20)])
def test_a_tokens_output_is_the_same_bits_whatever_the_call(heads, kv_heads, hd):
    """A token computed in a call of B rows x S tokens (B = 1..4, S = 1..9, 1 and 2 threads) is the same bits every time:
    a one-token step and a verification step agree exactly (docs/precision.md)."""
    for threads in (1, 2):
        by_shape = outputs_by_shape(heads, kv_heads, hd, threads)
        for i in range(1, len(by_shape)):
            np.testing.assert_array_equal(by_shape[i], by_shape[0])


@pytest.mark.parametrize("kernel", ["avx2", "portable"])
@pytest.mark.parametrize("heads,kv_heads,hd,capacity", [(12, 2, 128, 300), (8, 2, 32, 300), (3, 1, 20, 300), (4, 4, 40, 300), (6, 3, 24, 300),
                                                        (8, 2, 32, 14), (3, 1, 5, 20), (4, 2, 52, 12)])
def test_every_kernel_computes_the_same_bits(tmp_path, kernel, heads, kv_heads, hd, capacity):
    """SPECDEC_Q4_KERNEL=avx2 | portable runs the kernel a CPU without AVX-512 (or AVX2) runs: the same bits. Head dims with
    tails (5, 20, 24, 40, 52), MHA and odd groups, and tokens at the first slots (capacity 12-20)."""
    fast = outputs_by_shape(heads, kv_heads, hd, capacity=capacity)[:3]
    script = (f"import numpy as np, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_cpu_attention as t; "
              f"np.save({str(tmp_path / 'y.npy')!r}, t.outputs_by_shape({heads}, {kv_heads}, {hd}, capacity={capacity})[:3])")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "SPECDEC_Q4_KERNEL": kernel})
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), fast)


def test_the_exp_polynomial_is_within_2_ulp():
    """The exp every kernel computes (attention.c), over its whole input range [-87, 0]: within 2 ulp of float64 exp."""
    lib = ctypes.CDLL(str(rk.kernel_library()))
    fn = lib.specdec_attention_exp_probe
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    xs = np.concatenate([np.linspace(-87, 0, 20001, dtype=np.float32), -np.logspace(-30, 1.9, 2001).astype(np.float32), [0.0, -0.0]])
    got = np.array([fn(float(x)) for x in xs], np.float32)
    want = np.exp(xs.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - want) / ulp) <= 2.0
    assert fn(-1000.0) == pytest.approx(np.exp(-87.0), rel=1e-6)  # clamped: a negligible weight, never a denormal
    assert np.isnan(fn(float("nan")))


@pytest.mark.parametrize("bad,expected", [
    ("past", "a position is outside the cache"),
    ("negative", "a position is outside the cache"),
    ("width", "key and value must both be"),
    ("rows", "positions must be [batch, tokens]"),
])
def test_bad_inputs_are_one_clear_error(bad, expected):
    rng = np.random.default_rng(0)
    q, k, v, pos = problem(rng, 2, 3, 4, 2, 16, capacity=10)
    if bad == "past":
        pos[1, 2] = 10
    elif bad == "negative":
        pos[0, 0] = -1
    elif bad == "width":
        k = k[:, :, :16]
    else:
        pos = pos[:1]
    with pytest.raises(Exception, match=expected.replace("[", r"\[")):
        session(4, 2).run(None, {"q": q, "k": k, "v": v, "pos": pos})
