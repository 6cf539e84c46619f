"""specdec's int4 and int8 CPU ops, ai.specdec.cpu::Q4Gemm and Q8Gemm (plugins/cpu_kernels.py, hardware/cpu_kernels.py, hardware/kernels/):
their layouts, their arithmetic, a node's several outputs and its SwiGLU, and the property the engines rely on: a row's bits never
depend on how many rows share its call, nor on which kernel (AVX-512 VNNI, AVX2, portable C) computes it."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from specdec.hardware import cpu_kernels as rk
from specdec.plugins import cpu_kernels as ck

pytestmark = pytest.mark.skipif(rk.compiler() is None, reason="needs a C compiler")


def int_weight(k: int, n: int, group: int, symmetric: bool, seed: int = 0, bits: int = 4) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    groups, levels = k // group, 1 << bits
    zero = np.full((groups, n), levels // 2, np.uint8) if symmetric else rng.integers(0, levels, (groups, n)).astype(np.uint8)
    codes = rng.integers(1 if symmetric and bits == 8 else 0, levels, (k, n), dtype=np.uint8)  # (int8 symmetric: -127..127 around 128)
    return SimpleNamespace(bits=bits, group_size=group, perm=None, codes=codes,
                           scale=(rng.random((groups, n), dtype=np.float32) * 0.05 + 0.001).astype(np.float32), zero=zero)


def int4_weight(k: int, n: int, group: int, symmetric: bool, seed: int = 0) -> SimpleNamespace:
    return int_weight(k, n, group, symmetric, seed, 4)


def session(w, threads: int = 1, splits: list[int] | None = None, swiglu: bool = False) -> ort.InferenceSession:
    """One Q4Gemm / Q8Gemm node over ``w``, as plugins/cpu_kernels.py writes it: outputs y0, y1, ... (one per split)."""
    p = ck.pack_q4(w)
    inits = [helper.make_tensor(name, t, a.shape, a.tobytes(), raw=True)
             for name, t, a in (("w", TensorProto.UINT8, p.w), ("s", TensorProto.FLOAT, p.scales), ("z", TensorProto.INT32, p.zeros))]
    inputs, outputs = ["x", "w", "s", "z"], ["y0"]
    if splits is not None:
        inits.append(helper.make_tensor("splits", TensorProto.INT64, [len(splits)], splits))
        inputs, outputs = [*inputs, "splits"], [f"y{i}" for i in range(len(splits))]
    extra = dict(swiglu=1) if swiglu else {}
    node = helper.make_node(p.op, inputs, outputs, domain=ck.DOMAIN, K=p.k, N=p.n, group_size=p.group, **extra)
    return node_session(node, outputs, threads, inits)


def node_session(node, outputs: list[str], threads: int, inits=()) -> ort.InferenceSession:
    """A session of one specdec node whose one input is the float tensor x, with specdec's kernel library."""
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ck.DOMAIN, 1)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(rk.kernel_library()))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def reference(x: np.ndarray, w) -> np.ndarray:
    """The op's arithmetic in float64: int8 activations per row and group (amax / 127, round half to even), exact
    integer dot products, each group's term scaled by the two scales."""
    k, n = w.codes.shape
    group = k // w.scale.shape[0]
    xg = x.reshape(-1, k // group, group).astype(np.float32)
    amax = np.abs(xg).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(xg * inv).astype(np.int64)  # [M, G, group]
    codes = w.codes.astype(np.int64).reshape(k // group, group, n) - w.zero.astype(np.int64)[:, None, :]
    dots = np.einsum("mgk,gkn->mgn", q, codes)
    return (dots * (amax / 127).astype(np.float64) * w.scale.astype(np.float64)[None]).sum(1)


@pytest.mark.parametrize("k,n,group", [(64, 16, 8), (256, 96, 64), (384, 48, 128), (128, 32, 128), (96, 80, 32)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_pack_round_trips(k, n, group, symmetric, bits):
    w = int_weight(k, n, group, symmetric, bits=bits)
    packed = ck.pack_q4(w)
    assert packed.zeros.shape == ((1,) if symmetric else (n // 16, k // group, 16))  # symmetric: one shared zero point
    codes, scale, zero = ck.unpack_q4(packed)
    np.testing.assert_array_equal(codes, w.codes)
    np.testing.assert_array_equal(scale, w.scale)
    np.testing.assert_array_equal(zero, w.zero)


@pytest.mark.parametrize("k,n,group", [(256, 96, 64), (384, 48, 128), (96, 80, 32), (1024, 64, 1024), (240, 32, 24), (64, 16, 8)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_the_ops_compute_the_quantized_product(k, n, group, symmetric, bits):
    w = int_weight(k, n, group, symmetric, bits=bits)
    x = np.random.default_rng(1).standard_normal((2, 5, k)).astype(np.float32)
    y = session(w).run(None, {"x": x})[0]
    assert y.shape == (2, 5, n)
    ref = reference(x, w).reshape(2, 5, n)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    deq = (w.codes.astype(np.float64) - np.repeat(w.zero, k // w.scale.shape[0], 0)) * np.repeat(w.scale, k // w.scale.shape[0], 0)
    assert np.abs(y - x @ deq).max() < 0.02 * np.abs(x @ deq).max()  # int8 activations: close to the float product


def test_a_shared_zero_point_gives_the_bits_of_per_column_ones():
    """A symmetric weight's one stored zero point computes what the same zero point stored per column computes."""
    w = int4_weight(256, 64, 64, True, seed=9)
    x = np.random.default_rng(2).standard_normal((5, 256)).astype(np.float32)
    shared = session(w).run(None, {"x": x})[0]
    w.zero[0, 0] = 7  # one column of one group otherwise: per-column zero points again
    per_column = session(w).run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.delete(per_column, 0, axis=1), np.delete(shared, 0, axis=1))


@pytest.mark.parametrize("bits", [4, 8])
def test_outputs_are_the_columns_of_the_one_output_call(bits):
    """splits: each output is its columns of the whole product, bit for bit (one call, no Split)."""
    w = int_weight(256, 160, 64, False, seed=11, bits=bits)
    x = np.random.default_rng(3).standard_normal((2, 3, 256)).astype(np.float32)
    whole = session(w).run(None, {"x": x})[0]
    parts = session(w, 2, splits=[96, 32, 32]).run(None, {"x": x})
    assert [p.shape for p in parts] == [(2, 3, 96), (2, 3, 32), (2, 3, 32)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=-1), whole)


@pytest.mark.parametrize("bits", [4, 8])
def test_swiglu_is_silu_of_the_gate_times_up(bits):
    """swiglu=1: the one output is silu(gate) * up of the gate|up product, its exp within float rounding of numpy's."""
    w = int_weight(256, 192, 64, True, seed=12, bits=bits)
    x = np.random.default_rng(4).standard_normal((7, 256)).astype(np.float32) * 4
    gate_up = session(w).run(None, {"x": x})[0].astype(np.float64)
    y = session(w, swiglu=True).run(None, {"x": x})[0]
    gate, up = gate_up[:, :96], gate_up[:, 96:]
    want = gate / (1 + np.exp(-gate)) * up
    assert y.shape == (7, 96)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-6 * np.abs(want).max())
    # the clamp of exp's input: a very negative gate gives (nearly) 0, a very positive one gives gate * up
    g = np.tile(np.array([-200.0, -90.0, 0.0, 90.0, 200.0, 50.0], np.float32), 16)  # [96]
    eye = SimpleNamespace(bits=8, group_size=96, perm=None, codes=(np.eye(192) * 127 + 128).astype(np.uint8), zero=np.full((2, 192), 128, np.uint8),
                          scale=np.full((2, 192), 1 / 127, np.float32))  # an identity: gate|up is the input, up to its int8 rounding
    out = session(eye, swiglu=True).run(None, {"x": np.concatenate([g, np.ones(96, np.float32)])[None]})[0][0, :6]
    assert np.abs(out[:2]).max() < 1e-30 and out[2] == 0
    np.testing.assert_allclose(out[3:5], [90, 200], rtol=1e-2)


def swiglu_session(threads: int = 1) -> ort.InferenceSession:
    """One SwiGLU node (x -> y), as plugins/ort_cpu.py writes it after a float engine's gate|up MatMul."""
    return node_session(helper.make_node("SwiGLU", ["x"], ["y"], domain=ck.DOMAIN), ["y"], threads)


@pytest.mark.parametrize("bits", [4, 8])
def test_the_swiglu_op_is_q4gemms_swiglu_bit_for_bit(bits):
    """SwiGLU on a gate|up product gives Q4Gemm's swiglu=1 output of that product bit for bit (one arithmetic, swiglu.c),
    on 1 and 2 threads."""
    w = int_weight(256, 192, 64, True, seed=12, bits=bits)
    x = np.random.default_rng(4).standard_normal((7, 256)).astype(np.float32) * 4
    gate_up = session(w).run(None, {"x": x})[0]
    fused = session(w, swiglu=True).run(None, {"x": x})[0]
    for threads in (1, 2):
        np.testing.assert_array_equal(swiglu_session(threads).run(None, {"x": gate_up})[0], fused)


def swiglu_outputs() -> list[np.ndarray]:
    """SwiGLU of a few shapes: 1-D, rows of widths with an AVX2 tail (I = 13), past a task's 1,024 columns (I = 2,500), 3-D."""
    rng = np.random.default_rng(21)
    sess = swiglu_session(2)
    return [sess.run(None, {"x": (rng.standard_normal(shape) * 6).astype(np.float32)})[0] for shape in ((26,), (5, 26), (3, 5000), (2, 3, 1536))]


def test_the_swiglu_op_is_silu_of_the_gate_times_up():
    """Every shape: [..., I] = silu(x[..., :I]) * x[..., I:] within float rounding of float64."""
    rng = np.random.default_rng(21)
    for y in swiglu_outputs():
        x = (rng.standard_normal(y.shape[:-1] + (2 * y.shape[-1],)) * 6).astype(np.float32).astype(np.float64)
        gate, up = x[..., : y.shape[-1]], x[..., y.shape[-1]:]
        want = gate / (1 + np.exp(-gate)) * up
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-6 * np.abs(want).max())


def test_the_swiglu_op_computes_the_same_bits_on_every_kernel(tmp_path):
    """SPECDEC_Q4_KERNEL=portable (a CPU without AVX2): the same bits as the vector kernel, tails and all."""
    script = (f"import numpy as np, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_cpu_kernels as t; "
              f"np.savez({str(tmp_path / 'y.npz')!r}, *t.swiglu_outputs())")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "SPECDEC_Q4_KERNEL": "portable"})
    slow = np.load(tmp_path / "y.npz")
    for i, y in enumerate(swiglu_outputs()):
        np.testing.assert_array_equal(slow[f"arr_{i}"], y)


def test_the_swiglu_op_refuses_an_odd_width():
    with pytest.raises(Exception, match="last dimension must be even"):
        swiglu_session().run(None, {"x": np.zeros((2, 7), np.float32)})


def outputs_by_rows(bits: int, k: int, group: int, mode: str, x: np.ndarray) -> np.ndarray:
    """Every output of an m-row call, m = 1..len(x), concatenated: plain, split in three, or swiglu."""
    w = int_weight(k, 96, group, mode != "plain", seed=5, bits=bits)
    sess = session(w, 2, splits=[48, 32, 16] if mode == "split" else None, swiglu=mode == "swiglu")
    return np.concatenate([np.concatenate(sess.run(None, {"x": x[:m]}), axis=-1) for m in range(1, len(x) + 1)])


def test_rows_are_the_same_bits_whatever_the_call():
    """Every row of an M-row call (M = 1..37, threads 1 and 2) equals that row computed alone, bit for bit: int4 and
    int8, one output, several, and swiglu."""
    x = np.random.default_rng(4).standard_normal((37, 512)).astype(np.float32)
    cases = [(int4_weight(512, 208, 128, False, seed=3), {}), (int_weight(512, 208, 512, True, seed=3, bits=8), {}),
             (int4_weight(512, 208, 128, True, seed=3), dict(splits=[144, 32, 32])),
             (int_weight(512, 64, 128, False, seed=3, bits=8), dict(swiglu=True))]
    for w, kind in cases:
        one = session(w, 1, **kind)
        alone = np.concatenate([np.concatenate(one.run(None, {"x": x[i : i + 1]}), -1) for i in range(37)])
        for threads in (1, 2):
            sess = session(w, threads, **kind)
            for m in (*range(1, 13), 17, 36, 37):
                np.testing.assert_array_equal(np.concatenate(sess.run(None, {"x": x[:m]}), -1), alone[:m],
                                              err_msg=f"{w.bits} bits {kind}: {m} rows, {threads} threads")


@pytest.mark.parametrize("kernel", ["avx2", "portable"])
@pytest.mark.parametrize("bits,k,group,mode", [(4, 256, 64, "plain"), (4, 240, 24, "split"), (8, 256, 64, "plain"), (8, 240, 240, "split"),
                                               (4, 256, 128, "swiglu"), (8, 240, 24, "swiglu"), (8, 252, 36, "plain")])
# (groups not a multiple of 16: the masked tails; of 36, not of 8: AVX2's quantizer's scalar tail)
def test_every_kernel_computes_the_same_bits(tmp_path, bits, k, group, mode, kernel):
    """SPECDEC_Q4_KERNEL=avx2 | portable runs the kernels a CPU without AVX-512 VNNI (or AVX2) runs: the same bits,
    every row count from 1 to 9 (int4 and int8 weights, several outputs, swiglu's exp)."""
    x = np.random.default_rng(6).standard_normal((9, k)).astype(np.float32) * 3
    x[3, 5], x[5, 70], x[6, :group] = np.inf, np.nan, 1e-38  # non-finite rows and a group too small to scale, alike
    np.save(tmp_path / "x.npy", x)
    fast = outputs_by_rows(bits, k, group, mode, x)
    script = (f"import numpy as np, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_cpu_kernels as t; "
              f"np.save({str(tmp_path / 'y.npy')!r}, t.outputs_by_rows({bits}, {k}, {group}, {mode!r}, np.load({str(tmp_path / 'x.npy')!r})))")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "SPECDEC_Q4_KERNEL": kernel})
    name = subprocess.run([sys.executable, "-c", "from specdec.hardware import cpu_kernels as rk; print(rk.kernel_name(rk.kernel_library()))"],
                          check=True, capture_output=True, text=True, env={**os.environ, "SPECDEC_Q4_KERNEL": kernel}).stdout.strip()
    assert name == {"avx2": "AVX2", "portable": "portable C"}[kernel] or (kernel == "avx2" and name == "portable C")  # (no AVX2 here)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), fast)


def largest_sums_outputs(bits: int, k: int, group: int) -> np.ndarray:
    """Every row count's outputs for the largest codes (15 or 255, zero point 0) against activations that quantize to
    +-127 throughout (a group's every value alike), a whole group's sums as large as they get, and a random row."""
    codes = np.full((k, 32), (1 << bits) - 1, np.uint8)
    w = SimpleNamespace(bits=bits, group_size=group, perm=None, codes=codes, zero=np.zeros((k // group, 32), np.uint8),
                        scale=np.full((k // group, 32), 1e-3, np.float32))
    x = np.stack([np.ones(k), -np.ones(k), np.repeat([1.0, -1.0], k // 2), np.random.default_rng(9).standard_normal(k) * 3]).astype(np.float32)
    sess = session(w, 1)
    return np.concatenate([sess.run(None, {"x": x[:m]})[0] for m in range(1, len(x) + 1)])


@pytest.mark.parametrize("bits,k,group", [(4, 256, 128), (4, 96, 96), (8, 512, 256), (8, 240, 120)])
def test_the_largest_sums_are_exact_on_every_kernel(tmp_path, bits, k, group):
    """The AVX2 kernel adds maddubs' int16 pair sums over several blocks before widening them; at the largest codes and
    activations those sums come closest to int16's limit. Every kernel gives the same bits there, and the right value."""
    fast = largest_sums_outputs(bits, k, group)
    for kernel in ("avx2", "portable"):
        script = (f"import numpy as np, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_cpu_kernels as t; "
                  f"np.save({str(tmp_path / 'y.npy')!r}, t.largest_sums_outputs({bits}, {k}, {group}))")
        subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "SPECDEC_Q4_KERNEL": kernel})
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), fast, err_msg=kernel)
    top = ((1 << bits) - 1) * 127 * k * 1e-3 / 127  # row 0: every group's dot is codes x 127 x group, times amax / 127 = 1 / 127
    rows = fast[-4:]  # the 4-row call's: +top, -top, 0
    np.testing.assert_allclose(rows[:3], np.broadcast_to([[top], [-top], [0]], (3, 32)), rtol=1e-5, atol=1e-5 * top)


# (the library is held open: ONNX Runtime unloads it with the last session that registered it, and its count with it)
COPIED_NODES = ("import ctypes, numpy as np, sys; sys.path.insert(0, {here!r}); import test_cpu_kernels as t; "
                "from specdec.hardware import cpu_kernels as rk; lib = ctypes.CDLL(str(rk.kernel_library())); "
                "np.save({y!r}, t.outputs_by_rows({bits}, {k}, {group}, {mode!r}, np.load({x!r}))); print(lib.specdec_q4_large_page_copies())")


@pytest.mark.parametrize("bits,k,group,mode", [(4, 256, 64, "plain"), (4, 240, 24, "split"), (4, 256, 128, "swiglu"), (8, 256, 64, "plain")])
def test_weights_copied_into_large_pages_give_the_same_bits(tmp_path, bits, k, group, mode):
    """SPECDEC_Q4_LARGE_PAGES=force copies every node's weights, as a node of 2 MiB or more is copied into huge pages, and
    reads one row of int4 as one stream (one tile a pass): the same bits as ONNX Runtime's memory and 4 tiles a pass
    (SPECDEC_Q4_LARGE_PAGES=0), every row count from 1 to 9; and the copy is really what the nodes read."""
    x = np.random.default_rng(8).standard_normal((9, k)).astype(np.float32) * 3
    x[3, 5] = np.inf
    np.save(tmp_path / "x.npy", x)
    outputs, copied = {}, {}
    for mode_env in ("0", "force"):
        y = tmp_path / f"y_{mode_env}.npy"
        script = COPIED_NODES.format(here=os.path.dirname(__file__), bits=bits, k=k, group=group, mode=mode, x=str(tmp_path / "x.npy"), y=str(y))
        done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                              env={**os.environ, "SPECDEC_Q4_LARGE_PAGES": mode_env})
        outputs[mode_env], copied[mode_env] = np.load(y), int(done.stdout.split()[-1])
    assert copied["0"] == 0 and copied["force"] > 0
    np.testing.assert_array_equal(outputs["force"], outputs["0"])


def test_bad_splits_are_one_clear_error():
    w = int4_weight(64, 64, 64, True)
    x = np.zeros((1, 64), np.float32)
    for splits, message in (([32, 16], "do not sum to N"), ([40, 24], "multiple of 16")):
        with pytest.raises(Exception, match=message):
            session(w, splits=splits).run(None, {"x": x})


def test_q4_holds_only_what_the_op_takes():
    assert ck.q4_holds(int4_weight(256, 96, 64, True))
    assert not ck.q4_holds(int4_weight(256, 88, 64, True))  # columns not a multiple of 16
    assert ck.q4_holds(int_weight(256, 96, 64, True, bits=8)) and ck.q4_holds(int_weight(252, 96, 36, True, bits=8))  # int8: groups of 4 rows
    assert not ck.q4_holds(SimpleNamespace(**{**vars(int4_weight(256, 96, 64, True)), "bits": 2}))
    assert not ck.q4_holds(int4_weight(252, 96, 36, True))  # groups of 36 rows: not a multiple of 8
    # groups of 256 over 1920 rows: 8 groups, the last one 128 rows short. 1920 / 8 = 240 would pack every group as
    # 240 rows, the wrong rows under each scale: refused
    ragged = int4_weight(2048, 32, 256, True)
    ragged.codes, ragged.group_size = ragged.codes[:1920], 256
    assert not ck.q4_holds(ragged)


def test_nonfinite_activations_give_nan_rows(tmp_path):
    """An inf or NaN in a row makes that row's outputs NaN (it is not rounded into finite codes), and a group too small
    to scale (amax below ~4e-37) contributes nothing; the other rows are untouched."""
    w = int4_weight(256, 32, 64, False, seed=7)
    x = np.random.default_rng(8).standard_normal((4, 256)).astype(np.float32)
    x[1, 5], x[2, 70], x[3, 64:128] = np.inf, np.nan, 1e-38
    y = session(w).run(None, {"x": x})[0]
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all() and np.isfinite(y[[0, 3]]).all()
    x3 = x[3].copy()
    x3[64:128] = 0
    np.testing.assert_array_equal(y[3], session(w).run(None, {"x": x3[None]})[0][0])
    np.testing.assert_array_equal(y[0], session(w).run(None, {"x": x[:1]})[0][0])


def test_no_compiler_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(rk.KernelBuildError, match="no C compiler"):
        rk.build_library(tmp_path / rk.LIBRARY)
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("fails", ["q8_kernels.c", "the link"])
def test_a_compiler_that_fails_on_one_file_is_one_error_naming_it(tmp_path, monkeypatch, fails):
    """The sources compile in processes of their own: one that fails is the error, with its command and the compiler's
    words, and nothing is linked or left behind (no objects, no library). The stand-in compiler writes an empty output
    for every other command (what it compiles is not the point: the real compiler's runs are the tests above)."""
    cc = tmp_path / "bin" / "cc"
    cc.parent.mkdir()
    trigger = '*" -shared "*' if fails == "the link" else f"*{fails}*"
    cc.write_text(f'#!/bin/sh\ncase " $* " in {trigger}) echo "cc: it broke here" >&2; exit 1;; esac\n'
                  'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && : > "$2"; shift; done\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the objects go: to see that none are left
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(rk.KernelBuildError) as err:
        rk.build_library(out / rk.LIBRARY)
    message = str(err.value)
    assert "cc: it broke here" in message and "\n" not in message
    if fails == "the link":
        assert " -shared " in message and " -c " not in message
    else:  # that file's command, not the link's
        assert f"{fails}.o " in message and " -shared " not in message
    assert not list(out.iterdir()) and not list((tmp_path / "tmp").iterdir())  # nothing half-written: no library, no objects


def test_the_library_is_compiled_once_into_a_private_cache(tmp_path, monkeypatch):
    """... and the compile is announced before it starts (the CLIs print the note: a first use waits 10-20 s), the reuse not."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    notes: list[str] = []
    monkeypatch.setattr(rk, "compile_note", notes.append)
    lib = rk.kernel_library()
    assert lib.parent == tmp_path / "kernels" / rk.source_digest() and (lib.parent.stat().st_mode & 0o077) == 0
    assert len(notes) == 1 and notes[0].startswith("compiling specdec's CPU kernels for this host") and str(lib.parent) in notes[0]
    mtime = lib.stat().st_mtime_ns
    assert rk.kernel_library() == lib and lib.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert len(notes) == 1
    with pytest.raises(rk.KernelBuildError, match="layout is 0, this specdec's is 2: rebuild"):
        rk.kernel_library(0)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from checkpoints import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("q4ck") / "ckpt", num_hidden_layers=1, hidden_size=64, intermediate_size=128)


@pytest.mark.parametrize("flags,expected", [
    (("--qformat", "int4_wo", "--lowering", "portable"), "an op of the ort_cpu lowering"),
    (("--lowering", "portable"), "an op of the ort_cpu lowering"),
])
def test_cpu_kernels_specdec_is_refused_where_it_does_not_apply(tiny_checkpoint, tmp_path, flags, expected):
    from conftest import cli_build

    r = cli_build(tiny_checkpoint, tmp_path / "e", "--cpu_kernels", "specdec", *flags)
    assert r.exit_code != 0 and expected in r.output and "Traceback" not in r.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("qformat", ["none", "fp8"])
def test_a_float_tree_engine_takes_cached_attention_with_its_tree_mask(tiny_checkpoint, tmp_path, qformat):
    """A float (or FP8) engine that verifies trees: its attention on RotaryCachedAttention fed the tree_mask input, no ONNX
    Attention or mask nodes (tests/runtime/test_cached_attention_engine.py checks its trees' bits)."""
    import onnx
    from conftest import cli_build

    r = cli_build(tiny_checkpoint, tmp_path / "e", "--cpu_kernels", "specdec", "--qformat", qformat, "--speculative_decoding_mode",
                  "draft_tokens_external", "--max_draft_len", "4", "--tree_attention")
    assert r.exit_code == 0, r.output
    graph = onnx.load(str(tmp_path / "e" / "model.onnx"), load_external_data=False).graph
    nodes = [n for n in graph.node if n.op_type == "RotaryCachedAttention"]
    assert len(nodes) == 1 and nodes[0].input[-1] == "tree_mask" and "tree_mask" in [i.name for i in graph.input]
    assert not {"Attention", "GatherElements"} & {n.op_type for n in graph.node}


@pytest.mark.parametrize("qformat", ["none", "fp8"])
def test_a_float_engine_takes_cached_attention(tiny_checkpoint, tmp_path, qformat):
    """--cpu_kernels specdec on a float (or FP8, folded to float32 on the CPU) chain engine: its attention on RotaryCachedAttention,
    its MatMuls ONNX Runtime's, no weight-only record; the runtime opens it."""
    import onnx
    from conftest import cli_build

    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    r = cli_build(tiny_checkpoint, tmp_path / "e", "--cpu_kernels", "specdec", "--qformat", qformat)
    assert r.exit_code == 0, r.output
    ops = [n.op_type for n in onnx.load(str(tmp_path / "e" / "model.onnx"), load_external_data=False).graph.node]
    assert ops.count("RotaryCachedAttention") == 1 and "Attention" not in ops
    engine = load_engine_dir(tmp_path / "e")
    assert engine.config.build.cpu_kernels == "specdec" and engine.config.build.weight_only is None
    ex = OrtExecutor(engine, num_threads=1)
    assert ex.forward(ex.new_cache(1), [[3, 4, 5]], all_logits=False).logits.shape == (1, 1, ex.vocab_size)


def test_cpu_kernels_specdec_without_a_compiler_is_refused_before_any_work(tiny_checkpoint, tmp_path, monkeypatch):
    from conftest import cli_build

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))  # nothing compiled yet
    r = cli_build(tiny_checkpoint, tmp_path / "e", "--cpu_kernels", "specdec", "--qformat", "int4_wo")
    assert r.exit_code != 0 and "found no C compiler" in r.output and "--cpu_kernels ort" in r.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("qformat", ["int4_wo", "int8_wo"])
def test_the_build_says_which_kernel_it_compiled(tiny_checkpoint, tmp_path, qformat):
    from conftest import cli_build

    r = cli_build(tiny_checkpoint, tmp_path / "e", "--cpu_kernels", "specdec", "--qformat", qformat, "--group_size", "32")
    assert r.exit_code == 0, r.output
    same = cli_build(tiny_checkpoint, tmp_path / "m", "--qformat", qformat, "--group_size", "32")  # MatMulNBits

    def params(out: str) -> str:
        return out.split("LlamaForCausalLM, ")[1].split(" params")[0]

    assert params(r.output) == params(same.output)  # the packed weights counted by their [in, out] in both
    assert f"compiled specdec's int4/int8 CPU kernels ({rk.kernel_name(rk.kernel_library())}" in r.output


# -- the cache: checked before anything is loaded from it ---------------------------------------------------------------
PROBE = "from specdec.hardware import cpu_kernels as rk; lib = rk.kernel_library(); print(rk.kernel_name(lib))"


def probe(cache, **env):
    """kernel_library() and a call into the library, in a child process: a SIGBUS there must not take the tests down."""
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, "SPECDEC_CACHE_DIR": str(cache), **env})


def damage_in_place(lib, data: bytes) -> None:
    """Put ``data`` where the cached library is, as a new file: this process may have the old one mapped (an in-process
    build loaded it), and truncating a mapped file is a SIGBUS for whoever touches its pages next (pytest, at exit)."""
    tmp = lib.with_name(lib.name + ".damaged")
    tmp.write_bytes(data)
    os.replace(tmp, lib)


def cached(cache):
    return cache / "kernels" / rk.source_digest() / rk.LIBRARY


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A cache holding the library that kernel_library() compiled, and the kernel name a call into it printed: compiled
    once for the tests below, each of which damages a copy of it (a compile is most of a test's time)."""
    cache = tmp_path_factory.mktemp("kernels") / "cache"
    first = probe(cache)
    assert first.returncode == 0, first.stderr
    return SimpleNamespace(cache=cache, name=first.stdout)


def copy_of(compiled, tmp_path):
    """A cache of one's own, holding ``compiled``'s library and manifest (as written: bytes and modes)."""
    import shutil

    return Path(shutil.copytree(compiled.cache, tmp_path / "cache"))


def foreign_library(tmp_path):
    """A valid shared library of someone else's: no RegisterCustomOps, no specdec_q4_kernel_name."""
    (tmp_path / "other.c").write_text("int other_symbol(void) { return 7; }\n")
    subprocess.run([rk.compiler(), "-shared", "-fPIC", "-o", str(tmp_path / "other.so"), str(tmp_path / "other.c")], check=True)
    return (tmp_path / "other.so").read_bytes()


@pytest.mark.parametrize("damage", ["cut short", "another library", "another library, its manifest forged", "no manifest", "a manifest of junk"])
def test_a_cache_entry_that_is_not_what_was_compiled_is_compiled_again(compiled, tmp_path, damage):
    cache = copy_of(compiled, tmp_path)
    assert rk.check_cached(cached(cache)) is None
    lib, manifest = cached(cache), cached(cache).parent / rk.MANIFEST
    good = lib.read_bytes()
    if damage == "cut short":  # a copy or a disk that ran out mid-write: loading it was a SIGBUS
        damage_in_place(lib, good[: len(good) // 3])
    elif damage.startswith("another library"):
        damage_in_place(lib, foreign_library(tmp_path))
        if "forged" in damage:
            import hashlib
            import json

            data = lib.read_bytes()
            manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    elif damage == "no manifest":
        manifest.unlink()
    else:
        manifest.write_text("{not json")
    again = probe(cache)
    assert again.returncode == 0 and again.stdout == compiled.name, again.stderr
    assert lib.read_bytes() == good and rk.check_cached(lib) is None
    assert sorted(p.name for p in lib.parent.iterdir()) == sorted([rk.LIBRARY, rk.MANIFEST])  # no temporary left


def test_a_bad_cache_entry_that_cannot_be_compiled_again_is_one_line(compiled, tmp_path):
    cache = copy_of(compiled, tmp_path)
    lib = cached(cache)
    damage_in_place(lib, lib.read_bytes()[:1000])
    r = probe(cache, CC=str(tmp_path / "no-such-cc"))
    assert r.returncode == 1 and r.stderr.count("\n") >= 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("specdec.hardware.cpu_kernels.KernelBuildError: the cached int4 CPU kernel")
    assert "1000 bytes" in last and "no C compiler" in last


@pytest.mark.parametrize("tool", ["specdec-build", "specdec-run"])
def test_the_clis_meet_a_cut_short_cache_entry_with_a_rebuild_or_one_line(compiled, tiny_checkpoint, tmp_path, monkeypatch, tool):
    """specdec-build and specdec-run in a child process each (a SIGBUS would be its exit status): they compile the kernel
    again, or, with no compiler, refuse in one line and leave no engine or temporary behind."""
    from conftest import cli_build

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(copy_of(compiled, tmp_path)))
    engine = tmp_path / "engine"
    assert cli_build(tiny_checkpoint, engine, "--cpu_kernels", "specdec", "--qformat", "int4_wo", "--group_size", "32").exit_code == 0
    lib = cached(tmp_path / "cache")
    cut = lib.read_bytes()[:4096]
    if tool == "specdec-build":
        cmd = ["specdec-build", "--model_dir", str(tiny_checkpoint), "--output_dir", str(tmp_path / "again"), "--max_seq_len", "96",
               "--max_input_len", "48",
               "--cpu_kernels", "specdec", "--qformat", "int4_wo", "--group_size", "32"]
        outputs = [tmp_path / "again"]
    else:
        cmd = ["specdec-run", "--engine_dir", str(engine), "--input_file", str(tmp_path / "p.csv"), "--max_output_len", "3"]
        (tmp_path / "p.csv").write_text("1,5,6,7\n")
        outputs = []
    bin_dir = os.path.dirname(sys.executable)
    for cc in (None, str(tmp_path / "no-such-cc")):
        damage_in_place(lib, cut)
        env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path / "cache"), **({"CC": cc} if cc else {})}
        r = subprocess.run([os.path.join(bin_dir, cmd[0]), *cmd[1:]], capture_output=True, text=True, env=env)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (r.returncode, r.stderr)
        if cc is None:
            assert r.returncode == 0, r.stderr
            assert rk.check_cached(lib) is None
            notes = [line for line in r.stderr.splitlines() if line.startswith("note: compiling specdec's CPU kernels again")]
            assert len(notes) == 1 and "4096 bytes" in notes[0], r.stderr  # said before the wait, with why
            for out in outputs:
                import shutil

                shutil.rmtree(out)
        else:
            errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
            assert r.returncode == 1 and len(errors) == 1 and "no C compiler" in errors[0], r.stderr
            assert "note: compiling" not in r.stderr  # nothing announced that cannot start
            assert tool == "specdec-build" or "not what specdec compiled" in errors[0]  # (the build asks for a compiler before any work)
        for out in outputs:
            assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
