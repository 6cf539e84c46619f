"""Medusa, EAGLE-3 and P-EAGLE against draft-target and n-gram, side by side, interleaved (issues 16 and 43).

    python benchmarks/bench_heads.py --target /tmp/big/engine-target --draft /tmp/big/engine-draft \\
        --medusa /tmp/big/engine-medusa --eagle /tmp/big/engine-eagle --peagle /tmp/big/engine-peagle \\
        --batches 1,4,16 --rounds 3 --output_json heads.json
    python benchmarks/bench_heads.py draft-cost --eagle /tmp/big/engine-eagle --peagle /tmp/big/engine-peagle --lens 1,2,3,4,5,6,7,8

Greedy (or sampled: --temperature, --top_p), the same token ids and the same number of new tokens (EOS ignored) for
every method; prompts from
benchmarks/prompts.py (the start of a held-out standard-library function, and copy-heavy ones: a function, then a
request to repeat it), reported apart and together at batch 1, together at larger batches (each batch mixes both
kinds).

Methods (each on its own engine of the same model; every speedup is against target-only on the plain target engine):

* target-only;
* draft-target, k drafts from the draft engine (--draft_lens);
* n-gram, k = 8, matching up to 3 tokens;
* Medusa chain (k = every head) and tree (--medusa_choices), the heads in the medusa target;
* EAGLE-3 chain (--eagle_lens) and tree (--eagle_choices), the module engine in the eagle target's eagle/;
* P-EAGLE chain (--peagle_lens) and tree (--peagle_choices): the peagle target's module drafts the block in one call.

``auto`` in --eagle_lens / --peagle_lens adds draft_len=auto on the same engines; ``--one_price`` adds "P-EAGLE
k=auto flat", P-EAGLE's auto pricing each round at one module call whatever its drafts (the pricing before it fitted a
line over them: the ablation). ``--tree_auto`` adds draft_len=auto on each tree ("tree auto": the nodes that pay, by
each node's measured acceptance) and its ablation ("tree auto whole": the same estimates, the whole tree or nothing,
as auto drafted static trees before). "nodes" is the drafts verified per drafting round (a tree's nodes kept).

Every method is loaded once and warmed up (at every batch size); then each round runs batch by batch, every method in
turn on each batch (the order rotated each round), so the methods share each stretch of machine load. Reported per
method and batch size: tokens/s (median and min-max over rounds), the ratio to target-only in the same round (median,
min-max: the figure to read on a shared machine), mean acceptance length, per-depth acceptance, draft seconds per
round, and whether the output equals target-only's (greedy speculation must reproduce it exactly).

Sampled (--temperature > 0): round r seeds every request with --seed + r (its stream: its place in the batch), the
same for every method. Drafts verified by token compare (n-gram, draft-target here) draw target-only's own tokens
for the seed, so their output must equal target-only's; Medusa, EAGLE-3 and P-EAGLE chains and trees, verified by
rejection sampling (recursive, on a tree), keep the target's distribution but follow their drafts ("same" shows "-"
for them).

``draft-cost``: what one round's drafting costs, chain k = each of --lens, EAGLE-3 (one module call, then one per
further token) against P-EAGLE (one call), at each of --batches (batches of consecutive prompts): seconds of the
proposers' calls per round (Metrics.round_draft_s over the engine's rounds: their passes over the prompts left out),
interleaved per prompt, and each as a multiple of EAGLE-3's k = 1 round (one module call, the same pairs fed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import host  # noqa: E402
from prompts import spread, workloads  # noqa: E402

from specdec.bench.plots import beside, spread_bar, write_bars  # noqa: E402
from specdec.formats.config_strings import DraftTargetConfig, NGramConfig  # noqa: E402
from specdec.formats.engine_format import load_engine_dir  # noqa: E402
from specdec.runtime.loading import load_engine  # noqa: E402
from specdec.runtime.metrics import Metrics  # noqa: E402
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator  # noqa: E402
from specdec.runtime.proposers.base import Draft  # noqa: E402
from specdec.runtime.proposers.eagle import EagleProposer  # noqa: E402
from specdec.runtime.proposers.medusa import MedusaProposer  # noqa: E402
from specdec.runtime.proposers.peagle import AUTO_REFINE, MAX_REFINE, PEagleProposer  # noqa: E402
from specdec.runtime.sampling import SamplingConfig  # noqa: E402

MEDUSA_TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"
EAGLE_TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def lens_or_auto(text: str) -> list[int | str]:
    """Chain lengths, and ``auto`` (draft_len=auto) among them."""
    return [x.strip() if x.strip() == "auto" else int(x) for x in text.split(",") if x.strip()]


def one_price(orch: Orchestrator) -> Orchestrator:
    """The ablation of --one_price: draft_len=auto pricing a one-call drafter's round at one call whatever its drafts (as
    before it fitted a line over them), every other cost and choice unchanged."""
    auto = orch.engine.auto
    auto.drafting_costs = lambda method, rows, limit, t_draft: [0.0] + [t_draft] * limit
    auto.drafting_cost = lambda method, rows, drafts, t_draft: t_draft if drafts > 0 else 0.0  # trees
    return orch


@dataclass
class Method:
    name: str
    orch: Orchestrator
    runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # batch size -> per round: seconds, outputs, metrics



def whole_tree(orch: Orchestrator) -> Orchestrator:
    """The ablation of --tree_auto: draft_len=auto verifying a static tree whole or not at all (as auto did before it
    kept the nodes that pay), from the same per-node estimates and prices: choose_nodes with n all or none, and the
    batch's width cap keeping a tree whole or cutting it to nothing."""
    auto, policy = orch.engine.auto, orch.engine.round.policy
    curve, cap = policy.expected_curve, policy.batch_cap

    def whole_curve(r, d, first=None) -> list[float]:
        got = curve(r, d, first)
        return got if d.tree_index is None else [1.0] * (len(got) - 1) + got[-1:]

    def whole_cap(reqs, drafts) -> list[Draft]:
        return [c if c.tree_index is None or len(c) == len(d) else Draft.empty() for c, d in zip(cap(reqs, drafts), drafts, strict=True)]

    def whole(method: str, *args, **kwargs) -> np.ndarray:
        order, speeds, base = auto.node_speeds(method, *args, **kwargs)
        return np.array(sorted(order) if speeds and speeds[-1] > base else [], np.int64)

    auto.choose_nodes, policy.expected_curve, policy.batch_cap = whole, whole_curve, whole_cap
    return orch


def module_methods(label: str, path: str, cls, lens: list[int | str], choices: str | None, threads: int | None,
                   ablate_price: bool = False, tree_auto: bool = False) -> list[Method]:
    """Chains of each length (``auto``: draft_len=auto) and a tree of one EAGLE-family target, on one target executor and
    one module executor; ``ablate_price``: also auto with one price per round (``one_price``)."""
    first = load_engine(load_engine_dir(path), num_threads=threads)
    proposer = next(iter(first.proposers.values()))
    out = [Method(f"{label} chain k={k}", Orchestrator(first.target, cls(first.target, proposer.module), draft_len=k)) for k in lens]
    if ablate_price and "auto" in lens:
        out.append(Method(f"{label} k=auto flat", one_price(Orchestrator(first.target, cls(first.target, proposer.module),
                                                                                       draft_len="auto"))))
    if choices:
        tree = cls(first.target, proposer.module, choices)
        out.append(Method(f"{label} tree n={len(tree.tree)}", Orchestrator(first.target, tree, draft_len=len(tree.tree))))
        if tree_auto:
            fresh = lambda: Orchestrator(first.target, cls(first.target, proposer.module, choices), draft_len="auto")  # noqa: E731
            out += [Method(f"{label} tree auto", fresh()), Method(f"{label} tree auto whole", whole_tree(fresh()))]
    return out


def methods(args: argparse.Namespace) -> list[Method]:
    threads = args.threads
    base = load_engine(load_engine_dir(args.target), num_threads=threads)
    out = [Method("target-only", Orchestrator.from_engine(base))]
    if args.draft:
        for k in args.draft_lens:
            e = load_engine(args.target, args.draft, DraftTargetConfig(k, [0], [0], False), num_threads=threads, target_executor=base.target)
            out.append(Method(f"draft-target k={k}", Orchestrator.from_engine(e)))
    if args.ngram:
        e = load_engine(args.target, ngram=NGramConfig(8, 3, [0]), num_threads=threads, target_executor=base.target)
        out.append(Method("n-gram k=8 n=3", Orchestrator.from_engine(e)))
    if args.medusa:  # the chain and the tree share the target
        chain = load_engine(load_engine_dir(args.medusa), num_threads=threads)
        out.append(Method(f"Medusa chain k={chain.speculation.draft_len}", Orchestrator.from_engine(chain)))
        if args.medusa_choices:
            tree = MedusaProposer(chain.target, args.medusa_choices)
            out.append(Method(f"Medusa tree n={len(tree.tree)}", Orchestrator(chain.target, tree, draft_len=len(tree.tree))))
            if args.tree_auto:
                fresh = lambda: Orchestrator(chain.target, MedusaProposer(chain.target, args.medusa_choices), draft_len="auto")  # noqa: E731
                out += [Method("Medusa tree auto", fresh()), Method("Medusa tree auto whole", whole_tree(fresh()))]
    if args.eagle:
        out += module_methods("EAGLE", args.eagle, EagleProposer, args.eagle_lens, args.eagle_choices, threads, tree_auto=args.tree_auto)
    if args.peagle and (not args.peagle_refine or not all(n == AUTO_REFINE or 0 <= n <= MAX_REFINE for n in args.peagle_refine)):
        raise SystemExit(f"--peagle_refine {args.peagle_refine}: give refining calls from 0 to {MAX_REFINE} or auto, e.g. 0,1,auto")
    for refine in args.peagle_refine if args.peagle else []:  # refine 0: one call a round; n: n more, each reading the last one's drafts
        label = "P-EAGLE" + (f" refined {refine}" if refine == AUTO_REFINE else f" refined x{refine}" if refine else "")
        out += module_methods(label, args.peagle, partial(PEagleProposer, refine=refine), args.peagle_lens,
                              None if refine == AUTO_REFINE else args.peagle_choices, threads, args.one_price, args.tree_auto)
    return out


def batches_of(prompts: list[list[int]], subsets: dict[str, list[int]], size: int) -> list[list[int]]:
    """Prompt indices in batches of ``size``: the kinds alternate, so every batch mixes ordinary and copy-heavy prompts."""
    kinds = [subsets[k] for k in subsets if k != "all"]
    order = [i for group in zip(*kinds, strict=False) for i in group] + [i for k in kinds for i in k[min(map(len, kinds)):]]
    return [order[i : i + size] for i in range(0, len(order), size)]


def timed_generate(m: Method, prompts: list[list[int]], cfg: GenerationConfig) -> tuple[float, list[list[int]], Metrics, int]:
    rounds = m.orch.engine.round.rounds
    t = time.perf_counter()
    outs, metrics = m.orch.generate(prompts, cfg)
    return time.perf_counter() - t, [o.output_ids for o in outs], metrics, m.orch.engine.round.rounds - rounds


def sampling_of(args: argparse.Namespace, r: int) -> SamplingConfig:
    """Round r's sampling: greedy, or --temperature / --top_p seeded with --seed + r."""
    if not args.temperature:
        return SamplingConfig()
    return SamplingConfig(temperature=args.temperature, top_p=args.top_p, random_seed=args.seed + r)


def run_round(ms: list[Method], prompts: list[list[int]], groups: dict[int, list[list[int]]], n_new: int, r: int,
              sampling: SamplingConfig, kind_of: dict[int, str] | None = None) -> None:
    """One round: every method on every batch, in turn. ``kind_of`` (prompt -> its kind): a batch of one's metrics are kept
    per kind too (each kind's acceptance)."""
    order = ms[r % len(ms):] + ms[: r % len(ms)]  # rotate: no method always runs first after a pause
    order = order if r % 2 == 0 else order[::-1]
    cfg = GenerationConfig(max_output_len=n_new, sampling=sampling)
    for size, batches in groups.items():
        rec = {m.name: {"s": {}, "output_ids": {}, "metrics": Metrics(), "draft_s": 0.0, "engine_rounds": 0, "by_kind": {}} for m in ms}
        for batch in batches:
            for m in order:
                s, outs, metrics, rounds = timed_generate(m, [prompts[i] for i in batch], cfg)
                row = rec[m.name]
                for i, o in zip(batch, outs, strict=False):
                    row["s"][i], row["output_ids"][i] = s / len(batch), o  # a batch's time, shared by its prompts
                row["metrics"].merge(metrics)
                if size == 1 and kind_of:
                    row["by_kind"].setdefault(kind_of[batch[0]], Metrics()).merge(metrics)
                row["draft_s"] += metrics.round_draft_s
                row["engine_rounds"] += rounds
        for m in ms:
            m.runs.setdefault(size, []).append(rec[m.name])


def summarize(ms: list[Method], subsets: dict[str, list[int]], n_new: int, sampled: bool) -> dict[str, dict[str, Any]]:
    base = ms[0]
    out: dict[str, dict[str, Any]] = {}
    for m in ms:
        per_batch: dict[str, Any] = {}
        for size, runs in m.runs.items():
            row: dict[str, Any] = {}
            for sub, idx in (subsets.items() if size == 1 else [("all", subsets["all"])]):
                tps = [n_new * len(idx) / sum(r["s"][i] for i in idx) for r in runs]
                base_tps = [n_new * len(idx) / sum(r["s"][i] for i in idx) for r in base.runs[size]]
                row[sub] = {"tokens_per_s": spread(tps), "speedup": spread([a / b for a, b in zip(tps, base_tps, strict=False)])}
            metrics = runs[-1]["metrics"]
            row["mean_acceptance_length"] = metrics.mean_acceptance_length if metrics.drafted else None
            row["drafts_per_round"] = metrics.drafted / metrics.drafting_rounds if metrics.drafting_rounds else None
            row["per_depth_acceptance"] = metrics.per_position_acceptance
            if runs[-1]["by_kind"] and metrics.drafted:  # batch 1: each kind's own (what a drafter buys differs by text)
                row["by_kind"] = {kind: {"mean_acceptance_length": km.mean_acceptance_length if km.drafted else None,
                                         "per_depth_acceptance": km.per_position_acceptance} for kind, km in runs[-1]["by_kind"].items()}
            row["draft_ms_per_round"] = spread([1e3 * r["draft_s"] / max(r["engine_rounds"], 1) for r in runs])
            row["identical"] = all(r["output_ids"] == b["output_ids"] for r, b in zip(runs, base.runs[size], strict=False))
            row["identical_expected"] = not (sampled and m.orch.engine.sample_differs())
            engine = m.orch.engine
            if engine.speculation.draft_len == "auto" or engine.auto.refining:  # what auto's decisions read at the end (a tree's
                # node_values, the refining calls' estimates among them)
                row["auto_state"] = engine.auto.describe(engine.speculation.method, size)
            per_batch[str(size)] = row
        out[m.name] = per_batch
    return out


def cell(s: dict[str, float], suffix: str = "", digits: int = 2) -> str:
    return f"{s['median']:.{digits}f}{suffix} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def print_table(summary: dict[str, dict[str, Any]], subsets: dict[str, list[int]]) -> None:
    for size in next(iter(summary.values())):
        subs = list(subsets) if size == "1" else ["all"]
        print(f"\nbatch {size}")
        width = max(22, *(len(name) + 2 for name in summary))  # the longest label ("P-EAGLE refined x2 chain k=auto") keeps its column
        print(f"{'method':<{width}}{'tokens/s (all)':>22}" + "".join(f"{'speedup ' + sub:>26}" for sub in subs)
              + f"{'draft ms/round':>22}{'acc. len':>10}{'nodes':>7}  per-depth acceptance   same")
        for name, rows in summary.items():
            row = rows[size]
            acc = row["mean_acceptance_length"]
            depth = " ".join(f"{a:.2f}" for a in row["per_depth_acceptance"][:4])
            nodes = row.get("drafts_per_round")
            print(f"{name:<{width}}{cell(row['all']['tokens_per_s']):>22}" + "".join(f"{cell(row[sub]['speedup'], 'x'):>26}" for sub in subs)
                  + f"{cell(row['draft_ms_per_round'], digits=1):>22}{(f'{acc:.2f}' if acc else '-'):>10}"
                  + f"{(f'{nodes:.1f}' if nodes else '-'):>7}  {depth:<20} "
                  + ("yes" if row["identical"] else "NO" if row["identical_expected"] else "-"))
        kinds = {name: rows[size]["by_kind"] for name, rows in summary.items() if rows[size].get("by_kind")}
        if kinds:
            print("acceptance length by kind (per-depth acceptance)")
            for name, by in kinds.items():
                print(f"{name:<{width}}" + "   ".join(f"{kind} {v['mean_acceptance_length']:.2f} ("
                                                    + " ".join(f"{a:.2f}" for a in v["per_depth_acceptance"][:4]) + ")"
                                                    for kind, v in by.items() if v["mean_acceptance_length"]))


def speed(args: argparse.Namespace) -> dict[str, Any]:
    target = load_engine_dir(args.target)
    prompts, subsets = workloads(target.path, args.num_prompts, args.prompt_tokens)
    groups = {size: batches_of(prompts, subsets, size) for size in args.batches}
    kind_of = {i: kind for kind, idx in subsets.items() if kind != "all" for i in idx}
    ms = methods(args)
    how = f"temperature {args.temperature}, top_p {args.top_p}, seeds {args.seed}.." if args.temperature else "greedy"
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, batches {args.batches}, {how}, {args.rounds} rounds, "
          f"{args.threads or 'default'} threads; load average {os.getloadavg()[0]:.2f}", flush=True)
    for m in ms:  # warm-up: first calls pay one-time costs, at every batch size (each its own call shapes)
        for batches in groups.values():
            m.orch.generate([prompts[i][:16] for i in batches[0]], GenerationConfig(max_output_len=8))
    for r in range(args.rounds):
        print(f"  round {r + 1}/{args.rounds} (load average {os.getloadavg()[0]:.2f})", flush=True)
        run_round(ms, prompts, groups, args.max_new_tokens, r, sampling_of(args, r), kind_of)
    summary = summarize(ms, subsets, args.max_new_tokens, bool(args.temperature))
    print_table(summary, subsets)
    return {"summary": summary, "prompt_tokens": [len(p) for p in prompts], "batches": {str(k): v for k, v in groups.items()},
            "sampling": {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed} if args.temperature else "greedy"}


def draft_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Draft ms per round of EAGLE-3 and P-EAGLE chains of each length, interleaved prompt by prompt."""
    prompts, _ = workloads(load_engine_dir(args.eagle).path, args.num_prompts, args.prompt_tokens)
    ms = module_methods("EAGLE", args.eagle, EagleProposer, args.lens, None, args.threads)
    ms += module_methods("P-EAGLE", args.peagle, PEagleProposer, args.lens, None, args.threads)
    cfg = GenerationConfig(max_output_len=args.max_new_tokens)
    sizes = sorted(set(args.batches))
    for m in ms:
        for size in sizes:
            m.orch.generate([p[:16] for p in prompts[:size]], GenerationConfig(max_output_len=8))
    per: dict[tuple[str, int], list[float]] = {}
    counts: dict[tuple[str, int], Metrics] = {}  # every run's counts: the acceptance of each method and k
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, batches {sizes}, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    for r in range(args.rounds):
        order = ms[r % len(ms):] + ms[: r % len(ms)]
        for size in sizes:
            for start in range(0, len(prompts), size):
                batch = prompts[start : start + size]
                if len(batch) < size:
                    continue
                for m in order:
                    _, _, metrics, rounds = timed_generate(m, batch, cfg)
                    per.setdefault((m.name, size), []).append(1e3 * metrics.round_draft_s / max(rounds, 1))
                    counts.setdefault((m.name, size), Metrics()).merge(metrics)
    out: dict[str, Any] = {}
    for size in sizes:
        one_call = per[("EAGLE chain k=1", size)] if 1 in args.lens else None
        if one_call is None:
            raise SystemExit("draft-cost needs k = 1 in --lens: EAGLE's k = 1 round is the one-call yardstick.")
        print(f"\nbatch {size}: draft ms per round (median, min-max over {len(one_call)} runs), and / EAGLE's k = 1 round (one module call)")
        print(f"{'k':>3}{'EAGLE chain':>24}{'x one call':>12}{'P-EAGLE chain':>24}{'x one call':>12}{'acc. len EAGLE':>16}{'P-EAGLE':>9}")
        rows = {}
        for k in args.lens:
            e, p = per[(f"EAGLE chain k={k}", size)], per[(f"P-EAGLE chain k={k}", size)]
            ratio_e = [a / b for a, b in zip(e, one_call, strict=False)]
            ratio_p = [a / b for a, b in zip(p, one_call, strict=False)]
            acc = [counts[(f"{label} chain k={k}", size)].mean_acceptance_length for label in ("EAGLE", "P-EAGLE")]
            rows[str(k)] = {"eagle_ms": spread(e), "eagle_x_one_call": spread(ratio_e), "peagle_ms": spread(p), "peagle_x_one_call": spread(ratio_p),
                            "eagle_acceptance_length": acc[0], "peagle_acceptance_length": acc[1]}
            print(f"{k:>3}{cell(spread(e), digits=1):>24}{spread(ratio_e)['median']:>11.2f}x"
                  f"{cell(spread(p), digits=1):>24}{spread(ratio_p)['median']:>11.2f}x{acc[0]:>16.2f}{acc[1]:>9.2f}")
        out[str(size)] = rows
    return {"draft_cost": out}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cost = bool(argv) and argv[0] == "draft-cost"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if cost:
        argv = argv[1:]
        p.add_argument("--eagle", required=True)
        p.add_argument("--peagle", required=True)
        p.add_argument("--lens", type=ints, default=list(range(1, 9)))
        p.add_argument("--max_new_tokens", type=int, default=32)
        p.add_argument("--num_prompts", type=int, default=2, help="per kind (ordinary, copy-heavy)")
    else:
        p.add_argument("--target", required=True, help="plain target engine (draft_tokens_external): target-only, draft-target, n-gram")
        p.add_argument("--draft", help="draft engine for draft-target")
        p.add_argument("--no_ngram", dest="ngram", action="store_false", help="leave n-gram out")
        p.add_argument("--medusa", help="the same model built with --speculative_decoding_mode medusa")
        p.add_argument("--eagle", help="the same model built with --speculative_decoding_mode eagle")
        p.add_argument("--peagle", help="the same model built with --speculative_decoding_mode peagle")
        p.add_argument("--medusa_choices", default=MEDUSA_TREE)
        p.add_argument("--eagle_choices", default=EAGLE_TREE)
        p.add_argument("--peagle_choices", default=EAGLE_TREE)
        p.add_argument("--draft_lens", type=ints, default=[4])
        p.add_argument("--eagle_lens", type=lens_or_auto, default=[3], help="chain lengths; auto: draft_len=auto")
        p.add_argument("--peagle_lens", type=lens_or_auto, default=[4], help="chain lengths; auto: draft_len=auto")
        p.add_argument("--peagle_refine", type=lens_or_auto, default=[0],
                       help="P-EAGLE refining calls to measure, e.g. 0,1,auto (a module trained with --peagle_refine; 0: one call a round; "
                            "auto: chosen per request and round, chains only)")
        p.add_argument("--tree_auto", action="store_true",
                       help="also draft_len=auto on each tree, and its ablation drafting the tree whole or not at all")
        p.add_argument("--one_price", action="store_true",
                       help="with auto in --peagle_lens: also P-EAGLE auto pricing a round at one call whatever its drafts (the ablation)")
        p.add_argument("--max_new_tokens", type=int, default=96)
        p.add_argument("--num_prompts", type=int, default=4, help="per kind (ordinary, copy-heavy)")
        p.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (0: greedy)")
        p.add_argument("--top_p", type=float, default=1.0, help="with --temperature: nucleus sampling")
        p.add_argument("--seed", type=int, default=0, help="with --temperature: round r's seed is this + r")
    p.add_argument("--batches", type=ints, default=[1], help="batch sizes (each batch mixes the two kinds of prompts)")
    p.add_argument("--prompt_tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--output_json")
    args = p.parse_args(argv)
    machine = host.host_record(bandwidth=False)  # the CPU it ran on (issue 41: claims name their machine)
    result = draft_cost(args) if cost else speed(args)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"args": vars(args) | {"command": "draft-cost" if cost else "speed"}, "host": machine,
                                                      "load_average_end": list(os.getloadavg()), **result}, indent=1) + "\n")
        print(f"wrote {args.output_json}")
        if not cost:  # the chart beside the JSON: speed over target-only per batch size, every method
            summary = result["summary"]
            panels = {f"batch {size}": [spread_bar(name, rows[size]["all"]["speedup"]) for name,
                                        rows in summary.items()] for size in next(iter(summary.values()))}
            if path := write_bars(beside(args.output_json), f"speed over target-only, {args.max_new_tokens} new tokens, {args.rounds} rounds",
                                  panels):
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
