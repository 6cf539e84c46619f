"""The sampler's cost per row at real vocabulary sizes: runtime/sampling.py's processed_probs and one draw, against
the whole-vocabulary version it replaced (``whole_vocabulary_probs``: every setting applied to every token, top-p by a
stable sort of the whole row), side by side, interleaved, repeated.

A sampled request pays this for every row the target verifies until the first rejection, and a drafter that samples
(a draft model with use_logits, Medusa, EAGLE, P-EAGLE) once more per draft. The demo pair's vocabulary is 4,096
tokens; Llama 3's is 128,256 and Qwen's 151,936, where a whole-vocabulary sort for top-p costs about a CPU step of a
1.5B int4 model. The rows are synthetic (no model hub here), in three shapes: ``zipf`` (probability falling as
rank^-1.1, as next-token distributions of text roughly do), ``peaked`` (a few likely tokens: code, a confident model)
and ``flat`` (logits of unit spread: the worst case for top-p, which then keeps most of the vocabulary).

    python benchmarks/bench_sampling.py --output_json sampling.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from specdec.runtime.sampling import SamplingConfig, draw, processed_probs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host  # noqa: E402  (beside this script)

SETTINGS = {
    "temperature 0.7": SamplingConfig(temperature=0.7),
    "top_p 0.9, temperature 0.6 (Llama 3's defaults)": SamplingConfig(temperature=0.6, top_p=0.9),
    "top_p 0.95, temperature 0.7": SamplingConfig(temperature=0.7, top_p=0.95),
    "top_k 50": SamplingConfig(temperature=1.0, top_k=50),
    "top_k 20, top_p 0.8, temperature 0.7 (Qwen's defaults)": SamplingConfig(temperature=0.7, top_k=20, top_p=0.8),
    "min_p 0.05": SamplingConfig(temperature=1.0, min_p=0.05),
}


def whole_vocabulary_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """[rows, vocab] -> [rows, vocab]: temperature, top-k, min-p and top-p, each applied to every token and renormalized;
    top-p by a stable sort of the whole row (ties in id order). What processed_probs computed before it carried the
    possible tokens as indices; tests/runtime/test_sampling.py holds it to this definition."""
    x = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        out = np.zeros_like(x)
        out[np.arange(len(x)), x.argmax(axis=-1)] = 1.0
        return out
    with np.errstate(over="ignore"):
        x = (x - x.max(axis=-1, keepdims=True)) / cfg.temperature
    if 0 < cfg.top_k < x.shape[-1]:
        kth = np.partition(x, -cfg.top_k, axis=-1)[:, -cfg.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if cfg.min_p > 0.0:
        p = np.where(p < cfg.min_p * p.max(axis=-1, keepdims=True), 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    if 0.0 < cfg.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        drop_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) >= cfg.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def make_rows(shape: str, vocab: int, n: int, seed: int) -> np.ndarray:
    """n rows [n, vocab] float32 of one shape (the module docstring)."""
    rng = np.random.default_rng(seed)
    rows = np.empty((n, vocab), np.float32)
    for i in range(n):
        if shape == "zipf":
            logits = -1.1 * np.log(np.arange(1, vocab + 1)) + rng.normal(0, 0.3, vocab)
        elif shape == "peaked":
            logits = rng.normal(0, 1.0, vocab)
            logits[rng.choice(vocab, 4, replace=False)] += [14.0, 12.0, 11.0, 10.0]
        else:
            logits = rng.normal(0, 1.0, vocab)
        rows[i] = rng.permutation(logits)  # the likely tokens anywhere in the vocabulary
    return rows


def time_rows(fn, rows: np.ndarray, cfg: SamplingConfig) -> float:
    """Mean ms per row of fn's probabilities and one draw from them."""
    t0 = time.perf_counter()
    for j, row in enumerate(rows):
        draw(fn(row[None], cfg)[0], (j + 0.5) / len(rows))
    return (time.perf_counter() - t0) * 1e3 / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocabs", default="32000,128256,151936", help="vocabulary sizes, comma-separated")
    ap.add_argument("--shapes", default="zipf,peaked,flat", help="row shapes (the module docstring)")
    ap.add_argument("--rows", type=int, default=16, help="rows per timing")
    ap.add_argument("--rounds", type=int, default=5, help="timings per pair, the two versions interleaved")
    ap.add_argument("--output_json", default=None)
    args = ap.parse_args()
    results = []
    print(f"{'vocab':>7} {'shape':<7} {'setting':<56} {'before ms':>10} {'now ms':>8} {'speedup':>18} {'kept':>7}")
    for vocab in [int(v) for v in args.vocabs.split(",")]:
        for shape in args.shapes.split(","):
            rows = make_rows(shape, vocab, args.rows, seed=vocab)
            for name, cfg in SETTINGS.items():
                kept = int(np.median([(processed_probs(r[None], cfg) > 0).sum() for r in rows]))
                before, now = [], []
                time_rows(processed_probs, rows[:2], cfg)  # warm
                for i in range(args.rounds):
                    pair = [(whole_vocabulary_probs, before), (processed_probs, now)]
                    for fn, out in pair if i % 2 == 0 else pair[::-1]:
                        out.append(time_rows(fn, rows, cfg))
                ratios = sorted(b / n for b, n in zip(before, now, strict=True))
                row = {"vocab": vocab, "shape": shape, "setting": name, "before_ms": statistics.median(before),
                       "now_ms": statistics.median(now), "speedup": statistics.median(ratios), "speedup_range": [ratios[0], ratios[-1]],
                       "kept_tokens_median": kept}
                results.append(row)
                spread = f"{row['speedup']:.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
                print(f"{vocab:>7} {shape:<7} {name:<56} {row['before_ms']:>10.2f} {row['now_ms']:>8.2f} {spread:>18} {kept:>7}", flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"host": host.host_record(bandwidth=False), "load_average": os.getloadavg(), "rows_per_timing": args.rows,
                       "rounds": args.rounds, "results": results}, f, indent=1)
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
