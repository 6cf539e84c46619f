"""Decode throughput, ours vs peers, side by side in one run (batch 1, greedy).

    python benchmarks/bench_decode.py --target examples/demo-pair/target --draft examples/demo-pair/draft

Methods: ours target-only, ours draft-target (a sweep of draft lengths), ours
n-gram; Hugging Face generate (target-only, assisted, prompt lookup) and
onnxruntime-genai (target-only, draft model, n-gram) where installed
(benchmarks/peers.py; onnxruntime-genai may live in its own venv, see there).
Every method generates exactly --max_new_tokens per prompt (no EOS stop);
tokens/s = generated tokens / summed generate() wall time, time to first token
included. Ratios are what to read: absolute numbers on a shared machine are noise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import host  # noqa: E402
import peers  # noqa: E402
from prompts import code_prompts  # noqa: E402

from specdec.bench.plots import Bar, beside, write_bars  # noqa: E402
from specdec.bench.sweep import analytic_bound, generate_each, step_cost  # noqa: E402
from specdec.builder.build import build_engine  # noqa: E402
from specdec.formats.config_strings import DraftTargetConfig  # noqa: E402
from specdec.formats.engine_format import BuildConfig  # noqa: E402
from specdec.runtime import Orchestrator, load_orchestrator  # noqa: E402
from specdec.runtime.proposers.draft_model import DraftModelProposer  # noqa: E402
from specdec.runtime.proposers.ngram import NGramProposer  # noqa: E402


def best_of(runs: list[dict]) -> dict:
    """The fastest of repeated runs: on a shared machine noise only ever adds time."""
    return min(runs, key=lambda r: r["seconds"])


def ours(orch, prompts, max_new, warm: bool = True) -> dict:
    """Batch 1, one request at a time, like the peers (bench.sweep.generate_each)."""
    r = generate_each(orch, prompts, [max_new] * len(prompts), warmup=int(warm))
    return {**r, "tokens_per_s": r["output_tokens_per_s"], "seconds": r["total_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target HF checkpoint dir")
    ap.add_argument("--draft", help="draft HF checkpoint dir")
    ap.add_argument("--num_prompts", type=int, default=8)
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--copy_heavy", action="store_true", help="prompts that contain most of the answer (n-gram's case)")
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--draft_lens", default="2,4,6")
    ap.add_argument("--ngram", default="8,3", help="max_draft_len,max_matching_ngram_size for our n-gram ('' to skip)")
    ap.add_argument("--peers", default="hf,ortgenai", help="comma list of peers to run ('' for none)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads for every runtime")
    ap.add_argument("--work", default=None, help="where to put built engines [default: a temp dir]")
    ap.add_argument("--json", default=None, help="write all figures here")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over all methods, interleaved; each method keeps its fastest round")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="specdec-bench-"))
    draft_lens = [int(x) for x in args.draft_lens.split(",") if x]
    ngram = [int(x) for x in args.ngram.split(",")] if args.ngram else None
    max_draft = max(draft_lens + ([ngram[0]] if ngram else []))
    quiet = lambda _: None  # noqa: E731
    build_engine(args.target, work / "target", BuildConfig(dtype="float32", max_batch_size=1, max_input_len=1024, max_seq_len=2048,
                 max_draft_len=max_draft, speculative_decoding_mode="draft_tokens_external"), force=True, say=quiet)
    if args.draft:
        build_engine(args.draft, work / "draft", BuildConfig(dtype="float32", max_batch_size=1, max_input_len=1024, max_seq_len=2048), force=True,
                     say=quiet)
    prompts = code_prompts(work / "target", args.num_prompts, args.prompt_tokens, copy_heavy=args.copy_heavy)
    n_new = args.max_new_tokens
    results: dict[str, dict] = {}

    def record(name: str, r: dict) -> None:
        results[name] = r
        extra = f"  acceptance {r['acceptance_rate']:.3f}" if r.get("acceptance_rate") is not None else ""
        print(f"  {name:<28} {r['tokens_per_s']:8.1f} tokens/s{extra}", flush=True)

    print(f"{len(prompts)} prompts of ~{args.prompt_tokens} tokens, {n_new} new tokens each, batch 1, threads={args.threads or 'default'}, best of "
          f"{args.repeats} interleaved rounds")
    # One target session (and one draft session) serves every method, as in bench.sweep.run_sweep.
    if args.draft:
        first = load_orchestrator(work / "target", work / "draft", DraftTargetConfig(max(draft_lens), [0], [0], False), num_threads=args.threads)
        target_ex, draft_ex = first.target, first.proposer.executor
    else:
        target_ex = load_orchestrator(work / "target", num_threads=args.threads).target
    orchs = {"specdec target-only": Orchestrator(target_ex)}
    c = None
    if args.draft:
        c = step_cost(draft_ex) / step_cost(target_ex)
        for k in draft_lens:
            orchs[f"specdec draft-target k={k}"] = Orchestrator(target_ex, DraftModelProposer(draft_ex), draft_len=k)
    if ngram:
        orchs[f"specdec ngram k={ngram[0]} n={ngram[1]}"] = Orchestrator(target_ex, NGramProposer(ngram[0], ngram[1]), draft_len=ngram[0])
    runs: dict[str, list[dict]] = {name: [] for name in orchs}
    for r in range(args.repeats):
        for name, orch in orchs.items():
            runs[name].append(ours(orch, prompts, n_new, warm=not runs[name]))
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{n} {v[-1]['tokens_per_s']:.0f}" for n, v in runs.items()) + " tokens/s", flush=True)
    for name in orchs:
        record(name, best_of(runs[name]))
    base_ids = results["specdec target-only"]["output_ids"]
    for r in results.values():
        r["greedy_equal_to_target_only"] = r["output_ids"] == base_ids

    wanted = [p for p in args.peers.split(",") if p]
    if wanted:
        print(f"peers: {', '.join(wanted)} (each on the same prompts)", flush=True)
    if "hf" in wanted:
        record("hf target-only",
               best_of([peers.hf_generate(args.target, prompts, n_new, num_threads=args.threads) for _ in range(max(1, args.repeats // 2))]))
        if args.draft:
            k = 4 if 4 in draft_lens else draft_lens[0]
            record(f"hf assisted k={k}",
                   peers.hf_generate(args.target, prompts, n_new, assistant_dir=args.draft, num_assistant_tokens=k, num_threads=args.threads))
        if ngram:
            record(f"hf prompt-lookup k={ngram[0]}",
                   peers.hf_generate(args.target, prompts, n_new, prompt_lookup_num_tokens=ngram[0], max_matching_ngram_size=ngram[1],
                                     num_threads=args.threads))
    if "ortgenai" in wanted:
        try:
            t_dir = peers.ortgenai_build(args.target, str(work / "og-target"))
            record("ortgenai target-only",
                   best_of([peers.ortgenai_generate(t_dir, prompts, n_new, num_threads=args.threads) for _ in range(args.repeats)]))
            if args.draft:
                d_dir = peers.ortgenai_build(args.draft, str(work / "og-draft"))
                for k in draft_lens:  # same draft length as ours, each
                    record(f"ortgenai draft k={k}",
                           best_of([peers.ortgenai_generate(t_dir, prompts, n_new, draft_dir=d_dir, num_draft_tokens=k,
                                                            num_threads=args.threads) for _ in range(args.repeats)]))
            if ngram:
                record(f"ortgenai ngram k={ngram[0]}",
                       best_of([peers.ortgenai_generate(t_dir, prompts, n_new, ngram=ngram[1] + 1, num_draft_tokens=ngram[0],
                                                        num_threads=args.threads) for _ in range(args.repeats)]))
        except (RuntimeError, NotImplementedError, FileNotFoundError) as err:
            print(f"  onnxruntime-genai skipped: {err}")

    base = results["specdec target-only"]["tokens_per_s"]
    print(f"\n{'method':<30}{'tokens/s':>10}{'vs ours TO':>12}{'acceptance':>12}{'bound':>8}{'greedy==TO':>12}")
    for name, r in results.items():
        acc = r.get("acceptance_rate")
        b = ""
        if name.startswith("specdec draft-target") and acc is not None and c is not None:
            k = int(name.split("k=")[1])
            r["analytic_bound"] = analytic_bound(r["per_token_acceptance"], k, c)  # alpha: acceptance of reached drafts
            r["fraction_of_bound"] = (r["tokens_per_s"] / base) / r["analytic_bound"]
            b = f"{r['analytic_bound']:.2f}"
        eq = "" if "greedy_equal_to_target_only" not in r else ("yes" if r["greedy_equal_to_target_only"] else "NO")
        if name.startswith(("hf", "ortgenai")):
            same = np.mean([a == b_ for a, b_ in zip(r["output_ids"], base_ids, strict=False)])
            eq = f"{same:.0%} same"
        print(f"{name:<30}{r['tokens_per_s']:>10.1f}{r['tokens_per_s'] / base:>11.2f}x{(f'{acc:.3f}' if acc is not None else '-'):>12}{b:>8}{eq:>12}")
    if c is not None:
        print(f"\ndraft/target step cost c = {c:.3f}; bound = (1 - a^(k+1)) / ((1 - a)(k c + 1)) with a = measured acceptance")
    pairs = [("specdec target-only", "ortgenai target-only"), ("specdec target-only", "hf target-only")]
    pairs += [(f"specdec draft-target k={k}", f"ortgenai draft k={k}") for k in draft_lens]
    pairs += [(f"specdec draft-target k={k}", f"hf assisted k={k}") for k in draft_lens]
    if ngram:
        pairs += [(f"specdec ngram k={ngram[0]} n={ngram[1]}", f"ortgenai ngram k={ngram[0]}"),
                  (f"specdec ngram k={ngram[0]} n={ngram[1]}", f"hf prompt-lookup k={ngram[0]}")]
    for ours_name, peer_prefix in pairs:
        if ours_name in results and peer_prefix in results:
            print(f"{ours_name} / {peer_prefix}: {results[ours_name]['tokens_per_s'] / results[peer_prefix]['tokens_per_s']:.2f}x")
    if args.json:
        slim = {k: {kk: vv for kk, vv in v.items() if kk != "output_ids"} for k, v in results.items()}
        record = {"args": vars(args), "host": host.host_record(bandwidth=False), "c": c, "results": slim}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        bars = [Bar(name, r["tokens_per_s"] / base) for name, r in results.items()]
        if path := write_bars(beside(args.json), f"tokens/s over specdec target-only, batch 1, best of {args.repeats} rounds", {"decode": bars}):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
