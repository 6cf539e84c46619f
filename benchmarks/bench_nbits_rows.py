"""MatMulNBits per row count: what one call of M rows costs, and whether its rows equal one-row calls.

    python benchmarks/bench_nbits_rows.py --threads 1 --rows 1,2,3,5,6,9,10
    python benchmarks/bench_nbits_rows.py --shapes 1024x2048,1024x6656 --bits 4 --blocks 128,32

For each GEMM shape (K x N), bit width, block size and accuracy level: the
median CPU time (with one thread, the steadier measure on a shared machine)
and wall time of one call with M rows, interleaved over rounds, as a ratio to
the one-row call; and whether every row of an M-row call has the same bits as
that row computed alone (M = 1) or, failing that, as the row in a two-row call
(what the even-row padding of plugins/quantized_gemm.py buys). The default
shapes are the 325M enlarged target's (benchmarks/enlarge.py): q|k|v, o,
gate|up and down.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

DEFAULT_SHAPES = "1024x2048,1024x1024,1024x6656,3328x1024"


def nbits_model(k: int, n: int, bits: int, block: int, level: int, copies: int, rng: np.random.Generator) -> bytes:
    """``copies`` MatMulNBits nodes on one input, x [M, K] -> y_i [M, N], each with its own random symmetric
    codes and scales: enough copies and the weights outgrow the caches, as a whole model's do."""
    k_blocks = -(-k // block)
    nodes, outputs, weights = [], [], []
    for i in range(copies):
        codes = rng.integers(0, 1 << bits, size=(n, k_blocks * block), dtype=np.uint8)
        packed = (codes[:, 0::2] & 0xF) | (codes[:, 1::2] << 4) if bits == 4 else codes
        b = packed.reshape(n, k_blocks, block * bits // 8)
        scales = (rng.random(n * k_blocks, dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
        nodes.append(helper.make_node("MatMulNBits", ["x", f"b{i}", f"scales{i}"], [f"y{i}"], domain="com.microsoft",
                                      K=k, N=n, bits=bits, block_size=block, accuracy_level=level))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
        weights += [helper.make_tensor(f"b{i}", TensorProto.UINT8, b.shape, b.tobytes(), raw=True),
                    helper.make_tensor(f"scales{i}", TensorProto.FLOAT, scales.shape, scales.tobytes(), raw=True)]
    graph = helper.make_graph(nodes, "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])], outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def session(model: bytes, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def rows_agree(sess: ort.InferenceSession, x: np.ndarray, m: int) -> tuple[bool, bool]:
    """(rows of an m-row call == the same rows alone, == the same rows each in a two-row call (even m only:
    an odd count is padded to even first, so its last row is never computed alone))."""
    full = sess.run(None, {"x": x[:m]})[0]
    alone = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(m)])
    if m % 2:
        return bool(np.array_equal(full, alone)), True
    paired = np.concatenate([sess.run(None, {"x": np.stack([x[i], np.zeros_like(x[i])])})[0][:1] for i in range(m)])
    return bool(np.array_equal(full, alone)), bool(np.array_equal(full, paired))


def time_calls(sess: ort.InferenceSession, x: np.ndarray, rows: list[int], rounds: int, calls: int) -> dict[int, dict[str, float]]:
    """Median seconds per call for each row count, the row counts interleaved in every round."""
    cpu: dict[int, list[float]] = {m: [] for m in rows}
    wall: dict[int, list[float]] = {m: [] for m in rows}
    for m in rows:  # first call of a shape: allocations
        sess.run(None, {"x": x[:m]})
    for _ in range(rounds):
        for m in rows:
            feed = {"x": x[:m]}
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(calls):
                sess.run(None, feed)
            cpu[m].append((time.process_time() - c0) / calls)
            wall[m].append((time.perf_counter() - w0) / calls)
    return {m: {"cpu": statistics.median(cpu[m]), "wall": statistics.median(wall[m]), "cpu_min": min(cpu[m]), "cpu_max": max(cpu[m])}
            for m in rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of KxN")
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--blocks", default="128,64,32")
    ap.add_argument("--levels", default="4")
    ap.add_argument("--rows", default="1,2,3,5,6,9,10")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--copies", type=int, default=24, help="weights per call (the enlarged target has 24 layers)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import host

    print("machine:", host.describe(host.host_record(bandwidth=False)))
    rng = np.random.default_rng(0)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s), median of {args.rounds} rounds x {args.calls} calls; "
          f"{args.copies} weights a call; ratio = CPU time of M rows / CPU time of 1 row")
    print(f"{'K x N':>12} {'bits':>4} {'block':>5} {'lvl':>3}  {'1 row ms':>8}  " + "  ".join(f"{'M=' + str(m):>6}" for m in rows)
          + "   rows == alone / == paired")
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        x = rng.standard_normal((max(rows), k)).astype(np.float32)
        for bits in (int(b) for b in args.bits.split(",")):
            for block in (int(b) for b in args.blocks.split(",")):
                for level in (int(v) for v in args.levels.split(",")):
                    sess = session(nbits_model(k, n, bits, block, level, args.copies, rng), args.threads)
                    agree = [rows_agree(sess, x, m) for m in rows if m > 1]
                    t = time_calls(sess, x, rows, args.rounds, args.calls)
                    one = t[rows[0]]["cpu"]
                    alone = all(a for a, _ in agree)
                    paired = all(p for _, p in agree)
                    print(f"{shape:>12} {bits:>4} {block:>5} {level:>3}  {one * 1e3 / args.copies:8.3f}  "
                          + "  ".join(f"{t[m]['cpu'] / one:6.2f}" for m in rows) + f"   {alone!s:>5} / {paired!s:>5}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
