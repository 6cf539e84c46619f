"""Prefill time of an N-token prompt on each engine (the call that returns the prompt's last logits), engines
interleaved round by round (the order reversed every other round), after one warm-up call each: thread CPU seconds and
wall seconds, median [min-max].

    python benchmarks/bench_prefill.py --tokens 1000 --rounds 3 --threads 1 \\
        --engine /tmp/t1b5-onnxattn --engine /tmp/t1b5-cachedattn --output_json prefill.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import host
from bench_steps import open_executor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", action="append", required=True, help="an engine directory (repeatable)")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output_json")
    args = ap.parse_args(argv)
    opened = [(e, open_executor(Path(e), args.threads)) for e in args.engine]
    prompt = [[5 + (i * 37) % 3000 for i in range(args.tokens)]]
    times: dict[str, dict[str, list[float]]] = {e: {"cpu_s": [], "wall_s": []} for e in args.engine}
    for _, ex in opened:  # the first call of a shape pays ONNX Runtime's setup for it
        ex.forward(ex.new_cache(1), prompt, all_logits=False)
    for r in range(args.rounds):
        for e, ex in opened if r % 2 == 0 else opened[::-1]:
            cache = ex.new_cache(1)
            cpu, wall = time.process_time(), time.perf_counter()
            ex.forward(cache, prompt, all_logits=False)
            times[e]["cpu_s"].append(time.process_time() - cpu)
            times[e]["wall_s"].append(time.perf_counter() - wall)
    for e, t in times.items():
        c, w = t["cpu_s"], t["wall_s"]
        print(f"{e}: prefill of {args.tokens} tokens, {args.threads} thread(s): CPU {statistics.median(c):.2f} s [{min(c):.2f}-{max(c):.2f}], "
              f"wall {statistics.median(w):.2f} s [{min(w):.2f}-{max(w):.2f}]")
    if args.output_json:
        out = {"host": host.host_record(bandwidth=False), "tokens": args.tokens, "threads": args.threads, "rounds": args.rounds, "results": times}
        Path(args.output_json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
