"""Medusa and EAGLE against draft-target and n-gram, side by side, interleaved (issue 16).

    python benchmarks/bench_heads.py --target /tmp/big/engine-target --draft /tmp/big/engine-draft \\
        --medusa /tmp/big/engine-medusa --eagle /tmp/big/engine-eagle --rounds 3 --output_json heads.json

Batch 1, greedy, the same token ids and the same number of new tokens (EOS
ignored) for every method; prompts from benchmarks/prompts.py (the start of a
held-out standard-library function, and copy-heavy ones: a function, then a
request to repeat it), reported apart and together.

Methods (each on its own engine of the same model; every speedup is against
target-only on the plain target engine):

* target-only;
* draft-target, k drafts from the draft engine (--draft_lens);
* n-gram, k = 8, matching up to 3 tokens;
* Medusa chain (k = every head) and tree (--medusa_choices), the heads in the medusa target;
* EAGLE-3 chain (--eagle_lens) and tree (--eagle_choices), the module engine in the eagle target's eagle/.

Every method is loaded once and warmed up; then each round runs prompt by
prompt, every method in turn on each prompt (the order rotated each round),
so the methods share each stretch of machine load. Reported per method:
tokens/s (median and min-max over rounds), the ratio to target-only in the
same round (median, min-max: the figure to read on a shared machine), mean
acceptance length, per-depth acceptance, and whether the output equals
target-only's (greedy speculation must reproduce it exactly).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from prompts import spread, workloads  # noqa: E402

from specdec.bench.plots import beside, spread_bar, write_bars  # noqa: E402
from specdec.formats.config_strings import DraftTargetConfig, NGramConfig  # noqa: E402
from specdec.formats.engine_format import load_engine_dir  # noqa: E402
from specdec.runtime.loading import load_engine  # noqa: E402
from specdec.runtime.metrics import Metrics  # noqa: E402
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator  # noqa: E402
from specdec.runtime.proposers.eagle import EagleProposer  # noqa: E402
from specdec.runtime.proposers.medusa import MedusaProposer  # noqa: E402

MEDUSA_TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"
EAGLE_TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"


@dataclass
class Method:
    name: str
    orch: Orchestrator
    rounds: list[dict[str, Any]] = field(default_factory=list)  # per round: seconds and outputs per prompt, metrics


def methods(args: argparse.Namespace) -> list[Method]:
    threads = args.threads
    base = load_engine(load_engine_dir(args.target), num_threads=threads)
    out = [Method("target-only", Orchestrator.from_engine(base))]
    if args.draft:
        for k in args.draft_lens:
            e = load_engine(args.target, args.draft, DraftTargetConfig(k, [0], [0], False), num_threads=threads, target_executor=base.target)
            out.append(Method(f"draft-target k={k}", Orchestrator.from_engine(e)))
    e = load_engine(args.target, ngram=NGramConfig(8, 3, [0]), num_threads=threads, target_executor=base.target)
    out.append(Method("n-gram k=8 n=3", Orchestrator.from_engine(e)))
    # Medusa / EAGLE: each target (and EAGLE's module) opened once; chains and the tree share them
    if args.medusa:
        chain = load_engine(load_engine_dir(args.medusa), num_threads=threads)
        out.append(Method(f"Medusa chain k={chain.speculation.draft_len}", Orchestrator.from_engine(chain)))
        if args.medusa_choices:
            tree = MedusaProposer(chain.target, args.medusa_choices)
            out.append(Method(f"Medusa tree n={len(tree.tree)}", Orchestrator(chain.target, tree, draft_len=len(tree.tree))))
    if args.eagle:
        first = load_engine(load_engine_dir(args.eagle), num_threads=threads)
        module = first.proposers["eagle"].module
        for k in args.eagle_lens:
            out.append(Method(f"EAGLE chain k={k}", Orchestrator(first.target, EagleProposer(first.target, module), draft_len=k)))
        if args.eagle_choices:
            tree = EagleProposer(first.target, module, args.eagle_choices)
            out.append(Method(f"EAGLE tree n={len(tree.tree)}", Orchestrator(first.target, tree, draft_len=len(tree.tree))))
    return out


def run_round(ms: list[Method], prompts: list[list[int]], n_new: int, r: int) -> None:
    order = ms[r % len(ms):] + ms[: r % len(ms)]  # rotate: no method always runs first after a pause
    order = order if r % 2 == 0 else order[::-1]
    rec = {m.name: {"s": [], "output_ids": [], "metrics": Metrics()} for m in ms}
    cfg = GenerationConfig(max_output_len=n_new)
    for p in prompts:
        for m in order:
            t = time.perf_counter()
            (out,), metrics = m.orch.generate([p], cfg)
            rec[m.name]["s"].append(time.perf_counter() - t)
            rec[m.name]["output_ids"].append(out.output_ids)
            rec[m.name]["metrics"].merge(metrics)
    for m in ms:
        m.rounds.append(rec[m.name])


def summarize(ms: list[Method], subsets: dict[str, list[int]], n_new: int) -> dict[str, dict[str, Any]]:
    base = ms[0]
    out: dict[str, dict[str, Any]] = {}
    for m in ms:
        row: dict[str, Any] = {}
        for sub, idx in subsets.items():
            tps = [n_new * len(idx) / sum(r["s"][i] for i in idx) for r in m.rounds]
            base_tps = [n_new * len(idx) / sum(r["s"][i] for i in idx) for r in base.rounds]
            row[sub] = {"tokens_per_s": spread(tps), "speedup": spread([a / b for a, b in zip(tps, base_tps, strict=False)])}
        metrics = m.rounds[-1]["metrics"]
        row["mean_acceptance_length"] = metrics.mean_acceptance_length if metrics.drafted else None
        row["per_depth_acceptance"] = metrics.per_position_acceptance
        row["identical"] = all(r["output_ids"] == b["output_ids"] for r, b in zip(m.rounds, base.rounds, strict=False))
        out[m.name] = row
    return out


def print_table(summary: dict[str, dict[str, Any]], subsets: dict[str, list[int]]) -> None:
    def cell(s: dict[str, float], suffix: str = "") -> str:
        return f"{s['median']:.2f}{suffix} ({s['min']:.2f}-{s['max']:.2f})"

    speedups = "".join(f"{'speedup ' + sub:>26}" for sub in subsets)
    head = f"{'method':<22}{'tokens/s (all)':>22}" + speedups + f"{'acc. len':>10}  per-depth acceptance   same"
    print(head)
    for name, row in summary.items():
        acc = row["mean_acceptance_length"]
        depth = " ".join(f"{a:.2f}" for a in row["per_depth_acceptance"][:4])
        print(f"{name:<22}{cell(row['all']['tokens_per_s']):>22}" + "".join(f"{cell(row[sub]['speedup'], 'x'):>26}" for sub in subsets)
              + f"{(f'{acc:.2f}' if acc else '-'):>10}  {depth:<20} {'yes' if row['identical'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="plain target engine (draft_tokens_external): target-only, draft-target, n-gram")
    p.add_argument("--draft", help="draft engine for draft-target")
    p.add_argument("--medusa", help="the same model built with --speculative_decoding_mode medusa")
    p.add_argument("--eagle", help="the same model built with --speculative_decoding_mode eagle")
    p.add_argument("--medusa_choices", default=MEDUSA_TREE)
    p.add_argument("--eagle_choices", default=EAGLE_TREE)
    p.add_argument("--draft_lens", type=lambda s: [int(x) for x in s.split(",")], default=[4])
    p.add_argument("--eagle_lens", type=lambda s: [int(x) for x in s.split(",")], default=[3])
    p.add_argument("--num_prompts", type=int, default=4, help="per kind (ordinary, copy-heavy)")
    p.add_argument("--prompt_tokens", type=int, default=96)
    p.add_argument("--max_new_tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--output_json")
    args = p.parse_args(argv)
    target = load_engine_dir(args.target)
    prompts, subsets = workloads(target.path, args.num_prompts, args.prompt_tokens)
    ms = methods(args)
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, batch 1, greedy, {args.rounds} rounds, "
          f"{args.threads or 'default'} threads; load average {os.getloadavg()[0]:.2f}", flush=True)
    for m in ms:  # warm-up: first calls pay one-time costs
        m.orch.generate([prompts[0][:16]], GenerationConfig(max_output_len=8))
    for r in range(args.rounds):
        print(f"  round {r + 1}/{args.rounds} (load average {os.getloadavg()[0]:.2f})", flush=True)
        run_round(ms, prompts, args.max_new_tokens, r)
    summary = summarize(ms, subsets, args.max_new_tokens)
    print_table(summary, subsets)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"args": vars(args), "summary": summary, "prompt_tokens": [len(p) for p in prompts]},
                                                     indent=1) + "\n")
        print(f"wrote {args.output_json}")
        panels = {sub: [spread_bar(name, row[sub]["speedup"]) for name, row in summary.items()] for sub in subsets}
        if path := write_bars(beside(args.output_json), f"speed over target-only, batch 1, {args.max_new_tokens} new tokens, {args.rounds} rounds",
                              panels):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
