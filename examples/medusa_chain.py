#!/usr/bin/env python3
"""Medusa chain drafting on the demo target: build the heads into an engine, decode, compare with target-only.

Takes the Medusa heads examples/train_heads.py wrote (OUTPUT_DIR/medusa) and its held-out prompts
(OUTPUT_DIR/data/eval_prompts.answers.jsonl), builds a --speculative_decoding_mode medusa target
(float32, batch 1), and decodes each prompt alone, target-only and with Medusa chains of 1..heads
drafts, repeated in turn; prints whether the outputs are identical, tokens/s (median and range),
the speedup over the median target-only time, and the acceptance. Example::

    python examples/train_heads.py --output-dir /tmp/heads --threads 2 --minutes 1.5
    python examples/medusa_chain.py --heads-dir /tmp/heads --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specdec.builder.build import build_engine
from specdec.formats.engine_format import BuildConfig, load_engine_dir
from specdec.formats.heads import load_heads
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.medusa import MedusaProposer
from specdec.runtime.request import GenerationConfig

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads-dir", type=Path, required=True, help="train_heads.py's --output-dir")
    p.add_argument("--target", type=Path, default=HERE / "demo-pair" / "target")
    p.add_argument("--engine-dir", type=Path, default=Path("/tmp/medusa-chain-engine"))
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-output-len", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    heads = args.heads_dir / "medusa"
    num_heads = load_heads(heads).num_heads
    build = BuildConfig(max_batch_size=1, max_input_len=256, max_seq_len=512, max_draft_len=num_heads, speculative_decoding_mode="medusa",
                        dtype="float32")
    build_engine(args.target, args.engine_dir, build, force=True, say=lambda _: None, medusa_dir=heads)
    target = OrtExecutor(load_engine_dir(args.engine_dir), num_threads=args.threads)
    records = [json.loads(line) for line in (args.heads_dir / "data" / "eval_prompts.answers.jsonl").open()][: args.prompts]
    prompts = [r["input_ids"][: r["prompt_len"]] for r in records]

    def run(method: str, k: int):
        engine = Engine(target, [MedusaProposer(target)], SpeculationConfig(method, k))
        outs, t0 = [], time.perf_counter()
        for prompt in prompts:  # one at a time: batch 1
            engine.add_request(prompt, GenerationConfig(max_output_len=args.max_output_len))
            while engine.has_unfinished():
                outs += [o.output_ids for o in engine.step() if o.finished]
        return outs, time.perf_counter() - t0, engine.stats

    configs = [("none", 0)] + [("medusa", k) for k in range(1, num_heads + 1)]
    runs: dict = {}
    for _ in range(args.repeat):
        for m, k in configs:
            runs.setdefault((m, k), []).append(run(m, k))
    base = runs[("none", 0)][0][0]
    tokens = sum(map(len, base))
    t_base = statistics.median(dt for _, dt, _ in runs[("none", 0)])
    print(f"{len(prompts)} prompts, {tokens} tokens, {args.repeat} runs each, {args.threads} threads")
    print(f"target-only      {tokens / t_base:7.1f} tok/s")
    for m, k in configs[1:]:
        r = runs[(m, k)]
        dt, s = statistics.median(d for _, d, _ in r), r[0][2]
        rates = [tokens / d for _, d, _ in r]
        print(f"medusa k={k}       {tokens / dt:7.1f} tok/s ({min(rates):.0f}-{max(rates):.0f})  {t_base / dt:.2f}x  "
              f"identical={all(o == base for o, _, _ in r)}  accepted {s.accepted}/{s.drafted} drafts  "
              f"mean acceptance length {1 + s.accepted / max(1, s.rounds):.2f}")


if __name__ == "__main__":
    main()
