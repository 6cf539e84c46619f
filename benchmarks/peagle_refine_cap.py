"""--peagle_refine auto with the most refining calls auto may make capped at 3 against 7, side by side (issue 43).

    python benchmarks/peagle_refine_cap.py --engine /tmp/big/engine-refine0 --rounds 3 --json peagle-325m-refine-auto-cap.json

A P-EAGLE target whose module was trained to read its drafts (the 325M pair: enlarge.py --heads on
examples/demo-pair/heads/peagle-refine). Batches 1 and 4 of bench_heads.py's 4 ordinary and 4 copy-heavy prompts, 48 new
tokens each; target-only and --peagle_refine auto with draft_len=auto and with k = 4 at each cap, a warm-up as
bench_heads.py's, then --rounds rounds, the methods interleaved (reversed every other round): speedup over the
target-only run of the same round, median (min-max). Greedy; each method's outputs are checked against target-only's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import workloads  # noqa: E402

from specdec.formats.engine_format import load_engine_dir  # noqa: E402
from specdec.runtime.loading import load_engine  # noqa: E402
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator  # noqa: E402
from specdec.runtime.proposers.peagle import PEagleProposer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, help="a --speculative_decoding_mode peagle target with a refining module")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    base = load_engine(load_engine_dir(args.engine), num_threads=args.threads)
    prompts, subsets = workloads(Path(args.engine), 4, 96)
    order = [i for pair in zip(subsets["ordinary"], subsets["copy-heavy"], strict=False) for i in pair]
    module = base.proposers["peagle"].module

    def refining(cap: int, k: int | str) -> Orchestrator:
        proposer = PEagleProposer(base.target, module, refine="auto")
        proposer.refine = proposer.auto_refine_calls = cap  # auto's most calls (the Engine reads it when it is made)
        return Orchestrator(base.target, proposer, draft_len=k)

    res: dict[str, dict] = {}
    for b in (1, 4):
        methods = {"target-only": Orchestrator(base.target)}
        methods.update({f"k={k} cap {cap}": refining(cap, k) for k in ("auto", 4) for cap in (3, 7)})
        batches = [[prompts[j] for j in order[i : i + b]] for i in range(0, len(order), b)]
        for m in methods.values():  # warm-up: each call shape's first call pays its setup
            for batch in batches:
                m.generate([p[:16] for p in batch], GenerationConfig(max_output_len=8))
        cfg = GenerationConfig(max_output_len=48)
        times: dict[str, list[float]] = {n: [] for n in methods}
        outputs: dict[str, list[list[int]]] = {}
        for r in range(args.rounds):
            for name in list(methods) if r % 2 == 0 else list(methods)[::-1]:
                t, outs = time.perf_counter(), []
                for batch in batches:
                    outs += [o.output_ids for o in methods[name].generate(batch, cfg)[0]]
                times[name].append(time.perf_counter() - t)
                outputs[name] = outs
        res[str(b)] = {}
        for name, ts in times.items():
            speedups = [base_t / t for base_t, t in zip(times["target-only"], ts, strict=True)]
            res[str(b)][name] = {"speedup": {"median": statistics.median(speedups), "min": min(speedups), "max": max(speedups)},
                                 "seconds": ts, "identical": outputs[name] == outputs["target-only"]}
            row = res[str(b)][name]
            print(f"batch {b} {name:16s} {row['speedup']['median']:.2f}x ({row['speedup']['min']:.2f}-{row['speedup']['max']:.2f})"
                  f"  outputs {'identical' if row['identical'] else 'DIFFER'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
