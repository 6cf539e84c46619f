"""The engine loop's host time per request and round at a batch size, beside the target's forward.

    python benchmarks/loop_host.py --work /tmp/loop-host --batch 64 --repeats 3 --json loop-host.json

A GPU round at 16-64 requests costs a few ms of model time, so what the loop does per request in Python (acceptance,
bookkeeping, draft_len=auto's decisions, the proposers' observe) is a visible share of it. This measures that share on
a CPU: the demo pair built as float32 torch engines (an EAGLE-3 target, a P-EAGLE target, the draft), ``--batch``
prompts of 59 tokens decoded together for 64 tokens each; host time = the generation's wall time less the time spent
inside the executors' ``forward`` (timed around each call), per request and round, and of it the time draft_len=auto
spent deciding (Metrics.decide_s). The methods run interleaved,
``--repeats`` times, each after an untimed warm-up generation on the same orchestrator. Read it on a quiet machine.

draft_len=auto decides from the costs it measures, and on a CPU those are not a GPU's: ``--gpu_costs`` prices every
call width from a GPU run's target steps at this batch size (bench_torch.py's JSON, e.g.
benchmarks/results/torch-llama8b-h200.json) and every draft step as free, fixed for the whole run, so that the loop
makes the decisions it makes on that GPU (at batch 16 on the H200: a perfect drafter would pay, no tree does).

    python benchmarks/loop_host.py --work /tmp/loop-host --batch 16 --gpu_costs benchmarks/results/torch-llama8b-h200.json

On a CPU the forward streams the weights through the caches the loop's Python then runs on; a GPU host's CPU waits
for the device instead. ``--warm_python`` skips each executor's compute after its call shape's first (the outputs of
that first call come back again; the caches' lengths advance as before), so the loop runs alone on warm caches, as
on a GPU host: the per-request figures that a GPU round pays.

``--before TREE`` runs every method on another specdec source tree too (a git worktree of an earlier commit, imported
under another name), interleaved with this one's in the same process: a change's effect on the loop, side by side.

    git worktree add /tmp/before HEAD~1
    python benchmarks/loop_host.py --work /tmp/loop-host --batch 64 --warm_python --repeats 7 --before /tmp/before
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo-pair"
TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"


def build(work: Path, batch: int) -> None:
    from specdec.builder.build import build_engine
    from specdec.formats.engine_format import BuildConfig

    def spec(k: int, **kw) -> BuildConfig:
        return BuildConfig(dtype="float32", backend="torch", max_batch_size=batch, max_input_len=128, max_seq_len=256, max_draft_len=k, **kw)

    quiet = dict(say=lambda _: None, force=True)
    if not (work / "eagle" / "config.json").is_file():
        build_engine(DEMO / "target", work / "eagle", spec(8, speculative_decoding_mode="eagle"), eagle_dir=DEMO / "heads" / "eagle", **quiet)
    if not (work / "peagle" / "config.json").is_file():
        build_engine(DEMO / "target", work / "peagle", spec(8, speculative_decoding_mode="peagle"), peagle_dir=DEMO / "heads" / "peagle", **quiet)
    if not (work / "draft" / "config.json").is_file():
        build_engine(DEMO / "draft", work / "draft", spec(0), **quiet)


def gpu_costs(path: Path, batch: int):
    """width -> seconds of a target call at ``batch`` rows, interpolated from a bench_torch.py run's steps."""
    steps = json.loads(path.read_text())["steps"]["target"]["step_ms"].get(str(batch))
    if not steps:
        raise SystemExit(f"error: {path} has no target steps at batch {batch}")
    widths = sorted(int(w) for w in steps)
    ms = [steps[str(w)]["median"] for w in widths]

    @functools.cache  # (asked every round: the benchmark's own arithmetic is not the loop's cost)
    def seconds(width: int) -> float:
        return float(np.interp(width, widths, ms)) / 1e3

    return seconds


def skip_compute(executor) -> None:
    """Make the executor's compute (TorchExecutor._run) return its first outputs for each call shape again (copies, as a
    call's outputs are new arrays): what it is fed, its caches' lengths and the loop around it stay as they were."""
    run, seen = executor._run, {}

    def cached(cache, first, ids, positions, start, index, tree, extra):
        key = (id(cache), ids.shape, index.shape, tree is not None)
        if key not in seen:
            seen[key] = run(cache, first, ids, positions, start, index, tree, extra)
        return {name: a.copy() for name, a in seen[key].items()}

    executor._run = cached


def runners(package: str, work: Path, warm_python: bool, inside: list[float]) -> dict:
    """method -> a function making its Orchestrator, from ``package`` (specdec, or another tree imported under another
    name) on executors of its own; each executor's forward adds its wall and CPU seconds to ``inside``."""
    from importlib import import_module

    fmt = import_module(f"{package}.formats.engine_format")
    TorchExecutor = import_module(f"{package}.runtime.backends.torch.executor").TorchExecutor
    Orchestrator = import_module(f"{package}.runtime.orchestrator").Orchestrator
    DraftModelProposer = import_module(f"{package}.runtime.proposers.draft_model").DraftModelProposer
    EagleProposer = import_module(f"{package}.runtime.proposers.eagle").EagleProposer
    PEagleProposer = import_module(f"{package}.runtime.proposers.peagle").PEagleProposer
    ex = {n: TorchExecutor(fmt.load_engine_dir(work / n), "cpu") for n in ("eagle", "peagle", "draft")}
    ex["module"] = TorchExecutor(fmt.load_engine_dir(fmt.eagle_module_dir(ex["eagle"].engine)), "cpu")
    ex["peagle_module"] = TorchExecutor(fmt.load_engine_dir(fmt.eagle_module_dir(ex["peagle"].engine)), "cpu")
    for e in ex.values():
        if warm_python:
            skip_compute(e)

        def timed(*a, _f=e.forward, **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return _f(*a, **k)
            finally:
                inside[0] += time.perf_counter() - t
                inside[1] += time.process_time() - c
        e.forward = timed
    return {
        "target-only": lambda: Orchestrator(ex["eagle"]),
        "eagle-auto": lambda: Orchestrator(ex["eagle"], EagleProposer(ex["eagle"], ex["module"], TREE), draft_len="auto"),
        "peagle-auto": lambda: Orchestrator(ex["peagle"], PEagleProposer(ex["peagle"], ex["peagle_module"], TREE), draft_len="auto"),
        "draft-auto": lambda: Orchestrator(ex["eagle"], DraftModelProposer(ex["draft"]), draft_len="auto"),
        "eagle-chain-auto": lambda: Orchestrator(ex["eagle"], EagleProposer(ex["eagle"], ex["module"]), draft_len="auto"),
        "peagle-chain-auto": lambda: Orchestrator(ex["peagle"], PEagleProposer(ex["peagle"], ex["peagle_module"]), draft_len="auto"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="where the engines are built (reused when there)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--methods", default="target-only,eagle-auto,peagle-auto,draft-auto",
                    help="comma-separated: target-only, eagle-auto / peagle-auto (trees), eagle-chain-auto, peagle-chain-auto, draft-auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    ap.add_argument("--gpu_costs", default=None, help="a bench_torch.py JSON: auto prices calls from its target steps at --batch, drafts free")
    ap.add_argument("--warm_python", action="store_true", help="skip the executors' compute after each call shape's first (outputs reused)")
    ap.add_argument("--before", default=None, metavar="TREE",
                    help="another specdec source tree (e.g. a git worktree of an earlier commit): every method runs on both, interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    pinned = gpu_costs(Path(args.gpu_costs), args.batch) if args.gpu_costs else None
    if args.before and not (Path(args.before) / "runtime" / "round.py").is_file():
        raise SystemExit(f"error: --before {args.before} is not a specdec source tree (no runtime/round.py)")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work)
    build(work, args.batch)
    inside = [0.0, 0.0]  # seconds inside the executors' forward: wall, CPU
    make = runners("specdec", work, args.warm_python, inside)
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in make]
    if unknown:
        raise SystemExit(f"error: unknown --methods {', '.join(unknown)}: choose from {', '.join(make)}")
    if args.before:  # the other tree, importable as specdec_before: each method runs on both, side by side
        link = Path(tempfile.mkdtemp(prefix="loop-host-before-")) / "specdec_before"
        link.symlink_to(Path(args.before).resolve())
        sys.path.insert(0, str(link.parent))
        earlier = runners("specdec_before", work, args.warm_python, inside)
        make.update({f"{m} (before)": earlier[m] for m in methods})
        methods = [name for m in methods for name in (m, f"{m} (before)")]
    from specdec.runtime.orchestrator import GenerationConfig

    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 4000, 59).tolist() for _ in range(args.batch)]
    cfg = GenerationConfig(max_output_len=64)
    orchs = {m: make[m]() for m in methods}
    if pinned is not None:
        for orch in orchs.values():
            if orch.engine.auto is not None:  # a formula on the instance replaces the measured lines (as the tests price calls)
                orch.engine.auto.verify_cost = lambda rows, width: pinned(width)
                orch.engine.auto.draft_cost = lambda method, rows, default: 0.0
    for orch in orchs.values():
        orch.generate(prompts, cfg)  # warm-up: shapes, auto's first costs
    got: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}  # the same in CPU time (the process's): time another process took is not in it
    drafted: dict[str, list[int]] = {m: [] for m in methods}
    decide: dict[str, list[float]] = {m: [] for m in methods}  # of the host time: draft_len=auto's choices (Metrics.decide_s)
    for r in range(args.repeats):
        for m in methods if r % 2 == 0 else methods[::-1]:
            inside[:] = 0.0, 0.0
            t, c = time.perf_counter(), time.process_time()
            outs, metrics = orchs[m].generate(prompts, cfg)
            wall, spent = time.perf_counter() - t, time.process_time() - c
            got[m].append((wall - inside[0]) / metrics.rounds * 1e6)  # metrics.rounds: row-rounds, one request verified once
            cpu[m].append((spent - inside[1]) / metrics.rounds * 1e6)
            drafted[m].append(metrics.drafted)
            decide[m].append(metrics.decide_s / metrics.rounds * 1e6)
    res = {"batch": args.batch, "threads": args.threads, "warm_python": args.warm_python, "before": args.before, "new_tokens": 64,
           "prompt_tokens": 59, "gpu_costs": args.gpu_costs,
           "host_us_per_request_round": {m: {"median": float(np.median(v)), "min": min(v), "max": max(v), "runs": v} for m, v in got.items()},
           "host_cpu_us_per_request_round": {m: {"median": float(np.median(v)), "min": min(v), "max": max(v), "runs": v} for m, v in cpu.items()},
           "decide_us_per_request_round": {m: {"median": float(np.median(v)), "min": min(v), "max": max(v), "runs": v} for m, v in decide.items()},
           "drafted": drafted}
    # each method's host time less its tree's target-only's in the same repeat (run next to it): what the method adds,
    # with the machine's drift between repeats left out
    over = {}
    for m in methods:
        ref = "target-only (before)" if m.endswith(" (before)") else "target-only"
        if m != ref and ref in got:
            d = [a - b for a, b in zip(got[m], got[ref], strict=True)]
            over[m] = {"median": float(np.median(d)), "min": min(d), "max": max(d), "runs": d}
    res["over_target_only_us_per_request_round"] = over
    width = max(map(len, methods))
    for m, v in res["host_us_per_request_round"].items():
        print(f"{m:<{width}} host {v['median']:6.1f} us per request and round [{v['min']:.1f}-{v['max']:.1f}], "
              f"(CPU time {np.median(cpu[m]):.1f}), of it deciding {np.median(decide[m]):.1f}, drafted {drafted[m]} in each run")
    for m, v in over.items():
        print(f"{m:<{width}} over target-only in the same repeat: {v['median']:+6.1f} us [{v['min']:+.1f} to {v['max']:+.1f}]")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
