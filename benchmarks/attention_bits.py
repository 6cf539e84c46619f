"""Not a benchmark: CachedAttention's outputs from two builds of specdec_cpu_kernels.so, compared bit for bit.

A change to the attention kernels must keep every (token, head) output's bits (docs/precision.md); the tests pin bit
identity within one build (across calls, threads and kernels), this pins it across builds: the installed sources'
library (or --library) against an earlier one, e.g. main's, built as docs/benchmarks.md says. Each library runs in its
own process (both register the same op domain) on the same random problems: GQA/MHA/MQA shapes, head dims 128, 64, 32
and ones with a 16-lane tail, 1-9 tokens, 1-3 rows at ragged positions up to --capacity, 1 and 2 threads.

    python benchmarks/attention_bits.py --earlier /tmp/main.so            # exit status 1 on any differing bit
    SPECDEC_Q4_KERNEL=avx2 python benchmarks/attention_bits.py --earlier /tmp/main.so
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SHAPES = [(12, 2, 128), (32, 16, 32), (14, 2, 64), (16, 4, 64), (8, 8, 32), (5, 1, 128), (6, 3, 96), (4, 2, 40), (3, 1, 20)]


def problems(capacity: int, seed: int):
    """(shape, threads, q, k, v, pos): each shape at 1-3 rows x 1-9 tokens, positions ragged, values of several scales."""
    rng = np.random.default_rng(seed)
    for heads, kv_heads, hd in SHAPES:
        for batch, tokens in ((1, 1), (1, 5), (2, 2), (3, 9), (1, 8)):
            scale = float(rng.choice([0.3, 2.0, 8.0]))
            q = (rng.standard_normal((batch, tokens, heads * hd)) * scale).astype(np.float32)
            k = rng.standard_normal((batch, capacity, kv_heads * hd)).astype(np.float32)
            v = rng.standard_normal((batch, capacity, kv_heads * hd)).astype(np.float32)
            starts = rng.integers(0, capacity - tokens + 1, batch)
            pos = (starts[:, None] + np.arange(tokens)[None]).astype(np.int64)
            for threads in (1, 2):
                yield (heads, kv_heads, hd), threads, q, k, v, pos


def run_library(library: str, capacity: int, seed: int, out: str) -> None:
    """This process: every problem through one CachedAttention node registered from `library`; the outputs to `out`."""
    import onnxruntime as ort

    from specdec.plugins import cpu_kernels as ck

    results = {}
    for i, ((heads, kv_heads, _), threads, q, k, v, pos) in enumerate(problems(capacity, seed)):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.register_custom_ops_library(library)
        sess = ort.InferenceSession(ck.cached_attention_model(heads, kv_heads), so, providers=["CPUExecutionProvider"])
        results[f"p{i}"] = sess.run(None, {"q": q, "k": k, "v": v, "pos": pos})[0]
    np.savez(out, **results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--earlier", required=True, help="the other build of specdec_cpu_kernels.so (e.g. main's)")
    ap.add_argument("--library", help="this build (default: the installed sources', compiled as the engines do)")
    ap.add_argument("--capacity", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--_run", nargs=2, metavar=("LIBRARY", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._run:
        run_library(args._run[0], args.capacity, args.seed, args._run[1])
        return 0
    if args.library is None:
        from specdec.hardware import cpu_kernels
        args.library = str(cpu_kernels.kernel_library())
    with tempfile.TemporaryDirectory() as tmp:
        outs = []
        for label, lib in (("this", args.library), ("earlier", args.earlier)):
            out = os.path.join(tmp, f"{label}.npz")
            subprocess.run([sys.executable, __file__, "--earlier", args.earlier, "--capacity", str(args.capacity),
                            "--seed", str(args.seed), "--_run", str(Path(lib).resolve()), out], check=True)
            outs.append(np.load(out))
        cases = list(problems(args.capacity, args.seed))
        differ = 0
        for i, (shape, threads, q, *_rest) in enumerate(cases):
            a, b = outs[0][f"p{i}"], outs[1][f"p{i}"]
            if a.shape != b.shape or a.tobytes() != b.tobytes():
                differ += 1
                print(f"DIFFERS: heads/kv/hd {shape}, {threads} thread(s), q {q.shape}")
    kernel = os.environ.get("SPECDEC_Q4_KERNEL", "the CPU's best")
    print(f"{len(cases) - differ} of {len(cases)} calls the same bits ({kernel} kernel): {args.library} against {args.earlier}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
